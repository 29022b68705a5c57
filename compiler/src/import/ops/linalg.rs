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
    imp.push(Op::Linalg { op, upper: f.upper, left: f.left, unit: f.unit, complex: false }, inputs)
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
    linalg_operand(imp, a)
}

/// `a` when kiln's linalg kernels take it: f32/f64 matrices.
fn linalg_operand(imp: &Importer, a: ValueId) -> R<ValueId> {
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
pub(super) fn assert_zero(imp: &mut Importer, info: ValueId, message: String) -> R<()> {
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

pub(super) fn singular(api: &str) -> String {
    format!("torch.{api}: the input matrix is singular (its LU factorization has a zero pivot)")
}

pub(super) fn not_positive_definite(api: &str) -> String {
    format!("torch.{api}: the input is not positive-definite (its Cholesky factorization could not be completed)")
}

/// Broadcasts the batch dims of `a` (`[.., n, n]`) and `b` (`[.., r, c]`)
/// against each other, as torch's solves do.
pub(super) fn broadcast_batches(imp: &mut Importer, a: ValueId, b: ValueId) -> R<(ValueId, ValueId)> {
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

/// `linalg_ldl_factor(A, *, hermitian=False) -> (LD, pivots)` and
/// `linalg_ldl_factor_ex(A, *, hermitian=False, check_errors=False) -> (LD,
/// pivots, info)`: LAPACK's `sytrf` on the lower triangle (for real
/// matrices `hermitian` changes nothing).
pub(super) fn ldl_factor(imp: &mut Importer, n: &Node, ex: bool) -> R<()> {
    let a = matrices(imp, n, "self")?;
    bind_result(imp, n, 0, L::LdlFactor, Flags::default(), &[a])?;
    bind_result(imp, n, 1, L::LdlPivots, Flags::default(), &[a])?;
    let check = ex && imp.bool(n, "check_errors", false)?;
    info_result(imp, n, ex.then_some(2), check, L::LdlInfo, a, || {
        "torch.linalg.ldl_factor_ex: the factorization has an exactly singular block of D".to_string()
    })
}

/// `linalg_ldl_solve(LD, pivots, B, *, hermitian=False) -> Tensor`: `A X =
/// B` from `ldl_factor`'s results (`sytrs`); B `[.., n, k]` with LD's batch.
pub(super) fn ldl_solve(imp: &mut Importer, n: &Node) -> R<()> {
    let ld = matrices(imp, n, "LD")?;
    let pivots = imp.tensor(n, "pivots")?;
    let b = imp.tensor(n, "B")?;
    let (lt, bt) = (imp.ty(ld).clone(), imp.ty(b).clone());
    if bt.dtype != lt.dtype || bt.rank() != lt.rank() || bt.shape[..bt.rank() - 2] != lt.shape[..lt.rank() - 2] {
        return unsupported("ldl_solve with a right-hand side not shaped [.., n, k] with LD's batch and dtype");
    }
    let x = linalg(imp, L::LdlSolve, Flags::default(), vec![ld, pivots, b])?;
    imp.bind(n, 0, x)
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
    imp.emit(
        n,
        Op::Linalg { op: L::TriangularSolve, upper: f.upper, left: f.left, unit: f.unit, complex: false },
        vec![a, b],
    )?;
    Ok(())
}

/// `cholesky_solve(Tensor self, Tensor input2, bool upper=False)`: solves
/// `A X = self` with A's Cholesky factor `input2`.
pub(super) fn cholesky_solve(imp: &mut Importer, n: &Node) -> R<()> {
    let b = imp.tensor(n, "self")?;
    let l = matrices(imp, n, "input2")?;
    let f = Flags { upper: imp.bool(n, "upper", false)?, left: true, unit: false };
    let (l, b) = broadcast_batches(imp, l, b)?;
    imp.emit(
        n,
        Op::Linalg { op: L::CholeskySolve, upper: f.upper, left: f.left, unit: f.unit, complex: false },
        vec![l, b],
    )?;
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
/// `linalg_eigh(A, UPLO='L')` and `linalg_eigvalsh(A, UPLO='L')`. The
/// eigenvectors' signs are kiln's (each column's largest entry positive),
/// LAPACK's being an accident of its algorithm.
pub(super) fn eigh(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, if n.target.contains("_linalg_eigh") { "A" } else { "self" })?;
    let upper = match imp.string(n, "UPLO", "L")? {
        "L" => false,
        "U" => true,
        other => return unsupported(format!("eigh UPLO `{other}`")),
    };
    let f = Flags { upper, ..Flags::default() };
    bind_result(imp, n, 0, L::EigvalsH, f, &[a])?;
    if imp.bool(n, "compute_v", true)? {
        bind_result(imp, n, 1, L::EigvecsH, f, &[a])
    } else {
        bind_empty(imp, n, 1)
    }
}

/// Binds output `i` (when read) to zeros of its declared type: the empty
/// vectors of `compute_uv=False`/`compute_v=False`, `torch.svd`'s zero-filled U and V.
fn bind_empty(imp: &mut Importer, n: &Node, i: usize) -> R<()> {
    if used(imp, n, i).is_some() {
        let out = imp.out_ty(n, i)?;
        let zeros = imp.push(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![])?;
        imp.bind(n, i, zeros)?;
    }
    Ok(())
}

/// Fails the run when `a` holds a NaN or an infinity: torch's SVD raises
/// ("failed to converge") on such input rather than return NaNs.
pub(super) fn assert_finite_for_svd(imp: &mut Importer, a: ValueId) -> R<()> {
    // x − x is 0 exactly for finite x, NaN for NaN and ±inf.
    let d = imp.push(Op::Binary(BinaryOp::Sub), vec![a, a])?;
    let finite = imp.with_scalar(BinaryOp::Eq, d, 0.0)?;
    let loc = imp.loc();
    let message =
        "linalg.svd: The algorithm failed to converge because the input matrix contained non-finite values.".into();
    imp.g.add_node(Op::Assert { message }, vec![finite], Vec::new(), loc);
    Ok(())
}

/// The spellings of the singular value decomposition.
#[derive(Copy, Clone, PartialEq)]
pub(super) enum SvdApi {
    /// `_linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None) -> (U, S, Vh)`.
    Core,
    /// `linalg_svd(A, full_matrices=True, *, driver=None) -> (U, S, Vh)`.
    Linalg,
    /// `svd(self, some=True, compute_uv=True) -> (U, S, V)`.
    Torch,
    /// `linalg_svdvals(A, *, driver=None)`.
    Vals,
}

/// The SVDs of [`SvdApi`] (`driver` chooses a cuSOLVER routine; the CPU
/// ignores it). Singular vectors come with kiln's signs (see
/// `kiln_kernels::linalg`): any sign pair is a valid decomposition, and
/// LAPACK's own depends on its algorithm.
pub(super) fn svd(imp: &mut Importer, n: &Node, api: SvdApi) -> R<()> {
    let a = matrices(imp, n, if api == SvdApi::Torch { "self" } else { "A" })?;
    assert_finite_for_svd(imp, a)?;
    let f = Flags::default();
    if api == SvdApi::Vals {
        return bind_result(imp, n, 0, L::SvdS, f, &[a]);
    }
    let (full, compute_uv) = match api {
        SvdApi::Core => (imp.bool(n, "full_matrices", false)?, imp.bool(n, "compute_uv", true)?),
        SvdApi::Linalg => (imp.bool(n, "full_matrices", true)?, true),
        _ => (!imp.bool(n, "some", true)?, imp.bool(n, "compute_uv", true)?),
    };
    bind_result(imp, n, 1, L::SvdS, f, &[a])?;
    if !compute_uv {
        bind_empty(imp, n, 0)?;
        return bind_empty(imp, n, 2);
    }
    let (u, vh) = if full { (L::SvdUFull, L::SvdVhFull) } else { (L::SvdU, L::SvdVh) };
    bind_result(imp, n, 0, u, f, &[a])?;
    if used(imp, n, 2).is_some() {
        let v = linalg(imp, vh, f, vec![a])?;
        let v = if api == SvdApi::Torch { transpose_last(imp, v)? } else { v };
        imp.bind(n, 2, v)?;
    }
    Ok(())
}

pub(super) fn transpose_last(imp: &mut Importer, v: ValueId) -> R<ValueId> {
    let perm = swap_last(imp.ty(v).rank());
    imp.push(Op::Permute { perm }, vec![v])
}

/// A tolerance argument of `pinv`/`matrix_rank`: a tensor, a Python float, or absent.
enum Tol {
    Tensor(ValueId),
    Float(f64),
    Absent,
}

fn tol_arg(imp: &mut Importer, n: &Node, name: &str) -> R<Tol> {
    Ok(match imp.arg(n, name) {
        None | Some(Arg::None) => Tol::Absent,
        Some(Arg::Tensor(_)) => Tol::Tensor(imp.tensor(n, name)?),
        Some(_) => Tol::Float(imp.float(n, name, None)?),
    })
}

/// torch's `get_atol_rtol` for the matrices `a`: f64 tolerances shaped
/// to compare with `[.., k]` values (a tensor tolerance gets a trailing
/// dim, as torch's `unsqueeze(-1)`). A missing rtol is `ε·max(m, n)` of
/// `a`'s dtype, or 0 where a positive atol is given.
fn atol_rtol(imp: &mut Importer, a: ValueId, atol: Tol, rtol: Tol) -> R<(ValueId, ValueId)> {
    use crate::import::importer::Scalar;
    let ty = imp.ty(a).clone();
    let r = ty.rank();
    let (Some(m), Some(nn)) = (ty.shape[r - 2].as_const(), ty.shape[r - 1].as_const()) else {
        return unsupported("pinv/matrix_rank of matrices with a dynamic size");
    };
    let eps = if ty.dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
    let default = eps * m.max(nn) as f64;
    let f = DType::F64;
    let value = |imp: &mut Importer, t: &Tol| -> R<Option<ValueId>> {
        Ok(match *t {
            Tol::Tensor(v) => {
                let v = imp.cast(v, f);
                let mut shape = imp.ty(v).shape.clone();
                shape.push(Dim::Const(1));
                Some(imp.push(Op::Reshape { shape }, vec![v])?)
            }
            Tol::Float(x) => Some(imp.scalar_const(Scalar::Float(x), f)),
            Tol::Absent => None,
        })
    };
    let atol_v = value(imp, &atol)?;
    let rtol_v = value(imp, &rtol)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), f);
    let rtol_v = match (rtol_v, &atol, atol_v) {
        (Some(v), _, _) => v,
        (None, Tol::Float(x), _) => imp.scalar_const(Scalar::Float(if *x > 0.0 { 0.0 } else { default }), f),
        (None, Tol::Tensor(_), Some(at)) => {
            let positive = imp.push(Op::Binary(BinaryOp::Gt), vec![at, zero])?;
            let d = imp.scalar_const(Scalar::Float(default), f);
            imp.push(Op::Where, vec![positive, zero, d])?
        }
        _ => imp.scalar_const(Scalar::Float(default), f),
    };
    Ok((atol_v.unwrap_or(zero), rtol_v))
}

/// `max(atol, rtol · largest)` with `largest` `[.., 1]` in `a`'s dtype.
pub(super) fn threshold(imp: &mut Importer, atol: ValueId, rtol: ValueId, largest: ValueId) -> R<ValueId> {
    let largest = imp.cast(largest, DType::F64);
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![rtol, largest])?;
    imp.push(Op::Binary(BinaryOp::Max), vec![atol, scaled])
}

/// The largest of the `[.., k]` values `s` along the last dim, kept: `[.., 1]`.
pub(super) fn largest(imp: &mut Importer, s: ValueId) -> R<ValueId> {
    let axis = imp.ty(s).rank() - 1;
    imp.push(Op::Reduce { kind: kiln_ir::ReduceKind::Max, axes: vec![axis], keep_dims: true }, vec![s])
}

/// The tolerances of `pinv`/`matrix_rank` by overload: `atol_rtol_*`
/// name both; `pinv(self, rcond)` is an rtol; `matrix_rank(self, tol)` an
/// atol with rtol 0.
pub(super) fn tolerances(
    imp: &mut Importer,
    n: &Node,
    a: ValueId,
    overload: &str,
    rank: bool,
) -> R<(ValueId, ValueId)> {
    let (atol, rtol) = match overload {
        "atol_rtol_tensor" | "atol_rtol_float" => (tol_arg(imp, n, "atol")?, tol_arg(imp, n, "rtol")?),
        _ if rank => (tol_arg(imp, n, "tol")?, Tol::Float(0.0)),
        // `pinverse(self, rcond=1e-15)`.
        _ if n.target.contains("pinverse") => (Tol::Float(0.0), Tol::Float(imp.float(n, "rcond", Some(1e-15))?)),
        _ => (Tol::Float(0.0), tol_arg(imp, n, "rcond")?),
    };
    atol_rtol(imp, a, atol, rtol)
}

/// A matrix with no elements has a pseudo-inverse and rank with no
/// elements or all zero: both are zeros of the declared type.
pub(super) fn has_no_elements(imp: &Importer, a: ValueId) -> bool {
    imp.ty(a).shape.iter().any(|d| d.as_const() == Some(0))
}

/// `linalg_pinv` (all four overloads) and `pinverse`, as torch computes it: from the
/// reduced SVD, `Vh^T diag(1/s where s > tol) U^T` with `tol = max(atol,
/// rtol·s₀)`; with `hermitian` from the symmetric eigendecomposition,
/// `V diag(1/w where |w| > tol) V^T` (lower triangle). The result does
/// not depend on the vectors' signs.
pub(super) fn pinv(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let a = matrices(imp, n, "self")?;
    if has_no_elements(imp, a) {
        return bind_empty(imp, n, 0);
    }
    let hermitian = imp.bool(n, "hermitian", false)?;
    let (atol, rtol) = tolerances(imp, n, a, overload, false)?;
    let f = Flags::default();
    let (values, left, right) = if hermitian {
        let w = linalg(imp, L::EigvalsH, f, vec![a])?;
        let v = linalg(imp, L::EigvecsH, f, vec![a])?;
        let vt = transpose_last(imp, v)?;
        (w, v, vt)
    } else {
        assert_finite_for_svd(imp, a)?;
        let s = linalg(imp, L::SvdS, f, vec![a])?;
        let u = linalg(imp, L::SvdU, f, vec![a])?;
        let vh = linalg(imp, L::SvdVh, f, vec![a])?;
        let v = transpose_last(imp, vh)?;
        let ut = transpose_last(imp, u)?;
        (s, v, ut)
    };
    let magnitude = imp.push(Op::Unary(kiln_ir::UnaryOp::Abs), vec![values])?;
    let big = largest(imp, magnitude)?;
    let tol = threshold(imp, atol, rtol, big)?;
    let mag64 = imp.cast(magnitude, DType::F64);
    let keep = imp.push(Op::Binary(BinaryOp::Gt), vec![mag64, tol])?;
    let inverse = imp.push(Op::Unary(kiln_ir::UnaryOp::Reciprocal), vec![values])?;
    let dtype = imp.ty(values).dtype;
    let zero = imp.scalar_const(crate::import::importer::Scalar::Float(0.0), dtype);
    let inverse = imp.push(Op::Where, vec![keep, inverse, zero])?;
    // [.., k] -> [.., 1, k]: scales the columns of `left`.
    let mut row = imp.ty(inverse).shape.clone();
    row.insert(row.len() - 1, Dim::Const(1));
    let inverse = imp.push(Op::Reshape { shape: row }, vec![inverse])?;
    let scaled = imp.push(Op::Binary(BinaryOp::Mul), vec![left, inverse])?;
    imp.emit(n, Op::MatMul, vec![scaled, right])?;
    Ok(())
}

/// `linalg_matrix_rank` (all four overloads): the count of singular values
/// (absolute eigenvalues with `hermitian`) above `max(atol, rtol·largest)`, i64.
pub(super) fn matrix_rank(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let a = matrices(imp, n, if matches!(overload, "tol_tensor" | "atol_rtol_tensor") { "input" } else { "self" })?;
    if has_no_elements(imp, a) {
        return bind_empty(imp, n, 0);
    }
    let hermitian = imp.bool(n, "hermitian", false)?;
    let (atol, rtol) = tolerances(imp, n, a, overload, true)?;
    let values = if hermitian {
        let w = linalg(imp, L::EigvalsH, Flags::default(), vec![a])?;
        imp.push(Op::Unary(kiln_ir::UnaryOp::Abs), vec![w])?
    } else {
        assert_finite_for_svd(imp, a)?;
        linalg(imp, L::SvdS, Flags::default(), vec![a])?
    };
    let big = largest(imp, values)?;
    let tol = threshold(imp, atol, rtol, big)?;
    let v64 = imp.cast(values, DType::F64);
    let above = imp.push(Op::Binary(BinaryOp::Gt), vec![v64, tol])?;
    let above = imp.cast(above, DType::I64);
    let axis = imp.ty(above).rank() - 1;
    let count = kiln_ir::ReduceKind::Sum;
    imp.emit(n, Op::Reduce { kind: count, axes: vec![axis], keep_dims: false }, vec![above])?;
    Ok(())
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
    let eye = identity_like(imp, f, &[], size)?;
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

/// A matrix norm's order (`torch.linalg.matrix_norm`).
#[derive(Copy, Clone, PartialEq, Debug)]
enum MatrixOrd {
    Fro,
    Nuc,
    /// ±2: the largest (or smallest) singular value.
    Spectral {
        largest: bool,
    },
    /// ±1: the largest (or smallest) column sum of magnitudes.
    Columns {
        largest: bool,
    },
    /// ±inf: the largest (or smallest) row sum of magnitudes.
    Rows {
        largest: bool,
    },
}

fn matrix_ord(imp: &mut Importer, n: &Node, key: &str, default: Option<MatrixOrd>) -> R<MatrixOrd> {
    match imp.arg(n, key) {
        None => default.map_or_else(|| unsupported(format!("matrix norm without `{key}`")), Ok),
        Some(Arg::Str(s)) => match s.as_str() {
            "fro" => Ok(MatrixOrd::Fro),
            "nuc" => Ok(MatrixOrd::Nuc),
            other => crate::import::importer::invalid(format!("matrix norm order `{other}`")),
        },
        Some(_) => {
            let p = imp.float(n, key, None)?;
            let largest = p > 0.0;
            match p.abs() {
                2.0 => Ok(MatrixOrd::Spectral { largest }),
                1.0 => Ok(MatrixOrd::Columns { largest }),
                x if x == f64::INFINITY => Ok(MatrixOrd::Rows { largest }),
                _ => crate::import::importer::invalid(format!(
                    "matrix norm order {p} (torch takes ±1, ±2, ±inf, fro, nuc)"
                )),
            }
        }
    }
}

/// The `ord` norm of the matrices in dims `d0`, `d1` of `x` (torch's
/// `_refs.linalg.matrix_norm`): Frobenius as a vector 2-norm, ±1/±inf as
/// the max/min of the 1-norms along one dim, ±2 and nuclear from the
/// singular values of the matrices moved to the last two dims.
fn matrix_norm_of(imp: &mut Importer, x: ValueId, ord: MatrixOrd, d0: usize, d1: usize, keep: bool) -> R<ValueId> {
    use super::composite::p_norm;
    use kiln_ir::ReduceKind;
    let extreme = |largest: bool| if largest { ReduceKind::Max } else { ReduceKind::Min };
    match ord {
        MatrixOrd::Fro => p_norm(imp, x, 2.0, vec![d0.min(d1), d0.max(d1)], keep),
        MatrixOrd::Columns { largest } | MatrixOrd::Rows { largest } => {
            let (sum_dim, mut pick_dim) = if matches!(ord, MatrixOrd::Rows { .. }) { (d1, d0) } else { (d0, d1) };
            let sums = p_norm(imp, x, 1.0, vec![sum_dim], keep)?;
            if !keep && sum_dim < pick_dim {
                pick_dim -= 1;
            }
            imp.push(Op::Reduce { kind: extreme(largest), axes: vec![pick_dim], keep_dims: keep }, vec![sums])
        }
        MatrixOrd::Nuc | MatrixOrd::Spectral { .. } => {
            let ty = imp.ty(x).clone();
            if !matches!(ty.dtype, DType::F32 | DType::F64) {
                return unsupported(format!("a 2-norm or nuclear norm of {} (torch takes f32 and f64)", ty.dtype));
            }
            let rank = ty.rank();
            let perm: Vec<usize> = (0..rank).filter(|&d| d != d0 && d != d1).chain([d0, d1]).collect();
            let moved = imp.push(Op::Permute { perm }, vec![x])?;
            assert_finite_for_svd(imp, moved)?;
            let s = linalg(imp, L::SvdS, Flags::default(), vec![moved])?;
            let kind = match ord {
                MatrixOrd::Spectral { largest } => extreme(largest),
                _ => ReduceKind::Sum,
            };
            let v = imp.push(Op::Reduce { kind, axes: vec![rank - 2], keep_dims: false }, vec![s])?;
            if !keep {
                return Ok(v);
            }
            let shape =
                ty.shape.iter().enumerate().map(|(d, s)| if d == d0 || d == d1 { Dim::Const(1) } else { s.clone() });
            imp.push(Op::Reshape { shape: shape.collect() }, vec![v])
        }
    }
}

/// The two matrix dims of `dim` (default the last two), normalised.
fn matrix_dims(imp: &mut Importer, n: &Node, rank: usize, default: [i64; 2]) -> R<(usize, usize)> {
    let dims = imp.ints(n, "dim", &default)?;
    let [a, b] = dims[..] else {
        return crate::import::importer::invalid(format!("a matrix norm over {} dims", dims.len()));
    };
    let (a, b) = (super::shape::normalize_axis(a, rank)?, super::shape::normalize_axis(b, rank)?);
    if a == b {
        return crate::import::importer::invalid("a matrix norm over the same dim twice");
    }
    Ok((a, b))
}

/// `x`, cast to the `dtype` argument when the program gives one.
fn with_dtype(imp: &mut Importer, n: &Node, x: ValueId) -> R<ValueId> {
    if imp.arg(n, "dtype").is_some() {
        let out = imp.out_ty(n, 0)?;
        return Ok(imp.cast(x, out.dtype));
    }
    Ok(x)
}

/// `linalg_matrix_norm(self, Scalar ord, dim=[-2, -1], keepdim=False, *, dtype=None)`
/// and `.str_ord(self, str ord='fro', ...)`.
pub(super) fn matrix_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let x = with_dtype(imp, n, x)?;
    let rank = imp.ty(x).rank();
    let ord = matrix_ord(imp, n, "ord", Some(MatrixOrd::Fro))?;
    let dims = matrix_dims(imp, n, rank, [-2, -1])?;
    bind_matrix_norm(imp, n, x, ord, dims)
}

/// Binds output 0 of `n` to the `ord` norm of `x` over `dims` (the node's
/// `keepdim`), cast to the declared dtype.
fn bind_matrix_norm(imp: &mut Importer, n: &Node, x: ValueId, ord: MatrixOrd, (d0, d1): (usize, usize)) -> R<()> {
    let keep = imp.bool(n, "keepdim", false)?;
    let v = matrix_norm_of(imp, x, ord, d0, d1, keep)?;
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// `linalg_norm(self, ord=None, dim=None, keepdim=False, *, dtype=None)`
/// and `.ord_str`: a matrix norm when an order is given over two dims (or
/// of a 2-d tensor without `dim`), else a vector norm (order 2 by default).
pub(super) fn norm(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let dims = match imp.arg(n, "dim") {
        None => None,
        Some(Arg::Int(d)) => Some(vec![*d]),
        Some(_) => Some(imp.ints(n, "dim", &[])?),
    };
    let ord_given = imp.arg(n, "ord").is_some();
    let matrix = ord_given && dims.as_ref().map_or(rank == 2, |d| d.len() == 2);
    if !matrix {
        return super::composite::vector_norm(imp, n);
    }
    let x = with_dtype(imp, n, x)?;
    let ord = matrix_ord(imp, n, "ord", None)?;
    let dims = if dims.is_some() { matrix_dims(imp, n, rank, [-2, -1])? } else { (0, 1) };
    bind_matrix_norm(imp, n, x, ord, dims)
}

/// `nuclear_norm(self, keepdim=False)` (a 2-d tensor) and `.dim(self, dim, keepdim=False)`.
pub(super) fn nuclear_norm(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let dims = if imp.arg(n, "dim").is_some() { matrix_dims(imp, n, rank, [-2, -1])? } else { (0, 1) };
    bind_matrix_norm(imp, n, x, MatrixOrd::Nuc, dims)
}

/// `linalg_cond(self, p=None)` and `.p_str(self, p)`, as torch computes it:
/// for p = None/±2 the ratio of the extreme singular values; otherwise
/// `norm(A) · norm(A⁻¹)` with a singular matrix's inverse taken as +inf
/// everywhere and NaN (0 · inf) read as +inf.
pub(super) fn cond(imp: &mut Importer, n: &Node) -> R<()> {
    use crate::import::importer::Scalar;
    use kiln_ir::ReduceKind;
    let a = matrices(imp, n, "self")?;
    let rank = imp.ty(a).rank();
    if has_no_elements(imp, a) {
        return bind_empty(imp, n, 0);
    }
    let ord = matrix_ord(imp, n, "p", Some(MatrixOrd::Spectral { largest: true }))?;
    let v = if let MatrixOrd::Spectral { largest } = ord {
        assert_finite_for_svd(imp, a)?;
        let s = linalg(imp, L::SvdS, Flags::default(), vec![a])?;
        let axis = vec![rank - 2];
        let hi = imp.push(Op::Reduce { kind: ReduceKind::Max, axes: axis.clone(), keep_dims: false }, vec![s])?;
        let lo = imp.push(Op::Reduce { kind: ReduceKind::Min, axes: axis, keep_dims: false }, vec![s])?;
        let (num, den) = if largest { (hi, lo) } else { (lo, hi) };
        imp.push(Op::Binary(BinaryOp::Div), vec![num, den])?
    } else {
        let inverse = linalg(imp, L::Inv, Flags::default(), vec![a])?;
        let info = linalg(imp, L::LuInfo, Flags::default(), vec![a])?;
        let dtype = imp.ty(a).dtype;
        let zero = imp.scalar_const(Scalar::Int(0), DType::I32);
        let singular = imp.push(Op::Binary(BinaryOp::Gt), vec![info, zero])?;
        let mut shape = imp.ty(singular).shape.clone();
        shape.extend([Dim::Const(1), Dim::Const(1)]);
        let singular = imp.push(Op::Reshape { shape }, vec![singular])?;
        let inf = imp.scalar_const(Scalar::Float(f64::INFINITY), dtype);
        let inverse = imp.push(Op::Where, vec![singular, inf, inverse])?;
        let (d0, d1) = (rank - 2, rank - 1);
        let norm_a = matrix_norm_of(imp, a, ord, d0, d1, false)?;
        let norm_inv = matrix_norm_of(imp, inverse, ord, d0, d1, false)?;
        let product = imp.push(Op::Binary(BinaryOp::Mul), vec![norm_a, norm_inv])?;
        // nan_to_num(nan=inf, posinf=inf, neginf=-inf).
        let nan = imp.push(Op::Binary(BinaryOp::Ne), vec![product, product])?;
        imp.push(Op::Where, vec![nan, inf, product])?
    };
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}

/// The `n × n` identity in `dtype`, broadcast to `batch ++ [n, n]`.
pub(super) fn identity_like(imp: &mut Importer, dtype: DType, batch: &[Dim], size: i64) -> R<ValueId> {
    let eye = eye_matrix(imp, dtype, size, size)?;
    if batch.is_empty() {
        return Ok(eye);
    }
    let shape: Vec<Dim> = batch.iter().cloned().chain([Dim::Const(size), Dim::Const(size)]).collect();
    imp.push(Op::Expand { shape }, vec![eye])
}

/// The `rows × cols` matrix with ones where row equals column, in `dtype`.
pub(super) fn eye_matrix(imp: &mut Importer, dtype: DType, rows: i64, cols: i64) -> R<ValueId> {
    let r = arange_column(imp, rows, true)?;
    let c = arange_column(imp, cols, false)?;
    let eye = imp.push(Op::Binary(BinaryOp::Eq), vec![r, c])?;
    Ok(imp.cast(eye, dtype))
}

/// The static size of square matrices `a`.
pub(super) fn square_size(imp: &Importer, a: ValueId, api: &str) -> R<i64> {
    match matrix_dims_of(imp, a, api)? {
        (m, n) if m == n => Ok(m),
        (m, n) => crate::import::importer::invalid(format!("{api} of {m}x{n} matrices (square ones only)")),
    }
}

/// `linalg_matrix_power(self, n)`: the identity for 0, the inverse's power
/// for negative n (a singular matrix fails the run, as torch raises), and
/// torch's binary decomposition of `n` (from the least significant bit).
pub(super) fn matrix_power(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "self")?;
    let k = imp.int(n, "n", None)?;
    let size = square_size(imp, a, "matrix_power")?;
    let ty = imp.ty(a).clone();
    if k == 0 {
        let eye = identity_like(imp, ty.dtype, &ty.shape[..ty.rank() - 2], size)?;
        return imp.bind(n, 0, eye);
    }
    let base = if k < 0 {
        let inverse = linalg(imp, L::Inv, Flags::default(), vec![a])?;
        info_result(imp, n, None, true, L::LuInfo, a, || singular("linalg.matrix_power"))?;
        inverse
    } else {
        a
    };
    let mm = |imp: &mut Importer, x: ValueId, y: ValueId| imp.push(Op::MatMul, vec![x, y]);
    let v = match k.unsigned_abs() {
        1 => base,
        2 => mm(imp, base, base)?,
        3 => {
            let sq = mm(imp, base, base)?;
            mm(imp, sq, base)?
        }
        mut rest => {
            let (mut z, mut result): (Option<ValueId>, Option<ValueId>) = (None, None);
            while rest > 0 {
                let bit = rest % 2;
                rest /= 2;
                let zz = match z {
                    Some(z) => mm(imp, z, z)?,
                    None => base,
                };
                z = Some(zz);
                if bit == 1 {
                    result = Some(match result {
                        Some(r) => mm(imp, r, zz)?,
                        None => zz,
                    });
                }
            }
            result.expect("a positive power has a set bit")
        }
    };
    imp.bind(n, 0, v)
}

/// `triangular_solve(self=B, A, upper=True, transpose=False,
/// unitriangular=False) -> (solution, cloned_coefficient)`: `op(A) X = B`
/// with `op` the transpose when asked; the coefficient output is `A`.
pub(super) fn triangular_solve_legacy(imp: &mut Importer, n: &Node) -> R<()> {
    let b = imp.tensor(n, "self")?;
    let a = matrices(imp, n, "A")?;
    let mut upper = imp.bool(n, "upper", true)?;
    let unit = imp.bool(n, "unitriangular", false)?;
    let (a, b) = broadcast_batches(imp, a, b)?;
    let coefficient = a;
    let a = if imp.bool(n, "transpose", false)? {
        upper = !upper;
        transpose_last(imp, a)?
    } else {
        a
    };
    let x = imp.push(Op::Linalg { op: L::TriangularSolve, upper, left: true, unit, complex: false }, vec![a, b])?;
    imp.bind(n, 0, x)?;
    if used(imp, n, 1).is_some() {
        imp.bind(n, 1, coefficient)?;
    }
    Ok(())
}

/// `cholesky_inverse(self=L, upper=False)`: `(L Lᵀ)⁻¹` (or `(Uᵀ U)⁻¹`) as a
/// Cholesky solve against the identity.
pub(super) fn cholesky_inverse(imp: &mut Importer, n: &Node) -> R<()> {
    let l = matrices(imp, n, "self")?;
    let size = square_size(imp, l, "cholesky_inverse")?;
    let ty = imp.ty(l).clone();
    let eye = identity_like(imp, ty.dtype, &ty.shape[..ty.rank() - 2], size)?;
    let upper = imp.bool(n, "upper", false)?;
    imp.emit(n, Op::Linalg { op: L::CholeskySolve, upper, left: true, unit: false, complex: false }, vec![l, eye])?;
    Ok(())
}

/// `linalg_tensorinv(self, ind=2)`: the inverse of the matrix `[∏ shape[..ind],
/// ∏ shape[ind..]]`, shaped `shape[ind..] ++ shape[..ind]`; a singular one
/// fails the run, as torch raises.
pub(super) fn tensorinv(imp: &mut Importer, n: &Node) -> R<()> {
    let a = imp.tensor(n, "self")?;
    let ind = imp.int(n, "ind", Some(2))?;
    let ty = imp.ty(a).clone();
    let Some(shape) = ty.static_shape() else {
        return unsupported("tensorinv of a tensor with a dynamic size");
    };
    if ind <= 0 || ind as usize > shape.len() {
        return crate::import::importer::invalid(format!("tensorinv with ind={ind} of a {}-d tensor", shape.len()));
    }
    let (rows, cols): (i64, i64) = (shape[..ind as usize].iter().product(), shape[ind as usize..].iter().product());
    if rows != cols {
        return crate::import::importer::invalid(format!("tensorinv of a {rows}x{cols} matrix"));
    }
    let m = imp.push(Op::Reshape { shape: vec![Dim::Const(rows), Dim::Const(cols)] }, vec![a])?;
    let m = linalg_operand(imp, m)?;
    let inverse = linalg(imp, L::Inv, Flags::default(), vec![m])?;
    info_result(imp, n, None, true, L::LuInfo, m, || singular("linalg.tensorinv"))?;
    let out = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![inverse], out);
    imp.bind(n, 0, v)
}

/// `linalg_tensorsolve(self=A, other=B, dims=None)`: `A`'s `dims` moved to
/// the end, `A` as a `[∏ B.shape, ∏ rest]` matrix solved against `B`
/// flattened, shaped as the program declares.
pub(super) fn tensorsolve(imp: &mut Importer, n: &Node) -> R<()> {
    let a = imp.tensor(n, "self")?;
    let b = imp.tensor(n, "other")?;
    let rank = imp.ty(a).rank();
    let a = match imp.arg(n, "dims") {
        None => a,
        Some(_) => {
            let dims = imp.ints(n, "dims", &[])?;
            let moved: Vec<usize> =
                dims.iter().map(|&d| super::shape::normalize_axis(d, rank)).collect::<R<Vec<_>>>()?;
            let perm: Vec<usize> = (0..rank).filter(|d| !moved.contains(d)).chain(moved.iter().copied()).collect();
            imp.push(Op::Permute { perm }, vec![a])?
        }
    };
    let (Some(bn), Some(an)) = (imp.ty(b).numel().as_const(), imp.ty(a).numel().as_const()) else {
        return unsupported("tensorsolve of tensors with a dynamic size");
    };
    if bn == 0 || an % bn != 0 || an / bn != bn {
        return crate::import::importer::invalid(format!("tensorsolve: {an} coefficients for {bn} right-hand values"));
    }
    let m = imp.push(Op::Reshape { shape: vec![Dim::Const(bn), Dim::Const(bn)] }, vec![a])?;
    let m = linalg_operand(imp, m)?;
    let rhs = imp.push(Op::Reshape { shape: vec![Dim::Const(bn), Dim::Const(1)] }, vec![b])?;
    let x = linalg(imp, L::Solve, Flags { left: true, ..Flags::default() }, vec![m, rhs])?;
    info_result(imp, n, None, true, L::LuInfo, m, || singular("linalg.tensorsolve"))?;
    let out = imp.out_ty(n, 0)?;
    let v = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![x], out);
    imp.bind(n, 0, v)
}

/// `x` with the entries where `keep(row, col)` fails set to zero (`rows ×
/// cols` the last two dims).
fn masked_triangle(imp: &mut Importer, x: ValueId, rows: i64, cols: i64, strict_lower: bool) -> R<ValueId> {
    let r = arange_column(imp, rows, true)?;
    let c = arange_column(imp, cols, false)?;
    let keep = imp.push(Op::Binary(if strict_lower { BinaryOp::Gt } else { BinaryOp::Le }), vec![r, c])?;
    let dtype = imp.ty(x).dtype;
    let zero = imp.scalar_const(crate::import::importer::Scalar::Float(0.0), dtype);
    imp.push(Op::Where, vec![keep, x, zero])
}

/// `arange(len)` as an i64 column `[len, 1]` (or row `[1, len]`).
fn arange_column(imp: &mut Importer, len: i64, column: bool) -> R<ValueId> {
    let ty = TensorType::new(DType::I64, vec![Dim::Const(len)]);
    let p = imp.push_typed(Op::Arange { start: 0.0, step: 1.0, len: Dim::Const(len), dtype: DType::I64 }, vec![], ty);
    let shape = if column { vec![Dim::Const(len), Dim::Const(1)] } else { vec![Dim::Const(1), Dim::Const(len)] };
    imp.push(Op::Reshape { shape }, vec![p])
}

/// The static `(m, n)` of matrices `a`.
fn matrix_dims_of(imp: &Importer, a: ValueId, api: &str) -> R<(i64, i64)> {
    let ty = imp.ty(a);
    let r = ty.rank();
    match (ty.shape[r - 2].as_const(), ty.shape[r - 1].as_const()) {
        (Some(m), Some(n)) => Ok((m, n)),
        _ => unsupported(format!("{api} of matrices with a dynamic size")),
    }
}

/// The unit lower `L` (`[.., m, k]`) and upper `U` (`[.., k, n]`) packed in
/// LAPACK's `LU` (`[.., m, n]`, `k = min(m, n)`).
fn unpack_lu(imp: &mut Importer, lu: ValueId) -> R<(ValueId, ValueId)> {
    unpack_lu_part(imp, lu, true)
}

/// [`unpack_lu`] of one part of a complex `LU`: the imaginary part's `L`
/// has no unit diagonal (`unit` false).
pub(super) fn unpack_lu_part(imp: &mut Importer, lu: ValueId, unit: bool) -> R<(ValueId, ValueId)> {
    let (m, n) = matrix_dims_of(imp, lu, "lu_unpack")?;
    let k = m.min(n);
    let rank = imp.ty(lu).rank();
    let left = imp.push(Op::Slice { axis: rank - 1, start: 0, end: k, step: 1 }, vec![lu])?;
    let below = masked_triangle(imp, left, m, k, true)?;
    let l = if unit {
        let dtype = imp.ty(lu).dtype;
        let ones = eye_matrix(imp, dtype, m, k)?;
        imp.push(Op::Binary(BinaryOp::Add), vec![below, ones])?
    } else {
        below
    };
    let top = imp.push(Op::Slice { axis: rank - 2, start: 0, end: k, step: 1 }, vec![lu])?;
    let u = masked_triangle(imp, top, k, n, false)?;
    Ok((l, u))
}

/// `linalg_lu(A, *, pivot=True) -> (P, L, U)` with `A = P L U` (LAPACK's
/// partial pivoting).
pub(super) fn lu(imp: &mut Importer, n: &Node) -> R<()> {
    if !imp.bool(n, "pivot", true)? {
        return unsupported("lu without pivoting");
    }
    let a = matrices(imp, n, "A")?;
    let packed = linalg(imp, L::LuFactor, Flags::default(), vec![a])?;
    if used(imp, n, 0).is_some() {
        let pivots = linalg(imp, L::LuPivots, Flags::default(), vec![a])?;
        let p = linalg(imp, L::PivotsToPermutation, Flags::default(), vec![packed, pivots])?;
        imp.bind(n, 0, p)?;
    }
    let (l, u) = unpack_lu(imp, packed)?;
    imp.bind(n, 1, l)?;
    imp.bind(n, 2, u)
}

/// `lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True) -> (P, L, U)`;
/// what is not unpacked is empty, as torch returns it.
pub(super) fn lu_unpack(imp: &mut Importer, n: &Node) -> R<()> {
    let packed = matrices(imp, n, "LU_data")?;
    let pivots = imp.tensor(n, "LU_pivots")?;
    if imp.bool(n, "unpack_pivots", true)? {
        if used(imp, n, 0).is_some() {
            let p = linalg(imp, L::PivotsToPermutation, Flags::default(), vec![packed, pivots])?;
            imp.bind(n, 0, p)?;
        }
    } else {
        bind_empty(imp, n, 0)?;
    }
    if !imp.bool(n, "unpack_data", true)? {
        bind_empty(imp, n, 1)?;
        return bind_empty(imp, n, 2);
    }
    let (l, u) = unpack_lu(imp, packed)?;
    imp.bind(n, 1, l)?;
    imp.bind(n, 2, u)
}

/// `linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False)` and
/// `lu_solve(self=B, LU_data, LU_pivots)`: with `A = P L U`, `A X = B` is
/// `X = U⁻¹ L⁻¹ Pᵀ B` and `Aᵀ X = B` is `X = P L⁻ᵀ U⁻ᵀ B` (triangular solves
/// reading one triangle of `LU` each); a right solve is the transposed
/// left one.
pub(super) fn lu_solve(imp: &mut Importer, n: &Node, legacy: bool) -> R<()> {
    let (packed, pivots, b) = if legacy {
        (matrices(imp, n, "LU_data")?, imp.tensor(n, "LU_pivots")?, imp.tensor(n, "self")?)
    } else {
        (matrices(imp, n, "LU")?, imp.tensor(n, "pivots")?, imp.tensor(n, "B")?)
    };
    let left = legacy || imp.bool(n, "left", true)?;
    let adjoint = !legacy && imp.bool(n, "adjoint", false)?;
    let p = linalg(imp, L::PivotsToPermutation, Flags::default(), vec![packed, pivots])?;
    // X A = B ⇔ Aᵀ Xᵀ = Bᵀ: a left solve with the adjoint flipped.
    let (b, adjoint) = if left { (b, adjoint) } else { (transpose_last(imp, b)?, !adjoint) };
    let (packed_b, b) = broadcast_batches(imp, packed, b)?;
    let (p, b) = broadcast_batches(imp, p, b)?;
    let tri = |imp: &mut Importer, m: ValueId, rhs: ValueId, upper: bool, unit: bool| {
        imp.push(Op::Linalg { op: L::TriangularSolve, upper, left: true, unit, complex: false }, vec![m, rhs])
    };
    let x = if adjoint {
        let t = transpose_last(imp, packed_b)?;
        let z = tri(imp, t, b, false, false)?;
        let w = tri(imp, t, z, true, true)?;
        imp.push(Op::MatMul, vec![p, w])?
    } else {
        let pt = transpose_last(imp, p)?;
        let y = imp.push(Op::MatMul, vec![pt, b])?;
        let z = tri(imp, packed_b, y, false, true)?;
        tri(imp, packed_b, z, true, false)?
    };
    let x = if left { x } else { transpose_last(imp, x)? };
    let out = imp.out_ty(n, 0)?;
    let x = imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![x], out);
    imp.bind(n, 0, x)
}

/// `_lu_with_info(self, pivot=True, check_errors=True) -> (LU, pivots, info)`:
/// `linalg_lu_factor_ex` under its old name (and default).
pub(super) fn lu_with_info(imp: &mut Importer, n: &Node) -> R<()> {
    let mut m = n.clone();
    for a in &mut m.inputs {
        if a.name == "self" {
            a.name = "A".into();
        }
    }
    if imp.arg(n, "check_errors").is_none() {
        m.inputs.push(crate::pt2::program::NamedArg { name: "check_errors".into(), arg: Arg::Bool(true) });
    }
    lu_factor(imp, &m, true)
}

/// `geqrf(self) -> (a, tau)`: LAPACK's packed Householder QR.
pub(super) fn geqrf(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "self")?;
    bind_result(imp, n, 0, L::Geqrf, Flags::default(), &[a])?;
    bind_result(imp, n, 1, L::GeqrfTau, Flags::default(), &[a])
}

/// `linalg_householder_product(input, tau)` and `orgqr(self, input2)`:
/// the first `n` columns of the product of the reflectors.
pub(super) fn householder_product(imp: &mut Importer, n: &Node) -> R<()> {
    let legacy = imp.arg(n, "input2").is_some();
    let a = matrices(imp, n, if legacy { "self" } else { "input" })?;
    let tau = imp.tensor(n, if legacy { "input2" } else { "tau" })?;
    let tau = imp.cast(tau, imp.ty(a).dtype);
    imp.emit(
        n,
        Op::Linalg { op: L::HouseholderProduct, upper: false, left: false, unit: false, complex: false },
        vec![a, tau],
    )?;
    Ok(())
}

/// `ormqr(self, input2=tau, input3=C, left=True, transpose=False)`: `C`
/// multiplied by the full `m × m` Q of `geqrf`'s reflectors (or its
/// transpose), from the left or the right. Q is the product of the
/// reflectors with the columns past `n` (and `tau` past `k`) zero, whose
/// reflectors are the identity.
pub(super) fn ormqr(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrices(imp, n, "self")?;
    let tau = imp.tensor(n, "input2")?;
    let c = imp.tensor(n, "input3")?;
    let dtype = imp.ty(a).dtype;
    let (tau, c) = (imp.cast(tau, dtype), imp.cast(c, dtype));
    let (m, cols) = matrix_dims_of(imp, a, "ormqr")?;
    let rank = imp.ty(a).rank();
    let k = imp.ty(tau).shape.last().and_then(Dim::as_const).unwrap_or(0);
    let pad = |imp: &mut Importer, v: ValueId, axis_rank: usize, grow: i64| -> R<ValueId> {
        if grow <= 0 {
            return Ok(v);
        }
        let r = imp.ty(v).rank();
        let mut hi = vec![0; r];
        hi[axis_rank] = grow;
        imp.push(
            Op::Pad { lo: vec![0; r], hi, interior: vec![0; r], mode: kiln_ir::PadMode::Constant, value: 0.0 },
            vec![v],
        )
    };
    if cols > m || k > cols {
        return crate::import::importer::invalid(format!("ormqr of a {m}x{cols} input with {k} reflectors"));
    }
    let square = pad(imp, a, rank - 1, m - cols)?;
    let tau_rank = imp.ty(tau).rank();
    let tau = pad(imp, tau, tau_rank - 1, m - k)?;
    let q = imp.push(
        Op::Linalg { op: L::HouseholderProduct, upper: false, left: false, unit: false, complex: false },
        vec![square, tau],
    )?;
    let q = if imp.bool(n, "transpose", false)? { transpose_last(imp, q)? } else { q };
    let v =
        if imp.bool(n, "left", true)? { imp.push(Op::MatMul, vec![q, c])? } else { imp.push(Op::MatMul, vec![c, q])? };
    imp.bind(n, 0, v)
}
