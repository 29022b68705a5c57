//! Kernel parameters are checked at load by their kind, as `kernels!`
//! declares (`axis: u32 => axis`): every declared check refuses a wrong
//! value with a message naming the parameter, and a right one loads.

use kiln_runtime::format::*;
use kiln_runtime::{Error, Program};

mod common;
use common::arena;

/// One call of `kernel` on a rank-2 (`[2, 3]`) or rank-4 (`[1, 1, 2, 3]`)
/// operand, as many times as the opcode takes at least, into a tensor of the
/// same shape.
fn load(kernel: Kernel, rank: usize) -> Result<std::sync::Arc<Program>, Error> {
    let shape: &[u64] = if rank == 4 { &[1, 1, 2, 3] } else { &[2, 3] };
    let operands = kernel.opcode().operands().0.max(1) as usize;
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![arena(shape, 0), arena(shape, 64)],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: 1, complex: false }],
        instrs: vec![Instr {
            op: InstrOp::Call(kernel),
            inputs: vec![0; operands],
            outputs: vec![1],
            origin: "test".into(),
        }],
        arena_bytes: 128,
        peak_live_bytes: 128,
        states: vec![],
    };
    let bytes = ArtifactWriter::new(&plan, WeightsBuilder::new(), &Metadata::default()).unwrap().to_bytes();
    Program::from_bytes(&bytes)
}

fn conv(stride: Vec<u32>, padding: Vec<u32>, dilation: Vec<u32>, groups: u32) -> Kernel {
    Kernel::Conv { stride, padding, dilation, groups }
}

fn conv_fused(stride: Vec<u32>, padding: Vec<u32>, dilation: Vec<u32>, groups: u32) -> Kernel {
    let epilogue = Epilogue { bias: false, activation: None, residual: Default::default() };
    Kernel::ConvFused { stride, padding, dilation, groups, epilogue, layout: Layout::ChannelsFirst }
}

fn quant_conv(stride: Vec<u32>, padding: Vec<u32>, dilation: Vec<u32>, groups: u32) -> Kernel {
    Kernel::QuantConv {
        stride,
        padding,
        dilation,
        groups,
        epilogue: Epilogue::default(),
        layout: Layout::ChannelsFirst,
        dynamic: true,
        asymmetric: false,
        act_scale: None,
        act_zero_point: 0,
        out_scale: None,
        out_zero_point: 0,
        res_scale: None,
        res_zero_point: 0,
    }
}

fn pad(lo: Vec<i64>, hi: Vec<i64>, interior: Vec<i64>) -> Kernel {
    Kernel::Pad { lo, hi, interior, mode: PadMode::Constant, value: 0.0 }
}

/// For every (opcode, parameter) with a declared check: a kernel whose
/// parameter breaks it (the others right), the operand rank, the parameter.
fn wrong_parameters() -> Vec<(Kernel, usize, &'static str)> {
    let two = || vec![1u32, 1];
    vec![
        (conv(vec![1], two(), two(), 1), 4, "stride"),
        (conv(two(), vec![0, 0, 0], two(), 1), 4, "padding"),
        (conv(two(), two(), vec![], 1), 4, "dilation"),
        (conv(two(), two(), two(), 0), 4, "groups"),
        (conv_fused(vec![1], two(), two(), 1), 4, "stride"),
        (conv_fused(two(), vec![0], two(), 1), 4, "padding"),
        (conv_fused(two(), two(), vec![1], 1), 4, "dilation"),
        (conv_fused(two(), two(), two(), 0), 4, "groups"),
        (quant_conv(vec![1, 1, 1], two(), two(), 1), 4, "stride"),
        (quant_conv(two(), vec![0], two(), 1), 4, "padding"),
        (quant_conv(two(), two(), vec![], 1), 4, "dilation"),
        (quant_conv(two(), two(), two(), 0), 4, "groups"),
        (Kernel::LayerNorm { normalized_rank: 3, eps: 1e-5 }, 2, "normalized_rank"),
        (Kernel::RmsNorm { normalized_rank: 5, eps: 1e-5 }, 4, "normalized_rank"),
        (Kernel::Softmax { axis: 2, log: false }, 2, "axis"),
        (Kernel::Reduce { kind: ReduceKind::Sum, axes: vec![0, 2] }, 2, "axes"),
        (Kernel::ArgMax { axis: 2 }, 2, "axis"),
        (Kernel::ArgMin { axis: 4 }, 4, "axis"),
        (Kernel::Slice { axis: 2, start: 0, step: 1 }, 2, "axis"),
        (Kernel::Slice { axis: 1, start: 0, step: 0 }, 2, "step"),
        (Kernel::SliceFromEnd { axis: 2, back: 1, step: 1 }, 2, "axis"),
        (Kernel::SliceFromEnd { axis: 0, back: 1, step: 0 }, 2, "step"),
        (Kernel::Concat { axis: 2 }, 2, "axis"),
        (Kernel::Gather { axis: 2 }, 2, "axis"),
        (Kernel::CumSum { axis: 2 }, 2, "axis"),
        (Kernel::Scan { axis: 2, kind: ScanKind::Max }, 2, "axis"),
        (Kernel::Sort { axis: 2, descending: false, indices: false }, 2, "axis"),
        (pad(vec![0], vec![0, 0], vec![0, 0]), 2, "lo"),
        (pad(vec![0, 0], vec![0, 0, 0], vec![0, 0]), 2, "hi"),
        (pad(vec![0, 0], vec![0, 0], vec![]), 2, "interior"),
        (Kernel::Flip { axes: vec![1, 2] }, 2, "axes"),
        (Kernel::GatherElements { axis: 2 }, 2, "axis"),
        (Kernel::ScatterElements { axis: 2, reduce: None, include_self: true }, 2, "axis"),
    ]
}

#[test]
fn every_declared_parameter_check_refuses_a_wrong_value_at_load() {
    let cases = wrong_parameters();
    for &op in Opcode::ALL {
        for &(field, check) in Kernel::param_checks(op) {
            assert!(
                cases.iter().any(|(k, _, f)| k.opcode() == op && *f == field),
                "no case breaks `{field}` ({check}) of {op}"
            );
        }
    }
    for (kernel, rank, field) in cases {
        let name = kernel.name();
        match load(kernel, rank) {
            Err(Error::Plan(m)) => {
                assert!(m.starts_with(&format!("instruction 0 ({name}, test): parameter `{field}`")), "{name}: {m}");
            }
            Err(other) => panic!("{name}: expected a plan error, got {other}"),
            Ok(_) => panic!("{name}: a wrong `{field}` was accepted"),
        }
    }
}

#[test]
fn right_parameters_load() {
    let two = || vec![1u32, 1];
    for (kernel, rank) in [
        (Kernel::Softmax { axis: 1, log: false }, 2),
        (Kernel::Reduce { kind: ReduceKind::Max, axes: vec![0, 1] }, 2),
        (Kernel::Slice { axis: 1, start: 0, step: 2 }, 2),
        (Kernel::Concat { axis: 1 }, 2),
        (Kernel::LayerNorm { normalized_rank: 2, eps: 1e-5 }, 2),
        (pad(vec![0, 1], vec![0, 0], vec![0, 0]), 2),
        (conv(two(), vec![0, 0], two(), 1), 4),
        (quant_conv(two(), vec![0, 0], two(), 1), 4),
    ] {
        let name = kernel.name();
        load(kernel, rank).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_wrong_axis_is_refused_with_a_clear_message() {
    let Err(Error::Plan(m)) = load(Kernel::Softmax { axis: 7, log: true }, 2) else { panic!("accepted") };
    assert_eq!(m, "instruction 0 (log_softmax, test): parameter `axis` = 7 is out of range for rank 2");
}

/// `y = copy(x)` over tensors of `dtype` and `shape`, both declared complex
/// (`IoDecl::complex`) when `complex` is set.
fn complex_copy(dtype: DType, shape: &[u64], complex: bool) -> Result<std::sync::Arc<Program>, Error> {
    let bytes = shape.iter().product::<u64>() * dtype.size_bytes() as u64;
    let decl = |offset| TensorDecl {
        dtype,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage: Storage::Arena { offset, max_bytes: bytes },
    };
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![decl(0), decl(bytes.next_multiple_of(64))],
        inputs: vec![IoDecl { name: "z".into(), tensor: 0, complex }],
        outputs: vec![IoDecl { name: "w".into(), tensor: 1, complex }],
        instrs: vec![Instr {
            op: InstrOp::Call(Kernel::Copy {}),
            inputs: vec![0],
            outputs: vec![1],
            origin: "test".into(),
        }],
        arena_bytes: 2 * bytes.next_multiple_of(64),
        peak_live_bytes: 2 * bytes,
        states: vec![],
    };
    let bytes = ArtifactWriter::new(&plan, WeightsBuilder::new(), &Metadata::default()).unwrap().to_bytes();
    Program::from_bytes(&bytes)
}

/// A complex input or output is an f32/f64 tensor with a last dimension of
/// 2, seen by the caller as c64/c128 of the other dimensions.
#[test]
fn complex_inputs_and_outputs_are_their_parts() {
    let program = complex_copy(DType::F32, &[3, 2], true).expect("load");
    let io = &program.inputs()[0];
    assert_eq!((io.dtype, io.shape.clone()), (DType::C64, vec!["3".to_string()]));
    assert_eq!(program.outputs()[0].dtype, DType::C64);
    let data: Vec<u8> = [1.0f32, -2.0, 3.5, 0.25, -0.0, 7.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let z = kiln_runtime::Tensor { dtype: DType::C64, shape: vec![3], data };
    let mut session = program.session().expect("session");
    let out = session.run(&[z.view()]).expect("run").to_tensors();
    assert_eq!(out[0], z, "the same bytes, shape and dtype come back");
    let pairs = kiln_runtime::Tensor { dtype: DType::F32, shape: vec![3, 2], data: z.data.clone() };
    let err = session.run(&[pairs.view()]).unwrap_err().to_string();
    assert!(err.contains("dtype is f32, expected c64"), "{err}");
    let wide = complex_copy(DType::F64, &[1, 4, 2], true).expect("load c128");
    assert_eq!(wide.inputs()[0].dtype, DType::C128);
    assert_eq!(wide.inputs()[0].shape, ["1", "4"]);
}

#[test]
fn malformed_complex_declarations_are_refused_at_load() {
    for (dtype, shape, what) in [
        (DType::I64, &[3, 2][..], "not f32/f64 with a last dimension of 2"),
        (DType::F16, &[3, 2], "not f32/f64 with a last dimension of 2"),
        (DType::F32, &[3, 3], "not f32/f64 with a last dimension of 2"),
        (DType::F32, &[], "not f32/f64 with a last dimension of 2"),
    ] {
        let err = complex_copy(dtype, shape, true).err().expect("a bad complex declaration loaded").to_string();
        assert!(err.contains(what), "{dtype} {shape:?}: {err}");
    }
    // No plan tensor is complex itself: kernels compute on the parts.
    let err = complex_copy(DType::C64, &[3], false).err().expect("a c64 plan tensor loaded").to_string();
    assert!(err.contains("complex tensors exist only as an input's or output's view"), "{err}");
}

/// A plan of one call of `kernel` on `tensors` (`(dtype, shape)`, all in the
/// arena; the last is the output, the others its operands in order).
fn load_call(kernel: Kernel, tensors: &[(DType, &[u64])]) -> Result<std::sync::Arc<Program>, Error> {
    let mut offset = 0;
    let decls: Vec<TensorDecl> = tensors
        .iter()
        .map(|&(dtype, shape)| {
            let bytes = shape.iter().product::<u64>() * dtype.size_bytes() as u64;
            let decl = TensorDecl {
                dtype,
                shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
                storage: Storage::Arena { offset, max_bytes: bytes },
            };
            offset += bytes.next_multiple_of(64);
            decl
        })
        .collect();
    let out = decls.len() as u32 - 1;
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: decls,
        inputs: (0..out).map(|i| IoDecl { name: format!("x{i}"), tensor: i, complex: false }).collect(),
        outputs: vec![IoDecl { name: "y".into(), tensor: out, complex: false }],
        instrs: vec![Instr {
            op: InstrOp::Call(kernel),
            inputs: (0..out).collect(),
            outputs: vec![out],
            origin: "test".into(),
        }],
        arena_bytes: offset,
        peak_live_bytes: offset,
        states: vec![],
    };
    let bytes = ArtifactWriter::new(&plan, WeightsBuilder::new(), &Metadata::default()).unwrap().to_bytes();
    Program::from_bytes(&bytes)
}

/// int8 residuals: an i8 residual needs its parameters (and parameters an
/// i8 residual), a dense layer gives i8 after a residual; a pool of i8
/// values is a channels-last max pool.
#[test]
fn int8_residuals_and_pools_are_checked_at_load() {
    let nhwc: &[u64] = &[1, 2, 3, 4];
    let quant_conv = |res_scale: Option<f64>, out_scale: Option<f64>| Kernel::QuantConv {
        stride: vec![1, 1],
        padding: vec![0, 0],
        dilation: vec![1, 1],
        groups: 1,
        epilogue: Epilogue { bias: false, activation: None, residual: kiln_isa::Residual::BeforeActivation },
        layout: Layout::ChannelsLast,
        dynamic: false,
        asymmetric: false,
        act_scale: Some(0.5),
        act_zero_point: 0,
        out_scale,
        out_zero_point: 0,
        res_scale,
        res_zero_point: if res_scale.is_some() { 3 } else { 0 },
    };
    let call = |res: DType, res_scale: Option<f64>, out: DType, out_scale: Option<f64>| {
        let tensors =
            [(DType::I8, nhwc), (DType::I8, &[4, 4, 1, 1][..]), (DType::F32, &[4][..]), (res, nhwc), (out, nhwc)];
        load_call(quant_conv(res_scale, out_scale), &tensors)
    };
    call(DType::I8, Some(0.25), DType::I8, Some(0.5)).expect("i8 residual, i8 result");
    call(DType::I8, Some(0.25), DType::F32, None).expect("i8 residual, f32 result");
    call(DType::F32, None, DType::I8, Some(0.5)).expect("f32 residual, i8 result");
    for (res, res_scale, why) in [
        (DType::I8, None, "needs its parameters"),
        (DType::F32, Some(0.25), "needs a dense"),
        (DType::I8, Some(0.0), "needs a dense"),
    ] {
        let Err(Error::Plan(m)) = call(res, res_scale, DType::F32, None) else {
            panic!("{res} {res_scale:?}: accepted")
        };
        assert!(m.contains(why), "{m}");
    }
    let pool = |kind: PoolKind, layout: Layout| Kernel::Pool {
        kind,
        layout,
        kernel: vec![2, 2],
        stride: vec![1, 1],
        padding: vec![0, 0],
        dilation: vec![1, 1],
        count_include_pad: false,
        divisor: None,
    };
    let pooled: &[u64] = &[1, 1, 2, 4];
    load_call(pool(PoolKind::Max, Layout::ChannelsLast), &[(DType::I8, nhwc), (DType::I8, pooled)]).expect("i8 max");
    for (kind, layout) in [(PoolKind::Avg, Layout::ChannelsLast), (PoolKind::Max, Layout::ChannelsFirst)] {
        let shapes: [&[u64]; 2] =
            if layout == Layout::ChannelsFirst { [&[1, 4, 2, 3], &[1, 4, 1, 2]] } else { [nhwc, pooled] };
        let Err(Error::Plan(m)) = load_call(pool(kind, layout), &[(DType::I8, shapes[0]), (DType::I8, shapes[1])])
        else {
            panic!("{kind:?} {layout:?}: accepted")
        };
        assert!(m.contains("channels-last max pool"), "{m}");
    }
}
