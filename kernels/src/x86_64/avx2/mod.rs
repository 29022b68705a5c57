//! AVX2 + FMA (x86-64-v3) variants. Everything here is compiled for every
//! x86_64 target with `#[target_feature]` and reached only through a kernel
//! table that [`super::plug`] filled after detecting both features.

pub(crate) mod binary;
pub(crate) mod conv;
pub(crate) mod gemm;
pub(crate) mod math;
pub(crate) mod norm;
pub(crate) mod quant;
pub(crate) mod reduce;
