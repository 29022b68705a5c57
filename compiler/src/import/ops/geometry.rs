//! Pairwise distances (`_cdist_forward`, `_pdist_forward`) and
//! `grid_sampler_2d`, decomposed at import into elementwise ops, reductions,
//! `MatMul` and `IndexGather`, following the formulas of torch's CPU kernels
//! (including when `cdist` switches to its matrix-product form).

use crate::import::importer::{unsupported, Importer, Scalar, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, ConstBytes, DType, Dim, Op, ReduceKind, TensorType, UnaryOp as U, ValueId};

/// Floats are computed in their own dtype, f16/bf16 in f32 (like torch's CPU
/// kernels, which accumulate in f32).
fn compute_dtype(imp: &Importer, v: ValueId, what: &str) -> R<DType> {
    match imp.ty(v).dtype {
        DType::F16 | DType::BF16 => Ok(DType::F32),
        d if d.is_float() => Ok(d),
        d => unsupported(format!("{what} of dtype {d} (torch supports floating point only)")),
    }
}

fn binary(imp: &mut Importer, op: B, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.build(Op::Binary(op), vec![a, b])
}

fn unary(imp: &mut Importer, op: U, a: ValueId) -> R<ValueId> {
    imp.build(Op::Unary(op), vec![a])
}

fn reduce(imp: &mut Importer, kind: ReduceKind, v: ValueId, axis: usize) -> R<ValueId> {
    imp.build(Op::Reduce { kind, axes: vec![axis], keep_dims: false }, vec![v])
}

fn reshape(imp: &mut Importer, v: ValueId, shape: Vec<Dim>) -> R<ValueId> {
    if imp.ty(v).shape == shape {
        return Ok(v);
    }
    imp.build(Op::Reshape { shape }, vec![v])
}

/// The `p`-norm of `diff` along `axis` as torch's distance kernels compute it:
/// p = 0 counts the nonzero differences, p = 1 sums `|d|`, p = 2 is
/// `sqrt(sum d²)`, p = ∞ the largest `|d|`, otherwise `(sum |d|^p)^(1/p)`.
fn p_norm(imp: &mut Importer, diff: ValueId, axis: usize, p: f64) -> R<ValueId> {
    let dtype = imp.ty(diff).dtype;
    if p == 0.0 {
        let nonzero = imp.with_scalar(B::Ne, diff, 0.0)?;
        let count = imp.cast(nonzero, dtype);
        return reduce(imp, ReduceKind::Sum, count, axis);
    }
    if p == 2.0 {
        let squares = binary(imp, B::Mul, diff, diff)?;
        let sum = reduce(imp, ReduceKind::Sum, squares, axis)?;
        return unary(imp, U::Sqrt, sum);
    }
    let abs = unary(imp, U::Abs, diff)?;
    if p == 1.0 {
        return reduce(imp, ReduceKind::Sum, abs, axis);
    }
    if p.is_infinite() {
        return reduce(imp, ReduceKind::Max, abs, axis);
    }
    let powered = imp.with_scalar(B::Pow, abs, p)?;
    let sum = reduce(imp, ReduceKind::Sum, powered, axis)?;
    imp.with_scalar(B::Pow, sum, 1.0 / p)
}

fn check_p(p: f64) -> R<()> {
    if p.is_nan() || p < 0.0 {
        return unsupported(format!("distance with p = {p} (torch requires p >= 0)"));
    }
    Ok(())
}

/// `aten::_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor`:
/// `x1 [.., P, M]`, `x2 [.., R, M]` → `[.., P, R]`, batch dims broadcast. For
/// p = 2, torch uses `sqrt(clamp_min(|a|² + |b|² - 2 a·b, 0))` through a
/// matrix product when `compute_mode` is 1, or 0/None with P or R above 25;
/// kiln makes the same choice (so the rounding matches).
pub(super) fn cdist(imp: &mut Importer, n: &Node) -> R<()> {
    let x1 = imp.tensor(n, "x1")?;
    let x2 = imp.tensor(n, "x2")?;
    let p = imp.float(n, "p", Some(2.0))?;
    check_p(p)?;
    let mode = imp.opt_int(n, "compute_mode")?.unwrap_or(0);
    let out = imp.out_ty(n, 0)?;
    let compute = compute_dtype(imp, x1, "cdist")?;
    let (t1, t2) = (imp.ty(x1).clone(), imp.ty(x2).clone());
    if t1.rank() < 2 || t2.rank() < 2 {
        return unsupported("cdist of tensors with fewer than two dims");
    }
    let rows = |t: &TensorType| t.shape[t.rank() - 2].as_const();
    let use_mm = p == 2.0
        && match mode {
            1 => true,
            2 => false,
            _ => match (rows(&t1), rows(&t2)) {
                (Some(r1), Some(r2)) => r1 > 25 || r2 > 25,
                _ => return unsupported("cdist p=2 with dynamic row counts (torch picks its algorithm by size at run time)"),
            },
        };
    let (a, b) = (imp.cast(x1, compute), imp.cast(x2, compute));
    let v = if out.numel().as_const() == Some(0) {
        imp.push(Op::Full { value: 0.0, dtype: compute, shape: out.shape.clone() }, vec![], TensorType::new(compute, out.shape.clone()))
    } else if use_mm {
        euclidean_by_matmul(imp, a, b)?
    } else {
        // [.., P, 1, M] - [.., 1, R, M] -> [.., P, R, M], then the norm over M.
        let mut s1 = t1.shape.clone();
        s1.insert(t1.rank() - 1, Dim::Const(1));
        let mut s2 = t2.shape.clone();
        s2.insert(t2.rank() - 2, Dim::Const(1));
        let a = reshape(imp, a, s1)?;
        let b = reshape(imp, b, s2)?;
        let diff = binary(imp, B::Sub, a, b)?;
        let axis = imp.ty(diff).rank() - 1;
        p_norm(imp, diff, axis, p)?
    };
    let v = imp.cast(v, out.dtype);
    let v = if imp.ty(v).shape == out.shape { v } else { imp.push(Op::Expand { shape: out.shape.clone() }, vec![v], out) };
    imp.bind(n, 0, v)
}

/// torch's `_euclidean_dist`: `[-2a, |a|², 1] @ [b, 1, |b|²]ᵀ`, clamped at 0, square-rooted.
fn euclidean_by_matmul(imp: &mut Importer, a: ValueId, b: ValueId) -> R<ValueId> {
    let dtype = imp.ty(a).dtype;
    let axis = imp.ty(a).rank() - 1;
    let norm = |imp: &mut Importer, x: ValueId| -> R<ValueId> {
        let sq = binary(imp, B::Mul, x, x)?;
        let axis = imp.ty(x).rank() - 1;
        imp.build(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: true }, vec![sq])
    };
    let ones = |imp: &mut Importer, like: ValueId| -> ValueId {
        let shape = imp.ty(like).shape.clone();
        imp.push(Op::Full { value: 1.0, dtype, shape: shape.clone() }, vec![], TensorType::new(dtype, shape))
    };
    let (na, nb) = (norm(imp, a)?, norm(imp, b)?);
    let (pa, pb) = (ones(imp, na), ones(imp, nb));
    let a2 = imp.with_scalar(B::Mul, a, -2.0)?;
    let left = imp.build(Op::Concat { axis }, vec![a2, na, pa])?;
    let axis_b = imp.ty(b).rank() - 1;
    let right = imp.build(Op::Concat { axis: axis_b }, vec![b, pb, nb])?;
    let r = imp.ty(right).rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let right_t = imp.build(Op::Permute { perm }, vec![right])?;
    let product = imp.build(Op::MatMul, vec![left, right_t])?;
    let clamped = imp.build(Op::Clamp { min: Some(0.0), max: None }, vec![product])?;
    unary(imp, U::Sqrt, clamped)
}

/// An i64 constant vector.
fn index_const(imp: &mut Importer, values: &[i64]) -> ValueId {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    imp.g.add_const(None, TensorType::fixed(DType::I64, &[values.len() as i64]), ConstBytes::owned(bytes))
}

/// `aten::_pdist_forward(Tensor self, float p=2) -> Tensor`: `[N, M]` → the
/// distances of rows `i < j` in row-major pair order, `[N(N-1)/2]`. The row
/// pairs are index constants (N must be static); torch's kernel computes each
/// pair directly, as here.
pub(super) fn pdist(imp: &mut Importer, n: &Node) -> R<()> {
    let x = match imp.arg(n, "input") {
        Some(_) => imp.tensor(n, "input")?, // `aten::pdist(Tensor input, float p=2)` (training IR)
        None => imp.tensor(n, "self")?,
    };
    let p = imp.float(n, "p", Some(2.0))?;
    check_p(p)?;
    let out = imp.out_ty(n, 0)?;
    let compute = compute_dtype(imp, x, "pdist")?;
    let t = imp.ty(x).clone();
    let Some(shape) = t.static_shape().filter(|s| s.len() == 2) else {
        return unsupported("pdist of a tensor that is not 2-d with static shape");
    };
    let rows = shape[0];
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..rows {
        for j in i + 1..rows {
            first.push(i);
            second.push(j);
        }
    }
    let v = if first.is_empty() || shape[1] == 0 {
        imp.push(Op::Full { value: 0.0, dtype: compute, shape: out.shape.clone() }, vec![], TensorType::new(compute, out.shape.clone()))
    } else {
        let xc = imp.cast(x, compute);
        let (i, j) = (index_const(imp, &first), index_const(imp, &second));
        let a = imp.build(Op::Gather { axis: 0 }, vec![xc, i])?;
        let b = imp.build(Op::Gather { axis: 0 }, vec![xc, j])?;
        let diff = binary(imp, B::Sub, a, b)?;
        p_norm(imp, diff, 1, p)?
    };
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// How `grid_sampler_2d` treats coordinates outside the input.
#[derive(Copy, Clone, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// `aten::grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode,
///   int padding_mode, bool align_corners) -> Tensor`: `input [N, C, H, W]`,
/// `grid [N, Ho, Wo, 2]` of (x, y) in [-1, 1] → `[N, C, Ho, Wo]`. Bilinear (0)
/// and nearest (1) interpolation; zeros (0), border (1) and reflection (2)
/// padding; H and W static. The coordinate arithmetic is torch's
/// (`GridSampler.h`): unnormalise, reflect/clip, then the corners are read
/// with `IndexGather` from `[N, H, W, C]` at clamped indices, and corners
/// outside the input contribute zero.
pub(super) fn grid_sampler_2d(imp: &mut Importer, n: &Node) -> R<()> {
    let input = imp.tensor(n, "input")?;
    let grid = imp.tensor(n, "grid")?;
    let interpolation = imp.int(n, "interpolation_mode", None)?;
    let padding = match imp.int(n, "padding_mode", None)? {
        0 => Padding::Zeros,
        1 => Padding::Border,
        2 => Padding::Reflection,
        other => return unsupported(format!("grid_sampler_2d padding_mode {other}")),
    };
    let align = imp.bool(n, "align_corners", false)?;
    if !matches!(interpolation, 0 | 1) {
        return unsupported(format!("grid_sampler_2d interpolation_mode {interpolation} (bicubic is not supported)"));
    }
    let out = imp.out_ty(n, 0)?;
    // torch's CPU kernel computes f16/bf16 samples in their own dtype.
    compute_dtype(imp, input, "grid_sampler_2d")?;
    let compute = imp.ty(input).dtype;
    let (ti, tg) = (imp.ty(input).clone(), imp.ty(grid).clone());
    if ti.rank() != 4 || tg.rank() != 4 {
        return unsupported("grid_sampler_2d needs a 4-d input and grid");
    }
    let (Some(h), Some(w)) = (ti.shape[2].as_const(), ti.shape[3].as_const()) else {
        return unsupported("grid_sampler_2d over a dynamic input height or width");
    };
    if out.numel().as_const() == Some(0) || h == 0 || w == 0 {
        let v = imp.push(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let points: Vec<Dim> = tg.shape[..3].to_vec(); // [N, Ho, Wo]
    let mut column = points.clone();
    column.push(Dim::Const(1));
    let g = imp.cast(grid, compute);
    let coord = |imp: &mut Importer, index: i64, size: i64| -> R<ValueId> {
        let c = imp.build(Op::Slice { axis: 3, start: index, end: index + 1, step: 1 }, vec![g])?;
        let c = reshape(imp, c, points.clone())?;
        source_index(imp, c, size, padding, align)
    };
    let ix = coord(imp, 0, w)?;
    let iy = coord(imp, 1, h)?;
    // [N, H, W, C] so that (n, y, x) index the leading axes.
    let data = imp.cast(input, compute);
    let data = imp.build(Op::Permute { perm: vec![0, 2, 3, 1] }, vec![data])?;
    let batch = imp.push(
        Op::Arange { start: 0.0, step: 1.0, len: ti.shape[0].clone(), dtype: DType::I64 },
        vec![],
        TensorType::new(DType::I64, vec![ti.shape[0].clone()]),
    );
    let batch = reshape(imp, batch, vec![ti.shape[0].clone(), Dim::Const(1), Dim::Const(1)])?;
    let batch = imp.push(Op::Expand { shape: points.clone() }, vec![batch], TensorType::new(DType::I64, points.clone()));
    let zero = imp.scalar_const(Scalar::Float(0.0), compute);
    let corner = |imp: &mut Importer, x: ValueId, y: ValueId, weight: Option<ValueId>| -> R<ValueId> {
        let inside_x = in_bounds(imp, x, w)?;
        let inside_y = in_bounds(imp, y, h)?;
        let inside = binary(imp, B::And, inside_x, inside_y)?;
        let xi = clamped_index(imp, x, w)?;
        let yi = clamped_index(imp, y, h)?;
        let picked = imp.build(Op::IndexGather { axis: 0 }, vec![data, batch, yi, xi])?;
        let inside = reshape(imp, inside, column.clone())?;
        let value = match weight {
            Some(wt) => {
                let wt = reshape(imp, wt, column.clone())?;
                binary(imp, B::Mul, picked, wt)?
            }
            None => picked,
        };
        imp.build(Op::Where, vec![inside, value, zero])
    };
    let sampled = if interpolation == 1 {
        let x = unary(imp, U::Round, ix)?;
        let y = unary(imp, U::Round, iy)?;
        corner(imp, x, y, None)?
    } else {
        let x0 = unary(imp, U::Floor, ix)?;
        let y0 = unary(imp, U::Floor, iy)?;
        let x1 = imp.with_scalar(B::Add, x0, 1.0)?;
        let y1 = imp.with_scalar(B::Add, y0, 1.0)?;
        let (wx0, wx1) = (binary(imp, B::Sub, x1, ix)?, binary(imp, B::Sub, ix, x0)?);
        let (wy0, wy1) = (binary(imp, B::Sub, y1, iy)?, binary(imp, B::Sub, iy, y0)?);
        let mut acc: Option<ValueId> = None;
        for (x, y, wx, wy) in [(x0, y0, wx0, wy0), (x1, y0, wx1, wy0), (x0, y1, wx0, wy1), (x1, y1, wx1, wy1)] {
            let weight = binary(imp, B::Mul, wx, wy)?;
            let v = corner(imp, x, y, Some(weight))?;
            acc = Some(match acc {
                Some(a) => binary(imp, B::Add, a, v)?,
                None => v,
            });
        }
        match acc {
            Some(a) => a,
            None => return unsupported("grid_sampler_2d without corners"),
        }
    };
    let v = imp.build(Op::Permute { perm: vec![0, 3, 1, 2] }, vec![sampled])?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `0 <= c <= size - 1` (false for NaN).
fn in_bounds(imp: &mut Importer, c: ValueId, size: i64) -> R<ValueId> {
    let lo = imp.with_scalar(B::Ge, c, 0.0)?;
    let hi = imp.with_scalar(B::Le, c, (size - 1) as f64)?;
    binary(imp, B::And, lo, hi)
}

/// A coordinate clamped into `[0, size - 1]` as an i64 index.
fn clamped_index(imp: &mut Importer, c: ValueId, size: i64) -> R<ValueId> {
    let c = imp.build(Op::Clamp { min: Some(0.0), max: Some((size - 1) as f64) }, vec![c])?;
    Ok(imp.cast(c, DType::I64))
}

/// torch's `grid_sampler_compute_source_index`: a normalised coordinate in
/// [-1, 1] to a pixel coordinate, then border clipping or reflection.
fn source_index(imp: &mut Importer, c: ValueId, size: i64, padding: Padding, align: bool) -> R<ValueId> {
    let size_f = size as f64;
    // align_corners: (c + 1) * (size - 1) / 2; otherwise (c + 1) * size / 2 - 0.5.
    let scale = if align { (size_f - 1.0) / 2.0 } else { size_f / 2.0 };
    let shifted = imp.with_scalar(B::Add, c, 1.0)?;
    let mut v = imp.with_scalar(B::Mul, shifted, scale)?;
    if !align {
        v = imp.with_scalar(B::Sub, v, 0.5)?;
    }
    match padding {
        Padding::Zeros => Ok(v),
        Padding::Border => clip(imp, v, size),
        Padding::Reflection => {
            let reflected = if align {
                reflect(imp, v, 0.0, 2.0 * (size_f - 1.0))?
            } else {
                reflect(imp, v, -1.0, 2.0 * size_f - 1.0)?
            };
            clip(imp, reflected, size)
        }
    }
}

fn clip(imp: &mut Importer, v: ValueId, size: i64) -> R<ValueId> {
    imp.build(Op::Clamp { min: Some(0.0), max: Some((size - 1) as f64) }, vec![v])
}

/// torch's `reflect_coordinates(in, twice_low, twice_high)`.
fn reflect(imp: &mut Importer, v: ValueId, twice_low: f64, twice_high: f64) -> R<ValueId> {
    if twice_low == twice_high {
        let dtype = imp.ty(v).dtype;
        let shape = imp.ty(v).shape.clone();
        return Ok(imp.push(Op::Full { value: 0.0, dtype, shape: shape.clone() }, vec![], TensorType::new(dtype, shape)));
    }
    let min = twice_low / 2.0;
    let span = (twice_high - twice_low) / 2.0;
    let from_min = imp.with_scalar(B::Sub, v, min)?;
    let dist = unary(imp, U::Abs, from_min)?;
    let extra = imp.with_scalar(B::Fmod, dist, span)?;
    let ratio = imp.with_scalar(B::Div, dist, span)?;
    let flips = unary(imp, U::Floor, ratio)?;
    let parity = imp.with_scalar(B::Fmod, flips, 2.0)?;
    let even = imp.with_scalar(B::Eq, parity, 0.0)?;
    let forward = imp.with_scalar(B::Add, extra, min)?;
    let neg_extra = unary(imp, U::Neg, extra)?;
    let backward = imp.with_scalar(B::Add, neg_extra, span + min)?;
    imp.build(Op::Where, vec![even, forward, backward])
}
