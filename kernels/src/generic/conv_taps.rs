//! 2-d convolutions with a wide kernel as one GEMM per kernel tap over a
//! channels-last copy of the input: no im2col and no per-run packing.
//!
//! With output pixels as GEMM rows and output channels as columns, tap
//! (ky, kx) multiplies, for every output pixel, the input pixel it lands on
//! (a `Cin` vector, contiguous in a channels-last image) by that tap's
//! `[Cin, Cout]` slice of the weight (packed once, [`PackedTaps`]). Output
//! pixel `(oy, ox)` of tap (ky, kx) reads padded input pixel
//! `(oy·sy + ky·dy, ox·sx + kx·dx)`. Split the zero-padded input into its
//! `sy·sx` stride phases (phase `(a, b)` holds the pixels whose padded
//! coordinates are `a`, `b` modulo the strides: `[Hq, Wq, Cin]`) and that
//! pixel is pixel `(oy + qy, ox + qx)` of phase `(ky·dy mod sy, kx·dx mod
//! sx)`, `qy = ky·dy / sy`, `qx = kx·dx / sx`. Number the output pixels on a
//! grid `Wq` wide (`p = oy·Wq + ox`; columns `ox ≥ OW` are computed and
//! dropped) and every tap's A is the phase read in place from pixel
//! `qy·Wq + qx` on, one row per `Cin`: a plain row-major matrix, which the
//! direct GEMM kernels read without packing; with unit stride and dilation
//! along x a whole row of taps reads adjacent pixels, so it is one term of
//! `kw·Cin` (A's rows overlapping). The weight is one B packed once,
//! tap-major, each term a range of its rows. The terms' products are summed
//! by one GEMM job ([`gemm_sum_packed`]) into a channels-last result, which
//! is transposed into the NCHW output (with the residual and a post-residual
//! activation). The extra columns cost `Wq / OW - 1` of the work (3 % at
//! 56², 29 % at 7² with padding 1).

use super::conv::Geometry;
use super::gemm::{gemm_sum_packed, ActivationFn, Bias, Epilogue, PackedB, SumTerm};
use crate::parallel::Threads;
use crate::table::KernelTable;
use crate::types::{PackBuffers, Result};

/// Fewest input channels the tap path takes: each tap is a K slice of `Cin`
/// steps, and with fewer the C tile's reload per tap outweighs the saved
/// packing (an RGB stem conv stays on im2col).
const MIN_CIN: usize = 32;

/// Whether convolutions with weight shape `w` (`[Cout, Cin/groups, kh, kw]`)
/// and `groups` run the tap path on `table`: 2-d, dense, a kernel wider
/// than 1×1 (pointwise convolutions already read their input in place),
/// enough input channels, and a table whose GEMM reads A in place. Depends
/// on nothing else, so a packed and an unpacked weight take the same path
/// (the same sums, bit for bit).
pub(crate) fn applies(table: &KernelTable, w: &[usize], groups: usize) -> bool {
    table.gemm.direct.is_some() && groups == 1 && w.len() == 4 && w[2] * w[3] > 1 && w[1] >= MIN_CIN && w[0] > 0
}

/// A convolution weight `[Cout, Cin, kh, kw]` packed once as one GEMM B
/// `[kh·kw·Cin, Cout]`, tap-major: row `t·Cin + c` is tap t's (y, x
/// row-major) weights of input channel c.
#[derive(Clone, Debug)]
pub(crate) struct PackedTaps {
    b: PackedB,
    ksp: usize,
}

impl PackedTaps {
    /// Packs `w` (shape `shape`, see [`applies`]) for `table`.
    pub(crate) fn new(table: &KernelTable, w: &[f32], shape: &[usize]) -> Result<PackedTaps> {
        let &[cout, cin, kh, kw] = shape else {
            return Err(super::common::shape_err("conv", format!("tap packing needs a 2-d weight, got {shape:?}")));
        };
        let ksp = kh * kw;
        // PackedB reads B transposed from a `[Cout, ksp·Cin]` copy (the
        // weight is channel-major: its taps of one channel are adjacent).
        let mut bt = vec![0f32; cout * ksp * cin];
        for (co, row) in bt.chunks_exact_mut(ksp * cin).enumerate() {
            for (k, v) in row.iter_mut().enumerate() {
                let (t, ci) = (k / cin, k % cin);
                *v = w[(co * cin + ci) * ksp + t];
            }
        }
        Ok(PackedTaps { b: PackedB::new(table, ksp * cin, cout, &bt, ksp * cin, true)?, ksp })
    }

    /// Whether `table`'s microkernel reads this packing.
    pub(crate) fn fits(&self, table: &KernelTable) -> bool {
        table.gemm.direct.is_some() && self.b.fits(table)
    }
}

/// The phase grid of one convolution (see the module doc).
struct Phases {
    /// Strides (number of phases per axis).
    sy: usize,
    sx: usize,
    /// Rows and columns each phase buffer holds (rows: enough for the last
    /// grid pixel's furthest tap).
    rows: usize,
    wq: usize,
}

impl Phases {
    fn of(g: &Geometry) -> Phases {
        let (sy, sx) = (g.stride[1], g.stride[2]);
        let wq = (g.input[2] + 2 * g.pad[2]).div_ceil(sx);
        let qy_max = (g.kernel[1] - 1) * g.dil[1] / sy;
        Phases { sy, sx, rows: g.output[1] + qy_max + 1, wq }
    }

    /// f32s in one phase buffer (`cin` channels).
    fn len(&self, cin: usize) -> usize {
        self.rows * self.wq * cin
    }

    /// Which phase tap (ky, kx) reads, and its first pixel there.
    fn tap(&self, g: &Geometry, ky: usize, kx: usize) -> (usize, usize) {
        let (ry, rx) = (ky * g.dil[1], kx * g.dil[2]);
        ((ry % self.sy) * self.sx + rx % self.sx, (ry / self.sy) * self.wq + rx / self.sx)
    }
}

/// What the tap path adds after the GEMMs: the bias and activation go into
/// the GEMM's store step, the residual (NCHW, like the output) into the
/// transposition, with the activation after it when it comes first.
pub(crate) struct TapEpilogue<'a> {
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) activation: Option<ActivationFn>,
    pub(crate) residual: Option<&'a [f32]>,
    pub(crate) residual_first: bool,
}

/// Scratch f32s [`conv_taps`] needs for one image.
pub(crate) fn scratch_len(g: &Geometry, cin: usize, cout: usize) -> usize {
    let ph = Phases::of(g);
    ph.sy * ph.sx * ph.len(cin) + g.output[1] * ph.wq * cout
}

/// A tap convolution's input and output images and their layout: `x`
/// `[batch, cin, H, W]` and `out` `[batch, cout, OH, OW]`, or with
/// `channels_last` `[batch, H, W, cin]` and `[batch, OH, OW, cout]` (the
/// residual is laid out like `out`).
pub(crate) struct Io<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) out: &'a mut [f32],
    pub(crate) channels_last: bool,
}

/// The convolution of `io.x` by the packed taps, into `io.out`, using `buf`
/// ([`scratch_len`] f32s).
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_taps(
    table: &KernelTable,
    io: Io<'_>,
    packed: &PackedTaps,
    e: &TapEpilogue<'_>,
    g: &Geometry,
    (batch, cin, cout): (usize, usize, usize),
    buf: &mut [f32],
    pack: &PackBuffers,
) -> bool {
    let Io { x, out, channels_last } = io;
    let ph = Phases::of(g);
    let [_, h, w] = g.input;
    let [_, kh, kw] = g.kernel;
    let [_, oh, ow] = g.output;
    let (isp, osp, plen) = (h * w, oh * ow, ph.len(cin));
    let (phases, cbuf) = buf.split_at_mut(ph.sy * ph.sx * plen);
    let cbuf = &mut cbuf[..oh * ph.wq * cout];
    let threads = &pack.threads;
    let tap = |t: usize| ph.tap(g, t / kw, t % kw);
    // With unit stride and dilation along x, a row of taps reads adjacent
    // pixels: one term of kw·Cin (the A rows overlap), a third of the C
    // tile reloads of a 3×3. Otherwise one term per tap.
    let rows_merged = ph.sx == 1 && g.dil[2] == 1;
    let (terms, per_term) = if rows_merged { (kh, kw) } else { (kh * kw, 1) };
    let post_activation = e.activation.filter(|_| e.residual.is_some() && e.residual_first);
    let gemm_epilogue = Epilogue {
        bias: e.bias.map_or(Bias::None, Bias::PerCol),
        activation: e.activation.filter(|_| post_activation.is_none()),
        ..Epilogue::default()
    };
    for n in 0..batch {
        let xn = &x[n * cin * isp..][..cin * isp];
        let used = |phase| (0..kh * kw).any(|t| tap(t).0 == phase);
        fill_phases(xn, channels_last, g, &ph, cin, &used, phases, threads);
        let phases = &*phases;
        let term = |i: usize| {
            let t0 = i * per_term;
            let (phase, first) = tap(t0);
            let a = &phases[phase * plen + first * cin..];
            SumTerm { a, lda: cin, k0: t0 * cin, k1: (t0 + per_term) * cin }
        };
        if packed.ksp != kh * kw
            || packed.b.k() != kh * kw * cin
            || packed.b.n() != cout
            || !gemm_sum_packed(table, oh * ph.wq, &packed.b, terms, &term, cbuf, cout, gemm_epilogue, threads)
        {
            return false;
        }
        let on = &mut out[n * cout * osp..][..cout * osp];
        let residual = e.residual.map(|r| &r[n * cout * osp..][..cout * osp]);
        if channels_last {
            to_nhwc(cbuf, ph.wq, (oh, ow), cout, residual, post_activation, on, threads);
        } else {
            to_nchw(cbuf, ph.wq, (oh, ow), cout, residual, post_activation, on, threads);
        }
    }
    true
}

/// Fills the phases `used` says some tap reads from image `x` (`[cin, H, W]`): phase
/// `(a, b)`'s pixel `(qy, qx)` is padded input pixel `(qy·sy + a, qx·sx + b)`
/// (zero in the padding and past the image), channels last; `x` is
/// `[H, W, cin]` when `channels_last`.
#[allow(clippy::too_many_arguments)]
fn fill_phases(
    x: &[f32],
    channels_last: bool,
    g: &Geometry,
    ph: &Phases,
    cin: usize,
    used: &(dyn Fn(usize) -> bool + Sync),
    phases: &mut [f32],
    threads: &Threads,
) {
    let [_, h, w] = g.input;
    let (py, px) = (g.pad[1], g.pad[2]);
    let row_len = ph.wq * cin;
    threads.for_each_chunk(phases, row_len, |r, row| {
        let (phase, qy) = (r / ph.rows, r % ph.rows);
        if !used(phase) {
            return;
        }
        let (a, b) = (phase / ph.sx, phase % ph.sx);
        let iy = (qy * ph.sy + a).wrapping_sub(py);
        if iy >= h {
            row.fill(0.0);
            return;
        }
        let (lo, hi) = super::conv::valid_columns(b, px, ph.sx, w, ph.wq);
        row[..lo * cin].fill(0.0);
        row[hi * cin..].fill(0.0);
        if channels_last {
            let src = &x[iy * w * cin..][..w * cin];
            for qx in lo..hi {
                let ix = qx * ph.sx + b - px;
                row[qx * cin..][..cin].copy_from_slice(&src[ix * cin..][..cin]);
            }
            return;
        }
        for c in 0..cin {
            let src = &x[(c * h + iy) * w..][..w];
            for qx in lo..hi {
                row[qx * cin + c] = src[qx * ph.sx + b - px];
            }
        }
    });
}

/// Copies the channels-last result (`[OH, Wq, cout]`, columns past OW
/// dropped) into the channels-last image `out`, then adds the residual and
/// applies the post-residual activation, row by row.
#[allow(clippy::too_many_arguments)]
fn to_nhwc(
    c: &[f32],
    wq: usize,
    (oh, ow): (usize, usize),
    cout: usize,
    residual: Option<&[f32]>,
    activation: Option<ActivationFn>,
    out: &mut [f32],
    threads: &Threads,
) {
    let row_len = ow * cout;
    let rows = if oh * row_len < 2 * crate::parallel::ELEMENT_CHUNK { 1 } else { oh };
    let chunk = oh.div_ceil(rows) * row_len;
    threads.for_each_chunk(out, chunk, |blk, part| {
        let oy0 = blk * chunk / row_len;
        for (i, row) in part.chunks_exact_mut(row_len).enumerate() {
            row.copy_from_slice(&c[(oy0 + i) * wq * cout..][..row_len]);
        }
        if let Some(r) = residual {
            let r = &r[blk * chunk..][..part.len()];
            part.iter_mut().zip(r).for_each(|(o, &v)| *o += v);
        }
        if let Some(act) = &activation {
            act.apply(part);
        }
    });
    debug_assert!(oh == 0 || out.len() == oh * row_len);
}

/// Channels this many at a time per transposition item: one 64-byte line of
/// the channels-last result feeds 16 output planes.
const CHANNEL_BLOCK: usize = 16;

/// Transposes the channels-last result (`[OH, Wq, cout]`, columns past OW
/// dropped) into the NCHW image `out`, then adds the residual and applies
/// the post-residual activation, plane by plane.
#[allow(clippy::too_many_arguments)]
pub(super) fn to_nchw(
    c: &[f32],
    wq: usize,
    (oh, ow): (usize, usize),
    cout: usize,
    residual: Option<&[f32]>,
    activation: Option<ActivationFn>,
    out: &mut [f32],
    threads: &Threads,
) {
    let osp = oh * ow;
    threads.for_each_chunk(out, CHANNEL_BLOCK * osp, |blk, planes| {
        let co0 = blk * CHANNEL_BLOCK;
        let count = planes.len() / osp;
        for oy in 0..oh {
            for ox in 0..ow {
                let src = &c[(oy * wq + ox) * cout + co0..][..count];
                for (j, &v) in src.iter().enumerate() {
                    planes[j * osp + oy * ow + ox] = v;
                }
            }
        }
        if let Some(r) = residual {
            let r = &r[co0 * osp..][..planes.len()];
            planes.iter_mut().zip(r).for_each(|(o, &v)| *o += v);
        }
        if let Some(act) = &activation {
            act.apply(planes);
        }
    });
}
