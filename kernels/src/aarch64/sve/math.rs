//! SVE exp, sigmoid and SiLU over slices: the NEON code (`aarch64/math.rs`)
//! instruction for instruction — the same clamp, Cody–Waite reduction,
//! Horner steps and fused multiply-adds in the same places, the same NaN
//! select — on vectors of the hardware's width, the tail a `whilelo`
//! predicate instead of NEON's padded buffer. Every lane computes what a
//! NEON lane computes for the same input, so the results are the NEON
//! table's bit for bit at every vector length (`tests/variants.rs`).
//!
//! Registers: the constants live in z16–z28 for the whole loop, x in z0,
//! the temporaries in z1–z5; p0 is the loop predicate, p1 all-true (lanes
//! past the slice compute on zeros and are never stored), p2 the NaN lanes.

use kiln_isa::math::{EXP_HI, EXP_LN2_HI, EXP_LN2_LO, EXP_LO, EXP_POLY};
use std::arch::asm;

/// Broadcast by `ld1rw` at byte offset 4·i (the order `load_constants!` reads).
static CONSTANTS: [u32; 13] = [
    EXP_LO.to_bits(),
    EXP_HI.to_bits(),
    std::f32::consts::LOG2_E.to_bits(),
    EXP_LN2_HI.to_bits(),
    EXP_LN2_LO.to_bits(),
    1f32.to_bits(),
    127, // the exponent bias, an integer
    EXP_POLY[0].to_bits(),
    EXP_POLY[1].to_bits(),
    EXP_POLY[2].to_bits(),
    EXP_POLY[3].to_bits(),
    EXP_POLY[4].to_bits(),
    EXP_POLY[5].to_bits(),
];

/// z16 EXP_LO, z17 EXP_HI, z18 log2 e, z19/z20 ln 2 high and low, z21 1.0,
/// z22 127 (i32), z23–z28 EXP_POLY.
#[rustfmt::skip]
macro_rules! load_constants {
    () => {
        concat!(
            "ptrue p1.s\n",
            "ld1rw {{z16.s}}, p1/z, [{c}, #0]\n",
            "ld1rw {{z17.s}}, p1/z, [{c}, #4]\n",
            "ld1rw {{z18.s}}, p1/z, [{c}, #8]\n",
            "ld1rw {{z19.s}}, p1/z, [{c}, #12]\n",
            "ld1rw {{z20.s}}, p1/z, [{c}, #16]\n",
            "ld1rw {{z21.s}}, p1/z, [{c}, #20]\n",
            "ld1rw {{z22.s}}, p1/z, [{c}, #24]\n",
            "ld1rw {{z23.s}}, p1/z, [{c}, #28]\n",
            "ld1rw {{z24.s}}, p1/z, [{c}, #32]\n",
            "ld1rw {{z25.s}}, p1/z, [{c}, #36]\n",
            "ld1rw {{z26.s}}, p1/z, [{c}, #40]\n",
            "ld1rw {{z27.s}}, p1/z, [{c}, #44]\n",
            "ld1rw {{z28.s}}, p1/z, [{c}, #48]\n",
        )
    };
}

/// z1 = exp(z0): NEON's `exp_v` step by step (its comments say why), with
/// `fmls` for `vfmsq_f32`, `fmad`/`fmla` for `vfmaq_f32`, and `fcvtzs` for
/// `vcvtnq_s32_f32` (n is already an integer, so both give it exactly).
#[rustfmt::skip]
macro_rules! exp_z0_to_z1 {
    () => {
        concat!(
            // xc = minnm(maxnm(x, LO), HI)
            "mov z1.d, z0.d\n",
            "fmaxnm z1.s, p1/m, z1.s, z16.s\n",
            "fminnm z1.s, p1/m, z1.s, z17.s\n",
            // n = round_even(xc · log2 e)
            "fmul z2.s, z1.s, z18.s\n",
            "frintn z2.s, p1/m, z2.s\n",
            // r = (xc - n·LN2_HI) - n·LN2_LO
            "fmls z1.s, p1/m, z2.s, z19.s\n",
            "fmls z1.s, p1/m, z2.s, z20.s\n",
            // p = Horner over EXP_POLY (p = c + p·r)
            "mov z3.d, z23.d\n",
            "fmad z3.s, p1/m, z1.s, z24.s\n",
            "fmad z3.s, p1/m, z1.s, z25.s\n",
            "fmad z3.s, p1/m, z1.s, z26.s\n",
            "fmad z3.s, p1/m, z1.s, z27.s\n",
            "fmad z3.s, p1/m, z1.s, z28.s\n",
            // y = (r + p·r²) + 1
            "fmul z4.s, z1.s, z1.s\n",
            "fmla z1.s, p1/m, z3.s, z4.s\n",
            "fadd z1.s, z1.s, z21.s\n",
            // 2^n as 2^n1 · 2^n2, n1 = n >> 1, n2 = n - n1
            "fcvtzs z2.s, p1/m, z2.s\n",
            "asr z3.s, z2.s, #1\n",
            "sub z2.s, z2.s, z3.s\n",
            "add z3.s, z3.s, z22.s\n",
            "lsl z3.s, z3.s, #23\n",
            "add z2.s, z2.s, z22.s\n",
            "lsl z2.s, z2.s, #23\n",
            "fmul z1.s, z1.s, z3.s\n",
            "fmul z1.s, z1.s, z2.s\n",
            // NaN lanes of x are the result.
            "fcmuo p2.s, p1/z, z0.s, z0.s\n",
            "sel z1.s, p2, z0.s, z1.s\n",
        )
    };
}

/// Defines a safe slice function `out[i] = f(x[i])` over the shorter length:
/// one predicated loop of `$body` (x in z0, the result in `$result`).
macro_rules! slice_fns {
    ($($(#[$doc:meta])* $name:ident => $result:literal, $body:expr;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(x: &[f32], out: &mut [f32]) {
            /// # Safety
            /// The CPU has SVE; `x` and `out` hold `n` f32s each.
            #[target_feature(enable = "sve")]
            unsafe fn run(x: *const f32, out: *mut f32, n: usize) {
                // SAFETY: the caller's contract; loads and stores are
                // predicated on the elements below n (p0).
                unsafe {
                    asm!(
                        load_constants!(),
                        "mov {i}, #0",
                        "whilelo p0.s, {i}, {n}",
                        "b.eq 3f", // no element (b.none)
                        "2:",
                        "ld1w {{z0.s}}, p0/z, [{x}, {i}, lsl #2]",
                        $body,
                        concat!("st1w {{", $result, ".s}}, p0, [{out}, {i}, lsl #2]"),
                        "incw {i}",
                        "whilelo p0.s, {i}, {n}",
                        "b.mi 2b", // the first lane is active (b.first)
                        "3:",
                        x = in(reg) x,
                        out = in(reg) out,
                        n = in(reg) n,
                        c = in(reg) CONSTANTS.as_ptr(),
                        i = out(reg) _,
                        out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _,
                        out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _,
                        out("v21") _, out("v22") _, out("v23") _, out("v24") _, out("v25") _,
                        out("v26") _, out("v27") _, out("v28") _,
                        out("p0") _, out("p1") _, out("p2") _,
                        options(nostack),
                    );
                }
            }
            let n = x.len().min(out.len());
            // SAFETY: only installed by `sve::plug` once SVE was detected;
            // both slices hold at least n elements.
            unsafe { run(x.as_ptr(), out.as_mut_ptr(), n) }
        }
    )*};
}

slice_fns! {
    /// `out[i] = exp(x[i])`.
    exp => "z1", exp_z0_to_z1!();
    /// `out[i] = 1 / (1 + exp(-x[i]))`, NEON's `sigmoid_v`.
    sigmoid => "z2", concat!(
        "fneg z0.s, p1/m, z0.s\n",
        exp_z0_to_z1!(),
        "fadd z1.s, z21.s, z1.s\n",
        "mov z2.d, z21.d\n",
        "fdiv z2.s, p1/m, z2.s, z1.s\n",
    );
    /// `out[i] = x[i] / (1 + exp(-x[i]))`, NEON's `silu_v`.
    silu => "z5", concat!(
        "mov z5.d, z0.d\n",
        "fneg z0.s, p1/m, z0.s\n",
        exp_z0_to_z1!(),
        "fadd z1.s, z21.s, z1.s\n",
        "fdiv z5.s, p1/m, z5.s, z1.s\n",
    );
}
