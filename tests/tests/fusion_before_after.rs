//! Elementwise fusion changes no bit of any result: programs compiled with
//! and without the `fuse_elementwise` pass are run through the runtime on
//! the same random inputs and their outputs compared byte for byte — random
//! elementwise graphs (chains, trees, shared values, broadcast operands,
//! scalars, casts, sizes around the kernel's tile) and every fixture.

use kiln_compiler::import::import_pt2;
use kiln_compiler::{compile_graph_with_passes, CompileOptions};
use kiln_ir::{BinaryOp, Builder, DType, Graph, Op, TensorType, UnaryOp, ValueId};
use kiln_passes::{default_pipeline, Pass, Target, FUSE_ELEMENTWISE};
use kiln_runtime::format::{Kernel, Metadata};
use kiln_runtime::{Program, Tensor};
use kiln_tests::{fixture_dir, read_numbered, FIXTURES, FLAVOURS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn compile(g: Graph, passes: &[Pass]) -> Arc<Program> {
    let opts = CompileOptions { target: Target::Cpu, verify_each: true, ..CompileOptions::default() };
    let (writer, _) = compile_graph_with_passes(g, passes, &opts, Metadata::default()).expect("compile");
    Program::from_bytes(&writer.to_bytes()).expect("load")
}

fn fused_calls(p: &Program) -> usize {
    p.plan().instrs.iter().filter(|i| matches!(i.op.kernel(), Some(Kernel::Fused { .. }))).count()
}

fn run(p: &Arc<Program>, inputs: &[Tensor]) -> Vec<Tensor> {
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    p.session().unwrap().run(&views).unwrap().to_tensors()
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
