//! Batch normalisation: inference with running statistics (the IR's
//! `BatchNorm`), and training mode over the batch's own statistics,
//! decomposed here with torch's CPU rounding for f16/bf16.

use super::indexing::only_first_output_used;
use crate::import::importer::{unsupported, Importer, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, DType, Dim, Op, ReduceKind, TensorType, UnaryOp, ValueId};

/// Channel count (axis 1) of a normalised tensor, needed to build default operands.
fn channels(imp: &Importer, x: ValueId) -> R<i64> {
    match imp.ty(x).shape.get(1).and_then(Dim::as_const) {
        Some(c) => Ok(c),
        None => unsupported("batch norm over a dynamic channel dimension without weight/bias"),
    }
}

/// The batch norm's `weight` and `bias`, or ones and zeros per channel when
/// the module has no affine parameters (the IR op always takes both).
fn affine_or_identity(imp: &mut Importer, n: &Node, x: ValueId, dtype: DType) -> R<(ValueId, ValueId)> {
    let mut param = |name: &str, fill: f64| -> R<ValueId> {
        match imp.opt_tensor(n, name)? {
            Some(p) => Ok(p),
            None => {
                let c = channels(imp, x)?;
                imp.filled_const(fill, dtype, c)
            }
        }
    };
    Ok((param("weight", 1.0)?, param("bias", 0.0)?))
}

fn batch_norm_common(imp: &mut Importer, n: &Node, eps: f64) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let dtype = imp.ty(x).dtype;
    let (Some(mean), Some(var)) = (imp.opt_tensor(n, "running_mean")?, imp.opt_tensor(n, "running_var")?) else {
        return unsupported("batch norm without running statistics (batch statistics)");
    };
    let (weight, bias) = affine_or_identity(imp, n, x, dtype)?;
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::BatchNorm { eps }, vec![x, mean, var, weight, bias], ty);
    imp.bind(n, 0, v)?;
    only_first_output_used(imp, n)
}

/// `aten::batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
///   Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled)`
pub(super) fn batch_norm(imp: &mut Importer, n: &Node) -> R<()> {
    // torch returns an empty result for an empty input of any rank, before
    // it checks anything else (the Core ATen form is a bare clone).
    let x = imp.tensor(n, "input")?;
    if imp.ty(x).numel().as_const() == Some(0) {
        let out = imp.out_ty(n, 0)?;
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    if imp.bool(n, "training", false)? {
        return native_batch_norm_legit(imp, n, "batch_norm", "default");
    }
    let eps = imp.float(n, "eps", Some(1e-5))?;
    batch_norm_common(imp, n, eps)
}

/// `aten::_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias,
///   Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)`
pub(super) fn native_batch_norm_no_training(imp: &mut Importer, n: &Node) -> R<()> {
    let eps = imp.float(n, "eps", None)?;
    batch_norm_common(imp, n, eps)
}

/// `aten::_native_batch_norm_legit(Tensor input, Tensor? weight, Tensor? bias,
///   Tensor(a!) running_mean, Tensor(b!) running_var, bool training, float momentum, float eps)
///   -> (Tensor, Tensor save_mean, Tensor save_rstd)`,
/// `_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training,
///   float momentum, float eps)` and `_native_batch_norm_legit_functional(..same as the first..)
///   -> (Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out)`.
///
/// With `training`, the batch's own statistics over every axis but 1:
/// `mean`, biased `var` (two-pass, as torch's CPU kernel), `rstd = 1/sqrt(var + eps)`,
/// `out = (x - mean) * rstd * weight + bias`; f16/bf16 compute in f32, bf16
/// with torch's intermediate roundings (`bf16_batch_stats`). The
/// running-statistics outputs of the functional form are
/// `(1 - momentum) * running + momentum * batch` (unbiased variance), computed
/// only when read (torch.export's input mutations are dropped).
pub(super) fn native_batch_norm_legit(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let training = imp.bool(n, "training", false)?;
    let has_stats = overload != "no_stats";
    if !training {
        if !has_stats {
            return unsupported("batch norm in inference mode without running statistics");
        }
        return native_batch_norm_inference(imp, n, name);
    }
    let x = imp.tensor(n, "input")?;
    let eps = imp.float(n, "eps", None)?;
    let momentum = imp.float(n, "momentum", Some(0.1))?;
    let xt = imp.ty(x).clone();
    if xt.rank() < 2 || !xt.dtype.is_float() {
        return unsupported(format!("batch norm of a rank-{} {} tensor", xt.rank(), xt.dtype));
    }
    let compute = if matches!(xt.dtype, DType::F16 | DType::BF16) { DType::F32 } else { xt.dtype };
    let axes: Vec<usize> = (0..xt.rank()).filter(|&a| a != 1).collect();
    // [C] operands broadcast as [C, 1, ..] against [N, C, ..].
    let mut per_channel = vec![xt.shape[1].clone()];
    per_channel.extend(std::iter::repeat_n(Dim::Const(1), xt.rank() - 2));
    let xc = imp.cast(x, compute);
    let mut affine = [None, None];
    for (slot, operand) in affine.iter_mut().zip(["weight", "bias"]) {
        if let Some(w) = imp.opt_tensor(n, operand)? {
            let w = imp.cast(w, compute);
            *slot = Some(imp.push(Op::Reshape { shape: per_channel.clone() }, vec![w])?);
        }
    }
    let BatchStats { y, mean, rstd, var } = if xt.dtype == DType::BF16 {
        bf16_batch_stats(imp, xc, &xt.shape, axes.clone(), eps, affine)?
    } else {
        batch_stats(imp, xc, xt.dtype, axes.clone(), eps, affine)?
    };
    let out = imp.out_ty(n, 0)?;
    let y = imp.cast(y, out.dtype);
    imp.bind(n, 0, y)?;
    let names: Vec<Option<String>> =
        n.outputs.iter().map(|o| if let Arg::Tensor(t) = o { Some(t.clone()) } else { None }).collect();
    let used = |imp: &Importer, i: usize| names.get(i).and_then(|o| o.as_deref()).is_some_and(|t| imp.is_used(t));
    for (i, stat) in [(1, mean), (2, rstd)] {
        if used(imp, i) {
            let ty = imp.out_ty(n, i)?;
            let v = imp.push_typed(
                Op::Reshape { shape: vec![xt.shape[1].clone()] },
                vec![stat],
                TensorType::new(compute, vec![xt.shape[1].clone()]),
            );
            let v = imp.cast(v, ty.dtype);
            imp.bind(n, i, v)?;
        }
    }
    if name.ends_with("_functional") && (used(imp, 3) || used(imp, 4)) {
        let Some(count) = axes_count(&xt.shape) else {
            return unsupported("updated running variance of a batch norm over dynamic (or overflowing) dims");
        };
        let unbiased = count as f64 / (count as f64 - 1.0).max(1.0);
        let var_unbiased = imp.with_scalar(BinaryOp::Mul, var, unbiased)?;
        for (i, operand, batch) in [(3, "running_mean", mean), (4, "running_var", var_unbiased)] {
            if !used(imp, i) {
                continue;
            }
            let ty = imp.out_ty(n, i)?;
            let running = imp.tensor(n, operand)?;
            let running = imp.cast(running, compute);
            let kept = imp.with_scalar(BinaryOp::Mul, running, 1.0 - momentum)?;
            let batch = imp.push_typed(
                Op::Reshape { shape: ty.shape.clone() },
                vec![batch],
                TensorType::new(compute, ty.shape.clone()),
            );
            let batch = imp.with_scalar(BinaryOp::Mul, batch, momentum)?;
            let v = imp.push(Op::Binary(BinaryOp::Add), vec![kept, batch])?;
            let v = imp.cast(v, ty.dtype);
            imp.bind(n, i, v)?;
        }
    }
    Ok(())
}

/// A training-mode batch norm's output (before the final cast) and the
/// statistics its other outputs expose, all in the compute dtype.
struct BatchStats {
    y: ValueId,
    mean: ValueId,
    rstd: ValueId,
    /// Biased variance, for the running-variance update.
    var: ValueId,
}

/// `(x - mean) * rstd * weight + bias` over the batch's statistics (`xc` in
/// the compute dtype). For f16 torch keeps the statistics in the input's
/// dtype (they are the saved outputs) and normalises with those rounded values.
fn batch_stats(
    imp: &mut Importer,
    xc: ValueId,
    dtype: DType,
    axes: Vec<usize>,
    eps: f64,
    [weight, bias]: [Option<ValueId>; 2],
) -> R<BatchStats> {
    let compute = imp.ty(xc).dtype;
    let mean = imp.push(Op::Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keep_dims: true }, vec![xc])?;
    let mut centred = imp.push(Op::Binary(BinaryOp::Sub), vec![xc, mean])?;
    let squares = imp.push(Op::Binary(BinaryOp::Mul), vec![centred, centred])?;
    let var = imp.push(Op::Reduce { kind: ReduceKind::Mean, axes, keep_dims: true }, vec![squares])?;
    let var_eps = imp.with_scalar(BinaryOp::Add, var, eps)?;
    let mut rstd = imp.push(Op::Unary(UnaryOp::Rsqrt), vec![var_eps])?;
    if compute != dtype {
        let rounded_mean = round_through(imp, mean, dtype);
        centred = imp.push(Op::Binary(BinaryOp::Sub), vec![xc, rounded_mean])?;
        rstd = round_through(imp, rstd, dtype);
    }
    let mut y = imp.push(Op::Binary(BinaryOp::Mul), vec![centred, rstd])?;
    if let Some(w) = weight {
        y = imp.push(Op::Binary(BinaryOp::Mul), vec![y, w])?;
    }
    if let Some(b) = bias {
        y = imp.push(Op::Binary(BinaryOp::Add), vec![y, b])?;
    }
    Ok(BatchStats { y, mean, rstd, var })
}

/// torch's bf16 CPU batch norm in training mode, step for step (bit-exact
/// against torch 2.15): the mean, the sum of squared deviations, the
/// variance and `invstd` are each stored in bf16 before the next step uses
/// them, and the output is `x * alpha + beta` with `alpha = invstd * weight`,
/// `beta = bias - mean * alpha` in f32, rounded once.
fn bf16_batch_stats(
    imp: &mut Importer,
    xc: ValueId,
    shape: &[Dim],
    axes: Vec<usize>,
    eps: f64,
    [weight, bias]: [Option<ValueId>; 2],
) -> R<BatchStats> {
    let mean = imp.push(Op::Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keep_dims: true }, vec![xc])?;
    let mean = round_through(imp, mean, DType::BF16);
    let centred = imp.push(Op::Binary(BinaryOp::Sub), vec![xc, mean])?;
    let squares = imp.push(Op::Binary(BinaryOp::Mul), vec![centred, centred])?;
    let var_sum = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: axes.clone(), keep_dims: true }, vec![squares])?;
    let var_sum = round_through(imp, var_sum, DType::BF16);
    let count = axes.iter().map(|&a| shape[a].clone()).fold(Dim::Const(1), Dim::mul);
    let count = imp.dim_scalar(&count, DType::F32);
    let var = imp.push(Op::Binary(BinaryOp::Div), vec![var_sum, count])?;
    let var_rounded = round_through(imp, var, DType::BF16);
    let var_eps = imp.with_scalar(BinaryOp::Add, var_rounded, eps)?;
    let rstd = imp.push(Op::Unary(UnaryOp::Rsqrt), vec![var_eps])?;
    let rstd = round_through(imp, rstd, DType::BF16);
    let alpha = match weight {
        Some(w) => imp.push(Op::Binary(BinaryOp::Mul), vec![rstd, w])?,
        None => rstd,
    };
    let shift = imp.push(Op::Binary(BinaryOp::Mul), vec![mean, alpha])?;
    let beta = match bias {
        Some(b) => imp.push(Op::Binary(BinaryOp::Sub), vec![b, shift])?,
        None => imp.push(Op::Unary(UnaryOp::Neg), vec![shift])?,
    };
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![xc, alpha])?;
    let y = imp.push(Op::Binary(BinaryOp::Add), vec![scaled, beta])?;
    Ok(BatchStats { y, mean, rstd, var })
}

/// `v` rounded to `dtype` and widened back to its own dtype.
fn round_through(imp: &mut Importer, v: ValueId, dtype: DType) -> ValueId {
    let wide = imp.ty(v).dtype;
    let narrow = imp.cast(v, dtype);
    imp.cast(narrow, wide)
}

/// `_native_batch_norm_legit(_functional)` with `training=False`: the running
/// statistics normalise; the saved statistics are empty and the running
/// statistics are returned unchanged.
fn native_batch_norm_inference(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let dtype = imp.ty(x).dtype;
    let (mean, var) = (imp.tensor(n, "running_mean")?, imp.tensor(n, "running_var")?);
    let (weight, bias) = affine_or_identity(imp, n, x, dtype)?;
    let eps = imp.float(n, "eps", None)?;
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::BatchNorm { eps }, vec![x, mean, var, weight, bias], ty);
    imp.bind(n, 0, v)?;
    for i in 1..n.outputs.len() {
        let Arg::Tensor(out) = &n.outputs[i] else { continue };
        if !imp.is_used(out) {
            continue;
        }
        let ty = imp.out_ty(n, i)?;
        let v = match (i, name.ends_with("_functional")) {
            (3, true) => imp.cast(mean, ty.dtype),
            (4, true) => imp.cast(var, ty.dtype),
            _ => imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty),
        };
        imp.bind(n, i, v)?;
    }
    Ok(())
}

/// Elements per channel of `[N, C, ..]` when static.
fn axes_count(shape: &[Dim]) -> Option<i64> {
    shape.iter().enumerate().filter(|(a, _)| *a != 1).try_fold(1i64, |acc, (_, d)| acc.checked_mul(d.as_const()?))
}
