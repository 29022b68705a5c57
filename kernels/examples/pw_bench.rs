//! The 1×1 (pointwise) convolutions of MobileNetV2 and EfficientNet-B0
//! (224², batch 1, channels-last, weights packed once, bias and ReLU6
//! fused): best time and GFLOP/s of each shape, and their sum. Run it on
//! two builds to compare them (the machine is shared: take several runs).
//!
//!     cargo run --release -p kiln-kernels --example pw_bench -- [THREADS [RUNS [LAYER [COPIES]]]]
//!
//! LAYER is an index into the list (anything else, e.g. `all`: every
//! layer); COPIES input / output buffer pairs are cycled through (default
//! 1: hot caches).

use kiln_kernels::{
    best, conv_fused_channels_last, Activation, Context, ConvParams, DType, PackedConv, TensorEpilogue, TensorMut,
    TensorRef,
};
use std::time::Instant;

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(30);
    // Only the layer with this index (for a profile); not a number: all.
    let only: Option<usize> = std::env::args().nth(3).and_then(|t| t.parse().ok());
    // Cycle through this many input / output buffers (default 1): with
    // several, each run reads and writes memory that left the caches since,
    // as a layer in a model does.
    let copies: usize = std::env::args().nth(4).and_then(|t| t.parse().ok()).unwrap_or(1).max(1);
    let table = best();
    let mut cx = Context::with_table(table).with_threads(threads);
    // (output size, Cin, Cout): MobileNetV2's expand / project layers, then
    // EfficientNet-B0's with other widths (40, 80, 112, 240, 480, 672).
    let layers = [
        (112usize, 32usize, 16usize),
        (112, 16, 96),
        (56, 96, 24),
        (56, 24, 144),
        (56, 144, 24),
        (28, 144, 32),
        (28, 32, 192),
        (28, 192, 32),
        (14, 192, 64),
        (14, 64, 384),
        (14, 384, 64),
        (14, 384, 96),
        (14, 96, 576),
        (14, 576, 96),
        (7, 576, 160),
        (7, 160, 960),
        (7, 960, 160),
        (7, 960, 320),
        (7, 320, 1280),
        (28, 144, 40),
        (28, 40, 240),
        (28, 240, 40),
        (14, 240, 80),
        (14, 80, 480),
        (14, 480, 112),
        (14, 112, 672),
        (14, 672, 112),
        // Probes: the K = 16 expand with its output in L2, and K = 64 at 112².
        (14, 16, 96),
        (28, 16, 96),
        (112, 64, 96),
    ];
    let mut total = 0.0;
    println!("| out | Cin | Cout | µs | GFLOP/s |");
    println!("|---|---|---|---|---|");
    for (i, &(hw, cin, cout)) in layers.iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let xs_all: Vec<Vec<f32>> =
            (0..copies).map(|_| (0..hw * hw * cin).map(|i| (i % 23) as f32 * 0.25 - 2.0).collect()).collect();
        let w: Vec<f32> = (0..cout * cin).map(|i| (i % 13) as f32 * 0.05 - 0.3).collect();
        let bias: Vec<f32> = (0..cout).map(|i| (i % 7) as f32 * 0.1).collect();
        let ws = [cout, cin, 1, 1];
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
        let bs = [cout];
        let bt = TensorRef { data: bytemuck::cast_slice(&bias), dtype: DType::F32, shape: &bs };
        let params = ConvParams { stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1], groups: 1 };
        let packed = PackedConv::channels_last(table, wt, &params).expect("pack").expect("a packed 1×1");
        let epilogue = TensorEpilogue {
            activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
            residual: None,
            residual_first: false,
        };
        let (xs, os) = ([1, hw, hw, cin], [1, hw, hw, cout]);
        let mut outs = vec![vec![0f32; hw * hw * cout]; copies];
        let mut best_s = f64::INFINITY;
        for run in 0..runs {
            let (x, out) = (&xs_all[run % copies], &mut outs[run % copies]);
            let xt = TensorRef { data: bytemuck::cast_slice(x), dtype: DType::F32, shape: &xs };
            let ot = TensorMut { data: bytemuck::cast_slice_mut(out), dtype: DType::F32, shape: &os };
            let t = Instant::now();
            conv_fused_channels_last(xt, wt, Some(&packed), Some(bt), &epilogue, &params, ot, &mut cx).expect("conv");
            best_s = best_s.min(t.elapsed().as_secs_f64());
        }
        total += best_s;
        let gflops = 2.0 * (hw * hw * cin * cout) as f64 / best_s / 1e9;
        println!("| {hw}² | {cin} | {cout} | {:.1} | {gflops:.1} |", best_s * 1e6);
    }
    println!("sum of bests: {:.1} µs (threads {threads})", total * 1e6);
}
