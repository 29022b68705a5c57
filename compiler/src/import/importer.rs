//! The walk over the program: environments, argument access, node loop.

use super::custom::ImportOptions;
use super::error::{ImportError, Problem, UnsupportedList};
use super::ops;
use super::scope::{PendingBind, Scope};
use super::state::Bound;
use crate::pt2::program::{Arg, InputSpec, Node, OutputSpec, SubGraph, SymExpr, SymIntArg, TensorMeta};
use crate::pt2::weights::{self, WeightError};
use crate::pt2::{scalar_type, sympy, Pt2File, CONSTANTS_DIR, WEIGHTS_DIR};
use kiln_ir::{ConstBytes, DType, Dim, Graph, LocId, Location, Op, SymbolId, TensorType, ValueAttrs, ValueId};
use std::collections::HashMap;

/// Why a node could not be converted.
pub(crate) enum Fail {
    /// Valid program, but kiln cannot express it; collected and reported.
    Unsupported(Option<String>),
    /// The program is inconsistent; stops the import.
    Invalid(String),
}

pub(crate) type R<T> = Result<T, Fail>;

pub(crate) fn unsupported<T>(reason: impl Into<String>) -> R<T> {
    Err(Fail::Unsupported(Some(reason.into())))
}

pub(crate) fn invalid<T>(detail: impl Into<String>) -> R<T> {
    Err(Fail::Invalid(detail.into()))
}

/// The most elements of a table the importer computes itself from sizes in
/// the file (gather positions, resampling taps, window and DFT matrices,
/// filled constants): a hostile size must be an error, not an allocation.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 1 << 24;

/// The most bytes one tensor may take at its largest shape (1 TiB): memory
/// is planned for that shape, and a hostile size must not overflow the
/// planner's sums.
pub(crate) const MAX_TENSOR_BYTES: u64 = 1 << 40;

/// The element count of a `dims` table `what` computes, refused when a size
/// is negative, the product overflows or exceeds [`MAX_TABLE_ELEMENTS`].
pub(crate) fn table_len(what: &str, dims: &[i64]) -> R<usize> {
    let count = dims.iter().try_fold(1usize, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)));
    match count {
        Some(n) if n <= MAX_TABLE_ELEMENTS => Ok(n),
        Some(n) => unsupported(format!(
            "{what} needs a table of {n} elements computed at compile time (kiln allows {MAX_TABLE_ELEMENTS})"
        )),
        None => invalid(format!("{what}: sizes {dims:?} are negative or overflow")),
    }
}

/// An i64 computed from values in the file, or an error naming `what` when
/// the arithmetic overflowed (`None`).
pub(crate) fn checked(what: &str, v: Option<i64>) -> R<i64> {
    v.map_or_else(|| invalid(format!("{what} overflows a 64-bit integer")), Ok)
}

/// Dim `axis` of `ty`, or an error naming `what` (a type from the file may
/// have fewer dims than the op needs).
pub(crate) fn dim_at(ty: &TensorType, axis: usize, what: &str) -> R<Dim> {
    match ty.shape.get(axis) {
        Some(d) => Ok(d.clone()),
        None => invalid(format!("{what} has rank {}, no dim {axis}", ty.rank())),
    }
}

/// A Python scalar argument.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
}

pub(crate) struct Importer<'p> {
    pub file: &'p Pt2File,
    pub options: &'p ImportOptions,
    /// The IR graph being built: the program's, or a loop's nested graph
    /// while one is converted ([`Importer::with_graph`]).
    pub g: Graph,
    /// The naming state of the graph being converted (see `scope.rs`).
    pub(crate) scope: Scope<'p>,
    /// The enclosing graphs' scopes while a nested graph is converted
    /// ([`Importer::with_scope`]), innermost last.
    pub(crate) outer_scopes: Vec<Scope<'p>>,
    /// The next `Op::Random` stream number: unique per random op.
    next_stream: u32,
    pub(crate) problems: Vec<Problem>,
    /// Parameters, buffers and constants as first bound, and user inputs:
    /// what `state.rs` compares the final bindings with.
    pub(crate) weight_bindings: Vec<Bound>,
    pub(crate) user_input_bindings: Vec<Bound>,
    /// Symbolic scalars read with `.item()` (`_local_scalar_dense`) → the 0-d
    /// tensor they were read from, for their uses as operands.
    pub(crate) items: HashMap<String, ValueId>,
    /// Unbacked symbols from `.item()` not bound yet: a `BindDim` is emitted
    /// just before the first node whose shapes use one (see [`Importer::ensure_bound`]).
    pub(crate) pending_binds: HashMap<SymbolId, PendingBind>,
    /// Complex program values (scoped name → real and imaginary parts, both
    /// of the matching real dtype): kiln's IR has no complex dtype, so only
    /// the ops of `ops/fft.rs` read and make them (see there).
    complex: HashMap<String, (ValueId, ValueId)>,
}

/// Where complex values may appear; the end of every message about one.
pub(crate) const COMPLEX_SCOPE: &str = "complex values (complex64/complex128 program inputs, outputs and \
     intermediates) are supported through the FFT ops (_fft_r2c/_fft_c2r/_fft_c2c, torch.fft.rfft/irfft/fft/ifft \
     and their 2-d/n-d forms), view_as_real, view_as_complex, complex, real, imag, abs, angle, conj, neg, exp, \
     add/sub/mul/div (with tensors or Python numbers, complex ones included), pow, matmul, sum/mean, \
     the roots, logarithms, trigonometric and hyperbolic functions and their inverses, sigmoid, sgn, \
     isnan/isinf/isfinite/isreal, eq/ne, where and shape ops";

impl<'p> Importer<'p> {
    pub fn new(file: &'p Pt2File, options: &'p ImportOptions) -> Importer<'p> {
        let mut g = Graph::new();
        for (name, min, max) in &file.program.range_constraints {
            // IR symbols are sizes (>= 0); an unbacked symbol from `.item()`
            // may have a negative range, which only matters as a scalar.
            g.add_symbol(name.clone(), (*min).max(0), max.map(|m| m.max(0)));
        }
        let program = &file.program;
        let outputs = program.output_specs.iter().flat_map(|spec| match spec {
            OutputSpec::User(arg) => tensor_names(arg).collect::<Vec<_>>(),
            OutputSpec::Other { arg, .. } => vec![arg.as_str()],
        });
        let scope = Scope::new(String::new(), &program.tensor_values, &program.sym_int_values, &program.nodes, outputs);
        Importer {
            file,
            options,
            g,
            scope,
            outer_scopes: Vec::new(),
            next_stream: 0,
            problems: Vec::new(),
            weight_bindings: Vec::new(),
            user_input_bindings: Vec::new(),
            items: HashMap::new(),
            pending_binds: HashMap::new(),
            complex: HashMap::new(),
        }
    }

    pub fn run(mut self) -> Result<Graph, ImportError> {
        let program = &self.file.program;
        if let Some((name, min, Some(max))) =
            program.range_constraints.iter().find(|(_, min, max)| max.is_some_and(|m| m < *min))
        {
            return Err(ImportError::Invalid(format!("range_constraints: `{name}` has min {min} > max {max}")));
        }
        for spec in &program.input_specs {
            self.bind_input(spec)?;
        }
        self.convert_nodes(&program.nodes, None)?;
        self.scope.loc = None;
        let mut user_outputs = 0;
        for spec in &program.output_specs {
            match spec {
                OutputSpec::User(Arg::Tensor(name)) => {
                    let output_name = format!("output_{user_outputs}");
                    user_outputs += 1;
                    if self.scope.poisoned.contains(name) {
                        continue;
                    }
                    if let Some((re, im)) = self.complex(name) {
                        // The caller's complex tensor is the parts interleaved.
                        match ops::fft::interleave(&mut self, re, im) {
                            Ok(v) => {
                                self.g.add_output(output_name, v);
                                self.g.complex_outputs.push(self.g.outputs.len() - 1);
                            }
                            Err(e) => self.output_failure(name, e)?,
                        }
                        continue;
                    }
                    let v =
                        *self.scope.env.get(name).ok_or_else(|| {
                            ImportError::Invalid(format!("output `{name}` is not produced by any node"))
                        })?;
                    self.g.add_output(output_name, v);
                }
                OutputSpec::User(other) => {
                    user_outputs += 1;
                    self.problems.push(Problem {
                        what: "user output".into(),
                        node: format!("output_{}", user_outputs - 1),
                        at: None,
                        reason: Some(format!("non-tensor output {other:?}")),
                    });
                }
                // State updates (buffer_mutation, user_input_mutation):
                // `bind_state` below; tokens are refused with their inputs.
                OutputSpec::Other { .. } => {}
            }
        }
        self.bind_state();
        if self.problems.is_empty() {
            Ok(self.g)
        } else {
            Err(ImportError::Unsupported(UnsupportedList(self.problems)))
        }
    }

    /// Converts `nodes` in order, collecting unsupported ones. `outer` is the
    /// location of the higher-order node whose nested graph these nodes are:
    /// where their own stack traces point into torch's generated code
    /// (`<eval_with_key>`), the outer node's Python line is reported instead.
    pub(crate) fn convert_nodes(&mut self, nodes: &'p [Node], outer: Option<LocId>) -> Result<(), ImportError> {
        for (i, node) in nodes.iter().enumerate() {
            self.scope.node_index = i;
            let generated = node.stack_trace.as_deref().is_none_or(|t| t.contains("<eval_with_key>"));
            let stack_trace = match outer {
                Some(o) if generated => self.g.locs[o].stack_trace.clone(),
                _ => node.stack_trace.clone(),
            };
            let loc =
                self.g.locs.push(Location { node_name: format!("{}{}", self.scope.prefix, node.name), stack_trace });
            self.scope.loc = Some(loc);
            if node.inputs.iter().any(|a| tensor_names(&a.arg).any(|n| self.scope.poisoned.contains(n))) {
                self.poison_outputs(node);
                continue;
            }
            let converted = match node.target.as_str() {
                super::control_flow::COND => super::control_flow::cond(self, node),
                super::control_flow::WHILE_LOOP => super::control_flow::while_loop(self, node),
                "torch.ops.higher_order.with_effects" => ops::linalg::with_effects(self, node),
                _ => ops::convert(self, node),
            };
            let converted = match (converted, self.scope.type_error.take()) {
                (Err(Fail::Invalid(detail)), _) => Err(Fail::Invalid(detail)),
                (_, Some(fail)) => Err(fail),
                (converted, None) => converted,
            };
            match converted {
                Ok(()) => {}
                Err(Fail::Unsupported(reason)) => {
                    self.problems.push(Problem {
                        what: short_target(&node.target).to_string(),
                        node: format!("{}{}", self.scope.prefix, node.name),
                        at: self.g.locs[loc].python_line(),
                        reason,
                    });
                    self.poison_outputs(node);
                }
                Err(Fail::Invalid(detail)) => {
                    return Err(ImportError::InvalidNode {
                        target: node.target.clone(),
                        node: format!("{}{}", self.scope.prefix, node.name),
                        at: self.g.locs[loc].python_line(),
                        detail,
                    });
                }
            }
        }
        Ok(())
    }

    /// Converts nested graph `sub` inline with its placeholders bound to
    /// `operands`, and returns the values of its outputs. The nested graph's
    /// names live in their own scope (saved and restored around it); its
    /// problems join the program's list.
    pub(crate) fn inline_graph(&mut self, sub: &'p SubGraph, operands: &[ValueId], outer: LocId) -> R<Vec<ValueId>> {
        if sub.inputs.len() != operands.len() {
            return invalid(format!(
                "`{}` takes {} inputs, {} were passed",
                sub.name,
                sub.inputs.len(),
                operands.len()
            ));
        }
        let prefix = format!("{}{}/", self.scope.prefix, sub.name);
        let outputs = sub.outputs.iter().flat_map(tensor_names);
        let scope = Scope::new(prefix, &sub.tensor_values, &sub.sym_int_values, &sub.nodes, outputs);
        self.with_scope(scope, |imp| imp.inline_graph_body(sub, operands, outer))
    }

    /// Converts nested graph `sub` into a graph of its own (a loop's
    /// condition or body) whose inputs have `input_types`. It starts with a
    /// copy of this graph's symbol table (nested graphs share symbol ids with
    /// their parent) and cannot reach this graph's values: everything it reads
    /// is an input. `outer` is the loop node's location in this graph.
    pub(crate) fn convert_region(&mut self, sub: &'p SubGraph, input_types: &[TensorType], outer: LocId) -> R<Graph> {
        let mut region = Graph::new();
        region.symbols = self.g.symbols.clone();
        let region_outer = region.locs.push(self.g.locs[outer].clone());
        let inputs: Vec<ValueId> = input_types
            .iter()
            .enumerate()
            .map(|(i, ty)| {
                let name = match sub.inputs.get(i) {
                    Some(Arg::Tensor(name)) => format!("{}{}/{name}", self.scope.prefix, sub.name),
                    _ => format!("input_{i}"),
                };
                region.add_input(name, ty.clone())
            })
            .collect();
        // `.item()` reads and pending binds name the parent's values: the
        // region starts without them.
        let (built, result) = self.with_graph(region, |imp| imp.inline_graph(sub, &inputs, region_outer));
        let (mut region, leftover_binds) = (built.g, !built.pending_binds.is_empty());
        let outputs = result?;
        if leftover_binds || !region.data_dependent_symbols().is_empty() || region.symbols.len() > self.g.symbols.len()
        {
            return unsupported(format!(
                "`{}` makes a data-dependent size (`.item()`, nonzero, ...); inside a loop kiln cannot plan memory for it",
                sub.name
            ));
        }
        for (i, v) in outputs.into_iter().enumerate() {
            region.add_output(format!("output_{i}"), v);
        }
        Ok(region)
    }

    fn inline_graph_body(&mut self, sub: &'p SubGraph, operands: &[ValueId], outer: LocId) -> R<Vec<ValueId>> {
        for (input, &v) in sub.inputs.iter().zip(operands) {
            match input {
                Arg::Tensor(name) => self.scope.env.insert(name.clone(), v),
                other => return unsupported(format!("`{}` has a non-tensor input {other:?}", sub.name)),
            };
        }
        let problems_before = self.problems.len();
        self.convert_nodes(&sub.nodes, Some(outer)).map_err(|e| Fail::Invalid(format!("in `{}`: {e}", sub.name)))?;
        let mut outputs = Vec::with_capacity(sub.outputs.len());
        for out in &sub.outputs {
            match out {
                Arg::Tensor(name) if self.scope.poisoned.contains(name) || self.problems.len() > problems_before => {
                    return unsupported(format!("`{}` uses constructs kiln does not support (listed above)", sub.name));
                }
                Arg::Tensor(name) => outputs.push(self.value(name)?),
                other => return unsupported(format!("`{}` returns a non-tensor {other:?}", sub.name)),
            }
        }
        Ok(outputs)
    }

    /// Location of the node being converted.
    pub fn loc(&self) -> Option<LocId> {
        self.scope.loc
    }

    /// A fresh `Op::Random` stream number.
    pub fn random_stream(&mut self) -> u32 {
        let s = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(1);
        s
    }

    /// After a node failed: binds each tensor output to a stand-in value of its
    /// declared type, so that later nodes are still converted and their own
    /// problems reported (the graph is discarded once a problem exists). Names
    /// without a usable type are poisoned instead.
    fn poison_outputs(&mut self, node: &Node) {
        for out in &node.outputs {
            for name in output_names(out) {
                self.stand_in(&name);
            }
        }
    }

    fn stand_in(&mut self, name: &str) {
        match self.type_of(name) {
            Ok(ty) => {
                let v = self.g.add_input(format!("<unavailable {name}>"), ty);
                self.scope.env.insert(name.to_string(), v);
            }
            Err(_) => {
                self.scope.poisoned.insert(name.to_string());
            }
        }
    }

    fn bind_input(&mut self, spec: &InputSpec) -> Result<(), ImportError> {
        match spec {
            InputSpec::User(Arg::Tensor(name)) if self.is_complex_meta(name) => {
                if let Err(e) = self.bind_complex_input(name) {
                    self.input_failure(name, e)?;
                }
            }
            InputSpec::User(Arg::Tensor(name)) => match self.type_of(name) {
                Ok(ty) => {
                    let v = self.g.add_input(name.clone(), ty);
                    // The Python-level name: what sharding and quantization overrides select by.
                    self.g.values[v].attrs = ValueAttrs::with_origin(name.clone());
                    self.scope.env.insert(name.clone(), v);
                    self.user_input_bindings.push(Bound { arg: name.clone(), fqn: name.clone(), value: v });
                }
                Err(e) => self.input_failure(name, e)?,
            },
            InputSpec::User(other) => self.problems.push(Problem {
                what: "user input".into(),
                node: format!("{other:?}"),
                at: None,
                reason: Some("non-tensor user inputs are not supported".into()),
            }),
            InputSpec::Parameter { arg, fqn } => self.bind_weight(arg, fqn, true)?,
            InputSpec::Buffer { arg, fqn, persistent } => self.bind_weight(arg, fqn, *persistent)?,
            InputSpec::TensorConstant { arg, fqn } => self.bind_weight(arg, fqn, false)?,
            // A Python constant argument of forward(); torch inlines its value
            // into the nodes that use it. Only ints can be referred to (as a
            // symbolic int), so only those are kept.
            InputSpec::ConstantInput { name, value } => {
                if let Arg::Int(v) = value {
                    self.scope.sym_env.insert(name.clone(), Dim::Const(*v));
                }
            }
            // An effect token orders side effects in torch; kiln runs them in
            // schedule order, so the token is only a placeholder value.
            InputSpec::Other { kind, arg } if kind == "token" => {
                let token = self.push(Op::Full { value: 0.0, dtype: DType::F32, shape: vec![Dim::Const(0)] }, vec![]);
                match token {
                    Ok(v) => self.bind_name(arg, v),
                    Err(e) => return self.input_failure(arg, e),
                }
            }
            InputSpec::Other { kind, arg } => {
                self.problems.push(Problem {
                    what: format!("input spec {kind}"),
                    node: arg.clone(),
                    at: None,
                    reason: Some(match kind.as_str() {
                        "custom_obj" => "TorchScript custom objects are not supported".into(),
                        "token" => "effect tokens (side-effecting ops) are not supported".into(),
                        _ => "unknown input kind".into(),
                    }),
                });
                self.stand_in(arg);
            }
        }
        Ok(())
    }

    /// A complex user input: the graph input is its parts interleaved (one
    /// more trailing dimension of 2, the bytes the caller passes), marked in
    /// [`Graph::complex_inputs`]; the program reads its two parts.
    fn bind_complex_input(&mut self, name: &str) -> R<()> {
        let part = self.part_type(name)?;
        let mut shape = part.shape;
        shape.push(Dim::Const(2));
        let v = self.g.add_input(name.to_string(), TensorType::new(part.dtype, shape));
        self.g.values[v].attrs = ValueAttrs::with_origin(name.to_string());
        self.g.complex_inputs.push(self.g.inputs.len() - 1);
        self.user_input_bindings.push(Bound { arg: name.to_string(), fqn: name.to_string(), value: v });
        let (re, im) = ops::fft::split_parts(self, v)?;
        self.bind_complex(name, re, im);
        Ok(())
    }

    fn output_failure(&mut self, name: &str, e: Fail) -> Result<(), ImportError> {
        match e {
            Fail::Unsupported(reason) => {
                self.problems.push(Problem { what: "user output".into(), node: name.to_string(), at: None, reason });
                Ok(())
            }
            Fail::Invalid(detail) => Err(ImportError::Invalid(format!("output `{name}`: {detail}"))),
        }
    }

    fn input_failure(&mut self, name: &str, e: Fail) -> Result<(), ImportError> {
        match e {
            Fail::Unsupported(reason) => {
                self.problems.push(Problem { what: "input".into(), node: name.to_string(), at: None, reason });
                self.scope.poisoned.insert(name.to_string());
                Ok(())
            }
            Fail::Invalid(detail) => Err(ImportError::Invalid(format!("input `{name}`: {detail}"))),
        }
    }

    /// Binds a parameter, buffer or lifted constant to a constant pointing into the file.
    fn bind_weight(&mut self, arg: &str, fqn: &str, prefer_weights: bool) -> Result<(), ImportError> {
        let file = self.file;
        let sources = [(&file.weights, WEIGHTS_DIR), (&file.constants, CONSTANTS_DIR)];
        let ordered = if prefer_weights { [sources[0], sources[1]] } else { [sources[1], sources[0]] };
        let Some((cfg, dir)) = ordered.iter().find_map(|(map, dir)| map.get(fqn).map(|c| (c, *dir))) else {
            return Err(ImportError::Invalid(format!(
                "`{fqn}` (input `{arg}`) is neither among the archive's weights nor its constants \
                 (model_weights_config.json / model_constants_config.json, or the pickled state dict of torch <= 2.8)"
            )));
        };
        let loaded = match weights::load(&file.archive, dir, fqn, cfg) {
            Ok(t) => t,
            Err(WeightError::Unsupported { tensor, detail }) => {
                self.problems.push(Problem { what: "weight".into(), node: tensor, at: None, reason: Some(detail) });
                self.stand_in(arg);
                return Ok(());
            }
            Err(e @ WeightError::Malformed { .. }) => return Err(ImportError::Weights(e)),
        };
        if loaded.dtype.is_complex() {
            return self.bind_complex_weight(arg, fqn, loaded);
        }
        let ty = match self.type_of(arg) {
            Ok(ty) => ty,
            // A weight without a graph type: use the stored one.
            Err(Fail::Invalid(_)) if !file.program.tensor_values.contains_key(arg) => {
                TensorType::fixed(loaded.dtype, &loaded.shape)
            }
            Err(e) => return self.input_failure(arg, e),
        };
        if ty.dtype != loaded.dtype || ty.static_shape().as_deref() != Some(&loaded.shape[..]) {
            return Err(ImportError::Invalid(format!(
                "`{fqn}`: the graph says {} {:?} but the stored tensor is {} {:?}",
                ty.dtype,
                ty.static_shape(),
                loaded.dtype,
                loaded.shape
            )));
        }
        let v = self.g.add_const(Some(fqn.to_string()), ty, loaded.bytes);
        self.g.values[v].attrs = ValueAttrs::with_origin(fqn.to_string());
        self.scope.env.insert(arg.to_string(), v);
        self.weight_bindings.push(Bound { arg: arg.to_string(), fqn: fqn.to_string(), value: v });
        Ok(())
    }

    /// A complex parameter, buffer or constant: a constant of its parts
    /// interleaved (the stored bytes as they are, f32/f64 with one more
    /// trailing dimension of 2), split into the program's (real, imaginary)
    /// pair. It cannot become state (complex values are not written in
    /// place), so it is not among the weight bindings.
    fn bind_complex_weight(&mut self, arg: &str, fqn: &str, loaded: weights::LoadedTensor) -> Result<(), ImportError> {
        let part = match self.part_type(arg) {
            Ok(ty) => ty,
            Err(e) => return self.input_failure(arg, e),
        };
        if loaded.dtype.complex_part() != Some(part.dtype) || part.static_shape().as_deref() != Some(&loaded.shape[..])
        {
            return Err(ImportError::Invalid(format!(
                "`{fqn}`: the graph says complex parts {} {:?} but the stored tensor is {} {:?}",
                part.dtype,
                part.static_shape(),
                loaded.dtype,
                loaded.shape
            )));
        }
        let mut shape = part.shape;
        shape.push(Dim::Const(2));
        let v = self.g.add_const(Some(fqn.to_string()), TensorType::new(part.dtype, shape), loaded.bytes);
        self.g.values[v].attrs = ValueAttrs::with_origin(fqn.to_string());
        match ops::fft::split_parts(self, v) {
            Ok((re, im)) => {
                self.bind_complex(arg, re, im);
                Ok(())
            }
            Err(e) => self.input_failure(arg, e),
        }
    }

    // ----------------------------------------------------------------- types

    /// The IR type of a program value, from `tensor_values`.
    pub fn type_of(&mut self, name: &str) -> R<TensorType> {
        if let Some(ty) = self.scope.types.get(name) {
            return Ok(ty.clone());
        }
        let Some(meta) = self.scope.tensor_values.get(name) else {
            return invalid(format!("value `{name}` has no entry in tensor_values"));
        };
        let ty = self.meta_type(meta)?;
        self.scope.types.insert(name.to_string(), ty.clone());
        Ok(ty)
    }

    fn meta_type(&mut self, meta: &TensorMeta) -> R<TensorType> {
        let dtype = match scalar_type::dtype_of(meta.dtype) {
            Ok(d) => d,
            Err(name) if name.starts_with("complex") => {
                return unsupported(format!("element type {name}: {COMPLEX_SCOPE}"))
            }
            Err(name) => return unsupported(format!("element type {name}")),
        };
        let shape = meta.sizes.iter().map(|s| self.sym_expr(s)).collect::<R<Vec<_>>>()?;
        check_sizes(&shape, meta)?;
        let ty = TensorType::new(dtype, shape);
        self.check_size(&ty)?;
        Ok(ty)
    }

    pub fn sym_expr(&mut self, e: &SymExpr) -> R<Dim> {
        match e {
            SymExpr::Int(v) => Ok(Dim::Const(*v)),
            SymExpr::Expr { expr, .. } => self.parse_dim(expr),
        }
    }

    /// Parses a sympy expression; unknown symbols (no range constraint) get
    /// the widest bounds a size can have.
    pub fn parse_dim(&mut self, expr: &str) -> R<Dim> {
        let g = &mut self.g;
        let mut resolve = |name: &str| {
            let id = g.symbol_by_name(name).unwrap_or_else(|| g.add_symbol(name, 0, None));
            Dim::Sym(id)
        };
        let d = sympy::parse_dim(expr, &mut resolve).map_err(|e| Fail::Unsupported(Some(e.to_string())))?;
        self.ensure_bound(&d)?;
        Ok(d)
    }

    /// Records that `name` (a SymInt, SymFloat or SymBool output of node
    /// `node`) is `.item()` of the 0-d tensor `value`. A SymInt that is a
    /// plain unbacked symbol becomes a size once a shape uses it.
    pub fn define_item(&mut self, name: &str, node: &str, value: ValueId, size: Option<Dim>) {
        self.items.insert(name.to_string(), value);
        let Some(d) = size else { return };
        if let Dim::Sym(s) = d {
            let from_input = self.g.inputs.iter().any(|&v| {
                let mut used = Vec::new();
                self.g.ty(v).shape.iter().for_each(|d| d.collect_symbols(&mut used));
                used.contains(&s)
            });
            if !from_input && !self.g.data_dependent_symbols().contains(&s) {
                self.pending_binds.insert(s, PendingBind { value, loc: self.scope.loc, node: node.to_string() });
            }
        }
        self.scope.sym_env.insert(name.to_string(), d);
    }

    /// The 0-d tensor a `.item()` value `name` was read from.
    pub fn item(&self, name: &str) -> Option<ValueId> {
        self.items.get(name).copied()
    }

    /// Binds every `.item()` symbol `d` mentions that is not bound yet: its
    /// value as i64, checked at run time against the symbol's bounds (the
    /// `torch._check` ranges), which must be finite since kiln plans memory
    /// for the largest size.
    fn ensure_bound(&mut self, d: &Dim) -> R<()> {
        if self.pending_binds.is_empty() {
            return Ok(());
        }
        let mut used = Vec::new();
        d.collect_symbols(&mut used);
        for s in used {
            let Some(p) = self.pending_binds.remove(&s) else { continue };
            let sym = &mut self.g.symbols[s];
            sym.min = sym.min.max(0);
            if sym.max.is_none() {
                let at = p.loc.and_then(|l| self.g.locs[l].python_line()).map_or(String::new(), |l| format!(" at {l}"));
                let name = sym.name.clone();
                return unsupported(format!(
                    "`{name}` (`.item()` in node `{}`{at}) is used as a size but has no upper bound; \
                     bound it with `torch._check({name} <= N)` so that kiln can plan memory",
                    p.node
                ));
            }
            let ty = TensorType::new(DType::I64, Vec::new());
            let count = if self.g.ty(p.value).dtype == DType::I64 {
                p.value
            } else {
                self.g.push(Op::Cast { to: DType::I64 }, vec![p.value], ty, p.loc)
            };
            self.g.add_node(Op::BindDim { symbol: s }, vec![count], Vec::new(), p.loc);
        }
        Ok(())
    }

    /// The type of output `index` of `node` (which must be a single tensor).
    pub fn out_ty(&mut self, node: &Node, index: usize) -> R<TensorType> {
        match node.outputs.get(index) {
            Some(Arg::Tensor(name)) => self.type_of(name),
            other => invalid(format!("output {index} is {other:?}, expected a tensor")),
        }
    }

    // --------------------------------------------------------------- binding

    pub fn value(&self, name: &str) -> R<ValueId> {
        match self.scope.env.get(name) {
            Some(v) => Ok(*v),
            None if self.complex(name).is_some() => {
                unsupported(format!("operand `{name}` is complex, which this op does not take; {COMPLEX_SCOPE}"))
            }
            None => invalid(format!("value `{name}` is used before it is defined")),
        }
    }

    // --------------------------------------------------------------- complex

    /// The (real, imaginary) parts of complex value `name`, if it is one.
    pub(crate) fn complex(&self, name: &str) -> Option<(ValueId, ValueId)> {
        if self.scope.env.contains_key(name) {
            return None;
        }
        self.complex.get(&format!("{}{name}", self.scope.prefix)).copied()
    }

    /// Binds complex value `name` to its parts, naming new IR values
    /// `name.re` and `name.im`.
    pub(crate) fn bind_complex(&mut self, name: &str, re: ValueId, im: ValueId) {
        let scoped = format!("{}{name}", self.scope.prefix);
        for (v, part) in [(re, "re"), (im, "im")] {
            let value = &mut self.g.values[v];
            if value.name.is_none() || value.name.as_deref() == Some(scoped.as_str()) {
                value.name = Some(format!("{scoped}.{part}"));
            }
        }
        self.scope.env.remove(name);
        self.complex.insert(scoped, (re, im));
    }

    /// Whether program value `name` is declared complex (any width).
    pub(crate) fn is_complex_meta(&self, name: &str) -> bool {
        self.scope.tensor_values.get(name).is_some_and(|m| matches!(m.dtype, 9..=11))
    }

    /// Whether program value `name` is declared bool.
    pub(crate) fn is_bool_meta(&self, name: &str) -> bool {
        // ScalarType 12 is bool.
        self.scope.tensor_values.get(name).is_some_and(|m| m.dtype == 12)
    }

    /// The type of each part of complex value `name` (complex64 → f32,
    /// complex128 → f64), from `tensor_values`.
    pub(crate) fn part_type(&mut self, name: &str) -> R<TensorType> {
        let Some(meta) = self.scope.tensor_values.get(name) else {
            return invalid(format!("value `{name}` has no entry in tensor_values"));
        };
        let dtype = match meta.dtype {
            10 => DType::F32,
            11 => DType::F64,
            other => {
                return unsupported(format!(
                    "`{name}` is {}; kiln's FFT ops make complex64 or complex128",
                    scalar_type::torch_name(other)
                ))
            }
        };
        let shape = meta.sizes.iter().map(|s| self.sym_expr(s)).collect::<R<Vec<_>>>()?;
        check_sizes(&shape, meta)?;
        let ty = TensorType::new(dtype, shape);
        self.check_size(&ty)?;
        Ok(ty)
    }

    /// Binds `name` as a plain value of type `ty` for the duration of a
    /// per-part conversion (see `ops/fft.rs`); [`Importer::unbind`] undoes it.
    pub(crate) fn bind_part(&mut self, name: &str, v: ValueId, ty: TensorType) {
        self.scope.env.insert(name.to_string(), v);
        self.scope.types.insert(name.to_string(), ty);
    }

    /// Declares the type of `name` (a complex node's output) as its part type
    /// for a per-part conversion.
    pub(crate) fn set_part_type(&mut self, name: &str, ty: TensorType) {
        self.scope.types.insert(name.to_string(), ty);
    }

    pub(crate) fn unbind(&mut self, name: &str) {
        self.scope.env.remove(name);
        self.scope.types.remove(name);
    }

    /// Binds output `index` (a single tensor) of `node` to `v`.
    pub fn bind(&mut self, node: &Node, index: usize, v: ValueId) -> R<()> {
        match node.outputs.get(index) {
            Some(Arg::Tensor(name)) => {
                self.name_value(name, v);
                Ok(())
            }
            other => invalid(format!("output {index} is {other:?}, expected a tensor")),
        }
    }

    pub fn bind_name(&mut self, name: &str, v: ValueId) {
        self.name_value(name, v);
    }

    fn name_value(&mut self, name: &str, v: ValueId) {
        if self.g.values[v].name.is_none() {
            self.g.values[v].name = Some(format!("{}{name}", self.scope.prefix));
        }
        self.scope.env.insert(name.to_string(), v);
    }

    pub fn bind_sym(&mut self, name: &str, d: Dim) {
        self.scope.sym_env.insert(name.to_string(), d);
    }

    /// Whether any node or output reads `name` (unused outputs need no IR).
    pub fn is_used(&self, name: &str) -> bool {
        self.scope.last_use.contains_key(name)
    }

    /// Whether a node after the current one (or a graph output) reads `name`.
    pub fn read_later(&self, name: &str) -> bool {
        self.scope.last_use.get(name).is_some_and(|&i| i > self.scope.node_index)
    }

    // ------------------------------------------------------------- arguments

    pub fn arg<'n>(&self, node: &'n Node, name: &str) -> Option<&'n Arg> {
        node.inputs.iter().find(|a| a.name == name).map(|a| &a.arg).filter(|a| !matches!(a, Arg::None))
    }

    fn required<'n>(&self, node: &'n Node, name: &str) -> R<&'n Arg> {
        match self.arg(node, name) {
            Some(a) => Ok(a),
            None => invalid(format!("required argument `{name}` is missing")),
        }
    }

    pub fn tensor(&self, node: &Node, name: &str) -> R<ValueId> {
        match self.required(node, name)? {
            Arg::Tensor(t) => self.value(t),
            other => invalid(format!("argument `{name}`: expected a tensor, found {other:?}")),
        }
    }

    pub fn tensor_name<'n>(&self, node: &'n Node, name: &str) -> R<&'n str> {
        match self.required(node, name)? {
            Arg::Tensor(t) => Ok(t),
            other => invalid(format!("argument `{name}`: expected a tensor, found {other:?}")),
        }
    }

    pub fn opt_tensor(&self, node: &Node, name: &str) -> R<Option<ValueId>> {
        match self.arg(node, name) {
            None => Ok(None),
            Some(Arg::Tensor(t)) => self.value(t).map(Some),
            Some(other) => invalid(format!("argument `{name}`: expected an optional tensor, found {other:?}")),
        }
    }

    pub fn tensors(&self, node: &Node, name: &str) -> R<Vec<ValueId>> {
        match self.required(node, name)? {
            Arg::Tensors(ts) => ts.iter().map(|t| self.value(t)).collect(),
            other => invalid(format!("argument `{name}`: expected a tensor list, found {other:?}")),
        }
    }

    pub fn opt_tensors(&self, node: &Node, name: &str) -> R<Vec<Option<ValueId>>> {
        match self.required(node, name)? {
            Arg::Tensors(ts) => ts.iter().map(|t| self.value(t).map(Some)).collect(),
            Arg::OptionalTensors(ts) => ts.iter().map(|t| t.as_deref().map(|t| self.value(t)).transpose()).collect(),
            other => invalid(format!("argument `{name}`: expected a tensor list, found {other:?}")),
        }
    }

    /// A symbolic int as a dimension expression.
    pub fn sym(&mut self, s: &SymIntArg) -> R<Dim> {
        match s {
            SymIntArg::Int(v) => Ok(Dim::Const(*v)),
            SymIntArg::Name(n) => {
                if let Some(d) = self.scope.sym_env.get(n).cloned() {
                    self.ensure_bound(&d)?;
                    return Ok(d);
                }
                match self.scope.sym_int_values.get(n) {
                    Some(e) => self.sym_expr(e),
                    None => invalid(format!("symbolic int `{n}` is used before it is defined")),
                }
            }
        }
    }

    /// An int argument (`default` when omitted); symbolic ints must be static.
    pub fn int(&mut self, node: &Node, name: &str, default: Option<i64>) -> R<i64> {
        match self.arg(node, name) {
            None => default.map_or_else(|| invalid(format!("required argument `{name}` is missing")), Ok),
            Some(Arg::Int(v)) => Ok(*v),
            Some(Arg::SymInt(s)) => match self.sym(s)?.as_const() {
                Some(v) => Ok(v),
                None => unsupported(format!("argument `{name}` is symbolic; kiln needs a static value here")),
            },
            Some(other) => invalid(format!("argument `{name}`: expected an int, found {other:?}")),
        }
    }

    pub fn opt_int(&mut self, node: &Node, name: &str) -> R<Option<i64>> {
        if self.arg(node, name).is_none() {
            return Ok(None);
        }
        self.int(node, name, None).map(Some)
    }

    /// An int-list argument; a one-element list is broadcast to `len` entries
    /// (the schema's `int[2] stride=1` spelling).
    pub fn ints(&mut self, node: &Node, name: &str, default: &[i64]) -> R<Vec<i64>> {
        match self.arg(node, name) {
            None => Ok(default.to_vec()),
            Some(Arg::Ints(v)) => Ok(v.clone()),
            Some(Arg::Int(v)) => Ok(vec![*v]),
            Some(Arg::SymInts(v)) => {
                let dims = v.iter().map(|s| self.sym(s)).collect::<R<Vec<_>>>()?;
                match dims.iter().map(Dim::as_const).collect::<Option<Vec<_>>>() {
                    Some(v) => Ok(v),
                    None => unsupported(format!("argument `{name}` is symbolic; kiln needs static values here")),
                }
            }
            Some(other) => invalid(format!("argument `{name}`: expected an int list, found {other:?}")),
        }
    }

    /// An int list of exactly `len` entries (broadcasting a single one).
    pub fn ints_n(&mut self, node: &Node, name: &str, default: &[i64], len: usize) -> R<Vec<i64>> {
        let v = self.ints(node, name, default)?;
        match v.len() {
            1 if len != 1 => Ok(vec![v[0]; len]),
            n if n == len => Ok(v),
            n => invalid(format!("argument `{name}` has {n} entries, expected {len}")),
        }
    }

    pub fn float(&mut self, node: &Node, name: &str, default: Option<f64>) -> R<f64> {
        match self.arg(node, name) {
            None => default.map_or_else(|| invalid(format!("required argument `{name}` is missing")), Ok),
            Some(_) => Ok(self.scalar(node, name)?.as_f64()),
        }
    }

    pub fn bool(&self, node: &Node, name: &str, default: bool) -> R<bool> {
        match self.arg(node, name) {
            None => Ok(default),
            Some(Arg::Bool(b)) => Ok(*b),
            Some(other) => invalid(format!("argument `{name}`: expected a bool, found {other:?}")),
        }
    }

    pub fn string<'n>(&self, node: &'n Node, name: &str, default: &'n str) -> R<&'n str> {
        match self.arg(node, name) {
            None => Ok(default),
            Some(Arg::Str(s)) => Ok(s),
            Some(other) => invalid(format!("argument `{name}`: expected a string, found {other:?}")),
        }
    }

    /// A Python scalar (`Scalar` in the schema).
    pub fn scalar(&mut self, node: &Node, name: &str) -> R<Scalar> {
        match self.required(node, name)? {
            Arg::SymInt(SymIntArg::Name(s)) | Arg::SymFloat(s) | Arg::SymBool(s) if self.items.contains_key(s) => {
                unsupported(format!("argument `{name}` is `.item()` of a tensor; kiln needs a compile-time value here"))
            }
            Arg::Bool(b) => Ok(Scalar::Bool(*b)),
            Arg::Int(i) => Ok(Scalar::Int(*i)),
            Arg::Float(f) => Ok(Scalar::Float(*f)),
            Arg::SymInt(s) => match self.sym(s)?.as_const() {
                Some(v) => Ok(Scalar::Int(v)),
                None => unsupported(format!("argument `{name}` is a symbolic int used as a tensor value")),
            },
            other => invalid(format!("argument `{name}`: expected a scalar, found {other:?}")),
        }
    }

    pub fn opt_scalar(&mut self, node: &Node, name: &str) -> R<Option<Scalar>> {
        if self.arg(node, name).is_none() {
            return Ok(None);
        }
        self.scalar(node, name).map(Some)
    }

    // ----------------------------------------------------------- emitting IR

    /// Emits `op` with result type `ty` (usually the type the program
    /// declares). Where kiln's inference disagrees — another dtype or rank, a
    /// dim provably different (two different constants, say) — or cannot
    /// type the op at all, the node being converted fails as an invalid
    /// program once its conversion returns (see [`Importer::convert_nodes`]):
    /// a declared type is trusted only where it agrees with the op.
    pub fn push_typed(&mut self, op: Op, inputs: Vec<ValueId>, ty: TensorType) -> ValueId {
        if self.scope.type_error.is_none() {
            self.scope.type_error = match self.check_declared(&op, &inputs, &ty) {
                Some(detail) => Some(Fail::Invalid(detail)),
                None => self.check_size(&ty).err(),
            };
        }
        kiln_ir::Builder::new(&mut self.g, self.scope.loc).push_typed(op, inputs, ty)
    }

    /// Refuses a type whose largest shape exceeds [`MAX_TENSOR_BYTES`].
    fn check_size(&self, ty: &TensorType) -> R<()> {
        let mut bytes = ty.dtype.size_bytes() as u64;
        for d in &ty.shape {
            // Unbounded dims are the memory planner's to report.
            let Some(hi) = d.bounds(&self.g.symbols).1 else { return Ok(()) };
            bytes = bytes.saturating_mul(hi.max(0) as u64);
        }
        if bytes <= MAX_TENSOR_BYTES {
            return Ok(());
        }
        let dims: Vec<String> = ty.shape.iter().map(|d| d.display(&self.g.symbols).to_string()).collect();
        unsupported(format!(
            "a {}[{}] tensor takes up to {bytes} bytes; kiln plans memory for at most {MAX_TENSOR_BYTES} bytes per tensor",
            ty.dtype,
            dims.join(", ")
        ))
    }

    /// Why `ty` cannot be `op`'s result on `inputs`, if it cannot.
    fn check_declared(&self, op: &Op, inputs: &[ValueId], ty: &TensorType) -> Option<String> {
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| self.g.ty(v)).collect();
        let symbols = &self.g.symbols;
        let show = |t: &TensorType| {
            let dims: Vec<String> = t.shape.iter().map(|d| d.display(symbols).to_string()).collect();
            format!("{}[{}]", t.dtype, dims.join(", "))
        };
        let inferred = match kiln_ir::infer::infer_types(symbols, op, &tys) {
            Ok(mut t) if t.len() == 1 => t.remove(0),
            Ok(t) => return Some(format!("`{}` gives {} results, not one", op.name(), t.len())),
            Err(e) => return Some(format!("`{}`: {e}", op.name())),
        };
        let differs = inferred.dtype != ty.dtype
            || inferred.rank() != ty.rank()
            || inferred
                .shape
                .iter()
                .zip(&ty.shape)
                .any(|(a, b)| kiln_ir::infer::dims_equal(a, b, symbols) == Some(false));
        differs.then(|| {
            format!(
                "the declared type {} contradicts `{}` of {}, which gives {}",
                show(ty),
                op.name(),
                tys.iter().map(|t| show(t)).collect::<Vec<_>>().join(" and "),
                show(&inferred)
            )
        })
    }

    /// Emits `op` and binds its single output to the node's output 0.
    pub fn emit(&mut self, node: &Node, op: Op, inputs: Vec<ValueId>) -> R<ValueId> {
        let ty = self.out_ty(node, 0)?;
        let v = self.push_typed(op, inputs, ty);
        self.bind(node, 0, v)?;
        Ok(v)
    }

    /// Emits `op` with its output type inferred from the operands (for the
    /// intermediate values of decompositions, which the program has no type for).
    pub fn push(&mut self, op: Op, inputs: Vec<ValueId>) -> R<ValueId> {
        let ty = kiln_ir::builder::infer_one(&self.g, &op, &inputs).map_err(Fail::Invalid)?;
        Ok(self.push_typed(op, inputs, ty))
    }

    /// `a op b` with a Python scalar `b` of `a`'s dtype.
    pub fn with_scalar(&mut self, op: kiln_ir::BinaryOp, a: ValueId, b: f64) -> R<ValueId> {
        let k = self.scalar_const(Scalar::Float(b), self.g.ty(a).dtype);
        self.push(Op::Binary(op), vec![a, k])
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.g.ty(v)
    }

    /// `v` converted to `dtype` (no node if it already is).
    pub fn cast(&mut self, v: ValueId, dtype: DType) -> ValueId {
        let ty = self.g.ty(v);
        if ty.dtype == dtype {
            return v;
        }
        let out = TensorType::new(dtype, ty.shape.clone());
        self.push_typed(Op::Cast { to: dtype }, vec![v], out)
    }

    /// A 0-d constant holding `value` as `dtype`.
    pub fn scalar_const(&mut self, value: Scalar, dtype: DType) -> ValueId {
        let bytes = scalar_bytes(value, dtype);
        self.g.add_const(None, TensorType::new(dtype, Vec::new()), ConstBytes::owned(bytes))
    }

    /// A 0-d tensor holding the run-time value of a symbolic dimension (`x /
    /// x.shape[1]`), as `dtype`: the i64 sum of `d` ones, exact for any size.
    /// Static dimensions become constants.
    pub fn dim_scalar(&mut self, d: &Dim, dtype: DType) -> ValueId {
        if let Some(v) = d.as_const() {
            return self.scalar_const(Scalar::Int(v), dtype);
        }
        let ones = self.push_typed(
            Op::Full { value: 1.0, dtype: DType::I64, shape: vec![d.clone()] },
            Vec::new(),
            TensorType::new(DType::I64, vec![d.clone()]),
        );
        let sum = self.push_typed(
            Op::Reduce { kind: kiln_ir::ReduceKind::Sum, axes: vec![0], keep_dims: false },
            vec![ones],
            TensorType::new(DType::I64, Vec::new()),
        );
        self.cast(sum, dtype)
    }

    /// A 1-d constant of `len` copies of `value` (optional batch-norm operands).
    pub fn filled_const(&mut self, value: f64, dtype: DType, len: i64) -> R<ValueId> {
        let count = table_len("a filled constant", &[len])?;
        let one = scalar_bytes(Scalar::Float(value), dtype);
        let bytes = one.repeat(count);
        Ok(self.g.add_const(None, TensorType::fixed(dtype, &[len]), ConstBytes::owned(bytes)))
    }
}

/// A declared shape's static dims must be sizes (torch never writes a
/// negative one).
fn check_sizes(shape: &[Dim], meta: &TensorMeta) -> R<()> {
    match shape.iter().find_map(|d| d.as_const().filter(|&c| c < 0)) {
        Some(c) => invalid(format!("{} declares the negative size {c}", meta.path)),
        None => Ok(()),
    }
}

/// Little-endian bytes of one element.
pub(crate) fn scalar_bytes(value: Scalar, dtype: DType) -> Vec<u8> {
    let f = value.as_f64();
    let i = match value {
        Scalar::Int(i) => i,
        Scalar::Bool(b) => b as i64,
        // Saturating, truncating toward zero like a C cast; NaN becomes 0.
        Scalar::Float(x) => x as i64,
    };
    let mut out = Vec::with_capacity(dtype.size_bytes());
    kiln_ir::builder::write_scalar(dtype, f, i, &mut out);
    out
}

/// Tensor names an argument reads.
pub(crate) fn tensor_names(arg: &Arg) -> Box<dyn Iterator<Item = &str> + '_> {
    match arg {
        Arg::Tensor(n) => Box::new(std::iter::once(n.as_str())),
        Arg::Tensors(ns) => Box::new(ns.iter().map(String::as_str)),
        Arg::OptionalTensors(ns) => Box::new(ns.iter().filter_map(|n| n.as_deref())),
        Arg::SymInt(SymIntArg::Name(n)) | Arg::SymFloat(n) => Box::new(std::iter::once(n.as_str())),
        Arg::SymInts(v) => Box::new(v.iter().filter_map(|s| match s {
            SymIntArg::Name(n) => Some(n.as_str()),
            SymIntArg::Int(_) => None,
        })),
        _ => Box::new(std::iter::empty()),
    }
}

/// Every name an output argument defines.
pub(crate) fn output_names(arg: &Arg) -> Vec<String> {
    match arg {
        Arg::Tensor(n) | Arg::SymBool(n) | Arg::SymFloat(n) => vec![n.clone()],
        Arg::SymInt(SymIntArg::Name(n)) => vec![n.clone()],
        Arg::Tensors(ns) => ns.clone(),
        Arg::OptionalTensors(ns) => ns.iter().flatten().cloned().collect(),
        _ => Vec::new(),
    }
}

/// `torch.ops.aten.add.Tensor` → `aten.add.Tensor`.
pub(crate) fn short_target(target: &str) -> &str {
    target.strip_prefix("torch.ops.").unwrap_or(target)
}
