//! A small reference evaluator for constant folding.
//!
//! Covers the layout ops, the elementwise ops, reductions and matmul, computed in
//! `f64` and rounded to the dtype when stored: what folding needs, not a runtime. Returns `None` for anything
//! it does not handle (erf-based ops, integer division by zero, unsupported dtypes),
//! and folding then leaves the node alone.

use crate::host::HostTensor;
use kiln_ir::{BinaryOp, DType, Graph, Op, ReduceKind, UnaryOp, ValueId};

/// Evaluates `op` on constant operands into a tensor of `out_dtype` and `out_shape`
/// (the node's own, already checked static).
pub(crate) fn eval(op: &Op, inputs: &[&HostTensor], out_dtype: DType, out_shape: &[usize]) -> Option<HostTensor> {
    let numel: usize = out_shape.iter().product();
    // A node whose type disagrees with its operands is not folded (the verifier
    // reports it); this keeps every index below in range.
    let out = |data: Vec<f64>| (data.len() == numel).then(|| HostTensor::new(out_dtype, out_shape.to_vec(), data));
    match (op, inputs) {
        (Op::Unary(u), [x]) => out(x.data.iter().map(|&v| unary(*u, v)).collect::<Option<_>>()?),
        (Op::Binary(b), [x, y]) => {
            let (xi, yi) = (broadcast_index(&x.shape, out_shape)?, broadcast_index(&y.shape, out_shape)?);
            out(xi.iter().zip(&yi).map(|(&i, &j)| binary(*b, x.data[i], y.data[j], x.dtype)).collect::<Option<_>>()?)
        }
        (Op::Where, [c, a, b]) => {
            let (ci, ai, bi) = (
                broadcast_index(&c.shape, out_shape)?,
                broadcast_index(&a.shape, out_shape)?,
                broadcast_index(&b.shape, out_shape)?,
            );
            out((0..numel).map(|k| if c.data[ci[k]] != 0.0 { a.data[ai[k]] } else { b.data[bi[k]] }).collect())
        }
        (Op::Cast { .. }, [x]) => out(x.data.iter().map(|&v| cast(v, out_dtype)).collect()),
        (Op::Clamp { min, max }, [x]) => out(x.data.iter().map(|&v| clamp(v, *min, *max)).collect()),
        (Op::Reshape { .. }, [x]) if x.numel() == numel => out(x.data.clone()),
        (Op::Expand { .. }, [x]) => out(broadcast_index(&x.shape, out_shape)?.iter().map(|&i| x.data[i]).collect()),
        (Op::Permute { perm }, [x]) => out(permute(x, perm, out_shape)?),
        (Op::Slice { axis, start, step, .. }, [x]) => out(slice(x, *axis, *start, *step, out_shape)?),
        (Op::Concat { axis }, xs) if !xs.is_empty() => out(concat(xs, *axis, out_shape)?),
        (Op::Reduce { kind, axes, .. }, [x]) => out(reduce(x, *kind, axes, numel)?),
        (Op::MatMul, [a, b]) => out(matmul(a, b)?),
        (Op::Full { value, .. }, []) => out(vec![cast(*value, out_dtype); numel]),
        (Op::Arange { start, step, .. }, []) => {
            out((0..numel).map(|i| cast(start + step * i as f64, out_dtype)).collect())
        }
        (Op::CumSum { axis }, [x]) => out(cumsum(x, *axis)?),
        (Op::IndexGather { axis }, [data, idx @ ..]) if !idx.is_empty() => {
            out(index_gather(data, idx, *axis, out_shape)?)
        }
        _ => None,
    }
}

/// Values a graph value takes when it is computed from constants alone:
/// the constant itself, or its producer's op evaluated on its operands'
/// values (recursively, at most `depth` producers deep, no tensor over
/// `max_elements`). For recognising patterns (a causal mask) in
/// subgraphs that folding leaves alone; the graph is not changed.
pub(crate) fn eval_value(g: &Graph, v: ValueId, depth: usize, max_elements: usize) -> Option<HostTensor> {
    let ty = g.ty(v);
    let shape = crate::host::static_shape(ty)?;
    if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))? > max_elements || !crate::host::supported(ty.dtype) {
        return None;
    }
    if g.const_of(v).is_some() {
        return HostTensor::from_const(g, v);
    }
    let p = g.producer(v).filter(|_| depth > 0)?;
    let node = &g.nodes[p];
    if node.outputs.len() != 1 || node.op.has_effect() {
        return None;
    }
    let inputs: Vec<HostTensor> =
        node.inputs.iter().map(|&i| eval_value(g, i, depth - 1, max_elements)).collect::<Option<_>>()?;
    let refs: Vec<&HostTensor> = inputs.iter().collect();
    eval(&node.op, &refs, ty.dtype, &shape).filter(HostTensor::is_exact)
}

/// Running sums along `axis` (in f64: exact for the integers held).
fn cumsum(x: &HostTensor, axis: usize) -> Option<Vec<f64>> {
    let n = *x.shape.get(axis)?;
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut data = x.data.clone();
    for (k, item) in data.clone().iter().enumerate() {
        let i = (k / inner) % n;
        if i > 0 {
            data[k] = data[k - inner] + item;
        }
    }
    Some(data)
}

/// `data[.., idx_0, .., idx_k-1, ..]` from `axis` (the indices broadcast to
/// one shape `B`; negative ones count from the end): the result is
/// `data.shape[..axis] ++ B ++ data.shape[axis + k..]`. `None` for an
/// index out of range.
fn index_gather(data: &HostTensor, idx: &[&HostTensor], axis: usize, out_shape: &[usize]) -> Option<Vec<f64>> {
    let k = idx.len();
    if axis + k > data.shape.len() {
        return None;
    }
    let (outer, inner) = (&data.shape[..axis], &data.shape[axis + k..]);
    let b = out_shape.get(axis..out_shape.len().checked_sub(inner.len())?)?;
    if out_shape[..axis] != *outer || out_shape[out_shape.len() - inner.len()..] != *inner {
        return None;
    }
    let reads: Vec<Vec<usize>> = idx.iter().map(|t| broadcast_index(&t.shape, b)).collect::<Option<_>>()?;
    let st = strides(&data.shape);
    let mut out = Vec::with_capacity(out_shape.iter().product());
    let mut ok = true;
    for_each_index(out_shape, |at| {
        let b_at = at[axis..axis + b.len()].iter().zip(strides(b)).map(|(i, s)| i * s).sum::<usize>();
        let mut lin = 0;
        for (d, &i) in at[..axis].iter().enumerate() {
            lin += i * st[d];
        }
        for (j, t) in idx.iter().enumerate() {
            let size = data.shape[axis + j] as f64;
            let mut i = t.data[reads[j][b_at]];
            if i < 0.0 {
                i += size;
            }
            if !(0.0..size).contains(&i) {
                ok = false;
                return;
            }
            lin += i as usize * st[axis + j];
        }
        for (d, &i) in at[axis + b.len()..].iter().enumerate() {
            lin += i * st[axis + k + d];
        }
        out.push(data.data[lin]);
    });
    ok.then_some(out)
}

/// Float-to-integer casts truncate toward zero (as torch does); the final
/// wrap to the integer width happens when the bytes are written.
fn cast(v: f64, to: DType) -> f64 {
    match to {
        DType::Bool => (v != 0.0) as u8 as f64,
        d if d.is_int() => v.trunc(),
        _ => v,
    }
}

fn clamp(v: f64, min: Option<f64>, max: Option<f64>) -> f64 {
    // NaN passes through, as in torch.
    let v = match min {
        Some(m) if v < m => m,
        _ => v,
    };
    match max {
        Some(m) if v > m => m,
        _ => v,
    }
}

fn unary(op: UnaryOp, x: f64) -> Option<f64> {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    Some(match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => 1.0 / x,
        // NaN passes through, as in torch.
        UnaryOp::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        // torch's rule: ±0 and NaN give +0.
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Not => (x == 0.0) as u8 as f64,
        // No erf in std; an approximation would make folded and run-time results differ.
        UnaryOp::Erf | UnaryOp::Erfc | UnaryOp::Gelu => return None,
        // The special functions live in the kernels only: folding them here
        // would need a second implementation that could disagree.
        UnaryOp::Lgamma
        | UnaryOp::Digamma
        | UnaryOp::I0
        | UnaryOp::I0e
        | UnaryOp::I1
        | UnaryOp::I1e
        | UnaryOp::Erfcx
        | UnaryOp::Ndtr
        | UnaryOp::LogNdtr
        | UnaryOp::BesselJ0
        | UnaryOp::BesselJ1
        | UnaryOp::BesselY0
        | UnaryOp::BesselY1
        | UnaryOp::Entr
        | UnaryOp::Trigamma
        | UnaryOp::SphericalBesselJ0 => return None,
        UnaryOp::Trunc => x.trunc(),
        // Left to the run-time kernels (libm results may differ in the last
        // bit; BitNot depends on the dtype).
        UnaryOp::Log1p
        | UnaryOp::Expm1
        | UnaryOp::Tan
        | UnaryOp::Asin
        | UnaryOp::Acos
        | UnaryOp::Atan
        | UnaryOp::Sinh
        | UnaryOp::Cosh
        | UnaryOp::Asinh
        | UnaryOp::Acosh
        | UnaryOp::Atanh
        | UnaryOp::Log2
        | UnaryOp::Log10
        | UnaryOp::BitNot => return None,
    })
}

fn binary(op: BinaryOp, a: f64, b: f64, dtype: DType) -> Option<f64> {
    let int = dtype.is_int() || dtype == DType::Bool;
    let flag = |c: bool| c as u8 as f64;
    Some(match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        // Integer division by zero is an error at run time; leave it to the runtime.
        BinaryOp::FloorDiv | BinaryOp::Rem if int && b == 0.0 => return None,
        BinaryOp::FloorDiv => (a / b).floor(),
        // Python remainder: the sign follows the divisor.
        BinaryOp::Rem => a - b * (a / b).floor(),
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Eq => flag(a == b),
        BinaryOp::Ne => flag(a != b),
        BinaryOp::Lt => flag(a < b),
        BinaryOp::Le => flag(a <= b),
        BinaryOp::Gt => flag(a > b),
        BinaryOp::Ge => flag(a >= b),
        // Bitwise on integers, logical on bool (0/1 makes the two agree).
        BinaryOp::And if int => ((a as i64) & (b as i64)) as f64,
        BinaryOp::Or if int => ((a as i64) | (b as i64)) as f64,
        BinaryOp::Xor if int => ((a as i64) ^ (b as i64)) as f64,
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => return None,
        BinaryOp::Fmod if int && b == 0.0 => return None,
        BinaryOp::Fmod => a % b,
        BinaryOp::Atan2 => return None,
        BinaryOp::ChebyshevT
        | BinaryOp::ChebyshevU
        | BinaryOp::ChebyshevV
        | BinaryOp::ChebyshevW
        | BinaryOp::ShiftedChebyshevT
        | BinaryOp::ShiftedChebyshevU
        | BinaryOp::ShiftedChebyshevV
        | BinaryOp::ShiftedChebyshevW
        | BinaryOp::HermiteH
        | BinaryOp::HermiteHe
        | BinaryOp::LaguerreL
        | BinaryOp::LegendreP
        | BinaryOp::Zeta
        | BinaryOp::Igamma
        | BinaryOp::Igammac
        | BinaryOp::Nextafter => return None,
    })
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f` with every multi-index of `shape` in row-major order.
fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}

/// For every element of `out`, the linear index of the `input` element numpy
/// broadcasting reads; `None` when the shapes do not broadcast.
fn broadcast_index(input: &[usize], out: &[usize]) -> Option<Vec<usize>> {
    let offset = out.len().checked_sub(input.len())?;
    for (i, &d) in input.iter().enumerate() {
        if d != 1 && d != out[offset + i] {
            return None;
        }
    }
    let st = strides(input);
    let mut result = Vec::with_capacity(out.iter().product());
    for_each_index(out, |idx| {
        let lin = input.iter().enumerate().filter(|(_, &d)| d != 1).map(|(i, _)| idx[offset + i] * st[i]).sum();
        result.push(lin);
    });
    Some(result)
}

fn permute(x: &HostTensor, perm: &[usize], out_shape: &[usize]) -> Option<Vec<f64>> {
    if perm.len() != x.shape.len() || out_shape.len() != perm.len() {
        return None;
    }
    if perm.iter().zip(out_shape).any(|(&p, &d)| x.shape.get(p) != Some(&d)) {
        return None;
    }
    let st = strides(&x.shape);
    let mut data = Vec::with_capacity(x.numel());
    for_each_index(out_shape, |idx| {
        let lin: usize = idx.iter().zip(perm).map(|(&i, &p)| i * st[p]).sum();
        data.push(x.data[lin]);
    });
    Some(data)
}

fn slice(x: &HostTensor, axis: usize, start: i64, step: i64, out_shape: &[usize]) -> Option<Vec<f64>> {
    if step <= 0 || start < 0 || axis >= x.shape.len() || out_shape.len() != x.shape.len() {
        return None;
    }
    if (0..x.shape.len()).any(|a| a != axis && out_shape[a] != x.shape[a]) {
        return None;
    }
    let (start, step) = (start as usize, step as usize);
    // The node's output type fixes the element count; check it stays in range.
    if let Some(last) = out_shape[axis].checked_sub(1) {
        if start + last * step >= x.shape[axis] {
            return None;
        }
    }
    let st = strides(&x.shape);
    let mut data = Vec::new();
    for_each_index(out_shape, |idx| {
        let lin: usize =
            idx.iter().enumerate().map(|(a, &i)| if a == axis { start + i * step } else { i } * st[a]).sum();
        data.push(x.data[lin]);
    });
    Some(data)
}

fn concat(xs: &[&HostTensor], axis: usize, out_shape: &[usize]) -> Option<Vec<f64>> {
    let outer: usize = out_shape.get(..axis)?.iter().product();
    let mut data = Vec::with_capacity(out_shape.iter().product());
    let chunks: Vec<usize> =
        xs.iter().map(|x| x.shape.get(axis..).map(|s| s.iter().product())).collect::<Option<_>>()?;
    for o in 0..outer {
        for (x, &chunk) in xs.iter().zip(&chunks) {
            data.extend_from_slice(x.data.get(o * chunk..(o + 1) * chunk)?);
        }
    }
    (data.len() == out_shape.iter().product::<usize>()).then_some(data)
}

/// Reduces over `axes`; the output's element order is the input's with those axes
/// removed, whether or not they are kept as unit dims.
fn reduce(x: &HostTensor, kind: ReduceKind, axes: &[usize], numel: usize) -> Option<Vec<f64>> {
    if axes.iter().any(|&a| a >= x.shape.len()) {
        return None;
    }
    let kept: Vec<usize> = (0..x.shape.len()).map(|a| if axes.contains(&a) { 1 } else { x.shape[a] }).collect();
    if kept.iter().product::<usize>() != numel {
        return None;
    }
    let init = match kind {
        ReduceKind::Sum | ReduceKind::Mean => 0.0,
        ReduceKind::Prod => 1.0,
        ReduceKind::Max => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
    };
    let mut acc = vec![init; numel];
    let kept_strides = strides(&kept);
    let mut lin = 0;
    for_each_index(&x.shape, |idx| {
        let o: usize =
            idx.iter().zip(&kept).zip(&kept_strides).map(|((&i, &k), &s)| if k == 1 { 0 } else { i * s }).sum();
        let v = x.data[lin];
        lin += 1;
        acc[o] = match kind {
            ReduceKind::Sum | ReduceKind::Mean => acc[o] + v,
            ReduceKind::Prod => acc[o] * v,
            ReduceKind::Max if v.is_nan() || acc[o].is_nan() => f64::NAN,
            ReduceKind::Max => acc[o].max(v),
            ReduceKind::Min if v.is_nan() || acc[o].is_nan() => f64::NAN,
            ReduceKind::Min => acc[o].min(v),
        };
    });
    if kind == ReduceKind::Mean {
        let count = (x.numel() / numel.max(1)) as f64;
        acc.iter_mut().for_each(|v| *v /= count);
    }
    Some(acc)
}

/// torch.matmul: batch dims broadcast; a rank-1 operand is a row (left) or a
/// column (right) whose unit dim the output drops — which does not change the
/// element order, so the result is computed on the promoted shapes.
fn matmul(a: &HostTensor, b: &HostTensor) -> Option<Vec<f64>> {
    let promote = |t: &HostTensor, left: bool| -> Option<Vec<usize>> {
        match t.shape.len() {
            0 => None,
            1 if left => Some(vec![1, t.shape[0]]),
            1 => Some(vec![t.shape[0], 1]),
            _ => Some(t.shape.clone()),
        }
    };
    let (ash, bsh) = (promote(a, true)?, promote(b, false)?);
    let (abatch, amk) = ash.split_at(ash.len() - 2);
    let (bbatch, bkn) = bsh.split_at(bsh.len() - 2);
    let (m, k, n) = (amk[0], amk[1], bkn[1]);
    if bkn[0] != k {
        return None;
    }
    let rank = abatch.len().max(bbatch.len());
    let dim = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
    let batch: Vec<usize> = (0..rank).map(|i| dim(abatch, i).max(dim(bbatch, i))).collect();
    let (ai, bi) = (broadcast_index(abatch, &batch)?, broadcast_index(bbatch, &batch)?);
    let mut data = Vec::with_capacity(ai.len() * m * n);
    for (&ta, &tb) in ai.iter().zip(&bi) {
        let (a0, b0) = (ta * m * k, tb * k * n);
        for i in 0..m {
            for j in 0..n {
                data.push((0..k).map(|kk| a.data[a0 + i * k + kk] * b.data[b0 + kk * n + j]).sum());
            }
        }
    }
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, shape: &[usize], data: &[f64]) -> HostTensor {
        HostTensor::new(dtype, shape.to_vec(), data.to_vec())
    }

    #[test]
    fn cumsum_runs_along_its_axis() {
        let x = t(DType::I64, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let rows = eval(&Op::CumSum { axis: 1 }, &[&x], DType::I64, &[2, 3]).map(|t| t.data);
        assert_eq!(rows, Some(vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]));
        let cols = eval(&Op::CumSum { axis: 0 }, &[&x], DType::I64, &[2, 3]).map(|t| t.data);
        assert_eq!(cols, Some(vec![1.0, 2.0, 3.0, 5.0, 7.0, 9.0]));
    }

    /// `data[i0, i1]` with broadcast index tensors (numpy's advanced
    /// indexing), negative indices from the end, out of range refused.
    #[test]
    fn index_gather_is_advanced_indexing() {
        let data = t(DType::F32, &[2, 3], &[10.0, 11.0, 12.0, 20.0, 21.0, 22.0]);
        let i0 = t(DType::I64, &[2, 1], &[0.0, 1.0]);
        let i1 = t(DType::I64, &[1, 2], &[2.0, -3.0]);
        let got = eval(&Op::IndexGather { axis: 0 }, &[&data, &i0, &i1], DType::F32, &[2, 2]).map(|t| t.data);
        assert_eq!(got, Some(vec![12.0, 10.0, 22.0, 20.0]));
        // One index on axis 1: [2, B] with B = [2].
        let cols = t(DType::I64, &[2], &[1.0, 0.0]);
        let got = eval(&Op::IndexGather { axis: 1 }, &[&data, &cols], DType::F32, &[2, 2]).map(|t| t.data);
        assert_eq!(got, Some(vec![11.0, 10.0, 21.0, 20.0]));
        let bad = t(DType::I64, &[1], &[3.0]);
        assert!(eval(&Op::IndexGather { axis: 1 }, &[&data, &bad], DType::F32, &[2, 1]).is_none());
    }
}
