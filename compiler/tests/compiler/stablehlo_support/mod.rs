//! Shared by the `stablehlo_*` tests: the XLA CPU plugin, compiling a graph
//! for both targets, running and comparing.
#![allow(dead_code)]

use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, Backend, CompileOptions};
use kiln_runtime::format::{AccelProgram, Metadata};
use kiln_runtime::{Device, ExecutableCache, Program, SessionOptions, Tensor, TensorView};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const PLUGIN_ENV: &str = "KILN_TEST_XLA_CPU_PLUGIN";

/// `name` is a fixture under tests/fixtures (`mlp`, `torch-2.9/mlp`, `state/counter`).
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// `prefix_0.npy, prefix_1.npy, …` in `dir`, until one is missing.
pub fn read_numbered(dir: &Path, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| kiln_compiler::npy::read_npy(&p).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The XLA CPU plugin from `KILN_TEST_XLA_CPU_PLUGIN`. Unset: a failure under
/// CI (the tests must not pass vacuously there), a skip note otherwise.
pub fn plugin() -> Option<PathBuf> {
    match std::env::var_os(PLUGIN_ENV) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{PLUGIN_ENV} is not set under CI: point it at xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so \
             (pip download --no-deps xla-cpu-pjrt==0.0.1, then unzip the wheel)"
        ),
        _ => {
            eprintln!(
                "skipped: set {PLUGIN_ENV}=/path/xla_cpu_pjrt.so to run the StableHLO tests on the XLA CPU plugin"
            );
            None
        }
    }
}

pub fn compile(g: kiln_ir::Graph, backend: Backend) -> Arc<Program> {
    let (writer, _) = compile_graph_for(g, &CompileOptions::default(), backend, Metadata::default())
        .unwrap_or_else(|e| panic!("compile: {e}"));
    Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("load: {e}"))
}

pub fn pjrt(precision: Precision) -> Backend {
    Backend::Pjrt { precision }
}

pub fn accel(program: &Program) -> AccelProgram {
    program.accel().cloned().unwrap_or_default()
}

pub fn run_cpu(program: &Arc<Program>, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut session = program.session().unwrap_or_else(|e| panic!("cpu session: {e}"));
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    session.run(&views).unwrap_or_else(|e| panic!("cpu run: {e}")).to_tensors()
}

pub fn run_pjrt(program: &Arc<Program>, plugin: &Path, inputs: &[Tensor]) -> Vec<Tensor> {
    let opts = SessionOptions {
        device: Device::Pjrt(plugin.to_path_buf()),
        cache: ExecutableCache::Off,
        ..SessionOptions::default()
    };
    let mut session = program.session_with(&opts).unwrap_or_else(|e| {
        let program_accel = accel(program);
        let text: Vec<&str> = program_accel.segments.iter().map(|s| s.mlir.as_str()).collect();
        panic!("pjrt session: {e}\n{}", text.join("\n"))
    });
    // Every segment must have been compiled by the plugin, so a passing
    // comparison means the StableHLO text really ran there.
    let segments = accel(program).segments.len();
    if segments > 0 {
        let info = session
            .accel_info()
            .unwrap_or_else(|| panic!("a session with {segments} segments has no accelerator delegate"));
        assert_eq!(
            (info.segments, info.compiled + info.cache_hits),
            (segments, segments),
            "segments compiled by the plugin"
        );
    }
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    session.run(&views).unwrap_or_else(|e| panic!("pjrt run: {e}")).to_tensors()
}

/// Elements as f64 for comparison (every dtype; complex ones as their
/// real and imaginary parts in turn).
pub fn values(t: &Tensor) -> Vec<f64> {
    kiln_runtime::elements_f64(&t.view())
}

pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) {
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    assert_eq!(got.shape, want.shape, "{what}: shape");
    let (g, w) = (values(got), values(want));
    let mut worst = (0.0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let both_nan = a.is_nan() && b.is_nan();
        let err = (a - b).abs() - rtol * b.abs();
        if !both_nan && (err > atol || a.is_nan() != b.is_nan()) && (err > worst.0 || a.is_nan() || b.is_nan()) {
            worst = (if err.is_nan() { f64::INFINITY } else { err }, i);
        }
    }
    assert!(
        worst.0 == 0.0,
        "{what}: element {} is {} (expected {}), beyond rtol {rtol} atol {atol}",
        worst.1,
        g[worst.1],
        w[worst.1]
    );
}

/// A deterministic pseudo-random f32 tensor in [lo, hi).
pub fn random_f32(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let vals: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32) / ((1u64 << 24) as f32);
            lo + (hi - lo) * u
        })
        .collect();
    Tensor::from_f32(shape, &vals)
}

/// Relative L2 error `‖got − want‖ / ‖want‖` at most `tol`: the check for
/// bf16, whose per-element error depends on each value's exponent.
pub fn assert_close_norm(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    assert_eq!(got.shape, want.shape, "{what}: shape");
    let (g, w) = (values(got), values(want));
    let diff: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
    let norm: f64 = w.iter().map(|b| b * b).sum::<f64>().sqrt().max(1e-12);
    assert!(diff / norm <= tol, "{what}: relative L2 error {:.3e} exceeds {tol:e}", diff / norm);
}
