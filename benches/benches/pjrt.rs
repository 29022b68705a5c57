//! PJRT delegate costs on the XLA CPU plugin (needs MLIR 19 and the plugin):
//!
//! ```sh
//! eval "$(bash .ci/install-mlir.sh)"
//! eval "$(bash .ci/fetch-pjrt-plugins.sh ~/.cache/kiln-ci/pjrt-plugins | grep '^KILN_TEST_' | sed 's/^/export /')"
//! cargo bench -p kiln-benches --features pjrt --bench pjrt
//! ```
//!
//! - `overhead/*`: one call of a 4-element add. `raw` drives the plugin
//!   through `kiln_runtime::pjrt` directly (two host→device copies, execute,
//!   one device→host copy); `delegate` runs the same StableHLO as a
//!   one-segment artifact through `Session::run`. The difference is what the
//!   session adds (input checks, arena copies, the instruction loop).
//! - `models/<name>/{kiln-cpu,pjrt-cpu}`: the fixture models compiled with
//!   `--target cpu` and `--target pjrt`, run on kiln's kernels and on the XLA
//!   CPU plugin.

use criterion::{criterion_group, criterion_main, Criterion};
use kiln_compiler::npy::read_npy;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_file_for, compile_graph_for, Backend, CompileOptions};
use kiln_ir::{BinaryOp, DType as IrDType, Graph, Op, TensorType};
use kiln_runtime::format::Metadata;
use kiln_runtime::pjrt::{compile_options, Client, ClientOptions, Plugin};
use kiln_runtime::{DType, Device, ExecutableCache, Program, SessionOptions, Tensor, TensorView};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PLUGIN_ENV: &str = "KILN_TEST_XLA_CPU_PLUGIN";

fn plugin_path() -> PathBuf {
    match std::env::var_os(PLUGIN_ENV).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => panic!("set {PLUGIN_ENV}=/path/xla_cpu_pjrt.so (see .ci/fetch-pjrt-plugins.sh)"),
    }
}

/// Compiled once per session, never read from or written to the on-disk cache.
fn pjrt_options(plugin: &Path) -> SessionOptions {
    SessionOptions {
        device: Device::Pjrt(plugin.to_path_buf()),
        cache: ExecutableCache::Off,
        ..SessionOptions::default()
    }
}

/// `out = x + y` over four f32 elements, as a one-segment PJRT artifact.
fn tiny_add() -> Arc<Program> {
    let mut g = Graph::new();
    let ty = TensorType::fixed(IrDType::F32, &[4]);
    let x = g.add_input("x", ty.clone());
    let y = g.add_input("y", ty.clone());
    let sum = g.push(Op::Binary(BinaryOp::Add), vec![x, y], ty, None);
    g.add_output("out", sum);
    let backend = Backend::Pjrt { precision: Precision::F32 };
    let (writer, _) =
        compile_graph_for(g, &CompileOptions::default(), backend, Metadata::default()).expect("compile tiny add");
    Program::from_bytes(&writer.to_bytes()).expect("load tiny add")
}

fn bench_overhead(c: &mut Criterion) {
    let plugin = plugin_path();
    let program = tiny_add();
    let accel = program.accel().expect("the tiny add has an accelerator section");
    assert_eq!((accel.segments.len(), accel.cpu_fallbacks.len()), (1, 0), "the tiny add is one accelerator segment");
    let mlir = accel.segments[0].mlir.clone();

    let x = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let y = Tensor::from_f32(&[4], &[10.0, 20.0, 30.0, 40.0]);
    let want: Vec<u8> = [11.0f32, 22.0, 33.0, 44.0].iter().flat_map(|v| v.to_le_bytes()).collect();

    // Raw: the plugin through kiln's binding, nothing else. Host data 64-byte
    // aligned like the session's arena slices, so both paths give the plugin
    // the same kind of pointer.
    #[repr(C, align(64))]
    struct Aligned([u8; 16]);
    let to_aligned = |t: &Tensor| Aligned(t.data.as_slice().try_into().expect("16 bytes"));
    let (xa, ya) = (to_aligned(&x), to_aligned(&y));
    let loaded = Plugin::load(&plugin).expect("load plugin");
    let client = Client::create(&loaded, &ClientOptions::default()).expect("create client");
    let device = client.devices()[0].id;
    let exe = client.compile(&mlir, &compile_options::single_device(i64::from(device))).expect("compile");
    let mut host = vec![0u8; 16];
    let raw_call = |host: &mut [u8]| {
        let a = client.buffer_from_host(DType::F32, &[4], &xa.0, 0).expect("upload x");
        let b = client.buffer_from_host(DType::F32, &[4], &ya.0, 0).expect("upload y");
        let out = exe.execute(&[&a, &b]).expect("execute");
        out[0].to_host(host).expect("download");
    };
    raw_call(&mut host);
    assert_eq!(host, want, "raw plugin result");

    // Delegate: the same StableHLO as an InstrOp::Delegate instruction in a session.
    let mut session = program.session_with(&pjrt_options(&plugin)).expect("pjrt session");
    let views: Vec<TensorView<'_>> = vec![x.view(), y.view()];
    assert_eq!(session.run(&views).expect("run").get(0).data, &want[..], "delegate result");

    let mut group = c.benchmark_group("overhead");
    group.bench_function("raw", |b| b.iter(|| raw_call(&mut host)));
    group.bench_function("delegate", |b| b.iter(|| session.run(&views).map(|o| o.len()).expect("run")));
    group.finish();
}

fn bench_models(c: &mut Criterion) {
    let plugin = plugin_path();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    for name in ["mlp", "cnn", "transformer"] {
        let dir = fixtures.join(name);
        let inputs: Vec<Tensor> = (0..)
            .map(|i| dir.join(format!("input_{i}.npy")))
            .take_while(|p| p.exists())
            .map(|p| read_npy(&p).expect("input"))
            .collect();
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let mut group = c.benchmark_group(format!("models/{name}"));
        for (label, backend) in [("kiln-cpu", Backend::Cpu), ("pjrt-cpu", Backend::Pjrt { precision: Precision::F32 })]
        {
            let artifact = std::env::temp_dir().join(format!("kiln-bench-pjrt-{name}-{label}.kiln"));
            compile_file_for(&dir.join("aten.pt2"), &artifact, &CompileOptions::default(), backend).expect("compile");
            let program = Program::load(&artifact).expect("load");
            let options = if backend == Backend::Cpu { SessionOptions::default() } else { pjrt_options(&plugin) };
            let mut session = program.session_with(&options).expect("session");
            group.bench_function(label, |b| b.iter(|| session.run(&views).map(|o| o.len()).expect("run")));
        }
        group.finish();
    }
}

criterion_group!(benches, bench_overhead, bench_models);
criterion_main!(benches);
