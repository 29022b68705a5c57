//! Text → graph: a recursive-descent parser over the token list. Every error
//! carries the line and column of the token that caused it.

use super::elements::{encode_element, Literal};
use super::lexer::{lex, Pos, Tok};
use super::ops::{build_op, symbol, AttrVal, Attrs};
use super::ParseError;
use crate::DType;
use crate::{ConstBytes, Dim, Graph, Location, Mesh, MeshAxis, Sharding, TensorType, ValueAttrs, ValueId};
use std::collections::HashMap;

struct Parser {
    toks: Vec<(Tok, Pos)>,
    at: usize,
    g: Graph,
    /// Text label (`%7` → 7) to the value it names.
    values: HashMap<u32, ValueId>,
    /// Every label that has a definition somewhere in the text, to tell
    /// "used before its definition" from "undefined".
    defined_somewhere: HashMap<u32, Pos>,
}

/// One `%N "name"?: type {attrs}?` on the left of a node line.
struct NodeResult {
    label: u32,
    name: Option<String>,
    ty: TensorType,
    attrs: ValueAttrs,
}

pub(super) fn parse_graph(src: &str) -> Result<Graph, ParseError> {
    let toks = lex(src)?;
    let defined_somewhere = definition_sites(&toks);
    let mut p = Parser { toks, at: 0, g: Graph::new(), values: HashMap::new(), defined_somewhere };
    p.graph()?;
    Ok(p.g)
}

/// A `%N` is defined where it is followed by `:` (results, inputs, constants),
/// possibly with a name string in between; operands never are.
fn definition_sites(toks: &[(Tok, Pos)]) -> HashMap<u32, Pos> {
    let mut sites = HashMap::new();
    for (i, (tok, pos)) in toks.iter().enumerate() {
        let Tok::Value(n) = tok else { continue };
        let mut j = i + 1;
        if matches!(toks.get(j), Some((Tok::Str(_), _))) {
            j += 1;
        }
        if matches!(toks.get(j), Some((Tok::Punct(":"), _))) {
            sites.entry(*n).or_insert(*pos);
        }
    }
    sites
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }

    fn pos(&self) -> Pos {
        self.toks[self.at].1
    }

    fn next(&mut self) -> (Tok, Pos) {
        let t = self.toks[self.at].clone();
        // The last token is always `Eof`; stay on it.
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }

    fn error<T>(&self, msg: impl Into<String>) -> Result<T, ParseError> {
        Err(self.pos().error(msg))
    }

    fn expected<T>(&self, what: &str) -> Result<T, ParseError> {
        self.error(format!("expected {what}, found {}", self.peek().describe()))
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        let yes = self.is_punct(p);
        if yes {
            self.next();
        }
        yes
    }

    fn punct(&mut self, p: &str) -> Result<(), ParseError> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            self.expected(&format!("`{p}`"))
        }
    }

    fn is_ident(&self, word: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == word)
    }

    fn keyword(&mut self, word: &str) -> Result<(), ParseError> {
        if self.is_ident(word) {
            self.next();
            Ok(())
        } else {
            self.expected(&format!("`{word}`"))
        }
    }

    fn ident(&mut self, what: &str) -> Result<(String, Pos), ParseError> {
        match self.peek().clone() {
            Tok::Ident(s) => Ok((s, self.next().1)),
            _ => self.expected(what),
        }
    }

    fn int(&mut self) -> Result<i64, ParseError> {
        match self.peek().clone() {
            Tok::Num(s) => match s.parse::<i64>() {
                Ok(v) => {
                    self.next();
                    Ok(v)
                }
                Err(_) => self.error(format!("expected an integer, found `{s}`")),
            },
            _ => self.expected("an integer"),
        }
    }

    fn opt_string(&mut self) -> Option<String> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.next();
                Some(s)
            }
            _ => None,
        }
    }

    fn graph(&mut self) -> Result<(), ParseError> {
        self.graph_body()?;
        match self.peek() {
            Tok::Eof => Ok(()),
            _ => self.expected("end of input after the graph"),
        }
    }

    /// `graph { statements }`, the top-level graph or a nested one.
    fn graph_body(&mut self) -> Result<(), ParseError> {
        self.keyword("graph")?;
        self.punct("{")?;
        while !self.is_punct("}") {
            self.statement()?;
        }
        self.punct("}")
    }

    /// A nested graph (an attribute value): parsed with its own value labels
    /// and arenas, by a parser that borrows this one's tokens.
    fn nested_graph(&mut self) -> Result<Graph, ParseError> {
        let toks = std::mem::take(&mut self.toks);
        let defined_somewhere = std::mem::take(&mut self.defined_somewhere);
        let mut inner = Parser { toks, at: self.at, g: Graph::new(), values: HashMap::new(), defined_somewhere };
        let result = inner.graph_body();
        self.toks = inner.toks;
        self.defined_somewhere = inner.defined_somewhere;
        self.at = inner.at;
        result.map(|()| inner.g)
    }

    fn statement(&mut self) -> Result<(), ParseError> {
        match self.peek().clone() {
            Tok::Ident(k) if k == "sym" => self.sym(),
            Tok::Ident(k) if k == "input" => self.input(),
            Tok::Ident(k) if k == "const" => self.constant(),
            Tok::Ident(k) if k == "output" => self.output(),
            Tok::Ident(k) if k == "state" => self.state(),
            Tok::Ident(k) if k == "mesh" => self.mesh(),
            Tok::Ident(k) if k == "_" => {
                self.next();
                self.node(vec![])
            }
            Tok::Value(_) => {
                let mut results = vec![self.result()?];
                while self.eat_punct(",") {
                    results.push(self.result()?);
                }
                self.node(results)
            }
            _ => self.expected("`sym`, `mesh`, `input`, `const`, `output`, `state`, a `%value` or `}`"),
        }
    }

    fn sym(&mut self) -> Result<(), ParseError> {
        self.keyword("sym")?;
        let (name, pos) = self.ident("a symbol name")?;
        if matches!(name.as_str(), "inf" | "nan" | "true" | "false" | "_") {
            return Err(pos.error(format!("`{name}` is reserved and cannot name a symbol")));
        }
        if self.g.symbol_by_name(&name).is_some() {
            return Err(pos.error(format!("symbol `{name}` is declared twice")));
        }
        self.keyword("in")?;
        self.punct("[")?;
        let min = self.int()?;
        self.punct(",")?;
        let max_pos = self.pos();
        let max = if self.is_ident("inf") {
            self.next();
            None
        } else {
            Some(self.int()?)
        };
        self.punct("]")?;
        if max.is_some_and(|m| m < min) {
            return Err(max_pos.error(format!("symbol `{name}` has an empty range")));
        }
        self.g.add_symbol(name, min, max);
        Ok(())
    }

    /// `%N` at a definition site; it must not be defined yet.
    fn new_label(&mut self) -> Result<(u32, Pos), ParseError> {
        match self.peek().clone() {
            Tok::Value(n) => {
                let pos = self.next().1;
                if self.values.contains_key(&n) {
                    return Err(pos.error(format!("%{n} is defined twice")));
                }
                Ok((n, pos))
            }
            _ => self.expected("a `%value`"),
        }
    }

    fn operand(&mut self) -> Result<ValueId, ParseError> {
        match self.peek().clone() {
            Tok::Value(n) => {
                let pos = self.pos();
                match self.values.get(&n) {
                    Some(&v) => {
                        self.next();
                        Ok(v)
                    }
                    None => {
                        match self.defined_somewhere.get(&n) {
                            Some(def) => Err(pos
                                .error(format!("%{n} is used before its definition (at {}:{})", def.line, def.column))),
                            None => Err(pos.error(format!("undefined value %{n}"))),
                        }
                    }
                }
            }
            _ => self.expected("a `%value`"),
        }
    }

    fn input(&mut self) -> Result<(), ParseError> {
        self.keyword("input")?;
        let (label, _) = self.new_label()?;
        let name = self.opt_string();
        self.punct(":")?;
        let ty = self.ty()?;
        let attrs = self.value_attrs()?;
        let complex = self.opt_complex(ty.dtype)?;
        let v = self.g.add_input(String::new(), ty);
        self.g.values[v].name = name;
        self.g.values[v].attrs = attrs;
        self.values.insert(label, v);
        if complex {
            self.g.complex_inputs.push(self.g.inputs.len() - 1);
        }
        Ok(())
    }

    /// An optional `as c64` / `as c128` after an input's type or an output:
    /// the caller's complex view of an f32/f64 value (see
    /// [`crate::Graph::complex_inputs`]).
    fn opt_complex(&mut self, part: DType) -> Result<bool, ParseError> {
        if !matches!(self.peek(), Tok::Ident(k) if k == "as") {
            return Ok(false);
        }
        self.next();
        let pos = self.pos();
        let (name, _) = self.ident("a complex dtype")?;
        match (DType::from_name(&name), part.complex_of()) {
            (Some(d), Some(c)) if d == c => Ok(true),
            _ => Err(pos.error(format!(
                "`as {name}`: a complex view needs c64 over f32 or c128 over f64 (the value is {part})"
            ))),
        }
    }

    fn constant(&mut self) -> Result<(), ParseError> {
        self.keyword("const")?;
        let (label, _) = self.new_label()?;
        let name = self.opt_string();
        self.punct(":")?;
        let ty_pos = self.pos();
        let ty = self.ty()?;
        let attrs = self.value_attrs()?;
        let Some(shape) = ty.static_shape() else {
            return Err(ty_pos.error("a constant's shape must be static"));
        };
        let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
        let Some(numel) = numel else {
            return Err(ty_pos.error("a constant's shape must be non-negative and fit in memory"));
        };
        self.punct("=")?;
        let bytes = self.elements(ty.dtype, &shape, numel)?;
        let v = self.g.add_const(name, ty, ConstBytes::owned(bytes));
        self.g.values[v].attrs = attrs;
        self.values.insert(label, v);
        Ok(())
    }

    /// `[e0, e1, ...]`: exactly `numel` elements of `dtype` (a value of `shape`).
    fn elements(&mut self, dtype: DType, shape: &[i64], numel: usize) -> Result<Vec<u8>, ParseError> {
        let list_pos = self.pos();
        self.punct("[")?;
        let mut bytes = Vec::with_capacity(numel.saturating_mul(dtype.size_bytes()).min(1 << 20));
        let mut count = 0usize;
        if !self.is_punct("]") {
            loop {
                self.element(dtype, &mut bytes)?;
                count += 1;
                if !self.eat_punct(",") {
                    break;
                }
            }
        }
        self.punct("]")?;
        if count != numel {
            return Err(list_pos.error(format!("constant of shape {shape:?} needs {numel} elements, found {count}")));
        }
        Ok(bytes)
    }

    /// `state "name" input N output M = [initial elements]`: a
    /// [`crate::StateSlot`] pairing input `N` with output `M` (positions;
    /// both must already be declared).
    fn state(&mut self) -> Result<(), ParseError> {
        self.keyword("state")?;
        let pos = self.pos();
        let Some(name) = self.opt_string() else {
            return self.expected("the state's name as a string");
        };
        self.keyword("input")?;
        let input = self.int()?;
        self.keyword("output")?;
        let output = self.int()?;
        let (Some(input), Some(output)) = (
            usize::try_from(input).ok().filter(|&i| i < self.g.inputs.len()),
            usize::try_from(output).ok().filter(|&o| o < self.g.outputs.len()),
        ) else {
            return Err(
                pos.error(format!("state `{name}`: input {input} or output {output} is not declared before it"))
            );
        };
        let ty = self.g.ty(self.g.inputs[input]).clone();
        let Some(shape) = ty.static_shape() else {
            return Err(pos.error(format!("state `{name}`: its input's shape is not static")));
        };
        let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
        let Some(numel) = numel else {
            return Err(pos.error(format!("state `{name}`: its shape must be non-negative and fit in memory")));
        };
        self.punct("=")?;
        let init = ConstBytes::owned(self.elements(ty.dtype, &shape, numel)?);
        self.g.states.push(crate::StateSlot { name, input, output, init });
        Ok(())
    }

    fn element(&mut self, dtype: DType, bytes: &mut Vec<u8>) -> Result<(), ParseError> {
        let pos = self.pos();
        let Some(lit) = self.literal()? else {
            return self.expected("a constant element");
        };
        encode_element(dtype, &lit, bytes).map_err(|m| pos.error(m))
    }

    /// A number, `true`, `false`, `inf`, `-inf`, `nan` or `nan(0xBITS)`; `None`
    /// (nothing consumed) for anything else.
    fn literal(&mut self) -> Result<Option<Literal>, ParseError> {
        let lit = match self.peek().clone() {
            Tok::Num(s) => Literal::Num(s),
            Tok::Ident(s) if s == "true" || s == "false" => Literal::Bool(s == "true"),
            Tok::Ident(s) if s == "inf" => Literal::Inf { negative: false },
            Tok::Punct("-") => {
                self.next();
                if !self.is_ident("inf") {
                    return self.expected("`inf` after `-`");
                }
                Literal::Inf { negative: true }
            }
            Tok::Ident(s) if s == "nan" => {
                self.next();
                if !self.eat_punct("(") {
                    return Ok(Some(Literal::Nan(None)));
                }
                let bits = match self.peek().clone() {
                    Tok::Num(h) => h.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok()),
                    _ => None,
                };
                let Some(bits) = bits else {
                    return self.expected("NaN bits as `0x...`");
                };
                self.next();
                self.punct(")")?;
                return Ok(Some(Literal::Nan(Some(bits))));
            }
            _ => return Ok(None),
        };
        self.next();
        Ok(Some(lit))
    }

    fn output(&mut self) -> Result<(), ParseError> {
        self.keyword("output")?;
        let v = self.operand()?;
        let name = self.opt_string().unwrap_or_default();
        let part = self.g.values.get(v).map_or(DType::F32, |d| d.ty.dtype);
        let complex = self.opt_complex(part)?;
        self.g.add_output(name, v);
        if complex {
            self.g.complex_outputs.push(self.g.outputs.len() - 1);
        }
        Ok(())
    }

    /// `%N "name"?: type {attrs}?` on the left of a node.
    fn result(&mut self) -> Result<NodeResult, ParseError> {
        let (label, _) = self.new_label()?;
        let name = self.opt_string();
        self.punct(":")?;
        let ty = self.ty()?;
        Ok(NodeResult { label, name, ty, attrs: self.value_attrs()? })
    }

    /// A value's attributes after its type, `{origin="fc.weight"}`; empty
    /// when no `{` follows (a node's own attributes come after its op name,
    /// so the brace is never ambiguous).
    fn value_attrs(&mut self) -> Result<ValueAttrs, ParseError> {
        let mut attrs = ValueAttrs::default();
        if !self.eat_punct("{") {
            return Ok(attrs);
        }
        loop {
            let (key, key_pos) = self.ident("a value attribute name")?;
            self.punct("=")?;
            match key.as_str() {
                "origin" => {
                    if attrs.origin.is_some() {
                        return Err(key_pos.error("value attribute `origin` is given twice"));
                    }
                    let value_pos = self.pos();
                    match self.opt_string() {
                        Some(s) if !s.is_empty() => attrs.origin = Some(s),
                        Some(_) => return Err(value_pos.error("value attribute `origin` must not be empty")),
                        None => return self.expected("a string for value attribute `origin`"),
                    }
                }
                "sharding" => {
                    if attrs.sharding.is_some() {
                        return Err(key_pos.error("value attribute `sharding` is given twice"));
                    }
                    attrs.sharding = Some(self.sharding()?);
                }
                _ => return Err(key_pos.error(format!("unknown value attribute `{key}` (known: origin, sharding)"))),
            }
            if !self.eat_punct(",") {
                break;
            }
        }
        self.punct("}")?;
        Ok(attrs)
    }

    /// `[{data}, {}]`, optionally followed by `sum{model}` (partial-sum axes).
    fn sharding(&mut self) -> Result<Sharding, ParseError> {
        let mut sharding = Sharding::default();
        self.punct("[")?;
        while !self.is_punct("]") {
            sharding.dims.push(self.axis_set()?);
            if !self.eat_punct(",") {
                break;
            }
        }
        self.punct("]")?;
        if self.is_ident("sum") {
            self.next();
            sharding.partial = self.axis_set()?;
        }
        Ok(sharding)
    }

    /// `{a, b}`: mesh axis names.
    fn axis_set(&mut self) -> Result<Vec<String>, ParseError> {
        self.punct("{")?;
        let mut axes = Vec::new();
        while !self.is_punct("}") {
            axes.push(self.ident("a mesh axis name")?.0);
            if !self.eat_punct(",") {
                break;
            }
        }
        self.punct("}")?;
        Ok(axes)
    }

    /// `mesh [data=2, model=2]`, optionally `devices [0, 2, 1, 3]`.
    fn mesh(&mut self) -> Result<(), ParseError> {
        let pos = self.pos();
        self.keyword("mesh")?;
        if self.g.mesh.is_some() {
            return Err(pos.error("the graph declares a mesh twice"));
        }
        let mut mesh = Mesh { axes: vec![], devices: vec![] };
        self.punct("[")?;
        while !self.is_punct("]") {
            let (name, _) = self.ident("a mesh axis name")?;
            self.punct("=")?;
            let size_pos = self.pos();
            let size = u32::try_from(self.int()?).map_err(|_| size_pos.error("a mesh axis size is a u32"))?;
            mesh.axes.push(MeshAxis { name, size });
            if !self.eat_punct(",") {
                break;
            }
        }
        self.punct("]")?;
        if self.is_ident("devices") {
            self.next();
            self.punct("[")?;
            while !self.is_punct("]") {
                let id_pos = self.pos();
                mesh.devices.push(u32::try_from(self.int()?).map_err(|_| id_pos.error("a device id is a u32"))?);
                if !self.eat_punct(",") {
                    break;
                }
            }
            self.punct("]")?;
        }
        self.g.mesh = Some(mesh);
        Ok(())
    }

    fn node(&mut self, results: Vec<NodeResult>) -> Result<(), ParseError> {
        // Two results may not share a label either.
        for (i, r) in results.iter().enumerate() {
            let label = r.label;
            if results[..i].iter().any(|other| other.label == label) {
                return self.error(format!("%{label} is defined twice"));
            }
        }
        self.punct("=")?;
        let (name, op_pos) = self.ident("an op name")?;
        let mut attrs = Attrs { items: vec![], op_pos };
        if self.eat_punct("{") {
            if !self.is_punct("}") {
                loop {
                    let (key, key_pos) = self.ident("an attribute name")?;
                    if attrs.items.iter().any(|(k, _, _)| *k == key) {
                        return Err(key_pos.error(format!("attribute `{key}` is given twice")));
                    }
                    self.punct("=")?;
                    let value = self.attr_value()?;
                    attrs.items.push((key, value, key_pos));
                    if !self.eat_punct(",") {
                        break;
                    }
                }
            }
            self.punct("}")?;
        }
        let op = build_op(&name, attrs, &self.g.symbols)?;
        self.punct("(")?;
        let mut inputs = vec![];
        if !self.is_punct(")") {
            loop {
                inputs.push(self.operand()?);
                if !self.eat_punct(",") {
                    break;
                }
            }
        }
        self.punct(")")?;
        let loc = if self.eat_punct("@") {
            let node_name = match self.opt_string() {
                Some(s) => s,
                None => return self.expected("the source node's name as a string after `@`"),
            };
            let stack_trace = self.opt_string();
            Some(self.g.locs.push(Location { node_name, stack_trace }))
        } else {
            None
        };
        let types = results.iter().map(|r| r.ty.clone()).collect();
        let n = self.g.add_node(op, inputs, types, loc);
        for (i, r) in results.into_iter().enumerate() {
            let v = self.g.nodes[n].outputs[i];
            self.g.values[v].name = r.name;
            self.g.values[v].attrs = r.attrs;
            self.values.insert(r.label, v);
        }
        Ok(())
    }

    fn attr_value(&mut self) -> Result<AttrVal, ParseError> {
        let pos = self.pos();
        if let Some(lit) = self.literal()? {
            return Ok(AttrVal::Lit(lit, pos));
        }
        match self.peek().clone() {
            Tok::Ident(s) if s == "graph" && matches!(self.toks.get(self.at + 1), Some((Tok::Punct("{"), _))) => {
                Ok(AttrVal::Graph(Box::new(self.nested_graph()?), pos))
            }
            Tok::Ident(s) => {
                self.next();
                Ok(AttrVal::Ident(s, pos))
            }
            Tok::Str(s) => {
                self.next();
                Ok(AttrVal::Str(s, pos))
            }
            Tok::Punct("(") => Ok(AttrVal::Dim(self.dim()?, pos)),
            Tok::Punct("[") => {
                self.next();
                let mut items = vec![];
                if !self.is_punct("]") {
                    loop {
                        items.push(self.attr_value()?);
                        if !self.eat_punct(",") {
                            break;
                        }
                    }
                }
                self.punct("]")?;
                Ok(AttrVal::List(items, pos))
            }
            _ => self.expected("an attribute value"),
        }
    }

    fn ty(&mut self) -> Result<TensorType, ParseError> {
        let (name, pos) = self.ident("a dtype")?;
        let dtype = DType::from_name(&name).ok_or_else(|| pos.error(format!("unknown dtype `{name}`")))?;
        self.punct("[")?;
        let mut shape = vec![];
        if !self.is_punct("]") {
            loop {
                shape.push(self.dim()?);
                if !self.eat_punct(",") {
                    break;
                }
            }
        }
        self.punct("]")?;
        Ok(TensorType::new(dtype, shape))
    }

    /// A dimension exactly as written: `(a + b)` stays an `Add` node even when
    /// it could fold, so that printing gives back the same text.
    fn dim(&mut self) -> Result<Dim, ParseError> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Num(_) => Ok(Dim::Const(self.int()?)),
            Tok::Ident(name) => {
                self.next();
                Ok(Dim::Sym(symbol(&name, pos, &self.g.symbols)?))
            }
            Tok::Punct("(") => {
                self.next();
                let a = self.dim()?;
                let (op, b) = match self.peek().clone() {
                    Tok::Punct(p @ ("+" | "*" | "//" | "%")) => {
                        self.next();
                        (p, self.dim()?)
                    }
                    // `(a %2)` lexes as `a` then the value `%2`; read it as `a % 2`.
                    Tok::Value(n) => {
                        self.next();
                        ("%", Dim::Const(n as i64))
                    }
                    _ => return self.expected("`+`, `*`, `//` or `%`"),
                };
                let b = Box::new(b);
                self.punct(")")?;
                let a = Box::new(a);
                Ok(match op {
                    "+" => Dim::Add(a, b),
                    "*" => Dim::Mul(a, b),
                    "//" => Dim::FloorDiv(a, b),
                    _ => Dim::Mod(a, b),
                })
            }
            _ => self.expected("a dimension"),
        }
    }
}
