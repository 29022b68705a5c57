//! The orthogonal polynomials of `torch.special` (`chebyshev_polynomial_t`
//! …, `hermite_polynomial_h`, `laguerre_polynomial_l`,
//! `legendre_polynomial_p`): `P_n(x)` elementwise, with `n` a tensor.
//!
//! Each one follows torch's CPU kernel (`ATen/native/Math.h`) step for step
//! in the element type — the same special cases at the interval's ends, the
//! same switch to the trigonometric form for large `n` inside it, the same
//! three-term recurrences — so that f32 results round as torch's do (a
//! recurrence computed in f64 would be more accurate than torch, and so
//! disagree with it by more than f32's tolerance for large `n`).

use super::math::Real;
use crate::types::BinaryOp;

/// `n` as torch's `static_cast<int64_t>` gives it on x86-64: NaN and values
/// out of range become `i64::MIN` (the "integer indefinite" of `cvttsd2si`),
/// where Rust's `as` would saturate (and map NaN to 0).
fn degree(n: f64) -> i64 {
    if n.is_nan() || !(i64::MIN as f64..-(i64::MIN as f64)).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

/// `P_n(x)` for one of the polynomial [`BinaryOp`]s; `None` for other ops.
pub fn polynomial<T: Real>(op: BinaryOp, x: T, n: T) -> Option<T> {
    let n = degree(n.to_f64());
    Some(match op {
        BinaryOp::ChebyshevT => chebyshev(Kind::T, x, n),
        BinaryOp::ChebyshevU => chebyshev(Kind::U, x, n),
        BinaryOp::ChebyshevV => chebyshev(Kind::V, x, n),
        BinaryOp::ChebyshevW => chebyshev(Kind::W, x, n),
        BinaryOp::ShiftedChebyshevT => shifted_chebyshev(Kind::T, x, n),
        BinaryOp::ShiftedChebyshevU => shifted_chebyshev(Kind::U, x, n),
        BinaryOp::ShiftedChebyshevV => shifted_chebyshev(Kind::V, x, n),
        BinaryOp::ShiftedChebyshevW => shifted_chebyshev(Kind::W, x, n),
        BinaryOp::HermiteH => hermite_h(x, n),
        BinaryOp::HermiteHe => hermite_he(x, n),
        BinaryOp::LaguerreL => laguerre_l(x, n),
        BinaryOp::LegendreP => legendre_p(x, n),
        _ => return None,
    })
}

/// The four Chebyshev kinds share one recurrence `r = 2y·q − p` and differ
/// in their first term, their values at the interval's ends and their
/// trigonometric forms.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    T,
    U,
    V,
    W,
}

fn int<T: Real>(v: i64) -> T {
    T::lit(v as f64)
}

/// `y^{parity of n}`-style sign: `v` for even `n`, `-v` for odd.
fn alternate<T: Real>(n: i64, v: T) -> T {
    if n % 2 == 0 {
        v
    } else {
        -v
    }
}

/// Chebyshev polynomials of `x` (torch's `chebyshev_polynomial_{t,u,v,w}`).
fn chebyshev<T: Real>(kind: Kind, x: T, n: i64) -> T {
    if n < 0 {
        return T::ZERO;
    }
    let one = T::ONE;
    if x.abs() == one {
        // The ends of [-1, 1]: T(±1) = (±1)^n, U(±1) = (±1)^n (n+1),
        // V(1) = 1, V(-1) = (-1)^n (2n+1), W(1) = 2n+1, W(-1) = (-1)^n.
        let positive = x > T::ZERO;
        return match kind {
            Kind::T if positive => one,
            Kind::T => alternate(n, one),
            Kind::U if positive => int(n + 1),
            Kind::U => alternate(n, int(n + 1)),
            Kind::V if positive => one,
            Kind::V => alternate(n, int(n + n + 1)),
            Kind::W if positive => int(n + n + 1),
            Kind::W => alternate(n, one),
        };
    }
    let trig_above = if kind == Kind::T { 6 } else { 8 };
    if n > trig_above && x.abs() < one {
        return chebyshev_trig(kind, x, n, false);
    }
    let first = match kind {
        Kind::T => x,
        Kind::U => x + x,
        Kind::V => x + x - one,
        Kind::W => x + x + one,
    };
    recurrence(x + x, first, n)
}

/// The shifted Chebyshev polynomials `T*_n(x) = T_n(2x − 1)` …, spelled as
/// torch spells them (`x + x - 1` recomputed at each use, ends at 0 and 1).
fn shifted_chebyshev<T: Real>(kind: Kind, x: T, n: i64) -> T {
    if n < 0 {
        return T::ZERO;
    }
    let one = T::ONE;
    let y = x + x - one;
    if x == one {
        return match kind {
            Kind::T | Kind::V => one,
            Kind::U => int(n + 1),
            Kind::W => int(n + n + 1),
        };
    }
    if x == T::ZERO {
        return match kind {
            Kind::T | Kind::W => alternate(n, one),
            Kind::U => alternate(n, int(n + 1)),
            Kind::V => alternate(n, int(n + n + 1)),
        };
    }
    let trig_above = if kind == Kind::W { 4 } else { 6 };
    if n > trig_above && y.abs() < one {
        return chebyshev_trig(kind, y, n, true);
    }
    let first = match kind {
        Kind::T => y,
        Kind::U => y + y,
        Kind::V => y + y - one,
        Kind::W => y + y + one,
    };
    recurrence(y + y, first, n)
}

/// The trigonometric forms inside (-1, 1), with `theta = acos(y)`:
/// T = cos(nθ), U = sin((n+1)θ)/sin θ, V = cos((n+½)θ)/cos(θ/2),
/// W = sin((n+½)θ)/sin(θ/2), and torch's fallbacks where a denominator is
/// degenerate (the shifted W's has no `y > 0` branch).
fn chebyshev_trig<T: Real>(kind: Kind, y: T, n: i64, shifted: bool) -> T {
    let (one, half, two) = (T::ONE, T::lit(0.5), T::lit(2.0));
    let theta = y.acos();
    match kind {
        Kind::T => (int::<T>(n) * theta).cos(),
        Kind::U => {
            if theta.sin() != T::ZERO {
                (int::<T>(n + 1) * theta).sin() / theta.sin()
            } else {
                int::<T>(n + 1) * (int::<T>(n + 1) * theta).cos() / y
            }
        }
        Kind::V => {
            if (theta / two).sin() != one {
                ((int::<T>(n) + half) * theta).cos() / (theta / two).cos()
            } else {
                alternate(n, int(n + n + 1))
            }
        }
        Kind::W => {
            if (theta / two).cos() != one {
                ((int::<T>(n) + half) * theta).sin() / (theta / two).sin()
            } else if y > T::ZERO && !shifted {
                int(n + n + 1)
            } else {
                alternate(n, one)
            }
        }
    }
}

/// `p_0 = 1, p_1 = first, p_{k} = two_y · p_{k-1} − p_{k-2}` up to `n`,
/// stopping once a term is NaN (as torch does).
fn recurrence<T: Real>(two_y: T, first: T, n: i64) -> T {
    if n == 0 {
        return T::ONE;
    }
    let (mut p, mut q) = (T::ONE, first);
    let mut r = first;
    let mut k = 2;
    while k <= n && !q.is_nan() {
        r = two_y * q - p;
        p = q;
        q = r;
        k += 1;
    }
    r
}

/// torch returns NaN above these degrees of the Hermite polynomials.
fn hermite_limit<T: Real>() -> i64 {
    if T::lit(1e-300) == T::ZERO {
        128 // f32 (and narrower)
    } else {
        512
    }
}

/// Physicists' Hermite polynomials: `H_{k+1} = 2x H_k − 2k H_{k-1}`.
fn hermite_h<T: Real>(x: T, n: i64) -> T {
    if n < 0 {
        return T::ZERO;
    }
    if n == 0 {
        return T::ONE;
    }
    if n == 1 {
        return x + x;
    }
    if n > hermite_limit::<T>() {
        return T::lit(f64::NAN);
    }
    let (mut p, mut q, mut r) = (T::ONE, x + x, T::ZERO);
    let mut k = 2;
    while k < n + n {
        r = (x + x) * q - int::<T>(k) * p;
        p = q;
        q = r;
        k += 2;
    }
    r
}

/// Probabilists' Hermite polynomials: `He_{k+1} = x He_k − k He_{k-1}`.
fn hermite_he<T: Real>(x: T, n: i64) -> T {
    if n < 0 {
        return T::ZERO;
    }
    if n == 0 {
        return T::ONE;
    }
    if n == 1 {
        return x;
    }
    if n > hermite_limit::<T>() {
        return T::lit(f64::NAN);
    }
    let (mut p, mut q, mut r) = (T::ONE, x, x);
    for k in 1..n {
        r = x * q - int::<T>(k) * p;
        p = q;
        q = r;
    }
    r
}

/// Laguerre polynomials: `(k+1) L_{k+1} = (2k + 1 − x) L_k − k L_{k-1}`.
fn laguerre_l<T: Real>(x: T, n: i64) -> T {
    if n < 0 {
        return T::ZERO;
    }
    if x.abs() == T::ZERO || n == 0 {
        return T::ONE;
    }
    let one = T::ONE;
    let (mut p, mut q) = (one, one - x);
    let mut r = q;
    let mut k = 1;
    while k < n && !q.is_nan() {
        r = ((int::<T>(k + k) + (one - x)) * q - int::<T>(k) * p) / int::<T>(k + 1);
        p = q;
        q = r;
        k += 1;
    }
    r
}

/// Legendre polynomials: `(k+1) P_{k+1} = (2k+1) x P_k − k P_{k-1}`.
fn legendre_p<T: Real>(x: T, n: i64) -> T {
    if n < 0 {
        return T::ZERO;
    }
    if x.abs() == T::ONE {
        return if x > T::ZERO { T::ONE } else { alternate(n, T::ONE) };
    }
    if n == 0 {
        return T::ONE;
    }
    let (mut p, mut q) = (T::ONE, x);
    let mut r = q;
    let mut k = 1;
    while k < n && !q.is_nan() {
        r = (int::<T>(k + k + 1) * x * q - int::<T>(k) * p) / int::<T>(k + 1);
        p = q;
        q = r;
        k += 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from the closed forms (and torch 2.15 for the special cases).
    #[test]
    fn known_values() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        let p = |op, x: f64, n: f64| polynomial(op, x, n).expect("a polynomial op");
        assert!(close(p(BinaryOp::ChebyshevT, 0.3, 3.0), 4.0 * 0.027 - 0.9));
        assert!(close(p(BinaryOp::ChebyshevT, 0.3, 9.0), (9.0 * 0.3f64.acos()).cos()));
        assert!(close(p(BinaryOp::ChebyshevU, 2.0, 2.0), 4.0 * 4.0 - 1.0));
        assert!(close(p(BinaryOp::ChebyshevU, -1.0, 3.0), -4.0));
        assert!(close(p(BinaryOp::ChebyshevV, -1.0, 2.0), 5.0));
        assert!(close(p(BinaryOp::ChebyshevW, 1.0, 2.0), 5.0));
        assert!(close(p(BinaryOp::ShiftedChebyshevT, 0.75, 2.0), 2.0 * 0.25 - 1.0));
        assert!(close(p(BinaryOp::HermiteH, 1.5, 3.0), 8.0 * 3.375 - 12.0 * 1.5));
        assert!(close(p(BinaryOp::HermiteHe, 1.5, 3.0), 3.375 - 3.0 * 1.5));
        assert!(close(p(BinaryOp::LaguerreL, 2.0, 2.0), (4.0 - 8.0 + 2.0) / 2.0));
        assert!(close(p(BinaryOp::LegendreP, 0.5, 2.0), (3.0 * 0.25 - 1.0) / 2.0));
        assert_eq!(p(BinaryOp::HermiteH, 0.5, -1.0), 0.0);
        // torch's int64 cast of NaN is i64::MIN: a negative degree, so 0.
        assert_eq!(p(BinaryOp::LegendreP, 0.5, f64::NAN), 0.0);
        assert!(polynomial::<f32>(BinaryOp::HermiteH, 0.5, 129.0).is_some_and(f32::is_nan));
        assert!(polynomial(BinaryOp::Add, 1.0, 1.0).is_none());
    }
}
