//! End to end on aarch64: artifacts compiled on this machine are run by an
//! aarch64 build of `kiln-run` (the runtime-only runner) and must match
//! PyTorch's eager outputs and this machine's own run of the same artifact.
//!
//! `.ci/aarch64.sh` cross-builds `kiln-run` and sets `KILN_A64_RUNNER` to the
//! command that runs it (`qemu-aarch64-static …/kiln-run`, split on spaces);
//! without that variable there is no aarch64 runner and each test says so and
//! returns. The artifact format is portable: the same bytes run on both ISAs;
//! outputs agree within torch's tolerances, not bit for bit (x86-64's GEMM
//! uses FMA in another order than NEON's), and on aarch64 they are
//! bit-identical at 1 and 2 threads like everywhere else.

use kiln_compiler::npy::read_npy;
use kiln_runtime::{Program, Tensor, TensorView};
use kiln_tests::{assert_close, compile_fixture, fixture_dir, read_numbered, temp_path, FIXTURES};
use std::path::{Path, PathBuf};
use std::process::Command;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

/// The aarch64 runner's command line, if this run has one. CI must have
/// one (`.ci/run` sets it): there a missing runner fails the test instead
/// of skipping it unseen.
fn runner() -> Option<Vec<String>> {
    let cmd = std::env::var("KILN_A64_RUNNER").ok().filter(|v| !v.trim().is_empty());
    if cmd.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "KILN_A64_RUNNER is not set under CI: .ci/aarch64.sh failed or its runner file was not found"
        );
        eprintln!("KILN_A64_RUNNER is not set: no aarch64 runner in this run (.ci/aarch64.sh sets it)");
    }
    cmd.map(|c| c.split_whitespace().map(String::from).collect())
}

/// A fresh empty directory for one run's outputs.
fn out_dir(tag: &str) -> PathBuf {
    let dir = temp_path(tag).with_extension("out");
    std::fs::create_dir_all(&dir).expect("create output directory");
    dir
}

/// Runs `kiln-run run ARTIFACT ARGS…` on aarch64; panics with its stderr on failure.
fn run_a64(runner: &[String], what: &str, artifact: &Path, args: &[String]) {
    let out = Command::new(&runner[0])
        .args(&runner[1..])
        .arg("run")
        .arg(artifact)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start the aarch64 runner {runner:?}: {e}"));
    assert!(
        out.status.success(),
        "{what}: aarch64 kiln-run failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `output_0.npy, output_1.npy, …` in `dir`.
fn outputs_in(dir: &Path) -> Vec<Tensor> {
    read_numbered(dir, "output")
}

/// Compiles `fixture` (`flavour`.pt2) here, runs it here and on aarch64 with
/// the fixture's inputs at `threads`, checks both against PyTorch and each
/// other, and returns the aarch64 outputs.
fn check_artifact(runner: &[String], fixture: &str, flavour: &str, threads: u32) -> Vec<Tensor> {
    let what = format!("{fixture}/{flavour} ({threads} threads)");
    check_bytes(runner, &what, fixture, &compile_fixture(fixture, flavour), threads)
}

/// [`check_artifact`] for an artifact already compiled from `fixture`.
fn check_bytes(runner: &[String], what: &str, fixture: &str, bytes: &[u8], threads: u32) -> Vec<Tensor> {
    let expected = read_numbered(&fixture_dir(fixture), "output");
    assert!(!expected.is_empty(), "{what}: fixture has no outputs");
    let (here, there) = run_here_and_there(runner, what, fixture, bytes, threads);
    assert_eq!(there.len(), expected.len(), "{what}: number of outputs on aarch64");
    for (i, want) in expected.iter().enumerate() {
        assert_close(&format!("{what} aarch64 output {i} vs PyTorch"), &there[i].view(), &want.view(), RTOL, ATOL);
        assert_close(&format!("{what} aarch64 output {i} vs x86-64"), &there[i].view(), &here[i].view(), RTOL, ATOL);
    }
    there
}

/// Runs `bytes` (compiled from `fixture`) on `fixture`'s inputs here and on
/// aarch64 at `threads`: (this machine's outputs, aarch64's).
fn run_here_and_there(
    runner: &[String],
    what: &str,
    fixture: &str,
    bytes: &[u8],
    threads: u32,
) -> (Vec<Tensor>, Vec<Tensor>) {
    let dir = fixture_dir(fixture);
    let inputs = read_numbered(&dir, "input");
    assert!(!inputs.is_empty(), "{what}: fixture has no inputs");
    let artifact = temp_path(fixture);
    std::fs::write(&artifact, bytes).expect("write artifact");

    let program = Program::from_bytes(bytes).unwrap_or_else(|e| panic!("{what}: load here: {e}"));
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let here = program.session().expect("session").run(&views).expect("run here").to_tensors();

    let out = out_dir(fixture);
    let mut args: Vec<String> =
        (0..inputs.len()).map(|i| format!("--input={i}={}", dir.join(format!("input_{i}.npy")).display())).collect();
    args.extend([format!("--threads={threads}"), format!("--output-dir={}", out.display())]);
    run_a64(runner, what, &artifact, &args);
    let there = outputs_in(&out);
    std::fs::remove_file(&artifact).ok();
    std::fs::remove_dir_all(&out).ok();
    (here, there)
}

/// The small fixtures in both IR flavours; on aarch64 1 and 2 threads give
/// the same bytes.
#[test]
fn fixtures_match_pytorch_and_x86_64() {
    let Some(runner) = runner() else { return };
    for name in FIXTURES {
        for flavour in ["training", "aten"] {
            let one = check_artifact(&runner, name, flavour, 1);
            let two = check_artifact(&runner, name, flavour, 2);
            for (i, (a, b)) in one.iter().zip(&two).enumerate() {
                assert!(a.data == b.data, "{name}/{flavour} output {i}: aarch64 differs between 1 and 2 threads");
            }
        }
    }
}

/// Fixture `name`'s `aten.pt2` compiled with `--target aarch64` (its
/// default level).
#[cfg(feature = "native")]
fn aarch64_artifact(name: &str) -> Vec<u8> {
    use kiln_compiler::native::NativeTarget;
    use kiln_runtime::native::NativeArch;
    let native = NativeTarget::new(NativeArch::Aarch64, None).expect("default aarch64 level");
    crate::native_common::compile_bytes(name, "aten", Some(native))
}

/// Every instruction of the artifact but its views is a native call.
#[cfg(feature = "native")]
fn assert_all_native(name: &str, bytes: &[u8]) {
    let program = Program::from_bytes(bytes).expect("load");
    let portable = crate::native_common::not_native(program.plan());
    assert!(portable.is_empty(), "{name}: not native: {portable:?}");
}

/// `--target aarch64` artifacts (native code for the fused elementwise
/// groups, default level `generic`): the runtime's loader maps and runs the
/// code on aarch64; here, on x86-64, the same artifact runs its portable
/// fallback. Both match PyTorch and each other.
#[cfg(feature = "native")]
#[test]
fn native_aarch64_artifacts_match_pytorch_and_x86_64() {
    let Some(runner) = runner() else { return };
    let mut functions = 0;
    for name in FIXTURES {
        let bytes = aarch64_artifact(name);
        let program = Program::from_bytes(&bytes).expect("load");
        functions += program.native_section().map_or(0, |n| n.functions.len());
        check_bytes(&runner, &format!("{name}/aten --target aarch64"), name, &bytes, 2);
    }
    assert!(functions > 0, "no fixture got native code for aarch64");
}

/// The inverse trig, hyperbolic and pow groups (`native_math`) as aarch64
/// code: every instruction native, matching PyTorch and the x86-64 run.
#[cfg(feature = "native")]
#[test]
fn native_aarch64_inverse_hyperbolic_and_pow_match_pytorch() {
    use kiln_runtime::format::InstrOp;
    let Some(runner) = runner() else { return };
    let bytes = aarch64_artifact("native_math");
    let program = Program::from_bytes(&bytes).expect("load");
    let native_calls = program.plan().instrs.iter().filter(|i| matches!(i.op, InstrOp::Native { .. })).count();
    assert_eq!(native_calls, program.plan().instrs.len(), "native_math: every instruction native");
    check_bytes(&runner, "native_math/aten --target aarch64", "native_math", &bytes, 2);
}

/// Bool and integer tensors in native aarch64 groups (`native_masks`: i64
/// comparisons into masks, a masked softmax, a bool input cast to float,
/// i64 index arithmetic): every instruction but the views native, matching
/// PyTorch and the x86-64 run.
#[cfg(feature = "native")]
#[test]
fn native_aarch64_masks_match_pytorch() {
    let Some(runner) = runner() else { return };
    let bytes = aarch64_artifact("native_masks");
    assert_all_native("native_masks", &bytes);
    for threads in [1, 2] {
        check_bytes(
            &runner,
            &format!("native_masks/aten --target aarch64 ({threads} threads)"),
            "native_masks",
            &bytes,
            threads,
        );
    }
}

/// f16 and bf16 tensors in native aarch64 groups (`native_half`: an f16
/// bias + GELU + residual, where / clamp / relu, a bf16 residual +
/// GELU-tanh + SiLU gate, casts): every instruction but the views native,
/// within torch's half tolerances of PyTorch, and the bits of the x86-64
/// run of the same artifact (its portable kernels) but for NaN payloads:
/// the conversions are the same integer sequences, and aarch64 fuses
/// `fmuladd` as the kernels' AVX2 polynomials do.
#[cfg(all(feature = "native", target_arch = "x86_64"))]
#[test]
fn native_aarch64_half_matches_pytorch_and_x86_64() {
    use crate::native_half::differing;
    let Some(runner) = runner() else { return };
    let bytes = aarch64_artifact("native_half");
    assert_all_native("native_half", &bytes);
    let expected = read_numbered(&fixture_dir("native_half"), "output");
    for threads in [1, 2] {
        let what = format!("native_half/aten --target aarch64 ({threads} threads)");
        let (here, there) = run_here_and_there(&runner, &what, "native_half", &bytes, threads);
        assert_eq!(there.len(), expected.len(), "{what}: number of outputs on aarch64");
        for (i, want) in expected.iter().enumerate() {
            let (rtol, atol) = kiln_tests::default_tolerance(want.dtype);
            assert_close(&format!("{what} output {i} vs PyTorch"), &there[i].view(), &want.view(), rtol, atol);
            let d = differing(&there[i], &here[i]);
            assert!(d.is_empty(), "{what}: output {i} differs from x86-64 at {d:?}");
        }
    }
}

/// Integer division and float fmod / remainder in native aarch64 groups
/// (`native_divide`): every instruction but the views native, matching
/// PyTorch and the x86-64 run; a zero divisor fails the run with the
/// kernels' error (aarch64's `sdiv` gives 0 there without trapping, so
/// only the function's zero-divisor status tells).
#[cfg(feature = "native")]
#[test]
fn native_aarch64_division_matches_pytorch_and_fails_on_a_zero_divisor() {
    let Some(runner) = runner() else { return };
    let bytes = aarch64_artifact("native_divide");
    assert_all_native("native_divide", &bytes);
    for threads in [1, 2] {
        let what = format!("native_divide/aten --target aarch64 ({threads} threads)");
        check_bytes(&runner, &what, "native_divide", &bytes, threads);
    }
    // The divisors (the last i64 input) with a zero.
    let mut inputs = read_numbered(&fixture_dir("native_divide"), "input");
    let d = inputs.iter_mut().rfind(|t| t.dtype == kiln_runtime::DType::I64).expect("the divisors");
    d.data[8 * 150..8 * 151].fill(0);
    let out = out_dir("a64-divide-zero");
    let artifact = out.join("native_divide.kiln");
    std::fs::write(&artifact, &bytes).expect("write the artifact");
    let mut args = vec!["--threads=2".to_string(), format!("--output-dir={}", out.display())];
    for (i, t) in inputs.iter().enumerate() {
        let path = out.join(format!("in_{i}.npy"));
        kiln_compiler::npy::write_npy(&path, &t.view()).expect("write input");
        args.push(format!("--input={i}={}", path.display()));
    }
    let run = Command::new(&runner[0]).args(&runner[1..]).arg("run").arg(&artifact).args(&args).output();
    let run = run.unwrap_or_else(|e| panic!("cannot start the aarch64 runner {runner:?}: {e}"));
    std::fs::remove_dir_all(&out).ok();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "a zero divisor ran on aarch64");
    assert!(stderr.contains("integer division by zero"), "aarch64 kiln-run: {stderr}");
}

/// sin, cos and tan in native aarch64 groups give the x86-64 run's bits
/// (here the artifact's portable fallback, glibc's sinf/cosf/tanf): the
/// emitter writes glibc's x86-64 algorithms out for every ISA, and aarch64
/// always fuses `fmuladd` as glibc's FMA build does.
#[cfg(all(feature = "native", target_arch = "x86_64"))]
#[test]
fn native_aarch64_trig_matches_x86_64_bit_for_bit() {
    use crate::native_trig::{assert_same_bits, compile_bytes, inputs, run};
    use kiln_compiler::native::NativeTarget;
    use kiln_runtime::native::NativeArch;
    let Some(runner) = runner() else { return };
    let bytes = compile_bytes(Some(NativeTarget::new(NativeArch::Aarch64, None).expect("default aarch64 level")));
    let program = Program::from_bytes(&bytes).expect("load");
    assert!(program.native_section().is_some_and(|n| !n.functions.is_empty()), "no native code for aarch64");
    let inputs = inputs();
    let here = run(&program, &inputs);
    let artifact = temp_path("a64-trig");
    std::fs::write(&artifact, &bytes).expect("write artifact");
    let out = out_dir("a64-trig");
    let mut args = vec![format!("--threads=2"), format!("--output-dir={}", out.display())];
    for (i, t) in inputs.iter().enumerate() {
        let path = out.join(format!("in_{i}.npy"));
        kiln_compiler::npy::write_npy(&path, &t.view()).expect("write input");
        args.push(format!("--input={i}={}", path.display()));
    }
    run_a64(&runner, "trig --target aarch64", &artifact, &args);
    let there: Vec<Vec<u8>> = outputs_in(&out).iter().map(|t| t.data.clone()).collect();
    std::fs::remove_file(&artifact).ok();
    std::fs::remove_dir_all(&out).ok();
    assert_same_bits("aarch64 native vs x86-64", &inputs, &there, &here);
}

/// The real-model topologies (shrunk ResNet-18, MobileNetV2, BERT, Llama,
/// MoE models), Core ATen flavour.
#[test]
fn models_match_pytorch_and_x86_64() {
    let Some(runner) = runner() else { return };
    for name in ["resnet18", "mobilenet_v2", "bert", "llama", "qwen3_moe", "mixtral"] {
        check_artifact(&runner, &format!("models/{name}"), "aten", 2);
    }
}

/// Stateful programs replayed with `--steps` (as a robot replays its log):
/// the state carries over inside the aarch64 session, every step matches eager.
#[test]
fn stateful_steps_match_pytorch() {
    let Some(runner) = runner() else { return };
    for name in ["counter", "lowpass", "kv_decoder"] {
        let fixture = format!("state/{name}");
        let dir = fixture_dir(&fixture);
        for flavour in ["training", "aten"] {
            let what = format!("{fixture}/{flavour}");
            let artifact = temp_path(&fixture);
            std::fs::write(&artifact, compile_fixture(&fixture, flavour)).expect("write artifact");
            let out = out_dir(&fixture);
            let args = [format!("--steps={}", dir.display()), format!("--output-dir={}", out.display())];
            run_a64(&runner, &what, &artifact, &args);
            let steps: Vec<PathBuf> = (0..).map(|k| dir.join(format!("step_{k}"))).take_while(|p| p.is_dir()).collect();
            assert!(steps.len() >= 4, "{what}: {} steps", steps.len());
            for (k, step) in steps.iter().enumerate() {
                let expected = read_numbered(step, "output");
                let got = outputs_in(&out.join(format!("step_{k}")));
                assert_eq!(got.len(), expected.len(), "{what} step {k}: number of outputs");
                for (i, want) in expected.iter().enumerate() {
                    let got = &got[i];
                    assert_close(&format!("{what} step {k} output {i}"), &got.view(), &want.view(), RTOL, ATOL);
                }
            }
            std::fs::remove_file(&artifact).ok();
            std::fs::remove_dir_all(&out).ok();
        }
    }
}

/// A malformed artifact is a clear error on aarch64 too, not a crash.
#[test]
fn corrupt_artifact_is_an_error() {
    let Some(runner) = runner() else { return };
    let mut bytes = compile_fixture("mlp", "aten");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    let artifact = temp_path("a64-corrupt");
    std::fs::write(&artifact, &bytes).expect("write artifact");
    let input = fixture_dir("mlp").join("input_0.npy");
    let out = Command::new(&runner[0])
        .args(&runner[1..])
        .arg("run")
        .arg(&artifact)
        .arg(format!("--input=0={}", input.display()))
        .output()
        .expect("start the aarch64 runner");
    std::fs::remove_file(&artifact).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "corrupt artifact: expected exit status 1, got {}: {stderr}", out.status);
    assert!(stderr.starts_with("error: "), "corrupt artifact: expected an error message, got: {stderr}");
    // The reference inputs stay readable (sanity: the failure is the artifact's).
    read_npy(&input).expect("input");
}

/// `fixture`'s `aten.pt2` compiled here (`--target cpu`) with `--quantize
/// MODE` (and `calibration` for int8-static, or activation ranges
/// observed elsewhere in `activations`), and how many depthwise layers
/// take static int8 activations.
fn compile_quantized(
    fixture: &str,
    mode: &str,
    calibration: Option<PathBuf>,
    activations: Vec<kiln_passes::ActObservation>,
) -> (Vec<u8>, usize) {
    use kiln_passes::{QuantScheme, QuantizeConfig};
    let tmp = temp_path(&format!("a64-{mode}"));
    let cfg = QuantizeConfig { activations, ..QuantizeConfig::new(QuantScheme::parse(mode).expect("mode")) };
    let opts = kiln_compiler::CompileOptions { quantize: Some(cfg), calibration, ..Default::default() };
    let summary = kiln_compiler::compile_file(&fixture_dir(fixture).join("aten.pt2"), &tmp, &opts)
        .unwrap_or_else(|e| panic!("{fixture} {mode}: compile failed: {e}"));
    let bytes = std::fs::read(&tmp).expect("read artifact");
    std::fs::remove_file(&tmp).ok();
    let depthwise = summary.quantized.iter().filter(|l| l.note.contains("static int8 activations")).count();
    (bytes, depthwise)
}

/// The f32 values of an output.
fn f32s(t: &Tensor) -> Vec<f32> {
    t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// int8 programs on aarch64: the integer kernels' NEON variants (int8
/// GEMM with `sdot`, the depthwise row, the row quantizer) and the
/// driver's loops compute the same integers and take the same float steps
/// as x86-64's AVX2/AVX-512 ones, and the float kernels these programs
/// keep (depthwise on dequantized weights in the dynamic modes, pools) are
/// bit-identical to the portable ones on both: so the outputs are the
/// x86-64 run's bytes.
/// - The small CNN of `quant/cnn_static` (int8-static with torch's observed
///   ranges: a depthwise layer, both residual adds and the max pool on
///   int8) also matches torch's fake-quant program (≤ 2e-6, as on x86-64).
/// - The shrunk MobileNetV2 (17 int8 depthwise layers, i8 handoffs and
///   residuals) and ResNet-18 (an i8 max pool, i8 residual reads)
///   int8-static at 1 and 2 threads, and int8-dynamic.
#[test]
fn int8_artifacts_match_x86_64_bit_for_bit() {
    use crate::quantize_conv::{calibration_dir, max_abs_diff, torch_observations};
    let Some(runner) = runner() else { return };
    let what = "quant/cnn_static int8-static";
    let fixture = "quant/cnn_static";
    let dir = fixture_dir(fixture);
    let (bytes, depthwise) =
        compile_quantized(fixture, "int8-static:observer=minmax", Some(dir.join("calib")), torch_observations(&dir));
    assert_eq!(depthwise, 1, "{what}: int8 depthwise layers");
    let (here, there) = run_here_and_there(&runner, what, fixture, &bytes, 2);
    assert_eq!((here.len(), there.len()), (1, 1), "{what}: outputs");
    assert!(here[0].data == there[0].data, "{what}: aarch64 differs from x86-64");
    let want = f32s(&read_numbered(&dir, "output").remove(0));
    let d = max_abs_diff(&f32s(&there[0]), &want);
    assert!(d <= 2e-6, "{what}: max diff {d} vs torch's fake-quant on aarch64");

    for (model, int8_depthwise) in [("mobilenet_v2", 17), ("resnet18", 0)] {
        let fixture = format!("models/{model}");
        let calib = calibration_dir(model);
        let (bytes, depthwise) = compile_quantized(&fixture, "int8-static", Some(calib.clone()), Vec::new());
        std::fs::remove_dir_all(&calib).ok();
        assert_eq!(depthwise, int8_depthwise, "{model} int8-static: int8 depthwise layers");
        for threads in [1, 2] {
            let what = format!("{model} int8-static ({threads} threads)");
            let (here, there) = run_here_and_there(&runner, &what, &fixture, &bytes, threads);
            assert!(here[0].data == there[0].data, "{what}: aarch64 differs from x86-64");
        }
        let (bytes, _) = compile_quantized(&fixture, "int8-dynamic", None, Vec::new());
        let what = format!("{model} int8-dynamic");
        let (here, there) = run_here_and_there(&runner, &what, &fixture, &bytes, 2);
        let d = max_abs_diff(&f32s(&here[0]), &f32s(&there[0]));
        assert!(here[0].data == there[0].data, "{what}: aarch64 differs from x86-64 (max diff {d})");
    }
}

/// Imported quantized programs (`quant/*/decomp.pt2`) compiled here and
/// run on aarch64. The PT2E static programs (integer convolutions and
/// linear layer, int8 max pools, the quantize/dequantize arithmetic) and
/// torchao's token-shaped int8 dynamic one take the same integer and float
/// steps on both ISAs: the x86-64 run's bytes, and for PT2E XNNPACK's
/// (ending in a quantize/dequantize pair) torch's eager output bit for bit.
/// The MLPs with a GELU (PT2E dynamic, torchao int8 weight-only, int4
/// group-32 and int8 dynamic) are promised less: GELU's vector variants
/// agree within ulps, which the weight-only layers keep that small
/// (torch's f32 tolerances) and a dynamic quantizer can turn into a
/// rounding step (cosine 0.9999). Today they too give the same bytes.
#[test]
fn imported_quantized_programs_match_x86_64() {
    let Some(runner) = runner() else { return };
    for (case, promise) in [
        ("pt2e_xnnpack_static", "bytes"),
        ("pt2e_x86_static", "bytes"),
        ("ao_da8w8_tokens", "bytes"),
        ("ao_int8_weight", "close"),
        ("ao_int4_g32", "close"),
        ("pt2e_x86_dynamic", "cosine"),
        ("ao_da8w8", "cosine"),
    ] {
        let fixture = format!("quant/{case}");
        let what = format!("{fixture}/decomp");
        let bytes = compile_fixture(&fixture, "decomp");
        let (here, there) = run_here_and_there(&runner, &what, &fixture, &bytes, 2);
        assert_eq!((here.len(), there.len()), (1, 1), "{what}: outputs");
        let (a, b) = (f32s(&here[0]), f32s(&there[0]));
        println!("{what}: same bytes {}", here[0].data == there[0].data);
        match promise {
            "bytes" => assert!(here[0].data == there[0].data, "{what}: aarch64 differs from x86-64"),
            "close" => {
                assert_close(&format!("{what} aarch64 vs x86-64"), &there[0].view(), &here[0].view(), RTOL, ATOL)
            }
            _ => {
                let dot: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
                let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
                let c = dot / (norm(&a) * norm(&b));
                assert!(c >= 0.9999, "{what}: cosine {c} vs x86-64");
            }
        }
        if case == "pt2e_xnnpack_static" {
            let eager = read_numbered(&fixture_dir(&fixture), "output").remove(0);
            assert!(there[0].data == eager.data, "{what}: aarch64 differs from torch's eager output");
        }
    }
}
