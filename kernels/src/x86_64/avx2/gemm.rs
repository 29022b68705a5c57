//! AVX2 + FMA GEMM microkernel: a 6×16 tile is 12 ymm accumulators plus two B
//! vectors and one A broadcast, within the 16 ymm registers.
//!
//! The direct form reads A in place and computes only the rows there are:
//! one or two rows take four or two strips at a time (`R`×`S` tiles of 8
//! accumulators), so that a GEMV still has eight FMA chains in flight and
//! does no multiply-adds on padding rows.

use crate::generic::gemm::{AView, GemmUkr, Packing, RowAddends, Tile, VectorStore};
use std::arch::x86_64::*;

const MR: usize = 6;
const NR: usize = 16;

/// The table entry; installed only by `x86_64::plug` after AVX2 and FMA were
/// detected.
pub(crate) const UKR: GemmUkr = GemmUkr {
    variant: "avx2_fma_6x16",
    mr: MR,
    nr: NR,
    packing: Packing::KMajorPanels,
    run: microkernel,
    direct: Some(direct),
};

fn microkernel(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let kc = kc.min(astrip.len() / MR).min(bstrip.len() / NR);
    // SAFETY: the CPU supports AVX2 and FMA (see `UKR`), and `kc` is bounded by
    // both strip lengths so every load stays in bounds.
    unsafe { block::<MR, 1>(kc, astrip.as_ptr(), 1, MR, bstrip.as_ptr(), 0, tile) }
}

fn direct(kc: usize, a: AView<'_>, b: &[f32], tile: &mut Tile<'_>) {
    let (rows, strips) = (tile.rows, tile.cols.div_ceil(NR));
    assert!(rows <= MR && a.covers(rows, kc), "direct kernel: {rows} rows of A out of bounds");
    assert!(b.len() >= strips * kc * NR, "direct kernel: {strips} B strips out of bounds");
    let (ap, rs, ks) = (a.data.as_ptr(), a.row_stride, a.k_stride);
    // SAFETY: the CPU supports AVX2 and FMA (see `UKR`); A's `rows`×`kc` and B's
    // `strips` strips were checked above.
    unsafe {
        match rows {
            0 => {}
            1 => strips_of::<1, 4>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
            2 => strips_of::<2, 2>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
            3 => strips_of::<3, 1>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
            4 => strips_of::<4, 1>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
            5 => strips_of::<5, 1>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
            _ => strips_of::<MR, 1>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
        }
    }
}

/// `R` rows by `strips` strips, `S` strips at a time (then one at a time).
///
/// # Safety
/// AVX2 and FMA; A's element (i, p) at `a + i*rs + p*ks` is readable for
/// i < R, p < kc, and `b` holds `strips` strips of `kc·NR`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn strips_of<const R: usize, const S: usize>(
    kc: usize,
    a: *const f32,
    rs: usize,
    ks: usize,
    b: *const f32,
    strips: usize,
    tile: &mut Tile<'_>,
) {
    let stride = kc * NR;
    let mut s = 0;
    while s + S <= strips {
        let mut part = tile.columns(s * NR, (strips.min(s + S) * NR).min(tile.cols) - s * NR);
        block::<R, S>(kc, a, rs, ks, b.add(s * stride), stride, &mut part);
        s += S;
    }
    while s < strips {
        let mut part = tile.columns(s * NR, NR.min(tile.cols - s * NR));
        block::<R, 1>(kc, a, rs, ks, b.add(s * stride), stride, &mut part);
        s += 1;
    }
}

/// The `R`×`S·NR` tile: per element a chain of FMAs over `p` in order from
/// zero, as every shape of this kernel computes it.
///
/// # Safety
/// As [`strips_of`] with `S` strips `stride` apart; `tile` has `R` rows.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const R: usize, const S: usize>(
    kc: usize,
    a: *const f32,
    rs: usize,
    ks: usize,
    b: *const f32,
    stride: usize,
    tile: &mut Tile<'_>,
) {
    // Per strip, per row: two vectors of accumulators.
    let mut c = [[[_mm256_setzero_ps(); 2]; R]; S];
    let rows: [*const f32; R] = std::array::from_fn(|i| a.add(i * rs));
    for p in 0..kc {
        let bp = b.add(p * NR);
        let mut bv = [[_mm256_setzero_ps(); 2]; S];
        for (s, v) in bv.iter_mut().enumerate() {
            *v = [_mm256_loadu_ps(bp.add(s * stride)), _mm256_loadu_ps(bp.add(s * stride + 8))];
        }
        for (i, row) in rows.iter().enumerate() {
            let av = _mm256_set1_ps(*row.add(p * ks));
            for (cs, v) in c.iter_mut().zip(&bv) {
                cs[i][0] = _mm256_fmadd_ps(av, v[0], cs[i][0]);
                cs[i][1] = _mm256_fmadd_ps(av, v[1], cs[i][1]);
            }
        }
    }
    for (s, cs) in c.iter().enumerate() {
        let col = s * NR;
        if col >= tile.cols {
            break;
        }
        store(cs, &mut tile.columns(col, NR.min(tile.cols - col)));
    }
}

/// Stores `R` rows of one strip's accumulators into `tile` (`R` rows, up
/// to NR columns). A full-width tile whose epilogue is a bias, residual,
/// ReLU or clamp is finished in registers; the rest goes through the
/// portable store step.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store<const R: usize>(c: &[[__m256; 2]; R], tile: &mut Tile<'_>) {
    if let Some(vs) = tile.vector_store(MR, NR) {
        for (i, ci) in c.iter().enumerate().take(tile.rows) {
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
    for (row, ci) in acc.chunks_exact_mut(NR).zip(c) {
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
