//! Normalisations and softmax.

use super::common::*;
use super::math::Real;
use crate::context::Context;
use crate::parallel::Threads;
use crate::table::KernelTable;
use crate::types::{DType, Result, TensorMut, TensorRef};

/// A per-channel / per-feature parameter: x's dtype and `want_len` elements.
fn operand<'a, T: Real>(kernel: &'static str, what: &str, t: &TensorRef<'a>, want_len: usize) -> Result<&'a [T]> {
    expect_dtype(kernel, what, t.dtype, T::DTYPE)?;
    let v = view::<T>(kernel, what, t)?;
    if v.len() != want_len {
        return Err(shape_err(kernel, format!("{what} has {} elements, expected {want_len}", v.len())));
    }
    Ok(v)
}

/// Inference batch norm over channel axis 1:
/// `y = (x - mean) / sqrt(var + eps) * weight + bias`.
pub fn batch_norm(
    x: TensorRef,
    mean: TensorRef,
    var: TensorRef,
    weight: TensorRef,
    bias: TensorRef,
    eps: f64,
    out: TensorMut,
) -> Result<()> {
    match x.dtype {
        DType::F32 => batch_norm_typed::<f32>(x, mean, var, weight, bias, eps, out),
        DType::F64 => batch_norm_typed::<f64>(x, mean, var, weight, bias, eps, out),
        d => Err(dtype_err("batch_norm", d)),
    }
}

fn batch_norm_typed<T: Real>(
    x: TensorRef,
    mean: TensorRef,
    var: TensorRef,
    weight: TensorRef,
    bias: TensorRef,
    eps: f64,
    mut out: TensorMut,
) -> Result<()> {
    const K: &str = "batch_norm";
    expect_dtype(K, "out", out.dtype, T::DTYPE)?;
    if x.shape.len() < 2 || x.shape != out.shape {
        return Err(shape_err(K, format!("x {:?} must have rank >= 2 and equal out {:?}", x.shape, out.shape)));
    }
    let c = x.shape[1];
    let mv = operand::<T>(K, "mean", &mean, c)?;
    let vv = operand::<T>(K, "var", &var, c)?;
    let wv = operand::<T>(K, "weight", &weight, c)?;
    let bv = operand::<T>(K, "bias", &bias, c)?;
    let xv = view::<T>(K, "x", &x)?;
    let ov = view_mut::<T>(K, "out", &mut out)?;
    let inner: usize = x.shape[2..].iter().product();
    if inner == 0 || c == 0 {
        return Ok(());
    }
    for (i, (xp, op)) in xv.chunks_exact(inner).zip(ov.chunks_exact_mut(inner)).enumerate() {
        let ch = i % c;
        // Fold the affine transform into one scale and shift, computed in f64.
        let scale = wv[ch].to_f64() / (vv[ch].to_f64() + eps).sqrt();
        let shift = bv[ch].to_f64() - mv[ch].to_f64() * scale;
        let (scale, shift) = (T::from_f64(scale), T::from_f64(shift));
        for (o, &v) in op.iter_mut().zip(xp) {
            *o = v * scale + shift;
        }
    }
    Ok(())
}

/// Layer norm over the last `normalized_rank` dims, biased variance, two-pass
/// statistics accumulated in f64 (for f32 and f64 alike).
pub fn layer_norm(
    x: TensorRef,
    weight: Option<TensorRef>,
    bias: Option<TensorRef>,
    normalized_rank: usize,
    eps: f64,
    out: TensorMut,
) -> Result<()> {
    layer_norm_with(x, weight, bias, normalized_rank, eps, out, (crate::table::best(), Threads::single()))
}

/// [`layer_norm`] with its rows shared out over `cx`'s threads.
pub fn layer_norm_cx(
    x: TensorRef,
    weight: Option<TensorRef>,
    bias: Option<TensorRef>,
    normalized_rank: usize,
    eps: f64,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    layer_norm_with(x, weight, bias, normalized_rank, eps, out, (cx.table, cx.threads()))
}

fn layer_norm_with(
    x: TensorRef,
    weight: Option<TensorRef>,
    bias: Option<TensorRef>,
    normalized_rank: usize,
    eps: f64,
    out: TensorMut,
    (table, threads): (&KernelTable, Threads),
) -> Result<()> {
    let rows = (normalized_rank, eps, threads);
    match x.dtype {
        DType::F32 => layer_norm_typed::<f32>(x, weight, bias, rows, out, table.layer_norm.run),
        DType::F64 => layer_norm_typed::<f64>(x, weight, bias, rows, out, layer_norm_rows::<f64>),
        d => Err(dtype_err("layer_norm", d)),
    }
}

/// Layer norm of whole rows of `d` elements of `x` into `out`, with an
/// optional weight and bias of `d` elements each.
pub(crate) type LayerNormRowsFn<T> = fn(&[T], &mut [T], usize, Option<&[T]>, Option<&[T]>, f64);

fn layer_norm_typed<T: Real>(
    x: TensorRef,
    weight: Option<TensorRef>,
    bias: Option<TensorRef>,
    (normalized_rank, eps, threads): (usize, f64, Threads),
    mut out: TensorMut,
    rows: LayerNormRowsFn<T>,
) -> Result<()> {
    const K: &str = "layer_norm";
    expect_dtype(K, "out", out.dtype, T::DTYPE)?;
    let r = x.shape.len();
    if normalized_rank == 0 || normalized_rank > r || x.shape != out.shape {
        return Err(shape_err(
            K,
            format!("normalized_rank {normalized_rank} invalid for x {:?} / out {:?}", x.shape, out.shape),
        ));
    }
    let d: usize = x.shape[r - normalized_rank..].iter().product();
    let wv = weight.as_ref().map(|t| operand::<T>(K, "weight", t, d)).transpose()?;
    let bv = bias.as_ref().map(|t| operand::<T>(K, "bias", t, d)).transpose()?;
    let xv = view::<T>(K, "x", &x)?;
    let ov = view_mut::<T>(K, "out", &mut out)?;
    if d == 0 {
        return Ok(());
    }
    threads.for_each_rows(xv, ov, d, |xs, os| rows(xs, os, d, wv, bv, eps));
    Ok(())
}

/// The generic [`LayerNormRowsFn`], also compiled per ISA by the plug-ins
/// (`#[inline(always)]` into a `#[target_feature]` function: the same
/// operations in the same order, so every variant gives the same bits).
/// Two-pass statistics in f64, each sum over [`F64_LANES`] interleaved
/// partial sums (independent chains a vector unit runs side by side, in a
/// fixed order); each element's `(x - mean) · rstd [· w] [+ b]` in f64,
/// rounded once.
#[inline(always)]
pub(crate) fn layer_norm_rows<T: Real>(xv: &[T], ov: &mut [T], d: usize, wv: Option<&[T]>, bv: Option<&[T]>, eps: f64) {
    for (xr, or) in xv.chunks_exact(d).zip(ov.chunks_exact_mut(d)) {
        let mean = lane_sum(xr, |v| v) / d as f64;
        let var = lane_sum(xr, |v| (v - mean) * (v - mean)) / d as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        let centred = |v: T| (v.to_f64() - mean) * rstd;
        // One loop per case rather than a test per element: each vectorizes.
        match (wv, bv) {
            (Some(w), Some(b)) => {
                for (((o, &v), &w), &b) in or.iter_mut().zip(xr).zip(w).zip(b) {
                    *o = T::from_f64(centred(v) * w.to_f64() + b.to_f64());
                }
            }
            (Some(w), None) => {
                for ((o, &v), &w) in or.iter_mut().zip(xr).zip(w) {
                    *o = T::from_f64(centred(v) * w.to_f64());
                }
            }
            (None, Some(b)) => {
                for ((o, &v), &b) in or.iter_mut().zip(xr).zip(b) {
                    *o = T::from_f64(centred(v) + b.to_f64());
                }
            }
            (None, None) => {
                for (o, &v) in or.iter_mut().zip(xr) {
                    *o = T::from_f64(centred(v));
                }
            }
        }
    }
}

/// Partial sums per [`lane_sum`].
const F64_LANES: usize = 8;

/// `Σ f(x[i])` in f64: element `i` into partial sum `i mod 8`, the eight
/// then added pairwise. The order depends only on the length. (Eight
/// independent chains instead of one: the sequential sum was bound by the
/// f64 add latency, ~4× slower on a row of 256.)
#[inline(always)]
fn lane_sum<T: Real>(x: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0f64; F64_LANES];
    let mut chunks = x.chunks_exact(F64_LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v.to_f64());
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f(v.to_f64());
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// RMS normalisation over the last `normalized_rank` dims (torch's
/// `rms_norm`, and what its decomposition `x · rsqrt(mean(x²) + eps) [· w]`
/// computes): the mean square in f64, each element rounded once.
pub fn rms_norm(
    x: TensorRef,
    weight: Option<TensorRef>,
    normalized_rank: usize,
    eps: f64,
    out: TensorMut,
) -> Result<()> {
    rms_norm_with(x, weight, (normalized_rank, eps, Threads::single()), out)
}

/// [`rms_norm`] with its rows shared out over `cx`'s threads (each row is
/// one thread's: the same bits at any thread count).
pub fn rms_norm_cx(
    x: TensorRef,
    weight: Option<TensorRef>,
    normalized_rank: usize,
    eps: f64,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    rms_norm_with(x, weight, (normalized_rank, eps, cx.threads()), out)
}

fn rms_norm_with(x: TensorRef, weight: Option<TensorRef>, rows: (usize, f64, Threads), out: TensorMut) -> Result<()> {
    match x.dtype {
        DType::F32 => rms_norm_typed::<f32>(x, weight, rows, out),
        DType::F64 => rms_norm_typed::<f64>(x, weight, rows, out),
        d => Err(dtype_err("rms_norm", d)),
    }
}

fn rms_norm_typed<T: Real>(
    x: TensorRef,
    weight: Option<TensorRef>,
    (normalized_rank, eps, threads): (usize, f64, Threads),
    mut out: TensorMut,
) -> Result<()> {
    const K: &str = "rms_norm";
    expect_dtype(K, "out", out.dtype, T::DTYPE)?;
    let r = x.shape.len();
    if normalized_rank == 0 || normalized_rank > r || x.shape != out.shape {
        return Err(shape_err(
            K,
            format!("normalized_rank {normalized_rank} invalid for x {:?} / out {:?}", x.shape, out.shape),
        ));
    }
    let d: usize = x.shape[r - normalized_rank..].iter().product();
    let wv = weight.as_ref().map(|t| operand::<T>(K, "weight", t, d)).transpose()?;
    let xv = view::<T>(K, "x", &x)?;
    let ov = view_mut::<T>(K, "out", &mut out)?;
    if d == 0 {
        return Ok(());
    }
    threads.for_each_rows(xv, ov, d, |xs, os| rms_norm_rows(xs, os, d, wv, eps));
    Ok(())
}

/// RMS norm of whole rows of `d` elements.
fn rms_norm_rows<T: Real>(xv: &[T], ov: &mut [T], d: usize, wv: Option<&[T]>, eps: f64) {
    for (xr, or) in xv.chunks_exact(d).zip(ov.chunks_exact_mut(d)) {
        let ms = lane_sum(xr, |v| v * v) / d as f64;
        let rrms = 1.0 / (ms + eps).sqrt();
        match wv {
            Some(w) => {
                for ((o, &v), &w) in or.iter_mut().zip(xr).zip(w) {
                    *o = T::from_f64(v.to_f64() * rrms * w.to_f64());
                }
            }
            None => {
                for (o, &v) in or.iter_mut().zip(xr) {
                    *o = T::from_f64(v.to_f64() * rrms);
                }
            }
        }
    }
}

/// Numerically stable (log-)softmax along `axis`. f32 rows along the last
/// axis run the [`best`](crate::best) kernel table's max and exp-sum entries;
/// [`softmax_cx`] takes the table from a context.
pub fn softmax(x: TensorRef, axis: usize, log: bool, out: TensorMut) -> Result<()> {
    softmax_with(x, axis, log, out, crate::table::best(), Threads::single())
}

/// [`softmax`] calling through `cx`'s kernel table, rows shared out over its
/// threads.
pub fn softmax_cx(x: TensorRef, axis: usize, log: bool, out: TensorMut, cx: &mut Context) -> Result<()> {
    softmax_with(x, axis, log, out, cx.table, cx.threads())
}

fn softmax_with(
    x: TensorRef,
    axis: usize,
    log: bool,
    mut out: TensorMut,
    table: &KernelTable,
    threads: Threads,
) -> Result<()> {
    const K: &str = "softmax";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if axis >= x.shape.len() || x.shape != out.shape {
        return Err(shape_err(K, format!("axis {axis} invalid for x {:?} / out {:?}", x.shape, out.shape)));
    }
    let n = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    match x.dtype {
        DType::F32 if inner == 1 => {
            threads.for_each_rows(view(K, "x", &x)?, view_mut(K, "out", &mut out)?, n, |x, o| {
                softmax_rows_f32(x, o, n, log, table)
            })
        }
        DType::F32 => threads.for_each_rows(view(K, "x", &x)?, view_mut(K, "out", &mut out)?, n * inner, |x, o| {
            softmax_typed::<f32>(x, o, n, inner, log)
        }),
        DType::F64 => threads.for_each_rows(view(K, "x", &x)?, view_mut(K, "out", &mut out)?, n * inner, |x, o| {
            softmax_typed::<f64>(x, o, n, inner, log)
        }),
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

/// Contiguous f32 rows through the table: the same steps, in the same order,
/// as [`softmax_row`], so the generic table reproduces it bit for bit.
fn softmax_rows_f32(x: &[f32], out: &mut [f32], n: usize, log: bool, table: &KernelTable) {
    if n == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let max = table.max_f32(xr);
        or.copy_from_slice(xr);
        let sum = table.exp_sum_f32(or, max);
        if log {
            let lse = sum.ln() as f32;
            for (o, &v) in or.iter_mut().zip(xr) {
                *o = v - max - lse;
            }
        } else {
            let inv = (1.0 / sum) as f32;
            or.iter_mut().for_each(|o| *o *= inv);
        }
    }
}

fn softmax_typed<T: Real>(x: &[T], out: &mut [T], n: usize, inner: usize, log: bool) {
    if n == 0 || inner == 0 {
        return;
    }
    for (xb, ob) in x.chunks_exact(n * inner).zip(out.chunks_exact_mut(n * inner)) {
        for j in 0..inner {
            // Row elements sit `inner` apart; inner == 1 is the contiguous case.
            softmax_row(xb, ob, j, inner, n, log);
        }
    }
}

/// Softmax of `x[off + i*stride]` for i in 0..n. A row of all -inf yields NaN,
/// as torch does (masked-out attention rows).
pub(crate) fn softmax_row<T: Real>(x: &[T], out: &mut [T], off: usize, stride: usize, n: usize, log: bool) {
    let mut max = T::NEG_INFINITY;
    for i in 0..n {
        let v = x[off + i * stride];
        if v > max || v.is_nan() {
            max = v;
        }
    }
    // Sum in f64: rows can be long (vocabulary softmax) and f32 sums drift.
    let mut sum = 0.0f64;
    for i in 0..n {
        sum += (x[off + i * stride] - max).exp().to_f64();
    }
    if log {
        let lse = T::from_f64(sum.ln());
        for i in 0..n {
            out[off + i * stride] = x[off + i * stride] - max - lse;
        }
    } else {
        let inv = T::from_f64(1.0 / sum);
        for i in 0..n {
            out[off + i * stride] = (x[off + i * stride] - max).exp() * inv;
        }
    }
}
