//! Pairwise distances (`_cdist_forward`, `_pdist_forward`) and
//! `grid_sampler_2d`/`grid_sampler_3d`, decomposed at import into elementwise ops, reductions,
//! `MatMul` and `IndexGather`, following the formulas of torch's CPU kernels
//! (including when `cdist` switches to its matrix-product form).

use crate::import::importer::{table_len, unsupported, Importer, Scalar, R};
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
    imp.push(Op::Binary(op), vec![a, b])
}

fn unary(imp: &mut Importer, op: U, a: ValueId) -> R<ValueId> {
    imp.push(Op::Unary(op), vec![a])
}

fn reduce(imp: &mut Importer, kind: ReduceKind, v: ValueId, axis: usize) -> R<ValueId> {
    imp.push(Op::Reduce { kind, axes: vec![axis], keep_dims: false }, vec![v])
}

fn reshape(imp: &mut Importer, v: ValueId, shape: Vec<Dim>) -> R<ValueId> {
    if imp.ty(v).shape == shape {
        return Ok(v);
    }
    imp.push(Op::Reshape { shape }, vec![v])
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
                _ => {
                    return unsupported(
                        "cdist p=2 with dynamic row counts (torch picks its algorithm by size at run time)",
                    )
                }
            },
        };
    let (a, b) = (imp.cast(x1, compute), imp.cast(x2, compute));
    let v = if out.numel().as_const() == Some(0) {
        imp.push_typed(
            Op::Full { value: 0.0, dtype: compute, shape: out.shape.clone() },
            vec![],
            TensorType::new(compute, out.shape.clone()),
        )
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
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out)
    };
    imp.bind(n, 0, v)
}

/// torch's `_euclidean_dist`: `[-2a, |a|², 1] @ [b, 1, |b|²]ᵀ`, clamped at 0, square-rooted.
fn euclidean_by_matmul(imp: &mut Importer, a: ValueId, b: ValueId) -> R<ValueId> {
    let dtype = imp.ty(a).dtype;
    let axis = imp.ty(a).rank() - 1;
    let norm = |imp: &mut Importer, x: ValueId| -> R<ValueId> {
        let sq = binary(imp, B::Mul, x, x)?;
        let axis = imp.ty(x).rank() - 1;
        imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![axis], keep_dims: true }, vec![sq])
    };
    let ones = |imp: &mut Importer, like: ValueId| -> ValueId {
        let shape = imp.ty(like).shape.clone();
        imp.push_typed(Op::Full { value: 1.0, dtype, shape: shape.clone() }, vec![], TensorType::new(dtype, shape))
    };
    let (na, nb) = (norm(imp, a)?, norm(imp, b)?);
    let (pa, pb) = (ones(imp, na), ones(imp, nb));
    let a2 = imp.with_scalar(B::Mul, a, -2.0)?;
    let left = imp.push(Op::Concat { axis }, vec![a2, na, pa])?;
    let axis_b = imp.ty(b).rank() - 1;
    let right = imp.push(Op::Concat { axis: axis_b }, vec![b, pb, nb])?;
    let r = imp.ty(right).rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let right_t = imp.push(Op::Permute { perm }, vec![right])?;
    let product = imp.push(Op::MatMul, vec![left, right_t])?;
    let clamped = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![product])?;
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
    table_len("pdist's row pairs", &[rows, rows.saturating_sub(1) / 2 + 1])?;
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..rows {
        for j in i + 1..rows {
            first.push(i);
            second.push(j);
        }
    }
    let v = if first.is_empty() || shape[1] == 0 {
        imp.push_typed(
            Op::Full { value: 0.0, dtype: compute, shape: out.shape.clone() },
            vec![],
            TensorType::new(compute, out.shape.clone()),
        )
    } else {
        let xc = imp.cast(x, compute);
        let (i, j) = (index_const(imp, &first), index_const(imp, &second));
        let a = imp.push(Op::Gather { axis: 0 }, vec![xc, i])?;
        let b = imp.push(Op::Gather { axis: 0 }, vec![xc, j])?;
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

/// A grid sampler's operands and attributes: input, grid,
/// `interpolation_mode`, `padding_mode` and `align_corners`.
fn sampler_args(imp: &mut Importer, n: &Node, name: &str) -> R<(ValueId, ValueId, i64, Padding, bool)> {
    let input = imp.tensor(n, "input")?;
    let grid = imp.tensor(n, "grid")?;
    let interpolation = imp.int(n, "interpolation_mode", None)?;
    let padding = match imp.int(n, "padding_mode", None)? {
        0 => Padding::Zeros,
        1 => Padding::Border,
        2 => Padding::Reflection,
        other => return unsupported(format!("{name} padding_mode {other}")),
    };
    let align = imp.bool(n, "align_corners", false)?;
    Ok((input, grid, interpolation, padding, align))
}

/// `aten::grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode,
///   int padding_mode, bool align_corners) -> Tensor`: `input [N, C, H, W]`,
/// `grid [N, Ho, Wo, 2]` of (x, y) in [-1, 1] → `[N, C, Ho, Wo]`. Bilinear (0),
/// nearest (1) and bicubic (2) interpolation; zeros (0), border (1) and
/// reflection (2) padding; H and W static. The coordinate arithmetic is
/// torch's (`GridSampler.h` and the vectorised CPU kernel): unnormalise, then
/// the input is read with `IndexGather` from `[N, H, W, C]` at clamped
/// indices, and reads outside the input contribute zero. Bilinear and nearest
/// reflect/clip the sampling point itself; bicubic reflects/clips each of its
/// 16 taps instead (torch's `get_value_bounded`), since clipping the point
/// would move the 4x4 neighbourhood.
pub(super) fn grid_sampler_2d(imp: &mut Importer, n: &Node) -> R<()> {
    let (input, grid, interpolation, padding, align) = sampler_args(imp, n, "grid_sampler_2d")?;
    if !matches!(interpolation, 0..=2) {
        return unsupported(format!("grid_sampler_2d interpolation_mode {interpolation}"));
    }
    let out = imp.out_ty(n, 0)?;
    // torch's CPU kernel computes f16/bf16 samples in their own dtype, every
    // operation rounded to it (checked against torch for all three modes).
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
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let points: Vec<Dim> = tg.shape[..3].to_vec(); // [N, Ho, Wo]
    let g = imp.cast(grid, compute);
    let coord = |imp: &mut Importer, index: i64, size: i64| -> R<ValueId> {
        let c = imp.push(Op::Slice { axis: 3, start: index, end: index + 1, step: 1 }, vec![g])?;
        let c = reshape(imp, c, points.clone())?;
        unnormalize(imp, c, size, align)
    };
    let ux = coord(imp, 0, w)?;
    let uy = coord(imp, 1, h)?;
    let sampler = Sampler::new(imp, input, &points, &[h, w])?;
    let sampled = match interpolation {
        1 => {
            let x = pad_coordinate(imp, ux, w, padding, align)?;
            let y = pad_coordinate(imp, uy, h, padding, align)?;
            let x = unary(imp, U::Round, x)?;
            let y = unary(imp, U::Round, y)?;
            let (x, y) = (sampler.axis(imp, x, w)?, sampler.axis(imp, y, h)?);
            sampler.read(imp, &[&y, &x])?
        }
        0 => bilinear(imp, &sampler, ux, uy, padding, align)?,
        _ => bicubic(imp, &sampler, ux, uy, padding, align)?,
    };
    let v = imp.push(Op::Permute { perm: vec![0, 3, 1, 2] }, vec![sampled])?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `aten::grid_sampler(Tensor input, Tensor grid, ..)` (training IR):
/// the 2-d or 3-d sampler by the input's rank.
pub(super) fn grid_sampler(imp: &mut Importer, n: &Node) -> R<()> {
    let input = imp.tensor(n, "input")?;
    if imp.ty(input).rank() == 5 {
        grid_sampler_3d(imp, n)
    } else {
        grid_sampler_2d(imp, n)
    }
}

/// `aten::grid_sampler_3d(Tensor input, Tensor grid, int interpolation_mode,
///   int padding_mode, bool align_corners) -> Tensor`: `input [N, C, D, H, W]`,
/// `grid [N, Do, Ho, Wo, 3]` of (x, y, z) in [-1, 1] → `[N, C, Do, Ho, Wo]`.
/// Trilinear (0) and nearest (1) interpolation (torch has no 3-d bicubic),
/// the three padding modes, D, H and W static. As torch's scalar 3-d CPU
/// kernel: its unnormalisation, the point reflected/clipped, then the eight
/// corners weighted by `wx·wy·wz` and added x fastest, then y, then z.
pub(super) fn grid_sampler_3d(imp: &mut Importer, n: &Node) -> R<()> {
    let (input, grid, interpolation, padding, align) = sampler_args(imp, n, "grid_sampler_3d")?;
    if !matches!(interpolation, 0 | 1) {
        return unsupported(format!("grid_sampler_3d interpolation_mode {interpolation}"));
    }
    let out = imp.out_ty(n, 0)?;
    // As in 2-d, torch computes f16/bf16 samples in their own dtype.
    compute_dtype(imp, input, "grid_sampler_3d")?;
    let compute = imp.ty(input).dtype;
    let (ti, tg) = (imp.ty(input).clone(), imp.ty(grid).clone());
    if ti.rank() != 5 || tg.rank() != 5 {
        return unsupported("grid_sampler_3d needs a 5-d input and grid");
    }
    let (Some(d), Some(h), Some(w)) = (ti.shape[2].as_const(), ti.shape[3].as_const(), ti.shape[4].as_const()) else {
        return unsupported("grid_sampler_3d over a dynamic input depth, height or width");
    };
    if out.numel().as_const() == Some(0) || d == 0 || h == 0 || w == 0 {
        let v = imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out);
        return imp.bind(n, 0, v);
    }
    let points: Vec<Dim> = tg.shape[..4].to_vec(); // [N, Do, Ho, Wo]
    let g = imp.cast(grid, compute);
    let coord = |imp: &mut Importer, index: i64, size: i64| -> R<ValueId> {
        let c = imp.push(Op::Slice { axis: 4, start: index, end: index + 1, step: 1 }, vec![g])?;
        let c = reshape(imp, c, points.clone())?;
        let c = unnormalize_scalar(imp, c, size, align)?;
        pad_coordinate(imp, c, size, padding, align)
    };
    // Outermost first: z (depth), y, x.
    let point = [coord(imp, 2, d)?, coord(imp, 1, h)?, coord(imp, 0, w)?];
    let sizes = [d, h, w];
    let sampler = Sampler::new(imp, input, &points, &sizes)?;
    let sampled = if interpolation == 1 {
        let mut at = Vec::with_capacity(3);
        for (&c, &size) in point.iter().zip(&sizes) {
            let c = unary(imp, U::Round, c)?;
            at.push(sampler.axis(imp, c, size)?);
        }
        sampler.read(imp, &[&at[0], &at[1], &at[2]])?
    } else {
        trilinear(imp, &sampler, point)?
    };
    let v = imp.push(Op::Permute { perm: vec![0, 4, 1, 2, 3] }, vec![sampled])?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// The eight corners around the (reflected/clipped) point `[z, y, x]`,
/// each weighted by the volume of the opposite sub-box (`wx·wy·wz`, in
/// that order), summed x fastest, then y, then z (torch's tnw, tne, tsw,
/// tse, bnw, bne, bsw, bse).
fn trilinear(imp: &mut Importer, s: &Sampler, point: [ValueId; 3]) -> R<ValueId> {
    // Per axis: the lower and upper corner and their weights.
    let mut corners = Vec::with_capacity(3);
    for (&c, &size) in point.iter().zip(&s.sizes) {
        let lo = unary(imp, U::Floor, c)?;
        let hi = imp.with_scalar(B::Add, lo, 1.0)?;
        let (w_lo, w_hi) = (binary(imp, B::Sub, hi, c)?, binary(imp, B::Sub, c, lo)?);
        corners.push([(s.axis(imp, lo, size)?, w_lo), (s.axis(imp, hi, size)?, w_hi)]);
    }
    let [zs, ys, xs] = [&corners[0], &corners[1], &corners[2]];
    let mut terms = Vec::with_capacity(8);
    for (z, wz) in zs {
        for (y, wy) in ys {
            for (x, wx) in xs {
                let wxy = binary(imp, B::Mul, *wx, *wy)?;
                let weight = binary(imp, B::Mul, wxy, *wz)?;
                let value = s.read(imp, &[z, y, x])?;
                terms.push(s.weigh(imp, value, weight)?);
            }
        }
    }
    sum_in_order(imp, terms)
}

/// One coordinate of the input positions a sampling kernel reads, per output
/// point `[N, Ho, Wo]`: whether it lies inside the input, and the index it
/// reads (clamped, so that the gather stays in bounds either way).
struct Axis {
    inside: ValueId,
    index: ValueId,
}

/// Reads `input` at per-point positions, as `[N, <points>, C]` values
/// (points `[Ho, Wo]` in 2-d, `[Do, Ho, Wo]` in 3-d).
struct Sampler {
    /// The input channels-last, `[N, (D,) H, W, C]`, so that (n, (z,) y, x)
    /// index the leading axes.
    data: ValueId,
    /// The batch index of every output point, `[N, <points>]`.
    batch: ValueId,
    zero: ValueId,
    /// `[N, <points>, 1]`: per-point values broadcast over channels.
    column: Vec<Dim>,
    /// The input's spatial sizes, outermost first (`[H, W]` or `[D, H, W]`).
    sizes: Vec<i64>,
}

impl Sampler {
    fn new(imp: &mut Importer, input: ValueId, points: &[Dim], sizes: &[i64]) -> R<Sampler> {
        let compute = imp.ty(input).dtype;
        let batch_dim = imp.ty(input).shape[0].clone();
        let rank = imp.ty(input).rank();
        let channels_last = std::iter::once(0).chain(2..rank).chain(std::iter::once(1)).collect();
        let data = imp.push(Op::Permute { perm: channels_last }, vec![input])?;
        let batch = imp.push_typed(
            Op::Arange { start: 0.0, step: 1.0, len: batch_dim.clone(), dtype: DType::I64 },
            vec![],
            TensorType::new(DType::I64, vec![batch_dim.clone()]),
        );
        let mut batch_shape = vec![Dim::Const(1); points.len()];
        batch_shape[0] = batch_dim;
        let batch = reshape(imp, batch, batch_shape)?;
        let batch = imp.push_typed(
            Op::Expand { shape: points.to_vec() },
            vec![batch],
            TensorType::new(DType::I64, points.to_vec()),
        );
        let zero = imp.scalar_const(Scalar::Float(0.0), compute);
        let mut column = points.to_vec();
        column.push(Dim::Const(1));
        Ok(Sampler { data, batch, zero, column, sizes: sizes.to_vec() })
    }

    /// A coordinate (already reflected/clipped as the padding mode asks) along an axis of `size`.
    fn axis(&self, imp: &mut Importer, c: ValueId, size: i64) -> R<Axis> {
        Ok(Axis { inside: in_bounds(imp, c, size)?, index: clamped_index(imp, c, size)? })
    }

    /// The input at a position (one coordinate per spatial axis, outermost
    /// first), zero where any lies outside.
    fn read(&self, imp: &mut Importer, at: &[&Axis]) -> R<ValueId> {
        let mut inside = at[0].inside;
        for a in &at[1..] {
            inside = binary(imp, B::And, inside, a.inside)?;
        }
        let inside = reshape(imp, inside, self.column.clone())?;
        let mut operands = vec![self.data, self.batch];
        operands.extend(at.iter().map(|a| a.index));
        let picked = imp.push(Op::IndexGather { axis: 0 }, operands)?;
        imp.push(Op::Where, vec![inside, picked, self.zero])
    }

    /// `value [N, Ho, Wo, C] * weight [N, Ho, Wo]`.
    fn weigh(&self, imp: &mut Importer, value: ValueId, weight: ValueId) -> R<ValueId> {
        let weight = reshape(imp, weight, self.column.clone())?;
        binary(imp, B::Mul, value, weight)
    }
}

/// Left-to-right sum, the order torch's kernels add their taps in.
fn sum_in_order(imp: &mut Importer, terms: Vec<ValueId>) -> R<ValueId> {
    let mut terms = terms.into_iter();
    let Some(mut acc) = terms.next() else {
        return unsupported("grid_sampler_2d: an empty sum of taps");
    };
    for t in terms {
        acc = binary(imp, B::Add, acc, t)?;
    }
    Ok(acc)
}

/// The four corners around the (reflected/clipped) point, weighted by the
/// areas of the opposite sub-rectangles.
fn bilinear(imp: &mut Importer, s: &Sampler, ux: ValueId, uy: ValueId, padding: Padding, align: bool) -> R<ValueId> {
    let (w, h) = (s.sizes[1], s.sizes[0]);
    let ix = pad_coordinate(imp, ux, w, padding, align)?;
    let iy = pad_coordinate(imp, uy, h, padding, align)?;
    let x0 = unary(imp, U::Floor, ix)?;
    let y0 = unary(imp, U::Floor, iy)?;
    let x1 = imp.with_scalar(B::Add, x0, 1.0)?;
    let y1 = imp.with_scalar(B::Add, y0, 1.0)?;
    let (wx0, wx1) = (binary(imp, B::Sub, x1, ix)?, binary(imp, B::Sub, ix, x0)?);
    let (wy0, wy1) = (binary(imp, B::Sub, y1, iy)?, binary(imp, B::Sub, iy, y0)?);
    let (ax0, ax1) = (s.axis(imp, x0, w)?, s.axis(imp, x1, w)?);
    let (ay0, ay1) = (s.axis(imp, y0, h)?, s.axis(imp, y1, h)?);
    let mut terms = Vec::with_capacity(4);
    for (x, y, wx, wy) in
        [(&ax0, &ay0, wx0, wy0), (&ax1, &ay0, wx1, wy0), (&ax0, &ay1, wx0, wy1), (&ax1, &ay1, wx1, wy1)]
    {
        let weight = binary(imp, B::Mul, wx, wy)?;
        let value = s.read(imp, &[y, x])?;
        terms.push(s.weigh(imp, value, weight)?);
    }
    sum_in_order(imp, terms)
}

/// torch's bicubic sampling: cubic convolution (A = -0.75) over the 4x4
/// taps at floor(x) - 1 ..= floor(x) + 2 (and likewise in y) of the
/// unnormalised point; each tap is reflected/clipped on its own and reads
/// zero outside the input. As torch's kernel: four sums along x, one per tap
/// row, then their sum along y, each added left to right.
fn bicubic(imp: &mut Importer, s: &Sampler, ux: ValueId, uy: ValueId, padding: Padding, align: bool) -> R<ValueId> {
    let (w, h) = (s.sizes[1], s.sizes[0]);
    let taps = |imp: &mut Importer, u: ValueId, size: i64| -> R<(Vec<Axis>, [ValueId; 4])> {
        let floor = unary(imp, U::Floor, u)?;
        let t = binary(imp, B::Sub, u, floor)?;
        let coefficients = cubic_coefficients(imp, t)?;
        let mut axes = Vec::with_capacity(4);
        for offset in [-1.0, 0.0, 1.0, 2.0] {
            let c = imp.with_scalar(B::Add, floor, offset)?;
            let c = pad_coordinate(imp, c, size, padding, align)?;
            axes.push(s.axis(imp, c, size)?);
        }
        Ok((axes, coefficients))
    };
    let (xs, cx) = taps(imp, ux, w)?;
    let (ys, cy) = taps(imp, uy, h)?;
    let mut rows = Vec::with_capacity(4);
    for (y, &wy) in ys.iter().zip(&cy) {
        let mut terms = Vec::with_capacity(4);
        for (x, &wx) in xs.iter().zip(&cx) {
            let value = s.read(imp, &[y, x])?;
            terms.push(s.weigh(imp, value, wx)?);
        }
        let row = sum_in_order(imp, terms)?;
        rows.push(s.weigh(imp, row, wy)?);
    }
    sum_in_order(imp, rows)
}

/// The cubic convolution weights of the taps at distances 1 + t, t, 1 - t
/// and 2 - t from a point with fraction `t` in [0, 1), with torch's
/// A = -0.75, written as its vectorised CPU kernel evaluates them (so the
/// rounding matches): `((A + 2) d - (A + 3)) d d + 1` for |d| <= 1 and
/// `((A d - 5A) d + 8A) d - 4A` for 1 < |d| < 2.
fn cubic_coefficients(imp: &mut Importer, t: ValueId) -> R<[ValueId; 4]> {
    const A: f64 = -0.75;
    let near = |imp: &mut Importer, d: ValueId| -> R<ValueId> {
        let v = imp.with_scalar(B::Mul, d, A + 2.0)?;
        let v = imp.with_scalar(B::Sub, v, A + 3.0)?;
        let v = binary(imp, B::Mul, v, d)?;
        let v = binary(imp, B::Mul, v, d)?;
        imp.with_scalar(B::Add, v, 1.0)
    };
    let far = |imp: &mut Importer, d: ValueId| -> R<ValueId> {
        let v = imp.with_scalar(B::Mul, d, A)?;
        let v = imp.with_scalar(B::Sub, v, 5.0 * A)?;
        let v = binary(imp, B::Mul, v, d)?;
        let v = imp.with_scalar(B::Add, v, 8.0 * A)?;
        let v = binary(imp, B::Mul, v, d)?;
        imp.with_scalar(B::Sub, v, 4.0 * A)
    };
    let dtype = imp.ty(t).dtype;
    let one = imp.scalar_const(Scalar::Float(1.0), dtype);
    let two = imp.scalar_const(Scalar::Float(2.0), dtype);
    let t_plus_one = imp.with_scalar(B::Add, t, 1.0)?;
    let one_minus_t = binary(imp, B::Sub, one, t)?;
    let two_minus_t = binary(imp, B::Sub, two, t)?;
    Ok([far(imp, t_plus_one)?, near(imp, t)?, near(imp, one_minus_t)?, far(imp, two_minus_t)?])
}

/// `0 <= c <= size - 1` (false for NaN).
fn in_bounds(imp: &mut Importer, c: ValueId, size: i64) -> R<ValueId> {
    let lo = imp.with_scalar(B::Ge, c, 0.0)?;
    let hi = imp.with_scalar(B::Le, c, (size - 1) as f64)?;
    binary(imp, B::And, lo, hi)
}

/// A coordinate clamped into `[0, size - 1]` as an i64 index.
fn clamped_index(imp: &mut Importer, c: ValueId, size: i64) -> R<ValueId> {
    let c = imp.push(Op::Clamp { min: Some(0.0), max: Some((size - 1) as f64) }, vec![c])?;
    Ok(imp.cast(c, DType::I64))
}

/// torch's `grid_sampler_unnormalize`: a normalised coordinate in [-1, 1] to
/// a pixel coordinate, in the form of its vectorised CPU kernel.
fn unnormalize(imp: &mut Importer, c: ValueId, size: i64, align: bool) -> R<ValueId> {
    let size_f = size as f64;
    // align_corners: (c + 1) * (size - 1) / 2; otherwise (c + 1) * size / 2 - 0.5.
    let scale = if align { (size_f - 1.0) / 2.0 } else { size_f / 2.0 };
    let shifted = imp.with_scalar(B::Add, c, 1.0)?;
    let v = imp.with_scalar(B::Mul, shifted, scale)?;
    if align {
        return Ok(v);
    }
    imp.with_scalar(B::Sub, v, 0.5)
}

/// torch's scalar `grid_sampler_unnormalize` (the 3-d kernel's form):
/// `((c + 1) / 2) * (size - 1)` with align_corners, else
/// `((c + 1) * size - 1) / 2`.
fn unnormalize_scalar(imp: &mut Importer, c: ValueId, size: i64, align: bool) -> R<ValueId> {
    let shifted = imp.with_scalar(B::Add, c, 1.0)?;
    if align {
        let half = imp.with_scalar(B::Div, shifted, 2.0)?;
        return imp.with_scalar(B::Mul, half, (size - 1) as f64);
    }
    let scaled = imp.with_scalar(B::Mul, shifted, size as f64)?;
    let less_one = imp.with_scalar(B::Sub, scaled, 1.0)?;
    imp.with_scalar(B::Div, less_one, 2.0)
}

/// torch's `compute_coordinates`: a pixel coordinate clipped to the border
/// or reflected into the input as the padding mode asks (zeros: unchanged).
fn pad_coordinate(imp: &mut Importer, v: ValueId, size: i64, padding: Padding, align: bool) -> R<ValueId> {
    let size_f = size as f64;
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
    imp.push(Op::Clamp { min: Some(0.0), max: Some((size - 1) as f64) }, vec![v])
}

/// torch's `reflect_coordinates(in, twice_low, twice_high)`.
fn reflect(imp: &mut Importer, v: ValueId, twice_low: f64, twice_high: f64) -> R<ValueId> {
    if twice_low == twice_high {
        let dtype = imp.ty(v).dtype;
        let shape = imp.ty(v).shape.clone();
        return Ok(imp.push_typed(
            Op::Full { value: 0.0, dtype, shape: shape.clone() },
            vec![],
            TensorType::new(dtype, shape),
        ));
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
    imp.push(Op::Where, vec![even, forward, backward])
}
