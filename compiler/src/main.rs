//! The `kiln` command-line tool.

use clap::{Parser, Subcommand};
use kiln_compiler::compile::target_name;
use kiln_compiler::npy::{read_npy, write_npy};
use kiln_compiler::{compile_file, CompileOptions};
use kiln_passes::Target;
use kiln_runtime::{DType, Program, Tensor, TensorView};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Ahead-of-time compiler and runtime for PyTorch programs (torch.export .pt2)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        /// Target: `cpu` (kiln's kernels) or `primitive` (cpu with every composite decomposed).
        #[arg(long, default_value = "cpu")]
        target: String,
    },
    /// Run an artifact on the CPU with inputs from .npy files.
    #[command(after_help = "Examples:\n  kiln run model.kiln --input 0=x.npy --output-dir out/\n  kiln run model.kiln --input x=x.npy --json")]
    Run {
        artifact: PathBuf,
        /// `INDEX=path.npy` or `NAME=path.npy`; one per program input.
        #[arg(short, long = "input", value_name = "INDEX|NAME=PATH")]
        inputs: Vec<String>,
        /// Write outputs as output_0.npy, output_1.npy, … here.
        #[arg(long)]
        output_dir: Option<PathBuf>,
        /// Print a machine-readable summary.
        #[arg(long)]
        json: bool,
        /// Run this many times after one warm-up run and report latency (median, p90, min).
        #[arg(long, default_value_t = 1)]
        repeat: u32,
    },
    /// Describe an artifact: inputs, outputs, kernels, memory.
    #[command(after_help = "Example:\n  kiln inspect model.kiln --json")]
    Inspect {
        artifact: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Compile and run the bundled example model (an MLP) and compare with PyTorch.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compile { model, output, target } => cmd_compile(&model, &output, &target),
        Command::Run { artifact, inputs, output_dir, json, repeat } => cmd_run(&artifact, &inputs, output_dir.as_deref(), json, repeat),
        Command::Inspect { artifact, json } => cmd_inspect(&artifact, json),
        Command::Demo => cmd_demo(),
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

fn cmd_compile(model: &Path, output: &Path, target: &str) -> CliResult {
    let target = Target::from_name(target).ok_or_else(|| format!("unknown target `{target}` (known: cpu, primitive)"))?;
    let started = Instant::now();
    let opts = CompileOptions { target, verify_each: false };
    let s = compile_file(model, output, &opts).map_err(|e| format!("{}: {e}", model.display()))?;
    println!(
        "compiled {} -> {} (target {}) in {:.0} ms: {} instructions, arena {} (peak live {}), weights {}",
        model.display(),
        output.display(),
        target_name(target),
        started.elapsed().as_secs_f64() * 1e3,
        s.instructions,
        human_bytes(s.arena_bytes),
        human_bytes(s.peak_live_bytes),
        human_bytes(s.weights_bytes as u64),
    );
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
        let (key, path) = spec.split_once('=').ok_or_else(|| format!("--input `{spec}`: expected INDEX=path.npy or NAME=path.npy"))?;
        let index = match key.parse::<usize>() {
            Ok(i) if i < declared.len() => i,
            Ok(i) => return Err(format!("--input `{spec}`: the program has {} inputs, index {i} is out of range", declared.len())),
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
            t.ok_or_else(|| format!("missing input {i} (`{}`: {} [{}]); pass --input {i}=path.npy", declared[i].name, declared[i].dtype, declared[i].shape.join(", ")))
        })
        .collect()
}

fn stats(t: &TensorView<'_>) -> Option<(f64, f64, f64)> {
    let vals: Vec<f64> = match t.dtype {
        DType::F32 => t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        DType::F64 => t.data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
        DType::I64 => t.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64).collect(),
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

fn cmd_run(artifact: &Path, specs: &[String], output_dir: Option<&Path>, as_json: bool, repeat: u32) -> CliResult {
    let program = load(artifact)?;
    let inputs = gather_inputs(&program, specs)?;
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let mut session = program.session().map_err(|e| e.to_string())?;
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
    let latency_json = latency.as_ref().map(|l| json!({"runs": repeat, "median_ms": l.median, "p90_ms": l.p90, "min_ms": l.min}));
    if as_json {
        println!("{}", json!({ "artifact": artifact.display().to_string(), "elapsed_ms": elapsed_ms, "latency": latency_json, "outputs": report }));
    } else if let Some(l) = latency {
        println!("latency over {repeat} runs: median {:.3} ms, p90 {:.3} ms, min {:.3} ms", l.median, l.p90, l.min);
    } else {
        println!("ran in {elapsed_ms:.3} ms");
    }
    Ok(())
}

fn cmd_inspect(artifact: &Path, as_json: bool) -> CliResult {
    let program = load(artifact)?;
    let plan = program.plan();
    let (major, minor) = program.format_version();
    let io_json = |ios: Vec<kiln_runtime::IoInfo>| -> Vec<serde_json::Value> {
        ios.into_iter().map(|io| json!({"name": io.name, "dtype": io.dtype.name(), "shape": io.shape})).collect()
    };
    let symbols: Vec<_> = plan.symbols.iter().map(|s| json!({"name": s.name, "min": s.min, "max": s.max})).collect();
    let kernels = program.kernel_counts();
    if as_json {
        let doc = json!({
            "format_version": format!("{major}.{minor}"),
            "metadata": {
                "producer": program.metadata().producer, "source": program.metadata().source,
                "target": program.metadata().target, "torch_version": program.metadata().torch_version,
            },
            "inputs": io_json(program.inputs()),
            "outputs": io_json(program.outputs()),
            "symbols": symbols,
            "instructions": plan.instrs.len(),
            "kernels": kernels.iter().map(|(k, c)| json!({"kernel": k, "count": c})).collect::<Vec<_>>(),
            "weights_bytes": program.weight_tensor_bytes(),
            "weights_section_bytes": program.weights_bytes(),
            "arena_bytes": plan.arena_bytes,
            "peak_live_bytes": plan.peak_live_bytes,
        });
        println!("{doc:#}");
        return Ok(());
    }
    let md = program.metadata();
    println!("{}  (kiln format {major}.{minor}, {}, target {}, torch {})", artifact.display(), md.producer, md.target, md.torch_version);
    println!("\n{:<8} {:<24} {:<6} shape", "", "name", "dtype");
    for (kind, ios) in [("input", program.inputs()), ("output", program.outputs())] {
        for io in ios {
            println!("{kind:<8} {:<24} {:<6} [{}]", io.name, io.dtype.name(), io.shape.join(", "));
        }
    }
    for s in &plan.symbols {
        println!("symbol   {:<24} in [{}, {}]", s.name, s.min, s.max);
    }
    println!("\n{:<20} count", "kernel");
    for (k, c) in &kernels {
        println!("{k:<20} {c}");
    }
    println!("\ninstructions {}", plan.instrs.len());
    println!("weights      {}", human_bytes(program.weight_tensor_bytes()));
    println!("arena        {} (peak live {})", human_bytes(plan.arena_bytes), human_bytes(plan.peak_live_bytes));
    Ok(())
}

/// The bundled example: the MLP fixture exported from PyTorch (tests/fixtures/mlp).
fn cmd_demo() -> CliResult {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlp");
    let model = dir.join("training.pt2");
    let artifact = std::env::temp_dir().join(format!("kiln-demo-{}.kiln", std::process::id()));
    cmd_compile(&model, &artifact, "cpu")?;
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
