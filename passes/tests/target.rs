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
    assert_eq!(segments.support(OpKind::Sort), Support::No);
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
        // Elementwise fusion is for the CPU's fused kernel only.
        if t == Target::Cpu {
            want.splice(5..5, ["fuse_attention", "fuse_norm", "fuse_epilogue", "fuse_elementwise"]);
            // Integer weights are kept for the CPU's quantized linear kernel.
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
