//! `.pt2` files saved by torch 2.5, 2.6 and 2.8, whose weights are pickled
//! `torch.save` zips nested in the archive (`tests/fixtures/old_torch/`, made
//! by `generate_old_torch.py`): each compiles and matches torch's eager
//! output, and corrupted pickles give clear errors, never panics.

use kiln_compiler::pt2::archive::{Archive, Layout};
use kiln_compiler::pt2::Pt2File;
use kiln_tests::mutate::{compile_bytes, write_stored_zip, Rng};
use kiln_tests::{fixture_dir, read_numbered, try_compile_and_load, try_run_and_compare};
use std::path::PathBuf;

const VERSIONS: [(&str, Layout); 3] =
    [("2.5", Layout::Legacy), ("2.6", Layout::Legacy), ("2.8", Layout::PickledArchive)];
const FLAVOURS: [&str; 2] = ["training", "aten"];

fn fixture(version: &str, flavour: &str) -> PathBuf {
    fixture_dir(&format!("old_torch/torch-{version}")).join(format!("{flavour}.pt2"))
}

#[test]
fn every_version_matches_eager_outputs() {
    let mut failures = Vec::new();
    for (version, _) in VERSIONS {
        let dir = fixture_dir(&format!("old_torch/torch-{version}"));
        let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
        assert!(!inputs.is_empty() && !expected.is_empty(), "{}: no inputs/outputs", dir.display());
        for flavour in FLAVOURS {
            let run = try_compile_and_load(&fixture(version, flavour), &format!("old-{version}-{flavour}")).and_then(
                |program| {
                    let mut session = program.session().map_err(|e| format!("session: {e}"))?;
                    try_run_and_compare(&mut session, &inputs, &expected)
                },
            );
            if let Err(e) = run {
                failures.push(format!("torch {version} {flavour}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn layouts_and_views_are_recognised() {
    for (version, layout) in VERSIONS {
        let file = Pt2File::open(&fixture(version, "training")).unwrap_or_else(|e| panic!("torch {version}: {e}"));
        assert_eq!(file.archive.layout(), layout, "torch {version}");
        // The tied weight shares head.weight's storage; `row` is an offset
        // view into `table`'s; `mix` is transposed; `shift` is a constant.
        let w = &file.weights;
        assert_eq!(w["tied.weight"].path_name, w["head.weight"].path_name, "torch {version}");
        assert_eq!(w["row"].path_name, w["table"].path_name, "torch {version}");
        assert_eq!(w["row"].meta.storage_offset, kiln_compiler::pt2::program::SymExpr::Int(6));
        assert!(file.constants.contains_key("shift"), "torch {version}: constants {:?}", file.constants.keys());
        let schema = file.program.schema_version.0;
        assert_eq!(schema, if version == "2.5" { 7 } else { 8 }, "torch {version}");
        let bounds: Vec<_> = file.program.range_constraints.iter().map(|(_, min, max)| (*min, *max)).collect();
        assert_eq!(bounds, [(1, Some(8))], "torch {version}");
    }
}

/// The member holding the pickled state dict, for each layout.
fn state_dict_member(layout: Layout) -> &'static str {
    match layout {
        Layout::Legacy => "serialized_state_dict.pt",
        _ => "data/weights/model.pt",
    }
}

/// The fixture's bytes with its state dict pickle replaced by `edit(pickle)`
/// (both zips rebuilt the way torch writes them).
fn with_pickle(version: &str, layout: Layout, edit: impl Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let archive = Archive::open(&fixture(version, "training")).unwrap();
    let target = state_dict_member(layout);
    let outer: Vec<(String, Vec<u8>)> = archive
        .members()
        .map(|(name, bytes)| {
            let bytes = if name == target { rebuild_nested(&archive, name, &edit) } else { bytes.to_vec() };
            (archive.full_name(name), bytes)
        })
        .collect();
    write_stored_zip(&outer)
}

fn rebuild_nested(archive: &Archive, member: &str, edit: &impl Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let inner: Vec<(String, Vec<u8>)> = archive
        .nested_members(member)
        .unwrap()
        .into_iter()
        .map(|(name, range)| {
            let bytes = &archive.map()[range];
            let bytes = if name.ends_with("data.pkl") { edit(bytes) } else { bytes.to_vec() };
            (name, bytes)
        })
        .collect();
    write_stored_zip(&inner)
}

fn replace(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = haystack.windows(from.len()).position(|w| w == from).expect("pattern in the fixture pickle");
    [&haystack[..at], to, &haystack[at + from.len()..]].concat()
}

/// Compiles `bytes`, turning a panic into a test failure with `what`.
fn compile_error(what: &str, bytes: &[u8]) -> String {
    match std::panic::catch_unwind(|| compile_bytes(bytes)) {
        Ok(Ok(())) => panic!("{what}: compiled"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{what}: panicked"),
    }
}

#[test]
fn corrupt_pickles_are_clear_errors() {
    for (version, layout) in VERSIONS {
        let unchanged = with_pickle(version, layout, <[u8]>::to_vec);
        compile_bytes(&unchanged).unwrap_or_else(|e| panic!("torch {version}: rebuilt fixture: {e}"));

        let len = with_pickle(version, layout, |p| p.to_vec()).len();
        assert!(len > 0);
        for cut in [0, 1, 2, 40, 100, 500, 900] {
            let bytes = with_pickle(version, layout, |p| p[..cut.min(p.len() - 1)].to_vec());
            let e = compile_error(&format!("torch {version}: pickle cut at {cut}"), &bytes);
            assert!(e.contains("data.pkl") && e.contains("pickle at byte"), "torch {version} cut {cut}: {e}");
        }

        let bytes =
            with_pickle(version, layout, |p| replace(p, b"torch._utils\n_rebuild_tensor_v2\n", b"os\nsystem\n"));
        let e = compile_error(&format!("torch {version}: unknown global"), &bytes);
        assert!(e.contains("`os.system`"), "torch {version}: {e}");

        // conv.weight's sizes (4, 2, 3, 3): the first made 2³¹ - 1.
        let bytes = with_pickle(version, layout, |p| {
            replace(p, b"(K\x04K\x02K\x03K\x03t", b"(J\xff\xff\xff\x7fK\x02K\x03K\x03t")
        });
        let e = compile_error(&format!("torch {version}: huge size"), &bytes);
        assert!(e.contains("conv.weight") && e.contains("bytes"), "torch {version}: {e}");

        // A size of 2⁶² (LONG1): the view's extent overflows.
        let huge = [b"(\x8a\x08".as_slice(), &(1u64 << 62).to_le_bytes(), b"K\x02K\x03K\x03t"].concat();
        let bytes = with_pickle(version, layout, |p| replace(p, b"(K\x04K\x02K\x03K\x03t", &huge));
        let e = compile_error(&format!("torch {version}: overflowing size"), &bytes);
        assert!(e.contains("conv.weight"), "torch {version}: {e}");

        // The storage said to hold 2³¹ - 1 floats while its member holds 72.
        let bytes = with_pickle(version, layout, |p| replace(p, b"K\x48t", b"J\xff\xff\xff\x7ft"));
        let e = compile_error(&format!("torch {version}: storage length"), &bytes);
        assert!(e.contains("holds 288 bytes"), "torch {version}: {e}");
    }
}

#[test]
fn random_pickle_damage_never_panics() {
    for (version, layout) in VERSIONS {
        for seed in 0..64u64 {
            let bytes = with_pickle(version, layout, |p| {
                let mut rng = Rng::new(seed);
                let mut p = p.to_vec();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(p.len());
                    p[at] ^= 1 << rng.below(8);
                }
                p
            });
            if std::panic::catch_unwind(|| compile_bytes(&bytes)).is_err() {
                panic!("torch {version}: seed {seed} panicked");
            }
        }
    }
}
