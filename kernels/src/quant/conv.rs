//! Quantized convolution: int8 weights (one scale per output channel,
//! symmetric) times int8 activations, through [`super::qlinear`]'s integer
//! GEMM.
//!
//! A dense (`groups == 1`) convolution of `x [N, C, spatial..]` by `w
//! [Cout, C, taps..]` is, for every output pixel `p`, `out[:, p] = W ·
//! col(p)` with `col(p)` the `C · taps` input values its window reads,
//! ordered as the weight's `[C, taps..]` — so the weight is the `[Cout, C ·
//! taps]` matrix [`super::PackedQWeights`] stores and every output pixel is
//! one row of a quantized linear layer. Each image is quantized once, with
//! one scale and zero point: the static ones, or (dynamic) its own, by the
//! rule a dynamic linear layer applies to a row (symmetric, or asymmetric
//! from its range) over all of the image's values. A window hanging over
//! the padding reads the zero point there (the real value 0), so the integer
//! sums match torch's zero padding exactly.
//!
//! The quantized windows are gathered a chunk of pixels at a time straight
//! into the rows the table's int8 microkernel reads (bounded scratch, no
//! allocation once grown), multiplied on the context's threads, and the
//! `[pixels, Cout]` result is written back channels-first:
//! `(f32(Σ (q − zp) · w) · s) · scale + bias`. The integer sums are exact
//! and each output is computed by one microkernel call, so results are the
//! same whatever the thread count and ISA variant.

use super::int8::{Acts, QuantRows, Residual, TileOut, Windows};
use super::{err, ActQuant, PackedQWeights, QuantKernels};
use crate::context::Context;
use crate::generic::conv::{geometry, ConvParams, Geometry, TensorEpilogue};
use crate::generic::gemm::ActivationFn;
use crate::parallel::Threads;
use crate::types::{DType, Result, TensorMut, TensorRef};
use std::ops::Range;

/// Bytes of gathered rows (and their products) per chunk: bounds the
/// scratch a layer takes whatever its size.
const CHUNK_BYTES: usize = 2 << 20;

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
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    channels_last: bool,
    out: TensorMut<'_>,
) -> Result<()> {
    let kernels = cx.table.quant;
    qconv_with(cx, &kernels, x, w, w_shape, act, bias, epilogue, p, channels_last, out)
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
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    channels_last: bool,
    out: TensorMut<'_>,
) -> Result<()> {
    qconv_impl(cx, kernels, x, w, w_shape, act, bias, epilogue, p, channels_last, out, None, None)
}

/// [`qconv`] between int8 layers: an i8 `x` is the input already
/// quantized with the static parameters `act` names (read as it is, not
/// re-encoded), and with `out_quant` (`(scale, zero_point)`; channels-last)
/// `out` is i8: each value the f32 convolution would write (after its
/// bias, activation and residual), quantized as [`ActQuant::Static`]
/// quantizes an input — the integers the next layer would have made of it.
/// With `residual_quant` (channels-last) the epilogue's residual is i8,
/// each value dequantized as torch's `dequantize_per_tensor` does, `(f32(q)
/// − zp) · scale`, before the add: with an i8 output, torch's int8 add
/// with requantization (the convolution's own result not rounded first).
#[allow(clippy::too_many_arguments)]
pub fn qconv_int8(
    cx: &mut Context,
    x: TensorRef<'_>,
    w: &PackedQWeights,
    w_shape: &[usize],
    act: ActQuant,
    bias: Option<&[f32]>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    channels_last: bool,
    out: TensorMut<'_>,
    out_quant: Option<(f32, i32)>,
    residual_quant: Option<(f32, i32)>,
) -> Result<()> {
    let kernels = cx.table.quant;
    qconv_impl(cx, &kernels, x, w, w_shape, act, bias, epilogue, p, channels_last, out, out_quant, residual_quant)
}

/// [`qconv_int8`] with the given variant of the integer kernels.
#[allow(clippy::too_many_arguments)]
pub fn qconv_int8_with(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: TensorRef<'_>,
    w: &PackedQWeights,
    w_shape: &[usize],
    act: ActQuant,
    bias: Option<&[f32]>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    channels_last: bool,
    out: TensorMut<'_>,
    out_quant: Option<(f32, i32)>,
    residual_quant: Option<(f32, i32)>,
) -> Result<()> {
    qconv_impl(cx, kernels, x, w, w_shape, act, bias, epilogue, p, channels_last, out, out_quant, residual_quant)
}

/// Where a layer's input comes from: f32 values, or int8 ones already
/// quantized with the static parameters.
#[derive(Copy, Clone)]
enum Image<'a> {
    F32(&'a [f32]),
    I8(&'a [i8]),
}

impl<'a> Image<'a> {
    fn range(&self, r: Range<usize>) -> Image<'a> {
        match *self {
            Image::F32(v) => Image::F32(&v[r]),
            Image::I8(v) => Image::I8(&v[r]),
        }
    }
}

/// Where the tile store writes: f32 values, or each quantized with the
/// next layer's scale and zero point.
enum Output<'a> {
    F32(&'a mut [f32]),
    I8 { values: &'a mut [i8], scale: f32, zero_point: i32 },
}

#[allow(clippy::too_many_arguments)]
fn qconv_impl(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: TensorRef<'_>,
    w: &PackedQWeights,
    w_shape: &[usize],
    act: ActQuant,
    bias: Option<&[f32]>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    channels_last: bool,
    out: TensorMut<'_>,
    out_quant: Option<(f32, i32)>,
    residual_quant: Option<(f32, i32)>,
) -> Result<()> {
    if act == ActQuant::Float {
        return Err(err("a weight-only convolution runs the f32 kernels on its dequantized weight"));
    }
    if p.groups != 1 {
        return Err(err(format!("quantized convolutions with int8 activations are dense, got {} groups", p.groups)));
    }
    let static_act = matches!(act, ActQuant::Static { .. });
    match (x.dtype, out.dtype, out_quant) {
        (DType::F32, DType::F32, None) => {}
        (DType::F32 | DType::I8, DType::F32 | DType::I8, _)
            if (x.dtype == DType::F32 || static_act) && ((out.dtype == DType::I8) == out_quant.is_some()) => {}
        _ => {
            return Err(err(format!(
                "a quantized convolution takes f32 (i8 with static activations) and gives f32 (i8 with output \
                 parameters), got {} -> {}",
                x.dtype, out.dtype
            )))
        }
    }
    if let Some((s, zp)) = out_quant {
        if !(s.is_finite() && s > 0.0 && (-128..=127).contains(&zp)) {
            return Err(err(format!("output scale {s} / zero point {zp}")));
        }
        if !channels_last {
            return Err(err("an i8 output needs a channels-last convolution"));
        }
    }
    let out_shape = out.shape;
    // Channels-last tensors are `[N, H, W, C]`: their geometry is that of
    // the channels-first views.
    let nchw = |s: &[usize]| -> Vec<usize> {
        match s {
            [n, h, w, c] if channels_last => vec![*n, *c, *h, *w],
            _ => s.to_vec(),
        }
    };
    if channels_last && (x.shape.len() != 4 || out_shape.len() != 4) {
        return Err(err("a channels-last quantized convolution is 2-d: [N, H, W, C]"));
    }
    let (x_shape, o_shape) = (nchw(x.shape), nchw(out_shape));
    let g = geometry(&x_shape, w_shape, p, &o_shape)?;
    let (batch, cin, cout) = (x_shape[0], x_shape[1], w_shape[0]);
    let taps: usize = g.kernel.iter().product();
    let k = cin.checked_mul(taps).ok_or_else(|| err("weight too large"))?;
    if w_shape[1] != cin || w.n() != cout || w.k() != k || o_shape[1] != cout || o_shape[0] != batch {
        return Err(err(format!(
            "weight {w_shape:?} ({}x{} packed) does not fit input {:?} and output {:?}",
            w.n(),
            w.k(),
            x.shape,
            out_shape
        )));
    }
    let pixels: usize = g.output.iter().product();
    let plane: usize = g.input.iter().product();
    let xs = match x.dtype {
        DType::I8 => Image::I8(bytemuck::cast_slice(x.data)),
        _ => Image::F32(bytemuck::try_cast_slice(x.data).map_err(|_| err("unaligned input"))?),
    };
    let x_len = match xs {
        Image::F32(v) => v.len(),
        Image::I8(v) => v.len(),
    };
    let out_len = out.data.len() / out.dtype.size_bytes();
    if x_len != batch * cin * plane
        || out_len != batch * cout * pixels
        || !out.data.len().is_multiple_of(out.dtype.size_bytes())
    {
        return Err(err("input or output length does not match its shape"));
    }
    let mut ys = match out_quant {
        Some((scale, zero_point)) => Output::I8 { values: bytemuck::cast_slice_mut(out.data), scale, zero_point },
        None => Output::F32(bytemuck::try_cast_slice_mut(out.data).map_err(|_| err("unaligned output"))?),
    };
    if pixels == 0 || batch == 0 {
        return Ok(());
    }
    if let ActQuant::Static { scale, zero_point } = act {
        if !(scale.is_finite() && scale > 0.0 && (-128..=127).contains(&zero_point)) {
            return Err(err(format!("static activation scale {scale} / zero point {zero_point}")));
        }
    }
    let residual = match (epilogue.residual, residual_quant) {
        (Some(r), _) if r.shape != out_shape || r.data.len() != out_len * r.dtype.size_bytes() => {
            return Err(err(format!("residual {:?} does not match the output {out_shape:?}", r.shape)))
        }
        (Some(r), None) if r.dtype == DType::F32 => {
            Some(Residual::F32(bytemuck::try_cast_slice(r.data).map_err(|_| err("unaligned residual"))?))
        }
        (Some(r), Some((s, zp))) if r.dtype == DType::I8 && channels_last => {
            if !(s.is_finite() && s > 0.0 && (-128..=127).contains(&zp)) {
                return Err(err(format!("residual scale {s} / zero point {zp}")));
            }
            Some(Residual::I8(bytemuck::cast_slice(r.data), s, zp))
        }
        (None, None) => None,
        (r, q) => {
            return Err(err(format!(
                "a residual is f32, or i8 with its parameters (channels-last), got {:?} with parameters {q:?}",
                r.map(|r| r.dtype)
            )))
        }
    };
    let activation = epilogue.activation.map(|a| ActivationFn::new(cx.table, a));
    // A clamp (ReLU, ReLU6) not preceded by the residual add runs in the
    // tile store; the rest of the epilogue after the product.
    let fused_clamp = match &activation {
        Some(a) if residual.is_none() || !epilogue.residual_first => a.clamp_bounds(),
        _ => None,
    };
    let finish = Finish {
        activation: activation.as_ref().filter(|_| fused_clamp.is_none()),
        residual_first: epilogue.residual_first,
    };
    if k > super::int8::MAX_K {
        return Err(err(format!("k = {k} is too deep for exact i32 sums")));
    }
    let ukr = kernels.int8;
    let threads = super::int8::threads_for(cx, pixels, cout, k);
    let lda = w.layout.kp * ukr.acts.width();
    let chunk = (CHUNK_BYTES / (lda + 4 * cout)).clamp(ukr.mr, pixels.next_multiple_of(ukr.mr));
    let chunk = chunk - chunk % ukr.mr;
    // One f32 buffer: the quantized image, the rows, their scales and
    // shifts, the products (each part a whole number of f32s).
    let padded = Padded::of(&g, cin, &ukr, channels_last);
    // A channels-last 1×1 convolution with stride 1 and no padding whose
    // rows need no lane padding reads the quantized image's pixels as its
    // rows (the bytes the gather would copy); `mr` rows of slack after the
    // image let the last row block read past it (those rows are not stored).
    let direct = channels_last && g.kernel == [1, 1, 1] && g.stride == [1, 1, 1] && g.pad == [0, 0, 0] && {
        cin * ukr.acts.width() == lda
    };
    // Other channels-last layers whose pixels are whole lane steps (`C` a
    // multiple of 4 bytes), on an entry with a window kernel, read each
    // output pixel's window from the padded image in place: a window is
    // its taps' runs of `C` values, at offsets the same for every pixel.
    let mut offs = [0usize; MAX_WINDOW_TAPS];
    let windowed = channels_last
        && !direct
        && ukr.window.is_some()
        && taps <= MAX_WINDOW_TAPS
        && (cin * ukr.acts.width()).is_multiple_of(LANE_BYTES)
        && k * ukr.acts.width() == lda;
    if windowed {
        window_offsets(&g, &padded, &mut offs[..taps]);
    }
    let slack = if direct { ukr.mr * lda } else { 0 };
    let padded_len = (padded.len_bytes() + slack).div_ceil(4);
    let rows_len = chunk * lda / 4;
    let buf = cx.scratch.f32s(padded_len + rows_len + 2 * chunk + chunk * cout);
    let (padded_bytes, rest) = buf.split_at_mut(padded_len);
    let padded_bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(padded_bytes)[..padded.len_bytes() + slack];
    let (rows, rest) = rest.split_at_mut(rows_len);
    let (scales, rest) = rest.split_at_mut(chunk);
    let (shifts, prod) = rest.split_at_mut(chunk);
    let rows: &mut [u8] = bytemuck::cast_slice_mut(rows);
    let shifts: &mut [i32] = bytemuck::cast_slice_mut(shifts);
    let offset = if ukr.acts == Acts::U8Offset { 128 } else { 0 };
    for b in 0..batch {
        let image = xs.range(b * cin * plane..(b + 1) * cin * plane);
        let residual = residual.map(|r| r.range(b * cout * pixels..(b + 1) * cout * pixels));
        let (s, zp) = image_qparams(threads, act, image);
        padded.fill(threads, image, s, zp, &mut padded_bytes[..padded.len_bytes()]);
        scales.fill(s);
        shifts.fill(zp + offset);
        for p0 in (0..pixels).step_by(chunk) {
            let m = chunk.min(pixels - p0);
            let mpad = m.next_multiple_of(ukr.mr);
            let (bytes, window) = if direct {
                (&padded_bytes[p0 * lda..(p0 + mpad) * lda], None)
            } else if windowed {
                let run = cin * ukr.acts.width();
                let window = Windows {
                    image: &padded_bytes[..padded.len_bytes()],
                    offs: &offs[..taps],
                    c4: run / LANE_BYTES,
                    first: p0,
                    ow: g.output[2],
                    row_step: g.stride[1] * padded.dims[2] * run,
                    col_step: g.stride[2] * run,
                };
                (&[][..], Some(window))
            } else {
                gather_rows(threads, &g, &padded, padded_bytes, p0, m, lda, &mut rows[..mpad * lda]);
                (&rows[..mpad * lda], None)
            };
            let r = QuantRows { bytes, lda, window, scales: &scales[..m], shifts: &shifts[..m] };
            let result = match &mut ys {
                Output::F32(ys) => &mut ys[b * cout * pixels..][..cout * pixels],
                Output::I8 { values, scale, zero_point } => {
                    // The f32 values the layer would write, then quantized
                    // as the next layer would quantize them (checked above:
                    // channels-last).
                    let dst = &mut values[(b * pixels + p0) * cout..][..m * cout];
                    if finish.activation.is_none() && residual.is_none() {
                        // Quantized in the tile store, from registers.
                        let out = TileOut::I8(dst, *scale, *zero_point);
                        super::int8::multiply(ukr, threads, &r, m, w, bias, fused_clamp, out);
                        continue;
                    }
                    // A residual add, then a clamp or nothing (ResNet's
                    // `relu(conv + x)`), or a clamp then the add: in the store too.
                    let after = match finish.activation {
                        None => Some((f32::NEG_INFINITY, f32::INFINITY)),
                        Some(a) if finish.residual_first => a.clamp_bounds(),
                        Some(_) => None,
                    };
                    if let (Some(after), Some(res)) = (after, residual) {
                        let residual = res.range(p0 * cout..(p0 + m) * cout);
                        let out =
                            TileOut::I8Residual { out: dst, scale: *scale, zero_point: *zero_point, residual, after };
                        super::int8::multiply(ukr, threads, &r, m, w, bias, fused_clamp, out);
                        continue;
                    }
                    let block = &mut prod[..m * cout];
                    super::int8::multiply(ukr, threads, &r, m, w, bias, fused_clamp, TileOut::F32(block));
                    finish.apply_block(block, residual.map(|r| r.range(p0 * cout..(p0 + m) * cout)));
                    quantize_block(threads, ukr.driver.encode, block, *scale, *zero_point, dst);
                    continue;
                }
            };
            if channels_last {
                // The product's rows are the result's pixels.
                let block = &mut result[p0 * cout..(p0 + m) * cout];
                super::int8::multiply(ukr, threads, &r, m, w, bias, fused_clamp, TileOut::F32(block));
                finish.apply_block(block, residual.map(|r| r.range(p0 * cout..(p0 + m) * cout)));
            } else {
                super::int8::multiply(ukr, threads, &r, m, w, bias, fused_clamp, TileOut::F32(&mut prod[..m * cout]));
                scatter_channels_first(&prod[..m * cout], cout, pixels, p0, result);
                // Checked above: an i8 residual is channels-last.
                let residual = match residual {
                    Some(Residual::F32(r)) => Some(r),
                    _ => None,
                };
                finish.apply(result, residual, cout, pixels, p0..p0 + m);
            }
        }
    }
    Ok(())
}

/// The scale and zero point an image's values are quantized with: the
/// static ones, or the image's own (dynamic: per image, over all its
/// channels — the rules [`super::row_scale_symmetric`] and
/// [`super::row_qparams_asymmetric`] apply to a row). An i8 image has
/// static ones (checked by the caller).
fn image_qparams(threads: Threads, act: ActQuant, image: Image<'_>) -> (f32, i32) {
    match (act, image) {
        (ActQuant::Static { scale, zero_point }, _) => (scale, zero_point),
        (ActQuant::DynamicAsymmetric, Image::F32(image)) => super::qparams_asymmetric(image_range(threads, image)),
        (_, Image::F32(image)) => (super::scale_symmetric(image_range(threads, image)), 0),
        (_, Image::I8(_)) => unreachable!("i8 images have static parameters"),
    }
}

/// `dst` = `src` quantized with `(s, zp)` by the driver's encoder (the
/// integers an input's encoding gives: [`super::quantize_value`]), in
/// fixed pieces over the threads (elementwise, so any split gives the same
/// bytes).
fn quantize_block(threads: Threads, encode: super::int8::EncodeFn, src: &[f32], s: f32, zp: i32, dst: &mut [i8]) {
    const PIECE: usize = 16 * 1024;
    let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
    threads.for_each_chunk(dst, PIECE, |i, part| {
        encode(Acts::I8, &src[i * PIECE..][..part.len()], s, zp, part);
    });
}

/// `dst` = the int8 values `src` in the microkernel's storage `acts`.
fn encode_i8(acts: Acts, src: &[i8], dst: &mut [u8]) {
    match acts {
        Acts::I8 => dst.copy_from_slice(bytemuck::cast_slice(src)),
        Acts::U8Offset => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v as u8 ^ 0x80),
        Acts::I16 => dst.chunks_exact_mut(2).zip(src).for_each(|(d, &v)| d.copy_from_slice(&(v as i16).to_le_bytes())),
    }
}

/// [`super::range_with_zero`] of the image, in pieces over the threads (min
/// and max are exact, so the pieces' results combine to the same values).
fn image_range(threads: Threads, image: &[f32]) -> (f32, f32) {
    const MAX_PIECES: usize = 64;
    let piece = image.len().div_ceil(MAX_PIECES).max(16 * 1024);
    let mut ranges = [(0f32, 0f32); MAX_PIECES];
    let used = image.len().div_ceil(piece);
    threads.for_each_chunk(&mut ranges[..used], 1, |i, r| {
        r[0] = super::range_with_zero(&image[i * piece..((i + 1) * piece).min(image.len())]);
    });
    ranges[..used].iter().fold((0f32, 0f32), |(mn, mx), &(l, h)| (mn.min(l), mx.max(h)))
}

/// A quantized image zero-padded (with its zero point) and stored as the
/// microkernel reads activations, so that a window's run of taps along the
/// last spatial dim is one copy.
struct Padded {
    /// Channels, then the padded spatial dims (3-d, leading ones 1).
    cin: usize,
    dims: [usize; 3],
    /// The border on each side of each spatial dim.
    pad: [usize; 3],
    acts: Acts,
    /// The entry's encoder of quantized values into `acts`.
    encode: super::int8::EncodeFn,
    /// Pixels of `C` values (`[spatial.., C]`) instead of channel planes.
    channels_last: bool,
}

impl Padded {
    fn of(g: &Geometry, cin: usize, ukr: &super::int8::QGemmUkr, channels_last: bool) -> Padded {
        let dims = [0, 1, 2].map(|d| g.input[d] + 2 * g.pad[d]);
        Padded { cin, dims, pad: g.pad, acts: ukr.acts, encode: ukr.driver.encode, channels_last }
    }

    fn len_bytes(&self) -> usize {
        self.cin * self.dims.iter().product::<usize>() * self.acts.width()
    }

    /// Every value of `bytes` the zero point (the real value 0), in the
    /// microkernel's storage.
    fn fill_zero_point(&self, bytes: &mut [u8], zp: i32) {
        let q = zp as i8;
        match self.acts {
            Acts::I8 => bytes.fill(q as u8),
            Acts::U8Offset => bytes.fill(q as u8 ^ 0x80),
            Acts::I16 => bytes.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&(q as i16).to_le_bytes())),
        }
    }

    /// `out` = the image `x` (`[C, spatial..]`, unpadded, as `g.input`)
    /// quantized (`clamp(rint(x · f32(1/s)) + zp, -128, 127)`) inside a
    /// border of `zp`, a channel per work item.
    fn fill(&self, threads: Threads, x: Image<'_>, s: f32, zp: i32, out: &mut [u8]) {
        if self.channels_last {
            return self.fill_channels_last(threads, x, s, zp, out);
        }
        let width = self.acts.width();
        let [_, ph, pw] = self.dims;
        let [id, ih, iw] = [0, 1, 2].map(|d| self.dims[d] - 2 * self.pad[d]);
        let plane_bytes = self.dims.iter().product::<usize>() * width;
        threads.for_each_chunk(out, plane_bytes, |c, plane| {
            self.fill_zero_point(plane, zp);
            for i2 in 0..id {
                for i1 in 0..ih {
                    let src = x.range(((c * id + i2) * ih + i1) * iw..((c * id + i2) * ih + i1 + 1) * iw);
                    let at = ((i2 + self.pad[0]) * ph + i1 + self.pad[1]) * pw + self.pad[2];
                    self.encode(src, s, zp, &mut plane[at * width..][..iw * width]);
                }
            }
        });
    }

    /// [`Padded::fill`] of a channels-last image (2-d), a padded row of
    /// pixels per work item.
    /// `dst` = `src` in the microkernel's storage: f32 values quantized
    /// with `(s, zp)`, i8 ones (already quantized) as they are.
    fn encode(&self, src: Image<'_>, s: f32, zp: i32, dst: &mut [u8]) {
        match src {
            Image::F32(src) => (self.encode)(self.acts, src, s, zp, dst),
            Image::I8(src) => encode_i8(self.acts, src, dst),
        }
    }

    fn fill_channels_last(&self, threads: Threads, x: Image<'_>, s: f32, zp: i32, out: &mut [u8]) {
        let width = self.acts.width();
        let [_, _, pw] = self.dims;
        let (ih, iw) = (self.dims[1] - 2 * self.pad[1], pw - 2 * self.pad[2]);
        let c = self.cin;
        threads.for_each_chunk(out, pw * c * width, |row, bytes| {
            self.fill_zero_point(bytes, zp);
            let Some(i1) = row.checked_sub(self.pad[1]).filter(|&i| i < ih) else { return };
            let src = x.range(i1 * iw * c..(i1 + 1) * iw * c);
            let dst = &mut bytes[self.pad[2] * c * width..][..iw * c * width];
            self.encode(src, s, zp, dst);
        });
    }
}

/// Most taps a window read in place may have (the offsets live on the
/// stack); larger kernels gather.
const MAX_WINDOW_TAPS: usize = 64;

/// Bytes of one lane step of a row (4 int8 values).
const LANE_BYTES: usize = 4;

/// The byte offset of each tap of a channels-last (2-d) window from the
/// window's first pixel in the padded image, in the weight's tap order
/// (kernel rows, then columns: [`gather_row_channels_last`]'s).
fn window_offsets(g: &Geometry, padded: &Padded, offs: &mut [usize]) {
    let [_, _, kw] = g.kernel;
    let pw = padded.dims[2];
    let run = padded.cin * padded.acts.width();
    for (t, o) in offs.iter_mut().enumerate() {
        let (t1, t0) = (t / kw, t % kw);
        *o = (t1 * g.dil[1] * pw + t0 * g.dil[2]) * run;
    }
}

/// Rows `p0..p0 + m` of the quantized im2col matrix of one image (from
/// its [`Padded`] copy), each output pixel's window in the weight's `[C,
/// taps..]` order (lanes past K zero, rows past `m` up to the buffer's end
/// zero), over the threads.
#[allow(clippy::too_many_arguments)]
fn gather_rows(
    threads: Threads,
    g: &Geometry,
    padded: &Padded,
    image: &[u8],
    p0: usize,
    m: usize,
    lda: usize,
    rows: &mut [u8],
) {
    // A fixed number of rows per item: the split never depends on the
    // thread count (it only moves data, so any split gives the same bytes).
    const ROWS_PER_ITEM: usize = 32;
    let one_tap = g.kernel == [1, 1, 1] && !padded.channels_last;
    let gather: fn(&Geometry, &Padded, &[u8], usize, &mut [u8]) =
        if padded.channels_last { gather_row_channels_last } else { gather_row };
    threads.for_each_chunk(rows, ROWS_PER_ITEM * lda, |item, part| {
        if one_tap {
            let first = item * ROWS_PER_ITEM;
            let pixels = (first..(first + ROWS_PER_ITEM).min(m)).map(|r| p0 + r);
            match padded.acts.width() {
                1 => gather_one_tap::<1>(g, padded, image, pixels, lda, part),
                _ => gather_one_tap::<2>(g, padded, image, pixels, lda, part),
            }
            return;
        }
        for (r, row) in part.chunks_exact_mut(lda).enumerate() {
            let pixel = item * ROWS_PER_ITEM + r;
            if pixel < m {
                gather(g, padded, image, p0 + pixel, row);
            } else {
                row.fill(0);
            }
        }
    });
}

/// The rows of `pixels` for a 1×1 kernel (one value per channel): a
/// transpose of the image's columns, channel by channel over the block
/// (`W` bytes a value), rows and lanes past them zero.
fn gather_one_tap<const W: usize>(
    g: &Geometry,
    padded: &Padded,
    image: &[u8],
    pixels: impl Iterator<Item = usize>,
    lda: usize,
    part: &mut [u8],
) {
    let [_, oh, ow] = g.output;
    let [_, ph, pw] = padded.dims;
    let plane: usize = padded.dims.iter().product();
    let mut at = [0usize; 64];
    let mut n = 0;
    for pixel in pixels.take(at.len()) {
        let o = [pixel / (oh * ow), (pixel / ow) % oh, pixel % ow];
        at[n] = ((o[0] * g.stride[0]) * ph + o[1] * g.stride[1]) * pw + o[2] * g.stride[2];
        n += 1;
    }
    part.fill(0);
    for c in 0..padded.cin {
        let channel = &image[c * plane * W..][..plane * W];
        for (r, &a) in at[..n].iter().enumerate() {
            let v: [u8; W] = channel[a * W..a * W + W].try_into().unwrap_or([0; W]);
            part[r * lda + c * W..][..W].copy_from_slice(&v);
        }
    }
}

/// One output pixel's window of a channels-last image into `row`: value
/// `t · C + c` is input channel `c` at tap `t` (the weight is stored tap
/// by tap for it). Without dilation a kernel row's taps are adjacent
/// pixels, so its `kw · C` values are one copy (an RGB stem's 7×7 window
/// is 7 copies of 21 bytes, not 49 of 3).
fn gather_row_channels_last(g: &Geometry, padded: &Padded, image: &[u8], pixel: usize, row: &mut [u8]) {
    let [_, _, ow] = g.output;
    let [_, kh, kw] = g.kernel;
    let [_, _, pw] = padded.dims;
    let run = padded.cin * padded.acts.width();
    let (oy, ox) = (pixel / ow, pixel % ow);
    let (taps_per_copy, copies) = if g.dil[2] == 1 { (kw, 1) } else { (1, kw) };
    let len = taps_per_copy * run;
    let mut v = 0;
    for t1 in 0..kh {
        let y = oy * g.stride[1] + t1 * g.dil[1];
        for t0 in 0..copies {
            let at = (y * pw + ox * g.stride[2] + t0 * g.dil[2]) * run;
            copy_short(&image[at..], &mut row[v..], len);
            v += len;
        }
    }
    row[v..].fill(0);
}

/// `dst[..len] = src[..len]`; a run of at most 32 bytes with room after
/// it in both slices is one fixed 32-byte copy (no call into memmove): the
/// bytes past `len` are overwritten by the next run or the row's tail.
#[inline(always)]
fn copy_short(src: &[u8], dst: &mut [u8], len: usize) {
    if len <= 32 && src.len() >= 32 && dst.len() >= 32 {
        let bytes: [u8; 32] = src[..32].try_into().unwrap_or([0; 32]);
        dst[..32].copy_from_slice(&bytes);
    } else {
        dst[..len].copy_from_slice(&src[..len]);
    }
}

/// One output pixel's window into `row`: value `c · taps + t` is input
/// channel `c` at tap `t`; a run of taps along the last spatial dim is
/// one copy when they are adjacent (dilation 1).
fn gather_row(g: &Geometry, padded: &Padded, image: &[u8], pixel: usize, row: &mut [u8]) {
    let [_, oh, ow] = g.output;
    let [kd, kh, kw] = g.kernel;
    let [pd, ph, pw] = padded.dims;
    let width = padded.acts.width();
    let o = [pixel / (oh * ow), (pixel / ow) % oh, pixel % ow];
    let origin = [0, 1, 2].map(|d| o[d] * g.stride[d]);
    let run = kw * width;
    let mut v = 0;
    for c in 0..padded.cin {
        for t2 in 0..kd {
            let i2 = c * pd + origin[0] + t2 * g.dil[0];
            for t1 in 0..kh {
                let start = (i2 * ph + origin[1] + t1 * g.dil[1]) * pw + origin[2];
                let src = start * width;
                if g.dil[2] == 1 && run <= 16 && v + 16 <= row.len() && src + 16 <= image.len() {
                    // A short run as one 16-byte copy (no call): the bytes
                    // past it are overwritten by the next run or the tail.
                    let bytes: [u8; 16] = image[src..src + 16].try_into().unwrap_or([0; 16]);
                    row[v..v + 16].copy_from_slice(&bytes);
                } else if g.dil[2] == 1 {
                    row[v..v + run].copy_from_slice(&image[src..][..run]);
                } else {
                    for t0 in 0..kw {
                        let at = (start + t0 * g.dil[2]) * width;
                        row[v + t0 * width..][..width].copy_from_slice(&image[at..at + width]);
                    }
                }
                v += run;
            }
        }
    }
    // Lanes past K meet zero weights: any value adds nothing.
    row[v..].fill(0);
}

/// The epilogue after the product (its bias is already in): a residual
/// add and an activation, in the order the flag says, over the channels'
/// runs of the pixels just written.
struct Finish<'f> {
    activation: Option<&'f ActivationFn>,
    residual_first: bool,
}

impl Finish<'_> {
    /// The epilogue over a contiguous block (channels-last pixels) and the
    /// residual's same block (an i8 one dequantized as torch does).
    fn apply_block(&self, out: &mut [f32], residual: Option<Residual<'_>>) {
        let add = |out: &mut [f32]| match residual {
            Some(Residual::F32(r)) => out.iter_mut().zip(r).for_each(|(o, &r)| *o += r),
            Some(Residual::I8(r, s, zp)) => {
                let zp = zp as f32;
                out.iter_mut().zip(r).for_each(|(o, &q)| *o += (q as f32 - zp) * s);
            }
            None => {}
        };
        if self.residual_first {
            add(out);
        }
        if let Some(a) = self.activation {
            a.apply(out);
        }
        if !self.residual_first {
            add(out);
        }
    }

    /// The epilogue over each channel's run `run` of a channels-first
    /// result (and the residual's same runs).
    fn apply(&self, result: &mut [f32], residual: Option<&[f32]>, cout: usize, pixels: usize, run: Range<usize>) {
        if self.activation.is_none() && residual.is_none() {
            return;
        }
        for c in 0..cout {
            let at = c * pixels + run.start..c * pixels + run.end;
            self.apply_block(&mut result[at.clone()], residual.map(|r| Residual::F32(&r[at])));
        }
    }
}

/// `prod [rows, Cout]` (pixels `p0..`) into the channels-first `result
/// [Cout, pixels]`, a block of rows at a time: each channel's run of the
/// block is written contiguously from a block that stays in cache.
fn scatter_channels_first(prod: &[f32], cout: usize, pixels: usize, p0: usize, result: &mut [f32]) {
    const BLOCK: usize = 64;
    let rows = prod.len() / cout;
    debug_assert!(p0 + rows <= pixels);
    for r0 in (0..rows).step_by(BLOCK) {
        let r1 = (r0 + BLOCK).min(rows);
        let block = &prod[r0 * cout..r1 * cout];
        for c in 0..cout {
            let dst = &mut result[c * pixels + p0 + r0..][..r1 - r0];
            for (d, values) in dst.iter_mut().zip(block.chunks_exact(cout)) {
                *d = values[c];
            }
        }
    }
}
