//! Channels-last layout for chains of 2-d convolutions (CPU target).
//!
//! torch's convolutions are channels-first (`N, C, H, W`); kiln's fastest
//! convolution kernels read and write pixels as contiguous channel vectors
//! (`N, H, W, C`: the depthwise loops vectorise over channels, a 1×1
//! convolution is one GEMM over the pixels, the tap GEMMs need no
//! transposition). This pass gives every f32 2-d `conv` / `conv_fused` the
//! channels-last layout (a `quant_conv` too: see [`channels_last_op`]) and
//! keeps activations channels-last from one convolution to the next:
//!
//! - each convolution becomes a channels-last `conv_fused` (a plain `conv`
//!   one with an empty epilogue) whose input and residual are the
//!   channels-last forms of its operands, followed by a `permute` of its
//!   result back to channels-first for whatever else reads it;
//! - the channels-last form of a value is the convolution result it was
//!   permuted from, or else one `permute` of the value (made once, shared by
//!   every convolution that reads it): the graph's input, a pooling result;
//! - permutes back that nothing reads any more (a convolution read by
//!   convolutions only) are left to DCE;
//! - only convolutions a channels-last kernel runs directly change:
//!   depthwise, pointwise, and dense ones with at least 32 input channels
//!   or a short reduction (an RGB stem: see [`MIN_DENSE_CHANNELS`]).
//!
//! - a 2-d max or average pool of a value with a channels-last form pools
//!   that form (ResNet's stem pool), and so do elementwise ops and the
//!   classifier's spatial mean (below).
//!
//! So transpositions remain only at a run's edges: the model input, and
//! before ops that stay channels-first (adaptive pooling, flatten). Values and results are unchanged: a channels-last convolution
//! computes each output element with the same operations as the
//! channels-first kernel (the kernels' tests compare them bit for bit), and
//! a permute moves bytes. CPU target only (its kernels have the layout).

use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{DType, Dim, Epilogue, Graph, Layout, LocId, NodeId, Op, PoolKind, ReduceKind, TensorType, ValueId};
use std::collections::HashMap;

/// `N, C, H, W` → `N, H, W, C`.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
/// `N, H, W, C` → `N, C, H, W`.
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];

pub fn channels_last(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "layout")?;
    if opts.target.target != crate::Target::Cpu {
        return Ok(Changed::No);
    }
    // The channels-last form of each channels-first value that has one.
    let mut nhwc: HashMap<ValueId, ValueId> = HashMap::new();
    // The nodes that read each value, as scheduled before the rewrite (the
    // nodes not yet visited still read the original values).
    let mut users: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
    for &n in &g.order {
        for &v in &g.nodes[n].inputs {
            users.entry(v).or_default().push(n);
        }
    }
    rewrite_in_order(g, |g, n| {
        if let Some(y) = spatial_reduce(g, n, &nhwc) {
            return Ok(Rewrite::Replace(vec![y]));
        }
        if let Some(back) = elementwise(g, n, &mut nhwc).or_else(|| pool(g, n, &mut nhwc)) {
            return Ok(Rewrite::Replace(vec![back]));
        }
        let Some(conv) = channels_last_op(g, n, &users) else { return Ok(Rewrite::Keep) };
        let node = g.nodes[n].clone();
        let residual = match &conv {
            Op::ConvFused { epilogue, .. } => epilogue.residual_operand(),
            // After the scales.
            Op::QuantConv { epilogue, .. } => epilogue.residual_operand().map(|i| i + 1),
            _ => None,
        };
        let inputs: Vec<ValueId> = node
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &v)| if i == 0 || Some(i) == residual { nhwc_of(g, &mut nhwc, v, node.loc) } else { v })
            .collect();
        let out_ty = g.ty(node.outputs[0]).clone();
        let y = g.push(conv, inputs, permuted(&out_ty, &TO_NHWC), node.loc);
        let back = g.push(Op::Permute { perm: TO_NCHW.to_vec() }, vec![y], out_ty, node.loc);
        nhwc.insert(back, y);
        Ok(Rewrite::Replace(vec![back]))
    })
}

/// Fewest input channels of a dense convolution wider than 1×1 that goes
/// channels-last whatever its kernel size: the kernels' tap GEMMs take 32
/// or more (`kiln_kernels`' `conv_taps::MIN_CIN`). With fewer (an RGB stem)
/// the channels-last kernel runs an im2col GEMM over the output pixels, a
/// few output rows per work item gathered and multiplied while in cache,
/// when the reduction `Cin·kh·kw` is at most [`MAX_IM2COL_K`]: that beat
/// the channels-first GEMM plus the permute of its result (which scaled
/// poorly over threads) on MobileNetV2's and ResNet-18's stems, and leaves
/// one permute of the 3-channel model input instead.
const MIN_DENSE_CHANNELS: i64 = 32;

/// Longest reduction of a dense convolution with fewer than
/// [`MIN_DENSE_CHANNELS`] input channels that goes channels-last
/// (`kiln_kernels`' `conv_nhwc::MAX_IM2COL_K`; longer ones would run there
/// through transpositions).
const MAX_IM2COL_K: i64 = 1024;

/// The channels-last convolution node `n` becomes, if it is an f32 2-d
/// channels-first `conv` or `conv_fused` that a channels-last kernel runs
/// directly: depthwise, pointwise (1×1 without padding), dense with
/// enough input channels, or dense with a short reduction (an RGB stem)
/// whose result feeds a channels-last convolution (directly or through a
/// pool): converting it trades the permute of its result for one of its
/// few-channel input, which only pays when the result stays channels-last.
fn channels_last_op(g: &Graph, n: NodeId, users: &HashMap<ValueId, Vec<NodeId>>) -> Option<Op> {
    let node = &g.nodes[n];
    let stem =
        || matches!(node.op, Op::Conv { .. } | Op::ConvFused { .. }) && feeds_channels_last(g, node.outputs[0], users);
    let direct = |padding: &[i64], groups: i64| {
        let (x, w) = (g.ty(node.inputs[0]), g.ty(node.inputs[1]));
        let dim = |t: &TensorType, i: usize| t.shape.get(i).and_then(|d| d.as_const());
        let (cin, cin_g, cout) = (dim(x, 1), dim(w, 1), dim(w, 0));
        let pointwise = dim(w, 2) == Some(1) && dim(w, 3) == Some(1) && padding.iter().all(|&p| p == 0);
        let depthwise = cin_g == Some(1) && cin == Some(groups) && cout == Some(groups);
        let short_k = match (cin, dim(w, 2), dim(w, 3)) {
            (Some(c), Some(kh), Some(kw)) => c * kh * kw <= MAX_IM2COL_K,
            _ => false,
        };
        depthwise || groups == 1 && (pointwise || cin.is_some_and(|c| c >= MIN_DENSE_CHANNELS) || short_k && stem())
    };
    let f32_2d = |stride: &[i64], padding: &[i64], groups: i64| {
        stride.len() == 2
            && node.outputs.len() == 1
            && node.inputs.iter().take(2).all(|&v| g.ty(v).dtype == DType::F32 && g.ty(v).rank() == 4)
            && direct(padding, groups)
    };
    match &node.op {
        Op::Conv { stride, padding, dilation, groups } if f32_2d(stride, padding, *groups) => Some(Op::ConvFused {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups: *groups,
            epilogue: Epilogue { bias: node.inputs.len() == 3, ..Epilogue::default() },
            layout: Layout::ChannelsLast,
        }),
        Op::ConvFused { stride, padding, dilation, groups, epilogue, layout: Layout::ChannelsFirst }
            if f32_2d(stride, padding, *groups) =>
        {
            Some(Op::ConvFused {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups: *groups,
                epilogue: *epilogue,
                layout: Layout::ChannelsLast,
            })
        }
        // A quantized convolution: with int8 activations the integer kernel
        // gathers channels-last windows for any dense one; weight-only ones
        // run the f32 kernels, so go where those would.
        Op::QuantConv { stride, padding, groups, layout: Layout::ChannelsFirst, dynamic, act_scale, .. }
            if stride.len() == 2
                && node.outputs.len() == 1
                && g.ty(node.inputs[0]).rank() == 4
                && (((*dynamic || act_scale.is_some()) && *groups == 1) || direct(padding, *groups)) =>
        {
            let mut op = node.op.clone();
            if let Op::QuantConv { layout, .. } = &mut op {
                *layout = Layout::ChannelsLast;
            }
            Some(op)
        }
        _ => None,
    }
}

/// Node `n` run channels-last, if it is elementwise (see the module
/// comment) with an f32 `[N, C, H, W]` result: the op on the channels-last
/// forms of its operands, and the permute back (returned; the pair goes
/// into `nhwc`). The same elements meet in each operation, so the same bits.
fn elementwise(g: &mut Graph, n: NodeId, nhwc: &mut HashMap<ValueId, ValueId>) -> Option<ValueId> {
    let node = g.nodes[n].clone();
    if !matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Clamp { .. } | Op::Fused { .. }) || node.outputs.len() != 1
    {
        return None;
    }
    let out_ty = g.ty(node.outputs[0]).clone();
    if out_ty.dtype != DType::F32 || out_ty.rank() != 4 {
        return None;
    }
    let one = |d: &Dim| d.as_const() == Some(1);
    // Each operand's channels-last form: a value, or the shape to reshape
    // a per-channel operand to. Decided for all before the graph changes.
    let mut forms: Vec<(ValueId, Option<Vec<Dim>>)> = Vec::with_capacity(node.inputs.len());
    let mut any = false;
    for &v in &node.inputs {
        let ty = g.ty(v);
        if let Some(&y) = nhwc.get(&v) {
            // Full size, or broadcast: the same permutation as the result's.
            any |= ty.shape == out_ty.shape;
            forms.push((y, None));
        } else if ty.shape.iter().all(one) {
            forms.push((v, None));
        } else if ty.rank() == 4 && one(&ty.shape[2]) && one(&ty.shape[3]) {
            forms.push((v, Some(vec![ty.shape[0].clone(), Dim::Const(1), Dim::Const(1), ty.shape[1].clone()])));
        } else if ty.rank() == 3 && one(&ty.shape[1]) && one(&ty.shape[2]) {
            forms.push((v, Some(vec![Dim::Const(1), Dim::Const(1), ty.shape[0].clone()])));
        } else {
            return None;
        }
    }
    if !any {
        return None;
    }
    let inputs: Vec<ValueId> = forms
        .into_iter()
        .map(|(v, shape)| match shape {
            Some(shape) => {
                let ty = TensorType::new(g.ty(v).dtype, shape.clone());
                g.push(Op::Reshape { shape }, vec![v], ty, node.loc)
            }
            None => v,
        })
        .collect();
    let y = g.push(node.op.clone(), inputs, permuted(&out_ty, &TO_NHWC), node.loc);
    let back = g.push(Op::Permute { perm: TO_NCHW.to_vec() }, vec![y], out_ty, node.loc);
    nhwc.insert(back, y);
    Some(back)
}

/// Whether a reader of `v` goes channels-last: a convolution the pass
/// converts, or a 2-d max or average pool whose result feeds one.
fn feeds_channels_last(g: &Graph, v: ValueId, users: &HashMap<ValueId, Vec<NodeId>>) -> bool {
    users.get(&v).into_iter().flatten().any(|&u| match &g.nodes[u].op {
        Op::Pool { kind: PoolKind::Max | PoolKind::Avg, kernel, layout: Layout::ChannelsFirst, .. } => {
            kernel.len() == 2 && g.nodes[u].outputs.len() == 1 && feeds_channels_last(g, g.nodes[u].outputs[0], users)
        }
        Op::Conv { .. } | Op::ConvFused { .. } => {
            g.nodes[u].inputs.first() == Some(&v) && channels_last_op(g, u, users).is_some()
        }
        _ => false,
    })
}

/// Node `n` run channels-last, if it is a 2-d max or average pool (values
/// only) of an f32 value that has a channels-last form: the pool of that
/// form, and the permute back (returned; the pair goes into `nhwc`).
/// ResNet's stem max pool: the stem's result is no longer permuted back to
/// be pooled, and the next convolution reads the pooled pixels directly.
/// The kernel folds each channel's taps in the channels-first order: the
/// same bits.
fn pool(g: &mut Graph, n: NodeId, nhwc: &mut HashMap<ValueId, ValueId>) -> Option<ValueId> {
    let node = &g.nodes[n];
    let Op::Pool { kind: PoolKind::Max | PoolKind::Avg, kernel, layout: Layout::ChannelsFirst, .. } = &node.op else {
        return None;
    };
    let (&v, &[out]) = (node.inputs.first()?, &node.outputs[..]) else { return None };
    let y = *nhwc.get(&v)?;
    if kernel.len() != 2 || g.ty(v).dtype != DType::F32 || g.ty(v).rank() != 4 {
        return None;
    }
    let mut op = node.op.clone();
    if let Op::Pool { layout, .. } = &mut op {
        *layout = Layout::ChannelsLast;
    }
    let (loc, out_ty) = (node.loc, g.ty(out).clone());
    let pooled = g.push(op, vec![y], permuted(&out_ty, &TO_NHWC), loc);
    let back = g.push(Op::Permute { perm: TO_NCHW.to_vec() }, vec![pooled], out_ty, loc);
    nhwc.insert(back, pooled);
    Some(back)
}

/// A float sum or mean over axes 2, 3 of a value with a channels-last form
/// `y`, rewritten to read `y` (axes 1, 2): the reduced elements of each
/// output are the same, in the same (H, W) order. Its kept-dims result
/// `[N, C]` is reshaped to the original type when that keeps dims.
fn spatial_reduce(g: &mut Graph, n: NodeId, nhwc: &HashMap<ValueId, ValueId>) -> Option<ValueId> {
    let node = &g.nodes[n];
    let Op::Reduce { kind: kind @ (ReduceKind::Sum | ReduceKind::Mean), axes, keep_dims } = &node.op else {
        return None;
    };
    let (kind, keep_dims) = (*kind, *keep_dims);
    let (v, out) = (*node.inputs.first()?, *node.outputs.first()?);
    let y = *nhwc.get(&v)?;
    if axes != &[2, 3] || g.ty(v).dtype != DType::F32 || g.ty(v).rank() != 4 {
        return None;
    }
    let loc = node.loc;
    let out_ty = g.ty(out).clone();
    let x_ty = g.ty(v).clone();
    let flat = TensorType::new(x_ty.dtype, vec![x_ty.shape[0].clone(), x_ty.shape[1].clone()]);
    let r = g.push(Op::Reduce { kind, axes: vec![1, 2], keep_dims: false }, vec![y], flat, loc);
    if !keep_dims {
        return Some(r);
    }
    let shape: Vec<Dim> = out_ty.shape.clone();
    Some(g.push(Op::Reshape { shape }, vec![r], out_ty, loc))
}

/// The channels-last form of `v` (`[N, C, H, W]`): the convolution result
/// it is the permute of, or one permute of it, made once.
fn nhwc_of(g: &mut Graph, nhwc: &mut HashMap<ValueId, ValueId>, v: ValueId, loc: Option<LocId>) -> ValueId {
    if let Some(&y) = nhwc.get(&v) {
        return y;
    }
    let ty = permuted(g.ty(v), &TO_NHWC);
    let y = g.push(Op::Permute { perm: TO_NHWC.to_vec() }, vec![v], ty, loc);
    nhwc.insert(v, y);
    y
}

/// `ty` with its dims permuted (`out[i] = in[perm[i]]`).
fn permuted(ty: &TensorType, perm: &[usize; 4]) -> TensorType {
    TensorType::new(ty.dtype, perm.iter().map(|&p| ty.shape[p].clone()).collect())
}
