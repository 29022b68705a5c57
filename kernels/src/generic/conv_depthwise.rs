//! Direct f32 depthwise convolution: every group has one input channel
//! (`groups == Cin`), and output channel `oc` reads input channel
//! `oc / multiplier`.
//!
//! im2col + GEMM would run these with M = 1 per group, paying for a column
//! buffer and packing to do one multiply-add per copied element. Here each
//! output row is seeded with the bias, then every kernel tap adds a weighted,
//! shifted copy of one input row to it. Along a row, the output columns whose
//! tap lands inside the input form one interval that depends only on the tap's
//! column `kx`; it is computed once per call, so the inner loop is a plain
//! multiply-add over two slices with no bounds arithmetic, which the compiler
//! vectorises (unit stride: contiguous loads). Working a row at a time keeps
//! the output row in L1 while all taps accumulate into it.

use super::conv::{valid_columns, Geometry};
use super::gemm::Epilogue;
use crate::parallel::{Threads, ELEMENT_CHUNK};
use crate::table::KernelTable;
use crate::types::Scratch;

/// `x` is `[N, cin, input..]`, `w` `[cout, 1, kernel..]`, `out`
/// `[N, cout, output..]`, with `cout` a multiple of `cin` and the shapes
/// already checked against `g`; `out` is not empty. `epilogue` (no bias:
/// the bias seeds each row) is applied to each finished row while it is in
/// L1, as output plane `plane_index`'s row of a `[N·cout, osp]` matrix.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_depthwise_f32(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    epilogue: &Epilogue<'_>,
    g: &Geometry,
    cin: usize,
    cout: usize,
    out: &mut [f32],
    table: &KernelTable,
    scratch: &mut Scratch,
) {
    let [_, _, iw] = g.input;
    let [_, _, kw] = g.kernel;
    let [_, _, ow] = g.output;
    let isp: usize = g.input.iter().product();
    let osp: usize = g.output.iter().product();
    let ksp: usize = g.kernel.iter().product();
    let multiplier = cout / cin;

    // columns[2 * kx .. 2 * kx + 2] = the output columns [lo, hi) whose tap kx
    // reads inside the input row.
    // Small outputs are not worth waking the pool for.
    let threads = if out.len() < 2 * ELEMENT_CHUNK { Threads::single() } else { scratch.pack.threads };
    let columns = scratch.indices(2 * kw);
    for (kx, range) in columns.chunks_exact_mut(2).enumerate() {
        let (lo, hi) = valid_columns(kx * g.dil[2], g.pad[2], g.stride[2], iw, ow);
        range.copy_from_slice(&[lo, hi]);
    }
    let columns = &*columns;

    // Output planes are independent: shared out whole over the threads.
    let run = table.depthwise.run;
    threads.for_each_chunk(out, osp.max(1), |plane_index, plane| {
        let (n, oc) = (plane_index / cout, plane_index % cout);
        let job = DepthwisePlane {
            input: &x[(n * cin + oc / multiplier) * isp..][..isp],
            taps: &w[oc * ksp..][..ksp],
            bias: bias.map_or(0.0, |b| b[oc]),
            g,
            columns,
            epilogue,
            plane_index,
        };
        run(&job, plane);
    });
}

/// One output plane of a depthwise convolution: its input plane, kernel taps
/// and bias, the valid output columns of each tap column (`columns[2*kx..]`
/// = `[lo, hi)`), and the epilogue of its rows (plane `plane_index` of the
/// `[N·cout, osp]` output matrix).
pub(crate) struct DepthwisePlane<'a> {
    pub(crate) input: &'a [f32],
    pub(crate) taps: &'a [f32],
    pub(crate) bias: f32,
    pub(crate) g: &'a Geometry,
    pub(crate) columns: &'a [usize],
    pub(crate) epilogue: &'a Epilogue<'a>,
    pub(crate) plane_index: usize,
}

/// The kernel table's depthwise entry: fills one output plane.
pub(crate) type DepthwisePlaneFn = fn(&DepthwisePlane<'_>, &mut [f32]);

/// The portable variant.
pub(crate) fn depthwise_plane_generic(job: &DepthwisePlane<'_>, plane: &mut [f32]) {
    depthwise_plane(job, plane)
}

/// The plane loops, inlined into each ISA's variant: the x86 ones compile
/// this same code with wider vectors enabled (`#[target_feature]`). Rust
/// never contracts `a * b + c` into an FMA, so every variant does the same
/// IEEE operations in the same order as the portable one, bit for bit.
#[inline(always)]
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, plane: &mut [f32]) {
    let g = job.g;
    let [id, ih, iw] = g.input;
    let [kd, kh, kw] = g.kernel;
    let [_, oh, ow] = g.output;
    for (r, row) in plane.chunks_exact_mut(ow).enumerate() {
        let (oz, oy) = (r / oh, r % oh);
        row.fill(job.bias);
        for kz in 0..kd {
            // Negative coordinates wrap to huge values and fail the bounds test too.
            let iz = (oz * g.stride[0] + kz * g.dil[0]).wrapping_sub(g.pad[0]);
            if iz >= id {
                continue;
            }
            for ky in 0..kh {
                let iy = (oy * g.stride[1] + ky * g.dil[1]).wrapping_sub(g.pad[1]);
                if iy >= ih {
                    continue;
                }
                let in_row = &job.input[(iz * ih + iy) * iw..][..iw];
                let row_taps = &job.taps[(kz * kh + ky) * kw..][..kw];
                for (kx, (&weight, range)) in row_taps.iter().zip(job.columns.chunks_exact(2)).enumerate() {
                    let (lo, hi) = (range[0], range[1]);
                    if lo < hi {
                        let first = lo * g.stride[2] + kx * g.dil[2] - g.pad[2];
                        add_scaled(&mut row[lo..hi], &in_row[first..], g.stride[2], weight);
                    }
                }
            }
        }
        job.epilogue.apply(row, job.plane_index, r * ow);
    }
}

/// `dst[j] += weight * src[j * stride]`. The unit-stride loop is the hot one;
/// slicing `src` to `dst`'s length up front lets the compiler drop the bounds
/// checks and vectorise it.
#[inline(always)]
fn add_scaled(dst: &mut [f32], src: &[f32], stride: usize, weight: f32) {
    if stride == 1 {
        let src = &src[..dst.len()];
        for (o, &v) in dst.iter_mut().zip(src) {
            *o += weight * v;
        }
    } else {
        // Pairs / triples of `src` per output (the compiler vectorises these
        // with shuffles, unlike `step_by`); the last output may have a partial
        // group, so it is done on its own.
        let Some((last, body)) = dst.split_last_mut() else { return };
        let src_body = &src[..body.len() * stride];
        if stride == 2 {
            // A constant group size, the common strided case (MobileNet).
            for (o, pair) in body.iter_mut().zip(src_body.chunks_exact(2)) {
                *o += weight * pair[0];
            }
        } else {
            for (o, group) in body.iter_mut().zip(src_body.chunks_exact(stride)) {
                *o += weight * group[0];
            }
        }
        *last += weight * src[body.len() * stride];
    }
}
