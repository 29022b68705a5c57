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
//! The same holds for a dense layer with an f32 residual (its sum is the
//! f32 value quantized) and through a channels-last max pool: quantizing
//! is monotone, so the maximum of the integers is the integer of the
//! maximum (the same bits); the pool's result's readers count as the
//! producer's.
//!
//! [`int8_residuals`] (a second pass, `quant_residuals`, after this one)
//! keeps residual adds int8 too, as ONNX Runtime's and XNNPACK's int8
//! graphs do (PT2E's X86 and XNNPACK quantizers share one observer
//! between an add's output and the next layer's input, as here): a value
//! that a dense channels-last int8 convolution reads as its residual may
//! be i8; that layer dequantizes it as torch's `dequantize_per_tensor`
//! does, `(f32(q) − zp) · scale` (`res_quant`), and adds it to its own f32
//! result — torch's fake-quant of PT2E X86's conv-add(-relu) pattern,
//! where the convolution's output is not quantized before the add, and the
//! sum quantized in the store is the int8 add's requantization. A residual
//! reader imposes no parameters: the value takes those of its other
//! readers. Unlike the first pass this changes numbers (the residual is
//! rounded to int8, as in torch's quantized program).
//!
//! The i8 value's parameters are the producer's `out_quant` and, equal to
//! them, every consumer's `act_scale` / `act_zero_point` (the IR's i8
//! activation: [`kiln_ir::QParams`]) and every residual reader's
//! `res_quant`. Runs after the layout pass: the producer must be
//! channels-last (its rows are the result's pixels), and dense if it has a
//! residual operand. Values that leave the program, feed a float op (an
//! average pool, an elementwise op, a weight-only layer, a depthwise
//! layer's residual) or consumers with different parameters — or only
//! residual readers, which name no parameters — stay f32.

use crate::{Changed, Options, PassError};
use kiln_ir::{DType, Graph, Layout, NodeId, Op, PoolKind, QParams, Residual, ValueId};
use std::collections::HashMap;

type Users = HashMap<ValueId, Vec<(NodeId, usize)>>;

/// Marks every quantized convolution whose result feeds only static int8
/// consumers with one set of parameters (directly or through max pools) to
/// give i8: the same bits (see the module doc).
pub fn int8_activations(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "quant_acts")?;
    mark(g, opts, false)
}

/// [`int8_activations`] where residual reads count as int8 readers too:
/// int8 residual adds (see the module doc).
pub fn int8_residuals(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "quant_residuals")?;
    mark(g, opts, true)
}

/// Marks the producers whose readers all read i8; `residuals`: residual
/// reads are such readers.
fn mark(g: &mut Graph, opts: &Options, residuals: bool) -> Result<Changed, PassError> {
    // Dead users (the permutes back the layout pass leaves behind) are no users.
    let dead = crate::dce(g, opts)?;
    let mut users = Users::new();
    for &n in &g.order {
        for (i, &v) in g.nodes[n].inputs.iter().enumerate() {
            users.entry(v).or_default().push((n, i));
        }
    }
    let mut marked = Vec::new();
    for &n in &g.order {
        let node = &g.nodes[n];
        let Op::QuantConv { layout, epilogue, dynamic, act_scale, groups, out_quant: None, .. } = &node.op else {
            continue;
        };
        if *layout != Layout::ChannelsLast
            || (epilogue.residual != Residual::None && *groups != 1)
            || !(*dynamic || act_scale.is_some())
            || node.outputs.len() != 1
        {
            continue;
        }
        let v = node.outputs[0];
        if g.ty(v).dtype != DType::F32 {
            continue;
        }
        let mut demand = Demand { residuals, ..Demand::default() };
        if !demand.of(g, &users, v) {
            continue;
        }
        match demand.params {
            Some(q) if q.is_valid() => marked.push((n, q, demand)),
            _ => {}
        }
    }
    if marked.is_empty() {
        return Ok(dead);
    }
    for (n, q, demand) in marked {
        if let Op::QuantConv { out_quant, .. } = &mut g.nodes[n].op {
            *out_quant = Some(q);
        }
        let v = g.nodes[n].outputs[0];
        g.values[v].ty.dtype = DType::I8;
        for p in demand.pools {
            let v = g.nodes[p].outputs[0];
            g.values[v].ty.dtype = DType::I8;
        }
        for r in demand.residual_readers {
            if let Op::QuantConv { res_quant, .. } = &mut g.nodes[r].op {
                *res_quant = Some(q);
            }
        }
    }
    Ok(Changed::Yes)
}

/// What the readers of a value (and of the max pools it flows through)
/// ask of it when every one of them reads i8.
#[derive(Default)]
struct Demand {
    /// Whether residual reads count as int8 readers.
    residuals: bool,
    /// The static parameters every consumer quantizes it with (none yet:
    /// only residual readers so far).
    params: Option<QParams>,
    /// Channels-last max pools it flows through (their results become i8).
    pools: Vec<NodeId>,
    /// Convolutions that read it (or a pool's result) as their residual.
    residual_readers: Vec<NodeId>,
}

impl Demand {
    /// Adds the readers of `v`; false if one of them cannot read i8, the
    /// value leaves the program, or two consumers' parameters differ.
    fn of(&mut self, g: &Graph, users: &Users, v: ValueId) -> bool {
        if g.outputs.contains(&v) {
            return false;
        }
        let Some(uses) = users.get(&v) else { return false };
        for &(u, i) in uses {
            if let Some(q) = static_input(g, u, i) {
                match self.params {
                    Some(p) if p != q => return false,
                    _ => self.params = Some(q),
                }
            } else if self.residuals && reads_int8_residual(g, u, i) {
                self.residual_readers.push(u);
            } else if passes_int8_on(g, u, i) {
                self.pools.push(u);
                if !self.of(g, users, g.nodes[u].outputs[0]) {
                    return false;
                }
            } else {
                return false;
            }
        }
        true
    }
}

/// Whether `v` is operand `i` of `u` and nowhere else among its operands.
fn read_once(g: &Graph, u: NodeId, i: usize) -> bool {
    let ins = &g.nodes[u].inputs;
    ins.iter().filter(|&&x| x == ins[i]).count() == 1
}

/// The static activation parameters with which node `u` quantizes its
/// operand `i`, if that operand is a quantized convolution's input it
/// reads as int8 (a channels-last convolution with static activations).
fn static_input(g: &Graph, u: NodeId, i: usize) -> Option<QParams> {
    match &g.nodes[u].op {
        Op::QuantConv {
            act_scale: Some(scale), act_zero_point, dynamic: false, layout: Layout::ChannelsLast, ..
        } if i == 0 && read_once(g, u, i) => Some(QParams { scale: *scale, zero_point: *act_zero_point }),
        _ => None,
    }
}

/// Whether operand `i` of node `u` is the residual of a convolution that
/// can read it as i8: dense, channels-last, int8 activations.
fn reads_int8_residual(g: &Graph, u: NodeId, i: usize) -> bool {
    match &g.nodes[u].op {
        Op::QuantConv {
            epilogue,
            groups: 1,
            layout: Layout::ChannelsLast,
            dynamic,
            act_scale,
            res_quant: None,
            ..
        } => {
            // The residual operand comes after the scales.
            (*dynamic || act_scale.is_some())
                && epilogue.residual_operand().map(|r| r + 1) == Some(i)
                && read_once(g, u, i)
        }
        _ => false,
    }
}

/// Whether node `u` is a channels-last max pool of its operand `i` (values
/// only), which pools i8 values to the same integers.
fn passes_int8_on(g: &Graph, u: NodeId, i: usize) -> bool {
    let node = &g.nodes[u];
    matches!(node.op, Op::Pool { kind: PoolKind::Max, layout: Layout::ChannelsLast, .. })
        && i == 0
        && node.outputs.len() == 1
        && g.ty(node.outputs[0]).dtype == DType::F32
}
