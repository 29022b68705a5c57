//! Graph checks the passes rely on.
//!
//! [`well_formed`] is the guard every pass runs on entry: it checks that every id the
//! graph mentions is in range, so the passes can index the arenas without panicking
//! on a malformed graph. [`verify_graph`] is what `Options::verify_each` runs between
//! passes: that guard plus `kiln_ir::verify::verify`.

use crate::PassError;
use kiln_ir::{Dim, EntityRef, Graph, TensorType, ValueDef, ValueId};

/// The IR verifier, run between passes when `Options::verify_each` is set.
pub fn verify_graph(g: &Graph) -> Result<(), String> {
    well_formed(g)?;
    kiln_ir::verify::verify(g).map_err(|e| e.to_string())
}

/// Every id reachable from the graph's lists points into its arena.
pub(crate) fn well_formed(g: &Graph) -> Result<(), String> {
    let value_ok = |v: ValueId| g.values.is_valid(v);
    for &v in g.inputs.iter().chain(&g.outputs) {
        if !value_ok(v) {
            return Err(format!("graph input/output {v} is not a value"));
        }
    }
    for (v, data) in g.values.iter() {
        type_well_formed(g, &data.ty).map_err(|e| format!("type of {v}: {e}"))?;
        match data.def {
            ValueDef::Node { node, .. } if !g.nodes.is_valid(node) => {
                return Err(format!("{v} is defined by missing node {node}"))
            }
            ValueDef::Const(c) if !g.consts.is_valid(c) => {
                return Err(format!("{v} is defined by missing constant {c}"))
            }
            _ => {}
        }
    }
    for (c, data) in g.consts.iter() {
        if !value_ok(data.value) {
            return Err(format!("constant {c} defines missing value {}", data.value));
        }
    }
    for &n in &g.order {
        let node = g.nodes.get(n).ok_or_else(|| format!("schedule names missing node {n}"))?;
        if let Some(v) = node.inputs.iter().chain(&node.outputs).find(|&&v| !value_ok(v)) {
            return Err(format!("node {n} mentions missing value {v}"));
        }
        if let Some(l) = node.loc {
            if !g.locs.is_valid(l) {
                return Err(format!("node {n} has missing location {l}"));
            }
        }
        for d in op_dims(&node.op) {
            dim_well_formed(g, d).map_err(|e| format!("node {n}: {e}"))?;
        }
    }
    Ok(())
}

fn type_well_formed(g: &Graph, ty: &TensorType) -> Result<(), String> {
    ty.shape.iter().try_for_each(|d| dim_well_formed(g, d))
}

fn dim_well_formed(g: &Graph, d: &Dim) -> Result<(), String> {
    let mut syms = Vec::new();
    d.collect_symbols(&mut syms);
    match syms.iter().find(|s| s.index() >= g.symbols.len()) {
        Some(s) => Err(format!("dimension mentions missing symbol {s}")),
        None => Ok(()),
    }
}

/// The dimension expressions an op's attributes carry.
pub(crate) fn op_dims(op: &kiln_ir::Op) -> Vec<&Dim> {
    use kiln_ir::Op;
    match op {
        Op::Reshape { shape } | Op::Expand { shape } | Op::Full { shape, .. } | Op::Random { shape, .. } => {
            shape.iter().collect()
        }
        Op::Arange { len, .. } => vec![len],
        _ => Vec::new(),
    }
}

/// Runs [`well_formed`] for a pass, naming it in the error.
pub(crate) fn guard(g: &Graph, pass: &'static str) -> Result<(), PassError> {
    well_formed(g).map_err(|e| PassError::new(pass, format!("malformed graph: {e}")))
}
