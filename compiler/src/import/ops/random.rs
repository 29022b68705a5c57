//! Random ops onto `Op::Random` (the runtime's seeded counter-based
//! generator; see `kiln_kernels::random`). kiln draws different numbers than
//! torch's CPU generator, with the same distributions; each op gets its own
//! stream, so two ops in one program never draw the same numbers.
//!
//! `bernoulli` and dropout in training mode are decomposed here into a
//! uniform draw and a comparison (what torch's own decompositions do).

use super::super::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Op, RandomDist, TensorType, ValueId};

/// A fresh random tensor of `ty`.
fn draw(imp: &mut Importer, dist: RandomDist, ty: TensorType) -> ValueId {
    let stream = imp.random_stream();
    let op = Op::Random { dist, dtype: ty.dtype, shape: ty.shape.clone(), stream };
    imp.push_typed(op, Vec::new(), ty)
}

/// Draws for output 0 of `n` in its declared type.
fn emit_draw(imp: &mut Importer, n: &Node, dist: RandomDist) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    if !out.dtype.is_float() && !matches!(dist, RandomDist::Int { .. } | RandomDist::Perm) {
        return unsupported(format!("a float distribution into {}", out.dtype));
    }
    let v = draw(imp, dist, out);
    imp.bind(n, 0, v)
}

/// `generator=` arguments name a Python object kiln cannot follow.
fn no_generator(imp: &Importer, n: &Node) -> R<()> {
    match imp.arg(n, "generator") {
        None => Ok(()),
        Some(_) => unsupported("an explicit torch.Generator (kiln seeds random ops per session instead)"),
    }
}

/// `rand(SymInt[] size, ...)`, `rand_like(Tensor self, ...)`, `randn*`,
/// `uniform(Tensor self, float from=0, float to=1)`,
/// `normal_functional(Tensor self, float mean=0, float std=1)` and the
/// in-place `uniform_` / `normal_` (functionalised by the caller).
pub(super) fn continuous(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    no_generator(imp, n)?;
    let dist = match name {
        "rand" | "rand_like" => RandomDist::Uniform { low: 0.0, high: 1.0 },
        "randn" | "randn_like" => RandomDist::Normal { mean: 0.0, std: 1.0 },
        "uniform" => {
            RandomDist::Uniform { low: imp.float(n, "from", Some(0.0))?, high: imp.float(n, "to", Some(1.0))? }
        }
        "normal_functional" => {
            RandomDist::Normal { mean: imp.float(n, "mean", Some(0.0))?, std: imp.float(n, "std", Some(1.0))? }
        }
        "normal" => return normal(imp, n, overload),
        _ => return unsupported(format!("random op {name}")),
    };
    emit_draw(imp, n, dist)
}

/// `normal` overloads: `default` (the in-place `normal_(self, mean, std)`),
/// `float_float(float mean, float std, SymInt[] size)`,
/// `Tensor_float(Tensor mean, float std=1)`, `float_Tensor(float mean, Tensor std)`,
/// `Tensor_Tensor(Tensor mean, Tensor std)`: `mean + std * randn`.
fn normal(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    if matches!(overload, "default" | "float_float") {
        let dist = RandomDist::Normal { mean: imp.float(n, "mean", Some(0.0))?, std: imp.float(n, "std", Some(1.0))? };
        return emit_draw(imp, n, dist);
    }
    let out = imp.out_ty(n, 0)?;
    if !out.dtype.is_float() {
        return unsupported(format!("normal into {}", out.dtype));
    }
    let z = draw(imp, RandomDist::Normal { mean: 0.0, std: 1.0 }, out.clone());
    let operand = |imp: &mut Importer, name: &str, default: f64| -> R<ValueId> {
        match imp.arg(n, name) {
            Some(Arg::Tensor(t)) => {
                let v = imp.value(t)?;
                Ok(imp.cast(v, out.dtype))
            }
            Some(_) => {
                let s = imp.scalar(n, name)?;
                Ok(imp.scalar_const(s, out.dtype))
            }
            None => Ok(imp.scalar_const(Scalar::Float(default), out.dtype)),
        }
    };
    let mean = operand(imp, "mean", 0.0)?;
    let std = operand(imp, "std", 1.0)?;
    let scaled = imp.push(Op::Binary(B::Mul), vec![z, std])?;
    imp.emit(n, Op::Binary(B::Add), vec![scaled, mean])?;
    Ok(())
}

/// `randint(SymInt high, SymInt[] size, ...)`, `randint.low(SymInt low, SymInt high, SymInt[] size, ...)`,
/// `randint_like(Tensor self, SymInt high, ...)`, `randint_like.low_dtype(Tensor self, SymInt low, SymInt high, ...)`.
pub(super) fn randint(imp: &mut Importer, n: &Node) -> R<()> {
    no_generator(imp, n)?;
    let low = imp.int(n, "low", Some(0))?;
    let high = imp.int(n, "high", None)?;
    if high <= low {
        return invalid(format!("randint: empty range [{low}, {high})"));
    }
    let out = imp.out_ty(n, 0)?;
    if out.dtype == DType::Bool {
        // torch draws the integer, then casts it: nonzero is true.
        let ints = draw(imp, RandomDist::Int { low, high }, TensorType::new(DType::I64, out.shape.clone()));
        imp.emit(n, Op::Cast { to: DType::Bool }, vec![ints])?;
        return Ok(());
    }
    emit_draw(imp, n, RandomDist::Int { low, high })
}

/// `randperm(SymInt n, ...)`: kiln permutes integers; other dtypes are cast.
pub(super) fn randperm(imp: &mut Importer, n: &Node) -> R<()> {
    no_generator(imp, n)?;
    let out = imp.out_ty(n, 0)?;
    if out.rank() != 1 {
        return invalid(format!("randperm output has rank {}", out.rank()));
    }
    if out.dtype.is_int() {
        return emit_draw(imp, n, RandomDist::Perm);
    }
    let perm = draw(imp, RandomDist::Perm, TensorType::new(DType::I64, out.shape.clone()));
    imp.emit(n, Op::Cast { to: out.dtype }, vec![perm])?;
    Ok(())
}

/// A uniform draw shaped like `like`, in f64 for f64 and f32 otherwise (so
/// that half-precision probabilities are not quantised to 8 or 11 bits).
fn uniform_like(imp: &mut Importer, like: &TensorType) -> ValueId {
    let dtype = if like.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    draw(imp, RandomDist::Uniform { low: 0.0, high: 1.0 }, TensorType::new(dtype, like.shape.clone()))
}

/// `bernoulli(Tensor self, *, Generator? generator=None)` (probabilities
/// `self`) and `bernoulli.p(Tensor self, float p=0.5, ...)`: `rand < p` in
/// the output's dtype.
pub(super) fn bernoulli(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    no_generator(imp, n)?;
    let out = imp.out_ty(n, 0)?;
    let u = uniform_like(imp, &out);
    let dtype = imp.ty(u).dtype;
    let p = if overload == "p" {
        let p = imp.float(n, "p", Some(0.5))?;
        imp.scalar_const(Scalar::Float(p), dtype)
    } else {
        let p = imp.tensor(n, "self")?;
        imp.cast(p, dtype)
    };
    let hit = imp.push(Op::Binary(B::Lt), vec![u, p])?;
    imp.emit(n, Op::Cast { to: out.dtype }, vec![hit])?;
    Ok(())
}

/// Training-mode dropout of `x`: `x * keep / (1 - p)` with `keep = rand < 1 - p`.
/// Returns the output and the keep mask (bool).
fn train_dropout(imp: &mut Importer, x: ValueId, p: f64) -> R<(ValueId, ValueId)> {
    if !(0.0..=1.0).contains(&p) {
        return invalid(format!("dropout probability {p} outside [0, 1]"));
    }
    let ty = imp.ty(x).clone();
    if !ty.dtype.is_float() {
        return unsupported(format!("dropout in training mode on {}", ty.dtype));
    }
    let u = uniform_like(imp, &ty);
    let keep_p = imp.scalar_const(Scalar::Float(1.0 - p), imp.ty(u).dtype);
    let keep = imp.push(Op::Binary(B::Lt), vec![u, keep_p])?;
    // p = 1 drops everything; torch gives zeros there, not NaN from 0 * inf.
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let mask = imp.cast(keep, ty.dtype);
    let kept = imp.push(Op::Binary(B::Mul), vec![x, mask])?;
    let y = imp.with_scalar(B::Mul, kept, scale)?;
    Ok((y, keep))
}

/// `dropout(Tensor input, float p, bool train)` (and the feature/alpha
/// variants, whose training mode is not element-wise and stays unsupported).
pub(super) fn dropout(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    // The in-place forms (`dropout_`, EfficientNet's) name their operand `self`.
    let key = if imp.arg(n, "input").is_some() { "input" } else { "self" };
    let x = imp.tensor(n, key)?;
    let p = imp.float(n, "p", None)?;
    if !imp.bool(n, "train", false)? || p == 0.0 {
        return imp.bind(n, 0, x);
    }
    if name != "dropout" {
        return unsupported(format!("{name} in training mode (train=True, p={p})"));
    }
    let (y, _) = train_dropout(imp, x, p)?;
    imp.bind(n, 0, y)
}

/// `native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)`:
/// the output and the keep mask.
pub(super) fn native_dropout(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let p = imp.float(n, "p", None)?;
    let mask_name = match n.outputs.get(1) {
        Some(Arg::Tensor(m)) if imp.is_used(m) => Some(m.clone()),
        _ => None,
    };
    let (y, keep) = if imp.bool(n, "train", false)? && p != 0.0 {
        train_dropout(imp, x, p)?
    } else {
        let ty = imp.ty(x).clone();
        let all = imp.push_typed(
            Op::Full { value: 1.0, dtype: DType::Bool, shape: ty.shape.clone() },
            vec![],
            TensorType::new(DType::Bool, ty.shape),
        );
        (x, all)
    };
    imp.bind(n, 0, y)?;
    if mask_name.is_some() {
        let ty = imp.out_ty(n, 1)?;
        let mask = imp.cast(keep, ty.dtype);
        imp.bind(n, 1, mask)?;
    }
    Ok(())
}
