//! kiln's ahead-of-time compiler: reads programs saved by `torch.export.save`
//! (`.pt2`) into kiln's IR, runs the pass pipeline and writes `.kiln` artifacts.
//!
//! - [`pt2`]: the `.pt2` container and its JSON program, as data (no IR).
//! - [`import`]: turns a parsed program into a [`kiln_ir::Graph`].
//! - [`lower`]: planned IR → the runtime's execution plan.
//! - [`compile`]: the driver tying import, passes, memory planning and lowering;
//!   [`calibrate`]: runs the float program on `--calibration` samples.
//! - [`npy`], [`steps`]: `.npy` files and `kiln run --steps` folders (from `kiln-runner`).
//! - [`stablehlo`]: the PJRT target (partitioner; StableHLO emission with feature `mlir`).

pub mod calibrate;
pub mod compile;
pub mod import;
pub mod lower;
pub mod native;
pub mod pt2;
pub mod stablehlo;

pub use kiln_runner::{npy, steps};

pub use compile::{
    compile_file, compile_file_for, compile_graph, compile_graph_for, compile_graph_with_passes, Backend, CompileError,
    CompileOptions, CompileSummary, ShardConfig,
};
