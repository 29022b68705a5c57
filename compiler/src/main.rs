//! The `kiln` command-line tool.

mod delta_cmd;

use clap::{Parser, Subcommand};
use kiln_compiler::npy::{read_npy, write_npy};
use kiln_compiler::stablehlo::sharding::{parse_mesh, ShardSpec, ShardingDialect};
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::{compile_file_for, Backend, CompileError, CompileOptions, ShardConfig};
use kiln_passes::shard::Strategy;
use kiln_passes::Target;
use kiln_runtime::{DType, Device, Program, SessionOptions, Tensor, TensorView};
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
    /// column/row linears), `fsdp` (weights split over the data axis too) or `replicated`.
    #[arg(long, default_value = "data-parallel")]
    shard: String,
    /// JSON file with per-tensor overrides by Python name or glob, and the device order:
    /// `{"devices": [..], "overrides": [{"tensor": "fc1.*", "sharding": [["model"], []]}]}`.
    #[arg(long)]
    shard_spec: Option<PathBuf>,
    /// Annotations of the sharded program: `shardy` or `gspmd`.
    #[arg(long, default_value = "shardy")]
    sharding_dialect: String,
}

impl ShardArgs {
    fn config(&self) -> Result<Option<ShardConfig>, String> {
        let Some(mesh) = &self.mesh else {
            if self.shard_spec.is_some() {
                return Err("--shard-spec needs --mesh".into());
            }
            return Ok(None);
        };
        let mut mesh = parse_mesh(mesh)?;
        let strategy = Strategy::from_name(&self.shard).ok_or_else(|| {
            format!("unknown --shard `{}` (known: data-parallel, tensor-parallel, fsdp, replicated)", self.shard)
        })?;
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
        Ok(Some(ShardConfig { mesh, strategy, overrides, dialect }))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Compile a program saved by torch.export.save into a .kiln artifact.
    #[command(after_help = "Example:\n  kiln compile model.pt2 -o model.kiln")]
    Compile {
        /// The .pt2 file (torch 2.9 – 2.15).
        model: PathBuf,
        /// Where to write the artifact.
        #[arg(short, long)]
        output: PathBuf,
        /// Target: `cpu` (kiln's kernels), `primitive` (cpu with every composite decomposed)
        /// or `pjrt` (StableHLO segments for a PJRT plugin, CPU kernels for the rest; needs a
        /// kiln built with `--features mlir`).
        #[arg(long, default_value = "cpu")]
        target: String,
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
    Run(RunArgs),
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

#[derive(clap::Args)]
struct RunArgs {
    artifact: PathBuf,
    /// `INDEX=path.npy` or `NAME=path.npy`; one per program input.
    #[arg(short, long = "input", value_name = "INDEX|NAME=PATH")]
    inputs: Vec<String>,
    /// Write outputs as output_0.npy, output_1.npy, … here (with --steps:
    /// step_<k>/output_<i>.npy).
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Run the steps in DIR (step_0/, step_1/, … each with input_<index>.npy or
    /// input_<name>.npy) in order through one session: state carries over.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["inputs", "repeat", "profile"])]
    steps: Option<PathBuf>,
    /// Print a machine-readable summary.
    #[arg(long)]
    json: bool,
    /// Run this many times after one warm-up run and report latency (median, p90, min).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Report the time spent in each instruction (averaged over the runs).
    #[arg(long)]
    profile: bool,
    /// Threads the CPU kernels split their work over [default: $KILN_NUM_THREADS, else the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: Option<u32>,
    /// `cpu` (kiln's kernels), `tpu`, `gpu` or `pjrt:PATH` (a PJRT plugin) [default: cpu].
    #[arg(long)]
    device: Option<String>,
    /// Which of the accelerator's addressable devices to use.
    #[arg(long, default_value_t = 0)]
    device_index: usize,
    /// Refuse artifacts whose activation memory exceeds this (bytes, or with
    /// a K/M/G suffix) [default: 8G].
    #[arg(long, value_parser = parse_bytes)]
    max_memory: Option<u64>,
}

/// `kiln compile`'s quantization options.
#[derive(clap::Args, Default)]
struct QuantArgs {
    /// Quantize the linear layers' weights: `int8-weight` (per channel, symmetric),
    /// `int8-dynamic` (int8 weights and per-row int8 activations),
    /// `int8-static[:observer=minmax|percentile[=P]|mse]` (int8 weights, per-tensor int8
    /// activations calibrated on --calibration samples), or
    /// `int4-weight[:group=32|64|128][:asym][:clip=none]` (group-wise, two a byte; scales
    /// chosen by MSE clipping unless `clip=none`).
    #[arg(long, value_name = "MODE")]
    quantize: Option<String>,
    /// Keep the weights whose Python name matches GLOB (`*`, `?`) in f32; repeatable.
    #[arg(long, value_name = "GLOB")]
    quantize_skip: Vec<String>,
    /// Keep the first linear layer in f32.
    #[arg(long)]
    quantize_keep_first: bool,
    /// Keep the last linear layer in f32.
    #[arg(long)]
    quantize_keep_last: bool,
    /// Calibration samples for `int8-static`: DIR/sample_0/input_0.npy, … (the float
    /// program runs on each to observe the layers' input ranges).
    #[arg(long, value_name = "DIR")]
    calibration: Option<PathBuf>,
}

impl QuantArgs {
    fn config(&self) -> Result<Option<kiln_passes::QuantizeConfig>, String> {
        let Some(mode) = &self.quantize else {
            let stray = !self.quantize_skip.is_empty()
                || self.quantize_keep_first
                || self.quantize_keep_last
                || self.calibration.is_some();
            return if stray { Err("--quantize-* options need --quantize MODE".into()) } else { Ok(None) };
        };
        let scheme = kiln_passes::QuantScheme::parse(mode)?;
        Ok(Some(kiln_passes::QuantizeConfig {
            scheme,
            skip: self.quantize_skip.clone(),
            keep_first: self.quantize_keep_first,
            keep_last: self.quantize_keep_last,
            activations: Vec::new(),
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

/// `4096`, `64K`, `512M`, `8G` (binary multiples) as bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 30),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 20),
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 10),
        t => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{s}` is not a size such as 4096, 512M or 8G"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("`{s}` is too large"))
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

type CliResult = Result<(), String>;

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

fn cmd_compile(
    model: &Path,
    output: &Path,
    target: &str,
    precision: &str,
    quant: &QuantArgs,
    shard: &ShardArgs,
    report: Option<&Option<PathBuf>>,
) -> CliResult {
    let precision =
        Precision::from_name(precision).ok_or_else(|| format!("unknown precision `{precision}` (known: f32, bf16)"))?;
    let target = Target::from_name(target).ok_or_else(|| {
        let known: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
        format!("unknown target `{target}` (known: {})", known.join(", "))
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
        ..CompileOptions::default()
    };
    if opts.shard.is_some() && backend == Backend::Cpu {
        return Err("--mesh needs --target pjrt".into());
    }
    if report.is_some() && opts.quantize.is_none() && opts.shard.is_none() {
        return Err("--report needs --quantize or --mesh".into());
    }
    let s = compile_file_for(model, output, &opts, backend).map_err(|e| match e {
        CompileError::NoMlir => e.to_string(),
        e => format!("{}: {e}", model.display()),
    })?;
    println!(
        "compiled {} -> {} (target {}) in {:.0} ms: {} instructions, arena {} (peak live {}), weights {}",
        model.display(),
        output.display(),
        if backend == Backend::Cpu { target.to_string() } else { format!("{target}, {}", precision.name()) },
        started.elapsed().as_secs_f64() * 1e3,
        s.instructions,
        human_bytes(s.arena_bytes),
        human_bytes(s.peak_live_bytes),
        human_bytes(s.weights_bytes as u64),
    );
    if quant.quantize.is_some() {
        let done = s.quantized.iter().filter(|l| l.bits.is_some()).count();
        println!("quantized {done} of {} linear layers", s.quantized.len());
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

fn load(artifact: &Path) -> Result<std::sync::Arc<Program>, String> {
    Program::load(artifact).map_err(|e| match e {
        kiln_runtime::Error::Io { .. } => e.to_string(),
        e => format!("{}: {e}", artifact.display()),
    })
}

/// Resolves `--input` specs into one tensor per program input, in order.
fn gather_inputs(program: &Program, specs: &[String]) -> Result<Vec<Tensor>, String> {
    let declared = program.inputs();
    let mut slots: Vec<Option<Tensor>> = vec![None; declared.len()];
    for spec in specs {
        let (key, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input `{spec}`: expected INDEX=path.npy or NAME=path.npy"))?;
        let index = match key.parse::<usize>() {
            Ok(i) if i < declared.len() => i,
            Ok(i) => {
                return Err(format!(
                    "--input `{spec}`: the program has {} inputs, index {i} is out of range",
                    declared.len()
                ))
            }
            Err(_) => declared.iter().position(|d| d.name == key).ok_or_else(|| {
                let names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
                format!("--input `{spec}`: no input named `{key}` (inputs: {})", names.join(", "))
            })?,
        };
        if slots[index].is_some() {
            return Err(format!("input {index} (`{}`) given twice", declared[index].name));
        }
        slots[index] = Some(read_npy(Path::new(path)).map_err(|e| e.to_string())?);
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.ok_or_else(|| {
                format!(
                    "missing input {i} (`{}`: {} [{}]); pass --input {i}=path.npy",
                    declared[i].name,
                    declared[i].dtype,
                    declared[i].shape.join(", ")
                )
            })
        })
        .collect()
}

fn stats(t: &TensorView<'_>) -> Option<(f64, f64, f64)> {
    let vals: Vec<f64> = match t.dtype {
        DType::F32 => t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        DType::F64 => t.data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
        DType::I64 => {
            t.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64).collect()
        }
        _ => return None,
    };
    if vals.is_empty() {
        return None;
    }
    let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let max = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((min, max, vals.iter().sum::<f64>() / vals.len() as f64))
}

/// Latency statistics in milliseconds over `repeat` timed runs after a warm-up.
struct Latency {
    median: f64,
    p90: f64,
    min: f64,
}

fn time_runs(session: &mut kiln_runtime::Session, views: &[TensorView<'_>], repeat: u32) -> Result<Latency, String> {
    session.run(views).map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(repeat as usize);
    for _ in 0..repeat {
        let started = Instant::now();
        session.run(views).map_err(|e| e.to_string())?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok(Latency { median: at(0.5), p90: at(0.9), min: times[0] })
}

/// `--device`, else `pjrt:$KILN_PJRT_PLUGIN` for an artifact that needs an
/// accelerator, else the CPU.
fn choose_device(program: &Program, flag: Option<&str>) -> Result<Device, String> {
    match flag {
        Some(s) => s.parse().map_err(|e: kiln_runtime::Error| e.to_string()),
        None => match std::env::var_os("KILN_PJRT_PLUGIN").filter(|v| !v.is_empty()) {
            Some(p) if program.needs_accelerator() => Ok(Device::Pjrt(PathBuf::from(p))),
            _ => Ok(Device::Cpu),
        },
    }
}

/// `kiln run --steps DIR`: every step through one session, outputs per step,
/// per-step latency with `--json`.
fn cmd_run_steps(args: &RunArgs, dir: &Path) -> CliResult {
    let program = load(&args.artifact)?;
    let steps = kiln_compiler::steps::step_dirs(dir)?;
    let declared = program.inputs();
    let defaults = SessionOptions::default();
    let max_arena_bytes = args.max_memory.unwrap_or(defaults.max_arena_bytes);
    let device = choose_device(&program, args.device.as_deref())?;
    let options = SessionOptions { device, device_index: args.device_index, max_arena_bytes, ..defaults };
    let mut session = program.session_with(&options).map_err(|e| e.to_string())?;
    let mut report = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        let inputs = kiln_compiler::steps::read_step(step, &declared)?;
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let started = Instant::now();
        let outputs = session.run(&views).map_err(|e| format!("step {k}: {e}"))?;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(out_dir) = &args.output_dir {
            let step_out = out_dir.join(format!("step_{k}"));
            std::fs::create_dir_all(&step_out).map_err(|e| format!("{}: {e}", step_out.display()))?;
            for (i, out) in outputs.iter().enumerate() {
                write_npy(&step_out.join(format!("output_{i}.npy")), &out).map_err(|e| e.to_string())?;
            }
        }
        if !args.json {
            println!("step {k}: {} outputs in {elapsed_ms:.3} ms", outputs.len());
        }
        report.push(json!({ "step": k, "latency_ms": elapsed_ms }));
    }
    if args.json {
        let states: Vec<&str> = session.state_names().collect();
        println!(
            "{}",
            json!({ "artifact": args.artifact.display().to_string(), "device": options.device.to_string(),
                    "states": states, "steps": report })
        );
    }
    Ok(())
}

fn cmd_run(args: &RunArgs) -> CliResult {
    if let Some(dir) = &args.steps {
        return cmd_run_steps(args, dir);
    }
    let (artifact, specs, output_dir, as_json, repeat) =
        (args.artifact.as_path(), &args.inputs[..], args.output_dir.as_deref(), args.json, args.repeat);
    let (device, device_index) = (args.device.as_deref(), args.device_index);
    let program = load(artifact)?;
    let inputs = gather_inputs(&program, specs)?;
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let defaults = SessionOptions::default();
    let max_arena_bytes = args.max_memory.unwrap_or(defaults.max_arena_bytes);
    let threads = args.threads.map_or(defaults.threads, |t| t as usize);
    let options =
        SessionOptions { device: choose_device(&program, device)?, device_index, max_arena_bytes, threads, ..defaults };
    let mut session = program.session_with(&options).map_err(|e| e.to_string())?;
    let accel_json = session.accel_info().map(|a| {
        if !as_json {
            println!(
                "device: {} #{} ({}, {} {}), {} segments: {} compiled, {} from cache{}",
                a.device_kind, a.device_id, a.plugin.display(), a.platform_name, a.platform_version, a.segments, a.compiled, a.cache_hits,
                if a.partitions > 1 { format!("; SPMD over {} devices", a.partitions) } else { String::new() }
            );
        }
        json!({
            "plugin": a.plugin.display().to_string(), "platform": a.platform_name, "platform_version": a.platform_version,
            "device_id": a.device_id, "device_kind": a.device_kind, "segments": a.segments,
            "compiled": a.compiled, "cache_hits": a.cache_hits, "partitions": a.partitions,
        })
    });
    if args.profile {
        session.enable_profiling();
    }
    let latency = if repeat > 1 { Some(time_runs(&mut session, &views, repeat)?) } else { None };
    let started = Instant::now();
    let outputs = session.run(&views).map_err(|e| e.to_string())?;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    if let Some(dir) = output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut report = Vec::new();
    for (i, out) in outputs.iter().enumerate() {
        let path = output_dir.map(|d| d.join(format!("output_{i}.npy")));
        if let Some(p) = &path {
            write_npy(p, &out).map_err(|e| e.to_string())?;
        }
        let s = stats(&out);
        if !as_json {
            let stat = s.map(|(lo, hi, mean)| format!("  min {lo:.6} max {hi:.6} mean {mean:.6}")).unwrap_or_default();
            let saved = path.as_ref().map(|p| format!("  -> {}", p.display())).unwrap_or_default();
            println!("output {i} `{}`: {} {:?}{stat}{saved}", outputs.name(i), out.dtype, out.shape);
        }
        report.push(json!({
            "index": i, "name": outputs.name(i), "dtype": out.dtype.name(), "shape": out.shape,
            "path": path.map(|p| p.display().to_string()),
            "min": s.map(|s| s.0), "max": s.map(|s| s.1), "mean": s.map(|s| s.2),
        }));
    }
    let latency_json =
        latency.as_ref().map(|l| json!({"runs": repeat, "median_ms": l.median, "p90_ms": l.p90, "min_ms": l.min}));
    let profile_json = session.profile().map(|p| profile_report(&program, p, as_json));
    if as_json {
        println!(
            "{}",
            json!({ "artifact": artifact.display().to_string(), "device": options.device.to_string(), "accelerator": accel_json,
                    "threads": options.threads, "elapsed_ms": elapsed_ms, "latency": latency_json, "profile": profile_json, "outputs": report })
        );
    } else if let Some(l) = latency {
        println!("latency over {repeat} runs: median {:.3} ms, p90 {:.3} ms, min {:.3} ms", l.median, l.p90, l.min);
    } else {
        println!("ran in {elapsed_ms:.3} ms");
    }
    Ok(())
}

/// Per-instruction time, slowest first: printed as a table, returned as JSON.
fn profile_report(program: &Program, per_instr: &[std::time::Duration], as_json: bool) -> serde_json::Value {
    let total: f64 = per_instr.iter().map(|d| d.as_secs_f64()).sum::<f64>().max(f64::MIN_POSITIVE);
    let mut rows: Vec<(usize, f64)> = per_instr.iter().map(|d| d.as_secs_f64()).enumerate().collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let instrs = &program.plan().instrs;
    if !as_json {
        println!("{:>5} {:>7} {:>10}  {:<14} origin", "instr", "share", "total µs", "kernel");
        for &(i, t) in rows.iter().take(20) {
            println!(
                "{i:>5} {:>6.1}% {:>10.1}  {:<14} {}",
                100.0 * t / total,
                t * 1e6,
                instrs[i].op.name(),
                instrs[i].origin
            );
        }
    }
    json!(rows
        .iter()
        .map(|&(i, t)| json!({"instr": i, "kernel": instrs[i].op.name(), "origin": instrs[i].origin, "total_us": t * 1e6}))
        .collect::<Vec<_>>())
}

fn cmd_inspect(artifact: &Path, as_json: bool) -> CliResult {
    let program = load(artifact)?;
    let plan = program.plan();
    let (major, minor) = program.format_version();
    let io_json = |ios: Vec<kiln_runtime::IoInfo>| -> Vec<serde_json::Value> {
        ios.into_iter().map(|io| json!({"name": io.name, "dtype": io.dtype.name(), "shape": io.shape})).collect()
    };
    // A symbol a `BindDim` instruction names is bound from data during the run.
    let bound_by = |i: usize| {
        plan.instrs
            .iter()
            .position(|ins| matches!(ins.op, kiln_runtime::format::InstrOp::BindDim { symbol } if symbol as usize == i))
    };
    let symbols: Vec<_> = plan
        .symbols
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"name": s.name, "min": s.min, "max": s.max, "bound_by_instr": bound_by(i)}))
        .collect();
    let kernels = program.kernel_counts();
    let quantized = quantized_layers(plan);
    if as_json {
        let doc = json!({
            "format_version": format!("{major}.{minor}"),
            "metadata": {
                "producer": program.metadata().producer, "source": program.metadata().source,
                "target": program.metadata().target, "torch_version": program.metadata().torch_version,
            },
            "inputs": io_json(program.inputs()),
            "outputs": io_json(program.outputs()),
            "states": io_json(program.states()),
            "symbols": symbols,
            "instructions": plan.instrs.len(),
            "kernels": kernels.iter().map(|(k, c)| json!({"kernel": k, "count": c})).collect::<Vec<_>>(),
            "weights_bytes": program.weight_tensor_bytes(),
            "weights_section_bytes": program.weights_bytes(),
            "arena_bytes": plan.arena_bytes,
            "peak_live_bytes": plan.peak_live_bytes,
            "quantized_layers": quantized.iter().map(|q| json!({
                "instr": q.instr, "origin": q.origin, "bits": q.bits, "group": q.group, "dynamic": q.dynamic,
                "static": q.act_static,
                "out_features": q.n, "in_features": q.k, "bytes": q.bytes,
            })).collect::<Vec<_>>(),
            "accel": program.accel().map(|a| json!({
                "segments": a.segments.iter().map(|s| json!({"ops": s.ops, "args": s.args, "results": s.results})).collect::<Vec<_>>(),
                "cpu_fallbacks": a.cpu_fallbacks.iter().map(|f| json!({"instr": f.instr, "reason": f.reason})).collect::<Vec<_>>(),
            })),
        });
        println!("{doc:#}");
        return Ok(());
    }
    let md = program.metadata();
    println!(
        "{}  (kiln format {major}.{minor}, {}, target {}, torch {})",
        artifact.display(),
        md.producer,
        md.target,
        md.torch_version
    );
    println!("\n{:<8} {:<24} {:<6} shape", "", "name", "dtype");
    for (kind, ios) in [("input", program.inputs()), ("output", program.outputs()), ("state", program.states())] {
        for io in ios {
            println!("{kind:<8} {:<24} {:<6} [{}]", io.name, io.dtype.name(), io.shape.join(", "));
        }
    }
    for (i, s) in plan.symbols.iter().enumerate() {
        let from = bound_by(i).map_or("an input dimension".to_string(), |k| format!("data at instruction {k}"));
        println!("symbol   {:<24} in [{}, {}], bound from {from}", s.name, s.min, s.max);
    }
    println!("\n{:<20} count", "kernel");
    for (k, c) in &kernels {
        println!("{k:<20} {c}");
    }
    println!("\ninstructions {}", plan.instrs.len());
    println!("weights      {}", human_bytes(program.weight_tensor_bytes()));
    println!("arena        {} (peak live {})", human_bytes(plan.arena_bytes), human_bytes(plan.peak_live_bytes));
    if !quantized.is_empty() {
        println!("\n{:<6} {:<5} {:<6} {:<8} {:<12} {:<10} origin", "instr", "bits", "group", "acts", "shape", "bytes");
        for q in &quantized {
            let acts = match (q.dynamic, q.act_static) {
                (true, _) => "int8",
                (_, true) => "int8 static",
                _ => "f32",
            };
            let shape = format!("{}x{}", q.n, q.k);
            println!("{:<6} {:<5} {:<6} {acts:<8} {shape:<12} {:<10} {}", q.instr, q.bits, q.group, q.bytes, q.origin);
        }
    }
    if let Some(accel) = program.accel() {
        print_accel(plan, accel);
    }
    Ok(())
}

/// A quantized linear layer of a plan, for `kiln inspect`.
struct QuantLayer {
    instr: usize,
    origin: String,
    bits: u32,
    group: u32,
    dynamic: bool,
    /// Static (calibrated) int8 activations.
    act_static: bool,
    n: u64,
    k: u64,
    /// Bytes of the stored weight, scales and zero points.
    bytes: u64,
}

fn quantized_layers(plan: &kiln_runtime::format::Plan) -> Vec<QuantLayer> {
    use kiln_runtime::format::{DimRef, InstrOp, Kernel, Storage};
    let tensor = |i: Option<&u32>| i.and_then(|&t| plan.tensors.get(t as usize));
    let bytes = |i: Option<&u32>| match tensor(i).map(|t| &t.storage) {
        Some(Storage::Weight { bytes, .. }) => *bytes,
        _ => 0,
    };
    let dim = |d: Option<&DimRef>| match d {
        Some(DimRef::Static(v)) => *v,
        _ => 0,
    };
    plan.instrs
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| {
            let InstrOp::Call(Kernel::QuantLinear { bits, group, zero_points, dynamic, act_scale, .. }) = &ins.op
            else {
                return None;
            };
            let w = tensor(ins.inputs.get(1))?;
            let stored: u64 = (1..3 + *zero_points as usize).map(|j| bytes(ins.inputs.get(j))).sum();
            let per_byte = if *bits == 4 { 2 } else { 1 };
            Some(QuantLayer {
                instr: i,
                origin: ins.origin.clone(),
                bits: *bits,
                group: *group,
                dynamic: *dynamic,
                act_static: act_scale.is_some(),
                n: dim(w.shape.first()),
                k: dim(w.shape.get(1)) * per_byte,
                bytes: stored,
            })
        })
        .collect()
}

/// The accelerator segments (ops inside) and what stayed on the CPU, and why.
fn print_accel(plan: &kiln_runtime::format::Plan, accel: &kiln_runtime::format::AccelProgram) {
    println!(
        "
accelerator segments {}",
        accel.segments.len()
    );
    for (i, s) in accel.segments.iter().enumerate() {
        println!("  segment {i}: {} args, {} results, ops: {}", s.args.len(), s.results.len(), s.ops.join(", "));
    }
    if let Some(mesh) = &accel.mesh {
        print_mesh(plan, accel, mesh);
    }
    if !accel.cpu_fallbacks.is_empty() {
        println!("CPU fallbacks {}", accel.cpu_fallbacks.len());
        for f in &accel.cpu_fallbacks {
            let origin = plan.instrs.get(f.instr as usize).map_or("", |i| i.origin.as_str());
            println!("  instruction {} ({origin}): {}", f.instr, f.reason);
        }
    }
}

/// An SPMD artifact's mesh and each segment argument's and result's sharding
/// with its bytes per device.
fn print_mesh(
    plan: &kiln_runtime::format::Plan,
    accel: &kiln_runtime::format::AccelProgram,
    mesh: &kiln_runtime::format::MeshDecl,
) {
    let axes: Vec<String> = mesh.axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect();
    let order = if mesh.devices.is_empty() {
        "the client's first devices".to_string()
    } else {
        format!("devices {:?}", mesh.devices)
    };
    println!("mesh [{}] ({} devices, {order})", axes.join(", "), mesh.size());
    for seg in &accel.segments {
        let tensors = seg.args.iter().zip(&seg.arg_shardings).map(|t| ("arg", t));
        let tensors = tensors.chain(seg.results.iter().zip(&seg.result_shardings).map(|t| ("result", t)));
        for (kind, (&t, sharding)) in tensors {
            let Some(decl) = plan.tensors.get(t as usize) else { continue };
            let dims: Vec<String> = sharding
                .dims
                .iter()
                .map(|d| {
                    let names: Vec<&str> =
                        d.iter().filter_map(|&a| mesh.axes.get(a as usize)).map(|a| a.name.as_str()).collect();
                    format!("{{{}}}", names.join(", "))
                })
                .collect();
            let pieces: u64 = sharding
                .dims
                .iter()
                .flatten()
                .filter_map(|&a| mesh.axes.get(a as usize))
                .map(|a| u64::from(a.size))
                .product();
            let bytes: u64 = decl
                .shape
                .iter()
                .map(|d| match d {
                    kiln_runtime::format::DimRef::Static(v) => *v,
                    _ => 0,
                })
                .product::<u64>()
                * decl.dtype.size_bytes() as u64;
            let weight =
                if matches!(decl.storage, kiln_runtime::format::Storage::Weight { .. }) { "weight" } else { "" };
            println!(
                "  {kind:<6} tensor {t:<5} {:<24} {} per device {weight}",
                format!("[{}]", dims.join(", ")),
                human_bytes(bytes / pieces.max(1))
            );
        }
    }
}

/// The bundled example: the MLP fixture exported from PyTorch (tests/fixtures/mlp).
fn cmd_demo() -> CliResult {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlp");
    let model = dir.join("training.pt2");
    let artifact = std::env::temp_dir().join(format!("kiln-demo-{}.kiln", std::process::id()));
    cmd_compile(&model, &artifact, "cpu", "f32", &QuantArgs::default(), &ShardArgs::default(), None)?;
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

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
