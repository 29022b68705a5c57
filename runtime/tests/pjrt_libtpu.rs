//! Selecting `tpu` with the real `libtpu.so` on a machine without a TPU:
//! the plugin loads and client creation fails fast with a clear error.
//! `KILN_TEST_LIBTPU` names `libtpu.so` (fetched by `.ci/fetch-pjrt-plugins.sh`);
//! without it the test skips, except under CI (`CI` set), where it fails.
#![cfg(feature = "pjrt")]

use kiln_runtime::format::*;
use kiln_runtime::{Device, Error, ExecutableCache, Program, SessionOptions};
use std::time::{Duration, Instant};

#[test]
fn tpu_without_a_tpu_fails_fast_and_clearly() {
    let libtpu = match std::env::var_os("KILN_TEST_LIBTPU").filter(|v| !v.is_empty()) {
        Some(p) => p,
        None if plugins_required() => panic!("KILN_TEST_LIBTPU is not set in CI"),
        None => {
            eprintln!("skipping: set KILN_TEST_LIBTPU=/path/to/libtpu.so to run this test");
            return;
        }
    };
    // kiln sets it itself before loading libtpu; set here too so the test can
    // never make metadata-server traffic even if that code regressed.
    std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
    // Discovery goes through KILN_PJRT_PLUGIN for `tpu`.
    std::env::set_var("KILN_PJRT_PLUGIN", &libtpu);

    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![],
        inputs: vec![],
        outputs: vec![],
        instrs: vec![],
        arena_bytes: 0,
        peak_live_bytes: 0,
        states: vec![],
    };
    let program = Program::from_bytes(
        &ArtifactWriter::new(&plan, WeightsBuilder::new(), &Metadata::default()).unwrap().to_bytes(),
    )
    .unwrap();
    let started = Instant::now();
    let result = program.session_with(&SessionOptions {
        device: Device::Tpu,
        cache: ExecutableCache::Off,
        ..SessionOptions::default()
    });
    let elapsed = started.elapsed();
    match result {
        Err(Error::Device(m)) => assert!(m.contains("no TPU device"), "{m}"),
        Err(other) => panic!("expected a clear no-TPU error, got: {other}"),
        Ok(_) => panic!("a TPU session started on a machine without a TPU"),
    }
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_eq!(std::env::var("TPU_SKIP_MDS_QUERY").as_deref(), Ok("1"));
}

/// CI must provide the plugins, but they exist only for x86-64 Linux: the
/// aarch64 step (`.ci/aarch64.sh`, under qemu) has none and skips.
fn plugins_required() -> bool {
    std::env::var_os("CI").is_some() && cfg!(target_arch = "x86_64")
}
