//! Cache-blocked, packed f32 GEMM (Goto/BLIS structure).
//!
//! Loop nest, outermost first: NC-wide column blocks of B, KC-deep slices of
//! K (B slice packed into NR-wide strips), MC-tall row blocks of A (packed
//! into MR-tall strips), then an MR×NR register-blocked microkernel over the
//! packed strips. Packing makes the microkernel's loads unit-stride and
//! zero-pads the edges, so it never needs tail handling; only the final store
//! is clipped. The `jc`/`ic` loops are independent and are where threading
//! would split the work.

use super::common::shape_err;
use crate::context::Context;
use crate::table::KernelTable;
use crate::types::{PackBuffers, Result};

/// Rows of C per generic microkernel tile. 4×8 accumulators fit the 16 SSE
/// registers of baseline x86_64 (and NEON's 32) without spilling.
pub const MR: usize = 4;
/// Columns of C per generic microkernel tile.
pub const NR: usize = 8;
/// Depth of one packed slice: an MR×KC strip of A plus a KC×NR strip of B
/// (~12 KiB) stay in L1 across the microkernel.
const KC: usize = 256;
/// Rows per packed A block (MC×KC f32 ≈ 64 KiB, L2-resident); rounded down
/// to a multiple of the variant's MR.
const MC: usize = 64;
/// Columns per packed B block (KC×NC f32 = 1 MiB, L3-resident).
const NC: usize = 1024;

/// How the microkernel expects its operands packed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Packing {
    /// A in MR-tall strips laid out k-major (`strip[p*MR + i]`), B in NR-wide
    /// strips laid out k-major (`strip[p*NR + j]`), the last strip of each
    /// zero-padded, so the microkernel has no edge cases. (Room for others:
    /// pair-interleaved bf16, weights packed once at load.)
    KMajorPanels,
}

/// An MR×NR microkernel: accumulates `Astrip · Bstrip` over `kc` steps of the
/// packed strips in registers, then hands the accumulators to the tile's
/// store step (or stores them directly when the tile allows it).
pub(crate) type MicroKernel = fn(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>);

/// The kernel table's GEMM entry: a microkernel with its tile shape and the
/// packing it reads.
#[derive(Copy, Clone)]
pub(crate) struct GemmUkr {
    pub(crate) variant: &'static str,
    pub(crate) mr: usize,
    pub(crate) nr: usize,
    pub(crate) packing: Packing,
    pub(crate) run: MicroKernel,
}

/// The portable variant.
pub(crate) const GENERIC_UKR: GemmUkr =
    GemmUkr { variant: "generic_4x8", mr: MR, nr: NR, packing: Packing::KMajorPanels, run: microkernel_generic };

/// How a tile's accumulators combine with what C holds.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum Combine {
    /// C = acc (C is not read, so stale NaNs cannot leak).
    Overwrite,
    /// C += acc.
    Accumulate,
    /// C = beta·C + acc.
    Scale(f32),
}

/// A bias the epilogue adds, indexed by C's row or column.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) enum Bias<'a> {
    #[default]
    None,
    /// `bias[i]` added to row i (convolution: one per output channel).
    PerRow(&'a [f32]),
    /// `bias[j]` added to column j (linear: one per output feature).
    PerCol(&'a [f32]),
}

/// What the store step applies to each finished element after combining,
/// as data (tract's `FusedSpec`); only on the last K slice. A bias today;
/// activations, a residual add and requantisation belong here later.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct Epilogue<'a> {
    pub(crate) bias: Bias<'a>,
}

impl Epilogue<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.bias, Bias::None)
    }
}

/// Where one microkernel call's tile goes: the valid `rows×cols` corner
/// (edges are partial) of C starting at (`row0`, `col0`).
pub(crate) struct Tile<'a> {
    /// C from the tile's first element on.
    pub(crate) c: &'a mut [f32],
    pub(crate) ldc: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row0: usize,
    pub(crate) col0: usize,
    pub(crate) combine: Combine,
    pub(crate) epilogue: Epilogue<'a>,
}

impl Tile<'_> {
    /// The portable store step: combines the valid corner of `acc` (row-major
    /// with row stride `ld`) with C, then applies the epilogue.
    pub(crate) fn store(&mut self, acc: &[f32], ld: usize) {
        for i in 0..self.rows {
            let row = &mut self.c[i * self.ldc..][..self.cols];
            let acc = &acc[i * ld..][..self.cols];
            match self.combine {
                Combine::Overwrite => row.copy_from_slice(acc),
                Combine::Accumulate => row.iter_mut().zip(acc).for_each(|(c, &v)| *c += v),
                Combine::Scale(b) => row.iter_mut().zip(acc).for_each(|(c, &v)| *c = b * *c + v),
            }
            match self.epilogue.bias {
                Bias::None => {}
                Bias::PerRow(bias) => {
                    let b = bias[self.row0 + i];
                    row.iter_mut().for_each(|c| *c += b);
                }
                Bias::PerCol(bias) => {
                    let bias = &bias[self.col0..][..self.cols];
                    row.iter_mut().zip(bias).for_each(|(c, &b)| *c += b);
                }
            }
        }
    }
}

/// Where B's elements live: `b[p*ldb + j]`, or `b[j*ldb + p]` when transposed.
#[derive(Copy, Clone)]
struct BLayout {
    ld: usize,
    transposed: bool,
}

/// C[m×n] = A[m×k] · B[k×n] + beta·C, all row-major with leading dimensions.
/// `transposed_b` reads B as its transpose stored n×k (i.e. computes A·Bᵀ).
/// `beta == 0` overwrites C without reading it (so stale NaNs cannot leak).
/// Runs the microkernel of `cx`'s kernel table.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
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
    cx: &mut Context,
) -> Result<()> {
    check_operands(m, n, k, a.len(), lda, b.len(), ldb, c.len(), ldc, transposed_b)?;
    gemm_f32_packed(cx.table, m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta, &mut cx.scratch.pack);
    Ok(())
}

/// Checks that every addressed element is inside its slice.
#[allow(clippy::too_many_arguments)]
fn check_operands(
    m: usize,
    n: usize,
    k: usize,
    a: usize,
    lda: usize,
    b: usize,
    ldb: usize,
    c: usize,
    ldc: usize,
    tb: bool,
) -> Result<()> {
    let need = |rows: usize, cols: usize, ld: usize| -> Option<usize> {
        if rows == 0 || cols == 0 {
            Some(0)
        } else if ld < cols {
            None
        } else {
            (rows - 1).checked_mul(ld)?.checked_add(cols)
        }
    };
    let (br, bc) = if tb { (n, k) } else { (k, n) };
    let ok = need(m, k, lda).is_some_and(|v| v <= a)
        && need(br, bc, ldb).is_some_and(|v| v <= b)
        && need(m, n, ldc).is_some_and(|v| v <= c);
    if !ok {
        return Err(shape_err("gemm", format!("operands too small or leading dims too short for m={m} n={n} k={k}")));
    }
    Ok(())
}

/// [`gemm_f32`] for callers that already validated the operands and hold the
/// packing buffers separately from their own scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32_packed(
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
    let epilogue = Epilogue::default();
    gemm_f32_fused(table, m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta, epilogue, pack);
}

/// [`gemm_f32_packed`] with an epilogue applied to every element of C once
/// its sum is complete: C = beta·C + A·B, then the epilogue.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32_fused(
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
    epilogue: Epilogue<'_>,
    pack: &mut PackBuffers,
) {
    if m == 0 || n == 0 {
        return;
    }
    let combine = match beta {
        0.0 => Combine::Overwrite,
        1.0 => Combine::Accumulate,
        b => Combine::Scale(b),
    };
    if k == 0 {
        // Nothing to multiply: the store step over zero tiles does the rest.
        for i in 0..m {
            let mut tile = Tile { c: &mut c[i * ldc..], ldc, rows: 1, cols: n, row0: i, col0: 0, combine, epilogue };
            store_zero_row(&mut tile);
        }
        return;
    }
    let bl = BLayout { ld: ldb, transposed: transposed_b };
    let problem = Problem { m, n, k, a, lda, b, bl, ldc, combine, epilogue };
    drive(&table.gemm, &problem, c, pack);
}

/// One row of an empty-K product: C = beta·C (or 0), then the epilogue.
fn store_zero_row(tile: &mut Tile<'_>) {
    const CHUNK: usize = 64;
    let zeros = [0f32; CHUNK];
    let (n, col0) = (tile.cols, tile.col0);
    for j in (0..n).step_by(CHUNK) {
        let cols = CHUNK.min(n - j);
        let mut part = Tile {
            c: &mut tile.c[j..],
            ldc: tile.ldc,
            rows: 1,
            cols,
            row0: tile.row0,
            col0: col0 + j,
            combine: tile.combine,
            epilogue: tile.epilogue,
        };
        part.store(&zeros, CHUNK);
    }
}

/// One GEMM call's operands, minus C (borrowed mutably by the driver).
struct Problem<'a> {
    m: usize,
    n: usize,
    k: usize,
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    bl: BLayout,
    ldc: usize,
    combine: Combine,
    epilogue: Epilogue<'a>,
}

/// The blocked loop nest around one microkernel, at its tile shape.
fn drive(ukr: &GemmUkr, p: &Problem, c: &mut [f32], pack: &mut PackBuffers) {
    // The one packing there is; another would choose its packers here.
    let Packing::KMajorPanels = ukr.packing;
    let (mr, nr) = (ukr.mr, ukr.nr);
    let (m, n, k) = (p.m, p.n, p.k);
    let mc_block = (MC / mr).max(1) * mr;
    let kc_max = KC.min(k);
    let mc_max = mc_block.min(m.next_multiple_of(mr));
    let nc_max = NC.min(n).next_multiple_of(nr);
    let (apack, bpack) = pack.reserve(mc_max * kc_max, kc_max * nc_max);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b(nr, p.b, p.bl, pc, kc, jc, nc, bpack);
            // The first K slice applies beta, later ones accumulate; the
            // epilogue runs once a sum is complete, on the last slice.
            let combine = if pc == 0 { p.combine } else { Combine::Accumulate };
            let epilogue = if pc + kc == k { p.epilogue } else { Epilogue::default() };
            for ic in (0..m).step_by(mc_block) {
                let mc = mc_block.min(m - ic);
                pack_a(mr, p.a, p.lda, ic, mc, pc, kc, apack);
                for jr in (0..nc).step_by(nr) {
                    let bstrip = &bpack[(jr / nr) * kc * nr..][..kc * nr];
                    for ir in (0..mc).step_by(mr) {
                        let astrip = &apack[(ir / mr) * kc * mr..][..kc * mr];
                        let (row0, col0) = (ic + ir, jc + jr);
                        let mut tile = Tile {
                            c: &mut c[row0 * p.ldc + col0..],
                            ldc: p.ldc,
                            rows: mr.min(mc - ir),
                            cols: nr.min(nc - jr),
                            row0,
                            col0,
                            combine,
                            epilogue,
                        };
                        (ukr.run)(kc, astrip, bstrip, &mut tile);
                    }
                }
            }
        }
    }
}

/// Packs rows `ic..ic+mc`, columns `pc..pc+kc` of A into `mr`-tall strips
/// laid out k-major (`strip[p*mr + i]`), zero-padding the last strip.
#[allow(clippy::too_many_arguments)]
fn pack_a(mr: usize, a: &[f32], lda: usize, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [f32]) {
    for (s, strip) in out.chunks_exact_mut(kc * mr).take(mc.div_ceil(mr)).enumerate() {
        let r0 = ic + s * mr;
        let rows = mr.min(ic + mc - r0);
        for i in 0..mr {
            if i < rows {
                let row = &a[(r0 + i) * lda + pc..][..kc];
                for (p, &v) in row.iter().enumerate() {
                    strip[p * mr + i] = v;
                }
            } else {
                for p in 0..kc {
                    strip[p * mr + i] = 0.0;
                }
            }
        }
    }
}

/// Packs B rows `pc..pc+kc`, columns `jc..jc+nc` into `nr`-wide strips laid
/// out k-major (`strip[p*nr + j]`), zero-padding the last strip.
#[allow(clippy::too_many_arguments)]
fn pack_b(nr: usize, b: &[f32], bl: BLayout, pc: usize, kc: usize, jc: usize, nc: usize, out: &mut [f32]) {
    for (s, strip) in out.chunks_exact_mut(kc * nr).take(nc.div_ceil(nr)).enumerate() {
        let c0 = jc + s * nr;
        let cols = nr.min(jc + nc - c0);
        if bl.transposed {
            // Bᵀ stored n×k: each output column is a contiguous row of b.
            for j in 0..nr {
                if j < cols {
                    let col = &b[(c0 + j) * bl.ld + pc..][..kc];
                    for (p, &v) in col.iter().enumerate() {
                        strip[p * nr + j] = v;
                    }
                } else {
                    for p in 0..kc {
                        strip[p * nr + j] = 0.0;
                    }
                }
            }
        } else {
            for p in 0..kc {
                let dst = &mut strip[p * nr..p * nr + nr];
                let src = &b[(pc + p) * bl.ld + c0..][..cols];
                dst[..cols].copy_from_slice(src);
                dst[cols..].fill(0.0);
            }
        }
    }
}

/// The generic microkernel: fixed-size arrays let the compiler keep `acc` in
/// registers and vectorise the NR-wide row updates.
fn microkernel_generic(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let mut acc = [[0f32; NR]; MR];
    for (a, b) in astrip.chunks_exact(MR).zip(bstrip.chunks_exact(NR)).take(kc) {
        // chunks_exact guarantees the lengths; the conversion just gives the
        // compiler the fixed sizes.
        let (Ok(a), Ok(b)) = (<&[f32; MR]>::try_from(a), <&[f32; NR]>::try_from(b)) else { continue };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += a[i] * b[j];
            }
        }
    }
    tile.store(acc.as_flattened(), NR);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Isa;

    /// Plain f64 loops: C = beta·C + A·B (+ bias per row or column).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        tb: bool,
        beta: f32,
        c0: &[f32],
        bias: Bias,
    ) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: f64 =
                    (0..k).map(|p| a[i * k + p] as f64 * if tb { b[j * k + p] } else { b[p * n + j] } as f64).sum();
                let bias = match bias {
                    Bias::None => 0.0,
                    Bias::PerRow(v) => v[i] as f64,
                    Bias::PerCol(v) => v[j] as f64,
                };
                c[i * n + j] = if beta == 0.0 { 0.0 } else { beta as f64 * c0[i * n + j] as f64 } + dot + bias;
            }
        }
        c
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        // Small deterministic pseudo-random values; no rng dependency needed.
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The fused epilogue (internal, so not reachable from kernels/tests):
    /// every table this CPU runs, against the f64 oracle, with a bias per row
    /// and per column, beta 0/1/0.5 (C starting as NaN for beta 0), shapes
    /// with edge tiles and more than one K slice, and k = 0.
    #[test]
    fn epilogue_bias_matches_oracle_on_every_table() {
        for isa in Isa::ALL {
            let Some(table) = KernelTable::for_isa(isa) else {
                println!("skipping {isa}: not supported by this CPU");
                continue;
            };
            for (m, n, k) in [(1, 1, 1), (7, 17, 33), (13, 40, 300), (6, 16, 5), (5, 9, 0)] {
                let (a, b) = (data(m * k, 1), data(k * n, 2));
                let (rb, cb) = (data(m, 4), data(n, 5));
                for tb in [false, true] {
                    for beta in [0.0f32, 1.0, 0.5] {
                        for bias in [Bias::None, Bias::PerRow(&rb), Bias::PerCol(&cb)] {
                            let c0 = if beta == 0.0 { vec![f32::NAN; m * n] } else { data(m * n, 3) };
                            let mut c = c0.clone();
                            let ldb = if tb { k } else { n };
                            let epilogue = Epilogue { bias };
                            let mut pack = PackBuffers::default();
                            gemm_f32_fused(table, m, n, k, &a, k, &b, ldb, &mut c, n, tb, beta, epilogue, &mut pack);
                            let want = naive(m, n, k, &a, &b, tb, beta, &c0, bias);
                            for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
                                let ok = (g as f64 - w).abs() <= 1e-5 * (k as f64 + 2.0);
                                assert!(ok, "{isa} {m}x{n}x{k} tb={tb} beta={beta} {bias:?} [{i}]: {g} vs {w}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn too_small_operands_are_errors() {
        let mut s = crate::Context::new();
        let mut c = [0f32; 4];
        assert!(gemm_f32(2, 2, 2, &[0.0; 3], 2, &[0.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_err());
        assert!(gemm_f32(2, 2, 2, &[0.0; 4], 1, &[0.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_err());
        assert!(gemm_f32(2, 2, 2, &[1.0; 4], 2, &[1.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_ok());
        assert_eq!(c, [2.0; 4]);
    }
}
