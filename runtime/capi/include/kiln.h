/*
 * kiln C API. Generated from runtime/capi/src/lib.rs by cbindgen; do not edit
 * (runtime/capi/tests/header.rs checks it; KILN_BLESS_HEADER=1 regenerates).
 *
 * Thread contract: a kiln_program is immutable and may be shared by threads;
 * a kiln_session is used by one thread at a time. The last-error message is
 * per thread.
 */

#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

/*
 A loaded, validated program (opaque). Immutable: share it between threads.
 */
typedef struct kiln_program kiln_program;

/*
 One execution context (opaque): owns the arena and the last run's outputs.
 Use from one thread at a time. It keeps its program alive, so the program
 handle may be freed first.
 */
typedef struct kiln_session kiln_session;

/*
 A status code; 0 is success. `kiln_status_message` describes a code,
 `kiln_last_error_message` the failure itself.
 */
typedef int32_t kiln_status;

/*
 An element type; the values are kiln's dtype codes.
 */
typedef int32_t kiln_dtype;

/*
 A dense row-major tensor. As an input, everything is the caller's and is
 read during the call only; as an output, `shape` and `data` point into the
 session and stay valid until its next run or its free.
 */
typedef struct kiln_tensor {
  kiln_dtype dtype;
  size_t rank;
  /*
   `rank` dimensions (may be null when `rank` is 0).
   */
  const int64_t *shape;
  /*
   `bytes` bytes of elements (may be null when `bytes` is 0).
   */
  const void *data;
  size_t bytes;
} kiln_tensor;

#define KILN_STATUS_OK 0

/*
 A null pointer, an unknown dtype, an out-of-range index, a negative dimension.
 */
#define KILN_STATUS_INVALID_ARGUMENT 1

/*
 The artifact file cannot be read.
 */
#define KILN_STATUS_IO 2

/*
 The artifact is malformed, corrupt, of another format version, or misaligned in memory.
 */
#define KILN_STATUS_BAD_ARTIFACT 3

/*
 The inputs do not match the program (count, dtype, shape, byte length).
 */
#define KILN_STATUS_BAD_INPUT 4

/*
 A kernel or a data-dependent size failed during the run.
 */
#define KILN_STATUS_RUN_FAILED 5

/*
 Memory could not be allocated, or the arena exceeds the session limit.
 */
#define KILN_STATUS_OUT_OF_MEMORY 6

/*
 The program needs a device this build or machine does not have.
 */
#define KILN_STATUS_DEVICE 7

/*
 `kiln_session_output` before a successful run.
 */
#define KILN_STATUS_NO_OUTPUTS 8

/*
 A bug in kiln (a caught panic); the message says where.
 */
#define KILN_STATUS_INTERNAL 9

/*
 A failed run may have left the session's state (a KV cache, a filter)
 partly updated, as states are written in place during a run: runs are
 refused until `kiln_session_reset_state`.
 */
#define KILN_STATUS_STATE_STALE 10

#define KILN_DTYPE_F32 0

#define KILN_DTYPE_F64 1

#define KILN_DTYPE_F16 2

#define KILN_DTYPE_BF16 3

#define KILN_DTYPE_I8 16

#define KILN_DTYPE_I16 17

#define KILN_DTYPE_I32 18

#define KILN_DTYPE_I64 19

#define KILN_DTYPE_U8 32

/*
 One byte per element, 0 or 1.
 */
#define KILN_DTYPE_BOOL 48

/*
 Two floats per element, real then imaginary (C's `float _Complex`).
 */
#define KILN_DTYPE_C64 64

/*
 Two doubles per element, real then imaginary (C's `double _Complex`).
 */
#define KILN_DTYPE_C128 65

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/*
 Memory-maps and validates the `.kiln` file at `path` (a NUL-terminated
 UTF-8 path). On success `*out` is a new program for `kiln_program_free`;
 on failure it is null.

 # Safety
 `path` is null or a valid C string; `out` is null or writable.
 */
kiln_status kiln_program_load(const char *path, struct kiln_program **out);

/*
 Validates the artifact in `data[0..len]` and uses it in place, weights
 included: nothing is copied. `data` must be 64-byte aligned
 (`KILN_STATUS_BAD_ARTIFACT` otherwise) and must stay valid and unchanged
 until the program and every session made from it are freed. On failure
 `*out` is null.

 # Safety
 `data` is null or readable for `len` bytes for that whole time; `out` is
 null or writable.
 */
kiln_status kiln_program_from_memory(const void *data, size_t len, struct kiln_program **out);

/*
 Frees a program (null is ignored). Sessions made from it stay usable.

 # Safety
 `program` is null or a handle from `kiln_program_load`/`_from_memory`,
 not freed before.
 */
void kiln_program_free(struct kiln_program *program);

/*
 Number of inputs `kiln_session_run` takes (0 for a null program).

 # Safety
 `program` is null or a live handle.
 */
size_t kiln_program_num_inputs(const struct kiln_program *program);

/*
 Number of outputs a run produces (0 for a null program).

 # Safety
 `program` is null or a live handle.
 */
size_t kiln_program_num_outputs(const struct kiln_program *program);

/*
 A new session on the CPU. On success `*out` is a session for
 `kiln_session_free`; on failure it is null.

 # Safety
 `program` is null or a live handle; `out` is null or writable.
 */
kiln_status kiln_session_new(const struct kiln_program *program, struct kiln_session **out);

/*
 Frees a session (null is ignored); its outputs become invalid.

 # Safety
 `session` is null or a handle from `kiln_session_new`, not freed before.
 */
void kiln_session_free(struct kiln_session *session);

/*
 Runs the program on `inputs[0..n_inputs]`, in the program's input order.
 Each input is checked (dtype, every dimension, byte length) before
 anything runs; a mismatch is `KILN_STATUS_BAD_INPUT` with a message naming
 the input. On failure the previous outputs are gone.

 # Safety
 `session` is null or a live handle; `inputs` is null or points at
 `n_inputs` tensors whose `shape` and `data` are readable as described.
 */
kiln_status kiln_session_run(struct kiln_session *session,
                             const struct kiln_tensor *inputs,
                             size_t n_inputs);

/*
 Puts every state of the session (buffers the program keeps between runs:
 KV caches, filters) back to its initial value, as in a new session; the
 way back after a failed run (`KILN_STATUS_STATE_STALE`). The outputs of
 the last run stay valid.

 # Safety
 `session` is null or a live handle, not shared during the call.
 */
kiln_status kiln_session_reset_state(struct kiln_session *session);

/*
 Output `index` of the last successful run: `out` gets pointers into the
 session, valid until its next run or free.

 # Safety
 `session` is null or a live handle; `out` is null or writable.
 */
kiln_status kiln_session_output(const struct kiln_session *session,
                                size_t index,
                                struct kiln_tensor *out);

/*
 A static description of a status code (never null).
 */
const char *kiln_status_message(kiln_status status);

/*
 The message of the last failed call on this thread ("" if none), valid
 until the next failing call on this thread.
 */
const char *kiln_last_error_message(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* KILN_H */
