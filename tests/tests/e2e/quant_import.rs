//! Quantized programs saved by torch.export (`tests/fixtures/quant/`, made by
//! `generate_quant.py`): PT2E static and dynamic, torchao weight-only and
//! dynamic int8 after `run_decompositions()`, compiled, run and compared with
//! eager. Static and weight-only programs compute what eager computes: bit
//! for bit where the program ends quantized, within the float GEMM's
//! summation order (an ulp) where it ends in a float layer (static layers
//! run integer kernels: exact sums of the same integers, rounded once); dynamic activation quantization amplifies 1-ulp
//! differences of the float ops before it into a different rounding of a few
//! activations, so those compare with the tolerance the quantization notes
//! measured (cosine, and a bound of a few quantization steps).

use kiln_runtime::{Tensor, TensorView};
use kiln_tests::{fixture_dir, read_numbered, temp_path};

fn compile_case(case: &str, flavour: &str) -> std::sync::Arc<kiln_runtime::Program> {
    let dir = fixture_dir(&format!("quant/{case}"));
    let tmp = temp_path(case);
    kiln_compiler::compile_file(&dir.join(format!("{flavour}.pt2")), &tmp, &kiln_compiler::CompileOptions::default())
        .unwrap_or_else(|e| panic!("{case}/{flavour}: compile failed: {e}"));
    let program = kiln_runtime::Program::load(&tmp).unwrap_or_else(|e| panic!("{case}/{flavour}: load: {e}"));
    std::fs::remove_file(&tmp).ok();
    program
}

fn run_case(case: &str, flavour: &str) -> (Vec<f32>, Vec<f32>, Vec<f32>, usize) {
    let dir = fixture_dir(&format!("quant/{case}"));
    let program = compile_case(case, flavour);
    let size = program.weights_bytes() as usize;
    let inputs = read_numbered(&dir, "input");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let mut session = program.session().expect("session");
    let out = session.run(&views).unwrap_or_else(|e| panic!("{case}/{flavour}: run: {e}"));
    let got: Vec<f32> = out.get(0).data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let want = read_numbered(&dir, "output").remove(0).to_f32().expect("f32");
    let float = read_numbered(&dir, "float_output").remove(0).to_f32().expect("f32");
    (got, want, float, size)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Programs whose last op is a quantize/dequantize pair: every output bit
/// equals eager's.
fn assert_bit_exact(case: &str, flavour: &str) {
    let (got, want, float, _) = run_case(case, flavour);
    assert_eq!(got.len(), want.len());
    let diffs = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(diffs, 0, "{case}/{flavour}: {diffs} of {} outputs differ from eager: {got:?} vs {want:?}", got.len());
    // And the quantization is real: the output is not the float model's.
    assert!(max_abs_diff(&got, &float) > 1e-3, "{case}/{flavour}: output equals the float model's");
}

/// Programs ending in a float GEMM: the quantized values are torch's, the
/// last sums round in kiln's order (an ulp or two), far below the
/// quantization's own effect.
fn assert_float_rounding(case: &str, flavour: &str) {
    let (got, want, float, _) = run_case(case, flavour);
    assert_eq!(got.len(), want.len());
    let vs_eager = max_abs_diff(&got, &want);
    let vs_float = max_abs_diff(&got, &float);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(vs_eager <= 1e-6 * (1.0 + scale), "{case}/{flavour}: max |kiln - eager| = {vs_eager}");
    assert!(vs_float > 1e3 * vs_eager.max(1e-7), "{case}/{flavour}: {vs_float} from float vs {vs_eager} from eager");
}

fn assert_dynamic_close(case: &str, flavour: &str) {
    let (got, want, float, _) = run_case(case, flavour);
    let c = cosine(&got, &want);
    assert!(c >= 0.999, "{case}/{flavour}: cosine {c} vs eager");
    let c_float = cosine(&got, &float);
    assert!(c_float >= 0.99, "{case}/{flavour}: cosine {c_float} vs the float model");
    let mismatched = got.iter().zip(&want).filter(|(a, b)| (**a - **b).abs() > 1e-2 * (1.0 + b.abs())).count();
    assert!(mismatched * 20 <= got.len(), "{case}/{flavour}: {mismatched} of {} outputs far from eager", got.len());
}

macro_rules! cases {
    ($check:ident: $($case:ident => [$($flavour:ident),*]),* $(,)?) => {
        $(mod $case { $(#[test] fn $flavour() { super::$check(stringify!($case), stringify!($flavour)); })* })*
    };
}

cases!(assert_bit_exact:
    pt2e_xnnpack_static => [raw, decomp],
);

cases!(assert_float_rounding:
    pt2e_x86_static => [raw, decomp],
    ao_int8_weight => [decomp],
    ao_int4_g32 => [decomp],
    // torchao's uint8-activation `_int_mm` (token-shaped input): the
    // integer products are torch's exactly.
    ao_da8w8_tokens => [decomp],
);

cases!(assert_dynamic_close:
    pt2e_x86_dynamic => [raw, decomp],
    ao_da8w8 => [decomp],
);

#[test]
fn raw_torchao_archives_ask_for_run_decompositions() {
    for case in ["ao_int8_weight", "ao_da8w8", "ao_int4_g32"] {
        let src = fixture_dir(&format!("quant/{case}")).join("raw.pt2");
        let tmp = temp_path(case);
        let err = kiln_compiler::compile_file(&src, &tmp, &kiln_compiler::CompileOptions::default())
            .expect_err("a raw torchao archive must be refused");
        let msg = err.to_string();
        assert!(msg.contains("run_decompositions()"), "{case}: {msg}");
        assert!(msg.contains("torchao"), "{case}: {msg}");
    }
}

/// PT2E archives keep the float weights as unused inputs next to the int8
/// ones: they are not copied into the artifact.
#[test]
fn unused_float_weights_are_not_copied() {
    let (_, _, _, weights) = run_case("pt2e_x86_static", "decomp");
    // The CNN's float parameters: conv1 8x3x3x3 + 8, conv2 16x8x3x3 + 16, fc 10x256 + 10.
    let float_bytes = 4 * (8 * 27 + 8 + 16 * 72 + 16 + 10 * 256 + 10);
    // Every weight is int8 (a quarter), plus f32 scales and biases.
    assert!(weights * 10 < float_bytes * 4, "{weights} weight bytes for {float_bytes} bytes of float parameters");
}

/// PT2E's per-channel convolution weights stay int8 (`quant_conv`, f32
/// activations: the program computes what eager computes), in both flavours.
#[test]
fn convolutions_keep_integer_weights() {
    for case in ["pt2e_x86_static", "pt2e_xnnpack_static"] {
        for flavour in ["raw", "decomp"] {
            let program = compile_case(case, flavour);
            let count =
                |kernel: &str| program.kernel_counts().into_iter().find(|(k, _)| k == kernel).map_or(0, |(_, c)| c);
            assert_eq!(count("quant_conv"), 2, "{case}/{flavour}: quantized convolutions");
            assert_eq!(count("conv") + count("conv_fused"), 0, "{case}/{flavour}: float convolutions");
        }
    }
}

/// PT2E's static activation quantization (a quantize/dequantize pair with
/// constant parameters in front of a layer) runs as the layer's own int8
/// activations: every layer of both static programs quantizes its input
/// with the pair's scale and zero point (uint8 as int8, the zero point
/// less 128), and the outputs above still match eager (bit for bit where
/// the program ends quantized).
#[test]
fn static_activation_pairs_run_as_integer_layers() {
    use kiln_runtime::format::{InstrOp, Kernel};
    for case in ["pt2e_x86_static", "pt2e_xnnpack_static"] {
        for flavour in ["raw", "decomp"] {
            let program = compile_case(case, flavour);
            let acts: Vec<(Option<f64>, i32)> = program
                .plan()
                .instrs
                .iter()
                .filter_map(|i| match &i.op {
                    InstrOp::Call(Kernel::QuantConv { act_scale, act_zero_point, .. })
                    | InstrOp::Call(Kernel::QuantLinear { act_scale, act_zero_point, .. }) => {
                        Some((*act_scale, *act_zero_point))
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(acts.len(), 3, "{case}/{flavour}: two convolutions and a linear layer");
            for (scale, zp) in acts {
                assert!(scale.is_some_and(|s| s > 0.0), "{case}/{flavour}: activations not static");
                assert!((-128..=127).contains(&zp), "{case}/{flavour}: zero point {zp}");
            }
        }
    }
}

/// Dequantized integer weights feeding linear layers stay integers: one
/// `quant_linear` per layer, and int4 weights two a byte.
#[test]
fn linear_layers_keep_integer_weights() {
    let quant_layers = |case: &str| {
        let program = compile_case(case, "decomp");
        let count = program.kernel_counts().into_iter().find(|(k, _)| k == "quant_linear").map_or(0, |(_, c)| c);
        (count, program.weights_bytes() as usize)
    };
    for (case, layers) in [
        ("pt2e_x86_static", 1),
        ("pt2e_xnnpack_static", 1),
        ("pt2e_x86_dynamic", 3),
        ("ao_int8_weight", 3),
        ("ao_int4_g32", 3),
        ("ao_da8w8", 3),
        ("ao_da8w8_tokens", 3),
    ] {
        assert_eq!(quant_layers(case).0, layers, "{case}: quantized linear layers");
    }
    // The MLP: 64x128, 128x64, 64x32 weights and 224 biases, in f32.
    let float_bytes = 4 * (64 * 128 + 128 * 64 + 64 * 32 + 224);
    let (_, int8) = quant_layers("ao_int8_weight");
    let (_, int4) = quant_layers("ao_int4_g32");
    assert!(int8 * 10 < float_bytes * 3, "int8: {int8} weight bytes for {float_bytes} f32");
    assert!(int4 * 5 < float_bytes, "int4 g32: {int4} weight bytes for {float_bytes} f32");
}

/// The quantized-linear pass alone, before/after on random inputs: the
/// program without passes (float fake-quant) against the same program with
/// its linear layers rewritten. The rewritten layers sum in another order,
/// and programs that quantize activations after a layer may then round an
/// element to the neighbouring step: compared by cosine and a max bound.
#[test]
fn quant_linear_pass_preserves_results_on_random_inputs() {
    use kiln_compiler::{compile_graph_with_passes, CompileOptions};
    use kiln_passes::{DCE, QUANT_LINEAR};
    use rand::{Rng, SeedableRng};
    let build = |case: &str, passes: &[kiln_passes::Pass]| {
        let dir = fixture_dir(&format!("quant/{case}"));
        let imported = kiln_compiler::import::import_pt2(&dir.join("decomp.pt2")).expect("import");
        let opts = CompileOptions { verify_each: true, ..CompileOptions::default() };
        let (writer, _) = compile_graph_with_passes(imported.graph, passes, &opts, Default::default())
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        kiln_runtime::Program::from_bytes(&writer.to_bytes()).expect("load")
    };
    for case in
        ["pt2e_x86_static", "pt2e_xnnpack_static", "pt2e_x86_dynamic", "ao_int8_weight", "ao_int4_g32", "ao_da8w8"]
    {
        let before = build(case, &[]);
        let after = build(case, &[QUANT_LINEAR, DCE]);
        assert!(after.kernel_counts().iter().any(|(k, _)| k == "quant_linear"), "{case}: nothing rewritten");
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..3 {
            let inputs: Vec<Tensor> = read_numbered(&fixture_dir(&format!("quant/{case}")), "input")
                .into_iter()
                .map(|t| {
                    let v: Vec<f32> =
                        (0..t.shape.iter().product::<usize>()).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                    Tensor::from_f32(&t.shape, &v)
                })
                .collect();
            let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
            let f32s = |p: &std::sync::Arc<kiln_runtime::Program>| -> Vec<f32> {
                let mut s = p.session().expect("session");
                let out = s.run(&views).expect("run");
                out.get(0).data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            };
            let (want, got) = (f32s(&before), f32s(&after));
            if case.starts_with("ao_da8w8") {
                // torchao's per-token int8 arithmetic is the integer kernel's
                // definition: the same bits, whatever the order of the sums.
                let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{case}: the integer kernel differs from the decomposed program");
            }
            let c = cosine(&got, &want);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(c >= 0.9999, "{case}: cosine {c} after the pass");
            assert!(
                max_abs_diff(&got, &want) <= 0.05 * (1.0 + scale),
                "{case}: max diff {}",
                max_abs_diff(&got, &want)
            );
        }
    }
}
