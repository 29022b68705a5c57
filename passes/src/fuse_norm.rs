//! RMS normalisation recognised from its decomposition — what torch's
//! `rms_norm` (and hand-written Llama-style RMSNorm) export as:
//! `x · rsqrt(mean(x², last k axes, keepdim) + eps) [· weight]`, `x²` as
//! `pow(x, 2)` or `x · x` — becomes one `Op::RmsNorm` (one kernel, one pass
//! per row instead of five ops over memory).
//!
//! Matched when every intermediate has no other use, the mean is over the
//! last axes with kept dims, `eps` is a one-element constant, the dtype is f32
//! or f64, and a weight (if any) has exactly the normalised dims' shape. The
//! kernel accumulates the mean square in f64 and rounds each result once, so
//! results agree with the unfused graph to rounding.

use crate::host::HostTensor;
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, SecondaryMap, UnaryOp, ValueId};

pub fn fuse_rms_norm(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse_norm")?;
    let uses = g.use_counts();
    let mut consumer: SecondaryMap<ValueId, Option<NodeId>> = SecondaryMap::new();
    for &n in &g.order {
        for &v in &g.nodes[n].inputs {
            consumer[v] = Some(n);
        }
    }
    rewrite_in_order(g, |g, n| {
        let m = match weighted(g, n, &uses) {
            Some(m) => m,
            None => {
                let Some(m) = unweighted(g, n, &uses) else { return Ok(Rewrite::Keep) };
                // A weight multiplies next: fuse there, with it.
                let out = g.nodes[n].outputs[0];
                let next = consumer[out].filter(|_| uses[out] == 1);
                if next.is_some_and(|c| weighted(g, c, &uses).is_some()) {
                    return Ok(Rewrite::Keep);
                }
                m
            }
        };
        let ty = g.ty(g.nodes[n].outputs[0]).clone();
        let mut inputs = vec![m.x];
        inputs.extend(m.weight);
        let op = Op::RmsNorm { normalized_rank: m.normalized_rank, eps: m.eps };
        let loc = g.nodes[n].loc;
        Ok(Rewrite::Replace(vec![g.push(op, inputs, ty, loc)]))
    })
}

struct RmsNorm {
    x: ValueId,
    weight: Option<ValueId>,
    normalized_rank: usize,
    eps: f64,
}

/// The producer of `v` when `v` has no other use.
fn single_use(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId) -> Option<NodeId> {
    (uses[v] == 1 && !g.outputs.contains(&v)).then(|| g.producer(v)).flatten()
}

fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    let c = HostTensor::from_const(g, v)?;
    (c.numel() == 1).then(|| c.data[0])
}

/// `n = normalized · weight` (either order) with `normalized` an RMS norm.
fn weighted(g: &Graph, n: NodeId, uses: &SecondaryMap<ValueId, u32>) -> Option<RmsNorm> {
    let node = &g.nodes[n];
    let (Op::Binary(BinaryOp::Mul), [a, b]) = (&node.op, &node.inputs[..]) else { return None };
    for (normed, w) in [(*a, *b), (*b, *a)] {
        let Some(inner) = single_use(g, uses, normed) else { continue };
        let Some(mut m) = unweighted(g, inner, uses) else { continue };
        let (xt, wt) = (g.ty(m.x), g.ty(w));
        let trailing = &xt.shape[xt.rank() - m.normalized_rank..];
        if wt.dtype == xt.dtype && wt.shape == trailing && g.ty(node.outputs[0]) == xt {
            m.weight = Some(w);
            return Some(m);
        }
    }
    None
}

/// `n = x · rsqrt(mean(x²) + eps)` (either order of each binary op).
fn unweighted(g: &Graph, n: NodeId, uses: &SecondaryMap<ValueId, u32>) -> Option<RmsNorm> {
    let node = &g.nodes[n];
    let (Op::Binary(BinaryOp::Mul), [a, b]) = (&node.op, &node.inputs[..]) else { return None };
    for (x, r) in [(*a, *b), (*b, *a)] {
        let xt = g.ty(x);
        if !matches!(xt.dtype, DType::F32 | DType::F64) || g.ty(node.outputs[0]) != xt {
            continue;
        }
        let Some(rs) = single_use(g, uses, r) else { continue };
        let (Op::Unary(UnaryOp::Rsqrt), [sum]) = (&g.nodes[rs].op, &g.nodes[rs].inputs[..]) else { continue };
        let Some(add) = single_use(g, uses, *sum) else { continue };
        let (Op::Binary(BinaryOp::Add), [p, q]) = (&g.nodes[add].op, &g.nodes[add].inputs[..]) else { continue };
        let (mean, eps) = match (scalar(g, *p), scalar(g, *q)) {
            (_, Some(e)) => (*p, e),
            (Some(e), _) => (*q, e),
            _ => continue,
        };
        let Some(mn) = single_use(g, uses, mean) else { continue };
        let (Op::Reduce { kind: ReduceKind::Mean, axes, keep_dims: true }, [sq]) =
            (&g.nodes[mn].op, &g.nodes[mn].inputs[..])
        else {
            continue;
        };
        let r = xt.rank();
        let k = axes.len();
        let mut sorted = axes.clone();
        sorted.sort_unstable();
        if k == 0 || k > r || sorted != (r - k..r).collect::<Vec<_>>() || !squares(g, uses, *sq, x) {
            continue;
        }
        return Some(RmsNorm { x, weight: None, normalized_rank: k, eps });
    }
    None
}

/// `v` is `x²`: `pow(x, 2)` or `x · x`, used only by the mean.
fn squares(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId, x: ValueId) -> bool {
    let Some(n) = single_use(g, uses, v) else { return false };
    match (&g.nodes[n].op, &g.nodes[n].inputs[..]) {
        (Op::Binary(BinaryOp::Pow), [b, e]) => *b == x && scalar(g, *e) == Some(2.0),
        (Op::Binary(BinaryOp::Mul), [a, b]) => *a == x && *b == x,
        _ => false,
    }
}
