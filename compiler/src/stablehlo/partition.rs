//! Splitting the scheduled graph into accelerator segments and CPU nodes.
//!
//! A segment is a maximal run of nodes, contiguous in the schedule, that all
//! have a StableHLO lowering ([`why_not_lowerable`]) and fully static shapes.
//! Which ops and dtypes have one is the target description's segment table
//! ([`TargetDesc::segments`], the same object the passes consulted); the
//! limits on parameters, index operands and shapes are checked here.
//! Contiguity keeps the plan a flat list of instructions: a segment becomes one
//! `InstrOp::Delegate` instruction exactly where its first node was scheduled.
//! Everything else stays a CPU instruction, with the reason recorded for
//! `kiln inspect`.

use kiln_ir::{DType, Graph, NodeId, Op, PadMode, ValueDef, ValueId};
use kiln_passes::{data_dtype, OpKind, OpTable, Target, TargetDesc};
use std::collections::{HashMap, HashSet};

/// One accelerator call: nodes in schedule order, the values it reads from
/// outside (graph inputs, constants, earlier nodes' outputs) and the values it
/// defines that are used after it or are graph outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub nodes: Vec<NodeId>,
    pub args: Vec<ValueId>,
    pub results: Vec<ValueId>,
}

#[derive(Clone, Debug, Default)]
pub struct Partition {
    pub segments: Vec<Segment>,
    /// Nodes left on the CPU, with the reason.
    pub cpu: Vec<(NodeId, String)>,
}

/// Partitions `g.order` for the PJRT target. `forced_cpu` holds nodes the
/// emitter could not lower after all (with its reason); they are kept on the CPU.
pub fn partition(g: &Graph, forced_cpu: &HashMap<NodeId, String>) -> Partition {
    partition_for(Target::Pjrt.desc(), g, forced_cpu)
}

/// [`partition`] for the segments `target` describes (none: every node stays
/// on the CPU).
pub fn partition_for(target: &TargetDesc, g: &Graph, forced_cpu: &HashMap<NodeId, String>) -> Partition {
    let uses = Uses::new(g);
    let mut p = Partition::default();
    let mut run: Vec<NodeId> = Vec::new();
    for &n in &g.order {
        let why = forced_cpu.get(&n).cloned().or_else(|| why_not_lowerable(target, g, n));
        match why {
            None => run.push(n),
            Some(reason) => {
                close_run(g, &uses, &mut run, &mut p);
                p.cpu.push((n, reason));
            }
        }
    }
    close_run(g, &uses, &mut run, &mut p);
    p
}

/// Where each value is last used: a schedule position, or `usize::MAX` for
/// graph outputs (used after everything).
struct Uses {
    position: HashMap<NodeId, usize>,
    last_use: HashMap<ValueId, usize>,
}

impl Uses {
    fn new(g: &Graph) -> Uses {
        let mut last_use = HashMap::new();
        let mut position = HashMap::new();
        for (i, &n) in g.order.iter().enumerate() {
            position.insert(n, i);
            for &v in &g.nodes[n].inputs {
                last_use.insert(v, i);
            }
        }
        for &o in &g.outputs {
            last_use.insert(o, usize::MAX);
        }
        Uses { position, last_use }
    }
}

fn close_run(g: &Graph, uses: &Uses, run: &mut Vec<NodeId>, p: &mut Partition) {
    if run.is_empty() {
        return;
    }
    let nodes = std::mem::take(run);
    let seg = segment_io(g, uses, nodes);
    if seg.results.is_empty() {
        // Dead code that DCE did not see (cannot happen after the pipeline);
        // running it on the CPU keeps the plan honest rather than dropping nodes.
        for n in seg.nodes {
            p.cpu.push((n, "segment without results".into()));
        }
        return;
    }
    p.segments.push(seg);
}

/// A segment's arguments and results. The nodes are contiguous in the
/// schedule and every use follows its definition, so a value defined inside is
/// a result exactly when it is used after the segment's last node (or is a
/// graph output).
fn segment_io(g: &Graph, uses: &Uses, nodes: Vec<NodeId>) -> Segment {
    let inside: HashSet<NodeId> = nodes.iter().copied().collect();
    let defined_inside = |v: ValueId| matches!(g.values[v].def, ValueDef::Node { node, .. } if inside.contains(&node));
    let end = nodes.last().and_then(|n| uses.position.get(n)).copied().unwrap_or(0);
    let (mut args, mut results) = (Vec::new(), Vec::new());
    let mut seen: HashSet<ValueId> = HashSet::new();
    for &n in &nodes {
        for &i in &g.nodes[n].inputs {
            if !defined_inside(i) && seen.insert(i) {
                args.push(i);
            }
        }
        for &o in &g.nodes[n].outputs {
            if uses.last_use.get(&o).is_some_and(|&u| u > end) && seen.insert(o) {
                results.push(o);
            }
        }
    }
    Segment { nodes, args, results }
}

/// Why node `n` cannot run in one of `target`'s accelerator segments, or
/// `None` when it can. The segment table must agree with what `emit` lowers;
/// anything `emit` still rejects is reported back and forced onto the CPU
/// (see `driver`).
pub fn why_not_lowerable(target: &TargetDesc, g: &Graph, n: NodeId) -> Option<String> {
    let Some(segments) = target.segments else {
        return Some(format!("target `{}` has no accelerator segments", target.target));
    };
    let node = &g.nodes[n];
    match node.op {
        Op::BindDim { symbol } => {
            return Some(format!(
                "binds `{}` from run-time data (the CPU session owns the shapes)",
                g.symbols[symbol].name
            ))
        }
        Op::NonZero { .. } => return Some("data-dependent output size (nonzero)".into()),
        // A loop becomes one stablehlo.while when everything in its
        // condition and body can run in a segment.
        Op::While { ref cond, ref body, .. } => {
            for (what, region) in [("condition", cond), ("body", body)] {
                for &m in &region.order {
                    if let Some(why) = why_not_lowerable(target, region, m) {
                        return Some(format!(
                            "a loop (while_loop) whose {what} holds {}: {why}",
                            region.describe_node(m)
                        ));
                    }
                }
                if region.inputs.iter().chain(&region.outputs).any(|&v| region.ty(v).static_shape().is_none()) {
                    return Some(format!("a loop (while_loop) whose {what} has a dynamic shape"));
                }
            }
        }
        _ => {}
    }
    for &v in node.inputs.iter().chain(&node.outputs) {
        if g.ty(v).static_shape().is_none() {
            let mut used = Vec::new();
            g.ty(v).shape.iter().for_each(|d| d.collect_symbols(&mut used));
            let data_dependent = g.data_dependent_symbols();
            if let Some(s) = used.iter().find(|s| data_dependent.contains(s)) {
                return Some(format!("shape depends on run-time data (`{}`)", g.symbols[*s].name));
            }
            return Some("dynamic shape (StableHLO segments are compiled for static shapes)".into());
        }
    }
    let no = |what: &str| Some(format!("no StableHLO lowering for {what}"));
    let dt = |v: ValueId| g.ty(v).dtype;
    let in0 = node.inputs.first().map(|&v| dt(v));
    let kind = OpKind::of(&node.op);
    if !segments.takes(kind, data_dtype(g, node)) {
        return no(&unsupported(segments, kind, node.op.name(), in0));
    }
    // What the table does not say: limits on parameters and index operands.
    match &node.op {
        Op::Conv { stride, padding, dilation, groups } => {
            let ok = stride.iter().all(|&s| s > 0)
                && padding.iter().all(|&p| p >= 0)
                && dilation.iter().all(|&d| d > 0)
                && *groups > 0;
            if ok {
                None
            } else {
                no("conv with these parameters")
            }
        }
        Op::Pool { stride, dilation, .. } => {
            if stride.iter().all(|&s| s > 0) && dilation.iter().all(|&d| d > 0) {
                None
            } else {
                no("pooling with these parameters")
            }
        }
        Op::Attention { .. } => {
            let batch = |v: ValueId| {
                let s = &g.ty(v).shape;
                s[..s.len().saturating_sub(2)].to_vec()
            };
            // k and v may share q's heads (batch dims of size 1: the
            // emitter broadcasts them); anything else stays on the CPU.
            let fits = |v: ValueId| {
                let (q, x) = (batch(node.inputs[0]), batch(v));
                q.len() == x.len() && q.iter().zip(&x).all(|(a, b)| a == b || b.as_const() == Some(1))
            };
            if node.inputs.len() >= 3 && fits(node.inputs[1]) && fits(node.inputs[2]) {
                None
            } else {
                no("attention with broadcast batch dims")
            }
        }
        Op::Slice { step, .. } => {
            if *step > 0 {
                None
            } else {
                no("slice with a non-positive step")
            }
        }
        Op::Gather { .. } => match node.inputs.get(1).map(|&v| dt(v)) {
            Some(d) if d.is_int() => None,
            _ => no("gather with non-integer indices"),
        },
        Op::IndexGather { .. } | Op::GatherElements { .. } => {
            if node.inputs.iter().skip(1).all(|&v| dt(v).is_int()) {
                None
            } else {
                no("indexing with non-integer indices")
            }
        }
        Op::IndexPut { .. } => {
            if node.inputs.iter().skip(2).all(|&v| dt(v).is_int()) {
                None
            } else {
                no("index_put with non-integer indices")
            }
        }
        Op::ScatterElements { reduce: Some(kiln_ir::ReduceKind::Mean), .. } => no("scatter_reduce mean"),
        Op::ScatterElements { .. } => match node.inputs.get(1).map(|&v| dt(v)) {
            Some(d) if d.is_int() => None,
            _ => no("scatter with non-integer indices"),
        },
        Op::Pad { mode: PadMode::Constant, interior, .. } if interior.iter().all(|&i| i >= 0) => None,
        Op::Pad { mode, .. } => no(&format!("pad mode {mode:?}")),
        _ => None,
    }
}

/// Why the segment table does not take op `kind` (named `name`) on data of
/// `in0`: the table's reason, else one that names the op and the dtype.
fn unsupported(segments: &OpTable, kind: OpKind, name: &str, in0: Option<DType>) -> String {
    if let Some(why) = segments.why_not(kind, in0) {
        return why.to_string();
    }
    match kind {
        OpKind::Reduce(_) => format!("{name} over {in0:?}"),
        OpKind::Unary(_) => format!("op {name} on {in0:?}"),
        _ if segments.row(kind).is_some() => format!("op {name} on {in0:?}"),
        _ => format!("op {name}"),
    }
}
