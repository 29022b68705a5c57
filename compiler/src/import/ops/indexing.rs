//! Index-driven ops: `gather`, the `scatter` family, advanced indexing with
//! several index tensors (`index.Tensor`, `index_put`), the `*_scatter`
//! views, strided gathers (`diagonal`, `as_strided`), `masked_scatter`
//! and `col2im`. They map onto four IR ops —
//! `GatherElements`, `ScatterElements`, `IndexGather`, `IndexPut` — plus
//! `Gather` with index constants computed here for the static strided views.

use crate::import::importer::{checked, dim_at, invalid, table_len, unsupported, Importer, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, ConstBytes, DType, Dim, Op, ReduceKind, TensorType, ValueId};

use super::shape::normalize_axis;
use crate::import::views::ViewStep;

/// An i64 constant of a static shape.
pub(super) fn i64_const(imp: &mut Importer, shape: &[i64], values: &[i64]) -> ValueId {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    imp.g.add_const(None, TensorType::fixed(DType::I64, shape), ConstBytes::owned(bytes))
}

/// Indices as i64 (the IR's index dtype).
pub(super) fn int_index(imp: &mut Importer, v: ValueId, what: &str) -> R<ValueId> {
    match imp.ty(v).dtype {
        DType::I64 => Ok(v),
        d if d.is_int() => Ok(imp.cast(v, DType::I64)),
        d => unsupported(format!("{what} of dtype {d}")),
    }
}

/// `v` with a new shape (no node when it already has it).
pub(super) fn reshape(imp: &mut Importer, v: ValueId, shape: Vec<Dim>) -> ValueId {
    let ty = imp.ty(v).clone();
    if ty.shape == shape {
        return v;
    }
    imp.push_typed(Op::Reshape { shape: shape.clone() }, vec![v], TensorType::new(ty.dtype, shape))
}

/// `v` broadcast to `shape` (no node when it already has it).
pub(super) fn expand(imp: &mut Importer, v: ValueId, shape: Vec<Dim>) -> ValueId {
    let ty = imp.ty(v).clone();
    if ty.shape == shape {
        return v;
    }
    imp.push_typed(Op::Expand { shape: shape.clone() }, vec![v], TensorType::new(ty.dtype, shape))
}

/// A 0-d tensor viewed as `[1]` (torch treats 0-d operands of gather/scatter so).
fn at_least_1d(imp: &mut Importer, v: ValueId) -> ValueId {
    if imp.ty(v).rank() == 0 {
        reshape(imp, v, vec![Dim::Const(1)])
    } else {
        v
    }
}

/// Binds output 0 to `v`, reshaped to the output type when ranks differ (0-d cases).
pub(super) fn bind_as_output(imp: &mut Importer, n: &Node, v: ValueId) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(v, out.dtype);
    let v = reshape(imp, v, out.shape);
    imp.bind(n, 0, v)
}

fn static_dims(imp: &Importer, v: ValueId, what: &str) -> R<Vec<i64>> {
    match imp.ty(v).static_shape() {
        Some(s) => Ok(s),
        None => unsupported(format!("{what} with a dynamic shape")),
    }
}

/// Fails unless every output of `n` after the first is unused.
pub(super) fn only_first_output_used(imp: &Importer, n: &Node) -> R<()> {
    for out in n.outputs.iter().skip(1) {
        if let Arg::Tensor(name) = out {
            if imp.is_used(name) {
                return unsupported(format!("output `{name}` is used; only output 0 is supported"));
            }
        }
    }
    Ok(())
}

/// `aten::gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False)`
pub(super) fn gather(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let axis = normalize_axis(imp.int(n, "dim", None)?, imp.ty(x).rank().max(1))?;
    let idx = imp.tensor(n, "index")?;
    // An empty index gathers nothing, whatever its rank (torch checks ranks
    // only when there is something to gather).
    if imp.ty(idx).numel().as_const() == Some(0) {
        let out = imp.out_ty(n, 0)?;
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let idx = int_index(imp, idx, "gather index")?;
    let (x, idx) = (at_least_1d(imp, x), at_least_1d(imp, idx));
    let v = imp.push(Op::GatherElements { axis }, vec![x, idx])?;
    bind_as_output(imp, n, v)
}

/// `aten::scatter.src(Tensor self, int dim, Tensor index, Tensor src)`,
/// `scatter.value(Tensor self, int dim, Tensor index, Scalar value)`,
/// `scatter.reduce(.., Tensor src, *, str reduce)`, `scatter.value_reduce`,
/// `scatter_add(Tensor self, int dim, Tensor index, Tensor src)`,
/// `scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True)`
pub(super) fn scatter(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dtype = imp.ty(x).dtype;
    let axis = normalize_axis(imp.int(n, "dim", None)?, imp.ty(x).rank().max(1))?;
    let idx = imp.tensor(n, "index")?;
    let idx = int_index(imp, idx, "scatter index")?;
    let (x, idx) = (at_least_1d(imp, x), at_least_1d(imp, idx));
    let src = if overload.starts_with("value") {
        let value = imp.scalar(n, "value")?.as_f64();
        let shape = imp.ty(idx).shape.clone();
        imp.push_typed(Op::Full { value, dtype, shape: shape.clone() }, Vec::new(), TensorType::new(dtype, shape))
    } else {
        let s = imp.tensor(n, "src")?;
        let s = imp.cast(s, dtype);
        at_least_1d(imp, s)
    };
    let (reduce, include_self) = match (name, overload) {
        ("scatter_add", _) => (Some(ReduceKind::Sum), true),
        ("scatter_reduce", _) => {
            let kind = match imp.string(n, "reduce", "")? {
                "sum" => ReduceKind::Sum,
                "prod" => ReduceKind::Prod,
                "mean" => ReduceKind::Mean,
                "amax" => ReduceKind::Max,
                "amin" => ReduceKind::Min,
                other => return unsupported(format!("scatter_reduce with reduce=`{other}`")),
            };
            (Some(kind), imp.bool(n, "include_self", true)?)
        }
        (_, "reduce" | "value_reduce") => match imp.string(n, "reduce", "")? {
            "add" => (Some(ReduceKind::Sum), true),
            "multiply" => (Some(ReduceKind::Prod), true),
            other => return unsupported(format!("scatter with reduce=`{other}`")),
        },
        _ => (None, true),
    };
    let v = imp.push(Op::ScatterElements { axis, reduce, include_self }, vec![x, idx, src])?;
    bind_as_output(imp, n, v)
}

/// The present entries of an index list, with their slots.
fn present_indices(indices: &[Option<ValueId>]) -> Vec<(usize, ValueId)> {
    indices.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t))).collect()
}

/// A boolean mask that is a constant of the program, turned into one i64
/// index tensor per mask dim (`nonzero` at compile time).
fn constant_mask_indices(imp: &mut Importer, mask: ValueId) -> R<Option<Vec<ValueId>>> {
    let Some(c) = imp.g.const_of(mask) else { return Ok(None) };
    let bytes = c.bytes.as_bytes().to_vec();
    let Some(shape) = imp.ty(mask).static_shape() else { return Ok(None) };
    let rank = shape.len();
    let mut coords: Vec<Vec<i64>> = vec![Vec::new(); rank];
    let mut pos = vec![0i64; rank];
    for &b in &bytes {
        if b != 0 {
            for (c, &p) in coords.iter_mut().zip(&pos) {
                c.push(p);
            }
        }
        for d in (0..rank).rev() {
            pos[d] += 1;
            if pos[d] < shape[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    Ok(Some(coords.iter().map(|c| i64_const(imp, &[c.len() as i64], c)).collect()))
}

/// The index list of `index.Tensor` / `index_put` as (data axis, i64 index)
/// pairs: constant boolean masks become their `nonzero` coordinates, other
/// masks are refused.
fn integer_indices(imp: &mut Importer, indices: &[Option<ValueId>]) -> R<Vec<(usize, ValueId)>> {
    let mut out = Vec::new();
    let mut axis = 0;
    for &t in indices {
        let Some(t) = t else {
            axis += 1;
            continue;
        };
        if imp.ty(t).dtype == DType::Bool || imp.ty(t).dtype == DType::U8 {
            let rank = imp.ty(t).rank();
            let Some(coords) = constant_mask_indices(imp, t)? else {
                return unsupported(
                    "indexing with a boolean mask computed at run time (the result shape depends on the data)",
                );
            };
            for (k, c) in coords.into_iter().enumerate() {
                out.push((axis + k, c));
            }
            axis += rank;
        } else {
            out.push((axis, int_index(imp, t, "index tensor")?));
            axis += 1;
        }
    }
    Ok(out)
}

/// What [`prepare_advanced`] returns: the data to index, the IR axis, the
/// indices, and the permutation applied to the data (`None` when none).
type Advanced = (ValueId, usize, Vec<ValueId>, Option<Vec<usize>>);

/// Broadcasts the index tensors to one shape and, when the indexed axes are
/// not adjacent, moves them to the front (torch then puts the index shape
/// first). Returns the data to index, the IR axis, the indices, and the
/// permutation applied to the data (`None` when none).
fn prepare_advanced(imp: &mut Importer, x: ValueId, pairs: &[(usize, ValueId)]) -> R<Advanced> {
    let rank = imp.ty(x).rank();
    if pairs.iter().any(|&(a, _)| a >= rank) {
        return invalid(format!("too many indices for a tensor of rank {rank}"));
    }
    let mut shape: Vec<Dim> = Vec::new();
    for &(_, t) in pairs {
        shape = kiln_ir::infer::broadcast_shapes(&shape, &imp.ty(t).shape)
            .map_err(crate::import::importer::Fail::Invalid)?;
    }
    let idx: Vec<ValueId> = pairs.iter().map(|&(_, t)| expand(imp, t, shape.clone())).collect();
    let axes: Vec<usize> = pairs.iter().map(|&(a, _)| a).collect();
    let adjacent = axes.windows(2).all(|w| w[1] == w[0] + 1);
    if adjacent {
        return Ok((x, axes[0], idx, None));
    }
    let mut perm = axes.clone();
    perm.extend((0..rank).filter(|a| !axes.contains(a)));
    let ty = imp.ty(x).clone();
    let pshape: Vec<Dim> = perm.iter().map(|&p| ty.shape[p].clone()).collect();
    let xp = imp.push_typed(Op::Permute { perm: perm.clone() }, vec![x], TensorType::new(ty.dtype, pshape));
    Ok((xp, 0, idx, Some(perm)))
}

/// `aten::index.Tensor(Tensor self, Tensor?[] indices)` and
/// `_unsafe_index.Tensor`: one index tensor → Gather; several (with `None`
/// slots, broadcasting) → IndexGather. A lone boolean mask computed at run
/// time goes through `nonzero` (a data-dependent size); other masks only as
/// constants.
pub(super) fn index(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let indices = imp.opt_tensors(n, "indices")?;
    if let [(slot, mask)] = present_indices(&indices).as_slice() {
        let run_time_mask = matches!(imp.ty(*mask).dtype, DType::Bool | DType::U8) && imp.g.const_of(*mask).is_none();
        if run_time_mask {
            // The selected count is the output's (data-dependent) size at `slot`.
            let count = imp.out_ty(n, 0)?.shape.get(*slot).cloned().unwrap_or(Dim::Const(0));
            let v = super::data_dependent::masked_gather(imp, x, *slot, *mask, &count)?;
            return bind_as_output(imp, n, v);
        }
    }
    let pairs = integer_indices(imp, &indices)?;
    match pairs.as_slice() {
        [] => {
            let v = x;
            bind_as_output(imp, n, v)
        }
        [(axis, idx)] => {
            imp.emit(n, Op::Gather { axis: *axis }, vec![x, *idx])?;
            Ok(())
        }
        _ => {
            let (xp, axis, mut idx, _) = prepare_advanced(imp, x, &pairs)?;
            let mut inputs = vec![xp];
            inputs.append(&mut idx);
            imp.emit(n, Op::IndexGather { axis }, inputs)?;
            Ok(())
        }
    }
}

/// `aten::index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False)`
/// and `_unsafe_index_put`. A lone boolean mask with one value is a `where`;
/// a lone run-time mask with several values goes to [`masked_index_put`];
/// otherwise the integer indices (constant masks as their coordinates) → IndexPut.
pub(super) fn index_put(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let ty = imp.ty(x).clone();
    let indices = imp.opt_tensors(n, "indices")?;
    let values = imp.tensor(n, "values")?;
    let values = imp.cast(values, ty.dtype);
    let accumulate = imp.bool(n, "accumulate", false)?;
    let present = present_indices(&indices);
    if let [(slot, mask)] = present.as_slice() {
        let single_value = imp.ty(values).numel().as_const() == Some(1);
        let mask_dtype = imp.ty(*mask).dtype;
        let run_time_mask = matches!(mask_dtype, DType::Bool | DType::U8) && imp.g.const_of(*mask).is_none();
        if run_time_mask && !(single_value && mask_dtype == DType::Bool) {
            let out = masked_index_put(imp, x, *slot, *mask, values, accumulate)?;
            return bind_as_output(imp, n, out);
        }
        if imp.ty(*mask).dtype == DType::Bool && single_value && imp.g.const_of(*mask).is_none() {
            // x[mask] = v (or += v): a where over the mask, aligned at its slot.
            let m = imp.ty(*mask).clone();
            let mut mshape: Vec<Dim> = vec![Dim::Const(1); *slot];
            mshape.extend(m.shape.iter().cloned());
            mshape.extend(std::iter::repeat_n(Dim::Const(1), ty.rank().saturating_sub(*slot + m.rank())));
            let mask_v = reshape(imp, *mask, mshape);
            let v = reshape(imp, values, Vec::new());
            let new = if accumulate { imp.push(Op::Binary(BinaryOp::Add), vec![x, v])? } else { v };
            let new = expand(imp, new, ty.shape.clone());
            let out = imp.push(Op::Where, vec![mask_v, new, x])?;
            return bind_as_output(imp, n, out);
        }
    }
    let pairs = integer_indices(imp, &indices)?;
    if pairs.is_empty() {
        let v = expand(imp, values, ty.shape.clone());
        let v = if accumulate { imp.push(Op::Binary(BinaryOp::Add), vec![x, v])? } else { v };
        return bind_as_output(imp, n, v);
    }
    let (xp, axis, idx, perm) = prepare_advanced(imp, x, &pairs)?;
    let k = idx.len();
    let pty = imp.ty(xp).clone();
    let mut target: Vec<Dim> = pty.shape[..axis].to_vec();
    target.extend(imp.ty(idx[0]).shape.iter().cloned());
    target.extend(pty.shape[axis + k..].iter().cloned());
    let values = expand(imp, values, target);
    let mut inputs = vec![xp, values];
    inputs.extend(idx);
    let put = imp.push(Op::IndexPut { axis, accumulate }, inputs)?;
    let out = match perm {
        None => put,
        Some(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            imp.push_typed(Op::Permute { perm: inv }, vec![put], ty.clone())
        }
    };
    bind_as_output(imp, n, out)
}

/// `x[mask] = values` (or `+=`) for a boolean mask known only at run time,
/// covering `x`'s dims `slot..slot + mask.rank`. `values` broadcasts to
/// `[lead.., K, rest..]`, `lead`/`rest` being `x`'s dims before/after the
/// mask's; torch gives the k-th true position (row-major) the k-th row along
/// `K`, and requires `K` to equal the number of true positions unless it is 1.
///
/// Rows are picked as in `masked_scatter`: an inclusive cumsum of the flat
/// mask, minus one (clamped into `0..K`), gathers row `k` for the k-th true
/// position, and a where keeps `x` elsewhere. The count is checked by a
/// run-time assertion (`count == K`), not by the gather: under `--target
/// pjrt` the cumsum and gather run on the device, where a gather clamps an
/// index out of range instead of failing, while the assertion always runs
/// on the host. Either way a mismatch fails the run, as in torch, instead of
/// silently using a prefix of `values`.
fn masked_index_put(
    imp: &mut Importer,
    x: ValueId,
    slot: usize,
    mask: ValueId,
    values: ValueId,
    accumulate: bool,
) -> R<ValueId> {
    let ty = imp.ty(x).clone();
    let mty = imp.ty(mask).clone();
    let mask = imp.cast(mask, DType::Bool);
    let mrank = mty.rank();
    if slot + mrank > ty.rank() {
        return invalid(format!("a {mrank}-d mask at dim {slot} of a rank-{} tensor", ty.rank()));
    }
    for (k, d) in mty.shape.iter().enumerate() {
        if kiln_ir::infer::dims_equal(d, &ty.shape[slot + k], &imp.g.symbols) == Some(false) {
            return invalid(format!("mask dim {k} does not match the indexed tensor's dim {}", slot + k));
        }
    }
    let lead: Vec<Dim> = ty.shape[..slot].to_vec();
    let rest: Vec<Dim> = ty.shape[slot + mrank..].to_vec();
    // The mask aligned with `x` (unit dims around it), for the final where.
    let mut mshape: Vec<Dim> = vec![Dim::Const(1); slot];
    mshape.extend(mty.shape.iter().cloned());
    mshape.extend(std::iter::repeat_n(Dim::Const(1), rest.len()));
    let mask_x = reshape(imp, mask, mshape);
    let vty = imp.ty(values).clone();
    let target_rank = slot + 1 + rest.len();
    if vty.rank() > target_rank {
        return invalid(format!(
            "index_put values of rank {} for an indexing result of rank {target_rank}",
            vty.rank()
        ));
    }
    // The values dim that lines up with the true positions, if any.
    let rows = vty.rank().checked_sub(rest.len() + 1).map(|i| vty.shape[i].clone());
    let new = match rows.as_ref().and_then(Dim::as_const) {
        None if rows.is_some() => None,
        Some(k) if k != 1 => None,
        // One row (or none): broadcast to every true position, no count to check.
        _ => {
            let mut one_row = lead.clone();
            one_row.push(Dim::Const(1));
            one_row.extend(rest.iter().cloned());
            let v = expand(imp, values, one_row);
            let mut aligned = lead.clone();
            aligned.extend(std::iter::repeat_n(Dim::Const(1), mrank));
            aligned.extend(rest.iter().cloned());
            let v = reshape(imp, v, aligned);
            Some(expand(imp, v, ty.shape.clone()))
        }
    };
    let new = match new {
        Some(v) => v,
        None => {
            let k = rows.unwrap_or(Dim::Const(1));
            if k.as_const() == Some(0) {
                return unsupported(
                    "x[mask] = values with zero values (kiln cannot check at run time that the mask is all false)",
                );
            }
            let mut target = lead.clone();
            target.push(k.clone());
            target.extend(rest.iter().cloned());
            let values = expand(imp, values, target);
            let count_dim = mty.numel();
            let flat = reshape(imp, mask, vec![count_dim.clone()]);
            let flat = imp.cast(flat, DType::I64);
            let cum = imp.push(Op::CumSum { axis: 0 }, vec![flat])?;
            let count = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: false }, vec![flat])?;
            let kv = imp.dim_scalar(&k, DType::I64);
            let same = imp.push(Op::Binary(BinaryOp::Eq), vec![count, kv])?;
            let loc = imp.loc();
            let message = "shape mismatch: the values' rows do not match the number of true positions in the \
                           index_put mask"
                .to_string();
            imp.g.add_node(Op::Assert { message }, vec![same], Vec::new(), loc);
            // Every index stays in range, so only the assertion reports a mismatch.
            let pos = imp.with_scalar(BinaryOp::Sub, cum, 1.0)?;
            let pos = imp.with_scalar(BinaryOp::Max, pos, 0.0)?;
            let last = imp.with_scalar(BinaryOp::Sub, kv, 1.0)?;
            let pos = imp.push(Op::Binary(BinaryOp::Min), vec![pos, last])?;
            let picked = imp.push(Op::Gather { axis: slot }, vec![values, pos])?;
            reshape(imp, picked, ty.shape.clone())
        }
    };
    let new = if accumulate { imp.push(Op::Binary(BinaryOp::Add), vec![x, new])? } else { new };
    imp.push(Op::Where, vec![mask_x, new, x])
}

/// `aten::select_scatter(Tensor self, Tensor src, int dim, SymInt index)`:
/// a scatter along `dim` of `src` (unsqueezed) at one position.
pub(super) fn select_scatter(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let axis = normalize_axis(imp.int(n, "dim", None)?, imp.ty(x).rank())?;
    let index = imp.int(n, "index", None)?;
    let src = imp.tensor(n, "src")?;
    let v = select_scatter_value(imp, x, src, axis, index)?;
    imp.bind(n, 0, v)
}

/// `x` with `src` written at position `index` of `axis` (select's inverse).
pub(crate) fn select_scatter_value(
    imp: &mut Importer,
    x: ValueId,
    src: ValueId,
    axis: usize,
    mut index: i64,
) -> R<ValueId> {
    let ty = imp.ty(x).clone();
    let len = dim_at(&ty, axis, "select_scatter's input")?;
    // On a dynamic dimension a negative index stays negative: ScatterElements
    // counts it from the end at run time (and fails if it is out of range,
    // as torch does).
    if let (true, Some(d)) = (index < 0, len.as_const()) {
        index += d;
    }
    let src = imp.cast(src, ty.dtype);
    let mut shape = ty.shape.clone();
    shape[axis] = Dim::Const(1);
    let src = reshape(imp, src, shape.clone());
    let idx = imp.push_typed(
        Op::Full { value: index as f64, dtype: DType::I64, shape: shape.clone() },
        Vec::new(),
        TensorType::new(DType::I64, shape),
    );
    Ok(imp.push_typed(Op::ScatterElements { axis, reduce: None, include_self: true }, vec![x, idx, src], ty))
}

/// `aten::slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None,
///   SymInt? end=None, SymInt step=1)`: a scatter of `src` at `start + step * i`.
pub(super) fn slice_scatter(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let axis = normalize_axis(imp.int(n, "dim", Some(0))?, imp.ty(x).rank())?;
    let start = imp.opt_int(n, "start")?.unwrap_or(0);
    let step = imp.int(n, "step", Some(1))?;
    let src = imp.tensor(n, "src")?;
    let v = slice_scatter_value(imp, x, src, axis, start, step)?;
    imp.bind(n, 0, v)
}

/// `x` with `src` written at positions `start + step * i` of `axis` (slice's
/// inverse; the slice's length is `src`'s).
pub(crate) fn slice_scatter_value(
    imp: &mut Importer,
    x: ValueId,
    src: ValueId,
    axis: usize,
    mut start: i64,
    step: i64,
) -> R<ValueId> {
    let ty = imp.ty(x).clone();
    if step < 1 {
        return invalid(format!("slice_scatter step {step}"));
    }
    let dim = dim_at(&ty, axis, "slice_scatter's input")?;
    if start < 0 {
        match dim.as_const() {
            Some(d) => start = (start + d).max(0),
            // Every position `start + step * i` of the slice is then negative
            // and ScatterElements counts it from the end at run time; torch
            // would clamp the start at 0 if the dimension could be shorter.
            None if dim.bounds(&imp.g.symbols).0 >= start.saturating_neg() => {}
            None => {
                return unsupported(format!(
                    "negative slice_scatter start {start} on the dynamic dimension {}, which may be shorter than {}",
                    dim.display(&imp.g.symbols),
                    start.saturating_neg()
                ))
            }
        }
    }
    let src = imp.cast(src, ty.dtype);
    let sshape = imp.ty(src).shape.clone();
    if sshape.len() != ty.rank() {
        return invalid("slice_scatter src rank differs from self");
    }
    let len = sshape[axis].clone();
    let ar = imp.push_typed(
        Op::Arange { start: start as f64, step: step as f64, len: len.clone(), dtype: DType::I64 },
        Vec::new(),
        TensorType::new(DType::I64, vec![len.clone()]),
    );
    let mut ones = vec![Dim::Const(1); ty.rank()];
    ones[axis] = len;
    let ar = reshape(imp, ar, ones);
    let idx = expand(imp, ar, sshape);
    Ok(imp.push_typed(Op::ScatterElements { axis, reduce: None, include_self: true }, vec![x, idx, src], ty))
}

/// `aten::diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1)`:
/// the two dims moved last and merged, then a Gather of the diagonal's
/// positions `base + i * (n2 + 1)` — constants for static sizes, otherwise an
/// arange scaled by the run-time `n2 + 1`. With dynamic dims the length is
/// torch's own (its output type); a length torch can only state as a `Min`
/// of sizes is refused earlier, when the output type is parsed.
pub(super) fn diagonal(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let r = imp.ty(x).rank();
    let offset = imp.int(n, "offset", Some(0))?;
    let dim1 = normalize_axis(imp.int(n, "dim1", Some(0))?, r)?;
    let dim2 = normalize_axis(imp.int(n, "dim2", Some(1))?, r)?;
    let out = imp.out_ty(n, 0)?;
    let v = diagonal_value(imp, x, offset, dim1, dim2, &out)?;
    if let (Ok(base), Some(Arg::Tensor(view))) = (imp.tensor_name(n, "self").map(str::to_string), n.outputs.first()) {
        imp.record_view(view, &base, ViewStep::Diagonal { offset, dim1, dim2 });
    }
    imp.bind(n, 0, v)
}

/// `aten::diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1)`:
/// diagonal's Gather turned into a ScatterElements over the same positions.
pub(super) fn diagonal_scatter(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let src = imp.tensor(n, "src")?;
    let r = imp.ty(x).rank();
    let offset = imp.int(n, "offset", Some(0))?;
    let dim1 = normalize_axis(imp.int(n, "dim1", Some(0))?, r)?;
    let dim2 = normalize_axis(imp.int(n, "dim2", Some(1))?, r)?;
    let v = diagonal_scatter_value(imp, x, src, offset, dim1, dim2)?;
    imp.bind(n, 0, v)
}

/// `x` with dims `d1`, `d2` moved last and merged (`[.., n1 * n2]`), and the
/// permutation used.
fn diagonal_layout(imp: &mut Importer, x: ValueId, d1: usize, d2: usize) -> R<(ValueId, Vec<usize>)> {
    let ty = imp.ty(x).clone();
    let r = ty.rank();
    if d1 == d2 || d1 >= r || d2 >= r {
        return invalid(format!("diagonal dims {d1} and {d2} of a rank-{r} tensor"));
    }
    let mut perm: Vec<usize> = (0..r).filter(|&a| a != d1 && a != d2).collect();
    perm.extend([d1, d2]);
    let mut pshape: Vec<Dim> = perm.iter().map(|&p| ty.shape[p].clone()).collect();
    let xp = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        x
    } else {
        imp.push_typed(Op::Permute { perm: perm.clone() }, vec![x], TensorType::new(ty.dtype, pshape.clone()))
    };
    pshape.truncate(r - 2);
    pshape.push(Dim::mul(ty.shape[d1].clone(), ty.shape[d2].clone()));
    Ok((reshape(imp, xp, pshape), perm))
}

/// The diagonal's positions in the merged last dim of [`diagonal_layout`]
/// (`len` of them: torch's output length, used when a size is dynamic).
fn diagonal_positions(imp: &mut Importer, n1: &Dim, n2: &Dim, offset: i64, len: &Dim) -> R<ValueId> {
    if offset == i64::MIN {
        return invalid("diagonal offset i64::MIN");
    }
    if let (Some(n1), Some(n2)) = (n1.as_const(), n2.as_const()) {
        let len = if offset >= 0 { n1.min(n2 - offset) } else { (n1 + offset).min(n2) }.max(0);
        table_len("diagonal's positions", &[len])?;
        // Positions inside the merged `n1 * n2` dim, which must fit.
        checked("a diagonal's merged dims", n1.checked_mul(n2))?;
        let positions: Vec<i64> =
            (0..len).map(|i| if offset >= 0 { i * n2 + i + offset } else { (i - offset) * n2 + i }).collect();
        return Ok(i64_const(imp, &[len], &positions));
    }
    let ar = imp.push_typed(
        Op::Arange { start: 0.0, step: 1.0, len: len.clone(), dtype: DType::I64 },
        Vec::new(),
        TensorType::new(DType::I64, vec![len.clone()]),
    );
    let stride = imp.dim_scalar(&Dim::add(n2.clone(), Dim::Const(1)), DType::I64);
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![ar, stride])?;
    // Offset >= 0 starts at column `offset` of row 0, < 0 at row `-offset`.
    let base = if offset >= 0 { Dim::Const(offset) } else { Dim::mul(Dim::Const(-offset), n2.clone()) };
    if base.as_const() == Some(0) {
        Ok(scaled)
    } else {
        let base = imp.dim_scalar(&base, DType::I64);
        imp.push(Op::Binary(BinaryOp::Add), vec![scaled, base])
    }
}

/// The diagonal view of `x` (of type `out`).
pub(crate) fn diagonal_value(
    imp: &mut Importer,
    x: ValueId,
    offset: i64,
    d1: usize,
    d2: usize,
    out: &TensorType,
) -> R<ValueId> {
    let ty = imp.ty(x).clone();
    let (flat, _) = diagonal_layout(imp, x, d1, d2)?;
    let Some(len) = out.shape.last() else { return invalid("diagonal output of rank 0") };
    let idx = diagonal_positions(imp, &ty.shape[d1], &ty.shape[d2], offset, len)?;
    Ok(imp.push_typed(Op::Gather { axis: ty.rank() - 2 }, vec![flat, idx], out.clone()))
}

/// `x` with `src` written on its diagonal (diagonal's inverse).
pub(crate) fn diagonal_scatter_value(
    imp: &mut Importer,
    x: ValueId,
    src: ValueId,
    offset: i64,
    d1: usize,
    d2: usize,
) -> R<ValueId> {
    let ty = imp.ty(x).clone();
    let r = ty.rank();
    let src = imp.cast(src, ty.dtype);
    let sshape = imp.ty(src).shape.clone();
    let Some(len) = sshape.last().cloned() else { return invalid("diagonal_scatter src of rank 0") };
    if sshape.len() != r - 1 {
        return invalid("diagonal_scatter src rank is not self's minus one");
    }
    let (flat, perm) = diagonal_layout(imp, x, d1, d2)?;
    let idx = diagonal_positions(imp, &ty.shape[d1], &ty.shape[d2], offset, &len)?;
    let mut ones = vec![Dim::Const(1); r - 1];
    ones[r - 2] = len;
    let idx = reshape(imp, idx, ones);
    let idx = expand(imp, idx, sshape);
    let scattered =
        imp.push(Op::ScatterElements { axis: r - 2, reduce: None, include_self: true }, vec![flat, idx, src])?;
    let pshape: Vec<Dim> = perm.iter().map(|&p| ty.shape[p].clone()).collect();
    let unflat = reshape(imp, scattered, pshape);
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(unflat);
    }
    let mut inverse = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    Ok(imp.push_typed(Op::Permute { perm: inverse }, vec![unflat], ty))
}

/// `aten::as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None)`:
/// the input's elements (its contiguous storage) gathered at the strided
/// offsets; static sizes only.
pub(super) fn as_strided(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    if let (Ok(base), Some(Arg::Tensor(view))) = (imp.tensor_name(n, "self").map(str::to_string), n.outputs.first()) {
        imp.record_view(view, &base, ViewStep::Opaque("an `as_strided` view".into()));
    }
    let shape = static_dims(imp, x, "as_strided input")?;
    let numel = checked("as_strided's input size", shape.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d)))?;
    let size = imp.ints(n, "size", &[])?;
    let stride = imp.ints(n, "stride", &[])?;
    let offset = imp.opt_int(n, "storage_offset")?.unwrap_or(0);
    if size.len() != stride.len() || size.iter().any(|&s| s < 0) {
        return invalid(format!("as_strided size {size:?} and stride {stride:?}"));
    }
    let count = table_len("as_strided's positions", &size)?;
    let mut positions = Vec::with_capacity(count);
    let mut pos = vec![0i64; size.len()];
    for _ in 0..count {
        let p = pos
            .iter()
            .zip(&stride)
            .try_fold(offset, |acc, (&i, &s)| i.checked_mul(s).and_then(|v| acc.checked_add(v)))
            .filter(|p| (0..numel).contains(p));
        let Some(p) = p else {
            return invalid(format!(
                "as_strided (size {size:?}, stride {stride:?}, offset {offset}) reaches outside the {numel}-element input"
            ));
        };
        positions.push(p);
        for d in (0..size.len()).rev() {
            pos[d] += 1;
            if pos[d] < size[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    let flat = reshape(imp, x, vec![Dim::Const(numel)]);
    let idx = i64_const(imp, &size, &positions);
    let v = imp.push(Op::Gather { axis: 0 }, vec![flat, idx])?;
    bind_as_output(imp, n, v)
}

/// `aten::masked_scatter(Tensor self, Tensor mask, Tensor source)`: the k-th
/// true position takes `source`'s k-th element — an inclusive cumsum of the
/// mask picks it (Gather), a where keeps the rest.
pub(super) fn masked_scatter(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let mask = imp.tensor(n, "mask")?;
    let source = imp.tensor(n, "source")?;
    let out = imp.out_ty(n, 0)?;
    let source = imp.cast(source, out.dtype);
    let x = expand(imp, x, out.shape.clone());
    let mask = expand(imp, mask, out.shape.clone());
    let total = out.numel();
    let flat_mask = reshape(imp, mask, vec![total.clone()]);
    let as_int = imp.cast(flat_mask, DType::I64);
    let cum = imp.push(Op::CumSum { axis: 0 }, vec![as_int])?;
    let pos = imp.with_scalar(BinaryOp::Sub, cum, 1.0)?;
    let pos = imp.with_scalar(BinaryOp::Max, pos, 0.0)?;
    let src_numel = imp.ty(source).numel();
    let flat_src = reshape(imp, source, vec![src_numel]);
    let picked = imp.push(Op::Gather { axis: 0 }, vec![flat_src, pos])?;
    let picked = reshape(imp, picked, out.shape.clone());
    imp.emit(n, Op::Where, vec![mask, picked, x])?;
    Ok(())
}

/// The flat positions in a padded `[_, wp]` image of the columns of
/// `im2col`/`col2im`: kernel offset (row-major) outer, block (row-major)
/// inner, i.e. column `(ki * kw + kj) * L + bi * lw + bj` for `blocks` =
/// `(lh, lw)` sliding positions of a `k` kernel with dilation `dil` and
/// stride `st`.
pub(super) fn patch_positions(
    what: &str,
    k: &[i64],
    dil: &[i64],
    st: &[i64],
    wp: i64,
    blocks: (i64, i64),
) -> R<Vec<i64>> {
    let (lh, lw) = blocks;
    // Every position lies inside the padded image, whose size the callers
    // checked, so the arithmetic below stays in range.
    let mut positions = Vec::with_capacity(table_len(what, &[k[0], k[1], lh, lw])?);
    for ki in 0..k[0] {
        for kj in 0..k[1] {
            for bi in 0..lh {
                for bj in 0..lw {
                    positions.push((bi * st[0] + ki * dil[0]) * wp + bj * st[1] + kj * dil[1]);
                }
            }
        }
    }
    Ok(positions)
}

/// `size + 2 * pad` of an `im2col`/`col2im` image.
pub(super) fn padded_size(size: i64, pad: i64) -> R<i64> {
    checked("a padded image size", pad.checked_mul(2).and_then(|p| size.checked_add(p)))
}

/// Sliding positions of a kernel `k` (dilation `dil`, stride `st >= 1`)
/// along a padded length: `(padded - dil * (k - 1) - 1) / st + 1`.
pub(super) fn block_count(padded: i64, k: i64, dil: i64, st: i64) -> R<i64> {
    let span = dil.checked_mul(k - 1).and_then(|r| padded.checked_sub(r)?.checked_sub(1));
    checked("a kernel's sliding positions", span.and_then(|s| s.div_euclid(st).checked_add(1)))
}

/// `aten::col2im(Tensor self, SymInt[2] output_size, int[2] kernel_size,
///   int[2] dilation, int[2] padding, int[2] stride)`: every column element
/// is added (ScatterElements, sum) at its position in the padded image, then
/// the padding is cropped. Static shapes.
pub(super) fn col2im(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let shape = static_dims(imp, x, "col2im input")?;
    let out_size = imp.ints_n(n, "output_size", &[], 2)?;
    let k = imp.ints_n(n, "kernel_size", &[], 2)?;
    let dil = imp.ints_n(n, "dilation", &[], 2)?;
    let pad = imp.ints_n(n, "padding", &[], 2)?;
    let st = imp.ints_n(n, "stride", &[], 2)?;
    let (b, ckk, l) = match shape.as_slice() {
        [b, c, l] => (*b, *c, *l),
        [c, l] => (1, *c, *l),
        _ => return invalid("col2im input must be 2-d or 3-d"),
    };
    if k.iter().chain(&dil).chain(&st).any(|&v| v < 1) || pad.iter().any(|&p| p < 0) {
        return invalid("col2im parameters");
    }
    if out_size.iter().any(|&s| s < 0) {
        return invalid(format!("col2im output size {out_size:?}"));
    }
    let what = "col2im geometry";
    let kk = checked(what, k[0].checked_mul(k[1]))?;
    if ckk % kk != 0 {
        return invalid(format!("col2im: {ckk} rows are not a multiple of the kernel's {kk}"));
    }
    let c = ckk / kk;
    let (hp, wp) = (padded_size(out_size[0], pad[0])?, padded_size(out_size[1], pad[1])?);
    let (lh, lw) = (block_count(hp, k[0], dil[0], st[0])?, block_count(wp, k[1], dil[1], st[1])?);
    if lh < 1 || lw < 1 || lh.checked_mul(lw) != Some(l) {
        return invalid(format!("col2im: {l} blocks, the sizes give {lh} x {lw}"));
    }
    let image = checked(what, hp.checked_mul(wp))?;
    let positions = patch_positions("col2im", &k, &dil, &st, wp, (lh, lw))?;
    let dtype = imp.ty(x).dtype;
    let flat = reshape(imp, x, vec![Dim::Const(b), Dim::Const(c), Dim::Const(kk * l)]);
    let idx = i64_const(imp, &[1, 1, kk * l], &positions);
    let idx = expand(imp, idx, vec![Dim::Const(b), Dim::Const(c), Dim::Const(kk * l)]);
    let canvas = vec![Dim::Const(b), Dim::Const(c), Dim::Const(image)];
    let zeros = imp.push_typed(
        Op::Full { value: 0.0, dtype, shape: canvas.clone() },
        Vec::new(),
        TensorType::new(dtype, canvas),
    );
    let summed = imp.push(
        Op::ScatterElements { axis: 2, reduce: Some(ReduceKind::Sum), include_self: true },
        vec![zeros, idx, flat],
    )?;
    let img = reshape(imp, summed, vec![Dim::Const(b), Dim::Const(c), Dim::Const(hp), Dim::Const(wp)]);
    let (h, w) = (out_size[0], out_size[1]);
    let img = imp.push_typed(
        Op::Slice { axis: 2, start: pad[0], end: pad[0] + h, step: 1 },
        vec![img],
        TensorType::fixed(dtype, &[b, c, h, wp]),
    );
    let img = imp.push_typed(
        Op::Slice { axis: 3, start: pad[1], end: pad[1] + w, step: 1 },
        vec![img],
        TensorType::fixed(dtype, &[b, c, h, w]),
    );
    bind_as_output(imp, n, img)
}
