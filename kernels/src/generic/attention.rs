//! Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention
//! semantics), as GEMM → mask + softmax → GEMM per batch matrix, over
//! blocks of query rows when the scores would be large (see `SCORES_MAX`).

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

/// Per batch matrix: scores = q·kᵀ (GEMM), scale + mask + softmax per row,
/// out = scores·v (GEMM). `mv` is the mask's raw bytes (bool or `T`).
/// Batch entries that share K and V along the innermost batch dim (GQA's
/// query heads of one K/V head, `[.., Hkv, R, L, E]` against K `[.., Hkv,
/// 1, S, E]`) run as one group: their R·L query rows, contiguous in q and
/// out, go through each GEMM at once, so K and V are packed once per group
/// instead of once per query head. A GEMM computes each element with the
/// same instructions whatever its row count, so grouping changes no bit.
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
    let group = if it.is_dense(0, l * e) { it.inner_shared(&[1, 2]) } else { 1 };
    let (rows, groups) = (group * l, it.count / group);
    let block = block_rows(rows, s);
    let threads = scratch.pack.threads;
    let small = it.count * l * s * (e + ev) < PARALLEL_MIN_FLOPS;
    if threads.count() == 1 || small {
        let (scores, pack) = T::scratch_split(scratch, block * s);
        for (g, o) in ov.chunks_exact_mut(rows * ev).enumerate() {
            attention_group(dims, g * group, group, 0..rows, qv, kv, vv, mv, causal, o, table, scores, pack);
        }
        return;
    }
    // Items over the threads, each thread with its own scores and panels:
    // every group's rows cut into `parts` ranges, so that few groups still
    // give every thread work (ViT-Tiny's 3 heads ran 2 : 1 on 2 threads; one
    // long head ran on one). A row's result does not depend on the range
    // it is computed in (see `block_rows`), so no bit depends on the cut.
    let parts = (2 * threads.count()).div_ceil(groups).min(rows);
    let per = rows.div_ceil(parts);
    let parts = rows.div_ceil(per);
    let workers = scratch.workers(threads.count(), |w| {
        T::scratch_split(w, block * s);
        w.pack.reserve_gemm(table, block, s, e);
        w.pack.reserve_gemm(table, block, ev, s);
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
        let (scores, pack) = T::scratch_split(&mut w, block * s);
        attention_group(dims, g * group, group, first..end, qv, kv, vv, mv, causal, o, table, scores, pack);
    });
}

/// Batch entries `t..t + group` (one K and V, contiguous q), their query
/// rows `range` (of the group's `group · l`; `o` holds just those rows):
/// `o = softmax(mask(scale · q kᵀ)) v`, each entry's rows masked as its own.
#[allow(clippy::too_many_arguments)]
fn attention_group<T: GemmFloat>(
    dims: &Dims,
    t: usize,
    group: usize,
    range: std::ops::Range<usize>,
    qv: &[T],
    kv: &[T],
    vv: &[T],
    mv: &[u8],
    causal: bool,
    o: &mut [T],
    table: &KernelTable,
    scores: &mut [T],
    pack: &mut PackBuffers,
) {
    let Dims { l, s, e, ev, ref it, ref mask, scale } = *dims;
    let (scale, rows) = (T::lit(scale), group * l);
    let (qo, ko, vo) = (it.offset(0, t), it.offset(1, t), it.offset(2, t));
    let block = block_rows(rows, s);
    for first in range.clone().step_by(block) {
        let n = block.min(range.end - first);
        let q_rows = &qv[qo + first * e..];
        T::gemm(table, n, s, e, q_rows, e, &kv[ko..], e, scores, s, true, T::ZERO, pack);
        for (r, row) in (first..).zip(scores[..n * s].chunks_exact_mut(s)) {
            let (entry, i) = (t + r / l, r % l);
            let at = |ml: &MaskLayout| it.offset(3, entry) + i * ml.row_stride;
            mask_row(row, i, scale, mask.as_ref().map(|ml| (ml, mv, at(ml))), causal);
            T::softmax_in_place(table, row);
        }
        let out_rows = &mut o[(first - range.start) * ev..(first - range.start + n) * ev];
        T::gemm(table, n, ev, s, scores, s, &vv[vo..], ev, out_rows, ev, false, T::ZERO, pack);
    }
}

/// The most score elements one pass over a group's query rows holds
/// (1 MiB of f32): a long sequence's rows go through the two GEMMs and the
/// softmax in blocks, so the scratch is `block × S`, never `L × S` (an 8 K
/// sequence would need 256 MiB per head).
const SCORES_MAX: usize = 1 << 18;
/// Fewer rows than this per block would repack K and V too often.
const MIN_BLOCK_ROWS: usize = 64;

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

/// Scores row `i` before its softmax: `x · scale`, then the mask (`mask`:
/// its layout, bytes and the row's first element) — a false bool is -inf, a
/// float is added — then -inf right of the diagonal when causal. Written as
/// whole-row loops the compiler vectorizes (the per-element form with its
/// branches took ~1/3 of BERT's attention); each element gets exactly the
/// per-element operations, in the same order.
fn mask_row<T: GemmFloat>(row: &mut [T], i: usize, scale: T, mask: Option<(&MaskLayout, &[u8], usize)>, causal: bool) {
    let s = row.len();
    for x in row.iter_mut() {
        *x = *x * scale;
    }
    match mask {
        None => {}
        Some((ml, mv, at)) if ml.is_bool && ml.col_stride == 1 => {
            for (x, &keep) in row.iter_mut().zip(&mv[at..at + s]) {
                *x = if keep == 0 { T::NEG_INFINITY } else { *x };
            }
        }
        Some((ml, mv, at)) if ml.col_stride == 1 && !ml.is_bool => {
            let size = std::mem::size_of::<T>();
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
    if causal && i + 1 < s {
        row[i + 1..].fill(T::NEG_INFINITY);
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
