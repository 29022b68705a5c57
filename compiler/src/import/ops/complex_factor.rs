//! Complex factorizations on `kiln_kernels::linalg`'s complex path:
//! determinants (`det`, `slogdet`, `logdet`), LU (`lu_factor`, `lu`,
//! `lu_unpack`, `lu_solve`, `tensorinv`, `tensorsolve`), Cholesky
//! (`cholesky`, `cholesky_solve`, `cholesky_inverse`), triangular solves,
//! Householder QR (`qr`, `geqrf`, `householder_product`/`orgqr`, `ormqr`),
//! the complex symmetric LDLᵀ (`ldl_factor`, `ldl_solve`; `zsytrf`/`zsytrs`),
//! and `eigh`'s eigenvectors and the SVD's singular vectors (complex Jacobi;
//! kiln's phases). Each operand's parts are interleaved into a trailing
//! (re, im) dim for one `Op::Linalg { complex: true }` per result used, and
//! complex results split back into parts; the kernel follows LAPACK's
//! complex conventions (`zgetrf`'s `|re| + |im|` pivots, `zpotrf` on `A = L
//! Lᴴ`, a unit complex `slogdet` sign, `zgeqrf`'s complex `tau` and real
//! diagonal of R). The permutation of an LU is real, applied per part.

use crate::import::importer::{invalid, output_names, unsupported, Importer, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp as B, DType, Dim, LinalgOp as L, Op, UnaryOp as U, ValueId};

use super::fft::{imag_or_zero, operand};
use super::linalg as real;

/// Converts `n` if it is one of the ops here; `None` when it is not.
pub(super) fn convert(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> Option<R<()>> {
    Some(match name {
        "linalg_det" | "_linalg_det" => det(imp, n),
        "linalg_slogdet" | "_linalg_slogdet" => slogdet(imp, n),
        "logdet" => logdet(imp, n),
        "linalg_lu_factor" => lu_factor(imp, n, "A", Some(false)),
        "linalg_lu_factor_ex" => lu_factor(imp, n, "A", Some(true)),
        // `_lu_with_info(self, pivot=True, check_errors=True)`.
        "_lu_with_info" => lu_factor(imp, n, "self", None),
        "linalg_lu" => lu(imp, n),
        "lu_unpack" => lu_unpack(imp, n),
        "linalg_lu_solve" => lu_solve(imp, n, false),
        "lu_solve" => lu_solve(imp, n, true),
        "linalg_cholesky" => cholesky(imp, n, false),
        "linalg_cholesky_ex" => cholesky(imp, n, true),
        "cholesky_solve" => cholesky_solve(imp, n),
        "cholesky_inverse" => cholesky_inverse(imp, n),
        "linalg_solve_triangular" => solve_triangular(imp, n),
        "triangular_solve" => triangular_solve(imp, n),
        "linalg_qr" => qr(imp, n),
        "geqrf" => geqrf(imp, n),
        "linalg_householder_product" | "orgqr" => householder_product(imp, n),
        "ormqr" => ormqr(imp, n),
        "linalg_ldl_factor" => ldl_factor(imp, n, false),
        "linalg_ldl_factor_ex" => ldl_factor(imp, n, true),
        "linalg_ldl_solve" => ldl_solve(imp, n),
        // Eigenvalues alone stay on the real embedding (complex_linalg.rs).
        "_linalg_eigh" | "linalg_eigh" if eigenvectors_wanted(imp, n) => eigh(imp, n),
        "_linalg_svd" => svd(imp, n, real::SvdApi::Core),
        "linalg_svd" => svd(imp, n, real::SvdApi::Linalg),
        "svd" => svd(imp, n, real::SvdApi::Torch),
        "linalg_tensorinv" => tensorinv(imp, n),
        "linalg_tensorsolve" => tensorsolve(imp, n),
        // The general pinv stays on the real embedding (complex_linalg.rs).
        "linalg_pinv" if imp.bool(n, "hermitian", false).unwrap_or(false) => hermitian_pinv(imp, n, overload),
        _ => return None,
    })
}

/// A complex value as its two real parts (both present).
#[derive(Copy, Clone)]
struct Z {
    re: ValueId,
    im: ValueId,
}

#[derive(Copy, Clone, Default)]
struct Flags {
    upper: bool,
    left: bool,
    unit: bool,
}

/// The complex (or real, seen as complex) matrices of argument `arg`, in
/// `dtype`.
fn parts(imp: &mut Importer, n: &Node, arg: &str, dtype: DType) -> R<Z> {
    let name = imp.tensor_name(n, arg)?;
    let z = operand(imp, name)?;
    let im = imag_or_zero(imp, z)?;
    let z = Z { re: imp.cast(z.re, dtype), im: imp.cast(im, dtype) };
    if imp.ty(z.re).rank() < 2 {
        return unsupported(format!("linalg on a {}-d tensor", imp.ty(z.re).rank()));
    }
    Ok(z)
}

/// The part dtype the kernel works in: f64 when any of the tensor arguments
/// `args` is (complex128 or f64), else f32.
fn work_dtype(imp: &mut Importer, n: &Node, args: &[&str]) -> R<DType> {
    let mut dtype = DType::F32;
    for a in args {
        let name = imp.tensor_name(n, a)?;
        let z = operand(imp, name)?;
        match imp.ty(z.re).dtype {
            DType::F64 => dtype = DType::F64,
            DType::F32 => {}
            other => return unsupported(format!("linalg on {other} (kiln's linalg kernels take f32 and f64 parts)")),
        }
    }
    Ok(dtype)
}

/// `[.., 2]`: the parts interleaved, as the complex kernel reads them.
fn pack(imp: &mut Importer, z: Z) -> R<ValueId> {
    let mut shape = imp.ty(z.re).shape.clone();
    let axis = shape.len();
    shape.push(Dim::Const(1));
    let re = imp.push(Op::Reshape { shape: shape.clone() }, vec![z.re])?;
    let im = imp.push(Op::Reshape { shape }, vec![z.im])?;
    imp.push(Op::Concat { axis }, vec![re, im])
}

/// The parts of an interleaved `[.., 2]` result.
fn unpack(imp: &mut Importer, v: ValueId) -> R<Z> {
    let ty = imp.ty(v).clone();
    let axis = ty.rank() - 1;
    let shape = ty.shape[..axis].to_vec();
    let mut part = |start: i64| -> R<ValueId> {
        let s = imp.push(Op::Slice { axis, start, end: start + 1, step: 1 }, vec![v])?;
        imp.push(Op::Reshape { shape: shape.clone() }, vec![s])
    };
    Ok(Z { re: part(0)?, im: part(1)? })
}

/// One complex linalg instruction on interleaved (or, for pivots, integer)
/// operands.
fn kernel(imp: &mut Importer, op: L, f: Flags, inputs: Vec<ValueId>) -> R<ValueId> {
    imp.push(Op::Linalg { op, upper: f.upper, left: f.left, unit: f.unit, complex: true }, inputs)
}

/// A complex result of `op` on `z`.
fn complex_result(imp: &mut Importer, op: L, f: Flags, ins: &[Z]) -> R<Z> {
    let packed = ins.iter().map(|&z| pack(imp, z)).collect::<R<Vec<_>>>()?;
    let v = kernel(imp, op, f, packed)?;
    unpack(imp, v)
}

/// A real result (`log_abs_det`, pivots, infos) of `op` on `z`.
fn real_result(imp: &mut Importer, op: L, z: Z) -> R<ValueId> {
    let packed = pack(imp, z)?;
    kernel(imp, op, Flags::default(), vec![packed])
}

fn out_name(n: &Node, i: usize) -> Option<String> {
    n.outputs.iter().flat_map(output_names).nth(i)
}

/// Whether the program reads output `i`.
fn wanted(imp: &Importer, n: &Node, i: usize) -> bool {
    out_name(n, i).is_some_and(|o| imp.is_used(&o))
}

/// Binds complex output `i` to `z` (cast to its part dtype).
fn bind_complex(imp: &mut Importer, n: &Node, i: usize, z: Z) -> R<()> {
    let Some(o) = out_name(n, i) else { return invalid(format!("output {i} is missing")) };
    if !imp.is_complex_meta(&o) {
        return invalid(format!("output {i} of a complex factorization is not complex"));
    }
    let ty = imp.part_type(&o)?;
    let mut ps = [imp.cast(z.re, ty.dtype), imp.cast(z.im, ty.dtype)];
    for p in &mut ps {
        if imp.ty(*p).shape != ty.shape {
            *p = imp.push_typed(Op::Reshape { shape: ty.shape.clone() }, vec![*p], ty.clone());
        }
    }
    imp.bind_complex(&o, ps[0], ps[1]);
    Ok(())
}

/// Binds real output `i` (info, pivots, `logabsdet`) to `v`, cast to its dtype.
fn bind_real(imp: &mut Importer, n: &Node, i: usize, v: ValueId) -> R<()> {
    let Some(o) = out_name(n, i) else { return invalid(format!("output {i} is missing")) };
    let ty = imp.type_of(&o)?;
    let v = imp.cast(v, ty.dtype);
    imp.bind_name(&o, v);
    Ok(())
}

/// Binds complex output `i`, when read, to zeros of its type (what torch
/// returns for results it was asked not to compute).
fn bind_zeros(imp: &mut Importer, n: &Node, i: usize) -> R<()> {
    if !wanted(imp, n, i) {
        return Ok(());
    }
    let Some(o) = out_name(n, i) else { return invalid(format!("output {i} is missing")) };
    let ty = imp.part_type(&o)?;
    let zeros = |imp: &mut Importer| {
        imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty.clone())
    };
    let (re, im) = (zeros(imp), zeros(imp));
    imp.bind_complex(&o, re, im);
    Ok(())
}

/// The matrix operand `arg` alone, in its own part dtype.
fn matrix(imp: &mut Importer, n: &Node, arg: &str) -> R<Z> {
    let dtype = work_dtype(imp, n, &[arg])?;
    parts(imp, n, arg, dtype)
}

/// `linalg_det(A)` and `_linalg_det(A) -> (result, LU, pivots)`.
fn det(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrix(imp, n, "A")?;
    let d = complex_result(imp, L::Det, Flags::default(), &[a])?;
    bind_complex(imp, n, 0, d)?;
    lu_outputs(imp, n, a, 1)
}

/// The packed LU (output `at`) and pivots (`at + 1`) when read.
fn lu_outputs(imp: &mut Importer, n: &Node, a: Z, at: usize) -> R<()> {
    if wanted(imp, n, at) {
        let lu = complex_result(imp, L::LuFactor, Flags::default(), &[a])?;
        bind_complex(imp, n, at, lu)?;
    }
    if wanted(imp, n, at + 1) {
        let p = real_result(imp, L::LuPivots, a)?;
        bind_real(imp, n, at + 1, p)?;
    }
    Ok(())
}

/// `linalg_slogdet(A) -> (sign, logabsdet)` and `_linalg_slogdet(A) ->
/// (sign, logabsdet, LU, pivots)`: the sign a unit complex number.
fn slogdet(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrix(imp, n, "A")?;
    if wanted(imp, n, 0) {
        let s = complex_result(imp, L::SignDet, Flags::default(), &[a])?;
        bind_complex(imp, n, 0, s)?;
    }
    if wanted(imp, n, 1) {
        let l = real_result(imp, L::LogAbsDet, a)?;
        bind_real(imp, n, 1, l)?;
    }
    lu_outputs(imp, n, a, 2)
}

/// `logdet(self)` of a complex matrix: torch's `log(sign) + logabsdet`,
/// i.e. `logabsdet + ln|sign|` and `arg(sign)` (−inf for a singular one).
fn logdet(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrix(imp, n, "self")?;
    let s = complex_result(imp, L::SignDet, Flags::default(), &[a])?;
    let log_abs = real_result(imp, L::LogAbsDet, a)?;
    let rr = imp.push(Op::Binary(B::Mul), vec![s.re, s.re])?;
    let ii = imp.push(Op::Binary(B::Mul), vec![s.im, s.im])?;
    let sq = imp.push(Op::Binary(B::Add), vec![rr, ii])?;
    let ln = imp.push(Op::Unary(U::Log), vec![sq])?;
    let half = imp.with_scalar(B::Mul, ln, 0.5)?;
    let re = imp.push(Op::Binary(B::Add), vec![log_abs, half])?;
    let im = imp.push(Op::Binary(B::Atan2), vec![s.im, s.re])?;
    bind_complex(imp, n, 0, Z { re, im })
}

/// `linalg_lu_factor(A, *, pivot=True) -> (LU, pivots)`,
/// `linalg_lu_factor_ex(.., check_errors=False) -> (LU, pivots, info)` and
/// `_lu_with_info(self, pivot=True, check_errors=True)` (`ex: None`).
fn lu_factor(imp: &mut Importer, n: &Node, arg: &str, ex: Option<bool>) -> R<()> {
    if !imp.bool(n, "pivot", true)? {
        return unsupported("lu_factor without pivoting");
    }
    let a = matrix(imp, n, arg)?;
    lu_outputs(imp, n, a, 0)?;
    let (ex, check) = match ex {
        Some(ex) => (ex, ex && imp.bool(n, "check_errors", false)?),
        None => (true, imp.bool(n, "check_errors", true)?),
    };
    info(imp, n, a, L::LuInfo, ex.then_some(2), check, || real::singular("linalg.lu_factor"))
}

/// A factorization's info: bound to output `at` when read, and checked to
/// be zero at run time with `check`.
fn info(
    imp: &mut Importer,
    n: &Node,
    a: Z,
    op: L,
    at: Option<usize>,
    check: bool,
    message: impl FnOnce() -> String,
) -> R<()> {
    let bind = at.filter(|&i| wanted(imp, n, i));
    if bind.is_none() && !check {
        return Ok(());
    }
    let v = real_result(imp, op, a)?;
    if let Some(i) = bind {
        bind_real(imp, n, i, v)?;
    }
    if check {
        real::assert_zero(imp, v, message())?;
    }
    Ok(())
}

/// The real permutation `P` (`A = P L U`) of pivots `pivots` for the
/// `[.., m, n]` LU whose real part is `lu_re`.
fn permutation(imp: &mut Importer, lu_re: ValueId, pivots: ValueId) -> R<ValueId> {
    let op = Op::Linalg { op: L::PivotsToPermutation, upper: false, left: false, unit: false, complex: false };
    imp.push(op, vec![lu_re, pivots])
}

/// `P` (real) as complex output `i`.
fn bind_permutation(imp: &mut Importer, n: &Node, i: usize, p: ValueId) -> R<()> {
    let ty = imp.ty(p).clone();
    let im = imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty);
    bind_complex(imp, n, i, Z { re: p, im })
}

/// The unit lower `L` and upper `U` of a packed complex LU.
fn unpack_lu(imp: &mut Importer, lu: Z) -> R<(Z, Z)> {
    let (lr, ur) = real::unpack_lu_part(imp, lu.re, true)?;
    let (li, ui) = real::unpack_lu_part(imp, lu.im, false)?;
    Ok((Z { re: lr, im: li }, Z { re: ur, im: ui }))
}

/// `linalg_lu(A, *, pivot=True) -> (P, L, U)`.
fn lu(imp: &mut Importer, n: &Node) -> R<()> {
    if !imp.bool(n, "pivot", true)? {
        return unsupported("lu without pivoting");
    }
    let a = matrix(imp, n, "A")?;
    let packed = complex_result(imp, L::LuFactor, Flags::default(), &[a])?;
    if wanted(imp, n, 0) {
        let pivots = real_result(imp, L::LuPivots, a)?;
        let p = permutation(imp, packed.re, pivots)?;
        bind_permutation(imp, n, 0, p)?;
    }
    let (l, u) = unpack_lu(imp, packed)?;
    bind_complex(imp, n, 1, l)?;
    bind_complex(imp, n, 2, u)
}

/// `lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True) -> (P, L, U)`.
fn lu_unpack(imp: &mut Importer, n: &Node) -> R<()> {
    let packed = matrix(imp, n, "LU_data")?;
    let pivots = imp.tensor(n, "LU_pivots")?;
    if imp.bool(n, "unpack_pivots", true)? {
        if wanted(imp, n, 0) {
            let p = permutation(imp, packed.re, pivots)?;
            bind_permutation(imp, n, 0, p)?;
        }
    } else {
        bind_zeros(imp, n, 0)?;
    }
    if !imp.bool(n, "unpack_data", true)? {
        bind_zeros(imp, n, 1)?;
        return bind_zeros(imp, n, 2);
    }
    let (l, u) = unpack_lu(imp, packed)?;
    bind_complex(imp, n, 1, l)?;
    bind_complex(imp, n, 2, u)
}

/// Broadcasts the batch dims of two complex matrix operands.
fn broadcast(imp: &mut Importer, a: Z, b: Z) -> R<(Z, Z)> {
    let (ar, br) = real::broadcast_batches(imp, a.re, b.re)?;
    let (ai, bi) = real::broadcast_batches(imp, a.im, b.im)?;
    Ok((Z { re: ar, im: ai }, Z { re: br, im: bi }))
}

fn transpose(imp: &mut Importer, z: Z) -> R<Z> {
    Ok(Z { re: real::transpose_last(imp, z.re)?, im: real::transpose_last(imp, z.im)? })
}

/// The conjugate transpose `Zᴴ`.
fn adjoint(imp: &mut Importer, z: Z) -> R<Z> {
    let t = transpose(imp, z)?;
    let im = imp.push(Op::Unary(U::Neg), vec![t.im])?;
    Ok(Z { re: t.re, im })
}

/// The real matrices `p` times complex `z`, per part.
fn real_times(imp: &mut Importer, p: ValueId, z: Z) -> R<Z> {
    Ok(Z { re: imp.push(Op::MatMul, vec![p, z.re])?, im: imp.push(Op::MatMul, vec![p, z.im])? })
}

/// `linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False)` and
/// `lu_solve(self=B, LU_data, LU_pivots)`: with `A = P L U`, `A X = B` is
/// `X = U⁻¹ L⁻¹ Pᵀ B` and `Aᴴ X = B` is `X = P L⁻ᴴ U⁻ᴴ B`; a right solve
/// `X A = B` is `Aᴴ Xᴴ = Bᴴ`.
fn lu_solve(imp: &mut Importer, n: &Node, legacy: bool) -> R<()> {
    let (lu_arg, piv_arg, b_arg) = if legacy { ("LU_data", "LU_pivots", "self") } else { ("LU", "pivots", "B") };
    let dtype = work_dtype(imp, n, &[lu_arg, b_arg])?;
    let packed = parts(imp, n, lu_arg, dtype)?;
    let pivots = imp.tensor(n, piv_arg)?;
    let b = parts(imp, n, b_arg, dtype)?;
    let left = legacy || imp.bool(n, "left", true)?;
    let adj = !legacy && imp.bool(n, "adjoint", false)?;
    let p = permutation(imp, packed.re, pivots)?;
    let (b, adj) = if left { (b, adj) } else { (adjoint(imp, b)?, !adj) };
    let (packed, b) = broadcast(imp, packed, b)?;
    let (p_b, b_re) = real::broadcast_batches(imp, p, b.re)?;
    let (_, b_im) = real::broadcast_batches(imp, p, b.im)?;
    let (p, b) = (p_b, Z { re: b_re, im: b_im });
    let tri = |imp: &mut Importer, m: Z, rhs: Z, upper: bool, unit: bool| {
        complex_result(imp, L::TriangularSolve, Flags { upper, left: true, unit }, &[m, rhs])
    };
    let x = if adj {
        let t = adjoint(imp, packed)?;
        let z = tri(imp, t, b, false, false)?;
        let w = tri(imp, t, z, true, true)?;
        real_times(imp, p, w)?
    } else {
        let pt = real::transpose_last(imp, p)?;
        let y = real_times(imp, pt, b)?;
        let z = tri(imp, packed, y, false, true)?;
        tri(imp, packed, z, true, false)?
    };
    let x = if left { x } else { adjoint(imp, x)? };
    bind_complex(imp, n, 0, x)
}

/// `linalg_cholesky(A, *, upper=False)` and `linalg_cholesky_ex(A, *,
/// upper=False, check_errors=False) -> (L, info)`: `A = L Lᴴ` (`U = Lᴴ`).
fn cholesky(imp: &mut Importer, n: &Node, ex: bool) -> R<()> {
    let a = matrix(imp, n, "self")?;
    let f = Flags { upper: imp.bool(n, "upper", false)?, ..Flags::default() };
    let l = complex_result(imp, L::Cholesky, f, &[a])?;
    bind_complex(imp, n, 0, l)?;
    let check = !ex || imp.bool(n, "check_errors", false)?;
    info(imp, n, a, L::CholeskyInfo, ex.then_some(1), check, || real::not_positive_definite("linalg.cholesky"))
}

/// `cholesky_solve(self=B, input2=L, upper=False)`: `A X = B` with `A = L Lᴴ`.
fn cholesky_solve(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = work_dtype(imp, n, &["self", "input2"])?;
    let b = parts(imp, n, "self", dtype)?;
    let l = parts(imp, n, "input2", dtype)?;
    let f = Flags { upper: imp.bool(n, "upper", false)?, left: true, unit: false };
    let (l, b) = broadcast(imp, l, b)?;
    let x = complex_result(imp, L::CholeskySolve, f, &[l, b])?;
    bind_complex(imp, n, 0, x)
}

/// `cholesky_inverse(self=L, upper=False)`: `(L Lᴴ)⁻¹` as a Cholesky solve
/// against the identity.
fn cholesky_inverse(imp: &mut Importer, n: &Node) -> R<()> {
    let l = matrix(imp, n, "self")?;
    let size = real::square_size(imp, l.re, "cholesky_inverse")?;
    let ty = imp.ty(l.re).clone();
    let eye = real::identity_like(imp, ty.dtype, &ty.shape[..ty.rank() - 2], size)?;
    let eye_ty = imp.ty(eye).clone();
    let zero = imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: eye_ty.shape.clone() }, vec![], eye_ty);
    let f = Flags { upper: imp.bool(n, "upper", false)?, left: true, unit: false };
    let x = complex_result(imp, L::CholeskySolve, f, &[l, Z { re: eye, im: zero }])?;
    bind_complex(imp, n, 0, x)
}

/// `linalg_solve_triangular(self=A, B, *, upper, left=True, unitriangular=False)`.
fn solve_triangular(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = work_dtype(imp, n, &["self", "B"])?;
    let a = parts(imp, n, "self", dtype)?;
    let b = parts(imp, n, "B", dtype)?;
    let f = Flags {
        upper: imp.bool(n, "upper", false)?,
        left: imp.bool(n, "left", true)?,
        unit: imp.bool(n, "unitriangular", false)?,
    };
    let (a, b) = broadcast(imp, a, b)?;
    let x = complex_result(imp, L::TriangularSolve, f, &[a, b])?;
    bind_complex(imp, n, 0, x)
}

/// `triangular_solve(self=B, A, upper=True, transpose=False,
/// unitriangular=False) -> (solution, cloned_coefficient)`: `op(A) X = B`
/// with `op` the plain transpose when asked (not the conjugate one, as in
/// torch).
fn triangular_solve(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = work_dtype(imp, n, &["self", "A"])?;
    let b = parts(imp, n, "self", dtype)?;
    let a = parts(imp, n, "A", dtype)?;
    let mut upper = imp.bool(n, "upper", true)?;
    let unit = imp.bool(n, "unitriangular", false)?;
    let (a, b) = broadcast(imp, a, b)?;
    let coefficient = a;
    let a = if imp.bool(n, "transpose", false)? {
        upper = !upper;
        transpose(imp, a)?
    } else {
        a
    };
    let x = complex_result(imp, L::TriangularSolve, Flags { upper, left: true, unit }, &[a, b])?;
    bind_complex(imp, n, 0, x)?;
    if wanted(imp, n, 1) {
        bind_complex(imp, n, 1, coefficient)?;
    }
    Ok(())
}

/// `linalg_qr(A, mode='reduced') -> (Q, R)`; mode `r` leaves Q empty.
fn qr(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrix(imp, n, "A")?;
    let f = Flags::default();
    let (q, r) = match imp.string(n, "mode", "reduced")? {
        "reduced" => (L::QrQ, L::QrR),
        "complete" => (L::QrQComplete, L::QrRComplete),
        "r" => {
            bind_zeros(imp, n, 0)?;
            let r = complex_result(imp, L::QrR, f, &[a])?;
            return bind_complex(imp, n, 1, r);
        }
        other => return unsupported(format!("qr mode `{other}`")),
    };
    if wanted(imp, n, 0) {
        let q = complex_result(imp, q, f, &[a])?;
        bind_complex(imp, n, 0, q)?;
    }
    if wanted(imp, n, 1) {
        let r = complex_result(imp, r, f, &[a])?;
        bind_complex(imp, n, 1, r)?;
    }
    Ok(())
}

/// `geqrf(self) -> (a, tau)`: LAPACK's packed Householder QR.
fn geqrf(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrix(imp, n, "self")?;
    for (i, op) in [L::Geqrf, L::GeqrfTau].into_iter().enumerate() {
        if wanted(imp, n, i) {
            let v = complex_result(imp, op, Flags::default(), &[a])?;
            bind_complex(imp, n, i, v)?;
        }
    }
    Ok(())
}

/// `linalg_householder_product(input, tau)` and `orgqr(self, input2)`.
fn householder_product(imp: &mut Importer, n: &Node) -> R<()> {
    let legacy = imp.arg(n, "input2").is_some();
    let (a_arg, tau_arg) = if legacy { ("self", "input2") } else { ("input", "tau") };
    let dtype = work_dtype(imp, n, &[a_arg, tau_arg])?;
    let a = parts(imp, n, a_arg, dtype)?;
    let tau = tau_parts(imp, n, tau_arg, dtype)?;
    let q = complex_result(imp, L::HouseholderProduct, Flags::default(), &[a, tau])?;
    bind_complex(imp, n, 0, q)
}

/// A vector operand (`tau`) in `dtype`.
fn tau_parts(imp: &mut Importer, n: &Node, arg: &str, dtype: DType) -> R<Z> {
    let name = imp.tensor_name(n, arg)?;
    let z = operand(imp, name)?;
    let im = imag_or_zero(imp, z)?;
    Ok(Z { re: imp.cast(z.re, dtype), im: imp.cast(im, dtype) })
}

/// The complex product `x y` of matrices: four real products.
fn complex_matmul(imp: &mut Importer, x: Z, y: Z) -> R<Z> {
    let rr = imp.push(Op::MatMul, vec![x.re, y.re])?;
    let ii = imp.push(Op::MatMul, vec![x.im, y.im])?;
    let ri = imp.push(Op::MatMul, vec![x.re, y.im])?;
    let ir = imp.push(Op::MatMul, vec![x.im, y.re])?;
    Ok(Z { re: imp.push(Op::Binary(B::Sub), vec![rr, ii])?, im: imp.push(Op::Binary(B::Add), vec![ri, ir])? })
}

/// `ormqr(self, input2=tau, input3=C, left=True, transpose=False)`: `C`
/// times the full `m × m` Q of `geqrf`'s reflectors (`transpose`: its
/// conjugate transpose, as torch's complex `ormqr` takes it), from the left
/// or the right; the reflectors past `n` (and `tau` past `k`) are zero.
fn ormqr(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = work_dtype(imp, n, &["self", "input2", "input3"])?;
    let a = parts(imp, n, "self", dtype)?;
    let tau = tau_parts(imp, n, "input2", dtype)?;
    let c = parts(imp, n, "input3", dtype)?;
    let ty = imp.ty(a.re).clone();
    let rank = ty.rank();
    let (Some(m), Some(cols)) = (ty.shape[rank - 2].as_const(), ty.shape[rank - 1].as_const()) else {
        return unsupported("ormqr of matrices with a dynamic size");
    };
    let k = imp.ty(tau.re).shape.last().and_then(Dim::as_const).unwrap_or(0);
    if cols > m || k > cols {
        return invalid(format!("ormqr of a {m}x{cols} input with {k} reflectors"));
    }
    let pad = |imp: &mut Importer, v: ValueId, grow: i64| -> R<ValueId> {
        if grow <= 0 {
            return Ok(v);
        }
        let r = imp.ty(v).rank();
        let mut hi = vec![0; r];
        hi[r - 1] = grow;
        let op = Op::Pad { lo: vec![0; r], hi, interior: vec![0; r], mode: kiln_ir::PadMode::Constant, value: 0.0 };
        imp.push(op, vec![v])
    };
    let square = Z { re: pad(imp, a.re, m - cols)?, im: pad(imp, a.im, m - cols)? };
    let tau = Z { re: pad(imp, tau.re, m - k)?, im: pad(imp, tau.im, m - k)? };
    let q = complex_result(imp, L::HouseholderProduct, Flags::default(), &[square, tau])?;
    let q = if imp.bool(n, "transpose", false)? { adjoint(imp, q)? } else { q };
    let v = if imp.bool(n, "left", true)? { complex_matmul(imp, q, c)? } else { complex_matmul(imp, c, q)? };
    bind_complex(imp, n, 0, v)
}

/// `hermitian=True` asks for `zhetrf`'s `A = L D Lᴴ`, which kiln does not
/// compute; `False` (the default) is the complex symmetric `A = L D Lᵀ`.
fn refuse_hermitian(imp: &Importer, n: &Node, api: &str) -> R<()> {
    if imp.bool(n, "hermitian", false)? {
        return unsupported(format!(
            "`{api}` with hermitian=True of a complex matrix (kiln computes the symmetric L D Lᵀ only)"
        ));
    }
    Ok(())
}

/// `linalg_ldl_factor(self, *, hermitian=False) -> (LD, pivots)` and its
/// `_ex` form with `info`.
fn ldl_factor(imp: &mut Importer, n: &Node, ex: bool) -> R<()> {
    refuse_hermitian(imp, n, "linalg.ldl_factor")?;
    let a = matrix(imp, n, "self")?;
    if wanted(imp, n, 0) {
        let ld = complex_result(imp, L::LdlFactor, Flags::default(), &[a])?;
        bind_complex(imp, n, 0, ld)?;
    }
    if wanted(imp, n, 1) {
        let p = real_result(imp, L::LdlPivots, a)?;
        bind_real(imp, n, 1, p)?;
    }
    let check = ex && imp.bool(n, "check_errors", false)?;
    info(imp, n, a, L::LdlInfo, ex.then_some(2), check, || {
        "torch.linalg.ldl_factor_ex: the factorization has an exactly singular block of D".to_string()
    })
}

/// `linalg_ldl_solve(LD, pivots, B, *, hermitian=False)`.
fn ldl_solve(imp: &mut Importer, n: &Node) -> R<()> {
    refuse_hermitian(imp, n, "linalg.ldl_solve")?;
    let dtype = work_dtype(imp, n, &["LD", "B"])?;
    let ld = parts(imp, n, "LD", dtype)?;
    let pivots = imp.tensor(n, "pivots")?;
    let b = parts(imp, n, "B", dtype)?;
    let (lt, bt) = (imp.ty(ld.re).clone(), imp.ty(b.re).clone());
    if bt.rank() != lt.rank() || bt.shape[..bt.rank() - 2] != lt.shape[..lt.rank() - 2] {
        return unsupported("ldl_solve with a right-hand side not shaped [.., n, k] with LD's batch");
    }
    let (ldp, bp) = (pack(imp, ld)?, pack(imp, b)?);
    let x = kernel(imp, L::LdlSolve, Flags::default(), vec![ldp, pivots, bp])?;
    let x = unpack(imp, x)?;
    bind_complex(imp, n, 0, x)
}

/// Whether an `eigh` node's eigenvectors are computed and read.
fn eigenvectors_wanted(imp: &Importer, n: &Node) -> bool {
    imp.bool(n, "compute_v", true).unwrap_or(true) && wanted(imp, n, 1)
}

/// `_linalg_eigh(A, UPLO='L', compute_v=True) -> (eigenvalues, eigenvectors)`
/// and `linalg_eigh(self, UPLO='L')` of a Hermitian matrix (the triangle
/// `UPLO` names): real eigenvalues, ascending, and eigenvectors with kiln's
/// phases (each column's largest entry real and positive; LAPACK's phases
/// are an accident of its algorithm).
fn eigh(imp: &mut Importer, n: &Node) -> R<()> {
    let a = matrix(imp, n, if n.target.contains("_linalg_eigh") { "A" } else { "self" })?;
    let upper = match imp.string(n, "UPLO", "L")? {
        "L" => false,
        "U" => true,
        other => return unsupported(format!("eigh UPLO `{other}`")),
    };
    let f = Flags { upper, ..Flags::default() };
    if wanted(imp, n, 0) {
        let packed = pack(imp, a)?;
        let w = kernel(imp, L::EigvalsH, f, vec![packed])?;
        bind_real(imp, n, 0, w)?;
    }
    let v = complex_result(imp, L::EigvecsH, f, &[a])?;
    bind_complex(imp, n, 1, v)
}

/// The SVDs (`_linalg_svd`, `linalg_svd`, `torch.svd`) of a complex
/// matrix: one-sided complex Jacobi; singular vector pairs with kiln's
/// phases (the shorter side's vectors have their largest entry real and
/// positive, the other side's turned with them). `torch.svd`'s V is `Vhᴴ`.
fn svd(imp: &mut Importer, n: &Node, api: real::SvdApi) -> R<()> {
    let a = matrix(imp, n, if api == real::SvdApi::Torch { "self" } else { "A" })?;
    real::assert_finite_for_svd(imp, a.re)?;
    real::assert_finite_for_svd(imp, a.im)?;
    let (full, compute_uv) = match api {
        real::SvdApi::Core => (imp.bool(n, "full_matrices", false)?, imp.bool(n, "compute_uv", true)?),
        real::SvdApi::Linalg => (imp.bool(n, "full_matrices", true)?, true),
        _ => (!imp.bool(n, "some", true)?, imp.bool(n, "compute_uv", true)?),
    };
    let f = Flags::default();
    if wanted(imp, n, 1) {
        let packed = pack(imp, a)?;
        let s = kernel(imp, L::SvdS, f, vec![packed])?;
        bind_real(imp, n, 1, s)?;
    }
    if !compute_uv {
        bind_zeros(imp, n, 0)?;
        return bind_zeros(imp, n, 2);
    }
    let (u_op, vh_op) = if full { (L::SvdUFull, L::SvdVhFull) } else { (L::SvdU, L::SvdVh) };
    if wanted(imp, n, 0) {
        let u = complex_result(imp, u_op, f, &[a])?;
        bind_complex(imp, n, 0, u)?;
    }
    if wanted(imp, n, 2) {
        let vh = complex_result(imp, vh_op, f, &[a])?;
        let v = if api == real::SvdApi::Torch { adjoint(imp, vh)? } else { vh };
        bind_complex(imp, n, 2, v)?;
    }
    Ok(())
}

/// Both parts of `z` reshaped to `shape`.
fn reshape(imp: &mut Importer, z: Z, shape: Vec<Dim>) -> R<Z> {
    let re = imp.push(Op::Reshape { shape: shape.clone() }, vec![z.re])?;
    let im = imp.push(Op::Reshape { shape }, vec![z.im])?;
    Ok(Z { re, im })
}

/// The complex operand `arg` with no rank requirement, in `dtype`.
fn any_parts(imp: &mut Importer, n: &Node, arg: &str, dtype: DType) -> R<Z> {
    let name = imp.tensor_name(n, arg)?;
    let z = operand(imp, name)?;
    let im = imag_or_zero(imp, z)?;
    Ok(Z { re: imp.cast(z.re, dtype), im: imp.cast(im, dtype) })
}

/// `linalg_tensorinv(self, ind=2)` of a complex tensor: the inverse of the
/// matrix `[∏ shape[..ind], ∏ shape[ind..]]`, shaped as the program
/// declares; a singular one fails the run, as torch raises.
fn tensorinv(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = work_dtype(imp, n, &["self"])?;
    let a = any_parts(imp, n, "self", dtype)?;
    let ind = imp.int(n, "ind", Some(2))?;
    let Some(shape) = imp.ty(a.re).static_shape() else {
        return unsupported("tensorinv of a tensor with a dynamic size");
    };
    if ind <= 0 || ind as usize > shape.len() {
        return invalid(format!("tensorinv with ind={ind} of a {}-d tensor", shape.len()));
    }
    let (rows, cols): (i64, i64) = (shape[..ind as usize].iter().product(), shape[ind as usize..].iter().product());
    if rows != cols {
        return invalid(format!("tensorinv of a {rows}x{cols} matrix"));
    }
    let m = reshape(imp, a, vec![Dim::Const(rows), Dim::Const(cols)])?;
    let inverse = complex_result(imp, L::Inv, Flags::default(), &[m])?;
    info(imp, n, m, L::LuInfo, None, true, || real::singular("linalg.tensorinv"))?;
    bind_complex(imp, n, 0, inverse)
}

/// `linalg_tensorsolve(self=A, other=B, dims=None)` of complex tensors:
/// `A`'s `dims` moved to the end, `A` as a `[∏ B.shape, ∏ rest]` matrix
/// solved against `B` flattened.
fn tensorsolve(imp: &mut Importer, n: &Node) -> R<()> {
    let dtype = work_dtype(imp, n, &["self", "other"])?;
    let a = any_parts(imp, n, "self", dtype)?;
    let b = any_parts(imp, n, "other", dtype)?;
    let rank = imp.ty(a.re).rank();
    let a = match imp.arg(n, "dims") {
        None => a,
        Some(_) => {
            let dims = imp.ints(n, "dims", &[])?;
            let moved: Vec<usize> =
                dims.iter().map(|&d| super::shape::normalize_axis(d, rank)).collect::<R<Vec<_>>>()?;
            let perm: Vec<usize> = (0..rank).filter(|d| !moved.contains(d)).chain(moved.iter().copied()).collect();
            let re = imp.push(Op::Permute { perm: perm.clone() }, vec![a.re])?;
            let im = imp.push(Op::Permute { perm }, vec![a.im])?;
            Z { re, im }
        }
    };
    let (Some(bn), Some(an)) = (imp.ty(b.re).numel().as_const(), imp.ty(a.re).numel().as_const()) else {
        return unsupported("tensorsolve of tensors with a dynamic size");
    };
    if bn == 0 || an % bn != 0 || an / bn != bn {
        return invalid(format!("tensorsolve: {an} coefficients for {bn} right-hand values"));
    }
    let m = reshape(imp, a, vec![Dim::Const(bn), Dim::Const(bn)])?;
    let rhs = reshape(imp, b, vec![Dim::Const(bn), Dim::Const(1)])?;
    let x = complex_result(imp, L::Solve, Flags { left: true, ..Flags::default() }, &[m, rhs])?;
    info(imp, n, m, L::LuInfo, None, true, || real::singular("linalg.tensorsolve"))?;
    bind_complex(imp, n, 0, x)
}

/// `linalg_pinv(self, *, atol, rtol, hermitian=True)` of a complex
/// Hermitian matrix, as torch computes it: `V diag(1/w) Vᴴ` from `eigh`
/// (the lower triangle), eigenvalues with `|w|` at or below
/// `max(atol, rtol·max|w|)` dropped.
fn hermitian_pinv(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let a = matrix(imp, n, "self")?;
    if real::has_no_elements(imp, a.re) {
        return bind_zeros(imp, n, 0);
    }
    let (atol, rtol) = real::tolerances(imp, n, a.re, overload, false)?;
    let f = Flags::default();
    let packed = pack(imp, a)?;
    let w = kernel(imp, L::EigvalsH, f, vec![packed])?;
    let v = complex_result(imp, L::EigvecsH, f, &[a])?;
    let magnitude = imp.push(Op::Unary(U::Abs), vec![w])?;
    let big = real::largest(imp, magnitude)?;
    let tol = real::threshold(imp, atol, rtol, big)?;
    let mag64 = imp.cast(magnitude, DType::F64);
    let keep = imp.push(Op::Binary(B::Gt), vec![mag64, tol])?;
    let inverse = imp.push(Op::Unary(U::Reciprocal), vec![w])?;
    let zero = imp.scalar_const(crate::import::importer::Scalar::Float(0.0), imp.ty(w).dtype);
    let inverse = imp.push(Op::Where, vec![keep, inverse, zero])?;
    // [.., k] -> [.., 1, k]: scales V's columns.
    let mut row = imp.ty(inverse).shape.clone();
    row.insert(row.len() - 1, Dim::Const(1));
    let inverse = imp.push(Op::Reshape { shape: row }, vec![inverse])?;
    let scaled = Z {
        re: imp.push(Op::Binary(B::Mul), vec![v.re, inverse])?,
        im: imp.push(Op::Binary(B::Mul), vec![v.im, inverse])?,
    };
    let vh = adjoint(imp, v)?;
    let x = complex_matmul(imp, scaled, vh)?;
    bind_complex(imp, n, 0, x)
}
