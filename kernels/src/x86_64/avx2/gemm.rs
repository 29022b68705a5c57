//! AVX2 + FMA GEMM microkernel: a 6×16 tile is 12 ymm accumulators plus two B
//! vectors and one A broadcast, within the 16 ymm registers. One or two
//! rows take four or two strips at a time (`R`×`S` tiles of 8
//! accumulators). The body is `x86_64::gemm_kernel`'s, shared with AVX-512.

use super::math;

crate::x86_64::gemm_kernel::f32_gemm_kernel! {
    features: "avx2,fma",
    variant: "avx2_fma_6x16",
    mr: 6,
    lanes: 8,
    vec: __m256,
    zero: _mm256_setzero_ps,
    loadu: _mm256_loadu_ps,
    storeu: _mm256_storeu_ps,
    load_first: load_first,
    store_first: store_first,
    set1: _mm256_set1_ps,
    fmadd: _mm256_fmadd_ps,
    add: _mm256_add_ps,
    min: _mm256_min_ps,
    max: _mm256_max_ps,
    math: math,
    rows: { 1 => 4, 2 => 2, 3 => 1, 4 => 1, 5 => 1 },
}

/// Lanes below `n` set.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn first_lanes(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// The first `n` (< 8) f32s at `ptr`, the other lanes zero.
///
/// # Safety
/// AVX2; `ptr .. ptr + n` is readable (masked-off lanes are not read).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_first(ptr: *const f32, n: usize) -> __m256 {
    _mm256_maskload_ps(ptr, first_lanes(n))
}

/// Stores the first `n` (< 8) lanes of `v` at `ptr`.
///
/// # Safety
/// AVX2; `ptr .. ptr + n` is writable (masked-off lanes are not written).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_first(ptr: *mut f32, n: usize, v: __m256) {
    _mm256_maskstore_ps(ptr, first_lanes(n), v)
}
