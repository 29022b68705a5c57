//! Hostile inputs: truncated, bit-flipped and garbage `.pt2` files must give
//! an error, never a panic; older container generations a clear message.

use kiln_compiler::import::import_pt2;
use std::io::Write;
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel)
}

fn temp_file(tag: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("kiln-robust-{}-{tag}.pt2", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(bytes).unwrap();
    path
}

/// Imports `bytes`; must not panic. Returns whether it succeeded.
fn try_import(tag: &str, bytes: &[u8]) -> bool {
    let path = temp_file(tag, bytes);
    let ok = import_pt2(&path).is_ok();
    let _ = std::fs::remove_file(&path);
    ok
}

#[test]
fn truncated_files_are_errors() {
    let bytes = std::fs::read(fixture("mlp/aten.pt2")).unwrap();
    let step = (bytes.len() / 150).max(1);
    let mut len = 0;
    while len < bytes.len() {
        assert!(!try_import("trunc", &bytes[..len]), "truncated to {len} bytes but imported");
        len += step;
    }
    // The last few bytes hold the end-of-central-directory record.
    for cut in 1..64 {
        assert!(!try_import("trunc-tail", &bytes[..bytes.len() - cut]));
    }
    assert!(try_import("whole", &bytes));
}

#[test]
fn bit_flips_never_panic() {
    let bytes = std::fs::read(fixture("transformer_dynseq/aten.pt2")).unwrap();
    // A cheap deterministic generator: positions spread over the whole file,
    // denser in the JSON and the central directory where parsing happens.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..400 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let pos = if i % 2 == 0 {
            (state as usize) % bytes.len()
        } else {
            bytes.len() - 1 - (state as usize) % 4096.min(bytes.len())
        };
        let mut flipped = bytes.clone();
        flipped[pos] ^= 1 << ((state >> 60) % 8);
        let _ = try_import("flip", &flipped);
    }
}

#[test]
fn garbage_and_foreign_files_are_errors() {
    assert!(!try_import("empty", b""));
    assert!(!try_import("text", b"definitely not a zip file"));
    assert!(!try_import("zeros", &[0u8; 4096]));
    let missing = import_pt2(Path::new("/nonexistent/model.pt2")).unwrap_err().to_string();
    assert!(missing.contains("/nonexistent/model.pt2"), "{missing}");
}
