//! The compile driver: `.pt2` → IR → passes → memory plan → `.kiln`.

use crate::import::{import_pt2, ImportError};
use crate::lower::{lower_to_plan, LowerError};
use kiln_ir::Graph;
use kiln_passes::{check_plan, default_pipeline, plan_memory, run_pipeline, MemoryOptions, Options, Pass, PassError, Report, Target};
use kiln_runtime::format::{ArtifactWriter, Metadata};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error(transparent)]
    Lower(#[from] LowerError),
    #[error("memory plan is inconsistent (compiler bug): {0}")]
    MemoryPlan(String),
    #[error(transparent)]
    Write(#[from] kiln_runtime::Error),
}

#[derive(Clone, Debug)]
pub struct CompileOptions {
    pub target: Target,
    /// Run the IR verifier after every pass (always on in tests).
    pub verify_each: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { target: Target::Cpu, verify_each: true }
    }
}

/// What a compilation produced, for the CLI's summary.
#[derive(Debug)]
pub struct CompileSummary {
    pub passes: Report,
    pub nodes: usize,
    pub instructions: usize,
    pub arena_bytes: u64,
    pub peak_live_bytes: u64,
    pub weights_bytes: usize,
}

/// Runs the pass pipeline on `graph` and produces the artifact.
pub fn compile_graph(graph: Graph, opts: &CompileOptions, metadata: Metadata) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    compile_graph_with_passes(graph, &default_pipeline(opts.target), opts, metadata)
}

/// Like [`compile_graph`] with an explicit pass list (tests compare programs
/// compiled with and without a pass).
pub fn compile_graph_with_passes(
    mut graph: Graph,
    pipeline: &[Pass],
    opts: &CompileOptions,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    let pass_opts = Options { verify_each: opts.verify_each, ..Options::new(opts.target) };
    let passes = run_pipeline(&mut graph, pipeline, &pass_opts)?;
    let mem = plan_memory(&graph, &MemoryOptions::default())?;
    check_plan(&graph, &mem).map_err(CompileError::MemoryPlan)?;
    let (plan, weights) = lower_to_plan(&graph, &mem)?;
    let summary = CompileSummary {
        passes,
        nodes: graph.order.len(),
        instructions: plan.instrs.len(),
        arena_bytes: plan.arena_bytes,
        peak_live_bytes: plan.peak_live_bytes,
        weights_bytes: weights.len(),
    };
    Ok((ArtifactWriter::new(&plan, weights, &metadata)?, summary))
}

/// Compiles a `.pt2` file into a `.kiln` file (written atomically).
pub fn compile_file(input: &Path, output: &Path, opts: &CompileOptions) -> Result<CompileSummary, CompileError> {
    let imported = import_pt2(input)?;
    let metadata = Metadata {
        producer: format!("kiln {}", env!("CARGO_PKG_VERSION")),
        source: input.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        target: target_name(opts.target).to_string(),
        torch_version: imported.torch_version.clone().unwrap_or_default(),
    };
    let (writer, summary) = compile_graph(imported.graph, opts, metadata)?;
    writer.write_atomic(output)?;
    Ok(summary)
}

pub fn target_name(t: Target) -> &'static str {
    match t {
        Target::Cpu => "cpu",
        Target::Primitive => "primitive",
    }
}
