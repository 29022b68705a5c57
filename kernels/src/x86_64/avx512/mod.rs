//! AVX-512F (x86-64-v4) variants, compiled with `#[target_feature]` for
//! every x86_64 target (when the compiler has stable AVX-512 support:
//! `cfg(kiln_avx512)`, see build.rs) and reached only through a v4 kernel
//! table, built after the CPU was detected to have AVX-512.

pub(crate) mod conv;
pub(crate) mod gemm;
pub(crate) mod math;
pub(crate) mod quant;
