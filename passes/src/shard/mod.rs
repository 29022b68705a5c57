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

mod auto;
mod cost;
mod manual;
mod propagate;
mod strategy;

pub use auto::{AutoReport, LayerChoice, LayerPlan};
pub use cost::{bytes, estimate, seconds, CostModel, PlanCost};
pub use manual::{expert_dispatches, Exchange, ExpertDispatch, ManualCollective};
pub use propagate::{propagate_shardings, Collective, Reshard, Use};
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
    let (reshards, auto) = if opts.strategy == Strategy::Auto {
        let (reshards, report) = auto::shard_auto(g, opts)?;
        (reshards, Some(report))
    } else {
        strategy::seed(g, opts)?;
        (propagate_shardings(g, opts)?, None)
    };
    let cost = estimate(g, &opts.mesh, &reshards, &opts.cost);
    Ok(ShardPlan { reshards, cost, auto })
}
