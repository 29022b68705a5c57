//! Numerically stable softmax along one axis, subtracting the maximum first:
//! `softmax(x) = exp(x - max) / sum(exp(x - max))`,
//! `log_softmax(x) = (x - max) - log(sum(exp(x - max)))`.
//!
//! f16/bf16 compute in f32 and round once at the end, as PyTorch's CPU
//! kernels do — with one exception that matters at f16 precision: torch's
//! last-axis log_softmax for reduced dtypes stores the row sum and its log in
//! the input dtype (`_vec_log_softmax_lastdim` keeps them in a buffer of that
//! type) before the final f32 subtraction. Without those two roundings
//! results land up to 2 f16 ulps from torch's.

use crate::emit::Emitter;
use crate::PassError;
use kiln_ir::{BinaryOp, DType, Op, ReduceKind, UnaryOp, ValueId};

pub(super) fn softmax(
    e: &mut Emitter,
    inputs: &[ValueId],
    axis: usize,
    log: bool,
) -> Result<Option<ValueId>, PassError> {
    let &[x] = inputs else { return Ok(None) };
    let ty = e.ty(x);
    if axis >= ty.rank() || !ty.dtype.is_float() {
        return Ok(None);
    }
    let reduced = matches!(ty.dtype, DType::F16 | DType::BF16);
    let x = if reduced { e.push(Op::Cast { to: DType::F32 }, vec![x])? } else { x };
    // Rounds an f32 intermediate through the input dtype (torch's storage).
    let torch_rounding = reduced && log && axis + 1 == ty.rank();
    let round_through = |e: &mut Emitter, v: ValueId| -> Result<ValueId, PassError> {
        if !torch_rounding {
            return Ok(v);
        }
        let narrow = e.push(Op::Cast { to: ty.dtype }, vec![v])?;
        e.push(Op::Cast { to: DType::F32 }, vec![narrow])
    };
    let max = e.reduce(ReduceKind::Max, x, vec![axis], true)?;
    let shifted = e.binary(BinaryOp::Sub, x, max)?;
    let exp = e.unary(UnaryOp::Exp, shifted)?;
    let sum = e.reduce(ReduceKind::Sum, exp, vec![axis], true)?;
    let y = if log {
        let sum = round_through(e, sum)?;
        let log_sum = e.unary(UnaryOp::Log, sum)?;
        let log_sum = round_through(e, log_sum)?;
        e.binary(BinaryOp::Sub, shifted, log_sum)?
    } else {
        e.binary(BinaryOp::Div, exp, sum)?
    };
    if reduced {
        return Ok(Some(e.push(Op::Cast { to: ty.dtype }, vec![y])?));
    }
    Ok(Some(y))
}
