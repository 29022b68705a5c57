//! Runs every `filetests/**/*.kir` file: `; test <pass>` picks the passes,
//! `; target cpu|primitive|pjrt` the target (cpu when absent); the result is compacted (dead constants
//! dropped) and printed. `BLESS=1 cargo test -p kiln-passes --test filetests`
//! rewrites expectations.

use kiln_ir::filetest::{run_dir, FileTest};
use kiln_ir::Graph;
use kiln_passes::shard::{shard_graph, CostModel, ShardOptions, Strategy, Use};
use kiln_passes::{
    compact, default_pipeline, run_pipeline, Options, Pass, Target, CLEANUP, DCE, DECOMPOSE, FOLD, FOLD_BATCH_NORMS,
    FUSE, FUSE_ATTENTION, FUSE_ELEMENTWISE, FUSE_EPILOGUE, FUSE_NORM, FUSE_SHARED_INPUT, LAYOUT, LEGALIZE, QUANT_ACTS,
    QUANT_LINEAR, QUANT_RESIDUALS, SIMPLIFY,
};
use std::path::Path;

fn run(test: &FileTest, g: &mut Graph) -> Result<(), String> {
    let target = match test.target.as_deref() {
        None => Target::Cpu,
        Some(name) => Target::from_name(name).ok_or_else(|| format!("unknown target `{name}`"))?,
    };
    if test.test == "shard" {
        return run_shard(test, g);
    }
    // DCE after a single pass so the printed graph shows only what is live.
    let passes: Vec<Pass> = match test.test.as_str() {
        "dce" => vec![DCE],
        "simplify" => vec![SIMPLIFY, DCE],
        "fold" => vec![FOLD, DCE],
        "cleanup" => vec![CLEANUP],
        "decompose" => vec![DECOMPOSE, DCE],
        "fuse" => vec![FUSE, DCE],
        "fold_batch_norms" => vec![FOLD_BATCH_NORMS, DCE],
        "fuse_elementwise" => vec![FUSE_ELEMENTWISE, DCE],
        "fuse_epilogue" => vec![FUSE_EPILOGUE, DCE],
        "fuse_shared_input" => vec![FUSE_SHARED_INPUT, DCE],
        "layout" => vec![LAYOUT, DCE],
        "fuse_attention" => vec![FUSE_ATTENTION, DCE],
        "fuse_norm" => vec![FUSE_NORM, DCE],
        "legalize" => vec![LEGALIZE, DCE],
        "quant_linear" => vec![QUANT_LINEAR, DCE],
        "quant_acts" => vec![QUANT_ACTS, DCE],
        "unflatten_rows" => {
            vec![Pass { name: "unflatten_rows", run: kiln_passes::shard::unflatten_rows }, SIMPLIFY, DCE]
        }
        "quant_residuals" => vec![QUANT_ACTS, QUANT_RESIDUALS, DCE],
        "pipeline" => default_pipeline(target),
        other => return Err(format!("unknown test `{other}`")),
    };
    let opts = Options { verify_each: true, ..Options::new(target) };
    run_pipeline(g, &passes, &opts).map_err(|e| e.to_string())?;
    *g = compact(g)?;
    Ok(())
}

/// `; test shard`: the graph's mesh, `; option strategy=…` (default
/// replicated), `; option inline_max=N` (default 0), `; option cost=…` (the
/// cost model, `CostModel::parse`'s form); the printed result shows
/// every value's sharding, and `; option reshards=…` must equal the
/// reshardings, `; `-separated.
fn run_shard(test: &FileTest, g: &mut Graph) -> Result<(), String> {
    let mesh = g.mesh.clone().ok_or("a shard filetest declares a mesh")?;
    let name = test.option("strategy").unwrap_or("replicated");
    let strategy = Strategy::from_name(name).ok_or_else(|| format!("unknown strategy `{name}`"))?;
    let inline_max_elements = test.option("inline_max").map_or(Ok(0), str::parse).map_err(|e| format!("{e}"))?;
    let cost = CostModel::parse(test.option("cost").unwrap_or(""))?;
    let opts = ShardOptions { mesh, strategy, overrides: vec![], inline_max_elements, cost, manual_regions: true };
    let plan = shard_graph(g, &opts)?;
    kiln_ir::verify::verify(g).map_err(|e| e.to_string())?;
    let got: Vec<String> = plan
        .reshards
        .iter()
        .map(|r| {
            let at = match r.at {
                Use::Operand { node, index } => format!("{node}.{index}"),
                Use::Output(k) => format!("output {k}"),
            };
            format!("{at} {} -> {} {} {}B", r.from, r.to, r.collective.name(), r.bytes)
        })
        .collect();
    let got = got.join("; ");
    match test.option("reshards") {
        Some(want) if want != got => Err(format!("reshards: got `{got}`, expected `{want}`")),
        None if !got.is_empty() => Err(format!("unexpected reshards `{got}` (add `; option reshards=…`)")),
        _ => Ok(()),
    }
}

#[test]
fn filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    match run_dir(&dir, &run) {
        Ok(n) => assert!(n > 0, "no filetests found in {}", dir.display()),
        Err(e) => panic!("{e}"),
    }
}
