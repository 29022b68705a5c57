//! `kiln diff` / `kiln patch` on ResNet-18 whose last layer (`fc`) was
//! fine-tuned: the delta is under 5 % of the artifact, the patched file is
//! byte-identical to the new one, and a delta for another base or a corrupt
//! delta is refused with a clear message and leaves no output file.

use kiln_compiler::import::import_pt2;
use kiln_compiler::{compile_graph, CompileOptions};
use kiln_ir::ConstBytes;
use kiln_runtime::format::Metadata;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln")
}

fn tmp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-delta-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// ResNet-18's artifact, with every `fc.*` weight scaled by `fc_scale`.
fn resnet18(fc_scale: f32) -> Vec<u8> {
    let pt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/resnet18/aten.pt2");
    let mut graph = import_pt2(&pt2).expect("import resnet18").graph;
    let mut changed = 0;
    for (_, c) in graph.consts.iter_mut() {
        let origin = graph.values[c.value].attrs.origin.as_deref().unwrap_or("");
        if fc_scale != 1.0 && origin.starts_with("fc.") {
            let scaled = c
                .bytes
                .as_bytes()
                .chunks_exact(4)
                .flat_map(|w| (f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * fc_scale).to_le_bytes())
                .collect();
            c.bytes = ConstBytes::owned(scaled);
            changed += 1;
        }
    }
    assert!(fc_scale == 1.0 || changed == 2, "expected fc.weight and fc.bias, changed {changed}");
    let (writer, _) = compile_graph(graph, &CompileOptions::default(), Metadata::default()).expect("compile");
    writer.to_bytes()
}

#[test]
fn fine_tuned_last_layer_gives_a_small_exact_delta() {
    let dir = tmp_dir();
    let (old, new, other) = (dir.join("old.kiln"), dir.join("new.kiln"), dir.join("other.kiln"));
    let (old_bytes, new_bytes) = (resnet18(1.0), resnet18(1.5));
    assert_ne!(old_bytes, new_bytes);
    std::fs::write(&old, &old_bytes).expect("write");
    std::fs::write(&new, &new_bytes).expect("write");
    std::fs::write(&other, resnet18(0.5)).expect("write");

    let delta = dir.join("update.kdelta");
    let o = kiln(&[Path::new("diff"), &old, &new, Path::new("-o"), &delta]);
    assert!(o.status.success(), "diff: {}", String::from_utf8_lossy(&o.stderr));
    eprintln!("{}", String::from_utf8_lossy(&o.stdout)); // the figure in benches/RESULTS.md
    let delta_len = std::fs::metadata(&delta).expect("delta written").len() as usize;
    assert!(delta_len * 20 < new_bytes.len(), "delta is {delta_len} bytes of {}", new_bytes.len());

    let rebuilt = dir.join("new2.kiln");
    let o = kiln(&[Path::new("patch"), &old, &delta, Path::new("-o"), &rebuilt]);
    assert!(o.status.success(), "patch: {}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&rebuilt).expect("patched file") == new_bytes, "patched artifact is not byte-identical");

    // A delta applied to another base: refused, nothing written.
    let refused = dir.join("refused.kiln");
    let o = kiln(&[Path::new("patch"), &other, &delta, Path::new("-o"), &refused]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("made for another base"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!refused.exists());

    // A corrupt delta: refused, nothing written.
    let mut corrupt = std::fs::read(&delta).expect("read delta");
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0x40;
    let corrupt_path = dir.join("corrupt.kdelta");
    std::fs::write(&corrupt_path, &corrupt).expect("write");
    let o = kiln(&[Path::new("patch"), &old, &corrupt_path, Path::new("-o"), &refused]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("corrupt"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!refused.exists());
    // No temporary file left beside the output either.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(&dir).ok();
}
