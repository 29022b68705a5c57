//! A/B of the dense convolution paths on ResNet-18's convolutions (batch 1,
//! weights packed once): the tap path ([`PackedConv::new`]) against im2col
//! with a packed A ([`PackedConv::for_im2col`]), interleaved run by run so
//! that a loaded machine slows both alike; prints the best time of each.
//!
//!     cargo run --release -p kiln-kernels --example conv_ab -- [THREADS [RUNS]]

use kiln_kernels::{best, conv_packed, Context, ConvParams, DType, PackedConv, TensorMut, TensorRef};
use std::time::Instant;

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect()
}

fn main() {
    let threads = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(20);
    let table = best();
    let mut cx = Context::with_table(table).with_threads(threads);
    // (Cin, Cout, input size, kernel, stride, padding): ResNet-18's 3×3s
    // with stride 1 and 2 per stage.
    let convs = [
        (64usize, 64usize, 56usize, 3usize, 1usize, 1usize),
        (64, 128, 56, 3, 2, 1),
        (128, 128, 28, 3, 1, 1),
        (128, 256, 28, 3, 2, 1),
        (256, 256, 14, 3, 1, 1),
        (256, 512, 14, 3, 2, 1),
        (512, 512, 7, 3, 1, 1),
    ];
    let (mut total_taps, mut total_im2col) = (0.0, 0.0);
    for (cin, cout, hw, k, s, p) in convs {
        let o = (hw + 2 * p - k) / s + 1;
        let (x, w) = (values(cin * hw * hw), values(cout * cin * k * k));
        let (xs, ws, os) = ([1, cin, hw, hw], [cout, cin, k, k], [1, cout, o, o]);
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
        let taps = PackedConv::new(table, wt, 1).expect("pack");
        let im2col = PackedConv::for_im2col(table, wt, 1).expect("pack");
        let params = ConvParams { stride: &[s, s], padding: &[p, p], dilation: &[1, 1], groups: 1 };
        let mut out = vec![0f32; cout * o * o];
        let mut run = |packed: &PackedConv, cx: &mut Context| {
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &xs };
            let ot = TensorMut { data: bytemuck::cast_slice_mut(&mut out), dtype: DType::F32, shape: &os };
            let t = Instant::now();
            conv_packed(xt, wt, packed, None, &params, ot, cx).expect("conv");
            t.elapsed().as_secs_f64()
        };
        let (mut best_taps, mut best_im2col) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..runs {
            best_taps = best_taps.min(run(&taps, &mut cx));
            best_im2col = best_im2col.min(run(&im2col, &mut cx));
        }
        total_taps += best_taps;
        total_im2col += best_im2col;
        let gflops = |t: f64| 2.0 * (cout * cin * k * k * o * o) as f64 / t / 1e9;
        println!(
            "{cin:>3}->{cout:<3} {hw:>2}² s{s} threads {threads}: taps {:.3} ms ({:.1} GFLOP/s), im2col {:.3} ms ({:.1} GFLOP/s), taps/im2col {:.2}",
            best_taps * 1e3,
            gflops(best_taps),
            best_im2col * 1e3,
            gflops(best_im2col),
            best_taps / best_im2col
        );
    }
    println!(
        "sum of bests: taps {:.2} ms, im2col {:.2} ms, ratio {:.2}",
        total_taps * 1e3,
        total_im2col * 1e3,
        total_taps / total_im2col
    );
}
