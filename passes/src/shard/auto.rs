//! `--shard auto`: a plan chosen by the cost model, per layer.
//!
//! The search runs the real propagation on every candidate, so each cost is
//! that of the plan kiln would emit (its reshardings included), not of a
//! separate approximation:
//!
//! 1. Every whole-program strategy that applies (data-parallel,
//!    tensor-parallel, FSDP, replicated, and context-parallel when the mesh
//!    has a `seq` axis and manual regions are allowed) is planned and
//!    costed; the cheapest is the start, and it also fixes how inputs are
//!    split. Context parallelism's cost counts each ring step's permute
//!    against the block compute it overlaps (see `cost`), so it wins where
//!    activations dominate (long sequences, small weights) and loses where
//!    weights do (it keeps every weight whole on every device). When it
//!    wins, the plan is final: its weights stay whole.
//! 2. Every layer — a linear or matmul with a constant 2-d weight, a
//!    single-group convolution, or a mixture of experts' grouped matmul with
//!    its constant [E, K, N] weight, too large to inline, not pinned by the
//!    user — then gets each of its options in turn (weight replicated,
//!    column-parallel, row-parallel, FSDP-sharded; experts also split by
//!    expert: expert parallelism) with every other layer held; the cheapest
//!    option stays. Sweeps repeat
//!    until none changes (at most [`MAX_SWEEPS`]).
//! 3. A last pass costs every option of every layer against the final plan:
//!    that is what the report shows beside each choice.

use super::cost::{bytes, estimate, seconds, CostModel, PlanCost};
use super::propagate::{propagate_shardings, Reshard};
use super::ring::SEQ_AXIS;
use super::strategy::{data_axis, glob_match, model_axis, seed};
use super::{ShardOptions, Strategy};
use kiln_ir::{Graph, NodeId, Op, Sharding, ValueId};
use std::cmp::Ordering;

const MAX_SWEEPS: usize = 3;

/// How one layer's weight is laid out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LayerChoice {
    /// Whole on every device.
    Replicated,
    /// Output features split over the model axis.
    Column,
    /// Contracted features split over the model axis (a partial sum after).
    Row,
    /// Split over the data axis, gathered where it is used.
    Fsdp,
    /// A mixture of experts' weights split by expert over the model axis:
    /// each device multiplies by its own experts (a partial sum after).
    Expert,
}

impl LayerChoice {
    pub fn name(self) -> &'static str {
        match self {
            LayerChoice::Replicated => "replicated",
            LayerChoice::Column => "column-parallel",
            LayerChoice::Row => "row-parallel",
            LayerChoice::Fsdp => "fsdp",
            LayerChoice::Expert => "expert-parallel",
        }
    }
}

/// One layer of the auto plan: its options with the cost of the whole plan
/// under each (the others as chosen).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    pub node: NodeId,
    pub weight: ValueId,
    /// The weight's origin (Python name) or value name.
    pub name: String,
    pub chosen: LayerChoice,
    pub options: Vec<(LayerChoice, PlanCost)>,
}

/// What `--shard auto` decided and why.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoReport {
    /// Each whole-program strategy tried first, with its cost (`None`: it
    /// does not apply to this program on this mesh, e.g. a batch the data
    /// axis does not divide).
    pub strategies: Vec<(Strategy, Option<PlanCost>)>,
    /// The strategy the per-layer search started from.
    pub start: Strategy,
    pub layers: Vec<LayerPlan>,
    pub model: CostModel,
}

impl AutoReport {
    /// Why the start strategy won, against the runner-up: the memory limit
    /// it alone meets, or its step time (compute and communication) beside
    /// the runner-up's.
    pub fn why(&self) -> String {
        let costed = |s: Strategy| self.strategies.iter().find(|(t, _)| *t == s).and_then(|(_, c)| c.as_ref());
        let Some(chosen) = costed(self.start) else { return "the only plan found".into() };
        let runner_up = self
            .strategies
            .iter()
            .filter(|(s, _)| *s != self.start)
            .filter_map(|(s, c)| Some((*s, c.as_ref()?)))
            .min_by(|a, b| a.1.key(&self.model).partial_cmp(&b.1.key(&self.model)).unwrap_or(Ordering::Equal));
        let Some((other, next)) = runner_up else { return "the only strategy that applies".into() };
        let mut why = match self.model.memory_per_device {
            Some(limit) if next.memory_bytes() > limit && chosen.memory_bytes() <= limit => format!(
                "it fits the memory limit of {} per device ({}), the runner-up {} does not ({})",
                bytes(limit),
                bytes(chosen.memory_bytes()),
                other.name(),
                bytes(next.memory_bytes())
            ),
            _ => format!(
                "{} per step against {}'s {} (compute {} vs {}, communication {} vs {}; {} vs {} per device)",
                seconds(chosen.step_s()),
                other.name(),
                seconds(next.step_s()),
                seconds(chosen.compute_s),
                seconds(next.compute_s),
                seconds(chosen.comm_s),
                seconds(next.comm_s),
                bytes(chosen.memory_bytes()),
                bytes(next.memory_bytes())
            ),
        };
        // Context parallelism, when considered and not chosen: why not.
        if let Some(cp) = costed(Strategy::ContextParallel).filter(|_| self.start != Strategy::ContextParallel) {
            let over = self.model.memory_per_device.filter(|&m| cp.memory_bytes() > m);
            why.push_str(&match over {
                Some(_) => format!(
                    "; context-parallel (considered): {} per device (every weight whole), over the memory limit",
                    bytes(cp.memory_bytes())
                ),
                None => format!("; context-parallel (considered): {} per step", seconds(cp.step_s())),
            });
        }
        why
    }
}

/// A layer the search may re-plan: its node, weight and the shardings each
/// option gives the weight (options that do not apply are left out).
struct Layer {
    node: NodeId,
    weight: ValueId,
    options: Vec<(LayerChoice, Sharding)>,
}

/// Runs the search on `g`, leaving it sharded by the chosen plan; returns the
/// plan's reshardings and the report.
pub(super) fn shard_auto(g: &mut Graph, opts: &ShardOptions) -> Result<(Vec<Reshard>, AutoReport), String> {
    let clean: Vec<Option<Sharding>> = g.values.iter().map(|(_, v)| v.attrs.sharding.clone()).collect();
    let restore = |g: &mut Graph| {
        for ((_, v), s) in g.values.iter_mut().zip(&clean) {
            v.attrs.sharding.clone_from(s);
        }
    };
    let model = &opts.cost;
    let mut strategies = Vec::new();
    let mut best: Option<(Strategy, PlanCost)> = None;
    let mut first_error = None;
    let mut candidates = vec![Strategy::DataParallel, Strategy::TensorParallel, Strategy::Fsdp, Strategy::Replicated];
    // Context parallelism where the mesh has a sequence axis to ring over
    // and manual regions may be written (Shardy).
    if opts.manual_regions && opts.mesh.axis(SEQ_AXIS).is_some_and(|a| a.size > 1) {
        candidates.push(Strategy::ContextParallel);
    }
    for strategy in candidates {
        restore(g);
        match plan(g, opts, strategy, &[]) {
            Ok((_, cost)) => {
                if best.as_ref().is_none_or(|(_, b)| cost.key(model) < b.key(model)) {
                    best = Some((strategy, cost.clone()));
                }
                strategies.push((strategy, Some(cost)));
            }
            Err(e) => {
                first_error.get_or_insert(e);
                strategies.push((strategy, None));
            }
        }
    }
    let Some((start, _)) = best else {
        return Err(first_error.unwrap_or_else(|| "no sharding strategy applies".into()));
    };
    restore(g);
    let (start_reshards, _) = plan(g, opts, start, &[])?;
    // A ring wants its weights whole on every device (each device runs
    // every layer on its own tokens): no per-layer search.
    if start == Strategy::ContextParallel {
        return Ok((start_reshards, AutoReport { strategies, start, layers: Vec::new(), model: model.clone() }));
    }
    let layers = find_layers(g, opts);
    // Each layer starts as the start strategy left its weight.
    let mut chosen: Vec<usize> = layers
        .iter()
        .map(|l| {
            let rank = g.ty(l.weight).rank();
            let s = g.values[l.weight].attrs.sharding.clone().unwrap_or_else(|| Sharding::replicated(rank));
            l.options.iter().position(|(_, o)| *o == s).unwrap_or(0)
        })
        .collect();
    let pins = |chosen: &[usize]| -> Vec<(ValueId, Sharding)> {
        layers.iter().zip(chosen).map(|(l, &c)| (l.weight, l.options[c].1.clone())).collect()
    };
    let cost_of = |g: &mut Graph, chosen: &[usize]| -> Result<PlanCost, String> {
        restore(g);
        plan(g, opts, start, &pins(chosen)).map(|(_, c)| c)
    };
    let mut current = cost_of(g, &chosen)?;
    for _ in 0..MAX_SWEEPS {
        let mut changed = false;
        for i in 0..layers.len() {
            for o in 0..layers[i].options.len() {
                if o == chosen[i] {
                    continue;
                }
                let mut trial = chosen.clone();
                trial[i] = o;
                let Ok(cost) = cost_of(g, &trial) else { continue };
                if cost.key(model) < current.key(model) {
                    (chosen, current, changed) = (trial, cost, true);
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut report_layers = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let mut options = Vec::new();
        for o in 0..l.options.len() {
            let mut trial = chosen.clone();
            trial[i] = o;
            if let Ok(cost) = cost_of(g, &trial) {
                options.push((l.options[o].0, cost));
            }
        }
        report_layers.push(LayerPlan {
            node: l.node,
            weight: l.weight,
            name: name_of(g, l.weight),
            chosen: l.options[chosen[i]].0,
            options,
        });
    }
    restore(g);
    let (reshards, _) = plan(g, opts, start, &pins(&chosen))?;
    Ok((reshards, AutoReport { strategies, start, layers: report_layers, model: model.clone() }))
}

/// Seeds `g` by `strategy`, pins `pins`, propagates and costs the result.
fn plan(
    g: &mut Graph,
    opts: &ShardOptions,
    strategy: Strategy,
    pins: &[(ValueId, Sharding)],
) -> Result<(Vec<Reshard>, PlanCost), String> {
    let concrete = ShardOptions { strategy, ..opts.clone() };
    seed(g, &concrete)?;
    for (w, s) in pins {
        g.values[*w].attrs.sharding = Some(s.clone());
    }
    let reshards = propagate_shardings(g, &concrete)?;
    let cost = estimate(g, &opts.mesh, &reshards, &opts.cost);
    Ok((reshards, cost))
}

/// Linear and matmul nodes whose weight (operand 1) is a constant 2-d
/// tensor — or single-group convolutions, their 4-d weight split by channels,
/// or grouped matmuls, their [E, K, N] experts' weight —
/// too large to inline, used by nothing else and named by no user
/// override, with the options that divide it.
fn find_layers(g: &Graph, opts: &ShardOptions) -> Vec<Layer> {
    let mesh = &opts.mesh;
    let size = |axis: &str| mesh.axis(axis).map_or(1, |a| i64::from(a.size));
    let (model, data) = (model_axis(mesh), data_axis(mesh));
    let uses = g.use_counts();
    let mut layers = Vec::new();
    for &n in &g.order {
        let node = &g.nodes[n];
        let (k_dim, n_dim, rank) = match node.op {
            Op::Linear => (1, 0, 2),
            Op::MatMul => (0, 1, 2),
            // Experts' weights [E, K, N].
            Op::GroupedMatMul => (1, 2, 3),
            // Input and output channels of a single-group convolution.
            Op::Conv { groups: 1, .. } => (1, 0, g.ty(node.inputs[0]).rank()),
            _ => continue,
        };
        let Some(&w) = node.inputs.get(1) else { continue };
        let Some(shape) = g.ty(w).static_shape() else { continue };
        if g.const_of(w).is_none() || shape.len() != rank || uses[w] != 1 {
            continue;
        }
        if shape.iter().product::<i64>() as usize <= opts.inline_max_elements {
            continue;
        }
        let origin = g.values[w].attrs.origin.as_deref().unwrap_or("");
        if opts.overrides.iter().any(|o| glob_match(&o.pattern, origin)) {
            continue;
        }
        let mut options = vec![(LayerChoice::Replicated, Sharding::replicated(rank))];
        let mut offer = |choice: LayerChoice, dim: usize, axis: &str| {
            if size(axis) > 1 && shape[dim] % size(axis) == 0 {
                let s = Sharding::split(rank, dim, axis);
                if !options.iter().any(|(_, o)| *o == s) {
                    options.push((choice, s));
                }
            }
        };
        offer(LayerChoice::Column, n_dim, model);
        offer(LayerChoice::Row, k_dim, model);
        if matches!(node.op, Op::GroupedMatMul) {
            offer(LayerChoice::Expert, 0, model);
        }
        if data != model {
            let largest = (0..rank).max_by_key(|&d| (shape[d], -(d as i64))).unwrap_or(0);
            offer(LayerChoice::Fsdp, largest, data);
        }
        if options.len() > 1 {
            layers.push(Layer { node: n, weight: w, options });
        }
    }
    layers
}

fn name_of(g: &Graph, v: ValueId) -> String {
    let d = &g.values[v];
    d.attrs.origin.clone().or_else(|| d.name.clone()).unwrap_or_else(|| v.to_string())
}
