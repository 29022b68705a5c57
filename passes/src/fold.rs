//! Constant folding.
//!
//! A node all of whose operands are constants (or that has none: `full`, `arange`)
//! and whose op is layout-only, elementwise, `concat`, `reduce` or `matmul`
//! is evaluated at compile time by [`crate::eval`] and replaced by a new constant,
//! provided its type is static and the result is small: at most
//! `Options::fold_max_elements` elements, or no larger than its largest operand
//! (then folding never grows the weights — the classic case being `linear`'s
//! `permute(weight, [1, 0])`, whose operand then dies).
//! The pass first folds shape arithmetic ([`crate::dims`]), so that a reshape whose
//! target became static can fold in the same run.
//!
//! The new constant inherits the folded value's attributes; a layout op or a
//! cast of one constant also passes on that constant's origin (the folded
//! transpose of a weight is still that weight to an override that names it);
//! a cast keeps its sharding too, and a transpose permutes it.

use crate::check::guard;
use crate::dims::simplify_shapes;
use crate::eval::eval;
use crate::host::{static_shape, supported, HostTensor};
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{Graph, NodeId, Op, ValueId};

const PASS: &str = "fold";

pub fn fold_constants(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    guard(g, PASS)?;
    let shapes = simplify_shapes(g);
    let nodes = rewrite_in_order(g, |g, n| Ok(fold_node(g, n, opts)))?;
    Ok(shapes | nodes)
}

fn foldable(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Reshape { .. }
            | Op::Expand { .. }
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Reduce { .. }
            | Op::MatMul
            | Op::Full { .. }
            | Op::Arange { .. }
    )
}

fn fold_node(g: &mut Graph, n: NodeId, opts: &Options) -> Rewrite {
    let node = &g.nodes[n];
    let &[out] = node.outputs.as_slice() else { return Rewrite::Keep };
    if !foldable(&node.op) {
        return Rewrite::Keep;
    }
    let out_ty = g.ty(out);
    let Some(out_shape) = static_shape(out_ty) else { return Rewrite::Keep };
    if !supported(out_ty.dtype) {
        return Rewrite::Keep;
    }
    // The evaluator holds every operand as f64: bound what one fold may take
    // (a hostile or huge weight would otherwise cost 8 bytes per element
    // before any size check). Larger constants are left to the kernels.
    let too_big = |v: &ValueId| {
        static_shape(g.ty(*v)).is_none_or(|s| {
            s.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > opts.fold_max_operand_elements)
        })
    };
    if node.inputs.iter().any(too_big) {
        return Rewrite::Keep;
    }
    let Some(operands) = node.inputs.iter().map(|&v| HostTensor::from_const(g, v)).collect::<Option<Vec<_>>>() else {
        return Rewrite::Keep;
    };
    let out_elems: usize = out_shape.iter().product();
    let out_bytes = out_elems.saturating_mul(out_ty.dtype.size_bytes());
    let largest_operand = operands.iter().map(|t| t.numel() * t.dtype.size_bytes()).max().unwrap_or(0);
    if out_elems > opts.fold_max_elements && out_bytes > largest_operand {
        return Rewrite::Keep;
    }
    let refs: Vec<&HostTensor> = operands.iter().collect();
    match eval(&node.op, &refs, out_ty.dtype, &out_shape) {
        // An integer result beyond 2^53 is no longer exact in f64 (and i64
        // overflow would saturate instead of wrapping): the kernels compute it.
        Some(result) if !result.is_exact() => Rewrite::Keep,
        Some(result) => {
            let name = g.values[out].name.clone();
            let origin = match node.inputs.as_slice() {
                [x] if node.op.is_layout_only() || matches!(node.op, Op::Cast { .. }) => {
                    g.values[*x].attrs.origin.clone()
                }
                _ => None,
            };
            let sharding = match (node.inputs.as_slice(), &node.op) {
                ([x], Op::Cast { .. }) => g.values[*x].attrs.sharding.clone(),
                // A transposed weight's dims move with their splits.
                ([x], Op::Permute { perm }) => g.values[*x].attrs.sharding.as_ref().map(|s| kiln_ir::Sharding {
                    dims: perm.iter().map(|&p| s.dims.get(p).cloned().unwrap_or_default()).collect(),
                    partial: s.partial.clone(),
                }),
                _ => None,
            };
            let folded = result.add_to(g, name);
            g.values[folded].attrs.origin = origin;
            g.values[folded].attrs.sharding = sharding;
            Rewrite::Replace(vec![folded])
        }
        None => Rewrite::Keep,
    }
}
