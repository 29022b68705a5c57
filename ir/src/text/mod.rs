//! The IR's text form: [`print`] and [`parse`], exact inverses on printed text.
//!
//! It is how passes are tested (filetests) and how bugs are reported, so
//! `print(&parse(&print(g))?) == print(g)` byte for byte, for any graph whose
//! printed form parses (see "Limits").
//!
//! ```text
//! graph {
//!   mesh [data=2, model=2]               ; devices to shard over (optional)
//!   sym batch in [1, 64]                 ; symbol with inclusive bounds
//!   sym seq in [1, inf]                  ; `inf`: unbounded above
//!   input %0 "x": f32[batch, 16] {origin="x"}
//!   const %1 "fc.weight": f32[2, 2] {origin="fc.weight"} = [0.1, -2.5, nan, -inf]
//!   const %2: i64[] = [7]                ; name optional; `[]` shape is a scalar
//!   %3: f32[batch, 2] = linear(%0, %1)
//!   %4 "h": f32[batch, 2] = gelu(%3) @"gelu_1" "File \"m.py\", line 12, in forward"
//!   %5: f32[(batch + 1), 2] = slice{axis=0, start=0, end=max, step=1}(%4)
//!   %6: f32[batch, 1], %7: f32[batch, 1] = ...   ; several results
//!   _ = ...                                      ; no result
//!   output %4 "out"
//!   state "count" input 0 output 0 = [0.0]     ; a buffer kept between runs (see below)
//! }
//! ```
//!
//! * **Statements**: `sym`, `input`, `const`, node lines, `output` and `state`, in any
//!   order as long as symbols and values are defined before use. Line breaks
//!   are not significant; `;` starts a comment that runs to the end of the line.
//! * **Canonical printing**: symbols (arena order), inputs, constants (arena
//!   order), live nodes in [`Graph::order`], outputs. Values are renamed
//!   `%0, %1, ...` in that order; symbols are printed by name. Parsing accepts
//!   any labels (`%17` need not follow `%3`) and builds arenas in text order.
//! * **States** ([`crate::StateSlot`]): `state "name" input N output M =
//!   [initial elements]` pairs input position `N` with output position `M`;
//!   printed last, after the outputs.
//! * **Names**: a string after a value's label is its source name
//!   ([`crate::ValueData::name`]); after an output, the output name.
//! * **Value attributes** ([`crate::ValueAttrs`]): `{key="value", ...}` after a
//!   value's type, printed only when one is set (keys in a fixed order;
//!   `origin`, a non-empty string; `sharding=[{data}, {}]`, per dimension the
//!   mesh axes it is split over, then `sum{model}` for partial-sum axes).
//!   Unknown keys are an error.
//! * **Mesh** ([`crate::Mesh`]): `mesh [name=size, ...]`, then `devices [ids]`
//!   when the device order is not the identity; printed first.
//! * **Types**: `dtype[d0, d1, ...]`. A dim is an integer, a symbol name, or a
//!   parenthesised binary expression `(a + b)`, `(a * b)`, `(a // b)`, `(a % b)`
//!   exactly as [`crate::Dim`] displays it; expressions are kept as written (not
//!   folded), so they print back unchanged.
//! * **Nodes**: `results = op{key=value, ...}(operands) @"node" "trace"`. The
//!   braces are omitted when the op has no attributes; the location (the torch
//!   node name, then optionally its stack trace) is optional. Attribute values:
//!   integers (`max` = `i64::MAX`), floats (shortest round-trip decimal, `inf`,
//!   `-inf`, `nan`, `nan(0xBITS)`), `true`/`false`, dtypes, dims, and `[...]`
//!   lists of those. Each op's names and attribute keys come from the op
//!   table (`crate::op`, [`crate::op_text_forms`]). Attributes print in a
//!   fixed order per op (its fields' order); `clamp`'s
//!   `min`/`max`, `attention`'s `scale` and the pools' `divisor` are omitted
//!   when absent.
//!
//!   | op | attributes |
//!   |----|------------|
//!   | unary (`relu`, `gelu`, ...), binary (`add`, `eq`, ...), `where`, `matmul`, `linear` | none |
//!   | `cast` | `to` |
//!   | `fused` | `program`: `[[op, args..], ..]`, registers by number (`[scalar, f32, 2.0]`, `[mul, 0, 2]`, `[clamp, 3, none, 6.0]`) |
//!   | `clamp` | `min`?, `max`? |
//!   | `conv` | `stride`, `padding`, `dilation`, `groups` |
//!   | `batch_norm` | `eps` |
//!   | `layer_norm`, `rms_norm` | `normalized_rank`, `eps` |
//!   | `softmax`, `log_softmax`, `concat`, `gather` | `axis` |
//!   | `reduce_{sum,mean,max,min,prod}` | `axes`, `keep_dims` |
//!   | `argmax` | `axis`, `keep_dims` |
//!   | `max_pool`, `max_pool_indices`, `avg_pool` | `kernel`, `stride`, `padding`, `dilation`, `ceil_mode`, `count_include_pad`, `divisor`? |
//!   | `adaptive_avg_pool` | `output` |
//!   | `attention` | `causal`, `scale`? |
//!   | `reshape`, `expand` | `shape` (dims) |
//!   | `permute` | `perm` |
//!   | `slice` | `axis`, `start`, `end`, `step` |
//!   | `full` | `value`, `dtype`, `shape` |
//!   | `arange` | `start`, `step`, `len` (dim), `dtype` |
//!   | `while` | `carried`, `cond` (graph), `body` (graph) |
//!
//!   A graph-valued attribute is a whole nested `graph { ... }` (its own
//!   symbol lines, a copy of the parent's, then its own labels from `%0`),
//!   printed one level deeper than the node holding it:
//!
//!   ```text
//!   %3: i64[], %4: f32[2] = while{carried=2, cond=graph {
//!     input %0: i64[]
//!     ...
//!   }, body=graph {
//!     ...
//!   }}(%0, %1, %2)
//!   ```
//!
//! * **Constants**: every element, row-major, decoded from the little-endian
//!   bytes. Floats as for attributes (f16/bf16 use the shortest decimal that
//!   rounds back to the same bits, read through `f32`); integers in decimal;
//!   bools `true`/`false`. The shape must be static and the element count must
//!   equal its product.
//! * **Strings**: `"..."` with escapes `\" \\ \n \t \r \0 \u{hex}`.
//!
//! Limits: unused [`crate::Location`]s are not printed, and nodes sharing a
//! location get one each on parse; dead nodes (absent from `order`) are not
//! printed. Graphs that break invariants still print (undefined operands as
//! `%v12`), but such text may not parse. Symbol names must be identifiers other
//! than `inf`, `nan`, `true`, `false`.

mod elements;
mod fused;
mod lexer;
mod ops;
mod parse;
mod print;

pub(crate) use ops::{attr_keys, put_attr, take_attr, Attrs};

use crate::Graph;
use std::fmt;

/// A syntax or reference error in graph text, at a 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for ParseError {}

/// The canonical text of `g`.
pub fn print(g: &Graph) -> String {
    print::print_graph(g, None)
}

/// Like [`print`], but constants with more than `max_const_elems` elements show
/// only their first ones and a count. For dumps and logs; the result does not parse.
pub fn print_elided(g: &Graph, max_const_elems: usize) -> String {
    print::print_graph(g, Some(max_const_elems))
}

/// Parses graph text (see the module doc for the syntax).
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    parse::parse_graph(src)
}

/// The text of a type, `f32[batch, 16]`, with `g`'s symbol names.
pub fn format_type(g: &Graph, ty: &crate::TensorType) -> String {
    print::format_type(g, ty)
}
