//! A robot control loop: a small stateless policy (the `mlp` fixture, 4×16
//! observations → 4×10 actions) run at a fixed rate, reporting the tick
//! latency's p50/p99/p99.9 and proving that a tick allocates nothing (a
//! counting global allocator; per thread, so other threads do not count).
//!
//! ```text
//! cargo run --release -p kiln-compiler --example robot_loop -- [--hz 500] [--ticks 5000] [--spin] [--rt] [--threads 1]
//! ```
//! `--rt` does what a real-time controller does before its loop (Linux):
//! locks the process's memory (`mlockall`: no page fault in a tick), pins
//! the loop to the last CPU and runs it under `SCHED_FIFO` (no time-sharing
//! with ordinary tasks). Each step that the system refuses (no privilege)
//! is reported and skipped.
//! Between ticks the loop sleeps (`thread::sleep`), or with `--spin` waits by
//! spinning on the clock, as hard real-time loops do on a dedicated core: a
//! core that stays busy keeps the policy's weights and code in its caches and
//! never pays an idle-state (or, in a VM, a halted vCPU's) wake-up. The policy
//! runs on one thread unless `--threads` says otherwise: a tick this small
//! gains nothing from handing work to a pool.
//! Exits non-zero if any tick allocated. `compiler/tests/compiler/robot_loop.rs` runs
//! it briefly.

use kiln_runtime::{Program, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::time::{Duration, Instant};

/// The system allocator, counting allocations made by the current thread.
struct CountingAlloc;

thread_local! {
    // `const` and destructor-free: touching it never allocates.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// What one loop measured.
pub struct LoopReport {
    pub ticks: usize,
    /// Tick latencies (observation written → action read), sorted.
    pub latencies: Vec<Duration>,
    /// Allocations made by all ticks together (after the warm-up tick).
    pub tick_allocations: u64,
    /// Ticks that finished after their deadline (the next tick's start).
    pub overruns: usize,
    /// Sum of the chosen actions, so the work cannot be optimised away.
    pub checksum: i64,
}

impl LoopReport {
    pub fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i.min(self.latencies.len() - 1)]
    }
}

/// How the loop waits out the rest of a period.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `thread::sleep`: the core is free for others between ticks.
    Sleep,
    /// Spin on the clock: the core stays busy and its caches warm.
    Spin,
}

/// Compiles the policy (at start-up, as a robot would load its artifact) and
/// runs `ticks` ticks at `hz`, the policy on `threads` threads.
pub fn run_loop(hz: f64, ticks: usize, wait: Wait, threads: usize) -> Result<LoopReport, String> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlp/aten.pt2");
    let artifact = std::env::temp_dir().join(format!("kiln-robot-loop-{}.kiln", std::process::id()));
    kiln_compiler::compile_file(&fixture, &artifact, &kiln_compiler::CompileOptions::default())
        .map_err(|e| format!("compile {}: {e}", fixture.display()))?;
    let program = Program::load(&artifact).map_err(|e| e.to_string())?;
    std::fs::remove_file(&artifact).ok();
    let options = kiln_runtime::SessionOptions { threads, ..Default::default() };
    let mut session = program.session_with(&options).map_err(|e| e.to_string())?;

    // Everything a tick touches is allocated here, before the loop.
    let mut observation = Tensor::from_f32(&[4, 16], &[0.0; 64]);
    let mut latencies = Vec::with_capacity(ticks);
    let period = Duration::from_secs_f64(1.0 / hz);
    let (mut overruns, mut checksum) = (0, 0i64);
    let mut tick_allocations = 0;

    // Warm-up tick: the first run allocates the session's arena.
    tick(&mut session, &mut observation, 0)?;
    let mut deadline = Instant::now() + period;
    for t in 0..ticks {
        let before = allocations();
        let started = Instant::now();
        checksum += tick(&mut session, &mut observation, t)?;
        let finished = Instant::now();
        tick_allocations += allocations() - before;
        latencies.push(finished - started);
        if finished > deadline {
            overruns += 1;
        }
        // Wait out the rest of the period; a late tick starts the next at once.
        match wait {
            Wait::Sleep => {
                if let Some(rest) = deadline.checked_duration_since(Instant::now()) {
                    std::thread::sleep(rest);
                }
            }
            Wait::Spin => {
                while Instant::now() < deadline {
                    std::hint::spin_loop();
                }
            }
        }
        deadline += period;
    }
    latencies.sort();
    Ok(LoopReport { ticks, latencies, tick_allocations, overruns, checksum })
}

/// One control step: fresh sensor readings in, the policy run, each row's best action out.
fn tick(session: &mut kiln_runtime::Session, observation: &mut Tensor, t: usize) -> Result<i64, String> {
    for (i, v) in observation.data.chunks_exact_mut(4).enumerate() {
        let reading = ((t * 64 + i) as f32 * 0.01).sin();
        v.copy_from_slice(&reading.to_le_bytes());
    }
    let outputs = session.run(&[observation.view()]).map_err(|e| e.to_string())?;
    let actions = outputs.get(0);
    let mut sum = 0;
    for row in actions.data.chunks_exact(10 * 4) {
        let (best, _) = row
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, v)| if v > bv { (i, v) } else { (bi, bv) });
        sum += best as i64;
    }
    Ok(sum)
}

fn arg(args: &[String], name: &str, default: f64) -> Result<f64, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}

/// Real-time settings for the calling thread (memory locked, pinned to the
/// last CPU, `SCHED_FIFO`); returns what the system refused.
#[cfg(target_os = "linux")]
fn realtime() -> Vec<String> {
    let mut refused = Vec::new();
    let os_error = || std::io::Error::last_os_error().to_string();
    // SAFETY: plain system calls on this process/thread with valid arguments.
    unsafe {
        if libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) != 0 {
            refused.push(format!("mlockall: {}", os_error()));
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus - 1, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            refused.push(format!("pin to CPU {}: {}", cpus - 1, os_error()));
        }
        let param = libc::sched_param { sched_priority: 80 };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
            refused.push(format!("SCHED_FIFO: {}", os_error()));
        }
    }
    refused
}

#[cfg(not(target_os = "linux"))]
fn realtime() -> Vec<String> {
    vec!["real-time settings are implemented for Linux only".into()]
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let run = || -> Result<LoopReport, String> {
        let hz = arg(&args, "--hz", 500.0)?;
        let ticks = arg(&args, "--ticks", 5000.0)? as usize;
        let threads = arg(&args, "--threads", 1.0)? as usize;
        if !(hz > 0.0 && ticks > 0 && threads > 0) {
            return Err("--hz, --ticks and --threads must be positive".into());
        }
        let wait = if args.iter().any(|a| a == "--spin") { Wait::Spin } else { Wait::Sleep };
        if args.iter().any(|a| a == "--rt") {
            for refused in realtime() {
                eprintln!("--rt: {refused}");
            }
        }
        run_loop(hz, ticks, wait, threads)
    };
    match run() {
        Ok(r) => {
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{} ticks: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us (p99.9/p50 {:.2}), max {:.1} us; {} overruns; {} allocations in ticks (checksum {})",
                r.ticks,
                us(r.percentile(0.5)),
                us(r.percentile(0.99)),
                us(r.percentile(0.999)),
                r.percentile(0.999).as_secs_f64() / r.percentile(0.5).as_secs_f64(),
                us(r.percentile(1.0)),
                r.overruns,
                r.tick_allocations,
                r.checksum
            );
            if r.tick_allocations != 0 {
                eprintln!("error: ticks allocated {} times", r.tick_allocations);
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
