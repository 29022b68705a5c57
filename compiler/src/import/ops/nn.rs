//! Composite neural-network ops kept whole when a dedicated kernel exists.

use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use super::conv_transpose_slow::{conv_transpose_slow_path, takes_torch_slow_path, Geometry};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, DType, Dim, Op, PoolKind, ReduceKind, TensorType, UnaryOp, ValueId};

/// `aten::linear(Tensor input, Tensor weight, Tensor? bias=None)`
pub(super) fn linear(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let w = imp.tensor(n, "weight")?;
    let mut inputs = vec![x, w];
    inputs.extend(imp.opt_tensor(n, "bias")?);
    imp.emit(n, Op::Linear, inputs)?;
    Ok(())
}

/// `aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1)`
/// = `beta * self + alpha * (mat1 @ mat2)`
pub(super) fn addmm(imp: &mut Importer, n: &Node) -> R<()> {
    let bias = imp.tensor(n, "self")?;
    let a = imp.tensor(n, "mat1")?;
    let b = imp.tensor(n, "mat2")?;
    let beta = imp.opt_scalar(n, "beta")?.unwrap_or(Scalar::Int(1)).as_f64();
    let alpha = imp.opt_scalar(n, "alpha")?.unwrap_or(Scalar::Int(1)).as_f64();
    let out = imp.out_ty(n, 0)?;
    // f16/bf16: torch's GEMM computes `beta * self + alpha * (mat1 @ mat2)` in
    // f32 and rounds once; rounding the product before the add would land
    // an ulp off. So the whole expression is built in f32 here.
    let reduced = matches!(out.dtype, DType::F16 | DType::BF16);
    let compute = if reduced { DType::F32 } else { out.dtype };
    let (a, b, bias) = if reduced { (imp.cast(a, compute), imp.cast(b, compute), imp.cast(bias, compute)) } else { (a, b, bias) };
    let wide = TensorType::new(compute, out.shape.clone());
    let mut product = imp.push(Op::MatMul, vec![a, b], wide.clone());
    if alpha != 1.0 {
        let k = imp.scalar_const(Scalar::Float(alpha), compute);
        product = imp.push(Op::Binary(BinaryOp::Mul), vec![product, k], wide.clone());
    }
    // beta = 0 ignores `self` entirely (even NaNs in it), as torch does.
    let v = if beta == 0.0 {
        product
    } else {
        let mut bias = bias;
        if beta != 1.0 {
            let k = imp.scalar_const(Scalar::Float(beta), compute);
            let ty = imp.ty(bias).clone();
            bias = imp.push(Op::Binary(BinaryOp::Mul), vec![bias, k], ty);
        }
        imp.push(Op::Binary(BinaryOp::Add), vec![product, bias], wide)
    };
    let v = if reduced { imp.cast(v, out.dtype) } else { v };
    imp.bind(n, 0, v)
}

/// `aten::mm(Tensor self, Tensor mat2)`, `aten::bmm(Tensor self, Tensor mat2)`,
/// `aten::matmul(Tensor self, Tensor other)`
pub(super) fn matmul(imp: &mut Importer, n: &Node) -> R<()> {
    let a = imp.tensor(n, "self")?;
    let b = match imp.arg(n, "mat2") {
        Some(_) => imp.tensor(n, "mat2")?,
        None => imp.tensor(n, "other")?,
    };
    imp.emit(n, Op::MatMul, vec![a, b])?;
    Ok(())
}

/// Spatial rank of a convolution from its weight `[Cout, Cin/g, k...]`.
fn spatial_rank(imp: &Importer, w: ValueId) -> R<usize> {
    match imp.ty(w).rank() {
        r @ 3..=5 => Ok(r - 2),
        r => unsupported(format!("convolution weight of rank {r}")),
    }
}

/// `aten::convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride,
///   SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups)`
pub(super) fn convolution(imp: &mut Importer, n: &Node) -> R<()> {
    if imp.bool(n, "transposed", false)? {
        return conv_transpose(imp, n);
    }
    conv_common(imp, n, Padding::Explicit)
}

/// `aten::conv_transpose{1,2,3}d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[] stride=1,
///   SymInt[] padding=0, SymInt[] output_padding=0, SymInt groups=1, SymInt[] dilation=1)`
/// and `convolution(..., transposed=True, ...)`: a convolution (stride 1) of the
/// input spread apart by `stride - 1` zeros and padded by `dilation*(k-1) - padding`
/// (plus `output_padding` at the end), with the weight's in/out channels swapped
/// per group and its taps flipped.
pub(super) fn conv_transpose(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let w = imp.tensor(n, "weight")?;
    let bias = imp.opt_tensor(n, "bias")?;
    let k = spatial_rank(imp, w)?;
    let stride = imp.ints_n(n, "stride", &[1], k)?;
    let padding = imp.ints_n(n, "padding", &[0], k)?;
    let output_padding = imp.ints_n(n, "output_padding", &[0], k)?;
    let dilation = imp.ints_n(n, "dilation", &[1], k)?;
    let groups = imp.int(n, "groups", Some(1))?;
    let Some(wshape) = imp.ty(w).static_shape() else { return unsupported("transposed convolution with a dynamic weight shape") };
    let out = imp.out_ty(n, 0)?;
    let (x, unbatched) = unsqueeze_batch(imp, x, k)?;
    let geo = Geometry { stride: &stride, padding: &padding, output_padding: &output_padding, dilation: &dilation, groups };
    if takes_torch_slow_path(imp.ty(x).dtype, &geo) {
        if let Some(v) = conv_transpose_slow_path(imp, x, w, bias, &geo)? {
            let v = if unbatched { imp.push(Op::Reshape { shape: out.shape.clone() }, vec![v], out) } else { v };
            return imp.bind(n, 0, v);
        }
    }
    let xr = imp.ty(x).rank();
    let (cin, cout_g) = (wshape[0], wshape[1]);
    if groups < 1 || cin % groups != 0 {
        return invalid(format!("weight {wshape:?} with {groups} groups"));
    }
    let mut lo = vec![0; xr];
    let mut hi = vec![0; xr];
    let mut interior = vec![0; xr];
    for i in 0..k {
        let span = dilation[i] * (wshape[2 + i] - 1);
        lo[2 + i] = span - padding[i];
        hi[2 + i] = span - padding[i] + output_padding[i];
        interior[2 + i] = stride[i] - 1;
    }
    let spread = imp.build(Op::Pad { lo, hi, interior, mode: kiln_ir::PadMode::Constant, value: 0.0 }, vec![x])?;
    // [Cin, Cout/g, k..] -> [g, Cin/g, Cout/g, k..] -> [g, Cout/g, Cin/g, k..] -> [Cout, Cin/g, k..]
    let dims = |v: &[i64]| v.iter().map(|&d| Dim::Const(d)).collect::<Vec<_>>();
    let mut grouped = vec![groups, cin / groups, cout_g];
    grouped.extend(&wshape[2..]);
    let wg = imp.build(Op::Reshape { shape: dims(&grouped) }, vec![w])?;
    let mut perm: Vec<usize> = vec![0, 2, 1];
    perm.extend(3..3 + k);
    let wp = imp.build(Op::Permute { perm }, vec![wg])?;
    let mut flat = vec![groups * cout_g, cin / groups];
    flat.extend(&wshape[2..]);
    let wf = imp.build(Op::Reshape { shape: dims(&flat) }, vec![wp])?;
    let wflip = imp.build(Op::Flip { axes: (2..2 + k).collect() }, vec![wf])?;
    let mut inputs = vec![spread, wflip];
    inputs.extend(bias);
    let conv = Op::Conv { stride: vec![1; k], padding: vec![0; k], dilation, groups };
    let v = imp.build(conv, inputs)?;
    let v = if unbatched { imp.push(Op::Reshape { shape: out.shape.clone() }, vec![v], out) } else { v };
    imp.bind(n, 0, v)
}

/// A convolution's unbatched input `[C, spatial..]` as `[1, C, spatial..]`.
fn unsqueeze_batch(imp: &mut Importer, x: ValueId, k: usize) -> R<(ValueId, bool)> {
    let ty = imp.ty(x).clone();
    if ty.rank() == k + 2 {
        return Ok((x, false));
    }
    if ty.rank() != k + 1 {
        return invalid(format!("convolution input of rank {} for {k} spatial dims", ty.rank()));
    }
    let mut shape = vec![Dim::Const(1)];
    shape.extend(ty.shape.iter().cloned());
    let v = imp.push(Op::Reshape { shape: shape.clone() }, vec![x], TensorType::new(ty.dtype, shape));
    Ok((v, true))
}

/// `aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1,
///   SymInt[2] padding=0, SymInt[2] dilation=1, SymInt groups=1)`
/// and `conv2d.padding(..., str padding="valid", ...)` (likewise 1d/3d).
pub(super) fn conv_nd(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    if overload == "padding" || matches!(imp.arg(n, "padding"), Some(Arg::Str(_))) {
        return match imp.string(n, "padding", "valid")? {
            "valid" => conv_common(imp, n, Padding::Valid),
            "same" => conv_common(imp, n, Padding::Same),
            other => unsupported(format!("convolution padding={other:?}")),
        };
    }
    conv_common(imp, n, Padding::Explicit)
}

enum Padding {
    Explicit,
    Valid,
    Same,
}

fn conv_common(imp: &mut Importer, n: &Node, padding_mode: Padding) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let w = imp.tensor(n, "weight")?;
    let bias = imp.opt_tensor(n, "bias")?;
    let k = spatial_rank(imp, w)?;
    let stride = imp.ints_n(n, "stride", &[1], k)?;
    let dilation = imp.ints_n(n, "dilation", &[1], k)?;
    let groups = imp.int(n, "groups", Some(1))?;
    let padding = match padding_mode {
        Padding::Explicit => imp.ints_n(n, "padding", &[0], k)?,
        Padding::Valid => vec![0; k],
        Padding::Same => {
            let kernel = imp.ty(w).static_shape().map(|s| s[2..].to_vec());
            let Some(kernel) = kernel else { return unsupported("padding='same' with a dynamic kernel") };
            let mut pads = Vec::with_capacity(k);
            for (&ks, &d) in kernel.iter().zip(&dilation) {
                let total = d * (ks - 1);
                if total % 2 != 0 {
                    return unsupported("padding='same' needing asymmetric padding");
                }
                pads.push(total / 2);
            }
            pads
        }
    };
    let out = imp.out_ty(n, 0)?;
    let (x, unbatched) = unsqueeze_batch(imp, x, k)?;
    let mut inputs = vec![x, w];
    inputs.extend(bias);
    let op = Op::Conv { stride, padding, dilation, groups };
    if unbatched {
        let v = imp.build(op, inputs)?;
        let v = imp.push(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
        return imp.bind(n, 0, v);
    }
    imp.emit(n, op, inputs)?;
    Ok(())
}

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
                Ok(imp.filled_const(fill, dtype, c))
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
    let v = imp.push(Op::BatchNorm { eps }, vec![x, mean, var, weight, bias], ty);
    imp.bind(n, 0, v)?;
    only_first_output_used(imp, n)
}

/// Multi-output ops whose extra outputs (saved statistics) kiln does not compute.
fn only_first_output_used(imp: &Importer, n: &Node) -> R<()> {
    for out in n.outputs.iter().skip(1) {
        if let Arg::Tensor(name) = out {
            if imp.is_used(name) {
                return unsupported(format!("output `{name}` (saved statistics) is used; only output 0 is supported"));
            }
        }
    }
    Ok(())
}

/// `aten::batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
///   Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled)`
pub(super) fn batch_norm(imp: &mut Importer, n: &Node) -> R<()> {
    // torch returns an empty result for an empty input of any rank, before
    // it checks anything else (the Core ATen form is a bare clone).
    let x = imp.tensor(n, "input")?;
    if imp.ty(x).numel().as_const() == Some(0) {
        let out = imp.out_ty(n, 0)?;
        let v = imp.push(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
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
            *slot = Some(imp.build(Op::Reshape { shape: per_channel.clone() }, vec![w])?);
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
            let v = imp.push(Op::Reshape { shape: vec![xt.shape[1].clone()] }, vec![stat], TensorType::new(compute, vec![xt.shape[1].clone()]));
            let v = imp.cast(v, ty.dtype);
            imp.bind(n, i, v)?;
        }
    }
    if name.ends_with("_functional") && (used(imp, 3) || used(imp, 4)) {
        let Some(count) = axes_count(&xt.shape) else {
            return unsupported("updated running variance of a batch norm over dynamic dims");
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
            let batch = imp.push(Op::Reshape { shape: ty.shape.clone() }, vec![batch], TensorType::new(compute, ty.shape.clone()));
            let batch = imp.with_scalar(BinaryOp::Mul, batch, momentum)?;
            let v = imp.build(Op::Binary(BinaryOp::Add), vec![kept, batch])?;
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
fn batch_stats(imp: &mut Importer, xc: ValueId, dtype: DType, axes: Vec<usize>, eps: f64, [weight, bias]: [Option<ValueId>; 2]) -> R<BatchStats> {
    let compute = imp.ty(xc).dtype;
    let mean = imp.build(Op::Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keep_dims: true }, vec![xc])?;
    let mut centred = imp.build(Op::Binary(BinaryOp::Sub), vec![xc, mean])?;
    let squares = imp.build(Op::Binary(BinaryOp::Mul), vec![centred, centred])?;
    let var = imp.build(Op::Reduce { kind: ReduceKind::Mean, axes, keep_dims: true }, vec![squares])?;
    let var_eps = imp.with_scalar(BinaryOp::Add, var, eps)?;
    let mut rstd = imp.build(Op::Unary(UnaryOp::Rsqrt), vec![var_eps])?;
    if compute != dtype {
        let rounded_mean = round_through(imp, mean, dtype);
        centred = imp.build(Op::Binary(BinaryOp::Sub), vec![xc, rounded_mean])?;
        rstd = round_through(imp, rstd, dtype);
    }
    let mut y = imp.build(Op::Binary(BinaryOp::Mul), vec![centred, rstd])?;
    if let Some(w) = weight {
        y = imp.build(Op::Binary(BinaryOp::Mul), vec![y, w])?;
    }
    if let Some(b) = bias {
        y = imp.build(Op::Binary(BinaryOp::Add), vec![y, b])?;
    }
    Ok(BatchStats { y, mean, rstd, var })
}

/// torch's bf16 CPU batch norm in training mode, step for step (bit-exact
/// against torch 2.15): the mean, the sum of squared deviations, the
/// variance and `invstd` are each stored in bf16 before the next step uses
/// them, and the output is `x * alpha + beta` with `alpha = invstd * weight`,
/// `beta = bias - mean * alpha` in f32, rounded once.
fn bf16_batch_stats(imp: &mut Importer, xc: ValueId, shape: &[Dim], axes: Vec<usize>, eps: f64, [weight, bias]: [Option<ValueId>; 2]) -> R<BatchStats> {
    let mean = imp.build(Op::Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keep_dims: true }, vec![xc])?;
    let mean = round_through(imp, mean, DType::BF16);
    let centred = imp.build(Op::Binary(BinaryOp::Sub), vec![xc, mean])?;
    let squares = imp.build(Op::Binary(BinaryOp::Mul), vec![centred, centred])?;
    let var_sum = imp.build(Op::Reduce { kind: ReduceKind::Sum, axes: axes.clone(), keep_dims: true }, vec![squares])?;
    let var_sum = round_through(imp, var_sum, DType::BF16);
    let count = axes.iter().map(|&a| shape[a].clone()).fold(Dim::Const(1), Dim::mul);
    let count = imp.dim_scalar(&count, DType::F32);
    let var = imp.build(Op::Binary(BinaryOp::Div), vec![var_sum, count])?;
    let var_rounded = round_through(imp, var, DType::BF16);
    let var_eps = imp.with_scalar(BinaryOp::Add, var_rounded, eps)?;
    let rstd = imp.build(Op::Unary(UnaryOp::Rsqrt), vec![var_eps])?;
    let rstd = round_through(imp, rstd, DType::BF16);
    let alpha = match weight {
        Some(w) => imp.build(Op::Binary(BinaryOp::Mul), vec![rstd, w])?,
        None => rstd,
    };
    let shift = imp.build(Op::Binary(BinaryOp::Mul), vec![mean, alpha])?;
    let beta = match bias {
        Some(b) => imp.build(Op::Binary(BinaryOp::Sub), vec![b, shift])?,
        None => imp.build(Op::Unary(UnaryOp::Neg), vec![shift])?,
    };
    let scaled = imp.build(Op::Binary(BinaryOp::Mul), vec![xc, alpha])?;
    let y = imp.build(Op::Binary(BinaryOp::Add), vec![scaled, beta])?;
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
    let v = imp.push(Op::BatchNorm { eps }, vec![x, mean, var, weight, bias], ty);
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
            _ => imp.push(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty),
        };
        imp.bind(n, i, v)?;
    }
    Ok(())
}

/// Elements per channel of `[N, C, ..]` when static.
fn axes_count(shape: &[Dim]) -> Option<i64> {
    shape.iter().enumerate().filter(|(a, _)| *a != 1).map(|(_, d)| d.as_const()).product()
}

fn layer_norm_common(imp: &mut Importer, n: &Node, eps: f64) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let normalized = imp.ints(n, "normalized_shape", &[])?;
    let mut weight = imp.opt_tensor(n, "weight")?;
    let bias = imp.opt_tensor(n, "bias")?;
    if weight.is_none() && bias.is_some() {
        // The IR's optional operands are trailing: a bias needs a weight.
        let dtype = imp.ty(x).dtype;
        let numel: i64 = normalized.iter().product();
        let ones = imp.filled_const(1.0, dtype, numel);
        let shape: Vec<Dim> = normalized.iter().map(|&d| Dim::Const(d)).collect();
        let ty = TensorType::new(dtype, shape.clone());
        weight = Some(imp.push(Op::Reshape { shape }, vec![ones], ty));
    }
    let mut inputs = vec![x];
    inputs.extend(weight);
    inputs.extend(bias);
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push(Op::LayerNorm { normalized_rank: normalized.len(), eps }, inputs, ty);
    imp.bind(n, 0, v)?;
    only_first_output_used(imp, n)
}

/// `aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None,
///   Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True)`
pub(super) fn layer_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let eps = imp.float(n, "eps", Some(1e-5))?;
    layer_norm_common(imp, n, eps)
}

/// `aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight,
///   Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)`
pub(super) fn native_layer_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let eps = imp.float(n, "eps", None)?;
    layer_norm_common(imp, n, eps)
}

/// `aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
///   int[2] dilation=1, bool ceil_mode=False)`; `max_pool2d_with_indices` has the same
///   arguments and an indices output.
pub(super) fn max_pool2d(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let kernel = imp.ints_n(n, "kernel_size", &[], 2)?;
    let mut stride = imp.ints(n, "stride", &[])?;
    if stride.is_empty() {
        stride = kernel.clone(); // stride=[] means "same as the kernel"
    } else if stride.len() == 1 {
        stride = vec![stride[0]; 2];
    }
    let padding = imp.ints_n(n, "padding", &[0], 2)?;
    let dilation = imp.ints_n(n, "dilation", &[1], 2)?;
    let ceil_mode = imp.bool(n, "ceil_mode", false)?;
    let pool = |kind| Op::Pool {
        kind,
        kernel: kernel.clone(),
        stride: stride.clone(),
        padding: padding.clone(),
        dilation: dilation.clone(),
        ceil_mode,
        count_include_pad: false,
        divisor: None,
    };
    bind_max_pool(imp, n, x, pool)
}

/// Binds max pooling's values (output 0) and, when something reads them, the
/// indices of the `_with_indices` forms (output 1): one instruction each, the
/// second of kind `ArgMax`, as sort computes values and indices apart.
fn bind_max_pool(imp: &mut Importer, n: &Node, x: ValueId, pool: impl Fn(PoolKind) -> Op) -> R<()> {
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push(pool(PoolKind::Max), vec![x], ty);
    imp.bind(n, 0, v)?;
    match n.outputs.get(1) {
        Some(Arg::Tensor(name)) if imp.is_used(name) => {
            let ty = imp.out_ty(n, 1)?;
            if ty.dtype != DType::I64 {
                return invalid(format!("max pooling indices of dtype {}; expected i64", ty.dtype));
            }
            let i = imp.push(pool(PoolKind::ArgMax), vec![x], ty);
            imp.bind(n, 1, i)
        }
        _ => Ok(()),
    }
}

/// `aten::avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
///   bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None)`
pub(super) fn avg_pool2d(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let kernel = imp.ints_n(n, "kernel_size", &[], 2)?;
    let mut stride = imp.ints(n, "stride", &[])?;
    if stride.is_empty() {
        stride = kernel.clone();
    } else if stride.len() == 1 {
        stride = vec![stride[0]; 2];
    }
    let padding = imp.ints_n(n, "padding", &[0], 2)?;
    let ceil_mode = imp.bool(n, "ceil_mode", false)?;
    let count_include_pad = imp.bool(n, "count_include_pad", true)?;
    let divisor = imp.opt_int(n, "divisor_override")?;
    if divisor == Some(0) {
        return invalid("avg_pool2d divisor_override of 0");
    }
    let op = Op::Pool { kind: PoolKind::Avg, kernel, stride, padding, dilation: vec![1, 1], ceil_mode, count_include_pad, divisor };
    imp.emit(n, op, vec![x])?;
    Ok(())
}

/// `aten::adaptive_avg_pool2d(Tensor self, SymInt[2] output_size)` (and `_adaptive_avg_pool2d`)
pub(super) fn adaptive_avg_pool(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let output = imp.ints_n(n, "output_size", &[], 2)?;
    imp.emit(n, Op::AdaptiveAvgPool { output }, vec![x])?;
    Ok(())
}

/// `aten::adaptive_avg_pool1d(Tensor self, int[1] output_size)`: the 2-d
/// pool over `[.., 1, L]`, as its Core ATen form.
pub(super) fn adaptive_avg_pool1d(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let output = imp.ints_n(n, "output_size", &[], 1)?;
    let ty = imp.ty(x).clone();
    if ty.rank() < 1 {
        return invalid("adaptive_avg_pool1d of a 0-d tensor");
    }
    let mut shape = ty.shape.clone();
    shape.insert(ty.rank() - 1, Dim::Const(1));
    let x = imp.build(Op::Reshape { shape }, vec![x])?;
    let pooled = imp.build(Op::AdaptiveAvgPool { output: vec![1, output[0]] }, vec![x])?;
    let out = imp.out_ty(n, 0)?;
    imp.emit(n, Op::Reshape { shape: out.shape }, vec![pooled])?;
    Ok(())
}

/// `aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value,
///   Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *,
///   float? scale=None, bool enable_gqa=False)`
pub(super) fn attention(imp: &mut Importer, n: &Node) -> R<()> {
    let q = imp.tensor(n, "query")?;
    let k = imp.tensor(n, "key")?;
    let v = imp.tensor(n, "value")?;
    let mask = imp.opt_tensor(n, "attn_mask")?;
    if imp.float(n, "dropout_p", Some(0.0))? != 0.0 {
        return unsupported("attention dropout (dropout_p != 0)");
    }
    let causal = imp.bool(n, "is_causal", false)?;
    let scale = match imp.arg(n, "scale") {
        None => None,
        Some(_) => Some(imp.float(n, "scale", None)?),
    };
    let (k, v) = if imp.bool(n, "enable_gqa", false)? { (repeat_heads(imp, q, k)?, repeat_heads(imp, q, v)?) } else { (k, v) };
    if causal && mask.is_some() {
        return invalid("is_causal together with attn_mask");
    }
    let mut inputs = vec![q, k, v];
    inputs.extend(mask);
    imp.emit(n, Op::Attention { causal, scale }, inputs)?;
    Ok(())
}

/// `aten::avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0,
///   bool ceil_mode=False, bool count_include_pad=True)`,
/// `aten::max_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0,
///   int[1] dilation=1, bool ceil_mode=False)`: pooling over the last dim.
pub(super) fn pool1d(imp: &mut Importer, n: &Node, kind: PoolKind) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let kernel = imp.ints_n(n, "kernel_size", &[], 1)?;
    let mut stride = imp.ints(n, "stride", &[])?;
    if stride.is_empty() {
        stride = kernel.clone();
    }
    let padding = imp.ints_n(n, "padding", &[0], 1)?;
    let dilation = if kind == PoolKind::Max { imp.ints_n(n, "dilation", &[1], 1)? } else { vec![1] };
    let ceil_mode = imp.bool(n, "ceil_mode", false)?;
    let count_include_pad = kind == PoolKind::Avg && imp.bool(n, "count_include_pad", true)?;
    let pool = |kind| Op::Pool {
        kind,
        kernel: kernel.clone(),
        stride: stride.clone(),
        padding: padding.clone(),
        dilation: dilation.clone(),
        ceil_mode,
        count_include_pad,
        divisor: None,
    };
    match kind {
        PoolKind::Max => bind_max_pool(imp, n, x, pool),
        _ => imp.emit(n, pool(kind), vec![x]).map(|_| ()),
    }
}

/// `aten::group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None,
///   float eps=1e-05, bool cudnn_enabled=True)`,
/// `aten::native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C,
///   SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)`:
/// a layer norm over `[N, G, C/G * spatial]`, then the per-channel affine.
pub(super) fn group_norm(imp: &mut Importer, n: &Node, native: bool) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let groups = if native { imp.int(n, "group", None)? } else { imp.int(n, "num_groups", None)? };
    let eps = imp.float(n, "eps", Some(1e-5))?;
    let weight = imp.opt_tensor(n, "weight")?;
    let bias = imp.opt_tensor(n, "bias")?;
    let out = imp.out_ty(n, 0)?;
    let ty = imp.ty(x).clone();
    if ty.rank() < 2 {
        return invalid(format!("group norm of a rank-{} tensor", ty.rank()));
    }
    // Only the channel count must be known: the batch and spatial dims may be
    // symbolic, as the group size `C/G * H * W..` is then a product of them.
    let Some(channels) = ty.shape[1].as_const() else { return unsupported("group norm over a dynamic channel dimension") };
    if groups < 1 || channels % groups != 0 {
        return invalid(format!("group norm of {channels} channels in {groups} groups"));
    }
    let rest = ty.shape[2..].iter().fold(Dim::Const(channels / groups), |acc, d| Dim::mul(acc, d.clone()));
    let c = super::activation::compute_dtype(out.dtype);
    let xc = imp.cast(x, c);
    let grouped = imp.build(Op::Reshape { shape: vec![ty.shape[0].clone(), Dim::Const(groups), rest] }, vec![xc])?;
    let normed = imp.build(Op::LayerNorm { normalized_rank: 1, eps }, vec![grouped])?;
    let mut v = imp.build(Op::Reshape { shape: ty.shape.clone() }, vec![normed])?;
    let mut per_channel = vec![Dim::Const(channels)];
    per_channel.extend(std::iter::repeat_n(Dim::Const(1), ty.rank() - 2));
    for (t, op) in [(weight, BinaryOp::Mul), (bias, BinaryOp::Add)] {
        if let Some(t) = t {
            let t = imp.cast(t, c);
            let t = imp.build(Op::Reshape { shape: per_channel.clone() }, vec![t])?;
            v = imp.build(Op::Binary(op), vec![v, t])?;
        }
    }
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)?;
    only_first_output_used(imp, n)
}

/// `aten::rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None)`:
/// `x * rsqrt(mean(x², last dims) + eps) * weight`; eps defaults to the dtype's epsilon.
pub(super) fn rms_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let normalized = imp.ints(n, "normalized_shape", &[])?;
    let weight = imp.opt_tensor(n, "weight")?;
    let out = imp.out_ty(n, 0)?;
    let eps = match imp.arg(n, "eps") {
        Some(_) => imp.float(n, "eps", None)?,
        None => match out.dtype {
            kiln_ir::DType::F64 => f64::EPSILON,
            kiln_ir::DType::F16 => 0.0009765625,
            kiln_ir::DType::BF16 => 0.0078125,
            _ => f32::EPSILON as f64,
        },
    };
    let rank = imp.ty(x).rank();
    if normalized.len() > rank {
        return invalid("rms_norm normalizes more dims than the input has");
    }
    let c = super::activation::compute_dtype(out.dtype);
    let xc = imp.cast(x, c);
    let sq = imp.build(Op::Binary(BinaryOp::Mul), vec![xc, xc])?;
    let axes: Vec<usize> = (rank - normalized.len()..rank).collect();
    let ms = imp.build(Op::Reduce { kind: kiln_ir::ReduceKind::Mean, axes, keep_dims: true }, vec![sq])?;
    let ms = imp.with_scalar(BinaryOp::Add, ms, eps)?;
    let r = imp.build(Op::Unary(kiln_ir::UnaryOp::Rsqrt), vec![ms])?;
    let mut v = imp.build(Op::Binary(BinaryOp::Mul), vec![xc, r])?;
    if let Some(w) = weight {
        // torch rounds the normalized value to the input dtype before the weight.
        v = imp.cast(v, out.dtype);
        let w = imp.cast(w, out.dtype);
        v = imp.build(Op::Binary(BinaryOp::Mul), vec![v, w])?;
    }
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// Grouped-query attention: key/value `[.., Hkv, S, E]` with each head used by
/// `Hq / Hkv` query heads, as `[.., Hq, S, E]` (torch's repeat_interleave).
fn repeat_heads(imp: &mut Importer, q: ValueId, kv: ValueId) -> R<ValueId> {
    let (qt, t) = (imp.ty(q).clone(), imp.ty(kv).clone());
    let r = t.rank();
    if r < 3 || qt.rank() != r {
        return unsupported("grouped-query attention on inputs of rank < 3");
    }
    let (Some(hq), Some(hkv)) = (qt.shape[r - 3].as_const(), t.shape[r - 3].as_const()) else {
        return unsupported("grouped-query attention with dynamic head counts");
    };
    if hkv == hq {
        return Ok(kv);
    }
    if hkv == 0 || hq % hkv != 0 {
        return invalid(format!("{hq} query heads cannot share {hkv} key/value heads"));
    }
    let mut split = t.shape[..r - 2].to_vec();
    split.push(Dim::Const(1));
    split.extend(t.shape[r - 2..].iter().cloned());
    let s = imp.build(Op::Reshape { shape: split.clone() }, vec![kv])?;
    split[r - 2] = Dim::Const(hq / hkv);
    let e = imp.build(Op::Expand { shape: split }, vec![s])?;
    let mut merged = t.shape.clone();
    merged[r - 3] = Dim::Const(hq);
    imp.build(Op::Reshape { shape: merged }, vec![e])
}

/// `aten::avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
///   bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None)`,
/// `max_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
///   int[3] dilation=1, bool ceil_mode=False)`, `max_pool3d_with_indices`.
pub(super) fn pool3d(imp: &mut Importer, n: &Node, kind: PoolKind) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let kernel = imp.ints_n(n, "kernel_size", &[], 3)?;
    let mut stride = imp.ints(n, "stride", &[])?;
    if stride.is_empty() {
        stride = kernel.clone();
    } else if stride.len() == 1 {
        stride = vec![stride[0]; 3];
    }
    let padding = imp.ints_n(n, "padding", &[0], 3)?;
    let dilation = if kind == PoolKind::Max { imp.ints_n(n, "dilation", &[1], 3)? } else { vec![1; 3] };
    let ceil_mode = imp.bool(n, "ceil_mode", false)?;
    let count_include_pad = kind == PoolKind::Avg && imp.bool(n, "count_include_pad", true)?;
    let divisor = if kind == PoolKind::Avg { imp.opt_int(n, "divisor_override")? } else { None };
    if divisor == Some(0) {
        return invalid("avg_pool3d divisor_override of 0");
    }
    let pool = |kind| Op::Pool {
        kind,
        kernel: kernel.clone(),
        stride: stride.clone(),
        padding: padding.clone(),
        dilation: dilation.clone(),
        ceil_mode,
        count_include_pad,
        divisor,
    };
    match kind {
        PoolKind::Max => bind_max_pool(imp, n, x, pool),
        _ => imp.emit(n, pool(kind), vec![x]).map(|_| ()),
    }
}

/// `aten::_adaptive_avg_pool3d(Tensor self, SymInt[3] output_size)`, `adaptive_avg_pool3d`
pub(super) fn adaptive_avg_pool3d(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let output = imp.ints_n(n, "output_size", &[], 3)?;
    imp.emit(n, Op::AdaptiveAvgPool { output }, vec![x])?;
    Ok(())
}
