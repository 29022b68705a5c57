//! `segment_reduce`: reductions over consecutive segments of `data` along
//! axis 0, their lengths given by `lengths` (or `offsets`). Each row's
//! segment is the number of segment ends at or before it (one broadcast
//! comparison), and the reduction is one scatter along axis 0 into a
//! `[segments, ..]` buffer holding the reduction's start value: `initial`
//! when given (torch folds it into every segment; an empty segment is
//! `initial` itself), otherwise 0, 1, -inf, +inf; an empty segment's mean
//! without `initial` is 0/0 = NaN, as in torch. The lengths must sum to the
//! rows (checked at run time, as torch does).

use super::activation::compute_dtype;
use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, ValueId};

/// `aten::segment_reduce(Tensor data, str reduce, *, Tensor? lengths=None,
/// Tensor? indices=None, Tensor? offsets=None, int axis=0, bool unsafe=False,
/// Scalar? initial=None)`, with 1-d `lengths` or `offsets` (axis 0).
pub(super) fn segment_reduce(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let kind = match imp.string(n, "reduce", "")? {
        "sum" => ReduceKind::Sum,
        "mean" => ReduceKind::Mean,
        "max" => ReduceKind::Max,
        "min" => ReduceKind::Min,
        "prod" => ReduceKind::Prod,
        other => return invalid(format!("segment_reduce with reduce=`{other}`")),
    };
    if imp.opt_tensor(n, "indices")?.is_some() {
        return unsupported("segment_reduce with indices (torch does not implement them either)");
    }
    let data = imp.tensor(n, "data")?;
    let data = imp.cast(data, c);
    let rank = imp.ty(data).rank();
    if rank == 0 || normalize_axis(imp.int(n, "axis", Some(0))?, rank)? != 0 {
        return unsupported("segment_reduce along an axis other than 0 (batched lengths)");
    }
    let lengths = match (imp.opt_tensor(n, "lengths")?, imp.opt_tensor(n, "offsets")?) {
        (Some(l), _) => imp.cast(l, DType::I64),
        (None, Some(o)) => {
            let o = imp.cast(o, DType::I64);
            let Some(k) = imp.ty(o).shape.first().and_then(Dim::as_const).filter(|_| imp.ty(o).rank() == 1) else {
                return unsupported("segment_reduce with offsets that are not a static 1-d tensor");
            };
            let hi = imp.push(Op::Slice { axis: 0, start: 1, end: k, step: 1 }, vec![o])?;
            let lo = imp.push(Op::Slice { axis: 0, start: 0, end: k - 1, step: 1 }, vec![o])?;
            imp.push(Op::Binary(B::Sub), vec![hi, lo])?
        }
        (None, None) => return invalid("segment_reduce needs lengths or offsets"),
    };
    let segments = match imp.ty(lengths).shape.as_slice() {
        [Dim::Const(s)] => *s,
        _ => return unsupported("segment_reduce with lengths that are not a static 1-d tensor"),
    };
    let rows = imp.ty(data).shape[0].clone();
    check_lengths(imp, lengths, &rows)?;
    // Row r's segment: the number of segment ends <= r.
    let ends = imp.push(Op::CumSum { axis: 0 }, vec![lengths])?;
    let ends = imp.push(Op::Reshape { shape: vec![Dim::Const(1), Dim::Const(segments)] }, vec![ends])?;
    let ty = TensorType::new(DType::I64, vec![rows.clone()]);
    let r = imp.push_typed(Op::Arange { start: 0.0, step: 1.0, len: rows.clone(), dtype: DType::I64 }, vec![], ty);
    let r = imp.push(Op::Reshape { shape: vec![rows.clone(), Dim::Const(1)] }, vec![r])?;
    let ended = imp.push(Op::Binary(B::Le), vec![ends, r])?;
    let ended = imp.cast(ended, DType::I64);
    let segment = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![1], keep_dims: false }, vec![ended])?;
    let data_shape = imp.ty(data).shape.clone();
    let mut along = vec![Dim::Const(1); rank];
    along[0] = rows;
    let index = imp.push(Op::Reshape { shape: along }, vec![segment])?;
    let index = imp.push(Op::Expand { shape: data_shape.clone() }, vec![index])?;
    let initial = imp.opt_scalar(n, "initial")?.map(Scalar::as_f64);
    let start = initial.unwrap_or(match kind {
        ReduceKind::Prod => 1.0,
        ReduceKind::Max => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
        _ => 0.0,
    });
    let mut out_shape = data_shape;
    out_shape[0] = Dim::Const(segments);
    let base_ty = TensorType::new(c, out_shape.clone());
    let base = imp.push_typed(Op::Full { value: start, dtype: c, shape: out_shape.clone() }, vec![], base_ty);
    let scatter_kind = if kind == ReduceKind::Mean { ReduceKind::Sum } else { kind };
    let op = Op::ScatterElements { axis: 0, reduce: Some(scatter_kind), include_self: true };
    let mut v = imp.push(op, vec![base, index, data])?;
    if kind == ReduceKind::Mean {
        v = segment_mean(imp, v, lengths, segments, rank, initial)?;
    }
    let v = imp.cast(v, out.dtype);
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// Sums over lengths; an empty segment is `initial` (NaN without it: 0/0).
fn segment_mean(
    imp: &mut Importer,
    sums: ValueId,
    lengths: ValueId,
    segments: i64,
    rank: usize,
    initial: Option<f64>,
) -> R<ValueId> {
    let dtype = imp.ty(sums).dtype;
    let mut per_row = vec![Dim::Const(1); rank];
    per_row[0] = Dim::Const(segments);
    let counts = imp.push(Op::Reshape { shape: per_row }, vec![lengths])?;
    let counts_f = imp.cast(counts, dtype);
    let mean = imp.push(Op::Binary(B::Div), vec![sums, counts_f])?;
    let Some(initial) = initial else { return Ok(mean) };
    let empty = imp.with_scalar(B::Eq, counts, 0.0)?;
    let k = imp.scalar_const(Scalar::Float(initial), dtype);
    imp.push(Op::Where, vec![empty, k, mean])
}

/// Run-time checks torch makes: no negative length, and the lengths sum to
/// the number of rows.
fn check_lengths(imp: &mut Importer, lengths: ValueId, rows: &Dim) -> R<()> {
    let all = vec![0];
    let low = imp.push(Op::Reduce { kind: ReduceKind::Min, axes: all.clone(), keep_dims: false }, vec![lengths])?;
    let non_negative = imp.with_scalar(B::Ge, low, 0.0)?;
    let total = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: all, keep_dims: false }, vec![lengths])?;
    let Some(rows) = rows.as_const() else {
        return unsupported("segment_reduce over a dynamic number of rows");
    };
    let sums = imp.with_scalar(B::Eq, total, rows as f64)?;
    let ok = imp.push(Op::Binary(B::And), vec![non_negative, sums])?;
    let message = "segment_reduce(): lengths must be non-negative and sum to data.size(axis)".to_string();
    let loc = imp.loc();
    imp.g.add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    Ok(())
}
