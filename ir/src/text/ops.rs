//! Op attributes, both directions. Which names and keys an op has comes from
//! the op table (`crate::op`, [`crate::op::text_forms`]); the value of each
//! field is read and written by its type's codec ([`AttrValue`] for one
//! value, [`AttrField`] for a field that is one key, an optional key, or
//! several keys), so printing and parsing cannot drift apart. The table's
//! `custom` rows are spelt by hand here ([`parse_custom`], [`format_custom`]).

use super::elements::{format_f64, literal_f64, Literal};
use super::lexer::Pos;
use super::ParseError;
use crate::PrimaryMap;
use crate::{DType, Dim, Op, RandomDist, ReduceKind, Symbol, SymbolId};
use std::collections::HashMap;
use std::sync::OnceLock;

/// An attribute value as parsed, before the op says what it must be.
#[derive(Clone, Debug)]
pub(crate) enum AttrVal {
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
pub(crate) struct Attrs {
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

/// A fused epilogue's attributes: `bias`, then `activation` (a unary op's
/// name, `mul_sigmoid`, `hardswish`, `gelu_tanh_chain`, or `clamp` with
/// optional `min` / `max`) and `residual` (`before` or `after` the
/// activation), each omitted when absent.
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
        Some(AttrVal::Ident(s, p)) => {
            Some(Activation::from_name(&s).ok_or_else(|| p.error(format!("`{s}` is no epilogue activation")))?)
        }
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

/// A nested graph's text, indented one level deeper than the node holding it.
/// Line breaks only ever separate statements (strings escape theirs).
fn nested_graph(g: &crate::Graph) -> String {
    let text = super::print::print_graph(g, None);
    text.trim_end().lines().collect::<Vec<_>>().join("\n  ")
}

type Symbols = PrimaryMap<SymbolId, Symbol>;

/// How one attribute value of a field type is read and written.
pub(crate) trait AttrValue: Sized {
    fn parse(v: &AttrVal, symbols: &Symbols) -> Result<Self, ParseError>;
    fn format(&self, symbols: &Symbols) -> String;
}

/// How a field is spelt among an op's attributes: by default one required
/// key named like the field; `Option<T>` is a key omitted when absent; an
/// epilogue is several keys.
pub(crate) trait AttrField: Sized {
    fn take(a: &mut Attrs, key: &'static str, op: &str, symbols: &Symbols) -> Result<Self, ParseError>;
    fn put(&self, key: &'static str, out: &mut Vec<String>, symbols: &Symbols);
    /// The keys the field is spelt with, in printing order.
    fn keys(key: &'static str) -> Vec<&'static str> {
        vec![key]
    }
}

impl<T: AttrValue> AttrField for T {
    fn take(a: &mut Attrs, key: &'static str, op: &str, symbols: &Symbols) -> Result<T, ParseError> {
        T::parse(&a.take(key, op)?, symbols)
    }

    fn put(&self, key: &'static str, out: &mut Vec<String>, symbols: &Symbols) {
        out.push(format!("{key}={}", self.format(symbols)));
    }
}

impl<T: AttrValue> AttrField for Option<T> {
    fn take(a: &mut Attrs, key: &'static str, _op: &str, symbols: &Symbols) -> Result<Option<T>, ParseError> {
        a.opt(key).map(|v| T::parse(&v, symbols)).transpose()
    }

    fn put(&self, key: &'static str, out: &mut Vec<String>, symbols: &Symbols) {
        if let Some(v) = self {
            out.push(format!("{key}={}", v.format(symbols)));
        }
    }
}

impl AttrField for crate::Epilogue {
    fn take(a: &mut Attrs, _key: &'static str, op: &str, _symbols: &Symbols) -> Result<crate::Epilogue, ParseError> {
        epilogue(a, op)
    }

    fn put(&self, _key: &'static str, out: &mut Vec<String>, _symbols: &Symbols) {
        out.extend(format_epilogue(self));
    }

    fn keys(_key: &'static str) -> Vec<&'static str> {
        vec!["bias", "activation", "min", "max", "residual"]
    }
}

/// An i8 value's quantization: `out_scale=S, out_zero_point=Z` for the
/// result (`out_quant`), `res_scale`, `res_zero_point` for the residual
/// (`res_quant`), both omitted when absent.
impl AttrField for Option<crate::QParams> {
    fn take(a: &mut Attrs, key: &'static str, _op: &str, _symbols: &Symbols) -> Result<Self, ParseError> {
        let [scale, zero_point] = qparams_keys(key);
        let Some(s) = a.opt(scale) else { return Ok(None) };
        let zero_point = a.opt(zero_point).map(|v| int(&v)).transpose()?.unwrap_or(0);
        Ok(Some(crate::QParams { scale: float(&s)?, zero_point }))
    }

    fn put(&self, key: &'static str, out: &mut Vec<String>, _symbols: &Symbols) {
        if let Some(q) = self {
            let [scale, zero_point] = qparams_keys(key);
            out.push(format!("{scale}={}", format_f64(q.scale)));
            out.push(format!("{zero_point}={}", fmt_int(q.zero_point)));
        }
    }

    fn keys(key: &'static str) -> Vec<&'static str> {
        qparams_keys(key).to_vec()
    }
}

/// The text keys of a [`crate::QParams`] field.
fn qparams_keys(key: &'static str) -> [&'static str; 2] {
    match key {
        "res_quant" => ["res_scale", "res_zero_point"],
        _ => ["out_scale", "out_zero_point"],
    }
}

/// A convolution's layout: `layout=channels_last`, the key omitted for the
/// default channels-first (every text written before the layout pass).
impl AttrField for crate::Layout {
    fn take(a: &mut Attrs, key: &'static str, _op: &str, _symbols: &Symbols) -> Result<crate::Layout, ParseError> {
        let Some(v) = a.opt(key) else { return Ok(crate::Layout::ChannelsFirst) };
        let what = crate::Layout::ALL.iter().map(|x| x.name()).collect::<Vec<_>>().join(", ");
        match &v {
            AttrVal::Ident(k, p) => {
                crate::Layout::from_name(k).ok_or_else(|| p.error(format!("unknown layout `{k}` (one of {what})")))
            }
            other => Err(other.pos().error(format!("expected a layout (one of {what})"))),
        }
    }

    fn put(&self, key: &'static str, out: &mut Vec<String>, _symbols: &Symbols) {
        if *self != crate::Layout::ChannelsFirst {
            out.push(format!("{key}={}", self.name()));
        }
    }
}

/// Used by the op table's generated parsing.
pub(crate) fn take_attr<T: AttrField>(
    a: &mut Attrs,
    key: &'static str,
    op: &str,
    s: &Symbols,
) -> Result<T, ParseError> {
    T::take(a, key, op, s)
}

/// Used by the op table's generated printing.
pub(crate) fn put_attr<T: AttrField>(v: &T, key: &'static str, out: &mut Vec<String>, s: &Symbols) {
    v.put(key, out, s)
}

/// Used by the op table's list of text forms.
pub(crate) fn attr_keys<T: AttrField>(key: &'static str) -> Vec<&'static str> {
    T::keys(key)
}

impl AttrValue for i64 {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<i64, ParseError> {
        int(v)
    }
    fn format(&self, _: &Symbols) -> String {
        fmt_int(*self)
    }
}

impl AttrValue for usize {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<usize, ParseError> {
        uint(v)
    }
    fn format(&self, _: &Symbols) -> String {
        self.to_string()
    }
}

impl AttrValue for f64 {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<f64, ParseError> {
        float(v)
    }
    fn format(&self, _: &Symbols) -> String {
        format_f64(*self)
    }
}

impl AttrValue for bool {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<bool, ParseError> {
        boolean(v)
    }
    fn format(&self, _: &Symbols) -> String {
        self.to_string()
    }
}

impl AttrValue for DType {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<DType, ParseError> {
        dtype(v)
    }
    fn format(&self, _: &Symbols) -> String {
        self.to_string()
    }
}

impl AttrValue for Dim {
    fn parse(v: &AttrVal, symbols: &Symbols) -> Result<Dim, ParseError> {
        dim(v, symbols)
    }
    fn format(&self, symbols: &Symbols) -> String {
        self.display(symbols).to_string()
    }
}

impl AttrValue for SymbolId {
    fn parse(v: &AttrVal, symbols: &Symbols) -> Result<SymbolId, ParseError> {
        match v {
            AttrVal::Ident(s, p) => symbol(s, *p, symbols),
            other => Err(other.pos().error("expected a symbol")),
        }
    }
    fn format(&self, symbols: &Symbols) -> String {
        Dim::Sym(*self).display(symbols).to_string()
    }
}

/// An assertion's message: a quoted string.
impl AttrValue for String {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<String, ParseError> {
        match v {
            AttrVal::Str(s, _) => Ok(s.clone()),
            other => Err(other.pos().error("expected a quoted message")),
        }
    }
    fn format(&self, _: &Symbols) -> String {
        super::lexer::quote(self)
    }
}

/// A loop's condition or body: a nested `graph { ... }`.
impl AttrValue for crate::Region {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<crate::Region, ParseError> {
        match v {
            AttrVal::Graph(g, _) => Ok(crate::Region(g.clone())),
            other => Err(other.pos().error("expected a nested `graph { ... }`")),
        }
    }
    fn format(&self, _: &Symbols) -> String {
        nested_graph(self)
    }
}

impl<T: AttrValue> AttrValue for Vec<T> {
    fn parse(v: &AttrVal, symbols: &Symbols) -> Result<Vec<T>, ParseError> {
        list(v, |x| T::parse(x, symbols))
    }
    fn format(&self, symbols: &Symbols) -> String {
        fmt_list(self, |x| x.format(symbols))
    }
}

/// A fused program has its own list syntax (`text/fused.rs`).
impl AttrValue for Vec<crate::FusedOp> {
    fn parse(v: &AttrVal, _: &Symbols) -> Result<Vec<crate::FusedOp>, ParseError> {
        super::fused::parse_program(v)
    }
    fn format(&self, _: &Symbols) -> String {
        super::fused::format_program(self)
    }
}

/// Leaf enums spelt by their own names (`kiln_isa`'s `code_enum!`).
macro_rules! named_leaf {
    ($( $leaf:ident ),*) => { $(
        impl AttrValue for crate::$leaf {
            fn parse(v: &AttrVal, _: &Symbols) -> Result<crate::$leaf, ParseError> {
                let what = crate::$leaf::ALL.iter().map(|x| x.name()).collect::<Vec<_>>().join(", ");
                match v {
                    AttrVal::Ident(k, p) => crate::$leaf::from_name(k)
                        .ok_or_else(|| p.error(format!("unknown {} `{k}` (one of {what})", stringify!($leaf)))),
                    other => Err(other.pos().error(format!("expected one of {what}"))),
                }
            }
            fn format(&self, _: &Symbols) -> String {
                self.name().to_string()
            }
        }
    )* };
}

named_leaf!(PadMode, ScanKind, LinalgOp);

/// Every text name of an op with the attribute keys it accepts (the op table's).
fn forms() -> &'static HashMap<&'static str, Vec<&'static str>> {
    static FORMS: OnceLock<HashMap<&'static str, Vec<&'static str>>> = OnceLock::new();
    FORMS.get_or_init(|| crate::op::text_forms().into_iter().collect())
}

/// Builds the op called `name` from its attributes.
pub(super) fn build_op(name: &str, mut a: Attrs, symbols: &Symbols) -> Result<Op, ParseError> {
    // Unknown keys first, so that a misspelt key is reported as unknown
    // rather than as the missing key it was meant to be.
    let keys = forms().get(name).map_or(&[][..], Vec::as_slice);
    if let Some((k, _, kpos)) = a.items.iter().find(|(k, _, _)| !keys.contains(&k.as_str())) {
        return Err(kpos.error(format!("unknown attribute `{k}` for `{name}`")));
    }
    let op = match Op::parse_text(name, &mut a, symbols)? {
        Some(op) => op,
        None => parse_custom(name, &mut a, symbols)?,
    };
    a.finish(name)?;
    Ok(op)
}

/// The attributes of `op` in canonical order, as `key=value` texts.
pub(super) fn format_attrs(op: &Op, symbols: &Symbols) -> Vec<String> {
    op.format_text(symbols).unwrap_or_else(|| format_custom(op, symbols))
}

/// The op table's `custom` rows: their values are not one attribute per field.
fn parse_custom(name: &str, a: &mut Attrs, symbols: &Symbols) -> Result<Op, ParseError> {
    let pos = a.op_pos;
    Ok(match name {
        // `reduce` is printed even when absent (`none`).
        "scatter_elements" => Op::ScatterElements {
            axis: uint(&a.take("axis", name)?)?,
            reduce: scatter_reduce(&a.take("reduce", name)?)?,
            include_self: boolean(&a.take("include_self", name)?)?,
        },
        // `act_zero_point` only with `act_scale` (static activations), `bits` a u8.
        "quant_linear" => Op::QuantLinear {
            bits: u8::try_from(uint(&a.take("bits", name)?)?).map_err(|_| pos.error("bits out of range"))?,
            group: uint(&a.take("group", name)?)?,
            zero_points: boolean(&a.take("zero_points", name)?)?,
            dynamic: boolean(&a.take("dynamic", name)?)?,
            asymmetric: a.opt("asymmetric").map(|v| boolean(&v)).transpose()?.unwrap_or(false),
            act_scale: a.opt("act_scale").map(|v| float(&v)).transpose()?,
            act_zero_point: a.opt("act_zero_point").map(|v| int(&v)).transpose()?.unwrap_or(0),
        },
        // The distribution is the name; its parameters are attributes.
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
                shape: Vec::<Dim>::parse(&a.take("shape", name)?, symbols)?,
                stream: u32::try_from(stream).map_err(|_| pos.error(format!("stream {stream} is not a u32")))?,
            }
        }
        _ => return Err(pos.error(format!("unknown op `{name}`"))),
    })
}

fn format_custom(op: &Op, symbols: &Symbols) -> Vec<String> {
    let kv = |k: &str, v: String| format!("{k}={v}");
    match op {
        Op::ScatterElements { axis, reduce, include_self } => vec![
            kv("axis", axis.to_string()),
            kv("reduce", scatter_reduce_name(*reduce).to_string()),
            kv("include_self", include_self.to_string()),
        ],
        Op::QuantLinear { bits, group, zero_points, dynamic, asymmetric, act_scale, act_zero_point } => {
            let mut attrs = vec![
                kv("bits", bits.to_string()),
                kv("group", group.to_string()),
                kv("zero_points", zero_points.to_string()),
                kv("dynamic", dynamic.to_string()),
            ];
            // Written only when set, as the static parameters below.
            if *asymmetric {
                attrs.push(kv("asymmetric", "true".into()));
            }
            // Static activations only: the float programs' text stays as it was.
            if let Some(s) = act_scale {
                attrs.push(kv("act_scale", format_f64(*s)));
                attrs.push(kv("act_zero_point", act_zero_point.to_string()));
            }
            attrs
        }
        Op::Random { dist, dtype, shape, stream } => {
            let mut v = match dist {
                RandomDist::Uniform { low, high } => vec![kv("low", format_f64(*low)), kv("high", format_f64(*high))],
                RandomDist::Normal { mean, std } => vec![kv("mean", format_f64(*mean)), kv("std", format_f64(*std))],
                RandomDist::Int { low, high } => vec![kv("low", fmt_int(*low)), kv("high", fmt_int(*high))],
                RandomDist::Perm => vec![],
            };
            v.extend([
                kv("dtype", dtype.to_string()),
                kv("shape", shape.format(symbols)),
                kv("stream", stream.to_string()),
            ]);
            v
        }
        // Every other row is generated (`Op::format_text`).
        _ => Vec::new(),
    }
}
