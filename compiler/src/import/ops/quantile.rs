//! `quantile` and `nanquantile`, as torch's `quantile_compute` does them:
//! sort along the reduced dim (NaN last), a fractional rank per quantile,
//! then the values at the ranks below and above, interpolated. The reduced
//! dim needs a static length (its last index scales the ranks).

use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, UnaryOp as U, ValueId};

/// How a fractional rank picks or blends the sorted values around it.
#[derive(Clone, Copy, PartialEq)]
enum Interpolation {
    Linear,
    Lower,
    Higher,
    Nearest,
    Midpoint,
}

/// `aten::quantile(Tensor self, Tensor q, int? dim=None, bool keepdim=False,
/// *, str interpolation='linear')`, `quantile.scalar(.., float q, ..)` and the
/// same `nanquantile` forms (`skip_nan`): NaNs are left out of the ranks
/// instead of making the result NaN.
pub(super) fn quantile(imp: &mut Importer, n: &Node, skip_nan: bool) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let dtype = out.dtype;
    if !matches!(dtype, DType::F32 | DType::F64) {
        return invalid(format!("quantile of {dtype} (torch takes f32 and f64)"));
    }
    let mode = match imp.string(n, "interpolation", "linear")? {
        "linear" => Interpolation::Linear,
        "lower" => Interpolation::Lower,
        "higher" => Interpolation::Higher,
        "nearest" => Interpolation::Nearest,
        "midpoint" => Interpolation::Midpoint,
        other => return invalid(format!("quantile interpolation `{other}`")),
    };
    let x = imp.tensor(n, "self")?;
    let x = imp.cast(x, dtype);
    let rows = along_last(imp, n, x)?;
    let rank = imp.ty(rows).rank();
    let last = rank - 1;
    let len = match imp.ty(rows).shape[last].as_const() {
        Some(l) if l > 0 => l,
        Some(_) => return unsupported("quantile of an empty tensor (torch raises)"),
        None => return unsupported("quantile along a dynamic dimension"),
    };
    // q as [Q], its values in the dtype (torch requires q's dtype to match).
    let (q, q_scalar) = match imp.arg(n, "q") {
        Some(Arg::Tensor(_)) => {
            let q = imp.tensor(n, "q")?;
            let scalar = imp.ty(q).rank() == 0;
            let count = imp.ty(q).numel();
            let q = imp.cast(q, dtype);
            (imp.push(Op::Reshape { shape: vec![count] }, vec![q])?, scalar)
        }
        _ => {
            let value = imp.float(n, "q", None)?;
            let q = imp.scalar_const(Scalar::Float(value), dtype);
            (imp.push(Op::Reshape { shape: vec![Dim::Const(1)] }, vec![q])?, true)
        }
    };
    let sorted =
        imp.push(Op::Sort { axis: last, k: Dim::Const(len), descending: false, indices: false }, vec![rows])?;
    // q broadcast against the rows: [1, .., 1, Q].
    let mut q_shape = vec![Dim::Const(1); last];
    q_shape.push(imp.ty(q).shape[0].clone());
    let q = imp.push(Op::Reshape { shape: q_shape }, vec![q])?;
    let nan = imp.push(Op::Binary(B::Ne), vec![sorted, sorted])?;
    let ranks = if skip_nan {
        // q · (number of non-NaN values - 1), at least 0 (all NaN: rank 0, NaN).
        let kept = imp.push(Op::Unary(U::Not), vec![nan])?;
        let kept = imp.cast(kept, dtype);
        let count = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![last], keep_dims: true }, vec![kept])?;
        let top = imp.with_scalar(B::Sub, count, 1.0)?;
        let r = imp.push(Op::Binary(B::Mul), vec![q, top])?;
        imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![r])?
    } else {
        // q · (len - 1); the last index (a NaN) where the row holds a NaN.
        let r = imp.with_scalar(B::Mul, q, (len - 1) as f64)?;
        let nan_i = imp.cast(nan, DType::I64);
        let any = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![last], keep_dims: true }, vec![nan_i])?;
        let any = imp.cast(any, DType::Bool);
        let top = imp.scalar_const(Scalar::Float((len - 1) as f64), dtype);
        imp.push(Op::Where, vec![any, top, r])?
    };
    let ranks = match mode {
        Interpolation::Lower => imp.push(Op::Unary(U::Floor), vec![ranks])?,
        Interpolation::Higher => imp.push(Op::Unary(U::Ceil), vec![ranks])?,
        Interpolation::Nearest => imp.push(Op::Unary(U::Round), vec![ranks])?,
        Interpolation::Linear | Interpolation::Midpoint => ranks,
    };
    let below = imp.cast(ranks, DType::I64);
    let below_values = gather_last(imp, sorted, below, last)?;
    let v = if matches!(mode, Interpolation::Linear | Interpolation::Midpoint) {
        let ceil = imp.push(Op::Unary(U::Ceil), vec![ranks])?;
        let above = imp.cast(ceil, DType::I64);
        let above_values = gather_last(imp, sorted, above, last)?;
        let weight = if mode == Interpolation::Midpoint {
            let shape = imp.ty(ranks).shape.clone();
            imp.push_typed(Op::Full { value: 0.5, dtype, shape: shape.clone() }, vec![], TensorType::new(dtype, shape))
        } else {
            let below_f = imp.cast(below, dtype);
            imp.push(Op::Binary(B::Sub), vec![ranks, below_f])?
        };
        lerp(imp, below_values, above_values, weight)?
    } else {
        below_values
    };
    // [.., Q] -> [Q, ..] (or [..] for a scalar q); the declared shape adds
    // keepdim's ones, the element order being the same.
    let v = if q_scalar || rank == 1 {
        v
    } else {
        let mut perm: Vec<usize> = vec![last];
        perm.extend(0..last);
        imp.push(Op::Permute { perm }, vec![v])?
    };
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `x` with the reduced dim last and the others in order (`dim=None`: all of
/// `x` as one row).
fn along_last(imp: &mut Importer, n: &Node, x: ValueId) -> R<ValueId> {
    let rank = imp.ty(x).rank();
    match imp.opt_int(n, "dim")? {
        None => {
            let count = imp.ty(x).numel();
            imp.push(Op::Reshape { shape: vec![count] }, vec![x])
        }
        Some(_) if rank == 0 => imp.push(Op::Reshape { shape: vec![Dim::Const(1)] }, vec![x]),
        Some(dim) => {
            let axis = normalize_axis(dim, rank)?;
            if axis == rank - 1 {
                return Ok(x);
            }
            let mut perm: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
            perm.push(axis);
            imp.push(Op::Permute { perm }, vec![x])
        }
    }
}

/// `sorted`'s values at `index` along `last` (`index` [.., Q] broadcast over
/// the rows' leading dims).
fn gather_last(imp: &mut Importer, sorted: ValueId, index: ValueId, last: usize) -> R<ValueId> {
    let mut shape = imp.ty(sorted).shape.clone();
    shape[last] = imp.ty(index).shape[last].clone();
    let index = if imp.ty(index).shape == shape { index } else { imp.push(Op::Expand { shape }, vec![index])? };
    imp.push(Op::GatherElements { axis: last }, vec![sorted, index])
}

/// torch's CPU `lerp`: `a + w·(b - a)` below w = 0.5, `b - (b - a)·(1 - w)`
/// from there (exact at both ends).
fn lerp(imp: &mut Importer, a: ValueId, b: ValueId, w: ValueId) -> R<ValueId> {
    let d = imp.push(Op::Binary(B::Sub), vec![b, a])?;
    let wd = imp.push(Op::Binary(B::Mul), vec![w, d])?;
    let low = imp.push(Op::Binary(B::Add), vec![a, wd])?;
    let dtype = imp.ty(w).dtype;
    let one = imp.scalar_const(Scalar::Float(1.0), dtype);
    let rest = imp.push(Op::Binary(B::Sub), vec![one, w])?;
    let dr = imp.push(Op::Binary(B::Mul), vec![d, rest])?;
    let high = imp.push(Op::Binary(B::Sub), vec![b, dr])?;
    let small = imp.with_scalar(B::Lt, w, 0.5)?;
    imp.push(Op::Where, vec![small, low, high])
}
