//! The PJRT binding and the accelerator delegate against the real XLA CPU
//! plugin (`xla-cpu-pjrt` 0.0.1, fetched by `.ci/fetch-pjrt-plugins.sh`).
//! `KILN_TEST_XLA_CPU_PLUGIN` names `xla_cpu_pjrt.so`; without it these tests
//! skip, except under CI (`CI` set), where they fail.
#![cfg(feature = "pjrt")]

use kiln_runtime::format::*;
use kiln_runtime::pjrt::{compile_options, Client, ClientOptions, Plugin};
use kiln_runtime::{Device, Error, ExecutableCache, Program, SessionOptions, Tensor};
use std::path::PathBuf;
use std::sync::Arc;

fn plugin_path() -> Option<PathBuf> {
    match std::env::var_os("KILN_TEST_XLA_CPU_PLUGIN").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None if plugins_required() => {
            panic!("KILN_TEST_XLA_CPU_PLUGIN is not set (CI must run .ci/fetch-pjrt-plugins.sh and export it)")
        }
        None => {
            eprintln!("skipping: set KILN_TEST_XLA_CPU_PLUGIN=/path/to/xla_cpu_pjrt.so to run the PJRT tests");
            None
        }
    }
}

/// `dot(a, b) + c` in generic StableHLO form, as the compiler emits it.
const DOT_ADD: &str = r#"module {
  func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>, %c: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %0 = "stablehlo.dot_general"(%a, %b) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %1 = "stablehlo.add"(%0, %c) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    "func.return"(%1) : (tensor<2x2xf32>) -> ()
  }
}
"#;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

const A: [f32; 6] = [1., 2., 3., 4., 5., 6.];
const B: [f32; 6] = [1., 0., 0., 1., 1., 1.];
const C: [f32; 4] = [10., 20., 30., 40.];
/// dot(A, B) = [[4, 5], [10, 11]]; + C.
const DOT_ADD_EXPECTED: [f32; 4] = [14., 25., 40., 51.];

fn four_device_client(path: &std::path::Path) -> Arc<Client> {
    let plugin = Plugin::load(path).expect("load plugin");
    assert_eq!(plugin.api_version().0, 0);
    Client::create(&plugin, &ClientOptions { cpu_device_count: Some(4), ..ClientOptions::default() })
        .expect("create client")
}

#[test]
fn compiles_and_runs_on_device_two() {
    let Some(path) = plugin_path() else { return };
    let client = four_device_client(&path);
    assert_eq!(client.platform_name(), "cpu");
    assert_eq!(client.devices().len(), 4, "cpu_device_count=4 gives 4 devices: {:?}", client.devices());
    let dev = &client.devices()[2];
    let exe = client.compile(DOT_ADD, &compile_options::single_device(i64::from(dev.id))).expect("compile");
    assert_eq!(exe.num_outputs(), 1);
    // The device assignment in the hand-encoded options is honoured: a device
    // id the client lacks is refused.
    let missing = client.compile(DOT_ADD, &compile_options::single_device(99));
    assert!(matches!(missing, Err(Error::Pjrt { .. })), "compiling for device id 99 must fail");
    let a = client.buffer_from_host(kiln_runtime::DType::F32, &[2, 3], &f32_bytes(&A), 2).unwrap();
    let b = client.buffer_from_host(kiln_runtime::DType::F32, &[3, 2], &f32_bytes(&B), 2).unwrap();
    let c = client.buffer_from_host(kiln_runtime::DType::F32, &[2, 2], &f32_bytes(&C), 2).unwrap();
    let outs = exe.execute(&[&a, &b, &c]).expect("execute");
    assert_eq!(outs[0].dims().unwrap(), [2, 2]);
    let mut host = vec![0u8; 16];
    outs[0].to_host(&mut host).unwrap();
    assert_eq!(f32s(&host), DOT_ADD_EXPECTED);
    // A wrong-sized destination is an error value, not a short copy.
    let mut short = vec![0u8; 12];
    assert!(matches!(outs[0].to_host(&mut short), Err(Error::Pjrt { .. })));

    // Serialize → deserialize gives a working executable.
    let bytes = exe.serialize().expect("serialize");
    let again = client.deserialize(&bytes, &compile_options::single_device(i64::from(dev.id))).expect("deserialize");
    let outs = again.execute(&[&a, &b, &c]).unwrap();
    outs[0].to_host(&mut host).unwrap();
    assert_eq!(f32s(&host), DOT_ADD_EXPECTED);
}

#[test]
fn malformed_mlir_is_an_error_with_the_plugins_message() {
    let Some(path) = plugin_path() else { return };
    let client = four_device_client(&path);
    let bad = DOT_ADD.replace("stablehlo.add", "stablehlo.no_such_op");
    match client.compile(&bad, &compile_options::single_device(0)) {
        Err(Error::Pjrt { call, message }) => {
            assert_eq!(call, "PJRT_Client_Compile");
            assert!(!message.is_empty());
            eprintln!("plugin says: {message}");
        }
        Err(other) => panic!("expected a PJRT error, got {other}"),
        Ok(_) => panic!("malformed MLIR compiled"),
    }
    let garbage = client.compile("this is not MLIR", &compile_options::single_device(0));
    assert!(matches!(garbage, Err(Error::Pjrt { .. })));
}

/// A plan mixing a CPU instruction and an accelerator segment:
/// `y = relu(x)` on the CPU, then `(z, m) = (dot(y, w) + c, z * z)` on PJRT
/// with `w` and `c` weights uploaded once.
fn mixed_artifact() -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let w = weights.push(&f32_bytes(&B));
    let c = weights.push(&f32_bytes(&C));
    let f32t = |shape: &[u64], storage: Storage| TensorDecl {
        dtype: DType::F32,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage,
    };
    let arena = |offset: u64, bytes: u64| Storage::Arena { offset, max_bytes: bytes };
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![
            f32t(&[2, 3], arena(0, 24)),   // 0: x
            f32t(&[2, 3], arena(64, 24)),  // 1: y
            f32t(&[3, 2], w),              // 2: w
            f32t(&[2, 2], c),              // 3: c
            f32t(&[2, 2], arena(128, 16)), // 4: z
            f32t(&[2, 2], arena(192, 16)), // 5: m
        ],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![
            IoDecl { name: "z".into(), tensor: 4, complex: false },
            IoDecl { name: "m".into(), tensor: 5, complex: false },
        ],
        instrs: vec![
            Instr {
                op: InstrOp::Call(Kernel::Unary { op: UnaryOp::Relu }),
                inputs: vec![0],
                outputs: vec![1],
                origin: "relu".into(),
            },
            Instr {
                op: InstrOp::Delegate { segment: 0 },
                inputs: vec![1, 2, 3],
                outputs: vec![4, 5],
                origin: "segment 0".into(),
            },
        ],
        arena_bytes: 256,
        peak_live_bytes: 80,
        states: vec![],
    };
    let mlir = r#"module {
  func.func @main(%y: tensor<2x3xf32>, %w: tensor<3x2xf32>, %c: tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>) {
    %0 = "stablehlo.dot_general"(%y, %w) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %1 = "stablehlo.add"(%0, %c) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %2 = "stablehlo.multiply"(%1, %1) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    "func.return"(%1, %2) : (tensor<2x2xf32>, tensor<2x2xf32>) -> ()
  }
}
"#;
    let accel = AccelProgram {
        segments: vec![AccelSegment {
            mlir: mlir.into(),
            args: vec![1, 2, 3],
            results: vec![4, 5],
            ops: vec!["matmul".into(), "add".into(), "mul".into()],
            arg_shardings: vec![],
            result_shardings: vec![],
            index_checks: vec![],
        }],
        cpu_fallbacks: vec![CpuFallback { instr: 0, reason: "test: relu stays on the CPU".into() }],
        mesh: None,
        buckets: vec![],
        estimate: None,
    };
    let mut writer = ArtifactWriter::new(&plan, weights, &Metadata::default()).unwrap();
    writer.add_accel(&accel).unwrap();
    writer.to_bytes()
}

fn pjrt_options(path: PathBuf, cache: ExecutableCache) -> SessionOptions {
    SessionOptions {
        device: Device::Pjrt(path),
        device_index: 2,
        pjrt_cpu_device_count: Some(4),
        cache,
        ..SessionOptions::default()
    }
}

#[test]
fn mixed_plan_runs_through_a_pjrt_session_and_uses_the_cache() {
    let Some(path) = plugin_path() else { return };
    let program = Program::from_bytes(&mixed_artifact()).expect("load mixed artifact");
    assert_eq!(program.accel().unwrap().segments.len(), 1);

    // The CPU device refuses it clearly.
    match program.session() {
        Err(Error::Device(m)) => assert!(m.contains("compiled for an accelerator") && m.contains("--device"), "{m}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a CPU session accepted accelerator instructions"),
    }

    let cache_dir = std::env::temp_dir().join(format!("kiln-pjrt-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache_dir);
    let options = pjrt_options(path, ExecutableCache::Dir(cache_dir.clone()));
    // -6 exercises relu on the CPU side: relu(x) = [[1, 2, 3], [4, 5, 0]],
    // dot with [[1, 0], [0, 1], [1, 1]] = [[4, 5], [4, 5]], plus c.
    let x = Tensor::from_f32(&[2, 3], &[1., 2., 3., 4., 5., -6.]);
    let expected_z = [14., 25., 34., 45.];
    let expected_m: Vec<f32> = expected_z.iter().map(|v| v * v).collect();

    let mut first = program.session_with(&options).expect("first PJRT session");
    let info = first.accel_info().expect("accelerator info").clone();
    assert_eq!((info.compiled, info.cache_hits, info.segments), (1, 0, 1), "{info:?}");
    assert!(info.cache_write_errors.is_empty(), "{:?}", info.cache_write_errors);
    assert_eq!(info.platform_name, "cpu");
    let files: Vec<_> = std::fs::read_dir(&cache_dir).unwrap().filter_map(|e| e.ok()).collect();
    assert_eq!(files.len(), 1, "one cached executable");
    for _ in 0..2 {
        let out = first.run(&[x.view()]).expect("run");
        assert_eq!(f32s(out.get(0).data), expected_z);
        assert_eq!(f32s(out.get(1).data), expected_m);
    }

    let mut second = program.session_with(&options).expect("second PJRT session");
    let info = second.accel_info().unwrap();
    assert_eq!((info.compiled, info.cache_hits), (0, 1), "second session loads from the cache: {info:?}");
    let out = second.run(&[x.view()]).expect("run from cache");
    assert_eq!(f32s(out.get(0).data), expected_z);
    assert_eq!(f32s(out.get(1).data), expected_m);

    // Without the cache it compiles again; a bad device index is an error value.
    let off = program.session_with(&SessionOptions { cache: ExecutableCache::Off, ..options.clone() }).unwrap();
    assert_eq!(off.accel_info().unwrap().compiled, 1);
    let bad = program.session_with(&SessionOptions { device_index: 9, ..options });
    assert!(matches!(bad, Err(Error::Device(ref m)) if m.contains("out of range")));
    let _ = std::fs::remove_dir_all(&cache_dir);
}

#[test]
fn segment_failing_to_compile_fails_the_session_with_context() {
    let Some(path) = plugin_path() else { return };
    let bytes = mixed_artifact();
    let program = Program::from_bytes(&bytes).unwrap();
    let mut accel = program.accel().unwrap().clone();
    accel.segments[0].mlir = accel.segments[0].mlir.replace("stablehlo.multiply", "stablehlo.multiplyy");
    let mut weights = WeightsBuilder::new();
    weights.push(&f32_bytes(&B));
    weights.push(&f32_bytes(&C));
    let mut writer = ArtifactWriter::new(program.plan(), weights, &Metadata::default()).unwrap();
    writer.add_accel(&accel).unwrap();
    let broken = Program::from_bytes(&writer.to_bytes()).unwrap();
    match broken.session_with(&pjrt_options(path, ExecutableCache::Off)) {
        Err(Error::Pjrt { call, message }) => {
            assert!(call.contains("segment 0"), "{call}");
            assert!(!message.is_empty());
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("broken segment compiled"),
    }
}

/// Counts the heap allocations the current thread makes while counting is
/// on; other test threads (and the plugin's own C++ allocations) are not
/// counted.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static COUNTING: Cell<bool> = const { Cell::new(false) };
        static COUNT: Cell<usize> = const { Cell::new(0) };
    }

    pub struct Counting;

    fn note() {
        if COUNTING.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note();
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note();
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    pub fn allocations_during(f: impl FnOnce()) -> usize {
        COUNT.with(|c| c.set(0));
        COUNTING.with(|c| c.set(true));
        f();
        COUNTING.with(|c| c.set(false));
        COUNT.with(Cell::get)
    }
}

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[test]
fn the_delegate_path_allocates_nothing_after_the_first_run() {
    let Some(path) = plugin_path() else { return };
    let program = Program::from_bytes(&mixed_artifact()).unwrap();
    let mut session = program.session_with(&pjrt_options(path, ExecutableCache::Off)).unwrap();
    let x = Tensor::from_f32(&[2, 3], &[1., 2., 3., 4., 5., -6.]);
    session.run(&[x.view()]).unwrap();
    let allocations = counting::allocations_during(|| {
        for _ in 0..5 {
            session.run(&[x.view()]).unwrap();
        }
    });
    assert_eq!(allocations, 0, "steady-state runs with an accelerator segment allocated");
    let z = session.run(&[x.view()]).unwrap().get(0).data.to_vec();
    assert_eq!(z, f32_bytes(&[14., 25., 34., 45.]), "still the right numbers");
}

/// CI must provide the plugins, but they exist only for x86-64 Linux: the
/// aarch64 step (`.ci/aarch64.sh`, under qemu) has none and skips.
fn plugins_required() -> bool {
    std::env::var_os("CI").is_some() && cfg!(target_arch = "x86_64")
}

/// `s + x`, its result aliased to `s` (`tf.aliasing_output`): a state update
/// the executable may write where the state lies.
const ALIASED_ADD: &str = r#"module {
  func.func @main(%s: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.add"(%s, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
}
"#;

/// A donated argument is taken over: deleted, its memory the aliased
/// result's; one kept (non-donatable) stays and the result is new memory.
#[test]
fn donated_argument_becomes_the_aliased_result() {
    let Some(path) = plugin_path() else { return };
    let client = four_device_client(&path);
    let exe = client.compile(ALIASED_ADD, &compile_options::single_device(0)).expect("compile");
    let upload = |v: &[f32]| client.buffer_from_host(kiln_runtime::DType::F32, &[4], &f32_bytes(v), 0).unwrap();
    let (s, x) = (upload(&[1., 2., 3., 4.]), upload(&[10., 10., 10., 10.]));
    let at = s.device_address().expect("address");
    let kept = exe.execute(&[&s, &x]).expect("execute");
    assert!(!s.is_deleted().unwrap(), "execute keeps its arguments");
    assert_ne!(kept[0].device_address().unwrap(), at, "a kept argument's result is new memory");
    let out = exe.execute_donating(&[&s, &x], &[1]).expect("execute donating");
    assert!(s.is_deleted().unwrap(), "the aliased argument was donated");
    assert!(!x.is_deleted().unwrap(), "a non-aliased argument is not");
    assert_eq!(out[0].device_address().unwrap(), at, "the result lies where the donated argument did");
    let mut host = vec![0u8; 16];
    out[0].to_host(&mut host).unwrap();
    assert_eq!(f32s(&host), [11., 12., 13., 14.]);
    // A deleted argument is refused, not read.
    assert!(exe.execute(&[&s, &x]).is_err(), "a donated buffer cannot be used again");
}
