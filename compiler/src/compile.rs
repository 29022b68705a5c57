//! The compile driver: `.pt2` → IR → passes → memory plan → `.kiln`.

use crate::import::{import_pt2_with, ImportError, ImportOptions};
use crate::lower::{lower_to_plan, LowerError};
use crate::stablehlo::Precision;
use kiln_ir::Graph;
use kiln_passes::{
    check_plan, dce, default_pipeline, plan_memory, quantize_weights, run_pipeline, simplify, LayerReport,
    MemoryOptions, Options, Pass, PassError, QuantizeConfig, Report, Target,
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
    #[error("this kiln was built without native code generation; rebuild with --features native")]
    NoNative,
    /// Native code generation failed where it should not (LLVM, the loader check).
    #[error("native code: {0}")]
    Native(String),
    /// A sharding the mesh, the strategy or an override cannot give.
    #[error("sharding: {0}")]
    Shard(String),
    /// `--quantize` makes `quant_linear`, which the CPU kernels and PJRT segments run.
    #[error("--quantize needs --target cpu or pjrt (where quant_linear runs), not {0}")]
    QuantizeTarget(String),
    /// `--calibration`: unreadable samples, or a run of the float program failed.
    #[error("calibration: {0}")]
    Calibration(String),
}

/// Where the compiled program runs, as the compile functions take it: a
/// [`Target`] (through [`Backend::target`]), whose description
/// ([`kiln_passes::TargetDesc`]) the passes, the partitioner and lowering
/// consult, with the settings of the code it gets.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// No override: [`CompileOptions::target`] with default settings (kiln's
    /// CPU kernels only for `cpu` and `primitive`, f32 segments for `pjrt`).
    #[default]
    Cpu,
    /// [`Target::Pjrt`]: accelerator segments as StableHLO for a PJRT plugin,
    /// computing in `precision`, and CPU kernels for the rest (a mixed plan).
    /// Needs the `mlir` feature.
    Pjrt { precision: Precision },
}

impl Backend {
    /// The backend of `target`; `precision` is for accelerator segments.
    pub fn for_target(target: Target, precision: Precision) -> Backend {
        match target.desc().segments {
            Some(_) => Backend::Pjrt { precision },
            None => Backend::Cpu,
        }
    }

    /// The target compiled for, given the options' `target`.
    pub fn target(self, target: Target) -> Target {
        match self {
            Backend::Cpu => target,
            Backend::Pjrt { .. } => Target::Pjrt,
        }
    }

    fn precision(self) -> Precision {
        match self {
            Backend::Cpu => Precision::default(),
            Backend::Pjrt { precision } => precision,
        }
    }
}

#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// What the program is compiled for (a [`Backend`] other than
    /// [`Backend::Cpu`] overrides it). A target with accelerator segments
    /// (`pjrt`) gets a mixed plan.
    pub target: Target,
    /// Run the IR verifier after every pass (always on in tests).
    pub verify_each: bool,
    /// How the `.pt2` is imported: lowerings of custom ops
    /// ([`crate::import::custom`]).
    pub import: ImportOptions,
    /// Quantize the float program's linear layers before the pipeline
    /// (`kiln compile --quantize`; `kiln_passes::quantize_weights`).
    pub quantize: Option<QuantizeConfig>,
    /// `--calibration DIR` (`crate::calibrate`): samples the float program
    /// runs on to observe activations, for the quantization schemes that
    /// need them.
    pub calibration: Option<std::path::PathBuf>,
    /// SPMD over a device mesh (`--target pjrt` only): the program is
    /// sharded after the pass pipeline and emitted as one annotated segment.
    pub shard: Option<ShardConfig>,
    /// Shape buckets for a program with symbolic dimensions (`--target pjrt`
    /// only; [`crate::stablehlo::buckets`]).
    pub buckets: Option<crate::stablehlo::buckets::BucketSpec>,
    /// Native code for the fused elementwise groups (`--target
    /// x86_64|aarch64`, feature `native`; CPU plans only).
    pub native: Option<crate::native::NativeTarget>,
    /// Passes of the default pipeline left out, by name (`quant_acts`: the
    /// int8 handoff between quantized layers; for A/B comparisons).
    pub skip_passes: Vec<&'static str>,
}

/// `--mesh`, `--shard`, `--shard-spec` and `--sharding-dialect`.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardConfig {
    pub mesh: kiln_ir::Mesh,
    pub strategy: kiln_passes::shard::Strategy,
    pub overrides: Vec<kiln_passes::shard::Override>,
    pub dialect: crate::stablehlo::sharding::ShardingDialect,
    /// What plans are costed with: the report's estimates and `auto`'s choice.
    pub cost: kiln_passes::shard::CostModel,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            target: Target::Cpu,
            verify_each: true,
            import: ImportOptions::default(),
            quantize: None,
            calibration: None,
            shard: None,
            buckets: None,
            native: None,
            skip_passes: Vec::new(),
        }
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
    /// With `--quantize`: every linear layer found, quantized or kept.
    pub quantized: Vec<LayerReport>,
    /// With `--quantize` and `--calibration`: per calibration sample, the
    /// cosine of the quantized program's outputs against the float one's.
    pub output_cosine: Option<Vec<f64>>,
    /// The sharding plan of an SPMD compile (`kiln compile --report`).
    pub sharding: Option<crate::stablehlo::sharding::ShardReport>,
}

/// Runs the pass pipeline on `graph` and produces the artifact for
/// `opts.target` ([`compile_graph_for`] with [`Backend::Cpu`]).
pub fn compile_graph(
    graph: Graph,
    opts: &CompileOptions,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    compile_graph_for(graph, opts, Backend::Cpu, metadata)
}

/// Runs `pipeline` on `graph` and produces a CPU plan (tests compare programs
/// compiled with and without a pass); the passes get `opts.target`'s description.
pub fn compile_graph_with_passes(
    mut graph: Graph,
    pipeline: &[Pass],
    opts: &CompileOptions,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    let pass_opts = Options { verify_each: opts.verify_each, ..Options::new(opts.target) };
    let passes = run_pipeline(&mut graph, pipeline, &pass_opts)?;
    // On the CPU the session owns every state's storage: updates are
    // written there during the run where the planner proves it safe.
    // With native code, an elementwise call's operands outlive the norm or
    // softmax it feeds, and a row op's operands the elementwise call reading
    // its result, so the two can merge (`native::compile_plan`).
    let mem_opts = MemoryOptions {
        state_in_place: true,
        row_prologues: opts.native.is_some(),
        row_epilogues: opts.native.is_some(),
        ..MemoryOptions::for_target(opts.target.desc())
    };
    let mem = plan_memory(&graph, &mem_opts)?;
    check_plan(&graph, &mem).map_err(CompileError::MemoryPlan)?;
    let (mut plan, weights) = lower_to_plan(&graph, &mem, opts.target.desc())?;
    let native = match &opts.native {
        Some(target) => native_section(&mut plan, target)?,
        None => None,
    };
    let summary = CompileSummary {
        passes,
        nodes: graph.order.len(),
        instructions: plan.instrs.len(),
        arena_bytes: plan.arena_bytes,
        peak_live_bytes: plan.peak_live_bytes,
        weights_bytes: weights.len(),
        quantized: Vec::new(),
        output_cosine: None,
        sharding: None,
    };
    let mut writer = ArtifactWriter::new(&plan, weights, &metadata)?;
    if let Some(native) = &native {
        writer.add_native(native)?;
    }
    Ok((writer, summary))
}

#[cfg(feature = "native")]
fn native_section(
    plan: &mut kiln_runtime::format::Plan,
    target: &crate::native::NativeTarget,
) -> Result<Option<kiln_runtime::native::NativeSection>, CompileError> {
    crate::native::compile_plan(plan, target).map_err(CompileError::Native)
}

#[cfg(not(feature = "native"))]
fn native_section(
    _plan: &mut kiln_runtime::format::Plan,
    _target: &crate::native::NativeTarget,
) -> Result<Option<kiln_runtime::native::NativeSection>, CompileError> {
    Err(CompileError::NoNative)
}

/// Runs the pass pipeline on `graph` and produces an artifact for `backend`'s
/// target: a CPU plan, or for a target with accelerator segments a mixed plan
/// with an accelerator section.
pub fn compile_graph_for(
    mut graph: Graph,
    opts: &CompileOptions,
    backend: Backend,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    let target = backend.target(opts.target);
    let opts = CompileOptions { target, ..opts.clone() };
    if opts.shard.is_some() && target.desc().segments.is_none() {
        return Err(CompileError::Shard(format!(
            "a mesh needs an accelerator target (--target pjrt), not `{}`",
            target.name()
        )));
    }
    let mut output_cosine = None;
    let quantizable = matches!(target, Target::Cpu | Target::Pjrt);
    if opts.quantize.is_some() && quantizable {
        // Canonical layers first: Core ATen writes some linear layers as a
        // bmm by an expanded weight, which quantization (and the
        // calibration that observes the same layers) would not see.
        // BatchNorms fold into their convolutions now, so that a convolution
        // is quantized with the weight it runs with.
        let pass_opts = Options::new(target);
        simplify(&mut graph, &pass_opts)?;
        kiln_passes::fold_batch_norms(&mut graph, &pass_opts)?;
        dce(&mut graph, &pass_opts)?;
    }
    let quantized = match &opts.quantize {
        Some(_) if !quantizable => return Err(CompileError::QuantizeTarget(target.to_string())),
        Some(cfg) => match opts.calibration.as_deref() {
            None if cfg.needs_calibration() => {
                return Err(CompileError::Calibration(
                    "this quantization mode (int8-static, or auto) needs --calibration DIR".into(),
                ))
            }
            None => quantize_weights(&mut graph, cfg)?,
            Some(dir) => {
                let samples = crate::calibrate::read_samples(dir)?;
                let mut cfg = cfg.clone();
                // Only the CPU kernels run depthwise convolutions on static
                // int8 activations (StableHLO segments run dense ones).
                cfg.int8_depthwise &= target == Target::Cpu;
                if cfg.uses_calibration() && cfg.activations.is_empty() {
                    cfg.activations = crate::calibrate::observe(&graph, &samples)?;
                }
                let planned = match cfg.auto_max_cosine_drop {
                    Some(max_drop) => crate::calibrate::choose_auto(&graph, &cfg, &samples, max_drop)?,
                    None => kiln_passes::plan_layers(&graph, &cfg)?,
                };
                let effect = crate::calibrate::measure(&graph, &planned, &samples)?;
                let mut reports = kiln_passes::apply_layers(&mut graph, planned)?;
                for (r, db) in reports.iter_mut().zip(&effect.layer_sqnr_db) {
                    r.output_sqnr_db = r.bits.map(|_| *db);
                }
                output_cosine = Some(effect.output_cosine);
                reports
            }
        },
        None => Vec::new(),
    };
    let (writer, summary) = match target.desc().segments {
        None => {
            let mut pipeline = default_pipeline(target);
            pipeline.retain(|p| !opts.skip_passes.contains(&p.name));
            compile_graph_with_passes(graph, &pipeline, &opts, metadata)
        }
        Some(_) => compile_graph_pjrt(graph, &opts, backend.precision(), metadata),
    }?;
    Ok((writer, CompileSummary { quantized, output_cosine, ..summary }))
}

/// The PJRT pipeline: the PJRT target keeps what the CPU keeps (linear, norms,
/// softmax, attention, pooling), which the StableHLO emitter expands itself
/// and which stay efficient CPU kernels where they fall back.
#[cfg(feature = "mlir")]
fn compile_graph_pjrt(
    mut graph: Graph,
    opts: &CompileOptions,
    precision: Precision,
    metadata: Metadata,
) -> Result<(ArtifactWriter, CompileSummary), CompileError> {
    let pass_opts = Options { verify_each: opts.verify_each, ..Options::new(opts.target) };
    let passes = run_pipeline(&mut graph, &default_pipeline(opts.target), &pass_opts)?;
    // Context parallelism rings `Op::Attention`s: the matmul–softmax–matmul
    // form (Core ATen's SDPA) is recognised first, as the CPU pipeline does,
    // and linears on batch × sequence rows keep their dims (so the
    // sequence split survives them).
    // `--shard auto` considers context parallelism where the mesh has a
    // `seq` axis, so it gets the same graph.
    let rings = opts.shard.as_ref().is_some_and(|s| {
        use kiln_passes::shard::{Strategy, SEQ_AXIS};
        s.strategy == Strategy::ContextParallel || (s.strategy == Strategy::Auto && s.mesh.axis(SEQ_AXIS).is_some())
    });
    if rings {
        let unflatten = kiln_passes::Pass { name: "unflatten_rows", run: kiln_passes::shard::unflatten_rows };
        let fuse =
            [unflatten, kiln_passes::SIMPLIFY, kiln_passes::FUSE_ATTENTION, kiln_passes::SIMPLIFY, kiln_passes::DCE];
        run_pipeline(&mut graph, &fuse, &pass_opts)?;
    }
    let nodes = graph.order.len();
    let spmd = match &opts.shard {
        Some(config) => Some(shard_for_pjrt(&mut graph, config, opts.verify_each)?),
        None => None,
    };
    let sharding = spmd.as_ref().map(|s| crate::stablehlo::sharding::ShardReport::new(&graph, s));
    let mut lowered =
        crate::stablehlo::lower_for_pjrt_with(&mut graph, precision, spmd.as_ref(), opts.buckets.as_ref())?;
    lowered.accel.estimate = sharding.as_ref().map(crate::stablehlo::sharding::ShardReport::estimate);
    let summary = CompileSummary {
        passes,
        nodes,
        instructions: lowered.plan.instrs.len(),
        arena_bytes: lowered.plan.arena_bytes,
        peak_live_bytes: lowered.plan.peak_live_bytes,
        weights_bytes: lowered.weights.len(),
        quantized: Vec::new(),
        output_cosine: None,
        sharding,
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

/// Shards the graph after the pipeline: strategy, overrides, propagation.
#[cfg(feature = "mlir")]
fn shard_for_pjrt(
    graph: &mut Graph,
    config: &ShardConfig,
    verify: bool,
) -> Result<crate::stablehlo::sharding::SpmdEmit, CompileError> {
    use kiln_passes::shard::{shard_graph, ShardOptions};
    let options = ShardOptions {
        mesh: config.mesh.clone(),
        strategy: config.strategy,
        overrides: config.overrides.clone(),
        inline_max_elements: crate::stablehlo::INLINE_CONST_MAX_ELEMENTS,
        cost: config.cost.clone(),
        manual_regions: config.dialect == crate::stablehlo::sharding::ShardingDialect::Shardy,
    };
    if matches!(config.strategy, kiln_passes::shard::Strategy::Pipeline { .. })
        && config.dialect != crate::stablehlo::sharding::ShardingDialect::Shardy
    {
        return Err(CompileError::Shard(
            "--shard pipeline writes manual regions, which need --sharding-dialect shardy (the default)".into(),
        ));
    }
    let plan = shard_graph(graph, &options).map_err(CompileError::Shard)?;
    if verify {
        kiln_ir::verify::verify(graph)
            .map_err(|e| CompileError::Shard(format!("the sharded graph does not verify (compiler bug): {e}")))?;
    }
    Ok(crate::stablehlo::sharding::SpmdEmit {
        mesh: config.mesh.clone(),
        dialect: config.dialect,
        reshards: plan.reshards,
        cost: plan.cost,
        cost_model: config.cost.clone(),
        auto: plan.auto,
        pipeline: plan.pipeline,
    })
}

#[cfg(not(feature = "mlir"))]
fn compile_graph_pjrt(
    _graph: Graph,
    _opts: &CompileOptions,
    _precision: Precision,
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
    let target = backend.target(opts.target);
    let segments = target.desc().segments.is_some();
    let imported = import_pt2_with(input, &opts.import)?;
    if segments && !cfg!(feature = "mlir") && imported.graph.states.is_empty() {
        return Err(CompileError::NoMlir);
    }
    let target = match (backend.precision(), &opts.native) {
        (p, _) if segments && p != Precision::F32 => format!("{target}-{}", p.name()),
        // `--target x86_64|aarch64`: kiln's kernels plus native code.
        (_, Some(native)) => match native.arch {
            kiln_runtime::native::NativeArch::X86_64 => "x86_64".to_string(),
            kiln_runtime::native::NativeArch::Aarch64 => "aarch64".to_string(),
        },
        _ => target.name().to_string(),
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
