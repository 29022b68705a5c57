//! Attention recognised from its parts: `matmul(softmax(matmul(q, kᵀ) · c
//! [+ mask]), v)` — what an unfused `scaled_dot_product_attention` and
//! hand-written attention look like, and what Core ATen's decomposition of
//! SDPA produces (its scale on q and k as well as on the scores) — becomes
//! one `Op::Attention` (the CPU's attention kernel: no materialised score
//! tensor between four kernels).
//!
//! Matched when every intermediate (the scores, scaled, masked,
//! normalised) has no other use, the softmax runs over the last axis, the
//! dtype is f32 or f64, and every scale is a one-element constant. `kᵀ` is
//! a permute swapping the last two axes of `k` (taken as `k`), or any value
//! (transposed back with a new permute). An additive float mask becomes the
//! attention's mask. Results agree with the unfused graph to rounding (the
//! kernel accumulates the scores in its own order).

use crate::host::HostTensor;
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{BinaryOp, Builder, DType, Graph, NodeId, Op, SecondaryMap, ValueId};

pub fn fuse_attention(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse_attention")?;
    let uses = g.use_counts();
    rewrite_in_order(g, |g, n| {
        let Some(m) = match_attention(g, n, &uses) else { return Ok(Rewrite::Keep) };
        let loc = g.nodes[n].loc;
        let mut b = Builder::new(g, loc);
        let k = match m.k {
            Key::Plain(k) => k,
            Key::Transposed(kt) => {
                let r = b.g.ty(kt).rank();
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(r - 2, r - 1);
                b.push(Op::Permute { perm }, vec![kt]).map_err(|e| PassError::new("fuse_attention", e))?
            }
        };
        let mut inputs = vec![m.q, k, m.v];
        inputs.extend(m.mask);
        let out_ty = g.ty(g.nodes[n].outputs[0]).clone();
        let op = Op::Attention { causal: false, scale: Some(m.scale) };
        // The attention's inferred type must be the matmul's (batch dims broadcast alike).
        match Builder::new(g, loc).infer(&op, &inputs) {
            Ok(ty) if ty == out_ty => {}
            _ => return Ok(Rewrite::Keep),
        }
        Ok(Rewrite::Replace(vec![g.push(op, inputs, out_ty, loc)]))
    })
}

enum Key {
    /// `k` itself (the scores' right operand was its transpose).
    Plain(ValueId),
    /// `kᵀ`, to be transposed back.
    Transposed(ValueId),
}

struct Attention {
    q: ValueId,
    k: Key,
    v: ValueId,
    mask: Option<ValueId>,
    scale: f64,
}

fn single_use(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId) -> Option<NodeId> {
    (uses[v] == 1 && !g.outputs.contains(&v)).then(|| g.producer(v)).flatten()
}

/// The value of a one-element float constant.
fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    let c = HostTensor::from_const(g, v)?;
    (c.numel() == 1 && c.dtype.is_float()).then(|| c.data[0])
}

/// `x · c`, `c · x` or `x / c` with a scalar `c` and `v` used once: `(x, factor)`.
fn peel_scale(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId) -> (ValueId, f64) {
    let Some(n) = single_use(g, uses, v) else { return (v, 1.0) };
    let node = &g.nodes[n];
    let (a, b) = match node.inputs[..] {
        [a, b] => (a, b),
        _ => return (v, 1.0),
    };
    let same_shape = |x: ValueId| g.ty(x) == g.ty(v);
    match node.op {
        Op::Binary(BinaryOp::Mul) => match (scalar(g, a), scalar(g, b)) {
            (_, Some(c)) if same_shape(a) => (a, c),
            (Some(c), _) if same_shape(b) => (b, c),
            _ => (v, 1.0),
        },
        Op::Binary(BinaryOp::Div) if same_shape(a) => match scalar(g, b) {
            Some(c) if c != 0.0 => (a, 1.0 / c),
            _ => (v, 1.0),
        },
        _ => (v, 1.0),
    }
}

fn match_attention(g: &Graph, n: NodeId, uses: &SecondaryMap<ValueId, u32>) -> Option<Attention> {
    let node = &g.nodes[n];
    let (Op::MatMul, [probs, v]) = (&node.op, &node.inputs[..]) else { return None };
    let dtype = g.ty(node.outputs[0]).dtype;
    if !matches!(dtype, DType::F32 | DType::F64) || g.ty(*v).rank() < 2 {
        return None;
    }
    let sm = single_use(g, uses, *probs)?;
    let rank = g.ty(*probs).rank();
    let (Op::Softmax { axis }, [masked]) = (&g.nodes[sm].op, &g.nodes[sm].inputs[..]) else { return None };
    if *axis + 1 != rank || rank < 2 {
        return None;
    }
    // Optional additive mask (either operand order), then the score scale.
    let (scaled, mask) = match single_use(g, uses, *masked).map(|p| &g.nodes[p]) {
        Some(add) if add.op == Op::Binary(BinaryOp::Add) => {
            let (a, b) = (add.inputs[0], add.inputs[1]);
            let scores_like = |x: ValueId| g.ty(x) == g.ty(*masked);
            match (scores_like(a), scores_like(b)) {
                (true, _) if g.ty(b).dtype == dtype => (a, Some(b)),
                (_, true) if g.ty(a).dtype == dtype => (b, Some(a)),
                _ => return None,
            }
        }
        _ => (*masked, None),
    };
    let (scores, c_scores) = peel_scale(g, uses, scaled);
    let mm = single_use(g, uses, scores)?;
    let (Op::MatMul, [q, kt]) = (&g.nodes[mm].op, &g.nodes[mm].inputs[..]) else { return None };
    if g.ty(*q).rank() < 2 || g.ty(*kt).rank() < 2 {
        return None;
    }
    // Core ATen's SDPA scales q and kᵀ (or k) by √scale each.
    let (q, c_q) = peel_scale(g, uses, *q);
    let (kt, c_kt) = peel_scale(g, uses, *kt);
    let k = match single_use(g, uses, kt).map(|p| &g.nodes[p]) {
        Some(p) if is_last_two_swap(&p.op, g.ty(kt).rank()) => {
            let (k, c_k) = peel_scale(g, uses, p.inputs[0]);
            return Some(Attention { q, k: Key::Plain(k), v: *v, mask, scale: c_scores * c_q * c_kt * c_k });
        }
        _ => Key::Transposed(kt),
    };
    Some(Attention { q, k, v: *v, mask, scale: c_scores * c_q * c_kt })
}

fn is_last_two_swap(op: &Op, rank: usize) -> bool {
    let Op::Permute { perm } = op else { return false };
    rank >= 2
        && perm.len() == rank
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| p == i)
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
}
