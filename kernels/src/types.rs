//! Types shared by every kernel: tensor views, errors, scratch memory; the
//! dtypes and op selectors come from `kiln-isa`.

use std::fmt;

pub use kiln_isa::{BinaryOp, DType, PoolKind, ReduceKind, UnaryOp};

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
}

/// Packed GEMM panels; separate from the general buffer so a kernel can hold
/// an im2col / score buffer while the GEMM packs its operands.
#[derive(Default, Debug)]
pub(crate) struct PackBuffers {
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
}

impl PackBuffers {
    /// Grows (never shrinks) the panels to the requested lengths.
    pub(crate) fn reserve(&mut self, a_len: usize, b_len: usize) -> (&mut [f32], &mut [f32]) {
        if self.a.len() < a_len {
            self.a.resize(a_len, 0.0);
        }
        if self.b.len() < b_len {
            self.b.resize(b_len, 0.0);
        }
        (&mut self.a[..a_len], &mut self.b[..b_len])
    }
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch::default()
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
