//! The depthwise convolutions of MobileNetV2 and EfficientNet-B0 (224²,
//! batch 1, channels-last, bias and an activation fused): best time of each
//! shape on one kernel table, and their sum. Run it on two builds to
//! compare them (the machine is shared: take several runs).
//!
//!     cargo run --release -p kiln-kernels --example dw_bench -- [THREADS [RUNS [ISA [ACTIVATION]]]]
//!
//! ISA: `x86-64-v4`, `x86-64-v3`, `generic`, `best` (the default: the best this CPU runs).
//! ACTIVATION: `relu6` (MobileNetV2's, the default), or an epilogue
//! activation's name: `mul_sigmoid` (EfficientNet's SiLU as exported),
//! `hardswish` (MobileNetV3's), `silu`, `gelu`, `sigmoid`.

use kiln_kernels::{
    best, conv_fused_channels_last, Activation, Context, ConvParams, DType, Isa, KernelTable, TensorEpilogue,
    TensorMut, TensorRef,
};
use std::time::Instant;

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(30);
    let table = match std::env::args().nth(3).filter(|name| name != "best") {
        Some(name) => {
            let isa = Isa::ALL.into_iter().find(|i| i.to_string() == name).expect("an ISA name");
            KernelTable::for_isa(isa).expect("a table this CPU runs")
        }
        None => best(),
    };
    let activation = match std::env::args().nth(4).as_deref() {
        None | Some("relu6") => Activation::Clamp { min: Some(0.0), max: Some(6.0) },
        Some(name) => Activation::from_name(name).expect("an epilogue activation's name"),
    };
    let mut cx = Context::with_table(table).with_threads(threads);
    // (input size, channels, kernel, stride): MobileNetV2's, then
    // EfficientNet-B0's other shapes (5×5, 240 / 480 / 672 / 1152 channels).
    let layers = [
        (112usize, 32usize, 3usize, 1usize),
        (112, 96, 3, 2),
        (56, 144, 3, 1),
        (56, 144, 3, 2),
        (28, 192, 3, 1),
        (28, 192, 3, 2),
        (14, 384, 3, 1),
        (14, 576, 3, 1),
        (14, 576, 3, 2),
        (7, 960, 3, 1),
        (56, 144, 5, 2),
        (28, 240, 5, 1),
        (28, 240, 3, 2),
        (14, 480, 3, 1),
        (14, 480, 5, 1),
        (14, 672, 5, 1),
        (14, 672, 5, 2),
        (7, 1152, 5, 1),
        (7, 1152, 3, 1),
    ];
    let mut total = 0.0;
    println!("table {}, {threads} thread(s), best of {runs}, {}", table.isa(), activation.name());
    println!("| in | C | k | stride | µs |");
    println!("|---|---|---|---|---|");
    for &(hw, c, k, s) in &layers {
        let pad = k / 2;
        let ohw = (hw + 2 * pad - k) / s + 1;
        let x: Vec<f32> = (0..hw * hw * c).map(|i| (i % 23) as f32 * 0.25 - 2.0).collect();
        let w: Vec<f32> = (0..c * k * k).map(|i| (i % 13) as f32 * 0.05 - 0.3).collect();
        let bias: Vec<f32> = (0..c).map(|i| (i % 7) as f32 * 0.1).collect();
        let (xs, ws, bs, os) = ([1, hw, hw, c], [c, 1, k, k], [c], [1, ohw, ohw, c]);
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
        let bt = TensorRef { data: bytemuck::cast_slice(&bias), dtype: DType::F32, shape: &bs };
        let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &xs };
        let params = ConvParams { stride: &[s, s], padding: &[pad, pad], dilation: &[1, 1], groups: c };
        let epilogue = TensorEpilogue { activation: Some(activation), residual: None, residual_first: false };
        let mut out = vec![0f32; ohw * ohw * c];
        let mut best_s = f64::INFINITY;
        for _ in 0..runs {
            let ot = TensorMut { data: bytemuck::cast_slice_mut(&mut out), dtype: DType::F32, shape: &os };
            let t = Instant::now();
            conv_fused_channels_last(xt, wt, None, Some(bt), &epilogue, &params, ot, &mut cx).expect("conv");
            best_s = best_s.min(t.elapsed().as_secs_f64());
        }
        total += best_s;
        println!("| {hw}² | {c} | {k}×{k} | {s} | {:.1} |", best_s * 1e6);
    }
    println!("sum of bests: {:.1} µs", total * 1e6);
}
