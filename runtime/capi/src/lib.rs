//! kiln's C API: [`kiln_runtime`] behind opaque handles, status codes and a
//! per-thread last-error message. `include/kiln.h` is generated from this file
//! (`tests/header.rs` checks it is current).
//!
//! Every function catches panics (none may cross into C) and checks its
//! pointers; a null handle or output pointer is `KILN_STATUS_INVALID_ARGUMENT`.
//! Memory the caller passes in stays the caller's: inputs are read during
//! `kiln_session_run` only; `kiln_program_from_memory` uses the artifact in
//! place, so it must outlive the program and every session made from it.

#![allow(non_camel_case_types)]

use kiln_runtime::{DType, Error, Program, Session, TensorView};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// A status code; 0 is success. `kiln_status_message` describes a code,
/// `kiln_last_error_message` the failure itself.
pub type kiln_status = i32;

pub const KILN_STATUS_OK: kiln_status = 0;
/// A null pointer, an unknown dtype, an out-of-range index, a negative dimension.
pub const KILN_STATUS_INVALID_ARGUMENT: kiln_status = 1;
/// The artifact file cannot be read.
pub const KILN_STATUS_IO: kiln_status = 2;
/// The artifact is malformed, corrupt, of another format version, or misaligned in memory.
pub const KILN_STATUS_BAD_ARTIFACT: kiln_status = 3;
/// The inputs do not match the program (count, dtype, shape, byte length).
pub const KILN_STATUS_BAD_INPUT: kiln_status = 4;
/// A kernel or a data-dependent size failed during the run.
pub const KILN_STATUS_RUN_FAILED: kiln_status = 5;
/// Memory could not be allocated, or the arena exceeds the session limit.
pub const KILN_STATUS_OUT_OF_MEMORY: kiln_status = 6;
/// The program needs a device this build or machine does not have.
pub const KILN_STATUS_DEVICE: kiln_status = 7;
/// `kiln_session_output` before a successful run.
pub const KILN_STATUS_NO_OUTPUTS: kiln_status = 8;
/// A bug in kiln (a caught panic); the message says where.
pub const KILN_STATUS_INTERNAL: kiln_status = 9;
/// A failed run may have left the session's state (a KV cache, a filter)
/// partly updated, as states are written in place during a run: runs are
/// refused until `kiln_session_reset_state`.
pub const KILN_STATUS_STATE_STALE: kiln_status = 10;

/// An element type; the values are kiln's dtype codes.
pub type kiln_dtype = i32;

pub const KILN_DTYPE_F32: kiln_dtype = 0;
pub const KILN_DTYPE_F64: kiln_dtype = 1;
pub const KILN_DTYPE_F16: kiln_dtype = 2;
pub const KILN_DTYPE_BF16: kiln_dtype = 3;
pub const KILN_DTYPE_I8: kiln_dtype = 16;
pub const KILN_DTYPE_I16: kiln_dtype = 17;
pub const KILN_DTYPE_I32: kiln_dtype = 18;
pub const KILN_DTYPE_I64: kiln_dtype = 19;
pub const KILN_DTYPE_U8: kiln_dtype = 32;
/// One byte per element, 0 or 1.
pub const KILN_DTYPE_BOOL: kiln_dtype = 48;
/// Two floats per element, real then imaginary (C's `float _Complex`).
pub const KILN_DTYPE_C64: kiln_dtype = 64;
/// Two doubles per element, real then imaginary (C's `double _Complex`).
pub const KILN_DTYPE_C128: kiln_dtype = 65;

/// A dense row-major tensor. As an input, everything is the caller's and is
/// read during the call only; as an output, `shape` and `data` point into the
/// session and stay valid until its next run or its free.
#[repr(C)]
pub struct kiln_tensor {
    pub dtype: kiln_dtype,
    pub rank: usize,
    /// `rank` dimensions (may be null when `rank` is 0).
    pub shape: *const i64,
    /// `bytes` bytes of elements (may be null when `bytes` is 0).
    pub data: *const c_void,
    pub bytes: usize,
}

/// A loaded, validated program (opaque). Immutable: share it between threads.
pub struct kiln_program {
    program: Arc<Program>,
}

/// One execution context (opaque): owns the arena and the last run's outputs.
/// Use from one thread at a time. It keeps its program alive, so the program
/// handle may be freed first.
pub struct kiln_session {
    session: Session,
    /// Input shapes converted to `usize`, reused between runs.
    input_shapes: Vec<Vec<usize>>,
    /// The views handed to `Session::run`: always empty between calls, kept
    /// for its capacity so that a run allocates nothing (see [`recycle`]).
    views: Vec<TensorView<'static>>,
    /// One slot per program output, reused between runs (their shapes keep
    /// their capacity); meaningful only while `outputs_valid`.
    outputs: Vec<OutputSlot>,
    /// Whether `outputs` holds the last run's results: false before the first
    /// successful run and after a failed one.
    outputs_valid: bool,
}

/// An empty vector of `T<'b>` on the allocation of an empty `Vec<T<'a>>`:
/// lets the session keep one views buffer across runs although each run's
/// views borrow that run's inputs. In-place collection reuses the allocation
/// (same layout); the vector is empty, so no element is ever converted.
// `filter_map` rather than `filter`: the element type changes (the lifetime).
#[allow(clippy::unnecessary_filter_map)]
fn recycle<'a, 'b>(mut v: Vec<TensorView<'a>>) -> Vec<TensorView<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// An output as C sees it: its shape in `int64_t`, its bytes in the arena.
#[derive(Clone)]
struct OutputSlot {
    dtype: kiln_dtype,
    shape: Vec<i64>,
    data: *const u8,
    bytes: usize,
}

/// A failure on its way to C: a status and the message for `kiln_last_error_message`.
struct Failure {
    status: kiln_status,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure { status: KILN_STATUS_INVALID_ARGUMENT, message: message.into() }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match &e {
            Error::Io { .. } => KILN_STATUS_IO,
            Error::Format { .. }
            | Error::Version { .. }
            | Error::Checksum { .. }
            | Error::Plan(_)
            | Error::Misaligned { .. } => KILN_STATUS_BAD_ARTIFACT,
            Error::Input { .. } | Error::Shape(_) | Error::State { .. } => KILN_STATUS_BAD_INPUT,
            Error::Kernel { .. } | Error::DataDependent { .. } => KILN_STATUS_RUN_FAILED,
            Error::StaleState { .. } => KILN_STATUS_STATE_STALE,
            Error::ArenaLimit { .. } | Error::OutOfMemory { .. } => KILN_STATUS_OUT_OF_MEMORY,
            Error::Pjrt { .. } | Error::Device(_) => KILN_STATUS_DEVICE,
        };
        Failure { status, message: e.to_string() }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // An interior NUL would truncate the C string; replace it rather than lose the message.
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
}

/// Runs `body`, turning its failure or panic into a status and the thread's last error.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> kiln_status {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return KILN_STATUS_OK,
        Ok(Err(f)) => f,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Failure { status: KILN_STATUS_INTERNAL, message: format!("internal error (please report): {what}") }
        }
    };
    set_last_error(&failure.message);
    failure.status
}

/// Writes a new handle to `out`, which must not be null (checked first); a
/// failure leaves null there, so a caller never sees a stale handle.
fn emit<T>(out: *mut *mut T, make: impl FnOnce() -> Result<T, Failure>) -> kiln_status {
    guard(|| {
        if out.is_null() {
            return Err(Failure::invalid("the output handle pointer is null"));
        }
        // SAFETY: `out` is non-null and, per the API contract, writable.
        unsafe { *out = std::ptr::null_mut() };
        let handle = Box::into_raw(Box::new(make()?));
        // SAFETY: `out` is non-null and, per the API contract, writable.
        unsafe { *out = handle };
        Ok(())
    })
}

/// Caller memory used in place by `kiln_program_from_memory`.
struct ForeignBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are only read, and the caller guarantees they stay valid
// and unchanged while the program lives (the documented contract).
unsafe impl Send for ForeignBytes {}
// SAFETY: as above; shared reads of immutable memory.
unsafe impl Sync for ForeignBytes {}

impl AsRef<[u8]> for ForeignBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is non-null (checked on construction) and valid for
        // `len` bytes for the program's life (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Memory-maps and validates the `.kiln` file at `path` (a NUL-terminated
/// UTF-8 path). On success `*out` is a new program for `kiln_program_free`;
/// on failure it is null.
///
/// # Safety
/// `path` is null or a valid C string; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_load(path: *const c_char, out: *mut *mut kiln_program) -> kiln_status {
    emit(out, || {
        if path.is_null() {
            return Err(Failure::invalid("path is null"));
        }
        // SAFETY: non-null, and a C string per the contract.
        let path = unsafe { CStr::from_ptr(path) }.to_str().map_err(|_| Failure::invalid("path is not valid UTF-8"))?;
        Ok(kiln_program { program: Program::load(path)? })
    })
}

/// Validates the artifact in `data[0..len]` and uses it in place, weights
/// included: nothing is copied. `data` must be 64-byte aligned
/// (`KILN_STATUS_BAD_ARTIFACT` otherwise) and must stay valid and unchanged
/// until the program and every session made from it are freed. On failure
/// `*out` is null.
///
/// # Safety
/// `data` is null or readable for `len` bytes for that whole time; `out` is
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_from_memory(
    data: *const c_void,
    len: usize,
    out: *mut *mut kiln_program,
) -> kiln_status {
    emit(out, || {
        if data.is_null() {
            return Err(Failure::invalid("data is null"));
        }
        Ok(kiln_program { program: Program::from_owner(ForeignBytes { ptr: data.cast(), len })? })
    })
}

/// Frees a program (null is ignored). Sessions made from it stay usable.
///
/// # Safety
/// `program` is null or a handle from `kiln_program_load`/`_from_memory`,
/// not freed before.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_free(program: *mut kiln_program) {
    if !program.is_null() {
        // SAFETY: a handle we boxed, freed once (the contract).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(program) })));
    }
}

/// Number of inputs `kiln_session_run` takes (0 for a null program).
///
/// # Safety
/// `program` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_num_inputs(program: *const kiln_program) -> usize {
    // SAFETY: null or live (the contract).
    unsafe { program.as_ref() }.map_or(0, |p| p.program.plan().inputs.len())
}

/// Number of outputs a run produces (0 for a null program).
///
/// # Safety
/// `program` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_num_outputs(program: *const kiln_program) -> usize {
    // SAFETY: null or live (the contract).
    unsafe { program.as_ref() }.map_or(0, |p| p.program.plan().outputs.len())
}

/// A new session on the CPU. On success `*out` is a session for
/// `kiln_session_free`; on failure it is null.
///
/// # Safety
/// `program` is null or a live handle; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_new(program: *const kiln_program, out: *mut *mut kiln_session) -> kiln_status {
    emit(out, || {
        // SAFETY: null or live (the contract).
        let program = unsafe { program.as_ref() }.ok_or_else(|| Failure::invalid("program is null"))?;
        let plan = program.program.plan();
        let (n_inputs, n_outputs) = (plan.inputs.len(), plan.outputs.len());
        let slot = OutputSlot {
            dtype: 0,
            shape: Vec::with_capacity(kiln_runtime::MAX_RANK),
            data: std::ptr::null(),
            bytes: 0,
        };
        Ok(kiln_session {
            session: program.program.session()?,
            input_shapes: vec![Vec::with_capacity(kiln_runtime::MAX_RANK); n_inputs],
            views: Vec::with_capacity(n_inputs),
            outputs: (0..n_outputs).map(|_| slot.clone()).collect(),
            outputs_valid: false,
        })
    })
}

/// Frees a session (null is ignored); its outputs become invalid.
///
/// # Safety
/// `session` is null or a handle from `kiln_session_new`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_free(session: *mut kiln_session) {
    if !session.is_null() {
        // SAFETY: a handle we boxed, freed once (the contract).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}

/// Runs the program on `inputs[0..n_inputs]`, in the program's input order.
/// Each input is checked (dtype, every dimension, byte length) before
/// anything runs; a mismatch is `KILN_STATUS_BAD_INPUT` with a message naming
/// the input. On failure the previous outputs are gone.
///
/// # Safety
/// `session` is null or a live handle; `inputs` is null or points at
/// `n_inputs` tensors whose `shape` and `data` are readable as described.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_run(
    session: *mut kiln_session,
    inputs: *const kiln_tensor,
    n_inputs: usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: null or live and not shared during the call (the contract).
        let s = unsafe { session.as_mut() }.ok_or_else(|| Failure::invalid("session is null"))?;
        s.outputs_valid = false;
        let inputs: &[kiln_tensor] = match n_inputs {
            0 => &[],
            _ if inputs.is_null() => return Err(Failure::invalid("inputs is null")),
            // SAFETY: non-null and `n_inputs` long (the contract).
            _ => unsafe { std::slice::from_raw_parts(inputs, n_inputs) },
        };
        let expected = s.input_shapes.len();
        if inputs.len() != expected {
            return Err(Failure {
                status: KILN_STATUS_BAD_INPUT,
                message: format!("expected {expected} inputs, got {}", inputs.len()),
            });
        }
        for (i, (t, shape)) in inputs.iter().zip(s.input_shapes.iter_mut()).enumerate() {
            // SAFETY: `t.shape` is readable for `t.rank` values (the contract).
            unsafe { read_shape(t, shape) }.map_err(|m| Failure::invalid(format!("input {i}: {m}")))?;
        }
        let mut views = recycle(std::mem::take(&mut s.views));
        for (i, (t, shape)) in inputs.iter().zip(&s.input_shapes).enumerate() {
            let dtype = dtype_from_c(t.dtype).map_err(|m| Failure::invalid(format!("input {i}: {m}")))?;
            let data: &[u8] = match t.bytes {
                0 => &[],
                _ if t.data.is_null() => return Err(Failure::invalid(format!("input {i}: data is null"))),
                // SAFETY: readable for `bytes` bytes during the call (the contract).
                n => unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), n) },
            };
            views.push(TensorView { dtype, shape, data });
        }
        let result = s.session.run(&views);
        let outputs = match result {
            Ok(outputs) => outputs,
            Err(e) => {
                s.views = recycle(views);
                return Err(e.into());
            }
        };
        for (slot, o) in s.outputs.iter_mut().zip(outputs.iter()) {
            slot.dtype = i32::from(o.dtype.code());
            slot.shape.clear();
            slot.shape.extend(o.shape.iter().map(|&d| d as i64));
            slot.data = o.data.as_ptr();
            slot.bytes = o.data.len();
        }
        s.views = recycle(views);
        s.outputs_valid = true;
        Ok(())
    })
}

/// Puts every state of the session (buffers the program keeps between runs:
/// KV caches, filters) back to its initial value, as in a new session; the
/// way back after a failed run (`KILN_STATUS_STATE_STALE`). The outputs of
/// the last run stay valid.
///
/// # Safety
/// `session` is null or a live handle, not shared during the call.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_reset_state(session: *mut kiln_session) -> kiln_status {
    guard(|| {
        // SAFETY: null or live and not shared during the call (the contract).
        let s = unsafe { session.as_mut() }.ok_or_else(|| Failure::invalid("session is null"))?;
        s.session.reset_state();
        Ok(())
    })
}

/// Copies `t.shape` (checked: non-negative, at most the runtime's rank) into `shape`.
///
/// # Safety
/// `t.shape` is null or readable for `t.rank` values.
unsafe fn read_shape(t: &kiln_tensor, shape: &mut Vec<usize>) -> Result<(), String> {
    if t.rank > kiln_runtime::MAX_RANK {
        return Err(format!("rank {} exceeds the maximum of {}", t.rank, kiln_runtime::MAX_RANK));
    }
    shape.clear();
    if t.rank == 0 {
        return Ok(());
    }
    if t.shape.is_null() {
        return Err(format!("rank is {} but shape is null", t.rank));
    }
    // SAFETY: non-null and `rank` long (the contract).
    let dims = unsafe { std::slice::from_raw_parts(t.shape, t.rank) };
    for (axis, &d) in dims.iter().enumerate() {
        let d = usize::try_from(d).map_err(|_| format!("dimension {axis} is {d}"))?;
        shape.push(d);
    }
    Ok(())
}

fn dtype_from_c(code: kiln_dtype) -> Result<DType, String> {
    u16::try_from(code).ok().and_then(|c| DType::from_code(c).ok()).ok_or_else(|| format!("unknown dtype code {code}"))
}

/// Output `index` of the last successful run: `out` gets pointers into the
/// session, valid until its next run or free.
///
/// # Safety
/// `session` is null or a live handle; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_output(
    session: *const kiln_session,
    index: usize,
    out: *mut kiln_tensor,
) -> kiln_status {
    guard(|| {
        // SAFETY: null or live (the contract).
        let s = unsafe { session.as_ref() }.ok_or_else(|| Failure::invalid("session is null"))?;
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        if s.outputs.is_empty() {
            return Err(Failure::invalid(format!("output {index}: the program has no outputs")));
        }
        if !s.outputs_valid {
            return Err(Failure { status: KILN_STATUS_NO_OUTPUTS, message: "no successful run yet".into() });
        }
        let o = s.outputs.get(index).ok_or_else(|| {
            Failure::invalid(format!("output {index} does not exist (the program has {})", s.outputs.len()))
        })?;
        let tensor = kiln_tensor {
            dtype: o.dtype,
            rank: o.shape.len(),
            shape: o.shape.as_ptr(),
            data: o.data.cast(),
            bytes: o.bytes,
        };
        // SAFETY: non-null and writable (the contract).
        unsafe { out.write(tensor) };
        Ok(())
    })
}

/// A static description of a status code (never null).
#[no_mangle]
pub extern "C" fn kiln_status_message(status: kiln_status) -> *const c_char {
    let text: &'static CStr = match status {
        KILN_STATUS_OK => c"success",
        KILN_STATUS_INVALID_ARGUMENT => c"invalid argument",
        KILN_STATUS_IO => c"cannot read the artifact file",
        KILN_STATUS_BAD_ARTIFACT => c"malformed, corrupt, incompatible or misaligned artifact",
        KILN_STATUS_BAD_INPUT => c"inputs do not match the program",
        KILN_STATUS_RUN_FAILED => c"the run failed",
        KILN_STATUS_OUT_OF_MEMORY => c"out of memory or over the session's memory limit",
        KILN_STATUS_DEVICE => c"device unavailable",
        KILN_STATUS_NO_OUTPUTS => c"no successful run yet",
        KILN_STATUS_INTERNAL => c"internal error",
        KILN_STATUS_STATE_STALE => c"a failed run left the session's state partly updated; reset it",
        _ => c"unknown status",
    };
    text.as_ptr()
}

/// The message of the last failed call on this thread ("" if none), valid
/// until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn kiln_last_error_message() -> *const c_char {
    // The CString lives in the thread-local until it is replaced by the next failure.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
