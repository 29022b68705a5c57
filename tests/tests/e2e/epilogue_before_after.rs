//! Epilogue fusion keeps the numbers: programs compiled with and without
//! the `fuse_epilogue` pass run on the same random inputs — random
//! convolutions (dense 3×3 at strides 1 and 2, pointwise, grouped,
//! depthwise; with and without bias) and linears / Core ATen matmuls with
//! every epilogue activation (also SiLU and hardswish as Core ATen
//! decomposes them, and GPT-2's `gelu_new` chain) and the
//! residual before, after or absent, and every fixture and real-model
//! topology. ReLU, clamp (ReLU6) and the adds are exact operations done in
//! the same order, so those results must be byte for byte the unfused ones
//! (so must the decomposed SiLU and `gelu_new` on x86: the same sigmoid or
//! tanh vector body, with the same exact steps around it; and hardswish's
//! exact steps everywhere); the transcendental activations go through
//! the same vector functions but may take the scalar tail on other
//! elements, so they are held to a few ulp.

use crate::before_after::{compile, run};
use kiln_compiler::import::import_pt2;
use kiln_ir::{BinaryOp, ConstBytes, DType, Graph, Op, TensorType, UnaryOp, ValueId};
use kiln_passes::{default_pipeline, Pass, Target, DCE, FUSE_EPILOGUE};
use kiln_runtime::format::Kernel;
use kiln_runtime::{Program, Tensor};
use kiln_tests::{assert_close, fixture_dir, random_inputs, read_numbered, FIXTURES, FLAVOURS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The fused calls of a plan, and whether every one of them is exact (no
/// activation, ReLU / clamp, hardswish, or the decomposed SiLU and
/// `gelu_new` on x86).
fn fused_calls(p: &Program) -> (usize, bool) {
    let mut count = 0;
    let mut exact = true;
    for i in &p.plan().instrs {
        let epilogue = match i.op.kernel() {
            Some(Kernel::ConvFused { epilogue, .. }) | Some(Kernel::LinearFused { epilogue }) => epilogue,
            _ => continue,
        };
        count += 1;
        // The decomposed SiLU's sigmoid and `gelu_new`'s tanh run the same
        // vector body on every element on x86 (the slice functions pad
        // their tails): exact there.
        let mul_sigmoid_exact = cfg!(target_arch = "x86_64");
        exact &= match epilogue.activation {
            None
            | Some(kiln_ir::Activation::Relu | kiln_ir::Activation::Clamp { .. } | kiln_ir::Activation::Hardswish) => {
                true
            }
            Some(kiln_ir::Activation::MulSigmoid | kiln_ir::Activation::GeluTanhChain) => mul_sigmoid_exact,
            Some(_) => false,
        };
    }
    (count, exact)
}

/// Whether some fused call of the plan applies `activation`.
fn has_activation(p: &Program, activation: kiln_ir::Activation) -> bool {
    calls_applying(p, activation) > 0
}

/// How many fused calls of the plan apply `activation`.
fn calls_applying(p: &Program, activation: kiln_ir::Activation) -> usize {
    let applies = |i: &&kiln_runtime::format::Instr| match i.op.kernel() {
        Some(Kernel::ConvFused { epilogue, .. }) | Some(Kernel::LinearFused { epilogue }) => {
            epilogue.activation == Some(activation)
        }
        _ => false,
    };
    p.plan().instrs.iter().filter(applies).count()
}

/// Compares the fused program's outputs with the unfused one's: bytes when
/// `exact`, else within a few ulp.
fn compare(what: &str, got: &[Tensor], want: &[Tensor], exact: bool) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if exact {
            assert!(g.data == w.data, "{what}: output {i} differs after epilogue fusion");
        } else {
            assert_close(&format!("{what} output {i}"), &g.view(), &w.view(), 1e-5, 1e-6);
        }
    }
}

fn constant(g: &mut Graph, rng: &mut StdRng, shape: &[i64]) -> ValueId {
    let n: i64 = shape.iter().product();
    let bytes: Vec<u8> = (0..n).flat_map(|_| rng.gen_range(-0.5f32..0.5).to_le_bytes()).collect();
    g.add_const(None, TensorType::fixed(DType::F32, shape), ConstBytes::owned(bytes))
}

/// The activation ops an epilogue takes, as the graph writes them; `mul`
/// stands for SiLU as Core ATen decomposes it, `mul(x, sigmoid(x))`, `div`
/// for its hardswish, `div(mul(x, clamp(clamp(x + 3, 0), None, 6)), 6)`,
/// and `tanh` for GPT-2's `gelu_new` chain.
fn activation(i: usize) -> Option<Op> {
    match i {
        0 => None,
        1 => Some(Op::Unary(UnaryOp::Relu)),
        2 => Some(Op::Clamp { min: Some(0.0), max: Some(6.0) }),
        3 => Some(Op::Unary(UnaryOp::Silu)),
        4 => Some(Op::Unary(UnaryOp::Sigmoid)),
        5 => Some(Op::Unary(UnaryOp::Gelu)),
        6 => Some(Op::Binary(BinaryOp::Mul)),
        7 => Some(Op::Binary(BinaryOp::Div)),
        8 => Some(Op::Unary(UnaryOp::Tanh)),
        _ => Some(Op::Unary(UnaryOp::GeluTanh)),
    }
}

/// How many activations [`activation`] knows (with "none").
const ACTIVATIONS: usize = 10;

/// An f32 scalar constant.
fn scalar(g: &mut Graph, x: f32) -> ValueId {
    g.add_const(None, TensorType::fixed(DType::F32, &[]), ConstBytes::owned(x.to_le_bytes().to_vec()))
}

/// GPT-2's `gelu_new` of `x` as torch.export and the importer write it:
/// `0.5 * x * (1.0 + tanh(√(2/π) * (x + 0.044715 * ((x·x)·x))))`.
fn gelu_new(g: &mut Graph, x: ValueId) -> ValueId {
    use kiln_ir::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
    let ty = g.ty(x).clone();
    let [half_k, cubic_k, sqrt_k, one_k] = [HALF, CUBIC, SQRT_2_OVER_PI, ONE].map(|k| scalar(g, k));
    let push = |g: &mut Graph, op: Op, inputs: Vec<ValueId>| g.push(op, inputs, ty.clone(), None);
    let mul = Op::Binary(BinaryOp::Mul);
    let half = push(g, mul.clone(), vec![x, half_k]);
    let square = push(g, mul.clone(), vec![x, x]);
    let cube = push(g, mul.clone(), vec![square, x]);
    let scaled = push(g, mul.clone(), vec![cube, cubic_k]);
    let sum = push(g, Op::Binary(BinaryOp::Add), vec![x, scaled]);
    let arg = push(g, mul.clone(), vec![sum, sqrt_k]);
    let t = push(g, Op::Unary(UnaryOp::Tanh), vec![arg]);
    let one_plus = push(g, Op::Binary(BinaryOp::Add), vec![t, one_k]);
    push(g, mul, vec![half, one_plus])
}

/// `y = op(x..)`, then the activation and the residual in the order asked
/// (`residual`: 0 none, 1 before the activation, 2 after it).
fn epilogue_tail(g: &mut Graph, y: ValueId, act: Option<Op>, residual: usize) -> ValueId {
    let ty = g.ty(y).clone();
    let r = (residual > 0).then(|| g.add_input("residual", ty.clone()));
    let mut v = y;
    if let (Some(r), 1) = (r, residual) {
        v = g.push(Op::Binary(BinaryOp::Add), vec![r, v], ty.clone(), None);
    }
    match act {
        Some(Op::Binary(BinaryOp::Mul)) => {
            let s = g.push(Op::Unary(UnaryOp::Sigmoid), vec![v], ty.clone(), None);
            let operands = if residual == 1 { vec![s, v] } else { vec![v, s] };
            v = g.push(Op::Binary(BinaryOp::Mul), operands, ty.clone(), None);
        }
        Some(Op::Unary(UnaryOp::Tanh)) => v = gelu_new(g, v),
        Some(Op::Binary(BinaryOp::Div)) => {
            let (three, six) = (scalar(g, 3.0), scalar(g, 6.0));
            let shifted = g.push(Op::Binary(BinaryOp::Add), vec![v, three], ty.clone(), None);
            let low = g.push(Op::Clamp { min: Some(0.0), max: None }, vec![shifted], ty.clone(), None);
            let clipped = g.push(Op::Clamp { min: None, max: Some(6.0) }, vec![low], ty.clone(), None);
            let product = g.push(Op::Binary(BinaryOp::Mul), vec![v, clipped], ty.clone(), None);
            v = g.push(Op::Binary(BinaryOp::Div), vec![product, six], ty.clone(), None);
        }
        Some(a) => v = g.push(a, vec![v], ty.clone(), None),
        None => {}
    }
    if let (Some(r), 2) = (r, residual) {
        v = g.push(Op::Binary(BinaryOp::Add), vec![v, r], ty, None);
    }
    v
}

fn random_conv(rng: &mut StdRng) -> Graph {
    let mut g = Graph::new();
    let c = [3i64, 8, 16][rng.gen_range(0..3)];
    let (h, w) = ([5i64, 9, 17, 30][rng.gen_range(0..4)], [6i64, 11, 19][rng.gen_range(0..3)]);
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[rng.gen_range(1..3), c, h, w]));
    // (cout, cin per group, kernel, stride, pad, groups)
    let (cout, cin_g, k, stride, pad, groups) = match rng.gen_range(0..5) {
        0 => (8, c, 3, 1, 1, 1),
        1 => (12, c, 3, 2, 1, 1),
        2 => (24, c, 1, 1, 0, 1),
        3 if c % 2 == 0 => (8, c / 2, 3, 1, 1, 2),
        _ => (c, 1, 3, rng.gen_range(1..3), 1, c),
    };
    let wt = constant(&mut g, rng, &[cout, cin_g, k, k]);
    let mut inputs = vec![x, wt];
    if rng.gen_bool(0.7) {
        inputs.push(constant(&mut g, rng, &[cout]));
    }
    let op = Op::Conv { stride: vec![stride; 2], padding: vec![pad; 2], dilation: vec![1; 2], groups };
    let ty = kiln_ir::builder::infer_one(&g, &op, &inputs).unwrap();
    let y = g.push(op, inputs, ty, None);
    let out = epilogue_tail(&mut g, y, activation(rng.gen_range(0..ACTIVATIONS)), rng.gen_range(0..3));
    g.add_output("y", out);
    g
}

/// A linear, or Core ATen's form of one: a matmul by a constant `[K, N]`
/// weight, optionally with a bias add, optionally through a view.
fn random_linear(rng: &mut StdRng) -> Graph {
    let mut g = Graph::new();
    let (m, k, n) = (
        [1i64, 7, 16, 33][rng.gen_range(0..4)],
        [5i64, 64, 300][rng.gen_range(0..3)],
        [3i64, 40, 257][rng.gen_range(0..3)],
    );
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, m, k]));
    let bias = rng.gen_bool(0.6);
    let y = if rng.gen_bool(0.5) {
        let w = constant(&mut g, rng, &[n, k]);
        let mut inputs = vec![x, w];
        if bias {
            inputs.push(constant(&mut g, rng, &[n]));
        }
        g.push(Op::Linear, inputs, TensorType::fixed(DType::F32, &[2, m, n]), None)
    } else {
        let flat = TensorType::fixed(DType::F32, &[2 * m, k]);
        let x2 = g.push(Op::Reshape { shape: vec![(2 * m).into(), k.into()] }, vec![x], flat, None);
        let w = constant(&mut g, rng, &[k, n]);
        let out = TensorType::fixed(DType::F32, &[2 * m, n]);
        let mut y = g.push(Op::MatMul, vec![x2, w], out.clone(), None);
        if bias {
            let b = constant(&mut g, rng, &[n]);
            y = g.push(Op::Binary(BinaryOp::Add), vec![b, y], out, None);
        }
        let shape = vec![2.into(), m.into(), n.into()];
        g.push(Op::Reshape { shape }, vec![y], TensorType::fixed(DType::F32, &[2, m, n]), None)
    };
    let out = epilogue_tail(&mut g, y, activation(rng.gen_range(0..ACTIVATIONS)), rng.gen_range(0..3));
    g.add_output("y", out);
    g
}

#[test]
fn random_convolutions_and_linears_keep_their_results() {
    let mut rng = StdRng::seed_from_u64(2027);
    let mut fused = 0;
    let decomposed =
        [kiln_ir::Activation::MulSigmoid, kiln_ir::Activation::Hardswish, kiln_ir::Activation::GeluTanhChain];
    let mut seen = [0; 3];
    for case in 0..80 {
        let g = if case % 2 == 0 { random_conv(&mut rng) } else { random_linear(&mut rng) };
        let inputs = random_inputs(&g, &mut rng, -3.0, 3.0);
        let before = compile(g.clone(), &[]);
        let after = compile(g, &[FUSE_EPILOGUE, DCE]);
        let (count, exact) = fused_calls(&after);
        fused += count;
        for (i, a) in decomposed.iter().enumerate() {
            seen[i] += usize::from(has_activation(&after, *a));
        }
        compare(&format!("random graph {case}"), &run(&after, &inputs), &run(&before, &inputs), exact);
    }
    // The decomposed forms were recognised too.
    assert!(seen.iter().all(|&n| n > 0), "decomposed SiLU / hardswish / gelu_new fused in {seen:?} graphs");
    // Most graphs have something to fuse (a bare conv / linear does not).
    assert!(fused > 50, "only {fused} of 80 random graphs fused an epilogue");
}

/// Every fixture and real-model topology, through the whole CPU pipeline
/// with and without the pass.
#[test]
fn fixtures_and_models_keep_their_results() {
    let without: Vec<Pass> =
        default_pipeline(Target::Cpu).into_iter().filter(|p| p.name != FUSE_EPILOGUE.name).collect();
    let with = default_pipeline(Target::Cpu);
    let models =
        ["resnet18", "mobilenet_v2", "efficientnet_b0", "bert", "llama", "gpt2"].map(|m| format!("models/{m}"));
    let mut fused = 0;
    for name in FIXTURES.iter().map(|s| s.to_string()).chain(models) {
        for flavour in FLAVOURS {
            let path = fixture_dir(&name).join(format!("{flavour}.pt2"));
            let import = || import_pt2(&path).expect("import").graph;
            let (before, after) = (compile(import(), &without), compile(import(), &with));
            let (count, exact) = fused_calls(&after);
            fused += count;
            if name == "models/efficientnet_b0" {
                // Every SiLU (Core ATen's `x·σ(x)`; the training IR keeps
                // `silu`) follows a convolution: the stem's, the head's, and
                // in the 10 MBConv blocks the expansion's (not the first
                // block's), the depthwise's and the squeeze-excite's.
                let mul_sigmoid = after
                    .plan()
                    .instrs
                    .iter()
                    .filter(|i| match i.op.kernel() {
                        Some(Kernel::ConvFused { epilogue, .. }) => {
                            epilogue.activation == Some(kiln_ir::Activation::MulSigmoid)
                        }
                        _ => false,
                    })
                    .count();
                let silus = if flavour == "aten" { 2 + 2 + 9 * 3 } else { 0 };
                assert_eq!(mul_sigmoid, silus, "{name}/{flavour}: convolutions with the decomposed SiLU fused");
            }
            if name == "models/gpt2" {
                // Each of the two blocks' MLP: `gelu_new` after the
                // up-projection, in both flavours.
                let chains = calls_applying(&after, kiln_ir::Activation::GeluTanhChain);
                assert_eq!(chains, 2, "{name}/{flavour}: up-projections with gelu_new fused");
            }
            let inputs = read_numbered(&fixture_dir(&name), "input");
            compare(&format!("{name}/{flavour}"), &run(&after, &inputs), &run(&before, &inputs), exact);
        }
    }
    assert!(fused > 100, "the fixtures fused only {fused} epilogues");
}
