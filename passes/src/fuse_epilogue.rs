//! Epilogue fusion: a convolution or linear followed by an activation and a
//! residual add becomes one `Op::ConvFused` / `Op::LinearFused` (a
//! quantized convolution: one `Op::QuantConv` with that epilogue), whose
//! kernel applies them in the GEMM's store step (or in the depthwise rows
//! before their store, or to each finished row of the channels-first
//! depthwise loops) while the output tile is hot — one pass over the
//! activation instead of three.
//!
//! From each f32 `conv` / `linear` (its bias is already an operand; BatchNorm
//! and constant adds were folded into it by `fuse`), the chain grows
//! forward through values with exactly one use that are no graph output:
//! - an activation (`relu`, `sigmoid`, `silu`, `gelu`, `gelu_tanh`, `clamp`
//!   — ReLU6 — or `mul(x, sigmoid(x))`, SiLU as Core ATen decomposes it:
//!   then `x` has those two readers and the epilogue's `mul_sigmoid`
//!   rounds as they do; or hardswish's `add(x, 3)`, `clamp` to [0, 6]
//!   (one clamp or two), `mul(x, ·)` and `div(·, 6)`, which the epilogue's
//!   `hardswish` computes with the same exact operations; or GPT-2's
//!   `gelu_new`, `mul(mul(x, 0.5), add(tanh(mul(add(x, mul(mul(mul(x, x),
//!   x), 0.044715)), √(2/π))), 1))` — its `pow(x, 3)` as the importer
//!   writes it — which the epilogue's `gelu_tanh_chain` computes step for
//!   step around the same tanh), then optionally an `add` of a residual;
//! - or an `add` of a residual, then optionally an activation (ResNet's
//!   `relu(bn(conv(x)) + identity)`).
//!
//! A residual is the add's other operand when it has exactly the result's
//! type (no broadcast). The fused node takes the last member's place in the
//! schedule, after everything it reads. When two chains want one add (two
//! convolutions summed), the first in schedule order takes it and the other
//! operand is its residual.
//!
//! The fused kernel computes exactly the unfused ops, in the same order
//! (the activation through the same kernel-table function), so results are
//! bit-identical for ReLU, clamp and the residual add; the transcendental
//! activations may differ by the vector math's ulps where the unfused
//! kernel took a scalar tail on other elements. CPU target only.

use crate::host::{static_shape, HostTensor};
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{Activation, BinaryOp, DType, Epilogue, Graph, NodeId, Op, Residual, SecondaryMap, UnaryOp, ValueId};
use std::collections::HashMap;

pub fn fuse_epilogues(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse_epilogue")?;
    let chains = find_chains(g);
    if chains.is_empty() {
        return Ok(Changed::No);
    }
    let mut member: SecondaryMap<NodeId, bool> = SecondaryMap::new();
    let mut by_root = HashMap::new();
    for chain in chains {
        for &n in chain.members.iter().chain([&chain.base]) {
            member[n] = true;
        }
        by_root.insert(*chain.members.last().unwrap_or(&chain.base), chain);
    }
    rewrite_in_order(g, |g, n| {
        if let Some(chain) = by_root.get(&n) {
            // Every member was visited (its operands redirected) before the root.
            let fused = push_fused(g, chain, n).ok_or_else(|| {
                PassError::new("fuse_epilogue", format!("cannot fuse the epilogue of {}", g.describe_node(chain.base)))
            })?;
            return Ok(Rewrite::Replace(vec![fused]));
        }
        // A member's only use is the next member: it goes with its chain.
        Ok(if member[n] { Rewrite::Replace(vec![]) } else { Rewrite::Keep })
    })
}

/// A conv, linear or matmul and what follows it into its epilogue.
struct Chain {
    base: NodeId,
    /// The nodes after `base`, in order; the last is the root.
    members: Vec<NodeId>,
    /// A matmul's bias: the add and which of its operands is the constant.
    bias_add: Option<(NodeId, usize)>,
    activation: Option<Activation>,
    /// The add that brings the residual and which of its operands that is.
    residual: Option<(NodeId, usize)>,
    residual_first: bool,
}

/// The activation `op` is, if it is one the epilogue applies.
fn activation_of(op: &Op) -> Option<Activation> {
    match op {
        Op::Unary(u) => Activation::from_unary(*u),
        Op::Clamp { min, max } => Some(Activation::Clamp { min: *min, max: *max }),
        _ => None,
    }
}

/// Whether `n` starts a chain: an f32 conv or linear, or an f32 matmul of
/// a matrix (or batch of rows) by a constant 2-D weight `[K, N]`, which
/// becomes a linear with the weight transposed at compile time.
fn is_base(g: &Graph, n: NodeId) -> bool {
    let node = &g.nodes[n];
    if node.outputs.len() != 1 || g.ty(node.outputs[0]).dtype != DType::F32 {
        return false;
    }
    match &node.op {
        Op::Conv { .. } | Op::Linear => true,
        // A quantized convolution with nothing fused yet (its bias is in).
        Op::QuantConv { epilogue, .. } => epilogue.activation.is_none() && epilogue.residual == Residual::None,
        Op::MatMul => constant_weight(g, node.inputs[1]).is_some() && g.ty(node.inputs[0]).rank() >= 2,
        _ => false,
    }
}

/// A matmul's constant f32 right operand `[K, N]`, as `(K, N)`.
fn constant_weight(g: &Graph, w: ValueId) -> Option<(usize, usize)> {
    g.const_of(w)?;
    let ty = g.ty(w);
    let shape = static_shape(ty)?;
    match shape[..] {
        [k, n] if ty.dtype == DType::F32 => Some((k, n)),
        _ => None,
    }
}

/// Of an add reading `cur` (a matmul's `[.., N]` result), the operand that
/// is a constant per-column bias (`[N]`, `[1, N]`, ...), if one is.
fn bias_operand(g: &Graph, add: NodeId, cur: ValueId, n: usize) -> Option<usize> {
    let node = &g.nodes[add];
    if node.op != Op::Binary(BinaryOp::Add) || node.inputs[0] == node.inputs[1] {
        return None;
    }
    let other = usize::from(node.inputs[0] == cur);
    let b = node.inputs[other];
    g.const_of(b)?;
    let shape = static_shape(g.ty(b))?;
    let per_column = shape.last() == Some(&n) && shape.iter().rev().skip(1).all(|&d| d == 1);
    let keeps_type = g.ty(b).dtype == DType::F32 && g.ty(node.outputs[0]) == g.ty(cur);
    (per_column && keeps_type && shape.len() <= g.ty(cur).rank()).then_some(other)
}

fn find_chains(g: &Graph) -> Vec<Chain> {
    let uses = g.use_counts();
    // The reader of each value (its only one, where the value has one use).
    let mut reader: HashMap<ValueId, NodeId> = HashMap::new();
    // Every reader of each value, in schedule order (a node once per operand).
    let mut readers: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
    for &n in &g.order {
        for &v in &g.nodes[n].inputs {
            reader.insert(v, n);
            readers.entry(v).or_default().push(n);
        }
    }
    let mut taken: SecondaryMap<NodeId, bool> = SecondaryMap::new();
    let mut chains = Vec::new();
    for &base in &g.order {
        if taken[base] || !is_base(g, base) {
            continue;
        }
        // The next node of the chain: the only reader of `v`, when `v` has
        // one use, is no output, and the reader is in no other chain.
        let next = |v: ValueId, taken: &SecondaryMap<NodeId, bool>| {
            let single = uses[v] == 1 && !g.outputs.contains(&v);
            reader.get(&v).copied().filter(|&r| single && !taken[r] && g.nodes[r].outputs.len() == 1)
        };
        let base_node = &g.nodes[base];
        let mut chain =
            Chain { base, members: vec![], bias_add: None, activation: None, residual: None, residual_first: false };
        let mut cur = base_node.outputs[0];
        // A matmul's bias add comes first (a matmul with nothing to fuse
        // stays a matmul: the linear would gain nothing).
        if base_node.op == Op::MatMul {
            let Some((_, n)) = constant_weight(g, base_node.inputs[1]) else { continue };
            let bias = next(cur, &taken).and_then(|add| Some((add, bias_operand(g, add, cur, n)?)));
            if let Some((add, other)) = bias {
                chain.bias_add = Some((add, other));
                chain.members.push(add);
                cur = g.nodes[add].outputs[0];
            }
        }
        // The residual add of `n` to `cur`: its other operand, when that has
        // `cur`'s type (no broadcast).
        let residual_of = |n: NodeId, cur: ValueId| {
            let node = &g.nodes[n];
            if node.op != Op::Binary(BinaryOp::Add) || node.inputs[0] == node.inputs[1] {
                return None;
            }
            let other = usize::from(node.inputs[0] == cur);
            let ty = g.ty(cur);
            (g.ty(node.inputs[other]) == ty && g.ty(node.outputs[0]) == ty).then_some(other)
        };
        // Reshapes (which move no data) may sit between the steps: Core
        // ATen's linear on a batch of sequences is view → addmm → view.
        let mut steps = 0;
        while steps < 2 {
            // SiLU or hardswish as Core ATen decomposes them, or GPT-2's
            // `gelu_new`: `cur` read by the chain's steps, and by nothing else.
            if chain.activation.is_none() {
                let decomposed = mul_sigmoid(g, cur, &uses, &readers, &taken)
                    .map(|(sigmoid, mul)| (Activation::MulSigmoid, vec![sigmoid, mul]))
                    .or_else(|| Some((Activation::Hardswish, hardswish(g, cur, &uses, &readers, &taken)?)))
                    .or_else(|| Some((Activation::GeluTanhChain, gelu_tanh_chain(g, cur, &uses, &readers, &taken)?)));
                if let Some((activation, nodes)) = decomposed {
                    chain.activation = Some(activation);
                    chain.residual_first = chain.residual.is_some();
                    cur = g.nodes[*nodes.last().unwrap_or(&base)].outputs[0];
                    chain.members.extend(nodes);
                    steps += 1;
                    if chain.residual_first {
                        break;
                    }
                    continue;
                }
            }
            let Some(n) = next(cur, &taken) else { break };
            let node = &g.nodes[n];
            let same_type = g.ty(node.outputs[0]) == g.ty(cur);
            if matches!(node.op, Op::Reshape { .. }) {
                chain.members.push(n);
                cur = node.outputs[0];
                continue;
            }
            match (activation_of(&node.op), residual_of(n, cur)) {
                (Some(a), _) if chain.activation.is_none() && same_type => {
                    chain.activation = Some(a);
                    chain.residual_first = chain.residual.is_some();
                }
                (_, Some(other)) if chain.residual.is_none() => chain.residual = Some((n, other)),
                _ => break,
            }
            chain.members.push(n);
            cur = node.outputs[0];
            steps += 1;
            // An activation after the residual ends the epilogue.
            if chain.residual_first {
                break;
            }
        }
        // Trailing reshapes stay outside (nothing fused after them).
        while chain.members.last().is_some_and(|&n| matches!(g.nodes[n].op, Op::Reshape { .. })) {
            chain.members.pop();
        }
        let fused_something = chain.activation.is_some() || chain.residual.is_some() || chain.bias_add.is_some();
        if !fused_something {
            continue;
        }
        taken[base] = true;
        for &n in &chain.members {
            taken[n] = true;
        }
        chains.push(chain);
    }
    chains
}

/// The `sigmoid(cur)` and `mul(cur, sigmoid(cur))` (either operand order)
/// nodes when they are `cur`'s only readers, `cur` is no graph output, the
/// sigmoid's result is read by the product only and the product keeps
/// `cur`'s type: SiLU as Core ATen decomposes it, which the epilogue's
/// `mul_sigmoid` computes with the same roundings.
fn mul_sigmoid(
    g: &Graph,
    cur: ValueId,
    uses: &SecondaryMap<ValueId, u32>,
    readers: &HashMap<ValueId, Vec<NodeId>>,
    taken: &SecondaryMap<NodeId, bool>,
) -> Option<(NodeId, NodeId)> {
    let &[a, b] = readers.get(&cur)?.as_slice() else { return None };
    if uses[cur] != 2 || g.outputs.contains(&cur) || a == b {
        return None;
    }
    let is_sigmoid = |n: NodeId| g.nodes[n].op == Op::Unary(UnaryOp::Sigmoid) && g.nodes[n].outputs.len() == 1;
    let (sigmoid, mul) = if is_sigmoid(a) { (a, b) } else { (b, a) };
    let s = g.nodes[sigmoid].outputs[0];
    let mul_node = &g.nodes[mul];
    let reads_both = mul_node.inputs == [cur, s] || mul_node.inputs == [s, cur];
    let fits = is_sigmoid(sigmoid)
        && mul_node.op == Op::Binary(BinaryOp::Mul)
        && reads_both
        && mul_node.outputs.len() == 1
        && uses[s] == 1
        && !g.outputs.contains(&s)
        && g.ty(s) == g.ty(cur)
        && g.ty(mul_node.outputs[0]) == g.ty(cur)
        && !taken[sigmoid]
        && !taken[mul];
    fits.then_some((sigmoid, mul))
}

/// `add(cur, 3)`, `clamp(·, 0, 6)` (or Core ATen's `clamp(·, 0)` then
/// `clamp(·, None, 6)`), `mul(cur, ·)` (either order) and `div(·, 6)`, in
/// that order, when the add and the product are `cur`'s only readers, each
/// later value is read by the next step only, is no graph output and has
/// `cur`'s type, and the constants are f32 scalars: hardswish, which the
/// epilogue's `hardswish` computes with the same exact operations.
fn hardswish(
    g: &Graph,
    cur: ValueId,
    uses: &SecondaryMap<ValueId, u32>,
    readers: &HashMap<ValueId, Vec<NodeId>>,
    taken: &SecondaryMap<NodeId, bool>,
) -> Option<Vec<NodeId>> {
    let &[a, b] = readers.get(&cur)?.as_slice() else { return None };
    if uses[cur] != 2 || g.outputs.contains(&cur) || a == b {
        return None;
    }
    let ty = g.ty(cur);
    // The node's other operand (of two) when it is a scalar f32 constant `value`.
    let by_scalar = |n: NodeId, op: BinaryOp, x: ValueId, value: f64| {
        let node = &g.nodes[n];
        let (&[p, q], &[out]) = (node.inputs.as_slice(), node.outputs.as_slice()) else { return false };
        let k = match (p == x, q == x) {
            (true, false) => q,
            (false, true) if op != BinaryOp::Div => p,
            _ => return false,
        };
        let scalar = HostTensor::from_const(g, k).is_some_and(|t| t.numel() == 1 && t.data[0] == value);
        node.op == Op::Binary(op) && scalar && g.ty(k).dtype == DType::F32 && g.ty(out) == ty
    };
    // The only reader of `v` (a value of one use, no output) that is no other chain's.
    let sole_reader = |v: ValueId| {
        let r = match readers.get(&v)?.as_slice() {
            &[r] if uses[v] == 1 && !g.outputs.contains(&v) && !taken[r] => r,
            _ => return None,
        };
        (g.nodes[r].outputs.len() == 1).then_some(r)
    };
    let (add, mul) = if by_scalar(a, BinaryOp::Add, cur, 3.0) { (a, b) } else { (b, a) };
    if !by_scalar(add, BinaryOp::Add, cur, 3.0) || taken[add] || taken[mul] {
        return None;
    }
    let mut nodes = vec![add];
    let (mut lo, mut hi) = (None, None);
    let mut v = g.nodes[add].outputs[0];
    while let Some(n) = sole_reader(v).filter(|&n| n != mul) {
        let Op::Clamp { min, max } = g.nodes[n].op else { return None };
        // A bound set twice, or one of another value, is some other function.
        for (bound, new, want) in [(&mut lo, min, 0.0), (&mut hi, max, 6.0)] {
            match (new, bound.is_some()) {
                (None, _) => {}
                (Some(b), false) if b == want => *bound = Some(b),
                _ => return None,
            }
        }
        if g.ty(g.nodes[n].outputs[0]) != ty || nodes.len() > 2 {
            return None;
        }
        nodes.push(n);
        v = g.nodes[n].outputs[0];
    }
    let clamped = lo.is_some() && hi.is_some();
    let mul_node = &g.nodes[mul];
    let reads_both = mul_node.inputs == [cur, v] || mul_node.inputs == [v, cur];
    let product_ok = clamped
        && sole_reader(v) == Some(mul)
        && mul_node.op == Op::Binary(BinaryOp::Mul)
        && reads_both
        && mul_node.outputs.len() == 1
        && g.ty(mul_node.outputs[0]) == ty;
    if !product_ok {
        return None;
    }
    nodes.push(mul);
    let product = mul_node.outputs[0];
    let div = sole_reader(product)?;
    by_scalar(div, BinaryOp::Div, product, 6.0).then(|| {
        nodes.push(div);
        nodes
    })
}

/// The nodes of GPT-2's `gelu_new` on `cur`, the last product last:
/// `mul(cur, 0.5)` (the half), `mul(cur, cur)` then `mul(·, cur)` (the
/// cube: the importer's `pow(x, 3)`), `mul(·, 0.044715)`, `add(cur, ·)`,
/// `mul(·, √(2/π))`, `tanh`, `add(·, 1)` and `mul(half, ·)`, when those are
/// `cur`'s only readers, each later value is read by the next step only, is
/// no graph output and has `cur`'s type, and the constants are f32 scalars
/// equal to [`kiln_ir::gelu_tanh_chain`]'s. Operands of a product or sum may
/// come in either order (the same result), except the last product's: with
/// NaN on both sides the first one's is kept, and the epilogue computes
/// `half · (1 + t)`. Any other association (`0.044715·x·x·x`, `x·(1 +
/// 0.044715·x²)`) rounds differently and is not this chain.
fn gelu_tanh_chain(
    g: &Graph,
    cur: ValueId,
    uses: &SecondaryMap<ValueId, u32>,
    readers: &HashMap<ValueId, Vec<NodeId>>,
    taken: &SecondaryMap<NodeId, bool>,
) -> Option<Vec<NodeId>> {
    use kiln_ir::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
    let ty = g.ty(cur);
    if uses[cur] != 5 || g.outputs.contains(&cur) || ty.dtype != DType::F32 {
        return None;
    }
    // A node of `op` with one output of `cur`'s type and no other chain's.
    let is = |n: NodeId, op: Op| {
        let node = &g.nodes[n];
        node.op == op && !taken[n] && matches!(node.outputs.as_slice(), [out] if g.ty(*out) == ty)
    };
    let binary = |n: NodeId, op: BinaryOp| is(n, Op::Binary(op)).then(|| (g.nodes[n].inputs[0], g.nodes[n].inputs[1]));
    let is_scalar = |k: ValueId, value: f32| {
        g.ty(k).dtype == DType::F32
            && HostTensor::from_const(g, k).is_some_and(|t| t.numel() == 1 && t.data[0] == f64::from(value))
    };
    // `op(v, scalar)` in either order.
    let by_scalar = |n: NodeId, op: BinaryOp, v: ValueId, value: f32| {
        binary(n, op).is_some_and(|(p, q)| (p == v && is_scalar(q, value)) || (q == v && is_scalar(p, value)))
    };
    // `op(a, b)` in either order.
    let of_pair = |n: NodeId, op: BinaryOp, a: ValueId, b: ValueId| {
        binary(n, op).is_some_and(|(p, q)| (p, q) == (a, b) || (p, q) == (b, a))
    };
    // The only reader of `v` (a value of one use, no output).
    let sole_reader = |v: ValueId| match readers.get(&v)?.as_slice() {
        &[r] if uses[v] == 1 && !g.outputs.contains(&v) => Some(r),
        _ => None,
    };
    let out = |n: NodeId| g.nodes[n].outputs[0];

    // `cur`'s readers (five uses, so each once but the square's two): the
    // half, the square, the cube and the sum.
    let mut cur_readers = readers.get(&cur)?.clone();
    cur_readers.sort();
    cur_readers.dedup();
    let half = cur_readers.iter().copied().find(|&n| by_scalar(n, BinaryOp::Mul, cur, HALF))?;
    let square = cur_readers.iter().copied().find(|&n| binary(n, BinaryOp::Mul) == Some((cur, cur)))?;
    let cube = sole_reader(out(square)).filter(|&n| of_pair(n, BinaryOp::Mul, out(square), cur))?;
    let sum = cur_readers.iter().copied().find(|&n| binary(n, BinaryOp::Add).is_some())?;
    if cur_readers.len() != 4 || !cur_readers.contains(&cube) {
        return None;
    }
    let scaled = sole_reader(out(cube)).filter(|&n| by_scalar(n, BinaryOp::Mul, out(cube), CUBIC))?;
    if sole_reader(out(scaled)) != Some(sum) || !of_pair(sum, BinaryOp::Add, cur, out(scaled)) {
        return None;
    }
    let arg = sole_reader(out(sum)).filter(|&n| by_scalar(n, BinaryOp::Mul, out(sum), SQRT_2_OVER_PI))?;
    let tanh = sole_reader(out(arg)).filter(|&n| is(n, Op::Unary(UnaryOp::Tanh)))?;
    let one_plus = sole_reader(out(tanh)).filter(|&n| by_scalar(n, BinaryOp::Add, out(tanh), ONE))?;
    let product =
        sole_reader(out(one_plus)).filter(|&n| binary(n, BinaryOp::Mul) == Some((out(half), out(one_plus))))?;
    (sole_reader(out(half)) == Some(product))
        .then(|| vec![half, square, cube, scaled, sum, arg, tanh, one_plus, product])
}

/// Pushes the fused node (and the reshapes around it) for `chain`; returns
/// the value that replaces the root's result. `(x, w [, bias] [, residual])`:
/// a matmul's weight transposed to the linear's `[N, K]` and its bias as
/// `[N]`, both new constants; a residual of another shape reshaped to the
/// fused result's (reshapes move no data).
fn push_fused(g: &mut Graph, chain: &Chain, root: NodeId) -> Option<ValueId> {
    let base = g.nodes[chain.base].clone();
    let base_ty = g.ty(base.outputs[0]).clone();
    let mut inputs = base.inputs.clone();
    if base.op == Op::MatMul {
        let w = HostTensor::from_const(g, inputs[1])?;
        let &[k, n] = w.shape.as_slice() else { return None };
        let transposed = (0..n * k).map(|i| w.data[(i % k) * n + i / k]).collect();
        // Still the layer's weight: it keeps its name and attributes.
        let (w_name, w_attrs) = (g.values[inputs[1]].name.clone(), g.values[inputs[1]].attrs.clone());
        inputs[1] = HostTensor::new(DType::F32, vec![n, k], transposed).add_to(g, w_name);
        g.values[inputs[1]].attrs = w_attrs;
    }
    if let Some((add, other)) = chain.bias_add {
        let b = HostTensor::from_const(g, g.nodes[add].inputs[other])?;
        inputs.push(HostTensor::new(DType::F32, vec![b.numel()], b.data).add_to(g, None));
    }
    let residual = match chain.residual {
        Some((add, other)) => {
            let mut r = g.nodes[add].inputs[other];
            if g.ty(r) != &base_ty {
                r = g.push(Op::Reshape { shape: base_ty.shape.clone() }, vec![r], base_ty.clone(), base.loc);
            }
            inputs.push(r);
            if chain.residual_first {
                Residual::BeforeActivation
            } else {
                Residual::AfterActivation
            }
        }
        None => Residual::None,
    };
    let epilogue = Epilogue {
        bias: inputs.len() - usize::from(residual != Residual::None) == 3,
        activation: chain.activation,
        residual,
    };
    let op = match &base.op {
        // Its bias flag stays (the operand was the base's).
        Op::QuantConv { epilogue: base_epilogue, .. } => {
            let mut op = base.op.clone();
            if let Op::QuantConv { epilogue: e, .. } = &mut op {
                *e = Epilogue { bias: base_epilogue.bias, ..epilogue };
            }
            op
        }
        Op::Conv { stride, padding, dilation, groups } => Op::ConvFused {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups: *groups,
            epilogue,
            layout: kiln_ir::Layout::ChannelsFirst,
        },
        _ => Op::LinearFused { epilogue },
    };
    let fused = g.push(op, inputs, base_ty.clone(), base.loc);
    let root_ty = g.ty(g.nodes[root].outputs[0]).clone();
    Some(if root_ty == base_ty {
        fused
    } else {
        g.push(Op::Reshape { shape: root_ty.shape.clone() }, vec![fused], root_ty, base.loc)
    })
}
