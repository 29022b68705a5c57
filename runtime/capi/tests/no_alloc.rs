//! `kiln_session_run` and `kiln_session_output` allocate nothing once a
//! session has run (a robot loop calls them every tick from C): counted on
//! the calling thread, where the C API's own work happens (the kernel pool's
//! workers are counted by tests/tests/no_alloc.rs; counting them here would
//! also see their one-time start-up, which may fall after the warm-up run).

use kiln_capi::*;
use kiln_tests::alloc_count::{allocations_during, Counting};
use std::ptr::null_mut;

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_c_api_runs_do_not_allocate() {
    // The counter itself works (so a zero below means something).
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);
    let path = std::env::temp_dir().join(format!("kiln-capi-noalloc-{}.kiln", std::process::id()));
    std::fs::write(&path, kiln_tests::compile_fixture("mlp", "aten")).expect("write artifact");
    let cpath = std::ffi::CString::new(path.to_str().expect("utf-8 temp path")).expect("no NUL");
    let x = kiln_tests::read_npy_as(&kiln_tests::fixture_dir("mlp").join("input_0.npy"), false).expect("input");
    let shape: Vec<i64> = x.shape.iter().map(|&d| d as i64).collect();
    let t = kiln_tensor {
        dtype: KILN_DTYPE_F32,
        rank: shape.len(),
        shape: shape.as_ptr(),
        data: x.data.as_ptr().cast(),
        bytes: x.data.len(),
    };
    // SAFETY: every handle is live and every pointer valid for the calls below.
    unsafe {
        let (mut p, mut s) = (null_mut(), null_mut());
        assert_eq!(kiln_program_load(cpath.as_ptr(), &mut p), KILN_STATUS_OK);
        assert_eq!(kiln_session_new(p, &mut s), KILN_STATUS_OK);
        let mut out = std::mem::zeroed::<kiln_tensor>();
        assert_eq!(kiln_session_run(s, &t, 1), KILN_STATUS_OK);
        let first = std::slice::from_raw_parts(out_data(s, &mut out), out.bytes).to_vec();
        let n = allocations_during(|| {
            for _ in 0..5 {
                assert_eq!(kiln_session_run(s, &t, 1), KILN_STATUS_OK);
                assert_eq!(kiln_session_output(s, 0, &mut out), KILN_STATUS_OK);
            }
        });
        assert_eq!(n, 0, "{n} allocations in 5 steady-state C API runs");
        // Still the same numbers after the recycled buffers were reused.
        assert_eq!(std::slice::from_raw_parts(out_data(s, &mut out), out.bytes), &first[..]);
        kiln_session_free(s);
        kiln_program_free(p);
    }
    let _ = std::fs::remove_file(&path);
}

/// Output 0's data pointer (fills `out`).
///
/// # Safety
/// `s` is a live session with a successful run.
unsafe fn out_data(s: *const kiln_session, out: &mut kiln_tensor) -> *const u8 {
    assert_eq!(unsafe { kiln_session_output(s, 0, out) }, KILN_STATUS_OK);
    out.data.cast()
}
