//! Splitting the scheduled graph into accelerator segments and CPU nodes.
//!
//! A segment is a maximal run of nodes, contiguous in the schedule, that all
//! have a StableHLO lowering ([`why_not_lowerable`]) and fully static shapes.
//! Contiguity keeps the plan a flat list of instructions: a segment becomes one
//! `Kernel::Accel` instruction exactly where its first node was scheduled.
//! Everything else stays a CPU instruction, with the reason recorded for
//! `kiln inspect`.

use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, PoolKind, ReduceKind, UnaryOp, ValueDef, ValueId};
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

/// Partitions `g.order`. `forced_cpu` holds nodes the emitter could not lower
/// after all (with its reason); they are kept on the CPU.
pub fn partition(g: &Graph, forced_cpu: &HashMap<NodeId, String>) -> Partition {
    let uses = Uses::new(g);
    let mut p = Partition::default();
    let mut run: Vec<NodeId> = Vec::new();
    for &n in &g.order {
        let why = forced_cpu.get(&n).cloned().or_else(|| why_not_lowerable(g, n));
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

/// Why node `n` cannot run in an accelerator segment, or `None` when it can.
/// Must agree with what `emit` lowers; anything `emit` still rejects is
/// reported back and forced onto the CPU (see `compile`).
pub fn why_not_lowerable(g: &Graph, n: NodeId) -> Option<String> {
    let node = &g.nodes[n];
    match node.op {
        Op::BindDim { symbol } => {
            return Some(format!(
                "binds `{}` from run-time data (the CPU session owns the shapes)",
                g.symbols[symbol].name
            ))
        }
        Op::NonZero { .. } => return Some("data-dependent output size (nonzero)".into()),
        // The CPU session runs loops (jumps in its instruction stream); a
        // stablehlo.while is possible but not emitted yet.
        Op::While { .. } => return Some("a loop (while_loop): its condition and body run on the CPU".into()),
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
    match &node.op {
        Op::Unary(u) => match (u, in0) {
            (UnaryOp::Not | UnaryOp::BitNot, Some(DType::Bool)) => None,
            (UnaryOp::BitNot, Some(d)) if d.is_int() => None,
            // StableHLO's abs and sign take signless integers only: u8 stays on the CPU.
            (UnaryOp::Abs | UnaryOp::Sign, Some(DType::U8)) => no("abs/sign on an unsigned integer"),
            (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu, Some(d)) if d.is_int() => None,
            // XLA's f64 erf is not accurate to f64 (gelu uses it): kiln's CPU kernel is.
            (UnaryOp::Erf | UnaryOp::Gelu, Some(DType::F64)) => {
                no("f64 erf/gelu (XLA's approximation is not f64-accurate)")
            }
            (UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc, Some(d)) if d.is_int() => None,
            (u, Some(d)) if d.is_float() && LOWERED_UNARY.contains(u) => None,
            _ => no(&format!("op {} on {:?}", kiln_ir::unary_name(*u), in0)),
        },
        Op::Binary(b) => match b {
            BinaryOp::FloorDiv | BinaryOp::Rem | BinaryOp::Fmod if !in0.is_some_and(|d| d.is_float() || d.is_int()) => {
                no(&format!("op {} on {:?}", kiln_ir::binary_name(*b), in0))
            }
            BinaryOp::Pow if !in0.is_some_and(|d| d.is_float()) => no("op pow on integers"),
            BinaryOp::Div if !in0.is_some_and(|d| d.is_float()) => no("op div on integers"),
            BinaryOp::Atan2 if !in0.is_some_and(|d| d.is_float()) => no("op atan2 on integers"),
            b if LOWERED_BINARY.contains(b) => None,
            b => no(&format!("op {}", kiln_ir::binary_name(*b))),
        },
        Op::Where | Op::Cast { .. } | Op::MatMul | Op::Linear | Op::Reshape { .. } | Op::Expand { .. } => None,
        Op::Permute { .. } | Op::Concat { .. } | Op::Full { .. } | Op::Arange { .. } => None,
        Op::Clamp { .. } => None,
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
        Op::BatchNorm { .. } | Op::LayerNorm { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. } => {
            if in0.is_some_and(|d| d.is_float()) {
                None
            } else {
                no("a normalisation on a non-float tensor")
            }
        }
        Op::Reduce { kind, .. } => match in0 {
            Some(d) if d.is_float() || d.is_int() => None,
            // any / all.
            Some(DType::Bool) if matches!(kind, ReduceKind::Max | ReduceKind::Min) => None,
            _ => no(&format!("{} over {:?}", node.op.name(), in0)),
        },
        Op::ArgMax { .. } | Op::ArgMin { .. } => None,
        Op::Pool { kind: PoolKind::ArgMax, .. } => no("max pooling's indices (a CPU kernel only)"),
        Op::Pool { stride, dilation, .. } => {
            let ok =
                stride.iter().all(|&s| s > 0) && dilation.iter().all(|&d| d > 0) && in0.is_some_and(|d| d.is_float());
            if ok {
                None
            } else {
                no("pooling with these parameters")
            }
        }
        Op::AdaptiveAvgPool { .. } => {
            no("op adaptive_avg_pool (decomposed for every target unless sizes are symbolic)")
        }
        Op::Attention { .. } => {
            let batch = |v: ValueId| {
                let s = &g.ty(v).shape;
                s[..s.len().saturating_sub(2)].to_vec()
            };
            let same_batch = node.inputs.len() >= 3
                && batch(node.inputs[0]) == batch(node.inputs[1])
                && batch(node.inputs[1]) == batch(node.inputs[2]);
            if same_batch && in0.is_some_and(|d| d.is_float()) {
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
        Op::CumSum { .. } => {
            if in0.is_some_and(|d| d.is_float() || d.is_int()) {
                None
            } else {
                no("cumsum on bool")
            }
        }
        Op::Flip { .. } => None,
        // Lowered to stablehlo.gather (negative indices wrapped; out-of-range
        // ones are clamped there, where the CPU kernel reports an error).
        Op::IndexGather { .. } | Op::GatherElements { .. } => {
            if node.inputs.iter().skip(1).all(|&v| dt(v).is_int()) {
                None
            } else {
                no("indexing with non-integer indices")
            }
        }
        Op::Pad { mode: kiln_ir::PadMode::Constant, interior, .. } if interior.iter().all(|&i| i >= 0) => None,
        Op::Pad { mode, .. } => no(&format!("pad mode {mode:?}")),
        // Ops added to the IR after this lowering was written (sort, upsample,
        // the element-wise gather/scatter and advanced-indexing ops: CPU kernels only).
        #[allow(unreachable_patterns)]
        op => no(&format!("op {}", op.name())),
    }
}

/// Unary ops `emit` lowers on floats.
const LOWERED_UNARY: &[UnaryOp] = &[
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Reciprocal,
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Silu,
    UnaryOp::Erf,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
    UnaryOp::Sign,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Trunc,
    UnaryOp::Tan,
    UnaryOp::Asin,
    UnaryOp::Acos,
    UnaryOp::Atan,
    UnaryOp::Sinh,
    UnaryOp::Cosh,
    UnaryOp::Asinh,
    UnaryOp::Acosh,
    UnaryOp::Atanh,
    UnaryOp::Log2,
    UnaryOp::Log10,
];

/// Binary ops `emit` lowers (dtype restrictions are checked separately).
const LOWERED_BINARY: &[BinaryOp] = &[
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::FloorDiv,
    BinaryOp::Rem,
    BinaryOp::Pow,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Eq,
    BinaryOp::Ne,
    BinaryOp::Lt,
    BinaryOp::Le,
    BinaryOp::Gt,
    BinaryOp::Ge,
    BinaryOp::And,
    BinaryOp::Or,
    BinaryOp::Xor,
    BinaryOp::Atan2,
    BinaryOp::Fmod,
];
