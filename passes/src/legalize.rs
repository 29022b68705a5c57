//! Dtype legalisation: composites whose CPU kernels compute in f32 and f64
//! only run other dtypes through casts.
//!
//! f16/bf16 operands are widened to f32 and the result rounded back once —
//! what PyTorch's CPU kernels do (f32 accumulation). Integer operands compute
//! in f64, which is exact for the magnitudes these ops see in practice and
//! rounds back toward zero like torch's integer kernels (narrow integers
//! through i64, so that overflow wraps as in torch). Were a kernel f32-only,
//! f64 would compute in f32 (a precision loss); none is today.

use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{DType, Graph, NodeId, Op, PoolKind, TensorType};

const PASS: &str = "legalize";

/// The dtypes the CPU kernel for `op` computes natively; `None` for ops that
/// take every dtype (or that this pass does not manage).
pub fn native_dtypes(op: &Op) -> Option<&'static [DType]> {
    const F32_F64: &[DType] = &[DType::F32, DType::F64];
    match op {
        Op::MatMul
        | Op::Linear
        | Op::BatchNorm { .. }
        | Op::LayerNorm { .. }
        | Op::Attention { .. }
        | Op::Conv { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Pool { .. }
        | Op::AdaptiveAvgPool { .. } => Some(F32_F64),
        _ => None,
    }
}

fn compute_dtype(d: DType, native: &[DType]) -> DType {
    match d {
        DType::F64 if !native.contains(&DType::F64) => DType::F32,
        DType::F16 | DType::BF16 | DType::F32 => DType::F32,
        _ if native.contains(&DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

pub fn legalize_dtypes(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    rewrite_in_order(g, legalize_node)
}

fn legalize_node(g: &mut Graph, n: NodeId) -> Result<Rewrite, PassError> {
    let node = &g.nodes[n];
    let Some(native) = native_dtypes(&node.op) else { return Ok(Rewrite::Keep) };
    let &[out] = node.outputs.as_slice() else { return Ok(Rewrite::Keep) };
    let Some(&first) = node.inputs.first() else { return Ok(Rewrite::Keep) };
    let dtype = g.ty(first).dtype;
    if native.contains(&dtype) || dtype == DType::Bool {
        return Ok(Rewrite::Keep);
    }
    let compute = compute_dtype(dtype, native);
    let (op, inputs, loc) = (node.op.clone(), node.inputs.clone(), node.loc);
    let out_ty = g.ty(out).clone();
    // An index output (max pooling's indices) is i64 whatever the compute
    // dtype: only the input is cast.
    if matches!(op, Op::Pool { kind: PoolKind::ArgMax, .. }) {
        let cast =
            g.push(Op::Cast { to: compute }, vec![first], TensorType::new(compute, g.ty(first).shape.clone()), loc);
        let wide = g.push(op, vec![cast], out_ty, loc);
        return Ok(Rewrite::Replace(vec![wide]));
    }
    if out_ty.dtype != dtype {
        return Err(PassError::new(
            PASS,
            format!("{}: output dtype {} differs from input {dtype}", g.describe_node(n), out_ty.dtype),
        ));
    }
    let cast_inputs = inputs
        .iter()
        .map(|&v| {
            let ty = g.ty(v).clone();
            if ty.dtype == dtype {
                g.push(Op::Cast { to: compute }, vec![v], TensorType::new(compute, ty.shape), loc)
            } else {
                v
            }
        })
        .collect();
    let wide = g.push(op, cast_inputs, TensorType::new(compute, out_ty.shape.clone()), loc);
    // Integers come back through i64 so that the narrowing wraps like
    // torch's integer arithmetic (a float-to-i8 cast would saturate).
    let wide = if dtype.is_int() && dtype != DType::I64 {
        g.push(Op::Cast { to: DType::I64 }, vec![wide], TensorType::new(DType::I64, out_ty.shape.clone()), loc)
    } else {
        wide
    };
    let back = g.push(Op::Cast { to: dtype }, vec![wide], out_ty, loc);
    Ok(Rewrite::Replace(vec![back]))
}
