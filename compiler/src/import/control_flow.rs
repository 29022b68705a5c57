//! Higher-order control flow: `torch.cond` and `while_loop`.
//!
//! kiln's plan is a flat list of instructions with no branches, so `torch.cond`
//! is compiled by **executing both branches** and selecting each result with
//! `Where` on the (0-d, broadcast) predicate. Both branches are pure functional
//! graphs (torch.export requires it), so running the untaken one changes
//! nothing but the time spent — and a branch may compute on values that are
//! meaningless when it is not taken (a NaN from `log` of a negative number, an
//! out-of-range index the taken branch guards against), which is harmless
//! because `Where` discards it. Integer division by zero, which kiln's kernels
//! report as an error, is the exception: a guard written as a `cond` around an
//! integer division fails in kiln even when the branch is not taken.
//!
//! Both branches must give each output the same dtype and shape (torch checks
//! this at export too); a mismatch is a compile-time error naming both types.
//!
//! `while_loop` becomes an [`Op::While`] whose condition and body are nested
//! graphs of their own (converted with a copy of the parent's symbol table;
//! everything they read arrives as an input: the carried values, then the
//! additional ones, which torch uses for lifted weights and captured tensors).
//! The CPU plan runs it with jumps (`lower.rs`); no trip count is needed, and
//! a condition that never turns false loops forever, as in torch. Carried
//! values must keep their dtype and shape across iterations (torch checks this
//! at export; kiln checks it again and reports a mismatch by name). A loop
//! body that makes a data-dependent size (`.item()`, nonzero) is rejected:
//! memory is planned once for the loop's region.

use super::importer::{invalid, unsupported, Importer, R};
use crate::pt2::program::{Arg, Node, SubGraph};
use kiln_ir::{DType, Op, Region, TensorType, ValueId};

pub(crate) const COND: &str = "torch.ops.higher_order.cond";
pub(crate) const WHILE_LOOP: &str = "torch.ops.higher_order.while_loop";

/// `cond(pred, true_fn, false_fn, operands)`: inputs are positional (their
/// names are empty in the file).
pub(crate) fn cond<'p>(imp: &mut Importer<'p>, n: &'p Node) -> R<()> {
    let [pred, on_true, on_false, operands] = n.inputs.as_slice() else {
        return invalid(format!("cond takes 4 arguments, found {}", n.inputs.len()));
    };
    let (Arg::Graph(on_true), Arg::Graph(on_false)) = (&on_true.arg, &on_false.arg) else {
        return invalid("cond's branches are not graphs");
    };
    let operands: Vec<ValueId> = match &operands.arg {
        Arg::Tensors(names) => names.iter().map(|t| imp.value(t)).collect::<R<_>>()?,
        Arg::Tensor(name) => vec![imp.value(name)?],
        // No operands at all: the branches only read constants.
        Arg::None => Vec::new(),
        other => {
            return unsupported(format!(
                "cond operands other than tensors ({other:?}); symbolic ints among them are not supported"
            ))
        }
    };
    let outer = imp.loc().expect("set by convert_nodes");
    let pred = match &pred.arg {
        Arg::Tensor(name) => imp.value(name)?,
        // A Python bool: torch normally specialises such a cond away; if one
        // survives, only the branch taken exists at run time.
        Arg::Bool(b) => {
            let taken: &'p SubGraph = if *b { on_true } else { on_false };
            let values = imp.inline_graph(taken, &operands, outer)?;
            return bind_all(imp, n, &values);
        }
        Arg::SymBool(_) => {
            return unsupported("cond on a symbolic-shape predicate (e.g. `x.shape[0] > 4`) is not supported; kiln needs a tensor predicate")
        }
        other => return invalid(format!("cond predicate: expected a bool tensor, found {other:?}")),
    };
    let pred_ty = imp.ty(pred).clone();
    if pred_ty.numel().as_const() != Some(1) {
        return invalid(format!("cond predicate has {} elements, expected 1", pred_ty.numel().display(&imp.g.symbols)));
    }
    // A one-element predicate of any rank becomes a 0-d bool, which `Where`
    // broadcasts against every output.
    let mut pred = if pred_ty.rank() == 0 { pred } else { imp.push(Op::Reshape { shape: Vec::new() }, vec![pred])? };
    pred = imp.cast(pred, DType::Bool);

    let taken = imp.inline_graph(on_true, &operands, outer)?;
    let not_taken = imp.inline_graph(on_false, &operands, outer)?;
    if taken.len() != not_taken.len() || taken.len() != n.outputs.len() {
        return unsupported(format!(
            "cond branches return {} and {} values, the node has {} outputs",
            taken.len(),
            not_taken.len(),
            n.outputs.len()
        ));
    }
    let mut selected = Vec::with_capacity(taken.len());
    for (i, (&t, &f)) in taken.iter().zip(&not_taken).enumerate() {
        let (tt, ft) = (imp.ty(t).clone(), imp.ty(f).clone());
        if !same_type(imp, &tt, &ft) {
            return unsupported(format!(
                "cond output {i}: the branches disagree — `{}` gives {}, `{}` gives {}; kiln selects between both results, so they must have one dtype and shape",
                on_true.name,
                show(imp, &tt),
                on_false.name,
                show(imp, &ft)
            ));
        }
        let out = imp.out_ty(n, i)?;
        selected.push(imp.push_typed(Op::Where, vec![pred, t, f], out));
    }
    bind_all(imp, n, &selected)
}

fn bind_all(imp: &mut Importer, n: &Node, values: &[ValueId]) -> R<()> {
    if values.len() != n.outputs.len() {
        return invalid(format!("{} values for {} outputs", values.len(), n.outputs.len()));
    }
    for (i, &v) in values.iter().enumerate() {
        imp.bind(n, i, v)?;
    }
    Ok(())
}

fn same_type(imp: &Importer, a: &TensorType, b: &TensorType) -> bool {
    // Unknown equality (distinct symbols) counts as a mismatch: `Where` could
    // not broadcast two shapes that differ at run time.
    let equal = |x, y| kiln_ir::infer::dims_equal(x, y, &imp.g.symbols) == Some(true);
    a.dtype == b.dtype && a.rank() == b.rank() && a.shape.iter().zip(&b.shape).all(|(x, y)| equal(x, y))
}

fn show(imp: &Importer, t: &TensorType) -> String {
    let dims: Vec<String> = t.shape.iter().map(|d| d.display(&imp.g.symbols).to_string()).collect();
    format!("{}[{}]", t.dtype, dims.join(", "))
}

/// `while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)`:
/// inputs are positional. Both functions become nested graphs of an
/// [`Op::While`] taking the carried values then the additional (read-only)
/// ones; the node's outputs are the final carried values.
pub(crate) fn while_loop<'p>(imp: &mut Importer<'p>, n: &'p Node) -> R<()> {
    let [cond_fn, body_fn, carried, additional] = n.inputs.as_slice() else {
        return invalid(format!("while_loop takes 4 arguments, found {}", n.inputs.len()));
    };
    let (Arg::Graph(cond_fn), Arg::Graph(body_fn)) = (&cond_fn.arg, &body_fn.arg) else {
        return invalid("while_loop's cond_fn and body_fn are not graphs");
    };
    let tensors = |imp: &Importer, arg: &Arg, what: &str| -> R<Vec<ValueId>> {
        match arg {
            Arg::Tensors(names) => names.iter().map(|t| imp.value(t)).collect(),
            Arg::Tensor(name) => Ok(vec![imp.value(name)?]),
            Arg::None => Ok(Vec::new()),
            other => unsupported(format!(
                "while_loop {what} other than tensors ({other:?}): kiln carries tensors only (make a Python int counter a 0-d tensor)"
            )),
        }
    };
    let carried = tensors(imp, &carried.arg, "carried inputs")?;
    let additional = tensors(imp, &additional.arg, "additional inputs")?;
    if carried.is_empty() || carried.len() != n.outputs.len() {
        return invalid(format!("while_loop carries {} values and has {} outputs", carried.len(), n.outputs.len()));
    }
    let outer = imp.loc().expect("set by convert_nodes");
    let operands: Vec<ValueId> = carried.iter().chain(&additional).copied().collect();
    let types: Vec<TensorType> = operands.iter().map(|&v| imp.ty(v).clone()).collect();
    let cond = imp.convert_region(cond_fn, &types, outer)?;
    let body = imp.convert_region(body_fn, &types, outer)?;
    match cond.outputs.as_slice() {
        [p] if cond.ty(*p).dtype == DType::Bool && cond.ty(*p).numel().as_const() == Some(1) => {}
        [p] => {
            return unsupported(format!(
                "while_loop's `{}` returns {}, expected a one-element bool tensor",
                cond_fn.name,
                show(imp, cond.ty(*p))
            ))
        }
        outs => {
            return unsupported(format!(
                "while_loop's `{}` returns {} values, expected one bool",
                cond_fn.name,
                outs.len()
            ))
        }
    }
    if body.outputs.len() != carried.len() {
        return unsupported(format!(
            "while_loop's `{}` returns {} values for {} carried values",
            body_fn.name,
            body.outputs.len(),
            carried.len()
        ));
    }
    for (i, (&out, want)) in body.outputs.iter().zip(&types).enumerate() {
        let got = body.ty(out).clone();
        if !same_type(imp, want, &got) {
            // torch checks this at export as well; a mismatch here means the
            // shapes differ in a way kiln cannot prove equal.
            return unsupported(format!(
                "while_loop carried value {i} enters as {} and `{}` returns {}: a carried value must keep its dtype and shape",
                show(imp, want),
                body_fn.name,
                show(imp, &got)
            ));
        }
    }
    let op = Op::While { carried: carried.len(), cond: Region::new(cond), body: Region::new(body) };
    let node = imp.g.add_node(op, operands, types[..carried.len()].to_vec(), imp.loc());
    let results = imp.g.nodes[node].outputs.clone();
    bind_all(imp, n, &results)
}
