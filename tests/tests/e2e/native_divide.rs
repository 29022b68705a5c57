//! Integer division and remainder and float fmod / remainder in native
//! groups (`compiler/src/native/emit/divide.rs`): the `native_divide`
//! fixture (i64 `//`, `%`, trunc division and fmod, the same on i32, f32
//! `remainder`, `fmod` and `floor_divide` chains) compiled with `--target
//! x86_64`: every instruction but the views is native, the integer groups'
//! functions declare they can fail, the outputs equal PyTorch's with native
//! code and with it refused, at 1 and 4 threads, and `--target cpu`'s
//! bytes; a zero divisor makes the run fail with the portable kernels'
//! error, not a trap. Needs feature `native`.
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use crate::native_common::{bytes, not_native, try_run as run};
use kiln_compiler::native::NativeTarget;
use kiln_runtime::native::NativeArch;
use kiln_runtime::{DType, Program, SessionOptions};
use kiln_tests::{assert_close, fixture_dir, read_numbered, run_session, FLAVOURS};

fn compile(flavour: &str, native: Option<NativeTarget>) -> std::sync::Arc<Program> {
    crate::native_common::compile("native_divide", flavour, native)
}

fn x86_64() -> Option<NativeTarget> {
    Some(NativeTarget::new(NativeArch::X86_64, None).expect("default levels"))
}

#[test]
fn division_chains_run_natively_and_match_pytorch() {
    let dir = fixture_dir("native_divide");
    let (inputs, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    assert_eq!(want.len(), 5, "the fixture's outputs");
    for flavour in FLAVOURS {
        let what = format!("native_divide/{flavour}");
        let program = compile(flavour, x86_64());
        let portable = not_native(program.plan());
        assert!(portable.is_empty(), "{what}: not native: {portable:?}");
        let section = program.native_section().expect("a native section");
        for d in [DType::I64, DType::I32] {
            let fails = section.functions.iter().any(|f| f.can_fail && f.output_dtype == d);
            assert!(fails, "{what}: no {d} function that can fail");
        }
        assert!(
            section.functions.iter().any(|f| !f.can_fail && f.output_dtype == DType::F32),
            "{what}: the f32 chains cannot fail"
        );
        let native = run(&program, true, 1, &inputs).expect("native run");
        let fallback = run(&program, false, 1, &inputs).expect("portable run");
        for (allow, got) in [(true, &native), (false, &fallback)] {
            assert_eq!(got.len(), want.len(), "{what}: output count");
            for i in 0..want.len() {
                assert_close(&format!("{what} native={allow} output {i}"), &got[i].view(), &want[i].view(), 0.0, 0.0);
            }
        }
        assert!(bytes(&native) == bytes(&fallback), "{what}: native vs the portable kernels");
        assert!(bytes(&native) == bytes(&run(&program, true, 4, &inputs).unwrap()), "{what}: 1 vs 4 threads");
        let cpu = run(&compile(flavour, None), true, 2, &inputs).expect("--target cpu run");
        assert!(bytes(&cpu) == bytes(&native), "{what}: --target cpu vs x86_64");
    }
}

/// A zero among the divisors: the native run fails with the error the
/// portable kernels give ("integer division by zero"), at any thread
/// count, and the session stays usable.
#[test]
fn a_zero_divisor_fails_the_run_as_the_portable_kernels_do() {
    let dir = fixture_dir("native_divide");
    let inputs = read_numbered(&dir, "input");
    let mut zero = inputs.clone();
    let d = zero.iter_mut().rfind(|t| t.dtype == DType::I64).expect("the divisors");
    d.data[8 * 150..8 * 151].fill(0);
    let program = compile("aten", x86_64());
    let fails = |allow: bool, threads: usize| run(&program, allow, threads, &zero).err().map(|e| e.to_string());
    let portable = fails(false, 1).expect("the portable kernels fail");
    assert!(portable.contains("integer division by zero"), "{portable}");
    for threads in [1, 3] {
        let native = fails(true, threads).expect("the native run fails");
        assert_eq!(native, portable, "{threads} threads");
    }
    let opts = SessionOptions { threads: 2, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).expect("session");
    assert!(run_session(&mut session, &zero).is_err());
    let want = read_numbered(&dir, "output");
    let again = run_session(&mut session, &inputs).expect("a run after the failed one");
    for i in 0..want.len() {
        assert_close(&format!("output {i} after the failed run"), &again[i].view(), &want[i].view(), 0.0, 0.0);
    }
}
