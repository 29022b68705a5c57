//! Resizing modes the IR's `Upsample` lacks: nearest-exact
//! (`_upsample_nearest_exact{1,2,3}d`) and bicubic (`upsample_bicubic2d`).
//! Which input positions an output position reads, and with what weights,
//! depends only on the sizes, so both are decomposed at import into
//! `Gather`s at index constants (and, for bicubic, products with weight
//! constants) computed here with the arithmetic of torch's CPU kernels
//! (`UpSampleKernel.cpp`): the same scale, source index, rounding and
//! opmath type. The resized dims must be static.

use super::indexing::i64_const;
use super::spatial::{scale_args, spatial_rank};
use crate::import::importer::{invalid, table_len, unsupported, Importer, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, ConstBytes, DType, Op, TensorType, ValueId};

/// The opmath type of torch's index and weight computations: f64 for f64
/// inputs, f32 otherwise.
trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn of(v: f64) -> Self;
    fn get(self) -> f64;
}

impl Real for f32 {
    fn of(v: f64) -> f32 {
        v as f32
    }
    fn get(self) -> f64 {
        self as f64
    }
}

impl Real for f64 {
    fn of(v: f64) -> f64 {
        v
    }
    fn get(self) -> f64 {
        self
    }
}

/// torch's `area_pixel_compute_scale`: input pixels per output pixel.
/// `scale` is the caller's scale factor (0 when absent).
fn pixel_scale<T: Real>(input: i64, output: i64, align_corners: bool, scale: f64) -> T {
    if align_corners {
        return if output > 1 { T::of((input - 1) as f64) / T::of((output - 1) as f64) } else { T::of(0.0) };
    }
    if scale > 0.0 {
        T::of(1.0 / scale)
    } else {
        T::of(input as f64) / T::of(output as f64)
    }
}

/// torch's `area_pixel_compute_source_index`: the input coordinate of output
/// pixel `i`; `cubic` keeps negative coordinates (others clamp them to 0).
fn source_index<T: Real>(scale: T, i: i64, align_corners: bool, cubic: bool) -> T {
    if align_corners {
        return scale * T::of(i as f64);
    }
    let src = scale * (T::of(i as f64) + T::of(0.5)) - T::of(0.5);
    if !cubic && src < T::of(0.0) {
        T::of(0.0)
    } else {
        src
    }
}

/// `floorf` of a coordinate (torch floors in f32 even for f64's opmath).
fn floorf<T: Real>(v: T) -> i64 {
    (v.get() as f32).floor() as i64
}

/// One resized dim: its axis and its input and output sizes.
struct ResizedDim {
    axis: usize,
    input: i64,
    output: i64,
    /// The scale factor the caller gave (0 when sizes decide).
    scale: f64,
}

/// The resized dims of an upsample node (the trailing `spatial_rank(name)`
/// dims), which must be static, with their scale factors.
fn resized_dims(imp: &mut Importer, n: &Node, name: &str, x: ValueId) -> R<Vec<ResizedDim>> {
    let spatial = spatial_rank(name)?;
    let out = imp.out_ty(n, 0)?;
    let rank = imp.ty(x).rank();
    if spatial == 0 || rank != spatial + 2 || out.rank() != rank {
        return invalid(format!("{name} on a rank-{rank} input"));
    }
    let scales = scale_args(imp, n, spatial)?;
    let mut dims = Vec::with_capacity(spatial);
    for s in 0..spatial {
        let axis = rank - spatial + s;
        let (Some(input), Some(output)) = (imp.ty(x).shape[axis].as_const(), out.shape[axis].as_const()) else {
            return unsupported(format!(
                "{name} with a dynamic spatial size (the sampling positions are computed at compile time)"
            ));
        };
        table_len(&format!("{name}'s sampling positions"), &[output])?;
        dims.push(ResizedDim { axis, input, output, scale: scales.get(s).copied().unwrap_or(0.0) });
    }
    Ok(dims)
}

fn gather(imp: &mut Importer, v: ValueId, axis: usize, index: &[i64]) -> R<ValueId> {
    let idx = i64_const(imp, &[index.len() as i64], index);
    imp.push(Op::Gather { axis }, vec![v, idx])
}

/// `aten::_upsample_nearest_exact{1,2,3}d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors)`
/// and the default overloads `(Tensor self, SymInt[k] output_size, float? scales_*=None)`:
/// output pixel `i` reads input `min(floor(scale (i + 0.5) - 0.5 + 0.5), in - 1)`
/// (torch's `HelperInterpNearestExact`; the coordinate clamped at 0 first).
/// Any dtype: it only moves elements.
pub(super) fn nearest_exact(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self").or_else(|_| imp.tensor(n, "input"))?;
    let f64_math = imp.ty(x).dtype == DType::F64;
    let mut v = x;
    for d in resized_dims(imp, n, name, x)? {
        let index: Vec<i64> = if f64_math { nearest_exact_index::<f64>(&d) } else { nearest_exact_index::<f32>(&d) };
        if index.iter().copied().eq(0..d.input) {
            continue;
        }
        v = gather(imp, v, d.axis, &index)?;
    }
    imp.bind(n, 0, v)
}

fn nearest_exact_index<T: Real>(d: &ResizedDim) -> Vec<i64> {
    let scale = pixel_scale::<T>(d.input, d.output, false, d.scale);
    (0..d.output).map(|i| floorf(source_index(scale, i, false, false) + T::of(0.5)).min(d.input - 1)).collect()
}

/// The four taps of every output pixel along one dim: their input indices
/// (`taps[j][i]`, clamped to the border) and cubic convolution weights.
struct CubicTaps {
    index: [Vec<i64>; 4],
    weight: [Vec<f64>; 4],
}

/// torch's `HelperInterpCubic::compute_indices_weights`: taps at
/// `floor(x) - 1 ..= floor(x) + 2` clamped into the input, weights from
/// `get_cubic_upsample_coefficients` (A = -0.75) in opmath.
fn cubic_taps<T: Real>(d: &ResizedDim, align_corners: bool) -> CubicTaps {
    let a = T::of(-0.75);
    let near = |x: T| ((a + T::of(2.0)) * x - (a + T::of(3.0))) * x * x + T::of(1.0);
    let far = |x: T| ((a * x - T::of(5.0) * a) * x + T::of(8.0) * a) * x - T::of(4.0) * a;
    let scale = pixel_scale::<T>(d.input, d.output, align_corners, d.scale);
    let mut taps = CubicTaps { index: Default::default(), weight: Default::default() };
    for i in 0..d.output {
        let real = source_index(scale, i, align_corners, true);
        let index = floorf(real).min(d.input - 1);
        let mut t = real - T::of(index as f64);
        if t < T::of(0.0) {
            t = T::of(0.0);
        }
        if t > T::of(1.0) {
            t = T::of(1.0);
        }
        let rest = T::of(1.0) - t;
        let weights = [far(t + T::of(1.0)), near(t), near(rest), far(rest + T::of(1.0))];
        for (j, w) in weights.into_iter().enumerate() {
            taps.index[j].push((index + j as i64 - 1).clamp(0, d.input - 1));
            taps.weight[j].push(w.get());
        }
    }
    taps
}

/// A weight vector as a constant of `dtype`, shaped to broadcast along `axis`
/// of a rank-`rank` tensor; `stored` is the dtype torch keeps the weights in
/// (the input's), so f16/bf16 weights are rounded to it first.
fn weight_const(imp: &mut Importer, weights: &[f64], stored: DType, dtype: DType, axis: usize, rank: usize) -> ValueId {
    let rounded = weights.iter().map(|&w| match stored {
        DType::F16 => half::f16::from_f32(w as f32).to_f64(),
        DType::BF16 => half::bf16::from_f32(w as f32).to_f64(),
        _ => w,
    });
    let bytes: Vec<u8> = match dtype {
        DType::F64 => rounded.flat_map(f64::to_le_bytes).collect(),
        DType::I32 => rounded.flat_map(|w| (w as i32).to_le_bytes()).collect(),
        _ => rounded.flat_map(|w| (w as f32).to_le_bytes()).collect(),
    };
    let mut shape = vec![1; rank - axis];
    shape[0] = weights.len() as i64;
    imp.g.add_const(None, TensorType::fixed(dtype, &shape), ConstBytes::owned(bytes))
}

/// `sum_j taps_j * weight_j`, added left to right (torch's order).
fn weighted_sum(imp: &mut Importer, terms: Vec<(ValueId, ValueId)>) -> R<ValueId> {
    let mut acc: Option<ValueId> = None;
    for (v, w) in terms {
        let p = imp.push(Op::Binary(B::Mul), vec![v, w])?;
        acc = Some(match acc {
            None => p,
            Some(a) => imp.push(Op::Binary(B::Add), vec![a, p])?,
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => invalid("an empty weighted sum"),
    }
}

/// `aten::upsample_bicubic2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors)`
/// and `upsample_bicubic2d(Tensor self, SymInt[2] output_size, bool align_corners, float? scales_h=None, float? scales_w=None)`:
/// torch's CPU kernel (`upsample_generic_Nd_kernel_impl` with
/// `HelperInterpCubic`) reads 4x4 border-clamped taps and computes
/// `sum_y w_y (sum_x w_x in[y, x])` in opmath (f32 for f16/bf16, whose
/// weights it stores rounded to the dtype), rounding once at the end.
/// uint8 goes to [`bicubic_u8`].
pub(super) fn bicubic(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "self").or_else(|_| imp.tensor(n, "input"))?;
    let align_corners = imp.bool(n, "align_corners", false)?;
    let out = imp.out_ty(n, 0)?;
    let stored = imp.ty(x).dtype;
    let compute = match stored {
        DType::F64 => DType::F64,
        DType::F32 | DType::F16 | DType::BF16 | DType::U8 => DType::F32,
        d => return unsupported(format!("bicubic upsampling of {d} (torch supports floating point and uint8)")),
    };
    let dims = resized_dims(imp, n, name, x)?;
    let [dy, dx] = dims.as_slice() else {
        return invalid(format!("{name}: expected two resized dims"));
    };
    if out.numel().as_const() == Some(0) || dy.input == 0 || dx.input == 0 {
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    if stored == DType::U8 {
        let v = bicubic_u8(imp, x, dy, dx, align_corners)?;
        return imp.bind(n, 0, v);
    }
    let (ty, tx) = if compute == DType::F64 {
        (cubic_taps::<f64>(dy, align_corners), cubic_taps::<f64>(dx, align_corners))
    } else {
        (cubic_taps::<f32>(dy, align_corners), cubic_taps::<f32>(dx, align_corners))
    };
    let xc = imp.cast(x, compute);
    let mut rows = Vec::with_capacity(4);
    for j in 0..4 {
        let row = gather(imp, xc, dy.axis, &ty.index[j])?;
        let mut terms = Vec::with_capacity(4);
        for k in 0..4 {
            let taps = gather(imp, row, dx.axis, &tx.index[k])?;
            let w = weight_const(imp, &tx.weight[k], stored, compute, dx.axis, 4);
            terms.push((taps, w));
        }
        let summed = weighted_sum(imp, terms)?;
        let w = weight_const(imp, &ty.weight[j], stored, compute, dy.axis, 4);
        rows.push((summed, w));
    }
    let v = weighted_sum(imp, rows)?;
    let v = imp.cast(v, out.dtype);
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out)
    };
    imp.bind(n, 0, v)
}

/// uint8 bicubic in torch's fixed-point arithmetic (its separable uint8
/// kernels, `_compute_index_ranges_int16_weights`): per dim, integer weights
/// with `precision` fraction bits ([`fixed_cubic_taps`]); each pass sums
/// `in * w` in i32, adds half of `2^precision`, shifts right by `precision`
/// (a floor division) and clamps to 0..=255 — first along x for each of the
/// four tap rows, then along y.
fn bicubic_u8(imp: &mut Importer, x: ValueId, dy: &ResizedDim, dx: &ResizedDim, align_corners: bool) -> R<ValueId> {
    let (ty, py) = fixed_cubic_taps(dy, align_corners);
    let (tx, px) = fixed_cubic_taps(dx, align_corners);
    let xi = imp.cast(x, DType::I32);
    let pass = |imp: &mut Importer, terms: Vec<(ValueId, ValueId)>, precision: i64| -> R<ValueId> {
        let sum = weighted_sum(imp, terms)?;
        let half = if precision > 0 { 1i64 << (precision - 1) } else { 0 };
        let sum = imp.with_scalar(B::Add, sum, half as f64)?;
        let shifted = imp.with_scalar(B::FloorDiv, sum, (1i64 << precision) as f64)?;
        imp.push(Op::Clamp { min: Some(0.0), max: Some(255.0) }, vec![shifted])
    };
    let mut rows = Vec::with_capacity(4);
    for j in 0..4 {
        let row = gather(imp, xi, dy.axis, &ty.index[j])?;
        let mut terms = Vec::with_capacity(4);
        for k in 0..4 {
            let taps = gather(imp, row, dx.axis, &tx.index[k])?;
            let w = weight_const(imp, &tx.weight[k], DType::I32, DType::I32, dx.axis, 4);
            terms.push((taps, w));
        }
        let summed = pass(imp, terms, px)?;
        let w = weight_const(imp, &ty.weight[j], DType::I32, DType::I32, dy.axis, 4);
        rows.push((summed, w));
    }
    let v = pass(imp, rows, py)?;
    Ok(imp.cast(v, DType::U8))
}

/// torch's uint8 bicubic taps (`_compute_indices_min_size_weights` with
/// `aa_filter<double, false>`): f64 cubic weights (A = -0.75) of the taps
/// `floor(x) - 1 ..= floor(x) + 2`, those outside the input added onto the
/// border pixel's; the precision is the most fraction bits (up to 22) that
/// keep the largest weight seen (partial sums included) below 2^15 once
/// doubled, and each weight is rounded half away from zero to an integer.
fn fixed_cubic_taps(d: &ResizedDim, align_corners: bool) -> (CubicTaps, i64) {
    const A: f64 = -0.75;
    let filter = |x: f64| {
        let x = x.abs();
        if x < 1.0 {
            ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
        } else {
            0.0
        }
    };
    let scale = pixel_scale::<f64>(d.input, d.output, align_corners, d.scale);
    let mut taps = CubicTaps { index: Default::default(), weight: Default::default() };
    let mut max = 0.0f64;
    for i in 0..d.output {
        let real = source_index(scale, i, align_corners, true);
        let index = floorf(real).min(d.input - 1);
        let lambda = (real - index as f64).clamp(0.0, 1.0);
        let unbound_min = index - 1;
        let index_min = unbound_min.max(0);
        let index_size = ((index + 3).min(d.input) - index_min).clamp(0, 4);
        let mut weights = [0.0f64; 4];
        let mut slot = 0i64;
        for j in 0..4i64 {
            if unbound_min + j <= 0 {
                slot = 0;
            } else if unbound_min + j >= d.input - 1 {
                slot = index_size - 1;
            }
            let s = slot.clamp(0, 3) as usize;
            weights[s] += filter((j - 1) as f64 - lambda);
            max = max.max(weights[s]);
            slot += 1;
        }
        for (k, w) in weights.into_iter().enumerate() {
            taps.index[k].push((index_min + k as i64).min(d.input - 1));
            taps.weight[k].push(w);
        }
    }
    let precision = (0..22).find(|&p| (0.5 + max * (1i64 << (p + 1)) as f64) as i64 >= 1 << 15).unwrap_or(22);
    let unit = (1i64 << precision) as f64;
    for ws in &mut taps.weight {
        for w in ws.iter_mut() {
            let v = *w * unit;
            *w = f64::from(if v < 0.0 { (v - 0.5) as i32 as i16 } else { (v + 0.5) as i32 as i16 });
        }
    }
    (taps, precision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dim(input: i64, output: i64, scale: f64) -> ResizedDim {
        ResizedDim { axis: 2, input, output, scale }
    }

    #[test]
    fn nearest_exact_indices_match_torch() {
        // F.interpolate(arange(5), size=8 / scale_factor=0.6, mode="nearest-exact").
        assert_eq!(nearest_exact_index::<f32>(&dim(5, 8, 0.0)), [0, 0, 1, 2, 2, 3, 4, 4]);
        assert_eq!(nearest_exact_index::<f32>(&dim(5, 3, 0.6)), [0, 2, 4]);
    }

    /// Resizes one row with the taps, as the graph does: Σ_k in[index_k] * w_k.
    fn apply(taps: &CubicTaps, row: &[f64]) -> Vec<f64> {
        (0..taps.index[0].len())
            .map(|i| (0..4).map(|k| row[taps.index[k][i] as usize] * taps.weight[k][i]).sum())
            .collect()
    }

    #[test]
    fn cubic_taps_match_torch() {
        // F.interpolate(x, size=(1, 4), mode="bicubic") of a 1x6 row with 200 at
        // column 2: torch gives [-7.03125, 175.78125, -21.09375, 0] in f32, and
        // [0, 176, 0, 0] for uint8 (its fixed point rounds, then clamps).
        let row = [0.0, 0.0, 200.0, 0.0, 0.0, 0.0];
        assert_eq!(apply(&cubic_taps::<f32>(&dim(6, 4, 0.0), false), &row), [-7.03125, 175.78125, -21.09375, 0.0]);
        let (taps, precision) = fixed_cubic_taps(&dim(6, 4, 0.0), false);
        let fixed: Vec<i64> = apply(&taps, &row)
            .iter()
            .map(|&s| ((s as i64 + (1 << (precision - 1))) >> precision).clamp(0, 255))
            .collect();
        assert_eq!(fixed, [0, 176, 0, 0]);
    }
}
