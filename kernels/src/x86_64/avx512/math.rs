//! AVX-512F f32 math over slices: exp, sigmoid, SiLU, erf and exact GELU,
//! 16 lanes at a time. Each is the AVX2 version (`avx2/math.rs`, which
//! documents the methods) operation for operation, so the results are the
//! AVX2 ones: blends become mask blends, sign tricks integer bit operations
//! (AVX-512F alone has no float `and`/`xor`). GELU's tanh form stays on
//! the AVX2 code.
//!
//! Every `unsafe fn` here requires AVX-512F; the safe wrappers are only
//! installed in a v4 kernel table, built after AVX-512 was detected.

use crate::generic::gemm::VectorActivation;
use kiln_isa::math::{
    ERFC_EXPONENT_POLY, ERFC_TAIL_POLY, ERFC_ZERO, ERF_SMALL_POLY, ERF_SPLIT, EXP_HI, EXP_LN2_HI, EXP_LN2_LO, EXP_LO,
    EXP_POLY, TANH_POLY, TANH_SMALL,
};
use std::arch::x86_64::*;

/// The kernel table's variant name for these functions (`x86_64::plug`):
/// a GEMM microkernel applies `gelu_ps`, `silu_ps` and `sigmoid_ps` in its
/// store step only for a table whose entries carry this name.
pub(crate) const VARIANT: &str = "avx512f";

const LANES: usize = 16;

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn set(v: f32) -> __m512 {
    _mm512_set1_ps(v)
}

/// `a ^ b` on the bits.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn xor(a: __m512, b: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)))
}

/// `a & b` on the bits.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn and(a: __m512, b: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)))
}

/// `a | b` on the bits.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn or(a: __m512, b: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)))
}

/// `|a|`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn abs(a: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(set(-0.0)), _mm512_castps_si512(a)))
}

/// exp(x) (AVX2 `exp_ps`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp_ps(x: __m512) -> __m512 {
    let (a, s2) = exp_parts(x);
    let e = _mm512_mul_ps(a, s2);
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), e, x)
}

/// exp(x) as two factors (AVX2 `exp_parts`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp_parts(x: __m512) -> (__m512, __m512) {
    let xc = _mm512_min_ps(_mm512_max_ps(x, set(EXP_LO)), set(EXP_HI));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        xc,
        set(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, set(EXP_LN2_HI), xc);
    let r = _mm512_fnmadd_ps(n, set(EXP_LN2_LO), r);
    let p = horner(r, &EXP_POLY);
    let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), set(1.0));
    let ni = _mm512_cvtps_epi32(n);
    let n1 = _mm512_srai_epi32::<1>(ni);
    let n2 = _mm512_sub_epi32(ni, n1);
    let bias = _mm512_set1_epi32(127);
    let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n1, bias)));
    let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n2, bias)));
    (_mm512_mul_ps(y, s1), s2)
}

/// Horner's rule from the highest coefficient, one FMA per step.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn horner(x: __m512, coeffs: &[f32]) -> __m512 {
    let mut p = set(coeffs[0]);
    for &c in &coeffs[1..] {
        p = _mm512_fmadd_ps(p, x, set(c));
    }
    p
}

/// erf on |x| ≤ [`ERF_SPLIT`] (AVX2 `erf_small_ps`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn erf_small_ps(x: __m512) -> __m512 {
    let s = _mm512_mul_ps(x, x);
    _mm512_fmadd_ps(horner(s, &ERF_SMALL_POLY), x, x)
}

/// The exponent of erfc beyond the split (AVX2 `erfc_exponent_ps`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn erfc_exponent_ps(t: __m512) -> __m512 {
    let [c0, c1, c2, c3, rest @ ..] = ERFC_EXPONENT_POLY;
    let s = _mm512_mul_ps(t, t);
    let r = _mm512_fmadd_ps(set(c0), t, set(c1));
    let u = _mm512_fmadd_ps(set(c2), t, set(c3));
    let mut r = _mm512_fmadd_ps(r, s, u);
    for c in rest {
        r = _mm512_fmadd_ps(r, t, set(c));
    }
    _mm512_fmadd_ps(r, t, xor(t, set(-0.0)))
}

/// erf(x) (AVX2 `erf_ps`), the exp branch skipped when no lane takes it.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn erf_ps(x: __m512) -> __m512 {
    let t = abs(x);
    let small = erf_small_ps(x);
    let beyond = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(t, set(ERF_SPLIT));
    if beyond == 0 {
        return small;
    }
    let large = _mm512_sub_ps(set(1.0), exp_ps(erfc_exponent_ps(t)));
    let large = or(large, and(x, set(-0.0)));
    _mm512_mask_blend_ps(beyond, small, large)
}

/// The smooth factor `r(t)` of erfc on GELU's left tail (AVX2 `erfc_tail_ratio`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn erfc_tail_ratio(t: __m512) -> __m512 {
    let one = set(1.0);
    let two = set(2.0);
    let q = _mm512_div_ps(_mm512_sub_ps(t, two), _mm512_add_ps(t, two));
    let p = horner(q, &ERFC_TAIL_POLY);
    _mm512_div_ps(p, _mm512_fmadd_ps(two, t, one))
}

/// Exact GELU (AVX2 `gelu_ps`: one exp for both sides' lanes).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gelu_ps(x: __m512) -> __m512 {
    let u = _mm512_mul_ps(x, set(std::f32::consts::FRAC_1_SQRT_2));
    let half_x = _mm512_mul_ps(x, set(0.5));
    let t = xor(u, set(-0.0));
    let in_tail = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(t, set(ERF_SPLIT));
    if in_tail == 0 {
        let right = _mm512_mul_ps(half_x, _mm512_add_ps(set(1.0), erf_ps(u)));
        return minus_inf_is_nan(x, right);
    }
    let abs_u = abs(u);
    let small = erf_small_ps(u);
    let beyond = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs_u, set(ERF_SPLIT));
    let half = set(0.5);
    let xx = _mm512_mul_ps(x, x);
    let (sq, err) = (_mm512_mul_ps(xx, half), _mm512_mul_ps(_mm512_fmsub_ps(x, x, xx), half));
    let q = erfc_exponent_ps(abs_u);
    let arg = _mm512_mask_blend_ps(in_tail, q, xor(sq, set(-0.0)));
    let (a, scale) = exp_parts(arg);
    let e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(arg, arg), _mm512_mul_ps(a, scale), arg);
    let large = or(_mm512_sub_ps(set(1.0), e), and(u, set(-0.0)));
    let erf = _mm512_mask_blend_ps(beyond, small, large);
    let right = _mm512_mul_ps(half_x, _mm512_add_ps(set(1.0), erf));
    let r = erfc_tail_ratio(_mm512_min_ps(t, set(ERFC_ZERO)));
    let m = _mm512_mul_ps(r, _mm512_fnmadd_ps(a, err, a));
    let left = _mm512_mul_ps(_mm512_mul_ps(half_x, m), scale);
    let left = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(t, set(ERFC_ZERO)), left, set(-0.0));
    let g = _mm512_mask_blend_ps(in_tail, right, left);
    minus_inf_is_nan(x, g)
}

/// NaN lanes of `x` stay NaN, and GELU(-inf) is NaN (AVX2 `minus_inf_is_nan`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn minus_inf_is_nan(x: __m512, g: __m512) -> __m512 {
    let g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), g, x);
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, set(f32::NEG_INFINITY)), g, set(f32::NAN))
}

/// 1 / (1 + e^-x) (AVX2 `sigmoid_ps`).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn sigmoid_ps(x: __m512) -> __m512 {
    let one = set(1.0);
    let e = exp_ps(xor(x, set(-0.0)));
    _mm512_div_ps(one, _mm512_add_ps(one, e))
}

/// x · clamp(x + 3, 0, 6) / 6, each step one exact operation as the
/// unfused add, clamp (NaN passes, as in the GEMM store's clamp), mul and
/// div kernels compute it (a GEMM's `hardswish` epilogue).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn hardswish_ps(x: __m512) -> __m512 {
    let c = _mm512_add_ps(x, _mm512_set1_ps(3.0));
    let c = _mm512_min_ps(_mm512_set1_ps(6.0), _mm512_max_ps(_mm512_setzero_ps(), c));
    _mm512_div_ps(_mm512_mul_ps(x, c), _mm512_set1_ps(6.0))
}

/// x · sigmoid(x): the unfused `sigmoid` then `mul`, bit for bit (SiLU as
/// Core ATen decomposes it; a GEMM's `mul_sigmoid` epilogue).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn mul_sigmoid_ps(x: __m512) -> __m512 {
    _mm512_mul_ps(x, sigmoid_ps(x))
}

/// `a`'s vector body: per lane what the table's slice function of this
/// math computes (for kernels that apply an activation in registers: the
/// GEMM microkernels' store step, the depthwise rows).
///
/// # Safety
/// The CPU has `avx512f`. Always inlined and without target features of
/// its own, so that it melts into the calling kernel (which has them) with
/// the bodies it calls: an out-of-line call per vector would pass the
/// vector through memory.
#[inline(always)]
pub(crate) unsafe fn activation_ps(a: VectorActivation, v: __m512) -> __m512 {
    match a {
        VectorActivation::Gelu => gelu_ps(v),
        VectorActivation::Silu => silu_ps(v),
        VectorActivation::Sigmoid => sigmoid_ps(v),
        VectorActivation::MulSigmoid => mul_sigmoid_ps(v),
        VectorActivation::Hardswish => hardswish_ps(v),
        VectorActivation::GeluTanhChain => gelu_tanh_chain_ps(v),
    }
}

/// tanh (AVX2 `tanh_ps`): Cephes' odd polynomial below [`TANH_SMALL`],
/// `1 - 2/(e^{2|x|} + 1)` above, x's sign put back last.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tanh_ps(x: __m512) -> __m512 {
    let ax = abs(x);
    let z = _mm512_mul_ps(x, x);
    let p = horner(z, &TANH_POLY);
    let small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), ax, ax);
    let one = set(1.0);
    let e = exp_ps(_mm512_add_ps(ax, ax));
    let large = _mm512_sub_ps(one, _mm512_div_ps(set(2.0), _mm512_add_ps(e, one)));
    let t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, set(TANH_SMALL)), large, small);
    or(t, and(x, set(-0.0)))
}

/// GPT-2's `gelu_new` chain around [`tanh_ps`], one f32 operation per
/// step in the unfused graph's order (AVX2 `gelu_tanh_chain_ps`).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gelu_tanh_chain_ps(x: __m512) -> __m512 {
    use kiln_isa::epilogue::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
    let cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    let inner = _mm512_add_ps(x, _mm512_mul_ps(set(CUBIC), cube));
    let t = tanh_ps(_mm512_mul_ps(set(SQRT_2_OVER_PI), inner));
    _mm512_mul_ps(_mm512_mul_ps(set(HALF), x), _mm512_add_ps(set(ONE), t))
}

/// x / (1 + e^-x) (AVX2 `silu_ps`).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu_ps(x: __m512) -> __m512 {
    let e = exp_ps(xor(x, set(-0.0)));
    _mm512_div_ps(x, _mm512_add_ps(set(1.0), e))
}

/// Defines a safe slice function `out[i] = $vector(x[i])` over the shorter
/// length, 16 lanes at a time, the tail through masked loads and stores
/// (its missing lanes computed on zeros and not written).
macro_rules! slice_fns {
    ($($(#[$doc:meta])* $name:ident => $vector:ident;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(x: &[f32], out: &mut [f32]) {
            #[target_feature(enable = "avx512f")]
            unsafe fn run(x: &[f32], out: &mut [f32]) {
                let n = x.len().min(out.len());
                let (x, out) = (&x[..n], &mut out[..n]);
                let mut xs = x.chunks_exact(LANES);
                let mut os = out.chunks_exact_mut(LANES);
                for (xc, oc) in (&mut xs).zip(&mut os) {
                    // SAFETY: both chunks hold exactly LANES f32s.
                    _mm512_storeu_ps(oc.as_mut_ptr(), $vector(_mm512_loadu_ps(xc.as_ptr())));
                }
                let (xt, ot) = (xs.remainder(), os.into_remainder());
                if !xt.is_empty() {
                    let mask: __mmask16 = (1u16 << xt.len()) - 1;
                    // SAFETY: the mask covers the tail's xt.len() (< LANES)
                    // elements only; masked-off lanes are neither read nor written.
                    let v = $vector(_mm512_maskz_loadu_ps(mask, xt.as_ptr()));
                    _mm512_mask_storeu_ps(ot.as_mut_ptr(), mask, v);
                }
            }
            // SAFETY: only installed in a v4 table, after AVX-512F was detected.
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
}
