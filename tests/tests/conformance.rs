//! Per-op conformance with PyTorch: every committed case of
//! `tests/conformance/cases/manifest.json` (made by
//! `tests/conformance/generate.py` from PyTorch's OpInfo sample inputs), in
//! each IR flavour it has, is compiled, loaded and run, and every output is
//! compared with PyTorch's eager output at `torch.testing.assert_close`'s
//! default tolerances for its dtype (exact for integers and bools, NaN
//! positions must match).
//!
//! The test fails on any mismatch or compile/load/run error, except for case
//! flavours the manifest marks `unsupported: {flavour: reason}`. It prints a per-op
//! summary. `KILN_CONFORMANCE_FILTER=cumsum,topk` runs only those ops (for
//! local iteration); `KILN_CONFORMANCE_DIR=/tmp/kiln-conf` runs the cases of
//! another folder (the generator's `--full` set).

use kiln_tests::{try_compile_and_load, try_read_numbered, try_run_and_compare};
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
fn run_case(dir: &Path, flavour: &str, bf16: bool) -> Result<(), String> {
    let inputs = try_read_numbered(dir, "input", bf16)?;
    let expected = try_read_numbered(dir, "output", bf16)?;
    let program = try_compile_and_load(&dir.join(format!("{flavour}.pt2")), "conformance")?;
    let mut session = program.session().map_err(|e| format!("session: {e}"))?;
    try_run_and_compare(&mut session, &inputs, &expected)
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
    let root = cases_dir();
    let text = std::fs::read_to_string(root.join("manifest.json")).expect("manifest.json (run tests/conformance/generate.py)");
    let manifest: Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let filter: Option<Vec<String>> =
        std::env::var("KILN_CONFORMANCE_FILTER").ok().map(|f| f.split(',').map(str::to_string).collect());
    let mut tally: BTreeMap<String, OpTally> = BTreeMap::new();
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
            let result = std::panic::catch_unwind(|| run_case(&dir, flavour, dtype == "bf16"))
                .unwrap_or_else(|_| Err("panicked".to_string()));
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
    let failures: Vec<&String> = tally.values().flat_map(|t| &t.failures).collect();
    assert!(failures.is_empty(), "{} conformance failures:\n{}", failures.len(), failures.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
}
