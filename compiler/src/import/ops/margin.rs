//! The multi-class margin losses, `multi_margin_loss` and
//! `multilabel_margin_loss` (with `multilabel_margin_loss_forward`, which
//! also returns the target mask), as torch's decompositions
//! (`torch/_decomp/decompositions.py`) write them, on kiln's primitives in
//! the math dtype (f32 for f16/bf16). A vector input is one row; its
//! unreduced loss is then a 0-d tensor, as torch's.

use super::activation::compute_dtype;
use super::composite::{bin, reshape};
use crate::import::importer::{invalid, Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, ValueId};

/// Converts `name` if it is one of this module's ops.
pub(super) fn dispatch(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    match name {
        "multi_margin_loss" => multi_margin_loss(imp, n),
        "multilabel_margin_loss" => multilabel_margin_loss(imp, n, false),
        "multilabel_margin_loss_forward" => multilabel_margin_loss(imp, n, true),
        _ => Err(crate::import::importer::Fail::Unsupported(None)),
    }
}

/// `x` as a batch of rows `[N, C]`: a vector is one row, a scalar one
/// row of one class (torch's `atleast_2d`).
fn as_rows(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let shape = imp.ty(x).shape.clone();
    match shape.len() {
        0 => reshape(imp, x, vec![Dim::Const(1), Dim::Const(1)]),
        1 => reshape(imp, x, vec![Dim::Const(1), shape[0].clone()]),
        2 => Ok(x),
        r => invalid(format!("margin loss: input of rank {r} (expected a vector or a matrix)")),
    }
}

fn reduce(imp: &mut Importer, x: ValueId, kind: ReduceKind, axes: Vec<usize>) -> R<ValueId> {
    imp.push(Op::Reduce { kind, axes, keep_dims: false }, vec![x])
}

/// `0, 1, .., C − 1` (i64) for the class axis of the rows `x`.
fn class_ids(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let classes = imp.ty(x).shape[1].clone();
    imp.push(Op::Arange { start: 0.0, step: 1.0, len: classes, dtype: DType::I64 }, vec![])
}

/// `x` with a size-1 axis inserted at `axis`.
fn unsqueeze(imp: &mut Importer, x: ValueId, axis: usize) -> R<ValueId> {
    let mut shape = imp.ty(x).shape.clone();
    shape.insert(axis, Dim::Const(1));
    reshape(imp, x, shape)
}

/// Applies `reduction` to per-row losses `[N]`: none keeps them (reshaped
/// to the output's shape, 0-d for a vector input), mean and sum reduce.
fn reduce_rows(imp: &mut Importer, n: &Node, index: usize, per_row: ValueId) -> R<()> {
    let v = match imp.int(n, "reduction", Some(1))? {
        0 => per_row,
        1 => reduce(imp, per_row, ReduceKind::Mean, vec![0])?,
        2 => reduce(imp, per_row, ReduceKind::Sum, vec![0])?,
        r => return invalid(format!("reduction {r} (expected 0, 1 or 2)")),
    };
    let out = imp.out_ty(n, index)?;
    let v = imp.cast(v, out.dtype);
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out)
    };
    imp.bind(n, index, v)
}

/// `multi_margin_loss(self, target, p=1, margin=1, weight=None,
/// reduction=Mean)`: per row, the mean over classes `j ≠ y` of
/// `w[y]·max(0, margin − x[y] + x[j])^p` (p 1 or 2); torch's `sum` is the
/// sum of those means, as here.
fn multi_margin_loss(imp: &mut Importer, n: &Node) -> R<()> {
    let c = compute_dtype(imp.out_ty(n, 0)?.dtype);
    let x = imp.tensor(n, "self")?;
    let x = imp.cast(x, c);
    let x = as_rows(imp, x)?;
    let rows = imp.ty(x).shape[0].clone();
    let target = imp.tensor(n, "target")?;
    let target = imp.cast(target, DType::I64);
    let target = reshape(imp, target, vec![rows.clone(), Dim::Const(1)])?;
    let p = imp.float(n, "p", Some(1.0))?;
    if p != 1.0 && p != 2.0 {
        return invalid(format!("multi_margin_loss: p = {p} (only 1 and 2 are supported)"));
    }
    let margin = imp.float(n, "margin", Some(1.0))?;
    // margin − x[y] + x[j], clamped at 0.
    let picked = imp.push(Op::GatherElements { axis: 1 }, vec![x, target])?;
    let m = imp.scalar_const(Scalar::Float(margin), c);
    let gap = bin(imp, B::Sub, m, picked)?;
    let z = bin(imp, B::Add, gap, x)?;
    let mut z = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![z])?;
    if p == 2.0 {
        z = bin(imp, B::Mul, z, z)?;
    }
    if let Some(w) = imp.opt_tensor(n, "weight")? {
        let w = imp.cast(w, c);
        // A 0-d weight is the one class's.
        let w = if imp.ty(w).rank() == 0 { reshape(imp, w, vec![Dim::Const(1)])? } else { w };
        let y = reshape(imp, target, vec![rows.clone()])?;
        let wy = imp.push(Op::Gather { axis: 0 }, vec![w, y])?;
        let wy = unsqueeze(imp, wy, 1)?;
        z = bin(imp, B::Mul, z, wy)?;
    }
    let ids = class_ids(imp, x)?;
    let other = bin(imp, B::Ne, ids, target)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), c);
    let z = imp.push(Op::Where, vec![other, z, zero])?;
    let per_row = reduce(imp, z, ReduceKind::Mean, vec![1])?;
    reduce_rows(imp, n, 0, per_row)
}

/// `multilabel_margin_loss(self, target, reduction=Mean)`: a row's targets
/// are its `target` entries before the first −1; its loss is the sum over
/// targets `y` and non-target classes `j` of `max(0, 1 − (x[y] − x[j])) / C`.
/// `_forward` also returns which classes are targets (in `self`'s dtype).
fn multilabel_margin_loss(imp: &mut Importer, n: &Node, with_mask: bool) -> R<()> {
    let c = compute_dtype(imp.out_ty(n, 0)?.dtype);
    let x = imp.tensor(n, "self")?;
    let x = imp.cast(x, c);
    let x = as_rows(imp, x)?;
    let target = imp.tensor(n, "target")?;
    let target = imp.cast(target, DType::I64);
    let target = as_rows(imp, target)?;
    // Slots before the first −1: no −1 at or before them.
    let is_end = imp.with_scalar(B::Eq, target, -1.0)?;
    let ends = imp.cast(is_end, DType::I64);
    let ends_so_far = imp.push(Op::CumSum { axis: 1 }, vec![ends])?;
    let slot_used = imp.with_scalar(B::Eq, ends_so_far, 0.0)?;
    let zero_id = imp.scalar_const(Scalar::Int(0), DType::I64);
    let safe = imp.push(Op::Where, vec![slot_used, target, zero_id])?;
    let picked = imp.push(Op::GatherElements { axis: 1 }, vec![x, safe])?;
    // is_target[i, j]: some used slot of row i names class j.
    let none = imp.scalar_const(Scalar::Int(-1), DType::I64);
    let named = imp.push(Op::Where, vec![slot_used, target, none])?;
    let named = unsqueeze(imp, named, 2)?;
    let ids = class_ids(imp, x)?;
    let hits = bin(imp, B::Eq, named, ids)?;
    let hits = imp.cast(hits, DType::I64);
    let hits = reduce(imp, hits, ReduceKind::Max, vec![1])?;
    let is_target = imp.with_scalar(B::Ne, hits, 0.0)?;
    // z[i, k, j] = max(0, 1 − x[i, y_k] + x[i, j]), kept for used slots k
    // and non-target classes j.
    let one = imp.scalar_const(Scalar::Float(1.0), c);
    let picked = unsqueeze(imp, picked, 2)?;
    let gap = bin(imp, B::Sub, one, picked)?;
    let xj = unsqueeze(imp, x, 1)?;
    let z = bin(imp, B::Add, gap, xj)?;
    let z = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![z])?;
    let zero = imp.scalar_const(Scalar::Float(0.0), c);
    let target_class = unsqueeze(imp, is_target, 1)?;
    let z = imp.push(Op::Where, vec![target_class, zero, z])?;
    let used = unsqueeze(imp, slot_used, 2)?;
    let z = imp.push(Op::Where, vec![used, z, zero])?;
    let per_class = reduce(imp, z, ReduceKind::Sum, vec![1])?;
    let per_row = reduce(imp, per_class, ReduceKind::Mean, vec![1])?;
    reduce_rows(imp, n, 0, per_row)?;
    if with_mask {
        let out = imp.out_ty(n, 1)?;
        let mask = imp.cast(is_target, out.dtype);
        let mask = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![mask], out);
        imp.bind(n, 1, mask)?;
    }
    Ok(())
}
