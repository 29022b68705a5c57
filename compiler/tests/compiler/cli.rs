//! The `kiln` command line, end to end: compile, run (text and --json),
//! inspect (text and --json), and its error messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn compile(model: &Path, out: &Path) {
    let o = kiln(&["compile", model.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "compile failed: {}", stderr(&o));
    assert!(stdout(&o).contains("arena"), "summary: {}", stdout(&o));
}

#[test]
fn compile_run_writes_outputs_matching_pytorch() {
    let dir = tmp_dir("run");
    let artifact = dir.join("cnn.kiln");
    compile(&fixtures().join("cnn/training.pt2"), &artifact);
    let out_dir = dir.join("out");
    let input = fixtures().join("cnn/input_0.npy");
    let o = kiln(&[
        "run",
        artifact.to_str().unwrap(),
        "--input",
        &format!("0={}", input.display()),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "run failed: {}", stderr(&o));
    assert!(stdout(&o).contains("output 0"), "{}", stdout(&o));
    let got = kiln_compiler::npy::read_npy(&out_dir.join("output_0.npy")).unwrap().to_f32().unwrap();
    let want = kiln_compiler::npy::read_npy(&fixtures().join("cnn/output_0.npy")).unwrap().to_f32().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "{g} vs {w}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn run_json_and_inputs_by_name() {
    let dir = tmp_dir("json");
    let artifact = dir.join("t.kiln");
    compile(&fixtures().join("transformer_mask/aten.pt2"), &artifact);
    let (ids, mask) =
        (fixtures().join("transformer_mask/input_0.npy"), fixtures().join("transformer_mask/input_1.npy"));
    let o = kiln(&[
        "run",
        artifact.to_str().unwrap(),
        "--input",
        &format!("mask={}", mask.display()),
        "--input",
        &format!("ids={}", ids.display()),
        "--json",
    ]);
    assert!(o.status.success(), "run failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let outs = v["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[0]["dtype"], "f32");
    assert_eq!(outs[0]["shape"], serde_json::json!([2, 8, 50]));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--threads N` (and `KILN_NUM_THREADS` when it is absent) sets the
/// session's thread count; the outputs are the same bytes at any count.
#[test]
fn run_threads_flag_and_env() {
    let dir = tmp_dir("threads");
    let artifact = dir.join("m.kiln");
    compile(&fixtures().join("models/resnet18/aten.pt2"), &artifact);
    let input = format!("0={}", fixtures().join("models/resnet18/input_0.npy").display());
    let run = |threads: Option<&str>, env: Option<&str>, out: &Path| {
        let mut args = vec!["run", artifact.to_str().unwrap(), "--input", &input, "--json"];
        args.extend(["--output-dir", out.to_str().unwrap()]);
        if let Some(t) = threads {
            args.extend(["--threads", t]);
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.args(&args).env_remove("KILN_NUM_THREADS");
        if let Some(e) = env {
            cmd.env("KILN_NUM_THREADS", e);
        }
        let o = cmd.output().expect("run kiln");
        assert!(o.status.success(), "run failed: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
        (v["threads"].as_u64(), std::fs::read(out.join("output_0.npy")).unwrap())
    };
    let (t1, one) = run(Some("1"), Some("4"), &dir.join("o1"));
    let (t3, three) = run(Some("3"), None, &dir.join("o3"));
    let (t2, env_two) = run(None, Some("2"), &dir.join("o2"));
    assert_eq!((t1, t3, t2), (Some(1), Some(3), Some(2)));
    assert!(one == three && one == env_two, "outputs differ between thread counts");
    let o = kiln(&["run", artifact.to_str().unwrap(), "--input", &input, "--threads", "0"]);
    assert!(!o.status.success() && stderr(&o).contains("threads"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn inspect_text_and_json() {
    let dir = tmp_dir("inspect");
    let artifact = dir.join("d.kiln");
    compile(&fixtures().join("dynamic_mlp/aten.pt2"), &artifact);
    let o = kiln(&["inspect", artifact.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    // The MLP's matmuls by constant weights and their bias adds run as fused linears.
    for needle in ["input", "output", "kiln format", "arena", "weights", "linear_fused", "softmax"] {
        assert!(text.contains(needle), "inspect output lacks `{needle}`:\n{text}");
    }
    let o = kiln(&["inspect", artifact.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    assert_eq!(v["inputs"][0]["dtype"], "f32");
    assert_eq!(v["symbols"][0]["min"], 1);
    assert_eq!(v["symbols"][0]["max"], 64);
    let sym = v["symbols"][0]["name"].as_str().unwrap();
    assert_eq!(v["inputs"][0]["shape"], serde_json::json!([sym, "16"]));
    assert!(v["arena_bytes"].as_u64().unwrap() >= v["peak_live_bytes"].as_u64().unwrap());
    assert!(v["weights_bytes"].as_u64().unwrap() > 0);
    assert!(v["kernels"].as_array().unwrap().iter().any(|k| k["kernel"] == "linear_fused"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unsupported_ops_are_all_listed_with_python_lines() {
    let dir = tmp_dir("unsupported");
    let model = fixtures().join("unsupported/two_unsupported.pt2");
    let o = kiln(&["compile", model.to_str().unwrap(), "-o", dir.join("x.kiln").to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("aten.linalg_eigvals.default") && err.contains("aten.linalg_matrix_exp.default"), "{err}");
    assert!(err.contains("generate_unsupported.py:"), "python lines missing: {err}");
    assert!(!dir.join("x.kiln").exists(), "no artifact on failure");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_invocations_give_clear_errors() {
    let dir = tmp_dir("errors");
    let not_pt2 = dir.join("junk.pt2");
    std::fs::write(&not_pt2, b"definitely not a zip").unwrap();
    let o = kiln(&["compile", not_pt2.to_str().unwrap(), "-o", dir.join("j.kiln").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("junk.pt2"), "{}", stderr(&o));

    let o = kiln(&["inspect", not_pt2.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("shorter than the 48-byte header"), "{}", stderr(&o));
    let junk = dir.join("junk.kiln");
    std::fs::write(&junk, [7u8; 100]).unwrap();
    let o = kiln(&["inspect", junk.to_str().unwrap()]);
    assert!(stderr(&o).contains("not a .kiln file"), "{}", stderr(&o));

    let artifact = dir.join("m.kiln");
    compile(&fixtures().join("mlp/aten.pt2"), &artifact);
    let o = kiln(&["run", artifact.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing input 0"), "{}", stderr(&o));
    let o = kiln(&["run", artifact.to_str().unwrap(), "--input", "nosuch=x.npy"]);
    assert!(stderr(&o).contains("no input named `nosuch`"), "{}", stderr(&o));
    let o = kiln(&[
        "run",
        artifact.to_str().unwrap(),
        "--input",
        &format!("0={}", fixtures().join("cnn/input_0.npy").display()),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("input 0"), "{}", stderr(&o));
    let o = kiln(&["compile", "x.pt2", "-o", "y.kiln", "--target", "quantum"]);
    assert!(stderr(&o).contains("unknown target"), "{}", stderr(&o));
    let mlp = fixtures().join("mlp/aten.pt2");
    let (mlp, out) = (mlp.to_str().unwrap(), dir.join("q.kiln"));
    let q = |extra: &[&str]| kiln(&[&["compile", mlp, "-o", out.to_str().unwrap()], extra].concat());
    let o = q(&["--quantize", "int8-weight", "--max-cosine-drop", "0.01"]);
    assert!(stderr(&o).contains("--max-cosine-drop needs --quantize auto"), "{}", stderr(&o));
    let o = q(&["--quantize", "auto", "--max-cosine-drop=-1"]);
    assert!(stderr(&o).contains("must be in [0, 2]"), "{}", stderr(&o));
    let o = q(&["--quantize", "auto:int3"]);
    assert!(stderr(&o).contains("unknown quantization mode `int3`"), "{}", stderr(&o));
    let o = q(&["--quantize", "auto"]);
    assert!(stderr(&o).contains("needs --calibration"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn help_has_examples() {
    let o = kiln(&["run", "--help"]);
    assert!(stdout(&o).contains("kiln run model.kiln --input 0=x.npy"));
}

/// `kiln inspect` says how each state is written: the filter's elementwise
/// update and the KV cache's row write in place (naming the op), and under
/// `--target pjrt` on the device with the buffer donated.
#[test]
fn inspect_shows_how_each_state_is_written() {
    let dir = tmp_dir("state-writes");
    for (name, kernels) in [("lowpass", &["fused", "add", "mul"][..]), ("kv_decoder", &["index_put"][..])] {
        let artifact = dir.join(format!("{name}.kiln"));
        compile(&fixtures().join(format!("state/{name}/aten.pt2")), &artifact);
        let o = kiln(&["inspect", artifact.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = stdout(&o);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("state") && l.contains("written")).collect();
        assert!(!lines.is_empty(), "{name}: no state write lines:\n{text}");
        for line in &lines {
            assert!(line.contains("written in place by `"), "{name}: {line}");
            assert!(kernels.iter().any(|k| line.contains(&format!("`{k}`"))), "{name}: {line}");
        }
        let o = kiln(&["inspect", artifact.to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
        for st in v["states"].as_array().expect("states") {
            let w = &st["write"];
            assert_eq!(w["how"], "in_place", "{name}: {st}");
            let kernel = w["kernel"].as_str().expect("kernel");
            assert!(kernels.contains(&kernel), "{name}: {st}");
            let instr = w["instr"].as_u64().expect("instr");
            assert!(instr < v["instructions"].as_u64().unwrap(), "{name}: {st}");
        }
    }
    #[cfg(feature = "mlir")]
    {
        let artifact = dir.join("lowpass-pjrt.kiln");
        let model = fixtures().join("state/lowpass/aten.pt2");
        let o = kiln(&["compile", model.to_str().unwrap(), "-o", artifact.to_str().unwrap(), "--target", "pjrt"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = kiln(&["inspect", artifact.to_str().unwrap()]);
        let text = stdout(&o);
        assert!(text.contains("written on the device, in place (buffer donated to segment 0)"), "{text}");
        let o = kiln(&["inspect", artifact.to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
        let w = &v["states"][0]["write"];
        assert_eq!((&w["how"], &w["segment"], &w["donated"]), (&"device".into(), &0.into(), &true.into()), "{v}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn run_steps_carries_state_and_reports_per_step_latency() {
    let dir = tmp_dir("steps");
    let artifact = dir.join("lowpass.kiln");
    let fixture = fixtures().join("state/lowpass");
    compile(&fixture.join("training.pt2"), &artifact);
    let o = kiln(&["inspect", artifact.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let state = &v["states"][0];
    assert_eq!(
        (&state["name"], &state["dtype"], &state["shape"]),
        (&"state".into(), &"f32".into(), &serde_json::json!(["2", "4"]))
    );
    assert_eq!(v["states"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["inputs"].as_array().map(Vec::len), Some(1), "state is not an input: {v}");
    let out_dir = dir.join("out");
    let o = kiln(&[
        "run",
        artifact.to_str().unwrap(),
        "--steps",
        fixture.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "run --steps failed: {}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("--json prints JSON");
    let steps = report["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 6, "{report}");
    assert!(steps.iter().all(|s| s["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0)), "{report}");
    assert_eq!(report["states"], serde_json::json!(["state"]));
    // Every step's output is eager's for that step: the filter state carried over.
    for k in 0..6 {
        let got = kiln_compiler::npy::read_npy(&out_dir.join(format!("step_{k}/output_0.npy"))).unwrap();
        let want = kiln_compiler::npy::read_npy(&fixture.join(format!("step_{k}/output_0.npy"))).unwrap();
        for (g, w) in got.to_f32().unwrap().iter().zip(&want.to_f32().unwrap()) {
            assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "step {k}: {g} vs {w}");
        }
    }
    // A step folder missing an input is an error naming it.
    let bad = dir.join("bad");
    std::fs::create_dir_all(bad.join("step_0")).unwrap();
    let o = kiln(&["run", artifact.to_str().unwrap(), "--steps", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing input 0"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// Complex inputs and outputs through `kiln run`: `<c8`/`<c16` files in by
/// name, `<c8` files out holding PyTorch's numbers (part by part), `|z|`
/// statistics, and `kiln inspect` showing the complex types.
#[test]
fn run_reads_and_writes_complex_npy() {
    let dir = tmp_dir("complex");
    let artifact = dir.join("complex.kiln");
    let fixture = fixtures().join("complex_io");
    compile(&fixture.join("aten.pt2"), &artifact);
    let out_dir = dir.join("out");
    let mut args = vec!["run".to_string(), artifact.display().to_string(), "--json".to_string()];
    for (i, name) in ["z", "u", "w", "x", "zz"].iter().enumerate() {
        args.extend([
            "--input".to_string(),
            format!("{name}={}", fixture.join(format!("case0_input_{i}.npy")).display()),
        ]);
    }
    args.extend(["--output-dir".to_string(), out_dir.display().to_string()]);
    let o = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "run failed: {}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(summary["outputs"][0]["dtype"], "c64");
    assert_eq!(summary["outputs"][0]["stats_of"], "abs");
    assert_eq!(summary["outputs"][9]["dtype"], "c128");
    for i in [0, 3, 9] {
        let got = kiln_compiler::npy::read_npy(&out_dir.join(format!("output_{i}.npy"))).unwrap();
        let want = kiln_compiler::npy::read_npy(&fixture.join(format!("case0_output_{i}.npy"))).unwrap();
        assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "output {i}");
        let (g, w) = (kiln_runtime::elements_f64(&got.view()), kiln_runtime::elements_f64(&want.view()));
        for (a, b) in g.iter().zip(&w) {
            assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "output {i}: {a} vs {b}");
        }
    }
    let o = kiln(&["inspect", artifact.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("c64") && stdout(&o).contains("c128"), "{}", stdout(&o));
    std::fs::remove_dir_all(&dir).ok();
}
