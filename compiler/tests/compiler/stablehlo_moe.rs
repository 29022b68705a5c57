//! Mixture-of-experts programs wholly on the XLA CPU plugin: the grouped
//! GEMM of the experts and the router's sort, scatter (histc) and index_put
//! lower to StableHLO, so the Qwen3-MoE and Mixtral fixtures are one segment
//! with no CPU instruction; each op checked against the CPU plan on edge
//! cases. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::Backend;
use kiln_runtime::{DType, Tensor};
use stablehlo_support::*;

/// The real-model tolerance (tests/tests/e2e/real_models.rs).
const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

#[test]
fn moe_fixtures_run_entirely_on_the_plugin() {
    for name in ["models/qwen3_moe", "models/mixtral", "models/qwen3_moe_batch"] {
        for flavour in ["training", "aten"] {
            let what = format!("{name}/{flavour}");
            let dir = fixture_dir(name);
            let graph = import_pt2(&dir.join(format!("{flavour}.pt2"))).unwrap_or_else(|e| panic!("{what}: {e}")).graph;
            let program = compile(graph.clone(), pjrt(Precision::F32));
            let accel = accel(&program);
            assert!(accel.cpu_fallbacks.is_empty(), "{what}: CPU instructions remain: {:?}", accel.cpu_fallbacks);
            assert_eq!(accel.segments.len(), 1, "{what}: one segment");
            let ops = &accel.segments[0].ops;
            for op in ["grouped_matmul", "sort", "scatter_elements", "index_put"] {
                assert!(ops.iter().any(|o| o == op), "{what}: no {op} in the segment: {ops:?}");
            }
            let Some(plugin) = plugin() else { continue };
            let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
            let got = run_pjrt(&program, &plugin, &inputs);
            let cpu = run_cpu(&compile(graph, Backend::Cpu), &inputs);
            assert_eq!(got.len(), expected.len(), "{what}: outputs");
            for (i, ((g, w), c)) in got.iter().zip(&expected).zip(&cpu).enumerate() {
                assert_close(&format!("{what} output {i} vs PyTorch"), g, w, RTOL, ATOL);
                assert_close(&format!("{what} output {i} vs the CPU plan"), g, c, RTOL, ATOL);
            }
        }
    }
}

/// bf16 segments: the experts, router and attention in bf16 with f32
/// accumulation (histc's counts are carried as bf16 there: exact up to 256
/// tokens per expert). Checked by relative L2 error, as the other bf16 runs.
#[test]
fn moe_fixtures_in_bf16() {
    let Some(plugin) = plugin() else { return };
    for name in ["models/qwen3_moe", "models/mixtral", "models/qwen3_moe_batch"] {
        let dir = fixture_dir(name);
        let graph = import_pt2(&dir.join("training.pt2")).unwrap_or_else(|e| panic!("{name}: {e}")).graph;
        let program = compile(graph, pjrt(Precision::Bf16));
        assert!(accel(&program).cpu_fallbacks.is_empty(), "{name}: {:?}", accel(&program).cpu_fallbacks);
        let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
        let got = run_pjrt(&program, &plugin, &inputs);
        assert_close_norm(&format!("{name} bf16"), &got[0], &expected[0], 3e-2);
    }
}

/// Runs the graph text on the plugin and on the CPU; returns both outputs.
fn both(text: &str, inputs: &[Tensor]) -> Option<(Vec<Tensor>, Vec<Tensor>)> {
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let program = compile(g.clone(), pjrt(Precision::F32));
    let accel = accel(&program);
    assert!(accel.cpu_fallbacks.is_empty(), "CPU instructions: {:?}\n{text}", accel.cpu_fallbacks);
    let plugin = plugin()?;
    let cpu = run_cpu(&compile(g, Backend::Cpu), inputs);
    Some((run_pjrt(&program, &plugin, inputs), cpu))
}

/// Small integers: every product and sum is exact in f32, so the device and
/// the CPU kernel must agree bit for bit whatever their summation order.
fn ints(shape: &[usize], seed: u64) -> Tensor {
    let t = random_f32(shape, seed, -4.0, 5.0);
    let v: Vec<f32> = values(&t).iter().map(|x| x.floor() as f32).collect();
    Tensor::from_f32(shape, &v)
}

fn offsets_i32(v: &[i32]) -> Tensor {
    Tensor { dtype: DType::I32, shape: vec![v.len()], data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

#[test]
fn grouped_matmul_matches_the_cpu_kernel() {
    let text = |off: &str| {
        format!(
            "graph {{
  input %0 \"x\": f32[7, 5]
  input %1 \"w\": f32[3, 5, 4]
  input %2 \"offs\": {off}[3]
  %3: f32[7, 4] = grouped_matmul(%0, %1, %2)
  output %3 \"y\"
}}"
        )
    };
    let (x, w) = (ints(&[7, 5], 1), ints(&[3, 5, 4], 2));
    // An empty expert, rows past the last offset, every row one expert,
    // no row at all, each expert a block.
    for offs in [[2, 2, 5], [0, 0, 7], [7, 7, 7], [0, 0, 0], [1, 3, 6]] {
        for (dt, o) in [("i64", Tensor::from_i64(&[3], &offs.map(i64::from))), ("i32", offsets_i32(&offs))] {
            let Some((got, cpu)) = both(&text(dt), &[x.clone(), w.clone(), o]) else { return };
            assert_eq!(got[0].data, cpu[0].data, "offsets {offs:?} ({dt})");
            // Rows past the last offset are zero, and the others are not all zero.
            let y = values(&got[0]);
            assert!(y[offs[2] as usize * 4..].iter().all(|&v| v == 0.0), "{offs:?}: {y:?}");
            if offs[2] > 0 {
                assert!(y[..offs[2] as usize * 4].iter().any(|&v| v != 0.0), "{offs:?}: {y:?}");
            }
        }
    }
    // Fractional values: XLA's GEMM and kiln's may sum in different orders.
    let (x, w) = (random_f32(&[7, 5], 3, -1.0, 1.0), random_f32(&[3, 5, 4], 4, -1.0, 1.0));
    let offs = Tensor::from_i64(&[3], &[3, 4, 6]);
    let Some((got, cpu)) = both(&text("i64"), &[x, w, offs]) else { return };
    assert_close("fractional", &got[0], &cpu[0], 1e-6, 1e-6);
}

#[test]
fn sort_and_topk_order_as_the_cpu_kernel() {
    let nan = f32::NAN;
    // Ties (stable), NaN (largest), signed zeros (equal).
    let x = Tensor::from_f32(&[2, 6], &[3.0, 1.0, nan, 1.0, -0.0, 0.0, 2.0, -1.0, 2.0, nan, 5.0, -1.0]);
    for descending in [false, true] {
        for (k, axis) in [(6, 1), (2, 1), (1, 0), (2, 0)] {
            let shape = if axis == 1 { format!("[2, {k}]") } else { format!("[{k}, 6]") };
            let text = format!(
                "graph {{
  input %0 \"x\": f32[2, 6]
  %1: f32{shape} = sort{{axis={axis}, k={k}, descending={descending}, indices=false}}(%0)
  %2: i64{shape} = sort{{axis={axis}, k={k}, descending={descending}, indices=true}}(%0)
  output %1 \"values\"
  output %2 \"indices\"
}}"
            );
            let Some((got, cpu)) = both(&text, std::slice::from_ref(&x)) else { return };
            let what = format!("descending={descending} k={k} axis={axis}");
            assert_eq!(got[1].data, cpu[1].data, "{what}: indices {:?} vs {:?}", values(&got[1]), values(&cpu[1]));
            assert_eq!(got[0].data, cpu[0].data, "{what}: values {:?} vs {:?}", values(&got[0]), values(&cpu[0]));
        }
    }
    // Integers.
    let text = "graph {
  input %0 \"x\": i64[7]
  %1: i64[7] = sort{axis=0, k=7, descending=true, indices=true}(%0)
  output %1 \"indices\"
}";
    let Some((got, cpu)) = both(text, &[Tensor::from_i64(&[7], &[3, -1, 3, 7, 0, -1, 7])]) else { return };
    assert_eq!(got[0].data, cpu[0].data, "{:?} vs {:?}", values(&got[0]), values(&cpu[0]));
}

#[test]
fn scatter_elements_matches_the_cpu_kernel() {
    let data = ints(&[3, 4], 5);
    let src = ints(&[3, 5], 6);
    // Repeated targets, a negative index.
    let index = Tensor::from_i64(&[2, 3], &[0, 2, 2, 3, 3, -1]);
    for (reduce, include_self) in
        [("sum", true), ("sum", false), ("prod", true), ("max", false), ("min", true), ("min", false)]
    {
        let text = format!(
            "graph {{
  input %0 \"data\": f32[3, 4]
  input %1 \"index\": i64[2, 3]
  input %2 \"src\": f32[3, 5]
  %3: f32[3, 4] = scatter_elements{{axis=1, reduce={reduce}, include_self={include_self}}}(%0, %1, %2)
  output %3 \"y\"
}}"
        );
        let Some((got, cpu)) = both(&text, &[data.clone(), index.clone(), src.clone()]) else { return };
        assert_eq!(got[0].data, cpu[0].data, "{reduce} include_self={include_self}");
    }
}

/// `scatter_reduce(mean)` has no lowering: it stays on the CPU, with the reason.
#[test]
fn scatter_mean_stays_on_the_cpu() {
    let text = "graph {
  input %0 \"data\": f32[4]
  input %1 \"index\": i64[3]
  input %2 \"src\": f32[3]
  %3: f32[4] = scatter_elements{axis=0, reduce=mean, include_self=true}(%0, %1, %2)
  output %3 \"y\"
}";
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let accel = accel(&compile(g, pjrt(Precision::F32)));
    let reasons: Vec<&str> = accel.cpu_fallbacks.iter().map(|f| f.reason.as_str()).collect();
    assert!(reasons.iter().any(|r| r.contains("scatter_reduce mean")), "{reasons:?}");
}
