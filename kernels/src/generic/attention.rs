//! Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention
//! semantics), as GEMM → mask + softmax → GEMM per batch matrix, over
//! blocks of query rows when the scores would be large (see `SCORES_MAX`);
//! over key tiles with an online softmax for long key sequences (see
//! `Path`).

use super::common::*;
use super::gemm::PARALLEL_MIN_FLOPS;
use super::math::Real;
use super::matmul::{BatchIter, GemmFloat};
use crate::context::Context;
use crate::parallel::SharedMut;
use crate::table::KernelTable;
use crate::types::{DType, PackBuffers, Result, Scratch, TensorMut, TensorRef};

/// How the mask's trailing [L, S] dims are addressed (stride 0 = broadcast).
struct MaskLayout {
    row_stride: usize,
    col_stride: usize,
    is_bool: bool,
}

/// The attention problem once shapes are checked: per-matrix sizes and the
/// batch broadcast of q, k, v and the mask (operands 0..4 of `it`).
struct Dims {
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    it: BatchIter,
    mask: Option<MaskLayout>,
    scale: f64,
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: TensorRef,
    k: TensorRef,
    v: TensorRef,
    mask: Option<TensorRef>,
    causal: bool,
    scale: Option<f64>,
    mut out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let (table, scratch) = (cx.table, &mut cx.scratch);
    const K: &str = "attention";
    for (what, d) in [("k", k.dtype), ("v", v.dtype), ("out", out.dtype)] {
        expect_dtype(K, what, d, q.dtype)?;
    }
    let (rq, rk, rv) = (q.shape.len(), k.shape.len(), v.shape.len());
    if rq < 2 || rk < 2 || rv < 2 {
        return Err(shape_err(K, "q, k and v must have rank >= 2"));
    }
    let (l, e) = (q.shape[rq - 2], q.shape[rq - 1]);
    let (s, ek) = (k.shape[rk - 2], k.shape[rk - 1]);
    let (sv, ev) = (v.shape[rv - 2], v.shape[rv - 1]);
    if ek != e || sv != s {
        return Err(shape_err(
            K,
            format!("q {:?}, k {:?}, v {:?} do not fit [..,L,E], [..,S,E], [..,S,Ev]", q.shape, k.shape, v.shape),
        ));
    }
    let (mask_batch, mask_layout, mask_mat): (&[usize], Option<MaskLayout>, usize) = match &mask {
        None => (&[], None, 0),
        Some(m) => {
            // A float mask has the operands' dtype, as torch requires.
            let is_bool = match m.dtype {
                DType::Bool => true,
                d if d == q.dtype => false,
                d => return Err(dtype_err(K, d)),
            };
            let rm = m.shape.len();
            let ml = if rm >= 2 { m.shape[rm - 2] } else { 1 };
            let ms = if rm >= 1 { m.shape[rm - 1] } else { 1 };
            if (ml != 1 && ml != l) || (ms != 1 && ms != s) {
                return Err(shape_err(K, format!("mask {:?} does not broadcast to [.., {l}, {s}]", m.shape)));
            }
            let layout = MaskLayout {
                row_stride: if ml == 1 { 0 } else { ms },
                col_stride: if ms == 1 { 0 } else { 1 },
                is_bool,
            };
            (&m.shape[..rm.saturating_sub(2)], Some(layout), ml * ms)
        }
    };
    let batches = [&q.shape[..rq - 2], &k.shape[..rk - 2], &v.shape[..rv - 2], mask_batch];
    let it = BatchIter::new(&batches, &[l * e, s * e, s * ev, mask_mat]).ok_or_else(|| {
        shape_err(
            K,
            format!("batch dims of q {:?}, k {:?}, v {:?} and mask do not broadcast", q.shape, k.shape, v.shape),
        )
    })?;
    let ro = out.shape.len();
    if ro < 2 || out.shape[..ro - 2] != *it.shape() || out.shape[ro - 2..] != [l, ev] {
        return Err(shape_err(K, format!("output shape {:?}, expected {:?} ++ [{l}, {ev}]", out.shape, it.shape())));
    }
    let mv: &[u8] = match &mask {
        Some(m) => {
            check_mask_len(m)?;
            m.data
        }
        None => &[],
    };
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let dims = Dims { l, s, e, ev, it, mask: mask_layout, scale };
    match q.dtype {
        DType::F32 => attention_typed::<f32>(
            &dims,
            view(K, "q", &q)?,
            view(K, "k", &k)?,
            view(K, "v", &v)?,
            mv,
            causal,
            view_mut(K, "out", &mut out)?,
            table,
            scratch,
        ),
        DType::F64 => attention_typed::<f64>(
            &dims,
            view(K, "q", &q)?,
            view(K, "k", &k)?,
            view(K, "v", &v)?,
            mv,
            causal,
            view_mut(K, "out", &mut out)?,
            table,
            scratch,
        ),
        d => return Err(dtype_err(K, d)),
    }
    Ok(())
}

/// q, k, v (as `T`), the mask's raw bytes (bool or `T`; empty without a
/// mask) and the causal flag: what every group of query rows reads.
struct Inputs<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: &'a [u8],
    causal: bool,
}

/// Per batch matrix: `softmax(mask(scale · q kᵀ)) v`, over blocks of query
/// rows, by one of the two paths of [`Path`]. Batch entries that share K
/// and V along the innermost batch dim (GQA's query heads of one K/V head,
/// `[.., Hkv, R, L, E]` against K `[.., Hkv, 1, S, E]`) run as one group:
/// their R·L query rows, contiguous in q and out, go through each GEMM at
/// once, so K and V are packed once per group instead of once per query
/// head. A GEMM computes each element with the same instructions whatever
/// its row count, so grouping changes no bit.
#[allow(clippy::too_many_arguments)]
fn attention_typed<T: GemmFloat>(
    dims: &Dims,
    qv: &[T],
    kv: &[T],
    vv: &[T],
    mv: &[u8],
    causal: bool,
    ov: &mut [T],
    table: &KernelTable,
    scratch: &mut Scratch,
) {
    let Dims { l, s, e, ev, ref it, .. } = *dims;
    if l * ev == 0 {
        return;
    }
    let x = Inputs { q: qv, k: kv, v: vv, mask: mv, causal };
    let group = if it.is_dense(0, l * e) { it.inner_shared(&[1, 2]) } else { 1 };
    let (rows, groups) = (group * l, it.count / group);
    let path = Path::for_shape(rows, s);
    let scratch_len = path.scratch_len(s, ev);
    let threads = scratch.pack.threads;
    let small = it.count * l * s * (e + ev) < PARALLEL_MIN_FLOPS;
    if threads.count() == 1 || small {
        let (buf, pack) = T::scratch_split(scratch, scratch_len);
        for (g, o) in ov.chunks_exact_mut(rows * ev).enumerate() {
            attention_group(dims, path, g * group, 0..rows, &x, o, table, buf, pack);
        }
        return;
    }
    // Items over the threads, each thread with its own scratch and panels:
    // every group's rows cut into `parts` ranges, so that few groups still
    // give every thread work (ViT-Tiny's 3 heads ran 2 : 1 on 2 threads; one
    // long head ran on one). A row's result does not depend on the range
    // it is computed in (see `Path`), so no bit depends on the cut.
    let parts = (2 * threads.count()).div_ceil(groups).min(rows);
    let per = path.align_range(rows.div_ceil(parts));
    let parts = rows.div_ceil(per);
    let workers = scratch.workers(threads.count(), |w| {
        T::scratch_split(w, scratch_len);
        path.reserve_gemms(&mut w.pack, table, s, e, ev);
    });
    let out = SharedMut(ov.as_mut_ptr());
    threads.for_each(groups * parts, |item| {
        let (g, first) = (item / parts, item % parts * per);
        let end = (first + per).min(rows);
        // SAFETY: items own disjoint row ranges (of `ev` elements a row) of
        // their groups' disjoint outputs, and `ov` stays borrowed mutably
        // until `for_each` returns.
        let o = unsafe { std::slice::from_raw_parts_mut(out.ptr().add((g * rows + first) * ev), (end - first) * ev) };
        let mut w = workers[threads.index()].lock().unwrap_or_else(|e| e.into_inner());
        let (buf, pack) = T::scratch_split(&mut w, scratch_len);
        attention_group(dims, path, g * group, first..end, &x, o, table, buf, pack);
    });
}

/// The most score elements one pass over a group's query rows holds
/// (1 MiB of f32): a long sequence's rows go through the two GEMMs and the
/// softmax in blocks, so the scratch is `block × S`, never `L × S` (an 8 K
/// sequence would need 256 MiB per head).
const SCORES_MAX: usize = 1 << 18;
/// Fewer rows than this per block would repack K and V too often.
const MIN_BLOCK_ROWS: usize = 64;
/// Keys per tile of the key-tiled path: 64 rows × 512 keys of f32 scores is
/// 128 KiB, as are 512 keys of a 64-wide V, so a tile's scores and V stay in
/// L2 between the two GEMMs; and the q block, packed again for every tile,
/// costs 1/512 of the tile's multiply-adds.
const KEY_TILE: usize = 512;

/// How a group's query rows are computed, chosen from the shape alone.
///
/// - `TwoPass`: per block of rows, all S scores of each row (GEMM), mask,
///   softmax in place, then out = scores · v (GEMM). Scratch `block × S`.
/// - `KeyTiled`: per block of rows, the keys in tiles of [`KEY_TILE`]: a
///   tile's scores (GEMM), masked, folded into each row's running maximum
///   and sum (the online softmax), and its `exp(scores - max) · v_tile`
///   added into an output accumulator rescaled whenever the maximum grows;
///   the rows are divided by their sums at the end. Scratch
///   `block × (KEY_TILE + Ev)` whatever S. When causal, tiles wholly right
///   of a block's diagonal are not computed.
///
/// Key-tiled is taken when even a minimal two-pass block (`MIN_BLOCK_ROWS`
/// rows) would hold more than [`SCORES_MAX`] scores, i.e. S > 4096: below
/// that the two-pass scratch is bounded anyway (≤ 1 MiB a thread) and its
/// bits are what the model fixtures pin; above it, `block × S` grows with S
/// (64 MiB a thread at S = 256 K).
///
/// Both give a row whose every key is masked zeros (torch's
/// `_safe_softmax`). A key a row does not attend still has its value times
/// a zero weight added in, so an inf or NaN value there makes the row NaN
/// (as torch's math SDPA) — except, on the key-tiled path, in causal tiles
/// the row's block skips, which are never read.
///
/// Bits: in both paths a row's result depends only on the row and the
/// shape. Two-pass rows are independent of their block. Key-tiled rows
/// depend on which tiles their block visits (causal), so its blocks start
/// at multiples of `block` from the group's first row whatever the thread
/// count ([`Path::align_range`]).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    TwoPass { block: usize },
    KeyTiled { block: usize },
}

impl Path {
    fn for_shape(rows: usize, s: usize) -> Path {
        if MIN_BLOCK_ROWS.saturating_mul(s) > SCORES_MAX {
            Path::KeyTiled { block: MIN_BLOCK_ROWS.min(rows) }
        } else {
            Path::TwoPass { block: block_rows(rows, s) }
        }
    }

    /// Elements of `T` one thread's pass needs: scores, and for the
    /// key-tiled path the output accumulator.
    fn scratch_len(self, s: usize, ev: usize) -> usize {
        match self {
            Path::TwoPass { block } => block * s,
            Path::KeyTiled { block } => block * (KEY_TILE + ev),
        }
    }

    /// A per-thread row count rounded so that every range, hence every
    /// block, starts where a single-threaded pass would start one.
    fn align_range(self, per: usize) -> usize {
        match self {
            Path::TwoPass { .. } => per,
            Path::KeyTiled { block } => per.next_multiple_of(block),
        }
    }

    /// Grows `pack` to what the path's two GEMMs pack.
    fn reserve_gemms(self, pack: &mut PackBuffers, table: &KernelTable, s: usize, e: usize, ev: usize) {
        let (block, keys) = match self {
            Path::TwoPass { block } => (block, s),
            Path::KeyTiled { block } => (block, KEY_TILE.min(s)),
        };
        pack.reserve_gemm(table, block, keys, e);
        pack.reserve_gemm(table, block, ev, keys);
    }
}

/// The group of batch entries from `t` (one K and V, contiguous q), its
/// query rows `range` (of the group's `group · l`; `o` holds just those rows):
/// `o = softmax(mask(scale · q kᵀ)) v`, each entry's rows masked as its own.
#[allow(clippy::too_many_arguments)]
fn attention_group<T: GemmFloat>(
    dims: &Dims,
    path: Path,
    t: usize,
    range: std::ops::Range<usize>,
    x: &Inputs<T>,
    o: &mut [T],
    table: &KernelTable,
    scratch: &mut [T],
    pack: &mut PackBuffers,
) {
    match path {
        Path::TwoPass { block } => two_pass_group(dims, block, t, range, x, o, table, scratch, pack),
        Path::KeyTiled { block } => {
            debug_assert_eq!(range.start % block, 0, "key-tiled blocks start at multiples of the block");
            key_tiled_group(dims, block, t, range, x, o, table, scratch, pack)
        }
    }
}

/// [`Path::TwoPass`]: `scores` holds `block × S`.
#[allow(clippy::too_many_arguments)]
fn two_pass_group<T: GemmFloat>(
    dims: &Dims,
    block: usize,
    t: usize,
    range: std::ops::Range<usize>,
    x: &Inputs<T>,
    o: &mut [T],
    table: &KernelTable,
    scores: &mut [T],
    pack: &mut PackBuffers,
) {
    let Dims { s, e, ev, ref it, scale, .. } = *dims;
    let scale = T::lit(scale);
    let (qo, ko, vo) = (it.offset(0, t), it.offset(1, t), it.offset(2, t));
    for first in range.clone().step_by(block) {
        let n = block.min(range.end - first);
        let q_rows = &x.q[qo + first * e..];
        T::gemm(table, n, s, e, q_rows, e, &x.k[ko..], e, scores, s, true, T::ZERO, pack);
        for (r, row) in (first..).zip(scores[..n * s].chunks_exact_mut(s)) {
            mask_group_row(dims, x, t, r, 0, scale, row);
            T::softmax_in_place(table, row);
        }
        let out_rows = &mut o[(first - range.start) * ev..(first - range.start + n) * ev];
        T::gemm(table, n, ev, s, scores, s, &x.v[vo..], ev, out_rows, ev, false, T::ZERO, pack);
    }
}

/// [`Path::KeyTiled`]: `scratch` holds a `block × KEY_TILE` score tile and
/// the `block × Ev` output accumulator; each row's running maximum and sum
/// live on the stack.
#[allow(clippy::too_many_arguments)]
fn key_tiled_group<T: GemmFloat>(
    dims: &Dims,
    block: usize,
    t: usize,
    range: std::ops::Range<usize>,
    x: &Inputs<T>,
    o: &mut [T],
    table: &KernelTable,
    scratch: &mut [T],
    pack: &mut PackBuffers,
) {
    let Dims { l, s, e, ev, ref it, scale, .. } = *dims;
    let scale = T::lit(scale);
    let (qo, ko, vo) = (it.offset(0, t), it.offset(1, t), it.offset(2, t));
    let (tile, acc) = scratch.split_at_mut(block * KEY_TILE);
    for first in range.clone().step_by(block) {
        let n = block.min(range.end - first);
        let acc = &mut acc[..n * ev];
        acc.fill(T::ZERO);
        // `block` is at most MIN_BLOCK_ROWS (`Path::for_shape`).
        let mut state = [RowSoftmax::<T>::EMPTY; MIN_BLOCK_ROWS];
        let keys = if x.causal { causal_key_end(first, n, l, s) } else { s };
        for cols in key_tiles(keys, s) {
            let (c0, w) = (cols.start, cols.len());
            let tile = &mut tile[..n * w];
            T::gemm(table, n, w, e, &x.q[qo + first * e..], e, &x.k[ko + c0 * e..], e, tile, w, true, T::ZERO, pack);
            for ((r, row), st) in (first..).zip(tile.chunks_exact_mut(w)).zip(&mut state) {
                mask_group_row(dims, x, t, r, c0, scale, row);
                let j = r - first;
                st.add_tile(table, row, &mut acc[j * ev..(j + 1) * ev]);
            }
            T::gemm(table, n, ev, w, tile, w, &x.v[vo + c0 * ev..], ev, acc, ev, false, T::ONE, pack);
        }
        let out_rows = &mut o[(first - range.start) * ev..(first - range.start + n) * ev];
        for ((out, a), st) in out_rows.chunks_exact_mut(ev).zip(acc.chunks_exact(ev)).zip(&state) {
            st.finish(a, out);
        }
    }
}

/// One query row's online softmax: the largest score seen so far and the
/// sum of `exp(score - max)` over the keys seen (in f64, as the two-pass
/// softmax sums).
#[derive(Clone, Copy)]
struct RowSoftmax<T> {
    max: T,
    sum: f64,
}

impl<T: GemmFloat> RowSoftmax<T> {
    const EMPTY: RowSoftmax<T> = RowSoftmax { max: T::NEG_INFINITY, sum: 0.0 };

    /// Folds a tile of masked scores in: the tile becomes its weights
    /// `exp(score - max')` under the new running maximum `max'` (what the
    /// caller's GEMM then adds times V into `acc`), and `acc` and the sum
    /// are rescaled by `exp(max - max')` when the maximum grows. While every
    /// key so far is masked (-inf), the weights are zeros and nothing moves.
    fn add_tile(&mut self, table: &KernelTable, tile: &mut [T], acc: &mut [T]) {
        let max = nan_max(self.max, T::row_max(table, tile));
        if max == T::NEG_INFINITY {
            tile.fill(T::ZERO);
            return;
        }
        let tile_sum = T::exp_sum(table, tile, max);
        // `!=` also holds for a NaN maximum, which then spreads to the row.
        if max != self.max {
            let rescale = (self.max - max).exp();
            acc.iter_mut().for_each(|a| *a = *a * rescale);
            self.sum *= rescale.to_f64();
            self.max = max;
        }
        self.sum += tile_sum;
    }

    /// The row's output `acc / sum`; a row whose every key was masked gives
    /// zeros, as the two-pass softmax does (torch's `_safe_softmax`).
    fn finish(&self, acc: &[T], out: &mut [T]) {
        if self.max == T::NEG_INFINITY {
            out.fill(T::ZERO);
            return;
        }
        let inv = T::from_f64(1.0 / self.sum);
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = a * inv;
        }
    }
}

/// The NaN-propagating maximum of two scores (as the table's row maximum).
fn nan_max<T: GemmFloat>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b > a || b.is_nan() {
        b
    } else {
        a
    }
}

/// One past the last key any of the group's rows `first..first + n` sees
/// when causal: row `r` is query `r % l` of its entry and sees keys
/// `0..=r % l` (the top-left aligned diagonal, as torch's `is_causal` and
/// [`mask_row`]); a block that spans two entries holds some entry's last
/// query.
fn causal_key_end(first: usize, n: usize, l: usize, s: usize) -> usize {
    let last = first + n - 1;
    let last_query = if first / l == last / l { last % l } else { l - 1 };
    (last_query + 1).min(s)
}

/// The key tiles covering keys `0..end` of `s`: tiles of [`KEY_TILE`] from
/// key 0, the last cut at `s` (not at `end`: a tile's keys are fixed by S,
/// its columns past `end` are masked like any right of the diagonal).
fn key_tiles(end: usize, s: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..end).step_by(KEY_TILE).map(move |c0| c0..(c0 + KEY_TILE).min(s))
}

/// Query rows per block for `rows` rows over `s` keys. Every row's scores,
/// softmax and output take the same instructions in a block as in one pass
/// (a GEMM computes each element alike whatever its row count), so the
/// blocking changes no bit.
fn block_rows(rows: usize, s: usize) -> usize {
    if rows.saturating_mul(s) <= SCORES_MAX {
        rows
    } else {
        (SCORES_MAX / s.max(1)).max(MIN_BLOCK_ROWS).min(rows)
    }
}

/// Row `r` of the group from batch entry `t` (query `r % l` of entry
/// `t + r / l`), its scores for keys `c0..c0 + row.len()`, scaled and
/// masked by [`mask_row`] with that entry's mask rows.
fn mask_group_row<T: GemmFloat>(dims: &Dims, x: &Inputs<T>, t: usize, r: usize, c0: usize, scale: T, row: &mut [T]) {
    let (entry, i) = (t + r / dims.l, r % dims.l);
    let at = |ml: &MaskLayout| dims.it.offset(3, entry) + i * ml.row_stride;
    mask_row(row, c0, i, scale, dims.mask.as_ref().map(|ml| (ml, x.mask, at(ml))), x.causal);
}

/// Scores of row `i` for keys `c0..c0 + row.len()`, before the softmax:
/// `x · scale`, then the mask (`mask`: its layout, bytes and the row's
/// element for key 0) — a false bool is -inf, a float is added — then -inf
/// right of the diagonal when causal. Written as whole-row loops the
/// compiler vectorizes (the per-element form with its branches took ~1/3 of
/// BERT's attention); each element gets exactly the per-element operations,
/// in the same order, whichever column range it is computed in.
fn mask_row<T: GemmFloat>(
    row: &mut [T],
    c0: usize,
    i: usize,
    scale: T,
    mask: Option<(&MaskLayout, &[u8], usize)>,
    causal: bool,
) {
    let s = row.len();
    for x in row.iter_mut() {
        *x = *x * scale;
    }
    match mask {
        None => {}
        Some((ml, mv, at)) if ml.is_bool && ml.col_stride == 1 => {
            for (x, &keep) in row.iter_mut().zip(&mv[at + c0..at + c0 + s]) {
                *x = if keep == 0 { T::NEG_INFINITY } else { *x };
            }
        }
        Some((ml, mv, at)) if ml.col_stride == 1 && !ml.is_bool => {
            let (size, at) = (std::mem::size_of::<T>(), at + c0);
            match bytemuck::try_cast_slice::<u8, T>(&mv[at * size..(at + s) * size]) {
                Ok(m) => {
                    for (x, &m) in row.iter_mut().zip(m) {
                        *x += m;
                    }
                }
                Err(_) => {
                    for (j, x) in row.iter_mut().enumerate() {
                        *x += float_at::<T>(mv, at + j);
                    }
                }
            }
        }
        // A mask broadcast along the row: one value for all of it.
        Some((ml, mv, at)) => {
            if ml.is_bool {
                if mv[at] == 0 {
                    row.fill(T::NEG_INFINITY);
                }
            } else {
                let m = float_at::<T>(mv, at);
                for x in row.iter_mut() {
                    *x += m;
                }
            }
        }
    }
    if causal && i + 1 < c0 + s {
        row[(i + 1).saturating_sub(c0)..].fill(T::NEG_INFINITY);
    }
}

fn check_mask_len(m: &TensorRef) -> Result<()> {
    let n = numel("attention", m.shape)?;
    if n * m.dtype.size_bytes() != m.data.len() {
        return Err(shape_err("attention", format!("mask shape {:?} does not match {} bytes", m.shape, m.data.len())));
    }
    Ok(())
}

/// Element `i` of a float mask stored as raw bytes (read unaligned).
#[inline(always)]
fn float_at<T: Real>(bytes: &[u8], i: usize) -> T {
    let size = std::mem::size_of::<T>();
    bytemuck::pod_read_unaligned(&bytes[i * size..(i + 1) * size])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key-tiled path starts where a minimal two-pass block would hold
    /// more than `SCORES_MAX` scores, whatever the row count.
    #[test]
    fn long_key_sequences_take_the_key_tiled_path() {
        assert_eq!(Path::for_shape(100, 4096), Path::TwoPass { block: 64 });
        assert_eq!(Path::for_shape(1, 4096), Path::TwoPass { block: 1 });
        assert_eq!(Path::for_shape(100, 4097), Path::KeyTiled { block: 64 });
        assert_eq!(Path::for_shape(3, 1 << 21), Path::KeyTiled { block: 3 });
        // Its scratch does not grow with S.
        let tiled = Path::for_shape(1000, 1 << 20);
        assert_eq!(tiled.scratch_len(1 << 20, 64), tiled.scratch_len(5000, 64));
        assert_eq!(tiled.align_range(100), 128);
    }

    /// Causal: a block sees keys up to its last query's diagonal (its
    /// entry's last query when it spans two entries), capped at S; the tiles
    /// cover just those keys, cut at multiples of `KEY_TILE`.
    #[test]
    fn causal_blocks_visit_only_tiles_left_of_the_diagonal() {
        let tiles = |end, s| key_tiles(end, s).collect::<Vec<_>>();
        // Rows 0..64 of 700 queries: keys 0..64, one tile.
        assert_eq!(causal_key_end(0, 64, 700, 4200), 64);
        assert_eq!(tiles(64, 4200), vec![std::ops::Range { start: 0, end: 512 }]);
        // Rows 640..700: keys 0..700, the diagonal in the second tile; the
        // seven tiles from key 1024 are not visited.
        assert_eq!(causal_key_end(640, 60, 700, 4200), 700);
        assert_eq!(tiles(700, 4200), [0..512, 512..1024]);
        // A block spanning two entries of 70 queries holds query 69.
        assert_eq!(causal_key_end(64, 64, 70, 5000), 70);
        assert_eq!(causal_key_end(128, 12, 70, 5000), 70);
        // More queries than keys: every key, the last tile cut at S.
        assert_eq!(causal_key_end(4096, 14, 4110, 4100), 4100);
        assert_eq!(tiles(4100, 4100).last(), Some(&(4096..4100)));
        assert_eq!(tiles(4100, 4100).len(), 9);
    }

    /// `mask_row` on a column range gives each element what the whole row
    /// gives it.
    #[test]
    fn mask_row_on_a_column_range_equals_the_whole_row() {
        let s = 37;
        let scores: Vec<f32> = (0..s).map(|j| j as f32 * 0.25 - 3.0).collect();
        let bias: Vec<f32> = (0..s).map(|j| (j % 5) as f32 - 2.0).collect();
        let keep: Vec<u8> = (0..s).map(|j| u8::from(j % 4 != 0)).collect();
        let float = MaskLayout { row_stride: s, col_stride: 1, is_bool: false };
        let boolean = MaskLayout { row_stride: s, col_stride: 1, is_bool: true };
        let masks: [Option<(&MaskLayout, &[u8])>; 3] =
            [None, Some((&float, bytemuck::cast_slice(&bias))), Some((&boolean, &keep))];
        for mask in masks {
            for (i, causal) in [(0, true), (20, true), (40, true), (20, false)] {
                let mut whole = scores.clone();
                mask_row(&mut whole, 0, i, 0.5, mask.map(|(ml, mv)| (ml, mv, 0)), causal);
                for (c0, c1) in [(0, 10), (10, 21), (21, 37)] {
                    let mut part = scores[c0..c1].to_vec();
                    mask_row(&mut part, c0, i, 0.5, mask.map(|(ml, mv)| (ml, mv, 0)), causal);
                    let (got, want): (Vec<u32>, Vec<u32>) =
                        part.iter().zip(&whole[c0..c1]).map(|(a, b)| (a.to_bits(), b.to_bits())).unzip();
                    assert_eq!(got, want, "columns {c0}..{c1} of row {i}, causal {causal}");
                }
            }
        }
    }
}
