//! Kernel microbenchmarks: `cargo bench -p kiln-benches --bench kernels`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln_kernels::{matmul, DType, Scratch, TensorMut, TensorRef};

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| ((i % 17) as f32 * 0.25 - 2.0).to_le_bytes()).collect()
}

fn bench_matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_f32");
    for &n in &[64usize, 256, 512] {
        let (a, b) = (f32_bytes(n * n), f32_bytes(n * n));
        let mut out = vec![0u8; n * n * 4];
        let shape = [n, n];
        let mut scratch = Scratch::new();
        group.throughput(Throughput::Elements((2 * n * n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                let (a, b) = (
                    TensorRef { dtype: DType::F32, shape: &shape, data: &a },
                    TensorRef { dtype: DType::F32, shape: &shape, data: &b },
                );
                let out = TensorMut { dtype: DType::F32, shape: &shape, data: &mut out };
                matmul(a, b, out, &mut scratch).unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_matmul);
criterion_main!(benches);
