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
            o.add(&xs);
        }
    }
    Ok(obs)
}

/// The float program with `values` as extra outputs, and which output each
/// value is (layers sharing an input share an output).
fn observing_program(graph: &Graph, values: &[ValueId]) -> Result<(std::sync::Arc<Program>, Vec<usize>), CompileError> {
    let mut g = graph.clone();
    let mut slot = Vec::with_capacity(values.len());
    let mut added: Vec<ValueId> = Vec::new();
    for &v in values {
        if g.ty(v).dtype != DType::F32 {
            return Err(calib_err(format!("a linear layer's input is {}, not f32", g.ty(v).dtype)));
        }
        let at = match added.iter().position(|&a| a == v) {
            Some(p) => p,
            None => {
                added.push(v);
                g.add_output(format!("__calibration_{}", added.len() - 1), v);
                added.len() - 1
            }
        };
        slot.push(graph.outputs.len() + at);
    }
    let opts = CompileOptions { verify_each: false, ..CompileOptions::default() };
    let (writer, _) = compile_graph(g, &opts, Metadata::default())?;
    Ok((Program::from_bytes(&writer.to_bytes())?, slot))
}
