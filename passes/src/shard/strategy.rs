//! Seeding: the shardings of graph inputs and weights a strategy starts from,
//! then the user's per-tensor overrides.

use super::ShardOptions;
use kiln_ir::{Dim, Graph, Mesh, Sharding, ValueId};

/// How `--shard` lays a program out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Nothing split (only overrides apply).
    Replicated,
    /// Inputs split along their batch (first) dim over the data axis,
    /// weights replicated.
    DataParallel,
    /// Megatron: a linear whose input arrives whole is column-parallel (its
    /// output features split over the model axis), one whose input arrives
    /// split on its features is row-parallel (its contraction split, a
    /// partial sum reduced after it); attention heads follow the column
    /// split through the reshapes; a mixture of experts' weights are
    /// decided the same way per expert. Inputs split on batch over a separate
    /// `data` axis when the mesh has one.
    TensorParallel,
    /// Data-parallel inputs, and every weight split on its largest dim the
    /// data axis divides (XLA gathers it where it is used).
    Fsdp,
    /// A mixture of experts' weights `[E, K, N]` split by expert over the
    /// model axis, the tokens dispatched to their experts' devices by
    /// all-to-all where the rows divide, the products all-reduced otherwise
    /// (see `manual`), everything else
    /// replicated; inputs split on batch over a separate `data` axis when the
    /// mesh has one.
    ExpertParallel,
    /// Pipeline parallelism (see `pipeline`): the repeated blocks over the
    /// `stage` axis, the batch cut into `microbatches` (0: kiln picks);
    /// inputs split on batch over a separate `data` axis when the mesh has
    /// one, everything outside the blocks replicated.
    Pipeline { microbatches: u32 },
    /// Context parallelism (see `ring`): inputs split on their sequence
    /// (dim 1) over the `seq` axis (and on batch over a `data` axis when the
    /// mesh has one), weights replicated; token-wise ops keep the split and
    /// every attention is a ring over `seq`.
    ContextParallel,
    /// The plan the cost model finds cheapest: the best of the above, then
    /// refined layer by layer (see `auto`).
    Auto,
}

impl Strategy {
    pub fn from_name(name: &str) -> Option<Strategy> {
        Some(match name {
            "replicated" | "none" => Strategy::Replicated,
            "data-parallel" | "dp" => Strategy::DataParallel,
            "tensor-parallel" | "tp" => Strategy::TensorParallel,
            "fsdp" => Strategy::Fsdp,
            "expert-parallel" | "ep" => Strategy::ExpertParallel,
            "pipeline" | "pp" => Strategy::Pipeline { microbatches: 0 },
            "context-parallel" | "cp" | "ring" => Strategy::ContextParallel,
            "auto" => Strategy::Auto,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Replicated => "replicated",
            Strategy::DataParallel => "data-parallel",
            Strategy::TensorParallel => "tensor-parallel",
            Strategy::Fsdp => "fsdp",
            Strategy::ExpertParallel => "expert-parallel",
            Strategy::Pipeline { .. } => "pipeline",
            Strategy::ContextParallel => "context-parallel",
            Strategy::Auto => "auto",
        }
    }
}

/// A user's sharding for every input or weight whose origin matches `pattern`
/// (`*` any run of characters, `?` one character).
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    pub pattern: String,
    pub sharding: Sharding,
}

/// The axis batch dims are split over: `data`, else the first.
pub(super) fn data_axis(mesh: &Mesh) -> &str {
    mesh.axis("data").or(mesh.axes.first()).map_or("", |a| a.name.as_str())
}

/// The axis tensor parallelism splits weights over: `model`, else the last.
pub(super) fn model_axis(mesh: &Mesh) -> &str {
    mesh.axis("model").or(mesh.axes.last()).map_or("", |a| a.name.as_str())
}

pub(super) fn seed(g: &mut Graph, opts: &ShardOptions) -> Result<(), String> {
    let mesh = &opts.mesh;
    let data = data_axis(mesh).to_string();
    let split_batch = match opts.strategy {
        Strategy::DataParallel | Strategy::Fsdp => true,
        Strategy::TensorParallel | Strategy::ExpertParallel => {
            mesh.axis("data").is_some() && model_axis(mesh) != "data"
        }
        Strategy::Pipeline { .. } => mesh.axis("data").is_some() && data != super::pipeline::STAGE_AXIS,
        Strategy::ContextParallel => mesh.axis("data").is_some() && data != super::ring::SEQ_AXIS,
        // `auto` seeds through the concrete strategies it tries.
        Strategy::Replicated | Strategy::Auto => false,
    };
    // An axis of one device splits nothing.
    if split_batch && mesh.axis(&data).is_some_and(|a| a.size > 1) {
        for i in 0..g.inputs.len() {
            let v = g.inputs[i];
            if g.is_state_input(i) || g.ty(v).rank() == 0 {
                continue;
            }
            check_divides(g, mesh, v, 0, &data, opts.strategy)?;
            g.values[v].attrs.sharding = Some(Sharding::split(g.ty(v).rank(), 0, &data));
        }
    }
    if opts.strategy == Strategy::Fsdp {
        let size = mesh.axis(&data).map_or(1, |a| i64::from(a.size));
        let weights: Vec<ValueId> = g.consts.values().map(|c| c.value).collect();
        for w in weights {
            let Some(shape) = g.ty(w).static_shape() else { continue };
            if shape.iter().product::<i64>() as usize <= opts.inline_max_elements {
                continue;
            }
            // The largest dim the axis divides (the first of equals).
            let best = (0..shape.len()).filter(|&d| shape[d] % size == 0).max_by_key(|&d| (shape[d], -(d as i64)));
            if let Some(d) = best {
                g.values[w].attrs.sharding = Some(Sharding::split(shape.len(), d, &data));
            }
        }
    }
    if opts.strategy == Strategy::ExpertParallel {
        split_experts(g, mesh, opts)?;
    }
    if opts.strategy == Strategy::ContextParallel {
        split_sequences(g, mesh, opts)?;
    }
    apply_overrides(g, opts)
}

/// Every grouped matmul's weight split by expert over the model axis; an
/// axis that does not divide the experts is an error naming the weight.
fn split_experts(g: &mut Graph, mesh: &Mesh, opts: &ShardOptions) -> Result<(), String> {
    let axis = model_axis(mesh).to_string();
    let weights: Vec<ValueId> = g
        .order
        .iter()
        .filter(|&&n| g.nodes[n].op == kiln_ir::Op::GroupedMatMul)
        .filter_map(|&n| g.nodes[n].inputs.get(1).copied())
        .filter(|&w| g.const_of(w).is_some() && g.ty(w).rank() == 3)
        .collect();
    if weights.is_empty() {
        return Err("--shard expert-parallel: the program has no mixture of experts (grouped matmul)".into());
    }
    for w in weights {
        check_divides(g, mesh, w, 0, &axis, opts.strategy)?;
        g.values[w].attrs.sharding = Some(Sharding::split(3, 0, &axis));
    }
    Ok(())
}

/// `--shard context-parallel`: every input of rank two or more split on
/// its sequence (dim 1) over `seq`, besides the batch split.
fn split_sequences(g: &mut Graph, mesh: &Mesh, opts: &ShardOptions) -> Result<(), String> {
    let seq = super::ring::SEQ_AXIS;
    if mesh.axis(seq).is_none() {
        return Err(format!(
            "--shard context-parallel needs a mesh axis `{seq}` to split sequences over (e.g. --mesh {seq}=4), \
             the mesh has [{mesh}]"
        ));
    }
    if !opts.manual_regions {
        return Err("--shard context-parallel writes manual regions (ring attention), which need \
                    --sharding-dialect shardy (the default)"
            .into());
    }
    if !g.order.iter().any(|&n| matches!(g.nodes[n].op, kiln_ir::Op::Attention { .. })) {
        return Err("--shard context-parallel: the program has no attention to pass around a ring".into());
    }
    let mut split = 0;
    for i in 0..g.inputs.len() {
        let v = g.inputs[i];
        let rank = g.ty(v).rank();
        if g.is_state_input(i) || rank < 2 {
            continue;
        }
        if let Some(Dim::Const(n)) = g.ty(v).shape.get(1) {
            let size = mesh.axis(seq).map_or(1, |a| i64::from(a.size));
            if n % size != 0 {
                return Err(format!(
                    "--shard context-parallel: the sequence length {n} (dim 1 of {}) is not divisible by \
                     the {size} devices of mesh axis `{seq}`",
                    describe(g, v)
                ));
            }
        } else {
            return Err(format!(
                "--shard context-parallel: the sequence (dim 1) of {} is dynamic; ring attention needs a \
                 static sequence length (export it with a fixed length)",
                describe(g, v)
            ));
        }
        let mut s = g.values[v].attrs.sharding.clone().unwrap_or_else(|| Sharding::replicated(rank));
        s.dims[1] = vec![seq.to_string()];
        g.values[v].attrs.sharding = Some(s);
        split += 1;
    }
    if split == 0 {
        return Err("--shard context-parallel: the program has no input of rank two or more to split on a \
                    sequence dim"
            .into());
    }
    Ok(())
}

fn check_divides(g: &Graph, mesh: &Mesh, v: ValueId, dim: usize, axis: &str, strategy: Strategy) -> Result<(), String> {
    let size = mesh.axis(axis).map_or(1, |a| a.size);
    let name = describe(g, v);
    match g.ty(v).shape.get(dim) {
        Some(Dim::Const(n)) if n % i64::from(size) == 0 => Ok(()),
        Some(Dim::Const(n)) => Err(format!(
            "--shard {}: mesh axis `{axis}` (size {size}) does not divide dim {dim} (size {n}) of {name}",
            strategy.name()
        )),
        _ => Err(format!(
            "--shard {}: dim {dim} of {name} is dynamic; a sharded program needs static shapes",
            strategy.name()
        )),
    }
}

fn describe(g: &Graph, v: ValueId) -> String {
    match (&g.values[v].attrs.origin, &g.values[v].name) {
        (Some(o), _) => format!("`{o}`"),
        (None, Some(n)) => format!("`{n}`"),
        _ => format!("{v}"),
    }
}

fn apply_overrides(g: &mut Graph, opts: &ShardOptions) -> Result<(), String> {
    if opts.overrides.is_empty() {
        return Ok(());
    }
    let candidates: Vec<ValueId> = g.inputs.iter().copied().chain(g.consts.values().map(|c| c.value)).collect();
    let mut used = vec![false; opts.overrides.len()];
    for v in candidates {
        let Some(origin) = g.values[v].attrs.origin.clone() else { continue };
        let Some(k) = opts.overrides.iter().position(|o| glob_match(&o.pattern, &origin)) else { continue };
        used[k] = true;
        let sharding = &opts.overrides[k].sharding;
        let shape: Vec<Option<i64>> = g.ty(v).shape.iter().map(Dim::as_const).collect();
        let problems = sharding.problems(&opts.mesh, &shape);
        if !problems.is_empty() {
            return Err(format!(
                "sharding override `{}` for `{origin}`: {}",
                opts.overrides[k].pattern,
                problems.join("; ")
            ));
        }
        if !sharding.partial.is_empty() {
            return Err(format!("sharding override for `{origin}`: an input or weight cannot be a partial sum"));
        }
        g.values[v].attrs.sharding = Some(sharding.clone());
    }
    if let Some(k) = used.iter().position(|u| !u) {
        let mut names: Vec<&str> = g
            .inputs
            .iter()
            .chain(g.consts.values().map(|c| &c.value))
            .filter_map(|&v| g.values[v].attrs.origin.as_deref())
            .collect();
        names.sort_unstable();
        names.truncate(12);
        return Err(format!(
            "sharding override `{}` matches no input or weight (some names: {})",
            opts.overrides[k].pattern,
            names.join(", ")
        ));
    }
    Ok(())
}

/// `*` matches any run of characters (dots included), `?` one character.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative matching with one backtrack point: linear in practice.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match("layers.*.fc1.weight", "layers.0.fc1.weight"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("x?", "x1"));
        assert!(!glob_match("layers.*.fc1.weight", "layers.0.fc2.weight"));
        assert!(glob_match("*.weight", "a.b.weight"));
        assert!(!glob_match("*.weight", "a.b.bias"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }
}
