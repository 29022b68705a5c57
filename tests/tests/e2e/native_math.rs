//! The inverse trigonometric and hyperbolic functions and pow in native
//! fused groups (`compiler/src/native/emit/inverse.rs`): the `native_math`
//! fixture (chains of asinh, cosh, atan2, pow, sinh, atanh, acosh, asin,
//! acos, atan and sign over wide ranges, the special values and the
//! arguments next to ±1; sign is torch's, 0 for NaN and −0) compiled with `--target x86_64`, matched against PyTorch with its
//! native code and with the code refused (the portable kernels, which call
//! libm), in both IR flavours. Needs feature `native` (MLIR/LLVM 19).
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use kiln_compiler::native::NativeTarget;
use kiln_compiler::{compile_file, CompileOptions};
use kiln_runtime::format::InstrOp;
use kiln_runtime::native::NativeArch;
use kiln_runtime::{Program, SessionOptions};
use kiln_tests::{assert_outputs_close, fixture_dir, read_numbered, run_session, temp_path, FLAVOURS};

#[test]
fn inverse_hyperbolic_and_pow_groups_run_natively_and_match_pytorch() {
    let dir = fixture_dir("native_math");
    let (inputs, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    for flavour in FLAVOURS {
        let what = format!("native_math/{flavour}");
        let tmp = temp_path(&format!("native-math-{flavour}"));
        let native = NativeTarget::new(NativeArch::X86_64, None).expect("default levels");
        let opts = CompileOptions { native: Some(native), ..CompileOptions::default() };
        compile_file(&dir.join(format!("{flavour}.pt2")), &tmp, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
        let program = Program::load(&tmp).unwrap_or_else(|e| panic!("{what}: {e}"));
        std::fs::remove_file(&tmp).ok();
        // The model is elementwise only: every instruction is a native call
        // (a group with an op the emitter lacked would stay a fused kernel).
        let ops: Vec<&InstrOp> = program.plan().instrs.iter().map(|i| &i.op).collect();
        assert!(
            ops.len() >= 3 && ops.iter().all(|op| matches!(op, InstrOp::Native { .. })),
            "{what}: not all native: {ops:?}"
        );
        for allow in [true, false] {
            let opts = SessionOptions { allow_native_code: allow, threads: 2, ..SessionOptions::default() };
            let mut session = program.session_with(&opts).expect("session");
            let got = run_session(&mut session, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
            // Several ops in a row, each within an ulp or two of torch's.
            assert_outputs_close(&format!("{what} native={allow}"), &got, &want, 1e-5, 1e-6);
        }
    }
}
