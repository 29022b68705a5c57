//! `kiln compile --quantize` on a float program (`tests/fixtures/quant/mlp_float`,
//! the MLP the torchao fixtures quantized): each mode against the float
//! output (cosine) and against torchao's eager run of the same rule (the
//! int8 weights are the integers torchao stores; int4 with `clip=none` is
//! torchao's symmetric group-wise rule), artifact sizes, and the layer
//! selection options.

use kiln_compiler::{compile_file, CompileOptions, CompileSummary};
use kiln_passes::{QuantScheme, QuantizeConfig};
use kiln_runtime::{Program, Tensor, TensorView};
use kiln_tests::{fixture_dir, read_numbered, temp_path};
use std::sync::Arc;

fn compile(flavour: &str, quantize: Option<QuantizeConfig>) -> (Arc<Program>, CompileSummary) {
    compile_calibrated(flavour, quantize, None).unwrap_or_else(|e| panic!("compile: {e}"))
}

/// The MLP's static int8 fixture (`generate_static.py`).
fn static_dir() -> std::path::PathBuf {
    fixture_dir("quant/mlp_static")
}

fn compile_calibrated(
    flavour: &str,
    quantize: Option<QuantizeConfig>,
    calibration: Option<std::path::PathBuf>,
) -> Result<(Arc<Program>, CompileSummary), String> {
    let src = fixture_dir("quant/mlp_float").join(format!("{flavour}.pt2"));
    let tmp = temp_path("quantize");
    let opts = CompileOptions { quantize, calibration, ..CompileOptions::default() };
    let summary = compile_file(&src, &tmp, &opts).map_err(|e| e.to_string())?;
    let program = Program::load(&tmp).expect("load");
    std::fs::remove_file(&tmp).ok();
    Ok((program, summary))
}

fn mode(m: &str) -> Option<QuantizeConfig> {
    Some(QuantizeConfig::new(QuantScheme::parse(m).expect("mode")))
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn run(p: &Arc<Program>) -> Vec<f32> {
    let inputs = read_numbered(&fixture_dir("quant/mlp_float"), "input");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let out = p.session().expect("session").run(&views).expect("run").to_tensors();
    f32s(&out[0])
}

fn reference(case: &str) -> Vec<f32> {
    f32s(&read_numbered(&fixture_dir(&format!("quant/{case}")), "output").remove(0))
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn quant_layers(p: &Program) -> usize {
    p.kernel_counts().into_iter().find(|(k, _)| k == "quant_linear").map_or(0, |(_, c)| c)
}

#[test]
fn every_mode_stays_close_to_float() {
    let float = reference("mlp_float");
    for flavour in ["training", "decomp"] {
        let (p, _) = compile(flavour, None);
        assert!(max_abs_diff(&run(&p), &float) < 1e-5, "{flavour}: float compile");
        for (m, bound) in [
            ("int8-weight", 0.9999),
            ("int8-dynamic", 0.999),
            ("int8-dynamic:sym", 0.999),
            ("int4-weight", 0.99),
            ("int4-weight:group=64:asym", 0.99),
            ("int4-weight:group=32:clip=none", 0.99),
        ] {
            let (p, summary) = compile(flavour, mode(m));
            assert_eq!(quant_layers(&p), 3, "{flavour} {m}: every layer quantized");
            assert!(summary.quantized.iter().all(|l| l.bits.is_some()), "{flavour} {m}");
            let got = run(&p);
            let c = cosine(&got, &float);
            assert!(c >= bound, "{flavour} {m}: cosine {c} vs float");
            assert!(max_abs_diff(&got, &float) > 1e-6, "{flavour} {m}: identical to float");
        }
    }
}

/// The same rules as torchao's configs: the same integers and scales, so
/// the outputs differ only by the order of the float sums.
#[test]
fn modes_reproduce_torchao() {
    for (m, case, tol) in
        [("int8-weight", "ao_int8_weight", 1e-5), ("int4-weight:group=32:clip=none", "ao_int4_g32", 1e-5)]
    {
        let (p, _) = compile("decomp", mode(m));
        let (got, want) = (run(&p), reference(case));
        let d = max_abs_diff(&got, &want);
        assert!(d <= tol, "{m} vs torchao {case}: max diff {d}");
    }
    // Dynamic activations: a 1-ulp difference before a rounding can move a
    // value by one step (the quantization notes' noise), so cosine.
    let (p, _) = compile("decomp", mode("int8-dynamic:sym"));
    let c = cosine(&run(&p), &reference("ao_da8w8"));
    assert!(c >= 0.9999, "int8-dynamic vs torchao da8w8: cosine {c}");
}

/// int8-dynamic's default per-row zero points: the MLP's hidden layers take
/// ReLU outputs (one sign), where a symmetric row scale wastes half the
/// int8 range, so the asymmetric rule is closer to float than torchao's.
#[test]
fn asymmetric_rows_beat_symmetric_ones() {
    let float = reference("mlp_float");
    for flavour in ["training", "decomp"] {
        let err = |m: &str| {
            let (p, _) = compile(flavour, mode(m));
            let got = run(&p);
            got.iter().zip(&float).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>()
        };
        let (asym, sym) = (err("int8-dynamic"), err("int8-dynamic:sym"));
        assert!(asym < sym, "{flavour}: asymmetric error {asym} vs symmetric {sym}");
    }
}

/// Every linear layer of the BERT fixture is quantized, in both IR flavours:
/// Core ATen writes the attention output projection (its input comes from
/// the heads transposed back) as `bmm(x, expand(permute(W)))`, which the
/// compiler canonicalises into a matmul by the transposed weight first.
#[test]
fn every_bert_layer_is_quantized() {
    let dir = fixture_dir("models/bert");
    let inputs = read_numbered(&dir, "input");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let float = f32s(&read_numbered(&dir, "output").remove(0));
    for flavour in ["training", "aten"] {
        let tmp = temp_path("quantize-bert");
        let opts = CompileOptions { quantize: mode("int8-weight"), ..CompileOptions::default() };
        let summary = compile_file(&dir.join(format!("{flavour}.pt2")), &tmp, &opts).expect("compile");
        let p = Program::load(&tmp).expect("load");
        std::fs::remove_file(&tmp).ok();
        let names: Vec<&str> = summary.quantized.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(summary.quantized.len(), 13, "{flavour}: {names:?}");
        assert!(summary.quantized.iter().all(|l| l.bits == Some(8)), "{flavour}: {names:?}");
        assert_eq!(names.iter().filter(|n| n.ends_with("attention.output.dense.weight")).count(), 2, "{flavour}");
        assert_eq!(quant_layers(&p), 13, "{flavour}: kernels {:?}", p.kernel_counts());
        let out = p.session().expect("session").run(&views).expect("run").to_tensors();
        let c = cosine(&f32s(&out[0]), &float);
        assert!(c >= 0.9999, "{flavour}: cosine {c} vs float");
    }
}

#[test]
fn artifact_sizes_shrink() {
    let (float, _) = compile("decomp", None);
    let f = float.weights_bytes() as f64;
    let (int8, _) = compile("decomp", mode("int8-weight"));
    let (int4, s4) = compile("decomp", mode("int4-weight:group=32"));
    let (r8, r4) = (int8.weights_bytes() as f64 / f, int4.weights_bytes() as f64 / f);
    // Weights, scales (f32 per row or group) and the f32 biases.
    assert!((0.24..=0.30).contains(&r8), "int8 / f32 = {r8}");
    assert!(r4 <= 0.2, "int4 g32 / f32 = {r4}");
    // The linear weights alone (weight + scales): at most a fifth.
    let (fl, q): (usize, usize) =
        s4.quantized.iter().map(|l| (l.float_bytes, l.quant_bytes)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert!(q * 5 <= fl, "int4 g32 linear weights {q} of {fl}");
}

/// MSE clipping chooses each group's range for the least error: never worse
/// than the full range per layer, better overall.
#[test]
fn mse_clipping_improves_int4_weights() {
    let (_, mse) = compile("decomp", mode("int4-weight"));
    let (_, full) = compile("decomp", mode("int4-weight:clip=none"));
    for (a, b) in mse.quantized.iter().zip(&full.quantized) {
        assert!(a.weight_sqnr_db >= b.weight_sqnr_db, "{}: {} dB vs {} dB", a.name, a.weight_sqnr_db, b.weight_sqnr_db);
    }
    assert!(mse.quantized.iter().zip(&full.quantized).any(|(a, b)| a.weight_sqnr_db > b.weight_sqnr_db + 0.5));
}

#[test]
fn layers_can_be_kept_in_float() {
    let with = |f: fn(&mut QuantizeConfig)| {
        let mut cfg = mode("int8-weight").expect("mode");
        f(&mut cfg);
        let (p, s) = compile("decomp", Some(cfg));
        (quant_layers(&p), s.quantized)
    };
    let (n, layers) = with(|c| c.skip = vec!["fc2.*".into()]);
    assert_eq!(n, 2);
    let kept: Vec<&str> = layers.iter().filter(|l| l.bits.is_none()).map(|l| l.name.as_str()).collect();
    assert_eq!(kept, ["fc2.weight"]);
    let (n, layers) = with(|c| {
        c.keep_first = true;
        c.keep_last = true;
    });
    assert_eq!(n, 1);
    assert_eq!(layers.iter().filter(|l| l.bits.is_some()).map(|l| l.name.as_str()).collect::<Vec<_>>(), ["fc2.weight"]);
}

/// int8-static with the min-max observer chooses torch's `MinMaxObserver`
/// parameters on the same calibration samples (kiln runs the float program
/// itself to observe them), and the program then computes what torch's
/// fake-quant program with those parameters computes: the same activation
/// and weight integers, the float sums in another order. One activation
/// integer off by one would move an output by about `s_x · s_w · |q_w|`
/// (≥ 1e-4 here), far above the tolerance.
#[test]
fn int8_static_matches_torch_with_the_same_scales() {
    let dir = static_dir();
    let scales = f32s(&kiln_tests::read_npy_as(&dir.join("act_scales.npy"), false).expect("scales"));
    let zps = kiln_tests::read_npy_as(&dir.join("act_zero_points.npy"), false).expect("zero points");
    let zps: Vec<i64> =
        zps.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    let want = f32s(&read_numbered(&dir, "output").remove(0));
    let float = reference("mlp_float");
    for flavour in ["training", "decomp"] {
        let (p, s) = compile_calibrated(flavour, mode("int8-static:observer=minmax"), Some(dir.join("calib")))
            .unwrap_or_else(|e| panic!("{flavour}: {e}"));
        assert_eq!(quant_layers(&p), 3, "{flavour}");
        let chosen: Vec<(f32, i64)> =
            s.quantized.iter().map(|l| l.act_qparams.map(|(s, z)| (s, z as i64 + 128)).expect("static")).collect();
        let torch: Vec<(f32, i64)> = scales.iter().copied().zip(zps.iter().copied()).collect();
        assert_eq!(chosen, torch, "{flavour}: (scale, uint8 zero point) per layer");
        let got = run(&p);
        let d = max_abs_diff(&got, &want);
        assert!(d <= 2e-6, "{flavour}: max diff {d} vs torch's static fake-quant");
        assert!(cosine(&got, &float) >= 0.9999, "{flavour}: vs float");
        // The report's measurements on the calibration samples.
        let cos = s.output_cosine.as_deref().expect("output cosine");
        assert_eq!(cos.len(), 8, "{flavour}: one per sample");
        assert!(cos.iter().all(|&c| (0.999..1.0).contains(&c)), "{flavour}: {cos:?}");
        for l in &s.quantized {
            let db = l.output_sqnr_db.expect("output SQNR");
            assert!((25.0..80.0).contains(&db), "{flavour} {}: output SQNR {db} dB", l.name);
        }
    }
}

/// int4 with calibration samples: scales fitted to the activations
/// (weighted clipping, AWQ-style input scaling where it lowers the error),
/// and the report measures each layer.
#[test]
fn int4_with_calibration() {
    let float = reference("mlp_float");
    let calib = Some(static_dir().join("calib"));
    let (p, s) = compile_calibrated("decomp", mode("int4-weight"), calib).expect("compile");
    assert_eq!(quant_layers(&p), 3);
    let c = cosine(&run(&p), &float);
    assert!(c >= 0.99, "cosine {c} vs float");
    assert!(s.quantized.iter().all(|l| l.output_sqnr_db.is_some_and(|db| db > 10.0)), "{:?}", s.quantized);
    assert!(s.output_cosine.as_deref().is_some_and(|c| c.iter().all(|&c| c > 0.99)));
}

/// int8-dynamic with calibration samples (smoothing) stays at least as
/// close to float as without them, every layer quantized.
#[test]
fn int8_dynamic_with_calibration() {
    let float = reference("mlp_float");
    let (plain, _) = compile("decomp", mode("int8-dynamic"));
    let calib = Some(static_dir().join("calib"));
    let (p, s) = compile_calibrated("decomp", mode("int8-dynamic"), calib).expect("compile");
    assert_eq!(quant_layers(&p), 3);
    let (c, c_plain) = (cosine(&run(&p), &float), cosine(&run(&plain), &float));
    assert!(c >= 0.999 && c >= c_plain - 1e-4, "cosine {c} vs float (without calibration {c_plain})");
    assert!(s.output_cosine.as_deref().is_some_and(|c| c.iter().all(|&c| c > 0.999)));
}

/// `--quantize auto:int4-weight:group=32`: per layer int4, int8 weights or
/// f32, chosen on the calibration samples to keep the output cosine within
/// the budget.
#[test]
fn auto_keeps_the_output_within_the_budget() {
    let calib = Some(static_dir().join("calib"));
    let auto = |drop: f64| {
        let cfg = QuantizeConfig {
            auto_max_cosine_drop: Some(drop),
            ..QuantizeConfig::new(QuantScheme::parse("int4-weight:group=32").expect("mode"))
        };
        let (p, s) = compile_calibrated("decomp", Some(cfg), calib.clone()).expect("compile");
        let worst = s.output_cosine.as_deref().expect("measured").iter().copied().fold(1.0, f64::min);
        (p, s, 1.0 - worst)
    };
    let bits = |s: &CompileSummary| s.quantized.iter().map(|l| l.bits).collect::<Vec<_>>();
    // A loose budget keeps every layer on the first rung.
    let (p, s, all_int4) = auto(1.0);
    assert_eq!(quant_layers(&p), 3);
    assert_eq!(bits(&s), [Some(4); 3]);
    assert!(all_int4 > 0.0, "int4 changes the output");
    // No budget: nothing quantized can stay.
    let (p, s, drop) = auto(0.0);
    assert_eq!((quant_layers(&p), drop), (0, 0.0));
    assert!(s.quantized.iter().all(|l| l.note.contains("auto")), "{:?}", s.quantized);
    // Half of all-int4's drop: some layers move up, and the result is within it.
    let budget = all_int4 / 2.0;
    let (p, s, drop) = auto(budget);
    assert!(drop <= budget, "drop {drop} over the budget {budget}");
    assert_ne!(bits(&s), [Some(4); 3], "something moved up");
    assert_eq!(quant_layers(&p), bits(&s).iter().flatten().count(), "the program has the layers reported");
    let e = compile_calibrated("decomp", auto_cfg_without_calibration(), None).err().expect("no calibration");
    assert!(e.contains("--calibration"), "{e}");
}

fn auto_cfg_without_calibration() -> Option<QuantizeConfig> {
    Some(QuantizeConfig { auto_max_cosine_drop: Some(0.01), ..QuantizeConfig::new(QuantScheme::Int8Weight) })
}

/// Every observer makes a working static program; min-max's scales cover
/// the whole observed range, so the others' are never larger.
#[test]
fn int8_static_observers_and_errors() {
    let calib = Some(static_dir().join("calib"));
    let float = reference("mlp_float");
    let (_, minmax) = compile_calibrated("decomp", mode("int8-static"), calib.clone()).expect("minmax");
    for obs in ["percentile=99.9", "mse"] {
        let (p, s) = compile_calibrated("decomp", mode(&format!("int8-static:observer={obs}")), calib.clone())
            .unwrap_or_else(|e| panic!("{obs}: {e}"));
        assert_eq!(quant_layers(&p), 3, "{obs}");
        let c = cosine(&run(&p), &float);
        assert!(c >= 0.999, "{obs}: cosine {c} vs float");
        for (a, b) in s.quantized.iter().zip(&minmax.quantized) {
            let (sa, sb) = (a.act_qparams.expect("static").0, b.act_qparams.expect("static").0);
            assert!(sa <= sb, "{obs} {}: scale {sa} above min-max's {sb}", a.name);
        }
    }
    let e = compile_calibrated("decomp", mode("int8-static"), None).err().expect("no calibration");
    assert!(e.contains("--calibration"), "{e}");
    let e = compile_calibrated("decomp", mode("int8-static"), Some(static_dir())).err().expect("no samples");
    assert!(e.contains("sample_0"), "{e}");
}
