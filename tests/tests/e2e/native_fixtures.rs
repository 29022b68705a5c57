//! Every fixture the fixture suite runs, compiled with `--target x86_64`
//! (native code for the fused elementwise groups, default CPU levels),
//! matched against PyTorch — with native code, and with it refused
//! (`allow_native_code: false`, the portable fallback) — and at 1 and 4
//! threads bit-identically. Needs feature `native` (MLIR/LLVM 19).
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use kiln_compiler::native::NativeTarget;
use kiln_compiler::{compile_file, CompileOptions};
use kiln_runtime::format::InstrOp;
use kiln_runtime::native::NativeArch;
use kiln_runtime::{Program, SessionOptions, Tensor, TensorView};
use kiln_tests::{assert_close, fixture_dir, read_numbered, temp_path, FIXTURES, FLAVOURS};

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn compile_native(name: &str, flavour: &str) -> std::sync::Arc<Program> {
    let src = fixture_dir(name).join(format!("{flavour}.pt2"));
    let tmp = temp_path(&format!("native-{name}-{flavour}"));
    let native = NativeTarget::new(NativeArch::X86_64, None).expect("default levels");
    let opts = CompileOptions { native: Some(native), ..CompileOptions::default() };
    compile_file(&src, &tmp, &opts).unwrap_or_else(|e| panic!("{name}/{flavour}: compile failed: {e}"));
    let program = Program::load(&tmp).unwrap_or_else(|e| panic!("{name}/{flavour}: load failed: {e}"));
    std::fs::remove_file(&tmp).ok();
    program
}

fn run(program: &std::sync::Arc<Program>, opts: &SessionOptions, inputs: &[Tensor]) -> Vec<Vec<u8>> {
    let mut session = program.session_with(opts).expect("session");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).expect("run");
    (0..outputs.len()).map(|i| outputs.get(i).data.to_vec()).collect()
}

/// Returns how many native functions and native calls of fused groups
/// (programs of more than one op: lone calls over bool / integer tensors
/// are native too, often once per model) the fixture got.
fn check(name: &str, flavour: &str) -> (usize, usize) {
    let program = compile_native(name, flavour);
    let dir = fixture_dir(name);
    let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    let what = format!("{name}/{flavour}");
    for allow in [true, false] {
        let opts = SessionOptions { allow_native_code: allow, threads: 1, ..SessionOptions::default() };
        let mut session = program.session_with(&opts).expect("session");
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let outputs = session.run(&views).unwrap_or_else(|e| panic!("{what}: run failed: {e}"));
        assert_eq!(outputs.len(), expected.len(), "{what}: number of outputs");
        for (i, want) in expected.iter().enumerate() {
            assert_close(&format!("{what} native={allow} output {i}"), &outputs.get(i), &want.view(), RTOL, ATOL);
        }
    }
    let one = SessionOptions { threads: 1, ..SessionOptions::default() };
    let four = SessionOptions { threads: 4, ..SessionOptions::default() };
    assert_eq!(run(&program, &one, &inputs), run(&program, &four, &inputs), "{what}: 1 vs 4 threads");
    let Some(section) = program.native_section() else { return (0, 0) };
    // Calls of one program with the same operand modes share one function.
    let mut calls = Vec::new();
    for instr in &program.plan().instrs {
        let InstrOp::Native { function, program } = &instr.op else { continue };
        let modes = &section.functions[*function as usize].inputs[..];
        for &(p, m, f) in &calls {
            let same = p == &program[..] && m == modes;
            assert!(!same || f == *function, "{what}: one program in functions {f} and {function}");
        }
        calls.push((&program[..], modes, *function));
    }
    let groups: Vec<u32> = calls.iter().filter(|(p, _, _)| p.len() > 1).map(|&(_, _, f)| f).collect();
    let mut functions = groups.clone();
    functions.sort_unstable();
    functions.dedup();
    (functions.len(), groups.len())
}

#[test]
fn fixtures_match_pytorch_with_native_code() {
    let (mut functions, mut calls) = (0, 0);
    for name in FIXTURES {
        for flavour in FLAVOURS {
            let (f, c) = check(name, flavour);
            functions += f;
            calls += c;
        }
    }
    // The suite must exercise native code, not only its fallback.
    assert!(functions > 0, "no fixture got a native function ({calls} calls)");
}

#[test]
fn repeated_groups_share_one_function() {
    // The shrunk Llama: each of its fused groups repeats in every decoder
    // layer. (EfficientNet-B0's SiLU, the example before, now goes into its
    // convolutions' epilogues: no group is left there, but it still runs
    // natively compiled.)
    let (functions, calls) = check("models/llama", "aten");
    assert!(functions >= 1 && calls >= 2 * functions, "{calls} native calls of {functions} functions");
    check("models/efficientnet_b0", "aten");
}
