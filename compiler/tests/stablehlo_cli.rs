//! `kiln compile --target pjrt` from the command line: a clear error without
//! the `mlir` feature, a mixed-plan artifact with it.

use std::process::Command;

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn target_pjrt() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/mlp/training.pt2");
    let dir = std::env::temp_dir().join(format!("kiln-stablehlo-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let artifact = dir.join("mlp.kiln");
    let artifact = artifact.to_str().expect("utf-8 temp path");
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--target", "pjrt", "--precision", "bf16"]);
    if cfg!(feature = "mlir") {
        assert!(ok, "{text}");
        assert!(text.contains("target pjrt, bf16"), "{text}");
        let (ok, text) = kiln(&["inspect", artifact]);
        assert!(ok && text.contains("accel"), "{text}");
    } else {
        assert!(!ok);
        assert!(text.contains("built without MLIR support; rebuild with --features mlir"), "{text}");
    }
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--precision", "bf16"]);
    assert!(!ok && text.contains("--precision applies to --target pjrt only"), "{text}");
    let (ok, text) = kiln(&["compile", model, "-o", artifact, "--target", "pjrt", "--precision", "fp8"]);
    assert!(!ok && text.contains("unknown precision"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
