//! Dynamic shapes and strides/views against PyTorch: every case of
//! `tests/conformance/dynamic/manifest.json` (made by
//! `tests/conformance/generate_dynamic.py`), in both IR flavours.
//!
//! Each flavour is compiled once and loaded once; every size the case lists
//! (the export example, the bounds' minimum and maximum) runs through ONE
//! session — the runtime binds the symbols per call and never recompiles —
//! and each output is compared with PyTorch's eager output at
//! `torch.testing.assert_close`'s default tolerances. A dynamic case's
//! `reject/` inputs, with a dimension outside its `torch.export.Dim` bounds,
//! must be refused with the runtime's input error naming the range, after
//! which the same session must still run the first size correctly.
//!
//! The test fails on any mismatch or compile/load/run error except for
//! flavours the manifest marks `unsupported: {flavour: reason}`.
//! `KILN_CONFORMANCE_FILTER=cat_two_syms,pad_dyn` runs only those cases.

use kiln_runtime::{Error, Session, Tensor, TensorView};
use kiln_tests::{try_compile_and_load, try_read_numbered, try_run_and_compare};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance").join("dynamic")
}

/// Runs one size's inputs through `session` and compares with its outputs.
fn run_size(session: &mut Session, dir: &Path) -> Result<(), String> {
    let inputs = try_read_numbered(dir, "input", false)?;
    let expected = try_read_numbered(dir, "output", false)?;
    try_run_and_compare(session, &inputs, &expected)
}

/// Compiles and loads one flavour once, then runs every size (and the
/// rejected one) through a single session. `Err` names the stage and size.
fn run_case(dir: &Path, flavour: &str, sizes: usize, reject: bool) -> Result<(), String> {
    let program = try_compile_and_load(&dir.join(format!("{flavour}.pt2")), "conformance-dynamic")?;
    let mut session = program.session().map_err(|e| format!("session: {e}"))?;
    for k in 0..sizes {
        run_size(&mut session, &dir.join(format!("size_{k}"))).map_err(|e| format!("size_{k}: {e}"))?;
    }
    if reject {
        let inputs = try_read_numbered(&dir.join("reject"), "input", false)?;
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        match session.run(&views) {
            Ok(_) => return Err("reject: an out-of-bounds size was accepted".into()),
            Err(Error::Input { detail, .. }) if detail.contains("outside the range") => {}
            Err(e) => return Err(format!("reject: refused, but not with the bounds error: {e}")),
        }
        // The refusal leaves the session usable.
        run_size(&mut session, &dir.join("size_0")).map_err(|e| format!("size_0 after the rejection: {e}"))?;
    }
    Ok(())
}

#[test]
fn dynamic_shapes_and_views_match_pytorch() {
    let root = cases_dir();
    let text = std::fs::read_to_string(root.join("manifest.json"))
        .expect("manifest.json (run tests/conformance/generate_dynamic.py)");
    let manifest: Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let filter: Option<Vec<String>> =
        std::env::var("KILN_CONFORMANCE_FILTER").ok().map(|f| f.split(',').map(str::to_string).collect());
    let cases = manifest["cases"].as_array().expect("cases");
    assert!(!cases.is_empty(), "the manifest lists no cases");
    let (mut passed, mut known, mut sizes_run) = (0, 0, 0);
    let mut failures = Vec::new();
    let mut unexpectedly_passing = Vec::new();
    println!("{:<8} {:<28} {:<9} {:>5}  result", "section", "case", "flavour", "sizes");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        if filter.as_ref().is_some_and(|f| !f.iter().any(|n| n == name)) {
            continue;
        }
        let section = case["section"].as_str().unwrap_or("?");
        let sizes = case["sizes"].as_array().map_or(0, Vec::len);
        let reject = case.get("reject").is_some();
        let dir = root.join(name);
        for flavour in case["flavours"].as_array().expect("flavours") {
            let flavour = flavour.as_str().expect("flavour");
            let unsupported = case.get("unsupported").and_then(|u| u.get(flavour)).and_then(Value::as_str);
            let result = std::panic::catch_unwind(|| run_case(&dir, flavour, sizes, reject))
                .unwrap_or_else(|_| Err("panicked".to_string()));
            let what = format!("{name}/{flavour}");
            let status = match (&result, unsupported) {
                (Ok(()), None) => {
                    passed += 1;
                    sizes_run += sizes;
                    "ok".to_string()
                }
                (Ok(()), Some(_)) => {
                    unexpectedly_passing.push(what);
                    "ok (marked unsupported)".to_string()
                }
                (Err(_), Some(why)) => {
                    known += 1;
                    format!("known: {why}")
                }
                (Err(e), None) => {
                    failures.push(format!("{what}: {e}"));
                    format!("FAIL: {e}")
                }
            };
            println!("{section:<8} {name:<28} {flavour:<9} {sizes:>5}  {status}");
        }
    }
    println!("total: {passed} passed ({sizes_run} sizes), {known} known-unsupported, {} failed", failures.len());
    for w in &unexpectedly_passing {
        println!("note: {w} is marked unsupported but passes; unmark it in generate_dynamic.py");
    }
    assert!(failures.is_empty(), "{} dynamic/views conformance failures:\n{}", failures.len(), failures.join("\n"));
}
