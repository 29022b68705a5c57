//! Sorting along an axis (sort, topk): values or their positions.

use super::common::*;
use crate::context::Context;
use crate::types::{DType, Result, TensorMut, TensorRef};
use std::cmp::Ordering;

/// Total order with NaN above everything (torch's sort order); `v != v` is
/// the NaN test that works for every element type.
#[inline(always)]
#[allow(clippy::eq_op)]
fn nan_last<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    match (a != a, b != b) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    }
}

/// The first `k = out.shape[axis]` elements along `axis` of `x` sorted
/// (stably; ascending or descending), as values (`out` of `x`'s dtype) or as
/// i64 positions (`indices`).
pub fn sort(
    x: TensorRef,
    axis: usize,
    descending: bool,
    indices: bool,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    if indices {
        sort_into(x, axis, descending, None, Some(out), cx)
    } else {
        sort_into(x, axis, descending, Some(out), None, cx)
    }
}

/// One sort with both results: the first `k = values_out.shape[axis]` values
/// (x's dtype) and their i64 positions (`indices_out`, the same shape) —
/// exactly what [`sort`] gives with `indices` false and true (NaN last, ties
/// in input order).
pub fn sort_both(
    x: TensorRef,
    axis: usize,
    descending: bool,
    values_out: TensorMut,
    indices_out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "sort";
    if values_out.shape != indices_out.shape {
        return Err(shape_err(
            K,
            format!("values {:?} and indices {:?} must have one shape", values_out.shape, indices_out.shape),
        ));
    }
    sort_into(x, axis, descending, Some(values_out), Some(indices_out), cx)
}

/// Sorts each row along `axis` once and writes whichever outputs are given
/// (at least one; both have the same shape).
fn sort_into(
    x: TensorRef,
    axis: usize,
    descending: bool,
    mut values: Option<TensorMut>,
    mut indices: Option<TensorMut>,
    cx: &mut Context,
) -> Result<()> {
    let scratch = &mut cx.scratch;
    const K: &str = "sort";
    let Some(out_shape) = values.as_ref().or(indices.as_ref()).map(|t| t.shape) else {
        return Err(shape_err(K, "no output"));
    };
    let r = x.shape.len();
    if axis >= r || out_shape.len() != r {
        return Err(shape_err(K, format!("axis {axis}, input {:?}, output {:?}", x.shape, out_shape)));
    }
    let (n, k) = (x.shape[axis], out_shape[axis]);
    let others_match = (0..r).all(|i| i == axis || x.shape[i] == out_shape[i]);
    if !others_match || k > n {
        return Err(shape_err(K, format!("output {:?} does not fit input {:?} along axis {axis}", out_shape, x.shape)));
    }
    if let Some(v) = &values {
        expect_dtype(K, "out", v.dtype, x.dtype)?;
    }
    if let Some(i) = &indices {
        expect_dtype(K, "out", i.dtype, DType::I64)?;
    }
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let perm = scratch.indices(n);
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let mut vv = values.as_mut().map(|v| view_mut::<T>(K, "out", v)).transpose()?;
        let mut iv = indices.as_mut().map(|i| view_mut::<i64>(K, "out", i)).transpose()?;
        for o in 0..outer {
            for j in 0..inner {
                let base = o * n * inner + j;
                for (i, p) in perm.iter_mut().enumerate() {
                    *p = i;
                }
                let at = |i: usize| &xv[base + i * inner];
                if descending {
                    perm.sort_by(|&a, &b| nan_last(at(b), at(a)));
                } else {
                    perm.sort_by(|&a, &b| nan_last(at(a), at(b)));
                }
                let obase = o * k * inner + j;
                if let Some(iv) = iv.as_deref_mut() {
                    for (i, &p) in perm[..k].iter().enumerate() {
                        iv[obase + i * inner] = p as i64;
                    }
                }
                if let Some(vv) = vv.as_deref_mut() {
                    for (i, &p) in perm[..k].iter().enumerate() {
                        vv[obase + i * inner] = *at(p);
                    }
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_rows_with_nan_last_and_stable_ties() {
        let x = [3.0f32, f32::NAN, 1.0, 3.0, 2.0, 0.0];
        let xb: &[u8] = bytemuck::cast_slice(&x);
        let mut s = crate::Context::new();
        let mut vals = [0f32; 3];
        let vb: &mut [u8] = bytemuck::cast_slice_mut(&mut vals);
        let x_ref = TensorRef { dtype: DType::F32, shape: &[1, 6], data: xb };
        sort(x_ref, 1, true, false, TensorMut { dtype: DType::F32, shape: &[1, 3], data: vb }, &mut s).unwrap();
        assert!(vals[0].is_nan() && vals[1] == 3.0 && vals[2] == 3.0);
        let mut idx = [0i64; 6];
        let ib: &mut [u8] = bytemuck::cast_slice_mut(&mut idx);
        sort(x_ref, 1, false, true, TensorMut { dtype: DType::I64, shape: &[1, 6], data: ib }, &mut s).unwrap();
        assert_eq!(idx, [5, 2, 4, 0, 3, 1]);
    }
}
