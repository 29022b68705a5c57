//! `aten::histogram.bin_ct(Tensor self, int bins=100, *, float[]? range=None,
//! Tensor? weight=None, bool density=False) -> (Tensor hist, Tensor bin_edges)`
//! and `histogram.bins_tensor` (the edges given as a tensor `bins`, its
//! length static), as torch's CPU kernel (`Histogram.cpp`, `HistogramKernel.cpp`) computes it
//! in the input's dtype: the outer edges from `range` or the data (a point
//! widened by ½ each side), the edges by `linspace`'s formula, each element
//! in the bin whose edges surround it (the top edge in the last bin; outside
//! or NaN: nowhere), weighted, and with `density` divided by the total and
//! by each bin's width. Bins come from comparing against every edge, which
//! is what torch's interpolation plus local edge search finds.

use super::composite::{bin, reshape};
use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, ValueId};

pub(super) fn histogram(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let c = imp.out_ty(n, 0)?.dtype;
    if !matches!(c, DType::F32 | DType::F64) {
        return unsupported(format!("histogram of {c} (torch's CPU kernel takes f32 and f64)"));
    }
    let x = imp.tensor(n, "self")?;
    let x = imp.cast(x, c);
    let total = imp.ty(x).numel();
    let flat = reshape(imp, x, vec![total.clone()])?;
    let (edges, lo, hi, bins) = match overload {
        "bin_ct" => edges_from_count(imp, n, flat)?,
        "bins_tensor" => given_edges(imp, n, c)?,
        other => return unsupported(format!("histogram.{other}")),
    };
    let bin_of = bin_index(imp, flat, edges, bins)?;
    // Only elements in [lo, hi] count (NaN fails both tests).
    let above_lo = bin(imp, B::Ge, flat, lo)?;
    let below_hi = bin(imp, B::Le, flat, hi)?;
    let inside = bin(imp, B::And, above_lo, below_hi)?;
    let amount = match imp.opt_tensor(n, "weight")? {
        Some(w) => {
            let w = imp.cast(w, c);
            reshape(imp, w, vec![total.clone()])?
        }
        None => scalar(imp, 1.0, c),
    };
    let zero = scalar(imp, 0.0, c);
    let amount = imp.push(Op::Where, vec![inside, amount, zero])?;
    let amount = if imp.ty(amount).shape == [total.clone()] {
        amount
    } else {
        imp.push_typed(Op::Expand { shape: vec![total.clone()] }, vec![amount], TensorType::new(c, vec![total]))
    };
    let counts_ty = TensorType::new(c, vec![Dim::Const(bins)]);
    let base = imp.push_typed(Op::Full { value: 0.0, dtype: c, shape: counts_ty.shape.clone() }, vec![], counts_ty);
    let scatter = Op::ScatterElements { axis: 0, reduce: Some(ReduceKind::Sum), include_self: true };
    let mut hist = imp.push(scatter, vec![base, bin_of, amount])?;
    if imp.bool(n, "density", false)? {
        hist = density(imp, hist, edges, bins)?;
    }
    imp.bind(n, 0, hist)?;
    imp.bind(n, 1, edges)
}

/// `bins` equal bins over `range` or the data's range: the edges, the
/// outer two (0-d) and the bin count.
fn edges_from_count(imp: &mut Importer, n: &Node, flat: ValueId) -> R<(ValueId, ValueId, ValueId, i64)> {
    let c = imp.ty(flat).dtype;
    let bins = imp.int(n, "bins", Some(100))?;
    if bins <= 0 {
        return invalid(format!("histogram: bins must be positive, got {bins}"));
    }
    let (lo, hi) = match range(imp, n)? {
        Some((lo, hi)) => {
            let (lo, hi) = widen_point(lo, hi);
            (scalar(imp, lo, c), scalar(imp, hi, c))
        }
        // No data: torch's edges default to 0 and 0, widened.
        None if imp.ty(flat).shape[0].as_const() == Some(0) => (scalar(imp, -0.5, c), scalar(imp, 0.5, c)),
        None => data_range(imp, flat)?,
    };
    let edges = linspace(imp, lo, hi, bins + 1)?;
    Ok((edges, lo, hi, bins))
}

/// The edges given as the 1-d tensor `bins` (torch requires them
/// increasing), with the outer two and the bin count.
fn given_edges(imp: &mut Importer, n: &Node, c: DType) -> R<(ValueId, ValueId, ValueId, i64)> {
    let edges = imp.tensor(n, "bins")?;
    let edges = imp.cast(edges, c);
    let t = imp.ty(edges).clone();
    let Some(count) = t.shape.first().and_then(Dim::as_const).filter(|_| t.rank() == 1) else {
        return unsupported("histogram with edges that are not a 1-d tensor of static length");
    };
    if count < 2 {
        return invalid(format!("histogram: bins needs at least 2 edges, got {count}"));
    }
    let outer = |imp: &mut Importer, at: i64| -> R<ValueId> {
        let e = imp.push(Op::Slice { axis: 0, start: at, end: at + 1, step: 1 }, vec![edges])?;
        reshape(imp, e, vec![])
    };
    let (lo, hi) = (outer(imp, 0)?, outer(imp, count - 1)?);
    Ok((edges, lo, hi, count - 1))
}

fn scalar(imp: &mut Importer, v: f64, dtype: DType) -> ValueId {
    imp.scalar_const(Scalar::Float(v), dtype)
}

/// `range` as given (checked finite and ordered), or None.
fn range(imp: &mut Importer, n: &Node) -> R<Option<(f64, f64)>> {
    let pair = match imp.arg(n, "range") {
        None | Some(Arg::None) => return Ok(None),
        Some(Arg::Floats(v)) => v.clone(),
        Some(Arg::Ints(v)) => v.iter().map(|&i| i as f64).collect(),
        Some(other) => return invalid(format!("histogram: range {other:?}")),
    };
    let [lo, hi] = pair[..] else {
        return invalid(format!("histogram: range needs 2 values, got {}", pair.len()));
    };
    if !(lo.is_finite() && hi.is_finite()) || lo > hi {
        return invalid(format!("histogram: range [{lo}, {hi}] must be finite and ordered"));
    }
    Ok(Some((lo, hi)))
}

/// numpy's rule, which torch follows: an empty range grows by ½ each side.
fn widen_point(lo: f64, hi: f64) -> (f64, f64) {
    if lo == hi {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    }
}

/// The data's minimum and maximum (widened when equal); a run whose range
/// is not finite fails, as torch's does.
fn data_range(imp: &mut Importer, flat: ValueId) -> R<(ValueId, ValueId)> {
    let c = imp.ty(flat).dtype;
    let min = Op::Reduce { kind: ReduceKind::Min, axes: vec![0], keep_dims: false };
    let max = Op::Reduce { kind: ReduceKind::Max, axes: vec![0], keep_dims: false };
    let (l, h) = (imp.push(min, vec![flat])?, imp.push(max, vec![flat])?);
    // `v - v` is zero exactly when `v` is finite.
    let zero = scalar(imp, 0.0, c);
    let mut finite = Vec::with_capacity(2);
    for v in [l, h] {
        let d = bin(imp, B::Sub, v, v)?;
        finite.push(bin(imp, B::Eq, d, zero)?);
    }
    let ok = bin(imp, B::And, finite[0], finite[1])?;
    let message = "torch.histogram: range of the data is not finite".to_string();
    let loc = imp.loc();
    imp.g.add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    let same = bin(imp, B::Eq, l, h)?;
    let (l_wide, h_wide) = (imp.with_scalar(B::Sub, l, 0.5)?, imp.with_scalar(B::Add, h, 0.5)?);
    let l = imp.push(Op::Where, vec![same, l_wide, l])?;
    let h = imp.push(Op::Where, vec![same, h_wide, h])?;
    Ok((l, h))
}

/// torch's CPU `linspace` of `steps` points from the 0-d `lo` to `hi`:
/// `lo + step·i` for the first half, `hi − step·(steps − 1 − i)` for the
/// rest, `step = (hi − lo) / (steps − 1)`, so both ends are exact.
fn linspace(imp: &mut Importer, lo: ValueId, hi: ValueId, steps: i64) -> R<ValueId> {
    let c = imp.ty(lo).dtype;
    let len = Dim::Const(steps);
    let up = imp.push(Op::Arange { start: 0.0, step: 1.0, len: len.clone(), dtype: c }, vec![])?;
    let down = imp.push(Op::Arange { start: (steps - 1) as f64, step: -1.0, len, dtype: c }, vec![])?;
    let width = bin(imp, B::Sub, hi, lo)?;
    let step = imp.with_scalar(B::Div, width, (steps - 1) as f64)?;
    let from_lo = bin(imp, B::Mul, step, up)?;
    let from_lo = bin(imp, B::Add, lo, from_lo)?;
    let from_hi = bin(imp, B::Mul, step, down)?;
    let from_hi = bin(imp, B::Sub, hi, from_hi)?;
    let first_half = imp.with_scalar(B::Lt, up, (steps / 2) as f64)?;
    imp.push(Op::Where, vec![first_half, from_lo, from_hi])
}

/// Each element's bin: how many edges lie at or below it, less one, the
/// top edge folded into the last bin (elements outside are weighted 0, so
/// their clamped bin does not matter).
fn bin_index(imp: &mut Importer, flat: ValueId, edges: ValueId, bins: i64) -> R<ValueId> {
    let total = imp.ty(flat).shape[0].clone();
    let column = reshape(imp, flat, vec![total, Dim::Const(1)])?;
    let row = reshape(imp, edges, vec![Dim::Const(1), Dim::Const(bins + 1)])?;
    let passed = bin(imp, B::Le, row, column)?;
    let passed = imp.cast(passed, DType::I64);
    let count = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![1], keep_dims: false }, vec![passed])?;
    let index = imp.with_scalar(B::Sub, count, 1.0)?;
    imp.push(Op::Clamp { min: Some(0.0), max: Some((bins - 1) as f64) }, vec![index])
}

/// `hist / sum(hist) / (edges[1:] − edges[:-1])`, in torch's order.
fn density(imp: &mut Importer, hist: ValueId, edges: ValueId, bins: i64) -> R<ValueId> {
    let sum = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: false }, vec![hist])?;
    let hist = bin(imp, B::Div, hist, sum)?;
    let upper = imp.push(Op::Slice { axis: 0, start: 1, end: bins + 1, step: 1 }, vec![edges])?;
    let lower = imp.push(Op::Slice { axis: 0, start: 0, end: bins, step: 1 }, vec![edges])?;
    let widths = bin(imp, B::Sub, upper, lower)?;
    bin(imp, B::Div, hist, widths)
}
