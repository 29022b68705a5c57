//! f16 and bf16 registers: each op as the portable fused kernel runs it on
//! half-precision tiles — operands widened to f32, the f32 op, the result
//! rounded back to the half type — so every op rounds, as unfused torch
//! does. A half register is its 16 storage bits (`i16`): `where`, a clamp
//! that passes its operand through and a same-dtype cast move bits, as the
//! kernels do (a signalling NaN stays one), while arithmetic widens.
//!
//! The conversions are integer sequences rather than `arith.extf` /
//! `arith.truncf`: LLVM lowers those to `__extendhfsf2` / `__truncsfhf2` /
//! `__truncsfbf2` calls where the level lacks F16C or AVX512-BF16 (and on
//! aarch64 for bf16), and the loader resolves no symbols. They give the
//! bits of the `half` crate's conversions the kernels call
//! (`Scalar::to_f64` / `from_f64`):
//! - f16 ↔ f32 is IEEE (round to nearest even; NaN quieted, payload kept),
//!   what F16C's `vcvtps2ph` / `vcvtph2ps` and `half`'s fallback both give;
//! - f32 → bf16 is round to nearest even on the f32's bits (`half`'s
//!   `bf16::from_f32`; NaN keeps its top payload bits and is quieted);
//! - i32 / i64 → f16 / bf16 goes through the integer's f32 (`as f32`), as
//!   torch's conversions and the kernels' `Scalar::from_i64` do.

use super::{binary, Body, Ty, Unsupported};
use kiln_ir::{BinaryOp, DType, FusedOp, UnaryOp};

impl Ty {
    fn is_half(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16)
    }
}

/// The value of op `op` when it reads or makes a half register (None for
/// any other op, and for `where`, which selects bits of any type).
pub(super) fn half_op(b: &mut Body, op: &FusedOp, regs: &[(String, Ty)]) -> Result<Option<(String, Ty)>, Unsupported> {
    let reg = |r: u32| regs.get(r as usize).cloned().ok_or_else(|| Unsupported(format!("register {r}")));
    Ok(Some(match *op {
        FusedOp::Scalar { dtype: dtype @ (DType::F16 | DType::BF16), bits } => {
            (b.let_(format_args!("arith.constant {} : i16", bits as u16 as i16)), Ty::of(dtype)?)
        }
        FusedOp::Unary { op, x } => match reg(x)? {
            (_, Ty::F16) if op == UnaryOp::Asinh => {
                return Err(Unsupported("asinh of f16: 4 of the 65536 values round unlike glibc's".into()))
            }
            (x, ty) if ty.is_half() => {
                let f = b.widen(&x, ty);
                let r = b.unary(op, &f)?;
                (b.narrow(&r, ty), ty)
            }
            _ => return Ok(None),
        },
        FusedOp::Binary { op, a, b: rb } => {
            let ((x, tx), (y, ty)) = (reg(a)?, reg(rb)?);
            if !tx.is_half() && !ty.is_half() {
                return Ok(None);
            }
            if tx != ty {
                return Err(Unsupported(format!("{op} of {tx:?} and {ty:?}")));
            }
            // One step of `nextafter` is one ulp of the half type: the
            // kernels take it on the bits, not in f32.
            // pow and atan2 are f64 evaluations here, glibc's powf/atan2f in
            // the kernels: within an f32 ulp, but not checked over every pair
            // of halves (8 in 65536 random f16 pairs round apart for atan2).
            // fmod / remainder / floor_divide of halves: the f32 ops are
            // exact, but their half results are not checked against the
            // kernels yet.
            if matches!(
                op,
                BinaryOp::Nextafter
                    | BinaryOp::Pow
                    | BinaryOp::Atan2
                    | BinaryOp::Fmod
                    | BinaryOp::Rem
                    | BinaryOp::FloorDiv
            ) {
                return Err(Unsupported(format!("{op} of {tx:?}")));
            }
            let (fx, fy) = (b.widen(&x, tx), b.widen(&y, ty));
            match binary(b, op, &fx, &fy, Ty::F32)? {
                (r, Ty::F32) => {
                    let r = if matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div) {
                        b.first_nan(&fx, &fy, &r)
                    } else {
                        r
                    };
                    (b.narrow(&r, tx), tx)
                }
                // A comparison: IEEE on the widened values, as on the halves.
                other => other,
            }
        }
        FusedOp::Clamp { min, max, x } => match reg(x)? {
            (x, ty) if ty.is_half() => (b.clamp_half(&x, ty, min, max)?, ty),
            _ => return Ok(None),
        },
        FusedOp::Cast { to, x } => {
            let (x, from) = reg(x)?;
            let to = Ty::of(to)?;
            if !from.is_half() && !to.is_half() {
                return Ok(None);
            }
            (b.cast_half(&x, from, to), to)
        }
        _ => return Ok(None),
    }))
}

/// A clamp bound as the kernels' `H::from_f64` makes it: through f32.
fn half_bound(v: f64, ty: Ty) -> u16 {
    match ty {
        Ty::F16 => half::f16::from_f32(v as f32).to_bits(),
        _ => half::bf16::from_f32(v as f32).to_bits(),
    }
}

/// The f32 value of half bits (exact; NaN keeps its sign and payload).
fn half_to_f32(bits: u16, ty: Ty) -> f32 {
    match ty {
        Ty::F16 => half::f16::from_bits(bits).to_f32(),
        _ => half::bf16::from_bits(bits).to_f32(),
    }
}

impl Body {
    /// `r = x op y` with a NaN operand's payload chosen as the kernels' scalar
    /// code gets it (x86 and AArch64 return the first NaN operand): LLVM may
    /// commute the operands of a vector add or multiply, which would pick the
    /// other one where both are NaN. The widened operands are quiet already.
    fn first_nan(&mut self, x: &str, y: &str, r: &str) -> String {
        let y_nan = self.is_nan(y);
        let r = self.select(&y_nan, y, r);
        let x_nan = self.is_nan(x);
        self.select(&x_nan, x, &r)
    }

    fn i32_c(&mut self, op: &str, a: &str, c: i64) -> String {
        let c = self.let_(format_args!("arith.constant {c} : i32"));
        self.let_(format_args!("arith.{op} {a}, {c} : i32"))
    }

    fn cmp_u32(&mut self, pred: &str, a: &str, c: u32) -> String {
        let c = self.let_(format_args!("arith.constant {} : i32", c as i32));
        self.let_(format_args!("arith.cmpi {pred}, {a}, {c} : i32"))
    }

    fn sel_i32(&mut self, cond: &str, a: &str, b: &str) -> String {
        self.let_(format_args!("arith.select {cond}, {a}, {b} : i32"))
    }

    /// The f32 value of a half register.
    pub(super) fn widen(&mut self, h: &str, ty: Ty) -> String {
        let h = self.let_(format_args!("arith.extui {h} : i16 to i32"));
        let bits = if ty == Ty::F16 { self.f16_bits_to_f32_bits(&h) } else { self.bf16_bits_to_f32_bits(&h) };
        self.let_(format_args!("arith.bitcast {bits} : i32 to f32"))
    }

    /// An f32 rounded to a half register, as `H::from_f64(v as f64)`.
    pub(super) fn narrow(&mut self, f: &str, ty: Ty) -> String {
        let x = self.let_(format_args!("arith.bitcast {f} : f32 to i32"));
        let h = if ty == Ty::F16 { self.f32_bits_to_f16_bits(&x) } else { self.f32_bits_to_bf16_bits(&x) };
        self.let_(format_args!("arith.trunci {h} : i32 to i16"))
    }

    /// f16 bits (zero-extended) → f32 bits: normals rebias the exponent,
    /// subnormals are `m·2⁻²⁴` (an exact integer conversion and scaling),
    /// inf/NaN widen the payload and set the quiet bit on a NaN.
    fn f16_bits_to_f32_bits(&mut self, h: &str) -> String {
        let sign = self.i32_c("andi", h, 0x8000);
        let sign = self.i32_c("shli", &sign, 16);
        let e = self.i32_c("shrui", h, 10);
        let e = self.i32_c("andi", &e, 0x1F);
        let m = self.i32_c("andi", h, 0x3FF);
        let m13 = self.i32_c("shli", &m, 13);
        let eb = self.i32_c("addi", &e, 127 - 15);
        let eb = self.i32_c("shli", &eb, 23);
        let normal = self.let_(format_args!("arith.ori {eb}, {m13} : i32"));
        let mf = self.let_(format_args!("arith.sitofp {m} : i32 to f32"));
        let scale = self.c(f32::from_bits(0x3380_0000)); // 2⁻²⁴
        let sub = self.mul(&mf, &scale);
        let sub = self.let_(format_args!("arith.bitcast {sub} : f32 to i32"));
        let special = self.i32_c("ori", &m13, 0x7F80_0000);
        let nan = self.cmp_u32("ne", &m, 0);
        let quiet = self.i32_c("ori", &special, 0x0040_0000);
        let special = self.sel_i32(&nan, &quiet, &special);
        let is_sub = self.cmp_u32("eq", &e, 0);
        let is_special = self.cmp_u32("eq", &e, 0x1F);
        let r = self.sel_i32(&is_special, &special, &normal);
        let r = self.sel_i32(&is_sub, &sub, &r);
        self.let_(format_args!("arith.ori {r}, {sign} : i32"))
    }

    /// bf16 bits (zero-extended) → f32 bits: the top half, a NaN quieted.
    fn bf16_bits_to_f32_bits(&mut self, h: &str) -> String {
        let bits = self.i32_c("shli", h, 16);
        let abs = self.i32_c("andi", h, 0x7FFF);
        let nan = self.cmp_u32("ugt", &abs, 0x7F80);
        let quiet = self.i32_c("ori", &bits, 0x0040_0000);
        self.sel_i32(&nan, &quiet, &bits)
    }

    /// f32 bits → f16 bits (in an i32), IEEE round to nearest even: normals
    /// by adding the rounding bias below bit 13 (a carry into the exponent
    /// gives the next binade or inf), values below 2⁻¹⁴ by adding ½ in f32,
    /// which rounds them to a multiple of 2⁻²⁴ exactly as the subnormal
    /// needs; NaN quieted with its top payload bits.
    fn f32_bits_to_f16_bits(&mut self, x: &str) -> String {
        let sign = self.i32_c("shrui", x, 16);
        let sign = self.i32_c("andi", &sign, 0x8000);
        let a = self.i32_c("andi", x, 0x7FFF_FFFF);
        let lsb = self.i32_c("shrui", &a, 13);
        let lsb = self.i32_c("andi", &lsb, 1);
        let biased = self.i32_c("addi", &a, 0xFFF);
        let biased = self.let_(format_args!("arith.addi {biased}, {lsb} : i32"));
        let normal = self.i32_c("shrui", &biased, 13);
        let normal = self.i32_c("subi", &normal, (127 - 15) << 10);
        let af = self.let_(format_args!("arith.bitcast {a} : i32 to f32"));
        let half = self.c(0.5);
        let sum = self.add(&af, &half);
        let sum = self.let_(format_args!("arith.bitcast {sum} : f32 to i32"));
        let small = self.i32_c("subi", &sum, 0x3F00_0000);
        let payload = self.i32_c("shrui", &a, 13);
        let payload = self.i32_c("andi", &payload, 0x3FF);
        let nan_bits = self.i32_c("ori", &payload, 0x7E00);
        let inf_bits = self.let_("arith.constant 31744 : i32");
        let is_small = self.cmp_u32("ult", &a, 0x3880_0000);
        let r = self.sel_i32(&is_small, &small, &normal);
        let is_big = self.cmp_u32("uge", &a, 0x4780_0000);
        let r = self.sel_i32(&is_big, &inf_bits, &r);
        let is_nan = self.cmp_u32("ugt", &a, 0x7F80_0000);
        let r = self.sel_i32(&is_nan, &nan_bits, &r);
        self.let_(format_args!("arith.ori {r}, {sign} : i32"))
    }

    /// f32 bits → bf16 bits (in an i32), rounded to nearest even as
    /// `half::bf16::from_f32`: the top 16 bits, plus one where the round bit
    /// (15) is set and the bits below it or the last kept bit (16) are — the
    /// same rule for subnormals, and a carry into the exponent gives the
    /// next binade or infinity. NaN: top payload bits with the quiet bit.
    fn f32_bits_to_bf16_bits(&mut self, x: &str) -> String {
        let a = self.i32_c("andi", x, 0x7FFF_FFFF);
        let hi = self.i32_c("shrui", x, 16);
        // Bits 0..14 and 16: all but the round bit.
        let tail = self.i32_c("andi", x, 0x1_7FFF);
        let round = self.i32_c("andi", x, 0x8000);
        let round = self.cmp_u32("ne", &round, 0);
        let tail = self.cmp_u32("ne", &tail, 0);
        let up = self.let_(format_args!("arith.andi {round}, {tail} : i1"));
        let up = self.let_(format_args!("arith.extui {up} : i1 to i32"));
        let r = self.let_(format_args!("arith.addi {hi}, {up} : i32"));
        let nan_bits = self.i32_c("ori", &hi, 0x40);
        let is_nan = self.cmp_u32("ugt", &a, 0x7F80_0000);
        self.sel_i32(&is_nan, &nan_bits, &r)
    }

    /// A cast from or to a half type, as the kernels' `cast` (`convert`):
    /// through the f32 value (exact for every half value; float → int
    /// truncates and saturates, NaN → 0; → bool is `!= 0`, NaN true), bool
    /// → 0 or 1, int → f16 / bf16 through the integer's f32 (`as f32`).
    fn cast_half(&mut self, x: &str, from: Ty, to: Ty) -> String {
        if from == to {
            return x.to_string();
        }
        if from.is_half() {
            let f = self.widen(x, from);
            return match to {
                Ty::F32 => f,
                t if t.is_half() => self.narrow(&f, t),
                t => self.cast(&f, Ty::F32, t),
            };
        }
        match from {
            Ty::Bool => {
                let one = if to == Ty::F16 { 0x3C00 } else { 0x3F80 };
                let (one, zero) =
                    (self.let_(format_args!("arith.constant {one} : i16")), self.let_("arith.constant 0 : i16"));
                self.let_(format_args!("arith.select {x}, {one}, {zero} : i16"))
            }
            _ => {
                let f = self.cast(x, from, Ty::F32);
                self.narrow(&f, to)
            }
        }
    }

    /// The kernels' clamp on half values: bounds rounded to the half type
    /// (`H::from_f64`), `v < lo` then `v > hi` compared as halves (IEEE,
    /// through the exact f32 values), the operand's bits passed through
    /// otherwise (NaN included).
    fn clamp_half(&mut self, x: &str, ty: Ty, min: Option<f64>, max: Option<f64>) -> Result<String, Unsupported> {
        let f = self.widen(x, ty);
        let mut v = x.to_string();
        for (bound, pred) in [(min, "olt"), (max, "ogt")] {
            let Some(bound) = bound else { continue };
            let bits = half_bound(bound, ty);
            // Compare the current value: after the lower bound, `v` may be it.
            let cur = if v == x { f.clone() } else { self.widen(&v, ty) };
            let lo = self.c(half_to_f32(bits, ty));
            let hit = self.cmp(pred, &cur, &lo);
            let b = self.let_(format_args!("arith.constant {} : i16", bits as i16));
            v = self.let_(format_args!("arith.select {hit}, {b}, {v} : i16"));
        }
        Ok(v)
    }
}
