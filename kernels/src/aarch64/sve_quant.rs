//! SVE int8 GEMM microkernels: SVE `sdot` on the weights' lanes and SVE
//! `smmla` (SVE with FEAT_I8MM) on their column-pairs copy, both through
//! `asm!` (SVE intrinsics are not stable) and both exact, so their sums
//! are the generic kernel's integers.
//!
//! The vector length is a property of the CPU (128 to 2048 bits; qemu's
//! `max` CPU takes it from `sve-default-vector-length`), read at run time
//! with `cntb`. Neither the packed layout nor the tile depends on it: a
//! call is an 8×32 tile (two strips), computed in column blocks of
//! `VL / 2` columns (VL in bytes) — 4 blocks of 8 columns at 128 bits, 2
//! of 16 at 256, one of 32 at 512 —, each block 16 accumulator vectors
//! held over the whole of K by one `asm!` block. A block's weight vectors
//! each lie inside one strip, which holds for VL = 16, 32 or 64 bytes only:
//! [`supported`] lists the variants for those lengths (every SVE CPU
//! shipped so far: 128, 256 or A64FX's 512 bits).
//!
//! - `sdot z.s, z.b, z.b` adds 4 i8 products into each i32 lane: a weight
//!   vector is `VL / 4` columns' lanes of one lane step (`pack.rs`), an
//!   activation vector one row's 4 values broadcast (`ld1rw`), so a block
//!   is 8 rows × 2 weight vectors.
//! - `smmla z.s, z.b, z.b` is NEON's `smmla` in every 128-bit segment:
//!   a 2×8 block of two rows (the same in every segment: two `ld1rd`
//!   broadcasts interleaved by `trn1`) times 8×2 blocks of the segments'
//!   column pairs (`VL / 16` consecutive pairs of the pairs copy, one
//!   load), so a block is 4 row pairs × 4 weight vectors. Each
//!   accumulator segment holds `[r0·c0, r0·c1, r1·c0, r1·c1]`: `uzp1` /
//!   `uzp2` on 64-bit elements of two neighbouring accumulators give the
//!   upper and lower row's `VL / 4` consecutive columns.

use super::quant::DRIVER;
use crate::quant::{Acts, CopyKernel, CopyKind, QGemmUkr, PAIR_GROUP};
use std::arch::asm;

/// Rows per call (4 `smmla` row pairs).
const MR: usize = 8;
/// Columns per call: two strips.
const NR: usize = 32;
/// Bytes of one lane step of a strip (16 columns × 4 values).
const STEP: usize = 64;
/// Bytes of one pairs-copy group of a strip (8 column pairs × 16 values).
const GROUP: usize = 128;

/// The SVE vector length in bytes.
#[target_feature(enable = "sve")]
unsafe fn vector_bytes() -> usize {
    let vl: usize;
    asm!("cntb {vl}", vl = out(reg) vl, options(pure, nomem, nostack, preserves_flags));
    vl
}

/// Whether the SVE kernels run here: SVE with a vector of 16, 32 or 64
/// bytes (the module doc says why those).
pub(crate) fn supported() -> bool {
    // SAFETY: `cntb` runs only where SVE was detected.
    std::arch::is_aarch64_feature_detected!("sve") && matches!(unsafe { vector_bytes() }, 16 | 32 | 64)
}

/// Whether the CPU has SVE's int8 matrix multiply (SVE `smmla`): Linux
/// reports it apart from NEON's (HWCAP2_SVEI8MM, bit 9 of AT_HWCAP2, which
/// `is_aarch64_feature_detected!` has no name for and `libc` no constant).
pub(crate) fn has_sve_i8mm() -> bool {
    const HWCAP2_SVEI8MM: u64 = 1 << 9;
    super::hwcap2() & HWCAP2_SVEI8MM != 0
}

/// The vector length at the call; [`supported`] held when the entry was
/// installed (a thread could change its own length since, with `prctl`).
fn block_bytes() -> usize {
    // SAFETY: this module's entries are installed only where SVE was detected.
    let vl = unsafe { vector_bytes() };
    assert!(matches!(vl, 16 | 32 | 64), "qgemm: SVE vector length {vl} bytes is not 16, 32 or 64");
    vl
}

/// Bounds every kernel here relies on: 8 rows of `4 · k4` values, and two
/// strips of `per_strip` weight bytes, `strip` bytes apart.
fn check(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, per_strip: usize, acc: &[i32]) {
    assert!(k4 > 0, "qgemm: empty depth");
    assert!(a.len() >= (MR - 1) * lda + 4 * k4, "qgemm: activation rows too short");
    assert!(strip >= per_strip && b.len() >= strip + per_strip, "qgemm: weight strips too short");
    assert!(acc.len() >= MR * NR, "qgemm: accumulator tile too small");
}

/// The 8 row pointers of a tile.
fn row_pointers(a: &[u8], lda: usize) -> [*const u8; MR] {
    std::array::from_fn(|i| a[i * lda..].as_ptr())
}

/// Where column `col` (0..32) of a call's two strips starts in weight
/// bytes `b` whose strips are `strip` bytes apart and hold `bytes_per_col`
/// bytes of a column per lane step or group.
fn column_at(b: &[u8], strip: usize, col: usize, bytes_per_col: usize) -> *const u8 {
    b[(col / 16) * strip + (col % 16) * bytes_per_col..].as_ptr()
}

/// The `sdot` entry: reads the lanes only.
pub(crate) const INT8_SDOT: QGemmUkr = QGemmUkr {
    variant: "sve_sdot_8x32",
    mr: MR,
    nr: NR,
    acts: Acts::I8,
    run: int8_sdot,
    copy: None,
    window: None,
    driver: DRIVER,
};

/// The `smmla` entry: the pairs copy where the weight has it (packed for
/// this table), else the `sdot` kernel on the lanes.
pub(crate) const INT8_I8MM: QGemmUkr = QGemmUkr {
    variant: "sve_i8mm_8x32",
    copy: Some(CopyKernel { kind: CopyKind::Pairs, run: int8_smmla_pairs, min_rows: 1 }),
    ..INT8_SDOT
};

fn int8_sdot(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    check(k4, a, lda, b, strip, STEP * k4, acc);
    let vl = block_bytes();
    let rows = row_pointers(a, lda);
    // A block: 2 vectors of `vl / 4` columns each.
    for c0 in (0..NR).step_by(vl / 2) {
        let w = [column_at(b, strip, c0, 4), column_at(b, strip, c0 + vl / 4, 4)];
        // SAFETY: SVE was detected (`block_bytes`); each weight vector is
        // `vl` bytes of one strip's 64-byte lane step (`vl / 4` columns
        // from a multiple of `vl / 4`), `k4` steps inside the strip
        // (`check`); rows read `4 · k4` bytes; the block's 8 rows of `vl /
        // 2` i32s lie in `acc` (32 columns a row, `c0 + vl / 2 <= 32`).
        unsafe { sdot_block(k4, &rows, w, acc[c0..].as_mut_ptr()) }
    }
}

/// One `sdot` block: `out[i · 32 + j] = Σ_t row_i[4t..4t + 4] · column_j`
/// for 8 rows and the `VL / 2` columns of the two weight vectors at `w`.
#[target_feature(enable = "sve")]
unsafe fn sdot_block(k4: usize, rows: &[*const u8; MR], w: [*const u8; 2], out: *mut i32) {
    // z0–z15: accumulators, zN = row N / 2, weight vector N % 2; z16, z17:
    // weights; z18, z19: rows.
    asm!(
            "ptrue p0.b",
            "mov z0.s, #0", "mov z1.s, #0", "mov z2.s, #0", "mov z3.s, #0",
            "mov z4.s, #0", "mov z5.s, #0", "mov z6.s, #0", "mov z7.s, #0",
            "mov z8.s, #0", "mov z9.s, #0", "mov z10.s, #0", "mov z11.s, #0",
            "mov z12.s, #0", "mov z13.s, #0", "mov z14.s, #0", "mov z15.s, #0",
            "2:",
            "ld1b {{z16.b}}, p0/z, [{w0}]",
            "ld1b {{z17.b}}, p0/z, [{w1}]",
            "add {w0}, {w0}, #64",
            "add {w1}, {w1}, #64",
            "ld1rw {{z18.s}}, p0/z, [{a0}]",
            "ld1rw {{z19.s}}, p0/z, [{a1}]",
            "sdot z0.s, z16.b, z18.b", "sdot z1.s, z17.b, z18.b",
            "sdot z2.s, z16.b, z19.b", "sdot z3.s, z17.b, z19.b",
            "ld1rw {{z18.s}}, p0/z, [{a2}]",
            "ld1rw {{z19.s}}, p0/z, [{a3}]",
            "sdot z4.s, z16.b, z18.b", "sdot z5.s, z17.b, z18.b",
            "sdot z6.s, z16.b, z19.b", "sdot z7.s, z17.b, z19.b",
            "ld1rw {{z18.s}}, p0/z, [{a4}]",
            "ld1rw {{z19.s}}, p0/z, [{a5}]",
            "sdot z8.s, z16.b, z18.b", "sdot z9.s, z17.b, z18.b",
            "sdot z10.s, z16.b, z19.b", "sdot z11.s, z17.b, z19.b",
            "ld1rw {{z18.s}}, p0/z, [{a6}]",
            "ld1rw {{z19.s}}, p0/z, [{a7}]",
            "sdot z12.s, z16.b, z18.b", "sdot z13.s, z17.b, z18.b",
            "sdot z14.s, z16.b, z19.b", "sdot z15.s, z17.b, z19.b",
            "add {a0}, {a0}, #4", "add {a1}, {a1}, #4", "add {a2}, {a2}, #4", "add {a3}, {a3}, #4",
            "add {a4}, {a4}, #4", "add {a5}, {a5}, #4", "add {a6}, {a6}, #4", "add {a7}, {a7}, #4",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            // Row i's two vectors at out + 128 i (32 i32s a row).
            "st1w {{z0.s}}, p0, [{o}]", "st1w {{z1.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z2.s}}, p0, [{o}]", "st1w {{z3.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z4.s}}, p0, [{o}]", "st1w {{z5.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z6.s}}, p0, [{o}]", "st1w {{z7.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z8.s}}, p0, [{o}]", "st1w {{z9.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z10.s}}, p0, [{o}]", "st1w {{z11.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z12.s}}, p0, [{o}]", "st1w {{z13.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z14.s}}, p0, [{o}]", "st1w {{z15.s}}, p0, [{o}, #1, mul vl]",
            n = inout(reg) k4 => _,
            w0 = inout(reg) w[0] => _,
            w1 = inout(reg) w[1] => _,
            a0 = inout(reg) rows[0] => _,
            a1 = inout(reg) rows[1] => _,
            a2 = inout(reg) rows[2] => _,
            a3 = inout(reg) rows[3] => _,
            a4 = inout(reg) rows[4] => _,
            a5 = inout(reg) rows[5] => _,
            a6 = inout(reg) rows[6] => _,
            a7 = inout(reg) rows[7] => _,
            o = inout(reg) out => _,
            // z0–z19 (their v halves name them) and the predicates.
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _, out("v7") _, out("v8") _, out("v9") _, out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _, out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("p0") _,
            options(nostack),
    );
}

fn int8_smmla_pairs(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    let groups = (4 * k4).div_ceil(PAIR_GROUP);
    check(k4, a, lda, b, strip, GROUP * groups, acc);
    let vl = block_bytes();
    let rows = row_pointers(a, lda);
    // A block: 4 vectors of `vl / 16` column pairs (`vl / 8` columns) each.
    for c0 in (0..NR).step_by(vl / 2) {
        let w: [*const u8; 4] = std::array::from_fn(|j| column_at(b, strip, c0 + j * vl / 8, PAIR_GROUP));
        // SAFETY: SVE and i8mm were detected (`block_bytes`, the entry's
        // installation); each weight vector is `vl` bytes of one strip's
        // 128-byte group (`vl / 8` columns from a multiple of `vl / 8`),
        // `groups` groups inside the strip (`check`); full groups read 8
        // bytes of a row, a last half group 4, so `4 · k4` in all; the
        // block's 8 rows of `vl / 2` i32s lie in `acc`.
        unsafe { smmla_block(k4 / 2, k4 % 2 == 1, &rows, w, acc[c0..].as_mut_ptr()) }
    }
}

/// One `smmla` block: `out[i · 32 + j] = Σ_p row_i[p] · column_j[p]` for
/// 8 rows and the `VL / 2` columns of the four weight vectors at `w`, over
/// `full` groups of 8 values and, if `half`, a last group whose rows have
/// 4 (the weights' other 4 are the copy's zeros; the rows' are loaded as
/// zeros, so no byte past a row is read).
#[target_feature(enable = "sve,i8mm")]
unsafe fn smmla_block(full: usize, half: bool, rows: &[*const u8; MR], w: [*const u8; 4], out: *mut i32) {
    // z0–z15: accumulators, zN = row pair N / 4 by weight vector N % 4;
    // z16–z19: weights; z20–z23: the row pairs; z24–z27: scratch. p0: all
    // lanes; p1: the first 32-bit lane of each 64-bit element (`ld1rw`
    // under it zero-extends the half group's 4 values to 8).
    asm!(
            "ptrue p0.b",
            "ptrue p1.d",
            "mov z0.s, #0", "mov z1.s, #0", "mov z2.s, #0", "mov z3.s, #0",
            "mov z4.s, #0", "mov z5.s, #0", "mov z6.s, #0", "mov z7.s, #0",
            "mov z8.s, #0", "mov z9.s, #0", "mov z10.s, #0", "mov z11.s, #0",
            "mov z12.s, #0", "mov z13.s, #0", "mov z14.s, #0", "mov z15.s, #0",
            // `n` groups left, the last one half full if `half`.
            "2:",
            "subs {n}, {n}, #1",
            "b.ne 3f",
            "cbnz {half}, 4f",
            "3:",
            "ld1rd {{z20.d}}, p0/z, [{a0}]", "ld1rd {{z24.d}}, p0/z, [{a1}]",
            "ld1rd {{z21.d}}, p0/z, [{a2}]", "ld1rd {{z25.d}}, p0/z, [{a3}]",
            "ld1rd {{z22.d}}, p0/z, [{a4}]", "ld1rd {{z26.d}}, p0/z, [{a5}]",
            "ld1rd {{z23.d}}, p0/z, [{a6}]", "ld1rd {{z27.d}}, p0/z, [{a7}]",
            "add {a0}, {a0}, #8", "add {a1}, {a1}, #8", "add {a2}, {a2}, #8", "add {a3}, {a3}, #8",
            "add {a4}, {a4}, #8", "add {a5}, {a5}, #8", "add {a6}, {a6}, #8", "add {a7}, {a7}, #8",
            "b 5f",
            "4:",
            "ld1rw {{z20.s}}, p1/z, [{a0}]", "ld1rw {{z24.s}}, p1/z, [{a1}]",
            "ld1rw {{z21.s}}, p1/z, [{a2}]", "ld1rw {{z25.s}}, p1/z, [{a3}]",
            "ld1rw {{z22.s}}, p1/z, [{a4}]", "ld1rw {{z26.s}}, p1/z, [{a5}]",
            "ld1rw {{z23.s}}, p1/z, [{a6}]", "ld1rw {{z27.s}}, p1/z, [{a7}]",
            // The row pairs (two broadcast rows each, the upper row's 8
            // bytes first in every segment) times the 4 weight vectors.
            "5:",
            "trn1 z20.d, z20.d, z24.d", "trn1 z21.d, z21.d, z25.d",
            "trn1 z22.d, z22.d, z26.d", "trn1 z23.d, z23.d, z27.d",
            "ld1b {{z16.b}}, p0/z, [{w0}]", "ld1b {{z17.b}}, p0/z, [{w1}]",
            "ld1b {{z18.b}}, p0/z, [{w2}]", "ld1b {{z19.b}}, p0/z, [{w3}]",
            "add {w0}, {w0}, #128", "add {w1}, {w1}, #128", "add {w2}, {w2}, #128", "add {w3}, {w3}, #128",
            "smmla z0.s, z20.b, z16.b", "smmla z1.s, z20.b, z17.b", "smmla z2.s, z20.b, z18.b", "smmla z3.s, z20.b, z19.b",
            "smmla z4.s, z21.b, z16.b", "smmla z5.s, z21.b, z17.b", "smmla z6.s, z21.b, z18.b", "smmla z7.s, z21.b, z19.b",
            "smmla z8.s, z22.b, z16.b", "smmla z9.s, z22.b, z17.b", "smmla z10.s, z22.b, z18.b", "smmla z11.s, z22.b, z19.b",
            "smmla z12.s, z23.b, z16.b", "smmla z13.s, z23.b, z17.b", "smmla z14.s, z23.b, z18.b", "smmla z15.s, z23.b, z19.b",
            "cbnz {n}, 2b",
            // Row pair r: rows 2r, 2r + 1 at out + 256 r, + 128.
            "uzp1 z24.d, z0.d, z1.d", "uzp1 z25.d, z2.d, z3.d", "uzp2 z26.d, z0.d, z1.d", "uzp2 z27.d, z2.d, z3.d",
            "st1w {{z24.s}}, p0, [{o}]", "st1w {{z25.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z26.s}}, p0, [{o}]", "st1w {{z27.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "uzp1 z24.d, z4.d, z5.d", "uzp1 z25.d, z6.d, z7.d", "uzp2 z26.d, z4.d, z5.d", "uzp2 z27.d, z6.d, z7.d",
            "st1w {{z24.s}}, p0, [{o}]", "st1w {{z25.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z26.s}}, p0, [{o}]", "st1w {{z27.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "uzp1 z24.d, z8.d, z9.d", "uzp1 z25.d, z10.d, z11.d", "uzp2 z26.d, z8.d, z9.d", "uzp2 z27.d, z10.d, z11.d",
            "st1w {{z24.s}}, p0, [{o}]", "st1w {{z25.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z26.s}}, p0, [{o}]", "st1w {{z27.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "uzp1 z24.d, z12.d, z13.d", "uzp1 z25.d, z14.d, z15.d", "uzp2 z26.d, z12.d, z13.d", "uzp2 z27.d, z14.d, z15.d",
            "st1w {{z24.s}}, p0, [{o}]", "st1w {{z25.s}}, p0, [{o}, #1, mul vl]", "add {o}, {o}, #128",
            "st1w {{z26.s}}, p0, [{o}]", "st1w {{z27.s}}, p0, [{o}, #1, mul vl]",
            n = inout(reg) full + half as usize => _,
            half = in(reg) half as usize,
            w0 = inout(reg) w[0] => _,
            w1 = inout(reg) w[1] => _,
            w2 = inout(reg) w[2] => _,
            w3 = inout(reg) w[3] => _,
            a0 = inout(reg) rows[0] => _,
            a1 = inout(reg) rows[1] => _,
            a2 = inout(reg) rows[2] => _,
            a3 = inout(reg) rows[3] => _,
            a4 = inout(reg) rows[4] => _,
            a5 = inout(reg) rows[5] => _,
            a6 = inout(reg) rows[6] => _,
            a7 = inout(reg) rows[7] => _,
            o = inout(reg) out => _,
            // z0–z27 (their v halves name them) and the predicates.
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _, out("v7") _, out("v8") _, out("v9") _, out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _, out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _, out("v24") _, out("v25") _, out("v26") _, out("v27") _,
            out("p0") _, out("p1") _,
            options(nostack),
    );
}
