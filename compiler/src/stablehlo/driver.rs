//! From a graph after the pass pipeline to a mixed plan: partition, emit each
//! segment, plan memory with every segment seen as one instruction, lower.

use super::buckets::{bucket_sizes, padding_problem, specialize, BucketSpec};
use super::emit::{emit_segment_with, new_context, Emitted};
use super::masks::mask_padding;
use super::partition::{partition, Partition};
use super::sharding::{mesh_decl, tensor_sharding, SpmdEmit};
use super::Precision;
use crate::lower::{lower_to_plan_with_segments, AccelCall, LowerError};
use kiln_ir::{ConstBytes, DType, Graph, NodeData, NodeId, Op, SymbolId, TensorType, ValueId};
use kiln_passes::{check_plan, plan_memory, MemoryOptions};
use kiln_runtime::format::{
    AccelBucket, AccelProgram, AccelSegment, CpuFallback, IndexCheck, IndexKernel, Plan, WeightsBuilder,
};
use std::collections::HashMap;

pub struct PjrtLowering {
    pub plan: Plan,
    pub weights: WeightsBuilder,
    pub accel: AccelProgram,
}

/// Lowers `g` (after the pass pipeline) for the PJRT target. Adds bf16 copies
/// of weights to `g` with [`Precision::Bf16`].
pub fn lower_for_pjrt(g: &mut Graph, precision: Precision) -> Result<PjrtLowering, LowerError> {
    lower_for_pjrt_sharded(g, precision, None)
}

/// [`lower_for_pjrt`] for an SPMD program when `spmd` is given (`g` has a
/// mesh and shardings from `kiln_passes::shard`): the whole program must be
/// one segment, annotated for XLA's partitioner; the accelerator section
/// records the mesh and every argument's and result's sharding.
pub fn lower_for_pjrt_sharded(
    g: &mut Graph,
    precision: Precision,
    spmd: Option<&SpmdEmit>,
) -> Result<PjrtLowering, LowerError> {
    lower_for_pjrt_with(g, precision, spmd, None)
}

/// [`lower_for_pjrt_sharded`], plus shape buckets when `buckets` is given
/// (see [`super::buckets`]): the plan stays the symbolic CPU plan (with any
/// static segments), run for sizes past the largest bucket.
pub fn lower_for_pjrt_with(
    g: &mut Graph,
    precision: Precision,
    spmd: Option<&SpmdEmit>,
    buckets: Option<&BucketSpec>,
) -> Result<PjrtLowering, LowerError> {
    if buckets.is_some() && (spmd.is_some() || precision != Precision::F32) {
        return Err(LowerError(vec!["--buckets is built for f32 programs on one device (no --mesh, no bf16)".into()]));
    }
    super::loop_consts::hoist_loop_constants(g, super::INLINE_CONST_MAX_ELEMENTS);
    let ctx = new_context();
    let (part, mut emitted) = partition_and_emit(&ctx, g, precision, spmd)?;
    if spmd.is_some() {
        check_single_segment(g, &part)?;
    }
    if precision == Precision::Bf16 {
        substitute_bf16_weights(g, &mut emitted);
    }
    let calls: Vec<AccelCall> = part
        .segments
        .iter()
        .zip(&emitted)
        .map(|(s, e)| AccelCall { nodes: s.nodes.clone(), args: e.args.clone(), results: e.results.clone() })
        .collect();

    // Memory is planned on a copy where each segment is one node reading its
    // args and defining its results: their lifetimes then span the whole call
    // (the loader rejects an instruction whose outputs overlap its inputs), and
    // values internal to a segment need no arena slot.
    let collapsed = collapse(g, &calls);
    let target = kiln_passes::Target::Pjrt.desc();
    let mem =
        plan_memory(&collapsed, &MemoryOptions::for_target(target)).map_err(|e| LowerError(vec![e.to_string()]))?;
    check_plan(&collapsed, &mem)
        .map_err(|e| LowerError(vec![format!("memory plan is inconsistent (compiler bug): {e}")]))?;

    let lowered = lower_to_plan_with_segments(g, &mem, &calls, target)?;
    let segments = emitted
        .into_iter()
        .zip(&part.segments)
        .zip(lowered.call_tensors)
        .map(|((e, s), (args, results))| {
            let shardings = |vs: &[ValueId]| match spmd {
                Some(spmd) => vs
                    .iter()
                    .map(|&v| {
                        let sharding = g.values[v].attrs.sharding.clone();
                        let sharding = sharding.unwrap_or_else(|| kiln_ir::Sharding::replicated(g.ty(v).rank()));
                        tensor_sharding(&spmd.mesh, &sharding)
                    })
                    .collect(),
                None => vec![],
            };
            AccelSegment {
                arg_shardings: shardings(&e.args),
                result_shardings: shardings(&e.results),
                index_checks: index_checks(g, &s.nodes, &e.args),
                mlir: e.mlir,
                args,
                results,
                ops: s.nodes.iter().map(|&n| g.nodes[n].op.name().to_string()).collect(),
            }
        })
        .collect();
    let buckets = match buckets {
        Some(spec) => lower_buckets(&ctx, g, spec, &lowered.plan, &lowered.tensor_of)?,
        None => Vec::new(),
    };
    let reasons: HashMap<NodeId, &str> = part.cpu.iter().map(|(n, r)| (*n, r.as_str())).collect();
    let cpu_fallbacks = lowered
        .cpu_instrs
        .iter()
        .map(|&(instr, n)| CpuFallback { instr, reason: reasons.get(&n).copied().unwrap_or("not lowered").to_string() })
        .collect();
    Ok(PjrtLowering {
        plan: lowered.plan,
        weights: lowered.weights,
        accel: AccelProgram {
            segments,
            cpu_fallbacks,
            mesh: spmd.map(|s| mesh_decl(&s.mesh)),
            buckets,
            estimate: None,
        },
    })
}

/// One executable per bucket: `g` specialised to the bucket's sizes must be
/// one segment; its arguments are the plan's tensors for the same values
/// (inputs and weights), its results the plan's outputs.
fn lower_buckets(
    ctx: &melior::Context,
    g: &Graph,
    spec: &BucketSpec,
    plan: &Plan,
    tensor_of: &HashMap<ValueId, u32>,
) -> Result<Vec<AccelBucket>, LowerError> {
    let refuse = |why: String| LowerError(vec![format!("--buckets: {why}")]);
    if !g.states.is_empty() {
        return Err(refuse("a program with state (mutated buffers) cannot be bucketed yet".into()));
    }
    if let Some(why) = padding_problem(g) {
        return Err(refuse(why));
    }
    let mut returned: Vec<ValueId> = Vec::new();
    for v in &g.outputs {
        if returned.contains(v) {
            return Err(refuse("the same value is returned twice".into()));
        }
        returned.push(*v);
    }
    let sizes = bucket_sizes(g, spec).map_err(|e| LowerError(vec![e]))?;
    let mut out = Vec::with_capacity(sizes.len());
    for bucket in &sizes {
        let mut sg = specialize(g, bucket);
        let masked_symbols = mask_padding(g, &mut sg).map_err(refuse)?;
        let part = partition(&sg, &HashMap::new());
        let what = describe_sizes(g, bucket);
        check_single_segment(&sg, &part).map_err(|mut e| {
            e.0.insert(0, format!("--buckets: the program for {} is not one accelerator segment", what));
            e
        })?;
        // The true sizes are `@main`'s last arguments: the runtime passes
        // them after the plan's tensors.
        let size_inputs: Vec<(ValueId, SymbolId)> =
            sg.inputs[sg.inputs.len() - masked_symbols.len()..].iter().copied().zip(masked_symbols).collect();
        let mut seg = part.segments[0].clone();
        seg.args.retain(|v| !size_inputs.iter().any(|(s, _)| s == v));
        seg.args.extend(size_inputs.iter().map(|(v, _)| *v).filter(|v| part.segments[0].args.contains(v)));
        let e = emit_segment_with(ctx, &sg, &seg, Precision::F32, None).map_err(|e| {
            let at = e.node.map(|n| format!(" at {}", sg.describe_node(n))).unwrap_or_default();
            refuse(format!("StableHLO lowering failed for {}{at}: {}", what, e.reason))
        })?;
        if e.results.len() != g.outputs.len() {
            return Err(refuse("an output is an input or a constant (not computed by the program)".into()));
        }
        // Masking may replace an output value (a mean by its division):
        // results map to plan outputs by position.
        let outputs: HashMap<ValueId, u32> =
            sg.outputs.iter().copied().zip(plan.outputs.iter().map(|io| io.tensor)).collect();
        let tensor = |v: &ValueId, table: &HashMap<ValueId, u32>| {
            table.get(v).copied().ok_or_else(|| refuse(format!("value {v:?} has no plan tensor (compiler bug)")))
        };
        let shape = |v: &ValueId| -> Vec<u64> { sg.ty(*v).shape.iter().map(|d| d.eval(&|_| 0) as u64).collect() };
        let symbol_size = |name: &str| {
            g.symbol_by_name(name)
                .and_then(|s| bucket.get(&s))
                .map(|&v| v as u64)
                .ok_or_else(|| refuse(format!("plan symbol `{name}` is not the program's (compiler bug)")))
        };
        let plan_symbol = |s: SymbolId| {
            let name = &g.symbols[s].name;
            plan.symbols
                .iter()
                .position(|p| &p.name == name)
                .map(|i| i as u32)
                .ok_or_else(|| refuse(format!("symbol `{name}` is not the plan's (compiler bug)")))
        };
        let size_count = e.args.iter().filter(|v| size_inputs.iter().any(|(s, _)| s == *v)).count();
        let (tensor_args, size_args) = e.args.split_at(e.args.len() - size_count);
        let true_sizes = size_args
            .iter()
            .map(|v| match size_inputs.iter().find(|(s, _)| s == v) {
                Some(&(_, symbol)) => plan_symbol(symbol),
                None => Err(refuse("a true-size argument is not last (compiler bug)".into())),
            })
            .collect::<Result<_, _>>()?;
        out.push(AccelBucket {
            sizes: plan.symbols.iter().map(|s| symbol_size(&s.name)).collect::<Result<_, _>>()?,
            arg_shapes: tensor_args.iter().map(shape).collect(),
            result_shapes: e.results.iter().map(shape).collect(),
            true_sizes,
            segment: AccelSegment {
                args: tensor_args.iter().map(|v| tensor(v, tensor_of)).collect::<Result<_, _>>()?,
                results: e.results.iter().map(|v| tensor(v, &outputs)).collect::<Result<_, _>>()?,
                ops: seg.nodes.iter().map(|&n| sg.nodes[n].op.name().to_string()).collect(),
                mlir: e.mlir,
                arg_shardings: vec![],
                result_shardings: vec![],
                index_checks: index_checks(&sg, &seg.nodes, tensor_args),
            },
        });
    }
    Ok(out)
}

/// The `@main` arguments among `args` that `nodes` use as indices into a
/// static dimension, for the delegate's host-side range check.
fn index_checks(g: &Graph, nodes: &[NodeId], args: &[ValueId]) -> Vec<IndexCheck> {
    let mut checks = Vec::new();
    for &n in nodes {
        let node = &g.nodes[n];
        // (kernel, first index operand, first indexed axis, one axis per operand)
        let (kernel, first, axis, stepping) = match node.op {
            Op::Gather { axis } => (IndexKernel::Gather, 1, axis, false),
            Op::GatherElements { axis } => (IndexKernel::GatherElements, 1, axis, false),
            Op::IndexGather { axis } => (IndexKernel::IndexGather, 1, axis, true),
            Op::IndexPut { axis, .. } => (IndexKernel::IndexPut, 2, axis, true),
            _ => continue,
        };
        let operands = if stepping { node.inputs.get(first..) } else { node.inputs.get(first..=first) };
        let operands = operands.unwrap_or(&[]);
        for (m, &v) in operands.iter().enumerate() {
            let data_axis = if stepping { axis + m } else { axis };
            let dim = g.ty(node.inputs[0]).shape.get(data_axis).and_then(kiln_ir::Dim::as_const);
            let (Some(arg), Some(dim)) = (args.iter().position(|&a| a == v), dim) else { continue };
            checks.push(IndexCheck { arg: arg as u32, dim: dim as u64, kernel, origin: g.describe_node(n) });
        }
    }
    checks
}

/// Names a bucket's sizes (`s77=16`) for messages.
fn describe_sizes(g: &Graph, sizes: &HashMap<kiln_ir::SymbolId, i64>) -> String {
    let mut parts: Vec<String> = sizes.iter().map(|(s, v)| format!("{}={v}", g.symbols[*s].name)).collect();
    parts.sort();
    parts.join(", ")
}

/// Partitions and emits; a node the emitter rejects is moved to the CPU and the
/// graph partitioned again (each retry moves one more node, so this ends).
fn partition_and_emit(
    ctx: &melior::Context,
    g: &Graph,
    precision: Precision,
    spmd: Option<&SpmdEmit>,
) -> Result<(Partition, Vec<Emitted>), LowerError> {
    let mut forced: HashMap<NodeId, String> = HashMap::new();
    'retry: for _ in 0..=g.order.len() {
        let part = partition(g, &forced);
        let mut emitted = Vec::with_capacity(part.segments.len());
        for seg in &part.segments {
            match emit_segment_with(ctx, g, seg, precision, spmd) {
                Ok(e) => emitted.push(e),
                Err(e) if e.fatal => return Err(LowerError(vec![e.reason])),
                Err(e) => {
                    let reason = format!("StableHLO lowering failed: {}", e.reason);
                    match e.node {
                        Some(n) => {
                            forced.insert(n, reason);
                        }
                        // Not attributable to one node (e.g. the module failed to
                        // verify): the whole segment stays on the CPU.
                        None => forced.extend(seg.nodes.iter().map(|&n| (n, reason.clone()))),
                    }
                    continue 'retry;
                }
            }
        }
        return Ok((part, emitted));
    }
    Err(LowerError(vec!["partitioning did not converge (compiler bug)".into()]))
}

/// An SPMD program runs as one executable on every device: every node must
/// be in one segment. Otherwise the error names each node left on the CPU.
fn check_single_segment(g: &Graph, part: &Partition) -> Result<(), LowerError> {
    let mut problems: Vec<String> =
        part.cpu.iter().map(|(n, reason)| format!("{} stays on the CPU: {reason}", g.describe_node(*n))).collect();
    if part.segments.len() > 1 {
        problems.push(format!("the program splits into {} accelerator segments", part.segments.len()));
    }
    if problems.is_empty() {
        return Ok(());
    }
    problems.insert(0, "a sharded program must lower to a single PJRT segment, but:".to_string());
    Err(LowerError(problems))
}

/// Replaces f32 weight arguments that `@main` takes as bf16 with bf16 copies
/// (one per weight, shared by the segments that use it).
fn substitute_bf16_weights(g: &mut Graph, emitted: &mut [Emitted]) {
    let mut copies: HashMap<ValueId, ValueId> = HashMap::new();
    for e in emitted.iter_mut() {
        for &i in &e.bf16_args {
            let v = e.args[i];
            let copy = match copies.get(&v) {
                Some(&c) => c,
                None => {
                    let Some(c) = g.const_of(v) else { continue };
                    let bytes: Vec<u8> = c
                        .bytes
                        .as_bytes()
                        .chunks_exact(4)
                        .flat_map(|b| half::bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes())
                        .collect();
                    let ty = TensorType::new(DType::BF16, g.ty(v).shape.clone());
                    let name = g.values[v].name.as_ref().map(|n| format!("{n}.bf16"));
                    let c = g.add_const(name, ty, ConstBytes::owned(bytes));
                    // The copy is the same parameter (its origin, later its sharding).
                    g.values[c].attrs = g.values[v].attrs.clone();
                    copies.insert(v, c);
                    c
                }
            };
            e.args[i] = copy;
        }
    }
}

/// A copy of `g` where each call is one node (its first node's place in the
/// schedule) with the call's args as inputs and results as outputs.
fn collapse(g: &Graph, calls: &[AccelCall]) -> Graph {
    let mut c = g.clone();
    let mut replace: HashMap<NodeId, Option<NodeId>> = HashMap::new();
    for call in calls {
        // The op is irrelevant to memory planning except that it must not be a
        // reshape (whose output may alias its input); concat takes any arity.
        let id = c.nodes.push(NodeData {
            op: Op::Concat { axis: 0 },
            inputs: call.args.clone(),
            outputs: call.results.clone(),
            loc: None,
        });
        for (k, &n) in call.nodes.iter().enumerate() {
            replace.insert(n, if k == 0 { Some(id) } else { None });
        }
    }
    c.order = g
        .order
        .iter()
        .filter_map(|n| match replace.get(n) {
            Some(r) => *r,
            None => Some(*n),
        })
        .collect();
    c
}
