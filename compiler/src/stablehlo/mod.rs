//! The PJRT target: accelerator segments as StableHLO.
//!
//! - [`partition`]: splits the scheduled graph into accelerator segments and
//!   CPU nodes (always built; it needs no MLIR).
//! - `emit` (feature `mlir`): one segment → StableHLO text through melior.
//! - `driver` (feature `mlir`): partition, emit, plan memory and lower to a
//!   mixed plan plus the `AccelProgram` section.
//! - [`buckets`]: shape buckets for programs with symbolic dimensions
//!   (`--buckets`): sizes, specialisation, the padding-safety check.
//! - [`masks`]: the rewrite of each bucket's graph that masks the padding
//!   where an op combines along a padded axis (the true sizes become
//!   scalar arguments).
//! - [`loop_consts`]: large constants of loop regions become loop operands
//!   (weights), not inline text.
//! - [`sharding`]: Shardy and GSPMD annotation text for SPMD programs (a
//!   graph with a mesh: one segment over every device).
//! - [`verify`]: the collective verifier every emitted module passes
//!   (modes, groups, pairs, reduction bodies, shapes); the runtime's, which
//!   checks each segment again before a plugin compiles it.

pub mod buckets;
pub mod loop_consts;
pub mod masks;
pub mod partition;
pub mod sharding;

pub use kiln_runtime::pjrt::verify;

#[cfg(feature = "mlir")]
pub mod emit;

#[cfg(feature = "mlir")]
mod driver;

#[cfg(feature = "mlir")]
pub use driver::{lower_for_pjrt, lower_for_pjrt_sharded, lower_for_pjrt_with, PjrtLowering};

/// Constants with at most this many elements are written into the program
/// (`dense<…>`); larger ones are passed as arguments so that weights stay in
/// the artifact's weights section and are uploaded once per session.
pub const INLINE_CONST_MAX_ELEMENTS: usize = 64;

/// Arithmetic of accelerator segments.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    /// Compute in bf16 with f32 accumulation (matrix products, convolutions,
    /// reductions); tensors keep their f32 type at segment boundaries, large
    /// f32 weights are converted to bf16 at compile time.
    Bf16,
}

impl Precision {
    pub fn from_name(name: &str) -> Option<Precision> {
        match name {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}
