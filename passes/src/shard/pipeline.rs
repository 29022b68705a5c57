//! Pipeline parallelism (`--shard pipeline`): the program's repeated blocks
//! (layers) assigned to the devices along the `stage` mesh axis, each device
//! holding only its stages' weights, the batch split into microbatches that
//! flow from stage to stage (GPipe's schedule inside one SPMD program).
//!
//! What is found and rewritten here:
//!
//! - **Repeated blocks**: a run of the schedule made of `L ≥ 2` consecutive
//!   copies of one block of nodes — the same ops with the same attributes and
//!   types, each copy reading only the previous copy's one result (the first
//!   reads the value entering the run), its own weights (constants in the
//!   same places, of the same types), constants every copy shares and side
//!   inputs (values from before the run every copy reads: an attention
//!   mask) — and leaving one value. The longest such run wins (then the
//!   shortest block).
//! - **Stacked weights**: each weight slot's `L` constants become one
//!   `[L, …]` constant split on dim 0 over `stage` (so a device holds the
//!   `L / N` layers of its stage), and each layer reads its weight back
//!   through a `slice` + `reshape` of it, so the graph stays an exact,
//!   runnable program.
//! - **Microbatches**: when every op of the block treats batch rows (dim 0)
//!   independently (a whitelist: elementwise ops, linears, norms and
//!   softmax over the last dims, reductions not over dim 0, reshapes and
//!   permutes keeping the batch on dim 0, attention), the batch each device
//!   holds is cut into `M` microbatches (side inputs holding the batch's
//!   rows too); otherwise `M` is 1.
//!
//! The StableHLO emitter writes the run as one `sdy.manual_computation`
//! over the whole mesh: `M + N − 1` unrolled steps in which stage 0 takes
//! the next microbatch, every stage applies its `L / N` layers to what it
//! holds, and `collective_permute` passes the activations one stage on; the
//! last stage's results are gathered (`all_gather` over `stage`) so that
//! every device leaves the region with the whole result. Steps where a stage
//! has no microbatch (the bubble, a fraction `(N − 1) / (M + N − 1)` of the
//! steps) compute on zeros and their results are never selected.

use super::cost::node_flops;
use super::propagate::Collective;
use super::ManualCollective;
use kiln_ir::{ConstBytes, Dim, Graph, NodeId, Op, Region, Sharding, TensorType, ValueDef, ValueId};
use std::collections::HashMap;

/// The mesh axis pipeline stages are laid along.
pub const STAGE_AXIS: &str = "stage";

/// A planned pipeline (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    pub axis: String,
    /// Devices along `axis` (stages).
    pub stages: i64,
    /// Repeated blocks found (layers); a multiple of `stages`.
    pub layers: i64,
    pub microbatches: i64,
    /// Nodes per layer before the rewrite.
    pub block_nodes: usize,
    /// Every node the region replaces (the layers and their weight slices),
    /// in schedule order.
    pub span: Vec<NodeId>,
    /// The activation entering the first layer, and the last layer's result.
    pub input: ValueId,
    pub output: ValueId,
    /// The first layer's result (the template's output).
    first_output: ValueId,
    /// Batch rows of the whole activation (dim 0).
    pub rows: i64,
    /// One layer on one microbatch: inputs are the activation, then one per
    /// stacked weight slot, then the large shared constants; one output.
    /// Set by [`Pipeline::finish`] (it needs the input's sharding).
    pub template: Option<Region>,
    /// Per weight slot, the `[L, …]` constant split over `axis`.
    pub stacked: Vec<ValueId>,
    /// Constants every layer reads (the same value) with more than
    /// `inline_max_elements` elements: passed whole to the region.
    pub shared: Vec<ValueId>,
    /// Values from before the run every layer reads (an attention mask),
    /// and whether each holds the batch's rows on dim 0 (then cut into
    /// microbatches with the activation; otherwise passed whole).
    pub side: Vec<ValueId>,
    pub side_batched: Vec<bool>,
    /// Rows of the activation each device holds (the batch over the data
    /// split), and the rows of one microbatch.
    pub local_rows: i64,
    pub microbatch_rows: i64,
    /// The activation's sharding outside the region (batch over data, or none).
    pub sharding: Sharding,
    /// Whether the block treats batch rows independently.
    pub row_wise: bool,
    /// Origin of each layer's first weight (for the report).
    pub layer_names: Vec<String>,
    /// Weight bytes of one layer.
    pub layer_weight_bytes: u64,
    /// Bytes of one microbatch's activation, and of the region's result per
    /// device.
    pub activation_bytes: u64,
    pub result_bytes: u64,
    /// FLOPs of all layers over the whole batch.
    pub flops: f64,
}

/// How an operand of a block's node is classified when blocks are compared.
#[derive(Clone, Debug, PartialEq)]
enum Operand {
    /// Value `i` entering the block from outside (the previous block's
    /// result, or a side input every block reads).
    External(usize),
    /// Output `index` of the block's node `at`.
    Internal { at: usize, index: usize },
    /// A constant: slot per block, or the same value in every block.
    Const(ValueId),
}

/// A block: `nodes` of the schedule reading `input`, leaving `output`.
#[derive(Clone, Debug)]
struct Block {
    nodes: Vec<NodeId>,
    /// Values entering from outside, first use first; `externals[chain]`
    /// is the activation (`input`), the others side inputs.
    externals: Vec<ValueId>,
    chain: usize,
    input: ValueId,
    output: ValueId,
    /// Per node, its operands classified.
    operands: Vec<Vec<Operand>>,
    /// Position of `output`: (node, index).
    output_at: (usize, usize),
}

/// Reads `nodes` as a block: every operand the previous nodes of the block
/// produce, a constant, or one entering value; exactly one value used after
/// it (`uses_after(v)`).
fn read_block(g: &Graph, nodes: &[NodeId], used_outside: &dyn Fn(ValueId, &[NodeId]) -> bool) -> Option<Block> {
    let mut made: HashMap<ValueId, (usize, usize)> = HashMap::new();
    let mut externals: Vec<ValueId> = Vec::new();
    let mut operands = Vec::with_capacity(nodes.len());
    for (k, &n) in nodes.iter().enumerate() {
        let node = &g.nodes[n];
        if node.outputs.is_empty() || matches!(node.op, Op::While { .. }) {
            return None;
        }
        let mut ops = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            let o = if let Some(&(at, index)) = made.get(&v) {
                Operand::Internal { at, index }
            } else if g.const_of(v).is_some() {
                Operand::Const(v)
            } else {
                let i = externals.iter().position(|&e| e == v).unwrap_or_else(|| {
                    externals.push(v);
                    externals.len() - 1
                });
                Operand::External(i)
            };
            ops.push(o);
        }
        operands.push(ops);
        for (i, &v) in node.outputs.iter().enumerate() {
            made.insert(v, (k, i));
        }
    }
    let leaving: Vec<(ValueId, (usize, usize))> =
        made.iter().filter(|(&v, _)| used_outside(v, nodes)).map(|(&v, &at)| (v, at)).collect();
    let [(output, output_at)] = leaving.as_slice() else { return None };
    let input = *externals.first()?;
    Some(Block { nodes: nodes.to_vec(), externals, chain: 0, input, output: *output, operands, output_at: *output_at })
}

/// Whether `b` follows `prev` in a chain whose side inputs are `first`'s:
/// it reads `prev`'s result where `first` reads its input, and the same side
/// values elsewhere. Sets `b`'s chain index and input.
fn chains(first: &Block, prev: &Block, b: &mut Block) -> bool {
    let Some(k) = b.externals.iter().position(|&e| e == prev.output) else { return false };
    if b.externals.len() != first.externals.len() {
        return false;
    }
    let side_ok = b.externals.iter().zip(&first.externals).enumerate().all(|(i, (x, y))| i == k || x == y);
    b.chain = k;
    b.input = prev.output;
    side_ok
}

/// Whether block `b` is a copy of `a`: same ops and types, operands in the
/// same places, constants of the same types, one-to-one.
fn same_block(g: &Graph, a: &Block, b: &Block, slots: &mut HashMap<ValueId, ValueId>) -> bool {
    if a.nodes.len() != b.nodes.len() || a.output_at != b.output_at {
        return false;
    }
    for (k, (&na, &nb)) in a.nodes.iter().zip(&b.nodes).enumerate() {
        let (x, y) = (&g.nodes[na], &g.nodes[nb]);
        if x.op != y.op || x.outputs.len() != y.outputs.len() {
            return false;
        }
        if x.outputs.iter().zip(&y.outputs).any(|(&u, &v)| g.ty(u) != g.ty(v)) {
            return false;
        }
        for (oa, ob) in a.operands[k].iter().zip(&b.operands[k]) {
            match (oa, ob) {
                (Operand::External(i), Operand::External(j)) if i == j => {}
                (Operand::Internal { .. }, Operand::Internal { .. }) if oa == ob => {}
                (&Operand::Const(ca), &Operand::Const(cb)) if g.ty(ca) == g.ty(cb) => match slots.get(&ca) {
                    Some(&seen) if seen != cb => return false,
                    Some(_) => {}
                    None => {
                        if slots.values().any(|&v| v == cb) {
                            return false;
                        }
                        slots.insert(ca, cb);
                    }
                },
                _ => return false,
            }
        }
    }
    true
}

/// The longest run of repeated blocks in `g`'s schedule (most nodes covered,
/// then the shortest block): the blocks in order.
fn find_blocks(g: &Graph) -> Option<Vec<Block>> {
    let order = &g.order;
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // Last schedule position reading each value (graph outputs: past the end).
    let mut last_use: HashMap<ValueId, usize> = HashMap::new();
    let mut first_use: HashMap<ValueId, usize> = HashMap::new();
    for (i, &n) in order.iter().enumerate() {
        for &v in &g.nodes[n].inputs {
            last_use.insert(v, i);
            first_use.entry(v).or_insert(i);
        }
    }
    for &v in &g.outputs {
        last_use.insert(v, order.len());
    }
    let sig: Vec<&str> = order.iter().map(|&n| g.nodes[n].op.name()).collect();
    let mut best: Option<Vec<Block>> = None;
    let covered = |b: &Option<Vec<Block>>| b.as_ref().map_or(0, |v| v.len() * v[0].nodes.len());
    for start in 0..order.len() {
        for p in 1..=(order.len() - start) / 2 {
            if sig[start..start + p] != sig[start + p..start + 2 * p] {
                continue;
            }
            let used_outside = |v: ValueId, nodes: &[NodeId]| {
                let (lo, hi) = (pos[&nodes[0]], pos[&nodes[nodes.len() - 1]]);
                last_use.get(&v).is_some_and(|&u| u > hi) || first_use.get(&v).is_some_and(|&u| u < lo)
            };
            let Some(mut first) = read_block(g, &order[start..start + p], &used_outside) else { continue };
            // The chain's index comes from the second block: where it reads
            // the first one's result.
            let Some(second) = read_block(g, &order[start + p..start + 2 * p], &used_outside) else { continue };
            let Some(k) = second.externals.iter().position(|&e| e == first.output) else { continue };
            if k >= first.externals.len() || g.ty(first.externals[k]) != g.ty(first.output) {
                continue;
            }
            first.chain = k;
            first.input = first.externals[k];
            let mut blocks = vec![first];
            let mut slots = HashMap::new();
            let mut at = start + p;
            while at + p <= order.len() && sig[at..at + p] == sig[start..start + p] {
                let Some(mut b) = read_block(g, &order[at..at + p], &used_outside) else { break };
                let prev = &blocks[blocks.len() - 1];
                // Chained: this block reads the previous one's result, which
                // nothing else reads, and the same side inputs.
                let chained = chains(&blocks[0], prev, &mut b)
                    && b.chain == blocks[0].chain
                    && last_use.get(&prev.output).is_some_and(|&u| u < at + p);
                let mut s = HashMap::new();
                if !chained || !same_block(g, &blocks[0], &b, &mut s) {
                    break;
                }
                slots.extend(s);
                blocks.push(b);
                at += p;
            }
            if blocks.len() >= 2 && blocks.len() * p > covered(&best) {
                best = Some(blocks);
            }
        }
    }
    best
}

/// Whether every op of `b` treats batch rows (dim 0, `rows` of them)
/// independently: row-wise ops, every non-constant value `rows` long on dim
/// 0, constants broadcast along it.
fn rows_independent(g: &Graph, b: &Block, rows: i64) -> bool {
    let batch = |v: ValueId| g.ty(v).shape.first().and_then(Dim::as_const) == Some(rows);
    b.nodes.iter().zip(&b.operands).all(|(&n, ops)| {
        let node = &g.nodes[n];
        let out = node.outputs[0];
        let rank = g.ty(out).rank();
        let op_ok = match &node.op {
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } | Op::Clamp { .. } | Op::Fused { .. } => true,
            Op::Linear | Op::LinearFused { .. } | Op::MatMul => {
                ops.iter().skip(1).all(|o| matches!(o, Operand::Const(_))) && rank >= 2
            }
            Op::LayerNorm { normalized_rank, .. } | Op::RmsNorm { normalized_rank, .. } => *normalized_rank < rank,
            Op::Softmax { axis } | Op::LogSoftmax { axis } => *axis != 0,
            Op::Reduce { axes, keep_dims, .. } => !axes.contains(&0) && (*keep_dims || rank >= 1),
            Op::Reshape { shape } => shape.first().and_then(Dim::as_const) == Some(rows),
            Op::Permute { perm } => perm.first() == Some(&0),
            Op::Attention { .. } => true,
            _ => false,
        };
        // Constants of elementwise ops broadcast along the rows; a linear's
        // or a norm's are its parameters.
        let elementwise = matches!(node.op, Op::Binary(_) | Op::Where | Op::Fused { .. });
        let shapes_ok = node.outputs.len() == 1
            && batch(out)
            && node.inputs.iter().zip(ops).all(|(&v, o)| match o {
                Operand::Const(_) if !elementwise => true,
                Operand::Const(_) => g.ty(v).rank() < rank || g.ty(v).shape.first().and_then(Dim::as_const) == Some(1),
                // A side input: the batch's rows, or broadcast along them.
                Operand::External(i) if *i != b.chain => {
                    batch(v) || g.ty(v).shape.first().and_then(Dim::as_const) == Some(1)
                }
                _ => batch(v),
            });
        op_ok && shapes_ok
    })
}

fn bytes_of(g: &Graph, v: ValueId) -> u64 {
    let ty = g.ty(v);
    ty.static_shape().map_or(0, |s| s.iter().product::<i64>().max(0) as u64) * ty.dtype.size_bytes() as u64
}

/// Bytes of the longest prefix and suffix every name shares (on character
/// boundaries, not overlapping within the shortest name).
fn common_ends(names: &[&String]) -> (usize, usize) {
    let first = names[0].as_str();
    let shortest = names.iter().map(|n| n.len()).min().unwrap_or(0);
    let shared = |len: usize, at_end: bool| {
        names.iter().all(|n| {
            let (a, b) = if at_end {
                (first.get(first.len() - len..), n.get(n.len() - len..))
            } else {
                (first.get(..len), n.get(..len))
            };
            a.is_some() && a == b
        })
    };
    let prefix = (0..=shortest).rev().find(|&l| shared(l, false)).unwrap_or(0);
    let suffix = (0..=shortest - prefix).rev().find(|&l| shared(l, true)).unwrap_or(0);
    (prefix, suffix)
}

/// `layers.{0..7}.fc1.weight`: a stacked weight named by its layers' origins.
fn stacked_name(names: &[&String]) -> String {
    let (prefix, suffix) = common_ends(names);
    let (first, last) = (names[0], names[names.len() - 1]);
    let mid = |n: &str| n[prefix..n.len() - suffix].to_string();
    format!("{}{{{}..{}}}{}", &first[..prefix], mid(first), mid(last), &first[first.len() - suffix..])
}

/// Finds the repeated blocks, checks the mesh, and stacks each weight slot
/// (see the module doc). `microbatches` 0 picks the largest count up to
/// twice the stages that divides the rows each device holds.
pub fn prepare(
    g: &mut Graph,
    mesh: &kiln_ir::Mesh,
    microbatches: u32,
    inline_max_elements: usize,
) -> Result<Pipeline, String> {
    let axis = mesh.axis(STAGE_AXIS).ok_or_else(|| {
        format!("--shard pipeline needs a mesh axis `{STAGE_AXIS}` (e.g. --mesh {STAGE_AXIS}=2); the mesh is [{mesh}]")
    })?;
    let stages = i64::from(axis.size);
    let blocks = find_blocks(g).ok_or_else(|| {
        "--shard pipeline: the program has no repeated structure (no run of at least two identical blocks, \
         each reading only the previous one's result, its own weights and shared constants)"
            .to_string()
    })?;
    let layers = blocks.len() as i64;
    let first = &blocks[0];
    let describe = |b: &Block| g.describe_node(b.nodes[0]);
    if layers % stages != 0 {
        return Err(format!(
            "--shard pipeline: {layers} repeated blocks of {} nodes (the first at {}) cannot be split evenly over \
             {stages} stages (mesh axis `{STAGE_AXIS}`={stages} does not divide {layers})",
            first.nodes.len(),
            describe(first)
        ));
    }
    let shape = g.ty(first.input).static_shape().ok_or_else(|| {
        format!("--shard pipeline: the activation entering the blocks at {} has a dynamic shape", describe(first))
    })?;
    let rows = *shape.first().ok_or_else(|| "--shard pipeline: the blocks' activation is a scalar".to_string())?;
    let row_wise = blocks.iter().all(|b| rows_independent(g, b, rows));

    // Weight slots: the constants of block 0 that differ in block 1.
    let mut slots: Vec<ValueId> = Vec::new();
    let mut shared: Vec<ValueId> = Vec::new();
    for (k, ops) in first.operands.iter().enumerate() {
        for (i, o) in ops.iter().enumerate() {
            let Operand::Const(c) = *o else { continue };
            let other = g.nodes[blocks[1].nodes[k]].inputs[i];
            let list = if other == c { &mut shared } else { &mut slots };
            if !list.contains(&c) {
                list.push(c);
            }
        }
    }
    // Each layer's name: its first weight's origin less the part every
    // layer's shares (`layers.3.norm.weight` → `layers.3`).
    let first_weight = |b: &Block| {
        let w = b.nodes.iter().flat_map(|&n| g.nodes[n].inputs.iter()).find(|&&v| g.const_of(v).is_some());
        w.and_then(|&w| g.values[w].attrs.origin.clone())
    };
    let origins: Vec<Option<String>> = blocks.iter().map(first_weight).collect();
    let names: Vec<String> = match origins.iter().map(Option::as_ref).collect::<Option<Vec<&String>>>() {
        Some(all) => {
            let (_, suffix) = common_ends(&all);
            all.iter().map(|o| o[..o.len() - suffix].to_string()).collect()
        }
        None => blocks.iter().map(describe).collect(),
    };
    let layer_weight_bytes: u64 = slots.iter().map(|&c| bytes_of(g, c)).sum();
    let flops: f64 = blocks.iter().flat_map(|b| b.nodes.iter()).map(|&n| node_flops(g, n)).sum();
    let block_nodes = first.nodes.len();

    // Stack every slot: [L, ...], each layer reading its piece back.
    let positions: Vec<Vec<(usize, usize)>> = slots
        .iter()
        .map(|&c| {
            first
                .operands
                .iter()
                .enumerate()
                .flat_map(|(k, ops)| ops.iter().enumerate().map(move |(i, o)| (k, i, o)))
                .filter(|(_, _, o)| **o == Operand::Const(c))
                .map(|(k, i, _)| (k, i))
                .collect()
        })
        .collect();
    let mut stacked = Vec::new();
    let mut new_order: Vec<NodeId> = Vec::new();
    let mut inserted: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for (slot, &c0) in slots.iter().enumerate() {
        let ty = g.ty(c0).clone();
        let dims = ty.static_shape().ok_or_else(|| format!("weight {c0} has a dynamic shape"))?;
        let mut data = Vec::new();
        let per_layer: Vec<ValueId> =
            blocks.iter().map(|b| g.nodes[b.nodes[positions[slot][0].0]].inputs[positions[slot][0].1]).collect();
        for &w in &per_layer {
            data.extend_from_slice(g.const_of(w).map(|c| c.bytes.as_bytes()).unwrap_or(&[]));
        }
        let mut big = vec![layers];
        big.extend(&dims);
        let layer_origins: Vec<Option<String>> = blocks
            .iter()
            .map(|b| g.values[g.nodes[b.nodes[positions[slot][0].0]].inputs[positions[slot][0].1]].attrs.origin.clone())
            .collect();
        let name =
            layer_origins.iter().map(Option::as_ref).collect::<Option<Vec<&String>>>().map(|all| stacked_name(&all));
        let s = g.add_const(None, TensorType::fixed(ty.dtype, &big), ConstBytes::owned(data));
        g.values[s].attrs.origin = name;
        g.values[s].attrs.sharding = Some(Sharding::split(big.len(), 0, STAGE_AXIS));
        stacked.push(s);
        for (l, b) in blocks.iter().enumerate() {
            let mut one = vec![1];
            one.extend(&dims);
            let l = l as i64;
            let slice = g.add_node(
                Op::Slice { axis: 0, start: l, end: l + 1, step: 1 },
                vec![s],
                vec![TensorType::fixed(ty.dtype, &one)],
                None,
            );
            let sv = g.nodes[slice].outputs[0];
            let reshape = g.add_node(
                Op::Reshape { shape: dims.iter().map(|&d| Dim::Const(d)).collect() },
                vec![sv],
                vec![ty.clone()],
                None,
            );
            let w = g.nodes[reshape].outputs[0];
            for &(k, i) in &positions[slot] {
                g.nodes[b.nodes[k]].inputs[i] = w;
            }
            inserted.entry(b.nodes[0]).or_default().extend([slice, reshape]);
        }
    }
    // Schedule the slices right before their layer.
    let added: Vec<NodeId> = inserted.values().flatten().copied().collect();
    let mut span = Vec::new();
    let layer_nodes: std::collections::HashSet<NodeId> = blocks.iter().flat_map(|b| b.nodes.iter().copied()).collect();
    for &n in &g.order {
        if added.contains(&n) {
            continue;
        }
        if let Some(pre) = inserted.get(&n) {
            new_order.extend(pre);
            span.extend(pre);
        }
        new_order.push(n);
        if layer_nodes.contains(&n) {
            span.push(n);
        }
    }
    g.order = new_order;
    let shared = shared
        .into_iter()
        .filter(|&c| bytes_of(g, c) / g.ty(c).dtype.size_bytes() as u64 > inline_max_elements as u64)
        .collect();
    let side: Vec<ValueId> =
        first.externals.iter().enumerate().filter(|&(i, _)| i != first.chain).map(|(_, &v)| v).collect();
    let (input, output, first_out) = (first.input, blocks[blocks.len() - 1].output, first.output);
    Ok(Pipeline {
        axis: STAGE_AXIS.to_string(),
        stages,
        layers,
        microbatches: i64::from(microbatches),
        block_nodes,
        span,
        input,
        output,
        first_output: first_out,
        rows,
        template: None,
        stacked,
        shared,
        side_batched: side.iter().map(|&v| g.ty(v).shape.first().and_then(Dim::as_const) == Some(rows)).collect(),
        side,
        local_rows: rows,
        microbatch_rows: rows,
        sharding: Sharding::replicated(shape.len()),
        row_wise,
        layer_names: names,
        layer_weight_bytes,
        activation_bytes: bytes_of(g, input),
        result_bytes: bytes_of(g, output),
        flops,
    })
}

impl Pipeline {
    /// After propagation: the activation's sharding (batch over other axes
    /// only), the microbatches, and the template layer.
    pub fn finish(&mut self, g: &Graph, mesh: &kiln_ir::Mesh) -> Result<(), String> {
        let rank = g.ty(self.input).rank();
        let s = g.values[self.input].attrs.sharding.clone().unwrap_or_else(|| Sharding::replicated(rank));
        if !s.partial.is_empty() || s.dims.iter().skip(1).any(|d| !d.is_empty()) || s.axes().any(|a| a == self.axis) {
            return Err(format!(
                "--shard pipeline: the activation entering the blocks is sharded {s}; only its batch (dim 0) may be \
                 split, over axes other than `{}`",
                self.axis
            ));
        }
        let rows = self.local_rows / s.pieces(mesh, 0) as i64;
        if rows != self.local_rows && !self.row_wise {
            return Err(format!(
                "--shard pipeline: the batch is split over {:?}, but the repeated block does not treat batch rows \
                 independently; drop the data axis",
                s.dims[0]
            ));
        }
        let m = match self.microbatches {
            // Microbatches of at least two rows where the rows allow: XLA:CPU
            // multiplies a one-row microbatch by its matrix-vector code,
            // which rounds differently from one device's matrix product.
            0 if self.row_wise => (1..=(2 * self.stages).min(rows))
                .rev()
                .find(|m| rows % m == 0 && (rows / m >= 2 || rows < 2))
                .unwrap_or(1),
            0 => 1,
            m if m > 1 && !self.row_wise => {
                return Err(format!(
                    "--microbatches {m}: the repeated block does not treat batch rows independently (an op outside \
                     elementwise, linear, norm, softmax and reductions over later dims, or a value whose dim 0 is \
                     not the batch), so the batch cannot be cut; use --microbatches 1"
                ))
            }
            m if rows % m != 0 => {
                return Err(format!(
                "--microbatches {m} does not divide the {rows} batch rows each device holds (the activation's dim 0)"
            ))
            }
            m => m,
        };
        self.local_rows = rows;
        self.microbatches = m;
        self.microbatch_rows = rows / m;
        self.sharding = s;
        self.template = Some(Region::new(self.build_template(g)?));
        Ok(())
    }

    /// One layer over one microbatch, types inferred afresh.
    fn build_template(&self, g: &Graph) -> Result<Graph, String> {
        let mut t = Graph::new();
        t.symbols = g.symbols.clone();
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        let act = g.ty(self.input);
        let mut shape = act.shape.clone();
        shape[0] = Dim::Const(self.microbatch_rows);
        map.insert(self.input, t.add_input("act", TensorType::new(act.dtype, shape)));
        // The first layer's nodes (after the slices, which the template's
        // inputs replace: the reshape's result is the weight).
        let per_layer = self.span.len() / self.layers as usize;
        let first = &self.span[..per_layer];
        let mut weights: Vec<(usize, ValueId)> = Vec::new();
        for &n in first {
            if let Op::Reshape { .. } = g.nodes[n].op {
                let src = g.nodes[n].inputs[0];
                let slice_in = g.producer(src).map(|p| g.nodes[p].inputs[0]);
                if let Some(slot) = slice_in.and_then(|s| self.stacked.iter().position(|&x| x == s)) {
                    weights.push((slot, g.nodes[n].outputs[0]));
                }
            }
        }
        weights.sort_by_key(|w| w.0);
        for (slot, w) in &weights {
            map.insert(*w, t.add_input(format!("w{slot}"), g.ty(*w).clone()));
        }
        for &c in &self.shared {
            map.insert(c, t.add_input(format!("shared{c}"), g.ty(c).clone()));
        }
        for (&v, &batched) in self.side.iter().zip(&self.side_batched) {
            let mut ty = g.ty(v).clone();
            if batched {
                ty.shape[0] = Dim::Const(self.microbatch_rows);
            }
            map.insert(v, t.add_input(format!("side{v}"), ty));
        }
        for &n in first {
            let node = &g.nodes[n];
            if weights.iter().any(|w| node.outputs.contains(&w.1))
                || (matches!(node.op, Op::Slice { .. }) && self.stacked.contains(&node.inputs[0]))
            {
                continue;
            }
            let mut inputs = Vec::new();
            for &v in &node.inputs {
                let m = match map.get(&v) {
                    Some(&m) => m,
                    None => match g.values[v].def {
                        ValueDef::Const(c) => {
                            let cd = &g.consts[c];
                            let m = t.add_const(None, g.ty(v).clone(), cd.bytes.clone());
                            map.insert(v, m);
                            m
                        }
                        _ => {
                            return Err(format!(
                                "pipeline template: operand {v} of {} is not in the layer",
                                g.describe_node(n)
                            ))
                        }
                    },
                };
                inputs.push(m);
            }
            // A row-wise block's reshapes name the batch: a microbatch's rows.
            let op = match &node.op {
                Op::Reshape { shape } if self.row_wise => {
                    let mut shape = shape.clone();
                    shape[0] = Dim::Const(self.microbatch_rows);
                    Op::Reshape { shape }
                }
                op => op.clone(),
            };
            let types: Vec<&TensorType> = inputs.iter().map(|&v| t.ty(v)).collect();
            let out_types = kiln_ir::infer::infer_types(&t.symbols, &op, &types).map_err(|e| {
                format!(
                    "--shard pipeline: {} on a microbatch of {} rows: {e}",
                    g.describe_node(n),
                    self.microbatch_rows
                )
            })?;
            let nn = t.add_node(op, inputs, out_types, None);
            for (&a, &b) in node.outputs.iter().zip(&t.nodes[nn].outputs.clone()) {
                map.insert(a, b);
            }
        }
        let out = self.first_output;
        let o =
            *map.get(&out).ok_or_else(|| "pipeline template: the first layer's result is not mapped".to_string())?;
        t.add_output("out", o);
        Ok(t)
    }

    /// Bubble fraction of the schedule: `(N − 1) / (M + N − 1)`.
    pub fn bubble(&self) -> f64 {
        (self.stages - 1) as f64 / (self.microbatches + self.stages - 1) as f64
    }

    /// Weight bytes each stage holds.
    pub fn stage_weight_bytes(&self) -> u64 {
        self.layer_weight_bytes * (self.layers / self.stages) as u64
    }

    /// The region's collectives with the bytes each device sends per step:
    /// a `collective_permute` of one microbatch's activation between
    /// consecutive steps, and the last stage's result gathered.
    pub fn collectives(&self) -> Vec<ManualCollective> {
        let rows = self.rows.max(1) as u64;
        let mb_bytes = self.activation_bytes / rows * self.microbatch_rows as u64;
        let steps = (self.microbatches + self.stages - 2) as u64;
        let result = self.result_bytes / rows * self.local_rows as u64;
        vec![
            ManualCollective {
                collective: Collective::CollectivePermute,
                axis: self.axis.clone(),
                what: format!(
                    "activations stage to stage over `{}` ({steps} steps of one {}-row microbatch, {mb_bytes} B \
                     each; B each device sends)",
                    self.axis, self.microbatch_rows
                ),
                bytes_per_device: steps * mb_bytes,
            },
            ManualCollective {
                collective: Collective::AllGather,
                axis: self.axis.clone(),
                what: format!(
                    "the last stage's result to every stage over `{}` ({} rows; B each device sends)",
                    self.axis, self.local_rows
                ),
                bytes_per_device: result,
            },
        ]
    }

    /// FLOPs one device computes for the region: its `L / N` layers on
    /// every one of the `M + N − 1` steps' microbatches.
    pub fn device_flops(&self) -> f64 {
        let per_layer_row = self.flops / self.layers as f64 / self.rows.max(1) as f64;
        per_layer_row
            * (self.layers / self.stages) as f64
            * self.microbatch_rows as f64
            * (self.microbatches + self.stages - 1) as f64
    }

    /// Report lines: the stage assignment, per-stage weight memory, bytes
    /// moved per step and the bubble.
    pub fn lines(&self) -> Vec<String> {
        let per = (self.layers / self.stages) as usize;
        let mut out = vec![format!(
            "  pipeline over `{}`: {} repeated blocks of {} nodes, {per} per stage; {} microbatches of {} rows \
             ({} rows per device); {} steps, bubble {:.1}% of them",
            self.axis,
            self.layers,
            self.block_nodes,
            self.microbatches,
            self.microbatch_rows,
            self.local_rows,
            self.microbatches + self.stages - 1,
            100.0 * self.bubble()
        )];
        for s in 0..self.stages as usize {
            let names = &self.layer_names[s * per..(s + 1) * per];
            out.push(format!(
                "    stage {s}: layers {}..{} ({} .. {}), weights {} B",
                s * per,
                (s + 1) * per - 1,
                names[0],
                names[per - 1],
                self.stage_weight_bytes()
            ));
        }
        let moved: u64 = self.collectives().iter().map(|c| c.bytes_per_device).sum();
        out.push(format!("    bytes moved per step and device: {moved} B (permutes and the final gather)"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Mesh;

    /// `x -> [linear, relu] × layers -> linear`: weights `w_i`, biases `b_i`
    /// and a shared constant `s` (the same value in every block).
    fn stack(layers: usize) -> Graph {
        stack_with(layers, "const %1 \"s\": f32[2] = [1.0, 2.0]")
    }

    /// [`stack`] with `%1` declared by `one`: a constant, or an input every
    /// block reads (a side input).
    fn stack_with(layers: usize, one: &str) -> Graph {
        let mut t = format!("graph {{\n  input %0 \"x\": f32[4, 2]\n  {one}\n");
        let mut v = 2;
        let mut act = 0;
        for l in 0..layers {
            let w = format!("[{}.0, 0.5, -1.0, {}.0]", l + 1, l);
            t.push_str(&format!("  const %{v} \"w{l}\": f32[2, 2] = {w}\n"));
            t.push_str(&format!("  const %{} \"b{l}\": f32[2] = [0.{l}, -0.{l}]\n", v + 1));
            t.push_str(&format!("  %{}: f32[4, 2] = linear(%{act}, %{v}, %{})\n", v + 2, v + 1));
            t.push_str(&format!("  %{}: f32[4, 2] = mul(%{}, %1)\n", v + 3, v + 2));
            t.push_str(&format!("  %{}: f32[4, 2] = relu(%{})\n", v + 4, v + 3));
            act = v + 4;
            v += 5;
        }
        t.push_str(&format!("  %{v}: f32[4, 2] = linear(%{act}, %2)\n  output %{v} \"y\"\n}}\n"));
        kiln_ir::text::parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"))
    }

    #[test]
    fn finds_the_blocks_and_stacks_their_weights() {
        let mut g = stack(4);
        let mesh = Mesh::new(&[("stage", 2)]);
        g.mesh = Some(mesh.clone());
        let mut p = prepare(&mut g, &mesh, 0, 64).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.layers, p.block_nodes, p.stacked.len(), p.shared.len()), (4, 3, 2, 0));
        // Per layer: two slices and two reshapes, then its three nodes.
        assert_eq!(p.span.len(), 4 * 7);
        assert_eq!(g.ty(p.stacked[0]).static_shape(), Some(vec![4, 2, 2]));
        kiln_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{e}"));
        p.finish(&g, &mesh).unwrap_or_else(|e| panic!("{e}"));
        // Four rows over two stages: two microbatches of two rows (the
        // default keeps two rows or more).
        assert_eq!((p.microbatches, p.microbatch_rows, p.local_rows), (2, 2, 4));
        assert!((p.bubble() - 1.0 / 3.0).abs() < 1e-12);
        let t = p.template.as_deref().unwrap_or_else(|| panic!("no template"));
        assert_eq!((t.inputs.len(), t.order.len()), (3, 3));
        assert_eq!(t.ty(t.outputs[0]).static_shape(), Some(vec![2, 2]));
        // Stage weights: two layers of 4 + 2 floats.
        assert_eq!(p.stage_weight_bytes(), 2 * 6 * 4);
        let c = p.collectives();
        // 2 + 2 - 2 permutes of one 2-row microbatch (16 B); the 4-row result gathered.
        assert_eq!((c[0].bytes_per_device, c[1].bytes_per_device), (2 * 16, 32));
    }

    /// A value every block reads from before the run is a side input: with
    /// the batch's rows it is cut into microbatches too.
    #[test]
    fn side_inputs_follow_the_microbatches() {
        let mut g = stack_with(4, "input %1 \"m\": f32[4, 2]");
        let mesh = Mesh::new(&[("stage", 2)]);
        g.mesh = Some(mesh.clone());
        let mut p = prepare(&mut g, &mesh, 4, 64).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.side.len(), p.side_batched.as_slice()), (1, &[true][..]));
        p.finish(&g, &mesh).unwrap_or_else(|e| panic!("{e}"));
        let t = p.template.as_deref().unwrap_or_else(|| panic!("no template"));
        // The activation, two weights, the side input: a one-row microbatch of it.
        assert_eq!(t.inputs.len(), 4);
        assert_eq!(t.ty(t.inputs[3]).static_shape(), Some(vec![1, 2]));
    }

    #[test]
    fn refuses_what_cannot_be_staged() {
        let mesh3 = Mesh::new(&[("stage", 3)]);
        let e = prepare(&mut stack(4), &mesh3, 0, 64).err().unwrap_or_default();
        assert!(e.contains("4 repeated blocks of 3 nodes") && e.contains("does not divide 4"), "{e}");
        let e = prepare(&mut stack(4), &Mesh::new(&[("model", 2)]), 0, 64).err().unwrap_or_default();
        assert!(e.contains("needs a mesh axis `stage`"), "{e}");
        let e = prepare(&mut stack(1), &Mesh::new(&[("stage", 2)]), 0, 64).err().unwrap_or_default();
        assert!(e.contains("no repeated structure"), "{e}");
        let mesh = Mesh::new(&[("stage", 2)]);
        let mut g = stack(4);
        let mut p = prepare(&mut g, &mesh, 3, 64).unwrap_or_else(|e| panic!("{e}"));
        let e = p.finish(&g, &mesh).err().unwrap_or_default();
        assert!(e.contains("--microbatches 3 does not divide the 4 batch rows"), "{e}");
    }
}
