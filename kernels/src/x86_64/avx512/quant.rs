//! AVX-512 int8 GEMM microkernels. VNNI: `vpdpbusd` on zmm multiplies 64
//! u8·i8 pairs and adds each column's four into its i32 lane, exactly.
//! An 8×32 tile is 16 zmm accumulators (two strips of 16 columns per
//! row), two weight vectors and one broadcast per row and lane step.
//! Activations are stored as `q + 128` (u8); the driver subtracts
//! `128 · Σ_p w` per column. AVX-512BW (no VNNI): exact i16 `vpmaddwd`.
//! Also the AVX-512F weight-only kernel, and the int8 depthwise row on zmm
//! (32 channels per block; `vpdpwssd` with VNNI, `vpmaddwd` + `vpaddd`
//! without).

use crate::quant::{Acts, DepthwiseFns, DepthwiseRow, Driver, Epilogue, QGemmUkr, QTile, Residual, WoStrip, WoUkr};
use std::arch::x86_64::*;

const MR: usize = 8;
const NR: usize = 32;

/// The table entry; installed only after AVX-512F and AVX-512 VNNI were detected.
pub(crate) const INT8_AVX512_VNNI: QGemmUkr = QGemmUkr {
    variant: "avx512_vnni_8x32",
    mr: MR,
    nr: NR,
    acts: Acts::U8Offset,
    run: int8,
    copy: None,
    window: Some(int8_window),
    driver: DRIVER_VNNI,
};

/// The AVX2 driver with its tile stores compiled for AVX-512 (the same
/// loops 16 lanes wide, i32 → i8 by one saturating pack) and the
/// depthwise row on zmm: the same operations, so the same bits. For the
/// AVX-512BW entry.
const DRIVER: Driver = Driver {
    store,
    store_q,
    depthwise: DepthwiseFns { variant: "avx512bw", pairs, row: depthwise_bw },
    ..crate::x86_64::avx2::quant::DRIVER
};

/// [`DRIVER`] with the depthwise row's pair products accumulated by
/// `vpdpwssd`. For the AVX-512 VNNI entry.
const DRIVER_VNNI: Driver =
    Driver { depthwise: DepthwiseFns { variant: "avx512_vnni", pairs, row: depthwise_vnni }, ..DRIVER };

/// The pair image's rows ([`crate::quant::pair_row`]) compiled for AVX-512:
/// the same integer operations 16 lanes wide.
fn pairs(src: &[i8], zp: i32, c: usize, left: usize, every: usize, dst: &mut [i32]) {
    // SAFETY: the AVX-512 entries are installed after AVX-512F/BW were detected.
    unsafe { pairs_avx512(src, zp, c, left, every, dst) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn pairs_avx512(src: &[i8], zp: i32, c: usize, left: usize, every: usize, dst: &mut [i32]) {
    crate::quant::pair_row(src, zp, c, left, every, dst)
}

/// Output pixels per depthwise block: with two zmm of sums per pixel,
/// sixteen accumulators and the two weight vectors stay in registers.
const DW_PIXELS: usize = 8;

/// The depthwise row ([`crate::quant::depthwise_row`]) on zmm: blocks of
/// 32 channels (a last block of at most 16 in one vector) by
/// [`DW_PIXELS`] output pixels, each weight-pair vector loaded once per
/// term for every pixel; the sums are exact i32 (`vpmaddwd` then `vpaddd`),
/// the epilogue the AVX2 row's operations in its order. Channel tails are
/// masked loads and stores (lanes past `C` never read nor written).
fn depthwise_bw(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    crate::quant::depthwise_bounds(job, base, out, q);
    // SAFETY: the AVX-512BW entry is installed after AVX-512F/BW/VL were
    // detected; the bounds hold every masked load (lanes below `C` of a
    // pixel's `Cp`) and store (`ow · c` values).
    unsafe { depthwise_bw_inner(job, base, out, q) }
}

/// [`depthwise_bw`] with `vpdpwssd` (the pair products added into the sums
/// in one instruction, exact: no saturation, and no sum can overflow).
fn depthwise_vnni(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    crate::quant::depthwise_bounds(job, base, out, q);
    // SAFETY: as for `depthwise_bw`, and the VNNI entry is installed after
    // AVX-512 VNNI was detected.
    unsafe { depthwise_vnni_inner(job, base, out, q) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn depthwise_bw_inner(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    depthwise_row::<false>(job, base, out, q)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn depthwise_vnni_inner(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    depthwise_row::<true>(job, base, out, q)
}

/// The row's blocks; inlined into a `#[target_feature]` caller (with VNNI
/// when `VNNI`).
#[inline(always)]
unsafe fn depthwise_row<const VNNI: bool>(job: &DepthwiseRow<'_>, base: usize, out: &mut [f32], q: &mut [i8]) {
    let c = job.channels;
    let ow = out.len() / c;
    // Kernel rows of two terms whose second starts one or two pixel steps
    // after the first (3×3 and 4-wide kernels at stride 1, or 2 with the
    // even-column image): a row's image vectors serve both terms.
    let (offs, step) = (job.offs, job.step);
    let gap = if job.row_terms == 2 && offs.len() >= 2 && step > 0 { offs[1] - offs[0] } else { 0 };
    let window = match gap / step.max(1) {
        d @ (1 | 2) if gap == d * step && offs.chunks_exact(2).all(|r| r[1] - r[0] == gap) => d,
        _ => 0,
    };
    for c0 in (0..c).step_by(32) {
        let n = 32.min(c - c0);
        let mut ox = 0;
        while ox < ow {
            let p = DW_PIXELS.min(ow - ox);
            match (n > 16, p == DW_PIXELS, window) {
                (true, true, 1) => depthwise_window::<2, VNNI, 1>(job, base, ox, c0, n, out, q),
                (true, true, 2) => depthwise_window::<2, VNNI, 2>(job, base, ox, c0, n, out, q),
                (false, true, 1) => depthwise_window::<1, VNNI, 1>(job, base, ox, c0, n, out, q),
                (false, true, 2) => depthwise_window::<1, VNNI, 2>(job, base, ox, c0, n, out, q),
                (true, ..) => depthwise_pixels::<2, VNNI>(job, base, ox, p, c0, n, out, q),
                (false, ..) => depthwise_pixels::<1, VNNI>(job, base, ox, p, c0, n, out, q),
            }
            ox += DW_PIXELS;
        }
    }
}

/// The lanes of the block's `H` vectors below `n`.
#[inline(always)]
fn lane_masks<const H: usize>(n: usize) -> [__mmask16; H] {
    let full = (1u64 << n) - 1;
    std::array::from_fn(|h| (full >> (16 * h)) as __mmask16)
}

/// `a + x · w` over i16 pairs, exact (`vpdpwssd`, or `vpmaddwd` + `vpaddd`).
#[inline(always)]
unsafe fn pair_dot<const VNNI: bool>(a: __m512i, x: __m512i, w: __m512i) -> __m512i {
    if VNNI {
        _mm512_dpwssd_epi32(a, x, w)
    } else {
        _mm512_add_epi32(a, _mm512_madd_epi16(x, w))
    }
}

/// [`DW_PIXELS`] pixels of a two-term-row kernel whose second term is `D`
/// pixel steps after the first: per kernel row, `DW_PIXELS + D` image
/// vectors each loaded once, each added to one or two pixels' sums (the
/// same products as [`depthwise_block`]'s, so the same exact sums).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn depthwise_window<const H: usize, const VNNI: bool, const D: usize>(
    job: &DepthwiseRow<'_>,
    base: usize,
    ox: usize,
    c0: usize,
    n: usize,
    out: &mut [f32],
    q: &mut [i8],
) {
    const P: usize = DW_PIXELS;
    let (cp, step) = (job.cp, job.step);
    let (img, wts) = (job.img.as_ptr(), job.weights.as_ptr());
    let masks = lane_masks::<H>(n);
    let mut acc = [[_mm512_setzero_si512(); H]; P];
    for (r, o) in job.offs.chunks_exact(2).enumerate() {
        let wt = wts.add(2 * r * cp + c0);
        let w0: [__m512i; H] = std::array::from_fn(|h| _mm512_maskz_loadu_epi32(masks[h], wt.add(16 * h) as *const _));
        let w1: [__m512i; H] =
            std::array::from_fn(|h| _mm512_maskz_loadu_epi32(masks[h], wt.add(cp + 16 * h) as *const _));
        let x = img.add(base + ox * step + o[0] + c0);
        for i in 0..P + D {
            let xp = x.add(i * step);
            for h in 0..H {
                let xv = _mm512_maskz_loadu_epi32(masks[h], xp.add(16 * h) as *const _);
                if i < P {
                    acc[i][h] = pair_dot::<VNNI>(acc[i][h], xv, w0[h]);
                }
                if i >= D {
                    acc[i - D][h] = pair_dot::<VNNI>(acc[i - D][h], xv, w1[h]);
                }
            }
        }
    }
    depthwise_finish(job, &acc, ox, c0, masks, out, q);
}

/// `p` (1 to [`DW_PIXELS`]) pixels from `ox`, `H` vectors of channels
/// from `c0` (`n` of them valid).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn depthwise_pixels<const H: usize, const VNNI: bool>(
    job: &DepthwiseRow<'_>,
    base: usize,
    ox: usize,
    p: usize,
    c0: usize,
    n: usize,
    out: &mut [f32],
    q: &mut [i8],
) {
    macro_rules! block {
        ($($p:literal)*) => {
            match p {
                $($p => depthwise_block::<$p, H, VNNI>(job, base, ox, c0, n, out, q),)*
                _ => unreachable!("depthwise: pixel count"),
            }
        };
    }
    block!(1 2 3 4 5 6 7 8)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn depthwise_block<const P: usize, const H: usize, const VNNI: bool>(
    job: &DepthwiseRow<'_>,
    base: usize,
    ox: usize,
    c0: usize,
    n: usize,
    out: &mut [f32],
    q: &mut [i8],
) {
    let (cp, step) = (job.cp, job.step);
    let (img, wts) = (job.img.as_ptr(), job.weights.as_ptr());
    let masks = lane_masks::<H>(n);
    let mut acc = [[_mm512_setzero_si512(); H]; P];
    for (t, &o) in job.offs.iter().enumerate() {
        let wt = wts.add(t * cp + c0);
        let w: [__m512i; H] = std::array::from_fn(|h| _mm512_maskz_loadu_epi32(masks[h], wt.add(16 * h) as *const _));
        let x = img.add(base + ox * step + o + c0);
        for (p, a) in acc.iter_mut().enumerate() {
            let xp = x.add(p * step);
            for h in 0..H {
                let xv = _mm512_maskz_loadu_epi32(masks[h], xp.add(16 * h) as *const _);
                a[h] = pair_dot::<VNNI>(a[h], xv, w[h]);
            }
        }
    }
    depthwise_finish(job, &acc, ox, c0, masks, out, q);
}

/// The block's epilogue: `(f32(sum) · s) · scale + bias`, the clamp, and
/// the f32 store or the output's quantization, on the valid lanes.
#[inline(always)]
unsafe fn depthwise_finish<const P: usize, const H: usize>(
    job: &DepthwiseRow<'_>,
    acc: &[[__m512i; H]; P],
    ox: usize,
    c0: usize,
    masks: [__mmask16; H],
    out: &mut [f32],
    q: &mut [i8],
) {
    let c = job.channels;
    let s = _mm512_set1_ps(job.s);
    let (lo, hi) = job.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    let (inv, zp) = match job.quant {
        Some((os, ozp)) => (1.0 / os, ozp as f32),
        None => (1.0, 0.0),
    };
    let (inv, zp) = (_mm512_set1_ps(inv), _mm512_set1_ps(zp));
    let (qlo, qhi) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
    let sc: [__m512; H] =
        std::array::from_fn(|h| _mm512_maskz_loadu_ps(masks[h], job.scales.as_ptr().add(c0 + 16 * h)));
    let bias: [__m512; H] =
        std::array::from_fn(|h| _mm512_maskz_loadu_ps(masks[h], job.bias.as_ptr().add(c0 + 16 * h)));
    for (p, a) in acc.iter().enumerate() {
        let at = (ox + p) * c + c0;
        for h in 0..H {
            // (f32(sum) · s) · scale + bias, then the clamp kernel's
            // comparisons (`maxps(lo, v)` keeps a NaN `v`).
            let mut v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a[h]), s), sc[h]);
            if job.has_bias {
                v = _mm512_add_ps(v, bias[h]);
            }
            let v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
            if job.quant.is_some() {
                // `quantize_value`: rint(v · inv) + zp (half to even),
                // clamped to [-128, 127], NaN to 0.
                let r = _mm512_add_ps(
                    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v, inv)),
                    zp,
                );
                let clamped = _mm512_min_ps(_mm512_max_ps(r, qlo), qhi);
                let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
                let qv = _mm512_cvttps_epi32(_mm512_maskz_mov_ps(ordered, clamped));
                _mm_mask_storeu_epi8(q.as_mut_ptr().add(at + 16 * h), masks[h], _mm512_cvtsepi32_epi8(qv));
            } else {
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(at + 16 * h), masks[h], v);
            }
        }
    }
}

fn store(o: &mut [f32], acc: &[i32], s: f32, e: &Epilogue<'_>, shift: i32) {
    // SAFETY: the AVX-512 entries are installed after AVX-512F/BW were detected.
    unsafe { store_avx512(o, acc, s, e, shift) }
}

/// # Safety
/// [`crate::quant::store_tile_quantized`]'s contract.
unsafe fn store_q(t: &QTile<'_>) {
    // SAFETY: as for `store`; the tile's contract is the caller's.
    unsafe { store_q_avx512(t) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn store_avx512(o: &mut [f32], acc: &[i32], s: f32, e: &Epilogue<'_>, shift: i32) {
    crate::quant::store_row(o, acc, s, e, shift)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn store_q_avx512(t: &QTile<'_>) {
    // A tile of the entry's width in registers; others (none today: both
    // AVX-512 entries are 32 wide) row by row.
    if t.nr != NR || t.cols > NR || t.rows > MR {
        // SAFETY: the tile's contract is the caller's.
        return unsafe { crate::quant::store_tile_quantized(t) };
    }
    let e = &t.e;
    assert!(e.scales.len() >= t.cols && e.col_sums.len() >= t.cols && t.acc.len() >= t.rows * NR);
    assert!(t.scales.len() >= t.rows && t.shifts.len() >= t.rows);
    assert!(e.bias.is_none_or(|b| b.len() >= t.cols));
    let span = (t.rows.max(1) - 1) * t.ldo + t.cols;
    if !t.inv.is_finite() {
        // An output scale so small (subnormal) that `inv` is infinite:
        // `v · inv` is no longer `v`'s image alone (`0 · ∞` is NaN), so
        // [`QuantBounds`] does not hold; the row loop quantizes as defined.
        // SAFETY: the tile's contract is the caller's.
        return unsafe { crate::quant::store_tile_quantized(t) };
    }
    // SAFETY: the asserts bound the tile's reads of its columns, rows and
    // residual; the output is the caller's contract.
    unsafe {
        match e.residual {
            None => tile_halves::<NO_RESIDUAL>(t, std::ptr::null(), std::ptr::null(), 0.0, 0.0),
            Some(Residual::F32(r)) => {
                assert!(r.len() >= span, "qgemm: residual shorter than the tile");
                tile_halves::<F32_RESIDUAL>(t, r.as_ptr(), std::ptr::null(), 0.0, 0.0)
            }
            Some(Residual::I8(r, rs, rzp)) => {
                assert!(r.len() >= span, "qgemm: residual shorter than the tile");
                tile_halves::<I8_RESIDUAL>(t, std::ptr::null(), r.as_ptr(), rs, rzp as f32)
            }
        }
    }
}

/// [`tile_zmm`] with its number of 16-column halves a constant (the
/// halves' values then stay in registers).
///
/// # Safety
/// [`tile_zmm`]'s.
#[inline(always)]
unsafe fn tile_halves<const RES: u8>(t: &QTile<'_>, rf: *const f32, ri: *const i8, rs: f32, rzp: f32) {
    // SAFETY: the caller's.
    unsafe {
        if t.cols > 16 {
            tile_zmm::<RES, 2>(t, rf, ri, rs, rzp)
        } else {
            tile_zmm::<RES, 1>(t, rf, ri, rs, rzp)
        }
    }
}

/// The last clamp before a value's quantization, `(a, b)` (the clamp
/// kernel's: `max` with `a`, then `min` with `b`; a NaN bound clamps
/// nothing), carried past the multiply by `inv` and narrowed to ±256:
/// `lo = max(a · inv, −256)`, `hi = min(b · inv, 256)`.
///
/// With `inv` finite and positive, `x ↦ x · inv` (rounded) and `rint` are
/// non-decreasing, so clamping `v` to `[a, b]` then multiplying gives the
/// value multiplying then clamping to `[a · inv, b · inv]` gives (ties
/// differ at most by the sign of a zero, which no integer keeps); and
/// narrowing to ±256 changes no result once `+ zp` (|zp| ≤ 128) and the
/// clamp to [-128, 127] follow. Inside ±256 `rint(x) + zp` is exact in
/// i32, so the saturating packs do the last clamp: `quantize_value`'s
/// integers in three operations fewer per vector (one clamp instead of
/// two, the rounding and the conversion one instruction). `v` is NaN
/// exactly when `v · inv` is, whose lanes the caller sets to 0.
#[derive(Copy, Clone, Debug)]
struct QuantBounds {
    lo: f32,
    hi: f32,
}

impl QuantBounds {
    fn of((a, b): (f32, f32), inv: f32) -> QuantBounds {
        // `f32::max` / `min` ignore a NaN bound's product, as the clamp
        // kernel's comparisons ignore the bound.
        QuantBounds { lo: (a * inv).max(-256.0), hi: (b * inv).min(256.0) }
    }
}

/// [`tile_zmm`]'s residual kinds.
const NO_RESIDUAL: u8 = 0;
const F32_RESIDUAL: u8 = 1;
const I8_RESIDUAL: u8 = 2;

/// [`crate::quant::store_tile_quantized`]'s operations on zmm, the tile's
/// 16-column halves in registers: `(f32(acc − shift · Σw) · s) · scale (+
/// bias)`, then with a residual the clamp kernel's comparisons
/// (`maxps(lo, v)` keeps a NaN), the add of `residual(at, mask)` (the
/// values at output offset `at`), and each value's last clamp and
/// `quantize_value` — `rint(v · inv) + zp` (half to even), clamped to
/// [-128, 127], NaN to 0 — in fewer operations that give the same
/// integers ([`QuantBounds`]): `x = v · inv`, clamped to the last clamp's
/// bounds times `inv` (narrowed to ±256), rounded to an i32 (half to even),
/// plus `zp` (NaN lanes 0), and each row's two halves packed to bytes by
/// saturating packs (the clamp to [-128, 127]; one half: a saturating
/// `vpmovsdb`) in one store. The f32
/// values before the last clamp are the row loop's operations in its
/// order, so the same bytes.
///
/// # Safety
/// AVX-512F/BW/VL; the tile's contract ([`QTile`]); the residual (`rf`
/// f32 values, or `ri` i8 ones with scale `rs` and zero point `rzp`, as
/// `RES` says) covers the tile's span. Plain loops, no closures: a
/// closure would not inherit the caller's target features, and each
/// intrinsic would become a call.
#[inline(always)]
unsafe fn tile_zmm<const RES: u8, const H: usize>(t: &QTile<'_>, rf: *const f32, ri: *const i8, rs: f32, rzp: f32) {
    let e = &t.e;
    let full = if t.cols >= 32 { u32::MAX } else { (1u32 << t.cols) - 1 };
    let masks = [full as __mmask16, (full >> 16) as __mmask16];
    let (mut cs, mut sc, mut bias) = ([_mm512_setzero_si512(); H], [_mm512_setzero_ps(); H], [_mm512_setzero_ps(); H]);
    for h in 0..H {
        cs[h] = _mm512_maskz_loadu_epi32(masks[h], e.col_sums.as_ptr().add(16 * h));
        sc[h] = _mm512_maskz_loadu_ps(masks[h], e.scales.as_ptr().add(16 * h));
        if let Some(b) = e.bias {
            bias[h] = _mm512_maskz_loadu_ps(masks[h], b.as_ptr().add(16 * h));
        }
    }
    let (rs, rzp) = (_mm512_set1_ps(rs), _mm512_set1_ps(rzp));
    let (lo, hi) = (_mm512_set1_ps(e.lo), _mm512_set1_ps(e.hi));
    // The clamp right before the quantization: the store's own, or with a
    // residual the one after the add.
    let last = if RES == NO_RESIDUAL { (e.lo, e.hi) } else { e.after };
    let bounds = QuantBounds::of(last, t.inv);
    let (x_lo, x_hi) = (_mm512_set1_ps(bounds.lo), _mm512_set1_ps(bounds.hi));
    let (inv, zp) = (_mm512_set1_ps(t.inv), _mm512_set1_epi32(t.zero_point));
    // Dword `j` of the packed bytes: half `j / 4`'s values `4 (j % 4)..`.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // `shift · Σw` per column, made again only when a row's shift differs
    // from the previous row's (static activations: one shift for all).
    let (mut shifted, mut last) = ([_mm512_setzero_si512(); H], None);
    for i in 0..t.rows {
        let s = _mm512_set1_ps(t.scales[i]);
        if last != Some(t.shifts[i]) {
            let shift = _mm512_set1_epi32(t.shifts[i]);
            for h in 0..H {
                shifted[h] = _mm512_mullo_epi32(cs[h], shift);
            }
            last = Some(t.shifts[i]);
        }
        let mut q = [_mm512_setzero_si512(); 2];
        for h in 0..H {
            let acc = _mm512_loadu_si512(t.acc.as_ptr().add(i * NR + 16 * h) as *const _);
            let dot = _mm512_sub_epi32(acc, shifted[h]);
            let mut v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), s), sc[h]);
            if e.bias.is_some() {
                v = _mm512_add_ps(v, bias[h]);
            }
            if RES != NO_RESIDUAL {
                v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
                let at = i * t.ldo + 16 * h;
                let r = if RES == F32_RESIDUAL {
                    _mm512_maskz_loadu_ps(masks[h], rf.add(at))
                } else {
                    // `(q − zero point) · scale`, as torch dequantizes.
                    let qr = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(masks[h], ri.add(at)));
                    _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(qr), rzp), rs)
                };
                v = _mm512_add_ps(v, r);
            }
            // The last clamp and the quantization ([`QuantBounds`]): a NaN
            // `v` (and only a NaN: `inv` is finite) gives a NaN `x`.
            let x = _mm512_mul_ps(v, inv);
            let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x);
            let x = _mm512_min_ps(_mm512_max_ps(x, x_lo), x_hi);
            let n = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            q[h] = _mm512_maskz_add_epi32(ordered, n, zp);
        }
        let out = t.out.add(i * t.ldo);
        if H == 2 {
            let words = _mm512_packs_epi32(q[0], q[1]);
            let bytes = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(words, words));
            _mm256_mask_storeu_epi8(out, full, _mm512_castsi512_si256(bytes));
        } else {
            _mm_mask_storeu_epi8(out, masks[0], _mm512_cvtsepi32_epi8(q[0]));
        }
    }
}

fn int8(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    assert!(a.len() >= (MR - 1) * lda + 4 * k4, "qgemm: activation rows too short");
    assert!(b.len() >= strip + 64 * k4 && strip >= 64 * k4, "qgemm: weight strips too short");
    assert!(acc.len() >= MR * NR, "qgemm: accumulator tile too small");
    // SAFETY: the CPU has AVX-512F and VNNI (see the entry); the asserts
    // bound every load and store.
    unsafe { int8_inner(k4, a.as_ptr(), lda, b.as_ptr(), strip, acc) }
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_inner(k4: usize, a: *const u8, lda: usize, b: *const u8, strip: usize, acc: &mut [i32]) {
    let mut c = [[_mm512_setzero_si512(); 2]; MR];
    for t in 0..k4 {
        let w0 = _mm512_loadu_si512(b.add(t * 64) as *const _);
        let w1 = _mm512_loadu_si512(b.add(strip + t * 64) as *const _);
        for (i, ci) in c.iter_mut().enumerate() {
            let x = _mm512_set1_epi32((a.add(i * lda + 4 * t) as *const i32).read_unaligned());
            ci[0] = _mm512_dpbusd_epi32(ci[0], x, w0);
            ci[1] = _mm512_dpbusd_epi32(ci[1], x, w1);
        }
    }
    for (i, ci) in c.iter().enumerate() {
        _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR) as *mut _, ci[0]);
        _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR + 16) as *mut _, ci[1]);
    }
}

/// [`int8`] over rows read in place from a channels-last image (the
/// table's window kernel, `QWindowFn` in `quant::int8`): the same `vpdpbusd` sums, lane step by
/// lane step in the weight's order, each row's four bytes broadcast from
/// its window's current tap instead of a gathered copy.
fn int8_window(c4: usize, image: &[u8], rows: &[usize], offs: &[usize], b: &[u8], strip: usize, acc: &mut [i32]) {
    let k4 = c4 * offs.len();
    let span = offs.iter().max().map_or(0, |&o| o + 4 * c4);
    let rows: &[usize; MR] = rows.try_into().expect("qgemm: one window per tile row");
    assert!(rows.iter().all(|&r| r + span <= image.len()), "qgemm: window past the image");
    assert!(b.len() >= strip + 64 * k4 && strip >= 64 * k4, "qgemm: weight strips too short");
    assert!(acc.len() >= MR * NR, "qgemm: accumulator tile too small");
    // SAFETY: the CPU has AVX-512F and VNNI (see the entry); the asserts
    // bound every load and store.
    unsafe { int8_window_inner(c4, image.as_ptr(), rows, offs, b.as_ptr(), strip, acc) }
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_window_inner(
    c4: usize,
    image: *const u8,
    rows: &[usize; MR],
    offs: &[usize],
    b: *const u8,
    strip: usize,
    acc: &mut [i32],
) {
    let mut c = [[_mm512_setzero_si512(); 2]; MR];
    let mut w = b;
    for &o in offs {
        let a: [*const u8; MR] = std::array::from_fn(|i| image.add(rows[i] + o));
        for t in 0..c4 {
            let w0 = _mm512_loadu_si512(w.add(t * 64) as *const _);
            let w1 = _mm512_loadu_si512(w.add(strip + t * 64) as *const _);
            for (ci, a) in c.iter_mut().zip(&a) {
                let x = _mm512_set1_epi32((a.add(4 * t) as *const i32).read_unaligned());
                ci[0] = _mm512_dpbusd_epi32(ci[0], x, w0);
                ci[1] = _mm512_dpbusd_epi32(ci[1], x, w1);
            }
        }
        w = w.add(64 * c4);
    }
    for (i, ci) in c.iter().enumerate() {
        _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR) as *mut _, ci[0]);
        _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR + 16) as *mut _, ci[1]);
    }
}

const BW_MR: usize = 6;

/// The AVX-512BW entry, for CPUs without VNNI (Skylake-SP, Cascade Lake
/// has VNNI): the AVX2 kernel's exact i16 `vpmaddwd` on zmm, 6 rows × 32
/// columns (24 accumulators, four sign-extended weight vectors per lane
/// step shared by the six rows). Installed only after AVX-512BW was detected.
pub(crate) const INT8_AVX512BW: QGemmUkr = QGemmUkr {
    variant: "avx512bw_6x32",
    mr: BW_MR,
    nr: NR,
    acts: Acts::I16,
    run: int8_bw,
    copy: None,
    window: None,
    driver: DRIVER,
};

fn int8_bw(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    assert!(a.len() >= (BW_MR - 1) * lda + 8 * k4, "qgemm: i16 activation rows too short");
    assert!(b.len() >= strip + 64 * k4 && strip >= 64 * k4, "qgemm: weight strips too short");
    assert!(acc.len() >= BW_MR * NR, "qgemm: accumulator tile too small");
    // SAFETY: the CPU has AVX-512F and BW (see the entry); the asserts
    // bound every load and store.
    unsafe { int8_bw_inner(k4, a.as_ptr(), lda, b.as_ptr(), strip, acc) }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int8_bw_inner(k4: usize, a: *const u8, lda: usize, b: *const u8, strip: usize, acc: &mut [i32]) {
    // c[i][v]: columns 8v..8v+8 of row i, two pair sums per column.
    let mut c = [[_mm512_setzero_si512(); 4]; BW_MR];
    for t in 0..k4 {
        let half = |s: usize, h: usize| {
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.add(s * strip + t * 64 + 32 * h) as *const __m256i))
        };
        let w = [half(0, 0), half(0, 1), half(1, 0), half(1, 1)];
        for (i, ci) in c.iter_mut().enumerate() {
            let x = _mm512_set1_epi64((a.add(i * lda + 8 * t) as *const i64).read_unaligned());
            for (cv, wv) in ci.iter_mut().zip(&w) {
                *cv = _mm512_add_epi32(*cv, _mm512_madd_epi16(*wv, x));
            }
        }
    }
    // Even and odd lanes of a vector pair: each column's two pair sums.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (i, ci) in c.iter().enumerate() {
        for h in 0..2 {
            let (lo, hi) = (ci[2 * h], ci[2 * h + 1]);
            let sums =
                _mm512_add_epi32(_mm512_permutex2var_epi32(lo, even, hi), _mm512_permutex2var_epi32(lo, odd, hi));
            _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR + 16 * h) as *mut _, sums);
        }
    }
}

const WO_MR: usize = 8;

/// The AVX-512F weight-only entry: the AVX2 kernel's arithmetic (same
/// operations, same order per column) with a strip's 16 columns in one zmm,
/// so eight rows share each dequantized vector.
pub(crate) const WEIGHT_ONLY: WoUkr = WoUkr { variant: "avx512f_8x16", mr: WO_MR, lane_groups: true, run: weight_only };

fn weight_only(s: &WoStrip<'_>, x: &[f32], ldx: usize, rows: usize, bias: &[f32; 16], out: &mut [f32]) {
    let lane = crate::quant::lane_of(s.bits);
    assert!((1..=WO_MR).contains(&rows) && s.group.is_multiple_of(lane) && s.groups * s.group == s.k);
    assert!(x.len() >= (rows - 1) * ldx + s.k && out.len() >= rows * 16);
    assert!(s.w.len() >= s.k / lane * 64 && s.scales.len() >= s.groups * 16);
    assert!(s.zps.is_none_or(|z| z.len() >= s.groups * 16));
    let (x, b) = (x.as_ptr(), bias);
    // SAFETY: the CPU has AVX-512F (see the entry); the asserts bound every access.
    unsafe {
        match rows {
            1 => weight_only_inner::<1>(s, x, ldx, b, out),
            2 => weight_only_inner::<2>(s, x, ldx, b, out),
            3 => weight_only_inner::<3>(s, x, ldx, b, out),
            4 => weight_only_inner::<4>(s, x, ldx, b, out),
            5 => weight_only_inner::<5>(s, x, ldx, b, out),
            6 => weight_only_inner::<6>(s, x, ldx, b, out),
            7 => weight_only_inner::<7>(s, x, ldx, b, out),
            _ => weight_only_inner::<8>(s, x, ldx, b, out),
        }
    }
}

/// Value `p` of a lane step for the strip's 16 columns: shift it to the
/// top, arithmetic-shift it down, subtract the zero points, convert, and
/// accumulate `x[i][p] · w` into every row.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn lane_value<const UP: u32, const DOWN: u32, const R: usize>(
    v: __m512i,
    zp: __m512i,
    x: *const f32,
    ldx: usize,
    p: usize,
    acc: &mut [__m512; R],
) {
    let q = _mm512_sub_epi32(_mm512_srai_epi32::<DOWN>(_mm512_slli_epi32::<UP>(v)), zp);
    let f = _mm512_cvtepi32_ps(q);
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(i * ldx + p)), f, *a);
    }
}

#[target_feature(enable = "avx512f")]
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
    let mut total = [_mm512_loadu_ps(bias.as_ptr()); R];
    for g in 0..s.groups {
        let zp = match s.zps {
            Some(z) => _mm512_cvtepi8_epi32(_mm_loadu_si128(z.as_ptr().add(g * 16) as *const __m128i)),
            None => _mm512_setzero_si512(),
        };
        let mut acc = [_mm512_setzero_ps(); R];
        for t in g * steps..(g + 1) * steps {
            let v = _mm512_loadu_si512(s.w.as_ptr().add(t * 64) as *const _);
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
        let sc = _mm512_loadu_ps(s.scales.as_ptr().add(g * 16));
        for (t, a) in total.iter_mut().zip(&acc) {
            // total += scale · dot, unfused, as the generic kernel rounds it.
            *t = _mm512_add_ps(*t, _mm512_mul_ps(sc, *a));
        }
    }
    for (i, t) in total.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(i * 16), *t);
    }
}
