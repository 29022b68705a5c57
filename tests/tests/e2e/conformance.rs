//! Per-op conformance with PyTorch: every committed case of
//! `tests/conformance/cases/manifest.json` (made by
//! `tests/conformance/generate.py` from PyTorch's OpInfo sample inputs), in
//! each IR flavour it has, is compiled, loaded and run, and every output is
//! compared with PyTorch's eager output at `torch.testing.assert_close`'s
//! default tolerances for its dtype (exact for integers and bools, NaN
//! positions must match). topk's indices are the one exception: torch leaves
//! the order of tied values to its C++ library, so a case's `ties` entry has
//! them checked by what they select (`kiln_tests::check_tied_indices`); and
//! eigenvectors and singular vectors, defined up to sign, are flipped to
//! torch's signs first (a case's `signs` entry, `kiln_tests::signs`).
//!
//! The test fails on any mismatch or compile/load/run error, except for case
//! flavours the manifest marks `unsupported: {flavour: reason}`. It prints a per-op
//! summary. `KILN_CONFORMANCE_FILTER=cumsum,topk` runs only those ops (for
//! local iteration); `KILN_CONFORMANCE_DIR=/tmp/kiln-conf` runs the cases of
//! another folder (the generator's `--full` or `--all` set), and
//! `KILN_CONFORMANCE_RESULTS=PATH` writes every run's outcome there as JSON
//! (`generate.py --summary PATH` turns it into the per-flavour sweep table).

use kiln_compiler::CompileOptions;
use kiln_tests::coverage::{core_coverage, passing_share, CaseRun, CoreStatus};
use kiln_tests::{
    sign_groups, try_compile_and_load_with, try_read_numbered, try_run_and_compare_checked, OutputChecks, TieOrder,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The committed cases, or `KILN_CONFORMANCE_DIR` (a folder holding a
/// `manifest.json`, e.g. from `generate.py --full --out DIR`) for local runs.
fn cases_dir() -> PathBuf {
    match std::env::var_os("KILN_CONFORMANCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance").join("cases"),
    }
}

/// Compiles, loads and runs one flavour of one case; `Err` names the stage.
/// Returns the number of native calls of the compiled program.
fn run_case(
    dir: &Path,
    flavour: &str,
    bf16: bool,
    checks: &OutputChecks,
    opts: &CompileOptions,
) -> Result<usize, String> {
    let inputs = try_read_numbered(dir, "input", bf16)?;
    // The generator writes every bf16 array as `<u2` bits, outputs of
    // other cases' dtypes (`x.bfloat16()`) included.
    let expected = try_read_numbered(dir, "output", true)?;
    let program = try_compile_and_load_with(&dir.join(format!("{flavour}.pt2")), "conformance", opts)?;
    let mut session = program.session().map_err(|e| format!("session: {e}"))?;
    try_run_and_compare_checked(&mut session, &inputs, &expected, checks)?;
    let native = |i: &kiln_runtime::format::Instr| matches!(i.op, kiln_runtime::format::InstrOp::Native { .. });
    Ok(program.plan().instrs.iter().filter(|i| native(i)).count())
}

/// The case's `ties` entry (written by generate.py for topk): which index
/// output may order tied values differently from torch.
fn tie_order(case: &Value) -> Option<TieOrder> {
    let t = case.get("ties")?;
    let field = |k: &str| t.get(k).and_then(Value::as_u64).map(|v| v as usize);
    Some(TieOrder { input: field("input")?, values: field("values")?, indices: field("indices")?, dim: field("dim")? })
}

#[derive(Default)]
struct OpTally {
    passed: usize,
    expected_unsupported: usize,
    unexpectedly_passing: Vec<String>,
    failures: Vec<String>,
}

#[test]
fn conformance_with_pytorch() {
    run_conformance(&CompileOptions::default());
}

/// The suite compiled with `--target x86_64` (default CPU levels): the fused
/// groups of the cases with two or more elementwise ops run as native code
/// (a lone op stays a kernel call).
#[cfg(all(feature = "native", target_arch = "x86_64"))]
#[test]
fn conformance_with_pytorch_native_x86_64() {
    use kiln_compiler::native::NativeTarget;
    let native = NativeTarget::new(kiln_runtime::native::NativeArch::X86_64, None).expect("default levels");
    let calls = run_conformance(&CompileOptions { native: Some(native), ..CompileOptions::default() });
    assert!(calls > 0, "no conformance case ran native code");
}

/// Runs every case compiled with `opts`; returns the native calls compiled.
fn run_conformance(opts: &CompileOptions) -> usize {
    let mut native_calls = 0;
    let root = cases_dir();
    let text =
        std::fs::read_to_string(root.join("manifest.json")).expect("manifest.json (run tests/conformance/generate.py)");
    let manifest: Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let filter: Option<Vec<String>> =
        std::env::var("KILN_CONFORMANCE_FILTER").ok().map(|f| f.split(',').map(str::to_string).collect());
    let mut tally: BTreeMap<String, OpTally> = BTreeMap::new();
    let mut runs: Vec<CaseRun> = Vec::new();
    let mut outcomes: Vec<Value> = Vec::new();
    let cases = manifest["cases"].as_array().expect("cases");
    assert!(!cases.is_empty(), "the manifest lists no cases");
    for case in cases {
        let op = case["op"].as_str().expect("op").to_string();
        if filter.as_ref().is_some_and(|f| !f.contains(&op)) {
            continue;
        }
        let dtype = case["dtype"].as_str().expect("dtype");
        let dir = root.join(case["dir"].as_str().expect("dir"));
        let unsupported = case.get("unsupported");
        let t = tally.entry(op.clone()).or_default();
        for flavour in case["flavours"].as_array().expect("flavours") {
            let flavour = flavour.as_str().expect("flavour");
            let what = format!("{}/{flavour}", case["dir"].as_str().unwrap_or("?"));
            let unsupported = unsupported.and_then(|u| u.get(flavour)).and_then(Value::as_str);
            // The options (custom-op lowerings) are only read by the compile.
            let checks = OutputChecks {
                ties: tie_order(case),
                signs: sign_groups(case),
                uninitialized: case.get("uninitialized").and_then(Value::as_bool) == Some(true),
            };
            let run = std::panic::AssertUnwindSafe(|| run_case(&dir, flavour, dtype == "bf16", &checks, opts));
            let result = std::panic::catch_unwind(run).unwrap_or_else(|_| Err("panicked".to_string()));
            native_calls += result.as_ref().map_or(0, |&n| n);
            let result = result.map(|_| ());
            let ops_key = if flavour == "training" { "training_ops" } else { "aten_ops" };
            let ops = case[ops_key]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default();
            // A known-unsupported run is a program kiln refuses for a stated
            // reason (a write into a user input, ...): it ran none of its
            // overloads, so it counts for none of them.
            if unsupported.is_none() {
                runs.push(CaseRun { ops, passed: result.is_ok() });
            }
            outcomes.push(outcome(case["dir"].as_str().unwrap_or("?"), flavour, &result));
            match (result, unsupported) {
                (Ok(()), None) => t.passed += 1,
                (Ok(()), Some(_)) => t.unexpectedly_passing.push(what),
                (Err(_), Some(_)) => t.expected_unsupported += 1,
                (Err(e), None) => t.failures.push(format!("{what}: {e}")),
            }
        }
    }
    let (mut pass, mut known, mut fail) = (0, 0, 0);
    println!("{:<44} {:>6} {:>8} {:>6}", "op", "pass", "known", "FAIL");
    for (op, t) in &tally {
        println!("{op:<44} {:>6} {:>8} {:>6}", t.passed, t.expected_unsupported, t.failures.len());
        pass += t.passed;
        known += t.expected_unsupported;
        fail += t.failures.len();
    }
    println!("total: {pass} passed, {known} known-unsupported, {fail} failed, over {} ops", tally.len());
    for (op, t) in &tally {
        for w in &t.unexpectedly_passing {
            println!("note: {op}: {w} is marked unsupported but passes; unmark it in generate.py");
        }
    }
    if let Some(path) = std::env::var_os("KILN_CONFORMANCE_RESULTS") {
        let text = serde_json::to_string_pretty(&outcomes).expect("outcomes serialise");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
    }
    let committed_and_whole = filter.is_none() && std::env::var_os("KILN_CONFORMANCE_DIR").is_none();
    report_core_coverage(&runs, committed_and_whole);
    let failures: Vec<&String> = tally.values().flat_map(|t| &t.failures).collect();
    assert!(
        failures.is_empty(),
        "{} conformance failures:\n{}",
        failures.len(),
        failures.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
    );
    native_calls
}

/// One run's outcome for `KILN_CONFORMANCE_RESULTS`: `pass`, `unsupported`
/// (kiln's compile-time list of constructs it does not support, with the
/// targets it names), `mismatch` (ran, gave other numbers) or `other`
/// (any other compile, load or run error).
fn outcome(dir: &str, flavour: &str, result: &Result<(), String>) -> Value {
    let (status, ops, detail) = match result {
        Ok(()) => ("pass", Vec::new(), String::new()),
        Err(e) if e.starts_with("compile: the program uses") => ("unsupported", unsupported_targets(e), e.clone()),
        Err(e) if e.starts_with("output ") || e.contains(" outputs, expected ") => ("mismatch", Vec::new(), e.clone()),
        Err(e) => ("other", Vec::new(), e.clone()),
    };
    serde_json::json!({ "dir": dir, "flavour": flavour, "status": status, "ops": ops, "detail": detail })
}

/// The targets an unsupported-constructs error lists, one per ` | ` line
/// (`aten.roll.default (node roll) at …` → `aten.roll.default`).
fn unsupported_targets(error: &str) -> Vec<String> {
    let mut ops: Vec<String> =
        error.split(" | ").skip(1).filter_map(|line| line.trim().split(" (node").next()).map(str::to_string).collect();
    ops.sort();
    ops.dedup();
    ops
}

/// Prints the Core ATen coverage of these runs (see `kiln_tests::coverage`)
/// and, over the whole committed set, checks it: no imported overload goes
/// unexercised without a listed reason, and at least 95 % of the
/// non-gradient overloads pass every run that calls them.
fn report_core_coverage(runs: &[CaseRun], check: bool) {
    let rows = core_coverage(runs);
    let (passing, of) = passing_share(&rows);
    println!("\nCore ATen (torch 2.15): {passing} of {of} non-gradient overloads pass every case run that calls them (or their suite elsewhere)");
    for (overload, status) in &rows {
        match status {
            CoreStatus::Passes { .. } => {}
            CoreStatus::Fails { runs, failed } => {
                println!("  {overload}: {failed} of {runs} runs fail or are known-unsupported")
            }
            CoreStatus::Elsewhere(w) => println!("  {overload}: exercised by {w}"),
            CoreStatus::NotExercised(w) => println!("  {overload}: not exercised: {w}"),
            CoreStatus::Unsupported(w) => println!("  {overload}: {w}"),
            CoreStatus::Gap => println!("  {overload}: imported but no case calls it"),
        }
    }
    if check {
        let gaps: Vec<&str> = rows.iter().filter(|(_, s)| *s == CoreStatus::Gap).map(|(o, _)| *o).collect();
        assert!(gaps.is_empty(), "imported Core ATen overloads no case calls (add cases to generate.py): {gaps:?}");
        assert!(passing * 100 >= of * 95, "only {passing} of {of} non-gradient Core ATen overloads pass (< 95 %)");
    }
}
