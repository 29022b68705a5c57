//! MLIR text for types and attributes, and shape arithmetic.
//!
//! Ops are built from attribute and type *text* (StableHLO is not a
//! registered dialect here, see the parent module), so the spellings live in
//! one place: element types, `tensor<…>` types, `array<i64: …>` and list
//! attributes, scalar literals (with hex bit patterns for inf/nan) and
//! `dot_general` dimension numbers.

use super::{err, EmitError};
use kiln_ir::DType;
use melior::ir::Type;
use melior::Context;

pub(super) fn numel(shape: &[i64]) -> i64 {
    shape.iter().product()
}

pub(super) fn elem(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I8 => "i8",
        DType::U8 => "ui8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "i1",
        // Never an IR value's type (the verifier refuses them); StableHLO's
        // spelling for completeness.
        DType::C64 => "complex<f32>",
        DType::C128 => "complex<f64>",
    }
}

pub(super) fn type_text(shape: &[i64], d: DType) -> String {
    let mut s = String::from("tensor<");
    for x in shape {
        s.push_str(&format!("{x}x"));
    }
    s.push_str(elem(d));
    s.push('>');
    s
}

pub(super) fn parse_type<'c>(ctx: &'c Context, shape: &[i64], d: DType) -> Result<Type<'c>, EmitError> {
    let text = type_text(shape, d);
    Type::parse(ctx, &text).ok_or_else(|| err(format!("cannot parse type {text}")))
}

pub(super) fn arr(v: &[i64]) -> String {
    if v.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", join(v))
    }
}

pub(super) fn join(v: &[i64]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

pub(super) fn list(v: &[i64]) -> String {
    format!("[{}]", join(v))
}

/// A scalar literal of dtype `d` as MLIR dense-element text.
pub(super) fn literal(value: f64, d: DType) -> String {
    match d {
        DType::Bool => (if value != 0.0 { "true" } else { "false" }).into(),
        DType::U8 => format!("{}", value.clamp(0.0, 255.0) as u8),
        d if d.is_int() => format!("{}", value as i64),
        d if value.is_finite() => match d {
            DType::F64 => format!("{value:.17e}"),
            _ => format!("{:.9e}", value),
        },
        d => {
            // MLIR has no inf/nan literal; hex bit patterns of the element type.
            let (inf, nan): (u64, u64) = match d {
                DType::F64 => (0x7FF0_0000_0000_0000, 0x7FF8_0000_0000_0000),
                DType::F16 => (0x7C00, 0x7E00),
                DType::BF16 => (0x7F80, 0x7FC0),
                _ => (0x7F80_0000, 0x7FC0_0000),
            };
            let sign: u64 = match d {
                DType::F64 => 1 << 63,
                DType::F16 | DType::BF16 => 1 << 15,
                _ => 1 << 31,
            };
            let bits = if value.is_nan() {
                nan
            } else if value > 0.0 {
                inf
            } else {
                inf | sign
            };
            format!("0x{bits:X}")
        }
    }
}

/// Dimension numbers of `stablehlo.dot_general`, empty lists omitted.
pub(super) fn dot_dims(lb: &[i64], rb: &[i64], lc: &[i64], rc: &[i64]) -> String {
    let mut parts = Vec::new();
    if !lb.is_empty() {
        parts.push(format!("lhs_batching_dimensions = {}", list(lb)));
        parts.push(format!("rhs_batching_dimensions = {}", list(rb)));
    }
    parts.push(format!("lhs_contracting_dimensions = {}", list(lc)));
    parts.push(format!("rhs_contracting_dimensions = {}", list(rc)));
    format!("#stablehlo.dot<{}>", parts.join(", "))
}

/// Numpy broadcasting of two shapes.
pub(super) fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let x = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
        let y = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}
