//! The kernel side of the instruction set: every call opcode's kernel, and
//! the resolution — once, at `Program::load` — of a plan's instructions into
//! [`Step`]s: a function pointer and decoded parameters per call, so the run
//! loop neither decodes nor allocates.

use crate::format::{DimRef, InstrOp, Kernel, Plan, Storage};
use kiln_isa::fused::FusedOp;
use kiln_isa::{Epilogue, Layout, Residual};
use kiln_kernels::quant::{ActQuant, DepthwiseQWeights, PackedQWeights, QBits, QWeights};
use kiln_kernels::{
    self as k, Context, ConvParams, DType, KernelError, PackedB, PackedConv, PoolParams, Result, TensorEpilogue,
    TensorMut, TensorRef,
};
use std::ops::Range;

/// A call opcode's kernel: its parameters, their list parameters decoded to
/// `usize` (see [`decode_ints`]), the context, operands and outputs (counts
/// validated at load).
pub(crate) type KernelFn = fn(&Kernel, &[usize], &mut Context, &[TensorRef<'_>], &mut [TensorMut<'_>]) -> Result<()>;

/// The in-place form of a call (see [`Step::InPlace`]): the kernel, the
/// in-place operand's index, the context, the operands (that one without
/// data) and the output, which holds that operand's data.
pub(crate) type InPlaceFn = fn(&Kernel, usize, &mut Context, &[TensorRef<'_>], TensorMut<'_>) -> Result<()>;

/// One instruction as the run loop executes it; each kind in one place.
pub(crate) enum Step {
    Call {
        run: KernelFn,
        /// This call's decoded list parameters in [`Resolved::ints`].
        ints: Range<usize>,
        /// Its constant weight packed at load, in [`Resolved::packed`]: the
        /// call then goes through [`run_packed`] instead of `run`.
        packed: Option<usize>,
    },
    /// A call whose operand `at` is its output's own tensor (a state updated
    /// where it lies, see [`in_place_fn`]): that operand is passed with its
    /// dtype and shape but no data, which the output holds.
    InPlace {
        run: InPlaceFn,
        at: usize,
    },
    Delegate {
        segment: u32,
    },
    BindDim {
        symbol: u32,
    },
    JumpIfFalse {
        target: u32,
    },
    Jump {
        target: u32,
    },
    /// A native call (`crate::native::run_native`).
    Native {
        function: u32,
    },
    /// A native row function (`crate::native::run_native_kernel`), with its
    /// fallback kernel resolved as a call's.
    NativeKernel {
        function: u32,
        run: KernelFn,
        ints: Range<usize>,
    },
}

/// A validated plan's steps, indexed like `Plan::instrs`.
pub(crate) struct Resolved {
    pub steps: Vec<Step>,
    pub ints: Vec<usize>,
    /// Constant GEMM weights packed once for the microkernel of the best
    /// kernel table (64-byte aligned), shared by every session.
    pub packed: Vec<Packed>,
    /// Per state (indexed like `Plan::states`): the first instruction that
    /// writes its storage during the run, if any. A run that fails at or
    /// after it may leave the state partly updated.
    pub state_writers: Vec<Option<StateWriter>>,
}

/// The instruction writing a state's storage during the run.
#[derive(Copy, Clone, Debug)]
pub(crate) struct StateWriter {
    pub index: usize,
    /// It updates in place ([`in_place_fn`]): an error there leaves the
    /// storage as it was.
    pub in_place: bool,
}

/// A call's constant weight, packed at load.
pub(crate) enum Packed {
    /// A linear's `[N, K]` weight or a matmul's 2-D right operand.
    B(PackedB),
    /// A (non-depthwise) convolution's weight.
    Conv(PackedConv),
    /// A quantized linear layer's integer weight, scales and zero points.
    Quant(PackedQWeights),
    /// A quantized convolution's weight, prepared for the kernel it runs.
    QuantConv(QuantConvWeight),
}

/// A quantized convolution's weight as its kernel reads it.
pub(crate) enum QuantConvWeight {
    /// With int8 activations: the `[Cout, C · taps]` integer matrix.
    Int8(PackedQWeights),
    /// Weight-only: the f32 weight `(q · scale)`, dequantized once, and its
    /// GEMM packing where the convolution uses one (not depthwise).
    Float { w: Vec<f32>, packed: Option<PackedConv> },
    /// Depthwise with static int8 activations: the per-channel taps.
    Depthwise(DepthwiseQWeights),
}

/// Resolves every instruction of a validated plan; `weights` is the
/// weights section, whose constant linear / matmul weights are packed here.
pub(crate) fn resolve(plan: &Plan, weights: &[u8]) -> Resolved {
    let mut ints = Vec::new();
    let mut packed = Vec::new();
    let steps = plan
        .instrs
        .iter()
        .map(|instr| match &instr.op {
            InstrOp::Call(kernel) => {
                let start = ints.len();
                decode_ints(kernel, &mut ints);
                let storage = |t: Option<&u32>| t.and_then(|&t| plan.tensors.get(t as usize)).map(|d| d.storage);
                let aliased = storage(instr.inputs.first()).is_some_and(|s| Some(s) == storage(instr.outputs.first()));
                if let Some((at, run)) = in_place_at(instr).and_then(|at| Some((at, in_place_fn(kernel, at)?))) {
                    return Step::InPlace { run, at };
                }
                let run = match kernel {
                    // A reshape the planner aliased moves no data.
                    Kernel::Copy {} if aliased => no_op,
                    _ => kernel_fn(kernel),
                };
                let packed = pack_weight(plan, weights, kernel, &instr.inputs).map(|p| {
                    packed.push(p);
                    packed.len() - 1
                });
                Step::Call { run, ints: start..ints.len(), packed }
            }
            InstrOp::Delegate { segment } => Step::Delegate { segment: *segment },
            InstrOp::BindDim { symbol } => Step::BindDim { symbol: *symbol },
            InstrOp::JumpIfFalse { target } => Step::JumpIfFalse { target: *target },
            InstrOp::Jump { target } => Step::Jump { target: *target },
            InstrOp::Native { function, .. } => Step::Native { function: *function },
            InstrOp::NativeKernel { function, fallback, .. } => {
                let start = ints.len();
                decode_ints(fallback, &mut ints);
                Step::NativeKernel { function: *function, run: kernel_fn(fallback), ints: start..ints.len() }
            }
        })
        .collect();
    Resolved { steps, ints, packed, state_writers: state_writers(plan) }
}

/// Each state's first writing instruction (see [`Resolved::state_writers`]).
fn state_writers(plan: &Plan) -> Vec<Option<StateWriter>> {
    let region = |t: u32| match plan.tensors.get(t as usize).map(|d| d.storage) {
        Some(Storage::Arena { offset, max_bytes }) => Some((offset, max_bytes)),
        _ => None,
    };
    plan.states
        .iter()
        .map(|st| {
            let state = region(st.tensor)?;
            let index = plan.instrs.iter().position(|i| i.outputs.iter().any(|&t| region(t) == Some(state)))?;
            let instr = &plan.instrs[index];
            // Elementwise kernels write tile by tile: only the indexed
            // writes check everything before writing anything.
            let in_place = match &instr.op {
                InstrOp::Call(kernel @ (Kernel::IndexPut { .. } | Kernel::ScatterElements { .. })) => {
                    in_place_at(instr).is_some_and(|at| in_place_fn(kernel, at).is_some())
                }
                _ => false,
            };
            Some(StateWriter { index, in_place })
        })
        .collect()
}

/// The operand of `instr` that is its output 0's own tensor, if exactly one
/// is (a state's storage updated where it lies).
pub(crate) fn in_place_at(instr: &crate::format::Instr) -> Option<usize> {
    let out = *instr.outputs.first()?;
    let mut at = instr.inputs.iter().enumerate().filter(|&(_, &t)| t == out).map(|(k, _)| k);
    match (at.next(), at.next()) {
        (Some(k), None) => Some(k),
        _ => None,
    }
}

/// The in-place form of a call whose operand `at` is its output's own
/// tensor (a state's storage, updated where it lies; validated at load):
/// an `index_put` / `scatter_elements` on its data operand (0), or an
/// elementwise call (`unary`, `binary`, `fused`) on any operand, which runs
/// through [`k::fused_in_place`] (a tile of that operand is read before the
/// tile is written).
pub(crate) fn in_place_fn(kernel: &Kernel, at: usize) -> Option<InPlaceFn> {
    fn index_put(kernel: &Kernel, _: usize, cx: &mut Context, ins: &[TensorRef<'_>], out: TensorMut<'_>) -> Result<()> {
        let Kernel::IndexPut { axis, accumulate } = kernel else { return Err(mismatch(kernel)) };
        k::index_put_in_place(ins[1], &ins[2..], *axis as usize, *accumulate, out, cx)
    }
    fn scatter(kernel: &Kernel, _: usize, cx: &mut Context, ins: &[TensorRef<'_>], out: TensorMut<'_>) -> Result<()> {
        let Kernel::ScatterElements { axis, reduce, include_self } = kernel else { return Err(mismatch(kernel)) };
        k::scatter_elements_in_place(ins[1], ins[2], *axis as usize, *reduce, *include_self, out, cx)
    }
    fn elementwise(
        kernel: &Kernel,
        at: usize,
        cx: &mut Context,
        ins: &[TensorRef<'_>],
        out: TensorMut<'_>,
    ) -> Result<()> {
        match kernel {
            Kernel::Unary { op } => k::fused_in_place(&[FusedOp::Unary { op: *op, x: 0 }], ins, at, out, cx),
            Kernel::Binary { op } => k::fused_in_place(&[FusedOp::Binary { op: *op, a: 0, b: 1 }], ins, at, out, cx),
            Kernel::Fused { program } => k::fused_in_place(program, ins, at, out, cx),
            _ => Err(mismatch(kernel)),
        }
    }
    match kernel {
        Kernel::IndexPut { .. } if at == 0 => Some(index_put),
        Kernel::ScatterElements { .. } if at == 0 => Some(scatter),
        Kernel::Unary { .. } | Kernel::Binary { .. } | Kernel::Fused { .. } => Some(elementwise),
        _ => None,
    }
}

/// The packed form of a call's constant weight: a linear's `[N, K]` weight,
/// a matmul's 2-D right operand or a convolution's weight (unless the
/// convolution runs the direct depthwise loops), when it is an f32 tensor
/// of the weights section with static dims. None leaves the call to its
/// plain kernel.
fn pack_weight(plan: &Plan, weights: &[u8], kernel: &Kernel, inputs: &[u32]) -> Option<Packed> {
    if let Kernel::QuantLinear { .. } = kernel {
        return pack_quant(plan, weights, kernel, inputs).map(Packed::Quant);
    }
    if let Kernel::QuantConv { .. } = kernel {
        let ((w_decl, w), (_, scales)) =
            (section_operand(plan, weights, inputs, 1)?, section_operand(plan, weights, inputs, 2)?);
        return quant_conv_weight(kernel, &static_dims(w_decl)?, w, scales).ok().map(Packed::QuantConv);
    }
    let transposed = match kernel {
        Kernel::Linear {} | Kernel::LinearFused { .. } => true,
        Kernel::MatMul {} => false,
        Kernel::Conv { .. } | Kernel::ConvFused { .. } => false,
        _ => return None,
    };
    let (decl, data) = section_operand(plan, weights, inputs, 1)?;
    let dims = static_dims(decl)?;
    if decl.dtype != DType::F32 {
        return None;
    }
    if let Kernel::ConvFused { stride, padding, dilation, groups, layout: Layout::ChannelsLast, .. } = kernel {
        // The packing the channels-last kernel reads, where it reads one.
        let w = TensorRef { dtype: DType::F32, shape: &dims, data };
        let [stride, padding, dilation] = [stride, padding, dilation].map(|v| usizes(v));
        let p = ConvParams { stride: &stride, padding: &padding, dilation: &dilation, groups: *groups as usize };
        return PackedConv::channels_last(k::best(), w, &p).ok().flatten().map(Packed::Conv);
    }
    if let Kernel::Conv { stride, padding, dilation, groups }
    | Kernel::ConvFused { stride, padding, dilation, groups, .. } = kernel
    {
        // Depthwise (one input channel per group) never runs a GEMM.
        let (groups, cout) = (*groups as usize, *dims.first()?);
        if dims.get(1) == Some(&1) && (groups > 1 || cout == 1) {
            return None;
        }
        // The section is 64-byte aligned: the kernel views it as f32 in place
        // (an unaligned one is refused and the call stays unpacked).
        let w = TensorRef { dtype: DType::F32, shape: &dims, data };
        let [stride, padding, dilation] = [stride, padding, dilation].map(|v| usizes(v));
        let p = ConvParams { stride: &stride, padding: &padding, dilation: &dilation, groups };
        return PackedConv::for_params(k::best(), w, &p).ok().map(Packed::Conv);
    }
    // Decoded (the section is little-endian f32; no alignment assumed): a
    // transient copy at load, dropped once packed.
    let values: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let &[rows, cols] = dims.as_slice() else { return None };
    let (k, n) = if transposed { (cols, rows) } else { (rows, cols) };
    PackedB::new(k::best(), k, n, &values, cols, transposed).ok().map(Packed::B)
}

/// A quantized linear layer's weight, scales and zero points, when all three
/// are tensors of the weights section.
fn pack_quant(plan: &Plan, weights: &[u8], kernel: &Kernel, inputs: &[u32]) -> Option<PackedQWeights> {
    let weight = |i: usize| -> Option<TensorRef<'_>> {
        let (decl, data) = section_operand(plan, weights, inputs, i)?;
        Some(TensorRef { dtype: decl.dtype, shape: &[], data })
    };
    let Kernel::QuantLinear { bits, zero_points, .. } = kernel else { return None };
    let zp = if *zero_points { Some(weight(3)?) } else { None };
    let w_decl = plan.tensors.get(*inputs.get(1)? as usize)?;
    // `[n, k]` int8 or `[n, k / 2]` int4 bytes.
    let [n, bytes] = w_decl.shape[..] else { return None };
    let (n, k) = (static_dim(&n)?, static_dim(&bytes)?.checked_mul(if *bits == 4 { 2 } else { 1 })?);
    quant_weights(kernel, n, k, weight(1)?, weight(2)?, zp).and_then(|w| PackedQWeights::pack(&w).ok())
}

/// The [`QWeights`] a quantized linear call reads, its lengths checked by
/// [`QWeights::check`] when packed.
fn quant_weights<'a>(
    kernel: &Kernel,
    n: usize,
    k: usize,
    w: TensorRef<'a>,
    scales: TensorRef<'a>,
    zp: Option<TensorRef<'a>>,
) -> Option<QWeights<'a>> {
    let Kernel::QuantLinear { bits, group, .. } = kernel else { return None };
    let bits = match bits {
        8 => QBits::I8,
        4 => QBits::I4,
        _ => return None,
    };
    Some(QWeights {
        n,
        k,
        bits,
        group: *group as usize,
        data: w.data,
        scales: bytemuck::try_cast_slice(scales.data).ok()?,
        zero_points: match zp {
            Some(z) => Some(bytemuck::try_cast_slice(z.data).ok()?),
            None => None,
        },
    })
}

/// Operand `i` of a call when it is a tensor of the weights section: its
/// declaration and bytes.
fn section_operand<'p>(
    plan: &'p Plan,
    weights: &'p [u8],
    inputs: &[u32],
    i: usize,
) -> Option<(&'p crate::format::TensorDecl, &'p [u8])> {
    let decl = plan.tensors.get(*inputs.get(i)? as usize)?;
    let Storage::Weight { offset, bytes } = decl.storage else { return None };
    let start = usize::try_from(offset).ok()?;
    Some((decl, weights.get(start..start.checked_add(usize::try_from(bytes).ok()?)?)?))
}

fn static_dim(d: &DimRef) -> Option<usize> {
    match d {
        DimRef::Static(v) => usize::try_from(*v).ok(),
        DimRef::Expr(_) => None,
    }
}

/// A plan's u32 list (strides, padding, dilation) as usizes.
fn usizes(v: &[u32]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

/// A declaration's dims, when every one is static.
fn static_dims(decl: &crate::format::TensorDecl) -> Option<Vec<usize>> {
    decl.shape.iter().map(static_dim).collect()
}

/// A quantized convolution's weight `w` (i8 `dims`) and f32 `scales`
/// (one per output channel), prepared for the kernel the call runs.
fn quant_conv_weight(kernel: &Kernel, dims: &[usize], w: &[u8], scales: &[u8]) -> Result<QuantConvWeight> {
    let Kernel::QuantConv { groups, dynamic, act_scale, layout, stride, padding, dilation, .. } = kernel else {
        return Err(quant_conv_err("not a quantized convolution"));
    };
    let (&n, rest) = dims.split_first().ok_or_else(|| quant_conv_err("0-d weight"))?;
    let k = rest.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| quant_conv_err("weight too large"))?;
    let scales: &[f32] = bytemuck::try_cast_slice(scales).map_err(|_| quant_conv_err("unaligned scales"))?;
    if n.checked_mul(k) != Some(w.len()) || scales.len() != n {
        return Err(quant_conv_err("weight or scales do not match the weight's shape"));
    }
    // Depthwise convolutions (one input channel per group).
    let depthwise = rest.first() == Some(&1) && (*groups > 1 || n == 1);
    if act_scale.is_some() && *groups > 1 && depthwise {
        // Static int8 activations: the integer depthwise kernel (channels-last).
        if *layout != Layout::ChannelsLast {
            return Err(quant_conv_err("an int8 depthwise convolution runs channels-last"));
        }
        return Ok(QuantConvWeight::Depthwise(DepthwiseQWeights::new(bytemuck::cast_slice(w), dims, scales)?));
    }
    if *dynamic || act_scale.is_some() {
        // Channels-last rows hold a window tap by tap: the weight's columns
        // in that order (`[Cout, taps.., C]`).
        let tap_major: Vec<u8>;
        let data = match (layout, dims) {
            (Layout::ChannelsLast, [_, c, ..]) => {
                tap_major = taps_major(w, k, *c);
                &tap_major[..]
            }
            _ => w,
        };
        let q = QWeights { n, k, bits: QBits::I8, group: k, data, scales, zero_points: None };
        return Ok(QuantConvWeight::Int8(PackedQWeights::pack(&q)?));
    }
    let values: Vec<f32> = w.iter().enumerate().map(|(i, &q)| q as i8 as f32 * scales[i / k.max(1)]).collect();
    // Depthwise convolutions run direct loops.
    let bytes: &[u8] = bytemuck::cast_slice(&values);
    let w_ref = TensorRef { dtype: DType::F32, shape: dims, data: bytes };
    let [stride, padding, dilation] = [stride, padding, dilation].map(|v| usizes(v));
    let p = ConvParams { stride: &stride, padding: &padding, dilation: &dilation, groups: *groups as usize };
    let packed = match layout {
        // The packing the channels-last kernel reads, where it reads one.
        Layout::ChannelsLast => PackedConv::channels_last(k::best(), w_ref, &p).ok().flatten(),
        Layout::ChannelsFirst if depthwise => None,
        Layout::ChannelsFirst => PackedConv::for_params(k::best(), w_ref, &p).ok(),
    };
    Ok(QuantConvWeight::Float { w: values, packed })
}

fn quant_conv_err(detail: &str) -> KernelError {
    KernelError::Shape { kernel: "quant_conv", detail: detail.into() }
}

/// Each `[C, taps]` row of `w` (rows of `k` bytes) as `[taps, C]`: a
/// transpose per output channel, without a division per byte (a
/// ResNet-18's 11 MB of weights took ~0.4 s to load that way).
fn taps_major(w: &[u8], k: usize, c: usize) -> Vec<u8> {
    let taps = k / c.max(1);
    let mut out = Vec::with_capacity(w.len());
    for row in w.chunks_exact(k.max(1)) {
        for t in 0..taps {
            out.extend((0..c).map(|ch| row[ch * taps + t]));
        }
    }
    out
}

/// A quantized convolution through its prepared weight.
fn quant_conv(
    kernel: &Kernel,
    prepared: &QuantConvWeight,
    ints: &[usize],
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    let Kernel::QuantConv {
        groups,
        epilogue,
        layout,
        dynamic,
        asymmetric,
        act_scale,
        act_zero_point,
        out_scale,
        out_zero_point,
        res_scale,
        res_zero_point,
        ..
    } = kernel
    else {
        return Err(quant_conv_err("not a quantized convolution"));
    };
    let channels_last = *layout == Layout::ChannelsLast;
    let [stride, padding, dilation] = lists::<3>(ints);
    let params = ConvParams { stride, padding, dilation, groups: *groups as usize };
    // The epilogue's operands follow the scales (counts validated at load).
    let bias = ins.get(3).copied().filter(|_| epilogue.bias);
    let residual = ins.get(3 + usize::from(epilogue.bias)).copied().filter(|_| epilogue.residual != Residual::None);
    let fused = TensorEpilogue {
        activation: epilogue.activation,
        residual,
        residual_first: epilogue.residual == Residual::BeforeActivation,
    };
    match prepared {
        QuantConvWeight::Int8(w) => {
            let act = activation_quant(*dynamic, *asymmetric, *act_scale, *act_zero_point)
                .ok_or_else(|| quant_conv_err("bad activation quantization parameters"))?;
            let bias = match bias {
                Some(b) => {
                    Some(bytemuck::try_cast_slice::<u8, f32>(b.data).map_err(|_| quant_conv_err("unaligned bias"))?)
                }
                None => None,
            };
            let out_quant = out_scale.map(|s| (s as f32, *out_zero_point));
            let res_quant = res_scale.map(|s| (s as f32, *res_zero_point));
            let (w_shape, out) = (ins[1].shape, out(outs, 0));
            let (x, fused, params) = (ins[0], &fused, &params);
            k::quant::qconv_int8(cx, x, w, w_shape, act, bias, fused, params, channels_last, out, out_quant, res_quant)
        }
        QuantConvWeight::Depthwise(_) if res_scale.is_some() => {
            Err(quant_conv_err("an int8 depthwise convolution takes an f32 residual"))
        }
        QuantConvWeight::Depthwise(w) => {
            let act = activation_quant(*dynamic, *asymmetric, *act_scale, *act_zero_point)
                .ok_or_else(|| quant_conv_err("bad activation quantization parameters"))?;
            let bias = match bias {
                Some(b) => {
                    Some(bytemuck::try_cast_slice::<u8, f32>(b.data).map_err(|_| quant_conv_err("unaligned bias"))?)
                }
                None => None,
            };
            let out_quant = out_scale.map(|s| (s as f32, *out_zero_point));
            k::quant::qconv_depthwise(cx, ins[0], w, act, bias, &fused, &params, out(outs, 0), out_quant)
        }
        QuantConvWeight::Float { .. } if ins[0].dtype != DType::F32 || out_scale.is_some() || res_scale.is_some() => {
            Err(quant_conv_err("a weight-only convolution takes and gives f32"))
        }
        QuantConvWeight::Float { w, packed } => {
            // The f32 convolution of the dequantized weight, with the
            // epilogue as a fused convolution applies it.
            let w_ref = TensorRef { dtype: DType::F32, shape: ins[1].shape, data: bytemuck::cast_slice(w) };
            let mut float_ins = vec![ins[0], w_ref];
            float_ins.extend(bias);
            float_ins.extend(residual);
            conv_fused(packed.as_ref(), *groups, epilogue, *layout, ints, cx, &float_ins, outs)
        }
    }
}

/// A quantized convolution whose weight is not a constant: prepared per call.
fn quant_conv_unpacked(
    kernel: &Kernel,
    ints: &[usize],
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    if ins[1].dtype != DType::I8 || ins[2].dtype != DType::F32 {
        return Err(quant_conv_err("weight must be i8 and scales f32"));
    }
    let prepared = quant_conv_weight(kernel, ins[1].shape, ins[1].data, ins[2].data)?;
    quant_conv(kernel, &prepared, ints, cx, ins, outs)
}

/// The activation quantization a quantized call's flags name; `None` when
/// they do not fit together (or the static scale is not an f32 value).
fn activation_quant(dynamic: bool, asymmetric: bool, act_scale: Option<f64>, act_zero_point: i32) -> Option<ActQuant> {
    match (dynamic, asymmetric, act_scale) {
        (false, false, None) => Some(ActQuant::Float),
        (true, false, None) => Some(ActQuant::DynamicPerRow),
        (true, true, None) => Some(ActQuant::DynamicAsymmetric),
        (false, false, Some(s)) if (s as f32) as f64 == s => {
            Some(ActQuant::Static { scale: s as f32, zero_point: act_zero_point })
        }
        _ => None,
    }
}

fn quant_err(detail: &str) -> KernelError {
    KernelError::Shape { kernel: "quant_linear", detail: detail.into() }
}

/// `out = x · dequant(w)ᵀ (+ bias)` over every row of `x`.
fn quant_linear(
    kernel: &Kernel,
    w: &PackedQWeights,
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    let Kernel::QuantLinear { zero_points, dynamic, asymmetric, act_scale, act_zero_point, .. } = kernel else {
        return Err(quant_err("not a quantized linear"));
    };
    let x: &[f32] = bytemuck::try_cast_slice(ins[0].data).map_err(|_| quant_err("unaligned input"))?;
    let bias = match ins.get(3 + *zero_points as usize) {
        Some(b) => Some(bytemuck::try_cast_slice::<u8, f32>(b.data).map_err(|_| quant_err("unaligned bias"))?),
        None => None,
    };
    let out = out(outs, 0);
    let y: &mut [f32] = bytemuck::try_cast_slice_mut(out.data).map_err(|_| quant_err("unaligned output"))?;
    let m = if w.k() == 0 { 0 } else { x.len() / w.k() };
    // The kernel validates the static parameters (an artifact's bytes are
    // untrusted); a scale that is not an f32 value is refused here.
    let act = activation_quant(*dynamic, *asymmetric, *act_scale, *act_zero_point)
        .ok_or_else(|| quant_err("bad activation quantization parameters"))?;
    k::quant::qlinear(cx, x, m, w, act, bias, y)
}

/// A quantized linear call whose weights are not constants: packed per call.
fn quant_linear_unpacked(
    kernel: &Kernel,
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    let Kernel::QuantLinear { zero_points, .. } = kernel else { return Err(quant_err("not a quantized linear")) };
    let k = *ins[0].shape.last().ok_or_else(|| quant_err("0-d input"))?;
    let n = *ins[1].shape.first().ok_or_else(|| quant_err("0-d weight"))?;
    let zp = if *zero_points { Some(ins[3]) } else { None };
    let w = quant_weights(kernel, n, k, ins[1], ins[2], zp).ok_or_else(|| quant_err("unreadable weights"))?;
    let packed = PackedQWeights::pack(&w)?;
    quant_linear(kernel, &packed, cx, ins, outs)
}

/// A call whose weight operand (`ins[1]`) was packed at load: the packed
/// kernel when this context's table reads that packing, else the plain one.
pub(crate) fn run_packed(
    packed: &Packed,
    kernel: &Kernel,
    ints: &[usize],
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    match (packed, kernel) {
        (Packed::B(w), Kernel::Linear {}) if w.fits(cx.table()) => {
            k::linear_packed(ins[0], w, ins.get(2).copied(), out(outs, 0), cx)
        }
        (Packed::B(w), Kernel::MatMul {}) if w.fits(cx.table()) => k::matmul_packed(ins[0], w, out(outs, 0), cx),
        (Packed::Conv(w), Kernel::Conv { groups, .. }) => {
            let [stride, padding, dilation] = lists::<3>(ints);
            let params = ConvParams { stride, padding, dilation, groups: *groups as usize };
            k::conv_packed(ins[0], ins[1], w, ins.get(2).copied(), &params, out(outs, 0), cx)
        }
        (Packed::Quant(w), Kernel::QuantLinear { .. }) => quant_linear(kernel, w, cx, ins, outs),
        (Packed::QuantConv(w), Kernel::QuantConv { .. }) => quant_conv(kernel, w, ints, cx, ins, outs),
        (Packed::Conv(w), Kernel::ConvFused { groups, epilogue, layout, .. }) => {
            conv_fused(Some(w), *groups, epilogue, *layout, ints, cx, ins, outs)
        }
        (Packed::B(w), Kernel::LinearFused { epilogue }) => linear_fused(Some(w), epilogue, cx, ins, outs),
        _ => kernel_fn(kernel)(kernel, ints, cx, ins, outs),
    }
}

/// The list parameters the kernels take as `usize` slices, concatenated in
/// field order (each list of a kernel has the same length where there are
/// several: validated at load).
fn decode_ints(kernel: &Kernel, out: &mut Vec<usize>) {
    let mut push = |v: &[u32]| out.extend(v.iter().map(|&x| x as usize));
    match kernel {
        Kernel::Conv { stride, padding, dilation, .. }
        | Kernel::ConvFused { stride, padding, dilation, .. }
        | Kernel::QuantConv { stride, padding, dilation, .. } => {
            push(stride);
            push(padding);
            push(dilation);
        }
        Kernel::Pool { kernel, stride, padding, dilation, .. } => {
            push(kernel);
            push(stride);
            push(padding);
            push(dilation);
        }
        Kernel::Reduce { axes, .. } | Kernel::Flip { axes } => push(axes),
        Kernel::Permute { perm } => push(perm),
        _ => {}
    }
}

/// A fused call's bias operand and its epilogue over the operand tensors
/// (operand counts were validated against the epilogue's flags at load).
fn tensor_epilogue<'a>(e: &Epilogue, ins: &[TensorRef<'a>]) -> (Option<TensorRef<'a>>, TensorEpilogue<'a>) {
    let bias = e.bias_operand().and_then(|i| ins.get(i).copied());
    let residual = e.residual_operand().and_then(|i| ins.get(i).copied());
    let fused =
        TensorEpilogue { activation: e.activation, residual, residual_first: e.residual == Residual::BeforeActivation };
    (bias, fused)
}

/// A fused linear, through its weight packed at load when there is one;
/// several outputs are column ranges of one GEMM (validated at load: no
/// residual).
fn linear_fused(
    packed: Option<&PackedB>,
    epilogue: &Epilogue,
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    let (bias, fused) = tensor_epilogue(epilogue, ins);
    if outs.len() > 1 {
        return k::linear_split(ins[0], ins[1], packed, bias, epilogue.activation, outs, cx);
    }
    k::linear_with_epilogue(ins[0], ins[1], packed, bias, &fused, out(outs, 0), cx)
}

/// A fused convolution, through its weight packed at load when there is one.
#[allow(clippy::too_many_arguments)]
fn conv_fused(
    packed: Option<&PackedConv>,
    groups: u32,
    epilogue: &Epilogue,
    layout: Layout,
    ints: &[usize],
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    outs: &mut [TensorMut<'_>],
) -> Result<()> {
    let [stride, padding, dilation] = lists::<3>(ints);
    let params = ConvParams { stride, padding, dilation, groups: groups as usize };
    let (bias, fused) = tensor_epilogue(epilogue, ins);
    match layout {
        Layout::ChannelsFirst => k::conv_fused(ins[0], ins[1], packed, bias, &fused, &params, out(outs, 0), cx),
        Layout::ChannelsLast => {
            k::conv_fused_channels_last(ins[0], ins[1], packed, bias, &fused, &params, out(outs, 0), cx)
        }
    }
}

fn no_op(_: &Kernel, _: &[usize], _: &mut Context, _: &[TensorRef<'_>], _: &mut [TensorMut<'_>]) -> Result<()> {
    Ok(())
}

/// `ints` cut into `n` equal lists.
fn lists<const N: usize>(ints: &[usize]) -> [&[usize]; N] {
    let len = ints.len() / N;
    std::array::from_fn(|i| &ints[i * len..(i + 1) * len])
}

/// Output `i` reborrowed for one kernel call.
fn out<'x>(outs: &'x mut [TensorMut<'_>], i: usize) -> TensorMut<'x> {
    reborrow(&mut outs[i])
}

fn reborrow<'x>(o: &'x mut TensorMut<'_>) -> TensorMut<'x> {
    TensorMut { dtype: o.dtype, shape: o.shape, data: &mut *o.data }
}

/// A kernel function paired with another opcode's parameters: impossible
/// after [`resolve`], reported rather than trusted.
fn mismatch(kernel: &Kernel) -> KernelError {
    KernelError::Shape { kernel: kernel.name(), detail: "resolved to another opcode's kernel".into() }
}

/// Declares the kernel function of each call opcode: `Variant { fields } =>
/// body`, where the body sees the names given first: the decoded list
/// parameters, the context, the operands, the outputs and `opt(i)` (a
/// trailing optional operand).
macro_rules! kernel_fns {
    ( |$ints:ident, $cx:ident, $ins:ident, $outs:ident, $opt:ident|
      $( $variant:ident { $($field:ident),* } => $body:expr; )* ) => {
        fn kernel_fn(kernel: &Kernel) -> KernelFn {
            match kernel {
                $( Kernel::$variant { .. } => {
                    #[allow(unused_variables)]
                    fn run(
                        kernel: &Kernel,
                        $ints: &[usize],
                        $cx: &mut Context,
                        $ins: &[TensorRef<'_>],
                        $outs: &mut [TensorMut<'_>],
                    ) -> Result<()> {
                        let Kernel::$variant { $($field,)* .. } = kernel else { return Err(mismatch(kernel)) };
                        let $opt = |i: usize| $ins.get(i).copied();
                        $body
                    }
                    run
                } )*
            }
        }
    };
}

kernel_fns! {
    |ints, cx, ins, outs, opt|
    Unary { op } => k::unary_cx(*op, ins[0], out(outs, 0), cx);
    Binary { op } => k::binary_cx(*op, ins[0], ins[1], out(outs, 0), cx);
    Where {} => k::where_(ins[0], ins[1], ins[2], out(outs, 0));
    Cast {} => k::cast(ins[0], out(outs, 0));
    Clamp { min, max } => k::clamp_cx(ins[0], *min, *max, out(outs, 0), cx);
    MatMul {} => k::matmul(ins[0], ins[1], out(outs, 0), cx);
    GroupedMatMul {} => k::grouped_matmul(ins[0], ins[1], ins[2], out(outs, 0), cx);
    Linear {} => k::linear(ins[0], ins[1], opt(2), out(outs, 0), cx);
    Conv { groups } => {
        let [stride, padding, dilation] = lists::<3>(ints);
        let params = ConvParams { stride, padding, dilation, groups: *groups as usize };
        k::conv(ins[0], ins[1], opt(2), &params, out(outs, 0), cx)
    };
    BatchNorm { eps } => k::batch_norm(ins[0], ins[1], ins[2], ins[3], ins[4], *eps, out(outs, 0));
    LayerNorm { normalized_rank, eps } =>
        k::layer_norm_cx(ins[0], opt(1), opt(2), *normalized_rank as usize, *eps, out(outs, 0), cx);
    Softmax { axis, log } => k::softmax_cx(ins[0], *axis as usize, *log, out(outs, 0), cx);
    Reduce { kind } => k::reduce_cx(*kind, ins[0], ints, out(outs, 0), cx);
    ArgMax { axis } => k::argmax(ins[0], *axis as usize, out(outs, 0));
    Pool { kind, layout, count_include_pad, divisor } => {
        let [kernel, stride, padding, dilation] = lists::<4>(ints);
        let params =
            PoolParams { kernel, stride, padding, dilation, count_include_pad: *count_include_pad, divisor: *divisor };
        match outs {
            // Validated: two outputs only on a channels-first max pool.
            [values, indices] => k::max_pool_with_indices(ins[0], &params, reborrow(values), reborrow(indices)),
            _ if *layout == Layout::ChannelsLast => k::pool_channels_last_cx(*kind, ins[0], &params, out(outs, 0), cx),
            _ => k::pool_cx(*kind, ins[0], &params, out(outs, 0), cx),
        }
    };
    AdaptiveAvgPool {} => k::adaptive_avg_pool(ins[0], out(outs, 0));
    Attention { causal, scale } => k::attention(ins[0], ins[1], ins[2], opt(3), *causal, *scale, out(outs, 0), cx);
    Copy {} => k::copy(ins[0], out(outs, 0));
    Expand {} => k::expand(ins[0], out(outs, 0));
    Permute {} => k::permute_cx(ins[0], ints, out(outs, 0), cx);
    Slice { axis, start, step } => k::slice(ins[0], *axis as usize, *start as usize, *step as usize, out(outs, 0));
    Concat { axis } => k::concat(ins, *axis as usize, out(outs, 0));
    Gather { axis } => k::gather(ins[0], ins[1], *axis as usize, out(outs, 0));
    Fill { value } => k::fill(*value, out(outs, 0));
    Arange { start, step } => k::arange(*start, *step, out(outs, 0));
    CumSum { axis } => k::cumsum(ins[0], *axis as usize, out(outs, 0));
    Scan { axis, kind } => k::scan(ins[0], *axis as usize, *kind, out(outs, 0));
    Assert { message } => k::assert_all(ins[0], message);
    Linalg { op, upper, left, unit, complex } => {
        let flags = k::LinalgFlags { upper: *upper, left: *left, unit: *unit, complex: *complex };
        k::linalg(*op, flags, ins, out(outs, 0))
    };
    ArgMin { axis } => k::argmin(ins[0], *axis as usize, out(outs, 0));
    Sort { axis, descending, indices } => match outs {
        [values, positions] =>
            k::sort_both(ins[0], *axis as usize, *descending, reborrow(values), reborrow(positions), cx),
        _ => k::sort(ins[0], *axis as usize, *descending, *indices, out(outs, 0), cx),
    };
    Pad { lo, hi, interior, mode, value } =>
        k::pad(ins[0], &k::PadParams { lo, hi, interior, mode: *mode, value: *value }, out(outs, 0));
    Flip {} => k::flip(ins[0], ints, out(outs, 0));
    Resize { mode, align_corners, spatial, scales } => {
        let params = k::ResizeParams { mode: *mode, align_corners: *align_corners, spatial: *spatial as usize, scales };
        k::resize(ins[0], &params, out(outs, 0))
    };
    Random { dist, stream } =>
        k::random(*dist, k::RandomKey { seed: cx.seed, call: cx.call, stream: *stream }, out(outs, 0));
    GatherElements { axis } => k::gather_elements(ins[0], ins[1], *axis as usize, out(outs, 0));
    ScatterElements { axis, reduce, include_self } =>
        k::scatter_elements(ins[0], ins[1], ins[2], *axis as usize, *reduce, *include_self, out(outs, 0), cx);
    IndexGather { axis } => k::index_gather(ins[0], &ins[1..], *axis as usize, out(outs, 0), cx);
    IndexPut { axis, accumulate } =>
        k::index_put(ins[0], ins[1], &ins[2..], *axis as usize, *accumulate, out(outs, 0), cx);
    SliceFromEnd { axis, back, step } => {
        let len = ins[0].shape.get(*axis as usize).copied().unwrap_or(0);
        k::slice(ins[0], *axis as usize, len.saturating_sub(*back as usize), *step as usize, out(outs, 0))
    };
    NonZero {} => k::nonzero(ins[0], out(outs, 0));
    Fused { program } => k::fused(program, ins, out(outs, 0), cx);
    RmsNorm { normalized_rank, eps } =>
        k::rms_norm_cx(ins[0], opt(1), *normalized_rank as usize, *eps, out(outs, 0), cx);
    QuantLinear { bits, group, zero_points, dynamic, asymmetric, act_scale, act_zero_point } => {
        let kernel = Kernel::QuantLinear {
            bits: *bits,
            group: *group,
            zero_points: *zero_points,
            dynamic: *dynamic,
            asymmetric: *asymmetric,
            act_scale: *act_scale,
            act_zero_point: *act_zero_point,
        };
        quant_linear_unpacked(&kernel, cx, ins, outs)
    };
    QuantConv {
        stride, padding, dilation, groups, epilogue, layout, dynamic, asymmetric, act_scale, act_zero_point, out_scale,
        out_zero_point, res_scale, res_zero_point
    } => {
        let kernel = Kernel::QuantConv {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups: *groups,
            epilogue: *epilogue,
            layout: *layout,
            dynamic: *dynamic,
            asymmetric: *asymmetric,
            act_scale: *act_scale,
            act_zero_point: *act_zero_point,
            out_scale: *out_scale,
            out_zero_point: *out_zero_point,
            res_scale: *res_scale,
            res_zero_point: *res_zero_point,
        };
        quant_conv_unpacked(&kernel, ints, cx, ins, outs)
    };
    ConvFused { groups, epilogue, layout } => conv_fused(None, *groups, epilogue, *layout, ints, cx, ins, outs);
    LinearFused { epilogue } => linear_fused(None, epilogue, cx, ins, outs);
}
