//! AVX-512F depthwise convolution: the portable plane loops
//! (`generic::conv_depthwise::depthwise_plane`) compiled with avx512f enabled,
//! so their multiply-adds run on full-width vectors. Same operations in the
//! same order as the generic variant (no FMA contraction), so bit-identical.

use crate::generic::conv_depthwise::{depthwise_plane as portable, DepthwisePlane};
use crate::generic::conv_nhwc::{depthwise_row as portable_row, DepthwiseRows};

/// The table entry.
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    // SAFETY: installed only in a v4 table, after AVX-512F was detected.
    unsafe { wide(job, out, buf) }
}

#[target_feature(enable = "avx512f")]
unsafe fn wide(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    portable(job, out, buf)
}

/// The channels-last depthwise row entry (same operations as the portable
/// row loops, on wider vectors).
pub(crate) fn depthwise_row(job: &DepthwiseRows<'_>, r: usize, row: &mut [f32]) {
    // SAFETY: installed only by `x86_64::plug` after AVX-512F was detected.
    unsafe { wide_row(job, r, row) }
}

#[target_feature(enable = "avx512f")]
unsafe fn wide_row(job: &DepthwiseRows<'_>, r: usize, row: &mut [f32]) {
    portable_row(job, r, row)
}
