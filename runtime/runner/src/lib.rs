//! Running and inspecting `.kiln` artifacts with the runtime alone: the
//! `run` and `inspect` commands shared by `kiln` (the compiler's CLI) and
//! `kiln-run` (this crate's binary, which links no compiler — what an edge
//! box or a robot installs).
//!
//! - [`npy`]: `.npy` reading and writing; [`steps`]: `--steps` folders.
//! - [`cmd_run`] with [`RunArgs`]; [`cmd_inspect`].

#[cfg(feature = "pjrt")]
mod hosts;
mod inspect;
pub mod npy;
mod run;
pub mod steps;

pub use inspect::{cmd_inspect, human_bytes};
pub use run::{cmd_run, load, CliResult, RunArgs};
