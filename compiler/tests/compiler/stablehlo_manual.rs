//! Manual regions with explicit collectives on the XLA CPU plugin: expert
//! parallelism with all-to-all token dispatch (`--shard expert-parallel`) on
//! the batch-of-four Qwen3-MoE fixture over 2 and 4 devices, against one
//! device and PyTorch. A wrong collective mode aborts the plugin's process,
//! so the sharded runs go through the `kiln` binary in a child process: a
//! crash fails the test with the child's output instead of killing the test
//! binary. Needs `KILN_TEST_XLA_CPU_PLUGIN`; skips without it.
#![cfg(feature = "mlir")]

use crate::stablehlo_support::*;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::sharding::ShardingDialect;
use kiln_compiler::stablehlo::verify::{verify_collectives, Devices};
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, Backend, CompileOptions, ShardConfig};
use kiln_ir::Mesh;
use kiln_passes::shard::{CostModel, Override, Strategy};
use kiln_runtime::format::Metadata;
use kiln_runtime::{Program, Tensor};
use std::process::Command;
use std::sync::Arc;

const MOE: &str = "models/qwen3_moe_batch";

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn compile_with(flavour: &str, shard: Option<ShardConfig>) -> Arc<Program> {
    let graph = import_pt2(&fixture_dir(MOE).join(format!("{flavour}.pt2"))).unwrap_or_else(|e| panic!("{e}")).graph;
    let opts = CompileOptions { shard, ..CompileOptions::default() };
    let (writer, _) = compile_graph_for(graph, &opts, Backend::Pjrt { precision: Precision::F32 }, Metadata::default())
        .unwrap_or_else(|e| panic!("{e}"));
    Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

fn expert_parallel(mesh: &[(&str, u32)]) -> ShardConfig {
    ShardConfig {
        mesh: Mesh::new(mesh),
        strategy: Strategy::ExpertParallel,
        overrides: vec![],
        dialect: ShardingDialect::Shardy,
        cost: CostModel::default(),
    }
}

/// The experts' two grouped matmuls are manual regions, each with a
/// dispatch and a return all-to-all over the model axis, and the module
/// passes the verifier for the mesh's devices (and fails it for fewer).
#[test]
fn experts_are_manual_regions_with_all_to_alls() {
    for (mesh, groups) in [
        (&[("model", 2)][..], "dense<[[0, 1]]> : tensor<1x2xi64>"),
        (&[("model", 4)], "dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>"),
        (&[("data", 2), ("model", 2)], "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"),
        (&[("model", 2), ("data", 2)], "dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>"),
    ] {
        let shard = expert_parallel(mesh);
        let devices = shard.mesh.size() as u32;
        let program = compile_with("training", Some(shard));
        let accel = accel(&program);
        assert_eq!(accel.segments.len(), 1);
        let text = &accel.segments[0].mlir;
        assert_eq!(text.matches("\"sdy.manual_computation\"").count(), 2, "{text}");
        assert_eq!(text.matches("\"stablehlo.all_to_all\"").count(), 4, "{text}");
        assert_eq!(text.matches(groups).count(), 4, "{groups}: {text}");
        assert!(text.contains("\"stablehlo.partition_id\"") && !text.contains("use_global_device_ids"), "{text}");
        assert_eq!(verify_collectives(text, Devices { replicas: 1, partitions: devices }), Ok(()));
        let fewer = verify_collectives(text, Devices { replicas: 1, partitions: devices / 2 });
        assert!(fewer.is_err_and(|e| e.contains("`stablehlo.all_to_all`")), "{mesh:?}");
    }
}

/// `--shard expert-parallel` on 2 and 4 devices (and a 2×2 mesh) through the
/// CLI in a child process: the report lists the manual regions' all-to-alls
/// with bytes, `kiln inspect` keeps them, and the outputs match PyTorch and
/// one device within torch's tolerance (and under GSPMD, which keeps the
/// partial-sum form: no region, no manual collectives). Not bit for bit: the regions are
/// (`one_dispatch_is_bit_identical_to_one_device`; the fixture too when each
/// region's result is gathered at once — checked by hand), but the rows stay
/// split between the two experts' layers and after them, and XLA:CPU's code
/// for the elementwise ops there (the SiLU gate, the routing weights) rounds
/// differently in the last bits on half the rows.
#[test]
fn expert_dispatch_matches_one_device_and_pytorch() {
    let Some(plugin) = plugin() else { return };
    let device = format!("pjrt:{}", plugin.display());
    let dir = std::env::temp_dir().join(format!("kiln-manual-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let fixture = fixture_dir(MOE);
    let input = fixture.join("input_0.npy");
    let expected = read_numbered(&fixture, "output");
    // A program without experts, and experts the axis does not divide.
    let artifact = dir.join("refused.kiln");
    let artifact = artifact.to_str().expect("utf-8");
    let mlp = fixture_dir("mlp").join("training.pt2");
    let args = ["compile", mlp.to_str().expect("utf-8"), "-o", artifact, "--target", "pjrt", "--mesh", "model=2"];
    let (ok, text) = kiln(&[&args[..], &["--shard", "expert-parallel"]].concat());
    assert!(!ok && text.contains("--shard expert-parallel: the program has no mixture of experts"), "{text}");
    let moe = fixture.join("training.pt2");
    let args = ["compile", moe.to_str().expect("utf-8"), "-o", artifact, "--target", "pjrt", "--mesh", "model=8"];
    let (ok, text) = kiln(&[&args[..], &["--shard", "ep"]].concat());
    assert!(!ok && text.contains("mesh axis `model` (size 8) does not divide dim 0 (size 4) of `"), "{text}");
    for flavour in ["training", "aten"] {
        let one = run_pjrt(&compile_with(flavour, None), &plugin, &read_numbered(&fixture, "input"));
        // GSPMD: no manual region, the partial-sum form.
        for (mesh, devices, dialect) in [
            ("model=2", 2, "shardy"),
            ("model=4", 4, "shardy"),
            ("data=2,model=2", 4, "shardy"),
            ("model=4", 4, "gspmd"),
        ] {
            let what = format!("{flavour} expert-parallel [{mesh}] {dialect}");
            let model = fixture.join(format!("{flavour}.pt2"));
            let artifact = dir.join("moe.kiln");
            let (model, artifact) = (model.to_str().expect("utf-8"), artifact.to_str().expect("utf-8"));
            let args = ["compile", model, "-o", artifact, "--target", "pjrt", "--mesh", mesh, "--shard", "ep"];
            let (ok, report) = kiln(&[&args[..], &["--sharding-dialect", dialect, "--report"]].concat());
            assert!(ok, "{what}: {report}");
            let regions = if dialect == "shardy" { 4 } else { 0 };
            if regions > 0 {
                check_report(&what, &report, devices);
            }
            let (ok, shown) = kiln(&["inspect", artifact]);
            assert!(ok && shown.matches("manual region at").count() == regions, "{what}: {shown}");
            let out = dir.join("out");
            let (input, out_dir) = (format!("0={}", input.display()), out.to_str().expect("utf-8"));
            let (ok, text) = kiln(&["run", artifact, "--device", &device, "--input", &input, "--output-dir", out_dir]);
            assert!(ok && text.contains(&format!("SPMD over {devices} devices")), "{what}: {text}");
            let got = read_numbered(&out, "output");
            assert_eq!(got.len(), expected.len(), "{what}");
            for (i, ((g, want), one)) in got.iter().zip(&expected).zip(&one).enumerate() {
                assert_close(&format!("{what}: output {i} vs PyTorch"), g, want, 1e-4, 1e-5);
                assert_close(&format!("{what}: output {i} vs one device"), g, one, 1e-4, 1e-5);
                let same = g.data == one.data;
                eprintln!(
                    "{what}: output {i} {} one device",
                    if same { "bit-identical to" } else { "within tolerance of" }
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The report's manual-region lines: per experts' layer (hidden 32 → 2 × 32
/// → 32) a dispatch of K and a return of N f32 values per row, each device
/// sending all but its own slot, `(m - 1) · C` rows.
fn check_report(what: &str, report: &str, devices: usize) {
    let lines: Vec<&str> = report.lines().filter(|l| l.contains("manual region at")).collect();
    assert_eq!(lines.len(), 4, "{what}: {report}");
    // 32 rows (16 tokens × top-2) over the model axis.
    let model = if what.contains("data=2") { devices / 2 } else { devices };
    let rows = 32 / model;
    for (l, width) in lines.iter().zip([32, 64, 32, 32]) {
        assert!(l.trim_start().starts_with("all-to-all"), "{what}: {l}");
        assert!(l.contains(&format!("({rows} of 32 rows, capacity {rows} rows per device pair")), "{what}: {l}");
        let bytes: usize = l.split_whitespace().nth(1).and_then(|b| b.parse().ok()).unwrap_or(0);
        assert_eq!(bytes, (model - 1) * rows * width * 4, "{what}: {l}");
    }
}

/// One grouped matmul dispatched over 2 and 4 devices (and the first axis of
/// a 2×2 mesh) is bit-identical to
/// one device's dense form, whatever the offsets: an empty expert, rows past
/// the last offset, every row on the last device's expert (the worst case
/// the capacity is sized for), every row on the first, no row at all; and in
/// bf16 segments; with 7 rows (the all-reduce form). Under GSPMD the layer
/// keeps the partial-sum form.
#[test]
fn one_dispatch_is_bit_identical_to_one_device() {
    let Some(plugin) = plugin() else { return };
    let text = |rows: i64| {
        format!(
            "graph {{
  input %0 \"x\": f32[{rows}, 5] {{origin=\"x\"}}
  input %1 \"w\": f32[4, 5, 3] {{origin=\"w\"}}
  input %2 \"offs\": i64[4] {{origin=\"offs\"}}
  %3: f32[{rows}, 3] = grouped_matmul(%0, %1, %2)
  output %3 \"y\"
}}"
        )
    };
    let compile_rows = |rows: i64, shard: Option<ShardConfig>, precision: Precision| {
        let g = kiln_ir::text::parse(&text(rows)).unwrap_or_else(|e| panic!("{e}"));
        let opts = CompileOptions { shard, ..CompileOptions::default() };
        let (writer, _) = compile_graph_for(g, &opts, Backend::Pjrt { precision }, Metadata::default())
            .unwrap_or_else(|e| panic!("{e}"));
        Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("{e}"))
    };
    let compile_in = |shard: Option<ShardConfig>, precision: Precision| compile_rows(8, shard, precision);
    let compile = |shard: Option<ShardConfig>| compile_in(shard, Precision::F32);
    let one = compile(None);
    let (x, w) = (random_f32(&[8, 5], 11, -1.0, 1.0), random_f32(&[4, 5, 3], 12, -1.0, 1.0));
    // The last mesh puts the experts' axis first: its groups stride over
    // the data axis ([[0, 2], [1, 3]]).
    for mesh in [&[("model", 2)][..], &[("model", 4)], &[("model", 2), ("data", 2)]] {
        let mut shard = expert_parallel(mesh);
        shard.strategy = Strategy::Replicated;
        shard.overrides = vec![Override { pattern: "w".into(), sharding: kiln_ir::Sharding::split(3, 0, "model") }];
        let program = compile(Some(shard));
        let mlir = &accel(&program).segments[0].mlir;
        assert_eq!(mlir.matches("\"stablehlo.all_to_all\"").count(), 2, "{mlir}");
        for offs in [[2, 2, 6, 8], [1, 3, 3, 6], [0, 0, 0, 8], [8, 8, 8, 8], [0, 0, 0, 0]] {
            let inputs = [x.clone(), w.clone(), Tensor::from_i64(&[4], &offs)];
            let (got, want) = (run_pjrt(&program, &plugin, &inputs), run_pjrt(&one, &plugin, &inputs));
            assert_eq!(got[0].data, want[0].data, "{mesh:?}, offsets {offs:?}");
            let y = values(&got[0]);
            assert!(y[offs[3] as usize * 3..].iter().all(|&v| v == 0.0), "{offs:?}: {y:?}");
            assert!(y[..offs[3] as usize * 3].iter().all(|&v| v != 0.0), "{offs:?}: {y:?}");
        }
    }
    // 7 rows do not divide over the devices: the all-reduce form, every row
    // on every device, still one device's bits.
    let x7 = random_f32(&[7, 5], 13, -1.0, 1.0);
    let one7 = compile_rows(7, None, Precision::F32);
    for mesh in [&[("model", 2)][..], &[("model", 4)], &[("model", 2), ("data", 2)]] {
        let mut shard = expert_parallel(mesh);
        shard.strategy = Strategy::Replicated;
        shard.overrides = vec![Override { pattern: "w".into(), sharding: kiln_ir::Sharding::split(3, 0, "model") }];
        let program = compile_rows(7, Some(shard), Precision::F32);
        let mlir = &accel(&program).segments[0].mlir;
        assert!(mlir.contains("\"sdy.manual_computation\"") && !mlir.contains("all_to_all"), "{mlir}");
        assert_eq!(mlir.matches("\"stablehlo.all_reduce\"").count(), 1, "{mlir}");
        for offs in [[2, 2, 6, 7], [1, 3, 3, 6], [0, 0, 0, 7], [7, 7, 7, 7], [0, 0, 0, 0]] {
            let inputs = [x7.clone(), w.clone(), Tensor::from_i64(&[4], &offs)];
            let (got, want) = (run_pjrt(&program, &plugin, &inputs), run_pjrt(&one7, &plugin, &inputs));
            assert_eq!(got[0].data, want[0].data, "7 rows, {mesh:?}, offsets {offs:?}");
            let y = values(&got[0]);
            assert!(y[offs[3] as usize * 3..].iter().all(|&v| v == 0.0), "{offs:?}: {y:?}");
            assert!(y[..offs[3] as usize * 3].iter().all(|&v| v != 0.0), "{offs:?}: {y:?}");
        }
    }
    // GSPMD modules get no manual region: the partial-sum form, whose
    // all-reduce adds zeros to each row's one product (this case found
    // XLA's GSPMD partitioner dropping a negative-edge pad's shift: all
    // zeros, before `expert_starts`).
    let mut shard = expert_parallel(&[("model", 2)]);
    (shard.strategy, shard.dialect) = (Strategy::Replicated, ShardingDialect::Gspmd);
    shard.overrides = vec![Override { pattern: "w".into(), sharding: kiln_ir::Sharding::split(3, 0, "model") }];
    let program = compile(Some(shard));
    let mlir = &accel(&program).segments[0].mlir;
    assert!(!mlir.contains("all_to_all") && !mlir.contains("sdy.") && mlir.contains("mhlo.sharding"), "{mlir}");
    let inputs = [x.clone(), w.clone(), Tensor::from_i64(&[4], &[2, 2, 6, 8])];
    assert_eq!(run_pjrt(&program, &plugin, &inputs)[0].data, run_pjrt(&one, &plugin, &inputs)[0].data, "gspmd");
    // bf16 segments: bf16 rows and products on the wire, the same bits as
    // one device's bf16 dense form.
    let one = compile_in(None, Precision::Bf16);
    let mut shard = expert_parallel(&[("model", 2)]);
    shard.strategy = Strategy::Replicated;
    shard.overrides = vec![Override { pattern: "w".into(), sharding: kiln_ir::Sharding::split(3, 0, "model") }];
    let program = compile_in(Some(shard), Precision::Bf16);
    let mlir = &accel(&program).segments[0].mlir;
    assert!(mlir.contains("\"stablehlo.all_to_all\"") && mlir.contains("x5xbf16>"), "{mlir}");
    let inputs = [x, w, Tensor::from_i64(&[4], &[2, 2, 6, 8])];
    let (got, want) = (run_pjrt(&program, &plugin, &inputs), run_pjrt(&one, &plugin, &inputs));
    assert_eq!(got[0].data, want[0].data, "bf16");
}
