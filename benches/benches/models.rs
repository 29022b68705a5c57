//! End-to-end latency of the fixture models on kiln's CPU runtime:
//! `cargo bench -p kiln-benches --bench models`. Compare with PyTorch eager
//! through `benches/compare_pytorch.py` (same shapes, same thread count).

use criterion::{criterion_group, criterion_main, Criterion};
use kiln_compiler::npy::read_npy;
use kiln_compiler::{compile_file, CompileOptions};
use kiln_runtime::{Program, Tensor};
use std::path::Path;

fn bench_models(c: &mut Criterion) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    for name in ["mlp", "cnn", "transformer"] {
        let dir = fixtures.join(name);
        let artifact = std::env::temp_dir().join(format!("kiln-bench-{name}.kiln"));
        compile_file(&dir.join("aten.pt2"), &artifact, &CompileOptions::default()).expect("compile");
        let program = Program::load(&artifact).expect("load");
        let inputs: Vec<Tensor> = (0..)
            .map(|i| dir.join(format!("input_{i}.npy")))
            .take_while(|p| p.exists())
            .map(|p| read_npy(&p).unwrap())
            .collect();
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let mut session = program.session().expect("session");
        c.bench_function(&format!("{name}/run"), |b| b.iter(|| session.run(&views).map(|o| o.len()).unwrap()));
    }
}

criterion_group!(benches, bench_models);
criterion_main!(benches);
