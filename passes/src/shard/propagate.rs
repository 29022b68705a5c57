//! Forward propagation of shardings through the schedule.
//!
//! Each node's rule takes its operands' shardings and gives the sharding each
//! operand must have for the node (`expected`) and the shardings of its
//! results. One operand leads (the first activation; weights follow it):
//! where another operand disagrees with what the rule expects, the use is
//! resharded ([`Reshard`], emitted as a sharding constraint), except that a
//! weight nobody has sharded yet simply takes the expected sharding. Ops
//! without a rule run replicated: their operands are resharded to replicated.
//!
//! Partial sums come from contracting or summing over a split dim; every
//! consumer resolves them (an all-reduce), and so do the graph outputs.

use super::strategy::model_axis;
use super::{ShardOptions, Strategy};
use kiln_ir::{Dim, Graph, Mesh, NodeId, Op, ReduceKind, Sharding, ValueId};

/// Where a resharded value is used.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Use {
    /// Operand `index` of `node`.
    Operand { node: NodeId, index: usize },
    /// Graph output `k`.
    Output(usize),
}

/// The communication a resharding costs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Partial sums added up.
    AllReduce,
    /// Split dims made whole.
    AllGather,
    /// A split moved from one dim to another.
    AllToAll,
    /// Whole dims split: each device keeps its piece, nothing is sent.
    Slice,
    /// Point-to-point sends along an axis (pipeline stages, ring attention;
    /// manual regions only, never a resharding).
    CollectivePermute,
}

impl Collective {
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::AllToAll => "all-to-all",
            Collective::Slice => "slice",
            Collective::CollectivePermute => "collective-permute",
        }
    }
}

/// A use where `value` must change from `from` to `to`.
#[derive(Clone, Debug, PartialEq)]
pub struct Reshard {
    pub at: Use,
    pub value: ValueId,
    pub from: Sharding,
    pub to: Sharding,
    pub collective: Collective,
    /// The whole tensor's bytes (0 for a dynamic shape).
    pub bytes: u64,
}

/// Propagates from the inputs' and weights' shardings through `g.order`,
/// setting every result's sharding; returns the reshardings in schedule
/// order, then those of the graph outputs (partial sums resolved).
pub fn propagate_shardings(g: &mut Graph, opts: &ShardOptions) -> Result<Vec<Reshard>, String> {
    let mesh = g.mesh.clone().ok_or("sharding propagation needs a mesh")?;
    let mut p = Prop { mesh: &mesh, opts, reshards: Vec::new() };
    for k in 0..g.order.len() {
        let n = g.order[k];
        p.node(g, n);
    }
    for k in 0..g.outputs.len() {
        let v = g.outputs[k];
        let from = sharding_of(g, v);
        if !from.partial.is_empty() {
            let to = from.without_partial();
            p.record(g, Use::Output(k), v, from, to);
        }
    }
    Ok(p.reshards)
}

fn sharding_of(g: &Graph, v: ValueId) -> Sharding {
    g.values[v].attrs.sharding.clone().unwrap_or_else(|| Sharding::replicated(g.ty(v).rank()))
}

fn static_dim(g: &Graph, v: ValueId, d: usize) -> Option<i64> {
    g.ty(v).shape.get(d).and_then(Dim::as_const)
}

fn bytes_of(g: &Graph, v: ValueId) -> u64 {
    let ty = g.ty(v);
    ty.static_shape().map_or(0, |s| s.iter().product::<i64>().max(0) as u64 * ty.dtype.size_bytes() as u64)
}

/// `s` with its partial sums resolved.
fn whole(s: &Sharding) -> Sharding {
    s.without_partial()
}

/// `dims` with every axis already in `used` removed, and those it keeps added to `used`.
fn take_unused(dims: &[String], used: &mut Vec<String>) -> Vec<String> {
    let kept: Vec<String> = dims.iter().filter(|a| !used.contains(a)).cloned().collect();
    used.extend(kept.iter().cloned());
    kept
}

fn classify(from: &Sharding, to: &Sharding) -> Collective {
    if from.partial.iter().any(|a| !to.partial.contains(a)) {
        return Collective::AllReduce;
    }
    let lost = from.dims.iter().zip(&to.dims).any(|(f, t)| f.iter().any(|a| !t.contains(a)));
    let gained = from.dims.iter().zip(&to.dims).any(|(f, t)| t.iter().any(|a| !f.contains(a)));
    match (lost, gained) {
        (true, true) => Collective::AllToAll,
        (true, false) => Collective::AllGather,
        _ => Collective::Slice,
    }
}

struct Prop<'a> {
    mesh: &'a Mesh,
    opts: &'a ShardOptions,
    reshards: Vec<Reshard>,
}

impl Prop<'_> {
    fn record(&mut self, g: &Graph, at: Use, value: ValueId, from: Sharding, to: Sharding) {
        let collective = classify(&from, &to);
        self.reshards.push(Reshard { at, value, from, to, collective, bytes: bytes_of(g, value) });
    }

    fn node(&mut self, g: &mut Graph, n: NodeId) {
        if self.opts.strategy == Strategy::TensorParallel {
            self.decide_tensor_parallel(g, n);
        }
        let inputs = g.nodes[n].inputs.clone();
        let ins: Vec<Sharding> = inputs.iter().map(|&v| sharding_of(g, v)).collect();
        let (expected, outs) = self.rule(g, n, &ins);
        for (index, ((&v, have), want)) in inputs.iter().zip(&ins).zip(expected).enumerate() {
            if *have == want {
                continue;
            }
            let fresh_weight = g.const_of(v).is_some() && g.values[v].attrs.sharding.is_none();
            let shape: Vec<Option<i64>> = g.ty(v).shape.iter().map(Dim::as_const).collect();
            if fresh_weight && want.problems(self.mesh, &shape).is_empty() {
                g.values[v].attrs.sharding = Some(want);
            } else {
                self.record(g, Use::Operand { node: n, index }, v, have.clone(), want);
            }
        }
        let outputs = g.nodes[n].outputs.clone();
        for (v, s) in outputs.into_iter().zip(outs) {
            let shape: Vec<Option<i64>> = g.ty(v).shape.iter().map(Dim::as_const).collect();
            // A rule gives only shardings the result's shape takes; this keeps
            // a slip from ever producing an invalid graph.
            let s = if s.problems(self.mesh, &shape).is_empty() { s } else { Sharding::replicated(shape.len()) };
            g.values[v].attrs.sharding = Some(s);
        }
    }

    /// Megatron's choice for a linear, matmul or single-group conv with a constant weight no
    /// one has sharded: row-parallel when its input arrives split on the
    /// contracted features, column-parallel otherwise.
    fn decide_tensor_parallel(&mut self, g: &mut Graph, n: NodeId) {
        let node = &g.nodes[n];
        // (contracted dim, output dim) of the weight; for a conv, its input
        // and output channels (grouped convs are left to propagation).
        let (k_dim, n_dim, x_dim) = match node.op {
            Op::Linear => (1, 0, None),
            Op::MatMul => (0, 1, None),
            Op::Conv { groups: 1, .. } => (1, 0, Some(1)),
            // Each expert's weight [K, N] as a linear's: column-parallel, then row.
            Op::GroupedMatMul => (1, 2, None),
            _ => return,
        };
        let (Some(&x), Some(&w)) = (node.inputs.first(), node.inputs.get(1)) else { return };
        let bias = node.inputs.get(2).copied().filter(|_| matches!(node.op, Op::Linear | Op::Conv { .. }));
        let rank = match (x_dim, &node.op) {
            (Some(_), _) => g.ty(x).rank(),
            (None, Op::GroupedMatMul) => 3,
            (None, _) => 2,
        };
        if g.const_of(w).is_none() || g.values[w].attrs.sharding.is_some() || g.ty(w).rank() != rank {
            return;
        }
        let Some(shape) = g.ty(w).static_shape() else { return };
        if shape.iter().product::<i64>() as usize <= self.opts.inline_max_elements {
            return;
        }
        let axis = model_axis(self.mesh).to_string();
        let size = self.mesh.axis(&axis).map_or(1, |a| i64::from(a.size));
        let xs = sharding_of(g, x);
        let x_k = x_dim.map_or_else(|| xs.dims.last().cloned(), |d| xs.dims.get(d).cloned()).unwrap_or_default();
        if x_k.contains(&axis) {
            if shape[k_dim] % size == 0 {
                g.values[w].attrs.sharding = Some(Sharding::split(rank, k_dim, &axis));
            }
        } else if shape[n_dim] % size == 0 && !xs.axes().any(|a| a == axis) {
            g.values[w].attrs.sharding = Some(Sharding::split(rank, n_dim, &axis));
            if let Some(b) = bias.filter(|&b| g.const_of(b).is_some() && g.values[b].attrs.sharding.is_none()) {
                if g.ty(b).rank() == 1 {
                    g.values[b].attrs.sharding = Some(Sharding::split(1, 0, &axis));
                }
            }
        }
    }

    /// `(expected operand shardings, result shardings)` for node `n`.
    fn rule(&self, g: &Graph, n: NodeId, ins: &[Sharding]) -> (Vec<Sharding>, Vec<Sharding>) {
        let node = &g.nodes[n];
        let out_rank = |i: usize| node.outputs.get(i).map_or(0, |&v| g.ty(v).rank());
        let replicated = || {
            let expected = node.inputs.iter().map(|&v| Sharding::replicated(g.ty(v).rank())).collect();
            let outs = node.outputs.iter().map(|&v| Sharding::replicated(g.ty(v).rank())).collect();
            (expected, outs)
        };
        if node.outputs.len() != 1 || ins.is_empty() {
            return replicated();
        }
        let out = node.outputs[0];
        let one = |expected: Vec<Sharding>, s: Sharding| (expected, vec![s]);
        match &node.op {
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } | Op::Clamp { .. } | Op::Fused { .. } => {
                let r = out_rank(0);
                let lead = (0..ins.len())
                    .find(|&i| g.const_of(node.inputs[i]).is_none() && ins[i].dims.len() == r)
                    .or_else(|| (0..ins.len()).find(|&i| ins[i].dims.len() == r));
                let Some(lead) = lead else { return replicated() };
                let s = whole(&ins[lead]);
                let expected = node.inputs.iter().map(|&v| broadcast_to(g, v, out, &s)).collect();
                one(expected, s)
            }
            Op::Expand { .. } => {
                let s = expand_from(g, node.inputs[0], out, &ins[0]);
                one(vec![broadcast_to(g, node.inputs[0], out, &s)], s)
            }
            Op::MatMul => self.matmul(g, n, ins, false).unwrap_or_else(replicated),
            Op::Linear => self.matmul(g, n, ins, true).unwrap_or_else(replicated),
            Op::GroupedMatMul => match super::manual::ExpertDispatch::of(g, n).filter(|_| self.opts.manual_regions) {
                // Partitioned by hand: rows in and out split over the
                // experts' axis (all-to-all) or whole (all-reduce), each
                // row's product whole on the devices holding it.
                Some(d) => {
                    let offs = Sharding::replicated(g.ty(node.inputs[2]).rank());
                    let w = sharding_of(g, node.inputs[1]);
                    one(vec![d.rows_sharding(), w, offs], d.rows_sharding())
                }
                None => grouped_matmul(g, n, ins).unwrap_or_else(replicated),
            },
            Op::Reduce { kind, axes, keep_dims } => {
                let x = &ins[0];
                let summing = matches!(kind, ReduceKind::Sum | ReduceKind::Mean);
                let mut input = whole(x);
                let mut partial = Vec::new();
                for &a in axes {
                    if let Some(d) = input.dims.get_mut(a) {
                        if summing {
                            partial.append(d);
                        } else {
                            d.clear();
                        }
                    }
                }
                let dims: Vec<Vec<String>> = (0..x.dims.len())
                    .filter_map(|d| match (axes.contains(&d), keep_dims) {
                        (false, _) => Some(input.dims[d].clone()),
                        (true, true) => Some(vec![]),
                        (true, false) => None,
                    })
                    .collect();
                let mut expected = vec![input.clone()];
                if summing {
                    // The split reduced dims stay split: each device sums its piece.
                    expected[0] = whole(x);
                }
                one(expected, Sharding { dims, partial })
            }
            Op::ArgMax { axis, keep_dims } | Op::ArgMin { axis, keep_dims } => {
                let mut input = whole(&ins[0]);
                if let Some(d) = input.dims.get_mut(*axis) {
                    d.clear();
                }
                let mut dims = input.dims.clone();
                if !keep_dims && *axis < dims.len() {
                    dims.remove(*axis);
                }
                one(vec![input], Sharding { dims, partial: vec![] })
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let mut s = whole(&ins[0]);
                if let Some(d) = s.dims.get_mut(*axis) {
                    d.clear();
                }
                one(vec![s.clone()], s)
            }
            Op::LayerNorm { normalized_rank, .. } | Op::RmsNorm { normalized_rank, .. } => {
                let mut s = whole(&ins[0]);
                let r = s.dims.len();
                for d in r.saturating_sub(*normalized_rank)..r {
                    s.dims[d].clear();
                }
                let mut expected = vec![s.clone()];
                expected.extend(node.inputs[1..].iter().map(|&v| Sharding::replicated(g.ty(v).rank())));
                one(expected, s)
            }
            Op::Attention { .. } => {
                match super::ring::RingAttention::plan(g, n, &whole(&ins[0]), &self.opts.cost)
                    .filter(|_| self.opts.manual_regions)
                {
                    // Partitioned by hand: keys and values rotate around the
                    // ring, so everything stays split on the sequence.
                    Some(r) => (r.operands, vec![r.result]),
                    None => self.attention(g, n, ins).unwrap_or_else(replicated),
                }
            }
            Op::Permute { perm } => {
                let s = &ins[0];
                let dims = perm.iter().map(|&p| s.dims.get(p).cloned().unwrap_or_default()).collect();
                one(vec![s.clone()], Sharding { dims, partial: s.partial.clone() })
            }
            Op::Reshape { .. } => match reshape(g, node.inputs[0], out, &ins[0]) {
                Some((expected, s)) => one(vec![expected], s),
                None => replicated(),
            },
            Op::Slice { axis, start, end, step } => {
                let mut s = whole(&ins[0]);
                let full = *start == 0
                    && *step == 1
                    && (*end == i64::MAX || Some(*end) == static_dim(g, node.inputs[0], *axis));
                if !full {
                    if let Some(d) = s.dims.get_mut(*axis) {
                        d.clear();
                    }
                }
                one(vec![s.clone()], s)
            }
            Op::Concat { axis } => {
                let lead = (0..ins.len()).find(|&i| g.const_of(node.inputs[i]).is_none()).unwrap_or(0);
                let mut s = whole(&ins[lead]);
                if let Some(d) = s.dims.get_mut(*axis) {
                    d.clear();
                }
                one(vec![s.clone(); ins.len()], s)
            }
            Op::Gather { axis } if ins.len() == 2 => {
                let (data, idx) = (&ins[0], &ins[1]);
                let mut expected_data = whole(data);
                if let Some(d) = expected_data.dims.get_mut(*axis) {
                    d.clear();
                }
                let mut used = Vec::new();
                let mut dims = Vec::new();
                let idx_whole = whole(idx);
                for d in idx_whole.dims.iter() {
                    dims.push(take_unused(d, &mut used));
                }
                let mut expected_idx = Sharding { dims: dims.clone(), partial: vec![] };
                let mut out_dims: Vec<Vec<String>> = Vec::new();
                for (d, axes) in expected_data.dims.iter_mut().enumerate() {
                    if d == *axis {
                        out_dims.append(&mut dims);
                    } else {
                        *axes = take_unused(axes, &mut used);
                        out_dims.push(axes.clone());
                    }
                }
                expected_idx.partial.clear();
                one(vec![expected_data, expected_idx], Sharding { dims: out_dims, partial: vec![] })
            }
            Op::Conv { groups, .. } => self.conv(g, n, ins, *groups).unwrap_or_else(replicated),
            // Batch (dim 0) and channels (dim 1) may stay split: pooling and
            // BatchNorm work per channel; space is whole.
            Op::Pool { .. } | Op::AdaptiveAvgPool { .. } | Op::BatchNorm { .. } => {
                let x = whole(&ins[0]);
                let mut s = Sharding::replicated(x.dims.len());
                for d in 0..x.dims.len().min(2) {
                    s.dims[d].clone_from(&x.dims[d]);
                }
                let channels = s.dims.get(1).cloned().unwrap_or_default();
                let mut expected = vec![s.clone()];
                // BatchNorm's per-channel parameters follow the channels.
                expected.extend(node.inputs[1..].iter().map(|&v| {
                    let mut p = Sharding::replicated(g.ty(v).rank());
                    if let Some(d) = p.dims.first_mut() {
                        d.clone_from(&channels);
                    }
                    p
                }));
                let mut o = Sharding::replicated(out_rank(0));
                for (d, axes) in o.dims.iter_mut().zip(&s.dims).take(2) {
                    d.clone_from(axes);
                }
                one(expected, o)
            }
            _ => replicated(),
        }
    }

    /// Matrix products: `[.., M, K] × [.., K, N]`, or with `linear` `x[.., K] ×
    /// w[N, K]ᵀ (+ b[N])`. The first activation leads; the other operand's
    /// axes that the leader already uses are dropped; a contraction split the
    /// same way on both sides leaves a partial sum.
    fn matmul(&self, g: &Graph, n: NodeId, ins: &[Sharding], linear: bool) -> Option<(Vec<Sharding>, Vec<Sharding>)> {
        let node = &g.nodes[n];
        let (a, b) = (whole(ins.first()?), whole(ins.get(1)?));
        let (ra, rb) = (a.dims.len(), b.dims.len());
        if ra < 2 && !linear || rb < 2 {
            return None;
        }
        let ro = g.ty(node.outputs[0]).rank();
        // Positions: a's K is its last dim; b's K and N.
        let (bk, bn) = if linear { (1, 0) } else { (rb - 2, rb - 1) };
        let b_leads = g.const_of(node.inputs[0]).is_some() && g.const_of(node.inputs[1]).is_none() && !linear;
        let mut used = Vec::new();
        let mut out = vec![Vec::new(); ro];
        let mut ea = a.clone();
        let mut eb = b.clone();
        let a_k = a.dims[ra - 1].clone();
        if !b_leads {
            // Out: a's batch and M dims, then N from b where free.
            let a_out = ra - 1;
            for d in 0..a_out {
                out[ro - 1 - (a_out - d)] = take_unused(&a.dims[d], &mut used);
            }
            used.extend(a_k.iter().cloned());
            let n_axes = take_unused(&b.dims[bn], &mut used);
            out[ro - 1] = n_axes.clone();
            eb.dims[bn] = n_axes;
            eb.dims[bk] = a_k.clone();
            // b's batch dims follow the output's.
            if !linear {
                for d in 0..rb - 2 {
                    let od = ro - rb + d;
                    eb.dims[d] = if static_dim(g, node.inputs[1], d) == Some(1) { vec![] } else { out[od].clone() };
                }
            }
        } else {
            let b_k = b.dims[bk].clone();
            for d in 0..rb - 2 {
                out[ro - rb + d] = take_unused(&b.dims[d], &mut used);
            }
            used.extend(b_k.iter().cloned());
            out[ro - 1] = take_unused(&b.dims[bn], &mut used);
            let m_axes = take_unused(&a.dims[ra - 2], &mut used);
            out[ro - 2] = m_axes.clone();
            ea.dims[ra - 2] = m_axes;
            ea.dims[ra - 1] = b_k;
            for d in 0..ra - 2 {
                let od = ro - ra + d;
                ea.dims[d] = if static_dim(g, node.inputs[0], d) == Some(1) { vec![] } else { out[od].clone() };
            }
        }
        let partial = if b_leads { eb.dims[bk].clone() } else { a_k };
        let mut expected = vec![ea, eb];
        if linear {
            if let Some(&bias) = node.inputs.get(2) {
                let mut s = Sharding::replicated(g.ty(bias).rank());
                if let Some(d) = s.dims.last_mut() {
                    d.clone_from(&out[ro - 1]);
                }
                // A bias is added once, after the partial products are summed.
                expected.push(s);
            }
        }
        Some((expected, vec![Sharding { dims: out, partial }]))
    }

    /// `conv(x[N, C, ..], w[Cout, C / groups, ..] [, b[Cout]])`, the product
    /// over channels as a matmul's over K: the batch follows x; with one
    /// group, x's channel split is the contraction's (the result a partial
    /// sum) and the weight's output-channel split, on an axis x does not
    /// use, splits the result's channels; with groups, each device keeps
    /// whole groups, so the result's channels follow x's. Space is whole.
    fn conv(&self, g: &Graph, n: NodeId, ins: &[Sharding], groups: i64) -> Option<(Vec<Sharding>, Vec<Sharding>)> {
        let node = &g.nodes[n];
        let (x, w) = (whole(ins.first()?), whole(ins.get(1)?));
        let (rx, rw) = (x.dims.len(), w.dims.len());
        if rx < 3 || rw != rx {
            return None;
        }
        let mut ex = Sharding::replicated(rx);
        ex.dims[0].clone_from(&x.dims[0]);
        let mut used = ex.dims[0].clone();
        let channels = take_unused(&x.dims[1], &mut used);
        ex.dims[1].clone_from(&channels);
        let mut ew = Sharding::replicated(rw);
        let mut out = Sharding::replicated(g.ty(node.outputs[0]).rank());
        out.dims[0].clone_from(&ex.dims[0]);
        if groups == 1 {
            ew.dims[1].clone_from(&channels);
            ew.dims[0] = take_unused(&w.dims[0], &mut used);
            out.dims[1].clone_from(&ew.dims[0]);
            out.partial = channels;
        } else {
            let pieces: i64 = channels.iter().map(|a| self.mesh.axis(a).map_or(1, |m| i64::from(m.size))).product();
            if groups % pieces != 0 {
                ex.dims[1].clear();
            }
            ew.dims[0].clone_from(&ex.dims[1]);
            out.dims[1].clone_from(&ex.dims[1]);
        }
        let mut expected = vec![ex, ew];
        if let Some(&b) = node.inputs.get(2) {
            let mut s = Sharding::replicated(g.ty(b).rank());
            if let Some(d) = s.dims.first_mut() {
                d.clone_from(&out.dims[1]);
            }
            // A bias is added once, after the partial sums are reduced.
            expected.push(s);
        }
        Some((expected, vec![out]))
    }

    /// `(q[.., L, E], k[.., S, E], v[.., S, Ev] [, mask])`: batch and heads
    /// follow q, sequence of queries may stay split, the rest is whole.
    fn attention(&self, g: &Graph, n: NodeId, ins: &[Sharding]) -> Option<(Vec<Sharding>, Vec<Sharding>)> {
        let node = &g.nodes[n];
        let q = whole(ins.first()?);
        let r = q.dims.len();
        if r < 2 {
            return None;
        }
        let mut eq = q.clone();
        eq.dims[r - 1].clear();
        let batch = |v: ValueId| {
            let rv = g.ty(v).rank();
            let mut s = Sharding::replicated(rv);
            for d in 0..rv.saturating_sub(2) {
                let qd = (r - rv) + d;
                if static_dim(g, v, d) != Some(1) && qd < r - 2 {
                    s.dims[d].clone_from(&q.dims[qd]);
                }
            }
            s
        };
        let mut expected = vec![eq.clone()];
        expected.extend(node.inputs[1..].iter().map(|&v| batch(v)));
        let mut out = eq;
        out.dims[r - 1].clear();
        Some((expected, vec![out]))
    }
}

/// `grouped_matmul(x[S, K], w[E, K, N], offs[E]) -> [S, N]`: the tokens
/// (x's rows) lead; x's contraction split must be the weight's (a partial sum,
/// row-parallel experts); the weight's output split on a free axis splits the
/// result (column-parallel experts); its expert split on a free axis leaves
/// each device the products of its own experts, a partial sum over that axis
/// (expert parallelism). The offsets are whole.
fn grouped_matmul(g: &Graph, n: NodeId, ins: &[Sharding]) -> Option<(Vec<Sharding>, Vec<Sharding>)> {
    let node = &g.nodes[n];
    let (x, w) = (whole(ins.first()?), whole(ins.get(1)?));
    if x.dims.len() != 2 || w.dims.len() != 3 || node.inputs.len() != 3 {
        return None;
    }
    let mut used = Vec::new();
    let rows = take_unused(&x.dims[0], &mut used);
    let k = take_unused(&x.dims[1], &mut used);
    let experts = take_unused(&w.dims[0], &mut used);
    let cols = take_unused(&w.dims[2], &mut used);
    let ex = Sharding { dims: vec![rows.clone(), k.clone()], partial: vec![] };
    let ew = Sharding { dims: vec![experts.clone(), k.clone(), cols.clone()], partial: vec![] };
    let offs = Sharding::replicated(g.ty(node.inputs[2]).rank());
    let mut partial = k;
    partial.extend(experts);
    Some((vec![ex, ew, offs], vec![Sharding { dims: vec![rows, cols], partial }]))
}

/// The sharding operand `v` needs for an elementwise op whose result `out`
/// is laid out as `s`: aligned from the right, broadcast dims whole.
fn broadcast_to(g: &Graph, v: ValueId, out: ValueId, s: &Sharding) -> Sharding {
    let (rv, ro) = (g.ty(v).rank(), g.ty(out).rank());
    let mut e = Sharding::replicated(rv);
    for d in 0..rv {
        let od = ro - rv + d;
        let broadcast = static_dim(g, v, d) == Some(1) && static_dim(g, out, od) != Some(1);
        if !broadcast {
            if let Some(axes) = s.dims.get(od) {
                e.dims[d].clone_from(axes);
            }
        }
    }
    e
}

/// An expand's result: the input's splits on the dims it keeps.
fn expand_from(g: &Graph, v: ValueId, out: ValueId, s: &Sharding) -> Sharding {
    let (rv, ro) = (g.ty(v).rank(), g.ty(out).rank());
    let mut o = Sharding::replicated(ro);
    for d in 0..rv {
        if static_dim(g, v, d) != Some(1) {
            o.dims[ro - rv + d].clone_from(&s.dims[d]);
        }
    }
    o
}

/// A reshape keeps a split when the split input dim is the major (first
/// non-unit) dim of its group of dims (the runs of input and output dims with
/// equal products) and the group's major output dim is divisible by the
/// pieces: then each device's piece stays contiguous. Other splits are made
/// whole first. `None` for dynamic shapes.
fn reshape(g: &Graph, x: ValueId, out: ValueId, s: &Sharding) -> Option<(Sharding, Sharding)> {
    let a = g.ty(x).static_shape()?;
    let b = g.ty(out).static_shape()?;
    if a.contains(&0) || b.contains(&0) || a.len() != s.dims.len() {
        return None;
    }
    let mesh_pieces = |axes: &[String]| -> i64 {
        axes.iter().map(|n| g.mesh.as_ref().and_then(|m| m.axis(n)).map_or(1, |ax| i64::from(ax.size))).product()
    };
    let mut expected = s.clone();
    let mut o = Sharding { dims: vec![vec![]; b.len()], partial: s.partial.clone() };
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        // One group: grow the side with the smaller product until they meet.
        let (i0, j0) = (i, j);
        let next = |dims: &[i64], k: &mut usize| match dims.get(*k) {
            Some(&d) => {
                *k += 1;
                d
            }
            None => 1,
        };
        let (mut pa, mut pb) = (next(&a, &mut i), next(&b, &mut j));
        while pa != pb && (i < a.len() || j < b.len()) {
            if pa < pb && i < a.len() || j == b.len() {
                pa *= next(&a, &mut i);
            } else {
                pb *= next(&b, &mut j);
            }
        }
        let split: Vec<usize> = (i0..i).filter(|&d| mesh_pieces(&s.dims[d]) > 1).collect();
        if split.is_empty() {
            continue;
        }
        let major_in = (i0..i).find(|&d| a[d] != 1);
        let major_out = (j0..j).find(|&d| b[d] != 1);
        let keep = match (split.as_slice(), major_in, major_out) {
            ([d], Some(mi), Some(mo)) if *d == mi => b[mo] % mesh_pieces(&s.dims[*d]) == 0,
            _ => false,
        };
        if keep {
            if let Some(mo) = major_out {
                o.dims[mo].clone_from(&s.dims[split[0]]);
            }
        } else {
            for d in i0..i {
                expected.dims[d].clear();
            }
        }
    }
    Some((expected, o))
}
