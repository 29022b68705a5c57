//! Layout, indexing and tensor-creation ops. Shapes come from the output
//! types in `tensor_values` (authoritative and symbolic), not from arguments.

use crate::import::importer::{checked, dim_at, invalid, unsupported, Importer, R};
use crate::import::views::{torch_contiguous, ViewStep};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{DType, Dim, Op, TensorType, ValueId};

/// `dim` in `[-rank, rank)` → `[0, rank)`.
pub(crate) fn normalize_axis(dim: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if (0..r).contains(&d) {
        Ok(d as usize)
    } else {
        invalid(format!("dim {dim} out of range for rank {rank}"))
    }
}

/// Records output 0 of `n` as a view of its `self` input made by `step`.
fn record_view(imp: &mut Importer, n: &Node, step: ViewStep) {
    let Ok(base) = imp.tensor_name(n, "self").map(str::to_string) else { return };
    if let Some(Arg::Tensor(out)) = n.outputs.first() {
        imp.record_view(out, &base, step);
    }
}

/// `view(Tensor self, SymInt[] size)`, `reshape`, `_unsafe_view`, `flatten.using_ints`,
/// `unflatten`, `unsqueeze`, `squeeze(.dim/.dims)`, `view_as`: all a reshape to the output type.
pub(super) fn reshape(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let same_shape = imp.ty(x).shape == out.shape;
    let step = if same_shape { ViewStep::Identity } else { ViewStep::Reshape };
    if matches!(name, "reshape" | "reshape_as" | "flatten") {
        // These copy when torch cannot view the input's strides. A view keeps
        // the input's elements in place and in row-major order, so a
        // non-contiguous input gives a contiguous output only by copying.
        let (input, output) = match (imp.tensor_name(n, "self"), n.outputs.first()) {
            (Ok(i), Some(Arg::Tensor(o))) => (i.to_string(), o.clone()),
            _ => return invalid("reshape without a tensor input and output"),
        };
        match (torch_contiguous(imp, &input), torch_contiguous(imp, &output)) {
            (Some(true), _) | (_, Some(false)) => record_view(imp, n, step),
            (Some(false), Some(true)) => {}
            _ => record_view(imp, n, ViewStep::Opaque(format!("a `{name}` that may have copied"))),
        }
    } else {
        record_view(imp, n, step);
    }
    if same_shape {
        return imp.bind(n, 0, x);
    }
    imp.emit(n, Op::Reshape { shape: out.shape.clone() }, vec![x])?;
    Ok(())
}

/// `aten::expand(Tensor self, SymInt[] size, *, bool implicit=False)`, `expand_as`
pub(super) fn expand(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let same_shape = imp.ty(x).shape == out.shape;
    record_view(imp, n, if same_shape { ViewStep::Identity } else { ViewStep::Expand });
    if same_shape {
        return imp.bind(n, 0, x);
    }
    imp.emit(n, Op::Expand { shape: out.shape.clone() }, vec![x])?;
    Ok(())
}

/// `aten::t(Tensor self)`, `aten::transpose.int(Tensor self, int dim0, int dim1)`,
/// `aten::permute(Tensor self, int[] dims)`, `aten::numpy_T(Tensor self)`
pub(super) fn permute(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let perm: Vec<usize> = match name {
        "t" | "numpy_T" => (0..rank).rev().collect(),
        "mT" if rank >= 2 => {
            let mut p: Vec<usize> = (0..rank).collect();
            p.swap(rank - 2, rank - 1);
            p
        }
        "mT" => return invalid(format!("mT of a rank-{rank} tensor")),
        "movedim" => {
            let src = normalize_axis(imp.int(n, "source", None)?, rank.max(1))?;
            let dst = normalize_axis(imp.int(n, "destination", None)?, rank.max(1))?;
            let mut p: Vec<usize> = (0..rank).filter(|&a| a != src).collect();
            if rank > 0 {
                p.insert(dst, src);
            }
            p
        }
        "transpose" | "swapaxes" | "swapdims" => {
            let a = normalize_axis(imp.int(n, "dim0", None)?, rank.max(1))?;
            let b = normalize_axis(imp.int(n, "dim1", None)?, rank.max(1))?;
            let mut p: Vec<usize> = (0..rank).collect();
            if rank > 0 {
                p.swap(a, b);
            }
            p
        }
        _ => {
            let dims = imp.ints(n, "dims", &[])?;
            let p = dims.iter().map(|&d| normalize_axis(d, rank)).collect::<R<Vec<_>>>()?;
            let mut seen = vec![false; rank];
            for &a in &p {
                if std::mem::replace(&mut seen[a], true) {
                    return invalid(format!("permutation {dims:?} repeats an axis"));
                }
            }
            if p.len() != rank {
                return invalid(format!("permutation {dims:?} for rank {rank}"));
            }
            p
        }
    };
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        record_view(imp, n, ViewStep::Identity);
        return imp.bind(n, 0, x);
    }
    record_view(imp, n, ViewStep::Permute(perm.clone()));
    imp.emit(n, Op::Permute { perm }, vec![x])?;
    Ok(())
}

/// Copies, aliases and conversions: `alias`, `clone(*, MemoryFormat? memory_format=None)`,
/// `contiguous`, `detach`, `lift_fresh_copy`, `_to_copy(*, ScalarType? dtype=None, ...)`,
/// `to.dtype(Tensor self, ScalarType dtype, ...)`, `to.dtype_layout`, `to.device`, `type_as`.
/// Same dtype → the input value itself; otherwise a Cast.
pub(super) fn identity_or_cast(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let input = imp.tensor_name(n, "self")?.to_string();
    let aliases = match name {
        "alias" | "detach" => true,
        // `contiguous` returns `self` when torch's tensor already is.
        "contiguous" => match torch_contiguous(imp, &input) {
            Some(c) => c,
            None => {
                record_view(imp, n, ViewStep::Opaque("a `contiguous` that may have copied".into()));
                false
            }
        },
        // `to` returns `self` unless it converts (dtype, memory format) or is told to copy.
        "to" => {
            let same_strides = match n.outputs.first() {
                Some(Arg::Tensor(o)) => {
                    let tv = imp.scope.tensor_values;
                    tv.get(&input).map(|m| &m.strides) == tv.get(o.as_str()).map(|m| &m.strides)
                }
                _ => false,
            };
            imp.ty(x).dtype == out.dtype && !imp.bool(n, "copy", false)? && same_strides
        }
        _ => false,
    };
    if aliases {
        record_view(imp, n, ViewStep::Identity);
    }
    let v = imp.cast(x, out.dtype);
    imp.bind(n, 0, v)
}

/// Normalises a slice bound against a (possibly symbolic) dimension. Torch
/// clamps out-of-range bounds; `i64::MAX` stays "to the end". A negative
/// bound on a dynamic dimension stays negative (counted from the end at run
/// time, see [`Op::Slice`]) when the dimension's lower bound keeps it in range.
fn slice_bound(imp: &Importer, v: i64, dim: &Dim, what: &str) -> R<i64> {
    if v >= 0 {
        return Ok(match dim.as_const() {
            Some(d) => v.min(d),
            None => v,
        });
    }
    match dim.as_const() {
        Some(d) => Ok((v + d).max(0)),
        None if dim.bounds(&imp.g.symbols).0 >= v.saturating_neg() => Ok(v),
        None => unsupported(format!(
            "negative slice {what} {v} on the dynamic dimension {}, which may be shorter than {}",
            dim.display(&imp.g.symbols),
            v.saturating_neg()
        )),
    }
}

pub(crate) fn slice_value(
    imp: &mut Importer,
    x: ValueId,
    axis: usize,
    start: i64,
    end: i64,
    step: i64,
    ty: TensorType,
) -> ValueId {
    let full = start == 0 && step == 1 && imp.ty(x).shape.get(axis).and_then(Dim::as_const).is_some_and(|d| end >= d);
    if (full || (start == 0 && end == i64::MAX && step == 1)) && imp.ty(x).shape == ty.shape {
        return x;
    }
    imp.push_typed(Op::Slice { axis, start, end, step }, vec![x], ty)
}

/// A static (possibly omitted) slice bound.
fn bound_arg(imp: &mut Importer, n: &Node, name: &str, default: i64) -> R<i64> {
    match imp.arg(n, name) {
        None => Ok(default),
        Some(Arg::SymInt(s)) => match imp.sym(s)?.as_const() {
            Some(v) => Ok(v),
            None => unsupported(format!("symbolic slice {name}")),
        },
        Some(_) => imp.int(n, name, Some(default)),
    }
}

/// `aten::slice.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1)`
pub(super) fn slice(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(0))?, rank)?;
    let dim = imp.ty(x).shape[axis].clone();
    let start = bound_arg(imp, n, "start", 0)?;
    let start = slice_bound(imp, start, &dim, "start")?;
    let step = imp.int(n, "step", Some(1))?;
    if step < 1 {
        return invalid(format!("slice step {step}"));
    }
    let out = imp.out_ty(n, 0)?;
    if let Some(Arg::SymInt(e)) = imp.arg(n, "end") {
        if imp.sym(e)?.as_const().is_none() {
            // A symbolic end (`x[:, :y.shape[0]]`): gather `start, start+step, ..`
            // for torch's own output length (its guards keep the end in range;
            // the gather kernel refuses an index past the dimension).
            if start < 0 {
                return unsupported("slice with a negative start and a symbolic end");
            }
            record_view(imp, n, ViewStep::Slice { axis, start, end: None, step });
            let len = dim_at(&out, axis, "slice's output")?;
            let idx = imp.push_typed(
                Op::Arange { start: start as f64, step: step as f64, len: len.clone(), dtype: DType::I64 },
                Vec::new(),
                TensorType::new(DType::I64, vec![len]),
            );
            imp.emit(n, Op::Gather { axis }, vec![x, idx])?;
            return Ok(());
        }
    }
    let end = bound_arg(imp, n, "end", i64::MAX)?;
    let end = slice_bound(imp, end, &dim, "end")?;
    let v = slice_value(imp, x, axis, start, end, step, out);
    record_view(
        imp,
        n,
        if v == x { ViewStep::Identity } else { ViewStep::Slice { axis, start, end: Some(end), step } },
    );
    imp.bind(n, 0, v)
}

/// `aten::select.int(Tensor self, int dim, SymInt index)` → Slice + Reshape.
pub(super) fn select(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let dim = imp.ty(x).shape[axis].clone();
    let index = bound_arg(imp, n, "index", 0)?;
    let index = slice_bound(imp, index, &dim, "index")?;
    let out = imp.out_ty(n, 0)?;
    let mut sliced_shape = imp.ty(x).shape.clone();
    sliced_shape[axis] = Dim::Const(1);
    let sliced = TensorType::new(out.dtype, sliced_shape);
    record_view(imp, n, ViewStep::Select { axis, index });
    // A negative index is left on a dynamic dimension: `-1` ends at the end.
    let end = if index == -1 { i64::MAX } else { index.saturating_add(1) };
    let s = imp.push_typed(Op::Slice { axis, start: index, end, step: 1 }, vec![x], sliced);
    imp.emit(n, Op::Reshape { shape: out.shape.clone() }, vec![s])?;
    Ok(())
}

/// `aten::narrow(Tensor self, int dim, SymInt start, SymInt length)`
pub(super) fn narrow(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let dim = imp.ty(x).shape[axis].clone();
    let start = bound_arg(imp, n, "start", 0)?;
    let start = slice_bound(imp, start, &dim, "start")?;
    let length = bound_arg(imp, n, "length", 0)?;
    let out = imp.out_ty(n, 0)?;
    // From the end of a dynamic dimension, `start + length == 0` means "to the end".
    let end = if start < 0 && start.saturating_add(length) == 0 { i64::MAX } else { start.saturating_add(length) };
    let v = slice_value(imp, x, axis, start, end, 1, out);
    record_view(
        imp,
        n,
        if v == x { ViewStep::Identity } else { ViewStep::Slice { axis, start, end: Some(end), step: 1 } },
    );
    imp.bind(n, 0, v)
}

/// `aten::cat(Tensor[] tensors, int dim=0)`: inputs are promoted to the output dtype.
pub(super) fn cat(imp: &mut Importer, n: &Node) -> R<()> {
    let xs = imp.tensors(n, "tensors")?;
    let out = imp.out_ty(n, 0)?;
    let axis = normalize_axis(imp.int(n, "dim", Some(0))?, out.rank())?;
    // Legacy: 1-d empty tensors are skipped by torch.cat whatever their rank.
    let kept: Vec<ValueId> = xs
        .into_iter()
        .filter(|&x| !(imp.ty(x).rank() == 1 && imp.ty(x).shape[0] == Dim::Const(0) && out.rank() != 1))
        .collect();
    let xs: Vec<ValueId> = kept.into_iter().map(|x| imp.cast(x, out.dtype)).collect();
    if xs.len() == 1 {
        return imp.bind(n, 0, xs[0]);
    }
    imp.emit(n, Op::Concat { axis }, xs)?;
    Ok(())
}

/// `aten::split.Tensor(Tensor self, SymInt split_size, int dim=0)`,
/// `aten::split_with_sizes(Tensor self, SymInt[] split_sizes, int dim=0)`,
/// `aten::chunk(Tensor self, int chunks, int dim=0)`, `aten::unbind.int(Tensor self, int dim=0)`,
/// `aten::tensor_split.sections/indices(...)`: each output is a slice of `self`
/// along `dim`, sized as its output type says; unbind also drops the axis.
pub(super) fn split(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(0))?, rank)?;
    let names: Vec<String> = match n.outputs.as_slice() {
        [Arg::Tensors(ts)] => ts.clone(),
        outs => outs.iter().filter_map(|o| if let Arg::Tensor(t) = o { Some(t.clone()) } else { None }).collect(),
    };
    let base = imp.tensor_name(n, "self")?.to_string();
    let count = names.len();
    let mut start = 0i64;
    for (i, out_name) in names.iter().enumerate() {
        let out = imp.type_of(out_name)?;
        let len = if name == "unbind" {
            Dim::Const(1)
        } else {
            match out.shape.get(axis) {
                Some(d) => d.clone(),
                None => return invalid(format!("split output `{out_name}` has rank {}", out.rank())),
            }
        };
        let last = i + 1 == count;
        let end = match len.as_const() {
            Some(l) if !last => checked("split sizes", start.checked_add(l))?,
            Some(l) => match imp.ty(x).shape[axis].as_const() {
                Some(_) => checked("split sizes", start.checked_add(l))?,
                None => i64::MAX,
            },
            None if last => i64::MAX,
            None => return unsupported("split into dynamically sized pieces"),
        };
        if imp.is_used(out_name) {
            let mut shape = imp.ty(x).shape.clone();
            shape[axis] = len.clone();
            let piece_ty = TensorType::new(out.dtype, shape);
            let piece = imp.push_typed(Op::Slice { axis, start, end, step: 1 }, vec![x], piece_ty.clone());
            let v = if piece_ty.shape == out.shape {
                piece
            } else {
                imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![piece], out)
            };
            imp.bind_name(out_name, v);
        }
        let step = if name == "unbind" {
            ViewStep::Select { axis, index: start }
        } else {
            ViewStep::Slice { axis, start, end: Some(end), step: 1 }
        };
        imp.record_view(out_name, &base, step);
        start = end;
    }
    Ok(())
}

/// Indices for Gather: i64, as the IR requires.
fn index_value(imp: &mut Importer, idx: ValueId) -> R<ValueId> {
    match imp.ty(idx).dtype {
        DType::I64 => Ok(idx),
        d if d.is_int() => Ok(imp.cast(idx, DType::I64)),
        d => unsupported(format!("indexing with a {d} tensor (boolean masks are not supported)")),
    }
}

/// `aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1,
///   bool scale_grad_by_freq=False, bool sparse=False)` → Gather axis 0.
/// (padding_idx only affects gradients.)
pub(super) fn embedding(imp: &mut Importer, n: &Node) -> R<()> {
    let w = imp.tensor(n, "weight")?;
    let idx = imp.tensor(n, "indices")?;
    let idx = index_value(imp, idx)?;
    imp.emit(n, Op::Gather { axis: 0 }, vec![w, idx])?;
    Ok(())
}

/// `aten::index_select(Tensor self, int dim, Tensor index)`
pub(super) fn index_select(imp: &mut Importer, n: &Node) -> R<()> {
    let mut x = imp.tensor(n, "self")?;
    let axis = normalize_axis(imp.int(n, "dim", None)?, imp.ty(x).rank().max(1))?;
    let idx = imp.tensor(n, "index")?;
    let idx = index_value(imp, idx)?;
    if imp.ty(x).rank() == 0 {
        // A 0-d tensor is indexed as if it were [1]; the result keeps the output's shape.
        let ty = imp.ty(x).clone();
        let one = TensorType::new(ty.dtype, vec![Dim::Const(1)]);
        x = imp.push_typed(Op::Reshape { shape: one.shape.clone() }, vec![x], one);
        let out = imp.out_ty(n, 0)?;
        let gathered = imp.push(Op::Gather { axis: 0 }, vec![x, idx])?;
        let v = if imp.ty(gathered).shape == out.shape {
            gathered
        } else {
            imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![gathered], out)
        };
        return imp.bind(n, 0, v);
    }
    imp.emit(n, Op::Gather { axis }, vec![x, idx])?;
    Ok(())
}

/// `aten::arange(Scalar end, ...)`, `arange.start(Scalar start, Scalar end, ...)`,
/// `arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, ...)`.
/// The length is the output's (possibly symbolic) size.
pub(super) fn arange(imp: &mut Importer, n: &Node) -> R<()> {
    let start = match imp.arg(n, "start") {
        None => 0.0,
        Some(_) => imp.float(n, "start", None)?,
    };
    let step = match imp.arg(n, "step") {
        None => 1.0,
        Some(_) => imp.float(n, "step", None)?,
    };
    let out = imp.out_ty(n, 0)?;
    let [len] = out.shape.as_slice() else { return invalid("arange output is not 1-d") };
    let op = Op::Arange { start, step, len: len.clone(), dtype: out.dtype };
    imp.emit(n, op, Vec::new())?;
    Ok(())
}

/// `aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, ...)`,
/// `zeros/ones/empty(SymInt[] size, ...)`, `full_like(Tensor self, Scalar fill_value, ...)`,
/// `zeros_like/ones_like/empty_like(Tensor self, ...)`, `new_zeros/new_ones/new_empty(Tensor self, SymInt[] size, ...)`,
/// `new_full(Tensor self, SymInt[] size, Scalar fill_value, ...)`, `scalar_tensor(Scalar s, ...)`.
/// Shape and dtype are the output's; `empty` is filled with zeros.
pub(super) fn full(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let value = match name {
        "full" | "full_like" | "new_full" => imp.scalar(n, "fill_value")?.as_f64(),
        "scalar_tensor" => imp.scalar(n, "s")?.as_f64(),
        "ones" | "ones_like" | "new_ones" => 1.0,
        _ => 0.0,
    };
    let out = imp.out_ty(n, 0)?;
    imp.emit(n, Op::Full { value, dtype: out.dtype, shape: out.shape.clone() }, Vec::new())?;
    Ok(())
}

/// `aten::repeat(Tensor self, SymInt[] repeats)`: `x` viewed as
/// `[1, d0, 1, d1, ..]`, expanded to `[r0, d0, r1, d1, ..]`, then merged pairwise.
pub(super) fn repeat(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let repeats = imp.ints(n, "repeats", &[])?;
    let out = imp.out_ty(n, 0)?;
    let ty = imp.ty(x).clone();
    if repeats.len() < ty.rank() || repeats.iter().any(|&r| r < 0) {
        return invalid(format!("repeat by {repeats:?} of a rank-{} tensor", ty.rank()));
    }
    let lead = repeats.len() - ty.rank();
    let dims: Vec<Dim> = std::iter::repeat_n(Dim::Const(1), lead).chain(ty.shape.iter().cloned()).collect();
    let mut ones = Vec::new();
    let mut wide = Vec::new();
    for (d, &r) in dims.iter().zip(&repeats) {
        ones.extend([Dim::Const(1), d.clone()]);
        wide.extend([Dim::Const(r), d.clone()]);
    }
    let a = imp.push_typed(Op::Reshape { shape: ones.clone() }, vec![x], TensorType::new(ty.dtype, ones));
    let b = imp.push_typed(Op::Expand { shape: wide.clone() }, vec![a], TensorType::new(ty.dtype, wide));
    imp.emit(n, Op::Reshape { shape: out.shape.clone() }, vec![b])?;
    Ok(())
}

/// `aten::copy(Tensor self, Tensor src, bool non_blocking=False)`: `src` in
/// `self`'s dtype, broadcast to its shape.
pub(super) fn copy(imp: &mut Importer, n: &Node) -> R<()> {
    let src = imp.tensor(n, "src")?;
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(src, out.dtype);
    if imp.ty(v).shape == out.shape {
        return imp.bind(n, 0, v);
    }
    imp.emit(n, Op::Expand { shape: out.shape.clone() }, vec![v])?;
    Ok(())
}

/// `aten::fill.Scalar(Tensor self, Scalar value)`, `aten::fill.Tensor(Tensor self, Tensor value)` (0-d value).
pub(super) fn fill(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    if let Some(Arg::Tensor(t)) = imp.arg(n, "value") {
        let v = imp.value(t)?;
        let v = imp.cast(v, out.dtype);
        imp.emit(n, Op::Expand { shape: out.shape.clone() }, vec![v])?;
        return Ok(());
    }
    let value = imp.scalar(n, "value")?.as_f64();
    imp.emit(n, Op::Full { value, dtype: out.dtype, shape: out.shape.clone() }, Vec::new())?;
    Ok(())
}
