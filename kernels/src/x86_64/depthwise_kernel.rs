//! One channels-last depthwise row kernel for every x86-64 vector width:
//! the AVX2 (8 lanes, ymm) and AVX-512 (16 lanes, zmm) rows are the same
//! algorithm over other intrinsics and tail masks, so both modules
//! instantiate [`depthwise_row_kernel!`] (as the GEMM microkernel does,
//! `gemm_kernel.rs`).

/// Defines `depthwise_row` (the table entry) and its blocks in the calling
/// module. `lanes` f32s per vector `vec`; the calling module defines
/// `tail_mask(n)` (the first `min(n, lanes)` lanes), `load_masked(p, mask)`
/// (masked-out lanes read as zero and not accessed) and
/// `store_masked(p, mask, v)` for its width, and `$math::activation_ps`
/// is its vector activation.
macro_rules! depthwise_row_kernel {
    (
        features: $features:literal,
        lanes: $lanes:literal,
        vec: $vec:ty,
        loadu: $loadu:ident,
        storeu: $storeu:ident,
        set1: $set1:ident,
        add: $add:ident,
        mul: $mul:ident,
        min: $min:ident,
        max: $max:ident,
        math: $math:ident $(,)?
    ) => {
        use crate::generic::conv_nhwc::{
            left_border, pixel_sources, slide_geometry, tap_rows, DepthwiseRows, Slide, MAX_DEPTHWISE_TAPS,
        };

        const LANES: usize = $lanes;

        /// The clamp or in-register activation on a block's finished sums
        /// (`$acc`, a mutable array of `P` vectors), and their store to channels
        /// `$c0..` of the `P` output pixels from `$out`. A macro, not a function:
        /// the compiler does not inline a function this large, and passing the
        /// sums to it through memory cost the blocks a third of their time.
        macro_rules! finish {
            ($job:expr, $acc:ident, $mask:expr, $c0:expr, $out:expr, $tail:expr) => {
                if let Some((lo, hi)) = $job.clamp {
                    let (lo, hi) = ($set1(lo), $set1(hi));
                    for a in $acc.iter_mut() {
                        // `a < lo ? lo : a`, then `x > hi ? hi : x` (vmaxps/vminps
                        // return the second operand when unordered: NaN stays).
                        *a = $min(hi, $max(lo, *a));
                    }
                }
                if let Some(v) = $job.activation.and_then(|a| a.in_registers) {
                    // The table's slice function's body per vector (masked-out tail
                    // lanes are computed on zeros and not stored).
                    for a in $acc.iter_mut() {
                        *a = $math::activation_ps(v, *a);
                    }
                }
                for (p, a) in $acc.iter().enumerate() {
                    if $tail {
                        store_masked($out.add(p * $job.channels + $c0), $mask, *a);
                    } else {
                        $storeu($out.add(p * $job.channels + $c0), *a);
                    }
                }
            };
        }

        /// The channels-last depthwise row entry: the portable row loops'
        /// operations (per output element: the bias, then each tap's product
        /// added in tap order, no FMA, then the clamp or the activation), so the
        /// same bits, register blocked over output pixels: up to eight pixels'
        /// `LANES`-channel sums stay in registers per weight vector loaded, and the
        /// channel tail is masked. The activation runs on the sums in registers
        /// when the table's function for it is this ISA's math (the same vector
        /// body per lane), else on the finished part.
        pub(crate) fn depthwise_row(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
            // SAFETY: installed only where the CPU has `$features` (see the module).
            unsafe { wide_row(job, r, ox0, part) }
        }

        #[target_feature(enable = $features)]
        unsafe fn wide_row(job: &DepthwiseRows<'_>, r: usize, ox0: usize, part: &mut [f32]) {
            let c = job.channels;
            assert!(c > 0 && part.len().is_multiple_of(c) && job.taps.len() >= job.g.kernel[1] * job.g.kernel[2] * c);
            assert!(job.bias.len() >= c && job.zeros.len() >= c);
            let ow = part.len() / c;
            assert!(ox0 + ow <= job.g.output[2]);
            let tap_rows = tap_rows(job, r);
            // The row's first pixels, whose taps reach into the left padding, one
            // at a time: the 8-pixel blocks after them then slide (`sliding`).
            let lead = left_border(job).saturating_sub(ox0).min(ow);
            for ox in 0..lead {
                pixels::<1>(job, &tap_rows, ox0 + ox, &mut part[ox * c..]);
            }
            let mut ox = lead;
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

        /// Output pixels `ox..ox + P` of the row (stored from the start of `out`), all channels: `LANES` at a time (the
        /// last block masked), each tap's weights loaded once for the `P` pixels.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn pixels<const P: usize>(
            job: &DepthwiseRows<'_>,
            tap_rows: &[Option<&[f32]>; MAX_DEPTHWISE_TAPS],
            ox: usize,
            out: &mut [f32],
        ) {
            let c = job.channels;
            let out = out[..P * c].as_mut_ptr();
            match slide_geometry::<P>(job, ox) {
                Some(Slide { width: 3, first }) => return sliding::<P, 3>(job, tap_rows, first, out),
                Some(Slide { width: 5, first }) => return sliding::<P, 5>(job, tap_rows, first, out),
                _ => {}
            }
            let mut srcs = [[std::ptr::null::<f32>(); P]; MAX_DEPTHWISE_TAPS];
            pixel_sources::<P>(job, tap_rows, ox, &mut srcs);
            let mut c0 = 0;
            while c - c0 >= LANES {
                block::<P, false>(job, &srcs, c0, out);
                c0 += LANES;
            }
            if c0 < c {
                block::<P, true>(job, &srcs, c0, out);
            }
        }

        /// Channels `c0..c0 + LANES` (`TAIL`: `c0..C`, masked loads and stores) of the
        /// `P` pixels whose sources are `srcs` and whose outputs start at `out`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn block<const P: usize, const TAIL: bool>(
            job: &DepthwiseRows<'_>,
            srcs: &[[*const f32; P]; MAX_DEPTHWISE_TAPS],
            c0: usize,
            out: *mut f32,
        ) {
            let c = job.channels;
            let ksp = job.g.kernel[1] * job.g.kernel[2];
            let mask = tail_mask(c - c0);
            // SAFETY (all loads and stores): `c0 < C`, full blocks end at or before
            // `C`, a tail is masked to its first `C - c0` lanes (masked-out lanes
            // are not accessed); every source, weight row, the bias and each output
            // pixel have `C` floats from their pointers.
            let load = |p: *const f32| if TAIL { load_masked(p, mask) } else { $loadu(p) };
            let b = load(job.bias.as_ptr().add(c0));
            let mut acc = [b; P];
            for (t, src) in srcs[..ksp].iter().enumerate() {
                let w = load(job.taps.as_ptr().add(t * c + c0));
                for (a, &s) in acc.iter_mut().zip(src) {
                    *a = $add(*a, $mul(w, load(s.add(c0))));
                }
            }
            finish!(job, acc, mask, c0, out, TAIL);
        }

        /// Output pixels whose taps all lie inside the input row, horizontally
        /// (`first`: the input column of the first pixel's first tap): stride 1,
        /// kernel width `KW`, no dilation. Input pixel `j` of a kernel row feeds
        /// the pixels `p` with `p + kx = j`, so it is loaded once for all of them
        /// instead of once per tap (a 3×3 block of 8 pixels loads 10 input vectors
        /// per kernel row, not 24, and no per-pixel pointers). Each sum still gets
        /// the bias, then its taps in (ky, kx) order: within a kernel row, `kx = j
        /// − p` grows with `j`. So the same bits as `block`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn sliding<const P: usize, const KW: usize>(
            job: &DepthwiseRows<'_>,
            tap_rows: &[Option<&[f32]>; MAX_DEPTHWISE_TAPS],
            first: usize,
            out: *mut f32,
        ) {
            let c = job.channels;
            let kh = job.g.kernel[1];
            // Each kernel row's first input pixel and the step between pixels: a
            // row in the padding reads the zero pixel throughout (products with
            // zero, as `block` adds them).
            let mut rows = [(job.zeros.as_ptr(), 0usize); MAX_DEPTHWISE_TAPS];
            for (row, tap_row) in rows.iter_mut().zip(&tap_rows[..kh]) {
                if let Some(input) = tap_row {
                    // In bounds: `slide_geometry` checked that the last pixel's
                    // last tap lies inside the row.
                    *row = (input[first * c..][..(P - 1 + KW) * c].as_ptr(), c);
                }
            }
            let mut c0 = 0;
            while c - c0 >= LANES {
                sliding_block::<P, KW, false>(job, &rows[..kh], c0, out);
                c0 += LANES;
            }
            if c0 < c {
                sliding_block::<P, KW, true>(job, &rows[..kh], c0, out);
            }
        }

        /// Channels `c0..c0 + LANES` (`TAIL`: `c0..C`, masked) of [`sliding`]'s pixels.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn sliding_block<const P: usize, const KW: usize, const TAIL: bool>(
            job: &DepthwiseRows<'_>,
            rows: &[(*const f32, usize)],
            c0: usize,
            out: *mut f32,
        ) {
            let c = job.channels;
            let mask = tail_mask(c - c0);
            // SAFETY: as in `block`; row pixel `j < P − 1 + KW` lies inside
            // its input row (or is the zero pixel, step 0).
            let load = |p: *const f32| if TAIL { load_masked(p, mask) } else { $loadu(p) };
            let mut acc = [load(job.bias.as_ptr().add(c0)); P];
            for (ky, &(row, step)) in rows.iter().enumerate() {
                let w: [$vec; KW] = std::array::from_fn(|kx| load(job.taps.as_ptr().add((ky * KW + kx) * c + c0)));
                for j in 0..P - 1 + KW {
                    let v = load(row.add(j * step + c0));
                    for (kx, &wk) in w.iter().enumerate() {
                        if j >= kx && j - kx < P {
                            let a = &mut acc[j - kx];
                            *a = $add(*a, $mul(wk, v));
                        }
                    }
                }
            }
            finish!(job, acc, mask, c0, out, TAIL);
        }
    };
}

pub(crate) use depthwise_row_kernel;
