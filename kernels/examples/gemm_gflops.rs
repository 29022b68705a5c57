//! Prints f32 GEMM throughput as JSON lines, for `benches/gemm_vs_numpy.py`
//! (which times numpy's OpenBLAS in the same run):
//!
//!     cargo run --release -p kiln-kernels --example gemm_gflops -- [THREADS]
//!
//! Square n×n (n = 64 … 2048, best of several runs) and skinny linear
//! layers (x `[m, 512]` by a packed `[2048, 512]` weight, m = 1 … 16), on the
//! best kernel table of this CPU.

use kiln_kernels::{best, gemm_f32, gemm_f32_prepacked, Context, PackedB};
use std::time::Instant;

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect()
}

/// The best time of `f` in seconds over enough runs to fill ~0.5 s.
fn best_time(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    let started = Instant::now();
    let mut runs = 0;
    while runs < 3 || (started.elapsed().as_secs_f64() < 0.5 && runs < 1000) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let table = best();
    let variant = table.entries()[0].1;
    let mut cx = Context::with_table(table).with_threads(threads);
    for n in [64usize, 128, 256, 512, 1024, 2048] {
        let (a, b) = (values(n * n), values(n * n));
        let mut c = vec![0f32; n * n];
        let secs = best_time(|| gemm_f32(n, n, n, &a, n, &b, n, &mut c, n, false, 0.0, &mut cx).unwrap());
        let gflops = 2.0 * (n * n * n) as f64 / secs / 1e9;
        println!(r#"{{"kind":"square","n":{n},"threads":{threads},"variant":"{variant}","gflops":{gflops:.2}}}"#);
    }
    let (k, n) = (512usize, 2048usize);
    let w = values(n * k);
    let Ok(packed) = PackedB::new(table, k, n, &w, k, true) else { return };
    for m in [1usize, 2, 4, 8, 16] {
        let x = values(m * k);
        let mut out = vec![0f32; m * n];
        let secs = best_time(|| gemm_f32_prepacked(m, &x, k, &packed, &mut out, n, 0.0, &mut cx).unwrap());
        let gflops = 2.0 * (m * n * k) as f64 / secs / 1e9;
        let gbps = packed.bytes() as f64 / secs / 1e9;
        println!(
            r#"{{"kind":"skinny","m":{m},"k":{k},"n":{n},"threads":{threads},"variant":"{variant}","gflops":{gflops:.2},"weight_gbps":{gbps:.2}}}"#
        );
    }
}
