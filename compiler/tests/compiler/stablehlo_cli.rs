//! `kiln compile --target pjrt` from the command line: a clear error without
//! the `mlir` feature, a mixed-plan artifact with it.

use std::process::Command;

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn target_pjrt() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp/training.pt2");
    let dir = std::env::temp_dir().join(format!("kiln-stablehlo-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let artifact = dir.join("mlp.kiln");
    let artifact = artifact.to_str().expect("utf-8 temp path");
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--target", "pjrt", "--precision", "bf16"]);
    if cfg!(feature = "mlir") {
        assert!(ok, "{text}");
        assert!(text.contains("target pjrt, bf16"), "{text}");
        let (ok, text) = kiln(&["inspect", artifact]);
        assert!(ok && text.contains("accel"), "{text}");
    } else {
        assert!(!ok);
        assert!(text.contains("built without MLIR support; rebuild with --features mlir"), "{text}");
    }
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--precision", "bf16"]);
    assert!(!ok && text.contains("--precision applies to --target pjrt only"), "{text}");
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--target", "pjrt", "--precision", "fp8"]);
    assert!(!ok && text.contains("unknown precision"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--mesh`, `--shard`, `--shard-spec` and `--report`; a sharded artifact
/// runs with `--device pjrt:PATH` on as many devices as its mesh has.
#[test]
fn mesh_and_shard_flags() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp/training.pt2");
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp/input_0.npy");
    let dir = std::env::temp_dir().join(format!("kiln-shard-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let artifact = dir.join("mlp.kiln");
    let artifact = artifact.to_str().expect("utf-8 temp path");
    let spec = dir.join("spec.json");
    std::fs::write(
        &spec,
        r#"{"devices": [1, 0], "overrides": [{"tensor": "fc2.weight", "sharding": [[], ["model"]]}]}"#,
    )
    .expect("spec");
    let spec = spec.to_str().expect("utf-8 temp path");
    let compile = |extra: &[&str]| {
        let mut args = vec!["compile", model, "-o", artifact, "--target", "pjrt"];
        args.extend_from_slice(extra);
        kiln(&args)
    };
    let (ok, text) = compile(&["--mesh", "model=2", "--shard", "tensor-parallel", "--shard-spec", spec, "--report"]);
    if !cfg!(feature = "mlir") {
        assert!(!ok);
        std::fs::remove_dir_all(&dir).ok();
        return;
    }
    assert!(ok, "{text}");
    assert!(text.contains("sharding over mesh [model=2]"), "{text}");
    assert!(text.contains("fc2.weight") && text.contains("[{}, {model}]"), "{text}");
    assert!(text.contains("fc1.weight") && text.contains("[{model}, {}]"), "{text}");
    assert!(text.contains("estimated per step and device:") && text.contains("communication"), "{text}");
    let (ok, text) = kiln(&["inspect", artifact]);
    assert!(ok && text.contains("mesh [model=2] (2 devices, devices [1, 0])"), "{text}");
    // The artifact keeps the compiler's estimate: inspect shows it.
    assert!(text.contains("estimated per step and device:") && text.contains("peak activations"), "{text}");
    if let Some(plugin) = std::env::var_os("KILN_TEST_XLA_CPU_PLUGIN").filter(|p| !p.is_empty()) {
        let device = format!("pjrt:{}", plugin.to_string_lossy());
        let (ok, text) = kiln(&["run", artifact, "--device", &device, "--input", &format!("0={input}")]);
        assert!(ok && text.contains("SPMD over 2 devices"), "{text}");
        two_nodes_return_the_one_process_outputs(artifact, &device, input, &dir);
    }
    // auto explains itself: the cost model, every strategy, every layer's options.
    let (ok, text) =
        compile(&["--mesh", "data=2,model=2", "--shard", "auto", "--shard-cost", "memory=2e5", "--report"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("auto: cost model 1.000e14 FLOP/s per device") && text.contains("memory 200.00 kB"),
        "{text}"
    );
    for strategy in ["data-parallel", "tensor-parallel", "fsdp", "replicated"] {
        assert!(text.contains(&format!("    {strategy:<16} ")), "{strategy}: {text}");
    }
    assert!(text.contains("fc1.weight (") && text.contains("<- chosen") && text.contains("<- start"), "{text}");
    let (ok, shown) = kiln(&["inspect", artifact]);
    assert!(
        ok && shown.contains("auto: cost model 1.000e14 FLOP/s per device") && shown.contains("<- chosen"),
        "{shown}"
    );
    let (ok, json) = kiln(&["inspect", artifact, "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let estimate = &doc["accel"]["estimate"];
    assert!(ok && estimate["compute_s"].as_f64().is_some_and(|s| s > 0.0), "{json}");
    assert!(estimate["weight_bytes"].as_u64().is_some_and(|b| b > 0), "{json}");
    if let Some(plugin) = std::env::var_os("KILN_TEST_XLA_CPU_PLUGIN").filter(|p| !p.is_empty()) {
        let device = format!("pjrt:{}", plugin.to_string_lossy());
        let (ok, text) = kiln(&["run", artifact, "--device", &device, "--input", &format!("0={input}")]);
        assert!(ok && text.contains("SPMD over 4 devices"), "{text}");
    }
    for (extra, want) in [
        (&["--mesh", "data=2,data=2"][..], "mesh axis `data` is named twice"),
        (&["--mesh", "data=3"], "mesh axis `data` (size 3) does not divide dim 0 (size 4) of `x`"),
        (&["--mesh", "data=2", "--shard", "diagonal"], "unknown --shard `diagonal`"),
        (&["--mesh", "data=2", "--shard", "auto", "--shard-cost", "flops=fast"], "`fast` is not a number"),
        (&["--shard-cost", "flops=1e12"], "--shard-cost needs --mesh"),
        (&["--mesh", "data=2", "--sharding-dialect", "xyz"], "unknown --sharding-dialect `xyz`"),
        (&["--shard-spec", spec], "--shard-spec needs --mesh"),
    ] {
        let (ok, text) = compile(extra);
        assert!(!ok && text.contains(want), "{extra:?}: {text}");
    }
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--mesh", "data=2"]);
    assert!(!ok && text.contains("--mesh needs --target pjrt"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--shard auto` on a mixture of experts: the report lists each experts'
/// layer with expert parallelism among its costed options.
/// `kiln run --node I/N --coordinator ADDR`, two processes started together:
/// node 1 first (it retries the coordinator until node 0 listens), node 0
/// waits for node 1's report before it exits. The XLA CPU plugin gives each
/// process every device, so each runs the whole mesh (no exchange: the
/// exchange is tested with a fake multi-host plugin in the runtime); both
/// write the one-process bytes.
fn two_nodes_return_the_one_process_outputs(artifact: &str, device: &str, input: &str, dir: &std::path::Path) {
    let out = |name: &str| dir.join(name).to_str().expect("utf-8 temp path").to_string();
    let (ok, text) =
        kiln(&["run", artifact, "--device", device, "--input", &format!("0={input}"), "--output-dir", &out("one")]);
    assert!(ok, "{text}");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let coordinator = format!("127.0.0.1:{port}");
    let node = |i: u32| {
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", artifact, "--device", device, "--input", &format!("0={input}")])
            .args([
                "--output-dir",
                &out(&format!("node{i}")),
                "--node",
                &format!("{i}/2"),
                "--coordinator",
                &coordinator,
            ])
            .args(["--session", "cli-test", "--peer-timeout", "60"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn kiln")
    };
    let mut peer = node(1);
    let status = node(0).wait().expect("node 0");
    assert!(status.success(), "node 0 failed");
    assert!(peer.wait().expect("node 1").success(), "node 1 failed");
    let one = std::fs::read(dir.join("one/output_0.npy")).expect("one-process output");
    for i in 0..2 {
        let got = std::fs::read(dir.join(format!("node{i}/output_0.npy"))).expect("node output");
        assert_eq!(got, one, "node {i}");
    }
    // A peer that fails is named by node 0.
    let peer = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", artifact, "--device", device, "--input", "0=/nonexistent.npy"])
        .args(["--node", "1/2", "--coordinator", &coordinator, "--peer-timeout", "60"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn kiln");
    let (ok, text) = kiln(&[
        "run",
        artifact,
        "--device",
        device,
        "--input",
        &format!("0={input}"),
        "--node",
        "0/2",
        "--coordinator",
        &coordinator,
        "--peer-timeout",
        "60",
    ]);
    assert!(!peer.wait_with_output().expect("node 1").status.success());
    assert!(!ok && text.contains("node 1 failed:") && text.contains("nonexistent.npy"), "{text}");
}

#[test]
fn auto_report_shows_expert_parallelism() {
    if !cfg!(feature = "mlir") {
        return;
    }
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/qwen3_moe_batch/training.pt2");
    let dir = std::env::temp_dir().join(format!("kiln-moe-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let artifact = dir.join("moe.kiln");
    let artifact = artifact.to_str().expect("utf-8 temp path");
    let args =
        ["compile", model, "-o", artifact, "--target", "pjrt", "--mesh", "model=2", "--shard", "auto", "--report"];
    let (ok, text) = kiln(&args);
    assert!(ok, "{text}");
    for layer in ["experts.gate_up_proj (", "experts.down_proj ("] {
        let at = text.find(layer).unwrap_or_else(|| panic!("no {layer} in {text}"));
        let options: String = text[at..].lines().skip(1).take(5).collect::<Vec<_>>().join("\n");
        assert!(options.contains("expert-parallel"), "{layer}: {options}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `kiln run --profile --json` on a PJRT artifact reports each segment's
/// calls, device execute time and host↔device bytes (the mlp is one segment:
/// its input goes up and its output comes down), and names the largest costs.
#[test]
fn profile_reports_segments() {
    let Some(plugin) = std::env::var_os("KILN_TEST_XLA_CPU_PLUGIN").filter(|p| !p.is_empty()) else { return };
    if !cfg!(feature = "mlir") {
        return;
    }
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp/training.pt2");
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp/input_0.npy");
    let dir = std::env::temp_dir().join(format!("kiln-profile-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let artifact = dir.join("mlp.kiln");
    let artifact = artifact.to_str().expect("utf-8 temp path");
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--target", "pjrt"]);
    assert!(ok, "{text}");
    let device = format!("pjrt:{}", plugin.to_string_lossy());
    let run = ["run", artifact, "--device", &device, "--input", &format!("0={input}"), "--profile"];
    let (ok, text) = kiln(&[&run[..], &["--json"]].concat());
    assert!(ok, "{text}");
    let line = text.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {text}"));
    let doc: serde_json::Value = serde_json::from_str(line).expect("JSON");
    let segments = doc["accel_profile"]["segments"].as_array().unwrap_or_else(|| panic!("no accel_profile: {doc}"));
    assert_eq!(segments.len(), 1, "{doc}");
    let seg = &segments[0];
    assert_eq!(seg["calls"], 1, "{doc}");
    assert!(seg["execute_ms"].as_f64().is_some_and(|t| t > 0.0), "{doc}");
    let out_bytes: u64 = doc["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .map(|o| o["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim")).product::<u64>() * 4)
        .sum();
    // The .npy's data: the file less its (version 1) header.
    let npy = std::fs::read(input).expect("input");
    let in_bytes = (npy.len() - 10 - usize::from(u16::from_le_bytes([npy[8], npy[9]]))) as u64;
    assert_eq!(seg["upload_bytes"].as_u64(), Some(in_bytes), "{doc}");
    assert_eq!(seg["download_bytes"].as_u64(), Some(out_bytes), "{doc}");
    assert_eq!(doc["accel_profile"]["largest"][0]["segment"], 0, "{doc}");
    let (ok, text) = kiln(&run);
    assert!(ok && text.contains("largest accelerator costs: segment 0"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
