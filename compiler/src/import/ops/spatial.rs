//! Padding, flipping, resizing and triangular masks.

use super::shape::normalize_axis;
use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, PadMode, ResizeMode, TensorType, ValueId};

/// torch's pad list (last dim first: `[lo_last, hi_last, lo_prev, hi_prev, ...]`)
/// as per-axis `lo`/`hi` for a rank-`rank` tensor.
fn pads_per_axis(pad: &[i64], rank: usize) -> R<(Vec<i64>, Vec<i64>)> {
    if !pad.len().is_multiple_of(2) || pad.len() / 2 > rank {
        return invalid(format!("pad list {pad:?} for rank {rank}"));
    }
    let (mut lo, mut hi) = (vec![0; rank], vec![0; rank]);
    for (i, pair) in pad.chunks(2).enumerate() {
        lo[rank - 1 - i] = pair[0];
        hi[rank - 1 - i] = pair[1];
    }
    Ok((lo, hi))
}

fn emit_pad(imp: &mut Importer, n: &Node, x: ValueId, pad: &[i64], mode: PadMode, value: f64) -> R<()> {
    let rank = imp.ty(x).rank();
    let (lo, hi) = pads_per_axis(pad, rank)?;
    if mode != PadMode::Constant && (lo.iter().any(|&p| p < 0) || hi.iter().any(|&p| p < 0)) {
        // torch reflects/replicates about the input's original edges and
        // crops afterwards (`pad(arange(6), (-4, 3), "reflect")` is
        // `[4, 5, 4, 3, 2]`), so pad by the positive amounts first, then crop
        // by the negative ones with a constant pad, which crops.
        let grow = |p: &[i64]| p.iter().map(|&v| v.max(0)).collect::<Vec<_>>();
        let crop = |p: &[i64]| p.iter().map(|&v| v.min(0)).collect::<Vec<_>>();
        let (grow_lo, grow_hi) = (grow(&lo), grow(&hi));
        let padded = if grow_lo.iter().chain(&grow_hi).all(|&p| p == 0) {
            x
        } else {
            imp.push(Op::Pad { lo: grow_lo, hi: grow_hi, interior: vec![0; rank], mode, value }, vec![x])?
        };
        let cropped =
            Op::Pad { lo: crop(&lo), hi: crop(&hi), interior: vec![0; rank], mode: PadMode::Constant, value: 0.0 };
        imp.emit(n, cropped, vec![padded])?;
        return Ok(());
    }
    imp.emit(n, Op::Pad { lo, hi, interior: vec![0; rank], mode, value }, vec![x])?;
    Ok(())
}

/// `aten::constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0)`
pub(super) fn constant_pad_nd(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let pad = imp.ints(n, "pad", &[])?;
    let value = imp.opt_scalar(n, "value")?.map_or(0.0, Scalar::as_f64);
    emit_pad(imp, n, x, &pad, PadMode::Constant, value)
}

/// `aten::pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None)`
pub(super) fn pad(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let pad = imp.ints(n, "pad", &[])?;
    let mode = match imp.string(n, "mode", "constant")? {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        "circular" => return circular_pad(imp, n, x, &pad),
        other => return unsupported(format!("pad mode {other:?}")),
    };
    let value = imp.opt_scalar(n, "value")?.map_or(0.0, Scalar::as_f64);
    emit_pad(imp, n, x, &pad, mode, value)
}

/// Circular padding: along each padded dim, output position `i` reads
/// input position `(i - lo) mod size` — wrapping for positive pads,
/// cropping for negative ones (torch allows pads up to the dim's size).
fn circular_pad(imp: &mut Importer, n: &Node, x: ValueId, pad: &[i64]) -> R<()> {
    let rank = imp.ty(x).rank();
    let (lo, hi) = pads_per_axis(pad, rank)?;
    let mut v = x;
    for axis in 0..rank {
        if lo[axis] == 0 && hi[axis] == 0 {
            continue;
        }
        let Some(size) = imp.ty(v).shape[axis].as_const() else {
            return unsupported("circular padding of a dynamic dim");
        };
        let len = size + lo[axis] + hi[axis];
        if size == 0 || lo[axis].abs() > size || hi[axis].abs() > size || len < 0 {
            return invalid(format!("circular padding ({}, {}) of a dim of size {size}", lo[axis], hi[axis]));
        }
        let positions: Vec<i64> = (0..len).map(|i| (i - lo[axis]).rem_euclid(size)).collect();
        let index = super::indexing::i64_const(imp, &[len], &positions);
        v = imp.push(Op::Gather { axis }, vec![v, index])?;
    }
    let out = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
    imp.bind(n, 0, v)
}

/// `aten::reflection_pad{1,2,3}d(Tensor self, SymInt[2|4|6] padding)`, `replication_pad*d` likewise.
pub(super) fn mode_pad(imp: &mut Importer, n: &Node, mode: PadMode) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let pad = imp.ints(n, "padding", &[])?;
    emit_pad(imp, n, x, &pad, mode, 0.0)
}

/// `aten::flip(Tensor self, int[] dims)`
pub(super) fn flip(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let dims = imp.ints(n, "dims", &[])?;
    let mut axes = dims.iter().map(|&d| normalize_axis(d, rank.max(1))).collect::<R<Vec<_>>>()?;
    axes.sort_unstable();
    axes.dedup();
    axes.retain(|&a| a < rank);
    if axes.is_empty() {
        return imp.bind(n, 0, x);
    }
    imp.emit(n, Op::Flip { axes }, vec![x])?;
    Ok(())
}

/// `aten::upsample_nearest{1,2,3}d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors)`,
/// `aten::upsample_nearest2d(Tensor self, SymInt[2] output_size, float? scales_h=None, float? scales_w=None)`,
/// `aten::upsample_{linear1d,bilinear2d,trilinear3d}.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors)`
/// and their `.default` forms with per-dim `scales_*`. Sizes come from the output type.
pub(super) fn upsample(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self").or_else(|_| imp.tensor(n, "input"))?;
    let out = imp.out_ty(n, 0)?;
    let spatial = spatial_rank(name)?;
    if spatial == 0 || out.rank() < spatial {
        return invalid(format!("{name} on rank {}", out.rank()));
    }
    let mode = if name.starts_with("upsample_nearest") {
        ResizeMode::Nearest
    } else if name.contains("linear") {
        ResizeMode::Linear
    } else {
        return unsupported(format!("{name} (area resizing)"));
    };
    let align_corners = imp.bool(n, "align_corners", false)?;
    let scales = scale_args(imp, n, spatial)?;
    let size: Vec<Dim> = out.shape[out.rank() - spatial..].to_vec();
    imp.emit(n, Op::Upsample { mode, align_corners, size, scales }, vec![x])?;
    Ok(())
}

/// The number of resized dims an upsample op's name states (`upsample_bicubic2d` → 2).
pub(super) fn spatial_rank(name: &str) -> R<usize> {
    match name.trim_start_matches('_').trim_start_matches("upsample_").chars().find(|c| c.is_ascii_digit()) {
        Some(d) => Ok(d.to_digit(10).unwrap_or(0) as usize),
        None => invalid(format!("{name}: no spatial rank in the name")),
    }
}

/// An upsample op's scale factors, one per resized dim (0 where torch has
/// none and sizes decide), from `.vec`'s `scale_factors` or the default
/// overload's `scales_*`; empty when there are none at all.
pub(super) fn scale_args(imp: &mut Importer, n: &Node, spatial: usize) -> R<Vec<f64>> {
    let scales: Vec<f64> = match imp.arg(n, "scale_factors") {
        Some(Arg::Floats(v)) => v.clone(),
        Some(other) => return invalid(format!("scale_factors: {other:?}")),
        None => {
            let keys: &[&str] = match spatial {
                1 => &["scales"],
                2 => &["scales_h", "scales_w"],
                _ => &["scales_d", "scales_h", "scales_w"],
            };
            let mut v = Vec::new();
            for k in keys {
                v.push(match imp.arg(n, k) {
                    None => 0.0,
                    Some(_) => imp.float(n, k, None)?,
                });
            }
            if v.iter().all(|&s| s == 0.0) {
                Vec::new()
            } else {
                v
            }
        }
    };
    if let Some(bad) = scales.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
        return invalid(format!("upsampling scale factor {bad}"));
    }
    Ok(if scales.len() == 1 && spatial > 1 { vec![scales[0]; spatial] } else { scales })
}

/// `aten::tril(Tensor self, int diagonal=0)`, `aten::triu(...)`: a `where` over
/// the last two dims with the mask `col - row <= k` (tril) or `>= k` (triu).
/// The `[rows, cols]` mask of the elements `triu`/`tril` keep: `j − i ≥ k`
/// (upper) or `j − i ≤ k` (lower).
pub(super) fn tri_mask(imp: &mut Importer, (rows, cols): (Dim, Dim), upper: bool, k: i64) -> R<ValueId> {
    let ri = imp.push_typed(
        Op::Arange { start: 0.0, step: 1.0, len: rows.clone(), dtype: DType::I64 },
        vec![],
        TensorType::new(DType::I64, vec![rows.clone()]),
    );
    let ri = imp.push_typed(
        Op::Reshape { shape: vec![rows.clone(), Dim::Const(1)] },
        vec![ri],
        TensorType::new(DType::I64, vec![rows, Dim::Const(1)]),
    );
    let ci = imp.push_typed(
        Op::Arange { start: 0.0, step: 1.0, len: cols.clone(), dtype: DType::I64 },
        vec![],
        TensorType::new(DType::I64, vec![cols]),
    );
    let diff = imp.push(Op::Binary(B::Sub), vec![ci, ri])?;
    imp.with_scalar(if upper { B::Ge } else { B::Le }, diff, k as f64)
}

pub(super) fn tri(imp: &mut Importer, n: &Node, upper: bool) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let ty = imp.ty(x).clone();
    let r = ty.rank();
    if r < 2 {
        return invalid("tril/triu need rank >= 2");
    }
    let k = imp.int(n, "diagonal", Some(0))?;
    let mask = tri_mask(imp, (ty.shape[r - 2].clone(), ty.shape[r - 1].clone()), upper, k)?;
    let zero = imp.scalar_const(Scalar::Int(0), ty.dtype);
    let v = imp.push(Op::Where, vec![mask, x, zero])?;
    imp.bind(n, 0, v)
}
