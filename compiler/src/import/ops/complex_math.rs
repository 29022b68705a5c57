//! Complex elementwise math on (real, imaginary) parts: the roots, logarithms,
//! trigonometric and hyperbolic functions and their inverses, `pow`,
//! `sigmoid`, `sgn`, the float-class tests and equality, as torch applies
//! them to complex64/complex128 tensors.
//!
//! Every function here is computed in f64 and its parts cast back to the
//! output's part dtype. For complex64 that is what keeps the textbook
//! formulas within torch's tolerances of libstdc++'s (glibc's) complex
//! functions: their cancellations (`iz + √(1−z²)` in `asin`, `|z| − 1` in
//! `log`) cost a few of f64's 53 bits, not f32's 24. The inverse functions
//! use Kahan's forms ("Branch cuts for complex elementary functions", 1987),
//! which put the branch cuts where C99 and torch put them. Complex128 gets
//! the same formulas in its own precision.

use crate::import::importer::{unsupported, Importer, Scalar, COMPLEX_SCOPE, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Op, UnaryOp as U, ValueId};

use super::fft::{bind_out, bind_real, complex_input, operand, Parts};

/// The dtype complex math runs in.
pub(super) const WORK: DType = DType::F64;

/// A complex value as two f64 parts.
#[derive(Clone, Copy)]
pub(super) struct Z {
    pub(super) re: ValueId,
    pub(super) im: ValueId,
}

/// Unary complex functions computed here, by their ATen names.
pub(super) const UNARY: &[&str] = &[
    "sqrt",
    "rsqrt",
    "reciprocal",
    "log",
    "log2",
    "log10",
    "log1p",
    "exp2",
    "expm1",
    "sin",
    "cos",
    "tan",
    "sinh",
    "cosh",
    "tanh",
    "asin",
    "acos",
    "atan",
    "asinh",
    "acosh",
    "atanh",
    "arcsin",
    "arccos",
    "arctan",
    "arcsinh",
    "arccosh",
    "arctanh",
    "sigmoid",
    "sgn",
    "sinc",
    "silu",
    "square",
];

/// Converts `n` if it is one of the ops here; `None` when it is not.
pub(super) fn convert(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> Option<R<()>> {
    Some(match name {
        _ if UNARY.contains(&name) => unary(imp, n, name),
        "isnan" | "isinf" | "isfinite" | "isreal" | "isposinf" | "isneginf" => float_class(imp, n, name),
        "eq" | "ne" => equality(imp, n, name),
        "where" => select(imp, n),
        "pow" => pow(imp, n, overload),
        "prod" | "cumprod" => products_along(imp, n, name),
        _ => return None,
    })
}

// ------------------------------------------------------------------ builder

/// The f64 parts of a complex (or real) operand.
pub(super) fn widen(imp: &mut Importer, z: Parts) -> R<Z> {
    let re = imp.cast(z.re, WORK);
    let im = match z.im {
        Some(im) => imp.cast(im, WORK),
        // Zeros of re's shape (`re · 0` would be NaN for infinite parts).
        None => {
            let ty = imp.ty(re).clone();
            imp.push_typed(Op::Full { value: 0.0, dtype: WORK, shape: ty.shape.clone() }, Vec::new(), ty)
        }
    };
    Ok(Z { re, im })
}

pub(super) fn u(imp: &mut Importer, op: U, x: ValueId) -> R<ValueId> {
    imp.push(Op::Unary(op), vec![x])
}

pub(super) fn b(imp: &mut Importer, op: B, x: ValueId, y: ValueId) -> R<ValueId> {
    imp.push(Op::Binary(op), vec![x, y])
}

/// `x op c` with an f64 constant `c`.
pub(super) fn bk(imp: &mut Importer, op: B, x: ValueId, c: f64) -> R<ValueId> {
    imp.with_scalar(op, x, c)
}

/// `c op x` with an f64 constant `c`.
fn kb(imp: &mut Importer, c: f64, op: B, x: ValueId) -> R<ValueId> {
    let k = imp.scalar_const(Scalar::Float(c), imp.ty(x).dtype);
    b(imp, op, k, x)
}

pub(super) fn sel(imp: &mut Importer, cond: ValueId, x: ValueId, y: ValueId) -> R<ValueId> {
    imp.push(Op::Where, vec![cond, x, y])
}

pub(super) fn z_mul(imp: &mut Importer, x: Z, y: Z) -> R<Z> {
    let ac = b(imp, B::Mul, x.re, y.re)?;
    let bd = b(imp, B::Mul, x.im, y.im)?;
    let ad = b(imp, B::Mul, x.re, y.im)?;
    let bc = b(imp, B::Mul, x.im, y.re)?;
    Ok(Z { re: b(imp, B::Sub, ac, bd)?, im: b(imp, B::Add, ad, bc)? })
}

/// `x / y` as `x · conj(y) / |y|²` (f64: |y|² overflows only past 1e154).
fn z_div(imp: &mut Importer, x: Z, y: Z) -> R<Z> {
    let den = norm2(imp, y)?;
    let neg = u(imp, U::Neg, y.im)?;
    let num = z_mul(imp, x, Z { re: y.re, im: neg })?;
    Ok(Z { re: b(imp, B::Div, num.re, den)?, im: b(imp, B::Div, num.im, den)? })
}

/// `1 / z`: torch's `(x, −y) / (x² + y²)` (NaN parts at zero, as torch).
fn z_recip(imp: &mut Importer, z: Z) -> R<Z> {
    let den = norm2(imp, z)?;
    let neg = u(imp, U::Neg, z.im)?;
    Ok(Z { re: b(imp, B::Div, z.re, den)?, im: b(imp, B::Div, neg, den)? })
}

pub(super) fn norm2(imp: &mut Importer, z: Z) -> R<ValueId> {
    let xx = b(imp, B::Mul, z.re, z.re)?;
    let yy = b(imp, B::Mul, z.im, z.im)?;
    b(imp, B::Add, xx, yy)
}

pub(super) fn modulus(imp: &mut Importer, z: Z) -> R<ValueId> {
    let n = norm2(imp, z)?;
    u(imp, U::Sqrt, n)
}

/// `i · z`.
fn times_i(imp: &mut Importer, z: Z) -> R<Z> {
    Ok(Z { re: u(imp, U::Neg, z.im)?, im: z.re })
}

/// `−i · z`.
fn times_minus_i(imp: &mut Importer, z: Z) -> R<Z> {
    Ok(Z { re: z.im, im: u(imp, U::Neg, z.re)? })
}

fn scale(imp: &mut Importer, z: Z, c: f64) -> R<Z> {
    Ok(Z { re: bk(imp, B::Mul, z.re, c)?, im: bk(imp, B::Mul, z.im, c)? })
}

fn plus_real(imp: &mut Importer, z: Z, c: f64) -> R<Z> {
    Ok(Z { re: bk(imp, B::Add, z.re, c)?, im: z.im })
}

/// `c − z` for a real `c`.
fn real_minus(imp: &mut Importer, c: f64, z: Z) -> R<Z> {
    Ok(Z { re: kb(imp, c, B::Sub, z.re)?, im: u(imp, U::Neg, z.im)? })
}

// ---------------------------------------------------------------- functions

/// The principal square root, without cancellation: with `s = √((|z| + |x|)/2)`,
/// `√z = (s, y/2s)` for `x ≥ 0` and `(|y|/2s, ±s)` (the sign of `y`) otherwise.
fn z_sqrt(imp: &mut Importer, z: Z) -> R<Z> {
    let r = modulus(imp, z)?;
    let ax = u(imp, U::Abs, z.re)?;
    let sum = b(imp, B::Add, r, ax)?;
    let half = bk(imp, B::Mul, sum, 0.5)?;
    let s = u(imp, U::Sqrt, half)?;
    let two_s = bk(imp, B::Mul, s, 2.0)?;
    let d = b(imp, B::Div, z.im, two_s)?;
    // √0 keeps the zero's imaginary part (0/0 would be NaN).
    let s_zero = bk(imp, B::Eq, s, 0.0)?;
    let d = sel(imp, s_zero, z.im, d)?;
    let right = bk(imp, B::Ge, z.re, 0.0)?;
    let ad = u(imp, U::Abs, d)?;
    let neg_s = u(imp, U::Neg, s)?;
    let y_neg = bk(imp, B::Lt, z.im, 0.0)?;
    let signed_s = sel(imp, y_neg, neg_s, s)?;
    Ok(Z { re: sel(imp, right, s, ad)?, im: sel(imp, right, d, signed_s)? })
}

/// `ln z = (ln |z|, atan2(y, x))`.
pub(super) fn z_log(imp: &mut Importer, z: Z) -> R<Z> {
    let r = modulus(imp, z)?;
    Ok(Z { re: u(imp, U::Log, r)?, im: b(imp, B::Atan2, z.im, z.re)? })
}

/// `e^z = e^x (cos y, sin y)`.
pub(super) fn z_exp(imp: &mut Importer, z: Z) -> R<Z> {
    let m = u(imp, U::Exp, z.re)?;
    let c = u(imp, U::Cos, z.im)?;
    let s = u(imp, U::Sin, z.im)?;
    Ok(Z { re: b(imp, B::Mul, m, c)?, im: b(imp, B::Mul, m, s)? })
}

/// `(f(x)·g(y), h(x)·k(y))`: the sin/cos/sinh/cosh products.
fn products(imp: &mut Importer, z: Z, [f, g, h, k]: [U; 4], negate_im: bool) -> R<Z> {
    let (fx, gy) = (u(imp, f, z.re)?, u(imp, g, z.im)?);
    let (hx, ky) = (u(imp, h, z.re)?, u(imp, k, z.im)?);
    let re = b(imp, B::Mul, fx, gy)?;
    let mut im = b(imp, B::Mul, hx, ky)?;
    if negate_im {
        im = u(imp, U::Neg, im)?;
    }
    Ok(Z { re, im })
}

/// `tan z = (sin 2x, sinh 2y) / (cos 2x + cosh 2y)`; `tanh` is `−i tan(iz)`,
/// `(sinh 2x, sin 2y) / (cosh 2x + cos 2y)`.
fn tan_like(imp: &mut Importer, z: Z, hyperbolic: bool) -> R<Z> {
    let x2 = bk(imp, B::Mul, z.re, 2.0)?;
    let y2 = bk(imp, B::Mul, z.im, 2.0)?;
    let [sx, cx, sy, cy] =
        if hyperbolic { [U::Sinh, U::Cosh, U::Sin, U::Cos] } else { [U::Sin, U::Cos, U::Sinh, U::Cosh] };
    let num_re = u(imp, sx, x2)?;
    let num_im = u(imp, sy, y2)?;
    let c1 = u(imp, cx, x2)?;
    let c2 = u(imp, cy, y2)?;
    let den = b(imp, B::Add, c1, c2)?;
    Ok(Z { re: b(imp, B::Div, num_re, den)?, im: b(imp, B::Div, num_im, den)? })
}

/// Kahan's `asin z = (atan2(x, Re(√(1−z)·√(1+z))), asinh Im(conj(√(1−z))·√(1+z)))`.
fn z_asin(imp: &mut Importer, z: Z) -> R<Z> {
    let one_minus = real_minus(imp, 1.0, z)?;
    let one_plus = plus_real(imp, z, 1.0)?;
    let p = z_sqrt(imp, one_minus)?;
    let q = z_sqrt(imp, one_plus)?;
    // Re(p·q) = pr·qr − pi·qi; Im(conj(p)·q) = pr·qi − pi·qr.
    let a = b(imp, B::Mul, p.re, q.re)?;
    let c = b(imp, B::Mul, p.im, q.im)?;
    let re_pq = b(imp, B::Sub, a, c)?;
    let d = b(imp, B::Mul, p.re, q.im)?;
    let e = b(imp, B::Mul, p.im, q.re)?;
    let im_cpq = b(imp, B::Sub, d, e)?;
    Ok(Z { re: b(imp, B::Atan2, z.re, re_pq)?, im: u(imp, U::Asinh, im_cpq)? })
}

/// Kahan's `acos z = (2 atan2(Re √(1−z), Re √(1+z)), asinh Im(conj(√(1+z))·√(1−z)))`.
fn z_acos(imp: &mut Importer, z: Z) -> R<Z> {
    let one_minus = real_minus(imp, 1.0, z)?;
    let one_plus = plus_real(imp, z, 1.0)?;
    let p = z_sqrt(imp, one_minus)?;
    let q = z_sqrt(imp, one_plus)?;
    let angle = b(imp, B::Atan2, p.re, q.re)?;
    // Im(conj(q)·p) = qr·pi − qi·pr.
    let d = b(imp, B::Mul, q.re, p.im)?;
    let e = b(imp, B::Mul, q.im, p.re)?;
    let im = b(imp, B::Sub, d, e)?;
    Ok(Z { re: bk(imp, B::Mul, angle, 2.0)?, im: u(imp, U::Asinh, im)? })
}

/// Kahan's `acosh z = (asinh Re(conj(√(z−1))·√(z+1)), 2 atan2(Im √(z−1), Re √(z+1)))`.
fn z_acosh(imp: &mut Importer, z: Z) -> R<Z> {
    let minus = plus_real(imp, z, -1.0)?;
    let plus = plus_real(imp, z, 1.0)?;
    let p = z_sqrt(imp, minus)?;
    let q = z_sqrt(imp, plus)?;
    // Re(conj(p)·q) = pr·qr + pi·qi.
    let a = b(imp, B::Mul, p.re, q.re)?;
    let c = b(imp, B::Mul, p.im, q.im)?;
    let re = b(imp, B::Add, a, c)?;
    let angle = b(imp, B::Atan2, p.im, q.re)?;
    Ok(Z { re: u(imp, U::Asinh, re)?, im: bk(imp, B::Mul, angle, 2.0)? })
}

/// `atanh z = (¼ log1p(4x / ((1−x)² + y²)), ½ atan2(2y, (1−x)(1+x) − y²))`.
fn z_atanh(imp: &mut Importer, z: Z) -> R<Z> {
    let one_minus_x = kb(imp, 1.0, B::Sub, z.re)?;
    let one_plus_x = bk(imp, B::Add, z.re, 1.0)?;
    let yy = b(imp, B::Mul, z.im, z.im)?;
    let sq = b(imp, B::Mul, one_minus_x, one_minus_x)?;
    let den = b(imp, B::Add, sq, yy)?;
    let four_x = bk(imp, B::Mul, z.re, 4.0)?;
    let ratio = b(imp, B::Div, four_x, den)?;
    let l = u(imp, U::Log1p, ratio)?;
    let prod = b(imp, B::Mul, one_minus_x, one_plus_x)?;
    let den2 = b(imp, B::Sub, prod, yy)?;
    let two_y = bk(imp, B::Mul, z.im, 2.0)?;
    let angle = b(imp, B::Atan2, two_y, den2)?;
    Ok(Z { re: bk(imp, B::Mul, l, 0.25)?, im: bk(imp, B::Mul, angle, 0.5)? })
}

/// `ln(1 + z)` without losing small `z`: `(½ log1p(x(2+x) + y²), atan2(y, 1+x))`.
pub(super) fn z_log1p(imp: &mut Importer, z: Z) -> R<Z> {
    let two_x = bk(imp, B::Add, z.re, 2.0)?;
    let a = b(imp, B::Mul, z.re, two_x)?;
    let yy = b(imp, B::Mul, z.im, z.im)?;
    let s = b(imp, B::Add, a, yy)?;
    let l = u(imp, U::Log1p, s)?;
    let one_plus_x = bk(imp, B::Add, z.re, 1.0)?;
    Ok(Z { re: bk(imp, B::Mul, l, 0.5)?, im: b(imp, B::Atan2, z.im, one_plus_x)? })
}

/// `e^z − 1 = (expm1(x) cos y − 2 sin²(y/2), e^x sin y)`.
fn z_expm1(imp: &mut Importer, z: Z) -> R<Z> {
    let em1 = u(imp, U::Expm1, z.re)?;
    let c = u(imp, U::Cos, z.im)?;
    let a = b(imp, B::Mul, em1, c)?;
    let half = bk(imp, B::Mul, z.im, 0.5)?;
    let sh = u(imp, U::Sin, half)?;
    let sh2 = b(imp, B::Mul, sh, sh)?;
    let twice = bk(imp, B::Mul, sh2, 2.0)?;
    let re = b(imp, B::Sub, a, twice)?;
    let ex = u(imp, U::Exp, z.re)?;
    let s = u(imp, U::Sin, z.im)?;
    Ok(Z { re, im: b(imp, B::Mul, ex, s)? })
}

/// `sgn z = z / |z|`, zero at zero.
fn z_sgn(imp: &mut Importer, z: Z) -> R<Z> {
    let r = modulus(imp, z)?;
    let zero = bk(imp, B::Eq, r, 0.0)?;
    let one = imp.scalar_const(Scalar::Float(1.0), WORK);
    let den = sel(imp, zero, one, r)?;
    Ok(Z { re: b(imp, B::Div, z.re, den)?, im: b(imp, B::Div, z.im, den)? })
}

pub(super) fn apply(imp: &mut Importer, name: &str, z: Z) -> R<Z> {
    Ok(match name {
        "sqrt" => z_sqrt(imp, z)?,
        "rsqrt" => {
            let s = z_sqrt(imp, z)?;
            z_recip(imp, s)?
        }
        "reciprocal" => z_recip(imp, z)?,
        "log" => z_log(imp, z)?,
        "log2" => {
            let l = z_log(imp, z)?;
            scale(imp, l, std::f64::consts::LOG2_E)?
        }
        "log10" => {
            let l = z_log(imp, z)?;
            scale(imp, l, std::f64::consts::LOG10_E)?
        }
        "log1p" => z_log1p(imp, z)?,
        "exp2" => {
            let w = scale(imp, z, std::f64::consts::LN_2)?;
            z_exp(imp, w)?
        }
        "expm1" => z_expm1(imp, z)?,
        "sin" => products(imp, z, [U::Sin, U::Cosh, U::Cos, U::Sinh], false)?,
        "cos" => products(imp, z, [U::Cos, U::Cosh, U::Sin, U::Sinh], true)?,
        "sinh" => products(imp, z, [U::Sinh, U::Cos, U::Cosh, U::Sin], false)?,
        "cosh" => products(imp, z, [U::Cosh, U::Cos, U::Sinh, U::Sin], false)?,
        "tan" => tan_like(imp, z, false)?,
        "tanh" => tan_like(imp, z, true)?,
        "asin" | "arcsin" => z_asin(imp, z)?,
        "acos" | "arccos" => z_acos(imp, z)?,
        // asinh z = −i asin(iz); atan z = −i atanh(iz).
        "asinh" | "arcsinh" => {
            let iz = times_i(imp, z)?;
            let w = z_asin(imp, iz)?;
            times_minus_i(imp, w)?
        }
        "atan" | "arctan" => {
            let iz = times_i(imp, z)?;
            let w = z_atanh(imp, iz)?;
            times_minus_i(imp, w)?
        }
        "acosh" | "arccosh" => z_acosh(imp, z)?,
        "atanh" | "arctanh" => z_atanh(imp, z)?,
        // torch: 1 / (1 + e^{−z}).
        "sigmoid" => {
            let neg = Z { re: u(imp, U::Neg, z.re)?, im: u(imp, U::Neg, z.im)? };
            let e = z_exp(imp, neg)?;
            let d = plus_real(imp, e, 1.0)?;
            z_recip(imp, d)?
        }
        "sgn" => z_sgn(imp, z)?,
        // sin(πz)/(πz), 1 at zero.
        // z is πz already (see `unary`).
        "sinc" => {
            let w = z;
            let s = products(imp, w, [U::Sin, U::Cosh, U::Cos, U::Sinh], false)?;
            let q = z_div(imp, s, w)?;
            let r = modulus(imp, z)?;
            let zero = bk(imp, B::Eq, r, 0.0)?;
            let one = imp.scalar_const(Scalar::Float(1.0), WORK);
            let nil = imp.scalar_const(Scalar::Float(0.0), WORK);
            Z { re: sel(imp, zero, one, q.re)?, im: sel(imp, zero, nil, q.im)? }
        }
        // z / (1 + e^{−z}).
        "silu" => {
            let neg = Z { re: u(imp, U::Neg, z.re)?, im: u(imp, U::Neg, z.im)? };
            let e = z_exp(imp, neg)?;
            let d = plus_real(imp, e, 1.0)?;
            z_div(imp, z, d)?
        }
        "square" => z_mul(imp, z, z)?,
        other => return unsupported(format!("`{other}` on a complex value; {COMPLEX_SCOPE}")),
    })
}

fn unary(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let mut z = complex_input(imp, n, "self")?;
    if name == "sinc" {
        // torch forms πz in the value's own precision before sin(πz)/(πz).
        let dtype = imp.ty(z.re).dtype;
        let pi = imp.scalar_const(Scalar::Float(std::f64::consts::PI), dtype);
        z.re = b(imp, B::Mul, z.re, pi)?;
        if let Some(im) = z.im {
            z.im = Some(b(imp, B::Mul, im, pi)?);
        }
    }
    let w = widen(imp, z)?;
    let r = apply(imp, name, w)?;
    bind_out(imp, n, Parts { re: r.re, im: Some(r.im) })
}

// ------------------------------------------------------- tests and equality

/// `isnan`/`isinf`/`isfinite` (either part / both parts), `isreal` (a zero
/// imaginary part), `isposinf`/`isneginf` (torch refuses them on complex
/// values; kept as errors).
fn float_class(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let Some(im) = z.im else {
        return unsupported(format!("`{name}` of a real value typed complex; {COMPLEX_SCOPE}"));
    };
    let v = match name {
        "isnan" => {
            let a = b(imp, B::Ne, z.re, z.re)?;
            let c = b(imp, B::Ne, im, im)?;
            b(imp, B::Or, a, c)?
        }
        "isinf" => {
            let (ar, ai) = (u(imp, U::Abs, z.re)?, u(imp, U::Abs, im)?);
            let a = bk_same(imp, B::Eq, ar, f64::INFINITY)?;
            let c = bk_same(imp, B::Eq, ai, f64::INFINITY)?;
            b(imp, B::Or, a, c)?
        }
        "isfinite" => {
            // |x| < inf is false for NaN too.
            let (ar, ai) = (u(imp, U::Abs, z.re)?, u(imp, U::Abs, im)?);
            let a = bk_same(imp, B::Lt, ar, f64::INFINITY)?;
            let c = bk_same(imp, B::Lt, ai, f64::INFINITY)?;
            b(imp, B::And, a, c)?
        }
        "isreal" => bk_same(imp, B::Eq, im, 0.0)?,
        other => return unsupported(format!("`{other}` on a complex value (torch refuses it too)")),
    };
    bind_real(imp, n, v)
}

/// `x op c` with `c` in `x`'s own dtype.
fn bk_same(imp: &mut Importer, op: B, x: ValueId, c: f64) -> R<ValueId> {
    imp.with_scalar(op, x, c)
}

/// Argument `key` of `op` as parts: a tensor's parts as they are, a Python
/// complex number or a real scalar as f64 constants.
fn required_arg(imp: &mut Importer, n: &Node, key: &str, op: &str) -> R<Parts> {
    Ok(match imp.arg(n, key) {
        Some(Arg::Tensor(t)) => {
            let t = t.clone();
            operand(imp, &t)?
        }
        Some(&Arg::Complex(re, im)) => {
            Parts { re: imp.scalar_const(Scalar::Float(re), WORK), im: Some(imp.scalar_const(Scalar::Float(im), WORK)) }
        }
        Some(_) => {
            let s = imp.scalar(n, key)?;
            Parts { re: imp.scalar_const(s, WORK), im: None }
        }
        None => return unsupported(format!("`{op}` without `{key}`")),
    })
}

/// `eq`/`ne` with a complex operand: both parts equal / either differs.
fn equality(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let a = complex_input(imp, n, "self")?;
    let other = required_arg(imp, n, "other", name)?;
    // Compared in f64: exact for both part dtypes.
    let (x, y) = (widen(imp, a)?, widen(imp, other)?);
    let (op, join) = if name == "eq" { (B::Eq, B::And) } else { (B::Ne, B::Or) };
    let r = b(imp, op, x.re, y.re)?;
    let i = b(imp, op, x.im, y.im)?;
    let v = b(imp, join, r, i)?;
    bind_real(imp, n, v)
}

/// `where(condition, self, other)` with a complex branch: per part.
fn select(imp: &mut Importer, n: &Node) -> R<()> {
    let cond = imp.tensor(n, "condition")?;
    let x = required_arg(imp, n, "self", "where")?;
    let y = required_arg(imp, n, "other", "where")?;
    let (x, y) = (widen(imp, x)?, widen(imp, y)?);
    let re = sel(imp, cond, x.re, y.re)?;
    let im = sel(imp, cond, x.im, y.im)?;
    bind_out(imp, n, Parts { re, im: Some(im) })
}

/// The longest axis `prod`/`cumprod` take (their products are unrolled,
/// `log₂ len` levels).
pub(super) const MAX_PRODUCT_LEN: i64 = 4096;

/// `prod` (all elements, or `dim` with `keepdim`) and `cumprod(dim)` of a
/// complex tensor, in f64: a product tree and a doubling scan along the axis.
fn products_along(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let mut w = widen(imp, z)?;
    let rank = imp.ty(w.re).rank();
    let (axis, keep) = match imp.opt_int(n, "dim")? {
        Some(d) => (super::shape::normalize_axis(d, rank.max(1))?, imp.bool(n, "keepdim", false)?),
        None => {
            // Every element: flattened to one axis.
            let numel = imp.ty(w.re).numel();
            for p in [&mut w.re, &mut w.im] {
                *p = imp.push(Op::Reshape { shape: vec![numel.clone()] }, vec![*p])?;
            }
            (0, false)
        }
    };
    if imp.ty(w.re).rank() == 0 {
        return bind_out(imp, n, Parts { re: w.re, im: Some(w.im) });
    }
    let len = match imp.ty(w.re).shape[axis].as_const() {
        Some(l) if l <= MAX_PRODUCT_LEN => l,
        _ => {
            return unsupported(format!(
                "`{name}` of a complex value along an axis longer than {MAX_PRODUCT_LEN} or of dynamic size; \
                 {COMPLEX_SCOPE}"
            ))
        }
    };
    if len == 0 {
        return unsupported(format!("`{name}` of an empty complex axis; {COMPLEX_SCOPE}"));
    }
    let r = if name == "cumprod" {
        prefix_scan(imp, w, axis, len, z_mul)?
    } else {
        let p = tree_product(imp, w, axis, len)?;
        if keep {
            p
        } else {
            // The reduced axis dropped.
            let mut shape = imp.ty(p.re).shape.clone();
            shape.remove(axis);
            let re = imp.push(Op::Reshape { shape: shape.clone() }, vec![p.re])?;
            Z { re, im: imp.push(Op::Reshape { shape }, vec![p.im])? }
        }
    };
    bind_out(imp, n, Parts { re: r.re, im: Some(r.im) })
}

pub(super) fn slice_z(imp: &mut Importer, z: Z, axis: usize, (start, end, step): (i64, i64, i64)) -> R<Z> {
    let op = Op::Slice { axis, start, end, step };
    Ok(Z { re: imp.push(op.clone(), vec![z.re])?, im: imp.push(op, vec![z.im])? })
}

pub(super) fn concat_z(imp: &mut Importer, a: Z, b: Z, axis: usize) -> R<Z> {
    Ok(Z { re: imp.push(Op::Concat { axis }, vec![a.re, b.re])?, im: imp.push(Op::Concat { axis }, vec![a.im, b.im])? })
}

/// The product of the `len` slices along `axis` as a tree: each level
/// multiplies neighbours (an odd one out carried), so the expression is
/// `log₂ len` products deep — a chain would be `len` deep, and XLA's fusion
/// duplicates a complex product's operands (each part is read twice) into
/// a tree of 2^depth.
fn tree_product(imp: &mut Importer, mut z: Z, axis: usize, mut len: i64) -> R<Z> {
    while len > 1 {
        let pairs = len / 2;
        let even = slice_z(imp, z, axis, (0, 2 * pairs, 2))?;
        let odd = slice_z(imp, z, axis, (1, 2 * pairs, 2))?;
        let mut next = z_mul(imp, even, odd)?;
        if len % 2 == 1 {
            let last = slice_z(imp, z, axis, (len - 1, len, 1))?;
            next = concat_z(imp, next, last, axis)?;
        }
        z = next;
        len = pairs + len % 2;
    }
    Ok(z)
}

/// A running `combine` along `axis` by doubling (Hillis–Steele), for an
/// associative `combine(later, earlier)` (`z_mul`: running products):
/// after the step with shift `d`, element `k` holds the combination of
/// elements `k − 2d + 1 ..= k` — `log₂ len` steps.
pub(super) fn prefix_scan(
    imp: &mut Importer,
    mut z: Z,
    axis: usize,
    len: i64,
    combine: impl Fn(&mut Importer, Z, Z) -> R<Z>,
) -> R<Z> {
    let mut d = 1;
    while d < len {
        let head = slice_z(imp, z, axis, (0, d, 1))?;
        let earlier = slice_z(imp, z, axis, (0, len - d, 1))?;
        let later = slice_z(imp, z, axis, (d, len, 1))?;
        let tail = combine(imp, later, earlier)?;
        z = concat_z(imp, head, tail, axis)?;
        d *= 2;
    }
    Ok(z)
}

/// `pow` with a complex base or exponent: `e^{w ln z}` (1 and 2 exactly, as
/// the product they are).
fn pow(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let base = match overload {
        "Scalar" => required_arg(imp, n, "self", "pow")?,
        _ => complex_input(imp, n, "self")?,
    };
    // A real exponent of 1 or 2: the value itself, or its product with itself.
    if !matches!(imp.arg(n, "exponent"), Some(Arg::Tensor(_) | Arg::Complex(..)) | None) {
        match imp.scalar(n, "exponent")?.as_f64() {
            1.0 => return bind_out(imp, n, base),
            2.0 => {
                let z = widen(imp, base)?;
                let sq = z_mul(imp, z, z)?;
                return bind_out(imp, n, Parts { re: sq.re, im: Some(sq.im) });
            }
            _ => {}
        }
    }
    let exponent = required_arg(imp, n, "exponent", "pow")?;
    let z = widen(imp, base)?;
    let l = z_log(imp, z)?;
    // A real exponent scales both parts of ln z (a zero imaginary part
    // times ln 0 = −inf would make NaN).
    let p = match exponent.im {
        None => {
            let k = imp.cast(exponent.re, WORK);
            Z { re: b(imp, B::Mul, k, l.re)?, im: b(imp, B::Mul, k, l.im)? }
        }
        Some(_) => {
            let w = widen(imp, exponent)?;
            z_mul(imp, w, l)?
        }
    };
    let r = z_exp(imp, p)?;
    bind_out(imp, n, Parts { re: r.re, im: Some(r.im) })
}
