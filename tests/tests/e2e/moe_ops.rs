//! Run-time checks of the MoE programs' ops that a numbers-only conformance
//! case cannot express (the cases themselves: tests/conformance/cases/
//! histc.extra, grouped_mm_fallback.extra): torch.histc over the data's range
//! fails when that range is not finite, as torch's does, and the session
//! stays usable; transformers::grouped_mm_fallback refuses offsets that
//! decrease, in the f32 kernel and in the f64 composition alike.

use kiln_runtime::{DType, Session, Tensor};
use kiln_tests::{assert_outputs_close, read_numbered, run_session, try_compile_and_load};
use std::path::PathBuf;

fn case(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance/cases").join(dir)
}

fn session(dir: &str) -> Session {
    let program = try_compile_and_load(&case(dir).join("aten.pt2"), "moe_ops").unwrap_or_else(|e| panic!("{dir}: {e}"));
    program.session().expect("session")
}

#[test]
fn histc_over_a_non_finite_data_range_fails_the_run() {
    // histc(x, bins=7, min=3, max=3): equal bounds, so the data's range.
    let dir = "histc.extra/f32_0";
    let mut s = session(dir);
    let (inputs, want) = (read_numbered(&case(dir), "input"), read_numbered(&case(dir), "output"));
    assert_outputs_close(dir, &run_session(&mut s, &inputs).expect("run"), &want, 0.0, 0.0);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = vec![0.5f32; 30];
        x[7] = bad;
        let err = run_session(&mut s, &[Tensor::from_f32(&[6, 5], &x)]).expect_err(&format!("{bad} in the data"));
        assert!(err.to_string().contains("histc: range of the data is not finite"), "{bad}: {err}");
    }
    assert_outputs_close("after an error", &run_session(&mut s, &inputs).expect("run"), &want, 0.0, 0.0);
}

#[test]
fn grouped_mm_fallback_refuses_decreasing_offsets() {
    for dir in ["grouped_mm_fallback.extra/f32_1", "grouped_mm_fallback.extra/f64_0"] {
        let mut s = session(dir);
        let mut inputs = read_numbered(&case(dir), "input");
        let want = read_numbered(&case(dir), "output");
        let (rtol, atol) = kiln_tests::default_tolerance(want[0].dtype);
        assert_outputs_close(dir, &run_session(&mut s, &inputs).expect("run"), &want, rtol, atol);
        // The fixture's offsets are [3, 3, 7, 9]: make them decrease.
        inputs[2] = offsets(inputs[2].dtype, &[3, 2, 7, 9]);
        let err = run_session(&mut s, &inputs).expect_err(&format!("{dir}: decreasing offsets accepted"));
        assert!(err.to_string().contains("non-decreasing"), "{dir}: {err}");
    }
}

/// An offsets tensor of `dtype` (i32 or i64, as the fixture's).
fn offsets(dtype: DType, ends: &[i64]) -> Tensor {
    let data = match dtype {
        DType::I32 => ends.iter().flat_map(|&e| (e as i32).to_le_bytes()).collect(),
        DType::I64 => ends.iter().flat_map(|&e| e.to_le_bytes()).collect(),
        other => panic!("offsets of {other:?}"),
    };
    Tensor { dtype, shape: vec![ends.len()], data }
}
