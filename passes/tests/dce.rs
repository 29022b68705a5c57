mod common;
use common::*;
use kiln_ir::{BinaryOp, Graph, Op, UnaryOp};
use kiln_passes::{dce, live_consts, Changed, Target};

#[test]
fn removes_unused_chain_keeps_roots() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4]));
    let w = const_f32(&mut g, &[4], &[1.0; 4]);
    let unused_w = const_f32(&mut g, &[4], &[2.0; 4]);
    let dead1 = push(&mut g, Op::Binary(BinaryOp::Mul), vec![x, unused_w], &[4]);
    let _dead2 = push(&mut g, Op::Unary(UnaryOp::Exp), vec![dead1], &[4]);
    let live = push(&mut g, Op::Binary(BinaryOp::Add), vec![x, w], &[4]);
    g.add_output("y", live);
    assert_eq!(dce(&mut g, &opts(Target::Cpu)).unwrap(), Changed::Yes);
    assert_eq!(ops(&g), ["add"]);
    let kiln_ir::ValueDef::Const(w_const) = g.values[w].def else { unreachable!() };
    assert_eq!(live_consts(&g), vec![w_const]);
    assert_eq!(dce(&mut g, &opts(Target::Cpu)).unwrap(), Changed::No);
    assert_valid(&g);
}

#[test]
fn constant_output_is_live() {
    let mut g = Graph::new();
    let c = const_f32(&mut g, &[2], &[1.0, 2.0]);
    let _other = const_f32(&mut g, &[2], &[3.0, 4.0]);
    g.add_output("c", c);
    assert_eq!(live_consts(&g).len(), 1);
}

#[test]
fn node_with_one_used_output_of_many_uses_is_kept() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4]));
    let a = push(&mut g, Op::Unary(UnaryOp::Relu), vec![x], &[4]);
    let b = push(&mut g, Op::Unary(UnaryOp::Neg), vec![a], &[4]);
    let c = push(&mut g, Op::Binary(BinaryOp::Add), vec![a, b], &[4]);
    g.add_output("c", c);
    g.add_output("a", a);
    assert_eq!(dce(&mut g, &opts(Target::Cpu)).unwrap(), Changed::No);
    assert_eq!(ops(&g), ["relu", "neg", "add"]);
}

#[test]
fn malformed_graph_is_an_error_naming_the_pass() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4]));
    let y = push(&mut g, Op::Unary(UnaryOp::Relu), vec![x], &[4]);
    g.add_output("y", y);
    g.order.push(kiln_ir::EntityRef::new(7));
    let err = dce(&mut g, &opts(Target::Cpu)).unwrap_err();
    assert_eq!(err.pass, "dce");
}
