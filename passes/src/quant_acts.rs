//! int8 activations between quantized layers (CPU).
//!
//! A quantized convolution with int8 activations computes each output as
//! an f32 value (scale, bias, activation) and writes it; a consumer with
//! static activations then quantizes that f32 tensor with its own scale and
//! zero point before its integer product. When every user of the result is
//! such a consumer, all with the same parameters, the producer can
//! quantize each value in its tile store instead (the same f32 value, the
//! same rounding — `clamp(rint(v · f32(1/scale)) + zp)`), and the
//! consumers read the i8 tensor as it is: the same integers reach the
//! consumers' products, so the program gives the same bits, with a quarter
//! of the bytes between the layers and no encoding pass in the consumer.
//!
//! The i8 value's parameters are the producer's `out_quant` and, equal to
//! them, every consumer's `act_scale` / `act_zero_point` (the IR's i8
//! activation: [`kiln_ir::QParams`]). Runs after the layout pass: the
//! producer must be channels-last (its rows are the result's pixels) and
//! have no residual operand (a residual add after the product keeps f32).
//! Values that leave the program, feed a float op (pooling, an
//! elementwise op, a residual, a weight-only layer) or consumers with
//! different parameters stay f32.

use crate::{Changed, Options, PassError};
use kiln_ir::{DType, Graph, Layout, NodeId, Op, QParams, Residual, ValueId};
use std::collections::HashMap;

/// Marks every quantized convolution whose result feeds only static int8
/// consumers with one set of parameters to give i8 (see the module doc).
pub fn int8_activations(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "quant_acts")?;
    // Dead users (the permutes back the layout pass leaves behind) are no users.
    let dead = crate::dce(g, opts)?;
    let mut users: HashMap<ValueId, Vec<(NodeId, usize)>> = HashMap::new();
    for &n in &g.order {
        for (i, &v) in g.nodes[n].inputs.iter().enumerate() {
            users.entry(v).or_default().push((n, i));
        }
    }
    let mut marked = Vec::new();
    for &n in &g.order {
        let node = &g.nodes[n];
        let Op::QuantConv { layout, epilogue, dynamic, act_scale, out_quant: None, .. } = &node.op else { continue };
        if *layout != Layout::ChannelsLast
            || epilogue.residual != Residual::None
            || !(*dynamic || act_scale.is_some())
            || node.outputs.len() != 1
        {
            continue;
        }
        let v = node.outputs[0];
        if g.ty(v).dtype != DType::F32 || g.outputs.contains(&v) {
            continue;
        }
        let Some(uses) = users.get(&v) else { continue };
        let params: Option<Vec<QParams>> = uses.iter().map(|&(u, i)| static_input(g, u, i)).collect();
        let Some(params) = params else { continue };
        match params.split_first() {
            Some((first, rest)) if rest.iter().all(|q| q == first) && first.is_valid() => marked.push((n, *first)),
            _ => {}
        }
    }
    if marked.is_empty() {
        return Ok(dead);
    }
    for (n, q) in marked {
        if let Op::QuantConv { out_quant, .. } = &mut g.nodes[n].op {
            *out_quant = Some(q);
        }
        let v = g.nodes[n].outputs[0];
        g.values[v].ty.dtype = DType::I8;
    }
    Ok(Changed::Yes)
}

/// The static activation parameters with which node `u` quantizes its
/// operand `i`, if that operand is a quantized convolution's input it
/// reads as int8 (a channels-last convolution with static activations).
fn static_input(g: &Graph, u: NodeId, i: usize) -> Option<QParams> {
    match &g.nodes[u].op {
        Op::QuantConv {
            act_scale: Some(scale), act_zero_point, dynamic: false, layout: Layout::ChannelsLast, ..
        } if i == 0 && g.nodes[u].inputs.iter().filter(|&&x| x == g.nodes[u].inputs[0]).count() == 1 => {
            Some(QParams { scale: *scale, zero_point: *act_zero_point })
        }
        _ => None,
    }
}
