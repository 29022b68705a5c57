//! Selection along a dim: `kthvalue`, `median`, `nanmedian` (through kiln's
//! stable sort, NaN above everything as in torch) and `mode` (pairwise
//! equality counts). The selected dim needs a static length.
//!
//! Which index torch returns among equal values differs by op: `mode`
//! returns the last occurrence of its value (its CPU kernel sorts (value,
//! index) pairs with an insertion sort below 16 elements and takes a run's
//! last pair), which kiln returns too. `kthvalue`/`median` pick by
//! quickselect, whose order among ties no fixed rule gives; kiln returns
//! the stable sort's position, an index holding the same value.

use super::shape::normalize_axis;
use crate::import::importer::{invalid, output_names, unsupported, Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, ValueId};

/// The names of `n`'s outputs (one entry per output; lists flattened).
fn outputs(n: &Node) -> Vec<String> {
    n.outputs.iter().flat_map(output_names).collect()
}

/// The static length of `x`'s `axis`.
fn static_len(imp: &Importer, x: ValueId, axis: usize, what: &str) -> R<i64> {
    match imp.ty(x).shape.get(axis).and_then(Dim::as_const) {
        Some(l) => Ok(l),
        None => unsupported(format!("{what} along a dynamic dimension")),
    }
}

/// `x`'s positions `[start, start + 1)` along `axis`.
fn pick(imp: &mut Importer, x: ValueId, axis: usize, start: i64) -> R<ValueId> {
    imp.push(Op::Slice { axis, start, end: start + 1, step: 1 }, vec![x])
}

/// Reshapes `v` to output `index`'s declared shape (same elements, the
/// reduced dim kept or not) and binds it, if the program reads that output.
fn bind_as(imp: &mut Importer, n: &Node, index: usize, v: ValueId) -> R<()> {
    let ty = imp.out_ty(n, index)?;
    let v = imp.cast(v, ty.dtype);
    let v = if imp.ty(v).shape == ty.shape {
        v
    } else {
        imp.push_typed(Op::Reshape { shape: ty.shape.clone() }, vec![v], ty)
    };
    imp.bind(n, index, v)
}

/// A 0-d input's selection: the value itself and index 0.
fn of_scalar(imp: &mut Importer, n: &Node, x: ValueId) -> R<()> {
    let names = outputs(n);
    bind_as(imp, n, 0, x)?;
    if names.len() > 1 && imp.is_used(&names[1]) {
        let zero = imp.scalar_const(Scalar::Int(0), DType::I64);
        bind_as(imp, n, 1, zero)?;
    }
    Ok(())
}

/// The sorted values (and, when asked, their stable-sort indices) of `x`
/// along `axis`, ascending with NaN last.
fn sorted(imp: &mut Importer, x: ValueId, axis: usize, k: i64, indices: bool) -> R<ValueId> {
    imp.push(Op::Sort { axis, k: Dim::Const(k), descending: false, indices }, vec![x])
}

/// `x` flattened to 1-d, for the whole-tensor overloads.
fn flat(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let numel = imp.ty(x).numel();
    imp.push(Op::Reshape { shape: vec![numel] }, vec![x])
}

/// The axis of `dim` and the number of outputs, checked: `(values, indices)`.
fn dim_and_outputs(imp: &mut Importer, n: &Node, x: ValueId, default: Option<i64>, what: &str) -> R<usize> {
    if outputs(n).len() != 2 {
        return invalid(format!("{what} must have two outputs"));
    }
    normalize_axis(imp.int(n, "dim", default)?, imp.ty(x).rank())
}

/// `aten::kthvalue(Tensor self, int k, int dim=-1, bool keepdim=False) -> (values, indices)`:
/// the k-th smallest (NaN counting as the largest, as in torch).
pub(super) fn kthvalue(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let k = imp.int(n, "k", None)?;
    if imp.ty(x).rank() == 0 {
        if k != 1 {
            return invalid(format!("kthvalue k = {k} of a 0-d tensor"));
        }
        return of_scalar(imp, n, x);
    }
    let axis = dim_and_outputs(imp, n, x, Some(-1), "kthvalue")?;
    let len = static_len(imp, x, axis, "kthvalue")?;
    if !(1..=len).contains(&k) {
        return invalid(format!("kthvalue k = {k} out of range for a dim of {len}"));
    }
    let names = outputs(n);
    for (i, indices) in [(0, false), (1, true)] {
        if i == 0 || imp.is_used(&names[i]) {
            let s = sorted(imp, x, axis, k, indices)?;
            let v = pick(imp, s, axis, k - 1)?;
            bind_as(imp, n, i, v)?;
        }
    }
    Ok(())
}

/// Whether each element of float `v` is NaN (`v != v`).
fn is_nan(imp: &mut Importer, v: ValueId) -> R<ValueId> {
    imp.push(Op::Binary(B::Ne), vec![v, v])
}

/// `aten::median(Tensor self)` (the lower median of all elements, NaN if
/// any is) and `aten::median.dim(Tensor self, int dim, bool keepdim=False)
/// -> (values, indices)`.
pub(super) fn median(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let (x, axis) = match overload {
        "default" => (flat(imp, x)?, 0),
        _ if imp.ty(x).rank() == 0 => return of_scalar(imp, n, x),
        _ => (x, dim_and_outputs(imp, n, x, None, "median")?),
    };
    let len = static_len(imp, x, axis, "median")?;
    if len == 0 {
        return empty_median(imp, n, overload);
    }
    let names = outputs(n);
    let float = imp.ty(x).dtype.is_float();
    for (i, indices) in [(0, false), (1, true)] {
        if i > 0 && names.get(i).is_none_or(|name| !imp.is_used(name)) {
            continue;
        }
        let s = sorted(imp, x, axis, len, indices)?;
        let mut v = pick(imp, s, axis, (len - 1) / 2)?;
        if float {
            // A NaN sorts last: the median is NaN (and its index a NaN's).
            let values = if indices { sorted(imp, x, axis, len, false)? } else { s };
            let top = pick(imp, values, axis, len - 1)?;
            let nan = is_nan(imp, top)?;
            let top_pick = if indices { pick(imp, s, axis, len - 1)? } else { top };
            v = imp.push(Op::Where, vec![nan, top_pick, v])?;
        }
        bind_as(imp, n, i, v)?;
    }
    Ok(())
}

/// `median`/`nanmedian` of an empty tensor: NaN (torch's answer for the
/// whole-tensor overloads; the dim overloads raise in torch).
fn empty_median(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    if overload != "default" {
        return invalid("median along an empty dim");
    }
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::Full { value: f64::NAN, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty);
    imp.bind(n, 0, v)
}

/// `aten::nanmedian(Tensor self)` and `aten::nanmedian.dim(Tensor self, int dim, bool keepdim=False)
/// -> (values, indices)`: the lower median of the elements that are not NaN
/// (NaN when all are), at sorted position ⌊(count - 1) / 2⌋.
pub(super) fn nanmedian(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    if !imp.ty(x).dtype.is_float() {
        return median(imp, n, overload);
    }
    let (x, axis) = match overload {
        "default" => (flat(imp, x)?, 0),
        _ if imp.ty(x).rank() == 0 => return of_scalar(imp, n, x),
        _ => (x, dim_and_outputs(imp, n, x, None, "nanmedian")?),
    };
    let len = static_len(imp, x, axis, "nanmedian")?;
    if len == 0 {
        return empty_median(imp, n, overload);
    }
    let names = outputs(n);
    let nan = is_nan(imp, x)?;
    let not_nan = imp.push(Op::Unary(kiln_ir::UnaryOp::Not), vec![nan])?;
    let ones = imp.cast(not_nan, DType::I64);
    let count = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: true }, vec![ones])?;
    let below = imp.with_scalar(B::Sub, count, 1.0)?;
    let pos = imp.with_scalar(B::FloorDiv, below, 2.0)?;
    let pos = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![pos])?;
    for (i, indices) in [(0, false), (1, true)] {
        if i > 0 && names.get(i).is_none_or(|name| !imp.is_used(name)) {
            continue;
        }
        let s = sorted(imp, x, axis, len, indices)?;
        let v = imp.push(Op::GatherElements { axis }, vec![s, pos])?;
        bind_as(imp, n, i, v)?;
    }
    Ok(())
}

/// `aten::mode(Tensor self, int dim=-1, bool keepdim=False) -> (values, indices)`:
/// the most frequent value along `dim` (the smallest among equally frequent
/// ones) and the index of its last occurrence, from the `[.., L, L]`
/// pairwise equality counts.
pub(super) fn mode(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    if rank == 0 {
        return of_scalar(imp, n, x);
    }
    let axis = dim_and_outputs(imp, n, x, Some(-1), "mode")?;
    let len = static_len(imp, x, axis, "mode")?;
    if len == 0 {
        return invalid("mode along an empty dim");
    }
    let dtype = imp.ty(x).dtype;
    // bool compares and reduces as u8.
    let work = if dtype == DType::Bool { DType::U8 } else { dtype };
    let x = imp.cast(x, work);
    let mut perm: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
    perm.push(axis);
    let w = if axis + 1 == rank { x } else { imp.push(Op::Permute { perm }, vec![x])? };
    let last = rank - 1;
    let mut col = imp.ty(w).shape.clone();
    col.push(Dim::Const(1));
    let mut row = imp.ty(w).shape.clone();
    row.insert(last, Dim::Const(1));
    let a = imp.push(Op::Reshape { shape: col }, vec![w])?;
    let b = imp.push(Op::Reshape { shape: row }, vec![w])?;
    let eq = imp.push(Op::Binary(B::Eq), vec![a, b])?;
    let eq = imp.cast(eq, DType::I64);
    let count = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![rank], keep_dims: false }, vec![eq])?;
    let most = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![last], keep_dims: true }, vec![count])?;
    let candidate = imp.push(Op::Binary(B::Eq), vec![count, most])?;
    let above = match work {
        DType::I64 => Scalar::Int(i64::MAX),
        DType::I32 => Scalar::Int(i32::MAX.into()),
        DType::I16 => Scalar::Int(i16::MAX.into()),
        DType::I8 => Scalar::Int(i8::MAX.into()),
        DType::U8 => Scalar::Int(u8::MAX.into()),
        _ => Scalar::Float(f64::INFINITY),
    };
    let above = imp.scalar_const(above, work);
    let masked = imp.push(Op::Where, vec![candidate, w, above])?;
    let value = imp.push(Op::Reduce { kind: ReduceKind::Min, axes: vec![last], keep_dims: true }, vec![masked])?;
    let names = outputs(n);
    if imp.is_used(&names[1]) {
        let positions = TensorType::new(DType::I64, vec![Dim::Const(len)]);
        let positions = imp.push_typed(
            Op::Arange { start: 0.0, step: 1.0, len: Dim::Const(len), dtype: DType::I64 },
            vec![],
            positions,
        );
        let hit = imp.push(Op::Binary(B::Eq), vec![w, value])?;
        let none = imp.scalar_const(Scalar::Int(-1), DType::I64);
        let at = imp.push(Op::Where, vec![hit, positions, none])?;
        let index = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![last], keep_dims: false }, vec![at])?;
        bind_as(imp, n, 1, index)?;
    }
    bind_as(imp, n, 0, value)
}
