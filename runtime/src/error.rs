//! Runtime errors: values, never panics.

use kiln_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("malformed artifact: section `{section}` at offset {offset}: {detail}")]
    Format { section: String, offset: u64, detail: String },
    /// `supported` is (major, oldest minor, newest minor).
    #[error("artifact format {}.{} is not supported by this runtime (reads {}.{} to {}.{}; recompile the model with a matching kiln)", found.0, found.1, supported.0, supported.1, supported.0, supported.2)]
    Version { found: (u16, u16), supported: (u16, u16, u16) },
    #[error(
        "checksum mismatch in section `{section}`: stored {expected:#010x}, computed {found:#010x} (file corrupted?)"
    )]
    Checksum { section: String, expected: u32, found: u32 },
    /// An artifact used in place (`Program::from_static`, `from_owner`, the
    /// C API's `kiln_program_from_memory`) is not at an address its weights
    /// can be read from.
    #[error("the artifact in memory starts at address {address:#x}, which is not {align}-byte aligned; its weights are used in place and need that alignment (align the buffer, or use Program::from_bytes, which copies)")]
    Misaligned { address: usize, align: usize },
    #[error("invalid plan: {0}")]
    Plan(String),
    #[error("input {index} (`{name}`): {detail}")]
    Input { index: usize, name: String, detail: String },
    #[error("{0}")]
    Shape(String),
    /// `Session::state` / `set_state`: no such state, or a value of the
    /// wrong dtype or shape.
    #[error("state `{name}`: {detail}")]
    State { name: String, detail: String },
    /// A failed run may have left state `name` partly updated (it is
    /// written in place during the run): the session refuses to run or read
    /// it until `Session::reset_state` / `set_state` (C:
    /// `kiln_session_reset_state`).
    #[error("state `{name}`: a failed run may have left it partly updated (it is written in place during the run); call reset_state() or set_state() before running again")]
    StaleState { name: String },
    #[error("instruction {index} ({origin}): {source}")]
    Kernel { index: usize, origin: String, source: KernelError },
    /// A value computed during the run (a nonzero count, a `.item()` used
    /// as a size) falls outside the bounds its symbol was compiled for.
    #[error("instruction {index} ({origin}): data-dependent size {detail}")]
    DataDependent { index: usize, origin: String, detail: String },
    /// The plan's arena exceeds [`crate::SessionOptions::max_arena_bytes`].
    #[error("the session arena needs {bytes} bytes, more than the limit of {limit} (SessionOptions::max_arena_bytes, `kiln run --max-memory`)")]
    ArenaLimit { bytes: u64, limit: u64 },
    #[error("cannot allocate {bytes} bytes for the session arena")]
    OutOfMemory { bytes: u64 },
    /// A PJRT plugin call failed; `message` is the plugin's own.
    #[error("PJRT {call} failed: {message}")]
    Pjrt { call: String, message: String },
    /// Device selection: unknown device, no plugin found, no such device, or
    /// an artifact that needs a device the session does not have.
    #[error("{0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, Error>;
