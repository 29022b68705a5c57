//! `--shard auto`: the plan follows the cost model (memory limit, link
//! speed), and the report lists every strategy and every layer's options.

mod common;

use common::{const_f32, data, push};
use kiln_ir::{Graph, Mesh, Op, Sharding, UnaryOp};
use kiln_passes::shard::{shard_graph, CostModel, LayerChoice, ShardOptions, Strategy};

/// x[8, 64] → linear 64→256 → relu → linear 256→64.
fn mlp() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", common::f32_ty(&[8, 64]));
    g.values[x].attrs.origin = Some("x".into());
    let w1 = const_f32(&mut g, &[256, 64], &data(256 * 64, 1));
    g.values[w1].attrs.origin = Some("fc1.weight".into());
    let w2 = const_f32(&mut g, &[64, 256], &data(256 * 64, 2));
    g.values[w2].attrs.origin = Some("fc2.weight".into());
    let h = push(&mut g, Op::Linear, vec![x, w1], &[8, 256]);
    let h = push(&mut g, Op::Unary(UnaryOp::Relu), vec![h], &[8, 256]);
    let y = push(&mut g, Op::Linear, vec![h, w2], &[8, 64]);
    g.add_output("y", y);
    g
}

fn options(mesh: &[(&str, u32)], cost: &str) -> ShardOptions {
    ShardOptions {
        mesh: Mesh::new(mesh),
        strategy: Strategy::Auto,
        overrides: vec![],
        inline_max_elements: 0,
        cost: CostModel::parse(cost).unwrap_or_else(|e| panic!("{e}")),
        manual_regions: true,
    }
}

fn weight_shardings(g: &Graph) -> Vec<Sharding> {
    g.consts.values().map(|c| g.values[c.value].attrs.sharding.clone().unwrap_or(Sharding::replicated(2))).collect()
}

#[test]
fn without_a_memory_limit_data_parallel_wins_and_weights_stay_whole() {
    let mut g = mlp();
    let plan = shard_graph(&mut g, &options(&[("data", 2)], "flops=1e12,link=1e9")).unwrap_or_else(|e| panic!("{e}"));
    let auto = plan.auto.expect("auto report");
    assert_eq!(auto.start, Strategy::DataParallel);
    assert!(plan.reshards.is_empty(), "{:?}", plan.reshards);
    assert!(weight_shardings(&g).iter().all(Sharding::is_replicated));
    assert_eq!(g.values[g.inputs[0]].attrs.sharding, Some(Sharding::split(2, 0, "data")));
    // Every strategy was costed; each layer lists every option it has.
    assert_eq!(auto.strategies.len(), 4);
    assert_eq!(auto.layers.len(), 2);
    for l in &auto.layers {
        assert_eq!(l.chosen, LayerChoice::Replicated);
        let best = l.options.iter().map(|(_, c)| c.step_s()).fold(f64::INFINITY, f64::min);
        let chosen = l.options.iter().find(|(o, _)| *o == l.chosen).map(|(_, c)| c.step_s());
        assert_eq!(chosen, Some(best), "{l:?}");
    }
}

#[test]
fn a_memory_limit_below_the_whole_weights_makes_auto_shard_them() {
    let whole = 2 * 256 * 64 * 4;
    let mut free = mlp();
    let unlimited = shard_graph(&mut free, &options(&[("data", 2)], "flops=1e12,link=1e9")).unwrap();
    assert_eq!(unlimited.cost.weight_bytes, whole);
    let limit = unlimited.cost.memory_bytes() - 20_000;
    let mut g = mlp();
    let plan = shard_graph(&mut g, &options(&[("data", 2)], &format!("flops=1e12,link=1e9,memory={limit}")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(plan.cost.memory_bytes() <= limit, "{:?} over {limit}", plan.cost);
    assert!(weight_shardings(&g).iter().any(|s| !s.is_replicated()));
    // What fits costs time: the weights are gathered where they are used.
    assert!(plan.cost.comm_s > 0.0 && plan.cost.step_s() > unlimited.cost.step_s());
}

#[test]
fn fast_compute_and_slow_links_keep_a_model_axis_unused() {
    // A 1-d model axis and a batch it divides: with links this slow, only
    // collective-free plans compete, and data-parallel computes least.
    let mut g = mlp();
    let plan = shard_graph(&mut g, &options(&[("model", 2)], "flops=1e9,link=1,latency=1")).unwrap();
    assert_eq!(plan.cost.comm_s, 0.0);
    assert_eq!(plan.auto.map(|a| a.start), Some(Strategy::DataParallel));
}

#[test]
fn user_overrides_pin_their_tensors() {
    let mut g = mlp();
    let mut opts = options(&[("data", 2)], "flops=1e12,link=1e9,memory=1");
    opts.overrides = vec![kiln_passes::shard::Override { pattern: "fc1.*".into(), sharding: Sharding::replicated(2) }];
    let plan = shard_graph(&mut g, &opts).unwrap_or_else(|e| panic!("{e}"));
    let auto = plan.auto.expect("auto report");
    assert_eq!(auto.layers.len(), 1, "fc1 is the user's");
    assert_eq!(auto.layers[0].name, "fc2.weight");
    assert_eq!(weight_shardings(&g)[0], Sharding::replicated(2));
}

#[test]
fn bad_cost_models_are_clear_errors() {
    for (spec, want) in [
        ("flops", "not KEY=VALUE"),
        ("flops=x", "not a number"),
        ("flops=-1", "positive"),
        ("speed=1", "unknown key `speed`"),
        ("link.=1", "unknown key"),
    ] {
        let e = CostModel::parse(spec).expect_err(spec);
        assert!(e.contains(want), "{spec}: {e}");
    }
    let m = CostModel::parse("link.model=4e11, memory=16e9").unwrap();
    assert_eq!(m.memory_per_device, Some(16_000_000_000));
    assert_eq!(m.link_bytes_per_s, vec![("model".to_string(), 4e11)]);
}
