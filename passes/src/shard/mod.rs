//! Sharding a graph over a device mesh: a strategy (or the user) picks the
//! shardings of inputs and weights, propagation carries them through every
//! node and records where an operand must be resharded.
//!
//! Runs on the graph after the pass pipeline (its ops are the ones the
//! emitter sees), before partitioning. XLA's SPMD partitioner does the actual
//! partitioning from the annotations kiln emits; what is computed here makes
//! the plan explicit (shardings on intermediates, the reshardings — emitted
//! as sharding constraints — and the collectives they cost), so it can be
//! reported and checked.
//!
//! - `strategy`: seeds inputs and weights (data-parallel, FSDP, per-tensor
//!   overrides by origin glob); tensor parallelism decides weights during
//!   propagation, from the sharding of the activation that reaches them.
//! - `propagate`: the per-op rules.
//! - `cost`: what a plan costs per step and device (compute, communication,
//!   memory), reported for every plan.
//! - `auto`: `--shard auto`, the plan the cost model picks, per layer.
//! - `manual`: where kiln partitions by hand (experts' all-to-all token
//!   dispatch); the emitter writes those nodes as manual regions.
//! - `pipeline`: `--shard pipeline`, repeated blocks over the `stage` axis
//!   with their weights stacked; the emitter writes the run of blocks as one
//!   manual region with `collective_permute`s between stages.
//! - `ring`: `--shard context-parallel`, sequences split over the `seq`
//!   axis; each attention is a manual region passing key and value blocks
//!   around the ring (online softmax).

mod auto;
mod cost;
mod manual;
mod pipeline;
mod propagate;
mod ring;
mod strategy;

pub use auto::{AutoReport, LayerChoice, LayerPlan};
pub use cost::{bytes, estimate, seconds, CostModel, PlanCost};
pub use manual::{expert_dispatches, Exchange, ExpertDispatch, ManualCollective};
pub use pipeline::{Pipeline, STAGE_AXIS};
pub use propagate::{propagate_shardings, Collective, Reshard, Use};
pub use ring::{ring_attentions, unflatten_rows, RingAttention, SEQ_AXIS};
pub use strategy::{glob_match, Override, Strategy};

use kiln_ir::{Graph, Mesh};

/// What `kiln compile --mesh … --shard …` asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardOptions {
    pub mesh: Mesh,
    pub strategy: Strategy,
    /// Per-tensor shardings by origin (exact name or glob), applied after the
    /// strategy's seeding and never changed by it; the first match wins.
    pub overrides: Vec<Override>,
    /// Weights with at most this many elements are left replicated (the
    /// StableHLO emitter writes them into the program).
    pub inline_max_elements: usize,
    /// What plans are costed with (the report, and `--shard auto`'s choice).
    pub cost: CostModel,
    /// Whether kiln may partition by hand (`manual`): the emitter writes
    /// manual regions in Shardy modules only.
    pub manual_regions: bool,
}

/// The outcome of [`shard_graph`]: every use where a value had to change
/// sharding (in schedule order, then the graph outputs).
#[derive(Clone, Debug, PartialEq)]
pub struct ShardPlan {
    pub reshards: Vec<Reshard>,
    /// The plan's cost per step and device under `ShardOptions::cost`.
    pub cost: PlanCost,
    /// What `--shard auto` tried and chose.
    pub auto: Option<AutoReport>,
    /// `--shard pipeline`'s stages (the graph's repeated blocks rewritten to
    /// read stacked weights; the emitter writes them as one region).
    pub pipeline: Option<Pipeline>,
}

/// Sets `g.mesh`, seeds inputs and weights from `opts`, and propagates.
/// Errors name the tensor and the dimension a mesh axis does not divide, or
/// an override that matches nothing.
pub fn shard_graph(g: &mut Graph, opts: &ShardOptions) -> Result<ShardPlan, String> {
    let problems = opts.mesh.problems();
    if !problems.is_empty() {
        return Err(format!("bad mesh: {}", problems.join("; ")));
    }
    g.mesh = Some(opts.mesh.clone());
    if let Strategy::Pipeline { microbatches } = opts.strategy {
        return shard_pipeline(g, opts, microbatches);
    }
    let (reshards, auto) = if opts.strategy == Strategy::Auto {
        let (reshards, report) = auto::shard_auto(g, opts)?;
        (reshards, Some(report))
    } else {
        strategy::seed(g, opts)?;
        (propagate_shardings(g, opts)?, None)
    };
    let cost = estimate(g, &opts.mesh, &reshards, &opts.cost);
    Ok(ShardPlan { reshards, cost, auto, pipeline: None })
}

/// `--shard pipeline`: the blocks stacked and staged, the rest seeded and
/// propagated as data-parallel over a `data` axis (if any); reshardings
/// inside the region are the region's business (it is partitioned by
/// hand), and its cost is the schedule's.
fn shard_pipeline(g: &mut Graph, opts: &ShardOptions, microbatches: u32) -> Result<ShardPlan, String> {
    let mut p = pipeline::prepare(g, &opts.mesh, microbatches, opts.inline_max_elements)?;
    strategy::seed(g, opts)?;
    for &s in &p.stacked {
        let rank = g.ty(s).rank();
        g.values[s].attrs.sharding = Some(kiln_ir::Sharding::split(rank, 0, STAGE_AXIS));
    }
    let mut reshards = propagate_shardings(g, opts)?;
    p.finish(g, &opts.mesh)?;
    reshards.retain(|r| !matches!(r.at, Use::Operand { node, .. } if p.span.contains(&node)));
    // The region leaves the activation as it entered: batch over data.
    let out = p.output;
    g.values[out].attrs.sharding = Some(p.sharding.clone());
    let mut cost = estimate(g, &opts.mesh, &reshards, &opts.cost);
    let split = p.sharding.pieces(&opts.mesh, 0) as f64;
    let span_flops: f64 = p.span.iter().map(|&n| cost::node_flops(g, n)).sum::<f64>() / split.max(1.0);
    cost.flops += p.device_flops() - span_flops;
    cost.compute_s = cost.flops / opts.cost.flops_per_s;
    for c in p.collectives() {
        cost.comm_bytes += c.bytes_per_device as f64;
        cost.comm_s += c.bytes_per_device as f64 / opts.cost.link(&c.axis) + opts.cost.collective_latency_s;
    }
    Ok(ShardPlan { reshards, cost, auto: None, pipeline: Some(p) })
}
