//! Composite neural-network ops kept whole when a dedicated kernel exists.

use super::conv_transpose_slow::{conv_transpose_slow_path, takes_torch_slow_path, Geometry};
use crate::import::importer::{checked, invalid, table_len, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, DType, Dim, Op, PoolKind, TensorType, ValueId};

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
    let (a, b, bias) =
        if reduced { (imp.cast(a, compute), imp.cast(b, compute), imp.cast(bias, compute)) } else { (a, b, bias) };
    let wide = TensorType::new(compute, out.shape.clone());
    let mut product = imp.push_typed(Op::MatMul, vec![a, b], wide.clone());
    if alpha != 1.0 {
        let k = imp.scalar_const(Scalar::Float(alpha), compute);
        product = imp.push_typed(Op::Binary(BinaryOp::Mul), vec![product, k], wide.clone());
    }
    // beta = 0 ignores `self` entirely (even NaNs in it), as torch does.
    let v = if beta == 0.0 {
        product
    } else {
        let mut bias = bias;
        if beta != 1.0 {
            let k = imp.scalar_const(Scalar::Float(beta), compute);
            let ty = imp.ty(bias).clone();
            bias = imp.push_typed(Op::Binary(BinaryOp::Mul), vec![bias, k], ty);
        }
        imp.push_typed(Op::Binary(BinaryOp::Add), vec![product, bias], wide)
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
    let Some(wshape) = imp.ty(w).static_shape() else {
        return unsupported("transposed convolution with a dynamic weight shape");
    };
    let out = imp.out_ty(n, 0)?;
    let (x, unbatched) = unsqueeze_batch(imp, x, k)?;
    let geo =
        Geometry { stride: &stride, padding: &padding, output_padding: &output_padding, dilation: &dilation, groups };
    if takes_torch_slow_path(imp.ty(x).dtype, &geo) {
        if let Some(v) = conv_transpose_slow_path(imp, x, w, bias, &geo)? {
            let v = if unbatched { imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out) } else { v };
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
    let what = "transposed convolution geometry";
    for i in 0..k {
        let span = checked(what, dilation[i].checked_mul(wshape[2 + i] - 1))?;
        lo[2 + i] = checked(what, span.checked_sub(padding[i]))?;
        hi[2 + i] = checked(what, lo[2 + i].checked_add(output_padding[i]))?;
        interior[2 + i] = checked(what, stride[i].checked_sub(1))?;
    }
    let spread = imp.push(Op::Pad { lo, hi, interior, mode: kiln_ir::PadMode::Constant, value: 0.0 }, vec![x])?;
    // [Cin, Cout/g, k..] -> [g, Cin/g, Cout/g, k..] -> [g, Cout/g, Cin/g, k..] -> [Cout, Cin/g, k..]
    let dims = |v: &[i64]| v.iter().map(|&d| Dim::Const(d)).collect::<Vec<_>>();
    let mut grouped = vec![groups, cin / groups, cout_g];
    grouped.extend(&wshape[2..]);
    let wg = imp.push(Op::Reshape { shape: dims(&grouped) }, vec![w])?;
    let mut perm: Vec<usize> = vec![0, 2, 1];
    perm.extend(3..3 + k);
    let wp = imp.push(Op::Permute { perm }, vec![wg])?;
    let mut flat = vec![checked(what, groups.checked_mul(cout_g))?, cin / groups];
    flat.extend(&wshape[2..]);
    let wf = imp.push(Op::Reshape { shape: dims(&flat) }, vec![wp])?;
    let wflip = imp.push(Op::Flip { axes: (2..2 + k).collect() }, vec![wf])?;
    let mut inputs = vec![spread, wflip];
    inputs.extend(bias);
    let conv = Op::Conv { stride: vec![1; k], padding: vec![0; k], dilation, groups };
    let v = imp.push(conv, inputs)?;
    let v = if unbatched { imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out) } else { v };
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
    let v = imp.push_typed(Op::Reshape { shape: shape.clone() }, vec![x], TensorType::new(ty.dtype, shape));
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
    // Padding the convolution applies on both sides of each spatial axis, and
    // what 'same' needs past that on the high side only.
    let (padding, extra_hi) = match padding_mode {
        Padding::Explicit => (imp.ints_n(n, "padding", &[0], k)?, vec![0; k]),
        Padding::Valid => (vec![0; k], vec![0; k]),
        Padding::Same => {
            let kernel = imp.ty(w).static_shape().map(|s| s[2..].to_vec());
            let Some(kernel) = kernel else { return unsupported("padding='same' with a dynamic kernel") };
            // torch's `_convolution_same`: `total = dilation * (kernel - 1)`,
            // `total / 2` before and the rest after; an odd total puts the
            // extra element after, which a constant pad ahead of the
            // convolution adds (as torch's own constant_pad_nd does).
            let (mut pads, mut extra) = (Vec::with_capacity(k), Vec::with_capacity(k));
            for (&ks, &d) in kernel.iter().zip(&dilation) {
                let total = checked("padding='same'", d.checked_mul(ks - 1))?;
                pads.push(total / 2);
                extra.push(total % 2);
            }
            (pads, extra)
        }
    };
    let out = imp.out_ty(n, 0)?;
    let (x, unbatched) = unsqueeze_batch(imp, x, k)?;
    let x = if extra_hi.iter().any(|&p| p != 0) {
        let mut hi = vec![0; 2];
        hi.extend(extra_hi);
        let pad =
            Op::Pad { lo: vec![0; k + 2], hi, interior: vec![0; k + 2], mode: kiln_ir::PadMode::Constant, value: 0.0 };
        imp.push(pad, vec![x])?
    } else {
        x
    };
    let mut inputs = vec![x, w];
    inputs.extend(bias);
    let op = Op::Conv { stride, padding, dilation, groups };
    if unbatched {
        let v = imp.push(op, inputs)?;
        let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
        return imp.bind(n, 0, v);
    }
    imp.emit(n, op, inputs)?;
    Ok(())
}

fn layer_norm_common(imp: &mut Importer, n: &Node, eps: f64) -> R<()> {
    let x = imp.tensor(n, "input")?;
    let normalized = imp.ints(n, "normalized_shape", &[])?;
    let mut weight = imp.opt_tensor(n, "weight")?;
    let bias = imp.opt_tensor(n, "bias")?;
    if weight.is_none() && bias.is_some() {
        // The IR's optional operands are trailing: a bias needs a weight.
        let dtype = imp.ty(x).dtype;
        let numel = table_len("layer_norm's default weight", &normalized)? as i64;
        let ones = imp.filled_const(1.0, dtype, numel)?;
        let shape: Vec<Dim> = normalized.iter().map(|&d| Dim::Const(d)).collect();
        let ty = TensorType::new(dtype, shape.clone());
        weight = Some(imp.push_typed(Op::Reshape { shape }, vec![ones], ty));
    }
    let mut inputs = vec![x];
    inputs.extend(weight);
    inputs.extend(bias);
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::LayerNorm { normalized_rank: normalized.len(), eps }, inputs, ty);
    imp.bind(n, 0, v)?;
    let rank = imp.ty(x).rank();
    let axes: Vec<usize> = (rank.saturating_sub(normalized.len())..rank).collect();
    bind_norm_stats(imp, n, x, axes, eps)
}

/// `native_layer_norm`/`native_group_norm`'s outputs 1 and 2, when read:
/// the mean and `1/sqrt(biased variance + eps)` of `x` over `axes`, in the
/// math dtype (f32 for f16/bf16), shaped and cast as the program declares.
fn bind_norm_stats(imp: &mut Importer, n: &Node, x: ValueId, axes: Vec<usize>, eps: f64) -> R<()> {
    let names: Vec<String> = n.outputs.iter().flat_map(crate::import::importer::output_names).collect();
    if !names.iter().skip(1).take(2).any(|name| imp.is_used(name)) {
        return Ok(());
    }
    let c = super::activation::compute_dtype(imp.ty(x).dtype);
    let x = imp.cast(x, c);
    let mean =
        imp.push(Op::Reduce { kind: kiln_ir::ReduceKind::Mean, axes: axes.clone(), keep_dims: true }, vec![x])?;
    let centred = imp.push(Op::Binary(BinaryOp::Sub), vec![x, mean])?;
    let square = imp.push(Op::Binary(BinaryOp::Mul), vec![centred, centred])?;
    let var = imp.push(Op::Reduce { kind: kiln_ir::ReduceKind::Mean, axes, keep_dims: true }, vec![square])?;
    let var = imp.with_scalar(BinaryOp::Add, var, eps)?;
    let rstd = imp.push(Op::Unary(kiln_ir::UnaryOp::Rsqrt), vec![var])?;
    for (i, v) in [(1, mean), (2, rstd)] {
        if names.get(i).is_some_and(|name| imp.is_used(name)) {
            let out = imp.out_ty(n, i)?;
            let v = imp.cast(v, out.dtype);
            let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out);
            imp.bind(n, i, v)?;
        }
    }
    Ok(())
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

/// A pooling op's `stride`: `[]` means "same as the kernel" and one value
/// stands for every pooled dim.
fn pool_stride(imp: &mut Importer, n: &Node, kernel: &[i64]) -> R<Vec<i64>> {
    let stride = imp.ints(n, "stride", &[])?;
    Ok(match stride.as_slice() {
        [] => kernel.to_vec(),
        [s] => vec![*s; kernel.len()],
        _ => stride,
    })
}

/// `aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
///   int[2] dilation=1, bool ceil_mode=False)`; `max_pool2d_with_indices` has the same
///   arguments and an indices output.
pub(super) fn max_pool2d(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let kernel = imp.ints_n(n, "kernel_size", &[], 2)?;
    let stride = pool_stride(imp, n, &kernel)?;
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
        layout: kiln_ir::Layout::ChannelsFirst,
    };
    bind_max_pool(imp, n, x, pool)
}

/// Binds max pooling's values (output 0) and, when something reads them, the
/// indices of the `_with_indices` forms (output 1): one instruction each, the
/// second of kind `ArgMax`, as sort computes values and indices apart.
fn bind_max_pool(imp: &mut Importer, n: &Node, x: ValueId, pool: impl Fn(PoolKind) -> Op) -> R<()> {
    let ty = imp.out_ty(n, 0)?;
    let v = imp.push_typed(pool(PoolKind::Max), vec![x], ty);
    imp.bind(n, 0, v)?;
    match n.outputs.get(1) {
        Some(Arg::Tensor(name)) if imp.is_used(name) => {
            let ty = imp.out_ty(n, 1)?;
            if ty.dtype != DType::I64 {
                return invalid(format!("max pooling indices of dtype {}; expected i64", ty.dtype));
            }
            let i = imp.push_typed(pool(PoolKind::ArgMax), vec![x], ty);
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
    let stride = pool_stride(imp, n, &kernel)?;
    let padding = imp.ints_n(n, "padding", &[0], 2)?;
    let ceil_mode = imp.bool(n, "ceil_mode", false)?;
    let count_include_pad = imp.bool(n, "count_include_pad", true)?;
    let divisor = imp.opt_int(n, "divisor_override")?;
    if divisor == Some(0) {
        return invalid("avg_pool2d divisor_override of 0");
    }
    let op = Op::Pool {
        kind: PoolKind::Avg,
        kernel,
        stride,
        padding,
        dilation: vec![1, 1],
        ceil_mode,
        count_include_pad,
        divisor,
        layout: kiln_ir::Layout::ChannelsFirst,
    };
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
    let x = imp.push(Op::Reshape { shape }, vec![x])?;
    let pooled = imp.push(Op::AdaptiveAvgPool { output: vec![1, output[0]] }, vec![x])?;
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
    let (k, v) =
        if imp.bool(n, "enable_gqa", false)? { (repeat_heads(imp, q, k)?, repeat_heads(imp, q, v)?) } else { (k, v) };
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
    let stride = pool_stride(imp, n, &kernel)?;
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
        layout: kiln_ir::Layout::ChannelsFirst,
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
    let Some(channels) = ty.shape[1].as_const() else {
        return unsupported("group norm over a dynamic channel dimension");
    };
    if groups < 1 || channels % groups != 0 {
        return invalid(format!("group norm of {channels} channels in {groups} groups"));
    }
    let rest = ty.shape[2..].iter().fold(Dim::Const(channels / groups), |acc, d| Dim::mul(acc, d.clone()));
    let c = super::activation::compute_dtype(out.dtype);
    let xc = imp.cast(x, c);
    let grouped = imp.push(Op::Reshape { shape: vec![ty.shape[0].clone(), Dim::Const(groups), rest] }, vec![xc])?;
    let normed = imp.push(Op::LayerNorm { normalized_rank: 1, eps }, vec![grouped])?;
    let mut v = imp.push(Op::Reshape { shape: ty.shape.clone() }, vec![normed])?;
    let mut per_channel = vec![Dim::Const(channels)];
    per_channel.extend(std::iter::repeat_n(Dim::Const(1), ty.rank() - 2));
    for (t, op) in [(weight, BinaryOp::Mul), (bias, BinaryOp::Add)] {
        if let Some(t) = t {
            let t = imp.cast(t, c);
            let t = imp.push(Op::Reshape { shape: per_channel.clone() }, vec![t])?;
            v = imp.push(Op::Binary(op), vec![v, t])?;
        }
    }
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)?;
    bind_norm_stats(imp, n, grouped, vec![2], eps)
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
    let sq = imp.push(Op::Binary(BinaryOp::Mul), vec![xc, xc])?;
    let axes: Vec<usize> = (rank - normalized.len()..rank).collect();
    let ms = imp.push(Op::Reduce { kind: kiln_ir::ReduceKind::Mean, axes, keep_dims: true }, vec![sq])?;
    let ms = imp.with_scalar(BinaryOp::Add, ms, eps)?;
    let r = imp.push(Op::Unary(kiln_ir::UnaryOp::Rsqrt), vec![ms])?;
    let mut v = imp.push(Op::Binary(BinaryOp::Mul), vec![xc, r])?;
    if let Some(w) = weight {
        // torch rounds the normalized value to the input dtype before the weight.
        v = imp.cast(v, out.dtype);
        let w = imp.cast(w, out.dtype);
        v = imp.push(Op::Binary(BinaryOp::Mul), vec![v, w])?;
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
    let s = imp.push(Op::Reshape { shape: split.clone() }, vec![kv])?;
    split[r - 2] = Dim::Const(hq / hkv);
    let e = imp.push(Op::Expand { shape: split }, vec![s])?;
    let mut merged = t.shape.clone();
    merged[r - 3] = Dim::Const(hq);
    imp.push(Op::Reshape { shape: merged }, vec![e])
}

/// `aten::avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
///   bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None)`,
/// `max_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
///   int[3] dilation=1, bool ceil_mode=False)`, `max_pool3d_with_indices`.
pub(super) fn pool3d(imp: &mut Importer, n: &Node, kind: PoolKind) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let kernel = imp.ints_n(n, "kernel_size", &[], 3)?;
    let stride = pool_stride(imp, n, &kernel)?;
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
        layout: kiln_ir::Layout::ChannelsFirst,
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
