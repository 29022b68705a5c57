//! Shape buckets (`--buckets`): programs with a dynamic dimension compiled
//! as one StableHLO executable per padded size, run on the XLA CPU plugin at
//! several sizes without the CPU plan, compared with PyTorch; sizes past the
//! largest bucket run the CPU plan; padding that could change results is a
//! compile error naming the op. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::buckets::{specialize, BucketSpec};
use kiln_compiler::stablehlo::masks::mask_padding;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, CompileOptions};
use kiln_ir::Graph;
use kiln_runtime::format::Metadata;
use kiln_runtime::{Device, ExecutableCache, Program, SessionOptions, Tensor, TensorView};
use stablehlo_support::*;
use std::collections::HashMap;
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
    // Nothing combines along the batch: no masks, no true-size arguments.
    assert!(accel.buckets.iter().all(|b| b.true_sizes.is_empty()), "true sizes of an unmasked program");
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
/// real row's sum unless masked; the bucket masks it and matches the CPU
/// plan at sizes below the bucket.
#[test]
fn softmax_over_a_padded_axis_is_masked() {
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
    let program = compile_bucketed(g.clone(), BucketSpec::Sizes(vec![("n".into(), vec![8])])).unwrap();
    assert_eq!(accel(&program).buckets[0].true_sizes, vec![0], "n's true size is an argument");
    let Some(plugin) = plugin() else { return };
    let cpu = compile(g, kiln_compiler::Backend::Cpu);
    let cases: Vec<_> = [3usize, 8]
        .iter()
        .map(|&n| {
            let x = vec![random_f32(&[n, 4], n as u64, -2.0, 2.0)];
            let y = run_cpu(&cpu, &x);
            (x, y, 0)
        })
        .collect();
    check_runs("softmax over n", &program, &plugin, &cases);
}

/// What masking does not cover is still refused, naming the op: a norm over
/// the padded axis, a flip of it, causal attention over keys padded to
/// another length than its queries.
#[test]
fn padding_under_an_unmasked_op_is_refused_naming_the_op() {
    let cases = [
        (
            "%1: f32[4, n] = layer_norm{normalized_rank=1, eps=0.00001}(%0)",
            "layer_norm",
            "normalizes along a padded axis",
        ),
        ("%1: f32[4, n] = flip{axes=[1]}(%0)", "flip", "flips a padded axis"),
    ];
    for (line, op, why) in cases {
        let text =
            format!("graph {{\n  sym n in [1, 32]\n  input %0 \"x\": f32[4, n]\n  {line}\n  output %1 \"y\"\n}}\n");
        let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}"));
        let err = refused(g, BucketSpec::Sizes(vec![("n".into(), vec![8])]));
        assert!(err.contains(op) && err.contains(why), "{err}");
    }
    let text = "
graph {
  sym n in [1, 32]
  sym m in [1, 32]
  input %0 \"q\": f32[2, n, 4]
  input %1 \"k\": f32[2, m, 4]
  %2: f32[2, n, 4] = attention{causal=true}(%0, %1, %1)
  output %2 \"y\"
}
";
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let err = refused(g, BucketSpec::Sizes(vec![("n".into(), vec![8]), ("m".into(), vec![8])]));
    assert!(err.contains("attention") && err.contains("causal attention over keys padded"), "{err}");
}

/// `compiler/filetests/bucket_masks/*.kir`: `; option sizes=NAME=SIZE,...`
/// specialises the graph to one bucket, then `mask_padding` rewrites it
/// (the true sizes are the last inputs). `BLESS=1` rewrites expectations.
#[test]
fn mask_filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests/bucket_masks");
    let run = |test: &kiln_ir::filetest::FileTest, g: &mut Graph| -> Result<(), String> {
        if test.test != "mask_padding" {
            return Err(format!("unknown test `{}`", test.test));
        }
        let sizes = bucket_of(g, test.option("sizes").ok_or("no `; option sizes=`")?)?;
        let mut bucket = specialize(g, &sizes);
        mask_padding(g, &mut bucket)?;
        kiln_ir::verify::verify(&bucket).map_err(|e| e.to_string())?;
        *g = bucket;
        Ok(())
    };
    let n = kiln_ir::filetest::run_dir(&dir, &run).unwrap_or_else(|e| panic!("{e}"));
    assert!(n >= 5, "{n} filetests");
}

/// `NAME=SIZE,NAME=SIZE` as one bucket's sizes.
fn bucket_of(g: &Graph, text: &str) -> Result<HashMap<kiln_ir::SymbolId, i64>, String> {
    text.split(',')
        .map(|part| {
            let (name, size) = part.split_once('=').ok_or_else(|| format!("`{part}` is not NAME=SIZE"))?;
            let s = g.symbol_by_name(name.trim()).ok_or_else(|| format!("no symbol `{name}`"))?;
            Ok((s, size.trim().parse::<i64>().map_err(|e| format!("`{size}`: {e}"))?))
        })
        .collect()
}

/// The masked bucket graph on the CPU plan, its padding full of NaN, equals
/// the symbolic program at the true size: the masks alone keep the padding
/// out of every real element (no zeros to rely on). No plugin needed.
#[test]
fn masked_bucket_graphs_ignore_nan_padding() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests/bucket_masks");
    for file in ["reductions.kir", "attention.kir", "matmul.kir"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let body = &text[text.find("graph {").unwrap()..];
        let body = &body[..body.find("\n}").unwrap() + 2];
        let g = kiln_ir::text::parse(body).unwrap_or_else(|e| panic!("{file}: {e}"));
        let n = g.symbol_by_name("n").unwrap();
        let (padded, real) = (8usize, 5usize);
        let mut bucket = specialize(&g, &HashMap::from([(n, padded as i64)]));
        let sizes = mask_padding(&g, &mut bucket).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(sizes, vec![n], "{file}: n's true size is the last input");
        // Inputs at the true size, and padded with NaN (bool: `true`).
        let mut real_inputs = Vec::new();
        let mut padded_inputs = Vec::new();
        for (k, &v) in g.inputs.iter().enumerate() {
            let shape = |size: usize| -> Vec<usize> {
                g.ty(v).shape.iter().map(|d| d.as_const().map_or(size, |c| c as usize)).collect()
            };
            let x = match g.ty(v).dtype {
                kiln_ir::DType::Bool => {
                    let t = random_f32(&shape(real), 40 + k as u64, 0.0, 1.0);
                    let keep: Vec<bool> = values(&t).iter().map(|&u| u < 0.7).collect();
                    bool_tensor(&shape(real), &keep)
                }
                _ => random_f32(&shape(real), 40 + k as u64, -2.0, 2.0),
            };
            padded_inputs.push(pad_with(&x, &shape(padded)));
            real_inputs.push(x);
        }
        padded_inputs.push(Tensor::from_i64(&[], &[real as i64]));
        let want = run_cpu(&compile(g.clone(), kiln_compiler::Backend::Cpu), &real_inputs);
        let got = run_cpu(&compile(bucket, kiln_compiler::Backend::Cpu), &padded_inputs);
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            let got = corner(got, &want.shape);
            assert_close(&format!("{file} output {i}"), &got, want, RTOL, ATOL);
        }
    }
}

/// `x` in the low corner of `shape`, the rest NaN (or `true`).
fn pad_with(x: &Tensor, shape: &[usize]) -> Tensor {
    let vals = values(x);
    let n: usize = shape.iter().product();
    let mut out = vec![f64::NAN; n];
    for (i, v) in vals.iter().enumerate() {
        out[offset_in(i, &x.shape, shape)] = *v;
    }
    match x.dtype {
        kiln_runtime::DType::Bool => {
            bool_tensor(shape, &out.iter().map(|&v| v.is_nan() || v != 0.0).collect::<Vec<_>>())
        }
        _ => Tensor::from_f32(shape, &out.iter().map(|&v| v as f32).collect::<Vec<_>>()),
    }
}

fn bool_tensor(shape: &[usize], values: &[bool]) -> Tensor {
    Tensor {
        dtype: kiln_runtime::DType::Bool,
        shape: shape.to_vec(),
        data: values.iter().map(|&b| u8::from(b)).collect(),
    }
}

/// The low corner of `x` of shape `shape`.
fn corner(x: &Tensor, shape: &[usize]) -> Tensor {
    let vals = values(x);
    let n: usize = shape.iter().product();
    let picked: Vec<f64> = (0..n).map(|i| vals[offset_in(i, shape, &x.shape)]).collect();
    match x.dtype {
        kiln_runtime::DType::I64 => Tensor::from_i64(shape, &picked.iter().map(|&v| v as i64).collect::<Vec<_>>()),
        _ => Tensor::from_f32(shape, &picked.iter().map(|&v| v as f32).collect::<Vec<_>>()),
    }
}

/// Row-major element `i` of `small` at its place in `big` (same rank).
fn offset_in(mut i: usize, small: &[usize], big: &[usize]) -> usize {
    let mut index = vec![0; small.len()];
    for k in (0..small.len()).rev() {
        index[k] = i % small[k];
        i /= small[k];
    }
    index.iter().zip(big).fold(0, |o, (&ix, &b)| o * b + ix)
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

/// A BERT-like encoder over a dynamic sequence: non-causal attention over
/// padded keys, a mean pool, a softmax-weighted pool (a matmul contracting
/// the sequence), a max pool and an argmax over it, each masked in the
/// bucket; compared with PyTorch at sizes equal to a bucket (8, 16) and
/// between buckets (5, 13), all without the CPU plan.
#[test]
fn bert_like_encoder_with_pools_runs_in_masked_buckets() {
    let g = fixture("encoder_dynseq");
    let seq = only_symbol(&g);
    let program = compile_bucketed(g, BucketSpec::Sizes(vec![(seq, vec![8, 16])])).unwrap_or_else(|e| panic!("{e}"));
    for b in &accel(&program).buckets {
        assert_eq!(b.true_sizes, vec![0], "bucket {:?} reads the sequence's true size", b.sizes);
    }
    let Some(plugin) = plugin() else { return };
    let dir = fixture_dir("encoder_dynseq");
    let case = |prefix: &str, bucket: usize| {
        (read_numbered(&dir, &format!("{prefix}input")), read_numbered(&dir, &format!("{prefix}output")), bucket)
    };
    let cases = [case("", 0), case("alt_", 0), case("len13_", 1), case("len16_", 1)];
    assert!(cases.iter().all(|(x, y, _)| x.len() == 1 && y.len() == 5), "fixture files");
    check_runs("encoder_dynseq", &program, &plugin, &cases);
}
