//! `torch.linalg`: LU-based (det, slogdet, inv, solve, lu_factor), Cholesky,
//! triangular and Cholesky solves, QR, symmetric eigenvalues — one
//! [`Op::Linalg`] per result used, computed by `kiln_kernels::linalg`.
//!
//! Eager torch raises when a matrix is singular (inv, solve) or not
//! positive definite (cholesky); the training-IR ops do the same here with a
//! run-time [`Op::Assert`] on the factorisation's info. Core ATen spells
//! that check out as `with_effects(_linalg_check_errors)` (see
//! [`with_effects`]), and its `_ex` ops return the info themselves.

use crate::import::importer::{unsupported, Importer, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, DType, Dim, LinalgOp as L, Op, TensorType, ValueId};

#[derive(Copy, Clone, Default)]
struct Flags {
    upper: bool,
    left: bool,
    unit: bool,
}

fn linalg(imp: &mut Importer, op: L, f: Flags, inputs: Vec<ValueId>) -> R<ValueId> {
    imp.push(Op::Linalg { op, upper: f.upper, left: f.left, unit: f.unit }, inputs)
}

/// Output `i`'s tensor name, when the program reads it.
fn used<'n>(imp: &Importer, n: &'n Node, i: usize) -> Option<&'n str> {
    match n.outputs.get(i) {
        Some(Arg::Tensor(name)) if imp.is_used(name) => Some(name),
        _ => None,
    }
}

/// Binds output `i` to `op`'s result when the program reads it.
fn bind_result(imp: &mut Importer, n: &Node, i: usize, op: L, f: Flags, inputs: &[ValueId]) -> R<()> {
    if used(imp, n, i).is_some() {
        let v = linalg(imp, op, f, inputs.to_vec())?;
        imp.bind(n, i, v)?;
    }
    Ok(())
}

/// The float matrices operand `name`: f32/f64 (torch's CPU linalg takes no
/// other real dtype).
fn matrices(imp: &mut Importer, n: &Node, name: &str) -> R<ValueId> {
    let a = imp.tensor(n, name)?;
    let ty = imp.ty(a);
    if !matches!(ty.dtype, DType::F32 | DType::F64) {
        return unsupported(format!("linalg on {} (kiln's linalg kernels take f32 and f64)", ty.dtype));
    }
    if ty.rank() < 2 {
        return unsupported(format!("linalg on a {}-d tensor", ty.rank()));
    }
    Ok(a)
}

/// Fails the run with `message` unless `info` (i32) is zero everywhere.
fn assert_zero(imp: &mut Importer, info: ValueId, message: String) -> R<()> {
    let zero = imp.scalar_const(crate::import::importer::Scalar::Int(0), DType::I32);
    let ok = imp.push(Op::Binary(BinaryOp::Eq), vec![info, zero])?;
    let loc = imp.loc();
    imp.g.add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    Ok(())
}

/// A factorisation's info (`op` of `a`): bound to output `at` of an `_ex`
/// op when the program reads it, and with `check` (where eager torch
/// raises) a run-time check that it is zero everywhere.
fn info_result(
    imp: &mut Importer,
    n: &Node,
    at: Option<usize>,
    check: bool,
    op: L,
    a: ValueId,
    message: impl FnOnce() -> String,
) -> R<()> {
    let bind = at.filter(|&i| used(imp, n, i).is_some());
    if bind.is_none() && !check {
        return Ok(());
    }
    let info = linalg(imp, op, Flags::default(), vec![a])?;
    if let Some(i) = bind {
        imp.bind(n, i, info)?;
    }
    if check {
        assert_zero(imp, info, message())?;
    }
    Ok(())
}

fn singular(api: &str) -> String {
    format!("torch.{api}: the input matrix is singular (its LU factorization has a zero pivot)")
}

fn not_positive_definite(api: &str) -> String {
    format!("torch.{api}: the input is not positive-definite (its Cholesky factorization could not be completed)")
}

/// Broadcasts the batch dims of `a` (`[.., n, n]`) and `b` (`[.., r, c]`)
/// against each other, as torch's solves do.
fn broadcast_batches(imp: &mut Importer, a: ValueId, b: ValueId) -> R<(ValueId, ValueId)> {
    let (ta, tb) = (imp.ty(a).clone(), imp.ty(b).clone());
    let (ra, rb) = (ta.rank(), tb.rank());
    let (ba, bb) = (&ta.shape[..ra - 2], &tb.shape[..rb - 2]);
    if ba == bb {
        return Ok((a, b));
    }
    let len = ba.len().max(bb.len());
    let pad = |s: &[Dim]| -> Vec<Dim> {
        std::iter::repeat_n(Dim::Const(1), len - s.len()).chain(s.iter().cloned()).collect()
    };
    let (pa, pb) = (pad(ba), pad(bb));
    let mut batch = Vec::with_capacity(len);
    for (x, y) in pa.iter().zip(&pb) {
        batch.push(match (x.as_const(), y.as_const()) {
            (Some(1), _) => y.clone(),
            (_, Some(1)) => x.clone(),
            _ if x == y => x.clone(),
            _ => return unsupported(format!("linalg: batch dims {ba:?} and {bb:?} do not broadcast")),
        });
    }
    let expand = |imp: &mut Importer, v: ValueId, t: &TensorType| -> R<ValueId> {
        let r = t.rank();
        let padded: Vec<Dim> = pad(&t.shape[..r - 2]).into_iter().chain(t.shape[r - 2..].iter().cloned()).collect();
        let v = imp.push(Op::Reshape { shape: padded }, vec![v])?;
        let full: Vec<Dim> = batch.iter().cloned().chain(t.shape[r - 2..].iter().cloned()).collect();
        imp.push(Op::Expand { shape: full }, vec![v])
    };
    Ok((expand(imp, a, &ta)?, expand(imp, b, &tb)?))
}

/// `linalg_inv(A)`, `linalg_inv_ex(A, *, check_errors=False) -> (inverse, info)`.
pub(super) fn inv(imp: &mut Importer, n: &Node, ex: bool) -> R<()> {
    let a = matrices(imp, n, "A")?;
    let inverse = linalg(imp, L::Inv, Flags::default(), vec![a])?;
    imp.bind(n, 0, inverse)?;
    let check = !ex || imp.bool(n, "check_errors", false)?;
    info_result(imp, n, ex.then_some(1), check, L::LuInfo, a, || singular("linalg.inv"))
}

/// `linalg_det(A)` and `_linalg_det(A) -> (result, LU, pivots)`.
pub(super) fn det(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "A")?;
    let d = linalg(imp, L::Det, Flags::default(), vec![a])?;
    imp.bind(n, 0, d)?;
    bind_result(imp, n, 1, L::LuFactor, Flags::default(), &[a])?;
    bind_result(imp, n, 2, L::LuPivots, Flags::default(), &[a])
}

/// `linalg_slogdet(A) -> (sign, logabsdet)`, `_linalg_slogdet(A) -> (sign, logabsdet, LU, pivots)`.
pub(super) fn slogdet(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "A")?;
    for (i, op) in [L::SignDet, L::LogAbsDet, L::LuFactor, L::LuPivots].into_iter().enumerate() {
        bind_result(imp, n, i, op, Flags::default(), &[a])?;
    }
    Ok(())
}

/// `linalg_lu_factor(A, *, pivot=True) -> (LU, pivots)` and
/// `linalg_lu_factor_ex(A, *, pivot=True, check_errors=False) -> (LU, pivots, info)`.
pub(super) fn lu_factor(imp: &mut Importer, n: &Node, ex: bool) -> R<()> {
    if !imp.bool(n, "pivot", true)? {
        return unsupported("lu_factor without pivoting");
    }
    let a = matrices(imp, n, "A")?;
    bind_result(imp, n, 0, L::LuFactor, Flags::default(), &[a])?;
    bind_result(imp, n, 1, L::LuPivots, Flags::default(), &[a])?;
    let check = ex && imp.bool(n, "check_errors", false)?;
    info_result(imp, n, ex.then_some(2), check, L::LuInfo, a, || singular("linalg.lu_factor"))
}

/// A right-hand side as a same-rank matrix: torch's vector case (`B` is
/// `[.., n]` against `[.., n, n]`, or 1-d) becomes one column (`left`) or
/// one row; the second result says to drop that dim again.
fn rhs_matrix(imp: &mut Importer, a: ValueId, b: ValueId, left: bool) -> R<(ValueId, bool)> {
    let (ta, tb) = (imp.ty(a).clone(), imp.ty(b).clone());
    let vector = tb.rank() == 1 || (tb.rank() + 1 == ta.rank() && tb.shape[..] == ta.shape[..ta.rank() - 1]);
    if !vector {
        return Ok((b, false));
    }
    let axis = if left { tb.rank() } else { tb.rank() - 1 };
    let mut shape = tb.shape.clone();
    shape.insert(axis, Dim::Const(1));
    Ok((imp.push(Op::Reshape { shape }, vec![b])?, true))
}

/// Which results a solve returns besides the solution.
#[derive(Copy, Clone, PartialEq)]
pub(super) enum SolveResults {
    /// `linalg_solve(A, B, *, left=True)`.
    Solution,
    /// `linalg_solve_ex(A, B, *, left=True, check_errors=False) -> (result, info)`.
    Info,
    /// `_linalg_solve_ex(A, B, *, left=True, check_errors=False) -> (result, LU, pivots, info)`.
    LuAndInfo,
}

/// The solves of [`SolveResults`].
pub(super) fn solve(imp: &mut Importer, n: &Node, results: SolveResults) -> R<()> {
    let ex = results != SolveResults::Solution;
    let a = matrices(imp, n, "A")?;
    let b = imp.tensor(n, "B")?;
    let left = imp.bool(n, "left", true)?;
    let (bm, vector) = rhs_matrix(imp, a, b, left)?;
    let (a2, bm) = broadcast_batches(imp, a, bm)?;
    let f = Flags { left, ..Flags::default() };
    let x = linalg(imp, L::Solve, f, vec![a2, bm])?;
    let out = imp.out_ty(n, 0)?;
    let x = if vector { imp.push(Op::Reshape { shape: out.shape.clone() }, vec![x])? } else { x };
    imp.bind(n, 0, x)?;
    // LU and pivots are of A^T for a right solve (torch factors what it solves).
    let fa = if left { a2 } else { imp.push(Op::Permute { perm: swap_last(imp.ty(a2).rank()) }, vec![a2])? };
    let info_at = if results == SolveResults::LuAndInfo {
        bind_result(imp, n, 1, L::LuFactor, Flags::default(), &[fa])?;
        bind_result(imp, n, 2, L::LuPivots, Flags::default(), &[fa])?;
        3
    } else {
        1
    };
    let check = !ex || imp.bool(n, "check_errors", false)?;
    info_result(imp, n, ex.then_some(info_at), check, L::LuInfo, fa, || singular("linalg.solve"))
}

fn swap_last(rank: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    perm
}

/// `linalg_cholesky(A, *, upper=False)` and
/// `linalg_cholesky_ex(A, *, upper=False, check_errors=False) -> (L, info)`.
pub(super) fn cholesky(imp: &mut Importer, n: &Node, ex: bool) -> R<()> {
    let a = matrices(imp, n, "self")?;
    let f = Flags { upper: imp.bool(n, "upper", false)?, ..Flags::default() };
    let l = linalg(imp, L::Cholesky, f, vec![a])?;
    imp.bind(n, 0, l)?;
    let check = !ex || imp.bool(n, "check_errors", false)?;
    info_result(imp, n, ex.then_some(1), check, L::CholeskyInfo, a, || not_positive_definite("linalg.cholesky"))
}

/// `linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False)`.
pub(super) fn solve_triangular(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "self")?;
    let b = imp.tensor(n, "B")?;
    let f = Flags {
        upper: imp.bool(n, "upper", false)?,
        left: imp.bool(n, "left", true)?,
        unit: imp.bool(n, "unitriangular", false)?,
    };
    let (a, b) = broadcast_batches(imp, a, b)?;
    imp.emit(n, Op::Linalg { op: L::TriangularSolve, upper: f.upper, left: f.left, unit: f.unit }, vec![a, b])?;
    Ok(())
}

/// `cholesky_solve(Tensor self, Tensor input2, bool upper=False)`: solves
/// `A X = self` with A's Cholesky factor `input2`.
pub(super) fn cholesky_solve(imp: &mut Importer, n: &Node) -> R<()> {
    let b = imp.tensor(n, "self")?;
    let l = matrices(imp, n, "input2")?;
    let f = Flags { upper: imp.bool(n, "upper", false)?, left: true, unit: false };
    let (l, b) = broadcast_batches(imp, l, b)?;
    imp.emit(n, Op::Linalg { op: L::CholeskySolve, upper: f.upper, left: f.left, unit: f.unit }, vec![l, b])?;
    Ok(())
}

/// `linalg_qr(A, mode='reduced') -> (Q, R)`; mode `r` leaves Q empty.
pub(super) fn qr(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "A")?;
    let mode = imp.string(n, "mode", "reduced")?.to_string();
    let (q, r) = match mode.as_str() {
        "reduced" => (L::QrQ, L::QrR),
        "complete" => (L::QrQComplete, L::QrRComplete),
        "r" => {
            let out = imp.out_ty(n, 0)?;
            let empty = imp.push(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![])?;
            imp.bind(n, 0, empty)?;
            return bind_result(imp, n, 1, L::QrR, Flags::default(), &[a]);
        }
        other => return unsupported(format!("qr mode `{other}`")),
    };
    bind_result(imp, n, 0, q, Flags::default(), &[a])?;
    bind_result(imp, n, 1, r, Flags::default(), &[a])
}

/// `_linalg_eigh(A, UPLO='L', compute_v=True) -> (eigenvalues, eigenvectors)`,
/// `linalg_eigh(A, UPLO='L')` and `linalg_eigvalsh(A, UPLO='L')`: the
/// eigenvalues. Eigenvectors are refused: their signs are LAPACK's choice.
pub(super) fn eigh(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, if n.target.contains("_linalg_eigh") { "A" } else { "self" })?;
    if used(imp, n, 1).is_some() {
        return unsupported("eigenvectors of eigh (their signs are LAPACK's choice); eigenvalues alone are supported");
    }
    let upper = match imp.string(n, "UPLO", "L")? {
        "L" => false,
        "U" => true,
        other => return unsupported(format!("eigh UPLO `{other}`")),
    };
    let w = linalg(imp, L::EigvalsH, Flags { upper, ..Flags::default() }, vec![a])?;
    imp.bind(n, 0, w)
}

/// `logdet(Tensor self)`: `log|det| + log(sign)` — NaN for a negative
/// determinant, -inf for a singular matrix, as torch gives.
pub(super) fn logdet(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "self")?;
    let sign = linalg(imp, L::SignDet, Flags::default(), vec![a])?;
    let log_abs = linalg(imp, L::LogAbsDet, Flags::default(), vec![a])?;
    let log_sign = imp.push(Op::Unary(kiln_ir::UnaryOp::Log), vec![sign])?;
    imp.emit(n, Op::Binary(BinaryOp::Add), vec![log_abs, log_sign])?;
    Ok(())
}

/// `higher_order.with_effects(token, op, *args)`: a side-effecting op
/// threaded through effect tokens. `_linalg_check_errors(info, api_name, *,
/// is_matrix)` becomes a run-time check; any other effect is refused.
pub(crate) fn with_effects(imp: &mut Importer, n: &Node) -> R<()> {
    let positional = |i: usize| n.inputs.get(i).map(|a| &a.arg);
    let (Some(Arg::Tensor(token)), Some(Arg::Operator(op))) = (positional(0), positional(1)) else {
        return unsupported("with_effects without a token and an operator");
    };
    match op.as_str() {
        "torch.ops.aten._linalg_check_errors.default" => {
            let (Some(Arg::Tensor(info)), Some(Arg::Str(api))) = (positional(2), positional(3)) else {
                return unsupported("_linalg_check_errors without (info, api_name)");
            };
            let info = imp.value(info)?;
            let message = if api.contains("cholesky") { not_positive_definite(api) } else { singular(api) };
            assert_zero(imp, info, message)?;
        }
        other => return unsupported(format!("side effect `{other}` (kiln honours only torch.linalg's error checks)")),
    }
    // The new token is the old one: kiln orders effects by the schedule.
    let token = imp.value(token)?;
    imp.bind(n, 0, token)
}

/// Most squarings `matrix_exp` applies: 1-norms up to 2^(MAX_SQUARINGS - 1).
const MAX_SQUARINGS: usize = 64;

/// `aten::linalg_matrix_exp(Tensor self)` and `aten::matrix_exp(Tensor self)`:
/// scaling and squaring in f64. Each matrix is scaled by `2^-s`, `s` the
/// smallest count (≥ 0) that brings its 1-norm to at most 1/2, where the
/// degree-18 Taylor polynomial (Horner's rule) is exact to f64's rounding;
/// the result is then squared `s` times — a fixed chain of
/// [`MAX_SQUARINGS`] conditional squarings, a matrix keeping its value past
/// its own `s`. A larger norm fails the run (its exponential overflows
/// unless the matrix is nearly nilpotent). torch picks a lower degree for
/// small norms; in f64 both agree to far below torch's tolerance. f32
/// (and f16/bf16) are refused: torch's own f32 result strays from the
/// exponential by more than its tolerance on large norms.
pub(super) fn matrix_exp(imp: &mut Importer, n: &Node) -> R<()> {
    use crate::import::importer::Scalar;
    use kiln_ir::{ReduceKind, UnaryOp};
    let a = imp.tensor(n, "self")?;
    let out = imp.out_ty(n, 0)?;
    let ty = imp.ty(a).clone();
    if ty.dtype != DType::F64 {
        // torch's f32 result is off the exact exponential by up to 2e-3
        // relative on OpInfo's samples (norm ~27); matching it would mean
        // its degree selection and T18 evaluation rounded step for step.
        return unsupported(format!(
            "matrix_exp of {}: kiln computes the exact exponential, which torch's {} scaling and squaring misses \
             by more than its tolerance on large norms (f64 only)",
            ty.dtype, ty.dtype
        ));
    }
    let rank = ty.rank();
    let size = match (rank >= 2).then(|| (ty.shape[rank - 2].as_const(), ty.shape[rank - 1].as_const())) {
        Some((Some(r), Some(c))) if r == c => r,
        Some((Some(_), Some(_))) => return crate::import::importer::invalid("matrix_exp of non-square matrices"),
        Some(_) => return unsupported("matrix_exp of matrices with a dynamic size"),
        None => return crate::import::importer::invalid(format!("matrix_exp of a {rank}-d tensor")),
    };
    let f = DType::F64;
    let x = imp.cast(a, f);
    let c = |imp: &mut Importer, v: f64| imp.scalar_const(Scalar::Float(v), f);
    // The 1-norm: the largest column sum of magnitudes, [.., 1, 1].
    let mag = imp.push(Op::Unary(UnaryOp::Abs), vec![x])?;
    let cols = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![rank - 2], keep_dims: true }, vec![mag])?;
    let norm = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: vec![rank - 1], keep_dims: true }, vec![cols])?;
    // s = max(0, ⌈log2(2 · norm)⌉), 0 for a zero matrix.
    let twice = imp.with_scalar(BinaryOp::Mul, norm, 2.0)?;
    let tiny = c(imp, f64::MIN_POSITIVE);
    let twice = imp.push(Op::Binary(BinaryOp::Max), vec![twice, tiny])?;
    let log = imp.push(Op::Unary(UnaryOp::Log2), vec![twice])?;
    let s = imp.push(Op::Unary(UnaryOp::Ceil), vec![log])?;
    let s = imp.push(Op::Clamp { min: Some(0.0), max: None }, vec![s])?;
    let limit = c(imp, MAX_SQUARINGS as f64);
    let fits = imp.push(Op::Binary(BinaryOp::Le), vec![s, limit])?;
    let loc = imp.loc();
    let message = format!("matrix_exp: a matrix's 1-norm is above 2^{}", MAX_SQUARINGS - 1);
    imp.g.add_node(Op::Assert { message }, vec![fits], Vec::new(), loc);
    let two = c(imp, 2.0);
    let minus_s = imp.push(Op::Unary(UnaryOp::Neg), vec![s])?;
    let scale = imp.push(Op::Binary(BinaryOp::Pow), vec![two, minus_s])?;
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![x, scale])?;
    // I, as f64 [size, size].
    let positions = TensorType::new(DType::I64, vec![Dim::Const(size)]);
    let arange = Op::Arange { start: 0.0, step: 1.0, len: Dim::Const(size), dtype: DType::I64 };
    let p = imp.push_typed(arange, vec![], positions);
    let rows = imp.push(Op::Reshape { shape: vec![Dim::Const(size), Dim::Const(1)] }, vec![p])?;
    let cols = imp.push(Op::Reshape { shape: vec![Dim::Const(1), Dim::Const(size)] }, vec![p])?;
    let eye = imp.push(Op::Binary(BinaryOp::Eq), vec![rows, cols])?;
    let eye = imp.cast(eye, f);
    // Horner: T = I + A·T/k for k = 18 .. 1.
    let mut t = eye;
    for k in (1..=18).rev() {
        let at = imp.push(Op::MatMul, vec![scaled, t])?;
        let at = imp.with_scalar(BinaryOp::Div, at, k as f64)?;
        t = imp.push(Op::Binary(BinaryOp::Add), vec![eye, at])?;
    }
    for i in 0..MAX_SQUARINGS {
        let square = imp.push(Op::MatMul, vec![t, t])?;
        let step = c(imp, i as f64);
        let more = imp.push(Op::Binary(BinaryOp::Lt), vec![step, s])?;
        t = imp.push(Op::Where, vec![more, square, t])?;
    }
    let v = imp.cast(t, out.dtype);
    imp.bind(n, 0, v)
}
