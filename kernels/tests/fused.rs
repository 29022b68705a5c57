//! The fused elementwise kernel against the unfused kernels, op by op: on
//! random inputs, broadcast operands and sizes around the tile length, in
//! every dtype family the programs touch and with every kernel table this
//! CPU has, the fused result must be bit-identical.

use kiln_kernels::{
    binary_cx, cast, clamp, fused, fused_in_place, register_types, unary_cx, where_, BinaryOp, Context, DType, FusedOp,
    Isa, KernelTable, TensorMut, TensorRef, UnaryOp,
};
use rand::{Rng, SeedableRng};

/// An owned tensor of raw bytes.
#[derive(Clone, Debug, PartialEq)]
struct T {
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl T {
    fn zeros(dtype: DType, shape: &[usize]) -> T {
        let n: usize = shape.iter().product();
        T { dtype, shape: shape.to_vec(), data: vec![0; n * dtype.size_bytes()] }
    }
    fn view(&self) -> TensorRef<'_> {
        TensorRef { dtype: self.dtype, shape: &self.shape, data: &self.data }
    }
    fn view_mut(&mut self) -> TensorMut<'_> {
        TensorMut { dtype: self.dtype, shape: &self.shape, data: &mut self.data }
    }
}

fn random(rng: &mut impl Rng, dtype: DType, shape: &[usize]) -> T {
    let mut t = T::zeros(dtype, shape);
    let size = dtype.size_bytes();
    for e in t.data.chunks_exact_mut(size) {
        match dtype {
            DType::F32 => e.copy_from_slice(&rng.gen_range(-4.0f32..4.0).to_le_bytes()),
            DType::F16 => e.copy_from_slice(&half::f16::from_f32(rng.gen_range(-4.0f32..4.0)).to_le_bytes()),
            DType::I64 => e.copy_from_slice(&rng.gen_range(-50i64..50).to_le_bytes()),
            DType::Bool => e[0] = rng.gen_range(0..2),
            other => panic!("no random {other}"),
        }
    }
    t
}

fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= r { s[i + s.len() - r] } else { 1 };
    (0..r).map(|i| at(a, i).max(at(b, i))).collect()
}

/// Runs the program op by op with the unfused kernels (each result at its
/// broadcast shape), as the unfused plan would.
fn unfused(program: &[FusedOp], inputs: &[T], cx: &mut Context) -> T {
    let mut regs: Vec<T> = inputs.to_vec();
    for op in program {
        let r = |i: u32| &regs[i as usize];
        let out = match *op {
            FusedOp::Scalar { dtype, bits } => {
                T { dtype, shape: vec![], data: bits.to_le_bytes()[..dtype.size_bytes()].to_vec() }
            }
            FusedOp::Unary { op, x } => {
                let mut o = T::zeros(r(x).dtype, &r(x).shape);
                unary_cx(op, r(x).view(), o.view_mut(), cx).unwrap();
                o
            }
            FusedOp::Binary { op, a, b } => {
                let dtype = if op.is_comparison() { DType::Bool } else { r(a).dtype };
                let mut o = T::zeros(dtype, &broadcast(&r(a).shape, &r(b).shape));
                binary_cx(op, r(a).view(), r(b).view(), o.view_mut(), cx).unwrap();
                o
            }
            FusedOp::Where { cond, a, b } => {
                let shape = broadcast(&broadcast(&r(cond).shape, &r(a).shape), &r(b).shape);
                let mut o = T::zeros(r(a).dtype, &shape);
                where_(r(cond).view(), r(a).view(), r(b).view(), o.view_mut()).unwrap();
                o
            }
            FusedOp::Cast { to, x } => {
                let mut o = T::zeros(to, &r(x).shape);
                cast(r(x).view(), o.view_mut()).unwrap();
                o
            }
            FusedOp::Clamp { min, max, x } => {
                let mut o = T::zeros(r(x).dtype, &r(x).shape);
                clamp(r(x).view(), min, max, o.view_mut()).unwrap();
                o
            }
        };
        regs.push(out);
    }
    regs.pop().unwrap()
}

fn run_fused(program: &[FusedOp], inputs: &[T], out_shape: &[usize], cx: &mut Context) -> T {
    let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
    let result = *register_types(program, &dtypes).unwrap().last().unwrap();
    let mut out = T::zeros(result, out_shape);
    let views: Vec<_> = inputs.iter().map(T::view).collect();
    fused(program, &views, out.view_mut(), cx).unwrap();
    out
}

fn f32s(v: f32) -> FusedOp {
    FusedOp::Scalar { dtype: DType::F32, bits: v.to_bits() as u64 }
}

/// A named program and its operands' dtypes and shapes (the first shape is the output's).
type Case = (&'static str, Vec<FusedOp>, Vec<(DType, Vec<usize>)>);

fn cases() -> Vec<Case> {
    use BinaryOp::*;
    use FusedOp::{Binary as B, Unary as U};
    let chain = vec![
        f32s(0.5),
        B { op: Mul, a: 0, b: 2 },
        B { op: Add, a: 3, b: 1 },
        U { op: UnaryOp::Tanh, x: 4 },
        U { op: UnaryOp::Sigmoid, x: 5 },
        B { op: Div, a: 6, b: 1 },
        FusedOp::Clamp { min: Some(-0.25), max: Some(3.0), x: 7 },
    ];
    let tree = vec![
        U { op: UnaryOp::Exp, x: 0 },
        U { op: UnaryOp::Silu, x: 1 },
        B { op: Sub, a: 2, b: 3 },
        B { op: Gt, a: 0, b: 1 },
        U { op: UnaryOp::Gelu, x: 1 },
        FusedOp::Where { cond: 5, a: 4, b: 6 },
        U { op: UnaryOp::Erf, x: 7 },
    ];
    let half = vec![
        FusedOp::Cast { to: DType::F32, x: 0 },
        U { op: UnaryOp::GeluTanh, x: 2 },
        FusedOp::Cast { to: DType::F16, x: 3 },
        B { op: Mul, a: 4, b: 1 },
        U { op: UnaryOp::Exp, x: 5 },
    ];
    let int = vec![
        FusedOp::Scalar { dtype: DType::I64, bits: 3 },
        B { op: Mul, a: 0, b: 2 },
        B { op: Sub, a: 3, b: 1 },
        U { op: UnaryOp::Abs, x: 4 },
        FusedOp::Cast { to: DType::F32, x: 5 },
        U { op: UnaryOp::Sqrt, x: 6 },
    ];
    let logic = vec![
        U { op: UnaryOp::Not, x: 0 },
        B { op: And, a: 3, b: 1 },
        FusedOp::Where { cond: 4, a: 2, b: 2 },
        U { op: UnaryOp::Neg, x: 5 },
    ];
    // Scalars defined after an intermediate has died: `(a - b) * 1.5 + 0.5`,
    // silu. A scalar must not share a slot with a per-tile register (it once
    // took the dead `a - b` slot and was overwritten by the next tile's).
    let late_scalars = vec![
        B { op: Sub, a: 0, b: 1 },
        f32s(1.5),
        B { op: Mul, a: 2, b: 3 },
        f32s(0.5),
        B { op: Add, a: 4, b: 5 },
        U { op: UnaryOp::Silu, x: 6 },
    ];
    let f32_ = DType::F32;
    let out = |s: &[usize]| s.to_vec();
    let mut v = Vec::new();
    // [3, 40, 333]: over the size the kernel splits across threads, not a
    // whole number of tiles.
    for shape in [vec![1], vec![7], vec![513], vec![3, 700], vec![2, 3, 5, 67], vec![3, 40, 333]] {
        let last = *shape.last().unwrap();
        v.push(("chain", chain.clone(), vec![(f32_, out(&shape)), (f32_, out(&shape))]));
        v.push(("late scalars", late_scalars.clone(), vec![(f32_, out(&shape)), (f32_, out(&shape))]));
        // A row broadcast over the leading dims and a column over the last.
        let mut col = shape.clone();
        *col.last_mut().unwrap() = 1;
        v.push(("chain/broadcast", chain.clone(), vec![(f32_, out(&shape)), (f32_, vec![last])]));
        v.push(("tree/broadcast", tree.clone(), vec![(f32_, out(&shape)), (f32_, col.clone())]));
        v.push(("half", half.clone(), vec![(DType::F16, out(&shape)), (DType::F16, col.clone())]));
        v.push(("int", int.clone(), vec![(DType::I64, out(&shape)), (DType::I64, vec![last])]));
        v.push(("logic", logic.clone(), vec![(DType::Bool, out(&shape)), (DType::Bool, col.clone()), (f32_, vec![1])]));
    }
    v
}

#[test]
fn fused_is_bit_identical_to_the_unfused_kernels() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for isa in Isa::ALL {
        let Some(table) = KernelTable::for_isa(isa) else {
            println!("note: skipping {isa}: not supported by this CPU or build");
            continue;
        };
        let mut cx = Context::with_table(table);
        for (name, program, operands) in cases() {
            let inputs: Vec<T> = operands.iter().map(|(d, s)| random(&mut rng, *d, s)).collect();
            let want = unfused(&program, &inputs, &mut cx);
            let got = run_fused(&program, &inputs, &want.shape, &mut cx);
            assert_eq!(got.shape, want.shape, "{name} on {isa}");
            assert!(got.data == want.data, "{name} {:?} on {isa}: fused differs from unfused", want.shape);
        }
    }
}

/// Split over 2–4 threads (runs of whole tiles per thread, broadcast
/// operands gathered from each run's start), every program gives the bytes
/// of the unfused kernels, as on one thread.
#[test]
fn fused_is_bit_identical_at_every_thread_count() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    for isa in Isa::ALL {
        let Some(table) = KernelTable::for_isa(isa) else { continue };
        let mut one = Context::with_table(table);
        for (name, program, operands) in cases().into_iter().filter(|(_, _, ops)| ops[0].1 == [3, 40, 333]) {
            let inputs: Vec<T> = operands.iter().map(|(d, s)| random(&mut rng, *d, s)).collect();
            let want = unfused(&program, &inputs, &mut one);
            for threads in [2, 3, 4] {
                let mut cx = Context::with_table(table).with_threads(threads);
                let got = run_fused(&program, &inputs, &want.shape, &mut cx);
                assert!(got.data == want.data, "{name} on {isa} at {threads} threads: differs from unfused");
                // Again on the same context (reused worker registers).
                assert!(run_fused(&program, &inputs, &want.shape, &mut cx).data == want.data, "{name}: rerun");
            }
        }
    }
}

#[test]
fn bad_programs_and_operands_are_errors() {
    let mut cx = Context::new();
    let x = T::zeros(DType::F32, &[4]);
    let mut out = T::zeros(DType::F32, &[4]);
    let bad_reg = [FusedOp::Unary { op: UnaryOp::Exp, x: 5 }];
    assert!(fused(&bad_reg, &[x.view()], out.view_mut(), &mut cx).is_err());
    let ok = [FusedOp::Unary { op: UnaryOp::Exp, x: 0 }];
    let mut wrong_dtype = T::zeros(DType::F64, &[4]);
    assert!(fused(&ok, &[x.view()], wrong_dtype.view_mut(), &mut cx).is_err());
    let mut wrong_shape = T::zeros(DType::F32, &[5]);
    assert!(fused(&ok, &[x.view()], wrong_shape.view_mut(), &mut cx).is_err());
    let short = TensorRef { dtype: DType::F32, shape: &[4], data: &x.data[..8] };
    assert!(fused(&ok, &[short], out.view_mut(), &mut cx).is_err());
    // Integer division by zero is refused as the unfused kernel refuses it.
    let i = T::zeros(DType::I64, &[4]);
    let mut io = T::zeros(DType::I64, &[4]);
    let div = [FusedOp::Binary { op: BinaryOp::FloorDiv, a: 0, b: 0 }, FusedOp::Unary { op: UnaryOp::Neg, x: 1 }];
    assert!(fused(&div, &[i.view()], io.view_mut(), &mut cx).is_err());
    // A lone scalar program fills the output.
    let fill = [FusedOp::Scalar { dtype: DType::F32, bits: 2.5f32.to_bits() as u64 }];
    fused(&fill, &[x.view()], out.view_mut(), &mut cx).unwrap();
    assert!(out.data.chunks(4).all(|c| c == 2.5f32.to_le_bytes()));
}

/// In place (a state updated where it lies): every operand shaped and typed
/// like the result, read from the output itself, gives the out-of-place
/// result bit for bit — across tiles, with the other operands broadcast,
/// with every kernel table. One broadcast onto the output is refused.
#[test]
fn fused_in_place_is_bit_identical_to_fused() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut singles: Vec<Case> = Vec::new();
    for shape in [vec![5], vec![513], vec![3, 700]] {
        let last = *shape.last().unwrap();
        let one = FusedOp::Binary { op: BinaryOp::Add, a: 0, b: 1 };
        singles.push(("add/broadcast", vec![one], vec![(DType::F32, shape.clone()), (DType::F32, vec![last])]));
        let sub = FusedOp::Binary { op: BinaryOp::Sub, a: 1, b: 0 };
        singles.push(("sub/swapped", vec![sub], vec![(DType::F32, shape.clone()), (DType::F32, vec![1])]));
        singles.push(("exp", vec![FusedOp::Unary { op: UnaryOp::Exp, x: 0 }], vec![(DType::F32, shape.clone())]));
    }
    let mut checked = 0;
    for isa in Isa::ALL {
        let Some(table) = KernelTable::for_isa(isa) else { continue };
        let mut cx = Context::with_table(table);
        for (name, program, operands) in cases().into_iter().chain(singles.clone()) {
            let inputs: Vec<T> = operands.iter().map(|(d, s)| random(&mut rng, *d, s)).collect();
            let out_shape = broadcast_all(&inputs);
            let want = run_fused(&program, &inputs, &out_shape, &mut cx);
            for (at, t) in inputs.iter().enumerate() {
                let mut views: Vec<TensorRef<'_>> = inputs.iter().map(T::view).collect();
                views[at] = TensorRef { dtype: t.dtype, shape: &t.shape, data: &[] };
                let mut out = t.clone();
                let result = fused_in_place(&program, &views, at, out.view_mut(), &mut cx);
                if t.shape == want.shape && t.dtype == want.dtype {
                    result.unwrap_or_else(|e| panic!("{name} operand {at} on {isa}: {e}"));
                    assert!(out.data == want.data, "{name} {:?} operand {at} on {isa}: in place differs", want.shape);
                    checked += 1;
                } else {
                    assert!(result.is_err(), "{name} operand {at} on {isa}: {:?} onto {:?}", t.shape, want.shape);
                }
            }
        }
    }
    assert!(checked > 30, "{checked} in-place cases");
    // Large enough for the tile runs to split over threads: each run copies
    // its own tiles of the in-place operand; same bytes at 1, 2 and 3 threads.
    let program = vec![FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 1 }, FusedOp::Unary { op: UnaryOp::Exp, x: 2 }];
    let inputs = [random(&mut rng, DType::F32, &[3, 20_001]), random(&mut rng, DType::F32, &[20_001])];
    let want = run_fused(&program, &inputs, &inputs[0].shape, &mut Context::new());
    for threads in [1, 2, 3] {
        let mut cx = Context::new().with_threads(threads);
        let mut views: Vec<TensorRef<'_>> = inputs.iter().map(T::view).collect();
        views[0] = TensorRef { dtype: DType::F32, shape: &inputs[0].shape, data: &[] };
        let mut out = inputs[0].clone();
        fused_in_place(&program, &views, 0, out.view_mut(), &mut cx).unwrap_or_else(|e| panic!("{threads}: {e}"));
        assert!(out.data == want.data, "in place over {threads} threads differs");
    }
}

fn broadcast_all(inputs: &[T]) -> Vec<usize> {
    inputs.iter().fold(Vec::new(), |acc, t| broadcast(&acc, &t.shape))
}
