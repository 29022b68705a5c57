//! Fused elementwise programs: a short list of element ops run by one kernel
//! in one pass over memory (the IR's `Op::Fused`, the plan's `Fused` call).
//!
//! Registers are numbered in order of definition: `0..inputs` are the
//! operands (each broadcast to the output's shape), then each op defines the
//! next register. The program's result is its last register. The program is
//! the same value in the IR, the artifact and the kernel; [`register_types`]
//! is the one definition of which programs are well formed, used by the IR
//! verifier, the loader (an artifact's program is untrusted) and the kernel.

use crate::{BinaryOp, DType, UnaryOp};

/// Most ops a program may hold (the kernel keeps one tile per live register).
pub const MAX_FUSED_OPS: usize = 64;
/// Most operands a fused op may take.
pub const MAX_FUSED_INPUTS: usize = 64;

/// One element op of a fused program. Register operands name earlier registers.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum FusedOp {
    /// A constant of `dtype`: its little-endian element bytes are the low
    /// bytes of `bits` (the rest zero).
    Scalar {
        dtype: DType,
        bits: u64,
    },
    Unary {
        op: UnaryOp,
        x: u32,
    },
    /// Both operands of one dtype; comparisons yield `bool`.
    Binary {
        op: BinaryOp,
        a: u32,
        b: u32,
    },
    /// `cond ? a : b`, `cond` a `bool` register.
    Where {
        cond: u32,
        a: u32,
        b: u32,
    },
    Cast {
        to: DType,
        x: u32,
    },
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
        x: u32,
    },
}

impl FusedOp {
    /// The registers this op reads.
    pub fn operands(&self) -> impl Iterator<Item = u32> {
        let (list, n): ([u32; 3], usize) = match *self {
            FusedOp::Scalar { .. } => ([0; 3], 0),
            FusedOp::Unary { x, .. } | FusedOp::Cast { x, .. } | FusedOp::Clamp { x, .. } => ([x, 0, 0], 1),
            FusedOp::Binary { a, b, .. } => ([a, b, 0], 2),
            FusedOp::Where { cond, a, b } => ([cond, a, b], 3),
        };
        list.into_iter().take(n)
    }

    /// The op with every register operand mapped through `f`.
    pub fn map_registers(&self, mut f: impl FnMut(u32) -> u32) -> FusedOp {
        match *self {
            s @ FusedOp::Scalar { .. } => s,
            FusedOp::Unary { op, x } => FusedOp::Unary { op, x: f(x) },
            FusedOp::Binary { op, a, b } => FusedOp::Binary { op, a: f(a), b: f(b) },
            FusedOp::Where { cond, a, b } => FusedOp::Where { cond: f(cond), a: f(a), b: f(b) },
            FusedOp::Cast { to, x } => FusedOp::Cast { to, x: f(x) },
            FusedOp::Clamp { min, max, x } => FusedOp::Clamp { min, max, x: f(x) },
        }
    }

    /// A scalar op holding `value`'s element bytes (at most 8).
    pub fn scalar(dtype: DType, bytes: &[u8]) -> Option<FusedOp> {
        if bytes.len() != dtype.size_bytes() {
            return None;
        }
        let mut b = [0u8; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(FusedOp::Scalar { dtype, bits: u64::from_le_bytes(b) })
    }
}

/// The dtype of every register of `program` run on operands of `inputs`'
/// dtypes (inputs first, then one per op), or what is wrong with it: a
/// register read before it is defined, operands of different dtypes, a
/// non-bool condition, a `bool` clamp, a scalar whose bits do not fit its
/// dtype, an empty or oversized program.
pub fn register_types(program: &[FusedOp], inputs: &[DType]) -> Result<Vec<DType>, String> {
    let mut types = vec![DType::Bool; inputs.len() + program.len()];
    register_types_into(program, inputs, &mut types)?;
    Ok(types)
}

/// [`register_types`] into `types` (at least `inputs.len() + program.len()`
/// long), allocating nothing unless the program is wrong.
pub fn register_types_into(program: &[FusedOp], inputs: &[DType], types: &mut [DType]) -> Result<(), String> {
    if program.is_empty() {
        return Err("a fused program has no ops".into());
    }
    if program.len() > MAX_FUSED_OPS || inputs.len() > MAX_FUSED_INPUTS {
        return Err(format!(
            "a fused program takes at most {MAX_FUSED_INPUTS} operands and {MAX_FUSED_OPS} ops (has {} and {})",
            inputs.len(),
            program.len()
        ));
    }
    let n_in = inputs.len();
    if types.len() < n_in + program.len() {
        return Err("register table too short".into());
    }
    types[..n_in].copy_from_slice(inputs);
    for (i, op) in program.iter().enumerate() {
        let defined = &types[..n_in + i];
        let reg = |r: u32| {
            defined.get(r as usize).copied().ok_or_else(|| format!("op {i} reads register {r} before it is defined"))
        };
        let ty = match *op {
            FusedOp::Scalar { dtype, bits } => {
                if dtype.size_bytes() < 8 && bits >> (8 * dtype.size_bytes()) != 0 {
                    return Err(format!("op {i}: scalar bits 0x{bits:x} do not fit {dtype}"));
                }
                dtype
            }
            FusedOp::Unary { op, x } => {
                let t = reg(x)?;
                let logical = matches!(op, UnaryOp::Not);
                if logical != (t == DType::Bool) && !(op == UnaryOp::BitNot && t == DType::Bool) {
                    return Err(format!("op {i}: {op} of {t}"));
                }
                t
            }
            FusedOp::Binary { op, a, b } => {
                let (ta, tb) = (reg(a)?, reg(b)?);
                if ta != tb {
                    return Err(format!("op {i}: {op} of {ta} and {tb}"));
                }
                if op.is_comparison() {
                    DType::Bool
                } else {
                    ta
                }
            }
            FusedOp::Where { cond, a, b } => {
                let (tc, ta, tb) = (reg(cond)?, reg(a)?, reg(b)?);
                if tc != DType::Bool || ta != tb {
                    return Err(format!("op {i}: where of {tc}, {ta} and {tb}"));
                }
                ta
            }
            FusedOp::Cast { to, x } => {
                reg(x)?;
                to
            }
            FusedOp::Clamp { x, .. } => {
                let t = reg(x)?;
                if t == DType::Bool {
                    return Err(format!("op {i}: clamp of bool"));
                }
                t
            }
        };
        types[n_in + i] = ty;
    }
    Ok(())
}

/// On disk every op is the same tuple: `(kind, selector, r0, r1, r2, imm0,
/// imm1)` — kind 0 scalar (selector: dtype code, imm0: bits), 1 unary
/// (selector: op code), 2 binary, 3 where, 4 cast (selector: dtype code), 5
/// clamp (selector: bit 0 a min in imm0, bit 1 a max in imm1, as f64 bits).
#[cfg(feature = "serde")]
mod fused_serde {
    use super::FusedOp;
    use crate::{BinaryOp, DType, UnaryOp};
    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;

    type Row = (u16, u16, u32, u32, u32, u64, u64);

    fn row(op: &FusedOp) -> Row {
        match *op {
            FusedOp::Scalar { dtype, bits } => (0, dtype.code(), 0, 0, 0, bits, 0),
            FusedOp::Unary { op, x } => (1, op.code(), x, 0, 0, 0, 0),
            FusedOp::Binary { op, a, b } => (2, op.code(), a, b, 0, 0, 0),
            FusedOp::Where { cond, a, b } => (3, 0, cond, a, b, 0, 0),
            FusedOp::Cast { to, x } => (4, to.code(), x, 0, 0, 0, 0),
            FusedOp::Clamp { min, max, x } => {
                let flags = u16::from(min.is_some()) | u16::from(max.is_some()) << 1;
                (5, flags, x, 0, 0, min.unwrap_or(0.0).to_bits(), max.unwrap_or(0.0).to_bits())
            }
        }
    }

    fn from_row((kind, sel, r0, r1, r2, imm0, imm1): Row) -> Result<FusedOp, String> {
        fn code<T>(r: Result<T, crate::UnknownCode>) -> Result<T, String> {
            r.map_err(|e| e.to_string())
        }
        Ok(match kind {
            0 => FusedOp::Scalar { dtype: code(DType::from_code(sel))?, bits: imm0 },
            1 => FusedOp::Unary { op: code(UnaryOp::from_code(sel))?, x: r0 },
            2 => FusedOp::Binary { op: code(BinaryOp::from_code(sel))?, a: r0, b: r1 },
            3 => FusedOp::Where { cond: r0, a: r1, b: r2 },
            4 => FusedOp::Cast { to: code(DType::from_code(sel))?, x: r0 },
            5 if sel <= 3 => FusedOp::Clamp {
                min: (sel & 1 != 0).then(|| f64::from_bits(imm0)),
                max: (sel & 2 != 0).then(|| f64::from_bits(imm1)),
                x: r0,
            },
            5 => return Err(format!("unknown clamp bounds {sel}")),
            k => return Err(format!("unknown fused op kind {k}")),
        })
    }

    impl serde::Serialize for FusedOp {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let (a, b, c, d, e, f, g) = row(self);
            let mut t = s.serialize_tuple(7)?;
            t.serialize_element(&a)?;
            t.serialize_element(&b)?;
            t.serialize_element(&c)?;
            t.serialize_element(&d)?;
            t.serialize_element(&e)?;
            t.serialize_element(&f)?;
            t.serialize_element(&g)?;
            t.end()
        }
    }

    impl<'de> serde::Deserialize<'de> for FusedOp {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FusedOp, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = FusedOp;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a fused op (kind, selector, registers, immediates)")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FusedOp, A::Error> {
                    let missing = || de::Error::custom("truncated fused op");
                    let row: Row = (
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                    );
                    from_row(row).map_err(de::Error::custom)
                }
            }
            d.deserialize_tuple(7, V)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_the_ops_and_bad_programs_are_named() {
        let p = [
            FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 1 },
            FusedOp::Scalar { dtype: DType::F32, bits: 2f32.to_bits() as u64 },
            FusedOp::Binary { op: BinaryOp::Gt, a: 2, b: 3 },
            FusedOp::Where { cond: 4, a: 2, b: 3 },
            FusedOp::Cast { to: DType::F64, x: 5 },
        ];
        let t = register_types(&p, &[DType::F32, DType::F32]).unwrap();
        assert_eq!(t, [DType::F32, DType::F32, DType::F32, DType::F32, DType::Bool, DType::F32, DType::F64]);
        let forward = [FusedOp::Unary { op: UnaryOp::Exp, x: 1 }];
        assert!(register_types(&forward, &[DType::F32]).unwrap_err().contains("before it is defined"));
        let mixed = [FusedOp::Binary { op: BinaryOp::Add, a: 0, b: 1 }];
        assert!(register_types(&mixed, &[DType::F32, DType::I64]).is_err());
        let wide = [FusedOp::Scalar { dtype: DType::I8, bits: 0x100 }];
        assert!(register_types(&wide, &[]).is_err());
        assert!(register_types(&[], &[DType::F32]).is_err());
    }
}
