//! Kernel microbenchmarks: `cargo bench -p kiln-benches --bench kernels`.
//!
//! Every table-backed kernel runs once per kernel table this CPU supports
//! (`generic`, `x86-64-v3`, ...), so the ISA variants' speedups read directly
//! off the report: `matmul_f32/x86-64-v3/256` against `matmul_f32/generic/256`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln_benches::distinct_tables;
use kiln_kernels::{matmul, softmax_cx, unary_cx, Context, DType, TensorMut, TensorRef, UnaryOp};

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| ((i % 17) as f32 * 0.25 - 2.0).to_le_bytes()).collect()
}

fn bench_matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_f32");
    for (isa, table) in distinct_tables(true) {
        for &n in &[64usize, 256, 512] {
            let (a, b) = (f32_bytes(n * n), f32_bytes(n * n));
            let mut out = vec![0u8; n * n * 4];
            let shape = [n, n];
            let mut cx = Context::with_table(table);
            group.throughput(Throughput::Elements((2 * n * n * n) as u64));
            group.bench_with_input(BenchmarkId::new(isa.name(), n), &n, |bench, _| {
                bench.iter(|| {
                    let (a, b) = (
                        TensorRef { dtype: DType::F32, shape: &shape, data: &a },
                        TensorRef { dtype: DType::F32, shape: &shape, data: &b },
                    );
                    let out = TensorMut { dtype: DType::F32, shape: &shape, data: &mut out };
                    matmul(a, b, out, &mut cx).unwrap();
                })
            });
        }
    }
    group.finish();
}

/// The exp-based activations over a 64 Ki-element tensor (L2-resident).
fn bench_unary(c: &mut Criterion) {
    const N: usize = 1 << 16;
    let x = f32_bytes(N);
    let mut out = vec![0u8; N * 4];
    let shape = [N];
    for op in [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Silu] {
        let mut group = c.benchmark_group(format!("unary_f32_{op:?}").to_lowercase());
        group.throughput(Throughput::Elements(N as u64));
        for (isa, table) in distinct_tables(true) {
            let mut cx = Context::with_table(table);
            group.bench_function(isa.name(), |bench| {
                bench.iter(|| {
                    let x = TensorRef { dtype: DType::F32, shape: &shape, data: &x };
                    let out = TensorMut { dtype: DType::F32, shape: &shape, data: &mut out };
                    unary_cx(op, x, out, &mut cx).unwrap();
                })
            });
        }
        group.finish();
    }
}

/// Softmax over the last axis of [64, 1000] (classifier logits).
fn bench_softmax(c: &mut Criterion) {
    let shape = [64usize, 1000];
    let x = f32_bytes(64 * 1000);
    let mut out = vec![0u8; x.len()];
    let mut group = c.benchmark_group("softmax_f32_64x1000");
    group.throughput(Throughput::Elements(64 * 1000));
    for (isa, table) in distinct_tables(true) {
        let mut cx = Context::with_table(table);
        group.bench_function(isa.name(), |bench| {
            bench.iter(|| {
                let x = TensorRef { dtype: DType::F32, shape: &shape, data: &x };
                let out = TensorMut { dtype: DType::F32, shape: &shape, data: &mut out };
                softmax_cx(x, 1, false, out, &mut cx).unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_matmul, bench_unary, bench_softmax);
criterion_main!(benches);
