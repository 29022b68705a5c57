//! Quantized linear layers against kiln's f32 ones, printed as one table of
//! ratios (f32 time / quantized time; above 1 means the quantized kernel is
//! faster): `cargo bench -p kiln-benches --bench quant [-- --threads N]`.
//!
//! - W8A8 (`ActQuant::DynamicPerRow`: per-row activation quantization
//!   included) vs `linear_packed` (f32 weights packed at load), square
//!   512/1024, the linear layers of BERT-base (128 tokens), MiniLM (384
//!   tokens: 32 sentences of 12) and an MLP (batch 64), and M = 1, 16 ×
//!   4096×4096;
//! - weight-only int4 group 32 (asymmetric) and int8 per channel at M = 1
//!   (decode GEMV) and M = 4, 16, 4096×4096, vs the same f32 layer.
//!
//! Every integer variant this CPU runs but the generic one is timed, each
//! against f32 on the table of its own ISA level (AVX2 and AVX-VNNI vs the
//! x86-64-v3 f32 GEMM, the AVX-512 ones vs x86-64-v4): the speed-up an
//! AVX2-only machine sees is the first, not the int8 AVX2 kernel against
//! AVX-512 f32.
//! Each figure is the fastest of repeated calls (this is a benchmark, never
//! a test: nothing here asserts a time).

use kiln_kernels::quant::{qlinear_with, variants, ActQuant, PackedQWeights, QBits, QWeights};
use kiln_kernels::{linear_packed, Context, DType, Isa, KernelTable, PackedB, TensorMut, TensorRef};
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

/// The f32 contexts to compare against: every x86 level this CPU has (or
/// just the best table elsewhere), with the variants' level of each.
fn f32_levels(threads: usize) -> Vec<(&'static str, Context)> {
    let mut levels = Vec::new();
    for (name, isa) in [("x86-64-v3", Isa::X86_64V3), ("x86-64-v4", Isa::X86_64V4)] {
        if let Some(table) = KernelTable::for_isa(isa) {
            levels.push((name, Context::with_table(table).with_threads(threads)));
        }
    }
    if levels.is_empty() {
        levels.push(("best", Context::new().with_threads(threads)));
    }
    levels
}

/// Which f32 level a quantized variant is measured against: its own.
fn level_of(variant: &str, levels: usize) -> usize {
    if variant.starts_with("avx512") {
        levels - 1
    } else {
        0
    }
}

/// One W8A8 or weight-only case: rows, output and input features.
struct Case {
    label: String,
    m: usize,
    n: usize,
    k: usize,
}

fn case(label: &str, m: usize, n: usize, k: usize) -> Case {
    Case { label: format!("{label} {m}×{n}×{k}"), m, n, k }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let mut levels = f32_levels(threads);
    let mut cx = Context::new().with_threads(threads);
    // The generic variant is the oracle, not a contender (and ~50× slower).
    let all: Vec<_> = variants().into_iter().filter(|v| v.name() != "generic").collect();
    println!(
        "quantized linear vs f32, {threads} thread(s); ratio = f32 time at the variant's ISA level / quantized time"
    );
    let names: Vec<&str> = all.iter().map(|v| v.name()).collect();
    let f32_names: Vec<String> = levels.iter().map(|(n, _)| format!("f32 {n} (ms)")).collect();
    println!("| case (M×N×K) | {} | {} |", f32_names.join(" | "), names.join(" | "));
    println!("|---|{}{}", "---|".repeat(levels.len()), "---|".repeat(names.len()));
    let mut run = |c: &Case, bits: QBits, group: usize, act: ActQuant| {
        let f: Vec<f64> = levels.iter_mut().map(|(_, cx)| f32_linear(cx, c.m, c.n, c.k)).collect();
        let layer = q_layer(c.n, c.k, bits, group, bits == QBits::I4);
        let cells: Vec<String> = all
            .iter()
            .map(|v| {
                let t = q_time(&mut cx, v, &layer, c.m, act);
                format!("{:.2}× ({:.3} ms)", f[level_of(v.name(), f.len())] / t, t * 1e3)
            })
            .collect();
        let fs: Vec<String> = f.iter().map(|t| format!("{:.3}", t * 1e3)).collect();
        println!("| {} | {} | {} |", c.label, fs.join(" | "), cells.join(" | "));
    };
    let w8a8 = [
        case("W8A8 square", 512, 512, 512),
        case("W8A8 square", 1024, 1024, 1024),
        case("W8A8 BERT-base QKV/out", 128, 768, 768),
        case("W8A8 BERT-base FFN up", 128, 3072, 768),
        case("W8A8 BERT-base FFN down", 128, 768, 3072),
        case("W8A8 MiniLM QKV/out", 384, 384, 384),
        case("W8A8 MiniLM FFN up", 384, 1536, 384),
        case("W8A8 MiniLM FFN down", 384, 384, 1536),
        case("W8A8 MLP", 64, 1024, 1024),
        case("W8A8 decode", 1, 4096, 4096),
        case("W8A8 decode", 16, 4096, 4096),
    ];
    for c in &w8a8 {
        run(c, QBits::I8, c.k, ActQuant::DynamicPerRow);
    }
    for m in [1usize, 16] {
        run(&case("int4 g32 weight-only", m, 4096, 4096), QBits::I4, 32, ActQuant::Float);
        run(&case("int8 weight-only", m, 4096, 4096), QBits::I8, 4096, ActQuant::Float);
    }
}
