//! int8 depthwise convolution, channels-last: int8 weights (one scale per
//! channel, symmetric) times static int8 activations, exact i32 sums.
//!
//! `x [N, H, W, C]` (f32, quantized here with the static scale and zero
//! point, or i8 already quantized with them) by `w [C, 1, kh, kw]`: each
//! output `(f32(Σ_t (q − zp) · w_t) · s) · scale[c] + bias[c]`, then the
//! epilogue (activation, residual) as [`super::qconv`]'s — the dense
//! kernel's arithmetic with a window of one channel. A tap over the padding
//! reads the zero point (the real value 0) and adds nothing.
//!
//! # Storage
//! The image is copied once, centred (`q − zp`, in `[-255, 255]`) and
//! zero-padded to every pixel the taps reach, as **pairs**: the i32 lane
//! of pixel `(y, x)`, channel `c` holds the i16 values of pixels `x` and
//! `x + 1` of that row (low, high half). A kernel row's taps `tx, tx + 1`
//! (no horizontal dilation) then meet the weight pair `(w[tx], w[tx + 1])`
//! in one i16 pair product (`vpmaddwd`): two taps per multiply, an odd last
//! tap paired with 0. With dilation every tap is paired with 0. Each
//! product fits an i16 pair sum exactly (`|255 · 128| · 2 < 2^31`), so the
//! sums are exact and do not depend on their order: every variant, thread
//! count and pixel blocking gives the same integers.
//!
//! # Blocking
//! A row function computes one output row: [`PIXELS`] output pixels at a
//! time, 16 channels per block, so each weight pair loaded serves several
//! pixels and the sums stay in registers over the taps (the AVX-512 row:
//! 32 channels × 8 pixels, see `x86_64::avx512::quant`; the NEON row: 8
//! channels × 4 pixels, `smlal` on the pair lanes, see `aarch64::quant`).
//! Each variant's row is named in the kernel table (`qconv_depthwise_i8`).
//! The i32 sums are
//! written into the output row (f32 storage), then each pixel's epilogue
//! (scale, bias) runs over the whole row in place. With `out_quant` the
//! result is i8, each f32 value quantized as the next layer would quantize
//! it ([`super::quantize_value`]).

use super::int8::Acts;
use super::{err, ActQuant, QuantKernels};
use crate::context::Context;
use crate::generic::conv::{geometry, ConvParams, TensorEpilogue};
use crate::generic::gemm::ActivationFn;
use crate::parallel::SharedMut;
use crate::types::{DType, Result, TensorMut, TensorRef};

/// Channels per block: one set of accumulators kept in registers over the
/// taps (two AVX2 vectors).
pub(crate) const BLOCK: usize = 16;
/// Output pixels per block.
pub(crate) const PIXELS: usize = 4;
/// Most taps of a kernel.
const MAX_TAPS: usize = 64;

/// `lo` and `hi` (each in i16 range) as one i32 lane of two i16 values.
#[inline(always)]
pub(crate) fn pair(lo: i32, hi: i32) -> i32 {
    ((lo as i16 as u16 as u32) | ((hi as i16 as u16 as u32) << 16)) as i32
}

/// The i16 pair product of two lanes, `lo · lo' + hi · hi'` (`vpmaddwd`).
#[inline(always)]
pub(crate) fn pair_dot(x: i32, w: i32) -> i32 {
    (x as i16 as i32) * (w as i16 as i32) + ((x >> 16) as i16 as i32) * ((w >> 16) as i16 as i32)
}

/// A depthwise convolution's int8 weight prepared for [`qconv_depthwise`]:
/// per kernel row, the taps in horizontal pairs (`[kh · ⌈kw/2⌉, Cp]`, the
/// last of an odd row paired with 0) and each tap alone (`[kh · kw, Cp]`,
/// for dilated kernels), as [`pair`] lanes (`Cp`: `C` rounded up to whole
/// blocks, the lanes past `C` zero), and the per-channel scales (`[Cp]`).
#[derive(Clone, Debug)]
pub struct DepthwiseQWeights {
    channels: usize,
    padded: usize,
    kernel: [usize; 2],
    pairs: Vec<i32>,
    singles: Vec<i32>,
    scales: Vec<f32>,
}

impl DepthwiseQWeights {
    /// From the `[C, 1, kh, kw]` int8 weight (`dims`) and its `C` scales.
    pub fn new(w: &[i8], dims: &[usize], scales: &[f32]) -> Result<DepthwiseQWeights> {
        let &[c, 1, kh, kw] = dims else {
            return Err(err(format!("a depthwise weight is [C, 1, kh, kw], got {dims:?}")));
        };
        if w.len() != c * kh * kw || scales.len() != c {
            return Err(err("depthwise weight or scales do not match the weight's shape"));
        }
        let cp = c.next_multiple_of(BLOCK);
        let kw2 = kw.div_ceil(2);
        let mut pairs = vec![0i32; kh * kw2 * cp];
        let mut singles = vec![0i32; kh * kw * cp];
        let tap = |ch: usize, ty: usize, tx: usize| if tx < kw { w[(ch * kh + ty) * kw + tx] as i32 } else { 0 };
        for ch in 0..c {
            for ty in 0..kh {
                for j in 0..kw2 {
                    pairs[(ty * kw2 + j) * cp + ch] = pair(tap(ch, ty, 2 * j), tap(ch, ty, 2 * j + 1));
                }
                for tx in 0..kw {
                    singles[(ty * kw + tx) * cp + ch] = pair(tap(ch, ty, tx), 0);
                }
            }
        }
        let mut padded_scales = scales.to_vec();
        padded_scales.resize(cp, 0.0);
        Ok(DepthwiseQWeights { channels: c, padded: cp, kernel: [kh, kw], pairs, singles, scales: padded_scales })
    }

    pub fn channels(&self) -> usize {
        self.channels
    }
}

/// One output row's operands for the driver's [`DepthwiseRowFn`].
pub(crate) struct DepthwiseRow<'a> {
    /// The padded pair image (see the module doc), `[Hp, Wp, Cp]` lanes.
    pub(crate) img: &'a [i32],
    /// `[terms, Cp]` weight pairs.
    pub(crate) weights: &'a [i32],
    /// Each term's offset (in lanes) from an output pixel's first tap.
    pub(crate) offs: &'a [usize],
    /// Terms per kernel row (`offs` holds the rows one after another;
    /// read by the AVX-512 rows only).
    #[cfg_attr(not(all(target_arch = "x86_64", feature = "isa")), allow(dead_code))]
    pub(crate) row_terms: usize,
    pub(crate) cp: usize,
    pub(crate) channels: usize,
    /// Lanes between two output pixels' first taps (stride · `Cp`).
    pub(crate) step: usize,
    /// The activation scale.
    pub(crate) s: f32,
    /// `[Cp]` each: the weight scales, and the bias (zeros without one).
    pub(crate) scales: &'a [f32],
    pub(crate) bias: &'a [f32],
    pub(crate) has_bias: bool,
    /// A clamp (ReLU6) on each value, as the clamp kernel compares.
    pub(crate) clamp: Option<(f32, f32)>,
    /// The output's scale and zero point: each value quantized
    /// ([`super::quantize_value`]) into the i8 row instead of the f32 one.
    pub(crate) quant: Option<(f32, i32)>,
}

/// The output row whose first pixel's first tap is lane `base` of the
/// image, `OW · C` values `clamp((f32(Σ) · s) · scale + bias)`: into `out`,
/// or, with [`DepthwiseRow::quant`], quantized into `q` (`out` then is
/// scratch of the same length).
pub(crate) type DepthwiseRowFn = fn(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]);

/// Writes one padded image row of pairs: `dst` (`⌈Wp / every⌉ · Cp`
/// lanes), its pixel `j` the padded row's pixel `j · every`, from the
/// quantized input row `src` (`W · C` values) at `j · every − left` and its
/// right neighbour, centred by `zp`, zero outside the row.
pub(crate) type PairRowFn = fn(src: &[i8], zp: i32, channels: usize, left: usize, every: usize, dst: &mut [i32]);

/// The depthwise entries of a [`super::int8::Driver`].
#[derive(Copy, Clone)]
pub(crate) struct DepthwiseFns {
    /// The row function's name (the kernel table's `qconv_depthwise_i8`).
    pub(crate) variant: &'static str,
    pub(crate) pairs: PairRowFn,
    pub(crate) row: DepthwiseRowFn,
}

/// The portable entries (the baseline build's vectors).
pub(crate) const GENERIC_DEPTHWISE: DepthwiseFns =
    DepthwiseFns { variant: "generic", pairs: pair_row, row: depthwise_row };

/// The bounds every ISA's depthwise row function relies on: each output
/// pixel's taps (`Cp` lanes from each term's offset) inside the image, a
/// weight vector of `Cp` lanes per term, `Cp` scales and biases, and an i8
/// row as long as the f32 one when the row is quantized.
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) fn depthwise_bounds(job: &DepthwiseRow<'_>, base: usize, out: &[f32], q: &[i8]) {
    let (c, cp) = (job.channels, job.cp);
    assert!(c > 0 && cp >= c && cp.is_multiple_of(BLOCK) && out.len().is_multiple_of(c), "depthwise: shapes");
    let ow = out.len() / c;
    let far = job.offs.iter().max().copied().unwrap_or(0);
    assert!(ow == 0 || job.img.len() >= base + (ow - 1) * job.step + far + cp, "depthwise: image too short");
    assert!(job.weights.len() >= job.offs.len() * cp, "depthwise: weights too short");
    assert!(job.scales.len() >= cp && job.bias.len() >= cp, "depthwise: scales or bias");
    assert!(job.quant.is_none() || q.len() == out.len(), "depthwise: i8 row");
}

/// [`PairRowFn`], plain Rust the compiler vectorises (an ISA's driver
/// compiles the same loop for it).
#[inline(always)]
pub(crate) fn pair_row(src: &[i8], zp: i32, c: usize, left: usize, every: usize, dst: &mut [i32]) {
    let w = src.len() / c.max(1);
    let cp = c.next_multiple_of(BLOCK);
    for (j, d) in dst.chunks_exact_mut(cp).enumerate() {
        let (d, pad) = d.split_at_mut(c);
        // Wrapped negative coordinates fail the bounds tests too.
        let ix = (j * every).wrapping_sub(left);
        let at = |i: usize| (i < w).then(|| &src[i * c..(i + 1) * c]);
        match (at(ix), at(ix.wrapping_add(1))) {
            (Some(a), Some(b)) => {
                d.iter_mut().zip(a.iter().zip(b)).for_each(|(d, (&a, &b))| *d = pair(a as i32 - zp, b as i32 - zp))
            }
            (Some(a), None) => d.iter_mut().zip(a).for_each(|(d, &a)| *d = pair(a as i32 - zp, 0)),
            (None, Some(b)) => d.iter_mut().zip(b).for_each(|(d, &b)| *d = pair(0, b as i32 - zp)),
            (None, None) => d.fill(0),
        }
        pad.fill(0);
    }
}

/// [`DepthwiseRowFn`], portable: the blocks' sums, then the epilogue.
#[inline(always)]
pub(crate) fn depthwise_row(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    let c = job.channels;
    let ow = out.len() / c;
    let sums: &mut [i32] = bytemuck::cast_slice_mut(out);
    let mut ox = 0;
    while ox < ow {
        match ow - ox {
            1 => sums_block::<1>(job, base, ox, sums),
            2 => sums_block::<2>(job, base, ox, sums),
            3 => sums_block::<3>(job, base, ox, sums),
            _ => sums_block::<PIXELS>(job, base, ox, sums),
        }
        ox += PIXELS;
    }
    finish_row(job, out);
    if let Some((os, ozp)) = job.quant {
        super::encode_quantized(Acts::I8, out, os, ozp, bytemuck::cast_slice_mut(q));
    }
}

/// The sums of output pixels `ox..ox + P`, every channel block.
#[inline(always)]
fn sums_block<const P: usize>(job: &DepthwiseRow<'_>, base: usize, ox: usize, sums: &mut [i32]) {
    const ZERO: [i32; BLOCK] = [0; BLOCK];
    let (c, cp) = (job.channels, job.cp);
    for c0 in (0..c).step_by(BLOCK) {
        let mut acc = [[0i32; BLOCK]; P];
        for (t, &o) in job.offs.iter().enumerate() {
            let w: &[i32; BLOCK] = job.weights[t * cp + c0..][..BLOCK].try_into().unwrap_or(&ZERO);
            for (p, a) in acc.iter_mut().enumerate() {
                let at = base + (ox + p) * job.step + o + c0;
                let x: &[i32; BLOCK] = job.img[at..at + BLOCK].try_into().unwrap_or(&ZERO);
                for k in 0..BLOCK {
                    a[k] = a[k].wrapping_add(pair_dot(x[k], w[k]));
                }
            }
        }
        let cb = BLOCK.min(c - c0);
        for (p, a) in acc.iter().enumerate() {
            sums[(ox + p) * c + c0..][..cb].copy_from_slice(&a[..cb]);
        }
    }
}

/// Each value of the row, an i32 sum in f32 storage, becomes `(f32(sum) ·
/// s) · scale + bias` (that order, no contraction: every variant's bits),
/// then the job's clamp.
#[inline(always)]
pub(crate) fn finish_row(job: &DepthwiseRow<'_>, out: &mut [f32]) {
    let (c, s) = (job.channels, job.s);
    let (scales, bias) = (&job.scales[..c], &job.bias[..c]);
    let sum = |v: f32| v.to_bits() as i32 as f32;
    for px in out.chunks_exact_mut(c) {
        if job.has_bias {
            px.iter_mut().zip(scales.iter().zip(bias)).for_each(|(v, (&sc, &b))| *v = (sum(*v) * s) * sc + b);
        } else {
            px.iter_mut().zip(scales).for_each(|(v, &sc)| *v = (sum(*v) * s) * sc);
        }
        if let Some((lo, hi)) = job.clamp {
            px.iter_mut().for_each(|v| {
                let x = if *v < lo { lo } else { *v };
                *v = if x > hi { hi } else { x };
            });
        }
    }
}

/// The int8 depthwise convolution (see the module doc): `x` f32 or i8
/// `[N, H, W, C]`, `act` static, `out` f32 or (with `out_quant`) i8.
#[allow(clippy::too_many_arguments)]
pub fn qconv_depthwise(
    cx: &mut Context,
    x: TensorRef<'_>,
    w: &DepthwiseQWeights,
    act: ActQuant,
    bias: Option<&[f32]>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    out: TensorMut<'_>,
    out_quant: Option<(f32, i32)>,
) -> Result<()> {
    let kernels = cx.table.quant;
    qconv_depthwise_with(cx, &kernels, x, w, act, bias, epilogue, p, out, out_quant)
}

/// [`qconv_depthwise`] with the given variant of the integer kernels.
#[allow(clippy::too_many_arguments)]
pub fn qconv_depthwise_with(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: TensorRef<'_>,
    w: &DepthwiseQWeights,
    act: ActQuant,
    bias: Option<&[f32]>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams<'_>,
    out: TensorMut<'_>,
    out_quant: Option<(f32, i32)>,
) -> Result<()> {
    let ActQuant::Static { scale: s, zero_point: zp } = act else {
        return Err(err("an int8 depthwise convolution takes static activations"));
    };
    if !(s.is_finite() && s > 0.0 && (-128..=127).contains(&zp)) {
        return Err(err(format!("static activation scale {s} / zero point {zp}")));
    }
    let c = w.channels;
    if p.groups != c {
        return Err(err(format!("a depthwise convolution of {c} channels has {c} groups, got {}", p.groups)));
    }
    if !matches!(x.dtype, DType::F32 | DType::I8) || (out.dtype == DType::I8) != out_quant.is_some() {
        return Err(err(format!("int8 depthwise: {} -> {} with output parameters {out_quant:?}", x.dtype, out.dtype)));
    }
    if !matches!(out.dtype, DType::F32 | DType::I8) {
        return Err(err(format!("int8 depthwise gives f32 or i8, got {}", out.dtype)));
    }
    if let Some((os, ozp)) = out_quant {
        if !(os.is_finite() && os > 0.0 && (-128..=127).contains(&ozp)) {
            return Err(err(format!("output scale {os} / zero point {ozp}")));
        }
    }
    let ([n, h, wd, xc], [on, oh, ow, oc]) = match (x.shape, out.shape) {
        (&[a, b, cc, d], &[e, f, g2, hh]) => ([a, b, cc, d], [e, f, g2, hh]),
        _ => return Err(err("an int8 depthwise convolution is 2-d channels-last: [N, H, W, C]")),
    };
    if xc != c || oc != c || on != n {
        return Err(err(format!("input {:?} / output {:?} for {c} channels", x.shape, out.shape)));
    }
    let [kh, kw] = w.kernel;
    if kh * kw > MAX_TAPS {
        return Err(err(format!("an int8 depthwise kernel has at most {MAX_TAPS} taps, got {kh}x{kw}")));
    }
    let g = geometry(&[n, c, h, wd], &[c, 1, kh, kw], p, &[n, c, oh, ow])?;
    let residual = match epilogue.residual {
        Some(r) if r.dtype != DType::F32 || r.shape != out.shape => {
            return Err(err(format!("residual {:?} does not match the output {:?}", r.shape, out.shape)))
        }
        Some(r) => Some(bytemuck::try_cast_slice::<u8, f32>(r.data).map_err(|_| err("unaligned residual"))?),
        None => None,
    };
    if bias.is_some_and(|b| b.len() != c) {
        return Err(err("bias length differs from the channel count"));
    }
    let plane = h * wd * c;
    let (xf, xi): (&[f32], &[i8]) = match x.dtype {
        DType::I8 => (&[], bytemuck::cast_slice(x.data)),
        _ => (bytemuck::try_cast_slice(x.data).map_err(|_| err("unaligned input"))?, &[]),
    };
    if xf.len().max(xi.len()) != n * plane || out.data.len() != n * oh * ow * c * out.dtype.size_bytes() {
        return Err(err("input or output length does not match its shape"));
    }
    if out.dtype == DType::F32 && !(out.data.as_ptr() as usize).is_multiple_of(4) {
        return Err(err("unaligned output"));
    }
    if n == 0 || oh * ow * c == 0 {
        return Ok(());
    }
    let activation = epilogue.activation.map(|a| ActivationFn::new(cx.table, a));
    let threads = if n * oh * ow * c * kh * kw < 1 << 16 { crate::parallel::Threads::single() } else { cx.threads() };
    let fns = kernels.int8.driver.depthwise;
    let encode = kernels.int8.driver.encode;
    // The padded pair image covers every lane a tap reaches.
    let cp = w.padded;
    let ([sy, sx], [dy, dx]) = ([g.stride[1], g.stride[2]], [g.dil[1], g.dil[2]]);
    let hp = (oh - 1) * sy + (kh - 1) * dy + 1;
    // With pairs and an even stride only the even columns' pairs are read
    // (every tap pair starts at `ox · sx + 2j`): the image keeps those.
    let every = if dx == 1 && sx.is_multiple_of(2) { 2 } else { 1 };
    let wp = ((ow - 1) * sx + (kw - 1) * dx + 1).div_ceil(every);
    // Terms: a kernel row's taps in pairs (no horizontal dilation) or alone.
    let mut offs = [0usize; MAX_TAPS];
    let (weights, terms, row_terms) = if dx == 1 {
        let kw2 = kw.div_ceil(2);
        for ty in 0..kh {
            for j in 0..kw2 {
                offs[ty * kw2 + j] = (ty * dy * wp + 2 * j / every) * cp;
            }
        }
        (&w.pairs[..], kh * kw2, kw2)
    } else {
        for ty in 0..kh {
            for tx in 0..kw {
                offs[ty * kw + tx] = (ty * dy * wp + tx * dx) * cp;
            }
        }
        (&w.singles[..], kh * kw, kw)
    };
    let img_len = hp * wp * cp;
    // Without a residual, a clamp and the output's quantization run in the
    // row function's registers; otherwise on each finished f32 row.
    let clamp = match &activation {
        Some(a) if residual.is_none() => a.clamp_bounds(),
        _ => None,
    };
    let rest_activation = activation.as_ref().filter(|_| clamp.is_none());
    let fused = residual.is_none() && rest_activation.is_none();
    // Scratch: the image, the padded bias, the input quantized (f32
    // input), the f32 rows (i8 output).
    let q_len = if xi.is_empty() { plane.div_ceil(4) } else { 0 };
    let f_len = if out.dtype == DType::I8 { oh * ow * c } else { 0 };
    let buf = cx.scratch.f32s(img_len + cp + q_len + f_len);
    let (img, rest) = buf.split_at_mut(img_len);
    let (bias_p, rest) = rest.split_at_mut(cp);
    match bias {
        Some(b) => {
            bias_p[..c].copy_from_slice(b);
            bias_p[c..].fill(0.0);
        }
        None => bias_p.fill(0.0),
    }
    let bias_p: &[f32] = bias_p;
    let (qbuf, fbuf) = rest.split_at_mut(q_len);
    let img: &mut [i32] = bytemuck::cast_slice_mut(img);
    let qbuf: &mut [i8] = &mut bytemuck::cast_slice_mut(qbuf)[..if xi.is_empty() { plane } else { 0 }];
    let fbuf = SharedMut(fbuf.as_mut_ptr());
    let out_bytes = SharedMut(out.data.as_mut_ptr());
    let out_dtype = out.dtype;
    let (top, left) = (g.pad[1], g.pad[2]);
    let row_len = ow * c;
    for b in 0..n {
        let src: &[i8] = if xi.is_empty() {
            let xb = &xf[b * plane..][..plane];
            threads.for_each_chunk(&mut *qbuf, wd * c, |row, dst| {
                encode(Acts::I8, &xb[row * wd * c..][..wd * c], s, zp, bytemuck::cast_slice_mut(dst));
            });
            &*qbuf
        } else {
            &xi[b * plane..][..plane]
        };
        threads.for_each_chunk(&mut *img, wp * cp, |yy, dst| {
            // Wrapped negative coordinates fail the bounds test too.
            let iy = yy.wrapping_sub(top);
            if iy < h {
                (fns.pairs)(&src[iy * wd * c..][..wd * c], zp, c, left, every, dst);
            } else {
                dst.fill(0);
            }
        });
        let job = DepthwiseRow {
            img: &*img,
            weights,
            offs: &offs[..terms],
            row_terms,
            cp,
            channels: c,
            step: sx / every * cp,
            s,
            scales: &w.scales,
            bias: bias_p,
            has_bias: bias.is_some(),
            clamp,
            quant: out_quant.filter(|_| fused),
        };
        // One output row per work item.
        threads.for_each(oh, |oy| {
            let at = (b * oh + oy) * row_len;
            // SAFETY: each output row (and its f32 row in the scratch)
            // belongs to one work item; `at + row_len` is within the
            // checked lengths.
            let (row, q): (&mut [f32], &mut [i8]) = unsafe {
                match out_dtype {
                    DType::I8 => (
                        std::slice::from_raw_parts_mut(fbuf.ptr().add(oy * row_len), row_len),
                        std::slice::from_raw_parts_mut(out_bytes.ptr().add(at) as *mut i8, row_len),
                    ),
                    _ => (std::slice::from_raw_parts_mut((out_bytes.ptr() as *mut f32).add(at), row_len), &mut []),
                }
            };
            (fns.row)(&job, oy * sy * wp * cp, row, q);
            if fused {
                return;
            }
            let r = residual.map(|r| &r[at..at + row_len]);
            let add = |v: &mut [f32]| {
                if let Some(r) = r {
                    v.iter_mut().zip(r).for_each(|(v, &r)| *v += r);
                }
            };
            if epilogue.residual_first {
                add(&mut *row);
            }
            if let Some(a) = rest_activation {
                a.apply(&mut *row);
            }
            if !epilogue.residual_first {
                add(&mut *row);
            }
            if let Some((os, ozp)) = out_quant {
                encode(Acts::I8, row, os, ozp, bytemuck::cast_slice_mut(q));
            }
        });
    }
    Ok(())
}
