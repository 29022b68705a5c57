//! The compiler's integration tests, one test binary: each module was its own
//! binary, and every one linked the compiler with LLVM and MLIR statically
//! (~300 MB each), which filled CI's disk. One file per topic, as before;
//! `cargo test -p kiln-compiler --test compiler MODULE::` runs one of them.

mod cli;
mod delta_cli;
mod http_service;
mod import_fixtures;
mod import_robustness;
mod native_codegen;
mod ops_table;
mod robot_loop;
mod stablehlo_buckets;
mod stablehlo_cli;
mod stablehlo_conformance;
mod stablehlo_fixtures;
mod stablehlo_manual;
mod stablehlo_moe;
mod stablehlo_ops;
mod stablehlo_pipeline;
mod stablehlo_quant;
mod stablehlo_ring;
mod stablehlo_sharding;
mod stablehlo_state;
#[cfg(feature = "mlir")]
mod stablehlo_support;
mod tiny_llama_example;
