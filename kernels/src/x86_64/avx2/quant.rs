//! AVX2 integer kernels: the int8 GEMM (plain AVX2 and AVX-VNNI), the
//! weight-only kernel and the row quantizer. Installed only after run-time
//! detection (`x86_64::quant_variants`).
//!
//! Plain AVX2 has no exact u8·i8 dot product: `vpmaddubsw` adds two u8·i8
//! products into a saturating i16, and `255 · 127 · 2` (or, with the sign
//! moved onto the other operand, the `-128` corner) overflows it. So the
//! AVX2 kernel multiplies i16 pairs with `vpmaddwd` (into i32), exact for
//! every input: the driver stores the activations as i16 ([`Acts::I16`]);
//! the weights are widened to i16 once at pack time where the table's
//! entry is this one (`PackedQWeights::pack_for`), else sign-extended in
//! the loop. AVX-VNNI's `vpdpbusd`
//! multiplies u8 by i8 into i32 exactly: activations are stored as
//! `q + 128` and the driver subtracts `128 · Σ_p w` per column.

use crate::quant::{
    depthwise_bounds, Acts, CopyKernel, CopyKind, DepthwiseFns, DepthwiseRow, Driver, Epilogue, QGemmUkr, QTile,
    WoStrip, WoUkr, BLOCK, PIXELS,
};
use std::arch::x86_64::*;

/// Bounds every kernel below relies on: `mr` rows of `4·k4` bytes at
/// stride `lda`, and `nr / 16` strips of `k4 · 64` bytes `strip` apart.
#[allow(clippy::too_many_arguments)]
fn check(mr: usize, nr: usize, k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &[i32]) {
    assert!(a.len() >= (mr - 1) * lda + 4 * k4, "qgemm: activation rows too short");
    assert!(b.len() >= (nr / 16 - 1) * strip + 64 * k4, "qgemm: weight strips too short");
    assert!(acc.len() >= mr * nr, "qgemm: accumulator tile too small");
}

/// The integer driver's loops (quantizing activations, storing tiles)
/// compiled for AVX2: at the baseline x86-64 level they ran 4 lanes wide
/// and emulated the i32 multiply, ~40 % of an int8 MobileNetV2's time.
/// Every x86 entry uses it (each needs AVX2).
pub(crate) const DRIVER: Driver =
    Driver { encode, store, store_q, depthwise: DepthwiseFns { variant: "avx2", pairs, row: depthwise } };

fn pairs(src: &[i8], zp: i32, c: usize, left: usize, every: usize, dst: &mut [i32]) {
    // SAFETY: as for `encode`.
    unsafe { pairs_avx2(src, zp, c, left, every, dst) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn pairs_avx2(src: &[i8], zp: i32, c: usize, left: usize, every: usize, dst: &mut [i32]) {
    crate::quant::pair_row(src, zp, c, left, every, dst)
}

/// The depthwise row ([`crate::quant::depthwise_row`]): per block of
/// [`PIXELS`] output pixels and 16 channels, two weight-pair vectors
/// loaded per term serve every pixel, whose sums stay in registers
/// (`vpmaddwd` on the pair lanes, exact, then `vpaddd`); the epilogue
/// (scale, bias, clamp, and the output's quantization) runs on them there,
/// the portable loops' operations in their order.
fn depthwise(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    depthwise_bounds(job, base, out, q);
    // SAFETY: AVX2 was detected before this entry was installed; the
    // bounds checked above hold every load (a block's 16 lanes end at or
    // before `Cp`) and every store (`ow · c` values).
    unsafe { depthwise_avx2(job, base, out, q) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_avx2(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    let c = job.channels;
    let ow = out.len() / c;
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

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn depthwise_block<const P: usize>(
    job: &DepthwiseRow<'_>,
    base: usize,
    ox: usize,
    out: &mut [f32],
    q: &mut [i8],
) {
    let (c, cp, step) = (job.channels, job.cp, job.step);
    let (img, wts) = (job.img.as_ptr(), job.weights.as_ptr());
    let s = _mm256_set1_ps(job.s);
    let (lo, hi) = job.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let (inv, zp) = match job.quant {
        Some((os, ozp)) => (1.0 / os, ozp as f32),
        None => (1.0, 0.0),
    };
    let (inv, zp) = (_mm256_set1_ps(inv), _mm256_set1_ps(zp));
    let (qlo, qhi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    for c0 in (0..c).step_by(BLOCK) {
        let mut acc = [[_mm256_setzero_si256(); 2]; P];
        for (t, &o) in job.offs.iter().enumerate() {
            let wt = wts.add(t * cp + c0);
            let w0 = _mm256_loadu_si256(wt as *const __m256i);
            let w1 = _mm256_loadu_si256(wt.add(8) as *const __m256i);
            let x = img.add(base + ox * step + o + c0);
            for (p, a) in acc.iter_mut().enumerate() {
                let xp = x.add(p * step);
                a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(_mm256_loadu_si256(xp as *const __m256i), w0));
                a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(_mm256_loadu_si256(xp.add(8) as *const __m256i), w1));
            }
        }
        let cb = BLOCK.min(c - c0);
        let sc = [_mm256_loadu_ps(job.scales.as_ptr().add(c0)), _mm256_loadu_ps(job.scales.as_ptr().add(c0 + 8))];
        let bias = [_mm256_loadu_ps(job.bias.as_ptr().add(c0)), _mm256_loadu_ps(job.bias.as_ptr().add(c0 + 8))];
        for (p, a) in acc.iter().enumerate() {
            let at = (ox + p) * c + c0;
            let v: [__m256; 2] = std::array::from_fn(|h| {
                // (f32(sum) · s) · scale + bias, then the clamp kernel's
                // comparisons (`maxps(lo, v)` keeps a NaN `v`).
                let mut v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a[h]), s), sc[h]);
                if job.has_bias {
                    v = _mm256_add_ps(v, bias[h]);
                }
                _mm256_min_ps(hi, _mm256_max_ps(lo, v))
            });
            if job.quant.is_some() {
                // `quantize_value`: rint(v · inv) + zp (half to even),
                // clamped to [-128, 127], NaN to 0.
                let qv: [__m256i; 2] = std::array::from_fn(|h| {
                    let r = _mm256_add_ps(
                        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[h], inv)),
                        zp,
                    );
                    let clamped = _mm256_min_ps(_mm256_max_ps(r, qlo), qhi);
                    _mm256_cvttps_epi32(_mm256_and_ps(clamped, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r)))
                });
                let q16 = _mm256_permute4x64_epi64::<0xd8>(_mm256_packs_epi32(qv[0], qv[1]));
                let q8 = _mm_packs_epi16(_mm256_castsi256_si128(q16), _mm256_extracti128_si256::<1>(q16));
                if cb == BLOCK {
                    _mm_storeu_si128(q.as_mut_ptr().add(at) as *mut __m128i, q8);
                } else {
                    let mut tmp = [0i8; BLOCK];
                    _mm_storeu_si128(tmp.as_mut_ptr() as *mut __m128i, q8);
                    q[at..at + cb].copy_from_slice(&tmp[..cb]);
                }
            } else if cb == BLOCK {
                _mm256_storeu_ps(out.as_mut_ptr().add(at), v[0]);
                _mm256_storeu_ps(out.as_mut_ptr().add(at + 8), v[1]);
            } else {
                let mut tmp = [0f32; BLOCK];
                _mm256_storeu_ps(tmp.as_mut_ptr(), v[0]);
                _mm256_storeu_ps(tmp.as_mut_ptr().add(8), v[1]);
                out[at..at + cb].copy_from_slice(&tmp[..cb]);
            }
        }
    }
}

fn encode(acts: Acts, src: &[f32], s: f32, zp: i32, dst: &mut [u8]) {
    // SAFETY: the x86 entries are installed after AVX2 and FMA were detected.
    unsafe { encode_avx2(acts, src, s, zp, dst) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn encode_avx2(acts: Acts, src: &[f32], s: f32, zp: i32, dst: &mut [u8]) {
    crate::quant::encode_quantized(acts, src, s, zp, dst)
}

fn store(o: &mut [f32], acc: &[i32], s: f32, e: &Epilogue<'_>, shift: i32) {
    // SAFETY: as for `encode`.
    unsafe { store_avx2(o, acc, s, e, shift) }
}

/// # Safety
/// [`crate::quant::store_tile_quantized`]'s contract.
unsafe fn store_q(t: &QTile<'_>) {
    // SAFETY: as for `encode`; the tile's contract is the caller's.
    unsafe { store_q_avx2(t) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn store_q_avx2(t: &QTile<'_>) {
    // SAFETY: the tile's contract is the caller's.
    unsafe { crate::quant::store_tile_quantized(t) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn store_avx2(o: &mut [f32], acc: &[i32], s: f32, e: &Epilogue<'_>, shift: i32) {
    crate::quant::store_row(o, acc, s, e, shift)
}

const AVX2_MR: usize = 2;

/// Fewest rows for which the driver's `multiply` reads the i16 weight
/// copy: below, the layer is bound by reading the weights, and the i8
/// ones are half the bytes (decode steps stay on them). Measured with
/// plain AVX2 (Zen 4): 16 × 4096 × 4096 ran in 0.93× the time on the i8
/// weights, 64 × 1024 × 1024 in 0.9× on the i16 ones
/// (`kernels/examples/q8_ab.rs`).
const WIDE_MIN_ROWS: usize = 32;

/// The plain AVX2 int8 entry (`vpmaddwd` on i16 activations and i16
/// weights: sign-extended in the loop, or widened once at pack time).
pub(crate) const INT8_AVX2: QGemmUkr = QGemmUkr {
    variant: "avx2_2x16",
    mr: AVX2_MR,
    nr: 16,
    acts: Acts::I16,
    run: int8_avx2,
    copy: Some(CopyKernel { kind: CopyKind::Wide, run: int8_avx2_wide, min_rows: WIDE_MIN_ROWS }),
    window: None,
    driver: DRIVER,
};

fn int8_avx2(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    check(AVX2_MR, 16, k4, a, lda, b, strip, acc);
    assert!(a.len() >= (AVX2_MR - 1) * lda + 8 * k4, "qgemm: i16 activation rows too short");
    // SAFETY: AVX2 was detected before this entry was installed; the
    // asserts bound every load.
    unsafe { int8_avx2_inner::<false>(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

/// [`int8_avx2`] on the weights widened to i16 at pack time (lane steps of
/// 128 bytes).
fn int8_avx2_wide(k4: usize, a: &[u8], lda: usize, b: &[u8], _strip: usize, acc: &mut [i32]) {
    assert!(a.len() >= (AVX2_MR - 1) * lda + 8 * k4, "qgemm: i16 activation rows too short");
    assert!(b.len() >= 128 * k4, "qgemm: i16 weight strip too short");
    assert!(acc.len() >= AVX2_MR * 16, "qgemm: accumulator tile too small");
    // SAFETY: AVX2 was detected before this entry was installed; the
    // asserts bound every load.
    unsafe { int8_avx2_inner::<true>(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

/// 2 rows × 16 columns: eight accumulators (`c[i][u]`: columns 4u..4u+4
/// of row i, two pair sums per column), two broadcast rows and a weight
/// quarter. Two rows, not three: three rows' twelve accumulators, three
/// broadcasts, a weight and the product need seventeen ymm registers, and
/// the spilled accumulator's store-to-load chain made that kernel no
/// faster than the f32 GEMM (`vpmaddwd` and FMA share the two multiply
/// pipes; the adds should go to the others). `WIDE`: the weights are i16
/// already (one load per quarter, 128 bytes a lane step), else i8 and
/// sign-extended here (64 bytes a lane step).
#[target_feature(enable = "avx2")]
unsafe fn int8_avx2_inner<const WIDE: bool>(k4: usize, a: *const u8, lda: usize, b: *const u8, acc: &mut [i32]) {
    let mut c = [[_mm256_setzero_si256(); 4]; AVX2_MR];
    let step = if WIDE { 128 } else { 64 };
    for t in 0..k4 {
        let bt = b.add(t * step);
        // Row i's four i16 values of this lane step, in every 64-bit lane.
        let x: [__m256i; AVX2_MR] =
            std::array::from_fn(|i| _mm256_set1_epi64x((a.add(i * lda + 8 * t) as *const i64).read_unaligned()));
        for u in 0..4 {
            let w = if WIDE {
                _mm256_loadu_si256(bt.add(32 * u) as *const __m256i)
            } else {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(bt.add(16 * u) as *const __m128i))
            };
            for (ci, xi) in c.iter_mut().zip(&x) {
                ci[u] = _mm256_add_epi32(ci[u], _mm256_madd_epi16(w, *xi));
            }
        }
    }
    for (i, ci) in c.iter().enumerate() {
        for h in 0..2 {
            // hadd gives columns [0 1 4 5 | 2 3 6 7] of the pair; the
            // permute puts them in order.
            let sums = _mm256_permute4x64_epi64::<0xd8>(_mm256_hadd_epi32(ci[2 * h], ci[2 * h + 1]));
            _mm256_storeu_si256(acc.as_mut_ptr().add(i * 16 + 8 * h) as *mut __m256i, sums);
        }
    }
}

const VNNI_MR: usize = 6;

/// The AVX-VNNI int8 entry (`vpdpbusd` on ymm, u8-offset activations).
pub(crate) const INT8_AVX_VNNI: QGemmUkr = QGemmUkr {
    variant: "avx_vnni_6x16",
    mr: VNNI_MR,
    nr: 16,
    acts: Acts::U8Offset,
    run: int8_avx_vnni,
    copy: None,
    window: None,
    driver: DRIVER,
};

fn int8_avx_vnni(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    check(VNNI_MR, 16, k4, a, lda, b, strip, acc);
    // SAFETY: AVX-VNNI was detected before this entry was installed;
    // `check` bounds every load.
    unsafe { int8_avx_vnni_inner(k4, a.as_ptr(), lda, b.as_ptr(), acc) }
}

#[target_feature(enable = "avx2,avxvnni")]
unsafe fn int8_avx_vnni_inner(k4: usize, a: *const u8, lda: usize, b: *const u8, acc: &mut [i32]) {
    let mut c = [[_mm256_setzero_si256(); 2]; VNNI_MR];
    for t in 0..k4 {
        let bt = b.add(t * 64);
        let w0 = _mm256_loadu_si256(bt as *const __m256i);
        let w1 = _mm256_loadu_si256(bt.add(32) as *const __m256i);
        for (i, ci) in c.iter_mut().enumerate() {
            let x = _mm256_set1_epi32((a.add(i * lda + 4 * t) as *const i32).read_unaligned());
            ci[0] = _mm256_dpbusd_avx_epi32(ci[0], x, w0);
            ci[1] = _mm256_dpbusd_avx_epi32(ci[1], x, w1);
        }
    }
    for (i, ci) in c.iter().enumerate() {
        _mm256_storeu_si256(acc.as_mut_ptr().add(i * 16) as *mut __m256i, ci[0]);
        _mm256_storeu_si256(acc.as_mut_ptr().add(i * 16 + 8) as *mut __m256i, ci[1]);
    }
}

/// [`crate::quant::quantize_row_i8`] with [`crate::quant::row_scale_symmetric`]'s
/// scale, 8 lanes at a time: the maximum is exact, the product, rounding
/// (half to even) and clamp are the same IEEE operations, and NaN maps to
/// 0 as Rust's saturating `as i8` does.
pub(crate) fn quantize(row: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(row.len(), out.len(), "quantize: row and output lengths differ");
    // SAFETY: AVX2 was detected before this entry was installed; lengths checked.
    unsafe { quantize_inner(row, out) }
}

#[target_feature(enable = "avx2")]
unsafe fn quantize_inner(row: &[f32], out: &mut [i8]) -> f32 {
    let n = row.len();
    let body = n / 8 * 8;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut vmax = _mm256_setzero_ps();
    for i in (0..body).step_by(8) {
        let v = _mm256_and_ps(_mm256_loadu_ps(row.as_ptr().add(i)), abs_mask);
        // maxps returns its second operand when either is NaN: NaNs are skipped.
        vmax = _mm256_max_ps(v, vmax);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
    let amax = lanes.iter().chain(&row[body..]).fold(0f32, |m, &v| m.max(v.abs()));
    let s = (amax / 127.5).max(f32::EPSILON);
    let inv = 1.0 / s;
    let vinv = _mm256_set1_ps(inv);
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    for i in (0..body).step_by(8) {
        let p = _mm256_mul_ps(_mm256_loadu_ps(row.as_ptr().add(i)), vinv);
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p);
        let clamped = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
        let q = _mm256_and_ps(clamped, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
        let q = _mm256_cvttps_epi32(q);
        let q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
        _mm_storel_epi64(out.as_mut_ptr().add(i) as *mut __m128i, _mm_packs_epi16(q16, q16));
    }
    for (o, &v) in out[body..].iter_mut().zip(&row[body..]) {
        *o = (v * inv).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    s
}

const WO_MR: usize = 4;

/// The AVX2 + FMA weight-only entry: 16 columns (two ymm) by up to four rows.
pub(crate) const WEIGHT_ONLY: WoUkr =
    WoUkr { variant: "avx2_fma_4x16", mr: WO_MR, lane_groups: true, run: weight_only };

fn weight_only(s: &WoStrip<'_>, x: &[f32], ldx: usize, rows: usize, bias: &[f32; 16], out: &mut [f32]) {
    let lane = crate::quant::lane_of(s.bits);
    assert!((1..=WO_MR).contains(&rows) && s.group.is_multiple_of(lane) && s.groups * s.group == s.k);
    assert!(x.len() >= (rows - 1) * ldx + s.k && out.len() >= rows * 16);
    assert!(s.w.len() >= s.k / lane * 64 && s.scales.len() >= s.groups * 16);
    assert!(s.zps.is_none_or(|z| z.len() >= s.groups * 16));
    // SAFETY: AVX2 and FMA were detected before this entry was installed;
    // the asserts bound every access.
    unsafe {
        match rows {
            1 => weight_only_inner::<1>(s, x.as_ptr(), ldx, bias, out),
            2 => weight_only_inner::<2>(s, x.as_ptr(), ldx, bias, out),
            3 => weight_only_inner::<3>(s, x.as_ptr(), ldx, bias, out),
            _ => weight_only_inner::<4>(s, x.as_ptr(), ldx, bias, out),
        }
    }
}

/// One value `p` of a lane step for 16 columns: the value sits at bits
/// `32 - UP - (32 - DOWN)..`: shift it to the top, arithmetic-shift it down
/// (immediate shifts: one µop each), subtract the zero points, convert, and
/// accumulate `x[i][p] · w` into every row.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn lane_value<const UP: i32, const DOWN: i32, const R: usize>(
    v: [__m256i; 2],
    zp: [__m256i; 2],
    x: *const f32,
    ldx: usize,
    p: usize,
    acc: &mut [[__m256; 2]; R],
) {
    let q0 = _mm256_sub_epi32(_mm256_srai_epi32::<DOWN>(_mm256_slli_epi32::<UP>(v[0])), zp[0]);
    let q1 = _mm256_sub_epi32(_mm256_srai_epi32::<DOWN>(_mm256_slli_epi32::<UP>(v[1])), zp[1]);
    let (f0, f1) = (_mm256_cvtepi32_ps(q0), _mm256_cvtepi32_ps(q1));
    for (i, a) in acc.iter_mut().enumerate() {
        let xv = _mm256_set1_ps(*x.add(i * ldx + p));
        a[0] = _mm256_fmadd_ps(xv, f0, a[0]);
        a[1] = _mm256_fmadd_ps(xv, f1, a[1]);
    }
}

#[target_feature(enable = "avx2,fma")]
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
    let mut total = [[_mm256_setzero_ps(); 2]; R];
    for t in total.iter_mut() {
        t[0] = _mm256_loadu_ps(bias.as_ptr());
        t[1] = _mm256_loadu_ps(bias.as_ptr().add(8));
    }
    for g in 0..s.groups {
        let zp = match s.zps {
            Some(z) => {
                let zg = z.as_ptr().add(g * 16);
                [
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(zg as *const __m128i)),
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(zg.add(8) as *const __m128i)),
                ]
            }
            None => [_mm256_setzero_si256(); 2],
        };
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for t in g * steps..(g + 1) * steps {
            let wt = s.w.as_ptr().add(t * 64);
            let v = [_mm256_loadu_si256(wt as *const __m256i), _mm256_loadu_si256(wt.add(32) as *const __m256i)];
            let p = t * lane;
            if int4 {
                lane_value::<28, 28, R>(v, zp, x, ldx, p, &mut acc);
                lane_value::<24, 28, R>(v, zp, x, ldx, p + 1, &mut acc);
                lane_value::<20, 28, R>(v, zp, x, ldx, p + 2, &mut acc);
                lane_value::<16, 28, R>(v, zp, x, ldx, p + 3, &mut acc);
                lane_value::<12, 28, R>(v, zp, x, ldx, p + 4, &mut acc);
                lane_value::<8, 28, R>(v, zp, x, ldx, p + 5, &mut acc);
                lane_value::<4, 28, R>(v, zp, x, ldx, p + 6, &mut acc);
                lane_value::<0, 28, R>(v, zp, x, ldx, p + 7, &mut acc);
            } else {
                lane_value::<24, 24, R>(v, zp, x, ldx, p, &mut acc);
                lane_value::<16, 24, R>(v, zp, x, ldx, p + 1, &mut acc);
                lane_value::<8, 24, R>(v, zp, x, ldx, p + 2, &mut acc);
                lane_value::<0, 24, R>(v, zp, x, ldx, p + 3, &mut acc);
            }
        }
        let sc = s.scales.as_ptr().add(g * 16);
        let (s0, s1) = (_mm256_loadu_ps(sc), _mm256_loadu_ps(sc.add(8)));
        for (t, a) in total.iter_mut().zip(&acc) {
            // total += scale · dot, unfused, as the generic kernel rounds it.
            t[0] = _mm256_add_ps(t[0], _mm256_mul_ps(s0, a[0]));
            t[1] = _mm256_add_ps(t[1], _mm256_mul_ps(s1, a[1]));
        }
    }
    for (i, t) in total.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(i * 16), t[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(i * 16 + 8), t[1]);
    }
}
