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
//! `histogramdd` is the same per axis of its points, counted per cell.

use super::composite::{bin, reshape};
use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, ValueId};

/// One axis of a histogram: its edges, the outer two (0-d) and its bin count.
struct Axis {
    edges: ValueId,
    lo: ValueId,
    hi: ValueId,
    bins: i64,
}

pub(super) fn histogram(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let c = float_dtype(imp, n, "histogram")?;
    let x = imp.tensor(n, "self")?;
    let x = imp.cast(x, c);
    let total = imp.ty(x).numel();
    let flat = reshape(imp, x, vec![total])?;
    let axis = match overload {
        "bin_ct" => {
            let bins = imp.int(n, "bins", Some(100))?;
            let range = ranges(imp, n, 1)?.map(|r| r[0]);
            counted_axis(imp, flat, bins, range)?
        }
        "bins_tensor" => {
            let edges = imp.tensor(n, "bins")?;
            given_axis(imp, edges, c)?
        }
        other => return unsupported(format!("histogram.{other}")),
    };
    let hist = count(imp, n, &[flat], &[&axis])?;
    imp.bind(n, 0, hist)?;
    imp.bind(n, 1, axis.edges)
}

/// `aten::histogramdd(Tensor self, int[] bins, float[]? range=None,
/// Tensor? weight=None, bool density=False) -> (Tensor hist, Tensor[]
/// bin_edges)` (and `.int_bins`, one count for every axis, and
/// `.TensorList_bins`, edges per axis): `self [.., D]` is a list of points
/// in D dimensions; a point counts when every coordinate is inside. Core
/// ATen splits it into `_histogramdd_bin_edges` (the edges only),
/// `_histogramdd_from_bin_cts` (the counts only) and
/// `_histogramdd_from_bin_tensors` (counts over given edges): `name` says
/// which, each computing the edges the same way.
pub(super) fn histogramdd(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let c = imp.ty(x).dtype;
    if !matches!(c, DType::F32 | DType::F64) {
        return unsupported(format!("{name} of {c} (torch's CPU kernel takes f32 and f64)"));
    }
    let shape = imp.ty(x).shape.clone();
    let Some(dims) = shape.last().and_then(Dim::as_const).filter(|&d| d > 0) else {
        return unsupported("histogramdd of points whose dimension is not static and positive");
    };
    let points = imp.ty(x).numel();
    let points = match points.as_const() {
        Some(all) => Dim::Const(all / dims),
        None => return unsupported("histogramdd of a dynamic number of points"),
    };
    let table = reshape(imp, x, vec![points.clone(), Dim::Const(dims)])?;
    let mut columns = Vec::with_capacity(dims as usize);
    for d in 0..dims {
        let col = imp.push(Op::Slice { axis: 1, start: d, end: d + 1, step: 1 }, vec![table])?;
        columns.push(reshape(imp, col, vec![points.clone()])?);
    }
    let mut axes = Vec::with_capacity(dims as usize);
    if overload == "TensorList_bins" || name == "_histogramdd_from_bin_tensors" {
        let edges = imp.tensors(n, "bins")?;
        if edges.len() != dims as usize {
            return invalid(format!("histogramdd: {} edge tensors for {dims}-d points", edges.len()));
        }
        for e in edges {
            axes.push(given_axis(imp, e, c)?);
        }
    } else {
        let counts = match overload {
            "int_bins" => vec![imp.int(n, "bins", None)?; dims as usize],
            _ => imp.ints(n, "bins", &[])?,
        };
        if counts.len() != dims as usize {
            return invalid(format!("histogramdd: {} bin counts for {dims}-d points", counts.len()));
        }
        let ranges = ranges(imp, n, dims as usize)?;
        for (d, (&column, &bins)) in columns.iter().zip(&counts).enumerate() {
            axes.push(counted_axis(imp, column, bins, ranges.as_ref().map(|r| r[d]))?);
        }
    }
    let edges_output = match name {
        "histogramdd" => 1,
        "_histogramdd_bin_edges" => 0,
        _ => usize::MAX,
    };
    if edges_output != 0 {
        let refs: Vec<&Axis> = axes.iter().collect();
        let hist = count(imp, n, &columns, &refs)?;
        imp.bind(n, 0, hist)?;
    }
    if edges_output == usize::MAX {
        return Ok(());
    }
    let names = match n.outputs.get(edges_output) {
        Some(Arg::Tensors(names)) => names.clone(),
        other => return invalid(format!("histogramdd: bin_edges output is {other:?}")),
    };
    for (name, axis) in names.iter().zip(&axes) {
        imp.bind_name(name, axis.edges);
    }
    Ok(())
}

/// The output dtype, which torch's CPU kernel allows as f32 or f64.
fn float_dtype(imp: &mut Importer, n: &Node, what: &str) -> R<DType> {
    let c = imp.out_ty(n, 0)?.dtype;
    if !matches!(c, DType::F32 | DType::F64) {
        return unsupported(format!("{what} of {c} (torch's CPU kernel takes f32 and f64)"));
    }
    Ok(c)
}

/// The (weighted) counts of points over `axes`, `columns[d]` the points'
/// coordinates along axis d, as `[bins_0, bins_1, ..]`; with `density`
/// divided by the total and then by each axis's bin widths.
fn count(imp: &mut Importer, n: &Node, columns: &[ValueId], axes: &[&Axis]) -> R<ValueId> {
    let c = imp.ty(columns[0]).dtype;
    let total = imp.ty(columns[0]).shape[0].clone();
    // Row-major cell index, and whether every coordinate is in [lo, hi]
    // (NaN fails both tests).
    let mut cell: Option<ValueId> = None;
    let mut inside: Option<ValueId> = None;
    for (&column, axis) in columns.iter().zip(axes) {
        let b = bin_index(imp, column, axis.edges, axis.bins)?;
        cell = Some(match cell {
            None => b,
            Some(outer) => {
                let scaled = imp.with_scalar(B::Mul, outer, axis.bins as f64)?;
                bin(imp, B::Add, scaled, b)?
            }
        });
        let above_lo = bin(imp, B::Ge, column, axis.lo)?;
        let below_hi = bin(imp, B::Le, column, axis.hi)?;
        let here = bin(imp, B::And, above_lo, below_hi)?;
        inside = Some(match inside {
            None => here,
            Some(all) => bin(imp, B::And, all, here)?,
        });
    }
    let (Some(cell), Some(inside)) = (cell, inside) else {
        return invalid("histogram over no axes");
    };
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
    let cells: i64 = axes.iter().map(|a| a.bins).product();
    let counts_ty = TensorType::new(c, vec![Dim::Const(cells)]);
    let base = imp.push_typed(Op::Full { value: 0.0, dtype: c, shape: counts_ty.shape.clone() }, vec![], counts_ty);
    let scatter = Op::ScatterElements { axis: 0, reduce: Some(ReduceKind::Sum), include_self: true };
    let hist = imp.push(scatter, vec![base, cell, amount])?;
    let hist = reshape(imp, hist, axes.iter().map(|a| Dim::Const(a.bins)).collect())?;
    if imp.bool(n, "density", false)? {
        return density(imp, hist, axes);
    }
    Ok(hist)
}

/// `bins` equal bins over `range` or the data's range along `column`.
fn counted_axis(imp: &mut Importer, column: ValueId, bins: i64, range: Option<(f64, f64)>) -> R<Axis> {
    let c = imp.ty(column).dtype;
    if bins <= 0 {
        return invalid(format!("histogram: bins must be positive, got {bins}"));
    }
    let (lo, hi) = match range {
        Some((lo, hi)) => {
            let (lo, hi) = widen_point(lo, hi);
            (scalar(imp, lo, c), scalar(imp, hi, c))
        }
        // No data: torch's edges default to 0 and 0, widened.
        None if imp.ty(column).shape[0].as_const() == Some(0) => (scalar(imp, -0.5, c), scalar(imp, 0.5, c)),
        None => data_range(imp, column)?,
    };
    let edges = linspace(imp, lo, hi, bins + 1)?;
    Ok(Axis { edges, lo, hi, bins })
}

/// Edges given as a 1-d tensor (torch requires them increasing).
fn given_axis(imp: &mut Importer, edges: ValueId, c: DType) -> R<Axis> {
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
    Ok(Axis { edges, lo, hi, bins: count - 1 })
}

fn scalar(imp: &mut Importer, v: f64, dtype: DType) -> ValueId {
    imp.scalar_const(Scalar::Float(v), dtype)
}

/// `range` as `axes` (lo, hi) pairs (each checked finite and ordered), or None.
fn ranges(imp: &mut Importer, n: &Node, axes: usize) -> R<Option<Vec<(f64, f64)>>> {
    let flat = match imp.arg(n, "range") {
        None | Some(Arg::None) => return Ok(None),
        Some(Arg::Floats(v)) => v.clone(),
        Some(Arg::Ints(v)) => v.iter().map(|&i| i as f64).collect(),
        Some(other) => return invalid(format!("histogram: range {other:?}")),
    };
    if flat.len() != 2 * axes {
        return invalid(format!("histogram: range needs {} values, got {}", 2 * axes, flat.len()));
    }
    let pairs: Vec<(f64, f64)> = flat.chunks(2).map(|p| (p[0], p[1])).collect();
    for &(lo, hi) in &pairs {
        if !(lo.is_finite() && hi.is_finite()) || lo > hi {
            return invalid(format!("histogram: range [{lo}, {hi}] must be finite and ordered"));
        }
    }
    Ok(Some(pairs))
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

/// `hist / sum(hist)`, then divided by each axis's bin widths
/// `edges[1:] − edges[:-1]` (broadcast along that axis), in torch's order.
fn density(imp: &mut Importer, hist: ValueId, axes: &[&Axis]) -> R<ValueId> {
    let all: Vec<usize> = (0..axes.len()).collect();
    let sum = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: all, keep_dims: false }, vec![hist])?;
    let mut hist = bin(imp, B::Div, hist, sum)?;
    for (d, axis) in axes.iter().enumerate() {
        let bins = axis.bins;
        let upper = imp.push(Op::Slice { axis: 0, start: 1, end: bins + 1, step: 1 }, vec![axis.edges])?;
        let lower = imp.push(Op::Slice { axis: 0, start: 0, end: bins, step: 1 }, vec![axis.edges])?;
        let widths = bin(imp, B::Sub, upper, lower)?;
        let mut shape = vec![Dim::Const(1); axes.len()];
        shape[d] = Dim::Const(bins);
        let widths = reshape(imp, widths, shape)?;
        hist = bin(imp, B::Div, hist, widths)?;
    }
    Ok(hist)
}
