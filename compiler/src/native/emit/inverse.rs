//! The inverse trigonometric functions (asin, acos, atan, atan2), the
//! hyperbolic functions and their inverses (sinh, cosh, asinh, acosh, atanh)
//! and pow, evaluated in f64 and rounded once to f32.
//!
//! The portable kernels call the C library for these (glibc's `asinf`,
//! `sinhf`, `powf`, …, within an ulp or two of the exact value). Matching
//! those bit for bit would mean transcribing six more libm algorithms; these
//! instead carry ~50 bits through f64 building blocks — exp, ln and atan with
//! Taylor/atanh series past the double's precision on reduced ranges — so the
//! f32 result is the correctly rounded value except within ~2⁻²⁵ ulp of a
//! rounding boundary, hence within an ulp of libm's wherever libm is
//! (`native_codegen::inverse_hyperbolic_and_pow_match_the_portable_kernels`).
//! Every formula is chosen to lose nothing in f64 over the f32 range: the
//! arguments are exact f32 values, `1 ± x` and `x² ± 1` are exact or rounded
//! once, and where a formula would cancel (sinh, asinh, atanh near 0) a short
//! odd series takes over below 2⁻⁵. Branch-free: every path is computed and
//! the right one selected, with NaN and out-of-range lanes replaced by a safe
//! value before any float-to-integer conversion (which would be poison).

use super::Body;

/// Cody–Waite split of ln 2 (fdlibm's): `n·LN2_HI` is exact for |n| < 2²⁰.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// 1.5·2⁵²: adding and subtracting it rounds an f64 below 2⁵¹ to an integer.
const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
/// |t| bound for [`Body::exp64`]'s argument: e^±200 is far outside f32.
const EXP_ARG_MAX: f64 = 200.0;
/// Below this |x| the odd series replace the cancelling formulas.
const SERIES_BELOW: f64 = 0.031_25;
/// tan(π/8): atan's second reduction point.
const TAN_PI_8: f64 = 0.414_213_562_373_095_03;
const FRAC_PI_2: f64 = std::f64::consts::FRAC_PI_2;
const FRAC_PI_4: f64 = std::f64::consts::FRAC_PI_4;
const PI: f64 = std::f64::consts::PI;

/// `1/k!` for k = 13 down to 0: e^r on |r| ≤ ln2/2 to ~4e-18 relative.
fn exp_taylor() -> Vec<f64> {
    let mut fact = 1.0f64;
    let mut c: Vec<f64> = (0..=13)
        .map(|k| {
            if k > 0 {
                fact *= k as f64;
            }
            1.0 / fact
        })
        .collect();
    c.reverse();
    c
}

/// `1/(2k+1)` for k = 11 down to 0: `ln m = 2s·Σ s^{2k}/(2k+1)` with
/// |s| ≤ 0.1716 (m in [√½, √2]) to ~1e-19.
fn log_series() -> Vec<f64> {
    (0..=11).rev().map(|k| 1.0 / (2 * k + 1) as f64).collect()
}

/// `(−1)^k/(2k+1)` for k = 22 down to 0: atan(w) = w·Σ (−w²)^k/(2k+1) with
/// |w| ≤ tan(π/8) to ~3e-19.
fn atan_series() -> Vec<f64> {
    (0..=22).rev().map(|k| if k % 2 == 0 { 1.0 } else { -1.0 } / (2 * k + 1) as f64).collect()
}

impl Body {
    fn cmpd(&mut self, pred: &str, a: &str, b: &str) -> String {
        self.let_(format_args!("arith.cmpf {pred}, {a}, {b} : f64"))
    }

    fn cmpd_c(&mut self, pred: &str, a: &str, c: f64) -> String {
        let c = self.cd(c);
        self.cmpd(pred, a, &c)
    }

    fn seld(&mut self, cond: &str, a: &str, b: &str) -> String {
        self.select_t(cond, a, b, "f64")
    }

    fn seld_c(&mut self, cond: &str, a: f64, b: &str) -> String {
        let a = self.cd(a);
        self.seld(cond, &a, b)
    }

    fn i1(&mut self, op: &str, a: &str, b: &str) -> String {
        self.op2(op, a, b, "i1")
    }

    fn not1(&mut self, a: &str) -> String {
        let t = self.let_("arith.constant true");
        self.i1("xori", a, &t)
    }

    fn absd(&mut self, x: &str) -> String {
        self.let_(format_args!("math.absf {x} : f64"))
    }

    fn sqrtd(&mut self, x: &str) -> String {
        self.let_(format_args!("math.sqrt {x} : f64"))
    }

    fn copysignd(&mut self, x: &str, s: &str) -> String {
        self.let_(format_args!("math.copysign {x}, {s} : f64"))
    }

    fn hornerd(&mut self, x: &str, coeffs: &[f64]) -> String {
        let mut p = self.cd(coeffs[0]);
        for &c in &coeffs[1..] {
            let c = self.cd(c);
            p = self.fmad(&p, x, &c);
        }
        p
    }

    /// `x` with NaN lanes replaced by `safe` and clamped to `[lo, hi]`.
    fn tame(&mut self, x: &str, lo: f64, hi: f64, safe: f64) -> String {
        let above = self.cmpd_c("ogt", x, hi);
        let v = self.seld_c(&above, hi, x);
        let below = self.cmpd_c("olt", &v, lo);
        let v = self.seld_c(&below, lo, &v);
        let nan = self.cmpd("uno", x, x);
        self.seld_c(&nan, safe, &v)
    }

    /// e^t for |t| ≤ `EXP_ARG_MAX`, t not NaN: `2^n·e^r`, `n = round(t/ln2)`.
    fn exp64(&mut self, t: &str) -> String {
        let log2e = self.cd(std::f64::consts::LOG2_E);
        let k = self.bin64("mulf", t, &log2e);
        let magic = self.cd(ROUND_MAGIC);
        let s = self.bin64("addf", &k, &magic);
        let n = self.bin64("subf", &s, &magic);
        let nn = self.let_(format_args!("arith.negf {n} : f64"));
        let hi = self.cd(LN2_HI);
        let r = self.fmad(&nn, &hi, t);
        let lo = self.cd(LN2_LO);
        let r = self.fmad(&nn, &lo, &r);
        let p = self.hornerd(&r, &exp_taylor());
        let ni = self.let_(format_args!("arith.fptosi {n} : f64 to i64"));
        let bias = self.ci64(1023);
        let b = self.op2("addi", &ni, &bias, "i64");
        let sh = self.ci64(52);
        let bits = self.op2("shli", &b, &sh, "i64");
        let scale = self.let_(format_args!("arith.bitcast {bits} : i64 to f64"));
        self.bin64("mulf", &p, &scale)
    }

    /// ln x for a positive normal finite f64: `e·ln2 + 2s·Σ s^{2k}/(2k+1)`,
    /// `x = 2^e·m`, m in [√½, √2], `s = (m − 1)/(m + 1)`.
    fn log64(&mut self, x: &str) -> String {
        let bits = self.let_(format_args!("arith.bitcast {x} : f64 to i64"));
        let sh = self.ci64(52);
        let biased = self.op2("shrui", &bits, &sh, "i64");
        let bias = self.ci64(1023);
        let e = self.op2("subi", &biased, &bias, "i64");
        let mask = self.ci64(0x000F_FFFF_FFFF_FFFF);
        let one_bits = self.ci64(0x3FF0_0000_0000_0000);
        let mb = self.op2("andi", &bits, &mask, "i64");
        let mb = self.op2("ori", &mb, &one_bits, "i64");
        let m = self.let_(format_args!("arith.bitcast {mb} : i64 to f64"));
        let big = self.cmpd_c("ogt", &m, std::f64::consts::SQRT_2);
        let half = self.cd(0.5);
        let mh = self.bin64("mulf", &m, &half);
        let m = self.seld(&big, &mh, &m);
        let one = self.ci64(1);
        let zero = self.ci64(0);
        let inc = self.select_t(&big, &one, &zero, "i64");
        let e = self.op2("addi", &e, &inc, "i64");
        let ef = self.let_(format_args!("arith.sitofp {e} : i64 to f64"));
        let oned = self.cd(1.0);
        let f = self.bin64("subf", &m, &oned);
        let two = self.cd(2.0);
        let d = self.bin64("addf", &f, &two);
        let s = self.bin64("divf", &f, &d);
        let z = self.bin64("mulf", &s, &s);
        let p = self.hornerd(&z, &log_series());
        let s2 = self.bin64("addf", &s, &s);
        let lm = self.bin64("mulf", &s2, &p);
        let lo = self.cd(LN2_LO);
        let t = self.fmad(&ef, &lo, &lm);
        let hi = self.cd(LN2_HI);
        self.fmad(&ef, &hi, &t)
    }

    /// atan of an f64 in [0, 1] (NaN passes through): `π/4 + atan((u−1)/(u+1))`
    /// above tan(π/8), the series below.
    fn atan01(&mut self, u: &str) -> String {
        let big = self.cmpd_c("ogt", u, TAN_PI_8);
        let one = self.cd(1.0);
        let um = self.bin64("subf", u, &one);
        let up = self.bin64("addf", u, &one);
        let q = self.bin64("divf", &um, &up);
        let w = self.seld(&big, &q, u);
        let w2 = self.bin64("mulf", &w, &w);
        let p = self.hornerd(&w2, &atan_series());
        let a = self.bin64("mulf", &w, &p);
        let zero = self.cd(0.0);
        let base = self.seld_c(&big, FRAC_PI_4, &zero);
        self.bin64("addf", &base, &a)
    }

    /// atan of any f64 (±inf gives ±π/2, NaN stays NaN).
    fn atan64(&mut self, x: &str) -> String {
        let a = self.absd(x);
        let inv = self.cmpd_c("ogt", &a, 1.0);
        let one = self.cd(1.0);
        let ra = self.bin64("divf", &one, &a);
        let u = self.seld(&inv, &ra, &a);
        let r = self.atan01(&u);
        let hp = self.cd(FRAC_PI_2);
        let rr = self.bin64("subf", &hp, &r);
        let r = self.seld(&inv, &rr, &r);
        self.copysignd(&r, x)
    }

    /// `odd(a)` for |a| < 2⁻⁵ as `a·P(a²)`, else `other`.
    fn series_below(&mut self, a: &str, coeffs: &[f64], other: &str) -> String {
        let a2 = self.bin64("mulf", a, a);
        let p = self.hornerd(&a2, coeffs);
        let s = self.bin64("mulf", a, &p);
        let small = self.cmpd_c("olt", a, SERIES_BELOW);
        self.seld(&small, &s, other)
    }

    /// `r` rounded to f32, NaN where x (f64) is NaN.
    fn finish(&mut self, x: &str, r: &str) -> String {
        let nan = self.cmpd("uno", x, x);
        let r = self.seld(&nan, x, r);
        self.trunc(&r)
    }

    /// `(x, 1 − x, 1 + x)` in f64 for an f32 x (both sums exact).
    fn one_minus_plus(&mut self, x: &str) -> (String, String, String) {
        let xd = self.ext(x);
        let one = self.cd(1.0);
        let a = self.bin64("subf", &one, &xd);
        let b = self.bin64("addf", &one, &xd);
        (xd, a, b)
    }

    /// asin x = atan(x/√((1−x)(1+x))); |x| > 1 gives NaN through the root.
    pub(super) fn asin(&mut self, x: &str) -> String {
        let (xd, a, b) = self.one_minus_plus(x);
        let p = self.bin64("mulf", &a, &b);
        let s = self.sqrtd(&p);
        let q = self.bin64("divf", &xd, &s);
        let r = self.atan64(&q);
        self.trunc(&r)
    }

    /// acos x = 2·atan(√((1−x)/(1+x))): π at −1 (the root is inf), NaN outside.
    pub(super) fn acos(&mut self, x: &str) -> String {
        let (_, a, b) = self.one_minus_plus(x);
        let q = self.bin64("divf", &a, &b);
        let s = self.sqrtd(&q);
        let r = self.atan64(&s);
        let r = self.bin64("addf", &r, &r);
        self.trunc(&r)
    }

    pub(super) fn atan(&mut self, x: &str) -> String {
        let xd = self.ext(x);
        let r = self.atan64(&xd);
        self.trunc(&r)
    }

    /// atan2(y, x) with C's special cases: the angle of the smaller over the
    /// larger magnitude (1 for two infinities, 0 for two zeros), reflected
    /// by octant, then by x's sign bit (−0 included) and y's sign.
    pub(super) fn atan2(&mut self, y: &str, x: &str) -> String {
        let (yd, xd) = (self.ext(y), self.ext(x));
        let (ay, ax) = (self.absd(&yd), self.absd(&xd));
        let le = self.cmpd("ole", &ay, &ax);
        let num = self.seld(&le, &ay, &ax);
        let den = self.seld(&le, &ax, &ay);
        let q = self.bin64("divf", &num, &den);
        let eq = self.cmpd("oeq", &ay, &ax);
        let zero = self.cmpd_c("oeq", &ay, 0.0);
        let one = self.cd(1.0);
        let same = self.seld_c(&zero, 0.0, &one);
        let q = self.seld(&eq, &same, &q);
        let r = self.atan01(&q);
        let hp = self.cd(FRAC_PI_2);
        let rr = self.bin64("subf", &hp, &r);
        let r = self.seld(&le, &r, &rr);
        let xbits = self.let_(format_args!("arith.bitcast {x} : f32 to i32"));
        let xneg = self.cmp_ci("slt", &xbits, 0);
        let pi = self.cd(PI);
        let rp = self.bin64("subf", &pi, &r);
        let r = self.seld(&xneg, &rp, &r);
        let r = self.copysignd(&r, &yd);
        let nan = self.cmpd("uno", &yd, &xd);
        let r = self.seld(&nan, &q, &r);
        self.trunc(&r)
    }

    /// `(x, |x|, e^|x|, e^−|x|)` in f64 for an f32 x, |x| capped at
    /// `EXP_ARG_MAX` (NaN read as 0: the caller puts NaN back).
    fn exp_pair(&mut self, x: &str) -> (String, String, String, String) {
        let xd = self.ext(x);
        let a = self.absd(&xd);
        let a = self.tame(&a, 0.0, EXP_ARG_MAX, 0.0);
        let e = self.exp64(&a);
        let one = self.cd(1.0);
        let ie = self.bin64("divf", &one, &e);
        (xd, a, e, ie)
    }

    /// sinh x = (e^|x| − e^−|x|)/2 signed; the series below 2⁻⁵.
    pub(super) fn sinh(&mut self, x: &str) -> String {
        let (xd, a, e, ie) = self.exp_pair(x);
        let d = self.bin64("subf", &e, &ie);
        let half = self.cd(0.5);
        let big = self.bin64("mulf", &d, &half);
        // x + x³/3! + … + x¹¹/11!
        let coeffs: Vec<f64> = (0..=5).rev().map(|k| 1.0 / factorial(2 * k + 1)).collect();
        let r = self.series_below(&a, &coeffs, &big);
        let r = self.copysignd(&r, &xd);
        self.finish(&xd, &r)
    }

    /// cosh x = (e^|x| + e^−|x|)/2.
    pub(super) fn cosh(&mut self, x: &str) -> String {
        let (xd, _, e, ie) = self.exp_pair(x);
        let s = self.bin64("addf", &e, &ie);
        let half = self.cd(0.5);
        let r = self.bin64("mulf", &s, &half);
        self.finish(&xd, &r)
    }

    /// asinh x = ln(|x| + √(x² + 1)) signed (x² cannot overflow f64 for an
    /// f32 x); the series below 2⁻⁵; ±inf stays.
    pub(super) fn asinh(&mut self, x: &str) -> String {
        let xd = self.ext(x);
        let a = self.absd(&xd);
        let a = self.tame(&a, 0.0, f64::from(f32::MAX), 1.0);
        let one = self.cd(1.0);
        let sq = self.fmad(&a, &a, &one);
        let rt = self.sqrtd(&sq);
        let u = self.bin64("addf", &a, &rt);
        let l = self.log64(&u);
        // asinh a = a − a³/6 + 3a⁵/40 − 15a⁷/336 + 105a⁹/3456 − 945a¹¹/42240
        let coeffs = [-945.0 / 42240.0, 105.0 / 3456.0, -15.0 / 336.0, 3.0 / 40.0, -1.0 / 6.0, 1.0];
        let r = self.series_below(&a, &coeffs, &l);
        let ad = self.absd(&xd);
        let inf = self.cmpd_c("oeq", &ad, f64::INFINITY);
        let r = self.seld(&inf, &ad, &r);
        let r = self.copysignd(&r, &xd);
        self.finish(&xd, &r)
    }

    /// acosh x = ln(x + √((x − 1)(x + 1))) for x ≥ 1 (x − 1 exact: no loss
    /// next to 1); NaN below 1, inf at inf.
    pub(super) fn acosh(&mut self, x: &str) -> String {
        let xd = self.ext(x);
        let ok = self.cmpd_c("oge", &xd, 1.0);
        let xs = self.tame(&xd, 1.0, f64::from(f32::MAX), 1.0);
        let one = self.cd(1.0);
        let a = self.bin64("subf", &xs, &one);
        let b = self.bin64("addf", &xs, &one);
        let p = self.bin64("mulf", &a, &b);
        let rt = self.sqrtd(&p);
        let u = self.bin64("addf", &xs, &rt);
        let r = self.log64(&u);
        let inf = self.cmpd_c("oeq", &xd, f64::INFINITY);
        let r = self.seld(&inf, &xd, &r);
        let bad = self.not1(&ok);
        let r = self.seld_c(&bad, f64::NAN, &r);
        self.finish(&xd, &r)
    }

    /// atanh x = ln((1 + |x|)/(1 − |x|))/2 signed (both exact for an f32
    /// |x| < 1); the series below 2⁻⁵; ±inf at ±1, NaN beyond.
    pub(super) fn atanh(&mut self, x: &str) -> String {
        let xd = self.ext(x);
        let a = self.absd(&xd);
        let inside = self.cmpd_c("olt", &a, 1.0);
        let half = self.cd(0.5);
        let as_ = self.seld(&inside, &a, &half);
        let one = self.cd(1.0);
        let n = self.bin64("addf", &one, &as_);
        let d = self.bin64("subf", &one, &as_);
        let q = self.bin64("divf", &n, &d);
        let l = self.log64(&q);
        let l = self.bin64("mulf", &l, &half);
        // atanh a = a + a³/3 + … + a¹¹/11
        let coeffs: Vec<f64> = (0..=5).rev().map(|k| 1.0 / (2 * k + 1) as f64).collect();
        let r = self.series_below(&a, &coeffs, &l);
        let at1 = self.cmpd_c("oeq", &a, 1.0);
        let r = self.seld_c(&at1, f64::INFINITY, &r);
        let beyond = self.cmpd_c("ogt", &a, 1.0);
        let r = self.seld_c(&beyond, f64::NAN, &r);
        let r = self.copysignd(&r, &xd);
        self.finish(&xd, &r)
    }

    /// pow(x, y) as C's powf: `e^(y·ln|x|)`, negated for a negative x and an
    /// odd integer y, and the special cases of C99 F.9.4.4 selected over it.
    pub(super) fn pow(&mut self, x: &str, y: &str) -> String {
        let (xd, yd) = (self.ext(x), self.ext(y));
        let ax = self.absd(&xd);
        let ay = self.absd(&yd);
        let pos = self.cmpd_c("ogt", &ax, 0.0);
        let fin = self.cmpd_c("olt", &ax, f64::INFINITY);
        let regular = self.i1("andi", &pos, &fin);
        let one = self.cd(1.0);
        let axs = self.seld(&regular, &ax, &one);
        let l = self.log64(&axs);
        let t = self.bin64("mulf", &yd, &l);
        let t = self.tame(&t, -EXP_ARG_MAX, EXP_ARG_MAX, 0.0);
        let m = self.exp64(&t);
        // y an integer (inf counts, as trunc(inf) = inf), odd below 2²⁴.
        let ty = self.round_op(kiln_ir::UnaryOp::Trunc, y);
        let yint = self.cmp("oeq", &ty, y);
        let small = self.cmpd_c("olt", &ay, 16_777_216.0);
        let zero = self.cd(0.0);
        let ys = self.seld(&small, &yd, &zero);
        let yi = self.let_(format_args!("arith.fptosi {ys} : f64 to i64"));
        let one_i = self.ci64(1);
        let low = self.op2("andi", &yi, &one_i, "i64");
        let odd = self.let_(format_args!("arith.trunci {low} : i64 to i1"));
        let odd = self.i1("andi", &odd, &small);
        // Only an integer is odd: 3.5 truncates to 3, but pow(−0, 3.5) is +0.
        let odd = self.i1("andi", &odd, &yint);
        let xbits = self.let_(format_args!("arith.bitcast {x} : f32 to i32"));
        let xsign = self.cmp_ci("slt", &xbits, 0);
        let negate = self.i1("andi", &odd, &xsign);
        let nm = self.let_(format_args!("arith.negf {m} : f64"));
        let r = self.seld(&negate, &nm, &m);
        // x = ±0 or ±inf: 0 or inf by y's sign, signed for an odd y.
        let ypos = self.cmpd_c("ogt", &yd, 0.0);
        let xzero = self.cmpd_c("oeq", &ax, 0.0);
        let xinf = self.cmpd_c("oeq", &ax, f64::INFINITY);
        let nypos = self.not1(&ypos);
        let huge = self.select_t(&xzero, &nypos, &ypos, "i1");
        let zd = self.cd(0.0);
        let mag = self.seld_c(&huge, f64::INFINITY, &zd);
        let nmag = self.let_(format_args!("arith.negf {mag} : f64"));
        let edge = self.seld(&negate, &nmag, &mag);
        let xedge = self.i1("ori", &xzero, &xinf);
        let r = self.seld(&xedge, &edge, &r);
        // y = ±inf: 1 for |x| = 1, else inf when |x| < 1 xor y > 0, else 0.
        let yinf = self.cmpd_c("oeq", &ay, f64::INFINITY);
        let below1 = self.cmpd_c("olt", &ax, 1.0);
        let grows = self.i1("xori", &below1, &ypos);
        let by_inf = self.seld_c(&grows, f64::INFINITY, &zd);
        let unit = self.cmpd_c("oeq", &ax, 1.0);
        let by_inf = self.seld_c(&unit, 1.0, &by_inf);
        let r = self.seld(&yinf, &by_inf, &r);
        // A negative finite x to a finite non-integer power.
        let xneg = self.cmpd_c("olt", &xd, 0.0);
        let nyint = self.not1(&yint);
        let bad = self.i1("andi", &xneg, &nyint);
        let fin_x = self.not1(&xinf);
        let bad = self.i1("andi", &bad, &fin_x);
        let r = self.seld_c(&bad, f64::NAN, &r);
        let nan = self.cmpd("uno", &xd, &yd);
        let r = self.seld_c(&nan, f64::NAN, &r);
        // pow(x, ±0) = 1 and pow(1, y) = 1, NaN or not.
        let y0 = self.cmpd_c("oeq", &yd, 0.0);
        let x1 = self.cmpd_c("oeq", &xd, 1.0);
        let unit = self.i1("ori", &y0, &x1);
        let r = self.seld_c(&unit, 1.0, &r);
        self.trunc(&r)
    }
}

fn factorial(n: u32) -> f64 {
    (1..=n).map(f64::from).product()
}
