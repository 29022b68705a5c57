//! The `kiln` command-line tool.

mod delta_cmd;

use clap::{Parser, Subcommand};
use kiln_compiler::npy::read_npy;
use kiln_compiler::stablehlo::sharding::{parse_mesh, ShardSpec, ShardingDialect};
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_file_for, Backend, CompileError, CompileOptions, ShardConfig};
use kiln_passes::shard::Strategy;
use kiln_passes::Target;
use kiln_runner::{cmd_inspect, cmd_run, human_bytes, load, CliResult, RunArgs};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Ahead-of-time compiler and runtime for PyTorch programs (torch.export .pt2)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// SPMD over several devices (`--target pjrt`).
#[derive(clap::Args, Default)]
struct ShardArgs {
    /// Device mesh, axes major to minor: `data=2,model=2`. The program runs on that many
    /// devices at once as one StableHLO program that XLA partitions.
    #[arg(long)]
    mesh: Option<String>,
    /// Strategy: `data-parallel` (inputs split on batch), `tensor-parallel` (Megatron
    /// column/row linears), `fsdp` (weights split over the data axis too), `expert-parallel`
    /// (experts split over the model axis, tokens dispatched by all-to-all), `replicated`,
    /// `pipeline` (the repeated blocks over a `stage` axis, microbatches passed stage to stage),
    /// `context-parallel` (sequences split over a `seq` axis, ring attention), or `auto` (the
    /// cheapest plan under --shard-cost, chosen per layer; --report explains it).
    #[arg(long, default_value = "data-parallel")]
    shard: String,
    /// Microbatches of `--shard pipeline` (they must divide the batch rows each device holds);
    /// default: the largest count up to twice the stages that does.
    #[arg(long)]
    microbatches: Option<u32>,
    /// The cost model plans are estimated with (and `--shard auto` chooses by, and a causal
    /// ring its zig-zag or plain layout), SI units:
    /// `flops=1e14,memory=16e9,link=1e11,link.model=4e11,latency=1e-5` (FLOP/s per device,
    /// bytes per device, bytes/s per link and per named axis, seconds per collective).
    #[arg(long, default_value = "")]
    shard_cost: String,
    /// JSON file with per-tensor overrides by Python name or glob, and the device order:
    /// `{"devices": [..], "overrides": [{"tensor": "fc1.*", "sharding": [["model"], []]}]}`.
    #[arg(long)]
    shard_spec: Option<PathBuf>,
    /// Annotations of the sharded program: `shardy` or `gspmd`.
    #[arg(long, default_value = "shardy")]
    sharding_dialect: String,
    /// Shape buckets for dynamic dims (`--target pjrt`): `s77=8,16,32` (the symbol names
    /// `kiln inspect` prints; `;` or a second --buckets for more symbols) or `auto`
    /// (powers of two within each dim's bounds). One executable per bucket.
    #[arg(long)]
    buckets: Vec<String>,
}

impl ShardArgs {
    fn buckets(&self) -> Result<Option<kiln_compiler::stablehlo::buckets::BucketSpec>, String> {
        use kiln_compiler::stablehlo::buckets::BucketSpec;
        if self.buckets.is_empty() {
            return Ok(None);
        }
        BucketSpec::parse(&self.buckets.join(";")).map(Some)
    }
}

impl ShardArgs {
    fn config(&self) -> Result<Option<ShardConfig>, String> {
        let Some(mesh) = &self.mesh else {
            if self.shard_spec.is_some() {
                return Err("--shard-spec needs --mesh".into());
            }
            if !self.shard_cost.is_empty() {
                return Err("--shard-cost needs --mesh".into());
            }
            if self.microbatches.is_some() {
                return Err("--microbatches needs --mesh and --shard pipeline".into());
            }
            return Ok(None);
        };
        let mut mesh = parse_mesh(mesh)?;
        let mut strategy = Strategy::from_name(&self.shard).ok_or_else(|| {
            format!(
                "unknown --shard `{}` (known: data-parallel, tensor-parallel, fsdp, expert-parallel, pipeline, \
                 context-parallel, replicated, auto)",
                self.shard
            )
        })?;
        match (&mut strategy, self.microbatches) {
            (Strategy::Pipeline { microbatches }, Some(m)) if m >= 1 => *microbatches = m,
            (_, None) => {}
            (Strategy::Pipeline { .. }, Some(_)) => return Err("--microbatches must be at least 1".into()),
            (_, Some(_)) => return Err("--microbatches needs --shard pipeline".into()),
        }
        let dialect = ShardingDialect::from_name(&self.sharding_dialect)
            .ok_or_else(|| format!("unknown --sharding-dialect `{}` (known: shardy, gspmd)", self.sharding_dialect))?;
        let mut overrides = Vec::new();
        if let Some(path) = &self.shard_spec {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let spec = ShardSpec::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            overrides = spec.overrides();
            mesh.devices.clone_from(&spec.devices);
            let problems = mesh.problems();
            if !problems.is_empty() {
                return Err(format!("{}: {}", path.display(), problems.join("; ")));
            }
        }
        let cost = kiln_passes::shard::CostModel::parse(&self.shard_cost)?;
        Ok(Some(ShardConfig { mesh, strategy, overrides, dialect, cost }))
    }
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Compile a program saved by torch.export.save into a .kiln artifact.
    #[command(after_help = "Example:\n  kiln compile model.pt2 -o model.kiln")]
    Compile {
        /// The .pt2 file (torch 2.5 – 2.15).
        model: PathBuf,
        /// Where to write the artifact.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        target: TargetArgs,
        /// Arithmetic of accelerator segments (`--target pjrt`): `f32` or `bf16` (bf16 compute,
        /// f32 accumulation, f32 at segment boundaries).
        #[arg(long, default_value = "f32")]
        precision: String,
        #[command(flatten)]
        quant: QuantArgs,
        #[command(flatten)]
        shard: ShardArgs,
        /// Report what the compiler decided: with a mesh, the sharding plan (per tensor
        /// sharding, bytes per device, collectives) on stdout; with --quantize, per layer
        /// weight SQNR and bytes saved as JSON, written to PATH (stdout without one).
        #[arg(long, value_name = "PATH", num_args = 0..=1)]
        report: Option<Option<PathBuf>>,
    },
    /// Run an artifact with inputs from .npy files.
    #[command(
        after_help = "Examples:\n  kiln run model.kiln --input 0=x.npy --output-dir out/\n  kiln run model.kiln --input x=x.npy --json\n  kiln run model.kiln --input x=x.npy --device tpu\n\nKILN_PJRT_PLUGIN=/path/plugin.so overrides where `tpu` and `gpu` find their PJRT plugin, and\nselects that plugin when --device is not given and the artifact has accelerator segments."
    )]
    Run(Box<RunArgs>),
    /// Describe an artifact: inputs, outputs, kernels, memory.
    #[command(after_help = "Example:\n  kiln inspect model.kiln --json")]
    Inspect {
        artifact: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Compile and run the bundled example model (an MLP) and compare with PyTorch.
    Demo,
    /// Write a delta that turns OLD into NEW (only what changed is carried).
    #[command(after_help = "Example:\n  kiln diff old.kiln new.kiln -o update.kdelta")]
    Diff {
        old: PathBuf,
        new: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Apply a delta from `kiln diff` to OLD; the result is byte-identical to the NEW it was made
    /// from (checked by SHA-256 before anything is written).
    #[command(after_help = "Example:\n  kiln patch old.kiln update.kdelta -o new.kiln")]
    Patch {
        old: PathBuf,
        delta: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Print the support table: ATen ops, dtypes, limits, and Core ATen coverage.
    #[command(after_help = "Example:\n  kiln ops\n  kiln ops --markdown > compiler/OPS.md")]
    Ops {
        /// Print the Markdown page (compiler/OPS.md) instead of the text table.
        #[arg(long)]
        markdown: bool,
        /// List the built-in lowerings of library custom ops instead.
        #[arg(long)]
        custom: bool,
    },
}

/// `--quantize auto`'s budget when `--max-cosine-drop` is not given.
const DEFAULT_MAX_COSINE_DROP: f64 = 0.005;

#[derive(clap::Args, Default)]
struct QuantArgs {
    /// Quantize the linear layers and convolutions (convolutions: int8 weights in every mode,
    /// int8 activations per image for dense ones in the int8 modes): `int8-weight` (per
    /// channel, symmetric),
    /// `int8-dynamic[:sym]` (int8 weights and per-row int8 activations, each row with its own
    /// scale and zero point; `:sym` torchao's per-token symmetric rule),
    /// `int8-static[:observer=minmax|percentile[=P]|mse]` (int8 weights, per-tensor int8
    /// activations calibrated on --calibration samples), or
    /// `int4-weight[:group=32|64|128][:asym][:clip=none]` (group-wise, two a byte; scales
    /// chosen by MSE clipping unless `clip=none`), or `auto[:MODE]` (per layer MODE —
    /// default int8-dynamic —, int8-weight or f32, chosen on the --calibration samples by
    /// measured sensitivity to keep the output cosine within --max-cosine-drop).
    #[arg(long, value_name = "MODE")]
    quantize: Option<String>,
    /// With `--quantize auto`: the largest drop of the output cosine against the float
    /// program, on the worst calibration sample.
    #[arg(long, value_name = "X")]
    max_cosine_drop: Option<f64>,
    /// Keep the weights whose Python name matches GLOB (`*`, `?`) in f32; repeatable.
    #[arg(long, value_name = "GLOB")]
    quantize_skip: Vec<String>,
    /// Keep the first layer (linear or convolution) in f32.
    #[arg(long)]
    quantize_keep_first: bool,
    /// Keep the last layer (linear or convolution) in f32.
    #[arg(long)]
    quantize_keep_last: bool,
    /// Calibration samples: DIR/sample_0/input_0.npy, … (the float program runs on each
    /// to observe the layers' inputs). Needed by `int8-static`; `int4-weight` uses them
    /// for activation-aware scales and GPTQ, `int8-dynamic` to smooth outlier channels.
    #[arg(long, value_name = "DIR")]
    calibration: Option<PathBuf>,
}

impl QuantArgs {
    fn config(&self) -> Result<Option<kiln_passes::QuantizeConfig>, String> {
        let Some(mode) = &self.quantize else {
            let stray = !self.quantize_skip.is_empty()
                || self.quantize_keep_first
                || self.quantize_keep_last
                || self.calibration.is_some()
                || self.max_cosine_drop.is_some();
            return if stray { Err("--quantize-* options need --quantize MODE".into()) } else { Ok(None) };
        };
        let (scheme, auto) = match mode.strip_prefix("auto") {
            Some("") => (kiln_passes::QuantScheme::Int8Dynamic { asymmetric: true }, true),
            Some(base) if base.starts_with(':') => (kiln_passes::QuantScheme::parse(&base[1..])?, true),
            _ => (kiln_passes::QuantScheme::parse(mode)?, false),
        };
        let auto_max_cosine_drop = match (auto, self.max_cosine_drop) {
            (true, Some(x)) if x.is_finite() && (0.0..=2.0).contains(&x) => Some(x),
            (true, Some(x)) => return Err(format!("--max-cosine-drop {x} must be in [0, 2]")),
            (true, None) => Some(DEFAULT_MAX_COSINE_DROP),
            (false, Some(_)) => return Err("--max-cosine-drop needs --quantize auto[:MODE]".into()),
            (false, None) => None,
        };
        Ok(Some(kiln_passes::QuantizeConfig {
            skip: self.quantize_skip.clone(),
            keep_first: self.quantize_keep_first,
            keep_last: self.quantize_keep_last,
            auto_max_cosine_drop,
            ..kiln_passes::QuantizeConfig::new(scheme)
        }))
    }
}

/// The `--report` document: one entry per linear layer.
fn quant_report(layers: &[kiln_passes::LayerReport], output_cosine: Option<&[f64]>) -> serde_json::Value {
    let finite = |x: f64| if x.is_finite() { json!(x) } else { json!(null) };
    let rows: Vec<_> = layers
        .iter()
        .map(|l| {
            json!({
                "name": l.name, "out_features": l.n, "in_features": l.k, "bits": l.bits, "group": l.group,
                "float_bytes": l.float_bytes, "quantized_bytes": l.quant_bytes,
                "bytes_saved": if l.bits.is_some() { l.float_bytes.saturating_sub(l.quant_bytes) } else { 0 },
                "weight_sqnr_db": if l.bits.is_some() { finite(l.weight_sqnr_db) } else { json!(null) },
                "act_scale": l.act_qparams.map(|(s, _)| s), "act_zero_point": l.act_qparams.map(|(_, z)| z),
                "output_sqnr_db": l.output_sqnr_db.map(finite),
                "note": l.note,
            })
        })
        .collect();
    let float: usize = layers.iter().map(|l| l.float_bytes).sum();
    let quant: usize = layers.iter().map(|l| if l.bits.is_some() { l.quant_bytes } else { l.float_bytes }).sum();
    // Per calibration sample, the quantized outputs against the float ones.
    let cosine = output_cosine.filter(|c| !c.is_empty()).map(|c| {
        let mean = c.iter().sum::<f64>() / c.len() as f64;
        json!({"mean": mean, "min": c.iter().copied().fold(f64::INFINITY, f64::min), "per_sample": c})
    });
    json!({"layers": rows, "linear_float_bytes": float, "linear_bytes": quant, "output_cosine_vs_float": cosine})
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compile { model, output, target, precision, quant, shard, report } => {
            cmd_compile(&model, &output, &target, &precision, &quant, &shard, report.as_ref())
        }
        Command::Run(args) => cmd_run(&args),
        Command::Inspect { artifact, json } => cmd_inspect(&artifact, json),
        Command::Demo => cmd_demo(),
        Command::Ops { markdown, custom } => cmd_ops(markdown, custom),
        Command::Diff { old, new, output } => delta_cmd::cmd_diff(&old, &new, &output),
        Command::Patch { old, delta, output } => delta_cmd::cmd_patch(&old, &delta, &output),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_ops(markdown: bool, custom: bool) -> CliResult {
    use kiln_compiler::import::support::{core_aten_status, supported_ops, CORE_ATEN};
    if custom {
        for b in kiln_compiler::import::builtin::BUILTINS {
            println!("{:<36} {}", b.name, b.note);
        }
        return Ok(());
    }
    if markdown {
        print!("{}", kiln_compiler::import::support::render_markdown());
        return Ok(());
    }
    println!("{:<36} {:<44} notes", "op", "dtypes");
    for row in supported_ops() {
        let dtypes = if row.dtypes.is_empty() { "-".to_string() } else { row.dtypes.join(" ") };
        for name in row.names {
            println!("{name:<36} {dtypes:<44} {}", row.note);
        }
    }
    let missing: Vec<&str> = CORE_ATEN.iter().copied().filter(|o| core_aten_status(o).is_some()).collect();
    println!("\nCore ATen (torch 2.15): {} of {} overloads imported", CORE_ATEN.len() - missing.len(), CORE_ATEN.len());
    for o in missing {
        println!("  missing {o:<40} {}", core_aten_status(o).unwrap_or(""));
    }
    Ok(())
}

/// `--target` and `--cpu`.
#[derive(clap::Args, Debug)]
struct TargetArgs {
    /// Target: `cpu` (kiln's kernels), `primitive` (cpu with every composite decomposed),
    /// `pjrt` (StableHLO segments for a PJRT plugin, CPU kernels for the rest; needs a
    /// kiln built with `--features mlir`), or `x86_64` / `aarch64` (cpu plus native code
    /// for the fused elementwise groups; needs `--features native`).
    #[arg(long, default_value = "cpu")]
    target: String,
    /// CPU levels of the native code, comma-separated, chosen at load by CPU detection:
    /// `x86-64`, `x86-64-v3`, `x86-64-v4` (default `x86-64,x86-64-v3`) or `generic`,
    /// `neoverse-n1`, `cortex-a78ae` (default `generic`).
    #[arg(long)]
    cpu: Option<String>,
    /// Keep elementwise calls after native row functions (norms, softmax, last-axis
    /// reductions) as calls of their own instead of merging them in as epilogues: the
    /// same bits, to measure what merging gains.
    #[arg(long)]
    no_row_epilogues: bool,
}

fn cmd_compile(
    model: &Path,
    output: &Path,
    target_args: &TargetArgs,
    precision: &str,
    quant: &QuantArgs,
    shard: &ShardArgs,
    report: Option<&Option<PathBuf>>,
) -> CliResult {
    let precision =
        Precision::from_name(precision).ok_or_else(|| format!("unknown precision `{precision}` (known: f32, bf16)"))?;
    let native_arch = kiln_compiler::native::NativeTarget::arch_from_name(&target_args.target);
    let native = match native_arch {
        Some(arch) => Some(kiln_compiler::native::NativeTarget {
            row_epilogues: !target_args.no_row_epilogues,
            ..kiln_compiler::native::NativeTarget::new(arch, target_args.cpu.as_deref())?
        }),
        None if target_args.cpu.is_some() => return Err("--cpu needs --target x86_64 or aarch64".into()),
        None if target_args.no_row_epilogues => {
            return Err("--no-row-epilogues needs --target x86_64 or aarch64".into())
        }
        None => None,
    };
    let target_name = if native.is_some() { "cpu" } else { target_args.target.as_str() };
    let target = Target::from_name(target_name).ok_or_else(|| {
        let known: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
        format!("unknown target `{}` (known: {}, x86_64, aarch64)", target_args.target, known.join(", "))
    })?;
    let backend = Backend::for_target(target, precision);
    if backend == Backend::Cpu && precision != Precision::F32 {
        return Err("--precision applies to --target pjrt only".into());
    }
    let started = Instant::now();
    let opts = CompileOptions {
        target,
        verify_each: false,
        quantize: quant.config()?,
        calibration: quant.calibration.clone(),
        shard: shard.config()?,
        buckets: shard.buckets()?,
        native,
        ..CompileOptions::default()
    };
    if opts.shard.is_some() && backend == Backend::Cpu {
        return Err("--mesh needs --target pjrt".into());
    }
    if opts.buckets.is_some() && backend == Backend::Cpu {
        return Err("--buckets needs --target pjrt".into());
    }
    if report.is_some() && opts.quantize.is_none() && opts.shard.is_none() {
        return Err("--report needs --quantize or --mesh".into());
    }
    let s = compile_file_for(model, output, &opts, backend).map_err(|e| match e {
        CompileError::NoMlir | CompileError::NoNative => e.to_string(),
        e => format!("{}: {e}", model.display()),
    })?;
    println!(
        "compiled {} -> {} (target {}) in {:.0} ms: {} instructions, arena {} (peak live {}), weights {}",
        model.display(),
        output.display(),
        match (&opts.native, backend) {
            (Some(n), _) => format!("{}, cpu levels {}", target_args.target, n.levels.join(",")),
            (None, Backend::Cpu) => target.to_string(),
            (None, _) => format!("{target}, {}", precision.name()),
        },
        started.elapsed().as_secs_f64() * 1e3,
        s.instructions,
        human_bytes(s.arena_bytes),
        human_bytes(s.peak_live_bytes),
        human_bytes(s.weights_bytes as u64),
    );
    if quant.quantize.is_some() {
        let done = s.quantized.iter().filter(|l| l.bits.is_some()).count();
        println!("quantized {done} of {} layers", s.quantized.len());
        for l in s.quantized.iter().filter(|l| l.bits.is_none()) {
            println!("  kept {}: {}", l.name, l.note);
        }
    }
    if let (Some(path), true) = (report, quant.quantize.is_some()) {
        let text = format!("{:#}\n", quant_report(&s.quantized, s.output_cosine.as_deref()));
        match path {
            Some(path) => std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?,
            None => print!("{text}"),
        }
    }
    if let Some(plan) = s.sharding.as_ref().filter(|_| report.is_some()) {
        plan.lines().iter().for_each(|l| println!("{l}"));
    }
    Ok(())
}

fn cmd_demo() -> CliResult {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlp");
    let model = dir.join("training.pt2");
    let artifact = std::env::temp_dir().join(format!("kiln-demo-{}.kiln", std::process::id()));
    let cpu = TargetArgs { target: "cpu".into(), cpu: None, no_row_epilogues: false };
    cmd_compile(&model, &artifact, &cpu, "f32", &QuantArgs::default(), &ShardArgs::default(), None)?;
    let program = load(&artifact)?;
    let _ = std::fs::remove_file(&artifact);
    let input = read_npy(&dir.join("input_0.npy")).map_err(|e| e.to_string())?;
    let expected = read_npy(&dir.join("output_0.npy")).map_err(|e| e.to_string())?;
    let mut session = program.session().map_err(|e| e.to_string())?;
    let outputs = session.run(&[input.view()]).map_err(|e| e.to_string())?;
    let got = outputs.to_tensors().remove(0);
    let (got, want) = (got.to_f32().ok_or("demo output is not f32")?, expected.to_f32().ok_or("reference is not f32")?);
    let max_err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    println!("ran {} on input {:?}: output {:?}", model.display(), input.shape, outputs.get(0).shape);
    println!("first values: {:?}", &got[..got.len().min(5)]);
    println!("max |kiln - pytorch| = {max_err:.3e}");
    if got.len() != want.len() || max_err > 1e-4 {
        return Err(format!("demo output differs from PyTorch (max error {max_err:e})"));
    }
    println!("matches PyTorch.");
    Ok(())
}
