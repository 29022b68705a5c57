//! Masking a shape bucket's graph (see [`super::buckets`]): every op that
//! combines elements along a padded axis gets the run's true size of that
//! axis's symbol (a 0-d i64 input of the bucket's executable, one per
//! symbol used, appended after the plan's arguments) and ignores the
//! padding:
//!
//! - `where(iota(axis) < size, x, fill)` replaces an operand's padded
//!   elements by a value that cannot change the real result (the identity
//!   of a reduction, −inf before a softmax or a max, zero on both sides of a
//!   contraction);
//! - a mean over padded axes becomes a sum divided by the true count;
//! - attention over padded keys gets a bool key mask, and-ed with its own
//!   bool mask or turned into −inf in its float one; padded value rows are
//!   zeroed so that a stray inf there never meets a zero weight.
//!
//! Only the bucket graphs are rewritten: the CPU plan keeps the symbolic
//! program, which sees no padding.

use super::buckets::{node_masks, Fill, Masking};
use kiln_ir::builder::infer_one;
use kiln_ir::{BinaryOp, DType, Dim, Graph, NodeId, Op, SymbolId, TensorType, ValueId};
use std::collections::HashMap;

/// Rewrites `bucket` (`g` specialised to one bucket's sizes: same node and
/// value ids) so that its real elements ignore the padding. Returns the
/// symbols whose true sizes became inputs of `bucket`, in input order (the
/// last `len()` inputs). `Err` names an op that cannot be masked.
pub fn mask_padding(g: &Graph, bucket: &mut Graph) -> Result<Vec<SymbolId>, String> {
    let mut m = Masker {
        g: bucket,
        sizes: Vec::new(),
        keeps: HashMap::new(),
        scalars: HashMap::new(),
        renamed: HashMap::new(),
    };
    let order = std::mem::take(&mut m.g.order);
    let mut rewritten = Vec::with_capacity(order.len());
    for &n in &order {
        for input in &mut m.g.nodes[n].inputs {
            *input = m.renamed.get(input).copied().unwrap_or(*input);
        }
        let masks = node_masks(g, n).map_err(|why| format!("{} cannot be padded: {why}", g.describe_node(n)))?;
        // New nodes are appended to the (emptied) schedule: they go before
        // `n`, except what reads its result (a mean's division).
        let after = m.apply(n, &masks)?;
        rewritten.append(&mut m.g.order);
        rewritten.push(n);
        if let Some(v) = after {
            m.divide_mean(v, &masks)?;
            rewritten.append(&mut m.g.order);
        }
    }
    m.g.order = rewritten;
    for out in &mut m.g.outputs {
        *out = m.renamed.get(out).copied().unwrap_or(*out);
    }
    Ok(m.sizes.iter().map(|&(s, _)| s).collect())
}

struct Masker<'g> {
    g: &'g mut Graph,
    /// The true-size input of each symbol used so far, in input order.
    sizes: Vec<(SymbolId, ValueId)>,
    /// `iota < size` along one axis of a given rank (other dims 1), by
    /// symbol, padded size, axis and rank: built once, reused downstream.
    keeps: HashMap<(SymbolId, i64, usize, usize), ValueId>,
    /// Fill constants by dtype and value bits.
    scalars: HashMap<(DType, u64), ValueId>,
    /// Results replaced for the nodes after their producer (a mean's sum by
    /// its division); applied as the schedule is walked.
    renamed: HashMap<ValueId, ValueId>,
}

impl Masker<'_> {
    /// Applies `masks` to node `n`'s operands; returns `n`'s result when it
    /// is a mean that must be divided by the true count afterwards.
    fn apply(&mut self, n: NodeId, masks: &[Masking]) -> Result<Option<ValueId>, String> {
        let mut mean = None;
        for mask in masks {
            match *mask {
                Masking::Fill { operand, axis, symbol, fill } => {
                    let x = self.g.nodes[n].inputs[operand];
                    let filled = self.fill(x, axis, symbol, fill)?;
                    self.g.nodes[n].inputs[operand] = filled;
                }
                Masking::MeanCount { .. } => {
                    if let Op::Reduce { kind, .. } = &mut self.g.nodes[n].op {
                        *kind = kiln_ir::ReduceKind::Sum;
                    }
                    mean = Some(self.g.nodes[n].outputs[0]);
                }
                Masking::Keys { symbol } => self.mask_keys(n, symbol)?,
            }
        }
        Ok(mean)
    }

    /// The 0-d i64 input holding `symbol`'s true size.
    fn size(&mut self, symbol: SymbolId) -> ValueId {
        if let Some(&(_, v)) = self.sizes.iter().find(|(s, _)| *s == symbol) {
            return v;
        }
        let name = format!("{}.true_size", self.g.symbols[symbol].name);
        let v = self.g.add_input(name, TensorType::new(DType::I64, Vec::new()));
        self.sizes.push((symbol, v));
        v
    }

    fn push(&mut self, op: Op, inputs: Vec<ValueId>) -> Result<ValueId, String> {
        let ty = infer_one(self.g, &op, &inputs).map_err(|e| format!("masking the padding (compiler bug): {e}"))?;
        Ok(self.g.push(op, inputs, ty, None))
    }

    /// A 0-d constant, one per dtype and value.
    fn scalar(&mut self, dtype: DType, value: f64) -> ValueId {
        let key = (dtype, value.to_bits());
        if let Some(&v) = self.scalars.get(&key) {
            return v;
        }
        let v = kiln_ir::builder::scalar_const(self.g, dtype, value);
        self.scalars.insert(key, v);
        v
    }

    /// Bool `[1, .., padded, .., 1]` (rank `rank`, `padded` at `axis`): true
    /// below `symbol`'s true size.
    fn keep(&mut self, symbol: SymbolId, padded: i64, axis: usize, rank: usize) -> Result<ValueId, String> {
        if let Some(&v) = self.keeps.get(&(symbol, padded, axis, rank)) {
            return Ok(v);
        }
        // The rank-1 comparison is shared by every shape it is reshaped to.
        let keep = match self.keeps.get(&(symbol, padded, 0, 1)) {
            Some(&k) => k,
            None => {
                let size = self.size(symbol);
                let arange = Op::Arange { start: 0.0, step: 1.0, len: Dim::Const(padded), dtype: DType::I64 };
                let iota = self.push(arange, vec![])?;
                let keep = self.push(Op::Binary(BinaryOp::Lt), vec![iota, size])?;
                self.keeps.insert((symbol, padded, 0, 1), keep);
                keep
            }
        };
        let shape = (0..rank).map(|a| Dim::Const(if a == axis { padded } else { 1 })).collect();
        let keep = if rank == 1 { keep } else { self.push(Op::Reshape { shape }, vec![keep])? };
        self.keeps.insert((symbol, padded, axis, rank), keep);
        Ok(keep)
    }

    /// `x` with its elements at index ≥ `symbol`'s true size along `axis`
    /// replaced by `fill`.
    fn fill(&mut self, x: ValueId, axis: usize, symbol: SymbolId, fill: Fill) -> Result<ValueId, String> {
        let ty = self.g.ty(x).clone();
        let padded = ty.shape.get(axis).and_then(Dim::as_const).ok_or("a masked axis is not static (compiler bug)")?;
        let keep = self.keep(symbol, padded, axis, ty.rank())?;
        let fill = self.scalar(ty.dtype, fill_value(fill, ty.dtype));
        self.push(Op::Where, vec![keep, x, fill])
    }

    /// Node `n` (attention) reads only keys below `symbol`'s true size: its
    /// mask operand becomes (or is combined with) a key mask `[1, S]`, and
    /// its padded value rows are zeroed.
    fn mask_keys(&mut self, n: NodeId, symbol: SymbolId) -> Result<(), String> {
        let inputs = self.g.nodes[n].inputs.clone();
        let s_axis = |g: &Graph, v: ValueId| g.ty(v).rank() - 2;
        let padded = self.g.ty(inputs[1]).shape[s_axis(self.g, inputs[1])]
            .as_const()
            .ok_or("attention keys are not static (compiler bug)")?;
        let keys = self.keep(symbol, padded, 1, 2)?;
        let v_axis = s_axis(self.g, inputs[2]);
        let v = self.fill(inputs[2], v_axis, symbol, Fill::Value(0.0))?;
        let mask = match inputs.get(3) {
            None => keys,
            Some(&m) if self.g.ty(m).dtype == DType::Bool => self.push(Op::Binary(BinaryOp::And), vec![m, keys])?,
            Some(&m) => {
                let neg_inf = self.scalar(self.g.ty(m).dtype, f64::NEG_INFINITY);
                self.push(Op::Where, vec![keys, m, neg_inf])?
            }
        };
        let node = &mut self.g.nodes[n];
        node.inputs[2] = v;
        node.inputs.truncate(3);
        node.inputs.push(mask);
        Ok(())
    }

    /// After a mean turned sum: its result `sum` divided by the true count,
    /// which replaces `sum` everywhere downstream.
    fn divide_mean(&mut self, sum: ValueId, masks: &[Masking]) -> Result<(), String> {
        let Some((symbols, static_count)) = masks.iter().find_map(|m| match m {
            Masking::MeanCount { symbols, static_count } => Some((symbols.clone(), *static_count)),
            _ => None,
        }) else {
            return Ok(());
        };
        let dtype = self.g.ty(sum).dtype;
        let mut count = None;
        for s in symbols {
            let size = self.size(s);
            let size = self.push(Op::Cast { to: dtype }, vec![size])?;
            count = Some(match count {
                None => size,
                Some(c) => self.push(Op::Binary(BinaryOp::Mul), vec![c, size])?,
            });
        }
        let mut count = count.ok_or("a mean with no padded axis (compiler bug)")?;
        if static_count != 1 {
            let k = self.scalar(dtype, static_count as f64);
            count = self.push(Op::Binary(BinaryOp::Mul), vec![count, k])?;
        }
        let mean = self.push(Op::Binary(BinaryOp::Div), vec![sum, count])?;
        self.renamed.insert(sum, mean);
        Ok(())
    }
}

/// The element `fill` stands for in `dtype`.
fn fill_value(fill: Fill, dtype: DType) -> f64 {
    match (fill, dtype.is_float()) {
        (Fill::Value(v), _) => v,
        (Fill::Lowest, true) => f64::NEG_INFINITY,
        (Fill::Highest, true) => f64::INFINITY,
        (Fill::Lowest, false) => int_range(dtype).0,
        (Fill::Highest, false) => int_range(dtype).1,
    }
}

/// The least and greatest values of an integer (or bool) dtype, as f64
/// (`scalar_bytes` saturates i64's bounds, which f64 rounds).
fn int_range(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::I16 => (f64::from(i16::MIN), f64::from(i16::MAX)),
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
        _ => (i64::MIN as f64, i64::MAX as f64),
    }
}
