//! SPMD programs (`--mesh`, `--shard`) on the XLA CPU plugin: fixtures
//! compiled with a mesh and a strategy run on 2 and 4 devices and must match
//! PyTorch's outputs and one device (within torch's tolerance: XLA:CPU's
//! GEMM tiling depends on the shapes each device sees). Needs
//! `KILN_TEST_XLA_CPU_PLUGIN`; skips without it (fails under CI).
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::sharding::ShardingDialect;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, Backend, CompileOptions, ShardConfig};
use kiln_ir::{Mesh, Sharding};
use kiln_passes::shard::{CostModel, Override, Strategy};
use kiln_runtime::format::Metadata;
use kiln_runtime::{Program, Tensor};
use stablehlo_support::*;
use std::path::Path;
use std::sync::Arc;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn config(mesh: &[(&str, u32)], strategy: Strategy, dialect: ShardingDialect) -> ShardConfig {
    ShardConfig { mesh: Mesh::new(mesh), strategy, overrides: vec![], dialect, cost: CostModel::default() }
}

fn compile_sharded(name: &str, flavour: &str, shard: Option<ShardConfig>) -> Result<Arc<Program>, String> {
    let graph = import_pt2(&fixture_dir(name).join(format!("{flavour}.pt2"))).map_err(|e| e.to_string())?.graph;
    let opts = CompileOptions { shard, ..CompileOptions::default() };
    let (writer, _) = compile_graph_for(graph, &opts, Backend::Pjrt { precision: Precision::F32 }, Metadata::default())
        .map_err(|e| e.to_string())?;
    Program::from_bytes(&writer.to_bytes()).map_err(|e| e.to_string())
}

/// Compiles `name` with `shard`, runs it on the mesh's devices and checks it
/// against PyTorch and against `one_device`'s outputs.
fn check(name: &str, flavour: &str, shard: ShardConfig, one_device: &[Tensor], plugin: &Path) {
    let what = format!("{name}/{flavour} {} on [{}]", shard.strategy.name(), shard.mesh);
    let program = compile_sharded(name, flavour, Some(shard.clone())).unwrap_or_else(|e| panic!("{what}: {e}"));
    let accel = accel(&program);
    let mesh = accel.mesh.as_ref().unwrap_or_else(|| panic!("{what}: no mesh in the artifact"));
    assert_eq!(mesh.size(), shard.mesh.size(), "{what}: mesh size");
    assert_eq!(accel.segments.len(), 1, "{what}: one segment");
    let text = &accel.segments[0].mlir;
    match shard.dialect {
        ShardingDialect::Shardy => assert!(text.contains("sdy.mesh") && !text.contains("mhlo.sharding"), "{what}"),
        ShardingDialect::Gspmd => assert!(text.contains("mhlo.sharding") && !text.contains("sdy."), "{what}"),
    }
    let dir = fixture_dir(name);
    let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    let got = run_pjrt(&program, plugin, &inputs);
    assert_eq!(got.len(), expected.len(), "{what}: outputs");
    for (i, ((g, w), one)) in got.iter().zip(&expected).zip(one_device).enumerate() {
        assert_close(&format!("{what}: output {i} vs PyTorch"), g, w, RTOL, ATOL);
        // XLA:CPU tiles a GEMM by its row count, so even data parallelism
        // (the same products on fewer rows) may round differently: torch's
        // tolerance, and a note when the bits agree.
        assert_close(&format!("{what}: output {i} vs one device"), g, one, RTOL, ATOL);
        eprintln!(
            "{what}: output {i} {} one device",
            if g.data == one.data { "bit-identical to" } else { "within tolerance of" }
        );
    }
}

fn one_device(name: &str, flavour: &str, plugin: &Path) -> Vec<Tensor> {
    let program = compile_sharded(name, flavour, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    run_pjrt(&program, plugin, &read_numbered(&fixture_dir(name), "input"))
}

#[test]
fn mlp_under_every_strategy_on_2_4_and_8_devices() {
    let Some(plugin) = plugin() else { return };
    for flavour in ["training", "aten"] {
        let one = one_device("mlp", flavour, &plugin);
        for strategy in [Strategy::DataParallel, Strategy::TensorParallel, Strategy::Fsdp] {
            let meshes = [
                &[("data", 2)][..],
                &[("data", 4)],
                &[("data", 2), ("model", 2)],
                &[("model", 4)],
                &[("data", 2), ("model", 4)],
            ];
            for mesh in meshes {
                if strategy == Strategy::TensorParallel && !mesh.iter().any(|a| a.0 == "model") {
                    continue;
                }
                for dialect in [ShardingDialect::Shardy, ShardingDialect::Gspmd] {
                    check("mlp", flavour, config(mesh, strategy, dialect), &one, &plugin);
                }
            }
        }
    }
}

#[test]
fn bert_and_llama_on_2_4_and_8_devices() {
    let Some(plugin) = plugin() else { return };
    let shardy = ShardingDialect::Shardy;
    let bert = one_device("models/bert", "training", &plugin);
    for strategy in [Strategy::DataParallel, Strategy::TensorParallel, Strategy::Fsdp] {
        for mesh in [
            &[("data", 2)][..],
            &[("data", 2), ("model", 2)],
            &[("model", 2)],
            &[("model", 4)],
            &[("data", 2), ("model", 4)],
        ] {
            let has_data = mesh.iter().any(|a| a.0 == "data");
            let has_model = mesh.iter().any(|a| a.0 == "model");
            if strategy == Strategy::TensorParallel && !has_model || strategy != Strategy::TensorParallel && !has_data {
                continue;
            }
            check("models/bert", "training", config(mesh, strategy, shardy), &bert, &plugin);
        }
    }
    // Llama's batch is 1: tensor parallelism only (data parallelism is refused, below);
    // `llama_batch` (the same model for four sequences) takes every strategy.
    let llama = one_device("models/llama", "training", &plugin);
    for mesh in [&[("model", 2)][..], &[("model", 4)], &[("model", 8)]] {
        check("models/llama", "training", config(mesh, Strategy::TensorParallel, shardy), &llama, &plugin);
    }
}

/// Llama for a batch of four sequences under data parallelism, FSDP and
/// tensor parallelism (with a data axis beside the model axis), both
/// flavours: the decoder's rotary positions, causal mask and grouped-query
/// heads split by batch and by head.
#[test]
fn llama_batch_under_every_strategy() {
    let Some(plugin) = plugin() else { return };
    let shardy = ShardingDialect::Shardy;
    let name = "models/llama_batch";
    for flavour in ["training", "aten"] {
        let one = one_device(name, flavour, &plugin);
        for (strategy, meshes) in [
            (Strategy::DataParallel, &[&[("data", 2)][..], &[("data", 4)]][..]),
            (Strategy::Fsdp, &[&[("data", 2)][..], &[("data", 4), ("model", 2)]]),
            (Strategy::TensorParallel, &[&[("data", 2), ("model", 2)][..], &[("data", 2), ("model", 4)]]),
        ] {
            for mesh in meshes {
                check(name, flavour, config(mesh, strategy, shardy), &one, &plugin);
            }
        }
    }
}

/// `--shard auto` under cost models that lead it to different plans: each
/// plan runs on the devices and matches one device and PyTorch.
#[test]
fn auto_plans_run_on_2_4_and_8_devices() {
    let Some(plugin) = plugin() else { return };
    let auto = |mesh: &[(&str, u32)], cost: &str| ShardConfig {
        cost: CostModel::parse(cost).unwrap_or_else(|e| panic!("{e}")),
        ..config(mesh, Strategy::Auto, ShardingDialect::Shardy)
    };
    // Per model: the default (collectives dear next to these tiny models'
    // compute), a memory limit below the whole weights, and slow compute.
    let costs = |memory: &str| ["".to_string(), format!("memory={memory}"), "flops=1e6,latency=1e-9".to_string()];
    // (model, flavour, mesh) → the distinct plans its cost models led to.
    let mut plans = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    let mut run = |name: &str, flavour: &str, mesh: &[(&str, u32)], cost: &str, one: &[Tensor]| {
        let shard = auto(mesh, cost);
        let plan = plan_of(name, flavour, &shard);
        plans.entry(format!("{name}/{flavour} [{}]", shard.mesh)).or_default().insert(plan);
        check(name, flavour, shard, one, &plugin);
    };
    for flavour in ["training", "aten"] {
        let one = one_device("mlp", flavour, &plugin);
        for mesh in [&[("data", 2)][..], &[("model", 4)], &[("data", 2), ("model", 4)]] {
            for cost in costs("5e3") {
                run("mlp", flavour, mesh, &cost, &one);
            }
        }
    }
    let bert = one_device("models/bert", "training", &plugin);
    for cost in costs("7e4") {
        run("models/bert", "training", &[("data", 2), ("model", 2)], &cost, &bert);
    }
    // Llama's batch of 1 leaves data parallelism out; its batch of four does not.
    let llama = one_device("models/llama", "training", &plugin);
    for cost in costs("6e4") {
        run("models/llama", "training", &[("model", 4)], &cost, &llama);
    }
    let llama_batch = one_device("models/llama_batch", "training", &plugin);
    for cost in costs("6e4") {
        run("models/llama_batch", "training", &[("data", 2), ("model", 2)], &cost, &llama_batch);
    }
    for (what, p) in &plans {
        eprintln!("{what}: {} plans: {p:?}", p.len());
    }
    // Each program's cost models must have led to different plans.
    assert!(plans.values().all(|p| p.len() >= 2), "{plans:#?}");
}

/// The CNN fixture with its channels split over the model axis: conv1's
/// output channels (column-parallel), the grouped conv2 keeping whole groups
/// per device, BatchNorm and pooling per channel, fc contracting the split
/// channels; under tensor-parallel and under auto with slow compute.
#[test]
fn cnn_channels_split_over_the_model_axis() {
    let Some(plugin) = plugin() else { return };
    for flavour in ["training", "aten"] {
        let one = one_device("cnn", flavour, &plugin);
        for mesh in [&[("model", 2)][..], &[("data", 2), ("model", 2)]] {
            let tp = config(mesh, Strategy::TensorParallel, ShardingDialect::Shardy);
            let plan = plan_of("cnn", flavour, &tp);
            assert!(plan.contains(":[{model}, {}, {}, {}]"), "{flavour} [{}]: no conv weight split: {plan}", tp.mesh);
            check("cnn", flavour, tp, &one, &plugin);
            let auto = ShardConfig {
                cost: CostModel::parse("flops=1e6,latency=1e-9").unwrap_or_else(|e| panic!("{e}")),
                ..config(mesh, Strategy::Auto, ShardingDialect::Shardy)
            };
            check("cnn", flavour, auto, &one, &plugin);
        }
    }
}

/// The shardings auto gave the inputs and weights of `name`, as text.
fn plan_of(name: &str, flavour: &str, shard: &ShardConfig) -> String {
    use kiln_passes::shard::{shard_graph, ShardOptions};
    let mut graph =
        import_pt2(&fixture_dir(name).join(format!("{flavour}.pt2"))).unwrap_or_else(|e| panic!("{e}")).graph;
    let passes = kiln_passes::default_pipeline(kiln_passes::Target::Pjrt);
    kiln_passes::run_pipeline(&mut graph, &passes, &kiln_passes::Options::new(kiln_passes::Target::Pjrt))
        .unwrap_or_else(|e| panic!("{e}"));
    let opts = ShardOptions {
        mesh: shard.mesh.clone(),
        strategy: shard.strategy,
        overrides: vec![],
        inline_max_elements: kiln_compiler::stablehlo::INLINE_CONST_MAX_ELEMENTS,
        cost: shard.cost.clone(),
        manual_regions: true,
    };
    shard_graph(&mut graph, &opts).unwrap_or_else(|e| panic!("{e}"));
    let planned = graph.inputs.iter().copied().chain(graph.consts.values().map(|c| c.value));
    let shardings: Vec<String> =
        planned.filter_map(|v| graph.values[v].attrs.sharding.as_ref().map(|s| format!("{v}:{s}"))).collect();
    shardings.join(" ")
}

#[test]
fn overrides_select_tensors_by_python_name() {
    let Some(plugin) = plugin() else { return };
    let one = one_device("mlp", "training", &plugin);
    // Everything replicated except the first layer's weight, split by hand.
    let mut shard = config(&[("model", 2)], Strategy::Replicated, ShardingDialect::Shardy);
    shard.overrides = vec![Override { pattern: "fc1.w*".into(), sharding: Sharding::split(2, 0, "model") }];
    check("mlp", "training", shard.clone(), &one, &plugin);
    shard.overrides[0].pattern = "no.such.*".into();
    let err = compile_sharded("mlp", "training", Some(shard)).err().unwrap_or_default();
    assert!(err.contains("sharding override `no.such.*` matches no input or weight"), "{err}");
}

#[test]
fn unshardable_programs_are_clear_compile_errors() {
    // Llama's batch of 1 cannot be split over 2 devices.
    let dp = config(&[("data", 2)], Strategy::DataParallel, ShardingDialect::Shardy);
    let err = compile_sharded("models/llama", "training", Some(dp)).err().unwrap_or_default();
    assert!(err.contains("mesh axis `data` (size 2) does not divide dim 0 (size 1) of `"), "{err}");
    // A program with a data-dependent size cannot be one segment.
    let dp = config(&[("data", 1)], Strategy::Replicated, ShardingDialect::Shardy);
    let err = compile_sharded("nonzero", "training", Some(dp)).err().unwrap_or_default();
    assert!(err.contains("must lower to a single PJRT segment") && err.contains("stays on the CPU"), "{err}");
}

/// Mixture-of-experts fixtures on 2, 4 and 8 devices: the batch-of-four
/// Qwen3-MoE layer under data-parallel, FSDP, tensor-parallel (each
/// expert's weights column- then row-parallel) and auto; the batch-of-one
/// Qwen3-MoE and Mixtral under tensor-parallel; expert parallelism (the
/// experts' weights split by expert, pinned by name) on the model axis.
#[test]
fn moe_on_2_4_and_8_devices() {
    let Some(plugin) = plugin() else { return };
    let shardy = ShardingDialect::Shardy;
    let name = "models/qwen3_moe_batch";
    for flavour in ["training", "aten"] {
        let one = one_device(name, flavour, &plugin);
        for (strategy, meshes) in [
            (Strategy::DataParallel, &[&[("data", 2)][..], &[("data", 4)], &[("data", 4), ("model", 2)]][..]),
            (Strategy::Fsdp, &[&[("data", 2)][..], &[("data", 2), ("model", 2)], &[("data", 2), ("model", 4)]]),
            (Strategy::TensorParallel, &[&[("model", 4)][..], &[("data", 2), ("model", 4)]]),
        ] {
            for mesh in meshes {
                let shard = config(mesh, strategy, shardy);
                if strategy == Strategy::TensorParallel {
                    let plan = plan_of(name, flavour, &shard);
                    // Experts' weights [E, K, N] column-parallel: the fused
                    // gate/up output is sliced in halves (made whole), so the
                    // down projection's input arrives whole and it is
                    // column-parallel too.
                    let experts = plan.matches(":[{}, {}, {model}]").count();
                    assert_eq!(experts, 2, "{flavour}: experts not column-parallel: {plan}");
                }
                check(name, flavour, shard, &one, &plugin);
            }
        }
        // Expert parallelism: every experts' weight split by expert.
        for mesh in [&[("model", 2)][..], &[("model", 4)], &[("data", 2), ("model", 4)]] {
            let mut shard = config(mesh, Strategy::Replicated, shardy);
            shard.overrides = ["*experts.gate_up_proj", "*experts.down_proj"]
                .map(|p| Override { pattern: p.into(), sharding: Sharding::split(3, 0, "model") })
                .to_vec();
            check(name, flavour, shard, &one, &plugin);
        }
    }
    for model in ["models/qwen3_moe", "models/mixtral"] {
        let one = one_device(model, "training", &plugin);
        for mesh in [&[("model", 2)][..], &[("model", 8)]] {
            check(model, "training", config(mesh, Strategy::TensorParallel, shardy), &one, &plugin);
        }
    }
}

/// `--shard auto` on the MoE layer: each experts' weight is a layer whose
/// options include expert parallelism, costed in the report; the plans the
/// cost models lead to run and match one device and PyTorch.
#[test]
fn moe_auto_plans_offer_expert_parallelism() {
    use kiln_passes::shard::{shard_graph, LayerChoice, ShardOptions};
    let Some(plugin) = plugin() else { return };
    let name = "models/qwen3_moe_batch";
    let one = one_device(name, "training", &plugin);
    let mut plans = std::collections::BTreeSet::new();
    for mesh in [&[("data", 2), ("model", 2)][..], &[("model", 4)]] {
        for cost in ["", "flops=1e6,latency=1e-9", "memory=2e5"] {
            let shard = ShardConfig {
                cost: CostModel::parse(cost).unwrap_or_else(|e| panic!("{e}")),
                ..config(mesh, Strategy::Auto, ShardingDialect::Shardy)
            };
            let mut graph = import_pt2(&fixture_dir(name).join("training.pt2")).unwrap_or_else(|e| panic!("{e}")).graph;
            let passes = kiln_passes::default_pipeline(kiln_passes::Target::Pjrt);
            kiln_passes::run_pipeline(&mut graph, &passes, &kiln_passes::Options::new(kiln_passes::Target::Pjrt))
                .unwrap_or_else(|e| panic!("{e}"));
            let opts = ShardOptions {
                mesh: shard.mesh.clone(),
                strategy: Strategy::Auto,
                overrides: vec![],
                inline_max_elements: kiln_compiler::stablehlo::INLINE_CONST_MAX_ELEMENTS,
                cost: shard.cost.clone(),
                manual_regions: true,
            };
            let report = shard_graph(&mut graph, &opts).unwrap_or_else(|e| panic!("{e}")).auto.expect("auto report");
            let experts: Vec<_> = report.layers.iter().filter(|l| l.name.contains("experts")).collect();
            assert_eq!(experts.len(), 2, "[{}] {cost}: expert layers {:?}", shard.mesh, report.layers);
            for l in &experts {
                let offered: Vec<LayerChoice> = l.options.iter().map(|o| o.0).collect();
                assert!(offered.contains(&LayerChoice::Expert), "{}: {offered:?}", l.name);
                eprintln!("[{}] {cost:?}: {} -> {}", shard.mesh, l.name, l.chosen.name());
            }
            plans.insert(plan_of(name, "training", &shard));
            check(name, "training", shard, &one, &plugin);
        }
    }
    assert!(plans.len() >= 2, "{plans:#?}");
}
