//! AVX2 + FMA GEMM microkernel: a 6×16 tile is 12 ymm accumulators plus two B
//! vectors and one A broadcast, within the 16 ymm registers.

use std::arch::x86_64::*;

pub(crate) const MR: usize = 6;
pub(crate) const NR: usize = 16;

/// Safe entry point with the generic microkernel signature.
///
/// Only ever installed by `GemmKernel::best()` after
/// `is_x86_feature_detected!("avx2")` and `("fma")` both returned true.
pub(crate) fn microkernel(astrip: &[f32], bstrip: &[f32], acc: &mut [[f32; NR]; MR]) {
    let kc = (astrip.len() / MR).min(bstrip.len() / NR);
    // SAFETY: the CPU supports AVX2 and FMA (see above), and `kc` is bounded
    // by both strip lengths so every load stays in bounds.
    unsafe { kernel_6x16(kc, astrip.as_ptr(), bstrip.as_ptr(), acc) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_6x16(kc: usize, a: *const f32, b: *const f32, acc: &mut [[f32; NR]; MR]) {
    let mut c = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..kc {
        // SAFETY (whole loop): p < kc, so a[p*MR..p*MR+MR] and
        // b[p*NR..p*NR+NR] are inside the strips (checked by the caller).
        unsafe {
            let bp = b.add(p * NR);
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            let ap = a.add(p * MR);
            for (i, ci) in c.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*ap.add(i));
                ci[0] = _mm256_fmadd_ps(av, b0, ci[0]);
                ci[1] = _mm256_fmadd_ps(av, b1, ci[1]);
            }
        }
    }
    for (row, ci) in acc.iter_mut().zip(&c) {
        // SAFETY: each row holds NR = 16 f32s, two unaligned 8-wide stores.
        unsafe {
            _mm256_storeu_ps(row.as_mut_ptr(), ci[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), ci[1]);
        }
    }
}
