//! The naming state of the graph being converted: the program's, or a nested
//! graph's (a `torch.cond` branch, a `while_loop` condition or body). A
//! nested graph's value names form their own namespace, with their own
//! declared types, so its [`Scope`] is pushed when its conversion starts and
//! popped when it ends ([`Importer::with_scope`]): the enclosing graph's
//! names, views, current node and pending type error come back as they were,
//! whatever the nested conversion did or how it failed.
//!
//! What outlives a nested graph stays on the [`Importer`]: the IR graph being
//! built (swapped for a loop's own graph by [`Importer::with_graph`]), the
//! problems collected, complex values (keyed by prefixed names) and random
//! stream numbers.

use super::importer::{tensor_names, Fail, Importer};
use super::views::ViewTable;
use crate::pt2::program::{Node, SymExpr, TensorMeta};
use kiln_ir::{Dim, Graph, LocId, SymbolId, TensorType, ValueId};
use std::collections::{HashMap, HashSet};

pub(crate) struct Scope<'p> {
    /// Prefix of IR value names (`true_graph_0/`; empty for the program):
    /// a nested graph's names may repeat the outer graph's.
    pub prefix: String,
    /// Declared types of this graph's values.
    pub tensor_values: &'p HashMap<String, TensorMeta>,
    pub sym_int_values: &'p HashMap<String, SymExpr>,
    /// Program value name → IR value.
    pub env: HashMap<String, ValueId>,
    /// Program symbolic-int name → dimension expression.
    pub sym_env: HashMap<String, Dim>,
    /// Names whose producer failed: their users are skipped silently so that
    /// one unsupported op is reported once, not once per consumer.
    pub poisoned: HashSet<String>,
    /// IR types of program values, parsed from `tensor_values` on first use
    /// (or set for a per-part conversion of a complex value).
    pub types: HashMap<String, TensorType>,
    /// View outputs → their base and view op (for in-place writes through views).
    pub views: ViewTable,
    /// Index of the last node reading each name (`usize::MAX`: a graph output).
    pub last_use: HashMap<String, usize>,
    /// Index of the node being converted.
    pub node_index: usize,
    /// Location of the node being converted.
    pub loc: Option<LocId>,
    /// The first contradiction between a declared type and kiln's inference
    /// (or an oversized type) met while converting the current node (see
    /// [`Importer::push`]).
    pub type_error: Option<Fail>,
}

impl<'p> Scope<'p> {
    /// The scope of a graph of `nodes` whose results are `outputs`.
    pub fn new<'n>(
        prefix: String,
        tensor_values: &'p HashMap<String, TensorMeta>,
        sym_int_values: &'p HashMap<String, SymExpr>,
        nodes: &[Node],
        outputs: impl IntoIterator<Item = &'n str>,
    ) -> Scope<'p> {
        let mut last_use = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            for input in &node.inputs {
                for name in tensor_names(&input.arg) {
                    last_use.insert(name.to_string(), i);
                }
            }
        }
        for name in outputs {
            last_use.insert(name.to_string(), usize::MAX);
        }
        Scope {
            prefix,
            tensor_values,
            sym_int_values,
            env: HashMap::new(),
            sym_env: HashMap::new(),
            poisoned: HashSet::new(),
            types: HashMap::new(),
            views: ViewTable::default(),
            last_use,
            node_index: 0,
            loc: None,
            type_error: None,
        }
    }
}

/// The IR graph being built with its `.item()` state, saved while a loop's
/// own graph is built (see [`Importer::with_graph`]).
pub(crate) struct GraphState {
    pub g: Graph,
    /// Symbolic scalars read with `.item()` → the 0-d tensor read.
    pub items: HashMap<String, ValueId>,
    /// `.item()` symbols not bound yet (see [`Importer::ensure_bound`]).
    pub pending_binds: HashMap<SymbolId, PendingBind>,
}

/// A `.item()` value that may become a size.
pub(crate) struct PendingBind {
    /// The 0-d tensor read.
    pub value: ValueId,
    /// The `.item()` node, for the bind's location and error messages.
    pub loc: Option<LocId>,
    pub node: String,
}

impl<'p> Importer<'p> {
    /// Runs `f` in `scope` (a nested graph's), then restores the enclosing
    /// scope, whatever `f` returned.
    pub(crate) fn with_scope<T>(&mut self, scope: Scope<'p>, f: impl FnOnce(&mut Self) -> T) -> T {
        let enclosing = std::mem::replace(&mut self.scope, scope);
        self.outer_scopes.push(enclosing);
        let result = f(self);
        if let Some(enclosing) = self.outer_scopes.pop() {
            self.scope = enclosing;
        }
        result
    }

    /// Runs `f` building `g` (a loop's nested graph) with no `.item()`
    /// state, then puts the enclosing graph back; returns `g` as `f` left it,
    /// with its pending binds, and `f`'s result.
    pub(crate) fn with_graph<T>(&mut self, g: Graph, f: impl FnOnce(&mut Self) -> T) -> (GraphState, T) {
        let enclosing = self.swap_graph(GraphState { g, items: HashMap::new(), pending_binds: HashMap::new() });
        let result = f(self);
        (self.swap_graph(enclosing), result)
    }

    fn swap_graph(&mut self, state: GraphState) -> GraphState {
        GraphState {
            g: std::mem::replace(&mut self.g, state.g),
            items: std::mem::replace(&mut self.items, state.items),
            pending_binds: std::mem::replace(&mut self.pending_binds, state.pending_binds),
        }
    }
}
