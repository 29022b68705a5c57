//! kiln's leaf types, defined once for the whole workspace.
//!
//! `ir`, `kernels` and `runtime` all use these types (ir re-exports them, the
//! kernels take them as selectors, the artifact format stores them), so there
//! is no mapping between layers. Every enum has **stable numeric codes**:
//! explicit discriminants that the artifact format stores (with feature
//! `serde`, a value serializes as its code, never as its declaration
//! position). Reordering variants therefore changes nothing on disk; adding
//! one takes a new code; a code is never reused.
//!
//! [`opcode`] is the plan's instruction set: one table of every opcode with
//! its code, name, operand and result counts and instruction kind.

mod code;
mod dtype;
pub mod epilogue;
pub mod fused;
pub mod math;
pub mod opcode;
mod selectors;

pub use code::UnknownCode;
pub use dtype::DType;
pub use epilogue::{Activation, Epilogue, Residual};
pub use fused::{register_types, FusedOp};
pub use opcode::{InstrKind, Opcode};
pub use selectors::{
    BinaryOp, Layout, LinalgOp, PadMode, PoolKind, RandomDist, ReduceKind, ResizeMode, ScanKind, UnaryOp,
};
