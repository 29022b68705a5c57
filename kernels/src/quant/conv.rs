//! Quantized convolution: int8 weights (one scale per output channel,
//! symmetric) times int8 activations, as im2col rows fed to [`super::qlinear`]'s
//! integer GEMM.
//!
//! A dense (`groups == 1`) convolution of `x [N, C, spatial..]` by `w
//! [Cout, C, taps..]` is, for every output pixel `p`, `out[:, p] = W ·
//! col(p)` with `col(p)` the `C · taps` input values its window reads (zero
//! where the window hangs over the padding), ordered as the weight's
//! `[C, taps..]` — so the weight is the `[Cout, C · taps]` matrix
//! [`super::PackedQWeights`] stores, and every output pixel is one row of a
//! quantized linear layer. The activation rows are quantized as that layer
//! quantizes them: per row (one output pixel's window) for the dynamic
//! modes, with the compile-time scale and zero point for static ones; a
//! padded tap is the real value 0, which a static zero point quantizes to
//! itself, so the integer sums match torch's zero padding exactly.
//!
//! Rows are gathered a chunk of pixels at a time into the context's layout
//! scratch (bounded memory, no allocation once grown), multiplied by the
//! table's int8 microkernel on the context's threads, and the `[pixels,
//! Cout]` result is written back channels-first. The integer sums are exact
//! and each output is computed by one microkernel call, so results are the
//! same whatever the thread count and ISA variant.

use super::{err, ActQuant, PackedQWeights, QuantKernels};
use crate::context::Context;
use crate::generic::conv::{geometry, ConvParams, Geometry};
use crate::parallel::SharedMut;
use crate::types::{DType, Result, TensorMut, TensorRef};

/// f32 values of gathered rows (and their products) per chunk: bounds the
/// scratch a layer takes (4 MiB) whatever its size.
const CHUNK_VALUES: usize = 1 << 20;

/// `out = conv(x, dequant(w)) (+ bias)` with int8 activations (`act` is not
/// [`ActQuant::Float`]: weight-only convolutions run the f32 kernels on the
/// dequantized weight). `w_shape` is the weight's `[Cout, C, taps..]`;
/// `w` holds it as `[Cout, C · taps]`. `groups` must be 1.
#[allow(clippy::too_many_arguments)]
pub fn qconv(
    cx: &mut Context,
    x: TensorRef<'_>,
    w: &PackedQWeights,
    w_shape: &[usize],
    act: ActQuant,
    bias: Option<&[f32]>,
    p: &ConvParams<'_>,
    out: TensorMut<'_>,
) -> Result<()> {
    let kernels = cx.table.quant;
    qconv_with(cx, &kernels, x, w, w_shape, act, bias, p, out)
}

/// [`qconv`] with the given variant of the integer kernels (one of
/// [`super::variants`]): for tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn qconv_with(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: TensorRef<'_>,
    w: &PackedQWeights,
    w_shape: &[usize],
    act: ActQuant,
    bias: Option<&[f32]>,
    p: &ConvParams<'_>,
    out: TensorMut<'_>,
) -> Result<()> {
    if act == ActQuant::Float {
        return Err(err("a weight-only convolution runs the f32 kernels on its dequantized weight"));
    }
    if p.groups != 1 {
        return Err(err(format!("quantized convolutions with int8 activations are dense, got {} groups", p.groups)));
    }
    if x.dtype != DType::F32 || out.dtype != DType::F32 {
        return Err(err("quantized convolutions take and give f32"));
    }
    let g = geometry(x.shape, w_shape, p, out.shape)?;
    let (batch, cin, cout) = (x.shape[0], x.shape[1], w_shape[0]);
    let taps: usize = g.kernel.iter().product();
    let k = cin.checked_mul(taps).ok_or_else(|| err("weight too large"))?;
    if w_shape[1] != cin || w.n() != cout || w.k() != k || out.shape[1] != cout || out.shape[0] != batch {
        return Err(err(format!(
            "weight {w_shape:?} ({}x{} packed) does not fit input {:?} and output {:?}",
            w.n(),
            w.k(),
            x.shape,
            out.shape
        )));
    }
    let pixels: usize = g.output.iter().product();
    let plane: usize = g.input.iter().product();
    let xs: &[f32] = bytemuck::try_cast_slice(x.data).map_err(|_| err("unaligned input"))?;
    let ys: &mut [f32] = bytemuck::try_cast_slice_mut(out.data).map_err(|_| err("unaligned output"))?;
    if xs.len() != batch * cin * plane || ys.len() != batch * cout * pixels {
        return Err(err("input or output length does not match its shape"));
    }
    if pixels == 0 || batch == 0 {
        return Ok(());
    }
    let chunk = (CHUNK_VALUES / (k + cout)).clamp(1, pixels);
    // The layout scratch is free here (qlinear uses the general one): taken
    // out of the context for the call and put back, so it keeps its size.
    let mut buf = std::mem::take(&mut cx.scratch.layout);
    if buf.len() < chunk * (k + cout) {
        buf.resize(chunk * (k + cout), 0.0);
    }
    let result = (|| {
        for b in 0..batch {
            let image = &xs[b * cin * plane..][..cin * plane];
            let result = &mut ys[b * cout * pixels..][..cout * pixels];
            for p0 in (0..pixels).step_by(chunk) {
                let rows = chunk.min(pixels - p0);
                let (cols, prod) = buf.split_at_mut(chunk * k);
                let (cols, prod) = (&mut cols[..rows * k], &mut prod[..rows * cout]);
                gather_rows(cx, &g, image, cin, p0, cols);
                super::qlinear_with(cx, kernels, cols, rows, w, act, bias, prod)?;
                scatter_channels_first(prod, cout, pixels, p0, result);
            }
        }
        Ok(())
    })();
    cx.scratch.layout = buf;
    result
}

/// Rows `p0..p0 + rows` of the im2col matrix of one image (`[C, spatial..]`),
/// each `C · taps` values in the weight's order, over the context's threads.
fn gather_rows(cx: &Context, g: &Geometry, image: &[f32], cin: usize, p0: usize, cols: &mut [f32]) {
    let taps: usize = g.kernel.iter().product();
    let k = cin * taps;
    let rows = cols.len() / k;
    // A fixed number of rows per item, so the split never depends on the
    // thread count (it only moves data: any split gives the same bytes).
    const ROWS_PER_ITEM: usize = 64;
    let dst = SharedMut(cols.as_mut_ptr());
    cx.threads().for_each(rows.div_ceil(ROWS_PER_ITEM), |item| {
        let r0 = item * ROWS_PER_ITEM;
        let r1 = (r0 + ROWS_PER_ITEM).min(rows);
        // SAFETY: items own disjoint row ranges of `cols`.
        let part = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(r0 * k), (r1 - r0) * k) };
        for (r, row) in part.chunks_exact_mut(k).enumerate() {
            gather_row(g, image, cin, p0 + r0 + r, row);
        }
    });
}

/// One output pixel's window: `row[c · taps + t]` is input channel `c` at
/// tap `t` (zero in the padding).
fn gather_row(g: &Geometry, image: &[f32], cin: usize, pixel: usize, row: &mut [f32]) {
    let [od, oh, ow] = g.output;
    let [kd, kh, kw] = g.kernel;
    let [id, ih, iw] = g.input;
    let (o2, o1, o0) = (pixel / (oh * ow), (pixel / ow) % oh, pixel % ow);
    debug_assert!(o2 < od);
    let plane = id * ih * iw;
    // Input coordinate of tap `t` along dim `d`, when inside the image.
    let at = |d: usize, o: usize, t: usize, size: usize| -> Option<usize> {
        (o * g.stride[d] + t * g.dil[d]).checked_sub(g.pad[d]).filter(|&i| i < size)
    };
    let mut v = 0;
    for c in 0..cin {
        let channel = &image[c * plane..][..plane];
        for t2 in 0..kd {
            let i2 = at(0, o2, t2, id);
            for t1 in 0..kh {
                let i1 = at(1, o1, t1, ih);
                for t0 in 0..kw {
                    row[v] = match (i2, i1, at(2, o0, t0, iw)) {
                        (Some(i2), Some(i1), Some(i0)) => channel[(i2 * ih + i1) * iw + i0],
                        _ => 0.0,
                    };
                    v += 1;
                }
            }
        }
    }
}

/// `prod [rows, Cout]` (pixels `p0..`) into the channels-first `result
/// [Cout, pixels]`.
fn scatter_channels_first(prod: &[f32], cout: usize, pixels: usize, p0: usize, result: &mut [f32]) {
    let rows = prod.len() / cout;
    for (r, values) in prod.chunks_exact(cout).enumerate() {
        for (c, &v) in values.iter().enumerate() {
            result[c * pixels + p0 + r] = v;
        }
    }
    debug_assert!(p0 + rows <= pixels);
}
