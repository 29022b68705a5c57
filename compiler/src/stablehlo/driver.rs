//! From a graph after the pass pipeline to a mixed plan: partition, emit each
//! segment, plan memory with every segment seen as one instruction, lower.

use super::emit::{emit_segment_with, new_context, Emitted};
use super::partition::{partition, Partition};
use super::sharding::{mesh_decl, tensor_sharding, SpmdEmit};
use super::Precision;
use crate::lower::{lower_to_plan_with_segments, AccelCall, LowerError};
use kiln_ir::{ConstBytes, DType, Graph, NodeData, NodeId, Op, TensorType, ValueId};
use kiln_passes::{check_plan, plan_memory, MemoryOptions};
use kiln_runtime::format::{AccelProgram, AccelSegment, CpuFallback, Plan, WeightsBuilder};
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
    let mem = plan_memory(&collapsed, &MemoryOptions::default()).map_err(|e| LowerError(vec![e.to_string()]))?;
    check_plan(&collapsed, &mem)
        .map_err(|e| LowerError(vec![format!("memory plan is inconsistent (compiler bug): {e}")]))?;

    let lowered = lower_to_plan_with_segments(g, &mem, &calls, kiln_passes::Target::Pjrt.desc())?;
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
                mlir: e.mlir,
                args,
                results,
                ops: s.nodes.iter().map(|&n| g.nodes[n].op.name().to_string()).collect(),
            }
        })
        .collect();
    let reasons: HashMap<NodeId, &str> = part.cpu.iter().map(|(n, r)| (*n, r.as_str())).collect();
    let cpu_fallbacks = lowered
        .cpu_instrs
        .iter()
        .map(|&(instr, n)| CpuFallback { instr, reason: reasons.get(&n).copied().unwrap_or("not lowered").to_string() })
        .collect();
    Ok(PjrtLowering {
        plan: lowered.plan,
        weights: lowered.weights,
        accel: AccelProgram { segments, cpu_fallbacks, mesh: spmd.map(|s| mesh_decl(&s.mesh)) },
    })
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
