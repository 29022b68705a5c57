//! Shape buckets: a program with symbolic dimensions compiled ahead of time
//! as one StableHLO executable per padded static size of its symbols
//! (`kiln compile --target pjrt --buckets s77=8,16,32` or `--buckets auto`).
//!
//! At run time the runtime picks the smallest bucket whose sizes are all at
//! least the run's, pads every input with zeros to the bucket's shapes,
//! passes the run's true sizes as scalar arguments and slices every output
//! back. That is correct exactly when each padded tensor holds the real one
//! in its low corner and nothing real depends on a padded element.
//! [`padding_problem`] proves it op by op on the symbolic graph, and refuses
//! (a compile error naming the op) what it cannot prove:
//!
//! - elementwise ops, broadcasts, permutes, expands, fills and aranges keep
//!   the corner;
//! - a reshape keeps it when a padded dimension is kept, merged with static
//!   dimensions *after* it (it stays the outermost factor), or split into
//!   itself and static ones;
//! - causal attention whose queries and keys have the same padded length
//!   keeps it: a real query reads only earlier keys, all real (its values'
//!   padded rows are zeroed all the same: 0·inf would be NaN);
//! - an op that combines elements along a padded axis whose size is exactly
//!   a symbol is *masked* ([`Masking`], applied to each bucket's graph by
//!   [`super::masks::mask_padding`]): reductions (the identity fills the
//!   padding; a mean divides by the true count), softmax and log-softmax
//!   (−inf), argmax/argmin (a value that never wins), matrix products
//!   contracting it (zeros in both operands: 0·inf would be NaN) and
//!   non-causal attention over padded keys (the keys masked, combined with
//!   the op's own mask);
//! - what is not masked is refused when it combines along a padded axis:
//!   norms over one, concat, slices, flips, pads, gathers, sorts, scans,
//!   convolutions and pools, causal attention over keys padded to another
//!   length, and every axis of a computed size (`2·s`); such programs run on
//!   the CPU plan or need a static size.

use kiln_ir::{DType, Dim, Graph, NodeId, Op, ReduceKind, SymbolId, ValueId};
use std::collections::HashMap;

/// Most sizes `--buckets auto` gives one symbol (powers of two from its
/// lower bound; sizes past the last run on the CPU plan).
pub const AUTO_MAX_SIZES: usize = 8;
/// Most buckets one program may have (the product of its symbols' sizes):
/// each is compiled at session start.
pub const MAX_BUCKETS: usize = 64;

/// `--buckets`: explicit sizes per symbol (by the names `kiln inspect`
/// prints: torch's `s77`), or `auto`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketSpec {
    Auto,
    Sizes(Vec<(String, Vec<i64>)>),
}

impl BucketSpec {
    /// Parses `auto` or `NAME=SIZE,SIZE,...[;NAME=...]`.
    pub fn parse(text: &str) -> Result<BucketSpec, String> {
        if text.trim() == "auto" {
            return Ok(BucketSpec::Auto);
        }
        let mut out = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, sizes) = part
                .split_once('=')
                .ok_or_else(|| format!("--buckets: `{part}` is not NAME=SIZE,SIZE,... (or `auto`)"))?;
            let sizes = sizes
                .split(',')
                .map(|s| {
                    s.trim().parse::<i64>().ok().filter(|&v| v > 0).ok_or_else(|| {
                        format!("--buckets: size `{}` of `{}` is not a positive integer", s.trim(), name.trim())
                    })
                })
                .collect::<Result<Vec<i64>, String>>()?;
            out.push((name.trim().to_string(), sizes));
        }
        if out.is_empty() {
            return Err("--buckets: no sizes given".into());
        }
        Ok(BucketSpec::Sizes(out))
    }
}

/// The sizes each bucket binds, one map per bucket (every symbol of `g`).
pub fn bucket_sizes(g: &Graph, spec: &BucketSpec) -> Result<Vec<HashMap<SymbolId, i64>>, String> {
    let data_dependent = g.data_dependent_symbols();
    if let Some(s) = data_dependent.first() {
        return Err(format!(
            "--buckets: `{}` is decided by run-time data (nonzero, item): shape buckets need every size known from the inputs",
            g.symbols[*s].name
        ));
    }
    let mut per_symbol: Vec<(SymbolId, Vec<i64>)> = Vec::new();
    match spec {
        BucketSpec::Auto => {
            for (id, sym) in g.symbols.iter() {
                per_symbol.push((id, auto_sizes(sym.min, sym.max)));
            }
        }
        BucketSpec::Sizes(given) => {
            for (name, sizes) in given {
                let id = g.symbol_by_name(name).ok_or_else(|| {
                    let known: Vec<&str> = g.symbols.iter().map(|(_, s)| s.name.as_str()).collect();
                    format!("--buckets: the program has no symbol `{name}` (its symbols: {})", known.join(", "))
                })?;
                let sym = &g.symbols[id];
                if let Some(&bad) = sizes.iter().find(|&&v| v < sym.min || sym.max.is_some_and(|m| v > m)) {
                    return Err(format!(
                        "--buckets: size {bad} of `{name}` is outside its range [{}, {}]",
                        sym.min,
                        sym.max.map_or("inf".to_string(), |m| m.to_string())
                    ));
                }
                let mut sizes = sizes.clone();
                sizes.sort_unstable();
                sizes.dedup();
                per_symbol.push((id, sizes));
            }
            for (id, sym) in g.symbols.iter() {
                if !per_symbol.iter().any(|(s, _)| *s == id) {
                    return Err(format!("--buckets: no sizes for `{}` (give every symbol sizes, or `auto`)", sym.name));
                }
            }
        }
    }
    if per_symbol.is_empty() {
        return Err("--buckets: the program has no dynamic dimension".into());
    }
    let count = per_symbol.iter().fold(1usize, |n, (_, s)| n.saturating_mul(s.len()));
    if count > MAX_BUCKETS {
        return Err(format!("--buckets: {count} buckets (at most {MAX_BUCKETS}); give fewer sizes"));
    }
    // The cartesian product, first symbol slowest.
    let mut buckets = vec![HashMap::new()];
    for (id, sizes) in &per_symbol {
        buckets = buckets
            .into_iter()
            .flat_map(|b| {
                sizes.iter().map(move |&v| {
                    let mut b = b.clone();
                    b.insert(*id, v);
                    b
                })
            })
            .collect();
    }
    Ok(buckets)
}

/// Powers of two from the smallest ≥ `min` (at least 1), at most
/// [`AUTO_MAX_SIZES`], the last one clipped to `max` so that every size in
/// range fits when the range is small enough.
pub fn auto_sizes(min: i64, max: Option<i64>) -> Vec<i64> {
    let mut p = (min.max(1) as u64).checked_next_power_of_two().and_then(|p| i64::try_from(p).ok()).unwrap_or(i64::MAX);
    let mut out = Vec::new();
    while out.len() < AUTO_MAX_SIZES {
        match max {
            Some(m) if p >= m => {
                out.push(m);
                break;
            }
            _ => out.push(p),
        }
        match p.checked_mul(2) {
            Some(next) => p = next,
            None => break,
        }
    }
    out
}

/// A copy of `g` with every symbol replaced by its size in `sizes` (value
/// types and the ops' shape parameters, loop regions included).
pub fn specialize(g: &Graph, sizes: &HashMap<SymbolId, i64>) -> Graph {
    let mut s = g.clone();
    specialize_in_place(&mut s, sizes);
    s
}

fn specialize_in_place(g: &mut Graph, sizes: &HashMap<SymbolId, i64>) {
    let fix = |d: &mut Dim| {
        if !d.is_static() {
            *d = Dim::Const(d.eval(&|s| sizes.get(&s).copied().unwrap_or(0)));
        }
    };
    for (_, v) in g.values.iter_mut() {
        v.ty.shape.iter_mut().for_each(fix);
    }
    for (_, n) in g.nodes.iter_mut() {
        match &mut n.op {
            Op::Reshape { shape } | Op::Expand { shape } | Op::Full { shape, .. } | Op::Random { shape, .. } => {
                shape.iter_mut().for_each(fix)
            }
            Op::Upsample { size, .. } => size.iter_mut().for_each(fix),
            Op::Arange { len, .. } => fix(len),
            Op::Sort { k, .. } => fix(k),
            Op::While { cond, body, .. } => {
                specialize_in_place(&mut cond.0, sizes);
                specialize_in_place(&mut body.0, sizes);
            }
            _ => {}
        }
    }
}

/// Why zero padding of the bucketed symbols could change what `g` computes
/// for its real elements, naming the first op at fault; `None` when padding
/// is harmless once the ops [`node_masks`] lists are masked (see the module
/// doc). Inputs must use the symbols as plain dimensions, so that the
/// runtime's padding is the corner.
pub fn padding_problem(g: &Graph) -> Option<String> {
    let check = Padded::new(g);
    for &v in &g.inputs {
        if g.ty(v).shape.iter().any(|d| check.padded(d) && !matches!(d, Dim::Sym(_))) {
            let name = g.values[v].name.clone().unwrap_or_default();
            return Some(format!("input `{name}` has a computed dynamic dimension; buckets pad plain symbols only"));
        }
    }
    g.order
        .iter()
        .find_map(|&n| check.node(n).err().map(|why| format!("{} cannot be padded: {why}", g.describe_node(n))))
}

/// The masks node `n` of `g` needs to ignore the padding (empty when it
/// needs none); `Err` when padding would change it and it cannot be masked.
pub fn node_masks(g: &Graph, n: NodeId) -> Result<Vec<Masking>, String> {
    Padded::new(g).node(n)
}

/// What a padded element along `axis` becomes before an op combines it:
/// a value that leaves the real elements' result as it is.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Fill {
    /// The value itself (0 for sums and products' padding, 1 for products).
    Value(f64),
    /// −inf for floats, the dtype's least value otherwise (max, argmax,
    /// softmax).
    Lowest,
    /// +inf for floats, the dtype's greatest value otherwise (min, argmin).
    Highest,
}

/// One change that makes an op ignore the padding of one symbol.
#[derive(Clone, Debug, PartialEq)]
pub enum Masking {
    /// Operand `operand`'s elements at index ≥ the true size of `symbol`
    /// along `axis` are replaced by `fill`.
    Fill { operand: usize, axis: usize, symbol: SymbolId, fill: Fill },
    /// A mean over padded axes: the reduction becomes a sum (its operand
    /// filled with zeros by a [`Masking::Fill`]) divided by the true element
    /// count, the product of `symbols`' true sizes and `static_count`.
    MeanCount { symbols: Vec<SymbolId>, static_count: i64 },
    /// Attention keys (and values) at index ≥ the true size of `symbol`
    /// are masked out: a bool mask over the keys joins the op's own.
    Keys { symbol: SymbolId },
}

pub(crate) struct Padded<'g> {
    g: &'g Graph,
    /// Two assignments of distinct primes to the symbols: dimension
    /// expressions equal under both are taken as equal.
    probes: [HashMap<SymbolId, i64>; 2],
}

const PRIMES: [[i64; 8]; 2] =
    [[1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049], [2003, 2011, 2017, 2027, 2029, 2039, 2053, 2063]];

impl<'g> Padded<'g> {
    fn new(g: &'g Graph) -> Padded<'g> {
        let probe = |k: usize| {
            g.symbols.iter().enumerate().map(|(i, (id, _))| (id, PRIMES[k][i % 8] + 16 * (i / 8) as i64)).collect()
        };
        Padded { g, probes: [probe(0), probe(1)] }
    }

    fn padded(&self, d: &Dim) -> bool {
        !d.is_static()
    }

    fn evals(&self, d: &Dim) -> [i128; 2] {
        let e = |k: usize| i128::from(d.eval(&|s| self.probes[k].get(&s).copied().unwrap_or(1)));
        [e(0), e(1)]
    }

    fn axis_padded(&self, v: ValueId, axis: usize) -> bool {
        self.g.ty(v).shape.get(axis).is_some_and(|d| self.padded(d))
    }

    fn any_padded(&self, v: ValueId) -> bool {
        self.g.ty(v).shape.iter().any(|d| self.padded(d))
    }

    /// The last `k` axes of `v`, padded or not.
    fn trailing_padded(&self, v: ValueId, k: usize) -> bool {
        let s = &self.g.ty(v).shape;
        s[s.len().saturating_sub(k)..].iter().any(|d| self.padded(d))
    }

    /// The symbol whose true size bounds axis `axis` of `v`, when that axis
    /// is padded; `Err` when its size is an expression (`2·s`, `s + 1`):
    /// the true extent is then not one scalar the runtime passes.
    fn mask_symbol(&self, v: ValueId, axis: usize, what: &str) -> Result<Option<SymbolId>, String> {
        match self.g.ty(v).shape.get(axis) {
            Some(Dim::Sym(s)) => Ok(Some(*s)),
            Some(d) if self.padded(d) => {
                Err(format!("it {what} along a padded axis of computed size {}", d.display(&self.g.symbols)))
            }
            _ => Ok(None),
        }
    }

    /// A fill of operand `operand`'s axis `axis` when it is padded.
    fn fill(&self, n: NodeId, operand: usize, axis: usize, fill: Fill, what: &str) -> Result<Vec<Masking>, String> {
        let Some(&v) = self.g.nodes[n].inputs.get(operand) else { return Ok(vec![]) };
        Ok(self
            .mask_symbol(v, axis, what)?
            .map(|symbol| Masking::Fill { operand, axis, symbol, fill })
            .into_iter()
            .collect())
    }

    fn node(&self, n: NodeId) -> Result<Vec<Masking>, String> {
        let node = &self.g.nodes[n];
        let touches = node.inputs.iter().chain(&node.outputs).any(|&v| self.any_padded(v));
        if !touches {
            return Ok(vec![]);
        }
        let x = node.inputs.first().copied();
        let x_axis = |axis: usize| x.is_some_and(|x| self.axis_padded(x, axis));
        let refuse = |why: &str| -> Result<Vec<Masking>, String> { Err(why.to_string()) };
        let safe: Result<Vec<Masking>, String> = Ok(vec![]);
        let is_float = x.is_some_and(|x| self.g.ty(x).dtype.is_float());
        match &node.op {
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Fused { .. }
            | Op::BatchNorm { .. }
            | Op::Permute { .. }
            | Op::Expand { .. }
            | Op::Full { .. }
            | Op::Arange { .. }
            // A forward scan: element i reads elements 0..=i only.
            | Op::CumSum { .. } => safe,
            // Both sides of the contraction are zeroed: a padded element
            // may be anything (inf, NaN) and 0·inf is NaN.
            Op::MatMul => {
                let (Some(&a), Some(&b)) = (node.inputs.first(), node.inputs.get(1)) else { return safe };
                let ra = self.g.ty(a).rank();
                let rb = self.g.ty(b).rank();
                let mut masks = self.fill(n, 0, ra.saturating_sub(1), Fill::Value(0.0), "sums")?;
                masks.extend(self.fill(n, 1, rb.saturating_sub(2), Fill::Value(0.0), "sums")?);
                Ok(masks)
            }
            Op::Linear => {
                let (Some(&a), Some(&w)) = (node.inputs.first(), node.inputs.get(1)) else { return safe };
                let mut masks = self.fill(n, 0, self.g.ty(a).rank().saturating_sub(1), Fill::Value(0.0), "sums")?;
                masks.extend(self.fill(n, 1, self.g.ty(w).rank().saturating_sub(1), Fill::Value(0.0), "sums")?);
                Ok(masks)
            }
            Op::LinearFused { .. } | Op::LinearSplit { .. } | Op::QuantLinear { .. } => {
                match x.filter(|&a| self.trailing_padded(a, 1)) {
                    Some(_) => refuse("it sums along a padded axis"),
                    None => safe,
                }
            }
            Op::LayerNorm { normalized_rank, .. } | Op::RmsNorm { normalized_rank, .. } => {
                match x.filter(|&a| self.trailing_padded(a, *normalized_rank)) {
                    Some(_) => refuse("it normalizes along a padded axis (norms are not masked)"),
                    None => safe,
                }
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } if x_axis(*axis) => {
                if !is_float {
                    return refuse("softmax over a padded axis of integers");
                }
                // A real row always holds a real element, so its max is finite.
                self.fill(n, 0, *axis, Fill::Lowest, "normalizes")
            }
            Op::Softmax { .. } | Op::LogSoftmax { .. } => safe,
            Op::Reduce { kind, axes, .. } => self.reduce(n, *kind, axes),
            Op::ArgMax { axis, .. } if x_axis(*axis) => self.fill(n, 0, *axis, Fill::Lowest, "compares"),
            Op::ArgMin { axis, .. } if x_axis(*axis) => self.fill(n, 0, *axis, Fill::Highest, "compares"),
            Op::ArgMax { .. } | Op::ArgMin { .. } => safe,
            Op::Sort { axis, .. } | Op::Scan { axis, .. } => {
                if x_axis(*axis) { refuse("it compares or scans along a padded axis") } else { safe }
            }
            Op::Attention { causal, .. } => self.attention(n, *causal),
            Op::Reshape { .. } => self.reshape_problem(node.inputs[0], node.outputs[0]).map_or(safe, Err),
            Op::Slice { axis, .. } => {
                let full = x.is_some_and(|x| {
                    self.evals(&self.g.ty(x).shape[*axis]) == self.evals(&self.g.ty(node.outputs[0]).shape[*axis])
                });
                if x_axis(*axis) && !full { refuse("a slice of a padded axis") } else { safe }
            }
            Op::Concat { axis } => {
                if self.axis_padded(node.outputs[0], *axis) { refuse("concat along a padded axis") } else { safe }
            }
            Op::Gather { axis } => if x_axis(*axis) { refuse("it indexes a padded axis") } else { safe },
            Op::Flip { axes } => if axes.iter().any(|&a| x_axis(a)) { refuse("it flips a padded axis") } else { safe },
            Op::Pad { lo, hi, .. } => {
                let moved = |a: usize| lo.get(a).is_some_and(|&l| l != 0) || hi.get(a).is_some_and(|&h| h != 0);
                let rank = x.map_or(0, |x| self.g.ty(x).rank());
                if (0..rank).any(|a| x_axis(a) && moved(a)) { refuse("it pads a padded axis") } else { safe }
            }
            Op::Conv { .. } | Op::ConvFused { .. } | Op::QuantConv { .. } | Op::Pool { .. } | Op::AdaptiveAvgPool { .. } | Op::Upsample { .. } => {
                let rank = x.map_or(0, |x| self.g.ty(x).rank());
                if (1..rank).any(x_axis) { refuse("a window over a padded spatial or channel axis") } else { safe }
            }
            other => Err(format!("op {} on a padded shape has no padding rule", other.name())),
        }
    }

    /// A reduction over padded axes: the identity fills them; a mean sums and
    /// divides by the true count.
    fn reduce(&self, n: NodeId, kind: ReduceKind, axes: &[usize]) -> Result<Vec<Masking>, String> {
        let Some(&x) = self.g.nodes[n].inputs.first() else { return Ok(vec![]) };
        let fill = match kind {
            ReduceKind::Sum | ReduceKind::Mean => Fill::Value(0.0),
            ReduceKind::Prod => Fill::Value(1.0),
            ReduceKind::Max => Fill::Lowest,
            ReduceKind::Min => Fill::Highest,
        };
        let mut masks = Vec::new();
        let (mut symbols, mut static_count) = (Vec::new(), 1i64);
        for &axis in axes {
            let found = self.fill(n, 0, axis, fill, "reduces")?;
            match found.first() {
                Some(Masking::Fill { symbol, .. }) => symbols.push(*symbol),
                _ => {
                    let d = self.g.ty(x).shape.get(axis).and_then(Dim::as_const).unwrap_or(1);
                    static_count = static_count.saturating_mul(d);
                }
            }
            masks.extend(found);
        }
        if kind == ReduceKind::Mean && !symbols.is_empty() {
            if !self.g.ty(x).dtype.is_float() {
                return Err("a mean of integers over a padded axis".into());
            }
            masks.push(Masking::MeanCount { symbols, static_count });
        }
        Ok(masks)
    }

    /// Attention: a padded head dim is refused; padded keys are masked
    /// unless the op is causal over one padded length (a real query `i`
    /// reads keys `j <= i`, all real). Causal attention over keys padded to
    /// another length is refused (its queries are not the keys' rows).
    fn attention(&self, n: NodeId, causal: bool) -> Result<Vec<Masking>, String> {
        let node = &self.g.nodes[n];
        let (Some(&q), Some(&k), Some(&v)) = (node.inputs.first(), node.inputs.get(1), node.inputs.get(2)) else {
            return Ok(vec![]);
        };
        let seq_axis = |v: ValueId| self.g.ty(v).rank().saturating_sub(2);
        let seq = |v: ValueId| self.g.ty(v).shape.get(seq_axis(v)).cloned();
        if self.trailing_padded(k, 1) || self.trailing_padded(v, 1) {
            return Err("attention with a padded head dim".into());
        }
        if !seq(k).is_some_and(|d| self.padded(&d)) {
            return Ok(vec![]);
        }
        let causal_same = causal
            && node.inputs.len() == 3
            && seq(q).zip(seq(k)).is_some_and(|(a, b)| self.evals(&a) == self.evals(&b));
        if causal_same {
            // The padded keys are masked already; their value rows are
            // zeroed all the same, so that a non-finite one (padding run
            // through a log, say) never meets a zero weight (0·inf = NaN).
            // (A length of computed size has no one true size: left as is.)
            return Ok(self.fill(n, 2, seq_axis(v), Fill::Value(0.0), "attends").unwrap_or_default());
        }
        if causal {
            return Err("causal attention over keys padded to another length than its queries".into());
        }
        let Some(symbol) = self.mask_symbol(k, seq_axis(k), "attends")? else { return Ok(vec![]) };
        if seq(v) != Some(Dim::Sym(symbol)) {
            return Err("attention whose keys and values have different padded lengths".into());
        }
        if node
            .inputs
            .get(3)
            .is_some_and(|&m| !matches!(self.g.ty(m).dtype, DType::Bool) && !self.g.ty(m).dtype.is_float())
        {
            return Err("attention with a mask that is neither bool nor float".into());
        }
        Ok(vec![Masking::Keys { symbol }])
    }

    /// A reshape keeps the corner when every padded input dimension is kept,
    /// merged with the static dimensions right after it, or split into a
    /// padded outer dimension and static inner ones (size-1 dims ignored).
    fn reshape_problem(&self, input: ValueId, output: ValueId) -> Option<String> {
        let dims = |v: ValueId| -> Vec<Dim> {
            self.g.ty(v).shape.iter().filter(|d| d.as_const() != Some(1)).cloned().collect()
        };
        let (ins, outs) = (dims(input), dims(output));
        let refuse = || Some("a reshape that moves a padded dimension inside another".to_string());
        let (mut i, mut j) = (0, 0);
        let mul = |a: [i128; 2], b: [i128; 2]| [a[0].saturating_mul(b[0]), a[1].saturating_mul(b[1])];
        while i < ins.len() && j < outs.len() {
            let (a, b) = (self.evals(&ins[i]), self.evals(&outs[j]));
            if a == b {
                if self.padded(&ins[i]) != self.padded(&outs[j]) {
                    return refuse();
                }
                i += 1;
                j += 1;
                continue;
            }
            // Grow the smaller side with the static dims that follow it.
            let (mut acc_in, mut acc_out, mut ni, mut nj) = (a, b, i + 1, j + 1);
            while acc_in != acc_out {
                if acc_in[0] < acc_out[0] {
                    match ins.get(ni) {
                        Some(d) if !self.padded(d) => acc_in = mul(acc_in, self.evals(d)),
                        _ => return refuse(),
                    }
                    ni += 1;
                } else {
                    match outs.get(nj) {
                        Some(d) if !self.padded(d) => acc_out = mul(acc_out, self.evals(d)),
                        _ => return refuse(),
                    }
                    nj += 1;
                }
            }
            // The group's first dims lead it; a padded dim must lead on both sides.
            if self.padded(&ins[i]) != self.padded(&outs[j]) {
                return refuse();
            }
            i = ni;
            j = nj;
        }
        if i != ins.len() || j != outs.len() {
            return refuse();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_sizes_cover_the_range() {
        assert_eq!(auto_sizes(1, Some(64)), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(auto_sizes(2, Some(12)), vec![2, 4, 8, 12]);
        assert_eq!(auto_sizes(3, None), vec![4, 8, 16, 32, 64, 128, 256, 512]);
        assert_eq!(auto_sizes(0, Some(1)), vec![1]);
    }

    #[test]
    fn parses_specs() {
        assert_eq!(BucketSpec::parse("auto"), Ok(BucketSpec::Auto));
        assert_eq!(
            BucketSpec::parse("s0=8,16; s1=4"),
            Ok(BucketSpec::Sizes(vec![("s0".into(), vec![8, 16]), ("s1".into(), vec![4])]))
        );
        assert!(BucketSpec::parse("s0=8,x").is_err());
        assert!(BucketSpec::parse("s0").is_err());
        assert!(BucketSpec::parse("s0=0").is_err());
    }
}
