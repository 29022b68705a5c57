//! The linalg kernels against identities that hold whatever LAPACK does:
//! A·A⁻¹ = I, Q·R = A with Q orthonormal, L·Lᵀ = A, det of a triangular
//! matrix, eigenvalues of a rotated diagonal; and bad shapes as errors.

use kiln_kernels::{linalg, DType, LinalgFlags, LinalgOp, TensorMut, TensorRef};

fn run(op: LinalgOp, flags: LinalgFlags, ins: &[(&[f64], &[usize])], out_shape: &[usize]) -> Result<Vec<f64>, String> {
    // f64 storage keeps the bytes aligned, as the runtime's arena does.
    let refs: Vec<TensorRef> =
        ins.iter().map(|(v, s)| TensorRef { dtype: DType::F64, shape: s, data: bytemuck::cast_slice(v) }).collect();
    let mut out = vec![0f64; out_shape.iter().product::<usize>()];
    let data = bytemuck::cast_slice_mut(&mut out);
    linalg(op, flags, &refs, TensorMut { dtype: DType::F64, shape: out_shape, data }).map_err(|e| e.to_string())?;
    Ok(out)
}

fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    (0..m * n).map(|i| (0..k).map(|p| a[(i / n) * k + p] * b[p * n + i % n]).sum()).collect()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

const A: [f64; 9] = [4.0, -2.0, 1.0, 3.0, 6.0, -4.0, 2.0, 1.0, 8.0];

#[test]
fn inverse_solve_and_det() {
    let f = LinalgFlags::default();
    let inv = run(LinalgOp::Inv, f, &[(&A, &[3, 3])], &[3, 3]).unwrap();
    close(&matmul(&A, &inv, 3, 3, 3), &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], 1e-12);
    let det = run(LinalgOp::Det, f, &[(&A, &[3, 3])], &[]).unwrap();
    // 4(48 + 4) + 2(24 + 8) + (3 - 12)
    close(&det, &[263.0], 1e-9);
    let b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let x = run(LinalgOp::Solve, LinalgFlags { left: true, ..f }, &[(&A, &[3, 3]), (&b, &[3, 2])], &[3, 2]).unwrap();
    close(&matmul(&A, &x, 3, 3, 2), &b, 1e-12);
    // X A = B with B 2x3.
    let xr = run(LinalgOp::Solve, f, &[(&A, &[3, 3]), (&b, &[2, 3])], &[2, 3]).unwrap();
    close(&matmul(&xr, &A, 2, 3, 3), &b, 1e-12);
}

#[test]
fn singular_and_not_positive_definite_infos() {
    let f = LinalgFlags::default();
    let singular = [1.0, 2.0, 2.0, 4.0];
    let info = run(LinalgOp::LuInfo, f, &[(&singular, &[2, 2])], &[]);
    // i32 output: check through an f64-sized buffer is wrong, so use i64 pivots' sibling below.
    assert!(info.is_err(), "an i32 result written as f64 must be refused, not reinterpreted");
    let not_pd = [1.0, 2.0, 2.0, 1.0];
    let l = run(LinalgOp::Cholesky, f, &[(&not_pd, &[2, 2])], &[2, 2]).unwrap();
    assert_eq!(l[3], 0.0, "the factor stops at the failing minor");
    let slog = run(LinalgOp::LogAbsDet, f, &[(&singular, &[2, 2])], &[]).unwrap();
    assert_eq!(slog[0], f64::NEG_INFINITY);
}

#[test]
fn qr_cholesky_triangular_and_eigenvalues() {
    let f = LinalgFlags::default();
    let m = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 3x2
    let q = run(LinalgOp::QrQ, f, &[(&m, &[3, 2])], &[3, 2]).unwrap();
    let r = run(LinalgOp::QrR, f, &[(&m, &[3, 2])], &[2, 2]).unwrap();
    close(&matmul(&q, &r, 3, 2, 2), &m, 1e-12);
    let qt: Vec<f64> = (0..6).map(|i| q[(i % 3) * 2 + i / 3]).collect();
    close(&matmul(&qt, &q, 2, 3, 2), &[1.0, 0.0, 0.0, 1.0], 1e-12);
    assert!(r[2].abs() < 1e-15, "R is upper triangular");
    // LAPACK's sign: R[0][0] = -sign(a00) * |column|.
    assert!(r[0] < 0.0);

    let spd = [4.0, 2.0, 2.0, 3.0];
    let l = run(LinalgOp::Cholesky, f, &[(&spd, &[2, 2])], &[2, 2]).unwrap();
    let lt = [l[0], l[2], l[1], l[3]];
    close(&matmul(&l, &lt, 2, 2, 2), &spd, 1e-12);
    let b = [1.0, 2.0];
    let x = run(LinalgOp::CholeskySolve, f, &[(&l, &[2, 2]), (&b, &[2, 1])], &[2, 1]).unwrap();
    close(&matmul(&spd, &x, 2, 2, 1), &b, 1e-12);
    let u = [2.0, 1.0, 0.0, 4.0];
    let up = LinalgFlags { upper: true, left: true, unit: false, complex: false };
    let x = run(LinalgOp::TriangularSolve, up, &[(&u, &[2, 2]), (&b, &[2, 1])], &[2, 1]).unwrap();
    close(&matmul(&u, &x, 2, 2, 1), &b, 1e-12);

    // R diag(1, 2, 5) Rᵀ for a rotation R about z.
    let (c, s) = (0.6, 0.8);
    let rot = [c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0];
    let d = [1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 5.0];
    let rt: Vec<f64> = (0..9).map(|i| rot[(i % 3) * 3 + i / 3]).collect();
    let sym = matmul(&matmul(&rot, &d, 3, 3, 3), &rt, 3, 3, 3);
    let w = run(LinalgOp::EigvalsH, f, &[(&sym, &[3, 3])], &[3]).unwrap();
    close(&w, &[1.0, 2.0, 5.0], 1e-12);
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let f = LinalgFlags::default();
    assert!(run(LinalgOp::Inv, f, &[(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])], &[2, 3]).is_err());
    assert!(run(LinalgOp::Det, f, &[(&[1.0, 2.0], &[2])], &[]).is_err());
    assert!(run(LinalgOp::Solve, f, &[(&A, &[3, 3])], &[3, 1]).is_err(), "no right-hand side");
    assert!(run(LinalgOp::Solve, f, &[(&A, &[3, 3]), (&[1.0; 4], &[2, 2])], &[2, 2]).is_err());
    assert!(run(LinalgOp::TriangularSolve, f, &[(&A, &[3, 3]), (&[1.0; 3], &[3])], &[3]).is_err());
    assert!(run(LinalgOp::Inv, f, &[(&A, &[4, 4])], &[4, 4]).is_err(), "shape larger than the data");
    // Empty matrices are fine: det of a 0x0 matrix is 1.
    assert_eq!(run(LinalgOp::Det, f, &[(&[], &[0, 0])], &[]).unwrap(), vec![1.0]);
}

fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols).map(|i| a[(i % rows) * cols + i / rows]).collect()
}

/// Checks `A = U diag(s) Vh`, `s` descending and non-negative, U's columns
/// and Vh's rows orthonormal, and kiln's sign convention.
fn check_svd(a: &[f64], m: usize, n: usize, full: bool) {
    let f = LinalgFlags::default();
    let k = m.min(n);
    let (uc, vr) = if full { (m, n) } else { (k, k) };
    let (u_op, vh_op) =
        if full { (LinalgOp::SvdUFull, LinalgOp::SvdVhFull) } else { (LinalgOp::SvdU, LinalgOp::SvdVh) };
    let s = run(LinalgOp::SvdS, f, &[(a, &[m, n])], &[k]).unwrap();
    let u = run(u_op, f, &[(a, &[m, n])], &[m, uc]).unwrap();
    let vh = run(vh_op, f, &[(a, &[m, n])], &[vr, n]).unwrap();
    assert!(s.windows(2).all(|w| w[0] >= w[1]) && s.iter().all(|&x| x >= 0.0), "{s:?}");
    // U[:, :k] diag(s) Vh[:k, :] = A.
    let us: Vec<f64> = (0..m * k).map(|i| u[(i / k) * uc + i % k] * s[i % k]).collect();
    close(&matmul(&us, &vh[..k * n], m, k, n), a, 1e-12);
    let eye = |d: usize| -> Vec<f64> { (0..d * d).map(|i| if i / d == i % d { 1.0 } else { 0.0 }).collect() };
    close(&matmul(&transpose(&u, m, uc), &u, uc, m, uc), &eye(uc), 1e-12);
    close(&matmul(&vh, &transpose(&vh, vr, n), vr, n, vr), &eye(vr), 1e-12);
    // The shorter side's vectors have their largest entry positive.
    for j in 0..k {
        let v: Vec<f64> =
            if m >= n { vh[j * n..(j + 1) * n].to_vec() } else { (0..m).map(|i| u[i * uc + j]).collect() };
        let lead = v.iter().fold(0.0f64, |b, &x| if x.abs() > b.abs() { x } else { b });
        assert!(lead > 0.0, "vector {j}: {v:?}");
    }
}

#[test]
fn singular_value_decompositions() {
    let tall = [1.0, 2.0, 3.0, 4.0, 5.0, 6.5, -1.0, 0.5]; // 4x2
    for full in [false, true] {
        check_svd(&tall, 4, 2, full);
        check_svd(&tall, 2, 4, full);
        check_svd(&A, 3, 3, full);
        // Rank 1: the zero singular value's vectors are completed.
        check_svd(&[1.0, 2.0, 2.0, 4.0, 3.0, 6.0], 3, 2, full);
        check_svd(&[0.0; 6], 2, 3, full);
    }
    // diag(3, -5) has singular values 5, 3.
    let s = run(LinalgOp::SvdS, LinalgFlags::default(), &[(&[3.0, 0.0, 0.0, -5.0], &[2, 2])], &[2]).unwrap();
    close(&s, &[5.0, 3.0], 1e-15);
    // An empty matrix has no singular values; its full U is the identity.
    assert!(run(LinalgOp::SvdS, LinalgFlags::default(), &[(&[], &[2, 0])], &[0]).unwrap().is_empty());
    let u = run(LinalgOp::SvdUFull, LinalgFlags::default(), &[(&[], &[2, 0])], &[2, 2]).unwrap();
    close(&u, &[1.0, 0.0, 0.0, 1.0], 0.0);
}

#[test]
fn symmetric_eigenvectors() {
    let sym = [4.0, 1.0, -2.0, 1.0, 3.0, 0.5, -2.0, 0.5, -1.0];
    let f = LinalgFlags::default();
    let w = run(LinalgOp::EigvalsH, f, &[(&sym, &[3, 3])], &[3]).unwrap();
    let v = run(LinalgOp::EigvecsH, f, &[(&sym, &[3, 3])], &[3, 3]).unwrap();
    assert!(w.windows(2).all(|p| p[0] <= p[1]));
    // A V = V diag(w), V orthonormal, each column's largest entry positive.
    let vw: Vec<f64> = (0..9).map(|i| v[i] * w[i % 3]).collect();
    close(&matmul(&sym, &v, 3, 3, 3), &vw, 1e-12);
    close(&matmul(&transpose(&v, 3, 3), &v, 3, 3, 3), &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], 1e-12);
    for j in 0..3 {
        let lead = (0..3).map(|i| v[i * 3 + j]).fold(0.0f64, |b, x| if x.abs() > b.abs() { x } else { b });
        assert!(lead > 0.0);
    }
    // Only the named triangle is read.
    let mut lower = sym;
    (lower[1], lower[2], lower[5]) = (99.0, 99.0, 99.0);
    close(&run(LinalgOp::EigvecsH, f, &[(&lower, &[3, 3])], &[3, 3]).unwrap(), &v, 1e-12);
}

#[test]
fn pivots_give_the_permutation_of_a_equals_p_l_u() {
    let f = LinalgFlags::default();
    // Pivoting moves row 2 (largest |a_i0|) first.
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0];
    let lu = run(LinalgOp::LuFactor, f, &[(&a, &[3, 3])], &[3, 3]).unwrap();
    let pivots: Vec<i32> = vec![3, 3, 3];
    let refs = [
        TensorRef { dtype: DType::F64, shape: &[3, 3], data: bytemuck::cast_slice(&lu) },
        TensorRef { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice(&pivots) },
    ];
    let mut p = vec![0f64; 9];
    linalg(
        LinalgOp::PivotsToPermutation,
        f,
        &refs,
        TensorMut { dtype: DType::F64, shape: &[3, 3], data: bytemuck::cast_slice_mut(&mut p) },
    )
    .unwrap();
    // Swaps (0↔2), (1↔2), (2↔2): rows now hold originals [2, 0, 1], so P[2][0] = P[0][1] = P[1][2] = 1.
    assert_eq!(p, vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    let l: Vec<f64> = (0..9)
        .map(|i| {
            if i / 3 == i % 3 {
                1.0
            } else if i / 3 > i % 3 {
                lu[i]
            } else {
                0.0
            }
        })
        .collect();
    let u: Vec<f64> = (0..9).map(|i| if i / 3 <= i % 3 { lu[i] } else { 0.0 }).collect();
    let got_pivots_match = matmul(&p, &matmul(&l, &u, 3, 3, 3), 3, 3, 3);
    // The factor's own pivots for this matrix are [3, 3, 3] (checked through P L U = A).
    close(&got_pivots_match, &a, 1e-12);
    // A pivot outside 1..=m is an error.
    let bad: Vec<i32> = vec![4, 1, 1];
    let refs = [refs[0], TensorRef { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice(&bad) }];
    let out = TensorMut { dtype: DType::F64, shape: &[3, 3], data: bytemuck::cast_slice_mut(&mut p) };
    assert!(linalg(LinalgOp::PivotsToPermutation, f, &refs, out).is_err());
}

/// LDLᵀ with Bunch–Kaufman pivoting, the pivots LAPACK's `dsytrf` gives
/// (checked against torch's MKL for these matrices): a 1×1 pivot that
/// swaps the largest diagonal in first, and a 2×2 block forced by a zero
/// diagonal; the solve from the factors reproduces B. Pivots that describe
/// no factorization are errors, not panics.
#[test]
fn ldl_factor_and_solve() {
    let f = LinalgFlags::default();
    let b = [1.0, -2.0, 0.5, 3.0, 2.0, 1.0];
    for (a, want) in [
        ([0.0, 1.0, 2.0, 1.0, 0.0, 3.0, 2.0, 3.0, 4.0], [3, 2, 3]),
        ([0.0, 1.0, 0.5, 1.0, 0.0, 0.25, 0.5, 0.25, 2.0], [-2, -2, 3]),
    ] {
        let ld = run(LinalgOp::LdlFactor, f, &[(&a, &[3, 3])], &[3, 3]).unwrap();
        let pivots: Vec<i32> = {
            let refs = [TensorRef { dtype: DType::F64, shape: &[3, 3], data: bytemuck::cast_slice(&a) }];
            let mut p = vec![0i32; 3];
            let out = TensorMut { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice_mut(&mut p) };
            linalg(LinalgOp::LdlPivots, f, &refs, out).unwrap();
            p
        };
        assert_eq!(pivots, want);
        assert!(ld[1] == 0.0 && ld[2] == 0.0 && ld[5] == 0.0, "upper triangle zero: {ld:?}");
        let solve = |pivots: &[i32]| {
            let refs = [
                TensorRef { dtype: DType::F64, shape: &[3, 3], data: bytemuck::cast_slice(&ld) },
                TensorRef { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice(pivots) },
                TensorRef { dtype: DType::F64, shape: &[3, 2], data: bytemuck::cast_slice(&b) },
            ];
            let mut x = vec![0f64; 6];
            let out = TensorMut { dtype: DType::F64, shape: &[3, 2], data: bytemuck::cast_slice_mut(&mut x) };
            linalg(LinalgOp::LdlSolve, f, &refs, out).map(|_| x)
        };
        close(&matmul(&a, &solve(&pivots).unwrap(), 3, 3, 2), &b, 1e-12);
        for bad in [[0, 1, 1], [4, 1, 1], [-2, 1, 3], [1, 2, -3]] {
            assert!(solve(&bad).is_err(), "pivots {bad:?}");
        }
    }
}

/// Runs a complex instruction (`flags.complex`) on interleaved (re, im)
/// f64 operands; `out_shape` includes the pair dim when the result is
/// complex.
fn run_complex(
    op: LinalgOp,
    flags: LinalgFlags,
    ins: &[(&[f64], &[usize])],
    out_shape: &[usize],
) -> Result<Vec<f64>, String> {
    run(op, LinalgFlags { complex: true, ..flags }, ins, out_shape)
}

/// Complex `[m, k] × [k, n]` on interleaved pairs.
fn cmatmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; 2 * m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let (ar, ai) = (a[2 * (i * k + p)], a[2 * (i * k + p) + 1]);
                let (br, bi) = (b[2 * (p * n + j)], b[2 * (p * n + j) + 1]);
                out[2 * (i * n + j)] += ar * br - ai * bi;
                out[2 * (i * n + j) + 1] += ar * bi + ai * br;
            }
        }
    }
    out
}

/// The conjugate transpose of an interleaved `[rows, cols]` matrix.
fn cadjoint(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; 2 * rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            out[2 * (j * rows + i)] = a[2 * (i * cols + j)];
            out[2 * (j * rows + i) + 1] = -a[2 * (i * cols + j) + 1];
        }
    }
    out
}

/// `[[3, 1, 0], [2+2i, i, 1], [0, 1, 2−i]]`.
const Z: [f64; 18] = [3.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0, -1.0];

/// Complex LU as LAPACK's `zgetrf` (torch 2.15, complex128): the pivot is
/// the largest `|re| + |im|` (2+2i over 3, though |2+2i| < 3), and torch's
/// pivots, LU, det and slogdet for this matrix.
#[test]
fn complex_lu_det_and_slogdet_match_torch() {
    let f = LinalgFlags::default();
    let lu = run_complex(LinalgOp::LuFactor, f, &[(&Z, &[3, 3, 2])], &[3, 3, 2]).unwrap();
    let torch_lu = [2.0, 2.0, 0.0, 1.0, 1.0, 0.0, 0.75, -0.75, 0.25, -0.75, -0.75, 0.75, 0.0, 0.0, 0.4, 1.2, 3.2, -0.4];
    close(&lu, &torch_lu, 1e-12);
    let refs = [TensorRef { dtype: DType::F64, shape: &[3, 3, 2], data: bytemuck::cast_slice(&Z) }];
    let mut piv = vec![0i32; 3];
    let out = TensorMut { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice_mut(&mut piv) };
    linalg(LinalgOp::LuPivots, LinalgFlags { complex: true, ..f }, &refs, out).unwrap();
    assert_eq!(piv, [2, 2, 3]);
    // P L U = A.
    let mut l = vec![0.0; 18];
    let mut u = vec![0.0; 18];
    for i in 0..3 {
        for j in 0..3 {
            let at = 2 * (i * 3 + j);
            if i > j {
                l[at..at + 2].copy_from_slice(&lu[at..at + 2]);
            } else {
                u[at..at + 2].copy_from_slice(&lu[at..at + 2]);
            }
        }
        l[2 * (i * 3 + i)] = 1.0;
    }
    let mut pa = cmatmul(&l, &u, 3, 3, 3);
    for (k, &p) in piv.iter().enumerate().rev() {
        for c in 0..6 {
            pa.swap(k * 6 + c, (p as usize - 1) * 6 + c);
        }
    }
    close(&pa, &Z, 1e-12);
    close(&run_complex(LinalgOp::Det, f, &[(&Z, &[3, 3, 2])], &[2]).unwrap(), &[-6.0, 4.0], 1e-12);
    let sign = run_complex(LinalgOp::SignDet, f, &[(&Z, &[3, 3, 2])], &[2]).unwrap();
    let r = 52f64.sqrt();
    close(&sign, &[-6.0 / r, 4.0 / r], 1e-12);
    let log_abs = run_complex(LinalgOp::LogAbsDet, f, &[(&Z, &[3, 3, 2])], &[]).unwrap();
    close(&log_abs, &[r.ln()], 1e-12);
    // A singular matrix: sign 0, log|det| −inf.
    let singular = [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0];
    assert_eq!(run_complex(LinalgOp::SignDet, f, &[(&singular, &[2, 2, 2])], &[2]).unwrap(), [0.0, 0.0]);
    assert_eq!(run_complex(LinalgOp::LogAbsDet, f, &[(&singular, &[2, 2, 2])], &[]).unwrap(), [f64::NEG_INFINITY]);
    // A complex operand needs its pair dim, and a complex result its own.
    assert!(run_complex(LinalgOp::Det, f, &[(&Z[..9], &[3, 3])], &[]).is_err());
    assert!(run_complex(LinalgOp::Det, f, &[(&Z, &[3, 3, 2])], &[1]).is_err());
    assert!(run_complex(LinalgOp::PivotsToPermutation, f, &[(&Z, &[3, 3, 2])], &[3, 3, 2]).is_err());
}

/// Complex Cholesky `A = L Lᴴ` of a Hermitian positive definite matrix
/// (`U = Lᴴ` with `upper`), the solves from it, triangular solves on both
/// sides; and torch's info for a Hermitian matrix that is not positive
/// definite (`[[1, 2i], [−2i, 1]]`: its second leading minor).
#[test]
fn complex_cholesky_and_triangular_solves() {
    let f = LinalgFlags::default();
    // A = M Mᴴ + I.
    let m = [1.0, 0.5, 0.0, -1.0, 2.0, 0.0, 0.5, 0.0, 1.0, 1.0, -1.0, 0.0, 0.0, 2.0, 1.0, 0.0, 3.0, -0.5];
    let mut a = cmatmul(&m, &cadjoint(&m, 3, 3), 3, 3, 3);
    for i in 0..3 {
        a[2 * (i * 3 + i)] += 1.0;
    }
    let l = run_complex(LinalgOp::Cholesky, f, &[(&a, &[3, 3, 2])], &[3, 3, 2]).unwrap();
    close(&cmatmul(&l, &cadjoint(&l, 3, 3), 3, 3, 3), &a, 1e-12);
    for i in 0..3 {
        assert!(l[2 * (i * 3 + i)] > 0.0 && l[2 * (i * 3 + i) + 1] == 0.0, "a real positive diagonal");
        for j in i + 1..3 {
            assert_eq!(&l[2 * (i * 3 + j)..2 * (i * 3 + j) + 2], &[0.0, 0.0]);
        }
    }
    let upper = LinalgFlags { upper: true, ..f };
    let u = run_complex(LinalgOp::Cholesky, upper, &[(&a, &[3, 3, 2])], &[3, 3, 2]).unwrap();
    close(&u, &cadjoint(&l, 3, 3), 0.0);
    let b = [1.0, 0.0, 0.0, 1.0, 2.0, -1.0, 0.5, 0.5, -1.0, 3.0, 0.0, 0.0];
    let x = run_complex(LinalgOp::CholeskySolve, f, &[(&l, &[3, 3, 2]), (&b, &[3, 2, 2])], &[3, 2, 2]).unwrap();
    close(&cmatmul(&a, &x, 3, 3, 2), &b, 1e-12);
    let x = run_complex(LinalgOp::CholeskySolve, upper, &[(&u, &[3, 3, 2]), (&b, &[3, 2, 2])], &[3, 2, 2]).unwrap();
    close(&cmatmul(&a, &x, 3, 3, 2), &b, 1e-12);
    // L X = B and X U = Bᵀ-shaped, the triangles as given.
    let left = LinalgFlags { left: true, ..f };
    let x = run_complex(LinalgOp::TriangularSolve, left, &[(&l, &[3, 3, 2]), (&b, &[3, 2, 2])], &[3, 2, 2]).unwrap();
    close(&cmatmul(&l, &x, 3, 3, 2), &b, 1e-12);
    let bt = cadjoint(&b, 3, 2);
    let x = run_complex(LinalgOp::TriangularSolve, upper, &[(&u, &[3, 3, 2]), (&bt, &[2, 3, 2])], &[2, 3, 2]).unwrap();
    close(&cmatmul(&x, &u, 2, 3, 3), &bt, 1e-12);
    // Not positive definite: info 2, as torch's zpotrf gives.
    let h = [1.0, 0.0, 0.0, 2.0, 0.0, -2.0, 1.0, 0.0];
    let refs = [TensorRef { dtype: DType::F64, shape: &[2, 2, 2], data: bytemuck::cast_slice(&h) }];
    let mut info = vec![0i32; 1];
    let out = TensorMut { dtype: DType::I32, shape: &[], data: bytemuck::cast_slice_mut(&mut info) };
    linalg(LinalgOp::CholeskyInfo, LinalgFlags { complex: true, ..f }, &refs, out).unwrap();
    assert_eq!(info, [2]);
}

/// An empty batch of complex matrices gives empty results of every kind.
#[test]
fn complex_empty_batch() {
    let f = LinalgFlags { complex: true, ..LinalgFlags::default() };
    let none: [f64; 0] = [];
    assert!(run(LinalgOp::LogAbsDet, f, &[(&none, &[0, 3, 3, 2])], &[0]).unwrap().is_empty());
    assert!(run(LinalgOp::Det, f, &[(&none, &[0, 3, 3, 2])], &[0, 2]).unwrap().is_empty());
    let refs = [TensorRef { dtype: DType::F64, shape: &[0, 3, 3, 2], data: bytemuck::cast_slice(&none) }];
    let mut pivots: Vec<i32> = Vec::new();
    let out = TensorMut { dtype: DType::I32, shape: &[0, 3], data: bytemuck::cast_slice_mut(&mut pivots) };
    linalg(LinalgOp::LdlPivots, f, &refs, out).unwrap();
}

/// Complex Householder QR as `zgeqrf`/`zungqr`: Q unitary, R upper with a
/// real diagonal, Q R = A; `geqrf`'s reflectors and complex `tau` give the
/// same Q through `householder_product`.
#[test]
fn complex_qr_and_householder_product() {
    let f = LinalgFlags::default();
    // 3 x 2.
    let a = [1.0, 1.0, 2.0, -1.0, 0.0, 2.0, 1.0, 0.5, -1.0, 0.0, 3.0, 1.0];
    let q = run_complex(LinalgOp::QrQ, f, &[(&a, &[3, 2, 2])], &[3, 2, 2]).unwrap();
    let r = run_complex(LinalgOp::QrR, f, &[(&a, &[3, 2, 2])], &[2, 2, 2]).unwrap();
    close(&cmatmul(&q, &r, 3, 2, 2), &a, 1e-12);
    close(&cmatmul(&cadjoint(&q, 3, 2), &q, 2, 3, 2), &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0], 1e-12);
    assert_eq!((r[1], r[7], r[4], r[5]), (0.0, 0.0, 0.0, 0.0), "a real diagonal, zero below: {r:?}");
    let qc = run_complex(LinalgOp::QrQComplete, f, &[(&a, &[3, 2, 2])], &[3, 3, 2]).unwrap();
    let eye3 = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
    close(&cmatmul(&cadjoint(&qc, 3, 3), &qc, 3, 3, 3), &eye3, 1e-12);
    let packed = run_complex(LinalgOp::Geqrf, f, &[(&a, &[3, 2, 2])], &[3, 2, 2]).unwrap();
    let tau = run_complex(LinalgOp::GeqrfTau, f, &[(&a, &[3, 2, 2])], &[2, 2]).unwrap();
    assert!(tau[1] != 0.0, "a complex tau: {tau:?}");
    let q2 =
        run_complex(LinalgOp::HouseholderProduct, f, &[(&packed, &[3, 2, 2]), (&tau, &[2, 2])], &[3, 2, 2]).unwrap();
    close(&q2, &q, 1e-12);
}

/// The complex symmetric (not Hermitian) `A = L D Lᵀ` of `zsytf2` and its
/// solve: A X = B.
#[test]
fn complex_symmetric_ldl_solve() {
    let f = LinalgFlags::default();
    // Symmetric (Aᵀ = A), complex diagonal and a zero leading entry (a 2×2 block).
    let a = [0.0, 0.0, 1.0, 1.0, 2.0, 0.0, 1.0, 1.0, 0.0, 0.0, 3.0, -1.0, 2.0, 0.0, 3.0, -1.0, 4.0, 2.0];
    let ld = run_complex(LinalgOp::LdlFactor, f, &[(&a, &[3, 3, 2])], &[3, 3, 2]).unwrap();
    let refs = [TensorRef { dtype: DType::F64, shape: &[3, 3, 2], data: bytemuck::cast_slice(&a) }];
    let mut pivots = vec![0i32; 3];
    let out = TensorMut { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice_mut(&mut pivots) };
    linalg(LinalgOp::LdlPivots, LinalgFlags { complex: true, ..f }, &refs, out).unwrap();
    let b = [1.0, 0.0, 0.0, 1.0, 2.0, -1.0, 0.5, 0.5, -1.0, 3.0, 0.0, 0.0];
    let refs = [
        TensorRef { dtype: DType::F64, shape: &[3, 3, 2], data: bytemuck::cast_slice(&ld) },
        TensorRef { dtype: DType::I32, shape: &[3], data: bytemuck::cast_slice(&pivots) },
        TensorRef { dtype: DType::F64, shape: &[3, 2, 2], data: bytemuck::cast_slice(&b) },
    ];
    let mut x = vec![0f64; 12];
    let out = TensorMut { dtype: DType::F64, shape: &[3, 2, 2], data: bytemuck::cast_slice_mut(&mut x) };
    linalg(LinalgOp::LdlSolve, LinalgFlags { complex: true, ..f }, &refs, out).unwrap();
    close(&cmatmul(&a, &x, 3, 3, 2), &b, 1e-12);
}

/// Eigenvectors of a Hermitian matrix (read from either triangle): real
/// ascending eigenvalues, A V = V diag(w), V unitary, each column's
/// largest entry real and positive (kiln's phase).
#[test]
fn complex_hermitian_eigenvectors() {
    let f = LinalgFlags::default();
    // [[2, 1−i, 0], [1+i, 3, 2i], [0, −2i, 1]]
    let a = [2.0, 0.0, 1.0, -1.0, 0.0, 0.0, 1.0, 1.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, -2.0, 1.0, 0.0];
    for upper in [false, true] {
        let fu = LinalgFlags { upper, ..f };
        let w = run_complex(LinalgOp::EigvalsH, fu, &[(&a, &[3, 3, 2])], &[3]).unwrap();
        let v = run_complex(LinalgOp::EigvecsH, fu, &[(&a, &[3, 3, 2])], &[3, 3, 2]).unwrap();
        assert!(w[0] <= w[1] && w[1] <= w[2], "{w:?}");
        // trace 6
        close(&[w.iter().sum::<f64>()], &[6.0], 1e-12);
        let mut vw = v.clone();
        for i in 0..3 {
            for j in 0..3 {
                vw[2 * (i * 3 + j)] *= w[j];
                vw[2 * (i * 3 + j) + 1] *= w[j];
            }
        }
        close(&cmatmul(&a, &v, 3, 3, 3), &vw, 1e-12);
        let eye3 = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        close(&cmatmul(&cadjoint(&v, 3, 3), &v, 3, 3, 3), &eye3, 1e-12);
        for j in 0..3 {
            let lead = (0..3).max_by(|&x, &y| {
                let m = |i: usize| v[2 * (i * 3 + j)].hypot(v[2 * (i * 3 + j) + 1]);
                m(x).total_cmp(&m(y))
            });
            let i = lead.unwrap();
            assert!(v[2 * (i * 3 + j)] > 0.0 && v[2 * (i * 3 + j) + 1] == 0.0, "column {j}: {v:?}");
        }
    }
}

/// The complex SVD, tall and wide, reduced and full: U diag(s) Vh = A with
/// orthonormal columns of U and rows of Vh (full: unitary), s descending.
#[test]
fn complex_singular_value_decompositions() {
    let f = LinalgFlags::default();
    let a = [1.0, 1.0, 2.0, -1.0, 0.0, 2.0, 1.0, 0.5, -1.0, 0.0, 3.0, 1.0];
    for (m, n) in [(3usize, 2usize), (2, 3)] {
        let k = m.min(n);
        let s = run_complex(LinalgOp::SvdS, f, &[(&a, &[m, n, 2])], &[k]).unwrap();
        assert!(s[0] >= s[1] && s[1] > 0.0, "{s:?}");
        for full in [false, true] {
            let (uc, vr) = if full { (m, n) } else { (k, k) };
            let (uo, vo) =
                if full { (LinalgOp::SvdUFull, LinalgOp::SvdVhFull) } else { (LinalgOp::SvdU, LinalgOp::SvdVh) };
            let u = run_complex(uo, f, &[(&a, &[m, n, 2])], &[m, uc, 2]).unwrap();
            let vh = run_complex(vo, f, &[(&a, &[m, n, 2])], &[vr, n, 2]).unwrap();
            let eye = |d: usize| -> Vec<f64> {
                (0..d * d).flat_map(|i| [if i / d == i % d { 1.0 } else { 0.0 }, 0.0]).collect()
            };
            close(&cmatmul(&cadjoint(&u, m, uc), &u, uc, m, uc), &eye(uc), 1e-12);
            close(&cmatmul(&vh, &cadjoint(&vh, vr, n), vr, n, vr), &eye(vr), 1e-12);
            // U[:, :k] diag(s) Vh[:k, :].
            let mut us = vec![0.0; 2 * m * k];
            for i in 0..m {
                for j in 0..k {
                    us[2 * (i * k + j)] = u[2 * (i * uc + j)] * s[j];
                    us[2 * (i * k + j) + 1] = u[2 * (i * uc + j) + 1] * s[j];
                }
            }
            close(&cmatmul(&us, &vh[..2 * k * n], m, k, n), &a, 1e-12);
        }
    }
}
