//! Every StableHLO lowering: a small graph per op (built with the IR API),
//! compiled with the PJRT target, run on the XLA CPU plugin through the
//! runtime's PJRT delegate, compared with the same graph on kiln's CPU
//! kernels. Also a mixed plan (an op deliberately left on the CPU between two
//! accelerator segments) and the bf16 path. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::stablehlo::Precision;
use kiln_compiler::Backend;
use kiln_ir::infer::infer_types;
use kiln_ir::{
    BinaryOp as B, ConstBytes, DType, Dim, Graph, Op, PoolKind, ReduceKind, TensorType, UnaryOp as U, ValueId,
};
use kiln_runtime::format::InstrOp;
use kiln_runtime::Tensor;
use stablehlo_support::*;

/// A graph under construction with its inputs' test data.
struct Case {
    g: Graph,
    data: Vec<Tensor>,
}

impl Case {
    fn new() -> Case {
        Case { g: Graph::new(), data: Vec::new() }
    }

    fn input(&mut self, shape: &[usize], lo: f32, hi: f32) -> ValueId {
        let seed = self.data.len() as u64 + 7;
        self.data.push(random_f32(shape, seed, lo, hi));
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        self.g.add_input(format!("x{}", self.data.len()), TensorType::fixed(DType::F32, &dims))
    }

    fn input_i64(&mut self, shape: &[usize], values: &[i64]) -> ValueId {
        self.data.push(Tensor::from_i64(shape, values));
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        self.g.add_input(format!("i{}", self.data.len()), TensorType::fixed(DType::I64, &dims))
    }

    /// A constant large enough to be passed as a weight argument.
    fn weight(&mut self, shape: &[usize], seed: u64) -> ValueId {
        let t = random_f32(shape, seed, -1.0, 1.0);
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        self.g.add_const(Some(format!("w{seed}")), TensorType::fixed(DType::F32, &dims), ConstBytes::owned(t.data))
    }

    fn op(&mut self, op: Op, inputs: &[ValueId]) -> ValueId {
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| self.g.ty(v)).collect();
        let ty = infer_types(&self.g.symbols, &op, &tys).unwrap_or_else(|e| panic!("{op:?}: {e}")).remove(0);
        self.g.push(op, inputs.to_vec(), ty, None)
    }

    fn output(mut self, v: ValueId) -> Case {
        let n = self.g.outputs.len();
        self.g.add_output(format!("out{n}"), v);
        self
    }
}

/// Compiles for both targets and compares; returns the PJRT program's accel
/// section for further checks.
fn check_case(what: &str, case: Case, precision: Precision) -> Option<kiln_runtime::format::AccelProgram> {
    let plugin = plugin()?;
    let cpu = compile(case.g.clone(), Backend::Cpu);
    let acc = compile(case.g, pjrt(precision));
    let accel = accel(&acc);
    let want = run_cpu(&cpu, &case.data);
    let got = run_pjrt(&acc, &plugin, &case.data);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        match precision {
            Precision::F32 => assert_close(&format!("{what} output {i}"), g, w, 1e-4, 1e-5),
            Precision::Bf16 => assert_close_norm(&format!("{what} output {i}"), g, w, 2e-2),
        }
    }
    Some(accel)
}

/// Checks that the op ran on the accelerator (one segment, no CPU fallback).
fn check_op(what: &str, case: Case) {
    if let Some(accel) = check_case(what, case, Precision::F32) {
        assert!(accel.cpu_fallbacks.is_empty(), "{what}: left on the CPU: {:?}", accel.cpu_fallbacks);
        assert_eq!(accel.segments.len(), 1, "{what}: segments");
    }
}

fn unary_case(u: U) -> Case {
    let mut c = Case::new();
    let x = match u {
        U::Log | U::Sqrt | U::Rsqrt | U::Reciprocal | U::Log2 | U::Log10 => c.input(&[3, 17], 0.1, 3.0),
        U::Acosh => c.input(&[3, 17], 1.0, 4.0),
        U::Asin | U::Acos | U::Atanh => c.input(&[3, 17], -0.95, 0.95),
        U::Tan => c.input(&[3, 17], -1.4, 1.4),
        _ => c.input(&[3, 17], -3.0, 3.0),
    };
    let y = c.op(Op::Unary(u), &[x]);
    c.output(y)
}

#[test]
fn unary_ops() {
    for u in [
        U::Neg,
        U::Abs,
        U::Exp,
        U::Log,
        U::Sqrt,
        U::Rsqrt,
        U::Reciprocal,
        U::Relu,
        U::Sigmoid,
        U::Tanh,
        U::Gelu,
        U::GeluTanh,
        U::Silu,
        U::Erf,
        U::Sin,
        U::Cos,
        U::Floor,
        U::Ceil,
        U::Round,
        U::Sign,
        U::Log1p,
        U::Expm1,
        U::Trunc,
        U::Tan,
        U::Asin,
        U::Acos,
        U::Atan,
        U::Sinh,
        U::Cosh,
        U::Asinh,
        U::Acosh,
        U::Atanh,
        U::Log2,
        U::Log10,
    ] {
        check_op(u.name(), unary_case(u));
    }
}

/// erf and the hyperbolic functions on the device keep f32's relative
/// precision where their textbook forms lose it: tiny arguments (erf, sinh,
/// asinh, atanh of 1e-30 must not round to 0), arguments next to ±1 (atanh,
/// asin, acos, acosh), and huge ones (asinh(−1e30), cosh(89): x² and e^x
/// overflow f32). Compared with the CPU kernels element by element at a
/// relative tolerance only.
#[test]
fn elementwise_functions_keep_relative_precision_at_the_edges() {
    let below_one: Vec<f32> = (1..40u32).map(|k| f32::from_bits(1f32.to_bits() - k * 97)).collect();
    let above_one: Vec<f32> = (1..40u32).map(|k| f32::from_bits(1f32.to_bits() + k * 97)).collect();
    let wide: Vec<f32> =
        [1e-30f32, -1e-30, 1e-8, -3e-6, 1e-3, 0.5, 0.93, 1.5, -2.5, 5.0, -9.0, 88.5, -89.0, 1e6, -1e30]
            .into_iter()
            .collect();
    for (ops, xs) in [
        (&[U::Erf, U::Sinh, U::Cosh, U::Asinh, U::Atan, U::Tanh][..], &wide),
        (&[U::Atanh, U::Asin, U::Acos, U::Asinh, U::Erf][..], &below_one),
        (&[U::Acosh, U::Asinh, U::Sinh, U::Cosh][..], &above_one),
    ] {
        for &u in ops {
            let mut c = Case::new();
            let x = c.input(&[xs.len()], 0.0, 1.0);
            c.data[0] = Tensor::from_f32(&[xs.len()], xs);
            let y = c.op(Op::Unary(u), &[x]);
            let Some(plugin) = plugin() else { return };
            let case = c.output(y);
            let cpu = compile(case.g.clone(), Backend::Cpu);
            let acc = compile(case.g, pjrt(Precision::F32));
            let (want, got) = (run_cpu(&cpu, &case.data), run_pjrt(&acc, &plugin, &case.data));
            assert_close(&format!("{} at the edges", u.name()), &got[0], &want[0], 2e-6, 0.0);
        }
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    for b in [B::Add, B::Sub, B::Mul, B::Div, B::Pow, B::Max, B::Min, B::FloorDiv, B::Rem, B::Atan2, B::Fmod] {
        let mut c = Case::new();
        let x = c.input(&[2, 3, 5], 0.5, 3.0);
        let y = c.input(&[3, 1], -2.0, 2.0);
        let y = if b == B::Pow { c.op(Op::Unary(U::Abs), &[y]) } else { y };
        let z = c.op(Op::Binary(b), &[x, y]);
        check_op(b.name(), c.output(z));
    }
}

#[test]
fn comparisons_logic_where_and_cast() {
    for b in [B::Eq, B::Ne, B::Lt, B::Le, B::Gt, B::Ge] {
        let mut c = Case::new();
        let x = c.input(&[4, 6], -1.0, 1.0);
        let y = c.input(&[6], -1.0, 1.0);
        let r = c.op(Op::Binary(b), &[x, y]);
        let same = c.op(Op::Binary(b), &[x, x]);
        let both = c.op(Op::Binary(B::And), &[r, same]);
        let either = c.op(Op::Binary(B::Or), &[r, same]);
        let one = c.op(Op::Binary(B::Xor), &[both, either]);
        let not = c.op(Op::Unary(U::Not), &[one]);
        let picked = c.op(Op::Where, &[not, x, y]);
        let as_int = c.op(Op::Cast { to: DType::I64 }, &[r]);
        let c2 = c.output(picked).output(as_int);
        check_op(b.name(), c2);
    }
    let mut c = Case::new();
    let x = c.input(&[3, 8], -4.0, 4.0);
    let i = c.op(Op::Cast { to: DType::I64 }, &[x]);
    let back = c.op(Op::Cast { to: DType::F32 }, &[i]);
    let clamped = c.op(Op::Clamp { min: Some(-1.5), max: Some(2.0) }, &[back]);
    let low = c.op(Op::Clamp { min: None, max: Some(0.5) }, &[x]);
    check_op("cast/clamp", c.output(clamped).output(low));
}

#[test]
fn matmul_and_linear() {
    for (a, b) in [
        (&[4, 6][..], &[6, 5][..]),
        (&[2, 4, 6], &[6, 5]),
        (&[2, 4, 6], &[2, 6, 5]),
        (&[3, 1, 4, 6], &[2, 6, 5]),
        (&[6], &[6, 5]),
        (&[2, 4, 6], &[6]),
    ] {
        let mut c = Case::new();
        let x = c.input(a, -1.0, 1.0);
        let y = c.input(b, -1.0, 1.0);
        let z = c.op(Op::MatMul, &[x, y]);
        check_op(&format!("matmul {a:?} x {b:?}"), c.output(z));
    }
    let mut c = Case::new();
    let x = c.input(&[2, 3, 16], -1.0, 1.0);
    let w = c.weight(&[24, 16], 1);
    let b = c.weight(&[24], 2);
    let y = c.op(Op::Linear, &[x, w, b]);
    let y2 = c.op(Op::Linear, &[x, w]);
    check_op("linear", c.output(y).output(y2));
}

#[test]
fn convolution() {
    let mut c = Case::new();
    let x = c.input(&[2, 4, 9, 9], -1.0, 1.0);
    let w = c.weight(&[6, 2, 3, 3], 3);
    let b = c.weight(&[6], 4);
    let y = c.op(Op::Conv { stride: vec![2, 1], padding: vec![1, 2], dilation: vec![1, 2], groups: 2 }, &[x, w, b]);
    check_op("conv2d", c.output(y));
    let mut c = Case::new();
    let x = c.input(&[1, 3, 20], -1.0, 1.0);
    let w = c.weight(&[5, 3, 4], 5);
    let y = c.op(Op::Conv { stride: vec![3], padding: vec![0], dilation: vec![1], groups: 1 }, &[x, w]);
    check_op("conv1d", c.output(y));
}

#[test]
fn norms_and_softmax() {
    let mut c = Case::new();
    let x = c.input(&[2, 5, 16], -2.0, 2.0);
    let w = c.weight(&[16], 6);
    let b = c.weight(&[16], 7);
    let ln = c.op(Op::LayerNorm { normalized_rank: 1, eps: 1e-5 }, &[x, w, b]);
    let ln2 = c.op(Op::LayerNorm { normalized_rank: 2, eps: 1e-5 }, &[x]);
    let sm = c.op(Op::Softmax { axis: 1 }, &[x]);
    check_op("layer_norm/softmax", c.output(ln).output(ln2).output(sm));
    // BatchNorm and LogSoftmax are decomposed by the pipeline for every
    // target; their direct lowerings are checked without it below.
    let mut c = Case::new();
    let x = c.input(&[2, 5, 16], -2.0, 2.0);
    let y = c.op(Op::LogSoftmax { axis: 2 }, &[x]);
    check_op("log_softmax", c.output(y));
    let mut c = Case::new();
    let x = c.input(&[2, 3, 4, 4], -2.0, 2.0);
    let (m, v, w, b) =
        (c.input(&[3], -0.5, 0.5), c.input(&[3], 0.5, 2.0), c.input(&[3], 0.5, 1.5), c.input(&[3], -1.0, 1.0));
    let y = c.op(Op::BatchNorm { eps: 1e-5 }, &[x, m, v, w, b]);
    check_op("batch_norm", c.output(y));
}

#[test]
fn reductions_and_argmax() {
    for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod] {
        for (axes, keep_dims) in [(vec![1], false), (vec![0, 2], true)] {
            let mut c = Case::new();
            let x = c.input(&[3, 4, 5], 0.5, 1.5);
            let y = c.op(Op::Reduce { kind, axes: axes.clone(), keep_dims }, &[x]);
            check_op(&format!("reduce {kind:?} {axes:?} keep {keep_dims}"), c.output(y));
        }
    }
    let mut c = Case::new();
    let x = c.input_i64(&[2, 3], &[5, -2, 7, 1, 1, -9]);
    let y = c.op(Op::Reduce { kind: ReduceKind::Max, axes: vec![1], keep_dims: false }, &[x]);
    let s = c.op(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: false }, &[x]);
    check_op("reduce i64", c.output(y).output(s));
    let mut c = Case::new();
    let x = c.input(&[3, 6], -1.0, 1.0);
    let zero = c.op(Op::Full { value: 0.0, dtype: DType::F32, shape: vec![] }, &[]);
    let pos = c.op(Op::Binary(B::Gt), &[x, zero]);
    let any = c.op(Op::Reduce { kind: ReduceKind::Max, axes: vec![1], keep_dims: false }, &[pos]);
    let all = c.op(Op::Reduce { kind: ReduceKind::Min, axes: vec![0], keep_dims: true }, &[pos]);
    check_op("reduce bool (any/all)", c.output(any).output(all));
    let mut c = Case::new();
    let x = c.input(&[3, 7], -1.0, 1.0);
    let a = c.op(Op::ArgMax { axis: 1, keep_dims: false }, &[x]);
    let k = c.op(Op::ArgMax { axis: 0, keep_dims: true }, &[x]);
    check_op("argmax", c.output(a).output(k));
}

#[test]
fn argmin_cumsum_flip_pad() {
    let mut c = Case::new();
    let x = c.input(&[3, 7, 4], -1.0, 1.0);
    let a = c.op(Op::ArgMin { axis: 1, keep_dims: false }, &[x]);
    let s = c.op(Op::CumSum { axis: 1 }, &[x]);
    let f = c.op(Op::Flip { axes: vec![0, 2] }, &[x]);
    let p = c.op(
        Op::Pad {
            lo: vec![1, 0, -1],
            hi: vec![0, 2, 1],
            interior: vec![0, 1, 0],
            mode: kiln_ir::PadMode::Constant,
            value: 0.5,
        },
        &[x],
    );
    check_op("argmin/cumsum/flip/pad", c.output(a).output(s).output(f).output(p));
}

#[test]
fn pooling() {
    let pool = |kind, ceil_mode, count_include_pad, divisor| Op::Pool {
        kind,
        kernel: vec![3, 3],
        stride: vec![2, 2],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        ceil_mode,
        count_include_pad,
        divisor,
        layout: kiln_ir::Layout::ChannelsFirst,
    };
    for (kind, ceil, include, divisor) in [
        (PoolKind::Max, false, true, None),
        (PoolKind::Max, true, true, None),
        (PoolKind::Avg, false, true, None),
        (PoolKind::Avg, false, false, None),
        (PoolKind::Avg, true, true, None),
        (PoolKind::Avg, true, false, None),
        // divisor_override with ceil_mode windows past the edge.
        (PoolKind::Avg, true, false, Some(4)),
        (PoolKind::Avg, false, true, Some(-7)),
    ] {
        let mut c = Case::new();
        let x = c.input(&[2, 3, 8, 8], -1.0, 1.0);
        let y = c.op(pool(kind, ceil, include, divisor), &[x]);
        check_op(&format!("pool {kind:?} ceil {ceil} include_pad {include} divisor {divisor:?}"), c.output(y));
    }
    // Max pooling's indices stay on the CPU, with the reason; the values
    // beside them still run on the device.
    let mut c = Case::new();
    let x = c.input(&[2, 3, 8, 8], -1.0, 1.0);
    let v = c.op(pool(PoolKind::Max, true, false, None), &[x]);
    let i = c.op(pool(PoolKind::ArgMax, true, false, None), &[x]);
    let Some(accel) = check_case("pool indices", c.output(v).output(i), Precision::F32) else { return };
    assert_eq!(accel.cpu_fallbacks.len(), 1, "{:?}", accel.cpu_fallbacks);
    assert!(accel.cpu_fallbacks[0].reason.contains("max pooling's indices"), "{:?}", accel.cpu_fallbacks);
}

#[test]
fn attention() {
    for (causal, scale, mask) in [(false, None, 0), (true, None, 0), (false, Some(0.3), 1), (false, None, 2)] {
        let mut c = Case::new();
        let q = c.input(&[2, 3, 5, 8], -1.0, 1.0);
        let k = c.input(&[2, 3, 7, 8], -1.0, 1.0);
        let v = c.input(&[2, 3, 7, 4], -1.0, 1.0);
        let mut ins = vec![q, k, v];
        if mask == 1 {
            let m = c.input(&[5, 7], -1.0, 1.0);
            ins.push(m);
        } else if mask == 2 {
            let m = c.input(&[1, 1, 5, 7], -0.5, 1.0);
            let zero = c.op(Op::Full { value: 0.0, dtype: DType::F32, shape: vec![Dim::Const(1)] }, &[]);
            let b = c.op(Op::Binary(B::Gt), &[m, zero]);
            ins.push(b);
        }
        let y = c.op(Op::Attention { causal, scale }, &ins);
        check_op(&format!("attention causal {causal} scale {scale:?} mask {mask}"), c.output(y));
    }
}

#[test]
fn layout_ops() {
    let mut c = Case::new();
    let x = c.input(&[2, 3, 4], -1.0, 1.0);
    let r = c.op(Op::Reshape { shape: vec![Dim::Const(6), Dim::Const(4)] }, &[x]);
    let e = c.op(Op::Expand { shape: vec![Dim::Const(5), Dim::Const(6), Dim::Const(4)] }, &[r]);
    let p = c.op(Op::Permute { perm: vec![2, 0, 1] }, &[x]);
    let s = c.op(Op::Slice { axis: 2, start: -3, end: i64::MAX, step: 2 }, &[x]);
    let s2 = c.op(Op::Slice { axis: 1, start: 1, end: 3, step: 1 }, &[x]);
    let cat = c.op(Op::Concat { axis: 1 }, &[x, s2, x]);
    check_op("layout", c.output(e).output(p).output(s).output(cat));

    let mut c = Case::new();
    let table = c.weight(&[10, 6], 9);
    let idx = c.input_i64(&[2, 3], &[0, 9, 3, 3, 1, 7]);
    let emb = c.op(Op::Gather { axis: 0 }, &[table, idx]);
    let x = c.input(&[4, 10, 3], -1.0, 1.0);
    let sel = c.input_i64(&[2], &[8, 2]);
    let picked = c.op(Op::Gather { axis: 1 }, &[x, sel]);
    check_op("gather", c.output(emb).output(picked));
}

/// `index_put` (and `index_copy`) as `stablehlo.scatter`: one index tensor
/// along a middle axis (a KV-cache write, negative index included), two
/// index tensors, and accumulation with a repeated position.
#[test]
fn index_put_as_scatter() {
    let mut c = Case::new();
    let cache = c.input(&[1, 2, 8, 4], -1.0, 1.0);
    let kv = c.input(&[1, 2, 2, 4], -1.0, 1.0);
    let pos = c.input_i64(&[2], &[3, -1]);
    let written = c.op(Op::IndexPut { axis: 2, accumulate: false }, &[cache, kv, pos]);
    let x = c.input(&[4, 5, 3], -1.0, 1.0);
    let v = c.input(&[3, 3], -1.0, 1.0);
    let (i0, i1) = (c.input_i64(&[3], &[0, 3, 2]), c.input_i64(&[3], &[4, 0, -2]));
    let two = c.op(Op::IndexPut { axis: 0, accumulate: false }, &[x, v, i0, i1]);
    let y = c.input(&[6, 2], -1.0, 1.0);
    let u = c.input(&[3, 2], -1.0, 1.0);
    let rows = c.input_i64(&[3], &[1, 4, 1]);
    let summed = c.op(Op::IndexPut { axis: 0, accumulate: true }, &[y, u, rows]);
    check_op("index_put", c.output(written).output(two).output(summed));
}

#[test]
fn full_and_arange() {
    let mut c = Case::new();
    let x = c.input(&[3, 5], -1.0, 1.0);
    let f = c.op(Op::Full { value: 2.5, dtype: DType::F32, shape: vec![Dim::Const(3), Dim::Const(5)] }, &[]);
    let a = c.op(Op::Arange { start: 1.0, step: 0.5, len: Dim::Const(5), dtype: DType::F32 }, &[]);
    let y = c.op(Op::Binary(B::Mul), &[x, f]);
    let y = c.op(Op::Binary(B::Add), &[y, a]);
    check_op("full/arange", c.output(y));
}

/// An op without a StableHLO lowering (sort) splits the graph: accelerator
/// segment, CPU instruction, accelerator segment.
#[test]
fn mixed_plan() {
    let mut c = Case::new();
    let x = c.input(&[4, 8], -5.0, 5.0);
    let w = c.weight(&[8, 8], 11);
    let h = c.op(Op::MatMul, &[x, w]);
    let h = c.op(Op::Binary(B::Mul), &[h, x]);
    // A running maximum (cummax) has no StableHLO lowering.
    let scanned = c.op(Op::Scan { axis: 1, kind: kiln_ir::ScanKind::Max }, &[h]);
    let y = c.op(Op::Binary(B::Add), &[scanned, h]);
    let y = c.op(Op::Unary(U::Tanh), &[y]);
    let Some(accel) = check_case("mixed plan", c.output(y), Precision::F32) else { return };
    assert_eq!(accel.segments.len(), 2, "two accelerator segments around the CPU op");
    assert_eq!(accel.cpu_fallbacks.len(), 1, "{:?}", accel.cpu_fallbacks);
    assert!(accel.cpu_fallbacks[0].reason.contains("no StableHLO lowering"), "{:?}", accel.cpu_fallbacks);
}

/// Integer division and remainder with Python's rounding, every sign pair.
#[test]
fn integer_floor_div_and_rem() {
    let mut c = Case::new();
    let a = c.input_i64(&[8], &[7, -7, 7, -7, 0, 6, -6, 5]);
    let b = c.input_i64(&[8], &[3, 3, -3, -3, 2, -4, 4, 5]);
    let q = c.op(Op::Binary(B::FloorDiv), &[a, b]);
    let r = c.op(Op::Binary(B::Rem), &[a, b]);
    let f = c.op(Op::Binary(B::Fmod), &[a, b]);
    check_op("integer floor_div/rem/fmod", c.output(q).output(r).output(f));
}

/// bf16 segments: weights are stored as bf16 copies, boundaries stay f32.
#[test]
fn bf16_precision() {
    let mut c = Case::new();
    let x = c.input(&[4, 32], -1.0, 1.0);
    let w = c.weight(&[64, 32], 12);
    let b = c.weight(&[64], 13);
    let h = c.op(Op::Linear, &[x, w, b]);
    let h = c.op(Op::Unary(U::Gelu), &[h]);
    let y = c.op(Op::Softmax { axis: 1 }, &[h]);
    let c = c.output(y);
    if plugin().is_none() {
        return;
    }
    let program = compile(c.g.clone(), pjrt(Precision::Bf16));
    let acc = accel(&program);
    assert_eq!(acc.segments.len(), 1, "{:?}", acc.cpu_fallbacks);
    let seg = &acc.segments[0];
    assert!(seg.mlir.contains("bf16"), "bf16 compute: {}", seg.mlir);
    let arg_dtypes: Vec<_> = seg.args.iter().map(|&t| program.plan().tensors[t as usize].dtype).collect();
    assert!(arg_dtypes.contains(&kiln_runtime::DType::BF16), "bf16 weight arguments: {arg_dtypes:?}");
    let out = program.plan().outputs[0].tensor as usize;
    assert_eq!(program.plan().tensors[out].dtype, kiln_runtime::DType::F32);
    assert!(program.plan().instrs.iter().all(|i| matches!(i.op, InstrOp::Delegate { .. })));
    check_case("bf16 mlp", c, Precision::Bf16);
}

/// igamma/igammac in every regime (P's series, Q's small-x series, the
/// continued fraction, 1 − the other) and at their special values, against
/// the CPU kernel: both compute in f64 and round once, so f32 results agree
/// to the last bit or so and f64 ones to lgamma's (Lanczos vs libm) accuracy.
#[test]
fn incomplete_gamma_over_every_regime() {
    let a = [0.05, 0.5, 1.0, 2.5, 10.0, 100.0, 2000.0, 0.0, f64::INFINITY, -1.0, f64::NAN];
    let x = [0.0, 0.3, 0.5, 0.9, 1.05, 2.0, 9.5, 11.0, 120.0, 1990.0, 2010.0, f64::INFINITY, -1.0, f64::NAN];
    for (dt, size) in [("f32", 4), ("f64", 8)] {
        let tensor = |v: &[f64], shape: Vec<usize>| Tensor {
            dtype: if size == 4 { kiln_runtime::DType::F32 } else { kiln_runtime::DType::F64 },
            shape,
            data: v
                .iter()
                .flat_map(|&x| if size == 4 { (x as f32).to_le_bytes().to_vec() } else { x.to_le_bytes().to_vec() })
                .collect(),
        };
        let text = format!(
            "graph {{
  input %0 \"a\": {dt}[11, 1]
  input %1 \"x\": {dt}[1, 14]
  %2: {dt}[11, 14] = igamma(%0, %1)
  %3: {dt}[11, 14] = igammac(%0, %1)
  output %2 \"p\"
  output %3 \"q\"
}}"
        );
        let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}"));
        let acc = compile(g.clone(), pjrt(Precision::F32));
        assert!(accel(&acc).cpu_fallbacks.is_empty(), "{dt}: {:?}", accel(&acc).cpu_fallbacks);
        let Some(plugin) = plugin() else { return };
        let inputs = [tensor(&a, vec![11, 1]), tensor(&x, vec![1, 14])];
        let want = run_cpu(&compile(g, Backend::Cpu), &inputs);
        let got = run_pjrt(&acc, &plugin, &inputs);
        let rtol = if size == 4 { 3e-7 } else { 1e-11 };
        // XLA:CPU flushes f32 subnormals (Q(10, 120) ≈ 1.2e-39) to zero.
        let atol = if size == 4 { f32::MIN_POSITIVE as f64 } else { 1e-300 };
        for (k, name) in ["igamma", "igammac"].iter().enumerate() {
            assert_close(&format!("{name} {dt}"), &got[k], &want[k], rtol, atol);
        }
    }
}
