//! What the native-code fixture tests share (`native_masks`, `native_half`,
//! `native_divide`, `aarch64_e2e`): a fixture compiled with or without
//! native code, the instructions that stayed portable, a run with native
//! code allowed or refused, the outputs' bytes.
#![cfg(feature = "native")]

use kiln_compiler::native::NativeTarget;
use kiln_compiler::{compile_file, CompileOptions};
use kiln_runtime::format::{InstrOp, Kernel, Plan};
use kiln_runtime::{DType, Program, SessionOptions, Tensor};
use kiln_tests::{fixture_dir, run_session, temp_path};
use std::sync::Arc;

/// The artifact bytes of fixture `name`'s `flavour` (`training`, `aten`)
/// compiled with `native` (None: `--target cpu`).
pub fn compile_bytes(name: &str, flavour: &str, native: Option<NativeTarget>) -> Vec<u8> {
    let what = format!("{name}/{flavour}");
    let tmp = temp_path(&format!("{name}-{flavour}"));
    let opts = CompileOptions { native, ..CompileOptions::default() };
    let src = fixture_dir(name).join(format!("{flavour}.pt2"));
    compile_file(&src, &tmp, &opts).unwrap_or_else(|e| panic!("{what}: compile failed: {e}"));
    let bytes = std::fs::read(&tmp).unwrap_or_else(|e| panic!("{what}: {e}"));
    std::fs::remove_file(&tmp).ok();
    bytes
}

/// [`compile_bytes`], loaded.
pub fn compile(name: &str, flavour: &str, native: Option<NativeTarget>) -> Arc<Program> {
    let bytes = compile_bytes(name, flavour, native);
    Program::from_bytes(&bytes).unwrap_or_else(|e| panic!("{name}/{flavour}: {e}"))
}

/// The instructions of `plan` that run on the portable kernels: all but
/// native calls and views (`copy`).
pub fn not_native(plan: &Plan) -> Vec<&InstrOp> {
    (plan.instrs.iter())
        .map(|i| &i.op)
        .filter(|op| !matches!(op, InstrOp::Native { .. } | InstrOp::NativeKernel { .. }))
        .filter(|op| !matches!(op, InstrOp::Call(Kernel::Copy {})))
        .collect()
}

/// One run at `threads` threads, native code allowed or refused.
pub fn try_run(
    program: &Arc<Program>,
    allow: bool,
    threads: usize,
    inputs: &[Tensor],
) -> kiln_runtime::Result<Vec<Tensor>> {
    let opts = SessionOptions { allow_native_code: allow, threads, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).expect("session");
    run_session(&mut session, inputs)
}

/// [`try_run`], which must succeed.
pub fn run(program: &Arc<Program>, allow: bool, threads: usize, inputs: &[Tensor]) -> Vec<Tensor> {
    try_run(program, allow, threads, inputs).expect("run")
}

/// The outputs' bytes.
pub fn bytes(outputs: &[Tensor]) -> Vec<Vec<u8>> {
    outputs.iter().map(|t| t.data.clone()).collect()
}

/// Some native function of `program` reads and some returns each of `dtypes`.
pub fn assert_native_dtypes(what: &str, program: &Program, dtypes: &[DType]) {
    let section = program.native_section().expect("a native section");
    let operands: Vec<DType> = section.functions.iter().flat_map(|f| f.input_dtypes.clone()).collect();
    let results: Vec<DType> = section.functions.iter().map(|f| f.output_dtype).collect();
    for d in dtypes {
        assert!(operands.contains(d) && results.contains(d), "{what}: no native {d} operand and result");
    }
}
