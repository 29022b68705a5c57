//! Dtype legalisation: ops whose kernels compute in some dtypes only (the
//! composites of kiln's CPU kernels: f32 and f64, see
//! [`crate::TargetDesc::kernel_support`]) run other dtypes through casts.
//!
//! f16/bf16 operands are widened to f32 and the result rounded back once —
//! what PyTorch's CPU kernels do (f32 accumulation). Integer operands compute
//! in f64, which is exact for the magnitudes these ops see in practice and
//! rounds back toward zero like torch's integer kernels (narrow integers
//! through i64, so that overflow wraps as in torch). Were a kernel f32-only,
//! f64 would compute in f32 (a precision loss); none is today.

use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError, Support, TargetDesc};
use kiln_ir::{DType, Graph, NodeId, Op, PoolKind, TensorType};

const PASS: &str = "legalize";

fn compute_dtype(d: DType, native: &[DType]) -> DType {
    match d {
        DType::F64 if !native.contains(&DType::F64) => DType::F32,
        DType::F16 | DType::BF16 | DType::F32 => DType::F32,
        _ if native.contains(&DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

pub fn legalize_dtypes(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    rewrite_in_order(g, |g, n| legalize_node(g, n, &opts.target))
}

fn legalize_node(g: &mut Graph, n: NodeId, target: &TargetDesc) -> Result<Rewrite, PassError> {
    let node = &g.nodes[n];
    // Ops without a kernel are the partitioner's or lowering's to report.
    let Support::Only(native) = target.kernel_support(&node.op) else { return Ok(Rewrite::Keep) };
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
