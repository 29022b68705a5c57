//! AVX-512F GEMM microkernel: an 8×32 tile is 16 zmm accumulators (enough
//! independent FMA chains to cover the FMA latency on two ports) plus two B
//! vectors and one A broadcast, well within the 32 zmm registers. Eight rows
//! make a batch-8 linear one tile tall, so a skinny GEMM (M ≤ 8) streams
//! each packed B strip exactly once. Below four rows, two to four strips
//! are taken at a time (`R`×`S` tiles, 8–16 accumulators). The body is
//! `x86_64::gemm_kernel`'s, shared with AVX2.

use super::math;

crate::x86_64::gemm_kernel::f32_gemm_kernel! {
    features: "avx512f",
    variant: "avx512f_8x32",
    mr: 8,
    lanes: 16,
    vec: __m512,
    zero: _mm512_setzero_ps,
    loadu: _mm512_loadu_ps,
    storeu: _mm512_storeu_ps,
    load_first: load_first,
    store_first: store_first,
    set1: _mm512_set1_ps,
    fmadd: _mm512_fmadd_ps,
    add: _mm512_add_ps,
    min: _mm512_min_ps,
    max: _mm512_max_ps,
    math: math,
    rows: { 1 => 4, 2 => 4, 3 => 2, 4 => 2, 5 => 1, 6 => 1, 7 => 1 },
}

/// The first `n` (< 16) f32s at `ptr`, the other lanes zero.
///
/// # Safety
/// AVX-512F; `ptr .. ptr + n` is readable (masked-off lanes are not read).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_first(ptr: *const f32, n: usize) -> __m512 {
    _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, ptr)
}

/// Stores the first `n` (< 16) lanes of `v` at `ptr`.
///
/// # Safety
/// AVX-512F; `ptr .. ptr + n` is writable (masked-off lanes are not written).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_first(ptr: *mut f32, n: usize, v: __m512) {
    _mm512_mask_storeu_ps(ptr, ((1u32 << n) - 1) as __mmask16, v)
}
