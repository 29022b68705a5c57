//! Ops that raw `torch.export.export()` (training IR) keeps but Core ATen
//! decomposes: aliases, elementwise composites, norms and losses, stacking
//! and rolling. Each becomes a few of kiln's primitives here, the way
//! torch's own decompositions (`torch._decomp`, `torch._refs`) define it, so
//! the numbers match what `run_decompositions()` would have given.
//!
//! Floats compute in the output dtype, f16/bf16 in f32 and rounded once at
//! the end (as torch's CPU kernels do; see `activation::compute_dtype`).

use super::activation::compute_dtype;
use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Fail, Importer, Scalar, R};
use crate::pt2::program::{Arg, NamedArg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, PadMode, ReduceKind, TensorType, UnaryOp as U, ValueId};

/// The `*_copy` form of a view op (see `training_ir::view_copy`).
fn copy(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    super::training_ir::view_copy(imp, n, name, overload)
}

/// Converts `name` if it is one of this module's ops; `Unsupported(None)`
/// otherwise, so the caller reports the op.
pub(super) fn dispatch(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    match (name, overload) {
        // Aliases: the same node under the name kiln converts.
        ("true_divide", _) => redirect(imp, n, "div", overload, &[]),
        ("max", "other") => redirect(imp, n, "maximum", "default", &[]),
        ("min", "other") => redirect(imp, n, "minimum", "default", &[]),
        ("mv", _) => redirect(imp, n, "matmul", "default", &[("vec", "other")]),
        ("broadcast_to", _) => redirect(imp, n, "expand", "default", &[]),
        ("positive", _) => redirect(imp, n, "alias", "default", &[]),
        ("ravel", _) => redirect_with(imp, n, "reshape", &[], vec![named("shape", Arg::Ints(vec![-1]))]),
        ("fliplr", _) => redirect_with(imp, n, "flip", &[], vec![named("dims", Arg::Ints(vec![1]))]),
        ("flipud", _) => redirect_with(imp, n, "flip", &[], vec![named("dims", Arg::Ints(vec![0]))]),
        ("tile", _) => tile(imp, n),
        ("var_mean" | "std_mean", _) => var_mean(imp, n, name, overload),

        ("fmax" | "fmin", _) => fmax_fmin(imp, n, name),
        ("exp2" | "frac" | "deg2rad" | "rad2deg" | "sinc" | "log_sigmoid" | "selu" | "celu" | "logit", _) => {
            float_unary(imp, n, name)
        }
        ("softshrink" | "hardshrink" | "threshold", _) => shrink(imp, n, name),
        ("signbit", _) => signbit_op(imp, n),
        ("copysign" | "hypot" | "logaddexp" | "logaddexp2" | "xlogy" | "heaviside" | "float_power", _) => {
            float_binary(imp, n, name)
        }
        ("nan_to_num", _) => nan_to_num(imp, n),
        ("isfinite", _) => isfinite(imp, n),
        ("isclose", _) => isclose(imp, n),
        ("addcmul" | "addcdiv", _) => addc(imp, n, name),
        ("lerp", _) => lerp(imp, n),
        ("prelu", _) => prelu(imp, n),
        ("glu", _) => glu(imp, n),

        ("logsumexp", _) => logsumexp(imp, n),
        ("linalg_vector_norm", _) => vector_norm(imp, n),
        ("dist", _) => dist(imp, n),
        ("aminmax", _) => aminmax(imp, n),
        ("count_nonzero", _) => count_nonzero(imp, n, overload),
        ("all", _) => all(imp, n, overload),
        ("nansum", _) => nansum(imp, n),
        ("trace", _) => trace(imp, n),

        ("mse_loss" | "l1_loss" | "smooth_l1_loss" | "huber_loss", _) => regression_loss(imp, n, name),
        ("kl_div", _) => kl_div(imp, n),
        ("binary_cross_entropy", _) => binary_cross_entropy(imp, n),
        ("binary_cross_entropy_with_logits", _) => bce_with_logits(imp, n),
        ("cosine_similarity", _) => cosine_similarity(imp, n),
        ("pairwise_distance", _) => pairwise_distance(imp, n),

        ("stack" | "hstack" | "vstack" | "dstack" | "column_stack", _) => stack(imp, n, name),
        ("roll", _) => roll(imp, n),
        ("rot90", _) => rot90(imp, n),
        ("broadcast_tensors", _) => broadcast_tensors(imp, n),
        ("channel_shuffle", _) => channel_shuffle(imp, n),
        ("repeat_interleave", "self_int") => repeat_interleave_int(imp, n),
        ("linalg_cross", _) => linalg_cross(imp, n),
        ("dot" | "inner" | "outer", _) => products(imp, n, name),
        // vdot conjugates its first operand: the identity on real dtypes (complex ones never reach kiln's boundary).
        ("vdot", _) => products(imp, n, "inner"),
        ("addmv" | "baddbmm", _) => add_product(imp, n, name),
        ("tensordot", _) => tensordot(imp, n),
        ("kron", _) => kron(imp, n),
        ("diag", _) => diag(imp, n),
        ("diag_embed", _) => diag_embed(imp, n),
        ("block_diag", _) => block_diag(imp, n),
        ("instance_norm", _) => instance_norm(imp, n),
        ("nll_loss_nd" | "nll_loss", _) => nll_loss(imp, n),
        ("cross_entropy_loss", _) => cross_entropy(imp, n),
        ("empty_permuted", _) => empty_permuted(imp, n),
        ("histc", _) => histc(imp, n),
        ("erfinv" | "special_erfinv", _) => erfinv(imp, n),
        ("searchsorted", _) => searchsorted(imp, n, "sorted_sequence", "self"),
        ("bucketize", _) => searchsorted(imp, n, "boundaries", "self"),

        // More of what training IR keeps (import/ops/training_ir.rs).
        ("alias_copy" | "as_strided_copy" | "diagonal_copy" | "expand_copy", _) => copy(imp, n, name, overload),
        ("narrow_copy" | "permute_copy" | "select_copy" | "slice_copy", _) => copy(imp, n, name, overload),
        ("split_copy" | "split_with_sizes_copy" | "squeeze_copy" | "t_copy", _) => copy(imp, n, name, overload),
        ("transpose_copy" | "unbind_copy" | "unfold_copy" | "unsqueeze_copy", _) => copy(imp, n, name, overload),
        ("view_copy", _) => copy(imp, n, name, overload),
        ("unsafe_chunk", _) => super::training_ir::unsafe_chunk(imp, n),
        ("meshgrid", _) => super::training_ir::meshgrid(imp, n),
        ("cartesian_prod", _) => super::training_ir::cartesian_prod(imp, n),
        ("combinations", _) => super::training_ir::combinations(imp, n),
        ("addr", _) => super::training_ir::addr(imp, n),
        ("addbmm", _) => super::training_ir::addbmm(imp, n),
        ("sum_to_size", _) => super::training_ir::sum_to_size(imp, n),
        ("tril_indices", _) => super::training_ir::tri_indices(imp, n, false),
        ("triu_indices", _) => super::training_ir::tri_indices(imp, n, true),
        ("kthvalue", _) => super::selection::kthvalue(imp, n),
        ("median", _) => super::selection::median(imp, n, overload),
        ("nanmedian", _) => super::selection::nanmedian(imp, n, overload),
        ("mode", _) => super::selection::mode(imp, n),
        ("gcd" | "lcm", _) => super::number::gcd_lcm(imp, n, name),
        ("frexp", _) => super::number::frexp(imp, n),
        ("ldexp", _) => super::number::ldexp(imp, n),
        ("linalg_matrix_exp" | "matrix_exp", _) => super::linalg::matrix_exp(imp, n),
        _ => Err(Fail::Unsupported(None)),
    }
}

// ------------------------------------------------------------------ helpers

fn named(name: &str, arg: Arg) -> NamedArg {
    NamedArg { name: name.to_string(), arg }
}

/// Converts `n` as if it called `aten.<to>.<overload>`, with arguments
/// renamed by `rename` (from, to).
fn redirect(imp: &mut Importer, n: &Node, to: &str, overload: &str, rename: &[(&str, &str)]) -> R<()> {
    let mut m = n.clone();
    for a in &mut m.inputs {
        if let Some((_, new)) = rename.iter().find(|(old, _)| *old == a.name) {
            a.name = new.to_string();
        }
    }
    m.target = format!("torch.ops.aten.{to}.{overload}");
    super::dispatch(imp, &m, to, overload)
}

/// [`redirect`] to the default overload with extra arguments.
fn redirect_with(imp: &mut Importer, n: &Node, to: &str, rename: &[(&str, &str)], extra: Vec<NamedArg>) -> R<()> {
    let mut m = n.clone();
    m.inputs.retain(|a| !extra.iter().any(|e| e.name == a.name));
    m.inputs.extend(extra);
    redirect(imp, &m, to, "default", rename)
}

pub(super) fn un(imp: &mut Importer, op: U, x: ValueId) -> R<ValueId> {
    imp.push(Op::Unary(op), vec![x])
}

pub(super) fn bin(imp: &mut Importer, op: B, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.push(Op::Binary(op), vec![a, b])
}

fn sc(imp: &mut Importer, v: f64, dtype: DType) -> ValueId {
    imp.scalar_const(Scalar::Float(v), dtype)
}

fn select(imp: &mut Importer, cond: ValueId, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.push(Op::Where, vec![cond, a, b])
}

pub(super) fn reduce(
    imp: &mut Importer,
    x: ValueId,
    kind: ReduceKind,
    axes: Vec<usize>,
    keep_dims: bool,
) -> R<ValueId> {
    if imp.ty(x).rank() == 0 {
        return Ok(x);
    }
    imp.push(Op::Reduce { kind, axes, keep_dims }, vec![x])
}

pub(super) fn reshape(imp: &mut Importer, x: ValueId, shape: Vec<Dim>) -> R<ValueId> {
    imp.push(Op::Reshape { shape }, vec![x])
}

fn shape_of(imp: &Importer, v: ValueId) -> Vec<Dim> {
    imp.ty(v).shape.clone()
}

/// `x` with a size-1 axis inserted at `axis`.
fn unsqueeze(imp: &mut Importer, x: ValueId, axis: usize) -> R<ValueId> {
    let mut shape = shape_of(imp, x);
    shape.insert(axis.min(shape.len()), Dim::Const(1));
    reshape(imp, x, shape)
}

fn slice(imp: &mut Importer, x: ValueId, axis: usize, start: i64, end: i64) -> R<ValueId> {
    imp.push(Op::Slice { axis, start, end, step: 1 }, vec![x])
}

/// The static size of `x`'s `axis`, for ops whose decomposition depends on it.
fn static_dim(imp: &Importer, x: ValueId, axis: usize, what: &str) -> R<i64> {
    match imp.ty(x).shape.get(axis).and_then(Dim::as_const) {
        Some(d) => Ok(d),
        None => unsupported(format!("{what} along a symbolic dimension")),
    }
}

/// The reduced axes of an optional `dim` list (all when absent or empty).
pub(super) fn axes_of(imp: &mut Importer, n: &Node, key: &str, rank: usize) -> R<Vec<usize>> {
    let dims = match imp.arg(n, key) {
        None => Vec::new(),
        Some(Arg::Int(d)) => vec![*d],
        Some(_) => imp.ints(n, key, &[])?,
    };
    let mut axes = if dims.is_empty() {
        (0..rank).collect::<Vec<_>>()
    } else {
        dims.iter().map(|&d| normalize_axis(d, rank.max(1))).collect::<R<Vec<_>>>()?
    };
    axes.sort_unstable();
    axes.dedup();
    axes.retain(|&a| a < rank);
    Ok(axes)
}

/// A float input of `n` cast to the dtype a decomposition computes in.
pub(super) fn float_in(imp: &mut Importer, n: &Node, key: &str, dtype: DType) -> R<ValueId> {
    let x = match imp.arg(n, key) {
        Some(Arg::Tensor(t)) => imp.value(t)?,
        Some(_) => {
            let s = imp.scalar(n, key)?;
            imp.scalar_const(s, dtype)
        }
        None => return invalid(format!("required argument `{key}` is missing")),
    };
    Ok(imp.cast(x, dtype))
}

/// Casts `v` to the declared type of output `index` and binds it, expanding
/// a result that broadcasting left narrower than declared.
pub(super) fn finish(imp: &mut Importer, n: &Node, index: usize, v: ValueId) -> R<()> {
    let out = imp.out_ty(n, index)?;
    let mut v = imp.cast(v, out.dtype);
    if imp.ty(v).shape.len() < out.shape.len() || imp.ty(v).rank() == 0 && out.rank() > 0 {
        v = imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out);
    }
    imp.bind(n, index, v)
}

fn is_nan(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    bin(imp, B::Ne, x, x)
}

/// The `reduction` argument of the losses: 0 none, 1 mean, 2 sum.
pub(super) fn reduction(imp: &mut Importer, n: &Node, loss: ValueId) -> R<ValueId> {
    let rank = imp.ty(loss).rank();
    match imp.int(n, "reduction", Some(1))? {
        0 => Ok(loss),
        1 => reduce(imp, loss, ReduceKind::Mean, (0..rank).collect(), false),
        2 => reduce(imp, loss, ReduceKind::Sum, (0..rank).collect(), false),
        r => invalid(format!("reduction {r} (expected 0, 1 or 2)")),
    }
}

// ------------------------------------------------------------- aliases etc.

/// `aten::tile(Tensor self, SymInt[] dims)`: `repeat` with `dims` padded
/// with leading ones to the input's rank.
fn tile(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let mut dims = imp.ints(n, "dims", &[])?;
    while dims.len() < rank {
        dims.insert(0, 1);
    }
    redirect_with(imp, n, "repeat", &[], vec![named("repeats", Arg::Ints(dims))])
}

/// `aten::var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)
/// -> (Tensor, Tensor)` (and `std_mean`, and the `dim` overloads with `unbiased`).
fn var_mean(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let (spread, mean) = match n.outputs.as_slice() {
        [a, b] => (a.clone(), b.clone()),
        _ => return invalid(format!("{name} with {} outputs (expected 2)", n.outputs.len())),
    };
    let mut first = n.clone();
    first.outputs = vec![spread];
    let which = if name == "var_mean" { "var" } else { "std" };
    let overload = if overload == "correction" { "correction" } else { "dim" };
    super::stats::var_std(imp, &first, which, overload)?;
    let mut second = n.clone();
    second.outputs = vec![mean];
    second.inputs.retain(|a| a.name != "correction" && a.name != "unbiased");
    super::elementwise::reduce(imp, &second, "mean", "dim")
}

// ------------------------------------------------------------- elementwise

/// `fmax`/`fmin`: maximum/minimum that return the other operand where one is NaN.
fn fmax_fmin(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let a = float_in(imp, n, "self", out.dtype)?;
    let b = float_in(imp, n, "other", out.dtype)?;
    let m = bin(imp, if name == "fmax" { B::Max } else { B::Min }, a, b)?;
    let v = if out.dtype.is_float() {
        let a_nan = is_nan(imp, a)?;
        let b_nan = is_nan(imp, b)?;
        let keep_a = select(imp, b_nan, a, m)?;
        select(imp, a_nan, b, keep_a)?
    } else {
        m
    };
    finish(imp, n, 0, v)
}

/// One-operand float composites, each as torch's reference defines it.
fn float_unary(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let v = match name {
        "exp2" => {
            let two = sc(imp, 2.0, c);
            bin(imp, B::Pow, two, x)?
        }
        "frac" => {
            let t = un(imp, U::Trunc, x)?;
            bin(imp, B::Sub, x, t)?
        }
        "deg2rad" => imp.with_scalar(B::Mul, x, std::f64::consts::PI / 180.0)?,
        "rad2deg" => imp.with_scalar(B::Mul, x, 180.0 / std::f64::consts::PI)?,
        "sinc" => {
            // sin(πx)/(πx), 1 at 0.
            let px = imp.with_scalar(B::Mul, x, std::f64::consts::PI)?;
            let s = un(imp, U::Sin, px)?;
            let q = bin(imp, B::Div, s, px)?;
            let zero = imp.with_scalar(B::Eq, x, 0.0)?;
            let one = sc(imp, 1.0, c);
            select(imp, zero, one, q)?
        }
        "log_sigmoid" => {
            // min(x, 0) - log1p(exp(-|x|)): no overflow for large |x|.
            let zero = sc(imp, 0.0, c);
            let m = bin(imp, B::Min, x, zero)?;
            let a = un(imp, U::Abs, x)?;
            let na = un(imp, U::Neg, a)?;
            let e = un(imp, U::Exp, na)?;
            let l = un(imp, U::Log1p, e)?;
            bin(imp, B::Sub, m, l)?
        }
        "selu" => {
            const ALPHA: f64 = 1.673_263_242_354_377_3;
            const SCALE: f64 = 1.050_700_987_355_480_5;
            let pos = imp.with_scalar(B::Gt, x, 0.0)?;
            let p = imp.with_scalar(B::Mul, x, SCALE)?;
            let em = un(imp, U::Expm1, x)?;
            let neg = imp.with_scalar(B::Mul, em, ALPHA * SCALE)?;
            select(imp, pos, p, neg)?
        }
        "celu" => {
            let alpha = imp.opt_scalar(n, "alpha")?.map_or(1.0, Scalar::as_f64);
            let pos = imp.with_scalar(B::Gt, x, 0.0)?;
            let xa = imp.with_scalar(B::Div, x, alpha)?;
            let em = un(imp, U::Expm1, xa)?;
            let neg = imp.with_scalar(B::Mul, em, alpha)?;
            select(imp, pos, x, neg)?
        }
        "logit" => {
            let x = match imp.arg(n, "eps") {
                Some(_) => {
                    let eps = imp.float(n, "eps", None)?;
                    imp.push(Op::Clamp { min: Some(eps), max: Some(1.0 - eps) }, vec![x])?
                }
                None => x,
            };
            let one = sc(imp, 1.0, c);
            let d = bin(imp, B::Sub, one, x)?;
            let q = bin(imp, B::Div, x, d)?;
            un(imp, U::Log, q)?
        }
        _ => return Err(Fail::Unsupported(None)),
    };
    finish(imp, n, 0, v)
}

/// `softshrink(x, lambd=0.5)`, `hardshrink(x, lambd=0.5)`, `threshold(x, threshold, value)`.
fn shrink(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let v = match name {
        "threshold" => {
            let th = imp.scalar(n, "threshold")?.as_f64();
            let value = float_in(imp, n, "value", c)?;
            let above = imp.with_scalar(B::Gt, x, th)?;
            select(imp, above, x, value)?
        }
        _ => {
            let l = imp.opt_scalar(n, "lambd")?.map_or(0.5, Scalar::as_f64);
            let zero = sc(imp, 0.0, c);
            let above = imp.with_scalar(B::Gt, x, l)?;
            let below = imp.with_scalar(B::Lt, x, -l)?;
            if name == "hardshrink" {
                let keep = bin(imp, B::Or, above, below)?;
                select(imp, keep, x, zero)?
            } else {
                let down = imp.with_scalar(B::Sub, x, l)?;
                let up = imp.with_scalar(B::Add, x, l)?;
                let inner = select(imp, below, up, zero)?;
                select(imp, above, down, inner)?
            }
        }
    };
    finish(imp, n, 0, v)
}

/// Whether `x`'s sign bit is set: `x < 0`, or `x == 0` with `1/x < 0` (-0.0).
/// (A NaN's sign bit is not visible through arithmetic: NaNs read as clear.)
fn signbit_of(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let neg = imp.with_scalar(B::Lt, x, 0.0)?;
    if !imp.ty(x).dtype.is_float() {
        return Ok(neg);
    }
    let zero = imp.with_scalar(B::Eq, x, 0.0)?;
    let r = un(imp, U::Reciprocal, x)?;
    let rneg = imp.with_scalar(B::Lt, r, 0.0)?;
    let negzero = bin(imp, B::And, zero, rneg)?;
    bin(imp, B::Or, neg, negzero)
}

/// `aten::signbit(Tensor self) -> Tensor`
fn signbit_op(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let v = if imp.ty(x).dtype == DType::Bool || imp.ty(x).dtype == DType::U8 {
        let out = imp.out_ty(n, 0)?;
        imp.push_typed(Op::Full { value: 0.0, dtype: DType::Bool, shape: out.shape.clone() }, vec![], out)
    } else {
        signbit_of(imp, x)?
    };
    finish(imp, n, 0, v)
}

/// Two-operand float composites.
fn float_binary(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let other = if name == "heaviside" { "values" } else { "other" };
    let (a, b) = if name == "float_power" {
        (float_in(imp, n, "self", DType::F64)?, float_in(imp, n, "exponent", DType::F64)?)
    } else {
        (float_in(imp, n, "self", c)?, float_in(imp, n, other, c)?)
    };
    let v = match name {
        "float_power" => bin(imp, B::Pow, a, b)?,
        "copysign" => {
            let mag = un(imp, U::Abs, a)?;
            let neg = signbit_of(imp, b)?;
            let flipped = un(imp, U::Neg, mag)?;
            select(imp, neg, flipped, mag)?
        }
        "hypot" => {
            let aa = bin(imp, B::Mul, a, a)?;
            let bb = bin(imp, B::Mul, b, b)?;
            let s = bin(imp, B::Add, aa, bb)?;
            un(imp, U::Sqrt, s)?
        }
        "logaddexp" | "logaddexp2" => {
            // max + log(1 + base^-(|a - b|)); equal infinities give themselves.
            let m = bin(imp, B::Max, a, b)?;
            let d = bin(imp, B::Sub, a, b)?;
            let ad = un(imp, U::Abs, d)?;
            let nd = un(imp, U::Neg, ad)?;
            let tail = if name == "logaddexp" {
                let e = un(imp, U::Exp, nd)?;
                un(imp, U::Log1p, e)?
            } else {
                let two = sc(imp, 2.0, c);
                let e = bin(imp, B::Pow, two, nd)?;
                let l = un(imp, U::Log1p, e)?;
                imp.with_scalar(B::Div, l, std::f64::consts::LN_2)?
            };
            let sum = bin(imp, B::Add, m, tail)?;
            let same = bin(imp, B::Eq, a, b)?;
            let ma = un(imp, U::Abs, m)?;
            let inf = imp.with_scalar(B::Eq, ma, f64::INFINITY)?;
            let both_inf = bin(imp, B::And, same, inf)?;
            select(imp, both_inf, a, sum)?
        }
        "xlogy" => {
            // NaN where y is NaN, else 0 where x == 0, else x·log(y).
            let l = un(imp, U::Log, b)?;
            let p = bin(imp, B::Mul, a, l)?;
            let zero = sc(imp, 0.0, c);
            let x0 = imp.with_scalar(B::Eq, a, 0.0)?;
            let z = select(imp, x0, zero, p)?;
            let y_nan = is_nan(imp, b)?;
            let nan = sc(imp, f64::NAN, c);
            select(imp, y_nan, nan, z)?
        }
        "heaviside" => {
            let zero = sc(imp, 0.0, c);
            let one = sc(imp, 1.0, c);
            let pos = imp.with_scalar(B::Gt, a, 0.0)?;
            let step = select(imp, pos, one, zero)?;
            let at0 = imp.with_scalar(B::Eq, a, 0.0)?;
            select(imp, at0, b, step)?
        }
        _ => return Err(Fail::Unsupported(None)),
    };
    finish(imp, n, 0, v)
}

/// `aten::nan_to_num(Tensor self, float? nan=None, float? posinf=None, float? neginf=None)`:
/// infinities become the dtype's largest finite values by default.
fn nan_to_num(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dtype = imp.ty(x).dtype;
    if !dtype.is_float() {
        return finish(imp, n, 0, x);
    }
    let largest = match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.389_531_389_251_535_5e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    };
    let nan = imp.float(n, "nan", Some(0.0))?;
    let posinf = imp.float(n, "posinf", Some(largest))?;
    let neginf = imp.float(n, "neginf", Some(-largest))?;
    let is_pos = imp.with_scalar(B::Eq, x, f64::INFINITY)?;
    let is_neg = imp.with_scalar(B::Eq, x, f64::NEG_INFINITY)?;
    let x_nan = is_nan(imp, x)?;
    let (p, m, z) = (sc(imp, posinf, dtype), sc(imp, neginf, dtype), sc(imp, nan, dtype));
    let v = select(imp, is_pos, p, x)?;
    let v = select(imp, is_neg, m, v)?;
    let v = select(imp, x_nan, z, v)?;
    finish(imp, n, 0, v)
}

/// `aten::isfinite(Tensor self)`: `|x| < inf` (false for NaN); true for integers.
fn isfinite(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let v = if imp.ty(x).dtype.is_float() {
        let a = un(imp, U::Abs, x)?;
        imp.with_scalar(B::Lt, a, f64::INFINITY)?
    } else {
        let out = imp.out_ty(n, 0)?;
        imp.push_typed(Op::Full { value: 1.0, dtype: DType::Bool, shape: out.shape.clone() }, vec![], out)
    };
    finish(imp, n, 0, v)
}

/// `aten::isclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, bool equal_nan=False)`,
/// as torch computes it: equal, or a finite error within `atol + |rtol·other|`.
fn isclose(imp: &mut Importer, n: &Node) -> R<()> {
    let a0 = imp.tensor(n, "self")?;
    let dtype = imp.ty(a0).dtype;
    let c = if dtype.is_float() { compute_dtype(dtype) } else { DType::F64 };
    let a = float_in(imp, n, "self", c)?;
    let b = float_in(imp, n, "other", c)?;
    let rtol = imp.float(n, "rtol", Some(1e-5))?;
    let atol = imp.float(n, "atol", Some(1e-8))?;
    let equal_nan = imp.bool(n, "equal_nan", false)?;
    let mut close = bin(imp, B::Eq, a, b)?;
    if equal_nan {
        let an = is_nan(imp, a)?;
        let bn = is_nan(imp, b)?;
        let both = bin(imp, B::And, an, bn)?;
        close = bin(imp, B::Or, close, both)?;
    }
    let d = bin(imp, B::Sub, a, b)?;
    let err = un(imp, U::Abs, d)?;
    let rb = imp.with_scalar(B::Mul, b, rtol)?;
    let arb = un(imp, U::Abs, rb)?;
    let allowed = imp.with_scalar(B::Add, arb, atol)?;
    let within = bin(imp, B::Le, err, allowed)?;
    let finite = imp.with_scalar(B::Lt, err, f64::INFINITY)?;
    let ok = bin(imp, B::And, within, finite)?;
    let v = bin(imp, B::Or, close, ok)?;
    finish(imp, n, 0, v)
}

/// `addcmul(self, tensor1, tensor2, *, value=1)`: self + value·t1·t2; `addcdiv`: self + value·t1/t2.
fn addc(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t1 = float_in(imp, n, "tensor1", c)?;
    let t2 = float_in(imp, n, "tensor2", c)?;
    let value = imp.opt_scalar(n, "value")?.map_or(1.0, Scalar::as_f64);
    let t = if name == "addcmul" {
        let s = if value == 1.0 { t1 } else { imp.with_scalar(B::Mul, t1, value)? };
        bin(imp, B::Mul, s, t2)?
    } else {
        let q = bin(imp, B::Div, t1, t2)?;
        if value == 1.0 {
            q
        } else {
            imp.with_scalar(B::Mul, q, value)?
        }
    };
    let v = bin(imp, B::Add, x, t)?;
    finish(imp, n, 0, v)
}

/// `lerp(self, end, weight)` as torch computes it: from `self` for weights
/// below 0.5, from `end` otherwise (exact at both ends).
fn lerp(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let a = float_in(imp, n, "self", c)?;
    let b = float_in(imp, n, "end", c)?;
    let w = float_in(imp, n, "weight", c)?;
    let d = bin(imp, B::Sub, b, a)?;
    let wd = bin(imp, B::Mul, w, d)?;
    let low = bin(imp, B::Add, a, wd)?;
    let one = sc(imp, 1.0, c);
    let om = bin(imp, B::Sub, one, w)?;
    let dm = bin(imp, B::Mul, d, om)?;
    let high = bin(imp, B::Sub, b, dm)?;
    let small = imp.with_scalar(B::Lt, w, 0.5)?;
    let v = select(imp, small, low, high)?;
    finish(imp, n, 0, v)
}

/// `aten::prelu(Tensor self, Tensor weight)`: weight per channel (axis 1), or one for all.
fn prelu(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let mut w = float_in(imp, n, "weight", c)?;
    let rank = imp.ty(x).rank();
    if rank >= 2 && imp.ty(w).rank() == 1 {
        let mut shape = vec![Dim::Const(1); rank];
        shape[1] = imp.ty(w).shape[0].clone();
        w = reshape(imp, w, shape)?;
    }
    let pos = imp.with_scalar(B::Gt, x, 0.0)?;
    let neg = bin(imp, B::Mul, w, x)?;
    let v = select(imp, pos, x, neg)?;
    finish(imp, n, 0, v)
}

/// `aten::glu(Tensor self, int dim=-1)`: first half · sigmoid(second half).
fn glu(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let rank = imp.ty(x).rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank)?;
    let size = static_dim(imp, x, axis, "glu")?;
    if size % 2 != 0 {
        return invalid(format!("glu: dimension {axis} has odd size {size}"));
    }
    let a = slice(imp, x, axis, 0, size / 2)?;
    let b = slice(imp, x, axis, size / 2, size)?;
    let s = un(imp, U::Sigmoid, b)?;
    let v = bin(imp, B::Mul, a, s)?;
    finish(imp, n, 0, v)
}

// -------------------------------------------------------------- reductions

/// `aten::logsumexp(Tensor self, int[1] dim, bool keepdim=False)`: shifted by
/// the maximum (taken as 0 where it is infinite, as torch does).
fn logsumexp(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let rank = imp.ty(x).rank();
    let axes = axes_of(imp, n, "dim", rank)?;
    let keep = imp.bool(n, "keepdim", false)?;
    let m = reduce(imp, x, ReduceKind::Max, axes.clone(), true)?;
    let am = un(imp, U::Abs, m)?;
    let inf = imp.with_scalar(B::Eq, am, f64::INFINITY)?;
    let zero = sc(imp, 0.0, c);
    let shift = select(imp, inf, zero, m)?;
    let d = bin(imp, B::Sub, x, shift)?;
    let e = un(imp, U::Exp, d)?;
    let s = reduce(imp, e, ReduceKind::Sum, axes.clone(), keep)?;
    let l = un(imp, U::Log, s)?;
    let shift = if keep { shift } else { squeeze_axes(imp, shift, &axes)? };
    let v = bin(imp, B::Add, l, shift)?;
    finish(imp, n, 0, v)
}

/// `x` without the (size-1) `axes`.
pub(super) fn squeeze_axes(imp: &mut Importer, x: ValueId, axes: &[usize]) -> R<ValueId> {
    let shape: Vec<Dim> =
        shape_of(imp, x).into_iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d).collect();
    reshape(imp, x, shape)
}

/// The p-norm of `x` over `axes`: the special orders as torch defines them.
pub(super) fn p_norm(imp: &mut Importer, x: ValueId, ord: f64, axes: Vec<usize>, keep: bool) -> R<ValueId> {
    let c = imp.ty(x).dtype;
    let a = un(imp, U::Abs, x)?;
    if ord == f64::INFINITY {
        return reduce(imp, a, ReduceKind::Max, axes, keep);
    }
    if ord == f64::NEG_INFINITY {
        return reduce(imp, a, ReduceKind::Min, axes, keep);
    }
    if ord == 0.0 {
        let nz = imp.with_scalar(B::Ne, x, 0.0)?;
        let nz = imp.cast(nz, c);
        return reduce(imp, nz, ReduceKind::Sum, axes, keep);
    }
    if ord == 1.0 {
        return reduce(imp, a, ReduceKind::Sum, axes, keep);
    }
    if ord == 2.0 {
        let sq = bin(imp, B::Mul, a, a)?;
        let s = reduce(imp, sq, ReduceKind::Sum, axes, keep)?;
        return un(imp, U::Sqrt, s);
    }
    let p = imp.with_scalar(B::Pow, a, ord)?;
    let s = reduce(imp, p, ReduceKind::Sum, axes, keep)?;
    imp.with_scalar(B::Pow, s, 1.0 / ord)
}

/// `aten::linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)`
pub(super) fn vector_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let rank = imp.ty(x).rank();
    let ord = imp.opt_scalar(n, "ord")?.map_or(2.0, Scalar::as_f64);
    let axes = axes_of(imp, n, "dim", rank)?;
    let keep = imp.bool(n, "keepdim", false)?;
    let v = p_norm(imp, x, ord, axes, keep)?;
    finish(imp, n, 0, v)
}

/// `aten::dist(Tensor self, Tensor other, Scalar p=2)`: the p-norm of the difference.
fn dist(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let a = float_in(imp, n, "self", c)?;
    let b = float_in(imp, n, "other", c)?;
    let d = bin(imp, B::Sub, a, b)?;
    let p = imp.opt_scalar(n, "p")?.map_or(2.0, Scalar::as_f64);
    let rank = imp.ty(d).rank();
    let v = p_norm(imp, d, p, (0..rank).collect(), false)?;
    finish(imp, n, 0, v)
}

/// `aten::aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)`
fn aminmax(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axes = axes_of(imp, n, "dim", rank)?;
    let keep = imp.bool(n, "keepdim", false)?;
    let lo = reduce(imp, x, ReduceKind::Min, axes.clone(), keep)?;
    let hi = reduce(imp, x, ReduceKind::Max, axes, keep)?;
    finish(imp, n, 0, lo)?;
    finish(imp, n, 1, hi)
}

/// `aten::count_nonzero(Tensor self, int? dim=None)` / `.dim_IntList(Tensor self, int[] dim)`: i64 counts.
fn count_nonzero(imp: &mut Importer, n: &Node, _overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axes = axes_of(imp, n, "dim", rank)?;
    let nz = imp.with_scalar(B::Ne, x, 0.0)?;
    let nz = imp.cast(nz, DType::I64);
    let v = reduce(imp, nz, ReduceKind::Sum, axes, false)?;
    finish(imp, n, 0, v)
}

/// `aten::all(Tensor self)`, `all.dim(Tensor self, int dim, bool keepdim=False)`,
/// `all.dims(Tensor self, int[]? dim=None, bool keepdim=False)`: min over bools.
fn all(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axes = if overload == "default" { (0..rank).collect() } else { axes_of(imp, n, "dim", rank)? };
    let keep = imp.bool(n, "keepdim", false)?;
    let b = imp.cast(x, DType::Bool);
    let v = reduce(imp, b, ReduceKind::Min, axes, keep)?;
    finish(imp, n, 0, v)
}

/// `aten::nansum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)`
fn nansum(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = float_in(imp, n, "self", out.dtype)?;
    let rank = imp.ty(x).rank();
    let axes = axes_of(imp, n, "dim", rank)?;
    let keep = imp.bool(n, "keepdim", false)?;
    let x = if out.dtype.is_float() {
        let nan = is_nan(imp, x)?;
        let zero = sc(imp, 0.0, out.dtype);
        select(imp, nan, zero, x)?
    } else {
        x
    };
    let v = reduce(imp, x, ReduceKind::Sum, axes, keep)?;
    finish(imp, n, 0, v)
}

/// `aten::trace(Tensor self)`: the sum of the main diagonal of a matrix.
fn trace(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "self")?;
    if imp.ty(x).rank() != 2 {
        return invalid(format!("trace of a rank-{} tensor (expected a matrix)", imp.ty(x).rank()));
    }
    let shape = shape_of(imp, x);
    let (rows, cols) = (shape[0].clone(), shape[1].clone());
    let len = match (rows.as_const(), cols.as_const()) {
        (Some(r), Some(c)) => Dim::Const(r.min(c)),
        _ if rows == cols => rows,
        _ => return unsupported("trace of a matrix with symbolic, unequal dimensions"),
    };
    let diag_ty = TensorType::new(imp.ty(x).dtype, vec![len]);
    let d = super::diagonal_value(imp, x, 0, 0, 1, &diag_ty)?;
    let d = imp.cast(d, out.dtype);
    let v = reduce(imp, d, ReduceKind::Sum, vec![0], false)?;
    finish(imp, n, 0, v)
}

// ------------------------------------------------------------------ losses

/// `mse_loss`, `l1_loss`, `smooth_l1_loss(…, float beta=1.0)`, `huber_loss(…, float delta=1.0)`
/// over `(self, target, int reduction=Mean)`.
fn regression_loss(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t = float_in(imp, n, "target", c)?;
    let d = bin(imp, B::Sub, x, t)?;
    let loss = match name {
        "mse_loss" => bin(imp, B::Mul, d, d)?,
        "l1_loss" => un(imp, U::Abs, d)?,
        _ => {
            let a = un(imp, U::Abs, d)?;
            let key = if name == "smooth_l1_loss" { "beta" } else { "delta" };
            let k = imp.float(n, key, Some(1.0))?;
            if name == "smooth_l1_loss" && k == 0.0 {
                a
            } else {
                let sq = bin(imp, B::Mul, a, a)?;
                let half = imp.with_scalar(B::Mul, sq, 0.5)?;
                let small = imp.with_scalar(B::Lt, a, k)?;
                let (inner, outer) = if name == "smooth_l1_loss" {
                    (imp.with_scalar(B::Div, half, k)?, imp.with_scalar(B::Sub, a, 0.5 * k)?)
                } else {
                    let lin = imp.with_scalar(B::Sub, a, 0.5 * k)?;
                    (half, imp.with_scalar(B::Mul, lin, k)?)
                };
                select(imp, small, inner, outer)?
            }
        }
    };
    let v = reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `aten::kl_div(Tensor self, Tensor target, int reduction=Mean, *, bool log_target=False)`
fn kl_div(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t = float_in(imp, n, "target", c)?;
    let loss = if imp.bool(n, "log_target", false)? {
        let e = un(imp, U::Exp, t)?;
        let d = bin(imp, B::Sub, t, x)?;
        bin(imp, B::Mul, e, d)?
    } else {
        // xlogy(t, t) - t·x
        let l = un(imp, U::Log, t)?;
        let tl = bin(imp, B::Mul, t, l)?;
        let zero = sc(imp, 0.0, c);
        let t0 = imp.with_scalar(B::Eq, t, 0.0)?;
        let xl = select(imp, t0, zero, tl)?;
        let tx = bin(imp, B::Mul, t, x)?;
        bin(imp, B::Sub, xl, tx)?
    };
    let v = reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `aten::binary_cross_entropy(Tensor self, Tensor target, Tensor? weight=None, int reduction=Mean)`:
/// logs clamped at -100, as torch does.
fn binary_cross_entropy(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t = float_in(imp, n, "target", c)?;
    let lx = un(imp, U::Log, x)?;
    let lx = imp.push(Op::Clamp { min: Some(-100.0), max: None }, vec![lx])?;
    let one = sc(imp, 1.0, c);
    let omx = bin(imp, B::Sub, one, x)?;
    let l1 = un(imp, U::Log, omx)?;
    let l1 = imp.push(Op::Clamp { min: Some(-100.0), max: None }, vec![l1])?;
    // (t - 1)·log(1 - x) - t·log(x)
    let tm = imp.with_scalar(B::Sub, t, 1.0)?;
    let a = bin(imp, B::Mul, tm, l1)?;
    let b = bin(imp, B::Mul, t, lx)?;
    let mut loss = bin(imp, B::Sub, a, b)?;
    if let Some(w) = imp.opt_tensor(n, "weight")? {
        let w = imp.cast(w, c);
        loss = bin(imp, B::Mul, loss, w)?;
    }
    let v = reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `aten::binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? weight=None,
/// Tensor? pos_weight=None, int reduction=Mean)`:
/// `(1 - t)·x + (1 + (pw - 1)·t)·(log1p(exp(-|x|)) + max(-x, 0))`.
fn bce_with_logits(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t = float_in(imp, n, "target", c)?;
    let one = sc(imp, 1.0, c);
    let omt = bin(imp, B::Sub, one, t)?;
    let lin = bin(imp, B::Mul, omt, x)?;
    let ax = un(imp, U::Abs, x)?;
    let nax = un(imp, U::Neg, ax)?;
    let e = un(imp, U::Exp, nax)?;
    let l = un(imp, U::Log1p, e)?;
    let nx = un(imp, U::Neg, x)?;
    let zero = sc(imp, 0.0, c);
    let m = bin(imp, B::Max, nx, zero)?;
    let soft = bin(imp, B::Add, l, m)?;
    let soft = match imp.opt_tensor(n, "pos_weight")? {
        Some(pw) => {
            let pw = imp.cast(pw, c);
            let pm = imp.with_scalar(B::Sub, pw, 1.0)?;
            let pt = bin(imp, B::Mul, pm, t)?;
            let lw = imp.with_scalar(B::Add, pt, 1.0)?;
            bin(imp, B::Mul, lw, soft)?
        }
        None => soft,
    };
    let mut loss = bin(imp, B::Add, lin, soft)?;
    if let Some(w) = imp.opt_tensor(n, "weight")? {
        let w = imp.cast(w, c);
        loss = bin(imp, B::Mul, loss, w)?;
    }
    let v = reduction(imp, n, loss)?;
    finish(imp, n, 0, v)
}

/// `aten::cosine_similarity(Tensor x1, Tensor x2, int dim=1, float eps=1e-08)`:
/// `Σ (x1/max(‖x1‖, eps)) · (x2/max(‖x2‖, eps))`, as ATen computes it.
fn cosine_similarity(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let a = float_in(imp, n, "x1", out.dtype)?;
    let b = float_in(imp, n, "x2", out.dtype)?;
    // Both broadcast to one shape first (torch's expand_outplace).
    let ab = bin(imp, B::Mul, a, b)?;
    let full = TensorType::new(out.dtype, shape_of(imp, ab));
    let a = imp.push_typed(Op::Expand { shape: full.shape.clone() }, vec![a], full.clone());
    let b = imp.push_typed(Op::Expand { shape: full.shape.clone() }, vec![b], full);
    let rank = imp.ty(ab).rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(1))?, rank.max(1))?;
    let eps = imp.float(n, "eps", Some(1e-8))?;
    // Each input over its norm (vector_norm in the math dtype, rounded to
    // the dtype, clamped to eps), then the sum of the products: torch's
    // order of roundings in f16/bf16.
    let c = compute_dtype(out.dtype);
    let mut unit = Vec::with_capacity(2);
    for x in [a, b] {
        let xc = imp.cast(x, c);
        let sq = bin(imp, B::Mul, xc, xc)?;
        let ss = reduce(imp, sq, ReduceKind::Sum, vec![axis], true)?;
        let norm = un(imp, U::Sqrt, ss)?;
        let norm = imp.cast(norm, out.dtype);
        let norm = imp.push(Op::Clamp { min: Some(eps), max: None }, vec![norm])?;
        unit.push(bin(imp, B::Div, x, norm)?);
    }
    let prod = bin(imp, B::Mul, unit[0], unit[1])?;
    let v = reduce(imp, prod, ReduceKind::Sum, vec![axis], false)?;
    finish(imp, n, 0, v)
}

/// `aten::pairwise_distance(Tensor x1, Tensor x2, float p=2, float eps=1e-06, bool keepdim=False)`:
/// the p-norm of `x1 - x2 + eps` over the last axis.
fn pairwise_distance(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let p = imp.float(n, "p", Some(2.0))?;
    let eps = imp.float(n, "eps", Some(1e-6))?;
    let keep = imp.bool(n, "keepdim", false)?;
    // Integers subtract in their own (wrapping) dtype, as torch's `x1 - x2`.
    let (a, b) = (imp.tensor(n, "x1")?, imp.tensor(n, "x2")?);
    let same_int = imp.ty(a).dtype == imp.ty(b).dtype && !imp.ty(a).dtype.is_float();
    let d = if same_int {
        let d = bin(imp, B::Sub, a, b)?;
        imp.cast(d, c)
    } else {
        let (a, b) = (imp.cast(a, c), imp.cast(b, c));
        bin(imp, B::Sub, a, b)?
    };
    let d = imp.with_scalar(B::Add, d, eps)?;
    let rank = imp.ty(d).rank();
    let axes = if rank == 0 { vec![] } else { vec![rank - 1] };
    let v = p_norm(imp, d, p, axes, keep)?;
    finish(imp, n, 0, v)
}

// ------------------------------------------------------------------- shape

/// `stack(Tensor[] tensors, int dim=0)` and the numpy-style `hstack`,
/// `vstack`, `dstack`, `column_stack` (each a `cat` after raising ranks).
fn stack(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let xs = imp.tensors(n, "tensors")?;
    let Some(&first) = xs.first() else {
        return invalid(format!("{name} of an empty tensor list"));
    };
    let out = imp.out_ty(n, 0)?;
    let mut parts = Vec::with_capacity(xs.len());
    let axis = match name {
        "stack" => {
            let rank = imp.ty(first).rank();
            let axis = normalize_axis(imp.int(n, "dim", Some(0))?, rank + 1)?;
            for &x in &xs {
                parts.push(unsqueeze(imp, x, axis)?);
            }
            axis
        }
        "hstack" => {
            for &x in &xs {
                parts.push(at_least(imp, x, 1)?);
            }
            usize::from(imp.ty(parts[0]).rank() > 1)
        }
        "vstack" => {
            for &x in &xs {
                parts.push(at_least(imp, x, 2)?);
            }
            0
        }
        "dstack" => {
            for &x in &xs {
                parts.push(at_least(imp, x, 3)?);
            }
            2
        }
        _ => {
            // column_stack: 0-d and 1-d tensors become columns.
            for &x in &xs {
                let v = match imp.ty(x).rank() {
                    0 => reshape(imp, x, vec![Dim::Const(1), Dim::Const(1)])?,
                    1 => {
                        let len = imp.ty(x).shape[0].clone();
                        reshape(imp, x, vec![len, Dim::Const(1)])?
                    }
                    _ => x,
                };
                parts.push(v);
            }
            1
        }
    };
    let parts = parts.into_iter().map(|p| imp.cast(p, out.dtype)).collect();
    let v = imp.push(Op::Concat { axis }, parts)?;
    finish(imp, n, 0, v)
}

/// numpy's `atleast_{1,2,3}d`: 0-d → [1]…, 1-d `[n]` → `[1, n]`, 2-d `[m, n]` → `[m, n, 1]`.
fn at_least(imp: &mut Importer, x: ValueId, rank: usize) -> R<ValueId> {
    let shape = shape_of(imp, x);
    if shape.len() >= rank {
        return Ok(x);
    }
    let new = match (shape.len(), rank) {
        (0, r) => vec![Dim::Const(1); r],
        (1, 2) => vec![Dim::Const(1), shape[0].clone()],
        (1, 3) => vec![Dim::Const(1), shape[0].clone(), Dim::Const(1)],
        (2, 3) => vec![shape[0].clone(), shape[1].clone(), Dim::Const(1)],
        _ => return invalid(format!("atleast_{rank}d of rank {}", shape.len())),
    };
    reshape(imp, x, new)
}

/// `x` rolled by `shift` along `axis`: the last `shift` elements first.
fn roll_axis(imp: &mut Importer, x: ValueId, shift: i64, axis: usize) -> R<ValueId> {
    let size = static_dim(imp, x, axis, "roll")?;
    if size == 0 {
        return Ok(x);
    }
    let s = shift.rem_euclid(size);
    if s == 0 {
        return Ok(x);
    }
    let tail = slice(imp, x, axis, size - s, size)?;
    let head = slice(imp, x, axis, 0, size - s)?;
    imp.push(Op::Concat { axis }, vec![tail, head])
}

/// `aten::roll(Tensor self, SymInt[1] shifts, int[1] dims=[])`: with no
/// dims, the flattened tensor is rolled.
fn roll(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let shifts = imp.ints(n, "shifts", &[])?;
    let dims = imp.ints(n, "dims", &[])?;
    let shape = shape_of(imp, x);
    let v = if dims.is_empty() {
        let [shift] = shifts[..] else {
            return invalid(format!("roll without dims takes one shift, got {}", shifts.len()));
        };
        let total = shape.iter().fold(Dim::Const(1), |a, d| Dim::mul(a, d.clone()));
        let flat = reshape(imp, x, vec![total])?;
        let r = roll_axis(imp, flat, shift, 0)?;
        reshape(imp, r, shape)?
    } else {
        if shifts.len() != dims.len() {
            return invalid(format!("roll: {} shifts for {} dims", shifts.len(), dims.len()));
        }
        let mut v = x;
        for (&s, &d) in shifts.iter().zip(&dims) {
            let axis = normalize_axis(d, shape.len())?;
            v = roll_axis(imp, v, s, axis)?;
        }
        v
    };
    finish(imp, n, 0, v)
}

/// `x` with axes `a` and `b` swapped.
fn swap(imp: &mut Importer, x: ValueId, a: usize, b: usize) -> R<ValueId> {
    let mut perm: Vec<usize> = (0..imp.ty(x).rank()).collect();
    perm.swap(a, b);
    imp.push(Op::Permute { perm }, vec![x])
}

/// `aten::rot90(Tensor self, int k=1, int[] dims=[0,1])`: flips and a transpose.
fn rot90(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let k = imp.int(n, "k", Some(1))?.rem_euclid(4);
    let dims = imp.ints(n, "dims", &[0, 1])?;
    let [d0, d1] = dims[..] else {
        return invalid(format!("rot90 takes two dims, got {}", dims.len()));
    };
    let (a, b) = (normalize_axis(d0, rank)?, normalize_axis(d1, rank)?);
    if a == b {
        return invalid("rot90: the two dims must differ");
    }
    let v = match k {
        0 => x,
        1 => {
            let f = imp.push(Op::Flip { axes: vec![b] }, vec![x])?;
            swap(imp, f, a, b)?
        }
        2 => {
            let mut axes = vec![a, b];
            axes.sort_unstable();
            imp.push(Op::Flip { axes }, vec![x])?
        }
        _ => {
            let f = imp.push(Op::Flip { axes: vec![a] }, vec![x])?;
            swap(imp, f, a, b)?
        }
    };
    finish(imp, n, 0, v)
}

/// `aten::broadcast_tensors(Tensor[] tensors) -> Tensor[]`: each expanded to the common shape.
fn broadcast_tensors(imp: &mut Importer, n: &Node) -> R<()> {
    let xs = imp.tensors(n, "tensors")?;
    let names: Vec<String> = match n.outputs.as_slice() {
        [Arg::Tensors(names)] => names.clone(),
        outs => outs
            .iter()
            .map(|o| match o {
                Arg::Tensor(t) => Ok(t.clone()),
                other => invalid(format!("broadcast_tensors output {other:?}")),
            })
            .collect::<R<_>>()?,
    };
    if names.len() != xs.len() {
        return invalid(format!("broadcast_tensors: {} inputs, {} outputs", xs.len(), names.len()));
    }
    for (&x, name) in xs.iter().zip(&names) {
        if !imp.is_used(name) {
            continue;
        }
        let ty = imp.type_of(name)?;
        let v = if imp.ty(x).shape == ty.shape {
            x
        } else {
            imp.push_typed(Op::Expand { shape: ty.shape.clone() }, vec![x], ty)
        };
        imp.bind_name(name, v);
    }
    Ok(())
}

/// `aten::channel_shuffle(Tensor self, SymInt groups)`: `[N, g, C/g, …]` transposed to `[N, C/g, g, …]`.
fn channel_shuffle(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let shape = shape_of(imp, x);
    let groups = imp.int(n, "groups", None)?;
    if shape.len() < 3 {
        return invalid(format!("channel_shuffle of rank {} (expected at least 3)", shape.len()));
    }
    let ch = static_dim(imp, x, 1, "channel_shuffle")?;
    if groups <= 0 || ch % groups != 0 {
        return invalid(format!("channel_shuffle: {ch} channels do not split into {groups} groups"));
    }
    let mut split = vec![shape[0].clone(), Dim::Const(groups), Dim::Const(ch / groups)];
    split.extend(shape[2..].iter().cloned());
    let r = reshape(imp, x, split)?;
    let t = swap(imp, r, 1, 2)?;
    let v = reshape(imp, t, shape)?;
    finish(imp, n, 0, v)
}

/// `aten::repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt? output_size=None)`:
/// each element repeated `repeats` times along `dim` (the flattened tensor without one).
fn repeat_interleave_int(imp: &mut Importer, n: &Node) -> R<()> {
    let mut x = imp.tensor(n, "self")?;
    let repeats = imp.int(n, "repeats", None)?;
    if repeats < 0 {
        return invalid(format!("repeat_interleave: negative repeats {repeats}"));
    }
    let axis = match imp.opt_int(n, "dim")? {
        Some(d) => normalize_axis(d, imp.ty(x).rank().max(1))?,
        None => {
            let total = shape_of(imp, x).iter().fold(Dim::Const(1), |a, d| Dim::mul(a, d.clone()));
            x = reshape(imp, x, vec![total])?;
            0
        }
    };
    if imp.ty(x).rank() == 0 {
        x = reshape(imp, x, vec![Dim::Const(1)])?;
    }
    let shape = shape_of(imp, x);
    let u = unsqueeze(imp, x, axis + 1)?;
    let mut wide = shape_of(imp, u);
    wide[axis + 1] = Dim::Const(repeats);
    let ty = TensorType::new(imp.ty(x).dtype, wide.clone());
    let e = imp.push_typed(Op::Expand { shape: wide }, vec![u], ty);
    let mut merged = shape;
    merged[axis] = Dim::mul(merged[axis].clone(), Dim::Const(repeats));
    let v = reshape(imp, e, merged)?;
    finish(imp, n, 0, v)
}

/// `aten::linalg_cross(Tensor self, Tensor other, *, int dim=-1)`: 3-vectors along `dim`.
fn linalg_cross(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let a = float_in(imp, n, "self", out.dtype)?;
    let b = float_in(imp, n, "other", out.dtype)?;
    let rank = out.rank();
    let axis = normalize_axis(imp.int(n, "dim", Some(-1))?, rank)?;
    let full = TensorType::new(out.dtype, out.shape.clone());
    let a = imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![a], full.clone());
    let b = imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![b], full);
    if static_dim(imp, a, axis, "linalg_cross")? != 3 {
        return invalid("linalg_cross: the dimension must have size 3");
    }
    let mut comps = Vec::with_capacity(3);
    for i in 0..3i64 {
        let (j, k) = ((i + 1) % 3, (i + 2) % 3);
        let aj = slice(imp, a, axis, j, j + 1)?;
        let bk = slice(imp, b, axis, k, k + 1)?;
        let ak = slice(imp, a, axis, k, k + 1)?;
        let bj = slice(imp, b, axis, j, j + 1)?;
        let p = bin(imp, B::Mul, aj, bk)?;
        let q = bin(imp, B::Mul, ak, bj)?;
        comps.push(bin(imp, B::Sub, p, q)?);
    }
    let v = imp.push(Op::Concat { axis }, comps)?;
    finish(imp, n, 0, v)
}

/// `dot(self, tensor)`, `inner(self, other)`, `outer(self, vec2)`.
fn products(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let other = match name {
        "dot" => "tensor",
        "outer" => "vec2",
        _ => "other",
    };
    let a = float_in(imp, n, "self", out.dtype)?;
    let b = float_in(imp, n, other, out.dtype)?;
    let v = match name {
        "outer" => {
            let (la, lb) = (shape_of(imp, a), shape_of(imp, b));
            if la.len() != 1 || lb.len() != 1 {
                return invalid("outer takes two vectors");
            }
            let col = reshape(imp, a, vec![la[0].clone(), Dim::Const(1)])?;
            let row = reshape(imp, b, vec![Dim::Const(1), lb[0].clone()])?;
            bin(imp, B::Mul, col, row)?
        }
        _ => {
            let (sa, sb) = (shape_of(imp, a), shape_of(imp, b));
            if sa.is_empty() || sb.is_empty() {
                // inner with a scalar is a product.
                bin(imp, B::Mul, a, b)?
            } else {
                // [A…, K] · [B…, K]ᵀ → [A…, B…]
                let k = sa[sa.len() - 1].clone();
                let rows = sa[..sa.len() - 1].iter().fold(Dim::Const(1), |x, d| Dim::mul(x, d.clone()));
                let cols = sb[..sb.len() - 1].iter().fold(Dim::Const(1), |x, d| Dim::mul(x, d.clone()));
                let a2 = reshape(imp, a, vec![rows, k.clone()])?;
                let b2 = reshape(imp, b, vec![cols, k])?;
                let bt = swap(imp, b2, 0, 1)?;
                let m = imp.push(Op::MatMul, vec![a2, bt])?;
                let mut shape: Vec<Dim> = sa[..sa.len() - 1].to_vec();
                shape.extend(sb[..sb.len() - 1].iter().cloned());
                reshape(imp, m, shape)?
            }
        }
    };
    finish(imp, n, 0, v)
}

/// `addmv(self, mat, vec, *, beta=1, alpha=1)` and `baddbmm(self, batch1, batch2, *, beta=1, alpha=1)`:
/// `beta·self + alpha·(product)`, with `self` ignored (NaNs included) when beta is 0.
fn add_product(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let (k1, k2) = if name == "addmv" { ("mat", "vec") } else { ("batch1", "batch2") };
    let x = float_in(imp, n, "self", c)?;
    let m1 = float_in(imp, n, k1, c)?;
    let m2 = float_in(imp, n, k2, c)?;
    let beta = imp.opt_scalar(n, "beta")?.map_or(1.0, Scalar::as_f64);
    let alpha = imp.opt_scalar(n, "alpha")?.map_or(1.0, Scalar::as_f64);
    let p = if name == "addmv" {
        let len = imp.ty(m2).shape.first().cloned().unwrap_or(Dim::Const(1));
        let col = reshape(imp, m2, vec![len, Dim::Const(1)])?;
        let mm = imp.push(Op::MatMul, vec![m1, col])?;
        let rows = imp.ty(mm).shape[0].clone();
        reshape(imp, mm, vec![rows])?
    } else {
        imp.push(Op::MatMul, vec![m1, m2])?
    };
    let p = if alpha == 1.0 { p } else { imp.with_scalar(B::Mul, p, alpha)? };
    let v = if beta == 0.0 {
        p
    } else {
        let bx = if beta == 1.0 { x } else { imp.with_scalar(B::Mul, x, beta)? };
        bin(imp, B::Add, bx, p)?
    };
    finish(imp, n, 0, v)
}

/// The dtype products compute in: f16/bf16 in f32, integers in f64 (as the
/// importer's matmul does), bools as integers 0/1.
fn product_dtype(d: DType) -> DType {
    if d.is_float() {
        compute_dtype(d)
    } else {
        DType::F64
    }
}

fn product_of(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::Const(1), |a, d| Dim::mul(a, d.clone()))
}

/// `aten::tensordot(Tensor self, Tensor other, int[] dims_self, int[] dims_other)`:
/// both sides permuted to (free, contracted) / (contracted, free) and multiplied as matrices.
fn tensordot(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = product_dtype(out.dtype);
    let a = float_in(imp, n, "self", c)?;
    let b = float_in(imp, n, "other", c)?;
    let (sa, sb) = (shape_of(imp, a), shape_of(imp, b));
    let da = imp.ints(n, "dims_self", &[])?;
    let db = imp.ints(n, "dims_other", &[])?;
    if da.len() != db.len() {
        return invalid(format!("tensordot: {} dims for self, {} for other", da.len(), db.len()));
    }
    let ca = da.iter().map(|&d| normalize_axis(d, sa.len())).collect::<R<Vec<_>>>()?;
    let cb = db.iter().map(|&d| normalize_axis(d, sb.len())).collect::<R<Vec<_>>>()?;
    let fa: Vec<usize> = (0..sa.len()).filter(|i| !ca.contains(i)).collect();
    let fb: Vec<usize> = (0..sb.len()).filter(|i| !cb.contains(i)).collect();
    let pick = |s: &[Dim], ix: &[usize]| ix.iter().map(|&i| s[i].clone()).collect::<Vec<_>>();
    let pa = imp.push(Op::Permute { perm: fa.iter().chain(&ca).copied().collect() }, vec![a])?;
    let pb = imp.push(Op::Permute { perm: cb.iter().chain(&fb).copied().collect() }, vec![b])?;
    let k = product_of(&pick(&sa, &ca));
    let a2 = reshape(imp, pa, vec![product_of(&pick(&sa, &fa)), k.clone()])?;
    let b2 = reshape(imp, pb, vec![k, product_of(&pick(&sb, &fb))])?;
    let m = imp.push(Op::MatMul, vec![a2, b2])?;
    let mut shape = pick(&sa, &fa);
    shape.extend(pick(&sb, &fb));
    let v = reshape(imp, m, shape)?;
    finish(imp, n, 0, v)
}

/// `aten::kron(Tensor self, Tensor other)`: `a` spread as `[a0, 1, a1, 1, …]`
/// times `b` as `[1, b0, 1, b1, …]`, merged pairwise.
fn kron(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let boolean = out.dtype == DType::Bool;
    let c = if boolean { DType::Bool } else { out.dtype };
    let a = float_in(imp, n, "self", c)?;
    let b = float_in(imp, n, "other", c)?;
    let (mut sa, mut sb) = (shape_of(imp, a), shape_of(imp, b));
    let rank = sa.len().max(sb.len());
    while sa.len() < rank {
        sa.insert(0, Dim::Const(1));
    }
    while sb.len() < rank {
        sb.insert(0, Dim::Const(1));
    }
    let spread_a: Vec<Dim> = sa.iter().flat_map(|d| [d.clone(), Dim::Const(1)]).collect();
    let spread_b: Vec<Dim> = sb.iter().flat_map(|d| [Dim::Const(1), d.clone()]).collect();
    let a = reshape(imp, a, spread_a)?;
    let b = reshape(imp, b, spread_b)?;
    let p = bin(imp, if boolean { B::And } else { B::Mul }, a, b)?;
    let merged = sa.iter().zip(&sb).map(|(x, y)| Dim::mul(x.clone(), y.clone())).collect();
    let v = reshape(imp, p, merged)?;
    finish(imp, n, 0, v)
}

/// `[m, m]` booleans, true where `col - row == offset`.
fn diagonal_mask(imp: &mut Importer, m: i64, offset: i64) -> R<ValueId> {
    let len = Dim::Const(m);
    let ty = TensorType::new(DType::I64, vec![len.clone()]);
    let idx = imp.push_typed(Op::Arange { start: 0.0, step: 1.0, len, dtype: DType::I64 }, vec![], ty);
    let rows = reshape(imp, idx, vec![Dim::Const(m), Dim::Const(1)])?;
    let cols = reshape(imp, idx, vec![Dim::Const(1), Dim::Const(m)])?;
    let d = bin(imp, B::Sub, cols, rows)?;
    imp.with_scalar(B::Eq, d, offset as f64)
}

/// Vectors `v` (`[…, n]`) on the `offset` diagonal of `[…, m, m]` matrices, zeros elsewhere.
fn embed_diagonal(imp: &mut Importer, v: ValueId, offset: i64) -> R<ValueId> {
    let shape = shape_of(imp, v);
    let Some(len) = shape.last().and_then(Dim::as_const) else {
        return unsupported("a diagonal of symbolic length");
    };
    let k = offset.unsigned_abs() as i64;
    let m = len + k;
    let rank = shape.len();
    let mut hi = vec![0; rank];
    hi[rank - 1] = k;
    let dtype = imp.ty(v).dtype;
    let padded = imp.push(
        Op::Pad { lo: vec![0; rank], hi, interior: vec![0; rank], mode: PadMode::Constant, value: 0.0 },
        vec![v],
    )?;
    // out[…, r, c] = v[…, r] above the main diagonal, v[…, c] below it.
    let mut wide = shape[..rank - 1].to_vec();
    if offset >= 0 {
        wide.extend([Dim::Const(m), Dim::Const(1)]);
    } else {
        wide.extend([Dim::Const(1), Dim::Const(m)]);
    }
    let vals = reshape(imp, padded, wide)?;
    let mask = diagonal_mask(imp, m, offset)?;
    let zero = sc(imp, 0.0, dtype);
    select(imp, mask, vals, zero)
}

/// `aten::diag(Tensor self, int diagonal=0)`: a vector onto a matrix's diagonal, or a matrix's diagonal.
fn diag(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let offset = imp.int(n, "diagonal", Some(0))?;
    let v = match imp.ty(x).rank() {
        1 => embed_diagonal(imp, x, offset)?,
        2 => {
            let out = imp.out_ty(n, 0)?;
            super::diagonal_value(imp, x, offset, 0, 1, &out)?
        }
        r => return invalid(format!("diag of a rank-{r} tensor (expected 1 or 2)")),
    };
    finish(imp, n, 0, v)
}

/// `aten::diag_embed(Tensor self, int offset=0, int dim1=-2, int dim2=-1)`, for the default
/// `dim1`/`dim2` (the new matrix axes last).
fn diag_embed(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let offset = imp.int(n, "offset", Some(0))?;
    let rank = imp.ty(x).rank() + 1;
    let d1 = normalize_axis(imp.int(n, "dim1", Some(-2))?, rank)?;
    let d2 = normalize_axis(imp.int(n, "dim2", Some(-1))?, rank)?;
    if (d1, d2) != (rank - 2, rank - 1) {
        return unsupported("diag_embed with dim1/dim2 other than the last two axes");
    }
    let v = embed_diagonal(imp, x, offset)?;
    finish(imp, n, 0, v)
}

/// `aten::block_diag(Tensor[] tensors)`: each block padded to the total width, stacked.
fn block_diag(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let xs = imp.tensors(n, "tensors")?;
    let mut blocks = Vec::with_capacity(xs.len());
    for x in xs {
        let x = imp.cast(x, out.dtype);
        let b = match imp.ty(x).rank() {
            0 => reshape(imp, x, vec![Dim::Const(1), Dim::Const(1)])?,
            1 => {
                let len = imp.ty(x).shape[0].clone();
                reshape(imp, x, vec![Dim::Const(1), len])?
            }
            2 => x,
            r => return invalid(format!("block_diag of a rank-{r} tensor")),
        };
        blocks.push((b, static_dim(imp, b, 1, "block_diag")?));
    }
    let total: i64 = blocks.iter().map(|&(_, w)| w).sum();
    let mut rows = Vec::with_capacity(blocks.len());
    let mut col = 0;
    for (b, w) in blocks {
        let pad = Op::Pad {
            lo: vec![0, col],
            hi: vec![0, total - col - w],
            interior: vec![0, 0],
            mode: PadMode::Constant,
            value: 0.0,
        };
        rows.push(imp.push(pad, vec![b])?);
        col += w;
    }
    let v = if rows.is_empty() {
        return invalid("block_diag of no tensors");
    } else {
        imp.push(Op::Concat { axis: 0 }, rows)?
    };
    finish(imp, n, 0, v)
}

/// `[1, C, 1, …]` of rank `rank`, for per-channel operands.
fn per_channel(imp: &mut Importer, v: ValueId, rank: usize) -> R<ValueId> {
    let mut shape = vec![Dim::Const(1); rank.max(2)];
    shape[1] = imp.ty(v).shape.first().cloned().unwrap_or(Dim::Const(1));
    reshape(imp, v, shape)
}

/// `aten::instance_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
/// Tensor? running_var, bool use_input_stats, float momentum, float eps, bool cudnn_enabled)`:
/// each (sample, channel) normalised over its spatial axes (or by the running statistics).
fn instance_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "input", c)?;
    let rank = imp.ty(x).rank();
    if rank < 3 {
        return invalid(format!("instance_norm of rank {rank} (expected at least 3)"));
    }
    let eps = imp.float(n, "eps", Some(1e-5))?;
    let axes: Vec<usize> = (2..rank).collect();
    let has_running = imp.arg(n, "running_mean").is_some() || imp.arg(n, "running_var").is_some();
    let (mean, var) = if imp.bool(n, "use_input_stats", true)? {
        if has_running {
            // torch updates the running statistics in place (Core ATen shows
            // the write): a mutation of the caller's tensors kiln does not make.
            return unsupported(
                "instance_norm with running statistics and use_input_stats=True updates them in place; \
                 kiln refuses programs that write into their inputs",
            );
        }
        let mean = reduce(imp, x, ReduceKind::Mean, axes.clone(), true)?;
        let d = bin(imp, B::Sub, x, mean)?;
        let sq = bin(imp, B::Mul, d, d)?;
        (mean, reduce(imp, sq, ReduceKind::Mean, axes, true)?)
    } else {
        match (imp.opt_tensor(n, "running_mean")?, imp.opt_tensor(n, "running_var")?) {
            (Some(m), Some(v)) => {
                let (m, v) = (imp.cast(m, c), imp.cast(v, c));
                (per_channel(imp, m, rank)?, per_channel(imp, v, rank)?)
            }
            _ => return invalid("instance_norm without input statistics needs running_mean and running_var"),
        }
    };
    let d = bin(imp, B::Sub, x, mean)?;
    let ve = imp.with_scalar(B::Add, var, eps)?;
    let r = un(imp, U::Rsqrt, ve)?;
    let mut y = bin(imp, B::Mul, d, r)?;
    if let Some(w) = imp.opt_tensor(n, "weight")? {
        let w = imp.cast(w, c);
        let w = per_channel(imp, w, rank)?;
        y = bin(imp, B::Mul, y, w)?;
    }
    if let Some(b) = imp.opt_tensor(n, "bias")? {
        let b = imp.cast(b, c);
        let b = per_channel(imp, b, rank)?;
        y = bin(imp, B::Add, y, b)?;
    }
    finish(imp, n, 0, y)
}

/// The negative log-likelihood of class indices `target` under log-probabilities
/// `logp` (`[N, C, …]` or `[C]`), weighted, with `ignore_index` entries
/// contributing nothing; reduced as torch does (mean: by the summed weights).
fn nll_of(imp: &mut Importer, n: &Node, logp: ValueId, target: ValueId) -> R<ValueId> {
    let args = LossArgs::of(imp, n)?;
    nll_with(imp, logp, target, &args)
}

/// The arguments the NLL and cross-entropy losses share: `weight`
/// (per class), `reduction` (0 none, 1 mean, 2 sum) and `ignore_index`.
struct LossArgs {
    weight: Option<ValueId>,
    reduction: i64,
    ignore_index: i64,
}

impl LossArgs {
    /// As ATen's losses name them.
    fn of(imp: &mut Importer, n: &Node) -> R<LossArgs> {
        Ok(LossArgs {
            weight: imp.opt_tensor(n, "weight")?,
            reduction: imp.int(n, "reduction", Some(1))?,
            ignore_index: imp.int(n, "ignore_index", Some(-100))?,
        })
    }
}

/// [`nll_of`] with its arguments given.
fn nll_with(imp: &mut Importer, logp: ValueId, target: ValueId, args: &LossArgs) -> R<ValueId> {
    let c = imp.ty(logp).dtype;
    let rank = imp.ty(logp).rank();
    let axis = usize::from(rank >= 2);
    let ignore = args.ignore_index;
    let target = imp.cast(target, DType::I64);
    let ignored = imp.with_scalar(B::Eq, target, ignore as f64)?;
    let zero_i = imp.scalar_const(Scalar::Int(0), DType::I64);
    let safe = select(imp, ignored, zero_i, target)?;
    let idx = unsqueeze(imp, safe, axis)?;
    let picked = imp.push(Op::GatherElements { axis }, vec![logp, idx])?;
    let picked = squeeze_axes(imp, picked, &[axis])?;
    let zero = sc(imp, 0.0, c);
    let w = match args.weight {
        Some(w) => {
            let w = imp.cast(w, c);
            let w = if rank >= 2 { per_channel(imp, w, rank)? } else { w };
            let full = TensorType::new(c, shape_of(imp, logp));
            let w = imp.push_typed(Op::Expand { shape: full.shape.clone() }, vec![w], full);
            let wt = imp.push(Op::GatherElements { axis }, vec![w, idx])?;
            squeeze_axes(imp, wt, &[axis])?
        }
        None => {
            let one = sc(imp, 1.0, c);
            let ty = TensorType::new(c, shape_of(imp, picked));
            imp.push_typed(Op::Expand { shape: ty.shape.clone() }, vec![one], ty)
        }
    };
    let w = select(imp, ignored, zero, w)?;
    let wp = bin(imp, B::Mul, w, picked)?;
    let loss = un(imp, U::Neg, wp)?;
    let all: Vec<usize> = (0..imp.ty(loss).rank()).collect();
    match args.reduction {
        0 => Ok(loss),
        2 => reduce(imp, loss, ReduceKind::Sum, all, false),
        1 => {
            let s = reduce(imp, loss, ReduceKind::Sum, all.clone(), false)?;
            let ws = reduce(imp, w, ReduceKind::Sum, all, false)?;
            bin(imp, B::Div, s, ws)
        }
        r => invalid(format!("reduction {r} (expected 0, 1 or 2)")),
    }
}

/// `aten::nll_loss_nd(Tensor self, Tensor target, Tensor? weight=None, int reduction=Mean, SymInt ignore_index=-100)`
fn nll_loss(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t = imp.tensor(n, "target")?;
    let v = nll_of(imp, n, x, t)?;
    finish(imp, n, 0, v)
}

/// `aten::cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=Mean,
/// SymInt ignore_index=-100, float label_smoothing=0.0)`: log_softmax over the class axis, then
/// the NLL of class indices, or the cross entropy with class probabilities.
fn cross_entropy(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = float_in(imp, n, "self", c)?;
    let t = imp.tensor(n, "target")?;
    let smoothing = imp.float(n, "label_smoothing", Some(0.0))?;
    let args = LossArgs::of(imp, n)?;
    let v = cross_entropy_of(imp, x, t, smoothing, &args)?;
    finish(imp, n, 0, v)
}

/// `torch_nn::_linear_cross_entropy_batch_chunked(input, linear_weight,
/// target, linear_bias, weight, str reduction, int ignore_index, float
/// label_smoothing, int batch_chunk_size, str acc_policy, ScalarType
/// acc_dtype, ..) -> (loss, grad_input, grad_linear_weight,
/// grad_linear_bias)` and `.._no_reduction(input, linear_weight, target,
/// linear_bias, weight, int ignore_index, ..) -> loss`: the op
/// `F.linear_cross_entropy` calls with `options`, which computes
/// `F.cross_entropy(F.linear(input, linear_weight, linear_bias), target,
/// weight, ..)` over chunks of the rows to bound memory. kiln computes the
/// same loss in one piece: the logits in the input's dtype, the softmax and
/// the reduction in `acc_dtype` (f32 at least). The gradient outputs (empty
/// unless autograd asked for them) are the caller's (`import::builtin`).
/// Returns the loss, in the declared dtype and shape.
pub(crate) fn linear_cross_entropy(imp: &mut Importer, n: &Node, no_reduction: bool) -> R<ValueId> {
    let x = imp.tensor(n, "input")?;
    let w = imp.tensor(n, "linear_weight")?;
    let t = imp.tensor(n, "target")?;
    let bias = imp.opt_tensor(n, "linear_bias")?;
    let dtype = imp.ty(x).dtype;
    if !dtype.is_float() || imp.ty(w).dtype != dtype || imp.ty(x).rank() != 2 || imp.ty(w).rank() != 2 {
        return unsupported("linear_cross_entropy: float input [N, K] and linear_weight [C, K] of one dtype");
    }
    let reduction = if no_reduction {
        0
    } else {
        match imp.string(n, "reduction", "mean")? {
            "none" => 0,
            "mean" => 1,
            "sum" => 2,
            r => return invalid(format!("linear_cross_entropy: reduction `{r}`")),
        }
    };
    let smoothing = if no_reduction { 0.0 } else { imp.float(n, "label_smoothing", Some(0.0))? };
    let args = LossArgs {
        weight: imp.opt_tensor(n, "weight")?,
        reduction,
        ignore_index: imp.int(n, "ignore_index", Some(-100))?,
    };
    let acc = super::quant::scalar_type_arg(imp, n, "acc_dtype")?.unwrap_or(DType::F32);
    let c = if acc == DType::F64 || dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let mut inputs = vec![x, w];
    inputs.extend(bias);
    let logits = imp.push(Op::Linear, inputs)?;
    let logits = imp.cast(logits, c);
    let v = cross_entropy_of(imp, logits, t, smoothing, &args)?;
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(v, out.dtype);
    Ok(if imp.ty(v).rank() < out.rank() {
        imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out)
    } else {
        v
    })
}

/// The cross entropy of logits `x` (class axis 1, or 0 when 1-d) and a
/// target of class indices or class probabilities, in `x`'s dtype.
fn cross_entropy_of(imp: &mut Importer, x: ValueId, t: ValueId, smoothing: f64, args: &LossArgs) -> R<ValueId> {
    let c = imp.ty(x).dtype;
    let rank = imp.ty(x).rank();
    let axis = usize::from(rank >= 2);
    let logp = imp.push(Op::LogSoftmax { axis }, vec![x])?;
    let v = if !imp.ty(t).dtype.is_float() {
        if smoothing != 0.0 {
            return unsupported("cross_entropy with class indices and label_smoothing");
        }
        nll_with(imp, logp, t, args)?
    } else {
        let mut t = imp.cast(t, c);
        if smoothing != 0.0 {
            let classes = static_dim(imp, x, axis, "cross_entropy label smoothing")?;
            let kept = imp.with_scalar(B::Mul, t, 1.0 - smoothing)?;
            t = imp.with_scalar(B::Add, kept, smoothing / classes as f64)?;
        }
        let mut p = bin(imp, B::Mul, logp, t)?;
        if let Some(w) = args.weight {
            let w = imp.cast(w, c);
            let w = if rank >= 2 { per_channel(imp, w, rank)? } else { w };
            p = bin(imp, B::Mul, p, w)?;
        }
        let s = reduce(imp, p, ReduceKind::Sum, vec![axis], false)?;
        let loss = un(imp, U::Neg, s)?;
        let all: Vec<usize> = (0..imp.ty(loss).rank()).collect();
        match args.reduction {
            0 => loss,
            1 => reduce(imp, loss, ReduceKind::Mean, all, false)?,
            2 => reduce(imp, loss, ReduceKind::Sum, all, false)?,
            r => return invalid(format!("reduction {r} (expected 0, 1 or 2)")),
        }
    };
    Ok(v)
}

/// `aten::empty_permuted(SymInt[] size, int[] physical_layout, *, dtype, ..)`:
/// an uninitialised tensor whose memory is laid out in `physical_layout`'s
/// order. Its values are unspecified, so no program can observe them or the
/// layout: kiln makes it as `empty` (zeros, its logical shape) once the
/// layout is checked to be a permutation of the axes, as torch checks it.
fn empty_permuted(imp: &mut Importer, n: &Node) -> R<()> {
    let rank = imp.out_ty(n, 0)?.rank();
    let layout = imp.ints(n, "physical_layout", &[])?;
    let mut seen = layout.clone();
    seen.sort_unstable();
    if !seen.iter().copied().eq(0..rank as i64) {
        return invalid(format!("empty_permuted: physical_layout {layout:?} is not a permutation of {rank} axes"));
    }
    redirect(imp, n, "empty", "memory_format", &[])
}

/// `aten::histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0)`: counts
/// in `bins` equal bins over [min, max] (the data's range when min = max, as
/// torch's `histc_select_outer_bin_edges` does for any equal pair, widened by
/// one each side when that range is a point), elements outside or NaN left
/// out, the top edge in the last bin. Bins are found as torch's linear kernel
/// does, `⌊(x - min)·bins / (max - min)⌋` in the input's dtype, and counted
/// with one scatter-add (no per-bin pass). A data range that is not finite
/// fails the run, as in torch.
fn histc(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = out.dtype;
    if !c.is_float() {
        return unsupported(format!("histc of {c} (torch's CPU kernel takes floating-point input only)"));
    }
    let x = float_in(imp, n, "self", c)?;
    let bins = imp.int(n, "bins", Some(100))?;
    if bins <= 0 {
        return invalid(format!("histc: bins must be positive, got {bins}"));
    }
    let lo = imp.opt_scalar(n, "min")?.map_or(0.0, Scalar::as_f64);
    let hi = imp.opt_scalar(n, "max")?.map_or(0.0, Scalar::as_f64);
    if !(lo.is_finite() && hi.is_finite()) {
        return invalid(format!("histc: range of [{lo}, {hi}] is not finite"));
    }
    if lo > hi {
        return invalid(format!("histc: max {hi} must be larger than min {lo}"));
    }
    let total = product_of(&shape_of(imp, x));
    let flat = reshape(imp, x, vec![total.clone()])?;
    let (lo, hi) = match (lo == hi, total.as_const()) {
        (false, _) => (sc(imp, lo, c), sc(imp, hi, c)),
        // No data: torch keeps the equal pair and widens it.
        (true, Some(0)) => (sc(imp, lo - 1.0, c), sc(imp, hi + 1.0, c)),
        (true, _) => histc_data_range(imp, flat)?,
    };
    let shifted = bin(imp, B::Sub, flat, lo)?;
    let scaled = imp.with_scalar(B::Mul, shifted, bins as f64)?;
    let width = bin(imp, B::Sub, hi, lo)?;
    let pos = bin(imp, B::Div, scaled, width)?;
    let pos = imp.push(Op::Clamp { min: Some(0.0), max: Some((bins - 1) as f64) }, vec![pos])?;
    let pos = imp.cast(pos, DType::I64);
    let below = bin(imp, B::Lt, flat, lo)?;
    let above = bin(imp, B::Gt, flat, hi)?;
    let outside = bin(imp, B::Or, below, above)?;
    let outside = {
        // NaNs count nowhere.
        let nan = is_nan(imp, flat)?;
        bin(imp, B::Or, outside, nan)?
    };
    let (zero, one) = (sc(imp, 0.0, c), sc(imp, 1.0, c));
    let src = select(imp, outside, zero, one)?;
    let counts_ty = TensorType::new(c, vec![Dim::Const(bins)]);
    let base = imp.push_typed(Op::Full { value: 0.0, dtype: c, shape: counts_ty.shape.clone() }, vec![], counts_ty);
    let v = imp.push(
        Op::ScatterElements { axis: 0, reduce: Some(ReduceKind::Sum), include_self: true },
        vec![base, pos, src],
    )?;
    finish(imp, n, 0, v)
}

/// `histc`'s range taken from the data: its minimum and maximum, widened by
/// one each side when they are equal; a run whose range is not finite (a NaN
/// or an infinity in the data) fails, as torch's does.
fn histc_data_range(imp: &mut Importer, flat: ValueId) -> R<(ValueId, ValueId)> {
    let c = imp.ty(flat).dtype;
    let l = reduce(imp, flat, ReduceKind::Min, vec![0], false)?;
    let h = reduce(imp, flat, ReduceKind::Max, vec![0], false)?;
    // `v - v` is zero exactly when `v` is finite.
    let zero = sc(imp, 0.0, c);
    let finite = |imp: &mut Importer, v: ValueId| -> R<ValueId> {
        let d = bin(imp, B::Sub, v, v)?;
        bin(imp, B::Eq, d, zero)
    };
    let (lf, hf) = (finite(imp, l)?, finite(imp, h)?);
    let ok = bin(imp, B::And, lf, hf)?;
    let message = "torch.histc: range of the data is not finite".to_string();
    let loc = imp.loc();
    imp.g.add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    let same = bin(imp, B::Eq, l, h)?;
    let l1 = imp.with_scalar(B::Sub, l, 1.0)?;
    let h1 = imp.with_scalar(B::Add, h, 1.0)?;
    Ok((select(imp, same, l1, l)?, select(imp, same, h1, h)?))
}

/// `aten::erfinv(Tensor self)`: torch's CPU algorithm (`calc_erfinv`, after
/// Giles/Pavlis): a rational first guess — in y² for |y| ≤ 0.7, in
/// √(−log((1 − |y|)/2)) beyond — then two Newton steps on erf(x) − y, all in
/// the compute dtype; ±inf at ±1, NaN outside [−1, 1] (the tail's log of a
/// negative number).
fn erfinv(imp: &mut Importer, n: &Node) -> R<()> {
    const A: [f64; 4] = [0.886226899, -1.645349621, 0.914624893, -0.140543331];
    const B: [f64; 4] = [-2.118377725, 1.442710462, -0.329097515, 0.012229801];
    const C: [f64; 4] = [-1.970840454, -1.624906493, 3.429567803, 1.641345311];
    const D: [f64; 2] = [3.543889200, 1.637067800];
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let y = float_in(imp, n, "self", c)?;
    let y_abs = un(imp, U::Abs, y)?;
    // Central range: y · A(z) / (z · B(z) + 1), z = y².
    let z = bin(imp, B::Mul, y, y)?;
    let num = horner(imp, z, &A)?;
    let dem = horner(imp, z, &B)?;
    let dem = bin(imp, B::Mul, dem, z)?;
    let dem = imp.with_scalar(B::Add, dem, 1.0)?;
    let central = bin(imp, B::Mul, y, num)?;
    let central = bin(imp, B::Div, central, dem)?;
    // Tails: copysign(C(t), y) / D'(t), t = √(−log((1 − |y|)/2)).
    let one = sc(imp, 1.0, c);
    let t = bin(imp, B::Sub, one, y_abs)?;
    let t = imp.with_scalar(B::Div, t, 2.0)?;
    let t = un(imp, U::Log, t)?;
    let t = un(imp, U::Neg, t)?;
    let t = un(imp, U::Sqrt, t)?;
    let num = horner(imp, t, &C)?;
    let dem = horner(imp, t, &D)?;
    let dem = bin(imp, B::Mul, dem, t)?;
    let dem = imp.with_scalar(B::Add, dem, 1.0)?;
    let num = copysign_of(imp, num, y)?;
    let tail = bin(imp, B::Div, num, dem)?;
    let in_centre = imp.with_scalar(B::Le, y_abs, 0.7)?;
    let mut x = select(imp, in_centre, central, tail)?;
    // Two Newton steps: x -= (erf(x) - y) / (2/√π · exp(-x²)).
    for _ in 0..2 {
        let e = un(imp, U::Erf, x)?;
        let r = bin(imp, B::Sub, e, y)?;
        let xx = bin(imp, B::Mul, x, x)?;
        let nxx = un(imp, U::Neg, xx)?;
        let d = un(imp, U::Exp, nxx)?;
        let d = imp.with_scalar(B::Mul, d, std::f64::consts::FRAC_2_SQRT_PI)?;
        let step = bin(imp, B::Div, r, d)?;
        x = bin(imp, B::Sub, x, step)?;
    }
    // ±1 map to ±inf (the Newton steps would make them NaN).
    let at_one = imp.with_scalar(B::Eq, y_abs, 1.0)?;
    let inf = sc(imp, f64::INFINITY, c);
    let signed_inf = copysign_of(imp, inf, y)?;
    let v = select(imp, at_one, signed_inf, x)?;
    finish(imp, n, 0, v)
}

/// `((k[n-1]·t + k[n-2])·t + …)·t + k[0]`.
fn horner(imp: &mut Importer, t: ValueId, k: &[f64]) -> R<ValueId> {
    let dtype = imp.ty(t).dtype;
    let (last, rest) = k.split_last().expect("a polynomial has coefficients");
    let mut acc = sc(imp, *last, dtype);
    for &coef in rest.iter().rev() {
        acc = bin(imp, B::Mul, acc, t)?;
        acc = imp.with_scalar(B::Add, acc, coef)?;
    }
    Ok(acc)
}

/// |m| with the sign of `s` (the sign bit: −0.0 counts as negative, as in
/// C's `copysign`).
fn copysign_of(imp: &mut Importer, m: ValueId, s: ValueId) -> R<ValueId> {
    let a = un(imp, U::Abs, m)?;
    let neg = un(imp, U::Neg, a)?;
    let negative = signbit_of(imp, s)?;
    select(imp, negative, neg, a)
}

/// `aten::searchsorted.Tensor(Tensor sorted_sequence, Tensor self, *,
/// bool out_int32=False, bool right=False, str? side=None, Tensor? sorter=None)`
/// (and `.Scalar`), `aten::bucketize.Tensor(Tensor self, Tensor boundaries, *,
/// bool out_int32=False, bool right=False)` (and `.Scalar`): for each value,
/// the number of sequence entries before which torch's binary search stops —
/// on the left side those with `!(s >= v)`, on the right `!(s > v)` (so a
/// NaN value lands past the end, as in torch). Counted by one broadcast
/// comparison and a sum over the sequence axis: O(values × sequence) work,
/// no data-dependent loop. A 1-d sequence serves every value; an n-d one
/// is searched row by row (its leading dims match the values').
fn searchsorted(imp: &mut Importer, n: &Node, seq_key: &str, values_key: &str) -> R<()> {
    let mut seq = imp.tensor(n, seq_key)?;
    let dtype = imp.ty(seq).dtype;
    let values = float_in(imp, n, values_key, dtype)?;
    if imp.ty(seq).rank() == 0 {
        return invalid(format!("{seq_key} must not be 0-d"));
    }
    let right = match imp.arg(n, "side") {
        Some(Arg::Str(side)) if side == "left" => false,
        Some(Arg::Str(side)) if side == "right" => true,
        Some(Arg::Str(other)) => return invalid(format!("searchsorted side `{other}` (expected left or right)")),
        _ => imp.bool(n, "right", false)?,
    };
    let last = imp.ty(seq).rank() - 1;
    if let Some(sorter) = imp.opt_tensor(n, "sorter")? {
        let sorter = imp.cast(sorter, DType::I64);
        seq = imp.push(Op::GatherElements { axis: last }, vec![seq, sorter])?;
    }
    let value_shape = shape_of(imp, values);
    // values [.., M] -> [.., M, 1]; an n-d sequence [.., N] -> [.., 1, N].
    let mut with_one = value_shape.clone();
    with_one.push(Dim::Const(1));
    let v = reshape(imp, values, with_one)?;
    let s = if last == 0 {
        seq
    } else {
        let mut shape = shape_of(imp, seq);
        shape.insert(last, Dim::Const(1));
        reshape(imp, seq, shape)?
    };
    let stops = bin(imp, if right { B::Gt } else { B::Ge }, s, v)?;
    let before = un(imp, U::Not, stops)?;
    let before = imp.cast(before, DType::I64);
    let axis = imp.ty(before).rank() - 1;
    let count = reduce(imp, before, ReduceKind::Sum, vec![axis], false)?;
    finish(imp, n, 0, count)
}
