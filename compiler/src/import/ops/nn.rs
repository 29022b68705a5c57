//! Composite neural-network ops kept whole when a dedicated kernel exists.

use crate::import::importer::{invalid, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, Dim, Op, PoolKind, TensorType, ValueId};

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
    let mut product = imp.push(Op::MatMul, vec![a, b], out.clone());
    if alpha != 1.0 {
        let k = imp.scalar_const(Scalar::Float(alpha), out.dtype);
        product = imp.push(Op::Binary(BinaryOp::Mul), vec![product, k], out.clone());
    }
    // beta = 0 ignores `self` entirely (even NaNs in it), as torch does.
    let v = if beta == 0.0 {
        product
    } else {
        let mut bias = bias;
        if beta != 1.0 {
            let k = imp.scalar_const(Scalar::Float(beta), out.dtype);
            let ty = imp.ty(bias).clone();
            bias = imp.push(Op::Binary(BinaryOp::Mul), vec![bias, k], ty);
        }
        imp.push(Op::Binary(BinaryOp::Add), vec![product, bias], out)
    };
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
        return unsupported("transposed convolution");
    }
    conv_common(imp, n, Padding::Explicit)
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
    let mut inputs = vec![x, w];
    inputs.extend(bias);
    imp.emit(n, Op::Conv { stride, padding, dilation, groups }, inputs)?;
    Ok(())
}

/// Channel count (axis 1) of a normalised tensor, needed to build default operands.
fn channels(imp: &Importer, x: ValueId) -> R<i64> {
    match imp.ty(x).shape.get(1).and_then(Dim::as_const) {
        Some(c) => Ok(c),
        None => unsupported("batch norm over a dynamic channel dimension without weight/bias"),
    }
}

fn batch_norm_common(imp: &mut Importer, n: &Node, eps: f64) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let dtype = imp.ty(x).dtype;
    let (Some(mean), Some(var)) = (imp.opt_tensor(n, "running_mean")?, imp.opt_tensor(n, "running_var")?) else {
        return unsupported("batch norm without running statistics (batch statistics)");
    };
    let weight = match imp.opt_tensor(n, "weight")? {
        Some(w) => w,
        None => {
            let c = channels(imp, x)?;
            imp.filled_const(1.0, dtype, c)
        }
    };
    let bias = match imp.opt_tensor(n, "bias")? {
        Some(b) => b,
        None => {
            let c = channels(imp, x)?;
            imp.filled_const(0.0, dtype, c)
        }
    };
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
    if imp.bool(n, "training", false)? {
        return unsupported("batch norm with training=True (batch statistics)");
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
///   arguments and an indices output that must be unused.
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
    let ty = imp.out_ty(n, 0)?;
    let op = Op::Pool { kind: PoolKind::Max, kernel, stride, padding, dilation, ceil_mode, count_include_pad: false };
    let v = imp.push(op, vec![x], ty);
    imp.bind(n, 0, v)?;
    only_first_output_used(imp, n)
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
    if imp.opt_int(n, "divisor_override")?.is_some() {
        return unsupported("avg_pool2d with divisor_override");
    }
    let op = Op::Pool { kind: PoolKind::Avg, kernel, stride, padding, dilation: vec![1, 1], ceil_mode, count_include_pad };
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
    if imp.bool(n, "enable_gqa", false)? {
        return unsupported("grouped-query attention (enable_gqa=True)");
    }
    if causal && mask.is_some() {
        return invalid("is_causal together with attn_mask");
    }
    let mut inputs = vec![q, k, v];
    inputs.extend(mask);
    imp.emit(n, Op::Attention { causal, scale }, inputs)?;
    Ok(())
}
