//! The artifact format is a protocol: `tests/golden/v<major>.<minor>/` holds
//! artifacts written by kiln at that format version, committed when the
//! version was current. The runtime must run every artifact of the version it
//! reads, with PyTorch's numbers, and decode-then-encode its plan to the very
//! same bytes (so a change of encoding — a reordered field, a renumbered code
//! — cannot slip in without a version bump); it must refuse every older one
//! with the documented "recompile" message.
//!
//! `KILN_BLESS_GOLDEN=1 cargo test -p kiln-tests --test e2e golden_artifacts::`
//! writes the current version's artifacts (only when the format version
//! changed: the old directory stays as it is).

use kiln_runtime::format::{parse_container, Plan, FORMAT_MAJOR, FORMAT_MINOR};
use kiln_runtime::{Error, Program};
use kiln_tests::{compile_fixture, default_tolerance, fixture_dir, read_numbered, run_session};
use std::path::{Path, PathBuf};

/// (artifact name, fixture, input/output prefix) covering the instruction
/// kinds a CPU plan has: calls (conv, pooling, linear, ...), loops (jumps)
/// and data-dependent sizes (bind_dim); state (buffers kept between runs);
/// and (from 0.11) complex inputs and outputs.
const GOLDEN: [(&str, &str, &str); 6] = [
    ("complex_io", "complex_io", "case0_"),
    ("mlp", "mlp", ""),
    ("cnn", "cnn", ""),
    ("while_loop", "while_loop", "case0_"),
    ("nonzero", "nonzero", "case0_"),
    ("counter", "state/counter", "step_0/"),
];

fn golden_dir(major: u16, minor: u16) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden").join(format!("v{major}.{minor}"))
}

fn current_dir() -> PathBuf {
    golden_dir(FORMAT_MAJOR, FORMAT_MINOR)
}

#[test]
fn current_version_golden_artifacts_run_and_reencode_identically() {
    let dir = current_dir();
    if std::env::var_os("KILN_BLESS_GOLDEN").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, fixture, _) in GOLDEN {
            std::fs::write(dir.join(format!("{name}.kiln")), compile_fixture(fixture, "aten")).unwrap();
        }
    }
    for (name, fixture, prefix) in GOLDEN {
        let path = dir.join(format!("{name}.kiln"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (a format version bump needs its golden artifacts: see this file's doc)", path.display())
        });
        // The plan section decodes and re-encodes to the same bytes.
        let container = parse_container(&bytes).unwrap();
        let plan_bytes = &bytes[container.plan.clone()];
        let plan: Plan = postcard::from_bytes(plan_bytes).unwrap();
        assert_eq!(postcard::to_allocvec(&plan).unwrap(), plan_bytes, "{name}: plan encoding changed");
        // And it runs with PyTorch's numbers.
        let program = Program::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(program.format_version(), (FORMAT_MAJOR, FORMAT_MINOR));
        let fixture = fixture_dir(fixture);
        let inputs = read_numbered(&fixture, &format!("{prefix}input"));
        let want = read_numbered(&fixture, &format!("{prefix}output"));
        let got = run_session(&mut program.session().unwrap(), &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), want.len(), "{name}: output count");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (rtol, atol) = default_tolerance(w.dtype);
            kiln_tests::assert_close(&format!("{name} output {i}"), &g.view(), &w.view(), rtol, atol);
        }
    }
}

#[test]
fn the_golden_set_has_the_kinds_it_claims() {
    let kinds = |name: &str| -> Vec<&'static str> {
        let program = Program::load(current_dir().join(format!("{name}.kiln"))).unwrap();
        let mut names: Vec<&'static str> = program.plan().instrs.iter().map(|i| i.op.opcode().name()).collect();
        names.sort();
        names.dedup();
        names
    };
    assert!(kinds("while_loop").contains(&"jump") && kinds("while_loop").contains(&"jump_if_false"));
    assert!(kinds("nonzero").contains(&"bind_dim"));
    // Since 0.5 the CNN's convolutions carry their ReLU as a fused epilogue.
    assert!(kinds("cnn").contains(&"conv_fused"));
    let counter = Program::load(current_dir().join("counter.kiln")).unwrap();
    assert_eq!(counter.states().len(), 2);
    let complex = Program::load(current_dir().join("complex_io.kiln")).unwrap();
    assert!(complex.plan().inputs.iter().any(|io| io.complex) && complex.plan().outputs.iter().any(|io| io.complex));
}

#[test]
fn older_versions_are_refused_with_the_recompile_message() {
    let mut seen = 0;
    for minor in 0..FORMAT_MINOR {
        let dir = golden_dir(FORMAT_MAJOR, minor);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "kiln") {
                continue;
            }
            seen += 1;
            match Program::load(&path) {
                Err(e @ Error::Version { found, .. }) => {
                    assert_eq!(found, (FORMAT_MAJOR, minor), "{}", path.display());
                    assert!(e.to_string().contains("recompile the model"), "{}: {e}", path.display());
                }
                Err(e) => panic!("{}: refused for the wrong reason: {e}", path.display()),
                Ok(_) => panic!("{}: a {FORMAT_MAJOR}.{minor} artifact was accepted", path.display()),
            }
        }
    }
    assert!(seen > 0, "no golden artifact of an older format version under tests/golden");
}
