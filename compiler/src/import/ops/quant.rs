//! Quantized programs: the `quantized_decomposed` ops PT2E writes
//! (`torch/ao/quantization/fx/_decomposed.py`) and `aten::_int_mm`, which
//! torchao's decomposed dynamic quantization keeps.
//!
//! Each op becomes the float/integer arithmetic torch's own implementation
//! runs, operation for operation, so an imported program reproduces eager
//! fake-quant bit for bit: quantize is `clamp(rint(x · inv) + zp, qmin,
//! qmax)` with `inv` the f32 rounding of the f64 `1 / scale` (a Python float
//! or a tensor's `.item()`), or, per channel, the f32 `1 / scales`;
//! dequantize is `(f32(q) − zp) · scale`. The passes later turn dequantized
//! integer weights feeding a linear layer into `Op::QuantLinear`
//! (`passes/src/quant_linear.rs`).

use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use crate::pt2::scalar_type;
use kiln_ir::{BinaryOp, DType, Dim, Op, ReduceKind, TensorType, UnaryOp, ValueId};

/// `quantized_decomposed::<name>.<overload>`.
pub(crate) fn convert(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    match (name, overload) {
        ("quantize_per_tensor", "default" | "tensor") => quantize_per_tensor(imp, n, overload == "tensor"),
        ("dequantize_per_tensor", "default" | "tensor") => dequantize_per_tensor(imp, n, overload == "tensor"),
        ("quantize_per_channel", "default") => quantize_per_channel(imp, n),
        ("dequantize_per_channel", "default") => dequantize_per_channel(imp, n),
        ("choose_qparams", "tensor") => choose_qparams(imp, n),
        _ => unsupported(format!(
            "`quantized_decomposed::{name}.{overload}` is not supported (kiln imports quantize/dequantize_per_tensor \
             (default, .tensor), quantize/dequantize_per_channel and choose_qparams.tensor)"
        )),
    }
}

/// A `ScalarType` argument (serde numbering), `None` when omitted.
pub(super) fn scalar_type_arg(imp: &Importer, n: &Node, name: &str) -> R<Option<DType>> {
    match imp.arg(n, name) {
        None => Ok(None),
        Some(Arg::ScalarType(code)) => match scalar_type::dtype_of(*code) {
            Ok(d) => Ok(Some(d)),
            Err(torch) => unsupported(format!("argument `{name}`: element type {torch}")),
        },
        Some(other) => invalid(format!("argument `{name}`: expected a ScalarType, found {other:?}")),
    }
}

/// The quantized element type (`dtype`), which must be an integer kiln has.
fn quant_dtype(imp: &Importer, n: &Node) -> R<DType> {
    match scalar_type_arg(imp, n, "dtype")? {
        Some(d @ (DType::U8 | DType::I8 | DType::I16 | DType::I32)) => Ok(d),
        Some(d) => unsupported(format!("quantized element type {d} (kiln takes uint8, int8, int16, int32)")),
        None => invalid("required argument `dtype` is missing"),
    }
}

/// `(quant_min, quant_max)`.
fn bounds(imp: &mut Importer, n: &Node) -> R<(i64, i64)> {
    let lo = imp.int(n, "quant_min", None)?;
    let hi = imp.int(n, "quant_max", None)?;
    if lo > hi {
        return invalid(format!("quant_min {lo} is above quant_max {hi}"));
    }
    Ok((lo, hi))
}

/// A one-element tensor argument as a 0-d value (`.item()` in torch).
fn item(imp: &mut Importer, n: &Node, name: &str) -> R<ValueId> {
    let v = imp.tensor(n, name)?;
    let ty = imp.ty(v).clone();
    if ty.static_shape().map(|s| s.iter().product::<i64>()) != Some(1) {
        return invalid(format!("argument `{name}` must hold one element, found shape {:?}", ty.shape));
    }
    Ok(imp.push_typed(Op::Reshape { shape: Vec::new() }, vec![v], TensorType::new(ty.dtype, Vec::new())))
}

/// Float inputs other than f32 are widened first, as torch does.
fn float_input(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = imp.tensor(n, "input")?;
    match imp.ty(x).dtype {
        DType::F32 => Ok(x),
        DType::F16 | DType::BF16 => Ok(imp.cast(x, DType::F32)),
        other => invalid(format!("quantize expects a float input, found {other}")),
    }
}

/// `clamp(round(x · inv) + zp, lo, hi)` in f32, as `dtype`; `inv` and `zp` f32
/// broadcasting against `x`.
fn quantize(
    imp: &mut Importer,
    x: ValueId,
    inv: ValueId,
    zp: ValueId,
    (lo, hi): (i64, i64),
    dtype: DType,
) -> R<ValueId> {
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![x, inv])?;
    let rounded = imp.push(Op::Unary(UnaryOp::Round), vec![scaled])?;
    let shifted = imp.push(Op::Binary(BinaryOp::Add), vec![rounded, zp])?;
    let clamped = imp.push(Op::Clamp { min: Some(lo as f64), max: Some(hi as f64) }, vec![shifted])?;
    Ok(imp.cast(clamped, dtype))
}

/// `quantized_decomposed::quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype)`
/// and `.tensor(Tensor input, Tensor scale, Tensor zero_point, ...)` (`scale.item()`, `zero_point.item()`).
fn quantize_per_tensor(imp: &mut Importer, n: &Node, tensor_params: bool) -> R<()> {
    let x = float_input(imp, n)?;
    let range = bounds(imp, n)?;
    let dtype = quant_dtype(imp, n)?;
    let (inv, zp) = if tensor_params {
        // `1.0 / scale.item()` in f64, rounded to f32 when it multiplies.
        let s = item(imp, n, "scale")?;
        let s = imp.cast(s, DType::F64);
        let one = imp.scalar_const(Scalar::Float(1.0), DType::F64);
        let inv = imp.push(Op::Binary(BinaryOp::Div), vec![one, s])?;
        let zp = item(imp, n, "zero_point")?;
        (imp.cast(inv, DType::F32), imp.cast(zp, DType::F32))
    } else {
        let scale = imp.float(n, "scale", None)?;
        let zp = imp.int(n, "zero_point", None)?;
        let inv = imp.scalar_const(Scalar::Float(1.0 / scale), DType::F32);
        (inv, imp.scalar_const(Scalar::Int(zp), DType::F32))
    };
    let q = quantize(imp, x, inv, zp, range, dtype)?;
    imp.bind(n, 0, q)
}

/// `quantized_decomposed::dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min,
/// int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None)` and `.tensor` (tensor scale and zero point):
/// `(input.to(out_dtype) - zero_point) * scale`.
fn dequantize_per_tensor(imp: &mut Importer, n: &Node, tensor_params: bool) -> R<()> {
    let q = imp.tensor(n, "input")?;
    check_input_dtype(imp, n, q)?;
    let out = scalar_type_arg(imp, n, "out_dtype")?.unwrap_or(DType::F32);
    let (scale, zp) = if tensor_params {
        let s = item(imp, n, "scale")?;
        let zp = item(imp, n, "zero_point")?;
        (imp.cast(s, out), imp.cast(zp, out))
    } else {
        let scale = imp.float(n, "scale", None)?;
        let zp = imp.int(n, "zero_point", None)?;
        (imp.scalar_const(Scalar::Float(scale), out), imp.scalar_const(Scalar::Int(zp), out))
    };
    let x = imp.cast(q, out);
    let centred = imp.push(Op::Binary(BinaryOp::Sub), vec![x, zp])?;
    let v = imp.push(Op::Binary(BinaryOp::Mul), vec![centred, scale])?;
    imp.bind(n, 0, v)
}

fn check_input_dtype(imp: &Importer, n: &Node, q: ValueId) -> R<()> {
    let want = quant_dtype(imp, n)?;
    let have = imp.ty(q).dtype;
    if have != want {
        return invalid(format!("dequantize of a {have} tensor declared as {want}"));
    }
    Ok(())
}

/// A per-channel parameter `[C]` reshaped to broadcast along `axis` of a
/// rank-`rank` tensor.
fn along_axis(imp: &mut Importer, v: ValueId, axis: usize, rank: usize) -> R<ValueId> {
    let ty = imp.ty(v).clone();
    if ty.rank() != 1 {
        return invalid(format!("per-channel parameters must be 1-d, found rank {}", ty.rank()));
    }
    let mut shape = vec![Dim::Const(1); rank];
    shape[axis] = ty.shape[0].clone();
    Ok(imp.push_typed(Op::Reshape { shape: shape.clone() }, vec![v], TensorType::new(ty.dtype, shape)))
}

fn channel_axis(imp: &mut Importer, n: &Node, rank: usize) -> R<usize> {
    let axis = imp.int(n, "axis", None)?;
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if !(0..rank as i64).contains(&a) {
        return invalid(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// `quantized_decomposed::quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis,
/// int quant_min, int quant_max, ScalarType dtype)`: `clamp(round(input * (1.0 / scales)) + zero_points, ..)`,
/// the reciprocal in the scales' dtype.
fn quantize_per_channel(imp: &mut Importer, n: &Node) -> R<()> {
    let x = float_input(imp, n)?;
    let rank = imp.ty(x).rank();
    let axis = channel_axis(imp, n, rank)?;
    let range = bounds(imp, n)?;
    let dtype = quant_dtype(imp, n)?;
    let scales = imp.tensor(n, "scales")?;
    let scales = along_axis(imp, scales, axis, rank)?;
    let sdt = imp.ty(scales).dtype;
    let one = imp.scalar_const(Scalar::Float(1.0), sdt);
    let inv = imp.push(Op::Binary(BinaryOp::Div), vec![one, scales])?;
    let inv = imp.cast(inv, DType::F32);
    let zp = imp.tensor(n, "zero_points")?;
    let zp = along_axis(imp, zp, axis, rank)?;
    let zp = imp.cast(zp, DType::F32);
    let q = quantize(imp, x, inv, zp, range, dtype)?;
    imp.bind(n, 0, q)
}

/// `quantized_decomposed::dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis,
/// int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None)`:
/// `((input - zero_points) * scales).to(out_dtype)`, the difference exact in f32 for 8/16-bit values.
fn dequantize_per_channel(imp: &mut Importer, n: &Node) -> R<()> {
    let q = imp.tensor(n, "input")?;
    check_input_dtype(imp, n, q)?;
    let rank = imp.ty(q).rank();
    let axis = channel_axis(imp, n, rank)?;
    let out = scalar_type_arg(imp, n, "out_dtype")?.unwrap_or(DType::F32);
    let scales = imp.tensor(n, "scales")?;
    let scales = along_axis(imp, scales, axis, rank)?;
    let compute = match imp.ty(scales).dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let scales = imp.cast(scales, compute);
    if imp.ty(q).dtype == DType::I32 && compute == DType::F32 {
        // i32 values are not all exact in f32; torch subtracts in i64 first.
        return unsupported("dequantize_per_channel of int32 values with f32 scales");
    }
    let x = imp.cast(q, compute);
    let centred = match imp.opt_tensor(n, "zero_points")? {
        Some(zp) => {
            let zp = along_axis(imp, zp, axis, rank)?;
            let zp = imp.cast(zp, compute);
            imp.push(Op::Binary(BinaryOp::Sub), vec![x, zp])?
        }
        None => x,
    };
    let v = imp.push(Op::Binary(BinaryOp::Mul), vec![centred, scales])?;
    let v = imp.cast(v, out);
    imp.bind(n, 0, v)
}

/// `quantized_decomposed::choose_qparams.tensor(Tensor input, int quant_min, int quant_max, float eps,
/// ScalarType dtype) -> (Tensor, Tensor)`: torch's `determine_qparams` (affine, per tensor):
/// `s = max((max(mx, 0) - min(mn, 0)) / (qmax - qmin), f32(eps))`, `zp = clamp(qmin - round(min(mn, 0) / s))`,
/// returned as f64[1] and i64[1].
fn choose_qparams(imp: &mut Importer, n: &Node) -> R<()> {
    let x = float_input(imp, n)?;
    let (lo, hi) = bounds(imp, n)?;
    let eps = imp.float(n, "eps", None)?;
    quant_dtype(imp, n)?;
    let axes: Vec<usize> = (0..imp.ty(x).rank()).collect();
    let mn = imp.push(Op::Reduce { kind: ReduceKind::Min, axes: axes.clone(), keep_dims: false }, vec![x])?;
    let mx = imp.push(Op::Reduce { kind: ReduceKind::Max, axes, keep_dims: false }, vec![x])?;
    let zero = imp.scalar_const(Scalar::Float(0.0), DType::F32);
    let mn = imp.push(Op::Binary(BinaryOp::Min), vec![mn, zero])?;
    let mx = imp.push(Op::Binary(BinaryOp::Max), vec![mx, zero])?;
    let span = imp.push(Op::Binary(BinaryOp::Sub), vec![mx, mn])?;
    let levels = imp.scalar_const(Scalar::Float((hi - lo) as f64), DType::F32);
    let s = imp.push(Op::Binary(BinaryOp::Div), vec![span, levels])?;
    let eps = imp.scalar_const(Scalar::Float(eps), DType::F32);
    let s = imp.push(Op::Binary(BinaryOp::Max), vec![s, eps])?;
    let ratio = imp.push(Op::Binary(BinaryOp::Div), vec![mn, s])?;
    let ratio = imp.push(Op::Unary(UnaryOp::Round), vec![ratio])?;
    let qmin = imp.scalar_const(Scalar::Int(lo), DType::F32);
    let zp = imp.push(Op::Binary(BinaryOp::Sub), vec![qmin, ratio])?;
    let zp = imp.push(Op::Clamp { min: Some(lo as f64), max: Some(hi as f64) }, vec![zp])?;
    let one = vec![Dim::Const(1)];
    let s = imp.cast(s, DType::F64);
    let s = imp.push_typed(Op::Reshape { shape: one.clone() }, vec![s], TensorType::new(DType::F64, one.clone()));
    let zp = imp.cast(zp, DType::I64);
    let zp = imp.push_typed(Op::Reshape { shape: one.clone() }, vec![zp], TensorType::new(DType::I64, one));
    imp.bind(n, 0, s)?;
    imp.bind(n, 1, zp)
}

/// `aten::_int_mm(Tensor self, Tensor mat2) -> Tensor`: int8 (or, for
/// `self`, uint8) `[M, K] x [K, N]` with exact int32 sums, computed in f64
/// (every product is below 2^15 in magnitude: exact for every `K` below
/// 2^38). torchao's CPU path for dynamic int8 activations shifts them by
/// 128 into uint8 (torch's CPU `_int_mm` takes u8 × s8) and subtracts
/// 128 · the weight's column sums afterwards.
pub(super) fn int_mm(imp: &mut Importer, n: &Node) -> R<()> {
    let a = imp.tensor(n, "self")?;
    let b = imp.tensor(n, "mat2")?;
    for (v, dtypes) in [(a, &[DType::I8, DType::U8][..]), (b, &[DType::I8][..])] {
        if !dtypes.contains(&imp.ty(v).dtype) || imp.ty(v).rank() != 2 {
            return invalid(format!(
                "_int_mm takes 2-d int8 matrices (uint8 also for `self`), found {} of rank {}",
                imp.ty(v).dtype,
                imp.ty(v).rank()
            ));
        }
    }
    let (a, b) = (imp.cast(a, DType::F64), imp.cast(b, DType::F64));
    let p = imp.push(Op::MatMul, vec![a, b])?;
    let v = imp.cast(p, DType::I32);
    imp.bind(n, 0, v)
}
