//! Ops whose output sizes depend on tensor values: `nonzero` (and the boolean
//! masks that index through it), and `.item()` (`_local_scalar_dense`).
//! torch.export names such a size with an unbacked symbol (`u0`); kiln binds
//! it at run time with `Op::BindDim` from a count computed in the graph (or
//! the `.item()` value), then runs the ops it shapes in buffers planned for
//! the symbol's upper bound.

use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Importer, R};
use crate::pt2::program::{Arg, Node, SymIntArg};
use kiln_ir::{DType, Dim, Op, ReduceKind, TensorType, ValueId};

/// `aten::nonzero(Tensor self) -> Tensor` and `aten::argwhere(Tensor self)`.
pub(super) fn nonzero(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let count = out.shape.first().cloned().unwrap_or(Dim::Const(0));
    let v = nonzero_of(imp, x, &count)?;
    imp.bind(n, 0, v)
}

/// `aten::nonzero_static(Tensor self, *, SymInt size, int fill_value=-1)`:
/// the first `size` coordinates, rows past the count filled with `fill_value`.
pub(super) fn nonzero_static(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let size = imp.int(n, "size", None)?;
    let fill = imp.int(n, "fill_value", Some(-1))?;
    if size < 0 {
        return invalid(format!("nonzero_static size {size}"));
    }
    let rank = imp.ty(x).rank() as i64;
    // A private symbol for the true count, bounded by the input's size.
    let name = format!("nonzero_count_{}", imp.g.symbols.len());
    let sym = imp.g.add_symbol(name, 0, None);
    let found = nonzero_of(imp, x, &Dim::Sym(sym))?;
    // Pad with `size` fill rows, then keep the first `size` rows: exactly
    // torch's result whether the count is below or above `size`.
    let filler = imp.push_typed(
        Op::Full { value: fill as f64, dtype: DType::I64, shape: vec![Dim::Const(size), Dim::Const(rank)] },
        Vec::new(),
        TensorType::fixed(DType::I64, &[size, rank]),
    );
    let both = imp.push(Op::Concat { axis: 0 }, vec![found, filler])?;
    let first = imp.push(Op::Slice { axis: 0, start: 0, end: size, step: 1 }, vec![both])?;
    imp.bind(n, 0, first)
}

/// The coordinates of `x`'s nonzero elements (i64 `[count, rank]`), where
/// `count` is the program's symbol for their number: its upper bound is
/// narrowed to `x`'s element count, the number is computed and bound with
/// `BindDim` (once per symbol), then `NonZero` writes the coordinates.
pub(crate) fn nonzero_of(imp: &mut Importer, x: ValueId, count: &Dim) -> R<ValueId> {
    if count.as_const() == Some(0) {
        // torch states the count only when the input is empty: no coordinates.
        let rank = imp.ty(x).rank() as i64;
        let shape = vec![Dim::Const(0), Dim::Const(rank)];
        return Ok(imp.push_typed(
            Op::Full { value: 0.0, dtype: DType::I64, shape: shape.clone() },
            Vec::new(),
            TensorType::new(DType::I64, shape),
        ));
    }
    let Dim::Sym(sym) = *count else {
        return unsupported(format!(
            "nonzero whose size torch gives as `{}` (kiln binds a plain unbacked symbol)",
            count.display(&imp.g.symbols)
        ));
    };
    let xt = imp.ty(x).clone();
    let (_, numel_max) = xt.numel().bounds(&imp.g.symbols);
    let s = &mut imp.g.symbols[sym];
    s.min = s.min.max(0);
    s.max = match (s.max, numel_max) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if s.max.is_none() {
        return unsupported(format!(
            "the number of nonzero elements `{}` has no upper bound (the input's size is unbounded)",
            s.name
        ));
    }
    if !imp.g.data_dependent_symbols().contains(&sym) {
        let counted = count_nonzero(imp, x)?;
        imp.g.add_node(Op::BindDim { symbol: sym }, vec![counted], Vec::new(), imp.loc());
    }
    let ty = TensorType::new(DType::I64, vec![Dim::Sym(sym), Dim::Const(xt.rank() as i64)]);
    Ok(imp.push_typed(Op::NonZero { count: sym }, vec![x], ty))
}

/// `sum(x != 0)` as a 0-d i64 (`x != 0` being a cast to bool, which treats
/// NaN as nonzero and `-0.0` as zero, like `nonzero`).
fn count_nonzero(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let flags = imp.cast(x, DType::Bool);
    let ones = imp.cast(flags, DType::I64);
    let rank = imp.ty(ones).rank();
    if rank == 0 {
        return Ok(ones);
    }
    imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: (0..rank).collect(), keep_dims: false }, vec![ones])
}

/// Column `j` of nonzero coordinates `coords` (`[count, k]`) as a 1-d `[count]`.
fn column(imp: &mut Importer, coords: ValueId, j: usize, count: &Dim) -> R<ValueId> {
    let col = imp.push(Op::Slice { axis: 1, start: j as i64, end: j as i64 + 1, step: 1 }, vec![coords])?;
    imp.push(Op::Reshape { shape: vec![count.clone()] }, vec![col])
}

/// `aten::nonzero_numpy(Tensor self) -> Tensor[]` (`nonzero(x, as_tuple=True)`
/// in training IR): one 1-d coordinate tensor per dim.
pub(super) fn nonzero_numpy(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let names = match n.outputs.as_slice() {
        [Arg::Tensors(ts)] => ts.clone(),
        other => return invalid(format!("expected a tensor list output, found {other:?}")),
    };
    // torch treats a 0-d tensor as 1-d here: one tensor of `[0]` or `[]`.
    let x = if imp.ty(x).rank() == 0 { imp.push(Op::Reshape { shape: vec![Dim::Const(1)] }, vec![x])? } else { x };
    let rank = imp.ty(x).rank();
    let Some(first) = names.first().filter(|_| names.len() == rank) else {
        return unsupported(format!("nonzero(as_tuple=True) of a rank-{rank} tensor with {} outputs", names.len()));
    };
    let count = imp.type_of(first)?.shape.first().cloned().unwrap_or(Dim::Const(0));
    let coords = nonzero_of(imp, x, &count)?;
    for (j, name) in names.iter().enumerate() {
        if imp.is_used(name) {
            let v = column(imp, coords, j, &count)?;
            imp.bind_name(name, v);
        }
    }
    Ok(())
}

/// `x[mask]` / `x[:, mask]` with a boolean mask computed at run time: the
/// mask's nonzero coordinates, one i64 column per mask dim, index `x` from
/// axis `slot`. `count` is the output's (data-dependent) size there.
pub(crate) fn masked_gather(imp: &mut Importer, x: ValueId, slot: usize, mask: ValueId, count: &Dim) -> R<ValueId> {
    let k = imp.ty(mask).rank();
    if k == 0 || slot + k > imp.ty(x).rank() {
        return unsupported(format!("a rank-{k} mask at axis {slot} of a rank-{} tensor", imp.ty(x).rank()));
    }
    let coords = nonzero_of(imp, mask, count)?;
    let columns = (0..k).map(|j| column(imp, coords, j, count)).collect::<R<Vec<_>>>()?;
    if let [col] = columns.as_slice() {
        return imp.push(Op::Gather { axis: normalize_axis(slot as i64, imp.ty(x).rank())? }, vec![x, *col]);
    }
    let mut inputs = vec![x];
    inputs.extend(columns);
    imp.push(Op::IndexGather { axis: slot }, inputs)
}

/// `aten::masked_select(Tensor self, Tensor mask) -> Tensor`: `self` and
/// `mask` broadcast to one shape, then the elements at the mask's true
/// positions in row-major order, 1-d (a 0-d pair is read as `[1]`).
pub(super) fn masked_select(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let mask = imp.tensor(n, "mask")?;
    let mask = imp.cast(mask, DType::Bool);
    let shape = kiln_ir::infer::broadcast_shapes(&imp.ty(x).shape, &imp.ty(mask).shape)
        .map_err(crate::import::importer::Fail::Invalid)?;
    // Expand broadcasts to a higher rank; only the all-0-d case needs a reshape.
    let shape = if shape.is_empty() { vec![Dim::Const(1)] } else { shape };
    let (x, mask) = (super::indexing::expand(imp, x, shape.clone()), super::indexing::expand(imp, mask, shape));
    let count = imp.out_ty(n, 0)?.shape.first().cloned().unwrap_or(Dim::Const(0));
    let v = masked_gather(imp, x, 0, mask, &count)?;
    imp.bind(n, 0, v)
}

/// `aten::_local_scalar_dense(Tensor self) -> Scalar` and `aten::item`: the
/// one element as a symbolic scalar. Its uses decide what it becomes: an
/// operand of arithmetic reads the 0-d tensor; a size (a SymInt in a shape)
/// is bound with `BindDim` before the first node it shapes.
pub(super) fn local_scalar_dense(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    if imp.ty(x).numel().as_const() != Some(1) {
        return unsupported(format!(
            "`.item()` of a tensor of shape [{}] (kiln needs a statically one-element tensor)",
            imp.ty(x).shape.iter().map(|d| d.display(&imp.g.symbols).to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    let scalar = if imp.ty(x).rank() == 0 { x } else { imp.push(Op::Reshape { shape: Vec::new() }, vec![x])? };
    match n.outputs.first() {
        Some(Arg::SymInt(SymIntArg::Name(name))) => {
            let size = match imp.scope.sym_int_values.get(name) {
                Some(e) => imp.sym_expr(e)?,
                None => return invalid(format!("`{name}` has no entry in sym_int_values")),
            };
            imp.define_item(name, &n.name, scalar, Some(size));
            Ok(())
        }
        Some(Arg::SymFloat(name) | Arg::SymBool(name)) => {
            imp.define_item(name, &n.name, scalar, None);
            Ok(())
        }
        other => invalid(format!("expected a symbolic scalar output, found {other:?}")),
    }
}
