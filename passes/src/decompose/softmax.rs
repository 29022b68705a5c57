//! Numerically stable softmax along one axis, subtracting the maximum first:
//! `softmax(x) = exp(x - max) / sum(exp(x - max))`,
//! `log_softmax(x) = (x - max) - log(sum(exp(x - max)))`.

use crate::emit::Emitter;
use crate::PassError;
use kiln_ir::{BinaryOp, ReduceKind, UnaryOp, ValueId};

pub(super) fn softmax(e: &mut Emitter, inputs: &[ValueId], axis: usize, log: bool) -> Result<Option<ValueId>, PassError> {
    let &[x] = inputs else { return Ok(None) };
    if axis >= e.ty(x).rank() || !e.ty(x).dtype.is_float() {
        return Ok(None);
    }
    let max = e.reduce(ReduceKind::Max, x, vec![axis], true)?;
    let shifted = e.binary(BinaryOp::Sub, x, max)?;
    let exp = e.unary(UnaryOp::Exp, shifted)?;
    let sum = e.reduce(ReduceKind::Sum, exp, vec![axis], true)?;
    let y = if log {
        let log_sum = e.unary(UnaryOp::Log, sum)?;
        e.binary(BinaryOp::Sub, shifted, log_sum)?
    } else {
        e.binary(BinaryOp::Div, exp, sum)?
    };
    Ok(Some(y))
}
