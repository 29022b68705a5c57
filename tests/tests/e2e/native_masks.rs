//! Bool and integer tensors in native groups (`compiler/src/native/emit.rs`):
//! the `native_masks` fixture (i64 comparisons building a causal and a
//! key-padding mask, `masked_fill(-inf)` merged into a softmax, a bool
//! input masking features and cast to float, i64 index arithmetic out as
//! i64 and f32) compiled with `--target x86_64`: every instruction but the
//! views (`copy`) is native, the outputs match PyTorch with native code and
//! with it refused, at 1 and 4 threads bit-identically; the exact outputs
//! (all but the softmax) are the portable kernels' bytes, as is the
//! softmax where the kernel table's exp-sum is AVX2 and the level has FMA;
//! `--target cpu` gives the same bytes. Needs feature `native`.
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use crate::native_common::{assert_native_dtypes, bytes, not_native, run};
use kiln_compiler::native::NativeTarget;
use kiln_runtime::format::InstrOp;
use kiln_runtime::native::NativeArch;
use kiln_runtime::{DType, Program, SessionOptions};
use kiln_tests::{assert_close, fixture_dir, read_numbered, run_session, FLAVOURS};

fn compile(flavour: &str, native: Option<NativeTarget>) -> std::sync::Arc<Program> {
    crate::native_common::compile("native_masks", flavour, native)
}

#[test]
fn mask_chains_run_natively_and_match_pytorch() {
    let dir = fixture_dir("native_masks");
    let (inputs, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    assert_eq!(want.len(), 4, "the fixture's outputs");
    let exact_softmax = kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2"))
        && kiln_runtime::native::cpu_runs(NativeArch::X86_64, "x86-64-v3");
    for flavour in FLAVOURS {
        let what = format!("native_masks/{flavour}");
        let program = compile(flavour, Some(NativeTarget::new(NativeArch::X86_64, None).expect("default levels")));
        let portable = not_native(program.plan());
        assert!(portable.is_empty(), "{what}: not native: {portable:?}");
        // Bool and i64 operands, bool and i64 results, a masked softmax.
        assert_native_dtypes(&what, &program, &[DType::Bool, DType::I64]);
        let section = program.native_section().expect("a native section");
        let masked_softmax = (program.plan().instrs.iter()).any(|i| {
            matches!(&i.op, InstrOp::NativeKernel { prologue: Some(_), function, .. }
                if section.functions[*function as usize].input_dtypes.contains(&DType::Bool))
        });
        assert!(masked_softmax, "{what}: the mask did not merge into the softmax");
        let native = run(&program, true, 1, &inputs);
        let fallback = run(&program, false, 1, &inputs);
        for (allow, got) in [(true, &native), (false, &fallback)] {
            assert_eq!(got.len(), want.len(), "{what}: output count");
            // The softmax within an ulp or two; the rest exact.
            assert_close(&format!("{what} native={allow} softmax"), &got[0].view(), &want[0].view(), 1e-5, 1e-7);
            for i in 1..4 {
                assert_close(&format!("{what} native={allow} output {i}"), &got[i].view(), &want[i].view(), 0.0, 0.0);
            }
        }
        assert!(bytes(&native[1..]) == bytes(&fallback[1..]), "{what}: native vs the portable kernels");
        if exact_softmax {
            assert!(native[0].data == fallback[0].data, "{what}: the masked softmax vs its kernels");
        }
        assert!(bytes(&native) == bytes(&run(&program, true, 4, &inputs)), "{what}: 1 vs 4 threads");
        // `--target cpu`: the portable kernels, unfused calls included.
        let cpu = run(&compile(flavour, None), true, 2, &inputs);
        assert!(bytes(&cpu[1..]) == bytes(&native[1..]), "{what}: --target cpu vs x86_64");
    }
}

/// A bool input is the byte 0 or 1: another byte (never written by torch
/// or numpy) would read as true in native code and as itself in the
/// portable kernels' byte comparisons, so the session refuses it.
#[test]
fn a_bool_input_holding_another_byte_is_refused() {
    let dir = fixture_dir("native_masks");
    let mut inputs = read_numbered(&dir, "input");
    let k = inputs.iter().position(|t| t.dtype == DType::Bool).expect("the fixture's bool input");
    inputs[k].data[1] = 2;
    for native in [None, Some(NativeTarget::new(NativeArch::X86_64, None).expect("default levels"))] {
        let program = compile("training", native);
        let mut session = program.session_with(&SessionOptions::default()).expect("session");
        let err = run_session(&mut session, &inputs).expect_err("refused").to_string();
        assert!(err.contains("bool element 1 is the byte 2, not 0 or 1"), "{err}");
    }
}
