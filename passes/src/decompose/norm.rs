//! Normalisations.
//!
//! BatchNorm (inference) is `x * scale + shift` per channel, with
//! `scale = weight / sqrt(var + eps)` and `shift = bias - mean * scale` shaped
//! `[C, 1, ..]` so they broadcast over the spatial dims. With constant parameters
//! (the usual case) both are computed here in f64 and stored once; otherwise they
//! are built from nodes.
//! LayerNorm is `(x - mean) * rsqrt(var + eps) * weight + bias` over the trailing
//! `normalized_rank` dims, with the biased variance torch uses.

use crate::emit::Emitter;
use crate::host::{supported, HostTensor};
use crate::PassError;
use kiln_ir::{BinaryOp, Dim, Op, ReduceKind, UnaryOp, ValueId};

pub(super) fn batch_norm(e: &mut Emitter, inputs: &[ValueId], eps: f64) -> Result<Option<ValueId>, PassError> {
    let &[x, mean, var, weight, bias] = inputs else { return Ok(None) };
    let x_ty = e.ty(x);
    if x_ty.rank() < 2 || !supported(x_ty.dtype) || !x_ty.dtype.is_float() {
        return Ok(None);
    }
    if [mean, var, weight, bias].iter().any(|&p| e.ty(p).rank() != 1) {
        return Ok(None);
    }
    let channel_shape = |c: Dim| -> Vec<Dim> {
        std::iter::once(c).chain(std::iter::repeat_n(Dim::Const(1), x_ty.rank() - 2)).collect()
    };
    let (scale, shift) = match constant_params(e.g, [mean, var, weight, bias], eps) {
        Some((scale, shift)) => {
            let shape: Vec<usize> =
                std::iter::once(scale.len()).chain(std::iter::repeat_n(1, x_ty.rank() - 2)).collect();
            let scale = HostTensor::new(x_ty.dtype, shape.clone(), scale).add_to(e.g, None);
            let shift = HostTensor::new(x_ty.dtype, shape, shift).add_to(e.g, None);
            (scale, shift)
        }
        None => {
            let as_channels = |e: &mut Emitter, p: ValueId| {
                let c = e.ty(p).shape[0].clone();
                e.push(Op::Reshape { shape: channel_shape(c) }, vec![p])
            };
            let (mean, var) = (as_channels(e, mean)?, as_channels(e, var)?);
            let (weight, bias) = (as_channels(e, weight)?, as_channels(e, bias)?);
            let eps = e.scalar(x_ty.dtype, eps);
            let var_eps = e.binary(BinaryOp::Add, var, eps)?;
            let inv_std = e.unary(UnaryOp::Rsqrt, var_eps)?;
            let scale = e.binary(BinaryOp::Mul, weight, inv_std)?;
            let mean_scale = e.binary(BinaryOp::Mul, mean, scale)?;
            (scale, e.binary(BinaryOp::Sub, bias, mean_scale)?)
        }
    };
    let scaled = e.binary(BinaryOp::Mul, x, scale)?;
    e.binary(BinaryOp::Add, scaled, shift).map(Some)
}

/// Per-channel `(scale, shift)` when all four parameters are constants of one length.
/// BatchNorm's per-channel `(scale, shift)` from constant `[mean, var,
/// weight, bias]`, in f64.
pub(crate) fn constant_params(g: &kiln_ir::Graph, params: [ValueId; 4], eps: f64) -> Option<(Vec<f64>, Vec<f64>)> {
    let [mean, var, weight, bias] = params.map(|p| HostTensor::from_const(g, p));
    let (mean, var, weight, bias) = (mean?, var?, weight?, bias?);
    let c = mean.numel();
    if [&var, &weight, &bias].iter().any(|t| t.numel() != c) {
        return None;
    }
    let scale: Vec<f64> = (0..c).map(|i| weight.data[i] / (var.data[i] + eps).sqrt()).collect();
    let shift = (0..c).map(|i| bias.data[i] - mean.data[i] * scale[i]).collect();
    Some((scale, shift))
}

pub(super) fn layer_norm(
    e: &mut Emitter,
    inputs: &[ValueId],
    normalized_rank: usize,
    eps: f64,
) -> Result<Option<ValueId>, PassError> {
    let Some(&x) = inputs.first() else { return Ok(None) };
    let x_ty = e.ty(x);
    if normalized_rank == 0 || normalized_rank > x_ty.rank() || !supported(x_ty.dtype) || !x_ty.dtype.is_float() {
        return Ok(None);
    }
    let axes: Vec<usize> = (x_ty.rank() - normalized_rank..x_ty.rank()).collect();
    let mean = e.reduce(ReduceKind::Mean, x, axes.clone(), true)?;
    let centered = e.binary(BinaryOp::Sub, x, mean)?;
    let squared = e.binary(BinaryOp::Mul, centered, centered)?;
    let var = e.reduce(ReduceKind::Mean, squared, axes, true)?;
    let eps = e.scalar(x_ty.dtype, eps);
    let var_eps = e.binary(BinaryOp::Add, var, eps)?;
    let inv_std = e.unary(UnaryOp::Rsqrt, var_eps)?;
    let mut y = e.binary(BinaryOp::Mul, centered, inv_std)?;
    if let Some(&weight) = inputs.get(1) {
        y = e.binary(BinaryOp::Mul, y, weight)?;
    }
    if let Some(&bias) = inputs.get(2) {
        y = e.binary(BinaryOp::Add, y, bias)?;
    }
    Ok(Some(y))
}
