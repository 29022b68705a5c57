//! Op names and attributes, both directions, in one table-like place so that
//! printing and parsing cannot drift apart.

use super::elements::{format_f64, literal_f64, Literal};
use super::lexer::Pos;
use super::ParseError;
use crate::PrimaryMap;
use crate::{DType, Dim, Op, PadMode, PoolKind, RandomDist, ReduceKind, ResizeMode, Symbol, SymbolId};

/// An attribute value as parsed, before the op says what it must be.
#[derive(Clone, Debug)]
pub(super) enum AttrVal {
    Lit(Literal, Pos),
    /// A bare identifier other than `true`/`false`/`inf`/`nan`: a dtype, a
    /// symbol, or `max`.
    Ident(String, Pos),
    /// A quoted string (an assertion's message).
    Str(String, Pos),
    /// A parenthesised dimension expression.
    Dim(Dim, Pos),
    List(Vec<AttrVal>, Pos),
    /// A nested `graph { ... }` (a loop's condition or body).
    Graph(Box<crate::Graph>, Pos),
}

impl AttrVal {
    pub(super) fn pos(&self) -> Pos {
        match self {
            AttrVal::Lit(_, p)
            | AttrVal::Ident(_, p)
            | AttrVal::Str(_, p)
            | AttrVal::Dim(_, p)
            | AttrVal::List(_, p)
            | AttrVal::Graph(_, p) => *p,
        }
    }
}

/// The `{key=value, ...}` of one op; each key must be taken exactly once.
pub(super) struct Attrs {
    pub(super) items: Vec<(String, AttrVal, Pos)>,
    pub(super) op_pos: Pos,
}

impl Attrs {
    fn opt(&mut self, key: &str) -> Option<AttrVal> {
        let i = self.items.iter().position(|(k, _, _)| k == key)?;
        Some(self.items.remove(i).1)
    }

    fn take(&mut self, key: &str, op: &str) -> Result<AttrVal, ParseError> {
        self.opt(key).ok_or_else(|| self.op_pos.error(format!("`{op}` needs attribute `{key}`")))
    }

    fn finish(self, op: &str) -> Result<(), ParseError> {
        match self.items.first() {
            Some((k, _, pos)) => Err(pos.error(format!("unknown attribute `{k}` for `{op}`"))),
            None => Ok(()),
        }
    }
}

fn int(v: &AttrVal) -> Result<i64, ParseError> {
    match v {
        AttrVal::Lit(Literal::Num(s), p) => {
            s.parse::<i64>().map_err(|_| p.error(format!("expected an integer, found `{s}`")))
        }
        AttrVal::Ident(s, _) if s == "max" => Ok(i64::MAX),
        other => Err(other.pos().error("expected an integer")),
    }
}

pub(super) fn uint(v: &AttrVal) -> Result<usize, ParseError> {
    let n = int(v)?;
    usize::try_from(n).map_err(|_| v.pos().error(format!("expected a non-negative integer, found {n}")))
}

pub(super) fn float(v: &AttrVal) -> Result<f64, ParseError> {
    match v {
        AttrVal::Lit(lit, p) => literal_f64(lit).map_err(|m| p.error(m)),
        other => Err(other.pos().error("expected a number")),
    }
}

fn boolean(v: &AttrVal) -> Result<bool, ParseError> {
    match v {
        AttrVal::Lit(Literal::Bool(b), _) => Ok(*b),
        other => Err(other.pos().error("expected `true` or `false`")),
    }
}

fn dtype(v: &AttrVal) -> Result<DType, ParseError> {
    match v {
        AttrVal::Ident(s, p) => DType::from_name(s).ok_or_else(|| p.error(format!("unknown dtype `{s}`"))),
        other => Err(other.pos().error("expected a dtype")),
    }
}

pub(super) fn dim(v: &AttrVal, symbols: &PrimaryMap<SymbolId, Symbol>) -> Result<Dim, ParseError> {
    match v {
        AttrVal::Lit(Literal::Num(_), _) => Ok(Dim::Const(int(v)?)),
        AttrVal::Ident(name, p) => symbol(name, *p, symbols).map(Dim::Sym),
        AttrVal::Dim(d, _) => Ok(d.clone()),
        other => Err(other.pos().error("expected a dimension")),
    }
}

pub(super) fn symbol(name: &str, pos: Pos, symbols: &PrimaryMap<SymbolId, Symbol>) -> Result<SymbolId, ParseError> {
    symbols
        .iter()
        .find(|(_, s)| s.name == name)
        .map(|(id, _)| id)
        .ok_or_else(|| pos.error(format!("undefined symbol `{name}`")))
}

fn list<T>(v: &AttrVal, each: impl Fn(&AttrVal) -> Result<T, ParseError>) -> Result<Vec<T>, ParseError> {
    match v {
        AttrVal::List(items, _) => items.iter().map(each).collect(),
        other => Err(other.pos().error("expected a list `[...]`")),
    }
}

/// The names of [`Op::ScatterElements`]'s `reduce` attribute.
const SCATTER_REDUCE: [(&str, Option<ReduceKind>); 6] = [
    ("none", None),
    ("sum", Some(ReduceKind::Sum)),
    ("mean", Some(ReduceKind::Mean)),
    ("max", Some(ReduceKind::Max)),
    ("min", Some(ReduceKind::Min)),
    ("prod", Some(ReduceKind::Prod)),
];

fn scatter_reduce(v: &AttrVal) -> Result<Option<ReduceKind>, ParseError> {
    match v {
        AttrVal::Ident(m, p) => match SCATTER_REDUCE.iter().find(|(n, _)| n == m) {
            Some((_, r)) => Ok(*r),
            None => Err(p.error(format!("unknown scatter reduction `{m}`"))),
        },
        other => Err(other.pos().error("expected `none`, `sum`, `mean`, `max`, `min` or `prod`")),
    }
}

fn scatter_reduce_name(r: Option<ReduceKind>) -> &'static str {
    SCATTER_REDUCE.iter().find(|(_, k)| *k == r).map_or("none", |(n, _)| n)
}

fn reduce_kind(name: &str) -> Option<ReduceKind> {
    Some(match name {
        "reduce_sum" => ReduceKind::Sum,
        "reduce_mean" => ReduceKind::Mean,
        "reduce_max" => ReduceKind::Max,
        "reduce_min" => ReduceKind::Min,
        "reduce_prod" => ReduceKind::Prod,
        _ => return None,
    })
}

/// A fused epilogue's attributes: `bias`, then `activation` (a unary op's
/// name or `clamp` with optional `min` / `max`) and `residual` (`before` or
/// `after` the activation), each omitted when absent.
fn epilogue(a: &mut Attrs, op: &str) -> Result<crate::Epilogue, ParseError> {
    use crate::{Activation, Residual};
    let bias = boolean(&a.take("bias", op)?)?;
    let (min, max) = (a.opt("min"), a.opt("max"));
    let activation = match a.opt("activation") {
        None => None,
        Some(AttrVal::Ident(s, _)) if s == "clamp" => Some(Activation::Clamp {
            min: min.as_ref().map(float).transpose()?,
            max: max.as_ref().map(float).transpose()?,
        }),
        Some(AttrVal::Ident(s, p)) => Some(
            crate::UnaryOp::from_name(&s)
                .and_then(Activation::from_unary)
                .ok_or_else(|| p.error(format!("`{s}` is no epilogue activation")))?,
        ),
        Some(other) => return Err(other.pos().error("expected an activation name")),
    };
    if !matches!(activation, Some(Activation::Clamp { .. })) {
        if let Some(v) = min.or(max) {
            return Err(v.pos().error("`min` and `max` belong to `activation=clamp`"));
        }
    }
    let residual = match a.opt("residual") {
        None => Residual::None,
        Some(AttrVal::Ident(s, p)) => match Residual::from_name(&s) {
            Some(r) if r != Residual::None => r,
            _ => return Err(p.error(format!("residual must be `before` or `after`, found `{s}`"))),
        },
        Some(other) => return Err(other.pos().error("expected `before` or `after`")),
    };
    Ok(crate::Epilogue { bias, activation, residual })
}

fn format_epilogue(e: &crate::Epilogue) -> Vec<String> {
    use crate::{Activation, Residual};
    let mut v = vec![format!("bias={}", e.bias)];
    if let Some(a) = e.activation {
        v.push(format!("activation={}", a.name()));
        if let Activation::Clamp { min, max } = a {
            v.extend(min.map(|m| format!("min={}", format_f64(m))));
            v.extend(max.map(|m| format!("max={}", format_f64(m))));
        }
    }
    if e.residual != Residual::None {
        v.push(format!("residual={}", e.residual.name()));
    }
    v
}

/// The attribute keys `name` accepts, so that a misspelt key is reported as
/// unknown rather than as the missing key it was meant to be.
fn attr_keys(name: &str) -> &'static [&'static str] {
    match name {
        "cast" => &["to"],
        "clamp" => &["min", "max"],
        "conv" => &["stride", "padding", "dilation", "groups"],
        "conv_fused" => &["stride", "padding", "dilation", "groups", "bias", "activation", "min", "max", "residual"],
        "linear_fused" => &["bias", "activation", "min", "max", "residual"],
        "batch_norm" => &["eps"],
        "layer_norm" => &["normalized_rank", "eps"],
        "softmax" | "log_softmax" | "concat" | "gather" => &["axis"],
        "argmax" => &["axis", "keep_dims"],
        "max_pool" | "max_pool_indices" | "avg_pool" => {
            &["kernel", "stride", "padding", "dilation", "ceil_mode", "count_include_pad", "divisor"]
        }
        "adaptive_avg_pool" => &["output"],
        "attention" => &["causal", "scale"],
        "reshape" | "expand" => &["shape"],
        "permute" => &["perm"],
        "slice" => &["axis", "start", "end", "step"],
        "full" => &["value", "dtype", "shape"],
        "arange" => &["start", "step", "len", "dtype"],
        "cumsum" => &["axis"],
        "scan" => &["axis", "kind"],
        "linalg" => &["op", "upper", "left", "unit"],
        "assert" => &["message"],
        "argmin" => &["axis", "keep_dims"],
        "sort" => &["axis", "k", "descending", "indices"],
        "pad" => &["lo", "hi", "interior", "mode", "value"],
        "flip" => &["axes"],
        "upsample_nearest" | "upsample_linear" => &["align_corners", "size", "scales"],
        "random_uniform" | "random_int" => &["low", "high", "dtype", "shape", "stream"],
        "random_normal" => &["mean", "std", "dtype", "shape", "stream"],
        "random_perm" => &["dtype", "shape", "stream"],
        "gather_elements" | "index_gather" => &["axis"],
        "scatter_elements" => &["axis", "reduce", "include_self"],
        "index_put" => &["axis", "accumulate"],
        "bind_dim" => &["symbol"],
        "nonzero" => &["count"],
        "while" => &["carried", "cond", "body"],
        "fused" => &["program"],
        "rms_norm" => &["normalized_rank", "eps"],
        "quant_linear" => &["bits", "group", "zero_points", "dynamic", "act_scale", "act_zero_point"],
        _ if reduce_kind(name).is_some() => &["axes", "keep_dims"],
        _ => &[],
    }
}

/// Builds the op called `name` from its attributes.
pub(super) fn build_op(name: &str, mut a: Attrs, symbols: &PrimaryMap<SymbolId, Symbol>) -> Result<Op, ParseError> {
    let pos = a.op_pos;
    let keys = attr_keys(name);
    if let Some((k, _, kpos)) = a.items.iter().find(|(k, _, _)| !keys.contains(&k.as_str())) {
        return Err(kpos.error(format!("unknown attribute `{k}` for `{name}`")));
    }
    let ints = |v: AttrVal| list(&v, int);
    let uints = |v: AttrVal| list(&v, uint);
    let dims = |v: AttrVal| list(&v, |d| dim(d, symbols));
    let op = if let Some(u) = crate::UnaryOp::from_name(name) {
        Op::Unary(u)
    } else if let Some(b) = crate::BinaryOp::from_name(name) {
        Op::Binary(b)
    } else if let Some(kind) = reduce_kind(name) {
        Op::Reduce { kind, axes: uints(a.take("axes", name)?)?, keep_dims: boolean(&a.take("keep_dims", name)?)? }
    } else {
        match name {
            "where" => Op::Where,
            "cast" => Op::Cast { to: dtype(&a.take("to", name)?)? },
            "clamp" => Op::Clamp {
                min: a.opt("min").map(|v| float(&v)).transpose()?,
                max: a.opt("max").map(|v| float(&v)).transpose()?,
            },
            "matmul" => Op::MatMul,
            "grouped_matmul" => Op::GroupedMatMul,
            "linear" => Op::Linear,
            "conv" => Op::Conv {
                stride: ints(a.take("stride", name)?)?,
                padding: ints(a.take("padding", name)?)?,
                dilation: ints(a.take("dilation", name)?)?,
                groups: int(&a.take("groups", name)?)?,
            },
            "conv_fused" => Op::ConvFused {
                stride: ints(a.take("stride", name)?)?,
                padding: ints(a.take("padding", name)?)?,
                dilation: ints(a.take("dilation", name)?)?,
                groups: int(&a.take("groups", name)?)?,
                epilogue: epilogue(&mut a, name)?,
            },
            "linear_fused" => Op::LinearFused { epilogue: epilogue(&mut a, name)? },
            "batch_norm" => Op::BatchNorm { eps: float(&a.take("eps", name)?)? },
            "layer_norm" => Op::LayerNorm {
                normalized_rank: uint(&a.take("normalized_rank", name)?)?,
                eps: float(&a.take("eps", name)?)?,
            },
            "softmax" => Op::Softmax { axis: uint(&a.take("axis", name)?)? },
            "log_softmax" => Op::LogSoftmax { axis: uint(&a.take("axis", name)?)? },
            "argmax" => {
                Op::ArgMax { axis: uint(&a.take("axis", name)?)?, keep_dims: boolean(&a.take("keep_dims", name)?)? }
            }
            "max_pool" | "max_pool_indices" | "avg_pool" => Op::Pool {
                kind: match name {
                    "max_pool" => PoolKind::Max,
                    "max_pool_indices" => PoolKind::ArgMax,
                    _ => PoolKind::Avg,
                },
                kernel: ints(a.take("kernel", name)?)?,
                stride: ints(a.take("stride", name)?)?,
                padding: ints(a.take("padding", name)?)?,
                dilation: ints(a.take("dilation", name)?)?,
                ceil_mode: boolean(&a.take("ceil_mode", name)?)?,
                count_include_pad: boolean(&a.take("count_include_pad", name)?)?,
                divisor: a.opt("divisor").map(|v| int(&v)).transpose()?,
            },
            "adaptive_avg_pool" => Op::AdaptiveAvgPool { output: ints(a.take("output", name)?)? },
            "attention" => Op::Attention {
                causal: boolean(&a.take("causal", name)?)?,
                scale: a.opt("scale").map(|v| float(&v)).transpose()?,
            },
            "reshape" => Op::Reshape { shape: dims(a.take("shape", name)?)? },
            "expand" => Op::Expand { shape: dims(a.take("shape", name)?)? },
            "permute" => Op::Permute { perm: uints(a.take("perm", name)?)? },
            "slice" => Op::Slice {
                axis: uint(&a.take("axis", name)?)?,
                start: int(&a.take("start", name)?)?,
                end: int(&a.take("end", name)?)?,
                step: int(&a.take("step", name)?)?,
            },
            "concat" => Op::Concat { axis: uint(&a.take("axis", name)?)? },
            "gather" => Op::Gather { axis: uint(&a.take("axis", name)?)? },
            "full" => Op::Full {
                value: float(&a.take("value", name)?)?,
                dtype: dtype(&a.take("dtype", name)?)?,
                shape: dims(a.take("shape", name)?)?,
            },
            "arange" => Op::Arange {
                start: float(&a.take("start", name)?)?,
                step: float(&a.take("step", name)?)?,
                len: dim(&a.take("len", name)?, symbols)?,
                dtype: dtype(&a.take("dtype", name)?)?,
            },
            "cumsum" => Op::CumSum { axis: uint(&a.take("axis", name)?)? },
            "linalg" => Op::Linalg {
                op: match a.take("op", name)? {
                    AttrVal::Ident(k, p) => {
                        crate::LinalgOp::from_name(&k).ok_or_else(|| p.error(format!("unknown linalg op `{k}`")))?
                    }
                    other => return Err(other.pos().error("expected a linalg op (det, inv, solve, ...)")),
                },
                upper: boolean(&a.take("upper", name)?)?,
                left: boolean(&a.take("left", name)?)?,
                unit: boolean(&a.take("unit", name)?)?,
            },
            "assert" => Op::Assert {
                message: match a.take("message", name)? {
                    AttrVal::Str(s, _) => s,
                    other => return Err(other.pos().error("expected a quoted message")),
                },
            },
            "scan" => Op::Scan {
                axis: uint(&a.take("axis", name)?)?,
                kind: match a.take("kind", name)? {
                    AttrVal::Ident(k, p) => {
                        crate::ScanKind::from_name(&k).ok_or_else(|| p.error(format!("unknown scan kind `{k}`")))?
                    }
                    other => return Err(other.pos().error("expected a scan kind (prod, logsumexp, max, min, ...)")),
                },
            },
            "argmin" => {
                Op::ArgMin { axis: uint(&a.take("axis", name)?)?, keep_dims: boolean(&a.take("keep_dims", name)?)? }
            }
            "sort" => Op::Sort {
                axis: uint(&a.take("axis", name)?)?,
                k: dim(&a.take("k", name)?, symbols)?,
                descending: boolean(&a.take("descending", name)?)?,
                indices: boolean(&a.take("indices", name)?)?,
            },
            "pad" => Op::Pad {
                lo: ints(a.take("lo", name)?)?,
                hi: ints(a.take("hi", name)?)?,
                interior: ints(a.take("interior", name)?)?,
                mode: match a.take("mode", name)? {
                    AttrVal::Ident(m, _) if m == "constant" => PadMode::Constant,
                    AttrVal::Ident(m, _) if m == "reflect" => PadMode::Reflect,
                    AttrVal::Ident(m, _) if m == "replicate" => PadMode::Replicate,
                    other => return Err(other.pos().error("expected `constant`, `reflect` or `replicate`")),
                },
                value: float(&a.take("value", name)?)?,
            },
            "flip" => Op::Flip { axes: uints(a.take("axes", name)?)? },
            "upsample_nearest" | "upsample_linear" => Op::Upsample {
                mode: if name == "upsample_nearest" { ResizeMode::Nearest } else { ResizeMode::Linear },
                align_corners: boolean(&a.take("align_corners", name)?)?,
                size: dims(a.take("size", name)?)?,
                scales: list(&a.take("scales", name)?, float)?,
            },
            "gather_elements" => Op::GatherElements { axis: uint(&a.take("axis", name)?)? },
            "scatter_elements" => Op::ScatterElements {
                axis: uint(&a.take("axis", name)?)?,
                reduce: scatter_reduce(&a.take("reduce", name)?)?,
                include_self: boolean(&a.take("include_self", name)?)?,
            },
            "index_gather" => Op::IndexGather { axis: uint(&a.take("axis", name)?)? },
            "index_put" => {
                Op::IndexPut { axis: uint(&a.take("axis", name)?)?, accumulate: boolean(&a.take("accumulate", name)?)? }
            }
            "bind_dim" | "nonzero" => {
                let key = if name == "bind_dim" { "symbol" } else { "count" };
                let s = match a.take(key, name)? {
                    AttrVal::Ident(s, p) => symbol(&s, p, symbols)?,
                    other => return Err(other.pos().error("expected a symbol")),
                };
                if name == "bind_dim" {
                    Op::BindDim { symbol: s }
                } else {
                    Op::NonZero { count: s }
                }
            }
            "quant_linear" => Op::QuantLinear {
                bits: u8::try_from(uint(&a.take("bits", name)?)?).map_err(|_| a.op_pos.error("bits out of range"))?,
                group: uint(&a.take("group", name)?)?,
                zero_points: boolean(&a.take("zero_points", name)?)?,
                dynamic: boolean(&a.take("dynamic", name)?)?,
                act_scale: a.opt("act_scale").map(|v| float(&v)).transpose()?,
                act_zero_point: a.opt("act_zero_point").map(|v| int(&v)).transpose()?.unwrap_or(0),
            },
            "rms_norm" => Op::RmsNorm {
                normalized_rank: uint(&a.take("normalized_rank", name)?)?,
                eps: float(&a.take("eps", name)?)?,
            },
            "fused" => Op::Fused { program: super::fused::parse_program(&a.take("program", name)?)? },
            "while" => {
                let region = |v: AttrVal| match v {
                    AttrVal::Graph(g, _) => Ok(crate::Region(g)),
                    other => Err(other.pos().error("expected a nested `graph { ... }`")),
                };
                Op::While {
                    carried: uint(&a.take("carried", name)?)?,
                    cond: region(a.take("cond", name)?)?,
                    body: region(a.take("body", name)?)?,
                }
            }
            "random_uniform" | "random_normal" | "random_int" | "random_perm" => {
                let dist = match name {
                    "random_uniform" => {
                        RandomDist::Uniform { low: float(&a.take("low", name)?)?, high: float(&a.take("high", name)?)? }
                    }
                    "random_normal" => {
                        RandomDist::Normal { mean: float(&a.take("mean", name)?)?, std: float(&a.take("std", name)?)? }
                    }
                    "random_int" => {
                        RandomDist::Int { low: int(&a.take("low", name)?)?, high: int(&a.take("high", name)?)? }
                    }
                    _ => RandomDist::Perm,
                };
                let stream = int(&a.take("stream", name)?)?;
                Op::Random {
                    dist,
                    dtype: dtype(&a.take("dtype", name)?)?,
                    shape: dims(a.take("shape", name)?)?,
                    stream: u32::try_from(stream).map_err(|_| pos.error(format!("stream {stream} is not a u32")))?,
                }
            }
            _ => return Err(pos.error(format!("unknown op `{name}`"))),
        }
    };
    a.finish(name)?;
    Ok(op)
}

fn fmt_int(v: i64) -> String {
    if v == i64::MAX {
        "max".to_string()
    } else {
        v.to_string()
    }
}

fn fmt_list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    let parts: Vec<String> = items.iter().map(f).collect();
    format!("[{}]", parts.join(", "))
}

/// The attributes of `op` in canonical order, as `key=value` texts.
pub(super) fn format_attrs(op: &Op, symbols: &PrimaryMap<SymbolId, Symbol>) -> Vec<String> {
    let attrs = format_attrs_unchecked(op, symbols);
    debug_assert!(
        attrs.iter().all(|kv| attr_keys(op.name()).iter().any(|k| kv.starts_with(&format!("{k}=")))),
        "`attr_keys` is missing a key of {attrs:?}"
    );
    attrs
}

fn format_attrs_unchecked(op: &Op, symbols: &PrimaryMap<SymbolId, Symbol>) -> Vec<String> {
    let ints = |v: &[i64]| fmt_list(v, |x| fmt_int(*x));
    let uints = |v: &[usize]| fmt_list(v, |x| x.to_string());
    let dims = |v: &[Dim]| fmt_list(v, |d| d.display(symbols).to_string());
    let kv = |k: &str, v: String| format!("{k}={v}");
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::MatMul | Op::GroupedMatMul | Op::Linear => vec![],
        Op::Cast { to } => vec![kv("to", to.to_string())],
        Op::Clamp { min, max } => {
            let mut v = vec![];
            if let Some(m) = min {
                v.push(kv("min", format_f64(*m)));
            }
            if let Some(m) = max {
                v.push(kv("max", format_f64(*m)));
            }
            v
        }
        Op::Conv { stride, padding, dilation, groups } => vec![
            kv("stride", ints(stride)),
            kv("padding", ints(padding)),
            kv("dilation", ints(dilation)),
            kv("groups", fmt_int(*groups)),
        ],
        Op::ConvFused { stride, padding, dilation, groups, epilogue } => {
            let mut v = vec![
                kv("stride", ints(stride)),
                kv("padding", ints(padding)),
                kv("dilation", ints(dilation)),
                kv("groups", fmt_int(*groups)),
            ];
            v.extend(format_epilogue(epilogue));
            v
        }
        Op::LinearFused { epilogue } => format_epilogue(epilogue),
        Op::BatchNorm { eps } => vec![kv("eps", format_f64(*eps))],
        Op::QuantLinear { bits, group, zero_points, dynamic, act_scale, act_zero_point } => {
            let mut attrs = vec![
                kv("bits", bits.to_string()),
                kv("group", group.to_string()),
                kv("zero_points", zero_points.to_string()),
                kv("dynamic", dynamic.to_string()),
            ];
            // Static activations only: the float programs' text stays as it was.
            if let Some(s) = act_scale {
                attrs.push(kv("act_scale", format_f64(*s)));
                attrs.push(kv("act_zero_point", act_zero_point.to_string()));
            }
            attrs
        }
        Op::LayerNorm { normalized_rank, eps } | Op::RmsNorm { normalized_rank, eps } => {
            vec![kv("normalized_rank", normalized_rank.to_string()), kv("eps", format_f64(*eps))]
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Concat { axis } | Op::Gather { axis } => {
            vec![kv("axis", axis.to_string())]
        }
        Op::Reduce { kind: _, axes, keep_dims } => {
            vec![kv("axes", uints(axes)), kv("keep_dims", keep_dims.to_string())]
        }
        Op::ArgMax { axis, keep_dims } => vec![kv("axis", axis.to_string()), kv("keep_dims", keep_dims.to_string())],
        Op::Pool { kind: _, kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor } => {
            let mut v = vec![
                kv("kernel", ints(kernel)),
                kv("stride", ints(stride)),
                kv("padding", ints(padding)),
                kv("dilation", ints(dilation)),
                kv("ceil_mode", ceil_mode.to_string()),
                kv("count_include_pad", count_include_pad.to_string()),
            ];
            if let Some(d) = divisor {
                v.push(kv("divisor", d.to_string()));
            }
            v
        }
        Op::AdaptiveAvgPool { output } => vec![kv("output", ints(output))],
        Op::Attention { causal, scale } => {
            let mut v = vec![kv("causal", causal.to_string())];
            if let Some(s) = scale {
                v.push(kv("scale", format_f64(*s)));
            }
            v
        }
        Op::Reshape { shape } | Op::Expand { shape } => vec![kv("shape", dims(shape))],
        Op::Permute { perm } => vec![kv("perm", uints(perm))],
        Op::Slice { axis, start, end, step } => vec![
            kv("axis", axis.to_string()),
            kv("start", fmt_int(*start)),
            kv("end", fmt_int(*end)),
            kv("step", fmt_int(*step)),
        ],
        Op::Full { value, dtype, shape } => {
            vec![kv("value", format_f64(*value)), kv("dtype", dtype.to_string()), kv("shape", dims(shape))]
        }
        Op::Arange { start, step, len, dtype } => vec![
            kv("start", format_f64(*start)),
            kv("step", format_f64(*step)),
            kv("len", len.display(symbols).to_string()),
            kv("dtype", dtype.to_string()),
        ],
        Op::CumSum { axis } => vec![kv("axis", axis.to_string())],
        Op::Scan { axis, kind } => vec![kv("axis", axis.to_string()), kv("kind", kind.name().to_string())],
        Op::Linalg { op, upper, left, unit } => vec![
            kv("op", op.name().to_string()),
            kv("upper", upper.to_string()),
            kv("left", left.to_string()),
            kv("unit", unit.to_string()),
        ],
        Op::Assert { message } => vec![kv("message", super::lexer::quote(message))],
        Op::ArgMin { axis, keep_dims } => vec![kv("axis", axis.to_string()), kv("keep_dims", keep_dims.to_string())],
        Op::Sort { axis, k, descending, indices } => vec![
            kv("axis", axis.to_string()),
            kv("k", k.display(symbols).to_string()),
            kv("descending", descending.to_string()),
            kv("indices", indices.to_string()),
        ],
        Op::Pad { lo, hi, interior, mode, value } => vec![
            kv("lo", ints(lo)),
            kv("hi", ints(hi)),
            kv("interior", ints(interior)),
            kv(
                "mode",
                match mode {
                    PadMode::Constant => "constant",
                    PadMode::Reflect => "reflect",
                    PadMode::Replicate => "replicate",
                }
                .to_string(),
            ),
            kv("value", format_f64(*value)),
        ],
        Op::Flip { axes } => vec![kv("axes", uints(axes))],
        Op::Upsample { mode: _, align_corners, size, scales } => vec![
            kv("align_corners", align_corners.to_string()),
            kv("size", dims(size)),
            kv("scales", fmt_list(scales, |x| format_f64(*x))),
        ],
        Op::GatherElements { axis } | Op::IndexGather { axis } => vec![kv("axis", axis.to_string())],
        Op::ScatterElements { axis, reduce, include_self } => vec![
            kv("axis", axis.to_string()),
            kv("reduce", scatter_reduce_name(*reduce).to_string()),
            kv("include_self", include_self.to_string()),
        ],
        Op::IndexPut { axis, accumulate } => {
            vec![kv("axis", axis.to_string()), kv("accumulate", accumulate.to_string())]
        }
        Op::Random { dist, dtype, shape, stream } => {
            let mut v = match dist {
                RandomDist::Uniform { low, high } => vec![kv("low", format_f64(*low)), kv("high", format_f64(*high))],
                RandomDist::Normal { mean, std } => vec![kv("mean", format_f64(*mean)), kv("std", format_f64(*std))],
                RandomDist::Int { low, high } => vec![kv("low", fmt_int(*low)), kv("high", fmt_int(*high))],
                RandomDist::Perm => vec![],
            };
            v.extend([kv("dtype", dtype.to_string()), kv("shape", dims(shape)), kv("stream", stream.to_string())]);
            v
        }
        Op::BindDim { symbol } => vec![kv("symbol", Dim::Sym(*symbol).display(symbols).to_string())],
        Op::NonZero { count } => vec![kv("count", Dim::Sym(*count).display(symbols).to_string())],
        Op::Fused { program } => vec![kv("program", super::fused::format_program(program))],
        Op::While { carried, cond, body } => {
            vec![kv("carried", carried.to_string()), kv("cond", nested_graph(cond)), kv("body", nested_graph(body))]
        }
    }
}

/// A nested graph's text, indented one level deeper than the node holding it.
/// Line breaks only ever separate statements (strings escape theirs).
fn nested_graph(g: &crate::Graph) -> String {
    let text = super::print::print_graph(g, None);
    text.trim_end().lines().collect::<Vec<_>>().join("\n  ")
}
