//! Pipeline stages (`--shard pipeline`) on the XLA CPU plugin: the
//! `mlp_stack` fixture's eight identical blocks over 2 and 4 stages (and a
//! data=2 × stage=2 mesh), against one device and PyTorch; the region's
//! collectives, the verifier, the report; and the requests kiln refuses.
//! The sharded runs go through the `kiln` binary in a child process (a
//! wrong collective aborts the plugin's process). Needs
//! `KILN_TEST_XLA_CPU_PLUGIN` for the runs; the rest runs without it.
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
use std::process::Command;
use std::sync::Arc;

const STACK: &str = "mlp_stack";

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn pipeline(mesh: &[(&str, u32)], microbatches: u32) -> ShardConfig {
    ShardConfig {
        mesh: Mesh::new(mesh),
        strategy: Strategy::Pipeline { microbatches },
        overrides: vec![],
        dialect: ShardingDialect::Shardy,
        cost: CostModel::default(),
    }
}

fn compile_with(flavour: &str, shard: Option<ShardConfig>) -> Result<Arc<Program>, String> {
    let graph = import_pt2(&fixture_dir(STACK).join(format!("{flavour}.pt2"))).map_err(|e| e.to_string())?.graph;
    let opts = CompileOptions { shard, ..CompileOptions::default() };
    let (writer, _) = compile_graph_for(graph, &opts, Backend::Pjrt { precision: Precision::F32 }, Metadata::default())
        .map_err(|e| e.to_string())?;
    Program::from_bytes(&writer.to_bytes()).map_err(|e| e.to_string())
}

/// One manual region holding the eight blocks: `M + N − 2` permutes between
/// consecutive stages of each line along `stage`, one gather; the stacked
/// weights split over `stage` on `@main`; the verifier accepts the module
/// for the mesh's devices and refuses it for fewer.
#[test]
fn blocks_are_one_region_with_permutes() {
    for (mesh, m, pairs) in [
        (&[("stage", 2)][..], 4, "dense<[[0, 1]]> : tensor<1x2xi64>"),
        (&[("stage", 4)], 8, "dense<[[0, 1], [1, 2], [2, 3]]> : tensor<3x2xi64>"),
        (&[("data", 2), ("stage", 2)], 4, "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"),
        (&[("stage", 2), ("data", 2)], 2, "dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>"),
    ] {
        let shard = pipeline(mesh, m);
        let (devices, stages) = (shard.mesh.size() as u32, i64::from(shard.mesh.axis("stage").map_or(1, |a| a.size)));
        let program = compile_with("training", Some(shard)).unwrap_or_else(|e| panic!("{mesh:?}: {e}"));
        let accel = accel(&program);
        assert_eq!(accel.segments.len(), 1);
        let text = &accel.segments[0].mlir;
        assert_eq!(text.matches("\"sdy.manual_computation\"").count(), 1, "{text}");
        let permutes = m as usize + stages as usize - 2;
        assert_eq!(text.matches("\"stablehlo.collective_permute\"").count(), permutes, "{mesh:?}");
        let pairs = format!("source_target_pairs = {pairs}");
        assert_eq!(text.matches(&pairs).count(), permutes, "{mesh:?}: {pairs}");
        assert_eq!(text.matches("\"stablehlo.all_gather\"").count(), 1, "{mesh:?}");
        // Every stacked weight is split over `stage` on dim 0 at `@main`.
        assert!(text.contains("#sdy.sharding<@mesh, [{\"stage\"}, {}, {}]>"), "{text}");
        assert_eq!(verify_collectives(text, Devices { replicas: 1, partitions: devices }), Ok(()));
        let fewer = verify_collectives(text, Devices { replicas: 1, partitions: devices / 2 });
        assert!(fewer.is_err(), "{mesh:?}");
    }
}

/// What kiln refuses, at compile time, with the reason.
#[test]
fn bad_requests_are_compile_errors() {
    let refused = |flavour: &str, shard: ShardConfig| match compile_with(flavour, Some(shard)) {
        Ok(_) => panic!("compiled"),
        Err(e) => e,
    };
    let e = refused("training", pipeline(&[("stage", 3)], 0));
    assert!(e.contains("8 repeated blocks") && e.contains("`stage`=3 does not divide 8"), "{e}");
    let e = refused("training", pipeline(&[("data", 2)], 0));
    assert!(e.contains("--shard pipeline needs a mesh axis `stage`"), "{e}");
    let e = refused("training", pipeline(&[("stage", 2)], 3));
    assert!(e.contains("--microbatches 3 does not divide the 8 batch rows"), "{e}");
    let e = refused("training", ShardConfig { dialect: ShardingDialect::Gspmd, ..pipeline(&[("stage", 2)], 0) });
    assert!(e.contains("--shard pipeline writes manual regions"), "{e}");
    // The MLP fixture's three linears differ: nothing repeats.
    let mlp = import_pt2(&fixture_dir("mlp").join("training.pt2")).unwrap_or_else(|e| panic!("{e}")).graph;
    let opts = CompileOptions { shard: Some(pipeline(&[("stage", 2)], 0)), ..CompileOptions::default() };
    let e = compile_graph_for(mlp, &opts, Backend::Pjrt { precision: Precision::F32 }, Metadata::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("the program has no repeated structure"), "{e}");
}

/// `--shard pipeline` through the CLI in a child process on 2 and 4 stages
/// (and data=2 × stage=2), both fixture flavours: the report names each
/// stage's layers and weight bytes, the bytes moved and the bubble; `kiln
/// inspect` keeps it; outputs match PyTorch and one device, bit for bit
/// where microbatches keep two rows or more.
#[test]
fn pipeline_matches_one_device_and_pytorch() {
    let Some(plugin) = plugin() else { return };
    let device = format!("pjrt:{}", plugin.display());
    let dir = std::env::temp_dir().join(format!("kiln-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let fixture = fixture_dir(STACK);
    let input = fixture.join("input_0.npy");
    let expected = read_numbered(&fixture, "output");
    for flavour in ["training", "aten"] {
        let one = run_pjrt(
            &compile_with(flavour, None).unwrap_or_else(|e| panic!("{e}")),
            &plugin,
            &read_numbered(&fixture, "input"),
        );
        // Microbatches of one row (the last two) are within tolerance of
        // one device: XLA:CPU multiplies a one-row matrix by its
        // matrix-vector code, which rounds differently; the rest (and the
        // default count, which keeps two rows or more) are bit-identical.
        for (mesh, devices, microbatches, bubble, exact) in [
            ("stage=2", 2, "4", "bubble 20.0%", true),
            ("stage=2", 2, "1", "bubble 50.0%", true),
            ("stage=4", 4, "4", "bubble 42.9%", true),
            ("data=2,stage=2", 4, "", "2 microbatches of 2 rows (4 rows per device); 3 steps, bubble 33.3%", true),
            ("stage=4", 4, "8", "bubble 27.3%", false),
            ("data=2,stage=2", 4, "4", "bubble 20.0%", false),
        ] {
            let what = format!("{flavour} pipeline [{mesh}] {microbatches} microbatches");
            let model = fixture.join(format!("{flavour}.pt2"));
            let artifact = dir.join("stack.kiln");
            let (model, artifact) = (model.to_str().expect("utf-8"), artifact.to_str().expect("utf-8"));
            let args = ["compile", model, "-o", artifact, "--target", "pjrt", "--mesh", mesh, "--shard", "pipeline"];
            let count: &[&str] = if microbatches.is_empty() { &[] } else { &["--microbatches", microbatches] };
            let (ok, report) = kiln(&[&args[..], count, &["--report"]].concat());
            assert!(ok, "{what}: {report}");
            let stages: usize = mesh.rsplit('=').next().and_then(|s| s.parse().ok()).unwrap_or(1);
            assert!(report.contains("8 repeated blocks") && report.contains(bubble), "{what}: {report}");
            assert!(report.contains("layers.{0..7}.fc1.weight"), "{what}: {report}");
            for s in 0..stages {
                let per = 8 / stages;
                let (a, b) = (s * per, (s + 1) * per - 1);
                let line = format!("stage {s}: layers {a}..{b} (layers.{a} .. layers.{b}), weights {} B", per * 8704);
                assert!(report.contains(&line), "{what}: {line}: {report}");
            }
            assert!(report.contains("collective-permute") && report.contains("bytes moved per step"), "{report}");
            let (ok, shown) = kiln(&["inspect", artifact]);
            assert!(ok && shown.contains(bubble) && shown.contains("stage 0: layers"), "{what}: {shown}");
            let out = dir.join("out");
            let (input, out_dir) = (format!("0={}", input.display()), out.to_str().expect("utf-8"));
            let (ok, text) = kiln(&["run", artifact, "--device", &device, "--input", &input, "--output-dir", out_dir]);
            assert!(ok && text.contains(&format!("SPMD over {devices} devices")), "{what}: {text}");
            let got = read_numbered(&out, "output");
            assert_eq!(got.len(), expected.len(), "{what}");
            for (i, ((g, want), one)) in got.iter().zip(&expected).zip(&one).enumerate() {
                assert_close(&format!("{what}: output {i} vs PyTorch"), g, want, 1e-4, 1e-5);
                assert_close(&format!("{what}: output {i} vs one device"), g, one, 1e-5, 1e-6);
                if exact {
                    assert!(g.data == one.data, "{what}: output {i} differs from one device's bits");
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The BERT and Llama fixtures' two transformer layers on two stages, both
/// flavours: each layer reads the attention mask (BERT; cut into
/// microbatches with the activation) or nothing else besides its weights;
/// the aten flavour's linears flatten the batch into the rows of a matrix
/// product, so its blocks do not treat rows independently and run whole
/// (one microbatch), as does the Llama fixture's batch of one. Outputs
/// match PyTorch and one device.
#[test]
fn transformer_layers_match_one_device_and_pytorch() {
    let Some(plugin) = plugin() else { return };
    let device = format!("pjrt:{}", plugin.display());
    let dir = std::env::temp_dir().join(format!("kiln-pipeline-tf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (model, flavour, microbatches, line) in [
        ("bert", "training", "2", "2 repeated blocks of 20 nodes, 1 per stage; 2 microbatches of 1 rows"),
        ("bert", "training", "", "1 microbatches of 2 rows"),
        ("bert", "aten", "", "1 microbatches of 2 rows"),
        ("llama", "training", "", "1 microbatches of 1 rows"),
        ("llama", "aten", "", "1 microbatches of 1 rows"),
    ] {
        let fixture = fixture_dir(&format!("models/{model}"));
        let inputs = read_numbered(&fixture, "input");
        let expected = read_numbered(&fixture, "output");
        let what = format!("{model} {flavour} pipeline [stage=2] microbatches `{microbatches}`");
        let pt2 = fixture.join(format!("{flavour}.pt2"));
        let graph = import_pt2(&pt2).unwrap_or_else(|e| panic!("{e}")).graph;
        let opts = CompileOptions::default();
        let (writer, _) =
            compile_graph_for(graph, &opts, Backend::Pjrt { precision: Precision::F32 }, Metadata::default())
                .unwrap_or_else(|e| panic!("{e}"));
        let one =
            run_pjrt(&Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("{e}")), &plugin, &inputs);
        let artifact = dir.join("tf.kiln");
        let (pt2, artifact) = (pt2.to_str().expect("utf-8"), artifact.to_str().expect("utf-8"));
        let args = ["compile", pt2, "-o", artifact, "--target", "pjrt", "--mesh", "stage=2", "--shard", "pipeline"];
        let count: &[&str] = if microbatches.is_empty() { &[] } else { &["--microbatches", microbatches] };
        let (ok, report) = kiln(&[&args[..], count, &["--report"]].concat());
        assert!(ok && report.contains(line), "{what}: {report}");
        let out = dir.join(format!("out-{model}-{flavour}-{microbatches}"));
        let mut run = vec!["run".to_string(), artifact.to_string(), "--device".into(), device.clone()];
        for i in 0..inputs.len() {
            run.extend(["--input".to_string(), format!("{i}={}", fixture.join(format!("input_{i}.npy")).display())]);
        }
        run.extend(["--output-dir".to_string(), out.to_str().expect("utf-8").to_string()]);
        let (ok, text) = kiln(&run.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok && text.contains("SPMD over 2 devices"), "{what}: {text}");
        let got = read_numbered(&out, "output");
        assert_eq!(got.len(), expected.len(), "{what}");
        for (i, ((g, want), one)) in got.iter().zip(&expected).zip(&one).enumerate() {
            assert_close(&format!("{what}: output {i} vs PyTorch"), g, want, 1e-4, 1e-5);
            assert_close(&format!("{what}: output {i} vs one device"), g, one, 1e-5, 1e-5);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
