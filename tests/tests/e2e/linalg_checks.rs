//! torch.linalg's run-time errors: eager torch raises when `solve`/`inv`
//! meet a singular matrix or `cholesky` one that is not positive definite;
//! kiln's programs fail the run with the same reason, in both IR flavours
//! (training IR checks the factorisation's info, Core ATen spells the check
//! as `with_effects(_linalg_check_errors)`). Fixture:
//! `tests/fixtures/generate_extras.py linalg_checks`.

use kiln_tests::{
    assert_outputs_close, fixture_dir, load_fixture, read_numbered, run_session, try_compile_and_load, FLAVOURS,
};

#[test]
fn good_inputs_match_eager_and_bad_ones_fail_with_torchs_reason() {
    let dir = fixture_dir("linalg_checks");
    for flavour in FLAVOURS {
        let program = load_fixture("linalg_checks", flavour);
        let mut session = program.session().expect("session");
        for case in ["case0", "case1"] {
            let got = run_session(&mut session, &read_numbered(&dir, &format!("{case}_input"))).expect("run");
            assert_outputs_close(
                &format!("linalg_checks/{flavour} {case}"),
                &got,
                &read_numbered(&dir, &format!("{case}_output")),
                1e-4,
                1e-5,
            );
        }
        for (bad, reason) in [("singular", "singular"), ("not_pd", "not positive-definite")] {
            let err = run_session(&mut session, &read_numbered(&dir, &format!("{bad}_input")))
                .expect_err(&format!("{flavour}: the {bad} inputs must fail the run"));
            assert!(err.to_string().contains(reason), "{flavour}/{bad}: {err}");
        }
        // A failed check leaves the session usable.
        let got = run_session(&mut session, &read_numbered(&dir, "case0_input")).expect("run after an error");
        assert_outputs_close("after an error", &got, &read_numbered(&dir, "case0_output"), 1e-4, 1e-5);
    }
}

/// torch's SVD raises on a matrix holding a NaN or an infinity ("failed to
/// converge"); kiln's SVD-based programs fail the run with that reason
/// instead of returning NaNs (the committed `linalg.svdvals` case).
#[test]
fn svd_of_a_non_finite_matrix_fails_the_run() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/cases/linalg.svdvals/f32_0");
    for flavour in FLAVOURS {
        let program = try_compile_and_load(&dir.join(format!("{flavour}.pt2")), "svd_nan").expect("compile");
        let mut session = program.session().expect("session");
        let mut inputs = read_numbered(&dir, "input");
        run_session(&mut session, &inputs).expect("a finite matrix runs");
        for bad in [f32::NAN, f32::INFINITY] {
            inputs[0].data[4..8].copy_from_slice(&bad.to_le_bytes());
            let err = run_session(&mut session, &inputs).expect_err("a non-finite matrix must fail the run");
            assert!(err.to_string().contains("non-finite values"), "{flavour}: {err}");
        }
    }
}
