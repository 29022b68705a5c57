//! Shared helpers for kiln's integration tests: fixture discovery, reading the
//! PyTorch reference tensors, and tolerance comparisons.

pub mod alloc_count;
pub mod coverage;
pub mod mutate;
pub mod signs;
pub mod tie_order;

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
    kiln_runtime::elements_f64(t)
}

/// `torch.testing.assert_close`'s default `(rtol, atol)` for a dtype; exact
/// (zero) for integers and bools.
pub fn default_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 | DType::C64 => (1.3e-6, 1e-5),
        DType::F64 | DType::C128 => (1e-7, 1e-7),
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (1.6e-2, 1e-5),
        _ => (0.0, 0.0),
    }
}

/// Compares `got` with `want` like `torch.testing.assert_close`: same dtype
/// and shape, `|got - want| <= atol + rtol * |want|` elementwise (exact for
/// integers and bools; 64-bit integers compared bit-exactly), NaNs in the
/// same places, infinities equal. `Err` says where the first mismatch is.
pub fn compare_close(got: &TensorView<'_>, want: &TensorView<'_>, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dtype != want.dtype {
        return Err(format!("dtype {} != expected {}", got.dtype, want.dtype));
    }
    if got.shape != want.shape {
        return Err(format!("shape {:?} != expected {:?}", got.shape, want.shape));
    }
    // Complex elements (`elements_f64` lists them real, imaginary) are
    // compared as torch's `isclose` does: `|got − want|` against
    // `atol + rtol · |want|`, both complex moduli.
    if want.dtype.is_complex() {
        return compare_complex(&as_f64(got), &as_f64(want), rtol, atol);
    }
    let exact = !(want.dtype.is_float() || want.dtype.is_complex());
    if exact && got.data != want.data {
        let (g, w) = (as_f64(got), as_f64(want));
        let i = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "element {i}: got {}, want {} (exact dtype)",
            g.get(i).unwrap_or(&f64::NAN),
            w.get(i).unwrap_or(&f64::NAN)
        ));
    }
    let (g, w) = (as_f64(got), as_f64(want));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if a.is_nan() || b.is_nan() {
            if !(a.is_nan() && b.is_nan()) {
                return Err(format!("element {i}: got {a}, want {b} (NaN positions differ)"));
            }
            continue;
        }
        if a == b {
            continue; // covers equal infinities
        }
        let tol = if exact { 0.0 } else { atol + rtol * b.abs() };
        let err = (a - b).abs();
        // NaN differences fail too: only a provably small difference passes.
        if !matches!(err.partial_cmp(&tol), Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)) {
            return Err(format!("element {i}: got {a}, want {b} (|diff| {err:e} > tol {tol:e})"));
        }
    }
    Ok(())
}

/// [`compare_close`] for complex values given as (real, imaginary) pairs;
/// NaN parts must sit in the same places.
fn compare_complex(g: &[f64], w: &[f64], rtol: f64, atol: f64) -> Result<(), String> {
    for (i, (a, b)) in g.chunks_exact(2).zip(w.chunks_exact(2)).enumerate() {
        let nan = |z: &[f64]| [z[0].is_nan(), z[1].is_nan()];
        if nan(a) != nan(b) {
            return Err(format!("element {i}: got {a:?}, want {b:?} (NaN positions differ)"));
        }
        if nan(a).contains(&true) || a == b {
            continue;
        }
        let err = (a[0] - b[0]).hypot(a[1] - b[1]);
        let tol = atol + rtol * b[0].hypot(b[1]);
        if !matches!(err.partial_cmp(&tol), Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)) {
            return Err(format!("element {i}: got {a:?}, want {b:?} (|diff| {err:e} > tol {tol:e})"));
        }
    }
    Ok(())
}

/// Asserts `got` matches `want` (see [`compare_close`]).
pub fn assert_close(what: &str, got: &TensorView<'_>, want: &TensorView<'_>, rtol: f64, atol: f64) {
    if let Err(e) = compare_close(got, want, rtol, atol) {
        panic!("{what}: {e}");
    }
}

/// Reads a `.npy` file; `bf16` says that raw `<u2` bits are bfloat16 (NumPy
/// has no bfloat16, so the generators store its bits as unsigned 16-bit ints).
pub fn read_npy_as(path: &Path, bf16: bool) -> Result<Tensor, String> {
    let mut bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut is_u16 = false;
    if let Some(at) = bytes.windows(5).take(256).position(|w| w == b"'<u2'") {
        bytes[at + 2] = b'f'; // parse as f2, then relabel
        is_u16 = true;
    }
    let mut t = kiln_compiler::npy::parse_npy(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if is_u16 {
        if !bf16 {
            return Err(format!("{}: uint16 arrays are only read as bfloat16 bits", path.display()));
        }
        t.dtype = DType::BF16;
    }
    Ok(t)
}

/// Runs `inputs` through `session` and copies the outputs out.
pub fn run_session(session: &mut kiln_runtime::Session, inputs: &[Tensor]) -> Result<Vec<Tensor>, kiln_runtime::Error> {
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    Ok(session.run(&views)?.to_tensors())
}

/// Asserts that `got` has `want`'s outputs, each within `rtol`/`atol` (see
/// [`assert_close`]).
pub fn assert_outputs_close(what: &str, got: &[Tensor], want: &[Tensor], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what} output {i}"), &g.view(), &w.view(), rtol, atol);
    }
}

/// A temporary file path unique to this process and call.
pub fn temp_path(tag: &str) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = tag.replace(['/', '\\'], "_");
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

/// `prefix_0.npy, prefix_1.npy, …` in `dir` (see [`read_npy_as`] for `bf16`),
/// with errors as values for suites that tally failures instead of panicking.
pub fn try_read_numbered(dir: &Path, prefix: &str, bf16: bool) -> Result<Vec<Tensor>, String> {
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy_as(&p, bf16))
        .collect()
}

/// Compiles a `.pt2` through `compile_file` (the CLI's path) and loads the
/// artifact; the error names the stage (`compile: …`, `load: …`).
pub fn try_compile_and_load(pt2: &Path, tag: &str) -> Result<std::sync::Arc<kiln_runtime::Program>, String> {
    try_compile_and_load_with(pt2, tag, &kiln_compiler::CompileOptions::default())
}

/// [`try_compile_and_load`] with `opts` (e.g. `--target x86_64`'s).
pub fn try_compile_and_load_with(
    pt2: &Path,
    tag: &str,
    opts: &kiln_compiler::CompileOptions,
) -> Result<std::sync::Arc<kiln_runtime::Program>, String> {
    let tmp = temp_path(tag);
    if let Err(e) = kiln_compiler::compile_file(pt2, &tmp, opts) {
        return Err(format!("compile: {}", e.to_string().lines().take(40).collect::<Vec<_>>().join(" | ")));
    }
    let program = kiln_runtime::Program::load(&tmp).map_err(|e| format!("load: {e}"));
    std::fs::remove_file(&tmp).ok();
    program
}

/// Runs `inputs` through `session` and compares every output with `expected`
/// at torch's default tolerance for its dtype.
pub fn try_run_and_compare(
    session: &mut kiln_runtime::Session,
    inputs: &[Tensor],
    expected: &[Tensor],
) -> Result<(), String> {
    try_run_and_compare_checked(session, inputs, expected, &OutputChecks::default())
}

/// An output of indices whose order among equal values torch leaves to its
/// C++ library (topk's unstable partial sort: libstdc++ and libc++ builds of
/// torch disagree). Output `indices` is checked by what it selects — input
/// `input` gathered along `dim` must give output `values`, with no index
/// repeated within a row — instead of being compared with torch's indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieOrder {
    pub input: usize,
    pub values: usize,
    pub indices: usize,
    pub dim: usize,
}

/// What a conformance case checks besides each output's elementwise
/// closeness: an index output whose tie order is torch's library's
/// ([`TieOrder`]), groups of outputs whose vectors are defined up to sign
/// ([`signs::align`]), and outputs torch leaves uninitialised.
#[derive(Clone, Debug, Default)]
pub struct OutputChecks {
    pub ties: Option<TieOrder>,
    pub signs: Vec<Vec<signs::Member>>,
    /// torch leaves the outputs uninitialised (`new_empty`): only their
    /// dtypes and shapes are checked.
    pub uninitialized: bool,
}

pub use signs::sign_groups;

/// [`try_run_and_compare`] under `checks`.
pub fn try_run_and_compare_checked(
    session: &mut kiln_runtime::Session,
    inputs: &[Tensor],
    expected: &[Tensor],
    checks: &OutputChecks,
) -> Result<(), String> {
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).map_err(|e| format!("run: {e}"))?;
    if outputs.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", outputs.len(), expected.len()));
    }
    let mut got: Vec<Tensor> = (0..outputs.len())
        .map(|i| {
            let v = outputs.get(i);
            Tensor { dtype: v.dtype, shape: v.shape.to_vec(), data: v.data.to_vec() }
        })
        .collect();
    signs::align_outputs(&checks.signs, &mut got, expected)?;
    for (i, want) in expected.iter().enumerate() {
        if checks.uninitialized {
            if got[i].dtype != want.dtype || got[i].shape != want.shape {
                return Err(format!(
                    "output {i}: {:?} {:?}, expected {:?} {:?}",
                    got[i].dtype, got[i].shape, want.dtype, want.shape
                ));
            }
            continue;
        }
        if let Some(t) = checks.ties.filter(|t| t.indices == i) {
            let (Some(input), Some(values)) = (views.get(t.input), expected.get(t.values)) else {
                return Err(format!("tie order names input {} / output {} that do not exist", t.input, t.values));
            };
            check_tied_indices(&got[i].view(), input, &values.view(), t.dim).map_err(|e| format!("output {i}: {e}"))?;
            continue;
        }
        let (rtol, atol) = default_tolerance(want.dtype);
        compare_close(&got[i].view(), &want.view(), rtol, atol).map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(())
}

/// Checks that i64 `indices` pick `values` out of `input` along `dim`
/// (exactly; NaN picks NaN) and that no row repeats an index.
pub fn check_tied_indices(
    indices: &TensorView<'_>,
    input: &TensorView<'_>,
    values: &TensorView<'_>,
    dim: usize,
) -> Result<(), String> {
    if indices.dtype != DType::I64 || indices.shape != values.shape {
        return Err(format!("indices {} {:?}, expected i64 {:?}", indices.dtype, indices.shape, values.shape));
    }
    tie_order::check(&as_f64(indices), indices.shape, &as_f64(input), input.shape, &as_f64(values), dim)
}

/// A four-row cache kept as state: each run writes `row` at `pos` (in
/// place: nothing reads the old cache afterwards) and returns the row at
/// `pick` of the updated cache. An out-of-range `pos` fails the run at the
/// write, before anything is written; an out-of-range `pick` fails it after
/// the write (the failed-run tests of `tests/state.rs` and the C API).
pub const IN_PLACE_CACHE_IR: &str = "graph {
  input %0 \"row\": f32[1, 2] {origin=\"row\"}
  input %1 \"pos\": i64[1] {origin=\"pos\"}
  input %2 \"pick\": i64[1] {origin=\"pick\"}
  input %3 \"cache\": f32[4, 2] {origin=\"cache\"}
  %4: f32[4, 2] = index_put{axis=0, accumulate=false}(%3, %0, %1)
  %5: f32[1, 2] = gather{axis=0}(%4, %2)
  output %5 \"y\"
  output %4 \"state cache\"
  state \"cache\" input 3 output 1 = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
}";

/// Uniform f32 values in `[lo, hi)` for every input of a static-shaped graph
/// (the pass before/after tests run both programs on them).
pub fn random_inputs(g: &kiln_ir::Graph, rng: &mut impl rand::Rng, lo: f32, hi: f32) -> Vec<Tensor> {
    g.inputs
        .iter()
        .map(|&v| {
            let shape = g.ty(v).static_shape().expect("a static input shape");
            let s: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let v: Vec<f32> = (0..s.iter().product::<usize>()).map(|_| rng.gen_range(lo..hi)).collect();
            Tensor::from_f32(&s, &v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_i64(shape, v)
    }

    #[test]
    fn tied_indices_are_checked_by_what_they_select() {
        // topk(k=2) of rows [5, 7, 5] and [1, 1, 3] along dim 1.
        let x = i64s(&[2, 3], &[5, 7, 5, 1, 1, 3]);
        let values = i64s(&[2, 2], &[7, 5, 3, 1]);
        let torch = i64s(&[2, 2], &[1, 0, 2, 1]);
        let other_tie = i64s(&[2, 2], &[1, 2, 2, 0]);
        assert!(check_tied_indices(&torch.view(), &x.view(), &values.view(), 1).is_ok());
        assert!(check_tied_indices(&other_tie.view(), &x.view(), &values.view(), 1).is_ok());
        let wrong_value = i64s(&[2, 2], &[0, 2, 2, 0]);
        assert!(check_tied_indices(&wrong_value.view(), &x.view(), &values.view(), 1)
            .unwrap_err()
            .contains("selects 5"));
        let repeated = i64s(&[2, 2], &[1, 0, 2, 2]);
        assert!(check_tied_indices(&repeated.view(), &x.view(), &values.view(), 1).unwrap_err().contains("repeated"));
        let out_of_range = i64s(&[2, 2], &[1, 3, 2, 0]);
        assert!(check_tied_indices(&out_of_range.view(), &x.view(), &values.view(), 1).is_err());
        // Along dim 0 of the transposed layout.
        let xt = i64s(&[3, 2], &[5, 1, 7, 1, 5, 3]);
        let vt = i64s(&[2, 2], &[7, 3, 5, 1]);
        let it = i64s(&[2, 2], &[1, 2, 2, 0]);
        assert!(check_tied_indices(&it.view(), &xt.view(), &vt.view(), 0).is_ok());
        // One index per row with dim 1 dropped (median, keepdim=False).
        let med = i64s(&[2], &[5, 1]);
        assert!(check_tied_indices(&i64s(&[2], &[2, 1]).view(), &x.view(), &med.view(), 1).is_ok());
        assert!(check_tied_indices(&i64s(&[2], &[1, 1]).view(), &x.view(), &med.view(), 1).is_err());
    }

    #[test]
    fn complex_values_are_close_by_their_modulus() {
        let (rtol, atol) = default_tolerance(DType::C64);
        // A part off by 2e-5 passes next to a large other part (|want| ~ 24:
        // tol 1e-5 + 1.3e-6 · 24), fails next to a small one.
        assert!(compare_complex(&[3.79283, -23.94380], &[3.79281, -23.94380], rtol, atol).is_ok());
        assert!(compare_complex(&[3.79283, 0.0], &[3.79281, 0.0], rtol, atol).is_err());
        // The error is the modulus of the difference: each part alone (9e-6)
        // is within the tolerance, both together (1.27e-5) are not.
        let e = compare_complex(&[1.0, 1.0], &[1.0 + 9e-6, 1.0 + 9e-6], rtol, atol).unwrap_err();
        assert!(e.contains("element 0"), "{e}");
        // NaN parts in the same places pass; elsewhere they fail.
        assert!(compare_complex(&[f64::NAN, 1.0], &[f64::NAN, 2.0], rtol, atol).is_ok());
        assert!(compare_complex(&[f64::NAN, 1.0], &[1.0, f64::NAN], rtol, atol).is_err());
    }
}
