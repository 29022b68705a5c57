//! SME f32 GEMM microkernel: outer products into the ZA array in streaming
//! mode (FEAT_SME; SME2 is not needed).
//!
//! The tile is 2L×2L, L = the streaming vector's f32 lanes capped at 16
//! (SVL 128 bits: 8×8, 256: 16×16, 512 and longer: 32×32), accumulated in the
//! four 32-bit ZA tiles as 2×2 blocks of L×L: for each k, two vectors of the
//! packed A column (rows 0..L, L..2L) and two of the packed B row (columns
//! 0..L, L..2L) and four `fmopa za<t>.s` outer products. The cap keeps the
//! scratch tile at 4 KiB and the packing buffers MC/NC-sized; longer vectors
//! run with the first 16 lanes active (`whilelo` predicates). The tile is
//! fixed when the table is built (`rdsvl`); the generic driver's blocking
//! does not change any element's sum with it (K is cut at `KC` whatever the
//! tile, each slice's sum starts at +0 and the store step combines it with
//! C, and threads split whole tiles), so every tile width gives the same bits.
//!
//! Why the bits are the NEON kernel's: the non-widening FMOPA adds each
//! product to its ZA element with one rounding (`FPMulAdd_ZA`), so each
//! element of a K slice is one fused multiply-add chain in k order from +0,
//! exactly what the NEON kernel's `fmla` lanes compute, and the store step
//! is `Tile::store` (or its overwrite / `C + acc` on a full tile, the same
//! IEEE operations). One difference: ZA-targeting instructions produce the
//! default NaN (FPCR.DN is treated as 1), so a NaN *input* gives a NaN of
//! another payload or sign than NEON's; every non-NaN result is identical.
//!
//! Streaming-mode discipline: everything from `smstart` to `smstop` is one
//! `asm!` block (no Rust code runs in streaming mode, where most Advanced
//! SIMD instructions trap), which clobbers every vector and predicate
//! register and leaves PSTATE.SM and PSTATE.ZA off. The block needs ZA off
//! on entry, which the procedure-call standard guarantees unless the caller
//! left ZA dormant with a lazy save pending (TPIDR2_EL0 set): then, and if
//! the streaming vector length was lowered below the tile's after the table
//! was built, the tile is computed by [`super::fma_tile`] (the same fused chains
//! in Rust) instead of saving the caller's ZA.
//!
//! Entry and exit (`smstart`/`smstop`) cost tens of cycles on real cores; a
//! call amortises them over the whole K slice (up to `KC` = 512 steps of four
//! outer products) and the whole tile. Several tiles per `smstart` would need
//! the driver to hand the kernel a row block × strip group at once (the
//! packed A block, the B panel) and the store step to run from a scratch
//! holding all of them after `smstop` (or in streaming mode, in assembly, for
//! every epilogue).

use crate::generic::gemm::{Combine, GemmUkr, MicroKernel, Packing, Tile};
use std::arch::asm;
use std::mem::MaybeUninit;

/// The most f32 lanes of a vector the tile uses (SVL 512 bits).
const MAX_LANES: usize = 16;
/// The largest tile's side.
const MAX_TILE: usize = 2 * MAX_LANES;

/// Whether this CPU has SME with the single-precision FMOPA: Linux's
/// HWCAP2_SME and HWCAP2_SME_F32F32 (`is_aarch64_feature_detected!("sme")`
/// is unstable). Other systems report no SME.
pub(crate) fn detected() -> bool {
    const HWCAP2_SME: u64 = 1 << 23;
    const HWCAP2_SME_F32F32: u64 = 1 << 29;
    let caps = super::hwcap2();
    caps & HWCAP2_SME != 0 && caps & HWCAP2_SME_F32F32 != 0
}

/// The streaming vector length in bytes and whether ZA is free to use (no
/// lazy save pending: TPIDR2_EL0 is null). Only called where SME was detected.
fn streaming_state() -> (usize, bool) {
    let (svl, tpidr2): (usize, usize);
    // SAFETY: RDSVL and reading TPIDR2_EL0 are defined outside streaming
    // mode on every SME CPU and change no state.
    unsafe {
        asm!(
            ".arch_extension sme",
            "rdsvl {svl}, #1",
            "mrs {tpidr2}, tpidr2_el0",
            svl = out(reg) svl,
            tpidr2 = out(reg) tpidr2,
            options(nomem, nostack, preserves_flags),
        );
    }
    (svl, tpidr2 == 0)
}

/// The table entry for this CPU's streaming vector length; only called
/// where SME was detected.
pub(crate) fn ukr() -> GemmUkr {
    let lanes = streaming_state().0 / 4;
    // SVL is a power of two of at least 128 bits: L is 4, 8 or 16.
    let (variant, side, run): (_, _, MicroKernel) = if lanes >= 16 {
        ("sme_fmopa_32x32", 32, microkernel::<16>)
    } else if lanes >= 8 {
        ("sme_fmopa_16x16", 16, microkernel::<8>)
    } else {
        ("sme_fmopa_8x8", 8, microkernel::<4>)
    };
    GemmUkr { variant, mr: side, nr: side, packing: Packing::KMajorPanels, run, direct: None, math: None }
}

/// One 2L×2L tile from packed strips of 2L rows / columns per k.
fn microkernel<const L: usize>(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    // The scratch tile below holds at most MAX_TILE² elements.
    const { assert!(L <= MAX_LANES) };
    let side = 2 * L;
    let kc = kc.min(astrip.len() / side).min(bstrip.len() / side);
    let (svl, za_free) = streaming_state();
    if !za_usable(svl, za_free, L) {
        return super::fma_tile(kc, side, side, astrip, bstrip, tile);
    }
    // A full tile with nothing fused goes from ZA straight to C (the
    // overwrite, or `C + acc`: the portable store step's operations).
    let full = tile.rows == side && tile.cols == side && tile.epilogue.is_empty();
    match tile.combine {
        Combine::Overwrite | Combine::Accumulate if full => {
            let accumulate = tile.combine == Combine::Accumulate;
            // SAFETY: the strips hold kc·2L values each (kc was bounded
            // above); the tile's 2L rows of 2L elements at stride ldc are
            // C's (`Tile::as_mut_ptr`); SME with SVL ≥ 32·L bits was checked.
            unsafe { fmopa_tile(kc, L, astrip.as_ptr(), bstrip.as_ptr(), tile.as_mut_ptr(), tile.ldc, accumulate) }
        }
        _ => {
            let mut acc = MaybeUninit::<[f32; MAX_TILE * MAX_TILE]>::uninit();
            let ptr = acc.as_mut_ptr().cast::<f32>();
            // SAFETY: as above, into the scratch: 2L rows of 2L at stride
            // 2L, 4L² ≤ MAX_TILE² elements, every one of them written.
            let acc = unsafe {
                fmopa_tile(kc, L, astrip.as_ptr(), bstrip.as_ptr(), ptr, side, false);
                std::slice::from_raw_parts(ptr, side * side)
            };
            tile.store(acc, side);
        }
    }
}

/// Whether a tile of `lanes`-wide ZA rows may run in ZA: nothing of the
/// caller's is pending there (a lazy save, TPIDR2_EL0 set) and the
/// streaming vector (`svl` bytes) still holds the lanes the table was built
/// for (a thread may lower it with `prctl`). Else the tile is computed in
/// Rust ([`super::fma_tile`]), with the same bits.
fn za_usable(svl: usize, za_free: bool, lanes: usize) -> bool {
    za_free && svl / 4 >= lanes
}

/// C (`dst`, 2L rows of 2L at a stride of `ld` elements) = or += the
/// 2L×2L product of `kc` steps of the packed strips `a` and `b` (2L values
/// per step each), through ZA tiles 0..3 (rows 0..L × columns 0..L, 0..L ×
/// L..2L, L..2L × 0..L, L..2L × L..2L).
///
/// # Safety
/// The CPU has SME with a streaming vector of at least `lanes` f32s, and ZA
/// is off (no lazy save pending); `a` and `b` are readable for `kc·2·lanes`
/// f32s; `dst + i·ld .. + 2·lanes` is writable (and readable when
/// accumulating) for every i < 2·lanes.
unsafe fn fmopa_tile(
    kc: usize,
    lanes: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    ld: usize,
    accumulate: bool,
) {
    // Registers: x0 a, x1 b, x2 kc, x3 L, x4 rows 0..L of dst, x5 ld,
    // x6 accumulate; scratch x7 (bytes per k step), x8 (row stride in
    // bytes), x9 (rows L..2L of dst), w12 (the ZA slice index).
    asm!(
        ".arch_extension sve",
        ".arch_extension sme",
        "smstart",
        "zero {{za}}",
        "whilelo p0.s, xzr, x3",
        "lsl x7, x3, #3",
        "cbz x2, 2f",
        // The K loop: A's column and B's row, four outer products.
        "1:",
        "ld1w {{z0.s}}, p0/z, [x0]",
        "ld1w {{z1.s}}, p0/z, [x0, x3, lsl #2]",
        "ld1w {{z2.s}}, p0/z, [x1]",
        "ld1w {{z3.s}}, p0/z, [x1, x3, lsl #2]",
        "fmopa za0.s, p0/m, p0/m, z0.s, z2.s",
        "fmopa za1.s, p0/m, p0/m, z0.s, z3.s",
        "fmopa za2.s, p0/m, p0/m, z1.s, z2.s",
        "fmopa za3.s, p0/m, p0/m, z1.s, z3.s",
        "add x0, x0, x7",
        "add x1, x1, x7",
        "subs x2, x2, #1",
        "b.ne 1b",
        "2:",
        "lsl x8, x5, #2",
        "madd x9, x8, x3, x4",
        "mov w12, #0",
        "cbnz x6, 4f",
        // Overwrite: ZA rows straight to memory.
        "3:",
        "st1w {{za0h.s[w12, 0]}}, p0, [x4]",
        "st1w {{za1h.s[w12, 0]}}, p0, [x4, x3, lsl #2]",
        "st1w {{za2h.s[w12, 0]}}, p0, [x9]",
        "st1w {{za3h.s[w12, 0]}}, p0, [x9, x3, lsl #2]",
        "add x4, x4, x8",
        "add x9, x9, x8",
        "add w12, w12, #1",
        "cmp x12, x3",
        "b.ne 3b",
        "b 5f",
        // Accumulate: C + acc, row by row.
        "4:",
        "mova z0.s, p0/m, za0h.s[w12, 0]",
        "ld1w {{z4.s}}, p0/z, [x4]",
        "fadd z4.s, p0/m, z4.s, z0.s",
        "st1w {{z4.s}}, p0, [x4]",
        "mova z1.s, p0/m, za1h.s[w12, 0]",
        "ld1w {{z5.s}}, p0/z, [x4, x3, lsl #2]",
        "fadd z5.s, p0/m, z5.s, z1.s",
        "st1w {{z5.s}}, p0, [x4, x3, lsl #2]",
        "mova z2.s, p0/m, za2h.s[w12, 0]",
        "ld1w {{z6.s}}, p0/z, [x9]",
        "fadd z6.s, p0/m, z6.s, z2.s",
        "st1w {{z6.s}}, p0, [x9]",
        "mova z3.s, p0/m, za3h.s[w12, 0]",
        "ld1w {{z7.s}}, p0/z, [x9, x3, lsl #2]",
        "fadd z7.s, p0/m, z7.s, z3.s",
        "st1w {{z7.s}}, p0, [x9, x3, lsl #2]",
        "add x4, x4, x8",
        "add x9, x9, x8",
        "add w12, w12, #1",
        "cmp x12, x3",
        "b.ne 4b",
        "5:",
        // Streaming mode and ZA off: the Z, P and V registers are zeroed.
        "smstop",
        inout("x0") a => _,
        inout("x1") b => _,
        inout("x2") kc => _,
        in("x3") lanes,
        inout("x4") dst => _,
        in("x5") ld,
        in("x6") accumulate as usize,
        out("x7") _,
        out("x8") _,
        out("x9") _,
        out("x12") _,
        // Every vector and predicate register (and the flags).
        clobber_abi("C"),
        options(nostack),
    );
}

#[cfg(test)]
mod tests {
    use super::za_usable;

    /// The calls that must not touch ZA take the Rust tile: a lazy save
    /// pending, or a streaming vector shorter than the table's tile.
    #[test]
    fn za_is_used_only_when_free_and_wide_enough() {
        assert!(za_usable(64, true, 16));
        assert!(za_usable(128, true, 16));
        assert!(!za_usable(64, false, 16));
        assert!(!za_usable(32, true, 16));
        assert!(za_usable(16, true, 4));
        assert!(!za_usable(16, false, 4));
    }
}
