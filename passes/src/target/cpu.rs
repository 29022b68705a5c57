//! kiln's CPU kernels (`kernels/generic`), as the passes see them.

use super::{OpKind, OpRow, OpTable, Support};
use kiln_ir::{DType, PoolKind};

const F32_F64: &[DType] = &[DType::F32, DType::F64];

/// The composites compute in f32 and f64 only (f16/bf16 and integers go
/// through casts, see `legalize`). Every other kernel takes each dtype the
/// importer gives it (its support table, `kiln ops`, lists them per ATen op).
pub(super) static KERNELS: OpTable = OpTable {
    others: Support::Any,
    rows: &[
        OpRow::only(OpKind::MatMul, F32_F64),
        OpRow::only(OpKind::GroupedMatMul, &[DType::F32]),
        OpRow::only(OpKind::Linear, F32_F64),
        OpRow::only(OpKind::BatchNorm, F32_F64),
        OpRow::only(OpKind::LayerNorm, F32_F64),
        OpRow::only(OpKind::RmsNorm, F32_F64),
        OpRow::only(OpKind::Attention, F32_F64),
        OpRow::only(OpKind::Conv, F32_F64),
        OpRow::only(OpKind::ConvFused, &[DType::F32]),
        OpRow::only(OpKind::LinearFused, &[DType::F32]),
        OpRow::only(OpKind::LinearSplit, &[DType::F32]),
        OpRow::only(OpKind::Softmax, F32_F64),
        OpRow::only(OpKind::LogSoftmax, F32_F64),
        OpRow::only(OpKind::Pool(PoolKind::Max), F32_F64),
        OpRow::only(OpKind::Pool(PoolKind::Avg), F32_F64),
        OpRow::only(OpKind::Pool(PoolKind::ArgMax), F32_F64),
        OpRow::only(OpKind::AdaptiveAvgPool, F32_F64),
        OpRow::only(OpKind::Linalg, F32_F64),
    ],
};

/// The composites worth running whole. BatchNorm, adaptive average pooling
/// and log-softmax have kernels too but are decomposed on every target:
/// BatchNorm becomes a per-channel multiply and add that fold into the
/// convolution before it, adaptive pooling a mean or a plain pool, and
/// log-softmax the max/sub/exp/sum/log chain.
pub(super) const COMPOSITES: &[OpKind] = &[
    OpKind::Linear,
    OpKind::LayerNorm,
    OpKind::Softmax,
    OpKind::Attention,
    OpKind::Pool(PoolKind::Max),
    OpKind::Pool(PoolKind::Avg),
    OpKind::Pool(PoolKind::ArgMax),
];

/// The portable kernels are compiled for the baseline every x86_64 (SSE2)
/// and aarch64 (NEON) CPU has: 128-bit vectors.
pub(super) const VECTOR_BYTES: u32 = 16;
