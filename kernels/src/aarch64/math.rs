//! NEON f32 math over slices: exp and the activations built on it (sigmoid,
//! silu, tanh, erf, both GELUs), plus softmax's row maximum and exp-and-sum.
//!
//! The algorithms, constants and operation order are those of the AVX2
//! variants (`x86_64/avx2/math.rs`, where each step is explained), with
//! fused multiply-adds in the same places, so the two ISAs agree lane for
//! lane; the accuracy contract is the same: a few ulp from the generic
//! (libm-based) version on every input, including ±inf, NaN, subnormal
//! results and overflow (bounds in `kernels/tests/variants.rs`). Tails
//! shorter than a vector go through a padded stack buffer so every element
//! sees the same vector code.
//!
//! NEON is baseline on aarch64; the `unsafe fn`s here are unsafe only
//! because the intrinsics are declared so on older compilers.

use kiln_isa::math::{
    ERFC_EXPONENT_POLY, ERFC_TAIL_POLY, ERFC_ZERO, ERF_SMALL_POLY, ERF_SPLIT, EXP_HI, EXP_LN2_HI, EXP_LN2_LO, EXP_LO,
    EXP_POLY, GELU_TANH_CUBIC, SQRT_2_OVER_PI, TANH_POLY, TANH_SMALL,
};
use std::arch::aarch64::*;

const LANES: usize = 4;
const SIGN: u32 = 0x8000_0000;

/// `mask ? a : b` per lane.
#[inline(always)]
unsafe fn select(mask: uint32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
    vbslq_f32(mask, a, b)
}

/// All-ones in the lanes where `x` is NaN.
#[inline(always)]
unsafe fn is_nan(x: float32x4_t) -> uint32x4_t {
    vmvnq_u32(vceqq_f32(x, x))
}

/// `t` with the sign bit of `x` or-ed in (`t` non-negative: copysign).
#[inline(always)]
unsafe fn or_sign_of(t: float32x4_t, x: float32x4_t) -> float32x4_t {
    let sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(SIGN));
    vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t), sign))
}

/// `c + a·b`, one rounding (AVX2's `fmadd(a, b, c)`).
#[inline(always)]
unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
    vfmaq_f32(c, a, b)
}

/// `c - a·b`, one rounding (AVX2's `fnmadd(a, b, c)`).
#[inline(always)]
unsafe fn fnma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
    vfmsq_f32(c, a, b)
}

#[inline(always)]
unsafe fn splat(v: f32) -> float32x4_t {
    vdupq_n_f32(v)
}

/// Horner's rule from the highest coefficient, one FMA per step.
#[inline(always)]
unsafe fn horner(x: float32x4_t, coeffs: &[f32]) -> float32x4_t {
    let mut p = splat(coeffs[0]);
    for &c in &coeffs[1..] {
        p = fma(p, x, splat(c));
    }
    p
}

/// exp(x): Cody–Waite reduction, Cephes' degree-5 polynomial, 2^n applied
/// as two halves (see the AVX2 `exp_ps`).
#[inline(always)]
pub(super) unsafe fn exp_v(x: float32x4_t) -> float32x4_t {
    let (a, s2) = exp_parts(x);
    select(is_nan(x), x, vmulq_f32(a, s2))
}

/// exp(x) as two factors `(a, s)` with `exp(x) = a · s`, `a` never
/// subnormal; NaN lanes are not restored.
#[inline(always)]
unsafe fn exp_parts(x: float32x4_t) -> (float32x4_t, float32x4_t) {
    // The clamp changes no result and keeps both halves of 2^n normal.
    // FMAXNM/FMINNM return the number for a NaN lane (as x86's max/min
    // return their second operand); NaN is put back by the caller.
    let xc = vminnmq_f32(vmaxnmq_f32(x, splat(EXP_LO)), splat(EXP_HI));
    let n = vrndnq_f32(vmulq_f32(xc, splat(std::f32::consts::LOG2_E)));
    let r = fnma(n, splat(EXP_LN2_HI), xc);
    let r = fnma(n, splat(EXP_LN2_LO), r);
    let p = horner(r, &EXP_POLY);
    let y = vaddq_f32(fma(p, vmulq_f32(r, r), r), splat(1.0));
    let ni = vcvtnq_s32_f32(n);
    let n1 = vshrq_n_s32::<1>(ni);
    let n2 = vsubq_s32(ni, n1);
    let bias = vdupq_n_s32(127);
    let s1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n1, bias)));
    let s2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n2, bias)));
    (vmulq_f32(y, s1), s2)
}

/// erf on |x| ≤ [`ERF_SPLIT`]: `x + x·P(x²)`.
#[inline(always)]
unsafe fn erf_small_v(x: float32x4_t) -> float32x4_t {
    let s = vmulq_f32(x, x);
    fma(horner(s, &ERF_SMALL_POLY), x, x)
}

/// The exponent `q` with `erfc(t) = exp(q)` for t = |x| ≥ [`ERF_SPLIT`].
#[inline(always)]
unsafe fn erfc_exponent_v(t: float32x4_t) -> float32x4_t {
    let [c0, c1, c2, c3, rest @ ..] = ERFC_EXPONENT_POLY;
    let s = vmulq_f32(t, t);
    let r = fma(splat(c0), t, splat(c1));
    let u = fma(splat(c2), t, splat(c3));
    let mut r = fma(r, s, u);
    for c in rest {
        r = fma(r, t, splat(c));
    }
    fma(r, t, vnegq_f32(t))
}

/// erf(x): the odd polynomial near 0, `±(1 - erfc(|x|))` beyond; NaN stays NaN.
#[inline(always)]
unsafe fn erf_v(x: float32x4_t) -> float32x4_t {
    let t = vabsq_f32(x);
    let small = erf_small_v(x);
    let large = or_sign_of(vsubq_f32(splat(1.0), exp_v(erfc_exponent_v(t))), x);
    // NaN compares false, so it takes the polynomial, which keeps it NaN.
    select(vcgtq_f32(t, splat(ERF_SPLIT)), large, small)
}

/// erfc(t) for t in [0.9, 10.2] as two factors `(m, s)`, `erfc(t) = m · s`
/// (see the AVX2 `erfc_tail_parts`).
#[inline(always)]
unsafe fn erfc_tail_parts(t: float32x4_t, sq: float32x4_t, err: float32x4_t) -> (float32x4_t, float32x4_t) {
    let one = splat(1.0);
    let two = splat(2.0);
    let q = vdivq_f32(vsubq_f32(t, two), vaddq_f32(t, two));
    let p = horner(q, &ERFC_TAIL_POLY);
    let r = vdivq_f32(p, fma(two, t, one));
    let (a, scale) = exp_parts(vnegq_f32(sq));
    let a = fnma(a, err, a);
    (vmulq_f32(r, a), scale)
}

/// Exact GELU, `x · Φ(x)`: through erf near 0 and on the right, through a
/// full-precision erfc on the left tail (see the AVX2 `gelu_ps`).
#[inline(always)]
unsafe fn gelu_v(x: float32x4_t) -> float32x4_t {
    let u = vmulq_f32(x, splat(std::f32::consts::FRAC_1_SQRT_2));
    let half_x = vmulq_f32(x, splat(0.5));
    let right = vmulq_f32(half_x, vaddq_f32(splat(1.0), erf_v(u)));
    let t = vnegq_f32(u);
    // t² = x²/2 exactly, as x·x plus its rounding error (x·x - xx, fused), halved.
    let half = splat(0.5);
    let xx = vmulq_f32(x, x);
    let (sq, err) = (vmulq_f32(xx, half), vmulq_f32(fma(x, x, vnegq_f32(xx)), half));
    let (m, scale) = erfc_tail_parts(vminnmq_f32(t, splat(ERFC_ZERO)), sq, err);
    let left = vmulq_f32(vmulq_f32(half_x, m), scale);
    let left = select(vcgeq_f32(t, splat(ERFC_ZERO)), splat(-0.0), left);
    let g = select(vcgtq_f32(t, splat(ERF_SPLIT)), left, right);
    minus_inf_is_nan(x, g)
}

/// NaN lanes of `x` stay NaN, and GELU(-inf) is NaN as in torch.
#[inline(always)]
unsafe fn minus_inf_is_nan(x: float32x4_t, g: float32x4_t) -> float32x4_t {
    let g = select(is_nan(x), x, g);
    select(vceqq_f32(x, splat(f32::NEG_INFINITY)), splat(f32::NAN), g)
}

/// GELU's tanh form as `x · σ(2z)` (see the AVX2 `gelu_tanh_ps`).
#[inline(always)]
unsafe fn gelu_tanh_v(x: float32x4_t) -> float32x4_t {
    let x2 = vmulq_f32(x, x);
    let inner = fma(vmulq_f32(splat(GELU_TANH_CUBIC), x2), x, x);
    let m2z = vmulq_f32(vabsq_f32(inner), splat(-2.0 * SQRT_2_OVER_PI));
    let (a, s) = exp_parts(m2z);
    let denom = fma(a, s, splat(1.0));
    let pos = vdivq_f32(x, denom);
    let neg = vmulq_f32(vdivq_f32(vmulq_f32(x, a), denom), s);
    let neg = select(vcltq_f32(m2z, splat(EXP_LO)), splat(-0.0), neg);
    let g = select(vcltq_f32(x, splat(0.0)), neg, pos);
    minus_inf_is_nan(x, g)
}

/// 1 / (1 + e^-x).
#[inline(always)]
unsafe fn sigmoid_v(x: float32x4_t) -> float32x4_t {
    let one = splat(1.0);
    vdivq_f32(one, vaddq_f32(one, exp_v(vnegq_f32(x))))
}

/// x / (1 + e^-x).
#[inline(always)]
unsafe fn silu_v(x: float32x4_t) -> float32x4_t {
    vdivq_f32(x, vaddq_f32(splat(1.0), exp_v(vnegq_f32(x))))
}

/// tanh as Cephes' tanhf on |x|, x's sign put back at the end (see the AVX2
/// `tanh_ps`).
#[inline(always)]
unsafe fn tanh_v(x: float32x4_t) -> float32x4_t {
    let ax = vabsq_f32(x);
    let z = vmulq_f32(x, x);
    let p = horner(z, &TANH_POLY);
    let small = fma(vmulq_f32(p, z), ax, ax);
    let one = splat(1.0);
    let e = exp_v(vaddq_f32(ax, ax));
    let large = vsubq_f32(one, vdivq_f32(splat(2.0), vaddq_f32(e, one)));
    or_sign_of(select(vcltq_f32(ax, splat(TANH_SMALL)), small, large), x)
}

/// Defines a safe slice function `out[i] = $vector(x[i])` over the shorter
/// length, 4 lanes at a time, the tail through a padded stack buffer.
macro_rules! slice_fns {
    ($($(#[$doc:meta])* $name:ident => $vector:ident;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(x: &[f32], out: &mut [f32]) {
            let n = x.len().min(out.len());
            let (x, out) = (&x[..n], &mut out[..n]);
            let mut xs = x.chunks_exact(LANES);
            let mut os = out.chunks_exact_mut(LANES);
            for (xc, oc) in (&mut xs).zip(&mut os) {
                // SAFETY: both chunks hold exactly LANES f32s.
                unsafe { vst1q_f32(oc.as_mut_ptr(), $vector(vld1q_f32(xc.as_ptr()))) };
            }
            let (xt, ot) = (xs.remainder(), os.into_remainder());
            if !xt.is_empty() {
                let mut buf = [0f32; LANES];
                buf[..xt.len()].copy_from_slice(xt);
                // SAFETY: `buf` holds LANES f32s.
                unsafe { vst1q_f32(buf.as_mut_ptr(), $vector(vld1q_f32(buf.as_ptr()))) };
                ot.copy_from_slice(&buf[..ot.len()]);
            }
        }
    )*};
}

slice_fns! {
    /// `out[i] = exp(x[i])`.
    exp => exp_v;
    /// `out[i] = 1 / (1 + exp(-x[i]))`.
    sigmoid => sigmoid_v;
    /// `out[i] = x[i] / (1 + exp(-x[i]))`.
    silu => silu_v;
    /// `out[i] = tanh(x[i])`.
    tanh => tanh_v;
    /// `out[i] = erf(x[i])`.
    erf => erf_v;
    /// `out[i] = x[i] · Φ(x[i])`.
    gelu => gelu_v;
    /// GELU with the tanh approximation.
    gelu_tanh => gelu_tanh_v;
}

/// The NaN-propagating maximum of `x` (-inf when empty). FMAX propagates
/// NaN, so a NaN anywhere makes the vector result NaN; such rows, and rows
/// whose maximum is a zero, are rescanned by the generic loop so that the
/// result is bit-identical to it (which NaN, which sign of zero).
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut blocks = x.chunks_exact(2 * LANES);
    // SAFETY: NEON is baseline; each block holds 2·LANES f32s.
    let mut m = unsafe {
        let mut acc = [vdupq_n_f32(f32::NEG_INFINITY); 2];
        for c in &mut blocks {
            acc[0] = vmaxq_f32(acc[0], vld1q_f32(c.as_ptr()));
            acc[1] = vmaxq_f32(acc[1], vld1q_f32(c.as_ptr().add(LANES)));
        }
        vmaxvq_f32(vmaxq_f32(acc[0], acc[1]))
    };
    let mut saw_nan = m.is_nan();
    for &v in blocks.remainder() {
        saw_nan |= v.is_nan();
        m = m.max(v);
    }
    if saw_nan || m == 0.0 {
        return crate::generic::vector::max(x);
    }
    m
}

/// Softmax's middle step in place: `v[i] = exp(v[i] - shift)`, returning
/// the sum of the results accumulated in f64 (two f64 lanes per
/// accumulator, so the order differs from the generic left-to-right sum by
/// f64 rounding only).
pub(crate) fn exp_sum(v: &mut [f32], shift: f32) -> f64 {
    // SAFETY: NEON is baseline.
    unsafe { exp_sum_v(v, shift) }
}

unsafe fn exp_sum_v(v: &mut [f32], shift: f32) -> f64 {
    let s = splat(shift);
    let mut acc = [vdupq_n_f64(0.0); 2];
    let mut chunks = v.chunks_exact_mut(LANES);
    for c in &mut chunks {
        // SAFETY: each chunk holds exactly LANES f32s.
        let e = exp_v(vsubq_f32(vld1q_f32(c.as_ptr()), s));
        vst1q_f32(c.as_mut_ptr(), e);
        acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(e)));
        acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(e));
    }
    let both = vaddq_f64(acc[0], acc[1]);
    let mut sum = vgetq_lane_f64::<0>(both) + vgetq_lane_f64::<1>(both);
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; LANES];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds LANES f32s.
        vst1q_f32(buf.as_mut_ptr(), exp_v(vsubq_f32(vld1q_f32(buf.as_ptr()), s)));
        for (o, &e) in tail.iter_mut().zip(&buf) {
            *o = e;
            sum += e as f64;
        }
    }
    sum
}
