//! SPMD artifacts (a mesh, one segment with sharded arguments and results)
//! on the XLA CPU plugin: the runtime splits inputs and weights on the host,
//! runs every device in one execute call and assembles the results. Needs
//! `KILN_TEST_XLA_CPU_PLUGIN` (skips without it, fails under CI).
#![cfg(feature = "pjrt")]

use kiln_runtime::format::*;
use kiln_runtime::{Device, Error, ExecutableCache, Program, SessionOptions, Tensor};
use std::path::{Path, PathBuf};

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

/// Small integers: every product and sum below is exact in f32.
fn ints(n: usize, seed: usize, span: i32) -> Vec<f32> {
    (0..n).map(|i| (((i * 7 + seed * 13) % (2 * span as usize + 1)) as i32 - span) as f32).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `relu(x w1) w2` on the host.
fn mlp_reference(x: &[f32], w1: &[f32], w2: &[f32]) -> Vec<f32> {
    let h: Vec<f32> = (0..8 * 32)
        .map(|k| {
            let (i, j) = (k / 32, k % 32);
            (0..16).map(|t| x[i * 16 + t] * w1[t * 32 + j]).sum::<f32>().max(0.0)
        })
        .collect();
    (0..8 * 16).map(|k| (0..32).map(|t| h[(k / 16) * 32 + t] * w2[t * 16 + k % 16]).sum()).collect()
}

/// Shardy text for `{x, w1, w2} -> y` on a 1-D mesh `x` of `n` devices.
fn mlp_text(n: u32, shardings: [&str; 4]) -> String {
    let s = |dims: &str| format!("{{sdy.sharding = #sdy.sharding<@mesh, [{dims}]>}}");
    format!(
        r#"module {{
  "sdy.mesh"() {{sym_name = "mesh", mesh = #sdy.mesh<["x"={n}]>}} : () -> ()
  func.func @main(%x: tensor<8x16xf32> {}, %w1: tensor<16x32xf32> {}, %w2: tensor<32x16xf32> {}) -> (tensor<8x16xf32> {}) {{
    %0 = "stablehlo.dot_general"(%x, %w1) {{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}} : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
    %z = "stablehlo.constant"() {{value = dense<0.0> : tensor<8x32xf32>}} : () -> tensor<8x32xf32>
    %1 = "stablehlo.maximum"(%0, %z) : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
    %2 = "stablehlo.dot_general"(%1, %w2) {{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}} : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
    "func.return"(%2) : (tensor<8x16xf32>) -> ()
  }}
}}
"#,
        s(shardings[0]),
        s(shardings[1]),
        s(shardings[2]),
        s(shardings[3])
    )
}

/// One `Delegate` over the whole program; `shardings` as Shardy text (for
/// the module) and as mesh-axis lists (for the runtime), for x, w1, w2, y.
fn mlp_artifact(n: u32, devices: Vec<u32>, text: [&str; 4], dims: [Vec<Vec<u32>>; 4]) -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let w1 = weights.push(&bytes(&ints(16 * 32, 1, 1)));
    let w2 = weights.push(&bytes(&ints(32 * 16, 2, 1)));
    let f32t = |shape: &[u64], storage: Storage| TensorDecl {
        dtype: DType::F32,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage,
    };
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![
            f32t(&[8, 16], Storage::Arena { offset: 0, max_bytes: 512 }),
            f32t(&[16, 32], w1),
            f32t(&[32, 16], w2),
            f32t(&[8, 16], Storage::Arena { offset: 512, max_bytes: 512 }),
        ],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: 3, complex: false }],
        instrs: vec![Instr {
            op: InstrOp::Delegate { segment: 0 },
            inputs: vec![0, 1, 2],
            outputs: vec![3],
            origin: "segment 0".into(),
        }],
        arena_bytes: 1024,
        peak_live_bytes: 1024,
        states: vec![],
    };
    let [x, w1s, w2s, y] = dims.map(|d| TensorSharding { dims: d });
    let accel = AccelProgram {
        segments: vec![AccelSegment {
            mlir: mlp_text(n, text),
            args: vec![0, 1, 2],
            results: vec![3],
            ops: vec!["matmul".into(), "relu".into(), "matmul".into()],
            arg_shardings: vec![x, w1s, w2s],
            result_shardings: vec![y],
            index_checks: vec![],
        }],
        cpu_fallbacks: vec![],
        mesh: Some(MeshDecl { axes: vec![MeshAxisDecl { name: "x".into(), size: n }], devices }),
        buckets: vec![],
        estimate: None,
    };
    let mut writer = ArtifactWriter::new(&plan, weights, &Metadata::default()).expect("writer");
    writer.add_accel(&accel).expect("accel");
    writer.to_bytes()
}

fn run(artifact: &[u8], plugin: &Path, count: Option<u32>) -> Result<Vec<f32>, Error> {
    run_cached(artifact, plugin, count, ExecutableCache::Off, (1, 0))
}

/// Runs twice in one session (the second call reuses every list) and checks
/// how the segment was obtained: `(compiled, cache hits)`.
fn run_cached(
    artifact: &[u8],
    plugin: &Path,
    count: Option<u32>,
    cache: ExecutableCache,
    obtained: (usize, usize),
) -> Result<Vec<f32>, Error> {
    let program = Program::from_bytes(artifact)?;
    let opts = SessionOptions {
        device: Device::Pjrt(plugin.to_path_buf()),
        pjrt_cpu_device_count: count,
        cache,
        ..SessionOptions::default()
    };
    let mut session = program.session_with(&opts)?;
    let x = Tensor::from_f32(&[8, 16], &ints(8 * 16, 3, 2));
    let first = session.run(&[x.view()])?.to_tensors();
    let again = session.run(&[x.view()])?.to_tensors();
    assert_eq!(first[0].data, again[0].data, "a second run gives the same bytes");
    let info = session.accel_info().expect("accelerator session");
    assert_eq!((info.compiled, info.cache_hits), obtained, "how the sharded segment was obtained");
    assert_eq!(info.partitions, program.accel().and_then(|a| a.mesh.as_ref()).map_or(1, |m| m.size() as usize));
    Ok(first[0].data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[test]
fn sharded_executables_come_from_the_cache() {
    let Some(plugin) = plugin_path() else { return };
    let want = mlp_reference(&ints(8 * 16, 3, 2), &ints(16 * 32, 1, 1), &ints(32 * 16, 2, 1));
    let dir = std::env::temp_dir().join(format!("kiln-spmd-cache-{}", std::process::id()));
    let tp = mlp_artifact(
        4,
        vec![],
        ["{}, {}", "{}, {\"x\"}", "{\"x\"}, {}", "{}, {}"],
        [vec![vec![], vec![]], vec![vec![], vec![0]], vec![vec![0], vec![]], vec![vec![], vec![]]],
    );
    let cache = ExecutableCache::Dir(dir.clone());
    assert_eq!(run_cached(&tp, &plugin, None, cache.clone(), (1, 0)).unwrap_or_else(|e| panic!("{e}")), want);
    assert_eq!(run_cached(&tp, &plugin, None, cache, (0, 1)).unwrap_or_else(|e| panic!("{e}")), want);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tensor_and_data_parallel_mlps_match_the_host_on_2_and_4_devices() {
    let Some(plugin) = plugin_path() else { return };
    let want = mlp_reference(&ints(8 * 16, 3, 2), &ints(16 * 32, 1, 1), &ints(32 * 16, 2, 1));
    for n in [2u32, 4] {
        // Tensor-parallel: w1 column-split, w2 row-split, x and y whole.
        let tp = mlp_artifact(
            n,
            vec![],
            ["{}, {}", "{}, {\"x\"}", "{\"x\"}, {}", "{}, {}"],
            [vec![vec![], vec![]], vec![vec![], vec![0]], vec![vec![0], vec![]], vec![vec![], vec![]]],
        );
        assert_eq!(run(&tp, &plugin, None).unwrap_or_else(|e| panic!("tp on {n}: {e}")), want, "tp on {n}");
        // Data-parallel: x and y split on the batch (the result assembled
        // from every device's rows), weights whole; devices in reverse order.
        let dp = mlp_artifact(
            n,
            (0..n).rev().collect(),
            ["{\"x\"}, {}", "{}, {}", "{}, {}", "{\"x\"}, {}"],
            [vec![vec![0], vec![]], vec![vec![], vec![]], vec![vec![], vec![]], vec![vec![0], vec![]]],
        );
        assert_eq!(run(&dp, &plugin, None).unwrap_or_else(|e| panic!("dp on {n}: {e}")), want, "dp on {n}");
    }
}

#[test]
fn a_client_with_too_few_devices_is_refused() {
    let Some(plugin) = plugin_path() else { return };
    let tp = mlp_artifact(
        4,
        vec![],
        ["{}, {}", "{}, {\"x\"}", "{\"x\"}, {}", "{}, {}"],
        [vec![vec![], vec![]], vec![vec![], vec![0]], vec![vec![0], vec![]], vec![vec![], vec![]]],
    );
    match run(&tp, &plugin, Some(2)) {
        Err(Error::Device(m)) => {
            assert!(m.contains("sharded over 4 devices (mesh x=4)") && m.contains("has 2 addressable devices"), "{m}")
        }
        other => panic!("expected a device error, got {other:?}"),
    }
}

#[test]
fn bad_meshes_and_shardings_are_refused_at_load() {
    let ok = [vec![vec![], vec![]], vec![vec![], vec![0]], vec![vec![0], vec![]], vec![vec![], vec![]]];
    let text = ["{}, {}", "{}, {\"x\"}", "{\"x\"}, {}", "{}, {}"];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (mlp_artifact(3, vec![], text, ok.clone()), "dim 1 (size 32) is not divisible into 3 pieces"),
        (mlp_artifact(2, vec![0, 0], text, ok.clone()), "the mesh of 2 devices lists 2 device ids"),
        (
            mlp_artifact(2, vec![], text, [vec![vec![1], vec![]], ok[1].clone(), ok[2].clone(), ok[3].clone()]),
            "mesh axis 1 does not exist",
        ),
        (
            mlp_artifact(2, vec![], text, [vec![vec![]], ok[1].clone(), ok[2].clone(), ok[3].clone()]),
            "sharding of rank 1 for rank 2",
        ),
    ];
    for (artifact, want) in cases {
        match Program::from_bytes(&artifact) {
            Err(e) => assert!(e.to_string().contains(want), "`{e}` lacks `{want}`"),
            Ok(_) => panic!("loaded an artifact that should fail with `{want}`"),
        }
    }
}

/// CI must provide the plugins, but they exist only for x86-64 Linux: the
/// aarch64 step (`.ci/aarch64.sh`, under qemu) has none and skips.
fn plugins_required() -> bool {
    std::env::var_os("CI").is_some() && cfg!(target_arch = "x86_64")
}
