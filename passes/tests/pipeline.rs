mod common;
use common::*;
use kiln_ir::{BinaryOp, Graph, Op, UnaryOp};
use kiln_passes::{default_pipeline, run_pipeline, Changed, Options, Pass, PassError, Target, DCE};

/// Conv-free CNN head + MLP as torch.export hands it over: BatchNorm with constant
/// statistics, adaptive pooling to 1x1, a reshape, and two linears.
fn model() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 4, 3, 3]));
    let params: Vec<_> = (0..4)
        .map(|i| const_f32(&mut g, &[4], &data(4, i).iter().map(|v| v.abs() + 0.1).collect::<Vec<_>>()))
        .collect();
    let bn = push(&mut g, Op::BatchNorm { eps: 1e-5 }, [vec![x], params].concat(), &[2, 4, 3, 3]);
    let r = push(&mut g, Op::Unary(UnaryOp::Relu), vec![bn], &[2, 4, 3, 3]);
    let p = push(&mut g, Op::AdaptiveAvgPool { output: vec![1, 1] }, vec![r], &[2, 4, 1, 1]);
    let flat = push(&mut g, Op::Reshape { shape: vec![2.into(), 4.into()] }, vec![p], &[2, 4]);
    let w1 = const_f32(&mut g, &[8, 4], &data(32, 5));
    let b1 = const_f32(&mut g, &[8], &data(8, 6));
    let h = push(&mut g, Op::Linear, vec![flat, w1, b1], &[2, 8]);
    // Core ATen form of the second linear: permute(weight) + matmul + add.
    let w2 = const_f32(&mut g, &[3, 8], &data(24, 7));
    let w2t = push(&mut g, Op::Permute { perm: vec![1, 0] }, vec![w2], &[8, 3]);
    let mm = push(&mut g, Op::MatMul, vec![h, w2t], &[2, 3]);
    let b2 = const_f32(&mut g, &[3], &data(3, 8));
    let y = push(&mut g, Op::Binary(BinaryOp::Add), vec![mm, b2], &[2, 3]);
    let s = push(&mut g, Op::LogSoftmax { axis: 1 }, vec![y], &[2, 3]);
    g.add_output("logp", s);
    g
}

#[test]
fn cpu_pipeline() {
    let mut g = model();
    let report = run_pipeline(&mut g, &default_pipeline(Target::Cpu), &opts(Target::Cpu)).unwrap();
    println!("{report}");
    assert_eq!(
        ops(&g),
        [
            // BatchNorm's per-channel multiply and add, and the relu, in one pass.
            "fused",
            "reduce_mean",
            "reshape",
            "linear",
            // The matmul by the folded constant weight and its bias add:
            // one linear with the bias in its epilogue.
            "linear_fused",
            "reduce_max",
            "sub",
            "exp",
            "reduce_sum",
            "log",
            "sub"
        ]
    );
    // The transposed weight was folded into a constant (and transposed
    // back to the linear's [N, K]).
    let mm = g.order.iter().find(|&&n| matches!(g.nodes[n].op, Op::LinearFused { .. })).unwrap();
    assert!(g.const_of(g.nodes[*mm].inputs[1]).is_some());
    assert_eq!(g.ty(g.nodes[*mm].inputs[1]).shape, [3.into(), 8.into()]);
    assert_eq!(
        report.passes.iter().map(|p| p.name).collect::<Vec<_>>(),
        [
            "simplify",
            "quant_linear",
            "cleanup",
            "decompose",
            "cleanup",
            "fuse",
            "legalize",
            "fuse_attention",
            "simplify",
            "fuse_norm",
            "fuse_epilogue",
            "fuse_shared_input",
            "fuse_elementwise",
            "layout",
            "quant_acts",
            "quant_residuals",
            "dce"
        ]
    );
    assert_eq!(report.passes[2].changed, Changed::Yes);
}

#[test]
fn primitive_pipeline_leaves_no_composites() {
    let mut g = model();
    run_pipeline(&mut g, &default_pipeline(Target::Primitive), &opts(Target::Primitive)).unwrap();
    let composites = ["linear", "batch_norm", "layer_norm", "softmax", "log_softmax", "attention", "adaptive_avg_pool"];
    assert!(ops(&g).iter().all(|o| !composites.contains(o)), "{:?}", ops(&g));
    // Both linears' weights are pre-transposed constants.
    let matmuls: Vec<_> = g.order.iter().filter(|&&n| g.nodes[n].op == Op::MatMul).collect();
    assert_eq!(matmuls.len(), 2);
    assert!(matmuls.iter().all(|&&n| g.const_of(g.nodes[n].inputs[1]).is_some()));
}

#[test]
fn pipeline_is_idempotent() {
    for target in [Target::Cpu, Target::Primitive] {
        let mut g = model();
        let passes = default_pipeline(target);
        run_pipeline(&mut g, &passes, &opts(target)).unwrap();
        let again = run_pipeline(&mut g, &passes, &opts(target)).unwrap();
        assert!(!again.changed(), "{again}");
    }
}

fn break_graph(g: &mut Graph, _: &Options) -> Result<Changed, PassError> {
    // Schedules the first node twice.
    let first = g.order[0];
    g.order.push(first);
    Ok(Changed::Yes)
}

#[test]
fn verify_each_names_the_pass_that_broke_the_graph() {
    let mut g = model();
    let passes = [DCE, Pass { name: "breaker", run: break_graph }];
    let err = run_pipeline(&mut g, &passes, &opts(Target::Cpu)).unwrap_err();
    assert_eq!(err.pass, "breaker");
    assert!(err.to_string().starts_with("pass `breaker`"), "{err}");
}

/// Value attributes survive the default pipeline and compaction: a weight
/// transposed at compile time keeps its origin, and a value that `simplify`
/// replaces hands its attributes to what replaces it.
#[test]
fn value_attributes_survive_the_pipeline() {
    use kiln_ir::ValueAttrs;
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 4]));
    g.values[x].attrs = ValueAttrs::with_origin("x");
    // An identity reshape whose result carries an attribute (as an override
    // attached to it would); `x` gets no second origin, `h` does.
    let h = push(&mut g, Op::Unary(UnaryOp::Tanh), vec![x], &[2, 4]);
    let same = push(&mut g, Op::Reshape { shape: vec![2.into(), 4.into()] }, vec![h], &[2, 4]);
    g.values[same].attrs = ValueAttrs::with_origin("encoder.hidden");
    // Core ATen linear: permute(weight) + matmul.
    let w = const_f32(&mut g, &[3, 4], &data(12, 1));
    g.values[w].attrs = ValueAttrs::with_origin("fc.weight");
    let wt = push(&mut g, Op::Permute { perm: vec![1, 0] }, vec![w], &[4, 3]);
    let y = push(&mut g, Op::MatMul, vec![same, wt], &[2, 3]);
    g.add_output("y", y);

    run_pipeline(&mut g, &default_pipeline(Target::Cpu), &opts(Target::Cpu)).unwrap();
    let g = kiln_passes::compact(&g).unwrap();
    assert_eq!(ops(&g), ["tanh", "matmul"]);
    let origin = |v| g.values[v].attrs.origin.as_deref();
    assert_eq!(origin(g.inputs[0]), Some("x"));
    let (tanh, mm) = (&g.nodes[g.order[0]], &g.nodes[g.order[1]]);
    assert_eq!(origin(tanh.outputs[0]), Some("encoder.hidden"));
    assert_eq!(mm.inputs[0], tanh.outputs[0]);
    let folded = mm.inputs[1];
    assert!(g.const_of(folded).is_some());
    assert_eq!(origin(folded), Some("fc.weight"));
    assert_eq!(g.ty(folded).static_shape(), Some(vec![4, 3]));
}
