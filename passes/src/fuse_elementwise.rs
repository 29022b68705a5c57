//! Elementwise fusion: trees of unary, binary, where, cast and clamp ops
//! become one `Op::Fused` node whose program the CPU's fused kernel runs in
//! one pass over memory (`kiln_kernels::fused`).
//!
//! A group grows from its root (the last op of a chain, scanned from the end
//! of the schedule) backwards through operands that
//! - are produced by another elementwise op not yet in a group,
//! - have no other use (nor are a graph output): a value used twice is
//!   computed once, by its own node, and read by both groups, and
//! - have the root's shape, so every op of the program runs at the output's
//!   size once (a smaller intermediate, broadcast later, is an operand
//!   instead: computing it at the output's size would repeat work).
//!
//! Everything else a group reads is an operand, broadcast by the kernel; a
//! one-element constant is inlined as a scalar. A lone op stays as it is, and
//! so does a group too large for one fused program (`MAX_FUSED_OPS` ops,
//! `MAX_FUSED_INPUTS` operands): its earlier ops then group from their own
//! roots.
//! The fused kernel runs the very element functions of the unfused kernels,
//! so results are bit-identical. Runs late (after legalisation) and only for
//! the CPU target, whose kernels have the fused one.

use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::infer::broadcast_shapes;
use kiln_ir::{FusedOp, Graph, NodeId, Op, SecondaryMap, ValueId, MAX_FUSED_INPUTS, MAX_FUSED_OPS};
use std::collections::HashMap;

pub fn fuse_elementwise(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse_elementwise")?;
    let groups = find_groups(g);
    if groups.is_empty() {
        return Ok(Changed::No);
    }
    let mut member: SecondaryMap<NodeId, bool> = SecondaryMap::new();
    for nodes in groups.values() {
        for &n in nodes {
            member[n] = true;
        }
    }
    rewrite_in_order(g, |g, n| {
        if let Some(nodes) = groups.get(&n) {
            // Operands of the members were redirected when they were visited.
            let (op, inputs) = fused_op(g, n, nodes).ok_or_else(|| {
                PassError::new("fuse_elementwise", format!("cannot build the program of {}", g.describe_node(n)))
            })?;
            let (ty, loc) = (g.ty(g.nodes[n].outputs[0]).clone(), g.nodes[n].loc);
            return Ok(Rewrite::Replace(vec![g.push(op, inputs, ty, loc)]));
        }
        // A member's only use is inside its group: it disappears with it.
        Ok(if member[n] { Rewrite::Replace(vec![]) } else { Rewrite::Keep })
    })
}

/// The ops the fused kernel runs.
fn is_elementwise(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } | Op::Clamp { .. })
}

/// Each group's root and its member nodes (root last), for groups of two or more.
fn find_groups(g: &Graph) -> HashMap<NodeId, Vec<NodeId>> {
    let uses = g.use_counts();
    let mut taken: SecondaryMap<NodeId, bool> = SecondaryMap::new();
    let mut pos: SecondaryMap<NodeId, usize> = SecondaryMap::new();
    for (i, &n) in g.order.iter().enumerate() {
        pos[n] = i;
    }
    let mut groups = HashMap::new();
    for &root in g.order.iter().rev() {
        let node = &g.nodes[root];
        if taken[root] || !is_elementwise(&node.op) || node.outputs.len() != 1 {
            continue;
        }
        let shape = &g.ty(node.outputs[0]).shape;
        let mut members = vec![root];
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            for &v in &g.nodes[n].inputs {
                let Some(p) = g.producer(v) else { continue };
                let absorb = !taken[p]
                    && p != root
                    && !members.contains(&p)
                    && is_elementwise(&g.nodes[p].op)
                    && uses[v] == 1
                    && !g.outputs.contains(&v)
                    && &g.ty(v).shape == shape;
                if absorb {
                    members.push(p);
                    stack.push(p);
                }
            }
        }
        members.sort_by_key(|&m| pos[m]);
        if members.len() > 1 && fused_op(g, root, &members).is_some() {
            for &m in &members {
                taken[m] = true;
            }
            groups.insert(root, members);
        }
    }
    groups
}

/// The fused op replacing the group of `root`, and its operands.
fn fused_op(g: &Graph, root: NodeId, members: &[NodeId]) -> Option<(Op, Vec<ValueId>)> {
    let out_shape = &g.ty(g.nodes[root].outputs[0]).shape;
    for inline_scalars in [true, false] {
        let (program, inputs) = program_of(g, root, members, inline_scalars)?;
        if program.len() > MAX_FUSED_OPS || inputs.len() > MAX_FUSED_INPUTS {
            return None;
        }
        // Inlining a scalar must not change the broadcast shape (a `[1, 1]`
        // constant can add a dimension); the kernel broadcasts to the operands'.
        let shape = inputs.iter().try_fold(Vec::new(), |acc, &v| broadcast_shapes(&acc, &g.ty(v).shape)).ok()?;
        // The kernel takes at least one operand (a group of constants only
        // inlines none of them).
        if &shape == out_shape && !inputs.is_empty() {
            return Some((Op::Fused { program }, inputs));
        }
    }
    None
}

/// The program computing `root` from the group's operands (deduplicated, in
/// first-use order), registers numbered inputs first.
fn program_of(
    g: &Graph,
    root: NodeId,
    members: &[NodeId],
    inline_scalars: bool,
) -> Option<(Vec<FusedOp>, Vec<ValueId>)> {
    let in_group = |v: ValueId| g.producer(v).filter(|p| members.contains(p));
    // Operands first: their registers come before every op's.
    let mut inputs: Vec<ValueId> = Vec::new();
    let mut scalars: Vec<(ValueId, FusedOp)> = Vec::new();
    for &n in members {
        for &v in &g.nodes[n].inputs {
            if in_group(v).is_some() || inputs.contains(&v) || scalars.iter().any(|(s, _)| *s == v) {
                continue;
            }
            match scalar_const(g, v).filter(|_| inline_scalars) {
                Some(op) => scalars.push((v, op)),
                None => inputs.push(v),
            }
        }
    }
    let mut reg: HashMap<ValueId, u32> = inputs.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
    let mut program = Vec::new();
    for (v, op) in scalars {
        reg.insert(v, (inputs.len() + program.len()) as u32);
        program.push(op);
    }
    // Members are in schedule order, so operands come before their readers.
    for &n in members {
        let node = &g.nodes[n];
        let r = |i: usize| reg.get(node.inputs.get(i)?).copied();
        let op = match node.op {
            Op::Unary(op) => FusedOp::Unary { op, x: r(0)? },
            Op::Binary(op) => FusedOp::Binary { op, a: r(0)?, b: r(1)? },
            Op::Where => FusedOp::Where { cond: r(0)?, a: r(1)?, b: r(2)? },
            Op::Cast { to } => FusedOp::Cast { to, x: r(0)? },
            Op::Clamp { min, max } => FusedOp::Clamp { min, max, x: r(0)? },
            _ => return None,
        };
        reg.insert(node.outputs[0], (inputs.len() + program.len()) as u32);
        program.push(op);
    }
    debug_assert_eq!(members.last(), Some(&root));
    Some((program, inputs))
}

/// A one-element constant as a scalar op.
fn scalar_const(g: &Graph, v: ValueId) -> Option<FusedOp> {
    let c = g.const_of(v)?;
    let ty = g.ty(v);
    if ty.static_shape()?.iter().any(|&d| d != 1) {
        return None;
    }
    FusedOp::scalar(ty.dtype, c.bytes.as_bytes())
}
