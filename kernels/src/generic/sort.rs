//! Sorting along an axis (sort, topk): values or their positions.

use super::common::*;
use crate::types::{DType, Result, Scratch, TensorMut, TensorRef};
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
    mut out: TensorMut,
    scratch: &mut Scratch,
) -> Result<()> {
    const K: &str = "sort";
    let r = x.shape.len();
    if axis >= r || out.shape.len() != r {
        return Err(shape_err(K, format!("axis {axis}, input {:?}, output {:?}", x.shape, out.shape)));
    }
    let (n, k) = (x.shape[axis], out.shape[axis]);
    let others_match = (0..r).all(|i| i == axis || x.shape[i] == out.shape[i]);
    if !others_match || k > n {
        return Err(shape_err(K, format!("output {:?} does not fit input {:?} along axis {axis}", out.shape, x.shape)));
    }
    expect_dtype(K, "out", out.dtype, if indices { DType::I64 } else { x.dtype })?;
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let perm = scratch.indices(n);
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
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
                if indices {
                    let ov = view_mut::<i64>(K, "out", &mut out)?;
                    for (i, &p) in perm[..k].iter().enumerate() {
                        ov[obase + i * inner] = p as i64;
                    }
                } else {
                    let ov = view_mut::<T>(K, "out", &mut out)?;
                    for (i, &p) in perm[..k].iter().enumerate() {
                        ov[obase + i * inner] = *at(p);
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
        let mut s = Scratch::new();
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
