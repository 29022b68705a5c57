//! Decomposition rules, checked structurally and numerically: with constant
//! operands, decomposing then folding evaluates the rule at compile time, and the
//! result is compared with a direct computation of the composite.
mod common;
use common::*;
use kiln_ir::{DType, Graph, Op, PoolKind, UnaryOp, ValueId};
use kiln_passes::{cleanup, decompose, Changed, Target};

/// Decomposes for `target`, folds, and returns the (constant) output.
fn evaluate(mut g: Graph, target: Target) -> Vec<f32> {
    let o = opts(target);
    decompose(&mut g, &o).unwrap();
    assert_valid(&g);
    cleanup(&mut g, &o).unwrap();
    assert!(g.order.is_empty(), "not fully folded: {:?}", ops(&g));
    read_f32(&g, g.outputs[0])
}

fn single_op(op: Op, shapes: &[&[i64]], out: &[i64], seed: u64) -> (Graph, Vec<Vec<f32>>) {
    let mut g = Graph::new();
    let mut datas = Vec::new();
    let mut inputs: Vec<ValueId> = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let d = data(s.iter().product::<i64>() as usize, seed + i as u64);
        inputs.push(const_f32(&mut g, s, &d));
        datas.push(d);
    }
    let y = push(&mut g, op, inputs, out);
    g.add_output("y", y);
    (g, datas)
}

#[test]
fn linear_kept_on_cpu_decomposed_on_primitive() {
    let (mut g, d) = single_op(Op::Linear, &[&[2, 3], &[4, 3], &[4]], &[2, 4], 1);
    assert_eq!(decompose(&mut g, &opts(Target::Cpu)).unwrap(), Changed::No);
    let mut structural = g.clone();
    decompose(&mut structural, &opts(Target::Primitive)).unwrap();
    assert_eq!(ops(&structural), ["permute", "matmul", "add"]);
    let (x, w, b) = (&d[0], &d[1], &d[2]);
    let want: Vec<f32> = (0..2)
        .flat_map(|i| (0..4).map(move |j| (0..3).map(|k| x[i * 3 + k] * w[j * 3 + k]).sum::<f32>() + b[j]))
        .collect();
    assert_close(&evaluate(g, Target::Primitive), &want, 1e-5);
}

fn batch_norm_reference(d: &[Vec<f32>], c: usize, hw: usize, eps: f32) -> Vec<f32> {
    let (x, mean, var, w, b) = (&d[0], &d[1], &d[2], &d[3], &d[4]);
    (0..x.len())
        .map(|i| {
            let ch = (i / hw) % c;
            (x[i] - mean[ch]) / (var[ch].abs() + eps).sqrt() * w[ch] + b[ch]
        })
        .collect()
}

#[test]
fn batch_norm_with_constant_params_is_mul_add_on_every_target() {
    for target in [Target::Cpu, Target::Primitive] {
        let mut g = Graph::new();
        let x = g.add_input("x", f32_ty(&[2, 3, 2, 2]));
        let params: Vec<ValueId> = (0..4).map(|i| const_f32(&mut g, &[3], &[0.5 + i as f32; 3])).collect();
        let y = push(&mut g, Op::BatchNorm { eps: 1e-5 }, [vec![x], params].concat(), &[2, 3, 2, 2]);
        g.add_output("y", y);
        decompose(&mut g, &opts(target)).unwrap();
        assert_eq!(ops(&g), ["mul", "add"]);
        for &n in &g.order {
            let c = g.nodes[n].inputs[1];
            assert!(g.const_of(c).is_some());
            assert_eq!(g.ty(c), &f32_ty(&[3, 1, 1]));
        }
    }
    // Numerically (var made positive by the reference's abs; data are in [-1, 1)).
    let (mut g, mut d) =
        single_op(Op::BatchNorm { eps: 1e-5 }, &[&[2, 3, 2, 2], &[3], &[3], &[3], &[3]], &[2, 3, 2, 2], 7);
    d[2] = d[2].iter().map(|v| v.abs()).collect();
    let var_abs = const_f32(&mut g, &[3], &d[2]);
    let bn = g.order[0];
    g.nodes[bn].inputs[2] = var_abs;
    assert_close(&evaluate(g, Target::Cpu), &batch_norm_reference(&d, 3, 4, 1e-5), 1e-5);
}

#[test]
fn batch_norm_with_computed_params_uses_nodes() {
    let (mut g, d) = single_op(Op::BatchNorm { eps: 1e-3 }, &[&[1, 3, 2], &[3], &[3], &[3], &[3]], &[1, 3, 2], 3);
    // Make `var` the output of a node so that it is not a constant when decomposing.
    let bn = g.order[0];
    let var = g.nodes[bn].inputs[2];
    let var_abs = push(&mut g, Op::Unary(UnaryOp::Abs), vec![var], &[3]);
    g.order.rotate_right(1);
    g.nodes[bn].inputs[2] = var_abs;
    assert_valid(&g);
    let mut structural = g.clone();
    decompose(&mut structural, &opts(Target::Primitive)).unwrap();
    assert!(!ops(&structural).contains(&"batch_norm"));
    assert!(ops(&structural).contains(&"rsqrt"));
    assert_close(&evaluate(g, Target::Primitive), &batch_norm_reference(&d, 3, 2, 1e-3), 1e-5);
}

#[test]
fn layer_norm_decomposes_on_primitive() {
    let (g, d) = single_op(Op::LayerNorm { normalized_rank: 1, eps: 1e-5 }, &[&[3, 4], &[4], &[4]], &[3, 4], 11);
    let mut cpu = g.clone();
    assert_eq!(decompose(&mut cpu, &opts(Target::Cpu)).unwrap(), Changed::No);
    let (x, w, b) = (&d[0], &d[1], &d[2]);
    let mut want = Vec::new();
    for row in x.chunks(4) {
        let mean = row.iter().sum::<f32>() / 4.0;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 4.0;
        want.extend(row.iter().enumerate().map(|(j, v)| (v - mean) / (var + 1e-5).sqrt() * w[j] + b[j]));
    }
    assert_close(&evaluate(g, Target::Primitive), &want, 1e-4);
}

fn softmax_reference(x: &[f32], outer: usize, axis_len: usize, inner: usize, log: bool) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * axis_len * inner + k * inner + i;
            let max = (0..axis_len).map(|k| x[at(k)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = (0..axis_len).map(|k| (x[at(k)] - max).exp()).sum();
            for k in 0..axis_len {
                out[at(k)] = if log { x[at(k)] - max - sum.ln() } else { (x[at(k)] - max).exp() / sum };
            }
        }
    }
    out
}

#[test]
fn softmax_and_log_softmax() {
    let (g, d) = single_op(Op::Softmax { axis: 1 }, &[&[2, 3, 4]], &[2, 3, 4], 5);
    let mut cpu = g.clone();
    assert_eq!(decompose(&mut cpu, &opts(Target::Cpu)).unwrap(), Changed::No);
    assert_close(&evaluate(g, Target::Primitive), &softmax_reference(&d[0], 2, 3, 4, false), 1e-5);
    // LogSoftmax has no CPU kernel: decomposed on every target.
    let (g, d) = single_op(Op::LogSoftmax { axis: 2 }, &[&[2, 3, 4]], &[2, 3, 4], 6);
    assert_close(&evaluate(g, Target::Cpu), &softmax_reference(&d[0], 6, 4, 1, true), 1e-5);
}

#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    keep: impl Fn(usize, usize) -> bool,
) -> Vec<f32> {
    let scale = 1.0 / (e as f32).sqrt();
    let mut out = Vec::new();
    for i in 0..l {
        let scores: Vec<f32> = (0..s)
            .map(|j| {
                if keep(i, j) {
                    (0..e).map(|t| q[i * e + t] * k[j * e + t]).sum::<f32>() * scale
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let p = softmax_reference(&scores, 1, s, 1, false);
        out.extend((0..ev).map(|c| (0..s).map(|j| p[j] * v[j * ev + c]).sum::<f32>()));
    }
    out
}

#[test]
fn causal_attention_decomposes_to_matmuls_and_softmax_primitives() {
    let (g, d) = single_op(Op::Attention { causal: true, scale: None }, &[&[3, 4], &[3, 4], &[3, 2]], &[3, 2], 21);
    let mut structural = g.clone();
    decompose(&mut structural, &opts(Target::Primitive)).unwrap();
    assert!(!ops(&structural).contains(&"softmax"), "{:?}", ops(&structural));
    assert_eq!(ops(&structural).iter().filter(|&&o| o == "matmul").count(), 2);
    let want = attention_reference(&d[0], &d[1], &d[2], 3, 3, 4, 2, |i, j| j <= i);
    assert_close(&evaluate(g, Target::Primitive), &want, 1e-5);
}

#[test]
fn attention_with_bool_mask() {
    let mut g = Graph::new();
    let (q, k, v) = (data(2 * 4, 1), data(3 * 4, 2), data(3 * 5, 3));
    let qv = const_f32(&mut g, &[2, 4], &q);
    let kv = const_f32(&mut g, &[3, 4], &k);
    let vv = const_f32(&mut g, &[3, 5], &v);
    let keep = |i: usize, j: usize| (i + j).is_multiple_of(2) || j == 0;
    let mask_bytes: Vec<u8> = (0..6).map(|idx| keep(idx / 3, idx % 3) as u8).collect();
    let mask =
        g.add_const(None, kiln_ir::TensorType::fixed(DType::Bool, &[2, 3]), kiln_ir::ConstBytes::owned(mask_bytes));
    let y = push(&mut g, Op::Attention { causal: false, scale: None }, vec![qv, kv, vv, mask], &[2, 5]);
    g.add_output("y", y);
    assert_close(&evaluate(g, Target::Primitive), &attention_reference(&q, &k, &v, 2, 3, 4, 5, keep), 1e-5);
}

#[test]
fn adaptive_avg_pool() {
    // All-1 output: a mean on every target.
    let (mut g, _) = single_op(Op::AdaptiveAvgPool { output: vec![1, 1] }, &[&[1, 2, 4, 4]], &[1, 2, 1, 1], 1);
    decompose(&mut g, &opts(Target::Cpu)).unwrap();
    assert_eq!(ops(&g), ["reduce_mean"]);
    // Divisible output: a pool on the CPU, reshape + mean on primitives.
    let (g, d) = single_op(Op::AdaptiveAvgPool { output: vec![2, 2] }, &[&[1, 2, 4, 4]], &[1, 2, 2, 2], 2);
    let mut cpu = g.clone();
    decompose(&mut cpu, &opts(Target::Cpu)).unwrap();
    assert_eq!(ops(&cpu), ["avg_pool"]);
    assert!(
        matches!(&cpu.nodes[cpu.order[0]].op, Op::Pool { kind: PoolKind::Avg, kernel, stride, .. } if kernel == &[2, 2] && stride == &[2, 2])
    );
    let mut prim = g.clone();
    decompose(&mut prim, &opts(Target::Primitive)).unwrap();
    assert_eq!(ops(&prim), ["reshape", "reduce_mean"]);
    let x = &d[0];
    let want: Vec<f32> = (0..8)
        .map(|o| {
            let (c, oy, ox) = (o / 4, (o / 2) % 2, o % 2);
            (0..4).map(|t| x[c * 16 + (oy * 2 + t / 2) * 4 + ox * 2 + t % 2]).sum::<f32>() / 4.0
        })
        .collect();
    assert_close(&evaluate(g, Target::Primitive), &want, 1e-6);
}

#[test]
fn conv_and_non_tiling_pools_stay() {
    let conv = Op::Conv { stride: vec![1], padding: vec![0], dilation: vec![1], groups: 1 };
    let (mut g, _) = single_op(conv, &[&[1, 2, 5], &[3, 2, 3]], &[1, 3, 3], 1);
    assert_eq!(decompose(&mut g, &opts(Target::Primitive)).unwrap(), Changed::No);
    let pool = Op::Pool {
        kind: PoolKind::Max,
        kernel: vec![3],
        stride: vec![1],
        padding: vec![1],
        dilation: vec![1],
        ceil_mode: false,
        count_include_pad: true,
        divisor: None,
        layout: kiln_ir::Layout::ChannelsFirst,
    };
    let (mut g, _) = single_op(pool, &[&[1, 2, 5]], &[1, 2, 5], 1);
    assert_eq!(decompose(&mut g, &opts(Target::Primitive)).unwrap(), Changed::No);
}

#[test]
fn symbolic_batch_survives_decomposition() {
    let mut g = Graph::new();
    let n = g.add_symbol("batch", 1, Some(32));
    let ty = kiln_ir::TensorType::new(DType::F32, vec![kiln_ir::Dim::Sym(n), 8.into()]);
    let x = g.add_input("x", ty.clone());
    let w = const_f32(&mut g, &[8], &data(8, 1));
    let b = const_f32(&mut g, &[8], &data(8, 2));
    let y = g.push(Op::LayerNorm { normalized_rank: 1, eps: 1e-5 }, vec![x, w, b], ty.clone(), None);
    let s = g.push(Op::Softmax { axis: 1 }, vec![y], ty.clone(), None);
    g.add_output("s", s);
    decompose(&mut g, &opts(Target::Primitive)).unwrap();
    assert_valid(&g);
    assert_eq!(g.ty(g.outputs[0]), &ty);
}
