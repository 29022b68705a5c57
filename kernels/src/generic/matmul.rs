//! torch.matmul and nn.functional.linear on top of the packed GEMM.

use super::common::*;
use super::conv::TensorEpilogue;
use super::gemm::{
    gemm_f32_fused, gemm_f32_packed, gemm_prepacked_fused, gemm_split_packed, Activation, ActivationFn, Bias, Epilogue,
    PackedB, SplitOut, PARALLEL_MIN_FLOPS, SPLIT_MAX,
};
use super::math::Real;
use super::vector;
use crate::context::Context;
use crate::table::KernelTable;
use crate::types::{DType, PackBuffers, Result, Scratch, TensorMut, TensorRef};

/// A float the GEMM-based kernels (matmul, linear, attention) are written
/// over: f32 runs the packed GEMM (and the softmax entries) of the kernel
/// table, f64 plain loops — f64 products are rare in inference graphs, so
/// they get f64 accuracy rather than speed.
pub(crate) trait GemmFloat: Real {
    /// `C = A · B (or A · Bᵀ when transposed_b) + beta·C`, with the argument
    /// conventions of [`gemm_f32_packed`]; operands are already validated.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        table: &KernelTable,
        m: usize,
        n: usize,
        k: usize,
        a: &[Self],
        lda: usize,
        b: &[Self],
        ldb: usize,
        c: &mut [Self],
        ldc: usize,
        transposed_b: bool,
        beta: Self,
        pack: &mut PackBuffers,
    );

    /// `C = A · Bᵀ + bias` (bias per column of C, as in linear), C m×n dense.
    /// By default C is seeded with the bias and the GEMM accumulates.
    #[allow(clippy::too_many_arguments)]
    fn gemm_bt_bias(
        table: &KernelTable,
        m: usize,
        n: usize,
        k: usize,
        a: &[Self],
        b: &[Self],
        bias: Option<&[Self]>,
        c: &mut [Self],
        pack: &mut PackBuffers,
    ) {
        let beta = match bias {
            Some(bias) => {
                for row in c.chunks_exact_mut(n.max(1)) {
                    row.copy_from_slice(bias);
                }
                Self::ONE
            }
            None => Self::ZERO,
        };
        Self::gemm(table, m, n, k, a, k, b, k, c, n, true, beta, pack);
    }

    /// Softmax of a contiguous row in place, summed in f64; a row that is
    /// entirely -inf (a fully-masked query) becomes zeros, as torch's
    /// `scaled_dot_product_attention` returns since 2.5 (its `_safe_softmax`).
    fn softmax_in_place(table: &KernelTable, row: &mut [Self]) {
        let max = Self::row_max(table, row);
        if max == Self::NEG_INFINITY {
            row.fill(Self::ZERO);
            return;
        }
        let sum = Self::exp_sum(table, row, max);
        let inv = Self::from_f64(1.0 / sum);
        row.iter_mut().for_each(|v| *v = *v * inv);
    }

    /// The NaN-propagating maximum of a row (-inf when empty), the table's
    /// `max_f32` for f32.
    fn row_max(_table: &KernelTable, row: &[Self]) -> Self {
        vector::max(row)
    }

    /// `row[i] = exp(row[i] - shift)` in place, returning the sum in f64
    /// (the table's `exp_sum_f32` for f32).
    fn exp_sum(_table: &KernelTable, row: &mut [Self], shift: Self) -> f64 {
        vector::exp_sum(row, shift)
    }

    /// A scratch buffer of `len` elements, borrowed beside the GEMM panels.
    fn scratch_split(scratch: &mut Scratch, len: usize) -> (&mut [Self], &mut PackBuffers);
}

impl GemmFloat for f32 {
    fn gemm(
        table: &KernelTable,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        transposed_b: bool,
        beta: f32,
        pack: &mut PackBuffers,
    ) {
        gemm_f32_packed(table, m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta, pack);
    }

    /// The bias is the GEMM's epilogue: added once, when each sum is done.
    fn gemm_bt_bias(
        table: &KernelTable,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        bias: Option<&[f32]>,
        c: &mut [f32],
        pack: &mut PackBuffers,
    ) {
        let epilogue = Epilogue::bias(bias.map_or(Bias::None, Bias::PerCol));
        gemm_f32_fused(table, m, n, k, a, k, b, k, c, n, true, 0.0, epilogue, pack);
    }

    fn row_max(table: &KernelTable, row: &[f32]) -> f32 {
        table.max_f32(row)
    }

    fn exp_sum(table: &KernelTable, row: &mut [f32], shift: f32) -> f64 {
        table.exp_sum_f32(row, shift)
    }

    fn scratch_split(scratch: &mut Scratch, len: usize) -> (&mut [f32], &mut PackBuffers) {
        scratch.split(len)
    }
}

impl GemmFloat for f64 {
    fn gemm(
        _table: &KernelTable,
        m: usize,
        n: usize,
        k: usize,
        a: &[f64],
        lda: usize,
        b: &[f64],
        ldb: usize,
        c: &mut [f64],
        ldc: usize,
        transposed_b: bool,
        beta: f64,
        _pack: &mut PackBuffers,
    ) {
        gemm_simple(m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta);
    }

    fn scratch_split(scratch: &mut Scratch, len: usize) -> (&mut [f64], &mut PackBuffers) {
        scratch.split_f64(len)
    }
}

/// Unpacked GEMM: i-k-j for a row-major B (streams B's rows), a dot product
/// per element for a transposed B (both operands' rows are contiguous).
/// `beta == 0` overwrites C without reading it, as the packed GEMM does.
#[allow(clippy::too_many_arguments)]
fn gemm_simple<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [T],
    ldc: usize,
    transposed_b: bool,
    beta: T,
) {
    if n == 0 {
        return;
    }
    for i in 0..m {
        let crow = &mut c[i * ldc..i * ldc + n];
        if beta == T::ZERO {
            crow.fill(T::ZERO);
        } else if beta != T::ONE {
            crow.iter_mut().for_each(|v| *v = *v * beta);
        }
        let arow = &a[i * lda..i * lda + k];
        if transposed_b {
            for (j, cv) in crow.iter_mut().enumerate() {
                let brow = &b[j * ldb..j * ldb + k];
                let mut acc = T::ZERO;
                for (&av, &bv) in arow.iter().zip(brow) {
                    acc += av * bv;
                }
                *cv += acc;
            }
        } else {
            for (p, &av) in arow.iter().enumerate() {
                for (cv, &bv) in crow.iter_mut().zip(&b[p * ldb..p * ldb + n]) {
                    *cv += av * bv;
                }
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

    /// How many consecutive batch entries share the matrices of every
    /// operand in `shared`: the innermost batch dim's size when those
    /// operands are broadcast along it (stride 0), else 1. Grouped-query
    /// attention's K and V over `[.., Hkv, R]`: R query heads per K/V head.
    pub fn inner_shared(&self, shared: &[usize]) -> usize {
        match self.rank.checked_sub(1) {
            Some(d) if shared.iter().all(|&o| self.strides[o][d] == 0) => self.shape[d],
            _ => 1,
        }
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

/// torch.matmul: rank-1 operands are promoted (a → `[1, K]`, b → `[K, 1]`) and the
/// promoted dim is squeezed from the result; batch dims broadcast.
pub fn matmul(a: TensorRef, b: TensorRef, mut out: TensorMut, cx: &mut Context) -> Result<()> {
    let (table, scratch) = (cx.table, &mut cx.scratch);
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
        DType::F32 => matmul_typed::<f32>(
            table,
            &it,
            m,
            n,
            k,
            view(K, "a", &a)?,
            view(K, "b", &b)?,
            view_mut(K, "out", &mut out)?,
            scratch,
        ),
        DType::F64 => matmul_typed::<f64>(
            table,
            &it,
            m,
            n,
            k,
            view(K, "a", &a)?,
            view(K, "b", &b)?,
            view_mut(K, "out", &mut out)?,
            scratch,
        ),
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn matmul_typed<T: GemmFloat>(
    table: &KernelTable,
    it: &BatchIter,
    m: usize,
    n: usize,
    k: usize,
    av: &[T],
    bv: &[T],
    ov: &mut [T],
    scratch: &mut Scratch,
) {
    let (pack, workers) = scratch.pack_and_workers();
    if it.count > 1 && it.is_broadcast(1) && it.is_dense(0, m * k) {
        // One shared B: fold the batch into M for a single, taller GEMM.
        T::gemm(table, it.count * m, n, k, av, k, bv, n, ov, n, false, T::ZERO, pack);
        return;
    }
    if m * n == 0 {
        return;
    }
    let one = |t: usize, c: &mut [T], pack: &mut PackBuffers| {
        let (ao, bo) = (it.offset(0, t), it.offset(1, t));
        T::gemm(table, m, n, k, &av[ao..], k, &bv[bo..], n, c, n, false, T::ZERO, pack);
    };
    let threads = pack.threads;
    if threads.count() == 1 || it.count == 1 || it.count * m * n * k < PARALLEL_MIN_FLOPS {
        ov.chunks_exact_mut(m * n).enumerate().for_each(|(t, c)| one(t, c, pack));
        return;
    }
    // Whole batch entries per thread, each with its own panels.
    let workers = workers.workers(threads.count(), |w| w.pack.reserve_gemm(table, m, n, k));
    threads.for_each_chunk(ov, m * n, |t, c| {
        let mut w = workers[threads.index()].lock().unwrap_or_else(|e| e.into_inner());
        one(t, c, &mut w.pack);
    });
}

/// `out = x · wᵀ + bias` with x `[.., K]`, w `[N, K]`, bias `[N]`, out `[.., N]`.
pub fn linear(x: TensorRef, w: TensorRef, bias: Option<TensorRef>, mut out: TensorMut, cx: &mut Context) -> Result<()> {
    let (table, scratch) = (cx.table, &mut cx.scratch);
    const K: &str = "linear";
    expect_dtype(K, "w", w.dtype, x.dtype)?;
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if x.shape.is_empty() || w.shape.len() != 2 {
        return Err(shape_err(K, format!("x {:?} must have rank >= 1 and w {:?} rank 2", x.shape, w.shape)));
    }
    let (n, k) = (w.shape[0], w.shape[1]);
    let rx = x.shape.len();
    if x.shape[rx - 1] != k {
        return Err(shape_err(K, format!("x {:?} last dim != w {:?} dim 1", x.shape, w.shape)));
    }
    if out.shape.len() != rx || out.shape[..rx - 1] != x.shape[..rx - 1] || out.shape[rx - 1] != n {
        return Err(shape_err(
            K,
            format!("output shape {:?} does not match x {:?} and w {:?}", out.shape, x.shape, w.shape),
        ));
    }
    if let Some(b) = &bias {
        expect_dtype(K, "bias", b.dtype, x.dtype)?;
        if b.shape != [n] {
            return Err(shape_err(K, format!("bias shape {:?}, expected [{n}]", b.shape)));
        }
    }
    let pack = &mut scratch.pack;
    match x.dtype {
        DType::F32 => {
            let bv = bias.as_ref().map(|b| view(K, "bias", b)).transpose()?;
            linear_typed::<f32>(
                table,
                n,
                k,
                view(K, "x", &x)?,
                view(K, "w", &w)?,
                bv,
                view_mut(K, "out", &mut out)?,
                pack,
            )
        }
        DType::F64 => {
            let bv = bias.as_ref().map(|b| view(K, "bias", b)).transpose()?;
            linear_typed::<f64>(
                table,
                n,
                k,
                view(K, "x", &x)?,
                view(K, "w", &w)?,
                bv,
                view_mut(K, "out", &mut out)?,
                pack,
            )
        }
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn linear_typed<T: GemmFloat>(
    table: &KernelTable,
    n: usize,
    k: usize,
    xv: &[T],
    wv: &[T],
    bv: Option<&[T]>,
    ov: &mut [T],
    pack: &mut PackBuffers,
) {
    let m = ov.len().checked_div(n).unwrap_or(0);
    T::gemm_bt_bias(table, m, n, k, xv, wv, bv, ov, pack);
}

/// What a fused linear applies to `x · wᵀ` while each output tile is hot,
/// in this order: `v = scale·v`, `v += bias[j]`, `v = activation(v)`,
/// `v += residual[i, j]` (the IR-level fusion pass lowers linear +
/// activation / residual chains onto it). Each step computes exactly what
/// the unfused kernel would (the activation runs the same table entry).
#[derive(Copy, Clone, Debug)]
pub struct LinearEpilogue<'a> {
    pub scale: f32,
    /// One per output feature (`[N]`).
    pub bias: Option<&'a [f32]>,
    pub activation: Option<Activation>,
    /// Shaped like the output (`[.., N]`, contiguous).
    pub residual: Option<&'a [f32]>,
    /// Add the residual before the activation instead of after it.
    pub residual_first: bool,
}

impl Default for LinearEpilogue<'_> {
    fn default() -> Self {
        LinearEpilogue { scale: 1.0, bias: None, activation: None, residual: None, residual_first: false }
    }
}

impl<'a> LinearEpilogue<'a> {
    /// The store step's form, once its sizes were checked against `m×n`.
    fn store_step(&self, table: &KernelTable, m: usize, n: usize) -> Result<Epilogue<'a>> {
        if self.bias.is_some_and(|b| b.len() != n) || self.residual.is_some_and(|r| r.len() != m * n) {
            return Err(shape_err("linear", format!("bias must hold {n} and residual {} elements", m * n)));
        }
        Ok(Epilogue {
            scale: self.scale,
            bias: self.bias.map_or(Bias::None, Bias::PerCol),
            activation: self.activation.map(|a| ActivationFn::new(table, a)),
            residual: self.residual.map(|r| (r, n)),
            residual_first: self.residual_first,
        })
    }
}

/// [`linear`] with a weight packed once ([`PackedB::new`] with
/// `transposed = true` on the `[N, K]` weight) and a fused epilogue; f32.
pub fn linear_fused(
    x: TensorRef,
    w: &PackedB,
    epilogue: &LinearEpilogue<'_>,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "linear";
    let (n, k) = (w.n(), w.k());
    let m = check_rows_times_packed(K, &x, w, &out)?;
    let (xv, ov) = (view::<f32>(K, "x", &x)?, view_mut::<f32>(K, "out", &mut out)?);
    let fused = epilogue.store_step(cx.table, m, n)?;
    gemm_prepacked_fused(cx.table, m, xv, k, w, ov, n, 0.0, fused, &mut cx.scratch.pack)
}

/// [`linear_fused`] with the `[N, K]` weight as it is (packed by the call):
/// for a weight that was not packed at load; f32.
pub fn linear_fused_unpacked(
    x: TensorRef,
    w: TensorRef,
    epilogue: &LinearEpilogue<'_>,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "linear";
    for (name, d) in [("x", x.dtype), ("w", w.dtype), ("out", out.dtype)] {
        expect_dtype(K, name, d, DType::F32)?;
    }
    let (&[n, k], Some((&last, lead))) = (w.shape, x.shape.split_last()) else {
        return Err(shape_err(K, format!("x {:?} must have rank >= 1 and w {:?} rank 2", x.shape, w.shape)));
    };
    let shape_ok = out.shape.split_last().is_some_and(|(&on, olead)| on == n && olead == lead);
    if last != k || !shape_ok {
        return Err(shape_err(K, format!("x {:?}, w {:?} and output {:?} do not fit", x.shape, w.shape, out.shape)));
    }
    let m: usize = lead.iter().product();
    let (xv, wv, ov) = (view::<f32>(K, "x", &x)?, view::<f32>(K, "w", &w)?, view_mut::<f32>(K, "out", &mut out)?);
    let fused = epilogue.store_step(cx.table, m, n)?;
    gemm_f32_fused(cx.table, m, n, k, xv, k, wv, k, ov, n, true, 0.0, fused, &mut cx.scratch.pack);
    Ok(())
}

/// [`linear`] with a bias and a [`TensorEpilogue`] (the plan's fused
/// linear): through the packed weight when there is one that fits `cx`'s
/// table, else packing `w` during the call; f32.
pub fn linear_with_epilogue(
    x: TensorRef,
    w: TensorRef,
    packed: Option<&PackedB>,
    bias: Option<TensorRef>,
    epilogue: &TensorEpilogue<'_>,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "linear";
    fn f32_view<'t>(what: &str, t: &Option<TensorRef<'t>>) -> Result<Option<&'t [f32]>> {
        match t {
            Some(t) => {
                expect_dtype(K, what, t.dtype, DType::F32)?;
                Ok(Some(view::<f32>(K, what, t)?))
            }
            None => Ok(None),
        }
    }
    if let Some(r) = &epilogue.residual {
        if r.shape != out.shape {
            return Err(shape_err(K, format!("residual shape {:?}, expected {:?}", r.shape, out.shape)));
        }
    }
    let fused = LinearEpilogue {
        scale: 1.0,
        bias: f32_view("bias", &bias)?,
        activation: epilogue.activation,
        residual: f32_view("residual", &epilogue.residual)?,
        residual_first: epilogue.residual_first,
    };
    match packed.filter(|p| p.fits(cx.table)) {
        Some(p) if p.k() == w.shape.get(1).copied().unwrap_or(0) && p.n() == w.shape.first().copied().unwrap_or(0) => {
            linear_fused(x, p, &fused, out, cx)
        }
        _ => linear_fused_unpacked(x, w, &fused, out, cx),
    }
}

/// Linear layers that read the same `x` as one (the plan's `linear_fused`
/// with several outputs): `x · wᵀ (+ bias)` then `activation`, over the
/// `[N, K]` weight of all of them, its columns cut into `outs` in order
/// (output `i` `[.., N_i]`, the `N_i` summing to N). Through the packed
/// weight when there is one that fits `cx`'s table and every width but the
/// last is a multiple of its strip (one GEMM: one parallel region, the
/// columns of all outputs shared among the threads); else each output is
/// a linear of its own rows of `w` (packed by the call). Either way every
/// element is what the output's own fused linear computes, bit for bit; f32.
pub fn linear_split(
    x: TensorRef,
    w: TensorRef,
    packed: Option<&PackedB>,
    bias: Option<TensorRef>,
    activation: Option<Activation>,
    outs: &mut [TensorMut<'_>],
    cx: &mut Context,
) -> Result<()> {
    const K: &str = "linear";
    for (name, d) in [("x", x.dtype), ("w", w.dtype)] {
        expect_dtype(K, name, d, DType::F32)?;
    }
    let (&[n, k], Some((&last, lead))) = (w.shape, x.shape.split_last()) else {
        return Err(shape_err(K, format!("x {:?} must have rank >= 1 and w {:?} rank 2", x.shape, w.shape)));
    };
    if last != k || outs.is_empty() || outs.len() > SPLIT_MAX {
        return Err(shape_err(K, format!("x {:?}, w {:?} and {} outputs do not fit", x.shape, w.shape, outs.len())));
    }
    let mut total = 0usize;
    for out in outs.iter() {
        expect_dtype(K, "out", out.dtype, DType::F32)?;
        match out.shape.split_last() {
            Some((&cols, olead)) if olead == lead => total = total.saturating_add(cols),
            _ => return Err(shape_err(K, format!("output {:?} does not fit x {:?}", out.shape, x.shape))),
        }
    }
    if total != n {
        return Err(shape_err(K, format!("outputs of {total} columns in all for w {:?}", w.shape)));
    }
    let bias = match &bias {
        Some(b) if b.shape != [n] => return Err(shape_err(K, format!("bias shape {:?}, expected [{n}]", b.shape))),
        Some(b) => {
            expect_dtype(K, "bias", b.dtype, DType::F32)?;
            Some(view::<f32>(K, "bias", b)?)
        }
        None => None,
    };
    let (m, count): (usize, usize) = (lead.iter().product(), outs.len());
    let xv = view::<f32>(K, "x", &x)?;
    if let Some(p) = packed.filter(|p| p.fits(cx.table) && p.k() == k && p.n() == n) {
        let mut parts: [SplitOut<'_>; SPLIT_MAX] = std::array::from_fn(|_| SplitOut { c: &mut [], cols: 0 });
        for (part, out) in parts.iter_mut().zip(outs.iter_mut()) {
            let cols = out.shape.last().copied().unwrap_or(0);
            *part = SplitOut { c: view_mut::<f32>(K, "out", out)?, cols };
        }
        let fused = LinearEpilogue { bias, activation, ..LinearEpilogue::default() }.store_step(cx.table, m, n)?;
        let parts = &mut parts[..count];
        if gemm_split_packed(cx.table, m, xv, k, p, parts, fused, &mut cx.scratch.pack) {
            return Ok(());
        }
    }
    // Output by output: its rows of `w`, its part of the bias.
    let wv = view::<f32>(K, "w", &w)?;
    let mut start = 0;
    for out in outs.iter_mut() {
        let cols = out.shape.last().copied().unwrap_or(0);
        let rows = &wv[start * k..(start + cols) * k];
        let shape = [cols, k];
        let wo = TensorRef { dtype: DType::F32, shape: &shape, data: bytemuck::cast_slice(rows) };
        let epilogue =
            LinearEpilogue { bias: bias.map(|b| &b[start..start + cols]), activation, ..LinearEpilogue::default() };
        let out = TensorMut { dtype: out.dtype, shape: out.shape, data: &mut *out.data };
        linear_fused_unpacked(x, wo, &epilogue, out, cx)?;
        start += cols;
    }
    Ok(())
}

/// [`linear`] with a packed weight: `out = x · wᵀ + bias`.
pub fn linear_packed(
    x: TensorRef,
    w: &PackedB,
    bias: Option<TensorRef>,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let bias = match &bias {
        Some(b) => {
            expect_dtype("linear", "bias", b.dtype, DType::F32)?;
            Some(view::<f32>("linear", "bias", b)?)
        }
        None => None,
    };
    linear_fused(x, w, &LinearEpilogue { bias, ..LinearEpilogue::default() }, out, cx)
}

/// [`matmul`] of `a` `[.., M, K]` (or `[K]`) by a packed 2-D `B` `[K, N]`
/// (the batch folds into M): `out` `[.., M, N]` (or `[N]`); f32.
pub fn matmul_packed(a: TensorRef, b: &PackedB, mut out: TensorMut, cx: &mut Context) -> Result<()> {
    const K: &str = "matmul";
    let m = check_rows_times_packed(K, &a, b, &out)?;
    let (av, ov) = (view::<f32>(K, "a", &a)?, view_mut::<f32>(K, "out", &mut out)?);
    gemm_prepacked_fused(cx.table, m, av, b.k(), b, ov, b.n(), 0.0, Epilogue::default(), &mut cx.scratch.pack)
}

/// Checks `x` `[.., K]` against a packed `[K, N]` operand and `out` `[.., N]`
/// (all f32); returns the rows (the product of x's leading dims).
fn check_rows_times_packed(kernel: &'static str, x: &TensorRef, w: &PackedB, out: &TensorMut) -> Result<usize> {
    expect_dtype(kernel, "x", x.dtype, DType::F32)?;
    expect_dtype(kernel, "out", out.dtype, DType::F32)?;
    let (n, k) = (w.n(), w.k());
    let Some((&last, lead)) = x.shape.split_last() else {
        return Err(shape_err(kernel, "x must have rank >= 1"));
    };
    let shape_ok = out.shape.split_last().is_some_and(|(&on, olead)| on == n && olead == lead);
    if last != k || !shape_ok {
        return Err(shape_err(
            kernel,
            format!("x {:?} and output {:?} do not fit a packed {k}x{n} operand", x.shape, out.shape),
        ));
    }
    Ok(lead.iter().product())
}
