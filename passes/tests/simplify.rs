mod common;
use common::*;
use kiln_ir::{DType, Dim, Graph, Op, TensorType};
use kiln_passes::{dce, simplify, Changed, Target};

fn run(g: &mut Graph) -> Changed {
    let o = opts(Target::Cpu);
    let c = simplify(g, &o).unwrap();
    dce(g, &o).unwrap();
    assert_valid(g);
    c
}

#[test]
fn identities_disappear() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3]));
    let r = push(&mut g, Op::Reshape { shape: vec![2.into(), 3.into()] }, vec![x], &[2, 3]);
    let p = push(&mut g, Op::Permute { perm: vec![0, 1] }, vec![r], &[2, 3]);
    let c = push(&mut g, Op::Cast { to: DType::F32 }, vec![p], &[2, 3]);
    let e = push(&mut g, Op::Expand { shape: vec![2.into(), 3.into()] }, vec![c], &[2, 3]);
    let s = push(&mut g, Op::Slice { axis: 1, start: 0, end: i64::MAX, step: 1 }, vec![e], &[2, 3]);
    let s2 = push(&mut g, Op::Slice { axis: 0, start: 0, end: 2, step: 1 }, vec![s], &[2, 3]);
    g.add_output("y", s2);
    assert_eq!(run(&mut g), Changed::Yes);
    assert!(g.order.is_empty());
    assert_eq!(g.outputs, vec![x]);
}

#[test]
fn non_identities_stay() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3]));
    let s = push(&mut g, Op::Slice { axis: 1, start: 1, end: 3, step: 1 }, vec![x], &[2, 2]);
    let s2 = push(&mut g, Op::Slice { axis: 1, start: 0, end: 2, step: 2 }, vec![s], &[2, 1]);
    let c = g.push(Op::Cast { to: DType::F64 }, vec![s2], TensorType::fixed(DType::F64, &[2, 1]), None);
    g.add_output("y", c);
    assert_eq!(run(&mut g), Changed::No);
    assert_eq!(ops(&g), ["slice", "slice", "cast"]);
}

#[test]
fn symbolic_whole_slice_is_identity() {
    let mut g = Graph::new();
    let s = g.add_symbol("batch", 1, Some(8));
    let ty = TensorType::new(DType::F32, vec![Dim::Sym(s), 4.into()]);
    let x = g.add_input("x", ty.clone());
    let y = g.push(Op::Slice { axis: 0, start: 0, end: i64::MAX, step: 1 }, vec![x], ty, None);
    g.add_output("y", y);
    run(&mut g);
    assert_eq!(g.outputs, vec![x]);
}

#[test]
fn reshape_chains_merge() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 6]));
    let a = push(&mut g, Op::Reshape { shape: vec![3.into(), 4.into()] }, vec![x], &[3, 4]);
    let b = push(&mut g, Op::Reshape { shape: vec![12.into()] }, vec![a], &[12]);
    let c = push(&mut g, Op::Reshape { shape: vec![4.into(), 3.into()] }, vec![b], &[4, 3]);
    g.add_output("y", c);
    run(&mut g);
    assert_eq!(ops(&g), ["reshape"]);
    let n = g.order[0];
    assert_eq!(g.nodes[n].inputs, vec![x]);
    assert_eq!(g.nodes[n].op, Op::Reshape { shape: vec![4.into(), 3.into()] });
}

#[test]
fn reshape_back_to_the_input_shape_vanishes() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 6]));
    let a = push(&mut g, Op::Reshape { shape: vec![12.into()] }, vec![x], &[12]);
    let b = push(&mut g, Op::Reshape { shape: vec![2.into(), 6.into()] }, vec![a], &[2, 6]);
    g.add_output("y", b);
    // First round merges, second removes the now-identity reshape.
    run(&mut g);
    run(&mut g);
    assert!(g.order.is_empty(), "{:?}", ops(&g));
    assert_eq!(g.outputs, vec![x]);
}

#[test]
fn permute_chains_compose() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3, 4]));
    let a = push(&mut g, Op::Permute { perm: vec![2, 0, 1] }, vec![x], &[4, 2, 3]);
    let b = push(&mut g, Op::Permute { perm: vec![0, 2, 1] }, vec![a], &[4, 3, 2]);
    g.add_output("y", b);
    run(&mut g);
    assert_eq!(ops(&g), ["permute"]);
    // out[i] = x[p[q[i]]]: q = [0,2,1], p = [2,0,1] -> [2,1,0].
    assert_eq!(g.nodes[g.order[0]].op, Op::Permute { perm: vec![2, 1, 0] });
}

#[test]
fn inverse_permutes_cancel() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[2, 3, 4]));
    let a = push(&mut g, Op::Permute { perm: vec![1, 2, 0] }, vec![x], &[3, 4, 2]);
    let b = push(&mut g, Op::Permute { perm: vec![2, 0, 1] }, vec![a], &[2, 3, 4]);
    g.add_output("y", b);
    run(&mut g);
    assert!(g.order.is_empty());
    assert_eq!(g.outputs, vec![x]);
}
