//! The squeeze-excite blocks' two memory passes at EfficientNet-B0's shapes
//! (channels-last, batch 1): the global mean over H, W (`reduce_cx`) and the
//! scale x·s with s broadcast over the pixels (`binary_cx`). Each run first
//! writes x over the pool (a SiLU, as the depthwise convolution's epilogue
//! does), so the two passes read what the threads just wrote, as in a model.
//! Median time of each pass per shape, in µs.
//!
//!     cargo run --release -p kiln-kernels --example se_ab -- [THREADS [RUNS]]

use kiln_kernels::{
    binary_cx, reduce_cx, unary_cx, BinaryOp, Context, DType, ReduceKind, TensorMut, TensorRef, UnaryOp,
};
use std::time::Instant;

/// (H = W, channels) of EfficientNet-B0's 16 squeeze-excite blocks.
const LAYERS: [(usize, usize); 16] = [
    (112, 32),
    (56, 96),
    (56, 144),
    (28, 144),
    (28, 240),
    (14, 240),
    (14, 480),
    (14, 480),
    (14, 480),
    (14, 672),
    (14, 672),
    (7, 672),
    (7, 1152),
    (7, 1152),
    (7, 1152),
    (7, 1152),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn f32_ref<'a>(v: &'a [f32], shape: &'a [usize]) -> TensorRef<'a> {
    TensorRef { data: bytemuck::cast_slice(v), dtype: DType::F32, shape }
}

fn f32_mut<'a>(v: &'a mut [f32], shape: &'a [usize]) -> TensorMut<'a> {
    TensorMut { data: bytemuck::cast_slice_mut(v), dtype: DType::F32, shape }
}

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(200);
    let mut cx = Context::new().with_threads(threads);
    let pool = cx.threads();
    let _hot = pool.hot();
    println!("threads {threads}, {runs} runs, median µs");
    println!("| H=W | C | mean | scale |");
    println!("|---|---|---|---|");
    let (mut total_mean, mut total_scale) = (0.0, 0.0);
    for (hw, c) in LAYERS {
        let shape = [1, hw, hw, c];
        let src: Vec<f32> = (0..hw * hw * c).map(|i| (i % 29) as f32 * 0.125 - 1.5).collect();
        let s: Vec<f32> = (0..c).map(|i| 0.5 + (i % 11) as f32 * 0.05).collect();
        let (mut x, mut y) = (vec![0f32; src.len()], vec![0f32; src.len()]);
        let mut mean = vec![0f32; c];
        let (mut t_mean, mut t_scale) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            unary_cx(UnaryOp::Silu, f32_ref(&src, &shape), f32_mut(&mut x, &shape), &mut cx).expect("silu");
            let t = Instant::now();
            reduce_cx(ReduceKind::Mean, f32_ref(&x, &shape), &[1, 2], f32_mut(&mut mean, &[1, 1, 1, c]), &mut cx)
                .expect("mean");
            t_mean.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            binary_cx(BinaryOp::Mul, f32_ref(&x, &shape), f32_ref(&s, &[1, 1, 1, c]), f32_mut(&mut y, &shape), &mut cx)
                .expect("scale");
            t_scale.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let (m, sc) = (median(t_mean), median(t_scale));
        total_mean += m;
        total_scale += sc;
        println!("| {hw} | {c} | {m:.1} | {sc:.1} |");
    }
    println!("| all 16 | | {total_mean:.1} | {total_scale:.1} |");
}
