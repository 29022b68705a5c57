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
    cfg: &kiln_passes::QuantizeConfig,
    samples: &[Vec<Tensor>],
) -> Result<QuantEffect, CompileError> {
    let layers = kiln_passes::layer_outputs(float);
    let (probe, slot) = with_outputs(float, &layers, "layer");
    let mut quantized = probe.clone();
    // The extra outputs follow the rewrite: they name the quantized layers' results.
    kiln_passes::quantize_weights(&mut quantized, cfg)?;
    let outputs = float.outputs.len();
    let runs = |g: Graph| -> Result<Vec<Vec<Tensor>>, CompileError> {
        let program = cpu_program(g)?;
        let mut session = program.session()?;
        samples
            .iter()
            .map(|s| {
                let views: Vec<TensorView<'_>> = s.iter().map(Tensor::view).collect();
                Ok(session.run(&views).map_err(|e| calib_err(e.to_string()))?.to_tensors())
            })
            .collect()
    };
    let (f, q) = (runs(probe)?, runs(quantized)?);
    let f32s = |t: &Tensor| -> Vec<f64> {
        match t.dtype {
            kiln_runtime::DType::F32 => {
                t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()
            }
            _ => Vec::new(),
        }
    };
    let mut layer_sqnr_db = Vec::with_capacity(layers.len());
    for &at in &slot {
        let (mut signal, mut noise) = (0f64, 0f64);
        for (fs, qs) in f.iter().zip(&q) {
            for (a, b) in f32s(&fs[at]).iter().zip(f32s(&qs[at])) {
                signal += a * a;
                noise += (a - b) * (a - b);
            }
        }
        layer_sqnr_db.push(if noise == 0.0 { f64::INFINITY } else { 10.0 * (signal / noise).log10() });
    }
    let output_cosine = f
        .iter()
        .zip(&q)
        .map(|(fs, qs)| {
            let (a, b): (Vec<f64>, Vec<f64>) =
                (fs[..outputs].iter().flat_map(f32s).collect(), qs[..outputs].iter().flat_map(f32s).collect());
            let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
            dot / (norm(&a) * norm(&b)).max(f64::MIN_POSITIVE)
        })
        .collect();
    Ok(QuantEffect { layer_sqnr_db, output_cosine })
}
