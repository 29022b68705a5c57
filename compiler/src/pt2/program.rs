//! The exported program (`models/model.json`) as plain data.
//!
//! Parsing is lenient the way torch's own deserializer is: unknown keys are
//! ignored, missing optional ones take their default. What kiln relies on is
//! checked and reported with its JSON path.

use super::json::{JsonError, J};
use std::collections::HashMap;

/// The newest schema major version this reader understands (torch ≥ 2.6).
pub const SCHEMA_MAJOR: u32 = 8;
/// The oldest: 7.x, written by torch 2.5.
pub const OLDEST_SCHEMA_MAJOR: u32 = 7;

#[derive(Clone, Debug)]
pub struct Program {
    pub schema_version: (u32, u32),
    pub torch_version: Option<String>,
    /// `["TRAINING"]` straight from `export()`, `["ATEN"]` after `run_decompositions()`.
    pub verifiers: Vec<String>,
    /// Symbol name → (min, max); `None` max is unbounded.
    pub range_constraints: Vec<(String, i64, Option<i64>)>,
    pub nodes: Vec<Node>,
    pub tensor_values: HashMap<String, TensorMeta>,
    pub sym_int_values: HashMap<String, SymExpr>,
    pub input_specs: Vec<InputSpec>,
    pub output_specs: Vec<OutputSpec>,
}

/// A size, stride or symbolic int: a literal or a sympy expression.
#[derive(Clone, Debug, PartialEq)]
pub enum SymExpr {
    Int(i64),
    Expr { expr: String, hint: Option<i64> },
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    /// Torch's serialized ScalarType number (see [`super::scalar_type`]).
    pub dtype: i64,
    pub sizes: Vec<SymExpr>,
    pub strides: Vec<SymExpr>,
    pub storage_offset: SymExpr,
    /// JSON path, for error messages.
    pub path: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub target: String,
    pub inputs: Vec<NamedArg>,
    pub outputs: Vec<Arg>,
    /// The node's name (2.15 writes it; older files use the first output's name).
    pub name: String,
    pub stack_trace: Option<String>,
    pub path: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NamedArg {
    pub name: String,
    pub arg: Arg,
}

/// One symbolic-int argument: a literal or the name of a symbolic value.
#[derive(Clone, Debug, PartialEq)]
pub enum SymIntArg {
    Int(i64),
    Name(String),
}

/// A node argument (the serialized `Argument` union), reduced to what an
/// importer can act on. Kinds kiln never reads keep only their tag.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    None,
    Tensor(String),
    Tensors(Vec<String>),
    OptionalTensors(Vec<Option<String>>),
    Int(i64),
    Ints(Vec<i64>),
    Float(f64),
    Floats(Vec<f64>),
    Bool(bool),
    Bools(Vec<bool>),
    Str(String),
    Strs(Vec<String>),
    SymInt(SymIntArg),
    SymInts(Vec<SymIntArg>),
    SymBool(String),
    /// A symbolic float by name (`.item()` of a float tensor); literal
    /// floats arrive as [`Arg::Float`].
    SymFloat(String),
    ScalarType(i64),
    MemoryFormat(i64),
    Layout(i64),
    Device(String),
    /// An operator passed to a higher-order op (`with_effects`), by its
    /// qualified name (`torch.ops.aten._linalg_check_errors.default`).
    Operator(String),
    /// A nested graph (`as_graph`): the branches of `torch.cond`, the body of
    /// `while_loop`, ...
    Graph(Box<SubGraph>),
    /// A Python complex number (`z * 1j`): real and imaginary parts.
    Complex(f64, f64),
    /// Anything else (`as_custom_obj`, ...), by tag.
    Other(String),
}

/// A graph argument of a higher-order op. Its value names form their own
/// namespace (they may repeat the outer graph's), with their own types.
#[derive(Clone, Debug, PartialEq)]
pub struct SubGraph {
    /// The submodule's name (`true_graph_0`).
    pub name: String,
    /// Placeholders, in the order the higher-order op passes its operands.
    pub inputs: Vec<Arg>,
    pub outputs: Vec<Arg>,
    pub nodes: Vec<Node>,
    pub tensor_values: HashMap<String, TensorMeta>,
    pub sym_int_values: HashMap<String, SymExpr>,
}

#[derive(Clone, Debug)]
pub enum InputSpec {
    User(Arg),
    Parameter {
        arg: String,
        fqn: String,
    },
    Buffer {
        arg: String,
        fqn: String,
        persistent: bool,
    },
    TensorConstant {
        arg: String,
        fqn: String,
    },
    ConstantInput {
        name: String,
        value: Arg,
    },
    /// `custom_obj`, `token` and future kinds, by tag and argument name.
    Other {
        kind: String,
        arg: String,
    },
}

#[derive(Clone, Debug)]
pub enum OutputSpec {
    User(Arg),
    /// `buffer_mutation`, `user_input_mutation`, `token`, ... by tag.
    Other {
        kind: String,
        arg: String,
        /// What the output writes into: `buffer_name` of a buffer mutation,
        /// `user_input_name` of an input mutation (empty for other kinds).
        target: String,
    },
}

impl Program {
    pub fn parse(root: J<'_>) -> Result<Program, JsonError> {
        let schema_version = root
            .with_opt("schema_version", |j| {
                let major = j.with("major", |m| m.i64())?;
                let minor = j.with_opt("minor", |m| m.i64())?.unwrap_or(0);
                let major = u32::try_from(major).map_err(|_| j.err("a u32 major version"))?;
                let minor = u32::try_from(minor).map_err(|_| j.err("a u32 minor version"))?;
                Ok((major, minor))
            })?
            .unwrap_or((0, 0));
        let torch_version = root.opt_str("torch_version")?;
        let verifiers = match root.with_opt("verifiers", |j| j.list(|v| v.str().map(str::to_string)))? {
            Some(v) => v,
            // Before the `verifiers` list there was a single `dialect` string.
            None => root.opt_str("dialect")?.into_iter().collect(),
        };
        let range_constraints = root.with_opt("range_constraints", |j| j.entries(parse_range))?.unwrap_or_default();
        root.with("graph_module", |gm| {
            let (nodes, tensor_values, sym_int_values) = gm.with("graph", |g| {
                let nodes = g.with_opt("nodes", |n| n.list(parse_node))?.unwrap_or_default();
                let tensor_values = g
                    .with_opt("tensor_values", |t| t.entries(|k, m| Ok((k.to_string(), parse_tensor_meta(m)?))))?
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                let sym_int_values = g
                    .with_opt("sym_int_values", |t| t.entries(|k, s| Ok((k.to_string(), parse_sym_expr(s)?))))?
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                Ok((nodes, tensor_values, sym_int_values))
            })?;
            let (input_specs, output_specs) = gm.with("signature", |s| {
                let ins = s.with_opt("input_specs", |l| l.list(parse_input_spec))?.unwrap_or_default();
                let outs = s.with_opt("output_specs", |l| l.list(parse_output_spec))?.unwrap_or_default();
                Ok((ins, outs))
            })?;
            Ok(Program {
                schema_version,
                torch_version,
                verifiers,
                range_constraints,
                nodes,
                tensor_values,
                sym_int_values,
                input_specs,
                output_specs,
            })
        })
    }
}

/// `{min_val, max_val}`; unbacked symbols carry bounds near ±2⁶³ (sometimes
/// beyond i64 as a float), which mean "unbounded".
fn parse_range(name: &str, r: J<'_>) -> Result<(String, i64, Option<i64>), JsonError> {
    const HUGE: i64 = i64::MAX / 2;
    let bound = |j: J<'_>| -> Result<Option<i64>, JsonError> {
        match j.v.as_i64() {
            Some(v) if v.checked_abs().is_some_and(|a| a < HUGE) => Ok(Some(v)),
            Some(_) => Ok(None),
            None if j.v.is_number() || j.v.is_string() => Ok(None),
            None => Err(j.err("an integer bound")),
        }
    };
    let min = r.with_opt("min_val", bound)?.flatten().unwrap_or(0);
    let max = r.with_opt("max_val", bound)?.flatten();
    Ok((name.to_string(), min, max))
}

fn parse_sym_expr(j: J<'_>) -> Result<SymExpr, JsonError> {
    j.union(|tag, v| match tag {
        "as_int" => Ok(SymExpr::Int(v.i64()?)),
        "as_expr" => {
            let expr = v.with("expr_str", |e| e.str().map(str::to_string))?;
            let hint = v.with_opt("hint", |h| match h.v.as_i64() {
                Some(i) => Ok(Some(i)),
                None => h.union(|t, x| if t == "as_int" { x.i64().map(Some) } else { Ok(None) }),
            })?;
            Ok(SymExpr::Expr { expr, hint: hint.flatten() })
        }
        _ => Err(v.err("`as_int` or `as_expr`")),
    })
}

fn parse_tensor_meta(j: J<'_>) -> Result<TensorMeta, JsonError> {
    Ok(TensorMeta {
        dtype: j.with("dtype", |d| d.i64())?,
        sizes: j.with("sizes", |s| s.list(parse_sym_expr))?,
        strides: j.with_opt("strides", |s| s.list(parse_sym_expr))?.unwrap_or_default(),
        storage_offset: j.with_opt("storage_offset", parse_sym_expr)?.unwrap_or(SymExpr::Int(0)),
        path: j.path(),
    })
}

fn parse_node(j: J<'_>) -> Result<Node, JsonError> {
    let target = j.with("target", |t| t.str().map(str::to_string))?;
    let inputs = j.with_opt("inputs", |l| {
        l.list(|i| {
            let name = i.with("name", |n| n.str().map(str::to_string))?;
            let arg = i.with("arg", parse_arg)?;
            Ok(NamedArg { name, arg })
        })
    })?;
    let outputs = j.with_opt("outputs", |l| l.list(parse_arg))?.unwrap_or_default();
    let stack_trace = j.with_opt("metadata", |m| m.opt_str("stack_trace"))?.flatten();
    let name = match j.opt_str("name")? {
        Some(n) => n,
        None => outputs.iter().find_map(first_name).unwrap_or_else(|| target.clone()),
    };
    Ok(Node { target, inputs: inputs.unwrap_or_default(), outputs, name, stack_trace, path: j.path() })
}

fn first_name(a: &Arg) -> Option<String> {
    match a {
        Arg::Tensor(n) | Arg::SymBool(n) | Arg::SymFloat(n) => Some(n.clone()),
        Arg::SymInt(SymIntArg::Name(n)) => Some(n.clone()),
        Arg::Tensors(ns) => ns.first().cloned(),
        _ => None,
    }
}

fn tensor_name(j: J<'_>) -> Result<String, JsonError> {
    j.with("name", |n| n.str().map(str::to_string))
}

fn sym_int(j: J<'_>) -> Result<SymIntArg, JsonError> {
    j.union(|tag, v| match tag {
        "as_int" => Ok(SymIntArg::Int(v.i64()?)),
        "as_name" => Ok(SymIntArg::Name(v.str()?.to_string())),
        _ => Err(v.err("`as_int` or `as_name`")),
    })
}

fn optional_tensor(j: J<'_>) -> Result<Option<String>, JsonError> {
    j.union(|tag, v| match tag {
        "as_tensor" => tensor_name(v).map(Some),
        "as_none" => Ok(None),
        _ => Err(v.err("`as_tensor` or `as_none`")),
    })
}

/// One `Argument` union.
pub fn parse_arg(j: J<'_>) -> Result<Arg, JsonError> {
    j.union(|tag, v| {
        Ok(match tag {
            "as_none" => Arg::None,
            "as_tensor" => Arg::Tensor(tensor_name(v)?),
            "as_tensors" => Arg::Tensors(v.list(tensor_name)?),
            "as_optional_tensor" => optional_tensor(v)?.map_or(Arg::None, Arg::Tensor),
            "as_optional_tensors" => Arg::OptionalTensors(v.list(optional_tensor)?),
            "as_int" => Arg::Int(v.i64()?),
            "as_ints" => Arg::Ints(v.list(|x| x.i64())?),
            "as_float" => Arg::Float(v.f64()?),
            "as_floats" => Arg::Floats(v.list(|x| x.f64())?),
            "as_bool" => Arg::Bool(v.bool()?),
            "as_bools" => Arg::Bools(v.list(|x| x.bool())?),
            "as_string" => Arg::Str(v.str()?.to_string()),
            "as_operator" => Arg::Operator(v.str()?.to_string()),
            "as_strings" => Arg::Strs(v.list(|x| x.str().map(str::to_string))?),
            "as_sym_int" => Arg::SymInt(sym_int(v)?),
            "as_sym_ints" => Arg::SymInts(v.list(sym_int)?),
            "as_sym_bool" => Arg::SymBool(v.union(|t, x| match t {
                "as_name" => x.str().map(str::to_string),
                "as_bool" => Ok(format!("{}", x.bool()?)),
                _ => Err(x.err("`as_name` or `as_bool`")),
            })?),
            "as_sym_float" => v.union(|t, x| match t {
                "as_name" => Ok(Arg::SymFloat(x.str()?.to_string())),
                "as_float" => Ok(Arg::Float(x.f64()?)),
                _ => Err(x.err("`as_name` or `as_float`")),
            })?,
            "as_scalar_type" => Arg::ScalarType(v.i64()?),
            "as_memory_format" => Arg::MemoryFormat(v.i64()?),
            "as_layout" => Arg::Layout(v.i64()?),
            "as_device" => Arg::Device(v.opt_str("type")?.unwrap_or_default()),
            "as_graph" => Arg::Graph(Box::new(parse_sub_graph(v)?)),
            "as_complex" => Arg::Complex(v.with("real", |x| x.f64())?, v.with("imag", |x| x.f64())?),
            other => Arg::Other(other.to_string()),
        })
    })
}

/// `{"name": "true_graph_0", "graph": {inputs, outputs, nodes, tensor_values, ...}}`.
fn parse_sub_graph(j: J<'_>) -> Result<SubGraph, JsonError> {
    let name = j.opt_str("name")?.unwrap_or_default();
    j.with("graph", |g| {
        Ok(SubGraph {
            name,
            inputs: g.with_opt("inputs", |l| l.list(parse_arg))?.unwrap_or_default(),
            outputs: g.with_opt("outputs", |l| l.list(parse_arg))?.unwrap_or_default(),
            nodes: g.with_opt("nodes", |n| n.list(parse_node))?.unwrap_or_default(),
            tensor_values: g
                .with_opt("tensor_values", |t| t.entries(|k, m| Ok((k.to_string(), parse_tensor_meta(m)?))))?
                .unwrap_or_default()
                .into_iter()
                .collect(),
            sym_int_values: g
                .with_opt("sym_int_values", |t| t.entries(|k, s| Ok((k.to_string(), parse_sym_expr(s)?))))?
                .unwrap_or_default()
                .into_iter()
                .collect(),
        })
    })
}

fn parse_input_spec(j: J<'_>) -> Result<InputSpec, JsonError> {
    j.union(|tag, v| {
        let arg_name = |v: J<'_>| v.with("arg", |a| a.with("name", |n| n.str().map(str::to_string)));
        Ok(match tag {
            "user_input" => InputSpec::User(v.with("arg", parse_arg)?),
            "parameter" => InputSpec::Parameter {
                arg: arg_name(v)?,
                fqn: v.with("parameter_name", |n| n.str().map(str::to_string))?,
            },
            "buffer" => InputSpec::Buffer {
                arg: arg_name(v)?,
                fqn: v.with("buffer_name", |n| n.str().map(str::to_string))?,
                persistent: v.with_opt("persistent", |p| p.bool())?.unwrap_or(true),
            },
            "tensor_constant" => InputSpec::TensorConstant {
                arg: arg_name(v)?,
                fqn: v.with("tensor_constant_name", |n| n.str().map(str::to_string))?,
            },
            "constant_input" => InputSpec::ConstantInput {
                name: v.with("name", |n| n.str().map(str::to_string))?,
                value: v.with_opt("value", parse_arg)?.unwrap_or(Arg::None),
            },
            other => {
                let arg = v.with_opt("arg", |a| Ok(a.opt_str("name")?.unwrap_or_default()))?.unwrap_or_default();
                InputSpec::Other { kind: other.to_string(), arg }
            }
        })
    })
}

fn parse_output_spec(j: J<'_>) -> Result<OutputSpec, JsonError> {
    j.union(|tag, v| {
        Ok(match tag {
            "user_output" => OutputSpec::User(v.with("arg", parse_arg)?),
            other => {
                let arg = v.with_opt("arg", |a| Ok(a.opt_str("name")?.unwrap_or_default()))?.unwrap_or_default();
                let target_key = match other {
                    "buffer_mutation" => Some("buffer_name"),
                    "user_input_mutation" => Some("user_input_name"),
                    _ => None,
                };
                let target = match target_key {
                    Some(key) => v.opt_str(key)?.unwrap_or_default(),
                    None => String::new(),
                };
                OutputSpec::Other { kind: other.to_string(), arg, target }
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pt2::json::{parse, J};

    /// What schema 7 (torch 2.5) writes differently: a bare `Infinity`,
    /// `as_none` as `[]`, null fields omitted, `dialect` instead of
    /// `verifiers`, sizes as plain infix expressions.
    #[test]
    fn schema_7_spellings() {
        let text = r#"{
            "schema_version": {"major": 7, "minor": 3},
            "dialect": "ATEN",
            "range_constraints": {"s0": {"min_val": 2, "max_val": 8}},
            "graph_module": {
                "graph": {
                    "nodes": [{
                        "target": "torch.ops.aten.clamp.default",
                        "inputs": [
                            {"name": "self", "arg": {"as_tensor": {"name": "x"}}},
                            {"name": "min", "arg": {"as_none": []}},
                            {"name": "max", "arg": {"as_float": Infinity}}
                        ],
                        "outputs": [{"as_tensor": {"name": "clamp"}}]
                    }],
                    "tensor_values": {"x": {"dtype": 7, "sizes": [{"as_expr": {"expr_str": "s0 + 1"}}]}}
                },
                "signature": {"input_specs": [], "output_specs": []}
            }
        }"#;
        let value = parse(text, "serialized_exported_program.json").unwrap();
        let program = Program::parse(J::root(&value, "serialized_exported_program.json")).unwrap();
        assert_eq!(program.schema_version, (7, 3));
        assert_eq!(program.verifiers, ["ATEN"]);
        assert_eq!(program.range_constraints, [("s0".to_string(), 2, Some(8))]);
        let node = &program.nodes[0];
        assert_eq!(node.name, "clamp");
        assert_eq!(node.inputs[1].arg, Arg::None);
        assert_eq!(node.inputs[2].arg, Arg::Float(f64::INFINITY));
        let x = &program.tensor_values["x"];
        assert_eq!(x.sizes, [SymExpr::Expr { expr: "s0 + 1".into(), hint: None }]);
        assert_eq!(x.storage_offset, SymExpr::Int(0));
    }
}
