//! AVX2 + FMA f32 math over slices: exp and the activations built on it
//! (sigmoid, silu, tanh), plus softmax's row maximum and exp-and-sum.
//!
//! Accuracy is the contract: each function stays within a few ulp of the
//! generic (libm-based) version on every input, including ±inf, NaN,
//! subnormal results and overflow (see `kernels/tests/variants.rs` for the
//! bounds each one is held to). Tails shorter than a vector go through a
//! padded stack buffer so every element sees the same vector code.
//!
//! Every `unsafe fn` here requires AVX2 and FMA; the safe wrappers are only
//! installed in a kernel table by [`crate::x86_64::plug`] after detecting both.

use std::arch::x86_64::*;

const LANES: usize = 8;

/// exp(x) for 8 lanes: Cody–Waite reduction x = n·ln2 + r (|r| ≤ ln2/2) with
/// ln2 split so n·C1 is exact, Cephes' degree-5 polynomial for
/// (e^r - 1 - r)/r², and 2^n applied as two halves so that results near
/// overflow and in the subnormal range are scaled without intermediate
/// overflow (the second product is the only rounding there).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_ps(x: __m256) -> __m256 {
    // Below -104 the result rounds to 0, above 88.8 it overflows, so clamping
    // there changes no result and keeps n in [-150, 128]. max/min return the
    // second operand for a NaN lane; NaN is put back at the end.
    let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0)), _mm256_set1_ps(88.8));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166_666_65));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    // 1 + (r + r²·p): the small part first, then one rounding onto 1.
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    let e = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
    _mm256_blendv_ps(e, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// 1 / (1 + e^-x), the generic formula with [`exp_ps`] (division is exact).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sigmoid_ps(x: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    let e = exp_ps(_mm256_xor_ps(x, _mm256_set1_ps(-0.0)));
    _mm256_div_ps(one, _mm256_add_ps(one, e))
}

/// x / (1 + e^-x), the generic formula with [`exp_ps`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_ps(x: __m256) -> __m256 {
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
    let mut p = _mm256_set1_ps(-5.704_988_7e-3);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.063_909e-2));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.373_971_6e-2));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(0.133_314_42));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-0.333_332_8));
    let small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), ax, ax);
    let one = _mm256_set1_ps(1.0);
    let e = exp_ps(_mm256_add_ps(ax, ax));
    let large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)));
    let t = _mm256_blendv_ps(large, small, _mm256_cmp_ps::<_CMP_LT_OQ>(ax, _mm256_set1_ps(0.625)));
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
