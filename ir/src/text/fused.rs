//! The text of a fused program (`Op::Fused`'s `program` attribute): one list
//! per op, its name then its operands, registers as numbers —
//! `[[scalar, f32, 2.0], [mul, 0, 2], [exp, 3], [clamp, 4, none, 6.0]]`.

use super::elements::{encode_element, format_elements, format_f64};
use super::ops::AttrVal;
use super::ParseError;
use crate::{BinaryOp, DType, FusedOp, UnaryOp};

pub(super) fn format_program(program: &[FusedOp]) -> String {
    let ops: Vec<String> = program.iter().map(format_op).collect();
    format!("[{}]", ops.join(", "))
}

fn format_op(op: &FusedOp) -> String {
    let bound = |b: Option<f64>| b.map_or("none".to_string(), format_f64);
    match *op {
        FusedOp::Scalar { dtype, bits } => {
            let value = format_elements(dtype, &bits.to_le_bytes()[..dtype.size_bytes()]).join("");
            format!("[scalar, {dtype}, {value}]")
        }
        FusedOp::Unary { op, x } => format!("[{op}, {x}]"),
        FusedOp::Binary { op, a, b } => format!("[{op}, {a}, {b}]"),
        FusedOp::Where { cond, a, b } => format!("[where, {cond}, {a}, {b}]"),
        FusedOp::Cast { to, x } => format!("[cast, {to}, {x}]"),
        FusedOp::Clamp { min, max, x } => format!("[clamp, {x}, {}, {}]", bound(min), bound(max)),
    }
}

pub(super) fn parse_program(v: &AttrVal) -> Result<Vec<FusedOp>, ParseError> {
    match v {
        AttrVal::List(ops, _) => ops.iter().map(parse_op).collect(),
        other => Err(other.pos().error("expected a fused program `[[op, ..], ..]`")),
    }
}

fn parse_op(v: &AttrVal) -> Result<FusedOp, ParseError> {
    let AttrVal::List(parts, pos) = v else { return Err(v.pos().error("expected a fused op `[name, ..]`")) };
    let Some(AttrVal::Ident(name, _)) = parts.first() else { return Err(pos.error("a fused op starts with its name")) };
    let arity = |n: usize| {
        if parts.len() == n + 1 {
            Ok(())
        } else {
            Err(pos.error(format!("fused `{name}` takes {n} arguments, found {}", parts.len() - 1)))
        }
    };
    let reg = |i: usize| super::ops::uint(&parts[i]).map(|r| r as u32);
    let dtype = |i: usize| match &parts[i] {
        AttrVal::Ident(s, p) => DType::from_name(s).ok_or_else(|| p.error(format!("unknown dtype `{s}`"))),
        other => Err(other.pos().error("expected a dtype")),
    };
    let bound = |i: usize| match &parts[i] {
        AttrVal::Ident(s, _) if s == "none" => Ok(None),
        other => super::ops::float(other).map(Some),
    };
    Ok(match name.as_str() {
        "scalar" => {
            arity(2)?;
            let dtype = dtype(1)?;
            let AttrVal::Lit(lit, p) = &parts[2] else { return Err(parts[2].pos().error("expected a scalar value")) };
            let mut bytes = Vec::new();
            encode_element(dtype, lit, &mut bytes).map_err(|m| p.error(m))?;
            FusedOp::scalar(dtype, &bytes).ok_or_else(|| p.error("scalar does not fit its dtype"))?
        }
        "where" => {
            arity(3)?;
            FusedOp::Where { cond: reg(1)?, a: reg(2)?, b: reg(3)? }
        }
        "cast" => {
            arity(2)?;
            FusedOp::Cast { to: dtype(1)?, x: reg(2)? }
        }
        "clamp" => {
            arity(3)?;
            FusedOp::Clamp { x: reg(1)?, min: bound(2)?, max: bound(3)? }
        }
        other => {
            if let Some(op) = UnaryOp::from_name(other) {
                arity(1)?;
                FusedOp::Unary { op, x: reg(1)? }
            } else if let Some(op) = BinaryOp::from_name(other) {
                arity(2)?;
                FusedOp::Binary { op, a: reg(1)?, b: reg(2)? }
            } else {
                return Err(pos.error(format!("unknown fused op `{other}`")));
            }
        }
    })
}
