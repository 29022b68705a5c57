mod common;
use common::*;
use half::f16;
use kiln_kernels::*;

fn ref_unary(op: UnaryOp, x: f64) -> f64 {
    use UnaryOp::*;
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.ln(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Reciprocal => 1.0 / x,
        Relu => x.max(0.0),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Tanh => x.tanh(),
        Gelu => 0.5 * x * (1.0 + ref_erf(x / 2f64.sqrt())),
        GeluTanh => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh()),
        Silu => x / (1.0 + (-x).exp()),
        Erf => ref_erf(x),
        // Test inputs stay where 1 - erf keeps the reference's accuracy.
        Erfc => 1.0 - ref_erf(x),
        Sin => x.sin(),
        Cos => x.cos(),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_ties_even(),
        // torch's `(0 < x) - (x < 0)`.
        Sign => ((x > 0.0) as i8 - (x < 0.0) as i8) as f64,
        Log1p => x.ln_1p(),
        Expm1 => x.exp_m1(),
        Trunc => x.trunc(),
        Tan => x.tan(),
        Asin => x.asin(),
        Acos => x.acos(),
        Atan => x.atan(),
        Sinh => x.sinh(),
        Cosh => x.cosh(),
        Asinh => x.asinh(),
        Acosh => x.acosh(),
        Atanh => x.atanh(),
        Log2 => x.log2(),
        Log10 => x.log10(),
        Not | BitNot => unreachable!(),
        // Checked against known values (generic/special.rs) and against
        // torch in the conformance suite; no independent reference here.
        Lgamma | Digamma | I0 | I0e | I1 | I1e | Erfcx | Ndtr | LogNdtr | BesselJ0 | BesselJ1 | BesselY0 | BesselY1
        | Entr | Trigamma | SphericalBesselJ0 => unreachable!(),
    }
}

/// Independent erf: Simpson integration of 2/√π e^{-t²} (slow but obvious).
fn ref_erf(x: f64) -> f64 {
    let n = 2000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * std::f64::consts::FRAC_2_SQRT_PI
}

const FLOAT_UNARY: [UnaryOp; 35] = {
    use UnaryOp::*;
    [
        Neg, Abs, Exp, Log, Sqrt, Rsqrt, Reciprocal, Relu, Sigmoid, Tanh, Gelu, GeluTanh, Silu, Erf, Sin, Cos, Floor,
        Ceil, Round, Sign, Log1p, Expm1, Trunc, Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Log2, Log10,
        Erfc,
    ]
};

/// Maps a random value into `op`'s domain.
fn in_domain(op: UnaryOp, v: f32) -> f32 {
    use UnaryOp::*;
    match op {
        Log | Sqrt | Rsqrt | Log2 | Log10 | Log1p => v.abs() + 0.1,
        Acosh => v.abs() + 1.1,
        Asin | Acos | Atanh => (v * 0.3).clamp(-0.9, 0.9),
        _ => v,
    }
}

#[test]
fn unary_float_matches_reference() {
    let mut r = rng(1);
    for &n in &[1usize, 7, 17, 33, 100] {
        let mut x = rand_f32(&mut r, n);
        x[0] = 2.5; // round-half-even probe
        for op in FLOAT_UNARY {
            let xs: Vec<f32> = x.iter().map(|&v| in_domain(op, v)).collect();
            let xb = f32s(&[n], &xs);
            let mut out = Buf::zeros(DType::F32, &[n]);
            unary(op, xb.r(), out.w()).unwrap();
            let want: Vec<f64> = xs.iter().map(|&v| ref_unary(op, v as f64) as f32 as f64).collect();
            assert_close(&to64(&out.get::<f32>()), &want, 2e-6, 1e-7, &format!("{op:?}"));
            // f64 path
            let x64: Vec<f64> = to64(&xs);
            let xb = Buf::from(DType::F64, &[n], &x64);
            let mut out = Buf::zeros(DType::F64, &[n]);
            unary(op, xb.r(), out.w()).unwrap();
            let want: Vec<f64> = x64.iter().map(|&v| ref_unary(op, v)).collect();
            assert_close(&out.get::<f64>(), &want, 1e-10, 1e-12, &format!("{op:?} f64"));
            // f16 path: computed in f32, rounded once.
            let xh: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
            let xb = Buf::from(DType::F16, &[n], &xh);
            let mut out = Buf::zeros(DType::F16, &[n]);
            unary(op, xb.r(), out.w()).unwrap();
            let want: Vec<f64> = xh.iter().map(|v| f16::from_f64(ref_unary(op, v.to_f64())).to_f64()).collect();
            let got: Vec<f64> = out.get::<f16>().iter().map(|v| v.to_f64()).collect();
            assert_close(&got, &want, 1e-3, 1e-4, &format!("{op:?} f16"));
        }
    }
}

#[test]
fn gelu_tail_is_accurate() {
    let xs = [-8.0f32, -5.0, -3.0];
    let xb = f32s(&[3], &xs);
    let mut out = Buf::zeros(DType::F32, &[3]);
    unary(UnaryOp::Gelu, xb.r(), out.w()).unwrap();
    // 0.5·x·erfc(-x/√2) reference values.
    let want = [-4.9767684594174555e-15, -1.4332578593959731e-06, -0.004049694094890287];
    assert_close(&to64(&out.get::<f32>()), &want, 1e-5, 0.0, "gelu tail");
}

/// sign as torch computes it, `(0 < x) - (x < 0)`: +0 for NaN and for both
/// zeros (IEEE's sign would keep NaN and −0), in every float dtype.
#[test]
fn sign_of_nan_and_zeros_is_positive_zero() {
    let xs = [f32::NAN, -0.0, 0.0, f32::NEG_INFINITY, f32::INFINITY, -3.0, 1e-45];
    let want = [0.0f32, 0.0, 0.0, -1.0, 1.0, -1.0, 1.0];
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
    let mut out = Buf::zeros(DType::F32, &[7]);
    unary(UnaryOp::Sign, f32s(&[7], &xs).r(), out.w()).unwrap();
    assert_eq!(bits(&to64(&out.get::<f32>())), bits(&want64), "f32");
    let x64: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
    let mut out = Buf::zeros(DType::F64, &[7]);
    unary(UnaryOp::Sign, Buf::from(DType::F64, &[7], &x64).r(), out.w()).unwrap();
    assert_eq!(bits(&out.get::<f64>()), bits(&want64), "f64");
    let xh: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
    let mut out = Buf::zeros(DType::F16, &[7]);
    unary(UnaryOp::Sign, Buf::from(DType::F16, &[7], &xh).r(), out.w()).unwrap();
    let got: Vec<f64> = out.get::<f16>().iter().map(|v| v.to_f64()).collect();
    // 1e-45 rounds to +0 in f16.
    let want16 = [&want64[..6], &[0.0]].concat();
    assert_eq!(bits(&got), bits(&want16), "f16");
}

/// The inverse hyperbolic functions where the textbook formulas fail: atanh
/// next to ±1, acosh just above 1, asinh and acosh past `f32::MAX / 2`
/// (where `x + √(x² ± 1)` overflows f32). The reference evaluates in f64,
/// which has the range and precision to spare for f32 arguments.
#[test]
fn inverse_hyperbolics_hold_their_accuracy_at_the_ends() {
    let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
    let near_one: Vec<f32> = (1..200u32).map(|k| f32::from_bits(1f32.to_bits() - k)).collect();
    let above_one: Vec<f32> = (1..200u32).map(|k| f32::from_bits(1f32.to_bits() + k)).collect();
    let huge: Vec<f32> = [2e38f32, 3e38, f32::MAX, 1.8e38].to_vec();
    for (op, xs) in [
        (UnaryOp::Atanh, &near_one),
        (UnaryOp::Acosh, &above_one),
        (UnaryOp::Asinh, &huge),
        (UnaryOp::Acosh, &huge),
        (UnaryOp::Asinh, &above_one),
    ] {
        for sign in [1.0f32, -1.0] {
            // acosh is even only in name: keep its arguments ≥ 1.
            let xs: Vec<f32> = xs.iter().map(|&v| if op == UnaryOp::Acosh { v } else { v * sign }).collect();
            let n = xs.len();
            let mut out = Buf::zeros(DType::F32, &[n]);
            unary(op, f32s(&[n], &xs).r(), out.w()).unwrap();
            for (&x, &got) in xs.iter().zip(&out.get::<f32>()) {
                let want = ref_unary(op, x as f64) as f32;
                assert!(ulps(got, want) <= 1, "{op:?}({x:e}) = {got:e}, want {want:e}");
            }
        }
    }
}

#[test]
fn unary_int_and_bool() {
    let x: Vec<i32> = vec![-3, 0, 5, i32::MIN, 7];
    let xb = Buf::from(DType::I32, &[5], &x);
    for (op, want) in [
        (UnaryOp::Neg, vec![3, 0, -5, i32::MIN, -7]),
        (UnaryOp::Abs, vec![3, 0, 5, i32::MIN, 7]),
        (UnaryOp::Sign, vec![-1, 0, 1, -1, 1]),
        (UnaryOp::Relu, vec![0, 0, 5, 0, 7]),
    ] {
        let mut out = Buf::zeros(DType::I32, &[5]);
        unary(op, xb.r(), out.w()).unwrap();
        assert_eq!(out.get::<i32>(), want, "{op:?}");
    }
    let mut out = Buf::zeros(DType::I32, &[5]);
    assert!(matches!(unary(UnaryOp::Exp, xb.r(), out.w()), Err(KernelError::UnsupportedDType { .. })));
    let b = Buf::from(DType::Bool, &[3], &[0u8, 1, 1]);
    let mut out = Buf::zeros(DType::Bool, &[3]);
    unary(UnaryOp::Not, b.r(), out.w()).unwrap();
    assert_eq!(out.get::<u8>(), vec![1, 0, 0]);
    assert!(unary(UnaryOp::Neg, b.r(), out.w()).is_err());
}

const BCAST_CASES: &[(&[usize], &[usize])] = &[
    (&[7, 17], &[7, 17]),
    (&[7, 17], &[17]),
    (&[7, 1], &[1, 17]),
    (&[3, 1, 5], &[4, 1]),
    (&[1], &[33]),
    (&[], &[100]),
    (&[2, 3, 4, 5], &[3, 1, 1]),
    (&[2, 3, 4, 5], &[2, 1, 4, 1]),
    (&[1, 7], &[7, 1]),
];

fn ref_float_binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    use BinaryOp::*;
    match op {
        Add => a + b,
        Sub => a - b,
        Mul => a * b,
        Div => a / b,
        FloorDiv => (a / b).floor(),
        Rem => a - b * (a / b).floor(),
        Pow => a.powf(b),
        Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        Eq => (a == b) as u8 as f64,
        Ne => (a != b) as u8 as f64,
        Lt => (a < b) as u8 as f64,
        Le => (a <= b) as u8 as f64,
        Gt => (a > b) as u8 as f64,
        Ge => (a >= b) as u8 as f64,
        _ => unreachable!(),
    }
}

fn run_binary_case<F: FnMut(&[usize], &[usize], &[usize])>(mut f: F) {
    for (a, b) in BCAST_CASES {
        let o = bcast_shape(a, b);
        f(a, b, &o);
        f(b, a, &o);
    }
}

#[test]
fn binary_float_broadcasting_matches_reference() {
    use BinaryOp::*;
    let mut r = rng(2);
    run_binary_case(|ash, bsh, osh| {
        let av = rand_f32(&mut r, numel(ash));
        let mut bv = rand_f32(&mut r, numel(bsh));
        bv.iter_mut().for_each(|v| {
            if v.abs() < 0.1 {
                *v = 0.5
            }
        });
        for op in [Add, Sub, Mul, Div, FloorDiv, Rem, Max, Min, Eq, Ne, Lt, Le, Gt, Ge, Pow] {
            let (av, bv): (Vec<f32>, Vec<f32>) =
                if op == Pow { (av.iter().map(|v| v.abs()).collect(), bv.clone()) } else { (av.clone(), bv.clone()) };
            let cmp = matches!(op, Eq | Ne | Lt | Le | Gt | Ge);
            let (a, b) = (f32s(ash, &av), f32s(bsh, &bv));
            let mut out = Buf::zeros(if cmp { DType::Bool } else { DType::F32 }, osh);
            binary(op, a.r(), b.r(), out.w()).unwrap();
            let want: Vec<f64> = (0..numel(osh))
                .map(|i| {
                    let idx = unravel(i, osh);
                    let w = ref_float_binary(op, av[bcast_index(&idx, ash)] as f64, bv[bcast_index(&idx, bsh)] as f64);
                    if cmp {
                        w
                    } else {
                        w as f32 as f64
                    }
                })
                .collect();
            let got: Vec<f64> =
                if cmp { out.get::<u8>().iter().map(|&v| v as f64).collect() } else { to64(&out.get::<f32>()) };
            let rtol = if matches!(op, FloorDiv | Rem) { 1e-5 } else { 1e-6 };
            assert_close(&got, &want, rtol, 1e-6, &format!("{op:?} {ash:?} {bsh:?}"));
        }
    });
}

/// f32 add/sub/mul/div where one operand is a short block repeated along the
/// other's leading dims (a squeeze-excite scale, `x · s` with s `[1, 1, 1,
/// C]`; the block on either side; blocks around the kernel's 256-element
/// limit and stretches with a tail) are the one f32 operation per element,
/// bit for bit, on every kernel table at 1-4 threads.
#[test]
fn binary_repeated_blocks_are_elementwise_at_any_thread_count() {
    use BinaryOp::*;
    let mut r = rng(21);
    let cases: &[(&[usize], &[usize])] = &[
        (&[1, 112, 112, 32], &[1, 1, 1, 32]),
        (&[1, 41, 3, 32], &[32]),
        (&[2, 5, 7, 3], &[1, 1, 1, 3]),
        (&[1, 6, 5, 256], &[1, 1, 1, 256]),
        (&[1, 6, 5, 257], &[1, 1, 1, 257]),
        (&[9, 4, 5], &[1, 4, 5]),
        (&[3, 1, 7], &[1, 7]),
    ];
    for &(xs, ss) in cases {
        let xv = rand_f32(&mut r, numel(xs));
        let sv: Vec<f32> = rand_f32(&mut r, numel(ss)).iter().map(|v| v + 3.0).collect();
        let (x, s) = (f32s(xs, &xv), f32s(ss, &sv));
        for op in [Add, Sub, Mul, Div] {
            let f = |a: f32, b: f32| match op {
                Add => a + b,
                Sub => a - b,
                Mul => a * b,
                _ => a / b,
            };
            let at = |i: usize| sv[i % sv.len()];
            let want_xs: Vec<u32> = xv.iter().enumerate().map(|(i, &v)| f(v, at(i)).to_bits()).collect();
            let want_sx: Vec<u32> = xv.iter().enumerate().map(|(i, &v)| f(at(i), v).to_bits()).collect();
            for table in tables() {
                for threads in 1..=4 {
                    let mut cx = Context::with_table(table).with_threads(threads);
                    for (a, b, want) in [(&x, &s, &want_xs), (&s, &x, &want_sx)] {
                        let mut out = Buf::zeros(DType::F32, xs);
                        binary_cx(op, a.r(), b.r(), out.w(), &mut cx).unwrap();
                        let got: Vec<u32> = out.get::<f32>().iter().map(|v| v.to_bits()).collect();
                        let what =
                            format!("{op:?} {:?} {:?} on {} at {threads} threads", a.shape, b.shape, table.isa());
                        assert!(got == *want, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn binary_nan_propagates_in_max_min() {
    let a = f32s(&[2], &[f32::NAN, 1.0]);
    let b = f32s(&[2], &[1.0, f32::NAN]);
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let mut out = Buf::zeros(DType::F32, &[2]);
        binary(op, a.r(), b.r(), out.w()).unwrap();
        assert!(out.get::<f32>().iter().all(|v| v.is_nan()), "{op:?}");
    }
}

fn py_floordiv(a: i64, b: i64) -> i64 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

#[test]
fn binary_int_python_semantics() {
    use BinaryOp::*;
    let mut r = rng(3);
    use rand::Rng;
    run_binary_case(|ash, bsh, osh| {
        let av: Vec<i32> = (0..numel(ash)).map(|_| r.gen_range(-50..50)).collect();
        let bv: Vec<i32> = (0..numel(bsh))
            .map(|_| {
                let v = r.gen_range(-9..9);
                if v == 0 {
                    3
                } else {
                    v
                }
            })
            .collect();
        for op in [Add, Sub, Mul, FloorDiv, Rem, Max, Min, And, Or, Xor, Lt, Eq] {
            let cmp = matches!(op, Lt | Eq);
            let (a, b) = (Buf::from(DType::I32, ash, &av), Buf::from(DType::I32, bsh, &bv));
            let mut out = Buf::zeros(if cmp { DType::Bool } else { DType::I32 }, osh);
            binary(op, a.r(), b.r(), out.w()).unwrap();
            let got: Vec<i64> = if cmp {
                out.get::<u8>().iter().map(|&v| v as i64).collect()
            } else {
                out.get::<i32>().iter().map(|&v| v as i64).collect()
            };
            for (i, &g) in got.iter().enumerate() {
                let idx = unravel(i, osh);
                let (x, y) = (av[bcast_index(&idx, ash)] as i64, bv[bcast_index(&idx, bsh)] as i64);
                let w = match op {
                    Add => x + y,
                    Sub => x - y,
                    Mul => x * y,
                    FloorDiv => py_floordiv(x, y),
                    Rem => x - y * py_floordiv(x, y),
                    Max => x.max(y),
                    Min => x.min(y),
                    And => x & y,
                    Or => x | y,
                    Xor => x ^ y,
                    Lt => (x < y) as i64,
                    _ => (x == y) as i64,
                };
                assert_eq!(g, w, "{op:?} {x} {y}");
            }
        }
    });
    // Pow wraps; division by zero is an error, not a panic.
    let a = Buf::from(DType::I64, &[3], &[3i64, -2, 7]);
    let b = Buf::from(DType::I64, &[3], &[4i64, 3, 0]);
    let mut out = Buf::zeros(DType::I64, &[3]);
    binary(Pow, a.r(), b.r(), out.w()).unwrap();
    assert_eq!(out.get::<i64>(), vec![81, -8, 1]);
    let err = binary(FloorDiv, a.r(), b.r(), out.w()).unwrap_err();
    assert!(err.to_string().contains("integer division by zero"));
    assert!(binary(Rem, a.r(), b.r(), out.w()).is_err());
    assert!(matches!(binary(Div, a.r(), b.r(), out.w()), Err(KernelError::UnsupportedDType { .. })));
    // Negative exponents as torch's integer pow: 1 → 1, -1 → ±1, else 0.
    let base = Buf::from(DType::I64, &[6], &[0i64, 2, 1, -1, -1, 3]);
    let neg = Buf::from(DType::I64, &[6], &[-1i64, -1, -3, -3, -2, -2]);
    let mut out6 = Buf::zeros(DType::I64, &[6]);
    binary(Pow, base.r(), neg.r(), out6.w()).unwrap();
    assert_eq!(out6.get::<i64>(), vec![0, 0, 1, -1, 1, 0]);
}

#[test]
fn binary_bool_and_u8_and_shape_errors() {
    let a = Buf::from(DType::Bool, &[4], &[0u8, 0, 1, 1]);
    let b = Buf::from(DType::Bool, &[4], &[0u8, 1, 0, 1]);
    for (op, want) in [
        (BinaryOp::And, [0u8, 0, 0, 1]),
        (BinaryOp::Or, [0, 1, 1, 1]),
        (BinaryOp::Xor, [0, 1, 1, 0]),
        (BinaryOp::Eq, [1, 0, 0, 1]),
    ] {
        let mut out = Buf::zeros(DType::Bool, &[4]);
        binary(op, a.r(), b.r(), out.w()).unwrap();
        assert_eq!(out.get::<u8>(), want, "{op:?}");
    }
    let a = Buf::from(DType::U8, &[2], &[250u8, 3]);
    let b = Buf::from(DType::U8, &[2], &[10u8, 2]);
    let mut out = Buf::zeros(DType::U8, &[2]);
    binary(BinaryOp::Add, a.r(), b.r(), out.w()).unwrap();
    assert_eq!(out.get::<u8>(), vec![4, 5]);
    // Wrong output shape, non-broadcastable inputs, short buffers.
    let x = f32s(&[3], &[1.0, 2.0, 3.0]);
    let y = f32s(&[2], &[1.0, 2.0]);
    let mut o = Buf::zeros(DType::F32, &[3]);
    assert!(matches!(binary(BinaryOp::Add, x.r(), y.r(), o.w()), Err(KernelError::Shape { .. })));
    let mut o2 = Buf::zeros(DType::F32, &[1, 3]);
    assert!(binary(BinaryOp::Add, x.r(), x.r(), o2.w()).is_err());
    let short = TensorRef { dtype: DType::F32, shape: &[4], data: x.r().data };
    assert!(binary(BinaryOp::Add, short, x.r(), o.w()).is_err());
}

#[test]
fn half_binary_computes_in_f32() {
    let a: Vec<f16> = [1.5f32, -2.25, 3.0].iter().map(|&v| f16::from_f32(v)).collect();
    let b: Vec<f16> = [0.5f32, 4.0, -1.0].iter().map(|&v| f16::from_f32(v)).collect();
    let (ab, bb) = (Buf::from(DType::F16, &[3], &a), Buf::from(DType::F16, &[3], &b));
    let mut out = Buf::zeros(DType::F16, &[3]);
    binary(BinaryOp::Mul, ab.r(), bb.r(), out.w()).unwrap();
    assert_eq!(out.get::<f16>().iter().map(|v| v.to_f32()).collect::<Vec<_>>(), vec![0.75, -9.0, -3.0]);
}

#[test]
fn where_cast_clamp() {
    let c = Buf::from(DType::Bool, &[2, 1], &[1u8, 0]);
    let a = Buf::from(DType::I64, &[3], &[1i64, 2, 3]);
    let b = Buf::from(DType::I64, &[1], &[-1i64]);
    let mut out = Buf::zeros(DType::I64, &[2, 3]);
    where_(c.r(), a.r(), b.r(), out.w()).unwrap();
    assert_eq!(out.get::<i64>(), vec![1, 2, 3, -1, -1, -1]);

    let x = f32s(&[6], &[-2.7, -0.5, 0.0, 0.5, 2.7, f32::NAN]);
    let mut o = Buf::zeros(DType::I32, &[6]);
    cast(x.r(), o.w()).unwrap();
    assert_eq!(o.get::<i32>(), vec![-2, 0, 0, 0, 2, 0]);
    let mut o = Buf::zeros(DType::Bool, &[6]);
    cast(x.r(), o.w()).unwrap();
    assert_eq!(o.get::<u8>(), vec![1, 1, 0, 1, 1, 1]);
    let mut o = Buf::zeros(DType::BF16, &[6]);
    cast(x.r(), o.w()).unwrap();
    let mut back = Buf::zeros(DType::F64, &[6]);
    let ob = Buf::from(DType::BF16, &[6], &o.get::<half::bf16>());
    cast(ob.r(), back.w()).unwrap();
    assert_close(&back.get::<f64>(), &[-2.703125, -0.5, 0.0, 0.5, 2.703125, f64::NAN], 0.0, 0.0, "bf16");
    let big = Buf::from(DType::I64, &[2], &[i64::MAX, 300]);
    let mut o = Buf::zeros(DType::U8, &[2]);
    cast(big.r(), o.w()).unwrap();
    assert_eq!(o.get::<u8>(), vec![255, 44]);
    let mut o = Buf::zeros(DType::F64, &[2]);
    cast(big.r(), o.w()).unwrap();
    assert_eq!(o.get::<f64>(), vec![i64::MAX as f64, 300.0]);

    let mut o = Buf::zeros(DType::F32, &[6]);
    clamp(x.r(), Some(-1.0), Some(1.0), o.w()).unwrap();
    assert_close(&to64(&o.get::<f32>()), &[-1.0, -0.5, 0.0, 0.5, 1.0, f64::NAN], 0.0, 0.0, "clamp");
    let xi = Buf::from(DType::I32, &[4], &[-5i32, 0, 3, 9]);
    let mut o = Buf::zeros(DType::I32, &[4]);
    clamp(xi.r(), Some(-1.5), None, o.w()).unwrap();
    assert_eq!(o.get::<i32>(), vec![-1, 0, 3, 9]);
}
