//! Modified Bessel functions of the second kind, `K0`/`K1` and their
//! exponentially scaled forms (`torch.special.modified_bessel_k0/k1`,
//! `scaled_modified_bessel_k0/k1`), as torch's `Math.h` computes them (Cephes):
//! Chebyshev series by Clenshaw's recurrence in `x² - 2` for `x <= 2` (plus
//! the `log(x/2) · I0/I1` term) and in `8/x - 2` above, in the compute dtype.
//! Both branches are elementwise chains over the whole tensor; a select picks
//! per element, then `+inf` at 0 and NaN below 0.

use super::activation::compute_dtype;
use crate::import::importer::{Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, Op, UnaryOp as U, ValueId};

/// K0's Chebyshev coefficients for x <= 2, in x² - 2 (Cephes, as torch's Math.h).
const K0_A: [f64; 10] = [
    1.374465435613523e-16,
    4.25981614279661e-14,
    1.0349695257633842e-11,
    1.904516377220209e-09,
    2.5347910790261494e-07,
    2.286212103119452e-05,
    0.001264615411446926,
    0.0359799365153615,
    0.3442898999246285,
    -0.5353273932339028,
];
/// K0's Chebyshev coefficients for x > 2, in 8/x - 2 (Cephes, as torch's Math.h).
const K0_B: [f64; 25] = [
    5.300433772686263e-18,
    -1.6475804301524212e-17,
    5.2103915050390274e-17,
    -1.678231096805412e-16,
    5.512055978524319e-16,
    -1.848593377343779e-15,
    6.3400764774050706e-15,
    -2.2275133269916698e-14,
    8.032890775363575e-14,
    -2.9800969231727303e-13,
    1.140340588208475e-12,
    -4.514597883373944e-12,
    1.8559491149547177e-11,
    -7.957489244477107e-11,
    3.577397281400301e-10,
    -1.69753450938906e-09,
    8.574034017414225e-09,
    -4.660489897687948e-08,
    2.766813639445015e-07,
    -1.8317555227191195e-06,
    1.39498137188765e-05,
    -0.00012849549581627802,
    0.0015698838857300533,
    -0.0314481013119645,
    2.4403030820659555,
];
/// K1's Chebyshev coefficients for x <= 2, in x² - 2 (Cephes, as torch's Math.h).
const K1_A: [f64; 11] = [
    -7.023863479386288e-18,
    -2.427449850519366e-15,
    -6.666901694199329e-13,
    -1.4114883926335278e-10,
    -2.213387630734726e-08,
    -2.4334061415659684e-06,
    -0.0001730288957513052,
    -0.006975723859639864,
    -0.12261118082265715,
    -0.3531559607765449,
    1.5253002273389478,
];
/// K1's Chebyshev coefficients for x > 2, in 8/x - 2 (Cephes, as torch's Math.h).
const K1_B: [f64; 25] = [
    -5.756744483665017e-18,
    1.7940508731475592e-17,
    -5.689462558442859e-17,
    1.838093544366639e-16,
    -6.057047248373319e-16,
    2.038703165624334e-15,
    -7.019837090418314e-15,
    2.4771544244813043e-14,
    -8.976705182324994e-14,
    3.3484196660784293e-13,
    -1.2891739609510289e-12,
    5.13963967348173e-12,
    -2.1299678384275683e-11,
    9.218315187605006e-11,
    -4.1903547593418965e-10,
    2.015049755197033e-09,
    -1.0345762465678097e-08,
    5.7410841254500495e-08,
    -3.5019606030878126e-07,
    2.406484947837217e-06,
    -1.936197974166083e-05,
    0.00019521551847135162,
    -0.002857816859622779,
    0.10392373657681724,
    2.7206261904844427,
];

/// `aten::special_modified_bessel_k0(Tensor self)`, `..._k1`, and
/// `aten::special_scaled_modified_bessel_k0(Tensor x)`, `..._k1`
/// (`order` 0 or 1; `scaled`: times `exp(x)`).
pub(super) fn bessel_k(imp: &mut Importer, n: &Node, order: u8, scaled: bool) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = imp.tensor(n, if imp.arg(n, "self").is_some() { "self" } else { "x" })?;
    let x = imp.cast(x, c);
    let (a, b): (&[f64], &[f64]) = if order == 0 { (&K0_A, &K0_B) } else { (&K1_A, &K1_B) };
    // x <= 2: the series in x² - 2, with the log term.
    let xx = imp.push(Op::Binary(B::Mul), vec![x, x])?;
    let t = imp.with_scalar(B::Sub, xx, 2.0)?;
    let series = clenshaw(imp, t, a)?;
    let half_x = imp.with_scalar(B::Mul, x, 0.5)?;
    let log = imp.push(Op::Unary(U::Log), vec![half_x])?;
    let near = if order == 0 {
        let i0 = imp.push(Op::Unary(U::I0), vec![x])?;
        let term = imp.push(Op::Binary(B::Mul), vec![log, i0])?;
        imp.push(Op::Binary(B::Sub), vec![series, term])?
    } else {
        let i1 = imp.push(Op::Unary(U::I1), vec![x])?;
        let term = imp.push(Op::Binary(B::Mul), vec![log, i1])?;
        let over_x = imp.push(Op::Binary(B::Div), vec![series, x])?;
        imp.push(Op::Binary(B::Add), vec![term, over_x])?
    };
    // x > 2: the series in 8/x - 2, over √x (times exp(-x) unscaled).
    let eight = imp.scalar_const(Scalar::Float(8.0), c);
    let inv = imp.push(Op::Binary(B::Div), vec![eight, x])?;
    let t = imp.with_scalar(B::Sub, inv, 2.0)?;
    let series = clenshaw(imp, t, b)?;
    let root = imp.push(Op::Unary(U::Sqrt), vec![x])?;
    let exp_x = imp.push(Op::Unary(U::Exp), vec![x])?;
    let (near, far) = if scaled {
        let near = imp.push(Op::Binary(B::Mul), vec![near, exp_x])?;
        (near, imp.push(Op::Binary(B::Div), vec![series, root])?)
    } else {
        let neg = imp.push(Op::Unary(U::Neg), vec![x])?;
        let decay = imp.push(Op::Unary(U::Exp), vec![neg])?;
        let far = imp.push(Op::Binary(B::Mul), vec![decay, series])?;
        (near, imp.push(Op::Binary(B::Div), vec![far, root])?)
    };
    let small = imp.with_scalar(B::Le, x, 2.0)?;
    let v = imp.push(Op::Where, vec![small, near, far])?;
    let negative = imp.with_scalar(B::Lt, x, 0.0)?;
    let nan = imp.scalar_const(Scalar::Float(f64::NAN), c);
    let v = imp.push(Op::Where, vec![negative, nan, v])?;
    let zero = imp.with_scalar(B::Eq, x, 0.0)?;
    let inf = imp.scalar_const(Scalar::Float(f64::INFINITY), c);
    let v = imp.push(Op::Where, vec![zero, inf, v])?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// Cephes' `chbevl` as torch's loops run it: `a_k = t·a_{k-1} - a_{k-2} + c_k`,
/// then `(a_n - a_{n-2}) / 2`.
fn clenshaw(imp: &mut Importer, t: ValueId, coefs: &[f64]) -> R<ValueId> {
    let dtype = imp.ty(t).dtype;
    let (first, rest) = coefs.split_first().expect("a series has coefficients");
    let mut a = imp.scalar_const(Scalar::Float(*first), dtype);
    let mut q = imp.scalar_const(Scalar::Float(0.0), dtype);
    let mut p = q;
    for &coef in rest {
        p = q;
        q = a;
        let tq = imp.push(Op::Binary(B::Mul), vec![t, q])?;
        let diff = imp.push(Op::Binary(B::Sub), vec![tq, p])?;
        a = imp.with_scalar(B::Add, diff, coef)?;
    }
    let d = imp.push(Op::Binary(B::Sub), vec![a, p])?;
    imp.with_scalar(B::Mul, d, 0.5)
}
