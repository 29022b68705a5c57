//! Constant elements and float attributes as text, exact both ways.
//!
//! Floats print as the shortest decimal that reads back to the same bits
//! (Rust's `{:?}`), `inf`/`-inf`, and `nan`. A NaN whose bits are not the
//! dtype's canonical quiet NaN prints its bits, `nan(0x7fc00001)`, so that
//! payloads and signs survive a round trip too.

use crate::DType;
use half::{bf16, f16};

/// Text of a float attribute (`f64`).
pub(super) fn format_f64(v: f64) -> String {
    format_float(v.to_bits(), f64::NAN.to_bits(), v.is_nan(), v.is_infinite(), v < 0.0, || format!("{v:?}"), 16)
}

fn format_float(
    bits: u64,
    canonical_nan: u64,
    is_nan: bool,
    is_inf: bool,
    negative: bool,
    finite: impl FnOnce() -> String,
    hex_digits: usize,
) -> String {
    if is_nan {
        if bits == canonical_nan {
            "nan".to_string()
        } else {
            format!("nan(0x{bits:0hex_digits$x})")
        }
    } else if is_inf {
        if negative { "-inf" } else { "inf" }.to_string()
    } else {
        finite()
    }
}

/// Shortest decimal that reads back (through `f32`, as the parser does) to the
/// same half-precision bits. Trying growing precisions keeps `0.1` for the f16
/// nearest 0.1 instead of `0.099975586`.
fn shortest_half(v: f32, back: impl Fn(f32) -> bool) -> String {
    for precision in 0..9 {
        let candidate: f32 = format!("{v:.precision$e}").parse().unwrap_or(v);
        if back(candidate) {
            return format!("{candidate:?}");
        }
    }
    format!("{v:?}")
}

/// The elements of a constant as text, one string per element. Trailing bytes
/// that do not make a whole element are ignored (the verifier reports them).
pub(super) fn format_elements(dtype: DType, bytes: &[u8]) -> Vec<String> {
    let size = dtype.size_bytes();
    bytes.chunks_exact(size).map(|b| format_element(dtype, b)).collect()
}

fn format_element(dtype: DType, b: &[u8]) -> String {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    let u16v = u16::from_le_bytes([b[0], b.get(1).copied().unwrap_or(0)]);
    match dtype {
        DType::F64 => format_f64(f64::from_le_bytes(arr(8))),
        DType::F32 => {
            let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            format_float(
                v.to_bits() as u64,
                f32::NAN.to_bits() as u64,
                v.is_nan(),
                v.is_infinite(),
                v < 0.0,
                || format!("{v:?}"),
                8,
            )
        }
        DType::F16 => {
            let h = f16::from_bits(u16v);
            let v = h.to_f32();
            let finite = || shortest_half(v, |c| f16::from_f32(c).to_bits() == u16v);
            format_float(u16v as u64, f16::NAN.to_bits() as u64, h.is_nan(), h.is_infinite(), v < 0.0, finite, 4)
        }
        DType::BF16 => {
            let h = bf16::from_bits(u16v);
            let v = h.to_f32();
            let finite = || shortest_half(v, |c| bf16::from_f32(c).to_bits() == u16v);
            format_float(u16v as u64, bf16::NAN.to_bits() as u64, h.is_nan(), h.is_infinite(), v < 0.0, finite, 4)
        }
        DType::I8 => (b[0] as i8).to_string(),
        DType::U8 => b[0].to_string(),
        DType::I16 => (u16v as i16).to_string(),
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_string(),
        DType::I64 => i64::from_le_bytes(arr(8)).to_string(),
        DType::Bool => match b[0] {
            0 => "false".to_string(),
            1 => "true".to_string(),
            // Not a valid bool; kept as its byte so that the text stays exact.
            other => other.to_string(),
        },
        // Only an invalid graph holds one (the verifier refuses complex
        // values); shown as its parts for the message.
        DType::C64 | DType::C128 => {
            let part = dtype.complex_part().unwrap_or(DType::F64);
            let half = part.size_bytes();
            format!("({}, {})", format_element(part, &b[..half]), format_element(part, &b[half..2 * half]))
        }
    }
}

/// One element as parsed, before it is checked against the dtype.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Literal {
    /// A numeric literal as written, sign included.
    Num(String),
    Bool(bool),
    Inf {
        negative: bool,
    },
    /// `nan` or `nan(0xBITS)`.
    Nan(Option<u64>),
}

/// Parses an `f64` attribute literal.
pub(super) fn literal_f64(lit: &Literal) -> Result<f64, String> {
    match lit {
        Literal::Num(s) => s.parse::<f64>().map_err(|_| format!("invalid number `{s}`")),
        Literal::Inf { negative } => Ok(if *negative { f64::NEG_INFINITY } else { f64::INFINITY }),
        Literal::Nan(None) => Ok(f64::NAN),
        Literal::Nan(Some(bits)) => nan_bits(*bits, 64).map(f64::from_bits),
        Literal::Bool(_) => Err("expected a number, found a bool".to_string()),
    }
}

/// Checks that `bits` fits in `width` bits and is a NaN of that width.
fn nan_bits(bits: u64, width: u32) -> Result<u64, String> {
    let is_nan = match width {
        64 => f64::from_bits(bits).is_nan(),
        _ => bits >> 32 == 0 && f32::from_bits(bits as u32).is_nan(),
    };
    if !is_nan {
        return Err(format!("0x{bits:x} is not a {width}-bit NaN"));
    }
    Ok(bits)
}

/// Appends the little-endian bytes of one element of `dtype`.
pub(super) fn encode_element(dtype: DType, lit: &Literal, out: &mut Vec<u8>) -> Result<(), String> {
    let int = |lo: i64, hi: i64| -> Result<i64, String> {
        let Literal::Num(s) = lit else {
            return Err(format!("expected an integer for {dtype}"));
        };
        let v = s.parse::<i64>().map_err(|_| format!("expected an integer for {dtype}, found `{s}`"))?;
        if v < lo || v > hi {
            return Err(format!("{v} is out of range for {dtype}"));
        }
        Ok(v)
    };
    match dtype {
        DType::F64 => out.extend(literal_f64(lit)?.to_le_bytes()),
        DType::F32 => out.extend(literal_f32(lit, 32)?.to_le_bytes()),
        DType::F16 => {
            let bits = match lit {
                Literal::Nan(Some(bits)) => half_nan_bits(*bits, f16::from_bits)?,
                _ => f16::from_f32(f32::from_bits(literal_f32(lit, 16)?)).to_bits(),
            };
            out.extend(bits.to_le_bytes())
        }
        DType::BF16 => {
            let bits = match lit {
                Literal::Nan(Some(bits)) => half_nan_bits(*bits, bf16::from_bits)?,
                _ => bf16::from_f32(f32::from_bits(literal_f32(lit, 16)?)).to_bits(),
            };
            out.extend(bits.to_le_bytes())
        }
        DType::I8 => out.extend((int(i8::MIN as i64, i8::MAX as i64)? as i8).to_le_bytes()),
        DType::U8 => out.push(int(0, u8::MAX as i64)? as u8),
        DType::I16 => out.extend((int(i16::MIN as i64, i16::MAX as i64)? as i16).to_le_bytes()),
        DType::I32 => out.extend((int(i32::MIN as i64, i32::MAX as i64)? as i32).to_le_bytes()),
        DType::I64 => out.extend(int(i64::MIN, i64::MAX)?.to_le_bytes()),
        DType::Bool => match lit {
            Literal::Bool(b) => out.push(*b as u8),
            // Bytes other than 0/1 print as numbers (see `format_element`).
            Literal::Num(_) => out.push(int(0, u8::MAX as i64)? as u8),
            _ => return Err("expected `true` or `false`".to_string()),
        },
        DType::C64 | DType::C128 => {
            return Err(format!("{dtype} has no constants: complex values exist only at a program's boundary"))
        }
    }
    Ok(())
}

/// The `f32` bits of a literal (for f32 and, after rounding, the half types).
/// Parsing the decimal straight to `f32` avoids double rounding through `f64`.
fn literal_f32(lit: &Literal, width: u32) -> Result<u32, String> {
    match lit {
        Literal::Num(s) => s.parse::<f32>().map(f32::to_bits).map_err(|_| format!("invalid number `{s}`")),
        Literal::Inf { negative } => Ok(if *negative { f32::NEG_INFINITY } else { f32::INFINITY }.to_bits()),
        Literal::Nan(None) => Ok(f32::NAN.to_bits()),
        Literal::Nan(Some(bits)) if width == 32 => Ok(nan_bits(*bits, 32)? as u32),
        Literal::Nan(Some(_)) => Err("nan bits of the wrong width".to_string()),
        Literal::Bool(_) => Err("expected a number, found a bool".to_string()),
    }
}

fn half_nan_bits<H: HalfNan>(bits: u64, from_bits: fn(u16) -> H) -> Result<u16, String> {
    let b = u16::try_from(bits).map_err(|_| format!("nan bits 0x{bits:x} do not fit in 16 bits"))?;
    if !from_bits(b).nan() {
        return Err(format!("0x{b:04x} is not a NaN"));
    }
    Ok(b)
}

trait HalfNan {
    fn nan(&self) -> bool;
}
impl HalfNan for f16 {
    fn nan(&self) -> bool {
        self.is_nan()
    }
}
impl HalfNan for bf16 {
    fn nan(&self) -> bool {
        self.is_nan()
    }
}
