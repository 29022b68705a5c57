//! Portable implementations of every kernel. They are what runs when no
//! ISA-specific variant applies, and the oracle those variants are tested
//! against.

pub(crate) mod common;
pub mod elementwise;
pub mod gemm;
pub mod layout;
pub mod math;
pub mod matmul;
pub mod conv;
mod conv_depthwise;
pub mod norm;
pub mod reduce;
pub mod pool;
pub mod attention;
pub mod sort;
pub mod pad;
pub mod resize;
pub mod random;
pub mod scatter;
pub mod select;
