//! kiln's CPU kernels.
//!
//! Every kernel takes contiguous row-major tensors as bytes plus a dtype and a
//! shape ([`TensorRef`] / [`TensorMut`]), dispatches on the dtype, and reports
//! problems as [`KernelError`] values — never a panic. Kernels do not allocate on
//! their own: temporary buffers come from a caller-owned [`Scratch`], which grows
//! only when a larger shape than ever before is seen.
//!
//! Layout follows tract-linalg: `generic` is the portable implementation and the
//! test oracle; ISA-specific variants (chosen at run time after CPU detection)
//! sit beside it and are tested against it.

mod types;

pub use types::{BinaryOp, DType, KernelError, PoolKind, ReduceKind, Result, Scratch, TensorMut, TensorRef, UnaryOp};
