//! What a sharded program costs per step on each device: compute time from
//! its FLOPs, communication time from its reshardings over the mesh's links,
//! and the bytes each device holds (weights, and the peak of live
//! activations along the schedule).
//!
//! A first-order model, meant to rank plans, not to predict wall time: no
//! overlap of compute and communication (except a ring attention's
//! permutes, which overlap its steps' block compute: per step only the
//! permute time beyond the compute counts), ring collectives, every op at
//! the device's peak rate. `--shard auto` minimises [`PlanCost::step_s`] among the
//! plans that fit [`CostModel::memory_per_device`].

use super::propagate::{Collective, Reshard};
use kiln_ir::{Dim, Graph, Mesh, NodeId, Op, Sharding, ValueId};

/// What the cost model assumes about one device and the mesh's links.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Sustained FLOP/s of one device.
    pub flops_per_s: f64,
    /// Bytes per second one device sends over an axis's links, by axis name.
    pub link_bytes_per_s: Vec<(String, f64)>,
    /// For axes not named in `link_bytes_per_s`.
    pub default_link_bytes_per_s: f64,
    /// Fixed cost of one collective (launch and synchronisation), seconds.
    pub collective_latency_s: f64,
    /// Plans whose weights and peak activations exceed this per device are
    /// rejected while a plan that fits exists.
    pub memory_per_device: Option<u64>,
}

impl Default for CostModel {
    /// A current accelerator chip: 100 TFLOP/s, 100 GB/s per link, 10 µs
    /// per collective, no memory limit.
    fn default() -> CostModel {
        CostModel {
            flops_per_s: 100e12,
            link_bytes_per_s: Vec::new(),
            default_link_bytes_per_s: 100e9,
            collective_latency_s: 10e-6,
            memory_per_device: None,
        }
    }
}

impl CostModel {
    /// `flops=1e14,memory=16e9,link=1e11,link.model=4e11,latency=1e-5`
    /// (SI units: FLOP/s, bytes, bytes/s, seconds); keys not given keep
    /// their defaults.
    pub fn parse(spec: &str) -> Result<CostModel, String> {
        let mut m = CostModel::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| format!("cost model: `{item}` is not KEY=VALUE"))?;
            let x: f64 = value.trim().parse().map_err(|_| format!("cost model: `{value}` is not a number"))?;
            if !(x.is_finite() && x > 0.0) {
                return Err(format!("cost model: `{item}` must be a positive number"));
            }
            match key.trim() {
                "flops" => m.flops_per_s = x,
                "memory" => m.memory_per_device = Some(x as u64),
                "link" => m.default_link_bytes_per_s = x,
                "latency" => m.collective_latency_s = x,
                k => match k.strip_prefix("link.") {
                    Some(axis) if !axis.is_empty() => m.link_bytes_per_s.push((axis.to_string(), x)),
                    _ => {
                        return Err(format!(
                            "cost model: unknown key `{k}` (known: flops, memory, link, link.AXIS, latency)"
                        ))
                    }
                },
            }
        }
        Ok(m)
    }

    pub(super) fn link(&self, axis: &str) -> f64 {
        self.link_bytes_per_s.iter().find(|(a, _)| a == axis).map_or(self.default_link_bytes_per_s, |l| l.1)
    }
}

/// One step of a sharded program on one device, as the model sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanCost {
    /// FLOPs one device computes.
    pub flops: f64,
    pub compute_s: f64,
    /// Bytes one device sends over the step's collectives.
    pub comm_bytes: f64,
    pub comm_s: f64,
    /// Weight bytes one device holds.
    pub weight_bytes: u64,
    /// The most activation bytes (inputs and intermediates) one device holds
    /// at once along the schedule.
    pub activation_bytes: u64,
}

impl PlanCost {
    pub fn step_s(&self) -> f64 {
        self.compute_s + self.comm_s
    }

    pub fn memory_bytes(&self) -> u64 {
        self.weight_bytes + self.activation_bytes
    }

    /// Ordering key: plans that fit first, then by step time; among plans
    /// that do not fit, the smallest.
    pub(super) fn key(&self, model: &CostModel) -> (bool, f64) {
        match model.memory_per_device {
            Some(m) if self.memory_bytes() > m => (true, self.memory_bytes() as f64),
            _ => (false, self.step_s()),
        }
    }

    /// `1.20 ms (compute 1.00 ms, comm 0.20 ms), 12.00 MB per device`.
    pub fn summary(&self) -> String {
        format!(
            "{} (compute {}, comm {}), {} per device",
            seconds(self.step_s()),
            seconds(self.compute_s),
            seconds(self.comm_s),
            bytes(self.memory_bytes())
        )
    }
}

/// Seconds in the largest unit that keeps a leading digit.
pub fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.3} µs", s * 1e6)
    } else {
        format!("{:.3} ns", s * 1e9)
    }
}

/// Bytes in the largest decimal unit that keeps a leading digit.
pub fn bytes(b: u64) -> String {
    match b {
        0..1_000 => format!("{b} B"),
        1_000..1_000_000 => format!("{:.2} kB", b as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} MB", b as f64 / 1e6),
        _ => format!("{:.2} GB", b as f64 / 1e9),
    }
}

/// The cost of `g` as sharded now (every value's sharding set by
/// propagation) with `reshards` its reshardings.
pub fn estimate(g: &Graph, mesh: &Mesh, reshards: &[Reshard], model: &CostModel) -> PlanCost {
    let mut cost = PlanCost::default();
    let rings = super::ring::ring_attentions(g, model);
    for &n in &g.order {
        let node = &g.nodes[n];
        let Some(&out) = node.outputs.first() else { continue };
        // A ring computes what its steps compute (zig-zag skips hidden halves).
        if let Some(r) = rings.iter().find(|r| r.node == n) {
            cost.flops += r.device_flops();
            continue;
        }
        let split = sharding_of(g, out).map_or(1, |s| {
            let dims: u64 = (0..s.dims.len()).map(|d| s.pieces(mesh, d)).product();
            dims * axes_size(mesh, &s.partial)
        });
        cost.flops += node_flops(g, n) / split.max(1) as f64;
    }
    cost.compute_s = cost.flops / model.flops_per_s;
    for r in reshards {
        let (bytes, s) = collective_cost(mesh, r, model);
        cost.comm_bytes += bytes;
        cost.comm_s += s;
    }
    // Collectives inside the regions kiln partitions by hand. A ring's
    // permutes overlap its steps' block compute: only the excess counts.
    for c in super::manual::expert_dispatches(g).iter().flat_map(|d| d.collectives()) {
        cost.comm_bytes += c.bytes_per_device as f64;
        cost.comm_s += c.bytes_per_device as f64 / model.link(&c.axis) + model.collective_latency_s;
    }
    for r in &rings {
        cost.comm_bytes += r.collectives().iter().map(|c| c.bytes_per_device as f64).sum::<f64>();
        cost.comm_s += r.comm_s(model);
    }
    // Constants a pass replaced may linger until compaction: only live ones count.
    let uses = g.use_counts();
    let live = g.consts.values().filter(|c| uses[c.value] > 0 || g.outputs.contains(&c.value));
    cost.weight_bytes = live.map(|c| per_device_bytes(g, mesh, c.value)).sum();
    cost.activation_bytes = peak_activations(g, mesh);
    cost
}

fn sharding_of(g: &Graph, v: ValueId) -> Option<&Sharding> {
    g.values[v].attrs.sharding.as_ref()
}

fn axes_size(mesh: &Mesh, axes: &[String]) -> u64 {
    axes.iter().map(|a| mesh.axis(a).map_or(1, |x| u64::from(x.size))).product()
}

fn numel(g: &Graph, v: ValueId) -> f64 {
    g.ty(v).shape.iter().map(|d| d.as_const().unwrap_or(1).max(0) as f64).product()
}

fn dim(g: &Graph, v: ValueId, from_end: usize) -> f64 {
    let shape = &g.ty(v).shape;
    shape.len().checked_sub(from_end).and_then(|d| shape[d].as_const()).unwrap_or(1).max(0) as f64
}

/// FLOPs of one node on one device holding everything: matrix products,
/// convolutions and attention by their multiply-adds, everything else one
/// per output element.
pub(super) fn node_flops(g: &Graph, n: NodeId) -> f64 {
    let node = &g.nodes[n];
    let out = node.outputs[0];
    let input = |i: usize| node.inputs.get(i).copied();
    match &node.op {
        Op::MatMul | Op::Linear => input(0).map_or(0.0, |a| 2.0 * numel(g, out) * dim(g, a, 1)),
        Op::Conv { .. } => input(1).map_or(0.0, |w| {
            let per_out = numel(g, w) / dim(g, w, g.ty(w).rank()).max(1.0);
            2.0 * numel(g, out) * per_out
        }),
        // The dense form the StableHLO emitter writes: every row times every
        // expert's [K, N] weight (E times the experts' own work).
        Op::GroupedMatMul => input(1).map_or(0.0, |w| 2.0 * numel(g, out) * numel(g, w) / dim(g, w, 1).max(1.0)),
        // softmax(q kᵀ) v: two products over the key length.
        Op::Attention { .. } => input(1).map_or(0.0, |k| 4.0 * numel(g, out) * dim(g, k, 2)),
        _ => numel(g, out),
    }
}

/// `(bytes one device sends, seconds)` of one resharding, ring collectives
/// over the axes it involves, at the slowest of their links.
fn collective_cost(mesh: &Mesh, r: &Reshard, model: &CostModel) -> (f64, f64) {
    let pieces: u64 = (0..r.from.dims.len()).map(|d| r.from.pieces(mesh, d)).product();
    let local = r.bytes as f64 / pieces.max(1) as f64;
    let axes: Vec<String> = match r.collective {
        Collective::AllReduce => r.from.partial.iter().filter(|a| !r.to.partial.contains(a)).cloned().collect(),
        Collective::AllGather | Collective::AllToAll => r
            .from
            .dims
            .iter()
            .zip(&r.to.dims)
            .flat_map(|(f, t)| f.iter().filter(|a| !t.contains(a)).cloned().collect::<Vec<_>>())
            .collect(),
        Collective::Slice | Collective::CollectivePermute => return (0.0, 0.0),
    };
    let n = axes_size(mesh, &axes) as f64;
    if n <= 1.0 {
        return (0.0, 0.0);
    }
    let bytes = match r.collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n * local,
        Collective::AllGather => (n - 1.0) * local,
        _ => (n - 1.0) / n * local,
    };
    let link = axes.iter().map(|a| model.link(a)).fold(f64::INFINITY, f64::min);
    (bytes, bytes / link + model.collective_latency_s)
}

fn per_device_bytes(g: &Graph, mesh: &Mesh, v: ValueId) -> u64 {
    let ty = g.ty(v);
    let whole = ty.shape.iter().map(|d| Dim::as_const(d).unwrap_or(1).max(0) as u64).product::<u64>()
        * ty.dtype.size_bytes() as u64;
    let pieces: u64 = sharding_of(g, v).map_or(1, |s| (0..s.dims.len()).map(|d| s.pieces(mesh, d)).product());
    whole / pieces.max(1)
}

/// The most bytes of inputs and intermediates live at once along
/// `g.order` (a value lives from its producer to its last reader; graph
/// outputs to the end).
fn peak_activations(g: &Graph, mesh: &Mesh) -> u64 {
    let steps = g.order.len();
    let mut last = std::collections::HashMap::<ValueId, usize>::new();
    for (k, &n) in g.order.iter().enumerate() {
        for &v in &g.nodes[n].inputs {
            last.insert(v, k);
        }
    }
    for &v in &g.outputs {
        last.insert(v, steps);
    }
    // delta[k]: bytes that become live (+) at step k, or die (-) after it.
    let mut born = vec![0u64; steps + 1];
    let mut dies = vec![0u64; steps + 2];
    let mut add = |v: ValueId, at: usize| {
        if let Some(&end) = last.get(&v) {
            let b = per_device_bytes(g, mesh, v);
            born[at] += b;
            dies[end.max(at) + 1] += b;
        }
    };
    for &v in &g.inputs {
        add(v, 0);
    }
    for (k, &n) in g.order.iter().enumerate() {
        for &v in &g.nodes[n].outputs {
            add(v, k);
        }
    }
    let (mut live, mut peak) = (0u64, 0u64);
    for k in 0..=steps {
        live = live - dies[k] + born[k];
        peak = peak.max(live);
    }
    peak
}
