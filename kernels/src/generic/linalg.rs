//! Dense linear algebra on batches of small matrices (`torch.linalg`):
//! LU with partial pivoting (det, slogdet, inv, solve, lu_factor),
//! Cholesky, triangular solves, Householder QR, symmetric eigenvalues and
//! eigenvectors, and the singular value decomposition.
//!
//! Every matrix is worked in f64 and the results rounded to the tensor's
//! dtype (f32 or f64), so f32 results are at least as accurate as LAPACK's
//! single-precision ones. The decompositions follow LAPACK's conventions
//! where torch exposes them: `getrf`'s pivot choice (the first largest
//! magnitude in the column) and 1-based i32 pivots, `geqrf`'s Householder
//! signs (`dlarfg`), and `info` codes (the first zero pivot, the order of
//! the first leading minor that is not positive definite).
//!
//! Unlike the other kernels these allocate their f64 working copies per
//! call: they serve control and geometry code on small matrices, where the
//! O(n³) work dwarfs the allocation.

use super::common::*;
use crate::types::{DType, KernelError, LinalgOp, Result, TensorMut, TensorRef};

const K: &str = "linalg";

/// The parameters of a [`linalg`] call besides its operation.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LinalgFlags {
    /// Cholesky: return the upper factor; triangular and Cholesky solves:
    /// the matrix is upper triangular.
    pub upper: bool,
    /// Solves: `A X = B` (else `X A = B`).
    pub left: bool,
    /// Triangular solve: the diagonal is taken as ones.
    pub unit: bool,
    /// Complex matrices: every f32/f64 operand and complex-valued result
    /// holds interleaved (re, im) pairs in a trailing dim of 2 (`[.., m, n,
    /// 2]`); real results (`log_abs_det`, pivots, infos) have none.
    pub complex: bool,
}

/// Runs `op` over the batch of matrices in `ins[0]` (and right-hand sides in
/// `ins[1]` for the solves), writing `out`.
pub fn linalg(op: LinalgOp, flags: LinalgFlags, ins: &[TensorRef], mut out: TensorMut) -> Result<()> {
    if flags.complex {
        return linalg_complex(op, flags, ins, &mut out);
    }
    let a = *ins.first().ok_or_else(|| shape_err(K, "no operand"))?;
    if !matches!(a.dtype, DType::F32 | DType::F64) {
        return Err(KernelError::UnsupportedDType { kernel: K, dtype: a.dtype });
    }
    let r = a.shape.len();
    if r < 2 {
        return Err(shape_err(K, format!("{} needs matrices, got shape {:?}", op.name(), a.shape)));
    }
    let (m, n) = (a.shape[r - 2], a.shape[r - 1]);
    let batch: usize = a.shape[..r - 2].iter().product();
    let am = to_f64(&a)?;
    if batch.checked_mul(m * n) != Some(am.len()) {
        return Err(shape_err(K, format!("{} elements for matrices of shape {:?}", am.len(), a.shape)));
    }
    let mut res: Vec<f64> = Vec::new();
    let mut ints: Vec<i64> = Vec::new();
    match op {
        LinalgOp::PivotsToPermutation => {
            let piv = ins.get(1).ok_or_else(|| shape_err(K, "pivots_to_permutation needs the pivots"))?;
            let pivots = pivots_of(piv)?;
            let k = piv.shape.last().copied().unwrap_or(0);
            if pivots.len() != batch * k || k > m {
                return Err(shape_err(K, format!("pivots {:?} for matrices {:?}", piv.shape, a.shape)));
            }
            for b in 0..batch {
                res.extend(permutation_matrix(&pivots[b * k..(b + 1) * k], m)?);
            }
        }
        // Every other op is a result of one factorization of the matrix.
        _ => {
            let load = |i: usize| -> Result<(Vec<usize>, Vec<f64>)> {
                let b = ins.get(i).ok_or_else(|| shape_err(K, format!("{} needs operand {i}", op.name())))?;
                Ok((b.shape.to_vec(), to_f64(b)?))
            };
            let got = factor_ops(op, flags, a.shape, &am, ins, &load)?;
            res = if got.reals.is_empty() { got.vals } else { got.reals };
            ints = got.ints;
        }
    }
    write(op, &mut out, &res, &ints)
}

/// What [`factor_ops`] computes: scalar results (`vals`), real ones of a
/// complex matrix (`reals`: `log_abs_det`; for f64 they stand for `vals`),
/// or integers.
struct Results<T> {
    vals: Vec<T>,
    reals: Vec<f64>,
    ints: Vec<i64>,
}

/// The LU, Cholesky and solve results over the batch `am` of `[.., m, n]`
/// matrices (`shape` without a complex pair dim), in f64 or [`C64`];
/// `load(i)` reads operand `i` (its shape without the pair dim, and data).
fn factor_ops<T: Field>(
    op: LinalgOp,
    flags: LinalgFlags,
    shape: &[usize],
    am: &[T],
    ins: &[TensorRef],
    load: &dyn Fn(usize) -> Result<(Vec<usize>, Vec<T>)>,
) -> Result<Results<T>> {
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let batch: usize = shape[..r - 2].iter().product();
    let square =
        || if m == n { Ok(()) } else { Err(shape_err(K, format!("{} needs square matrices, got {m}x{n}", op.name()))) };
    let mut res: Vec<T> = Vec::new();
    let mut reals: Vec<f64> = Vec::new();
    let mut ints: Vec<i64> = Vec::new();
    match op {
        LinalgOp::Det
        | LinalgOp::SignDet
        | LinalgOp::LogAbsDet
        | LinalgOp::Inv
        | LinalgOp::LuFactor
        | LinalgOp::LuPivots
        | LinalgOp::LuInfo => {
            // LAPACK's getrf factors rectangular matrices too.
            if !matches!(op, LinalgOp::LuFactor | LinalgOp::LuPivots | LinalgOp::LuInfo) {
                square()?;
            }
            for mat in mats(am, m * n, batch) {
                let lu = Lu::factor_rect(mat, m, n);
                match op {
                    LinalgOp::Det => res.push(lu.det()),
                    LinalgOp::SignDet => res.push(lu.sign_logabs().0),
                    LinalgOp::LogAbsDet => reals.push(lu.sign_logabs().1),
                    LinalgOp::Inv => res.extend(lu.solve(&identity(n), n)),
                    LinalgOp::LuFactor => res.extend_from_slice(&lu.lu),
                    LinalgOp::LuPivots => ints.extend(lu.pivots.iter().map(|&p| p as i64 + 1)),
                    _ => ints.push(lu.info as i64),
                }
            }
        }
        LinalgOp::Solve => {
            square()?;
            let (bshape, bm) = load(1)?;
            // B is [.., n, k] (left) or [.., k, n].
            let k = rhs_other_dim(&bshape, r, n, flags.left)?;
            let per = n * k;
            if bm.len() != batch * per {
                return Err(shape_err(K, format!("right-hand side {bshape:?} does not match {shape:?}")));
            }
            for (mat, rhs) in mats(am, n * n, batch).zip(mats(&bm, per, batch)) {
                let x = if flags.left {
                    Lu::factor(mat, n).solve(rhs, k)
                } else {
                    // X A = B  <=>  A^T X^T = B^T.
                    let at = transpose(mat, n, n);
                    let bt = transpose(rhs, k, n);
                    transpose(&Lu::factor(&at, n).solve(&bt, k), n, k)
                };
                res.extend(x);
            }
        }
        LinalgOp::Cholesky | LinalgOp::CholeskyInfo => {
            square()?;
            for mat in mats(am, n * n, batch) {
                let (l, info) = cholesky(mat, n);
                if op == LinalgOp::CholeskyInfo {
                    ints.push(info as i64);
                } else if flags.upper {
                    // U = Lᴴ.
                    res.extend(conj_transpose(&l, n, n));
                } else {
                    res.extend(l);
                }
            }
        }
        LinalgOp::TriangularSolve | LinalgOp::CholeskySolve => {
            square()?;
            let (bshape, bm) = load(1)?;
            let rb = bshape.len();
            if rb != r || bm.len() != bshape.iter().product::<usize>() {
                return Err(shape_err(K, format!("right-hand side {bshape:?} does not match {shape:?}")));
            }
            let (bm_rows, bm_cols) = (bshape[rb - 2], bshape[rb - 1]);
            // A Cholesky solve is always `A X = B`.
            let flags = LinalgFlags { left: flags.left || op == LinalgOp::CholeskySolve, ..flags };
            let per = bm_rows * bm_cols;
            if (flags.left && bm_rows != n) || (!flags.left && bm_cols != n) || bm.len() != batch * per {
                return Err(shape_err(K, format!("right-hand side {bshape:?} does not match {shape:?}")));
            }
            for (mat, rhs) in mats(am, n * n, batch).zip(mats(&bm, per, batch)) {
                if op == LinalgOp::CholeskySolve {
                    // A = L Lᴴ (or Uᴴ U): two triangular solves.
                    let l = if flags.upper { conj_transpose(mat, n, n) } else { mat.to_vec() };
                    let y = tri_solve(&l, rhs, n, bm_cols, false, false);
                    res.extend(tri_solve(&conj_transpose(&l, n, n), &y, n, bm_cols, true, false));
                } else if flags.left {
                    res.extend(tri_solve(mat, rhs, n, bm_cols, flags.upper, flags.unit));
                } else {
                    // X A = B  <=>  A^T X^T = B^T, with A^T's triangle flipped.
                    let at = transpose(mat, n, n);
                    let bt = transpose(rhs, bm_rows, n);
                    let xt = tri_solve(&at, &bt, n, bm_rows, !flags.upper, flags.unit);
                    res.extend(transpose(&xt, n, bm_rows));
                }
            }
        }
        LinalgOp::QrQ | LinalgOp::QrR | LinalgOp::QrQComplete | LinalgOp::QrRComplete => {
            let complete = matches!(op, LinalgOp::QrQComplete | LinalgOp::QrRComplete);
            for mat in mats(am, m * n, batch) {
                let (q, rr) = qr(mat, m, n, complete);
                res.extend(if matches!(op, LinalgOp::QrQ | LinalgOp::QrQComplete) { q } else { rr });
            }
        }
        LinalgOp::Geqrf | LinalgOp::GeqrfTau => {
            for mat in mats(am, m * n, batch) {
                let (packed, tau) = geqrf(mat, m, n);
                res.extend(if op == LinalgOp::Geqrf { packed } else { tau });
            }
        }
        LinalgOp::HouseholderProduct => {
            let (tshape, tm) = load(1)?;
            let k = tshape.last().copied().unwrap_or(0);
            if tm.len() != batch * k || k > n || n > m {
                return Err(shape_err(
                    K,
                    format!("householder_product of {shape:?} with tau {tshape:?} (needs m >= n >= k)"),
                ));
            }
            for (b, mat) in mats(am, m * n, batch).enumerate() {
                res.extend(householder_product(mat, m, n, &tm[b * k..(b + 1) * k]));
            }
        }
        LinalgOp::LdlFactor | LinalgOp::LdlPivots | LinalgOp::LdlInfo => {
            square()?;
            for mat in mats(am, n * n, batch) {
                let f = Ldl::factor(mat, n);
                match op {
                    LinalgOp::LdlFactor => res.extend(f.ld),
                    LinalgOp::LdlPivots => ints.extend(f.pivots.iter().map(|&p| p as i64)),
                    _ => ints.push(f.info as i64),
                }
            }
        }
        LinalgOp::LdlSolve => {
            square()?;
            let piv = ins.get(1).ok_or_else(|| shape_err(K, "ldl_solve needs (LD, pivots, B)"))?;
            let pivots = pivots_of(piv)?;
            let (bshape, bm) = load(2)?;
            let k = rhs_other_dim(&bshape, r, n, true)?;
            if pivots.len() != batch * n || bm.len() != batch * n * k {
                return Err(shape_err(
                    K,
                    format!("ldl_solve of {shape:?} with pivots {:?} and B {bshape:?}", piv.shape),
                ));
            }
            for (i, (mat, rhs)) in mats(am, n * n, batch).zip(mats(&bm, n * k, batch)).enumerate() {
                res.extend(ldl_solve(mat, &pivots[i * n..(i + 1) * n], rhs, n, k)?);
            }
        }
        LinalgOp::EigvalsH | LinalgOp::EigvecsH => {
            square()?;
            for mat in mats(am, n * n, batch) {
                let (w, v) = eigh_symmetric(mat, n, flags.upper, op == LinalgOp::EigvecsH);
                if op == LinalgOp::EigvalsH {
                    reals.extend(w);
                } else {
                    res.extend(v);
                }
            }
        }
        LinalgOp::SvdS | LinalgOp::SvdU | LinalgOp::SvdVh | LinalgOp::SvdUFull | LinalgOp::SvdVhFull => {
            let full = matches!(op, LinalgOp::SvdUFull | LinalgOp::SvdVhFull);
            for mat in mats(am, m * n, batch) {
                let d = svd(mat, m, n, full);
                match op {
                    LinalgOp::SvdS => reals.extend(d.s),
                    LinalgOp::SvdU | LinalgOp::SvdUFull => res.extend(d.u),
                    _ => res.extend(d.vh),
                }
            }
        }
        other => return Err(shape_err(K, format!("{} is not a factorization's result", other.name()))),
    }
    Ok(Results { vals: res, reals, ints })
}

/// The complex instructions (`flags.complex`): operands and complex results
/// as interleaved pairs in a trailing dim of 2, worked in [`C64`].
fn linalg_complex(op: LinalgOp, flags: LinalgFlags, ins: &[TensorRef], out: &mut TensorMut) -> Result<()> {
    let a = *ins.first().ok_or_else(|| shape_err(K, "no operand"))?;
    let shape = pair_shape(a.shape)?;
    if shape.len() < 2 {
        return Err(shape_err(K, format!("complex {} needs matrices, got shape {:?}", op.name(), a.shape)));
    }
    let am = to_c64(&a)?;
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let batch: usize = shape[..r - 2].iter().product();
    if batch.checked_mul(m * n) != Some(am.len()) {
        return Err(shape_err(K, format!("{} elements for matrices of shape {:?}", am.len(), a.shape)));
    }
    let load = |i: usize| -> Result<(Vec<usize>, Vec<C64>)> {
        let b = ins.get(i).ok_or_else(|| shape_err(K, format!("{} needs operand {i}", op.name())))?;
        Ok((pair_shape(b.shape)?, to_c64(b)?))
    };
    let got = match op {
        LinalgOp::PivotsToPermutation => {
            return Err(shape_err(K, format!("{} of complex matrices is not implemented", op.name())))
        }
        // Every other op is a result of one factorization of the matrix.
        _ => factor_ops(op, flags, &shape, &am, ins, &load)?,
    };
    // Integer results (pivots, infos) and `log_abs_det` are real; an empty
    // batch gives none of any kind.
    if matches!(out.dtype, DType::I32 | DType::I64) {
        return write(op, out, &[], &got.ints);
    }
    if matches!(op, LinalgOp::LogAbsDet | LinalgOp::EigvalsH | LinalgOp::SvdS) {
        return write(op, out, &got.reals, &[]);
    }
    let flat: Vec<f64> = got.vals.iter().flat_map(|z| [z.re, z.im]).collect();
    let want = out.shape.iter().product::<usize>();
    if out.shape.last() != Some(&2) || flat.len() != want {
        return Err(shape_err(
            K,
            format!("complex {} produced {} pairs for an output of shape {:?}", op.name(), got.vals.len(), out.shape),
        ));
    }
    write(op, out, &flat, &[])
}

/// A complex operand's shape without its trailing pair dim.
fn pair_shape(shape: &[usize]) -> Result<Vec<usize>> {
    match shape.split_last() {
        Some((2, rest)) => Ok(rest.to_vec()),
        _ => Err(shape_err(K, format!("a complex operand of shape {shape:?} has no trailing (re, im) dim"))),
    }
}

fn to_c64(t: &TensorRef) -> Result<Vec<C64>> {
    let flat = to_f64(t)?;
    Ok(flat.chunks_exact(2).map(|p| C64::new(p[0], p[1])).collect())
}

/// Pivots (i32 or i64) as i64.
fn pivots_of(piv: &TensorRef) -> Result<Vec<i64>> {
    match piv.dtype {
        DType::I32 => Ok(view::<i32>(K, "pivots", piv)?.iter().map(|&v| v as i64).collect()),
        DType::I64 => Ok(view::<i64>(K, "pivots", piv)?.to_vec()),
        other => Err(KernelError::UnsupportedDType { kernel: K, dtype: other }),
    }
}

/// A symmetric matrix factored as LAPACK's `dsytf2` (lower triangle,
/// Bunch–Kaufman partial pivoting) does it: `P A P^T = L D L^T` with `D`
/// of 1×1 and 2×2 blocks; the same pivot tests, interchanges and updates
/// in the same order, so the same pivots (torch's MKL gives them too on
/// the matrices tried) and the factors to rounding.
struct Ldl<T> {
    /// Row-major `n × n`: `L` below the diagonal (unit diagonal implied),
    /// `D` on it (and a 2×2 block's off-diagonal below it), zero above.
    ld: Vec<T>,
    /// 1-based: `p` for a 1×1 block (row/column `p` swapped in), `-p` on both
    /// columns of a 2×2 block.
    pivots: Vec<i32>,
    /// 0, or the first block of `D` that is exactly zero (1-based).
    info: i32,
}

impl<T: Field> Ldl<T> {
    /// A complex symmetric matrix (not Hermitian) is factored as `zsytf2`
    /// does: `A = L D Lᵀ`, magnitudes `|re| + |im|`.
    fn factor(mat: &[T], n: usize) -> Ldl<T> {
        let alpha = (1.0 + 17f64.sqrt()) / 8.0;
        let mut a = mat.to_vec();
        let at = |i: usize, j: usize| i * n + j;
        let mut pivots = vec![0i32; n];
        let mut info = 0i32;
        let mut k = 0;
        // The first index of the largest magnitude (LAPACK's `idamax`).
        let argmax = |a: &[T], idx: &mut dyn Iterator<Item = (usize, usize)>| -> (usize, f64) {
            let mut best = (usize::MAX, -1.0f64);
            for (r, c) in idx {
                let v = a[r * n + c].abs1();
                if best.0 == usize::MAX || v > best.1 {
                    best = (r * n + c, v);
                }
            }
            best
        };
        while k < n {
            let mut kstep = 1;
            let absakk = a[at(k, k)].abs1();
            let (imax, colmax) = if k + 1 < n {
                let (flat, v) = argmax(&a, &mut (k + 1..n).map(|i| (i, k)));
                (flat / n, v)
            } else {
                (k, 0.0)
            };
            let kp;
            if absakk.max(colmax) == 0.0 || absakk.is_nan() {
                if info == 0 {
                    info = k as i32 + 1;
                }
                kp = k;
            } else {
                if absakk >= alpha * colmax {
                    kp = k;
                } else {
                    let (_, mut rowmax) = argmax(&a, &mut (k..imax).map(|j| (imax, j)));
                    if imax + 1 < n {
                        rowmax = rowmax.max(argmax(&a, &mut (imax + 1..n).map(|j| (j, imax))).1);
                    }
                    if absakk >= alpha * colmax * (colmax / rowmax) {
                        kp = k;
                    } else if a[at(imax, imax)].abs1() >= alpha * rowmax {
                        kp = imax;
                    } else {
                        kp = imax;
                        kstep = 2;
                    }
                }
                let kk = k + kstep - 1;
                if kp != kk {
                    for i in kp + 1..n {
                        a.swap(at(i, kk), at(i, kp));
                    }
                    for j in kk + 1..kp {
                        a.swap(at(j, kk), at(kp, j));
                    }
                    a.swap(at(kk, kk), at(kp, kp));
                    if kstep == 2 {
                        a.swap(at(k + 1, k), at(kp, k));
                    }
                }
                if kstep == 1 {
                    if k + 1 < n {
                        // A := A - x x^T / d (lower part, `dsyr`), then x / d.
                        let d11 = T::ONE / a[at(k, k)];
                        for j in k + 1..n {
                            if a[at(j, k)] != T::ZERO {
                                let temp = -d11 * a[at(j, k)];
                                for i in j..n {
                                    a[at(i, j)] = a[at(i, j)] + a[at(i, k)] * temp;
                                }
                            }
                        }
                        for i in k + 1..n {
                            a[at(i, k)] = a[at(i, k)] * d11;
                        }
                    }
                } else if k + 2 < n {
                    let d21 = a[at(k + 1, k)];
                    let d11 = a[at(k + 1, k + 1)] / d21;
                    let d22 = a[at(k, k)] / d21;
                    let t = T::ONE / (d11 * d22 - T::ONE);
                    let d21 = t / d21;
                    for j in k + 2..n {
                        let wk = d21 * (d11 * a[at(j, k)] - a[at(j, k + 1)]);
                        let wkp1 = d21 * (d22 * a[at(j, k + 1)] - a[at(j, k)]);
                        for i in j..n {
                            let update = a[at(i, k)] * wk + a[at(i, k + 1)] * wkp1;
                            a[at(i, j)] -= update;
                        }
                        a[at(j, k)] = wk;
                        a[at(j, k + 1)] = wkp1;
                    }
                }
            }
            if kstep == 1 {
                pivots[k] = kp as i32 + 1;
            } else {
                pivots[k] = -(kp as i32 + 1);
                pivots[k + 1] = -(kp as i32 + 1);
            }
            k += kstep;
        }
        for i in 0..n {
            for j in i + 1..n {
                a[at(i, j)] = T::ZERO;
            }
        }
        Ldl { ld: a, pivots, info }
    }
}

/// `A X = B` from [`Ldl`]'s factors (`dsytrs`, lower): `L D` forward with
/// the row interchanges, then `L^T` backward undoing them. Pivots that do
/// not describe a factorization (out of range, a 2×2 block not given on two
/// equal entries) are an error.
fn ldl_solve<T: Field>(ld: &[T], pivots: &[i64], rhs: &[T], n: usize, k: usize) -> Result<Vec<T>> {
    let bad = || shape_err(K, format!("ldl_solve: pivots {pivots:?} are not a factorization's"));
    let at = |i: usize, j: usize| i * n + j;
    let mut b = rhs.to_vec();
    let swap_rows = |b: &mut [T], r: usize, s: usize| {
        if r != s {
            for c in 0..k {
                b.swap(r * k + c, s * k + c);
            }
        }
    };
    let row = |p: i64| -> Result<usize> {
        let r = usize::try_from(p.unsigned_abs()).ok().filter(|&r| (1..=n).contains(&r)).ok_or_else(bad)?;
        Ok(r - 1)
    };
    // L D Y = P B.
    let mut i = 0;
    while i < n {
        if pivots[i] > 0 {
            swap_rows(&mut b, i, row(pivots[i])?);
            for r in i + 1..n {
                for c in 0..k {
                    let y = ld[at(r, i)] * b[i * k + c];
                    b[r * k + c] -= y;
                }
            }
            let inv = T::ONE / ld[at(i, i)];
            for c in 0..k {
                b[i * k + c] = b[i * k + c] * inv;
            }
            i += 1;
        } else {
            if i + 1 >= n || pivots[i + 1] != pivots[i] {
                return Err(bad());
            }
            swap_rows(&mut b, i + 1, row(pivots[i])?);
            for r in i + 2..n {
                for c in 0..k {
                    let y = ld[at(r, i)] * b[i * k + c];
                    b[r * k + c] -= y;
                }
                for c in 0..k {
                    let y = ld[at(r, i + 1)] * b[(i + 1) * k + c];
                    b[r * k + c] -= y;
                }
            }
            let akm1k = ld[at(i + 1, i)];
            let akm1 = ld[at(i, i)] / akm1k;
            let ak = ld[at(i + 1, i + 1)] / akm1k;
            let denom = akm1 * ak - T::ONE;
            for c in 0..k {
                let bkm1 = b[i * k + c] / akm1k;
                let bk = b[(i + 1) * k + c] / akm1k;
                b[i * k + c] = (ak * bkm1 - bk) / denom;
                b[(i + 1) * k + c] = (akm1 * bk - bkm1) / denom;
            }
            i += 2;
        }
    }
    // L^T X = Y, then the interchanges in reverse.
    let mut i = n;
    while i > 0 {
        let j = i - 1;
        let dot = |b: &[T], col: usize, c: usize| T::sum_of((j + 1..n).map(|r| ld[at(r, col)] * b[r * k + c]));
        if pivots[j] > 0 {
            for c in 0..k {
                let d = dot(&b, j, c);
                b[j * k + c] -= d;
            }
            swap_rows(&mut b, j, row(pivots[j])?);
            i -= 1;
        } else {
            if j == 0 || pivots[j - 1] != pivots[j] {
                return Err(bad());
            }
            for c in 0..k {
                let d = dot(&b, j, c);
                b[j * k + c] -= d;
            }
            for c in 0..k {
                let d = T::sum_of((j + 1..n).map(|r| ld[at(r, j - 1)] * b[r * k + c]));
                b[(j - 1) * k + c] -= d;
            }
            swap_rows(&mut b, j, row(pivots[j])?);
            i -= 2;
        }
    }
    Ok(b)
}

/// The number of right-hand sides: `b` is `[.., n, k]` (`left`) or `[.., k,
/// n]`, with A's rank.
fn rhs_other_dim(b: &[usize], a_rank: usize, n: usize, left: bool) -> Result<usize> {
    match b.len() {
        r if r == a_rank && left && b[r - 2] == n => Ok(b[r - 1]),
        r if r == a_rank && !left && b[r - 1] == n => Ok(b[r - 2]),
        _ => Err(shape_err(K, format!("right-hand side {b:?} does not fit {n}x{n} matrices"))),
    }
}

/// The `batch` consecutive matrices of `size` elements in `data` (any of
/// them may be empty).
fn mats<T>(data: &[T], size: usize, batch: usize) -> impl Iterator<Item = &[T]> {
    (0..batch).map(move |i| &data[i * size..(i + 1) * size])
}

fn to_f64(t: &TensorRef) -> Result<Vec<f64>> {
    match t.dtype {
        DType::F32 => Ok(view::<f32>(K, "a", t)?.iter().map(|&v| v as f64).collect()),
        DType::F64 => Ok(view::<f64>(K, "a", t)?.to_vec()),
        other => Err(KernelError::UnsupportedDType { kernel: K, dtype: other }),
    }
}

fn write(op: LinalgOp, out: &mut TensorMut, res: &[f64], ints: &[i64]) -> Result<()> {
    let want = out.shape.iter().product::<usize>();
    let got = if ints.is_empty() { res.len() } else { ints.len() };
    if got != want {
        return Err(shape_err(
            K,
            format!("{} produced {got} values for an output of shape {:?}", op.name(), out.shape),
        ));
    }
    match out.dtype {
        DType::F32 if ints.is_empty() => {
            view_mut::<f32>(K, "out", out)?.iter_mut().zip(res).for_each(|(o, &v)| *o = v as f32)
        }
        DType::F64 if ints.is_empty() => view_mut::<f64>(K, "out", out)?.copy_from_slice(res),
        DType::I32 => view_mut::<i32>(K, "out", out)?.iter_mut().zip(ints).for_each(|(o, &v)| *o = v as i32),
        DType::I64 => view_mut::<i64>(K, "out", out)?.copy_from_slice(ints),
        other => return Err(KernelError::UnsupportedDType { kernel: K, dtype: other }),
    }
    Ok(())
}

fn identity<T: Field>(n: usize) -> Vec<T> {
    (0..n * n).map(|i| if i / n == i % n { T::ONE } else { T::ZERO }).collect()
}

fn transpose<T: Copy>(a: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..rows * cols).map(|i| a[(i % rows) * cols + i / rows]).collect()
}

/// The conjugate transpose (the transpose of a real matrix).
fn conj_transpose<T: Field>(a: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..rows * cols).map(|i| a[(i % rows) * cols + i / rows].conj()).collect()
}

/// An LU factorisation `P A = L U` (LAPACK `getrf`): L's unit diagonal is
/// implied, both factors share `lu`; `pivots[k]` is the row swapped with
/// row `k` at step `k`.
struct Lu<T> {
    n: usize,
    lu: Vec<T>,
    pivots: Vec<usize>,
    /// 0, or the 1-based index of the first exactly-zero pivot.
    info: usize,
}

impl<T: Field> Lu<T> {
    fn factor(a: &[T], n: usize) -> Lu<T> {
        Lu::factor_rect(a, n, n)
    }

    /// `P A = L U` of an `m x n` matrix: `min(m, n)` pivots.
    fn factor_rect(a: &[T], m: usize, n: usize) -> Lu<T> {
        let mut lu = a.to_vec();
        let mut pivots = vec![0; m.min(n)];
        let mut info = 0;
        for k in 0..m.min(n) {
            // The first row holding the column's largest magnitude (idamax;
            // izamax's |re| + |im| for a complex matrix).
            let p = (k..m).fold(k, |best, i| if lu[i * n + k].abs1() > lu[best * n + k].abs1() { i } else { best });
            pivots[k] = p;
            if p != k {
                for j in 0..n {
                    lu.swap(k * n + j, p * n + j);
                }
            }
            let d = lu[k * n + k];
            if d == T::ZERO {
                if info == 0 {
                    info = k + 1;
                }
                continue;
            }
            for i in k + 1..m {
                let f = lu[i * n + k] / d;
                lu[i * n + k] = f;
                for j in k + 1..n {
                    let u = lu[k * n + j];
                    lu[i * n + j] -= f * u;
                }
            }
        }
        Lu { n, lu, pivots, info }
    }

    fn swaps(&self) -> usize {
        self.pivots.iter().enumerate().filter(|&(k, &p)| p != k).count()
    }

    fn det(&self) -> T {
        let d = (0..self.n).fold(T::ONE, |d, k| d * self.lu[k * self.n + k]);
        if self.swaps() % 2 == 1 {
            -d
        } else {
            d
        }
    }

    /// torch's slogdet: (sign, log|det|); a singular matrix gives (0, -inf).
    /// A complex matrix's sign is the unit `∏ dᵢ/|dᵢ|` (with the swaps').
    fn sign_logabs(&self) -> (T, f64) {
        let mut sign = if self.swaps() % 2 == 1 { -T::ONE } else { T::ONE };
        let mut log = 0.0;
        for k in 0..self.n {
            let d = self.lu[k * self.n + k];
            if d == T::ZERO {
                return (T::ZERO, f64::NEG_INFINITY);
            }
            sign = sign * d.sgn();
            log += d.modulus().ln();
        }
        (sign, log)
    }

    /// Solves `A X = B` for `B` of `cols` columns (row-major `[n, cols]`).
    /// A singular A divides by zero, as LAPACK's `getrs` would.
    fn solve(&self, b: &[T], cols: usize) -> Vec<T> {
        let n = self.n;
        let mut x = b.to_vec();
        for (k, &p) in self.pivots.iter().enumerate() {
            if p != k {
                for j in 0..cols {
                    x.swap(k * cols + j, p * cols + j);
                }
            }
        }
        // L y = P b (unit lower), then U x = y.
        for i in 0..n {
            for k in 0..i {
                let f = self.lu[i * n + k];
                for j in 0..cols {
                    let y = x[k * cols + j];
                    x[i * cols + j] -= f * y;
                }
            }
        }
        for i in (0..n).rev() {
            for k in i + 1..n {
                let f = self.lu[i * n + k];
                for j in 0..cols {
                    let y = x[k * cols + j];
                    x[i * cols + j] -= f * y;
                }
            }
            let d = self.lu[i * n + i];
            for j in 0..cols {
                x[i * cols + j] /= d;
            }
        }
        x
    }
}

/// `P` with `A = P L U` from LAPACK's 1-based row swaps (`swaps[j]`
/// exchanged with row `j`, in order): after the swaps row `i` holds the
/// original row `perm[i]`, so `P[perm[i], i] = 1`. A swap outside `1..=m`
/// is an error.
fn permutation_matrix(swaps: &[i64], m: usize) -> Result<Vec<f64>> {
    let mut perm: Vec<usize> = (0..m).collect();
    for (j, &s) in swaps.iter().enumerate() {
        if s < 1 || s as usize > m {
            return Err(shape_err(K, format!("pivot {s} outside 1..={m}")));
        }
        perm.swap(j, s as usize - 1);
    }
    let mut p = vec![0.0; m * m];
    for (i, &r) in perm.iter().enumerate() {
        p[r * m + i] = 1.0;
    }
    Ok(p)
}

/// The lower Cholesky factor `A = L Lᴴ` (zeros above the diagonal) of the
/// matrix in `a`'s lower triangle (`potrf`: a complex diagonal's imaginary
/// part is not read) and LAPACK's info: 0, or the order of the first
/// leading minor that is not positive definite (the factor's remaining
/// columns are left zero).
fn cholesky<T: Field>(a: &[T], n: usize) -> (Vec<T>, usize) {
    let mut l = vec![T::ZERO; n * n];
    for j in 0..n {
        let d = a[j * n + j].re() - T::sum_of((0..j).map(|k| l[j * n + k] * l[j * n + k].conj())).re();
        if d <= 0.0 || d.is_nan() {
            return (l, j + 1);
        }
        let d = T::from_re(d.sqrt());
        l[j * n + j] = d;
        for i in j + 1..n {
            let s = a[i * n + j] - T::sum_of((0..j).map(|k| l[i * n + k] * l[j * n + k].conj()));
            l[i * n + j] = s / d;
        }
    }
    (l, 0)
}

/// Solves `T X = B` for triangular `T` (`[n, n]`, only its `upper` or lower
/// triangle read) and `B` `[n, cols]`.
fn tri_solve<T: Field>(t: &[T], b: &[T], n: usize, cols: usize, upper: bool, unit: bool) -> Vec<T> {
    let mut x = b.to_vec();
    let rows: Vec<usize> = if upper { (0..n).rev().collect() } else { (0..n).collect() };
    for &i in &rows {
        for k in if upper { i + 1..n } else { 0..i } {
            let f = t[i * n + k];
            for j in 0..cols {
                let y = x[k * cols + j];
                x[i * cols + j] -= f * y;
            }
        }
        if !unit {
            let d = t[i * n + i];
            for j in 0..cols {
                x[i * cols + j] /= d;
            }
        }
    }
    x
}

/// Householder QR (`geqrf` + `orgqr`): Q `[m, k]` and R `[k, n]` with `k =
/// min(m, n)`, or with `complete` Q `[m, m]` and R `[m, n]`.
fn qr<T: Field>(a: &[T], m: usize, n: usize, complete: bool) -> (Vec<T>, Vec<T>) {
    let kmax = m.min(n);
    let (reflectors, r) = householder(a, m, n);
    let qcols = if complete { m } else { kmax };
    // Q = H_0 H_1 ... applied to the first `qcols` columns of the identity.
    let mut q: Vec<T> = (0..m * qcols).map(|i| if i / qcols == i % qcols { T::ONE } else { T::ZERO }).collect();
    for (v, tau) in reflectors.iter().rev() {
        apply_reflector(&mut q, qcols, 0..m, 0, v, *tau);
    }
    let rrows = if complete { m } else { kmax };
    let rr = (0..rrows * n).map(|idx| if idx % n >= idx / n { r[idx] } else { T::ZERO }).collect();
    (q, rr)
}

/// `X ← (I − τ v vᴴ) X` on rows `rows` (where `v` may be nonzero) and the
/// columns `first..` of the row-major matrix `x` of `cols` columns
/// (nothing for `τ = 0`).
fn apply_reflector<T: Field>(x: &mut [T], cols: usize, rows: std::ops::Range<usize>, first: usize, v: &[T], tau: T) {
    if tau == T::ZERO {
        return;
    }
    for c in first..cols {
        let s = T::sum_of(rows.clone().map(|i| v[i].conj() * x[i * cols + c]));
        for i in rows.clone() {
            x[i * cols + c] -= tau * v[i] * s;
        }
    }
}

/// One Householder reflector: `v` (full length, `v[j] = 1`, zeros above)
/// and `τ`.
type Reflector<T> = (Vec<T>, T);

/// `geqrf`'s Householder reduction: the reflectors and the reduced matrix
/// (R on and above the diagonal, zeros below).
/// Each `H = I − τ v vᴴ` is `dlarfg`'s (`zlarfg`'s: `β = −sign(Re α)·‖(α,
/// x)‖` real, `τ = (β − α)/β` complex), and `Hᴴ` is applied to the
/// trailing columns, as `zgeqr2` does.
fn householder<T: Field>(a: &[T], m: usize, n: usize) -> (Vec<Reflector<T>>, Vec<T>) {
    let kmax = m.min(n);
    let mut r = a.to_vec();
    let mut reflectors: Vec<Reflector<T>> = Vec::with_capacity(kmax);
    for j in 0..kmax {
        let alpha = r[j * n + j];
        let xnorm = T::sum_of((j + 1..m).map(|i| r[i * n + j] * r[i * n + j].conj())).re().sqrt();
        // v = [1, x / (alpha - beta)], H = I - tau v v^H (dlarfg's signs).
        let mut v = vec![T::ZERO; m];
        v[j] = T::ONE;
        if xnorm == 0.0 && alpha.is_real() {
            reflectors.push((v, T::ZERO));
            continue;
        }
        let beta = -alpha.norm_with(xnorm).copysign(alpha.re());
        let tau = (T::from_re(beta) - alpha) / T::from_re(beta);
        let scale = alpha - T::from_re(beta);
        for i in j + 1..m {
            v[i] = r[i * n + j] / scale;
        }
        // Column j becomes (β, 0, ..) exactly (`zlarfg` stores β), and Hᴴ
        // is applied to the trailing columns.
        r[j * n + j] = T::from_re(beta);
        for i in j + 1..m {
            r[i * n + j] = T::ZERO;
        }
        apply_reflector(&mut r, n, j..m, j + 1, &v, tau.conj());
        reflectors.push((v, tau));
    }
    (reflectors, r)
}

/// LAPACK `geqrf`: the packed `[m, n]` (R on and above the diagonal, each
/// reflector's tail below it) and `tau`, with [`qr`]'s reflectors.
fn geqrf<T: Field>(a: &[T], m: usize, n: usize) -> (Vec<T>, Vec<T>) {
    let (reflectors, r) = householder(a, m, n);
    let mut packed = r;
    let mut tau = Vec::with_capacity(reflectors.len());
    for (j, (v, t)) in reflectors.iter().enumerate() {
        for i in j + 1..m {
            packed[i * n + j] = v[i];
        }
        tau.push(*t);
    }
    (packed, tau)
}

/// LAPACK `orgqr`/`ungqr`: the first `n` columns of `H_0 ⋯ H_{k-1}`, `H_i =
/// I − τ_i v_i v_iᴴ` with `v_i` = `[0.., 1, a[i+1.., i]]`.
fn householder_product<T: Field>(a: &[T], m: usize, n: usize, tau: &[T]) -> Vec<T> {
    let mut q: Vec<T> = (0..m * n).map(|i| if i / n == i % n { T::ONE } else { T::ZERO }).collect();
    for (i, &t) in tau.iter().enumerate().rev() {
        let v: Vec<T> = (0..m)
            .map(|r| {
                if r < i {
                    T::ZERO
                } else if r == i {
                    T::ONE
                } else {
                    a[r * n + i]
                }
            })
            .collect();
        apply_reflector(&mut q, n, i..m, 0, &v, t);
    }
    q
}

/// The eigenvalues of the symmetric (Hermitian) matrix in `a`'s lower (or
/// `upper`) triangle, ascending, and with `vectors` its eigenvectors as the
/// columns of an `[n, n]` matrix in the same order (else empty): cyclic
/// Jacobi rotations until the off-diagonal mass vanishes, the rotations
/// accumulated into the vectors. A complex entry to annihilate is first
/// made real by a phase on its column (and row); the diagonal's imaginary
/// parts are not read, as `zheevd` does not. Each vector's sign (phase)
/// follows [`fix_signs`]: LAPACK's is an accident of its algorithm.
fn eigh_symmetric<T: Field>(a: &[T], n: usize, upper: bool, vectors: bool) -> (Vec<f64>, Vec<T>) {
    let mut s: Vec<T> = (0..n * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            let from_upper = (i <= j) == upper;
            if i == j {
                T::from_re(a[idx].re())
            } else if from_upper {
                a[idx]
            } else {
                a[j * n + i].conj()
            }
        })
        .collect();
    let mut v = if vectors { identity(n) } else { Vec::new() };
    let sq = |x: T| (x * x.conj()).re();
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| sq(s[i * n + j]))
            .sum();
        let diag: f64 = (0..n).map(|i| sq(s[i * n + i])).sum();
        if off <= f64::EPSILON * f64::EPSILON * diag || off == 0.0 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let mut apq = s[p * n + q];
                if apq == T::ZERO {
                    continue;
                }
                if !apq.is_real() {
                    // D = diag(.., conj(u) at q, ..), u = apq / |apq|: Dᴴ S D
                    // has the real |apq| at (p, q).
                    let u = apq.sgn();
                    for k in 0..n {
                        s[k * n + q] = s[k * n + q] * u.conj();
                    }
                    for k in 0..n {
                        s[q * n + k] = s[q * n + k] * u;
                    }
                    if vectors {
                        for k in 0..n {
                            v[k * n + q] = v[k * n + q] * u.conj();
                        }
                    }
                    s[q * n + q] = T::from_re(s[q * n + q].re());
                    apq = T::from_re(apq.modulus());
                    s[p * n + q] = apq;
                    s[q * n + p] = apq;
                }
                let apq = apq.re();
                let theta = (s[q * n + q].re() - s[p * n + p].re()) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let sn = t * c;
                rotate_columns(&mut s, n, n, p, q, c, sn);
                let (cc, ss) = (T::from_re(c), T::from_re(sn));
                for k in 0..n {
                    let (spk, sqk) = (s[p * n + k], s[q * n + k]);
                    s[p * n + k] = cc * spk - ss * sqk;
                    s[q * n + k] = ss * spk + cc * sqk;
                }
                if vectors {
                    rotate_columns(&mut v, n, n, p, q, c, sn);
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| s[i * n + i].re().total_cmp(&s[j * n + j].re()));
    let w = order.iter().map(|&i| s[i * n + i].re()).collect();
    if !vectors {
        return (w, Vec::new());
    }
    let mut cols: Vec<Vec<T>> = order.iter().map(|&j| (0..n).map(|i| v[i * n + j]).collect()).collect();
    fix_signs(&mut cols, None);
    (w, from_columns(&cols, n))
}

/// Column `p` ← `c·p − s·q` and column `q` ← `s·p + c·q` of the row-major
/// `[rows, cols]` matrix `x`: one Jacobi/Givens rotation.
fn rotate_columns<T: Field>(x: &mut [T], rows: usize, cols: usize, p: usize, q: usize, c: f64, s: f64) {
    let (c, s) = (T::from_re(c), T::from_re(s));
    for k in 0..rows {
        let (xp, xq) = (x[k * cols + p], x[k * cols + q]);
        x[k * cols + p] = c * xp - s * xq;
        x[k * cols + q] = s * xp + c * xq;
    }
}

/// The row-major `[rows, cols.len()]` matrix with `cols` as its columns.
fn from_columns<T: Copy>(cols: &[Vec<T>], rows: usize) -> Vec<T> {
    (0..rows * cols.len()).map(|i| cols[i % cols.len()][i / cols.len()]).collect()
}

/// kiln's sign convention for vectors that are only defined up to sign
/// (eigenvectors, singular vector pairs): each vector's entry of largest
/// magnitude (the first among equals) is positive (for a complex vector,
/// real and positive: the vector times that entry's conjugate phase).
/// `partners[j]` flips with vector `j` (a left singular vector with its
/// right one).
fn fix_signs<T: Field>(vectors: &mut [Vec<T>], mut partners: Option<&mut [Vec<T>]>) {
    for (j, v) in vectors.iter_mut().enumerate() {
        let lead = v.iter().fold(T::ZERO, |best, &x| if x.modulus() > best.modulus() { x } else { best });
        if lead == T::ZERO || (lead.is_real() && lead.re() > 0.0) {
            continue;
        }
        let phase = lead.sgn().conj();
        v.iter_mut().for_each(|x| *x = *x * phase);
        if let Some(p) = partners.as_deref_mut().and_then(|p| p.get_mut(j)) {
            p.iter_mut().for_each(|x| *x = *x * phase);
        }
    }
}

/// A singular value decomposition `A = U diag(s) Vh` of an `[m, n]`
/// matrix: `s` descending (`k = min(m, n)` values), `u` `[m, k]` and `vh`
/// `[k, n]` row-major, or with `full` `[m, m]` and `[n, n]`.
struct Svd<T> {
    u: Vec<T>,
    s: Vec<f64>,
    vh: Vec<T>,
}

/// One-sided Jacobi (Hestenes): rotations of A's columns, accumulated into
/// V, until every pair of columns is orthogonal to working precision; the
/// column norms are the singular values (to high relative accuracy — at
/// least LAPACK's bidiagonal QR's), the normalised columns U. A wide matrix
/// is decomposed through its transpose. Vectors whose singular value is
/// negligible (below `max(m, n)·ε·s₀`, where `A`'s column carries no
/// direction) and the columns `full` adds are completed to an orthonormal
/// basis. Signs: [`fix_signs`] on the singular vectors of the shorter side
/// (V of a tall matrix, U of a wide one), their partners flipped with them.
fn svd<T: Field>(a: &[T], m: usize, n: usize, full: bool) -> Svd<T> {
    if m < n {
        // Aᴴ = U' S V'ᴴ  =>  A = V' S U'ᴴ.
        let t = svd(&conj_transpose(a, m, n), n, m, full);
        return Svd { u: conj_transpose(&t.vh, m, m), s: t.s, vh: conj_transpose(&t.u, n, if full { n } else { m }) };
    }
    // m >= n: W's rows are A's columns (contiguous for the rotations).
    let mut w: Vec<Vec<T>> = (0..n).map(|j| (0..m).map(|i| a[i * n + j]).collect()).collect();
    let mut v: Vec<Vec<T>> = (0..n).map(|j| (0..n).map(|i| if i == j { T::ONE } else { T::ZERO }).collect()).collect();
    // ⟨x, y⟩ = xᴴ y.
    let dot = |x: &[T], y: &[T]| T::sum_of(x.iter().zip(y).map(|(a, b)| a.conj() * *b));
    for _sweep in 0..80 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (alpha, beta, mut gamma) = (dot(&w[p], &w[p]).re(), dot(&w[q], &w[q]).re(), dot(&w[p], &w[q]));
                if gamma == T::ZERO || gamma.modulus() <= f64::EPSILON * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                if !gamma.is_real() {
                    // Column q times conj(u), u = γ/|γ|, makes ⟨w_p, w_q⟩ real.
                    let u = gamma.sgn().conj();
                    for x in [&mut w, &mut v] {
                        x[q].iter_mut().for_each(|e| *e = *e * u);
                    }
                    gamma = T::from_re(gamma.modulus());
                }
                let zeta = (beta - alpha) / (2.0 * gamma.re());
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let t = if zeta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                let (c, s) = (T::from_re(c), T::from_re(s));
                for x in [&mut w, &mut v] {
                    let (lo, hi) = x.split_at_mut(q);
                    for (xp, xq) in lo[p].iter_mut().zip(hi[0].iter_mut()) {
                        let (a, b) = (*xp, *xq);
                        *xp = c * a - s * b;
                        *xq = s * a + c * b;
                    }
                }
            }
        }
        if !rotated {
            break;
        }
    }
    let norms: Vec<f64> = w.iter().map(|c| dot(c, c).re().sqrt()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| norms[j].total_cmp(&norms[i]));
    let s: Vec<f64> = order.iter().map(|&j| norms[j]).collect();
    let negligible = s.first().copied().unwrap_or(0.0) * f64::EPSILON * m as f64;
    let mut vcols: Vec<Vec<T>> = order.iter().map(|&j| v[j].clone()).collect();
    let mut ucols: Vec<Vec<T>> = Vec::with_capacity(m);
    for (&j, &sj) in order.iter().zip(&s) {
        let sj_t = T::from_re(sj);
        ucols.push(if sj > negligible { w[j].iter().map(|&x| x / sj_t).collect() } else { Vec::new() });
    }
    complete_basis(&mut ucols, m, if full { m } else { n });
    fix_signs(&mut vcols, Some(&mut ucols[..n]));
    // Vh = Vᴴ.
    Svd { u: from_columns(&ucols, m), s, vh: (0..n * n).map(|i| vcols[i / n][i % n].conj()).collect() }
}

/// Fills the empty vectors of `cols` and appends vectors up to `count`, so
/// that all are orthonormal in R^`dim`: each new one is the unit vector
/// `e_i` farthest from the span so far, Gram–Schmidt'ed twice against it.
fn complete_basis<T: Field>(cols: &mut Vec<Vec<T>>, dim: usize, count: usize) {
    cols.resize(count, Vec::new());
    for j in 0..count {
        if !cols[j].is_empty() {
            continue;
        }
        let residual = |e: usize, cols: &[Vec<T>]| {
            let mut r: Vec<T> = (0..dim).map(|i| if i == e { T::ONE } else { T::ZERO }).collect();
            for _ in 0..2 {
                for c in cols.iter().filter(|c| !c.is_empty()) {
                    let d = T::sum_of(c.iter().zip(&r).map(|(a, b)| a.conj() * *b));
                    r.iter_mut().zip(c).for_each(|(x, y)| *x -= d * *y);
                }
            }
            r
        };
        let norm = |r: &[T]| r.iter().map(|x| (*x * x.conj()).re()).sum::<f64>().sqrt();
        // The first of the farthest, so an empty start gives the identity.
        let best = (0..dim).map(|e| residual(e, cols)).fold(None, |best: Option<Vec<T>>, r| match best {
            Some(b) if norm(&b) >= norm(&r) => Some(b),
            _ => Some(r),
        });
        if let Some(r) = best {
            let len = T::from_re(norm(&r));
            cols[j] = r.iter().map(|&x| x / len).collect();
        }
    }
}

// ------------------------------------------------------------ scalars

/// The scalars the generic factorizations run on: f64, and [`C64`] for a
/// complex instruction. For f64 every operation is the plain one, so the
/// real results are those of the f64-only code.
trait Field:
    Copy
    + PartialEq
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::SubAssign
    + std::ops::DivAssign
{
    const ZERO: Self;
    const ONE: Self;
    fn from_re(x: f64) -> Self;
    /// The conjugate (itself for a real).
    fn conj(self) -> Self;
    /// The modulus.
    fn modulus(self) -> f64;
    /// LAPACK's pivot magnitude: `|re| + |im|` (`dcabs1`), `|x|` for a real.
    fn abs1(self) -> f64;
    fn re(self) -> f64;
    /// `x / |x|` (`sgn`; the sign of a real), 0 for 0.
    fn sgn(self) -> Self;
    /// The sum, in order (f64's own `Sum` for a real).
    fn sum_of(it: impl Iterator<Item = Self>) -> Self;
    /// `‖(self, x)‖₂` (`hypot`; `dlapy3` of the parts and `x` for a complex).
    fn norm_with(self, x: f64) -> f64;
    /// Whether the imaginary part is zero (always for a real).
    fn is_real(self) -> bool;
}

impl Field for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn from_re(x: f64) -> f64 {
        x
    }
    fn conj(self) -> f64 {
        self
    }
    fn modulus(self) -> f64 {
        self.abs()
    }
    fn abs1(self) -> f64 {
        self.abs()
    }
    fn re(self) -> f64 {
        self
    }
    fn sgn(self) -> f64 {
        self.signum()
    }
    fn sum_of(it: impl Iterator<Item = f64>) -> f64 {
        it.sum()
    }
    fn norm_with(self, x: f64) -> f64 {
        self.hypot(x)
    }
    fn is_real(self) -> bool {
        true
    }
}

/// A complex number in f64 (a complex instruction's working type; complex64
/// data is widened to it, as real f32 data is to f64).
#[derive(Copy, Clone, Debug, PartialEq, Default)]
struct C64 {
    re: f64,
    im: f64,
}

impl C64 {
    const fn new(re: f64, im: f64) -> C64 {
        C64 { re, im }
    }
}

impl std::ops::Add for C64 {
    type Output = C64;
    fn add(self, o: C64) -> C64 {
        C64::new(self.re + o.re, self.im + o.im)
    }
}

impl std::ops::Sub for C64 {
    type Output = C64;
    fn sub(self, o: C64) -> C64 {
        C64::new(self.re - o.re, self.im - o.im)
    }
}

impl std::ops::Mul for C64 {
    type Output = C64;
    fn mul(self, o: C64) -> C64 {
        C64::new(self.re * o.re - self.im * o.im, self.re * o.im + self.im * o.re)
    }
}

impl std::ops::Div for C64 {
    type Output = C64;
    /// Smith's division (no overflow for large parts of `o`).
    fn div(self, o: C64) -> C64 {
        if o.im == 0.0 {
            return C64::new(self.re / o.re, self.im / o.re);
        }
        if o.re.abs() >= o.im.abs() {
            let r = o.im / o.re;
            let d = o.re + o.im * r;
            C64::new((self.re + self.im * r) / d, (self.im - self.re * r) / d)
        } else {
            let r = o.re / o.im;
            let d = o.re * r + o.im;
            C64::new((self.re * r + self.im) / d, (self.im * r - self.re) / d)
        }
    }
}

impl std::ops::Neg for C64 {
    type Output = C64;
    fn neg(self) -> C64 {
        C64::new(-self.re, -self.im)
    }
}

impl std::ops::SubAssign for C64 {
    fn sub_assign(&mut self, o: C64) {
        *self = *self - o;
    }
}

impl std::ops::DivAssign for C64 {
    fn div_assign(&mut self, o: C64) {
        *self = *self / o;
    }
}

impl Field for C64 {
    const ZERO: C64 = C64::new(0.0, 0.0);
    const ONE: C64 = C64::new(1.0, 0.0);
    fn from_re(x: f64) -> C64 {
        C64::new(x, 0.0)
    }
    fn conj(self) -> C64 {
        C64::new(self.re, -self.im)
    }
    fn modulus(self) -> f64 {
        self.re.hypot(self.im)
    }
    fn abs1(self) -> f64 {
        self.re.abs() + self.im.abs()
    }
    fn re(self) -> f64 {
        self.re
    }
    fn sgn(self) -> C64 {
        let r = self.modulus();
        if r == 0.0 {
            C64::ZERO
        } else {
            C64::new(self.re / r, self.im / r)
        }
    }
    fn sum_of(it: impl Iterator<Item = C64>) -> C64 {
        it.fold(C64::ZERO, |s, x| s + x)
    }
    fn norm_with(self, x: f64) -> f64 {
        self.re.hypot(self.im).hypot(x)
    }
    fn is_real(self) -> bool {
        self.im == 0.0
    }
}
