//! Composite ops on complex values, built from `complex_math`'s f64 pieces
//! the way torch's own kernels compute them: the log-sum-exp family
//! (shifted by the real parts, whose `e^x` is the modulus that can
//! overflow), `isclose`, `ldexp`, `rms_norm` and `linalg.vander`.

use crate::import::importer::{invalid, unsupported, Importer, Scalar, COMPLEX_SCOPE, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, UnaryOp as U, ValueId};

use super::complex_math::{
    apply, b, bk, concat_z, prefix_scan, sel, u, widen, z_exp, z_log, z_log1p, z_mul, MAX_PRODUCT_LEN, WORK, Z,
};
use super::composite::{axes_of, reduce, squeeze_axes};
use super::fft::{bind_out, bind_real, complex_input, operand, Parts};

/// Converts `n` if it is one of the ops here; `None` when it is not.
pub(super) fn convert(imp: &mut Importer, n: &Node, name: &str, _overload: &str) -> Option<R<()>> {
    Some(match name {
        "logsumexp" => logsumexp(imp, n),
        "logaddexp" => logaddexp(imp, n),
        "logcumsumexp" => logcumsumexp(imp, n),
        "isclose" => isclose(imp, n),
        "ldexp" => ldexp(imp, n),
        "rms_norm" => rms_norm(imp, n),
        "linalg_vander" => vander(imp, n),
        _ => return None,
    })
}

fn bind_z(imp: &mut Importer, n: &Node, z: Z) -> R<()> {
    bind_out(imp, n, Parts { re: z.re, im: Some(z.im) })
}

fn both(imp: &mut Importer, z: Z, f: impl Fn(&mut Importer, ValueId) -> R<ValueId>) -> R<Z> {
    Ok(Z { re: f(imp, z.re)?, im: f(imp, z.im)? })
}

/// `z` is NaN when either part is (torch's `_isnan` of a complex).
fn is_nan(imp: &mut Importer, z: Z) -> R<ValueId> {
    let p = b(imp, B::Ne, z.re, z.re)?;
    let q = b(imp, B::Ne, z.im, z.im)?;
    b(imp, B::Or, p, q)
}

// ---------------------------------------------------------- log-sum-exp

/// `logsumexp(self, dim, keepdim)`: torch's complex form,
/// `log Σ e^(z − m) + m` with `m` the real parts' maximum (0 where that is
/// infinite), the principal logarithm of the sum.
fn logsumexp(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let w = widen(imp, z)?;
    let rank = imp.ty(w.re).rank();
    let axes = axes_of(imp, n, "dim", rank)?;
    let keep = imp.bool(n, "keepdim", false)?;
    let m = reduce(imp, w.re, ReduceKind::Max, axes.clone(), true)?;
    let am = u(imp, U::Abs, m)?;
    let inf = bk(imp, B::Eq, am, f64::INFINITY)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), WORK);
    let m = sel(imp, inf, zero, m)?;
    let shifted = Z { re: b(imp, B::Sub, w.re, m)?, im: w.im };
    let e = z_exp(imp, shifted)?;
    let s = both(imp, e, |imp, v| reduce(imp, v, ReduceKind::Sum, axes.clone(), keep))?;
    let l = z_log(imp, s)?;
    let m = if keep { m } else { squeeze_axes(imp, m, &axes)? };
    let re = b(imp, B::Add, l.re, m)?;
    bind_z(imp, n, Z { re, im: l.im })
}

/// torch's `_log_add_exp_helper` for complex values: with `min`/`max`
/// ordered by real part, `log1p(e^(min − max)) + max`; NaN when either is
/// NaN, `min` when both real parts are −∞, `log(e^min + e^max)` when both
/// are +∞.
fn log_add_exp(imp: &mut Importer, x: Z, y: Z) -> R<Z> {
    let x_first = b(imp, B::Lt, x.re, y.re)?;
    let pick = |imp: &mut Importer, c: ValueId, p: Z, q: Z| -> R<Z> {
        Ok(Z { re: sel(imp, c, p.re, q.re)?, im: sel(imp, c, p.im, q.im)? })
    };
    let lo = pick(imp, x_first, x, y)?;
    let hi = pick(imp, x_first, y, x)?;
    let d = Z { re: b(imp, B::Sub, lo.re, hi.re)?, im: b(imp, B::Sub, lo.im, hi.im)? };
    let e = z_exp(imp, d)?;
    let l = z_log1p(imp, e)?;
    let general = Z { re: b(imp, B::Add, l.re, hi.re)?, im: b(imp, B::Add, l.im, hi.im)? };
    // Both real parts infinite with one sign.
    let alo = u(imp, U::Abs, lo.re)?;
    let lo_inf = bk(imp, B::Eq, alo, f64::INFINITY)?;
    let same = b(imp, B::Eq, lo.re, hi.re)?;
    let both_inf = b(imp, B::And, lo_inf, same)?;
    let negative = bk(imp, B::Lt, lo.re, 0.0)?;
    let both_neg = b(imp, B::And, both_inf, negative)?;
    let (el, eh) = (z_exp(imp, lo)?, z_exp(imp, hi)?);
    let sum = Z { re: b(imp, B::Add, el.re, eh.re)?, im: b(imp, B::Add, el.im, eh.im)? };
    let pos = z_log(imp, sum)?;
    let r = pick(imp, both_inf, pos, general)?;
    let r = pick(imp, both_neg, lo, r)?;
    let (nx, ny) = (is_nan(imp, x)?, is_nan(imp, y)?);
    let any_nan = b(imp, B::Or, nx, ny)?;
    let q = imp.scalar_const(Scalar::Float(f64::NAN), WORK);
    let nans = Z { re: q, im: q };
    pick(imp, any_nan, nans, r)
}

fn logaddexp(imp: &mut Importer, n: &Node) -> R<()> {
    let x = complex_input(imp, n, "self")?;
    let y = complex_input(imp, n, "other")?;
    let (x, y) = (widen(imp, x)?, widen(imp, y)?);
    let r = log_add_exp(imp, x, y)?;
    bind_z(imp, n, r)
}

/// `logcumsumexp(self, dim)`: a doubling scan of `log_add_exp` (torch runs
/// it left to right; the same sums, another association).
fn logcumsumexp(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let w = widen(imp, z)?;
    let rank = imp.ty(w.re).rank();
    if rank == 0 {
        return bind_z(imp, n, w);
    }
    let axis = super::shape::normalize_axis(imp.int(n, "dim", None)?, rank)?;
    let len = match imp.ty(w.re).shape[axis].as_const() {
        Some(l) if l <= MAX_PRODUCT_LEN => l,
        _ => {
            return unsupported(format!(
                "`logcumsumexp` of a complex value along an axis longer than {MAX_PRODUCT_LEN} or of dynamic \
                 size; {COMPLEX_SCOPE}"
            ))
        }
    };
    let r = prefix_scan(imp, w, axis, len, log_add_exp)?;
    bind_z(imp, n, r)
}

// ------------------------------------------------------------- isclose

/// `isclose(self, other, rtol, atol, equal_nan)` as torch's reference
/// computes it, in the parts' dtype: equal, or both NaN with `equal_nan`,
/// or a finite `|a − b| ≤ atol + |rtol·b|`.
fn isclose(imp: &mut Importer, n: &Node) -> R<()> {
    let a = complex_input(imp, n, "self")?;
    let c = complex_input(imp, n, "other")?;
    let dtype = imp.ty(a.re).dtype;
    let part = |imp: &mut Importer, p: Parts| -> R<Z> {
        let re = imp.cast(p.re, dtype);
        let im = super::fft::imag_or_zero(imp, p)?;
        Ok(Z { re, im: imp.cast(im, dtype) })
    };
    let (x, y) = (part(imp, a)?, part(imp, c)?);
    let rtol = imp.float(n, "rtol", Some(1e-5))?;
    let atol = imp.float(n, "atol", Some(1e-8))?;
    if rtol < 0.0 || atol < 0.0 {
        return invalid(format!("isclose: rtol ({rtol}) and atol ({atol}) must be non-negative"));
    }
    let re_eq = b(imp, B::Eq, x.re, y.re)?;
    let im_eq = b(imp, B::Eq, x.im, y.im)?;
    let mut close = b(imp, B::And, re_eq, im_eq)?;
    if imp.bool(n, "equal_nan", false)? {
        let (nx, ny) = (is_nan(imp, x)?, is_nan(imp, y)?);
        let both_nan = b(imp, B::And, nx, ny)?;
        close = b(imp, B::Or, close, both_nan)?;
    }
    if rtol != 0.0 || atol != 0.0 {
        let modulus = |imp: &mut Importer, z: Z| -> R<ValueId> {
            let p = Parts { re: z.re, im: Some(z.im) };
            let wide = widen(imp, p)?;
            let r = super::complex_math::modulus(imp, wide)?;
            Ok(imp.cast(r, dtype))
        };
        let scaled = both(imp, y, |imp, v| imp.with_scalar(B::Mul, v, rtol))?;
        let allowed = modulus(imp, scaled)?;
        let allowed = imp.with_scalar(B::Add, allowed, atol)?;
        let diff = Z { re: b(imp, B::Sub, x.re, y.re)?, im: b(imp, B::Sub, x.im, y.im)? };
        let actual = modulus(imp, diff)?;
        let aa = u(imp, U::Abs, actual)?;
        let finite = imp.with_scalar(B::Lt, aa, f64::INFINITY)?;
        let within = b(imp, B::Le, actual, allowed)?;
        let ok = b(imp, B::And, finite, within)?;
        close = b(imp, B::Or, close, ok)?;
    }
    bind_real(imp, n, close)
}

// --------------------------------------------------------------- others

/// `ldexp(self, other) = self · 2^other`, with `2^w = e^(w ln 2)` for a
/// complex `other` (torch's `mul(self, pow(2, other))`).
fn ldexp(imp: &mut Importer, n: &Node) -> R<()> {
    let x = operand(imp, imp.tensor_name(n, "self")?)?;
    let e = operand(imp, imp.tensor_name(n, "other")?)?;
    let (x, e) = (widen(imp, x)?, widen(imp, e)?);
    let scaled = both(imp, e, |imp, v| bk(imp, B::Mul, v, std::f64::consts::LN_2))?;
    let p = z_exp(imp, scaled)?;
    let r = z_mul(imp, x, p)?;
    bind_z(imp, n, r)
}

/// `rms_norm(input, normalized_shape, weight, eps)` as torch's kernel on
/// complex values: `x · rsqrt(mean(x²) + eps)` with the complex square and
/// root (eps: the part dtype's epsilon when absent), rounded to the input's
/// dtype, then times the weight.
fn rms_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "input")?;
    let dtype = imp.ty(z.re).dtype;
    let w = widen(imp, z)?;
    let rank = imp.ty(w.re).rank();
    let dims = imp.ints(n, "normalized_shape", &[])?.len();
    if dims > rank {
        return invalid(format!("rms_norm: normalized_shape has {dims} dims, the input {rank}"));
    }
    let axes: Vec<usize> = (rank - dims..rank).collect();
    let eps = match imp.opt_scalar(n, "eps")? {
        Some(e) => e.as_f64(),
        None if dtype == DType::F32 => f64::from(f32::EPSILON),
        None => f64::EPSILON,
    };
    let sq = z_mul(imp, w, w)?;
    let mean = both(imp, sq, |imp, v| reduce(imp, v, ReduceKind::Mean, axes.clone(), true))?;
    let shifted = Z { re: bk(imp, B::Add, mean.re, eps)?, im: mean.im };
    let r = apply(imp, "rsqrt", shifted)?;
    let y = z_mul(imp, w, r)?;
    // `type_as(input)` before the weight.
    let y = both(imp, y, |imp, v| {
        let v = imp.cast(v, dtype);
        Ok(imp.cast(v, WORK))
    })?;
    let y = match imp.arg(n, "weight") {
        Some(Arg::Tensor(t)) => {
            let t = t.clone();
            let wt = operand(imp, &t)?;
            let wt = widen(imp, wt)?;
            z_mul(imp, y, wt)?
        }
        _ => y,
    };
    bind_z(imp, n, y)
}

/// `linalg.vander(x, N)`: columns `x⁰ … x^(N−1)`, the powers as running
/// products of `N − 1` copies of `x` (torch's cumprod).
fn vander(imp: &mut Importer, n: &Node) -> R<()> {
    let out = match n.outputs.first() {
        Some(Arg::Tensor(o)) => o.clone(),
        _ => return invalid("vander without a tensor output"),
    };
    let cols = match imp.part_type(&out)?.shape.last().and_then(Dim::as_const) {
        Some(c) if c >= 2 => c,
        Some(_) => return invalid("vander: N must be greater than 1"),
        None => return unsupported("vander with a dynamic N"),
    };
    if cols - 1 > MAX_PRODUCT_LEN {
        return unsupported(format!("complex `vander` with N above {MAX_PRODUCT_LEN}; {COMPLEX_SCOPE}"));
    }
    let z = operand(imp, imp.tensor_name(n, "x")?)?;
    let w = widen(imp, z)?;
    let mut shape = imp.ty(w.re).shape.clone();
    if shape.is_empty() {
        shape.push(Dim::Const(1));
    }
    shape.push(Dim::Const(1));
    let axis = shape.len() - 1;
    let column = both(imp, w, |imp, v| imp.push(Op::Reshape { shape: shape.clone() }, vec![v]))?;
    let mut wide = shape.clone();
    wide[axis] = Dim::Const(cols - 1);
    let repeated = both(imp, column, |imp, v| imp.push(Op::Expand { shape: wide.clone() }, vec![v]))?;
    let powers = prefix_scan(imp, repeated, axis, cols - 1, z_mul)?;
    let ty = TensorType::new(WORK, shape.clone());
    let ones = imp.push_typed(Op::Full { value: 1.0, dtype: WORK, shape: shape.clone() }, vec![], ty.clone());
    let zeros = imp.push_typed(Op::Full { value: 0.0, dtype: WORK, shape }, vec![], ty);
    let r = concat_z(imp, Z { re: ones, im: zeros }, powers, axis)?;
    bind_z(imp, n, r)
}
