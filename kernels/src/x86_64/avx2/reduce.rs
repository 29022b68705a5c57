//! AVX2 column sums in f64 (the channel sums of a channels-last mean).
//! Every f32 converts to f64 exactly and each lane holds one column's chain
//! of adds in row order, as the generic loop does: bit-identical results.
//! The win is keeping a block of columns' sums in registers across the rows
//! (the generic loop loads and stores `acc` once per row) and four f64
//! lanes per add against baseline x86_64's two.

use std::arch::x86_64::*;

/// f64 lanes per register.
const LANES: usize = 4;
/// Accumulator registers of the wide block: 32 columns.
const WIDE: usize = 8;

/// `acc[j] += x[r·c + j]` (f64) for every row `r` of `c = acc.len()`
/// elements of `x`, rows in order.
pub(crate) fn column_sum(x: &[f32], acc: &mut [f64]) {
    let c = acc.len();
    if c == 0 {
        return;
    }
    let rows = x.len() / c;
    let mut j = 0;
    // SAFETY (all three): only installed by `plug` after AVX2 was
    // detected; each reads columns `j..j + width` of `rows` rows of `c`
    // elements, within `x`, and writes `acc[j..j + width]`, within `acc`.
    while j + WIDE * LANES <= c {
        unsafe { block::<WIDE>(x, c, rows, j, acc) };
        j += WIDE * LANES;
    }
    while j + LANES <= c {
        unsafe { block::<1>(x, c, rows, j, acc) };
        j += LANES;
    }
    for (jj, a) in acc.iter_mut().enumerate().skip(j) {
        for r in 0..rows {
            *a += x[r * c + jj] as f64;
        }
    }
}

/// Columns `j..j + B·LANES`: `B` registers of sums, loaded once, added to
/// row after row, stored once.
#[target_feature(enable = "avx2")]
unsafe fn block<const B: usize>(x: &[f32], c: usize, rows: usize, j: usize, acc: &mut [f64]) {
    debug_assert!(j + B * LANES <= c && rows * c <= x.len() && acc.len() == c);
    let mut sums = [_mm256_setzero_pd(); B];
    for (b, s) in sums.iter_mut().enumerate() {
        *s = _mm256_loadu_pd(acc.as_ptr().add(j + b * LANES));
    }
    for r in 0..rows {
        let p = x.as_ptr().add(r * c + j);
        for (b, s) in sums.iter_mut().enumerate() {
            *s = _mm256_add_pd(*s, _mm256_cvtps_pd(_mm_loadu_ps(p.add(b * LANES))));
        }
    }
    for (b, s) in sums.iter().enumerate() {
        _mm256_storeu_pd(acc.as_mut_ptr().add(j + b * LANES), *s);
    }
}
