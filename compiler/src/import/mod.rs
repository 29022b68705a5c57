//! `.pt2` → kiln IR.
//!
//! [`import_pt2`] opens the file ([`crate::pt2`]), binds the signature's inputs
//! (user inputs become graph inputs; parameters, buffers and lifted constants
//! become constants pointing into the memory-mapped file), converts every node
//! in order, and binds the user outputs.
//!
//! - Both IR flavours are accepted: training IR (composites such as `linear`,
//!   `layer_norm`, `scaled_dot_product_attention`, in-place ops) and Core ATen.
//! - In-place ops (`add_`, `relu_`) are functionalised: the result gets a new
//!   value, and the mutated name is rebound to it. A write through a view
//!   (`y[:, 0] = 0`, `y.t()[2].mul_(2)`) is scattered back into its base, and
//!   the base's other views read later are re-derived (`views.rs`).
//! - Output types come from the program's `tensor_values` (symbolic where
//!   torch's are), checked against kiln's own inference: a declared type of
//!   another dtype or rank, or with a dim provably different from kiln's, is
//!   an invalid program naming the node (`Importer::push`).
//! - The file is untrusted: every size, axis and argument list it gives is
//!   checked before use; a tensor larger than 1 TiB at its largest shape and
//!   tables computed at compile time from its sizes beyond 2^24 elements are
//!   refused (`importer.rs`: `MAX_TENSOR_BYTES`, `MAX_TABLE_ELEMENTS`).
//!   `tests/tests/import_mutations.rs` and `compiler/fuzz` feed it mutated
//!   fixtures.
//! - A nested graph (a `cond` branch, a loop's condition or body) is
//!   converted in a scope of its own, pushed and popped (`scope.rs`).
//! - Buffers the program mutates (`buffer_mutation` outputs in Core ATen,
//!   in-place writes in training IR) become state that persists between runs
//!   (`kiln_ir::StateSlot`); a program writing into its input is refused,
//!   naming the input (`state.rs`).
//! - Unsupported ops, argument values, weights and input kinds do not stop the
//!   import at the first: all are collected into one [`ImportError::Unsupported`].
//! - `torch.cond` is imported with both branches inline and its results
//!   selected with `Where` (both branches execute; see `control_flow.rs`);
//!   `while_loop` becomes `Op::While` with nested condition and body graphs.
//! - Random ops (`rand`, `randn`, `randint`, `randperm`, `bernoulli`, dropout
//!   in training mode, ...) become `Op::Random`, drawn at run time from the
//!   session's seeded generator: same distributions as torch, not same values.
//! - Custom ops (outside ATen) are reported with the signature the call shows,
//!   unless [`ImportOptions`] registers a lowering for them ([`custom`]).

pub mod builtin;
mod control_flow;
pub mod custom;
mod error;
mod importer;
mod ops;
mod promote;
mod scope;
mod state;
pub mod support;
mod views;

pub use custom::{CustomLowering, CustomOpContext, ImportOptions};
pub use error::{ImportError, Problem, UnsupportedList};
pub use support::{supported_ops, OpSupport};

use crate::pt2::Pt2File;
use std::path::Path;

/// A program imported from a `.pt2` file.
#[derive(Debug)]
pub struct Imported {
    pub graph: kiln_ir::Graph,
    pub torch_version: Option<String>,
    pub schema_version: (u32, u32),
    /// `"TRAINING"` or `"ATEN"` (from the program's verifiers).
    pub ir_flavour: String,
}

/// Reads `path` (written by `torch.export.save`, torch 2.5 – 2.15) into kiln IR.
pub fn import_pt2(path: &Path) -> Result<Imported, ImportError> {
    import_pt2_with(path, &ImportOptions::default())
}

/// [`import_pt2`] with options: lowerings of custom ops (see [`custom`]).
pub fn import_pt2_with(path: &Path, options: &ImportOptions) -> Result<Imported, ImportError> {
    let file = Pt2File::open(path)?;
    import_file_with(&file, options)
}

/// Imports an already opened file.
pub fn import_file(file: &Pt2File) -> Result<Imported, ImportError> {
    import_file_with(file, &ImportOptions::default())
}

/// [`import_file`] with options.
pub fn import_file_with(file: &Pt2File, options: &ImportOptions) -> Result<Imported, ImportError> {
    let graph = importer::Importer::new(file, options).run()?;
    let program = &file.program;
    Ok(Imported {
        graph,
        torch_version: program.torch_version.clone(),
        schema_version: program.schema_version,
        ir_flavour: program.verifiers.first().cloned().unwrap_or_else(|| "TRAINING".to_string()),
    })
}
