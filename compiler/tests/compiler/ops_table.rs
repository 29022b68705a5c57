//! `compiler/OPS.md` is the rendered support table; it must match the code
//! (`BLESS=1` rewrites it). The table must also name exactly the ops the
//! importer's dispatch handles.

use kiln_compiler::import::support::{render_markdown, supported_ops};
use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn ops_md_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("OPS.md");
    let want = render_markdown();
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &want).expect("write OPS.md");
        return;
    }
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        got == want,
        "compiler/OPS.md is stale: run `BLESS=1 cargo test -p kiln-compiler --test compiler ops_table::`"
    );
}

/// The op names the importer's dispatch functions convert.
fn dispatched_names() -> BTreeSet<String> {
    let mut names = match_arm_names("src/import/ops/mod.rs");
    names.extend(match_arm_names("src/import/ops/export_ir.rs"));
    names.extend(composite_names());
    names
}

/// The quoted op names of the `match name {` arms of `file`'s `dispatch`.
fn match_arm_names(file: &str) -> BTreeSet<String> {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect("read the dispatch");
    let body = src.split("fn dispatch(").nth(1).expect("dispatch");
    let body = body.split("\n}\n").next().unwrap_or(body);
    let mut names = BTreeSet::new();
    for line in body.lines() {
        let trimmed = line.trim_start();
        if !(trimmed.starts_with('"') || trimmed.starts_with('|')) {
            continue;
        }
        let arm = line.split("=>").next().unwrap_or("");
        let guard_overload = arm.split(" if overload == ").nth(1).and_then(|g| g.split('"').nth(1)).map(str::to_string);
        let pattern = arm.split(" if ").next().unwrap_or("");
        for (i, part) in pattern.split('"').enumerate() {
            if i % 2 == 1 {
                names.insert(match &guard_overload {
                    Some(ov) => format!("{part}.{ov}"),
                    None => part.to_string(),
                });
            }
        }
    }
    names
}

/// The op names of `composite.rs`'s dispatch arms, `("a" | "b", _)` or
/// `("a", "overload")`: what training IR keeps and Core ATen decomposes.
fn composite_names() -> BTreeSet<String> {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/import/ops/composite.rs"))
        .expect("read ops/composite.rs");
    let body = src.split("fn dispatch(").nth(1).expect("dispatch");
    let body = body.split("\n}\n").next().unwrap_or(body);
    let mut names = BTreeSet::new();
    for line in body.lines() {
        let Some(arm) = line.trim_start().strip_prefix("(\"") else { continue };
        let pattern = arm.split(") =>").next().unwrap_or("");
        let (ops, overload) = pattern.rsplit_once(", ").unwrap_or((pattern, "_"));
        let overload = overload.trim_matches('"');
        for (i, part) in format!("\"{ops}").split('"').enumerate() {
            if i % 2 == 1 {
                names.insert(if overload == "_" { part.to_string() } else { format!("{part}.{overload}") });
            }
        }
    }
    names
}

#[test]
fn table_matches_dispatch() {
    // Assertions and metadata checks have no runtime effect; they are not "ops".
    let ignored = [
        "_assert_scalar",
        "_assert_async",
        "_assert_tensor_metadata",
        "sym_constrain_range",
        "sym_constrain_range_for_size",
        "_functional_assert_async",
        "_functional_sym_constrain_range",
        "_functional_sym_constrain_range_for_size",
        "_assert_tensor_metadata_functional",
    ];
    let dispatched: BTreeSet<String> =
        dispatched_names().into_iter().filter(|n| !ignored.contains(&n.as_str())).collect();
    let table: BTreeSet<String> = supported_ops().iter().flat_map(|r| r.names.iter().map(|n| n.to_string())).collect();
    // An overload-specific arm is covered by a plain row of the same name.
    let covered =
        |n: &String, set: &BTreeSet<String>| set.contains(n) || n.split_once('.').is_some_and(|(b, _)| set.contains(b));
    let missing: Vec<&String> = dispatched.iter().filter(|n| !covered(n, &table)).collect();
    let extra: Vec<&String> = table.iter().filter(|n| !covered(n, &dispatched)).collect();
    assert!(missing.is_empty(), "dispatched but not in the support table: {missing:?}");
    assert!(extra.is_empty(), "in the support table but not dispatched: {extra:?}");
}
