//! Portable slice primitives: the generic variants of the kernel table's
//! elementwise and reduction entries, and the one definition of these ops
//! that the float kernels (f32 and f64 alike) use.
//!
//! Each works over the shortest of its slices, so a variant never needs to
//! bounds-check more than that.

use super::common::Scalar;
use super::math::Real;

macro_rules! unary_slices {
    ($($(#[$doc:meta])* $name:ident: |$v:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name<T: Real>(x: &[T], out: &mut [T]) {
            for (o, &$v) in out.iter_mut().zip(x) {
                *o = $body;
            }
        }
    )*};
}

unary_slices! {
    /// `out[i] = exp(x[i])`.
    exp: |v| v.exp();
    /// `out[i] = 1 / (1 + exp(-x[i]))`.
    sigmoid: |v| T::ONE / (T::ONE + (-v).exp());
    /// `out[i] = x[i] / (1 + exp(-x[i]))`.
    silu: |v| v / (T::ONE + (-v).exp());
    /// `out[i] = tanh(x[i])`.
    tanh: |v| v.tanh();
    /// `out[i] = erf(x[i])`.
    erf: |v| v.erf();
    /// `out[i] = x[i] · Φ(x[i])` (exact GELU).
    gelu: |v| v.gelu();
}

/// GELU's tanh form `x/2 · (1 + tanh(z))`, `z = √(2/π)(x + 0.044715x³)`,
/// evaluated in f64 as the equal `x / (1 + e^{-2z})` and rounded once: the
/// textbook form cancels in `1 + tanh` on the left tail.
pub(crate) fn gelu_tanh_f32(x: &[f32], out: &mut [f32]) {
    let k0 = (2.0 / std::f64::consts::PI).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        let v = v as f64;
        let z = k0 * (v + 0.044715 * v * v * v);
        // -inf gives -inf / inf = NaN, as the textbook form (-inf · 0) in torch.
        *o = (v / (1.0 + (-2.0 * z).exp())) as f32;
    }
}

macro_rules! binary_slices {
    ($($name:ident: $op:tt;)*) => {$(
        #[doc = concat!("`out[i] = a[i] ", stringify!($op), " b[i]`.")]
        pub(crate) fn $name<T: Real>(a: &[T], b: &[T], out: &mut [T]) {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = x $op y;
            }
        }
    )*};
}

binary_slices! {
    add: +;
    sub: -;
    mul: *;
    div: /;
}

/// The NaN-propagating maximum: -inf for an empty row, the last NaN if there
/// is one, and among equal maxima (±0) the first.
pub(crate) fn max<T: Real>(x: &[T]) -> T {
    x.iter().fold(T::NEG_INFINITY, |m, &v| if v > m || v.is_nan() { v } else { m })
}

/// Adds the rows of `acc.len()` consecutive elements of `x` (a whole number
/// of them) into `acc` in f64, row after row: each `acc[j]` is one chain of
/// adds over column `j` in row order, so every variant that keeps that
/// order per lane (the ISA ones keep a column per lane) gives these bits.
/// The channel sums of a channels-last global mean.
pub(crate) fn column_sum<T: Scalar>(x: &[T], acc: &mut [f64]) {
    let c = acc.len();
    if c == 0 {
        return;
    }
    for row in x.chunks_exact(c) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v.to_f64();
        }
    }
}

/// `v[i] = exp(v[i] - shift)` in place, returning the sum of the results
/// accumulated in f64 (long rows such as a vocabulary softmax drift in f32).
pub(crate) fn exp_sum<T: Real>(v: &mut [T], shift: T) -> f64 {
    let mut sum = 0.0f64;
    for e in v.iter_mut() {
        *e = (*e - shift).exp();
        sum += e.to_f64();
    }
    sum
}
