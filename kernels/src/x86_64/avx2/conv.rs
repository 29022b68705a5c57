//! AVX2 depthwise convolution: the portable plane loops
//! (`generic::conv_depthwise::depthwise_plane`) compiled with avx2,fma enabled,
//! so their multiply-adds run on full-width vectors. Same operations in the
//! same order as the generic variant (no FMA contraction), so bit-identical.

//! The channels-last row kernel is `depthwise_kernel.rs`'s, instantiated
//! with this width's intrinsics.

use super::math;
use crate::generic::conv_depthwise::{depthwise_plane as portable, DepthwisePlane};
use std::arch::x86_64::*;

/// The table entry.
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    // SAFETY: installed only by `x86_64::plug` after AVX2 and FMA were detected.
    unsafe { wide(job, out, buf) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn wide(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    portable(job, out, buf)
}

crate::x86_64::depthwise_kernel::depthwise_row_kernel! {
    features: "avx2,fma",
    lanes: 8,
    vec: __m256,
    loadu: _mm256_loadu_ps,
    storeu: _mm256_storeu_ps,
    set1: _mm256_set1_ps,
    add: _mm256_add_ps,
    mul: _mm256_mul_ps,
    min: _mm256_min_ps,
    max: _mm256_max_ps,
    math: math,
}

/// Lanes `0..min(n, 8)` set.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tail_mask(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// # Safety
/// AVX2; the lanes of `mask` lie inside readable memory from `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_masked(p: *const f32, mask: __m256i) -> __m256 {
    _mm256_maskload_ps(p, mask)
}

/// # Safety
/// AVX2; the lanes of `mask` lie inside writable memory from `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_masked(p: *mut f32, mask: __m256i, v: __m256) {
    _mm256_maskstore_ps(p, mask, v)
}
