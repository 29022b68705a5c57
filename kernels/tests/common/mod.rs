//! Test helpers: aligned byte buffers, random data, and comparisons.
#![allow(dead_code)]

use bytemuck::Pod;
use kiln_kernels::{DType, Isa, KernelTable, TensorMut, TensorRef};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// A byte buffer with 8-byte alignment, as the runtime guarantees.
pub struct Buf {
    words: Vec<u64>,
    len: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Buf {
    pub fn from<T: Pod>(dtype: DType, shape: &[usize], v: &[T]) -> Buf {
        let bytes: &[u8] = bytemuck::cast_slice(v);
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Buf { words, len: bytes.len(), dtype, shape: shape.to_vec() }
    }
    pub fn zeros(dtype: DType, shape: &[usize]) -> Buf {
        let len = shape.iter().product::<usize>() * dtype.size_bytes();
        Buf { words: vec![0; len.div_ceil(8)], len, dtype, shape: shape.to_vec() }
    }
    pub fn r(&self) -> TensorRef<'_> {
        TensorRef { dtype: self.dtype, shape: &self.shape, data: &bytemuck::cast_slice(&self.words)[..self.len] }
    }
    pub fn w(&mut self) -> TensorMut<'_> {
        TensorMut {
            dtype: self.dtype,
            shape: &self.shape,
            data: &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len],
        }
    }
    pub fn get<T: Pod>(&self) -> Vec<T> {
        bytemuck::cast_slice(&bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]).to_vec()
    }
}

pub fn f32s(shape: &[usize], v: &[f32]) -> Buf {
    Buf::from(DType::F32, shape, v)
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn rand_f32(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-2.0f32..2.0)).collect()
}

pub fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// Row-major multi-index of flat index `i`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    idx
}

/// Flat index in `shape` of the out-index `idx` under numpy broadcasting.
pub fn bcast_index(idx: &[usize], shape: &[usize]) -> usize {
    let off = idx.len() - shape.len();
    let mut flat = 0;
    for (d, &n) in shape.iter().enumerate() {
        flat = flat * n + if n == 1 { 0 } else { idx[off + d] };
    }
    flat
}

pub fn bcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            if da == 1 {
                db
            } else {
                da
            }
        })
        .collect()
}

/// Asserts |got - want| <= atol + rtol·|want| elementwise; NaNs must match.
pub fn assert_close(got: &[f64], want: &[f64], rtol: f64, atol: f64, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{ctx}[{i}]: got {g}, want NaN");
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g, w, "{ctx}[{i}]");
            continue;
        }
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{ctx}[{i}]: got {g}, want {w}");
    }
}

pub fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Direct convolution reference over padded 3-d geometry.
#[allow(clippy::too_many_arguments)]
pub fn ref_conv(
    x: &[f32],
    xs: &[usize],
    w: &[f32],
    ws: &[usize],
    bias: &[f32],
    st: &[usize],
    pd: &[usize],
    dl: &[usize],
    g: usize,
    os: &[usize],
) -> Vec<f64> {
    let sd = xs.len() - 2;
    let pad3 = |v: &[usize], fill: usize| -> [usize; 3] {
        let mut o = [fill; 3];
        o[3 - sd..].copy_from_slice(v);
        o
    };
    let (i3, k3, o3) = (pad3(&xs[2..], 1), pad3(&ws[2..], 1), pad3(&os[2..], 1));
    let (s3, p3, d3) = (pad3(st, 1), pad3(pd, 0), pad3(dl, 1));
    let (n, cin, cout, cg) = (xs[0], xs[1], ws[0], ws[1]);
    let og = cout / g;
    let mut out = vec![0.0; numel(os)];
    for b in 0..n {
        for co in 0..cout {
            let gi = co / og;
            for oz in 0..o3[0] {
                for oy in 0..o3[1] {
                    for ox in 0..o3[2] {
                        let mut acc = bias.get(co).copied().unwrap_or(0.0) as f64;
                        for ci in 0..cg {
                            for kz in 0..k3[0] {
                                for ky in 0..k3[1] {
                                    for kx in 0..k3[2] {
                                        let iz = (oz * s3[0] + kz * d3[0]) as isize - p3[0] as isize;
                                        let iy = (oy * s3[1] + ky * d3[1]) as isize - p3[1] as isize;
                                        let ix = (ox * s3[2] + kx * d3[2]) as isize - p3[2] as isize;
                                        if iz < 0
                                            || iy < 0
                                            || ix < 0
                                            || iz >= i3[0] as isize
                                            || iy >= i3[1] as isize
                                            || ix >= i3[2] as isize
                                        {
                                            continue;
                                        }
                                        let c = gi * cg + ci;
                                        let xi = (((b * cin + c) * i3[0] + iz as usize) * i3[1] + iy as usize) * i3[2]
                                            + ix as usize;
                                        let wi = (((co * cg + ci) * k3[0] + kz) * k3[1] + ky) * k3[2] + kx;
                                        acc += x[xi] as f64 * w[wi] as f64;
                                    }
                                }
                            }
                        }
                        out[((b * cout + co) * o3[0] + oz) * o3[1] * o3[2] + oy * o3[2] + ox] = acc;
                    }
                }
            }
        }
    }
    out
}

/// Every kernel table this CPU and build run (generic first); notes the
/// levels they lack, so a skipped variant shows in the test output.
pub fn tables() -> Vec<&'static KernelTable> {
    Isa::ALL
        .into_iter()
        .filter_map(|isa| {
            let t = KernelTable::for_isa(isa);
            if t.is_none() {
                println!("note: skipping {isa}: not supported by this CPU or build");
            }
            t
        })
        .collect()
}
