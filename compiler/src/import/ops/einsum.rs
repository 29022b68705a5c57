//! `aten::einsum(str equation, Tensor[] tensors, *, int[]? path=None)`,
//! which training-IR programs keep (Core ATen has already rewritten it into
//! permutes, reductions and `bmm`). The same lowering torch's decomposition
//! performs, on kiln IR:
//!
//! 1. parse the equation (spaces allowed, `...` for broadcast dims, implicit
//!    output = the labels used once, alphabetically, after the `...` dims);
//! 2. per operand, take the diagonal of a repeated label and sum away labels
//!    no other operand and not the output use;
//! 3. contract operands left to right: each pair becomes one batched `MatMul`
//!    over `[batch, left, contracted] x [batch, contracted, right]`, where a
//!    label of size 1 on one side broadcasts against the other;
//! 4. permute the result into the output's label order.

use crate::import::importer::{invalid, unsupported, Importer, R};
use crate::pt2::program::Node;
use kiln_ir::{BinaryOp, DType, Dim, Op, ReduceKind, ValueId};

/// Ellipsis dims get labels above every letter's.
const ELLIPSIS_BASE: u32 = 1000;

/// One operand during the lowering: its value and one label per dim.
struct Term {
    value: ValueId,
    labels: Vec<u32>,
}

pub(super) fn einsum(imp: &mut Importer, n: &Node) -> R<()> {
    let equation: String = imp.string(n, "equation", "")?.chars().filter(|c| !c.is_whitespace()).collect();
    let out = imp.out_ty(n, 0)?;
    // A narrow-integer einsum that torch reduces with `sum` comes out as i64
    // (sum's promotion): compute in the declared result dtype from the start.
    let operands: Vec<ValueId> = imp.tensors(n, "tensors")?.into_iter().map(|v| imp.cast(v, out.dtype)).collect();
    let ranks: Vec<usize> = operands.iter().map(|&v| imp.ty(v).rank()).collect();
    let (inputs, output) = match parse(&equation, &ranks) {
        Ok(parsed) => parsed,
        Err(e) => return invalid(format!("einsum \"{equation}\": {e}")),
    };
    let mut terms = Vec::new();
    for (value, labels) in operands.into_iter().zip(inputs) {
        terms.push(take_diagonals(imp, Term { value, labels })?);
    }
    // Sum away labels used by one operand only and absent from the output.
    for i in 0..terms.len() {
        let needed =
            |l: u32| output.contains(&l) || terms.iter().enumerate().any(|(j, t)| j != i && t.labels.contains(&l));
        let lonely: Vec<u32> = terms[i].labels.iter().copied().filter(|&l| !needed(l)).collect();
        let value = terms[i].value;
        let term = std::mem::replace(&mut terms[i], Term { value, labels: Vec::new() });
        terms[i] = sum_labels(imp, term, &lonely)?;
    }
    let mut terms = std::collections::VecDeque::from(terms);
    let Some(mut acc) = terms.pop_front() else { return invalid("einsum without operands") };
    while let Some(next) = terms.pop_front() {
        // Labels still needed after this pair: the output's and later operands'.
        let keep: Vec<u32> = output.iter().chain(terms.iter().flat_map(|t| t.labels.iter())).copied().collect();
        acc = contract(imp, acc, next, &keep)?;
    }
    // Labels the output does not keep (a single operand's contraction).
    let extra: Vec<u32> = acc.labels.iter().copied().filter(|l| !output.contains(l)).collect();
    let acc = sum_labels(imp, acc, &extra)?;
    let Some(perm) = output.iter().map(|l| acc.labels.iter().position(|x| x == l)).collect::<Option<Vec<usize>>>()
    else {
        return invalid(format!("einsum \"{equation}\": an output label is missing from the operands"));
    };
    let v = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        acc.value
    } else {
        imp.push(Op::Permute { perm }, vec![acc.value])?
    };
    let v = if imp.ty(v).shape != out.shape {
        imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out)
    } else {
        v
    };
    imp.bind(n, 0, v)
}

/// Labels per operand and the output's, ellipses expanded (right-aligned, so
/// that `...` dims broadcast like numpy's).
fn parse(equation: &str, ranks: &[usize]) -> Result<(Vec<Vec<u32>>, Vec<u32>), String> {
    let (lhs, rhs) = match equation.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (equation, None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!("{} operand terms for {} tensors", terms.len(), ranks.len()));
    }
    let letter = |c: char| -> Result<u32, String> {
        if c.is_ascii_alphabetic() {
            Ok(c as u32)
        } else {
            Err(format!("unexpected character {c:?}"))
        }
    };
    // Letters of a term and where its ellipsis is, if any.
    let split = |t: &str| -> Result<(Vec<u32>, Option<usize>), String> {
        let (mut labels, mut ellipsis) = (Vec::new(), None);
        let mut rest = t;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("...") {
                if ellipsis.replace(labels.len()).is_some() {
                    return Err(format!("two ellipses in {t:?}"));
                }
                rest = after;
            } else {
                let c = rest.chars().next().unwrap_or(' ');
                labels.push(letter(c)?);
                rest = &rest[c.len_utf8()..];
            }
        }
        Ok((labels, ellipsis))
    };
    let mut inputs = Vec::new();
    let mut ellipsis_rank = 0;
    let mut parsed = Vec::new();
    for (t, &rank) in terms.iter().zip(ranks) {
        let (letters, at) = split(t)?;
        let dims = match at {
            Some(_) => rank
                .checked_sub(letters.len())
                .ok_or_else(|| format!("term {t:?} has more labels than its tensor's {rank} dims"))?,
            None if letters.len() == rank => 0,
            None => return Err(format!("term {t:?} has {} labels for a tensor of {rank} dims", letters.len())),
        };
        ellipsis_rank = ellipsis_rank.max(dims);
        parsed.push((letters, at, dims));
    }
    let ellipsis_labels = |dims: usize| (ellipsis_rank - dims..ellipsis_rank).map(|i| ELLIPSIS_BASE + i as u32);
    for (letters, at, dims) in &parsed {
        let mut labels = letters.clone();
        if let Some(at) = at {
            labels.splice(at..at, ellipsis_labels(*dims));
        }
        inputs.push(labels);
    }
    let output = match rhs {
        Some(r) => {
            let (letters, at) = split(r)?;
            let mut labels = letters;
            // Without `...` in the output, broadcast dims are summed away (as torch does).
            if let Some(at) = at {
                labels.splice(at..at, ellipsis_labels(ellipsis_rank));
            }
            for l in &labels {
                if *l < ELLIPSIS_BASE && !inputs.iter().any(|t| t.contains(l)) {
                    return Err(format!("output label {:?} appears in no operand", char::from_u32(*l).unwrap_or('?')));
                }
            }
            labels
        }
        None => {
            // Implicit output: `...` dims, then the letters used exactly once, sorted.
            let mut once: Vec<u32> = Vec::new();
            for l in inputs.iter().flatten().filter(|&&l| l < ELLIPSIS_BASE) {
                let count = inputs.iter().flatten().filter(|&&x| x == *l).count();
                if count == 1 && !once.contains(l) {
                    once.push(*l);
                }
            }
            once.sort_unstable();
            ellipsis_labels(ellipsis_rank).chain(once).collect()
        }
    };
    Ok((inputs, output))
}

/// Folds each repeated label of `t` into one dim holding the diagonal.
fn take_diagonals(imp: &mut Importer, mut t: Term) -> R<Term> {
    while let Some((a, b)) = repeated(&t.labels) {
        let ty = imp.ty(t.value).clone();
        let (da, db) = (ty.shape[a].clone(), ty.shape[b].clone());
        if da != db {
            return unsupported(format!("einsum diagonal over dims of sizes {da:?} and {db:?}"));
        }
        // keep = (i_a == i_b) over the two dims, broadcast; the diagonal is
        // the sum over dim b of where(keep, x, 0).
        let rank = ty.rank();
        let index = |imp: &mut Importer, axis: usize| -> R<ValueId> {
            let r = imp.push(Op::Arange { start: 0.0, step: 1.0, len: da.clone(), dtype: DType::I64 }, vec![])?;
            let mut shape = vec![Dim::Const(1); rank];
            shape[axis] = da.clone();
            imp.push(Op::Reshape { shape }, vec![r])
        };
        let (ia, ib) = (index(imp, a)?, index(imp, b)?);
        let keep = imp.push(Op::Binary(BinaryOp::Eq), vec![ia, ib])?;
        let zero = imp.push(Op::Full { value: 0.0, dtype: ty.dtype, shape: vec![] }, vec![])?;
        let picked = imp.push(Op::Where, vec![keep, t.value, zero])?;
        t.value = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![b], keep_dims: false }, vec![picked])?;
        t.labels.remove(b);
    }
    Ok(t)
}

fn repeated(labels: &[u32]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|a| (a + 1..labels.len()).find(|&b| labels[a] == labels[b]).map(|b| (a, b)))
}

/// Sums `t` over the dims labelled `labels`.
fn sum_labels(imp: &mut Importer, t: Term, labels: &[u32]) -> R<Term> {
    let axes: Vec<usize> = t.labels.iter().enumerate().filter(|(_, l)| labels.contains(l)).map(|(i, _)| i).collect();
    if axes.is_empty() {
        return Ok(t);
    }
    let value = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: axes.clone(), keep_dims: false }, vec![t.value])?;
    let labels = t.labels.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, l)| *l).collect();
    Ok(Term { value, labels })
}

/// The size of `t`'s dim labelled `l`.
fn size(imp: &Importer, t: &Term, l: u32) -> Dim {
    let i = t.labels.iter().position(|&x| x == l).unwrap_or(0);
    imp.ty(t.value).shape.get(i).cloned().unwrap_or(Dim::Const(1))
}

/// Contracts two operands into one whose labels are
/// `batch ++ left-only ++ right-only`; labels in `keep` (or in both but not
/// contracted) survive, shared labels outside `keep` are summed by the product.
fn contract(imp: &mut Importer, a: Term, b: Term, keep: &[u32]) -> R<Term> {
    let shared: Vec<u32> = a.labels.iter().copied().filter(|l| b.labels.contains(l)).collect();
    // A shared label of size 1 on one side broadcasts: expand it (kept) or
    // sum the other side over it first (contracted).
    let (mut a, mut b) = (a, b);
    for &l in &shared {
        let (sa, sb) = (size(imp, &a, l), size(imp, &b, l));
        if sa == sb {
            continue;
        }
        let kept = keep.contains(&l);
        match (sa.as_const(), sb.as_const(), kept) {
            (Some(1), _, true) => a = expand_label(imp, a, l, sb)?,
            (_, Some(1), true) => b = expand_label(imp, b, l, sa)?,
            (Some(1), _, false) => b = sum_keep(imp, b, l)?,
            (_, Some(1), false) => a = sum_keep(imp, a, l)?,
            _ => return invalid(format!("einsum operands disagree on a dim: {sa:?} vs {sb:?}")),
        }
    }
    let batch: Vec<u32> = shared.iter().copied().filter(|l| keep.contains(l)).collect();
    let contracted: Vec<u32> = shared.iter().copied().filter(|l| !keep.contains(l)).collect();
    let left: Vec<u32> = a.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let right: Vec<u32> = b.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let product =
        |imp: &Importer, t: &Term, ls: &[u32]| ls.iter().map(|&l| size(imp, t, l)).fold(Dim::Const(1), Dim::mul);
    let (bsz, m, k, nn) =
        (product(imp, &a, &batch), product(imp, &a, &left), product(imp, &a, &contracted), product(imp, &b, &right));
    let lhs = arrange(imp, &a, &[&batch[..], &left[..], &contracted[..]].concat(), vec![bsz.clone(), m, k.clone()])?;
    let rhs = arrange(imp, &b, &[&batch[..], &contracted[..], &right[..]].concat(), vec![bsz, k, nn])?;
    let prod = imp.push(Op::MatMul, vec![lhs, rhs])?;
    let mut shape: Vec<Dim> = batch.iter().map(|&l| size(imp, &a, l)).collect();
    shape.extend(left.iter().map(|&l| size(imp, &a, l)));
    shape.extend(right.iter().map(|&l| size(imp, &b, l)));
    let value = imp.push(Op::Reshape { shape }, vec![prod])?;
    Ok(Term { value, labels: [batch, left, right].concat() })
}

/// `t` permuted into `order` and reshaped to `shape`.
fn arrange(imp: &mut Importer, t: &Term, order: &[u32], shape: Vec<Dim>) -> R<ValueId> {
    let perm: Vec<usize> = order.iter().map(|l| t.labels.iter().position(|x| x == l).unwrap_or(0)).collect();
    let v = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        t.value
    } else {
        imp.push(Op::Permute { perm }, vec![t.value])?
    };
    imp.push(Op::Reshape { shape }, vec![v])
}

fn expand_label(imp: &mut Importer, t: Term, l: u32, to: Dim) -> R<Term> {
    let mut shape = imp.ty(t.value).shape.clone();
    let i = t.labels.iter().position(|&x| x == l).unwrap_or(0);
    shape[i] = to;
    let value = imp.push(Op::Expand { shape }, vec![t.value])?;
    Ok(Term { value, labels: t.labels })
}

fn sum_keep(imp: &mut Importer, t: Term, l: u32) -> R<Term> {
    let i = t.labels.iter().position(|&x| x == l).unwrap_or(0);
    let value = imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![i], keep_dims: true }, vec![t.value])?;
    Ok(Term { value, labels: t.labels })
}
