//! `torch.special.ndtri`, the inverse of the standard normal CDF, as torch's
//! `calc_ndtri` computes it (Cephes): a rational function of `(y - 1/2)²` in
//! the central range, otherwise of `1/z` with `z = √(-2 log y)` (two sets of
//! coefficients, split at z = 8), on `1 - y` above `1 - e⁻²` with the sign
//! flipped; all in the compute dtype, every branch over the whole tensor and
//! a select per element.

use super::activation::compute_dtype;
use crate::import::importer::{Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Op, UnaryOp as U, ValueId};

/// central range, |y - 1/2| <= 3/8: numerator in y'² (highest degree first).
const P0: [f64; 5] =
    [-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968, -1.2391658386738125];
/// central range: denominator (highest degree first).
const Q0: [f64; 9] = [
    1.0,
    1.9544885833814176,
    4.676279128988815,
    86.36024213908905,
    -225.46268785411937,
    200.26021238006066,
    -82.03722561683334,
    15.90562251262117,
    -1.1833162112133,
];
/// tails, z = √(-2 log y) in [2, 8): numerator in 1/z (highest degree first).
const P1: [f64; 9] = [
    4.0554489230596245,
    31.525109459989388,
    57.16281922464213,
    44.08050738932008,
    14.684956192885803,
    2.1866330685079025,
    -0.1402560791713545,
    -0.03504246268278482,
    -0.0008574567851546854,
];
/// tails, z in [2, 8): denominator (highest degree first).
const Q1: [f64; 9] = [
    1.0,
    15.779988325646675,
    45.39076351288792,
    41.3172038254672,
    15.04253856929075,
    2.504649462083094,
    -0.14218292285478779,
    -0.03808064076915783,
    -0.0009332594808954574,
];
/// far tails, z in [8, 64): numerator in 1/z (highest degree first).
const P2: [f64; 9] = [
    3.2377489177694603,
    6.915228890689842,
    3.9388102529247444,
    1.3330346081580755,
    0.20148538954917908,
    0.012371663481782003,
    0.00030158155350823543,
    2.6580697468673755e-06,
    6.239745391849833e-09,
];
/// far tails: denominator (highest degree first).
const Q2: [f64; 9] = [
    1.0,
    6.02427039364742,
    3.6798356385616087,
    1.3770209948908132,
    0.21623699359449663,
    0.013420400608854318,
    0.00032801446468212774,
    2.8924786474538068e-06,
    6.790194080099813e-09,
];

/// e⁻², where the central range ends.
const EXP_M2: f64 = 0.1353352832366127;
/// √(2π).
const S2PI: f64 = 2.5066282746310007;

/// `aten::special_ndtri(Tensor self)`: -inf at 0, +inf at 1, NaN outside [0, 1].
pub(super) fn ndtri(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let y0 = imp.tensor(n, "self")?;
    let y0 = imp.cast(y0, c);
    // torch compares with `one - T(e⁻²)`, rounded in the dtype.
    let upper = if c == DType::F32 { f64::from(1.0f32 - EXP_M2 as f32) } else { 1.0 - EXP_M2 };
    let flip = imp.with_scalar(B::Gt, y0, upper)?;
    let one = imp.scalar_const(Scalar::Float(1.0), c);
    let complement = imp.push(Op::Binary(B::Sub), vec![one, y0])?;
    let y = imp.push(Op::Where, vec![flip, complement, y0])?;
    // Central: (y' + y'·(y'²·P0(y'²)/Q0(y'²)))·√(2π), y' = y - 1/2.
    let yc = imp.with_scalar(B::Sub, y, 0.5)?;
    let y2 = imp.push(Op::Binary(B::Mul), vec![yc, yc])?;
    let p = polevl(imp, y2, &P0)?;
    let q = polevl(imp, y2, &Q0)?;
    let r = imp.push(Op::Binary(B::Mul), vec![y2, p])?;
    let r = imp.push(Op::Binary(B::Div), vec![r, q])?;
    let r = imp.push(Op::Binary(B::Mul), vec![yc, r])?;
    let central = imp.push(Op::Binary(B::Add), vec![yc, r])?;
    let central = imp.with_scalar(B::Mul, central, S2PI)?;
    // Tails: x0 - z·P(z)/Q(z), x = √(-2 log y), x0 = x - log(x)/x, z = 1/x.
    let log_y = imp.push(Op::Unary(U::Log), vec![y])?;
    let m2 = imp.with_scalar(B::Mul, log_y, -2.0)?;
    let x = imp.push(Op::Unary(U::Sqrt), vec![m2])?;
    let log_x = imp.push(Op::Unary(U::Log), vec![x])?;
    let d = imp.push(Op::Binary(B::Div), vec![log_x, x])?;
    let x0 = imp.push(Op::Binary(B::Sub), vec![x, d])?;
    let z = imp.push(Op::Binary(B::Div), vec![one, x])?;
    let near = rational(imp, z, &P1, &Q1)?;
    let far = rational(imp, z, &P2, &Q2)?;
    let below_8 = imp.with_scalar(B::Lt, x, 8.0)?;
    let x1 = imp.push(Op::Where, vec![below_8, near, far])?;
    let tail = imp.push(Op::Binary(B::Sub), vec![x0, x1])?;
    let negated = imp.push(Op::Unary(U::Neg), vec![tail])?;
    let tail = imp.push(Op::Where, vec![flip, tail, negated])?;
    let in_centre = imp.with_scalar(B::Gt, y, EXP_M2)?;
    let v = imp.push(Op::Where, vec![in_centre, central, tail])?;
    // The edges, last so that they win.
    let below = imp.with_scalar(B::Lt, y0, 0.0)?;
    let above = imp.with_scalar(B::Gt, y0, 1.0)?;
    let outside = imp.push(Op::Binary(B::Or), vec![below, above])?;
    let nan = imp.scalar_const(Scalar::Float(f64::NAN), c);
    let mut v = imp.push(Op::Where, vec![outside, nan, v])?;
    for (at, value) in [(0.0, f64::NEG_INFINITY), (1.0, f64::INFINITY)] {
        let hit = imp.with_scalar(B::Eq, y0, at)?;
        let k = imp.scalar_const(Scalar::Float(value), c);
        v = imp.push(Op::Where, vec![hit, k, v])?;
    }
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `z · P(z) / Q(z)`.
fn rational(imp: &mut Importer, z: ValueId, p: &[f64], q: &[f64]) -> R<ValueId> {
    let num = polevl(imp, z, p)?;
    let den = polevl(imp, z, q)?;
    let zp = imp.push(Op::Binary(B::Mul), vec![z, num])?;
    imp.push(Op::Binary(B::Div), vec![zp, den])
}

/// Cephes' `polevl`: `(..(k[0]·t + k[1])·t + ..) + k[n-1]`, from the constant
/// `k[0]` (torch starts from 0·t + k[0], the same value).
pub(super) fn polevl(imp: &mut Importer, t: ValueId, k: &[f64]) -> R<ValueId> {
    let dtype = imp.ty(t).dtype;
    let (first, rest) = k.split_first().expect("a polynomial has coefficients");
    let mut acc = imp.scalar_const(Scalar::Float(*first), dtype);
    for &coef in rest {
        let m = imp.push(Op::Binary(B::Mul), vec![acc, t])?;
        acc = imp.with_scalar(B::Add, m, coef)?;
    }
    Ok(acc)
}
