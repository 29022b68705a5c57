//! NEON GEMM microkernel: an 8×12 tile is 24 q-register accumulators, plus
//! three B vectors and two A vectors (its 8 values, used lane by lane with
//! `fmla v.4s, v.4s, v.s[i]`), 29 of the 32 vector registers.

use crate::generic::gemm::{Combine, GemmUkr, Packing, Tile};
use std::arch::aarch64::*;

const MR: usize = 8;
const NR: usize = 12;
/// q registers per row of the tile.
const NV: usize = NR / 4;

/// The table entry; installed by `aarch64::plug` (NEON is baseline).
pub(crate) const UKR: GemmUkr = GemmUkr {
    variant: "neon_8x12",
    mr: MR,
    nr: NR,
    packing: Packing::KMajorPanels,
    run: microkernel,
    direct: None,
    math: None,
};

fn microkernel(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let kc = kc.min(astrip.len() / MR).min(bstrip.len() / NR);
    // SAFETY: `kc` is bounded by both strip lengths, so every load stays in
    // bounds; NEON is baseline on aarch64.
    unsafe { kernel_8x12(kc, astrip.as_ptr(), bstrip.as_ptr(), tile) }
}

/// `c[i] += b · a[lane]` for one row of the tile (three q registers).
macro_rules! fma_row {
    ($c:expr, $b:expr, $a:expr, $lane:literal) => {
        $c[0] = vfmaq_laneq_f32::<$lane>($c[0], $b[0], $a);
        $c[1] = vfmaq_laneq_f32::<$lane>($c[1], $b[1], $a);
        $c[2] = vfmaq_laneq_f32::<$lane>($c[2], $b[2], $a);
    };
}

unsafe fn kernel_8x12(kc: usize, a: *const f32, b: *const f32, tile: &mut Tile<'_>) {
    let mut c = [[vdupq_n_f32(0.0); NV]; MR];
    for p in 0..kc {
        // SAFETY (whole loop): p < kc, so a[p*MR..p*MR+MR] and
        // b[p*NR..p*NR+NR] are inside the strips (checked by the caller).
        let bp = b.add(p * NR);
        let bv = [vld1q_f32(bp), vld1q_f32(bp.add(4)), vld1q_f32(bp.add(8))];
        let ap = a.add(p * MR);
        let (a0, a1) = (vld1q_f32(ap), vld1q_f32(ap.add(4)));
        fma_row!(c[0], bv, a0, 0);
        fma_row!(c[1], bv, a0, 1);
        fma_row!(c[2], bv, a0, 2);
        fma_row!(c[3], bv, a0, 3);
        fma_row!(c[4], bv, a1, 0);
        fma_row!(c[5], bv, a1, 1);
        fma_row!(c[6], bv, a1, 2);
        fma_row!(c[7], bv, a1, 3);
    }
    // A full tile with nothing fused goes straight from registers to C; the
    // vector add is the same IEEE operation as the portable `c += acc`.
    let direct = tile.rows == MR && tile.cols == NR && tile.epilogue.is_empty();
    match tile.combine {
        Combine::Overwrite | Combine::Accumulate if direct => {
            let accumulate = tile.combine == Combine::Accumulate;
            for (i, ci) in c.iter().enumerate() {
                let row = tile.row(i);
                let ptr = row.as_mut_ptr();
                for (v, &acc) in ci.iter().enumerate() {
                    // SAFETY: `row` holds NR = 12 f32s: three 4-wide accesses.
                    let at = ptr.add(4 * v);
                    let out = if accumulate { vaddq_f32(vld1q_f32(at), acc) } else { acc };
                    vst1q_f32(at, out);
                }
            }
        }
        _ => {
            let mut acc = [0f32; MR * NR];
            for (row, ci) in acc.chunks_exact_mut(NR).zip(&c) {
                for (v, &r) in ci.iter().enumerate() {
                    // SAFETY: each row holds NR = 12 f32s, three 4-wide stores.
                    vst1q_f32(row.as_mut_ptr().add(4 * v), r);
                }
            }
            tile.store(&acc, NR);
        }
    }
}
