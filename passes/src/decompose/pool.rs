//! Pooling.
//!
//! AdaptiveAvgPool to an all-1 output is a mean over the pooled dims (every
//! target); to an output dividing the static input it is an average pool with
//! `kernel = stride = input / output`. A pool whose windows tile the input exactly
//! (kernel = stride, no padding or dilation, static divisible dims) is a reshape
//! that splits each pooled dim into `(windows, kernel)` followed by a reduction over
//! the kernel axes: that is how the primitive target gets it. An average pool
//! with a divisor sums and divides by it; the indices variant of max pooling
//! has no such form and stays.

use crate::emit::Emitter;
use crate::PassError;
use kiln_ir::{BinaryOp, Dim, Op, PoolKind, ReduceKind, TensorType, ValueId};

pub(super) fn adaptive_avg_pool(
    e: &mut Emitter,
    inputs: &[ValueId],
    output: &[i64],
) -> Result<Option<ValueId>, PassError> {
    let &[x] = inputs else { return Ok(None) };
    let x_ty = e.ty(x);
    let Some(lead) = x_ty.rank().checked_sub(output.len()) else { return Ok(None) };
    if output.iter().all(|&o| o == 1) {
        return e.reduce(ReduceKind::Mean, x, (lead..x_ty.rank()).collect(), true).map(Some);
    }
    let kernel: Option<Vec<i64>> = output
        .iter()
        .zip(&x_ty.shape[lead..])
        .map(|(&o, d)| d.as_const().filter(|&d| o > 0 && d % o == 0).map(|d| d / o))
        .collect();
    let Some(kernel) = kernel else { return Ok(None) };
    let n = kernel.len();
    let pool = Op::Pool {
        kind: PoolKind::Avg,
        kernel: kernel.clone(),
        stride: kernel,
        padding: vec![0; n],
        dilation: vec![1; n],
        ceil_mode: false,
        count_include_pad: true,
        divisor: None,
        layout: kiln_ir::Layout::ChannelsFirst,
    };
    e.push(pool, vec![x]).map(Some)
}

pub(super) fn pool(
    e: &mut Emitter,
    op: &Op,
    inputs: &[ValueId],
    out_ty: &TensorType,
) -> Result<Option<ValueId>, PassError> {
    let (&[x], Op::Pool { kind, kernel, stride, padding, dilation, divisor, .. }) = (inputs, op) else {
        return Ok(None);
    };
    // Integer division would round differently from torch's integer avg_pool.
    if *kind == PoolKind::ArgMax || (divisor.is_some() && !out_ty.dtype.is_float()) {
        return Ok(None);
    }
    let tiles = kernel == stride && padding.iter().all(|&p| p == 0) && dilation.iter().all(|&d| d == 1);
    let x_ty = e.ty(x);
    let Some(lead) = x_ty.rank().checked_sub(kernel.len()) else { return Ok(None) };
    if !tiles || out_ty.rank() != x_ty.rank() {
        return Ok(None);
    }
    let mut split: Vec<Dim> = x_ty.shape[..lead].to_vec();
    for (&k, d) in kernel.iter().zip(&x_ty.shape[lead..]) {
        match d.as_const() {
            Some(d) if k > 0 && d % k == 0 => split.extend([Dim::Const(d / k), Dim::Const(k)]),
            _ => return Ok(None),
        }
    }
    let axes = (0..kernel.len()).map(|i| lead + 2 * i + 1).collect();
    let windows = e.push(Op::Reshape { shape: split }, vec![x])?;
    match (kind, divisor) {
        (PoolKind::Avg, Some(d)) => {
            // torch divides the sum (not a mean times a factor, which rounds differently).
            let sum = e.reduce(ReduceKind::Sum, windows, axes, false)?;
            let d = e.scalar(out_ty.dtype, *d as f64);
            e.binary(BinaryOp::Div, sum, d).map(Some)
        }
        (PoolKind::Avg, None) => e.reduce(ReduceKind::Mean, windows, axes, false).map(Some),
        (PoolKind::Max, _) => e.reduce(ReduceKind::Max, windows, axes, false).map(Some),
        (PoolKind::ArgMax, _) => Ok(None),
    }
}
