//! `kiln compile --quantize int8-static --calibration DIR`: the float
//! program run on calibration samples by kiln's own runtime, recording what
//! every linear layer's input takes.
//!
//! DIR holds `sample_0/`, `sample_1/`, … (numbered from 0 without gaps),
//! each with the program's inputs as `input_0.npy`, `input_1.npy`, … .
//! The observed values ([`kiln_passes::layer_inputs`]) become extra outputs
//! of a copy of the graph, which is compiled for the CPU without
//! quantization and run once per sample; the outputs it had come first,
//! so the extra ones are read off the end.

use crate::compile::{compile_graph, CompileError, CompileOptions};
use crate::npy::read_npy;
use kiln_ir::{DType, Graph, ValueId};
use kiln_passes::{layer_inputs, ActObservation};
use kiln_runtime::format::Metadata;
use kiln_runtime::{Program, Tensor, TensorView};
use std::path::Path;

fn calib_err(detail: impl Into<String>) -> CompileError {
    CompileError::Calibration(detail.into())
}

/// The samples of a calibration directory: one list of inputs per sample.
pub fn read_samples(dir: &Path) -> Result<Vec<Vec<Tensor>>, CompileError> {
    let mut samples = Vec::new();
    loop {
        let sample = dir.join(format!("sample_{}", samples.len()));
        if !sample.is_dir() {
            break;
        }
        let mut inputs = Vec::new();
        loop {
            let path = sample.join(format!("input_{}.npy", inputs.len()));
            if !path.is_file() {
                break;
            }
            inputs.push(read_npy(&path).map_err(|e| calib_err(format!("{}: {e}", path.display())))?);
        }
        if inputs.is_empty() {
            return Err(calib_err(format!("{} has no input_0.npy", sample.display())));
        }
        samples.push(inputs);
    }
    if samples.is_empty() {
        return Err(calib_err(format!("{} has no sample_0/ directory", dir.display())));
    }
    Ok(samples)
}

/// What each of `graph`'s linear layer inputs (in [`layer_inputs`]' order)
/// took over `samples`.
pub fn observe(graph: &Graph, samples: &[Vec<Tensor>]) -> Result<Vec<ActObservation>, CompileError> {
    let values = layer_inputs(graph);
    let (program, slot) = observing_program(graph, &values)?;
    let expected = program.inputs().len();
    let mut session = program.session()?;
    let mut obs = vec![ActObservation::default(); values.len()];
    for (i, sample) in samples.iter().enumerate() {
        if sample.len() != expected {
            return Err(calib_err(format!("sample_{i} has {} inputs, the program takes {expected}", sample.len())));
        }
        let views: Vec<TensorView<'_>> = sample.iter().map(Tensor::view).collect();
        let outs = session.run(&views).map_err(|e| calib_err(format!("sample_{i}: {e}")))?.to_tensors();
        for (o, &s) in obs.iter_mut().zip(&slot) {
            let t = outs.get(s).ok_or_else(|| calib_err("missing observed output"))?;
            let xs: Vec<f32> = t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            o.add(&xs, t.shape.last().copied().unwrap_or(1));
        }
    }
    Ok(obs)
}

/// `graph` with `values` as outputs too, and which output each value is
/// (a value already an output, or listed twice, keeps one output).
fn with_outputs(graph: &Graph, values: &[ValueId], tag: &str) -> (Graph, Vec<usize>) {
    let mut g = graph.clone();
    let slot = values
        .iter()
        .map(|&v| match g.outputs.iter().position(|&o| o == v) {
            Some(p) => p,
            None => {
                g.add_output(format!("__{tag}_{}", g.outputs.len()), v);
                g.outputs.len() - 1
            }
        })
        .collect();
    (g, slot)
}

/// `g` compiled for the CPU (no further quantization) and loaded.
fn cpu_program(g: Graph) -> Result<std::sync::Arc<Program>, CompileError> {
    let opts = CompileOptions { verify_each: false, ..CompileOptions::default() };
    let (writer, _) = compile_graph(g, &opts, Metadata::default())?;
    Ok(Program::from_bytes(&writer.to_bytes())?)
}

/// The float program with `values` as extra outputs, and which output each
/// value is.
fn observing_program(graph: &Graph, values: &[ValueId]) -> Result<(std::sync::Arc<Program>, Vec<usize>), CompileError> {
    if let Some(&v) = values.iter().find(|&&v| graph.ty(v).dtype != DType::F32) {
        return Err(calib_err(format!("a linear layer's input is {}, not f32", graph.ty(v).dtype)));
    }
    let (g, slot) = with_outputs(graph, values, "calibration");
    Ok((cpu_program(g)?, slot))
}

/// How far the quantized program is from the float one on the samples:
/// per layer the SQNR of its output (in [`layer_outputs`]' order), and per
/// sample the cosine of all the program's f32 outputs together.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantEffect {
    pub layer_sqnr_db: Vec<f64>,
    pub output_cosine: Vec<f64>,
}

/// Runs `float` and `float` quantized by `cfg` on `samples`, both with
/// every layer's output as an extra output, and compares them.
pub fn measure(
    float: &Graph,
    planned: &[kiln_passes::LayerQuant],
    samples: &[Vec<Tensor>],
) -> Result<QuantEffect, CompileError> {
    let layers = kiln_passes::layer_outputs(float);
    let (probe, slot) = with_outputs(float, &layers, "layer");
    let mut quantized = probe.clone();
    // The extra outputs follow the rewrite: they name the quantized layers'
    // results (the probe keeps the float graph's nodes, which the plan names).
    kiln_passes::apply_layers(&mut quantized, planned.to_vec())?;
    let outputs = float.outputs.len();
    let (f, q) = (run_all(cpu_program(probe)?, samples)?, run_all(cpu_program(quantized)?, samples)?);
    let mut layer_sqnr_db = Vec::with_capacity(layers.len());
    for &at in &slot {
        let (mut signal, mut noise) = (0f64, 0f64);
        for (fs, qs) in f.iter().zip(&q) {
            for (a, b) in fs[at].iter().zip(&qs[at]) {
                signal += a * a;
                noise += (a - b) * (a - b);
            }
        }
        layer_sqnr_db.push(if noise == 0.0 { f64::INFINITY } else { 10.0 * (signal / noise).log10() });
    }
    let output_cosine = f.iter().zip(&q).map(|(fs, qs)| cosine(&fs[..outputs], &qs[..outputs])).collect();
    Ok(QuantEffect { layer_sqnr_db, output_cosine })
}

/// `--quantize auto`: each linear layer's rung of [`kiln_passes::auto_ladder`]
/// (from `cfg.scheme`, most compressed first), chosen so that the output
/// cosine against the float program stays within `1 − max_drop` on every
/// calibration sample (the cosine of all of a sample's f32 outputs
/// together).
///
/// Each layer is quantized once per rung ([`kiln_passes::plan_layers`]);
/// the search only mixes those. Every layer starts on the first rung. Each
/// layer's sensitivity is the drop with it alone quantized (one compile
/// and run per layer). While the whole program's drop is over the budget,
/// the most sensitive layers of the lowest rung still in use move up one
/// rung — the fewest that meet the budget, found by bisection (the drop
/// falls, nearly monotonically, as layers move up) — or all of them if
/// none suffices, and the next rung is tried the same way. Returns the
/// chosen layers, ready for [`kiln_passes::apply_layers`].
pub fn choose_auto(
    graph: &Graph,
    cfg: &kiln_passes::QuantizeConfig,
    samples: &[Vec<Tensor>],
    max_drop: f64,
) -> Result<Vec<kiln_passes::LayerQuant>, CompileError> {
    let ladder = kiln_passes::auto_ladder(&cfg.scheme);
    let mut rungs = Vec::with_capacity(ladder.len());
    for scheme in &ladder {
        let plan = match scheme {
            Some(s) => {
                let c = kiln_passes::QuantizeConfig { scheme: s.clone(), auto_max_cosine_drop: None, ..cfg.clone() };
                kiln_passes::plan_layers(graph, &c)?
            }
            None => {
                let first: &Vec<kiln_passes::LayerQuant> = &rungs[0];
                first.iter().map(|l| l.kept("kept in f32 by --quantize auto")).collect()
            }
        };
        rungs.push(plan);
    }
    let layers = rungs[0].len();
    let float = run_all(cpu_program(graph.clone())?, samples)?;
    let outputs = graph.outputs.len();
    let mix = |levels: &[usize]| -> Vec<kiln_passes::LayerQuant> {
        levels.iter().enumerate().map(|(i, &l)| rungs[l][i].clone()).collect()
    };
    // Each mix is compiled and run once: the bisection's last trial is the
    // next rung's starting point.
    let mut measured = std::collections::HashMap::<Vec<usize>, f64>::new();
    let mut drop = |levels: &[usize]| -> Result<f64, CompileError> {
        if let Some(&d) = measured.get(levels) {
            return Ok(d);
        }
        let mut g = graph.clone();
        kiln_passes::apply_layers(&mut g, mix(levels))?;
        let got = run_all(cpu_program(g)?, samples)?;
        let worst =
            float.iter().zip(&got).map(|(f, q)| cosine(&f[..outputs], &q[..outputs])).fold(f64::INFINITY, f64::min);
        measured.insert(levels.to_vec(), 1.0 - worst);
        Ok(1.0 - worst)
    };
    let top = ladder.len() - 1;
    let mut sensitivity = Vec::with_capacity(layers);
    for i in 0..layers {
        let mut alone = vec![top; layers];
        alone[i] = 0;
        sensitivity.push(drop(&alone)?);
    }
    // Most sensitive first; ties by layer order, so the choice is reproducible.
    let mut order: Vec<usize> = (0..layers).collect();
    order.sort_by(|&a, &b| sensitivity[b].total_cmp(&sensitivity[a]).then(a.cmp(&b)));
    let mut levels = vec![0usize; layers];
    for rung in 0..top {
        if drop(&levels)? <= max_drop {
            break;
        }
        let on_rung: Vec<usize> = order.iter().copied().filter(|&i| levels[i] == rung).collect();
        let promoted = |count: usize| {
            let mut l = levels.clone();
            on_rung[..count].iter().for_each(|&i| l[i] = rung + 1);
            l
        };
        // The fewest promotions that meet the budget: bisect on (lo, hi].
        let (mut lo, mut hi) = (0, on_rung.len());
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if drop(&promoted(mid))? <= max_drop {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        levels = promoted(hi);
    }
    let mut chosen = mix(&levels);
    for (l, &level) in chosen.iter_mut().zip(&levels) {
        if let (true, Some(scheme)) = (level > 0, &ladder[level]) {
            l.report.note = format!("--quantize auto: {scheme} (more sensitive than the budget allows {})", cfg.scheme);
        }
    }
    Ok(chosen)
}

/// `program` run once per sample, every output as f64s (non-f32 outputs empty).
fn run_all(program: std::sync::Arc<Program>, samples: &[Vec<Tensor>]) -> Result<Vec<Vec<Vec<f64>>>, CompileError> {
    let mut session = program.session()?;
    samples
        .iter()
        .map(|s| {
            let views: Vec<TensorView<'_>> = s.iter().map(Tensor::view).collect();
            let outs = session.run(&views).map_err(|e| calib_err(e.to_string()))?.to_tensors();
            Ok(outs.iter().map(f64s).collect())
        })
        .collect()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    match t.dtype {
        kiln_runtime::DType::F32 => {
            t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()
        }
        _ => Vec::new(),
    }
}

/// The cosine of all of `a`'s values against all of `b`'s.
fn cosine(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    let (a, b): (Vec<f64>, Vec<f64>) = (a.iter().flatten().copied().collect(), b.iter().flatten().copied().collect());
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(&a) * norm(&b)).max(f64::MIN_POSITIVE)
}
