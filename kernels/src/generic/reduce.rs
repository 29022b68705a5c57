//! Reductions over a set of axes, and argmax.

use super::common::*;
use super::vector::column_sum;
use crate::context::Context;
use crate::parallel::{SharedMut, Threads, ELEMENT_CHUNK};
use crate::table::KernelTable;
use crate::types::{DType, KernelError, ReduceKind, Result, ScanKind, Scratch, TensorMut, TensorRef};

/// Dims of one kind (kept or reduced) after merging adjacent dims of the same
/// kind and dropping unit dims: sizes plus element strides into x.
#[derive(Clone, Copy)]
struct Dims {
    rank: usize,
    shape: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
}

impl Dims {
    fn count(&self) -> usize {
        self.shape[..self.rank].iter().product()
    }

    /// The element offset of row-major index `i` (`i < count()`).
    fn offset(&self, mut i: usize) -> usize {
        let mut off = 0;
        for d in (0..self.rank).rev() {
            off += (i % self.shape[d]) * self.strides[d];
            i /= self.shape[d];
        }
        off
    }

    /// Calls `f(offset)` for every index, in row-major order.
    #[inline]
    fn for_each(&self, base: usize, mut f: impl FnMut(usize)) {
        if self.rank == 0 {
            f(base);
            return;
        }
        let r = self.rank;
        let (inner, is) = (self.shape[r - 1], self.strides[r - 1]);
        let mut idx = [0usize; MAX_RANK];
        let mut off = base;
        loop {
            for i in 0..inner {
                f(off + i * is);
            }
            // Odometer over the outer dims.
            let mut d = r - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                off += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                off -= self.strides[d] * self.shape[d];
                idx[d] = 0;
            }
        }
    }
}

fn split_dims(shape: &[usize], axes: &[usize]) -> (Dims, Dims) {
    let mut st = [0usize; MAX_RANK];
    strides_of(shape, &mut st[..shape.len()]);
    let mut kept = Dims { rank: 0, shape: [1; MAX_RANK], strides: [0; MAX_RANK] };
    let mut red = Dims { rank: 0, shape: [1; MAX_RANK], strides: [0; MAX_RANK] };
    let mut last_reduced = None;
    for (i, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let is_red = axes.contains(&i);
        let d = if is_red { &mut red } else { &mut kept };
        if last_reduced == Some(is_red) && d.rank > 0 {
            // Same kind as the previous dim and contiguous with it: merge.
            d.shape[d.rank - 1] *= n;
            d.strides[d.rank - 1] = st[i];
        } else {
            d.shape[d.rank] = n;
            d.strides[d.rank] = st[i];
            d.rank += 1;
        }
        last_reduced = Some(is_red);
    }
    (kept, red)
}

fn reduce_core<T: Scalar, A: Copy>(
    x: &[T],
    out: &mut [T],
    kept: &Dims,
    red: &Dims,
    init: A,
    fold: impl Fn(A, T) -> A,
    finish: impl Fn(A) -> T,
) {
    let mut o = 0;
    kept.for_each(0, |base| {
        let mut acc = init;
        if red.rank == 1 && red.strides[0] == 1 {
            // Contiguous trailing reduction: a plain slice fold.
            for &v in &x[base..base + red.shape[0]] {
                acc = fold(acc, v);
            }
        } else {
            red.for_each(base, |i| acc = fold(acc, x[i]));
        }
        out[o] = finish(acc);
        o += 1;
    });
}

/// Reduces `x` over `axes` (sorted, unique). `out` may keep the reduced dims as
/// 1 or drop them; only its element count is checked.
pub fn reduce(kind: ReduceKind, x: TensorRef, axes: &[usize], out: TensorMut) -> Result<()> {
    reduce_with(kind, x, axes, out, crate::table::best(), Threads::single(), &mut Scratch::new())
}

/// [`reduce`] with float sums and means shared out over `cx`'s threads
/// (every split of a sum fixed by the shapes alone, its pieces combined in a
/// fixed order: the same bits at any thread count), calling through `cx`'s
/// kernel table and using its scratch.
pub fn reduce_cx(kind: ReduceKind, x: TensorRef, axes: &[usize], out: TensorMut, cx: &mut Context) -> Result<()> {
    let threads = cx.threads();
    reduce_with(kind, x, axes, out, cx.table, threads, &mut cx.scratch)
}

fn reduce_with(
    kind: ReduceKind,
    x: TensorRef,
    axes: &[usize],
    mut out: TensorMut,
    table: &KernelTable,
    threads: Threads,
    scratch: &mut Scratch,
) -> Result<()> {
    const K: &str = "reduce";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    check_rank(K, x.shape)?;
    if axes.windows(2).any(|w| w[0] >= w[1]) || axes.last().is_some_and(|&a| a >= x.shape.len()) {
        return Err(shape_err(K, format!("axes {axes:?} must be sorted, unique and < rank {}", x.shape.len())));
    }
    let (kept, red) = split_dims(x.shape, axes);
    let kept_n: usize = (0..x.shape.len()).filter(|i| !axes.contains(i)).map(|i| x.shape[i]).product();
    let red_n: usize = axes.iter().map(|&a| x.shape[a]).product();
    if numel(K, out.shape)? != kept_n {
        return Err(shape_err(K, format!("output {:?} must hold {kept_n} elements", out.shape)));
    }
    if red_n == 0 && matches!(kind, ReduceKind::Max | ReduceKind::Min) && kept_n > 0 {
        return Err(shape_err(K, "max/min of an empty reduction has no identity"));
    }
    debug_assert!(kept.count() == kept_n && red.count() == red_n);
    let count = red_n as f64;
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        if kept_n == 0 {
            return Ok(());
        }
        let threads = if xv.len() < 2 * ELEMENT_CHUNK { Threads::single() } else { threads };
        let fin = |a: f64| if matches!(kind, ReduceKind::Mean) { a / count } else { a };
        if T::IS_FLOAT
            && matches!(kind, ReduceKind::Sum | ReduceKind::Mean)
            && (sum_channels_last(xv, ov, &kept, &red, fin, table, threads, scratch)
                || sum_fast(xv, ov, &kept, &red, fin, threads))
        {
            return Ok(());
        }
        if T::IS_FLOAT {
            let mut run = |init: f64, fold: fn(f64, f64) -> f64, fin: &dyn Fn(f64) -> f64| {
                reduce_core(xv, &mut *ov, &kept, &red, init, |a, v: T| fold(a, v.to_f64()), |a| T::from_f64(fin(a)))
            };
            match kind {
                ReduceKind::Sum => run(0.0, |a, v| a + v, &|a| a),
                ReduceKind::Mean => run(0.0, |a, v| a + v, &|a| a / count),
                ReduceKind::Prod => run(1.0, |a, v| a * v, &|a| a),
                // NaN-propagating, like torch.amax / amin.
                ReduceKind::Max => run(f64::NEG_INFINITY, |a, v| if a.is_nan() || a >= v { a } else { v }, &|a| a),
                ReduceKind::Min => run(f64::INFINITY, |a, v| if a.is_nan() || a <= v { a } else { v }, &|a| a),
            }
        } else {
            let is_bool = T::DTYPE == DType::Bool;
            let mut run = |init: i64, fold: fn(i64, i64) -> i64| {
                reduce_core(xv, &mut *ov, &kept, &red, init, |a, v: T| fold(a, v.to_i64()), T::from_i64)
            };
            match kind {
                ReduceKind::Sum if !is_bool => run(0, |a, v| a.wrapping_add(v)),
                ReduceKind::Prod if !is_bool => run(1, |a, v| a.wrapping_mul(v)),
                // Bool max/min are any/all.
                ReduceKind::Max => run(i64::MIN, |a, v| a.max(v)),
                ReduceKind::Min => run(i64::MAX, |a, v| a.min(v)),
                _ => return Err(dtype_err(K, x.dtype)),
            }
        }
    });
    Ok(())
}

/// The most pieces [`sum_channels_last`] cuts one output row's pixels
/// into: bounds its f64 partial sums to this many rows of channels.
const MAX_PARTS: usize = 64;

/// Float sums over the pixels of channels-last images (the global mean of
/// a squeeze-excite block, `x` [.., pixels, C] reduced over the pixels): the
/// pixels of each image are cut into parts of about [`ELEMENT_CHUNK`]
/// elements (a cut that depends on the shape alone), each part's channel
/// sums are accumulated in f64 by the table's column sum into its own row
/// of partial sums, and each output adds its parts' sums in part order.
/// So every thread reads whole contiguous rows, small images with many
/// channels and large ones with few both split into enough items to share
/// out, and the bits do not depend on the thread count. Returns false
/// (nothing written) for other layouts.
#[allow(clippy::too_many_arguments)]
fn sum_channels_last<T: Scalar>(
    x: &[T],
    out: &mut [T],
    kept: &Dims,
    red: &Dims,
    fin: impl Fn(f64) -> f64,
    table: &KernelTable,
    threads: Threads,
    scratch: &mut Scratch,
) -> bool {
    let r = kept.rank;
    if r == 0 || kept.strides[r - 1] != 1 || red.rank != 1 || red.strides[0] != kept.shape[r - 1] || red.shape[0] == 0 {
        return false;
    }
    let (c, pixels) = (kept.shape[r - 1], red.shape[0]);
    let outer = Dims { rank: r - 1, ..*kept };
    let per = (ELEMENT_CHUNK / c).max(pixels.div_ceil(MAX_PARTS)).max(1);
    let parts = pixels.div_ceil(per);
    let (partials, _) = scratch.split_f64(outer.count() * parts * c);
    threads.for_each_chunk(partials, c, |item, acc| {
        let (o, p0) = (item / parts, item % parts * per);
        let start = outer.offset(o) + p0 * c;
        let rows = &x[start..start + per.min(pixels - p0) * c];
        acc.fill(0.0);
        match bytemuck::try_cast_slice::<T, f32>(rows) {
            Ok(rows) if T::DTYPE == DType::F32 => table.column_sum_f32(rows, acc),
            _ => column_sum(rows, acc),
        }
    });
    for (sums, y) in partials.chunks_exact(parts * c).zip(out.chunks_exact_mut(c)) {
        for (j, y) in y.iter_mut().enumerate() {
            let total = (1..parts).fold(sums[j], |a, p| a + sums[p * c + j]);
            *y = T::from_f64(fin(total));
        }
    }
    true
}

/// Output elements per work item of the fast sums.
const SUM_BLOCK: usize = 64;

/// Float sums on the two layouts that have a faster loop than
/// [`reduce_core`]'s one dependent chain of adds per output, with each
/// output's adds in the same order (so the same bits): every output sums
/// in f64, over the reduced offsets in `red`'s row-major order. Returns
/// false (nothing written) for other layouts.
///
/// - rows: the reduced dims are contiguous and trailing (a channels-first
///   global mean): [`SUM_BLOCK`] rows per item, four chains in flight;
/// - columns: the innermost kept dim is contiguous (a channels-last
///   global mean over H, W): each reduced offset adds a vector of up to
///   [`SUM_BLOCK`] consecutive outputs' inputs.
fn sum_fast<T: Scalar>(
    x: &[T],
    out: &mut [T],
    kept: &Dims,
    red: &Dims,
    fin: impl Fn(f64) -> f64 + Sync,
    threads: Threads,
) -> bool {
    let kept_n = kept.count();
    if x.is_empty() {
        return false;
    }
    if red.rank == 1 && red.strides[0] == 1 && kept_n * red.shape[0] == x.len() {
        let len = red.shape[0];
        threads.for_each_chunk(out, SUM_BLOCK, |item, o| {
            let x = &x[item * SUM_BLOCK * len..][..o.len() * len];
            sum_rows(x, o, len, &fin);
        });
        return true;
    }
    let r = kept.rank;
    if r == 0 || kept.strides[r - 1] != 1 {
        return false;
    }
    let inner = kept.shape[r - 1];
    let outer = Dims { rank: r - 1, ..*kept };
    let blocks = inner.div_ceil(SUM_BLOCK);
    let dst = SharedMut(out.as_mut_ptr());
    threads.for_each(outer.count() * blocks, |item| {
        let (o, c0) = (item / blocks, (item % blocks) * SUM_BLOCK);
        let n = SUM_BLOCK.min(inner - c0);
        let mut acc = [0f64; SUM_BLOCK];
        red.for_each(outer.offset(o) + c0, |i| {
            for (a, v) in acc[..n].iter_mut().zip(&x[i..i + n]) {
                *a += v.to_f64();
            }
        });
        // SAFETY: item `(o, block)` writes outputs `o * inner + c0..+n`,
        // disjoint from every other item's; `out` stays borrowed mutably
        // until `for_each` returns.
        let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(o * inner + c0), n) };
        for (y, &a) in o.iter_mut().zip(&acc) {
            *y = T::from_f64(fin(a));
        }
    });
    true
}

/// Sums rows of `len` consecutive elements of `x` into `out` (one each),
/// four rows at a time: four independent chains, each in row order.
fn sum_rows<T: Scalar>(x: &[T], out: &mut [T], len: usize, fin: &impl Fn(f64) -> f64) {
    let mut quads = out.chunks_exact_mut(4);
    let mut rows = x.chunks_exact(4 * len.max(1));
    for (o, x) in (&mut quads).zip(&mut rows) {
        let (r0, r1, r2, r3) = (&x[..len], &x[len..2 * len], &x[2 * len..3 * len], &x[3 * len..]);
        let mut acc = [0f64; 4];
        for i in 0..len {
            acc[0] += r0[i].to_f64();
            acc[1] += r1[i].to_f64();
            acc[2] += r2[i].to_f64();
            acc[3] += r3[i].to_f64();
        }
        for (y, a) in o.iter_mut().zip(acc) {
            *y = T::from_f64(fin(a));
        }
    }
    let rest = quads.into_remainder();
    let xr = &x[x.len() - rest.len() * len..];
    for (y, row) in rest.iter_mut().zip(xr.chunks_exact(len.max(1))) {
        *y = T::from_f64(fin(row.iter().fold(0.0, |a, v| a + v.to_f64())));
    }
}

/// Index (i64) of the first maximum along `axis`; a NaN counts as the maximum.
/// `out` may keep `axis` as 1 or drop it; only its element count is checked.
pub fn argmax(x: TensorRef, axis: usize, out: TensorMut) -> Result<()> {
    arg_extreme("argmax", x, axis, out, true)
}

/// Index (i64) of the first minimum along `axis`; a NaN counts as the minimum.
pub fn argmin(x: TensorRef, axis: usize, out: TensorMut) -> Result<()> {
    arg_extreme("argmin", x, axis, out, false)
}

#[allow(non_snake_case)] // `K` like the kernels' `const K`
fn arg_extreme(kernel: &'static str, x: TensorRef, axis: usize, mut out: TensorMut, max: bool) -> Result<()> {
    let K = kernel;
    expect_dtype(K, "out", out.dtype, DType::I64)?;
    if axis >= x.shape.len() {
        return Err(shape_err(K, format!("axis {axis} out of range for {:?}", x.shape)));
    }
    let n = x.shape[axis];
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    if numel(K, out.shape)? != outer * inner {
        return Err(shape_err(K, format!("output {:?} must hold {} elements", out.shape, outer * inner)));
    }
    if n == 0 && outer * inner > 0 {
        return Err(shape_err(K, "arg-extreme over an empty axis"));
    }
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let ov = view_mut::<i64>(K, "out", &mut out)?;
        for o in 0..outer {
            for j in 0..inner {
                let base = o * n * inner + j;
                let mut best = 0;
                let mut bv = xv[base];
                // `v != v` is the NaN test that works for every element type.
                #[allow(clippy::eq_op)]
                if bv == bv {
                    for i in 1..n {
                        let v = xv[base + i * inner];
                        if v != v {
                            best = i;
                            break;
                        }
                        if (max && v > bv) || (!max && v < bv) {
                            bv = v;
                            best = i;
                        }
                    }
                }
                ov[o * inner + j] = best as i64;
            }
        }
    });
    Ok(())
}

/// Inclusive prefix sum along `axis`; floats accumulate in f64, integers in
/// wrapping i64 (torch's CPU accumulation types are at least this wide).
pub fn cumsum(x: TensorRef, axis: usize, mut out: TensorMut) -> Result<()> {
    const K: &str = "cumsum";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if axis >= x.shape.len() || x.shape != out.shape {
        return Err(shape_err(K, format!("axis {axis}, input {:?}, output {:?}", x.shape, out.shape)));
    }
    let n = x.shape[axis];
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        for o in 0..outer {
            for j in 0..inner {
                let base = o * n * inner + j;
                if T::IS_FLOAT {
                    let mut acc = 0f64;
                    for i in 0..n {
                        acc += xv[base + i * inner].to_f64();
                        ov[base + i * inner] = T::from_f64(acc);
                    }
                } else {
                    let mut acc = 0i64;
                    for i in 0..n {
                        acc = acc.wrapping_add(xv[base + i * inner].to_i64());
                        ov[base + i * inner] = T::from_i64(acc);
                    }
                }
            }
        }
    });
    Ok(())
}

/// An inclusive scan along `axis` (torch's CPU `cumprod`, `logcumsumexp`,
/// `cummax`, `cummin`). Floats accumulate as torch's CPU accumulation type
/// does — f64 for f32/f64, f32 for f16/bf16 (emulated by rounding to f32
/// after each step) — integers in wrapping i64. The running max/min takes
/// a NaN at once and keeps it, and among equal values the later index
/// (torch compares with `>=` / `<=`).
pub fn scan(x: TensorRef, axis: usize, kind: ScanKind, mut out: TensorMut) -> Result<()> {
    const K: &str = "scan";
    let indices = matches!(kind, ScanKind::ArgMax | ScanKind::ArgMin);
    expect_dtype(K, "out", out.dtype, if indices { DType::I64 } else { x.dtype })?;
    if axis >= x.shape.len() || x.shape != out.shape {
        return Err(shape_err(K, format!("axis {axis}, input {:?}, output {:?}", x.shape, out.shape)));
    }
    if kind == ScanKind::LogSumExp && !x.dtype.is_float() {
        return Err(KernelError::UnsupportedDType { kernel: K, dtype: x.dtype });
    }
    let n = x.shape[axis];
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let half = matches!(x.dtype, DType::F16 | DType::BF16);
    // Rounds an f64 accumulator to the accumulation type.
    let acc = move |v: f64| if half { v as f32 as f64 } else { v };
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let lanes = (0..outer).flat_map(|o| (0..inner).map(move |j| o * n * inner + j));
        match kind {
            ScanKind::Prod | ScanKind::LogSumExp => {
                let ov = view_mut::<T>(K, "out", &mut out)?;
                for base in lanes {
                    if !T::IS_FLOAT {
                        let mut p = 1i64;
                        for i in 0..n {
                            p = p.wrapping_mul(xv[base + i * inner].to_i64());
                            ov[base + i * inner] = T::from_i64(p);
                        }
                        continue;
                    }
                    let mut r = if kind == ScanKind::Prod { 1.0 } else { f64::NEG_INFINITY };
                    for i in 0..n {
                        let v = acc(xv[base + i * inner].to_f64());
                        r = acc(if kind == ScanKind::Prod { r * v } else { log_add_exp(r, v, half) });
                        ov[base + i * inner] = T::from_f64(r);
                    }
                }
            }
            ScanKind::Max | ScanKind::Min | ScanKind::ArgMax | ScanKind::ArgMin => {
                let max = matches!(kind, ScanKind::Max | ScanKind::ArgMax);
                // `v != v`: NaN (integers never are).
                #[allow(clippy::eq_op)]
                let takes = |v: T, best: T| v != v || (best == best && if max { v >= best } else { v <= best });
                if indices {
                    let ov = view_mut::<i64>(K, "out", &mut out)?;
                    for base in lanes {
                        let (mut best, mut at) = (xv[base], 0);
                        for i in 0..n {
                            let v = xv[base + i * inner];
                            if takes(v, best) {
                                (best, at) = (v, i as i64);
                            }
                            ov[base + i * inner] = at;
                        }
                    }
                } else {
                    let ov = view_mut::<T>(K, "out", &mut out)?;
                    for base in lanes {
                        let mut best = xv[base];
                        for i in 0..n {
                            let v = xv[base + i * inner];
                            if takes(v, best) {
                                best = v;
                            }
                            ov[base + i * inner] = best;
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

/// torch's `_log_add_exp_helper`: `log1p(exp(min - max)) + max`, NaN
/// propagated, and `x` itself when both are the same infinity.
fn log_add_exp(x: f64, y: f64, in_f32: bool) -> f64 {
    let (lo, hi) = if y.is_nan() {
        (y, y)
    } else if x.is_nan() {
        (x, x)
    } else {
        (x.min(y), x.max(y))
    };
    if lo != hi || lo.is_finite() {
        if in_f32 {
            (((lo - hi) as f32).exp().ln_1p() + hi as f32) as f64
        } else {
            (lo - hi).exp().ln_1p() + hi
        }
    } else {
        x
    }
}

/// A run-time check: fails with `message` unless every element of `x` is
/// nonzero (a NaN counts as nonzero, as in torch's `bool(x)`).
pub fn assert_all(x: TensorRef, message: &str) -> Result<()> {
    const K: &str = "assert";
    let ok = with_scalar!(x.dtype, T, view::<T>(K, "x", &x)?.iter().all(|&v| v != T::default()));
    if ok {
        Ok(())
    } else {
        Err(shape_err(K, message.to_string()))
    }
}
