//! Graph-building helpers shared by the pass tests.
#![allow(dead_code)]

use kiln_ir::{ConstBytes, DType, Graph, Op, TensorType, ValueId};
use kiln_passes::{verify_graph, Options, Target};

pub fn opts(target: Target) -> Options {
    Options { verify_each: true, ..Options::new(target) }
}

pub fn f32_ty(shape: &[i64]) -> TensorType {
    TensorType::fixed(DType::F32, shape)
}

pub fn const_f32(g: &mut Graph, shape: &[i64], data: &[f32]) -> ValueId {
    let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    g.add_const(None, f32_ty(shape), ConstBytes::owned(bytes))
}

pub fn const_i64(g: &mut Graph, shape: &[i64], data: &[i64]) -> ValueId {
    let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    g.add_const(None, TensorType::fixed(DType::I64, shape), ConstBytes::owned(bytes))
}

/// Deterministic pseudo-random data in [-1, 1).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The f32 elements of a constant value; panics (test failure) when it is not one.
pub fn read_f32(g: &Graph, v: ValueId) -> Vec<f32> {
    let c = g.const_of(v).unwrap_or_else(|| panic!("{v} is not a constant"));
    c.bytes.as_bytes().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

pub fn read_i64(g: &Graph, v: ValueId) -> Vec<i64> {
    let c = g.const_of(v).unwrap_or_else(|| panic!("{v} is not a constant"));
    c.bytes.as_bytes().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Names of the scheduled ops, in order.
pub fn ops(g: &Graph) -> Vec<&'static str> {
    g.order.iter().map(|&n| g.nodes[n].op.name()).collect()
}

pub fn push(g: &mut Graph, op: Op, inputs: Vec<ValueId>, shape: &[i64]) -> ValueId {
    g.push(op, inputs, f32_ty(shape), None)
}

pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "element {i}: got {a}, want {b}");
    }
}

pub fn assert_valid(g: &Graph) {
    if let Err(e) = verify_graph(g) {
        panic!("invalid graph: {e}");
    }
}
