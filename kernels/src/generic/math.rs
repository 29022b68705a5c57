//! Float math the standard library lacks (erf) and the `Real` trait that lets
//! float kernels be written once for f32 and f64.

use super::common::Scalar;

/// Float element type with the operations float kernels need.
pub trait Real:
    Scalar
    + Copy
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::Rem<Output = Self>
    + std::ops::AddAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn lit(v: f64) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_even(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn is_nan(self) -> bool;
    fn erf(self) -> Self;
    fn erfc(self) -> Self;
    fn ln_1p(self) -> Self;
    fn exp_m1(self) -> Self;
    fn trunc(self) -> Self;
    fn tan(self) -> Self;
    fn asin(self) -> Self;
    fn acos(self) -> Self;
    fn atan(self) -> Self;
    fn sinh(self) -> Self;
    fn cosh(self) -> Self;
    fn asinh(self) -> Self;
    fn acosh(self) -> Self;
    fn atanh(self) -> Self;
    fn log2(self) -> Self;
    fn log10(self) -> Self;
    fn atan2(self, other: Self) -> Self;
    /// C's `nextafter`: the neighbour of `self` towards `to` (`to` itself
    /// when they are equal, so `±0` towards `∓0` gives `∓0`; NaN in, NaN out).
    fn next_after(self, to: Self) -> Self;
    /// `0.5 * x * (1 + erf(x / √2))`, written through erfc so that the left
    /// tail keeps full relative precision instead of cancelling.
    fn gelu(self) -> Self;
}

macro_rules! impl_real {
    ($($t:ident),*) => {$(
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            #[inline(always)] fn lit(v: f64) -> Self { v as $t }
            #[inline(always)] fn exp(self) -> Self { $t::exp(self) }
            #[inline(always)] fn ln(self) -> Self { $t::ln(self) }
            #[inline(always)] fn sqrt(self) -> Self { $t::sqrt(self) }
            #[inline(always)] fn tanh(self) -> Self { $t::tanh(self) }
            #[inline(always)] fn sin(self) -> Self { $t::sin(self) }
            #[inline(always)] fn cos(self) -> Self { $t::cos(self) }
            #[inline(always)] fn floor(self) -> Self { $t::floor(self) }
            #[inline(always)] fn ceil(self) -> Self { $t::ceil(self) }
            #[inline(always)] fn round_even(self) -> Self { $t::round_ties_even(self) }
            #[inline(always)] fn abs(self) -> Self { $t::abs(self) }
            #[inline(always)] fn powf(self, e: Self) -> Self { $t::powf(self, e) }
            #[inline(always)] fn is_nan(self) -> bool { $t::is_nan(self) }
            #[inline]
            fn next_after(self, to: Self) -> Self {
                if self.is_nan() || to.is_nan() {
                    return self + to;
                }
                if self == to {
                    return to;
                }
                if self == 0.0 {
                    // The smallest subnormal, signed like the direction.
                    return $t::from_bits(1).copysign(to);
                }
                // Sign-magnitude bits: one more is one ulp away from zero
                // (MAX steps to inf), one less is one ulp towards it.
                let bits = self.to_bits();
                let away_from_zero = (to > self) == (self > 0.0);
                $t::from_bits(if away_from_zero { bits + 1 } else { bits - 1 })
            }
            #[inline(always)] fn ln_1p(self) -> Self { $t::ln_1p(self) }
            #[inline(always)] fn exp_m1(self) -> Self { $t::exp_m1(self) }
            #[inline(always)] fn trunc(self) -> Self { $t::trunc(self) }
            #[inline(always)] fn tan(self) -> Self { $t::tan(self) }
            #[inline(always)] fn asin(self) -> Self { $t::asin(self) }
            #[inline(always)] fn acos(self) -> Self { $t::acos(self) }
            #[inline(always)] fn atan(self) -> Self { $t::atan(self) }
            #[inline(always)] fn sinh(self) -> Self { $t::sinh(self) }
            #[inline(always)] fn cosh(self) -> Self { $t::cosh(self) }
            #[inline(always)] fn asinh(self) -> Self { self.c_asinh() }
            #[inline(always)] fn acosh(self) -> Self { self.c_acosh() }
            #[inline(always)] fn atanh(self) -> Self { self.c_atanh() }
            #[inline(always)] fn log2(self) -> Self { $t::log2(self) }
            #[inline(always)] fn log10(self) -> Self { $t::log10(self) }
            #[inline(always)] fn atan2(self, other: Self) -> Self { $t::atan2(self, other) }
            // f32 goes through the f64 routine: correctly rounded in practice,
            // and one implementation to trust.
            #[inline(always)] fn erf(self) -> Self { erf_f64(self as f64) as $t }
            #[inline(always)] fn erfc(self) -> Self { erfc_f64(self as f64) as $t }
            #[inline(always)] fn gelu(self) -> Self {
                let x = self as f64;
                (0.5 * x * erfc_f64(-x * std::f64::consts::FRAC_1_SQRT_2)) as $t
            }
        }
    )*};
}
impl_real!(f32, f64);

/// The C library's inverse hyperbolic functions, which torch's CPU kernels
/// call (`std::asinh` …). The standard library's own formulas lose badly at
/// the ends of the range: `f32::atanh` is thousands of ulp off near ±1,
/// `f32::acosh` hundreds just above 1, and `asinh`/`acosh` overflow to inf
/// past half of `MAX` (their `x + √(x² ± 1)` does); libm's stay within an ulp
/// or two everywhere.
trait LibmInverseHyperbolic {
    fn c_asinh(self) -> Self;
    fn c_acosh(self) -> Self;
    fn c_atanh(self) -> Self;
}

extern "C" {
    fn asinhf(x: f32) -> f32;
    fn acoshf(x: f32) -> f32;
    fn atanhf(x: f32) -> f32;
    fn asinh(x: f64) -> f64;
    fn acosh(x: f64) -> f64;
    fn atanh(x: f64) -> f64;
}

// SAFETY (every call below): pure C math functions of one float, no pointers
// and no global state.
impl LibmInverseHyperbolic for f32 {
    #[inline(always)]
    fn c_asinh(self) -> f32 {
        unsafe { asinhf(self) }
    }
    #[inline(always)]
    fn c_acosh(self) -> f32 {
        unsafe { acoshf(self) }
    }
    #[inline(always)]
    fn c_atanh(self) -> f32 {
        unsafe { atanhf(self) }
    }
}

impl LibmInverseHyperbolic for f64 {
    #[inline(always)]
    fn c_asinh(self) -> f64 {
        unsafe { asinh(self) }
    }
    #[inline(always)]
    fn c_acosh(self) -> f64 {
        unsafe { acosh(self) }
    }
    #[inline(always)]
    fn c_atanh(self) -> f64 {
        unsafe { atanh(self) }
    }
}

const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// Below this |x| the power series is used, above it the continued fraction.
/// Both reach ~1e-16 relative error at the switch point.
const SERIES_LIMIT: f64 = 3.0;

/// erf(x) = 2/√π · e^{-x²} · Σ (2x²)^n · x / (2n+1)!!  (all terms positive, so
/// no cancellation, unlike the Taylor series).
fn erf_series(a: f64) -> f64 {
    let x2 = a * a;
    let mut term = a;
    let mut sum = a;
    let mut n = 0.0;
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    TWO_OVER_SQRT_PI * (-x2).exp() * sum
}

/// erfc(a) for a ≥ SERIES_LIMIT by Laplace's continued fraction
/// erfc(a) = e^{-a²}/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …)))),
/// evaluated bottom-up at a fixed depth that converges for a ≥ 3.
fn erfc_continued_fraction(a: f64) -> f64 {
    let mut f = a;
    for k in (1..=60).rev() {
        f = a + (k as f64 * 0.5) / f;
    }
    (-a * a).exp() / (f * std::f64::consts::PI.sqrt())
}

pub fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < SERIES_LIMIT {
        erf_series(a)
    } else if a < 27.0 {
        1.0 - erfc_continued_fraction(a)
    } else {
        1.0
    };
    r.copysign(x)
}

pub fn erfc_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < SERIES_LIMIT {
        1.0 - erf_series(a)
    } else if a < 27.0 {
        erfc_continued_fraction(a)
    } else {
        0.0
    };
    if x < 0.0 {
        2.0 - r
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn nextafterf(x: f32, y: f32) -> f32;
        fn nextafter(x: f64, y: f64) -> f64;
    }

    /// Bit for bit against the C library on the edge cases (NaN, ±0, ±inf,
    /// subnormals, the largest finite) in every pairing.
    #[test]
    fn next_after_matches_c() {
        let f32s = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            1.5,
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::from_bits(0x007f_ffff),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for &x in &f32s {
            for &y in &f32s {
                let (got, want) = (x.next_after(y), unsafe { nextafterf(x, y) });
                assert!(
                    got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                    "nextafterf({x:e}, {y:e}) = {got:e}, C {want:e}"
                );
            }
        }
        let f64s = f32s.map(|v| v as f64);
        let edges =
            [f64::MAX, f64::from_bits(1), -f64::from_bits(1), f64::MIN_POSITIVE, f64::from_bits(0x000f_ffff_ffff_ffff)];
        for &x in f64s.iter().chain(&edges) {
            for &y in f64s.iter().chain(&edges) {
                let (got, want) = (x.next_after(y), unsafe { nextafter(x, y) });
                assert!(
                    got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                    "nextafter({x:e}, {y:e}) = {got:e}, C {want:e}"
                );
            }
        }
    }

    #[test]
    fn erf_matches_known_values() {
        let cases = [
            (0.0, 0.0),
            (1e-10, 1.1283791670955126e-10),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (2.9, 0.9999589021219005),
            (3.5, 0.9999992569016276),
        ];
        for (x, want) in cases {
            let got = erf_f64(x);
            assert!((got - want).abs() <= 5e-16 * want.abs(), "erf({x}) = {got}, want {want}");
            assert_eq!(erf_f64(-x), -got);
        }
        let tails = [
            (3.0, 2.209049699858544e-05),
            (4.0, 1.541725790028002e-08),
            (5.0, 1.537459794428035e-12),
            (2.5, 4.06952017444959e-4),
        ];
        for (x, want) in tails {
            let got = erfc_f64(x);
            // 1 - erf(2.5) cancels ~4 digits; the continued-fraction range is tighter.
            assert!((got - want).abs() <= 1e-11 * want, "erfc({x}) = {got}, want {want}");
        }
    }
}
