//! Shared helpers for kiln's integration tests: fixture discovery, reading the
//! PyTorch reference tensors, and tolerance comparisons.

use kiln_compiler::npy::read_npy;
use kiln_runtime::{DType, Tensor, TensorView};
use std::path::{Path, PathBuf};

/// The fixtures generated from PyTorch by `tests/fixtures/generate.py`.
pub const FIXTURES: [&str; 6] = ["mlp", "cnn", "transformer", "transformer_mask", "dynamic_mlp", "transformer_dynseq"];
/// Both IR flavours users save: raw `export()` output and `run_decompositions()` output.
pub const FLAVOURS: [&str; 2] = ["training", "aten"];

pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

/// `prefix_0.npy, prefix_1.npy, …` in `dir`, until one is missing.
pub fn read_numbered(dir: &Path, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&p).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn as_f64(t: &TensorView<'_>) -> Vec<f64> {
    match t.dtype {
        DType::F32 => t.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::F64 => t.data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::I64 => t.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::I32 => t.data.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::Bool | DType::U8 => t.data.iter().map(|&b| b as f64).collect(),
        DType::I8 => t.data.iter().map(|&b| b as i8 as f64).collect(),
        other => panic!("comparison of {other} tensors is not implemented in the test helper"),
    }
}

/// Asserts `got` matches `want` like `torch.testing.assert_close`: same dtype
/// and shape, `|got - want| <= atol + rtol * |want|` elementwise (exact for
/// integers and bools), NaNs in the same places.
pub fn assert_close(what: &str, got: &TensorView<'_>, want: &TensorView<'_>, rtol: f64, atol: f64) {
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    assert_eq!(got.shape, want.shape, "{what}: shape");
    let exact = !matches!(want.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    let (g, w) = (as_f64(got), as_f64(want));
    let mut worst = (0.0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if a.is_nan() || b.is_nan() {
            assert!(a.is_nan() && b.is_nan(), "{what}: element {i}: got {a}, want {b} (NaN positions differ)");
            continue;
        }
        let tol = if exact { 0.0 } else { atol + rtol * b.abs() };
        let err = (a - b).abs();
        assert!(err <= tol, "{what}: element {i}: got {a}, want {b} (|diff| {err:e} > tol {tol:e})");
        if err > worst.0 {
            worst = (err, i);
        }
    }
}

/// A temporary file path unique to this process and call.
pub fn temp_path(tag: &str) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("kiln-test-{tag}-{}-{n}.kiln", std::process::id()))
}

/// Compiles `fixtures/<name>/<flavour>.pt2` with default options through
/// `compile_file` (the CLI's path) and returns the artifact's bytes.
pub fn compile_fixture(name: &str, flavour: &str) -> Vec<u8> {
    let tmp = temp_path(name);
    let src = fixture_dir(name).join(format!("{flavour}.pt2"));
    kiln_compiler::compile_file(&src, &tmp, &kiln_compiler::CompileOptions::default())
        .unwrap_or_else(|e| panic!("{name}/{flavour}: compile failed: {e}"));
    let bytes = std::fs::read(&tmp).expect("read artifact");
    std::fs::remove_file(&tmp).ok();
    bytes
}

/// Compiles a fixture and loads it (from a file, through the memory map).
pub fn load_fixture(name: &str, flavour: &str) -> std::sync::Arc<kiln_runtime::Program> {
    let tmp = temp_path(name);
    std::fs::write(&tmp, compile_fixture(name, flavour)).expect("write artifact");
    let program = kiln_runtime::Program::load(&tmp).unwrap_or_else(|e| panic!("{name}/{flavour}: load failed: {e}"));
    std::fs::remove_file(&tmp).ok();
    program
}
