//! A/B of the int8 GEMM (W8A8, per-row dynamic activations, quantization
//! included) against kiln's f32 linear layer on the x86-64-v3 (AVX2 + FMA)
//! table, at the shapes of `benches/benches/quant.rs`: every integer variant
//! whose name starts with the filter (default `avx2`; the plain AVX2 one
//! also on i8 weights without the i16 copy) and the f32 layer,
//! interleaved run by run so that a loaded machine slows them alike; prints
//! the best time of each and the ratio f32 / int8. Times are the calling
//! thread's CPU time (`CLOCK_THREAD_CPUTIME_ID` on Linux: time spent
//! preempted is not counted), so use 1 thread; elsewhere wall time.
//!
//!     cargo run --release -p kiln-kernels --example q8_ab -- [THREADS [RUNS [FILTER]]]

use kiln_kernels::quant::{qlinear_with, variants, ActQuant, PackedQWeights, QBits, QWeights};
use kiln_kernels::{linear_packed, Context, DType, Isa, KernelTable, PackedB, TensorMut, TensorRef};

/// Seconds of CPU time this thread has run (wall time where there is no
/// per-thread clock).
#[cfg(target_os = "linux")]
fn now() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(not(target_os = "linux"))]
fn now() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args.get(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = args.get(2).and_then(|t| t.parse().ok()).unwrap_or(20);
    let filter = args.get(3).map_or("avx2", String::as_str);
    let Some(table) = KernelTable::for_isa(Isa::X86_64V3) else {
        println!("this CPU has no AVX2 + FMA");
        return;
    };
    let mut cx = Context::with_table(table).with_threads(threads);
    let all = variants();
    let generic = all[0];
    // Each variant on the packing made for it, and the plain AVX2 one also
    // on the i8 weights alone (what it runs when packed for another table).
    let mut picked = Vec::new();
    for v in all.iter().filter(|v| v.name().starts_with(filter)) {
        picked.push((*v, *v, v.name().to_string()));
        if v.name() == "avx2" {
            picked.push((*v, generic, "avx2 (i8 weights)".to_string()));
        }
    }
    let names: Vec<&str> = picked.iter().map(|(_, _, n)| n.as_str()).collect();
    println!("{threads} thread(s), best of {runs}; ratio = f32 x86-64-v3 time / int8 time");
    println!("| M×N×K | f32 v3 (ms) | {} |", names.join(" | "));
    println!("|---|---|{}", "---|".repeat(names.len()));
    let shapes = [
        (512usize, 512usize, 512usize),
        (1024, 1024, 1024),
        (128, 768, 768),
        (128, 3072, 768),
        (128, 768, 3072),
        (384, 384, 384),
        (384, 1536, 384),
        (384, 384, 1536),
        (64, 1024, 1024),
        (1, 4096, 4096),
        (16, 4096, 4096),
    ];
    for (m, n, k) in shapes {
        let w = values(n * k, 1);
        let packed = PackedB::new(table, k, n, &w, k, true).expect("f32 weights");
        let x = values(m * k, 2);
        let xb: &[u8] = bytemuck::cast_slice(&x);
        let mut out = vec![0f32; m * n];
        let data: Vec<u8> = (0..n * k).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
        let scales: Vec<f32> = (0..n).map(|i| 0.001 + (i % 7) as f32 * 1e-4).collect();
        let qw = QWeights { n, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
        let packs: Vec<PackedQWeights> =
            picked.iter().map(|(_, p, _)| PackedQWeights::pack_for(&qw, p).expect("int8 weights")).collect();
        let mut best_f = f64::INFINITY;
        let mut best_q = vec![f64::INFINITY; picked.len()];
        for _ in 0..runs {
            let t = now();
            let (xs, os) = ([m, k], [m, n]);
            let xt = TensorRef { dtype: DType::F32, shape: &xs, data: xb };
            let ot = TensorMut { dtype: DType::F32, shape: &os, data: bytemuck::cast_slice_mut(&mut out) };
            linear_packed(xt, &packed, None, ot, &mut cx).expect("f32 linear");
            best_f = best_f.min(now() - t);
            for (((v, _, _), qp), best) in picked.iter().zip(&packs).zip(&mut best_q) {
                let t = now();
                qlinear_with(&mut cx, v, &x, m, qp, ActQuant::DynamicPerRow, None, &mut out).expect("qlinear");
                *best = best.min(now() - t);
            }
        }
        let cells: Vec<String> = best_q.iter().map(|&t| format!("{:.2}× ({:.3} ms)", best_f / t, t * 1e3)).collect();
        println!("| {m}×{n}×{k} | {:.3} | {} |", best_f * 1e3, cells.join(" | "));
    }
}
