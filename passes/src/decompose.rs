//! Decomposition: rewrites composites the target lacks into ops it has.
//!
//! Which composites survive is the target's call ([`TargetDesc::keeps`]). No
//! target keeps two of them, because their rewrites are pure wins: BatchNorm
//! becomes one multiply and one add by per-channel constants, and
//! AdaptiveAvgPool becomes a mean (all-1 output) or a plain pool. A rule that
//! cannot apply (symbolic sizes it needs, f16 parameters it would have to
//! encode) leaves the node as it is; that is not an error, and the target's
//! lowering reports ops it still cannot run.
//! One file per family of rules under `decompose/`.

mod attention;
mod linear;
pub(crate) mod norm;
mod pool;
mod softmax;

use crate::check::guard;
use crate::emit::{Emitter, PASS};
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError, TargetDesc};
use kiln_ir::{Graph, NodeId, Op, TensorType, ValueId};

pub fn decompose(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    guard(g, PASS)?;
    rewrite_in_order(g, |g, n| decompose_node(g, n, &opts.target))
}

fn decompose_node(g: &mut Graph, n: NodeId, target: &TargetDesc) -> Result<Rewrite, PassError> {
    let node = &g.nodes[n];
    let &[out] = node.outputs.as_slice() else { return Ok(Rewrite::Keep) };
    if target.keeps(&node.op) {
        return Ok(Rewrite::Keep);
    }
    let (op, inputs, loc) = (node.op.clone(), node.inputs.clone(), node.loc);
    let out_ty = g.ty(out).clone();
    let first_new_value = g.values.next_key();
    let mut e = Emitter { g, target, loc };
    let Some(v) = expand_op(&mut e, &op, &inputs, &out_ty)? else { return Ok(Rewrite::Keep) };
    reconcile_type(g, v, &out_ty, first_new_value, n)?;
    Ok(Rewrite::Replace(vec![v]))
}

/// The replacement must carry the original type. Locally inferred shapes can spell
/// a symbolic dimension differently; the original spelling wins on a value the rule
/// just built. A different dtype or rank is a bug in a rule.
fn reconcile_type(
    g: &mut Graph,
    v: ValueId,
    want: &TensorType,
    first_new: ValueId,
    n: NodeId,
) -> Result<(), PassError> {
    let got = g.ty(v);
    if got == want {
        return Ok(());
    }
    let statics_agree = got.shape.iter().zip(&want.shape).all(|(a, b)| match (a.as_const(), b.as_const()) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    });
    if got.dtype == want.dtype && got.rank() == want.rank() && statics_agree && v >= first_new {
        g.values[v].ty = want.clone();
        return Ok(());
    }
    Err(PassError::new(
        PASS,
        format!(
            "decomposing {} produced {:?} {:?}, expected {:?} {:?}",
            g.describe_node(n),
            got.dtype,
            got.shape,
            want.dtype,
            want.shape
        ),
    ))
}

/// Builds `op(inputs)` from smaller ops; `None` when no rule applies.
pub(crate) fn expand_op(
    e: &mut Emitter,
    op: &Op,
    inputs: &[ValueId],
    out_ty: &TensorType,
) -> Result<Option<ValueId>, PassError> {
    match op {
        Op::Linear => linear::linear(e, inputs),
        Op::BatchNorm { eps } => norm::batch_norm(e, inputs, *eps),
        Op::LayerNorm { normalized_rank, eps } => norm::layer_norm(e, inputs, *normalized_rank, *eps),
        Op::Softmax { axis } => softmax::softmax(e, inputs, *axis, false),
        Op::LogSoftmax { axis } => softmax::softmax(e, inputs, *axis, true),
        Op::Attention { causal, scale } => attention::attention(e, inputs, *causal, *scale),
        Op::AdaptiveAvgPool { output } => pool::adaptive_avg_pool(e, inputs, output),
        Op::Pool { .. } => pool::pool(e, op, inputs, out_ty),
        _ => Ok(None),
    }
}
