//! Accelerators through PJRT plugins (cargo feature `pjrt`).
//!
//! kiln binds the PJRT C API itself ([`ffi`], written from the header) and
//! loads plugins with `dlopen`: the runtime links no XLA, MLIR or LLVM. The
//! safe layer ([`Plugin`], [`Client`], [`Executable`], [`Buffer`]) turns every
//! plugin error into [`crate::Error::Pjrt`] with the plugin's message.
//! A session with a PJRT device hands each `InstrOp::Delegate` instruction to
//! `accel::AccelState`; executables are cached on disk ([`cache`]).
//! Every module is checked by the collective verifier ([`verify`]) before
//! the plugin compiles it: a wrong collective mode aborts the plugin's
//! process at execute instead of failing the compile.

pub(crate) mod accel;
mod api;
mod buckets;
mod cache;
pub mod compile_options;
mod discover;
pub mod distributed;
/// The PJRT C API structs kiln's binding uses (public for test doubles of a
/// plugin; not a stable API).
#[doc(hidden)]
pub mod ffi;
mod hosts;
mod spmd;
mod state;
pub mod verify;

pub use api::{Buffer, Client, ClientOptions, DeviceInfo, Executable, Plugin};
pub use discover::{plugin_path, PLUGIN_ENV};

/// The PJRT C API version kiln's binding was written from.
pub const BINDING_API_VERSION: (i32, i32) = (ffi::HEADER_MAJOR, ffi::HEADER_MINOR);
