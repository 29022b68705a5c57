//! int8 depthwise convolution, channels-last: int8 weights (one scale per
//! channel, symmetric) times static int8 activations, exact i32 sums.
//!
//! `x [N, H, W, C]` (f32, quantized here with the static scale and zero
//! point, or i8 already quantized with them) by `w [C, 1, kh, kw]`: each
//! output `(f32(Σ_t (q − zp) · w_t) · s) · scale[c] + bias[c]`, then the
//! epilogue (activation, residual) as [`super::qconv`]'s — the dense
//! kernel's arithmetic with a window of one channel. A tap over the padding
//! reads the zero point (the real value 0) and adds nothing, so it is left
//! out. The activations are stored centred (`q − zp`, i16, in `[-255,
//! 255]`), so each product of a weight (`[-128, 127]`) fits an i16 and the
//! sums are exact; every output is one sum over its taps in tap order, so
//! results are the same whatever the thread count and ISA variant. With
//! `out_quant` the result is i8, each f32 value quantized as the next
//! layer would quantize it ([`super::quantize_value`]).

use super::int8::Acts;
use super::{err, ActQuant, QuantKernels};
use crate::context::Context;
use crate::generic::conv::{geometry, ConvParams, TensorEpilogue};
use crate::generic::gemm::ActivationFn;
use crate::parallel::SharedMut;
use crate::types::{DType, Result, TensorMut, TensorRef};

/// A depthwise convolution's int8 weight prepared for [`qconv_depthwise`]:
/// tap-major `[kh · kw, Cp]` i16 values (`Cp`: `C` rounded up to whole
/// blocks, the lanes past `C` zero) and the per-channel scales.
#[derive(Clone, Debug)]
pub struct DepthwiseQWeights {
    channels: usize,
    padded: usize,
    kernel: [usize; 2],
    taps: Vec<i16>,
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
        let taps = kh * kw;
        let cp = c.next_multiple_of(BLOCK);
        let mut t = vec![0i16; taps * cp];
        for (ch, row) in w.chunks_exact(taps.max(1)).enumerate() {
            for (tap, &v) in row.iter().enumerate() {
                t[tap * cp + ch] = v as i16;
            }
        }
        Ok(DepthwiseQWeights { channels: c, padded: cp, kernel: [kh, kw], taps: t, scales: scales.to_vec() })
    }

    pub fn channels(&self) -> usize {
        self.channels
    }
}

/// Channels per block: one fixed-size accumulator the driver loop keeps
/// in registers over the taps.
const BLOCK: usize = 16;
/// Most taps of a kernel (the offsets of a pixel's taps live on the stack).
const MAX_TAPS: usize = 64;

/// The driver's depthwise loop: `acc[c] = Σ_j x[offs[j] + c0 + c] ·
/// w[w_offs[j] + c0 + c]` over a block of `c < 16` (i16 products, exact
/// for centred activations and int8 weights, summed in i32 in tap order).
pub(crate) type DepthwiseFn =
    fn(x: &[i16], offs: &[usize], w: &[i16], w_offs: &[usize], c0: usize, acc: &mut [i32; BLOCK]);

/// [`DepthwiseFn`], plain Rust the compiler vectorises (an ISA's driver
/// compiles the same loop for it).
#[inline(always)]
pub(crate) fn depthwise_acc(x: &[i16], offs: &[usize], w: &[i16], w_offs: &[usize], c0: usize, acc: &mut [i32; BLOCK]) {
    const ZERO: [i16; BLOCK] = [0; BLOCK];
    let mut a = [0i32; BLOCK];
    for (&o, &wo) in offs.iter().zip(w_offs) {
        // In bounds by construction (offsets of padded pixels and taps).
        let x: &[i16; BLOCK] = x[o + c0..o + c0 + BLOCK].try_into().unwrap_or(&ZERO);
        let w: &[i16; BLOCK] = w[wo + c0..wo + c0 + BLOCK].try_into().unwrap_or(&ZERO);
        for k in 0..BLOCK {
            a[k] += x[k].wrapping_mul(w[k]) as i32;
        }
    }
    *acc = a;
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
    let driver = kernels.int8.driver;
    // The centred image: `q − zp` as i16 (f32 inputs quantized here).
    let cp = w.padded;
    let centred = cx.scratch.f32s((h * wd * cp).div_ceil(2));
    let centred: &mut [i16] = &mut bytemuck::cast_slice_mut(centred)[..h * wd * cp];
    let out_bytes = SharedMut(out.data.as_mut_ptr());
    let out_dtype = out.dtype;
    for b in 0..n {
        // A pixel's channels at stride `cp`, the lanes past `C` zero.
        threads.for_each_chunk(centred, wd * cp, |row, dst| {
            for (px, d) in dst.chunks_exact_mut(cp).enumerate() {
                let at = b * plane + (row * wd + px) * c..b * plane + (row * wd + px + 1) * c;
                let (d, pad) = d.split_at_mut(c);
                if xi.is_empty() {
                    (driver.encode)(Acts::I16, &xf[at], s, zp, bytemuck::cast_slice_mut(d));
                    d.iter_mut().for_each(|d| *d -= zp as i16);
                } else {
                    d.iter_mut().zip(&xi[at]).for_each(|(d, &v)| *d = v as i16 - zp as i16);
                }
                pad.fill(0);
            }
        });
        let centred: &[i16] = centred;
        // One output row per work item.
        threads.for_each(oh, |oy| {
            let mut offs = [0usize; MAX_TAPS];
            let mut w_offs = [0usize; MAX_TAPS];
            let mut acc = [0i32; BLOCK];
            let mut vals = [0f32; BLOCK];
            for ox in 0..ow {
                // The taps inside the image, in tap order.
                let mut t = 0;
                for ty in 0..kh {
                    let iy = (oy * g.stride[1] + ty * g.dil[1]).wrapping_sub(g.pad[1]);
                    if iy >= h {
                        continue;
                    }
                    for tx in 0..kw {
                        let ix = (ox * g.stride[2] + tx * g.dil[2]).wrapping_sub(g.pad[2]);
                        if ix >= wd {
                            continue;
                        }
                        offs[t] = (iy * wd + ix) * cp;
                        w_offs[t] = (ty * kw + tx) * cp;
                        t += 1;
                    }
                }
                let pixel = (b * oh + oy) * ow + ox;
                for c0 in (0..c).step_by(BLOCK) {
                    let cb = BLOCK.min(c - c0);
                    (driver.depthwise)(centred, &offs[..t], &w.taps, &w_offs[..t], c0, &mut acc);
                    let v = &mut vals[..cb];
                    let scales = &w.scales[c0..c0 + cb];
                    match bias {
                        Some(bias) => v
                            .iter_mut()
                            .zip(acc.iter().zip(scales).zip(&bias[c0..c0 + cb]))
                            .for_each(|(v, ((&a, &sc), &b))| *v = (a as f32 * s) * sc + b),
                        None => {
                            v.iter_mut().zip(acc.iter().zip(scales)).for_each(|(v, (&a, &sc))| *v = (a as f32 * s) * sc)
                        }
                    }
                    let r = residual.map(|r| &r[pixel * c + c0..][..cb]);
                    let add = |v: &mut [f32]| {
                        if let Some(r) = r {
                            v.iter_mut().zip(r).for_each(|(v, &r)| *v += r);
                        }
                    };
                    if epilogue.residual_first {
                        add(&mut *v);
                    }
                    if let Some(a) = &activation {
                        a.apply(&mut *v);
                    }
                    if !epilogue.residual_first {
                        add(&mut *v);
                    }
                    let at = pixel * c + c0;
                    // SAFETY: `at + cb <= n · oh · ow · c` (checked lengths);
                    // each output row belongs to one work item.
                    unsafe {
                        match (out_dtype, out_quant) {
                            (DType::I8, Some((os, ozp))) => {
                                let dst = std::slice::from_raw_parts_mut(out_bytes.ptr().add(at), cb);
                                (driver.encode)(Acts::I8, &*v, os, ozp, dst);
                            }
                            _ => {
                                let dst = std::slice::from_raw_parts_mut((out_bytes.ptr() as *mut f32).add(at), cb);
                                dst.copy_from_slice(&*v);
                            }
                        }
                    }
                }
            }
        });
    }
    Ok(())
}
