//! Folding per-channel affine ops into the convolution before them.
//!
//! `conv(x, w, b) * s + t`, with `s` and `t` constants that vary only along the
//! output-channel axis (what BatchNorm decomposes into), equals `conv(x, w', b')`
//! with `w'[o] = w[o] * s[o]` and `b' = b * s + t`. One kernel instead of three,
//! and two fewer passes over the activation. Only applied when the convolution's
//! result has no other use, so nothing is computed twice.
//!
//! Arithmetic is in f64 and rounded to f32 once, like the decomposition that
//! produced `s` and `t`; results differ from the unfused graph only by that
//! final rounding.

use crate::host::HostTensor;
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, SecondaryMap, ValueId};

pub fn fuse_conv_affine(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fuse")?;
    let mut uses = g.use_counts();
    rewrite_in_order(g, |g, n| {
        let Some(fused) = try_fuse(g, n, &uses) else { return Ok(Rewrite::Keep) };
        // The fused conv takes over the affine op's uses.
        let old = g.nodes[n].outputs[0];
        uses[fused] = uses[old];
        Ok(Rewrite::Replace(vec![fused]))
    })
}

/// BatchNorm ops (with constant parameters) on the result of a convolution
/// fold into its weight and bias, as decomposition and
/// [`fuse_conv_affine`] fold them later (the same f32 values: the scale and
/// shift rounded to f32, the weight scaled and the bias scaled then shifted,
/// each rounded once). `--quantize` runs it first, so that convolutions are
/// quantized with the weights they will run with.
pub fn fold_batch_norms(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "fold_batch_norms")?;
    let mut uses = g.use_counts();
    rewrite_in_order(g, |g, n| {
        let node = &g.nodes[n];
        let (Op::BatchNorm { eps }, &[x, mean, var, weight, bias]) = (&node.op, &node.inputs[..]) else {
            return Ok(Rewrite::Keep);
        };
        let Some((scale, shift)) = crate::decompose::norm::constant_params(g, [mean, var, weight, bias], *eps) else {
            return Ok(Rewrite::Keep);
        };
        let as_f32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32 as f64).collect::<Vec<_>>();
        let (scale, shift) = (as_f32(scale), as_f32(shift));
        let Some(scaled) = fold_factors(g, x, BinaryOp::Mul, &scale, &uses) else { return Ok(Rewrite::Keep) };
        uses[scaled] = 1;
        let Some(fused) = fold_factors(g, scaled, BinaryOp::Add, &shift, &uses) else { return Ok(Rewrite::Keep) };
        let old = g.nodes[n].outputs[0];
        uses[fused] = uses[old];
        Ok(Rewrite::Replace(vec![fused]))
    })
}

/// Per-output-channel factors of a constant that broadcasts against a conv
/// output of rank `rank` with `channels` channels only along axis 1 (or is a
/// scalar): `[C, 1, ..]`, `[1, C, 1, ..]`, `[]`, `[1]`, ...
fn per_channel(c: &HostTensor, rank: usize, channels: usize) -> Option<Vec<f64>> {
    if c.numel() == 1 && c.shape.len() <= rank {
        return Some(vec![c.data[0]; channels]);
    }
    let lead = rank.checked_sub(c.shape.len())?;
    let axis = 1usize.checked_sub(lead)?;
    let is_channel_only = c.shape.iter().enumerate().all(|(i, &d)| if i == axis { d == channels } else { d == 1 });
    is_channel_only.then(|| c.data.clone())
}

fn try_fuse(g: &mut Graph, n: NodeId, uses: &SecondaryMap<ValueId, u32>) -> Option<ValueId> {
    let node = &g.nodes[n];
    let op = match node.op {
        Op::Binary(op @ (BinaryOp::Mul | BinaryOp::Add | BinaryOp::Sub)) => op,
        _ => return None,
    };
    let (a, b) = (node.inputs[0], node.inputs[1]);
    // The conv may be either operand of a commutative op; of `Sub` only the left.
    let (conv_out, k) = if g.producer(a).is_some_and(|p| is_conv(g, p)) {
        (a, b)
    } else if op != BinaryOp::Sub && g.producer(b).is_some_and(|p| is_conv(g, p)) {
        (b, a)
    } else {
        return None;
    };
    if g.ty(conv_out) != g.ty(node.outputs[0]) {
        return None;
    }
    let out_ty = g.ty(conv_out);
    let channels = usize::try_from(out_ty.shape.get(1)?.as_const()?).ok()?;
    let factors = per_channel(&HostTensor::from_const(g, k)?, out_ty.rank(), channels)?;
    fold_factors(g, conv_out, op, &factors, uses)
}

/// The convolution producing `conv_out` (its only use) with `op` (mul, add
/// or sub) by per-output-channel `factors` folded into its weight and bias:
/// the new convolution's result.
fn fold_factors(
    g: &mut Graph,
    conv_out: ValueId,
    op: BinaryOp,
    factors: &[f64],
    uses: &SecondaryMap<ValueId, u32>,
) -> Option<ValueId> {
    let conv = g.producer(conv_out).filter(|&p| is_conv(g, p))?;
    if uses[conv_out] != 1 || g.outputs.contains(&conv_out) {
        return None;
    }
    let conv_node = g.nodes[conv].clone();
    let out_ty = g.ty(conv_out).clone();
    if out_ty.dtype != DType::F32 {
        return None;
    }
    let channels = usize::try_from(out_ty.shape.get(1)?.as_const()?).ok()?;
    if factors.len() != channels {
        return None;
    }
    let w = HostTensor::from_const(g, conv_node.inputs[1])?;
    let bias = match conv_node.inputs.get(2) {
        Some(&b) => HostTensor::from_const(g, b)?.data,
        None => vec![0.0; channels],
    };
    if w.shape.first() != Some(&channels) || bias.len() != channels {
        return None;
    }
    let per_out = w.numel() / channels;
    let (mut new_w, mut new_b) = (w.data.clone(), bias);
    for o in 0..channels {
        match op {
            BinaryOp::Mul => {
                new_w[o * per_out..(o + 1) * per_out].iter_mut().for_each(|x| *x *= factors[o]);
                new_b[o] *= factors[o];
            }
            BinaryOp::Add => new_b[o] += factors[o],
            _ => new_b[o] -= factors[o],
        }
    }
    // The rescaled weight is still the conv's weight: it keeps its name and attributes.
    let w_data = &g.values[conv_node.inputs[1]];
    let (w_name, w_attrs) = (w_data.name.clone(), w_data.attrs.clone());
    let new_w = HostTensor::new(DType::F32, w.shape.clone(), new_w).add_to(g, w_name);
    g.values[new_w].attrs = w_attrs;
    let new_b = HostTensor::new(DType::F32, vec![channels], new_b).add_to(g, None);
    let fused = g.push(conv_node.op.clone(), vec![conv_node.inputs[0], new_w, new_b], out_ty, conv_node.loc);
    Some(fused)
}

/// Operands always name live values (rewrites redirect them), so the producer
/// is scheduled.
fn is_conv(g: &Graph, n: NodeId) -> bool {
    matches!(g.nodes[n].op, Op::Conv { .. })
}
