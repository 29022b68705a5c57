//! Data-dependent sizes: `nonzero` (and `x[mask]`, `argwhere`) and `.item()`
//! used as a size and as a scalar (fixtures from
//! `tests/fixtures/generate_extras.py`), in both IR flavours, through one
//! session whose inputs give different sizes on every run.

use kiln_compiler::import::import_pt2;
use kiln_ir::Op;
use kiln_runtime::{Error, Tensor};
use kiln_tests::{assert_outputs_close, fixture_dir, load_fixture, read_numbered, run_session, FLAVOURS};

fn run(session: &mut kiln_runtime::Session, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
    run_session(session, inputs)
}

fn compare(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_outputs_close(what, got, want, 1e-5, 1e-6);
}

/// Runs every `caseK` of `name` through one session, twice over (sizes
/// shrink and grow between runs), comparing with eager PyTorch.
fn run_cases(name: &str, flavour: &str) -> kiln_runtime::Session {
    let dir = fixture_dir(name);
    let program = load_fixture(name, flavour);
    let mut session = program.session().expect("session");
    let cases: Vec<_> =
        (0..).map(|k| format!("case{k}")).take_while(|c| dir.join(format!("{c}_input_0.npy")).exists()).collect();
    assert!(cases.len() >= 3, "{name}: expected several input sets");
    for round in 0..2 {
        for case in &cases {
            let got = run(&mut session, &read_numbered(&dir, &format!("{case}_input"))).expect("run");
            compare(
                &format!("{name}/{flavour} {case} (round {round})"),
                &got,
                &read_numbered(&dir, &format!("{case}_output")),
            );
        }
    }
    session
}

#[test]
fn nonzero_masks_and_argwhere_match_pytorch_for_every_count() {
    for flavour in FLAVOURS {
        run_cases("nonzero", flavour);
    }
}

#[test]
fn nonzero_counts_with_a_reduction_and_binds_before_use() {
    for flavour in FLAVOURS {
        let g = import_pt2(&fixture_dir("nonzero").join(format!("{flavour}.pt2"))).expect("import").graph;
        kiln_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{flavour}: {e}"));
        let ops: Vec<&Op> = g.order.iter().map(|&n| &g.nodes[n].op).collect();
        let binds = ops.iter().filter(|o| matches!(o, Op::BindDim { .. })).count();
        let nonzeros = ops.iter().filter(|o| matches!(o, Op::NonZero { .. })).count();
        // nonzero(x), nonzero(b), x[x > 0], argwhere(b): one bind per count
        // symbol, and torch gives argwhere(b) nonzero(b)'s (the second
        // NonZero kernel checks that its count agrees).
        assert_eq!(nonzeros, 4, "{flavour}");
        assert_eq!(binds, 3, "{flavour}");
        // The symbols' upper bounds are the inputs' element counts (12 and 6).
        let mut maxes: Vec<i64> = g.data_dependent_symbols().iter().filter_map(|&s| g.symbols[s].max).collect();
        maxes.sort_unstable();
        assert_eq!(maxes, [6, 12, 12], "{flavour}");
        // The text form round-trips bind_dim and nonzero.
        let text = kiln_ir::text::print(&g);
        assert!(text.contains("= bind_dim{symbol="), "{text}");
        let reparsed = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{flavour}: {e}\n{text}"));
        assert_eq!(kiln_ir::text::print(&reparsed), text);
    }
}

#[test]
fn item_as_size_and_multiplier_matches_pytorch() {
    for flavour in FLAVOURS {
        run_cases("item", flavour);
    }
}

#[test]
fn item_outside_its_checked_range_is_a_run_time_error() {
    let dir = fixture_dir("item");
    for flavour in FLAVOURS {
        let mut session = run_cases("item", flavour);
        let err =
            run(&mut session, &read_numbered(&dir, "too_big_input")).expect_err("t = 9 exceeds torch._check(n <= 8)");
        match &err {
            Error::DataDependent { detail, .. } => {
                assert!(detail.contains("= 9 is outside its range [0, 8]"), "{flavour}: {err}");
            }
            other => panic!("{flavour}: unexpected error {other}"),
        }
        assert!(err.to_string().contains("generate_extras.py:"), "{flavour}: no Python line in {err}");
        // The session stays usable.
        let got = run(&mut session, &read_numbered(&dir, "case0_input")).expect("run after the error");
        compare(&format!("item/{flavour} after the error"), &got, &read_numbered(&dir, "case0_output"));
    }
}

#[test]
fn item_without_an_upper_bound_is_a_compile_time_error() {
    let err = import_pt2(&fixture_dir("item").join("unbounded.pt2")).expect_err("no upper bound").to_string();
    assert!(err.contains("has no upper bound"), "{err}");
    assert!(err.contains("torch._check"), "{err}");
    assert!(err.contains("node `item`"), "{err}");
    assert!(err.contains("generate_extras.py:"), "no Python line in: {err}");
}

#[test]
fn partition_keeps_data_dependent_work_on_the_cpu_with_reasons() {
    use kiln_compiler::stablehlo::partition::partition;
    let g = import_pt2(&fixture_dir("nonzero").join("aten.pt2")).expect("import").graph;
    let p = partition(&g, &Default::default());
    let reason = |pred: &dyn Fn(&Op) -> bool| -> Vec<&str> {
        p.cpu.iter().filter(|(n, _)| pred(&g.nodes[*n].op)).map(|(_, r)| r.as_str()).collect()
    };
    let binds = reason(&|o| matches!(o, Op::BindDim { .. }));
    assert_eq!(binds.len(), 3);
    assert!(binds.iter().all(|r| r.contains("from run-time data")), "{binds:?}");
    let nonzeros = reason(&|o| matches!(o, Op::NonZero { .. }));
    assert!(nonzeros.len() == 4 && nonzeros.iter().all(|r| r.contains("data-dependent")), "{nonzeros:?}");
    // The coordinate columns (slices of nonzero's output) are shaped by the count.
    let slices = reason(&|o| matches!(o, Op::Slice { .. }));
    assert!(!slices.is_empty() && slices.iter().all(|r| r.contains("shape depends on run-time data")), "{slices:?}");
    // The counts themselves have static shapes: they may run in a segment.
    assert!(!p.segments.is_empty());
    for s in &p.segments {
        for &n in &s.nodes {
            assert!(!matches!(g.nodes[n].op, Op::BindDim { .. } | Op::NonZero { .. }));
        }
    }
}
