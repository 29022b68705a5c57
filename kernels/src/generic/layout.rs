//! Data-movement kernels. They only look at the element size, so one
//! monomorphisation per width (1, 2, 4, 8 bytes) serves every dtype.

use super::common::*;
use crate::context::Context;
use crate::parallel::{Threads, ELEMENT_CHUNK};
use crate::types::{DType, Result, TensorMut, TensorRef};
use bytemuck::Pod;

/// Copies `src` (read through `src_strides` from `src_off`) into contiguous
/// `dst` of shape `shape`.
fn strided_copy<T: Pod>(src: &[T], src_off: usize, src_strides: &[usize], dst: &mut [T], shape: &[usize]) {
    let r = shape.len();
    let mut so = [0; MAX_RANK];
    strides_of(shape, &mut so[..r]);
    let c = Collapsed::new(shape, [&so[..r], src_strides]);
    c.for_each_row(|[d, s], n, [_, is]| {
        let s = s + src_off;
        if is == 1 {
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        } else if is == 0 {
            dst[d..d + n].fill(src[s]);
        } else {
            for (i, o) in dst[d..d + n].iter_mut().enumerate() {
                *o = src[s + i * is];
            }
        }
    });
}

pub fn permute(x: TensorRef, perm: &[usize], out: TensorMut) -> Result<()> {
    permute_with(x, perm, out, Threads::single())
}

/// [`permute`] with the output cut into slabs along its first non-unit
/// dim, copied over `cx`'s threads (a copy: the same bytes however cut).
pub fn permute_cx(x: TensorRef, perm: &[usize], out: TensorMut, cx: &mut Context) -> Result<()> {
    permute_with(x, perm, out, cx.threads())
}

fn permute_with(x: TensorRef, perm: &[usize], mut out: TensorMut, threads: Threads) -> Result<()> {
    const K: &str = "permute";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    check_rank(K, x.shape)?;
    let r = x.shape.len();
    if perm.len() != r || out.shape.len() != r {
        return Err(shape_err(
            K,
            format!("perm {perm:?} / output rank {} do not match input rank {r}", out.shape.len()),
        ));
    }
    let mut seen = [false; MAX_RANK];
    for (i, &p) in perm.iter().enumerate() {
        if p >= r || seen[p] {
            return Err(shape_err(K, format!("{perm:?} is not a permutation of 0..{r}")));
        }
        seen[p] = true;
        if out.shape[i] != x.shape[p] {
            return Err(shape_err(
                K,
                format!("output shape {:?} != input {:?} permuted by {perm:?}", out.shape, x.shape),
            ));
        }
    }
    let mut xs = [0; MAX_RANK];
    strides_of(x.shape, &mut xs[..r]);
    let ps: [usize; MAX_RANK] = std::array::from_fn(|i| if i < r { xs[perm[i]] } else { 0 });
    let osh = out.shape;
    if let Some((batch, a, b)) = as_transpose(osh, &ps[..r]) {
        let threads = if batch * a * b < 2 * ELEMENT_CHUNK { Threads::single() } else { threads };
        with_elem_size!(x.dtype, T, {
            let src = view::<T>(K, "x", &x)?;
            let dst = view_mut::<T>(K, "out", &mut out)?;
            // Groups of output rows (one `a` each, `b` elements), about
            // ELEMENT_CHUNK elements a group.
            let per = (ELEMENT_CHUNK / b.max(1)).max(TILE);
            threads.for_each_chunk(dst, per * b, |i, part| {
                let (mut row, mut part) = (i * per, part);
                while !part.is_empty() {
                    // Within one batch element.
                    let (n, a0) = (row / a, row % a);
                    let rows = (a - a0).min(part.len() / b);
                    let (now, rest) = part.split_at_mut(rows * b);
                    transpose_rows(&src[n * a * b..][..a * b], a, b, a0, now);
                    (row, part) = (row + rows, rest);
                }
            });
        });
        return Ok(());
    }
    // Slabs along output dim `d` (every dim before it is 1), each about
    // ELEMENT_CHUNK elements.
    let d = osh.iter().position(|&s| s > 1).unwrap_or(0);
    let slab: usize = osh.get(d + 1..).map_or(1, |s| s.iter().product());
    let threads = if numel(K, osh)? < 2 * ELEMENT_CHUNK || r == 0 { Threads::single() } else { threads };
    with_elem_size!(x.dtype, T, {
        let src = view::<T>(K, "x", &x)?;
        let dst = view_mut::<T>(K, "out", &mut out)?;
        if threads.count() == 1 || slab == 0 {
            strided_copy(src, 0, &ps[..r], dst, osh);
        } else {
            let per = (ELEMENT_CHUNK / slab).max(1);
            threads.for_each_chunk(dst, per * slab, |i, part| {
                let mut shape = [0; MAX_RANK];
                shape[..r].copy_from_slice(osh);
                shape[d] = part.len() / slab;
                strided_copy(src, i * per * ps[d], &ps[..r], part, &shape[..r]);
            });
        }
    });
    Ok(())
}

/// Rows per tile of [`transpose_rows`].
const TILE: usize = 16;

/// `Some((batch, a, b))` when the permute is a batch of transposes: the
/// output `[batch, a, b]` (after merging dims that stay adjacent and
/// dropping unit dims) reads `src[n][j][i]` of a contiguous `[batch, b, a]`
/// at `out[n][i][j]` — a channels-first ↔ channels-last permute.
fn as_transpose(shape: &[usize], strides: &[usize]) -> Option<(usize, usize, usize)> {
    // On the stack: a permute runs in steady state, which allocates nothing.
    let mut dims = [(0usize, 0usize); MAX_RANK];
    let mut rank = 0;
    for (&n, &s) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match dims[..rank].last_mut() {
            Some(last) if last.1 == s * n => *last = (last.0 * n, s),
            _ => {
                dims[rank] = (n, s);
                rank += 1;
            }
        }
    }
    let dims = &dims[..rank];
    // Only narrow outputs (an RGB image to channels-last): for rows of 8
    // or more the row-by-row gather reads as few cache lines and is as fast.
    match *dims {
        [(a, 1), (b, s)] if s == a && b < 8 => Some((1, a, b)),
        [(batch, sn), (a, 1), (b, s)] if s == a && sn == a * b && b < 8 => Some((batch, a, b)),
        _ => None,
    }
}

/// Output rows `a0..a0 + dst.len() / b` of the transpose of `src` (`[b,
/// a]`) in tiles of [`TILE`] rows: each tile reads `b` short contiguous
/// runs and writes one contiguous block.
fn transpose_rows<T: Copy>(src: &[T], a: usize, b: usize, a0: usize, dst: &mut [T]) {
    match b {
        // An RGB image: the store offsets fixed at compile time.
        3 => transpose_rows_with::<T, 3>(src, a, b, a0, dst),
        _ => transpose_rows_with::<T, 0>(src, a, b, a0, dst),
    }
}

/// [`transpose_rows`] with `B` (0: any) source rows.
#[inline(always)]
fn transpose_rows_with<T: Copy, const B: usize>(src: &[T], a: usize, b: usize, a0: usize, dst: &mut [T]) {
    let b = if B == 0 { b } else { B };
    for (t, tile) in dst.chunks_mut(TILE * b).enumerate() {
        let i0 = a0 + t * TILE;
        let rows = tile.len() / b;
        for j in 0..b {
            let col = &src[j * a + i0..][..rows];
            for (i, &v) in col.iter().enumerate() {
                tile[i * b + j] = v;
            }
        }
    }
}

/// Numpy-broadcasts `x` to `out.shape`.
pub fn expand(x: TensorRef, mut out: TensorMut) -> Result<()> {
    const K: &str = "expand";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    check_rank(K, out.shape)?;
    if x.shape.len() > out.shape.len() {
        return Err(shape_err(K, format!("cannot expand {:?} to lower rank {:?}", x.shape, out.shape)));
    }
    check_broadcast(K, &[x.shape, out.shape], out.shape)?;
    let r = out.shape.len();
    let mut st = [0; MAX_RANK];
    broadcast_strides(x.shape, out.shape, &mut st[..r]);
    let osh = out.shape;
    with_elem_size!(x.dtype, T, {
        let src = view::<T>(K, "x", &x)?;
        let dst = view_mut::<T>(K, "out", &mut out)?;
        strided_copy(src, 0, &st[..r], dst, osh);
    });
    Ok(())
}

/// `out.shape[axis]` elements along `axis`, from `start` in steps of `step`.
pub fn slice(x: TensorRef, axis: usize, start: usize, step: usize, mut out: TensorMut) -> Result<()> {
    const K: &str = "slice";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    check_rank(K, x.shape)?;
    let r = x.shape.len();
    if axis >= r || out.shape.len() != r {
        return Err(shape_err(K, format!("axis {axis} / output rank {} invalid for input rank {r}", out.shape.len())));
    }
    if step == 0 {
        return Err(shape_err(K, "step must be >= 1"));
    }
    for i in 0..r {
        if i != axis && out.shape[i] != x.shape[i] {
            return Err(shape_err(
                K,
                format!("output shape {:?} differs from input {:?} off the slice axis", out.shape, x.shape),
            ));
        }
    }
    let n = out.shape[axis];
    if n > 0 {
        let last = (n - 1).checked_mul(step).and_then(|v| v.checked_add(start));
        if last.is_none_or(|l| l >= x.shape[axis]) {
            return Err(shape_err(
                K,
                format!("{n} elements from {start} step {step} exceed axis length {}", x.shape[axis]),
            ));
        }
    }
    let mut st = [0; MAX_RANK];
    strides_of(x.shape, &mut st[..r]);
    let off = if n > 0 { start * st[axis] } else { 0 };
    st[axis] *= step;
    let osh = out.shape;
    with_elem_size!(x.dtype, T, {
        let src = view::<T>(K, "x", &x)?;
        let dst = view_mut::<T>(K, "out", &mut out)?;
        if !dst.is_empty() {
            strided_copy(src, off, &st[..r], dst, osh);
        }
    });
    Ok(())
}

pub fn concat(inputs: &[TensorRef], axis: usize, out: TensorMut) -> Result<()> {
    const K: &str = "concat";
    let r = out.shape.len();
    if axis >= r {
        return Err(shape_err(K, format!("axis {axis} out of range for rank {r}")));
    }
    let mut total = 0usize;
    for (i, t) in inputs.iter().enumerate() {
        expect_dtype(K, "input", t.dtype, out.dtype)?;
        let ok_rank = t.shape.len() == r;
        if !ok_rank || (0..r).any(|d| d != axis && t.shape[d] != out.shape[d]) {
            return Err(shape_err(
                K,
                format!("input {i} shape {:?} does not fit output {:?} on axis {axis}", t.shape, out.shape),
            ));
        }
        check_len(K, t)?;
        total += t.shape[axis];
    }
    if total != out.shape[axis] {
        return Err(shape_err(K, format!("inputs sum to {total} along axis {axis}, output has {}", out.shape[axis])));
    }
    check_len_mut(K, &out)?;
    let es = out.dtype.size_bytes();
    let outer: usize = out.shape[..axis].iter().product();
    let inner: usize = out.shape[axis + 1..].iter().product::<usize>() * es;
    let out_row = out.shape[axis] * inner;
    let mut col = 0;
    for t in inputs {
        let chunk = t.shape[axis] * inner;
        for o in 0..outer {
            out.data[o * out_row + col..o * out_row + col + chunk].copy_from_slice(&t.data[o * chunk..(o + 1) * chunk]);
        }
        col += chunk;
    }
    Ok(())
}

fn check_len(kernel: &'static str, t: &TensorRef) -> Result<()> {
    let n = numel(kernel, t.shape)?;
    if n * t.dtype.size_bytes() != t.data.len() {
        return Err(shape_err(
            kernel,
            format!("shape {:?} of {} does not match {} bytes", t.shape, t.dtype, t.data.len()),
        ));
    }
    Ok(())
}

fn check_len_mut(kernel: &'static str, t: &TensorMut) -> Result<()> {
    let n = numel(kernel, t.shape)?;
    if n * t.dtype.size_bytes() != t.data.len() {
        return Err(shape_err(
            kernel,
            format!("output shape {:?} of {} does not match {} bytes", t.shape, t.dtype, t.data.len()),
        ));
    }
    Ok(())
}

/// torch.index_select generalised to any index shape:
/// `out = data.shape[..axis] ++ indices.shape ++ data.shape[axis+1..]`.
pub fn gather(data: TensorRef, indices: TensorRef, axis: usize, out: TensorMut) -> Result<()> {
    const K: &str = "gather";
    expect_dtype(K, "out", out.dtype, data.dtype)?;
    let r = data.shape.len();
    if axis >= r {
        return Err(shape_err(K, format!("axis {axis} out of range for rank {r}")));
    }
    let ri = indices.shape.len();
    let fits = out.shape.len() == r - 1 + ri
        && out.shape[..axis] == data.shape[..axis]
        && &out.shape[axis..axis + ri] == indices.shape
        && out.shape[axis + ri..] == data.shape[axis + 1..];
    if !fits {
        return Err(shape_err(
            K,
            format!(
                "output shape {:?} is not data {:?} with axis {axis} replaced by indices {:?}",
                out.shape, data.shape, indices.shape
            ),
        ));
    }
    check_len(K, &data)?;
    check_len_mut(K, &out)?;
    let dim = data.shape[axis];
    let outer: usize = data.shape[..axis].iter().product();
    let inner: usize = data.shape[axis + 1..].iter().product::<usize>() * data.dtype.size_bytes();
    match indices.dtype {
        DType::I64 => gather_bytes(view::<i64>(K, "indices", &indices)?, dim, outer, inner, data.data, out.data),
        DType::I32 => gather_bytes(view::<i32>(K, "indices", &indices)?, dim, outer, inner, data.data, out.data),
        d => Err(dtype_err(K, d)),
    }
}

fn gather_bytes<I: Copy + Into<i64>>(
    idx: &[I],
    dim: usize,
    outer: usize,
    inner: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<()> {
    // Validate every index before writing, so a bad index leaves `out` untouched.
    for &i in idx {
        resolve_index(i.into(), dim)?;
    }
    let n = idx.len();
    for o in 0..outer {
        for (j, &i) in idx.iter().enumerate() {
            let i = resolve_index(i.into(), dim)?;
            let s = (o * dim + i) * inner;
            let d = (o * n + j) * inner;
            dst[d..d + inner].copy_from_slice(&src[s..s + inner]);
        }
    }
    Ok(())
}

#[inline]
fn resolve_index(i: i64, dim: usize) -> Result<usize> {
    let d = dim as i64;
    let w = if i < 0 { i + d } else { i };
    if w < 0 || w >= d {
        return Err(shape_err("gather", format!("index {i} out of range for axis of size {dim}")));
    }
    Ok(w as usize)
}

/// Sets every element to `value` converted to the output dtype.
pub fn fill(value: f64, mut out: TensorMut) -> Result<()> {
    const K: &str = "fill";
    with_scalar!(out.dtype, T, {
        let o = view_mut::<T>(K, "out", &mut out)?;
        o.fill(T::from_f64(value));
    });
    Ok(())
}

/// `out[i] = start + i * step`, computed in f64 then converted.
pub fn arange(start: f64, step: f64, mut out: TensorMut) -> Result<()> {
    const K: &str = "arange";
    if out.shape.len() != 1 {
        return Err(shape_err(K, format!("output must be 1-D, got {:?}", out.shape)));
    }
    if out.dtype == DType::Bool {
        return Err(dtype_err(K, DType::Bool));
    }
    with_scalar!(out.dtype, T, {
        let o = view_mut::<T>(K, "out", &mut out)?;
        for (i, v) in o.iter_mut().enumerate() {
            *v = T::from_f64(start + i as f64 * step);
        }
    });
    Ok(())
}

/// Reshape-copy: same dtype and element count, any shapes.
pub fn copy(x: TensorRef, out: TensorMut) -> Result<()> {
    const K: &str = "copy";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    check_len(K, &x)?;
    check_len_mut(K, &out)?;
    if x.data.len() != out.data.len() {
        return Err(shape_err(K, format!("element counts differ: {:?} vs {:?}", x.shape, out.shape)));
    }
    out.data.copy_from_slice(x.data);
    Ok(())
}
