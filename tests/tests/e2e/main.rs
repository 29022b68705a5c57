//! kiln-tests' integration tests, one test binary: each module was its own
//! binary, and every one linked the compiler with LLVM and MLIR statically
//! (~300 MB each), which filled CI's disk. `no_alloc` and `import_mutations`
//! stay their own binaries: they install a counting global allocator.
//! `cargo test -p kiln-tests --test e2e MODULE::` runs one module.

mod aarch64_e2e;
mod artifact_corruption;
mod assert_async;
mod before_after;
mod complex_io;
mod conformance;
mod conformance_dynamic;
mod control_flow_random_custom;
mod data_dependent;
mod dependency_rule;
mod epilogue_before_after;
mod fixtures;
mod fusion_before_after;
mod golden_artifacts;
mod layout_before_after;
mod linalg_checks;
mod moe_ops;
mod native_common;
mod native_divide;
mod native_fixtures;
mod native_half;
mod native_masks;
mod native_math;
mod native_rows;
mod native_trig;
mod old_torch;
mod passes_preserve_semantics;
mod pow_scalars;
mod quant_import;
mod quantize;
mod quantize_conv;
mod real_models;
mod runtime_inputs;
mod shared_input_before_after;
mod state;
mod thread_determinism;
mod while_loop;
