//! Build-time cfgs the kernel sources test instead of repeating conditions:
//! - `kiln_x86_64` / `kiln_neon`: the ISA plug-ins this build compiles
//!   (AVX2/AVX-512 variants, NEON variants). Both need the `isa` feature;
//!   without it the crate is the portable kernels alone (the size probe's
//!   build), whatever the target.
//! - `kiln_avx512`: the AVX-512 kernels, when the compiler has stable AVX-512
//!   intrinsics and target features (Rust 1.89); older compilers (the
//!   workspace's MSRV is lower) build everything else.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kiln_avx512)");
    println!("cargo::rustc-check-cfg=cfg(kiln_x86_64)");
    println!("cargo::rustc-check-cfg=cfg(kiln_neon)");
    println!("cargo:rerun-if-env-changed=RUSTC");

    let isa = std::env::var_os("CARGO_FEATURE_ISA").is_some();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if isa && arch == "x86_64" {
        println!("cargo:rustc-cfg=kiln_x86_64");
    }
    // NEON is baseline on aarch64 Linux/macOS targets; softfloat targets lack it.
    if isa && arch == "aarch64" && features.split(',').any(|f| f == "neon") {
        println!("cargo:rustc-cfg=kiln_neon");
    }

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
