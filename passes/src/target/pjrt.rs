//! What an accelerator segment takes: the ops and dtypes the StableHLO
//! emitter (`compiler/src/stablehlo/emit`) lowers, each form checked on the
//! XLA CPU plugin. Limits on parameters (strides, steps, pad modes, index
//! dtypes, static shapes) are checked by the partitioner, node by node.

use super::{OpKind, OpRow, OpTable, Support, DTYPES};
use kiln_ir::{BinaryOp, DType, PoolKind, ReduceKind, UnaryOp};

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];
const NOT_FLOATS: &[DType] = &[DType::I8, DType::U8, DType::I16, DType::I32, DType::I64, DType::Bool];
const NUMBERS: &[DType] =
    &[DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I16, DType::I32, DType::I64];
/// StableHLO's abs and sign take signless integers only: no u8.
const SIGNED: &[DType] =
    &[DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64];
const BITS: &[DType] = &[DType::Bool, DType::I8, DType::U8, DType::I16, DType::I32, DType::I64];
/// XLA's f64 erf is not accurate to f64 (gelu uses it): kiln's CPU kernel is.
const ERF: &[DType] = &[DType::F32, DType::F16, DType::BF16];

const fn unary(u: UnaryOp, dtypes: &'static [DType]) -> OpRow {
    OpRow::only(OpKind::Unary(u), dtypes)
}

const fn floats(op: OpKind, why: &'static [(&'static [DType], &'static str)]) -> OpRow {
    OpRow::only(op, FLOATS).why_not(why)
}

const NORMALISATION: &[(&[DType], &str)] = &[(NOT_FLOATS, "a normalisation on a non-float tensor")];

pub(super) static SEGMENTS: OpTable = OpTable {
    others: Support::No,
    rows: &[
        unary(UnaryOp::Not, &[DType::Bool]),
        unary(UnaryOp::BitNot, BITS),
        unary(UnaryOp::Abs, SIGNED).why_not(&[(&[DType::U8], "abs/sign on an unsigned integer")]),
        unary(UnaryOp::Sign, SIGNED).why_not(&[(&[DType::U8], "abs/sign on an unsigned integer")]),
        unary(UnaryOp::Neg, NUMBERS),
        unary(UnaryOp::Relu, NUMBERS),
        unary(UnaryOp::Floor, NUMBERS),
        unary(UnaryOp::Ceil, NUMBERS),
        unary(UnaryOp::Round, NUMBERS),
        unary(UnaryOp::Trunc, NUMBERS),
        unary(UnaryOp::Erf, ERF).why_not(&[(&[DType::F64], "f64 erf/gelu (XLA's approximation is not f64-accurate)")]),
        unary(UnaryOp::Gelu, ERF).why_not(&[(&[DType::F64], "f64 erf/gelu (XLA's approximation is not f64-accurate)")]),
        unary(UnaryOp::Exp, FLOATS),
        unary(UnaryOp::Log, FLOATS),
        unary(UnaryOp::Sqrt, FLOATS),
        unary(UnaryOp::Rsqrt, FLOATS),
        unary(UnaryOp::Reciprocal, FLOATS),
        unary(UnaryOp::Sigmoid, FLOATS),
        unary(UnaryOp::Tanh, FLOATS),
        unary(UnaryOp::GeluTanh, FLOATS),
        unary(UnaryOp::Silu, FLOATS),
        unary(UnaryOp::Sin, FLOATS),
        unary(UnaryOp::Cos, FLOATS),
        unary(UnaryOp::Log1p, FLOATS),
        unary(UnaryOp::Expm1, FLOATS),
        unary(UnaryOp::Tan, FLOATS),
        unary(UnaryOp::Asin, FLOATS),
        unary(UnaryOp::Acos, FLOATS),
        unary(UnaryOp::Atan, FLOATS),
        unary(UnaryOp::Sinh, FLOATS),
        unary(UnaryOp::Cosh, FLOATS),
        unary(UnaryOp::Asinh, FLOATS),
        unary(UnaryOp::Acosh, FLOATS),
        unary(UnaryOp::Atanh, FLOATS),
        unary(UnaryOp::Log2, FLOATS),
        unary(UnaryOp::Log10, FLOATS),
        OpRow::any(OpKind::Binary(BinaryOp::Add)),
        OpRow::any(OpKind::Binary(BinaryOp::Sub)),
        OpRow::any(OpKind::Binary(BinaryOp::Mul)),
        floats(OpKind::Binary(BinaryOp::Div), &[(NOT_FLOATS, "op div on integers")]),
        OpRow::only(OpKind::Binary(BinaryOp::FloorDiv), NUMBERS),
        OpRow::only(OpKind::Binary(BinaryOp::Rem), NUMBERS),
        OpRow::only(OpKind::Binary(BinaryOp::Fmod), NUMBERS),
        floats(OpKind::Binary(BinaryOp::Pow), &[(NOT_FLOATS, "op pow on integers")]),
        floats(OpKind::Binary(BinaryOp::Atan2), &[(NOT_FLOATS, "op atan2 on integers")]),
        // In f64 loops (emit/special.rs), as the CPU kernel computes them
        // (a device without f64 — some TPUs — is untested).
        OpRow::only(OpKind::Binary(BinaryOp::Igamma), FLOATS),
        OpRow::only(OpKind::Binary(BinaryOp::Igammac), FLOATS),
        OpRow::any(OpKind::Binary(BinaryOp::Max)),
        OpRow::any(OpKind::Binary(BinaryOp::Min)),
        OpRow::any(OpKind::Binary(BinaryOp::Eq)),
        OpRow::any(OpKind::Binary(BinaryOp::Ne)),
        OpRow::any(OpKind::Binary(BinaryOp::Lt)),
        OpRow::any(OpKind::Binary(BinaryOp::Le)),
        OpRow::any(OpKind::Binary(BinaryOp::Gt)),
        OpRow::any(OpKind::Binary(BinaryOp::Ge)),
        OpRow::any(OpKind::Binary(BinaryOp::And)),
        OpRow::any(OpKind::Binary(BinaryOp::Or)),
        OpRow::any(OpKind::Binary(BinaryOp::Xor)),
        OpRow::any(OpKind::Where),
        OpRow::any(OpKind::Cast),
        OpRow::any(OpKind::Clamp),
        OpRow::any(OpKind::MatMul),
        OpRow::any(OpKind::Linear),
        OpRow::only(OpKind::QuantLinear, &[DType::F32]),
        OpRow::only(OpKind::QuantConv, &[DType::F32]),
        // The dense form (every row times every expert, masked): see emit/linalg.rs.
        OpRow::only(OpKind::GroupedMatMul, FLOATS),
        OpRow::any(OpKind::Conv),
        floats(OpKind::BatchNorm, NORMALISATION),
        floats(OpKind::LayerNorm, NORMALISATION),
        floats(OpKind::Softmax, NORMALISATION),
        floats(OpKind::LogSoftmax, NORMALISATION),
        OpRow::only(OpKind::Reduce(ReduceKind::Sum), NUMBERS),
        OpRow::only(OpKind::Reduce(ReduceKind::Mean), NUMBERS),
        OpRow::only(OpKind::Reduce(ReduceKind::Prod), NUMBERS),
        // On bool: any / all.
        OpRow::any(OpKind::Reduce(ReduceKind::Max)),
        OpRow::any(OpKind::Reduce(ReduceKind::Min)),
        OpRow::any(OpKind::ArgMax),
        OpRow::any(OpKind::ArgMin),
        floats(OpKind::Pool(PoolKind::Max), &[(NOT_FLOATS, "pooling with these parameters")]),
        floats(OpKind::Pool(PoolKind::Avg), &[(NOT_FLOATS, "pooling with these parameters")]),
        OpRow::no(OpKind::Pool(PoolKind::ArgMax)).why_not(&[(DTYPES, "max pooling's indices (a CPU kernel only)")]),
        OpRow::no(OpKind::AdaptiveAvgPool)
            .why_not(&[(DTYPES, "op adaptive_avg_pool (decomposed for every target unless sizes are symbolic)")]),
        floats(OpKind::Attention, &[(NOT_FLOATS, "attention with broadcast batch dims")]),
        OpRow::any(OpKind::Reshape),
        OpRow::any(OpKind::Expand),
        OpRow::any(OpKind::Permute),
        OpRow::any(OpKind::Slice),
        OpRow::any(OpKind::Concat),
        // stablehlo.while; the partitioner checks its condition and body.
        OpRow::any(OpKind::While),
        OpRow::any(OpKind::Gather),
        OpRow::any(OpKind::Full),
        OpRow::any(OpKind::Arange),
        OpRow::only(OpKind::CumSum, NUMBERS).why_not(&[(&[DType::Bool], "cumsum on bool")]),
        OpRow::any(OpKind::Flip),
        // Lowered to stablehlo.gather (negative indices wrapped; out-of-range
        // ones are clamped there, where the CPU kernel reports an error).
        OpRow::any(OpKind::IndexGather),
        OpRow::any(OpKind::IndexPut),
        OpRow::any(OpKind::GatherElements),
        OpRow::any(OpKind::Pad),
        // Stable stablehlo.sort beside an iota of positions (values or indices).
        OpRow::only(OpKind::Sort, NUMBERS),
        // One stablehlo.scatter; `mean` is refused by the partitioner.
        OpRow::only(OpKind::ScatterElements, NUMBERS),
        // Everything else (upsample, random, data-dependent sizes, linalg,
        // scans) runs on the CPU kernels.
    ],
};
