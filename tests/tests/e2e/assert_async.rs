//! `torch._assert_async(cond[, msg])`: eager torch raises on the CPU when the
//! condition is zero; kiln's programs fail the run with the program's message
//! (or torch's default one), in both IR flavours, and the session stays
//! usable. Core ATen (`run_decompositions()`) keeps only the form with a
//! message, so the message-less check exists in training IR alone — as in
//! torch, whose decomposed program no longer raises there either. Fixture:
//! `tests/fixtures/generate_extras.py assert_async`.

use kiln_tests::{assert_outputs_close, fixture_dir, load_fixture, read_numbered, run_session, FLAVOURS};

#[test]
fn passing_checks_match_eager_and_failing_ones_fail_with_the_message() {
    let dir = fixture_dir("assert_async");
    for flavour in FLAVOURS {
        let program = load_fixture("assert_async", flavour);
        let mut session = program.session().expect("session");
        for case in ["case0", "case1"] {
            let got = run_session(&mut session, &read_numbered(&dir, &format!("{case}_input"))).expect("run");
            let want = read_numbered(&dir, &format!("{case}_output"));
            assert_outputs_close(&format!("assert_async/{flavour} {case}"), &got, &want, 0.0, 0.0);
        }
        let err = run_session(&mut session, &read_numbered(&dir, "negative_input"))
            .expect_err(&format!("{flavour}: a negative x must fail the run"));
        assert!(err.to_string().contains("x must be positive"), "{flavour}: {err}");

        let big_n = run_session(&mut session, &read_numbered(&dir, "big_n_input"));
        if flavour == "training" {
            let err = big_n.expect_err("training IR: n >= 10 must fail the run");
            assert!(err.to_string().contains("single nonzero value"), "{err}");
        } else {
            big_n.expect("Core ATen has no message-less check left");
        }
        // A failed check leaves the session usable.
        let got = run_session(&mut session, &read_numbered(&dir, "case0_input")).expect("run after an error");
        assert_outputs_close("after an error", &got, &read_numbered(&dir, "case0_output"), 0.0, 0.0);
    }
}
