//! W8A8: per-row dynamically quantized int8 activations times int8 weights,
//! an exact i32 dot product per output, then torchao's f32 epilogue.
//!
//! The driver quantizes every row of `x` once into the context's scratch
//! (zero-padded to the weight's lane depth, rows padded to the
//! microkernel's MR), then hands out (row block, column group) items to the
//! context's threads. Every item runs the table's MR×NR microkernel over
//! whole K — no K slices, so each output is one i32 sum computed by one
//! call, and the result is the same whatever the thread count (and, since
//! integer sums are exact, whatever the variant).

use super::pack::{strip_bytes, CopyKind, LANE_I8, STRIP};
use super::{PackedQWeights, QBits, QuantKernels};
use crate::context::Context;
use crate::generic::gemm::PARALLEL_MIN_FLOPS;
use crate::parallel::{SharedMut, Threads};

/// One microkernel call: `acc[i*nr + j] = Σ_p a[i][p] · b[j][p]` for the
/// `mr` activation rows at `a` (row stride `lda` bytes, `4·k4` values
/// each, stored as the entry's [`Acts`] says) and the `nr / 16`
/// consecutive weight strips at `b` (`strip` bytes apart, each `k4` lane
/// steps of 64 bytes); the sum is exact (wrapping i32, which is exact while
/// the true sum fits: `k < 2^17`).
pub(crate) type QKernelFn = fn(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]);

/// [`QKernelFn`] reading its rows from a channels-last image in place (an
/// implicit im2col): row `i`'s `4 · c4 · offs.len()` activations are the
/// runs `image[rows[i] + o..][..4 · c4]` for each tap offset `o` of `offs`
/// in turn (a window's taps, each `C` channels), so the sums are those of
/// the gathered rows and the same weights, exactly. `rows` has `mr`
/// entries.
pub(crate) type QWindowFn =
    fn(c4: usize, image: &[u8], rows: &[usize], offs: &[usize], b: &[u8], strip: usize, acc: &mut [i32]);

/// The kernel table's int8 GEMM entry.
#[derive(Copy, Clone)]
pub(crate) struct QGemmUkr {
    pub(crate) variant: &'static str,
    /// Activation rows per call.
    pub(crate) mr: usize,
    /// Columns per call: 16 or 32 (one or two strips).
    pub(crate) nr: usize,
    /// How the driver stores the activation rows the kernel reads.
    pub(crate) acts: Acts,
    pub(crate) run: QKernelFn,
    /// `run` reading a second copy of the weights made once at pack time
    /// in the layout its instructions want, where the entry has one.
    pub(crate) copy: Option<CopyKernel>,
    /// [`QWindowFn`], where the entry has one: a convolution whose window
    /// rows the kernel can read in place skips the gather copy.
    pub(crate) window: Option<QWindowFn>,
    /// The driver's per-value loops, compiled for the entry's ISA.
    pub(crate) driver: Driver,
}

/// A [`QGemmUkr`]'s kernel for a second copy of the weights (`pack.rs`):
/// the weights widened to i16 (a kernel that multiplies i16 pairs skips a
/// sign extension per weight vector), or in column pairs (`smmla`
/// operands). [`multiply`] takes it for `min_rows` rows or more when the
/// packed weight holds that copy ([`super::PackedQWeights::pack_for`]);
/// its sums are `run`'s, exactly. Its `strip` argument is the copy's.
#[derive(Copy, Clone)]
pub(crate) struct CopyKernel {
    pub(crate) kind: CopyKind,
    pub(crate) run: QKernelFn,
    pub(crate) min_rows: usize,
}

/// The loops around the microkernel that touch every activation and every
/// output: writing quantized activations in the entry's storage, and the
/// tile store. Plain Rust the compiler vectorises; an ISA's entries use
/// copies compiled for it (each wrapper a `#[target_feature]` function
/// the inlined loop is compiled into): the same operations
/// (no contraction into FMA), so the same bits.
#[derive(Copy, Clone)]
pub(crate) struct Driver {
    pub(crate) encode: EncodeFn,
    pub(crate) store: StoreFn,
    /// [`store_tile_quantized`]: a tile's rows finished and quantized for
    /// the next layer (an i8 result), one call per tile.
    pub(crate) store_q: StoreQFn,
    /// The int8 depthwise convolution's image and row loops ([`super::depthwise`]).
    pub(crate) depthwise: super::depthwise::DepthwiseFns,
}

/// [`super::encode_quantized`]'s signature.
pub(crate) type EncodeFn = fn(acts: Acts, src: &[f32], s: f32, zp: i32, dst: &mut [u8]);
/// [`store_row`]'s signature.
pub(crate) type StoreFn = fn(o: &mut [f32], acc: &[i32], s: f32, e: &Epilogue<'_>, shift: i32);
/// [`store_tile_quantized`]'s signature (`unsafe`: the tile writes
/// through its raw output pointer, see [`QTile`]).
pub(crate) type StoreQFn = unsafe fn(t: &QTile<'_>);

/// The driver compiled for the build's baseline.
pub(crate) const GENERIC_DRIVER: Driver = Driver {
    encode: super::encode_quantized,
    store: store_row,
    store_q: store_tile_quantized,
    depthwise: super::depthwise::GENERIC_DEPTHWISE,
};

/// The storage of the quantized activations a [`QGemmUkr`] reads.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Acts {
    /// One i8 per value.
    I8,
    /// One u8 per value, `q + 128` (`vpdpbusd` multiplies u8 by i8); the
    /// driver takes `128 · Σ_p w` off each column.
    U8Offset,
    /// One little-endian i16 per value, so a kernel that multiplies i16
    /// pairs (`vpmaddwd`) broadcasts a row's lane step with a plain load
    /// instead of sign-extending it once per row and step.
    I16,
}

impl Acts {
    /// Bytes per stored value.
    pub(crate) fn width(self) -> usize {
        match self {
            Acts::I8 | Acts::U8Offset => 1,
            Acts::I16 => 2,
        }
    }
}

const GENERIC_MR: usize = 4;

/// The portable variant, and the oracle.
pub(crate) const GENERIC_UKR: QGemmUkr = QGemmUkr {
    variant: "generic_4x16",
    mr: GENERIC_MR,
    nr: STRIP,
    acts: Acts::I8,
    run: generic_kernel,
    copy: None,
    window: None,
    driver: GENERIC_DRIVER,
};

fn generic_kernel(k4: usize, a: &[u8], lda: usize, b: &[u8], _strip: usize, acc: &mut [i32]) {
    let mut sums = [[0i32; STRIP]; GENERIC_MR];
    for (i, row) in sums.iter_mut().enumerate() {
        let a = &a[i * lda..][..4 * k4];
        for (t, quad) in a.chunks_exact(4).enumerate() {
            let lanes = &b[t * 64..][..64];
            for (c, sum) in row.iter_mut().enumerate() {
                let w = &lanes[c * 4..][..4];
                for kk in 0..4 {
                    *sum = sum.wrapping_add(quad[kk] as i8 as i32 * w[kk] as i8 as i32);
                }
            }
        }
    }
    acc[..GENERIC_MR * STRIP].copy_from_slice(sums.as_flattened());
}

/// Rows per block handed to one work item (a multiple of every MR: 2, 4, 6, 8).
const MC: usize = 96;

/// Largest K whose i32 sums cannot overflow: `K · 128 · 128 < 2^31`.
pub(crate) const MAX_K: usize = (1 << 17) - 1;

/// How the activation rows are quantized.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Rows {
    /// Per row, symmetric (the table's row quantizer).
    Dynamic,
    /// Per row, a scale and zero point from the row's range.
    DynamicAsymmetric,
    /// One compile-time scale and zero point for every row.
    Static { scale: f32, zero_point: i32 },
}

/// `out = (f32(Σ (q_x − zp) · q_w) · s_row) · scale[j] (+ bias[j])` for every row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: &[f32],
    m: usize,
    w: &PackedQWeights,
    act: Rows,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let ukr = kernels.int8;
    let (n, k) = (w.n, w.k);
    let layout = &w.layout;
    debug_assert_eq!(w.bits, QBits::I8);
    let kp = layout.kp;
    let mpad = m.next_multiple_of(ukr.mr);
    let threads = threads_for(cx, m, n, k);
    // One f32 buffer holds the row scales, the rows' shifts (i32 bits),
    // then the quantized rows' bytes (`lda` is a multiple of 4, so they
    // fill whole f32s).
    let lda = kp * ukr.acts.width();
    let buf = cx.scratch.f32s(2 * m + mpad * lda / 4);
    let (scales, rest) = buf.split_at_mut(m);
    let (shifts, rows) = rest.split_at_mut(m);
    let shifts: &mut [i32] = bytemuck::cast_slice_mut(shifts);
    let rows: &mut [u8] = bytemuck::cast_slice_mut(rows);
    // Padded K lanes meet zero weights, so their bytes add nothing; each
    // row's zero point and the u8 offset come off through the column sums:
    // `Σ (q − zp) · w = Σ q · w − zp · Σ w`.
    let offset = if ukr.acts == Acts::U8Offset { 128 } else { 0 };
    // Rows are independent: quantized over the threads, a fixed number per
    // item (the split moves no result).
    const ROWS_PER_ITEM: usize = 16;
    let (rows_at, scales_at, shifts_at) =
        (SharedMut(rows.as_mut_ptr()), SharedMut(scales.as_mut_ptr()), SharedMut(shifts.as_mut_ptr()));
    threads.for_each(m.div_ceil(ROWS_PER_ITEM), |item| {
        for i in item * ROWS_PER_ITEM..((item + 1) * ROWS_PER_ITEM).min(m) {
            // SAFETY: row `i` (its bytes, scale and shift) belongs to this
            // item alone, and `i < m` is inside each buffer.
            let (row, s, shift) = unsafe {
                (
                    std::slice::from_raw_parts_mut(rows_at.ptr().add(i * lda), lda),
                    &mut *scales_at.ptr().add(i),
                    &mut *shifts_at.ptr().add(i),
                )
            };
            let (scale, zero_point) = quantize_row(kernels, &x[i * k..][..k], act, row);
            (*s, *shift) = (scale, zero_point + offset);
        }
    });
    let pad_byte = if ukr.acts == Acts::U8Offset { 0x80 } else { 0 };
    rows[m * lda..].fill(pad_byte);
    let rows = QuantRows { bytes: rows, lda, window: None, scales, shifts };
    multiply(ukr, threads, &rows, m, w, bias, None, TileOut::F32(out));
}

/// Quantized activation rows as a [`QGemmUkr`] reads them: `lda` bytes a
/// row (the weight's lane depth in the entry's [`Acts`] storage, zero past
/// K, rows padded to MR), and each row's scale and shift (its zero point,
/// plus 128 for offset storage).
pub(crate) struct QuantRows<'r> {
    pub(crate) bytes: &'r [u8],
    pub(crate) lda: usize,
    /// Instead of `bytes`: the rows read in place from an image by the
    /// entry's [`QWindowFn`].
    pub(crate) window: Option<Windows<'r>>,
    pub(crate) scales: &'r [f32],
    pub(crate) shifts: &'r [i32],
}

/// The windows of a channels-last convolution's output pixels `first..`
/// in its padded quantized image (`[H, W, C]`, each value in the entry's
/// storage): pixel `p` (`oy = p / ow`, `ox = p % ow`) starts at byte
/// `oy · row_step + ox · col_step`, and its row is the `c4` lane steps at
/// each tap offset of `offs`.
#[derive(Copy, Clone)]
pub(crate) struct Windows<'r> {
    pub(crate) image: &'r [u8],
    pub(crate) offs: &'r [usize],
    pub(crate) c4: usize,
    pub(crate) first: usize,
    pub(crate) ow: usize,
    pub(crate) row_step: usize,
    pub(crate) col_step: usize,
}

impl Windows<'_> {
    /// The image offsets of rows `r..r + bases.len()` of the `m` rows; rows
    /// past `m` (a last block's padding, never stored) repeat the last.
    fn bases(&self, r: usize, m: usize, bases: &mut [usize]) {
        for (i, b) in bases.iter_mut().enumerate() {
            let p = self.first + (r + i).min(m - 1);
            *b = (p / self.ow) * self.row_step + (p % self.ow) * self.col_step;
        }
    }
}

/// Whether `m × n × k` is worth the pool (as the f32 GEMM decides).
pub(crate) fn threads_for(cx: &Context, m: usize, n: usize, k: usize) -> Threads {
    if m * n * k < PARALLEL_MIN_FLOPS {
        Threads::single()
    } else {
        cx.threads()
    }
}

/// Where [`multiply`] writes its `[m, n]` result.
pub(crate) enum TileOut<'o> {
    F32(&'o mut [f32]),
    /// Each f32 value quantized with `(scale, zero point)` as the next
    /// layer quantizes its input ([`super::quantize_value`]), in the tile
    /// store (no f32 block).
    I8(&'o mut [i8], f32, i32),
    /// [`TileOut::I8`] after a residual add in the store: each finished
    /// value plus `residual`'s (the same `[m, n]` positions), clamped to
    /// `after` (a ReLU/ReLU6 after the add; infinite bounds: none), then
    /// quantized.
    I8Residual {
        out: &'o mut [i8],
        scale: f32,
        zero_point: i32,
        residual: Residual<'o>,
        after: (f32, f32),
    },
}

/// A residual: f32 values, or int8 ones with their scale and zero point,
/// dequantized as torch does (`(q − zero point) · scale`) — what a
/// convolution's epilogue or the quantizing tile store adds.
#[derive(Copy, Clone)]
pub(crate) enum Residual<'a> {
    F32(&'a [f32]),
    I8(&'a [i8], f32, i32),
}

impl<'a> Residual<'a> {
    pub(crate) fn range(self, r: std::ops::Range<usize>) -> Residual<'a> {
        match self {
            Residual::F32(v) => Residual::F32(&v[r]),
            Residual::I8(v, s, zp) => Residual::I8(&v[r], s, zp),
        }
    }

    fn len(self) -> usize {
        match self {
            Residual::F32(r) => r.len(),
            Residual::I8(r, ..) => r.len(),
        }
    }
}

/// `out[i][j] = (f32(Σ_p row_i[p] · w[j][p] − shift_i · Σ_p w[j][p]) · s_i) ·
/// scale[j] (+ bias[j])`, then clamped to `clamp`'s bounds if given (as the
/// clamp kernel does: a fused ReLU/ReLU6), over `m` prepared rows, in (row
/// block, column group) items on `threads`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn multiply(
    ukr: QGemmUkr,
    threads: Threads,
    r: &QuantRows<'_>,
    m: usize,
    w: &PackedQWeights,
    bias: Option<&[f32]>,
    clamp: Option<(f32, f32)>,
    out: TileOut<'_>,
) {
    // Infinite bounds change no value (NaN included).
    let (lo, hi) = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let (n, layout) = (w.n, &w.layout);
    let (kp, lda) = (layout.kp, r.lda);
    let (rows, scales, shifts) = (r.bytes, r.scales, r.shifts);
    let r_window = r.window;
    // Checked once here: the window kernel's rows are whole lane steps of
    // the packed depth (its own asserts bound the image reads).
    if let Some(win) = &r_window {
        assert!(ukr.window.is_some() && ukr.mr <= 8, "qgemm: windows without a window kernel");
        assert_eq!(win.c4 * win.offs.len() * LANE_I8, kp, "qgemm: windows do not cover the packed depth");
        assert!(m > 0 && win.ow > 0, "qgemm: empty windows");
    }
    // The kernel and the weight bytes it reads: the entry's copy for
    // enough rows, when the entry has a kernel for one and the weight was
    // packed with that copy (not for the window kernels' convolutions).
    let (kernel, weights, strip) = match (ukr.copy, &layout.copy) {
        (Some(ck), Some(copy)) if ck.kind == copy.kind && m >= ck.min_rows && r_window.is_none() => {
            (ck.run, copy.bytes(), copy.strip)
        }
        _ => (ukr.run, layout.bytes(), strip_bytes(QBits::I8, kp)),
    };
    let tiles = layout.npad / ukr.nr;
    let row_blocks = m.div_ceil(MC);
    let groups = column_groups(row_blocks, tiles, threads.count());
    let per_group = tiles.div_ceil(groups);
    let (mut residual, mut after) = (None, (f32::NEG_INFINITY, f32::INFINITY));
    let (dst, dst_q, out_len, quant) = match out {
        TileOut::F32(o) => (SharedMut(o.as_mut_ptr()), SharedMut(std::ptr::null_mut::<i8>()), o.len(), None),
        // `encode_quantized`'s reciprocal, computed once.
        TileOut::I8(o, qs, qzp) => {
            (SharedMut(std::ptr::null_mut::<f32>()), SharedMut(o.as_mut_ptr()), o.len(), Some((1.0 / qs, qzp)))
        }
        TileOut::I8Residual { out: o, scale: qs, zero_point: qzp, residual: r, after: bounds } => {
            assert_eq!(r.len(), o.len(), "qgemm: the residual block does not match the output");
            (residual, after) = (Some(r), bounds);
            (SharedMut(std::ptr::null_mut::<f32>()), SharedMut(o.as_mut_ptr()), o.len(), Some((1.0 / qs, qzp)))
        }
    };
    // Per-channel scales (one group) lie contiguous, column by column; the
    // residual's values are those of the output's positions `at..at + cols`.
    let epilogue = |at: usize, j0: usize, cols: usize| Epilogue {
        scales: &layout.scales[j0..j0 + cols],
        col_sums: &layout.col_sums[j0..j0 + cols],
        bias: bias.map(|b| &b[j0..j0 + cols]),
        lo,
        hi,
        residual: residual.map(|r| r.range(at..at + cols)),
        after,
    };
    threads.for_each(row_blocks * groups, |item| {
        let (i0, group) = ((item / groups) * MC, item % groups);
        let i1 = (i0 + MC).min(m);
        let mut acc = [0i32; 8 * 32];
        for t in group * per_group..((group + 1) * per_group).min(tiles) {
            let j0 = t * ukr.nr;
            if j0 >= n {
                break;
            }
            let b = &weights[(j0 / STRIP) * strip..];
            for r in (i0..i1).step_by(ukr.mr) {
                match (&r_window, ukr.window) {
                    (Some(win), Some(window)) => {
                        let mut bases = [0usize; 8];
                        win.bases(r, m, &mut bases[..ukr.mr]);
                        window(win.c4, win.image, &bases[..ukr.mr], win.offs, b, strip, &mut acc);
                    }
                    _ => kernel(kp / LANE_I8, &rows[r * lda..], lda, b, strip, &mut acc),
                }
                let cols = ukr.nr.min(n - j0);
                let tile_rows = ukr.mr.min(m - r);
                if let Some((inv, zero_point)) = quant {
                    // The whole tile in one call: its columns' epilogue
                    // vectors read once, the call's cost paid once.
                    let at = r * n + j0;
                    let span = (tile_rows - 1) * n + cols;
                    assert!(at + span <= out_len);
                    let tile = QTile {
                        acc: &acc[..tile_rows * ukr.nr],
                        nr: ukr.nr,
                        rows: tile_rows,
                        cols,
                        out: dst_q.ptr().wrapping_add(at),
                        ldo: n,
                        scales: &scales[r..r + tile_rows],
                        shifts: &shifts[r..r + tile_rows],
                        e: Epilogue {
                            residual: residual.map(|res| res.range(at..at + span)),
                            ..epilogue(at, j0, cols)
                        },
                        inv,
                        zero_point,
                    };
                    // SAFETY: rows `r..r + tile_rows`, columns `j0..j0 +
                    // cols` are in bounds (just checked) and belong to this
                    // item alone (items own disjoint (row block, column
                    // group) rectangles of `out`).
                    unsafe { (ukr.driver.store_q)(&tile) };
                    continue;
                }
                for i in 0..tile_rows {
                    let s = scales[r + i];
                    let at = (r + i) * n + j0;
                    assert!(at + cols <= out_len);
                    let (acc, e, shift) = (&acc[i * ukr.nr..][..cols], &epilogue(at, j0, cols), shifts[r + i]);
                    // SAFETY: in bounds (just checked); items own disjoint
                    // (row block, column group) rectangles of `out`.
                    let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(at), cols) };
                    (ukr.driver.store)(o, acc, s, e, shift);
                }
            }
        }
    });
}

/// Quantizes one row of `x` into `row` (`kp` values stored as `acts` says,
/// zero past `k`) and returns its scale and zero point.
fn quantize_row(kernels: &QuantKernels, x: &[f32], act: Rows, row: &mut [u8]) -> (f32, i32) {
    let acts = kernels.int8.acts;
    let (s, zp) = match act {
        Rows::Dynamic => return quantize_row_symmetric(kernels, x, acts, row),
        Rows::DynamicAsymmetric => super::row_qparams_asymmetric(x),
        Rows::Static { scale, zero_point } => (scale, zero_point),
    };
    // Quantized straight into the storage; lanes past K are zero values.
    let (q, pad) = row.split_at_mut(x.len() * acts.width());
    (kernels.int8.driver.encode)(acts, x, s, zp, q);
    pad.fill(if acts == Acts::U8Offset { 0x80 } else { 0 });
    (s, zp)
}

/// [`quantize_row`] with the table's per-row symmetric quantizer (an ISA
/// kernel that writes i8), converted to the storage after.
fn quantize_row_symmetric(kernels: &QuantKernels, x: &[f32], acts: Acts, row: &mut [u8]) -> (f32, i32) {
    let k = x.len();
    // I16 rows are quantized into their second half, then widened forward:
    // value `p` goes to bytes `2p, 2p + 1`, below the unread values `> p`.
    let start = if acts == Acts::I16 { row.len() / 2 } else { 0 };
    let (q, pad) = row[start..].split_at_mut(k);
    let s = (kernels.quantize.run)(x, bytemuck::cast_slice_mut(q));
    pad.fill(0);
    match acts {
        Acts::I8 => {}
        Acts::U8Offset => row.iter_mut().for_each(|v| *v ^= 0x80),
        Acts::I16 => {
            for p in 0..start {
                let v = (row[start + p] as i8 as i16).to_le_bytes();
                row[2 * p..2 * p + 2].copy_from_slice(&v);
            }
        }
    }
    (s, 0)
}

/// The columns of one tile: their scales, weight sums and bias, and the
/// bounds every value is clamped to (infinite when there is no clamp).
#[derive(Copy, Clone)]
pub(crate) struct Epilogue<'a> {
    pub(crate) scales: &'a [f32],
    pub(crate) col_sums: &'a [i32],
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) lo: f32,
    pub(crate) hi: f32,
    /// The quantizing store's residual for this row's columns, added after
    /// the clamp to `lo..hi`, the sum then clamped to `after`.
    pub(crate) residual: Option<Residual<'a>>,
    pub(crate) after: (f32, f32),
}

/// One row of a tile: `o = (f32(dot) · s) · scale (+ bias)`, where `dot`
/// is the kernel's sum less `shift · Σ_p w` (the activations' zero point,
/// plus 128 for offset activations). Plain zipped slices, so the compiler
/// vectorises it.
#[inline(always)]
pub(crate) fn store_row(o: &mut [f32], acc: &[i32], s: f32, e: &Epilogue<'_>, shift: i32) {
    let dots = acc.iter().zip(e.col_sums).map(|(&a, &cs)| a.wrapping_sub(cs.wrapping_mul(shift)));
    let (lo, hi) = (e.lo, e.hi);
    let clamp = |v: f32| clamp_to(v, lo, hi);
    match e.bias {
        None => o.iter_mut().zip(dots.zip(e.scales)).for_each(|(o, (d, &sc))| *o = clamp((d as f32 * s) * sc)),
        Some(b) => o
            .iter_mut()
            .zip(dots.zip(e.scales).zip(b))
            .for_each(|(o, ((d, &sc), &b))| *o = clamp((d as f32 * s) * sc + b)),
    }
}

/// [`store_row`], then each value quantized (`clamp(rint(v · inv) + zp,
/// -128, 127)`, [`super::quantize_value`]: `encode_quantized`'s integers
/// with its reciprocal `inv = 1 / scale`) into `o`: one loop, each value
/// finished and quantized in registers (the same operations as
/// [`store_row`]'s, so the same f32 values).
#[inline(always)]
pub(crate) fn store_row_quantized(
    o: &mut [i8],
    acc: &[i32],
    s: f32,
    e: &Epilogue<'_>,
    shift: i32,
    inv: f32,
    zero_point: i32,
) {
    if let Some(r) = e.residual {
        return store_row_residual_quantized(o, acc, s, e, shift, inv, zero_point, r);
    }
    let n = o.len();
    let (acc, col_sums, scales) = (&acc[..n], &e.col_sums[..n], &e.scales[..n]);
    let dots = acc.iter().zip(col_sums).map(|(&a, &cs)| a.wrapping_sub(cs.wrapping_mul(shift)));
    let (lo, hi, zp) = (e.lo, e.hi, zero_point as f32);
    // `store_row`'s clamp, then the quantization.
    let finish = |v: f32| super::quantize_value(clamp_to(v, lo, hi), inv, zp) as i8;
    match e.bias {
        None => o.iter_mut().zip(dots.zip(scales)).for_each(|(o, (d, &sc))| *o = finish((d as f32 * s) * sc)),
        Some(b) => o
            .iter_mut()
            .zip(dots.zip(scales).zip(&b[..n]))
            .for_each(|(o, ((d, &sc), &b))| *o = finish((d as f32 * s) * sc + b)),
    }
}

/// One finished tile for the quantizing store: `rows` rows of `cols`
/// sums (`nr` apart in `acc`), each row's activation scale and shift, the
/// columns' epilogue — its residual, if any, the values at the tile's
/// positions, `ldo` apart from row to row — and the output's reciprocal
/// scale and zero point. `out` is the tile's first value; its rows are
/// `ldo` apart in the output. Whoever builds a tile owns those
/// `rows × cols` values while the store runs.
pub(crate) struct QTile<'t> {
    pub(crate) acc: &'t [i32],
    pub(crate) nr: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) out: *mut i8,
    pub(crate) ldo: usize,
    pub(crate) scales: &'t [f32],
    pub(crate) shifts: &'t [i32],
    pub(crate) e: Epilogue<'t>,
    pub(crate) inv: f32,
    pub(crate) zero_point: i32,
}

/// [`store_row_quantized`] over each row of a tile, in one call (an ISA's
/// copy compiles the row loop into its `#[target_feature]` wrapper, so the
/// loop-invariant broadcasts are made once per tile).
///
/// # Safety
/// `t.out` points at `t.rows` rows of `t.cols` writable i8 values, `t.ldo`
/// apart, that nothing else reads or writes during the call.
#[inline(always)]
pub(crate) unsafe fn store_tile_quantized(t: &QTile<'_>) {
    let (nr, ldo, cols) = (t.nr, t.ldo, t.cols);
    for i in 0..t.rows {
        // SAFETY: row `i` of the tile (the caller's contract).
        let o = unsafe { std::slice::from_raw_parts_mut(t.out.add(i * ldo), cols) };
        let e = Epilogue { residual: t.e.residual.map(|r| r.range(i * ldo..i * ldo + cols)), ..t.e };
        store_row_quantized(o, &t.acc[i * nr..][..cols], t.scales[i], &e, t.shifts[i], t.inv, t.zero_point);
    }
}

/// The clamp kernel's comparisons (`clamp_f32_in_place`), so its bits
/// (NaN passes through).
#[inline(always)]
fn clamp_to(v: f32, lo: f32, hi: f32) -> f32 {
    let x = if v < lo { lo } else { v };
    if x > hi {
        hi
    } else {
        x
    }
}

/// [`store_row_quantized`] with a residual: each finished value (clamped
/// to `lo..hi`) plus the residual's (an i8 one dequantized as torch does),
/// clamped to `after`, quantized — the operations of the f32 store, the
/// convolution's residual add and activation pass, and the encoder, so
/// the same bits as that three-pass path.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn store_row_residual_quantized(
    o: &mut [i8],
    acc: &[i32],
    s: f32,
    e: &Epilogue<'_>,
    shift: i32,
    inv: f32,
    zero_point: i32,
    residual: Residual<'_>,
) {
    match residual {
        Residual::F32(r) => store_row_plus(o, acc, s, e, shift, inv, zero_point, r, |r| r),
        Residual::I8(r, rs, rzp) => {
            let rzp = rzp as f32;
            store_row_plus(o, acc, s, e, shift, inv, zero_point, r, |q: i8| (q as f32 - rzp) * rs)
        }
    }
}

/// [`store_row_residual_quantized`] over residual values of type `R`,
/// each made f32 by `value` (one loop per bias case, each a plain zip the
/// compiler vectorises).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn store_row_plus<R: Copy>(
    o: &mut [i8],
    acc: &[i32],
    s: f32,
    e: &Epilogue<'_>,
    shift: i32,
    inv: f32,
    zero_point: i32,
    residual: &[R],
    value: impl Fn(R) -> f32,
) {
    let n = o.len();
    let (acc, col_sums, scales, residual) = (&acc[..n], &e.col_sums[..n], &e.scales[..n], &residual[..n]);
    let (lo, hi, zp, (lo2, hi2)) = (e.lo, e.hi, zero_point as f32, e.after);
    let dots = acc.iter().zip(col_sums).map(|(&a, &cs)| a.wrapping_sub(cs.wrapping_mul(shift)));
    // `v`: the f32 store's value (bias added, clamped); then the add and
    // the activation after it.
    let finish =
        |v: f32, r: R| super::quantize_value(clamp_to(clamp_to(v, lo, hi) + value(r), lo2, hi2), inv, zp) as i8;
    match e.bias {
        None => o
            .iter_mut()
            .zip(dots.zip(scales).zip(residual))
            .for_each(|(o, ((d, &sc), &r))| *o = finish((d as f32 * s) * sc, r)),
        Some(b) => o
            .iter_mut()
            .zip(dots.zip(scales).zip(&b[..n]).zip(residual))
            .for_each(|(o, (((d, &sc), &b), &r))| *o = finish((d as f32 * s) * sc + b, r)),
    }
}

/// Column groups per row block: one when row blocks keep every thread
/// busy, else about four items per thread.
pub(crate) fn column_groups(row_blocks: usize, tiles: usize, threads: usize) -> usize {
    if threads == 1 || row_blocks >= 4 * threads {
        return 1;
    }
    (4 * threads).div_ceil(row_blocks).min(tiles).max(1)
}
