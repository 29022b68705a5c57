//! kiln's embeddable runtime.
//!
//! ```no_run
//! # fn main() -> Result<(), kiln_runtime::Error> {
//! use kiln_runtime::{Program, Tensor};
//! let program = Program::load("model.kiln")?;      // mmap + full validation
//! let mut session = program.session()?;            // one per thread; owns the arena
//! let x = Tensor::from_f32(&[1, 16], &[0.0; 16]);
//! let outputs = session.run(&[x.view()])?;
//! println!("{:?}", outputs.get(0).shape);
//! # Ok(()) }
//! ```
//!
//! The runtime owns the artifact format ([`format`]); the compiler writes it
//! through [`format::ArtifactWriter`]. It never links MLIR or LLVM and does not
//! depend on the compiler's IR.

mod aligned;
#[cfg(feature = "delta")]
pub mod delta;
mod device;
mod error;
mod exec;
pub mod format;
pub mod native;
#[cfg(feature = "pjrt")]
pub mod pjrt;
mod program;
mod session;
mod state;
mod validate;

pub use aligned::ARENA_ALIGN;
pub use device::{
    default_threads, AccelInfo, AccelStats, Device, ExecutableCache, SegmentStats, SessionOptions,
    DEFAULT_MAX_ARENA_BYTES,
};
pub use error::{Error, Result};
pub use kiln_kernels::{DType, KernelError};
pub use program::{IoInfo, Program};
pub use session::{elements_f64, InstrTime, Outputs, Session, Tensor, TensorView};
pub use state::{StateWriteInfo, StateWriteKind};
pub use validate::MAX_RANK;

#[cfg(test)]
mod tests {
    use super::*;
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn program_is_shareable_and_sessions_movable() {
        assert_send_sync::<Program>();
        // Embedders call into a program from behind `catch_unwind`.
        fn assert_unwind_safe<T: std::panic::RefUnwindSafe>() {}
        assert_unwind_safe::<Program>();
        fn assert_send<T: Send>() {}
        assert_send::<Session>();
    }
}
