//! Dead-code elimination.
//!
//! A node is live when one of its outputs is a graph output or feeds a live
//! node, or when its op has an effect (`bind_dim` binds a symbol).
//! Dead nodes leave the schedule (their arena slots stay, so ids never dangle).
//! Constants stay in their arena too; [`live_consts`] tells the artifact writer
//! which ones are still used.

use crate::check::guard;
use crate::{Changed, Options, PassError};
use kiln_ir::{ConstId, Graph, NodeId, SecondaryMap, ValueDef, ValueId};

const PASS: &str = "dce";

pub fn dce(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    guard(g, PASS)?;
    let mut live: SecondaryMap<ValueId, bool> = SecondaryMap::new();
    for &o in &g.outputs {
        live[o] = true;
    }
    let mut keep: SecondaryMap<NodeId, bool> = SecondaryMap::new();
    // Walking the schedule backwards sees every user before its operands' producers.
    for &n in g.order.iter().rev() {
        let node = &g.nodes[n];
        if node.op.has_effect() || node.outputs.iter().any(|&o| live[o]) {
            keep[n] = true;
            for &i in &node.inputs {
                live[i] = true;
            }
        }
    }
    let before = g.order.len();
    g.order.retain(|&n| keep[n]);
    Ok(Changed::from(g.order.len() != before))
}

/// Constants used by a scheduled node or returned as a graph output, in id order.
pub fn live_consts(g: &Graph) -> Vec<ConstId> {
    let mut used: SecondaryMap<ConstId, bool> = SecondaryMap::new();
    let operands = g.order.iter().filter_map(|&n| g.nodes.get(n)).flat_map(|node| node.inputs.iter());
    for &v in operands.chain(&g.outputs) {
        if let Some(ValueDef::Const(c)) = g.values.get(v).map(|d| &d.def) {
            used[*c] = true;
        }
    }
    g.consts.keys().filter(|&c| used[c]).collect()
}
