//! Attention over long key sequences: the kernel's key-tiled path (online
//! softmax, causal tiles skipped) against the two-pass path it replaces
//! there, in one run: `cargo bench -p kiln-kernels --bench attention`.
//!
//! The two-pass path is no longer reachable for S > 4096, so it is rebuilt
//! here from the same public pieces it ran on: per block of 64 query rows,
//! scores = q·kᵀ (`gemm_f32`, the table's GEMM) into a `64 × S` buffer,
//! scale, causal -inf, the table's max and exp-sum softmax, then
//! out = scores · v (`gemm_f32`). Single-threaded, as is the comparison;
//! the kernel also runs at 2 threads for reference. Runs alternate
//! (two-pass, key-tiled, ...) so that load on the machine hits both alike;
//! each line gives the minimum and median of the rounds.
//!
//! `KILN_BENCH_ROUNDS` sets the rounds (default 5).

use kiln_kernels::{attention, gemm_f32, Context, DType, KernelTable, TensorMut, TensorRef};
use std::time::Instant;

/// One head: `l` queries over `s` keys, E = Ev = 64.
struct Shape {
    l: usize,
    s: usize,
    causal: bool,
}

const E: usize = 64;
const BLOCK: usize = 64;

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed) % 23) as f32 * 0.08 - 0.9).collect()
}

fn bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes; u8 has no alignment.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len() * 4) }
}

fn bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `bytes`; every byte pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 4) }
}

/// The kernel (key-tiled for S > 4096).
fn key_tiled(sh: &Shape, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], cx: &mut Context) {
    let (qs, ks, out_shape) = ([sh.l, E], [sh.s, E], [sh.l, E]);
    let t = |shape, data| TensorRef { dtype: DType::F32, shape, data };
    let o = TensorMut { dtype: DType::F32, shape: &out_shape, data: bytes_mut(out) };
    attention(t(&qs, bytes(q)), t(&ks, bytes(k)), t(&ks, bytes(v)), None, sh.causal, None, o, cx).unwrap();
}

/// The two-pass path as the kernel ran it before, `scores` of `BLOCK × S`.
#[allow(clippy::too_many_arguments)]
fn two_pass(
    sh: &Shape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    scores: &mut [f32],
    table: &KernelTable,
    cx: &mut Context,
) {
    let (l, s) = (sh.l, sh.s);
    let scale = 1.0 / (E as f32).sqrt();
    for first in (0..l).step_by(BLOCK) {
        let n = BLOCK.min(l - first);
        gemm_f32(n, s, E, &q[first * E..], E, k, E, scores, s, true, 0.0, cx).unwrap();
        for (i, row) in (first..).zip(scores[..n * s].chunks_exact_mut(s)) {
            row.iter_mut().for_each(|x| *x *= scale);
            if sh.causal && i + 1 < s {
                row[i + 1..].fill(f32::NEG_INFINITY);
            }
            let max = table.max_f32(row);
            let inv = (1.0 / table.exp_sum_f32(row, max)) as f32;
            row.iter_mut().for_each(|x| *x *= inv);
        }
        gemm_f32(n, E, s, scores, s, v, E, &mut out[first * E..(first + n) * E], E, false, 0.0, cx).unwrap();
    }
}

fn min_median(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[0], t[t.len() / 2])
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let rounds: usize = std::env::var("KILN_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let shapes = [
        Shape { l: 8192, s: 8192, causal: false },
        Shape { l: 8192, s: 8192, causal: true },
        Shape { l: 512, s: 32768, causal: false },
        Shape { l: 2048, s: 32768, causal: false },
    ];
    println!("| L | S | causal | two-pass 1t min / med (ms) | key-tiled 1t min / med (ms) | tiled / two-pass (min) | key-tiled 2t min / med (ms) | max |Δ| |");
    println!("|---|---|---|---|---|---|---|---|");
    for sh in &shapes {
        let (q, k, v) = (values(sh.l * E, 1), values(sh.s * E, 2), values(sh.s * E, 3));
        let mut one = Context::new();
        let mut two = Context::new().with_threads(2);
        let table = one.table();
        let mut scores = vec![0f32; BLOCK * sh.s];
        let (mut old, mut new) = (vec![0f32; sh.l * E], vec![0f32; sh.l * E]);
        // Warm-up (scratch growth, page faults), and the two paths agree.
        two_pass(sh, &q, &k, &v, &mut old, &mut scores, table, &mut one);
        key_tiled(sh, &q, &k, &v, &mut new, &mut one);
        key_tiled(sh, &q, &k, &v, &mut new, &mut two);
        let diff = old.iter().zip(&new).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-4, "two-pass and key-tiled differ by {diff}");
        let (mut t_old, mut t_new, mut t_new2) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            two_pass(sh, &q, &k, &v, &mut old, &mut scores, table, &mut one);
            t_old.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            key_tiled(sh, &q, &k, &v, &mut new, &mut one);
            t_new.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            key_tiled(sh, &q, &k, &v, &mut new, &mut two);
            t_new2.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ((o_min, o_med), (n_min, n_med), (n2_min, n2_med)) =
            (min_median(t_old), min_median(t_new), min_median(t_new2));
        println!(
            "| {} | {} | {} | {o_min:.1} / {o_med:.1} | {n_min:.1} / {n_med:.1} | {:.2} | {n2_min:.1} / {n2_med:.1} | {diff:.1e} |",
            sh.l,
            sh.s,
            sh.causal,
            n_min / o_min
        );
    }
}
