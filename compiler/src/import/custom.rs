//! Custom ops: targets outside ATen (`torch.ops.mylib.fused_rmsnorm.default`,
//! registered in Python with `torch.library.custom_op`), and the extension
//! point through which a user lowers them onto kiln IR in Rust.
//!
//! A `.pt2` file records a custom op's call — its namespace, name, overload,
//! the arguments by name with their kinds, and the outputs with their types —
//! but not its schema or implementation (torch 2.15 stores schemas for
//! neither ATen nor custom ops). Without a registered lowering the importer
//! reports the op with a signature reconstructed from the call and its Python
//! line. With one, the lowering builds the op's result from kiln IR ops.
//!
//! # Example
//!
//! A fused RMSNorm registered in Python as
//! `@torch.library.custom_op("mylib::fused_rmsnorm", mutates_args=())` with
//! signature `(Tensor x, Tensor weight, float eps=1e-6) -> Tensor`:
//!
//! ```no_run
//! use kiln_compiler::import::{import_pt2_with, CustomOpContext, ImportOptions};
//! use kiln_ir::{BinaryOp, Op, ReduceKind, UnaryOp};
//!
//! fn fused_rmsnorm(ctx: &mut CustomOpContext) -> Result<Vec<kiln_ir::ValueId>, String> {
//!     let x = ctx.input_tensor("x")?;
//!     let weight = ctx.input_tensor("weight")?;
//!     // Arguments left at their default may be omitted from the file.
//!     let eps = ctx.float_arg("eps")?.unwrap_or(1e-6);
//!     let last = ctx.ty(x).rank() - 1;
//!     let dtype = ctx.ty(x).dtype;
//!     let sq = ctx.push(Op::Binary(BinaryOp::Mul), vec![x, x])?;
//!     let ms = ctx.push(Op::Reduce { kind: ReduceKind::Mean, axes: vec![last], keep_dims: true }, vec![sq])?;
//!     let eps = ctx.scalar(eps, dtype);
//!     let ms = ctx.push(Op::Binary(BinaryOp::Add), vec![ms, eps])?;
//!     let inv = ctx.push(Op::Unary(UnaryOp::Rsqrt), vec![ms])?;
//!     let y = ctx.push(Op::Binary(BinaryOp::Mul), vec![x, inv])?;
//!     let y = ctx.push(Op::Binary(BinaryOp::Mul), vec![y, weight])?;
//!     Ok(vec![y]) // one value per tensor output, of the type the program declares
//! }
//!
//! let options = ImportOptions::default().with_custom_op("mylib::fused_rmsnorm", fused_rmsnorm);
//! let imported = import_pt2_with("model.pt2".as_ref(), &options)?;
//! # Ok::<(), kiln_compiler::import::ImportError>(())
//! ```
//!
//! The same options go into [`crate::CompileOptions::import`] for
//! [`crate::compile_file`]. A lowering's error (`Err(String)`) is reported
//! like an unsupported op, with the node and its Python line; a result whose
//! dtype or shape differs from the program's declared output is rejected.

use super::importer::{Fail, Importer, R};
use crate::pt2::program::{Arg, Node, SymIntArg};
use kiln_ir::{DType, Graph, Op, TensorType, ValueId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A lowering of one custom op: reads the call's arguments from the context,
/// builds IR, and returns one value per tensor output.
pub type CustomLowering = dyn Fn(&mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> + Send + Sync;

/// How to import a `.pt2`: today, the lowerings of custom ops. The default
/// holds kiln's built-in lowerings of library ops ([`super::builtin`]);
/// [`ImportOptions::empty`] holds none.
#[derive(Clone)]
pub struct ImportOptions {
    /// Normalised name (`mylib.fused_rmsnorm` or `mylib.fused_rmsnorm.default`) → lowering.
    custom_ops: HashMap<String, Arc<CustomLowering>>,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        let mut options = ImportOptions::empty();
        super::builtin::register_all(&mut options);
        options
    }
}

impl ImportOptions {
    /// Options without any lowering, built-ins included.
    pub fn empty() -> ImportOptions {
        ImportOptions { custom_ops: HashMap::new() }
    }

    /// Registers `lowering` for the custom op `name`: `"mylib::fused_rmsnorm"`
    /// (every overload) or `"mylib::fused_rmsnorm.default"` (one overload;
    /// preferred over the whole-op registration). `torch.ops.mylib.…` and
    /// dotted spellings are accepted too. Registering a name again replaces it.
    pub fn with_custom_op<F>(mut self, name: &str, lowering: F) -> ImportOptions
    where
        F: Fn(&mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> + Send + Sync + 'static,
    {
        self.register_custom_op(name, lowering);
        self
    }

    /// [`ImportOptions::with_custom_op`] on a borrowed value.
    pub fn register_custom_op<F>(&mut self, name: &str, lowering: F)
    where
        F: Fn(&mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> + Send + Sync + 'static,
    {
        self.custom_ops.insert(normalise(name), Arc::new(lowering));
    }

    /// The registered names, normalised (`mylib.fused_rmsnorm`), sorted.
    pub fn custom_ops(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.custom_ops.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    fn lowering(&self, ns: &str, name: &str, overload: &str) -> Option<Arc<CustomLowering>> {
        let exact = format!("{ns}.{name}.{overload}");
        self.custom_ops.get(&exact).or_else(|| self.custom_ops.get(&format!("{ns}.{name}"))).cloned()
    }
}

impl fmt::Debug for ImportOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportOptions").field("custom_ops", &self.custom_ops()).finish()
    }
}

/// `mylib::op`, `torch.ops.mylib.op.default` → `mylib.op`, `mylib.op.default`.
fn normalise(name: &str) -> String {
    let name = name.trim();
    name.strip_prefix("torch.ops.").unwrap_or(name).replace("::", ".")
}

/// What a lowering sees of one custom-op call: its arguments by name, its
/// declared outputs, and the graph being built.
pub struct CustomOpContext<'a, 'p> {
    imp: &'a mut Importer<'p>,
    node: &'a Node,
    qualified: String,
    overload: String,
}

fn message(f: Fail) -> String {
    match f {
        Fail::Invalid(d) => d,
        Fail::Unsupported(r) => r.unwrap_or_else(|| "unsupported".into()),
    }
}

impl<'p> CustomOpContext<'_, 'p> {
    /// The importer and the call, for kiln's own built-in lowerings that
    /// reuse the ATen importers' pieces.
    pub(crate) fn parts(&mut self) -> (&mut Importer<'p>, &Node) {
        (&mut *self.imp, self.node)
    }

    /// [`Fail`]'s message (for built-ins calling the importer's pieces).
    pub(crate) fn message(f: Fail) -> String {
        message(f)
    }

    /// `mylib::fused_rmsnorm`.
    pub fn op_name(&self) -> &str {
        &self.qualified
    }

    /// `default`, or the overload's name.
    pub fn overload(&self) -> &str {
        &self.overload
    }

    /// Names of the arguments present in the call (defaults may be omitted).
    pub fn arg_names(&self) -> Vec<&str> {
        self.node.inputs.iter().map(|a| a.name.as_str()).collect()
    }

    /// Whether argument `name` was passed (and is not `None`).
    pub fn has_arg(&self, name: &str) -> bool {
        self.imp.arg(self.node, name).is_some()
    }

    /// Tensor argument `name`.
    pub fn input_tensor(&self, name: &str) -> Result<ValueId, String> {
        self.imp.tensor(self.node, name).map_err(|e| format!("argument `{name}`: {}", message(e)))
    }

    /// Optional tensor argument `name` (`None` when omitted or `None`).
    pub fn opt_tensor(&self, name: &str) -> Result<Option<ValueId>, String> {
        self.imp.opt_tensor(self.node, name).map_err(|e| format!("argument `{name}`: {}", message(e)))
    }

    /// Tensor-list argument `name`.
    pub fn tensor_list(&self, name: &str) -> Result<Vec<ValueId>, String> {
        self.imp.tensors(self.node, name).map_err(|e| format!("argument `{name}`: {}", message(e)))
    }

    /// Float argument `name` (ints and bools convert); `None` when omitted.
    pub fn float_arg(&mut self, name: &str) -> Result<Option<f64>, String> {
        if !self.has_arg(name) {
            return Ok(None);
        }
        self.imp.float(self.node, name, None).map(Some).map_err(message)
    }

    /// Int argument `name` (a symbolic int must be static); `None` when omitted.
    pub fn int_arg(&mut self, name: &str) -> Result<Option<i64>, String> {
        self.imp.opt_int(self.node, name).map_err(message)
    }

    /// Int-list argument `name`; `None` when omitted.
    pub fn ints_arg(&mut self, name: &str) -> Result<Option<Vec<i64>>, String> {
        if !self.has_arg(name) {
            return Ok(None);
        }
        self.imp.ints(self.node, name, &[]).map(Some).map_err(message)
    }

    /// Bool argument `name`; `None` when omitted.
    pub fn bool_arg(&self, name: &str) -> Result<Option<bool>, String> {
        match self.imp.arg(self.node, name) {
            None => Ok(None),
            Some(Arg::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(format!("argument `{name}`: expected a bool, found {}", arg_kind(other))),
        }
    }

    /// String argument `name`; `None` when omitted.
    pub fn str_arg(&self, name: &str) -> Result<Option<String>, String> {
        match self.imp.arg(self.node, name) {
            None => Ok(None),
            Some(Arg::Str(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("argument `{name}`: expected a string, found {}", arg_kind(other))),
        }
    }

    /// How many tensor values the lowering must return.
    pub fn output_count(&self) -> usize {
        output_names(self.node).len()
    }

    /// The program's declared type of tensor output `i`.
    pub fn output_type(&mut self, i: usize) -> Result<TensorType, String> {
        let names = output_names(self.node);
        let name = names.get(i).ok_or_else(|| format!("the op has {} tensor outputs, not {}", names.len(), i + 1))?;
        self.imp.type_of(name).map_err(message)
    }

    /// The type of an IR value.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.imp.ty(v)
    }

    /// The graph being built, for anything the helpers below do not cover.
    /// Nodes added with [`Graph::push`] should carry [`CustomOpContext::location`].
    pub fn graph(&mut self) -> &mut Graph {
        &mut self.imp.g
    }

    /// The call's source location, for nodes added through [`CustomOpContext::graph`].
    pub fn location(&self) -> Option<kiln_ir::LocId> {
        self.imp.loc()
    }

    /// Adds `op` with its result type inferred from the operands.
    pub fn push(&mut self, op: Op, inputs: Vec<ValueId>) -> Result<ValueId, String> {
        self.check_values(&inputs)?;
        self.imp.push(op, inputs).map_err(message)
    }

    /// Adds `op` with an explicit result type; one that contradicts kiln's
    /// inference fails the import (see `Importer::push`).
    pub fn push_typed(&mut self, op: Op, inputs: Vec<ValueId>, ty: TensorType) -> Result<ValueId, String> {
        self.check_values(&inputs)?;
        Ok(self.imp.push_typed(op, inputs, ty))
    }

    /// A 0-d constant of `dtype` holding `value` (broadcasts in binary ops).
    pub fn scalar(&mut self, value: f64, dtype: DType) -> ValueId {
        self.imp.scalar_const(super::importer::Scalar::Float(value), dtype)
    }

    /// `v` converted to `dtype` (no node when it already is).
    pub fn cast(&mut self, v: ValueId, dtype: DType) -> ValueId {
        self.imp.cast(v, dtype)
    }

    fn check_values(&self, values: &[ValueId]) -> Result<(), String> {
        match values.iter().find(|&&v| self.imp.g.values.get(v).is_none()) {
            Some(v) => Err(format!("{v} is not a value of this graph")),
            None => Ok(()),
        }
    }
}

/// Every tensor name the node defines, in order.
fn output_names(n: &Node) -> Vec<String> {
    n.outputs
        .iter()
        .flat_map(|o| match o {
            Arg::Tensor(t) => vec![t.clone()],
            Arg::Tensors(ts) => ts.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// Converts a call of a non-ATen op `ns.name.overload`: through its
/// registered lowering, or into a problem that says what the file knows.
pub(crate) fn convert(imp: &mut Importer, n: &Node, ns: &str, rest: &str) -> R<()> {
    let (name, overload) = rest.split_once('.').unwrap_or((rest, "default"));
    let Some(lowering) = imp.options.lowering(ns, name, overload) else {
        return Err(Fail::Unsupported(Some(unregistered(n, ns, name, overload))));
    };
    if n.outputs.iter().any(|o| !matches!(o, Arg::Tensor(_) | Arg::Tensors(_) | Arg::None)) {
        return Err(Fail::Unsupported(Some(format!(
            "custom op `{ns}::{name}` returns non-tensor values, which kiln cannot bind"
        ))));
    }
    let names = output_names(n);
    let mut ctx =
        CustomOpContext { imp: &mut *imp, node: n, qualified: format!("{ns}::{name}"), overload: overload.to_string() };
    let values = lowering(&mut ctx)
        .map_err(|e| Fail::Unsupported(Some(format!("the registered lowering of `{ns}::{name}` failed: {e}"))))?;
    if values.len() != names.len() {
        return Err(Fail::Unsupported(Some(format!(
            "the registered lowering of `{ns}::{name}` returned {} values for {} tensor outputs",
            values.len(),
            names.len()
        ))));
    }
    for (i, (name_i, &v)) in names.iter().zip(&values).enumerate() {
        if imp.g.values.get(v).is_none() {
            return Err(Fail::Unsupported(Some(format!(
                "the lowering of `{ns}::{name}` returned {v}, which is not a value of the graph"
            ))));
        }
        let want = imp.type_of(name_i)?;
        let have = imp.ty(v).clone();
        let differs = have.dtype != want.dtype
            || have.rank() != want.rank()
            || have
                .shape
                .iter()
                .zip(&want.shape)
                .any(|(a, b)| kiln_ir::infer::dims_equal(a, b, &imp.g.symbols) == Some(false));
        if differs {
            let show = |t: &TensorType| kiln_ir::text::format_type(&imp.g, t);
            return Err(Fail::Unsupported(Some(format!(
                "the lowering of `{ns}::{name}` returned {} for output {i}, but the program declares {}",
                show(&have),
                show(&want)
            ))));
        }
        imp.bind_name(name_i, v);
    }
    Ok(())
}

/// The report for a custom op without a lowering: its signature as far as
/// the call shows it (argument names and kinds; the file stores no schema).
fn unregistered(n: &Node, ns: &str, name: &str, overload: &str) -> String {
    let args: Vec<String> = n.inputs.iter().map(|a| format!("{} {}", arg_kind(&a.arg), a.name)).collect();
    let outs: Vec<&str> = n.outputs.iter().map(arg_kind).collect();
    let ret = match outs.as_slice() {
        [one] => one.to_string(),
        many => format!("({})", many.join(", ")),
    };
    let what = if ns == "prims" { "a `prims` op kiln does not import" } else { "a custom op (not part of ATen)" };
    format!(
        "{what}, called as `{ns}::{name}.{overload}({}) -> {ret}`; the .pt2 stores no schema for it, so this signature is reconstructed from the call (omitted defaults are missing). \
         Register a lowering onto kiln IR with `ImportOptions::default().with_custom_op(\"{ns}::{name}\", …)` (see kiln_compiler::import::custom)",
        args.join(", ")
    )
}

/// Torch's schema spelling of an argument's kind.
fn arg_kind(a: &Arg) -> &'static str {
    match a {
        Arg::None => "None",
        Arg::Tensor(_) => "Tensor",
        Arg::Tensors(_) => "Tensor[]",
        Arg::OptionalTensors(_) => "Tensor?[]",
        Arg::Int(_) => "int",
        Arg::Ints(_) => "int[]",
        Arg::Float(_) => "float",
        Arg::Floats(_) => "float[]",
        Arg::Bool(_) => "bool",
        Arg::Bools(_) => "bool[]",
        Arg::Str(_) => "str",
        Arg::Strs(_) => "str[]",
        Arg::SymInt(SymIntArg::Int(_)) | Arg::SymInt(SymIntArg::Name(_)) => "SymInt",
        Arg::SymInts(_) => "SymInt[]",
        Arg::SymBool(_) => "SymBool",
        Arg::SymFloat(_) => "SymFloat",
        Arg::ScalarType(_) => "ScalarType",
        Arg::MemoryFormat(_) => "MemoryFormat",
        Arg::Layout(_) => "Layout",
        Arg::Device(_) => "Device",
        Arg::Graph(_) => "Graph",
        Arg::Operator(_) => "OpOverload",
        Arg::Complex(..) => "complex",
        Arg::Other(_) => "Any",
    }
}
