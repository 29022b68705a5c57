//! GEMM, skinny linear and convolution benchmarks at 1 and 2 threads, on
//! every kernel table this CPU runs:
//! `cargo bench -p kiln-benches --bench gemm`.
//!
//! - `gemm_square/{isa}/t{threads}/{n}`: C = A·B, n×n f32, n = 64 … 2048.
//! - `linear_skinny/{isa}/t{threads}/m{m}`: x `[m, 512]` · wᵀ with w
//!   `[2048, 512]` packed once (a decode step / batch-m MLP layer), m = 1 … 16.
//! - `conv/{isa}/t{threads}/{shape}`: ResNet- and MobileNet-like layers.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln_benches::distinct_tables;
use kiln_kernels::{conv, gemm_f32, linear_packed, Context, ConvParams, DType, PackedB, TensorMut, TensorRef};
use std::time::Duration;

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const THREADS: [usize; 2] = [1, 2];

fn bench_square(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_square");
    group.sample_size(10).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300));
    for (isa, table) in distinct_tables(false) {
        for threads in THREADS {
            let mut cx = Context::with_table(table).with_threads(threads);
            for n in [64usize, 128, 256, 512, 1024, 2048] {
                let (a, b) = (values(n * n), values(n * n));
                let mut out = vec![0f32; n * n];
                group.throughput(Throughput::Elements((2 * n * n * n) as u64));
                let id = BenchmarkId::new(format!("{isa}/t{threads}"), n);
                group.bench_with_input(id, &n, |bench, _| {
                    bench.iter(|| gemm_f32(n, n, n, &a, n, &b, n, &mut out, n, false, 0.0, &mut cx).unwrap())
                });
            }
        }
    }
    group.finish();
}

fn bench_skinny(c: &mut Criterion) {
    let (k, n) = (512usize, 2048usize);
    let mut group = c.benchmark_group("linear_skinny");
    group.sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(200));
    let w = values(n * k);
    for (isa, table) in distinct_tables(false) {
        let packed = PackedB::new(table, k, n, &w, k, true).unwrap();
        for threads in THREADS {
            let mut cx = Context::with_table(table).with_threads(threads);
            for m in [1usize, 2, 4, 8, 16] {
                let x = bytes(&values(m * k));
                let mut out = vec![0u8; m * n * 4];
                // Bytes moved: the packed weight dominates.
                group.throughput(Throughput::Bytes(packed.bytes() as u64));
                let id = BenchmarkId::new(format!("{isa}/t{threads}"), format!("m{m}"));
                group.bench_with_input(id, &m, |bench, _| {
                    bench.iter(|| {
                        let (xs, os) = ([m, k], [m, n]);
                        let x = TensorRef { dtype: DType::F32, shape: &xs, data: &x };
                        let out = TensorMut { dtype: DType::F32, shape: &os, data: &mut out };
                        linear_packed(x, &packed, None, out, &mut cx).unwrap()
                    })
                });
            }
        }
    }
    group.finish();
}

/// A benchmarked layer: name, x `[n, cin, h, w]`, w `[cout, cin/groups, kh,
/// kw]`, stride, padding, groups.
type ConvShape = (&'static str, [usize; 4], [usize; 4], usize, usize, usize);

fn bench_conv(c: &mut Criterion) {
    let shapes: [ConvShape; 4] = [
        ("resnet_3x3_64x56", [1, 64, 56, 56], [64, 64, 3, 3], 1, 1, 1),
        ("resnet_3x3_256x14", [1, 256, 14, 14], [256, 256, 3, 3], 1, 1, 1),
        ("pointwise_32to192x56", [1, 32, 56, 56], [192, 32, 1, 1], 1, 0, 1),
        ("depthwise_3x3_192x56", [1, 192, 56, 56], [192, 1, 3, 3], 1, 1, 192),
    ];
    let mut group = c.benchmark_group("conv");
    group.sample_size(10).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300));
    for (isa, table) in distinct_tables(false) {
        for threads in THREADS {
            let mut cx = Context::with_table(table).with_threads(threads);
            for (name, xs, ws, stride, pad, groups) in shapes {
                let oh = (xs[2] + 2 * pad - ws[2]) / stride + 1;
                let ow = (xs[3] + 2 * pad - ws[3]) / stride + 1;
                let os = [xs[0], ws[0], oh, ow];
                let (x, w) = (bytes(&values(xs.iter().product())), bytes(&values(ws.iter().product())));
                let mut out = vec![0u8; os.iter().product::<usize>() * 4];
                let flops = 2 * os.iter().product::<usize>() * ws[1] * ws[2] * ws[3];
                group.throughput(Throughput::Elements(flops as u64));
                let id = BenchmarkId::new(format!("{isa}/t{threads}"), name);
                group.bench_with_input(id, &name, |bench, _| {
                    bench.iter(|| {
                        let params = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[1, 1], groups };
                        let x = TensorRef { dtype: DType::F32, shape: &xs, data: &x };
                        let w = TensorRef { dtype: DType::F32, shape: &ws, data: &w };
                        let out = TensorMut { dtype: DType::F32, shape: &os, data: &mut out };
                        conv(x, w, None, &params, out, &mut cx).unwrap()
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_square, bench_skinny, bench_conv);
criterion_main!(benches);
