use super::*;
use crate::{BinaryOp, ReduceKind};

/// Symbols `b` in [1, 64] and `n` in [1, inf], plus `t` in [100, 200].
fn syms() -> PrimaryMap<SymbolId, Symbol> {
    let mut s = PrimaryMap::new();
    s.push(Symbol { name: "b".into(), min: 1, max: Some(64) });
    s.push(Symbol { name: "n".into(), min: 1, max: None });
    s.push(Symbol { name: "t".into(), min: 100, max: Some(200) });
    s
}
fn b() -> Dim {
    Dim::Sym(SymbolId::from_u32(0))
}
fn n() -> Dim {
    Dim::Sym(SymbolId::from_u32(1))
}
fn t() -> Dim {
    Dim::Sym(SymbolId::from_u32(2))
}
fn c(v: i64) -> Dim {
    Dim::Const(v)
}
fn ty(dtype: DType, shape: &[Dim]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}
fn f32t(shape: &[Dim]) -> TensorType {
    ty(DType::F32, shape)
}

/// `f32[b, 4]`-style text of the single inferred type.
fn infer(op: Op, inputs: &[TensorType]) -> Result<String, String> {
    let s = syms();
    let refs: Vec<&TensorType> = inputs.iter().collect();
    let out = infer_types(&s, &op, &refs)?;
    assert_eq!(out.len(), 1);
    let dims: Vec<String> = out[0].shape.iter().map(|d| d.display(&s).to_string()).collect();
    Ok(format!("{}[{}]", out[0].dtype, dims.join(", ")))
}

fn ok(op: Op, inputs: &[TensorType]) -> String {
    infer(op, inputs).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn broadcasting() {
    assert_eq!(broadcast_shapes(&[c(3), c(1)], &[c(4)]), Ok(vec![c(3), c(4)]));
    assert_eq!(broadcast_shapes(&[b(), c(1)], &[b(), c(5)]), Ok(vec![b(), c(5)]));
    assert_eq!(broadcast_shapes(&[c(1)], &[b()]), Ok(vec![b()]));
    assert_eq!(broadcast_shapes(&[b()], &[c(7)]), Ok(vec![c(7)]));
    assert_eq!(broadcast_shapes(&[], &[n(), c(2)]), Ok(vec![n(), c(2)]));
    // Provably equal expressions in different forms.
    let x = Dim::add(b(), c(1));
    let y = Dim::Add(Box::new(c(1)), Box::new(b()));
    assert_eq!(broadcast_shapes(std::slice::from_ref(&x), &[y]), Ok(vec![x]));
    assert!(broadcast_shapes(&[c(3)], &[c(4)]).is_err());
    assert!(broadcast_shapes(&[b()], &[n()]).is_err());
}

#[test]
fn dim_equality() {
    let s = syms();
    assert_eq!(dims_equal(&Dim::mul(b(), c(2)), &Dim::Mul(Box::new(c(2)), Box::new(b())), &s), Some(true));
    assert_eq!(dims_equal(&b(), &Dim::add(b(), c(1)), &s), Some(false));
    assert_eq!(dims_equal(&b(), &c(65), &s), Some(false), "b <= 64");
    assert_eq!(dims_equal(&b(), &t(), &s), Some(false), "disjoint ranges");
    assert_eq!(dims_equal(&b(), &c(3), &s), None);
    assert_eq!(dims_equal(&b(), &n(), &s), None);
    assert_eq!(dims_equal(&Dim::mul(b(), c(24)), &Dim::mul(b(), c(25)), &s), Some(false));
    assert_eq!(dims_equal(&Dim::mul(b(), c(2)), &Dim::add(b(), c(3)), &s), None, "equal at b = 3");
    assert_eq!(dims_equal(&Dim::add(Dim::mul(b(), n()), c(1)), &Dim::mul(n(), b()), &s), Some(false));
}

#[test]
fn elementwise_family() {
    let x = f32t(&[b(), c(4)]);
    for &u in UnaryOp::ALL {
        let want = if u == UnaryOp::Not { "bool[b, 4]" } else { "f32[b, 4]" };
        assert_eq!(ok(Op::Unary(u), std::slice::from_ref(&x)), want);
    }
    for &op in BinaryOp::ALL {
        let want = if op.is_comparison() { "bool[b, 4]" } else { "f32[b, 4]" };
        assert_eq!(ok(Op::Binary(op), &[x.clone(), f32t(&[c(4)])]), want);
    }
    assert!(infer(Op::Binary(BinaryOp::Add), &[x.clone(), ty(DType::I64, &[c(4)])])
        .unwrap_err()
        .contains("dtypes differ"));
    let cond = ty(DType::Bool, &[c(1), c(4)]);
    assert_eq!(ok(Op::Where, &[cond.clone(), x.clone(), f32t(&[])]), "f32[b, 4]");
    assert!(infer(Op::Where, &[x.clone(), x.clone(), x.clone()]).is_err());
    assert_eq!(ok(Op::Cast { to: DType::F16 }, std::slice::from_ref(&x)), "f16[b, 4]");
    assert_eq!(ok(Op::Clamp { min: None, max: Some(6.0) }, std::slice::from_ref(&x)), "f32[b, 4]");
    assert!(infer(Op::Unary(UnaryOp::Neg), &[x.clone(), x]).unwrap_err().contains("operands"));
}

#[test]
fn matmul_family() {
    let mm = |a: &[Dim], bb: &[Dim]| infer(Op::MatMul, &[f32t(a), f32t(bb)]);
    assert_eq!(mm(&[c(3)], &[c(3)]).unwrap(), "f32[]");
    assert_eq!(mm(&[c(2), c(3)], &[c(3)]).unwrap(), "f32[2]");
    assert_eq!(mm(&[c(3)], &[b(), c(3), c(5)]).unwrap(), "f32[b, 5]");
    assert_eq!(mm(&[b(), c(1), n(), c(8)], &[c(4), c(8), c(16)]).unwrap(), "f32[b, 4, n, 16]");
    assert!(mm(&[c(2), c(3)], &[c(4), c(5)]).unwrap_err().contains("inner dimension"));
    assert!(mm(&[], &[c(3)]).is_err());
    assert_eq!(ok(Op::Linear, &[f32t(&[b(), n(), c(16)]), f32t(&[c(32), c(16)]), f32t(&[c(32)])]), "f32[b, n, 32]");
    assert!(infer(Op::Linear, &[f32t(&[b(), c(15)]), f32t(&[c(32), c(16)])]).is_err());
    assert!(infer(Op::Linear, &[f32t(&[b(), c(16)]), f32t(&[c(32), c(16)]), f32t(&[c(31)])]).is_err());
}

fn conv(stride: i64, padding: i64, dilation: i64, groups: i64) -> Op {
    Op::Conv { stride: vec![stride; 2], padding: vec![padding; 2], dilation: vec![dilation; 2], groups }
}

#[test]
fn conv_and_pool_family() {
    let x = f32t(&[b(), c(3), c(32), n()]);
    let w = f32t(&[c(8), c(3), c(3), c(3)]);
    assert_eq!(ok(conv(1, 1, 1, 1), &[x.clone(), w.clone()]), "f32[b, 8, 32, n]");
    assert_eq!(ok(conv(2, 0, 1, 1), &[x.clone(), w.clone(), f32t(&[c(8)])]), "f32[b, 8, 15, ((n + -1) // 2)]");
    assert_eq!(ok(conv(1, 0, 2, 1), &[x.clone(), w.clone()]), "f32[b, 8, 28, (n + -4)]");
    // Depthwise: Cin = groups * w.shape[1].
    let dw = f32t(&[c(3), c(1), c(3), c(3)]);
    assert_eq!(ok(conv(1, 1, 1, 3), &[x.clone(), dw]), "f32[b, 3, 32, n]");
    assert!(infer(conv(1, 1, 1, 2), &[x.clone(), w.clone()]).unwrap_err().contains("input channels"));
    assert!(infer(conv(0, 1, 1, 1), &[x.clone(), w]).unwrap_err().contains("stride"));

    let pool = |kind, k, s, p, ceil_mode| Op::Pool {
        kind,
        kernel: vec![k; 2],
        stride: vec![s; 2],
        padding: vec![p; 2],
        dilation: vec![1; 2],
        ceil_mode,
        count_include_pad: true,
        divisor: None,
        layout: crate::Layout::ChannelsFirst,
    };
    let img = f32t(&[c(1), c(3), c(7), c(6)]);
    // The indices variant has the values' shape and dtype i64.
    assert_eq!(ok(pool(PoolKind::ArgMax, 2, 2, 0, true), std::slice::from_ref(&img)), "i64[1, 3, 4, 3]");
    assert_eq!(ok(pool(PoolKind::Max, 2, 2, 0, false), std::slice::from_ref(&img)), "f32[1, 3, 3, 3]");
    assert_eq!(ok(pool(PoolKind::Max, 2, 2, 0, true), std::slice::from_ref(&img)), "f32[1, 3, 4, 3]");
    // AvgPool2d(3, 2, padding=1, ceil_mode=True): 7 -> 4 and 6 -> 4 (the last
    // window starts at 5, inside the input, so it is kept).
    assert_eq!(ok(pool(PoolKind::Avg, 3, 2, 1, true), std::slice::from_ref(&img)), "f32[1, 3, 4, 4]");
    // ceil_mode correction: in=5, k=2, s=2, p=1 -> ceil(4/2)+1 = 3, last start 4 >= 5+1? no -> 3;
    // in=4, k=1, s=3, p=0 -> ceil(3/3)+1 = 2, last start 3 >= 4? no -> 2; in=3,k=1,s=2,p=0 -> 2.
    let one = |size: i64, k, s, p| ok(pool(PoolKind::Max, k, s, p, true), &[f32t(&[c(size), c(size)])]);
    assert_eq!(one(5, 2, 2, 1), "f32[3, 3]");
    assert_eq!(one(4, 1, 3, 0), "f32[2, 2]");
    // in=2, k=2, s=2, p=1: ceil(2/2)+1 = 2, last start 2 >= 2+1? no -> 2. in=1,k=1,s=2,p=0 -> 1.
    assert_eq!(one(2, 2, 2, 1), "f32[2, 2]");
    assert_eq!(one(1, 1, 2, 0), "f32[1, 1]");
    // in=6, k=3, s=3, p=1: span=6, ceil(6/3)+1 = 3, last start 6 >= 7? no -> 3.
    // in=4, k=2, s=3, p=1: span=4, ceil(4/3)+1 = 3, last start 6 >= 5 -> 2.
    assert_eq!(one(4, 2, 3, 1), "f32[2, 2]");
    let sym = f32t(&[b(), n()]);
    assert_eq!(ok(pool(PoolKind::Max, 2, 2, 0, false), std::slice::from_ref(&sym)), "f32[(b // 2), (n // 2)]");
    // ceil((n - 3) / 2) + 1 == (n - 3 + 1 + 2) // 2.
    assert_eq!(ok(pool(PoolKind::Max, 3, 2, 0, true), std::slice::from_ref(&sym)), "f32[(b // 2), (n // 2)]");
    assert!(infer(pool(PoolKind::Max, 2, 2, 1, true), &[sym]).unwrap_err().contains("not expressible"));
    assert_eq!(ok(Op::AdaptiveAvgPool { output: vec![1, 1] }, &[img]), "f32[1, 3, 1, 1]");
}

#[test]
fn normalisation_family() {
    let x = f32t(&[b(), c(8), n()]);
    let p = f32t(&[c(8)]);
    assert_eq!(
        ok(Op::BatchNorm { eps: 1e-5 }, &[x.clone(), p.clone(), p.clone(), p.clone(), p.clone()]),
        "f32[b, 8, n]"
    );
    assert!(infer(Op::BatchNorm { eps: 1e-5 }, &[x.clone(), p.clone(), p.clone(), p.clone(), f32t(&[c(7)])]).is_err());
    let y = f32t(&[b(), n(), c(8)]);
    assert_eq!(ok(Op::LayerNorm { normalized_rank: 1, eps: 1e-5 }, &[y.clone(), p.clone(), p.clone()]), "f32[b, n, 8]");
    assert!(infer(Op::LayerNorm { normalized_rank: 4, eps: 1e-5 }, std::slice::from_ref(&y)).is_err());
    assert_eq!(ok(Op::Softmax { axis: 2 }, std::slice::from_ref(&y)), "f32[b, n, 8]");
    assert!(infer(Op::LogSoftmax { axis: 3 }, &[y]).unwrap_err().contains("axis 3"));
}

#[test]
fn reduction_family() {
    let x = f32t(&[b(), c(8), n()]);
    let r = |axes: Vec<usize>, keep_dims| {
        ok(Op::Reduce { kind: ReduceKind::Mean, axes, keep_dims }, std::slice::from_ref(&x))
    };
    assert_eq!(r(vec![1], true), "f32[b, 1, n]");
    assert_eq!(r(vec![0, 2], false), "f32[8]");
    assert!(
        infer(Op::Reduce { kind: ReduceKind::Sum, axes: vec![3], keep_dims: false }, std::slice::from_ref(&x)).is_err()
    );
    assert_eq!(ok(Op::ArgMax { axis: 2, keep_dims: false }, std::slice::from_ref(&x)), "i64[b, 8]");
    assert_eq!(ok(Op::ArgMax { axis: 0, keep_dims: true }, &[x]), "i64[1, 8, n]");
}

#[test]
fn attention_family() {
    let q = f32t(&[b(), c(4), n(), c(64)]);
    let k = f32t(&[b(), c(4), t(), c(64)]);
    let v = f32t(&[b(), c(4), t(), c(32)]);
    let att = Op::Attention { causal: false, scale: None };
    assert_eq!(ok(att.clone(), &[q.clone(), k.clone(), v.clone()]), "f32[b, 4, n, 32]");
    let mask = ty(DType::Bool, &[n(), t()]);
    assert_eq!(ok(att.clone(), &[q.clone(), k.clone(), v.clone(), mask]), "f32[b, 4, n, 32]");
    assert!(infer(att.clone(), &[q.clone(), k.clone(), v.clone(), ty(DType::I64, &[n(), t()])]).is_err());
    assert!(infer(att.clone(), &[q.clone(), f32t(&[b(), c(4), t(), c(63)]), v.clone()]).is_err());
    // Grouped heads do not broadcast (4 vs 2): an error, as in torch without enable_gqa.
    assert!(infer(att, &[q, f32t(&[b(), c(2), t(), c(64)]), v]).is_err());
}

#[test]
fn layout_family() {
    let x = f32t(&[b(), c(4), c(6)]);
    assert_eq!(ok(Op::Reshape { shape: vec![b(), c(24)] }, std::slice::from_ref(&x)), "f32[b, 24]");
    assert_eq!(ok(Op::Reshape { shape: vec![Dim::mul(b(), c(4)), c(6)] }, std::slice::from_ref(&x)), "f32[(b * 4), 6]");
    assert!(infer(Op::Reshape { shape: vec![b(), c(25)] }, std::slice::from_ref(&x))
        .unwrap_err()
        .contains("element count"));
    assert_eq!(ok(Op::Expand { shape: vec![c(2), b(), c(4), c(6)] }, &[f32t(&[c(1), c(4), c(1)])]), "f32[2, b, 4, 6]");
    assert!(infer(Op::Expand { shape: vec![c(3)] }, &[f32t(&[c(2)])]).is_err());
    assert_eq!(ok(Op::Permute { perm: vec![2, 0, 1] }, std::slice::from_ref(&x)), "f32[6, b, 4]");
    assert!(infer(Op::Permute { perm: vec![0, 0, 1] }, std::slice::from_ref(&x)).unwrap_err().contains("permutation"));
    assert!(infer(Op::Permute { perm: vec![0, 1] }, std::slice::from_ref(&x)).is_err());
    assert_eq!(
        ok(Op::Concat { axis: 0 }, &[x.clone(), x.clone(), f32t(&[c(2), c(4), c(6)])]),
        "f32[((b + b) + 2), 4, 6]"
    );
    assert!(infer(Op::Concat { axis: 0 }, &[x.clone(), f32t(&[b(), c(5), c(6)])]).unwrap_err().contains("dimension 1"));
    let idx = ty(DType::I64, &[n(), c(2)]);
    assert_eq!(ok(Op::Gather { axis: 1 }, &[x.clone(), idx]), "f32[b, n, 2, 6]");
    assert!(infer(Op::Gather { axis: 1 }, &[x.clone(), f32t(&[c(2)])]).is_err());
}

#[test]
fn slices() {
    let sl = |dim: Dim, start, end, step| infer(Op::Slice { axis: 0, start, end, step }, &[f32t(&[dim])]);
    // Static: Python semantics.
    assert_eq!(sl(c(10), 0, i64::MAX, 1).unwrap(), "f32[10]");
    assert_eq!(sl(c(10), 1, i64::MAX, 3).unwrap(), "f32[3]");
    assert_eq!(sl(c(10), -3, i64::MAX, 1).unwrap(), "f32[3]");
    assert_eq!(sl(c(10), 2, -2, 2).unwrap(), "f32[3]");
    assert_eq!(sl(c(10), 8, 3, 1).unwrap(), "f32[0]");
    assert_eq!(sl(c(10), 0, 100, 1).unwrap(), "f32[10]");
    // Symbolic.
    assert_eq!(sl(n(), 0, i64::MAX, 1).unwrap(), "f32[n]");
    assert_eq!(sl(n(), 1, i64::MAX, 1).unwrap(), "f32[(n + -1)]");
    assert_eq!(sl(n(), 1, i64::MAX, 2).unwrap(), "f32[(n // 2)]");
    assert_eq!(sl(b(), 0, 64, 1).unwrap(), "f32[b]", "end >= max bound");
    assert_eq!(sl(t(), 10, 50, 4).unwrap(), "f32[10]", "end <= min bound");
    assert_eq!(sl(n(), -4, i64::MAX, 1).unwrap(), "f32[4]");
    assert_eq!(sl(n(), 0, -1, 1).unwrap(), "f32[(n + -1)]");
    assert!(sl(b(), 0, 10, 1).unwrap_err().contains("may or may not"));
    assert!(sl(c(4), 0, 4, 0).unwrap_err().contains("step"));
}

#[test]
fn creation_family() {
    let full = Op::Full { value: 0.0, dtype: DType::I32, shape: vec![b(), c(3)] };
    assert_eq!(ok(full, &[]), "i32[b, 3]");
    let ar = Op::Arange { start: 0.0, step: 1.0, len: n(), dtype: DType::I64 };
    assert_eq!(ok(ar.clone(), &[]), "i64[n]");
    assert!(infer(ar, &[f32t(&[])]).is_err());
}

#[test]
fn gather_scatter_and_advanced_indexing() {
    let x = f32t(&[b(), c(4), c(6)]);
    let idx = ty(DType::I64, &[b(), c(2), c(6)]);
    assert_eq!(ok(Op::GatherElements { axis: 1 }, &[x.clone(), idx.clone()]), "f32[b, 2, 6]");
    // The index may not be larger than the data off the gathered axis.
    assert!(infer(Op::GatherElements { axis: 1 }, &[x.clone(), ty(DType::I64, &[b(), c(2), c(7)])]).is_err());
    assert!(infer(Op::GatherElements { axis: 1 }, &[x.clone(), f32t(&[b(), c(2), c(6)])]).is_err());
    let scatter = Op::ScatterElements { axis: 1, reduce: Some(ReduceKind::Mean), include_self: false };
    assert_eq!(ok(scatter.clone(), &[x.clone(), idx.clone(), f32t(&[b(), c(3), c(6)])]), "f32[b, 4, 6]");
    // src must hold the index's window, in the data's dtype.
    assert!(infer(scatter.clone(), &[x.clone(), idx.clone(), f32t(&[b(), c(1), c(6)])]).is_err());
    assert!(infer(scatter, &[x.clone(), idx, ty(DType::F64, &[b(), c(2), c(6)])]).is_err());
    let i = ty(DType::I64, &[n(), c(3)]);
    assert_eq!(ok(Op::IndexGather { axis: 1 }, &[x.clone(), i.clone(), i.clone()]), "f32[b, n, 3]");
    assert!(infer(Op::IndexGather { axis: 2 }, &[x.clone(), i.clone(), i.clone()]).is_err());
    assert!(infer(Op::IndexGather { axis: 0 }, &[x.clone(), i.clone(), ty(DType::I64, &[n(), c(4)])]).is_err());
    let values = f32t(&[b(), n(), c(3)]);
    assert_eq!(
        ok(Op::IndexPut { axis: 1, accumulate: true }, &[x.clone(), values, i.clone(), i.clone()]),
        "f32[b, 4, 6]"
    );
    assert!(infer(Op::IndexPut { axis: 1, accumulate: false }, &[x.clone(), f32t(&[b(), n(), c(4)]), i.clone(), i])
        .is_err());
}

#[test]
fn quant_linear_checks_storage_against_attributes() {
    let q = |bits: u8, group: usize, zero_points: bool, dynamic: bool| Op::QuantLinear {
        bits,
        group,
        zero_points,
        dynamic,
        asymmetric: false,
        act_scale: None,
        act_zero_point: 0,
    };
    let x = f32t(&[b(), c(64)]);
    let w8 = ty(DType::I8, &[c(32), c(64)]);
    let w4 = ty(DType::U8, &[c(32), c(32)]);
    let per_channel = f32t(&[c(32), c(1)]);
    let groups = f32t(&[c(32), c(2)]);
    let zp = ty(DType::I8, &[c(32), c(2)]);
    let bias = f32t(&[c(32)]);
    assert_eq!(
        infer(q(8, 64, false, true), &[x.clone(), w8.clone(), per_channel.clone(), bias.clone()]).unwrap(),
        "f32[b, 32]"
    );
    assert_eq!(
        infer(q(4, 32, true, false), &[x.clone(), w4.clone(), groups.clone(), zp.clone(), bias]).unwrap(),
        "f32[b, 32]"
    );
    // int4 stored one a byte, scales of the wrong group count, a missing zero point, dynamic int4.
    assert!(infer(q(4, 64, false, false), &[x.clone(), w8.clone(), per_channel.clone()]).is_err());
    assert!(infer(q(8, 32, false, false), &[x.clone(), w8.clone(), per_channel.clone()]).is_err());
    assert!(infer(q(4, 32, true, false), &[x.clone(), w4.clone(), groups.clone()]).is_err());
    assert!(infer(q(4, 32, false, true), &[x.clone(), w4, groups]).is_err());
    assert!(infer(q(8, 64, false, false), &[f32t(&[b(), c(63)]), w8.clone(), per_channel.clone()]).is_err());
    // Static activations: an f32 scale and an int8 zero point, never with dynamic.
    let st = |scale: f64, zp: i64, dynamic: bool| Op::QuantLinear {
        bits: 8,
        group: 64,
        zero_points: false,
        dynamic,
        asymmetric: false,
        act_scale: Some(scale),
        act_zero_point: zp,
    };
    let ins = [x.clone(), w8.clone(), per_channel.clone()];
    assert_eq!(infer(st(0.25, -3, false), &ins).unwrap(), "f32[b, 32]");
    assert!(infer(st(0.25, -3, true), &ins).is_err(), "dynamic and static");
    assert!(infer(st(0.25, 128, false), &ins).is_err(), "zero point out of int8");
    assert!(infer(st(0.1, 0, false), &ins).is_err(), "not an f32 value");
    assert!(infer(st(-1.0, 0, false), &ins).is_err(), "negative scale");
    let mut zp_only = q(8, 64, false, false);
    if let Op::QuantLinear { act_zero_point, .. } = &mut zp_only {
        *act_zero_point = 4;
    }
    assert!(infer(zp_only, &ins).is_err(), "zero point without a scale");
    // Per-row zero points: dynamic activations only.
    let asym = |dynamic: bool| Op::QuantLinear {
        bits: 8,
        group: 64,
        zero_points: false,
        dynamic,
        asymmetric: true,
        act_scale: None,
        act_zero_point: 0,
    };
    assert_eq!(infer(asym(true), &ins).unwrap(), "f32[b, 32]");
    assert!(infer(asym(false), &ins).is_err(), "asymmetric without dynamic");
    let grouped = Op::QuantLinear {
        bits: 8,
        group: 32,
        zero_points: false,
        dynamic: false,
        asymmetric: false,
        act_scale: Some(0.5),
        act_zero_point: 0,
    };
    assert!(infer(grouped, &[x, w8, f32t(&[c(32), c(2)])]).is_err(), "static needs per-channel weights");
}

#[test]
fn quant_conv_is_a_conv_of_its_int8_weight() {
    let q = |groups: i64, dynamic: bool, act_scale: Option<f64>| Op::QuantConv {
        stride: vec![2, 2],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        groups,
        epilogue: crate::Epilogue::default(),
        layout: crate::Layout::ChannelsFirst,
        dynamic,
        asymmetric: false,
        act_scale,
        act_zero_point: 0,
        out_quant: None,
        res_quant: None,
    };
    let x = f32t(&[b(), c(8), c(16), c(16)]);
    let w = ty(DType::I8, &[c(4), c(8), c(3), c(3)]);
    let scales = f32t(&[c(4)]);
    let bias = f32t(&[c(4)]);
    let with = |bias: bool, residual: crate::Residual| {
        let mut op = q(1, true, None);
        if let Op::QuantConv { epilogue, .. } = &mut op {
            *epilogue = crate::Epilogue { bias, activation: None, residual };
        }
        op
    };
    let none = crate::Residual::None;
    assert_eq!(
        infer(with(true, none), &[x.clone(), w.clone(), scales.clone(), bias.clone()]).unwrap(),
        "f32[b, 4, 8, 8]"
    );
    // The flags say which operands are there.
    assert!(infer(q(1, true, None), &[x.clone(), w.clone(), scales.clone(), bias.clone()]).is_err());
    let residual = f32t(&[b(), c(4), c(8), c(8)]);
    let after = crate::Residual::AfterActivation;
    assert_eq!(
        infer(with(true, after), &[x.clone(), w.clone(), scales.clone(), bias.clone(), residual.clone()]).unwrap(),
        "f32[b, 4, 8, 8]"
    );
    assert!(infer(with(false, after), &[x.clone(), w.clone(), scales.clone(), f32t(&[b(), c(4), c(8), c(7)])]).is_err());
    assert_eq!(infer(q(1, false, Some(0.5)), &[x.clone(), w.clone(), scales.clone()]).unwrap(), "f32[b, 4, 8, 8]");
    // Grouped: weight-only only.
    let wg = ty(DType::I8, &[c(4), c(2), c(3), c(3)]);
    assert_eq!(infer(q(4, false, None), &[x.clone(), wg.clone(), scales.clone()]).unwrap(), "f32[b, 4, 8, 8]");
    assert!(infer(q(4, true, None), &[x.clone(), wg, scales.clone()]).is_err());
    // An f32 weight, scales of the wrong length, a weight of the wrong channel count.
    assert!(infer(q(1, true, None), &[x.clone(), f32t(&[c(4), c(8), c(3), c(3)]), scales.clone()]).is_err());
    assert!(infer(q(1, true, None), &[x.clone(), w.clone(), f32t(&[c(5)])]).is_err());
    assert!(infer(q(1, true, None), &[x.clone(), ty(DType::I8, &[c(4), c(7), c(3), c(3)]), scales.clone()]).is_err());
    // int8 activations between layers: an i8 input with static activations
    // only; an i8 result with its parameters, channels-last, no residual.
    let xq = ty(DType::I8, &[b(), c(8), c(16), c(16)]);
    assert_eq!(infer(q(1, false, Some(0.5)), &[xq.clone(), w.clone(), scales.clone()]).unwrap(), "f32[b, 4, 8, 8]");
    assert!(infer(q(1, true, None), &[xq, w.clone(), scales.clone()]).is_err());
    let out_q = |layout: crate::Layout, scale: f64| {
        let mut op = q(1, false, Some(0.5));
        if let Op::QuantConv { out_quant, layout: l, .. } = &mut op {
            *out_quant = Some(crate::QParams { scale, zero_point: -7 });
            *l = layout;
        }
        op
    };
    let xl = f32t(&[b(), c(16), c(16), c(8)]);
    let last = crate::Layout::ChannelsLast;
    assert_eq!(infer(out_q(last, 0.25), &[xl.clone(), w.clone(), scales.clone()]).unwrap(), "i8[b, 8, 8, 4]");
    assert!(infer(out_q(crate::Layout::ChannelsFirst, 0.25), &[x.clone(), w.clone(), scales.clone()]).is_err());
    assert!(infer(out_q(last, 0.1), &[xl.clone(), w.clone(), scales.clone()]).is_err(), "not an f32 scale");
    // int8 residuals: an i8 residual with its parameters (dense,
    // channels-last, int8 activations), and then an i8 result too.
    let res_q = |groups: i64, res: Option<f64>, out: Option<f64>| {
        let mut op = q(groups, false, Some(0.5));
        if let Op::QuantConv { out_quant, res_quant, layout, epilogue, .. } = &mut op {
            *out_quant = out.map(|scale| crate::QParams { scale, zero_point: -7 });
            *res_quant = res.map(|scale| crate::QParams { scale, zero_point: 3 });
            *layout = last;
            *epilogue = crate::Epilogue { bias: false, activation: None, residual: crate::Residual::BeforeActivation };
        }
        op
    };
    let rq = ty(DType::I8, &[b(), c(8), c(8), c(4)]);
    let rf = f32t(&[b(), c(8), c(8), c(4)]);
    let ins = [xl.clone(), w.clone(), scales.clone(), rq.clone()];
    assert_eq!(infer(res_q(1, Some(0.25), Some(0.5)), &ins).unwrap(), "i8[b, 8, 8, 4]");
    assert_eq!(infer(res_q(1, Some(0.25), None), &ins).unwrap(), "f32[b, 8, 8, 4]");
    assert!(infer(res_q(1, None, None), &ins).is_err(), "an i8 residual needs its parameters");
    assert!(infer(res_q(1, Some(0.1), None), &ins).is_err(), "not an f32 scale");
    let insf = [xl.clone(), w.clone(), scales.clone(), rf];
    assert!(infer(res_q(1, Some(0.25), None), &insf).is_err(), "parameters for an f32 residual");
    assert_eq!(infer(res_q(1, None, Some(0.5)), &insf).unwrap(), "i8[b, 8, 8, 4]");
    // Depthwise takes static int8 activations, not dynamic ones.
    let wd = ty(DType::I8, &[c(8), c(1), c(3), c(3)]);
    let s8 = f32t(&[c(8)]);
    assert_eq!(infer(q(8, false, Some(0.5)), &[x.clone(), wd.clone(), s8.clone()]).unwrap(), "f32[b, 8, 8, 8]");
    assert!(infer(q(8, true, None), &[x, wd, s8]).is_err());
}
