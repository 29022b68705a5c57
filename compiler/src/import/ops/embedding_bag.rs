//! `embedding_bag` (training IR), `_embedding_bag` and
//! `_embedding_bag_forward_only` (Core ATen), and `embedding_renorm`, the
//! `max_norm` renormalisation of the weight that `F.embedding` and
//! `F.embedding_bag` run first.
//!
//! The arithmetic is that of torch's CPU kernels, which reduced-precision
//! programs see bit for bit (checked against torch on thousands of random
//! bags):
//! - sum and mean accumulate in f32 for f16/bf16 (in the dtype otherwise),
//!   each row multiplied by its per-sample weight first, and round once;
//!   mean then divides the rounded sum by the bag size converted to the
//!   dtype (`output /= bag_size`), rounding again.
//! - torch's fast path (sum or mean, f32/f16/bf16, no padding row) runs
//!   fbgemm, whose bf16 output rounds half away from zero and which, under
//!   `include_last_offset`, ignores indices past the last offset; the other
//!   path rounds to nearest even and adds those indices to the last bag.
//! - max is exact.

use super::indexing::{bind_as_output, expand, int_index, only_first_output_used, reshape};
use crate::import::importer::{invalid, unsupported, Importer, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp, DType, Dim, Op, ReduceKind, TensorType, UnaryOp, ValueId};

/// `aten::_embedding_bag(Tensor weight, Tensor indices, Tensor offsets,
///   bool scale_grad_by_freq=False, int mode=0, bool sparse=False,
///   Tensor? per_sample_weights=None, bool include_last_offset=False,
///   int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor)`, also
/// `_embedding_bag_forward_only` and the training IR's
/// `embedding_bag.padding_idx(.., int? padding_idx)` / `embedding_bag.default`.
///
/// Rows are gathered, row `i` goes to slot `#{b : offsets[b] <= i}` of a
/// `[offsets + 1, D]` scatter-reduce (without the zeros it starts from, so
/// empty bags stay 0); slot 0 collects padding rows (and rows before the
/// first offset) and is dropped. Outputs 1..3 must be unused.
pub(super) fn embedding_bag(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let w = imp.tensor(n, "weight")?;
    let indices = imp.tensor(n, "indices")?;
    let offsets = imp.tensor(n, "offsets")?;
    let mode = imp.int(n, "mode", Some(0))?;
    let psw = imp.opt_tensor(n, "per_sample_weights")?;
    let include_last = imp.bool(n, "include_last_offset", false)?;
    only_first_output_used(imp, n)?;
    let reduce = match mode {
        0 => ReduceKind::Sum,
        1 => ReduceKind::Mean,
        2 => ReduceKind::Max,
        m => return invalid(format!("embedding_bag mode {m}")),
    };
    if psw.is_some() && reduce != ReduceKind::Sum {
        return invalid("embedding_bag: per_sample_weights need mode 'sum'");
    }
    if imp.ty(indices).rank() != 1 || imp.ty(offsets).rank() != 1 || imp.ty(w).rank() != 2 {
        return unsupported("embedding_bag with other than 1-d indices and offsets");
    }
    let wty = imp.ty(w).clone();
    let dtype = wty.dtype;
    if !dtype.is_float() {
        return unsupported(format!("embedding_bag of dtype {dtype}"));
    }
    let padding_idx = padding_row(imp, n, name, &wty.shape[0])?;
    let fast_path = padding_idx.is_none() && reduce != ReduceKind::Max && dtype != DType::F64;
    let acc = match (reduce, dtype) {
        (ReduceKind::Max, d) => d,
        (_, DType::F16 | DType::BF16) => DType::F32,
        (_, d) => d,
    };
    let idx = int_index(imp, indices, "embedding_bag indices")?;
    let offs = int_index(imp, offsets, "embedding_bag offsets")?;
    let count = imp.ty(idx).shape[0].clone();
    let boundaries = imp.ty(offs).shape[0].clone();
    let bags = if include_last {
        let Some(len) = boundaries.as_const() else {
            return unsupported("include_last_offset with a dynamic number of offsets");
        };
        Some((len - 1).max(0))
    } else {
        None
    };

    let rows = imp.push(Op::Gather { axis: 0 }, vec![w, idx])?;
    let mut rows = imp.cast(rows, acc);
    if let Some(p) = psw {
        let p = imp.cast(p, acc);
        let p = reshape(imp, p, vec![count.clone(), Dim::Const(1)]);
        rows = imp.push(Op::Binary(BinaryOp::Mul), vec![rows, p])?;
    }
    let positions = imp.push_typed(
        Op::Arange { start: 0.0, step: 1.0, len: count.clone(), dtype: DType::I64 },
        Vec::new(),
        TensorType::new(DType::I64, vec![count.clone()]),
    );
    let positions = reshape(imp, positions, vec![count.clone(), Dim::Const(1)]);
    let offs_row = reshape(imp, offs, vec![Dim::Const(1), boundaries.clone()]);
    let started = imp.push(Op::Binary(BinaryOp::Ge), vec![positions, offs_row])?;
    let started = imp.cast(started, DType::I64);
    let mut slot = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![1], keep_dims: false }, vec![started])?;
    if let Some(p) = padding_idx {
        let is_pad = imp.with_scalar(BinaryOp::Eq, idx, p as f64)?;
        let zero = imp.scalar_const(crate::import::importer::Scalar::Int(0), DType::I64);
        slot = imp.push(Op::Where, vec![is_pad, zero, slot])?;
    }
    let slot = reshape(imp, slot, vec![count.clone(), Dim::Const(1)]);
    // Under include_last_offset, slot `offsets` holds the indices past the
    // last offset: dropped by fbgemm's sums, in the last bag everywhere else
    // (bag sizes included).
    let (kept, end, slot_merged) = match bags {
        Some(bags) => (Dim::Const(bags), bags + 1, imp.with_scalar(BinaryOp::Min, slot, bags as f64)?),
        None => (boundaries.clone(), i64::MAX, slot),
    };
    let slots = Dim::add(boundaries, Dim::Const(1));
    let per_slot = |imp: &mut Importer, slot: ValueId, kind: ReduceKind, values: ValueId| -> R<ValueId> {
        let ty = imp.ty(values).clone();
        let width = ty.shape[1].clone();
        let index = expand(imp, slot, vec![count.clone(), width.clone()]);
        let zeros = imp.push_typed(
            Op::Full { value: 0.0, dtype: ty.dtype, shape: vec![slots.clone(), width.clone()] },
            Vec::new(),
            TensorType::new(ty.dtype, vec![slots.clone(), width.clone()]),
        );
        let reduced = imp.push(
            Op::ScatterElements { axis: 0, reduce: Some(kind), include_self: false },
            vec![zeros, index, values],
        )?;
        let out = TensorType::new(ty.dtype, vec![kept.clone(), width]);
        Ok(imp.push_typed(Op::Slice { axis: 0, start: 1, end, step: 1 }, vec![reduced], out))
    };
    if reduce == ReduceKind::Max {
        let v = per_slot(imp, slot_merged, ReduceKind::Max, rows)?;
        return bind_as_output(imp, n, v);
    }
    let sums = per_slot(imp, if fast_path { slot } else { slot_merged }, ReduceKind::Sum, rows)?;
    let mut v =
        if dtype == DType::BF16 && fast_path { round_bf16_ties_away(imp, sums)? } else { imp.cast(sums, dtype) };
    if reduce == ReduceKind::Mean {
        // Bag sizes in i64 (padding rows not counted), at least 1, then
        // converted to the dtype as torch does before dividing.
        let ones = imp.push_typed(
            Op::Full { value: 1.0, dtype: DType::I64, shape: vec![count.clone(), Dim::Const(1)] },
            Vec::new(),
            TensorType::new(DType::I64, vec![count.clone(), Dim::Const(1)]),
        );
        let sizes = per_slot(imp, slot_merged, ReduceKind::Sum, ones)?;
        let sizes = imp.with_scalar(BinaryOp::Max, sizes, 1.0)?;
        let sizes = imp.cast(sizes, dtype);
        v = imp.push(Op::Binary(BinaryOp::Div), vec![v, sizes])?;
    }
    bind_as_output(imp, n, v)
}

/// The padding row, if any. The training IR's `embedding_bag.padding_idx`
/// takes Python's `padding_idx` (`None` for none, a negative one counting
/// from the end); `_embedding_bag*` take it wrapped, a negative one meaning none.
fn padding_row(imp: &mut Importer, n: &Node, name: &str, rows: &Dim) -> R<Option<i64>> {
    let Some(p) = imp.opt_int(n, "padding_idx")? else { return Ok(None) };
    if p >= 0 {
        return Ok(Some(p));
    }
    if name != "embedding_bag" {
        return Ok(None);
    }
    match rows.as_const() {
        Some(r) if p >= -r => Ok(Some(p + r)),
        Some(r) => invalid(format!("embedding_bag padding_idx {p} for {r} rows")),
        None => unsupported("embedding_bag with a negative padding_idx and a dynamic number of rows"),
    }
}

/// f32 → bf16 rounding half away from zero, as fbgemm's bf16 output does
/// (`(bits + 0x8000) >> 16`), with float ops. `near` is the nearest-even
/// bf16 value; `x - near` is exact (Sterbenz), so when `x` lies halfway,
/// `x + (x - near)` is exactly the other neighbour, a bf16 value, and the
/// one of larger magnitude wins. Off a tie that sum lies strictly between two
/// bf16 values (or is NaN, past the largest one), so the test fails.
/// Checked against the bit formula on millions of f32 values, ties included.
fn round_bf16_ties_away(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let near = imp.cast(x, DType::BF16);
    let near_f32 = imp.cast(near, DType::F32);
    let diff = imp.push(Op::Binary(BinaryOp::Sub), vec![x, near_f32])?;
    let other = imp.push(Op::Binary(BinaryOp::Add), vec![x, diff])?;
    let other_bf16 = imp.cast(other, DType::BF16);
    let other_back = imp.cast(other_bf16, DType::F32);
    let tie = imp.push(Op::Binary(BinaryOp::Eq), vec![other_back, other])?;
    let other_abs = imp.push(Op::Unary(UnaryOp::Abs), vec![other])?;
    let near_abs = imp.push(Op::Unary(UnaryOp::Abs), vec![near_f32])?;
    let larger = imp.push(Op::Binary(BinaryOp::Gt), vec![other_abs, near_abs])?;
    let away = imp.push(Op::Binary(BinaryOp::And), vec![tie, larger])?;
    imp.push(Op::Where, vec![away, other_bf16, near])
}

/// `aten::embedding_renorm(Tensor self, Tensor indices, float max_norm,
///   float norm_type) -> Tensor` (Core ATen; the training IR's in-place
/// `embedding_renorm_` comes here functionalised): every row referenced by
/// `indices` whose `norm_type`-norm exceeds `max_norm` is scaled by
/// `max_norm / (norm + 1e-7)`. As torch: the norm is computed in f32 for
/// f16/bf16 and rounded to the dtype, the scale in f64 from it and rounded
/// to the dtype, and the row multiplied by it.
pub(super) fn embedding_renorm(imp: &mut Importer, n: &Node) -> R<()> {
    let w = imp.tensor(n, "self")?;
    let indices = imp.tensor(n, "indices")?;
    let max_norm = imp.float(n, "max_norm", None)?;
    let p = imp.float(n, "norm_type", None)?;
    let wty = imp.ty(w).clone();
    let dtype = wty.dtype;
    if wty.rank() != 2 {
        return invalid("embedding_renorm: the weight must be 2-d");
    }
    if !dtype.is_float() {
        return unsupported(format!("embedding_renorm of dtype {dtype}"));
    }
    let opmath = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let x = imp.cast(w, opmath);

    let norm = row_norm(imp, x, p)?;
    let norm = imp.cast(norm, dtype);
    let norm = imp.cast(norm, DType::F64);
    let too_long = imp.with_scalar(BinaryOp::Gt, norm, max_norm)?;
    let denom = imp.with_scalar(BinaryOp::Add, norm, 1e-7)?;
    let max = imp.scalar_const(crate::import::importer::Scalar::Float(max_norm), DType::F64);
    let scale = imp.push(Op::Binary(BinaryOp::Div), vec![max, denom])?;
    // `row *= scale` converts the scale to the row's dtype first; the
    // product of two f16/bf16 values is exact in f32 and rounded once.
    let scale = imp.cast(scale, dtype);
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![w, scale])?;

    // Which rows the indices reference: ones scattered onto zeros.
    let idx = int_index(imp, indices, "embedding_renorm indices")?;
    let total = imp.ty(idx).numel();
    let idx = reshape(imp, idx, vec![total.clone()]);
    let rows = wty.shape[0].clone();
    let zeros = imp.push_typed(
        Op::Full { value: 0.0, dtype: DType::I64, shape: vec![rows.clone()] },
        Vec::new(),
        TensorType::new(DType::I64, vec![rows.clone()]),
    );
    let ones = imp.push_typed(
        Op::Full { value: 1.0, dtype: DType::I64, shape: vec![total.clone()] },
        Vec::new(),
        TensorType::new(DType::I64, vec![total]),
    );
    let hits = imp.push(Op::ScatterElements { axis: 0, reduce: None, include_self: true }, vec![zeros, idx, ones])?;
    let referenced = imp.with_scalar(BinaryOp::Gt, hits, 0.0)?;
    let referenced = reshape(imp, referenced, vec![rows, Dim::Const(1)]);
    let renorm = imp.push(Op::Binary(BinaryOp::And), vec![referenced, too_long])?;
    let v = imp.push(Op::Where, vec![renorm, scaled, w])?;
    bind_as_output(imp, n, v)
}

/// `[V, D] -> [V, 1]`: each row's `p`-norm (torch's `Tensor.norm(p)`).
fn row_norm(imp: &mut Importer, x: ValueId, p: f64) -> R<ValueId> {
    let sum =
        |imp: &mut Importer, v| imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![1], keep_dims: true }, vec![v]);
    let abs = imp.push(Op::Unary(UnaryOp::Abs), vec![x])?;
    if p.is_infinite() {
        let kind = if p > 0.0 { ReduceKind::Max } else { ReduceKind::Min };
        return imp.push(Op::Reduce { kind, axes: vec![1], keep_dims: true }, vec![abs]);
    }
    if p == 0.0 {
        let nonzero = imp.with_scalar(BinaryOp::Ne, x, 0.0)?;
        let dtype = imp.ty(x).dtype;
        let nonzero = imp.cast(nonzero, dtype);
        return sum(imp, nonzero);
    }
    if p == 1.0 {
        return sum(imp, abs);
    }
    if p == 2.0 {
        let sq = imp.push(Op::Binary(BinaryOp::Mul), vec![x, x])?;
        let s = sum(imp, sq)?;
        return imp.push(Op::Unary(UnaryOp::Sqrt), vec![s]);
    }
    let powered = imp.with_scalar(BinaryOp::Pow, abs, p)?;
    let s = sum(imp, powered)?;
    imp.with_scalar(BinaryOp::Pow, s, 1.0 / p)
}
