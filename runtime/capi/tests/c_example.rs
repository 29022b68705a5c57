//! `examples/run_model.c`, compiled with the system C compiler against the
//! static and the shared library, runs the `mlp` fixture through the C API:
//! its output matches PyTorch's, and the error paths (wrong input shape, null
//! session, misaligned artifact) give error statuses with messages.

use kiln_runtime::{DType, Tensor};
use kiln_tests::{assert_close, compile_fixture, fixture_dir, read_npy_as, temp_path};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo put this test's build of the library: `target/<profile>/deps`
/// (what `cargo test` builds), else `target/<profile>` (`cargo build`'s
/// copy, which a `cargo test` leaves as it was: it may be stale).
fn library_dir(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory").to_path_buf();
    let profile = deps.parent().expect("profile directory").to_path_buf();
    [deps, profile]
        .into_iter()
        .map(|d| d.join(file))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

fn compile_c(out: &Path, link: &[&str]) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/run_model.c"))
        .args(link)
        .arg("-o")
        .arg(out)
        .status()
        .expect("run the system C compiler `cc`");
    assert!(status.success(), "cc failed for {link:?}");
}

fn run_example(exe: &Path, model: &Path, input: &Tensor) -> (String, Vec<u8>) {
    let input_path = temp_path("capi-input");
    let output_path = temp_path("capi-output");
    std::fs::write(&input_path, &input.data).expect("write input");
    // cargo's LD_LIBRARY_PATH lists `target/<profile>` before the rpath:
    // a library `cargo build` left there (possibly stale) would be loaded.
    let out = Command::new(exe)
        .env_remove("LD_LIBRARY_PATH")
        .arg(model)
        .arg(&input_path)
        .arg(&output_path)
        .args(input.shape.iter().map(|d| d.to_string()))
        .output()
        .expect("run the C example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "C example failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&output_path).expect("read output");
    std::fs::remove_file(&input_path).ok();
    std::fs::remove_file(&output_path).ok();
    (stdout, bytes)
}

#[test]
fn c_example_runs_the_mlp_fixture() {
    let model = temp_path("capi-mlp");
    std::fs::write(&model, compile_fixture("mlp", "aten")).expect("write artifact");
    let dir = fixture_dir("mlp");
    let input = read_npy_as(&dir.join("input_0.npy"), false).expect("input_0.npy");
    let expected = read_npy_as(&dir.join("output_0.npy"), false).expect("output_0.npy");
    assert_eq!(input.dtype, DType::F32);

    let static_exe = temp_path("capi-static").with_extension("exe");
    let static_lib = library_dir("libkiln_capi.a");
    compile_c(&static_exe, &[static_lib.to_str().expect("UTF-8 path"), "-lpthread", "-ldl", "-lm"]);
    let shared_exe = temp_path("capi-shared").with_extension("exe");
    let shared_dir = library_dir("libkiln_capi.so");
    let shared_dir = shared_dir.parent().expect("library directory").to_str().expect("UTF-8 path");
    compile_c(&shared_exe, &["-L", shared_dir, "-lkiln_capi", &format!("-Wl,-rpath,{shared_dir}")]);

    for exe in [&static_exe, &shared_exe] {
        let (stdout, bytes) = run_example(exe, &model, &input);
        let got = Tensor { dtype: DType::F32, shape: expected.shape.clone(), data: bytes };
        assert_close("C API mlp output", &got.view(), &expected.view(), 1.3e-6, 1e-5);
        let shape = expected.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        assert!(
            stdout.contains(&format!("output 0: dtype 0 rank 2 shape [{shape}] bytes {}", got.data.len())),
            "{stdout}"
        );
        // Each error path printed its status and the runtime's message.
        assert!(stdout.contains("wrong shape: status 4 (inputs do not match the program): input 0 (`x`)"), "{stdout}");
        assert!(stdout.contains("null session: status 1 (invalid argument): session is null"), "{stdout}");
        assert!(stdout.contains("misaligned: status 3") && stdout.contains("not 64-byte aligned"), "{stdout}");
        assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
        std::fs::remove_file(exe).ok();
    }
    std::fs::remove_file(&model).ok();
}
