//! Enables the AVX-512 kernels (`cfg(kiln_avx512)`) when the compiler has
//! stable AVX-512 intrinsics and target features (Rust 1.89); older
//! compilers (the workspace's MSRV is lower) build everything else.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kiln_avx512)");
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc).arg("--version").output().ok().and_then(|o| String::from_utf8(o.stdout).ok());
    // "rustc 1.95.0 (…)": the minor version of a 1.x compiler.
    let minor = version
        .as_deref()
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.strip_prefix("1."))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=kiln_avx512");
    }
}
