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
//! attention's mask. The softmax may be torch's `_safe_softmax` (a guard
//! that zeroes fully-masked rows: what Core ATen's SDPA decomposes to since
//! torch 2.5; the kernel does the same). A plain softmax is fused only
//! without a mask: with one, a fully-masked row is NaN in torch, which the
//! kernel (zeros) would not reproduce. Results agree with the unfused graph
//! to rounding (the kernel accumulates the scores in its own order).

use crate::host::HostTensor;
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{
    BinaryOp, Builder, DType, Dim, Graph, NodeId, Op, ReduceKind, SecondaryMap, TensorType, UnaryOp, ValueId,
};

pub fn fuse_attention(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse_attention")?;
    let fused = fuse(g)?;
    let shared = share_kv_heads(g)?;
    Ok(if fused == Changed::Yes || shared == Changed::Yes { Changed::Yes } else { Changed::No })
}

/// Pattern → `Op::Attention`.
fn fuse(g: &mut Graph) -> Result<Changed, PassError> {
    let uses = g.use_counts();
    rewrite_in_order(g, |g, n| {
        let Some(m) = match_attention(g, n, &uses) else { return Ok(Rewrite::Keep) };
        let loc = g.nodes[n].loc;
        let err = |e| PassError::new("fuse_attention", e);
        let mut b = Builder::new(g, loc);
        // Operands of a batched matmul over merged batch dims are viewed
        // in the softmax's batch dims (reshapes the planner aliases).
        let in_batch = |b: &mut Builder, x: ValueId| -> Result<ValueId, PassError> {
            let Some(batch) = &m.batch else { return Ok(x) };
            let ty = b.g.ty(x).clone();
            let r = ty.rank();
            if ty.shape[..r - 2] == batch[..] {
                return Ok(x);
            }
            let shape = batch.iter().chain(&ty.shape[r - 2..]).cloned().collect();
            b.push(Op::Reshape { shape }, vec![x]).map_err(err)
        };
        let q = in_batch(&mut b, m.q)?;
        let v = in_batch(&mut b, m.v)?;
        let k = match m.k {
            Key::Plain(k) => in_batch(&mut b, k)?,
            Key::Transposed(kt) => {
                let kt = in_batch(&mut b, kt)?;
                let r = b.g.ty(kt).rank();
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(r - 2, r - 1);
                b.push(Op::Permute { perm }, vec![kt]).map_err(err)?
            }
        };
        let mut inputs = vec![q, k, v];
        inputs.extend(m.mask);
        let out_ty = g.ty(g.nodes[n].outputs[0]).clone();
        let mut attn_ty = out_ty.clone();
        if let Some(batch) = &m.batch {
            attn_ty.shape = batch.iter().chain(&out_ty.shape[out_ty.rank() - 2..]).cloned().collect();
        }
        let op = Op::Attention { causal: false, scale: Some(m.scale) };
        // The attention's inferred type must be the matmul's (batch dims broadcast alike).
        match Builder::new(g, loc).infer(&op, &inputs) {
            Ok(ty) if ty == attn_ty => {}
            _ => return Ok(Rewrite::Keep),
        }
        let out = g.push(op, inputs, attn_ty, loc);
        if m.batch.is_none() {
            return Ok(Rewrite::Replace(vec![out]));
        }
        let reshape = Op::Reshape { shape: out_ty.shape.clone() };
        Ok(Rewrite::Replace(vec![g.push(reshape, vec![out], out_ty, loc)]))
    })
}

/// Grouped-query attention without repeated K and V: an attention whose K
/// and V are each `reshape(expand(x))`, `x` `[.., Hkv, 1, S, E]` expanded to
/// `[.., Hkv, R, S, E]` and viewed as `[.., Hkv·R, S, E]` (Hugging Face's
/// `repeat_kv`, SDPA's `enable_gqa`, both as Core ATen exports them), runs
/// over `[.., Hkv, R]` batch dims instead: q and the mask viewed so, K and V
/// as `x` — broadcast over R by the kernel, which reads each K/V head in
/// place for its R query heads — and the result viewed back. The views
/// move no data; the expand copies die. Every head computes what it did,
/// from the same K and V values, so results are bit-identical.
fn share_kv_heads(g: &mut Graph) -> Result<Changed, PassError> {
    rewrite_in_order(g, |g, n| {
        let node = &g.nodes[n];
        let (Op::Attention { .. }, [q, k, v, rest @ ..]) = (&node.op, &node.inputs[..]) else {
            return Ok(Rewrite::Keep);
        };
        let (op, (q, k, v), mask, loc) = (node.op.clone(), (*q, *k, *v), rest.first().copied(), node.loc);
        let out_ty = g.ty(node.outputs[0]).clone();
        let Some(((k5, hkv, rep), (v5, hkv_v, rep_v))) = repeated_heads(g, k).zip(repeated_heads(g, v)) else {
            return Ok(Rewrite::Keep);
        };
        // q `[.., H, L, E]` with K's batch dims (no broadcast of its own).
        let (rank, qt) = (g.ty(k).rank(), g.ty(q).clone());
        let h = rank - 3;
        if (hkv_v, rep_v) != (hkv, rep) || qt.rank() != rank || qt.shape[..=h] != g.ty(k).shape[..=h] {
            return Ok(Rewrite::Keep);
        }
        let split = |shape: &[Dim], at: usize| -> Vec<Dim> {
            let mut s = shape[..at].to_vec();
            s.extend([Dim::Const(hkv), Dim::Const(rep)]);
            s.extend_from_slice(&shape[at + 1..]);
            s
        };
        let mask5 = match mask.map(|m| (m, g.ty(m).clone())) {
            None => None,
            // A mask without head dims broadcasts over both as it is.
            Some((_, mt)) if mt.rank() < 3 => mask,
            Some((m, mt)) => {
                let mh = mt.rank() - 3;
                let shape = match mt.shape[mh].as_const() {
                    Some(1) => {
                        let mut s = mt.shape.clone();
                        s.insert(mh, Dim::Const(1));
                        s
                    }
                    Some(x) if x == hkv * rep => split(&mt.shape, mh),
                    _ => return Ok(Rewrite::Keep),
                };
                Some(g.push(Op::Reshape { shape: shape.clone() }, vec![m], TensorType::new(mt.dtype, shape), loc))
            }
        };
        let q_shape = split(&qt.shape, h);
        let q5 = g.push(Op::Reshape { shape: q_shape.clone() }, vec![q], TensorType::new(qt.dtype, q_shape), loc);
        let mut inputs = vec![q5, k5, v5];
        inputs.extend(mask5);
        let attn_ty = TensorType::new(out_ty.dtype, split(&out_ty.shape, h));
        match Builder::new(g, loc).infer(&op, &inputs) {
            Ok(ty) if ty == attn_ty => {}
            _ => return Ok(Rewrite::Keep),
        }
        let out = g.push(op, inputs, attn_ty, loc);
        Ok(Rewrite::Replace(vec![g.push(Op::Reshape { shape: out_ty.shape.clone() }, vec![out], out_ty, loc)]))
    })
}

/// `(x, Hkv, R)` when `k` `[.., Hkv·R, S, E]` is `reshape(expand(x))` of an
/// `x` `[.., Hkv, 1, S, E]` expanded to `[.., Hkv, R, S, E]` (R > 1).
fn repeated_heads(g: &Graph, k: ValueId) -> Option<(ValueId, i64, i64)> {
    let rank = g.ty(k).rank();
    let producer = |v: ValueId| g.producer(v).map(|n| &g.nodes[n]);
    let (Op::Reshape { .. }, [e]) = producer(k).map(|n| (&n.op, &n.inputs[..]))? else { return None };
    let (Op::Expand { .. }, [x]) = producer(*e).map(|n| (&n.op, &n.inputs[..]))? else { return None };
    let (tx, te, tk) = (g.ty(*x), g.ty(*e), g.ty(k));
    if rank < 3 || tx.rank() != rank + 1 || te.rank() != rank + 1 {
        return None;
    }
    let h = rank - 3;
    let (hkv, rep) = (tx.shape[h].as_const()?, te.shape[h + 1].as_const()?);
    let fits = tx.shape[..=h] == te.shape[..=h]
        && tx.shape[h + 2..] == te.shape[h + 2..]
        && tx.shape[h + 1].as_const() == Some(1)
        && tk.shape[..h] == tx.shape[..h]
        && tk.shape[h + 1..] == tx.shape[h + 2..]
        && tk.shape[h].as_const() == Some(hkv * rep);
    (fits && rep > 1).then_some((*x, hkv, rep))
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
    /// The softmax's batch dims when the matmuls are `bmm`s over them merged
    /// (`[1, H, L, S]` viewed as `[H, L, S]`): the attention runs in these.
    batch: Option<Vec<Dim>>,
}

fn single_use(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId) -> Option<NodeId> {
    used_only_by(g, uses, v, 1)
}

/// The value of a one-element float constant.
fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    let c = HostTensor::from_const(g, v)?;
    (c.numel() == 1 && c.dtype.is_float()).then(|| c.data[0])
}

/// `x · c`, `c · x` or `x / c` with a scalar `c` and `v` used once: `(x, factor)`.
fn peel_scale(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId) -> (ValueId, f64) {
    peel_scale_used(g, uses, v, 1)
}

/// [`peel_scale`] of a `v` with `n` uses inside the pattern.
fn peel_scale_used(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId, n: u32) -> (ValueId, f64) {
    let Some(n) = used_only_by(g, uses, v, n) else { return (v, 1.0) };
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
    // `bmm`: the probabilities are the 4-D softmax's reshape.
    let (probs, batch) = match batch_reshape_input(g, uses, *probs) {
        Some(p) => (p, Some(g.ty(p).shape[..g.ty(p).rank() - 2].to_vec())),
        None => (*probs, None),
    };
    let (masked, masked_uses, guarded) = softmax_input(g, uses, probs)?;
    // Optional additive mask (either operand order), then the score scale;
    // each value keeps the use count the pattern expects of it.
    let (scaled, scaled_uses, mask) = match used_only_by(g, uses, masked, masked_uses).map(|p| &g.nodes[p]) {
        Some(add) if add.op == Op::Binary(BinaryOp::Add) => {
            let (a, b) = (add.inputs[0], add.inputs[1]);
            let scores_like = |x: ValueId| g.ty(x) == g.ty(masked);
            match (scores_like(a), scores_like(b)) {
                (true, _) if g.ty(b).dtype == dtype => (a, 1, Some(b)),
                (_, true) if g.ty(a).dtype == dtype => (b, 1, Some(a)),
                _ => return None,
            }
        }
        _ => (masked, masked_uses, None),
    };
    if mask.is_some() && !guarded {
        return None;
    }
    let (scores, c_scores) = peel_scale_used(g, uses, scaled, scaled_uses);
    let scores_uses = if scores == scaled { scaled_uses } else { 1 };
    let mm = match batch {
        None => used_only_by(g, uses, scores, scores_uses)?,
        // The scores are the `bmm`'s result viewed in the softmax's batch
        // dims (read twice, by the softmax and its guard, when nothing comes
        // between the view and a safe softmax: torchvision's ViT).
        Some(_) => single_use(g, uses, batch_reshape_input_used(g, uses, scores, scores_uses)?)?,
    };
    let (Op::MatMul, [q, kt]) = (&g.nodes[mm].op, &g.nodes[mm].inputs[..]) else { return None };
    if g.ty(*q).rank() < 2 || g.ty(*kt).rank() < 2 {
        return None;
    }
    // Merged batch dims are only re-split when q, kᵀ, v and the
    // probabilities all have the matmul's batch, none broadcast.
    let mm_ty = g.ty(g.nodes[mm].outputs[0]);
    let full_batch = |x: ValueId| {
        g.ty(x).rank() == mm_ty.rank() && g.ty(x).shape[..mm_ty.rank() - 2] == mm_ty.shape[..mm_ty.rank() - 2]
    };
    if batch.is_some() && ![*q, *kt, *v, node.inputs[0]].into_iter().all(full_batch) {
        return None;
    }
    // Core ATen's SDPA scales q and kᵀ (or k) by √scale each (before the
    // reshape that merges the batch dims, for `bmm`).
    let unbatch = |x: ValueId| if batch.is_some() { batch_reshape_input(g, uses, x).unwrap_or(x) } else { x };
    let (q, c_q) = peel_scale(g, uses, unbatch(*q));
    let (kt, c_kt) = peel_scale(g, uses, unbatch(*kt));
    let v = unbatch(*v);
    let k = match single_use(g, uses, kt).map(|p| &g.nodes[p]) {
        Some(p) if is_last_two_swap(&p.op, g.ty(kt).rank()) => {
            let (k, c_k) = peel_scale(g, uses, p.inputs[0]);
            let scale = c_scores * c_q * c_kt * c_k;
            return Some(Attention { q, k: Key::Plain(k), v, mask, scale, batch });
        }
        _ => Key::Transposed(kt),
    };
    Some(Attention { q, k, v, mask, scale: c_scores * c_q * c_kt, batch })
}

/// `x` of a single-use `reshape(x)` that only merges or splits batch dims
/// (the last two dims kept).
fn batch_reshape_input(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId) -> Option<ValueId> {
    batch_reshape_input_used(g, uses, v, 1)
}

/// [`batch_reshape_input`] of a `v` with `n` uses inside the pattern.
fn batch_reshape_input_used(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId, n: u32) -> Option<ValueId> {
    let node = &g.nodes[used_only_by(g, uses, v, n)?];
    let (Op::Reshape { .. }, [x]) = (&node.op, &node.inputs[..]) else { return None };
    let (tx, tv) = (g.ty(*x), g.ty(v));
    let (rx, rv) = (tx.rank(), tv.rank());
    (rx >= 2 && rv >= 2 && tx.shape[rx - 2..] == tv.shape[rv - 2..]).then_some(*x)
}

/// The scores a softmax over the last axis normalises into `probs`, how
/// many uses they have inside the pattern, and whether the softmax is
/// guarded: `softmax(x)` (x used once, unguarded), or
/// torch's `_safe_softmax` (Core ATen's SDPA since torch 2.5, and kiln's own
/// decomposition): `where(not(any(not(x == -inf), -1)), 0, softmax(x))`, x
/// used by the softmax and the guard. The attention kernel gives a
/// fully-masked row zeros, as the guard does.
fn softmax_input(g: &Graph, uses: &SecondaryMap<ValueId, u32>, probs: ValueId) -> Option<(ValueId, u32, bool)> {
    let rank = g.ty(probs).rank();
    let node = &g.nodes[single_use(g, uses, probs)?];
    let softmax_of = |v: ValueId| -> Option<ValueId> {
        let sm = &g.nodes[single_use(g, uses, v)?];
        match (&sm.op, &sm.inputs[..]) {
            (Op::Softmax { axis }, [x]) if *axis + 1 == rank && rank >= 2 => Some(*x),
            _ => None,
        }
    };
    match (&node.op, &node.inputs[..]) {
        (Op::Softmax { .. }, _) => softmax_of(probs).map(|x| (x, 1, false)),
        (Op::Where, [cond, zero, sm]) if is_zero(g, *zero) && g.ty(*sm) == g.ty(probs) => {
            let x = softmax_of(*sm)?;
            (guard_input(g, uses, *cond, rank)? == x).then_some((x, 2, true))
        }
        _ => None,
    }
}

/// `x` of the guard `not(any(not(x == -inf), axis = rank - 1, keepdim))`,
/// every step used once.
fn guard_input(g: &Graph, uses: &SecondaryMap<ValueId, u32>, cond: ValueId, rank: usize) -> Option<ValueId> {
    let step = |v: ValueId| single_use(g, uses, v).map(|n| &g.nodes[n]);
    let not_input = |v: ValueId| match step(v) {
        Some(n) if n.op == Op::Unary(UnaryOp::Not) => Some(n.inputs[0]),
        _ => None,
    };
    let any_kept = not_input(cond)?;
    let kept = match step(any_kept) {
        Some(n) if n.op == (Op::Reduce { kind: ReduceKind::Max, axes: vec![rank - 1], keep_dims: true }) => n.inputs[0],
        _ => return None,
    };
    let is_masked = not_input(kept)?;
    let eq = step(is_masked)?;
    match (&eq.op, &eq.inputs[..]) {
        (Op::Binary(BinaryOp::Eq), [x, c]) if scalar(g, *c) == Some(f64::NEG_INFINITY) => Some(*x),
        _ => None,
    }
}

/// A constant (or `full`) whose every element is zero.
fn is_zero(g: &Graph, v: ValueId) -> bool {
    if let Some(c) = HostTensor::from_const(g, v) {
        return c.data.iter().all(|&x| x == 0.0);
    }
    matches!(g.producer(v).map(|n| &g.nodes[n].op), Some(Op::Full { value, .. }) if *value == 0.0)
}

/// The node producing `v` when `v` has exactly `n` uses and is no output.
fn used_only_by(g: &Graph, uses: &SecondaryMap<ValueId, u32>, v: ValueId, n: u32) -> Option<NodeId> {
    (uses[v] == n && !g.outputs.contains(&v)).then(|| g.producer(v)).flatten()
}

fn is_last_two_swap(op: &Op, rank: usize) -> bool {
    let Op::Permute { perm } = op else { return false };
    rank >= 2
        && perm.len() == rank
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| p == i)
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
}
