//! AVX2 + FMA GEMM microkernel: a 6×16 tile is 12 ymm accumulators plus two B
//! vectors and one A broadcast, within the 16 ymm registers.

use crate::generic::gemm::{GemmUkr, Packing, RowAddends, Tile, VectorStore};
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
    // A full tile whose epilogue is a bias, residual, ReLU or clamp is
    // finished in registers; the rest goes through the portable store step.
    if let Some(vs) = tile.vector_store(MR, NR) {
        for (i, ci) in c.iter().enumerate() {
            let addends = vs.row(i);
            let ptr = tile.row(i).as_mut_ptr();
            // SAFETY: the row, the column bias and the residual row each hold
            // NR = 16 f32s: two unaligned 8-wide accesses.
            store_row(&vs, &addends, ptr, ci[0], 0);
            store_row(&vs, &addends, ptr, ci[1], 8);
        }
        return;
    }
    let mut acc = [0f32; MR * NR];
    for (row, ci) in acc.chunks_exact_mut(NR).zip(&c) {
        // SAFETY: each row holds NR = 16 f32s, two unaligned 8-wide stores.
        _mm256_storeu_ps(row.as_mut_ptr(), ci[0]);
        _mm256_storeu_ps(row.as_mut_ptr().add(8), ci[1]);
    }
    tile.store(&acc, NR);
}

/// [`VectorStore`]'s steps for the 8 elements of a row at `ptr + off`, in
/// the portable store step's order and operand order.
///
/// # Safety
/// `ptr + off .. ptr + off + 8` is writable, and the addends' slices hold
/// `off + 8` elements.
#[target_feature(enable = "avx2,fma")]
unsafe fn store_row(vs: &VectorStore<'_>, row: &RowAddends<'_>, ptr: *mut f32, acc: __m256, off: usize) {
    let ptr = ptr.add(off);
    let mut v = if vs.accumulate { _mm256_add_ps(_mm256_loadu_ps(ptr), acc) } else { acc };
    if let Some(b) = row.bias {
        v = _mm256_add_ps(v, _mm256_set1_ps(b));
    }
    if let Some(b) = row.col_bias {
        v = _mm256_add_ps(v, _mm256_loadu_ps(b.as_ptr().add(off)));
    }
    let residual = row.residual.map(|r| _mm256_loadu_ps(r.as_ptr().add(off)));
    if let (true, Some(r)) = (vs.residual_first, residual) {
        v = _mm256_add_ps(v, r);
    }
    if let Some((lo, hi)) = vs.clamp {
        // max(lo, v) is lo only when lo > v, min(hi, v) hi only when hi < v:
        // NaN stays NaN, as in the portable clamp.
        v = _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v));
    }
    if let (false, Some(r)) = (vs.residual_first, residual) {
        v = _mm256_add_ps(v, r);
    }
    _mm256_storeu_ps(ptr, v);
}
