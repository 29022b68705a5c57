//! Quantized linear layers in PJRT segments (`--target pjrt --quantize`, and
//! imported quantized programs): the weights reach the device as integers
//! and the segment computes what the CPU kernels compute — the same bits
//! where activations are quantized to int8 (the products are exact in i32,
//! the scaling is the same three f32 operations), the same real numbers
//! summed in another order for weight-only layers. Needs
//! `KILN_TEST_XLA_CPU_PLUGIN`; skips without it (fails under CI).
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_graph_for, Backend, CompileOptions};
use kiln_ir::{ConstBytes, DType, Graph, Op, TensorType, UnaryOp};
use kiln_passes::{QuantScheme, QuantizeConfig};
use kiln_runtime::format::Metadata;
use kiln_runtime::{Program, Tensor};
use stablehlo_support::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// x[6, 64] → linear(64 → 48, bias) → relu → linear(48 → 16): relu is exact
/// on both sides, so any difference comes from the quantized layers.
fn two_layers() -> Graph {
    layers(true)
}

/// [`two_layers`], the first layer with or without its bias.
fn layers(bias: bool) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[6, 64]));
    g.values[x].attrs.origin = Some("x".into());
    let mut weight = |name: &str, shape: &[i64], seed: u64| {
        let n: i64 = shape.iter().product();
        let t = random_f32(&[n as usize], seed, -0.5, 0.5);
        let v = g.add_const(None, TensorType::fixed(DType::F32, shape), ConstBytes::owned(t.data.clone()));
        g.values[v].attrs.origin = Some(name.into());
        v
    };
    let (w1, b1, w2) =
        (weight("fc1.weight", &[48, 64], 1), weight("fc1.bias", &[48], 2), weight("fc2.weight", &[16, 48], 3));
    let f32_ty = |s: &[i64]| TensorType::fixed(DType::F32, s);
    let first = if bias { vec![x, w1, b1] } else { vec![x, w1] };
    let h = g.push(Op::Linear, first, f32_ty(&[6, 48]), None);
    let h = g.push(Op::Unary(UnaryOp::Relu), vec![h], f32_ty(&[6, 48]), None);
    let y = g.push(Op::Linear, vec![h, w2], f32_ty(&[6, 16]), None);
    g.add_output("y", y);
    g
}

fn compile_quantized(g: Graph, mode: &str, calibration: Option<PathBuf>, backend: Backend) -> Arc<Program> {
    let scheme = QuantScheme::parse(mode).unwrap_or_else(|e| panic!("{mode}: {e}"));
    let opts = CompileOptions { quantize: Some(QuantizeConfig::new(scheme)), calibration, ..CompileOptions::default() };
    let (writer, _) =
        compile_graph_for(g, &opts, backend, Metadata::default()).unwrap_or_else(|e| panic!("{mode}: {e}"));
    Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("{mode}: load: {e}"))
}

/// The segment's text: one segment, whose weights are integer arguments.
fn segment_text(program: &Program, what: &str) -> String {
    let accel = accel(program);
    assert_eq!(accel.segments.len(), 1, "{what}: one segment (nothing left on the CPU)");
    accel.segments[0].mlir.clone()
}

/// Calibration samples for `two_layers` (`sample_<k>/input_0.npy`).
fn calibration_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-quant-pjrt-calib-{}", std::process::id()));
    for k in 0..4 {
        let sample = dir.join(format!("sample_{k}"));
        std::fs::create_dir_all(&sample).expect("calibration dir");
        write_npy_f32(&sample.join("input_0.npy"), &random_f32(&[6, 64], 100 + k, -2.0, 2.0), &[6, 64]);
    }
    dir
}

fn write_npy_f32(path: &Path, t: &Tensor, shape: &[usize]) {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}", dims.join(", "));
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&t.data);
    std::fs::write(path, bytes).expect("write npy");
}

fn inputs(seed: u64) -> Vec<Tensor> {
    // Inputs wider than the calibration range too: static layers clamp.
    vec![random_f32(&[6, 64], seed, -3.0, 2.0)]
}

/// Without biases, every int8-activation mode gives the CPU kernel's bits;
/// with one, XLA:CPU adds it in a fused multiply-add (one rounding fewer),
/// an ulp at most from the CPU, and the next layer's dynamic row scales
/// see that ulp.
#[test]
fn int8_activations_give_the_cpu_kernels_bits() {
    let Some(plugin) = plugin() else { return };
    let calib = calibration_dir();
    for (mode, calibration) in [
        ("int8-dynamic", None),
        ("int8-dynamic:sym", None),
        ("int8-static:observer=minmax", Some(calib.clone())),
        ("int8-dynamic", Some(calib.clone())),
    ] {
        for bias in [false, true] {
            let what = format!("{mode} (calibrated: {}, bias: {bias})", calibration.is_some());
            let cpu = compile_quantized(layers(bias), mode, calibration.clone(), Backend::Cpu);
            let device = compile_quantized(layers(bias), mode, calibration.clone(), pjrt(Precision::F32));
            let text = segment_text(&device, &what);
            assert!(
                text.contains("tensor<48x64xi8>") && text.contains("tensor<16x48xi8>"),
                "{what}: i8 weights\n{text}"
            );
            assert!(text.contains("xi32>"), "{what}: an i32 product\n{text}");
            for seed in 0..3 {
                let x = inputs(seed);
                let (want, got) = (run_cpu(&cpu, &x), run_pjrt(&device, &plugin, &x));
                if bias {
                    assert_close(&format!("{what}, input {seed}"), &got[0], &want[0], 5e-7, 1e-7);
                } else {
                    assert_eq!(got[0].data, want[0].data, "{what}, input {seed}: not the CPU kernel's bits");
                }
            }
        }
    }
    std::fs::remove_dir_all(&calib).ok();
}

#[test]
fn weight_only_layers_match_the_cpu_kernels() {
    let Some(plugin) = plugin() else { return };
    for (mode, weight_type) in [
        ("int8-weight", "tensor<48x64xi8>"),
        // Two int4 values a byte, unpacked in the segment.
        ("int4-weight:group=32", "tensor<48x32xui8>"),
        ("int4-weight:group=32:asym", "tensor<48x32xui8>"),
    ] {
        let cpu = compile_quantized(two_layers(), mode, None, Backend::Cpu);
        let device = compile_quantized(two_layers(), mode, None, pjrt(Precision::F32));
        let text = segment_text(&device, mode);
        assert!(text.contains(weight_type), "{mode}: integer weights\n{text}");
        for seed in 0..3 {
            let x = inputs(seed);
            let (want, got) = (run_cpu(&cpu, &x), run_pjrt(&device, &plugin, &x));
            assert_close(&format!("{mode}, input {seed}"), &got[0], &want[0], 1e-5, 1e-6);
        }
    }
}

/// bf16 segments keep the integer weights and the f32 scales and bias.
#[test]
fn bf16_segments_keep_the_quantized_parameters() {
    let Some(plugin) = plugin() else { return };
    let cpu = compile_quantized(two_layers(), "int8-dynamic", None, Backend::Cpu);
    let device = compile_quantized(two_layers(), "int8-dynamic", None, pjrt(Precision::Bf16));
    let text = segment_text(&device, "bf16");
    assert!(text.contains("tensor<48x64xi8>") && text.contains("tensor<48x1xf32>"), "{text}");
    let x = inputs(7);
    let (want, got) = (run_cpu(&cpu, &x), run_pjrt(&device, &plugin, &x));
    // The activations between the layers are carried as bf16.
    assert_close_norm("int8-dynamic in a bf16 segment", &got[0], &want[0], 2e-2);
}

/// Imported quantized programs (PT2E, torchao) and kiln-quantized fixtures
/// on the plugin against the CPU: gelu's erf differs by ulps between XLA
/// and kiln, which may flip the rounding of a few activations downstream,
/// so these compare by cosine and a bound of a few quantization steps.
#[test]
fn quantized_programs_run_on_the_plugin() {
    let Some(plugin) = plugin() else { return };
    let mut cases: Vec<(String, PathBuf, Option<QuantizeConfig>)> = Vec::new();
    for case in [
        "pt2e_x86_static",
        "pt2e_x86_dynamic",
        "pt2e_xnnpack_static",
        "ao_int8_weight",
        "ao_int4_g32",
        "ao_da8w8",
        "ao_da8w8_tokens",
    ] {
        let dir = fixture_dir(&format!("quant/{case}"));
        for flavour in ["training", "decomp"] {
            let pt2 = dir.join(format!("{flavour}.pt2"));
            if pt2.exists() {
                cases.push((format!("{case}/{flavour}"), pt2, None));
            }
        }
    }
    for mode in ["int8-weight", "int8-dynamic", "int4-weight"] {
        let pt2 = fixture_dir("quant/mlp_float").join("training.pt2");
        cases.push((
            format!("mlp_float --quantize {mode}"),
            pt2,
            Some(QuantizeConfig::new(QuantScheme::parse(mode).unwrap())),
        ));
    }
    for (what, pt2, quantize) in cases {
        let dir = pt2.parent().map(Path::to_path_buf).unwrap_or_default();
        let compile = |backend: Backend| {
            let graph = import_pt2(&pt2).unwrap_or_else(|e| panic!("{what}: {e}")).graph;
            let opts = CompileOptions { quantize: quantize.clone(), ..CompileOptions::default() };
            let (writer, _) =
                compile_graph_for(graph, &opts, backend, Metadata::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
            Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("{what}: {e}"))
        };
        let (cpu, device) = (compile(Backend::Cpu), compile(pjrt(Precision::F32)));
        let text = segment_text(&device, &what);
        assert!(text.contains("xi8>") || text.contains("xui8>"), "{what}: integer weights on the device\n{text}");
        let x = read_numbered(&dir, "input");
        let (want, got) = (run_cpu(&cpu, &x), run_pjrt(&device, &plugin, &x));
        assert_close_norm(&what, &got[0], &want[0], 1e-3);
    }
}

/// x[2, 3, 9, 9] → conv(3 → 8, 3×3, stride 2, padding 1 [, bias]) → relu →
/// conv(8 → 4, 3×3, padding 1): quantized convolutions in a segment.
fn conv_layers(bias: bool) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 9, 9]));
    let mut weight = |name: &str, shape: &[i64], seed: u64| {
        let n: i64 = shape.iter().product();
        let t = random_f32(&[n as usize], seed, -0.5, 0.5);
        let v = g.add_const(None, TensorType::fixed(DType::F32, shape), ConstBytes::owned(t.data.clone()));
        g.values[v].attrs.origin = Some(name.into());
        v
    };
    let (w1, b1, w2) = (
        weight("conv1.weight", &[8, 3, 3, 3], 4),
        weight("conv1.bias", &[8], 5),
        weight("conv2.weight", &[4, 8, 3, 3], 6),
    );
    let conv = |stride: i64| Op::Conv { stride: vec![stride; 2], padding: vec![1, 1], dilation: vec![1, 1], groups: 1 };
    let f32_ty = |s: &[i64]| TensorType::fixed(DType::F32, s);
    let first = if bias { vec![x, w1, b1] } else { vec![x, w1] };
    let h = g.push(conv(2), first, f32_ty(&[2, 8, 5, 5]), None);
    let h = g.push(Op::Unary(UnaryOp::Relu), vec![h], f32_ty(&[2, 8, 5, 5]), None);
    let y = g.push(conv(1), vec![h, w2], f32_ty(&[2, 4, 5, 5]), None);
    g.add_output("y", y);
    g
}

/// Convolutions with int8 activations gather their windows on the device
/// and give the CPU kernel's bits (without a bias; with one, XLA's fused
/// multiply-add moves an ulp); weight-only ones run the f32 convolution of
/// the dequantized weight (another summation order).
#[test]
fn quantized_convolutions_match_the_cpu_kernels() {
    let Some(plugin) = plugin() else { return };
    let calib = std::env::temp_dir().join(format!("kiln-quant-conv-calib-{}", std::process::id()));
    for k in 0..3 {
        let sample = calib.join(format!("sample_{k}"));
        std::fs::create_dir_all(&sample).expect("calibration dir");
        write_npy_f32(&sample.join("input_0.npy"), &random_f32(&[2 * 3 * 81], 200 + k, -2.0, 2.0), &[2, 3, 9, 9]);
    }
    let x = |seed: u64| vec![random_f32(&[2, 3, 9, 9], seed, -3.0, 2.0)];
    for (mode, calibration) in [
        ("int8-dynamic", None),
        ("int8-dynamic:sym", None),
        ("int8-static", Some(calib.clone())),
        ("int8-weight", None),
    ] {
        for bias in [false, true] {
            let what = format!("{mode} (bias: {bias})");
            let cpu = compile_quantized(conv_layers(bias), mode, calibration.clone(), Backend::Cpu);
            let device = compile_quantized(conv_layers(bias), mode, calibration.clone(), pjrt(Precision::F32));
            assert_eq!(cpu.kernel_counts().iter().find(|(k, _)| k == "quant_conv").map(|(_, c)| *c), Some(2), "{what}");
            let text = segment_text(&device, &what);
            assert!(
                text.contains("tensor<8x3x3x3xi8>") && text.contains("tensor<4x8x3x3xi8>"),
                "{what}: i8 weights\n{text}"
            );
            for seed in 0..2 {
                let (want, got) = (run_cpu(&cpu, &x(seed)), run_pjrt(&device, &plugin, &x(seed)));
                if mode == "int8-weight" || bias {
                    assert_close(&format!("{what}, input {seed}"), &got[0], &want[0], 1e-5, 1e-5);
                } else {
                    assert_eq!(got[0].data, want[0].data, "{what}, input {seed}: not the CPU kernel's bits");
                }
            }
        }
    }
    std::fs::remove_dir_all(&calib).ok();
}

/// The shrunk ResNet-18, MobileNetV2 (depthwise convolutions keep f32
/// activations), BERT and Llama fixtures quantized for the plugin, against
/// the CPU.
#[test]
fn quantized_models_run_on_the_plugin() {
    let Some(plugin) = plugin() else { return };
    for model in ["resnet18", "mobilenet_v2", "bert", "llama"] {
        let dir = fixture_dir(&format!("models/{model}"));
        for mode in ["int8-dynamic", "int8-weight"] {
            let what = format!("{model} --quantize {mode}");
            let compile = |backend: Backend| {
                let graph = import_pt2(&dir.join("aten.pt2")).unwrap_or_else(|e| panic!("{what}: {e}")).graph;
                let opts = CompileOptions {
                    quantize: Some(QuantizeConfig::new(QuantScheme::parse(mode).unwrap())),
                    ..CompileOptions::default()
                };
                let (writer, _) = compile_graph_for(graph, &opts, backend, Metadata::default())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                Program::from_bytes(&writer.to_bytes()).unwrap_or_else(|e| panic!("{what}: {e}"))
            };
            let (cpu, device) = (compile(Backend::Cpu), compile(pjrt(Precision::F32)));
            let text = segment_text(&device, &what);
            assert!(text.contains("xi8>"), "{what}: integer weights\n{text}");
            if model == "resnet18" || model == "mobilenet_v2" {
                assert!(text.contains("x3x3xi8>"), "{what}: integer convolution weights\n{text}");
                // Weight-only and depthwise layers run f32 convolutions;
                // int8 activations gather windows.
                let float_convs = mode == "int8-weight" || model == "mobilenet_v2";
                assert_eq!(text.contains("stablehlo.convolution"), float_convs, "{what}\n{text}");
            }
            let x = read_numbered(&dir, "input");
            let (want, got) = (run_cpu(&cpu, &x), run_pjrt(&device, &plugin, &x));
            assert_close_norm(&what, &got[0], &want[0], 1e-3);
        }
    }
}
