//! Shape buckets: a program with symbolic dimensions compiled ahead of time
//! as one StableHLO executable per padded static size of its symbols
//! (`kiln compile --target pjrt --buckets s77=8,16,32` or `--buckets auto`).
//!
//! At run time the runtime picks the smallest bucket whose sizes are all at
//! least the run's, pads every input with zeros to the bucket's shapes and
//! slices every output back. That is correct exactly when each padded tensor
//! holds the real one in its low corner and nothing real depends on a padded
//! element. [`padding_problem`] proves it op by op on the symbolic graph, and
//! refuses (a compile error naming the op) what it cannot prove:
//!
//! - elementwise ops, broadcasts, permutes, expands, fills and aranges keep
//!   the corner;
//! - a reshape keeps it when a padded dimension is kept, merged with static
//!   dimensions *after* it (it stays the outermost factor), or split into
//!   itself and static ones;
//! - causal attention whose queries and keys have the same padded length
//!   keeps it: a real query reads only earlier keys, all real;
//! - an op that combines elements along an axis (matrix product's
//!   contracting dim, reductions, softmax, norms, other attention keys, concat,
//!   slices, flips, pads, convolutions and pools over a padded axis) is
//!   refused when that axis is padded. Masking them from the true sizes is
//!   not built yet; such programs run on the CPU plan or need a static size.

use kiln_ir::{Dim, Graph, NodeId, Op, SymbolId, ValueId};
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
/// is provably harmless (see the module doc). Inputs must use the symbols
/// as plain dimensions, so that the runtime's padding is the corner.
pub fn padding_problem(g: &Graph) -> Option<String> {
    let check = Padded::new(g);
    for &v in &g.inputs {
        if g.ty(v).shape.iter().any(|d| check.padded(d) && !matches!(d, Dim::Sym(_))) {
            let name = g.values[v].name.clone().unwrap_or_default();
            return Some(format!("input `{name}` has a computed dynamic dimension; buckets pad plain symbols only"));
        }
    }
    g.order.iter().find_map(|&n| check.node(n).map(|why| format!("{} cannot be padded: {why}", g.describe_node(n))))
}

struct Padded<'g> {
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

    fn node(&self, n: NodeId) -> Option<String> {
        let node = &self.g.nodes[n];
        let touches = node.inputs.iter().chain(&node.outputs).any(|&v| self.any_padded(v));
        if !touches {
            return None;
        }
        let x = node.inputs.first().copied();
        let x_axis = |axis: usize| x.is_some_and(|x| self.axis_padded(x, axis));
        let along = |what: &str| Some(format!("it {what} along a padded axis"));
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
            | Op::CumSum { .. } => None,
            Op::MatMul => x.filter(|&a| self.trailing_padded(a, 1)).and_then(|_| along("sums")),
            Op::Linear | Op::LinearFused { .. } | Op::LinearSplit { .. } | Op::QuantLinear { .. } => {
                x.filter(|&a| self.trailing_padded(a, 1)).and_then(|_| along("sums"))
            }
            Op::LayerNorm { normalized_rank, .. } | Op::RmsNorm { normalized_rank, .. } => {
                x.filter(|&a| self.trailing_padded(a, *normalized_rank)).and_then(|_| along("normalizes"))
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => x_axis(*axis).then(|| "softmax over a padded axis".into()),
            Op::Reduce { axes, .. } => axes.iter().any(|&a| x_axis(a)).then(|| "it reduces a padded axis".into()),
            Op::ArgMax { axis, .. } | Op::ArgMin { axis, .. } | Op::Sort { axis, .. } | Op::Scan { axis, .. } => {
                x_axis(*axis).then(|| "it compares or scans along a padded axis".into())
            }
            Op::Attention { causal, .. } => {
                let (Some(&q), Some(&k)) = (node.inputs.first(), node.inputs.get(1)) else { return None };
                let seq = |v: ValueId| self.g.ty(v).shape.get(self.g.ty(v).rank().saturating_sub(2)).cloned();
                let padded_keys = seq(k).is_some_and(|d| self.padded(&d));
                // Causal over one padded length: real query i reads keys
                // j <= i, all real, so the padded keys are masked already.
                let causal_same =
                    *causal && node.inputs.len() == 3 && seq(q).zip(seq(k)).is_some_and(|(a, b)| self.evals(&a) == self.evals(&b));
                if self.trailing_padded(k, 1) {
                    Some("attention with a padded head dim".into())
                } else if padded_keys && !causal_same {
                    Some("attention over padded keys (masking them from the true length is not built yet)".into())
                } else {
                    None
                }
            }
            Op::Reshape { .. } => self.reshape_problem(node.inputs[0], node.outputs[0]),
            Op::Slice { axis, .. } => {
                let full = x.is_some_and(|x| {
                    self.evals(&self.g.ty(x).shape[*axis]) == self.evals(&self.g.ty(node.outputs[0]).shape[*axis])
                });
                (x_axis(*axis) && !full).then(|| "a slice of a padded axis".into())
            }
            Op::Concat { axis } => self.axis_padded(node.outputs[0], *axis).then(|| "concat along a padded axis".into()),
            Op::Gather { axis } => x_axis(*axis).then(|| "it indexes a padded axis".into()),
            Op::Flip { axes } => axes.iter().any(|&a| x_axis(a)).then(|| "it flips a padded axis".into()),
            Op::Pad { lo, hi, .. } => {
                let moved = |a: usize| lo.get(a).is_some_and(|&l| l != 0) || hi.get(a).is_some_and(|&h| h != 0);
                let rank = x.map_or(0, |x| self.g.ty(x).rank());
                (0..rank).any(|a| x_axis(a) && moved(a)).then(|| "it pads a padded axis".into())
            }
            Op::Conv { .. } | Op::ConvFused { .. } | Op::QuantConv { .. } | Op::Pool { .. } | Op::AdaptiveAvgPool { .. } | Op::Upsample { .. } => {
                let rank = x.map_or(0, |x| self.g.ty(x).rank());
                (1..rank).any(x_axis).then(|| "a window over a padded spatial or channel axis".into())
            }
            other => Some(format!("op {} on a padded shape has no padding rule", other.name())),
        }
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
