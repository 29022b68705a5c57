//! Activations and elementwise composites that kiln decomposes at import
//! (hardswish, mish, softplus, elu, ...), tensor-bound clamps and the
//! float-class tests (isnan, isinf).
//!
//! f16/bf16 inputs are computed in f32 and rounded once at the end, as
//! PyTorch's CPU kernels do; a decomposition in half precision would round
//! after every step.

use crate::import::importer::{Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Op, UnaryOp as U, ValueId};

/// The dtype a decomposition computes in for output dtype `d`.
pub(super) fn compute_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

fn un(imp: &mut Importer, op: U, x: ValueId) -> R<ValueId> {
    imp.push(Op::Unary(op), vec![x])
}

fn bin(imp: &mut Importer, op: B, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.push(Op::Binary(op), vec![a, b])
}

fn clamp(imp: &mut Importer, x: ValueId, min: Option<f64>, max: Option<f64>) -> R<ValueId> {
    imp.push(Op::Clamp { min, max }, vec![x])
}

/// `log1p(exp(beta * x)) / beta`, or `x` where `beta * x > threshold`.
fn softplus_of(imp: &mut Importer, x: ValueId, beta: f64, threshold: f64) -> R<ValueId> {
    let bx = if beta == 1.0 { x } else { imp.with_scalar(B::Mul, x, beta)? };
    let e = un(imp, U::Exp, bx)?;
    let l = un(imp, U::Log1p, e)?;
    let soft = if beta == 1.0 { l } else { imp.with_scalar(B::Div, l, beta)? };
    let big = imp.with_scalar(B::Gt, bx, threshold)?;
    imp.push(Op::Where, vec![big, x, soft])
}

/// `aten::hardswish(Tensor self)`, `aten::hardsigmoid(Tensor self)`, `aten::mish(Tensor self)`,
/// `aten::softplus(Tensor self, Scalar beta=1, Scalar threshold=20)`,
/// `aten::leaky_relu(Tensor self, Scalar negative_slope=0.01)`,
/// `aten::elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1)`,
/// `aten::square(Tensor self)`.
pub(super) fn activation(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = imp.cast(x, c);
    let v = match name {
        "hardsigmoid" | "hardswish" => {
            let shifted = imp.with_scalar(B::Add, x, 3.0)?;
            let clipped = clamp(imp, shifted, Some(0.0), Some(6.0))?;
            let h = imp.with_scalar(B::Div, clipped, 6.0)?;
            if name == "hardswish" {
                // torch: x * min(max(x + 3, 0), 6) / 6, in that order.
                let p = bin(imp, B::Mul, x, clipped)?;
                imp.with_scalar(B::Div, p, 6.0)?
            } else {
                h
            }
        }
        "mish" => {
            let sp = softplus_of(imp, x, 1.0, 20.0)?;
            let t = un(imp, U::Tanh, sp)?;
            bin(imp, B::Mul, x, t)?
        }
        "softplus" => {
            let beta = imp.opt_scalar(n, "beta")?.map_or(1.0, Scalar::as_f64);
            let threshold = imp.opt_scalar(n, "threshold")?.map_or(20.0, Scalar::as_f64);
            softplus_of(imp, x, beta, threshold)?
        }
        "leaky_relu" => {
            let slope = imp.opt_scalar(n, "negative_slope")?.map_or(0.01, Scalar::as_f64);
            let pos = imp.with_scalar(B::Gt, x, 0.0)?;
            let neg = imp.with_scalar(B::Mul, x, slope)?;
            imp.push(Op::Where, vec![pos, x, neg])?
        }
        "elu" => {
            let alpha = imp.opt_scalar(n, "alpha")?.map_or(1.0, Scalar::as_f64);
            let scale = imp.opt_scalar(n, "scale")?.map_or(1.0, Scalar::as_f64);
            let input_scale = imp.opt_scalar(n, "input_scale")?.map_or(1.0, Scalar::as_f64);
            // torch: x > 0 ? x * scale : (exp(x * input_scale) - 1) * alpha * scale
            let pos = imp.with_scalar(B::Gt, x, 0.0)?;
            let xs = if input_scale == 1.0 { x } else { imp.with_scalar(B::Mul, x, input_scale)? };
            let em = un(imp, U::Expm1, xs)?;
            let neg = imp.with_scalar(B::Mul, em, alpha * scale)?;
            let p = if scale == 1.0 { x } else { imp.with_scalar(B::Mul, x, scale)? };
            imp.push(Op::Where, vec![pos, p, neg])?
        }
        "square" => bin(imp, B::Mul, x, x)?,
        _ => return Err(crate::import::importer::Fail::Unsupported(None)),
    };
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `aten::isnan(Tensor self)` (x != x), `aten::isinf(Tensor self)` (|x| == inf).
pub(super) fn float_class(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let v = if !imp.ty(x).dtype.is_float() {
        let out = imp.out_ty(n, 0)?;
        imp.push_typed(Op::Full { value: 0.0, dtype: DType::Bool, shape: out.shape.clone() }, vec![], out)
    } else if name == "isnan" {
        bin(imp, B::Ne, x, x)?
    } else {
        let a = un(imp, U::Abs, x)?;
        imp.with_scalar(B::Eq, a, f64::INFINITY)?
    };
    imp.bind(n, 0, v)
}

/// `aten::clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None)`,
/// `aten::clamp_min.Tensor(Tensor self, Tensor min)`, `aten::clamp_max.Tensor(Tensor self, Tensor max)`:
/// `min(max(x, lo), hi)` in the output dtype, broadcasting.
pub(super) fn clamp_tensor(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "self")?;
    let mut v = imp.cast(x, out.dtype);
    for (key, op) in [("min", B::Max), ("max", B::Min)] {
        let bound = match imp.arg(n, key) {
            None => continue,
            Some(Arg::Tensor(t)) => imp.value(t)?,
            Some(_) => {
                let s = imp.scalar(n, key)?;
                imp.scalar_const(s, out.dtype)
            }
        };
        let bound = imp.cast(bound, out.dtype);
        v = bin(imp, op, v, bound)?;
    }
    // A bound can broadcast the result beyond `self`'s shape.
    if imp.ty(v).shape != out.shape {
        v = imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out.clone());
    }
    imp.bind(n, 0, v)
}
