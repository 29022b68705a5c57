//! What every kernel call receives besides its tensors.

use crate::parallel::Threads;
use crate::table::{best, Isa, KernelTable};
use crate::types::Scratch;

/// The per-session (per-thread) context a kernel runs in: its reusable
/// scratch memory, the kernel table its inner loops call through, the
/// threads its kernels split their work over (one by default; see
/// [`Context::set_threads`]), and where in the seeded random sequence this
/// run is. Owned by the caller — one per
/// runtime session — so steady-state execution allocates nothing and
/// sessions never share mutable state.
#[derive(Debug)]
pub struct Context {
    pub(crate) scratch: Scratch,
    /// The table of ISA variants; [`best`] unless chosen with
    /// [`Context::with_table`].
    pub(crate) table: &'static KernelTable,
    /// The session's generator seed (see [`crate::random`]).
    pub seed: u64,
    /// How many runs the session made before this one: with the seed and a
    /// random instruction's stream, the position of its numbers.
    pub call: u64,
}

impl Default for Context {
    fn default() -> Context {
        Context::with_table(best())
    }
}

impl Context {
    /// A context running the best kernels this CPU has.
    pub fn new() -> Context {
        Context::default()
    }

    /// A context whose kernels call through `table` (e.g.
    /// [`KernelTable::generic_only`] to run the portable code everywhere).
    pub fn with_table(table: &'static KernelTable) -> Context {
        Context { scratch: Scratch::default(), table, seed: 0, call: 0 }
    }

    /// The scratch memory, for callers that run kernels' helpers directly.
    pub fn scratch(&mut self) -> &mut Scratch {
        &mut self.scratch
    }

    /// The kernel table this context's kernels call through.
    pub fn table(&self) -> &'static KernelTable {
        self.table
    }

    /// Splits this context's kernels over the process-wide pool of `count`
    /// threads (1: the calling thread only). Results do not depend on it.
    pub fn set_threads(&mut self, count: usize) {
        self.scratch.pack.threads = Threads::new(count);
    }

    /// [`Context::set_threads`], builder style.
    pub fn with_threads(mut self, count: usize) -> Context {
        self.set_threads(count);
        self
    }

    /// The threads this context's kernels run on.
    pub fn threads(&self) -> Threads {
        self.scratch.pack.threads
    }

    /// How many times a GEMM packed a slice of its B operand in this
    /// context (GEMMs on a [`crate::PackedB`] never do).
    pub fn b_packs(&self) -> u64 {
        self.scratch.pack.b_packs
    }

    /// The ISA level of that table.
    pub fn isa(&self) -> Isa {
        self.table.isa()
    }
}
