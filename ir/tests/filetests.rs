//! Runs `tests/filetests/*.kir` with an identity transformation (`; test
//! identity`) and a failing one (`; test fail`): this exercises the runner and
//! the text form's canonical printing.

use kiln_ir::filetest::{run_dir, run_dir_with, FileTest};
use kiln_ir::Graph;
use std::path::{Path, PathBuf};

fn run(t: &FileTest, _g: &mut Graph) -> Result<(), String> {
    match t.test.as_str() {
        "identity" => Ok(()),
        "fail" => Err(t.option("reason").unwrap_or("failed").to_string()),
        other => Err(format!("unknown test `{other}`")),
    }
}

#[test]
fn filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    match run_dir(&dir, &run) {
        Ok(n) => assert!(n >= 3, "only {n} filetests found"),
        Err(e) => panic!("{e}"),
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ir-filetest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn failures_show_a_diff_and_bless_rewrites() {
    let dir = scratch_dir("bless");
    let file = dir.join("neg.kir");
    let input = "; test identity\ngraph {\n  input %0: f32[2]\n  %1: f32[2] = neg(%0)\n  output %1 \"y\"\n}\n";
    let stale = "; expect:\n; graph {\n;   input %0: f32[2]\n;   %1: f32[2] = abs(%0)\n;   output %1 \"y\"\n; }\n";
    std::fs::write(&file, format!("{input}{stale}")).unwrap();

    let err = run_dir_with(&dir, false, &run).unwrap_err();
    assert!(err.contains("1 of 1 filetests failed"), "{err}");
    assert!(err.contains("-  %1: f32[2] = abs(%0)\n+  %1: f32[2] = neg(%0)\n"), "{err}");

    assert_eq!(run_dir_with(&dir, true, &run), Ok(1));
    let blessed = std::fs::read_to_string(&file).unwrap();
    let fresh = "; expect:\n; graph {\n;   input %0: f32[2]\n;   %1: f32[2] = neg(%0)\n;   output %1 \"y\"\n; }\n";
    assert_eq!(blessed, format!("{input}{fresh}"));
    assert_eq!(run_dir_with(&dir, false, &run), Ok(1));

    // A file without any expectation gets one; an error becomes `expect-error`.
    std::fs::write(&file, input).unwrap();
    std::fs::write(dir.join("bad.kir"), "; test fail\ngraph {\n}\n").unwrap();
    assert!(run_dir_with(&dir, false, &run).unwrap_err().contains("2 of 2 filetests failed"));
    assert_eq!(run_dir_with(&dir, true, &run), Ok(2));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{input}{fresh}"));
    assert_eq!(
        std::fs::read_to_string(dir.join("bad.kir")).unwrap(),
        "; test fail\ngraph {\n}\n; expect-error: failed\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
