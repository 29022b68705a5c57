//! Horizontal fusion: linear layers that read the same input become one
//! `Op::LinearSplit`, one GEMM over their weights concatenated along N
//! (at compile time: the runtime packs the one weight once, as any
//! linear's), whose results are the layers' column ranges, each written
//! straight into its own tensor (no copies). The input is read by one GEMM
//! instead of two or three, and there is one parallel region where there
//! were several, with more columns to share among the threads: attention's
//! q/k/v projections, an MLP's gate and up.
//!
//! Members: f32 `linear`s (bias a constant), `linear_fused`s without a
//! residual (bias a constant), and matmuls of a matrix (or batch of rows)
//! by a constant `[K, N]` weight (transposed to `[N, K]` here, as the
//! epilogue pass does), all with constant weights. Layers fuse when they
//! read the same value (or views of one value with one type: Core ATen's
//! per-projection `view`s) and agree on the epilogue: all or none have a bias,
//! and the same activation (or none) — per-range epilogues would need a
//! new instruction; with one, each column gets exactly what its own
//! layer's store step computed. Run after `fuse_epilogue`, so the
//! activations that follow a layer are already in its epilogue: a gate
//! projection with SiLU and an up projection without do not fuse.
//!
//! Every range but the last is a multiple of [`SPLIT_ALIGN`] columns wide:
//! each then starts on a packed strip of every kernel table, and the GEMM
//! computes each element with the same operations, in the same order, as
//! the layer's own GEMM did (results bit-identical to the unfused program).
//! At most `LINEAR_SPLIT_MAX` layers per group. The fused node takes the
//! first member's place in the schedule (all it reads is defined by then).
//! CPU target only.

use crate::host::{static_shape, HostTensor};
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{Activation, DType, Epilogue, Graph, NodeId, Op, Residual, ValueId};
use std::collections::HashMap;

/// Columns every range but a group's last is a multiple of: the widest
/// packed strip (NR) of the CPU kernel tables (AVX-512's 32), so that a
/// range starts on a strip whichever table runs.
pub const SPLIT_ALIGN: usize = 32;

/// The most layers one fused node takes (the instruction's output limit).
const MAX_MEMBERS: usize = kiln_ir::LINEAR_SPLIT_MAX as usize;

pub fn fuse_shared_input(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse_shared_input")?;
    let groups = find_groups(g);
    if groups.is_empty() {
        return Ok(Changed::No);
    }
    // Each member's group and place in it.
    let mut place: HashMap<NodeId, (usize, usize)> = HashMap::new();
    for (gi, group) in groups.iter().enumerate() {
        for (i, m) in group.members.iter().enumerate() {
            place.insert(m.node, (gi, i));
        }
    }
    let mut fused: Vec<Option<Vec<ValueId>>> = vec![None; groups.len()];
    rewrite_in_order(g, |g, n| {
        let Some(&(gi, i)) = place.get(&n) else { return Ok(Rewrite::Keep) };
        // The group's first member in schedule order pushes the fused node.
        let outputs =
            match &mut fused[gi] {
                Some(outputs) => outputs,
                slot => slot.insert(push_split(g, &groups[gi]).ok_or_else(|| {
                    PassError::new("fuse_shared_input", format!("cannot fuse {}", g.describe_node(n)))
                })?),
            };
        Ok(Rewrite::Replace(vec![outputs[i]]))
    })
}

/// One layer of a group.
struct Member {
    node: NodeId,
    /// What it reads (a reshape of the key's value, or that value).
    x: ValueId,
    /// Its weight `[N, K]` value, transposed from a matmul's `[K, N]`.
    weight: ValueId,
    transposed: bool,
    bias: Option<ValueId>,
    n: usize,
}

/// What layers must share to fuse.
#[derive(Copy, Clone, PartialEq)]
struct Key {
    x: ValueId,
    k: usize,
    bias: bool,
    activation: Option<Activation>,
}

struct Group {
    key: Key,
    /// In schedule order, except that the one range that is not a
    /// multiple of [`SPLIT_ALIGN`] (if any) is last.
    members: Vec<Member>,
}

/// The layer `n` is, if it can be a member.
fn member(g: &Graph, n: NodeId) -> Option<(Key, Member)> {
    let node = &g.nodes[n];
    let [out] = node.outputs[..] else { return None };
    if g.ty(out).dtype != DType::F32 {
        return None;
    }
    let x = *node.inputs.first()?;
    let constant = |v: ValueId| {
        let ty = g.ty(v);
        g.const_of(v).and(static_shape(ty)).filter(|_| ty.dtype == DType::F32)
    };
    let (activation, has_bias, transposed) = match &node.op {
        Op::Linear => (None, node.inputs.len() == 3, false),
        Op::LinearFused { epilogue } if epilogue.residual == Residual::None => {
            (epilogue.activation, epilogue.bias, false)
        }
        Op::MatMul if g.ty(x).rank() >= 2 => (None, false, true),
        _ => return None,
    };
    let w = *node.inputs.get(1)?;
    let (n_cols, k) = match (constant(w)?.as_slice(), transposed) {
        (&[k, n], true) => (n, k),
        (&[n, k], false) => (n, k),
        _ => return None,
    };
    let bias = if has_bias {
        let b = *node.inputs.get(2)?;
        (constant(b)? == [n_cols]).then_some(b)?;
        Some(b)
    } else {
        None
    };
    let key = Key { x: source(g, x), k, bias: has_bias, activation };
    Some((key, Member { node: n, x, weight: w, transposed, bias, n: n_cols }))
}

/// The value `v` reshapes (through any chain of reshapes), or `v`: Core
/// ATen gives each projection its own view of the input; views of one
/// value with one type hold the same data, and the first one serves all.
fn source(g: &Graph, mut v: ValueId) -> ValueId {
    while let Some(p) = g.producer(v).filter(|&p| matches!(g.nodes[p].op, Op::Reshape { .. })) {
        v = g.nodes[p].inputs[0];
    }
    v
}

fn find_groups(g: &Graph) -> Vec<Group> {
    let mut candidates: Vec<Group> = Vec::new();
    for &n in &g.order {
        let Some((key, m)) = member(g, n) else { continue };
        let same = |c: &&mut Group| c.key == key && g.ty(c.members[0].x) == g.ty(m.x);
        match candidates.iter_mut().find(same) {
            Some(c) => c.members.push(m),
            None => candidates.push(Group { key, members: vec![m] }),
        }
    }
    let mut groups = Vec::new();
    for c in candidates {
        // The aligned layers in schedule order, then one that is not.
        let (mut aligned, rest): (Vec<Member>, Vec<Member>) =
            c.members.into_iter().partition(|m| m.n % SPLIT_ALIGN == 0);
        let mut tail = rest.into_iter().next();
        while !aligned.is_empty() {
            let take = aligned.len().min(MAX_MEMBERS - usize::from(tail.is_some()));
            let mut members: Vec<Member> = aligned.drain(..take).collect();
            members.extend(if aligned.is_empty() { tail.take() } else { None });
            if members.len() >= 2 {
                groups.push(Group { key: c.key, members });
            }
        }
    }
    groups
}

/// Pushes the group's `linear_split` node; returns its outputs, one per
/// member, in the members' order.
fn push_split(g: &mut Graph, group: &Group) -> Option<Vec<ValueId>> {
    let k = group.key.k;
    let mut weight = Vec::new();
    let mut bias = Vec::new();
    let mut names = Vec::new();
    for m in &group.members {
        let w = HostTensor::from_const(g, m.weight)?;
        if m.transposed {
            weight.extend((0..m.n * k).map(|i| w.data[(i % k) * m.n + i / k]));
        } else {
            weight.extend_from_slice(&w.data);
        }
        if let Some(b) = m.bias {
            bias.extend(HostTensor::from_const(g, b)?.data);
        }
        names.extend(g.values[m.weight].name.clone());
    }
    let total: usize = group.members.iter().map(|m| m.n).sum();
    // Named after the layers' weights, when they all have names.
    let name = (names.len() == group.members.len()).then(|| names.join("+"));
    let w = HostTensor::new(DType::F32, vec![total, k], weight).add_to(g, name);
    let first = &g.nodes[group.members[0].node];
    let (x, loc) = (first.inputs[0], first.loc);
    let mut inputs = vec![x, w];
    if group.key.bias {
        inputs.push(HostTensor::new(DType::F32, vec![total], bias).add_to(g, None));
    }
    let types = group.members.iter().map(|m| g.ty(g.nodes[m.node].outputs[0]).clone()).collect();
    let epilogue = Epilogue { bias: group.key.bias, activation: group.key.activation, residual: Residual::None };
    let columns = group.members.iter().map(|m| m.n as i64).collect();
    let node = g.add_node(Op::LinearSplit { epilogue, columns }, inputs, types, loc);
    Some(g.nodes[node].outputs.clone())
}
