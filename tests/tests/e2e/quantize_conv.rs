//! `kiln compile --quantize` on convolutional networks (the shrunk ResNet-18,
//! MobileNetV2 and EfficientNet-B0 fixtures): every convolution becomes a
//! `quant_conv` with int8 weights (BatchNorm folded in first), dense ones
//! with int8 activations in the int8-dynamic and int8-static modes; outputs
//! stay close to the float program's, the weights shrink to about a
//! quarter, and the integer kernels give the same bytes at any thread count;
//! int8 between layers (handoffs, residual adds, max pools) is checked
//! against torch's own fake-quant on a small CNN (`quant/cnn_static`).

use kiln_compiler::{compile_file, CompileOptions, CompileSummary};
use kiln_passes::{QuantScheme, QuantizeConfig};
use kiln_runtime::{Program, SessionOptions, Tensor, TensorView};
use kiln_tests::{fixture_dir, read_numbered, temp_path};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MODELS: [&str; 3] = ["resnet18", "mobilenet_v2", "efficientnet_b0"];

fn compile(
    model: &str,
    flavour: &str,
    mode: Option<&str>,
    calibration: Option<PathBuf>,
) -> (Arc<Program>, CompileSummary) {
    let src = fixture_dir(&format!("models/{model}")).join(format!("{flavour}.pt2"));
    let tmp = temp_path("quantize_conv");
    let quantize = mode.map(|m| QuantizeConfig::new(QuantScheme::parse(m).expect("mode")));
    let opts = CompileOptions { quantize, calibration, ..CompileOptions::default() };
    let summary = compile_file(&src, &tmp, &opts).unwrap_or_else(|e| panic!("{model}/{flavour} {mode:?}: {e}"));
    let program = Program::load(&tmp).expect("load");
    std::fs::remove_file(&tmp).ok();
    (program, summary)
}

fn run_with(p: &Arc<Program>, inputs: &[Tensor], threads: usize) -> Vec<f32> {
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let out =
        p.session_with(&SessionOptions::with_threads(threads)).expect("session").run(&views).expect("run").to_tensors();
    out[0].data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn count(p: &Program, kernel: &str) -> usize {
    p.kernel_counts().into_iter().find(|(k, _)| k == kernel).map_or(0, |(_, c)| c)
}

/// A little-endian f32 `.npy` file.
fn write_npy(path: &Path, shape: &[usize], data: &[f32]) {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(path, bytes).expect("write npy");
}

/// Calibration samples: the fixture's input and three of its perturbations.
pub(crate) fn calibration_dir(model: &str) -> PathBuf {
    let input = read_numbered(&fixture_dir(&format!("models/{model}")), "input").remove(0);
    let x: Vec<f32> = input.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let dir = temp_path(&format!("calib_{model}"));
    for s in 0..4 {
        let sample = dir.join(format!("sample_{s}"));
        std::fs::create_dir_all(&sample).expect("mkdir");
        let v: Vec<f32> =
            x.iter().enumerate().map(|(i, &v)| v * (1.0 - 0.1 * s as f32) + ((i * 7 + s) % 13) as f32 * 0.01).collect();
        write_npy(&sample.join("input_0.npy"), &input.shape, &v);
    }
    dir
}

#[test]
fn every_int8_mode_quantizes_every_convolution() {
    for model in MODELS {
        let inputs = read_numbered(&fixture_dir(&format!("models/{model}")), "input");
        let (float, _) = compile(model, "aten", None, None);
        let want = run_with(&float, &inputs, 1);
        let convs = count(&float, "conv_fused") + count(&float, "conv");
        assert!(convs > 10, "{model}: {convs} convolutions in the float program");
        let calib = calibration_dir(model);
        for (mode, bound) in [
            ("int8-weight", 0.9999),
            ("int8-dynamic", 0.999),
            ("int8-dynamic:sym", 0.999),
            ("int8-static", 0.99),
            ("int4-weight", 0.99),
        ] {
            let calibration = (mode == "int8-static").then(|| calib.clone());
            let (p, summary) = compile(model, "aten", Some(mode), calibration);
            let got = run_with(&p, &inputs, 1);
            let c = cosine(&got, &want);
            assert!(c >= bound, "{model} {mode}: cosine {c} vs float");
            assert!(got.iter().zip(&want).any(|(a, b)| a != b), "{model} {mode}: the float output, bit for bit");
            // Every convolution is quantized (BatchNorm folded in first:
            // the float program's convolutions, one for one).
            assert_eq!(count(&p, "quant_conv"), convs, "{model} {mode}: quantized convolutions");
            assert_eq!(count(&p, "conv") + count(&p, "conv_fused") + count(&p, "batch_norm"), 0, "{model} {mode}");
            // Activations and residual adds run in the convolutions' epilogues, as in f32.
            for k in ["relu", "clamp", "add"] {
                assert_eq!(count(&p, k), count(&float, k), "{model} {mode}: separate `{k}` kernels");
            }
            if model == "resnet18" && mode.starts_with("int8-") && mode != "int8-weight" {
                // The integer stem runs channels-last and so does the max
                // pool after it: one permute, of the model's input.
                assert_eq!(count(&p, "permute"), 1, "{model} {mode}: permutes");
            }
            let conv_reports: Vec<_> = summary.quantized.iter().filter(|l| l.bits == Some(8)).collect();
            assert!(conv_reports.len() >= convs, "{model} {mode}: {} int8 layers reported", conv_reports.len());
            // Weights a quarter of f32's, plus the f32 scales and biases (one
            // each per channel: a larger share in these shrunk networks'
            // narrow layers than at full size) and 64-byte alignment.
            let (fb, qb) = (float.weights_bytes(), p.weights_bytes());
            assert!(qb * 100 < fb * 35, "{model} {mode}: {qb} weight bytes for {fb} in f32");
        }
        std::fs::remove_dir_all(&calib).ok();
    }
}

#[test]
fn grouped_convolutions_keep_f32_activations_and_say_so() {
    let (p, summary) = compile("mobilenet_v2", "aten", Some("int8-dynamic"), None);
    let depthwise: Vec<_> = summary.quantized.iter().filter(|l| l.note.contains("groups")).collect();
    // MobileNetV2's 17 depthwise convolutions.
    assert_eq!(depthwise.len(), 17, "{:?}", summary.quantized.iter().map(|l| &l.note).collect::<Vec<_>>());
    assert!(depthwise.iter().all(|l| l.bits == Some(8) && l.note.contains("f32 activations")));
    assert!(count(&p, "quant_conv") > 17);
}

#[test]
fn integer_convolutions_give_the_same_bytes_at_any_thread_count() {
    let inputs = read_numbered(&fixture_dir("models/resnet18"), "input");
    let calib = calibration_dir("resnet18");
    for (mode, calibration) in [("int8-dynamic", None), ("int8-static", Some(calib.clone()))] {
        let (p, _) = compile("resnet18", "training", Some(mode), calibration);
        let one = run_with(&p, &inputs, 1);
        for threads in [2, 3, 4] {
            let got = run_with(&p, &inputs, threads);
            assert!(one.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{mode}: {threads} threads differ");
        }
    }
    std::fs::remove_dir_all(&calib).ok();
}

/// `models/{model}` (Core ATen) compiled int8-static with the calibration
/// samples in `calib`, int8 depthwise convolutions on or off, the passes
/// named in `skip` left out.
fn int8_static(model: &str, calib: &Path, int8_depthwise: bool, skip: Vec<&'static str>) -> Arc<Program> {
    let src = fixture_dir(&format!("models/{model}")).join("aten.pt2");
    let tmp = temp_path(&format!("int8-static-{model}"));
    let cfg =
        QuantizeConfig { int8_depthwise, ..QuantizeConfig::new(QuantScheme::parse("int8-static").expect("mode")) };
    let opts = CompileOptions {
        quantize: Some(cfg),
        calibration: Some(calib.to_path_buf()),
        skip_passes: skip,
        ..Default::default()
    };
    compile_file(&src, &tmp, &opts).unwrap_or_else(|e| panic!("{model} int8-static: {e}"));
    let program = Program::load(&tmp).expect("load");
    std::fs::remove_file(&tmp).ok();
    program
}

/// int8 activations between layers (the `quant_acts` pass): in the
/// int8-static ResNet-18 each block's first convolution hands its result
/// to the second as i8 (quantized in its tile store with the second's
/// calibrated parameters); in MobileNetV2 with int8 depthwise convolutions
/// (`QuantizeConfig::int8_depthwise`) the expansion hands its result to the
/// depthwise one and that to the projection, and a projection with a
/// residual (f32) hands its sum to the next expansion. The program gives
/// the bytes it gives with the f32 handoff (the pass left out; both
/// without `quant_residuals`, which changes numbers), at 1 to 4 threads.
#[test]
fn int8_activations_between_layers_give_the_float_handoffs_bytes() {
    use kiln_runtime::format::{InstrOp, Kernel};
    for (model, int8_depthwise, handoffs) in [("resnet18", false, 11), ("mobilenet_v2", true, 40)] {
        let inputs = read_numbered(&fixture_dir(&format!("models/{model}")), "input");
        let calib = calibration_dir(model);
        let build = |skip| int8_static(model, &calib, int8_depthwise, skip);
        let (int8, float) = (build(vec!["quant_residuals"]), build(vec!["quant_acts", "quant_residuals"]));
        let i8_outputs = |p: &Program| {
            let plan = p.plan();
            plan.instrs
                .iter()
                .filter(|i| match &i.op {
                    InstrOp::Call(Kernel::QuantConv { out_scale, .. }) => {
                        let dtype = plan.tensors[i.outputs[0] as usize].dtype;
                        assert_eq!(out_scale.is_some(), dtype == kiln_runtime::DType::I8, "i8 iff its parameters");
                        out_scale.is_some()
                    }
                    _ => false,
                })
                .count()
        };
        assert_eq!(i8_outputs(&int8), handoffs, "{model}: int8 handoffs");
        assert_eq!(i8_outputs(&float), 0);
        assert_eq!(count(&int8, "quant_conv"), count(&float, "quant_conv"));
        let want = run_with(&float, &inputs, 1);
        for threads in 1..=4 {
            let got = run_with(&int8, &inputs, threads);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{model}: {threads} threads");
        }
        std::fs::remove_dir_all(&calib).ok();
    }
}

/// int8 residual adds (the `quant_residuals` pass): in int8-static
/// ResNet-18 the stem's result goes through the max pool as i8 and every
/// block's sum is quantized in its second convolution's store when the
/// next block reads it, its residual read as i8 (torch's int8 add); in
/// MobileNetV2 the inverted residuals' sums likewise. The output stays
/// within the int8-static bound of the float program (cosine 0.99) and
/// close to the f32-residual program, and is the same bytes at 1 to 4
/// threads.
#[test]
fn int8_residual_adds_stay_close_to_float() {
    use kiln_runtime::format::{InstrOp, Kernel};
    for (model, residual_reads, i8_results) in [("resnet18", 5, 16), ("mobilenet_v2", 11, 51)] {
        let inputs = read_numbered(&fixture_dir(&format!("models/{model}")), "input");
        let calib = calibration_dir(model);
        let build = |skip| int8_static(model, &calib, true, skip);
        let (int8, f32_residuals) = (build(vec![]), build(vec!["quant_residuals"]));
        let plan = int8.plan();
        let i8_residuals = plan
            .instrs
            .iter()
            .filter(|i| matches!(&i.op, InstrOp::Call(Kernel::QuantConv { res_scale: Some(_), .. })))
            .count();
        assert_eq!(i8_residuals, residual_reads, "{model}: i8 residual reads");
        let i8_convs = plan
            .instrs
            .iter()
            .filter(|i| matches!(&i.op, InstrOp::Call(Kernel::QuantConv { out_scale: Some(_), .. })))
            .count();
        assert_eq!(i8_convs, i8_results, "{model}: i8 results");
        let i8_pools = plan
            .instrs
            .iter()
            .filter(|i| matches!(&i.op, InstrOp::Call(Kernel::Pool { .. })))
            .filter(|i| plan.tensors[i.outputs[0] as usize].dtype == kiln_runtime::DType::I8)
            .count();
        assert_eq!(i8_pools, usize::from(model == "resnet18"), "{model}: i8 max pools");
        let (float, _) = compile(model, "aten", None, None);
        let want = run_with(&float, &inputs, 1);
        let got = run_with(&int8, &inputs, 1);
        let f32_res = run_with(&f32_residuals, &inputs, 1);
        let (c, c_f32_res) = (cosine(&got, &want), cosine(&f32_res, &want));
        assert!(c >= 0.99, "{model}: cosine {c} vs float (f32 residuals: {c_f32_res})");
        assert!(cosine(&got, &f32_res) >= 0.995, "{model}: int8 vs f32 residuals");
        assert!(got.iter().zip(&f32_res).any(|(a, b)| a != b), "{model}: the residuals' rounding changes the output");
        for threads in 2..=4 {
            let t = run_with(&int8, &inputs, threads);
            assert!(t.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{model}: {threads} threads");
        }
        std::fs::remove_dir_all(&calib).ok();
    }
}

/// int8-static MobileNetV2 with `int8_depthwise`: its 17 depthwise
/// convolutions take static int8 activations (the integer depthwise
/// kernel), say so, and the program stays within cosine 0.99 of float;
/// without it they keep f32 activations.
#[test]
fn depthwise_convolutions_take_static_int8_activations() {
    let inputs = read_numbered(&fixture_dir("models/mobilenet_v2"), "input");
    let calib = calibration_dir("mobilenet_v2");
    let (float, _) = compile("mobilenet_v2", "aten", None, None);
    let want = run_with(&float, &inputs, 1);
    for int8_depthwise in [false, true] {
        let src = fixture_dir("models/mobilenet_v2").join("aten.pt2");
        let tmp = temp_path("quant_dw");
        let cfg =
            QuantizeConfig { int8_depthwise, ..QuantizeConfig::new(QuantScheme::parse("int8-static").expect("mode")) };
        let opts = CompileOptions { quantize: Some(cfg), calibration: Some(calib.clone()), ..Default::default() };
        let summary = compile_file(&src, &tmp, &opts).expect("compile");
        let p = Program::load(&tmp).expect("load");
        std::fs::remove_file(&tmp).ok();
        let static_dw = summary.quantized.iter().filter(|l| l.note.contains("static int8 activations")).count();
        let float_dw = summary.quantized.iter().filter(|l| l.note.contains("f32 activations")).count();
        assert_eq!((static_dw, float_dw), if int8_depthwise { (17, 0) } else { (0, 17) }, "{int8_depthwise}");
        let c = cosine(&run_with(&p, &inputs, 1), &want);
        assert!(c >= 0.99, "int8_depthwise {int8_depthwise}: cosine {c} vs float");
    }
    std::fs::remove_dir_all(&calib).ok();
}

/// int8-static on a small CNN (`tests/fixtures/quant/generate_cnn_static.py`:
/// a stem and max pool, a MobileNetV2 inverted residual with a depthwise
/// layer, a ResNet basic block, a classifier) against torch's own static
/// fake-quant with the parameters torch's `MinMaxObserver` chooses on the
/// same calibration inputs. kiln's own observation chooses them to a few
/// ulps of the scale (it observes its own float program, whose sums differ
/// from torch's in the last bits); given torch's observed ranges it chooses
/// exactly them, runs the depthwise layer, both residual adds and the max
/// pool on int8 (what the fixture's fake-quant program rounds, kiln
/// rounds: the residuals quantized with their readers' parameters), and
/// the output matches torch's fake-quant program far closer than the float
/// one (the same integers everywhere, the float sums in another order);
/// the same bytes at 1 to 4 threads.
#[test]
fn int8_static_cnn_matches_torchs_fake_quant() {
    use kiln_runtime::format::{InstrOp, Kernel};
    let dir = fixture_dir("quant/cnn_static");
    let f32_of = |t: &Tensor| -> Vec<f32> {
        t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let npy_f32 = |name: &str| f32_of(&kiln_tests::read_npy_as(&dir.join(name), false).expect(name));
    let scales = npy_f32("act_scales.npy");
    let zps = kiln_tests::read_npy_as(&dir.join("act_zero_points.npy"), false).expect("zero points");
    let zps: Vec<i64> =
        zps.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    let torch: Vec<(f32, i64)> = scales.iter().copied().zip(zps.iter().copied()).collect();
    let want = f32_of(&read_numbered(&dir, "output").remove(0));
    let float = f32_of(&read_numbered(&dir, "float_output").remove(0));
    let inputs = read_numbered(&dir, "input");
    let build = |activations: Vec<kiln_passes::ActObservation>| {
        let tmp = temp_path("cnn_static");
        let cfg = QuantizeConfig {
            activations,
            ..QuantizeConfig::new(QuantScheme::parse("int8-static:observer=minmax").expect("mode"))
        };
        let opts = CompileOptions { quantize: Some(cfg), calibration: Some(dir.join("calib")), ..Default::default() };
        let summary = compile_file(&dir.join("aten.pt2"), &tmp, &opts).expect("compile");
        let p = Program::load(&tmp).expect("load");
        std::fs::remove_file(&tmp).ok();
        // (scale, uint8 zero point: kiln's int8 one + 128), layer by layer.
        let chosen: Vec<(f32, i64)> = summary
            .quantized
            .iter()
            .map(|l| l.act_qparams.map(|(s, z)| (s, z as i64 + 128)).expect("static"))
            .collect();
        let dw = summary.quantized.iter().filter(|l| l.note.contains("static int8 activations")).count();
        assert_eq!(dw, 1, "the depthwise layer takes static int8 activations");
        (p, chosen)
    };
    // kiln's own observation: torch's parameters to a few ulps of the scale.
    let (_, own) = build(Vec::new());
    assert_eq!(own.len(), torch.len());
    for (i, (&(s, z), &(ts, tz))) in own.iter().zip(&torch).enumerate() {
        assert!(z == tz && (s - ts).abs() <= 1e-6 * ts, "layer {i}: ({s}, {z}) vs torch's ({ts}, {tz})");
    }
    // torch's observed ranges: exactly its parameters.
    let (p, chosen) = build(torch_observations(&dir));
    assert_eq!(chosen, torch, "(scale, uint8 zero point) per layer");
    // int8 between the layers: every convolution but the last gives i8,
    // both residuals are read as i8, the max pool pools i8.
    let plan = p.plan();
    let calls = || plan.instrs.iter().filter_map(|i| if let InstrOp::Call(k) = &i.op { Some((i, k)) } else { None });
    let i8_out = |i: &kiln_runtime::format::Instr| plan.tensors[i.outputs[0] as usize].dtype == kiln_runtime::DType::I8;
    let convs: Vec<_> = calls().filter(|(_, k)| matches!(k, Kernel::QuantConv { .. })).collect();
    assert_eq!(convs.len(), 6);
    assert_eq!(convs.iter().filter(|(i, _)| i8_out(i)).count(), 5, "i8 results");
    let res = convs.iter().filter(|(_, k)| matches!(k, Kernel::QuantConv { res_scale: Some(_), .. })).count();
    assert_eq!(res, 2, "i8 residuals");
    assert_eq!(calls().filter(|(i, k)| matches!(k, Kernel::Pool { .. }) && i8_out(i)).count(), 1, "i8 max pool");
    let got = run_with(&p, &inputs, 1);
    let (d, d_float) = (max_abs_diff(&got, &want), max_abs_diff(&got, &float));
    assert!(d <= 2e-6, "max diff {d} vs torch's fake-quant (vs float: {d_float})");
    assert!(d_float > 100.0 * d.max(1e-7), "the float output is farther: {d_float}");
    for threads in 2..=4 {
        let t = run_with(&p, &inputs, threads);
        assert!(t.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
    }
}

/// The activation ranges torch's `MinMaxObserver` saw on `quant/cnn_static`'s
/// calibration inputs (`act_min.npy`, `act_max.npy`), layer by layer: given
/// them, kiln's int8-static chooses torch's parameters exactly.
pub(crate) fn torch_observations(dir: &Path) -> Vec<kiln_passes::ActObservation> {
    let npy_f32 = |name: &str| -> Vec<f32> {
        let t = kiln_tests::read_npy_as(&dir.join(name), false).expect(name);
        t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let ranges = npy_f32("act_min.npy").into_iter().zip(npy_f32("act_max.npy"));
    ranges.map(|(min, max)| kiln_passes::ActObservation { min, max, count: 1, ..Default::default() }).collect()
}

pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
