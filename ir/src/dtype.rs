//! Element types: defined once in `kiln-isa` (shared with the kernels and
//! the artifact format), re-exported here.

pub use kiln_isa::DType;
