//! torch.matmul and nn.functional.linear on top of the packed GEMM.

use super::common::*;
use super::gemm::gemm_f32_packed;
use super::math::Real;
use crate::types::{DType, Result, Scratch, TensorMut, TensorRef};

/// Plain i-k-j loop for f64 (row-major friendly, no packing): f64 matmul is
/// rare in inference graphs, so it gets correctness rather than speed.
#[allow(clippy::too_many_arguments)]
fn gemm_simple<T: Real>(m: usize, n: usize, k: usize, a: &[T], b: &[T], c: &mut [T]) {
    for i in 0..m {
        let crow = &mut c[i * n..(i + 1) * n];
        crow.fill(T::ZERO);
        for p in 0..k {
            let av = a[i * k + p];
            for (cv, &bv) in crow.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cv += av * bv;
            }
        }
    }
}

/// Batch bookkeeping shared by matmul and attention: the broadcast batch
/// shape and, per operand, the element stride of each batch dim.
pub(crate) struct BatchIter {
    rank: usize,
    shape: [usize; MAX_RANK],
    strides: [[usize; MAX_RANK]; 4],
    pub count: usize,
}

impl BatchIter {
    /// `batches[i]` is operand i's batch shape, `mats[i]` its matrix size in
    /// elements. Returns None when the batch shapes do not broadcast.
    pub fn new(batches: &[&[usize]], mats: &[usize]) -> Option<BatchIter> {
        let mut shape = [0usize; MAX_RANK];
        let rank = broadcast_shape(batches, &mut shape)?;
        let mut strides = [[0usize; MAX_RANK]; 4];
        for (o, bs) in batches.iter().enumerate().take(4) {
            broadcast_strides(bs, &shape[..rank], &mut strides[o][..rank]);
            for s in &mut strides[o][..rank] {
                *s *= mats[o];
            }
        }
        let count = shape[..rank].iter().product();
        Some(BatchIter { rank, shape, strides, count })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.rank]
    }

    /// Element offset of operand `o`'s matrix for batch number `t`.
    pub fn offset(&self, o: usize, t: usize) -> usize {
        let mut t = t;
        let mut off = 0;
        for d in (0..self.rank).rev() {
            off += (t % self.shape[d]) * self.strides[o][d];
            t /= self.shape[d];
        }
        off
    }

    /// True when operand `o` is the same matrix for every batch.
    pub fn is_broadcast(&self, o: usize) -> bool {
        self.strides[o][..self.rank].iter().all(|&s| s == 0)
    }

    /// True when operand `o` holds one distinct contiguous matrix per batch.
    pub fn is_dense(&self, o: usize, mat: usize) -> bool {
        (0..self.count).all(|t| self.offset(o, t) == t * mat)
    }
}

/// torch.matmul: rank-1 operands are promoted (a → [1,K], b → [K,1]) and the
/// promoted dim is squeezed from the result; batch dims broadcast.
pub fn matmul(a: TensorRef, b: TensorRef, mut out: TensorMut, scratch: &mut Scratch) -> Result<()> {
    const K: &str = "matmul";
    expect_dtype(K, "b", b.dtype, a.dtype)?;
    expect_dtype(K, "out", out.dtype, a.dtype)?;
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err(shape_err(K, "operands must have rank >= 1"));
    }
    check_rank(K, a.shape)?;
    check_rank(K, b.shape)?;
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, ka) = if ra == 1 { (1, a.shape[0]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let (kb, n) = if rb == 1 { (b.shape[0], 1) } else { (b.shape[rb - 2], b.shape[rb - 1]) };
    if ka != kb {
        return Err(shape_err(K, format!("inner dims differ: {:?} x {:?}", a.shape, b.shape)));
    }
    let k = ka;
    let a_batch = &a.shape[..ra.saturating_sub(2)];
    let b_batch = &b.shape[..rb.saturating_sub(2)];
    let it = BatchIter::new(&[a_batch, b_batch], &[m * k, k * n])
        .ok_or_else(|| shape_err(K, format!("batch dims of {:?} and {:?} do not broadcast", a.shape, b.shape)))?;
    let mut want = [0usize; MAX_RANK + 2];
    let mut wr = it.shape().len();
    want[..wr].copy_from_slice(it.shape());
    if ra > 1 {
        want[wr] = m;
        wr += 1;
    }
    if rb > 1 {
        want[wr] = n;
        wr += 1;
    }
    if out.shape != &want[..wr] {
        return Err(shape_err(K, format!("output shape {:?}, expected {:?}", out.shape, &want[..wr])));
    }
    match a.dtype {
        DType::F32 => {
            let av = view::<f32>(K, "a", &a)?;
            let bv = view::<f32>(K, "b", &b)?;
            let ov = view_mut::<f32>(K, "out", &mut out)?;
            let pack = &mut scratch.pack;
            if it.count > 1 && it.is_broadcast(1) && it.is_dense(0, m * k) {
                // One shared B: fold the batch into M for a single, taller GEMM.
                gemm_f32_packed(it.count * m, n, k, av, k, bv, n, ov, n, false, 0.0, pack);
                return Ok(());
            }
            for t in 0..it.count {
                let (ao, bo) = (it.offset(0, t), it.offset(1, t));
                let c = &mut ov[t * m * n..(t + 1) * m * n];
                gemm_f32_packed(m, n, k, &av[ao..], k, &bv[bo..], n, c, n, false, 0.0, pack);
            }
            Ok(())
        }
        DType::F64 => {
            let av = view::<f64>(K, "a", &a)?;
            let bv = view::<f64>(K, "b", &b)?;
            let ov = view_mut::<f64>(K, "out", &mut out)?;
            for t in 0..it.count {
                let (ao, bo) = (it.offset(0, t), it.offset(1, t));
                let c = &mut ov[t * m * n..(t + 1) * m * n];
                gemm_simple(m, n, k, &av[ao..ao + m * k], &bv[bo..bo + k * n], c);
            }
            Ok(())
        }
        d => Err(dtype_err(K, d)),
    }
}

/// `out = x · wᵀ + bias` with x [.., K], w [N, K], bias [N], out [.., N].
pub fn linear(x: TensorRef, w: TensorRef, bias: Option<TensorRef>, mut out: TensorMut, scratch: &mut Scratch) -> Result<()> {
    const K: &str = "linear";
    for (what, d) in [("x", x.dtype), ("w", w.dtype), ("out", out.dtype)] {
        if d != DType::F32 {
            let _ = what;
            return Err(dtype_err(K, d));
        }
    }
    if x.shape.is_empty() || w.shape.len() != 2 {
        return Err(shape_err(K, format!("x {:?} must have rank >= 1 and w {:?} rank 2", x.shape, w.shape)));
    }
    let (n, k) = (w.shape[0], w.shape[1]);
    let rx = x.shape.len();
    if x.shape[rx - 1] != k {
        return Err(shape_err(K, format!("x {:?} last dim != w {:?} dim 1", x.shape, w.shape)));
    }
    if out.shape.len() != rx || out.shape[..rx - 1] != x.shape[..rx - 1] || out.shape[rx - 1] != n {
        return Err(shape_err(K, format!("output shape {:?} does not match x {:?} and w {:?}", out.shape, x.shape, w.shape)));
    }
    let xv = view::<f32>(K, "x", &x)?;
    let wv = view::<f32>(K, "w", &w)?;
    let bv = match &bias {
        Some(b) => {
            expect_dtype(K, "bias", b.dtype, DType::F32)?;
            if b.shape != [n] {
                return Err(shape_err(K, format!("bias shape {:?}, expected [{n}]", b.shape)));
            }
            Some(view::<f32>(K, "bias", b)?)
        }
        None => None,
    };
    let ov = view_mut::<f32>(K, "out", &mut out)?;
    let m = ov.len().checked_div(n).unwrap_or(0);
    // Seed C with the bias and accumulate (beta = 1): the bias add is fused
    // into the GEMM's store instead of a second pass over the output.
    let beta = match bv {
        Some(bv) => {
            for row in ov.chunks_exact_mut(n.max(1)) {
                row.copy_from_slice(bv);
            }
            1.0
        }
        None => 0.0,
    };
    gemm_f32_packed(m, n, k, xv, k, wv, k, ov, n, true, beta, &mut scratch.pack);
    Ok(())
}
