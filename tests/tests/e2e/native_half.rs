//! f16 and bf16 tensors in native groups (`compiler/src/native/emit/half.rs`):
//! the `native_half` fixture (an f16 bias + GELU + scaled residual, a
//! where / clamp / relu branch, a bf16 residual + GELU-tanh + SiLU gate, and
//! casts among f16, bf16, f32 and a bool mask) compiled with `--target
//! x86_64`: every instruction but the views is native, with f16 and bf16
//! operands and results; the outputs match PyTorch (exactly where every op
//! is exact, within torch's f16/bf16 tolerance where GELU and SiLU are
//! torch's own algorithms), with native code and with it refused, at 1 and
//! 4 threads bit-identically, and are the portable kernels' bytes — and
//! `--target cpu`'s — where the ops are exact, everywhere on a CPU whose
//! kernel table is the AVX2 one (the math ops round to the same halves:
//! `native_codegen::half_math_ops_round_to_the_portable_kernels_bits`).
//! Needs feature `native`.
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use crate::native_common::{assert_native_dtypes, bytes, not_native, run};
use kiln_compiler::native::NativeTarget;
use kiln_runtime::native::NativeArch;
use kiln_runtime::{DType, Program, Tensor};
use kiln_tests::{assert_close, default_tolerance, fixture_dir, read_npy_as, FLAVOURS};

fn compile(flavour: &str, native: Option<NativeTarget>) -> std::sync::Arc<Program> {
    crate::native_common::compile("native_half", flavour, native)
}

/// `prefix_0.npy, …` of the fixture, bf16 bits stored as `<u2` read as bf16.
fn numbered(prefix: &str) -> Vec<Tensor> {
    let dir = fixture_dir("native_half");
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy_as(&p, true).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The elements (2-byte halves or 4-byte floats) where `a` and `b` differ
/// in bits, but for NaN against NaN: torch's NaN signs and payloads
/// (which NaN operand an add returns, the sign of `-x`) are its compiler's.
pub fn differing(a: &Tensor, b: &Tensor) -> Vec<usize> {
    let size = a.dtype.size_bytes();
    let is_nan = |e: &[u8]| match a.dtype {
        DType::F16 => u16::from_le_bytes([e[0], e[1]]) & 0x7FFF > 0x7C00,
        DType::BF16 => u16::from_le_bytes([e[0], e[1]]) & 0x7FFF > 0x7F80,
        DType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]).is_nan(),
        _ => false,
    };
    let (x, y) = (a.data.chunks_exact(size), b.data.chunks_exact(size));
    x.zip(y).enumerate().filter(|(_, (p, q))| p != q && !(is_nan(p) && is_nan(q))).map(|(i, _)| i).collect()
}

/// Outputs whose every op is exact (add, mul, div, where, clamp, relu,
/// casts): torch's bits. The others go through torch's GELU / SiLU.
const EXACT: [usize; 2] = [1, 3];

#[test]
fn half_tails_run_natively_and_match_pytorch() {
    let (inputs, want) = (numbered("input"), numbered("output"));
    assert_eq!(want.len(), 5, "the fixture's outputs");
    let dtypes: Vec<DType> = want.iter().map(|t| t.dtype).collect();
    assert_eq!(dtypes, [DType::F16, DType::F16, DType::BF16, DType::BF16, DType::F32], "the fixture's output dtypes");
    let avx2_table = kiln_runtime::native::cpu_runs(NativeArch::X86_64, "x86-64-v3");
    for flavour in FLAVOURS {
        let what = format!("native_half/{flavour}");
        let program = compile(flavour, Some(NativeTarget::new(NativeArch::X86_64, None).expect("default levels")));
        let portable = not_native(program.plan());
        assert!(portable.is_empty(), "{what}: not native: {portable:?}");
        assert_native_dtypes(&what, &program, &[DType::F16, DType::BF16]);
        let native = run(&program, true, 1, &inputs);
        let fallback = run(&program, false, 1, &inputs);
        for (allow, got) in [(true, &native), (false, &fallback)] {
            assert_eq!(got.len(), want.len(), "{what}: output count");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (rtol, atol) = if EXACT.contains(&i) { (0.0, 0.0) } else { default_tolerance(w.dtype) };
                assert_close(&format!("{what} native={allow} output {i}"), &g.view(), &w.view(), rtol, atol);
            }
        }
        for i in EXACT {
            let d = differing(&native[i], &want[i]);
            assert!(d.is_empty(), "{what}: output {i} vs torch's bits at {d:?}");
        }
        let compared = if avx2_table { (0..want.len()).collect() } else { EXACT.to_vec() };
        for &i in &compared {
            assert!(native[i].data == fallback[i].data, "{what}: output {i}, native vs the portable kernels");
        }
        assert!(bytes(&native) == bytes(&run(&program, true, 4, &inputs)), "{what}: 1 vs 4 threads");
        // `--target cpu`: the portable kernels, unfused calls included.
        let cpu = run(&compile(flavour, None), true, 2, &inputs);
        for &i in &compared {
            assert!(cpu[i].data == native[i].data, "{what}: output {i}, --target cpu vs x86_64");
        }
    }
}
