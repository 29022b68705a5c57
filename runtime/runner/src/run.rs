//! `run`: an artifact with inputs from `.npy` files — once, repeated for
//! latency, profiled, or as a recorded sequence of steps through one session.

use crate::npy::{read_npy, write_npy};
use kiln_runtime::{Device, Program, SessionOptions, Tensor, TensorView};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Result of a command: `Err` carries the message printed after `error: `.
pub type CliResult = Result<(), String>;

#[derive(clap::Args)]
pub struct RunArgs {
    pub artifact: PathBuf,
    /// `INDEX=path.npy` or `NAME=path.npy`; one per program input.
    #[arg(short, long = "input", value_name = "INDEX|NAME=PATH")]
    pub inputs: Vec<String>,
    /// Write outputs as output_0.npy, output_1.npy, … here (with --steps:
    /// step_<k>/output_<i>.npy).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Run the steps in DIR (step_0/, step_1/, … each with input_<index>.npy or
    /// input_<name>.npy) in order through one session: state carries over.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["inputs", "repeat", "profile"])]
    pub steps: Option<PathBuf>,
    /// Print a machine-readable summary.
    #[arg(long)]
    pub json: bool,
    /// Run this many times after one warm-up run and report latency (median, p90, min).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Report the time spent in each instruction (the total over every run,
    /// the warm-up included, and its share; with --json also each one's run
    /// count, `runs`, and fastest run, `min_us`).
    #[arg(long)]
    pub profile: bool,
    /// Threads the CPU kernels split their work over [default: $KILN_NUM_THREADS, else the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Park the pool's idle threads after every parallel job instead of
    /// letting them spin for the run's next one (for machines whose cores
    /// are shared with other busy programs).
    #[arg(long)]
    pub no_spin: bool,
    /// `cpu` (kiln's kernels), `tpu`, `gpu` or `pjrt:PATH` (a PJRT plugin) [default: cpu].
    #[arg(long)]
    pub device: Option<String>,
    /// Which of the accelerator's addressable devices to use.
    #[arg(long, default_value_t = 0)]
    pub device_index: usize,
    /// Refuse artifacts whose activation memory exceeds this (bytes, or with
    /// a K/M/G suffix) [default: 8G].
    #[arg(long, value_parser = parse_bytes)]
    pub max_memory: Option<u64>,
    #[cfg(feature = "pjrt")]
    #[command(flatten)]
    pub hosts: crate::hosts::HostArgs,
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

/// Loads an artifact; errors name the file.
pub fn load(artifact: &Path) -> Result<std::sync::Arc<Program>, String> {
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

/// Min, max and mean of the elements; of the magnitudes `|z|` for a complex
/// output (a part's extremes say little about complex numbers).
fn stats(t: &TensorView<'_>) -> Option<(f64, f64, f64)> {
    let mut vals = kiln_runtime::elements_f64(t);
    if t.dtype.is_complex() {
        vals = vals.chunks_exact(2).map(|p| p[0].hypot(p[1])).collect();
    }
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
/// accelerator or has shape buckets, else the CPU.
fn choose_device(program: &Program, flag: Option<&str>) -> Result<Device, String> {
    match flag {
        Some(s) => s.parse().map_err(|e: kiln_runtime::Error| e.to_string()),
        None => match std::env::var_os("KILN_PJRT_PLUGIN").filter(|v| !v.is_empty()) {
            Some(p) if program.needs_accelerator() || program.accel().is_some_and(|a| !a.buckets.is_empty()) => {
                Ok(Device::Pjrt(PathBuf::from(p)))
            }
            _ => Ok(Device::Cpu),
        },
    }
}

/// `kiln run --steps DIR`: every step through one session, outputs per step,
/// per-step latency with `--json`.
fn cmd_run_steps(args: &RunArgs, dir: &Path, configure: &dyn Fn(&mut SessionOptions)) -> CliResult {
    let program = load(&args.artifact)?;
    let steps = crate::steps::step_dirs(dir)?;
    let declared = program.inputs();
    let defaults = SessionOptions::default();
    let max_arena_bytes = args.max_memory.unwrap_or(defaults.max_arena_bytes);
    let device = choose_device(&program, args.device.as_deref())?;
    let mut options = SessionOptions { device, device_index: args.device_index, max_arena_bytes, ..defaults };
    configure(&mut options);
    let mut session = program.session_with(&options).map_err(|e| e.to_string())?;
    let mut report = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        let inputs = crate::steps::read_step(step, &declared)?;
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

pub fn cmd_run(args: &RunArgs) -> CliResult {
    #[cfg(feature = "pjrt")]
    if let Some(hosts) = args.hosts.start()? {
        let result = run_with(args, &|o: &mut SessionOptions| o.distributed = Some(hosts.distributed.clone()));
        return hosts.finish(result);
    }
    run_with(args, &|_: &mut SessionOptions| {})
}

/// `cmd_run` with `configure` applied to the session's options.
fn run_with(args: &RunArgs, configure: &dyn Fn(&mut SessionOptions)) -> CliResult {
    if let Some(dir) = &args.steps {
        return cmd_run_steps(args, dir, configure);
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
    let mut options = SessionOptions {
        device: choose_device(&program, device)?,
        device_index,
        max_arena_bytes,
        threads,
        spin: !args.no_spin,
        ..defaults
    };
    configure(&mut options);
    let mut session = program.session_with(&options).map_err(|e| e.to_string())?;
    let accel_json = session.accel_info().map(|a| {
        if !as_json {
            println!(
                "device: {} #{} ({}, {} {}), {} segments, {} shape buckets: {} compiled, {} from cache{}",
                a.device_kind, a.device_id, a.plugin.display(), a.platform_name, a.platform_version, a.segments, a.buckets, a.compiled, a.cache_hits,
                if a.partitions > 1 { format!("; SPMD over {} devices", a.partitions) } else { String::new() }
            );
        }
        json!({
            "plugin": a.plugin.display().to_string(), "platform": a.platform_name, "platform_version": a.platform_version,
            "device_id": a.device_id, "device_kind": a.device_kind, "segments": a.segments,
            "buckets": a.buckets, "compiled": a.compiled, "cache_hits": a.cache_hits, "partitions": a.partitions,
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
            let of = if out.dtype.is_complex() { "|z| " } else { "" };
            let stat =
                s.map(|(lo, hi, mean)| format!("  {of}min {lo:.6} max {hi:.6} mean {mean:.6}")).unwrap_or_default();
            let saved = path.as_ref().map(|p| format!("  -> {}", p.display())).unwrap_or_default();
            println!("output {i} `{}`: {} {:?}{stat}{saved}", outputs.name(i), out.dtype, out.shape);
        }
        let mut entry = json!({
            "index": i, "name": outputs.name(i), "dtype": out.dtype.name(), "shape": out.shape,
            "path": path.map(|p| p.display().to_string()),
            "min": s.map(|s| s.0), "max": s.map(|s| s.1), "mean": s.map(|s| s.2),
        });
        if out.dtype.is_complex() {
            entry["stats_of"] = json!("abs");
        }
        report.push(entry);
    }
    let latency_json =
        latency.as_ref().map(|l| json!({"runs": repeat, "median_ms": l.median, "p90_ms": l.p90, "min_ms": l.min}));
    let profile_json = session.profile().map(|p| profile_report(&program, p, as_json));
    let accel_profile_json =
        if args.profile { session.accel_stats().map(|s| accel_profile_report(&s, as_json)) } else { None };
    if as_json {
        println!(
            "{}",
            json!({ "artifact": artifact.display().to_string(), "device": options.device.to_string(), "accelerator": accel_json,
                    "threads": options.threads, "elapsed_ms": elapsed_ms, "latency": latency_json, "profile": profile_json,
                    "accel_profile": accel_profile_json, "outputs": report })
        );
    } else if let Some(l) = latency {
        println!("latency over {repeat} runs: median {:.3} ms, p90 {:.3} ms, min {:.3} ms", l.median, l.p90, l.min);
    } else {
        println!("ran in {elapsed_ms:.3} ms");
    }
    Ok(())
}

/// Per-instruction time, slowest first: printed as a table, returned as JSON.
fn profile_report(program: &Program, per_instr: &[kiln_runtime::InstrTime], as_json: bool) -> serde_json::Value {
    let total: f64 = per_instr.iter().map(|d| d.total.as_secs_f64()).sum::<f64>().max(f64::MIN_POSITIVE);
    let mut rows: Vec<(usize, f64)> = per_instr.iter().map(|d| d.total.as_secs_f64()).enumerate().collect();
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
        .map(|&(i, t)| {
            let p = &per_instr[i];
            json!({"instr": i, "kernel": instrs[i].op.name(), "origin": instrs[i].origin, "total_us": t * 1e6,
                   "runs": p.runs, "min_us": p.min.as_secs_f64() * 1e6})
        })
        .collect::<Vec<_>>())
}

/// Per accelerator segment: device execute time (from the execute call to
/// the device's completion event) and host↔device copy time and bytes, over
/// every run of the session; the largest costs first. Printed as a table,
/// returned as JSON.
fn accel_profile_report(stats: &kiln_runtime::AccelStats, as_json: bool) -> serde_json::Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    // Every (segment, what, time) cost, largest first.
    let mut costs: Vec<(usize, &str, f64)> = stats
        .segments
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            [(i, "execute", ms(s.execute_time)), (i, "upload", ms(s.upload_time)), (i, "download", ms(s.download_time))]
        })
        .collect();
    costs.sort_by(|a, b| b.2.total_cmp(&a.2));
    let total: f64 = costs.iter().map(|c| c.2).sum::<f64>().max(f64::MIN_POSITIVE);
    if !as_json {
        println!(
            "{:>7} {:>5} {:>11} {:>10} {:>12} {:>11} {:>12}",
            "segment", "calls", "execute ms", "upload ms", "upload B", "download ms", "download B"
        );
        for (i, s) in stats.segments.iter().enumerate() {
            println!(
                "{i:>7} {:>5} {:>11.3} {:>10.3} {:>12} {:>11.3} {:>12}",
                s.calls,
                ms(s.execute_time),
                ms(s.upload_time),
                s.upload_bytes,
                ms(s.download_time),
                s.download_bytes
            );
        }
        let largest: Vec<String> = costs
            .iter()
            .take(3)
            .filter(|c| c.2 > 0.0)
            .map(|(i, what, t)| format!("segment {i} {what} {t:.3} ms ({:.0}%)", 100.0 * t / total))
            .collect();
        println!("largest accelerator costs: {}", largest.join(", "));
        if stats.state_downloads > 0 {
            println!("state read from the device: {} copies, {} B", stats.state_downloads, stats.state_download_bytes);
        }
        let (state_uploads, donated): (u64, u64) =
            stats.segments.iter().fold((0, 0), |(u, d), s| (u + s.state_uploads, d + s.donated_states));
        if state_uploads + donated > 0 {
            println!("state on the device: {state_uploads} uploads, {donated} updates in the donated buffer");
        }
    }
    json!({
        "segments": stats.segments.iter().enumerate().map(|(i, s)| json!({
            "segment": i, "calls": s.calls, "execute_ms": ms(s.execute_time),
            "upload_ms": ms(s.upload_time), "uploads": s.uploads, "upload_bytes": s.upload_bytes,
            "download_ms": ms(s.download_time), "downloads": s.downloads, "download_bytes": s.download_bytes,
            "state_uploads": s.state_uploads, "state_upload_bytes": s.state_upload_bytes, "donated_states": s.donated_states,
        })).collect::<Vec<_>>(),
        "largest": costs.iter().take(3).map(|(i, what, t)| json!({"segment": i, "cost": what, "ms": t, "share": t / total})).collect::<Vec<_>>(),
        "state_downloads": stats.state_downloads, "state_download_bytes": stats.state_download_bytes,
    })
}
