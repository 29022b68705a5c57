//! Resizing the trailing spatial dims (torch's `upsample_nearest*d` and
//! `upsample_(bi)linear*d`), with torch's index arithmetic.

use super::common::*;
use crate::types::{Result, TensorMut, TensorRef};

pub use kiln_isa::ResizeMode;

/// `spatial` trailing dims are resized to the output's; `scales` is empty or
/// holds one user scale factor per spatial dim (`<= 0`: none given).
pub struct ResizeParams<'a> {
    pub mode: ResizeMode,
    pub align_corners: bool,
    pub spatial: usize,
    pub scales: &'a [f64],
}

/// torch's `area_pixel_compute_scale` / `compute_scales_value`.
fn scale_of(input: usize, output: usize, align_corners: bool, scale: f64) -> f64 {
    if align_corners {
        if output > 1 {
            (input as f64 - 1.0) / (output as f64 - 1.0)
        } else {
            0.0
        }
    } else if scale > 0.0 {
        1.0 / scale
    } else {
        input as f64 / output as f64
    }
}

/// Up to 3 spatial dims: per output coordinate, two source positions and weights.
const MAX_SPATIAL: usize = 3;

pub fn resize(x: TensorRef, params: &ResizeParams, mut out: TensorMut) -> Result<()> {
    const K: &str = "resize";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    let r = x.shape.len();
    let s = params.spatial;
    if s == 0 || s > MAX_SPATIAL || r < s || out.shape.len() != r || x.shape[..r - s] != out.shape[..r - s] {
        return Err(shape_err(K, format!("input {:?}, output {:?}, {s} spatial dims", x.shape, out.shape)));
    }
    if !params.scales.is_empty() && params.scales.len() != s {
        return Err(shape_err(K, "one scale per spatial dim expected"));
    }
    let ins = &x.shape[r - s..];
    let outs = &out.shape[r - s..];
    if ins.iter().zip(outs).any(|(&i, &o)| i == 0 && o > 0) {
        return Err(shape_err(K, "resizing an empty dimension"));
    }
    let planes: usize = x.shape[..r - s].iter().product();
    let in_plane: usize = ins.iter().product();
    let out_plane: usize = outs.iter().product();
    let scale: [f64; MAX_SPATIAL] = std::array::from_fn(|d| {
        if d < s {
            scale_of(ins[d], outs[d], params.align_corners, params.scales.get(d).copied().unwrap_or(0.0))
        } else {
            0.0
        }
    });
    // Source taps of output coordinate `o` along spatial dim `d`.
    let taps = |d: usize, o: usize| -> [(usize, f64); 2] {
        let n = ins[d];
        match params.mode {
            ResizeMode::Nearest => {
                // torch computes this in f32: floor(o * scale).
                let src = if outs[d] == n { o } else { ((o as f32) * (scale[d] as f32)).floor() as usize };
                [(src.min(n - 1), 1.0), (0, 0.0)]
            }
            ResizeMode::Linear => linear_taps(n, scale[d], params.align_corners, o),
        }
    };
    if params.mode == ResizeMode::Linear && s == 2 && x.dtype == crate::types::DType::U8 {
        let xv = view::<u8>(K, "x", &x)?;
        let ov = view_mut::<u8>(K, "out", &mut out)?;
        let axis = |d: usize| FixedAxis::new(ins[d], outs[d], scale[d], params.align_corners);
        bilinear_u8(xv, planes, [ins[0], ins[1]], [outs[0], outs[1]], [axis(0), axis(1)], ov);
        return Ok(());
    }
    let mut in_strides = [0usize; MAX_SPATIAL];
    strides_of(ins, &mut in_strides[..s]);
    let corners = if params.mode == ResizeMode::Nearest { 1 } else { 1 << s };
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        let mut idx = [0usize; MAX_SPATIAL];
        for q in 0..out_plane {
            let mut rem = q;
            for d in (0..s).rev() {
                idx[d] = rem % outs[d];
                rem /= outs[d];
            }
            let t: [[(usize, f64); 2]; MAX_SPATIAL] =
                std::array::from_fn(|d| if d < s { taps(d, idx[d]) } else { [(0, 1.0), (0, 0.0)] });
            for p in 0..planes {
                let src = &xv[p * in_plane..(p + 1) * in_plane];
                let mut acc = 0f64;
                for c in 0..corners {
                    let mut off = 0;
                    let mut w = 1.0;
                    for d in 0..s {
                        let (i, wi) = t[d][(c >> d) & 1];
                        off += i * in_strides[d];
                        w *= wi;
                    }
                    if params.mode == ResizeMode::Nearest {
                        ov[p * out_plane + q] = src[off];
                    } else {
                        acc += w * src[off].to_f64();
                    }
                }
                if params.mode == ResizeMode::Linear {
                    ov[p * out_plane + q] = T::from_f64(if T::IS_FLOAT { acc } else { acc.round() });
                }
            }
        }
    });
    Ok(())
}

/// Source positions and weights of output coordinate `o` along a dim of
/// `n` inputs (torch's linear interpolation arithmetic).
fn linear_taps(n: usize, scale: f64, align_corners: bool, o: usize) -> [(usize, f64); 2] {
    let real = if align_corners { scale * o as f64 } else { (scale * (o as f64 + 0.5) - 0.5).max(0.0) };
    let i0 = (real as usize).min(n - 1);
    let i1 = if i0 < n - 1 { i0 + 1 } else { i0 };
    let l1 = (real - i0 as f64).clamp(0.0, 1.0);
    [(i0, 1.0 - l1), (i1, l1)]
}

/// One axis of torch's uint8 bilinear resize (x86's
/// `upsample_avx_bilinear_bicubic_uint8`, which torch uses for every uint8
/// bilinear resize there): the linear weights of each output coordinate in
/// fixed point with `precision` fraction bits — as many as keep the axis's
/// largest weight below 2^15 — and a pass that rounds and clips each result
/// to u8. Matching torch bit for bit needs exactly this arithmetic.
struct FixedAxis {
    n: usize,
    scale: f64,
    align_corners: bool,
    /// Whether the axis changes size at all (torch skips the pass if not).
    resized: bool,
    precision: u32,
}

impl FixedAxis {
    fn new(n: usize, n_out: usize, scale: f64, align_corners: bool) -> FixedAxis {
        let mut axis = FixedAxis { n, scale, align_corners, resized: n != n_out, precision: 0 };
        let max_weight = (0..n_out).map(|o| axis.weights(o)).flat_map(|w| [w[0].1, w[1].1]).fold(0.0f64, f64::max);
        while axis.precision < 15 && ((0.5 + max_weight * f64::from(1u32 << (axis.precision + 1))) as i64) < (1 << 15) {
            axis.precision += 1;
        }
        axis
    }

    /// The two taps, merged into the first when they are one input.
    fn weights(&self, o: usize) -> [(usize, f64); 2] {
        let [(i0, w0), (i1, w1)] = linear_taps(self.n, self.scale, self.align_corners, o);
        if i0 == i1 {
            [(i0, w0 + w1), (i1, 0.0)]
        } else {
            [(i0, w0), (i1, w1)]
        }
    }

    fn taps(&self, o: usize) -> [(usize, i64); 2] {
        let fixed = |w: f64| (0.5 + w * f64::from(1u32 << self.precision)) as i64;
        let [(i0, w0), (i1, w1)] = self.weights(o);
        [(i0, fixed(w0)), (i1, fixed(w1))]
    }

    /// Rounds a fixed-point sum `Σ value · coefficient` to u8.
    fn round(&self, taps: [(usize, i64); 2], value: impl Fn(usize) -> i64) -> i64 {
        let acc = (1i64 << (self.precision - 1)) + taps.iter().map(|&(i, c)| value(i) * c).sum::<i64>();
        (acc >> self.precision).clamp(0, 255)
    }
}

/// Separable uint8 bilinear resize over `[planes, h, w]`: the horizontal
/// pass, rounded to u8, then the vertical pass over its rows (recomputed per
/// output instead of buffered, so the kernel allocates nothing).
fn bilinear_u8(x: &[u8], planes: usize, ins: [usize; 2], outs: [usize; 2], [ay, ax]: [FixedAxis; 2], out: &mut [u8]) {
    let (in_plane, out_plane) = (ins[0] * ins[1], outs[0] * outs[1]);
    for p in 0..planes {
        let src = &x[p * in_plane..(p + 1) * in_plane];
        for oy in 0..outs[0] {
            for ox in 0..outs[1] {
                let horizontal = |row: usize| -> i64 {
                    let line = &src[row * ins[1]..(row + 1) * ins[1]];
                    if ax.resized {
                        ax.round(ax.taps(ox), |i| i64::from(line[i]))
                    } else {
                        i64::from(line[ox])
                    }
                };
                let v = if ay.resized { ay.round(ay.taps(oy), horizontal) } else { horizontal(oy) };
                out[p * out_plane + oy * outs[1] + ox] = v as u8;
            }
        }
    }
}
