//! Graph invariants, checked all at once.
//!
//! [`verify`] collects every violation (not just the first), each naming the
//! node through [`Graph::describe_node`] (op, id, torch node, Python line) or
//! the value / constant / symbol concerned. Checked:
//!
//! 1. **Symbols**: `0 <= min <= max`; every symbol a type or attribute of a live
//!    value or node mentions exists.
//! 2. **Ids in range**: nodes in `order`; operands and results of live nodes;
//!    `inputs`, `outputs`, constants' values; node locations.
//! 3. **Schedule**: `order` holds each node at most once.
//! 4. **Definitions agree**: `values[inputs[i]].def == Input(i)`;
//!    `values[consts[c].value].def == Const(c)`; for each live node `n`,
//!    `values[outputs[i]].def == Node { n, i }`.
//! 5. **Defined before use**: inputs and constants are always defined; a node's
//!    results only after it in `order`; every operand of a live node is defined
//!    when the node runs, and every graph output at the end.
//! 6. **Operand counts** within [`crate::Op::operand_count`].
//! 7. **Attributes**: axes `< rank` (softmax, reductions, argmax, slice, concat,
//!    gather, layer_norm's `normalized_rank <= rank`); `perm` is a permutation of
//!    `0..rank`; conv/pool strides, kernels, dilations and groups `>= 1`,
//!    paddings `>= 0`, per-spatial-dim lists of equal length; slice step `>= 1`;
//!    adaptive pool sizes `>= 1`; a pool divisor only on avg_pool and `!= 0`; gather_elements/scatter_elements axis `< rank`;
//!    index_gather/index_put `axis + index count <= rank`; a fused program
//!    is well formed (`kiln_isa::register_types`, through inference).
//! 8. **Types**: each live node's result types equal [`crate::infer::infer_types`]
//!    of its operands: same count, dtypes exactly, ranks exactly, and dims not
//!    provably different ([`crate::infer::dims_equal`]; undecidable symbolic
//!    comparisons pass). Inference errors are reported as such.
//! 9. **Constants**: static, non-negative shape and
//!    `bytes.len() == numel * dtype.size_bytes()`.
//! 10. **Outputs**: `output_names` is parallel to `outputs`.
//!     **States** ([`crate::graph::StateSlot`]): each names an existing input
//!     and output, no input or output belongs to two states, the input and
//!     output have the same static type, and `init` holds that many bytes.
//! 11. **Data-dependent symbols** (those a live `bind_dim` binds): bound by
//!     one live `bind_dim` only; no graph input's type mentions them; no
//!     result type mentions one before its `bind_dim` in `order`; a
//!     `nonzero`'s count is one.
//! 12. **Nested graphs** (a `while`'s `cond` and `body`): each verifies on its
//!     own, its symbol table starts with its parent's, and it binds no
//!     data-dependent symbol.
//! 13. **Value attributes** ([`crate::ValueAttrs`]) of inputs, constants and
//!     live results: an `origin` is not empty, and no two graph inputs share
//!     one (an override that names an input must find one). A `sharding`
//!     needs a mesh, has the value's rank, names only the mesh's axes, each
//!     at most once, and its axes divide every static dim they split
//!     (a dynamic dim is never split).
//! 14. **Mesh** ([`crate::Mesh`]): at least one axis; names are identifiers,
//!     distinct; sizes `>= 1`; a device list holds `size` distinct ids.
//! 15. **Complex boundary**: no value has a complex dtype; each position in
//!     `complex_inputs` / `complex_outputs` exists, is listed once, is not a
//!     state's, and its value is f32 or f64 with a last dimension of 2.

use crate::infer::{check_permutation, dims_equal, infer_types};
use crate::{Dim, Graph, NodeId, Op, PoolKind, SecondaryMap, SymbolId, TensorType, ValueAttrs, ValueDef, ValueId};
use std::collections::HashMap;
use std::fmt;

/// Every invariant violation found, one message each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    pub errors: Vec<String>,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(e)?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifyError {}

/// Checks every invariant listed in the module doc.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    let mut v = Verifier { g, errors: vec![] };
    v.run();
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(VerifyError { errors: v.errors })
    }
}

struct Verifier<'a> {
    g: &'a Graph,
    errors: Vec<String>,
}

impl Verifier<'_> {
    fn error(&mut self, msg: String) {
        self.errors.push(msg);
    }

    /// `Graph::describe_node`, which indexes without checks, only when safe.
    fn node_name(&self, n: NodeId) -> String {
        match self.g.nodes.get(n) {
            Some(node) if node.loc.is_none_or(|l| self.g.locs.is_valid(l)) => self.g.describe_node(n),
            Some(node) => format!("{} ({n})", node.op.name()),
            None => format!("{n}"),
        }
    }

    fn run(&mut self) {
        let g = self.g;
        self.check_symbols();
        self.check_mesh();
        self.check_inputs_and_consts();
        self.check_input_origins();

        // Schedule walk: definitions, uses, counts, attributes, types.
        let mut defined: SecondaryMap<ValueId, bool> = SecondaryMap::new();
        for &v in &g.inputs {
            defined[v] = true;
        }
        for c in g.consts.values() {
            defined[c.value] = true;
        }
        let binder = self.check_binders();
        let mut bound: SecondaryMap<SymbolId, bool> = SecondaryMap::new();
        let mut scheduled: SecondaryMap<NodeId, bool> = SecondaryMap::new();
        for &n in &g.order {
            let Some(node) = g.nodes.get(n) else {
                self.error(format!("order: node {n} is out of range ({} nodes)", g.nodes.len()));
                continue;
            };
            let what = self.node_name(n);
            if std::mem::replace(&mut scheduled[n], true) {
                self.error(format!("{what}: appears more than once in the order"));
                continue;
            }
            if let Some(l) = node.loc.filter(|l| !g.locs.is_valid(*l)) {
                self.error(format!("{what}: location {l} is out of range"));
            }
            let mut operands_ok = true;
            for (i, &v) in node.inputs.iter().enumerate() {
                if !g.values.is_valid(v) {
                    self.error(format!("{what}: operand {i} ({v}) is out of range"));
                    operands_ok = false;
                } else if !defined[v] {
                    let why = match g.values[v].def {
                        ValueDef::Node { node: p, .. } if g.order.contains(&p) => {
                            "its producer comes later in the order"
                        }
                        ValueDef::Node { .. } => "its producer is not in the order",
                        _ => "it is not in the graph's inputs or constants",
                    };
                    self.error(format!("{what}: operand {i} ({v}) is used before it is defined: {why}"));
                }
            }
            let mut results_ok = true;
            for (i, &v) in node.outputs.iter().enumerate() {
                match g.values.get(v) {
                    None => {
                        self.error(format!("{what}: result {i} ({v}) is out of range"));
                        results_ok = false;
                    }
                    Some(d) => {
                        let want = ValueDef::Node { node: n, index: i as u32 };
                        if d.def != want {
                            self.error(format!("{what}: result {i} ({v}) is defined as {:?}, not by this node", d.def));
                        }
                        if defined[v] {
                            self.error(format!("{what}: result {i} ({v}) is already defined"));
                        }
                        defined[v] = true;
                        self.check_type_symbols(&format!("{what}: result {i} ({v})"), &d.ty);
                        self.check_value_attrs(&format!("{what}: result {i} ({v})"), &d.attrs, &d.ty);
                        self.check_bound_before_use(&format!("{what}: result {i} ({v})"), &d.ty, &binder, &bound);
                    }
                }
            }
            match node.op {
                Op::BindDim { symbol } if g.symbols.is_valid(symbol) => bound[symbol] = true,
                Op::NonZero { count } if !g.symbols.is_valid(count) || binder[count].is_none() => {
                    self.error(format!("{what}: its count symbol {count} is not bound by a bind_dim"))
                }
                Op::While { ref cond, ref body, .. } => self.check_regions(&what, cond, body),
                _ => {}
            }
            let (lo, hi) = node.op.operand_count();
            let count_ok = (lo..=hi).contains(&node.inputs.len());
            if !count_ok {
                self.error(format!("{what}: takes {lo}..={hi} operands, has {}", node.inputs.len()));
            }
            if operands_ok {
                let tys: Vec<&TensorType> = node.inputs.iter().map(|&v| &g.values[v].ty).collect();
                let attrs_ok = self.check_attrs(&what, &node.op, &tys);
                if attrs_ok && count_ok && results_ok {
                    self.check_result_types(&what, n, &tys);
                }
            }
        }

        if g.output_names.len() != g.outputs.len() {
            self.error(format!("{} outputs but {} output names", g.outputs.len(), g.output_names.len()));
        }
        for (i, &v) in g.outputs.iter().enumerate() {
            let name = g.output_names.get(i).map_or(String::new(), |s| format!(" `{s}`"));
            if !g.values.is_valid(v) {
                self.error(format!("output {i}{name}: {v} is out of range"));
            } else if !defined[v] {
                self.error(format!(
                    "output {i}{name}: {v} is not defined by the inputs, constants or a scheduled node"
                ));
            }
        }
        self.check_states();
        self.check_complex_boundary();
    }

    /// Check 15, for complex values (see [`Graph::complex_inputs`]).
    fn check_complex_boundary(&mut self) {
        let g = self.g;
        for (v, d) in g.values.iter() {
            if d.ty.dtype.is_complex() {
                self.error(format!(
                    "{v}: has dtype {}; complex values exist only at the program's boundary, as f32/f64 pairs",
                    d.ty.dtype
                ));
            }
        }
        let sides = [("input", &g.complex_inputs, &g.inputs), ("output", &g.complex_outputs, &g.outputs)];
        for (side, positions, values) in sides {
            for (k, &i) in positions.iter().enumerate() {
                let what = format!("complex {side} {i}");
                let Some(&v) = values.get(i) else {
                    self.error(format!("{what}: no such {side}"));
                    continue;
                };
                if positions[..k].contains(&i) {
                    self.error(format!("{what}: listed twice"));
                }
                let is_state = match side {
                    "input" => g.is_state_input(i),
                    _ => g.is_state_output(i),
                };
                if is_state {
                    self.error(format!("{what}: is a state's {side}"));
                }
                let Some(d) = g.values.get(v) else { continue }; // reported with the inputs and outputs
                if d.ty.dtype.complex_of().is_none() || d.ty.shape.last() != Some(&Dim::Const(2)) {
                    self.error(format!("{what}: its value is {:?}, not f32/f64 with a last dimension of 2", d.ty));
                }
            }
        }
    }

    /// Check 10, for the state slots.
    fn check_states(&mut self) {
        let g = self.g;
        for (k, s) in g.states.iter().enumerate() {
            let what = format!("state {k} `{}`", s.name);
            let (Some(&input), Some(&output)) = (g.inputs.get(s.input), g.outputs.get(s.output)) else {
                self.error(format!("{what}: input {} or output {} does not exist", s.input, s.output));
                continue;
            };
            if g.states[..k].iter().any(|o| o.input == s.input || o.output == s.output) {
                self.error(format!("{what}: shares its input or output with another state"));
            }
            if !g.values.is_valid(input) || !g.values.is_valid(output) {
                continue; // reported with the inputs and outputs
            }
            let (ti, to) = (g.ty(input), g.ty(output));
            let Some(shape) = ti.static_shape() else {
                self.error(format!("{what}: its type {ti:?} is not static"));
                continue;
            };
            if ti != to {
                self.error(format!("{what}: read as {ti:?} but updated as {to:?}"));
            }
            let bytes = shape.iter().product::<i64>() as usize * ti.dtype.size_bytes();
            if s.init.len() != bytes {
                self.error(format!("{what}: initial value has {} bytes, its type needs {bytes}", s.init.len()));
            }
        }
    }

    /// Check 12: a `while`'s nested graphs.
    fn check_regions(&mut self, what: &str, cond: &Graph, body: &Graph) {
        let g = self.g;
        for (name, r) in [("cond", cond), ("body", body)] {
            if let Err(e) = verify(r) {
                self.errors.extend(e.errors.into_iter().map(|e| format!("{what}: `{name}`: {e}")));
            }
            let prefix = r.symbols.len() <= g.symbols.len()
                && r.symbols
                    .iter()
                    .zip(g.symbols.values())
                    .all(|((_, a), b)| a.name == b.name && a.min == b.min && a.max == b.max);
            if !prefix {
                self.error(format!("{what}: `{name}`'s symbols are not its parent's"));
            }
            if !r.data_dependent_symbols().is_empty() {
                self.error(format!("{what}: `{name}` binds a data-dependent symbol, which a loop cannot"));
            }
        }
    }

    /// The live `bind_dim` of each data-dependent symbol (check 11); graph
    /// inputs must not be shaped by one.
    fn check_binders(&mut self) -> SecondaryMap<SymbolId, Option<NodeId>> {
        let g = self.g;
        let mut binder: SecondaryMap<SymbolId, Option<NodeId>> = SecondaryMap::new();
        for &n in &g.order {
            if let Some(Op::BindDim { symbol }) = g.nodes.get(n).map(|node| &node.op) {
                if !g.symbols.is_valid(*symbol) {
                    self.error(format!("{}: binds symbol {symbol}, which does not exist", self.node_name(n)));
                } else if let Some(first) = binder[*symbol] {
                    let name = &g.symbols[*symbol].name;
                    self.error(format!(
                        "{}: symbol `{name}` is already bound by {}",
                        self.node_name(n),
                        self.node_name(first)
                    ));
                } else {
                    binder[*symbol] = Some(n);
                }
            }
        }
        for (i, &v) in g.inputs.iter().enumerate() {
            let Some(d) = g.values.get(v) else { continue };
            let mut used = Vec::new();
            d.ty.shape.iter().for_each(|dim| dim.collect_symbols(&mut used));
            for s in used.into_iter().filter(|&s| g.symbols.is_valid(s) && binder[s].is_some()) {
                self.error(format!(
                    "input {i} ({v}): its shape uses `{}`, which is bound from data at run time",
                    g.symbols[s].name
                ));
            }
        }
        binder
    }

    fn check_bound_before_use(
        &mut self,
        what: &str,
        ty: &TensorType,
        binder: &SecondaryMap<SymbolId, Option<NodeId>>,
        bound: &SecondaryMap<SymbolId, bool>,
    ) {
        let mut used = Vec::new();
        ty.shape.iter().for_each(|d| d.collect_symbols(&mut used));
        for s in used.into_iter().filter(|&s| self.g.symbols.is_valid(s)) {
            if let Some(b) = binder[s].filter(|_| !bound[s]) {
                let msg = format!(
                    "{what}: its shape uses `{}` before {} binds it",
                    self.g.symbols[s].name,
                    self.node_name(b)
                );
                self.error(msg);
            }
        }
    }

    /// Check 13 for one value.
    fn check_value_attrs(&mut self, what: &str, attrs: &ValueAttrs, ty: &TensorType) {
        if attrs.origin.as_deref() == Some("") {
            self.error(format!("{what}: its origin is empty (absent is `None`)"));
        }
        if let Some(sharding) = &attrs.sharding {
            match &self.g.mesh {
                None => self.error(format!("{what}: has sharding {sharding} but the graph has no mesh")),
                Some(mesh) => {
                    let shape: Vec<Option<i64>> = ty.shape.iter().map(Dim::as_const).collect();
                    for p in sharding.problems(mesh, &shape) {
                        self.error(format!("{what}: {p}"));
                    }
                }
            }
        }
    }

    /// Check 14: the mesh is well formed.
    fn check_mesh(&mut self) {
        if let Some(mesh) = &self.g.mesh {
            for p in mesh.problems() {
                self.error(format!("mesh: {p}"));
            }
        }
    }

    /// Check 13 across the graph inputs: distinct origins.
    fn check_input_origins(&mut self) {
        let g = self.g;
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (i, &v) in g.inputs.iter().enumerate() {
            let Some(origin) = g.values.get(v).and_then(|d| d.attrs.origin.as_deref()) else { continue };
            match first.get(origin) {
                Some(j) => self.error(format!("input {i} ({v}): origin `{origin}` is already input {j}'s")),
                None => {
                    first.insert(origin, i);
                }
            }
        }
    }

    fn check_symbols(&mut self) {
        for (s, sym) in self.g.symbols.iter() {
            if sym.min < 0 || sym.max.is_some_and(|m| m < sym.min) {
                let max = sym.max.map_or("inf".to_string(), |m| m.to_string());
                self.error(format!("symbol `{}` ({s}): invalid range [{}, {max}]", sym.name, sym.min));
            }
        }
    }

    fn check_dim_symbols(&mut self, what: &str, d: &Dim) {
        let mut used: Vec<SymbolId> = vec![];
        d.collect_symbols(&mut used);
        for s in used {
            if !self.g.symbols.is_valid(s) {
                self.error(format!("{what}: mentions symbol {s}, which does not exist"));
            }
        }
    }

    fn check_type_symbols(&mut self, what: &str, ty: &TensorType) {
        for d in &ty.shape {
            self.check_dim_symbols(what, d);
        }
    }

    fn check_inputs_and_consts(&mut self) {
        let g = self.g;
        for (i, &v) in g.inputs.iter().enumerate() {
            match g.values.get(v) {
                None => self.error(format!("input {i}: {v} is out of range")),
                Some(d) => {
                    if d.def != ValueDef::Input(i as u32) {
                        self.error(format!("input {i} ({v}): defined as {:?}, not Input({i})", d.def));
                    }
                    self.check_value_attrs(&format!("input {i} ({v})"), &d.attrs, &d.ty);
                    self.check_type_symbols(&format!("input {i} ({v})"), &d.ty);
                }
            }
        }
        for (c, data) in g.consts.iter() {
            let v = data.value;
            let Some(d) = g.values.get(v) else {
                self.error(format!("constant {c}: value {v} is out of range"));
                continue;
            };
            let what = match &d.name {
                Some(name) => format!("constant {c} ({v}, `{name}`)"),
                None => format!("constant {c} ({v})"),
            };
            if d.def != ValueDef::Const(c) {
                self.error(format!("{what}: defined as {:?}, not Const({c})", d.def));
            }
            self.check_value_attrs(&what, &d.attrs, &d.ty);
            match d.ty.static_shape() {
                Some(shape) if shape.iter().all(|&x| x >= 0) => {
                    let numel = shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x as usize));
                    let want = numel.and_then(|n| n.checked_mul(d.ty.dtype.size_bytes()));
                    if want != Some(data.bytes.len()) {
                        self.error(format!(
                            "{what}: {} bytes, but shape {shape:?} of {} needs {}",
                            data.bytes.len(),
                            d.ty.dtype,
                            want.map_or("more than usize::MAX".to_string(), |w| w.to_string())
                        ));
                    }
                }
                _ => self.error(format!("{what}: shape must be static and non-negative")),
            }
        }
    }

    /// Attribute sanity that does not need inference; false when broken (then
    /// type inference is skipped, it would only repeat the complaint).
    fn check_attrs(&mut self, what: &str, op: &Op, tys: &[&TensorType]) -> bool {
        let before = self.errors.len();
        let rank = tys.first().map(|t| t.rank());
        let axis = |errors: &mut Vec<String>, name: &str, a: usize| {
            if let Some(r) = rank.filter(|&r| a >= r) {
                errors.push(format!("{what}: {name} {a} out of range for rank {r}"));
            }
        };
        let at_least = |errors: &mut Vec<String>, name: &str, v: &[i64], min: i64| {
            if let Some(x) = v.iter().find(|&&x| x < min) {
                errors.push(format!("{what}: {name} must be >= {min}, got {x}"));
            }
        };
        let e = &mut self.errors;
        match op {
            Op::Softmax { axis: a } | Op::LogSoftmax { axis: a } | Op::Concat { axis: a } | Op::Gather { axis: a } => {
                axis(e, "axis", *a)
            }
            Op::ArgMax { axis: a, .. }
            | Op::ArgMin { axis: a, .. }
            | Op::CumSum { axis: a }
            | Op::Scan { axis: a, .. } => axis(e, "axis", *a),
            Op::GatherElements { axis: a } | Op::ScatterElements { axis: a, .. } => axis(e, "axis", *a),
            Op::IndexGather { axis: a } | Op::IndexPut { axis: a, .. } => {
                let k = tys.len().saturating_sub(if matches!(op, Op::IndexPut { .. }) { 2 } else { 1 });
                if let Some(r) = rank.filter(|&r| a + k > r) {
                    e.push(format!("{what}: {k} index tensors from axis {a} exceed rank {r}"));
                }
            }
            Op::Sort { axis: a, k, .. } => {
                axis(e, "axis", *a);
                self.check_dim_symbols(what, &k.clone());
            }
            Op::Flip { axes } => {
                for &a in axes {
                    axis(e, "axis", a);
                }
            }
            Op::Upsample { size, .. } => {
                for d in size.clone() {
                    self.check_dim_symbols(what, &d);
                }
            }
            Op::Slice { axis: a, step, .. } => {
                axis(e, "axis", *a);
                at_least(e, "slice step", &[*step], 1);
            }
            Op::Reduce { axes, .. } => {
                for &a in axes {
                    axis(e, "axis", a);
                }
                let mut sorted = axes.clone();
                sorted.sort_unstable();
                sorted.dedup();
                if sorted.len() != axes.len() {
                    e.push(format!("{what}: repeated axes {axes:?}"));
                }
            }
            Op::LayerNorm { normalized_rank, .. } | Op::RmsNorm { normalized_rank, .. } => {
                if let Some(r) = rank.filter(|&r| *normalized_rank > r) {
                    e.push(format!("{what}: normalized_rank {normalized_rank} exceeds rank {r}"));
                }
            }
            Op::Permute { perm } => {
                if let Some(r) = rank {
                    if let Err(m) = check_permutation(perm, r) {
                        e.push(format!("{what}: {m}"));
                    }
                }
            }
            Op::Conv { stride, padding, dilation, groups }
            | Op::ConvFused { stride, padding, dilation, groups, .. } => {
                at_least(e, "stride", stride, 1);
                at_least(e, "dilation", dilation, 1);
                at_least(e, "padding", padding, 0);
                at_least(e, "groups", &[*groups], 1);
                if padding.len() != stride.len() || dilation.len() != stride.len() {
                    e.push(format!("{what}: stride, padding and dilation lengths differ"));
                }
            }
            Op::Pool { kind, kernel, stride, padding, dilation, divisor, layout, .. } => {
                if *layout == crate::Layout::ChannelsLast && (*kind == PoolKind::ArgMax || kernel.len() != 2) {
                    e.push(format!("{what}: a channels-last pool is a 2-d max or avg pool"));
                }
                match (kind, divisor) {
                    (_, None) => {}
                    (PoolKind::Avg, Some(0)) => e.push(format!("{what}: divisor must not be 0")),
                    (PoolKind::Avg, Some(_)) => {}
                    (_, Some(_)) => e.push(format!("{what}: only avg_pool takes a divisor")),
                }
                at_least(e, "kernel", kernel, 1);
                at_least(e, "stride", stride, 1);
                at_least(e, "dilation", dilation, 1);
                at_least(e, "padding", padding, 0);
                let n = kernel.len();
                if stride.len() != n || padding.len() != n || dilation.len() != n {
                    e.push(format!("{what}: kernel, stride, padding and dilation lengths differ"));
                }
            }
            Op::AdaptiveAvgPool { output } => at_least(e, "output size", output, 1),
            Op::Reshape { shape } | Op::Expand { shape } | Op::Full { shape, .. } | Op::Random { shape, .. } => {
                for d in shape.clone() {
                    self.check_dim_symbols(what, &d);
                }
            }
            Op::Arange { len, .. } => self.check_dim_symbols(what, &len.clone()),
            _ => {}
        }
        self.errors.len() == before
    }

    fn check_result_types(&mut self, what: &str, n: NodeId, tys: &[&TensorType]) {
        let g = self.g;
        let node = &g.nodes[n];
        let want = match infer_types(&g.symbols, &node.op, tys) {
            Ok(w) => w,
            Err(e) => return self.error(format!("{what}: {e}")),
        };
        if want.len() != node.outputs.len() {
            return self.error(format!("{what}: has {} results, the op produces {}", node.outputs.len(), want.len()));
        }
        for (i, (w, &v)) in want.iter().zip(&node.outputs).enumerate() {
            let have = &g.values[v].ty;
            let show = |t: &TensorType| crate::text::format_type(g, t);
            let definitely_differs = have.dtype != w.dtype
                || have.rank() != w.rank()
                || have.shape.iter().zip(&w.shape).any(|(a, b)| dims_equal(a, b, &g.symbols) == Some(false));
            if definitely_differs {
                self.error(format!("{what}: result {i} ({v}) has type {}, but the op gives {}", show(have), show(w)));
            }
        }
    }
}
