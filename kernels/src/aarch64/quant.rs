//! NEON integer kernels: the int8 GEMM (widening multiplies; `sdot` where
//! the CPU has the dot-product extension and `smmla` where it has the
//! int8 matrix multiply, both detected at run time), the weight-only
//! kernel, the row quantizer and the int8 depthwise row.
//!
//! Without `sdot`, `smull` multiplies 8 i8 pairs into i16 (exact: at most
//! 128·128) and `sadalp` adds neighbouring pairs into the i32 accumulators;
//! a final pairwise add gives each column's sum. `sdot` (not yet a stable
//! intrinsic, so through `asm!`) adds each column's four i8·i8 products
//! into its i32 lane directly. `smmla` (FEAT_I8MM, also through `asm!`)
//! multiplies a 2×8 block of two activation rows by an 8×2 block of two
//! weight columns into a 2×2 block of i32 sums: 32 products an
//! instruction where `sdot` makes 16. Both sum i8·i8 products exactly
//! (no saturation), so every variant gives the generic kernel's integers.

use crate::quant::{
    depthwise_bounds, pair_row, Acts, CopyKernel, CopyKind, DepthwiseFns, DepthwiseRow, Driver, QGemmUkr, QuantKernels,
    WoStrip, WoUkr, GENERIC_DRIVER, PAIR_GROUP, PIXELS,
};
use crate::table::Entry;
use std::arch::aarch64::*;

/// Bounds every int8 kernel relies on (see `QKernelFn`).
fn check(mr: usize, k4: usize, a: &[u8], lda: usize, b: &[u8], acc: &[i32]) {
    assert!(a.len() >= (mr - 1) * lda + 4 * k4, "qgemm: activation rows too short");
    assert!(b.len() >= 64 * k4, "qgemm: weight strip too short");
    assert!(acc.len() >= mr * 16, "qgemm: accumulator tile too small");
}

/// The driver's loops (quantizing activations, tile stores, the pair
/// image) are the generic ones, which the baseline build already compiles
/// to NEON; the depthwise row is this module's (the SVE entries share it).
pub(crate) const DRIVER: Driver =
    Driver { depthwise: DepthwiseFns { variant: "neon", pairs: pair_row, row: depthwise }, ..GENERIC_DRIVER };

const NEON_MR: usize = 2;

const INT8_NEON: QGemmUkr = QGemmUkr {
    variant: "neon_2x16",
    mr: NEON_MR,
    nr: 16,
    acts: Acts::I8,
    run: int8_neon,
    copy: None,
    window: None,
    driver: DRIVER,
};

fn int8_neon(k4: usize, a: &[u8], lda: usize, b: &[u8], _strip: usize, acc: &mut [i32]) {
    check(NEON_MR, k4, a, lda, b, acc);
    // SAFETY: NEON is baseline; `check` bounds every load.
    unsafe { int8_neon_inner(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

unsafe fn int8_neon_inner(k4: usize, a: *const u8, lda: usize, b: *const u8, acc: &mut [i32]) {
    // c[i][2u + h]: columns 4u + 2h, 4u + 2h + 1 of row i, two pair sums each.
    let mut c = [[vdupq_n_s32(0); 8]; NEON_MR];
    for t in 0..k4 {
        let bt = b.add(t * 64) as *const i8;
        let w = [vld1q_s8(bt), vld1q_s8(bt.add(16)), vld1q_s8(bt.add(32)), vld1q_s8(bt.add(48))];
        for (i, ci) in c.iter_mut().enumerate() {
            let quad = (a.add(i * lda + 4 * t) as *const u32).read_unaligned();
            let x = vreinterpret_s8_u32(vdup_n_u32(quad));
            for u in 0..4 {
                ci[2 * u] = vpadalq_s16(ci[2 * u], vmull_s8(vget_low_s8(w[u]), x));
                ci[2 * u + 1] = vpadalq_s16(ci[2 * u + 1], vmull_s8(vget_high_s8(w[u]), x));
            }
        }
    }
    for (i, ci) in c.iter().enumerate() {
        for u in 0..4 {
            // [c0:k01, c0:k23, c1:k01, c1:k23] + the next two columns, pairwise.
            vst1q_s32(acc.as_mut_ptr().add(i * 16 + 4 * u), vpaddq_s32(ci[2 * u], ci[2 * u + 1]));
        }
    }
}

const SDOT_MR: usize = 4;

const INT8_SDOT: QGemmUkr = QGemmUkr {
    variant: "neon_sdot_4x16",
    mr: SDOT_MR,
    nr: 16,
    acts: Acts::I8,
    run: int8_sdot,
    copy: None,
    window: None,
    driver: DRIVER,
};

fn int8_sdot(k4: usize, a: &[u8], lda: usize, b: &[u8], _strip: usize, acc: &mut [i32]) {
    check(SDOT_MR, k4, a, lda, b, acc);
    // SAFETY: the dot-product extension was detected before this entry was
    // installed; `check` bounds every load.
    unsafe { int8_sdot_inner(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

/// `acc.4s += w.16b · x.16b`, four bytes per lane.
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn sdot(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        x = in(vreg) x,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

#[target_feature(enable = "dotprod")]
unsafe fn int8_sdot_inner(k4: usize, a: *const u8, lda: usize, b: *const u8, acc: &mut [i32]) {
    let mut c = [[vdupq_n_s32(0); 4]; SDOT_MR];
    for t in 0..k4 {
        let bt = b.add(t * 64) as *const i8;
        let w = [vld1q_s8(bt), vld1q_s8(bt.add(16)), vld1q_s8(bt.add(32)), vld1q_s8(bt.add(48))];
        for (i, ci) in c.iter_mut().enumerate() {
            let quad = (a.add(i * lda + 4 * t) as *const u32).read_unaligned();
            let x = vreinterpretq_s8_u32(vdupq_n_u32(quad));
            for u in 0..4 {
                ci[u] = sdot(ci[u], w[u], x);
            }
        }
    }
    for (i, ci) in c.iter().enumerate() {
        for (u, v) in ci.iter().enumerate() {
            vst1q_s32(acc.as_mut_ptr().add(i * 16 + 4 * u), *v);
        }
    }
}

const I8MM_MR: usize = 4;

/// The i8mm entry: `smmla` on 4×16 tiles (2 row pairs × 8 column pairs,
/// 16 accumulators). It reads the weights' column-pairs copy (`pack.rs`),
/// made at pack time for this table; a weight packed for another table
/// has only the lanes, from which `run` builds the pairs with two zips.
const INT8_I8MM: QGemmUkr = QGemmUkr {
    variant: "neon_i8mm_4x16",
    mr: I8MM_MR,
    nr: 16,
    acts: Acts::I8,
    run: int8_i8mm,
    // From one row: a single row costs the sdot kernel a 4-row tile too.
    copy: Some(CopyKernel { kind: CopyKind::Pairs, run: int8_i8mm_pairs, min_rows: 1 }),
    window: None,
    driver: DRIVER,
};

fn int8_i8mm(k4: usize, a: &[u8], lda: usize, b: &[u8], _strip: usize, acc: &mut [i32]) {
    check(I8MM_MR, k4, a, lda, b, acc);
    // SAFETY: i8mm was detected before this entry was installed; `check`
    // bounds every load (a half group reads only its line and 4 row bytes).
    unsafe { int8_i8mm_inner::<false>(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

fn int8_i8mm_pairs(k4: usize, a: &[u8], lda: usize, b: &[u8], _strip: usize, acc: &mut [i32]) {
    let groups = (4 * k4).div_ceil(PAIR_GROUP);
    assert!(a.len() >= (I8MM_MR - 1) * lda + 4 * k4, "qgemm: activation rows too short");
    assert!(b.len() >= 128 * groups, "qgemm: paired weight strip too short");
    assert!(acc.len() >= I8MM_MR * 16, "qgemm: accumulator tile too small");
    // SAFETY: as for `int8_i8mm`; the paired strip holds whole groups.
    unsafe { int8_i8mm_inner::<true>(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

/// `acc.4s += a.16b · b.16bᵀ`: `a` two rows of 8 values, `b` two columns
/// of 8; lanes `[r0·c0, r0·c1, r1·c0, r1·c1]`.
#[inline]
#[target_feature(enable = "i8mm")]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Values `8g..8g + 8` of the row at `row`; in a half group (K's last 4
/// values) only 4 exist, and the rest are zero.
#[inline(always)]
unsafe fn row_group(row: *const u8, g: usize, half: bool) -> int8x8_t {
    if half {
        vcreate_s8((row.add(8 * g) as *const u32).read_unaligned() as u64)
    } else {
        vld1_s8(row.add(8 * g) as *const i8)
    }
}

/// Group `g`'s 8 column pairs from the lane layout: lane steps `2g` and
/// `2g + 1` hold each column's values `8g..8g + 4` and `8g + 4..8g + 8` in
/// the same 32-bit lane, so zipping the lanes of two 4-column vectors
/// gives two pairs of 8-value columns. A half group has no second step:
/// its values are zero (as the padded rows' are).
#[inline(always)]
unsafe fn lane_pairs(b: *const u8, g: usize, half: bool) -> [int8x16_t; 8] {
    let t = b.add(128 * g) as *const i32;
    let mut w = [vdupq_n_s8(0); 8];
    for u in 0..4 {
        let lo = vld1q_s32(t.add(4 * u));
        let hi = if half { vdupq_n_s32(0) } else { vld1q_s32(t.add(16 + 4 * u)) };
        w[2 * u] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
        w[2 * u + 1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
    }
    w
}

/// Group `g`'s 8 column pairs from the pairs copy, as stored.
#[inline(always)]
unsafe fn copy_pairs(b: *const u8, g: usize) -> [int8x16_t; 8] {
    let t = b.add(128 * g) as *const i8;
    let mut w = [vdupq_n_s8(0); 8];
    for (q, wq) in w.iter_mut().enumerate() {
        *wq = vld1q_s8(t.add(16 * q));
    }
    w
}

/// The 4×16 tile, K in groups of 8: `PAIRS` reads the pairs copy, else the
/// lanes ([`lane_pairs`]).
#[target_feature(enable = "i8mm")]
unsafe fn int8_i8mm_inner<const PAIRS: bool>(k4: usize, a: *const u8, lda: usize, b: *const u8, acc: &mut [i32]) {
    // c0[q], c1[q]: rows 0, 1 and rows 2, 3 by columns 2q, 2q + 1 (two
    // named arrays, not one indexed by a loop, so that they stay in
    // registers: 16 accumulators, 8 weight pairs, 2 row pairs).
    let (mut c0, mut c1) = ([vdupq_n_s32(0); 8], [vdupq_n_s32(0); 8]);
    for g in 0..k4.div_ceil(2) {
        let half = 2 * g + 1 == k4;
        let w = if PAIRS { copy_pairs(b, g) } else { lane_pairs(b, g, half) };
        let x0 = vcombine_s8(row_group(a, g, half), row_group(a.add(lda), g, half));
        let x1 = vcombine_s8(row_group(a.add(2 * lda), g, half), row_group(a.add(3 * lda), g, half));
        for ((c0q, c1q), &wq) in c0.iter_mut().zip(c1.iter_mut()).zip(&w) {
            *c0q = smmla(*c0q, x0, wq);
            *c1q = smmla(*c1q, x1, wq);
        }
    }
    for (h, ch) in [c0, c1].iter().enumerate() {
        for u in 0..4 {
            // Columns 4u..4u + 4: the low halves of two pair blocks are the
            // upper row's, the high halves the lower row's.
            let (l, r) = (vreinterpretq_s64_s32(ch[2 * u]), vreinterpretq_s64_s32(ch[2 * u + 1]));
            vst1q_s32(acc.as_mut_ptr().add(2 * h * 16 + 4 * u), vreinterpretq_s32_s64(vzip1q_s64(l, r)));
            vst1q_s32(acc.as_mut_ptr().add((2 * h + 1) * 16 + 4 * u), vreinterpretq_s32_s64(vzip2q_s64(l, r)));
        }
    }
}

/// The row quantizer, 8 lanes at a time: `fmaxnm` skips NaNs in the
/// maximum as `f32::max` does, `frintn` rounds half to even, and `fcvtzs`
/// maps NaN to 0 as Rust's saturating `as` does.
fn quantize(row: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(row.len(), out.len(), "quantize: row and output lengths differ");
    // SAFETY: NEON is baseline; lengths checked.
    unsafe { quantize_inner(row, out) }
}

unsafe fn quantize_inner(row: &[f32], out: &mut [i8]) -> f32 {
    let n = row.len();
    let body = n / 8 * 8;
    let mut vmax = vdupq_n_f32(0.0);
    for i in (0..body).step_by(4) {
        vmax = vmaxnmq_f32(vmax, vabsq_f32(vld1q_f32(row.as_ptr().add(i))));
    }
    let amax = row[body..].iter().fold(vmaxnmvq_f32(vmax), |m, &v| m.max(v.abs()));
    let s = (amax / 127.5).max(f32::EPSILON);
    let inv = 1.0 / s;
    let (lo, hi) = (vdupq_n_f32(-128.0), vdupq_n_f32(127.0));
    let q4 = |v: float32x4_t| vcvtq_s32_f32(vminq_f32(vmaxq_f32(vrndnq_f32(vmulq_n_f32(v, inv)), lo), hi));
    for i in (0..body).step_by(8) {
        let a = q4(vld1q_f32(row.as_ptr().add(i)));
        let b = q4(vld1q_f32(row.as_ptr().add(i + 4)));
        let q16 = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
        vst1_s8(out.as_mut_ptr().add(i), vqmovn_s16(q16));
    }
    for (o, &v) in out[body..].iter_mut().zip(&row[body..]) {
        *o = (v * inv).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    s
}

const WO_MR: usize = 2;

const WEIGHT_ONLY: WoUkr = WoUkr { variant: "neon_2x16", mr: WO_MR, lane_groups: true, run: weight_only };

fn weight_only(s: &WoStrip<'_>, x: &[f32], ldx: usize, rows: usize, bias: &[f32; 16], out: &mut [f32]) {
    let lane = crate::quant::lane_of(s.bits);
    assert!((1..=WO_MR).contains(&rows) && s.group.is_multiple_of(lane) && s.groups * s.group == s.k);
    assert!(x.len() >= (rows - 1) * ldx + s.k && out.len() >= rows * 16);
    assert!(s.w.len() >= s.k / lane * 64 && s.scales.len() >= s.groups * 16);
    assert!(s.zps.is_none_or(|z| z.len() >= s.groups * 16));
    // SAFETY: NEON is baseline; the asserts bound every access.
    unsafe {
        match rows {
            1 => weight_only_inner::<1>(s, x.as_ptr(), ldx, bias, out),
            _ => weight_only_inner::<2>(s, x.as_ptr(), ldx, bias, out),
        }
    }
}

/// One value `p` of a lane step for 16 columns (see the AVX2 kernel).
#[inline(always)]
unsafe fn lane_value<const UP: i32, const DOWN: i32, const R: usize>(
    v: &[int32x4_t; 4],
    zp: &[int32x4_t; 4],
    x: *const f32,
    ldx: usize,
    p: usize,
    acc: &mut [[float32x4_t; 4]; R],
) {
    let f: [float32x4_t; 4] =
        [0, 1, 2, 3].map(|u| vcvtq_f32_s32(vsubq_s32(vshrq_n_s32::<DOWN>(vshlq_n_s32::<UP>(v[u])), zp[u])));
    for (i, a) in acc.iter_mut().enumerate() {
        let xv = *x.add(i * ldx + p);
        for u in 0..4 {
            a[u] = vfmaq_n_f32(a[u], f[u], xv);
        }
    }
}

unsafe fn weight_only_inner<const R: usize>(
    s: &WoStrip<'_>,
    x: *const f32,
    ldx: usize,
    bias: &[f32; 16],
    out: &mut [f32],
) {
    let int4 = s.bits == crate::quant::QBits::I4;
    let lane = if int4 { 8usize } else { 4usize };
    let steps = s.group / lane;
    let bias4 = [0, 1, 2, 3].map(|u| vld1q_f32(bias.as_ptr().add(4 * u)));
    let mut total = [bias4; R];
    for g in 0..s.groups {
        let zp = match s.zps {
            Some(z) => {
                let v = vld1q_s8(z.as_ptr().add(g * 16));
                let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_s8(vget_high_s8(v)));
                [
                    vmovl_s16(vget_low_s16(lo)),
                    vmovl_s16(vget_high_s16(lo)),
                    vmovl_s16(vget_low_s16(hi)),
                    vmovl_s16(vget_high_s16(hi)),
                ]
            }
            None => [vdupq_n_s32(0); 4],
        };
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        for t in g * steps..(g + 1) * steps {
            let wt = s.w.as_ptr().add(t * 64) as *const i32;
            let v = [vld1q_s32(wt), vld1q_s32(wt.add(4)), vld1q_s32(wt.add(8)), vld1q_s32(wt.add(12))];
            let p = t * lane;
            if int4 {
                lane_value::<28, 28, R>(&v, &zp, x, ldx, p, &mut acc);
                lane_value::<24, 28, R>(&v, &zp, x, ldx, p + 1, &mut acc);
                lane_value::<20, 28, R>(&v, &zp, x, ldx, p + 2, &mut acc);
                lane_value::<16, 28, R>(&v, &zp, x, ldx, p + 3, &mut acc);
                lane_value::<12, 28, R>(&v, &zp, x, ldx, p + 4, &mut acc);
                lane_value::<8, 28, R>(&v, &zp, x, ldx, p + 5, &mut acc);
                lane_value::<4, 28, R>(&v, &zp, x, ldx, p + 6, &mut acc);
                lane_value::<0, 28, R>(&v, &zp, x, ldx, p + 7, &mut acc);
            } else {
                lane_value::<24, 24, R>(&v, &zp, x, ldx, p, &mut acc);
                lane_value::<16, 24, R>(&v, &zp, x, ldx, p + 1, &mut acc);
                lane_value::<8, 24, R>(&v, &zp, x, ldx, p + 2, &mut acc);
                lane_value::<0, 24, R>(&v, &zp, x, ldx, p + 3, &mut acc);
            }
        }
        let sc = s.scales.as_ptr().add(g * 16);
        for (t, a) in total.iter_mut().zip(&acc) {
            for u in 0..4 {
                // total += scale · dot, unfused, as the generic kernel rounds it.
                t[u] = vaddq_f32(t[u], vmulq_f32(vld1q_f32(sc.add(4 * u)), a[u]));
            }
        }
    }
    for (i, t) in total.iter().enumerate() {
        for (u, v) in t.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(i * 16 + 4 * u), *v);
        }
    }
}

/// Channels per depthwise block: two vectors of pair lanes.
const DW_CHANNELS: usize = 8;

/// The depthwise row ([`crate::quant::depthwise_row`]): per block of
/// [`PIXELS`] output pixels and 8 channels, the two weight-pair vectors
/// loaded per term serve every pixel. A pair lane holds two i16 values;
/// `smlal`/`smlal2` multiply each into its own i32 (exact), so a
/// channel's two taps land in neighbouring lanes of one accumulator, and
/// one pairwise add (`addp`) after the last term gives the channel's sum —
/// the same integer as the portable `pair_dot` sums, whose order integer
/// addition does not see. The epilogue (scale, bias, clamp, and the
/// output's quantization) runs in registers, the portable loops'
/// operations in their order: unfused multiplies and adds, the clamp as
/// two comparisons with selects (a NaN or a −0 passes as in
/// `finish_row`; `fmax`/`fmin` would turn −0 into +0), rounding half to
/// even (`frintn`) and NaN to 0 (`fcvtzs`) as `quantize_value` does.
fn depthwise(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    depthwise_bounds(job, base, out, q);
    // SAFETY: NEON is baseline; the bounds checked above hold every load
    // (a block's 8 lanes end at or before `Cp`, a multiple of 16) and
    // every store (`ow · c` values, tails through a stack buffer).
    unsafe { depthwise_inner(job, base, out, q) }
}

unsafe fn depthwise_inner(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    let ow = out.len() / job.channels;
    let mut ox = 0;
    while ox < ow {
        match ow - ox {
            1 => depthwise_block::<1>(job, base, ox, out, q),
            2 => depthwise_block::<2>(job, base, ox, out, q),
            3 => depthwise_block::<3>(job, base, ox, out, q),
            _ => depthwise_block::<PIXELS>(job, base, ox, out, q),
        }
        ox += PIXELS;
    }
}

#[inline(always)]
unsafe fn depthwise_block<const P: usize>(
    job: &DepthwiseRow<'_>,
    base: usize,
    ox: usize,
    out: &mut [f32],
    q: &mut [i8],
) {
    let (c, cp, step) = (job.channels, job.cp, job.step);
    let (img, wts) = (job.img.as_ptr(), job.weights.as_ptr());
    let s = vdupq_n_f32(job.s);
    let clamp = job.clamp.map(|(lo, hi)| (vdupq_n_f32(lo), vdupq_n_f32(hi)));
    let (inv, zp) = match job.quant {
        Some((os, ozp)) => (1.0 / os, ozp as f32),
        None => (1.0, 0.0),
    };
    let (inv, zp) = (vdupq_n_f32(inv), vdupq_n_f32(zp));
    let (qlo, qhi) = (vdupq_n_f32(-128.0), vdupq_n_f32(127.0));
    for c0 in (0..c).step_by(DW_CHANNELS) {
        // acc[p][2h + k]: channels c0 + 4h + 2k, + 1 (two products each).
        let mut acc = [[vdupq_n_s32(0); 4]; P];
        for (t, &o) in job.offs.iter().enumerate() {
            let wt = wts.add(t * cp + c0) as *const i16;
            let w = [vld1q_s16(wt), vld1q_s16(wt.add(8))];
            let x = img.add(base + ox * step + o + c0);
            for (p, a) in acc.iter_mut().enumerate() {
                let xp = x.add(p * step) as *const i16;
                for h in 0..2 {
                    let xv = vld1q_s16(xp.add(8 * h));
                    a[2 * h] = vmlal_s16(a[2 * h], vget_low_s16(xv), vget_low_s16(w[h]));
                    a[2 * h + 1] = vmlal_high_s16(a[2 * h + 1], xv, w[h]);
                }
            }
        }
        let cb = DW_CHANNELS.min(c - c0);
        let (sc, bias) = (job.scales.as_ptr().add(c0), job.bias.as_ptr().add(c0));
        let sc = [vld1q_f32(sc), vld1q_f32(sc.add(4))];
        let bias = [vld1q_f32(bias), vld1q_f32(bias.add(4))];
        for (p, a) in acc.iter().enumerate() {
            let at = (ox + p) * c + c0;
            let v: [float32x4_t; 2] = std::array::from_fn(|h| {
                let sum = vpaddq_s32(a[2 * h], a[2 * h + 1]);
                // (f32(sum) · s) · scale + bias, then the clamp kernel's
                // comparisons: `v < lo ? lo : v`, then `x > hi ? hi : x`.
                let mut v = vmulq_f32(vmulq_f32(vcvtq_f32_s32(sum), s), sc[h]);
                if job.has_bias {
                    v = vaddq_f32(v, bias[h]);
                }
                match clamp {
                    Some((lo, hi)) => {
                        let x = vbslq_f32(vcltq_f32(v, lo), lo, v);
                        vbslq_f32(vcgtq_f32(x, hi), hi, x)
                    }
                    None => v,
                }
            });
            if job.quant.is_some() {
                // `quantize_value`: rint(v · inv) + zp (half to even),
                // clamped to [-128, 127] (`fmax`/`fmin` keep a NaN), NaN to 0.
                let qv: [int32x4_t; 2] = std::array::from_fn(|h| {
                    let r = vaddq_f32(vrndnq_f32(vmulq_f32(v[h], inv)), zp);
                    vcvtq_s32_f32(vminq_f32(vmaxq_f32(r, qlo), qhi))
                });
                let q8 = vqmovn_s16(vcombine_s16(vqmovn_s32(qv[0]), vqmovn_s32(qv[1])));
                if cb == DW_CHANNELS {
                    vst1_s8(q.as_mut_ptr().add(at), q8);
                } else {
                    let mut tmp = [0i8; DW_CHANNELS];
                    vst1_s8(tmp.as_mut_ptr(), q8);
                    q[at..at + cb].copy_from_slice(&tmp[..cb]);
                }
            } else if cb == DW_CHANNELS {
                vst1q_f32(out.as_mut_ptr().add(at), v[0]);
                vst1q_f32(out.as_mut_ptr().add(at + 4), v[1]);
            } else {
                let mut tmp = [0f32; DW_CHANNELS];
                vst1q_f32(tmp.as_mut_ptr(), v[0]);
                vst1q_f32(tmp.as_mut_ptr().add(4), v[1]);
                out[at..at + cb].copy_from_slice(&tmp[..cb]);
            }
        }
    }
}

/// The NEON and SVE variants, lowest first: plain NEON, then `sdot` when
/// the CPU has the dot-product extension, SVE `sdot` where it has SVE (with
/// a vector length the SVE kernels take, `sve_quant::supported`), NEON
/// `smmla` when it has the int8 matrix multiply (FEAT_I8MM; Linux reports
/// it as HWCAP2_I8MM, which `is_aarch64_feature_detected!("i8mm")` reads),
/// then SVE `smmla` where it has SVE's int8 matrix multiply too
/// (`sve_quant::has_sve_i8mm`). The SVE entries keep NEON's
/// weight-only kernel and quantizer.
pub(crate) fn variants() -> Vec<QuantKernels> {
    let neon = QuantKernels {
        name: "neon",
        int8: INT8_NEON,
        weight_only: WEIGHT_ONLY,
        quantize: Entry::new("neon", quantize),
    };
    let mut all = vec![neon];
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        all.push(QuantKernels { name: "neon_dotprod", int8: INT8_SDOT, ..neon });
    }
    let sve = super::sve_quant::supported();
    if sve {
        all.push(QuantKernels { name: "sve_dotprod", int8: super::sve_quant::INT8_SDOT, ..neon });
    }
    if std::arch::is_aarch64_feature_detected!("i8mm") {
        all.push(QuantKernels { name: "neon_i8mm", int8: INT8_I8MM, ..neon });
        if sve && super::sve_quant::has_sve_i8mm() {
            all.push(QuantKernels { name: "sve_i8mm", int8: super::sve_quant::INT8_I8MM, ..neon });
        }
    }
    all
}
