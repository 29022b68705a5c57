//! More ops raw `torch.export.export()` (training IR) keeps and Core ATen
//! decomposes, found by the `generate.py --all` sweep: the `*_copy` forms of
//! view ops, grids and combinatorics (`meshgrid`, `cartesian_prod`,
//! `combinations`), rank-1 and batched products with a bias (`addr`,
//! `addbmm`), `sum_to_size` and `unsafe_chunk`. Each becomes kiln's
//! primitives the way torch's own decompositions define it.

use super::activation::compute_dtype;
use super::indexing::i64_const;
use crate::import::importer::{invalid, output_names, unsupported, Importer, Scalar, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, ValueId};

/// The view op whose `*_copy` form `name` is, if it is one: the copy has
/// the view's value in new storage.
pub(super) fn copied_view(name: &str) -> Option<&'static str> {
    Some(match name {
        "alias_copy" => "alias",
        "as_strided_copy" => "as_strided",
        "diagonal_copy" => "diagonal",
        "expand_copy" => "expand",
        "narrow_copy" => "narrow",
        "permute_copy" => "permute",
        "select_copy" => "select",
        "slice_copy" => "slice",
        "split_copy" => "split",
        "split_with_sizes_copy" => "split_with_sizes",
        "squeeze_copy" => "squeeze",
        "t_copy" => "t",
        "transpose_copy" => "transpose",
        "unbind_copy" => "unbind",
        "unfold_copy" => "unfold",
        "unsqueeze_copy" => "unsqueeze",
        "view_copy" => "view",
        _ => return None,
    })
}

/// `aten::<view>_copy(...)`: converted as the view, whose results then stop
/// being views (an in-place write into the copy, or into its input, must not
/// reach the other).
pub(super) fn view_copy(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let Some(view) = copied_view(name) else {
        return invalid(format!("`{name}` is not the copy of a view op"));
    };
    let mut m = n.clone();
    m.target = format!("torch.ops.aten.{view}.{overload}");
    super::dispatch(imp, &m, view, overload)?;
    for out in &n.outputs {
        for name in output_names(out) {
            imp.forget_view(&name);
        }
    }
    Ok(())
}

/// `aten::unsafe_chunk(Tensor self, int chunks, int dim=0) -> Tensor[]`:
/// `chunk` without the aliasing checks, which change nothing here.
pub(super) fn unsafe_chunk(imp: &mut Importer, n: &Node) -> R<()> {
    let mut m = n.clone();
    m.target = "torch.ops.aten.chunk.default".to_string();
    super::dispatch(imp, &m, "chunk", "default")
}

/// The tensor names of `n`'s list output (or its several tensor outputs).
fn list_outputs(n: &Node) -> R<Vec<String>> {
    match n.outputs.as_slice() {
        [Arg::Tensors(ts)] => Ok(ts.clone()),
        outs => outs
            .iter()
            .map(|o| match o {
                Arg::Tensor(t) => Ok(t.clone()),
                other => invalid(format!("expected tensor outputs, found {other:?}")),
            })
            .collect(),
    }
}

/// The grid of `xs` (0-d or 1-d each): input `i` laid along output axis
/// `axis_of(i)` and broadcast to `shape`.
fn grid(imp: &mut Importer, xs: &[ValueId], shape: &[Dim], axis_of: impl Fn(usize) -> usize) -> R<Vec<ValueId>> {
    let mut out = Vec::with_capacity(xs.len());
    for (i, &x) in xs.iter().enumerate() {
        let ty = imp.ty(x).clone();
        if ty.rank() > 1 {
            return invalid(format!("meshgrid operand {i} has rank {}, expected 0 or 1", ty.rank()));
        }
        let axis = axis_of(i);
        let len = ty.shape.first().cloned().unwrap_or(Dim::Const(1));
        let mut lined = vec![Dim::Const(1); shape.len()];
        match lined.get_mut(axis) {
            Some(d) => *d = len,
            None => {
                return invalid(format!("meshgrid operand {i} lies along axis {axis} of a rank-{} grid", shape.len()))
            }
        }
        let v = imp.push(Op::Reshape { shape: lined }, vec![x])?;
        let full = TensorType::new(ty.dtype, shape.to_vec());
        out.push(imp.push_typed(Op::Expand { shape: shape.to_vec() }, vec![v], full));
    }
    Ok(out)
}

/// `aten::meshgrid(Tensor[] tensors)`, `meshgrid.indexing(Tensor[] tensors, *, str indexing)`:
/// each input along its own axis, broadcast to the grid; `xy` indexing
/// swaps the first two axes.
pub(super) fn meshgrid(imp: &mut Importer, n: &Node) -> R<()> {
    let xs = imp.tensors(n, "tensors")?;
    let names = list_outputs(n)?;
    if names.len() != xs.len() {
        return invalid(format!("meshgrid: {} inputs, {} outputs", xs.len(), names.len()));
    }
    let Some(first) = names.first() else { return invalid("meshgrid of no tensors") };
    let shape = imp.type_of(first)?.shape;
    let xy = match imp.string(n, "indexing", "ij")? {
        "ij" => false,
        "xy" => true,
        other => return invalid(format!("meshgrid indexing `{other}`")),
    };
    let count = xs.len();
    let swap = move |i: usize| match i {
        0 if xy && count > 1 => 1,
        1 if xy => 0,
        i => i,
    };
    let vs = grid(imp, &xs, &shape, swap)?;
    for (name, v) in names.iter().zip(vs) {
        let want = imp.type_of(name)?;
        if imp.ty(v).shape != want.shape || imp.ty(v).dtype != want.dtype {
            return invalid(format!("meshgrid output `{name}` is {:?}, the grid {:?}", want.shape, imp.ty(v).shape));
        }
        imp.bind_name(name, v);
    }
    Ok(())
}

/// `aten::cartesian_prod(Tensor[] tensors)`: the `ij` grid of the 1-d
/// inputs, flattened and stacked as columns (one input: itself).
pub(super) fn cartesian_prod(imp: &mut Importer, n: &Node) -> R<()> {
    let xs = imp.tensors(n, "tensors")?;
    let out = imp.out_ty(n, 0)?;
    if let [x] = xs.as_slice() {
        let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![*x], out);
        return imp.bind(n, 0, v);
    }
    let mut shape = Vec::with_capacity(xs.len());
    for (i, &x) in xs.iter().enumerate() {
        match imp.ty(x).shape.as_slice() {
            [d] => shape.push(d.clone()),
            other => return invalid(format!("cartesian_prod operand {i} has shape {other:?}, expected 1-d")),
        }
    }
    let rows = shape.iter().fold(Dim::Const(1), |a, d| Dim::mul(a, d.clone()));
    let cols = grid(imp, &xs, &shape, |i| i)?;
    let mut parts = Vec::with_capacity(cols.len());
    for c in cols {
        parts.push(imp.push(Op::Reshape { shape: vec![rows.clone(), Dim::Const(1)] }, vec![c])?);
    }
    imp.emit(n, Op::Concat { axis: 1 }, parts)?;
    Ok(())
}

/// The `r`-element index tuples of `0..len` in lexicographic order, strictly
/// increasing (or non-decreasing `with_replacement`): the order of torch's
/// masked meshgrid.
fn index_tuples(len: i64, r: usize, with_replacement: bool) -> Vec<i64> {
    let mut out = Vec::new();
    let mut tuple = Vec::with_capacity(r);
    fn walk(len: i64, r: usize, rep: bool, from: i64, tuple: &mut Vec<i64>, out: &mut Vec<i64>) {
        if tuple.len() == r {
            out.extend_from_slice(tuple);
            return;
        }
        for i in from..len {
            tuple.push(i);
            walk(len, r, rep, if rep { i } else { i + 1 }, tuple, out);
            tuple.pop();
        }
    }
    walk(len, r, with_replacement, 0, &mut tuple, &mut out);
    out
}

/// How many `r`-element tuples [`index_tuples`] makes: C(len, r), or
/// C(len + r - 1, r) with replacement (`None` on overflow).
fn tuple_count(len: i64, r: i64, with_replacement: bool) -> Option<i64> {
    let top = if with_replacement { len.checked_add(r)?.checked_sub(1)? } else { len };
    if r > top || top < 0 {
        return Some(0);
    }
    // C(top, r) = Π (top - r + i) / i, exact at every step.
    let k = r.min(top - r);
    let mut c: i64 = 1;
    for i in 1..=k {
        c = c.checked_mul(top - k + i)? / i;
    }
    Some(c)
}

/// Most elements a `combinations` index table may have.
const MAX_COMBINATION_INDICES: usize = 1 << 22;

/// `aten::combinations(Tensor self, int r=2, bool with_replacement=False)`:
/// a gather of the 1-d input at a compile-time table of index tuples.
pub(super) fn combinations(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let r = imp.int(n, "r", Some(2))?;
    let with_replacement = imp.bool(n, "with_replacement", false)?;
    let len = match imp.ty(x).shape.as_slice() {
        [d] => match d.as_const() {
            Some(l) => l,
            None => return unsupported("combinations of a dynamically sized tensor"),
        },
        other => return invalid(format!("combinations of a tensor of shape {other:?}, expected 1-d")),
    };
    if r < 0 {
        return invalid(format!("combinations with r = {r}"));
    }
    // r = 0 gives an empty [0].
    let elements = if r == 0 { Some(0) } else { tuple_count(len, r, with_replacement).and_then(|c| c.checked_mul(r)) };
    match elements {
        Some(e) if e <= MAX_COMBINATION_INDICES as i64 => {}
        _ => return unsupported(format!("combinations of {len} elements taken {r} at a time: too many to tabulate")),
    }
    if elements != out.numel().as_const() {
        return invalid(format!("combinations gives {elements:?} elements, the output declares {:?}", out.shape));
    }
    let table = if r == 0 { Vec::new() } else { index_tuples(len, r as usize, with_replacement) };
    let dims: Vec<i64> = match out.shape.iter().map(Dim::as_const).collect::<Option<Vec<_>>>() {
        Some(d) => d,
        None => return invalid("combinations with a symbolic output shape"),
    };
    let idx = i64_const(imp, &dims, &table);
    imp.emit(n, Op::Gather { axis: 0 }, vec![x, idx])?;
    Ok(())
}

/// `aten::addr(Tensor self, Tensor vec1, Tensor vec2, *, Scalar beta=1, Scalar alpha=1)`:
/// `beta·self + alpha·outer(vec1, vec2)` (self ignored when beta is 0; on
/// bool, `and`/`or`), f16/bf16 in f32.
pub(super) fn addr(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = if out.dtype == DType::Bool { DType::Bool } else { compute_dtype(out.dtype) };
    let x = imp.tensor(n, "self")?;
    let (v1, v2) = (imp.tensor(n, "vec1")?, imp.tensor(n, "vec2")?);
    let (l1, l2) = match (imp.ty(v1).shape.as_slice(), imp.ty(v2).shape.as_slice()) {
        ([a], [b]) => (a.clone(), b.clone()),
        (a, b) => return invalid(format!("addr of vectors shaped {a:?} and {b:?}")),
    };
    let (x, v1, v2) = (imp.cast(x, c), imp.cast(v1, c), imp.cast(v2, c));
    let col = imp.push(Op::Reshape { shape: vec![l1, Dim::Const(1)] }, vec![v1])?;
    let row = imp.push(Op::Reshape { shape: vec![Dim::Const(1), l2] }, vec![v2])?;
    let beta = imp.opt_scalar(n, "beta")?.unwrap_or(Scalar::Int(1));
    let alpha = imp.opt_scalar(n, "alpha")?.unwrap_or(Scalar::Int(1));
    let v = if c == DType::Bool {
        let p = imp.push(Op::Binary(B::And), vec![col, row])?;
        let p = if alpha.as_f64() != 0.0 { p } else { imp.with_scalar(B::And, p, 0.0)? };
        if beta.as_f64() == 0.0 {
            p
        } else {
            imp.push(Op::Binary(B::Or), vec![x, p])?
        }
    } else {
        let p = imp.push(Op::Binary(B::Mul), vec![col, row])?;
        scaled_sum(imp, x, p, beta, alpha)?
    };
    finish(imp, n, v)
}

/// `aten::addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1)`:
/// `beta·self + alpha·Σ_b batch1[b] @ batch2[b]` as torch's CPU kernel
/// computes it, one `addmm_` per batch into the result (each rounded to the
/// dtype; f16/bf16 products and sums in f32 within a step), so the batch
/// count must be static. f32 follows torch's small-GEMM rounding too (see
/// [`rank1_updates`]): the sums' order decides the last bits, and over
/// several batches they add up to more than torch's tolerance.
pub(super) fn addbmm(imp: &mut Importer, n: &Node) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let c = compute_dtype(out.dtype);
    let x = imp.tensor(n, "self")?;
    let (b1, b2) = (imp.tensor(n, "batch1")?, imp.tensor(n, "batch2")?);
    let (s1, s2) = (imp.ty(b1).shape.clone(), imp.ty(b2).shape.clone());
    let (batches, rows, cols) = match (s1.as_slice(), s2.as_slice()) {
        ([b, r, _], [_, _, c]) => match b.as_const() {
            Some(b) => (b, r.clone(), c.clone()),
            None => return unsupported("addbmm over a dynamic number of batches"),
        },
        _ => return invalid(format!("addbmm of batches shaped {s1:?} and {s2:?}")),
    };
    let beta = imp.opt_scalar(n, "beta")?.unwrap_or(Scalar::Int(1));
    let alpha = imp.opt_scalar(n, "alpha")?.unwrap_or(Scalar::Int(1));
    let (b1, b2) = (imp.cast(b1, c), imp.cast(b2, c));
    // The result starts as `self` (unless beta is 0, when it is never read).
    let mut acc = if beta.as_f64() == 0.0 { None } else { Some(imp.cast(x, out.dtype)) };
    if batches == 0 {
        let v = match acc {
            Some(x) => imp.with_scalar(B::Mul, x, beta.as_f64())?,
            None => {
                let zeros = Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() };
                imp.push_typed(zeros, vec![], out.clone())
            }
        };
        return finish(imp, n, v);
    }
    // A dynamic inner size takes the matrix-product path below.
    let inner = s1[2].as_const().unwrap_or(i64::MAX);
    let mut step_beta = beta;
    for b in 0..batches {
        let m1 = imp.push(Op::Slice { axis: 0, start: b, end: b + 1, step: 1 }, vec![b1])?;
        let m1 = imp.push(Op::Reshape { shape: vec![rows.clone(), s1[2].clone()] }, vec![m1])?;
        let m2 = imp.push(Op::Slice { axis: 0, start: b, end: b + 1, step: 1 }, vec![b2])?;
        let m2 = imp.push(Op::Reshape { shape: vec![s2[1].clone(), cols.clone()] }, vec![m2])?;
        if out.dtype == DType::F32 && batches.saturating_mul(inner) <= MAX_RANK1_UPDATES {
            acc = Some(rank1_updates(imp, acc, m1, m2, inner, step_beta, alpha, &out)?);
            step_beta = Scalar::Int(1);
            continue;
        }
        let p = imp.push(Op::MatMul, vec![m1, m2])?;
        let v = match acc {
            Some(r) => {
                let r = imp.cast(r, c);
                scaled_sum(imp, r, p, step_beta, alpha)?
            }
            None => scaled_sum(imp, p, p, Scalar::Int(0), alpha)?,
        };
        let v = imp.cast(v, out.dtype);
        let v = if imp.ty(v).shape == out.shape {
            v
        } else {
            imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out.clone())
        };
        acc = Some(v);
        step_beta = Scalar::Int(1);
    }
    match acc {
        Some(v) => finish(imp, n, v),
        None => invalid("addbmm produced no result"),
    }
}

/// Most rank-1 updates an f32 `addbmm` is unrolled into (batches × inner
/// size); beyond, each batch is one matrix product.
const MAX_RANK1_UPDATES: i64 = 256;

/// One f32 `addmm_` the way torch's CPU GEMM computes it for small sizes:
/// the result scaled by `beta` (zero-filled when it is 0 or absent), then
/// `c += a[:, l] · (b[l, :] · alpha)` for `l` in order, each rounded.
#[allow(clippy::too_many_arguments)]
fn rank1_updates(
    imp: &mut Importer,
    acc: Option<ValueId>,
    a: ValueId,
    b: ValueId,
    inner: i64,
    beta: Scalar,
    alpha: Scalar,
    out: &TensorType,
) -> R<ValueId> {
    let mut c = match acc {
        Some(c) if beta.as_f64() == 0.0 => imp.with_scalar(B::Mul, c, 0.0)?,
        Some(c) if beta.as_f64() != 1.0 => imp.with_scalar(B::Mul, c, beta.as_f64())?,
        Some(c) => c,
        None => {
            let zeros = Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() };
            imp.push_typed(zeros, vec![], out.clone())
        }
    };
    for l in 0..inner {
        let col = imp.push(Op::Slice { axis: 1, start: l, end: l + 1, step: 1 }, vec![a])?;
        let row = imp.push(Op::Slice { axis: 0, start: l, end: l + 1, step: 1 }, vec![b])?;
        let row = if alpha.as_f64() == 1.0 { row } else { imp.with_scalar(B::Mul, row, alpha.as_f64())? };
        let t = imp.push(Op::Binary(B::Mul), vec![col, row])?;
        c = imp.push(Op::Binary(B::Add), vec![c, t])?;
    }
    Ok(c)
}

/// `beta·x + alpha·p`, leaving out what multiplies by 1 and `x` when beta is
/// 0 (torch ignores `self` then, NaN included).
fn scaled_sum(imp: &mut Importer, x: ValueId, p: ValueId, beta: Scalar, alpha: Scalar) -> R<ValueId> {
    let p = if alpha.as_f64() == 1.0 { p } else { imp.with_scalar(B::Mul, p, alpha.as_f64())? };
    if beta.as_f64() == 0.0 {
        return Ok(p);
    }
    let bx = if beta.as_f64() == 1.0 { x } else { imp.with_scalar(B::Mul, x, beta.as_f64())? };
    imp.push(Op::Binary(B::Add), vec![bx, p])
}

/// Casts `v` to output 0's dtype, broadcasts it to its shape, and binds it.
fn finish(imp: &mut Importer, n: &Node, v: ValueId) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(v, out.dtype);
    let v = if imp.ty(v).shape == out.shape {
        v
    } else {
        imp.push_typed(Op::Expand { shape: out.shape.clone() }, vec![v], out)
    };
    imp.bind(n, 0, v)
}

/// `aten::sum_to_size(Tensor self, SymInt[] size)`: sums the leading axes
/// `size` lacks and, keeping them, the axes where `size` is 1 and `self` is
/// not, in the output dtype (integers and bool sum as i64, even when no axis
/// is summed).
pub(super) fn sum_to_size(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let x = imp.cast(x, out.dtype);
    let shape = imp.ty(x).shape.clone();
    let lead = match shape.len().checked_sub(out.rank()) {
        Some(l) => l,
        None => return invalid(format!("sum_to_size of {shape:?} to the larger rank {}", out.rank())),
    };
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, d) in out.shape.iter().enumerate() {
        if d.as_const() == Some(1) && shape[lead + i].as_const() != Some(1) {
            axes.push(lead + i);
        }
    }
    if axes.is_empty() {
        return imp.bind(n, 0, x);
    }
    let v = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes, keep_dims: true }, vec![x])?;
    imp.emit(n, Op::Reshape { shape: out.shape.clone() }, vec![v])?;
    Ok(())
}

/// The `(row, col)` coordinates of a `rows × cols` matrix's lower (or upper)
/// triangle with diagonal `offset`, in row-major order: rows first, then
/// columns (`None` when the table would pass [`MAX_COMBINATION_INDICES`]).
fn triangle(rows: i64, cols: i64, offset: i64, upper: bool) -> Option<Vec<i64>> {
    if rows < 0 || cols < 0 || rows.checked_mul(cols)? > MAX_COMBINATION_INDICES as i64 / 2 {
        return None;
    }
    let inside = |r: i64, c: i64| if upper { c - r >= offset } else { c - r <= offset };
    let cells: Vec<(i64, i64)> =
        (0..rows).flat_map(|r| (0..cols).map(move |c| (r, c))).filter(|&(r, c)| inside(r, c)).collect();
    Some(cells.iter().map(|&(r, _)| r).chain(cells.iter().map(|&(_, c)| c)).collect())
}

/// `aten::tril_indices(int row, int col, int offset=0, *, ScalarType? dtype=long, ...)`
/// and `triu_indices`: a compile-time `[2, N]` table.
pub(super) fn tri_indices(imp: &mut Importer, n: &Node, upper: bool) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let rows = imp.int(n, "row", None)?;
    let cols = imp.int(n, "col", None)?;
    let offset = imp.int(n, "offset", Some(0))?;
    let Some(table) = triangle(rows, cols, offset, upper) else {
        return unsupported(format!("a {rows} x {cols} triangle's index table (at most 2M cells)"));
    };
    let count = (table.len() / 2) as i64;
    if out.shape != [Dim::Const(2), Dim::Const(count)] {
        return invalid(format!("the triangle has {count} cells, the output declares {:?}", out.shape));
    }
    let v = i64_const(imp, &[2, count], &table);
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

#[cfg(test)]
mod tests {
    use super::{index_tuples, triangle, tuple_count};

    #[test]
    fn triangles_are_listed_row_major() {
        // torch.tril_indices(3, 3) and torch.triu_indices(3, 4, 1).
        assert_eq!(triangle(3, 3, 0, false), Some(vec![0, 1, 1, 2, 2, 2, 0, 0, 1, 0, 1, 2]));
        assert_eq!(triangle(3, 4, 1, true), Some(vec![0, 0, 0, 1, 1, 2, 1, 2, 3, 2, 3, 3]));
        assert_eq!(triangle(2, 2, -5, true), Some(vec![0, 0, 1, 1, 0, 1, 0, 1]));
        assert_eq!(triangle(1 << 40, 1 << 40, 0, false), None);
    }

    #[test]
    fn index_tuples_follow_torchs_masked_meshgrid_order() {
        assert_eq!(index_tuples(4, 2, false), [0, 1, 0, 2, 0, 3, 1, 2, 1, 3, 2, 3]);
        assert_eq!(index_tuples(3, 2, true), [0, 0, 0, 1, 0, 2, 1, 1, 1, 2, 2, 2]);
        assert_eq!(index_tuples(2, 3, false), Vec::<i64>::new());
        assert_eq!(index_tuples(3, 3, false), [0, 1, 2]);
        for (len, r, rep) in [(4, 2, false), (3, 2, true), (2, 3, false), (5, 3, true), (0, 1, true), (6, 0, false)] {
            let want = if r == 0 { 1 } else { index_tuples(len, r as usize, rep).len() as i64 / r };
            assert_eq!(tuple_count(len, r, rep), Some(want), "{len} {r} {rep}");
        }
        assert_eq!(tuple_count(1 << 40, 1 << 20, false), None);
    }
}
