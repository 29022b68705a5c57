//! Order statistics and moments: sort, topk, argmin, min.dim indices, cumsum,
//! var, std.

use super::shape::normalize_axis;
use crate::import::importer::{dim_at, invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, ScanKind, TensorType, UnaryOp as U, ValueId};

fn output_names(n: &Node) -> Vec<String> {
    n.outputs.iter().map(|o| if let Arg::Tensor(t) = o { t.clone() } else { String::new() }).collect()
}

/// Binds `(values, indices)` outputs of a sort along `axis`, computing only
/// the used ones.
fn sort_outputs(imp: &mut Importer, n: &Node, x: ValueId, axis: usize, k: Dim, descending: bool) -> R<()> {
    let names = output_names(n);
    if names.len() != 2 {
        return invalid("sort/topk must have two outputs");
    }
    for (i, indices) in [(0, false), (1, true)] {
        if imp.is_used(&names[i]) {
            let ty = imp.out_ty(n, i)?;
            let v = imp.push_typed(Op::Sort { axis, k: k.clone(), descending, indices }, vec![x], ty);
            imp.bind(n, i, v)?;
        }
    }
    Ok(())
}

/// `aten::sort(Tensor self, int dim=-1, bool descending=False)`,
/// `aten::sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False)`
/// (kiln's sort is always stable, which satisfies both).
pub(super) fn sort(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    if rank == 0 {
        return unsupported("sort of a 0-d tensor");
    }
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank)?;
    let descending = imp.bool(n, "descending", false)?;
    let k = imp.ty(x).shape[axis].clone();
    sort_outputs(imp, n, x, axis, k, descending)
}

/// `aten::topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True)`
pub(super) fn topk(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    if rank == 0 {
        return topk_of_scalar(imp, n, x);
    }
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank)?;
    let largest = imp.bool(n, "largest", true)?;
    let k = dim_at(&imp.out_ty(n, 0)?, axis, "topk's values output")?;
    sort_outputs(imp, n, x, axis, k, largest)
}

/// topk of a 0-d tensor (torch allows k = 0 or 1, dim 0 or -1): with k = 1
/// the value itself and index 0; the outputs keep torch's declared shapes.
fn topk_of_scalar(imp: &mut Importer, n: &Node, x: ValueId) -> R<()> {
    normalize_axis(imp.int(n, "dim", Some(-1))?, 1)?;
    let names = output_names(n);
    for (i, name) in names.iter().enumerate().take(2) {
        if i > 0 && !imp.is_used(name) {
            continue;
        }
        let ty = imp.out_ty(n, i)?;
        let v = match (i, ty.numel().as_const()) {
            (_, Some(0)) | (1, _) => {
                imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty)
            }
            _ => imp.push_typed(Op::Reshape { shape: ty.shape.clone() }, vec![x], ty),
        };
        imp.bind(n, i, v)?;
    }
    Ok(())
}

/// `aten::argmin(Tensor self, int? dim=None, bool keepdim=False)`
pub(super) fn argmin(imp: &mut Importer, n: &Node) -> R<()> {
    let mut x = imp.tensor(n, "self")?;
    let keep_dims = imp.bool(n, "keepdim", false)?;
    let out = imp.out_ty(n, 0)?;
    let dim = imp.opt_int(n, "dim")?;
    if imp.ty(x).rank() == 0 || dim.is_none() {
        let ty = imp.ty(x).clone();
        let flat = TensorType::new(ty.dtype, vec![ty.numel()]);
        x = imp.push_typed(Op::Reshape { shape: flat.shape.clone() }, vec![x], flat);
        let v = imp.push_typed(Op::ArgMin { axis: 0, keep_dims: false }, vec![x], TensorType::new(DType::I64, vec![]));
        let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
        return imp.bind(n, 0, v);
    }
    let axis = normalize_axis(dim.unwrap_or(0), imp.ty(x).rank())?;
    imp.emit(n, Op::ArgMin { axis, keep_dims }, vec![x])?;
    Ok(())
}

/// `aten::min.dim(Tensor self, int dim, bool keepdim=False) -> (values, indices)` and `max.dim`.
pub(super) fn min_max_dim(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let names = output_names(n);
    if names.len() != 2 {
        return invalid("max.dim/min.dim must have two outputs");
    }
    if rank == 0 {
        // Over a 0-d tensor: the value itself and index 0.
        imp.bind(n, 0, x)?;
        if imp.is_used(&names[1]) {
            let ty = imp.out_ty(n, 1)?;
            let v = imp.push_typed(Op::Full { value: 0.0, dtype: DType::I64, shape: ty.shape.clone() }, vec![], ty);
            imp.bind(n, 1, v)?;
        }
        return Ok(());
    }
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let keep_dims = imp.bool(n, "keepdim", false)?;
    if imp.is_used(&names[0]) {
        let kind = if name == "max" { ReduceKind::Max } else { ReduceKind::Min };
        let ty = imp.out_ty(n, 0)?;
        let v = imp.push_typed(Op::Reduce { kind, axes: vec![axis], keep_dims }, vec![x], ty);
        imp.bind(n, 0, v)?;
    }
    if imp.is_used(&names[1]) {
        let ty = imp.out_ty(n, 1)?;
        let op = if name == "max" { Op::ArgMax { axis, keep_dims } } else { Op::ArgMin { axis, keep_dims } };
        let v = imp.push_typed(op, vec![x], ty);
        imp.bind(n, 1, v)?;
    }
    Ok(())
}

/// `aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None)`: in the output dtype.
pub(super) fn cumsum(imp: &mut Importer, n: &Node) -> R<()> {
    cumulative(imp, n, |axis| Op::CumSum { axis })
}

/// A scan along `dim` of `self` cast to the output dtype (a 0-d tensor is
/// its own scan).
fn cumulative(imp: &mut Importer, n: &Node, op: impl FnOnce(usize) -> Op) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let x = imp.cast(x, out.dtype);
    if out.rank() == 0 {
        return imp.bind(n, 0, x);
    }
    let axis = normalize_axis(imp.int(n, "dim", None)?, out.rank())?;
    imp.emit(n, op(axis), vec![x])?;
    Ok(())
}

/// `aten::cumprod(Tensor self, int dim, *, ScalarType? dtype=None)` (in the
/// output dtype) and `aten::logcumsumexp(Tensor self, int dim)`.
pub(super) fn scan(imp: &mut Importer, n: &Node, kind: ScanKind) -> R<()> {
    cumulative(imp, n, |axis| Op::Scan { axis, kind })
}

/// `aten::cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)`
/// and `cummin`: the running extreme and its (last) index.
pub(super) fn cum_extreme(imp: &mut Importer, n: &Node, max: bool) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    if rank == 0 {
        let zero = imp.push(Op::Full { value: 0.0, dtype: DType::I64, shape: vec![] }, vec![])?;
        imp.bind(n, 0, x)?;
        return imp.bind(n, 1, zero);
    }
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let (values, indices) = if max { (ScanKind::Max, ScanKind::ArgMax) } else { (ScanKind::Min, ScanKind::ArgMin) };
    let v = imp.push(Op::Scan { axis, kind: values }, vec![x])?;
    imp.bind(n, 0, v)?;
    let i = imp.push(Op::Scan { axis, kind: indices }, vec![x])?;
    imp.bind(n, 1, i)
}

/// `aten::diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None)`:
/// `prepend`/`append` are concatenated along `dim`, then `n` times
/// `x[1:] - x[:-1]` (`x[1:] != x[:-1]` for bool, as torch's logical_xor).
/// Training IR keeps it (Hugging Face's packed-sequence detection uses it);
/// Core ATen decomposes it into the same slices and sub.
pub(super) fn diff(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let rank = imp.ty(x).rank();
    if rank == 0 {
        return invalid("diff of a 0-d tensor");
    }
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank)?;
    let order = imp.int(n, "n", Some(1))?;
    if order < 0 {
        return invalid(format!("diff order {order}"));
    }
    let mut parts = Vec::new();
    for name in ["prepend", "self", "append"] {
        let Some(p) = (if name == "self" { Some(x) } else { imp.opt_tensor(n, name)? }) else { continue };
        if imp.ty(p).rank() != rank {
            return unsupported(format!("diff with a `{name}` of rank {} (input rank {rank})", imp.ty(p).rank()));
        }
        parts.push(imp.cast(p, out.dtype));
    }
    let mut v = if parts.len() == 1 { parts[0] } else { imp.push(Op::Concat { axis }, parts)? };
    for step in 0..order {
        let ty = imp.ty(v).clone();
        let len = ty.shape[axis].clone();
        let shorter = match len.as_const() {
            Some(0) => break, // torch: diff of an empty axis stays empty
            Some(l) => Dim::Const(l - 1),
            // `x[1:] - x[:-1]` with symbolic ends; the length must stay
            // positive at every size the bounds allow, or torch's empty
            // result would need a max(len - 1, 0) kiln cannot express.
            None if len.bounds(&imp.g.symbols).0 >= 1 => Dim::add(len.clone(), Dim::Const(-1)),
            None => {
                return unsupported(format!(
                    "diff of order {order} along the dynamic dimension {} (it may be shorter than {})",
                    imp.ty(x).shape[axis].display(&imp.g.symbols),
                    step + 1
                ))
            }
        };
        let mut shape = ty.shape.clone();
        shape[axis] = shorter;
        let piece = TensorType::new(ty.dtype, shape);
        // `end: -1` counts from the end, for a static or a dynamic length alike.
        let hi = imp.push_typed(Op::Slice { axis, start: 1, end: i64::MAX, step: 1 }, vec![v], piece.clone());
        let lo = imp.push_typed(Op::Slice { axis, start: 0, end: -1, step: 1 }, vec![v], piece.clone());
        let op = if ty.dtype == DType::Bool { B::Ne } else { B::Sub };
        v = imp.push_typed(Op::Binary(op), vec![hi, lo], piece);
    }
    let got = imp.ty(v).shape.clone();
    let same = got.len() == out.shape.len()
        && got.iter().zip(&out.shape).all(|(a, b)| kiln_ir::infer::dims_equal(a, b, &imp.g.symbols) == Some(true));
    if !same {
        return invalid(format!("diff result {got:?}, output type {:?}", out.shape));
    }
    imp.bind(n, 0, v)
}

/// `aten::var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)`,
/// `aten::var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False)`,
/// `aten::var(Tensor self, bool unbiased=True)` and the same for `std`:
/// `sum((x - mean)²) / (N - correction)`, computed in f64 (two passes).
pub(super) fn var_std(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    if !out.dtype.is_float() {
        return unsupported(format!("{name} with output dtype {}", out.dtype));
    }
    let ty = imp.ty(x).clone();
    let rank = ty.rank();
    let dims = if overload == "default" { Vec::new() } else { imp.ints(n, "dim", &[])? };
    let mut axes: Vec<usize> = if dims.is_empty() {
        (0..rank).collect()
    } else {
        dims.iter().map(|&d| normalize_axis(d, rank.max(1))).collect::<R<_>>()?
    };
    axes.sort_unstable();
    axes.dedup();
    axes.retain(|&a| a < rank);
    let correction = match overload {
        "correction" => imp.opt_scalar(n, "correction")?.map_or(1.0, Scalar::as_f64),
        _ => {
            if imp.bool(n, "unbiased", true)? {
                1.0
            } else {
                0.0
            }
        }
    };
    let keep_dims = imp.bool(n, "keepdim", false)?;
    let count = axes.iter().fold(Dim::Const(1), |c, &a| Dim::mul(c, ty.shape[a].clone()));
    let x64 = imp.cast(x, DType::F64);
    let v = if rank == 0 {
        imp.with_scalar(B::Mul, x64, 0.0)?
    } else {
        let mean = imp.push(Op::Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keep_dims: true }, vec![x64])?;
        let d = imp.push(Op::Binary(B::Sub), vec![x64, mean])?;
        let sq = imp.push(Op::Binary(B::Mul), vec![d, d])?;
        imp.push(Op::Reduce { kind: ReduceKind::Sum, axes, keep_dims }, vec![sq])?
    };
    // torch divides by max(N - correction, 0) (0 / 0 is NaN, x / 0 is inf).
    let v = match count.as_const() {
        Some(count) => imp.with_scalar(B::Div, v, (count as f64 - correction).max(0.0))?,
        None => {
            let n = imp.dim_scalar(&count, DType::F64);
            let n = imp.with_scalar(B::Sub, n, correction)?;
            let n = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![n])?;
            imp.push(Op::Binary(B::Div), vec![v, n])?
        }
    };
    let v = if name == "std" { imp.push(Op::Unary(U::Sqrt), vec![v])? } else { v };
    let v = imp.cast(v, out.dtype);
    let v = if imp.ty(v).shape != out.shape {
        imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out)
    } else {
        v
    };
    imp.bind(n, 0, v)
}
