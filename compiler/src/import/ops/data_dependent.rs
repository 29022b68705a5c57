//! Ops whose output sizes depend on tensor values: `nonzero` (and the boolean
//! masks that index through it), `unique` and its forms, `bincount`, and
//! `.item()` (`_local_scalar_dense`).
//! torch.export names such a size with an unbacked symbol (`u0`); kiln binds
//! it at run time with `Op::BindDim` from a count computed in the graph (or
//! the `.item()` value), then runs the ops it shapes in buffers planned for
//! the symbol's upper bound.

use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Importer, R};
use crate::pt2::program::{Arg, Node, SymIntArg};
use kiln_ir::{BinaryOp, DType, Dim, Op, ReduceKind, TensorType, ValueId};

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

/// `aten::_unique2(Tensor self, bool sorted=True, bool return_inverse=False,
/// bool return_counts=False)` (`torch.unique` without `dim`) and
/// `aten::unique_consecutive(Tensor self, bool return_inverse=False,
/// bool return_counts=False, int? dim=None)` without `dim`: the distinct
/// values of the flattened input, (for `_unique2`) ascending — torch's CPU
/// kernel sorts whether or not `sorted` is set — with NaNs last, each NaN
/// its own value (NaN ≠ NaN); the inverse (each element's position among the
/// values, in the input's shape) and the counts when asked (else torch's
/// empty `[0]`). A run starts wherever the (stably) sorted values differ
/// from their predecessor; the number of runs is the output's symbol, bound
/// like `nonzero`'s (its upper bound is the input's size).
pub(super) fn unique(imp: &mut Importer, n: &Node, consecutive: bool) -> R<()> {
    let x = imp.tensor(n, "self")?;
    if consecutive {
        if let Some(dim) = imp.opt_int(n, "dim")? {
            return unique_rows(imp, n, x, dim, true);
        }
    }
    let dtype = imp.ty(x).dtype;
    let len = imp.ty(x).numel();
    let flat = imp.push(Op::Reshape { shape: vec![len.clone()] }, vec![x])?;
    // Sorted (and compared) as bytes for bool.
    let key = if dtype == DType::Bool { imp.cast(flat, DType::U8) } else { flat };
    let (sorted, perm) = if consecutive {
        (key, None)
    } else {
        let sort = |imp: &mut Importer, indices| {
            imp.push(Op::Sort { axis: 0, k: len.clone(), descending: false, indices }, vec![key])
        };
        (sort(imp, false)?, Some(sort(imp, true)?))
    };
    let firsts = run_starts(imp, sorted, &len)?;
    let count = imp.out_ty(n, 0)?.shape.first().cloned().unwrap_or(Dim::Const(0));
    let starts = nonzero_of(imp, firsts, &count)?;
    let starts = imp.push(Op::Reshape { shape: vec![count.clone()] }, vec![starts])?;
    let values = imp.push(Op::Gather { axis: 0 }, vec![sorted, starts])?;
    let values = imp.cast(values, dtype);
    imp.bind(n, 0, values)?;
    bind_inverse_and_counts(imp, n, firsts, perm, &len, &count)
}

/// `aten::unique_dim(Tensor self, int dim, bool sorted=True, bool
/// return_inverse=False, bool return_counts=False)` (`torch.unique(x, dim=d)`):
/// the distinct slices along `dim`, compared whole.
pub(super) fn unique_dim(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dim = imp.int(n, "dim", None)?;
    unique_rows(imp, n, x, dim, false)
}

/// The most elements a slice compared whole may have: sorting them
/// lexicographically takes a stable sort per element position.
const MAX_UNIQUE_ROW: i64 = 1024;

/// `unique_dim` and `unique_consecutive` with `dim`: the slices of `x` along
/// `dim` as rows; for `unique_dim` sorted lexicographically (torch's CPU
/// kernel sorts whatever `sorted` says) by stable sorts from the last
/// element position to the first; a run starts where a row differs from
/// the previous one anywhere (NaN differs). Values are the runs' first rows,
/// put back along `dim`; inverse and counts as for [`unique`].
fn unique_rows(imp: &mut Importer, n: &Node, x: ValueId, dim: i64, consecutive: bool) -> R<()> {
    let dtype = imp.ty(x).dtype;
    let rank = imp.ty(x).rank();
    if rank == 0 {
        return invalid("unique along a dim of a 0-d tensor");
    }
    let axis = normalize_axis(dim, rank)?;
    // [rows, the other dims in order] -> [rows, cols].
    let mut order = vec![axis];
    order.extend((0..rank).filter(|&a| a != axis));
    let moved = if axis == 0 { x } else { imp.push(Op::Permute { perm: order.clone() }, vec![x])? };
    let moved_shape = imp.ty(moved).shape.clone();
    let len = moved_shape[0].clone();
    let cols = match moved_shape[1..].iter().try_fold(1i64, |acc, d| d.as_const().map(|c| acc * c)) {
        Some(c) if (1..=MAX_UNIQUE_ROW).contains(&c) => c,
        _ => {
            return unsupported(format!(
                "unique along a dim whose slices are not a static 1..={MAX_UNIQUE_ROW} elements (kiln sorts them \
                 one element position at a time)"
            ))
        }
    };
    let table = imp.push(Op::Reshape { shape: vec![len.clone(), Dim::Const(cols)] }, vec![moved])?;
    let key = if dtype == DType::Bool { imp.cast(table, DType::U8) } else { table };
    let (sorted, perm) = if consecutive {
        (key, None)
    } else {
        let ty = TensorType::new(DType::I64, vec![len.clone()]);
        let arange = Op::Arange { start: 0.0, step: 1.0, len: len.clone(), dtype: DType::I64 };
        let mut perm = imp.push_typed(arange, vec![], ty);
        for col in (0..cols).rev() {
            let column = imp.push(Op::Slice { axis: 1, start: col, end: col + 1, step: 1 }, vec![key])?;
            let column = imp.push(Op::Reshape { shape: vec![len.clone()] }, vec![column])?;
            let keys = imp.push(Op::Gather { axis: 0 }, vec![column, perm])?;
            let sort = Op::Sort { axis: 0, k: len.clone(), descending: false, indices: true };
            let step = imp.push(sort, vec![keys])?;
            perm = imp.push(Op::Gather { axis: 0 }, vec![perm, step])?;
        }
        (imp.push(Op::Gather { axis: 0 }, vec![key, perm])?, Some(perm))
    };
    let firsts = run_starts(imp, sorted, &len)?;
    let count = imp.out_ty(n, 0)?.shape.get(axis).cloned().unwrap_or(Dim::Const(0));
    let starts = nonzero_of(imp, firsts, &count)?;
    let starts = imp.push(Op::Reshape { shape: vec![count.clone()] }, vec![starts])?;
    let values = imp.push(Op::Gather { axis: 0 }, vec![sorted, starts])?;
    let values = imp.cast(values, dtype);
    let mut shape = moved_shape;
    shape[0] = count.clone();
    let values = imp.push(Op::Reshape { shape }, vec![values])?;
    let values = if axis == 0 {
        values
    } else {
        let mut back = vec![0; rank];
        for (i, &a) in order.iter().enumerate() {
            back[a] = i;
        }
        imp.push(Op::Permute { perm: back }, vec![values])?
    };
    imp.bind(n, 0, values)?;
    bind_inverse_and_counts(imp, n, firsts, perm, &len, &count)
}

/// Outputs 1 (inverse) and 2 (counts) of the unique ops, when read: each
/// sorted element's run is (the number of run starts up to it) - 1, put back
/// in the input's order through `perm` (the sort's indices); the counts sum
/// ones per run. A flag torch was not given leaves its empty `[0]`.
fn bind_inverse_and_counts(
    imp: &mut Importer,
    n: &Node,
    firsts: ValueId,
    perm: Option<ValueId>,
    len: &Dim,
    count: &Dim,
) -> R<()> {
    let names: Vec<String> =
        n.outputs.iter().map(|o| if let Arg::Tensor(t) = o { t.clone() } else { String::new() }).collect();
    let wanted = |imp: &Importer, i: usize| names.get(i).is_some_and(|name| imp.is_used(name));
    if !wanted(imp, 1) && !wanted(imp, 2) {
        return Ok(());
    }
    let starts_i64 = imp.cast(firsts, DType::I64);
    let runs = imp.push(Op::CumSum { axis: 0 }, vec![starts_i64])?;
    let group = imp.with_scalar(BinaryOp::Sub, runs, 1.0)?;
    for i in [1, 2] {
        if !wanted(imp, i) {
            continue;
        }
        let ty = imp.out_ty(n, i)?;
        let v = if ty.numel().as_const() == Some(0) {
            imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty)
        } else if i == 1 {
            // inverse[perm[j]] = group[j].
            let inverse = match perm {
                Some(perm) => {
                    let zeros = full(imp, 0.0, DType::I64, vec![len.clone()]);
                    let op = Op::ScatterElements { axis: 0, reduce: None, include_self: true };
                    imp.push(op, vec![zeros, perm, group])?
                }
                None => group,
            };
            imp.push_typed(Op::Reshape { shape: ty.shape.clone() }, vec![inverse], ty)
        } else {
            let zeros = full(imp, 0.0, DType::I64, vec![count.clone()]);
            let ones = full(imp, 1.0, DType::I64, vec![len.clone()]);
            let op = Op::ScatterElements { axis: 0, reduce: Some(ReduceKind::Sum), include_self: true };
            imp.push(op, vec![zeros, group, ones])?
        };
        imp.bind(n, i, v)?;
    }
    Ok(())
}

/// Bool `[len]`: true where row i of `x` (`[len]` or `[len, cols]`) differs
/// from row i - 1 in any element (NaN differs from everything), and at 0.
fn run_starts(imp: &mut Importer, x: ValueId, len: &Dim) -> R<ValueId> {
    let ty = TensorType::new(DType::I64, vec![len.clone()]);
    let pos = imp.push_typed(Op::Arange { start: 0.0, step: 1.0, len: len.clone(), dtype: DType::I64 }, vec![], ty);
    let before = imp.with_scalar(BinaryOp::Sub, pos, 1.0)?;
    let before = imp.with_scalar(BinaryOp::Max, before, 0.0)?;
    let prev = imp.push(Op::Gather { axis: 0 }, vec![x, before])?;
    let mut differs = imp.push(Op::Binary(BinaryOp::Ne), vec![x, prev])?;
    if imp.ty(differs).rank() == 2 {
        let any = imp.cast(differs, DType::I64);
        let any = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![1], keep_dims: false }, vec![any])?;
        differs = imp.cast(any, DType::Bool);
    }
    let first = imp.with_scalar(BinaryOp::Eq, pos, 0.0)?;
    imp.push(Op::Binary(BinaryOp::Or), vec![differs, first])
}

fn full(imp: &mut Importer, value: f64, dtype: DType, shape: Vec<Dim>) -> ValueId {
    let ty = TensorType::new(dtype, shape.clone());
    imp.push_typed(Op::Full { value, dtype, shape }, vec![], ty)
}

/// `aten::bincount(Tensor self, Tensor? weights=None, SymInt minlength=0)`:
/// how often each value 0..=max occurs in the 1-d non-negative integer
/// `self` (or the sum of its `weights`), at least `minlength` bins. The
/// length, max(max(self) + 1, minlength), is data-dependent: it is bound at
/// run time (`BindDim`) and the bins are one scatter-add into a buffer of the
/// length's upper bound. That bound is the output symbol's (a
/// `torch._check(out.size(0) <= N)` in the program sets it), else the input
/// dtype's range (uint8: 256, int8: 128, int16: 32768); an unbounded length
/// is a compile-time error saying so, and a value past the bound or a
/// negative value fails the run.
pub(super) fn bincount(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let xt = imp.ty(x).clone();
    if xt.rank() != 1 || !xt.dtype.is_int() {
        return invalid(format!("bincount takes a 1-d tensor of integers, found {} of rank {}", xt.dtype, xt.rank()));
    }
    let minlength = imp.int(n, "minlength", Some(0))?;
    if minlength < 0 {
        return invalid(format!("bincount: minlength {minlength} is negative"));
    }
    let out = imp.out_ty(n, 0)?;
    let length = out.shape.first().cloned().unwrap_or(Dim::Const(0));
    if let Dim::Sym(sym) = length {
        let dtype_bound = match xt.dtype {
            DType::U8 => Some(256),
            DType::I8 => Some(128),
            DType::I16 => Some(32768),
            _ => None,
        };
        let s = &mut imp.g.symbols[sym];
        s.max = match (s.max, dtype_bound.map(|b: i64| b.max(minlength))) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if s.max.is_none() {
            return unsupported(format!(
                "bincount of {}: its length `{}` (largest value + 1, at least minlength = {minlength}) has no upper \
                 bound, and kiln plans memory for the largest length; bound it in the program (e.g. \
                 `torch._check(counts.size(0) <= N)` after the call) or count a uint8/int8/int16 tensor",
                xt.dtype, s.name
            ));
        }
    } else if !matches!(length, Dim::Const(_)) {
        return unsupported(format!(
            "bincount whose length torch gives as `{}` (kiln binds a plain unbacked symbol)",
            length.display(&imp.g.symbols)
        ));
    }
    let idx = imp.cast(x, DType::I64);
    let empty = xt.numel().as_const() == Some(0);
    if let Dim::Sym(sym) = length {
        if !imp.g.data_dependent_symbols().contains(&sym) {
            let top = if empty {
                imp.scalar_const(crate::import::importer::Scalar::Int(-1), DType::I64)
            } else {
                imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![0], keep_dims: false }, vec![idx])?
            };
            let bins = imp.with_scalar(BinaryOp::Add, top, 1.0)?;
            let bins = imp.with_scalar(BinaryOp::Max, bins, minlength as f64)?;
            imp.g.add_node(Op::BindDim { symbol: sym }, vec![bins], Vec::new(), imp.loc());
        }
    }
    if !empty {
        // torch raises on a negative value; the scatter would too, less clearly.
        let low = imp.push(Op::Reduce { kind: ReduceKind::Min, axes: vec![0], keep_dims: false }, vec![idx])?;
        let ok = imp.with_scalar(BinaryOp::Ge, low, 0.0)?;
        let message = "bincount only supports 1-d non-negative integral inputs.".to_string();
        let loc = imp.loc();
        imp.g.add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    }
    let counts = full(imp, 0.0, out.dtype, vec![length]);
    let src = match imp.opt_tensor(n, "weights")? {
        Some(w) => imp.cast(w, out.dtype),
        None => full(imp, 1.0, out.dtype, xt.shape.clone()),
    };
    let v = imp.push(
        Op::ScatterElements { axis: 0, reduce: Some(ReduceKind::Sum), include_self: true },
        vec![counts, idx, src],
    )?;
    imp.bind(n, 0, v)
}
