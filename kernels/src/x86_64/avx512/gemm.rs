//! AVX-512F GEMM microkernel: an 8×32 tile is 16 zmm accumulators (enough
//! independent FMA chains to cover the FMA latency on two ports) plus two B
//! vectors and one A broadcast, well within the 32 zmm registers. Eight rows
//! make a batch-8 linear one tile tall, so a skinny GEMM (M ≤ 8) streams
//! each packed B strip exactly once.

use crate::generic::gemm::{GemmUkr, Packing, RowAddends, Tile, VectorStore};
use std::arch::x86_64::*;

const MR: usize = 8;
const NR: usize = 32;

/// The table entry; installed only by `x86_64::plug` into a v4 table, built
/// after AVX-512 was detected.
pub(crate) const UKR: GemmUkr =
    GemmUkr { variant: "avx512f_8x32", mr: MR, nr: NR, packing: Packing::KMajorPanels, run: microkernel };

fn microkernel(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let kc = kc.min(astrip.len() / MR).min(bstrip.len() / NR);
    // SAFETY: the CPU supports AVX-512F (see `UKR`), and `kc` is bounded by
    // both strip lengths so every load stays in bounds.
    unsafe { kernel_8x32(kc, astrip.as_ptr(), bstrip.as_ptr(), tile) }
}

#[target_feature(enable = "avx512f")]
unsafe fn kernel_8x32(kc: usize, a: *const f32, b: *const f32, tile: &mut Tile<'_>) {
    let mut c = [[_mm512_setzero_ps(); 2]; MR];
    for p in 0..kc {
        // SAFETY (whole loop): p < kc, so a[p*MR..p*MR+MR] and
        // b[p*NR..p*NR+NR] are inside the strips (checked by the caller).
        let bp = b.add(p * NR);
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(16));
        let ap = a.add(p * MR);
        for (i, ci) in c.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*ap.add(i));
            ci[0] = _mm512_fmadd_ps(av, b0, ci[0]);
            ci[1] = _mm512_fmadd_ps(av, b1, ci[1]);
        }
    }
    // A full tile whose epilogue is a bias, residual, ReLU or clamp is
    // finished in registers; the rest goes through the portable store step.
    if let Some(vs) = tile.vector_store(MR, NR) {
        for (i, ci) in c.iter().enumerate() {
            let addends = vs.row(i);
            let ptr = tile.row(i).as_mut_ptr();
            // SAFETY: the row, the column bias and the residual row each hold
            // NR = 32 f32s: two unaligned 16-wide accesses.
            store_row(&vs, &addends, ptr, ci[0], 0);
            store_row(&vs, &addends, ptr, ci[1], 16);
        }
        return;
    }
    let mut acc = [0f32; MR * NR];
    for (row, ci) in acc.chunks_exact_mut(NR).zip(&c) {
        // SAFETY: each row holds NR = 32 f32s, two unaligned 16-wide stores.
        _mm512_storeu_ps(row.as_mut_ptr(), ci[0]);
        _mm512_storeu_ps(row.as_mut_ptr().add(16), ci[1]);
    }
    tile.store(&acc, NR);
}

/// [`VectorStore`]'s steps for the 16 elements of a row at `ptr + off`, in
/// the portable store step's order and operand order.
///
/// # Safety
/// `ptr + off .. ptr + off + 16` is writable, and the addends' slices hold
/// `off + 16` elements.
#[target_feature(enable = "avx512f")]
unsafe fn store_row(vs: &VectorStore<'_>, row: &RowAddends<'_>, ptr: *mut f32, acc: __m512, off: usize) {
    let ptr = ptr.add(off);
    let mut v = if vs.accumulate { _mm512_add_ps(_mm512_loadu_ps(ptr), acc) } else { acc };
    if let Some(b) = row.bias {
        v = _mm512_add_ps(v, _mm512_set1_ps(b));
    }
    if let Some(b) = row.col_bias {
        v = _mm512_add_ps(v, _mm512_loadu_ps(b.as_ptr().add(off)));
    }
    let residual = row.residual.map(|r| _mm512_loadu_ps(r.as_ptr().add(off)));
    if let (true, Some(r)) = (vs.residual_first, residual) {
        v = _mm512_add_ps(v, r);
    }
    if let Some((lo, hi)) = vs.clamp {
        // max(lo, v) is lo only when lo > v, min(hi, v) hi only when hi < v:
        // NaN stays NaN, as in the portable clamp.
        v = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), v));
    }
    if let (false, Some(r)) = (vs.residual_first, residual) {
        v = _mm512_add_ps(v, r);
    }
    _mm512_storeu_ps(ptr, v);
}
