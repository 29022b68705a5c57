//! Complex linear algebra through the real embedding
//! `E(A + iB) = [[A, −B], [B, A]]`: a ring homomorphism that keeps the
//! conjugate transpose (`E(Zᴴ) = E(Z)ᵀ`), so the inverse, solutions, powers
//! and pseudo-inverse of `Z` are the blocks `[[X, ·], [Y, ·]]` of the real
//! ones of `E(Z)`, and `E(Z)`'s singular values (and a Hermitian `Z`'s
//! eigenvalues) are `Z`'s, each twice. The real ops run on the
//! `2n × 2n` matrices in f64 (complex64) or their own f64 (complex128).
//! Factorizations whose factors are complex (LU, QR, Cholesky, SVD and eigenvectors, determinants) run
//! on the linalg kernel's complex path instead (`complex_factor.rs`).

use crate::import::importer::{invalid, output_names, unsupported, Importer, COMPLEX_SCOPE, R};
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, TensorType, UnaryOp as U, ValueId};

use super::fft::{cast_parts, operand, Parts};

/// Converts `n` if it is one of the ops here; `None` when it is not.
pub(super) fn convert(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> Option<R<()>> {
    Some(match name {
        // As for real matrices, only the double-precision exponential: torch's
        // complex64 scaling and squaring misses the exact value (which the
        // f64 embedding gives) by more than its tolerance on large norms.
        "linalg_matrix_exp" | "matrix_exp" if single_precision(imp, n) => unsupported(format!(
            "`{name}` of complex64: kiln computes the exact exponential, which torch's complex64 scaling and \
             squaring misses by more than its tolerance on large norms (complex128 only)"
        )),
        // `e^E(z) = E(e^z)`: the embedding is a ring homomorphism.
        "linalg_inv" | "linalg_inv_ex" | "linalg_matrix_power" | "linalg_matrix_exp" | "matrix_exp" => {
            inverse_like(imp, n, name, overload)
        }
        // A Hermitian pinv goes through the complex eigh (complex_factor.rs).
        "linalg_pinv" | "pinverse" => inverse_like(imp, n, name, overload),
        "linalg_solve" | "linalg_solve_ex" | "_linalg_solve_ex" => solve(imp, n, name, overload),
        "linalg_svdvals" | "_linalg_svd" | "linalg_eigvalsh" | "_linalg_eigh" | "linalg_matrix_rank" => {
            values(imp, n, name, overload)
        }
        "linalg_cond" if spectral_cond(imp, n) => values(imp, n, name, overload),
        "linalg_matrix_norm" | "linalg_norm" if nuclear_or_spectral(imp, n) => values(imp, n, name, overload),
        _ => return None,
    })
}

/// Whether `n`'s matrix operand is complex64 (f32 parts).
fn single_precision(imp: &Importer, n: &Node) -> bool {
    let Ok(arg) = matrix_arg(imp, n) else { return false };
    matches!(imp.arg(n, arg), Some(Arg::Tensor(t)) if imp.complex(t).is_some_and(|(re, _)| imp.ty(re).dtype == DType::F32))
}

fn spectral_cond(imp: &Importer, n: &Node) -> bool {
    match imp.arg(n, "p") {
        None | Some(Arg::None) => true,
        Some(Arg::Int(p)) => p.abs() == 2,
        Some(Arg::Float(p)) => p.abs() == 2.0,
        _ => false,
    }
}

fn nuclear_or_spectral(imp: &Importer, n: &Node) -> bool {
    match imp.arg(n, "ord") {
        Some(Arg::Str(s)) => s == "nuc",
        Some(Arg::Int(p)) => p.abs() == 2,
        Some(Arg::Float(p)) => p.abs() == 2.0,
        _ => false,
    }
}

/// f64 for complex64's f32 parts (the embedding doubles the size, and its
/// blocks cancel); complex128 stays f64.
const WORK: DType = DType::F64;

fn static_dim(imp: &Importer, v: ValueId, from_end: usize) -> R<i64> {
    let ty = imp.ty(v);
    let rank = ty.rank();
    if rank < from_end {
        return invalid(format!("a matrix operand of rank {rank}"));
    }
    match ty.shape[rank - from_end].as_const() {
        Some(d) => Ok(d),
        None => unsupported(format!("complex linear algebra on a matrix with a dynamic size; {COMPLEX_SCOPE}")),
    }
}

fn concat(imp: &mut Importer, parts: Vec<ValueId>, from_end: usize) -> R<ValueId> {
    let axis = imp.ty(parts[0]).rank() - from_end;
    imp.push(Op::Concat { axis }, parts)
}

fn slice(imp: &mut Importer, v: ValueId, from_end: usize, start: i64, end: i64, step: i64) -> R<ValueId> {
    let axis = imp.ty(v).rank() - from_end;
    imp.push(Op::Slice { axis, start, end, step }, vec![v])
}

/// `E(z)`: `[.., m, n]` → `[.., 2m, 2n]`.
fn embed(imp: &mut Importer, z: Parts) -> R<ValueId> {
    let z = cast_parts(imp, z, WORK);
    let im = super::fft::imag_or_zero(imp, z)?;
    let neg = imp.push(Op::Unary(U::Neg), vec![im])?;
    let top = concat(imp, vec![z.re, neg], 1)?;
    let bottom = concat(imp, vec![im, z.re], 1)?;
    concat(imp, vec![top, bottom], 2)
}

/// The complex matrix whose embedding is `x` (`[.., 2m, 2n]`): its left blocks.
fn unembed(imp: &mut Importer, x: ValueId) -> R<Parts> {
    let (m2, n2) = (static_dim(imp, x, 2)?, static_dim(imp, x, 1)?);
    let left = slice(imp, x, 1, 0, n2 / 2, 1)?;
    let re = slice(imp, left, 2, 0, m2 / 2, 1)?;
    let im = slice(imp, left, 2, m2 / 2, m2, 1)?;
    Ok(Parts { re, im: Some(im) })
}

/// The matrix argument's name (`A`, `self` or `input` by op).
fn matrix_arg(imp: &Importer, n: &Node) -> R<&'static str> {
    match ["A", "self", "input"].into_iter().find(|a| matches!(imp.arg(n, a), Some(Arg::Tensor(_)))) {
        Some(a) => Ok(a),
        None => invalid("a matrix op without its matrix"),
    }
}

fn matrix_operand(imp: &mut Importer, n: &Node, arg: &str) -> R<Parts> {
    let name = imp.tensor_name(n, arg)?;
    operand(imp, name)
}

/// Runs the real op `n` with tensor arguments replaced by `inputs` and its
/// outputs typed `outs` (`None`: an output that must not be used, checked
/// here): the outputs keep their names (the real op looks at which are
/// used), bound to the real results only during the call.
fn run_real(
    imp: &mut Importer,
    n: &Node,
    (name, overload): (&str, &str),
    inputs: &[(&str, ValueId)],
    outs: &[Option<TensorType>],
) -> R<Vec<Option<ValueId>>> {
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    for (i, o) in names.iter().enumerate() {
        if outs.get(i).is_none_or(Option::is_none) && (imp.is_used(o) || imp.read_later(o)) {
            return unsupported(format!(
                "`{name}` of a complex matrix: output {i} (a complex factorization) is used; {COMPLEX_SCOPE}"
            ));
        }
    }
    super::complex_ops::dispatch_with(imp, n, (name, overload), inputs, Some(outs))
}

/// The type of output `i` of `n` as the real op on the embedding makes it.
fn real_output(imp: &mut Importer, n: &Node, i: usize) -> R<Option<TensorType>> {
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    let Some(o) = names.get(i) else { return Ok(None) };
    if imp.is_complex_meta(o) {
        let ty = imp.part_type(o)?;
        let mut shape = ty.shape.clone();
        let rank = shape.len();
        for d in shape.iter_mut().skip(rank.saturating_sub(2)) {
            *d = match d.as_const() {
                Some(v) => Dim::Const(2 * v),
                None => return unsupported(format!("complex linear algebra with a dynamic size; {COMPLEX_SCOPE}")),
            };
        }
        Ok(Some(TensorType::new(WORK, shape)))
    } else {
        Ok(Some(imp.type_of(o)?))
    }
}

/// `inv`, `inv_ex`, `matrix_power`, `pinv`: the real op of `E(z)`; complex
/// outputs are unembedded, real ones (`info`) pass through.
fn inverse_like(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let arg = matrix_arg(imp, n)?;
    let z = matrix_operand(imp, n, arg)?;
    let e = embed(imp, z)?;
    let count = n.outputs.iter().flat_map(output_names).count();
    let outs = (0..count).map(|i| real_output(imp, n, i)).collect::<R<Vec<_>>>()?;
    let results = run_real(imp, n, (name, overload), &[(arg, e)], &outs)?;
    bind_results(imp, n, results)
}

fn bind_results(imp: &mut Importer, n: &Node, results: Vec<Option<ValueId>>) -> R<()> {
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    for (i, (o, v)) in names.iter().zip(results).enumerate() {
        let Some(v) = v else { continue };
        if imp.is_complex_meta(o) {
            let z = unembed(imp, v)?;
            let ty = imp.part_type(o)?;
            let z = cast_parts(imp, z, ty.dtype);
            bind_out_named(imp, o, z)?;
        } else {
            let ty = imp.type_of(o)?;
            let v = imp.cast(v, ty.dtype);
            bind_index(imp, n, i, v)?;
        }
    }
    Ok(())
}

fn bind_index(imp: &mut Importer, n: &Node, i: usize, v: ValueId) -> R<()> {
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    match names.get(i) {
        Some(o) => {
            imp.bind_name(o, v);
            Ok(())
        }
        None => invalid(format!("output {i} is missing")),
    }
}

/// `solve(A, B)`: `E(A) [Bre; Bim] = [Xre; Xim]` (B a matrix or a vector).
fn solve(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    if !imp.bool(n, "left", true)? {
        return unsupported(format!("`{name}` with left=False of a complex matrix; {COMPLEX_SCOPE}"));
    }
    let a = matrix_operand(imp, n, "A")?;
    let b = matrix_operand(imp, n, "B")?;
    let vector = imp.ty(b.re).rank() + 1 == imp.ty(a.re).rank() || imp.ty(b.re).rank() == 1;
    let e = embed(imp, a)?;
    let b = cast_parts(imp, b, WORK);
    let bi = super::fft::imag_or_zero(imp, b)?;
    let stacked = concat(imp, vec![b.re, bi], if vector { 1 } else { 2 })?;
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    let mut outs = Vec::new();
    for (i, o) in names.iter().enumerate() {
        outs.push(match i {
            0 => Some(TensorType::new(WORK, imp.ty(stacked).shape.clone())),
            // `info` (last) is real; LU and pivots of the embedding mean nothing.
            _ if i + 1 == names.len() => Some(imp.type_of(o)?),
            _ => None,
        });
    }
    let results = run_real(imp, n, (name, overload), &[("A", e), ("B", stacked)], &outs)?;
    for (i, (o, v)) in names.iter().zip(results).enumerate() {
        let Some(v) = v else { continue };
        if i == 0 {
            let half = static_dim(imp, v, if vector { 1 } else { 2 })? / 2;
            let from_end = if vector { 1 } else { 2 };
            let re = slice(imp, v, from_end, 0, half, 1)?;
            let im = slice(imp, v, from_end, half, 2 * half, 1)?;
            let ty = imp.part_type(o)?;
            let z = cast_parts(imp, Parts { re, im: Some(im) }, ty.dtype);
            bind_out_named(imp, o, z)?;
        } else {
            let ty = imp.type_of(o)?;
            let v = imp.cast(v, ty.dtype);
            bind_index(imp, n, i, v)?;
        }
    }
    Ok(())
}

fn bind_out_named(imp: &mut Importer, o: &str, z: Parts) -> R<()> {
    let im = match z.im {
        Some(im) => im,
        None => return invalid("a complex result without an imaginary part"),
    };
    imp.bind_complex(o, z.re, im);
    Ok(())
}

/// Values of `E(z)`: singular values and a Hermitian matrix's eigenvalues
/// come in equal pairs (every other one is `z`'s), the rank is twice
/// `z`'s, the nuclear norm twice, the spectral norms and condition number
/// the same.
fn values(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let arg = matrix_arg(imp, n)?;
    let mut z = matrix_operand(imp, n, arg)?;
    if matches!(name, "linalg_eigvalsh" | "_linalg_eigh") {
        z = hermitian_part(imp, n, z)?;
    }
    let e = embed(imp, z)?;
    let names: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    // The values output: first for svdvals/rank/norms/cond/eigvalsh, second
    // (S) for _linalg_svd, first (eigenvalues) for _linalg_eigh.
    let value_index = if name == "_linalg_svd" { 1 } else { 0 };
    let mut outs = Vec::new();
    for (i, o) in names.iter().enumerate() {
        outs.push(if i == value_index {
            let ty = imp.type_of(o)?;
            let mut shape = ty.shape.clone();
            if matches!(name, "linalg_svdvals" | "_linalg_svd" | "linalg_eigvalsh" | "_linalg_eigh") {
                let last = shape.len() - 1;
                shape[last] = match shape[last].as_const() {
                    Some(k) => Dim::Const(2 * k),
                    None => return unsupported(format!("complex `{name}` with a dynamic size; {COMPLEX_SCOPE}")),
                };
            }
            let dtype = if ty.dtype.is_float() { WORK } else { ty.dtype };
            Some(TensorType::new(dtype, shape))
        } else {
            None
        });
    }
    let results = run_real(imp, n, (name, overload), &[(arg, e)], &outs)?;
    let Some(Some(v)) = results.get(value_index).copied() else {
        return invalid(format!("`{name}` gave no values"));
    };
    let o = &names[value_index];
    let ty = imp.type_of(o)?;
    let v = match name {
        "linalg_svdvals" | "_linalg_svd" | "linalg_eigvalsh" | "_linalg_eigh" => {
            let k = static_dim(imp, v, 1)?;
            slice(imp, v, 1, 0, k, 2)?
        }
        "linalg_matrix_rank" => {
            let two = imp.scalar_const(crate::import::importer::Scalar::Int(2), imp.ty(v).dtype);
            imp.push(Op::Binary(B::FloorDiv), vec![v, two])?
        }
        _ if nuclear(imp, n) => imp.with_scalar(B::Mul, v, 0.5)?,
        _ => v,
    };
    let v = imp.cast(v, ty.dtype);
    bind_index(imp, n, value_index, v)
}

fn nuclear(imp: &Importer, n: &Node) -> bool {
    matches!(imp.arg(n, "ord"), Some(Arg::Str(s)) if s == "nuc")
}

/// The Hermitian matrix torch's `eigh` sees: the triangle `UPLO` names,
/// mirrored and conjugated, with a real diagonal.
fn hermitian_part(imp: &mut Importer, n: &Node, z: Parts) -> R<Parts> {
    let lower = imp.string(n, "UPLO", "L")? == "L";
    let z = cast_parts(imp, z, WORK);
    let im = super::fft::imag_or_zero(imp, z)?;
    let size =
        (imp.ty(z.re).shape[imp.ty(z.re).rank() - 2].clone(), imp.ty(z.re).shape[imp.ty(z.re).rank() - 1].clone());
    let tri = |imp: &mut Importer, v: ValueId, k: i64| -> R<ValueId> {
        // The triangle UPLO names, `k` diagonals in (0: with the diagonal).
        let mask = super::spatial::tri_mask(imp, size.clone(), !lower, if lower { k } else { -k })?;
        let zero = imp.scalar_const(crate::import::importer::Scalar::Float(0.0), WORK);
        imp.push(Op::Where, vec![mask, v, zero])
    };
    let transpose = |imp: &mut Importer, v: ValueId| -> R<ValueId> {
        let rank = imp.ty(v).rank();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        imp.push(Op::Permute { perm }, vec![v])
    };
    // re: T(A) + T₋₁(A)ᵀ; im: T₋₁(B) − T₋₁(B)ᵀ (the diagonal's imaginary part dropped).
    let a_t = tri(imp, z.re, 0)?;
    let a_s = tri(imp, z.re, -1)?;
    let a_st = transpose(imp, a_s)?;
    let re = imp.push(Op::Binary(B::Add), vec![a_t, a_st])?;
    let b_s = tri(imp, im, -1)?;
    let b_st = transpose(imp, b_s)?;
    let im = imp.push(Op::Binary(B::Sub), vec![b_s, b_st])?;
    Ok(Parts { re, im: Some(im) })
}
