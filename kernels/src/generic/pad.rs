//! Padding (constant, reflect, replicate; negative pads crop; interior
//! padding spreads elements apart) and flipping.

use super::common::*;
use crate::types::{Result, TensorMut, TensorRef};

pub use kiln_isa::PadMode;

/// Per-axis padding: `lo`/`hi` elements before/after (negative: crop),
/// `interior` between neighbours.
pub struct PadParams<'a> {
    pub lo: &'a [i64],
    pub hi: &'a [i64],
    pub interior: &'a [i64],
    pub mode: PadMode,
    pub value: f64,
}

/// Source position of output position `o` along one axis, or `None` for a
/// padded position.
#[inline(always)]
fn source(o: usize, n: usize, lo: i64, interior: i64, mode: PadMode) -> Option<usize> {
    let mut p = o as i64 - lo;
    if interior > 0 {
        if p.rem_euclid(interior + 1) != 0 {
            return None;
        }
        p = p.div_euclid(interior + 1);
    }
    let n = n as i64;
    if (0..n).contains(&p) {
        return Some(p as usize);
    }
    match mode {
        PadMode::Constant => None,
        PadMode::Replicate => Some(p.clamp(0, n - 1) as usize),
        PadMode::Reflect => {
            if n == 1 {
                return Some(0);
            }
            let period = 2 * (n - 1);
            let m = p.rem_euclid(period);
            Some((if m < n { m } else { period - m }) as usize)
        }
    }
}

pub fn pad(x: TensorRef, params: &PadParams, mut out: TensorMut) -> Result<()> {
    const K: &str = "pad";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    let r = x.shape.len();
    check_rank(K, x.shape)?;
    if [params.lo.len(), params.hi.len(), params.interior.len(), out.shape.len()].iter().any(|&l| l != r) {
        return Err(shape_err(K, format!("padding lengths do not match rank {r}")));
    }
    for i in 0..r {
        let n = x.shape[i] as i64;
        let grown = if n == 0 { 0 } else { n + params.interior[i] * (n - 1) };
        let want = grown + params.lo[i] + params.hi[i];
        if want != out.shape[i] as i64 || params.interior[i] < 0 {
            return Err(shape_err(
                K,
                format!(
                    "output {:?} is not input {:?} padded by {params_lo:?}/{params_hi:?}",
                    out.shape,
                    x.shape,
                    params_lo = params.lo,
                    params_hi = params.hi
                ),
            ));
        }
        if params.mode != PadMode::Constant && n == 0 && out.shape[i] > 0 {
            return Err(shape_err(K, "reflect/replicate padding of an empty dimension"));
        }
    }
    let osh = out.shape;
    let total = numel(K, osh)?;
    let mut xs = [0usize; MAX_RANK];
    strides_of(x.shape, &mut xs[..r]);
    with_scalar!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        let fill = T::from_f64(params.value);
        let mut idx = [0usize; MAX_RANK];
        for o in ov.iter_mut().take(total) {
            let mut off = Some(0usize);
            for a in 0..r {
                off = match (off, source(idx[a], x.shape[a], params.lo[a], params.interior[a], params.mode)) {
                    (Some(acc), Some(p)) => Some(acc + p * xs[a]),
                    _ => None,
                };
            }
            *o = match off {
                Some(i) => xv[i],
                None => fill,
            };
            let mut d = r;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                if idx[d] < osh[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    });
    Ok(())
}

/// Reverses the elements along each axis in `axes`.
pub fn flip(x: TensorRef, axes: &[usize], mut out: TensorMut) -> Result<()> {
    const K: &str = "flip";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if x.shape != out.shape || axes.iter().any(|&a| a >= x.shape.len()) {
        return Err(shape_err(K, format!("input {:?}, output {:?}, axes {axes:?}", x.shape, out.shape)));
    }
    check_rank(K, x.shape)?;
    let r = x.shape.len();
    let mut flipped = [false; MAX_RANK];
    for &a in axes {
        flipped[a] = true;
    }
    let mut xs = [0usize; MAX_RANK];
    strides_of(x.shape, &mut xs[..r]);
    let total = numel(K, x.shape)?;
    with_elem_size!(x.dtype, T, {
        let xv = view::<T>(K, "x", &x)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        let mut idx = [0usize; MAX_RANK];
        for o in ov.iter_mut().take(total) {
            let mut off = 0;
            for a in 0..r {
                let i = if flipped[a] { x.shape[a] - 1 - idx[a] } else { idx[a] };
                off += i * xs[a];
            }
            *o = xv[off];
            let mut d = r;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                if idx[d] < x.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn run(x: &[f32], shape: &[usize], lo: i64, hi: i64, interior: i64, mode: PadMode) -> Vec<f32> {
        let n = (shape[0] as i64 + interior * (shape[0] as i64 - 1) + lo + hi) as usize;
        let mut out = vec![0f32; n];
        let p = PadParams { lo: &[lo], hi: &[hi], interior: &[interior], mode, value: -1.0 };
        let xr = TensorRef { dtype: DType::F32, shape, data: bytemuck::cast_slice(x) };
        pad(xr, &p, TensorMut { dtype: DType::F32, shape: &[n], data: bytemuck::cast_slice_mut(&mut out) }).unwrap();
        out
    }

    #[test]
    fn pads_like_torch() {
        let x = [1.0, 2.0, 3.0];
        assert_eq!(run(&x, &[3], 2, 1, 0, PadMode::Constant), [-1.0, -1.0, 1.0, 2.0, 3.0, -1.0]);
        assert_eq!(run(&x, &[3], 2, 2, 0, PadMode::Reflect), [3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0]);
        assert_eq!(run(&x, &[3], 2, 1, 0, PadMode::Replicate), [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]);
        assert_eq!(run(&x, &[3], -1, 0, 1, PadMode::Constant), [-1.0, 2.0, -1.0, 3.0]);
    }
}
