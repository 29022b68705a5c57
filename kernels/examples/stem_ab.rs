//! A/B of the RGB stem convolutions (MobileNetV2's 3→32 3×3 stride 2,
//! ResNet-18's 3→64 7×7 stride 2, 224², batch 1, weights packed once, bias
//! and ReLU6 fused): the channels-first kernel followed by the permute of
//! its result to channels-last, against the channels-last kernel (blocked
//! im2col) after the permute of the 3-channel input — what the layout pass
//! chooses between. Interleaved run by run, best time of each.
//!
//!     cargo run --release -p kiln-kernels --example stem_ab -- [THREADS [RUNS]]

use kiln_kernels::{
    best, conv_fused, conv_fused_channels_last, permute_cx, Activation, Context, ConvParams, DType, PackedConv,
    TensorEpilogue, TensorMut, TensorRef,
};
use std::time::Instant;

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect()
}

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(50);
    let table = best();
    let mut cx = Context::with_table(table).with_threads(threads);
    // (Cout, kernel, stride, padding) on a 3×224×224 input.
    for (cout, k, s, p) in [(32usize, 3usize, 2usize, 1usize), (64, 7, 2, 3)] {
        let (cin, hw) = (3usize, 224usize);
        let o = (hw + 2 * p - k) / s + 1;
        let (x, w, bias) = (values(cin * hw * hw), values(cout * cin * k * k), values(cout));
        let ws = [cout, cin, k, k];
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
        let bs = [cout];
        let bt = || TensorRef { data: bytemuck::cast_slice(&bias), dtype: DType::F32, shape: &bs };
        let params = ConvParams { stride: &[s, s], padding: &[p, p], dilation: &[1, 1], groups: 1 };
        let first = PackedConv::for_params(table, wt, &params).expect("pack");
        let last = PackedConv::channels_last(table, wt, &params).expect("pack").expect("a packed weight");
        let epilogue = TensorEpilogue {
            activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
            residual: None,
            residual_first: false,
        };
        let (mut xl, mut y, mut out_a, mut out_b) =
            (vec![0f32; x.len()], vec![0f32; cout * o * o], vec![0f32; cout * o * o], vec![0f32; cout * o * o]);
        let mut best_a = f64::INFINITY;
        let mut best_b = f64::INFINITY;
        for _ in 0..runs {
            let t = Instant::now();
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &[1, cin, hw, hw] };
            let yt = TensorMut { data: bytemuck::cast_slice_mut(&mut y), dtype: DType::F32, shape: &[1, cout, o, o] };
            conv_fused(xt, wt, Some(&first), Some(bt()), &epilogue, &params, yt, &mut cx).expect("conv");
            let yr = TensorRef { data: bytemuck::cast_slice(&y), dtype: DType::F32, shape: &[1, cout, o, o] };
            let ot =
                TensorMut { data: bytemuck::cast_slice_mut(&mut out_a), dtype: DType::F32, shape: &[1, o, o, cout] };
            permute_cx(yr, &[0, 2, 3, 1], ot, &mut cx).expect("permute");
            best_a = best_a.min(t.elapsed().as_secs_f64());

            let t = Instant::now();
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &[1, cin, hw, hw] };
            let lt = TensorMut { data: bytemuck::cast_slice_mut(&mut xl), dtype: DType::F32, shape: &[1, hw, hw, cin] };
            permute_cx(xt, &[0, 2, 3, 1], lt, &mut cx).expect("permute");
            let lr = TensorRef { data: bytemuck::cast_slice(&xl), dtype: DType::F32, shape: &[1, hw, hw, cin] };
            let ot =
                TensorMut { data: bytemuck::cast_slice_mut(&mut out_b), dtype: DType::F32, shape: &[1, o, o, cout] };
            conv_fused_channels_last(lr, wt, Some(&last), Some(bt()), &epilogue, &params, ot, &mut cx).expect("conv");
            best_b = best_b.min(t.elapsed().as_secs_f64());
        }
        assert!(out_a.iter().zip(&out_b).all(|(a, b)| a.to_bits() == b.to_bits()), "the two paths differ");
        println!(
            "{cin}→{cout} {k}×{k} stride {s}, {threads} thread(s): channels-first + permute {:.1} µs, channels-last {:.1} µs ({:.2}×)",
            best_a * 1e6,
            best_b * 1e6,
            best_b / best_a
        );
    }
}
