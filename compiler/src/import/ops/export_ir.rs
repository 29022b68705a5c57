//! Ops raw `torch.export.export()` (training IR) keeps and Core ATen
//! decomposes, found by the 2026-12-05 `generate.py --all` sweep: aliases
//! (`divide`, `subtract`, `sgn`, `mH`, `linalg_diagonal`), splits and
//! reshapes (`hsplit`/`vsplit`/`dsplit`, `unsafe_split`, `atleast_*d`,
//! `movedim` with lists, `_chunk_cat`, `resize_`), sorting (`msort`,
//! `argsort`), flat indexing (`take`, `put`, `as_strided_scatter`, the
//! masked index ops of decompositions), tests (`isin`, `isposinf`,
//! `isneginf`, `isreal`), and small numerics (`xlog1py`, `nanmean`,
//! `round(decimals=)`, `linspace`/`logspace`, `multi_dot`, `vecdot`,
//! `_safe_softmax`, `fftshift`). Each is torch's own definition (its
//! reference or C++ kernel) on kiln's primitives; several rewrite the node
//! into one kiln already converts, with new argument values bound under
//! internal names.

use super::activation::compute_dtype;
use super::composite::{bin, finish, float_in, reshape, un};
use super::shape::normalize_axis;
use crate::import::importer::{invalid, output_names, unsupported, Fail, Importer, Scalar, R};
use crate::pt2::program::{Arg, NamedArg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, UnaryOp as U, ValueId};

/// Converts `name` if it is one of this module's ops; `Unsupported(None)`
/// otherwise.
pub(super) fn dispatch(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    match name {
        "divide" => rewrite(imp, n, &format!("div.{overload}"), n.inputs.clone()),
        "subtract" => rewrite(imp, n, &format!("sub.{overload}"), n.inputs.clone()),
        // Real tensors only reach kiln's boundary: the conjugate is the identity.
        "mH" | "matrix_H" => rewrite(imp, n, "mT.default", n.inputs.clone()),
        "sgn" => rewrite(imp, n, "sign.default", n.inputs.clone()),
        "linalg_diagonal" => {
            let inputs = renamed(n, &[("A", "self")]);
            rewrite(imp, n, "diagonal.default", inputs)
        }
        "vsplit" | "hsplit" | "dsplit" => split_along(imp, n, name),
        "unsafe_split" => rewrite(imp, n, "split.Tensor", n.inputs.clone()),
        "msort" | "argsort" => sort_one(imp, n, name),
        "movedim" => movedim(imp, n),
        "atleast_1d" | "atleast_2d" | "atleast_3d" => atleast(imp, n),
        "isreal" | "isposinf" | "isneginf" => float_test(imp, n, name),
        "fft_fftshift" | "fft_ifftshift" => fftshift(imp, n, name == "fft_ifftshift"),
        "feature_alpha_dropout" => rewrite(imp, n, "alpha_dropout.default", n.inputs.clone()),
        "diagflat" => diagflat(imp, n),
        "take" => take(imp, n),
        "put" => put(imp, n),
        "special_xlog1py" => xlog1py(imp, n),
        // `zero_` (the in-place wrapper strips the underscore): zeros like self.
        "zero" => {
            let x = imp.tensor(n, "self")?;
            let ty = imp.ty(x).clone();
            let z = imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty);
            imp.bind(n, 0, z)
        }
        "new_empty_strided" => {
            // Uninitialised in torch: zeros are one of its possible values.
            let out = imp.out_ty(n, 0)?;
            let z = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
            imp.bind(n, 0, z)
        }
        "resize" | "resize_as" => resize(imp, n),
        "_safe_softmax" => safe_softmax(imp, n),
        "_chunk_cat" => chunk_cat(imp, n),
        "linspace" | "logspace" => spaced(imp, n, name == "logspace"),
        "linalg_multi_dot" => multi_dot(imp, n),
        "isin" => isin(imp, n),
        "cross" => cross(imp, n),
        "nanmean" => nanmean(imp, n),
        "linalg_vecdot" => vecdot(imp, n),
        "as_strided_scatter" => as_strided_scatter(imp, n),
        "_unsafe_masked_index" => masked_index(imp, n),
        "_unsafe_masked_index_put_accumulate" => masked_index_put(imp, n),
        "max_unpool2d" | "max_unpool3d" => max_unpool(imp, n),
        "adaptive_max_pool1d" | "adaptive_max_pool2d" | "adaptive_max_pool3d" => adaptive_max_pool(imp, n, name),
        "bilinear" => bilinear(imp, n),
        "mvlgamma" => mvlgamma(imp, n),
        "trapz" | "trapezoid" | "cumulative_trapezoid" => trapezoid(imp, n, name == "cumulative_trapezoid"),
        "linalg_vander" => vander(imp, n),
        "renorm" => renorm(imp, n),
        "cosine_embedding_loss" | "margin_ranking_loss" | "soft_margin_loss" | "hinge_embedding_loss" => {
            pair_loss(imp, n, name)
        }
        "poisson_nll_loss" => poisson_nll_loss(imp, n),
        "gradient" => gradient(imp, n),
        "eye" => eye(imp, n),
        "triplet_margin_loss" => triplet_margin_loss(imp, n),
        "_trilinear" => trilinear(imp, n),
        "native_dropout_backward" => dropout_backward(imp, n),
        "_softmax_backward_data" | "_log_softmax_backward_data" => softmax_backward(imp, n, name),
        _ => Err(Fail::Unsupported(None)),
    }
}

// ------------------------------------------------------------------ helpers

fn named(name: &str, arg: Arg) -> NamedArg {
    NamedArg { name: name.to_string(), arg }
}

/// `n`'s arguments with names changed by `rename` (from, to).
fn renamed(n: &Node, rename: &[(&str, &str)]) -> Vec<NamedArg> {
    let mut inputs = n.inputs.clone();
    for a in &mut inputs {
        if let Some((_, to)) = rename.iter().find(|(from, _)| *from == a.name) {
            a.name = to.to_string();
        }
    }
    inputs
}

/// `n`'s arguments with `replace` set (added or overwritten).
fn with_args(n: &Node, replace: Vec<NamedArg>) -> Vec<NamedArg> {
    let mut inputs: Vec<NamedArg> =
        n.inputs.iter().filter(|a| !replace.iter().any(|r| r.name == a.name)).cloned().collect();
    inputs.extend(replace);
    inputs
}

/// Binds `v` under an internal name, as an argument of a rewritten node.
fn temp(imp: &mut Importer, v: ValueId) -> Arg {
    let name = format!("__kiln_rewrite_{v:?}");
    imp.bind_name(&name, v);
    Arg::Tensor(name)
}

/// Converts `n` as if it called `aten.<target>` with `inputs` (its outputs
/// unchanged).
fn rewrite(imp: &mut Importer, n: &Node, target: &str, inputs: Vec<NamedArg>) -> R<()> {
    let (name, overload) = target.rsplit_once('.').unwrap_or((target, "default"));
    let mut m = n.clone();
    m.target = format!("torch.ops.aten.{target}");
    m.inputs = inputs;
    super::dispatch(imp, &m, name, overload)
}

fn flat(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let numel = imp.ty(x).numel();
    reshape(imp, x, vec![numel])
}

fn static_shape(imp: &Importer, x: ValueId, what: &str) -> R<Vec<i64>> {
    match imp.ty(x).static_shape() {
        Some(s) => Ok(s.to_vec()),
        None => unsupported(format!("{what} of a tensor with a dynamic size")),
    }
}

fn arange(imp: &mut Importer, len: i64, dtype: DType) -> ValueId {
    let ty = TensorType::new(dtype, vec![Dim::Const(len)]);
    imp.push_typed(Op::Arange { start: 0.0, step: 1.0, len: Dim::Const(len), dtype }, vec![], ty)
}

/// The `dim` argument (an int or a list, normalised); every dim when absent.
fn dims_arg(imp: &mut Importer, n: &Node, rank: usize) -> R<Vec<usize>> {
    match imp.arg(n, "dim") {
        None => Ok((0..rank).collect()),
        Some(Arg::Int(d)) => Ok(vec![normalize_axis(*d, rank.max(1))?]),
        Some(_) => imp.ints(n, "dim", &[])?.iter().map(|&d| normalize_axis(d, rank.max(1))).collect(),
    }
}

// ---------------------------------------------------------------- the ops

/// `{v,h,d}split.{int,array}(self, sections | indices)`: a split along dim
/// 0, 1 (0 for a 1-d tensor) or 2, the pieces' sizes from their declared
/// shapes.
fn split_along(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dim = match name {
        "vsplit" => 0,
        "hsplit" if imp.ty(x).rank() == 1 => 0,
        "hsplit" => 1,
        _ => 2,
    };
    let inputs = vec![
        n.inputs.iter().find(|a| a.name == "self").cloned().unwrap_or(named("self", Arg::None)),
        named("dim", Arg::Int(dim)),
    ];
    rewrite(imp, n, "split.Tensor", inputs)
}

/// `msort(self)`: values sorted along dim 0; `argsort(self, dim=-1,
/// descending=False)` and `.stable`: the indices of a (stable) sort.
fn sort_one(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let out = imp.out_ty(n, 0)?;
    if rank == 0 {
        let v = if name == "msort" {
            x
        } else {
            imp.push_typed(Op::Full { value: 0.0, dtype: DType::I64, shape: vec![] }, vec![], out.clone())
        };
        return imp.bind(n, 0, v);
    }
    let (axis, descending) = if name == "msort" {
        (0, false)
    } else {
        (normalize_axis(imp.int(n, "dim", Some(-1))?, rank)?, imp.bool(n, "descending", false)?)
    };
    let k = imp.ty(x).shape[axis].clone();
    let v = imp.push_typed(Op::Sort { axis, k, descending, indices: name == "argsort" }, vec![x], out);
    imp.bind(n, 0, v)
}

/// `movedim.intlist(self, source, destination)`: torch's permutation —
/// the named dims go to their destinations, the others keep their order
/// in the remaining places.
fn movedim(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let norm = |imp: &mut Importer, key: &str| -> R<Vec<usize>> {
        let v = match imp.arg(n, key) {
            Some(Arg::Int(d)) => vec![*d],
            _ => imp.ints(n, key, &[])?,
        };
        v.iter().map(|&d| normalize_axis(d, rank.max(1))).collect()
    };
    let (src, dst) = (norm(imp, "source")?, norm(imp, "destination")?);
    if src.len() != dst.len() {
        return invalid("movedim: source and destination differ in length");
    }
    let mut perm: Vec<Option<usize>> = vec![None; rank];
    for (&s, &d) in src.iter().zip(&dst) {
        if perm[d].replace(s).is_some() {
            return invalid("movedim: a destination repeats");
        }
    }
    let mut rest = (0..rank).filter(|d| !src.contains(d));
    let perm: Vec<usize> = perm.into_iter().map(|p| p.or_else(|| rest.next()).unwrap_or(0)).collect();
    if rank == 0 {
        return imp.bind(n, 0, x);
    }
    imp.emit(n, Op::Permute { perm }, vec![x])?;
    Ok(())
}

/// `atleast_{1,2,3}d(self)` and `.Sequence(tensors)`: each input reshaped
/// to its declared output (torch adds the leading, or for 3-d the
/// surrounding, unit dims).
fn atleast(imp: &mut Importer, n: &Node) -> R<()> {
    let inputs = match imp.arg(n, "tensors") {
        Some(_) => imp.tensors(n, "tensors")?,
        None => vec![imp.tensor(n, "self")?],
    };
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    if names.len() != inputs.len() {
        return invalid("atleast_nd: outputs do not match inputs");
    }
    for (x, name) in inputs.into_iter().zip(&names) {
        let out = imp.type_of(name)?;
        let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![x], out);
        imp.bind_name(name, v);
    }
    Ok(())
}

/// `isreal` (true for every real dtype), `isposinf`/`isneginf` (`x == ±inf`;
/// false for integers and bools).
fn float_test(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let ty = imp.ty(x).clone();
    let out = imp.out_ty(n, 0)?;
    let v = if name == "isreal" || !ty.dtype.is_float() {
        let value = if name == "isreal" { 1.0 } else { 0.0 };
        imp.push_typed(Op::Full { value, dtype: DType::Bool, shape: out.shape.clone() }, vec![], out)
    } else {
        let inf = if name == "isposinf" { f64::INFINITY } else { f64::NEG_INFINITY };
        imp.with_scalar(B::Eq, x, inf)?
    };
    imp.bind(n, 0, v)
}

/// `fft_fftshift(self, dim=None)` / `fft_ifftshift`: a roll by `size / 2`
/// (`-(size / 2)` for the inverse) along each dim (all by default).
fn fftshift(imp: &mut Importer, n: &Node, inverse: bool) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let shape = static_shape(imp, x, "fftshift")?;
    let rank = shape.len();
    let dims = dims_arg(imp, n, rank)?;
    if dims.is_empty() || rank == 0 {
        return imp.bind(n, 0, x);
    }
    let shifts: Vec<i64> = dims.iter().map(|&d| if inverse { -(shape[d] / 2) } else { shape[d] / 2 }).collect();
    let dims = dims.iter().map(|&d| d as i64).collect();
    let inputs = vec![named("self", temp(imp, x)), named("shifts", Arg::Ints(shifts)), named("dims", Arg::Ints(dims))];
    rewrite(imp, n, "roll.default", inputs)
}

/// `diagflat(self, offset=0)`: the flattened input on a matrix's diagonal.
fn diagflat(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let v = flat(imp, x)?;
    let offset = imp.int(n, "offset", Some(0))?;
    let inputs = vec![named("self", temp(imp, v)), named("diagonal", Arg::Int(offset))];
    rewrite(imp, n, "diag.default", inputs)
}

/// `take(self, index)`: the flattened input indexed (negative indices
/// count from the end; out of range fails the run).
fn take(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let v = flat(imp, x)?;
    let index = imp.tensor(n, "index")?;
    imp.emit(n, Op::Gather { axis: 0 }, vec![v, index])?;
    Ok(())
}

/// `put(self, index, source, accumulate=False)`: `source` written into (or
/// added to) the flattened input at `index`, reshaped back.
fn put(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let ty = imp.ty(x).clone();
    let v = flat(imp, x)?;
    let index = imp.tensor(n, "index")?;
    let index = flat(imp, index)?;
    let source = imp.tensor(n, "source")?;
    let source = imp.cast(source, ty.dtype);
    let source = flat(imp, source)?;
    let accumulate = imp.bool(n, "accumulate", false)?;
    let written = imp.push(Op::IndexPut { axis: 0, accumulate }, vec![v, source, index])?;
    let v = imp.push_typed(Op::Reshape { shape: ty.shape.clone() }, vec![written], ty);
    imp.bind(n, 0, v)
}

/// `special_xlog1py(self, other)` (and its scalar overloads): `x·log1p(y)`,
/// 0 where `x == 0`, NaN where `y` is NaN (torch's reference).
fn xlog1py(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let (x, y) = (float_in(imp, n, "self", c)?, float_in(imp, n, "other", c)?);
    let l = un(imp, U::Log1p, y)?;
    let prod = bin(imp, B::Mul, x, l)?;
    let zero_x = imp.with_scalar(B::Eq, x, 0.0)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), c);
    let v = imp.push(Op::Where, vec![zero_x, zero, prod])?;
    let nan_y = bin(imp, B::Ne, y, y)?;
    let nan = imp.scalar_const(Scalar::Float(f64::NAN), c);
    let v = imp.push(Op::Where, vec![nan_y, nan, v])?;
    finish(imp, n, 0, v)
}

/// `resize_(self, size)` / `resize_as_(self, the_template)` (and Core
/// ATen's `resize`): the first `numel` elements of the input in the new
/// shape. Growing leaves torch's new elements uninitialised: refused.
fn resize(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let (Some(have), Some(want)) = (imp.ty(x).numel().as_const(), out.numel().as_const()) else {
        return unsupported("resize with a dynamic size");
    };
    if want > have {
        return unsupported(format!(
            "resize from {have} to {want} elements: torch leaves the new elements uninitialised"
        ));
    }
    let v = flat(imp, x)?;
    let v = imp.push(Op::Slice { axis: 0, start: 0, end: want, step: 1 }, vec![v])?;
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `_safe_softmax(self, dim, dtype=None)`: softmax, with rows that are all
/// `-inf` giving zeros instead of NaN.
fn safe_softmax(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let rank = out.rank();
    if rank == 0 {
        return rewrite(imp, n, "_softmax.default", with_args(n, vec![named("half_to_float", Arg::Bool(false))]));
    }
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let xc = imp.cast(x, out.dtype);
    let soft = imp.push(Op::Softmax { axis }, vec![xc])?;
    let minus_inf = imp.with_scalar(B::Eq, x, f64::NEG_INFINITY)?;
    let all = imp.push(Op::Reduce { kind: ReduceKind::Min, axes: vec![axis], keep_dims: true }, vec![minus_inf])?;
    let zero = imp.scalar_const(Scalar::Float(0.0), out.dtype);
    let v = imp.push(Op::Where, vec![all, zero, soft])?;
    imp.bind(n, 0, v)
}

/// `_chunk_cat(tensors, dim, num_chunks)`: each tensor zero-padded along
/// `dim` to a multiple of `num_chunks`, viewed as `[.., num_chunks, -1]`,
/// and the views concatenated along `dim + 1` (torch's decomposition).
fn chunk_cat(imp: &mut Importer, n: &Node) -> R<()> {
    let tensors = imp.tensors(n, "tensors")?;
    let chunks = imp.int(n, "num_chunks", None)?;
    if chunks < 1 {
        return invalid("_chunk_cat: num_chunks must be positive");
    }
    let first = tensors.first().copied().ok_or_else(|| Fail::Invalid("_chunk_cat of no tensors".into()))?;
    let dim = normalize_axis(imp.int(n, "dim", None)?, imp.ty(first).rank())?;
    let mut pieces = Vec::with_capacity(tensors.len());
    for t in tensors {
        let shape = static_shape(imp, t, "_chunk_cat")?;
        if shape.len() <= dim {
            return invalid("_chunk_cat: tensors of different ranks");
        }
        let size = shape[dim];
        let padded = (size + chunks - 1) / chunks * chunks;
        let mut v = t;
        if padded != size {
            let mut pads = vec![0i64; 2 * shape.len()];
            pads[2 * dim + 1] = padded - size;
            let pad_ty = {
                let mut s: Vec<Dim> = shape.iter().map(|&d| Dim::Const(d)).collect();
                s[dim] = Dim::Const(padded);
                TensorType::new(imp.ty(t).dtype, s)
            };
            let (lo, hi): (Vec<i64>, Vec<i64>) = (0..shape.len()).map(|d| (pads[2 * d], pads[2 * d + 1])).unzip();
            let interior = vec![0; lo.len()];
            v = imp.push_typed(
                Op::Pad { lo, hi, interior, mode: kiln_ir::PadMode::Constant, value: 0.0 },
                vec![v],
                pad_ty,
            );
        }
        let mut view: Vec<Dim> = shape[..dim].iter().map(|&d| Dim::Const(d)).collect();
        let rest: i64 = shape[dim + 1..].iter().product::<i64>() * (padded / chunks);
        view.extend([Dim::Const(chunks), Dim::Const(rest)]);
        pieces.push(reshape(imp, v, view)?);
    }
    imp.emit(n, Op::Concat { axis: dim + 1 }, pieces)?;
    Ok(())
}

/// `linspace`/`logspace` (every overload; start and end may be 0-d
/// tensors) as torch's CPU kernel computes them: `step = (end - start) /
/// (steps - 1)` in the output dtype (f64 for integers), the first half
/// counted up from start and the second down from end; logspace raises
/// `base` (f64) to those exponents. One step is `start`.
fn spaced(imp: &mut Importer, n: &Node, log: bool) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let steps = imp.int(n, "steps", None)?;
    if steps < 0 {
        return invalid("linspace with a negative number of steps");
    }
    if steps == 0 {
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let c = if out.dtype.is_float() { out.dtype } else { DType::F64 };
    // Converted to the output dtype first (`Scalar::to<scalar_t>`), then to the step type.
    let bound = |imp: &mut Importer, key: &str| -> R<ValueId> {
        let v = match imp.arg(n, key) {
            Some(Arg::Tensor(_)) => {
                let t = imp.tensor(n, key)?;
                reshape(imp, t, vec![])?
            }
            _ => {
                let s = imp.scalar(n, key)?;
                imp.scalar_const(s, if log { c } else { out.dtype })
            }
        };
        let v = if log { v } else { imp.cast(v, out.dtype) };
        Ok(imp.cast(v, c))
    };
    let (start, end) = (bound(imp, "start")?, bound(imp, "end")?);
    let values = if steps == 1 {
        reshape(imp, start, vec![Dim::Const(1)])?
    } else {
        let span = bin(imp, B::Sub, end, start)?;
        let step = imp.with_scalar(B::Div, span, (steps - 1) as f64)?;
        let idx = arange(imp, steps, c);
        let up = bin(imp, B::Mul, step, idx)?;
        let up = bin(imp, B::Add, start, up)?;
        let last = imp.scalar_const(Scalar::Float((steps - 1) as f64), c);
        let back = bin(imp, B::Sub, last, idx)?;
        let down = bin(imp, B::Mul, step, back)?;
        let down = bin(imp, B::Sub, end, down)?;
        let first_half = imp.with_scalar(B::Lt, idx, (steps / 2) as f64)?;
        imp.push(Op::Where, vec![first_half, up, down])?
    };
    let values = if log {
        let base = imp.float(n, "base", Some(10.0))?;
        let e = imp.cast(values, DType::F64);
        let b = imp.scalar_const(Scalar::Float(base), DType::F64);
        bin(imp, B::Pow, b, e)?
    } else {
        values
    };
    let v = imp.cast(values, out.dtype);
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `linalg_multi_dot(tensors)`: the chained product, left to right; a
/// 1-d first (last) operand is a row (column) vector, dropped again.
fn multi_dot(imp: &mut Importer, n: &Node) -> R<()> {
    let ts = imp.tensors(n, "tensors")?;
    if ts.len() < 2 {
        return invalid("multi_dot needs at least two tensors");
    }
    let out = imp.out_ty(n, 0)?;
    let last = ts.len() - 1;
    let mut acc: Option<ValueId> = None;
    for (i, t) in ts.into_iter().enumerate() {
        let t = imp.cast(t, out.dtype);
        let ty = imp.ty(t).clone();
        let t = match (ty.rank(), i) {
            (1, 0) => reshape(imp, t, vec![Dim::Const(1), ty.shape[0].clone()])?,
            (1, i) if i == last => reshape(imp, t, vec![ty.shape[0].clone(), Dim::Const(1)])?,
            (2, _) => t,
            (r, _) => return invalid(format!("multi_dot: operand {i} is {r}-d")),
        };
        acc = Some(match acc {
            None => t,
            Some(a) => imp.push(Op::MatMul, vec![a, t])?,
        });
    }
    let v = acc.expect("two operands at least");
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `isin(elements, test_elements, *, assume_unique=False, invert=False)`
/// (tensor or scalar on either side): each element compared with every
/// test element (torch's decomposition for small test sets).
fn isin(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let side = |imp: &mut Importer, key: &str, other: &str| -> R<ValueId> {
        match imp.arg(n, key) {
            Some(Arg::Tensor(_)) => imp.tensor(n, key),
            _ => {
                let s = imp.scalar(n, key)?;
                let dtype = match imp.arg(n, other) {
                    Some(Arg::Tensor(_)) => {
                        let t = imp.tensor(n, other)?;
                        imp.ty(t).dtype
                    }
                    _ => DType::F64,
                };
                Ok(imp.scalar_const(s, dtype))
            }
        }
    };
    let key_e = if imp.arg(n, "elements").is_some() { "elements" } else { "element" };
    let key_t = if imp.arg(n, "test_elements").is_some() { "test_elements" } else { "test_element" };
    let e = side(imp, key_e, key_t)?;
    let t = side(imp, key_t, key_e)?;
    let ety = imp.ty(e).clone();
    let mut shape = ety.shape.clone();
    shape.push(Dim::Const(1));
    let e = reshape(imp, e, shape)?;
    let t = flat(imp, t)?;
    let eq = bin(imp, B::Eq, e, t)?;
    let last = ety.rank();
    let any = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![last], keep_dims: false }, vec![eq])?;
    let v = if imp.bool(n, "invert", false)? { un(imp, U::Not, any)? } else { any };
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `cross(self, other, dim=None)`: `linalg_cross` along `dim`, or along the
/// first dim of size 3 (torch's deprecated default).
fn cross(imp: &mut Importer, n: &Node) -> R<()> {
    let dim = match imp.opt_int(n, "dim")? {
        Some(d) => d,
        None => {
            let out = imp.out_ty(n, 0)?;
            match out.shape.iter().position(|d| d.as_const() == Some(3)) {
                Some(d) => d as i64,
                None => return invalid("cross: no dimension of size 3"),
            }
        }
    };
    rewrite(imp, n, "linalg_cross.default", with_args(n, vec![named("dim", Arg::Int(dim))]))
}

/// `nanmean(self, dim=None, keepdim=False, *, dtype=None)`: the sum of the
/// non-NaN elements over their count (torch's reference).
fn nanmean(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let x = imp.cast(x, out.dtype);
    let rank = imp.ty(x).rank();
    let axes = match dims_arg(imp, n, rank)? {
        d if d.is_empty() => (0..rank).collect(),
        d => d,
    };
    let keep = imp.bool(n, "keepdim", false)?;
    if rank == 0 {
        return imp.bind(n, 0, x);
    }
    let nan = bin(imp, B::Ne, x, x)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), out.dtype);
    let kept = imp.push(Op::Where, vec![nan, zero, x])?;
    let sum = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: axes.clone(), keep_dims: keep }, vec![kept])?;
    let present = un(imp, U::Not, nan)?;
    let present = imp.cast(present, DType::I64);
    let count = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes, keep_dims: keep }, vec![present])?;
    let count = imp.cast(count, out.dtype);
    let v = bin(imp, B::Div, sum, count)?;
    imp.bind(n, 0, v)
}

/// `linalg_vecdot(x, y, *, dim=-1)`: `sum(x * y, dim)` (the conjugate of
/// a real x is x).
fn vecdot(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "x")?;
    let y = imp.tensor(n, "y")?;
    let (x, y) = (imp.cast(x, out.dtype), imp.cast(y, out.dtype));
    let p = bin(imp, B::Mul, x, y)?;
    let rank = imp.ty(p).rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank.max(1))?;
    imp.emit(n, Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: false }, vec![p])?;
    Ok(())
}

/// `as_strided_scatter(self, src, size, stride, storage_offset=None)`:
/// `self` with the strided view (over its flattened storage) replaced by
/// `src`. The view's storage positions are compile-time constants.
fn as_strided_scatter(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let ty = imp.ty(x).clone();
    let src = imp.tensor(n, "src")?;
    let src = imp.cast(src, ty.dtype);
    let size = imp.ints(n, "size", &[])?;
    let stride = imp.ints(n, "stride", &[])?;
    let offset = imp.opt_int(n, "storage_offset")?.unwrap_or(0);
    if size.len() != stride.len() || size.iter().chain(&stride).any(|&v| v < 0) || offset < 0 {
        return invalid("as_strided_scatter: bad size/stride/offset");
    }
    let numel = static_shape(imp, x, "as_strided_scatter")?.iter().product::<i64>();
    let count: i64 = size.iter().product();
    if count > 1 << 24 {
        return unsupported("as_strided_scatter of more than 2^24 elements");
    }
    let mut positions = Vec::with_capacity(count as usize);
    for linear in 0..count {
        let (mut rest, mut at) = (linear, offset);
        for (&s, &st) in size.iter().zip(&stride).rev() {
            at += (rest % s) * st;
            rest /= s;
        }
        if at >= numel {
            return invalid(format!("as_strided_scatter: position {at} outside {numel} elements"));
        }
        positions.push(at);
    }
    let index = super::indexing::i64_const(imp, &[count], &positions);
    let v = flat(imp, x)?;
    let src = flat(imp, src)?;
    let written = imp.push(Op::IndexPut { axis: 0, accumulate: false }, vec![v, src, index])?;
    let out = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![written], out);
    imp.bind(n, 0, v)
}

/// The index tensors of the masked index ops, clamped to `[lo(size),
/// size - 1]` per indexed dim as their decompositions do.
fn clamped_indices(imp: &mut Importer, n: &Node, x: ValueId, negative: bool) -> R<Vec<NamedArg>> {
    let indices = imp.opt_tensors(n, "indices")?;
    let shape = static_shape(imp, x, "a masked index")?;
    let mut args = Vec::with_capacity(indices.len());
    let mut names = Vec::with_capacity(indices.len());
    for (d, idx) in indices.into_iter().enumerate() {
        let Some(idx) = idx else {
            names.push(None);
            continue;
        };
        let size = *shape.get(d).ok_or_else(|| Fail::Invalid("masked index: more indices than dims".into()))?;
        let lo = if negative { -size } else { 0 };
        let v = imp.push(Op::Clamp { min: Some(lo as f64), max: Some((size - 1) as f64) }, vec![idx])?;
        let Arg::Tensor(name) = temp(imp, v) else { unreachable!("temp binds a tensor") };
        names.push(Some(name));
    }
    args.push(named("indices", Arg::OptionalTensors(names)));
    Ok(args)
}

/// `_unsafe_masked_index(self, mask, indices, fill)`: `self[indices]` with
/// the indices clamped into range, `fill` where `mask` is false.
fn masked_index(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dtype = imp.ty(x).dtype;
    let mask = imp.tensor(n, "mask")?;
    let mut inputs = vec![named("self", temp(imp, x))];
    inputs.extend(clamped_indices(imp, n, x, false)?);
    // The gather, converted under a temporary output name, then masked.
    let out = imp.out_ty(n, 0)?;
    let mut m = n.clone();
    m.target = "torch.ops.aten.index.Tensor".into();
    m.inputs = inputs;
    super::indexing::index(imp, &m)?;
    let gathered = match n.outputs.first() {
        Some(Arg::Tensor(name)) => imp.value(name)?,
        _ => return invalid("_unsafe_masked_index without an output"),
    };
    let fill = imp.scalar(n, "fill")?;
    let fill = imp.scalar_const(fill, dtype);
    let v = imp.push_typed(Op::Where, vec![mask, gathered, fill], out);
    imp.bind(n, 0, v)
}

/// `_unsafe_masked_index_put_accumulate(self, mask, indices, values)`:
/// `values` (zero where `mask` is false) added at the clamped indices.
fn masked_index_put(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dtype = imp.ty(x).dtype;
    let mask = imp.tensor(n, "mask")?;
    let values = imp.tensor(n, "values")?;
    let zero = imp.scalar_const(Scalar::Float(0.0), dtype);
    let values = imp.push(Op::Where, vec![mask, values, zero])?;
    let mut inputs = vec![named("self", temp(imp, x)), named("values", temp(imp, values))];
    inputs.extend(clamped_indices(imp, n, x, true)?);
    inputs.push(named("accumulate", Arg::Bool(true)));
    rewrite(imp, n, "index_put.default", inputs)
}

/// `native_dropout_backward(grad_output, mask, scale)`: `grad · mask · scale`.
fn dropout_backward(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let grad = imp.tensor(n, "grad_output")?;
    let grad = imp.cast(grad, out.dtype);
    let mask = imp.tensor(n, "mask")?;
    let mask = imp.cast(mask, out.dtype);
    let scale = imp.float(n, "scale", None)?;
    let scaled = imp.with_scalar(B::Mul, mask, scale)?;
    let v = bin(imp, B::Mul, grad, scaled)?;
    finish(imp, n, 0, v)
}

/// `_softmax_backward_data(grad_output, output, dim, input_dtype)`:
/// `g·y − y·Σ(g·y)`; `_log_softmax_backward_data`: `g − exp(y)·Σg` (torch's
/// decompositions), in the input dtype.
fn softmax_backward(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let g = imp.tensor(n, "grad_output")?;
    let y = imp.tensor(n, "output")?;
    let (g, y) = (imp.cast(g, out.dtype), imp.cast(y, out.dtype));
    let rank = out.rank();
    if rank == 0 {
        // A one-element row: the gradient of softmax (and log_softmax) is 0.
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: vec![] }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let sum = |imp: &mut Importer, v: ValueId| {
        imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: true }, vec![v])
    };
    let v = if name == "_softmax_backward_data" {
        let gy = bin(imp, B::Mul, g, y)?;
        let s = sum(imp, gy)?;
        let ys = bin(imp, B::Mul, y, s)?;
        bin(imp, B::Sub, gy, ys)?
    } else {
        let s = sum(imp, g)?;
        let e = un(imp, U::Exp, y)?;
        let es = bin(imp, B::Mul, e, s)?;
        bin(imp, B::Sub, g, es)?
    };
    imp.bind(n, 0, v)
}

/// `max_unpool{2,3}d(self, indices, output_size, ...)`: zeros of the output
/// with each value written at its index within its `(n, c)` plane (torch's
/// decomposition: the indices offset by the plane number, one flat
/// `index_put`). An index outside its plane fails the run, as torch raises.
fn max_unpool(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let indices = imp.tensor(n, "indices")?;
    let out = imp.out_ty(n, 0)?;
    let size = imp.ints(n, "output_size", &[])?;
    let Some(out_shape) = out.static_shape() else {
        return unsupported("max_unpool with a dynamic size");
    };
    if size.is_empty() || size.len() > out_shape.len() {
        return invalid("max_unpool: bad output_size");
    }
    let plane: i64 = size.iter().product();
    let lead = &out_shape[..out_shape.len() - size.len()];
    let planes: i64 = lead.iter().product();
    let idx_ty = imp.ty(indices).clone();
    let indices = imp.cast(indices, DType::I64);
    // Each index must fall inside its plane.
    let low = imp.with_scalar(B::Ge, indices, 0.0)?;
    let high = imp.with_scalar(B::Lt, indices, plane as f64)?;
    let inside = bin(imp, B::And, low, high)?;
    let loc = imp.loc();
    let message = format!("max_unpool: an index is outside its output plane of {plane} elements");
    imp.g.add_node(Op::Assert { message }, vec![inside], Vec::new(), loc);
    let offsets = arange(imp, planes, DType::I64);
    let offsets = imp.with_scalar(B::Mul, offsets, plane as f64)?;
    let mut oshape: Vec<Dim> = lead.iter().map(|&d| Dim::Const(d)).collect();
    oshape.extend(std::iter::repeat_n(Dim::Const(1), idx_ty.rank().saturating_sub(lead.len())));
    let offsets = reshape(imp, offsets, oshape)?;
    let flat_idx = bin(imp, B::Add, indices, offsets)?;
    let flat_idx = flat(imp, flat_idx)?;
    let values = imp.cast(x, out.dtype);
    let values = flat(imp, values)?;
    let total: i64 = out_shape.iter().product();
    let zeros = imp.push_typed(
        Op::Full { value: 0.0, dtype: out.dtype, shape: vec![Dim::Const(total)] },
        vec![],
        TensorType::new(out.dtype, vec![Dim::Const(total)]),
    );
    let written = imp.push(Op::IndexPut { axis: 0, accumulate: false }, vec![zeros, values, flat_idx])?;
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![written], out);
    imp.bind(n, 0, v)
}

/// `adaptive_max_pool{1,2,3}d(self, output_size) -> (values, indices)`:
/// output position `o` of a dim of size `I` pooled to `O` covers inputs
/// `floor(o·I/O) .. ceil((o+1)·I/O)`. Every output's window is gathered
/// from the flattened plane (a constant table of plane positions, row-major
/// within the window; a short window repeats its last position, which
/// changes neither the max nor the first position holding it), then a max
/// and, for the indices output, the first arg-max mapped back through the
/// table — torch's index within the plane.
fn adaptive_max_pool(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let shape = static_shape(imp, x, name)?;
    let size = imp.ints(n, "output_size", &[])?;
    if size.is_empty() || size.len() > shape.len() {
        return invalid(format!("{name}: output_size {size:?} for shape {shape:?}"));
    }
    let lead = shape.len() - size.len();
    let spatial = &shape[lead..];
    let mut bounds: Vec<Vec<(i64, i64)>> = Vec::with_capacity(size.len());
    for (&i, &o) in spatial.iter().zip(&size) {
        if o <= 0 || i <= 0 {
            return invalid(format!("{name}: pooling {i} positions to {o}"));
        }
        // Before the window table below: its bounds are listed per output.
        if o > 1 << 24 {
            return unsupported(format!("{name} with windows of more than 2^24 positions in all"));
        }
        bounds.push((0..o).map(|p| (p * i / o, ((p + 1) * i + o - 1) / o)).collect());
    }
    let windows: Vec<i64> = bounds.iter().map(|b| b.iter().map(|(s, e)| e - s).max().unwrap_or(1)).collect();
    let outputs: i64 = size.iter().product();
    let per_window: i64 = windows.iter().product();
    if outputs.saturating_mul(per_window) > 1 << 24 {
        return unsupported(format!("{name} with windows of more than 2^24 positions in all"));
    }
    let strides: Vec<i64> = (0..spatial.len()).map(|d| spatial[d + 1..].iter().product()).collect();
    let mut table = Vec::with_capacity((outputs * per_window) as usize);
    for o in 0..outputs {
        let mut rest = o;
        let mut at = vec![0i64; size.len()];
        for d in (0..size.len()).rev() {
            at[d] = rest % size[d];
            rest /= size[d];
        }
        for w in 0..per_window {
            let (mut rest, mut pos) = (w, 0);
            for d in (0..size.len()).rev() {
                let j = rest % windows[d];
                rest /= windows[d];
                let (s, e) = bounds[d][at[d] as usize];
                pos += (s + j).min(e - 1) * strides[d];
            }
            table.push(pos);
        }
    }
    let plane: i64 = spatial.iter().product();
    let mut flat_shape: Vec<Dim> = shape[..lead].iter().map(|&d| Dim::Const(d)).collect();
    flat_shape.push(Dim::Const(plane));
    let xf = reshape(imp, x, flat_shape)?;
    let index = super::indexing::i64_const(imp, &[outputs * per_window], &table);
    let gathered = imp.push(Op::Gather { axis: lead }, vec![xf, index])?;
    let mut split: Vec<Dim> = shape[..lead].iter().map(|&d| Dim::Const(d)).collect();
    split.extend([Dim::Const(outputs), Dim::Const(per_window)]);
    let windows_v = reshape(imp, gathered, split)?;
    let values =
        imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![lead + 1], keep_dims: false }, vec![windows_v])?;
    let out = imp.out_ty(n, 0)?;
    let values = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![values], out);
    imp.bind(n, 0, values)?;
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    if names.get(1).is_some_and(|o| imp.is_used(o)) {
        let slot = imp.push(Op::ArgMax { axis: lead + 1, keep_dims: false }, vec![windows_v])?;
        let base = arange(imp, outputs, DType::I64);
        let base = imp.with_scalar(B::Mul, base, per_window as f64)?;
        let at = bin(imp, B::Add, slot, base)?;
        let positions = imp.push(Op::Gather { axis: 0 }, vec![index, at])?;
        let ity = imp.out_ty(n, 1)?;
        let positions = imp.cast(positions, ity.dtype);
        let positions = imp.push_typed(Op::Reshape { shape: ity.shape.clone() }, vec![positions], ity);
        imp.bind(n, 1, positions)?;
    }
    Ok(())
}

/// `bilinear(input1, input2, weight, bias=None)`: `y[.., o] = Σᵢⱼ x1[.., i]
/// W[o, i, j] x2[.., j] + b[o]`.
fn bilinear(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x1 = imp.tensor(n, "input1")?;
    let x2 = imp.tensor(n, "input2")?;
    let w = imp.tensor(n, "weight")?;
    let mut y = bilinear_rows(imp, x1, x2, w, out.dtype)?;
    if let Some(bias) = imp.opt_tensor(n, "bias")? {
        let bias = imp.cast(bias, out.dtype);
        y = bin(imp, B::Add, y, bias)?;
    }
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![y], out);
    imp.bind(n, 0, v)
}

/// The bilinear form of `x1` (`[.., I]`), `W` (`[O, I, J]`) and `x2`
/// (`[.., J]`) as `[rows, O]`, contracted as torch's `_trilinear` does —
/// over `I` first (one GEMM of `x1` with `W` laid out `[I, O·J]`), then
/// over `J` (a batched GEMM): the same two roundings in f16/bf16.
fn bilinear_rows(imp: &mut Importer, x1: ValueId, x2: ValueId, w: ValueId, dtype: DType) -> R<ValueId> {
    let wshape = static_shape(imp, w, "bilinear")?;
    let [o, i, j] = wshape[..] else { return invalid("bilinear weight must be 3-d") };
    let (x1, x2, w) = (imp.cast(x1, dtype), imp.cast(x2, dtype), imp.cast(w, dtype));
    let rows = Dim::Const(static_shape(imp, x1, "bilinear")?.iter().product::<i64>() / i.max(1));
    let a = reshape(imp, x1, vec![rows.clone(), Dim::Const(i)])?;
    let wt = imp.push(Op::Permute { perm: vec![1, 0, 2] }, vec![w])?;
    let wt = reshape(imp, wt, vec![Dim::Const(i), Dim::Const(o * j)])?;
    let t = imp.push(Op::MatMul, vec![a, wt])?;
    let t = reshape(imp, t, vec![rows.clone(), Dim::Const(o), Dim::Const(j)])?;
    let b2 = reshape(imp, x2, vec![rows.clone(), Dim::Const(j), Dim::Const(1)])?;
    let y = imp.push(Op::MatMul, vec![t, b2])?;
    reshape(imp, y, vec![rows, Dim::Const(o)])
}

/// `_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1)`:
/// each input unsqueezed at its `expand` dims, the three multiplied (with
/// broadcasting) and summed over `sumdim` (torch's definition).
fn trilinear(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    // `bilinear`'s own call (`i1 [B, I]`, `W [O, I, J]`, `i3 [B, J]`): its two GEMMs.
    let pattern = ["expand1", "expand2", "expand3", "sumdim"].map(|k| imp.ints(n, k, &[]));
    if let [Ok(e1), Ok(e2), Ok(e3), Ok(sd)] = &pattern {
        if (e1.as_slice(), e2.as_slice(), e3.as_slice(), sd.as_slice())
            == (&[1, 3][..], &[0][..], &[1, 2][..], &[2, 3][..])
        {
            let (x1, w, x2) = (imp.tensor(n, "i1")?, imp.tensor(n, "i2")?, imp.tensor(n, "i3")?);
            let y = bilinear_rows(imp, x1, x2, w, out.dtype)?;
            let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![y], out);
            return imp.bind(n, 0, v);
        }
    }
    let mut product: Option<ValueId> = None;
    for (t, e) in [("i1", "expand1"), ("i2", "expand2"), ("i3", "expand3")] {
        let x = imp.tensor(n, t)?;
        let x = imp.cast(x, out.dtype);
        let mut dims = imp.ints(n, e, &[])?;
        dims.sort_unstable();
        let mut shape = imp.ty(x).shape.clone();
        for d in dims {
            let d = usize::try_from(d).map_err(|_| Fail::Invalid(format!("_trilinear: expand dim {d}")))?;
            if d > shape.len() {
                return invalid("_trilinear: expand dim past the rank");
            }
            shape.insert(d, Dim::Const(1));
        }
        let x = reshape(imp, x, shape)?;
        product = Some(match product {
            None => x,
            Some(p) => bin(imp, B::Mul, p, x)?,
        });
    }
    let p = product.expect("three inputs");
    let rank = imp.ty(p).rank();
    let sum: Vec<usize> = imp.ints(n, "sumdim", &[])?.iter().map(|&d| normalize_axis(d, rank)).collect::<R<_>>()?;
    let v = if sum.is_empty() {
        p
    } else {
        imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: sum, keep_dims: false }, vec![p])?
    };
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `mvlgamma(self, p)`: `Σ lgamma(x − i/2)` over `i < p` (added in torch's
/// order, from `x − (p−1)/2` up) plus `p(p−1)/4 · ln π`, in the output
/// dtype; an element not above `(p−1)/2` fails the run, as torch raises.
fn mvlgamma(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "self")?;
    let p = imp.int(n, "p", None)?;
    if !(1..=1 << 16).contains(&p) {
        return invalid(format!("mvlgamma with p={p} (torch needs p >= 1)"));
    }
    let limit = 0.5 * (p - 1) as f64;
    let xd = imp.cast(x, DType::F64);
    let above = imp.with_scalar(B::Gt, xd, limit)?;
    let loc = imp.loc();
    let message = format!("mvlgamma: all elements must be greater than (p-1)/2 = {limit}");
    imp.g.add_node(Op::Assert { message }, vec![above], Vec::new(), loc);
    let x = imp.cast(x, out.dtype);
    let offsets: Vec<f64> = (0..p).map(|i| -0.5 * (p - 1 - i) as f64).collect();
    let mut shape = imp.ty(x).shape.clone();
    shape.push(Dim::Const(1));
    let column = reshape(imp, x, shape)?;
    let steps = arange(imp, p, out.dtype);
    // arange(-(p-1)/2, 1/2, 1/2): i/2 − (p−1)/2 for i < p.
    let halves = imp.with_scalar(B::Mul, steps, 0.5)?;
    let shifted = imp.with_scalar(B::Sub, halves, -offsets[0])?;
    let args = bin(imp, B::Add, column, shifted)?;
    let lg = un(imp, U::Lgamma, args)?;
    let last = imp.ty(lg).rank() - 1;
    let sum = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![last], keep_dims: false }, vec![lg])?;
    let constant = (p * (p - 1)) as f64 * std::f64::consts::PI.ln() * 0.25;
    let v = imp.with_scalar(B::Add, sum, constant)?;
    imp.bind(n, 0, v)
}

/// `trapz`/`trapezoid` (`.x(y, x, dim=-1)`, `.dx(y, dx=1, dim=-1)`) and
/// `cumulative_trapezoid`, as torch's C++: with sample points, `Σ dx·(y₁ +
/// y₀) / 2` (`dx` the differences of `x` along `dim`, a 1-d `x` laid
/// along it); with a spacing, `(Σ y − (y_first + y_last)/2) · dx`; the
/// cumulative forms `cumsum(dx · (y₀ + y₁)) / 2` and `cumsum(dx/2 · (y₀ +
/// y₁))`. No samples give zeros.
fn trapezoid(imp: &mut Importer, n: &Node, cumulative: bool) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let y = imp.tensor(n, "y")?;
    // Integer samples add and subtract in their own (wrapping) dtype, as
    // torch's tensor arithmetic does; sums accumulate in i64; the halving
    // gives the float output.
    let x_dtype = match imp.arg(n, "x") {
        Some(Arg::Tensor(_)) => Some(imp.ty(imp.tensor(n, "x")?).dtype),
        _ => None,
    };
    let y_dtype = imp.ty(y).dtype;
    let math = if y_dtype.is_float() || x_dtype.is_some_and(|d| d.is_float()) || x_dtype.is_some_and(|d| d != y_dtype) {
        out.dtype
    } else {
        y_dtype
    };
    let y = imp.cast(y, math);
    let rank = imp.ty(y).rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank.max(1))?;
    let len = imp.ty(y).shape.get(axis).and_then(Dim::as_const);
    let Some(len) = len else { return unsupported("trapezoid along a dynamic dim") };
    if len == 0 || (cumulative && len == 1) {
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let slice = |imp: &mut Importer, v: ValueId, axis: usize, start: i64, end: i64| {
        imp.push(Op::Slice { axis, start, end, step: 1 }, vec![v])
    };
    let left = slice(imp, y, axis, 0, len - 1)?;
    let right = slice(imp, y, axis, 1, len)?;
    let dx = match imp.arg(n, "x") {
        Some(Arg::Tensor(_)) => {
            let x = imp.tensor(n, "x")?;
            let x = imp.cast(x, math);
            let x = if imp.ty(x).rank() == 1 && rank > 1 {
                let mut shape = vec![Dim::Const(1); rank];
                shape[axis] = imp.ty(x).shape[0].clone();
                reshape(imp, x, shape)?
            } else {
                x
            };
            let xr = imp.ty(x).rank();
            let xa = axis + xr - rank.min(xr);
            let xlen = imp.ty(x).shape.get(xa).and_then(Dim::as_const).unwrap_or(len);
            let (x0, x1) = (slice(imp, x, xa, 0, xlen - 1)?, slice(imp, x, xa, 1, xlen)?);
            Some(bin(imp, B::Sub, x1, x0)?)
        }
        _ => None,
    };
    let step = match imp.arg(n, "dx") {
        Some(_) => imp.float(n, "dx", None)?,
        None => 1.0,
    };
    let widen = if math.is_float() { math } else { DType::I64 };
    let to_out = |imp: &mut Importer, v: ValueId| imp.cast(v, out.dtype);
    let v = if cumulative {
        let sum = bin(imp, B::Add, left, right)?;
        match dx {
            // cumsum(dx · (y₀ + y₁)) / 2 (integers accumulate in i64).
            Some(d) => {
                let area = bin(imp, B::Mul, sum, d)?;
                let area = imp.cast(area, widen);
                let acc = imp.push(Op::CumSum { axis }, vec![area])?;
                let acc = to_out(imp, acc);
                imp.with_scalar(B::Div, acc, 2.0)?
            }
            None => {
                let sum = to_out(imp, sum);
                let area = imp.with_scalar(B::Mul, sum, step / 2.0)?;
                imp.push(Op::CumSum { axis }, vec![area])?
            }
        }
    } else if let Some(d) = dx {
        let sum = bin(imp, B::Add, right, left)?;
        let area = bin(imp, B::Mul, d, sum)?;
        let area = imp.cast(area, widen);
        let total = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: false }, vec![area])?;
        let total = to_out(imp, total);
        imp.with_scalar(B::Div, total, 2.0)?
    } else {
        let wide = imp.cast(y, widen);
        let total = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: false }, vec![wide])?;
        let total = to_out(imp, total);
        let mut dropped = imp.ty(y).shape.clone();
        dropped.remove(axis);
        let first = slice(imp, y, axis, 0, 1)?;
        let first = reshape(imp, first, dropped.clone())?;
        let last = slice(imp, y, axis, len - 1, len)?;
        let last = reshape(imp, last, dropped)?;
        let ends = bin(imp, B::Add, first, last)?;
        let ends = to_out(imp, ends);
        let ends = imp.with_scalar(B::Mul, ends, 0.5)?;
        let inner = bin(imp, B::Sub, total, ends)?;
        imp.with_scalar(B::Mul, inner, step)?
    };
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `linalg_vander(x, *, N=None)`: `[1, x, x², ..]` along a new last dim,
/// as torch's C++: a column of ones and the cumulative product of `x`
/// repeated `N − 1` times.
fn vander(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "x")?;
    let x = imp.cast(x, out.dtype);
    // A 0-d x is one sample.
    let x = if imp.ty(x).rank() == 0 { reshape(imp, x, vec![Dim::Const(1)])? } else { x };
    let Some(cols) = out.shape.last().and_then(Dim::as_const) else {
        return unsupported("vander with a dynamic N");
    };
    if cols < 2 {
        return invalid("vander: N must be greater than 1");
    }
    let mut shape = imp.ty(x).shape.clone();
    shape.push(Dim::Const(1));
    let column = reshape(imp, x, shape.clone())?;
    let axis = shape.len() - 1;
    shape[axis] = Dim::Const(cols - 1);
    let repeated = imp.push(Op::Expand { shape: shape.clone() }, vec![column])?;
    let powers = imp.push(Op::Scan { axis, kind: kiln_ir::ScanKind::Prod }, vec![repeated])?;
    shape[axis] = Dim::Const(1);
    let ty = TensorType::new(out.dtype, shape.clone());
    let ones = imp.push_typed(Op::Full { value: 1.0, dtype: out.dtype, shape }, vec![], ty);
    imp.emit(n, Op::Concat { axis }, vec![ones, powers])?;
    Ok(())
}

/// `renorm(self, p, dim, maxnorm)`: each slice along `dim` whose p-norm
/// exceeds `maxnorm` scaled by `maxnorm / (norm + 1e-7)` (torch's
/// decomposition), in the math dtype (f32 for f16/bf16).
fn renorm(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "self")?;
    let xc = imp.cast(x, compute_dtype(out.dtype));
    let factor = renorm_factor(imp, n, xc)?;
    let v = bin(imp, B::Mul, xc, factor)?;
    finish(imp, n, 0, v)
}

/// `renorm`'s scale for each slice along `dim` of `x` (a complex value's
/// `|z|`): `maxnorm / (norm + 1e-7)` where the slice's p-norm exceeds
/// `maxnorm`, else 1.
pub(super) fn renorm_factor(imp: &mut Importer, n: &Node, x: ValueId) -> R<ValueId> {
    let c = imp.ty(x).dtype;
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", None)?, rank.max(1))?;
    let p = imp.float(n, "p", None)?;
    let maxnorm = imp.float(n, "maxnorm", None)?;
    let others: Vec<usize> = (0..rank).filter(|&d| d != axis).collect();
    let norm = super::composite::p_norm(imp, x, p, others, true)?;
    let over = imp.with_scalar(B::Gt, norm, maxnorm)?;
    let padded = imp.with_scalar(B::Add, norm, 1e-7)?;
    let inverse = un(imp, U::Reciprocal, padded)?;
    let factor = imp.with_scalar(B::Mul, inverse, maxnorm)?;
    let one = imp.scalar_const(Scalar::Float(1.0), c);
    imp.push(Op::Where, vec![over, factor, one])
}

/// The losses of two inputs and a ±1 target (torch's references, in the
/// math dtype — f32 for f16/bf16 — then `reduction`):
/// `cosine_embedding_loss` (1 − cos where t = 1, max(0, cos − margin)
/// where t = −1; squared norms padded by 1e-12), `margin_ranking_loss`
/// (max(0, −t·(x1 − x2) + margin)), `soft_margin_loss` (log1p(exp(−t·x)))
/// and `hinge_embedding_loss` (x where t ≠ −1, plus max(0, margin − x)
/// where t ≠ 1).
fn pair_loss(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let t = float_in(imp, n, "target", c)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), c);
    let loss = match name {
        "cosine_embedding_loss" => {
            let (a, b) = (float_in(imp, n, "input1", c)?, float_in(imp, n, "input2", c)?);
            let axis = imp.ty(a).rank().saturating_sub(1);
            let sum = |imp: &mut Importer, v: ValueId| {
                imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: false }, vec![v])
            };
            let ab = bin(imp, B::Mul, a, b)?;
            let dot = sum(imp, ab)?;
            let aa = bin(imp, B::Mul, a, a)?;
            let aa = sum(imp, aa)?;
            let aa = imp.with_scalar(B::Add, aa, 1e-12)?;
            let bb = bin(imp, B::Mul, b, b)?;
            let bb = sum(imp, bb)?;
            let bb = imp.with_scalar(B::Add, bb, 1e-12)?;
            let mag = bin(imp, B::Mul, aa, bb)?;
            let mag = un(imp, U::Sqrt, mag)?;
            let cos = bin(imp, B::Div, dot, mag)?;
            let one = imp.scalar_const(Scalar::Float(1.0), c);
            let pos = bin(imp, B::Sub, one, cos)?;
            let margin = imp.float(n, "margin", Some(0.0))?;
            let neg = imp.with_scalar(B::Sub, cos, margin)?;
            let neg = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![neg])?;
            let is_pos = imp.with_scalar(B::Eq, t, 1.0)?;
            let is_neg = imp.with_scalar(B::Eq, t, -1.0)?;
            let p = imp.push(Op::Where, vec![is_pos, pos, zero])?;
            let q = imp.push(Op::Where, vec![is_neg, neg, zero])?;
            bin(imp, B::Add, p, q)?
        }
        "margin_ranking_loss" => {
            // `-t·(x1 − x2)` in the inputs' own dtype (integers wrap), then
            // `+ margin` (a Python float: integers become floats).
            let (a, b) = (imp.tensor(n, "input1")?, imp.tensor(n, "input2")?);
            let t = imp.tensor(n, "target")?;
            let d = bin(imp, B::Sub, a, b)?;
            let nt = un(imp, U::Neg, t)?;
            let m = bin(imp, B::Mul, nt, d)?;
            let m = imp.cast(m, c);
            let margin = imp.float(n, "margin", Some(0.0))?;
            let m = imp.with_scalar(B::Add, m, margin)?;
            imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![m])?
        }
        "soft_margin_loss" => {
            let x = float_in(imp, n, "self", c)?;
            let nx = un(imp, U::Neg, x)?;
            let m = bin(imp, B::Mul, nx, t)?;
            let e = un(imp, U::Exp, m)?;
            un(imp, U::Log1p, e)?
        }
        _ => {
            let x = float_in(imp, n, "self", c)?;
            let margin = imp.float(n, "margin", Some(1.0))?;
            let m = imp.scalar_const(Scalar::Float(margin), c);
            let gap = bin(imp, B::Sub, m, x)?;
            let gap = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![gap])?;
            let not_pos = imp.with_scalar(B::Ne, t, 1.0)?;
            let not_neg = imp.with_scalar(B::Ne, t, -1.0)?;
            let p = imp.push(Op::Where, vec![not_pos, gap, zero])?;
            let q = imp.push(Op::Where, vec![not_neg, x, zero])?;
            bin(imp, B::Add, p, q)?
        }
    };
    let v = super::composite::reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `poisson_nll_loss(input, target, log_input, full, eps, reduction)`:
/// `exp(x) − t·x` (log input) or `x − t·log(x + eps)`, plus with `full`
/// Stirling's `t·log t − t + ½·log(2π t)` where `t > 1` (torch's reference).
fn poisson_nll_loss(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "input", c)?;
    let t = float_in(imp, n, "target", c)?;
    let eps = imp.float(n, "eps", Some(1e-8))?;
    let mut loss = if imp.bool(n, "log_input", true)? {
        let tx = bin(imp, B::Mul, t, x)?;
        let e = un(imp, U::Exp, x)?;
        bin(imp, B::Sub, e, tx)?
    } else {
        let xe = imp.with_scalar(B::Add, x, eps)?;
        let l = un(imp, U::Log, xe)?;
        let tl = bin(imp, B::Mul, t, l)?;
        bin(imp, B::Sub, x, tl)?
    };
    if imp.bool(n, "full", false)? {
        let two_pi_t = imp.with_scalar(B::Mul, t, 2.0 * std::f64::consts::PI)?;
        let l = un(imp, U::Log, two_pi_t)?;
        let half = imp.with_scalar(B::Mul, l, 0.5)?;
        let lt = un(imp, U::Log, t)?;
        let tlt = bin(imp, B::Mul, t, lt)?;
        let s = bin(imp, B::Sub, tlt, t)?;
        let stirling = bin(imp, B::Add, s, half)?;
        let small = imp.with_scalar(B::Le, t, 1.0)?;
        let zero = imp.scalar_const(Scalar::Float(0.0), c);
        let stirling = imp.push(Op::Where, vec![small, zero, stirling])?;
        loss = bin(imp, B::Add, loss, stirling)?;
    }
    let v = super::composite::reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `triplet_margin_loss(anchor, positive, negative, margin=1, p=2,
/// eps=1e-6, swap=False, reduction)`: `max(0, margin + d(a, p) − d(a, n))`
/// with `d(u, v) = ‖u − v + eps‖_p` over the last dim and, with `swap`,
/// `d(a, n)` replaced by `min(d(a, n), d(p, n))`.
fn triplet_margin_loss(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    // In the output dtype, as torch's pairwise_distance; integer inputs
    // subtract in their own (wrapping) dtype first.
    let c = out.dtype;
    let (a, p, q) = (imp.tensor(n, "anchor")?, imp.tensor(n, "positive")?, imp.tensor(n, "negative")?);
    let norm_p = imp.float(n, "p", Some(2.0))?;
    let eps = imp.float(n, "eps", Some(1e-6))?;
    let dist = |imp: &mut Importer, u: ValueId, v: ValueId| -> R<ValueId> {
        let d = bin(imp, B::Sub, u, v)?;
        let d = imp.cast(d, c);
        let d = imp.with_scalar(B::Add, d, eps)?;
        let axis = imp.ty(d).rank().saturating_sub(1);
        super::composite::p_norm(imp, d, norm_p, vec![axis], false)
    };
    let d_ap = dist(imp, a, p)?;
    let mut d_an = dist(imp, a, q)?;
    if imp.bool(n, "swap", false)? {
        let d_pn = dist(imp, p, q)?;
        d_an = bin(imp, B::Min, d_an, d_pn)?;
    }
    let margin = imp.float(n, "margin", Some(1.0))?;
    let m = imp.with_scalar(B::Add, d_ap, margin)?;
    let m = bin(imp, B::Sub, m, d_an)?;
    let loss = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![m])?;
    let v = super::composite::reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `gradient(self, *, spacing, dim, edge_order=1)` with uniform spacing
/// (a scalar, or one per dim; the coordinate-tensor overloads are
/// refused): per dim, central differences `(f[i+1] − f[i−1]) / h / 2`
/// inside and one-sided ones at the edges (second order with
/// `edge_order=2`), as torch computes them; one output per dim.
fn gradient(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let shape = static_shape(imp, x, "gradient")?;
    let rank = shape.len();
    let dims = dims_arg(imp, n, rank)?;
    let spacing: Vec<f64> = match imp.arg(n, "spacing") {
        None => vec![1.0; dims.len()],
        Some(Arg::Tensors(_)) => return unsupported("gradient with coordinate tensors as spacing"),
        Some(Arg::Floats(v)) => v.clone(),
        Some(Arg::Ints(v)) => v.iter().map(|&i| i as f64).collect(),
        Some(_) => vec![imp.float(n, "spacing", None)?; dims.len()],
    };
    if spacing.len() != dims.len() {
        return invalid(format!("gradient: {} spacings for {} dims", spacing.len(), dims.len()));
    }
    let order = imp.int(n, "edge_order", Some(1))?;
    if !(1..=2).contains(&order) {
        return invalid(format!("gradient edge_order {order} (1 or 2)"));
    }
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    if names.len() != dims.len() {
        return invalid("gradient: one output per dim");
    }
    for ((&axis, &h), name) in dims.iter().zip(&spacing).zip(&names) {
        let len = shape[axis];
        if len < order + 1 {
            return invalid(format!("gradient along a dim of {len} with edge_order {order}"));
        }
        let out = imp.type_of(name)?;
        let part = |imp: &mut Importer, start: i64, end: i64| -> R<ValueId> {
            let s = imp.push(Op::Slice { axis, start, end, step: 1 }, vec![x])?;
            Ok(imp.cast(s, out.dtype))
        };
        // Integer samples subtract in their own dtype, as torch's slices do.
        let diff = |imp: &mut Importer, (a0, a1): (i64, i64), (b0, b1): (i64, i64)| -> R<ValueId> {
            let a = imp.push(Op::Slice { axis, start: a0, end: a1, step: 1 }, vec![x])?;
            let b = imp.push(Op::Slice { axis, start: b0, end: b1, step: 1 }, vec![x])?;
            let d = bin(imp, B::Sub, a, b)?;
            Ok(imp.cast(d, out.dtype))
        };
        let center = diff(imp, (2, len), (0, len - 2))?;
        let center = imp.with_scalar(B::Div, center, h)?;
        let center = imp.with_scalar(B::Div, center, 2.0)?;
        let (first, last) = if order == 1 {
            (diff(imp, (1, 2), (0, 1))?, diff(imp, (len - 1, len), (len - 2, len - 1))?)
        } else {
            let weighted = |imp: &mut Importer, terms: [(i64, f64); 3]| -> R<ValueId> {
                let mut acc: Option<ValueId> = None;
                for (at, w) in terms {
                    let t = part(imp, at, at + 1)?;
                    let t = imp.with_scalar(B::Mul, t, w)?;
                    acc = Some(match acc {
                        None => t,
                        Some(a) => bin(imp, B::Add, a, t)?,
                    });
                }
                Ok(acc.expect("three terms"))
            };
            (
                weighted(imp, [(0, -1.5), (1, 2.0), (2, -0.5)])?,
                weighted(imp, [(len - 3, 0.5), (len - 2, -2.0), (len - 1, 1.5)])?,
            )
        };
        let first = imp.with_scalar(B::Div, first, h)?;
        let last = imp.with_scalar(B::Div, last, h)?;
        let v = imp.push(Op::Concat { axis }, vec![first, center, last])?;
        let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
        imp.bind_name(name, v);
    }
    Ok(())
}

/// `eye(n, *, dtype=None, ..)` and `eye.m(n, m, ..)`: ones where row equals
/// column, in the declared shape and dtype.
fn eye(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let (Some(rows), Some(cols)) =
        (out.shape.first().and_then(Dim::as_const), out.shape.get(1).and_then(Dim::as_const))
    else {
        return unsupported("eye with a dynamic size");
    };
    let v = super::linalg::eye_matrix(imp, out.dtype, rows, cols)?;
    imp.bind(n, 0, v)
}
