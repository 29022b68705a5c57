//! kiln's CPU kernels.
//!
//! Every kernel takes contiguous row-major tensors as bytes plus a dtype and a
//! shape ([`TensorRef`] / [`TensorMut`]), dispatches on the dtype, and reports
//! problems as [`KernelError`] values — never a panic. Kernels do not allocate on
//! their own: temporary buffers come from a caller-owned [`Scratch`], which grows
//! only when a larger shape than ever before is seen.
//!
//! Layout follows tract-linalg: `generic` is the portable implementation and the
//! test oracle; ISA-specific variants (chosen at run time after CPU detection)
//! sit beside it and are tested against it. The public functions re-exported
//! here are the dispatch points: today they are the generic kernels, and the
//! GEMM microkernel is where an ISA variant plugs in first.

mod generic;
mod types;
#[cfg(target_arch = "x86_64")]
mod x86_64;

pub use types::{BinaryOp, DType, KernelError, PoolKind, ReduceKind, Result, Scratch, TensorMut, TensorRef, UnaryOp};

pub use generic::attention::attention;
pub use generic::conv::{conv, conv_with, ConvAlgorithm, ConvParams};
pub use generic::elementwise::{binary, cast, clamp, unary, where_};
pub use generic::gemm::gemm_f32;
pub use generic::layout::{arange, concat, copy, expand, fill, gather, permute, slice};
pub use generic::matmul::{linear, matmul};
pub use generic::norm::{batch_norm, layer_norm, softmax};
pub use generic::pad::{flip, pad, PadMode, PadParams};
pub use generic::pool::{adaptive_avg_pool, pool, PoolParams};
pub use generic::random::{random, RandomDist, RandomKey};
pub use generic::reduce::{argmax, argmin, cumsum, reduce};
pub use generic::resize::{resize, ResizeMode, ResizeParams};
pub use generic::scatter::{gather_elements, index_gather, index_put, scatter_elements};
pub use generic::select::nonzero;
pub use generic::sort::sort;
