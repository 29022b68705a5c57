//! The data-flow graph: arenas of values, nodes and constants, plus a schedule.
//!
//! *What* is computed (nodes and their operands) is kept apart from *order*
//! ([`Graph::order`], a topological schedule). Removing a node from `order` is how
//! a pass deletes it; the arena slot stays so that ids never dangle.

use crate::{ConstId, DType, Dim, LocId, NodeId, Op, Symbol, SymbolId, ValueId};
use crate::{Mesh, PrimaryMap, SecondaryMap, Sharding};
use std::ops::Range;
use std::sync::Arc;

/// Type of a tensor value: element type and (possibly symbolic) shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> TensorType {
        TensorType { dtype, shape }
    }

    pub fn fixed(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType { dtype, shape: shape.iter().map(|&d| Dim::Const(d)).collect() }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The shape when every dimension is static.
    pub fn static_shape(&self) -> Option<Vec<i64>> {
        self.shape.iter().map(Dim::as_const).collect()
    }

    /// Number of elements as a dimension expression.
    pub fn numel(&self) -> Dim {
        self.shape.iter().cloned().fold(Dim::Const(1), Dim::mul)
    }
}

/// Where a value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The `n`-th graph input.
    Input(u32),
    /// Output `index` of `node`.
    Node { node: NodeId, index: u32 },
    /// A constant (weight or literal).
    Const(ConstId),
}

#[derive(Clone, Debug)]
pub struct ValueData {
    pub ty: TensorType,
    pub def: ValueDef,
    /// The name the value had in the source program, kept for diagnostics and I/O names.
    /// A label, not an attribute: a value that replaces this one does not take it.
    pub name: Option<String>,
    /// What passes must carry along with the value (see [`ValueAttrs`]).
    pub attrs: ValueAttrs,
}

/// Per-value attributes that survive rewrites.
///
/// They live on the value itself rather than in side tables keyed by
/// [`ValueId`], which compaction renumbers and rewrites replace. Two rules keep
/// them valid: compaction copies them to the renumbered value, and when a
/// rewrite replaces value `a` by `b` (replace-all-uses, a pass's replacement)
/// `b` inherits each attribute of `a` that `b` does not have
/// ([`ValueAttrs::inherit`]). The text form prints the ones that are set,
/// after the value's type: `%3: f32[4, 2] {origin="fc.weight"}`.
///
/// Quantization parameters will be a field here, added with the passes that
/// compute them; each field says how it is inherited and verified.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ValueAttrs {
    /// The fully qualified Python name of the program input, parameter,
    /// buffer or lifted constant whose data this value holds (`x`,
    /// `encoder.layers.0.fc1.weight`): what quantization and sharding
    /// overrides select tensors by. Set by the importer on graph inputs and
    /// weights; a constant folded from one weight by a layout op or a cast (a
    /// transposed `linear` weight) keeps it, as does a weight rescaled by
    /// fusion. Never empty (the verifier checks).
    pub origin: Option<String>,
    /// How the value is laid out over [`Graph::mesh`]: set on inputs and
    /// weights by a sharding strategy or the user, on intermediates by
    /// propagation. Inherited like `origin` (a replacement holds the same
    /// data). The verifier checks it against the mesh and the value's type.
    pub sharding: Option<Sharding>,
}

impl ValueAttrs {
    /// A value that holds the data of the program tensor named `origin`.
    pub fn with_origin(origin: impl Into<String>) -> ValueAttrs {
        ValueAttrs { origin: Some(origin.into()), sharding: None }
    }

    /// No attribute is set.
    pub fn is_empty(&self) -> bool {
        self.origin.is_none() && self.sharding.is_none()
    }

    /// Takes every attribute of `replaced` that `self` lacks: what the value
    /// that replaces `replaced` keeps of it. Attributes `self` already has win.
    pub fn inherit(&mut self, replaced: &ValueAttrs) {
        if self.origin.is_none() {
            self.origin.clone_from(&replaced.origin);
        }
        if self.sharding.is_none() {
            self.sharding.clone_from(&replaced.sharding);
        }
    }
}

#[derive(Clone, Debug)]
pub struct NodeData {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub loc: Option<LocId>,
}

/// Source location of a node: the exported node's name and its Python stack trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub node_name: String,
    pub stack_trace: Option<String>,
}

impl Location {
    /// `file:line` of the innermost stack frame in the user's code: frames inside
    /// the installed torch package (`nn.Linear.forward`, ...) are skipped, since
    /// the line that matters is the model's; falls back to the innermost frame.
    pub fn python_line(&self) -> Option<String> {
        let trace = self.stack_trace.as_deref()?;
        let frames: Vec<(&str, &str)> = trace.lines().filter_map(parse_frame).collect();
        // torch's own frames, and code it generated (`<eval_with_key>.5`,
        // the wrappers of higher-order ops), are not the user's line.
        let in_torch = |file: &str| {
            let f = file.replace('\\', "/");
            f.starts_with('<') || ["site-packages/torch/", "dist-packages/torch/"].iter().any(|p| f.contains(p))
        };
        let (file, line) = frames.iter().rev().find(|(f, _)| !in_torch(f)).or(frames.last())?;
        Some(if line.is_empty() { file.to_string() } else { format!("{file}:{line}") })
    }
}

/// `File "path", line N, in fn` → `(path, N)`.
fn parse_frame(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once('"')?;
    let digits = rest.trim_start_matches(", line ");
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    Some((file, &digits[..end]))
}

/// Bytes of a constant, shared rather than copied: weights point into the
/// memory-mapped source file.
#[derive(Clone)]
pub struct ConstBytes {
    buf: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl ConstBytes {
    /// A view of `range` inside `buf`; panics if out of range (the caller checked it).
    pub fn shared(buf: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> ConstBytes {
        assert!(range.start <= range.end && range.end <= (*buf).as_ref().len(), "constant range out of bounds");
        ConstBytes { buf, range }
    }

    pub fn owned(bytes: Vec<u8>) -> ConstBytes {
        let len = bytes.len();
        ConstBytes { buf: Arc::new(bytes), range: 0..len }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &(*self.buf).as_ref()[self.range.clone()]
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl std::fmt::Debug for ConstBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConstBytes({} bytes)", self.len())
    }
}

#[derive(Clone, Debug)]
pub struct ConstData {
    /// The value this constant defines.
    pub value: ValueId,
    /// Row-major, little-endian element bytes; `len == numel * dtype size`.
    pub bytes: ConstBytes,
}

/// A whole program: one function from inputs to outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub symbols: PrimaryMap<SymbolId, Symbol>,
    pub values: PrimaryMap<ValueId, ValueData>,
    pub nodes: PrimaryMap<NodeId, NodeData>,
    pub consts: PrimaryMap<ConstId, ConstData>,
    pub locs: PrimaryMap<LocId, Location>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Names of the outputs, parallel to `outputs`.
    pub output_names: Vec<String>,
    /// The schedule: every live node exactly once, operands before users.
    pub order: Vec<NodeId>,
    /// Buffers the program mutates: each is read from a graph input and its
    /// new value is a graph output; the runtime keeps it between runs.
    pub states: Vec<StateSlot>,
    /// The devices the program is sharded over; `None` for one device. Every
    /// [`ValueAttrs::sharding`] names its axes.
    pub mesh: Option<Mesh>,
    /// Positions in [`Graph::inputs`] the caller passes as complex tensors
    /// (torch's complex64/complex128). The graph value is their f32/f64
    /// parts, one more trailing dimension of 2 (interleaved real, imaginary:
    /// the same bytes as the complex tensor), so nothing inside the program
    /// is complex; only the boundary's declared dtype and shape differ.
    /// Positions, like [`StateSlot`]'s, so rewrites and `compact` carry them.
    pub complex_inputs: Vec<usize>,
    /// Positions in [`Graph::outputs`] the caller receives as complex
    /// tensors (same convention as [`Graph::complex_inputs`]).
    pub complex_outputs: Vec<usize>,
}

/// A buffer that persists between runs (a counter, a filter's state, a KV
/// cache). The program reads its current value from graph input `input` and
/// leaves the value for the next run in graph output `output`; neither is a
/// user input or output. Indices rather than value ids, so rewrites that
/// replace uses and `compact` (which keeps input and output positions) carry it.
#[derive(Clone, Debug)]
pub struct StateSlot {
    /// The buffer's fully-qualified name (`blocks.0.cache_k`).
    pub name: String,
    /// Position in [`Graph::inputs`].
    pub input: usize,
    /// Position in [`Graph::outputs`].
    pub output: usize,
    /// The value before the first run (the module's buffer), `numel * dtype size` bytes.
    pub init: ConstBytes,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    pub fn add_symbol(&mut self, name: impl Into<String>, min: i64, max: Option<i64>) -> SymbolId {
        self.symbols.push(Symbol { name: name.into(), min, max })
    }

    pub fn symbol_by_name(&self, name: &str) -> Option<SymbolId> {
        self.symbols.iter().find(|(_, s)| s.name == name).map(|(id, _)| id)
    }

    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let index = self.inputs.len() as u32;
        let v = self.values.push(ValueData {
            ty,
            def: ValueDef::Input(index),
            name: Some(name.into()),
            attrs: ValueAttrs::default(),
        });
        self.inputs.push(v);
        v
    }

    pub fn add_const(&mut self, name: Option<String>, ty: TensorType, bytes: ConstBytes) -> ValueId {
        let c = self.consts.next_key();
        let v = self.values.push(ValueData { ty, def: ValueDef::Const(c), name, attrs: ValueAttrs::default() });
        self.consts.push(ConstData { value: v, bytes });
        v
    }

    /// Whether graph input `index` is a state's current value (not a user input).
    pub fn is_state_input(&self, index: usize) -> bool {
        self.states.iter().any(|s| s.input == index)
    }

    /// Whether graph output `index` is a state's next value (not a user output).
    pub fn is_state_output(&self, index: usize) -> bool {
        self.states.iter().any(|s| s.output == index)
    }

    /// Whether the caller passes graph input `index` as a complex tensor.
    pub fn is_complex_input(&self, index: usize) -> bool {
        self.complex_inputs.contains(&index)
    }

    /// Whether the caller receives graph output `index` as a complex tensor.
    pub fn is_complex_output(&self, index: usize) -> bool {
        self.complex_outputs.contains(&index)
    }

    pub fn add_output(&mut self, name: impl Into<String>, value: ValueId) {
        self.outputs.push(value);
        self.output_names.push(name.into());
    }

    /// Appends a node at the end of the schedule; returns it with its output values.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: Vec<ValueId>,
        output_types: Vec<TensorType>,
        loc: Option<LocId>,
    ) -> NodeId {
        let node = self.nodes.push(NodeData { op, inputs, outputs: Vec::new(), loc });
        let outputs = output_types
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                let def = ValueDef::Node { node, index: i as u32 };
                self.values.push(ValueData { ty, def, name: None, attrs: ValueAttrs::default() })
            })
            .collect();
        self.nodes[node].outputs = outputs;
        self.order.push(node);
        node
    }

    /// Single-output convenience over [`Graph::add_node`].
    pub fn push(&mut self, op: Op, inputs: Vec<ValueId>, ty: TensorType, loc: Option<LocId>) -> ValueId {
        let n = self.add_node(op, inputs, vec![ty], loc);
        self.nodes[n].outputs[0]
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v].ty
    }

    pub fn const_of(&self, v: ValueId) -> Option<&ConstData> {
        match self.values[v].def {
            ValueDef::Const(c) => Some(&self.consts[c]),
            _ => None,
        }
    }

    pub fn producer(&self, v: ValueId) -> Option<NodeId> {
        match self.values[v].def {
            ValueDef::Node { node, .. } => Some(node),
            _ => None,
        }
    }

    /// Rewrites every use of each key of `map` to its value, in one sweep over the
    /// graph (O(operands)). Chains (`a -> b -> c`) are followed. The final
    /// replacement of each key inherits its attributes ([`ValueAttrs::inherit`];
    /// keys in id order, so the earliest replaced value's attributes win).
    pub fn replace_uses(&mut self, map: &SecondaryMap<ValueId, Option<ValueId>>) {
        let resolve = |mut v: ValueId| {
            let mut hops = 0;
            while let Some(next) = map[v] {
                v = next;
                hops += 1;
                assert!(hops <= map.keys().count(), "cycle in value replacement map");
            }
            v
        };
        for old in map.keys().filter(|&k| map[k].is_some()) {
            let new = resolve(old);
            if new != old && !self.values[old].attrs.is_empty() {
                let attrs = self.values[old].attrs.clone();
                self.values[new].attrs.inherit(&attrs);
            }
        }
        for &n in &self.order {
            for input in &mut self.nodes[n].inputs {
                *input = resolve(*input);
            }
        }
        for out in &mut self.outputs {
            *out = resolve(*out);
        }
    }

    /// Replaces every use of `old` with `new` (one sweep; batch with [`Graph::replace_uses`]).
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        let mut map = SecondaryMap::new();
        map[old] = Some(new);
        self.replace_uses(&map);
    }

    /// Number of uses of every value by live nodes and graph outputs.
    pub fn use_counts(&self) -> SecondaryMap<ValueId, u32> {
        let mut counts = SecondaryMap::new();
        for &n in &self.order {
            for &i in &self.nodes[n].inputs {
                counts[i] += 1;
            }
        }
        for &o in &self.outputs {
            counts[o] += 1;
        }
        counts
    }

    /// Symbols bound from run-time data by a scheduled [`Op::BindDim`].
    pub fn data_dependent_symbols(&self) -> Vec<SymbolId> {
        self.order
            .iter()
            .filter_map(|&n| match self.nodes.get(n).map(|node| &node.op) {
                Some(Op::BindDim { symbol }) => Some(*symbol),
                _ => None,
            })
            .collect()
    }

    /// Description of a node for diagnostics: `op (torch node name) at file:line`.
    pub fn describe_node(&self, n: NodeId) -> String {
        let node = &self.nodes[n];
        let mut s = format!("{} ({n})", node.op.name());
        if let Some(loc) = node.loc.map(|l| &self.locs[l]) {
            s.push_str(&format!(" from `{}`", loc.node_name));
            if let Some(line) = loc.python_line() {
                s.push_str(&format!(" at {line}"));
            }
        }
        s
    }
}

#[cfg(test)]
mod location_tests {
    use super::Location;

    #[test]
    fn python_line_prefers_the_users_frame() {
        let trace = "  File \"/home/me/model.py\", line 42, in forward\n    x = self.fc(x)\n  File \"/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py\", line 134, in forward\n    return F.linear(input, self.weight, self.bias)\n";
        let loc = Location { node_name: "linear".into(), stack_trace: Some(trace.into()) };
        assert_eq!(loc.python_line().as_deref(), Some("/home/me/model.py:42"));
        let only_torch =
            "  File \"/venv/lib/python3.11/site-packages/torch/nn/modules/conv.py\", line 565, in forward\n";
        let loc = Location { node_name: "conv".into(), stack_trace: Some(only_torch.into()) };
        assert_eq!(
            loc.python_line().as_deref(),
            Some("/venv/lib/python3.11/site-packages/torch/nn/modules/conv.py:565")
        );
        assert_eq!(Location::default().python_line(), None);
        let generated = "File \"/home/me/model.py\", line 7, in forward\n    a = torch.cond(p, f, g, (x,))\n  File \"<eval_with_key>.5\", line 12, in forward\n";
        let loc = Location { node_name: "cond".into(), stack_trace: Some(generated.into()) };
        assert_eq!(loc.python_line().as_deref(), Some("/home/me/model.py:7"));
    }
}
