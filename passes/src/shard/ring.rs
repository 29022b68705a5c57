//! Ring attention (context parallelism): `--shard context-parallel` over a
//! mesh axis `seq`.
//!
//! Every input of rank two or more is split on its sequence dim (dim 1)
//! over `seq` (and on its batch over `data` when the mesh has that axis);
//! weights are replicated. Token-wise ops (linears, norms, elementwise,
//! reshapes and permutes that keep the sequence dim) keep the split by
//! propagation, so activations stay sequence-split. An attention whose
//! query, key and value arrive split on their sequence dim (`L` and `S`,
//! the second-to-last) over one axis of `n` devices that divides both is
//! partitioned by hand ([`RingAttention`]): each device keeps its `L / n`
//! queries and passes its `S / n` keys and values around the ring by
//! `collective_permute` (device `i` to `i + 1`) over `n` steps, combining
//! the blocks by the online softmax (running max, running sum, output
//! rescaled). A causal mask is applied by the blocks' global positions; an
//! explicit mask arrives with its query rows split and its key columns
//! whole, and each step uses the columns of the block it holds.
//!
//! **Zig-zag** (load balance for causal rings): with contiguous blocks,
//! device 0's queries see almost no key of the ring while the last
//! device's see every one. A causal self-attention without an explicit
//! mask (or whose mask is exactly the causal pattern and a constant, as
//! Core ATen's `is_causal` leaves it, or computed from constants only, as
//! Llama's is) whose length `2n` divides
//! ([`RingAttention::zigzag`]) instead cuts
//! the sequence into `2n` chunks of `c` and lets device `i` hold chunks `i`
//! and `2n − 1 − i` inside the region (two permutes per operand on entry,
//! two for the result on exit, so everything outside keeps the contiguous
//! split and results equal one device's). At step 0 a device scores its
//! own block, masked by position. At step `t > 0` it holds the block of
//! device `j = (i − t) mod n`: when `j < i` both query chunks see all of
//! the block's first chunk and none of its second; when `j > i` the second
//! query chunk sees all of the block and the first none of it. So every
//! device computes half a block per step (two `c × c` products, their
//! operands selected by `j < i`), the same work everywhere, and the hidden
//! half is never computed: `(n + 1) / 2n` of the plain ring's work.
//! The layout is chosen by cost ([`RingAttention::zigzag_pays`]): only
//! when the ring's estimated time with the skipped compute and the
//! reorder's eight permutes is below the plain causal ring's; otherwise
//! the plain ring (contiguous blocks, every block computed, masked by
//! position) runs.
//!
//! Propagation gives such a node q, k, v, mask and result split on the
//! sequence; the cost model and the report count its permutes, and the
//! StableHLO emitter writes the region (`sdy.manual_computation`).

use super::cost::CostModel;
use super::manual::ManualCollective;
use super::propagate::Collective;
use kiln_ir::{Builder, DType, Dim, Graph, NodeId, Op, Sharding, ValueId};

/// The mesh axis `--shard context-parallel` splits sequences over.
pub const SEQ_AXIS: &str = "seq";

/// An attention node partitioned by hand over `axis` (see the module doc).
/// Only the axis named [`SEQ_AXIS`] rings: another axis that splits a
/// query's sequence (data parallelism over a rank-2 query) keeps the
/// gathering rule.
#[derive(Clone, Debug, PartialEq)]
pub struct RingAttention {
    pub node: NodeId,
    pub axis: String,
    /// Devices along `axis` (the ring's steps).
    pub devices: i64,
    /// Query and key lengths, whole.
    pub queries: i64,
    pub keys: i64,
    pub causal: bool,
    /// The zig-zag layout applies (see the module doc): causal, no
    /// explicit mask (or exactly the causal one), as many queries as keys,
    /// `2n` dividing them.
    pub zigzag_fits: bool,
    /// The zig-zag layout is used: it fits and the cost model it was
    /// planned with says it pays ([`RingAttention::zigzag_pays`]).
    pub zigzag: bool,
    /// Bytes of one device's key block and value block (what each step sends).
    pub block_bytes: u64,
    /// Bytes of one device's query block, and of its result block (what the
    /// zig-zag reorder sends besides the key and value blocks).
    pub query_bytes: u64,
    pub result_bytes: u64,
    /// FLOPs of one device's full block (its queries against one key
    /// block: two products), what a plain ring computes per step.
    pub block_flops: f64,
    /// The shardings of q, k, v, the mask (if any) and the result.
    pub operands: Vec<Sharding>,
    pub result: Sharding,
}

/// `Some(axis)` when `s` splits dim `d` over exactly one axis and nothing is partial.
fn split_axis(s: &Sharding, d: usize) -> Option<&str> {
    match s.dims.get(d).map(Vec::as_slice) {
        Some([a]) if s.partial.is_empty() => Some(a.as_str()),
        _ => None,
    }
}

fn static_dim(g: &Graph, v: ValueId, d: usize) -> Option<i64> {
    g.ty(v).shape.get(d).and_then(Dim::as_const)
}

impl RingAttention {
    /// The shardings a ring over `axis` needs at node `n` from the query's
    /// sharding `q`: q's batch dims (the key's and value's where they are
    /// not broadcast) and the sequence dims split as q's, features whole;
    /// the mask's query rows split (unless broadcast), key columns whole.
    /// `None` when `n` is not an attention, q's sequence dim is not split
    /// over one axis, shapes are dynamic or the axis does not divide both
    /// lengths. The layout (zig-zag or plain) is the cheaper under `model`.
    pub fn plan(g: &Graph, n: NodeId, q: &Sharding, model: &CostModel) -> Option<RingAttention> {
        let node = &g.nodes[n];
        let Op::Attention { mut causal, .. } = node.op else { return None };
        let (qv, kv, vv) = (*node.inputs.first()?, *node.inputs.get(1)?, *node.inputs.get(2)?);
        let r = g.ty(qv).rank();
        if r < 2 || g.ty(kv).rank() != r || g.ty(vv).rank() != r || q.dims.len() != r {
            return None;
        }
        let axis = split_axis(q, r - 2)?.to_string();
        if axis != SEQ_AXIS {
            return None;
        }
        let mesh = g.mesh.as_ref()?;
        let devices = i64::from(mesh.axis(&axis)?.size);
        let (queries, keys) = (static_dim(g, qv, r - 2)?, static_dim(g, kv, r - 2)?);
        if devices < 2 || queries % devices != 0 || keys % devices != 0 || !g.ty(qv).dtype.is_float() {
            return None;
        }
        for &v in &node.inputs {
            g.ty(v).static_shape()?;
        }
        let mut eq = q.clone();
        eq.dims[r - 1].clear();
        // Batch dims follow q's; another use of the ring's axis there is no ring.
        if eq.dims[..r - 2].iter().flatten().any(|a| *a == axis) {
            return None;
        }
        // Batch dims follow q's where not broadcast (size 1).
        let batch = |v: ValueId, seq: bool| {
            let rv = g.ty(v).rank();
            let mut s = Sharding::replicated(rv);
            for d in 0..rv.saturating_sub(2) {
                let qd = (r - rv) + d;
                if static_dim(g, v, d) != Some(1) {
                    s.dims[d].clone_from(&eq.dims[qd]);
                }
            }
            if seq && rv >= 2 {
                s.dims[rv - 2] = vec![axis.clone()];
            }
            s
        };
        // A constant mask that is exactly the causal pattern (Core ATen's
        // `is_causal`) makes the attention causal: the position mask then
        // agrees with it, and the zig-zag layout may ignore it.
        let causal_mask = node.inputs.get(3).is_some_and(|&m| is_causal_mask(g, m, queries, keys));
        causal |= causal_mask;
        let mut operands = vec![eq.clone(), batch(kv, true), batch(vv, true)];
        if let Some(&m) = node.inputs.get(3) {
            let rm = g.ty(m).rank();
            if rm > r {
                return None;
            }
            // Rows split with the queries unless broadcast; columns whole.
            let rows = rm >= 2 && static_dim(g, m, rm - 2) == Some(queries);
            operands.push(batch(m, rows));
            if rm >= 1 && static_dim(g, m, rm - 1) != Some(keys) && static_dim(g, m, rm - 1) != Some(1) {
                return None;
            }
        }
        let elem = g.ty(kv).dtype.size_bytes() as u64;
        let local = |v: ValueId, s: &Sharding| -> u64 {
            let shape = g.ty(v).static_shape().unwrap_or_default();
            let pieces: u64 = (0..shape.len()).map(|d| s.pieces(mesh, d)).product();
            shape.iter().product::<i64>().max(0) as u64 / pieces.max(1)
        };
        let block_bytes = (local(kv, &operands[1]) + local(vv, &operands[2])) * elem;
        let out = node.outputs[0];
        let mut result = Sharding::replicated(g.ty(out).rank());
        for d in 0..r.min(result.dims.len()) {
            result.dims[d].clone_from(&eq.dims[d]);
        }
        let query_bytes = local(qv, &operands[0]) * elem;
        let result_bytes = local(out, &result) * g.ty(out).dtype.size_bytes() as u64;
        // softmax(q kᵀ) v per block: 2·rows·keys·(E + Ev) FLOPs.
        let features = (static_dim(g, kv, r - 1)? + static_dim(g, vv, r - 1)?) as f64;
        let rows = (local(out, &result) / static_dim(g, out, r - 1)?.max(1) as u64) as f64;
        let block_flops = 2.0 * rows * (keys / devices) as f64 * features;
        let unmasked = node.inputs.len() == 3 || causal_mask;
        let zigzag_fits = causal && unmasked && queries == keys && queries % (2 * devices) == 0;
        let mut ring = RingAttention {
            node: n,
            axis,
            devices,
            queries,
            keys,
            causal,
            zigzag_fits,
            zigzag: zigzag_fits,
            block_bytes,
            query_bytes,
            result_bytes,
            block_flops,
            operands,
            result,
        };
        ring.zigzag = zigzag_fits && ring.zigzag_pays(model);
        Some(ring)
    }

    /// The same ring in the zig-zag layout (`true`, only where it fits)
    /// or the plain one.
    pub fn with_layout(&self, zigzag: bool) -> RingAttention {
        RingAttention { zigzag: zigzag && self.zigzag_fits, ..self.clone() }
    }

    /// The ring's estimated time on one device under `model`: its
    /// compute and its exposed communication ([`RingAttention::comm_s`]).
    pub fn ring_s(&self, model: &CostModel) -> f64 {
        self.device_flops() / model.flops_per_s + self.comm_s(model)
    }

    /// The layout decision: whether the zig-zag layout fits and its ring
    /// time (compute with the hidden halves skipped, each step's permute
    /// overlapping only half a block, and the reorder's eight permutes) is
    /// below the plain causal ring's under `model`.
    pub fn zigzag_pays(&self, model: &CostModel) -> bool {
        self.zigzag_fits && self.with_layout(true).ring_s(model) < self.with_layout(false).ring_s(model)
    }

    /// `Some` when node `n`'s key and result carry the ring's shardings:
    /// propagation rings every attention whose query arrives split on its
    /// sequence over `seq` when manual regions are allowed (Shardy), and
    /// `--shard context-parallel` refuses GSPMD, so that is what it planned.
    /// `model` must be the one propagation planned with (it decides the layout).
    pub fn planned(g: &Graph, n: NodeId, model: &CostModel) -> Option<RingAttention> {
        let node = &g.nodes[n];
        let q = g.values[*node.inputs.first()?].attrs.sharding.as_ref()?;
        let ring = RingAttention::plan(g, n, q, model)?;
        let k = g.values[node.inputs[1]].attrs.sharding.as_ref()?;
        let out = g.values[node.outputs[0]].attrs.sharding.as_ref()?;
        (*k == ring.operands[1] && *out == ring.result).then_some(ring)
    }

    /// Query rows and key rows each device holds.
    pub fn local_queries(&self) -> i64 {
        self.queries / self.devices
    }

    pub fn local_keys(&self) -> i64 {
        self.keys / self.devices
    }

    /// FLOPs one device computes at a step after the first: a full block,
    /// or half of one under the zig-zag layout (the hidden half skipped).
    pub fn step_flops(&self) -> f64 {
        if self.zigzag {
            self.block_flops / 2.0
        } else {
            self.block_flops
        }
    }

    /// FLOPs one device computes for the whole ring: its own block, then
    /// `n − 1` steps.
    pub fn device_flops(&self) -> f64 {
        self.block_flops + (self.devices - 1) as f64 * self.step_flops()
    }

    /// Bytes each device sends to put its blocks in the zig-zag layout and
    /// its result back (0 without zig-zag): its query, key and value blocks
    /// once, and its result block once.
    pub fn reorder_bytes(&self) -> u64 {
        if self.zigzag {
            self.query_bytes + self.block_bytes + self.result_bytes
        } else {
            0
        }
    }

    /// One ring step as the cost model sees it: `(compute s, permute s,
    /// exposed s)`. The permute of the next block overlaps the step's
    /// block compute, so only what it takes beyond it is exposed.
    pub fn step_times(&self, model: &CostModel) -> (f64, f64, f64) {
        let compute = self.step_flops() / model.flops_per_s;
        let permute = self.block_bytes as f64 / model.link(&self.axis) + model.collective_latency_s;
        (compute, permute, (permute - compute).max(0.0))
    }

    /// Communication time of the whole ring on one device: `n − 1` steps'
    /// exposed permute time, and the zig-zag reorder (not overlapped).
    pub fn comm_s(&self, model: &CostModel) -> f64 {
        let (_, _, exposed) = self.step_times(model);
        (self.devices - 1) as f64 * exposed + self.reorder_s(model)
    }

    /// The zig-zag reorder's time (0 without zig-zag): two permutes in for
    /// each of q, k and v, two out.
    pub fn reorder_s(&self, model: &CostModel) -> f64 {
        if self.zigzag {
            self.reorder_bytes() as f64 / model.link(&self.axis) + 8.0 * model.collective_latency_s
        } else {
            0.0
        }
    }

    /// Compute time the zig-zag layout saves against the contiguous ring
    /// (0 without zig-zag).
    pub fn skipped_s(&self, model: &CostModel) -> f64 {
        (self.block_flops * self.devices as f64 - self.device_flops()) / model.flops_per_s
    }

    /// The `n − 1` permutes of each device's key and value blocks (and the
    /// zig-zag reorder's).
    pub fn collectives(&self) -> Vec<ManualCollective> {
        let steps = self.devices - 1;
        let what = format!(
            "ring attention over `{}` ({} steps, {} of {} queries and {} of {} keys per device{}): \
             {steps} permutes of the key and value blocks, {} B per step; B each device sends",
            self.axis,
            self.devices,
            self.local_queries(),
            self.queries,
            self.local_keys(),
            self.keys,
            if self.zigzag {
                ", causal, zig-zag"
            } else if self.causal {
                ", causal"
            } else {
                ""
            },
            self.block_bytes
        );
        let mut out = vec![ManualCollective {
            collective: Collective::CollectivePermute,
            axis: self.axis.clone(),
            what,
            bytes_per_device: self.block_bytes * steps as u64,
        }];
        if self.zigzag {
            out.push(ManualCollective {
                collective: Collective::CollectivePermute,
                axis: self.axis.clone(),
                what: format!(
                    "zig-zag reorder over `{}`: 6 permutes of the query, key and value chunks in, 2 of the \
                     result's out; B each device sends",
                    self.axis
                ),
                bytes_per_device: self.reorder_bytes(),
            });
        }
        out
    }
}

/// Whether `m` is computed from constants alone (a constant, or ops on
/// constants that folding leaves alone: Llama's gathers and cumsum) into
/// exactly the causal pattern over `queries × keys` (every leading dim 1):
/// bool true where the key's position is at most the query's and false
/// elsewhere, or a float mask 0 there and −∞ elsewhere — both mean what
/// `causal` means, exactly.
fn is_causal_mask(g: &Graph, m: ValueId, queries: i64, keys: i64) -> bool {
    let Some(shape) = g.ty(m).static_shape() else { return false };
    let r = shape.len();
    if r < 2 || shape[r - 2] != queries || shape[r - 1] != keys || shape[..r - 2].iter().any(|&d| d != 1) {
        return false;
    }
    let n = (queries * keys) as usize;
    if n > MASK_EVAL_MAX {
        return false;
    }
    let Some(t) = crate::eval::eval_value(g, m, MASK_EVAL_DEPTH, n.max(1) * MASK_EVAL_SLACK) else { return false };
    if t.data.len() != n {
        return false;
    }
    let keys = keys as usize;
    let visible = |k: usize| k % keys <= k / keys;
    match t.dtype {
        DType::Bool => t.data.iter().enumerate().all(|(k, &x)| (x != 0.0) == visible(k)),
        DType::F32 => {
            t.data.iter().enumerate().all(|(k, &x)| if visible(k) { x == 0.0 } else { x == f64::NEG_INFINITY })
        }
        _ => false,
    }
}

/// How many producers deep, and how many times the mask's elements per
/// intermediate, [`is_causal_mask`] evaluates; masks over more than
/// `MASK_EVAL_MAX` query × key pairs are not evaluated (planning runs
/// many times under `--shard auto`): they keep the contiguous ring.
const MASK_EVAL_DEPTH: usize = 12;
const MASK_EVAL_SLACK: usize = 4;
const MASK_EVAL_MAX: usize = 1 << 20;

/// Every attention of `g` planned as a ring (its layout chosen under
/// `model`), in schedule order.
pub fn ring_attentions(g: &Graph, model: &CostModel) -> Vec<RingAttention> {
    g.order.iter().filter_map(|&n| RingAttention::planned(g, n, model)).collect()
}

/// Core ATen's linears on a batch above one: `x [B, S, K]` viewed as
/// `[B·S, K]` rows, a matrix product and elementwise ops (bias, GELU) on
/// the rows, then viewed back. With the sequence split, `B·S` rows hold no
/// contiguous piece per device, so propagation would gather them. This
/// rewrites a matrix product of such a view by a `[K, N]` matrix into the
/// product of `x` itself (`[B, S, N]`, viewed as rows after it), and sinks
/// the view below elementwise ops whose other operands broadcast over the
/// rows (scalars, `[N]`, `[1, N]`); `simplify` then composes the views, so
/// the program's rows keep their batch and sequence dims. Same products of
/// the same rows: only the views move. Run before sharding under
/// `--shard context-parallel`.
pub fn unflatten_rows(g: &mut Graph, _opts: &crate::Options) -> Result<crate::Changed, crate::PassError> {
    use crate::rewrite::{rewrite_in_order, Rewrite};
    let err = |e: String| crate::PassError::new("unflatten_rows", e);
    rewrite_in_order(g, |g, n| {
        let node = &g.nodes[n];
        let [out] = node.outputs[..] else { return Ok(Rewrite::Keep) };
        let Some(&[m, cols]) = g.ty(out).static_shape().as_deref() else { return Ok(Rewrite::Keep) };
        // `v` is a view of some `[L.., c]` (rank ≥ 3) as `[prod(L), c]`: (x, L).
        let merged = |v: ValueId| -> Option<(ValueId, Vec<i64>)> {
            let p = g.producer(v)?;
            let (Op::Reshape { .. }, [x]) = (&g.nodes[p].op, &g.nodes[p].inputs[..]) else { return None };
            let (from, to) = (g.ty(*x).static_shape()?, g.ty(v).static_shape()?);
            let r = from.len();
            (r >= 3 && to.len() == 2 && to[1] == from[r - 1] && to[0] == from[..r - 1].iter().product::<i64>())
                .then(|| (*x, from[..r - 1].to_vec()))
        };
        let (op, inputs, loc) = (node.op.clone(), node.inputs.clone(), node.loc);
        let elementwise = matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } | Op::Clamp { .. });
        let (new_inputs, lead) = match op {
            Op::MatMul => match (merged(inputs[0]), inputs.get(1)) {
                (Some((x, lead)), Some(&b)) if inputs.len() == 2 && g.ty(b).rank() == 2 => (vec![x, b], lead),
                _ => return Ok(Rewrite::Keep),
            },
            _ if elementwise => {
                let mut lead: Option<Vec<i64>> = None;
                let mut new_inputs = Vec::new();
                for &v in &inputs {
                    if let Some((x, l)) = merged(v).filter(|(_, l)| l.iter().product::<i64>() == m) {
                        if lead.as_ref().is_some_and(|have| *have != l) {
                            return Ok(Rewrite::Keep);
                        }
                        lead = Some(l);
                        new_inputs.push(x);
                        continue;
                    }
                    // Operands that broadcast over the rows alike either way.
                    let shape = &g.ty(v).shape;
                    let rows_broadcast = shape.len() <= 1 || (shape.len() == 2 && shape[0].as_const() == Some(1));
                    if !rows_broadcast {
                        return Ok(Rewrite::Keep);
                    }
                    new_inputs.push(v);
                }
                match lead {
                    Some(lead) => (new_inputs, lead),
                    None => return Ok(Rewrite::Keep),
                }
            }
            _ => return Ok(Rewrite::Keep),
        };
        let mut b = Builder::new(g, loc);
        let y = b.push(op, new_inputs).map_err(err)?;
        let mut want = lead;
        want.push(cols);
        if b.g.ty(y).static_shape().as_deref() != Some(&want[..]) {
            return Err(err(format!("unflattened result {:?}, expected {want:?}", b.g.ty(y).shape)));
        }
        let rows = b.push(Op::Reshape { shape: vec![Dim::Const(m), Dim::Const(cols)] }, vec![y]).map_err(err)?;
        Ok(Rewrite::Replace(vec![rows]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::{shard_graph, ShardOptions, Strategy};

    /// A slow device on fast links: the zig-zag reorder costs next to
    /// nothing against the compute it saves, so it is chosen wherever it fits.
    fn cheap_reorder() -> CostModel {
        CostModel::parse("flops=1e6,link=1e15,latency=1e-12").unwrap_or_else(|e| panic!("{e}"))
    }

    /// q, k, v `[1, 2, 16, 4]` from the input split on the sequence, one
    /// attention (`attrs`, an optional mask input `[1, 1, 16, 16]`),
    /// planned under [`cheap_reorder`].
    fn ring_of(attrs: &str, mask: bool, mesh: &[(&str, u32)]) -> RingAttention {
        ring_under(attrs, mask, mesh, cheap_reorder())
    }

    fn ring_under(attrs: &str, mask: bool, mesh: &[(&str, u32)], cost: CostModel) -> RingAttention {
        let mask_input = if mask { "  input %1 \"m\": f32[1, 1, 16, 16]\n" } else { "" };
        let mask_arg = if mask { ", %1" } else { "" };
        let text = format!(
            "graph {{\n  input %0 \"x\": f32[1, 2, 16, 4]\n{mask_input}  %2: f32[1, 2, 16, 4] = \
             attention{{{attrs}}}(%0, %0, %0{mask_arg})\n  output %2 \"y\"\n}}\n"
        );
        let mut g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        // Split the query's sequence (dim 2 here) over `seq` by hand.
        let x = g.inputs[0];
        g.values[x].attrs.sharding = Some(Sharding::split(4, 2, SEQ_AXIS));
        let opts = ShardOptions {
            mesh: kiln_ir::Mesh::new(mesh),
            strategy: Strategy::Replicated,
            overrides: vec![],
            inline_max_elements: 0,
            cost: cost.clone(),
            manual_regions: true,
        };
        shard_graph(&mut g, &opts).unwrap_or_else(|e| panic!("{e}"));
        let rings = ring_attentions(&g, &cost);
        assert_eq!(rings.len(), 1, "{}", kiln_ir::text::print(&g));
        rings[0].clone()
    }

    /// A causal self-attention whose length 2n divides is zig-zag: its
    /// device computes its own block and half a block per later step,
    /// (n + 1) / 2n of the plain ring's FLOPs, and the reorder sends its
    /// q, k, v and result blocks once. Non-causal, masked or 2n not
    /// dividing: the plain ring, every block computed.
    #[test]
    fn zigzag_skips_the_hidden_halves() {
        // One device's full block: 2 heads × 16/n queries × 16/n keys, 2·(4 + 4) FLOPs each.
        for n in [2u32, 4, 8] {
            let r = ring_of("causal=true", false, &[("seq", n)]);
            let rows = 2.0 * (16 / n) as f64;
            let block = 2.0 * rows * (16 / n) as f64 * 8.0;
            assert_eq!(r.block_flops, block, "n = {n}");
            assert!(r.zigzag, "n = {n}");
            let n64 = f64::from(n);
            assert_eq!(r.device_flops(), block * n64 * (n64 + 1.0) / (2.0 * n64), "n = {n}");
            assert_eq!(r.step_flops(), block / 2.0);
            let local = 2 * (16 / u64::from(n)) * 4 * 4;
            assert_eq!(r.reorder_bytes(), 4 * local, "n = {n}");
            assert_eq!(r.collectives().len(), 2);
            let plain = ring_of("causal=false", false, &[("seq", n)]);
            assert!(!plain.zigzag);
            assert_eq!(plain.device_flops(), block * n64);
            assert_eq!((plain.reorder_bytes(), plain.collectives().len()), (0, 1));
        }
        // 2n = 32 chunks do not divide 16 positions.
        assert!(!ring_of("causal=true", false, &[("seq", 16)]).zigzag);
        assert!(!ring_of("causal=false", true, &[("seq", 2)]).zigzag);
    }

    /// Constant masks of exactly the causal pattern (bool, or 0/−∞ f32)
    /// make a masked attention causal and zig-zag; any other mask keeps
    /// the plain ring.
    #[test]
    fn constant_causal_masks_are_recognised() {
        let ring_with = |mask: &str| {
            let text = format!(
                "graph {{\n  input %0 \"x\": f32[1, 2, 4, 4]\n  const %1: {mask}\n  %2: f32[1, 2, 4, 4] = \
                 attention{{causal=false}}(%0, %0, %0, %1)\n  output %2 \"y\"\n}}\n"
            );
            let mut g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            g.mesh = Some(kiln_ir::Mesh::new(&[("seq", 2)]));
            let q = Sharding::split(4, 2, SEQ_AXIS);
            let n = g.order[0];
            RingAttention::plan(&g, n, &q, &cheap_reorder()).unwrap_or_else(|| panic!("no ring: {mask}"))
        };
        let tril = "bool[1, 1, 4, 4] = [1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]";
        let r = ring_with(tril);
        assert!(r.causal && r.zigzag, "{r:?}");
        let inf = "-inf";
        let bias = format!(
            "f32[4, 4] = [0.0, {inf}, {inf}, {inf}, 0.0, 0.0, {inf}, {inf}, 0.0, 0.0, 0.0, {inf}, 0.0, 0.0, 0.0, 0.0]"
        );
        let r = ring_with(&bias);
        assert!(r.causal && r.zigzag, "{r:?}");
        // One key too many (row 0 sees key 1), or a finite bias: not causal.
        let r = ring_with("bool[1, 1, 4, 4] = [1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]");
        assert!(!r.causal && !r.zigzag, "{r:?}");
        let finite = bias.replace(inf, "-10000.0");
        let r = ring_with(&finite);
        assert!(!r.causal && !r.zigzag, "{r:?}");
    }

    /// The layout decision on both sides of its threshold. With links so
    /// fast that bytes cost nothing and a latency below half a block's
    /// compute (no permute exposed either way), zig-zag's ring takes
    /// `8·latency` more and `(n − 1)/2` blocks' compute less than the
    /// plain one: it pays just below `latency = saved / 8` and not just
    /// above. Propagation plans the chosen layout (the plain ring under a
    /// slow link, as under the default model at this tiny size), and a
    /// ring whose layout does not fit never zig-zags.
    #[test]
    fn zigzag_is_chosen_by_cost() {
        let r = ring_of("causal=true", false, &[("seq", 4)]);
        assert!(r.zigzag_fits && r.zigzag);
        let flops = 1e6;
        let saved = 1.5 * r.block_flops / flops;
        assert!(saved / 8.0 * 1.01 < r.block_flops / 2.0 / flops, "the threshold's latency hides behind the steps");
        let model = |latency: f64| {
            CostModel::parse(&format!("flops={flops},link=1e30,latency={latency}")).unwrap_or_else(|e| panic!("{e}"))
        };
        let (below, above) = (model(saved / 8.0 * 0.99), model(saved / 8.0 * 1.01));
        assert!(r.zigzag_pays(&below));
        assert!(!r.zigzag_pays(&above));
        assert!(r.with_layout(true).ring_s(&below) < r.with_layout(false).ring_s(&below));
        assert!(r.with_layout(true).ring_s(&above) > r.with_layout(false).ring_s(&above));
        // What propagation plans follows the decision.
        assert!(ring_under("causal=true", false, &[("seq", 4)], below.clone()).zigzag);
        let plain = ring_under("causal=true", false, &[("seq", 4)], above);
        assert!(plain.zigzag_fits && !plain.zigzag && plain.causal);
        assert_eq!((plain.device_flops(), plain.reorder_bytes()), (4.0 * plain.block_flops, 0));
        assert_eq!(plain.collectives().len(), 1);
        let slow_link = CostModel::parse("link=1e3,latency=1e-3").unwrap_or_else(|e| panic!("{e}"));
        assert!(!ring_under("causal=true", false, &[("seq", 4)], slow_link).zigzag);
        assert!(!ring_under("causal=true", false, &[("seq", 4)], CostModel::default()).zigzag);
        // Not causal: never, however cheap the reorder.
        let r = ring_under("causal=false", false, &[("seq", 4)], below.clone());
        assert!(!r.zigzag_fits && !r.zigzag && !r.zigzag_pays(&below));
    }

    /// Each step's permute overlaps its block compute: exposed is what it
    /// takes beyond the compute, zero when compute is slower.
    #[test]
    fn step_times_overlap_the_permute() {
        let r = ring_of("causal=true", false, &[("seq", 4)]);
        let slow_link = CostModel::parse("flops=1e12,link=1e3,latency=1e-6").unwrap_or_else(|e| panic!("{e}"));
        let (compute, permute, exposed) = r.step_times(&slow_link);
        assert!(permute > compute);
        assert_eq!(exposed, permute - compute);
        let slow_compute = CostModel::parse("flops=1e3,link=1e12,latency=1e-9").unwrap_or_else(|e| panic!("{e}"));
        let (compute, permute, exposed) = r.step_times(&slow_compute);
        assert!(compute > permute && exposed == 0.0);
        // Then only the zig-zag reorder is paid.
        let reorder = r.reorder_bytes() as f64 / 1e12 + 8.0 * 1e-9;
        assert!((r.comm_s(&slow_compute) - reorder).abs() < 1e-15);
        assert!((r.reorder_s(&slow_compute) - reorder).abs() < 1e-15);
        // Zig-zag skips 3 of the 4 steps' halves: 1.5 blocks of compute.
        assert!((r.skipped_s(&slow_compute) - 1.5 * r.block_flops / 1e3).abs() < 1e-9);
    }
}
