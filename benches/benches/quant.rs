//! Quantized linear layers against kiln's f32 ones, printed as one table of
//! ratios (f32 time / quantized time; above 1 means the quantized kernel is
//! faster): `cargo bench -p kiln-benches --bench quant [-- --threads N]`.
//!
//! - W8A8 (`ActQuant::DynamicPerRow`: per-row activation quantization
//!   included) vs `linear_packed` (f32 weights packed at load), square
//!   512/1024/2048 and M = 1…16 × 4096×4096;
//! - weight-only int4 group 32 (asymmetric) and int8 per channel at M = 1
//!   (decode GEMV) and M = 4, 16, 4096×4096, vs the same f32 layer.
//!
//! Every integer variant this CPU runs but the generic one is timed; f32 runs on the best table.
//! Each figure is the fastest of repeated calls (this is a benchmark, never
//! a test: nothing here asserts a time).

use kiln_kernels::quant::{qlinear_with, variants, ActQuant, PackedQWeights, QBits, QWeights};
use kiln_kernels::{linear_packed, Context, DType, PackedB, TensorMut, TensorRef};
use std::time::{Duration, Instant};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0).collect()
}

/// Fastest seconds per call of `f`, over enough calls to fill ~0.5 s.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    f();
    let once = start.elapsed().max(Duration::from_micros(1));
    let reps = (Duration::from_millis(500).as_secs_f64() / once.as_secs_f64()).clamp(3.0, 2000.0) as usize;
    let mut samples: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    // The fastest call: on a shared machine the one least disturbed by
    // other jobs (the median moved by up to 10× between runs there).
    samples.sort_by(f64::total_cmp);
    samples[0]
}

fn f32_linear(cx: &mut Context, m: usize, n: usize, k: usize) -> f64 {
    let w = values(n * k, 1);
    let packed = PackedB::new(cx.table(), k, n, &w, k, true).unwrap();
    let x: Vec<u8> = values(m * k, 2).iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0u8; m * n * 4];
    time(|| {
        let (xs, os) = ([m, k], [m, n]);
        let x = TensorRef { dtype: DType::F32, shape: &xs, data: &x };
        let out = TensorMut { dtype: DType::F32, shape: &os, data: &mut out };
        linear_packed(x, &packed, None, out, cx).unwrap()
    })
}

struct Layer {
    packed: PackedQWeights,
}

fn q_layer(n: usize, k: usize, bits: QBits, group: usize, zp: bool) -> Layer {
    let per_byte = if bits == QBits::I4 { 2 } else { 1 };
    let data: Vec<u8> = (0..n * k / per_byte).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
    let scales: Vec<f32> = (0..n * k / group).map(|i| 0.001 + (i % 7) as f32 * 1e-4).collect();
    let zps: Vec<i8> = (0..n * k / group).map(|i| (i % 5) as i8 - 2).collect();
    let w = QWeights { n, k, bits, group, data: &data, scales: &scales, zero_points: zp.then_some(&zps[..]) };
    Layer { packed: PackedQWeights::pack(&w).unwrap() }
}

fn q_time(cx: &mut Context, v: &kiln_kernels::quant::QuantKernels, layer: &Layer, m: usize, act: ActQuant) -> f64 {
    let (n, k) = (layer.packed.n(), layer.packed.k());
    let x = values(m * k, 3);
    let mut out = vec![0f32; m * n];
    time(|| qlinear_with(cx, v, &x, m, &layer.packed, act, None, &mut out).unwrap())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let mut cx = Context::new().with_threads(threads);
    // The generic variant is the oracle, not a contender (and ~50× slower).
    let all: Vec<_> = variants().into_iter().filter(|v| v.name() != "generic").collect();
    println!(
        "quantized linear vs f32 (kiln {} table, {threads} thread(s)); ratio = f32 time / quantized time",
        cx.isa()
    );
    let names: Vec<&str> = all.iter().map(|v| v.name()).collect();
    println!("| case | f32 (ms) | {} |", names.join(" | "));
    println!("|---|---|{}", "---|".repeat(names.len()));
    let row = |label: String, f32_s: f64, q: Vec<f64>| {
        let cells: Vec<String> = q.iter().map(|&t| format!("{:.2}× ({:.3} ms)", f32_s / t, t * 1e3)).collect();
        println!("| {label} | {:.3} | {} |", f32_s * 1e3, cells.join(" | "));
    };
    for s in [512usize, 1024, 2048] {
        let f = f32_linear(&mut cx, s, s, s);
        let layer = q_layer(s, s, QBits::I8, s, false);
        let q = all.iter().map(|v| q_time(&mut cx, v, &layer, s, ActQuant::DynamicPerRow)).collect();
        row(format!("W8A8 {s}×{s}×{s}"), f, q);
    }
    let (n, k) = (4096usize, 4096usize);
    let w8 = q_layer(n, k, QBits::I8, k, false);
    for m in [1usize, 2, 4, 8, 16] {
        let f = f32_linear(&mut cx, m, n, k);
        let q = all.iter().map(|v| q_time(&mut cx, v, &w8, m, ActQuant::DynamicPerRow)).collect();
        row(format!("W8A8 M={m} × {n}×{k}"), f, q);
    }
    let w4 = q_layer(n, k, QBits::I4, 32, true);
    for m in [1usize, 4, 16] {
        let f = f32_linear(&mut cx, m, n, k);
        let q4 = all.iter().map(|v| q_time(&mut cx, v, &w4, m, ActQuant::Float)).collect();
        row(format!("int4 g32 weight-only M={m} × {n}×{k}"), f, q4);
        let q8 = all.iter().map(|v| q_time(&mut cx, v, &w8, m, ActQuant::Float)).collect();
        row(format!("int8 weight-only M={m} × {n}×{k}"), f, q8);
    }
}
