//! The passes read the target description: a description of the test's own
//! changes what decomposition keeps, what legalisation casts and which passes
//! the pipeline runs.
mod common;
use common::*;
use kiln_ir::{DType, Graph, Op, PoolKind, TensorType, UnaryOp};
use kiln_passes::{
    decompose, legalize_dtypes, pipeline_for, run_pipeline, Changed, OpKind, OpRow, OpTable, Options, Support, Target,
    TargetDesc, DCE, FUSE, LEGALIZE,
};

fn custom(desc: TargetDesc) -> Options {
    Options { verify_each: true, ..Options::for_desc(desc) }
}

#[test]
fn the_three_targets() {
    let linear = Op::Linear;
    let bn = Op::BatchNorm { eps: 1e-5 };
    assert!(Target::Cpu.desc().keeps(&linear) && Target::Pjrt.desc().keeps(&linear));
    assert!(!Target::Primitive.desc().keeps(&linear));
    // No target keeps BatchNorm, though the CPU has a kernel for it.
    assert!(Target::ALL.iter().all(|t| !t.desc().keeps(&bn)));
    assert!(Target::Cpu.desc().kernel_support(&bn) != Support::No);
    // Primitives are kept everywhere.
    assert!(Target::ALL.iter().all(|t| t.desc().keeps(&Op::Unary(UnaryOp::Exp))));
    // The CPU composites compute in f32 and f64; element-wise kernels take any dtype.
    let cpu = Target::Cpu.desc();
    assert!(cpu.kernel_takes(&Op::MatMul, DType::F64) && !cpu.kernel_takes(&Op::MatMul, DType::F16));
    assert!(cpu.kernel_takes(&Op::Unary(UnaryOp::Neg), DType::I8));
    // Only PJRT has accelerator segments; its CPU nodes run the CPU kernels.
    assert!(Target::Cpu.desc().segments.is_none() && Target::Primitive.desc().segments.is_none());
    let pjrt = Target::Pjrt.desc();
    assert_eq!(pjrt.kernels, cpu.kernels);
    let segments = pjrt.segments.unwrap();
    assert!(segments.takes(OpKind::Unary(UnaryOp::Exp), Some(DType::BF16)));
    assert!(!segments.takes(OpKind::Unary(UnaryOp::Erf), Some(DType::F64)));
    assert_eq!(segments.support(OpKind::Scan), Support::No);
    assert!(segments.takes(OpKind::Sort, Some(DType::F32)) && !segments.takes(OpKind::Sort, Some(DType::Bool)));
    assert_eq!(
        segments.why_not(OpKind::Pool(PoolKind::ArgMax), Some(DType::F32)),
        Some("max pooling's indices (a CPU kernel only)")
    );
}

#[test]
fn decompose_keeps_what_the_description_lists() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3]));
    let y = push(&mut g, Op::LogSoftmax { axis: 1 }, vec![x], &[2, 3]);
    g.add_output("y", y);
    let keeps_log_softmax = TargetDesc { composites: &[OpKind::LogSoftmax], ..Target::Cpu.desc().clone() };
    assert_eq!(decompose(&mut g.clone(), &custom(keeps_log_softmax)).unwrap(), Changed::No);
    assert_eq!(decompose(&mut g, &opts(Target::Cpu)).unwrap(), Changed::Yes);
}

/// A table where matmul also takes f16 and nothing else is restricted.
static F16_MATMUL: OpTable =
    OpTable { others: Support::Any, rows: &[OpRow::only(OpKind::MatMul, &[DType::F16, DType::F32, DType::F64])] };

static NO_RESTRICTIONS: OpTable = OpTable { others: Support::Any, rows: &[] };

static NO_CONV: OpTable = OpTable { others: Support::Any, rows: &[OpRow::no(OpKind::Conv)] };

#[test]
fn legalize_casts_where_the_kernel_lacks_the_dtype() {
    let mut g = Graph::new();
    let ty = TensorType::fixed(DType::F16, &[2, 2]);
    let a = g.add_input("a", ty.clone());
    let y = g.push(Op::MatMul, vec![a, a], ty, None);
    g.add_output("y", y);
    let f16_matmul = TargetDesc { kernels: &F16_MATMUL, ..Target::Cpu.desc().clone() };
    assert_eq!(legalize_dtypes(&mut g.clone(), &custom(f16_matmul)).unwrap(), Changed::No);
    assert_eq!(legalize_dtypes(&mut g, &opts(Target::Cpu)).unwrap(), Changed::Yes);
    assert_eq!(ops(&g), ["cast", "cast", "matmul", "cast"]);
}

#[test]
fn the_pipeline_follows_the_description() {
    let names = |desc: &TargetDesc| pipeline_for(desc).iter().map(|p| p.name).collect::<Vec<_>>();
    for t in Target::ALL {
        let mut want = vec!["cleanup", "decompose", "cleanup", "fuse", "legalize", "dce"];
        // Elementwise fusion is for the CPU's fused kernel only, and so are
        // the channels-last layout (the CPU's convolution kernels) and the
        // int8 handoff between quantized convolutions (after the layout).
        if t == Target::Cpu {
            let cpu = [
                "fuse_attention",
                "simplify",
                "fuse_norm",
                "fuse_epilogue",
                "fuse_shared_input",
                "fuse_elementwise",
                "layout",
                "quant_acts",
                "quant_residuals",
            ];
            want.splice(5..5, cpu);
        }
        // Integer weights are kept for the CPU's quantized linear kernel and
        // for segments, which lower it to integer StableHLO.
        if t != Target::Primitive {
            want.splice(0..0, ["simplify", "quant_linear"]);
        }
        assert_eq!(names(t.desc()), want, "{t}");
    }
    let unrestricted = TargetDesc { kernels: &NO_RESTRICTIONS, ..Target::Cpu.desc().clone() };
    assert!(!pipeline_for(&unrestricted).iter().any(|p| p.name == LEGALIZE.name));
    let no_conv = TargetDesc { kernels: &NO_CONV, ..Target::Cpu.desc().clone() };
    let passes = pipeline_for(&no_conv);
    assert!(!passes.iter().any(|p| p.name == FUSE.name));
    assert_eq!(passes.last().map(|p| p.name), Some(DCE.name));
    // And the pipeline runs under its description.
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3]));
    let y = push(&mut g, Op::Softmax { axis: 1 }, vec![x], &[2, 3]);
    g.add_output("y", y);
    run_pipeline(&mut g, &pipeline_for(&unrestricted), &custom(unrestricted.clone())).unwrap();
    assert_eq!(ops(&g), ["softmax"]);
}

/// A target whose kernels take channels-last tensors: the IR's channels-first
/// ops are refused before any pass runs; a graph without them compiles.
#[test]
fn a_channels_last_target_refuses_channels_first_ops() {
    let desc = TargetDesc { layout: kiln_passes::Layout::ChannelsLast, ..Target::Cpu.desc().clone() };
    let mut conv = Graph::new();
    let x = conv.add_input("x", f32_ty(&[1, 3, 8, 8]));
    let w = const_f32(&mut conv, &[4, 3, 1, 1], &[0.5; 12]);
    let op = Op::Conv { stride: vec![1, 1], padding: vec![0, 0], dilation: vec![1, 1], groups: 1 };
    let y = push(&mut conv, op, vec![x, w], &[1, 4, 8, 8]);
    conv.add_output("y", y);
    let err = run_pipeline(&mut conv.clone(), &pipeline_for(&desc), &custom(desc.clone())).unwrap_err();
    assert_eq!(err.pass, "layout");
    assert!(err.message.contains("channels-last") && err.message.contains("conv"), "{err}");
    // The same graph compiles for the CPU, whose kernels take the IR's layout.
    let cpu = Target::Cpu.desc();
    run_pipeline(&mut conv, &pipeline_for(cpu), &custom(cpu.clone())).unwrap();

    let mut mlp = Graph::new();
    let x = mlp.add_input("x", f32_ty(&[2, 3]));
    let w = const_f32(&mut mlp, &[4, 3], &[0.25; 12]);
    let h = push(&mut mlp, Op::Linear, vec![x, w], &[2, 4]);
    let y = push(&mut mlp, Op::Unary(UnaryOp::Relu), vec![h], &[2, 4]);
    mlp.add_output("y", y);
    run_pipeline(&mut mlp, &pipeline_for(&desc), &custom(desc.clone())).unwrap();
    desc.check_layout(&mlp).unwrap();
}

/// The memory planner aligns every buffer to the target's vector width (and
/// to at least a cache line).
#[test]
fn buffers_are_aligned_to_the_target_vector_width() {
    use kiln_passes::{check_plan, plan_memory, MemoryOptions, CACHE_LINE};
    // Three small values live at once: with 64-byte alignment some would sit
    // at odd multiples of 64.
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4]));
    let a = push(&mut g, Op::Unary(UnaryOp::Exp), vec![x], &[4]);
    let b = push(&mut g, Op::Unary(UnaryOp::Neg), vec![a], &[4]);
    let c = push(&mut g, Op::Binary(kiln_ir::BinaryOp::Add), vec![a, b], &[4]);
    g.add_output("c", c);
    g.add_output("x", x);
    for (vector_bytes, alignment) in [(16, CACHE_LINE), (64, 64), (128, 128), (256, 256)] {
        let desc = TargetDesc { vector_bytes, ..Target::Cpu.desc().clone() };
        let opts = MemoryOptions::for_target(&desc);
        assert_eq!(opts.alignment, alignment);
        let plan = plan_memory(&g, &opts).unwrap();
        check_plan(&g, &plan).unwrap();
        assert_eq!(plan.alignment, alignment);
        let offsets: Vec<u64> = [x, a, b, c].iter().map(|&v| plan.slots[v].unwrap().offset).collect();
        assert!(offsets.iter().all(|o| o % alignment == 0), "{vector_bytes}: {offsets:?}");
        assert!(offsets.iter().any(|&o| o == 3 * alignment), "{vector_bytes}: {offsets:?}");
        assert_eq!(plan.arena_bytes % alignment, 0);
    }
    let odd = MemoryOptions { alignment: 48, ..MemoryOptions::default() };
    assert!(plan_memory(&g, &odd).unwrap_err().message.contains("power of two"));
}
