//! Elementwise fusion changes no bit of any result: programs compiled with
//! and without the `fuse_elementwise` pass are run through the runtime on
//! the same random inputs and their outputs compared byte for byte — random
//! elementwise graphs (chains, trees, shared values, broadcast operands,
//! scalars, casts, sizes around the kernel's tile) and every fixture.

use crate::before_after::{compile, run};
use kiln_compiler::import::import_pt2;
use kiln_ir::{BinaryOp, Builder, DType, Graph, Op, TensorType, UnaryOp, ValueId};
use kiln_passes::{default_pipeline, Pass, Target, FUSE_ELEMENTWISE};
use kiln_runtime::format::Kernel;
use kiln_runtime::{Program, Tensor};
use kiln_tests::{fixture_dir, random_inputs, read_numbered, FIXTURES, FLAVOURS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn fused_calls(p: &Program) -> usize {
    p.plan().instrs.iter().filter(|i| matches!(i.op.kernel(), Some(Kernel::Fused { .. }))).count()
}

fn assert_same_bytes(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!((g.dtype, &g.shape), (w.dtype, &w.shape), "{what}: output {i} type");
        assert!(g.data == w.data, "{what}: output {i} differs after fusion");
    }
}

const UNARY: &[UnaryOp] = &[
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Silu,
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Erf,
    UnaryOp::Sin,
];
const BINARY: &[BinaryOp] = &[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min];

/// A random f32 elementwise graph over inputs `x` (the full shape), a row
/// and a column; returns it with its input shapes.
fn random_graph(rng: &mut StdRng) -> (Graph, Vec<Vec<usize>>) {
    let rows = rng.gen_range(1..5usize);
    let cols = [1usize, 7, 513, 1200][rng.gen_range(0..4)];
    let shapes = vec![vec![rows, cols], vec![cols], vec![rows, 1]];
    let mut g = Graph::new();
    let mut vals: Vec<ValueId> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            g.add_input(
                format!("in{i}"),
                TensorType::fixed(DType::F32, &s.iter().map(|&d| d as i64).collect::<Vec<_>>()),
            )
        })
        .collect();
    let mut b = Builder::new(&mut g, None);
    let half = b.scalar(DType::F32, 0.5);
    vals.push(half);
    for _ in 0..rng.gen_range(3..12) {
        // Prefer recent values: long chains, with some reuse.
        let pick = |rng: &mut StdRng, vals: &[ValueId]| vals[vals.len() - 1 - rng.gen_range(0..vals.len().min(4))];
        let (a, c) = (pick(rng, &vals), pick(rng, &vals));
        let v = match rng.gen_range(0..10) {
            0..=3 => b.push(Op::Unary(UNARY[rng.gen_range(0..UNARY.len())]), vec![a]),
            4..=7 => b.push(Op::Binary(BINARY[rng.gen_range(0..BINARY.len())]), vec![a, c]),
            8 => b.push(Op::Clamp { min: Some(-1.0), max: Some(1.5) }, vec![a]),
            _ => {
                let cond = b.push(Op::Binary(BinaryOp::Lt), vec![a, c]).unwrap();
                b.push(Op::Where, vec![cond, c, a])
            }
        };
        vals.push(v.unwrap());
    }
    let last = *vals.last().unwrap();
    let extra = vals[vals.len() - 1 - rng.gen_range(0..3.min(vals.len() - 4))];
    g.add_output("out", last);
    if extra != last && g.producer(extra).is_some() {
        g.add_output("side", extra);
    }
    (g, shapes)
}

#[test]
fn random_elementwise_graphs_are_bit_identical_after_fusion() {
    let mut rng = StdRng::seed_from_u64(2026);
    let mut fused_total = 0;
    for case in 0..60 {
        let (g, shapes) = random_graph(&mut rng);
        let inputs: Vec<Tensor> = shapes
            .iter()
            .map(|s| {
                let v: Vec<f32> = (0..s.iter().product::<usize>()).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                Tensor::from_f32(s, &v)
            })
            .collect();
        let before = compile(g.clone(), &[]);
        let after = compile(g, &[FUSE_ELEMENTWISE]);
        fused_total += fused_calls(&after);
        assert_same_bytes(&format!("random graph {case}"), &run(&after, &inputs), &run(&before, &inputs));
    }
    assert!(fused_total > 30, "the random graphs fused only {fused_total} groups");
}

#[test]
fn fixtures_are_bit_identical_after_fusion() {
    let without: Vec<Pass> =
        default_pipeline(Target::Cpu).into_iter().filter(|p| p.name != FUSE_ELEMENTWISE.name).collect();
    let with = default_pipeline(Target::Cpu);
    let mut fused_total = 0;
    for name in FIXTURES {
        for flavour in FLAVOURS {
            let import = || import_pt2(&fixture_dir(name).join(format!("{flavour}.pt2"))).expect("import").graph;
            let before = compile(import(), &without);
            let after = compile(import(), &with);
            fused_total += fused_calls(&after);
            let inputs = read_numbered(&fixture_dir(name), "input");
            assert_same_bytes(&format!("{name}/{flavour}"), &run(&after, &inputs), &run(&before, &inputs));
        }
    }
    assert!(fused_total > 0, "no fixture fused anything");
}

/// Attention written out (and as Core ATen decomposes SDPA) becomes one
/// attention kernel whose results match the unfused graph's to rounding.
#[test]
fn recognised_attention_matches_the_unfused_graph() {
    let graphs = [
        // Scores scaled, kᵀ a permute of k, a plain softmax (no mask: with
        // one, a plain softmax is left alone, see fuse_attention).
        "graph {
          input %0 \"q\": f32[2, 3, 17, 16]
          input %1 \"k\": f32[2, 3, 33, 16]
          input %2 \"v\": f32[2, 3, 33, 8]
          const %3: f32[] = [0.25]
          %4: f32[2, 3, 16, 33] = permute{perm=[0, 1, 3, 2]}(%1)
          %5: f32[2, 3, 17, 33] = matmul(%0, %4)
          %6: f32[2, 3, 17, 33] = mul(%5, %3)
          %7: f32[2, 3, 17, 33] = softmax{axis=3}(%6)
          %8: f32[2, 3, 17, 8] = matmul(%7, %2)
          output %8 \"out\"
        }",
        // Core ATen's SDPA: √scale on q and on kᵀ, which is an input.
        "graph {
          input %0 \"q\": f32[1, 4, 9, 8]
          input %1 \"kt\": f32[1, 4, 8, 12]
          input %2 \"v\": f32[1, 4, 12, 8]
          const %3: f32[] = [0.59460354]
          %4: f32[1, 4, 9, 8] = mul(%0, %3)
          %5: f32[1, 4, 8, 12] = mul(%1, %3)
          %6: f32[1, 4, 9, 12] = matmul(%4, %5)
          %7: f32[1, 4, 9, 12] = softmax{axis=3}(%6)
          %8: f32[1, 4, 9, 8] = matmul(%7, %2)
          output %8 \"out\"
        }",
        // Torch 2.5+'s SDPA: `_safe_softmax` zeroes the fully-masked row 1.
        "graph {
          input %0 \"q\": f32[1, 2, 3, 4]
          input %1 \"k\": f32[1, 2, 5, 4]
          input %2 \"v\": f32[1, 2, 5, 4]
          const %3: f32[3, 5] = [0.0, -inf, 0.5, 0.0, -1.0, -inf, -inf, -inf, -inf, -inf, 0.0, 0.0, 0.0, -inf, 0.0]
          const %4: f32[] = [-inf]
          const %5: f32[] = [0.0]
          %6: f32[1, 2, 4, 5] = permute{perm=[0, 1, 3, 2]}(%1)
          %7: f32[1, 2, 3, 5] = matmul(%0, %6)
          %8: f32[1, 2, 3, 5] = add(%7, %3)
          %9: f32[1, 2, 3, 5] = softmax{axis=3}(%8)
          %10: bool[1, 2, 3, 5] = eq(%8, %4)
          %11: bool[1, 2, 3, 5] = not(%10)
          %12: bool[1, 2, 3, 1] = reduce_max{axes=[3], keep_dims=true}(%11)
          %13: bool[1, 2, 3, 1] = not(%12)
          %14: f32[1, 2, 3, 5] = where(%13, %5, %9)
          %15: f32[1, 2, 3, 4] = matmul(%14, %2)
          output %15 \"out\"
        }",
        // BERT's `bmm`s over the merged [1, H] batch dims, viewed back for the mask.
        "graph {
          input %0 \"q\": f32[1, 2, 7, 4]
          input %1 \"k\": f32[1, 2, 17, 4]
          input %2 \"v\": f32[1, 2, 17, 4]
          input %3 \"mask\": f32[1, 1, 7, 17]
          const %4: f32[] = [0.70710677]
          const %5: f32[] = [-inf]
          const %6: f32[] = [0.0]
          %7: f32[1, 2, 7, 4] = mul(%0, %4)
          %8: f32[1, 2, 4, 17] = permute{perm=[0, 1, 3, 2]}(%1)
          %9: f32[1, 2, 4, 17] = mul(%8, %4)
          %10: f32[2, 7, 4] = reshape{shape=[2, 7, 4]}(%7)
          %11: f32[2, 4, 17] = reshape{shape=[2, 4, 17]}(%9)
          %12: f32[2, 7, 17] = matmul(%10, %11)
          %13: f32[1, 2, 7, 17] = reshape{shape=[1, 2, 7, 17]}(%12)
          %14: f32[1, 2, 7, 17] = add(%13, %3)
          %15: f32[1, 2, 7, 17] = softmax{axis=3}(%14)
          %16: bool[1, 2, 7, 17] = eq(%14, %5)
          %17: bool[1, 2, 7, 17] = not(%16)
          %18: bool[1, 2, 7, 1] = reduce_max{axes=[3], keep_dims=true}(%17)
          %19: bool[1, 2, 7, 1] = not(%18)
          %20: f32[1, 2, 7, 17] = where(%19, %6, %15)
          %21: f32[2, 7, 17] = reshape{shape=[2, 7, 17]}(%20)
          %22: f32[2, 17, 4] = reshape{shape=[2, 17, 4]}(%2)
          %23: f32[2, 7, 4] = matmul(%21, %22)
          %24: f32[1, 2, 7, 4] = reshape{shape=[1, 2, 7, 4]}(%23)
          output %24 \"out\"
        }",
    ];
    let mut rng = StdRng::seed_from_u64(5);
    for (i, text) in graphs.iter().enumerate() {
        let g = kiln_ir::text::parse(text).expect("parse");
        let inputs = random_inputs(&g, &mut rng, -2.0, 2.0);
        let before = compile(g.clone(), &[]);
        let after = compile(g, &[kiln_passes::FUSE_ATTENTION, kiln_passes::DCE]);
        let kernels: Vec<&str> = after.plan().instrs.iter().map(|i| i.op.name()).collect();
        assert!(kernels.contains(&"attention") && !kernels.contains(&"softmax"), "graph {i}: {kernels:?}");
        let (got, want) = (run(&after, &inputs), run(&before, &inputs));
        kiln_tests::assert_close(&format!("attention graph {i}"), &got[0].view(), &want[0].view(), 1e-5, 1e-5);
        assert!(got[0].to_f32().unwrap().iter().all(|x| x.is_finite()), "graph {i}: a NaN");
    }
}

/// Grouped-query attention with K and V repeated per query head (Hugging
/// Face's `repeat_kv`) runs over [.., Hkv, R] batch dims with K and V read
/// in place: the same bytes as the attention over the repeated copies, with
/// each mask form (per head, shared bool + causal, none), at 1 and 3 threads.
#[test]
fn gqa_attention_without_repeated_kv_is_bit_identical() {
    let text = "graph {
      input %0 \"q\": f32[2, 6, 19, 16]
      input %1 \"k\": f32[2, 2, 23, 16]
      input %2 \"v\": f32[2, 2, 23, 8]
      input %3 \"per_head\": f32[2, 6, 19, 23]
      input %4 \"shared\": f32[1, 1, 19, 23]
      %5: f32[2, 2, 1, 23, 16] = reshape{shape=[2, 2, 1, 23, 16]}(%1)
      %6: f32[2, 2, 3, 23, 16] = expand{shape=[2, 2, 3, 23, 16]}(%5)
      %7: f32[2, 6, 23, 16] = reshape{shape=[2, 6, 23, 16]}(%6)
      %8: f32[2, 2, 1, 23, 8] = reshape{shape=[2, 2, 1, 23, 8]}(%2)
      %9: f32[2, 2, 3, 23, 8] = expand{shape=[2, 2, 3, 23, 8]}(%8)
      %10: f32[2, 6, 23, 8] = reshape{shape=[2, 6, 23, 8]}(%9)
      %11: f32[2, 6, 19, 8] = attention{causal=false, scale=0.25}(%0, %7, %10, %3)
      %12: f32[2, 6, 19, 8] = attention{causal=true}(%0, %7, %10, %4)
      %13: f32[2, 6, 19, 8] = attention{causal=false}(%0, %7, %10)
      output %11 \"per_head\"
      output %12 \"shared_causal\"
      output %13 \"no_mask\"
    }";
    let g = kiln_ir::text::parse(text).expect("parse");
    let inputs = random_inputs(&g, &mut StdRng::seed_from_u64(9), -2.0, 2.0);
    let before = compile(g.clone(), &[]);
    let after = compile(g, &[kiln_passes::FUSE_ATTENTION, kiln_passes::DCE]);
    let kernels = |p: &Program| p.plan().instrs.iter().map(|i| i.op.name()).collect::<Vec<_>>();
    assert!(kernels(&before).contains(&"expand"), "{:?}", kernels(&before));
    assert!(!kernels(&after).contains(&"expand"), "K/V still repeated: {:?}", kernels(&after));
    let want = run(&before, &inputs);
    for threads in [1, 3] {
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let opts = kiln_runtime::SessionOptions::with_threads(threads);
        let got = after.session_with(&opts).unwrap().run(&views).unwrap().to_tensors();
        assert_same_bytes(&format!("gqa at {threads} threads"), &got, &want);
    }
}

/// RMS norm written out (torch's decomposition) becomes one rms_norm kernel
/// whose results match the unfused graph's to rounding.
#[test]
fn recognised_rms_norm_matches_the_unfused_graph() {
    let graphs = [
        "graph {
          input %0 \"x\": f32[3, 7, 300]
          input %1 \"w\": f32[300]
          const %2: f32[] = [2.0]
          const %3: f32[] = [1e-6]
          %4: f32[3, 7, 300] = pow(%0, %2)
          %5: f32[3, 7, 1] = reduce_mean{axes=[2], keep_dims=true}(%4)
          %6: f32[3, 7, 1] = add(%5, %3)
          %7: f32[3, 7, 1] = rsqrt(%6)
          %8: f32[3, 7, 300] = mul(%0, %7)
          %9: f32[3, 7, 300] = mul(%1, %8)
          output %9 \"out\"
        }",
        "graph {
          input %0 \"x\": f64[5, 4, 9]
          const %1: f64[] = [1e-5]
          %2: f64[5, 4, 9] = mul(%0, %0)
          %3: f64[5, 1, 1] = reduce_mean{axes=[1, 2], keep_dims=true}(%2)
          %4: f64[5, 1, 1] = add(%1, %3)
          %5: f64[5, 1, 1] = rsqrt(%4)
          %6: f64[5, 4, 9] = mul(%5, %0)
          output %6 \"out\"
        }",
    ];
    let mut rng = StdRng::seed_from_u64(11);
    for (i, text) in graphs.iter().enumerate() {
        let g = kiln_ir::text::parse(text).expect("parse");
        let inputs: Vec<Tensor> = g
            .inputs
            .iter()
            .map(|&v| {
                let ty = g.ty(v);
                let s: Vec<usize> = ty.static_shape().unwrap().iter().map(|&d| d as usize).collect();
                let n = s.iter().product::<usize>();
                let vals: Vec<f64> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let data = match ty.dtype {
                    DType::F64 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    _ => vals.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
                };
                Tensor { dtype: ty.dtype, shape: s, data }
            })
            .collect();
        let before = compile(g.clone(), &[]);
        let after = compile(g, &[kiln_passes::FUSE_NORM, kiln_passes::DCE]);
        let kernels: Vec<&str> = after.plan().instrs.iter().map(|i| i.op.name()).collect();
        assert_eq!(kernels, ["rms_norm"], "graph {i}");
        let (got, want) = (run(&after, &inputs), run(&before, &inputs));
        kiln_tests::assert_close(&format!("rms_norm graph {i}"), &got[0].view(), &want[0].view(), 1e-5, 1e-6);
    }
}
