//! A/B of the dense convolution paths on ResNet-18's convolutions (batch 1,
//! weights packed once): `Auto` (Winograd for the 3×3 stride-1 ones,
//! [`PackedConv::for_params`]), Winograd with each output tile forced
//! ([`ConvAlgorithm::WinogradF2`], [`ConvAlgorithm::WinogradF4`]; the same
//! as `Auto` on the stride-2 ones), the tap path ([`ConvAlgorithm::Taps`])
//! and im2col with a packed A ([`PackedConv::for_im2col`]), interleaved run
//! by run so that a loaded machine slows them alike; prints the best time
//! of each.
//!
//!     cargo run --release -p kiln-kernels --example conv_ab -- [THREADS [RUNS]]

use kiln_kernels::{
    best, conv_packed_with, Context, ConvAlgorithm, ConvParams, DType, PackedConv, TensorMut, TensorRef,
};
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
    let mut totals = [0.0f64; 5];
    for (cin, cout, hw, k, s, p) in convs {
        let o = (hw + 2 * p - k) / s + 1;
        let (x, w) = (values(cin * hw * hw), values(cout * cin * k * k));
        let (xs, ws, os) = ([1, cin, hw, hw], [cout, cin, k, k], [1, cout, o, o]);
        let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
        let params = ConvParams { stride: &[s, s], padding: &[p, p], dilation: &[1, 1], groups: 1 };
        let auto = PackedConv::for_params(table, wt, &params).expect("pack");
        let f2 = PackedConv::for_params_with(table, wt, &params, ConvAlgorithm::WinogradF2).expect("pack");
        let f4 = PackedConv::for_params_with(table, wt, &params, ConvAlgorithm::WinogradF4).expect("pack");
        let taps = PackedConv::new(table, wt, 1).expect("pack");
        let im2col = PackedConv::for_im2col(table, wt, 1).expect("pack");
        let mut out = vec![0f32; cout * o * o];
        let mut run = |packed: &PackedConv, algorithm, cx: &mut Context| {
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &xs };
            let ot = TensorMut { data: bytemuck::cast_slice_mut(&mut out), dtype: DType::F32, shape: &os };
            let t = Instant::now();
            conv_packed_with(xt, wt, packed, None, &params, ot, cx, algorithm).expect("conv");
            t.elapsed().as_secs_f64()
        };
        let mut best = [f64::INFINITY; 5];
        for _ in 0..runs {
            best[0] = best[0].min(run(&auto, ConvAlgorithm::Auto, &mut cx));
            best[1] = best[1].min(run(&taps, ConvAlgorithm::Taps, &mut cx));
            best[2] = best[2].min(run(&im2col, ConvAlgorithm::Auto, &mut cx));
            best[3] = best[3].min(run(&f2, ConvAlgorithm::WinogradF2, &mut cx));
            best[4] = best[4].min(run(&f4, ConvAlgorithm::WinogradF4, &mut cx));
        }
        for (t, b) in totals.iter_mut().zip(best) {
            *t += b;
        }
        let gflops = |t: f64| 2.0 * (cout * cin * k * k * o * o) as f64 / t / 1e9;
        println!(
            "{cin:>3}->{cout:<3} {hw:>2}² s{s} threads {threads}: auto {:.3} ms ({:.0} GFLOP/s), F2 {:.3} ms ({:.0}), F4 {:.3} ms ({:.0}), taps {:.3} ms ({:.0}), im2col {:.3} ms ({:.0}), auto/taps {:.2}, F4/F2 {:.2}",
            best[0] * 1e3,
            gflops(best[0]),
            best[3] * 1e3,
            gflops(best[3]),
            best[4] * 1e3,
            gflops(best[4]),
            best[1] * 1e3,
            gflops(best[1]),
            best[2] * 1e3,
            gflops(best[2]),
            best[0] / best[1],
            best[4] / best[3]
        );
    }
    println!(
        "sum of bests: auto {:.2} ms, F2 {:.2} ms, F4 {:.2} ms, taps {:.2} ms, im2col {:.2} ms, auto/taps {:.2}",
        totals[0] * 1e3,
        totals[3] * 1e3,
        totals[4] * 1e3,
        totals[1] * 1e3,
        totals[2] * 1e3,
        totals[0] / totals[1]
    );
}
