//! `torch.special.airy_ai`, as torch's `airy_ai_forward` computes it
//! (Cephes): below -2.09 an asymptotic form with rational functions of
//! `z² = (3 / (2(-x)^{3/2}))²` and sin/cos; from 2.09 one in `1/ζ`,
//! `ζ = 2x^{3/2}/3`; in between the power series, whose loop torch runs until
//! a term falls below the dtype's epsilon — unrolled here to a fixed count
//! that covers the range (10 terms in f32, 14 in f64, found by running the
//! loop over [-2.09, 2.09]), each lane keeping its sums once its own loop
//! would have stopped, so every lane adds the terms torch's does. 0 above
//! 103.892, NaN at ±inf.

use super::activation::compute_dtype;
use super::ndtri::polevl;
use crate::import::importer::{Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Op, UnaryOp as U, ValueId};

/// x >= 2.09: numerator in 1/ζ (highest degree first).
const AN: [f64; 8] = [
    0.346538101525629,
    12.007595273964581,
    76.27960536152345,
    168.08922493463058,
    159.75639135016442,
    70.53609068404442,
    14.026469116338967,
    1.0,
];
/// x >= 2.09: denominator (highest degree first).
const AD: [f64; 8] = [
    0.5675945326387702,
    14.75625625848472,
    84.51389701414746,
    177.31808814540045,
    164.2346928715297,
    71.47784008255756,
    14.095913560783403,
    1.0,
];
/// x < -2.09: f's numerator in z² (highest degree first).
const AFN: [f64; 9] = [
    -0.1316963234183318,
    -0.6264565444319123,
    -0.6931580360369335,
    -0.2797799815451191,
    -0.04919001326095003,
    -0.004062659235948854,
    -0.0001592764962392621,
    -2.776491081552329e-06,
    -1.6778769848911465e-08,
];
/// x < -2.09: f's denominator (highest degree first).
const AFD: [f64; 9] = [
    13.356042070655324,
    32.682503279522464,
    26.736704094149957,
    9.187074029072596,
    1.4752914677166642,
    0.11568717379518804,
    0.004402916416152112,
    7.547203482874142e-05,
    4.5185009297058035e-07,
];
/// x < -2.09: g's numerator in z² (highest degree first).
const AGN: [f64; 11] = [
    0.01973399320916857,
    0.39110302961568827,
    1.0657989759959559,
    0.9391692298166502,
    0.35146565610554764,
    0.06338889196289255,
    0.005858041130483885,
    0.000282851600836737,
    6.98793669997261e-06,
    8.117892395543892e-08,
    3.415517847659236e-10,
];
/// x < -2.09: g's denominator (highest degree first).
const AGD: [f64; 10] = [
    9.30892908077442,
    19.835292871831214,
    15.564662893286462,
    5.476860694229755,
    0.9542936116189619,
    0.08645808263523921,
    0.004126565238242226,
    0.00010125908511650914,
    1.1716673321441352e-06,
    4.9183457006293e-09,
];

/// 1/√π.
const FRAC_1_SQRT_PI: f64 = 0.5641895835477563;
/// The series' terms unrolled: more than the loop ever takes on its range.
const SERIES_TERMS: usize = 16;

/// `aten::special_airy_ai(Tensor x)`.
pub(super) fn airy_ai(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = imp.tensor(n, "x")?;
    let x = imp.cast(x, c);
    let negative = negative_side(imp, x)?;
    let positive = positive_side(imp, x)?;
    let series = power_series(imp, x, c)?;
    // From the top: the series below 2.09, the 1/ζ form up to 103.892, 0 above.
    let low = imp.with_scalar(B::Lt, x, 2.09)?;
    let v = imp.push(Op::Where, vec![low, series, positive])?;
    let far_left = imp.with_scalar(B::Lt, x, -2.09)?;
    let v = imp.push(Op::Where, vec![far_left, negative, v])?;
    let above = imp.with_scalar(B::Gt, x, 103.892)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), c);
    let v = imp.push(Op::Where, vec![above, zero, v])?;
    let magnitude = imp.push(Op::Unary(U::Abs), vec![x])?;
    let infinite = imp.with_scalar(B::Eq, magnitude, f64::INFINITY)?;
    let nan = imp.scalar_const(Scalar::Float(f64::NAN), c);
    let v = imp.push(Op::Where, vec![infinite, nan, v])?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// x < -2.09: `(1/√π) / (-x)^{1/4} · (sin t · (1 + z²·F(z²)) - cos t · z·G(z²))`,
/// `t = -2x√(-x)/3 + π/4`, `z = 1 / (-2x√(-x)/3)`.
fn negative_side(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let mx = imp.push(Op::Unary(U::Neg), vec![x])?;
    let root = imp.push(Op::Unary(U::Sqrt), vec![mx])?;
    let m2x = imp.with_scalar(B::Mul, x, -2.0)?;
    let zeta = imp.push(Op::Binary(B::Mul), vec![m2x, root])?;
    let zeta = imp.with_scalar(B::Div, zeta, 3.0)?;
    let dtype = imp.ty(x).dtype;
    let one = imp.scalar_const(Scalar::Float(1.0), dtype);
    let z = imp.push(Op::Binary(B::Div), vec![one, zeta])?;
    let zz = imp.push(Op::Binary(B::Mul), vec![z, z])?;
    let afn = polevl(imp, zz, &AFN)?;
    let afd = polevl(imp, zz, &AFD)?;
    let agn = polevl(imp, zz, &AGN)?;
    let agd = polevl(imp, zz, &AGD)?;
    // torch's `T(0.25) * c10::pi<T>`, in the dtype.
    let quarter_pi =
        if dtype == DType::F32 { f64::from(0.25f32 * std::f32::consts::PI) } else { 0.25 * std::f64::consts::PI };
    let t = imp.with_scalar(B::Add, zeta, quarter_pi)?;
    let f = imp.push(Op::Binary(B::Mul), vec![zz, afn])?;
    let f = imp.push(Op::Binary(B::Div), vec![f, afd])?;
    let f = imp.push(Op::Binary(B::Add), vec![one, f])?;
    let g = imp.push(Op::Binary(B::Mul), vec![z, agn])?;
    let g = imp.push(Op::Binary(B::Div), vec![g, agd])?;
    let sin = imp.push(Op::Unary(U::Sin), vec![t])?;
    let cos = imp.push(Op::Unary(U::Cos), vec![t])?;
    let sf = imp.push(Op::Binary(B::Mul), vec![sin, f])?;
    let cg = imp.push(Op::Binary(B::Mul), vec![cos, g])?;
    let wave = imp.push(Op::Binary(B::Sub), vec![sf, cg])?;
    let quartic = imp.push(Op::Unary(U::Sqrt), vec![root])?;
    let k = imp.scalar_const(Scalar::Float(FRAC_1_SQRT_PI), dtype);
    let scale = imp.push(Op::Binary(B::Div), vec![k, quartic])?;
    imp.push(Op::Binary(B::Mul), vec![scale, wave])
}

/// x >= 2.09: `(1/√π) · (N(1/ζ)/D(1/ζ)) / (2 x^{1/4} e^ζ)`, `ζ = 2x√x/3`.
fn positive_side(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let dtype = imp.ty(x).dtype;
    let root = imp.push(Op::Unary(U::Sqrt), vec![x])?;
    let two_x = imp.with_scalar(B::Mul, x, 2.0)?;
    let zeta = imp.push(Op::Binary(B::Mul), vec![two_x, root])?;
    let zeta = imp.with_scalar(B::Div, zeta, 3.0)?;
    let one = imp.scalar_const(Scalar::Float(1.0), dtype);
    let inv = imp.push(Op::Binary(B::Div), vec![one, zeta])?;
    let an = polevl(imp, inv, &AN)?;
    let ad = polevl(imp, inv, &AD)?;
    let ratio = imp.push(Op::Binary(B::Div), vec![an, ad])?;
    let num = imp.with_scalar(B::Mul, ratio, FRAC_1_SQRT_PI)?;
    let quartic = imp.push(Op::Unary(U::Sqrt), vec![root])?;
    let den = imp.with_scalar(B::Mul, quartic, 2.0)?;
    let growth = imp.push(Op::Unary(U::Exp), vec![zeta])?;
    let den = imp.push(Op::Binary(B::Mul), vec![den, growth])?;
    imp.push(Op::Binary(B::Div), vec![num, den])
}

/// The power series `c1·f - c2·g` (f, g the two Maclaurin series in x³),
/// term by term as torch's loop adds them.
fn power_series(imp: &mut Importer, x: ValueId, dtype: DType) -> R<ValueId> {
    let eps = match dtype {
        DType::F32 => f64::from(f32::EPSILON),
        _ => f64::EPSILON,
    };
    let xx = imp.push(Op::Binary(B::Mul), vec![x, x])?;
    let z = imp.push(Op::Binary(B::Mul), vec![xx, x])?;
    let mut m = imp.scalar_const(Scalar::Float(1.0), dtype);
    let mut f = m;
    let mut n = x;
    let mut g = x;
    let mut running: Option<ValueId> = None; // every lane runs the first term
    for term in 0..SERIES_TERMS {
        // k runs 2, 3, 4, then 5, 6, 7, ...: the same in every lane.
        let k = (3 * term + 2) as f64;
        let mz = imp.push(Op::Binary(B::Mul), vec![m, z])?;
        let m1 = imp.with_scalar(B::Div, mz, k)?;
        let nz = imp.push(Op::Binary(B::Mul), vec![n, z])?;
        let n1 = imp.with_scalar(B::Div, nz, k + 1.0)?;
        let m2 = imp.with_scalar(B::Div, m1, k + 1.0)?;
        let f2 = imp.push(Op::Binary(B::Add), vec![f, m2])?;
        let n2 = imp.with_scalar(B::Div, n1, k + 2.0)?;
        let g2 = imp.push(Op::Binary(B::Add), vec![g, n2])?;
        let ratio = imp.push(Op::Binary(B::Div), vec![m2, f2])?;
        let t = imp.push(Op::Unary(U::Abs), vec![ratio])?;
        let go_on = imp.with_scalar(B::Gt, t, eps)?;
        (f, g) = match running {
            None => (f2, g2),
            Some(r) => (imp.push(Op::Where, vec![r, f2, f])?, imp.push(Op::Where, vec![r, g2, g])?),
        };
        running = Some(match running {
            None => go_on,
            Some(r) => imp.push(Op::Binary(B::And), vec![r, go_on])?,
        });
        (m, n) = (m2, n2);
    }
    let cf = imp.with_scalar(B::Mul, f, 0.3550280538878172)?;
    let cg = imp.with_scalar(B::Mul, g, 0.2588194037928068)?;
    imp.push(Op::Binary(B::Sub), vec![cf, cg])
}
