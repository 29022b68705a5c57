//! Weight-only quantized linear: f32 activations times int8 or int4
//! weights dequantized inside the microkernel (no f32 copy of the weight).
//!
//! Made for decode (M = 1…16), where the layer is bound by the weights'
//! bandwidth: the driver hands whole 16-column strips to the threads, and
//! each strip's weights are read once per MR rows of `x`, as they are
//! stored (a quarter or an eighth of the f32 bytes). Larger M runs the same
//! kernel row block by row block.
//!
//! Arithmetic, per output (row i, column j): `total = bias[j]`, then for
//! each group g in order, `dot = Σ_{p in g} x[i][p] · f32(q[j][p] - zp)`
//! accumulated in p order, and `total += scale[j][g] · dot`. The generic
//! kernel rounds each product and each sum; the vector kernels fuse them
//! (FMA), so they may differ from it by the FMA's rounding: at most
//! `2 · group · ε · Σ_p |x[i][p] · (q − zp) · scale|` per output (ε =
//! 2^-24), the bound `kernels/tests/quant.rs` checks.

use super::pack::{lane, strip_bytes, STRIP};
use super::{PackedQWeights, QBits, QuantKernels};
use crate::context::Context;
use crate::generic::gemm::PARALLEL_MIN_FLOPS;
use crate::parallel::{SharedMut, Threads};

/// One strip's weights, scales and zero points (see `pack.rs`).
pub(crate) struct WoStrip<'a> {
    pub(crate) bits: QBits,
    pub(crate) k: usize,
    pub(crate) group: usize,
    pub(crate) groups: usize,
    /// The strip's lane steps.
    pub(crate) w: &'a [u8],
    /// `[group][16]`.
    pub(crate) scales: &'a [f32],
    /// `[group][16]`, or none.
    pub(crate) zps: Option<&'a [i8]>,
}

/// Most rows any weight-only kernel takes per call.
pub(crate) const MAX_MR: usize = 8;

/// `out[i*16 + c] = bias[c] + Σ_g scale · Σ_p x[i][p] · (q − zp)` for the
/// `rows ≤ mr` rows of `x` (row stride `ldx`) and the strip's 16 columns.
pub(crate) type WoKernelFn =
    fn(s: &WoStrip<'_>, x: &[f32], ldx: usize, rows: usize, bias: &[f32; STRIP], out: &mut [f32]);

/// The kernel table's weight-only entry.
#[derive(Copy, Clone)]
pub(crate) struct WoUkr {
    pub(crate) variant: &'static str,
    pub(crate) mr: usize,
    /// Whether the kernel needs every group to be a whole number of lanes
    /// (4 int8 or 8 int4 values); the generic kernel runs otherwise.
    pub(crate) lane_groups: bool,
    pub(crate) run: WoKernelFn,
}

pub(crate) const GENERIC_UKR: WoUkr = WoUkr { variant: "generic", mr: 4, lane_groups: false, run: generic_kernel };

/// Value `p` of column `c` of a strip, as stored.
pub(crate) fn stored(bits: QBits, w: &[u8], c: usize, p: usize) -> i32 {
    match bits {
        QBits::I8 => w[(p / 4) * 64 + c * 4 + p % 4] as i8 as i32,
        QBits::I4 => {
            let byte = w[(p / 8) * 64 + c * 4 + (p % 8) / 2];
            let nibble = if p.is_multiple_of(2) { byte & 0x0f } else { byte >> 4 };
            ((nibble << 4) as i8 >> 4) as i32
        }
    }
}

fn generic_kernel(s: &WoStrip<'_>, x: &[f32], ldx: usize, rows: usize, bias: &[f32; STRIP], out: &mut [f32]) {
    for i in 0..rows {
        let xr = &x[i * ldx..][..s.k];
        for c in 0..STRIP {
            let mut total = bias[c];
            for g in 0..s.groups {
                let zp = s.zps.map_or(0, |z| z[g * STRIP + c] as i32);
                let mut dot = 0f32;
                for (p, &xp) in xr.iter().enumerate().skip(g * s.group).take(s.group) {
                    dot += xp * (stored(s.bits, s.w, c, p) - zp) as f32;
                }
                total += s.scales[g * STRIP + c] * dot;
            }
            out[i * STRIP + c] = total;
        }
    }
}

/// Strips per work item at least, so an item's setup stays small.
const MIN_STRIPS: usize = 2;

pub(crate) fn run(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: &[f32],
    m: usize,
    w: &PackedQWeights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (n, k) = (w.n, w.k);
    let layout = &w.layout;
    let mut ukr = kernels.weight_only;
    if ukr.lane_groups && !w.group.is_multiple_of(lane(w.bits)) {
        ukr = GENERIC_UKR;
    }
    let threads = if m * n * k < PARALLEL_MIN_FLOPS { Threads::single() } else { cx.threads() };
    let sbytes = strip_bytes(w.bits, layout.kp);
    let strips = n.div_ceil(STRIP);
    let items = (4 * threads.count()).min(strips.div_ceil(MIN_STRIPS)).max(1);
    let per_item = strips.div_ceil(items);
    let groups = layout.groups;
    let dst = SharedMut(out.as_mut_ptr());
    let out_len = out.len();
    threads.for_each(items, |item| {
        let mut tile = [0f32; MAX_MR * STRIP];
        for s in item * per_item..((item + 1) * per_item).min(strips) {
            let j0 = s * STRIP;
            let cols = STRIP.min(n - j0);
            let mut b = [0f32; STRIP];
            if let Some(bias) = bias {
                b[..cols].copy_from_slice(&bias[j0..j0 + cols]);
            }
            let strip = WoStrip {
                bits: w.bits,
                k,
                group: w.group,
                groups,
                w: &layout.bytes()[s * sbytes..][..sbytes],
                scales: &layout.scales[s * groups * STRIP..][..groups * STRIP],
                zps: layout.zero_points.as_ref().map(|z| &z[s * groups * STRIP..][..groups * STRIP]),
            };
            for r in (0..m).step_by(ukr.mr) {
                let rows = ukr.mr.min(m - r);
                (ukr.run)(&strip, &x[r * k..], k, rows, &b, &mut tile);
                for i in 0..rows {
                    let at = (r + i) * n + j0;
                    assert!(at + cols <= out_len);
                    // SAFETY: in bounds (just checked); items own disjoint
                    // column strips of `out`.
                    let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(at), cols) };
                    o.copy_from_slice(&tile[i * STRIP..][..cols]);
                }
            }
        }
    });
}
