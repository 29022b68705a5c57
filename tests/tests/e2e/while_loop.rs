//! `while_loop` (fixtures `while_loop/` and `control_flow/while_loop.pt2` from
//! `tests/fixtures/generate_extras.py`): imported as `Op::While` with nested
//! graphs, run by the CPU plan's jumps, compared with eager PyTorch for trip
//! counts given at run time, in both IR flavours.

use kiln_compiler::import::import_pt2;
use kiln_ir::{Op, ValueDef};
use kiln_runtime::{Program, Tensor};
use kiln_tests::{assert_outputs_close, fixture_dir, load_fixture, read_numbered, run_session, temp_path, FLAVOURS};

fn run(session: &mut kiln_runtime::Session, inputs: &[Tensor]) -> Vec<Tensor> {
    run_session(session, inputs).expect("run")
}

fn compare(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_outputs_close(what, got, want, 1e-5, 1e-6);
}

#[test]
fn loops_match_pytorch_for_every_trip_count_in_one_session() {
    let dir = fixture_dir("while_loop");
    // n = 3, 0, 1, 7: the loop never runs, runs once, and more often than at export.
    let cases: Vec<String> = (0..4).map(|k| format!("case{k}")).collect();
    for flavour in FLAVOURS {
        let program = load_fixture("while_loop", flavour);
        let mut session = program.session().expect("session");
        for round in 0..2 {
            for case in &cases {
                let got = run(&mut session, &read_numbered(&dir, &format!("{case}_input")));
                compare(
                    &format!("{flavour} {case} (round {round})"),
                    &got,
                    &read_numbered(&dir, &format!("{case}_output")),
                );
            }
        }
    }
}

#[test]
fn each_loop_is_one_while_node_with_nested_graphs() {
    for flavour in FLAVOURS {
        let g = import_pt2(&fixture_dir("while_loop").join(format!("{flavour}.pt2"))).expect("import").graph;
        kiln_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{flavour}: {e}"));
        let loops: Vec<&Op> =
            g.order.iter().map(|&n| &g.nodes[n].op).filter(|o| matches!(o, Op::While { .. })).collect();
        assert_eq!(loops.len(), 2, "{flavour}");
        let Op::While { carried, cond, body } = loops[1] else { unreachable!() };
        assert_eq!(*carried, 3, "{flavour}: (i, a, b)");
        // The weight and `n` arrive as additional inputs of both nested graphs.
        assert_eq!(cond.inputs.len(), 5, "{flavour}");
        assert!(body.order.iter().any(|&n| matches!(body.nodes[n].op, Op::MatMul)), "{flavour}: no matmul in the body");
        // `b.clone()` is the old `b` itself: the carried value that moves to
        // another position, which the plan saves before updating.
        assert_eq!(body.values[body.outputs[1]].def, ValueDef::Input(2), "{flavour}");
        // The text form holds the nested graphs and reads back to the same text.
        let text = kiln_ir::text::print(&g);
        let again = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{flavour}: {e}\n{text}"));
        assert_eq!(kiln_ir::text::print(&again), text, "{flavour}");
    }
}

#[test]
fn control_flow_fixture_loop_doubles_three_times() {
    let tmp = temp_path("while_loop_cf");
    let src = fixture_dir("control_flow").join("while_loop.pt2");
    kiln_compiler::compile_file(&src, &tmp, &kiln_compiler::CompileOptions::default()).expect("compile");
    let program = Program::load(&tmp).expect("load");
    std::fs::remove_file(&tmp).ok();
    let mut session = program.session().expect("session");
    let values = [0.5f32, -1.0, 2.0, 0.0, 3.25, -7.5];
    let got = run(&mut session, &[Tensor::from_f32(&[2, 3], &values)]);
    let want: Vec<f32> = values.iter().map(|v| v * 8.0).collect();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].shape, [2, 3]);
    assert_eq!(got[0].to_f32().unwrap(), want);
}

/// Under `--target pjrt` a loop whose condition and body lower is one node of
/// an accelerator segment (a `stablehlo.while`), not a CPU fallback.
#[test]
fn partition_puts_loops_in_segments() {
    use kiln_compiler::stablehlo::partition::partition;
    let g = import_pt2(&fixture_dir("while_loop").join("aten.pt2")).expect("import").graph;
    let p = partition(&g, &Default::default());
    let is_loop = |n: &kiln_ir::NodeId| matches!(g.nodes[*n].op, Op::While { .. });
    let on_cpu: Vec<&str> = p.cpu.iter().filter(|(n, _)| is_loop(n)).map(|(_, r)| r.as_str()).collect();
    assert!(on_cpu.is_empty(), "{on_cpu:?}");
    let in_segments = p.segments.iter().flat_map(|s| &s.nodes).filter(|n| is_loop(n)).count();
    assert_eq!(in_segments, 2);
}
