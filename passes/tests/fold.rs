mod common;
use common::*;
use kiln_ir::{BinaryOp, DType, Dim, Graph, Op, TensorType, UnaryOp};
use kiln_passes::{cleanup, fold_constants, simplify_dim, Changed, Options, Target};

#[test]
fn transposed_linear_weight_becomes_a_constant() {
    // Core ATen `linear`: permute(weight, [1, 0]) feeding a matmul with the input.
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3]));
    let w = const_f32(&mut g, &[4, 3], &(0..12).map(|i| i as f32).collect::<Vec<_>>());
    let b = const_f32(&mut g, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let wt = push(&mut g, Op::Permute { perm: vec![1, 0] }, vec![w], &[3, 4]);
    let mm = push(&mut g, Op::MatMul, vec![x, wt], &[2, 4]);
    let y = push(&mut g, Op::Binary(BinaryOp::Add), vec![mm, b], &[2, 4]);
    g.add_output("y", y);
    assert_eq!(cleanup(&mut g, &opts(Target::Cpu)).unwrap(), Changed::Yes);
    assert_eq!(ops(&g), ["matmul", "add"]);
    let wt = g.nodes[g.order[0]].inputs[1];
    assert_eq!(g.ty(wt), &f32_ty(&[3, 4]));
    assert_eq!(read_f32(&g, wt), [0., 3., 6., 9., 1., 4., 7., 10., 2., 5., 8., 11.]);
    assert_valid(&g);
}

#[test]
fn shape_arithmetic_on_i64_folds() {
    let mut g = Graph::new();
    let a = const_i64(&mut g, &[3], &[2, 7, -7]);
    let b = const_i64(&mut g, &[], &[2]);
    let i64_ty = |s: &[i64]| TensorType::fixed(DType::I64, s);
    let q = g.push(Op::Binary(BinaryOp::FloorDiv), vec![a, b], i64_ty(&[3]), None);
    let r = g.push(Op::Binary(BinaryOp::Rem), vec![a, b], i64_ty(&[3]), None);
    let both = g.push(Op::Concat { axis: 0 }, vec![q, r], i64_ty(&[6]), None);
    let f = g.push(Op::Cast { to: DType::F32 }, vec![both], f32_ty(&[6]), None);
    g.add_output("f", f);
    cleanup(&mut g, &opts(Target::Cpu)).unwrap();
    assert!(g.order.is_empty());
    // Python semantics: -7 // 2 == -4, -7 % 2 == 1.
    assert_eq!(read_f32(&g, g.outputs[0]), [1., 3., -4., 0., 1., 1.]);
}

#[test]
fn full_arange_and_comparisons_fold() {
    let mut g = Graph::new();
    let ar = g.push(
        Op::Arange { start: 0.0, step: 1.0, len: 4.into(), dtype: DType::I64 },
        vec![],
        TensorType::fixed(DType::I64, &[4]),
        None,
    );
    let two = g.push(
        Op::Full { value: 2.0, dtype: DType::I64, shape: vec![] },
        vec![],
        TensorType::fixed(DType::I64, &[]),
        None,
    );
    let lt = g.push(Op::Binary(BinaryOp::Lt), vec![ar, two], TensorType::fixed(DType::Bool, &[4]), None);
    let not = g.push(Op::Unary(UnaryOp::Not), vec![lt], TensorType::fixed(DType::Bool, &[4]), None);
    g.add_output("m", not);
    cleanup(&mut g, &opts(Target::Cpu)).unwrap();
    assert!(g.order.is_empty());
    assert_eq!(g.const_of(g.outputs[0]).unwrap().bytes.as_bytes(), [0, 0, 1, 1]);
}

#[test]
fn f32_results_round_to_f32() {
    let mut g = Graph::new();
    let a = const_f32(&mut g, &[2], &[1.0, 4.0]);
    let three = const_f32(&mut g, &[], &[3.0]);
    let d = push(&mut g, Op::Binary(BinaryOp::Div), vec![a, three], &[2]);
    let s = push(&mut g, Op::Unary(UnaryOp::Sqrt), vec![d], &[2]);
    g.add_output("s", s);
    cleanup(&mut g, &opts(Target::Cpu)).unwrap();
    assert_eq!(read_f32(&g, g.outputs[0]), [(1.0f32 / 3.0).sqrt(), (4.0f32 / 3.0).sqrt()]);
}

#[test]
fn large_growing_results_are_not_folded() {
    let mut g = Graph::new();
    let one = const_f32(&mut g, &[1, 1], &[1.0]);
    let big = push(&mut g, Op::Expand { shape: vec![512.into(), 512.into()] }, vec![one], &[512, 512]);
    g.add_output("big", big);
    let small = Options { fold_max_elements: 1000, ..opts(Target::Cpu) };
    assert_eq!(fold_constants(&mut g, &small).unwrap(), Changed::No);
    assert_eq!(ops(&g), ["expand"]);
    // Layout-only ops that do not grow the data fold at any size.
    let mut g = Graph::new();
    let w = const_f32(&mut g, &[64, 32], &data(64 * 32, 1));
    let t = push(&mut g, Op::Permute { perm: vec![1, 0] }, vec![w], &[32, 64]);
    g.add_output("t", t);
    assert_eq!(fold_constants(&mut g, &Options { fold_max_elements: 10, ..opts(Target::Cpu) }).unwrap(), Changed::Yes);
}

#[test]
fn constants_above_the_operand_limit_are_left_to_the_kernels() {
    // The evaluator holds operands as f64s: a weight beyond the limit is not
    // expanded at compile time (a 1 GiB weight would take 8 GiB otherwise).
    let transpose = || {
        let mut g = Graph::new();
        let w = const_f32(&mut g, &[64, 32], &data(64 * 32, 1));
        let t = push(&mut g, Op::Permute { perm: vec![1, 0] }, vec![w], &[32, 64]);
        g.add_output("t", t);
        g
    };
    let limited = Options { fold_max_operand_elements: 64 * 32 - 1, ..opts(Target::Cpu) };
    let mut g = transpose();
    assert_eq!(fold_constants(&mut g, &limited).unwrap(), Changed::No);
    assert_eq!(ops(&g), ["permute"]);
    let at_limit = Options { fold_max_operand_elements: 64 * 32, ..opts(Target::Cpu) };
    let mut g = transpose();
    assert_eq!(fold_constants(&mut g, &at_limit).unwrap(), Changed::Yes);
}

#[test]
fn erf_is_left_alone_and_inputs_block_folding() {
    let mut g = Graph::new();
    let c = const_f32(&mut g, &[2], &[0.5, 1.0]);
    let x = g.add_input("x", f32_ty(&[2]));
    let e = push(&mut g, Op::Unary(UnaryOp::Erf), vec![c], &[2]);
    let y = push(&mut g, Op::Binary(BinaryOp::Add), vec![e, x], &[2]);
    g.add_output("y", y);
    assert_eq!(fold_constants(&mut g, &opts(Target::Cpu)).unwrap(), Changed::No);
    assert_eq!(ops(&g), ["erf", "add"]);
}

#[test]
fn slices_and_where_fold() {
    let mut g = Graph::new();
    let a = const_f32(&mut g, &[2, 4], &[0., 1., 2., 3., 4., 5., 6., 7.]);
    let s = push(&mut g, Op::Slice { axis: 1, start: 1, end: i64::MAX, step: 2 }, vec![a], &[2, 2]);
    let cond = g.push(
        Op::Full { value: 1.0, dtype: DType::Bool, shape: vec![2.into(), 1.into()] },
        vec![],
        TensorType::fixed(DType::Bool, &[2, 1]),
        None,
    );
    let zero = const_f32(&mut g, &[], &[0.0]);
    let w = push(&mut g, Op::Where, vec![cond, s, zero], &[2, 2]);
    g.add_output("w", w);
    cleanup(&mut g, &opts(Target::Cpu)).unwrap();
    assert_eq!(read_f32(&g, g.outputs[0]), [1., 3., 5., 7.]);
}

#[test]
fn symbolic_shapes_become_static() {
    let mut g = Graph::new();
    let pinned = g.add_symbol("pinned", 3, Some(3));
    let free = g.add_symbol("n", 1, Some(64));
    let six = Dim::Mul(Box::new(2.into()), Box::new(3.into()));
    assert_eq!(simplify_dim(&six, &g.symbols), Dim::Const(6));
    assert_eq!(simplify_dim(&Dim::Sym(pinned), &g.symbols), Dim::Const(3));
    let n4 = Dim::mul(Dim::Sym(free), 4.into());
    assert_eq!(simplify_dim(&Dim::FloorDiv(Box::new(n4.clone()), Box::new(4.into())), &g.symbols), Dim::Sym(free));
    assert_eq!(simplify_dim(&Dim::Mod(Box::new(n4), Box::new(4.into())), &g.symbols), Dim::Const(0));

    // A reshape whose target shape only becomes static after shape folding.
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Sym(pinned), 2.into()]));
    let r = g.push(
        Op::Reshape { shape: vec![six] },
        vec![x],
        TensorType::new(DType::F32, vec![Dim::Add(Box::new(Dim::Sym(pinned)), Box::new(3.into()))]),
        None,
    );
    g.add_output("r", r);
    assert_eq!(fold_constants(&mut g, &opts(Target::Cpu)).unwrap(), Changed::Yes);
    assert_eq!(g.ty(x), &f32_ty(&[3, 2]));
    assert_eq!(g.ty(r), &f32_ty(&[6]));
    assert_eq!(g.nodes[g.order[0]].op, Op::Reshape { shape: vec![6.into()] });
}

#[test]
fn inexact_integer_results_are_left_to_the_kernels() {
    // 2^31 * 2^31 = 2^62 is past f64's exact integers: folding it would
    // round before the i32 wrap, so the node stays for the (wrapping) kernel.
    let i32_ty = |s: &[i64]| TensorType::fixed(DType::I32, s);
    let mut g = Graph::new();
    let a = g.add_const(None, i32_ty(&[1]), kiln_ir::ConstBytes::owned(i32::MIN.to_le_bytes().to_vec()));
    let p = g.push(Op::Binary(BinaryOp::Mul), vec![a, a], i32_ty(&[1]), None);
    g.add_output("p", p);
    assert_eq!(fold_constants(&mut g, &opts(Target::Cpu)).unwrap(), Changed::No);
    assert_eq!(ops(&g), ["mul"]);
    // In range, the same fold happens and wraps like torch: 100 * 3 as i8 = 44.
    let i8_ty = TensorType::fixed(DType::I8, &[1]);
    let mut g = Graph::new();
    let a = g.add_const(None, i8_ty.clone(), kiln_ir::ConstBytes::owned(vec![100]));
    let b = g.add_const(None, i8_ty.clone(), kiln_ir::ConstBytes::owned(vec![3]));
    let p = g.push(Op::Binary(BinaryOp::Mul), vec![a, b], i8_ty, None);
    g.add_output("p", p);
    assert_eq!(fold_constants(&mut g, &opts(Target::Cpu)).unwrap(), Changed::Yes);
    assert_eq!(g.const_of(g.outputs[0]).map(|c| c.bytes.as_bytes().to_vec()), Some(vec![44u8]));
}
