//! Test helpers: aligned byte buffers, random data, and comparisons.
#![allow(dead_code)]

use bytemuck::Pod;
use kiln_kernels::{DType, TensorMut, TensorRef};
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
        TensorMut { dtype: self.dtype, shape: &self.shape, data: &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len] }
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
            if da == 1 { db } else { da }
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
