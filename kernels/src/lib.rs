//! kiln's CPU kernels.
//!
//! Every kernel takes contiguous row-major tensors as bytes plus a dtype and a
//! shape ([`TensorRef`] / [`TensorMut`]), dispatches on the dtype, and reports
//! problems as [`KernelError`] values — never a panic. Kernels do not allocate on
//! their own: temporary buffers come from the caller-owned [`Context`]'s
//! [`Scratch`], which grows only when a larger shape than ever before is seen.
//!
//! Layout follows tract-linalg: `generic` is the portable implementation and the
//! test oracle; ISA-specific variants (`x86_64/avx2`, `aarch64`) sit beside it, are chosen at
//! run time after CPU detection, and are tested against it
//! (`tests/variants.rs`). The public functions re-exported here are the
//! dispatch points.
//!
//! # The kernel table
//!
//! The hot inner loops that have ISA variants are entries of a [`KernelTable`]
//! of function pointers, each with its variant's name
//! ([`KernelTable::entries`]): the f32 GEMM microkernel (with its MR×NR tile,
//! the k-major panel packing it reads, and a store step that applies a fused
//! epilogue — a bias per row or column today), f32 exp / sigmoid / silu / tanh
//! / erf / gelu / gelu_tanh and add / sub / mul / div over slices, and softmax's row max and
//! exp-and-sum. `generic::table()` fills every entry with the portable code;
//! `x86_64::plug` overrides them with AVX2 + FMA versions, and a v4 table
//! takes the AVX-512F GEMM microkernel; `aarch64::plug` with NEON ones, and
//! an aarch64-sve table takes the SVE GEMM microkernel and exp / sigmoid /
//! SiLU (the NEON entries' bits), an aarch64-sme table the SME GEMM
//! microkernel. CPU features are detected once per process
//! ([`Isa::detect`]: generic, x86-64-v3, v4, aarch64-neon, baseline on every
//! aarch64 CPU, aarch64-sve or aarch64-sme) and each table is built once
//! into a static: [`best`] for
//! this CPU, [`KernelTable::generic_only`] as the oracle,
//! [`KernelTable::for_isa`] for any level the CPU supports.
//!
//! # Threads, packed weights, fused epilogues
//!
//! A context runs its kernels on [`Threads`] (one small pool of parked
//! threads per thread count, shared by the process; handing out a job
//! allocates nothing; [`Context::set_threads`]). Work is split
//! statically into whole output tiles, rows, planes, batch entries or
//! fixed-size chunks — never one reduction — so results are bit-identical
//! for any thread count. [`PackedB`] is a B operand packed once for a
//! table's microkernel (a constant weight), [`PackedA`] an A operand
//! ([`PackedConv`]: a convolution weight, one per group, read by
//! [`conv_packed`]); [`gemm_f32_prepacked`],
//! [`linear_packed`], [`matmul_packed`] and [`linear_fused`] (with a
//! [`LinearEpilogue`]: scale, bias, [`Activation`], residual, applied in
//! the store step) read it without packing anything.
//!
//! # The context
//!
//! Every kernel with table-backed loops takes a [`Context`], which carries the
//! scratch memory, the table ([`Context::new`] uses [`best`];
//! [`Context::with_table`] pins another, [`Context::isa`] says which), and the
//! random seed and call count. GEMM-based kernels ([`gemm_f32`], [`matmul`],
//! [`linear`], [`conv`], [`attention`]) run the table's microkernel;
//! [`unary_cx`], [`binary_cx`] and [`softmax_cx`] are the context-taking forms
//! of [`unary`], [`binary`] and [`softmax`] (which use [`best`]). A variant of
//! a math function stays within a few ulp of the generic one (the bounds are
//! in `tests/variants.rs`); exact operations (add, max, ...) are bit-identical.

// The ISA plug-ins (feature `isa`; cfgs from build.rs).
#[cfg(kiln_neon)]
mod aarch64;
mod context;
mod generic;
mod parallel;
pub mod quant;
mod table;
mod types;
#[cfg(kiln_x86_64)]
mod x86_64;

pub use context::Context;
pub use kiln_isa::{register_types, FusedOp};
pub use parallel::{HotRun, Threads, MAX_THREADS};
pub use table::{best, BinaryFn, ColumnSumFn, ExpSumFn, Isa, KernelTable, ReduceFn, UnaryFn};
pub use types::{
    BinaryOp, DType, KernelError, LinalgOp, PoolKind, ReduceKind, Result, ScanKind, Scratch, TensorMut, TensorRef,
    UnaryOp,
};

pub use generic::attention::attention;
pub use generic::conv::{
    conv, conv_fused, conv_packed, conv_packed_with, conv_with, ConvAlgorithm, ConvParams, PackedConv, TensorEpilogue,
};
pub use generic::conv_nhwc::conv_fused_channels_last;
pub use generic::elementwise::{binary, binary_cx, cast, clamp, clamp_cx, unary, unary_cx, where_};
pub use generic::fused::{fused, fused_in_place};
pub use generic::gemm::{gemm_f32, gemm_f32_prepacked, Activation, PackedA, PackedB};
pub use generic::grouped::grouped_matmul;
pub use generic::layout::{arange, concat, copy, expand, fill, gather, permute, permute_cx, slice};
pub use generic::linalg::{linalg, LinalgFlags};
pub use generic::matmul::{
    linear, linear_fused, linear_fused_unpacked, linear_packed, linear_split, linear_with_epilogue, matmul,
    matmul_packed, LinearEpilogue,
};
pub use generic::norm::{batch_norm, layer_norm, layer_norm_cx, rms_norm, rms_norm_cx, softmax, softmax_cx};
pub use generic::pad::{flip, pad, PadMode, PadParams};
pub use generic::pool::{adaptive_avg_pool, max_pool_with_indices, pool, pool_channels_last_cx, pool_cx, PoolParams};
pub use generic::random::{random, RandomDist, RandomKey};
pub use generic::reduce::{argmax, argmin, assert_all, cumsum, reduce, reduce_cx, scan};
pub use generic::resize::{resize, ResizeMode, ResizeParams};
pub use generic::scatter::{
    gather_elements, index_gather, index_put, index_put_in_place, scatter_elements, scatter_elements_in_place,
};
pub use generic::select::nonzero;
pub use generic::sort::{sort, sort_both};
