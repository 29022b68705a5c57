//! Native row functions (softmax, layer / RMS norm, last-axis reductions)
//! on whole models: the BERT- and Llama-style fixtures and the dynamic MLP
//! (softmax and log-softmax, a symbolic batch), compiled with `--target x86_64`, must turn their norms and
//! softmaxes into `native_kernel` instructions, match PyTorch with native
//! code and with it refused, give the same bytes at 1 and 3 threads, and
//! give the row kernels' results bit for bit: the same artifact with every
//! `native_kernel` put back to its fallback call gives identical outputs
//! (where the kernel table's softmax is the AVX2 one and the level has FMA);
//! a merged elementwise prologue (BERT's embedding sum before its layer
//! norm) put back as its own fused call before the kernel. Merged
//! elementwise epilogues (format 0.20) give the bytes of the same artifact
//! compiled without them (`NativeTarget::row_epilogues` off: the row
//! function and the elementwise call as two native calls).
#![cfg(all(feature = "native", target_arch = "x86_64"))]

use kiln_compiler::native::NativeTarget;
use kiln_compiler::{compile_file, CompileOptions};
use kiln_runtime::format::{parse_container, ArtifactWriter, Instr, InstrOp, Kernel, WeightsBuilder};
use kiln_runtime::native::NativeArch;
use kiln_runtime::{Program, SessionOptions, Tensor, TensorView};
use kiln_tests::{assert_close, fixture_dir, read_numbered, temp_path};

/// The fixture compiled with `--target x86_64` (with merged epilogues or
/// without): the artifact's bytes.
fn compile_native(name: &str, flavour: &str, row_epilogues: bool) -> Vec<u8> {
    let src = fixture_dir(name).join(format!("{flavour}.pt2"));
    let tmp = temp_path(&format!("native-rows-{}-{flavour}-{row_epilogues}", name.replace('/', "-")));
    let native = NativeTarget { row_epilogues, ..NativeTarget::new(NativeArch::X86_64, None).expect("default levels") };
    let opts = CompileOptions { native: Some(native), ..CompileOptions::default() };
    compile_file(&src, &tmp, &opts).unwrap_or_else(|e| panic!("{name}: compile failed: {e}"));
    let bytes = std::fs::read(&tmp).unwrap();
    std::fs::remove_file(&tmp).ok();
    bytes
}

fn run(program: &std::sync::Arc<Program>, opts: &SessionOptions, inputs: &[Tensor]) -> Vec<Vec<u8>> {
    let mut session = program.session_with(opts).expect("session");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).expect("run");
    (0..outputs.len()).map(|i| outputs.get(i).data.to_vec()).collect()
}

/// The fallback kernels' names of the program's native kernels.
fn native_kernels(program: &Program) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = (program.plan().instrs.iter())
        .filter_map(|i| match &i.op {
            InstrOp::NativeKernel { fallback, .. } => Some(fallback.name()),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

/// The fixture's outputs with native code (at 1 and 3 threads) and refused
/// are PyTorch's; returns the native run's bytes.
fn check(name: &str, program: &std::sync::Arc<Program>) -> Vec<Vec<u8>> {
    // The artifact says what it was compiled for (`kiln inspect`'s target).
    assert_eq!(program.metadata().target, "x86_64", "{name}: the metadata's target");
    let dir = fixture_dir(name);
    let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    for allow in [true, false] {
        let opts = SessionOptions { allow_native_code: allow, threads: 1, ..SessionOptions::default() };
        let mut session = program.session_with(&opts).expect("session");
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let outputs = session.run(&views).unwrap_or_else(|e| panic!("{name}: run failed: {e}"));
        assert_eq!(outputs.len(), expected.len(), "{name}: number of outputs");
        for (i, want) in expected.iter().enumerate() {
            assert_close(&format!("{name} native={allow} output {i}"), &outputs.get(i), &want.view(), 1e-4, 1e-5);
        }
    }
    let one = run(program, &SessionOptions { threads: 1, ..SessionOptions::default() }, &inputs);
    let three = run(program, &SessionOptions { threads: 3, ..SessionOptions::default() }, &inputs);
    assert_eq!(one, three, "{name}: 1 vs 3 threads");
    one
}

/// The same artifact (compiled without epilogues) with every native kernel
/// run as its fallback call: the elementwise native calls stay, so only the
/// row functions differ.
fn with_row_kernels_portable(bytes: &[u8], program: &Program) -> std::sync::Arc<Program> {
    let mut plan = program.plan().clone();
    assert!(!plan.instrs.iter().any(|i| matches!(i.op, InstrOp::Jump { .. })), "a plan with loops");
    let mut instrs = Vec::new();
    for instr in std::mem::take(&mut plan.instrs) {
        match &instr.op {
            InstrOp::NativeKernel { epilogue: Some(_), .. } => panic!("an epilogue: compile without them"),
            InstrOp::NativeKernel { fallback, prologue: None, .. } => {
                instrs.push(Instr { op: InstrOp::Call(fallback.clone()), ..instr })
            }
            // The prologue as its own fused call into its tensor, then the kernel.
            InstrOp::NativeKernel { fallback, prologue: Some(p), .. } => {
                let k = p.inputs as usize;
                instrs.push(Instr {
                    op: InstrOp::Call(Kernel::Fused { program: p.program.clone() }),
                    inputs: instr.inputs[..k].to_vec(),
                    outputs: vec![instr.outputs[1]],
                    origin: instr.origin.clone(),
                });
                instrs.push(Instr {
                    op: InstrOp::Call(fallback.clone()),
                    inputs: std::iter::once(instr.outputs[1]).chain(instr.inputs[k..].iter().copied()).collect(),
                    outputs: vec![instr.outputs[0]],
                    origin: instr.origin.clone(),
                });
            }
            _ => instrs.push(instr),
        }
    }
    plan.instrs = instrs;
    let container = parse_container(bytes).unwrap();
    let mut weights = WeightsBuilder::new();
    weights.push(&bytes[container.weights.clone()]);
    let mut w = ArtifactWriter::new(&plan, weights, program.metadata()).unwrap();
    w.add_native(program.native_section().expect("a native section")).unwrap();
    Program::from_bytes(&w.to_bytes()).expect("the rewritten artifact loads")
}

#[test]
fn models_run_their_norms_and_softmax_natively() {
    let exact = kiln_kernels::best().entries().contains(&("exp_sum_f32", "avx2"))
        && kiln_runtime::native::cpu_runs(NativeArch::X86_64, "x86-64-v3");
    for (name, flavour, want, want_epilogues) in [
        // None of these models has an elementwise call right after a row
        // function (their activations and residuals are GEMM epilogues).
        ("models/bert", "aten", &["layer_norm"][..], false),
        // Softmax and log-softmax over a static last dim, the batch
        // symbolic; kiln decomposes log-softmax (max and sum reductions).
        ("dynamic_mlp", "aten", &["reduce", "softmax"][..], false),
        ("models/llama", "aten", &["rms_norm"][..], false),
        // Layer norm → GELU + residual, softmax → scale + bias, RMS norm →
        // scale, mean → rsqrt: four merged epilogues.
        ("native_epilogues", "aten", &["layer_norm", "reduce", "rms_norm", "softmax"][..], true),
    ] {
        let bytes = compile_native(name, flavour, false);
        let program = Program::from_bytes(&bytes).unwrap_or_else(|e| panic!("{name}: load failed: {e}"));
        let kinds = native_kernels(&program);
        for w in want {
            assert!(kinds.contains(w), "{name}: no native {w} (native kernels: {kinds:?})");
        }
        // BERT's embedding sum (word + position + type) merges into its
        // layer norm: a row function with an elementwise prologue.
        let prologues = (program.plan().instrs.iter())
            .filter(|i| matches!(i.op, InstrOp::NativeKernel { prologue: Some(_), .. }))
            .count();
        assert_eq!(prologues > 0, name == "models/bert", "{name}: {prologues} merged prologues");
        let native = check(name, &program);
        // Elementwise calls right after a row function merge into it.
        let merged = Program::from_bytes(&compile_native(name, flavour, true)).expect("loads");
        let epilogues = (merged.plan().instrs.iter())
            .filter(|i| matches!(i.op, InstrOp::NativeKernel { epilogue: Some(_), .. }))
            .count();
        assert_eq!(epilogues > 0, want_epilogues, "{name}: {epilogues} merged epilogues");
        assert!(check(name, &merged) == native, "{name}: merged epilogues vs the two native calls");
        if exact {
            let inputs = read_numbered(&fixture_dir(name), "input");
            let portable = with_row_kernels_portable(&bytes, &program);
            let rows_portable = run(&portable, &SessionOptions::default(), &inputs);
            assert!(native == rows_portable, "{name}: native row functions differ from their kernels");
        }
    }
}
