//! Node-by-node rewriting in schedule order.
//!
//! [`rewrite_in_order`] rebuilds `g.order` while walking the old one. Because
//! `Graph::add_node` appends to `g.order`, nodes a rewrite creates land exactly where
//! the node they replace was, so the schedule stays topological without a re-sort.
//!
//! A replacement inherits the value attributes of what it replaces
//! ([`kiln_ir::ValueAttrs::inherit`]): a value that `simplify` replaces by its
//! operand, or `fold` by a constant, keeps its origin.

use crate::{Changed, PassError};
use kiln_ir::{Graph, NodeId, SecondaryMap, ValueId};

/// What a rewrite did with one node.
pub(crate) enum Rewrite {
    /// Leave the node in place.
    Keep,
    /// Drop the node; its outputs are replaced, in order, by these values (which
    /// are earlier values or outputs of nodes the rewrite just added).
    Replace(Vec<ValueId>),
}

/// Calls `f` on every scheduled node, with its operands already redirected through
/// earlier replacements, and applies the replacements to later nodes and outputs.
pub(crate) fn rewrite_in_order(
    g: &mut Graph,
    mut f: impl FnMut(&mut Graph, NodeId) -> Result<Rewrite, PassError>,
) -> Result<Changed, PassError> {
    let old_order = std::mem::take(&mut g.order);
    let mut map: SecondaryMap<ValueId, Option<ValueId>> = SecondaryMap::new();
    let mut changed = Changed::No;
    for n in old_order {
        redirect_operands(g, n, &map);
        match f(g, n)? {
            Rewrite::Keep => g.order.push(n),
            Rewrite::Replace(new) => {
                changed = Changed::Yes;
                for (old, new) in g.nodes[n].outputs.clone().into_iter().zip(new) {
                    // A self-mapping would make `replace_uses` chase its own tail.
                    if old != new {
                        map[old] = Some(new);
                        let attrs = g.values[old].attrs.clone();
                        g.values[new].attrs.inherit(&attrs);
                    }
                }
            }
        }
    }
    for out in &mut g.outputs {
        *out = resolve(&map, *out);
    }
    Ok(changed)
}

fn redirect_operands(g: &mut Graph, n: NodeId, map: &SecondaryMap<ValueId, Option<ValueId>>) {
    for input in &mut g.nodes[n].inputs {
        *input = resolve(map, *input);
    }
}

/// Replacement targets are always defined earlier than what they replace, so chains
/// are finite; each link is followed once.
fn resolve(map: &SecondaryMap<ValueId, Option<ValueId>>, mut v: ValueId) -> ValueId {
    while let Some(next) = map[v] {
        v = next;
    }
    v
}
