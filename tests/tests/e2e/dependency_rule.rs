//! Architecture invariant (ARCHITECTURE.md): `isa` (the shared leaf types)
//! depends on none of our crates; `ir` and `kernels` only on `isa`;
//! `passes → ir`; `runtime → kernels` (and `isa`); `compiler → ir, passes,
//! runtime`. The runtime never links MLIR or LLVM, nor `ir`/`passes`.

use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::process::Command;

fn cargo(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("run cargo");
    assert!(out.status.success(), "cargo {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Declared dependencies of the workspace's own crates (no resolution needed).
fn metadata() -> Value {
    serde_json::from_slice(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).expect("cargo metadata JSON")
}

/// Normal (non-dev) dependencies of each of our crates on our crates.
fn our_edges(meta: &Value) -> HashMap<String, BTreeSet<String>> {
    let mut edges = HashMap::new();
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        if !name.starts_with("kiln-") {
            continue;
        }
        let deps = pkg["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| d.starts_with("kiln-"))
            .map(String::from)
            .collect();
        edges.insert(name.to_string(), deps);
    }
    edges
}

#[test]
fn crate_dependencies_follow_the_layering() {
    let edges = our_edges(&metadata());
    let allowed: [(&str, &[&str]); 8] = [
        ("kiln-isa", &[]),
        ("kiln-ir", &["kiln-isa"]),
        ("kiln-kernels", &["kiln-isa"]),
        ("kiln-passes", &["kiln-ir"]),
        ("kiln-runtime", &["kiln-kernels", "kiln-isa"]),
        ("kiln-compiler", &["kiln-ir", "kiln-passes", "kiln-runtime", "kiln-runner"]),
        ("kiln-capi", &["kiln-runtime"]),
        ("kiln-runner", &["kiln-runtime"]),
    ];
    for (krate, ok) in allowed {
        let deps = edges.get(krate).unwrap_or_else(|| panic!("{krate} is not in the workspace"));
        let extra: Vec<_> = deps.iter().filter(|d| !ok.contains(&d.as_str())).collect();
        assert!(extra.is_empty(), "{krate} must not depend on {extra:?} (allowed: {ok:?})");
    }
}

#[test]
fn runtime_never_links_mlir_llvm_or_the_ir() {
    // Everything linked into a user of the runtime (and of `kiln-run`, the
    // runtime-only runner shipped to edge boxes): normal dependencies,
    // transitively, for the host platform, all features on.
    for krate in ["kiln-runtime", "kiln-runner"] {
        let args = ["tree", "-p", krate, "-e", "normal", "--all-features", "--prefix", "none", "--format", "{p}"];
        let tree = String::from_utf8(cargo(&args)).expect("utf-8");
        let linked: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        assert!(linked.contains("kiln-kernels"), "unexpected cargo tree output:\n{tree}");
        let forbidden = ["kiln-ir", "kiln-passes", "kiln-compiler", "melior", "mlir-sys", "inkwell", "llvm-sys"];
        for f in forbidden {
            assert!(!linked.contains(f), "{krate} links {f}; the runtime must stay free of it");
        }
    }
}
