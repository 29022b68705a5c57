//! Scaled dot-product attention as torch defines it:
//! `softmax(q kᵀ * scale + mask) v`, `scale` defaulting to `1 / sqrt(E)`.
//! A causal mask keeps key `j` for query `i` when `j <= i` (top-left aligned, like
//! `torch.tril`); a bool mask keeps `true` positions (others get `-inf`), a float
//! mask is added. A fully-masked query row gives zeros (torch's
//! `_safe_softmax`, what SDPA returns since torch 2.5).

use crate::emit::Emitter;
use crate::host::{supported, HostTensor};
use crate::PassError;
use kiln_ir::{BinaryOp, DType, Op, ReduceKind, UnaryOp, ValueId};

pub(super) fn attention(
    e: &mut Emitter,
    inputs: &[ValueId],
    causal: bool,
    scale: Option<f64>,
) -> Result<Option<ValueId>, PassError> {
    let (&q, &k, &v) = match inputs {
        [q, k, v] | [q, k, v, _] => (q, k, v),
        _ => return Ok(None),
    };
    let (q_ty, k_ty) = (e.ty(q), e.ty(k));
    if q_ty.rank() < 2 || k_ty.rank() < 2 || e.ty(v).rank() < 2 || !supported(q_ty.dtype) || !q_ty.dtype.is_float() {
        return Ok(None);
    }
    let embed = q_ty.shape[q_ty.rank() - 1].as_const();
    let Some(scale) = scale.or_else(|| embed.filter(|&d| d > 0).map(|d| 1.0 / (d as f64).sqrt())) else {
        return Ok(None);
    };
    let (len_q, len_k) = (q_ty.shape[q_ty.rank() - 2].as_const(), k_ty.shape[k_ty.rank() - 2].as_const());
    let causal_shape = match (causal, len_q, len_k) {
        (false, ..) => None,
        (true, Some(l), Some(s)) if l >= 0 && s >= 0 => Some((l as usize, s as usize)),
        // A causal mask over symbolic lengths would need an iota op; keep the node.
        (true, ..) => return Ok(None),
    };

    let mut perm: Vec<usize> = (0..k_ty.rank()).collect();
    perm.swap(k_ty.rank() - 2, k_ty.rank() - 1);
    let k_t = e.push(Op::Permute { perm }, vec![k])?;
    let scores = e.push(Op::MatMul, vec![q, k_t])?;
    let scale = e.scalar(q_ty.dtype, scale);
    let mut scores = e.binary(BinaryOp::Mul, scores, scale)?;
    if let Some((l, s)) = causal_shape {
        let keep = (0..l * s).map(|idx| ((idx % s) <= (idx / s)) as u8 as f64).collect();
        let keep = HostTensor::new(DType::Bool, vec![l, s], keep).add_to(e.g, None);
        scores = mask_out(e, scores, keep)?;
    }
    if let Some(&mask) = inputs.get(3) {
        scores = if e.ty(mask).dtype == DType::Bool {
            mask_out(e, scores, mask)?
        } else {
            e.binary(BinaryOp::Add, scores, mask)?
        };
    }
    let last = e.ty(scores).rank() - 1;
    let probs = e.push(Op::Softmax { axis: last }, vec![scores])?;
    let probs = zero_fully_masked(e, scores, probs, last)?;
    e.push(Op::MatMul, vec![probs, v]).map(Some)
}

/// Torch's `_safe_softmax` guard, in the form Core ATen's SDPA decomposes
/// to (and `fuse_attention` matches): a query row whose scores are all -inf
/// attends to nothing and gives zeros, not NaN —
/// `where(not(any(not(scores == -inf), -1)), 0, probs)`.
fn zero_fully_masked(e: &mut Emitter, scores: ValueId, probs: ValueId, last: usize) -> Result<ValueId, PassError> {
    let dtype = e.ty(scores).dtype;
    let neg_inf = e.scalar(dtype, f64::NEG_INFINITY);
    let masked = e.binary(BinaryOp::Eq, scores, neg_inf)?;
    let kept = e.unary(UnaryOp::Not, masked)?;
    let any_kept = e.reduce(ReduceKind::Max, kept, vec![last], true)?;
    let none_kept = e.unary(UnaryOp::Not, any_kept)?;
    let zero = e.scalar(dtype, 0.0);
    e.push(Op::Where, vec![none_kept, zero, probs])
}

/// `where(keep, scores, -inf)`.
fn mask_out(e: &mut Emitter, scores: ValueId, keep: ValueId) -> Result<ValueId, PassError> {
    let neg_inf = e.scalar(e.ty(scores).dtype, f64::NEG_INFINITY);
    e.push(Op::Where, vec![keep, scores, neg_inf])
}
