//! Ring attention (`--shard context-parallel` over a `seq` axis) on the
//! XLA CPU plugin: every attention of the `ring_attention` fixture (a causal
//! SDPA, a key-padding-masked one and one under a full mask with a query
//! row masked entirely: zeros there, as in torch), BERT (padding mask) and Llama (its
//! causal mask, grouped-query heads), in both flavours (Core ATen's
//! matmul–softmax–matmul recognised, its linears on batch × sequence rows
//! unflattened), becomes one manual region passing key
//! and value blocks around the ring; the regions' permutes, the verifier,
//! the report; outputs against one device and PyTorch on 2, 4 and 8
//! devices; the requests kiln refuses. `ring_long` (64 causal tokens,
//! grouped-query heads) and the causal SDPAs where `2n` divides the length
//! are zig-zag under a cost model where the reorder is cheap (their
//! reorder permutes' tables checked), and plain causal rings under one
//! where it is dear (the default's 10 µs per collective, at these sizes,
//! or a slow link); `--shard auto`
//! with a `seq` axis rings `ring_long` and keeps `ring_wide` (wide layers,
//! weights over the memory limit) tensor-parallel. The sharded runs go through the
//! `kiln` binary in a child process (a wrong collective aborts the
//! plugin's process). Needs `KILN_TEST_XLA_CPU_PLUGIN` for the runs; the
//! rest runs without it.
//!
//! The online softmax adds the blocks' exponentials in another order than
//! one softmax over the whole row (and rescales partial sums), so results
//! are not bit-identical to one device: measured within 4.3e-6 of PyTorch and
//! one device on these fixtures; the bound asserted is torch's f32
//! tolerance (rtol 1e-4, atol 1e-5).
#![cfg(feature = "mlir")]

use crate::stablehlo_support::*;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::sharding::ShardingDialect;
use kiln_compiler::stablehlo::verify::{verify_collectives, Devices};
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, Backend, CompileOptions, ShardConfig};
use kiln_ir::Mesh;
use kiln_passes::shard::{CostModel, Strategy};
use kiln_runtime::format::Metadata;
use kiln_runtime::Program;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// A slow device on fast links (`--shard-cost`): the zig-zag reorder costs
/// next to nothing against the compute it saves, so every ring where it
/// fits zig-zags.
const CHEAP_REORDER: &str = "flops=1e6,link=1e15,latency=1e-12";
/// A slow link with a high latency: the reorder's eight permutes cost more
/// than the skipped compute saves, so causal rings stay plain.
const DEAR_REORDER: &str = "link=1e6,latency=1e-3";

/// `kiln compile FIX/FLAVOUR.pt2 -o ARTIFACT --target pjrt --mesh MESH
/// --shard context-parallel --shard-cost COST --report`: success and output.
fn compile_context_parallel(fix: &Path, flavour: &str, artifact: &str, mesh: &str, cost: &str) -> (bool, String) {
    let pt2 = fix.join(format!("{flavour}.pt2"));
    let pt2 = pt2.to_str().expect("utf-8");
    let shard = ["--mesh", mesh, "--shard", "context-parallel", "--shard-cost", cost, "--report"];
    let mut args = vec!["compile", pt2, "-o", artifact, "--target", "pjrt"];
    args.extend(shard);
    kiln(&args)
}

fn ring(mesh: &[(&str, u32)]) -> ShardConfig {
    ring_under(mesh, CHEAP_REORDER)
}

fn ring_under(mesh: &[(&str, u32)], cost: &str) -> ShardConfig {
    ShardConfig {
        mesh: Mesh::new(mesh),
        strategy: Strategy::ContextParallel,
        overrides: vec![],
        dialect: ShardingDialect::Shardy,
        cost: CostModel::parse(cost).unwrap_or_else(|e| panic!("{e}")),
    }
}

fn compile_with(fixture: &str, flavour: &str, shard: Option<ShardConfig>) -> Result<Arc<Program>, String> {
    let graph = import_pt2(&fixture_dir(fixture).join(format!("{flavour}.pt2"))).map_err(|e| e.to_string())?.graph;
    let opts = CompileOptions { shard, ..CompileOptions::default() };
    let (writer, _) = compile_graph_for(graph, &opts, Backend::Pjrt { precision: Precision::F32 }, Metadata::default())
        .map_err(|e| e.to_string())?;
    Program::from_bytes(&writer.to_bytes()).map_err(|e| e.to_string())
}

/// Every attention is one manual region with `n − 1` permutes each of its
/// key and value blocks, their pairs a ring (`i → i + 1`, the last back to
/// the first) along `seq`; the verifier accepts the module for the mesh's
/// devices and refuses it for fewer.
#[test]
fn attentions_are_regions_with_ring_permutes() {
    for (fixture, flavour) in [
        ("ring_attention", "training"),
        ("ring_attention", "aten"),
        ("models/bert", "training"),
        ("models/bert", "aten"),
        ("models/llama", "training"),
        ("models/llama", "aten"),
        ("ring_long", "training"),
        ("ring_long", "aten"),
    ] {
        for (mesh, pairs) in [
            (&[("seq", 2)][..], "dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>"),
            (&[("seq", 4)], "dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>"),
            (&[("data", 2), ("seq", 2)], "dense<[[0, 1], [1, 0], [2, 3], [3, 2]]> : tensor<4x2xi64>"),
            (&[("seq", 2), ("data", 2)], "dense<[[0, 2], [2, 0], [1, 3], [3, 1]]> : tensor<4x2xi64>"),
        ] {
            // Llama's and ring_long's batch of one cannot be split over `data`.
            if (fixture == "models/llama" || fixture == "ring_long") && mesh.len() > 1 {
                continue;
            }
            let what = format!("{fixture}/{flavour} on {mesh:?}");
            let shard = ring(mesh);
            let devices = shard.mesh.size() as u32;
            let n = shard.mesh.axis("seq").map_or(1, |a| a.size) as usize;
            let program = compile_with(fixture, flavour, Some(shard)).unwrap_or_else(|e| panic!("{what}: {e}"));
            let accel = accel(&program);
            assert_eq!(accel.segments.len(), 1, "{what}");
            let text = &accel.segments[0].mlir;
            // BERT and Llama have two layers; `ring_attention` three attentions.
            let rings = match fixture {
                "ring_attention" => 3,
                "ring_long" => 1,
                _ => 2,
            };
            assert_eq!(text.matches("\"sdy.manual_computation\"").count(), rings, "{what}");
            // The causal SDPAs (Core ATen's: a constant causal mask;
            // Llama's: a mask computed from constants, evaluated) are
            // zig-zag where 2n divides their length: 6 permutes in (q, k,
            // v's even and odd chunks), 2 out. BERT's padding mask is not causal.
            let length = if fixture == "ring_long" { 64 } else { 8 };
            let zigzag = match fixture {
                _ if length % (2 * n) != 0 => 0,
                "models/bert" => 0,
                "models/llama" => 2,
                _ => 1,
            };
            let permutes = rings * 2 * (n - 1) + 8 * zigzag;
            assert_eq!(text.matches("\"stablehlo.collective_permute\"").count(), permutes, "{what}");
            let pairs = format!("source_target_pairs = {pairs}");
            // (With two devices the reorder's odd chunks swap like the ring.)
            let ring_pairs = rings * 2 * (n - 1) + if n == 2 { 4 * zigzag } else { 0 };
            assert_eq!(text.matches(&pairs).count(), ring_pairs, "{what}: {pairs}");
            if zigzag > 0 && mesh == [("seq", 4)] {
                // Chunk 2d (2d + 1) from position d to its zig-zag home,
                // then back from each position to chunk / 2.
                for (table, uses) in [
                    ("[[0, 0], [1, 2], [2, 3], [3, 1]]", 3),
                    ("[[0, 1], [1, 3], [2, 2], [3, 0]]", 3),
                    ("[[0, 0], [1, 3], [2, 1], [3, 2]]", 1),
                    ("[[0, 3], [1, 0], [2, 2], [3, 1]]", 1),
                ] {
                    let pairs = format!("source_target_pairs = dense<{table}> : tensor<4x2xi64>");
                    assert_eq!(text.matches(&pairs).count(), uses * zigzag, "{what}: {pairs}");
                }
            }
            assert_eq!(verify_collectives(text, Devices { replicas: 1, partitions: devices }), Ok(()), "{what}");
            let fewer = verify_collectives(text, Devices { replicas: 1, partitions: devices / 2 });
            assert!(fewer.is_err(), "{what}");
        }
    }
}

/// What kiln refuses, at compile time, with the reason.
#[test]
fn bad_requests_are_compile_errors() {
    let refused = |fixture: &str, shard: ShardConfig| match compile_with(fixture, "training", Some(shard)) {
        Ok(_) => panic!("{fixture} compiled"),
        Err(e) => e,
    };
    let e = refused("models/bert", ring(&[("seq", 3)]));
    assert!(
        e.contains("the sequence length 8 (dim 1 of `args_0`) is not divisible by the 3 devices of mesh axis `seq`"),
        "{e}"
    );
    let e = refused("models/bert", ring(&[("data", 2)]));
    assert!(e.contains("--shard context-parallel needs a mesh axis `seq`"), "{e}");
    let e = refused("transformer_dynseq", ring(&[("seq", 2)]));
    assert!(
        e.contains("the sequence (dim 1) of `ids` is dynamic; ring attention needs a static sequence length"),
        "{e}"
    );
    let e = refused("models/bert", ShardConfig { dialect: ShardingDialect::Gspmd, ..ring(&[("seq", 2)]) });
    assert!(e.contains("--shard context-parallel writes manual regions"), "{e}");
    let e = refused("mlp", ring(&[("seq", 2)]));
    assert!(e.contains("the program has no attention"), "{e}");
}

/// `--shard context-parallel` through the CLI in a child process: the
/// report names each ring and the bytes it moves per step; `kiln inspect`
/// keeps it; outputs match PyTorch and one device within torch's tolerance.
#[test]
fn rings_match_one_device_and_pytorch() {
    let Some(plugin) = plugin() else { return };
    let device = format!("pjrt:{}", plugin.display());
    let dir = std::env::temp_dir().join(format!("kiln-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cases: &[(&str, &str, &[&str], &str)] = &[
        // (fixture, flavour, meshes, what the report says of the rings)
        ("ring_long", "training", &["seq=2", "seq=4", "seq=8"], "causal"),
        ("ring_long", "aten", &["seq=2", "seq=8"], "causal"),
        ("ring_attention", "training", &["seq=2", "seq=4", "seq=8", "data=2,seq=2"], "some causal"),
        ("ring_attention", "aten", &["seq=2", "seq=4", "seq=8", "data=2,seq=2"], "some causal"),
        ("models/bert", "training", &["seq=2", "seq=4", "data=2,seq=2"], "not causal"),
        ("models/bert", "aten", &["seq=2", "seq=4"], "not causal"),
        ("models/llama", "training", &["seq=2", "seq=4", "seq=8"], "causal"),
        ("models/llama", "aten", &["seq=2", "seq=4", "seq=8"], "causal"),
    ];
    for &(fixture, flavour, meshes, causal) in cases {
        let fix = fixture_dir(fixture);
        let inputs = read_numbered(&fix, "input");
        let expected = read_numbered(&fix, "output");
        let one = run_pjrt(&compile_with(fixture, flavour, None).unwrap_or_else(|e| panic!("{e}")), &plugin, &inputs);
        for &mesh in meshes {
            let what = format!("{fixture}/{flavour} context-parallel [{mesh}]");
            let n: usize = mesh.rsplit('=').next().and_then(|s| s.parse().ok()).unwrap_or(1);
            let devices: usize = mesh.split(',').filter_map(|a| a.split('=').nth(1)?.parse::<usize>().ok()).product();
            let artifact = dir.join("ring.kiln");
            let artifact = artifact.to_str().expect("utf-8");
            let (ok, report) = compile_context_parallel(&fix, flavour, artifact, mesh, CHEAP_REORDER);
            assert!(ok, "{what}: {report}");
            let rings = match fixture {
                "ring_attention" => 3,
                "ring_long" => 1,
                _ => 2,
            };
            let line = format!("ring attention: {rings} attention(s) over `seq` in {n} steps each ({causal})");
            assert!(report.contains(&line), "{what}: {line}: {report}");
            // The causal SDPAs are zig-zag where 2n divides their length,
            // with the FLOPs of the halves skipped.
            let length = if fixture == "ring_long" { 64 } else { 8 };
            if fixture != "models/bert" {
                let layout = if length % (2 * n) == 0 {
                    format!("zig-zag (chunks i and {}-i of {} per device", 2 * n - 1, 2 * n)
                } else {
                    format!("contiguous, every block computed ({} does not divide the length)", 2 * n)
                };
                assert!(report.contains(&layout), "{what}: {layout}: {report}");
            }
            let permutes = format!("{} permutes of the key and value blocks", n - 1);
            assert_eq!(report.matches(&permutes).count(), rings, "{what}: {report}");
            let (ok, shown) = kiln(&["inspect", artifact]);
            assert!(ok && shown.contains(&line) && shown.contains("collective-permute"), "{what}: {shown}");
            let out = dir.join("out");
            let mut run = vec!["run".to_string(), artifact.to_string(), "--device".into(), device.clone()];
            for i in 0..inputs.len() {
                run.extend(["--input".to_string(), format!("{i}={}", fix.join(format!("input_{i}.npy")).display())]);
            }
            run.extend(["--output-dir".to_string(), out.to_str().expect("utf-8").to_string()]);
            let (ok, text) = kiln(&run.iter().map(String::as_str).collect::<Vec<_>>());
            assert!(ok && text.contains(&format!("SPMD over {devices} devices")), "{what}: {text}");
            let got = read_numbered(&out, "output");
            assert_eq!(got.len(), expected.len(), "{what}");
            for (i, ((g, want), one)) in got.iter().zip(&expected).zip(&one).enumerate() {
                assert_close(&format!("{what}: output {i} vs PyTorch"), g, want, RTOL, ATOL);
                assert_close(&format!("{what}: output {i} vs one device"), g, one, RTOL, ATOL);
                let max_diff = |b: &kiln_runtime::Tensor| {
                    values(g).iter().zip(values(b)).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
                };
                eprintln!(
                    "{what}: output {i} max |diff| {:.2e} vs PyTorch, {:.2e} vs one device",
                    max_diff(want),
                    max_diff(one)
                );
            }
            std::fs::remove_dir_all(&out).ok();
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Where the cost model makes the zig-zag reorder dear (a slow link, or
/// the default model's 10 µs per collective at these sizes), the causal
/// rings that could zig-zag plan the plain causal ring instead: only the
/// `2(n − 1)` ring permutes per attention, none of the reorder's, and the
/// report says why; under a cheap reorder the same programs zig-zag (8
/// more permutes per attention). The plain rings (in a child process)
/// match PyTorch and one device.
#[test]
fn dear_reorder_keeps_the_plain_causal_ring() {
    let permutes = |fixture: &str, flavour: &str, mesh: &[(&str, u32)], cost: &str| {
        let program =
            compile_with(fixture, flavour, Some(ring_under(mesh, cost))).unwrap_or_else(|e| panic!("{fixture}: {e}"));
        accel(&program).segments[0].mlir.matches("\"stablehlo.collective_permute\"").count()
    };
    // (fixture, causal attentions that fit zig-zag on 2 and 4 devices, all attentions)
    for (fixture, zigzag, rings) in [("ring_long", 1, 1), ("models/llama", 2, 2), ("ring_attention", 1, 3)] {
        for flavour in ["training", "aten"] {
            for n in [2u32, 4] {
                // 8 or 64 positions: 2n divides them on 2 and 4 devices.
                let what = format!("{fixture}/{flavour} on seq={n}");
                let mesh = [("seq", n)];
                let ring = rings * 2 * (n as usize - 1);
                assert_eq!(permutes(fixture, flavour, &mesh, DEAR_REORDER), ring, "{what}: dear reorder");
                assert_eq!(permutes(fixture, flavour, &mesh, ""), ring, "{what}: default model");
                assert_eq!(
                    permutes(fixture, flavour, &mesh, CHEAP_REORDER),
                    ring + 8 * zigzag,
                    "{what}: cheap reorder"
                );
            }
        }
    }
    let Some(plugin) = plugin() else { return };
    let dir = std::env::temp_dir().join(format!("kiln-ring-dear-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (fixture, flavour, mesh) in [
        ("ring_long", "training", "seq=2"),
        ("ring_long", "aten", "seq=4"),
        ("models/llama", "training", "seq=4"),
        ("ring_attention", "aten", "seq=2"),
    ] {
        let what = format!("{fixture}/{flavour} context-parallel [{mesh}], dear reorder");
        let fix = fixture_dir(fixture);
        let inputs = read_numbered(&fix, "input");
        let expected = read_numbered(&fix, "output");
        let one = run_pjrt(&compile_with(fixture, flavour, None).unwrap_or_else(|e| panic!("{e}")), &plugin, &inputs);
        let artifact = dir.join("ring.kiln");
        let artifact = artifact.to_str().expect("utf-8");
        let (ok, report) = compile_context_parallel(&fix, flavour, artifact, mesh, DEAR_REORDER);
        assert!(ok, "{what}: {report}");
        let why = "contiguous, every block computed (zig-zag not chosen, its reorder costs more than it saves: ";
        assert!(report.contains(why), "{what}: {report}");
        assert!(!report.contains("zig-zag (chunks") && !report.contains("zig-zag reorder"), "{what}: {report}");
        let out = dir.join("out");
        let mut run = vec!["run".to_string(), artifact.to_string(), "--device".into()];
        run.push(format!("pjrt:{}", plugin.display()));
        for i in 0..inputs.len() {
            run.extend(["--input".to_string(), format!("{i}={}", fix.join(format!("input_{i}.npy")).display())]);
        }
        run.extend(["--output-dir".to_string(), out.to_str().expect("utf-8").to_string()]);
        let (ok, text) = kiln(&run.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "{what}: {text}");
        let got = read_numbered(&out, "output");
        assert_eq!(got.len(), expected.len(), "{what}");
        for (i, ((g, want), one)) in got.iter().zip(&expected).zip(&one).enumerate() {
            assert_close(&format!("{what}: output {i} vs PyTorch"), g, want, RTOL, ATOL);
            assert_close(&format!("{what}: output {i} vs one device"), g, one, RTOL, ATOL);
        }
        std::fs::remove_dir_all(&out).ok();
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--shard auto` on a mesh with a `seq` axis weighs context parallelism
/// against the other strategies, under a slow device (compute matters at
/// these sizes), a slow link and a 100 kB memory limit: the long sequence
/// through a small model (`ring_long`, batch 1: no data parallelism)
/// rings, its permutes hidden behind the block compute; the short sequence
/// through wide layers (`ring_wide`) does not (context parallelism keeps
/// every weight whole, over the limit) and is tensor-parallel. The report
/// lists context-parallel with its cost and says why the winner won; runs
/// (in a child process) match PyTorch and one device.
#[test]
fn auto_weighs_context_parallelism() {
    let plugin = plugin();
    let dir = std::env::temp_dir().join(format!("kiln-ring-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cost = "flops=1e9,latency=1e-7,link=1e8,memory=1e5";
    let cases: &[(&str, &[&str], &str)] = &[
        ("ring_long", &["seq=2", "seq=4", "seq=8"], "context-parallel"),
        ("ring_wide", &["seq=2", "seq=4"], "tensor-parallel"),
    ];
    for &(fixture, meshes, chosen) in cases {
        let fix = fixture_dir(fixture);
        let inputs = read_numbered(&fix, "input");
        let expected = read_numbered(&fix, "output");
        for flavour in ["training", "aten"] {
            let one = plugin
                .as_ref()
                .map(|p| run_pjrt(&compile_with(fixture, flavour, None).unwrap_or_else(|e| panic!("{e}")), p, &inputs));
            for &mesh in meshes {
                let what = format!("{fixture}/{flavour} auto [{mesh}]");
                let pt2 = fix.join(format!("{flavour}.pt2"));
                let artifact = dir.join("auto.kiln");
                let (pt2, artifact) = (pt2.to_str().expect("utf-8"), artifact.to_str().expect("utf-8"));
                let (ok, report) = kiln(&[
                    "compile",
                    pt2,
                    "-o",
                    artifact,
                    "--target",
                    "pjrt",
                    "--mesh",
                    mesh,
                    "--shard",
                    "auto",
                    "--shard-cost",
                    cost,
                    "--report",
                ]);
                assert!(ok, "{what}: {report}");
                // Context parallelism was costed, and the choice explained.
                let cp = report.lines().find(|l| l.trim_start().starts_with("context-parallel "));
                assert!(cp.is_some_and(|l| !l.contains("does not apply")), "{what}: {report}");
                let why = format!("chose {chosen}: ");
                assert!(report.contains(&why), "{what}: {why}: {report}");
                if chosen == "context-parallel" {
                    assert!(report.contains("ring attention: 1 attention(s) over `seq`"), "{what}: {report}");
                    assert!(report.contains("tensor-parallel's"), "{what}: {report}");
                } else {
                    let cp = "context-parallel (considered): ";
                    let over = "per device (every weight whole), over the memory limit";
                    assert!(report.lines().any(|l| l.contains(cp) && l.contains(over)), "{what}: {report}");
                    assert!(!report.contains("ring attention:"), "{what}: {report}");
                }
                let (Some(plugin), Some(one)) = (&plugin, &one) else { continue };
                let out = dir.join("out");
                let mut run = vec!["run".to_string(), artifact.to_string(), "--device".into()];
                run.push(format!("pjrt:{}", plugin.display()));
                for i in 0..inputs.len() {
                    run.extend([
                        "--input".to_string(),
                        format!("{i}={}", fix.join(format!("input_{i}.npy")).display()),
                    ]);
                }
                run.extend(["--output-dir".to_string(), out.to_str().expect("utf-8").to_string()]);
                let (ok, text) = kiln(&run.iter().map(String::as_str).collect::<Vec<_>>());
                assert!(ok, "{what}: {text}");
                let got = read_numbered(&out, "output");
                assert_eq!(got.len(), expected.len(), "{what}");
                for (i, ((g, want), one)) in got.iter().zip(&expected).zip(one).enumerate() {
                    assert_close(&format!("{what}: output {i} vs PyTorch"), g, want, RTOL, ATOL);
                    assert_close(&format!("{what}: output {i} vs one device"), g, one, RTOL, ATOL);
                }
                std::fs::remove_dir_all(&out).ok();
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
