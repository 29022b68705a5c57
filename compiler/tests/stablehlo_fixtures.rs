//! Every PyTorch fixture compiled with `--target pjrt`, run on the XLA CPU
//! plugin through the runtime's PJRT delegate, compared with PyTorch's
//! outputs; plus bf16 and a mixed plan. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

mod stablehlo_support;

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

/// The real-model fixtures (`tests/fixtures/models/`, made by
/// `generate_models.py`): torchvision ResNet-18 and MobileNetV2, Hugging Face
/// BERT and Llama, shrunk, in both IR flavours.
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

    model_tests!(resnet18, mobilenet_v2, bert, llama);
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
