//! What the before/after pass tests share: a graph compiled for the CPU with
//! a given pass list (the verifier after each pass), and a run of it.

use kiln_compiler::{compile_graph_with_passes, CompileOptions};
use kiln_ir::Graph;
use kiln_passes::{Pass, Target};
use kiln_runtime::format::Metadata;
use kiln_runtime::{Program, SessionOptions, Tensor};
use std::sync::Arc;

/// `g` through exactly `passes`, lowered and loaded.
pub(crate) fn compile(g: Graph, passes: &[Pass]) -> Arc<Program> {
    let opts = CompileOptions { target: Target::Cpu, verify_each: true, ..CompileOptions::default() };
    let (writer, _) = compile_graph_with_passes(g, passes, &opts, Metadata::default()).expect("compile");
    Program::from_bytes(&writer.to_bytes()).expect("load")
}

/// One run on the default thread count.
pub(crate) fn run(p: &Arc<Program>, inputs: &[Tensor]) -> Vec<Tensor> {
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    p.session().unwrap().run(&views).unwrap().to_tensors()
}

/// One run on `threads` threads.
pub(crate) fn run_at(p: &Arc<Program>, inputs: &[Tensor], threads: usize) -> Vec<Tensor> {
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    p.session_with(&SessionOptions::with_threads(threads)).unwrap().run(&views).unwrap().to_tensors()
}
