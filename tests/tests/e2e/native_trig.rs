//! sin, cos and tan in native fused groups: a RoPE-style rotation
//! `x·cos θ + y·sin θ` (θ full-shaped and per-row broadcast) and `tan θ · x`,
//! compiled with `--target x86_64` and with `--target cpu`, give the same
//! bits over angles from 0 and ±0 through every binade to f32::MAX, the
//! hard cases next to multiples of π/2, ±1e6, ±inf and NaN — the emitter
//! computes glibc's sinf/cosf/tanf operation for operation, as the
//! portable kernels call them. Needs feature `native` (MLIR/LLVM 19).
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use kiln_compiler::native::NativeTarget;
use kiln_compiler::{compile_graph, CompileOptions};
use kiln_runtime::format::InstrOp;
use kiln_runtime::native::NativeArch;
use kiln_runtime::{Program, SessionOptions, Tensor, TensorView};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const ROWS: usize = 128;
const COLS: usize = 96;

const GRAPH: &str = "graph {
  input %0 \"x\": f32[128, 96]
  input %1 \"y\": f32[128, 96]
  input %2 \"theta\": f32[128, 96]
  input %3 \"row_theta\": f32[128, 1]
  %4: f32[128, 96] = cos(%2)
  %5: f32[128, 96] = mul(%0, %4)
  %6: f32[128, 96] = sin(%2)
  %7: f32[128, 96] = mul(%1, %6)
  %8: f32[128, 96] = add(%5, %7)
  output %8 \"rope\"
  %9: f32[128, 1] = cos(%3)
  %10: f32[128, 96] = mul(%0, %9)
  %11: f32[128, 1] = sin(%3)
  %12: f32[128, 96] = mul(%1, %11)
  %13: f32[128, 96] = sub(%10, %12)
  output %13 \"rope_rows\"
  %14: f32[128, 96] = tan(%2)
  %15: f32[128, 96] = mul(%14, %0)
  output %15 \"tan\"
}";

/// The artifact of [`GRAPH`], with native code for `native`'s ISA.
pub(crate) fn compile_bytes(native: Option<NativeTarget>) -> Vec<u8> {
    let g = kiln_ir::text::parse(GRAPH).unwrap_or_else(|e| panic!("{e}"));
    let opts = CompileOptions { native, ..CompileOptions::default() };
    let (writer, _) = compile_graph(g, &opts, Default::default()).expect("compile");
    writer.to_bytes()
}

fn compile(native: Option<NativeTarget>) -> Arc<Program> {
    Program::from_bytes(&compile_bytes(native)).expect("load")
}

/// Angles: the special values first, then every binade (the large
/// reduction past 120), float neighbours of k·π/2, ±1e6 and small ones.
fn angles(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e6,
        -1e6,
        f32::MAX,
        f32::MIN,
        1e-45,
        120.0,
        std::f32::consts::FRAC_PI_2,
    ];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            let v = match i % 4 {
                0 => f32::from_bits(rng.gen_range(0..0x7F80_0000u32)),
                1 => {
                    // Below 120 (k < 77) the one-step reduction, above it the integer one.
                    let k = if i % 8 == 1 { rng.gen_range(1..77i64) } else { rng.gen_range(1..2_000_000i64) };
                    let near = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
                    f32::from_bits((near.to_bits() as i64 + rng.gen_range(-1i64..=1)) as u32)
                }
                2 => rng.gen_range(-1e6f32..1e6),
                _ => rng.gen_range(-4.0f32..4.0),
            };
            if i % 3 == 0 {
                -v
            } else {
                v
            }
        })
        .collect()
}

pub(crate) fn run(program: &Arc<Program>, inputs: &[Tensor]) -> Vec<Vec<u8>> {
    let opts = SessionOptions { threads: 2, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).expect("session");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).expect("run");
    (0..outputs.len()).map(|i| outputs.get(i).data.to_vec()).collect()
}

/// [`GRAPH`]'s inputs (x, y, θ, per-row θ).
pub(crate) fn inputs() -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    let n = ROWS * COLS;
    let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
    let theta = angles(&mut rng, n);
    let row_theta = angles(&mut rng, ROWS);
    vec![
        Tensor::from_f32(&[ROWS, COLS], &x),
        Tensor::from_f32(&[ROWS, COLS], &y),
        Tensor::from_f32(&[ROWS, COLS], &theta),
        Tensor::from_f32(&[ROWS, 1], &row_theta),
    ]
}

/// Asserts [`GRAPH`]'s outputs `got` and `want` (raw bytes) are the same
/// bits, any NaN matching any NaN.
pub(crate) fn assert_same_bits(what: &str, inputs: &[Tensor], got: &[Vec<u8>], want: &[Vec<u8>]) {
    let (theta, row_theta) = (inputs[2].to_f32().expect("f32"), inputs[3].to_f32().expect("f32"));
    assert_eq!(got.len(), 3, "{what}: number of outputs");
    for (k, name) in ["rope", "rope_rows", "tan"].iter().enumerate() {
        for (i, (g, w)) in got[k].chunks_exact(4).zip(want[k].chunks_exact(4)).enumerate() {
            let (g, w) = (f32::from_le_bytes(g.try_into().unwrap()), f32::from_le_bytes(w.try_into().unwrap()));
            let angle = if k == 1 { row_theta[i / COLS] } else { theta[i] };
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{what}: {name}[{i}] (θ = {angle:e}): {g:e}, want {w:e}"
            );
        }
    }
}

#[test]
fn rope_and_tan_groups_match_the_portable_kernels_bit_for_bit() {
    let native = compile(Some(NativeTarget::new(NativeArch::X86_64, None).expect("default levels")));
    let portable = compile(None);
    let natives = native.plan().instrs.iter().filter(|i| matches!(i.op, InstrOp::Native { .. })).count();
    assert!(natives >= 3, "the rotation and tan groups run as native code ({natives} native calls)");
    let inputs = inputs();
    assert_same_bits("native vs portable", &inputs, &run(&native, &inputs), &run(&portable, &inputs));
}
