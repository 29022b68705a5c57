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

use super::int8::{Acts, QuantRows};
use super::{err, ActQuant, PackedQWeights, QuantKernels};
use crate::context::Context;
use crate::generic::conv::{geometry, ConvParams, Geometry};
use crate::parallel::Threads;
use crate::types::{DType, Result, TensorMut, TensorRef};

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
    if let ActQuant::Static { scale, zero_point } = act {
        if !(scale.is_finite() && scale > 0.0 && (-128..=127).contains(&zero_point)) {
            return Err(err(format!("static activation scale {scale} / zero point {zero_point}")));
        }
    }
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
    let image_len = (cin * plane).div_ceil(4);
    let padded = Padded::of(&g, cin, ukr.acts);
    let padded_len = padded.len_bytes().div_ceil(4);
    let rows_len = chunk * lda / 4;
    let buf = cx.scratch.f32s(image_len + padded_len + rows_len + 2 * chunk + chunk * cout);
    let (image_q, rest) = buf.split_at_mut(image_len);
    let (padded_bytes, rest) = rest.split_at_mut(padded_len);
    let padded_bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(padded_bytes)[..padded.len_bytes()];
    let (rows, rest) = rest.split_at_mut(rows_len);
    let (scales, rest) = rest.split_at_mut(chunk);
    let (shifts, prod) = rest.split_at_mut(chunk);
    let image_q: &mut [i8] = &mut bytemuck::cast_slice_mut(image_q)[..cin * plane];
    let rows: &mut [u8] = bytemuck::cast_slice_mut(rows);
    let shifts: &mut [i32] = bytemuck::cast_slice_mut(shifts);
    let offset = if ukr.acts == Acts::U8Offset { 128 } else { 0 };
    for b in 0..batch {
        let image = &xs[b * cin * plane..][..cin * plane];
        let result = &mut ys[b * cout * pixels..][..cout * pixels];
        let (s, zp) = image_qparams(act, image);
        quantize_image(threads, image, s, zp, image_q);
        padded.fill(image_q, zp, padded_bytes);
        scales.fill(s);
        shifts.fill(zp + offset);
        for p0 in (0..pixels).step_by(chunk) {
            let m = chunk.min(pixels - p0);
            let mpad = m.next_multiple_of(ukr.mr);
            gather_rows(threads, &g, &padded, padded_bytes, p0, m, lda, &mut rows[..mpad * lda]);
            let r = QuantRows { bytes: &rows[..mpad * lda], lda, scales: &scales[..m], shifts: &shifts[..m] };
            super::int8::multiply(ukr, threads, &r, m, w, bias, &mut prod[..m * cout]);
            scatter_channels_first(&prod[..m * cout], cout, pixels, p0, result);
        }
    }
    Ok(())
}

/// The scale and zero point an image's values are quantized with: the
/// static ones, or the image's own (dynamic: per image, over all its
/// channels — the rules [`super::row_scale_symmetric`] and
/// [`super::row_qparams_asymmetric`] apply to a row).
fn image_qparams(act: ActQuant, image: &[f32]) -> (f32, i32) {
    match act {
        ActQuant::Static { scale, zero_point } => (scale, zero_point),
        ActQuant::DynamicAsymmetric => super::row_qparams_asymmetric(image),
        _ => (super::row_scale_symmetric(image), 0),
    }
}

/// `q = clamp(rint(x · f32(1/s)) + zp, -128, 127)` over the image, in
/// fixed-size pieces over the threads.
fn quantize_image(threads: Threads, image: &[f32], s: f32, zp: i32, q: &mut [i8]) {
    const PIECE: usize = 16 * 1024;
    threads.for_each_chunk(q, PIECE, |i, part| {
        super::quantize_row_static(&image[i * PIECE..][..part.len()], s, zp, part);
    });
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
}

impl Padded {
    fn of(g: &Geometry, cin: usize, acts: Acts) -> Padded {
        let dims = [0, 1, 2].map(|d| g.input[d] + 2 * g.pad[d]);
        Padded { cin, dims, pad: g.pad, acts }
    }

    fn len_bytes(&self) -> usize {
        self.cin * self.dims.iter().product::<usize>() * self.acts.width()
    }

    /// One value in the microkernel's storage.
    fn encode(&self, q: i8) -> [u8; 2] {
        match self.acts {
            Acts::I8 => [q as u8, 0],
            Acts::U8Offset => [q as u8 ^ 0x80, 0],
            Acts::I16 => (q as i16).to_le_bytes(),
        }
    }

    /// `out` = the image `q` (`[C, spatial..]`, unpadded, as `g.input`)
    /// inside a border of `zp`.
    fn fill(&self, q: &[i8], zp: i32, out: &mut [u8]) {
        let width = self.acts.width();
        let pad = self.encode(zp as i8);
        match self.acts {
            Acts::I16 => out.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&pad)),
            _ => out.fill(pad[0]),
        }
        let [pd, ph, pw] = self.dims;
        let inner = [0, 1, 2].map(|d| self.dims[d] - 2 * self.border(d));
        let [id, ih, iw] = inner;
        for c in 0..self.cin {
            for i2 in 0..id {
                for i1 in 0..ih {
                    let src = &q[((c * id + i2) * ih + i1) * iw..][..iw];
                    let at = ((c * pd + i2 + self.border(0)) * ph + i1 + self.border(1)) * pw + self.border(2);
                    let dst = &mut out[at * width..][..iw * width];
                    match self.acts {
                        Acts::I8 => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v as u8),
                        Acts::U8Offset => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v as u8 ^ 0x80),
                        Acts::I16 => dst
                            .chunks_exact_mut(2)
                            .zip(src)
                            .for_each(|(d, &v)| d.copy_from_slice(&(v as i16).to_le_bytes())),
                    }
                }
            }
        }
        debug_assert_eq!(out.len(), self.len_bytes());
    }

    fn border(&self, d: usize) -> usize {
        self.pad[d]
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
    threads.for_each_chunk(rows, ROWS_PER_ITEM * lda, |item, part| {
        for (r, row) in part.chunks_exact_mut(lda).enumerate() {
            let pixel = item * ROWS_PER_ITEM + r;
            if pixel < m {
                gather_row(g, padded, image, p0 + pixel, row);
            } else {
                row.fill(0);
            }
        }
    });
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
