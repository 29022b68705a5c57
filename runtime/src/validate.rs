//! Load-time validation of a decoded [`Plan`]. After this passes, execution
//! may index every table without checks, and the executor's use of one arena
//! for all tensors is sound:
//!
//! - every symbol has `min <= max` and is bound by some input dimension;
//! - every expression's operands index earlier expressions or existing symbols;
//! - every tensor's shape references exist, its rank is at most [`MAX_RANK`], and
//!   its largest possible size (all symbols at their max) fits its storage;
//! - arena tensors lie inside the arena and are aligned to their element size;
//!   weight tensors are static, lie inside the weights section, are
//!   `WEIGHT_ALIGN`-aligned and exactly as long as their shape says;
//! - inputs live in the arena; every instruction has a valid operand count,
//!   valid tensor indices, outputs in the arena that overlap neither each other
//!   nor any of its inputs (except a `Copy` onto its own input's storage);
//! - kernel parameters agree with the ranks of the tensors they apply to
//!   (element-wise gather/scatter operands share a rank; advanced indexing
//!   has no more index tensors than axes after `axis`);
//! - a `Kernel::Accel` instruction names an existing segment of the accel
//!   section, its inputs/outputs are exactly that segment's args/results, it
//!   has at least one output, its outputs lie in the arena and overlap neither
//!   each other nor any argument; every segment's tensor indices exist and
//!   every CPU-fallback note names an existing instruction.

use crate::format::{AccelProgram, DimExpr, DimRef, Instr, Kernel, Plan, Storage, TensorDecl, WEIGHT_ALIGN};
use crate::{Error, Result};

pub const MAX_RANK: usize = 16;

fn bad(msg: String) -> Error {
    Error::Plan(msg)
}

pub(crate) fn validate_plan(plan: &Plan, weights_len: u64, accel: Option<&AccelProgram>) -> Result<()> {
    for (i, s) in plan.symbols.iter().enumerate() {
        if s.min > s.max {
            return Err(bad(format!("symbol {i} `{}` has min {} > max {}", s.name, s.min, s.max)));
        }
    }
    let bounds = expr_upper_bounds(plan)?;
    for (i, t) in plan.tensors.iter().enumerate() {
        validate_tensor(plan, &bounds, weights_len, i, t)?;
    }
    validate_io(plan)?;
    if let Some(accel) = accel {
        validate_accel(plan, accel)?;
    }
    for (i, instr) in plan.instrs.iter().enumerate() {
        validate_instr(plan, accel, instr).map_err(|e| bad(format!("instruction {i} ({}, {}): {e}", instr.kernel.name(), instr.origin)))?;
    }
    Ok(())
}

/// Upper bound of every expression (symbols at their max), saturating. Lower
/// bounds are tracked alongside for `//` and `-`, whose upper bound depends
/// on the divisor's and subtrahend's lower bound. This must never be below
/// the compiler's bound (`kiln_ir::Dim::bounds`) for the same expression.
fn expr_upper_bounds(plan: &Plan) -> Result<Vec<u64>> {
    let mut b: Vec<(u64, u64)> = Vec::with_capacity(plan.exprs.len());
    for (i, e) in plan.exprs.iter().enumerate() {
        let operand = |j: u32| -> Result<(u64, u64)> {
            b.get(j as usize).copied().ok_or_else(|| bad(format!("expression {i} uses expression {j}, which is not defined before it")))
        };
        let v = match *e {
            DimExpr::Const(c) => (c, c),
            DimExpr::Sym(s) => {
                let sym = plan.symbols.get(s as usize).ok_or_else(|| bad(format!("expression {i} uses unknown symbol {s}")))?;
                (sym.min.min(sym.max), sym.max)
            }
            DimExpr::Add(x, y) => {
                let ((xl, xh), (yl, yh)) = (operand(x)?, operand(y)?);
                (xl.saturating_add(yl), xh.saturating_add(yh))
            }
            DimExpr::Mul(x, y) => {
                let ((xl, xh), (yl, yh)) = (operand(x)?, operand(y)?);
                (xl.saturating_mul(yl), xh.saturating_mul(yh))
            }
            // Dimensions are non-negative; `//` by 0 evaluates to 0.
            DimExpr::FloorDiv(x, y) => {
                let ((xl, xh), (yl, yh)) = (operand(x)?, operand(y)?);
                (if yl == 0 { 0 } else { xl / yh.max(1) }, xh / yl.max(1))
            }
            DimExpr::Mod(x, y) => {
                operand(x)?;
                (0, operand(y)?.1.saturating_sub(1))
            }
            DimExpr::Sub(x, y) => {
                let ((xl, xh), (yl, yh)) = (operand(x)?, operand(y)?);
                (xl.saturating_sub(yh), xh.saturating_sub(yl))
            }
        };
        b.push(v);
    }
    Ok(b.into_iter().map(|(_, hi)| hi).collect())
}

fn dim_upper(bounds: &[u64], d: DimRef) -> Result<u64> {
    match d {
        DimRef::Static(v) => Ok(v),
        DimRef::Expr(e) => bounds.get(e as usize).copied().ok_or_else(|| bad(format!("unknown dimension expression {e}"))),
    }
}

fn validate_tensor(plan: &Plan, bounds: &[u64], weights_len: u64, i: usize, t: &TensorDecl) -> Result<()> {
    let ctx = |msg: String| bad(format!("tensor {i}: {msg}"));
    if t.shape.len() > MAX_RANK {
        return Err(ctx(format!("rank {} exceeds the maximum {MAX_RANK}", t.shape.len())));
    }
    let mut max_elems: u64 = 1;
    for d in &t.shape {
        max_elems = max_elems.checked_mul(dim_upper(bounds, *d)?).ok_or_else(|| ctx("size overflows u64".into()))?;
    }
    let elem = t.dtype.size_bytes() as u64;
    let max_bytes_needed = max_elems.checked_mul(elem).ok_or_else(|| ctx("size overflows u64".into()))?;
    match t.storage {
        Storage::Arena { offset, max_bytes } => {
            let end = offset.checked_add(max_bytes).ok_or_else(|| ctx("arena range overflows".into()))?;
            if end > plan.arena_bytes {
                return Err(ctx(format!("arena range {offset}..{end} exceeds the arena ({} bytes)", plan.arena_bytes)));
            }
            if offset % elem != 0 {
                return Err(ctx(format!("arena offset {offset} is not aligned to its {elem}-byte elements")));
            }
            if max_bytes_needed > max_bytes {
                return Err(ctx(format!("may need {max_bytes_needed} bytes but its slot holds {max_bytes}")));
            }
        }
        Storage::Weight { offset, bytes } => {
            if t.shape.iter().any(|d| matches!(d, DimRef::Expr(_))) {
                return Err(ctx("a weight must have a static shape".into()));
            }
            if bytes != max_bytes_needed {
                return Err(ctx(format!("weight holds {bytes} bytes but its shape needs {max_bytes_needed}")));
            }
            let end = offset.checked_add(bytes).ok_or_else(|| ctx("weight range overflows".into()))?;
            if end > weights_len || offset % WEIGHT_ALIGN != 0 {
                return Err(ctx(format!(
                    "weight range {offset}..{end} is outside the weights section ({weights_len} bytes) or not {WEIGHT_ALIGN}-aligned"
                )));
            }
        }
    }
    Ok(())
}

fn tensor(plan: &Plan, t: u32) -> Result<&TensorDecl> {
    plan.tensors.get(t as usize).ok_or_else(|| bad(format!("tensor index {t} out of range ({} tensors)", plan.tensors.len())))
}

fn validate_io(plan: &Plan) -> Result<()> {
    let mut bound = vec![false; plan.symbols.len()];
    for (i, io) in plan.inputs.iter().enumerate() {
        let t = tensor(plan, io.tensor)?;
        if !matches!(t.storage, Storage::Arena { .. }) {
            return Err(bad(format!("input {i} `{}` is not in the arena", io.name)));
        }
        for d in &t.shape {
            if let DimRef::Expr(e) = d {
                if let Some((s, _, _)) = plan.affine_symbol(*e) {
                    if let Some(b) = bound.get_mut(s as usize) {
                        *b = true;
                    }
                }
            }
        }
    }
    if let Some(s) = bound.iter().position(|b| !b) {
        return Err(bad(format!("symbol `{}` is not the size of any input dimension, so it cannot be bound", plan.symbols[s].name)));
    }
    for io in &plan.outputs {
        tensor(plan, io.tensor)?;
    }
    Ok(())
}

fn arena_range(t: &TensorDecl) -> Option<(u64, u64)> {
    match t.storage {
        Storage::Arena { offset, max_bytes } => Some((offset, offset + max_bytes)),
        Storage::Weight { .. } => None,
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn validate_accel(plan: &Plan, accel: &AccelProgram) -> Result<()> {
    for (i, seg) in accel.segments.iter().enumerate() {
        for &t in seg.args.iter().chain(&seg.results) {
            tensor(plan, t).map_err(|e| bad(format!("accelerator segment {i}: {e}")))?;
        }
    }
    for f in &accel.cpu_fallbacks {
        if f.instr as usize >= plan.instrs.len() {
            return Err(bad(format!("CPU fallback note names instruction {}, but the plan has {}", f.instr, plan.instrs.len())));
        }
    }
    Ok(())
}

fn validate_accel_instr(plan: &Plan, accel: Option<&AccelProgram>, segment: u32, instr: &Instr) -> std::result::Result<(), String> {
    let accel = accel.ok_or("the artifact has no accelerator section")?;
    let seg = accel
        .segments
        .get(segment as usize)
        .ok_or_else(|| format!("segment {segment} does not exist ({} segments)", accel.segments.len()))?;
    if instr.inputs != seg.args || instr.outputs != seg.results {
        return Err(format!("operands/results differ from segment {segment}'s arguments/results"));
    }
    if instr.outputs.is_empty() {
        return Err("has no outputs".into());
    }
    let get = |t: u32| plan.tensors.get(t as usize).ok_or_else(|| format!("tensor index {t} out of range"));
    let mut outs = Vec::with_capacity(instr.outputs.len());
    for &t in &instr.outputs {
        outs.push(arena_range(get(t)?).ok_or_else(|| format!("result tensor {t} is a read-only weight"))?);
    }
    for (a, ra) in outs.iter().enumerate() {
        if outs[..a].iter().any(|rb| overlaps(*ra, *rb)) {
            return Err(format!("result {a} overlaps another result"));
        }
    }
    for (k, &t) in instr.inputs.iter().enumerate() {
        if let Some(r) = arena_range(get(t)?) {
            if outs.iter().any(|o| overlaps(r, *o)) {
                return Err(format!("a result overlaps argument {k}"));
            }
        }
    }
    Ok(())
}

fn validate_instr(plan: &Plan, accel: Option<&AccelProgram>, instr: &Instr) -> std::result::Result<(), String> {
    if let Kernel::Accel { segment } = instr.kernel {
        return validate_accel_instr(plan, accel, segment, instr);
    }
    let (lo, hi) = instr.kernel.operand_count();
    if instr.inputs.len() < lo || instr.inputs.len() > hi {
        return Err(format!("has {} operands, expected {lo}..={hi}", instr.inputs.len()));
    }
    if instr.outputs.len() != 1 {
        return Err(format!("has {} outputs, expected 1", instr.outputs.len()));
    }
    let get = |t: u32| plan.tensors.get(t as usize).ok_or_else(|| format!("tensor index {t} out of range"));
    let ins = instr.inputs.iter().map(|&t| get(t)).collect::<std::result::Result<Vec<_>, _>>()?;
    let out = get(instr.outputs[0])?;
    let out_range = arena_range(out).ok_or("writes to a read-only weight")?;
    for (k, t) in ins.iter().enumerate() {
        if let Some(r) = arena_range(t) {
            let same_storage_copy = matches!(instr.kernel, Kernel::Copy) && r == out_range;
            if overlaps(r, out_range) && !same_storage_copy {
                return Err(format!("output memory overlaps operand {k}"));
            }
        }
    }
    validate_params(&instr.kernel, &ins, out)
}

fn validate_params(k: &Kernel, ins: &[&TensorDecl], out: &TensorDecl) -> std::result::Result<(), String> {
    let rank = |t: &TensorDecl| t.shape.len();
    let in_rank = ins.first().map_or(0, |t| rank(t));
    let axis_ok = |axis: u32, r: usize| if (axis as usize) < r { Ok(()) } else { Err(format!("axis {axis} out of range for rank {r}")) };
    match k {
        Kernel::Softmax { axis, .. } | Kernel::ArgMax { axis } | Kernel::Slice { axis, .. } | Kernel::SliceFromEnd { axis, .. } => {
            axis_ok(*axis, in_rank)?
        }
        Kernel::Gather { axis } => axis_ok(*axis, in_rank)?,
        Kernel::GatherElements { axis } | Kernel::ScatterElements { axis, .. } => {
            axis_ok(*axis, in_rank)?;
            if ins.iter().any(|t| rank(t) != in_rank) {
                return Err("operands of different ranks".into());
            }
        }
        Kernel::IndexGather { axis } | Kernel::IndexPut { axis, .. } => {
            let count = ins.len() - if matches!(k, Kernel::IndexPut { .. }) { 2 } else { 1 };
            if *axis as usize + count > in_rank {
                return Err(format!("{count} index tensors from axis {axis} exceed rank {in_rank}"));
            }
        }
        Kernel::Concat { axis } => axis_ok(*axis, rank(out))?,
        Kernel::Reduce { axes, .. } => {
            for a in axes {
                axis_ok(*a, in_rank)?
            }
        }
        Kernel::Permute { perm } => {
            let mut seen = vec![false; in_rank];
            if perm.len() != in_rank || rank(out) != in_rank {
                return Err(format!("permutation {perm:?} does not match rank {in_rank}"));
            }
            for &p in perm {
                match seen.get_mut(p as usize) {
                    Some(s) if !*s => *s = true,
                    _ => return Err(format!("{perm:?} is not a permutation")),
                }
            }
        }
        Kernel::LayerNorm { normalized_rank, .. } if *normalized_rank as usize > in_rank => {
            return Err(format!("normalizes {normalized_rank} dims of a rank-{in_rank} tensor"))
        }
        Kernel::Conv { stride, padding, dilation, groups } => {
            let spatial = in_rank.saturating_sub(2);
            if spatial == 0 || spatial > 3 || [stride.len(), padding.len(), dilation.len()].iter().any(|&l| l != spatial) || *groups == 0 {
                return Err("convolution parameters do not match the input rank".into());
            }
        }
        Kernel::Pool { kernel, stride, padding, dilation, .. } => {
            let n = kernel.len();
            if n == 0 || n > 3 || n > in_rank || [stride.len(), padding.len(), dilation.len()].iter().any(|&l| l != n) {
                return Err("pooling parameters do not match the input rank".into());
            }
        }
        Kernel::CumSum { axis } | Kernel::ArgMin { axis } | Kernel::Sort { axis, .. } => axis_ok(*axis, in_rank)?,
        Kernel::Flip { axes } => {
            for a in axes {
                axis_ok(*a, in_rank)?
            }
        }
        Kernel::Pad { lo, hi, interior, .. } => {
            if [lo.len(), hi.len(), interior.len(), rank(out)].iter().any(|&l| l != in_rank) || interior.iter().any(|&i| i < 0) {
                return Err("padding parameters do not match the input rank".into());
            }
        }
        Kernel::Resize { spatial, scales, .. } => {
            let s = *spatial as usize;
            if s == 0 || s > 3 || s > in_rank || rank(out) != in_rank || !(scales.is_empty() || scales.len() == s) {
                return Err("resize parameters do not match the input rank".into());
            }
        }
        _ => {}
    }
    if let Kernel::Slice { step, .. } | Kernel::SliceFromEnd { step, .. } = k {
        if *step == 0 {
            return Err("slice step is 0".into());
        }
    }
    Ok(())
}
