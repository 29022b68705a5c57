//! Max / average pooling over the trailing 1-3 dims, and adaptive average
//! pooling. Lower-rank windows run as 3-d ones with leading unit dims.

use super::common::*;
use super::conv::valid_columns;
use super::math::Real;
use crate::context::Context;
use crate::parallel::{Threads, ELEMENT_CHUNK};
use crate::types::{DType, PoolKind, Result, TensorMut, TensorRef};

/// Window geometry over the trailing `kernel.len()` dims. The output size is
/// read from the output shape so the caller decides ceil_mode.
#[derive(Copy, Clone, Debug)]
pub struct PoolParams<'a> {
    pub kernel: &'a [usize],
    pub stride: &'a [usize],
    pub padding: &'a [usize],
    pub dilation: &'a [usize],
    pub count_include_pad: bool,
    /// Avg only: divide each window's sum by this instead of its tap count
    /// (torch's `divisor_override`).
    pub divisor: Option<i64>,
}

struct Window {
    input: [usize; 3],
    output: [usize; 3],
    kernel: [usize; 3],
    stride: [usize; 3],
    pad: [usize; 3],
    dil: [usize; 3],
}

fn window(x: &[usize], out: &[usize], p: &PoolParams) -> Result<(Window, usize)> {
    const K: &str = "pool";
    let nk = p.kernel.len();
    if !(1..=3).contains(&nk) {
        return Err(shape_err(K, format!("kernel {:?} must have 1-3 dims", p.kernel)));
    }
    for (name, v) in [("stride", p.stride), ("padding", p.padding), ("dilation", p.dilation)] {
        if v.len() != nk {
            return Err(shape_err(K, format!("{name} {v:?} must have {nk} entries")));
        }
    }
    let r = x.len();
    if r < nk || out.len() != r || x[..r - nk] != out[..r - nk] {
        return Err(shape_err(K, format!("input {x:?} and output {out:?} must share all but the {nk} pooled dims")));
    }
    let mut w = Window { input: [1; 3], output: [1; 3], kernel: [1; 3], stride: [1; 3], pad: [0; 3], dil: [1; 3] };
    for i in 0..nk {
        let d = 3 - nk + i;
        w.input[d] = x[r - nk + i];
        w.output[d] = out[r - nk + i];
        w.kernel[d] = p.kernel[i];
        w.stride[d] = p.stride[i];
        w.pad[d] = p.padding[i];
        w.dil[d] = p.dilation[i];
        if w.kernel[d] == 0 || w.stride[d] == 0 || w.dil[d] == 0 {
            return Err(shape_err(K, "kernel, stride and dilation must be >= 1"));
        }
        // torch's ceil_mode rule: the last window must start inside the input
        // or the left padding.
        if w.output[d] > 0 && (w.output[d] - 1) * w.stride[d] >= w.input[d] + w.pad[d] {
            return Err(shape_err(
                K,
                format!("output size {} too large for input {} in pooled dim {i}", w.output[d], w.input[d]),
            ));
        }
    }
    let planes = x[..r - nk].iter().product();
    Ok((w, planes))
}

/// Max or average pooling into `out` (x's dtype), or max pooling's indices
/// into `out` (i64) for [`PoolKind::ArgMax`].
pub fn pool(kind: PoolKind, x: TensorRef, p: &PoolParams, out: TensorMut) -> Result<()> {
    pool_with(kind, x, p, out, Threads::single())
}

/// [`pool`] on `cx`'s threads: whole planes (batch × channel) per thread,
/// in fixed groups, so the result is the same at any thread count.
pub fn pool_cx(kind: PoolKind, x: TensorRef, p: &PoolParams, out: TensorMut, cx: &mut Context) -> Result<()> {
    pool_with(kind, x, p, out, cx.threads())
}

fn pool_with(kind: PoolKind, x: TensorRef, p: &PoolParams, mut out: TensorMut, threads: Threads) -> Result<()> {
    const K: &str = "pool";
    let out_dtype = if kind == PoolKind::ArgMax { DType::I64 } else { x.dtype };
    expect_dtype(K, "out", out.dtype, out_dtype)?;
    if let Some(d) = p.divisor {
        if kind != PoolKind::Avg || d == 0 {
            return Err(shape_err(K, format!("divisor {d} needs avg pooling and must not be 0")));
        }
    }
    let (w, planes) = window(x.shape, out.shape, p)?;
    let isp: usize = w.input.iter().product();
    let osp: usize = w.output.iter().product();
    // Groups of whole planes of about ELEMENT_CHUNK outputs (an empty output
    // has no group to run); small outputs are not worth waking the pool for.
    let group = (ELEMENT_CHUNK / osp.max(1)).max(1);
    let threads = if planes * osp < 2 * ELEMENT_CHUNK { Threads::single() } else { threads };
    let (include_pad, divisor) = (p.count_include_pad, p.divisor);
    // Pools `group` planes (or fewer, the last) of `xs` into `os`.
    fn planes_of<T: Real, O: Send>(
        xs: &[T],
        out: &mut [O],
        osp: usize,
        isp: usize,
        group: usize,
        threads: Threads,
        one: impl Fn(&[T], usize, &mut [O]) + Send + Sync,
    ) {
        threads.for_each_chunk(out, group * osp, |i, o| one(&xs[i * group * isp..], o.len() / osp, o));
    }
    macro_rules! run {
        ($T:ty) => {{
            let xs = view::<$T>(K, "x", &x)?;
            if kind == PoolKind::ArgMax {
                let ov = view_mut::<i64>(K, "out", &mut out)?;
                planes_of(xs, ov, osp, isp, group, threads, |xs, planes, o| {
                    let windows = Windows { w: &w, planes, include_pad, divisor };
                    pool_typed::<$T>(kind, xs, windows, |j, _, i| o[j] = i)
                })
            } else {
                let ov = view_mut::<$T>(K, "out", &mut out)?;
                planes_of(xs, ov, osp, isp, group, threads, |xs, planes, o| {
                    if kind == PoolKind::Max && is_plain_2d(&w) {
                        max_pool_plain_2d::<$T>(xs, &w, planes, o)
                    } else {
                        let windows = Windows { w: &w, planes, include_pad, divisor };
                        pool_typed::<$T>(kind, xs, windows, |j, v, _| o[j] = v)
                    }
                })
            }
        }};
    }
    match x.dtype {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

/// Max pooling's values (x's dtype) and indices (i64, flat within each
/// plane) in one pass: exactly what [`pool`] gives for [`PoolKind::Max`] and
/// [`PoolKind::ArgMax`] (first maximum in window order, the last NaN wins).
pub fn max_pool_with_indices(
    x: TensorRef,
    p: &PoolParams,
    mut values_out: TensorMut,
    mut indices_out: TensorMut,
) -> Result<()> {
    const K: &str = "pool";
    expect_dtype(K, "out", values_out.dtype, x.dtype)?;
    expect_dtype(K, "out", indices_out.dtype, DType::I64)?;
    if values_out.shape != indices_out.shape {
        return Err(shape_err(
            K,
            format!("values {:?} and indices {:?} must have one shape", values_out.shape, indices_out.shape),
        ));
    }
    if p.divisor.is_some() {
        return Err(shape_err(K, "a divisor needs avg pooling"));
    }
    let (w, planes) = window(x.shape, values_out.shape, p)?;
    let windows = Windows { w: &w, planes, include_pad: p.count_include_pad, divisor: None };
    let iv = view_mut::<i64>(K, "out", &mut indices_out)?;
    macro_rules! run {
        ($T:ty) => {{
            let vv = view_mut::<$T>(K, "out", &mut values_out)?;
            pool_typed::<$T>(PoolKind::Max, view(K, "x", &x)?, windows, |o, v, i| {
                vv[o] = v;
                iv[o] = i;
            })
        }};
    }
    match x.dtype {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

/// Taps of one window along dim `d`: the range of kernel offsets `k` whose
/// input coordinate is inside the input, and the number of taps torch counts
/// for `count_include_pad` (those before the end of the right padding).
#[inline]
fn taps(o: usize, w: &Window, d: usize) -> (usize, usize, usize) {
    let start = o * w.stride[d]; // window start in padded coordinates
    let (pad, dil, kn) = (w.pad[d], w.dil[d], w.kernel[d]);
    let taps_below = |limit: usize| if limit > start { (limit - start).div_ceil(dil).min(kn) } else { 0 };
    let lo = taps_below(pad);
    let hi = taps_below(w.input[d] + pad);
    let padded = taps_below(w.input[d] + 2 * pad);
    (lo, hi.max(lo), padded)
}

/// The windows [`pool_typed`] walks, and what an average divides by.
#[derive(Copy, Clone)]
struct Windows<'a> {
    w: &'a Window,
    planes: usize,
    include_pad: bool,
    divisor: Option<i64>,
}

/// One loop for every kind: each window yields its value and, for max, the
/// flat index of the element chosen; `emit(o, value, index)` stores what
/// output element `o` (flat over every plane) holds.
fn pool_typed<T: Real>(kind: PoolKind, x: &[T], s: Windows, mut emit: impl FnMut(usize, T, i64)) {
    let w = s.w;
    let isp: usize = w.input.iter().product();
    let osp: usize = w.output.iter().product();
    if osp == 0 {
        return;
    }
    let [_, ih, iw] = w.input;
    for pl in 0..s.planes {
        let xp = &x[pl * isp..(pl + 1) * isp];
        let mut o = pl * osp;
        for oz in 0..w.output[0] {
            let (z0, z1, pz) = taps(oz, w, 0);
            for oy in 0..w.output[1] {
                let (y0, y1, py) = taps(oy, w, 1);
                for ox in 0..w.output[2] {
                    let (x0, x1, px) = taps(ox, w, 2);
                    let coord = |o: usize, k: usize, d: usize| o * w.stride[d] + k * w.dil[d] - w.pad[d];
                    // torch starts from -inf at the window's first in-bounds tap,
                    // so an all -inf window reports that tap's index. Signed: an
                    // empty window's first tap may lie outside the input.
                    let first =
                        |o: usize, k: usize, d: usize| (o * w.stride[d] + k * w.dil[d]) as i64 - w.pad[d] as i64;
                    let mut idx = (first(oz, z0, 0) * ih as i64 + first(oy, y0, 1)) * iw as i64 + first(ox, x0, 2);
                    let mut acc = match kind {
                        PoolKind::Max | PoolKind::ArgMax => T::NEG_INFINITY,
                        PoolKind::Avg => T::ZERO,
                    };
                    for kz in z0..z1 {
                        let z = coord(oz, kz, 0);
                        for ky in y0..y1 {
                            let y = coord(oy, ky, 1);
                            let row = (z * ih + y) * iw;
                            for kx in x0..x1 {
                                let xi = coord(ox, kx, 2);
                                let v = xp[row + xi];
                                match kind {
                                    // The first maximum in window order wins, and
                                    // every NaN replaces it (so the last NaN), as in torch.
                                    PoolKind::Max | PoolKind::ArgMax => {
                                        if v > acc || v.is_nan() {
                                            acc = v;
                                            idx = (row + xi) as i64;
                                        }
                                    }
                                    PoolKind::Avg => acc += v,
                                }
                            }
                        }
                    }
                    if kind == PoolKind::Avg {
                        let div = match s.divisor {
                            Some(d) => d as f64,
                            None if s.include_pad => (pz * py * px) as f64,
                            None => ((z1 - z0) * (y1 - y0) * (x1 - x0)) as f64,
                        };
                        acc = acc / T::from_f64(div);
                    }
                    emit(o, acc, idx);
                    o += 1;
                }
            }
        }
    }
}

/// A 2-D window without dilation (padding and ceil-mode overhang allowed):
/// the common `MaxPool2d(k, s, p)` (ResNet's 3×3/2 with padding 1).
fn is_plain_2d(w: &Window) -> bool {
    w.input[0] == 1 && w.kernel[0] == 1 && w.pad[0] == 0 && w.dil == [1; 3]
}

/// Max pooling over plain 2-D windows, a whole output row at a time: for
/// each in-bounds input row of the row's windows and each tap column `kx`,
/// the output columns whose tap lands inside the input form one interval
/// (computed once per plane), and the inner loop takes a branch-free
/// running maximum along it (a data-dependent branch per tap mispredicted
/// half the time: this kernel took 11 % of ResNet-18). Each output still
/// sees its in-bounds taps in the general loop's order (rows, then
/// columns), so the result is the same value, NaNs included.
fn max_pool_plain_2d<T: Real>(x: &[T], w: &Window, planes: usize, out: &mut [T]) {
    let [_, ih, iw] = w.input;
    let [_, oh, ow] = w.output;
    let ([_, kh, kw], [_, sh, sw], [_, ph, pw]) = (w.kernel, w.stride, w.pad);
    // The in-bounds rows of window row `oy`: input rows [lo, hi).
    let rows = |oy: usize| {
        let start = oy * sh;
        (start.saturating_sub(ph).min(ih), (start + kh).saturating_sub(ph).min(ih))
    };
    // The stride-2 rows' halves (`max_row_stride2`).
    let mut halves = [[T::ZERO; SPLIT_ROW]; 2];
    for (xp, op) in x.chunks_exact(ih * iw).zip(out.chunks_exact_mut(oh * ow)).take(planes) {
        for (oy, orow) in op.chunks_exact_mut(ow).enumerate() {
            orow.fill(T::NEG_INFINITY);
            let (y0, y1) = rows(oy);
            for xrow in xp.chunks_exact(iw).take(y1).skip(y0) {
                if sw == 2 && iw <= 2 * SPLIT_ROW {
                    max_row_stride2(orow, xrow, kw, pw, &mut halves);
                    continue;
                }
                for kx in 0..kw {
                    let (lo, hi) = valid_columns(kx, pw, sw, iw, ow);
                    if lo < hi {
                        let first = lo * sw + kx - pw;
                        max_into(&mut orow[lo..hi], &xrow[first..], sw);
                    }
                }
            }
        }
    }
}

/// Widest half row [`max_row_stride2`] splits (on the stack).
const SPLIT_ROW: usize = 256;

/// One input row's taps of a stride-2 output row: the row split once into
/// its even and odd elements, so every tap reads a contiguous run of one
/// half. The stride-2 loop compiled to scalar code on the baseline x86-64
/// target (6 % of ResNet-18's cycles for its 3×3/2 max pool); unit-stride
/// runs vectorise. Same taps in the same order per output.
fn max_row_stride2<T: Real>(orow: &mut [T], xrow: &[T], kw: usize, pw: usize, halves: &mut [[T; SPLIT_ROW]; 2]) {
    let iw = xrow.len();
    let [even, odd] = halves;
    for (k, pair) in xrow.chunks(2).enumerate() {
        even[k] = pair[0];
        if let Some(&v) = pair.get(1) {
            odd[k] = v;
        }
    }
    let ow = orow.len();
    for kx in 0..kw {
        let (lo, hi) = valid_columns(kx, pw, 2, iw, ow);
        if lo < hi {
            let first = lo * 2 + kx - pw;
            let half = &halves[first % 2];
            max_into(&mut orow[lo..hi], &half[first / 2..], 1);
        }
    }
}

/// `dst[j] = max(dst[j], src[j * stride])`, where a NaN `src` always wins
/// (torch's rule), as a select the compiler keeps branch-free.
#[inline(always)]
fn max_into<T: Real>(dst: &mut [T], src: &[T], stride: usize) {
    let pick = |acc: T, v: T| if v > acc || v.is_nan() { v } else { acc };
    if stride == 1 {
        let src = &src[..dst.len()];
        for (o, &v) in dst.iter_mut().zip(src) {
            *o = pick(*o, v);
        }
    } else if stride == 2 {
        // A constant stride (ResNet's 3×3/2): the even elements become a
        // permute instead of a gather.
        let src = &src[..2 * dst.len() - 1];
        for (j, o) in dst.iter_mut().enumerate() {
            *o = pick(*o, src[2 * j]);
        }
    } else {
        for (j, o) in dst.iter_mut().enumerate() {
            *o = pick(*o, src[j * stride]);
        }
    }
}

/// [`pool_cx`] (max or average values) of a channels-last 2-d input `x`
/// (`[N, H, W, C]`) into `out` (`[N, OH, OW, C]`). Each output pixel is
/// its window's taps folded over the pixel's `C` contiguous values, the taps
/// in the channels-first loop's order (rows, then columns), so every
/// element is the same value as there (NaNs and signed zeros included) —
/// and the inner loop runs along channels, which vectorises. Whole output
/// rows per work item, in a fixed split: the same bytes at any thread
/// count. Max pooling also takes i8 values (int8 activations between
/// quantized layers: the maximum of values quantized with one scale and
/// zero point is the quantized maximum, as quantizing is monotone).
pub fn pool_channels_last_cx(
    kind: PoolKind,
    x: TensorRef,
    p: &PoolParams,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "pool";
    if kind == PoolKind::ArgMax {
        return Err(shape_err(K, "channels-last pooling writes values, not indices"));
    }
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if p.divisor.is_some_and(|d| kind != PoolKind::Avg || d == 0) {
        return Err(shape_err(K, "a divisor needs avg pooling and must not be 0"));
    }
    let (xs, os) = (x.shape, out.shape);
    if p.kernel.len() != 2 || xs.len() != 4 || os.len() != 4 || xs[3] != os[3] {
        return Err(shape_err(K, format!("channels-last pooling is 2-d: input {xs:?}, output {os:?} [N, H, W, C]")));
    }
    // The geometry is the channels-first view's.
    let (w, _) = window(&[xs[0], xs[3], xs[1], xs[2]], &[os[0], os[3], os[1], os[2]], p)?;
    let rows = os[0] * os[1];
    let row_len = os[2] * os[3];
    if row_len == 0 || rows == 0 {
        return Ok(());
    }
    let s = Windows { w: &w, planes: 1, include_pad: p.count_include_pad, divisor: p.divisor };
    let image = xs[1] * xs[2] * xs[3];
    let rows_per_item = (ELEMENT_CHUNK / row_len).max(1);
    let threads = if rows * row_len < 2 * ELEMENT_CHUNK { Threads::single() } else { cx.threads() };
    macro_rules! run {
        ($T:ty) => {{
            let xv = view::<$T>(K, "x", &x)?;
            let ov = view_mut::<$T>(K, "out", &mut out)?;
            threads.for_each_chunk(ov, rows_per_item * row_len, |item, part| {
                for (r, orow) in part.chunks_exact_mut(row_len).enumerate() {
                    let row = item * rows_per_item + r;
                    let (n, oy) = (row / os[1], row % os[1]);
                    pool_row_channels_last::<$T>(kind, &xv[n * image..][..image], s, oy, xs[3], orow);
                }
            })
        }};
    }
    match x.dtype {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        DType::I8 if kind == PoolKind::Max => {
            let xv: &[i8] = bytemuck::cast_slice(x.data);
            let ov: &mut [i8] = bytemuck::cast_slice_mut(out.data);
            if xv.len() != xs.iter().product::<usize>() || ov.len() != rows * row_len {
                return Err(shape_err(K, "input or output length does not match its shape"));
            }
            threads.for_each_chunk(ov, rows_per_item * row_len, |item, part| {
                for (r, orow) in part.chunks_exact_mut(row_len).enumerate() {
                    let row = item * rows_per_item + r;
                    let (n, oy) = (row / os[1], row % os[1]);
                    max_row_channels_last_i8(&xv[n * image..][..image], s, oy, xs[3], orow);
                }
            })
        }
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

/// [`pool_row_channels_last`]'s max pooling of i8 values.
fn max_row_channels_last_i8(image: &[i8], s: Windows, oy: usize, c: usize, orow: &mut [i8]) {
    let w = s.w;
    let iw = w.input[2];
    let (y0, y1, _) = taps(oy, w, 1);
    let at = |o: usize, k: usize, d: usize| o * w.stride[d] + k * w.dil[d] - w.pad[d];
    for (ox, acc) in orow.chunks_exact_mut(c).enumerate() {
        let (x0, x1, _) = taps(ox, w, 2);
        acc.fill(i8::MIN);
        for ky in y0..y1 {
            let row = at(oy, ky, 1) * iw;
            for kx in x0..x1 {
                let v = &image[(row + at(ox, kx, 2)) * c..][..c];
                acc.iter_mut().zip(v).for_each(|(a, &v)| *a = (*a).max(v));
            }
        }
    }
}

/// Output row `oy` (`[OW, C]`) of one channels-last image (`[H, W, C]`).
fn pool_row_channels_last<T: Real>(kind: PoolKind, image: &[T], s: Windows, oy: usize, c: usize, orow: &mut [T]) {
    let w = s.w;
    let iw = w.input[2];
    let (y0, y1, py) = taps(oy, w, 1);
    let at = |o: usize, k: usize, d: usize| o * w.stride[d] + k * w.dil[d] - w.pad[d];
    for (ox, acc) in orow.chunks_exact_mut(c).enumerate() {
        let (x0, x1, px) = taps(ox, w, 2);
        acc.fill(if kind == PoolKind::Avg { T::ZERO } else { T::NEG_INFINITY });
        for ky in y0..y1 {
            let row = at(oy, ky, 1) * iw;
            for kx in x0..x1 {
                let v = &image[(row + at(ox, kx, 2)) * c..][..c];
                if kind == PoolKind::Avg {
                    acc.iter_mut().zip(v).for_each(|(a, &v)| *a += v);
                } else {
                    max_into(acc, v, 1);
                }
            }
        }
        if kind == PoolKind::Avg {
            let div = match s.divisor {
                Some(d) => d as f64,
                None if s.include_pad => (py * px) as f64,
                None => ((y1 - y0) * (x1 - x0)) as f64,
            };
            let div = T::from_f64(div);
            acc.iter_mut().for_each(|a| *a = *a / div);
        }
    }
}

/// torch adaptive_avg_pool: output cell i averages input [floor(i·in/out),
/// ceil((i+1)·in/out)). Pools every trailing dim from the first one whose size
/// differs (at most 3); equal dims map to themselves.
pub fn adaptive_avg_pool(x: TensorRef, mut out: TensorMut) -> Result<()> {
    const K: &str = "adaptive_avg_pool";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    let r = x.shape.len();
    if out.shape.len() != r {
        return Err(shape_err(K, format!("input {:?} and output {:?} ranks differ", x.shape, out.shape)));
    }
    let first = (0..r).find(|&i| x.shape[i] != out.shape[i]).unwrap_or(r);
    let first = first.min(r.saturating_sub(1)); // pool at least one dim, keeps loops uniform
    let nk = r - first;
    if nk > 3 {
        return Err(shape_err(K, format!("{nk} pooled dims; at most 3 are supported")));
    }
    let mut input = [1usize; 3];
    let mut output = [1usize; 3];
    for i in 0..nk {
        input[3 - nk + i] = x.shape[first + i];
        output[3 - nk + i] = out.shape[first + i];
    }
    let planes: usize = x.shape[..first].iter().product();
    match x.dtype {
        DType::F32 => adaptive_typed::<f32>(view(K, "x", &x)?, input, output, planes, view_mut(K, "out", &mut out)?),
        DType::F64 => adaptive_typed::<f64>(view(K, "x", &x)?, input, output, planes, view_mut(K, "out", &mut out)?),
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

#[inline]
fn adaptive_range(i: usize, inp: usize, out: usize) -> (usize, usize) {
    (i * inp / out, ((i + 1) * inp).div_ceil(out))
}

fn adaptive_typed<T: Real>(x: &[T], input: [usize; 3], output: [usize; 3], planes: usize, out: &mut [T]) {
    let isp: usize = input.iter().product();
    let osp: usize = output.iter().product();
    if osp == 0 {
        return;
    }
    for pl in 0..planes {
        let xp = &x[pl * isp..];
        let mut o = pl * osp;
        for oz in 0..output[0] {
            let (z0, z1) = adaptive_range(oz, input[0], output[0]);
            for oy in 0..output[1] {
                let (y0, y1) = adaptive_range(oy, input[1], output[1]);
                for ox in 0..output[2] {
                    let (x0, x1) = adaptive_range(ox, input[2], output[2]);
                    let mut sum = 0.0f64;
                    for z in z0..z1 {
                        for y in y0..y1 {
                            let row = &xp[(z * input[1] + y) * input[2]..];
                            sum += row[x0..x1].iter().map(|v| v.to_f64()).sum::<f64>();
                        }
                    }
                    let n = (z1 - z0) * (y1 - y0) * (x1 - x0);
                    out[o] = T::from_f64(sum / n as f64);
                    o += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-at-a-time max pooling gives the general loop's bits (NaNs,
    /// infinities, padding, ceil-mode overhang, odd sizes, strides 1–3).
    #[test]
    fn plain_2d_max_matches_the_general_loop() {
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            match seed >> 28 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                _ => (seed >> 8) as f32 / (1 << 24) as f32 - 0.5,
            }
        };
        for (ih, iw) in [(1, 1), (7, 5), (17, 13), (8, 9), (5, 40), (3, 513)] {
            for (k, s, p) in [(1, 1, 0), (2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 3, 1), (3, 3, 0)] {
                for ceil in [false, true] {
                    let size = |n: usize| {
                        let span = (n + 2 * p).saturating_sub(k);
                        let o = if ceil { span.div_ceil(s) + 1 } else { span / s + 1 };
                        // torch drops a last window that starts in the right padding.
                        if ceil && (o - 1) * s >= n + p {
                            o - 1
                        } else {
                            o
                        }
                    };
                    if ih + 2 * p < k || iw + 2 * p < k {
                        continue;
                    }
                    let (oh, ow) = (size(ih), size(iw));
                    let w = Window {
                        input: [1, ih, iw],
                        output: [1, oh, ow],
                        kernel: [1, k, k],
                        stride: [1, s, s],
                        pad: [0, p, p],
                        dil: [1; 3],
                    };
                    let planes = 3;
                    let x: Vec<f32> = (0..planes * ih * iw).map(|_| next()).collect();
                    let mut fast = vec![0.0f32; planes * oh * ow];
                    max_pool_plain_2d(&x, &w, planes, &mut fast);
                    let mut general = vec![0.0f32; fast.len()];
                    let windows = Windows { w: &w, planes, include_pad: false, divisor: None };
                    pool_typed::<f32>(PoolKind::Max, &x, windows, |j, v, _| general[j] = v);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&fast), bits(&general), "{ih}x{iw} k{k} s{s} p{p} ceil {ceil}");
                }
            }
        }
    }
}
