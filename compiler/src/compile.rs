//! The compile driver: `.pt2` → IR → passes → memory plan → `.kiln`.

use crate::import::{import_pt2_with, ImportError, ImportOptions};
use crate::lower::{lower_to_plan, LowerError};
use kiln_ir::Graph;
use kiln_passes::{
    check_plan, default_pipeline, plan_memory, run_pipeline, MemoryOptions, Options, Pass, PassError, Report, Target,
};
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
    #[error("this kiln was built without MLIR support; rebuild with --features mlir")]
    NoMlir,
}

/// Where the compiled program runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// kiln's CPU kernels only.
    #[default]
    Cpu,
    /// Accelerator segments as StableHLO for a PJRT plugin, CPU kernels for
    /// the rest (a mixed plan). Needs the `mlir` feature.
    Pjrt { precision: crate::stablehlo::Precision },
}

#[derive(Clone, Debug)]
pub struct CompileOptions {
    pub target: Target,
    /// Run the IR verifier after every pass (always on in tests).
    pub verify_each: bool,
    /// How the `.pt2` is imported: lowerings of custom ops
    /// ([`crate::import::custom`]).
    pub import: ImportOptions,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { target: Target::Cpu, verify_each: true, import: ImportOptions::default() }
    }
}

impl CompileOptions {
    /// These options with `import` as the import options (custom-op lowerings).
    pub fn with_import(self, import: ImportOptions) -> CompileOptions {
        CompileOptions { import, ..self }
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
pub fn compile_graph(
    graph: Graph,
    opts: &CompileOptions,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
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

/// Runs the pass pipeline on `graph` and produces an artifact for `backend`:
/// [`compile_graph`] for the CPU, a mixed plan with an accelerator section for
/// PJRT.
pub fn compile_graph_for(
    graph: Graph,
    opts: &CompileOptions,
    backend: Backend,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    match backend {
        Backend::Cpu => compile_graph(graph, opts, metadata),
        Backend::Pjrt { precision } => compile_graph_pjrt(graph, opts, precision, metadata),
    }
}

/// The PJRT pipeline: the CPU target's passes keep the composites (linear,
/// norms, softmax, attention, pooling), which the StableHLO emitter expands
/// itself and which stay efficient CPU kernels where they fall back.
#[cfg(feature = "mlir")]
fn compile_graph_pjrt(
    mut graph: Graph,
    opts: &CompileOptions,
    precision: crate::stablehlo::Precision,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    let pass_opts = Options { verify_each: opts.verify_each, ..Options::new(opts.target) };
    let passes = run_pipeline(&mut graph, &default_pipeline(opts.target), &pass_opts)?;
    let nodes = graph.order.len();
    let lowered = crate::stablehlo::lower_for_pjrt(&mut graph, precision)?;
    let summary = CompileSummary {
        passes,
        nodes,
        instructions: lowered.plan.instrs.len(),
        arena_bytes: lowered.plan.arena_bytes,
        peak_live_bytes: lowered.plan.peak_live_bytes,
        weights_bytes: lowered.weights.len(),
    };
    let accel = postcard::to_allocvec(&lowered.accel).map_err(|e| {
        CompileError::Write(kiln_runtime::Error::Format {
            section: "accel".into(),
            offset: 0,
            detail: format!("cannot encode: {e}"),
        })
    })?;
    let mut writer = ArtifactWriter::new(&lowered.plan, lowered.weights, &metadata)?;
    writer.add_section(kiln_runtime::format::SECTION_ACCEL, 0, accel);
    Ok((writer, summary))
}

#[cfg(not(feature = "mlir"))]
fn compile_graph_pjrt(
    _graph: Graph,
    _opts: &CompileOptions,
    _precision: crate::stablehlo::Precision,
    _metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    Err(CompileError::NoMlir)
}

/// Compiles a `.pt2` file into a `.kiln` file (written atomically).
pub fn compile_file(input: &Path, output: &Path, opts: &CompileOptions) -> Result<CompileSummary, CompileError> {
    compile_file_for(input, output, opts, Backend::Cpu)
}

/// [`compile_file`] for a chosen backend.
pub fn compile_file_for(
    input: &Path,
    output: &Path,
    opts: &CompileOptions,
    backend: Backend,
) -> Result<CompileSummary, CompileError> {
    if matches!(backend, Backend::Pjrt { .. }) && !cfg!(feature = "mlir") {
        return Err(CompileError::NoMlir);
    }
    let imported = import_pt2_with(input, &opts.import)?;
    let target = match backend {
        Backend::Cpu => target_name(opts.target).to_string(),
        Backend::Pjrt { precision: crate::stablehlo::Precision::F32 } => "pjrt".to_string(),
        Backend::Pjrt { precision } => format!("pjrt-{}", precision.name()),
    };
    let metadata = Metadata {
        producer: format!("kiln {}", env!("CARGO_PKG_VERSION")),
        source: input.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        target,
        torch_version: imported.torch_version.clone().unwrap_or_default(),
    };
    let (writer, summary) = compile_graph_for(imported.graph, opts, backend, metadata)?;
    writer.write_atomic(output)?;
    Ok(summary)
}

pub fn target_name(t: Target) -> &'static str {
    match t {
        Target::Cpu => "cpu",
        Target::Primitive => "primitive",
    }
}
