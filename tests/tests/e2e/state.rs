//! Programs whose buffers persist between runs (`tests/fixtures/state/`, made
//! by `generate_state.py`): a counter, a low-pass filter and a one-layer
//! static-KV-cache decoder, in both IR flavours, run step by step through one
//! session and compared with eager PyTorch after every step; then the state
//! API (read, write, reset by name), the refusal (a program writing into
//! its input), and hand-written IR for the
//! lowering's corner cases (a state returned before its update; two states
//! swapping values).

use kiln_compiler::npy::read_npy;
use kiln_runtime::{Session, Tensor, TensorView};
use kiln_tests::{assert_close, fixture_dir, load_fixture, read_numbered, FLAVOURS};
use std::path::PathBuf;

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn state_fixture(name: &str) -> String {
    format!("state/{name}")
}

fn steps(name: &str) -> Vec<PathBuf> {
    let dir = fixture_dir(&state_fixture(name));
    let steps: Vec<PathBuf> = (0..).map(|k| dir.join(format!("step_{k}"))).take_while(|p| p.is_dir()).collect();
    assert!(steps.len() >= 4, "{name}: fixture has {} steps, expected at least 4", steps.len());
    steps
}

/// Runs every step through `session`, comparing each step's outputs with eager's.
fn run_steps(session: &mut Session, what: &str, steps: &[PathBuf]) {
    for (k, step) in steps.iter().enumerate() {
        let (inputs, expected) = (read_numbered(step, "input"), read_numbered(step, "output"));
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let outputs = session.run(&views).unwrap_or_else(|e| panic!("{what} step {k}: {e}"));
        assert_eq!(outputs.len(), expected.len(), "{what} step {k}: number of outputs");
        for (i, want) in expected.iter().enumerate() {
            assert_close(&format!("{what} step {k} output {i}"), &outputs.get(i), &want.view(), RTOL, ATOL);
        }
    }
}

/// Eager's buffers after the last step (`state_<name>.npy`).
fn final_states(name: &str) -> Vec<(String, Tensor)> {
    let dir = fixture_dir(&state_fixture(name));
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

fn check_stateful(name: &str, flavour: &str) {
    let what = format!("{name}/{flavour}");
    let program = load_fixture(&state_fixture(name), flavour);
    let expected_states = final_states(name);
    let mut names: Vec<String> = program.states().into_iter().map(|s| s.name).collect();
    names.sort();
    let want_names: Vec<&String> = expected_states.iter().map(|(n, _)| n).collect();
    assert_eq!(names.iter().collect::<Vec<_>>(), want_names, "{what}: the program's states");
    let steps = steps(name);
    let mut session = program.session().expect("session");
    run_steps(&mut session, &what, &steps);
    for (buffer, want) in &expected_states {
        let got = session.state(buffer).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&format!("{what} final state `{buffer}`"), &got, &want.view(), RTOL, ATOL);
    }
    // Reset: the same steps give the same outputs again.
    session.reset_state();
    run_steps(&mut session, &format!("{what} after reset_state"), &steps);
}

macro_rules! stateful_tests {
    ($($name:ident),*) => {
        $(
            mod $name {
                #[test]
                fn training_ir() {
                    super::check_stateful(stringify!($name), "training");
                }
                #[test]
                fn core_aten() {
                    super::check_stateful(stringify!($name), "aten");
                }
            }
        )*
    };
}

stateful_tests!(counter, lowpass, kv_decoder, tiny_llama);

#[test]
fn state_is_read_written_and_reset_by_name() {
    for flavour in FLAVOURS {
        let program = load_fixture(&state_fixture("counter"), flavour);
        let mut session = program.session().expect("session");
        let x = Tensor::from_f32(&[3], &[1.0, 2.0, 3.0]);
        // Before any run: the buffer's initial value.
        assert_eq!(session.state("count").expect("count").data, 0f32.to_le_bytes());
        for _ in 0..3 {
            session.run(&[x.view()]).expect("run");
        }
        assert_eq!(session.state("count").expect("count").data, 3f32.to_le_bytes());
        assert_eq!(session.state("steps").expect("steps").data, 3i64.to_le_bytes());
        // Written by name: the next run starts from it.
        session.set_state("count", Tensor::from_f32(&[1], &[10.0]).view()).expect("set_state");
        let out = session.run(&[x.view()]).expect("run").to_tensors();
        assert_eq!(out[0].to_f32(), Some(vec![11.0, 22.0, 33.0]), "{flavour}: x * (10 + 1)");
        assert_eq!(out[1].data, 40i64.to_le_bytes(), "{flavour}: steps * 10 after 4 runs");
        // Wrong dtype, shape or name: errors, the state unchanged.
        let wrong_dtype = Tensor::from_i64(&[1], &[1]);
        let err = session.set_state("count", wrong_dtype.view()).expect_err("i64 into f32").to_string();
        assert!(err.contains("count") && err.contains("i64"), "{err}");
        let wrong_shape = Tensor::from_f32(&[2], &[1.0, 2.0]);
        assert!(session.set_state("count", wrong_shape.view()).is_err());
        let err = session.state("nope").expect_err("no such state").to_string();
        assert!(err.contains("nope") && err.contains("count"), "{err}");
        assert_eq!(session.state("count").expect("count").data, 11f32.to_le_bytes());
        // Reset: back to the buffers' values; a second session is independent.
        session.reset_state();
        assert_eq!(session.state("count").expect("count").data, 0f32.to_le_bytes());
        let mut other = program.session().expect("session");
        other.run(&[x.view()]).expect("run");
        assert_eq!(other.state("count").expect("count").data, 1f32.to_le_bytes());
        assert_eq!(session.state("count").expect("count").data, 0f32.to_le_bytes());
        // State is not an input or an output of the program.
        assert_eq!(program.inputs().len(), 1);
        assert_eq!(program.outputs().len(), 2);
    }
}

#[test]
fn a_failed_run_leaves_the_state_unchanged() {
    let program = load_fixture(&state_fixture("counter"), "aten");
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[3], &[1.0, 2.0, 3.0]);
    session.run(&[x.view()]).expect("run");
    let bad = Tensor::from_f32(&[4], &[1.0; 4]);
    assert!(session.run(&[bad.view()]).is_err());
    assert_eq!(session.state("count").expect("count").data, 1f32.to_le_bytes());
}

#[test]
fn a_program_writing_into_its_input_is_refused_naming_it() {
    for flavour in FLAVOURS {
        let src = fixture_dir("state/input_mutation").join(format!("{flavour}.pt2"));
        let tmp = kiln_tests::temp_path("input_mutation");
        let err = kiln_compiler::compile_file(&src, &tmp, &kiln_compiler::CompileOptions::default())
            .expect_err("an input written in place must be refused")
            .to_string();
        assert!(err.contains("writes into its input `x`"), "{flavour}: {err}");
        assert!(!tmp.exists());
    }
}

/// Compiles an IR text graph for the CPU and loads it.
fn compile_text(src: &str) -> std::sync::Arc<kiln_runtime::Program> {
    let g = kiln_ir::text::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let (writer, _) = kiln_compiler::compile_graph(g, &Default::default(), Default::default()).expect("compile");
    kiln_runtime::Program::from_bytes(&writer.to_bytes()).expect("load")
}

#[test]
fn a_state_returned_before_its_update_is_the_old_value() {
    // `before` is the state as the run found it; the update must not show through.
    let program = compile_text(
        "graph {
  input %0 \"x\": f32[2] {origin=\"x\"}
  input %1 \"acc\": f32[2] {origin=\"acc\"}
  %2: f32[2] = add(%0, %1)
  output %1 \"before\"
  output %2 \"state acc\"
  state \"acc\" input 1 output 1 = [1.0, 2.0]
}",
    );
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[2], &[10.0, 20.0]);
    for (before, after) in [([1.0, 2.0], [11.0, 22.0]), ([11.0, 22.0], [21.0, 42.0])] {
        let out = session.run(&[x.view()]).expect("run").to_tensors();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].to_f32(), Some(before.to_vec()));
        assert_eq!(session.state("acc").expect("acc").data, Tensor::from_f32(&[2], &after).data);
    }
}

#[test]
fn states_that_swap_values_both_update() {
    // a, b = b, a: each update is the other state's current value.
    let program = compile_text(
        "graph {
  input %0 \"x\": f32[2] {origin=\"x\"}
  input %1 \"a\": f32[2] {origin=\"a\"}
  input %2 \"b\": f32[2] {origin=\"b\"}
  %3: f32[2] = add(%0, %1)
  output %3 \"y\"
  output %2 \"state a\"
  output %1 \"state b\"
  state \"a\" input 1 output 1 = [1.0, 2.0]
  state \"b\" input 2 output 2 = [3.0, 4.0]
}",
    );
    // Each update is the other state's old value: copied in at the end.
    let kinds: Vec<_> = program.state_writes().into_iter().map(|w| (w.name, w.kind)).collect();
    let copy = kiln_runtime::StateWriteKind::EndOfRunCopy;
    assert_eq!(kinds, [("a".to_string(), copy.clone()), ("b".to_string(), copy)]);
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[2], &[0.5, 0.5]);
    let (a, b) = (vec![1.0, 2.0], vec![3.0, 4.0]);
    for k in 0..4 {
        let out = session.run(&[x.view()]).expect("run").to_tensors();
        let now = if k % 2 == 0 { &a } else { &b };
        let want: Vec<f32> = now.iter().map(|v| v + 0.5).collect();
        assert_eq!(out[0].to_f32(), Some(want), "run {k}");
        let (next_a, next_b) = if k % 2 == 0 { (&b, &a) } else { (&a, &b) };
        assert_eq!(session.state("a").expect("a").data, Tensor::from_f32(&[2], next_a).data, "run {k}");
        assert_eq!(session.state("b").expect("b").data, Tensor::from_f32(&[2], next_b).data, "run {k}");
    }
}

/// Each state's update in `program`'s plan is written into the state's
/// storage during the run: the update is the state's own tensor, and no
/// instruction copies the whole state (reads it into another buffer or
/// writes it from one) except views of the same storage, which move no data.
fn assert_updated_in_place(what: &str, program: &kiln_runtime::Program) {
    use kiln_runtime::format::{InstrOp, Kernel, Storage};
    let plan = program.plan();
    let storage = |t: u32| plan.tensors[t as usize].storage;
    for st in &plan.states {
        assert_eq!(st.update, st.tensor, "{what}: state `{}` has an end-of-run copy", st.name);
        let Storage::Arena { offset, max_bytes } = storage(st.tensor) else { panic!("{what}: state not in the arena") };
        let in_state = |t: u32| matches!(storage(t), Storage::Arena { offset: o, .. } if o == offset);
        let mut writers = 0;
        for (i, instr) in plan.instrs.iter().enumerate() {
            let (reads, writes) =
                (instr.inputs.iter().any(|&t| in_state(t)), instr.outputs.iter().any(|&t| in_state(t)));
            if let InstrOp::Call(Kernel::Copy {}) = instr.op {
                let out = storage(instr.outputs[0]);
                assert!(
                    !(reads || writes) || storage(instr.inputs[0]) == out,
                    "{what}: instruction {i} ({}) copies state `{}` ({max_bytes} bytes)",
                    instr.origin,
                    st.name
                );
            } else if writes {
                writers += 1;
                let InstrOp::Call(kernel) = &instr.op else { panic!("{what}: instruction {i} is not a call") };
                // Where the old value is read: an indexed write's data
                // operand, or any one operand of an elementwise call.
                let reads_at: Vec<usize> = (0..instr.inputs.len()).filter(|&k| in_state(instr.inputs[k])).collect();
                match kernel {
                    Kernel::IndexPut { .. } => assert_eq!(instr.inputs[0], st.tensor, "{what}: instruction {i}"),
                    Kernel::Unary { .. } | Kernel::Binary { .. } | Kernel::Fused { .. } => {
                        assert!(reads_at.len() <= 1, "{what}: instruction {i} reads the state twice")
                    }
                    other => panic!("{what}: instruction {i} ({other:?}) writes state `{}`", st.name),
                }
                for k in reads_at {
                    assert_eq!(instr.inputs[k], st.tensor, "{what}: instruction {i} updates the state in place");
                }
                assert_eq!(instr.outputs, [st.tensor], "{what}: instruction {i} writes the whole state");
            }
        }
        assert_eq!(writers, 1, "{what}: state `{}` has one writer", st.name);
    }
}

/// KV caches (`index_put`/`index_copy_`), a filter's
/// `state.mul_(0.9).add_(0.1 * x)` and a counter's `count += 1` (elementwise
/// updates) are written into the state's storage by the op computing them:
/// no end-of-run copy.
#[test]
fn states_are_updated_in_place_not_copied_per_step() {
    for name in ["kv_decoder", "tiny_llama", "counter", "lowpass"] {
        for flavour in FLAVOURS {
            let program = load_fixture(&state_fixture(name), flavour);
            assert_updated_in_place(&format!("{name}/{flavour}"), &program);
        }
    }
}

/// The filter run step by step at 1, 2 and 3 threads: bit-identical outputs
/// and state, with the update written in place.
#[test]
fn in_place_elementwise_updates_are_thread_count_independent() {
    for name in ["lowpass", "counter"] {
        let program = load_fixture(&state_fixture(name), "aten");
        let steps = steps(name);
        let run_all = |threads: usize| {
            let opts = kiln_runtime::SessionOptions { threads, ..Default::default() };
            let mut session = program.session_with(&opts).expect("session");
            let mut seen = Vec::new();
            for step in &steps {
                let inputs = read_numbered(step, "input");
                let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
                let outs = session.run(&views).expect("run").to_tensors();
                seen.extend(outs.into_iter().map(|t| t.data));
                for st in session.state_names().map(str::to_string).collect::<Vec<_>>() {
                    seen.push(session.state(&st).expect("state").data.to_vec());
                }
            }
            seen
        };
        let one = run_all(1);
        for threads in [2, 3] {
            assert_eq!(run_all(threads), one, "{name}: {threads} threads");
        }
    }
}

/// An elementwise update written in place, then a failing gather: the
/// state is stale (partly a new value) until reset or set; a run failing
/// before the write leaves it as it was.
#[test]
fn a_run_failing_after_an_elementwise_in_place_update_leaves_the_state_stale() {
    let program = compile_text(
        "graph {
  input %0 \"x\": f32[4] {origin=\"x\"}
  input %1 \"pick\": i64[1] {origin=\"pick\"}
  input %2 \"acc\": f32[4] {origin=\"acc\"}
  %3: f32[4] = mul(%2, %0)
  %4: f32[1] = gather{axis=0}(%3, %1)
  output %4 \"y\"
  output %3 \"state acc\"
  state \"acc\" input 2 output 1 = [1.0, 2.0, 3.0, 4.0]
}",
    );
    assert_updated_in_place("in-place mul", &program);
    let [w] = &program.state_writes()[..] else { panic!("one state") };
    assert!(matches!(&w.kind, kiln_runtime::StateWriteKind::InPlace { instr: 0, kernel } if kernel == "mul"), "{w:?}");
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[4], &[2.0; 4]);
    let run = |session: &mut Session, pick: i64| -> Result<Vec<f32>, kiln_runtime::Error> {
        let pick = Tensor::from_i64(&[1], &[pick]);
        Ok(session.run(&[x.view(), pick.view()])?.to_tensors()[0].to_f32().expect("f32"))
    };
    assert_eq!(run(&mut session, 3).expect("run"), [8.0]);
    assert_eq!(session.state("acc").expect("acc").data, Tensor::from_f32(&[4], &[2.0, 4.0, 6.0, 8.0]).data);
    let wrong = Tensor::from_f32(&[3], &[1.0; 3]);
    assert!(session.run(&[wrong.view(), Tensor::from_i64(&[1], &[0]).view()]).is_err());
    assert!(!session.state_is_stale("acc").expect("acc"), "an input error runs nothing");
    let err = run(&mut session, 9).expect_err("pick 9 of 4");
    assert!(matches!(err, kiln_runtime::Error::Kernel { .. }), "{err}");
    assert!(session.state_is_stale("acc").expect("acc"));
    assert!(matches!(run(&mut session, 0), Err(kiln_runtime::Error::StaleState { .. })));
    session.reset_state();
    assert_eq!(run(&mut session, 0).expect("run after reset"), [2.0]);
}

fn cache_inputs(row: [f32; 2], pos: i64, pick: i64) -> [Tensor; 3] {
    [Tensor::from_f32(&[1, 2], &row), Tensor::from_i64(&[1], &[pos]), Tensor::from_i64(&[1], &[pick])]
}

fn run_cache(session: &mut Session, row: [f32; 2], pos: i64, pick: i64) -> Result<Vec<f32>, kiln_runtime::Error> {
    let inputs = cache_inputs(row, pos, pick);
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    Ok(session.run(&views)?.to_tensors()[0].to_f32().expect("f32"))
}

fn cache_of(session: &Session) -> Vec<f32> {
    let t = session.state("cache").expect("cache");
    t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn a_run_failing_after_an_in_place_write_leaves_the_state_stale_until_reset() {
    let program = compile_text(kiln_tests::IN_PLACE_CACHE_IR);
    assert_updated_in_place("in-place cache", &program);
    let mut session = program.session().expect("session");
    assert_eq!(run_cache(&mut session, [1.0, 2.0], 0, 0).expect("run"), [1.0, 2.0]);
    // Fails at the write itself, which checks every index first: the
    // state is untouched and the session goes on.
    let err = run_cache(&mut session, [3.0, 4.0], 9, 0).expect_err("pos 9 of 4 rows");
    assert!(matches!(err, kiln_runtime::Error::Kernel { .. }), "{err}");
    assert!(!session.state_is_stale("cache").expect("cache"));
    assert_eq!(cache_of(&session), [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(run_cache(&mut session, [3.0, 4.0], 1, 1).expect("run"), [3.0, 4.0]);
    // Fails after the write: row 2 is written, the run is not complete.
    let err = run_cache(&mut session, [5.0, 6.0], 2, 7).expect_err("pick 7 of 4 rows");
    assert!(matches!(err, kiln_runtime::Error::Kernel { .. }), "{err}");
    assert!(session.state_is_stale("cache").expect("cache"));
    // Refused, naming the state and the way out, until reset or set.
    for err in [
        run_cache(&mut session, [7.0, 8.0], 3, 0).expect_err("stale"),
        session.state("cache").map(|_| ()).expect_err("stale"),
    ] {
        assert!(matches!(&err, kiln_runtime::Error::StaleState { name } if name == "cache"), "{err}");
        assert!(err.to_string().contains("reset_state()"), "{err}");
    }
    session.reset_state();
    assert_eq!(cache_of(&session), [0.0; 8]);
    assert_eq!(run_cache(&mut session, [7.0, 8.0], 3, 3).expect("run after reset"), [7.0, 8.0]);
    assert_eq!(cache_of(&session), [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0]);
    // set_state also gives the state a whole value again.
    run_cache(&mut session, [1.0, 1.0], 0, 9).expect_err("pick 9");
    assert!(session.state_is_stale("cache").expect("cache"));
    let whole = Tensor::from_f32(&[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    session.set_state("cache", whole.view()).expect("set_state");
    assert_eq!(run_cache(&mut session, [0.5, 0.5], 0, 3).expect("run after set_state"), [7.0, 8.0]);
    assert_eq!(cache_of(&session), [0.5, 0.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
}

/// A view of the old value read after the elementwise update still sees
/// the old value (the update is not written in place over it then, or the
/// view was taken before).
#[test]
fn a_view_of_the_old_value_read_after_an_elementwise_update_sees_the_old_value() {
    let program = compile_text(
        "graph {
  input %0 \"x\": f32[4] {origin=\"x\"}
  input %1 \"acc\": f32[4] {origin=\"acc\"}
  %2: f32[2, 2] = reshape{shape=[2, 2]}(%1)
  %3: f32[4] = mul(%1, %0)
  %4: f32[2, 2] = neg(%2)
  output %4 \"y\"
  output %3 \"state acc\"
  state \"acc\" input 1 output 1 = [1.0, 2.0, 3.0, 4.0]
}",
    );
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[4], &[2.0; 4]);
    for k in 0..3 {
        let scale = 2f32.powi(k);
        let out = session.run(&[x.view()]).expect("run").to_tensors();
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| -v * scale).collect();
        assert_eq!(out[0].to_f32(), Some(want), "run {k}");
        let next: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v * scale * 2.0).collect();
        assert_eq!(session.state("acc").expect("acc").data, Tensor::from_f32(&[4], &next).data, "run {k}");
    }
}
