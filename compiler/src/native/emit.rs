//! A fused program as an MLIR function (textual `func`/`scf`/`arith`/`math`
//! plus `llvm` pointer ops) over raw pointers, with the C ABI of
//! `kiln_runtime::native::NativeFunction`:
//! `fn(ins: *const *const u8, out: *mut u8, start: i64, end: i64)`.
//!
//! The loop body is scalar and branch-free (selects, no calls), so LLVM's
//! loop vectoriser widens it for the target CPU. Transcendentals are the
//! CPU kernels' own polynomials (`kernels/src/x86_64/avx2/math.rs`) written
//! out in arith ops — the same coefficient tables (`kiln_isa::math`, through
//! `kiln_ir::math`) and operation order, FMA where the kernels use one
//! (`llvm.intr.fmuladd`: fused where the CPU level has FMA, never a libm
//! call) — so accuracy matches and the object needs no symbols. The ops the
//! kernels take from libm (log and its kin) are Cephes-style polynomials
//! here, within 1–3 ulp of libm (bounds at each function), except sin, cos
//! and tan: glibc's own algorithms, bit for bit (`emit/trig.rs`), and the
//! inverse trig, hyperbolic and pow functions: f64 evaluations rounded once
//! (`emit/inverse.rs`); rounding ops are exact integer-conversion sequences
//! (LLVM would call `floorf` on CPUs without SSE4.1). Anything else returns
//! [`Unsupported`] and the group stays portable.

use kiln_ir::math::{
    ERFC_EXPONENT_POLY, ERFC_TAIL_POLY, ERFC_ZERO, ERF_SMALL_POLY, ERF_SPLIT, EXP_HI, EXP_LN2_HI, EXP_LN2_LO, EXP_LO,
    EXP_POLY, GELU_TANH_CUBIC, LOG_POLY, LOG_SQRT_HALF, SQRT_2_OVER_PI, TANH_POLY, TANH_SMALL,
};
use kiln_ir::{BinaryOp, DType, FusedOp, UnaryOp};
use kiln_runtime::native::InputMode;
use std::fmt::Write;

/// Why a program cannot be compiled (the group then stays on the portable kernel).
#[derive(Debug, PartialEq)]
pub struct Unsupported(pub String);

/// The register types this lowering handles: f32 values, i1 masks (bool
/// tensors: one byte 0/1 in memory, read as `!= 0`, written as 0/1),
/// i32 / i64 integers and f16 / bf16 values as their 16 bits (`emit/half.rs`:
/// widened to f32 for each op, the result rounded back).
#[derive(Copy, Clone, PartialEq, Debug)]
enum Ty {
    F32,
    Bool,
    I32,
    I64,
    F16,
    Bf16,
}

impl Ty {
    /// The register type of an operand or result of `dtype`, if native code handles it.
    fn of(dtype: DType) -> Result<Ty, Unsupported> {
        match dtype {
            DType::F32 => Ok(Ty::F32),
            DType::Bool => Ok(Ty::Bool),
            DType::I32 => Ok(Ty::I32),
            DType::I64 => Ok(Ty::I64),
            DType::F16 => Ok(Ty::F16),
            DType::BF16 => Ok(Ty::Bf16),
            other => Err(Unsupported(format!("{other} operands"))),
        }
    }

    /// The MLIR type of a register.
    fn reg(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::Bool => "i1",
            Ty::I32 => "i32",
            Ty::I64 => "i64",
            Ty::F16 | Ty::Bf16 => "i16",
        }
    }

    /// The MLIR type of an element in memory.
    fn mem(self) -> &'static str {
        match self {
            Ty::Bool => "i8",
            other => other.reg(),
        }
    }

    fn is_int(self) -> bool {
        matches!(self, Ty::I32 | Ty::I64)
    }
}

/// The MLIR lines (at `indent`) loading element `idx` of `ptr` as a `ty`
/// register named `name`: a bool byte becomes `byte != 0`.
fn load_lines(indent: &str, name: &str, ptr: &str, idx: Option<&str>, ty: Ty) -> String {
    let mem = ty.mem();
    let mut s = String::new();
    let at = match idx {
        Some(idx) => {
            let _ = writeln!(
                s,
                "{indent}{name}_a = llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr, i64) -> !llvm.ptr, {mem}"
            );
            format!("{name}_a")
        }
        None => ptr.to_string(),
    };
    if ty == Ty::Bool {
        let _ = writeln!(s, "{indent}{name}_b = llvm.load {at} : !llvm.ptr -> i8");
        let _ = writeln!(s, "{indent}{name}_z = arith.constant 0 : i8");
        let _ = writeln!(s, "{indent}{name} = arith.cmpi ne, {name}_b, {name}_z : i8");
    } else {
        let _ = writeln!(s, "{indent}{name} = llvm.load {at} : !llvm.ptr -> {mem}");
    }
    s
}

mod divide;
mod half;
mod inverse;
use divide::IntDivision;
pub mod rows;
mod trig;

/// An SSA body under construction: every `let_` defines the next `%vN`.
struct Body {
    text: String,
    next: usize,
    /// The i1 registers `divisor == 0` of each integer division so far
    /// (`emit/divide.rs`): a function with any returns whether one held.
    zero_divisors: Vec<String>,
}

impl Body {
    fn new(next: usize) -> Body {
        Body { text: String::new(), next, zero_divisors: Vec::new() }
    }
}

/// 2²³: every f32 at least this large is an integer.
const TWO_23: f32 = 8_388_608.0;

impl Body {
    fn let_(&mut self, rhs: impl std::fmt::Display) -> String {
        let name = format!("%v{}", self.next);
        self.next += 1;
        let _ = writeln!(self.text, "      {name} = {rhs}");
        name
    }

    fn c(&mut self, v: f32) -> String {
        self.let_(format_args!("arith.constant 0x{:08X} : f32", v.to_bits()))
    }

    fn ci(&mut self, v: i32) -> String {
        self.let_(format_args!("arith.constant {v} : i32"))
    }

    fn bin(&mut self, op: &str, a: &str, b: &str) -> String {
        self.let_(format_args!("arith.{op} {a}, {b} : f32"))
    }

    fn add(&mut self, a: &str, b: &str) -> String {
        self.bin("addf", a, b)
    }

    fn sub(&mut self, a: &str, b: &str) -> String {
        self.bin("subf", a, b)
    }

    fn mul(&mut self, a: &str, b: &str) -> String {
        self.bin("mulf", a, b)
    }

    fn div(&mut self, a: &str, b: &str) -> String {
        self.bin("divf", a, b)
    }

    fn neg(&mut self, a: &str) -> String {
        self.let_(format_args!("arith.negf {a} : f32"))
    }

    /// `a·b + c`, fused where the CPU has FMA (as the kernels' `fmadd`).
    fn fma(&mut self, a: &str, b: &str, c: &str) -> String {
        self.let_(format_args!("llvm.intr.fmuladd({a}, {b}, {c}) : (f32, f32, f32) -> f32"))
    }

    fn fma_c(&mut self, a: &str, b: &str, c: f32) -> String {
        let c = self.c(c);
        self.fma(a, b, &c)
    }

    fn cmp(&mut self, pred: &str, a: &str, b: &str) -> String {
        self.let_(format_args!("arith.cmpf {pred}, {a}, {b} : f32"))
    }

    fn cmp_c(&mut self, pred: &str, a: &str, b: f32) -> String {
        let b = self.c(b);
        self.cmp(pred, a, &b)
    }

    fn select(&mut self, cond: &str, a: &str, b: &str) -> String {
        self.let_(format_args!("arith.select {cond}, {a}, {b} : f32"))
    }

    fn is_nan(&mut self, a: &str) -> String {
        self.cmp("uno", a, a)
    }

    fn abs(&mut self, a: &str) -> String {
        self.let_(format_args!("math.absf {a} : f32"))
    }

    /// Horner's rule from the highest coefficient, as the kernels evaluate it.
    fn horner(&mut self, x: &str, coeffs: &[f32]) -> String {
        let mut p = self.c(coeffs[0]);
        for &c in &coeffs[1..] {
            p = self.fma_c(&p, x, c);
        }
        p
    }

    /// exp(x) as `(a, s)` with `exp(x) = a·s`: `exp_parts` of the AVX2 kernels.
    fn exp_parts(&mut self, x: &str) -> (String, String) {
        let lo = self.c(EXP_LO);
        let gt = self.cmp("ogt", x, &lo);
        let xc = self.select(&gt, x, &lo);
        let hi = self.c(EXP_HI);
        let lt = self.cmp("olt", &xc, &hi);
        let xc = self.select(&lt, &xc, &hi);
        let log2e = self.c(std::f32::consts::LOG2_E);
        let t = self.mul(&xc, &log2e);
        // Round to nearest even: |t| < 2^22 after the clamp.
        let magic = self.c(12_582_912.0);
        let shifted = self.add(&t, &magic);
        let n = self.sub(&shifted, &magic);
        let nn = self.neg(&n);
        let c1 = self.c(EXP_LN2_HI);
        let r = self.fma(&nn, &c1, &xc);
        let c2 = self.c(EXP_LN2_LO);
        let r = self.fma(&nn, &c2, &r);
        let p = self.horner(&r, &EXP_POLY);
        let rr = self.mul(&r, &r);
        let small = self.fma(&p, &rr, &r);
        let one = self.c(1.0);
        let y = self.add(&small, &one);
        let ni = self.let_(format_args!("arith.fptosi {n} : f32 to i32"));
        let c1i = self.ci(1);
        let n1 = self.let_(format_args!("arith.shrsi {ni}, {c1i} : i32"));
        let n2 = self.let_(format_args!("arith.subi {ni}, {n1} : i32"));
        let s1 = self.pow2(&n1);
        let s2 = self.pow2(&n2);
        (self.mul(&y, &s1), s2)
    }

    /// 2^n for a normal exponent `n` (an i32 register).
    fn pow2(&mut self, n: &str) -> String {
        let bias = self.ci(127);
        let sh = self.ci(23);
        let b = self.let_(format_args!("arith.addi {n}, {bias} : i32"));
        let bits = self.let_(format_args!("arith.shli {b}, {sh} : i32"));
        self.let_(format_args!("arith.bitcast {bits} : i32 to f32"))
    }

    fn exp(&mut self, x: &str) -> String {
        let (a, s) = self.exp_parts(x);
        let e = self.mul(&a, &s);
        let nan = self.is_nan(x);
        self.select(&nan, x, &e)
    }

    fn tanh(&mut self, x: &str) -> String {
        let ax = self.abs(x);
        let z = self.mul(x, x);
        let p = self.horner(&z, &TANH_POLY);
        let pz = self.mul(&p, &z);
        let small = self.fma(&pz, &ax, &ax);
        let two_ax = self.add(&ax, &ax);
        let e = self.exp(&two_ax);
        let one = self.c(1.0);
        let e1 = self.add(&e, &one);
        let two = self.c(2.0);
        let q = self.div(&two, &e1);
        let large = self.sub(&one, &q);
        let is_small = self.cmp_c("olt", &ax, TANH_SMALL);
        let t = self.select(&is_small, &small, &large);
        self.let_(format_args!("math.copysign {t}, {x} : f32"))
    }

    fn gelu_tanh(&mut self, x: &str) -> String {
        let x2 = self.mul(x, x);
        let k = self.c(GELU_TANH_CUBIC);
        let kx2 = self.mul(&k, &x2);
        let inner = self.fma(&kx2, x, x);
        let a_inner = self.abs(&inner);
        let m2 = self.c(-2.0f32 * SQRT_2_OVER_PI);
        let m2z = self.mul(&a_inner, &m2);
        let (a, s) = self.exp_parts(&m2z);
        let one = self.c(1.0);
        let denom = self.fma(&a, &s, &one);
        let pos = self.div(x, &denom);
        let xa = self.mul(x, &a);
        let q = self.div(&xa, &denom);
        let neg = self.mul(&q, &s);
        let tiny = self.cmp_c("olt", &m2z, EXP_LO);
        let mzero = self.c(-0.0);
        let neg = self.select(&tiny, &mzero, &neg);
        let below = self.cmp_c("olt", x, 0.0);
        let g = self.select(&below, &neg, &pos);
        self.minus_inf_is_nan(x, &g)
    }

    /// erf on |x| ≤ `ERF_SPLIT`: `x + x·P(x²)` (the kernels' `erf_small_ps`).
    fn erf_small(&mut self, x: &str) -> String {
        let s = self.mul(x, x);
        let r = self.horner(&s, &ERF_SMALL_POLY);
        self.fma(&r, x, x)
    }

    /// `q` with `erfc(t) = exp(q)` for t ≥ `ERF_SPLIT` (`erfc_exponent_ps`).
    fn erfc_exponent(&mut self, t: &str) -> String {
        let s = self.mul(t, t);
        let [c0, c1, c2, c3, rest @ ..] = ERFC_EXPONENT_POLY;
        let c0 = self.c(c0);
        let r = self.fma_c(&c0, t, c1);
        let c2 = self.c(c2);
        let u = self.fma_c(&c2, t, c3);
        let mut r = self.fma(&r, &s, &u);
        for c in rest {
            r = self.fma_c(&r, t, c);
        }
        let nt = self.neg(t);
        self.fma(&r, t, &nt)
    }

    /// erf(x): the odd polynomial near 0, `±(1 − exp(q(|x|)))` beyond; NaN
    /// stays NaN (it compares false and takes the polynomial).
    fn erf(&mut self, x: &str) -> String {
        let t = self.abs(x);
        let small = self.erf_small(x);
        let beyond = self.cmp_c("ogt", &t, ERF_SPLIT);
        let q = self.erfc_exponent(&t);
        let e = self.exp(&q);
        let one = self.c(1.0);
        let large = self.sub(&one, &e);
        let large = self.let_(format_args!("math.copysign {large}, {x} : f32"));
        self.select(&beyond, &large, &small)
    }

    /// erfc(t) on the left tail of GELU as `(m, s)`, `erfc(t) = m·s`, from
    /// `t² = sq + err` (`erfc_tail_parts`).
    fn erfc_tail_parts(&mut self, t: &str, sq: &str, err: &str) -> (String, String) {
        let two = self.c(2.0);
        let tm = self.sub(t, &two);
        let tp = self.add(t, &two);
        let q = self.div(&tm, &tp);
        let p = self.horner(&q, &ERFC_TAIL_POLY);
        let d = self.fma_c(&two, t, 1.0);
        let r = self.div(&p, &d);
        let nsq = self.neg(sq);
        let (a, scale) = self.exp_parts(&nsq);
        let na = self.neg(&a);
        let a = self.fma(&na, err, &a);
        (self.mul(&r, &a), scale)
    }

    /// Exact GELU `x·Φ(x)` (the kernels' `gelu_ps`): `x/2·(1 + erf(x/√2))`
    /// except on the left tail, `x/2·erfc(−x/√2)` with erfc of full relative
    /// precision. `x² − round(x²)` is exact only where `fmuladd` fuses (every
    /// level but the baseline, whose tail loses ~t²·2⁻²⁴ relative).
    fn gelu(&mut self, x: &str) -> String {
        let r2 = self.c(std::f32::consts::FRAC_1_SQRT_2);
        let u = self.mul(x, &r2);
        let half = self.c(0.5);
        let half_x = self.mul(x, &half);
        let e = self.erf(&u);
        let one = self.c(1.0);
        let ope = self.add(&one, &e);
        let right = self.mul(&half_x, &ope);
        let t = self.neg(&u);
        let in_tail = self.cmp_c("ogt", &t, ERF_SPLIT);
        let xx = self.mul(x, x);
        let sq = self.mul(&xx, &half);
        let nxx = self.neg(&xx);
        let e0 = self.fma(x, x, &nxx);
        let err = self.mul(&e0, &half);
        let below = self.cmp_c("olt", &t, ERFC_ZERO);
        let cap = self.c(ERFC_ZERO);
        let tc = self.select(&below, &t, &cap);
        let (m, scale) = self.erfc_tail_parts(&tc, &sq, &err);
        let hm = self.mul(&half_x, &m);
        let left = self.mul(&hm, &scale);
        let zeroed = self.cmp_c("oge", &t, ERFC_ZERO);
        let mzero = self.c(-0.0);
        let left = self.select(&zeroed, &mzero, &left);
        let g = self.select(&in_tail, &left, &right);
        self.minus_inf_is_nan(x, &g)
    }

    fn minus_inf_is_nan(&mut self, x: &str, g: &str) -> String {
        let nan = self.is_nan(x);
        let g = self.select(&nan, x, g);
        let ninf = self.cmp_c("oeq", x, f32::NEG_INFINITY);
        let qnan = self.c(f32::NAN);
        self.select(&ninf, &qnan, &g)
    }

    fn ci_select(&mut self, cond: &str, a: i32, b: i32) -> String {
        let (a, b) = (self.ci(a), self.ci(b));
        self.let_(format_args!("arith.select {cond}, {a}, {b} : i32"))
    }

    fn copysign(&mut self, t: &str, x: &str) -> String {
        self.let_(format_args!("math.copysign {t}, {x} : f32"))
    }

    /// `(e, y, f)` with `ln x ≈ e·ln2 + f + y` for finite x > 0 (Cephes'
    /// logf): `x = 2^e·(1 + f)` with `1 + f ∈ [√½, √2)` (subnormals scaled by
    /// 2²³ first; `f` exact), `y = f³·P(f) − f²/2`. `e` is an f32 register.
    fn log_parts(&mut self, x: &str) -> (String, String, String) {
        let tiny = self.cmp_c("olt", x, f32::MIN_POSITIVE);
        let scale = self.c(TWO_23);
        let scaled = self.mul(x, &scale);
        let xs = self.select(&tiny, &scaled, x);
        let bits = self.let_(format_args!("arith.bitcast {xs} : f32 to i32"));
        let c23 = self.ci(23);
        let biased = self.let_(format_args!("arith.shrsi {bits}, {c23} : i32"));
        // The exponent with the mantissa in [0.5, 1), less the scaling.
        let c126 = self.ci(126);
        let e = self.let_(format_args!("arith.subi {biased}, {c126} : i32"));
        let adj = self.ci_select(&tiny, 23, 0);
        let e = self.let_(format_args!("arith.subi {e}, {adj} : i32"));
        let mask = self.ci(0x007F_FFFF);
        let half = self.ci(0x3F00_0000);
        let mb = self.let_(format_args!("arith.andi {bits}, {mask} : i32"));
        let mb = self.let_(format_args!("arith.ori {mb}, {half} : i32"));
        let m = self.let_(format_args!("arith.bitcast {mb} : i32 to f32"));
        let small = self.cmp_c("olt", &m, LOG_SQRT_HALF);
        let dec = self.ci_select(&small, 1, 0);
        let e = self.let_(format_args!("arith.subi {e}, {dec} : i32"));
        let ef = self.let_(format_args!("arith.sitofp {e} : i32 to f32"));
        // f = m − 1, or 2m − 1 below √½ (both exact).
        let one = self.c(1.0);
        let mm1 = self.sub(&m, &one);
        let zero = self.c(0.0);
        let extra = self.select(&small, &m, &zero);
        let f = self.add(&mm1, &extra);
        let z = self.mul(&f, &f);
        let p = self.horner(&f, &LOG_POLY);
        let pf = self.mul(&p, &f);
        let y = self.mul(&pf, &z);
        (ef, y, f)
    }

    /// The special cases of a logarithm: NaN stays, x < 0 is NaN, ±0 is
    /// −inf, +inf is +inf; `r` elsewhere.
    fn log_specials(&mut self, x: &str, r: &str) -> String {
        let inf = self.cmp_c("oeq", x, f32::INFINITY);
        let g = self.select(&inf, x, r);
        let zero = self.cmp_c("oeq", x, 0.0);
        let ninf = self.c(f32::NEG_INFINITY);
        let g = self.select(&zero, &ninf, &g);
        let neg = self.cmp_c("olt", x, 0.0);
        let qnan = self.c(f32::NAN);
        let g = self.select(&neg, &qnan, &g);
        let nan = self.is_nan(x);
        self.select(&nan, x, &g)
    }

    /// ln x, `e·ln2 + (f + y)` with ln2 split as exp's Cody–Waite pair.
    /// Exhaustively ≤ 1 ulp from glibc's logf, with or without FMA.
    fn log(&mut self, x: &str) -> String {
        let (e, y, f) = self.log_parts(x);
        let lo = self.c(EXP_LN2_LO);
        let y = self.fma(&e, &lo, &y);
        let mhalf = self.c(-0.5);
        let z = self.mul(&f, &f);
        let y = self.fma(&z, &mhalf, &y);
        let r = self.add(&f, &y);
        let hi = self.c(EXP_LN2_HI);
        let r = self.fma(&e, &hi, &r);
        self.log_specials(x, &r)
    }

    /// ln of the mantissa, `f + y − f²/2`, unrounded as `(f, y')`.
    fn log_mantissa(&mut self, x: &str) -> (String, String, String) {
        let (e, y, f) = self.log_parts(x);
        let mhalf = self.c(-0.5);
        let z = self.mul(&f, &f);
        let y = self.fma(&z, &mhalf, &y);
        (e, y, f)
    }

    /// log₂ x = e + (f + y)·log₂e, log₂e split so the large term `f·log₂e`
    /// is rounded once: exact at powers of two; ≤ 1 ulp from libm with FMA,
    /// ≤ 2 without (sampled over every 61st f32).
    fn log2(&mut self, x: &str) -> String {
        let (e, y, f) = self.log_mantissa(x);
        let r = self.add(&f, &y);
        let l2e = self.c(std::f32::consts::LOG2_E);
        let l2e_lo = self.c((std::f64::consts::LOG2_E - std::f32::consts::LOG2_E as f64) as f32);
        let yl = self.mul(&y, &l2e);
        let t = self.fma(&r, &l2e_lo, &yl);
        let t = self.fma(&f, &l2e, &t);
        let r = self.add(&t, &e);
        self.log_specials(x, &r)
    }

    /// log₁₀ x = e·log₁₀2 + (f + y)·log₁₀e, log₁₀2 split so `e·hi` is exact:
    /// ≤ 2 ulp from libm (sampled over every 61st f32).
    fn log10(&mut self, x: &str) -> String {
        const LOG10_2_HI: f32 = f32::from_bits(0x3E9A_2000);
        let (e, y, f) = self.log_mantissa(x);
        let r = self.add(&f, &y);
        let lo = self.c((std::f64::consts::LOG10_2 - LOG10_2_HI as f64) as f32);
        let elo = self.mul(&e, &lo);
        let l10e = self.c(std::f32::consts::LOG10_E);
        let t = self.fma(&r, &l10e, &elo);
        let hi = self.c(LOG10_2_HI);
        let r = self.fma(&e, &hi, &t);
        self.log_specials(x, &r)
    }

    /// ln(1 + x) by Goldberg's `ln(u)·x/(u − 1)`, `u = 1 + x` (x where
    /// `u − 1` is 0; `+inf` stays): ≤ 2 ulp from libm (sampled).
    fn log1p(&mut self, x: &str) -> String {
        let one = self.c(1.0);
        let u = self.add(&one, x);
        let d = self.sub(&u, &one);
        let lu = self.log(&u);
        let q = self.div(x, &d);
        let r = self.mul(&lu, &q);
        let exact = self.cmp_c("oeq", &d, 0.0);
        let r = self.select(&exact, x, &r);
        let inf = self.cmp_c("oeq", x, f32::INFINITY);
        self.select(&inf, x, &r)
    }

    /// eˣ − 1: `e^x − 1` for |x| ≥ ½ (no cancellation), Kahan's
    /// `(u − 1)·x / ln u` (`u = e^x`, x where `u` is 1) below: ≤ 3 ulp from
    /// libm (sampled).
    fn expm1(&mut self, x: &str) -> String {
        let u = self.exp(x);
        let one = self.c(1.0);
        let um1 = self.sub(&u, &one);
        let lu = self.log(&u);
        let num = self.mul(&um1, x);
        let k = self.div(&num, &lu);
        let exact = self.cmp_c("oeq", &um1, 0.0);
        let k = self.select(&exact, x, &k);
        let ax = self.abs(x);
        let near0 = self.cmp_c("olt", &ax, 0.5);
        self.select(&near0, &k, &um1)
    }

    /// A rounding op (floor, ceil, trunc, round-half-even), exact: through
    /// an i32 conversion below 2²³ (every larger f32, inf and NaN is its
    /// own result), x's sign put back so that −0.5 gives −0 as libm does.
    fn round_op(&mut self, op: UnaryOp, x: &str) -> String {
        let ax = self.abs(x);
        let small = self.cmp_c("olt", &ax, TWO_23);
        let r = if op == UnaryOp::Round {
            // Adding 2²³ rounds |x| to an integer, ties to even.
            let big = self.c(TWO_23);
            let s = self.add(&ax, &big);
            self.sub(&s, &big)
        } else {
            // The conversion only sees values it can hold.
            let zero = self.c(0.0);
            let xc = self.select(&small, x, &zero);
            let i = self.let_(format_args!("arith.fptosi {xc} : f32 to i32"));
            let t = self.let_(format_args!("arith.sitofp {i} : i32 to f32"));
            let one = self.c(1.0);
            match op {
                UnaryOp::Floor => {
                    let above = self.cmp("ogt", &t, &xc);
                    let t1 = self.sub(&t, &one);
                    self.select(&above, &t1, &t)
                }
                UnaryOp::Ceil => {
                    let below = self.cmp("olt", &t, &xc);
                    let t1 = self.add(&t, &one);
                    self.select(&below, &t1, &t)
                }
                _ => t,
            }
        };
        let r = self.copysign(&r, x);
        self.select(&small, &r, x)
    }

    /// 1 for x > 0, −1 for x < 0, +0 for ±0 and NaN (torch's rule).
    fn sign(&mut self, x: &str) -> String {
        let zero = self.c(0.0);
        let (one, mone) = (self.c(1.0), self.c(-1.0));
        let lt = self.cmp("olt", x, &zero);
        let r = self.select(&lt, &mone, &zero);
        let gt = self.cmp("ogt", x, &zero);
        self.select(&gt, &one, &r)
    }

    fn unary(&mut self, op: UnaryOp, x: &str) -> Result<String, Unsupported> {
        Ok(match op {
            UnaryOp::Neg => self.neg(x),
            UnaryOp::Abs => self.abs(x),
            UnaryOp::Exp => self.exp(x),
            UnaryOp::Sqrt => self.let_(format_args!("math.sqrt {x} : f32")),
            UnaryOp::Rsqrt => {
                let s = self.let_(format_args!("math.sqrt {x} : f32"));
                let one = self.c(1.0);
                self.div(&one, &s)
            }
            UnaryOp::Reciprocal => {
                let one = self.c(1.0);
                self.div(&one, x)
            }
            UnaryOp::Relu => {
                let zero = self.c(0.0);
                let lt = self.cmp("olt", x, &zero);
                self.select(&lt, &zero, x)
            }
            UnaryOp::Sigmoid | UnaryOp::Silu => {
                let nx = self.neg(x);
                let e = self.exp(&nx);
                let one = self.c(1.0);
                let d = self.add(&one, &e);
                let num = if op == UnaryOp::Sigmoid { one } else { x.to_string() };
                self.div(&num, &d)
            }
            UnaryOp::Tanh => self.tanh(x),
            UnaryOp::GeluTanh => self.gelu_tanh(x),
            UnaryOp::Erf => self.erf(x),
            UnaryOp::Gelu => self.gelu(x),
            UnaryOp::Log => self.log(x),
            UnaryOp::Log2 => self.log2(x),
            UnaryOp::Log10 => self.log10(x),
            UnaryOp::Log1p => self.log1p(x),
            UnaryOp::Expm1 => self.expm1(x),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Trunc | UnaryOp::Round => self.round_op(op, x),
            UnaryOp::Sign => self.sign(x),
            UnaryOp::Sin => self.sin_cos(x, false),
            UnaryOp::Cos => self.sin_cos(x, true),
            UnaryOp::Tan => self.tan(x),
            UnaryOp::Asin => self.asin(x),
            UnaryOp::Acos => self.acos(x),
            UnaryOp::Atan => self.atan(x),
            UnaryOp::Sinh => self.sinh(x),
            UnaryOp::Cosh => self.cosh(x),
            UnaryOp::Asinh => self.asinh(x),
            UnaryOp::Acosh => self.acosh(x),
            UnaryOp::Atanh => self.atanh(x),
            other => return Err(Unsupported(format!("unary {other}"))),
        })
    }
}

/// The MLIR function text of `program` as function `symbol`, reading operand
/// `i` (of dtype `dtypes[i]`) as `modes[i]` says and storing its result.
/// Operands and the result are f32, bool, i32, i64, f16 or bf16. See
/// [`program_function`] for the function's return value.
pub fn program_to_mlir(
    symbol: &str,
    program: &[FusedOp],
    modes: &[InputMode],
    dtypes: &[DType],
) -> Result<String, Unsupported> {
    program_function(symbol, program, modes, dtypes).map(|(text, _)| text)
}

/// [`program_to_mlir`], and whether the function can fail
/// (`NativeFunction::can_fail`): with an integer division or remainder in
/// the program it returns an `i32`, 1 where some element of `start..end`
/// met a zero divisor (its results are then unspecified), else 0 (see
/// `emit/divide.rs`); otherwise it returns nothing.
pub fn program_function(
    symbol: &str,
    program: &[FusedOp],
    modes: &[InputMode],
    dtypes: &[DType],
) -> Result<(String, bool), Unsupported> {
    if modes.len() != dtypes.len() {
        return Err(Unsupported(format!("{} modes for {} operands", modes.len(), dtypes.len())));
    }
    let mut b = Body::new(0);
    let mut head = String::new();
    let mut regs: Vec<(String, Ty)> = Vec::new();
    let mut loads = String::new();
    for (i, (mode, &dtype)) in modes.iter().zip(dtypes).enumerate() {
        let ty = Ty::of(dtype)?;
        let _ = writeln!(head, "    %pa{i} = llvm.getelementptr %ins[{i}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr");
        let _ = writeln!(head, "    %p{i} = llvm.load %pa{i} : !llvm.ptr -> !llvm.ptr");
        match mode {
            InputMode::Splat => {
                head.push_str(&load_lines("    ", &format!("%s{i}"), &format!("%p{i}"), None, ty));
                regs.push((format!("%s{i}"), ty));
            }
            InputMode::Broadcast { inner, period } => {
                // Element (i / inner) % period; LLVM turns the constant
                // division into multiplies.
                let _ = writeln!(loads, "      %d{i} = arith.constant {inner} : i64");
                let _ = writeln!(loads, "      %m{i} = arith.constant {period} : i64");
                let _ = writeln!(loads, "      %q{i} = arith.divui %ii, %d{i} : i64");
                let _ = writeln!(loads, "      %k{i} = arith.remui %q{i}, %m{i} : i64");
                loads.push_str(&load_lines(
                    "      ",
                    &format!("%x{i}"),
                    &format!("%p{i}"),
                    Some(&format!("%k{i}")),
                    ty,
                ));
                regs.push((format!("%x{i}"), ty));
            }
            InputMode::Full => {
                loads.push_str(&load_lines("      ", &format!("%x{i}"), &format!("%p{i}"), Some("%ii"), ty));
                regs.push((format!("%x{i}"), ty));
            }
        }
    }
    let (result, ty) = program_values(&mut b, program, regs)?;
    let can_fail = !b.zero_divisors.is_empty();
    let mut text = String::new();
    let returns = if can_fail { " -> i32" } else { "" };
    let _ =
        writeln!(text, "  func.func @{symbol}(%ins: !llvm.ptr, %out: !llvm.ptr, %start: i64, %end: i64){returns} {{");
    text.push_str(&head);
    let _ = writeln!(text, "    %lo = arith.index_cast %start : i64 to index");
    let _ = writeln!(text, "    %hi = arith.index_cast %end : i64 to index");
    let _ = writeln!(text, "    %step = arith.constant 1 : index");
    if can_fail {
        // `%zero` ORed over the loop: some element met a zero divisor.
        let _ = writeln!(text, "    %ok = arith.constant false");
        let _ = writeln!(text, "    %zero = scf.for %i = %lo to %hi step %step iter_args(%seen = %ok) -> (i1) {{");
    } else {
        let _ = writeln!(text, "    scf.for %i = %lo to %hi step %step {{");
    }
    let _ = writeln!(text, "      %ii = arith.index_cast %i : index to i64");
    text.push_str(&loads);
    text.push_str(&b.text);
    let stored = if ty == Ty::Bool {
        // 0 or 1, as the kernels write a bool.
        let _ = writeln!(text, "      %ob = arith.extui {result} : i1 to i8");
        "%ob".to_string()
    } else {
        result
    };
    let mem = ty.mem();
    let _ = writeln!(text, "      %o = llvm.getelementptr %out[%ii] : (!llvm.ptr, i64) -> !llvm.ptr, {mem}");
    let _ = writeln!(text, "      llvm.store {stored}, %o : {mem}, !llvm.ptr");
    if can_fail {
        let mut seen = "%seen".to_string();
        for (k, z) in b.zero_divisors.iter().enumerate() {
            let _ = writeln!(text, "      %seen{k} = arith.ori {seen}, {z} : i1");
            seen = format!("%seen{k}");
        }
        let _ = writeln!(text, "      scf.yield {seen} : i1");
        let _ = writeln!(text, "    }}");
        let _ = writeln!(text, "    %status = arith.extui %zero : i1 to i32");
        let _ = writeln!(text, "    return %status : i32");
    } else {
        let _ = writeln!(text, "    }}");
        let _ = writeln!(text, "    return");
    }
    let _ = writeln!(text, "  }}");
    Ok((text, can_fail))
}

/// The values of `program`'s ops in `b`, its operands being the registers
/// `regs` (in operand order); returns the result register and its type.
/// Each op computes what the generic kernels compute for its dtypes
/// (`kiln_kernels`' `unary_int`, `binary_int`, `compare`, `where_`, `cast`,
/// `clamp`); any other op or dtype is [`Unsupported`].
fn program_values(b: &mut Body, program: &[FusedOp], mut regs: Vec<(String, Ty)>) -> Result<(String, Ty), Unsupported> {
    for (i, op) in program.iter().enumerate() {
        if let Some(def) = half::half_op(b, op, &regs)? {
            regs.push(def);
            continue;
        }
        let reg = |r: u32| regs.get(r as usize).cloned().ok_or_else(|| Unsupported(format!("op {i}: register {r}")));
        let def = match *op {
            FusedOp::Scalar { dtype, bits } => match Ty::of(dtype)? {
                Ty::F32 => (b.c(f32::from_bits(bits as u32)), Ty::F32),
                // `true`/`false` are i1 already: a `: i1` suffix does not parse.
                Ty::Bool => (b.let_(format_args!("arith.constant {}", bits & 0xFF != 0)), Ty::Bool),
                Ty::I32 => (b.ci(bits as u32 as i32), Ty::I32),
                Ty::I64 => (b.let_(format_args!("arith.constant {} : i64", bits as i64)), Ty::I64),
                // `half::half_op` makes half scalars.
                ty @ (Ty::F16 | Ty::Bf16) => return Err(Unsupported(format!("a {ty:?} scalar"))),
            },
            FusedOp::Unary { op, x } => match reg(x)? {
                (x, Ty::Bool) if matches!(op, UnaryOp::Not | UnaryOp::BitNot) => {
                    let t = b.let_("arith.constant true");
                    (b.let_(format_args!("arith.xori {x}, {t} : i1")), Ty::Bool)
                }
                (x, Ty::F32) => (b.unary(op, &x)?, Ty::F32),
                (x, ty) if ty.is_int() => (b.unary_int(op, &x, ty)?, ty),
                (_, ty) => return Err(Unsupported(format!("{op} of {ty:?}"))),
            },
            FusedOp::Binary { op, a, b: rb } => {
                let ((x, tx), (y, ty)) = (reg(a)?, reg(rb)?);
                if tx != ty {
                    return Err(Unsupported(format!("{op} of {tx:?} and {ty:?}")));
                }
                binary(b, op, &x, &y, tx)?
            }
            FusedOp::Where { cond, a, b: rb } => {
                let ((c, tc), (x, tx), (y, ty)) = (reg(cond)?, reg(a)?, reg(rb)?);
                if tc != Ty::Bool || tx != ty {
                    return Err(Unsupported(format!("where of {tc:?}, {tx:?} and {ty:?}")));
                }
                (b.let_(format_args!("arith.select {c}, {x}, {y} : {}", tx.reg())), tx)
            }
            FusedOp::Clamp { min, max, x } => match reg(x)? {
                (x, Ty::F32) => {
                    let mut v = x;
                    // As the f32 clamp: bounds rounded to f32, `v < lo` then `v > hi`.
                    if let Some(lo) = min {
                        let lo = b.c(lo as f32);
                        let lt = b.cmp("olt", &v, &lo);
                        v = b.select(&lt, &lo, &v);
                    }
                    if let Some(hi) = max {
                        let hi = b.c(hi as f32);
                        let gt = b.cmp("ogt", &v, &hi);
                        v = b.select(&gt, &hi, &v);
                    }
                    (v, Ty::F32)
                }
                (x, ty) if ty.is_int() => (b.clamp_int(&x, ty, min, max), ty),
                (_, ty) => return Err(Unsupported(format!("clamp of {ty:?}"))),
            },
            FusedOp::Cast { to, x } => {
                let (x, from) = reg(x)?;
                let to = Ty::of(to)?;
                (b.cast(&x, from, to), to)
            }
        };
        regs.push(def);
    }
    regs.last().cloned().ok_or_else(|| Unsupported("empty program".into()))
}

impl Body {
    /// Element `idx` of `ptr` (an i64 register) as a `ty` register: a bool
    /// byte becomes `byte != 0`.
    fn load_ty(&mut self, ptr: &str, idx: &str, ty: Ty) -> String {
        let mem = ty.mem();
        let e = self.let_(format_args!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr, i64) -> !llvm.ptr, {mem}"));
        let v = self.let_(format_args!("llvm.load {e} : !llvm.ptr -> {mem}"));
        if ty != Ty::Bool {
            return v;
        }
        let zero = self.let_("arith.constant 0 : i8");
        self.let_(format_args!("arith.cmpi ne, {v}, {zero} : i8"))
    }

    /// An i32 or i64 constant.
    fn cint(&mut self, v: i64, ty: Ty) -> String {
        self.let_(format_args!("arith.constant {v} : {}", ty.reg()))
    }

    fn int_op(&mut self, op: &str, a: &str, b: &str, ty: Ty) -> String {
        self.let_(format_args!("arith.{op} {a}, {b} : {}", ty.reg()))
    }

    fn cmpi(&mut self, pred: &str, a: &str, b: &str, ty: Ty) -> String {
        self.let_(format_args!("arith.cmpi {pred}, {a}, {b} : {}", ty.reg()))
    }

    fn select_ty(&mut self, cond: &str, a: &str, b: &str, ty: Ty) -> String {
        self.let_(format_args!("arith.select {cond}, {a}, {b} : {}", ty.reg()))
    }

    /// A unary op on an integer register, as `unary_int`: wrapping
    /// negation and absolute value, sign, relu, rounding ops the identity.
    fn unary_int(&mut self, op: UnaryOp, x: &str, ty: Ty) -> Result<String, Unsupported> {
        let zero = self.cint(0, ty);
        Ok(match op {
            UnaryOp::Neg => self.int_op("subi", &zero, x, ty),
            UnaryOp::Abs => {
                let neg = self.int_op("subi", &zero, x, ty);
                let lt = self.cmpi("slt", x, &zero, ty);
                self.select_ty(&lt, &neg, x, ty)
            }
            UnaryOp::Sign => {
                let (one, mone) = (self.cint(1, ty), self.cint(-1, ty));
                let lt = self.cmpi("slt", x, &zero, ty);
                let r = self.select_ty(&lt, &mone, &zero, ty);
                let gt = self.cmpi("sgt", x, &zero, ty);
                self.select_ty(&gt, &one, &r, ty)
            }
            UnaryOp::Relu => self.int_op("maxsi", x, &zero, ty),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => x.to_string(),
            UnaryOp::BitNot => {
                let ones = self.cint(-1, ty);
                self.int_op("xori", x, &ones, ty)
            }
            other => return Err(Unsupported(format!("{other} of {ty:?}"))),
        })
    }

    /// The integer clamp: bounds rounded inward (ceil / floor) and
    /// saturated to the type, as `clamp`; `v < lo` then `v > hi`.
    fn clamp_int(&mut self, x: &str, ty: Ty, min: Option<f64>, max: Option<f64>) -> String {
        // Rust's `f64 as iN` saturates (NaN → 0), as the kernel's `from_f64`.
        let bound = |v: f64| if ty == Ty::I32 { v as i32 as i64 } else { v as i64 };
        let mut v = x.to_string();
        if let Some(lo) = min {
            let lo = self.cint(bound(lo.ceil()), ty);
            let lt = self.cmpi("slt", &v, &lo, ty);
            v = self.select_ty(&lt, &lo, &v, ty);
        }
        if let Some(hi) = max {
            let hi = self.cint(bound(hi.floor()), ty);
            let gt = self.cmpi("sgt", &v, &hi, ty);
            v = self.select_ty(&gt, &hi, &v, ty);
        }
        v
    }

    /// A conversion as the kernels' `cast`: float → int truncates toward
    /// zero, saturating (NaN → 0: Rust's `as`), int → float rounds to
    /// nearest, int → int wraps or sign-extends, anything → bool is `!= 0`,
    /// bool → anything 0 or 1.
    fn cast(&mut self, x: &str, from: Ty, to: Ty) -> String {
        match (from, to) {
            _ if from == to => x.to_string(),
            (Ty::Bool, Ty::F32) => self.let_(format_args!("arith.uitofp {x} : i1 to f32")),
            (Ty::Bool, _) => self.let_(format_args!("arith.extui {x} : i1 to {}", to.reg())),
            (Ty::F32, Ty::Bool) => self.cmp_c("une", x, 0.0),
            (_, Ty::Bool) => {
                let zero = self.cint(0, from);
                self.cmpi("ne", x, &zero, from)
            }
            (Ty::F32, _) => self.f32_to_int(x, to),
            (_, Ty::F32) => self.let_(format_args!("arith.sitofp {x} : {} to f32", from.reg())),
            (Ty::I32, _) => self.let_(format_args!("arith.extsi {x} : i32 to i64")),
            _ => self.let_(format_args!("arith.trunci {x} : i64 to i32")),
        }
    }

    /// `x as i32` / `x as i64` in Rust: truncation toward zero, saturated
    /// at the type's bounds, NaN → 0 (`fptosi` alone is poison there).
    fn f32_to_int(&mut self, x: &str, ty: Ty) -> String {
        let bits = if ty == Ty::I32 { 31 } else { 63 };
        let limit = (bits as f32).exp2();
        let below = self.cmp_c("olt", x, limit);
        let above_min = self.cmp_c("oge", x, -limit);
        let inside = self.let_(format_args!("arith.andi {below}, {above_min} : i1"));
        let zero = self.c(0.0);
        let xc = self.select(&inside, x, &zero);
        let t = self.let_(format_args!("arith.fptosi {xc} : f32 to {}", ty.reg()));
        let (max, min) = if ty == Ty::I32 { (i32::MAX as i64, i32::MIN as i64) } else { (i64::MAX, i64::MIN) };
        let (max, min) = (self.cint(max, ty), self.cint(min, ty));
        let high = self.cmp_c("oge", x, limit);
        let t = self.select_ty(&high, &max, &t, ty);
        let low = self.cmp_c("olt", x, -limit);
        self.select_ty(&low, &min, &t, ty)
    }
}

/// A binary op on two registers of type `ty`, as the generic kernels define it.
fn binary(b: &mut Body, op: BinaryOp, x: &str, y: &str, ty: Ty) -> Result<(String, Ty), Unsupported> {
    if ty == Ty::Bool {
        // The kernels' bool ops (`min`/`mul` are and, `max`/`add` or);
        // comparisons order false before true.
        let def = match op {
            BinaryOp::And | BinaryOp::Min | BinaryOp::Mul => b.let_(format_args!("arith.andi {x}, {y} : i1")),
            BinaryOp::Or | BinaryOp::Max | BinaryOp::Add => b.let_(format_args!("arith.ori {x}, {y} : i1")),
            BinaryOp::Xor => b.let_(format_args!("arith.xori {x}, {y} : i1")),
            BinaryOp::Eq => b.cmpi("eq", x, y, ty),
            BinaryOp::Ne => b.cmpi("ne", x, y, ty),
            BinaryOp::Lt => b.cmpi("ult", x, y, ty),
            BinaryOp::Le => b.cmpi("ule", x, y, ty),
            BinaryOp::Gt => b.cmpi("ugt", x, y, ty),
            BinaryOp::Ge => b.cmpi("uge", x, y, ty),
            _ => return Err(Unsupported(format!("{op} of bool"))),
        };
        return Ok((def, Ty::Bool));
    }
    if ty.is_int() {
        // Wrapping arithmetic (no overflow flags), signed order.
        let (name, out) = match op {
            BinaryOp::Add => ("addi", ty),
            BinaryOp::Sub => ("subi", ty),
            BinaryOp::Mul => ("muli", ty),
            BinaryOp::Max => ("maxsi", ty),
            BinaryOp::Min => ("minsi", ty),
            BinaryOp::And => ("andi", ty),
            BinaryOp::Or => ("ori", ty),
            BinaryOp::Xor => ("xori", ty),
            BinaryOp::Eq => ("eq", Ty::Bool),
            BinaryOp::Ne => ("ne", Ty::Bool),
            BinaryOp::Lt => ("slt", Ty::Bool),
            BinaryOp::Le => ("sle", Ty::Bool),
            BinaryOp::Gt => ("sgt", Ty::Bool),
            BinaryOp::Ge => ("sge", Ty::Bool),
            // A zero divisor fails the call (`emit/divide.rs`).
            BinaryOp::FloorDiv => return Ok((b.int_division(IntDivision::Floor, x, y, ty), ty)),
            BinaryOp::Rem => return Ok((b.int_division(IntDivision::PyRem, x, y, ty), ty)),
            BinaryOp::Fmod => return Ok((b.int_division(IntDivision::CRem, x, y, ty), ty)),
            _ => return Err(Unsupported(format!("{op} of {ty:?}"))),
        };
        let def = if out == Ty::Bool { b.cmpi(name, x, y, ty) } else { b.int_op(name, x, y, ty) };
        return Ok((def, out));
    }
    Ok(match op {
        BinaryOp::Add => (b.add(x, y), Ty::F32),
        BinaryOp::Sub => (b.sub(x, y), Ty::F32),
        BinaryOp::Mul => (b.mul(x, y), Ty::F32),
        BinaryOp::Div => (b.div(x, y), Ty::F32),
        BinaryOp::Pow => (b.pow(x, y), Ty::F32),
        BinaryOp::Atan2 => (b.atan2(x, y), Ty::F32),
        BinaryOp::Fmod => (b.fmod(x, y), Ty::F32),
        BinaryOp::Rem => (b.py_rem_f32(x, y), Ty::F32),
        BinaryOp::FloorDiv => (b.floor_div_f32(x, y), Ty::F32),
        // NaN-propagating: `a` if it is NaN or wins, else `b` (NaN or not).
        BinaryOp::Max | BinaryOp::Min => {
            let nan = b.is_nan(x);
            let wins = b.cmp(if op == BinaryOp::Max { "ogt" } else { "olt" }, x, y);
            let take = b.let_(format_args!("arith.ori {nan}, {wins} : i1"));
            (b.select(&take, x, y), Ty::F32)
        }
        // IEEE comparisons: NaN is unequal to everything, ordered nowhere.
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
            let p = match op {
                BinaryOp::Eq => "oeq",
                BinaryOp::Ne => "une",
                BinaryOp::Lt => "olt",
                BinaryOp::Le => "ole",
                BinaryOp::Gt => "ogt",
                _ => "oge",
            };
            (b.cmp(p, x, y), Ty::Bool)
        }
        other => return Err(Unsupported(format!("binary {other}"))),
    })
}
