//! Composites that torch's training IR keeps and Core ATen decomposes: ops
//! indexing one dim with an index tensor — `take_along_dim` (a broadcast
//! `gather`) and `index_add` / `index_copy` / `index_fill` (an `index_put`
//! along one dim), and `index_reduce` (a `scatter_reduce` along one dim).
//! They lower onto the same IR ops as their Core ATen forms
//! (`GatherElements`, `IndexPut`, `ScatterElements`), so the results match
//! those forms.

use super::indexing::{bind_as_output, expand, int_index, reshape};
use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Fail, Importer, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, Dim, Op, ReduceKind, ValueId};

/// `aten::take_along_dim(Tensor self, Tensor indices, int? dim=None)`: with
/// `dim`, `self` and `indices` broadcast against each other except along
/// `dim`, then a gather there (negative indices count from the end, as the
/// Core ATen form's `remainder` makes them); without, a gather from the
/// flattened `self` at the flattened `indices`.
pub(super) fn take_along_dim(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let idx = imp.tensor(n, "indices")?;
    let idx = int_index(imp, idx, "take_along_dim indices")?;
    let Some(dim) = imp.opt_int(n, "dim")? else {
        let x = reshape(imp, x, vec![imp.ty(x).numel()]);
        let idx = reshape(imp, idx, vec![imp.ty(idx).numel()]);
        let v = imp.push(Op::GatherElements { axis: 0 }, vec![x, idx])?;
        return bind_as_output(imp, n, v);
    };
    let (xt, it) = (imp.ty(x).clone(), imp.ty(idx).clone());
    if xt.rank() != it.rank() {
        return invalid(format!("take_along_dim of a rank-{} tensor with rank-{} indices", xt.rank(), it.rank()));
    }
    if xt.rank() == 0 {
        let (x, idx) = (reshape(imp, x, vec![Dim::Const(1)]), reshape(imp, idx, vec![Dim::Const(1)]));
        let v = imp.push(Op::GatherElements { axis: 0 }, vec![x, idx])?;
        return bind_as_output(imp, n, v);
    }
    let axis = normalize_axis(dim, xt.rank())?;
    // Broadcast every dim but `axis`, where each keeps its own size.
    let (mut xs, mut is) = (xt.shape.clone(), it.shape.clone());
    xs[axis] = Dim::Const(1);
    is[axis] = Dim::Const(1);
    let mut shape = kiln_ir::infer::broadcast_shapes(&xs, &is).map_err(Fail::Invalid)?;
    shape[axis] = xt.shape[axis].clone();
    let x = expand(imp, x, shape.clone());
    shape[axis] = it.shape[axis].clone();
    let idx = expand(imp, idx, shape);
    let v = imp.push(Op::GatherElements { axis }, vec![x, idx])?;
    bind_as_output(imp, n, v)
}

/// What `index_along` writes at the indexed positions.
enum Write {
    /// `self[.., index[i], ..] += alpha * source[.., i, ..]` (duplicates accumulate).
    Add(ValueId),
    /// `self[.., index[i], ..] = source[.., i, ..]`.
    Copy(ValueId),
    /// `self[.., index[i], ..] = value` (a 0-d tensor, broadcast).
    Fill(ValueId),
}

/// `aten::index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1)`
pub(super) fn index_add(imp: &mut Importer, n: &Node) -> R<()> {
    let source = imp.tensor(n, "source")?;
    let dtype = imp.out_ty(n, 0)?.dtype;
    let source = imp.cast(source, dtype);
    let alpha = imp.opt_scalar(n, "alpha")?.map_or(1.0, |a| a.as_f64());
    // torch multiplies in the dtype (bool's alpha is a no-op, as in Core ATen).
    let source = if alpha != 1.0 && dtype != kiln_ir::DType::Bool {
        imp.with_scalar(BinaryOp::Mul, source, alpha)?
    } else {
        source
    };
    index_along(imp, n, Write::Add(source))
}

/// `aten::index_copy(Tensor self, int dim, Tensor index, Tensor source)`
pub(super) fn index_copy(imp: &mut Importer, n: &Node) -> R<()> {
    let source = imp.tensor(n, "source")?;
    index_along(imp, n, Write::Copy(source))
}

/// `aten::index_fill.int_Scalar(Tensor self, int dim, Tensor index, Scalar value)`,
/// `index_fill.int_Tensor(Tensor self, int dim, Tensor index, Tensor value)` (0-d value).
pub(super) fn index_fill(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = imp.out_ty(n, 0)?.dtype;
    let value = match imp.arg(n, "value") {
        Some(Arg::Tensor(_)) => {
            let v = imp.tensor(n, "value")?;
            if imp.ty(v).rank() != 0 {
                return invalid("index_fill with a value tensor that is not 0-d");
            }
            v
        }
        _ => {
            let s = imp.scalar(n, "value")?;
            imp.scalar_const(s, dtype)
        }
    };
    index_along(imp, n, Write::Fill(value))
}

/// `self` with the positions `index` along `dim` written as `write` says,
/// through `IndexPut` (as Core ATen's `index_put` forms of these ops). A 0-d
/// `self` is read as `[1]`.
fn index_along(imp: &mut Importer, n: &Node, write: Write) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dtype = imp.out_ty(n, 0)?.dtype;
    let x = imp.cast(x, dtype);
    let x = if imp.ty(x).rank() == 0 { reshape(imp, x, vec![Dim::Const(1)]) } else { x };
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let index = imp.tensor(n, "index")?;
    if imp.ty(index).rank() > 1 {
        return unsupported(
            "index_add/index_copy/index_fill with an index of more than one dim (torch requires at most one)",
        );
    }
    let index = int_index(imp, index, "index")?;
    let index = reshape(imp, index, vec![imp.ty(index).numel()]);
    // The values' shape: `self`'s, with the index's length along `axis`.
    let mut target = imp.ty(x).shape.clone();
    target[axis] = imp.ty(index).shape[0].clone();
    let (values, accumulate) = match write {
        Write::Add(v) => (v, true),
        Write::Copy(v) => (v, false),
        Write::Fill(v) => (v, false),
    };
    let values = imp.cast(values, dtype);
    // A 0-d source goes with a 0-d `self` (or is index_fill's value).
    let values = imp.push(Op::Expand { shape: target }, vec![values])?;
    let put = imp.push(Op::IndexPut { axis, accumulate }, vec![x, values, index])?;
    bind_as_output(imp, n, put)
}

/// `aten::index_reduce(Tensor self, int dim, Tensor index, Tensor source,
/// str reduce, *, bool include_self=True)`: `self[.., index[i], ..]` reduced
/// with `source[.., i, ..]` (prod, mean, amax, amin). The index runs along
/// `dim` of `source`, so broadcast over `source`'s other dims it is a
/// `scatter_reduce` index, and the op is that scatter (the same counts for
/// mean, floor division for integers, NaN propagation).
pub(super) fn index_reduce(imp: &mut Importer, n: &Node) -> R<()> {
    let kind = match imp.string(n, "reduce", "")? {
        "prod" => ReduceKind::Prod,
        "mean" => ReduceKind::Mean,
        "amax" => ReduceKind::Max,
        "amin" => ReduceKind::Min,
        other => return invalid(format!("index_reduce with reduce=`{other}` (torch takes prod, mean, amax, amin)")),
    };
    let include_self = imp.bool(n, "include_self", true)?;
    let dtype = imp.out_ty(n, 0)?.dtype;
    let at_least_1d = |imp: &mut Importer, v: ValueId| {
        let v = imp.cast(v, dtype);
        if imp.ty(v).rank() == 0 {
            reshape(imp, v, vec![Dim::Const(1)])
        } else {
            v
        }
    };
    let x = imp.tensor(n, "self")?;
    let x = at_least_1d(imp, x);
    let source = imp.tensor(n, "source")?;
    let source = at_least_1d(imp, source);
    let rank = imp.ty(x).rank();
    if imp.ty(source).rank() != rank {
        return invalid(format!("index_reduce of a rank-{rank} tensor with a rank-{} source", imp.ty(source).rank()));
    }
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let index = imp.tensor(n, "index")?;
    if imp.ty(index).rank() > 1 {
        return invalid("index_reduce with an index of more than one dim (torch requires at most one)");
    }
    let index = int_index(imp, index, "index")?;
    let len = imp.ty(index).numel();
    // [1, .., len, .., 1] along `axis`, then broadcast to the source's shape.
    let mut along = vec![Dim::Const(1); rank];
    along[axis] = len;
    let index = reshape(imp, index, along);
    let index = expand(imp, index, imp.ty(source).shape.clone());
    let v = imp.push(Op::ScatterElements { axis, reduce: Some(kind), include_self }, vec![x, index, source])?;
    bind_as_output(imp, n, v)
}
