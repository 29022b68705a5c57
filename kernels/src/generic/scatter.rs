//! Index-driven data movement: element-wise gather and scatter (torch's
//! `gather`, `scatter`, `scatter_add`, `scatter_reduce`) and advanced
//! indexing with several index tensors (`x[i0, i1]`, `index_put`).
//!
//! Every index is checked (negative indices count from the end) before any
//! element moves, so a bad index is an error value and `out` is left as the
//! copy of `data` (or untouched).

use super::common::*;
use crate::context::Context;
use crate::types::{DType, ReduceKind, Result, Scratch, TensorMut, TensorRef};

/// An index tensor viewed as integers (i64, or i32).
#[derive(Copy, Clone)]
enum Indices<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl<'a> Indices<'a> {
    fn of(kernel: &'static str, what: &str, t: &TensorRef<'a>) -> Result<Indices<'a>> {
        match t.dtype {
            DType::I64 => Ok(Indices::I64(view(kernel, what, t)?)),
            DType::I32 => Ok(Indices::I32(view(kernel, what, t)?)),
            d => Err(dtype_err(kernel, d)),
        }
    }

    #[inline]
    fn get(&self, j: usize) -> i64 {
        match self {
            Indices::I64(v) => v[j],
            Indices::I32(v) => v[j] as i64,
        }
    }
}

/// `i` in `[-dim, dim)` → `[0, dim)`, or an error naming the kernel.
#[inline]
fn resolve(kernel: &'static str, i: i64, dim: usize) -> Result<usize> {
    let d = dim as i64;
    let w = if i < 0 { i + d } else { i };
    if w < 0 || w >= d {
        return Err(shape_err(kernel, format!("index {i} out of range for a dimension of size {dim}")));
    }
    Ok(w as usize)
}

/// Calls `f(j, offsets)` for every position of `shape` in row-major order,
/// `j` being the position's linear index and `offsets[o]` its offset through
/// `strides[o]`.
fn for_each_position<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]) -> Result<()>,
) -> Result<()> {
    let n: usize = shape.iter().product();
    let r = shape.len();
    let mut idx = [0usize; MAX_RANK];
    let mut off = [0usize; N];
    for j in 0..n {
        f(j, off)?;
        let mut d = r;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            for o in 0..N {
                off[o] += strides[o][d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for o in 0..N {
                off[o] -= strides[o][d] * shape[d];
            }
            idx[d] = 0;
        }
    }
    Ok(())
}

/// Checks that `index` has `data`'s rank and fits inside `bound` on every axis
/// (except `skip`).
fn check_fits(kernel: &'static str, index: &[usize], bound: &[usize], what: &str, skip: Option<usize>) -> Result<()> {
    let fits =
        index.len() == bound.len() && index.iter().zip(bound).enumerate().all(|(d, (i, b))| Some(d) == skip || i <= b);
    if !fits {
        return Err(shape_err(kernel, format!("index shape {index:?} does not fit inside {what} {bound:?}")));
    }
    Ok(())
}

/// `torch.gather`: `out[p] = data[p with p[axis] = index[p]]`; `out` has
/// `index`'s shape.
pub fn gather_elements(data: TensorRef, index: TensorRef, axis: usize, mut out: TensorMut) -> Result<()> {
    const K: &str = "gather_elements";
    expect_dtype(K, "out", out.dtype, data.dtype)?;
    check_rank(K, data.shape)?;
    if axis >= data.shape.len() {
        return Err(shape_err(K, format!("axis {axis} out of range for rank {}", data.shape.len())));
    }
    check_fits(K, index.shape, data.shape, "data", Some(axis))?;
    if out.shape != index.shape {
        return Err(shape_err(K, format!("output shape {:?} is not the index shape {:?}", out.shape, index.shape)));
    }
    let idx = Indices::of(K, "index", &index)?;
    let r = data.shape.len();
    let mut ds = [0usize; MAX_RANK];
    strides_of(data.shape, &mut ds[..r]);
    let (axis_stride, dim) = (ds[axis], data.shape[axis]);
    ds[axis] = 0;
    with_elem_size!(data.dtype, T, {
        let src = view::<T>(K, "data", &data)?;
        let dst = view_mut::<T>(K, "out", &mut out)?;
        for_each_position(index.shape, [&ds[..r]], |j, [o]| {
            dst[j] = src[o + resolve(K, idx.get(j), dim)? * axis_stride];
            Ok(())
        })
    })
}

/// How [`scatter_elements`] combines a scattered value with what is there.
#[inline]
fn combine<T: Scalar>(kind: ReduceKind, a: T, v: T) -> T {
    if T::IS_FLOAT {
        let (a, v) = (a.to_f64(), v.to_f64());
        T::from_f64(match kind {
            ReduceKind::Sum | ReduceKind::Mean => a + v,
            ReduceKind::Prod => a * v,
            // NaN-propagating, like torch's amax / amin.
            ReduceKind::Max => {
                if a.is_nan() || a >= v {
                    a
                } else {
                    v
                }
            }
            ReduceKind::Min => {
                if a.is_nan() || a <= v {
                    a
                } else {
                    v
                }
            }
        })
    } else {
        // Wrapping integer arithmetic at i64, narrowed like torch's fixed
        // width; on bool, sum is `or` and prod is `and`.
        let (a, v) = (a.to_i64(), v.to_i64());
        T::from_i64(match kind {
            ReduceKind::Sum | ReduceKind::Mean => a.wrapping_add(v),
            ReduceKind::Prod => a.wrapping_mul(v),
            ReduceKind::Max => a.max(v),
            ReduceKind::Min => a.min(v),
        })
    }
}

/// `torch.scatter` (`reduce = None`: the last write wins), `scatter_add`
/// (`Sum`) and `scatter_reduce` (`Sum`, `Prod`, `Mean`, `Max`, `Min`): `out`
/// is `data` with `src[p]` sent to `p with p[axis] = index[p]` for every `p`
/// in `index`'s shape. Without `include_self`, a position that receives values
/// starts from the first one instead of `data`'s; `Mean` divides by the number
/// of values combined (floor division for integers, as torch).
#[allow(clippy::too_many_arguments)]
pub fn scatter_elements(
    data: TensorRef,
    index: TensorRef,
    src: TensorRef,
    axis: usize,
    reduce: Option<ReduceKind>,
    include_self: bool,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "scatter_elements";
    copy_data(K, &data, &mut out)?;
    scatter_elements_in_place(index, src, axis, reduce, include_self, out, cx)
}

/// [`scatter_elements`] with `out` already holding the data: only the
/// scattered positions (and, for `Mean`, those that received values) are
/// written. Every index is checked before anything is written, so an error
/// leaves `out` as it was.
pub fn scatter_elements_in_place(
    index: TensorRef,
    src: TensorRef,
    axis: usize,
    reduce: Option<ReduceKind>,
    include_self: bool,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let scratch = &mut cx.scratch;
    const K: &str = "scatter_elements";
    expect_dtype(K, "src", src.dtype, out.dtype)?;
    let shape = out.shape;
    check_rank(K, shape)?;
    if axis >= shape.len() {
        return Err(shape_err(K, format!("axis {axis} out of range for rank {}", shape.len())));
    }
    check_fits(K, index.shape, shape, "data", Some(axis))?;
    check_fits(K, index.shape, src.shape, "src", None)?;
    let idx = Indices::of(K, "index", &index)?;
    let r = shape.len();
    let (mut ds, mut ss) = ([0usize; MAX_RANK], [0usize; MAX_RANK]);
    strides_of(shape, &mut ds[..r]);
    strides_of(src.shape, &mut ss[..r]);
    let (axis_stride, dim) = (ds[axis], shape[axis]);
    ds[axis] = 0;
    let n = numel(K, index.shape)?;
    for j in 0..n {
        resolve(K, idx.get(j), dim)?;
    }
    let counting = reduce.is_some_and(|k| k == ReduceKind::Mean || !include_self);
    with_scalar!(out.dtype, T, {
        let sv = view::<T>(K, "src", &src)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        let Some(kind) = reduce else {
            return for_each_position(index.shape, [&ds[..r], &ss[..r]], |j, [d, s]| {
                ov[d + resolve(K, idx.get(j), dim)? * axis_stride] = sv[s];
                Ok(())
            });
        };
        let counts = scratch.indices(if counting { ov.len() } else { 0 });
        counts.fill(0);
        for_each_position(index.shape, [&ds[..r], &ss[..r]], |j, [d, s]| {
            let t = d + resolve(K, idx.get(j), dim)? * axis_stride;
            ov[t] = if counting && !include_self && counts[t] == 0 { sv[s] } else { combine(kind, ov[t], sv[s]) };
            if counting {
                counts[t] += 1;
            }
            Ok(())
        })?;
        if kind == ReduceKind::Mean {
            for (o, &c) in ov.iter_mut().zip(counts.iter()) {
                if c == 0 {
                    continue;
                }
                let c = c + include_self as usize;
                *o = if T::IS_FLOAT {
                    T::from_f64(o.to_f64() / c as f64)
                } else {
                    T::from_i64(o.to_i64().div_euclid(c as i64))
                };
            }
        }
        Ok(())
    })
}

/// Shapes shared by [`index_gather`] and [`index_put`]: `data` is
/// `pre ++ D ++ post` with `D` the `k` indexed dims starting at `axis`.
struct IndexLayout {
    outer: usize,
    /// Elements of `D`.
    block: usize,
    /// Elements of `post`.
    inner: usize,
    /// Positions of the common index shape `B`.
    count: usize,
}

/// Checks the index tensors (same shape `B`) and that `result` is
/// `pre ++ B ++ post`, then resolves each position of `B` to its linear offset
/// inside `D` (in `lin`, from the scratch).
fn index_layout<'s>(
    kernel: &'static str,
    data: &[usize],
    indices: &[TensorRef],
    axis: usize,
    result: &[usize],
    what: &str,
    scratch: &'s mut Scratch,
) -> Result<(IndexLayout, &'s [usize])> {
    let k = indices.len();
    check_rank(kernel, data)?;
    let Some(first) = indices.first() else { return Err(shape_err(kernel, "no index tensors")) };
    if axis + k > data.len() {
        return Err(shape_err(kernel, format!("{k} index tensors from axis {axis} exceed rank {}", data.len())));
    }
    if let Some(t) = indices.iter().find(|t| t.shape != first.shape) {
        return Err(shape_err(kernel, format!("index tensors of shapes {:?} and {:?}", first.shape, t.shape)));
    }
    let b = first.shape;
    let fits = result.len() == data.len() - k + b.len()
        && result[..axis] == data[..axis]
        && &result[axis..axis + b.len()] == b
        && result[axis + b.len()..] == data[axis + k..];
    if !fits {
        return Err(shape_err(
            kernel,
            format!("{what} shape {result:?} is not {data:?} with axes {axis}..{} replaced by {b:?}", axis + k),
        ));
    }
    let layout = IndexLayout {
        outer: data[..axis].iter().product(),
        block: data[axis..axis + k].iter().product(),
        inner: data[axis + k..].iter().product(),
        count: numel(kernel, b)?,
    };
    let lin = scratch.indices(layout.count);
    lin.fill(0);
    let mut stride = 1;
    for m in (0..k).rev() {
        let dim = data[axis + m];
        let idx = Indices::of(kernel, "indices", &indices[m])?;
        for (j, l) in lin.iter_mut().enumerate() {
            *l += resolve(kernel, idx.get(j), dim)? * stride;
        }
        stride *= dim;
    }
    Ok((layout, lin))
}

/// `out = data` before a scatter: same dtype, shape and byte length.
fn copy_data(kernel: &'static str, data: &TensorRef, out: &mut TensorMut) -> Result<()> {
    expect_dtype(kernel, "out", out.dtype, data.dtype)?;
    if out.shape != data.shape || out.data.len() != data.data.len() {
        return Err(shape_err(kernel, format!("output shape {:?} is not the data shape {:?}", out.shape, data.shape)));
    }
    out.data.copy_from_slice(data.data);
    Ok(())
}

/// Advanced indexing `data[.., i0, i1, .., ik-1, ..]` with the index tensors
/// (one common shape `B`) on axes `axis..axis+k`: `out` is
/// `data.shape[..axis] ++ B ++ data.shape[axis+k..]`.
pub fn index_gather(
    data: TensorRef,
    indices: &[TensorRef],
    axis: usize,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let scratch = &mut cx.scratch;
    const K: &str = "index_gather";
    expect_dtype(K, "out", out.dtype, data.dtype)?;
    let (l, lin) = index_layout(K, data.shape, indices, axis, out.shape, "output", scratch)?;
    with_elem_size!(data.dtype, T, {
        let src = view::<T>(K, "data", &data)?;
        let dst = view_mut::<T>(K, "out", &mut out)?;
        for o in 0..l.outer {
            for (j, &p) in lin.iter().enumerate() {
                let s = (o * l.block + p) * l.inner;
                let d = (o * l.count + j) * l.inner;
                dst[d..d + l.inner].copy_from_slice(&src[s..s + l.inner]);
            }
        }
        Ok(())
    })
}

/// `index_put`: `out` is `data` with `values` (shaped like
/// [`index_gather`]'s result) written to the indexed positions (the last
/// write wins), or added to them with `accumulate`.
pub fn index_put(
    data: TensorRef,
    values: TensorRef,
    indices: &[TensorRef],
    axis: usize,
    accumulate: bool,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    copy_data("index_put", &data, &mut out)?;
    index_put_in_place(values, indices, axis, accumulate, out, cx)
}

/// [`index_put`] with `out` already holding the data: only the indexed
/// positions are written (a KV cache's new rows). Every index is checked
/// before anything is written, so an error leaves `out` as it was.
pub fn index_put_in_place(
    values: TensorRef,
    indices: &[TensorRef],
    axis: usize,
    accumulate: bool,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let scratch = &mut cx.scratch;
    const K: &str = "index_put";
    expect_dtype(K, "values", values.dtype, out.dtype)?;
    let (l, lin) = index_layout(K, out.shape, indices, axis, values.shape, "values", scratch)?;
    with_scalar!(out.dtype, T, {
        let vv = view::<T>(K, "values", &values)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        for o in 0..l.outer {
            for (j, &p) in lin.iter().enumerate() {
                let d = (o * l.block + p) * l.inner;
                let s = (o * l.count + j) * l.inner;
                let (dst, src) = (&mut ov[d..d + l.inner], &vv[s..s + l.inner]);
                if accumulate {
                    dst.iter_mut().zip(src).for_each(|(a, &v)| *a = combine(ReduceKind::Sum, *a, v));
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }
    fn i64s(v: &[i64]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }
    fn t<'a>(dtype: DType, shape: &'a [usize], data: &'a [u8]) -> TensorRef<'a> {
        TensorRef { dtype, shape, data }
    }

    #[test]
    fn gather_elements_matches_torch() {
        // torch.gather(x, 1, [[0, 0], [-1, 0]]) with x = [[1, 2], [3, 4]].
        let (x, i) = (f32s(&[1., 2., 3., 4.]), i64s(&[0, 0, -1, 0]));
        let mut o = vec![0u8; 16];
        let out = TensorMut { dtype: DType::F32, shape: &[2, 2], data: &mut o };
        gather_elements(t(DType::F32, &[2, 2], &x), t(DType::I64, &[2, 2], &i), 1, out).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&o), &[1., 1., 4., 3.]);
        // A smaller index on axis 0 of a [3, 1] tensor, odd sizes.
        let x = f32s(&[5., 6., 7.]);
        let i = i64s(&[2, 0]);
        let mut o = vec![0u8; 8];
        let out = TensorMut { dtype: DType::F32, shape: &[2, 1], data: &mut o };
        gather_elements(t(DType::F32, &[3, 1], &x), t(DType::I64, &[2, 1], &i), 0, out).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&o), &[7., 5.]);
    }

    #[test]
    fn out_of_range_index_is_an_error() {
        let (x, i) = (f32s(&[1., 2.]), i64s(&[2]));
        let mut o = vec![0u8; 4];
        let out = TensorMut { dtype: DType::F32, shape: &[1], data: &mut o };
        assert!(gather_elements(t(DType::F32, &[2], &x), t(DType::I64, &[1], &i), 0, out).is_err());
        let s = f32s(&[9.]);
        let mut o = vec![0u8; 8];
        let out = TensorMut { dtype: DType::F32, shape: &[2], data: &mut o };
        let i = i64s(&[-3]);
        let r = scatter_elements(
            t(DType::F32, &[2], &x),
            t(DType::I64, &[1], &i),
            t(DType::F32, &[1], &s),
            0,
            None,
            true,
            out,
            &mut crate::Context::new(),
        );
        assert!(r.is_err());
        let mut o = vec![0u8; 8];
        let out = TensorMut { dtype: DType::F32, shape: &[1, 2], data: &mut o };
        let i = i64s(&[5]);
        assert!(index_gather(t(DType::F32, &[2], &x), &[t(DType::I64, &[1], &i)], 0, out, &mut crate::Context::new())
            .is_err());
    }

    fn scatter_1d(reduce: Option<ReduceKind>, include_self: bool) -> Vec<f32> {
        // data [1, 2, 3], index [0, 2, 0, -3], src [10, 20, 30, 40].
        let (x, i, s) = (f32s(&[1., 2., 3.]), i64s(&[0, 2, 0, -3]), f32s(&[10., 20., 30., 40.]));
        let mut o = vec![0u8; 12];
        let out = TensorMut { dtype: DType::F32, shape: &[3], data: &mut o };
        let (d, i, s) = (t(DType::F32, &[3], &x), t(DType::I64, &[4], &i), t(DType::F32, &[4], &s));
        scatter_elements(d, i, s, 0, reduce, include_self, out, &mut crate::Context::new()).unwrap();
        bytemuck::cast_slice::<u8, f32>(&o).to_vec()
    }

    #[test]
    fn scatter_reductions_match_torch() {
        assert_eq!(scatter_1d(None, true), [40., 2., 20.]);
        assert_eq!(scatter_1d(Some(ReduceKind::Sum), true), [81., 2., 23.]);
        assert_eq!(scatter_1d(Some(ReduceKind::Sum), false), [80., 2., 20.]);
        assert_eq!(scatter_1d(Some(ReduceKind::Mean), true), [20.25, 2., 11.5]);
        assert_eq!(scatter_1d(Some(ReduceKind::Mean), false), [80. / 3., 2., 20.]);
        assert_eq!(scatter_1d(Some(ReduceKind::Max), false), [40., 2., 20.]);
        assert_eq!(scatter_1d(Some(ReduceKind::Min), true), [1., 2., 3.]);
        assert_eq!(scatter_1d(Some(ReduceKind::Prod), true), [12000., 2., 60.]);
    }

    #[test]
    fn scatter_integer_mean_floors() {
        let (x, i, s) = (i64s(&[0, 5]), i64s(&[0, 0]), i64s(&[-3, 0]));
        let mut o = vec![0u8; 16];
        let out = TensorMut { dtype: DType::I64, shape: &[2], data: &mut o };
        let (d, i, s) = (t(DType::I64, &[2], &x), t(DType::I64, &[2], &i), t(DType::I64, &[2], &s));
        scatter_elements(d, i, s, 0, Some(ReduceKind::Mean), false, out, &mut crate::Context::new()).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i64>(&o), &[-2, 5]);
    }

    #[test]
    fn scatter_2d_with_smaller_src_window() {
        // torch.zeros(2, 3).scatter_(1, [[2], [0]], src[2, 2]) reads src[:, :1].
        let (x, i, s) = (f32s(&[0.; 6]), i64s(&[2, 0]), f32s(&[1., 2., 3., 4.]));
        let mut o = vec![0u8; 24];
        let out = TensorMut { dtype: DType::F32, shape: &[2, 3], data: &mut o };
        let (d, i, s) = (t(DType::F32, &[2, 3], &x), t(DType::I64, &[2, 1], &i), t(DType::F32, &[2, 2], &s));
        scatter_elements(d, i, s, 1, None, true, out, &mut crate::Context::new()).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&o), &[0., 0., 1., 3., 0., 0.]);
    }

    #[test]
    fn index_gather_and_put_with_two_indices() {
        // x [2, 3, 2]; x[:, [1, -1, 0], [0, 1, 1]] → [2, 3].
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let (x, i0, i1) = (f32s(&x), i64s(&[1, -1, 0]), i64s(&[0, 1, 1]));
        let idx = [t(DType::I64, &[3], &i0), t(DType::I64, &[3], &i1)];
        let mut o = vec![0u8; 24];
        let out = TensorMut { dtype: DType::F32, shape: &[2, 3], data: &mut o };
        index_gather(t(DType::F32, &[2, 3, 2], &x), &idx, 1, out, &mut crate::Context::new()).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&o), &[2., 5., 1., 8., 11., 7.]);
        // Accumulate with a duplicate position: x[[0, 0, 1], [1, 1, 0]] += [1, 2, 3] on a [2, 2].
        let (z, i0, i1, v) = (f32s(&[0.; 4]), i64s(&[0, 0, 1]), i64s(&[1, 1, 0]), f32s(&[1., 2., 3.]));
        let idx = [t(DType::I64, &[3], &i0), t(DType::I64, &[3], &i1)];
        for (acc, want) in [(true, [0., 3., 3., 0.]), (false, [0., 2., 3., 0.])] {
            let mut o = vec![0u8; 16];
            let out = TensorMut { dtype: DType::F32, shape: &[2, 2], data: &mut o };
            index_put(
                t(DType::F32, &[2, 2], &z),
                t(DType::F32, &[3], &v),
                &idx,
                0,
                acc,
                out,
                &mut crate::Context::new(),
            )
            .unwrap();
            assert_eq!(bytemuck::cast_slice::<u8, f32>(&o), &want);
        }
    }

    #[test]
    fn in_place_forms_write_only_the_indexed_positions_and_fail_before_writing() {
        // x [3, 2] = 0..6; rows [2, 0] <- v, accumulating or not; then a
        // scatter_reduce mean into the same rows.
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let (xb, rows, v) = (f32s(&x), i64s(&[2, 0]), f32s(&[10., 11., 12., 13.]));
        let cx = &mut crate::Context::new();
        for acc in [false, true] {
            let mut copied = vec![0u8; 24];
            let out = TensorMut { dtype: DType::F32, shape: &[3, 2], data: &mut copied };
            let idx = [t(DType::I64, &[2], &rows)];
            index_put(t(DType::F32, &[3, 2], &xb), t(DType::F32, &[2, 2], &v), &idx, 0, acc, out, cx).unwrap();
            let mut in_place = xb.clone();
            let out = TensorMut { dtype: DType::F32, shape: &[3, 2], data: &mut in_place };
            index_put_in_place(t(DType::F32, &[2, 2], &v), &idx, 0, acc, out, cx).unwrap();
            assert_eq!(in_place, copied, "accumulate {acc}");
        }
        let index = i64s(&[2, 2, 0, 0]);
        let mut copied = vec![0u8; 24];
        let out = TensorMut { dtype: DType::F32, shape: &[3, 2], data: &mut copied };
        let (d, i, sv) = (t(DType::F32, &[3, 2], &xb), t(DType::I64, &[2, 2], &index), t(DType::F32, &[2, 2], &v));
        scatter_elements(d, i, sv, 0, Some(ReduceKind::Mean), true, out, cx).unwrap();
        let mut in_place = xb.clone();
        let out = TensorMut { dtype: DType::F32, shape: &[3, 2], data: &mut in_place };
        scatter_elements_in_place(i, sv, 0, Some(ReduceKind::Mean), true, out, cx).unwrap();
        assert_eq!(in_place, copied);
        // An index out of range: an error, and nothing written.
        let bad = i64s(&[0, 3]);
        let mut in_place = xb.clone();
        let out = TensorMut { dtype: DType::F32, shape: &[3, 2], data: &mut in_place };
        let idx = [t(DType::I64, &[2], &bad)];
        assert!(index_put_in_place(t(DType::F32, &[2, 2], &v), &idx, 0, false, out, cx).is_err());
        assert_eq!(in_place, xb);
        let bad = i64s(&[0, 0, 3, 0]);
        let out = TensorMut { dtype: DType::F32, shape: &[3, 2], data: &mut in_place };
        assert!(scatter_elements_in_place(t(DType::I64, &[2, 2], &bad), sv, 0, None, true, out, cx).is_err());
        assert_eq!(in_place, xb);
    }
}
