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

    // Small outputs are not worth waking the pool for.
    let threads = if out.len() < 2 * ELEMENT_CHUNK { Threads::single() } else { scratch.pack.threads };
    let run = table.depthwise.run;
    let job_of = |plane_index: usize, columns, padded| {
        let (n, oc) = (plane_index / cout, plane_index % cout);
        DepthwisePlane {
            input: &x[(n * cin + oc / multiplier) * isp..][..isp],
            taps: &w[oc * ksp..][..ksp],
            bias: bias.map_or(0.0, |b| b[oc]),
            g,
            columns,
            padded,
            epilogue,
            plane_index,
        }
    };

    // 2-d kernels: each plane through a zero-padded copy (per thread).
    if let Some(padded) = PaddedGeometry::of(g) {
        let len = padded.scratch_len(g);
        let workers = scratch.workers(threads.count(), |w| {
            w.f32s(len);
        });
        threads.for_each_chunk(out, osp.max(1), |plane_index, plane| {
            let mut worker = workers[threads.index()].lock().unwrap_or_else(|e| e.into_inner());
            run(&job_of(plane_index, &[], Some(&padded)), plane, worker.f32s(len));
        });
        return;
    }

    // columns[2 * kx .. 2 * kx + 2] = the output columns [lo, hi) whose tap kx
    // reads inside the input row.
    let columns = scratch.indices(2 * kw);
    for (kx, range) in columns.chunks_exact_mut(2).enumerate() {
        let (lo, hi) = valid_columns(kx * g.dil[2], g.pad[2], g.stride[2], iw, ow);
        range.copy_from_slice(&[lo, hi]);
    }
    let columns = &*columns;

    // Output planes are independent: shared out whole over the threads.
    threads.for_each_chunk(out, osp.max(1), |plane_index, plane| {
        run(&job_of(plane_index, columns, None), plane, &mut []);
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
    /// Set for 2-d kernels: the plane runs through a zero-padded copy
    /// ([`padded_plane`]) instead of the interior/border loops.
    pub(crate) padded: Option<&'a PaddedGeometry>,
    pub(crate) epilogue: &'a Epilogue<'a>,
    pub(crate) plane_index: usize,
}

/// The kernel table's depthwise entry: fills one output plane, given a
/// buffer of at least [`PaddedGeometry::scratch_len`] f32s when the job is
/// `padded` (else unused).
pub(crate) type DepthwisePlaneFn = fn(&DepthwisePlane<'_>, &mut [f32], &mut [f32]);

/// The portable variant.
pub(crate) fn depthwise_plane_generic(job: &DepthwisePlane<'_>, plane: &mut [f32], buf: &mut [f32]) {
    depthwise_plane(job, plane, buf)
}

/// The plane loops, inlined into each ISA's variant: the x86 ones compile
/// this same code with wider vectors enabled (`#[target_feature]`). Rust
/// never contracts `a * b + c` into an FMA, so every variant does the same
/// IEEE operations in the same order as the portable one, bit for bit.
///
/// Register-blocked: each output row's interior (the columns where every
/// tap column lands inside the input) is computed [`BLOCK`] outputs at a
/// time with the sums held in registers over all taps, so each output is
/// written once instead of once per tap (the row-at-a-time version re-read
/// and re-wrote the row 9 times for a 3×3 kernel and spent 36 % of
/// MobileNetV2 there). The border columns take the bounds-checked path.
/// Every output adds the bias, then its in-bounds taps in (z, y, x) order,
/// whichever path computes it.
#[inline(always)]
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, plane: &mut [f32], buf: &mut [f32]) {
    if let Some(padded) = job.padded {
        return padded_plane(job, padded, buf, plane);
    }
    let g = job.g;
    let [id, ih, iw] = g.input;
    let [kd, kh, kw] = g.kernel;
    let [_, oh, ow] = g.output;
    let (sx, dx, px) = (g.stride[2], g.dil[2], g.pad[2]);
    // The columns every tap column reads inside the input: the intersection
    // of the per-tap intervals.
    let (mut lo, mut hi) = (0, ow);
    for range in job.columns.chunks_exact(2) {
        (lo, hi) = (lo.max(range[0]), hi.min(range[1]));
    }
    let hi = hi.max(lo);
    // Offsets into the input plane of the in-bounds (kz, ky) tap rows of the
    // current output row, with their first tap's index: at most kd·kh.
    let mut rows = [(0usize, 0usize); MAX_TAP_ROWS];
    for (r, row) in plane.chunks_exact_mut(ow).enumerate() {
        let (oz, oy) = (r / oh, r % oh);
        let mut count = 0;
        for kz in 0..kd {
            // Negative coordinates wrap to huge values and fail the bounds test too.
            let iz = (oz * g.stride[0] + kz * g.dil[0]).wrapping_sub(g.pad[0]);
            if iz >= id {
                continue;
            }
            for ky in 0..kh {
                let iy = (oy * g.stride[1] + ky * g.dil[1]).wrapping_sub(g.pad[1]);
                if iy < ih && count < MAX_TAP_ROWS {
                    // (Always room when the blocked path runs.)
                    rows[count] = ((iz * ih + iy) * iw, (kz * kh + ky) * kw);
                    count += 1;
                }
            }
        }
        if kd * kh <= MAX_TAP_ROWS {
            let tap_rows = &rows[..count];
            interior(job, tap_rows, lo, hi, row);
            for o in (0..lo).chain(hi..ow) {
                row[o] = border_column(job, tap_rows, o, sx, dx, px, iw);
            }
        } else {
            // More tap rows than the fixed table holds (a huge 3-d kernel):
            // the row-at-a-time loops.
            plane_rows_fallback(job, row, oz, oy);
        }
        job.epilogue.apply(row, job.plane_index, r * ow);
    }
}

/// Interior outputs `lo..hi` of `row` in whole blocks: a tail shorter than
/// a block is covered by one more block ending at `hi`, overlapping the
/// previous one (recomputing an output gives the same bits), so only rows
/// narrower than 4 take single outputs.
#[inline(always)]
fn interior(job: &DepthwisePlane<'_>, tap_rows: &[(usize, usize)], lo: usize, hi: usize, row: &mut [f32]) {
    match hi - lo {
        n if n >= BLOCK => blocks::<BLOCK>(job, tap_rows, lo, hi, row),
        n if n >= 8 => blocks::<8>(job, tap_rows, lo, hi, row),
        n if n >= 4 => blocks::<4>(job, tap_rows, lo, hi, row),
        _ => blocks::<1>(job, tap_rows, lo, hi, row),
    }
}

/// Outputs `lo..hi` (at least `B` of them, or none) in `B`-wide blocks, the
/// last one ending at `hi`.
#[inline(always)]
fn blocks<const B: usize>(
    job: &DepthwisePlane<'_>,
    tap_rows: &[(usize, usize)],
    lo: usize,
    hi: usize,
    row: &mut [f32],
) {
    let mut ox = lo;
    while ox + B <= hi {
        interior_block::<B>(job, tap_rows, ox, &mut row[ox..ox + B]);
        ox += B;
    }
    if ox < hi {
        interior_block::<B>(job, tap_rows, hi - B, &mut row[hi - B..hi]);
    }
}

/// Outputs per register block: one AVX-512 vector, two AVX2 ones.
const BLOCK: usize = 16;

/// Most (kz, ky) tap rows the blocked path tracks (a 7×7×7 kernel).
const MAX_TAP_ROWS: usize = 64;

/// Interior outputs `ox..ox + B` of one row: every tap column is in bounds,
/// so the sums are plain multiply-adds held in a fixed-size array the
/// compiler keeps in registers.
#[inline(always)]
fn interior_block<const B: usize>(job: &DepthwisePlane<'_>, tap_rows: &[(usize, usize)], ox: usize, out: &mut [f32]) {
    let g = job.g;
    let (sx, dx, px, kw) = (g.stride[2], g.dil[2], g.pad[2], g.kernel[2]);
    let mut acc = [job.bias; B];
    for &(offset, tap0) in tap_rows {
        let in_row = &job.input[offset..][..g.input[2]];
        for (kx, &weight) in job.taps[tap0..][..kw].iter().enumerate() {
            let first = ox * sx + kx * dx - px;
            if sx == 1 {
                let src = &in_row[first..][..B];
                for (a, &v) in acc.iter_mut().zip(src) {
                    *a += weight * v;
                }
            } else if sx == 2 {
                // A constant stride (MobileNet's downsampling): the compiler
                // turns the even elements into one permute, not a gather.
                let src = &in_row[first..][..2 * B - 1];
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += weight * src[2 * j];
                }
            } else {
                let src = &in_row[first..][..(B - 1) * sx + 1];
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += weight * src[j * sx];
                }
            }
        }
    }
    out.copy_from_slice(&acc);
}

/// One border output: only the taps whose column lands inside the input.
#[inline(always)]
fn border_column(
    job: &DepthwisePlane<'_>,
    tap_rows: &[(usize, usize)],
    ox: usize,
    sx: usize,
    dx: usize,
    px: usize,
    iw: usize,
) -> f32 {
    let kw = job.g.kernel[2];
    let mut acc = job.bias;
    for &(offset, tap0) in tap_rows {
        for (kx, &weight) in job.taps[tap0..][..kw].iter().enumerate() {
            let ix = (ox * sx + kx * dx).wrapping_sub(px);
            if ix < iw {
                acc += weight * job.input[offset + ix];
            }
        }
    }
    acc
}

/// The row-at-a-time loops for kernels with more than [`MAX_TAP_ROWS`] tap
/// rows: the row seeded with the bias, then every in-bounds tap's shifted
/// copy of an input row added to it (same per-output order).
fn plane_rows_fallback(job: &DepthwisePlane<'_>, row: &mut [f32], oz: usize, oy: usize) {
    let g = job.g;
    let [id, ih, iw] = g.input;
    let [kd, kh, kw] = g.kernel;
    row.fill(job.bias);
    for kz in 0..kd {
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

/// Most kernel taps the padded path takes (an 8×8 kernel).
const MAX_PADDED_TAPS: usize = 64;

/// The zero-padded copy of a 2-d depthwise plane: `rows` rows of `width`
/// (`pad | input row | pad`), and each tap's offset from an output's first
/// read (`(ky·dy)·width + kx·dx`, taps in (y, x) order).
///
/// With the padding in the copy every tap of every output reads inside it,
/// so there are no border columns: the interior/border split computed a
/// 7-wide row as two overlapping 4-wide blocks plus two scalar, bounds-tested
/// border outputs, and MobileNetV2's depthwise convolutions (7²–112² planes)
/// ran at 1–3.5 GFLOP/s. At unit stride the plane is one flat run over a grid
/// `width` wide (output `(oy, ox)` at `oy·width + ox`, the `width - OW`
/// columns past each row computed and dropped), so a 7×7 plane is four
/// 16-wide blocks. Every output adds the bias, then every tap in (y, x)
/// order, the padding's zeros included: the same sum as the unpadded loops,
/// which skip those taps, except that a `+0` product can turn an exact `-0`
/// sum into `+0`.
#[derive(Clone, Debug)]
pub(crate) struct PaddedGeometry {
    rows: usize,
    width: usize,
    offsets: [usize; MAX_PADDED_TAPS],
    taps: usize,
}

impl PaddedGeometry {
    /// The padded copy of `g`'s planes, if `g` is a 2-d convolution (leading
    /// unit dims, as lower ranks run) with few enough taps.
    pub(crate) fn of(g: &Geometry) -> Option<PaddedGeometry> {
        let [id, ih, iw] = g.input;
        let [kd, kh, kw] = g.kernel;
        let taps = kh * kw;
        if id != 1 || kd != 1 || g.pad[0] != 0 || g.output[0] != 1 || taps > MAX_PADDED_TAPS {
            return None;
        }
        let (rows, width) = (ih + 2 * g.pad[1], iw + 2 * g.pad[2]);
        let mut offsets = [0; MAX_PADDED_TAPS];
        for (t, offset) in offsets.iter_mut().enumerate().take(taps) {
            *offset = (t / kw) * g.dil[1] * width + (t % kw) * g.dil[2];
        }
        Some(PaddedGeometry { rows, width, offsets, taps })
    }

    /// f32s one plane needs: the padded copy and, at unit stride, the flat
    /// output grid.
    pub(crate) fn scratch_len(&self, g: &Geometry) -> usize {
        self.rows * self.width + if self.unit_stride(g) { g.output[1] * self.width } else { 0 }
    }

    fn unit_stride(&self, g: &Geometry) -> bool {
        g.stride[1] == 1 && g.stride[2] == 1
    }
}

/// One output plane through its zero-padded copy (see [`PaddedGeometry`]);
/// `buf` holds at least [`PaddedGeometry::scratch_len`] f32s. The epilogue
/// runs once over the finished plane.
#[inline(always)]
fn padded_plane(job: &DepthwisePlane<'_>, pg: &PaddedGeometry, buf: &mut [f32], plane: &mut [f32]) {
    let g = job.g;
    let [_, ih, iw] = g.input;
    let [_, oh, ow] = g.output;
    let (ph, pw, width) = (g.pad[1], g.pad[2], pg.width);
    let (padded, grid) = buf.split_at_mut(pg.rows * width);
    // Rows are short (7–114): inline copies, not a libc call per row (which
    // took 11 % of MobileNetV2).
    fill_short(&mut padded[..ph * width], 0.0);
    fill_short(&mut padded[(ph + ih) * width..], 0.0);
    for (dst, src) in padded[ph * width..].chunks_exact_mut(width).zip(job.input.chunks_exact(iw)).take(ih) {
        fill_short(&mut dst[..pw], 0.0);
        copy_short(&mut dst[pw..pw + iw], src);
        fill_short(&mut dst[pw + iw..], 0.0);
    }
    let mut taps = [(0usize, 0f32); MAX_PADDED_TAPS];
    for (t, tap) in taps.iter_mut().enumerate().take(pg.taps) {
        *tap = (pg.offsets[t], job.taps[t]);
    }
    let taps = &taps[..pg.taps];
    let padded = &*padded;
    if pg.unit_stride(g) {
        // One flat run up to the last row's last real output.
        let run = &mut grid[..(oh - 1) * width + ow];
        padded_run::<1>(padded, taps, 1, job.bias, run);
        for (row, src) in plane.chunks_exact_mut(ow).zip(run.chunks(width)) {
            copy_short(row, &src[..ow]);
        }
    } else {
        let (sy, sx) = (g.stride[1], g.stride[2]);
        for (oy, row) in plane.chunks_exact_mut(ow).enumerate() {
            let src = &padded[oy * sy * width..];
            match sx {
                1 => padded_run::<1>(src, taps, 1, job.bias, row),
                2 => padded_run::<2>(src, taps, 2, job.bias, row),
                _ => padded_run::<0>(src, taps, sx, job.bias, row),
            }
        }
    }
    job.epilogue.apply(plane, job.plane_index, 0);
}

/// `dst = src` (equal lengths) in 8-element pieces the compiler keeps
/// inline.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    let src = &src[..dst.len()];
    let whole = dst.len() / 8 * 8;
    let (body, tail) = dst.split_at_mut(whole);
    for (d8, s8) in body.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
        d8.copy_from_slice(s8);
    }
    for (dv, &sv) in tail.iter_mut().zip(&src[whole..]) {
        *dv = sv;
    }
}

/// `dst.fill(v)` for short slices, inline.
#[inline(always)]
fn fill_short(dst: &mut [f32], v: f32) {
    let mut d = dst.chunks_exact_mut(8);
    for d8 in &mut d {
        d8.copy_from_slice(&[v; 8]);
    }
    for dv in d.into_remainder() {
        *dv = v;
    }
}

/// `out[j] = bias + Σ_taps weight · src[j·stride + offset]`, in blocks as
/// wide as `out` allows (the last one ending at the end, overlapping: an
/// output computed twice gets the same bits). `S` is the stride when it is
/// 1 or 2 (constant: unit loads, or one permute for the even elements), 0
/// for `stride` read at run time.
#[inline(always)]
fn padded_run<const S: usize>(src: &[f32], taps: &[(usize, f32)], stride: usize, bias: f32, out: &mut [f32]) {
    match out.len() {
        n if n >= BLOCK => padded_blocks::<BLOCK, S>(src, taps, stride, bias, out),
        n if n >= 8 => padded_blocks::<8, S>(src, taps, stride, bias, out),
        n if n >= 4 => padded_blocks::<4, S>(src, taps, stride, bias, out),
        _ => padded_blocks::<1, S>(src, taps, stride, bias, out),
    }
}

#[inline(always)]
fn padded_blocks<const B: usize, const S: usize>(
    src: &[f32],
    taps: &[(usize, f32)],
    stride: usize,
    bias: f32,
    out: &mut [f32],
) {
    let n = out.len();
    let mut start = 0;
    while start < n {
        let j0 = start.min(n - B);
        let mut acc = [bias; B];
        for &(offset, weight) in taps {
            let first = j0 * stride + offset;
            match S {
                1 => {
                    for (a, &v) in acc.iter_mut().zip(&src[first..][..B]) {
                        *a += weight * v;
                    }
                }
                2 => {
                    let s = &src[first..][..2 * B - 1];
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a += weight * s[2 * j];
                    }
                }
                _ => {
                    let s = &src[first..][..(B - 1) * stride + 1];
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a += weight * s[j * stride];
                    }
                }
            }
        }
        out[j0..j0 + B].copy_from_slice(&acc);
        start = j0 + B;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register-blocked plane loops and the padded path give the
    /// row-at-a-time loops' bits (the same per-output order): 3×3 and 5×5
    /// at strides 1–3, padding 0–2, dilation 1–2, widths around the block
    /// sizes, 3-d kernels (no padded path).
    #[test]
    fn blocked_plane_matches_the_row_loops() {
        let mut seed = 11u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        // (input [d, h, w], kernel, stride, pad, dilation)
        type Case = ([usize; 3], [usize; 3], [usize; 3], [usize; 3], [usize; 3]);
        let cases: [Case; 9] = [
            ([1, 9, 40], [1, 3, 3], [1, 1, 1], [0, 1, 1], [1; 3]),
            ([1, 8, 37], [1, 3, 3], [1, 2, 2], [0, 1, 1], [1; 3]),
            ([1, 7, 7], [1, 3, 3], [1, 1, 1], [0, 1, 1], [1; 3]),
            ([1, 6, 19], [1, 5, 5], [1, 1, 1], [0, 2, 2], [1; 3]),
            ([1, 5, 50], [1, 3, 3], [1, 1, 3], [0, 0, 2], [1, 1, 2]),
            ([1, 4, 17], [1, 3, 3], [1, 2, 2], [0, 0, 0], [1; 3]),
            ([1, 1, 1], [1, 3, 3], [1, 1, 1], [0, 1, 1], [1; 3]),
            ([1, 3, 2], [1, 3, 3], [1, 1, 1], [0, 1, 1], [1; 3]),
            ([4, 5, 21], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1; 3]),
        ];
        for (input, kernel, stride, pad, dil) in cases {
            let output: [usize; 3] =
                std::array::from_fn(|d| (input[d] + 2 * pad[d] - dil[d] * (kernel[d] - 1) - 1) / stride[d] + 1);
            let g = Geometry { input, kernel, stride, pad, dil, output };
            let x: Vec<f32> = (0..input.iter().product::<usize>()).map(|_| next()).collect();
            let taps: Vec<f32> = (0..kernel.iter().product::<usize>()).map(|_| next()).collect();
            let columns: Vec<usize> = (0..kernel[2])
                .flat_map(|kx| {
                    let (lo, hi) = valid_columns(kx * dil[2], pad[2], stride[2], input[2], output[2]);
                    [lo, hi]
                })
                .collect();
            let epilogue = Epilogue::default();
            let job = DepthwisePlane {
                input: &x,
                taps: &taps,
                bias: 0.25,
                g: &g,
                columns: &columns,
                padded: None,
                epilogue: &epilogue,
                plane_index: 0,
            };
            let osp: usize = output.iter().product();
            let mut blocked = vec![0.0f32; osp];
            depthwise_plane(&job, &mut blocked, &mut []);
            let mut rows = vec![0.0f32; osp];
            for (r, row) in rows.chunks_exact_mut(output[2]).enumerate() {
                plane_rows_fallback(&job, row, r / output[1], r % output[1]);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&blocked), bits(&rows), "{input:?} k{kernel:?} s{stride:?} p{pad:?} d{dil:?}");
            // The padded path (2-d kernels) adds the padding's zeros too,
            // which changes no nonzero sum.
            if let Some(pg) = PaddedGeometry::of(&g) {
                let mut buf = vec![f32::NAN; pg.scratch_len(&g)];
                let mut padded = vec![0.0f32; osp];
                depthwise_plane(&DepthwisePlane { padded: Some(&pg), ..job }, &mut padded, &mut buf);
                assert_eq!(bits(&padded), bits(&rows), "padded {input:?} k{kernel:?} s{stride:?} p{pad:?} d{dil:?}");
            }
        }
    }
}
