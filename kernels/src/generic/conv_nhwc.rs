//! Channels-last (`[N, H, W, C]`) 2-d convolutions: what the layout pass
//! (`kiln_passes::layout`) gives chains of convolutions, so that no
//! convolution converts its input or output between layouts.
//!
//! - Depthwise (one input channel per group, as many outputs): each output
//!   pixel is a vector of channels; every kernel tap adds its input pixel's
//!   channel vector times the tap's weight row (the weight transposed to
//!   `[taps, C]` once per call), 16 channels per block, so the loops
//!   vectorise over channels (XNNPACK's dwconv order). A tap that lands in
//!   the padding reads a row of zeros: each output is the bias, then every
//!   tap's product added in (y, x) order, zero products included — the
//!   operations of the channels-first padded-plane loops
//!   (`conv_depthwise`), so the two layouts give the same bits.
//! - Pointwise (1×1, no padding, one group): a plain GEMM `[N·OH·OW, Cin] ×
//!   [Cin, Cout]` over the input read in place (stride 1) or over its
//!   strided pixels gathered into scratch; the weight is B (packed once at
//!   load, [`PackedConv::channels_last`]); bias, activation and residual in
//!   the store step. Same K slices and per-element order as the
//!   channels-first GEMM (which has the roles of A and B swapped).
//! - 3×3 stride-1 dense kernels with enough (not too many) channels:
//!   Winograd F(2×2, 3×3) or F(4×4, 3×3) (`conv_winograd`), which reads the padded
//!   channels-last image and writes output pixels directly.
//! - Dense kernels wider than 1×1 with enough channels: the tap GEMMs of
//!   `conv_taps`, which already compute channels-last: their input copy is
//!   a row copy here, and the result is copied out, not transposed.
//! - Other dense kernels (an RGB stem, or no tap GEMMs on this table) with
//!   a short enough reduction: the channels-first kernel's im2col GEMM with
//!   A and B swapped — the im2col rows of the output pixels, gathered
//!   (in parallel) into scratch, times the weight transposed — so the
//!   result is channels-last with no transposition, and the same K slices
//!   and per-element order as channels-first.
//! - Anything else (grouped convolutions, a depthwise multiplier, a long
//!   reduction without tap GEMMs): transposed to channels-first in
//!   scratch, the channels-first kernel, transposed back.

use super::common::*;
use super::conv::{conv_fused, epilogue_views, geometry, ConvParams, Geometry, PackedConv, TensorEpilogue};
use super::conv_taps::{self, PackedTaps, TapEpilogue};
use super::conv_winograd::{self, PackedWinograd};
use super::gemm::{
    gemm_sum_packed, run_gemm, ASource, ActivationFn, BSource, Bias, Epilogue, PackedB, SumTerm, PARALLEL_MIN_FLOPS,
};
use crate::context::Context;
use crate::parallel::{SharedMut, Threads, ELEMENT_CHUNK};
use crate::table::KernelTable;
use crate::types::{DType, Result, TensorMut, TensorRef};

const K: &str = "conv";

/// Most kernel taps the channels-last depthwise loops take (7×7 has 49).
pub(crate) const MAX_DEPTHWISE_TAPS: usize = 64;

/// `[N, H, W, C]` as the channels-first shape `[N, C, H, W]`.
fn nchw(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[3], shape[1], shape[2]]
}

/// Which channels-last algorithm a convolution of weight shape `w` and
/// `groups` runs on `table`, with `g`'s geometry. Depends on nothing else, so
/// a packed and an unpacked weight take the same path.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum NhwcPath {
    Depthwise,
    Pointwise,
    Winograd,
    Taps,
    Im2col,
    Transposed,
}

/// Longest reduction (`Cin·kh·kw`) the channels-last im2col path takes: its
/// scratch holds that many floats per output pixel (a 7×7 RGB stem needs 147).
const MAX_IM2COL_K: usize = 1024;

pub(crate) fn path_of(table: &KernelTable, w: &[usize], p: &ConvParams, cin: usize) -> NhwcPath {
    let (groups, pad) = (p.groups, p.padding);
    let ksp: usize = w[2..].iter().product();
    if w.len() != 4 {
        NhwcPath::Transposed
    } else if w[1] == 1 && groups == cin && w[0] == cin && ksp <= MAX_DEPTHWISE_TAPS {
        NhwcPath::Depthwise
    } else if ksp == 1 && groups == 1 && pad.iter().all(|&p| p == 0) {
        NhwcPath::Pointwise
    } else if conv_winograd::applies(table, w, groups, p.stride, p.dilation) {
        NhwcPath::Winograd
    } else if conv_taps::applies(table, w, groups) {
        NhwcPath::Taps
    } else if groups == 1 && w[1] * ksp <= MAX_IM2COL_K {
        NhwcPath::Im2col
    } else {
        NhwcPath::Transposed
    }
}

/// A fused convolution whose input, residual and output are channels-last
/// (`x [N, H, W, Cin]`, `out [N, OH, OW, Cout]`; the weight `[Cout,
/// Cin/groups, kh, kw]` as always); f32, 2-d. With `packed` (a
/// [`PackedConv::channels_last`] of this `w`) the GEMMs read the packed
/// weight when it fits `cx`'s table. Each output element is computed with
/// the same operations as [`conv_fused`] on the channels-first tensors.
#[allow(clippy::too_many_arguments)]
pub fn conv_fused_channels_last(
    x: TensorRef,
    w: TensorRef,
    packed: Option<&PackedConv>,
    bias: Option<TensorRef>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    for d in [x.dtype, w.dtype, out.dtype] {
        expect_dtype(K, "channels-last operand", d, DType::F32)?;
    }
    if x.shape.len() != 4 || out.shape.len() != 4 || w.shape.len() != 4 {
        return Err(shape_err(
            K,
            format!("a channels-last convolution is 2-d: x {:?}, w {:?}, out {:?}", x.shape, w.shape, out.shape),
        ));
    }
    let (xs, os) = (nchw(x.shape), nchw(out.shape));
    let g = geometry(&xs, w.shape, p, &os)?;
    let (batch, cin, cout, groups) = (xs[0], xs[1], w.shape[0], p.groups);
    if groups == 0 || cin % groups != 0 || cout % groups != 0 || cin / groups != w.shape[1] {
        return Err(shape_err(
            K,
            format!("groups {groups} incompatible with Cin {cin}, Cout {cout}, weight Cin/groups {}", w.shape[1]),
        ));
    }
    if os[0] != batch || os[1] != cout {
        return Err(shape_err(K, format!("output shape {:?} must be [{batch}, .., .., {cout}]", out.shape)));
    }
    if let Some(pk) = packed {
        if !pk.is_for(w.shape, groups) {
            return Err(shape_err(K, format!("packed weight {:?} is not this weight {:?}", pk.shape(), w.shape)));
        }
    }
    let (bv, residual) = epilogue_views(K, &bias, &epilogue.residual, cout, out.shape)?;
    if out.data.is_empty() {
        return Ok(());
    }
    let path = path_of(cx.table, w.shape, p, cin);
    if path == NhwcPath::Transposed {
        return transposed(x, w, bias, epilogue, p, out, cx);
    }
    let xv = view::<f32>(K, "x", &x)?;
    let wv = view::<f32>(K, "w", &w)?;
    let ov = view_mut::<f32>(K, "out", &mut out)?;
    let table = cx.table;
    let activation = epilogue.activation.map(|a| ActivationFn::new(table, a));
    let fused = Fused { bias: bv, activation, residual, residual_first: epilogue.residual_first };
    match path {
        NhwcPath::Depthwise => {
            depthwise(xv, wv, &fused, &g, batch, cin, ov, cx);
            Ok(())
        }
        NhwcPath::Pointwise => {
            let b = packed.and_then(|pk| pk.pointwise.as_ref()).filter(|b| b.fits(table));
            let b = match b {
                Some(b) => BSource::Packed(b),
                // B[k][n] = w[n][k]: the weight read transposed.
                None => BSource::strided(wv, cin, true),
            };
            pointwise(xv, b, &fused, &g, (batch, cin, cout), ov, cx);
            Ok(())
        }
        NhwcPath::Im2col => {
            let kdim = wv.len() / cout;
            let b = packed.and_then(|pk| pk.pointwise.as_ref()).filter(|b| b.fits(table));
            let b = match b {
                Some(b) => BSource::Packed(b),
                None => BSource::strided(wv, kdim, true),
            };
            if let BSource::Packed(pb) = b {
                if im2col_blocked(xv, pb, &fused, &g, (batch, cin, cout), ov, cx) {
                    return Ok(());
                }
            }
            im2col(xv, b, &fused, &g, (batch, cin, cout), ov, cx);
            Ok(())
        }
        NhwcPath::Winograd => {
            let owned;
            let u = match packed.and_then(|pk| pk.winograd.as_ref()).filter(|u| u.fits(table)) {
                Some(u) => u,
                None => {
                    owned = PackedWinograd::new(table, wv, w.shape)?;
                    &owned
                }
            };
            let threads = cx.scratch.pack.threads.count();
            let (buf, pack) = cx.scratch.split(conv_winograd::scratch_len(&g, u, threads));
            let e = TapEpilogue { bias: bv, activation, residual, residual_first: epilogue.residual_first };
            let io = conv_taps::Io { x: xv, out: ov, channels_last: true };
            if conv_winograd::conv_winograd(table, io, u, &e, &g, (batch, cin, cout), buf, pack) {
                return Ok(());
            }
            transposed(x, w, bias, epilogue, p, out, cx)
        }
        NhwcPath::Taps => {
            let owned;
            let taps = match packed.and_then(|pk| pk.taps.as_ref()).filter(|t| t.fits(table)) {
                Some(t) => t,
                None => {
                    owned = PackedTaps::new(table, wv, w.shape)?;
                    &owned
                }
            };
            let (buf, pack) = cx.scratch.split(conv_taps::scratch_len(&g, cin, cout));
            let e = TapEpilogue { bias: bv, activation, residual, residual_first: epilogue.residual_first };
            let io = conv_taps::Io { x: xv, out: ov, channels_last: true };
            if conv_taps::conv_taps(table, io, taps, &e, &g, (batch, cin, cout), buf, pack) {
                return Ok(());
            }
            // No GEMM kernel that reads A in place: through channels-first.
            transposed(x, w, bias, epilogue, p, out, cx)
        }
        NhwcPath::Transposed => unreachable!("handled above"),
    }
}

/// The epilogue of a channels-last convolution, resolved.
#[derive(Copy, Clone)]
struct Fused<'a> {
    bias: Option<&'a [f32]>,
    activation: Option<ActivationFn>,
    residual: Option<&'a [f32]>,
    residual_first: bool,
}

impl Fused<'_> {
    /// The residual (if any) and the activation, in the epilogue's order, on
    /// output elements `offset..offset + part.len()` (the bias is already in).
    fn finish(&self, part: &mut [f32], offset: usize) {
        let add = |part: &mut [f32]| {
            if let Some(r) = self.residual {
                part.iter_mut().zip(&r[offset..]).for_each(|(o, &v)| *o += v);
            }
        };
        if self.residual_first {
            add(part);
        }
        if let Some(act) = &self.activation {
            act.apply(part);
        }
        if !self.residual_first {
            add(part);
        }
    }
}

/// The fused bias, activation and residual of a convolution run as one
/// GEMM over output pixels (rows) and output channels (columns).
fn pixel_gemm_epilogue<'a>(e: &Fused<'a>, cout: usize) -> Epilogue<'a> {
    Epilogue {
        bias: e.bias.map_or(Bias::None, Bias::PerCol),
        activation: e.activation,
        residual: e.residual.map(|r| (r, cout)),
        residual_first: e.residual_first,
        ..Epilogue::default()
    }
}

/// The pointwise convolution as one GEMM over the output pixels.
fn pointwise(
    x: &[f32],
    b: BSource<'_>,
    e: &Fused<'_>,
    g: &Geometry,
    (batch, cin, cout): (usize, usize, usize),
    out: &mut [f32],
    cx: &mut Context,
) {
    let table = cx.table;
    let [_, ih, iw] = g.input;
    let [_, oh, ow] = g.output;
    let (sy, sx) = (g.stride[1], g.stride[2]);
    let m = batch * oh * ow;
    let epilogue = pixel_gemm_epilogue(e, cout);
    if sy == 1 && sx == 1 {
        let pack = &mut cx.scratch.pack;
        run_gemm(table, m, cout, cin, ASource::Strided { a: x, lda: cin }, b, out, cout, 0.0, epilogue, pack);
        return;
    }
    // A strided 1×1: the pixels it reads, gathered into rows.
    let (rows, pack) = cx.scratch.split(m * cin);
    let threads = if rows.len() < 2 * ELEMENT_CHUNK { Threads::single() } else { pack.threads };
    threads.for_each_chunk(rows, ow * cin, |r, row| {
        let (n, oy) = (r / oh, r % oh);
        let src = &x[(n * ih + oy * sy) * iw * cin..];
        for (ox, px) in row.chunks_exact_mut(cin).enumerate() {
            px.copy_from_slice(&src[ox * sx * cin..][..cin]);
        }
    });
    run_gemm(table, m, cout, cin, ASource::Strided { a: rows, lda: cin }, b, out, cout, 0.0, epilogue, pack);
}

/// A dense convolution as one GEMM over the output pixels: `[N·OH·OW,
/// Cin·kh·kw]` im2col rows (channel-major, then y, x: the weight's order)
/// times the weight transposed. Zeros stand for the padding, as in the
/// channels-first strips, so every product of that GEMM is made here too.
fn im2col(
    x: &[f32],
    b: BSource<'_>,
    e: &Fused<'_>,
    g: &Geometry,
    (batch, cin, cout): (usize, usize, usize),
    out: &mut [f32],
    cx: &mut Context,
) {
    let table = cx.table;
    let [_, kh, kw] = g.kernel;
    let [_, oh, ow] = g.output;
    let (m, kdim) = (batch * oh * ow, cin * kh * kw);
    let epilogue = pixel_gemm_epilogue(e, cout);
    let (rows, pack) = cx.scratch.split(m * kdim);
    let threads = if rows.len() < 2 * ELEMENT_CHUNK { Threads::single() } else { pack.threads };
    threads.for_each_chunk(rows, ow * kdim, |r, row| gather_row(x, g, cin, r, row));
    run_gemm(table, m, cout, kdim, ASource::Strided { a: rows, lda: kdim }, b, out, cout, 0.0, epilogue, pack);
}

/// Output pixels per work item of [`im2col_blocked`] (whole output rows,
/// at least this many pixels): the item's im2col rows stay in L1/L2
/// between their gathering and the GEMM that reads them. Fixed, so the
/// split never depends on the thread count.
const IM2COL_BLOCK_PIXELS: usize = 128;

/// [`im2col`] with the weight packed, one job: each work item gathers the
/// im2col rows of a few output rows into its thread's scratch and runs the
/// GEMM over them at once (the table's direct kernel, A read in place), so
/// the rows never leave the cache and the stem needs no serial step. The
/// same tiles, K slices and per-element order as [`im2col`]'s one GEMM
/// (row blocks never change an element's arithmetic). False, with nothing
/// written, when the table has no direct kernel or `b` does not fit it.
#[allow(clippy::too_many_arguments)]
fn im2col_blocked(
    x: &[f32],
    b: &PackedB,
    e: &Fused<'_>,
    g: &Geometry,
    (batch, cin, cout): (usize, usize, usize),
    out: &mut [f32],
    cx: &mut Context,
) -> bool {
    let table = cx.table;
    if table.gemm.direct.is_none() || !b.fits(table) {
        return false;
    }
    let [_, kh, kw] = g.kernel;
    let [_, oh, ow] = g.output;
    let kdim = cin * kh * kw;
    let out_rows = batch * oh;
    let per_item = IM2COL_BLOCK_PIXELS.div_ceil(ow).clamp(1, out_rows);
    let items = out_rows.div_ceil(per_item);
    let threads = if out.len() * kdim < PARALLEL_MIN_FLOPS { Threads::single() } else { cx.scratch.pack.threads };
    let item_len = per_item * ow * kdim;
    let (buf, _) = cx.scratch.split(threads.count() * item_len);
    let (bufs, dst) = (SharedMut(buf.as_mut_ptr()), SharedMut(out.as_mut_ptr()));
    let epilogue = pixel_gemm_epilogue(e, cout);
    let done = std::sync::atomic::AtomicBool::new(true);
    threads.for_each(items, |item| {
        let r0 = item * per_item;
        let rows = per_item.min(out_rows - r0);
        let pixels = rows * ow;
        // SAFETY: the calling thread's own buffer (`Threads::index` is
        // unique among the threads running this job), inside `buf`.
        let a = unsafe { std::slice::from_raw_parts_mut(bufs.ptr().add(threads.index() * item_len), pixels * kdim) };
        for (i, row) in a.chunks_exact_mut(ow * kdim).enumerate() {
            gather_row(x, g, cin, r0 + i, row);
        }
        let offset = r0 * ow * cout;
        // SAFETY: items own disjoint runs of output rows of `out`.
        let c = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(offset), pixels * cout) };
        let ep = Epilogue { residual: epilogue.residual.map(|(r, ld)| (&r[offset..], ld)), ..epilogue };
        let term = |_| SumTerm { a: &*a, lda: kdim, k0: 0, k1: kdim };
        if !gemm_sum_packed(table, pixels, b, 1, &term, c, cout, ep, &Threads::single()) {
            done.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    });
    // Checked above, so every item ran; kept as a guard all the same.
    done.into_inner()
}

/// The im2col row of each pixel of output row `r` (`n = r / OH`, `oy = r %
/// OH`): each input pixel's channels go to columns c·ksp + t of its tap
/// t, zeros for the padding. RGB stems' shapes get loops with their
/// channel count and kernel width fixed at compile time (fully unrolled).
fn gather_row(x: &[f32], g: &Geometry, cin: usize, r: usize, row: &mut [f32]) {
    match (cin, g.kernel[1], g.kernel[2], g.dil[2]) {
        (3, 3, 3, 1) => gather_row_with::<3, 3, 3>(x, g, cin, r, row),
        (3, 7, 7, 1) => gather_row_with::<3, 7, 7>(x, g, cin, r, row),
        _ => gather_row_with::<0, 0, 0>(x, g, cin, r, row),
    }
}

/// [`gather_row`] with `CIN` channels, a `KH`×`KW` kernel and no
/// horizontal dilation (all 0: those of `cin` and `g`, for any shape).
/// Where a kernel row lies inside the input (all but the borders) its taps
/// read one run of the input row, at fixed offsets.
#[inline(always)]
fn gather_row_with<const CIN: usize, const KH: usize, const KW: usize>(
    x: &[f32],
    g: &Geometry,
    cin: usize,
    r: usize,
    row: &mut [f32],
) {
    let [_, ih, iw] = g.input;
    let [_, kh, kw] = g.kernel;
    let (cin, kh, kw, dx) = if CIN == 0 { (cin, kh, kw, g.dil[2]) } else { (CIN, KH, KW, 1) };
    let oh = g.output[1];
    let ksp = kh * kw;
    let kdim = cin * ksp;
    let (sx, px_) = (g.stride[2], g.pad[2]);
    let (n, oy) = (r / oh, r % oh);
    for (ox, px) in row.chunks_exact_mut(kdim).enumerate() {
        let ix0 = (ox * sx).wrapping_sub(px_);
        let inside = ix0 < iw && ix0 + (kw - 1) * dx < iw;
        for ky in 0..kh {
            // Wrapped negative coordinates fail the bounds tests too.
            let iy = (oy * g.stride[1] + ky * g.dil[1]).wrapping_sub(g.pad[1]);
            let line = (iy < ih).then(|| &x[(n * ih + iy) * iw * cin..][..iw * cin]);
            match line {
                Some(line) if inside => {
                    let src = &line[ix0 * cin..][..((kw - 1) * dx + 1) * cin];
                    for c in 0..cin {
                        let dst = &mut px[c * ksp + ky * kw..][..kw];
                        for (kx, d) in dst.iter_mut().enumerate() {
                            *d = src[kx * dx * cin + c];
                        }
                    }
                }
                Some(line) => {
                    for kx in 0..kw {
                        let t = ky * kw + kx;
                        let ix = ix0.wrapping_add(kx * dx);
                        if ix < iw {
                            for c in 0..cin {
                                px[c * ksp + t] = line[ix * cin + c];
                            }
                        } else {
                            for c in 0..cin {
                                px[c * ksp + t] = 0.0;
                            }
                        }
                    }
                }
                None => {
                    for c in 0..cin {
                        px[c * ksp + ky * kw..][..kw].fill(0.0);
                    }
                }
            }
        }
    }
}

/// One depthwise convolution's operands for the table's row function:
/// output row `r` (`n = r / OH`, `oy = r % OH`) of `[N·OH, OW·C]`.
pub(crate) struct DepthwiseRows<'a> {
    /// The input, `[N, H, W, C]`.
    pub(crate) x: &'a [f32],
    /// The weight transposed to `[taps, C]`.
    pub(crate) taps: &'a [f32],
    /// `[C]`: the bias, or zeros.
    pub(crate) bias: &'a [f32],
    /// `[C]` zeros: what a tap in the padding reads.
    pub(crate) zeros: &'a [f32],
    pub(crate) g: &'a Geometry,
    pub(crate) channels: usize,
    /// A clamp (ReLU6) applied to each sum in registers, before it is
    /// stored: the clamp kernel's comparisons, so the same bits as
    /// clamping the stored row.
    pub(crate) clamp: Option<(f32, f32)>,
    /// Another activation (never with a clamp), applied by every row kernel
    /// before its results reach the output: in registers where
    /// `in_registers` says the kernel's vector math is the table's code for
    /// it, otherwise the table's slice function; the same bits as applying
    /// it to the stored row either way.
    pub(crate) activation: Option<ActivationFn>,
}

/// The kernel table's channels-last depthwise entry: `(job, r, ox0, part)`
/// fills output pixels `ox0..ox0 + part.len() / C` of output row `r` into
/// `part`. Each pixel's sums are the same operations wherever the part
/// starts or ends, so a row may be cut into parts anywhere between pixels.
pub(crate) type DepthwiseRowFn = fn(&DepthwiseRows<'_>, usize, usize, &mut [f32]);

/// The portable variant.
pub(crate) fn depthwise_row_generic(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
    depthwise_row(job, r, ox0, part)
}

/// Channels per register block (an AVX-512 vector; two AVX2 ones).
const CHANNEL_BLOCK: usize = 16;

/// The row loops, inlined into each ISA's variant (compiled there with
/// wider vectors enabled). Rust never contracts `a * b + c` into an FMA, so
/// every variant does the same IEEE operations in the same order.
#[inline(always)]
pub(crate) fn depthwise_row(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
    let g = job.g;
    let [_, _, iw] = g.input;
    let [_, kh, kw] = g.kernel;
    let c = job.channels;
    let ksp = kh * kw;
    let tap_rows = tap_rows(job, r);
    let mut srcs: [&[f32]; MAX_DEPTHWISE_TAPS] = [job.zeros; MAX_DEPTHWISE_TAPS];
    for (ox, px) in (ox0..).zip(part.chunks_exact_mut(c)) {
        let mut t = 0;
        for tap_row in &tap_rows[..kh] {
            for kx in 0..kw {
                let ix = (ox * g.stride[2] + kx * g.dil[2]).wrapping_sub(g.pad[2]);
                srcs[t] = match tap_row {
                    Some(input) if ix < iw => &input[ix * c..][..c],
                    _ => job.zeros,
                };
                t += 1;
            }
        }
        let srcs = &srcs[..ksp];
        match c {
            c if c >= CHANNEL_BLOCK => wide_channels(job, srcs, px),
            c if c >= 8 => channel_blocks::<8>(job, srcs, px),
            c if c >= 4 => channel_blocks::<4>(job, srcs, px),
            _ => channel_blocks::<1>(job, srcs, px),
        }
    }
}

/// The input rows of output row `r`'s kernel rows (None: in the padding),
/// once per row; no divisions per pixel (they cost more than a 32-channel
/// pixel's multiply-adds).
#[inline(always)]
pub(crate) fn tap_rows<'a>(job: &DepthwiseRows<'a>, r: usize) -> [Option<&'a [f32]>; MAX_DEPTHWISE_TAPS] {
    let g = job.g;
    let [_, ih, iw] = g.input;
    let oh = g.output[1];
    let c = job.channels;
    let (n, oy) = (r / oh, r % oh);
    let image = &job.x[n * ih * iw * c..][..ih * iw * c];
    let mut tap_rows = [None; MAX_DEPTHWISE_TAPS];
    for (ky, tap_row) in tap_rows.iter_mut().enumerate().take(g.kernel[1]) {
        // Negative coordinates wrap to huge values and fail the bounds test too.
        let iy = (oy * g.stride[1] + ky * g.dil[1]).wrapping_sub(g.pad[1]);
        *tap_row = (iy < ih).then(|| &image[iy * iw * c..][..iw * c]);
    }
    tap_rows
}

/// Where tap `t` of output pixel `ox + p` reads its `C` channels, for the
/// `P` pixels from `ox`: `srcs[t][p]` (the zero pixel in the padding). Each
/// pointer starts `C` readable floats. (For the x86-64 row kernels.)
#[cfg(all(target_arch = "x86_64", feature = "isa"))]
#[inline(always)]
pub(crate) fn pixel_sources<const P: usize>(
    job: &DepthwiseRows<'_>,
    tap_rows: &[Option<&[f32]>; MAX_DEPTHWISE_TAPS],
    ox: usize,
    srcs: &mut [[*const f32; P]; MAX_DEPTHWISE_TAPS],
) {
    let g = job.g;
    let iw = g.input[2];
    let [_, kh, kw] = g.kernel;
    let c = job.channels;
    let mut t = 0;
    for tap_row in &tap_rows[..kh] {
        for kx in 0..kw {
            for (p, src) in srcs[t].iter_mut().enumerate() {
                let ix = ((ox + p) * g.stride[2] + kx * g.dil[2]).wrapping_sub(g.pad[2]);
                *src = match tap_row {
                    Some(input) if ix < iw => input[ix * c..][..c].as_ptr(),
                    _ => job.zeros.as_ptr(),
                };
            }
            t += 1;
        }
    }
}

/// A run of output pixels whose kernel taps all lie inside the input row
/// horizontally, stride 1, without dilation: the row kernels then slide
/// along the input (each input pixel loaded once for every output it feeds).
#[cfg(all(target_arch = "x86_64", feature = "isa"))]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slide {
    /// The kernel's width.
    pub(crate) width: usize,
    /// The input column of the first pixel's first tap.
    pub(crate) first: usize,
}

/// [`Slide`] for output pixels `ox..ox + P` of `job`'s rows, if they are
/// such a run: columns the padding never reaches, stride 1, a kernel 3 or
/// 5 wide (the shapes of the CNNs' depthwise layers). Others take the
/// per-pixel sources of [`pixel_sources`]; so do stride 2 rows, where
/// sliding saves only 17 loads of 24 per kernel row of 8 pixels and
/// measured slower (MobileNetV2's 112² stride-2 layer 228 → 314 µs).
#[cfg(all(target_arch = "x86_64", feature = "isa"))]
#[inline(always)]
pub(crate) fn slide_geometry<const P: usize>(job: &DepthwiseRows<'_>, ox: usize) -> Option<Slide> {
    let g = job.g;
    let (width, pad, iw) = (g.kernel[2], g.pad[2], g.input[2]);
    let shape_fits = g.dil[2] == 1 && g.stride[2] == 1 && matches!(width, 3 | 5);
    let first = ox.checked_sub(pad)?;
    (shape_fits && first + (P - 1) + width <= iw).then_some(Slide { width, first })
}

/// How many output pixels at the start of a row have a tap in the left
/// padding.
#[cfg(all(target_arch = "x86_64", feature = "isa"))]
#[inline(always)]
pub(crate) fn left_border(job: &DepthwiseRows<'_>) -> usize {
    job.g.pad[2].div_ceil(job.g.stride[2])
}

/// At least 16 channels: 64 at a time (four independent vector sums per
/// tap on AVX-512, eight on AVX2: one sum's chain of adds would leave the
/// core waiting on each add's latency), then 32 and 16, the last 16 ending
/// at the last channel (overlapping: a channel computed twice gets the
/// same bits).
#[inline(always)]
fn wide_channels(job: &DepthwiseRows<'_>, srcs: &[&[f32]], px: &mut [f32]) {
    let c = px.len();
    let mut c0 = 0;
    while c - c0 >= 64 {
        channel_block::<64>(job, srcs, px, c0);
        c0 += 64;
    }
    if c - c0 >= 32 {
        channel_block::<32>(job, srcs, px, c0);
        c0 += 32;
    }
    if c - c0 >= CHANNEL_BLOCK {
        channel_block::<CHANNEL_BLOCK>(job, srcs, px, c0);
        c0 += CHANNEL_BLOCK;
    }
    if c0 < c {
        channel_block::<CHANNEL_BLOCK>(job, srcs, px, c - CHANNEL_BLOCK);
    }
}

/// Channels `c0..c0 + B` of one output pixel: the bias, then each tap's
/// product.
#[inline(always)]
fn channel_block<const B: usize>(job: &DepthwiseRows<'_>, srcs: &[&[f32]], px: &mut [f32], c0: usize) {
    let c = px.len();
    let mut acc = [0f32; B];
    acc.copy_from_slice(&job.bias[c0..c0 + B]);
    for (t, src) in srcs.iter().enumerate() {
        let w = &job.taps[t * c + c0..][..B];
        for ((a, &wv), &v) in acc.iter_mut().zip(w).zip(&src[c0..c0 + B]) {
            *a += wv * v;
        }
    }
    clamp(job, &mut acc);
    store(job, &acc, &mut px[c0..c0 + B]);
}

/// The job's clamp, if it has one, as `clamp_f32_in_place` computes it.
#[inline(always)]
fn clamp(job: &DepthwiseRows<'_>, acc: &mut [f32]) {
    if let Some((lo, hi)) = job.clamp {
        for a in acc.iter_mut() {
            let x = if *a < lo { lo } else { *a };
            *a = if x > hi { hi } else { x };
        }
    }
}

/// Stores finished sums, through the job's activation if it has one (the
/// table's slice function, from the sums to the output: no copy back).
#[inline(always)]
fn store(job: &DepthwiseRows<'_>, acc: &[f32], out: &mut [f32]) {
    match &job.activation {
        Some(a) => a.apply_to(acc, out),
        None => out.copy_from_slice(acc),
    }
}

/// One output pixel's channels in `B`-wide blocks, the last one ending at
/// the last channel (overlapping: a channel computed twice gets the same
/// bits). `px` has at least `B` channels.
#[inline(always)]
fn channel_blocks<const B: usize>(job: &DepthwiseRows<'_>, srcs: &[&[f32]], px: &mut [f32]) {
    let c = px.len();
    let mut start = 0;
    while start < c {
        let c0 = start.min(c - B);
        let mut acc = [0f32; B];
        acc.copy_from_slice(&job.bias[c0..c0 + B]);
        for (t, src) in srcs.iter().enumerate() {
            let w = &job.taps[t * c + c0..][..B];
            for ((a, &wv), &v) in acc.iter_mut().zip(w).zip(&src[c0..c0 + B]) {
                *a += wv * v;
            }
        }
        clamp(job, &mut acc);
        store(job, &acc, &mut px[c0..c0 + B]);
        start = c0 + B;
    }
}

/// The depthwise convolution (multiplier 1) over output rows shared out to
/// the threads; the activation in the row kernels without a residual,
/// otherwise the residual and activation on each finished row.
#[allow(clippy::too_many_arguments)]
fn depthwise(
    x: &[f32],
    w: &[f32],
    e: &Fused<'_>,
    g: &Geometry,
    batch: usize,
    c: usize,
    out: &mut [f32],
    cx: &mut Context,
) {
    let ksp = g.kernel[1] * g.kernel[2];
    let ow = g.output[2];
    // Weight rows per tap, the bias (or zeros) and a zero pixel, in scratch.
    let (buf, pack) = cx.scratch.split((ksp + 2) * c);
    let (taps, rest) = buf.split_at_mut(ksp * c);
    let (bias, zeros) = rest.split_at_mut(c);
    for (ch, wc) in w.chunks_exact(ksp).enumerate() {
        for (t, &v) in wc.iter().enumerate() {
            taps[t * c + ch] = v;
        }
    }
    match e.bias {
        Some(b) => bias.copy_from_slice(b),
        None => bias.fill(0.0),
    }
    zeros.fill(0.0);
    // Without a residual, the activation goes into the row loops: a clamp,
    // or another activation, which the x86-64 rows compute in registers
    // where the table's entry for it is of their ISA's math (their entries
    // carry its variant name; the portable rows ignore `in_registers`).
    // The rest of the epilogue runs on each finished row.
    let table = cx.table;
    let in_rows = e.activation.filter(|_| e.residual.is_none());
    let clamp = in_rows.and_then(|a| a.clamp_bounds());
    let math = Some(table.depthwise_nhwc.variant);
    let activation = in_rows.filter(|_| clamp.is_none()).map(|a| a.for_vector_math(table, math));
    let rest = Fused { bias: None, activation: e.activation.filter(|_| in_rows.is_none()), ..*e };
    let job = DepthwiseRows { x, taps, bias, zeros, g, channels: c, clamp, activation };
    let run = table.depthwise_nhwc.run;
    let threads = if out.len() < 2 * ELEMENT_CHUNK { Threads::single() } else { pack.threads };
    let rows = batch * g.output[1];
    debug_assert_eq!(out.len(), rows * ow * c);
    let items = depthwise_items(rows, ow, threads.count());
    let pixels = rows * ow;
    let dst = SharedMut(out.as_mut_ptr());
    threads.for_each(items, |i| {
        let (p0, p1) = (i * pixels / items, (i + 1) * pixels / items);
        // SAFETY: the items' pixel ranges partition `out`'s pixels, which
        // stays borrowed mutably until `for_each` returns.
        let part = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(p0 * c), (p1 - p0) * c) };
        let mut p = p0;
        while p < p1 {
            let (r, ox0) = (p / ow, p % ow);
            let end = p1.min((r + 1) * ow);
            run(&job, r, ox0, &mut part[(p - p0) * c..(end - p0) * c]);
            p = end;
        }
        rest.finish(part, p0 * c);
    });
}

/// How many work items [`depthwise`] cuts its `rows` output rows of `ow`
/// pixels into on `threads` threads: one per row when the rows divide
/// evenly over the threads; otherwise a multiple of the thread count (as
/// few as keep items no longer than a row), of equal runs of pixels, so
/// that the late small layers (7 rows on 2 threads: 4 against 3) keep
/// every thread busy to the end. A pixel's sums never depend on the part
/// of a row it is computed in, so neither do the results.
fn depthwise_items(rows: usize, ow: usize, threads: usize) -> usize {
    if threads <= 1 || rows.is_multiple_of(threads) || rows * ow < threads {
        return rows;
    }
    threads * rows.div_ceil(threads)
}

/// The fallback: the channels-first kernel between transpositions in
/// scratch (input, residual, output), each element computed as there.
fn transposed(
    x: TensorRef,
    w: TensorRef,
    bias: Option<TensorRef>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let (xs, os) = (nchw(x.shape), nchw(out.shape));
    let (x_len, o_len) = (x.shape.iter().product::<usize>(), out.shape.iter().product::<usize>());
    let r_len = if epilogue.residual.is_some() { o_len } else { 0 };
    // Out of the context's scratch while the kernel below uses it.
    let mut buf = std::mem::take(&mut cx.scratch.layout);
    if buf.len() < x_len + r_len + o_len {
        buf.resize(x_len + r_len + o_len, 0.0);
    }
    let (xb, rest) = buf.split_at_mut(x_len);
    let (rb, rest) = rest.split_at_mut(r_len);
    let ob = &mut rest[..o_len];
    nhwc_to_nchw(view::<f32>(K, "x", &x)?, x.shape, xb);
    let residual = match &epilogue.residual {
        Some(r) => {
            nhwc_to_nchw(view::<f32>(K, "residual", r)?, r.shape, rb);
            Some(TensorRef { dtype: DType::F32, shape: &os, data: bytemuck::cast_slice(&*rb) })
        }
        None => None,
    };
    let e = TensorEpilogue { residual, ..*epilogue };
    let xr = TensorRef { dtype: DType::F32, shape: &xs, data: bytemuck::cast_slice(&*xb) };
    let om = TensorMut { dtype: DType::F32, shape: &os, data: bytemuck::cast_slice_mut(&mut *ob) };
    let result = conv_fused(xr, w, None, bias, &e, p, om, cx);
    if result.is_ok() {
        nchw_to_nhwc(ob, &os, view_mut::<f32>(K, "out", &mut out)?);
    }
    cx.scratch.layout = buf;
    result
}

/// `[N, H, W, C]` → `[N, C, H, W]`.
fn nhwc_to_nchw(src: &[f32], shape: &[usize], dst: &mut [f32]) {
    let (n, h, w, c) = (shape[0], shape[1], shape[2], shape[3]);
    let hw = h * w;
    for b in 0..n {
        let (s, d) = (&src[b * hw * c..][..hw * c], &mut dst[b * hw * c..][..hw * c]);
        for (p, px) in s.chunks_exact(c).enumerate() {
            for (ch, &v) in px.iter().enumerate() {
                d[ch * hw + p] = v;
            }
        }
    }
}

/// `[N, C, H, W]` (shape given channels-first) → `[N, H, W, C]`.
fn nchw_to_nhwc(src: &[f32], shape: &[usize; 4], dst: &mut [f32]) {
    let [n, c, h, w] = *shape;
    let hw = h * w;
    for b in 0..n {
        let (s, d) = (&src[b * hw * c..][..hw * c], &mut dst[b * hw * c..][..hw * c]);
        for (ch, plane) in s.chunks_exact(hw.max(1)).enumerate() {
            for (p, &v) in plane.iter().enumerate() {
                d[p * c + ch] = v;
            }
        }
    }
}
