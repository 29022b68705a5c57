//! Memory planning: one arena for every activation, offsets fixed at compile time.
//!
//! Every graph input and every scheduled node output gets a [`Slot`]; constants do
//! not (they live in the weights segment). A slot's size is the value's byte size
//! at the upper bound of every dimension, so one plan serves every binding of the
//! symbols. Lifetimes are schedule steps, inclusive at both ends: a value lives
//! from the step defining it (graph inputs: step 0) to its last use (graph
//! outputs: the last step). Inclusive ends mean an op's outputs never share memory
//! with its inputs, so kernels need not support aliasing.
//!
//! A `Reshape` of an activation is a view: its output shares the input's slot
//! (the lowering then emits a `Copy` onto the same storage, which the runtime
//! skips). Such an alias group is planned as one buffer whose lifetime spans
//! all its members.
//!
//! A loop (`while`) gets one more buffer, live only at its own step: its
//! *region*, where its nested graphs' values live while it runs. Each nested
//! graph is planned on its own (offsets relative to the region), with its
//! inputs external: they are the loop's operands and carried values, whose
//! slots are the parent's (a reshape of one gets its own slot). The condition
//! and the body share the region's start (the condition's values are dead once
//! it has decided); after the body's values come the swap slots: a carried value
//! that the body returns unchanged at another position is saved there before
//! the carried values are overwritten. Every value live across the loop,
//! including its operands and results, overlaps the region's lifetime, so no
//! nested value ever shares memory with one.
//!
//! State (`Graph::states`) normally costs a copy at the end of every run: the
//! update is planned like any value and the runtime copies it into the
//! state's own storage (outside this arena) when the run succeeds. With
//! `MemoryOptions::state_in_place`, an update that can be written straight
//! into that storage gets no slot ([`MemoryPlan::state_values`]), so a
//! decode step that writes one row of a KV cache touches only that row:
//! [`state_write`] proves it safe when the update's producer runs after every
//! other reader of the state's old value (the program's results included)
//! and either does not read the old value ([`StateWrite::Direct`]) or runs
//! in place over it ([`StateWrite::InPlace`]): an `index_put` /
//! `scatter_elements` whose data operand is the old value, or an
//! elementwise op (`unary`, `binary`, a `fused` group) reading the old value
//! once — a filter's `state * 0.9 + x * 0.1`, a counter's `count + 1`.
//! Otherwise the update keeps its slot and its end-of-run copy.
//!
//! Placement is greedy best-fit: buffers are placed largest first, each in the
//! smallest gap between already-placed, lifetime-overlapping buffers that holds it,
//! or above them all. Offsets are multiples of `MemoryOptions::alignment`.

use crate::check::guard;
use crate::{PassError, TargetDesc};
use kiln_ir::{Dim, EntityRef, Graph, NodeId, Op, SecondaryMap, ValueDef, ValueId};
use std::collections::HashMap;

const PASS: &str = "plan_memory";

#[derive(Clone, Debug)]
pub struct MemoryOptions {
    /// Byte alignment of every slot's offset (and of the arena's size).
    pub alignment: u64,
    /// Let reshapes of activations share their input's slot.
    pub alias_reshapes: bool,
    /// Let a state's update live in the state's own storage when
    /// [`state_write`] proves it safe (see the module doc). Off for plans
    /// whose states an accelerator delegate keeps.
    pub state_in_place: bool,
    /// Keep the operands of an elementwise node (`fused`, `binary`) whose
    /// result is a norm's or softmax's first operand live until that node:
    /// native code computes the operand inside the norm's row function
    /// (`kiln compile --target x86_64`), reading them while it writes the
    /// norm's result, which must then not take their slots.
    pub row_prologues: bool,
    /// Keep the operands of a norm, softmax or reduction whose result an
    /// elementwise node (`fused`, `binary`, `where`) reads — and those of
    /// the elementwise node computing its first operand — live until that
    /// node: native code computes the node's result inside the row function
    /// (an epilogue), reading them while it writes the node's result, which
    /// must then not take their slots.
    pub row_epilogues: bool,
}

/// The smallest buffer alignment: a cache line, so that threads writing
/// different buffers never share one.
pub const CACHE_LINE: u64 = 64;

impl Default for MemoryOptions {
    fn default() -> MemoryOptions {
        MemoryOptions {
            alignment: CACHE_LINE,
            alias_reshapes: true,
            state_in_place: false,
            row_prologues: false,
            row_epilogues: false,
        }
    }
}

impl MemoryOptions {
    /// Options for `target`: every buffer aligned to its vector width (so a
    /// kernel's aligned vector loads and stores never straddle a buffer's
    /// start), and to at least [`CACHE_LINE`].
    pub fn for_target(target: &TargetDesc) -> MemoryOptions {
        MemoryOptions { alignment: CACHE_LINE.max(u64::from(target.vector_bytes)), ..MemoryOptions::default() }
    }
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub offset: u64,
    /// Bytes at the dimensions' upper bounds.
    pub size: u64,
}

#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    pub slots: SecondaryMap<ValueId, Option<Slot>>,
    /// Arena size: the end of the highest slot, rounded up to the alignment.
    pub arena_bytes: u64,
    /// Every slot's offset is a multiple of this ([`MemoryOptions::alignment`]);
    /// the arena's start must be aligned at least as much.
    pub alignment: u64,
    /// The most bytes (each slot rounded up to the alignment) live at one step: a
    /// lower bound on `arena_bytes` that no placement can beat.
    pub peak_live_bytes: u64,
    /// Each scheduled `while` node's region and nested plans.
    pub loops: HashMap<NodeId, LoopPlan>,
    /// Values that live in state `k`'s own storage instead of a slot: a
    /// state's update written there directly or in place, and the reshapes
    /// sharing its buffer (`None` for every other value).
    pub state_values: SecondaryMap<ValueId, Option<usize>>,
    /// Per state (indexed like `Graph::states`): how its update reaches its
    /// storage; `None` when by the end-of-run copy.
    pub state_writes: Vec<Option<StateWrite>>,
}

/// How a state's update is written into the state's storage during the run
/// (see the module doc).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StateWrite {
    /// `node` does not read the state's old value and writes its result there.
    Direct { node: NodeId },
    /// `node` (an `index_put` or `scatter_elements` whose data operand is the
    /// old value, or an elementwise op reading it once) updates the storage
    /// in place.
    InPlace { node: NodeId },
}

impl StateWrite {
    pub fn node(self) -> NodeId {
        match self {
            StateWrite::Direct { node } | StateWrite::InPlace { node } => node,
        }
    }
}

/// Whether state `k`'s update may be written into the state's storage during
/// the run, and how; `Err` says why not. Safe when the update `u` is a
/// node's only output (not a loop, not a reshape, which shares its input's
/// buffer), returned once (as this state's update), with the state's type;
/// and the old value `s` is not returned and has no reader scheduled after
/// that node, which itself reads `s` only as the data operand of an
/// `index_put` / `scatter_elements`, once as an operand of an elementwise op
/// (then in place) or not at all. Every
/// read of the old value then happens before it is overwritten, and every
/// later read of the storage wants the new value.
pub fn state_write(g: &Graph, k: usize) -> Result<StateWrite, String> {
    let st = g.states.get(k).ok_or_else(|| format!("no state {k}"))?;
    let (Some(&s), Some(&u)) = (g.inputs.get(st.input), g.outputs.get(st.output)) else {
        return Err("its input or output position is out of range".into());
    };
    if u == s {
        return Err("the update is the old value".into());
    }
    let ValueDef::Node { node: n, .. } = g.values[u].def else {
        return Err("the update is not computed by a node".into());
    };
    let node = &g.nodes[n];
    if node.outputs.len() != 1 || matches!(node.op, Op::While { .. } | Op::Reshape { .. }) {
        return Err(format!("the update comes from `{}`, which cannot write into the state", node.op.name()));
    }
    if g.outputs.iter().filter(|&&o| o == u).count() != 1 {
        return Err("the update is also returned".into());
    }
    if g.outputs.contains(&s) {
        return Err("the old value is returned".into());
    }
    if g.ty(u) != g.ty(s) || g.ty(u).shape.iter().any(|d| d.as_const().is_none()) {
        return Err("the update's type is not the state's static type".into());
    }
    let at = g.order.iter().position(|&m| m == n).ok_or("the update's node is not scheduled")?;
    if let Some(&m) = g.order[at + 1..].iter().find(|&&m| g.nodes[m].inputs.contains(&s)) {
        return Err(format!("`{}` reads the old value after the update", g.describe_node(m)));
    }
    let in_place = matches!(node.op, Op::IndexPut { .. } | Op::ScatterElements { .. });
    // An elementwise op reads each element of an operand shaped like its
    // result (the old value is: `u` has `s`'s type) only to compute the same
    // element of the result, so it may write over that operand.
    let elementwise = matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Fused { .. });
    match node.inputs.iter().filter(|&&i| i == s).count() {
        0 => Ok(StateWrite::Direct { node: n }),
        1 if in_place && node.inputs[0] == s => Ok(StateWrite::InPlace { node: n }),
        1 if elementwise => Ok(StateWrite::InPlace { node: n }),
        _ => Err(format!("`{}` reads the old value other than as the data it updates", g.describe_node(n))),
    }
}

/// Memory of one loop (see the module doc). Offsets in `cond`, `body` and
/// `swap` are relative to `offset`, the region's place in the enclosing plan.
#[derive(Clone, Debug, Default)]
pub struct LoopPlan {
    pub offset: u64,
    /// Region size: `max(cond.arena_bytes, swap end)`.
    pub size: u64,
    pub cond: MemoryPlan,
    pub body: MemoryPlan,
    /// Per carried value: where it is saved before the update, when the body
    /// returns it unchanged as another carried value.
    pub swap: Vec<Option<Slot>>,
}

/// A buffer to place: the values sharing it (one, or an alias group of
/// reshapes, root first) with their own byte sizes, its inclusive lifetime and
/// sizes.
struct Buffer {
    value: ValueId,
    /// The loop whose region this is (then `members` is empty).
    region: Option<NodeId>,
    members: Vec<(ValueId, u64)>,
    first: usize,
    last: usize,
    size: u64,
    padded: u64,
}

pub fn plan_memory(g: &Graph, opts: &MemoryOptions) -> Result<MemoryPlan, PassError> {
    plan_graph(g, opts, false)
}

/// [`plan_memory`]; with `external_inputs` (a loop's nested graph), graph
/// inputs get no slot.
fn plan_graph(g: &Graph, opts: &MemoryOptions, external_inputs: bool) -> Result<MemoryPlan, PassError> {
    guard(g, PASS)?;
    let align = opts.alignment.max(1);
    if !align.is_power_of_two() {
        return Err(PassError::new(PASS, format!("alignment {align} is not a power of two")));
    }
    let mut buffers = buffers(g, align, opts, external_inputs)?;
    let mut plan = MemoryPlan { alignment: align, ..MemoryPlan::default() };
    if opts.state_in_place && !external_inputs {
        plan.state_writes = (0..g.states.len()).map(|k| state_write(g, k).ok()).collect();
        // An update written into its state's storage needs no slot, nor do
        // the reshapes sharing its buffer.
        buffers.retain(|b| {
            let state = g.states.iter().enumerate().position(|(k, st)| {
                plan.state_writes[k].is_some() && b.members.iter().any(|&(v, _)| v == g.outputs[st.output])
            });
            for &(v, _) in b.members.iter().filter(|_| state.is_some()) {
                plan.state_values[v] = state;
            }
            state.is_none()
        });
        // A state's old value is read where it lies (lowering gives it the
        // state's storage): its slot is needed only to return it (a copy
        // taken before the update) or for reshapes sharing it.
        buffers.retain(|b| !unused_state_slot(g, b));
    }
    let mut loops = HashMap::new();
    for (step, &n) in g.order.iter().enumerate() {
        let node = &g.nodes[n];
        let Op::While { carried, cond, body } = &node.op else { continue };
        let lp = plan_loop(cond, body, *carried, opts)?;
        let padded = lp.size.div_ceil(align).saturating_mul(align);
        let value = node.outputs.first().copied().unwrap_or(ValueId::new(0));
        buffers.push(Buffer {
            value,
            region: Some(n),
            members: Vec::new(),
            first: step,
            last: step,
            size: lp.size,
            padded,
        });
        loops.insert(n, lp);
    }
    plan.peak_live_bytes = peak_live(&buffers, g.order.len());

    // Largest first; ties by definition order for a deterministic plan.
    buffers.sort_by(|a, b| {
        b.padded.cmp(&a.padded).then(a.first.cmp(&b.first)).then(a.value.index().cmp(&b.value.index()))
    });
    let mut placed: Vec<(usize, usize, u64, u64)> = Vec::new(); // (first, last, offset, padded)
    for b in &buffers {
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(first, last, _, padded)| padded > 0 && first <= b.last && b.first <= last)
            .map(|&(_, _, off, padded)| (off, off + padded))
            .collect();
        busy.sort_unstable();
        let offset = best_fit(&busy, b.padded);
        placed.push((b.first, b.last, offset, b.padded));
        if let Some(lp) = b.region.and_then(|n| loops.get_mut(&n)) {
            lp.offset = offset;
        }
        for &(member, _) in &b.members {
            plan.slots[member] = Some(Slot { offset, size: b.size });
        }
        plan.arena_bytes = plan.arena_bytes.max(offset + b.padded);
    }
    plan.loops = loops;
    Ok(plan)
}

/// Whether `b` is only a state's old value, which is not returned: it is
/// never read from a slot.
fn unused_state_slot(g: &Graph, b: &Buffer) -> bool {
    let [(v, _)] = b.members[..] else { return false };
    b.region.is_none() && g.states.iter().any(|st| g.inputs.get(st.input) == Some(&v)) && !g.outputs.contains(&v)
}

/// Plans a loop's nested graphs and its swap slots (offsets relative to the region).
fn plan_loop(cond: &Graph, body: &Graph, carried: usize, opts: &MemoryOptions) -> Result<LoopPlan, PassError> {
    let align = opts.alignment.max(1);
    let cond_plan = plan_graph(cond, opts, true)?;
    let body_plan = plan_graph(body, opts, true)?;
    let mut end = body_plan.arena_bytes;
    let mut swap = vec![None; carried];
    for (j, &o) in body.outputs.iter().enumerate().take(carried) {
        if matches!(body.values[o].def, ValueDef::Input(k) if (k as usize) < carried && k as usize != j) {
            let size = upper_bound_bytes(body, o)?;
            swap[j] = Some(Slot { offset: end, size });
            end += size.div_ceil(align).saturating_mul(align);
        }
    }
    Ok(LoopPlan { offset: 0, size: end.max(cond_plan.arena_bytes), cond: cond_plan, body: body_plan, swap })
}

/// The start of the smallest free gap holding `size` among sorted busy ranges, or
/// the end of the highest one. Busy ranges start and end on aligned offsets, so
/// every gap does too.
fn best_fit(busy: &[(u64, u64)], size: u64) -> u64 {
    let mut best: Option<(u64, u64)> = None; // (gap size, offset)
    let mut cursor = 0;
    for &(start, end) in busy {
        if start >= cursor + size {
            let gap = start - cursor;
            if best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, cursor));
            }
        }
        cursor = cursor.max(end);
    }
    best.map_or(cursor, |(_, off)| off)
}

/// Graph inputs and scheduled node outputs with their lifetimes and sizes,
/// reshapes folded into their input's buffer when `alias` is set.
fn buffers(g: &Graph, align: u64, opts: &MemoryOptions, external_inputs: bool) -> Result<Vec<Buffer>, PassError> {
    let alias = opts.alias_reshapes;
    let end = g.order.len().saturating_sub(1);
    let mut first: SecondaryMap<ValueId, Option<usize>> = SecondaryMap::new();
    let mut last: SecondaryMap<ValueId, usize> = SecondaryMap::new();
    let root = if alias { alias_roots(g, external_inputs)? } else { SecondaryMap::new() };
    let mut values = Vec::new();
    for &v in g.inputs.iter().filter(|_| !external_inputs) {
        if first[v].is_none() {
            first[v] = Some(0);
            values.push(v);
        }
    }
    for (step, &n) in g.order.iter().enumerate() {
        let node = &g.nodes[n];
        for &i in &node.inputs {
            last[i] = last[i].max(step);
        }
        for &o in &node.outputs {
            if first[o].is_none() {
                first[o] = Some(step);
                last[o] = step;
                values.push(o);
            }
        }
    }
    if opts.row_prologues {
        keep_prologue_operands(g, &mut last);
    }
    if opts.row_epilogues {
        keep_epilogue_operands(g, &mut last);
    }
    for &o in &g.outputs {
        last[o] = end;
    }
    let mut index_of: SecondaryMap<ValueId, Option<usize>> = SecondaryMap::new();
    let mut out: Vec<Buffer> = Vec::new();
    for v in values {
        let size = upper_bound_bytes(g, v)?;
        let (f, l) = (first[v].unwrap_or(0), last[v]);
        let r = root[v].unwrap_or(v);
        match index_of[r] {
            Some(k) => {
                let b = &mut out[k];
                b.members.push((v, size));
                b.first = b.first.min(f);
                b.last = b.last.max(l.max(f));
                b.size = b.size.max(size);
                b.padded = b.size.div_ceil(align).saturating_mul(align);
            }
            None => {
                index_of[r] = Some(out.len());
                let padded = size.div_ceil(align).saturating_mul(align);
                out.push(Buffer {
                    value: v,
                    region: None,
                    members: vec![(v, size)],
                    first: f,
                    last: l.max(f),
                    size,
                    padded,
                });
            }
        }
    }
    Ok(out)
}

/// [`MemoryOptions::row_prologues`]: each operand of an elementwise node
/// whose result a later norm or softmax reads first lives until that node.
fn keep_prologue_operands(g: &Graph, last: &mut SecondaryMap<ValueId, usize>) {
    let mut producer: SecondaryMap<ValueId, Option<NodeId>> = SecondaryMap::new();
    for (step, &n) in g.order.iter().enumerate() {
        let node = &g.nodes[n];
        let row =
            matches!(node.op, Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. });
        if let Some(p) = node.inputs.first().and_then(|&x| producer[x]).filter(|_| row) {
            for &i in &g.nodes[p].inputs {
                last[i] = last[i].max(step);
            }
        }
        if matches!(node.op, Op::Fused { .. } | Op::Binary(_)) {
            for &o in &node.outputs {
                producer[o] = Some(n);
            }
        }
    }
}

/// [`MemoryOptions::row_epilogues`]: each operand of a norm, softmax or
/// reduction whose result a later elementwise node reads (and each operand
/// of the elementwise node computing the row op's first operand) lives
/// until that node.
fn keep_epilogue_operands(g: &Graph, last: &mut SecondaryMap<ValueId, usize>) {
    let mut producer: SecondaryMap<ValueId, Option<NodeId>> = SecondaryMap::new();
    let mut row_op: SecondaryMap<ValueId, Option<NodeId>> = SecondaryMap::new();
    for (step, &n) in g.order.iter().enumerate() {
        let node = &g.nodes[n];
        let elementwise = matches!(node.op, Op::Fused { .. } | Op::Binary(_) | Op::Where);
        for &r in node.inputs.iter().filter_map(|&i| row_op[i].as_ref()).filter(|_| elementwise) {
            let row = &g.nodes[r];
            let prologue = row.inputs.first().and_then(|&x| producer[x]).map(|p| &g.nodes[p].inputs);
            for &v in row.inputs.iter().chain(prologue.into_iter().flatten()) {
                last[v] = last[v].max(step);
            }
        }
        if elementwise {
            for &o in &node.outputs {
                producer[o] = Some(n);
            }
        }
        let row = matches!(
            node.op,
            Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::Reduce { .. }
        );
        for &o in node.outputs.iter().filter(|_| row) {
            row_op[o] = Some(n);
        }
    }
}

/// For each reshape output that is a view of an activation (a graph input or
/// node output, not a constant, which has no slot), the first value of its
/// chain of views.
fn alias_roots(g: &Graph, external_inputs: bool) -> Result<SecondaryMap<ValueId, Option<ValueId>>, PassError> {
    let mut has_slot: SecondaryMap<ValueId, bool> = SecondaryMap::new();
    let mut root: SecondaryMap<ValueId, Option<ValueId>> = SecondaryMap::new();
    for &v in &g.inputs {
        has_slot[v] = !external_inputs;
    }
    for &n in &g.order {
        let node = &g.nodes[n];
        if let (Op::Reshape { .. }, Some(&i), [o]) = (&node.op, node.inputs.first(), node.outputs.as_slice()) {
            if has_slot[i] && upper_bound_bytes(g, i)? == upper_bound_bytes(g, *o)? {
                root[*o] = Some(root[i].unwrap_or(i));
            }
        }
        for &o in &node.outputs {
            has_slot[o] = true;
        }
    }
    Ok(root)
}

fn upper_bound_bytes(g: &Graph, v: ValueId) -> Result<u64, PassError> {
    let ty = g.ty(v);
    let mut bytes = ty.dtype.size_bytes() as u64;
    for d in &ty.shape {
        let (_, hi) = d.bounds(&g.symbols);
        let Some(hi) = hi else { return Err(unbounded(g, v, d)) };
        bytes = bytes.saturating_mul(hi.max(0) as u64);
    }
    Ok(bytes)
}

fn unbounded(g: &Graph, v: ValueId, d: &Dim) -> PassError {
    let mut syms = Vec::new();
    d.collect_symbols(&mut syms);
    let names: Vec<String> =
        syms.iter().filter(|&&s| g.symbols[s].max.is_none()).map(|&s| g.symbols[s].name.clone()).collect();
    let name = g.values[v].name.as_deref().map(|n| format!(" (`{n}`)")).unwrap_or_default();
    PassError::new(
        PASS,
        format!(
            "value {v}{name} has dimension `{}` with no upper bound (symbol {}); memory is planned for the largest \
             shape, so bound it at export, e.g. `torch.export.Dim(\"{}\", max=N)`",
            d.display(&g.symbols),
            names.join(", "),
            names.first().map_or("name", |s| s.as_str()),
        ),
    )
}

/// The largest sum of padded sizes live at one step.
fn peak_live(buffers: &[Buffer], steps: usize) -> u64 {
    // Difference array over steps: +size at `first`, -size after `last`.
    let mut delta = vec![0i128; steps.max(1) + 1];
    for b in buffers {
        delta[b.first] += b.padded as i128;
        delta[b.last + 1] -= b.padded as i128;
    }
    let mut live = 0i128;
    let mut peak = 0i128;
    for d in delta {
        live += d;
        peak = peak.max(live);
    }
    peak as u64
}

/// Checks a plan against the graph: every graph input and scheduled node output
/// has a slot inside the arena, and no two values whose lifetimes overlap have
/// overlapping slots. The compiler runs it on every plan it writes.
pub fn check_plan(g: &Graph, plan: &MemoryPlan) -> Result<(), String> {
    check_graph_plan(g, plan, false)
}

/// [`check_plan`] for a graph or (with `external_inputs`) a loop's nested
/// graph; a loop's region is checked like a value live at its step, and its
/// nested plans recursively.
fn check_graph_plan(g: &Graph, plan: &MemoryPlan, external_inputs: bool) -> Result<(), String> {
    crate::check::well_formed(g)?;
    // Every value with its own lifetime; a pair may share memory only when both
    // are views in one reshape chain and use exactly the same slot.
    let opts = MemoryOptions { alias_reshapes: false, ..MemoryOptions::default() };
    let mut buffers = buffers(g, 1, &opts, external_inputs).map_err(|e| e.message)?;
    let roots = alias_roots(g, external_inputs).map_err(|e| e.message)?;
    let mut errors = Vec::new();
    let mut slotted = Vec::new();
    for (step, &n) in g.order.iter().enumerate() {
        let Op::While { carried, cond, body } = &g.nodes[n].op else { continue };
        let Some(lp) = plan.loops.get(&n) else {
            errors.push(format!("loop {n} has no region"));
            continue;
        };
        for (name, r, p) in [("cond", cond, &lp.cond), ("body", body, &lp.body)] {
            if let Err(e) = check_graph_plan(r, p, true) {
                errors.push(format!("loop {n} `{name}`: {e}"));
            }
            if p.arena_bytes > lp.size {
                errors.push(format!("loop {n} `{name}` needs {} bytes, its region holds {}", p.arena_bytes, lp.size));
            }
        }
        for (j, s) in lp.swap.iter().enumerate().take(*carried) {
            if let Some(s) = s.filter(|s| s.offset < lp.body.arena_bytes || s.offset.saturating_add(s.size) > lp.size) {
                errors.push(format!(
                    "loop {n} swap slot {j} [{}..{}) is not between the body's values and the region's end",
                    s.offset,
                    s.offset + s.size
                ));
            }
        }
        let value = g.nodes[n].outputs.first().copied().unwrap_or(ValueId::new(0));
        buffers.push(Buffer {
            value,
            region: Some(n),
            members: Vec::new(),
            first: step,
            last: step,
            size: lp.size,
            padded: lp.size,
        });
    }
    for (k, w) in plan.state_writes.iter().enumerate() {
        if let Some(w) = w {
            match state_write(g, k) {
                Ok(proved) if proved == *w => {}
                Ok(proved) => errors.push(format!("state {k} is written as {w:?}, the graph allows {proved:?}")),
                Err(why) => errors.push(format!("state {k} is written into its storage, but {why}")),
            }
        }
    }
    // A state's old value without a slot is read where it lies (see
    // `unused_state_slot`); one with a slot is checked like any value.
    buffers.retain(|b| !(plan.slots[b.value].is_none() && unused_state_slot(g, b)));
    buffers.retain(|b| {
        let Some(k) = plan.state_values[b.value] else { return true };
        let update = plan.state_writes.get(k).copied().flatten().and(g.states.get(k)).map(|st| g.outputs[st.output]);
        if update.is_none_or(|u| roots[b.value].unwrap_or(b.value) != u) {
            errors.push(format!("{} lies in state {k}'s storage but is not its update or a view of it", b.value));
        }
        false
    });
    for b in &buffers {
        if let Some(n) = b.region {
            let offset = plan.loops.get(&n).map_or(0, |lp| lp.offset);
            slotted.push((b.value, b.first, b.last, Slot { offset, size: b.size }));
            continue;
        }
        match plan.slots[b.value] {
            None => errors.push(format!("{} has no slot", b.value)),
            Some(s) if s.size < b.size => {
                errors.push(format!("{} needs {} bytes, slot holds {}", b.value, b.size, s.size))
            }
            Some(s) if s.offset.saturating_add(s.size) > plan.arena_bytes => errors.push(format!(
                "{} slot {}..{} exceeds the arena ({} bytes)",
                b.value,
                s.offset,
                s.offset + s.size,
                plan.arena_bytes
            )),
            Some(s) => slotted.push((b.value, b.first, b.last, s)),
        }
    }
    let group = |v: ValueId| roots[v].unwrap_or(v);
    for (i, &(a, a_first, a_last, sa)) in slotted.iter().enumerate() {
        for &(b, b_first, b_last, sb) in &slotted[i + 1..] {
            let live_together = a_first <= b_last && b_first <= a_last;
            let overlap =
                sa.size > 0 && sb.size > 0 && sa.offset < sb.offset + sb.size && sb.offset < sa.offset + sa.size;
            // A loop's region stands in the list under its first result's
            // id, and must not overlap that result: `a != b` keeps it apart.
            let view_of_same_buffer = group(a) == group(b) && sa == sb && a != b;
            if live_together && overlap && !view_of_same_buffer {
                errors.push(format!(
                    "{} [{}..{}) and {} [{}..{}) overlap while both live",
                    a,
                    sa.offset,
                    sa.offset + sa.size,
                    b,
                    sb.offset,
                    sb.offset + sb.size
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
