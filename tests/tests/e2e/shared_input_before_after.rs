//! Horizontal fusion keeps the numbers: programs compiled with and without
//! the `fuse_shared_input` pass (linear layers over one input as one GEMM
//! with an output per layer) run on the same inputs — random groups of
//! linears and Core ATen matmuls over one input (widths multiples of 32 or
//! not, with and without bias, several epilogue activations), and every
//! fixture and real-model topology. Each output element is the same sum,
//! in the same order, with the same store step as its layer's own GEMM, so
//! the results must be byte for byte the unfused ones, at 1 and 3 threads.

use crate::before_after::{compile, run_at as run};
use kiln_compiler::import::import_pt2;
use kiln_ir::{BinaryOp, ConstBytes, DType, Graph, Op, TensorType, UnaryOp, ValueId};
use kiln_passes::{default_pipeline, Pass, Target, DCE, FUSE_EPILOGUE, FUSE_SHARED_INPUT};
use kiln_runtime::format::Kernel;
use kiln_runtime::{Program, Tensor};
use kiln_tests::{fixture_dir, random_inputs, read_numbered, FIXTURES, FLAVOURS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The outputs of each `linear_fused` call with several of them.
fn split_calls(p: &Program) -> Vec<usize> {
    let plan = p.plan();
    let split = |i: &&kiln_runtime::format::Instr| matches!(i.op.kernel(), Some(Kernel::LinearFused { .. }));
    plan.instrs.iter().filter(split).map(|i| i.outputs.len()).filter(|&n| n > 1).collect()
}

fn same_bytes(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.data == w.data, "{what}: output {i} differs after horizontal fusion");
    }
}

fn constant(g: &mut Graph, rng: &mut StdRng, shape: &[i64]) -> ValueId {
    let n: i64 = shape.iter().product();
    let bytes: Vec<u8> = (0..n).flat_map(|_| rng.gen_range(-0.5f32..0.5).to_le_bytes()).collect();
    g.add_const(None, TensorType::fixed(DType::F32, shape), ConstBytes::owned(bytes))
}

/// Two to four layers over one `[2, m, k]` input, all linears or all Core
/// ATen matmuls on its `[2m, k]` view, all with a bias or none, all with
/// the same activation after them; each result feeds an output through a
/// `neg` (a reader between the layers in the schedule).
fn random_group(rng: &mut StdRng) -> Graph {
    let mut g = Graph::new();
    let (m, k) = ([1i64, 7, 16, 33][rng.gen_range(0..4)], [5i64, 64, 300, 600][rng.gen_range(0..4)]);
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, m, k]));
    let (matmuls, bias) = (rng.gen_bool(0.5), rng.gen_bool(0.5));
    let act = [None, Some(UnaryOp::Relu), Some(UnaryOp::Gelu), Some(UnaryOp::Silu)][rng.gen_range(0..4)];
    let flat = TensorType::fixed(DType::F32, &[2 * m, k]);
    let x2 = g.push(Op::Reshape { shape: vec![(2 * m).into(), k.into()] }, vec![x], flat, None);
    for layer in 0..rng.gen_range(2..5) {
        let n = [32i64, 64, 96, 7, 40, 257][rng.gen_range(0..6)];
        let mut y = if matmuls {
            let w = constant(&mut g, rng, &[k, n]);
            let mut y = g.push(Op::MatMul, vec![x2, w], TensorType::fixed(DType::F32, &[2 * m, n]), None);
            if bias {
                let b = constant(&mut g, rng, &[n]);
                y = g.push(Op::Binary(BinaryOp::Add), vec![y, b], TensorType::fixed(DType::F32, &[2 * m, n]), None);
            }
            y
        } else {
            let mut inputs = vec![x, constant(&mut g, rng, &[n, k])];
            if bias {
                inputs.push(constant(&mut g, rng, &[n]));
            }
            g.push(Op::Linear, inputs, TensorType::fixed(DType::F32, &[2, m, n]), None)
        };
        let ty = g.ty(y).clone();
        if let Some(a) = act {
            y = g.push(Op::Unary(a), vec![y], ty.clone(), None);
        }
        let out = g.push(Op::Unary(UnaryOp::Neg), vec![y], ty, None);
        g.add_output(format!("y{layer}"), out);
    }
    g
}

#[test]
fn random_groups_keep_their_bytes() {
    let mut rng = StdRng::seed_from_u64(2028);
    let mut fused = 0;
    for case in 0..40 {
        let g = random_group(&mut rng);
        let inputs = random_inputs(&g, &mut rng, -3.0, 3.0);
        let before = compile(g.clone(), &[FUSE_EPILOGUE, DCE]);
        let after = compile(g, &[FUSE_EPILOGUE, FUSE_SHARED_INPUT, DCE]);
        fused += split_calls(&after).len();
        let want = run(&before, &inputs, 1);
        for threads in [1, 3] {
            same_bytes(&format!("random group {case} at {threads} threads"), &run(&after, &inputs, threads), &want);
        }
    }
    // Most groups have two layers whose widths allow a split.
    assert!(fused > 20, "only {fused} of 40 random groups fused");
}

/// Every fixture and real-model topology, through the whole CPU pipeline
/// with and without the pass; the attention layers' projections fuse.
#[test]
fn fixtures_and_models_keep_their_bytes() {
    let without: Vec<Pass> =
        default_pipeline(Target::Cpu).into_iter().filter(|p| p.name != FUSE_SHARED_INPUT.name).collect();
    let with = default_pipeline(Target::Cpu);
    let models = ["resnet18", "mobilenet_v2", "bert", "llama"].map(|m| format!("models/{m}"));
    for name in FIXTURES.iter().map(|s| s.to_string()).chain(models) {
        for flavour in FLAVOURS {
            let path = fixture_dir(&name).join(format!("{flavour}.pt2"));
            let import = || import_pt2(&path).expect("import").graph;
            let (before, after) = (compile(import(), &without), compile(import(), &with));
            let splits = split_calls(&after);
            match name.as_str() {
                // Their attention projections over the normed input fuse.
                "models/llama" | "models/bert" => assert!(!splits.is_empty(), "{name}/{flavour}: nothing fused"),
                _ => {}
            }
            let inputs = read_numbered(&fixture_dir(&name), "input");
            let want = run(&before, &inputs, 1);
            same_bytes(&format!("{name}/{flavour}"), &run(&after, &inputs, 2), &want);
        }
    }
}
