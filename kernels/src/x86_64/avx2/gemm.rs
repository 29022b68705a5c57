//! AVX2 + FMA GEMM microkernel: a 6×16 tile is 12 ymm accumulators plus two B
//! vectors and one A broadcast, within the 16 ymm registers.

use crate::generic::gemm::{Combine, GemmUkr, Packing, Tile};
use std::arch::x86_64::*;

const MR: usize = 6;
const NR: usize = 16;

/// The table entry; installed only by `x86_64::plug` after AVX2 and FMA were
/// detected.
pub(crate) const UKR: GemmUkr =
    GemmUkr { variant: "avx2_fma_6x16", mr: MR, nr: NR, packing: Packing::KMajorPanels, run: microkernel };

fn microkernel(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let kc = kc.min(astrip.len() / MR).min(bstrip.len() / NR);
    // SAFETY: the CPU supports AVX2 and FMA (see `UKR`), and `kc` is bounded
    // by both strip lengths so every load stays in bounds.
    unsafe { kernel_6x16(kc, astrip.as_ptr(), bstrip.as_ptr(), tile) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_6x16(kc: usize, a: *const f32, b: *const f32, tile: &mut Tile<'_>) {
    let mut c = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..kc {
        // SAFETY (whole loop): p < kc, so a[p*MR..p*MR+MR] and
        // b[p*NR..p*NR+NR] are inside the strips (checked by the caller).
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
    // A full tile with nothing fused goes straight from registers to C; the
    // vector add is the same IEEE operation as the portable `c += acc`.
    let direct = tile.rows == MR && tile.cols == NR && tile.epilogue.is_empty();
    match tile.combine {
        Combine::Overwrite | Combine::Accumulate if direct => {
            let accumulate = tile.combine == Combine::Accumulate;
            for (i, ci) in c.iter().enumerate() {
                let ptr = tile.row(i).as_mut_ptr();
                // SAFETY: `row` holds NR = 16 f32s: two unaligned 8-wide accesses.
                let (mut v0, mut v1) = (ci[0], ci[1]);
                if accumulate {
                    v0 = _mm256_add_ps(_mm256_loadu_ps(ptr), v0);
                    v1 = _mm256_add_ps(_mm256_loadu_ps(ptr.add(8)), v1);
                }
                _mm256_storeu_ps(ptr, v0);
                _mm256_storeu_ps(ptr.add(8), v1);
            }
        }
        _ => {
            let mut acc = [0f32; MR * NR];
            for (row, ci) in acc.chunks_exact_mut(NR).zip(&c) {
                // SAFETY: each row holds NR = 16 f32s, two unaligned 8-wide stores.
                _mm256_storeu_ps(row.as_mut_ptr(), ci[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), ci[1]);
            }
            tile.store(&acc, NR);
        }
    }
}
