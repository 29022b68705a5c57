//! AVX-512F depthwise convolution: the portable plane loops
//! (`generic::conv_depthwise::depthwise_plane`) compiled with avx512f enabled,
//! so their multiply-adds run on full-width vectors. Same operations in the
//! same order as the generic variant (no FMA contraction), so bit-identical.

//! The channels-last row kernel is `depthwise_kernel.rs`'s, instantiated
//! with this width's intrinsics.

use super::math;
use crate::generic::conv_depthwise::{depthwise_plane as portable, DepthwisePlane};
use std::arch::x86_64::*;

/// The table entry.
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    // SAFETY: installed only in a v4 table, after AVX-512F was detected.
    unsafe { wide(job, out, buf) }
}

#[target_feature(enable = "avx512f")]
unsafe fn wide(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    portable(job, out, buf)
}

crate::x86_64::depthwise_kernel::depthwise_row_kernel! {
    features: "avx512f",
    lanes: 16,
    vec: __m512,
    loadu: _mm512_loadu_ps,
    storeu: _mm512_storeu_ps,
    set1: _mm512_set1_ps,
    add: _mm512_add_ps,
    mul: _mm512_mul_ps,
    min: _mm512_min_ps,
    max: _mm512_max_ps,
    math: math,
}

/// Lanes `0..min(n, 16)` set.
#[inline]
fn tail_mask(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// # Safety
/// AVX-512F; the lanes of `mask` lie inside readable memory from `p`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_masked(p: *const f32, mask: __mmask16) -> __m512 {
    _mm512_maskz_loadu_ps(mask, p)
}

/// # Safety
/// AVX-512F; the lanes of `mask` lie inside writable memory from `p`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_masked(p: *mut f32, mask: __mmask16, v: __m512) {
    _mm512_mask_storeu_ps(p, mask, v)
}
