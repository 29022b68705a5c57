//! Shape buckets (`--buckets`): programs with a dynamic dimension compiled
//! as one StableHLO executable per padded size, run on the XLA CPU plugin at
//! several sizes without the CPU plan, compared with PyTorch; sizes past the
//! largest bucket run the CPU plan; padding that could change results is a
//! compile error naming the op. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::buckets::BucketSpec;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, CompileOptions};
use kiln_ir::Graph;
use kiln_runtime::format::Metadata;
use kiln_runtime::{Device, ExecutableCache, Program, SessionOptions, Tensor, TensorView};
use stablehlo_support::*;
use std::path::Path;
use std::sync::Arc;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn compile_bucketed(g: Graph, spec: BucketSpec) -> Result<Arc<Program>, String> {
    let opts = CompileOptions { buckets: Some(spec), ..CompileOptions::default() };
    let (writer, _) =
        compile_graph_for(g, &opts, pjrt(Precision::F32), Metadata::default()).map_err(|e| e.to_string())?;
    Program::from_bytes(&writer.to_bytes()).map_err(|e| e.to_string())
}

/// The compile error for `spec` (a panic if it compiles).
fn refused(g: Graph, spec: BucketSpec) -> String {
    match compile_bucketed(g, spec) {
        Ok(_) => panic!("compiled, but should have been refused"),
        Err(e) => e,
    }
}

fn fixture(name: &str) -> Graph {
    import_pt2(&fixture_dir(name).join("training.pt2")).unwrap_or_else(|e| panic!("{name}: {e}")).graph
}

/// The name of the fixture's one symbol (torch's `s77`).
fn only_symbol(g: &Graph) -> String {
    let names: Vec<&str> = g.symbols.iter().map(|(_, s)| s.name.as_str()).collect();
    assert_eq!(names.len(), 1, "symbols {names:?}");
    names[0].to_string()
}

fn session(program: &Arc<Program>, plugin: &Path) -> kiln_runtime::Session {
    let opts = SessionOptions {
        device: Device::Pjrt(plugin.to_path_buf()),
        cache: ExecutableCache::Off,
        ..SessionOptions::default()
    };
    program.session_with(&opts).unwrap_or_else(|e| panic!("pjrt session: {e}"))
}

fn run(session: &mut kiln_runtime::Session, inputs: &[Tensor]) -> Vec<Tensor> {
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    session.run(&views).unwrap_or_else(|e| panic!("run: {e}")).to_tensors()
}

/// Runs `(inputs, expected)` pairs through one session and checks each
/// took bucket `want[k]` (no CPU plan), matching `expected`.
fn check_runs(what: &str, program: &Arc<Program>, plugin: &Path, cases: &[(Vec<Tensor>, Vec<Tensor>, usize)]) {
    let mut s = session(program, plugin);
    let buckets = program.accel().map_or(0, |a| a.buckets.len());
    assert_eq!(s.accel_info().map(|i| i.buckets), Some(buckets), "{what}: buckets compiled");
    let mut calls = vec![0u64; buckets];
    for (k, (inputs, expected, bucket)) in cases.iter().enumerate() {
        let got = run(&mut s, inputs);
        assert_eq!(got.len(), expected.len(), "{what}: outputs");
        for (i, (g, w)) in got.iter().zip(expected).enumerate() {
            assert_eq!(g.shape, w.shape, "{what} case {k} output {i}: shape");
            assert_close(&format!("{what} case {k} output {i}"), g, w, RTOL, ATOL);
        }
        calls[*bucket] += 1;
        let stats = s.accel_stats().expect("a PJRT session has stats");
        assert_eq!(stats.buckets.iter().map(|b| b.calls).collect::<Vec<_>>(), calls, "{what} case {k}: bucket calls");
        assert_eq!(stats.plan_runs, 0, "{what} case {k}: the CPU plan ran");
    }
}

#[test]
fn dynamic_batch_mlp_runs_in_buckets() {
    let Some(plugin) = plugin() else { return };
    let g = fixture("dynamic_mlp");
    let batch = only_symbol(&g);
    let program = compile_bucketed(g, BucketSpec::Sizes(vec![(batch, vec![4, 8, 16])])).unwrap();
    let accel = accel(&program);
    assert_eq!(accel.buckets.iter().map(|b| b.sizes.clone()).collect::<Vec<_>>(), vec![vec![4], vec![8], vec![16]]);
    let dir = fixture_dir("dynamic_mlp");
    // Batch 3 (bucket 4), 7 (bucket 8), and 4 exactly (no padding).
    let (x3, y3) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    let (x7, y7) = (read_numbered(&dir, "alt_input"), read_numbered(&dir, "alt_output"));
    let cpu = compile(fixture("dynamic_mlp"), kiln_compiler::Backend::Cpu);
    let x4 = vec![random_f32(&[4, 16], 11, -2.0, 2.0)];
    let y4 = run_cpu(&cpu, &x4);
    let x13 = vec![random_f32(&[13, 16], 12, -2.0, 2.0)];
    let y13 = run_cpu(&cpu, &x13);
    check_runs("dynamic_mlp", &program, &plugin, &[(x3, y3, 0), (x7, y7, 1), (x4, y4, 0), (x13, y13, 2)]);
}

#[test]
fn past_the_largest_bucket_the_cpu_plan_runs() {
    let Some(plugin) = plugin() else { return };
    let g = fixture("dynamic_mlp");
    let batch = only_symbol(&g);
    let program = compile_bucketed(g, BucketSpec::Sizes(vec![(batch, vec![4])])).unwrap();
    let cpu = compile(fixture("dynamic_mlp"), kiln_compiler::Backend::Cpu);
    let x = vec![random_f32(&[9, 16], 13, -2.0, 2.0)];
    let want = run_cpu(&cpu, &x);
    let mut s = session(&program, &plugin);
    let got = run(&mut s, &x);
    for (g, w) in got.iter().zip(&want) {
        assert_close("batch 9 on the CPU plan", g, w, RTOL, ATOL);
    }
    let stats = s.accel_stats().unwrap();
    assert_eq!((stats.plan_runs, stats.buckets[0].calls), (1, 0));
    // The same artifact also runs on the CPU device, every size on the plan.
    let got = run_cpu(&program, &x);
    for (g, w) in got.iter().zip(&want) {
        assert_close("batch 9, --device cpu", g, w, RTOL, ATOL);
    }
}

#[test]
fn auto_buckets_are_powers_of_two_within_bounds() {
    let g = fixture("dynamic_mlp");
    let Ok(program) = compile_bucketed(g, BucketSpec::Auto) else { panic!("auto buckets for dynamic_mlp") };
    let sizes: Vec<u64> = accel(&program).buckets.iter().map(|b| b.sizes[0]).collect();
    // batch is declared in [1, 64].
    assert_eq!(sizes, vec![1, 2, 4, 8, 16, 32, 64]);
}

#[test]
fn unknown_symbols_and_sizes_out_of_range_are_refused() {
    let g = fixture("dynamic_mlp");
    let batch = only_symbol(&g);
    let err = refused(g.clone(), BucketSpec::Sizes(vec![("nope".into(), vec![4])]));
    assert!(err.contains("no symbol `nope`") && err.contains(&batch), "{err}");
    let err = refused(g, BucketSpec::Sizes(vec![(batch, vec![128])]));
    assert!(err.contains("outside its range [1, 64]"), "{err}");
}

/// Softmax over the dynamic axis: padding would add exp(0) terms to every
/// real row's sum, so it is refused, naming the op.
#[test]
fn padding_under_a_reduction_is_refused_naming_the_op() {
    let text = "
graph {
  sym n in [1, 32]
  input %0 \"x\": f32[n, 4]
  %1: f32[n, 4] = relu(%0)
  %2: f32[n, 4] = softmax{axis=0}(%1)
  output %2 \"y\"
}
";
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let err = refused(g, BucketSpec::Sizes(vec![("n".into(), vec![8])]));
    assert!(err.contains("softmax") && err.contains("padded axis"), "{err}");
}

#[test]
fn dynamic_sequence_transformer_runs_in_buckets() {
    let Some(plugin) = plugin() else { return };
    let g = fixture("transformer_dynseq");
    let seq = only_symbol(&g);
    let program = compile_bucketed(g, BucketSpec::Sizes(vec![(seq, vec![8, 16])])).unwrap_or_else(|e| panic!("{e}"));
    let dir = fixture_dir("transformer_dynseq");
    // Sequence 8 (bucket 8, no padding) and 5 (bucket 8, 3 padded keys).
    let (x8, y8) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    let (x5, y5) = (read_numbered(&dir, "alt_input"), read_numbered(&dir, "alt_output"));
    let cpu = compile(fixture("transformer_dynseq"), kiln_compiler::Backend::Cpu);
    let x11 = vec![Tensor::from_i64(&[2, 11], &(0..22).map(|i| (i * 7) % 50).collect::<Vec<i64>>())];
    let y11 = run_cpu(&cpu, &x11);
    check_runs("transformer_dynseq", &program, &plugin, &[(x8, y8, 0), (x5, y5, 0), (x11, y11, 1)]);
}
