//! State on the device: the stateful fixtures (`tests/fixtures/state/`, made
//! by `generate_state.py`) compiled with `--target pjrt` and run step by step
//! on the XLA CPU plugin through one session, compared with eager PyTorch at
//! every step; the transfer counts show the state is uploaded once and never
//! copied back unless read. Needs `KILN_TEST_XLA_CPU_PLUGIN`.
#![cfg(feature = "mlir")]

use crate::stablehlo_support;

use kiln_compiler::import::import_pt2;
use kiln_compiler::npy::read_npy;
use kiln_compiler::stablehlo::Precision;
use kiln_compiler::Backend;
use kiln_runtime::{Device, ExecutableCache, Program, Session, SessionOptions, Tensor, TensorView};
use stablehlo_support::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn fixture(name: &str) -> PathBuf {
    fixture_dir(&format!("state/{name}"))
}

fn steps(name: &str) -> Vec<PathBuf> {
    let dir = fixture(name);
    let steps: Vec<PathBuf> = (0..).map(|k| dir.join(format!("step_{k}"))).take_while(|p| p.is_dir()).collect();
    assert!(steps.len() >= 4, "{name}: {} steps, expected at least 4", steps.len());
    steps
}

fn compile_fixture(name: &str, flavour: &str) -> Arc<Program> {
    let graph = import_pt2(&fixture(name).join(format!("{flavour}.pt2")))
        .unwrap_or_else(|e| panic!("{name}/{flavour}: {e}"))
        .graph;
    assert!(!graph.states.is_empty(), "{name}: the fixture has no state");
    compile(graph, pjrt(Precision::F32))
}

fn session(program: &Arc<Program>, plugin: &Path) -> Session {
    let opts = SessionOptions {
        device: Device::Pjrt(plugin.to_path_buf()),
        cache: ExecutableCache::Off,
        ..SessionOptions::default()
    };
    program.session_with(&opts).unwrap_or_else(|e| panic!("pjrt session: {e}"))
}

/// Bytes of every state of `program`.
fn state_bytes(session: &Session) -> u64 {
    let names: Vec<String> = session.state_names().map(str::to_string).collect();
    names.iter().map(|n| session.state(n).map(|t| t.data.len() as u64).unwrap_or_else(|e| panic!("{e}"))).sum()
}

/// What one step moved: host→device and device→host bytes of all
/// segments, state bytes uploaded, state buffers donated.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
struct Moved {
    up: u64,
    down: u64,
    state_up: u64,
    donated: u64,
}

fn moved(session: &Session) -> Moved {
    let stats = session.accel_stats().expect("an accelerator session has stats");
    let (up, down) = stats.total_bytes();
    let state_up = stats.segments.iter().map(|s| s.state_upload_bytes).sum();
    let donated = stats.segments.iter().map(|s| s.donated_states).sum();
    Moved { up, down, state_up, donated }
}

/// Runs every step, comparing the outputs with eager's; returns what each
/// step moved.
fn run_steps(session: &mut Session, what: &str, steps: &[PathBuf]) -> Vec<Moved> {
    let mut per_step = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        let (inputs, expected) = (read_numbered(step, "input"), read_numbered(step, "output"));
        let before = moved(session);
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let got = session.run(&views).unwrap_or_else(|e| panic!("{what} step {k}: {e}")).to_tensors();
        let after = moved(session);
        per_step.push(Moved {
            up: after.up - before.up,
            down: after.down - before.down,
            state_up: after.state_up - before.state_up,
            donated: after.donated - before.donated,
        });
        assert_eq!(got.len(), expected.len(), "{what} step {k}: number of outputs");
        for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
            assert_close(&format!("{what} step {k} output {i}"), g, w, RTOL, ATOL);
        }
    }
    per_step
}

fn final_states(name: &str) -> Vec<(String, Tensor)> {
    let dir = fixture(name);
    let mut states: Vec<(String, Tensor)> = std::fs::read_dir(&dir)
        .expect("fixture folder")
        .filter_map(|e| {
            let file = e.ok()?.file_name().into_string().ok()?;
            let buffer = file.strip_prefix("state_")?.strip_suffix(".npy")?.to_string();
            Some((buffer, read_npy(&dir.join(&file)).unwrap_or_else(|e| panic!("{e}"))))
        })
        .collect();
    states.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!states.is_empty(), "{name}: no state_*.npy");
    states
}

/// The user inputs' bytes of a step: what an upload may carry besides state.
fn input_bytes(step: &Path) -> u64 {
    read_numbered(step, "input").iter().map(|t| t.data.len() as u64).sum()
}

fn check_on_device(name: &str, flavour: &str) {
    let Some(plugin) = plugin() else { return };
    let what = format!("{name}/{flavour}");
    let program = compile_fixture(name, flavour);
    let accel = accel(&program);
    assert!(!accel.segments.is_empty(), "{what}: no accelerator segment");
    let steps = steps(name);
    let mut session = session(&program, &plugin);
    let states = state_bytes(&session);
    let per_step = run_steps(&mut session, &what, &steps);
    eprintln!(
        "{what}: {} segment(s), CPU fallbacks {:?}, state {states} B, bytes up/down per step {per_step:?}",
        accel.segments.len(),
        accel.cpu_fallbacks.iter().map(|f| f.reason.as_str()).collect::<Vec<_>>()
    );

    // The first step uploads every state; later ones carry at most the
    // user's inputs (the state stays on the device) and no state at all.
    // Every step donates each state's buffer to the executable, which
    // writes the update where the old value lay (no copy on the device).
    let state_count = session.state_names().count() as u64;
    assert_eq!(per_step[0].state_up, states, "{what}: step 0 uploads every state once");
    assert!(per_step[0].up >= states, "{what}: step 0 uploaded less than the {states} state bytes");
    for (k, (m, step)) in per_step.iter().zip(&steps).enumerate() {
        let inputs = input_bytes(step);
        if k > 0 {
            assert_eq!(m.state_up, 0, "{what} step {k}: a state was copied to the device again");
            assert!(m.up <= inputs, "{what} step {k}: uploaded {} bytes, more than the {inputs} input bytes", m.up);
        }
        assert_eq!(m.donated, state_count, "{what} step {k}: every state updated in its own buffer");
    }
    let before = session.accel_stats().expect("stats");
    for (buffer, want) in final_states(name) {
        let got = session.state(&buffer).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&format!("{what} final state `{buffer}`"), &to_tensor(&got), &want, RTOL, ATOL);
        // A second read is served from the host copy.
        let again = session.state(&buffer).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(again.data, got.data);
    }
    let after = session.accel_stats().expect("stats");
    assert_eq!(after.state_downloads - before.state_downloads, state_count, "{what}: one download per state read");
    assert_eq!(after.state_download_bytes - before.state_download_bytes, states, "{what}: bytes read");

    // reset_state re-uploads the initial values: the same steps again.
    session.reset_state();
    let again = run_steps(&mut session, &format!("{what} after reset_state"), &steps);
    assert_eq!(again[0].state_up, states, "{what}: after reset the first step uploads the state again");
    assert!(again[1..].iter().all(|m| m.state_up == 0), "{what}: after reset, later steps upload no state");
}

fn to_tensor(v: &TensorView<'_>) -> Tensor {
    Tensor { dtype: v.dtype, shape: v.shape.to_vec(), data: v.data.to_vec() }
}

macro_rules! device_state_tests {
    ($($name:ident),*) => {
        $(
            mod $name {
                #[test]
                fn training_ir() {
                    super::check_on_device(stringify!($name), "training");
                }
                #[test]
                fn core_aten() {
                    super::check_on_device(stringify!($name), "aten");
                }
            }
        )*
    };
}

device_state_tests!(counter, lowpass, kv_decoder);

/// `set_state` on a device session: the next run reads the written value,
/// and a failed run leaves the device state as it was.
#[test]
fn set_state_and_failed_run_on_device() {
    let Some(plugin) = plugin() else { return };
    let program = compile_fixture("lowpass", "aten");
    let mut session = session(&program, &plugin);
    let x = Tensor::from_f32(&[2, 4], &[1.0; 8]);
    session.run(&[x.view()]).expect("run");
    let written = Tensor::from_f32(&[2, 4], &[3.0; 8]);
    session.set_state("state", written.view()).expect("set_state");
    assert_eq!(session.state("state").expect("state").data, written.data, "set_state is read back");
    let out = session.run(&[x.view()]).expect("run").to_tensors();
    // state = 0.9 * 3 + 0.1 * 1 = 2.8; output = 2 * state.
    let want = Tensor::from_f32(&[2, 4], &[5.6; 8]);
    assert_close("after set_state", &out[0], &want, RTOL, ATOL);
    let before = session.state("state").expect("state").data.to_vec();
    let wrong = Tensor::from_f32(&[3, 4], &[1.0; 12]);
    assert!(session.run(&[wrong.view()]).is_err(), "a wrong input shape fails");
    assert_eq!(session.state("state").expect("state").data, &before[..], "a failed run keeps the state");
}

/// A low-pass filter whose program checks its own state after the update
/// (`torch._assert_async(state.max() < 100)`): the update runs on the device,
/// donating the state's buffer, and the check runs on the CPU afterwards. A
/// run that fails the check has lost the state's old value on the device, so
/// the state is stale: runs and reads are refused (naming the state) until
/// `reset_state` or `set_state`, which bring the session back — on the CPU
/// and on the device alike.
const CHECKED_FILTER: &str = r#"graph {
  input %0 "state": f32[2, 4]
  input %1 "x": f32[2, 4]
  const %2: f32[] = [0.9]
  const %3: f32[] = [0.1]
  const %4: f32[] = [100.0]
  const %5: f32[] = [2.0]
  %6: f32[2, 4] = mul(%0, %2)
  %7: f32[2, 4] = mul(%1, %3)
  %8: f32[2, 4] = add(%6, %7)
  %9: f32[] = reduce_max{axes=[0, 1], keep_dims=false}(%8)
  %10: bool[] = lt(%9, %4)
  _ = assert{message="the filter diverged"}(%10)
  %11: f32[2, 4] = mul(%8, %5)
  output %8 "state_out"
  output %11 "y"
  state "state" input 0 output 0 = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
}"#;

#[test]
fn failed_run_after_a_donation_leaves_the_state_stale_until_reset() {
    let Some(plugin) = plugin() else { return };
    let graph = || kiln_ir::text::parse(CHECKED_FILTER).unwrap_or_else(|e| panic!("{e}"));
    let on_device = compile(graph(), pjrt(Precision::F32));
    let accel = accel(&on_device);
    assert!(
        !accel.segments.is_empty() && !accel.cpu_fallbacks.is_empty(),
        "the update must run on the device and the check on the CPU: {accel:?}"
    );
    let on_cpu = compile(graph(), Backend::Cpu);
    let sessions = [("cpu", on_cpu.session().expect("cpu session")), ("device", session(&on_device, &plugin))];
    for (what, mut session) in sessions {
        let x = |v: f32| Tensor::from_f32(&[2, 4], &[v; 8]);
        // y = 2 · state; state = 0.9 · state + 0.1 · x.
        let y = |s: f32| Tensor::from_f32(&[2, 4], &[2.0 * s; 8]);
        let run = |session: &mut Session, v: f32| session.run(&[x(v).view()]).map(|o| o.to_tensors());
        assert_close(what, &run(&mut session, 10.0).expect("step 0")[0], &y(1.0), RTOL, ATOL);
        assert_close(what, &run(&mut session, 10.0).expect("step 1")[0], &y(1.9), RTOL, ATOL);
        let donated_before = (what == "device").then(|| moved(&session).donated);

        let err = run(&mut session, 1e4).expect_err("a diverging step fails its check");
        assert!(err.to_string().contains("the filter diverged"), "{what}: {err}");
        if let Some(before) = donated_before {
            assert!(moved(&session).donated > before, "the failing step donated the state's buffer first");
        }
        assert!(session.state_is_stale("state").expect("state"), "{what}: the state is stale");
        let refused = run(&mut session, 10.0).expect_err("a run on a stale state is refused");
        assert!(refused.to_string().contains("state"), "{what}: {refused}");
        assert!(session.state("state").is_err(), "{what}: reading a stale state is refused");

        // Reset: back to the initial state, and the steps repeat.
        session.reset_state();
        assert!(!session.state_is_stale("state").expect("state"));
        assert_close(what, &run(&mut session, 10.0).expect("after reset")[0], &y(1.0), RTOL, ATOL);
        // Another failure, then set_state brings it back too.
        run(&mut session, 1e4).expect_err("diverges again");
        session.set_state("state", Tensor::from_f32(&[2, 4], &[5.0; 8]).view()).expect("set_state");
        assert_close(what, &run(&mut session, 10.0).expect("after set_state")[0], &y(5.5), RTOL, ATOL);
    }
}
