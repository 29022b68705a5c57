//! Round trips and parse errors of the text form.

use kiln_ir::text::{parse, print, print_elided};
use kiln_ir::*;

fn round_trip(g: &Graph) -> String {
    let text = print(g);
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let again = print(&parsed);
    assert_eq!(text, again, "print -> parse -> print is not identical");
    text
}

fn f32s(v: &[f32]) -> ConstBytes {
    ConstBytes::owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// A graph that uses every op and attribute shape at least once.
fn every_op_graph() -> Graph {
    let mut g = Graph::new();
    let b = g.add_symbol("batch", 1, Some(64));
    let s = g.add_symbol("seq", 1, None);
    let bd = Dim::Sym(b);
    let sd = Dim::Sym(s);
    let t = |shape: Vec<Dim>| TensorType::new(DType::F32, shape);
    let x = g.add_input("x", t(vec![bd.clone(), 16.into()]));
    let img = g.add_input("img", TensorType::fixed(DType::F32, &[1, 3, 8, 8]));
    let idx = g.add_input("idx", TensorType::new(DType::I64, vec![sd.clone()]));
    let cond = g.add_input("cond", TensorType::new(DType::Bool, vec![bd.clone(), 16.into()]));
    let w =
        g.add_const(Some("fc.weight".into()), TensorType::fixed(DType::F32, &[2, 2]), f32s(&[0.1, -2.5, 1e-7, 3.0e38]));
    let xt = t(vec![bd.clone(), 16.into()]);
    let mut last = x;
    for &u in UnaryOp::ALL {
        last = g.push(Op::Unary(u), vec![last], xt.clone(), None);
    }
    for &op in BinaryOp::ALL {
        let ty = if op.is_comparison() { TensorType::new(DType::Bool, xt.shape.clone()) } else { xt.clone() };
        g.push(Op::Binary(op), vec![x, last], ty, None);
    }
    g.push(Op::Where, vec![cond, x, last], xt.clone(), None);
    g.push(Op::Cast { to: DType::F16 }, vec![x], TensorType::new(DType::F16, xt.shape.clone()), None);
    g.push(Op::Clamp { min: Some(0.0), max: Some(6.0) }, vec![x], xt.clone(), None);
    g.push(Op::Clamp { min: None, max: Some(-0.0) }, vec![x], xt.clone(), None);
    g.push(Op::Clamp { min: None, max: None }, vec![x], xt.clone(), None);
    g.push(Op::MatMul, vec![x, w], xt.clone(), None);
    g.push(Op::Linear, vec![x, w], xt.clone(), None);
    let conv = Op::Conv { stride: vec![1, 2], padding: vec![0, 1], dilation: vec![1, 1], groups: 1 };
    g.push(conv, vec![img, w], TensorType::fixed(DType::F32, &[1, 2, 8, 4]), None);
    g.push(Op::BatchNorm { eps: 1e-5 }, vec![img, w, w, w, w], TensorType::fixed(DType::F32, &[1, 3, 8, 8]), None);
    g.push(Op::LayerNorm { normalized_rank: 1, eps: 1e-12 }, vec![x, w, w], xt.clone(), None);
    g.push(Op::Softmax { axis: 1 }, vec![x], xt.clone(), None);
    g.push(Op::LogSoftmax { axis: 0 }, vec![x], xt.clone(), None);
    for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod] {
        g.push(Op::Reduce { kind, axes: vec![1], keep_dims: true }, vec![x], t(vec![bd.clone(), 1.into()]), None);
    }
    g.push(Op::ArgMax { axis: 1, keep_dims: false }, vec![x], TensorType::new(DType::I64, vec![bd.clone()]), None);
    // Every pool kind, and avg_pool with and without a divisor (omitted when absent).
    for (kind, divisor, dtype) in [
        (PoolKind::Max, None, DType::F32),
        (PoolKind::Avg, None, DType::F32),
        (PoolKind::Avg, Some(-3), DType::F32),
        (PoolKind::ArgMax, None, DType::I64),
    ] {
        let pool = Op::Pool {
            kind,
            kernel: vec![2, 2],
            stride: vec![2, 2],
            padding: vec![0, 0],
            dilation: vec![1, 1],
            ceil_mode: true,
            count_include_pad: false,
            divisor,
            layout: kiln_ir::Layout::ChannelsFirst,
        };
        g.push(pool, vec![img], TensorType::fixed(dtype, &[1, 3, 4, 4]), None);
    }
    g.push(Op::AdaptiveAvgPool { output: vec![1, 1] }, vec![img], TensorType::fixed(DType::F32, &[1, 3, 1, 1]), None);
    g.push(Op::Attention { causal: true, scale: None }, vec![x, x, x], xt.clone(), None);
    g.push(Op::Attention { causal: false, scale: Some(0.125) }, vec![x, x, x, cond], xt.clone(), None);
    let sum = Dim::add(bd.clone(), 1.into());
    let all = [
        Dim::add(bd.clone(), sd.clone()),
        Dim::mul(bd.clone(), 16.into()),
        Dim::floor_div(sd.clone(), 2.into()),
        Dim::modulo(sd.clone(), 3.into()),
    ];
    g.push(Op::Reshape { shape: vec![Dim::mul(bd.clone(), 16.into())] }, vec![x], t(vec![all[1].clone()]), None);
    g.push(Op::Expand { shape: all.to_vec() }, vec![x], t(all.to_vec()), None);
    g.push(Op::Permute { perm: vec![1, 0] }, vec![x], t(vec![16.into(), bd.clone()]), None);
    let sl = Op::Slice { axis: 0, start: 0, end: i64::MAX, step: 1 };
    g.push(sl, vec![x], t(vec![sum.clone(), 16.into()]), None);
    g.push(Op::Slice { axis: 1, start: -3, end: i64::MIN, step: 2 }, vec![x], xt.clone(), None);
    g.push(Op::Concat { axis: 0 }, vec![x, x, x], t(vec![Dim::mul(bd.clone(), 3.into()), 16.into()]), None);
    g.push(Op::Gather { axis: 0 }, vec![x, idx], t(vec![sd.clone(), 16.into()]), None);
    g.push(Op::GatherElements { axis: 1 }, vec![x, idx], t(vec![sd.clone()]), None);
    for (reduce, include_self) in
        [(None, true), (Some(kiln_ir::ReduceKind::Mean), false), (Some(kiln_ir::ReduceKind::Max), true)]
    {
        g.push(Op::ScatterElements { axis: 0, reduce, include_self }, vec![x, idx, x], xt.clone(), None);
    }
    g.push(Op::IndexGather { axis: 0 }, vec![x, idx, idx], t(vec![sd.clone()]), None);
    g.push(Op::IndexPut { axis: 0, accumulate: true }, vec![x, x, idx], xt.clone(), None);
    g.push(
        Op::Full { value: f64::NEG_INFINITY, dtype: DType::F32, shape: vec![bd.clone(), 4.into()] },
        vec![],
        t(vec![bd.clone(), 4.into()]),
        None,
    );
    g.push(
        Op::Full { value: 0.1, dtype: DType::Bool, shape: vec![] },
        vec![],
        TensorType::new(DType::Bool, vec![]),
        None,
    );
    let ar = Op::Arange { start: 0.0, step: 1.5, len: sd.clone(), dtype: DType::I64 };
    let loc = g.locs.push(Location {
        node_name: "arange_1".into(),
        stack_trace: Some("File \"m.py\", line 3\n  x = \"q\"\\".into()),
    });
    g.push(ar, vec![], TensorType::new(DType::I64, vec![sd.clone()]), Some(loc));
    let loc = g.locs.push(Location { node_name: "relu".into(), stack_trace: None });
    let y = g.push(Op::Unary(UnaryOp::Relu), vec![last], xt.clone(), Some(loc));
    g.values[y].name = Some("hidden state".into());
    g.add_output("out", y);
    g.add_output("x again", x);
    g
}

#[test]
fn every_op_round_trips() {
    let g = every_op_graph();
    let text = round_trip(&g);
    // The parsed graph holds the same ops (no NaN attributes here, so `==` works).
    let parsed = parse(&text).unwrap();
    let ops = |g: &Graph| g.order.iter().map(|&n| g.nodes[n].op.clone()).collect::<Vec<_>>();
    assert_eq!(ops(&g), ops(&parsed));
    let tys = |g: &Graph| g.values.values().map(|v| v.ty.clone()).collect::<Vec<_>>();
    assert_eq!(tys(&g), tys(&parsed));
    assert_eq!(parsed.symbols, g.symbols);
    assert_eq!(parsed.output_names, g.output_names);
    assert_eq!(parsed.locs[LocId::from_u32(0)], g.locs[LocId::from_u32(0)]);
    for needle in [
        "sym seq in [1, inf]",
        "slice{axis=0, start=0, end=max, step=1}",
        "slice{axis=1, start=-3, end=-9223372036854775808, step=2}",
        "conv{stride=[1, 2], padding=[0, 1], dilation=[1, 1], groups=1}",
        "cast{to=f16}",
        "clamp{min=0.0, max=6.0}",
        "clamp{max=-0.0}",
        "scatter_elements{axis=0, reduce=mean, include_self=false}",
        "index_put{axis=0, accumulate=true}",
        "= clamp(%0)",
        "reduce_mean{axes=[1], keep_dims=true}",
        "full{value=-inf, dtype=f32, shape=[batch, 4]}",
        "arange{start=0.0, step=1.5, len=seq, dtype=i64}",
        "batch_norm{eps=1e-5}",
        "expand{shape=[(batch + seq), (batch * 16), (seq // 2), (seq % 3)]}",
        "attention{causal=false, scale=0.125}",
        "avg_pool{kernel=[2, 2], stride=[2, 2], padding=[0, 0], dilation=[1, 1], ceil_mode=true, count_include_pad=false, divisor=-3}",
        "avg_pool{kernel=[2, 2], stride=[2, 2], padding=[0, 0], dilation=[1, 1], ceil_mode=true, count_include_pad=false}(",
        "i64[1, 3, 4, 4] = max_pool_indices{kernel=[2, 2],",
        "const %4 \"fc.weight\": f32[2, 2] = [0.1, -2.5, 1e-7, 3e38]",
        "@\"arange_1\" \"File \\\"m.py\\\", line 3\\n  x = \\\"q\\\"\\\\\"",
        "%",
        "\"hidden state\": f32[batch, 16] = relu(",
        "output %0 \"x again\"",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in\n{text}");
    }
}

#[test]
fn hand_written_text_round_trips_exactly() {
    let src = "\
graph {
  sym batch in [1, 64]
  input %0 \"x\": f32[batch, 16]
  const %1 \"fc.weight\": f32[4, 2] = [0.5, 0.25, 0.125, 1.0, 2.0, 3.0, -4.0, 5.5]
  %2: f32[batch, 4] = linear(%0, %1)
  %3: f32[batch, 4] = gelu(%2) @\"gelu_1\" \"model.py:12\"
  %4: f32[(batch + 1), 4] = slice{axis=0, start=0, end=max, step=1}(%3)
  %5: f32[batch, 2], %6 \"rest\": f32[batch, 2] = linear(%4, %1)
  _ = relu(%6)
  output %3 \"out\"
}
";
    let g = parse(src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print(&g), src);
    let n = g.order[3];
    assert_eq!(g.nodes[n].outputs.len(), 2);
    assert!(g.nodes[g.order[4]].outputs.is_empty());
    let elided = print_elided(&g, 3);
    assert!(elided.contains("= [0.5, 0.25, 0.125, ... (8 elements)]"), "{elided}");
}

#[test]
fn labels_and_layout_are_free_on_input() {
    let src = "graph { input %10: f32[2] %7: f32[2] = neg(%10) ; comment\n output %7 \"y\" }";
    let g = parse(src).unwrap();
    assert_eq!(print(&g), "graph {\n  input %0: f32[2]\n  %1: f32[2] = neg(%0)\n  output %1 \"y\"\n}\n");
    assert_eq!(g.values[g.inputs[0]].name, None);
}

fn const_graph(dtype: DType, bytes: Vec<u8>, n: i64) -> Graph {
    let mut g = Graph::new();
    let v = g.add_const(None, TensorType::fixed(dtype, &[n]), ConstBytes::owned(bytes));
    g.add_output("c", v);
    g
}

fn const_bytes(g: &Graph) -> Vec<u8> {
    g.consts.values().next().unwrap().bytes.as_bytes().to_vec()
}

/// Bytes survive print -> parse exactly, NaN payloads and signed zeros included.
fn assert_bytes_round_trip(dtype: DType, bytes: Vec<u8>) -> String {
    let n = (bytes.len() / dtype.size_bytes()) as i64;
    let g = const_graph(dtype, bytes.clone(), n);
    let text = round_trip(&g);
    assert_eq!(const_bytes(&parse(&text).unwrap()), bytes, "{text}");
    text
}

#[test]
fn constants_of_every_dtype_round_trip() {
    let f32v =
        [0.0f32, -0.0, 1.0, 0.1, -1e-45, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    let mut bytes: Vec<u8> = f32v.iter().flat_map(|x| x.to_le_bytes()).collect();
    bytes.extend(0x7fc0_0001u32.to_le_bytes()); // NaN with a payload
    bytes.extend(0xffc0_0000u32.to_le_bytes()); // negative NaN
    let text = assert_bytes_round_trip(DType::F32, bytes);
    assert!(text.contains("[0.0, -0.0, 1.0, 0.1, -1e-45, 3.4028235e38, 1.1754944e-38, inf, -inf, nan, nan(0x7fc00001), nan(0xffc00000)]"), "{text}");

    let f64v = [0.1f64, -0.0, 1e300, f64::MIN_POSITIVE / 2.0, f64::NAN, f64::NEG_INFINITY];
    assert_bytes_round_trip(DType::F64, f64v.iter().flat_map(|x| x.to_le_bytes()).collect());

    // Every f16 and bf16 bit pattern.
    let all16: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    assert_bytes_round_trip(DType::F16, all16.clone());
    assert_bytes_round_trip(DType::BF16, all16);
    let tenth = half::f16::from_f32(0.1).to_bits().to_le_bytes().to_vec();
    assert!(assert_bytes_round_trip(DType::F16, tenth).contains("= [0.1]"));

    assert_bytes_round_trip(DType::I8, vec![0, 127, 128, 255]);
    assert_bytes_round_trip(DType::U8, vec![0, 127, 128, 255]);
    assert_bytes_round_trip(DType::I16, [i16::MIN, -1, 0, i16::MAX].iter().flat_map(|x| x.to_le_bytes()).collect());
    assert_bytes_round_trip(DType::I32, [i32::MIN, -1, 0, i32::MAX].iter().flat_map(|x| x.to_le_bytes()).collect());
    assert_bytes_round_trip(DType::I64, [i64::MIN, -1, 0, i64::MAX].iter().flat_map(|x| x.to_le_bytes()).collect());
    let text = assert_bytes_round_trip(DType::Bool, vec![0, 1, 1, 0]);
    assert!(text.contains("[false, true, true, false]"));
    // Not a valid bool, but the text must not lose it.
    assert_bytes_round_trip(DType::Bool, vec![2]);

    // Scalars and empty tensors.
    let mut g = Graph::new();
    let v = g.add_const(None, TensorType::fixed(DType::F32, &[]), f32s(&[2.5]));
    let e = g.add_const(None, TensorType::fixed(DType::F32, &[0, 3]), f32s(&[]));
    g.add_output("s", v);
    g.add_output("e", e);
    let text = round_trip(&g);
    assert!(text.contains("const %0: f32[] = [2.5]") && text.contains("const %1: f32[0, 3] = []"), "{text}");
}

#[test]
fn nan_float_attributes_round_trip() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    let odd_nan = f64::from_bits(0x7ff8_0000_0000_0001);
    let y = g.push(
        Op::Clamp { min: Some(f64::NAN), max: Some(odd_nan) },
        vec![x],
        TensorType::fixed(DType::F32, &[2]),
        None,
    );
    g.add_output("y", y);
    let text = round_trip(&g);
    assert!(text.contains("clamp{min=nan, max=nan(0x7ff8000000000001)}"), "{text}");
    let p = parse(&text).unwrap();
    let Op::Clamp { max: Some(m), .. } = p.nodes[p.order[0]].op else { panic!() };
    assert_eq!(m.to_bits(), odd_nan.to_bits());
}

#[test]
fn graph_with_broken_invariants_still_prints() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    let y = g.push(Op::Unary(UnaryOp::Neg), vec![x, ValueId::from_u32(99)], TensorType::fixed(DType::F32, &[2]), None);
    g.outputs.push(y); // no name
    g.order.push(NodeId::from_u32(42));
    let text = print(&g);
    assert!(text.contains("neg(%0, %v99)") && text.contains("n42 is out of range"), "{text}");
}

fn parse_err(src: &str) -> String {
    match parse(src) {
        Ok(g) => panic!("parsed:\n{}", print(&g)),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parse_errors_have_line_and_column() {
    let cases: &[(&str, &str)] = &[
        ("graph {\n  input %0: f32[2]\n  %1: f32[2] = frobnicate(%0)\n}", "3:16: unknown op `frobnicate`"),
        ("graph {\n  input %0: f32[2]\n  %1: f32[2] = softmax{axis=x}(%0)\n}", "3:29: expected an integer"),
        (
            "graph {\n  input %0: f32[2]\n  %1: f32[2] = softmax{dim=1}(%0)\n}",
            "3:24: unknown attribute `dim` for `softmax`",
        ),
        ("graph {\n  input %0: f32[2]\n  %1: f32[2] = softmax(%0)\n}", "3:16: `softmax` needs attribute `axis`"),
        ("graph {\n  input %0: f32[2]\n  %1: f32[2] = neg(%5)\n}", "3:20: undefined value %5"),
        (
            "graph {\n  input %0: f32[2]\n  %1: f32[2] = add(%0, %2)\n  %2: f32[2] = neg(%0)\n}",
            "3:24: %2 is used before its definition (at 4:3)",
        ),
        (
            "graph {\n  const %0: f32[2, 2] = [1.0, 2.0, 3.0]\n}",
            "2:25: constant of shape [2, 2] needs 4 elements, found 3",
        ),
        ("graph {\n  const %0: i8[1] = [300]\n}", "2:22: 300 is out of range for i8"),
        ("graph {\n  const %0: i32[1] = [1.5]\n}", "2:23: expected an integer for i32, found `1.5`"),
        ("graph {\n  input %0: f33[2]\n}", "2:13: unknown dtype `f33`"),
        ("graph {\n  input %0: f32[n]\n}", "2:17: undefined symbol `n`"),
        ("graph {\n  input %0: f32[2]\n  input %0: f32[2]\n}", "3:9: %0 is defined twice"),
        ("graph {\n  input %0: f32[2]\n  output %0 \"y\n}", "3:13: unterminated string"),
        ("graph {\n  input %0: f32[2] #\n}", "2:20: unexpected character `#`"),
        (
            "graph {\n  input %0: f32[2]\n",
            "3:1: expected `sym`, `mesh`, `input`, `const`, `output`, `state`, a `%value` or `}`, found end of input",
        ),
        ("graph {\n  sym n in [4, 2]\n}", "2:16: symbol `n` has an empty range"),
        ("graph {\n  input %0: f32[(2 - 1)]\n}", "2:20: expected `+`, `*`, `//` or `%`, found `-`"),
        ("graph {\n  input %0: f32[2]\n  %1: f32[2] = cast{to=f33}(%0)\n}", "3:24: unknown dtype `f33`"),
        (
            "graph {\n  input %0: f32[2]\n  %1: f32[2] = clamp{min=1.0, min=2.0}(%0)\n}",
            "3:31: attribute `min` is given twice",
        ),
        ("graph {\n  const %0: bf16[1] = [nan(0x1)]\n}", "2:24: 0x0001 is not a NaN"),
        ("graph {\n  input %0: f32[b]\n}\n", "2:17: undefined symbol `b`"),
        ("graph {}\ngraph {}", "2:1: expected end of input after the graph, found `graph`"),
        ("graph {\n  input %0: f32[2]\n  %1: f32[2], %1: f32[2] = neg(%0)\n}", "3:26: %1 is defined twice"),
    ];
    for (src, expected) in cases {
        assert_eq!(&parse_err(src), expected, "for\n{src}");
    }
}

#[test]
fn conformance_ops_round_trip() {
    let mut g = Graph::new();
    let s = g.add_symbol("n", 1, Some(8));
    let x =
        g.add_input("x", TensorType::new(DType::F32, vec![Dim::Const(2), Dim::Sym(s), Dim::Const(4), Dim::Const(4)]));
    let ops = [
        Op::Unary(UnaryOp::Log1p),
        Op::Unary(UnaryOp::Atanh),
        Op::CumSum { axis: 1 },
        Op::Scan { axis: 1, kind: ScanKind::LogSumExp },
        Op::Scan { axis: 3, kind: ScanKind::ArgMax },
        Op::Linalg { op: LinalgOp::Inv, upper: false, left: true, unit: false, complex: false },
        Op::Linalg { op: LinalgOp::LuPivots, upper: false, left: true, unit: false, complex: false },
        Op::Linalg { op: LinalgOp::QrR, upper: true, left: false, unit: true, complex: false },
        Op::ArgMin { axis: 3, keep_dims: true },
        Op::Sort { axis: 1, k: Dim::Sym(s), descending: true, indices: true },
        Op::Sort { axis: 3, k: Dim::Const(2), descending: false, indices: false },
        Op::Pad {
            lo: vec![0, 0, 1, -1],
            hi: vec![0, 0, 2, 0],
            interior: vec![0, 0, 1, 0],
            mode: PadMode::Constant,
            value: -0.5,
        },
        Op::Pad {
            lo: vec![0, 0, 1, 1],
            hi: vec![0, 0, 1, 1],
            interior: vec![0; 4],
            mode: PadMode::Reflect,
            value: 0.0,
        },
        Op::Flip { axes: vec![1, 3] },
        Op::Upsample {
            mode: ResizeMode::Linear,
            align_corners: true,
            size: vec![Dim::Const(8), Dim::Const(8)],
            scales: vec![],
        },
        Op::Upsample {
            mode: ResizeMode::Nearest,
            align_corners: false,
            size: vec![Dim::Const(6), Dim::Const(8)],
            scales: vec![1.5, 2.0],
        },
    ];
    for op in ops {
        let tys = kiln_ir::infer::infer_types(&g.symbols, &op, &[g.ty(x)]).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        let v = g.push(op, vec![x], tys[0].clone(), None);
        g.add_output(format!("o{}", g.outputs.len()), v);
    }
    let y = g.add_input("y", TensorType::new(DType::F32, vec![Dim::Const(3)]));
    let b = g.push(Op::Binary(BinaryOp::Atan2), vec![y, y], TensorType::new(DType::F32, vec![Dim::Const(3)]), None);
    g.add_output("atan2", b);
    let randoms = [
        Op::Random {
            dist: RandomDist::Uniform { low: -2.0, high: 3.0 },
            dtype: DType::F32,
            shape: vec![Dim::Sym(s), Dim::Const(4)],
            stream: 0,
        },
        Op::Random { dist: RandomDist::Normal { mean: 1.0, std: 0.5 }, dtype: DType::F64, shape: vec![], stream: 1 },
        Op::Random {
            dist: RandomDist::Int { low: -3, high: 10 },
            dtype: DType::I64,
            shape: vec![Dim::Const(7)],
            stream: 2,
        },
        Op::Random { dist: RandomDist::Perm, dtype: DType::I32, shape: vec![Dim::Sym(s)], stream: 3 },
    ];
    for op in randoms {
        let tys = kiln_ir::infer::infer_types(&g.symbols, &op, &[]).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        let v = g.push(op, vec![], tys[0].clone(), None);
        g.add_output(format!("r{}", g.outputs.len()), v);
    }
    let ok = g.push(Op::Binary(BinaryOp::Eq), vec![y, y], TensorType::new(DType::Bool, vec![Dim::Const(3)]), None);
    g.add_node(Op::Assert { message: "torch.linalg.inv: \"singular\"\nmatrix".into() }, vec![ok], vec![], None);
    // Complex matrices: a trailing (re, im) dim on the operand and on
    // complex-valued results only.
    let z = g.add_input("z", TensorType::new(DType::F32, vec![Dim::Const(3), Dim::Const(3), Dim::Const(2)]));
    for (op, want) in [(LinalgOp::Det, vec![2]), (LinalgOp::LogAbsDet, vec![]), (LinalgOp::LuPivots, vec![3])] {
        let op = Op::Linalg { op, upper: false, left: true, unit: false, complex: true };
        let tys = kiln_ir::infer::infer_types(&g.symbols, &op, &[g.ty(z)]).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        assert_eq!(tys[0].shape, want.into_iter().map(Dim::Const).collect::<Vec<_>>(), "{op:?}");
        let v = g.push(op, vec![z], tys[0].clone(), None);
        g.add_output(format!("c{}", g.outputs.len()), v);
    }
    let text = round_trip(&g);
    assert!(text.contains("linalg{op=lu_pivots, upper=false, left=true, unit=false, complex=false}"), "{text}");
    assert!(text.contains("f32[2] = linalg{op=det, upper=false, left=true, unit=false, complex=true}"), "{text}");
    assert!(text.contains(r#"assert{message="torch.linalg.inv: \"singular\"\nmatrix"}"#), "{text}");
    assert!(
        text.contains("pad{lo=[0, 0, 1, -1], hi=[0, 0, 2, 0], interior=[0, 0, 1, 0], mode=constant, value=-0.5}"),
        "{text}"
    );
    assert!(text.contains("f32[2, n, 6, 6] = pad"), "padded shape: {text}");
    kiln_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{e:?}"));
}

#[test]
fn states_round_trip_and_verify() {
    let src = "graph {
  input %0 \"x\": f32[3]
  input %1 \"count\": f32[1] {origin=\"count\"}
  %2: f32[1] = add(%1, %1)
  %3: f32[3] = mul(%0, %2)
  output %3 \"output_0\"
  output %2 \"state count\"
  state \"count\" input 1 output 1 = [0.5]
}
";
    let g = parse(src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.states.len(), 1);
    assert_eq!((g.states[0].input, g.states[0].output), (1, 1));
    assert_eq!(g.states[0].init.as_bytes(), 0.5f32.to_le_bytes());
    assert_eq!(kiln_ir::verify::verify(&g), Ok(()));
    assert_eq!(round_trip(&g), src);
    // A state paired with an output of another type, or with missing bytes.
    let err = parse(&src.replace("output 1 = [0.5]", "output 0 = [0.5]")).map(|g| kiln_ir::verify::verify(&g));
    assert!(matches!(&err, Ok(Err(e)) if e.errors.iter().any(|m| m.contains("read as"))), "{err:?}");
    assert!(parse(&src.replace("= [0.5]", "= [0.5, 1]")).is_err());
    assert!(parse(&src.replace("input 1 output 1", "input 2 output 1")).is_err());
}

/// The op table gives every op's text names and attribute keys: the parser
/// knows every name, and what the printer writes uses only the table's keys,
/// in the table's order.
#[test]
fn op_table_names_and_keys_match_the_text_form() {
    let forms = kiln_ir::op_text_forms();
    let mut names: Vec<&str> = forms.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "a text name is used twice by the op table");
    for (name, keys) in &forms {
        let src = format!("graph {{\n  input %0: f32[2]\n  %1: f32[2] = {name}(%0)\n}}");
        match parse(&src) {
            Ok(_) => {}
            Err(e) => {
                let key =
                    e.message.strip_prefix(&format!("`{name}` needs attribute `")).and_then(|k| k.strip_suffix('`'));
                assert!(key.is_some_and(|k| keys.contains(&k)), "`{name}`: {e}");
            }
        }
    }
    // Every name is printed by the graphs above, and only with its keys.
    let samples = table_samples_graph();
    let sample_text = round_trip(&samples);
    let ops = |g: &Graph| g.order.iter().map(|&n| g.nodes[n].op.clone()).collect::<Vec<_>>();
    assert_eq!(ops(&samples), ops(&parse(&sample_text).unwrap()));
    let text = print(&every_op_graph()) + &sample_text;
    let mut printed = std::collections::HashSet::new();
    for line in text.lines() {
        let Some((_, rhs)) = line.split_once(" = ") else { continue };
        let name: String = rhs.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let Some((_, keys)) = forms.iter().find(|(n, _)| *n == name) else { continue };
        printed.insert(name.clone());
        let rest = &rhs[name.len()..];
        let attrs = if rest.starts_with('{') { &rest[1..rest.find("}(").unwrap_or(rest.len())] } else { "" };
        // Top-level keys: `key=` at the start or after `, ` outside brackets.
        let mut depth = 0;
        let mut at_key = true;
        let mut seen = vec![];
        let mut key = String::new();
        for c in attrs.chars() {
            match c {
                '[' | '(' | '{' => depth += 1,
                ']' | ')' | '}' => depth -= 1,
                '=' if depth == 0 && at_key => {
                    seen.push(std::mem::take(&mut key));
                    at_key = false;
                }
                ',' if depth == 0 => at_key = true,
                ' ' => {}
                _ if at_key => key.push(c),
                _ => {}
            }
        }
        let order: Vec<usize> = seen
            .iter()
            .map(|k| keys.iter().position(|t| t == k).unwrap_or_else(|| panic!("`{name}` printed key `{k}`")))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "`{name}` printed {seen:?}, the table says {keys:?}");
    }
    let missing: Vec<&str> = names.iter().copied().filter(|n| !printed.contains(*n)).collect();
    assert!(missing.is_empty(), "not in `every_op_graph` or `table_samples_graph`: {missing:?}");
}

/// The ops `every_op_graph` lacks, one node each (types do not matter here).
fn table_samples_graph() -> Graph {
    let mut g = Graph::new();
    let n = g.add_symbol("n", 0, Some(8));
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 4]));
    let ty = TensorType::fixed(DType::F32, &[2, 4]);
    let mut body = Graph::new();
    let b = body.add_input("i", TensorType::fixed(DType::F32, &[2, 4]));
    body.add_output("i", b);
    let epilogue = Epilogue {
        bias: true,
        activation: Some(Activation::Clamp { min: Some(0.0), max: None }),
        residual: Residual::AfterActivation,
    };
    let shape = vec![Dim::Const(2), Dim::Sym(n)];
    let ops = [
        Op::ArgMin { axis: 1, keep_dims: false },
        Op::CumSum { axis: 0 },
        Op::Scan { axis: 1, kind: ScanKind::Max },
        Op::Linalg { op: LinalgOp::Solve, upper: false, left: true, unit: false, complex: false },
        Op::Sort { axis: 1, k: Dim::Sym(n), descending: true, indices: false },
        Op::Pad { lo: vec![0, 1], hi: vec![0, 0], interior: vec![0, 0], mode: PadMode::Replicate, value: 0.0 },
        Op::Flip { axes: vec![0, 1] },
        Op::Fused { program: vec![FusedOp::Unary { op: UnaryOp::Exp, x: 0 }] },
        Op::GroupedMatMul,
        Op::RmsNorm { normalized_rank: 1, eps: 1e-6 },
        Op::QuantLinear {
            bits: 4,
            group: 32,
            zero_points: true,
            dynamic: false,
            asymmetric: false,
            act_scale: Some(0.5),
            act_zero_point: -3,
        },
        Op::QuantLinear {
            bits: 8,
            group: 4,
            zero_points: false,
            dynamic: true,
            asymmetric: false,
            act_scale: None,
            act_zero_point: 0,
        },
        Op::QuantLinear {
            bits: 8,
            group: 4,
            zero_points: false,
            dynamic: true,
            asymmetric: true,
            act_scale: None,
            act_zero_point: 0,
        },
        Op::QuantConv {
            stride: vec![1, 1],
            padding: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
            epilogue,
            layout: Layout::ChannelsLast,
            dynamic: false,
            asymmetric: false,
            act_scale: Some(0.25),
            act_zero_point: 5,
            out_quant: Some(kiln_ir::QParams { scale: 0.125, zero_point: -3 }),
            res_quant: Some(kiln_ir::QParams { scale: 0.0625, zero_point: 11 }),
        },
        Op::QuantConv {
            stride: vec![2, 2],
            padding: vec![0, 0],
            dilation: vec![1, 1],
            groups: 4,
            epilogue: Epilogue::default(),
            layout: Layout::ChannelsFirst,
            dynamic: false,
            asymmetric: false,
            act_scale: None,
            act_zero_point: 0,
            out_quant: None,
            res_quant: None,
        },
        Op::ConvFused {
            stride: vec![1, 1],
            padding: vec![0, 0],
            dilation: vec![1, 1],
            groups: 1,
            epilogue,
            layout: Layout::ChannelsFirst,
        },
        Op::ConvFused {
            stride: vec![2, 2],
            padding: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
            epilogue,
            layout: Layout::ChannelsLast,
        },
        Op::LinearFused { epilogue: Epilogue { bias: false, activation: None, residual: Residual::None } },
        Op::LinearFused {
            epilogue: Epilogue { bias: false, activation: Some(Activation::MulSigmoid), residual: Residual::None },
        },
        Op::LinearFused {
            epilogue: Epilogue { bias: true, activation: Some(Activation::Hardswish), residual: Residual::None },
        },
        Op::LinearFused {
            epilogue: Epilogue {
                bias: true,
                activation: Some(Activation::GeluTanhChain),
                residual: Residual::AfterActivation,
            },
        },
        Op::LinearSplit {
            epilogue: Epilogue { bias: true, activation: Some(Activation::Relu), residual: Residual::None },
            columns: vec![32, 8],
        },
        Op::Upsample { mode: ResizeMode::Nearest, align_corners: false, size: shape.clone(), scales: vec![2.0, 0.0] },
        Op::Upsample { mode: ResizeMode::Linear, align_corners: true, size: shape.clone(), scales: vec![] },
        Op::Random {
            dist: RandomDist::Uniform { low: -1.0, high: 1.0 },
            dtype: DType::F32,
            shape: shape.clone(),
            stream: 0,
        },
        Op::Random {
            dist: RandomDist::Normal { mean: 0.0, std: 2.0 },
            dtype: DType::F64,
            shape: shape.clone(),
            stream: 1,
        },
        Op::Random {
            dist: RandomDist::Int { low: 0, high: i64::MAX },
            dtype: DType::I64,
            shape: shape.clone(),
            stream: 2,
        },
        Op::Random { dist: RandomDist::Perm, dtype: DType::I64, shape, stream: 3 },
        Op::NonZero { count: n },
        Op::While { carried: 1, cond: Region::new(body.clone()), body: Region::new(body) },
    ];
    for op in ops {
        g.push(op, vec![x], ty.clone(), None);
    }
    // No results: a check and a symbol binding.
    g.add_node(Op::Assert { message: "x \"must\" hold".into() }, vec![x], vec![], None);
    g.add_node(Op::BindDim { symbol: n }, vec![x], vec![], None);
    g.add_output("x", x);
    g
}
