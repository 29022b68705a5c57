//! sin, cos and tan as glibc computes them (`sinf`, `cosf`, `tanf`: what
//! the portable kernels call), so a native group gives the portable one's
//! bits. sin and cos are ARM's optimized-routines algorithm (glibc ≥ 2.28):
//! the argument in f64, reduced by `n = round(x·2/π)` — one multiply-subtract
//! below 120, a 32×96-bit integer product with 4/π (Payne–Hanek style)
//! above — then a degree-7 sine or degree-8 cosine polynomial picked by
//! `n`'s parity and signed by its quadrant, rounded once to f32. tan reduces
//! the same way and evaluates fdlibm's `__kernel_tanf` in f32.
//!
//! Bit-identical to glibc's x86-64 build (a scalar model of these exact
//! operations matched glibc 2.36 on all 2³² inputs; the native tests compare
//! the emitted code on the hard cases). glibc compiles sinf/cosf twice and
//! picks the FMA variant where the CPU has FMA and AVX2 — exactly where the
//! x86-64-v3/v4 levels fuse `fmuladd` — and has no FMA variant of tanf, so
//! tan's operations are separate multiplies and adds at every level. Only a
//! baseline-level object run on an FMA CPU, or another libm (aarch64's glibc
//! rounds `n` with `lround` and fuses tanf), can differ, by at most 1 ulp.
//! aarch64 objects always fuse `fmuladd`, so they give the x86-64 FMA bits
//! (`aarch64_e2e::native_aarch64_trig_matches_x86_64_bit_for_bit`).
//!
//! Everything is branch-free: every path is computed and the right one
//! selected, the large reduction's 4/π window included (shifts of four
//! constant words, no table). The constants are ARM optimized-routines' (MIT /
//! Apache-2.0) and fdlibm's, as glibc ships them.

use super::Body;

/// 2/π·2²⁴: `n` lands in bits 24..31 of the truncating conversion.
const HPI_INV: f64 = f64::from_bits(0x4164_5F30_6DC9_C883);
const HPI: f64 = f64::from_bits(0x3FF9_21FB_5444_2D18);
/// 2π·2⁻⁶⁴: the scale of the large reduction's 2.62 fixed-point remainder.
const PI63: f64 = f64::from_bits(0x3C19_21FB_5444_2D18);
/// The cosine polynomial `1 + C1·x² + … + C4·x⁸` on [−π/4, π/4].
const COS_POLY: [f64; 4] = [
    f64::from_bits(0xBFDF_FFFF_FD0C_621C),
    f64::from_bits(0x3FA5_5553_E106_8F19),
    f64::from_bits(0xBF56_C087_E89A_359D),
    f64::from_bits(0x3EF9_9343_027B_F8C3),
];
/// The sine polynomial `x + S1·x³ + S2·x⁵ + S3·x⁷`.
const SIN_POLY: [f64; 3] = [
    f64::from_bits(0xBFC5_5554_5995_A603),
    f64::from_bits(0x3F81_1076_0523_0BC4),
    f64::from_bits(0xBF29_94EB_3774_CF24),
];
/// 24 zero bits, then 4/π's binary digits from its leading 1, as four 64-bit
/// words (MSB first): bits `8i .. 8i + 32` are glibc's `__inv_pio4[i]` (4/π
/// to 192 bits, 8 new bits per entry), so any entry is a shifted window of
/// two words — computed per lane, with no table to gather from.
const INV_PIO4_WORDS: [u64; 4] =
    [0x0000_00a2_f983_6e4e, 0x4415_29fc_2757_d1f5, 0x34dd_c0db_6295_993c, 0x4390_4100_0000_0000];
/// fdlibm's `__kernel_tanf` coefficients: tan x ≈ x + T0·x³ + … + T12·x²⁷.
const TAN_POLY: [u32; 13] = [
    0x3eaaaaab, 0x3e088889, 0x3d5d0dd1, 0x3cb327a4, 0x3c11371f, 0x3b6b6916, 0x3abede48, 0x3a1a26c8, 0x398137b9,
    0x38a3f445, 0x3895c07a, 0xb79bae5f, 0x37d95384,
];
/// π/4 in two f32 parts (tan's reflection `tan(π/4 − x)` past 0.6744).
const PIO4_HI: u32 = 0x3f490fda;
const PIO4_LO: u32 = 0x33222168;

/// Upper bounds (exclusive) of the top 12 bits of |x| (`abstop12`) for
/// each path: 2⁻¹², 0.75 (π/4 rounded down to a 12-bit prefix), 120, inf.
const TOP_TINY: i32 = 0x398;
const TOP_DIRECT: i32 = 0x3f4;
const TOP_FAST: i32 = 0x42f;
const TOP_FINITE: i32 = 0x7f8;

impl Body {
    /// `%r = arith.<op> a, b : ty`.
    pub(super) fn op2(&mut self, op: &str, a: &str, b: &str, ty: &str) -> String {
        self.let_(format_args!("arith.{op} {a}, {b} : {ty}"))
    }

    pub(super) fn cd(&mut self, v: f64) -> String {
        self.let_(format_args!("arith.constant 0x{:016X} : f64", v.to_bits()))
    }

    pub(super) fn ci64(&mut self, v: i64) -> String {
        self.let_(format_args!("arith.constant {v} : i64"))
    }

    /// `a op c` for an i32 constant `c`.
    fn op_ci(&mut self, op: &str, a: &str, c: i32) -> String {
        let c = self.ci(c);
        self.op2(op, a, &c, "i32")
    }

    fn op_ci64(&mut self, op: &str, a: &str, c: i64) -> String {
        let c = self.ci64(c);
        self.op2(op, a, &c, "i64")
    }

    pub(super) fn cmp_ci(&mut self, pred: &str, a: &str, c: i32) -> String {
        let c = self.ci(c);
        self.let_(format_args!("arith.cmpi {pred}, {a}, {c} : i32"))
    }

    pub(super) fn select_t(&mut self, cond: &str, a: &str, b: &str, ty: &str) -> String {
        self.let_(format_args!("arith.select {cond}, {a}, {b} : {ty}"))
    }

    pub(super) fn fmad(&mut self, a: &str, b: &str, c: &str) -> String {
        self.let_(format_args!("llvm.intr.fmuladd({a}, {b}, {c}) : (f64, f64, f64) -> f64"))
    }

    /// `x·c + d` (fused where the level has FMA) for f64 constants `c`, `d`.
    fn fmad_cc(&mut self, x: &str, c: f64, d: f64) -> String {
        let (c, d) = (self.cd(c), self.cd(d));
        self.fmad(x, &c, &d)
    }

    /// The top 12 bits of |x| as an i32 (`abstop12`), with x's bits.
    fn abstop12(&mut self, x: &str) -> (String, String) {
        let bits = self.let_(format_args!("arith.bitcast {x} : f32 to i32"));
        let top = self.op_ci("shrui", &bits, 20);
        (self.op_ci("andi", &top, 0x7ff), bits)
    }

    /// `reduce_fast`: `(x − n·π/2, n)` with `n = round(x·2/π)` for
    /// |x| < 120 (`fast`; other lanes see 0). The product is subtracted
    /// with one rounding where `fused` (sinf/cosf's FMA build), two
    /// otherwise (tanf).
    fn reduce_fast(&mut self, x: &str, fast: &str, fused: bool) -> (String, String) {
        let zero = self.cd(0.0);
        let xs = self.select_t(fast, x, &zero, "f64");
        let k = self.cd(HPI_INV);
        let r = self.op2("mulf", &xs, &k, "f64");
        let ri = self.let_(format_args!("arith.fptosi {r} : f64 to i32"));
        let biased = self.op_ci("addi", &ri, 0x80_0000);
        let n = self.op_ci("shrsi", &biased, 24);
        let nf = self.let_(format_args!("arith.sitofp {n} : i32 to f64"));
        let hpi = self.cd(HPI);
        let red = if fused {
            let nn = self.let_(format_args!("arith.negf {nf} : f64"));
            self.fmad(&nn, &hpi, &xs)
        } else {
            let p = self.op2("mulf", &nf, &hpi, "f64");
            self.op2("subf", &xs, &p, "f64")
        };
        (red, n)
    }

    /// The 96 bits of `INV_PIO4_WORDS` at bit `8·idx` (idx < 16, an i32) as
    /// glibc's `(__inv_pio4[idx], [idx + 4], [idx + 8])`, i64 registers.
    fn inv_pio4_window(&mut self, idx: &str) -> (String, String, String) {
        let words: Vec<String> = INV_PIO4_WORDS.iter().map(|w| self.ci64(*w as i64)).collect();
        let second = self.cmp_ci("uge", idx, 8);
        let wa = self.select_t(&second, &words[1], &words[0], "i64");
        let wb = self.select_t(&second, &words[2], &words[1], "i64");
        let wc = self.select_t(&second, &words[3], &words[2], "i64");
        let r = self.op_ci("andi", idx, 7);
        let r = self.op_ci("shli", &r, 3);
        let r = self.let_(format_args!("arith.extui {r} : i32 to i64"));
        let c63 = self.ci64(63);
        let rr = self.op2("subi", &c63, &r, "i64");
        // `a << r | b >> (64 − r)`, the second shift split so that r = 0
        // shifts by 1 and 63, never by 64.
        let join = |b: &mut Body, a: &str, c: &str| {
            let hi = b.op2("shli", a, &r, "i64");
            let lo = b.op_ci64("shrui", c, 1);
            let lo = b.op2("shrui", &lo, &rr, "i64");
            b.op2("ori", &hi, &lo, "i64")
        };
        let h = join(self, &wa, &wb);
        let l = join(self, &wb, &wc);
        let a0 = self.op_ci64("shrui", &h, 32);
        let a4 = self.op_ci64("andi", &h, 0xffff_ffff);
        let a8 = self.op_ci64("shrui", &l, 32);
        (a0, a4, a8)
    }

    /// `reduce_large`: `(r, n)` for |x| ≥ 120 from x's bits, sign ignored:
    /// the mantissa times a 96-bit window of 4/π gives `x·4/π` mod 8 as a
    /// 2.62 fixed-point number, exactly; `n` its rounded quadrant, `r` the
    /// rest times π/2 (33 good bits at worst, enough for f32).
    fn reduce_large(&mut self, bits: &str) -> (String, String) {
        let idx = self.op_ci("shrui", bits, 26);
        let idx = self.op_ci("andi", &idx, 15);
        let shift = self.op_ci("shrui", bits, 23);
        let shift = self.op_ci("andi", &shift, 7);
        let m = self.op_ci("andi", bits, 0xff_ffff);
        let m = self.op_ci("ori", &m, 0x80_0000);
        let m = self.op2("shli", &m, &shift, "i32");
        let (a0, a4, a8) = self.inv_pio4_window(&idx);
        let m64 = self.let_(format_args!("arith.extui {m} : i32 to i64"));
        let r0 = self.op2("muli", &m64, &a0, "i64");
        let r1 = self.op2("muli", &m64, &a4, "i64");
        let r2 = self.op2("muli", &m64, &a8, "i64");
        // Only the low 32 bits of m·a0 count (its high bits are whole turns).
        let hi = self.op_ci64("shli", &r0, 32);
        let lo = self.op_ci64("shrui", &r2, 32);
        let res = self.op2("ori", &hi, &lo, "i64");
        let res = self.op2("addi", &res, &r1, "i64");
        let half = self.op_ci64("addi", &res, 1 << 61);
        let n = self.op_ci64("shrui", &half, 62);
        let whole = self.op_ci64("shli", &n, 62);
        let res = self.op2("subi", &res, &whole, "i64");
        let xf = self.let_(format_args!("arith.sitofp {res} : i64 to f64"));
        let k = self.cd(PI63);
        let r = self.op2("mulf", &xf, &k, "f64");
        (r, self.let_(format_args!("arith.trunci {n} : i64 to i32")))
    }

    /// sin (`cos` false) or cos of an f32 register, as glibc's sinf/cosf.
    pub(super) fn sin_cos(&mut self, y: &str, cos: bool) -> String {
        let (top, bits) = self.abstop12(y);
        let direct = self.cmp_ci("ult", &top, TOP_DIRECT);
        let fast = self.cmp_ci("ult", &top, TOP_FAST);
        let x = self.let_(format_args!("arith.extf {y} : f32 to f64"));
        let (xf, nf) = self.reduce_fast(&x, &fast, true);
        let (xl, nl) = self.reduce_large(&bits);
        // Past 120 the quadrant also carries x's sign (sin is odd, cos
        // even; the reduction saw |x|).
        let sign = self.op_ci("shrui", &bits, 31);
        let nls = self.op2("addi", &nl, &sign, "i32");
        let zero = self.ci(0);
        let xr = self.select_t(&fast, &xf, &xl, "f64");
        let xr = self.select_t(&direct, &x, &xr, "f64");
        // `nq` signs the result, `np`'s parity picks the polynomial.
        let nq = self.select_t(&fast, &nf, &nls, "i32");
        let nq = self.select_t(&direct, &zero, &nq, "i32");
        let np = self.select_t(&fast, &nf, &nl, "i32");
        let np = self.select_t(&direct, &zero, &np, "i32");
        let x2 = self.op2("mulf", &xr, &xr, "f64");
        // x + x³·S1 + x⁷·(S2 + x²·S3), the products grouped as glibc's.
        let x3 = self.op2("mulf", &xr, &x2, "f64");
        let s1 = self.fmad_cc(&x2, SIN_POLY[2], SIN_POLY[1]);
        let x7 = self.op2("mulf", &x3, &x2, "f64");
        let c = self.cd(SIN_POLY[0]);
        let s = self.fmad(&x3, &c, &xr);
        let sp = self.fmad(&x7, &s1, &s);
        // (1 + x²·C1 + x⁴·C2) + x⁶·(C3 + x²·C4).
        let x4 = self.op2("mulf", &x2, &x2, "f64");
        let c2 = self.fmad_cc(&x2, COS_POLY[3], COS_POLY[2]);
        let c1 = self.fmad_cc(&x2, COS_POLY[0], 1.0);
        let x6 = self.op2("mulf", &x4, &x2, "f64");
        let k = self.cd(COS_POLY[1]);
        let c = self.fmad(&x4, &k, &c1);
        let cp = self.fmad(&x6, &c2, &c);
        // Quadrant signs: the sine is negative for nq & 3 in {1, 2}, the
        // cosine for nq & 2 (glibc's sign table and negated second poly).
        let q1 = self.op_ci("addi", &nq, 1);
        let q1 = self.op_ci("andi", &q1, 2);
        let sin_neg = self.cmp_ci("ne", &q1, 0);
        let q2 = self.op_ci("andi", &nq, 2);
        let cos_neg = self.cmp_ci("ne", &q2, 0);
        let nsp = self.let_(format_args!("arith.negf {sp} : f64"));
        let sv = self.select_t(&sin_neg, &nsp, &sp, "f64");
        let ncp = self.let_(format_args!("arith.negf {cp} : f64"));
        let cv = self.select_t(&cos_neg, &ncp, &cp, "f64");
        let odd = self.op_ci("andi", &np, 1);
        let odd = self.cmp_ci("ne", &odd, 0);
        let (when_odd, when_even) = if cos { (&sv, &cv) } else { (&cv, &sv) };
        let v = self.select_t(&odd, when_odd, when_even, "f64");
        let v = self.let_(format_args!("arith.truncf {v} : f64 to f32"));
        // Below 2⁻¹² sin x rounds to x and cos x to 1; inf and NaN give NaN.
        let tiny = self.cmp_ci("ult", &top, TOP_TINY);
        let small = if cos { self.c(1.0) } else { y.to_string() };
        let v = self.select(&tiny, &small, &v);
        let finite = self.cmp_ci("ult", &top, TOP_FINITE);
        let nan = self.sub(y, y);
        self.select(&finite, &v, &nan)
    }

    /// tan of an f32 register, as glibc's tanf: the sincos reduction (two
    /// roundings, no FMA) split into f32 `y0 + y1`, then `__kernel_tanf`.
    pub(super) fn tan(&mut self, y: &str) -> String {
        let (top, bits) = self.abstop12(y);
        let ix = self.op_ci("andi", &bits, 0x7fff_ffff);
        let direct = self.cmp_ci("ule", &ix, PIO4_HI as i32);
        let fast = self.cmp_ci("ult", &top, TOP_FAST);
        let x = self.let_(format_args!("arith.extf {y} : f32 to f64"));
        let (xf, nf) = self.reduce_fast(&x, &fast, false);
        let (xl, nl) = self.reduce_large(&bits);
        let neg = self.cmp_ci("slt", &bits, 0);
        let nxl = self.let_(format_args!("arith.negf {xl} : f64"));
        let xl = self.select_t(&neg, &nxl, &xl, "f64");
        let dx = self.select_t(&fast, &xf, &xl, "f64");
        let n = self.select_t(&fast, &nf, &nl, "i32");
        let y0 = self.let_(format_args!("arith.truncf {dx} : f64 to f32"));
        let y0d = self.let_(format_args!("arith.extf {y0} : f32 to f64"));
        let d = self.op2("subf", &dx, &y0d, "f64");
        let y1 = self.let_(format_args!("arith.truncf {d} : f64 to f32"));
        // iy = 1 for even n (tan r), −1 for odd (−1/tan r).
        let odd = self.op_ci("andi", &n, 1);
        let even = self.cmp_ci("eq", &odd, 0);
        let pos = self.let_(format_args!("arith.ori {direct}, {even} : i1"));
        let kx = self.select(&direct, y, &y0);
        let zero = self.c(0.0);
        let ky = self.select(&direct, &zero, &y1);
        let t = self.kernel_tan(&kx, &ky, &pos);
        let finite = self.cmp_ci("ult", &top, TOP_FINITE);
        let nan = self.sub(y, y);
        self.select(&finite, &t, &nan)
    }

    /// fdlibm's `__kernel_tanf(x, y, iy)` in f32: tan(x + y) where `pos`
    /// (iy = 1), else −1/tan(x + y), |x + y| ≤ π/4 (operation for operation).
    fn kernel_tan(&mut self, x: &str, y: &str, pos: &str) -> String {
        let one = self.c(1.0);
        let mone = self.c(-1.0);
        let two = self.c(2.0);
        let iy = self.select(pos, &one, &mone);
        let hx = self.let_(format_args!("arith.bitcast {x} : f32 to i32"));
        let ix = self.op_ci("andi", &hx, 0x7fff_ffff);
        let neg = self.cmp_ci("slt", &hx, 0);
        let sgn = self.select(&neg, &mone, &one);
        // |x| < 2⁻¹³: x, or −1/x (1/|x| for a zero x).
        let tiny = self.cmp_ci("ult", &ix, 0x3900_0000);
        let ax = self.abs(x);
        let inv_abs = self.div(&one, &ax);
        let neg_recip = self.div(&mone, x);
        let is_zero = self.cmp_ci("eq", &ix, 0);
        let t = self.select(&is_zero, &inv_abs, &neg_recip);
        let tiny_v = self.select(pos, x, &t);
        // Past 0.6744: tan(π/4 − |x|) (1 − 2·iy·x near π/4 itself).
        let big = self.cmp_ci("uge", &ix, 0x3f2c_a140);
        let nx = self.neg(x);
        let ny = self.neg(y);
        let xa = self.select(&neg, &nx, x);
        let ya = self.select(&neg, &ny, y);
        let pio4 = self.c(f32::from_bits(PIO4_HI));
        let pio4lo = self.c(f32::from_bits(PIO4_LO));
        let z = self.sub(&pio4, &xa);
        let w = self.sub(&pio4lo, &ya);
        let xb = self.add(&z, &w);
        let axb = self.abs(&xb);
        let near = self.cmp_c("olt", &axb, f32::from_bits(0x3900_0000));
        let s_iy = self.mul(&sgn, &iy);
        let two_iy = self.mul(&two, &iy);
        let t = self.mul(&two_iy, &xb);
        let u = self.sub(&one, &t);
        let near_v = self.mul(&s_iy, &u);
        let x = self.select(&big, &xb, x);
        let zero = self.c(0.0);
        let y = self.select(&big, &zero, y);
        let z = self.mul(&x, &x);
        let w = self.mul(&z, &z);
        let r = self.tan_terms(&w, 11);
        let v = self.tan_terms(&w, 12);
        let v = self.mul(&z, &v);
        let s = self.mul(&z, &x);
        let rv = self.add(&r, &v);
        let srv = self.mul(&s, &rv);
        let inner = self.add(&srv, &y);
        let zi = self.mul(&z, &inner);
        let r = self.add(&y, &zi);
        let t0 = self.c(f32::from_bits(TAN_POLY[0]));
        let t0s = self.mul(&t0, &s);
        let r = self.add(&r, &t0s);
        let w = self.add(&x, &r);
        // The reflected case: sgn·(iy − 2·(x − (w²/(w + iy) − r))).
        let w2 = self.mul(&w, &w);
        let den = self.add(&w, &iy);
        let q = self.div(&w2, &den);
        let qr = self.sub(&q, &r);
        let xq = self.sub(&x, &qr);
        let xq2 = self.mul(&two, &xq);
        let d = self.sub(&iy, &xq2);
        let big_v = self.mul(&sgn, &d);
        let big_v = self.select(&near, &near_v, &big_v);
        // −1/(x + r) to full precision: both w and −1/w split at 12 bits.
        let zz = self.low_bits_cleared(&w);
        let zx = self.sub(&zz, &x);
        let vv = self.sub(&r, &zx);
        let a = self.div(&mone, &w);
        let ta = self.low_bits_cleared(&a);
        let tz = self.mul(&ta, &zz);
        let ss = self.add(&one, &tz);
        let tv = self.mul(&ta, &vv);
        let sv = self.add(&ss, &tv);
        let asv = self.mul(&a, &sv);
        let inv = self.add(&ta, &asv);
        let poly_v = self.select(pos, &w, &inv);
        let k = self.select(&big, &big_v, &poly_v);
        self.select(&tiny, &tiny_v, &k)
    }

    /// `T[first] + w·(T[first − 2] ... )`: fdlibm's two interleaved
    /// Horner chains in w = x⁴ (the odd terms from T11, the even from T12),
    /// down to T1 or T2.
    fn tan_terms(&mut self, w: &str, first: usize) -> String {
        let mut acc = self.c(f32::from_bits(TAN_POLY[first]));
        for k in (1..first - 1).rev().step_by(2) {
            let c = self.c(f32::from_bits(TAN_POLY[k]));
            let p = self.mul(w, &acc);
            acc = self.add(&c, &p);
        }
        acc
    }

    /// x with the low 12 mantissa bits cleared.
    fn low_bits_cleared(&mut self, x: &str) -> String {
        let b = self.let_(format_args!("arith.bitcast {x} : f32 to i32"));
        let b = self.op_ci("andi", &b, 0xffff_f000u32 as i32);
        self.let_(format_args!("arith.bitcast {b} : i32 to f32"))
    }
}
