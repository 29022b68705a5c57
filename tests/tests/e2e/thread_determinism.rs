//! Results are bit-identical whatever the thread count: every fixture model
//! (the small PyTorch fixtures, both IR flavours, and the real-model
//! topologies) runs at 1, 2, 3 and 4 threads, and every output's bytes must
//! equal the 1-thread run's (at 2 threads also with the pool's spinning
//! off, the parking path). Also: a run does no B packing for the
//! constant weights that were packed at load.

use kiln_runtime::{SessionOptions, Tensor, TensorView};
use kiln_tests::{fixture_dir, load_fixture, read_numbered, FIXTURES, FLAVOURS};

const THREADS: [usize; 4] = [1, 2, 3, 4];

fn output_bytes(program: &std::sync::Arc<kiln_runtime::Program>, threads: usize, inputs: &[Tensor]) -> Vec<Vec<u8>> {
    output_bytes_with(program, &SessionOptions::with_threads(threads), inputs)
}

fn output_bytes_with(
    program: &std::sync::Arc<kiln_runtime::Program>,
    opts: &SessionOptions,
    inputs: &[Tensor],
) -> Vec<Vec<u8>> {
    let threads = opts.threads;
    let mut session = program.session_with(opts).expect("session");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).unwrap_or_else(|e| panic!("run at {threads} threads: {e}"));
    outputs.iter().map(|o| o.data.to_vec()).collect()
}

fn check(fixture: &str, flavour: &str) {
    let dir = fixture_dir(fixture);
    let program = load_fixture(fixture, flavour);
    for prefix in ["input", "alt_input"] {
        let inputs = read_numbered(&dir, prefix);
        if inputs.is_empty() {
            continue;
        }
        let want = output_bytes(&program, 1, &inputs);
        assert!(!want.is_empty(), "{fixture}/{flavour}: no outputs");
        let parked = SessionOptions { spin: false, ..SessionOptions::with_threads(2) };
        let runs = THREADS[1..].iter().map(|&t| SessionOptions::with_threads(t)).chain([parked]);
        for opts in runs {
            let got = output_bytes_with(&program, &opts, &inputs);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (t, spin) = (opts.threads, opts.spin);
                assert!(
                    g == w,
                    "{fixture}/{flavour} ({prefix}) output {i}: {t} threads (spin {spin}) differ from 1 thread"
                );
            }
        }
    }
}

#[test]
fn fixtures_are_bit_identical_at_every_thread_count() {
    for name in FIXTURES {
        for flavour in FLAVOURS {
            check(name, flavour);
        }
    }
}

#[test]
fn real_models_are_bit_identical_at_every_thread_count() {
    for name in ["resnet18", "mobilenet_v2", "efficientnet_b0", "bert", "llama", "qwen3_moe", "mixtral", "gpt2", "vit"]
    {
        check(&format!("models/{name}"), "aten");
    }
}

#[test]
fn constant_weights_are_not_repacked_per_run() {
    // The MLP's layers are linears with constant weights: all packed at load.
    let dir = fixture_dir("mlp");
    let program = load_fixture("mlp", "aten");
    let inputs = read_numbered(&dir, "input");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let mut session = program.session_with(&SessionOptions::with_threads(2)).expect("session");
    assert!(program.packed_weights() > 0, "no weights were packed at load");
    session.run(&views).expect("run");
    session.run(&views).expect("run");
    assert_eq!(session.gemm_b_packs(), 0, "a run packed constant weights");
    // Convolution weights (the im2col GEMM's A) are packed at load too.
    assert!(load_fixture("models/resnet18", "aten").packed_weights() > 0, "resnet18's conv weights were not packed");
    // Llama's projections without an epilogue stay `matmul`s by a constant
    // weight: packed at load like the fused linears, run by the same GEMM.
    let llama = load_fixture("models/llama", "aten");
    let gemms = llama.plan().instrs.iter().filter(|i| matches!(i.op.name(), "matmul" | "linear_fused")).count();
    assert!(gemms > 0);
    assert_eq!(llama.packed_weights(), gemms, "a llama projection's weight was not packed at load");
}

/// The CPU-speed kernels at sizes that take their threaded paths: a conv
/// with ReLU6 and a residual fused into its store step, a depthwise conv
/// with a fused ReLU, a standalone clamp, a 3×3/2 max pool (threaded over
/// planes) and a linear with a fused GELU and residual.
#[test]
fn fused_epilogues_clamp_and_pool_are_bit_identical_at_every_thread_count() {
    use kiln_compiler::{compile_graph_with_passes, CompileOptions};
    use kiln_ir::{BinaryOp, ConstBytes, DType, Graph, Op, TensorType, UnaryOp};
    use kiln_passes::{default_pipeline, Target};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut g = Graph::new();
    let ty = |s: &[i64]| TensorType::fixed(DType::F32, s);
    let mut constant = |g: &mut Graph, s: &[i64]| {
        let bytes: Vec<u8> =
            (0..s.iter().product::<i64>()).flat_map(|_| rng.gen_range(-0.3f32..0.3).to_le_bytes()).collect();
        g.add_const(None, ty(s), ConstBytes::owned(bytes))
    };
    let x = g.add_input("x", ty(&[1, 16, 56, 56]));
    let conv = |stride: i64, groups: i64, pad: i64| Op::Conv {
        stride: vec![stride; 2],
        padding: vec![pad; 2],
        dilation: vec![1; 2],
        groups,
    };
    let (w1, b1) = (constant(&mut g, &[16, 16, 3, 3]), constant(&mut g, &[16]));
    let y = g.push(conv(1, 1, 1), vec![x, w1, b1], ty(&[1, 16, 56, 56]), None);
    let y = g.push(Op::Binary(BinaryOp::Add), vec![y, x], ty(&[1, 16, 56, 56]), None);
    let y = g.push(Op::Clamp { min: Some(0.0), max: Some(6.0) }, vec![y], ty(&[1, 16, 56, 56]), None);
    let (w2, b2) = (constant(&mut g, &[16, 1, 3, 3]), constant(&mut g, &[16]));
    let d = g.push(conv(1, 16, 1), vec![y, w2, b2], ty(&[1, 16, 56, 56]), None);
    let d = g.push(Op::Unary(UnaryOp::Relu), vec![d], ty(&[1, 16, 56, 56]), None);
    // Read twice: the clamp stays a kernel of its own.
    let c = g.push(Op::Clamp { min: Some(-0.5), max: None }, vec![d], ty(&[1, 16, 56, 56]), None);
    let pool = Op::Pool {
        kind: kiln_ir::PoolKind::Max,
        kernel: vec![3, 3],
        stride: vec![2, 2],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        ceil_mode: false,
        count_include_pad: false,
        divisor: None,
        layout: kiln_ir::Layout::ChannelsFirst,
    };
    let p = g.push(pool, vec![c], ty(&[1, 16, 28, 28]), None);
    let flat = g.push(Op::Reshape { shape: vec![16.into(), 784.into()] }, vec![p], ty(&[16, 784]), None);
    let (wl, bl) = (constant(&mut g, &[784, 784]), constant(&mut g, &[784]));
    let l = g.push(Op::Linear, vec![flat, wl, bl], ty(&[16, 784]), None);
    let l = g.push(Op::Unary(UnaryOp::Gelu), vec![l], ty(&[16, 784]), None);
    let l = g.push(Op::Binary(BinaryOp::Add), vec![flat, l], ty(&[16, 784]), None);
    g.add_output("y", l);
    g.add_output("d", d);
    let opts = CompileOptions { target: Target::Cpu, verify_each: true, ..CompileOptions::default() };
    let (writer, _) =
        compile_graph_with_passes(g, &default_pipeline(Target::Cpu), &opts, Default::default()).expect("compile");
    let program = kiln_runtime::Program::from_bytes(&writer.to_bytes()).expect("load");
    let kernels: Vec<&str> = program.plan().instrs.iter().map(|i| i.op.name()).collect();
    for k in ["conv_fused", "clamp", "max_pool", "linear_fused"] {
        assert!(kernels.contains(&k), "no {k} in {kernels:?}");
    }
    let input: Vec<f32> = (0..16 * 56 * 56).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let inputs = [Tensor::from_f32(&[1, 16, 56, 56], &input)];
    let want = output_bytes(&program, 1, &inputs);
    for t in &THREADS[1..] {
        assert!(output_bytes(&program, *t, &inputs) == want, "{t} threads differ from 1 thread");
    }
}
