//! AVX-512F depthwise convolution: the portable plane loops
//! (`generic::conv_depthwise::depthwise_plane`) compiled with avx512f enabled,
//! so their multiply-adds run on full-width vectors. Same operations in the
//! same order as the generic variant (no FMA contraction), so bit-identical.

use super::math::activation_ps;
use crate::generic::conv_depthwise::{depthwise_plane as portable, DepthwisePlane};
use crate::generic::conv_nhwc::{pixel_sources, tap_rows, DepthwiseRows, MAX_DEPTHWISE_TAPS};
use std::arch::x86_64::*;

/// The table entry.
pub(crate) fn depthwise_plane(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    // SAFETY: installed only in a v4 table, after AVX-512F was detected.
    unsafe { wide(job, out, buf) }
}

#[target_feature(enable = "avx512f")]
unsafe fn wide(job: &DepthwisePlane<'_>, out: &mut [f32], buf: &mut [f32]) {
    portable(job, out, buf)
}

/// The channels-last depthwise row entry: the portable row loops'
/// operations (per output element: the bias, then each tap's product
/// added in tap order, no FMA, then the clamp or the activation), so the
/// same bits, register blocked over output pixels: up to eight pixels'
/// 16-channel sums stay in registers per weight vector loaded, and the
/// channel tail is masked. The activation runs on the sums in registers
/// when the table's function for it is this ISA's math (the same vector
/// body per lane), else on the finished part.
pub(crate) fn depthwise_row(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
    // SAFETY: installed only by `x86_64::plug` after AVX-512F was detected.
    unsafe { wide_row(job, r, ox0, part) }
}

#[target_feature(enable = "avx512f")]
unsafe fn wide_row(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
    let c = job.channels;
    assert!(c > 0 && part.len().is_multiple_of(c) && job.taps.len() >= job.g.kernel[1] * job.g.kernel[2] * c);
    assert!(job.bias.len() >= c && job.zeros.len() >= c);
    let ow = part.len() / c;
    assert!(ox0 + ow <= job.g.output[2]);
    let tap_rows = tap_rows(job, r);
    let mut ox = 0;
    while ow - ox >= 8 {
        pixels::<8>(job, &tap_rows, ox0 + ox, &mut part[ox * c..]);
        ox += 8;
    }
    if ow - ox >= 4 {
        pixels::<4>(job, &tap_rows, ox0 + ox, &mut part[ox * c..]);
        ox += 4;
    }
    if ow - ox >= 2 {
        pixels::<2>(job, &tap_rows, ox0 + ox, &mut part[ox * c..]);
        ox += 2;
    }
    if ow > ox {
        pixels::<1>(job, &tap_rows, ox0 + ox, &mut part[ox * c..]);
    }
    // An activation this ISA's math does not compute as the table does:
    // the table's function on the finished part.
    if let Some(a) = job.activation.filter(|a| a.in_registers.is_none()) {
        a.apply(part);
    }
}

/// Output pixels `ox..ox + P` of the row (stored from the start of `out`), all channels: 16 at a time (the
/// last block masked), each tap's weights loaded once for the `P` pixels.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pixels<const P: usize>(
    job: &DepthwiseRows<'_>,
    tap_rows: &[Option<&[f32]>; MAX_DEPTHWISE_TAPS],
    ox: usize,
    out: &mut [f32],
) {
    let c = job.channels;
    let mut srcs = [[std::ptr::null::<f32>(); P]; MAX_DEPTHWISE_TAPS];
    pixel_sources::<P>(job, tap_rows, ox, &mut srcs);
    let out = out[..P * c].as_mut_ptr();
    let mut c0 = 0;
    while c - c0 >= 16 {
        block::<P, false>(job, &srcs, c0, out);
        c0 += 16;
    }
    if c0 < c {
        block::<P, true>(job, &srcs, c0, out);
    }
}

/// Channels `c0..c0 + 16` (`TAIL`: `c0..C`, masked loads and stores) of
/// the `P` pixels whose sources are `srcs` and whose outputs start at `out`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block<const P: usize, const TAIL: bool>(
    job: &DepthwiseRows<'_>,
    srcs: &[[*const f32; P]; MAX_DEPTHWISE_TAPS],
    c0: usize,
    out: *mut f32,
) {
    let c = job.channels;
    let ksp = job.g.kernel[1] * job.g.kernel[2];
    let mask: __mmask16 = if TAIL { (1u16 << (c - c0)) - 1 } else { 0xffff };
    // SAFETY (all loads and stores): `c0 < C`, full blocks end at or before
    // `C`, a tail is masked to its first `C - c0` (< 16) lanes (masked-out
    // lanes are not accessed); every source, weight row, the bias and each
    // output pixel have `C` floats from their pointers.
    let load = |p: *const f32| if TAIL { _mm512_maskz_loadu_ps(mask, p) } else { _mm512_loadu_ps(p) };
    let b = load(job.bias.as_ptr().add(c0));
    let mut acc = [b; P];
    for (t, src) in srcs[..ksp].iter().enumerate() {
        let w = load(job.taps.as_ptr().add(t * c + c0));
        for (a, &s) in acc.iter_mut().zip(src) {
            *a = _mm512_add_ps(*a, _mm512_mul_ps(w, load(s.add(c0))));
        }
    }
    if let Some((lo, hi)) = job.clamp {
        let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        for a in acc.iter_mut() {
            // `a < lo ? lo : a`, then `x > hi ? hi : x` (vmaxps/vminps
            // return the second operand when unordered: NaN stays).
            *a = _mm512_min_ps(hi, _mm512_max_ps(lo, *a));
        }
    }
    if let Some(v) = job.activation.and_then(|a| a.in_registers) {
        // The table's slice function's body per vector (masked-out tail
        // lanes are computed on zeros and not stored).
        for a in acc.iter_mut() {
            *a = activation_ps(v, *a);
        }
    }
    for (p, a) in acc.iter().enumerate() {
        if TAIL {
            _mm512_mask_storeu_ps(out.add(p * c + c0), mask, *a);
        } else {
            _mm512_storeu_ps(out.add(p * c + c0), *a);
        }
    }
}
