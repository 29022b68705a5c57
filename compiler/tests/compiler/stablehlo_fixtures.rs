//! Every PyTorch fixture compiled with `--target pjrt`, run on the XLA CPU
//! plugin through the runtime's PJRT delegate, compared with PyTorch's
//! outputs; plus bf16 and a mixed plan. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::stablehlo::Precision;
use stablehlo_support::*;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;
/// bf16 keeps 8 significant bits (~4e-3 relative per rounding) and a few
/// layers compound it; individual small elements can be off by far more than
/// that relative to themselves, so bf16 runs are checked by relative L2 error.
const BF16_REL_L2: f64 = 3e-2;

fn check(name: &str, flavour: &str, precision: Precision) {
    let Some(plugin) = plugin() else { return };
    let dir = fixture_dir(name);
    let graph =
        import_pt2(&dir.join(format!("{flavour}.pt2"))).unwrap_or_else(|e| panic!("{name}/{flavour}: {e}")).graph;
    let program = compile(graph, pjrt(precision));
    let accel = accel(&program);
    eprintln!(
        "{name}/{flavour}: {} segment(s) {:?}, {} CPU instruction(s): {:?}",
        accel.segments.len(),
        accel.segments.iter().map(|s| s.ops.len()).collect::<Vec<_>>(),
        accel.cpu_fallbacks.len(),
        accel.cpu_fallbacks.iter().map(|f| f.reason.as_str()).collect::<std::collections::BTreeSet<_>>()
    );
    for (inp, out) in [("input", "output"), ("alt_input", "alt_output")] {
        let (inputs, expected) = (read_numbered(&dir, inp), read_numbered(&dir, out));
        if inputs.is_empty() {
            continue;
        }
        let got = run_pjrt(&program, &plugin, &inputs);
        assert_eq!(got.len(), expected.len(), "{name}/{flavour}: number of outputs");
        for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
            let what = format!("{name}/{flavour} {} {inp} output {i}", precision.name());
            match precision {
                Precision::F32 => assert_close(&what, g, w, RTOL, ATOL),
                Precision::Bf16 => assert_close_norm(&what, g, w, BF16_REL_L2),
            }
        }
    }
}

macro_rules! fixture_tests {
    ($($name:ident),*) => {
        $(
            mod $name {
                use kiln_compiler::stablehlo::Precision;
                #[test]
                fn training_ir() {
                    super::check(stringify!($name), "training", Precision::F32);
                }
                #[test]
                fn core_aten() {
                    super::check(stringify!($name), "aten", Precision::F32);
                }
                #[test]
                fn training_ir_bf16() {
                    super::check(stringify!($name), "training", Precision::Bf16);
                }
                #[test]
                fn torch_2_9() {
                    for flavour in ["training", "aten"] {
                        super::check(&format!("torch-2.9/{}", stringify!($name)), flavour, Precision::F32);
                    }
                }
            }
        )*
    };
}

fixture_tests!(mlp, cnn, transformer, transformer_mask, dynamic_mlp, transformer_dynseq);

/// The inverse trig, hyperbolic, pow and sign chains of `native_math`
/// (special values, arguments next to ±1, huge and tiny ones) on the device.
#[test]
fn elementwise_math_fixture() {
    for flavour in ["training", "aten"] {
        check("native_math", flavour, Precision::F32);
    }
}

/// The real-model fixtures (`tests/fixtures/models/`, made by
/// `generate_models.py`): torchvision ResNet-18, MobileNetV2, EfficientNet-B0
/// and Swin-T, Hugging Face BERT, Llama and T5, shrunk, in both IR flavours.
mod models {
    use kiln_compiler::stablehlo::Precision;

    macro_rules! model_tests {
        ($($name:ident),*) => {
            $(
                mod $name {
                    use super::Precision;
                    #[test]
                    fn training_ir() {
                        super::super::check(concat!("models/", stringify!($name)), "training", Precision::F32);
                    }
                    #[test]
                    fn core_aten() {
                        super::super::check(concat!("models/", stringify!($name)), "aten", Precision::F32);
                    }
                }
            )*
        };
    }

    model_tests!(resnet18, mobilenet_v2, efficientnet_b0, swin_t, bert, llama, t5);
}

/// Data-dependent sizes under `--target pjrt`: static-shaped work (the
/// counts) may run in segments, `BindDim`, `NonZero` and everything shaped
/// by their symbols on the CPU, in one mixed plan, for several counts.
#[test]
fn data_dependent_fixtures_run_in_a_mixed_plan() {
    let Some(plugin) = plugin() else { return };
    for (name, cases) in [("nonzero", 4), ("item", 3)] {
        let dir = fixture_dir(name);
        for flavour in ["training", "aten"] {
            let graph = import_pt2(&dir.join(format!("{flavour}.pt2")))
                .unwrap_or_else(|e| panic!("{name}/{flavour}: {e}"))
                .graph;
            let program = compile(graph, pjrt(Precision::F32));
            let accel = accel(&program);
            let reasons: Vec<&str> = accel.cpu_fallbacks.iter().map(|f| f.reason.as_str()).collect();
            assert!(reasons.iter().any(|r| r.contains("from run-time data")), "{name}/{flavour}: {reasons:?}");
            for k in 0..cases {
                let inputs = read_numbered(&dir, &format!("case{k}_input"));
                let expected = read_numbered(&dir, &format!("case{k}_output"));
                let got = run_pjrt(&program, &plugin, &inputs);
                assert_eq!(got.len(), expected.len());
                for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
                    assert_close(&format!("{name}/{flavour} case {k} output {i}"), g, w, RTOL, ATOL);
                }
            }
        }
    }
}

/// `while_loop` under `--target pjrt`: both loops become `stablehlo.while`
/// inside accelerator segments (none is left on the CPU), and give torch's
/// results for every trip count (0, 1, 3, 7) with no CPU fallback.
#[test]
fn loops_run_as_stablehlo_while() {
    let Some(plugin) = plugin() else { return };
    let dir = fixture_dir("while_loop");
    for flavour in ["training", "aten"] {
        let graph = import_pt2(&dir.join(format!("{flavour}.pt2")))
            .unwrap_or_else(|e| panic!("while_loop/{flavour}: {e}"))
            .graph;
        let program = compile(graph, pjrt(Precision::F32));
        let accel = accel(&program);
        let on_cpu: Vec<&str> = accel.cpu_fallbacks.iter().map(|f| f.reason.as_str()).collect();
        assert!(on_cpu.iter().all(|r| !r.contains("while_loop")), "while_loop/{flavour}: {on_cpu:?}");
        let loops: usize = accel.segments.iter().map(|s| s.ops.iter().filter(|o| *o == "while").count()).sum();
        assert_eq!(loops, 2, "while_loop/{flavour}: loops in segments");
        let whiles: usize = accel.segments.iter().map(|s| s.mlir.matches("\"stablehlo.while\"").count()).sum();
        assert_eq!(whiles, 2, "while_loop/{flavour}: stablehlo.while ops in the segments' text");
        for k in 0..4 {
            let inputs = read_numbered(&dir, &format!("case{k}_input"));
            let expected = read_numbered(&dir, &format!("case{k}_output"));
            let got = run_pjrt(&program, &plugin, &inputs);
            assert_eq!(got.len(), expected.len());
            for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
                assert_close(&format!("while_loop/{flavour} case {k} output {i}"), g, w, RTOL, ATOL);
            }
        }
    }
}

/// A loop body's 80-element constant is a weight argument of the segment
/// (uploaded once), not `dense<…>` text inside the loop.
#[test]
fn loop_constants_are_arguments() {
    let g = kiln_ir::text::parse(include_str!("stablehlo_support/loop_weight.kir")).unwrap_or_else(|e| panic!("{e}"));
    let program = compile(g.clone(), pjrt(Precision::F32));
    let accel = accel(&program);
    let [seg] = accel.segments.as_slice() else { panic!("{} segments", accel.segments.len()) };
    assert!(seg.ops.contains(&"while".to_string()), "{:?}", seg.ops);
    let weights = seg
        .args
        .iter()
        .filter(|&&t| {
            matches!(program.plan().tensors[t as usize].storage, kiln_runtime::format::Storage::Weight { .. })
        })
        .count();
    assert_eq!(weights, 1, "the loop's constant is a weight argument");
    // 80 f32 inline would be a 640-digit hex literal.
    let longest = seg.mlir.split("dense<").skip(1).map(|t| t.find('>').unwrap_or(t.len())).max().unwrap_or(0);
    assert!(longest < 600, "an inline constant of {longest} characters is left");
    let Some(plugin) = plugin() else { return };
    let cpu = compile(g, kiln_compiler::Backend::Cpu);
    let inputs = vec![random_f32(&[80], 21, -1.0, 1.0), kiln_runtime::Tensor::from_i64(&[], &[3])];
    let want = run_cpu(&cpu, &inputs);
    let got = run_pjrt(&program, &plugin, &inputs);
    assert_close("loop with a weight", &got[0], &want[0], RTOL, ATOL);
}

/// The error of running `program` on `inputs` (a panic if it succeeds).
fn run_error(session: &mut kiln_runtime::Session, inputs: &[kiln_runtime::Tensor]) -> kiln_runtime::Error {
    let views: Vec<kiln_runtime::TensorView<'_>> = inputs.iter().map(kiln_runtime::Tensor::view).collect();
    match session.run(&views) {
        Ok(_) => panic!("a run that must fail was accepted"),
        Err(e) => e,
    }
}

fn pjrt_session(program: &std::sync::Arc<kiln_runtime::Program>, plugin: &std::path::Path) -> kiln_runtime::Session {
    let opts = kiln_runtime::SessionOptions {
        device: kiln_runtime::Device::Pjrt(plugin.to_path_buf()),
        cache: kiln_runtime::ExecutableCache::Off,
        ..kiln_runtime::SessionOptions::default()
    };
    program.session_with(&opts).unwrap_or_else(|e| panic!("pjrt session: {e}"))
}

/// Indices that are program inputs are checked on the host before upload:
/// out of range is the CPU kernel's error (the device would clamp), negative
/// ones within range wrap as in torch.
#[test]
fn out_of_range_gather_indices_fail_as_on_the_cpu() {
    let text = "
graph {
  input %0 \"ids\": i64[3]
  const %1 \"w\": f32[5, 2] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
  %2: f32[3, 2] = gather{axis=0}(%1, %0) @\"embedding\"
  output %2 \"y\"
}
";
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let program = compile(g.clone(), pjrt(Precision::F32));
    let cpu = compile(g, kiln_compiler::Backend::Cpu);
    let accel = accel(&program);
    assert_eq!(accel.segments.len(), 1, "the gather runs in a segment");
    assert_eq!(accel.segments[0].index_checks.len(), 1);
    let Some(plugin) = plugin() else { return };
    let ids = |v: &[i64]| vec![kiln_runtime::Tensor::from_i64(&[3], v)];
    let ok = ids(&[1, -5, 4]);
    assert_close("gather in range", &run_pjrt(&program, &plugin, &ok)[0], &run_cpu(&cpu, &ok)[0], 0.0, 0.0);
    let mut device = pjrt_session(&program, &plugin);
    let mut host = cpu.session().unwrap();
    for bad in [[1, 5, 0], [0, -6, 1]] {
        let (d, h) = (run_error(&mut device, &ids(&bad)), run_error(&mut host, &ids(&bad)));
        let (kiln_runtime::Error::Kernel { source: ds, .. }, kiln_runtime::Error::Kernel { source: hs, .. }) = (&d, &h)
        else {
            panic!("kernel errors expected: device {d}, cpu {h}")
        };
        assert_eq!(ds, hs, "{bad:?}: device {d} vs cpu {h}");
        assert!(d.to_string().contains("out of range") && d.to_string().contains("embedding"), "{d}");
    }
    // The session still runs after the refused calls.
    assert_close("gather again", &run(&mut device, &ok)[0], &run_cpu(&cpu, &ok)[0], 0.0, 0.0);
}

/// `x[mask] = v` with a run-time mask: the cumsum and gather that place the
/// rows run in a segment (where a gather clamps), and the count check, an
/// assertion on the host, still refuses a mask whose number of true
/// positions differs from v's rows, as torch and the CPU plan do.
#[test]
fn masked_index_put_refuses_a_count_mismatch_on_the_device() {
    let Some(plugin) = plugin() else { return };
    let dir = fixture_dir("index_put_mask");
    let (inputs, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    for flavour in ["training", "aten"] {
        let graph = import_pt2(&dir.join(format!("{flavour}.pt2"))).unwrap_or_else(|e| panic!("{flavour}: {e}")).graph;
        let program = compile(graph, pjrt(Precision::F32));
        let accel = accel(&program);
        let in_segments = |op: &str| accel.segments.iter().any(|s| s.ops.iter().any(|o| o == op));
        assert!(in_segments("gather") && in_segments("cumsum"), "{flavour}: {:?}", accel.segments[0].ops);
        let mut device = pjrt_session(&program, &plugin);
        assert_close(&format!("{flavour} mask"), &run(&mut device, &inputs)[0], &want[0], RTOL, ATOL);
        for bits in [[true, true, false, false, false], [true, true, true, true, false], [false; 5]] {
            let mask = kiln_runtime::Tensor {
                dtype: kiln_runtime::DType::Bool,
                shape: vec![5],
                data: bits.iter().map(|&b| b as u8).collect(),
            };
            let err = run_error(&mut device, &[inputs[0].clone(), mask, inputs[2].clone()]).to_string();
            assert!(err.contains("number of true positions"), "{flavour} {bits:?}: {err}");
        }
        assert_close(&format!("{flavour} mask again"), &run(&mut device, &inputs)[0], &want[0], RTOL, ATOL);
    }
}

fn run(session: &mut kiln_runtime::Session, inputs: &[kiln_runtime::Tensor]) -> Vec<kiln_runtime::Tensor> {
    let views: Vec<kiln_runtime::TensorView<'_>> = inputs.iter().map(kiln_runtime::Tensor::view).collect();
    session.run(&views).unwrap_or_else(|e| panic!("run: {e}")).to_tensors()
}

/// Complex inputs and outputs under `--target pjrt`: the segments compute on
/// the f32/f64 pairs and the runtime's boundary presents them as c64/c128,
/// as on the CPU (fixture `complex_io`: arithmetic, matmul, FFTs, c128).
#[test]
fn complex_inputs_and_outputs_run_on_the_device() {
    let Some(plugin) = plugin() else { return };
    let dir = fixture_dir("complex_io");
    for flavour in ["training", "aten"] {
        let graph = import_pt2(&dir.join(format!("{flavour}.pt2"))).unwrap_or_else(|e| panic!("{flavour}: {e}")).graph;
        let program = compile(graph, pjrt(Precision::F32));
        assert!(!accel(&program).segments.is_empty(), "{flavour}: no accelerator segment");
        for k in 0..2 {
            let inputs = read_numbered(&dir, &format!("case{k}_input"));
            let expected = read_numbered(&dir, &format!("case{k}_output"));
            let got = run_pjrt(&program, &plugin, &inputs);
            assert_eq!(got.len(), expected.len(), "{flavour}: number of outputs");
            for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
                assert_close(&format!("complex_io/{flavour} case {k} output {i}"), g, w, RTOL, ATOL);
            }
        }
    }
}
