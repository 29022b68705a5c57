//! The C API called from Rust: numbers, ownership, and every argument check
//! (null pointers, unknown dtypes, negative dimensions, wrong counts) as an
//! error status with a message rather than a crash.

use kiln_capi::*;
use std::ffi::CStr;
use std::ptr::{null, null_mut};

fn last_error() -> String {
    // SAFETY: never null; valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(kiln_last_error_message()) }.to_string_lossy().into_owned()
}

/// The `mlp` fixture's artifact in 64-byte aligned memory (leaked: it must outlive the program).
fn mlp_in_memory() -> &'static [u8] {
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Line([u8; 64]);
    let bytes = kiln_tests::compile_fixture("mlp", "aten");
    let lines: &'static mut [Line] = Vec::leak(vec![Line([0; 64]); bytes.len().div_ceil(64)]);
    // SAFETY: `Line` is plain bytes; the slice stays inside the leaked lines.
    let image = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), bytes.len()) };
    image.copy_from_slice(&bytes);
    image
}

fn program() -> *mut kiln_program {
    let image = mlp_in_memory();
    let mut p = null_mut();
    // SAFETY: the image is leaked, so it outlives the program.
    let st = unsafe { kiln_program_from_memory(image.as_ptr().cast(), image.len(), &mut p) };
    assert_eq!(st, KILN_STATUS_OK, "{}", last_error());
    p
}

#[test]
fn runs_and_matches_the_rust_api() {
    let p = program();
    let dir = kiln_tests::fixture_dir("mlp");
    let x = kiln_tests::read_npy_as(&dir.join("input_0.npy"), false).expect("input");
    let want = kiln_tests::read_npy_as(&dir.join("output_0.npy"), false).expect("output");
    // SAFETY: all handles are live and all pointers valid for the calls below.
    unsafe {
        assert_eq!((kiln_program_num_inputs(p), kiln_program_num_outputs(p)), (1, 1));
        let mut s = null_mut();
        assert_eq!(kiln_session_new(p, &mut s), KILN_STATUS_OK);
        kiln_program_free(p);
        let mut out = std::mem::zeroed::<kiln_tensor>();
        assert_eq!(kiln_session_output(s, 0, &mut out), KILN_STATUS_NO_OUTPUTS);
        let shape: Vec<i64> = x.shape.iter().map(|&d| d as i64).collect();
        let t = kiln_tensor {
            dtype: KILN_DTYPE_F32,
            rank: shape.len(),
            shape: shape.as_ptr(),
            data: x.data.as_ptr().cast(),
            bytes: x.data.len(),
        };
        for _ in 0..2 {
            assert_eq!(kiln_session_run(s, &t, 1), KILN_STATUS_OK, "{}", last_error());
            assert_eq!(kiln_session_output(s, 0, &mut out), KILN_STATUS_OK);
            assert_eq!(out.dtype, KILN_DTYPE_F32);
            let got_shape = std::slice::from_raw_parts(out.shape, out.rank);
            assert_eq!(got_shape, [4, 10]);
            let data = std::slice::from_raw_parts(out.data.cast::<u8>(), out.bytes).to_vec();
            let got = kiln_runtime::Tensor { dtype: kiln_runtime::DType::F32, shape: vec![4, 10], data };
            kiln_tests::assert_close("capi", &got.view(), &want.view(), 1.3e-6, 1e-5);
        }
        assert_eq!(kiln_session_output(s, 1, &mut out), KILN_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("output 1 does not exist"), "{}", last_error());

        // Argument checks: each an error status with a message.
        let bad_dtype = kiln_tensor { dtype: 999, ..t };
        assert_eq!(kiln_session_run(s, &bad_dtype, 1), KILN_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("unknown dtype code 999"), "{}", last_error());
        let i64_input = kiln_tensor { dtype: KILN_DTYPE_I64, ..t };
        assert_eq!(kiln_session_run(s, &i64_input, 1), KILN_STATUS_BAD_INPUT);
        assert!(last_error().contains("dtype is i64, expected f32"), "{}", last_error());
        let negative = [-4i64, 16];
        let neg = kiln_tensor { shape: negative.as_ptr(), ..t };
        assert_eq!(kiln_session_run(s, &neg, 1), KILN_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("dimension 0 is -4"), "{}", last_error());
        let null_shape = kiln_tensor { shape: null(), ..t };
        assert_eq!(kiln_session_run(s, &null_shape, 1), KILN_STATUS_INVALID_ARGUMENT);
        let null_data = kiln_tensor { data: null(), ..t };
        assert_eq!(kiln_session_run(s, &null_data, 1), KILN_STATUS_INVALID_ARGUMENT);
        let short = kiln_tensor { bytes: t.bytes - 4, ..t };
        assert_eq!(kiln_session_run(s, &short, 1), KILN_STATUS_BAD_INPUT);
        assert_eq!(kiln_session_run(s, &t, 0), KILN_STATUS_BAD_INPUT);
        assert!(last_error().contains("expected 1 inputs, got 0"), "{}", last_error());
        assert_eq!(kiln_session_run(s, null(), 1), KILN_STATUS_INVALID_ARGUMENT);
        assert_eq!(kiln_session_output(s, 0, &mut out), KILN_STATUS_NO_OUTPUTS);
        assert_eq!(kiln_session_output(s, 0, null_mut()), KILN_STATUS_INVALID_ARGUMENT);
        kiln_session_free(s);
    }
}

#[test]
fn null_and_bad_handles_are_errors() {
    // SAFETY: every pointer is null or valid; the functions check for null.
    unsafe {
        let mut p = null_mut();
        assert_eq!(kiln_program_load(null(), &mut p), KILN_STATUS_INVALID_ARGUMENT);
        assert_eq!(kiln_program_load(c"/nonexistent/model.kiln".as_ptr(), &mut p), KILN_STATUS_IO);
        assert!(last_error().contains("/nonexistent/model.kiln"), "{}", last_error());
        assert!(p.is_null());
        assert_eq!(kiln_program_load(c"x".as_ptr(), null_mut()), KILN_STATUS_INVALID_ARGUMENT);
        assert_eq!(kiln_program_from_memory(null(), 10, &mut p), KILN_STATUS_INVALID_ARGUMENT);
        let junk = [0u8; 128];
        assert_eq!(kiln_program_from_memory(junk.as_ptr().cast(), junk.len(), &mut p), KILN_STATUS_BAD_ARTIFACT);
        assert!(p.is_null());
        let mut s = null_mut();
        assert_eq!(kiln_session_new(null(), &mut s), KILN_STATUS_INVALID_ARGUMENT);
        assert_eq!(kiln_session_run(null_mut(), null(), 0), KILN_STATUS_INVALID_ARGUMENT);
        assert_eq!(kiln_program_num_inputs(null()), 0);
        assert_eq!(kiln_program_num_outputs(null()), 0);
        kiln_program_free(null_mut());
        kiln_session_free(null_mut());
        assert_eq!(kiln_session_reset_state(null_mut()), KILN_STATUS_INVALID_ARGUMENT);
    }
    for status in -1..=11 {
        // SAFETY: static, never-null strings.
        let text = unsafe { CStr::from_ptr(kiln_status_message(status)) };
        assert!(!text.to_bytes().is_empty());
    }
}

/// The failed-run semantics of the Rust API (`tests/state.rs`), seen from C:
/// a run failing after its state was written in place makes later runs
/// `KILN_STATUS_STATE_STALE` until `kiln_session_reset_state`.
#[test]
fn a_stale_state_is_refused_until_reset() {
    let g = kiln_ir::text::parse(kiln_tests::IN_PLACE_CACHE_IR).expect("parse");
    let (writer, _) = kiln_compiler::compile_graph(g, &Default::default(), Default::default()).expect("compile");
    let path = kiln_tests::temp_path("capi_stale.kiln");
    std::fs::write(&path, writer.to_bytes()).expect("write");
    let c_path = std::ffi::CString::new(path.to_str().expect("utf-8 path")).expect("path");
    let (two, one) = ([1i64, 2], [1i64]);
    let tensor = |dtype, shape: &[i64], data: &[u8]| kiln_tensor {
        dtype,
        rank: shape.len(),
        shape: shape.as_ptr(),
        data: data.as_ptr().cast(),
        bytes: data.len(),
    };
    let row: Vec<u8> = [1f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let (zero, seven) = (0i64.to_le_bytes(), 7i64.to_le_bytes());
    let inputs = |pick: &[u8]| {
        [tensor(KILN_DTYPE_F32, &two, &row), tensor(KILN_DTYPE_I64, &one, &zero), tensor(KILN_DTYPE_I64, &one, pick)]
    };
    let (good, bad_pick) = (inputs(&zero), inputs(&seven));
    // SAFETY: all handles are live and all pointers valid for the calls below.
    unsafe {
        let (mut p, mut s) = (null_mut(), null_mut());
        assert_eq!(kiln_program_load(c_path.as_ptr(), &mut p), KILN_STATUS_OK, "{}", last_error());
        assert_eq!(kiln_session_new(p, &mut s), KILN_STATUS_OK);
        assert_eq!(kiln_session_run(s, good.as_ptr(), 3), KILN_STATUS_OK, "{}", last_error());
        assert_eq!(kiln_session_run(s, bad_pick.as_ptr(), 3), KILN_STATUS_RUN_FAILED);
        assert_eq!(kiln_session_run(s, good.as_ptr(), 3), KILN_STATUS_STATE_STALE);
        assert!(last_error().contains("state `cache`"), "{}", last_error());
        assert_eq!(kiln_session_reset_state(s), KILN_STATUS_OK);
        assert_eq!(kiln_session_run(s, good.as_ptr(), 3), KILN_STATUS_OK, "{}", last_error());
        let mut out = std::mem::zeroed::<kiln_tensor>();
        assert_eq!(kiln_session_output(s, 0, &mut out), KILN_STATUS_OK);
        assert_eq!(std::slice::from_raw_parts(out.data.cast::<u8>(), out.bytes), &row[..]);
        kiln_session_free(s);
        kiln_program_free(p);
    }
    let _ = std::fs::remove_file(&path);
}
