//! Sharding annotations for SPMD modules: Shardy (`sdy.mesh`, `sdy.sharding`,
//! `sdy.sharding_constraint`; the default) or GSPMD strings (`mhlo.sharding`;
//! the fallback), never both in one module (GSPMD attributes switch Shardy
//! off). Both forms were checked on the XLA CPU plugin (see
//! `../shared/notes/sharding-pjrt.md`).

use kiln_ir::{Graph, Mesh, MeshAxis, Sharding};
use kiln_passes::shard::{
    bytes, expert_dispatches, ring_attentions, seconds, AutoReport, CostModel, Override, Pipeline, PlanCost, Reshard,
    Use,
};
use kiln_runtime::format::{MeshAxisDecl, MeshDecl, TensorSharding};

/// How a sharded module is annotated.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ShardingDialect {
    #[default]
    Shardy,
    Gspmd,
}

impl ShardingDialect {
    pub fn from_name(name: &str) -> Option<ShardingDialect> {
        match name {
            "shardy" | "sdy" => Some(ShardingDialect::Shardy),
            "gspmd" | "mhlo" => Some(ShardingDialect::Gspmd),
            _ => None,
        }
    }
}

/// What the emitter needs to annotate an SPMD segment.
#[derive(Clone, Debug)]
pub struct SpmdEmit {
    pub mesh: Mesh,
    pub dialect: ShardingDialect,
    /// Propagation's reshardings: each becomes a constraint on that use.
    pub reshards: Vec<Reshard>,
    /// The plan's estimated cost per step and device (for the report).
    pub cost: PlanCost,
    /// The model the cost was estimated with.
    pub cost_model: CostModel,
    /// What `--shard auto` tried and chose (for the report).
    pub auto: Option<AutoReport>,
    /// `--shard pipeline`'s stages: its span is emitted as one region.
    pub pipeline: Option<Pipeline>,
}

/// The `sdy.mesh` symbol every Shardy annotation names.
pub const MESH_SYMBOL: &str = "mesh";

/// `#sdy.mesh<["data"=2, "model"=2]>`.
pub fn shardy_mesh(mesh: &Mesh) -> String {
    let axes: Vec<String> = mesh.axes.iter().map(|a| format!("\"{}\"={}", a.name, a.size)).collect();
    format!("#sdy.mesh<[{}]>", axes.join(", "))
}

/// `#sdy.sharding<@mesh, [{"data"}, {}]>` (partial sums are not annotated:
/// XLA resolves them where the value is used).
pub fn shardy_sharding(s: &Sharding) -> String {
    let dims: Vec<String> = s
        .dims
        .iter()
        .map(|axes| {
            let names: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
            format!("{{{}}}", names.join(", "))
        })
        .collect();
    format!("#sdy.sharding<@{MESH_SYMBOL}, [{}]>", dims.join(", "))
}

/// The GSPMD tile string: `{replicated}`, or `{devices=[t0,..,tn(,r)]ids
/// (last_tile_dim_replicate)}` where `t_d` is the number of pieces of dim
/// `d`, `r` the devices holding the same piece, and `ids` the partitions in
/// row-major order of that tile array.
pub fn gspmd_sharding(mesh: &Mesh, s: &Sharding) -> String {
    if s.dims.iter().all(Vec::is_empty) {
        return "{replicated}".to_string();
    }
    let size_of = |name: &str| mesh.axis(name).map_or(1, |a| a.size as usize);
    let tiles: Vec<usize> = s.dims.iter().map(|axes| axes.iter().map(|a| size_of(a)).product()).collect();
    let unused: Vec<&str> =
        mesh.axes.iter().map(|a| a.name.as_str()).filter(|a| !s.dims.iter().flatten().any(|b| b == a)).collect();
    let replicas: usize = unused.iter().map(|a| size_of(a)).product();
    let n = mesh.size() as usize;
    let mut ids = vec![0usize; n];
    for p in 0..n {
        // Mesh coordinates of partition p (row-major over the axes).
        let mut coord = std::collections::HashMap::new();
        let mut rest = p;
        for a in mesh.axes.iter().rev() {
            coord.insert(a.name.as_str(), rest % a.size.max(1) as usize);
            rest /= a.size.max(1) as usize;
        }
        let radix = |axes: &mut dyn Iterator<Item = &str>| {
            axes.fold(0, |i, a| i * size_of(a) + coord.get(a).copied().unwrap_or(0))
        };
        let mut flat = 0;
        for axes in &s.dims {
            let tile: usize = axes.iter().map(|a| size_of(a)).product();
            flat = flat * tile + radix(&mut axes.iter().map(String::as_str));
        }
        flat = flat * replicas + radix(&mut unused.iter().copied());
        ids[flat] = p;
    }
    let mut shape: Vec<String> = tiles.iter().map(usize::to_string).collect();
    if replicas > 1 {
        shape.push(replicas.to_string());
    }
    let ids: Vec<String> = ids.iter().map(usize::to_string).collect();
    let tail = if replicas > 1 { " last_tile_dim_replicate" } else { "" };
    format!("{{devices=[{}]{}{tail}}}", shape.join(","), ids.join(","))
}

/// The runtime's form of the mesh.
pub fn mesh_decl(mesh: &Mesh) -> MeshDecl {
    MeshDecl {
        axes: mesh.axes.iter().map(|a| MeshAxisDecl { name: a.name.clone(), size: a.size }).collect(),
        devices: mesh.devices.clone(),
    }
}

/// The runtime's form of a sharding: axis indices per dim.
pub fn tensor_sharding(mesh: &Mesh, s: &Sharding) -> TensorSharding {
    let index = |name: &String| mesh.axes.iter().position(|a| &a.name == name).unwrap_or(0) as u32;
    TensorSharding { dims: s.dims.iter().map(|axes| axes.iter().map(index).collect()).collect() }
}

/// `--mesh data=2,model=2`: axes major to minor.
pub fn parse_mesh(text: &str) -> Result<Mesh, String> {
    let mut mesh = Mesh { axes: vec![], devices: vec![] };
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, size) = item.split_once('=').ok_or_else(|| format!("mesh axis `{item}` is not NAME=SIZE"))?;
        let size: u32 = size.trim().parse().map_err(|_| format!("mesh axis `{item}`: `{size}` is not a size"))?;
        mesh.axes.push(MeshAxis { name: name.trim().to_string(), size });
    }
    let problems = mesh.problems();
    if problems.is_empty() {
        Ok(mesh)
    } else {
        Err(format!("--mesh {text}: {}", problems.join("; ")))
    }
}

/// A `--shard-spec` file: `{"devices": [3, 2, 1, 0], "overrides": [{"tensor":
/// "layers.*.fc1.weight", "sharding": [["model"], []]}]}`, both optional;
/// `tensor` is an origin (the Python name) or a glob over them, `sharding`
/// per dim the mesh axes it is split over. Unknown keys are errors.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardSpec {
    #[serde(default)]
    pub devices: Vec<u32>,
    #[serde(default)]
    pub overrides: Vec<SpecOverride>,
}

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecOverride {
    pub tensor: String,
    pub sharding: Vec<Vec<String>>,
}

impl ShardSpec {
    pub fn parse(json: &str) -> Result<ShardSpec, String> {
        serde_json::from_str(json).map_err(|e| format!("sharding spec: {e}"))
    }

    pub fn overrides(&self) -> Vec<Override> {
        self.overrides
            .iter()
            .map(|o| Override {
                pattern: o.tensor.clone(),
                sharding: Sharding { dims: o.sharding.clone(), partial: vec![] },
            })
            .collect()
    }
}

/// What `kiln compile --report` shows of an SPMD plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardReport {
    pub mesh: String,
    /// Inputs and weights: name, sharding, whole bytes, bytes per device.
    pub tensors: Vec<(String, String, u64, u64)>,
    /// Every resharding: collective, where, bytes of the whole tensor; then
    /// the manual regions' collectives with the bytes each device sends.
    pub collectives: Vec<(&'static str, String, u64)>,
    /// The plan's estimated cost per step and device.
    pub cost: PlanCost,
    /// `--shard auto`'s decisions, one line each.
    pub decisions: Vec<String>,
}

impl ShardReport {
    pub fn new(g: &Graph, spmd: &SpmdEmit) -> ShardReport {
        let mut tensors = Vec::new();
        // Constants a pass replaced may linger until compaction: list live ones.
        let uses = g.use_counts();
        let live = g.consts.values().map(|c| c.value).filter(|&v| uses[v] > 0 || g.outputs.contains(&v));
        let values = g.inputs.iter().copied().chain(live);
        for v in values {
            let ty = g.ty(v);
            let Some(shape) = ty.static_shape() else { continue };
            let bytes = shape.iter().product::<i64>().max(0) as u64 * ty.dtype.size_bytes() as u64;
            if g.const_of(v).is_some() && shape.iter().product::<i64>() <= super::INLINE_CONST_MAX_ELEMENTS as i64 {
                continue;
            }
            let s = g.values[v].attrs.sharding.clone().unwrap_or_else(|| Sharding::replicated(shape.len()));
            let pieces: u64 = (0..shape.len()).map(|d| s.pieces(&spmd.mesh, d)).product();
            let name = g.values[v].attrs.origin.clone().or_else(|| g.values[v].name.clone()).unwrap_or(v.to_string());
            tensors.push((name, s.to_string(), bytes, bytes / pieces.max(1)));
        }
        let mut collectives: Vec<(&'static str, String, u64)> = spmd
            .reshards
            .iter()
            .filter(|r| r.collective.name() != "slice")
            .map(|r| {
                let at = match r.at {
                    Use::Operand { node, index } => format!("operand {index} of {}", g.describe_node(node)),
                    Use::Output(k) => format!("output {k}"),
                };
                (r.collective.name(), format!("{at}: {} -> {}", r.from, r.to), r.bytes)
            })
            .collect();
        // The manual regions' own collectives (none in GSPMD modules:
        // propagation plans no region there).
        {
            for d in expert_dispatches(g) {
                for c in d.collectives() {
                    let what = format!("manual region at {}: {}", g.describe_node(d.node), c.what);
                    collectives.push((c.collective.name(), what, c.bytes_per_device));
                }
            }
            for r in ring_attentions(g, &spmd.cost_model) {
                for c in r.collectives() {
                    let what = format!("manual region at {}: {}", g.describe_node(r.node), c.what);
                    collectives.push((c.collective.name(), what, c.bytes_per_device));
                }
            }
        }
        let mut decisions = spmd.auto.as_ref().map_or_else(Vec::new, |a| auto_lines(g, a));
        let rings = ring_attentions(g, &spmd.cost_model);
        if let Some(first) = rings.first() {
            let per_step: u64 = rings.iter().map(|r| r.block_bytes).sum();
            decisions.push(format!(
                "  ring attention: {} attention(s) over `{}` in {} steps each ({}), key and value blocks \
                 passed by collective-permute: {per_step} B per step per device over all of them",
                rings.len(),
                first.axis,
                first.devices,
                if rings.iter().all(|r| r.causal) {
                    "causal"
                } else if rings.iter().any(|r| r.causal) {
                    "some causal"
                } else {
                    "not causal"
                },
            ));
            let model = &spmd.cost_model;
            for r in &rings {
                let (compute, permute, exposed) = r.step_times(model);
                // The layout and why: zig-zag where it fits and its ring
                // time (compute saved against the reorder) is the lower.
                let (zz, plain) = (r.with_layout(true), r.with_layout(false));
                let trade = || {
                    format!(
                        "hidden half-blocks skipped: {:.3e} of a plain ring's {:.3e} FLOP per device, {} of compute \
                         saved; reorder {} B, {}; ring {} zig-zag vs {} plain",
                        zz.device_flops(),
                        plain.device_flops(),
                        seconds(zz.skipped_s(model)),
                        zz.reorder_bytes(),
                        seconds(zz.reorder_s(model)),
                        seconds(zz.ring_s(model)),
                        seconds(plain.ring_s(model)),
                    )
                };
                let layout = if r.zigzag {
                    format!(
                        "zig-zag (chunks i and {}-i of {} per device; {}: chosen, the faster)",
                        2 * r.devices - 1,
                        2 * r.devices,
                        trade()
                    )
                } else if r.zigzag_fits {
                    format!(
                        "contiguous, every block computed (zig-zag not chosen, its reorder costs more than it \
                         saves: {})",
                        trade()
                    )
                } else if r.causal {
                    format!("contiguous, every block computed ({} does not divide the length)", 2 * r.devices)
                } else {
                    "contiguous, every block computed".to_string()
                };
                decisions.push(format!(
                    "    ring at {}: {layout}; per step {} compute ({:.3e} FLOP) vs {} permute ({} B): {} exposed",
                    g.describe_node(r.node),
                    seconds(compute),
                    r.step_flops(),
                    seconds(permute),
                    r.block_bytes,
                    seconds(exposed)
                ));
            }
        }
        if let Some(p) = &spmd.pipeline {
            for c in p.collectives() {
                collectives.push((
                    c.collective.name(),
                    format!("manual region (pipeline): {}", c.what),
                    c.bytes_per_device,
                ));
            }
            decisions.extend(p.lines());
        }
        ShardReport { mesh: spmd.mesh.to_string(), tensors, collectives, cost: spmd.cost.clone(), decisions }
    }

    /// What the artifact keeps of the report for `kiln inspect`.
    pub fn estimate(&self) -> kiln_runtime::format::ShardEstimate {
        let c = &self.cost;
        kiln_runtime::format::ShardEstimate {
            flops: c.flops,
            compute_s: c.compute_s,
            comm_bytes: c.comm_bytes,
            comm_s: c.comm_s,
            weight_bytes: c.weight_bytes,
            activation_bytes: c.activation_bytes,
            collectives: self.collectives.iter().map(|(k, at, b)| (k.to_string(), at.clone(), *b)).collect(),
            decisions: self.decisions.clone(),
        }
    }

    /// Weight bytes each device holds (inputs excluded).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!("sharding over mesh [{}]:", self.mesh)];
        for (name, s, whole, per) in &self.tensors {
            out.push(format!("  {name:<40} {s:<24} {whole:>10} B whole, {per:>10} B per device"));
        }
        let per_device: u64 = self.tensors.iter().map(|t| t.3).sum();
        out.push(format!("  inputs and weights per device: {per_device} B"));
        if self.collectives.is_empty() {
            out.push("  collectives kiln placed: none (XLA may add its own)".to_string());
        }
        for (kind, what, bytes) in &self.collectives {
            out.push(format!("  {kind:<10} {bytes:>10} B  {what}"));
        }
        let c = &self.cost;
        out.push(format!(
            "  estimated per step and device: {} compute ({:.3e} FLOP), {} communication ({}), weights {}, peak activations {}",
            seconds(c.compute_s),
            c.flops,
            seconds(c.comm_s),
            bytes(c.comm_bytes as u64),
            bytes(c.weight_bytes),
            bytes(c.activation_bytes)
        ));
        out.extend(self.decisions.iter().cloned());
        out
    }
}

/// `--shard auto`'s search as report lines: the cost model, each strategy
/// tried, then per layer the choice and the plan's cost under each option.
fn auto_lines(g: &Graph, a: &AutoReport) -> Vec<String> {
    let m = &a.model;
    let mut links = format!("{:.3e} B/s", m.default_link_bytes_per_s);
    for (axis, b) in &m.link_bytes_per_s {
        links.push_str(&format!(", {axis} {b:.3e} B/s"));
    }
    let memory = m.memory_per_device.map_or("no limit".to_string(), bytes);
    let mut out = vec![format!(
        "  auto: cost model {:.3e} FLOP/s per device, links {links}, {} per collective, memory {memory}",
        m.flops_per_s,
        seconds(m.collective_latency_s)
    )];
    for (strategy, cost) in &a.strategies {
        let what = cost.as_ref().map_or("does not apply".to_string(), |c| c.summary());
        let mark = if *strategy == a.start { "  <- start" } else { "" };
        out.push(format!("    {:<16} {what}{mark}", strategy.name()));
    }
    out.push(format!("    chose {}: {}", a.start.name(), a.why()));
    for l in &a.layers {
        out.push(format!("    {} ({}): {}", l.name, g.describe_node(l.node), l.chosen.name()));
        for (choice, cost) in &l.options {
            let mark = if *choice == l.chosen { "  <- chosen" } else { "" };
            out.push(format!("      {:<16} {}{mark}", choice.name(), cost.summary()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gspmd_strings_match_the_checked_ones() {
        // The note's 2-D mesh example (E15), and the 1-D tensor-parallel MLP (E11).
        let mesh = Mesh::new(&[("data", 2), ("model", 2)]);
        let x = Sharding::split(2, 0, "data");
        assert_eq!(gspmd_sharding(&mesh, &x), "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}");
        let w1 = Sharding::split(2, 1, "model");
        assert_eq!(gspmd_sharding(&mesh, &w1), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}");
        let w2 = Sharding::split(2, 0, "model");
        assert_eq!(gspmd_sharding(&mesh, &w2), "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}");
        let one = Mesh::new(&[("x", 4)]);
        assert_eq!(gspmd_sharding(&one, &Sharding::split(2, 1, "x")), "{devices=[1,4]0,1,2,3}");
        assert_eq!(gspmd_sharding(&one, &Sharding::replicated(2)), "{replicated}");
        let both = Sharding { dims: vec![vec!["model".into(), "data".into()]], partial: vec![] };
        assert_eq!(gspmd_sharding(&mesh, &both), "{devices=[4]0,2,1,3}");
    }

    #[test]
    fn mesh_and_spec_parse() {
        let mesh = parse_mesh("data=2, model=4").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mesh.to_string(), "data=2, model=4");
        assert!(parse_mesh("data=2,data=2").is_err());
        assert!(parse_mesh("data").is_err());
        let spec = ShardSpec::parse(r#"{"overrides": [{"tensor": "fc1.*", "sharding": [["model"], []]}]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.overrides()[0].sharding, Sharding::split(2, 0, "model"));
        assert!(ShardSpec::parse(r#"{"overides": []}"#).is_err());
    }

    #[test]
    fn shardy_text() {
        let mesh = Mesh::new(&[("data", 2), ("model", 2)]);
        assert_eq!(shardy_mesh(&mesh), "#sdy.mesh<[\"data\"=2, \"model\"=2]>");
        let s = Sharding { dims: vec![vec!["data".into(), "model".into()], vec![]], partial: vec![] };
        assert_eq!(shardy_sharding(&s), "#sdy.sharding<@mesh, [{\"data\", \"model\"}, {}]>");
        assert_eq!(tensor_sharding(&mesh, &s).dims, [vec![0, 1], vec![]]);
    }
}
