//! Portable implementations of every kernel. They are what runs when no
//! ISA-specific variant applies, and the oracle those variants are tested
//! against.

pub mod attention;
pub(crate) mod common;
pub mod conv;
mod conv_depthwise;
pub mod elementwise;
pub mod gemm;
pub mod layout;
pub mod math;
pub mod matmul;
pub mod norm;
pub mod pad;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod resize;
pub mod scatter;
pub mod select;
pub mod sort;
