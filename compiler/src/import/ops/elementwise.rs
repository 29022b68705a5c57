//! Elementwise ops, reductions and softmax.

use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::import::promote::{result_type, Operand};
use crate::pt2::program::{Arg, Node, SymIntArg};
use kiln_ir::{BinaryOp, DType, Op, ReduceKind, TensorType, UnaryOp, ValueId};

/// `aten::relu(Tensor self)`, `aten::gelu(Tensor self, *, str approximate='none')`, ...
pub(super) fn unary(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let op = match name {
        "relu" => UnaryOp::Relu,
        "gelu" => match imp.string(n, "approximate", "none")? {
            "none" => UnaryOp::Gelu,
            "tanh" => UnaryOp::GeluTanh,
            other => return unsupported(format!("gelu approximate={other:?}")),
        },
        "silu" => UnaryOp::Silu,
        "sigmoid" => UnaryOp::Sigmoid,
        "tanh" => UnaryOp::Tanh,
        "exp" => UnaryOp::Exp,
        "log" => UnaryOp::Log,
        "sqrt" => UnaryOp::Sqrt,
        "rsqrt" => UnaryOp::Rsqrt,
        "neg" => UnaryOp::Neg,
        "abs" => UnaryOp::Abs,
        "erf" => UnaryOp::Erf,
        "erfc" => UnaryOp::Erfc,
        "lgamma" => UnaryOp::Lgamma,
        "digamma" | "special_digamma" | "special_psi" => UnaryOp::Digamma,
        "i0" | "special_i0" => UnaryOp::I0,
        "special_i0e" => UnaryOp::I0e,
        "special_i1" => UnaryOp::I1,
        "special_i1e" => UnaryOp::I1e,
        "special_erfcx" => UnaryOp::Erfcx,
        "special_ndtr" => UnaryOp::Ndtr,
        "special_log_ndtr" => UnaryOp::LogNdtr,
        "special_bessel_j0" => UnaryOp::BesselJ0,
        "special_bessel_j1" => UnaryOp::BesselJ1,
        "special_bessel_y0" => UnaryOp::BesselY0,
        "special_bessel_y1" => UnaryOp::BesselY1,
        "special_entr" => UnaryOp::Entr,
        "special_spherical_bessel_j0" => UnaryOp::SphericalBesselJ0,
        "special_modified_bessel_i0" => UnaryOp::I0,
        "special_modified_bessel_i1" => UnaryOp::I1,
        "sin" => UnaryOp::Sin,
        "cos" => UnaryOp::Cos,
        "reciprocal" => UnaryOp::Reciprocal,
        "floor" => UnaryOp::Floor,
        "ceil" => UnaryOp::Ceil,
        "round" => {
            // aten::round.decimals(Tensor self, *, int decimals)
            let decimals = imp.int(n, "decimals", Some(0))?;
            if decimals != 0 {
                return round_decimals(imp, n, decimals);
            }
            UnaryOp::Round
        }
        "sign" => UnaryOp::Sign,
        "logical_not" => UnaryOp::Not,
        "negative" => UnaryOp::Neg,
        "absolute" => UnaryOp::Abs,
        "log1p" => UnaryOp::Log1p,
        "expm1" => UnaryOp::Expm1,
        "trunc" | "fix" => UnaryOp::Trunc,
        "tan" => UnaryOp::Tan,
        "asin" | "arcsin" => UnaryOp::Asin,
        "acos" | "arccos" => UnaryOp::Acos,
        "atan" | "arctan" => UnaryOp::Atan,
        "sinh" => UnaryOp::Sinh,
        "cosh" => UnaryOp::Cosh,
        "asinh" | "arcsinh" => UnaryOp::Asinh,
        "acosh" | "arccosh" => UnaryOp::Acosh,
        "atanh" | "arctanh" => UnaryOp::Atanh,
        "log2" => UnaryOp::Log2,
        "log10" => UnaryOp::Log10,
        "bitwise_not" => UnaryOp::BitNot,
        _ => return Err(crate::import::importer::Fail::Unsupported(None)),
    };
    // torch names spherical_bessel_j0's operand `x`, every other one's `self`.
    let x = imp.tensor(n, if name == "special_spherical_bessel_j0" { "x" } else { "self" })?;
    let out = imp.out_ty(n, 0)?;
    if op == UnaryOp::Sign && imp.ty(x).dtype == DType::Bool {
        return imp.bind(n, 0, x); // sign(bool) is the identity
    }
    // Unary float ops on ints compute in the (promoted) output type;
    // logical_not reads any type as "nonzero".
    let compute = if op == UnaryOp::Not { DType::Bool } else { out.dtype };
    let x = imp.cast(x, compute);
    let v = imp.push_typed(Op::Unary(op), vec![x], TensorType::new(compute, out.shape.clone()));
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `round.decimals(self, *, decimals)` as torch's CPU kernel: in the
/// dtype's math type (f32 for f16/bf16), `rint(x · 10^d) / 10^d`, or for
/// negative `d` `rint(x / 10^-d) · 10^-d`, with `10^|d|` rounded to it once.
fn round_decimals(imp: &mut Importer, n: &Node, decimals: i64) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    if !out.dtype.is_float() {
        return unsupported(format!("round with decimals of {} (torch takes floating point only)", out.dtype));
    }
    let math = super::activation::compute_dtype(out.dtype);
    let x = imp.tensor(n, "self")?;
    let x = imp.cast(x, math);
    let power = 10f64.powi(decimals.unsigned_abs().min(400) as i32);
    let power = if math == DType::F32 { power as f32 as f64 } else { power };
    let p = imp.scalar_const(Scalar::Float(power), math);
    let (first, second) = if decimals > 0 { (BinaryOp::Mul, BinaryOp::Div) } else { (BinaryOp::Div, BinaryOp::Mul) };
    let scaled = imp.push(Op::Binary(first), vec![x, p])?;
    let rounded = imp.push(Op::Unary(UnaryOp::Round), vec![scaled])?;
    let v = imp.push(Op::Binary(second), vec![rounded, p])?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `aten::polygamma(int n, Tensor self)` (and `special_polygamma`): ψ for
/// n = 0, ψ' for n = 1, and for n ≥ 2 torch's
/// `(-1)^(n+1) · n! · ζ(n + 1, x)` (n! a constant).
pub(super) fn polygamma(imp: &mut Importer, n: &Node) -> R<()> {
    let order = imp.int(n, "n", None)?;
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let x = imp.cast(x, out.dtype);
    let ty = TensorType::new(out.dtype, out.shape.clone());
    let v = match order {
        i64::MIN..=-1 => return unsupported(format!("polygamma of negative order {order}")),
        0 => imp.push_typed(Op::Unary(UnaryOp::Digamma), vec![x], ty),
        1 => imp.push_typed(Op::Unary(UnaryOp::Trigamma), vec![x], ty),
        _ => {
            let s = imp.scalar_const(Scalar::Float((order + 1) as f64), out.dtype);
            let z = imp.push_typed(Op::Binary(BinaryOp::Zeta), vec![s, x], ty.clone());
            let sign = if order % 2 == 1 { 1.0 } else { -1.0 };
            // n! (torch's exp(lgamma(n + 1)), exact here; inf past 170!).
            let factorial: f64 = (1..=order).map(|k| k as f64).product();
            let k = imp.scalar_const(Scalar::Float(sign * factorial), out.dtype);
            imp.push_typed(Op::Binary(BinaryOp::Mul), vec![k, z], ty)
        }
    };
    imp.bind(n, 0, v)
}

/// `aten::hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1)`
/// `aten::relu6(Tensor self)`
/// `aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None)`
/// `aten::clamp_min(Tensor self, Scalar min)`, `aten::clamp_max(Tensor self, Scalar max)`
pub(super) fn clamp(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let (min, max) = match name {
        "hardtanh" => (Some(imp.float(n, "min_val", Some(-1.0))?), Some(imp.float(n, "max_val", Some(1.0))?)),
        "relu6" => (Some(0.0), Some(6.0)),
        _ => {
            let tensor_bound = |a: Option<&Arg>| matches!(a, Some(Arg::Tensor(_)));
            if tensor_bound(imp.arg(n, "min")) || tensor_bound(imp.arg(n, "max")) {
                return unsupported("clamp with tensor bounds");
            }
            let min = imp.opt_scalar(n, "min")?.map(Scalar::as_f64);
            let max = imp.opt_scalar(n, "max")?.map(Scalar::as_f64);
            (min, max)
        }
    };
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?.dtype;
    let x = imp.cast(x, out);
    imp.emit(n, Op::Clamp { min, max }, vec![x])?;
    Ok(())
}

/// An operand of a promoting op: a tensor or a Python scalar.
#[derive(Clone)]
enum Side {
    Tensor(ValueId),
    Scalar(Scalar),
    /// A symbolic int (`x.shape[1]`) used as a Python int.
    Sym(kiln_ir::Dim),
    /// A `.item()` value: the 0-d tensor it was read from, and the Python
    /// scalar kind (i64, f32 or bool) it takes part in promotion as.
    Item(ValueId, DType),
}

impl Side {
    fn operand(&self, imp: &Importer) -> Operand {
        match *self {
            Side::Tensor(v) => {
                let ty = imp.ty(v);
                if ty.rank() == 0 {
                    Operand::ZeroDim(ty.dtype)
                } else {
                    Operand::Tensor(ty.dtype)
                }
            }
            Side::Scalar(Scalar::Bool(_)) => Operand::Scalar(DType::Bool),
            Side::Scalar(Scalar::Int(_)) => Operand::Scalar(DType::I64),
            Side::Scalar(Scalar::Float(_)) => Operand::Scalar(DType::F32),
            Side::Sym(_) => Operand::Scalar(DType::I64),
            Side::Item(_, kind) => Operand::Scalar(kind),
        }
    }

    fn value(&self, imp: &mut Importer, dtype: DType) -> ValueId {
        match self {
            Side::Tensor(v) => imp.cast(*v, dtype),
            Side::Scalar(s) => imp.scalar_const(*s, dtype),
            Side::Sym(d) => imp.dim_scalar(d, dtype),
            Side::Item(v, _) => imp.cast(*v, dtype),
        }
    }
}

/// A `.item()` value used as an operand, with the Python scalar kind it has.
fn item_side(imp: &Importer, arg: &Arg) -> Option<Side> {
    let (name, kind) = match arg {
        Arg::SymInt(SymIntArg::Name(s)) => (s, DType::I64),
        Arg::SymFloat(s) => (s, DType::F32),
        Arg::SymBool(s) => (s, DType::Bool),
        _ => return None,
    };
    imp.item(name).map(|v| Side::Item(v, kind))
}

fn side(imp: &mut Importer, n: &Node, name: &str) -> R<Side> {
    if let Some(item) = imp.arg(n, name).and_then(|a| item_side(imp, a)) {
        return Ok(item);
    }
    match imp.arg(n, name) {
        Some(Arg::Tensor(t)) => Ok(Side::Tensor(imp.value(t)?)),
        Some(Arg::SymInt(s)) => {
            let d = imp.sym(s)?;
            match d.as_const() {
                Some(v) => Ok(Side::Scalar(Scalar::Int(v))),
                None => Ok(Side::Sym(d)),
            }
        }
        Some(_) => Ok(Side::Scalar(imp.scalar(n, name)?)),
        None => invalid(format!("required argument `{name}` is missing")),
    }
}

/// `torch.special`'s orthogonal polynomials `(Tensor x, Tensor n)` (and
/// their `x_scalar`/`n_scalar` overloads), float results as torch computes
/// them (integer operands promoted to the output's float dtype).
pub(super) fn polynomial(name: &str) -> Option<BinaryOp> {
    Some(match name {
        "special_chebyshev_polynomial_t" => BinaryOp::ChebyshevT,
        "special_chebyshev_polynomial_u" => BinaryOp::ChebyshevU,
        "special_chebyshev_polynomial_v" => BinaryOp::ChebyshevV,
        "special_chebyshev_polynomial_w" => BinaryOp::ChebyshevW,
        "special_shifted_chebyshev_polynomial_t" => BinaryOp::ShiftedChebyshevT,
        "special_shifted_chebyshev_polynomial_u" => BinaryOp::ShiftedChebyshevU,
        "special_shifted_chebyshev_polynomial_v" => BinaryOp::ShiftedChebyshevV,
        "special_shifted_chebyshev_polynomial_w" => BinaryOp::ShiftedChebyshevW,
        "special_hermite_polynomial_h" => BinaryOp::HermiteH,
        "special_hermite_polynomial_he" => BinaryOp::HermiteHe,
        "special_laguerre_polynomial_l" => BinaryOp::LaguerreL,
        "special_legendre_polynomial_p" => BinaryOp::LegendreP,
        _ => return None,
    })
}

/// Binary ops, `.Tensor` and `.Scalar` overloads alike:
/// `aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1)`,
/// `aten::sub.Tensor(... alpha=1)`, `aten::rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1)`,
/// `aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode)`,
/// `aten::pow.Tensor_Scalar(Tensor self, Scalar exponent)`, `aten::pow.Scalar(Scalar self, Tensor exponent)`,
/// comparisons and logical ops `(Tensor self, Tensor|Scalar other)`.
pub(super) fn binary(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let (lhs_name, rhs_name) = match (name, overload) {
        ("pow", "Tensor_Scalar" | "Tensor_Tensor") => ("self", "exponent"),
        ("pow", "Scalar") => ("self", "exponent"),
        (p, _) if polynomial(p).is_some() => ("x", "n"),
        _ => ("self", "other"),
    };
    let mut a = side(imp, n, lhs_name)?;
    let mut b = side(imp, n, rhs_name)?;
    let out = imp.out_ty(n, 0)?;
    let (op, logical) = match name {
        "add" => (BinaryOp::Add, false),
        "sub" | "rsub" => (BinaryOp::Sub, false),
        "mul" => (BinaryOp::Mul, false),
        "div" => match imp.arg(n, "rounding_mode") {
            None => (BinaryOp::Div, false),
            Some(Arg::Str(m)) if m == "floor" => (BinaryOp::FloorDiv, false),
            Some(Arg::Str(m)) if m == "trunc" => return trunc_div(imp, n, a, b, &out),
            Some(other) => return unsupported(format!("div rounding_mode {other:?}")),
        },
        "floor_divide" => (BinaryOp::FloorDiv, false),
        "remainder" => (BinaryOp::Rem, false),
        "pow" => (BinaryOp::Pow, false),
        "maximum" => (BinaryOp::Max, false),
        "minimum" => (BinaryOp::Min, false),
        "eq" => (BinaryOp::Eq, false),
        "ne" => (BinaryOp::Ne, false),
        "lt" => (BinaryOp::Lt, false),
        "le" => (BinaryOp::Le, false),
        "gt" => (BinaryOp::Gt, false),
        "ge" => (BinaryOp::Ge, false),
        "logical_and" => (BinaryOp::And, true),
        "logical_or" => (BinaryOp::Or, true),
        "logical_xor" => (BinaryOp::Xor, true),
        "bitwise_and" => (BinaryOp::And, false),
        "bitwise_or" => (BinaryOp::Or, false),
        "bitwise_xor" => (BinaryOp::Xor, false),
        "atan2" | "arctan2" => (BinaryOp::Atan2, false),
        "fmod" => (BinaryOp::Fmod, false),
        "special_zeta" => (BinaryOp::Zeta, false),
        "igamma" | "special_gammainc" => (BinaryOp::Igamma, false),
        "igammac" | "special_gammaincc" => (BinaryOp::Igammac, false),
        "nextafter" => (BinaryOp::Nextafter, false),
        "bitwise_left_shift" | "__lshift__" => return shift(imp, n, a, b, &out, true),
        "bitwise_right_shift" | "__rshift__" => return shift(imp, n, a, b, &out, false),
        _ => match polynomial(name) {
            Some(op) => (op, false),
            None => return Err(crate::import::importer::Fail::Unsupported(None)),
        },
    };
    if name == "rsub" {
        std::mem::swap(&mut a, &mut b);
    }
    // The dtype both operands are cast to: comparisons promote their inputs,
    // logical ops read them as bool, everything else computes in the output
    // dtype (tensor_values already applied torch's promotion).
    let compute = if logical {
        DType::Bool
    } else if op.is_comparison() {
        result_type(&[a.operand(imp), b.operand(imp)], DType::F32)
    } else {
        out.dtype
    };
    if op == BinaryOp::Nextafter && !compute.is_float() {
        return unsupported(format!("nextafter on {compute} (torch steps floats only)"));
    }
    if matches!(name, "bitwise_and" | "bitwise_or" | "bitwise_xor") && !(compute == DType::Bool || compute.is_int()) {
        return unsupported(format!("bitwise ops on {compute}"));
    }
    if let (Side::Scalar(e), "pow", "Tensor_Scalar", DType::F32 | DType::F64) = (&b, name, overload, compute) {
        let x = a.value(imp, compute);
        if let Some(v) = pow_by_scalar(imp, x, e.as_f64())? {
            let v = imp.cast(v, out.dtype);
            return imp.bind(n, 0, v);
        }
    }
    let av = a.value(imp, compute);
    let mut bv = b.value(imp, compute);
    // aten::add/sub(..., alpha): self ± alpha * other (rsub: other - alpha * self).
    if matches!(name, "add" | "sub" | "rsub") {
        let alpha = imp.opt_scalar(n, "alpha")?.unwrap_or(Scalar::Int(1));
        if alpha.as_f64() != 1.0 {
            let k = imp.scalar_const(alpha, compute);
            let shape = imp.ty(bv).shape.clone();
            bv = imp.push_typed(Op::Binary(BinaryOp::Mul), vec![bv, k], TensorType::new(compute, shape));
        }
    }
    let result_dtype = if op.is_comparison() { DType::Bool } else { compute };
    let v = imp.push_typed(Op::Binary(op), vec![av, bv], TensorType::new(result_dtype, out.shape.clone()));
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `pow.Tensor_Scalar` as torch's CPU kernel computes it on f32/f64
/// (`PowKernel.cpp`): exponents 0.5, -0.5 and -1 are `sqrt`, `rsqrt` and
/// `reciprocal`, and 2, 3 and -2 are `x·x`, `x·x·x` and `1 / (x·x)` —
/// never `pow` itself. The same operations give torch's bits (its `sqrt`
/// is MKL's on x86-64, an ulp from IEEE's at times), and a multiply is
/// what the fused kernels vectorise (GPT-2's tanh GELU cubes
/// its input: as `powf` that was 30 % of the model). `None`: any other
/// exponent, which torch sends to `pow`.
fn pow_by_scalar(imp: &mut Importer, x: ValueId, e: f64) -> R<Option<ValueId>> {
    let unary = |imp: &mut Importer, op: UnaryOp, v: ValueId| imp.push(Op::Unary(op), vec![v]);
    let mul = |imp: &mut Importer, a: ValueId, b: ValueId| imp.push(Op::Binary(BinaryOp::Mul), vec![a, b]);
    let v = if e == 0.5 {
        unary(imp, UnaryOp::Sqrt, x)?
    } else if e == -0.5 {
        unary(imp, UnaryOp::Rsqrt, x)?
    } else if e == -1.0 {
        unary(imp, UnaryOp::Reciprocal, x)?
    } else if e == 2.0 {
        mul(imp, x, x)?
    } else if e == 3.0 {
        let square = mul(imp, x, x)?;
        mul(imp, square, x)?
    } else if e == -2.0 {
        let square = mul(imp, x, x)?;
        unary(imp, UnaryOp::Reciprocal, square)?
    } else {
        return Ok(None);
    };
    Ok(Some(v))
}

/// `aten::bitwise_left_shift.Tensor(Tensor self, Tensor other)` (and
/// `.Tensor_Scalar`, `.Scalar_Tensor`, `__lshift__`), `bitwise_right_shift`
/// and `__rshift__` likewise, on integers in the promoted dtype. The IR has
/// no shift, so it is arithmetic by a power of two, with torch's CPU kernel's
/// answer for shifts outside `0..bits`: a left shift is `a * 2^b` (wrapping
/// multiplication drops the high bits as the shift does) and 0 out of range;
/// a right shift is `floor(a / 2^b)` (arithmetic for signed types), and out
/// of range torch shifts by `bits - 1` on signed types (-1 or 0 by sign) and
/// gives 0 on unsigned ones. The power is clamped into range so that it is
/// always a valid divisor; a `where` picks the out-of-range answer.
fn shift(imp: &mut Importer, n: &Node, a: Side, b: Side, out: &TensorType, left: bool) -> R<()> {
    let dtype = out.dtype;
    if !dtype.is_int() {
        return unsupported(format!("bit shifts on {dtype} (torch shifts integers only)"));
    }
    let signed = !matches!(dtype, DType::U8);
    let bits = 8 * dtype.size_bytes() as i64;
    let (av, bv) = (a.value(imp, dtype), b.value(imp, dtype));
    // The largest shift computed arithmetically: 2^(bits-1) wraps to the
    // sign bit, right for a multiplication but not as a signed divisor.
    let max_shift = if left || !signed { bits - 1 } else { bits - 2 };
    let exponent = imp.push(Op::Clamp { min: Some(0.0), max: Some(max_shift as f64) }, vec![bv])?;
    let exponent = imp.cast(exponent, DType::I64);
    // 2^k for k in 0..=max_shift, read from a table: exact in every dtype
    // (2^(bits-1) is the sign bit) without relying on integer `pow`.
    let powers: Vec<u8> = (0..=max_shift)
        .flat_map(|k| crate::import::importer::scalar_bytes(Scalar::Int(1i64.wrapping_shl(k as u32)), dtype))
        .collect();
    let table = imp.g.add_const(None, TensorType::fixed(dtype, &[max_shift + 1]), kiln_ir::ConstBytes::owned(powers));
    let power = imp.push(Op::Gather { axis: 0 }, vec![table, exponent])?;
    let shifted = imp.push(Op::Binary(if left { BinaryOp::Mul } else { BinaryOp::FloorDiv }), vec![av, power])?;
    let lo = imp.with_scalar(BinaryOp::Ge, bv, 0.0)?;
    let hi = imp.with_scalar(BinaryOp::Le, bv, max_shift as f64)?;
    let in_range = imp.push(Op::Binary(BinaryOp::And), vec![lo, hi])?;
    let fallback = if !left && signed {
        // a >> (bits - 1): all ones for negative a, zero otherwise.
        let negative = imp.with_scalar(BinaryOp::Lt, av, 0.0)?;
        let minus_one = imp.scalar_const(Scalar::Int(-1), dtype);
        let zero = imp.scalar_const(Scalar::Int(0), dtype);
        imp.push(Op::Where, vec![negative, minus_one, zero])?
    } else {
        imp.scalar_const(Scalar::Int(0), dtype)
    };
    let v = imp.push(Op::Where, vec![in_range, shifted, fallback])?;
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out.clone())
    };
    imp.bind(n, 0, v)
}

/// `div(rounding_mode='trunc')` on floats: `sign(q) * floor(|q|)`.
fn trunc_div(imp: &mut Importer, n: &Node, a: Side, b: Side, out: &TensorType) -> R<()> {
    let (av, bv) = (a.value(imp, out.dtype), b.value(imp, out.dtype));
    if out.dtype.is_int() {
        // a - fmod(a, b) is a multiple of b, so flooring its quotient is exact.
        let r = imp.push_typed(Op::Binary(BinaryOp::Fmod), vec![av, bv], out.clone());
        let m = imp.push_typed(Op::Binary(BinaryOp::Sub), vec![av, r], out.clone());
        let v = imp.push_typed(Op::Binary(BinaryOp::FloorDiv), vec![m, bv], out.clone());
        return imp.bind(n, 0, v);
    }
    if !out.dtype.is_float() {
        return unsupported(format!("division with rounding_mode='trunc' on {}", out.dtype));
    }
    let q = imp.push_typed(Op::Binary(BinaryOp::Div), vec![av, bv], out.clone());
    let v = imp.push_typed(Op::Unary(UnaryOp::Trunc), vec![q], out.clone());
    imp.bind(n, 0, v)
}

/// `aten::where.self(Tensor condition, Tensor self, Tensor other)`
pub(super) fn where_(imp: &mut Importer, n: &Node) -> R<()> {
    let cond = imp.tensor(n, "condition")?;
    let cond = imp.cast(cond, DType::Bool);
    let out = imp.out_ty(n, 0)?.dtype;
    let a = side(imp, n, "self")?.value(imp, out);
    let b = side(imp, n, "other")?.value(imp, out);
    imp.emit(n, Op::Where, vec![cond, a, b])?;
    Ok(())
}

/// `aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value)`
/// `aten::masked_fill.Tensor(Tensor self, Tensor mask, Tensor value)` (0-d value)
pub(super) fn masked_fill(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let mask = imp.tensor(n, "mask")?;
    let mask = imp.cast(mask, DType::Bool);
    let out = imp.out_ty(n, 0)?.dtype;
    let fill = side(imp, n, "value")?.value(imp, out);
    let x = imp.cast(x, out);
    imp.emit(n, Op::Where, vec![mask, fill, x])?;
    Ok(())
}

/// `aten::softmax.int(Tensor self, int dim, ScalarType? dtype=None)`
/// `aten::_softmax(Tensor self, int dim, bool half_to_float)` (and the log variants)
pub(super) fn softmax(imp: &mut Importer, n: &Node, log: bool) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dim = imp.int(n, "dim", None)?;
    let out = imp.out_ty(n, 0)?;
    // A 0-d tensor is a one-element row (dim 0 or -1), as in torch.
    let scalar = out.rank() == 0;
    let axis = normalize_axis(dim, out.rank().max(1))?;
    // `dtype=` and `half_to_float` both mean "compute in the output dtype".
    let x = imp.cast(x, out.dtype);
    let x = if scalar { imp.push(Op::Reshape { shape: vec![kiln_ir::Dim::Const(1)] }, vec![x])? } else { x };
    let op = if log { Op::LogSoftmax { axis } } else { Op::Softmax { axis } };
    if !scalar {
        imp.emit(n, op, vec![x])?;
        return Ok(());
    }
    let y = imp.push(op, vec![x])?;
    let y = imp.push_typed(Op::Reshape { shape: Vec::new() }, vec![y], out);
    imp.bind(n, 0, y)
}

/// `aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)`
/// `aten::sum.dim_IntList(...)` (same), `aten::sum(Tensor self, *, ScalarType? dtype=None)`,
/// `aten::amax/amin(Tensor self, int[1] dim=[], bool keepdim=False)`,
/// `aten::prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None)`,
/// `aten::any.dim(Tensor self, int dim, bool keepdim=False)`, `aten::any.dims(Tensor self, int[1]? dim=None, bool keepdim=False)`
pub(super) fn reduce(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let dims =
        if overload == "default" && name != "amax" && name != "amin" { Vec::new() } else { imp.ints(n, "dim", &[])? };
    // An empty (or omitted) dim list reduces every axis.
    let mut axes = if dims.is_empty() {
        (0..rank).collect::<Vec<_>>()
    } else {
        dims.iter().map(|&d| normalize_axis(d, rank.max(1))).collect::<R<Vec<_>>>()?
    };
    axes.sort_unstable();
    axes.dedup();
    let keep_dims = imp.bool(n, "keepdim", false)?;
    let out = imp.out_ty(n, 0)?;
    let kind = match name {
        "mean" => ReduceKind::Mean,
        "sum" => ReduceKind::Sum,
        "amax" => ReduceKind::Max,
        "amin" => ReduceKind::Min,
        "prod" => ReduceKind::Prod,
        // any(x) == max(x != 0) over bool.
        _ => ReduceKind::Max,
    };
    let x = if name == "any" { imp.cast(x, DType::Bool) } else { imp.cast(x, out.dtype) };
    let v = if rank == 0 {
        x
    } else {
        let shape = out.shape.clone();
        let dtype = imp.ty(x).dtype;
        imp.push_typed(Op::Reduce { kind, axes, keep_dims }, vec![x], TensorType::new(dtype, shape))
    };
    // `any` of a uint8 tensor is uint8 in torch (0 or 1), bool otherwise.
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `aten::argmax(Tensor self, int? dim=None, bool keepdim=False)`
pub(super) fn argmax(imp: &mut Importer, n: &Node) -> R<()> {
    let mut x = imp.tensor(n, "self")?;
    let keep_dims = imp.bool(n, "keepdim", false)?;
    let out = imp.out_ty(n, 0)?;
    let axis = match imp.opt_int(n, "dim")? {
        Some(d) if imp.ty(x).rank() > 0 => normalize_axis(d, imp.ty(x).rank())?,
        _ => {
            // Over the flattened tensor, then shaped as the output says.
            let ty = imp.ty(x).clone();
            let flat = TensorType::new(ty.dtype, vec![ty.numel()]);
            x = imp.push_typed(Op::Reshape { shape: flat.shape.clone() }, vec![x], flat);
            let idx_ty = TensorType::new(out.dtype, Vec::new());
            let v = imp.push_typed(Op::ArgMax { axis: 0, keep_dims: false }, vec![x], idx_ty);
            let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
            return imp.bind(n, 0, v);
        }
    };
    imp.emit(n, Op::ArgMax { axis, keep_dims }, vec![x])?;
    Ok(())
}
