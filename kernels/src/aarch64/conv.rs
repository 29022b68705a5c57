//! NEON depthwise convolution. NEON is part of the aarch64 base ISA, so the
//! portable plane loops (`generic::conv_depthwise::depthwise_plane`) already
//! compile to 4-wide NEON multiply-adds (no FMA contraction: bit-identical
//! to the generic variant); this entry is that code, inlined here so the
//! NEON table names its own variant.

use crate::generic::conv_depthwise::{depthwise_plane as plane, DepthwisePlane};
use crate::generic::conv_nhwc::{depthwise_row as row_loops, DepthwiseRows};

/// The table entry.
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    plane(job, out, buf)
}

/// The channels-last depthwise row entry (the portable row loops, NEON).
pub(crate) fn depthwise_row(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
    row_loops(job, r, ox0, part)
}
