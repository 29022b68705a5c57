//! A/B of MobileNetV2's depthwise 3×3 convolutions (224² input, batch 1,
//! bias and ReLU6 fused, channels-last): the f32 kernel (f32 in, f32 out)
//! against the int8 one (`qconv_depthwise`, i8 in and i8 out, as the
//! `quant_acts` handoff runs it in an int8-static model), the latter with
//! the table's integer kernels and with the AVX2 variant's (whose
//! depthwise row every x86 variant used before the AVX-512 one).
//! Interleaved run by run, best time of each.
//!
//!     cargo run --release -p kiln-kernels --example dw_ab -- [THREADS [RUNS]]

use kiln_kernels::quant::{qconv_depthwise_with, variants, ActQuant, DepthwiseQWeights, QuantKernels};
use kiln_kernels::{
    best, conv_fused_channels_last, Activation, Context, ConvParams, DType, TensorEpilogue, TensorMut, TensorRef,
};
use std::time::Instant;

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(50);
    let table = best();
    let mut cx = Context::with_table(table).with_threads(threads);
    // The best variant this CPU runs (the table's), and the AVX2 one.
    let all = variants();
    let best_q: QuantKernels = *all.last().expect("the generic variant");
    let avx2 = all.iter().copied().find(|v| v.name() == "avx2").unwrap_or(best_q);
    let (mut total_f, mut total_q, mut total_2) = (0.0, 0.0, 0.0);
    let (b, a) = (best_q.name(), avx2.name());
    println!("| input | channels | stride | f32 (µs) | int8 {b} (µs) | int8 {a} (µs) | {b} / f32 | {b} / {a} |");
    println!("|---|---|---|---|---|---|---|---|");
    // (input size, channels, stride) of MobileNetV2's 17 depthwise layers.
    let layers = [
        (112usize, 32usize, 1usize),
        (112, 96, 2),
        (56, 144, 1),
        (56, 144, 2),
        (28, 192, 1),
        (28, 192, 1),
        (28, 192, 2),
        (14, 384, 1),
        (14, 384, 1),
        (14, 384, 1),
        (14, 384, 1),
        (14, 576, 1),
        (14, 576, 1),
        (14, 576, 2),
        (7, 960, 1),
        (7, 960, 1),
        (7, 960, 1),
    ];
    for (hw, c, s) in layers {
        let o = (hw + 2 - 3) / s + 1;
        let x: Vec<f32> = (0..hw * hw * c).map(|i| (i % 23) as f32 * 0.25 - 2.0).collect();
        let xq: Vec<i8> = (0..hw * hw * c).map(|i| ((i * 37) % 256) as u8 as i8).collect();
        let w: Vec<f32> = (0..c * 9).map(|i| (i % 13) as f32 * 0.05 - 0.3).collect();
        let wq: Vec<i8> = (0..c * 9).map(|i| ((i * 71) % 256) as u8 as i8).collect();
        let bias: Vec<f32> = (0..c).map(|i| (i % 7) as f32 * 0.1).collect();
        let scales: Vec<f32> = (0..c).map(|i| 0.002 + i as f32 * 1e-5).collect();
        let ws = [c, 1, 3, 3];
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
        let bs = [c];
        let bt = TensorRef { data: bytemuck::cast_slice(&bias), dtype: DType::F32, shape: &bs };
        let wqd = DepthwiseQWeights::new(&wq, &ws, &scales).expect("weights");
        let params = ConvParams { stride: &[s, s], padding: &[1, 1], dilation: &[1, 1], groups: c };
        let epilogue = TensorEpilogue {
            activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
            residual: None,
            residual_first: false,
        };
        let (mut yf, mut yq) = (vec![0f32; o * o * c], vec![0i8; o * o * c]);
        let (mut best_f, mut best_q_t, mut best_2) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
        for _ in 0..runs {
            let t = Instant::now();
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &[1, hw, hw, c] };
            let yt = TensorMut { data: bytemuck::cast_slice_mut(&mut yf), dtype: DType::F32, shape: &[1, o, o, c] };
            conv_fused_channels_last(xt, wt, None, Some(bt), &epilogue, &params, yt, &mut cx).expect("f32");
            best_f = best_f.min(t.elapsed().as_secs_f64());
            for (kernels, best) in [(&best_q, &mut best_q_t), (&avx2, &mut best_2)] {
                let t = Instant::now();
                let xt = TensorRef { data: bytemuck::cast_slice(&xq), dtype: DType::I8, shape: &[1, hw, hw, c] };
                let yt = TensorMut { data: bytemuck::cast_slice_mut(&mut yq), dtype: DType::I8, shape: &[1, o, o, c] };
                let act = ActQuant::Static { scale: 0.02, zero_point: -3 };
                let out_q = Some((0.03, -128));
                qconv_depthwise_with(&mut cx, kernels, xt, &wqd, act, Some(&bias), &epilogue, &params, yt, out_q)
                    .expect("int8");
                *best = best.min(t.elapsed().as_secs_f64());
            }
        }
        let (f, q, q2) = (best_f * 1e6, best_q_t * 1e6, best_2 * 1e6);
        total_f += f;
        total_q += q;
        total_2 += q2;
        println!("| {hw}² | {c} | {s} | {f:.1} | {q:.1} | {q2:.1} | {:.2} | {:.2} |", q / f, q / q2);
    }
    println!(
        "| all 17 | | | {total_f:.1} | {total_q:.1} | {total_2:.1} | {:.2} | {:.2} |",
        total_q / total_f,
        total_q / total_2
    );
}
