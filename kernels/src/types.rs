//! Types shared by every kernel: tensor views, errors, scratch memory; the
//! dtypes and op selectors come from `kiln-isa`.

use crate::parallel::Threads;
use crate::table::KernelTable;
use std::fmt;
use std::sync::Mutex;

pub use kiln_isa::{BinaryOp, DType, LinalgOp, PoolKind, ReduceKind, ScanKind, UnaryOp};

/// A read-only contiguous row-major tensor.
#[derive(Copy, Clone, Debug)]
pub struct TensorRef<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// A writable contiguous row-major tensor.
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a mut [u8],
}

/// Why a kernel refused to run.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelError {
    /// The kernel has no implementation for this dtype (combination).
    UnsupportedDType { kernel: &'static str, dtype: DType },
    /// Shapes, lengths or parameters do not fit together.
    Shape { kernel: &'static str, detail: String },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::UnsupportedDType { kernel, dtype } => {
                write!(f, "kernel `{kernel}` does not support dtype {dtype}")
            }
            KernelError::Shape { kernel, detail } => write!(f, "kernel `{kernel}`: {detail}"),
        }
    }
}

impl std::error::Error for KernelError {}

pub type Result<T> = std::result::Result<T, KernelError>;

/// Reusable temporary memory for kernels (im2col buffers, packed panels,
/// attention scores). Owned by the caller — one per runtime session — so that
/// steady-state execution allocates nothing.
#[derive(Default, Debug)]
pub struct Scratch {
    f32s: Vec<f32>,
    f64s: Vec<f64>,
    idx: Vec<usize>,
    pub(crate) pack: PackBuffers,
    /// Channels-first copies a channels-last convolution takes apart
    /// from the others while its channels-first kernel uses the scratch.
    pub(crate) layout: Vec<f32>,
    /// One scratch per thread, for kernels that hand whole sub-problems
    /// (a batch entry, a convolution group) to each thread.
    workers: Vec<Mutex<Scratch>>,
}

/// A scratch's per-thread scratches, borrowed apart from its panels.
pub(crate) struct WorkerPool<'a>(&'a mut Vec<Mutex<Scratch>>);

impl<'a> WorkerPool<'a> {
    /// See [`Scratch::workers`].
    pub(crate) fn workers(self, n: usize, prepare: impl Fn(&mut Scratch)) -> &'a [Mutex<Scratch>] {
        if self.0.len() < n {
            self.0.resize_with(n, Default::default);
        }
        for w in &mut self.0[..n] {
            prepare(w.get_mut().unwrap_or_else(|e| e.into_inner()));
        }
        &self.0[..n]
    }
}

/// Packed GEMM panels and the threads that fill and read them; separate
/// from the general buffer so a kernel can hold an im2col / score buffer
/// while the GEMM packs its operands.
#[derive(Default, Debug)]
pub(crate) struct PackBuffers {
    /// The pool GEMMs split their tiles over (set by the [`crate::Context`]).
    pub(crate) threads: Threads,
    /// One A block per thread of the pool (a thread locks only its own).
    a: Vec<Mutex<Vec<f32>>>,
    /// The B slice, shared by all threads.
    b: Vec<f32>,
    /// How many B slices were packed since the context was made (packed
    /// weights must keep this at zero for their GEMMs).
    pub(crate) b_packs: u64,
}

impl PackBuffers {
    /// Grows (never shrinks) `threads` A blocks and the B slice to the
    /// requested lengths, before any worker runs, so that a steady-state
    /// call allocates nothing whichever thread picks up which item.
    pub(crate) fn reserve(
        &mut self,
        threads: usize,
        a_len: usize,
        b_len: usize,
    ) -> (&[Mutex<Vec<f32>>], &mut [f32], &mut u64) {
        if self.a.len() < threads {
            self.a.resize_with(threads, Default::default);
        }
        for a in &mut self.a[..threads] {
            let a = a.get_mut().unwrap_or_else(|e| e.into_inner());
            if a.len() < a_len {
                a.resize(a_len, 0.0);
            }
        }
        if self.b.len() < b_len {
            self.b.resize(b_len, 0.0);
        }
        (&self.a[..threads], &mut self.b[..b_len], &mut self.b_packs)
    }

    /// Bytes the A blocks and the B slice hold.
    fn bytes(&self) -> usize {
        let a: usize = self.a.iter().map(|a| a.lock().unwrap_or_else(|e| e.into_inner()).len()).sum();
        (a + self.b.len()) * 4
    }

    /// Grows the panels to what a single-threaded m×n×k GEMM of `table`
    /// packs.
    pub(crate) fn reserve_gemm(&mut self, table: &KernelTable, m: usize, n: usize, k: usize) {
        let (a, b) = crate::generic::gemm::pack_lengths(&table.gemm, m, n, k, false);
        self.reserve(1, a, b);
    }
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch::default()
    }

    /// The GEMM panels, and the scratch itself for [`Scratch::workers`].
    pub(crate) fn pack_and_workers(&mut self) -> (&mut PackBuffers, WorkerPool<'_>) {
        (&mut self.pack, WorkerPool(&mut self.workers))
    }

    /// `n` per-thread scratches (their GEMMs single-threaded), each grown by
    /// `prepare` to what one sub-problem needs before any worker runs: so a
    /// steady-state call allocates nothing whichever thread takes which part.
    pub(crate) fn workers(&mut self, n: usize, prepare: impl Fn(&mut Scratch)) -> &[Mutex<Scratch>] {
        WorkerPool(&mut self.workers).workers(n, prepare)
    }

    /// Bytes its buffers hold now (general, f64 and index buffers, GEMM
    /// panels, per-thread scratches): what a session keeps between runs.
    pub fn bytes(&self) -> usize {
        let own = self.f32s.len() * 4 + self.f64s.len() * 8 + self.idx.len() * std::mem::size_of::<usize>();
        let workers: usize = self.workers.iter().map(|w| w.lock().unwrap_or_else(|e| e.into_inner()).bytes()).sum();
        own + self.layout.len() * 4 + self.pack.bytes() + workers
    }

    /// A zero-initialised-on-growth buffer of at least `len` f32s.
    pub fn f32s(&mut self, len: usize) -> &mut [f32] {
        if self.f32s.len() < len {
            self.f32s.resize(len, 0.0);
        }
        &mut self.f32s[..len]
    }

    /// A buffer of at least `len` indices (contents unspecified).
    pub fn indices(&mut self, len: usize) -> &mut [usize] {
        if self.idx.len() < len {
            self.idx.resize(len, 0);
        }
        &mut self.idx[..len]
    }

    /// The general buffer (like [`Scratch::f32s`]) together with the GEMM
    /// panels, borrowed at the same time.
    pub(crate) fn split(&mut self, len: usize) -> (&mut [f32], &mut PackBuffers) {
        if self.f32s.len() < len {
            self.f32s.resize(len, 0.0);
        }
        (&mut self.f32s[..len], &mut self.pack)
    }

    /// [`Scratch::split`] with an f64 buffer (f64 attention scores).
    pub(crate) fn split_f64(&mut self, len: usize) -> (&mut [f64], &mut PackBuffers) {
        if self.f64s.len() < len {
            self.f64s.resize(len, 0.0);
        }
        (&mut self.f64s[..len], &mut self.pack)
    }
}
