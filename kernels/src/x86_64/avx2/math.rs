//! AVX2 + FMA f32 math over slices: exp and the activations built on it
//! (sigmoid, silu, tanh, erf, both GELUs), plus softmax's row maximum and exp-and-sum.
//!
//! Accuracy is the contract: each function stays within a few ulp of the
//! generic (libm-based) version on every input, including ±inf, NaN,
//! subnormal results and overflow (see `kernels/tests/variants.rs` for the
//! bounds each one is held to). Tails shorter than a vector go through a
//! padded stack buffer so every element sees the same vector code.
//!
//! Every `unsafe fn` here requires AVX2 and FMA; the safe wrappers are only
//! installed in a kernel table by [`crate::x86_64::plug`] after detecting both.

use crate::generic::gemm::VectorActivation;
use kiln_isa::math::{
    ERFC_EXPONENT_POLY, ERFC_TAIL_POLY, ERFC_ZERO, ERF_SMALL_POLY, ERF_SPLIT, EXP_HI, EXP_LN2_HI, EXP_LN2_LO, EXP_LO,
    EXP_POLY, GELU_TANH_CUBIC, SQRT_2_OVER_PI, TANH_POLY, TANH_SMALL,
};
use std::arch::x86_64::*;

/// The kernel table's variant name for these functions (`x86_64::plug`):
/// a GEMM microkernel applies `gelu_ps`, `silu_ps` and `sigmoid_ps` in its
/// store step only for a table whose entries carry this name.
pub(crate) const VARIANT: &str = "avx2_fma";

const LANES: usize = 8;

/// exp(x) for 8 lanes: Cody–Waite reduction x = n·ln2 + r (|r| ≤ ln2/2) with
/// ln2 split so n·C1 is exact, Cephes' degree-5 polynomial for
/// (e^r - 1 - r)/r², and 2^n applied as two halves so that results near
/// overflow and in the subnormal range are scaled without intermediate
/// overflow (the second product is the only rounding there).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_ps(x: __m256) -> __m256 {
    let (a, s2) = exp_parts(x);
    let e = _mm256_mul_ps(a, s2);
    _mm256_blendv_ps(e, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// exp(x) as two factors `(a, s)` with `exp(x) = a · s`, `a` never
/// subnormal: a caller that scales the result multiplies by `s` last, so
/// that a subnormal result is rounded only once. NaN lanes are not restored.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_parts(x: __m256) -> (__m256, __m256) {
    // Below -104 exp rounds to 0, above 88.8 it overflows, so clamping there
    // changes no result (-110 leaves room for callers that scale a subnormal
    // result up by up to e^6) and keeps n in [-159, 128], each half of 2^n
    // a normal number. max/min return the second operand for a NaN lane;
    // NaN is put back by the caller.
    let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    let p = horner(r, &EXP_POLY);
    // 1 + (r + r²·p): the small part first, then one rounding onto 1.
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    (_mm256_mul_ps(y, s1), s2)
}

/// Horner's rule from the highest coefficient, one FMA per step.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn horner(x: __m256, coeffs: &[f32]) -> __m256 {
    let mut p = _mm256_set1_ps(coeffs[0]);
    for &c in &coeffs[1..] {
        p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(c));
    }
    p
}

/// erf on |x| ≤ [`ERF_SPLIT`]: `x + x·P(x²)` (a minimax fit, ≤ 1 ulp).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn erf_small_ps(x: __m256) -> __m256 {
    let s = _mm256_mul_ps(x, x);
    _mm256_fmadd_ps(horner(s, &ERF_SMALL_POLY), x, x)
}

/// The exponent `q` with `erfc(t) = exp(q)` for t = |x| ≥ [`ERF_SPLIT`]
/// (a minimax fit of log erfc; N. Juffa's single-precision erf).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn erfc_exponent_ps(t: __m256) -> __m256 {
    let [c0, c1, c2, c3, rest @ ..] = ERFC_EXPONENT_POLY;
    let s = _mm256_mul_ps(t, t);
    let r = _mm256_fmadd_ps(_mm256_set1_ps(c0), t, _mm256_set1_ps(c1));
    let u = _mm256_fmadd_ps(_mm256_set1_ps(c2), t, _mm256_set1_ps(c3));
    let mut r = _mm256_fmadd_ps(r, s, u);
    for c in rest {
        r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(c));
    }
    _mm256_fmadd_ps(r, t, _mm256_xor_ps(t, _mm256_set1_ps(-0.0)))
}

/// erf(x): the odd polynomial near 0, `±(1 - erfc(|x|))` beyond; NaN stays NaN.
/// The exp branch is skipped when no lane takes it (activations near 0).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn erf_ps(x: __m256) -> __m256 {
    let sign_bit = _mm256_set1_ps(-0.0);
    let t = _mm256_andnot_ps(sign_bit, x);
    let small = erf_small_ps(x);
    // NaN compares false, so it takes the polynomial, which keeps it NaN.
    let beyond = _mm256_cmp_ps::<_CMP_GT_OQ>(t, _mm256_set1_ps(ERF_SPLIT));
    if _mm256_movemask_ps(beyond) == 0 {
        return small;
    }
    let large = _mm256_sub_ps(_mm256_set1_ps(1.0), exp_ps(erfc_exponent_ps(t)));
    let large = _mm256_or_ps(large, _mm256_and_ps(x, sign_bit));
    _mm256_blendv_ps(small, large, beyond)
}

/// erfc(t) for t in [0.9, 10.2] with full relative precision is
/// `r(t) · e^{-t²}`: this is `r(t)`. `(1 + 2t) e^{t²} erfc(t)` is smooth
/// there, fitted (weighted least squares, ≤ 0.2 ulp) by a degree-8
/// polynomial in `q = (t - 2) / (t + 2)`; [`gelu_ps`] supplies the steep
/// factor `e^{-t²}` (see there).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn erfc_tail_ratio(t: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    let two = _mm256_set1_ps(2.0);
    let q = _mm256_div_ps(_mm256_sub_ps(t, two), _mm256_add_ps(t, two));
    let p = horner(q, &ERFC_TAIL_POLY);
    _mm256_div_ps(p, _mm256_fmadd_ps(two, t, one))
}

/// Exact GELU, `x · Φ(x) = x/2 · erfc(-x/√2)`: through erf near 0 and on the
/// right (`x/2 · (1 + erf)`, no cancellation there), through an erfc of full
/// relative precision on the left tail, whose factors are multiplied so
/// that a subnormal result is rounded once.
///
/// Per lane this is [`erf_ps`] on the right and, on the left tail
/// (t = -x/√2 > [`ERF_SPLIT`]), `x/2 · r(t) · e^{-t²}` with `t² = sq + err`
/// an unevaluated sum (x·x and its rounding error, halved: exact) and
/// `e^{-sq-err} ≈ e^{-sq}(1 - err)`, so the steep factor carries no
/// rounding of its argument; `e^{-sq}` as [`exp_parts`]' two factors, the
/// power of two applied last. A vector with lanes on both sides needs two
/// exps (erf's `e^{q(t)}` on the right, `e^{-sq}` on the left): each lane
/// takes its own argument through one [`exp_parts`] (lane for lane the
/// operations of two separate calls, so the same bits; a quarter less work
/// for such vectors, most of a layer's).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gelu_ps(x: __m256) -> __m256 {
    let sign_bit = _mm256_set1_ps(-0.0);
    let u = _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
    let half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5));
    let t = _mm256_xor_ps(u, sign_bit);
    let in_tail = _mm256_cmp_ps::<_CMP_GT_OQ>(t, _mm256_set1_ps(ERF_SPLIT));
    if _mm256_movemask_ps(in_tail) == 0 {
        // No lane below -1.31 (most of a layer's activations): the left
        // tail's divisions and exp would all be blended away.
        let right = _mm256_mul_ps(half_x, _mm256_add_ps(_mm256_set1_ps(1.0), erf_ps(u)));
        return minus_inf_is_nan(x, right);
    }
    // erf_ps(u), its exp shared with the tail's.
    let abs_u = _mm256_andnot_ps(sign_bit, u);
    let small = erf_small_ps(u);
    let beyond = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_u, _mm256_set1_ps(ERF_SPLIT));
    // t² = x²/2 exactly, as x·x plus its rounding error, halved.
    let half = _mm256_set1_ps(0.5);
    let xx = _mm256_mul_ps(x, x);
    let (sq, err) = (_mm256_mul_ps(xx, half), _mm256_mul_ps(_mm256_fmsub_ps(x, x, xx), half));
    let q = erfc_exponent_ps(abs_u);
    let arg = _mm256_blendv_ps(q, _mm256_xor_ps(sq, sign_bit), in_tail);
    let (a, scale) = exp_parts(arg);
    // exp_ps(q) on the other lanes.
    let e = _mm256_blendv_ps(_mm256_mul_ps(a, scale), arg, _mm256_cmp_ps::<_CMP_UNORD_Q>(arg, arg));
    let large = _mm256_or_ps(_mm256_sub_ps(_mm256_set1_ps(1.0), e), _mm256_and_ps(u, sign_bit));
    let erf = _mm256_blendv_ps(small, large, beyond);
    let right = _mm256_mul_ps(half_x, _mm256_add_ps(_mm256_set1_ps(1.0), erf));
    let r = erfc_tail_ratio(_mm256_min_ps(t, _mm256_set1_ps(ERFC_ZERO)));
    let m = _mm256_mul_ps(r, _mm256_fnmadd_ps(a, err, a));
    let left = _mm256_mul_ps(_mm256_mul_ps(half_x, m), scale);
    let left = _mm256_blendv_ps(left, _mm256_set1_ps(-0.0), _mm256_cmp_ps::<_CMP_GE_OQ>(t, _mm256_set1_ps(ERFC_ZERO)));
    let g = _mm256_blendv_ps(right, left, in_tail);
    minus_inf_is_nan(x, g)
}

/// NaN lanes of `x` stay NaN, and GELU(-inf) is NaN as in torch and the
/// generic code (`-inf · 0`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn minus_inf_is_nan(x: __m256, g: __m256) -> __m256 {
    let g = _mm256_blendv_ps(g, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
    _mm256_blendv_ps(g, _mm256_set1_ps(f32::NAN), _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY)))
}

/// GELU's tanh form, `x/2 · (1 + tanh(z))` with `z = √(2/π)(x + 0.044715x³)`,
/// computed as the equal `x · σ(2z)` from `e = e^{-2|z|} ≤ 1`: `x / (1 + e)`
/// for x ≥ 0, `x·e / (1 + e)` for x < 0 (no cancellation in either tail),
/// with e's power-of-two factor applied last so a subnormal result is
/// rounded once.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tanh_ps(x: __m256) -> __m256 {
    let sign_bit = _mm256_set1_ps(-0.0);
    let x2 = _mm256_mul_ps(x, x);
    let inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_TANH_CUBIC), x2), x, x);
    let m2z = _mm256_mul_ps(_mm256_andnot_ps(sign_bit, inner), _mm256_set1_ps(-2.0 * SQRT_2_OVER_PI));
    let (a, s) = exp_parts(m2z);
    let one = _mm256_set1_ps(1.0);
    let denom = _mm256_fmadd_ps(a, s, one);
    let pos = _mm256_div_ps(x, denom);
    let neg = _mm256_mul_ps(_mm256_div_ps(_mm256_mul_ps(x, a), denom), s);
    // Below e^-110 (exp_parts' clamp) the left tail is 0 in f32 (|x| < 11 there).
    let neg = _mm256_blendv_ps(neg, sign_bit, _mm256_cmp_ps::<_CMP_LT_OQ>(m2z, _mm256_set1_ps(EXP_LO)));
    let g = _mm256_blendv_ps(pos, neg, _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps()));
    minus_inf_is_nan(x, g)
}

/// 1 / (1 + e^-x), the generic formula with [`exp_ps`] (division is exact).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sigmoid_ps(x: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    let e = exp_ps(_mm256_xor_ps(x, _mm256_set1_ps(-0.0)));
    _mm256_div_ps(one, _mm256_add_ps(one, e))
}

/// x · clamp(x + 3, 0, 6) / 6, each step one exact operation as the
/// unfused add, clamp (NaN passes, as in the GEMM store's clamp), mul and
/// div kernels compute it (a GEMM's `hardswish` epilogue).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hardswish_ps(x: __m256) -> __m256 {
    let c = _mm256_add_ps(x, _mm256_set1_ps(3.0));
    let c = _mm256_min_ps(_mm256_set1_ps(6.0), _mm256_max_ps(_mm256_setzero_ps(), c));
    _mm256_div_ps(_mm256_mul_ps(x, c), _mm256_set1_ps(6.0))
}

/// x · sigmoid(x): the unfused `sigmoid` then `mul`, bit for bit (SiLU as
/// Core ATen decomposes it; a GEMM's `mul_sigmoid` epilogue).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn mul_sigmoid_ps(x: __m256) -> __m256 {
    _mm256_mul_ps(x, sigmoid_ps(x))
}

/// `a`'s vector body: per lane what the table's slice function of this
/// math computes (for kernels that apply an activation in registers: the
/// GEMM microkernels' store step, the depthwise rows).
///
/// # Safety
/// The CPU has `avx2,fma`. Always inlined and without target features of
/// its own, so that it melts into the calling kernel (which has them) with
/// the bodies it calls: an out-of-line call per vector would pass the
/// vector through memory.
#[inline(always)]
pub(crate) unsafe fn activation_ps(a: VectorActivation, v: __m256) -> __m256 {
    match a {
        VectorActivation::Gelu => gelu_ps(v),
        VectorActivation::Silu => silu_ps(v),
        VectorActivation::Sigmoid => sigmoid_ps(v),
        VectorActivation::MulSigmoid => mul_sigmoid_ps(v),
        VectorActivation::Hardswish => hardswish_ps(v),
        VectorActivation::GeluTanhChain => gelu_tanh_chain_ps(v),
    }
}

/// GPT-2's `gelu_new`, `0.5·x · (1 + tanh(√(2/π)·(x + 0.044715·x·x·x)))`,
/// one f32 operation per step in the unfused graph's order around
/// [`tanh_ps`] (no fused multiply-adds: each unfused op rounds), so per
/// lane the bits of the unfused mul, add and tanh kernels (a GEMM's
/// `gelu_tanh_chain` epilogue). The last product keeps the graph's operand
/// order, the half first: with two NaN operands x86 returns the first.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gelu_tanh_chain_ps(x: __m256) -> __m256 {
    use kiln_isa::epilogue::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
    let cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    let inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(CUBIC), cube));
    let t = tanh_ps(_mm256_mul_ps(_mm256_set1_ps(SQRT_2_OVER_PI), inner));
    _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(HALF), x), _mm256_add_ps(_mm256_set1_ps(ONE), t))
}

/// x / (1 + e^-x), the generic formula with [`exp_ps`].
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_ps(x: __m256) -> __m256 {
    let e = exp_ps(_mm256_xor_ps(x, _mm256_set1_ps(-0.0)));
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// tanh as Cephes' tanhf, on |x| with x's sign put back at the end (so
/// tanh(-0) = -0): an odd polynomial for |x| < 0.625, 1 - 2/(e^{2|x|} + 1)
/// above (e^{2|x|} overflowing to inf gives exactly 1). NaN goes through the
/// exp branch and stays NaN.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tanh_ps(x: __m256) -> __m256 {
    let sign_bit = _mm256_set1_ps(-0.0);
    let ax = _mm256_andnot_ps(sign_bit, x);
    let z = _mm256_mul_ps(x, x);
    let p = horner(z, &TANH_POLY);
    let small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), ax, ax);
    let one = _mm256_set1_ps(1.0);
    let e = exp_ps(_mm256_add_ps(ax, ax));
    let large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)));
    let t = _mm256_blendv_ps(large, small, _mm256_cmp_ps::<_CMP_LT_OQ>(ax, _mm256_set1_ps(TANH_SMALL)));
    _mm256_or_ps(t, _mm256_and_ps(x, sign_bit))
}

/// Defines a safe slice function `out[i] = $vector(x[i])` over the shorter
/// length, 8 lanes at a time, the tail through a padded stack buffer (a macro
/// rather than a closure so the vector code is inlined under AVX2).
macro_rules! slice_fns {
    ($($(#[$doc:meta])* $name:ident => $vector:ident;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(x: &[f32], out: &mut [f32]) {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn run(x: &[f32], out: &mut [f32]) {
                let n = x.len().min(out.len());
                let (x, out) = (&x[..n], &mut out[..n]);
                let mut xs = x.chunks_exact(LANES);
                let mut os = out.chunks_exact_mut(LANES);
                for (xc, oc) in (&mut xs).zip(&mut os) {
                    // SAFETY: both chunks hold exactly LANES f32s.
                    _mm256_storeu_ps(oc.as_mut_ptr(), $vector(_mm256_loadu_ps(xc.as_ptr())));
                }
                let (xt, ot) = (xs.remainder(), os.into_remainder());
                if !xt.is_empty() {
                    let mut buf = [0f32; LANES];
                    buf[..xt.len()].copy_from_slice(xt);
                    // SAFETY: `buf` holds LANES f32s.
                    _mm256_storeu_ps(buf.as_mut_ptr(), $vector(_mm256_loadu_ps(buf.as_ptr())));
                    ot.copy_from_slice(&buf[..ot.len()]);
                }
            }
            // SAFETY: only installed by `plug` after AVX2 and FMA were detected.
            unsafe { run(x, out) }
        }
    )*};
}

slice_fns! {
    /// `out[i] = exp(x[i])`.
    exp => exp_ps;
    /// `out[i] = 1 / (1 + exp(-x[i]))`.
    sigmoid => sigmoid_ps;
    /// `out[i] = x[i] / (1 + exp(-x[i]))`.
    silu => silu_ps;
    /// `out[i] = tanh(x[i])`.
    tanh => tanh_ps;
    /// `out[i] = erf(x[i])`.
    erf => erf_ps;
    /// `out[i] = x[i] · Φ(x[i])`.
    gelu => gelu_ps;
    /// GELU with the tanh approximation.
    gelu_tanh => gelu_tanh_ps;
}

/// The NaN-propagating maximum of `x` (-inf when empty). Rows holding a NaN,
/// or whose maximum is a zero, are rescanned by the generic loop so that the
/// result is bit-identical to it (which NaN, which sign of zero).
pub(crate) fn max(x: &[f32]) -> f32 {
    // SAFETY: only installed by `plug` after AVX2 and FMA were detected.
    let (m, saw_nan) = unsafe { max_ps(x) };
    if saw_nan || m == 0.0 {
        return crate::generic::vector::max(x);
    }
    m
}

#[target_feature(enable = "avx2,fma")]
unsafe fn max_ps(x: &[f32]) -> (f32, bool) {
    let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 2];
    let mut nan = _mm256_setzero_ps();
    let mut blocks = x.chunks_exact(2 * LANES);
    for c in &mut blocks {
        // SAFETY: each block holds 2·LANES f32s.
        let (v0, v1) = (_mm256_loadu_ps(c.as_ptr()), _mm256_loadu_ps(c.as_ptr().add(LANES)));
        acc[0] = _mm256_max_ps(acc[0], v0);
        acc[1] = _mm256_max_ps(acc[1], v1);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v0, v1));
    }
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` holds LANES f32s.
    _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_max_ps(acc[0], acc[1]));
    let mut m = lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut saw_nan = _mm256_movemask_ps(nan) != 0;
    for &v in blocks.remainder() {
        saw_nan |= v.is_nan();
        m = m.max(v);
    }
    (m, saw_nan)
}

/// Softmax's middle step in place: `v[i] = exp(v[i] - shift)`, returning
/// the sum of the results accumulated in f64 (four f64 lanes per
/// accumulator, so the order differs from the generic left-to-right sum by
/// f64 rounding only).
pub(crate) fn exp_sum(v: &mut [f32], shift: f32) -> f64 {
    // SAFETY: only installed by `plug` after AVX2 and FMA were detected.
    unsafe { exp_sum_ps(v, shift) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_ps(v: &mut [f32], shift: f32) -> f64 {
    let s = _mm256_set1_ps(shift);
    let mut acc = [_mm256_setzero_pd(); 2];
    let mut chunks = v.chunks_exact_mut(LANES);
    for c in &mut chunks {
        // SAFETY: each chunk holds exactly LANES f32s.
        let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), s));
        _mm256_storeu_ps(c.as_mut_ptr(), e);
        acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
    }
    let mut lanes = [0f64; 4];
    // SAFETY: `lanes` holds four f64s.
    _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(acc[0], acc[1]));
    let mut sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [0f32; LANES];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds LANES f32s.
        _mm256_storeu_ps(buf.as_mut_ptr(), exp_ps(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), s)));
        for (o, &e) in tail.iter_mut().zip(&buf) {
            *o = e;
            sum += e as f64;
        }
    }
    sum
}
