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
use crate::types::{PackBuffers, Result, Scratch};
#[cfg(target_arch = "x86_64")]
use crate::x86_64::avx2;

/// Rows of C per generic microkernel tile. 4×8 accumulators fit the 16 SSE
/// registers of baseline x86_64 (and NEON's 32) without spilling.
pub const MR: usize = 4;
/// Columns of C per generic microkernel tile; also the column granularity
/// other kernels round their chunks to.
pub const NR: usize = 8;
/// Depth of one packed slice: an MR×KC strip of A plus a KC×NR strip of B
/// (~12 KiB) stay in L1 across the microkernel.
const KC: usize = 256;
/// Rows per packed A block (MC×KC f32 ≈ 64 KiB, L2-resident); rounded down
/// to a multiple of the variant's MR.
const MC: usize = 64;
/// Columns per packed B block (KC×NC f32 = 1 MiB, L3-resident).
const NC: usize = 1024;

/// Where B's elements live: `b[p*ldb + j]`, or `b[j*ldb + p]` when transposed.
#[derive(Copy, Clone)]
struct BLayout {
    ld: usize,
    transposed: bool,
}

/// C[m×n] = A[m×k] · B[k×n] + beta·C, all row-major with leading dimensions.
/// `transposed_b` reads B as its transpose stored n×k (i.e. computes A·Bᵀ).
/// `beta == 0` overwrites C without reading it (so stale NaNs cannot leak).
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
    scratch: &mut Scratch,
) -> Result<()> {
    check_operands(m, n, k, a.len(), lda, b.len(), ldb, c.len(), ldc, transposed_b)?;
    gemm_f32_packed(m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta, &mut scratch.pack);
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
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            let row = &mut c[i * ldc..i * ldc + n];
            if beta == 0.0 {
                row.fill(0.0);
            } else {
                row.iter_mut().for_each(|v| *v *= beta);
            }
        }
        return;
    }
    let bl = BLayout { ld: ldb, transposed: transposed_b };
    let problem = Problem { m, n, k, a, lda, b, bl, ldc, beta };
    run_variant(GemmKernel::best(), &problem, c, pack);
}

fn run_variant(kernel: GemmKernel, problem: &Problem, c: &mut [f32], pack: &mut PackBuffers) {
    match kernel {
        GemmKernel::Generic => drive::<MR, NR>(microkernel_generic, problem, c, pack),
        #[cfg(target_arch = "x86_64")]
        GemmKernel::Avx2Fma => drive::<{ avx2::MR }, { avx2::NR }>(avx2::microkernel, problem, c, pack),
    }
}

/// The microkernel variants; `best()` picks one at run time from CPU features.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum GemmKernel {
    Generic,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

impl GemmKernel {
    pub(crate) fn best() -> GemmKernel {
        #[cfg(target_arch = "x86_64")]
        {
            // std caches the CPUID result, so this is two atomic loads per GEMM.
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return GemmKernel::Avx2Fma;
            }
        }
        GemmKernel::Generic
    }

    /// Every variant this CPU can run (for testing each against generic).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<GemmKernel> {
        let mut v = vec![GemmKernel::Generic];
        #[cfg(target_arch = "x86_64")]
        if GemmKernel::best() == GemmKernel::Avx2Fma {
            v.push(GemmKernel::Avx2Fma);
        }
        v
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
    beta: f32,
}

/// An MR×NR microkernel: `acc = Astrip · Bstrip` over the strips' depth,
/// strips packed as by [`pack_a`] / [`pack_b`].
pub(crate) type MicroKernel<const R: usize, const C: usize> = fn(&[f32], &[f32], &mut [[f32; C]; R]);

/// The blocked loop nest, generic over the tile shape of the microkernel.
fn drive<const R: usize, const C: usize>(
    kernel: MicroKernel<R, C>,
    p: &Problem,
    c: &mut [f32],
    pack: &mut PackBuffers,
) {
    let (m, n, k) = (p.m, p.n, p.k);
    let mc_block = (MC / R).max(1) * R;
    let kc_max = KC.min(k);
    let mc_max = mc_block.min(m.next_multiple_of(R));
    let nc_max = NC.min(n.next_multiple_of(C));
    let (apack, bpack) = pack.reserve(mc_max * kc_max, kc_max * nc_max);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b::<C>(p.b, p.bl, pc, kc, jc, nc, bpack);
            // The first K slice applies beta; later slices accumulate.
            let slice_beta = if pc == 0 { Some(p.beta) } else { None };
            for ic in (0..m).step_by(mc_block) {
                let mc = mc_block.min(m - ic);
                pack_a::<R>(p.a, p.lda, ic, mc, pc, kc, apack);
                for jr in (0..nc).step_by(C) {
                    let nr = C.min(nc - jr);
                    let bstrip = &bpack[(jr / C) * kc * C..][..kc * C];
                    for ir in (0..mc).step_by(R) {
                        let mr = R.min(mc - ir);
                        let astrip = &apack[(ir / R) * kc * R..][..kc * R];
                        let mut acc = [[0f32; C]; R];
                        kernel(astrip, bstrip, &mut acc);
                        store_tile(&acc, c, (ic + ir) * p.ldc + jc + jr, p.ldc, mr, nr, slice_beta);
                    }
                }
            }
        }
    }
}

/// Packs rows `ic..ic+mc`, columns `pc..pc+kc` of A into MR-tall strips laid
/// out k-major (`strip[p*MR + i]`), zero-padding the last strip.
fn pack_a<const MR: usize>(a: &[f32], lda: usize, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [f32]) {
    for (s, strip) in out.chunks_exact_mut(kc * MR).take(mc.div_ceil(MR)).enumerate() {
        let r0 = ic + s * MR;
        let rows = MR.min(ic + mc - r0);
        for i in 0..MR {
            if i < rows {
                let row = &a[(r0 + i) * lda + pc..][..kc];
                for (p, &v) in row.iter().enumerate() {
                    strip[p * MR + i] = v;
                }
            } else {
                for p in 0..kc {
                    strip[p * MR + i] = 0.0;
                }
            }
        }
    }
}

/// Packs B rows `pc..pc+kc`, columns `jc..jc+nc` into NR-wide strips laid out
/// k-major (`strip[p*NR + j]`), zero-padding the last strip.
fn pack_b<const NR: usize>(b: &[f32], bl: BLayout, pc: usize, kc: usize, jc: usize, nc: usize, out: &mut [f32]) {
    for (s, strip) in out.chunks_exact_mut(kc * NR).take(nc.div_ceil(NR)).enumerate() {
        let c0 = jc + s * NR;
        let cols = NR.min(jc + nc - c0);
        if bl.transposed {
            // Bᵀ stored n×k: each output column is a contiguous row of b.
            for j in 0..NR {
                if j < cols {
                    let col = &b[(c0 + j) * bl.ld + pc..][..kc];
                    for (p, &v) in col.iter().enumerate() {
                        strip[p * NR + j] = v;
                    }
                } else {
                    for p in 0..kc {
                        strip[p * NR + j] = 0.0;
                    }
                }
            }
        } else {
            for p in 0..kc {
                let dst = &mut strip[p * NR..p * NR + NR];
                let src = &b[(pc + p) * bl.ld + c0..][..cols];
                dst[..cols].copy_from_slice(src);
                dst[cols..].fill(0.0);
            }
        }
    }
}

/// acc = Astrip · Bstrip over the strip depth (`acc` arrives zeroed). Fixed-size
/// arrays let the compiler keep `acc` in registers and vectorise the NR-wide
/// row updates.
fn microkernel_generic(astrip: &[f32], bstrip: &[f32], acc: &mut [[f32; NR]; MR]) {
    for (a, b) in astrip.chunks_exact(MR).zip(bstrip.chunks_exact(NR)) {
        // chunks_exact guarantees the lengths; the conversion just gives the
        // compiler the fixed sizes.
        let (Ok(a), Ok(b)) = (<&[f32; MR]>::try_from(a), <&[f32; NR]>::try_from(b)) else { continue };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += a[i] * b[j];
            }
        }
    }
}

/// Writes the valid `mr×nr` corner of a tile into C. `beta`: `Some` on the
/// first K slice (C = beta·C + acc, not reading C when beta is 0), `None`
/// afterwards (C += acc).
fn store_tile<const MR: usize, const NR: usize>(
    acc: &[[f32; NR]; MR],
    c: &mut [f32],
    off: usize,
    ldc: usize,
    mr: usize,
    nr: usize,
    beta: Option<f32>,
) {
    for (i, row_acc) in acc.iter().enumerate().take(mr) {
        let row = &mut c[off + i * ldc..][..nr];
        match beta {
            None => row.iter_mut().zip(row_acc).for_each(|(c, &v)| *c += v),
            Some(b) if b != 0.0 => row.iter_mut().zip(row_acc).for_each(|(c, &v)| *c = b * *c + v),
            Some(_) => row.copy_from_slice(&row_acc[..nr]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one GEMM with an explicit variant (k > 0, m, n > 0).
    #[allow(clippy::too_many_arguments)]
    fn gemm_variant(
        kernel: GemmKernel,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        tb: bool,
        beta: f32,
        c: &mut [f32],
    ) {
        let ldb = if tb { k } else { n };
        let problem = Problem { m, n, k, a, lda: k, b, bl: BLayout { ld: ldb, transposed: tb }, ldc: n, beta };
        run_variant(kernel, &problem, c, &mut PackBuffers::default());
    }

    /// Plain f64 triple loop: the oracle for the generic variant.
    #[allow(clippy::too_many_arguments)]
    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], tb: bool, beta: f32, c0: &[f32]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: f64 =
                    (0..k).map(|p| a[i * k + p] as f64 * if tb { b[j * k + p] } else { b[p * n + j] } as f64).sum();
                c[i * n + j] = beta as f64 * c0[i * n + j] as f64 + dot;
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

    /// For every shape: generic against the naive oracle, and every other
    /// available variant against generic, for plain/transposed B and beta 0/1/0.5.
    macro_rules! variant_tests {
        ($($name:ident: $m:expr, $n:expr, $k:expr;)*) => {$(
            #[test]
            fn $name() {
                let (m, n, k) = ($m, $n, $k);
                let a = data(m * k, 1);
                let b = data(k * n, 2);
                let c0 = data(m * n, 3);
                for tb in [false, true] {
                    for beta in [0.0f32, 1.0, 0.5] {
                        let mut want = c0.clone();
                        gemm_variant(GemmKernel::Generic, m, n, k, &a, &b, tb, beta, &mut want);
                        let oracle = naive(m, n, k, &a, &b, tb, beta, &c0);
                        for (i, (&g, &o)) in want.iter().zip(&oracle).enumerate() {
                            assert!((g as f64 - o).abs() <= 1e-5 * k as f64, "generic [{i}] {g} vs {o}");
                        }
                        for kernel in GemmKernel::available() {
                            let mut got = c0.clone();
                            gemm_variant(kernel, m, n, k, &a, &b, tb, beta, &mut got);
                            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                                assert!((g - w).abs() <= 1e-5 * (k as f32).sqrt() * (1.0 + w.abs()), "{kernel:?} tb={tb} beta={beta} [{i}] {g} vs {w}");
                            }
                        }
                    }
                }
            }
        )*};
    }

    variant_tests! {
        one: 1, 1, 1;
        odd_7_17_33: 7, 17, 33;
        tall_100_7_17: 100, 7, 17;
        wide_17_100_7: 17, 100, 7;
        deep_33_33_300: 33, 33, 300;
        past_mc_nc_65_1030_3: 65, 1030, 3;
    }

    #[test]
    fn too_small_operands_are_errors() {
        let mut s = Scratch::new();
        let mut c = [0f32; 4];
        assert!(gemm_f32(2, 2, 2, &[0.0; 3], 2, &[0.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_err());
        assert!(gemm_f32(2, 2, 2, &[0.0; 4], 1, &[0.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_err());
        assert!(gemm_f32(2, 2, 2, &[1.0; 4], 2, &[1.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_ok());
        assert_eq!(c, [2.0; 4]);
    }
}
