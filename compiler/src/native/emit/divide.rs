//! Division and remainder: integer `floor_div` / `rem` / `fmod` (Python's
//! and C's sign rules) on i32 and i64, and f32 `fmod`, torch's `remainder`
//! and `floor_divide`, each as the generic kernels compute it
//! (`kiln_kernels`' `IntElem::{floor_div, py_rem, c_rem}`, `float_py_rem`,
//! `float_floor_div`), bit for bit.
//!
//! Integers: the kernels fail on a zero divisor ("integer division by
//! zero") and wrap `MIN / −1` to `MIN` (remainder 0). x86's `idiv` traps on
//! both, and LLVM's `sdiv` is undefined there, so the division here never
//! sees them: the divisor is 1 where it is 0 or −1, the −1 results are
//! selected afterwards (`−x` wrapping, remainder 0), and each division's
//! `divisor == 0` is recorded in [`Body::zero_divisors`]: the function
//! then returns whether any element met one (`NativeFunction::can_fail`),
//! and the runtime runs the portable program, which reports the error.
//!
//! f32 fmod: libm's `fmodf` in the kernels (Rust's `%`), exact, so any
//! exact algorithm gives its bits. The object may call nothing (LLVM's
//! `frem` is a libcall), so it is long division on the mantissas in f64,
//! 28 bits a step: with `|x| = mx·2^ex`, `|y| = my·2^ey` (integers mx, my <
//! 2²⁴), the result is `((mx·2^(ex−ey)) mod my)·2^ey` with x's sign, and
//! `r ← (r·2^s) mod my` for shifts `s ≤ 28` keeps every value an integer
//! below 2⁵², so the f64 quotient's floor is the exact one and the
//! products and differences are exact (`remainder_step`). Ten fixed
//! steps cover the largest exponent gap (253) without a branch, so the
//! loop still vectorises. The special cases are glibc's: `|x| < |y|` gives
//! x, a zero divisor, an infinite x or a NaN gives `(x·y)/(x·y)` — x's
//! payload (quieted) if x is NaN, else y's, else the CPU's default NaN.

use super::{Body, Ty};

/// Which integer division result: the kernels' `IntElem` method.
#[derive(Copy, Clone, PartialEq)]
pub(super) enum IntDivision {
    /// `floor_div`: the quotient rounded toward −inf (Python's `//`).
    Floor,
    /// `py_rem`: the remainder with the divisor's sign (Python's `%`).
    PyRem,
    /// `c_rem`: the remainder with the dividend's sign (C's `%`, `fmod`).
    CRem,
}

/// Shift per long-division step: keeps `r·2^s < 2⁵²` for `r < 2²⁴`.
const STEP_BITS: i32 = 28;
/// Steps covering the largest exponent gap of two finite f32s (253 bits).
const STEPS: i32 = 10;
const _: () = assert!(STEP_BITS * STEPS >= 253);

impl Body {
    /// `kind` of two `ty` registers, as the kernels' `IntElem` methods;
    /// records the divisor's zero test.
    pub(super) fn int_division(&mut self, kind: IntDivision, x: &str, y: &str, ty: Ty) -> String {
        let (zero, one, mone) = (self.cint(0, ty), self.cint(1, ty), self.cint(-1, ty));
        let is_zero = self.cmpi("eq", y, &zero, ty);
        self.zero_divisors.push(is_zero.clone());
        let is_mone = self.cmpi("eq", y, &mone, ty);
        let unsafe_divisor = self.let_(format_args!("arith.ori {is_zero}, {is_mone} : i1"));
        // Never 0 or −1: `idiv` cannot trap, `sdiv` is defined.
        let d = self.select_ty(&unsafe_divisor, &one, y, ty);
        let q = self.int_op("divsi", x, &d, ty);
        let r = self.int_op("remsi", x, &d, ty);
        // x / −1 wraps (`MIN / −1 == MIN`), x % −1 is 0.
        let neg = self.int_op("subi", &zero, x, ty);
        let q = self.select_ty(&is_mone, &neg, &q, ty);
        let r = self.select_ty(&is_mone, &zero, &r, ty);
        if kind == IntDivision::CRem {
            return r;
        }
        // r != 0 and the signs of r and y differ: Python's floor rounding.
        let nonzero = self.cmpi("ne", &r, &zero, ty);
        let signs = self.int_op("xori", &r, y, ty);
        let differ = self.cmpi("slt", &signs, &zero, ty);
        let fix = self.let_(format_args!("arith.andi {nonzero}, {differ} : i1"));
        if kind == IntDivision::Floor {
            let q1 = self.int_op("subi", &q, &one, ty);
            self.select_ty(&fix, &q1, &q, ty)
        } else {
            let ry = self.int_op("addi", &r, y, ty);
            self.select_ty(&fix, &ry, &r, ty)
        }
    }

    /// torch's f32 `remainder` (`float_py_rem`): `m = fmod(a, b)`, plus b
    /// where m is nonzero (NaN included) and its sign differs from b's.
    pub(super) fn py_rem_f32(&mut self, a: &str, b: &str) -> String {
        let m = self.fmod(a, b);
        let fix = self.floor_fix(&m, b);
        let mb = self.add(&m, b);
        self.select(&fix, &mb, &m)
    }

    /// `m != 0 && ((b < 0) != (m < 0))` for f32 registers (IEEE compares:
    /// a NaN `m` is nonzero and not negative).
    fn floor_fix(&mut self, m: &str, b: &str) -> String {
        let nonzero = self.cmp_c("une", m, 0.0);
        let bneg = self.cmp_c("olt", b, 0.0);
        let mneg = self.cmp_c("olt", m, 0.0);
        let differ = self.let_(format_args!("arith.xori {bneg}, {mneg} : i1"));
        self.let_(format_args!("arith.andi {nonzero}, {differ} : i1"))
    }

    /// torch's f32 `floor_divide` (`float_floor_div`): `a / b` for a zero
    /// divisor; else `div = (a − fmod(a, b)) / b`, less one where the
    /// remainder's sign needs it; `0 · (a / b)` (the true quotient's sign)
    /// where that is 0; else `floor(div)`, plus one where `div − floor(div)
    /// > ½`.
    pub(super) fn floor_div_f32(&mut self, a: &str, b: &str) -> String {
        let q = self.div(a, b);
        let m = self.fmod(a, b);
        let am = self.sub(a, &m);
        let div = self.div(&am, b);
        let fix = self.floor_fix(&m, b);
        let one = self.c(1.0);
        let d1 = self.sub(&div, &one);
        let div = self.select(&fix, &d1, &div);
        let zero = self.c(0.0);
        let signed_zero = self.mul(&zero, &q);
        let fl = self.round_op(kiln_ir::UnaryOp::Floor, &div);
        let frac = self.sub(&div, &fl);
        let above = self.cmp_c("ogt", &frac, 0.5);
        let fl1 = self.add(&fl, &one);
        let fl = self.select(&above, &fl1, &fl);
        let is_zero = self.cmp_c("oeq", &div, 0.0);
        let r = self.select(&is_zero, &signed_zero, &fl);
        let b_zero = self.cmp_c("oeq", b, 0.0);
        self.select(&b_zero, &q, &r)
    }

    /// f32 `fmod(x, y)`, exact (see the module doc).
    pub(super) fn fmod(&mut self, x: &str, y: &str) -> String {
        let abs_mask = self.ci(0x7FFF_FFFF);
        let hx = self.let_(format_args!("arith.bitcast {x} : f32 to i32"));
        let hy = self.let_(format_args!("arith.bitcast {y} : f32 to i32"));
        let ax = self.let_(format_args!("arith.andi {hx}, {abs_mask} : i32"));
        let ay = self.let_(format_args!("arith.andi {hy}, {abs_mask} : i32"));
        let (mx, ex) = self.mantissa_exponent(&ax);
        let (my, ey) = self.mantissa_exponent(&ay);
        // The gap ex − ey, 0 where |x| < |y| (that result is x anyway).
        let gap = self.let_(format_args!("arith.subi {ex}, {ey} : i32"));
        let zero_i = self.ci(0);
        let gap = self.let_(format_args!("arith.maxsi {gap}, {zero_i} : i32"));
        let mut r = self.let_(format_args!("arith.sitofp {mx} : i32 to f64"));
        let m = self.let_(format_args!("arith.sitofp {my} : i32 to f64"));
        for k in 0..STEPS {
            r = self.remainder_step(&r, &m, &gap, k);
        }
        // r·2^(ey − 150): an f32 (a multiple of y's ulp below |y|), so the
        // f64 product and the narrowing are exact.
        let bias = self.let_(format_args!("arith.constant {} : i64", 1023 - 150));
        let ey64 = self.let_(format_args!("arith.extsi {ey} : i32 to i64"));
        let biased = self.let_(format_args!("arith.addi {ey64}, {bias} : i64"));
        let c52 = self.let_("arith.constant 52 : i64");
        let pbits = self.let_(format_args!("arith.shli {biased}, {c52} : i64"));
        let p = self.let_(format_args!("arith.bitcast {pbits} : i64 to f64"));
        let v = self.let_(format_args!("arith.mulf {r}, {p} : f64"));
        let v = self.let_(format_args!("arith.truncf {v} : f64 to f32"));
        let v = self.copysign(&v, x);
        let small = self.let_(format_args!("arith.cmpi slt, {ax}, {ay} : i32"));
        let v = self.select(&small, x, &v);
        let nan = self.fmod_nan(x, y, &ax, &ay);
        let (inf_bits, zero_i) = (self.ci(0x7F80_0000), self.ci(0));
        let y_zero = self.let_(format_args!("arith.cmpi eq, {ay}, {zero_i} : i32"));
        let x_inf_nan = self.let_(format_args!("arith.cmpi sge, {ax}, {inf_bits} : i32"));
        let y_nan = self.let_(format_args!("arith.cmpi sgt, {ay}, {inf_bits} : i32"));
        let special = self.let_(format_args!("arith.ori {y_zero}, {x_inf_nan} : i1"));
        let special = self.let_(format_args!("arith.ori {special}, {y_nan} : i1"));
        self.select(&special, &nan, &v)
    }

    /// `(m, e)` of a finite f32's magnitude bits `a`: `|v| = m·2^(e − 150)`,
    /// m an integer below 2²⁴ (the implicit bit set for normals), e ≥ 1.
    fn mantissa_exponent(&mut self, a: &str) -> (String, String) {
        let (c23, frac_mask, implicit, one, zero) =
            (self.ci(23), self.ci(0x007F_FFFF), self.ci(0x0080_0000), self.ci(1), self.ci(0));
        let biased = self.let_(format_args!("arith.shrui {a}, {c23} : i32"));
        let frac = self.let_(format_args!("arith.andi {a}, {frac_mask} : i32"));
        let normal = self.let_(format_args!("arith.cmpi ne, {biased}, {zero} : i32"));
        let bit = self.let_(format_args!("arith.select {normal}, {implicit}, {zero} : i32"));
        let m = self.let_(format_args!("arith.ori {frac}, {bit} : i32"));
        let e = self.let_(format_args!("arith.maxsi {biased}, {one} : i32"));
        (m, e)
    }

    /// Step `k` of the long division: `(r·2^s) mod m` with `s = clamp(gap −
    /// 28k, 0, 28)`, for f64 integers `r < m < 2²⁴`. The f64 quotient `q` of
    /// `v = r·2^s < 2⁵²` by `m ≥ 1` has the exact quotient's floor: its
    /// rounding error is below half an ulp of `q < 2⁵²/m`, so below `1/(2m)`,
    /// while an exact quotient below an integer is at least `1/m` below it.
    /// So `v − floor(q)·m` is the remainder, exactly (integers below 2⁵³).
    /// Flooring by `(q + 2⁵²) − 2⁵²` (nearest), less one where that exceeds
    /// q, needs no libm and no SSE4.1.
    fn remainder_step(&mut self, r: &str, m: &str, gap: &str, k: i32) -> String {
        let (done, step, zero, one) = (self.ci(STEP_BITS * k), self.ci(STEP_BITS), self.ci(0), self.ci(1));
        let s = self.let_(format_args!("arith.subi {gap}, {done} : i32"));
        let s = self.let_(format_args!("arith.maxsi {s}, {zero} : i32"));
        let s = self.let_(format_args!("arith.minsi {s}, {step} : i32"));
        let pow = self.let_(format_args!("arith.shli {one}, {s} : i32"));
        let pow = self.let_(format_args!("arith.sitofp {pow} : i32 to f64"));
        let v = self.let_(format_args!("arith.mulf {r}, {pow} : f64"));
        let q = self.let_(format_args!("arith.divf {v}, {m} : f64"));
        let magic = self.let_(format_args!("arith.constant 0x{:016X} : f64", 2f64.powi(52).to_bits()));
        let shifted = self.let_(format_args!("arith.addf {q}, {magic} : f64"));
        let near = self.let_(format_args!("arith.subf {shifted}, {magic} : f64"));
        let above = self.let_(format_args!("arith.cmpf ogt, {near}, {q} : f64"));
        let one_f = self.let_("arith.constant 1.0 : f64");
        let below = self.let_(format_args!("arith.subf {near}, {one_f} : f64"));
        let fl = self.let_(format_args!("arith.select {above}, {below}, {near} : f64"));
        let prod = self.let_(format_args!("arith.mulf {fl}, {m} : f64"));
        self.let_(format_args!("arith.subf {v}, {prod} : f64"))
    }

    /// glibc's NaN for fmod's special cases, `(x·y)/(x·y)`, chosen
    /// explicitly (LLVM may order a product's operands either way): x
    /// quieted if x is NaN, else y quieted if y is NaN, else the CPU's
    /// default NaN (`0/0`, `inf/inf`).
    fn fmod_nan(&mut self, x: &str, y: &str, ax: &str, ay: &str) -> String {
        let inf_bits = self.ci(0x7F80_0000);
        let x_nan = self.let_(format_args!("arith.cmpi sgt, {ax}, {inf_bits} : i32"));
        let y_nan = self.let_(format_args!("arith.cmpi sgt, {ay}, {inf_bits} : i32"));
        let qx = self.add(x, x);
        let qy = self.add(y, y);
        let p = self.mul(x, y);
        let d = self.div(&p, &p);
        let v = self.select(&y_nan, &qy, &d);
        self.select(&x_nan, &qx, &v)
    }
}
