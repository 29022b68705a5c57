//! Resizing the trailing spatial dims (torch's `upsample_nearest*d` and
//! `upsample_(bi)linear*d`), with torch's index arithmetic.

use super::common::*;
use crate::types::{Result, TensorMut, TensorRef};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ResizeMode {
    Nearest,
    Linear,
}

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
        if output > 1 { (input as f64 - 1.0) / (output as f64 - 1.0) } else { 0.0 }
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
        if d < s { scale_of(ins[d], outs[d], params.align_corners, params.scales.get(d).copied().unwrap_or(0.0)) } else { 0.0 }
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
            ResizeMode::Linear => {
                let real = if params.align_corners { scale[d] * o as f64 } else { (scale[d] * (o as f64 + 0.5) - 0.5).max(0.0) };
                let i0 = (real as usize).min(n - 1);
                let i1 = if i0 < n - 1 { i0 + 1 } else { i0 };
                let l1 = (real - i0 as f64).clamp(0.0, 1.0);
                [(i0, 1.0 - l1), (i1, l1)]
            }
        }
    };
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
            let t: [[(usize, f64); 2]; MAX_SPATIAL] = std::array::from_fn(|d| if d < s { taps(d, idx[d]) } else { [(0, 1.0), (0, 0.0)] });
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
