//! Native code generation (feature `native`): random fused programs of every
//! op kind compiled for each x86-64 level this CPU runs, loaded by the
//! runtime's own loader and compared with the portable fused kernel; objects
//! for aarch64 parsed and relocated by the same loader.
//!
//! `KILN_BLESS_NATIVE=1` rewrites the objects under
//! runtime/tests/fixtures/native/ that the runtime's loader tests run.
#![cfg(feature = "native")]

use kiln_compiler::native::emit::rows::{row_function_to_mlir, RowOp};
use kiln_compiler::native::emit::{program_function, program_to_mlir};
use kiln_compiler::native::llvm::compile_module;
use kiln_isa::{BinaryOp, DType, FusedOp, UnaryOp};
use kiln_kernels::{Context, TensorMut, TensorRef};
use kiln_runtime::format::ReduceKind;
use kiln_runtime::native::{cpu_runs, Arch, InputMode, LoadedObject, NativeArch, AARCH64_LEVELS, X86_64_LEVELS};
use rand::{Rng, SeedableRng};

type NativeFn = unsafe extern "C" fn(*const *const u8, *mut u8, usize, usize);
/// A function with an integer division: nonzero where a divisor was 0.
type FallibleFn = unsafe extern "C" fn(*const *const u8, *mut u8, usize, usize) -> i32;

/// Calls the generated function at `addr` on `start..end` with the
/// signature `can_fail` says; its status (0 for a function that cannot fail).
///
/// # Safety
/// `addr` is a mapped function with that signature, and `ins` / `out` hold
/// what it reads and writes for elements `start..end`.
unsafe fn call(addr: *const u8, can_fail: bool, ins: *const *const u8, out: *mut u8, start: usize, end: usize) -> i32 {
    if can_fail {
        let f: FallibleFn = std::mem::transmute(addr);
        f(ins, out, start, end)
    } else {
        let f: NativeFn = std::mem::transmute(addr);
        f(ins, out, start, end);
        0
    }
}

fn object_for(program: &[FusedOp], modes: &[InputMode], triple: &str, cpu: &str) -> Vec<u8> {
    let func = program_to_mlir("kiln_test", program, modes, &vec![DType::F32; modes.len()]).expect("lowerable program");
    compile_module(&format!("module {{\n{func}}}\n"), triple, cpu).unwrap_or_else(|e| panic!("{cpu}: {e}"))
}

/// Runs `program` natively (every level this CPU runs) and portably on
/// `inputs` (the last one a splat when `splat_last`), asserting closeness.
fn check_program(what: &str, program: &[FusedOp], inputs: &[Vec<f32>], splat_last: bool, ulps: u32) {
    check_program_levels(what, program, inputs, splat_last, ulps, ulps)
}

/// [`check_program`] with a looser bound for the baseline level (no FMA).
fn check_program_levels(
    what: &str,
    program: &[FusedOp],
    inputs: &[Vec<f32>],
    splat_last: bool,
    ulps: u32,
    baseline_ulps: u32,
) {
    let n = inputs[0].len();
    let modes: Vec<InputMode> = (0..inputs.len())
        .map(|i| if splat_last && i + 1 == inputs.len() { InputMode::Splat } else { InputMode::Full })
        .collect();
    let shapes: Vec<Vec<usize>> =
        modes.iter().map(|m| if *m == InputMode::Splat { vec![1] } else { vec![n] }).collect();
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let refs: Vec<TensorRef<'_>> =
        bytes.iter().zip(&shapes).map(|(b, s)| TensorRef { dtype: DType::F32, shape: s, data: b }).collect();
    let out_shape = [n];
    let mut want = vec![0u8; n * 4];
    let mut cx = Context::new();
    kiln_kernels::fused(program, &refs, TensorMut { dtype: DType::F32, shape: &out_shape, data: &mut want }, &mut cx)
        .expect("portable run");
    let mut ran = 0;
    for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
        let ulps = if *level == "x86-64" { baseline_ulps } else { ulps };
        let obj = object_for(program, &modes, "x86_64-unknown-linux-gnu", level);
        let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap_or_else(|e| panic!("{what} {level}: {e}"));
        let f = loaded.function("kiln_test").expect("function defined");
        // SAFETY: the generated function has the NativeFn ABI.
        let f: NativeFn = unsafe { std::mem::transmute(f) };
        let ptrs: Vec<*const u8> = bytes.iter().map(|b| b.as_ptr()).collect();
        let mut got = vec![0u8; n * 4];
        // Two ranges, as two threads would split them.
        let mid = n / 3;
        // SAFETY: the operands hold n elements (one for a splat), the output n.
        unsafe {
            f(ptrs.as_ptr(), got.as_mut_ptr(), 0, mid);
            f(ptrs.as_ptr(), got.as_mut_ptr(), mid, n);
        }
        for i in 0..n {
            let g = f32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
            let w = f32::from_le_bytes(want[4 * i..4 * i + 4].try_into().unwrap());
            let ok = (g.is_nan() && w.is_nan()) || g == w || ulp_distance(g, w) <= ulps || (g - w).abs() <= 1e-37;
            assert!(
                ok,
                "{what} {level}: element {i} (inputs {:?}): native {g:e}, portable {w:e}",
                inputs_at(inputs, i)
            );
        }
        ran += 1;
    }
    assert!(ran > 0, "the baseline level always runs on x86-64");
}

fn inputs_at(inputs: &[Vec<f32>], i: usize) -> Vec<f32> {
    inputs.iter().map(|v| v[i.min(v.len() - 1)]).collect()
}

fn ulp_distance(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let b = x.to_bits() as i32;
        if b < 0 {
            i32::MIN - b
        } else {
            b
        }
    };
    (key(a) as i64 - key(b) as i64).unsigned_abs().min(u32::MAX as u64) as u32
}

/// Random values over a wide range plus the special ones (±0, ±inf, NaN,
/// tiny, huge) every op must agree on.
fn values(rng: &mut rand::rngs::StdRng, n: usize, scale: f32) -> Vec<f32> {
    let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, -1e-30, 100.0, -100.0, 88.0, -104.0];
    (0..n).map(|i| if i < special.len() { special[i] } else { (rng.gen::<f32>() * 2.0 - 1.0) * scale }).collect()
}

const N: usize = 1037;

#[cfg(target_arch = "x86_64")]
#[test]
fn every_unary_op_matches_the_portable_kernel() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let ops = [
        (UnaryOp::Neg, 0),
        (UnaryOp::Abs, 0),
        (UnaryOp::Relu, 0),
        (UnaryOp::Sqrt, 0),
        (UnaryOp::Rsqrt, 1),
        (UnaryOp::Reciprocal, 0),
        (UnaryOp::Exp, 2),
        (UnaryOp::Sigmoid, 2),
        (UnaryOp::Silu, 2),
        (UnaryOp::Tanh, 2),
        (UnaryOp::GeluTanh, 4),
        (UnaryOp::Erf, 2),
        (UnaryOp::Gelu, 4),
        // The libm ops (bounds from exhaustive/sampled scans of the emitted
        // algorithms against glibc; see compiler/src/native/emit.rs).
        (UnaryOp::Log, 1),
        (UnaryOp::Log2, 2),
        (UnaryOp::Log10, 2),
        (UnaryOp::Log1p, 2),
        (UnaryOp::Expm1, 3),
        (UnaryOp::Floor, 0),
        (UnaryOp::Ceil, 0),
        (UnaryOp::Trunc, 0),
        (UnaryOp::Round, 0),
        (UnaryOp::Sign, 0),
    ];
    for (op, ulps) in ops {
        for scale in [1.0, 12.0] {
            let x = values(&mut rng, N, scale);
            // Without FMA (baseline x86-64) the rounding of x + 0.044715x³ is
            // amplified by the exponential of GELU's left tail (~1e-5 relative at x = -10).
            // Exact GELU's left tail needs x² − round(x²), exact only with FMA.
            let baseline = if matches!(op, UnaryOp::GeluTanh | UnaryOp::Gelu) { 1 << 9 } else { ulps };
            let p = [FusedOp::Unary { op, x: 0 }];
            check_program_levels(&format!("{op} (scale {scale})"), &p, &[x], false, ulps, baseline);
        }
    }
}

/// Positive values over every binade (subnormals included), values near 1
/// and near 0 (where log1p and expm1 must not cancel), the special ones, and
/// their negations.
fn log_values(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0, -1.0, 2.0, 8.0, 0.5, 1e-45, 3e-39];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            let v = match i % 4 {
                // Any finite positive f32 (uniform over the bit patterns).
                0 => f32::from_bits(rng.gen_range(1..0x7F80_0000u32)),
                1 => 1.0 + (rng.gen::<f32>() - 0.5) * 1e-3,
                2 => (rng.gen::<f32>() - 0.5) * 2f32.powi(-rng.gen_range(1..40)),
                _ => rng.gen::<f32>() * 100.0,
            };
            if i % 7 == 0 {
                -v
            } else {
                v
            }
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn log_family_and_rounding_match_over_every_binade() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let x = log_values(&mut rng, 4 * N);
    for (op, ulps) in
        [(UnaryOp::Log, 1), (UnaryOp::Log2, 2), (UnaryOp::Log10, 2), (UnaryOp::Log1p, 2), (UnaryOp::Expm1, 3)]
    {
        let p = [FusedOp::Unary { op, x: 0 }];
        check_program(&format!("{op}"), &p, std::slice::from_ref(&x), false, ulps);
    }
    // Halves (ties), values just off integers, ±0, and past 2²³ where every
    // f32 is an integer.
    let mut r: Vec<f32> = (0..N)
        .map(|i| match i % 4 {
            0 => (rng.gen_range(-40i32..40) as f32) * 0.5,
            1 => rng.gen_range(-5.0f32..5.0),
            2 => rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(0..30)),
            _ => f32::from_bits(rng.gen_range(0..0x4B80_0000u32)) * if i % 8 == 3 { -1.0 } else { 1.0 },
        })
        .collect();
    r[..8].copy_from_slice(&[0.0, -0.0, -0.5, 0.5, 8_388_607.5, -8_388_608.0, f32::NAN, f32::NEG_INFINITY]);
    for op in [UnaryOp::Floor, UnaryOp::Ceil, UnaryOp::Trunc, UnaryOp::Round, UnaryOp::Sign] {
        let p = [FusedOp::Unary { op, x: 0 }];
        check_program_bits(&format!("{op}"), &p, std::slice::from_ref(&r));
    }
}

/// Angles for sin, cos and tan: every binade up to f32::MAX (the large
/// reduction), the hard cases next to multiples of π/2 (float neighbours of
/// k·π/2, small and huge k), each path's bounds, and the special values.
fn angle_values(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
        -3e-39,
        2.4414062e-4,
        0.75,
        std::f32::consts::FRAC_PI_4,
        0.6744,
        120.0,
        -120.0,
        1e6,
        -1e6,
        f32::MAX,
        f32::MIN,
    ];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            let v = match i % 4 {
                0 => f32::from_bits(rng.gen_range(0..0x7F80_0000u32)),
                1 => rng.gen_range(-1e6f32..1e6),
                2 => {
                    let k = if i % 8 == 2 { rng.gen_range(1..200) } else { rng.gen_range(1..1_000_000) };
                    let near = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
                    f32::from_bits((near.to_bits() as i64 + rng.gen_range(-2i64..=2)) as u32)
                }
                _ => rng.gen_range(-8.0f32..8.0),
            };
            if i % 3 == 0 {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// sin, cos and tan are glibc's sinf/cosf/tanf operation for operation:
/// bit-identical where the level fuses as the glibc build does (every
/// level for tan; FMA levels for sin/cos, as glibc picks its FMA variant
/// on such a CPU), within 1 ulp otherwise.
#[cfg(target_arch = "x86_64")]
#[test]
fn trig_matches_the_portable_kernel_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let x = angle_values(&mut rng, 8 * N);
    for op in [UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Tan] {
        let p = [FusedOp::Unary { op, x: 0 }];
        let baseline = if op == UnaryOp::Tan { 0 } else { 1 };
        check_program_levels(&format!("{op}"), &p, std::slice::from_ref(&x), false, 0, baseline);
    }
    // RoPE's rotation: x·cos(θ) + y·sin(θ), θ a splat.
    let rope = [
        FusedOp::Unary { op: UnaryOp::Cos, x: 2 },
        FusedOp::Unary { op: UnaryOp::Sin, x: 2 },
        FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 3 },
        FusedOp::Binary { op: BinaryOp::Mul, a: 1, b: 4 },
        FusedOp::Binary { op: BinaryOp::Add, a: 5, b: 6 },
    ];
    let y: Vec<f32> = x.iter().rev().copied().collect();
    for theta in [0.3f32, 1e5, -7.0] {
        check_program_levels("rope", &rope, &[x.clone(), y.clone(), vec![theta]], true, 0, 1);
    }
}

/// [`check_program`] with bit equality (the sign of zero included).
fn check_program_bits(what: &str, program: &[FusedOp], inputs: &[Vec<f32>]) {
    check_program(what, program, inputs, false, 0);
    // 1 / r tells −0 from +0 (−inf vs +inf).
    let mut p = program.to_vec();
    let r = (inputs.len() + p.len() - 1) as u32;
    p.push(FusedOp::Scalar { dtype: DType::F32, bits: 1f32.to_bits() as u64 });
    p.push(FusedOp::Binary { op: BinaryOp::Div, a: r + 1, b: r });
    check_program(&format!("{what} (1/r)"), &p, inputs, false, 0);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn binary_compare_where_clamp_cast_and_scalars_match() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let a = values(&mut rng, N, 5.0);
    let mut b = values(&mut rng, N, 5.0);
    b.reverse();
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min] {
        let p = [FusedOp::Binary { op, a: 0, b: 1 }];
        check_program(&format!("{op}"), &p, &[a.clone(), b.clone()], false, 0);
        check_program(&format!("{op} splat"), &p, &[a.clone(), vec![0.5]], true, 0);
    }
    for op in [BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge] {
        // where(a op b, a, b), and the comparison cast to f32.
        let p = [FusedOp::Binary { op, a: 0, b: 1 }, FusedOp::Where { cond: 2, a: 0, b: 1 }];
        check_program(&format!("where {op}"), &p, &[a.clone(), b.clone()], false, 0);
        let p = [FusedOp::Binary { op, a: 0, b: 1 }, FusedOp::Cast { to: DType::F32, x: 2 }];
        check_program(&format!("cast {op}"), &p, &[a.clone(), b.clone()], false, 0);
    }
    let bools = [
        FusedOp::Binary { op: BinaryOp::Gt, a: 0, b: 1 },
        FusedOp::Binary { op: BinaryOp::Lt, a: 0, b: 1 },
        FusedOp::Binary { op: BinaryOp::Or, a: 2, b: 3 },
        FusedOp::Unary { op: UnaryOp::Not, x: 4 },
        FusedOp::Cast { to: DType::F32, x: 5 },
    ];
    check_program("bool logic", &bools, &[a.clone(), b.clone()], false, 0);
    // Bool scalars (lerp's program selects with a constant condition).
    for bit in [0, 1] {
        let p = [
            FusedOp::Scalar { dtype: DType::Bool, bits: bit },
            FusedOp::Where { cond: 2, a: 0, b: 1 },
            FusedOp::Binary { op: BinaryOp::Sub, a: 0, b: 3 },
        ];
        check_program(&format!("where({bit}, a, b)"), &p, &[a.clone(), b.clone()], false, 0);
    }
    for (min, max) in [(Some(-1.0), Some(2.5)), (None, Some(0.1)), (Some(0.3), None)] {
        check_program("clamp", &[FusedOp::Clamp { min, max, x: 0 }], std::slice::from_ref(&a), false, 0);
    }
    // A norm-style chain with scalars: (x - m) * 1.5 + 0.5, then silu.
    let chain = [
        FusedOp::Scalar { dtype: DType::F32, bits: 1.5f32.to_bits() as u64 },
        FusedOp::Scalar { dtype: DType::F32, bits: 0.5f32.to_bits() as u64 },
        FusedOp::Binary { op: BinaryOp::Sub, a: 0, b: 1 },
        FusedOp::Binary { op: BinaryOp::Mul, a: 4, b: 2 },
        FusedOp::Binary { op: BinaryOp::Add, a: 5, b: 3 },
        FusedOp::Unary { op: UnaryOp::Silu, x: 6 },
    ];
    check_program("chain", &chain, &[a.clone(), b.clone()], false, 2);
    check_program("chain splat", &chain, &[a.clone(), vec![0.25]], true, 2);
}

/// Arguments for the inverse and hyperbolic functions: every binade of
/// both signs (subnormals included), the neighbours of ±1 and of 0, around
/// the series switch (2⁻⁵), sinh/cosh's overflow edge (~89.4), past
/// `f32::MAX / 2`, and the special values.
fn inverse_values(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        -f32::MAX,
        1e-45,
        0.03125,
        89.41599,
        89.41598,
        -89.41599,
        2e38,
    ];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            let v = match i % 5 {
                0 => f32::from_bits(rng.gen_range(1..0x7F80_0000u32)),
                1 => f32::from_bits(1f32.to_bits() - rng.gen_range(1..4096u32)),
                2 => f32::from_bits(1f32.to_bits() + rng.gen_range(1..4096u32)),
                3 => rng.gen_range(0.0f32..1.0) * 2f32.powi(rng.gen_range(-8..2)),
                _ => rng.gen_range(0.0f32..100.0),
            };
            if rng.gen::<bool>() {
                -v
            } else {
                v
            }
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn inverse_hyperbolic_and_pow_match_the_portable_kernels() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let x = inverse_values(&mut rng, 8 * N);
    // The emitted code is correctly rounded but for ~2⁻²⁵ ulp; libm (what
    // the portable kernels call) is within an ulp of that for asin, acos and
    // atan, within 2 for the hyperbolic ones (a scan of every 13th f32 against
    // f64: sinh(0.75845194) is 2 ulp above the exact value, acosh(1.0001206) 2
    // below).
    for (op, ulps) in [
        (UnaryOp::Asin, 1),
        (UnaryOp::Acos, 1),
        (UnaryOp::Atan, 1),
        (UnaryOp::Sinh, 2),
        (UnaryOp::Cosh, 2),
        (UnaryOp::Asinh, 2),
        (UnaryOp::Acosh, 2),
        (UnaryOp::Atanh, 2),
    ] {
        let p = [FusedOp::Unary { op, x: 0 }];
        check_program(&format!("{op}"), &p, std::slice::from_ref(&x), false, ulps);
    }
    // pow and atan2 over every pair of special values, then random pairs:
    // bases of every binade and sign, exponents small and large, integral
    // (odd and even) and not.
    let special = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        3.0,
        -3.0,
        // Not integers, though they truncate to odd ones: pow(−0, 3.5) is +0.
        3.5,
        -3.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
        16_777_216.0,
        16_777_217.0 * 2.0,
        f32::MAX,
    ];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &u in &special {
        for &v in &special {
            a.push(u);
            b.push(v);
        }
    }
    for i in 0..8 * N {
        let base = match i % 3 {
            0 => f32::from_bits(rng.gen_range(1..0x7F80_0000u32)),
            1 => rng.gen_range(0.0f32..4.0),
            _ => f32::from_bits(1f32.to_bits() + rng.gen_range(0..65536u32)),
        };
        let e = match i % 4 {
            0 => rng.gen_range(-40i32..40) as f32,
            1 => rng.gen_range(-10.0f32..10.0),
            2 => rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-20..40)),
            _ => rng.gen_range(-3i32..4) as f32 * 0.5,
        };
        a.push(if i % 5 == 0 { -base } else { base });
        b.push(e);
    }
    let pow = [FusedOp::Binary { op: BinaryOp::Pow, a: 0, b: 1 }];
    check_program("pow", &pow, &[a.clone(), b.clone()], false, 1);
    let atan2 = [FusedOp::Binary { op: BinaryOp::Atan2, a: 0, b: 1 }];
    check_program("atan2", &atan2, &[a.clone(), b.clone()], false, 1);
    // C's special cases must agree exactly (signed zeros, infinities, NaN,
    // multiples of π/4): every pair with a zero, infinite or NaN operand.
    let edge = |v: f32| v == 0.0 || v.is_infinite() || v.is_nan();
    let (sa, sb): (Vec<f32>, Vec<f32>) =
        a.iter().zip(&b).take(special.len() * special.len()).filter(|(u, v)| edge(**u) || edge(**v)).unzip();
    check_program_bits("pow specials", &pow, &[sa.clone(), sb.clone()]);
    check_program_bits("atan2 specials", &atan2, &[sa, sb]);
}

#[test]
fn unsupported_ops_are_refused_not_miscompiled() {
    for p in [
        vec![FusedOp::Unary { op: UnaryOp::Lgamma, x: 0 }],
        vec![FusedOp::Unary { op: UnaryOp::Digamma, x: 0 }],
        vec![FusedOp::Binary { op: BinaryOp::Zeta, a: 0, b: 0 }],
        vec![FusedOp::Cast { to: DType::F64, x: 0 }],
    ] {
        assert!(program_to_mlir("f", &p, &[InputMode::Full], &[DType::F32]).is_err(), "{p:?}");
    }
    // True division of ints (the importer casts to float first), math on
    // ints and bools, the special functions and pow of halves, operands of
    // other dtypes.
    for (p, dtype) in [
        (FusedOp::Binary { op: BinaryOp::Div, a: 0, b: 0 }, DType::I32),
        (FusedOp::Binary { op: BinaryOp::Pow, a: 0, b: 0 }, DType::I64),
        (FusedOp::Unary { op: UnaryOp::Exp, x: 0 }, DType::I64),
        (FusedOp::Binary { op: BinaryOp::Sub, a: 0, b: 0 }, DType::Bool),
        (FusedOp::Unary { op: UnaryOp::Ndtr, x: 0 }, DType::F16),
        (FusedOp::Binary { op: BinaryOp::Pow, a: 0, b: 0 }, DType::BF16),
        (FusedOp::Unary { op: UnaryOp::Neg, x: 0 }, DType::F64),
        (FusedOp::Unary { op: UnaryOp::Neg, x: 0 }, DType::U8),
    ] {
        assert!(program_to_mlir("f", &[p], &[InputMode::Full], &[dtype]).is_err(), "{p:?} of {dtype}");
    }
}

/// The chain the runtime's loader tests run: `sigmoid(a) * b + 1` (b a splat).
fn fixture_program() -> Vec<FusedOp> {
    vec![
        FusedOp::Unary { op: UnaryOp::Sigmoid, x: 0 },
        FusedOp::Binary { op: BinaryOp::Mul, a: 2, b: 1 },
        FusedOp::Scalar { dtype: DType::F32, bits: 1f32.to_bits() as u64 },
        FusedOp::Binary { op: BinaryOp::Add, a: 3, b: 4 },
    ]
}

#[test]
fn aarch64_objects_load_in_the_runtime_loader() {
    let modes = [InputMode::Full, InputMode::Splat];
    // sin: f64 and i64 constants, 64-bit integer products.
    let sin = [FusedOp::Unary { op: UnaryOp::Sin, x: 0 }];
    for level in AARCH64_LEVELS {
        for (program, modes) in [(&fixture_program()[..], &modes[..]), (&sin[..], &modes[..1])] {
            let obj = object_for(program, modes, "aarch64-unknown-linux-gnu", level);
            let names = LoadedObject::check(&obj, Arch::Aarch64).unwrap_or_else(|e| panic!("{level}: {e}"));
            assert_eq!(names, ["kiln_test"]);
            // Not an x86-64 object.
            assert!(LoadedObject::check(&obj, Arch::X86_64).is_err());
        }
    }
}

#[test]
fn bless_loader_fixtures() {
    let modes = [InputMode::Full, InputMode::Splat];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/tests/fixtures/native");
    for (name, triple, cpu) in [
        ("sigmoid_mul_add.x86_64.o", "x86_64-unknown-linux-gnu", "x86-64"),
        ("sigmoid_mul_add.aarch64.o", "aarch64-unknown-linux-gnu", "generic"),
    ] {
        let obj = object_for(&fixture_program(), &modes, triple, cpu);
        let path = dir.join(name);
        if std::env::var_os("KILN_BLESS_NATIVE").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &obj).unwrap();
        }
        // The committed object is what this compiler emits (LLVM 19 is deterministic).
        let committed =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run with KILN_BLESS_NATIVE=1)", path.display()));
        assert_eq!(committed, obj, "{name} is stale: rerun with KILN_BLESS_NATIVE=1");
    }
}

/// A row op with its portable kernel call: `(x, params, out)` for `rows`
/// rows of `len` (params: weight [, bias] of `len` each).
fn portable_rows(op: RowOp, x: &[f32], params: &[Vec<f32>], rows: usize, len: usize) -> Vec<f32> {
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let xb = bytes(x);
    let pb: Vec<Vec<u8>> = params.iter().map(|p| bytes(p)).collect();
    let shape = [rows, len];
    let pshape = [len];
    let xr = TensorRef { dtype: DType::F32, shape: &shape, data: &xb };
    let prm = |k: usize| pb.get(k).map(|b| TensorRef { dtype: DType::F32, shape: &pshape, data: b });
    let out_len = if matches!(op, RowOp::Sum | RowOp::Mean | RowOp::Max) { 1 } else { len };
    let out_shape = [rows, out_len];
    let mut ob = vec![0u8; rows * out_len * 4];
    let out = TensorMut { dtype: DType::F32, shape: &out_shape, data: &mut ob };
    match op {
        RowOp::Softmax { log } => kiln_kernels::softmax(xr, 1, log, out),
        RowOp::LayerNorm { eps, .. } => kiln_kernels::layer_norm(xr, prm(0), prm(1), 1, eps, out),
        RowOp::RmsNorm { eps, .. } => kiln_kernels::rms_norm(xr, prm(0), 1, eps, out),
        RowOp::Sum => kiln_kernels::reduce(ReduceKind::Sum, xr, &[1], out),
        RowOp::Mean => kiln_kernels::reduce(ReduceKind::Mean, xr, &[1], out),
        RowOp::Max => kiln_kernels::reduce(ReduceKind::Max, xr, &[1], out),
    }
    .expect("portable run");
    ob.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Rows exercising every path: random values of several scales, rows with
/// NaN, ±inf, all −inf, a zero maximum (±0), and large values.
fn row_values(rng: &mut rand::rngs::StdRng, rows: usize, len: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..rows * len)
        .map(|i| {
            let scale = [1.0, 10.0, 60.0, 1e-3][(i / len) % 4];
            (rng.gen::<f32>() * 2.0 - 1.0) * scale
        })
        .collect();
    let row =
        |x: &mut Vec<f32>, r: usize| -> std::ops::Range<usize> { (r * len).min(x.len())..((r + 1) * len).min(x.len()) };
    if rows > 8 {
        let at = |r: usize, k: usize| r * len + k % len;
        x[at(4, 3)] = f32::NAN;
        x[at(5, 1)] = f32::INFINITY;
        x[at(6, 2)] = f32::NEG_INFINITY;
        for i in row(&mut x, 7) {
            x[i] = f32::NEG_INFINITY;
        }
        // A zero maximum, both signs.
        for i in row(&mut x, 8) {
            x[i] = -x[i].abs();
        }
        x[at(8, 0)] = -0.0;
        x[at(8, len / 2)] = 0.0;
    }
    x
}

#[cfg(target_arch = "x86_64")]
#[test]
fn row_functions_match_the_portable_kernels() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let ops = [
        RowOp::Softmax { log: false },
        RowOp::Softmax { log: true },
        RowOp::LayerNorm { eps: 1e-5, weight: true, bias: true },
        RowOp::LayerNorm { eps: 1e-12, weight: true, bias: false },
        RowOp::LayerNorm { eps: 1e-5, weight: false, bias: false },
        RowOp::RmsNorm { eps: 1e-6, weight: true },
        RowOp::RmsNorm { eps: 1e-6, weight: false },
        RowOp::Sum,
        RowOp::Mean,
        RowOp::Max,
    ];
    let lens = [1usize, 5, 8, 13, 64, 100, 768];
    // Softmax is the AVX2 exp-sum's bits where the table's entry is that
    // kernel and the level fuses as it does (FMA); the norms and
    // reductions are the generic code's on every level.
    let table_is_avx2 = kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2"));
    let mut module = String::new();
    let mut cases = Vec::new();
    for (k, op) in ops.iter().enumerate() {
        for (j, &len) in lens.iter().enumerate() {
            let symbol = format!("row_{k}_{j}");
            module.push_str(&row_function_to_mlir(&symbol, *op, len as u64, NativeArch::X86_64, None, None).unwrap());
            cases.push((symbol, *op, len));
        }
    }
    let module = format!("module {{\n{module}}}\n");
    for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
        let obj = compile_module(&module, "x86_64-unknown-linux-gnu", level).unwrap_or_else(|e| panic!("{level}: {e}"));
        let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap_or_else(|e| panic!("{level}: {e}"));
        let mut inexact = 0usize;
        for (symbol, op, len) in &cases {
            let (op, len) = (*op, *len);
            let rows = 11;
            let x = row_values(&mut rng, rows, len);
            let params: Vec<Vec<f32>> =
                (1..op.operands()).map(|_| (0..len).map(|_| rng.gen::<f32>() * 2.0 - 0.5).collect()).collect();
            let want = portable_rows(op, &x, &params, rows, len);
            let f = loaded.function(symbol).expect("function defined");
            // SAFETY: the generated function has the NativeFn ABI.
            let f: NativeFn = unsafe { std::mem::transmute(f) };
            let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            let pb: Vec<Vec<u8>> = params.iter().map(|p| p.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
            let mut ptrs = vec![xb.as_ptr()];
            ptrs.extend(pb.iter().map(|p| p.as_ptr()));
            let mut got = vec![0u8; want.len() * 4];
            // SAFETY: x holds rows·len f32s, each parameter len, the output
            // rows·out_len; two row ranges, as two threads would split them.
            unsafe {
                f(ptrs.as_ptr(), got.as_mut_ptr(), 0, 3);
                f(ptrs.as_ptr(), got.as_mut_ptr(), 3, rows);
            }
            let softmax = matches!(op, RowOp::Softmax { .. });
            let exact = !softmax || (table_is_avx2 && *level != "x86-64");
            for (i, w) in want.iter().enumerate() {
                let g = f32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                // Softmax off the AVX2 table or without FMA: the exp
                // polynomial's rounding (see `every_unary_op_matches_...`);
                // ln(sum) may round the other way in f32 (fdlibm vs glibc).
                let ulps = match op {
                    _ if exact && !matches!(op, RowOp::Softmax { log: true }) => 0,
                    RowOp::Softmax { log: true } if exact => 1,
                    _ => 4,
                };
                let close = ulp_distance(g, *w) <= ulps || (g - w).abs() <= 1e-37;
                assert!(same || close, "{op:?} len {len} {level}: element {i}: native {g:e}, portable {w:e}");
                inexact += usize::from(!same);
            }
        }
        // Bit-identical almost everywhere (log-softmax's f32 rounding of
        // ln(sum) is the only allowed difference on an exact level).
        if table_is_avx2 && *level != "x86-64" {
            assert!(inexact <= 8, "{level}: {inexact} elements differ from the portable kernels");
        }
    }
}

#[test]
fn aarch64_row_functions_load_in_the_runtime_loader() {
    let mut module = String::new();
    for (k, op) in [RowOp::Softmax { log: true }, RowOp::LayerNorm { eps: 1e-5, weight: true, bias: true }, RowOp::Max]
        .into_iter()
        .enumerate()
    {
        module.push_str(&row_function_to_mlir(&format!("row_{k}"), op, 37, NativeArch::Aarch64, None, None).unwrap());
    }
    let module = format!("module {{\n{module}}}\n");
    for level in AARCH64_LEVELS {
        let obj =
            compile_module(&module, "aarch64-unknown-linux-gnu", level).unwrap_or_else(|e| panic!("{level}: {e}"));
        let mut names = LoadedObject::check(&obj, Arch::Aarch64).unwrap_or_else(|e| panic!("{level}: {e}"));
        names.sort();
        assert_eq!(names, ["row_0", "row_1", "row_2"]);
    }
}

/// A plan of row kernels on 4000 rows (several row ranges over the pool,
/// the mean's rows four at a time and one by one)
/// through `compile_plan`: every call becomes a `native_kernel`, and the
/// artifact's outputs are the same bytes at 1 and 3 threads, and with
/// native code refused (the fallback kernels) where the table's softmax is
/// the AVX2 one.
#[cfg(target_arch = "x86_64")]
#[test]
fn compiled_plans_split_rows_over_threads_with_the_kernels_bits() {
    use kiln_compiler::native::{compile_plan, NativeTarget};
    use kiln_runtime::format::*;
    use kiln_runtime::{Program, SessionOptions, TensorView};
    let (rows, len) = (4000u64, 24u64);
    let t = |shape: &[u64], offset: u64| TensorDecl {
        dtype: DType::F32,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage: Storage::Arena { offset, max_bytes: shape.iter().product::<u64>() * 4 },
    };
    let n = rows * len * 4;
    let call =
        |k: Kernel, out: u32| Instr { op: InstrOp::Call(k), inputs: vec![0], outputs: vec![out], origin: "t".into() };
    let mut plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![
            t(&[rows, len], 0),
            t(&[rows, len], n),
            t(&[rows, len], 2 * n),
            t(&[rows, 1], 3 * n),
            t(&[rows, 1], 3 * n + rows * 4),
        ],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: (1..5).map(|k| IoDecl { name: format!("y{k}"), tensor: k, complex: false }).collect(),
        instrs: vec![
            call(Kernel::Softmax { axis: 1, log: false }, 1),
            call(Kernel::LayerNorm { normalized_rank: 1, eps: 1e-5 }, 2),
            call(Kernel::Reduce { kind: ReduceKind::Max, axes: vec![1] }, 3),
            call(Kernel::Reduce { kind: ReduceKind::Mean, axes: vec![1] }, 4),
        ],
        arena_bytes: 3 * n + rows * 8,
        peak_live_bytes: 3 * n + rows * 8,
        states: vec![],
    };
    let target = NativeTarget::new(NativeArch::X86_64, None).unwrap();
    let section = compile_plan(&mut plan, &target).unwrap().expect("row functions");
    assert!(plan.instrs.iter().all(|i| matches!(i.op, InstrOp::NativeKernel { .. })), "{:?}", plan.instrs);
    assert_eq!(section.functions.len(), 4);
    let mut w = ArtifactWriter::new(&plan, WeightsBuilder::new(), &Metadata::default()).unwrap();
    w.add_native(&section).unwrap();
    let program = Program::from_bytes(&w.to_bytes()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let x: Vec<u8> = (0..rows * len).flat_map(|_| ((rng.gen::<f32>() - 0.5) * 20.0).to_le_bytes()).collect();
    let shape = [rows as usize, len as usize];
    let run = |threads: usize, allow: bool| -> Vec<Vec<u8>> {
        let opts = SessionOptions { threads, allow_native_code: allow, ..SessionOptions::default() };
        let mut s = program.session_with(&opts).unwrap();
        let out = s.run(&[TensorView { dtype: DType::F32, shape: &shape, data: &x }]).unwrap();
        (0..4).map(|i| out.get(i).data.to_vec()).collect()
    };
    let one = run(1, true);
    assert_eq!(one, run(3, true), "1 vs 3 threads");
    let portable = run(1, false);
    let avx2 = kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2"));
    // Layer norm, max and mean: the generic code's bits on every level.
    assert_eq!(one[1..], portable[1..], "layer norm / max / mean vs their kernels");
    if avx2 && cpu_runs(NativeArch::X86_64, "x86-64-v3") {
        assert_eq!(one[0], portable[0], "softmax vs its kernel");
    }
}

/// Elementwise prologues merged into row functions (format 0.14): a
/// residual add before a layer norm, a scale and additive mask (broadcast
/// over rows) before a softmax, and a scaled add before an RMS norm whose
/// sum is also a program output. `compile_plan` merges each pair into one
/// `native_kernel` with a prologue; the outputs (the sum included) are the
/// unmerged plan's bytes run on the portable kernels — with native code,
/// with it refused (the fallback: program, then kernel), at 1 and 3
/// threads.
#[cfg(target_arch = "x86_64")]
#[test]
fn merged_prologues_give_the_unfused_kernels_bits() {
    use kiln_compiler::native::{compile_plan, NativeTarget};
    use kiln_runtime::format::*;
    use kiln_runtime::{Program, SessionOptions, TensorView};
    let (rows, len) = (1000u64, 96u64);
    let n = rows * len * 4;
    let t = |shape: &[u64], offset: u64| TensorDecl {
        dtype: DType::F32,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage: Storage::Arena { offset, max_bytes: shape.iter().product::<u64>() * 4 },
    };
    let p = 3 * len * 4;
    // 0 a, 1 b, 2 gamma, 3 beta, 4 mask [1, len]: inputs; 5..: results.
    let tensors = vec![
        t(&[rows, len], 0),
        t(&[rows, len], n),
        t(&[len], 2 * n),
        t(&[len], 2 * n + len * 4),
        t(&[1, len], 2 * n + 2 * len * 4),
        t(&[rows, len], 2 * n + p), // 5 a + b
        t(&[rows, len], 3 * n + p), // 6 layer_norm
        t(&[rows, len], 4 * n + p), // 7 a · 0.125 + mask
        t(&[rows, len], 5 * n + p), // 8 softmax
        t(&[rows, len], 6 * n + p), // 9 a · 0.5 + b
        t(&[rows, len], 7 * n + p), // 10 rms_norm
    ];
    let call = |k: Kernel, inputs: Vec<u32>, out: u32| Instr {
        op: InstrOp::Call(k),
        inputs,
        outputs: vec![out],
        origin: "t".into(),
    };
    let f32s = |v: f32| FusedOp::Scalar { dtype: DType::F32, bits: u64::from(v.to_bits()) };
    let scale_mask = vec![
        f32s(0.125),
        FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 2 },
        FusedOp::Binary { op: BinaryOp::Add, a: 3, b: 1 },
    ];
    let scaled_add = vec![
        f32s(0.5),
        FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 2 },
        FusedOp::Binary { op: BinaryOp::Add, a: 3, b: 1 },
    ];
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors,
        inputs: ["a", "b", "gamma", "beta", "mask"]
            .iter()
            .enumerate()
            .map(|(k, name)| IoDecl { name: (*name).into(), tensor: k as u32, complex: false })
            .collect(),
        outputs: [6u32, 8, 10, 9]
            .iter()
            .map(|&k| IoDecl { name: format!("y{k}"), tensor: k, complex: false })
            .collect(),
        instrs: vec![
            call(Kernel::Binary { op: BinaryOp::Add }, vec![0, 1], 5),
            call(Kernel::LayerNorm { normalized_rank: 1, eps: 1e-5 }, vec![5, 2, 3], 6),
            call(Kernel::Fused { program: scale_mask }, vec![0, 4], 7),
            call(Kernel::Softmax { axis: 1, log: false }, vec![7], 8),
            call(Kernel::Fused { program: scaled_add }, vec![0, 1], 9),
            call(Kernel::RmsNorm { normalized_rank: 1, eps: 1e-6 }, vec![9, 2], 10),
        ],
        arena_bytes: 8 * n + p,
        peak_live_bytes: 8 * n + p,
        states: vec![],
    };
    let mut merged = plan.clone();
    let target = NativeTarget::new(NativeArch::X86_64, None).unwrap();
    let section = compile_plan(&mut merged, &target).unwrap().expect("row functions");
    assert_eq!(merged.instrs.len(), 3, "{:?}", merged.instrs);
    for instr in &merged.instrs {
        let InstrOp::NativeKernel { prologue: Some(p), .. } = &instr.op else { panic!("not merged: {instr:?}") };
        assert_eq!(instr.outputs.len(), 2);
        assert_eq!(p.inputs, 2);
    }
    let load = |plan: &Plan, native: Option<&kiln_runtime::native::NativeSection>| {
        let mut w = ArtifactWriter::new(plan, WeightsBuilder::new(), &Metadata::default()).unwrap();
        if let Some(s) = native {
            w.add_native(s).unwrap();
        }
        Program::from_bytes(&w.to_bytes()).unwrap()
    };
    let (unfused, fused) = (load(&plan, None), load(&merged, Some(&section)));
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut data = |count: u64, scale: f32| -> Vec<u8> {
        (0..count).flat_map(|_| ((rng.gen::<f32>() - 0.5) * scale).to_le_bytes()).collect()
    };
    let (a, b, gamma, beta) = (data(rows * len, 8.0), data(rows * len, 8.0), data(len, 2.0), data(len, 1.0));
    let mut mask = data(len, 4.0);
    mask[4 * 7..4 * 8].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    let (big, vec1, row1) = ([rows as usize, len as usize], [len as usize], [1, len as usize]);
    let inputs = [(&big[..], &a), (&big[..], &b), (&vec1[..], &gamma), (&vec1[..], &beta), (&row1[..], &mask)];
    let run = |program: &std::sync::Arc<Program>, threads: usize, allow: bool| -> Vec<Vec<u8>> {
        let opts = SessionOptions { threads, allow_native_code: allow, ..SessionOptions::default() };
        let mut s = program.session_with(&opts).unwrap();
        let views: Vec<TensorView<'_>> =
            inputs.iter().map(|(shape, data)| TensorView { dtype: DType::F32, shape, data }).collect();
        let out = s.run(&views).unwrap();
        (0..4).map(|i| out.get(i).data.to_vec()).collect()
    };
    let want = run(&unfused, 1, false);
    let native = run(&fused, 1, true);
    assert!(native == run(&fused, 3, true), "1 vs 3 threads");
    assert!(run(&fused, 1, false) == want, "the fallback vs the unfused kernels");
    // Layer and RMS norm (and the prologues' sums): the generic code's
    // bits on every level; softmax where the table's exp-sum is AVX2 and
    // the level has FMA.
    assert!(native[2..] == want[2..], "rms norm and its prologue's sum");
    assert!(native[0] == want[0], "layer norm after a residual add");
    let avx2 = kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2"));
    if avx2 && cpu_runs(NativeArch::X86_64, "x86-64-v3") {
        assert!(native[1] == want[1], "softmax after a scale and mask");
    }
}

/// Broadcast operands (a per-channel `[1, C, 1, 1]` scale and a `[W]` row
/// bias over `[2, C, H, W]`, indexed in 32 bits): `x · s + b` gives the
/// portable fused kernel's bits on every level, split into uneven ranges.
#[cfg(target_arch = "x86_64")]
#[test]
fn broadcast_operands_match_the_portable_kernel() {
    let (c, h, w) = (5usize, 7usize, 12usize);
    let out_shape = [2, c, h, w];
    let n: usize = out_shape.iter().product();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let x = values(&mut rng, n, 4.0);
    let (s, b) = (values(&mut rng, c, 2.0), values(&mut rng, w, 1.0));
    let program =
        [FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 1 }, FusedOp::Binary { op: BinaryOp::Add, a: 3, b: 2 }];
    let modes = [
        InputMode::Full,
        InputMode::Broadcast { inner: (h * w) as u64, period: c as u64 },
        InputMode::Broadcast { inner: 1, period: w as u64 },
    ];
    let shapes: [&[usize]; 3] = [&out_shape, &[1, c, 1, 1], &[w]];
    let bytes: Vec<Vec<u8>> = [&x, &s, &b].iter().map(|v| v.iter().flat_map(|e| e.to_le_bytes()).collect()).collect();
    let refs: Vec<TensorRef<'_>> =
        bytes.iter().zip(shapes).map(|(d, shape)| TensorRef { dtype: DType::F32, shape, data: d }).collect();
    let mut want = vec![0u8; n * 4];
    let mut cx = Context::new();
    kiln_kernels::fused(&program, &refs, TensorMut { dtype: DType::F32, shape: &out_shape, data: &mut want }, &mut cx)
        .expect("portable run");
    for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
        let obj = object_for(&program, &modes, "x86_64-unknown-linux-gnu", level);
        let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap_or_else(|e| panic!("{level}: {e}"));
        // SAFETY: the generated function has the NativeFn ABI.
        let f: NativeFn = unsafe { std::mem::transmute(loaded.function("kiln_test").expect("function defined")) };
        let ptrs: Vec<*const u8> = bytes.iter().map(|d| d.as_ptr()).collect();
        let mut got = vec![0u8; n * 4];
        // SAFETY: x and the output hold n elements, s c and b w: every
        // index the modes compute.
        unsafe {
            f(ptrs.as_ptr(), got.as_mut_ptr(), 0, 101);
            f(ptrs.as_ptr(), got.as_mut_ptr(), 101, n);
        }
        assert!(got == want, "{level}: broadcast operands differ from the portable kernel");
    }
}

/// One operand of a program over bool and integer tensors: its dtype,
/// element bytes (little-endian) and how it is read.
struct Operand {
    dtype: DType,
    data: Vec<u8>,
    mode: InputMode,
}

/// The output of the typed checks is `[ROWS, COLS]`; a broadcast operand
/// is a row `[COLS]` or a column `[ROWS, 1]`.
const ROWS: usize = 61;
const COLS: usize = 17;

fn operand_shape(mode: InputMode) -> Vec<usize> {
    match mode {
        InputMode::Full => vec![ROWS, COLS],
        InputMode::Splat => vec![1],
        InputMode::Broadcast { inner: 1, .. } => vec![COLS],
        InputMode::Broadcast { .. } => vec![ROWS, 1],
    }
}

const ROW: InputMode = InputMode::Broadcast { inner: 1, period: COLS as u64 };
const COLUMN: InputMode = InputMode::Broadcast { inner: COLS as u64, period: ROWS as u64 };

/// Runs `program` natively (every x86-64 level this CPU runs, two uneven
/// ranges) and on the portable fused kernel, asserting the same bytes;
/// compiles it for every aarch64 level and has the runtime's loader check
/// each object. Returns the portable result's bytes.
fn check_typed(what: &str, program: &[FusedOp], ops: &[Operand], out: DType) -> Vec<u8> {
    let n = ROWS * COLS;
    let modes: Vec<InputMode> = ops.iter().map(|o| o.mode).collect();
    let dtypes: Vec<DType> = ops.iter().map(|o| o.dtype).collect();
    let shapes: Vec<Vec<usize>> = modes.iter().map(|&m| operand_shape(m)).collect();
    for (o, s) in ops.iter().zip(&shapes) {
        assert_eq!(o.data.len(), s.iter().product::<usize>() * o.dtype.size_bytes(), "{what}: operand size");
    }
    let refs: Vec<TensorRef<'_>> =
        ops.iter().zip(&shapes).map(|(o, s)| TensorRef { dtype: o.dtype, shape: s, data: &o.data }).collect();
    let out_shape = [ROWS, COLS];
    let size = out.size_bytes();
    let mut want = vec![0u8; n * size];
    let mut cx = Context::new();
    kiln_kernels::fused(program, &refs, TensorMut { dtype: out, shape: &out_shape, data: &mut want }, &mut cx)
        .unwrap_or_else(|e| panic!("{what}: portable run: {e}"));
    let (func, can_fail) =
        program_function("kiln_test", program, &modes, &dtypes).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let module = format!("module {{\n{func}}}\n");
    #[cfg(target_arch = "x86_64")]
    for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
        let obj = compile_module(&module, "x86_64-unknown-linux-gnu", level).unwrap_or_else(|e| panic!("{what}: {e}"));
        let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap_or_else(|e| panic!("{what} {level}: {e}"));
        let f = loaded.function("kiln_test").expect("function defined");
        let ptrs: Vec<*const u8> = ops.iter().map(|o| o.data.as_ptr()).collect();
        let mut got = vec![0xA5u8; n * size];
        // SAFETY: the generated function has the signature `can_fail` says;
        // every operand holds what its mode indexes for n output elements,
        // the output n elements of `out`.
        let status = unsafe {
            call(f, can_fail, ptrs.as_ptr(), got.as_mut_ptr(), 0, 389)
                | call(f, can_fail, ptrs.as_ptr(), got.as_mut_ptr(), 389, n)
        };
        assert_eq!(status, 0, "{what} {level}: no zero divisor, yet the function failed");
        if let Some(i) = (0..n).find(|&i| got[i * size..(i + 1) * size] != want[i * size..(i + 1) * size]) {
            let at = |o: &Operand| {
                let k = match o.mode {
                    InputMode::Full => i,
                    InputMode::Splat => 0,
                    InputMode::Broadcast { inner, period } => (i / inner as usize) % period as usize,
                };
                let s = o.dtype.size_bytes();
                o.data[k * s..(k + 1) * s].to_vec()
            };
            let operands: Vec<Vec<u8>> = ops.iter().map(at).collect();
            panic!(
                "{what} {level}: element {i} (operand bytes {operands:?}): native {:?}, portable {:?}",
                &got[i * size..(i + 1) * size],
                &want[i * size..(i + 1) * size]
            );
        }
    }
    for level in AARCH64_LEVELS {
        let obj = compile_module(&module, "aarch64-unknown-linux-gnu", level).unwrap_or_else(|e| panic!("{what}: {e}"));
        let names = LoadedObject::check(&obj, Arch::Aarch64).unwrap_or_else(|e| panic!("{what} {level}: {e}"));
        assert_eq!(names, ["kiln_test"], "{what} {level}");
    }
    want
}

fn shape_len(mode: InputMode) -> usize {
    operand_shape(mode).iter().product()
}

/// f32 operands: the special values (±0, ±inf, NaN, the int types'
/// bounds and their neighbours, halves), then small integers (so that
/// comparisons see equal values) and wide random values.
fn f32_operand(rng: &mut rand::rngs::StdRng, mode: InputMode) -> Operand {
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        2147483648.0,
        -2147483648.0,
        2147483520.0,
        -2147483520.0,
        9.223372e18,
        -9.223372e18,
        9.2233715e18,
        3e9,
        -3e9,
        1e20,
        -1e20,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.7,
        -2.99,
        1e-40,
        16777217.0,
        f32::MAX,
        f32::MIN,
    ];
    let n = shape_len(mode);
    let v: Vec<f32> = (0..n)
        .map(|i| match (i < special.len() && n > 1, i % 3) {
            (true, _) => special[i],
            (false, 0) => rng.gen_range(-4i32..5) as f32,
            (false, 1) => (rng.gen::<f32>() - 0.5) * 8.0,
            _ => (rng.gen::<f32>() - 0.5) * 1e10,
        })
        .collect();
    Operand { dtype: DType::F32, data: v.iter().flat_map(|x| x.to_le_bytes()).collect(), mode }
}

/// i32 or i64 operands: 0, ±1, the type's extremes and their neighbours,
/// then small values (equal ones for comparisons) and full-range ones.
fn int_operand(rng: &mut rand::rngs::StdRng, dtype: DType, mode: InputMode) -> Operand {
    let n = shape_len(mode);
    let (min, max) = if dtype == DType::I32 { (i32::MIN as i64, i32::MAX as i64) } else { (i64::MIN, i64::MAX) };
    let special = [0, 1, -1, min, max, min + 1, max - 1, 2, -2, 7, -8, 1 << 24, -(1 << 24) - 1];
    let v: Vec<i64> = (0..n)
        .map(|i| match (i < special.len() && n > 1, i % 2) {
            (true, _) => special[i],
            (false, 0) => rng.gen_range(-6i64..7),
            _ => rng.gen_range(min..=max),
        })
        .collect();
    let data = if dtype == DType::I32 {
        v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
    } else {
        v.iter().flat_map(|&x| x.to_le_bytes()).collect()
    };
    Operand { dtype, data, mode }
}

fn bool_operand(rng: &mut rand::rngs::StdRng, mode: InputMode) -> Operand {
    Operand { dtype: DType::Bool, data: (0..shape_len(mode)).map(|_| rng.gen_range(0u8..2)).collect(), mode }
}

const COMPARISONS: [BinaryOp; 6] = [BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge];

/// Bool results and operands: f32 comparisons stored as bool (NaN, −0 and
/// ±inf among the operands), logic on masks, bool comparisons and the
/// kernels' bool arithmetic, `where` over masks read in every mode, and
/// the bool ↔ f32 casts: the portable kernels' bytes.
#[test]
fn bool_operands_and_results_match_the_portable_kernels_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let a = f32_operand(&mut rng, InputMode::Full);
    let mut b = f32_operand(&mut rng, InputMode::Full);
    // Every special value against every other one, somewhere.
    b.data.rotate_left(4 * 5);
    let pair =
        |x: &Operand, y: &Operand| [Operand { data: x.data.clone(), ..*x }, Operand { data: y.data.clone(), ..*y }];
    for op in COMPARISONS {
        let p = [FusedOp::Binary { op, a: 0, b: 1 }];
        check_typed(&format!("f32 {op}"), &p, &pair(&a, &b), DType::Bool);
        let s = f32_operand(&mut rng, InputMode::Splat);
        check_typed(&format!("f32 {op} splat"), &p, &pair(&a, &s), DType::Bool);
        // A self-comparison sees NaN unequal to itself.
        check_typed(&format!("f32 {op} self"), &[FusedOp::Binary { op, a: 0, b: 0 }], &pair(&a, &b)[..1], DType::Bool);
    }
    let (m, k) = (bool_operand(&mut rng, InputMode::Full), bool_operand(&mut rng, InputMode::Full));
    for op in COMPARISONS.into_iter().chain([
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::Add,
        BinaryOp::Mul,
    ]) {
        check_typed(&format!("bool {op}"), &[FusedOp::Binary { op, a: 0, b: 1 }], &pair(&m, &k), DType::Bool);
    }
    for op in [UnaryOp::Not, UnaryOp::BitNot] {
        check_typed(&format!("bool {op}"), &[FusedOp::Unary { op, x: 0 }], &pair(&m, &k)[..1], DType::Bool);
    }
    // (a > b) & !(a ≤ 0) | mask, xor'd with a constant, as bool and as f32.
    let f32s = |v: f32| FusedOp::Scalar { dtype: DType::F32, bits: u64::from(v.to_bits()) };
    let logic = [
        FusedOp::Binary { op: BinaryOp::Gt, a: 0, b: 1 },
        f32s(0.0),
        FusedOp::Binary { op: BinaryOp::Le, a: 0, b: 4 },
        FusedOp::Unary { op: UnaryOp::Not, x: 5 },
        FusedOp::Binary { op: BinaryOp::And, a: 3, b: 6 },
        FusedOp::Binary { op: BinaryOp::Or, a: 7, b: 2 },
        FusedOp::Scalar { dtype: DType::Bool, bits: 1 },
        FusedOp::Binary { op: BinaryOp::Xor, a: 8, b: 9 },
    ];
    let ops3 = |mode: InputMode, rng: &mut rand::rngs::StdRng| {
        let [x, y] = pair(&a, &b);
        [x, y, bool_operand(rng, mode)]
    };
    check_typed("mask logic", &logic, &ops3(InputMode::Full, &mut rng), DType::Bool);
    let mut as_f32 = logic.to_vec();
    as_f32.push(FusedOp::Cast { to: DType::F32, x: 10 });
    check_typed("mask logic as f32", &as_f32, &ops3(InputMode::Full, &mut rng), DType::F32);
    // where(mask, a, b) with the mask in every mode; masked_fill(a, mask, -inf).
    for mode in [InputMode::Full, InputMode::Splat, ROW, COLUMN] {
        let w = [FusedOp::Where { cond: 2, a: 0, b: 1 }];
        check_typed(&format!("where {mode:?}"), &w, &ops3(mode, &mut rng), DType::F32);
        let fill = [f32s(f32::NEG_INFINITY), FusedOp::Where { cond: 2, a: 3, b: 0 }];
        check_typed(&format!("masked_fill {mode:?}"), &fill, &ops3(mode, &mut rng), DType::F32);
    }
    // where over bools; bool ↔ f32 casts (NaN and −0 to bool).
    let m3 =
        [Operand { data: m.data.clone(), ..m }, Operand { data: k.data.clone(), ..k }, bool_operand(&mut rng, ROW)];
    check_typed("where of bools", &[FusedOp::Where { cond: 2, a: 0, b: 1 }], &m3, DType::Bool);
    check_typed("f32 to bool", &[FusedOp::Cast { to: DType::Bool, x: 0 }], &pair(&a, &b)[..1], DType::Bool);
    check_typed("bool to f32", &[FusedOp::Cast { to: DType::F32, x: 0 }], &pair(&m, &k)[..1], DType::F32);
}

/// i32 and i64 operands: wrapping add / sub / mul and negation, abs at
/// the minimum, min / max, bitwise ops, signed comparisons, sign, relu,
/// clamps whose bounds round inward and saturate, scalars, and every cast
/// among f32, bool, i32 and i64 (f32 → int truncating and saturating, NaN
/// → 0, as Rust's `as`; int → f32 rounding to nearest): the portable
/// kernels' bytes.
#[test]
fn integer_operands_match_the_portable_kernels_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    for ty in [DType::I32, DType::I64] {
        let x = int_operand(&mut rng, ty, InputMode::Full);
        let mut y = int_operand(&mut rng, ty, InputMode::Full);
        y.data.rotate_left(ty.size_bytes() * 3);
        let two =
            |x: &Operand, y: &Operand| [Operand { data: x.data.clone(), ..*x }, Operand { data: y.data.clone(), ..*y }];
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Max,
            BinaryOp::Min,
            BinaryOp::And,
            BinaryOp::Or,
            BinaryOp::Xor,
        ]
        .into_iter()
        .chain(COMPARISONS)
        {
            let out = if COMPARISONS.contains(&op) { DType::Bool } else { ty };
            let p = [FusedOp::Binary { op, a: 0, b: 1 }];
            check_typed(&format!("{ty} {op}"), &p, &two(&x, &y), out);
            let s = int_operand(&mut rng, ty, InputMode::Splat);
            check_typed(&format!("{ty} {op} splat"), &p, &two(&x, &s), out);
            let r = int_operand(&mut rng, ty, ROW);
            check_typed(&format!("{ty} {op} row"), &p, &two(&x, &r), out);
        }
        for op in
            [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Relu, UnaryOp::BitNot, UnaryOp::Floor, UnaryOp::Round]
        {
            check_typed(&format!("{ty} {op}"), &[FusedOp::Unary { op, x: 0 }], &two(&x, &y)[..1], ty);
        }
        for (min, max) in [
            (Some(-5.5), Some(7.2)),
            (None, Some(-0.5)),
            (Some(2.0), None),
            (Some(-1e30), Some(1e30)),
            (Some(3e9), None),
            (Some(9.0), Some(4.0)),
        ] {
            let p = [FusedOp::Clamp { min, max, x: 0 }];
            check_typed(&format!("{ty} clamp {min:?} {max:?}"), &p, &two(&x, &y)[..1], ty);
        }
        // x · 3 + (−7) > y, with the constants as scalars of the type.
        let scalar = |v: i64| {
            let bytes = v.to_le_bytes();
            FusedOp::scalar(ty, &bytes[..ty.size_bytes()]).expect("scalar fits")
        };
        let chain = [
            scalar(3),
            scalar(-7),
            FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 2 },
            FusedOp::Binary { op: BinaryOp::Add, a: 4, b: 3 },
            FusedOp::Binary { op: BinaryOp::Gt, a: 5, b: 1 },
        ];
        check_typed(&format!("{ty} scalar chain"), &chain, &two(&x, &y), DType::Bool);
    }
    // Every cast among the four dtypes.
    let dtypes = [DType::F32, DType::Bool, DType::I32, DType::I64];
    for from in dtypes {
        let x = match from {
            DType::F32 => f32_operand(&mut rng, InputMode::Full),
            DType::Bool => bool_operand(&mut rng, InputMode::Full),
            d => int_operand(&mut rng, d, InputMode::Full),
        };
        for to in dtypes {
            let p = [FusedOp::Cast { to, x: 0 }];
            check_typed(&format!("cast {from} to {to}"), &p, &[Operand { data: x.data.clone(), ..x }], to);
        }
    }
}

/// An attention-mask chain over the index types: key positions `[COLS]`
/// (i64) against per-row lengths `[ROWS, 1]` (i64) give a padding mask,
/// combined with a causal one from i32 positions; scores are masked to
/// −inf where either holds, and the mask also comes out as f32.
#[test]
fn attention_mask_chains_match_the_portable_kernels_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let f32s = |v: f32| FusedOp::Scalar { dtype: DType::F32, bits: u64::from(v.to_bits()) };
    let keys: Vec<i64> = (0..COLS as i64).collect();
    let lengths: Vec<i64> = (0..ROWS).map(|_| rng.gen_range(0..COLS as i64 + 2)).collect();
    let queries: Vec<i32> = (0..ROWS as i32).map(|r| r % COLS as i32).collect();
    let ops = || {
        [
            f32_operand(&mut rand::rngs::StdRng::seed_from_u64(24), InputMode::Full),
            Operand { dtype: DType::I64, data: keys.iter().flat_map(|v| v.to_le_bytes()).collect(), mode: ROW },
            Operand { dtype: DType::I64, data: lengths.iter().flat_map(|v| v.to_le_bytes()).collect(), mode: COLUMN },
            Operand { dtype: DType::I32, data: queries.iter().flat_map(|v| v.to_le_bytes()).collect(), mode: COLUMN },
        ]
    };
    // 4: keys >= lengths, 5: keys as i32, 6: keys > query, 7: either,
    // 8: 0.125, 9: scores · 0.125, 10: −inf, 11: the masked scores.
    let chain = [
        FusedOp::Binary { op: BinaryOp::Ge, a: 1, b: 2 },
        FusedOp::Cast { to: DType::I32, x: 1 },
        FusedOp::Binary { op: BinaryOp::Gt, a: 5, b: 3 },
        FusedOp::Binary { op: BinaryOp::Or, a: 4, b: 6 },
        f32s(0.125),
        FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 8 },
        f32s(f32::NEG_INFINITY),
        FusedOp::Where { cond: 7, a: 10, b: 9 },
    ];
    let masked = check_typed("masked scores", &chain, &ops(), DType::F32);
    // The chain must mask something and keep something.
    let ninf = masked.chunks_exact(4).filter(|c| f32::from_le_bytes((*c).try_into().unwrap()) == f32::NEG_INFINITY);
    assert!((1..ROWS * COLS).contains(&ninf.count()), "a mask that masks all or nothing");
    let mut as_f32 = chain[..4].to_vec();
    as_f32.push(FusedOp::Cast { to: DType::F32, x: 7 });
    check_typed("mask as f32", &as_f32, &ops(), DType::F32);
}

/// A masked softmax over bool masks: `where(mask, −inf, x · 0.125)` (a
/// bool `[rows, len]` operand) merges into the softmax after it as the row
/// function's prologue; the prologue's output is the unmerged fused
/// call's bytes on every level, the softmax's where the table's exp-sum is
/// AVX2 and the level has FMA, with native code and with it refused.
#[cfg(target_arch = "x86_64")]
#[test]
fn bool_masked_softmax_prologues_give_the_unfused_kernels_bits() {
    use kiln_compiler::native::{compile_plan, NativeTarget};
    use kiln_runtime::format::*;
    use kiln_runtime::{Program, SessionOptions, TensorView};
    let (rows, len) = (300u64, 40u64);
    let n = rows * len;
    let t = |dtype: DType, offset: u64| TensorDecl {
        dtype,
        shape: vec![DimRef::Static(rows), DimRef::Static(len)],
        storage: Storage::Arena { offset, max_bytes: n * dtype.size_bytes() as u64 },
    };
    // 0 x, 1 mask: inputs; 2 the masked scores, 3 their softmax.
    let tensors = vec![t(DType::F32, 0), t(DType::Bool, 4 * n), t(DType::F32, 5 * n), t(DType::F32, 9 * n)];
    let f32s = |v: f32| FusedOp::Scalar { dtype: DType::F32, bits: u64::from(v.to_bits()) };
    let masked = vec![
        f32s(0.125),
        FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 2 },
        f32s(f32::NEG_INFINITY),
        FusedOp::Where { cond: 1, a: 4, b: 3 },
    ];
    let call = |k: Kernel, inputs: Vec<u32>, out: u32| Instr {
        op: InstrOp::Call(k),
        inputs,
        outputs: vec![out],
        origin: "t".into(),
    };
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors,
        inputs: ["x", "mask"]
            .iter()
            .enumerate()
            .map(|(k, name)| IoDecl { name: (*name).into(), tensor: k as u32, complex: false })
            .collect(),
        outputs: [3u32, 2].iter().map(|&k| IoDecl { name: format!("y{k}"), tensor: k, complex: false }).collect(),
        instrs: vec![
            call(Kernel::Fused { program: masked }, vec![0, 1], 2),
            call(Kernel::Softmax { axis: 1, log: false }, vec![2], 3),
        ],
        arena_bytes: 13 * n,
        peak_live_bytes: 13 * n,
        states: vec![],
    };
    let mut merged = plan.clone();
    let target = NativeTarget::new(NativeArch::X86_64, None).unwrap();
    let section = compile_plan(&mut merged, &target).unwrap().expect("a row function");
    assert_eq!(merged.instrs.len(), 1, "{:?}", merged.instrs);
    assert!(matches!(&merged.instrs[0].op, InstrOp::NativeKernel { prologue: Some(p), .. } if p.inputs == 2));
    assert_eq!(section.functions[0].input_dtypes, [DType::F32, DType::Bool]);
    let load = |plan: &Plan, native: Option<&kiln_runtime::native::NativeSection>| {
        let mut w = ArtifactWriter::new(plan, WeightsBuilder::new(), &Metadata::default()).unwrap();
        if let Some(s) = native {
            w.add_native(s).unwrap();
        }
        Program::from_bytes(&w.to_bytes()).unwrap()
    };
    let (unfused, fused) = (load(&plan, None), load(&merged, Some(&section)));
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    let x: Vec<u8> = (0..n).flat_map(|_| ((rng.gen::<f32>() - 0.5) * 16.0).to_le_bytes()).collect();
    // Causal-style masks, never a whole row (each keeps its first element).
    let mask: Vec<u8> = (0..n).map(|i| u8::from(i % len > (i / len) % len)).collect();
    let shape = [rows as usize, len as usize];
    let run = |program: &std::sync::Arc<Program>, threads: usize, allow: bool| -> Vec<Vec<u8>> {
        let opts = SessionOptions { threads, allow_native_code: allow, ..SessionOptions::default() };
        let mut s = program.session_with(&opts).unwrap();
        let views = [
            TensorView { dtype: DType::F32, shape: &shape, data: &x },
            TensorView { dtype: DType::Bool, shape: &shape, data: &mask },
        ];
        let out = s.run(&views).unwrap();
        (0..2).map(|i| out.get(i).data.to_vec()).collect()
    };
    let want = run(&unfused, 1, false);
    let native = run(&fused, 1, true);
    assert!(native == run(&fused, 3, true), "1 vs 3 threads");
    assert!(run(&fused, 1, false) == want, "the fallback vs the unfused kernels");
    assert!(native[1] == want[1], "the masked scores");
    let avx2 = kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2"));
    if avx2 && cpu_runs(NativeArch::X86_64, "x86-64-v3") {
        assert!(native[0] == want[0], "the masked softmax");
    }
}

/// A hand-built plan of f32 tensors: the tensors at consecutive arena
/// offsets (each `[rows, len]`-style shape given), every tensor after the
/// `inputs` first a program output, and the calls.
#[cfg(target_arch = "x86_64")]
fn plan_of(
    shapes: &[&[u64]],
    inputs: usize,
    calls: Vec<(kiln_runtime::format::Kernel, Vec<u32>, u32)>,
) -> kiln_runtime::format::Plan {
    use kiln_runtime::format::*;
    let mut offset = 0;
    let tensors: Vec<TensorDecl> = shapes
        .iter()
        .map(|shape| {
            let bytes = shape.iter().product::<u64>() * 4;
            let t = TensorDecl {
                dtype: DType::F32,
                shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
                storage: Storage::Arena { offset, max_bytes: bytes },
            };
            offset += bytes.div_ceil(64) * 64;
            t
        })
        .collect();
    let io = |k: usize| IoDecl { name: format!("t{k}"), tensor: k as u32, complex: false };
    Plan {
        symbols: vec![],
        exprs: vec![],
        inputs: (0..inputs).map(io).collect(),
        outputs: (inputs..tensors.len()).map(io).collect(),
        tensors,
        instrs: calls
            .into_iter()
            .map(|(k, inputs, out)| Instr { op: InstrOp::Call(k), inputs, outputs: vec![out], origin: "t".into() })
            .collect(),
        arena_bytes: offset,
        peak_live_bytes: offset,
        states: vec![],
    }
}

/// The plan's instructions with a merged epilogue.
#[cfg(target_arch = "x86_64")]
fn epilogues(plan: &kiln_runtime::format::Plan) -> usize {
    use kiln_runtime::format::InstrOp;
    plan.instrs.iter().filter(|i| matches!(i.op, InstrOp::NativeKernel { epilogue: Some(_), .. })).count()
}

/// Elementwise epilogues merged into row functions (format 0.20), every
/// row kind: a ReLU and residual add after a layer norm, a broadcast mask
/// (the row result its second operand) after a softmax, a per-column scale
/// after an RMS norm whose result a later call also reads, `1/√(m² + ε)`
/// after a mean (the sum's four-rows-at-a-time path and its rest), a scale
/// after a max, a sum minus that max, a GELU after a layer norm, and a
/// residual add + layer norm + scale (prologue and epilogue in one row
/// function). `compile_plan` merges every pair; the outputs (the row
/// results included) are the unmerged native plan's bytes (the same
/// native code as two calls), the unmerged plan's on the portable kernels
/// wherever the ops are exact (all but the GELU; softmax where the table's
/// exp-sum is AVX2 and the level has FMA), the same at 1 and 3 threads,
/// and the fallback's with native code refused.
#[cfg(target_arch = "x86_64")]
#[test]
fn merged_epilogues_give_the_unfused_kernels_bits() {
    use kiln_compiler::native::{compile_plan, NativeTarget};
    use kiln_runtime::format::*;
    use kiln_runtime::{Program, SessionOptions, TensorView};
    let (rows, len) = (1003u64, 96u64);
    let (big, col, row1, vec1): (&[u64], &[u64], &[u64], &[u64]) = (&[rows, len], &[rows, 1], &[1, len], &[len]);
    // 0 a, 1 r, 2 gamma, 3 beta, 4 mask, 5 scale: inputs; 6..: results.
    let shapes = [
        big, big, vec1, vec1, row1, vec1, // inputs
        big, big, // 6 layer_norm(a), 7 relu(6) + r
        big, big, // 8 softmax(a), 9 mask · 8
        big, big, big, // 10 rms_norm(r), 11 10 · scale, 12 10 + 1 (a later reader)
        col, col, // 13 mean(a), 14 1/√(13² + ε)
        col, col, // 15 max(a), 16 15 · 0.5
        col, col, // 17 sum(r), 18 17 − 15
        big, big, // 19 layer_norm(r), 20 gelu(19)
        big, big, big, // 21 a + r, 22 layer_norm(21), 23 22 · 2
    ];
    let f32s = |v: f32| FusedOp::Scalar { dtype: DType::F32, bits: u64::from(v.to_bits()) };
    let bin = |op: BinaryOp, a: u32, b: u32| FusedOp::Binary { op, a, b };
    let relu_add = vec![FusedOp::Unary { op: UnaryOp::Relu, x: 0 }, bin(BinaryOp::Add, 2, 1)];
    let inv_norm = vec![
        bin(BinaryOp::Mul, 0, 0),
        f32s(1e-5),
        bin(BinaryOp::Add, 1, 2),
        FusedOp::Unary { op: UnaryOp::Sqrt, x: 3 },
        f32s(1.0),
        bin(BinaryOp::Div, 5, 4),
    ];
    let scale = |v: f32| vec![f32s(v), bin(BinaryOp::Mul, 0, 1)];
    let ln = |rank: u32| Kernel::LayerNorm { normalized_rank: rank, eps: 1e-5 };
    let reduce = |kind: ReduceKind| Kernel::Reduce { kind, axes: vec![1] };
    let fused = |program: Vec<FusedOp>| Kernel::Fused { program };
    let calls = vec![
        (ln(1), vec![0, 2, 3], 6),
        (fused(relu_add), vec![6, 1], 7),
        (Kernel::Softmax { axis: 1, log: false }, vec![0], 8),
        (Kernel::Binary { op: BinaryOp::Mul }, vec![4, 8], 9),
        (Kernel::RmsNorm { normalized_rank: 1, eps: 1e-6 }, vec![1, 2], 10),
        (Kernel::Binary { op: BinaryOp::Mul }, vec![10, 5], 11),
        (fused(vec![f32s(1.0), bin(BinaryOp::Add, 0, 1)]), vec![10], 12),
        (reduce(ReduceKind::Mean), vec![0], 13),
        (fused(inv_norm), vec![13], 14),
        (reduce(ReduceKind::Max), vec![0], 15),
        (fused(scale(0.5)), vec![15], 16),
        (reduce(ReduceKind::Sum), vec![1], 17),
        (Kernel::Binary { op: BinaryOp::Sub }, vec![17, 15], 18),
        (ln(1), vec![1], 19),
        (fused(vec![FusedOp::Unary { op: UnaryOp::Gelu, x: 0 }]), vec![19], 20),
        (Kernel::Binary { op: BinaryOp::Add }, vec![0, 1], 21),
        (ln(1), vec![21, 2, 3], 22),
        (fused(scale(2.0)), vec![22], 23),
    ];
    let plan = plan_of(&shapes, 6, calls);
    let target = NativeTarget::new(NativeArch::X86_64, None).unwrap();
    let mut merged = plan.clone();
    let section = compile_plan(&mut merged, &target).unwrap().expect("row functions");
    // Eight row calls, each with its epilogue; the later reader of the RMS
    // norm stays a call (an elementwise native one).
    assert_eq!((merged.instrs.len(), epilogues(&merged)), (9, 8), "{:#?}", merged.instrs);
    let both = &merged.instrs[8];
    assert!(
        matches!(&both.op, InstrOp::NativeKernel { prologue: Some(_), epilogue: Some(e), .. } if e.inputs == 0),
        "{both:?}"
    );
    assert_eq!(both.outputs, [22, 21, 23], "the kernel's, the prologue's, the epilogue's result");
    let mut unmerged = plan.clone();
    let plain = NativeTarget { row_epilogues: false, ..target.clone() };
    let unmerged_section = compile_plan(&mut unmerged, &plain).unwrap().expect("row functions");
    assert_eq!(epilogues(&unmerged), 0);
    let load = |plan: &Plan, native: Option<&kiln_runtime::native::NativeSection>| {
        let mut w = ArtifactWriter::new(plan, WeightsBuilder::new(), &Metadata::default()).unwrap();
        if let Some(s) = native {
            w.add_native(s).unwrap();
        }
        Program::from_bytes(&w.to_bytes()).unwrap()
    };
    let (portable, fused, unfused) =
        (load(&plan, None), load(&merged, Some(&section)), load(&unmerged, Some(&unmerged_section)));
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let data: Vec<Vec<u8>> = shapes[..6]
        .iter()
        .map(|s| (0..s.iter().product::<u64>()).flat_map(|_| ((rng.gen::<f32>() - 0.5) * 8.0).to_le_bytes()).collect())
        .collect();
    let dims: Vec<Vec<usize>> = shapes[..6].iter().map(|s| s.iter().map(|&d| d as usize).collect()).collect();
    let run = |program: &std::sync::Arc<Program>, threads: usize, allow: bool| -> Vec<Vec<u8>> {
        let opts = SessionOptions { threads, allow_native_code: allow, ..SessionOptions::default() };
        let mut s = program.session_with(&opts).unwrap();
        let views: Vec<TensorView<'_>> =
            data.iter().zip(&dims).map(|(data, shape)| TensorView { dtype: DType::F32, shape, data }).collect();
        let out = s.run(&views).unwrap();
        (0..out.len()).map(|i| out.get(i).data.to_vec()).collect()
    };
    let native = run(&fused, 1, true);
    assert_eq!(native.len(), shapes.len() - 6);
    assert!(native == run(&fused, 3, true), "1 vs 3 threads");
    let want = run(&portable, 1, false);
    assert!(run(&fused, 1, false) == want, "the fallback vs the unfused kernels");
    // Output k is tensor k + 6.
    for (k, (got, two_calls)) in native.iter().zip(run(&unfused, 1, true)).enumerate() {
        assert!(*got == two_calls, "tensor {}: merged vs the two native calls", k + 6);
    }
    let exact_softmax =
        kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2")) && cpu_runs(NativeArch::X86_64, "x86-64-v3");
    for (k, (got, want)) in native.iter().zip(&want).enumerate() {
        let t = k + 6;
        if t == 20 || (!exact_softmax && (t == 8 || t == 9)) {
            continue;
        }
        assert!(got == want, "tensor {t}: merged vs the portable kernels");
    }
}

/// Calls that must not merge as epilogues, each left as its own call: a
/// result shaped unlike the row result (a mean subtracted from its rows), a
/// program reading the row result twice, a call that is not the next
/// instruction, a result stored over the row call's operand, and a program
/// reading the prologue's result (written while it is read). The plans
/// still compile and load.
#[cfg(target_arch = "x86_64")]
#[test]
fn epilogues_merge_only_where_they_can() {
    use kiln_compiler::native::{compile_plan, NativeTarget};
    use kiln_runtime::format::*;
    let (rows, len) = (64u64, 32u64);
    let (big, col): (&[u64], &[u64]) = (&[rows, len], &[rows, 1]);
    let target = NativeTarget::new(NativeArch::X86_64, None).unwrap();
    let ln = Kernel::LayerNorm { normalized_rank: 1, eps: 1e-5 };
    let mul = Kernel::Binary { op: BinaryOp::Mul };
    let add = Kernel::Binary { op: BinaryOp::Add };
    let mean = Kernel::Reduce { kind: ReduceKind::Mean, axes: vec![1] };
    let relu = Kernel::Fused { program: vec![FusedOp::Unary { op: UnaryOp::Relu, x: 0 }] };
    // The add's result where the norm's operand was (dead by then): the
    // row function would write it while other rows are still read.
    let over_operand = {
        let mut p = plan_of(&[big, big, big, big], 2, vec![(ln.clone(), vec![0], 2), (add.clone(), vec![2, 1], 3)]);
        p.tensors[3].storage = p.tensors[0].storage;
        p
    };
    let cases: Vec<(&str, Plan, usize)> = vec![
        (
            "a mean subtracted from its rows",
            plan_of(
                &[big, col, big],
                1,
                vec![(mean, vec![0], 1), (Kernel::Binary { op: BinaryOp::Sub }, vec![0, 1], 2)],
            ),
            2,
        ),
        (
            "the row result read twice",
            plan_of(&[big, big, big], 1, vec![(ln.clone(), vec![0], 1), (mul, vec![1, 1], 2)]),
            2,
        ),
        (
            "a call in between",
            plan_of(
                &[big, big, big, big],
                1,
                vec![(ln.clone(), vec![0], 1), (relu, vec![0], 2), (add.clone(), vec![1, 2], 3)],
            ),
            3,
        ),
        ("a result over the row call's operand", over_operand, 2),
        (
            "the prologue's result read",
            plan_of(
                &[big, big, big, big, big],
                2,
                vec![(add.clone(), vec![0, 1], 2), (ln, vec![2], 3), (add, vec![3, 2], 4)],
            ),
            2,
        ),
    ];
    for (what, plan, instrs) in cases {
        let mut merged = plan.clone();
        let section = compile_plan(&mut merged, &target).unwrap().expect("native functions");
        assert_eq!((merged.instrs.len(), epilogues(&merged)), (instrs, 0), "{what}: {:#?}", merged.instrs);
        let mut w = ArtifactWriter::new(&merged, WeightsBuilder::new(), &Metadata::default()).unwrap();
        w.add_native(&section).unwrap();
        kiln_runtime::Program::from_bytes(&w.to_bytes()).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The elements of one level's result that differ from the portable
/// kernel's: `bad` by value, `nan_only` the count of NaNs of another sign
/// or payload.
struct HalfMismatches {
    level: String,
    bad: Vec<usize>,
    nan_only: usize,
}

/// Runs `program` over full operands of `n` elements natively (every
/// x86-64 level this CPU runs, two uneven ranges) and on the portable fused
/// kernel; returns, per level, the elements whose bytes differ (but for the
/// payload of a NaN made from two NaN operands). Compiles
/// for every aarch64 level too and has the runtime's loader check each
/// object (no symbol to resolve: no conversion libcall).
fn half_mismatches(what: &str, program: &[FusedOp], ops: &[(DType, Vec<u8>)], out: DType) -> Vec<HalfMismatches> {
    let n = ops[0].1.len() / ops[0].0.size_bytes();
    let shape = [n];
    let refs: Vec<TensorRef<'_>> = ops.iter().map(|(d, b)| TensorRef { dtype: *d, shape: &shape, data: b }).collect();
    let size = out.size_bytes();
    let mut want = vec![0u8; n * size];
    let mut cx = Context::new();
    kiln_kernels::fused(program, &refs, TensorMut { dtype: out, shape: &shape, data: &mut want }, &mut cx)
        .unwrap_or_else(|e| panic!("{what}: portable run: {e}"));
    let modes = vec![InputMode::Full; ops.len()];
    let dtypes: Vec<DType> = ops.iter().map(|o| o.0).collect();
    let func = program_to_mlir("kiln_test", program, &modes, &dtypes).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let module = format!("module {{\n{func}}}\n");
    let mut per_level = Vec::new();
    #[cfg(target_arch = "x86_64")]
    for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
        let obj = compile_module(&module, "x86_64-unknown-linux-gnu", level).unwrap_or_else(|e| panic!("{what}: {e}"));
        let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap_or_else(|e| panic!("{what} {level}: {e}"));
        // SAFETY: the generated function has the NativeFn ABI.
        let f: NativeFn = unsafe { std::mem::transmute(loaded.function("kiln_test").expect("function defined")) };
        let ptrs: Vec<*const u8> = ops.iter().map(|o| o.1.as_ptr()).collect();
        let mut got = vec![0xA5u8; n * size];
        let mid = n / 3 + 1;
        // SAFETY: every operand holds n elements, the output n elements of `out`.
        unsafe {
            f(ptrs.as_ptr(), got.as_mut_ptr(), 0, mid);
            f(ptrs.as_ptr(), got.as_mut_ptr(), mid, n);
        }
        let nans = |i: usize| is_half_nan(out, &got[i * size..]) && is_half_nan(out, &want[i * size..]);
        let differs = |i: usize| {
            // Two NaN operands: which payload an add or multiply returns is
            // the compiler's choice (it may commute them), in the kernels too.
            let nan_pair = ops.len() == 2 && ops.iter().all(|(d, b)| is_half_nan(*d, &b[2 * i..2 * i + 2]));
            got[i * size..(i + 1) * size] != want[i * size..(i + 1) * size] && !(nan_pair && nans(i))
        };
        let (nan_only, bad): (Vec<usize>, Vec<usize>) = (0..n).filter(|&i| differs(i)).partition(|&i| nans(i));
        if std::env::var_os("KILN_HALF_DEBUG").is_some() {
            for &i in bad.iter().take(12) {
                let operand = |(d, b): &(DType, Vec<u8>)| b[i * d.size_bytes()..(i + 1) * d.size_bytes()].to_vec();
                let operands: Vec<Vec<u8>> = ops.iter().map(operand).collect();
                eprintln!(
                    "{what} {level}: {i} {operands:x?} native {:x?} portable {:x?}",
                    &got[i * size..(i + 1) * size],
                    &want[i * size..(i + 1) * size]
                );
            }
        }
        per_level.push(HalfMismatches { level: level.to_string(), bad, nan_only: nan_only.len() });
    }
    for level in AARCH64_LEVELS {
        let obj = compile_module(&module, "aarch64-unknown-linux-gnu", level).unwrap_or_else(|e| panic!("{what}: {e}"));
        let names = LoadedObject::check(&obj, Arch::Aarch64).unwrap_or_else(|e| panic!("{what} {level}: {e}"));
        assert_eq!(names, ["kiln_test"], "{what} {level}");
    }
    per_level
}

/// Whether `bytes` hold a NaN of half type `dtype` (false for other dtypes).
fn is_half_nan(dtype: DType, bytes: &[u8]) -> bool {
    let bits = u16::from_le_bytes([bytes[0], bytes.get(1).copied().unwrap_or(0)]) & 0x7FFF;
    match dtype {
        DType::F16 => bits > 0x7C00,
        DType::BF16 => bits > 0x7F80,
        _ => false,
    }
}

/// [`half_mismatches`], asserting none (the first one shown with its operands).
fn check_half_exact(what: &str, program: &[FusedOp], ops: &[(DType, Vec<u8>)], out: DType) {
    for HalfMismatches { level, bad, nan_only } in half_mismatches(what, program, ops, out) {
        assert_eq!(nan_only, 0, "{what} {level}: NaNs of another sign or payload");
        if let Some(&i) = bad.first() {
            let operand = |(d, b): &(DType, Vec<u8>)| b[i * d.size_bytes()..(i + 1) * d.size_bytes()].to_vec();
            let operands: Vec<Vec<u8>> = ops.iter().map(operand).collect();
            panic!("{what} {level}: {} elements differ, the first {i} (operand bytes {operands:?})", bad.len());
        }
    }
}

/// Every 16-bit pattern: each f16 / bf16 value, NaNs (quiet, signalling,
/// both signs, payloads), infinities, subnormals and ±0 included.
fn every_half() -> Vec<u8> {
    (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect()
}

/// Second operands for the binary ops: every pattern against a shuffled
/// copy of every pattern, then the special values against each other.
fn half_pairs(rng: &mut rand::rngs::StdRng, ty: DType) -> (Vec<u8>, Vec<u8>) {
    let mut b: Vec<u16> = (0..=u16::MAX).collect();
    for i in (1..b.len()).rev() {
        b.swap(i, rng.gen_range(0..=i));
    }
    let mut a: Vec<u16> = (0..=u16::MAX).collect();
    let special: &[u16] = if ty == DType::F16 {
        // ±0, ±inf, NaNs, the smallest and largest subnormal, the smallest
        // normal, the largest finite, 1, 1 + ulp, 2, 0.5, 3, 65504's neighbour.
        &[
            0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF,
            0xFBFF, 0x3C00, 0x3C01, 0x4000, 0x3800, 0x4200, 0x7BFE,
        ]
    } else {
        &[
            0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FA5, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F,
            0xFF7F, 0x3F80, 0x3F81, 0x4000, 0x3F00, 0x4040, 0x7F7E,
        ]
    };
    for &x in special {
        for &y in special {
            a.push(x);
            b.push(y);
        }
    }
    let bytes = |v: &[u16]| v.iter().flat_map(|h| h.to_le_bytes()).collect();
    (bytes(&a), bytes(&b))
}

/// f32 values whose rounding to a half type is hard: around every tie of
/// every f16 / bf16 binade (the tie, one ulp either side, the tie plus each
/// of the f32's three lowest bits — which `half`'s f64 conversion used to
/// leave out of its sticky bit), subnormals of both, overflow to inf, NaN
/// payloads.
fn rounding_cases(rng: &mut rand::rngs::StdRng) -> Vec<u8> {
    let mut v: Vec<u32> = Vec::new();
    for exp in 0u32..=255 {
        for _ in 0..24 {
            let m: u32 = rng.gen_range(0..1 << 23);
            for tie in [1u32 << 12, 1 << 15] {
                let t = (m & !(2 * tie - 1)) | tie;
                for d in [0u32, 1, 2, 4, 7, 8, tie - 1, tie + 1] {
                    for bits in [t.wrapping_add(d), t.wrapping_sub(d)] {
                        let bits = (exp << 23) | (bits & 0x7F_FFFF);
                        v.push(bits);
                        v.push(bits | 0x8000_0000);
                    }
                }
            }
            v.push((exp << 23) | m);
        }
    }
    // Subnormal f32s with leading bits 20 to 22, f16 subnormal ties,
    // overflow around 65520, NaNs.
    for lead in [20u32, 21, 22] {
        for low in 0..8 {
            v.push((1 << lead) | 0x8000 | low);
            v.push((1 << lead) | 0x18000 | low);
        }
    }
    for k in 0u32..2048 {
        v.push(f32::to_bits(k as f32 * 2f32.powi(-25)));
    }
    for bits in [0x477F_EFFF, 0x477F_F000, 0x477F_F001, 0x4780_0000, 0x7F80_0001, 0xFFC0_1234, 0x7FBF_FFFF, 0x7F7F_FFFF]
    {
        v.push(bits);
    }
    v.iter().flat_map(|b| b.to_le_bytes()).collect()
}

/// f16 and bf16 operands and results: every exact op (add, sub, mul, div,
/// min, max, neg, abs, relu, sqrt, reciprocal, the rounding ops, sign, the
/// comparisons, where, clamp, every cast among f32, bool, i32, i64, f16 and
/// bf16) widened to f32 and rounded back after each op, with the kernels'
/// conversions (integer sequences in the object: no libcall): the
/// portable kernels' bytes over every 16-bit pattern (NaNs, infinities,
/// subnormals, ties), at every x86-64 level this CPU runs.
#[test]
fn half_operands_and_results_match_the_portable_kernels_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let f32_cases = rounding_cases(&mut rng);
    for ty in [DType::F16, DType::BF16] {
        let all = every_half();
        let one = |data: &Vec<u8>| vec![(ty, data.clone())];
        for op in [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Relu,
            UnaryOp::Sqrt,
            UnaryOp::Reciprocal,
            UnaryOp::Floor,
            UnaryOp::Ceil,
            UnaryOp::Trunc,
            UnaryOp::Round,
            UnaryOp::Sign,
        ] {
            check_half_exact(&format!("{ty} {op}"), &[FusedOp::Unary { op, x: 0 }], &one(&all), ty);
        }
        let (a, b) = half_pairs(&mut rng, ty);
        let two = vec![(ty, a.clone()), (ty, b.clone())];
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Min, BinaryOp::Max] {
            check_half_exact(&format!("{ty} {op}"), &[FusedOp::Binary { op, a: 0, b: 1 }], &two, ty);
        }
        for op in COMPARISONS {
            check_half_exact(&format!("{ty} {op}"), &[FusedOp::Binary { op, a: 0, b: 1 }], &two, DType::Bool);
        }
        // where(a < b, a, b) moves bits (a signalling NaN stays one).
        let w = [FusedOp::Binary { op: BinaryOp::Lt, a: 0, b: 1 }, FusedOp::Where { cond: 2, a: 0, b: 1 }];
        check_half_exact(&format!("{ty} where"), &w, &two, ty);
        // Clamps: the bounds rounded to the half type, NaN passed through.
        for (min, max) in [(Some(0.0), Some(6.0)), (Some(-1.0), None), (None, Some(0.1)), (Some(3.0), Some(-3.0))] {
            let c = [FusedOp::Clamp { min, max, x: 0 }];
            check_half_exact(&format!("{ty} clamp({min:?}, {max:?})"), &c, &one(&all), ty);
        }
        // A chain rounding after every op: (a·b + a) / b − 0.1, as the half type.
        let s = |v: f32| FusedOp::Scalar {
            dtype: ty,
            bits: u64::from(if ty == DType::F16 {
                half::f16::from_f32(v).to_bits()
            } else {
                half::bf16::from_f32(v).to_bits()
            }),
        };
        let chain = [
            FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 1 },
            FusedOp::Binary { op: BinaryOp::Add, a: 2, b: 0 },
            FusedOp::Binary { op: BinaryOp::Div, a: 3, b: 1 },
            s(0.1),
            FusedOp::Binary { op: BinaryOp::Sub, a: 4, b: 5 },
        ];
        check_half_exact(&format!("{ty} chain"), &chain, &two, ty);
        // Casts: from every pattern to every dtype, from hard f32s, from
        // ints (f16 overflows to inf; bf16 takes the f64 rule) and bools.
        for to in [DType::F32, DType::Bool, DType::I32, DType::I64, DType::F16, DType::BF16] {
            check_half_exact(&format!("{ty} to {to}"), &[FusedOp::Cast { to, x: 0 }], &one(&all), to);
        }
        check_half_exact(
            &format!("f32 to {ty}"),
            &[FusedOp::Cast { to: ty, x: 0 }],
            &[(DType::F32, f32_cases.clone())],
            ty,
        );
        let ints: Vec<i64> = (0..4096i64)
            .map(|i| match i % 4 {
                0 => i - 2048,
                1 => rng.gen_range(-70_000..70_000),
                2 => rng.gen::<i64>() >> rng.gen_range(0..63),
                _ => ((1i64 << rng.gen_range(8..62)) + rng.gen_range(-3..4)) * if i % 8 == 3 { -1 } else { 1 },
            })
            .chain([i64::MIN, i64::MAX, i32::MIN as i64, i32::MAX as i64, 65504, 65519, 65520, 65535, 65536])
            .collect();
        let i64s: Vec<u8> = ints.iter().flat_map(|v| v.to_le_bytes()).collect();
        let i32s: Vec<u8> = ints.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
        check_half_exact(&format!("i64 to {ty}"), &[FusedOp::Cast { to: ty, x: 0 }], &[(DType::I64, i64s)], ty);
        check_half_exact(&format!("i32 to {ty}"), &[FusedOp::Cast { to: ty, x: 0 }], &[(DType::I32, i32s)], ty);
        let bools: Vec<u8> = (0..1037).map(|i| (i % 3 == 0) as u8).collect();
        check_half_exact(&format!("bool to {ty}"), &[FusedOp::Cast { to: ty, x: 0 }], &[(DType::Bool, bools)], ty);
    }
}

/// The f32 math ops on f16 / bf16 (exp, tanh, GELU, log, …): the native
/// f32 code then one rounding, over every 16-bit pattern. The native f32
/// results are the kernel table's polynomials (within an ulp or so of the
/// kernels' libm for the log family), and rounding to the half type hides
/// those differences: on an AVX2 + FMA CPU (the kernels' AVX2 / AVX-512
/// table) no value differs at any level. Only NaN signs do: log, log2,
/// log1p, asin, acos, acosh and atanh outside their domains are the
/// positive quiet NaN here and x86's negative default NaN from glibc
/// (ISA-dependent in the kernels: AArch64's default NaN is positive). Counts are printed for the record; elsewhere
/// at most 1 in 1000 values may differ.
#[test]
fn half_math_ops_round_to_the_portable_kernels_bits() {
    let ops = [
        UnaryOp::Exp,
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::Tanh,
        UnaryOp::GeluTanh,
        UnaryOp::Erf,
        UnaryOp::Gelu,
        UnaryOp::Rsqrt,
        UnaryOp::Log,
        UnaryOp::Log2,
        UnaryOp::Log10,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Atan,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
    ];
    let avx2_table = cpu_runs(NativeArch::X86_64, "x86-64-v3");
    let all = every_half();
    let mut failed = Vec::new();
    for ty in [DType::F16, DType::BF16] {
        for op in ops {
            let (what, p) = (format!("{ty} {op}"), [FusedOp::Unary { op, x: 0 }]);
            if ty == DType::F16 && op == UnaryOp::Asinh {
                // 4 of 65536 values round unlike glibc's asinhf: refused.
                assert!(program_to_mlir("f", &p, &[InputMode::Full], &[ty]).is_err(), "{what}");
                continue;
            }
            for HalfMismatches { level, bad, nan_only } in half_mismatches(&what, &p, &[(ty, all.clone())], ty) {
                eprintln!("{what} {level}: {} of 65536 values differ, {nan_only} NaN signs", bad.len());
                let bound = if avx2_table { 0 } else { 65 };
                if bad.len() > bound {
                    failed.push(format!("{what} {level}: {} values differ (the first {:?})", bad.len(), bad.first()));
                }
            }
        }
        // pow and atan2 (f64 evaluations, glibc in the kernels) stay portable.
        for op in [BinaryOp::Pow, BinaryOp::Atan2, BinaryOp::Nextafter] {
            let p = [FusedOp::Binary { op, a: 0, b: 1 }];
            assert!(program_to_mlir("f", &p, &[InputMode::Full; 2], &[ty, ty]).is_err(), "{ty} {op}");
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// An i32 or i64 operand holding `values` (a splat when there is one).
fn ints(dtype: DType, values: &[i64], mode: InputMode) -> Operand {
    let data = if dtype == DType::I32 {
        values.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
    } else {
        values.iter().flat_map(|&x| x.to_le_bytes()).collect()
    };
    Operand { dtype, data, mode }
}

/// An integer operand in `mode` with every 0 made 3: a divisor.
fn nonzero_int_operand(rng: &mut rand::rngs::StdRng, dtype: DType, mode: InputMode) -> Operand {
    let o = int_operand(rng, dtype, mode);
    let size = dtype.size_bytes();
    let data = o
        .data
        .chunks(size)
        .flat_map(|c| {
            let mut c = c.to_vec();
            if c.iter().all(|&b| b == 0) {
                c[0] = 3;
            }
            c
        })
        .collect();
    Operand { data, ..o }
}

/// Integer floor division, Python's and C's remainders on i32 and i64
/// (`//`, `%`, `fmod`; `div(rounding_mode='trunc')` as the importer writes
/// it, `(a − fmod(a, b)) // b`): negative operands of every sign
/// combination, the type's extremes, `MIN / −1` (wrapping to MIN,
/// remainder 0, where x86's `idiv` traps), divisors of ±1, MIN and MAX
/// read in every mode: the portable kernels' bytes, and no zero divisor
/// reported.
#[test]
fn integer_division_matches_the_portable_kernels_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    for ty in [DType::I32, DType::I64] {
        let x = int_operand(&mut rng, ty, InputMode::Full);
        let mut y = nonzero_int_operand(&mut rng, ty, InputMode::Full);
        y.data.rotate_left(ty.size_bytes() * 2);
        let copy = |o: &Operand| Operand { data: o.data.clone(), ..*o };
        let min = if ty == DType::I32 { i32::MIN as i64 } else { i64::MIN };
        let trunc_div = [
            FusedOp::Binary { op: BinaryOp::Fmod, a: 0, b: 1 },
            FusedOp::Binary { op: BinaryOp::Sub, a: 0, b: 2 },
            FusedOp::Binary { op: BinaryOp::FloorDiv, a: 3, b: 1 },
        ];
        for op in [BinaryOp::FloorDiv, BinaryOp::Rem, BinaryOp::Fmod] {
            let p = [FusedOp::Binary { op, a: 0, b: 1 }];
            check_typed(&format!("{ty} {op}"), &p, &[copy(&x), copy(&y)], ty);
            for d in [-1, 1, min, !min, 7, -8] {
                let s = ints(ty, &[d], InputMode::Splat);
                check_typed(&format!("{ty} {op} by {d}"), &p, &[copy(&x), s], ty);
            }
            let r = nonzero_int_operand(&mut rng, ty, ROW);
            check_typed(&format!("{ty} {op} row"), &p, &[copy(&x), r], ty);
            let c = nonzero_int_operand(&mut rng, ty, COLUMN);
            check_typed(&format!("{ty} {op} column"), &p, &[copy(&y), c], ty);
        }
        check_typed(&format!("{ty} trunc div"), &trunc_div, &[copy(&x), copy(&y)], ty);
        let s = ints(ty, &[-1], InputMode::Splat);
        check_typed(&format!("{ty} trunc div by -1"), &trunc_div, &[copy(&x), s], ty);
        // Every sign combination of small operands, in full.
        let vals: Vec<i64> = (0..ROWS * COLS).map(|i| (i % 23) as i64 - 11).collect();
        let divs: Vec<i64> = (0..ROWS * COLS).map(|i| [-7, -3, -2, -1, 1, 2, 3, 5][(i / 23) % 8]).collect();
        for op in [BinaryOp::FloorDiv, BinaryOp::Rem, BinaryOp::Fmod] {
            let p = [FusedOp::Binary { op, a: 0, b: 1 }];
            let ops = [ints(ty, &vals, InputMode::Full), ints(ty, &divs, InputMode::Full)];
            check_typed(&format!("{ty} {op} signs"), &p, &ops, ty);
        }
    }
}

/// A zero divisor, read or computed: the native function reports it (1 for
/// the range holding it, 0 for the others) and the portable kernel fails
/// with "integer division by zero"; a program with no integer division
/// cannot fail (its function returns nothing).
#[cfg(target_arch = "x86_64")]
#[test]
fn a_zero_divisor_is_reported_where_the_kernel_fails() {
    let n = ROWS * COLS;
    for ty in [DType::I32, DType::I64] {
        let x: Vec<i64> = (0..n as i64).map(|i| i - 500).collect();
        let mut y: Vec<i64> = (0..n as i64).map(|i| (i % 9) + 1).collect();
        y[700] = 0;
        // x // y, and x % (y − 1): a zero computed from nonzero operands.
        let programs = [
            vec![FusedOp::Binary { op: BinaryOp::FloorDiv, a: 0, b: 1 }],
            vec![
                FusedOp::scalar(ty, &1i64.to_le_bytes()[..ty.size_bytes()]).unwrap(),
                FusedOp::Binary { op: BinaryOp::Sub, a: 1, b: 2 },
                FusedOp::Binary { op: BinaryOp::Rem, a: 0, b: 3 },
            ],
        ];
        for (k, p) in programs.iter().enumerate() {
            let ops = [ints(ty, &x, InputMode::Full), ints(ty, &y, InputMode::Full)];
            let shapes = [[ROWS, COLS], [ROWS, COLS]];
            let refs: Vec<TensorRef<'_>> =
                ops.iter().zip(&shapes).map(|(o, s)| TensorRef { dtype: o.dtype, shape: s, data: &o.data }).collect();
            let mut want = vec![0u8; n * ty.size_bytes()];
            let out = TensorMut { dtype: ty, shape: &[ROWS, COLS], data: &mut want };
            let err = kiln_kernels::fused(p, &refs, out, &mut Context::new()).expect_err("the kernel fails");
            assert!(err.to_string().contains("integer division by zero"), "{err}");
            let modes = [InputMode::Full; 2];
            let (func, can_fail) = program_function("kiln_test", p, &modes, &[ty, ty]).unwrap();
            assert!(can_fail && func.contains("-> i32"), "{func}");
            let module = format!("module {{\n{func}}}\n");
            // The zero sits at 700 in the first program, wherever y is 1 in the second.
            let (clean, dirty) = if k == 0 { ((0, 700), (650, 701)) } else { ((1, 9), (0, 1)) };
            for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
                let obj = compile_module(&module, "x86_64-unknown-linux-gnu", level).unwrap();
                let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap();
                let f = loaded.function("kiln_test").unwrap();
                let ptrs: Vec<*const u8> = ops.iter().map(|o| o.data.as_ptr()).collect();
                let mut got = vec![0u8; n * ty.size_bytes()];
                // SAFETY: a fallible function; the operands and output hold n elements.
                let status = |(s, e): (usize, usize), got: &mut [u8]| unsafe {
                    call(f, true, ptrs.as_ptr(), got.as_mut_ptr(), s, e)
                };
                assert_eq!(status(clean, &mut got), 0, "{ty} program {k} {level}: {clean:?} has no zero divisor");
                assert_eq!(status(dirty, &mut got), 1, "{ty} program {k} {level}: {dirty:?} has one");
                assert_eq!(status((0, n), &mut got), 1, "{ty} program {k} {level}: the whole range has one");
            }
        }
    }
    let (_, can_fail) = program_function(
        "f",
        &[FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 1 }],
        &[InputMode::Full; 2],
        &[DType::I64; 2],
    )
    .unwrap();
    assert!(!can_fail, "a multiply cannot fail");
}

/// f32 values for fmod / remainder / floor_divide: the special ones (±0,
/// ±inf, NaNs with payloads and signs, a signalling NaN, subnormals, the
/// extremes, small integers and fractions), then any finite f32 (uniform
/// over the bit patterns), values within a few binades of each other, and
/// small integers.
#[cfg(target_arch = "x86_64")]
fn division_values(rng: &mut rand::rngs::StdRng, n: usize, salt: u32) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0xFFC0_0000),
        f32::from_bits(0x7FC1_2345 + salt),
        f32::from_bits(0xFF80_0001 + salt),
        1.0,
        -1.0,
        1.5,
        -2.5,
        3.0,
        -3.0,
        0.1,
        -0.1,
        std::f32::consts::PI,
        1e-45,
        -1e-45,
        3e-39,
        -1.1754942e-38,
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        1e38,
        16777216.0,
        16777217.0,
        -7.0,
    ];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            let v = match i % 4 {
                0 => f32::from_bits(rng.gen_range(0..0x7F80_0000u32)),
                1 => rng.gen_range(0.5f32..2.0) * 2f32.powi(rng.gen_range(-30..30)),
                2 => rng.gen_range(-20i32..20) as f32,
                _ => f32::from_bits(rng.gen_range(0..0x0100_0000u32)),
            };
            if rng.gen::<bool>() {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// Runs the f32 binary `op` natively on every x86-64 level this CPU runs
/// and portably over `a` and `b` (shaped alike), asserting the same bits.
#[cfg(target_arch = "x86_64")]
fn check_f32_binary_bits(op: BinaryOp, a: &[f32], b: &[f32]) {
    let n = a.len();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ab, bb) = (bytes(a), bytes(b));
    let shape = [n];
    let refs = [
        TensorRef { dtype: DType::F32, shape: &shape, data: &ab },
        TensorRef { dtype: DType::F32, shape: &shape, data: &bb },
    ];
    let program = [FusedOp::Binary { op, a: 0, b: 1 }];
    let mut want = vec![0u8; n * 4];
    let out = TensorMut { dtype: DType::F32, shape: &shape, data: &mut want };
    kiln_kernels::fused(&program, &refs, out, &mut Context::new()).expect("portable run");
    let modes = [InputMode::Full; 2];
    let (func, can_fail) = program_function("kiln_test", &program, &modes, &[DType::F32; 2]).unwrap();
    assert!(!can_fail, "f32 {op} cannot fail");
    let module = format!("module {{\n{func}}}\n");
    for level in X86_64_LEVELS.iter().filter(|l| cpu_runs(NativeArch::X86_64, l)) {
        let obj = compile_module(&module, "x86_64-unknown-linux-gnu", level).unwrap();
        let loaded = LoadedObject::load(&obj, Arch::X86_64).unwrap();
        let f = loaded.function("kiln_test").unwrap();
        let ptrs = [ab.as_ptr(), bb.as_ptr()];
        let mut got = vec![0u8; n * 4];
        // SAFETY: the function's ABI; both operands and the output hold n f32s.
        unsafe {
            call(f, false, ptrs.as_ptr(), got.as_mut_ptr(), 0, n / 3);
            call(f, false, ptrs.as_ptr(), got.as_mut_ptr(), n / 3, n);
        }
        let word = |v: &[u8], i: usize| u32::from_le_bytes(v[4 * i..4 * i + 4].try_into().unwrap());
        if let Some(i) = (0..n).find(|&i| word(&got, i) != word(&want, i)) {
            panic!(
                "f32 {op} {level}: element {i}, {:e} ({:#010x}) and {:e} ({:#010x}): native {:#010x}, portable {:#010x}",
                a[i],
                a[i].to_bits(),
                b[i],
                b[i].to_bits(),
                word(&got, i),
                word(&want, i)
            );
        }
    }
    for level in AARCH64_LEVELS {
        let obj = compile_module(&module, "aarch64-unknown-linux-gnu", level).unwrap();
        LoadedObject::check(&obj, Arch::Aarch64).unwrap_or_else(|e| panic!("f32 {op} {level}: {e}"));
    }
}

/// f32 `fmod` (libm's `fmodf` in the kernels: exact), torch's `remainder`
/// and `floor_divide`: every special value against every other (NaN
/// payloads and signs, ±0, ±inf, subnormals, the extremes), exponent gaps
/// up to the largest (`f32::MAX` by the smallest subnormal), operands a few
/// binades apart and random bit patterns: the portable kernels' bits.
#[cfg(target_arch = "x86_64")]
#[test]
fn fmod_remainder_and_floor_divide_match_the_portable_kernels_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    let special = division_values(&mut rng, 28, 0);
    let (mut a, mut b): (Vec<f32>, Vec<f32>) =
        special.iter().flat_map(|&u| special.iter().map(move |&v| (u, v))).unzip();
    a.extend(division_values(&mut rng, 40_000, 1));
    b.extend(division_values(&mut rng, 40_000, 2));
    for op in [BinaryOp::Fmod, BinaryOp::Rem, BinaryOp::FloorDiv] {
        check_f32_binary_bits(op, &a, &b);
    }
}
