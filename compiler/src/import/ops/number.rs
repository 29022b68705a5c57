//! Number-theoretic and floating-point representation ops: `gcd`/`lcm`
//! (Euclid's algorithm, unrolled to its worst case for the dtype), `frexp`
//! and `ldexp` (powers of two).

use crate::import::importer::{invalid, output_names, unsupported, Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Op, UnaryOp as U, ValueId};

fn bin(imp: &mut Importer, op: B, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.push(Op::Binary(op), vec![a, b])
}

fn un(imp: &mut Importer, op: U, x: ValueId) -> R<ValueId> {
    imp.push(Op::Unary(op), vec![x])
}

fn select(imp: &mut Importer, cond: ValueId, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.push(Op::Where, vec![cond, a, b])
}

/// The most steps Euclid's loop takes on `dtype`'s values: Lamé's bound
/// (log_φ(√5·max)) for the largest magnitude, one step for the first swap
/// and one to spare.
fn euclid_steps(dtype: DType) -> Option<usize> {
    Some(match dtype {
        DType::I64 => 95,
        DType::I32 => 49,
        DType::I16 => 26,
        DType::I8 => 14,
        DType::U8 => 16,
        _ => return None,
    })
}

/// torch's `calc_gcd`: `a, b = |a|, |b|; while a != 0: a, b = b % a, a`
/// with C's remainder, unrolled (finished lanes stay put); `b` at the end.
fn gcd_value(imp: &mut Importer, x: ValueId, y: ValueId, dtype: DType) -> R<ValueId> {
    let Some(steps) = euclid_steps(dtype) else {
        return unsupported(format!("gcd/lcm of {dtype} (integers only)"));
    };
    let zero = imp.scalar_const(Scalar::Int(0), dtype);
    let one = imp.scalar_const(Scalar::Int(1), dtype);
    let mut a = un(imp, U::Abs, x)?;
    let mut b = un(imp, U::Abs, y)?;
    for _ in 0..steps {
        let live = bin(imp, B::Ne, a, zero)?;
        let divisor = select(imp, live, a, one)?;
        let rem = bin(imp, B::Fmod, b, divisor)?;
        b = select(imp, live, a, b)?;
        a = select(imp, live, rem, a)?;
    }
    Ok(b)
}

/// `aten::gcd(Tensor self, Tensor other)` and `aten::lcm(Tensor self, Tensor other)`:
/// lcm is `g == 0 ? 0 : |a / g · b|` (wrapping, as torch's `calc_lcm`).
pub(super) fn gcd_lcm(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let x = imp.tensor(n, "self")?;
    let y = imp.tensor(n, "other")?;
    let (x, y) = (imp.cast(x, out.dtype), imp.cast(y, out.dtype));
    let g = gcd_value(imp, x, y, out.dtype)?;
    let v = if name == "gcd" {
        g
    } else {
        let zero = imp.scalar_const(Scalar::Int(0), out.dtype);
        let one = imp.scalar_const(Scalar::Int(1), out.dtype);
        let live = bin(imp, B::Ne, g, zero)?;
        let divisor = select(imp, live, g, one)?;
        // g divides a exactly, so floor division is torch's truncating `/`.
        let q = bin(imp, B::FloorDiv, x, divisor)?;
        let p = bin(imp, B::Mul, q, y)?;
        let p = un(imp, U::Abs, p)?;
        select(imp, live, p, zero)?
    };
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out)
    };
    imp.bind(n, 0, v)
}

/// `aten::frexp.Tensor(Tensor self) -> (Tensor mantissa, Tensor exponent)`:
/// `x = m · 2^e` with `0.5 <= |m| < 1` and an i32 exponent, as C's `frexp`
/// (zero, ±inf and NaN keep their value with exponent 0). Computed in f64,
/// where every f32/f16/bf16 value is normal: `e` from `log2` and corrected
/// by one step either way, `2^-e` applied in two halves so that f64's
/// subnormals do not overflow it. The mantissa keeps the input's bits, so
/// rounding it back to the dtype is exact.
pub(super) fn frexp(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dtype = imp.ty(x).dtype;
    if !dtype.is_float() {
        return unsupported(format!("frexp of {dtype} (floats only, as in torch)"));
    }
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    if names.len() != 2 {
        return invalid("frexp must have two outputs");
    }
    let f = DType::F64;
    let c = |imp: &mut Importer, v: f64| imp.scalar_const(Scalar::Float(v), f);
    let x64 = imp.cast(x, f);
    let ax = un(imp, U::Abs, x64)?;
    let (zero, inf, one, two, half) = (c(imp, 0.0), c(imp, f64::INFINITY), c(imp, 1.0), c(imp, 2.0), c(imp, 0.5));
    let positive = bin(imp, B::Gt, ax, zero)?;
    let bounded = bin(imp, B::Lt, ax, inf)?;
    let finite = bin(imp, B::And, positive, bounded)?;
    let safe = select(imp, finite, ax, one)?;
    let log = un(imp, U::Log2, safe)?;
    let e = un(imp, U::Floor, log)?;
    let mut e = bin(imp, B::Add, e, one)?;
    // m = safe · 2^h · 2^(-e - h), h = ⌊-e / 2⌋.
    let minus_e = un(imp, U::Neg, e)?;
    let h = bin(imp, B::Mul, minus_e, half)?;
    let h = un(imp, U::Floor, h)?;
    let rest = bin(imp, B::Sub, minus_e, h)?;
    let s1 = bin(imp, B::Pow, two, h)?;
    let s2 = bin(imp, B::Pow, two, rest)?;
    let m = bin(imp, B::Mul, safe, s1)?;
    let mut m = bin(imp, B::Mul, m, s2)?;
    // log2's rounding near powers of two: one step either way.
    let big = bin(imp, B::Ge, m, one)?;
    let (m_down, e_up) = (bin(imp, B::Mul, m, half)?, bin(imp, B::Add, e, one)?);
    m = select(imp, big, m_down, m)?;
    e = select(imp, big, e_up, e)?;
    let small = bin(imp, B::Lt, m, half)?;
    let (m_up, e_down) = (bin(imp, B::Mul, m, two)?, bin(imp, B::Sub, e, one)?);
    m = select(imp, small, m_up, m)?;
    e = select(imp, small, e_down, e)?;
    let negative = bin(imp, B::Lt, x64, zero)?;
    let neg_m = un(imp, U::Neg, m)?;
    let signed = select(imp, negative, neg_m, m)?;
    if imp.is_used(&names[0]) {
        let mantissa = select(imp, finite, signed, x64)?;
        let ty = imp.out_ty(n, 0)?;
        let mantissa = imp.cast(mantissa, ty.dtype);
        imp.bind(n, 0, mantissa)?;
    }
    if imp.is_used(&names[1]) {
        let exponent = select(imp, finite, e, zero)?;
        let ty = imp.out_ty(n, 1)?;
        let exponent = imp.cast(exponent, ty.dtype);
        imp.bind(n, 1, exponent)?;
    }
    Ok(())
}

/// `aten::ldexp.Tensor(Tensor self, Tensor other)`: `self · 2^other` in the
/// output dtype (powers of two are exact there).
pub(super) fn ldexp(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    if !out.dtype.is_float() {
        return unsupported(format!("ldexp with output dtype {}", out.dtype));
    }
    let x = imp.tensor(n, "self")?;
    let e = imp.tensor(n, "other")?;
    let (x, e) = (imp.cast(x, out.dtype), imp.cast(e, out.dtype));
    let two = imp.scalar_const(Scalar::Float(2.0), out.dtype);
    let p = bin(imp, B::Pow, two, e)?;
    let v = bin(imp, B::Mul, x, p)?;
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out)
    };
    imp.bind(n, 0, v)
}
