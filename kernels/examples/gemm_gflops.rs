//! Prints f32 GEMM throughput as JSON lines, for `benches/gemm_vs_numpy.py`
//! (which times numpy's OpenBLAS in the same run):
//!
//!     cargo run --release -p kiln-kernels --example gemm_gflops -- [THREADS [ISA]]
//!
//! Square n×n (n = 64 … 2048, best of several runs), skinny linear layers
//! (x `[m, 512]` by a packed `[2048, 512]` weight, m = 1 … 16) and the
//! linear layers of the BERT- and Llama-style benchmark models (x `[m, k]`
//! by a packed `[n, k]` weight plus a bias, as `kiln run` calls them), the
//! 3×3 convolutions of ResNet-18's stages (batch 1, packed weight), on
//! the best kernel table of this CPU or the one of `ISA` (`x86-64-v3`, ...).

use kiln_kernels::{
    best, conv_packed, gemm_f32, gemm_f32_prepacked, linear_fused, Activation, Context, ConvParams, DType, Isa,
    KernelTable, LinearEpilogue, PackedB, PackedConv, TensorMut, TensorRef,
};
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
    let table = match std::env::args().nth(2) {
        None => best(),
        Some(name) => {
            let isa = Isa::ALL.into_iter().find(|i| i.name() == name);
            match isa.and_then(KernelTable::for_isa) {
                Some(t) => t,
                None => {
                    eprintln!("{name}: not a level this CPU runs");
                    std::process::exit(2);
                }
            }
        }
    };
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
    // BERT (seq 128, hidden 256, FFN 1024) and Llama (seq 64, hidden 512,
    // GQA k/v 128, FFN 1376) projections: (m, k, n, activation).
    let layers = [
        (128, 256, 256, None),
        (128, 256, 1024, Some(Activation::Gelu)),
        (128, 1024, 256, None),
        (64, 512, 512, None),
        (64, 512, 128, None),
        (64, 512, 1376, Some(Activation::Silu)),
        (64, 1376, 512, None),
        (64, 512, 1000, None),
    ];
    for (m, k, n, activation) in layers {
        // Weights scaled by 1/√k as a trained layer's are, so that the
        // outputs are O(1) like real activations (the GELU / SiLU epilogue
        // is slow on the far tails, which real layers never reach).
        let scale = 0.5 / (k as f32).sqrt();
        let (x, bias) = (values(m * k), values(n));
        let w: Vec<f32> = values(n * k).iter().map(|v| v * scale).collect();
        let Ok(packed) = PackedB::new(table, k, n, &w, k, true) else { return };
        let mut out = vec![0f32; m * n];
        let epilogue = LinearEpilogue { bias: Some(&bias), activation, ..LinearEpilogue::default() };
        let xb: &[u8] = bytemuck::cast_slice(&x);
        let secs = best_time(|| {
            let x = TensorRef { data: xb, dtype: DType::F32, shape: &[m, k] };
            let o = TensorMut { data: bytemuck::cast_slice_mut(&mut out), dtype: DType::F32, shape: &[m, n] };
            linear_fused(x, &packed, &epilogue, o, &mut cx).unwrap()
        });
        let gflops = 2.0 * (m * n * k) as f64 / secs / 1e9;
        let act = activation.map_or("none".to_string(), |a| format!("{a:?}"));
        println!(
            r#"{{"kind":"linear","m":{m},"k":{k},"n":{n},"activation":"{act}","threads":{threads},"variant":"{variant}","gflops":{gflops:.2}}}"#
        );
    }
    // ResNet-18's 3×3 stride-1 convolutions: (channels, height = width).
    for (ch, hw) in [(64usize, 56usize), (128, 28), (256, 14), (512, 7)] {
        let (x, w) = (values(ch * hw * hw), values(ch * ch * 9));
        let wshape = [ch, ch, 3, 3];
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &wshape };
        let Ok(packed) = PackedConv::new(table, wt, 1) else { return };
        let mut out = vec![0f32; ch * hw * hw];
        let p = ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups: 1 };
        let xshape = [1, ch, hw, hw];
        let secs = best_time(|| {
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &xshape };
            let o = TensorMut { data: bytemuck::cast_slice_mut(&mut out), dtype: DType::F32, shape: &xshape };
            conv_packed(xt, wt, &packed, None, &p, o, &mut cx).unwrap()
        });
        let gflops = 2.0 * (ch * ch * 9 * hw * hw) as f64 / secs / 1e9;
        println!(
            r#"{{"kind":"conv3x3","channels":{ch},"hw":{hw},"threads":{threads},"variant":"{variant}","gflops":{gflops:.2}}}"#
        );
    }
}
