//! Load-time validation of a decoded [`Plan`]. After this passes, execution
//! may index every table without checks, and the executor's use of one arena
//! for all tensors is sound:
//!
//! - every symbol has `min <= max` and is bound either by some input dimension
//!   or by exactly one `BindDim` instruction (a data-dependent symbol), never
//!   both; no input's shape mentions a data-dependent symbol, and no
//!   instruction's operand or output shape mentions one before its `BindDim`
//!   (whose operand is a 0-d i64 and which has no outputs);
//! - every expression's operands index earlier expressions or existing symbols;
//! - every tensor's shape references exist, its rank is at most [`MAX_RANK`], and
//!   its largest possible size (all symbols at their max) fits its storage;
//! - arena tensors lie inside the arena and are aligned to their element size;
//!   weight tensors are static, lie inside the weights section, are
//!   `WEIGHT_ALIGN`-aligned and exactly as long as their shape says;
//! - inputs live in the arena; every instruction has operand and output
//!   counts its opcode allows (`kiln_isa::opcode`), valid tensor indices,
//!   outputs in the arena that overlap neither each other nor any of its
//!   inputs (except a `Copy` onto its own input's storage); a call's second
//!   output is the i64 indices, shaped like the values, of a sort or max pool;
//! - kernel parameters agree with the ranks of the tensors they apply to:
//!   each parameter declared with a kind in `format::plan`'s `kernels!` table
//!   gets that kind's check ([`param`]: axes in range, normalised ranks,
//!   non-zero steps and groups, one entry per dim or per spatial dim), named
//!   in the error; the rest, relating several parameters or tensors, is
//!   checked per opcode (element-wise gather/scatter operands share a rank; advanced indexing
//!   has no more index tensors than axes after `axis`; a fused program reads
//!   only defined registers, its ops' dtypes agree with its operands', it
//!   yields the output's dtype, and no operand outranks the output);
//! - loops are structured: a `Jump` goes back to an instruction at or before
//!   itself (the loop is `target..=jump`); two loops are disjoint or nested
//!   and never share a first instruction; each loop has exactly one
//!   `JumpIfFalse`, directly inside it (not in a nested loop), whose target
//!   is the instruction just past its `Jump`; every `JumpIfFalse` is such an
//!   exit, and its operand is a 1-element bool; no `BindDim` is inside a
//!   loop (shapes are fixed for a loop's whole run). Nothing bounds the trip
//!   count: a loop whose condition stays true runs forever, as in torch;
//! - a `Delegate` instruction names an existing segment of the accel
//!   section, its inputs/outputs are exactly that segment's args/results, it
//!   has at least one output, its outputs lie in the arena and overlap neither
//!   each other nor any argument; every segment's tensor indices exist and
//!   every CPU-fallback note names an existing instruction;
//! - states (buffers kept between runs) have unique non-empty names; each
//!   one's current value is an arena tensor with a static shape, its update
//!   and initial value (a weight) have the same dtype and shape; the current
//!   values overlap neither each other nor any input, output or other
//!   state's update (no output reads a value a later run overwrites); an
//!   update is the state's own current value or lies outside every state; an
//!   instruction output in a state's storage is the whole of it, written by a
//!   CPU instruction, for a state whose update is its current value (written
//!   during the run: no end-of-run copy).
//! - an output may overlap an operand only as a `Copy` onto the same storage
//!   (a no-op) or as an in-place update: operand 0 and output 0 the same
//!   tensor, of a kernel with an in-place form (`index_put`,
//!   `scatter_elements`).

use crate::format::{
    AccelProgram, DimExpr, DimRef, Instr, InstrOp, IoDecl, Kernel, Layout, Plan, PoolKind, StateDecl, Storage,
    TensorDecl, WEIGHT_ALIGN,
};
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
    let binders = data_dependent_binders(plan)?;
    let ready = tensor_ready(plan, &binders)?;
    validate_io(plan, &binders, &ready)?;
    validate_states(plan)?;
    if let Some(accel) = accel {
        validate_accel(plan, accel)?;
    }
    validate_loops(plan)?;
    for (i, instr) in plan.instrs.iter().enumerate() {
        let ctx = |e: String| bad(format!("instruction {i} ({}, {}): {e}", instr.op.name(), instr.origin));
        validate_instr(plan, accel, instr).map_err(ctx)?;
        // Indices were checked by `validate_instr`.
        for &t in instr.inputs.iter().chain(&instr.outputs) {
            if ready[t as usize] > i {
                let name = bound_by(plan, &binders, ready[t as usize]);
                return Err(ctx(format!(
                    "tensor {t}'s shape uses data-dependent symbol `{name}` before instruction {} binds it",
                    ready[t as usize] - 1
                )));
            }
        }
    }
    Ok(())
}

/// The structure of loops (see the module doc); operands are checked with
/// the other instructions.
fn validate_loops(plan: &Plan) -> Result<()> {
    let n = plan.instrs.len();
    // (first, jump) of every loop, in the order of their jumps.
    let mut loops: Vec<(usize, usize)> = Vec::new();
    for (j, instr) in plan.instrs.iter().enumerate() {
        if let InstrOp::Jump { target } = instr.op {
            let h = target as usize;
            if h > j {
                return Err(bad(format!(
                    "instruction {j} (jump) goes forward to {target}; a jump must go back to its loop's start"
                )));
            }
            for &(h2, j2) in &loops {
                // `j2 < j`: the other loop either ends before this one starts or lies inside it.
                if h2 == h || (h2 < h && h <= j2) {
                    return Err(bad(format!("loop {h}..={j} overlaps loop {h2}..={j2} without nesting in it")));
                }
            }
            loops.push((h, j));
        }
    }
    // The innermost loop holding instruction `i`: the shortest one containing it.
    let innermost = |i: usize| loops.iter().filter(|&&(h, j)| h <= i && i <= j).min_by_key(|&&(h, j)| j - h).copied();
    let mut exits = vec![0usize; loops.len()];
    for (i, instr) in plan.instrs.iter().enumerate() {
        match instr.op {
            InstrOp::JumpIfFalse { target } => {
                let t = target as usize;
                let Some((h, j)) = innermost(i) else {
                    return Err(bad(format!("instruction {i} (jump_if_false) is not inside a loop")));
                };
                if t != j + 1 || t > n {
                    return Err(bad(format!(
                        "instruction {i} (jump_if_false) targets {target}; the exit of its loop {h}..={j} is {}",
                        j + 1
                    )));
                }
                if let Some(k) = loops.iter().position(|&l| l == (h, j)) {
                    exits[k] += 1;
                }
            }
            InstrOp::BindDim { .. } if innermost(i).is_some() => {
                return Err(bad(format!("instruction {i} (bind_dim) is inside a loop")));
            }
            _ => {}
        }
    }
    if let Some(k) = exits.iter().position(|&e| e != 1) {
        let (h, j) = loops[k];
        return Err(bad(format!("loop {h}..={j} has {} exits (jump_if_false), expected 1", exits[k])));
    }
    Ok(())
}

/// The `BindDim` instruction binding each symbol, if any (at most one each).
fn data_dependent_binders(plan: &Plan) -> Result<Vec<Option<u32>>> {
    let mut binders = vec![None; plan.symbols.len()];
    for (i, instr) in plan.instrs.iter().enumerate() {
        if let InstrOp::BindDim { symbol } = instr.op {
            let b = binders
                .get_mut(symbol as usize)
                .ok_or_else(|| bad(format!("instruction {i} (bind_dim) binds unknown symbol {symbol}")))?;
            if let Some(first) = b.replace(i as u32) {
                return Err(bad(format!(
                    "instruction {i} (bind_dim) binds symbol {symbol}, already bound by instruction {first}"
                )));
            }
        }
    }
    Ok(binders)
}

/// The name of the symbol bound by instruction `ready - 1`.
fn bound_by<'p>(plan: &'p Plan, binders: &[Option<u32>], ready: usize) -> &'p str {
    let s = binders.iter().position(|b| b.is_some_and(|b| b as usize + 1 == ready));
    s.and_then(|s| plan.symbols.get(s)).map_or("?", |sym| sym.name.as_str())
}

/// For every tensor, the first instruction index at which all the
/// data-dependent symbols its shape mentions are bound (0 when none).
fn tensor_ready(plan: &Plan, binders: &[Option<u32>]) -> Result<Vec<usize>> {
    // Expression operands were checked to precede their users by `expr_upper_bounds`.
    let mut expr_ready: Vec<usize> = Vec::with_capacity(plan.exprs.len());
    for e in &plan.exprs {
        let at = |j: u32| expr_ready.get(j as usize).copied().unwrap_or(0);
        let r = match *e {
            DimExpr::Const(_) => 0,
            DimExpr::Sym(s) => binders.get(s as usize).copied().flatten().map_or(0, |b| b as usize + 1),
            DimExpr::Add(a, b)
            | DimExpr::Mul(a, b)
            | DimExpr::FloorDiv(a, b)
            | DimExpr::Mod(a, b)
            | DimExpr::Sub(a, b) => at(a).max(at(b)),
        };
        expr_ready.push(r);
    }
    let ready = plan
        .tensors
        .iter()
        .map(|t| {
            t.shape
                .iter()
                .map(|d| match d {
                    DimRef::Static(_) => 0,
                    DimRef::Expr(e) => expr_ready.get(*e as usize).copied().unwrap_or(0),
                })
                .max()
                .unwrap_or(0)
        })
        .collect();
    Ok(ready)
}

/// Upper bound of every expression (symbols at their max), saturating. Lower
/// bounds are tracked alongside for `//` and `-`, whose upper bound depends
/// on the divisor's and subtrahend's lower bound. This must never be below
/// the compiler's bound (`kiln_ir::Dim::bounds`) for the same expression.
fn expr_upper_bounds(plan: &Plan) -> Result<Vec<u64>> {
    let mut b: Vec<(u64, u64)> = Vec::with_capacity(plan.exprs.len());
    for (i, e) in plan.exprs.iter().enumerate() {
        let operand = |j: u32| -> Result<(u64, u64)> {
            b.get(j as usize)
                .copied()
                .ok_or_else(|| bad(format!("expression {i} uses expression {j}, which is not defined before it")))
        };
        let v = match *e {
            DimExpr::Const(c) => (c, c),
            DimExpr::Sym(s) => {
                let sym = plan
                    .symbols
                    .get(s as usize)
                    .ok_or_else(|| bad(format!("expression {i} uses unknown symbol {s}")))?;
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
        DimRef::Expr(e) => {
            bounds.get(e as usize).copied().ok_or_else(|| bad(format!("unknown dimension expression {e}")))
        }
    }
}

fn validate_tensor(plan: &Plan, bounds: &[u64], weights_len: u64, i: usize, t: &TensorDecl) -> Result<()> {
    let ctx = |msg: String| bad(format!("tensor {i}: {msg}"));
    if t.dtype.is_complex() {
        // A complex input or output is its f32/f64 parts (`IoDecl::complex`).
        return Err(ctx(format!("dtype {} (complex tensors exist only as an input's or output's view)", t.dtype)));
    }
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
    plan.tensors
        .get(t as usize)
        .ok_or_else(|| bad(format!("tensor index {t} out of range ({} tensors)", plan.tensors.len())))
}

/// A complex input's or output's tensor holds the parts: f32 or f64 with a
/// static last dimension of 2 (see [`Plan::io_type`]).
fn validate_complex_io(plan: &Plan, what: &str, io: &IoDecl) -> Result<()> {
    let t = tensor(plan, io.tensor)?;
    if io.complex && (t.dtype.complex_of().is_none() || t.shape.last() != Some(&DimRef::Static(2))) {
        return Err(bad(format!(
            "{what} `{}` is complex but its tensor is {} {:?}, not f32/f64 with a last dimension of 2",
            io.name, t.dtype, t.shape
        )));
    }
    Ok(())
}

fn validate_io(plan: &Plan, binders: &[Option<u32>], ready: &[usize]) -> Result<()> {
    let mut bound = vec![false; plan.symbols.len()];
    for (i, io) in plan.inputs.iter().enumerate() {
        validate_complex_io(plan, "input", io)?;
        let t = tensor(plan, io.tensor)?;
        if !matches!(t.storage, Storage::Arena { .. }) {
            return Err(bad(format!("input {i} `{}` is not in the arena", io.name)));
        }
        if ready[io.tensor as usize] > 0 {
            return Err(bad(format!(
                "input {i} `{}`: its shape uses `{}`, which a bind_dim instruction binds from data",
                io.name,
                bound_by(plan, binders, ready[io.tensor as usize])
            )));
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
    if let Some(s) = bound.iter().zip(binders).position(|(b, d)| !b && d.is_none()) {
        return Err(bad(format!(
            "symbol `{}` is neither the size of an input dimension nor bound by an instruction, so it cannot be bound",
            plan.symbols[s].name
        )));
    }
    for io in &plan.outputs {
        validate_complex_io(plan, "output", io)?;
    }
    Ok(())
}

/// The states' tables (see the module doc).
fn validate_states(plan: &Plan) -> Result<()> {
    let mut regions: Vec<(u64, u64)> = Vec::with_capacity(plan.states.len());
    for (k, st) in plan.states.iter().enumerate() {
        let ctx = |e: String| bad(format!("state {k} `{}`: {e}", st.name));
        if st.name.is_empty() || plan.states[..k].iter().any(|o| o.name == st.name) {
            return Err(ctx("its name is empty or not unique".into()));
        }
        let (current, update, init) = (tensor(plan, st.tensor)?, tensor(plan, st.update)?, tensor(plan, st.init)?);
        let Some(region) = arena_range(current) else {
            return Err(ctx("its current value is not in the arena".into()));
        };
        if !matches!(init.storage, Storage::Weight { .. }) {
            return Err(ctx("its initial value is not a weight".into()));
        }
        let is_static = |t: &TensorDecl| t.shape.iter().all(|d| matches!(d, DimRef::Static(_)));
        for (what, t) in [("update", update), ("initial value", init)] {
            if t.dtype != current.dtype || t.shape != current.shape || !is_static(t) {
                return Err(ctx(format!("its {what} is not a static tensor of its dtype and shape")));
            }
        }
        if !is_static(current) {
            return Err(ctx("its shape is not static".into()));
        }
        regions.push(region);
    }
    let in_state = |r: (u64, u64)| regions.iter().position(|&s| overlaps(r, s));
    let arena = |t: u32| plan.tensors.get(t as usize).and_then(arena_range);
    for (k, &r) in regions.iter().enumerate() {
        if let Some(j) = regions[..k].iter().position(|&s| overlaps(r, s)) {
            return Err(bad(format!("states {j} and {k} overlap in the arena")));
        }
    }
    for (k, st) in plan.states.iter().enumerate() {
        if st.update != st.tensor {
            if let Some(j) = arena(st.update).and_then(in_state) {
                return Err(bad(format!("state {k} `{}`: its update lies in state {j}'s storage", st.name)));
            }
        }
    }
    let io = plan.inputs.iter().map(|io| ("input", io)).chain(plan.outputs.iter().map(|io| ("output", io)));
    for (what, io) in io {
        if let Some(j) = arena(io.tensor).and_then(in_state) {
            return Err(bad(format!("{what} `{}` lies in the storage of state {j}", io.name)));
        }
    }
    for (i, instr) in plan.instrs.iter().enumerate() {
        for &t in &instr.outputs {
            let Some(j) = arena(t).and_then(in_state) else { continue };
            // A state written during the run: the whole of its storage, by a
            // CPU instruction, and the state's update is that storage (no
            // end-of-run copy over it).
            let whole = arena(t) == Some(regions[j]) && plan.states[j].update == plan.states[j].tensor;
            if !whole || matches!(instr.op, InstrOp::Delegate { .. }) {
                return Err(bad(format!("instruction {i} ({}) writes into the storage of state {j}", instr.origin)));
            }
        }
    }
    Ok(())
}

/// The state `name`'s declaration, if the plan has one.
pub(crate) fn find_state<'p>(plan: &'p Plan, name: &str) -> Option<(usize, &'p StateDecl)> {
    plan.states.iter().enumerate().find(|(_, s)| s.name == name)
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
        validate_index_checks(plan, seg).map_err(|e| bad(format!("accelerator segment {i}: {e}")))?;
    }
    match &accel.mesh {
        Some(mesh) => validate_mesh(plan, accel, mesh).map_err(|e| bad(format!("sharded program: {e}")))?,
        None => {
            if accel.segments.iter().any(|s| !s.arg_shardings.is_empty() || !s.result_shardings.is_empty()) {
                return Err(bad("an accelerator segment has shardings but the program has no mesh".to_string()));
            }
        }
    }
    for (i, b) in accel.buckets.iter().enumerate() {
        validate_bucket(plan, accel, b).map_err(|e| bad(format!("shape bucket {i}: {e}")))?;
    }
    for f in &accel.cpu_fallbacks {
        if f.instr as usize >= plan.instrs.len() {
            return Err(bad(format!(
                "CPU fallback note names instruction {}, but the plan has {}",
                f.instr,
                plan.instrs.len()
            )));
        }
    }
    Ok(())
}

/// Each index check names an argument of the segment whose tensor holds
/// i32 or i64 indices.
fn validate_index_checks(plan: &Plan, seg: &crate::format::AccelSegment) -> std::result::Result<(), String> {
    for c in &seg.index_checks {
        let t = seg.args.get(c.arg as usize).ok_or_else(|| format!("index check names argument {}", c.arg))?;
        let dtype = plan.tensors.get(*t as usize).map(|d| d.dtype);
        if !matches!(dtype, Some(crate::DType::I64 | crate::DType::I32)) {
            return Err(format!("index check on argument {} of dtype {dtype:?}", c.arg));
        }
    }
    Ok(())
}

/// Most elements one padded bucket argument or result may have (2^40).
const MAX_BUCKET_ELEMENTS: u64 = 1 << 40;

/// A bucket: one size per plan symbol within its bounds; no mesh, no state;
/// arguments are the plan's inputs and weights, results distinct output
/// tensors in the arena; each padded shape has its tensor's rank, equals
/// its static dims, and stays under [`MAX_BUCKET_ELEMENTS`]; its true-size
/// arguments name distinct plan symbols.
fn validate_bucket(
    plan: &Plan,
    accel: &AccelProgram,
    b: &crate::format::AccelBucket,
) -> std::result::Result<(), String> {
    if accel.mesh.is_some() || !plan.states.is_empty() {
        return Err("buckets are for one device and programs without state".into());
    }
    if b.sizes.len() != plan.symbols.len() {
        return Err(format!("{} sizes for {} symbols", b.sizes.len(), plan.symbols.len()));
    }
    for (size, sym) in b.sizes.iter().zip(&plan.symbols) {
        if *size < sym.min || *size > sym.max {
            return Err(format!("size {size} of `{}` is outside [{}, {}]", sym.name, sym.min, sym.max));
        }
    }
    for (k, &s) in b.true_sizes.iter().enumerate() {
        if s as usize >= plan.symbols.len() {
            return Err(format!("true size {k} names symbol {s}, but the plan has {}", plan.symbols.len()));
        }
        if b.true_sizes[..k].contains(&s) {
            return Err(format!("true size {k} names symbol {s} twice"));
        }
    }
    let seg = &b.segment;
    if !seg.arg_shardings.is_empty() || !seg.result_shardings.is_empty() {
        return Err("a bucket has shardings".into());
    }
    for &t in &seg.args {
        tensor(plan, t).map_err(|e| e.to_string())?;
    }
    validate_index_checks(plan, seg)?;
    if b.arg_shapes.len() != seg.args.len() || b.result_shapes.len() != seg.results.len() {
        return Err("shapes do not match the arguments and results".into());
    }
    let check = |t: u32, shape: &[u64]| -> std::result::Result<(), String> {
        let decl = tensor(plan, t).map_err(|e| e.to_string())?;
        if decl.shape.len() != shape.len() {
            return Err(format!("tensor {t} has rank {} but its padded shape {shape:?}", decl.shape.len()));
        }
        for (d, &p) in decl.shape.iter().zip(shape) {
            if let DimRef::Static(v) = d {
                if *v != p {
                    return Err(format!("tensor {t}'s static dim {v} is padded to {p}"));
                }
            }
        }
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).filter(|&n| n <= MAX_BUCKET_ELEMENTS);
        if elements.is_none() {
            return Err(format!("padded shape {shape:?} of tensor {t} is too large"));
        }
        Ok(())
    };
    for (&t, shape) in seg.args.iter().zip(&b.arg_shapes) {
        check(t, shape)?;
        let decl = &plan.tensors[t as usize];
        let is_input = plan.inputs.iter().any(|io| io.tensor == t);
        if !is_input && !matches!(decl.storage, Storage::Weight { .. }) {
            return Err(format!("argument tensor {t} is neither an input nor a weight"));
        }
    }
    let mut seen = Vec::new();
    for (&t, shape) in seg.results.iter().zip(&b.result_shapes) {
        check(t, shape)?;
        if !plan.outputs.iter().any(|io| io.tensor == t) || seen.contains(&t) {
            return Err(format!("result tensor {t} is not a distinct output"));
        }
        if !matches!(plan.tensors[t as usize].storage, Storage::Arena { .. }) {
            return Err(format!("result tensor {t} is not in the arena"));
        }
        seen.push(t);
    }
    if let Some(io) = plan.outputs.iter().find(|io| !seen.contains(&io.tensor)) {
        return Err(format!("output `{}` is not one of its results", io.name));
    }
    Ok(())
}

/// Most devices one mesh may name (far above any single host).
const MAX_MESH_DEVICES: u64 = 1 << 16;

/// A mesh: 1–16 named axes of size ≥ 1, at most [`MAX_MESH_DEVICES`]
/// devices, a device list of distinct ids when given; exactly one segment,
/// whose every argument and result has a sharding of its rank over the
/// mesh's axes (each used once) that divides its static shape.
fn validate_mesh(plan: &Plan, accel: &AccelProgram, mesh: &crate::format::MeshDecl) -> std::result::Result<(), String> {
    if mesh.axes.is_empty() || mesh.axes.len() > 16 {
        return Err(format!("the mesh has {} axes (1 to 16 allowed)", mesh.axes.len()));
    }
    if mesh.axes.iter().any(|a| a.size == 0) || mesh.size() > MAX_MESH_DEVICES {
        return Err(format!("mesh axis sizes must be >= 1 and multiply to at most {MAX_MESH_DEVICES}"));
    }
    if !mesh.devices.is_empty() {
        let mut ids = mesh.devices.clone();
        ids.sort_unstable();
        ids.dedup();
        if mesh.devices.len() as u64 != mesh.size() || ids.len() != mesh.devices.len() {
            return Err(format!("the mesh of {} devices lists {} device ids", mesh.size(), mesh.devices.len()));
        }
    }
    let [seg] = accel.segments.as_slice() else {
        return Err(format!("{} accelerator segments (exactly one allowed)", accel.segments.len()));
    };
    if seg.arg_shardings.len() != seg.args.len() || seg.result_shardings.len() != seg.results.len() {
        return Err("the segment's shardings are not one per argument and result".to_string());
    }
    let pairs = seg.args.iter().zip(&seg.arg_shardings).chain(seg.results.iter().zip(&seg.result_shardings));
    for (&t, sharding) in pairs {
        let decl = tensor(plan, t).map_err(|e| e.to_string())?;
        if sharding.dims.len() != decl.shape.len() {
            return Err(format!("tensor {t}: sharding of rank {} for rank {}", sharding.dims.len(), decl.shape.len()));
        }
        let mut used = vec![false; mesh.axes.len()];
        for (d, axes) in sharding.dims.iter().enumerate() {
            let mut pieces = 1u64;
            for &a in axes {
                let slot =
                    used.get_mut(a as usize).ok_or_else(|| format!("tensor {t}: mesh axis {a} does not exist"))?;
                if std::mem::replace(slot, true) {
                    return Err(format!("tensor {t}: mesh axis {a} is used twice"));
                }
                pieces *= u64::from(mesh.axes[a as usize].size);
            }
            match decl.shape[d] {
                crate::format::DimRef::Static(n) if n % pieces == 0 => {}
                crate::format::DimRef::Static(n) => {
                    return Err(format!("tensor {t}: dim {d} (size {n}) is not divisible into {pieces} pieces"));
                }
                _ => return Err(format!("tensor {t}: a sharded tensor must have a static shape")),
            }
        }
    }
    Ok(())
}

fn validate_accel_instr(
    plan: &Plan,
    accel: Option<&AccelProgram>,
    segment: u32,
    instr: &Instr,
) -> std::result::Result<(), String> {
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

/// A native kernel with an elementwise prologue or epilogue (or both),
/// checked as its fallback's calls (the prologue's program into output 1,
/// the kernel from it — or from operand 0 — into output 0, the epilogue's
/// program from output 0 and the last operands into the last output),
/// and, since the row function computes them all in one pass over rows,
/// with no output overlapping any operand or another output.
fn validate_row_parts(
    plan: &Plan,
    accel: Option<&AccelProgram>,
    instr: &Instr,
    fallback: &Kernel,
    prologue: Option<&crate::format::RowPrologue>,
    epilogue: Option<&crate::format::RowEpilogue>,
) -> std::result::Result<(), String> {
    let want = 1 + usize::from(prologue.is_some()) + usize::from(epilogue.is_some());
    if instr.outputs.len() != want {
        let parts = match (prologue, epilogue) {
            (Some(_), Some(_)) => "the kernel's, its prologue's and its epilogue's",
            (Some(_), None) => "the kernel's and its prologue's",
            _ => "the kernel's and its epilogue's",
        };
        return Err(format!("has {} outputs, expected {want} ({parts})", instr.outputs.len()));
    }
    let k = prologue.map_or(0, |p| p.inputs as usize);
    let e = epilogue.map_or(0, |p| p.inputs as usize);
    if prologue.is_some() && (k == 0 || k + e > instr.inputs.len()) {
        return Err(format!("a prologue of {k} of its {} operands", instr.inputs.len()));
    }
    if k.max(1) + e > instr.inputs.len() {
        return Err(format!("an epilogue of {e} of its {} operands", instr.inputs.len()));
    }
    let (row_ins, extras) = instr.inputs.split_at(instr.inputs.len() - e);
    let out = instr.outputs[0];
    let x = match prologue {
        Some(p) => {
            let x = instr.outputs[1];
            let program = Instr {
                op: InstrOp::Call(Kernel::Fused { program: p.program.clone() }),
                inputs: row_ins[..k].to_vec(),
                outputs: vec![x],
                origin: String::new(),
            };
            validate_instr(plan, accel, &program).map_err(|e| format!("its prologue {e}"))?;
            x
        }
        None => row_ins[0],
    };
    let kernel = Instr {
        op: InstrOp::Call(fallback.clone()),
        inputs: std::iter::once(x).chain(row_ins[k.max(1)..].iter().copied()).collect(),
        outputs: vec![out],
        origin: String::new(),
    };
    validate_instr(plan, accel, &kernel)?;
    let get = |t: u32| plan.tensors.get(t as usize).ok_or_else(|| format!("tensor index {t} out of range"));
    if let Some(p) = epilogue {
        if p.row as usize > e {
            return Err(format!("its epilogue reads the kernel's result as operand {} of {}", p.row, e + 1));
        }
        let z = instr.outputs[want - 1];
        if get(z)?.shape != get(out)?.shape {
            return Err("its epilogue's result is shaped unlike the kernel's".into());
        }
        let program = Instr {
            op: InstrOp::Call(Kernel::Fused { program: p.program.clone() }),
            inputs: p.operands(out, extras),
            outputs: vec![z],
            origin: String::new(),
        };
        validate_instr(plan, accel, &program).map_err(|e| format!("its epilogue {e}"))?;
    }
    let mut outs = Vec::with_capacity(want);
    for (r, &t) in instr.outputs.iter().enumerate() {
        let range = arena_range(get(t)?).ok_or_else(|| format!("output {r} is a read-only weight"))?;
        if outs.iter().any(|o| overlaps(*o, range)) {
            return Err(format!("output {r} overlaps another output"));
        }
        outs.push(range);
    }
    for (j, &t) in instr.inputs.iter().enumerate() {
        if let Some(r) = arena_range(get(t)?) {
            if outs.iter().any(|o| overlaps(r, *o)) {
                return Err(format!("an output overlaps operand {j}"));
            }
        }
    }
    Ok(())
}

fn validate_instr(plan: &Plan, accel: Option<&AccelProgram>, instr: &Instr) -> std::result::Result<(), String> {
    let opcode = instr.op.opcode();
    let count_ok = |n: usize, (lo, hi): (u32, u32)| lo as usize <= n && n <= hi as usize;
    if !count_ok(instr.inputs.len(), opcode.operands()) {
        let (lo, hi) = opcode.operands();
        return Err(format!("has {} operands, expected {lo}..={hi}", instr.inputs.len()));
    }
    if !count_ok(instr.outputs.len(), opcode.outputs()) {
        let (lo, hi) = opcode.outputs();
        return Err(format!("has {} outputs, expected {lo}..={hi}", instr.outputs.len()));
    }
    // A native call (either kind) is checked as its portable fallback (the
    // same operands and output); the native section checks its function
    // (`crate::native`).
    let native_fallback;
    let kernel = match &instr.op {
        InstrOp::Native { program, .. } => {
            native_fallback = Kernel::Fused { program: program.clone() };
            &native_fallback
        }
        InstrOp::NativeKernel { fallback, prologue, epilogue, .. } if prologue.is_some() || epilogue.is_some() => {
            return validate_row_parts(plan, accel, instr, fallback, prologue.as_ref(), epilogue.as_ref())
        }
        InstrOp::NativeKernel { fallback, .. } => {
            if instr.outputs.len() != 1 {
                return Err(format!("has {} outputs, expected 1 (no prologue or epilogue)", instr.outputs.len()));
            }
            fallback
        }
        InstrOp::Delegate { segment } => return validate_accel_instr(plan, accel, *segment, instr),
        InstrOp::BindDim { .. } => {
            let count = tensor(plan, instr.inputs[0]).map_err(|e| e.to_string())?;
            if count.dtype != crate::DType::I64 || !count.shape.is_empty() {
                return Err("expects one 0-d i64 operand".into());
            }
            return Ok(());
        }
        InstrOp::JumpIfFalse { .. } => {
            let cond = tensor(plan, instr.inputs[0]).map_err(|e| e.to_string())?;
            let one = cond.shape.iter().all(|d| *d == crate::format::DimRef::Static(1));
            if cond.dtype != crate::DType::Bool || !one {
                return Err("expects one 1-element bool operand (static shape)".into());
            }
            return Ok(());
        }
        InstrOp::Jump { .. } => return Ok(()),
        InstrOp::Call(kernel) => kernel,
    };
    let get = |t: u32| plan.tensors.get(t as usize).ok_or_else(|| format!("tensor index {t} out of range"));
    let ins = instr.inputs.iter().map(|&t| get(t)).collect::<std::result::Result<Vec<_>, _>>()?;
    let outs = instr.outputs.iter().map(|&t| get(t)).collect::<std::result::Result<Vec<_>, _>>()?;
    let mut out_ranges = Vec::with_capacity(outs.len());
    for (r, out) in outs.iter().enumerate() {
        let out_range = arena_range(out).ok_or_else(|| format!("output {r} is a read-only weight"))?;
        if out_ranges.iter().any(|o| overlaps(*o, out_range)) {
            return Err(format!("output {r} overlaps another output"));
        }
        for (k, t) in ins.iter().enumerate() {
            if let Some(a) = arena_range(t) {
                let same_storage_copy = matches!(kernel, Kernel::Copy {}) && a == out_range;
                // A state updated in place: operand `k` is output 0's own
                // tensor, and no other operand is.
                let in_place = r == 0
                    && crate::exec::in_place_at(instr) == Some(k)
                    && crate::exec::in_place_fn(kernel, k).is_some();
                if overlaps(a, out_range) && !same_storage_copy && !in_place {
                    return Err(format!("output {r} overlaps operand {k}"));
                }
            }
        }
        out_ranges.push(out_range);
    }
    if let (Kernel::LinearFused { epilogue }, [_, _, ..]) = (kernel, &outs[..]) {
        validate_linear_split(epilogue, &outs)?;
    } else if let [values, indices] = outs[..] {
        // Two outputs: a sort's or a max pool's values and their i64 indices.
        let pairs = matches!(
            kernel,
            Kernel::Sort { .. } | Kernel::Pool { kind: PoolKind::Max, layout: Layout::ChannelsFirst, .. }
        );
        if !pairs || indices.dtype != crate::DType::I64 || indices.shape != values.shape {
            return Err("a second output must be the i64 indices (shaped like the values) of a sort or max pool".into());
        }
    }
    match outs.first() {
        Some(out) => validate_params(kernel, &ins, out),
        // Only a check (`assert`) has no output; it reads any operand.
        None => Ok(()),
    }
}

/// A `linear_fused` with several outputs (column ranges of one GEMM): no
/// residual, f32 outputs with the same leading dims (the kernel checks the
/// widths against the weight).
fn validate_linear_split(epilogue: &kiln_isa::Epilogue, outs: &[&TensorDecl]) -> std::result::Result<(), String> {
    if epilogue.residual != kiln_isa::Residual::None {
        return Err("a linear_fused with several outputs takes no residual".into());
    }
    let lead = |t: &TensorDecl| t.shape.split_last().map(|(_, lead)| lead.to_vec());
    let first = lead(outs[0]);
    if first.is_none() || outs.iter().any(|t| t.dtype != crate::DType::F32 || lead(t) != first) {
        return Err("the outputs of a linear_fused must be f32 with the same leading dims".into());
    }
    Ok(())
}

/// The per-kind parameter checks `kernels!` rows name (`axis: u32 => axis`):
/// the same for every opcode, so declared with the parameter, not per opcode.
pub(crate) mod param {
    /// The ranks a parameter is checked against.
    pub(crate) struct Ranks {
        /// The first operand's (0 without operands).
        pub input: usize,
        /// The first output's.
        pub output: usize,
    }

    /// An axis of the first operand.
    pub(crate) fn axis(name: &str, v: &u32, r: &Ranks) -> Result<(), String> {
        in_range(name, *v, r.input)
    }

    /// An axis of the output (concatenation: the operands may be rank 0..).
    pub(crate) fn output_axis(name: &str, v: &u32, r: &Ranks) -> Result<(), String> {
        in_range(name, *v, r.output)
    }

    /// Axes of the first operand.
    pub(crate) fn axes(name: &str, v: &[u32], r: &Ranks) -> Result<(), String> {
        v.iter().try_for_each(|&a| in_range(name, a, r.input))
    }

    /// A count of trailing dims of the first operand.
    pub(crate) fn normalized_rank(name: &str, v: &u32, r: &Ranks) -> Result<(), String> {
        if *v as usize > r.input {
            return Err(format!("parameter `{name}` normalizes {v} dims of a rank-{} tensor", r.input));
        }
        Ok(())
    }

    /// A step or group count: never 0.
    pub(crate) fn nonzero<T: Copy + Into<u64>>(name: &str, v: &T, _: &Ranks) -> Result<(), String> {
        if (*v).into() == 0 {
            return Err(format!("parameter `{name}` is 0"));
        }
        Ok(())
    }

    /// One entry per dim of the first operand.
    pub(crate) fn per_dim<T>(name: &str, v: &[T], r: &Ranks) -> Result<(), String> {
        if v.len() != r.input {
            return Err(format!("parameter `{name}` has {} entries for rank {}", v.len(), r.input));
        }
        Ok(())
    }

    /// One entry per spatial dim (after `N, C`) of the first operand: 1 to 3.
    pub(crate) fn spatial<T>(name: &str, v: &[T], r: &Ranks) -> Result<(), String> {
        let spatial = r.input.saturating_sub(2);
        if !(1..=3).contains(&spatial) || v.len() != spatial {
            return Err(format!(
                "parameter `{name}` has {} entries for a rank-{} input ({spatial} spatial dims, 1 to 3 allowed)",
                v.len(),
                r.input
            ));
        }
        Ok(())
    }

    fn in_range(name: &str, axis: u32, rank: usize) -> Result<(), String> {
        if (axis as usize) >= rank {
            return Err(format!("parameter `{name}` = {axis} is out of range for rank {rank}"));
        }
        Ok(())
    }
}

/// A call's parameters: first the checks each parameter's kind declares
/// (`Kernel::check_params`), then the ones that relate several parameters
/// or tensors, hand-written per opcode.
fn validate_params(k: &Kernel, ins: &[&TensorDecl], out: &TensorDecl) -> std::result::Result<(), String> {
    let rank = |t: &TensorDecl| t.shape.len();
    let in_rank = ins.first().map_or(0, |t| rank(t));
    k.check_params(&param::Ranks { input: in_rank, output: rank(out) })?;
    match k {
        Kernel::GatherElements { .. } | Kernel::ScatterElements { .. } if ins.iter().any(|t| rank(t) != in_rank) => {
            return Err("operands of different ranks".into());
        }
        Kernel::IndexGather { axis } | Kernel::IndexPut { axis, .. } => {
            let count = ins.len() - if matches!(k, Kernel::IndexPut { .. }) { 2 } else { 1 };
            if *axis as usize + count > in_rank {
                return Err(format!("{count} index tensors from axis {axis} exceed rank {in_rank}"));
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
        Kernel::Pool { kind, kernel, stride, padding, dilation, divisor, .. } => {
            let n = kernel.len();
            if n == 0 || n > 3 || n > in_rank || [stride.len(), padding.len(), dilation.len()].iter().any(|&l| l != n) {
                return Err("pooling parameters do not match the input rank".into());
            }
            if divisor.is_some_and(|d| d == 0 || *kind != PoolKind::Avg) {
                return Err("a pooling divisor must be non-zero and on an average pool".into());
            }
        }
        Kernel::Pad { interior, .. } if rank(out) != in_rank || interior.iter().any(|&i| i < 0) => {
            return Err("padding parameters do not match the input rank".into());
        }
        Kernel::NonZero {}
            if (out.dtype != crate::DType::I64
                || out.shape.len() != 2
                || out.shape[1] != DimRef::Static(in_rank as u64)) =>
        {
            return Err(format!("nonzero of a rank-{in_rank} tensor must write i64[count, {in_rank}]"));
        }
        Kernel::Fused { program } => {
            // Untrusted: every register index, op and dtype is checked once here.
            let dtypes: Vec<crate::DType> = ins.iter().map(|t| t.dtype).collect();
            let types = kiln_isa::register_types(program, &dtypes).map_err(|e| format!("fused program: {e}"))?;
            let result = types[types.len() - 1];
            if out.dtype != result {
                return Err(format!("fused program yields {result}, the output is {}", out.dtype));
            }
            if ins.iter().any(|t| rank(t) > rank(out)) {
                return Err("a fused operand has a higher rank than the output".into());
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
    if let Kernel::ConvFused { layout: Layout::ChannelsLast, .. }
    | Kernel::QuantConv { layout: Layout::ChannelsLast, .. } = k
    {
        if in_rank != 4 || rank(out) != 4 {
            return Err("a channels-last convolution is 2-d: input and output [N, H, W, C]".into());
        }
    }
    if let Kernel::Pool { kind, kernel, layout: Layout::ChannelsLast, .. } = k {
        if in_rank != 4 || rank(out) != 4 || kernel.len() != 2 || *kind == PoolKind::ArgMax {
            return Err("a channels-last pool is a 2-d max or avg pool: input and output [N, H, W, C]".into());
        }
    }
    // int8 activations between layers: max pooling of i8 values, channels-last.
    if let Kernel::Pool { kind, layout, .. } = k {
        let i8_io = ins.first().is_some_and(|x| x.dtype == crate::DType::I8) || out.dtype == crate::DType::I8;
        if i8_io && (*kind != PoolKind::Max || *layout != Layout::ChannelsLast) {
            return Err("a pool of i8 values is a channels-last max pool".into());
        }
    }
    if let Kernel::QuantConv {
        epilogue,
        layout,
        dynamic,
        act_scale,
        out_scale,
        out_zero_point,
        res_scale,
        res_zero_point,
        groups,
        ..
    } = k
    {
        // int8 activations between layers: an i8 input needs static
        // activations; an i8 output its parameters, the integer kernel's
        // channels-last store and no residual unless dense; an i8 residual
        // its parameters, a dense channels-last layer with int8 activations.
        let x_i8 = ins.first().is_some_and(|x| x.dtype == crate::DType::I8);
        if x_i8 && act_scale.is_none() {
            return Err("a quant_conv takes an i8 input only with static activations".into());
        }
        let int8_acts = *dynamic || act_scale.is_some();
        match out_scale {
            Some(s) => {
                let valid = s.is_finite() && *s > 0.0 && (-128..=127).contains(out_zero_point);
                if out.dtype != crate::DType::I8
                    || !valid
                    || !int8_acts
                    || *layout != Layout::ChannelsLast
                    || (epilogue.residual != kiln_isa::Residual::None && *groups != 1)
                {
                    return Err(format!(
                        "an i8 quant_conv output (scale {s}, zero point {out_zero_point}) needs int8 activations, \
                         channels-last and no residual unless dense"
                    ));
                }
            }
            None if out.dtype != crate::DType::F32 || *out_zero_point != 0 => {
                return Err("a quant_conv without output parameters gives f32".into());
            }
            None => {}
        }
        let residual = epilogue.residual_operand().and_then(|i| ins.get(i + 1));
        let residual_i8 = residual.is_some_and(|r| r.dtype == crate::DType::I8);
        match res_scale {
            Some(s) => {
                let valid = s.is_finite() && *s > 0.0 && (-128..=127).contains(res_zero_point);
                if !residual_i8 || !valid || !int8_acts || *layout != Layout::ChannelsLast || *groups != 1 {
                    return Err(format!(
                        "an i8 quant_conv residual (scale {s}, zero point {res_zero_point}) needs a dense \
                         channels-last layer with int8 activations"
                    ));
                }
            }
            None if residual_i8 || *res_zero_point != 0 => {
                return Err("an i8 quant_conv residual needs its parameters (res_scale)".into());
            }
            None => {}
        }
        // The weight's scales come before the epilogue's operands.
        if ins.len() != epilogue.operand_count() + 1 {
            return Err(format!(
                "the epilogue {epilogue:?} takes {} operands after the scales, got {}",
                epilogue.operand_count() - 2,
                ins.len().saturating_sub(3)
            ));
        }
    }
    if let Kernel::ConvFused { epilogue, .. } | Kernel::LinearFused { epilogue } = k {
        // Which operand is the bias and which the residual comes from the flags.
        if ins.len() != epilogue.operand_count() {
            return Err(format!(
                "the epilogue {epilogue:?} takes {} operands, got {}",
                epilogue.operand_count(),
                ins.len()
            ));
        }
    }
    Ok(())
}
