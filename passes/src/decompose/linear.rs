//! `linear(x, w, b) = matmul(x, permute(w, [1, 0])) + b`.
//!
//! With a constant weight, folding then turns the permute into a transposed
//! constant, which is exactly how Core ATen's `permute + addmm` arrives too.

use crate::emit::Emitter;
use crate::PassError;
use kiln_ir::{BinaryOp, Op, ValueId};

pub(super) fn linear(e: &mut Emitter, inputs: &[ValueId]) -> Result<Option<ValueId>, PassError> {
    let (&x, &w) = match inputs {
        [x, w] | [x, w, _] => (x, w),
        _ => return Ok(None),
    };
    if e.ty(w).rank() != 2 {
        return Ok(None);
    }
    let wt = e.push(Op::Permute { perm: vec![1, 0] }, vec![w])?;
    let y = e.push(Op::MatMul, vec![x, wt])?;
    match inputs.get(2) {
        Some(&b) => e.binary(BinaryOp::Add, y, b).map(Some),
        None => Ok(Some(y)),
    }
}
