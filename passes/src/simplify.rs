//! Canonicalisation: removes ops that do nothing and merges chains of layout ops.
//!
//! - `reshape(x)` to `x`'s own shape, `expand(x)` to `x`'s own shape, `cast(x)` to
//!   `x`'s own dtype, an identity `permute`, and a `slice` that keeps a whole
//!   dimension with step 1 all become `x`;
//! - `reshape(reshape(x))` becomes one reshape of `x`;
//! - `permute(permute(x, p), q)` becomes `permute(x, p∘q)`;
//! - `matmul(x, expand(w, [B.., K, N]))`, `w` a matrix `[K, N]` and `x`'s
//!   batch dimensions exactly `B..`, becomes `matmul(x, w)`: the same
//!   products, the matrix broadcast by matmul itself. Core ATen's `linear`
//!   on a 3-D input that cannot be viewed as a matrix (BERT's attention
//!   output projection, after the heads are transposed back) is `bmm(x,
//!   expand(permute(W)))`; canonicalised, it is the matmul by a transposed
//!   constant that quantization, weight packing and epilogue fusion know.
//!
//! The inner op of a merged chain is left for DCE when it has no other user.

use crate::check::guard;
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{Dim, Graph, NodeId, Op, ValueId};

const PASS: &str = "simplify";

pub fn simplify(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    guard(g, PASS)?;
    rewrite_in_order(g, |g, n| Ok(simplify_node(g, n)))
}

fn simplify_node(g: &mut Graph, n: NodeId) -> Rewrite {
    let node = &g.nodes[n];
    let (Some(&x), &[out]) = (node.inputs.first(), node.outputs.as_slice()) else {
        return Rewrite::Keep;
    };
    let (x_ty, out_ty) = (g.ty(x), g.ty(out));
    // An identity must not change the value's type, or later nodes' types would lie.
    let same_type = x_ty == out_ty;
    let identity = same_type
        && match &node.op {
            Op::Reshape { shape } | Op::Expand { shape } => *shape == x_ty.shape,
            Op::Cast { to } => *to == x_ty.dtype,
            Op::Permute { perm } => perm.iter().enumerate().all(|(i, &p)| i == p),
            Op::Slice { axis, start, end, step } => {
                *start == 0 && *step == 1 && x_ty.shape.get(*axis).is_some_and(|d| covers(d, *end))
            }
            _ => false,
        };
    if identity {
        return Rewrite::Replace(vec![x]);
    }
    match node.op.clone() {
        Op::Reshape { shape } => match producer_op(g, x) {
            Some((Op::Reshape { .. }, inner)) => {
                let ty = g.ty(out).clone();
                Rewrite::Replace(vec![g.push(Op::Reshape { shape }, vec![inner], ty, node_loc(g, n))])
            }
            _ => Rewrite::Keep,
        },
        Op::Permute { perm: q } => match producer_op(g, x) {
            Some((Op::Permute { perm: p }, inner)) if p.len() == q.len() && q.iter().all(|&i| i < p.len()) => {
                // out[i] = mid[q[i]] = inner[p[q[i]]].
                let perm: Vec<usize> = q.iter().map(|&i| p[i]).collect();
                let ty = g.ty(out).clone();
                let merged = if perm.iter().enumerate().all(|(i, &p)| i == p) && g.ty(inner) == &ty {
                    inner
                } else {
                    g.push(Op::Permute { perm }, vec![inner], ty, node_loc(g, n))
                };
                Rewrite::Replace(vec![merged])
            }
            _ => Rewrite::Keep,
        },
        Op::MatMul => match (node.inputs.as_slice(), producer_op(g, node.inputs[1])) {
            (&[x, b], Some((Op::Expand { .. }, w))) if expands_matrix_over_batch(g, x, b, w) => {
                let ty = g.ty(out).clone();
                Rewrite::Replace(vec![g.push(Op::MatMul, vec![x, w], ty, node_loc(g, n))])
            }
            _ => Rewrite::Keep,
        },
        _ => Rewrite::Keep,
    }
}

/// `b = expand(w)` only repeats the matrix `w` (`[K, N]`) over leading
/// dimensions that are exactly `x`'s batch dimensions, so `matmul(x, w)`
/// broadcasts it the same way and has `matmul(x, b)`'s type.
fn expands_matrix_over_batch(g: &Graph, x: ValueId, b: ValueId, w: ValueId) -> bool {
    let (x_ty, b_ty, w_ty) = (g.ty(x), g.ty(b), g.ty(w));
    let rank = b_ty.rank();
    w_ty.rank() == 2
        && rank >= 3
        && x_ty.rank() == rank
        && w_ty.dtype == b_ty.dtype
        && b_ty.shape[rank - 2..] == w_ty.shape[..]
        && x_ty.shape[..rank - 2] == b_ty.shape[..rank - 2]
}

/// `end` reaches the end of a dimension of size `d` (ends are clamped at run time).
fn covers(d: &Dim, end: i64) -> bool {
    end == i64::MAX || d.as_const().is_some_and(|size| end >= size)
}

/// The op and single operand of the node defining `v`.
fn producer_op(g: &Graph, v: ValueId) -> Option<(Op, ValueId)> {
    let node = &g.nodes[g.producer(v)?];
    match node.inputs.as_slice() {
        [inner] => Some((node.op.clone(), *inner)),
        _ => None,
    }
}

fn node_loc(g: &Graph, n: NodeId) -> Option<kiln_ir::LocId> {
    g.nodes[n].loc
}
