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
//! Placement is greedy best-fit: buffers are placed largest first, each in the
//! smallest gap between already-placed, lifetime-overlapping buffers that holds it,
//! or above them all. Offsets are multiples of `MemoryOptions::alignment`.

use crate::check::guard;
use crate::PassError;
use kiln_ir::{Dim, EntityRef, Graph, Op, SecondaryMap, ValueId};

const PASS: &str = "plan_memory";

#[derive(Clone, Debug)]
pub struct MemoryOptions {
    /// Byte alignment of every slot's offset (and of the arena's size).
    pub alignment: u64,
    /// Let reshapes of activations share their input's slot.
    pub alias_reshapes: bool,
}

impl Default for MemoryOptions {
    fn default() -> MemoryOptions {
        MemoryOptions { alignment: 64, alias_reshapes: true }
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
    /// The most bytes (each slot rounded up to the alignment) live at one step: a
    /// lower bound on `arena_bytes` that no placement can beat.
    pub peak_live_bytes: u64,
}

/// A buffer to place: the values sharing it (one, or an alias group of
/// reshapes, root first) with their own byte sizes, its inclusive lifetime and
/// sizes.
struct Buffer {
    value: ValueId,
    members: Vec<(ValueId, u64)>,
    first: usize,
    last: usize,
    size: u64,
    padded: u64,
}

pub fn plan_memory(g: &Graph, opts: &MemoryOptions) -> Result<MemoryPlan, PassError> {
    guard(g, PASS)?;
    let align = opts.alignment.max(1);
    let mut buffers = buffers(g, align, opts.alias_reshapes)?;
    let peak_live_bytes = peak_live(&buffers, g.order.len());

    // Largest first; ties by definition order for a deterministic plan.
    buffers.sort_by(|a, b| b.padded.cmp(&a.padded).then(a.first.cmp(&b.first)).then(a.value.index().cmp(&b.value.index())));
    let mut placed: Vec<(usize, usize, u64, u64)> = Vec::new(); // (first, last, offset, padded)
    let mut plan = MemoryPlan { peak_live_bytes, ..MemoryPlan::default() };
    for b in &buffers {
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(first, last, _, padded)| padded > 0 && first <= b.last && b.first <= last)
            .map(|&(_, _, off, padded)| (off, off + padded))
            .collect();
        busy.sort_unstable();
        let offset = best_fit(&busy, b.padded);
        placed.push((b.first, b.last, offset, b.padded));
        for &(member, _) in &b.members {
            plan.slots[member] = Some(Slot { offset, size: b.size });
        }
        plan.arena_bytes = plan.arena_bytes.max(offset + b.padded);
    }
    Ok(plan)
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
fn buffers(g: &Graph, align: u64, alias: bool) -> Result<Vec<Buffer>, PassError> {
    let end = g.order.len().saturating_sub(1);
    let mut first: SecondaryMap<ValueId, Option<usize>> = SecondaryMap::new();
    let mut last: SecondaryMap<ValueId, usize> = SecondaryMap::new();
    let root = if alias { alias_roots(g)? } else { SecondaryMap::new() };
    let mut values = Vec::new();
    for &v in &g.inputs {
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
                out.push(Buffer { value: v, members: vec![(v, size)], first: f, last: l.max(f), size, padded });
            }
        }
    }
    Ok(out)
}

/// For each reshape output that is a view of an activation (a graph input or
/// node output, not a constant, which has no slot), the first value of its
/// chain of views.
fn alias_roots(g: &Graph) -> Result<SecondaryMap<ValueId, Option<ValueId>>, PassError> {
    let mut has_slot: SecondaryMap<ValueId, bool> = SecondaryMap::new();
    let mut root: SecondaryMap<ValueId, Option<ValueId>> = SecondaryMap::new();
    for &v in &g.inputs {
        has_slot[v] = true;
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
    let names: Vec<String> = syms.iter().filter(|&&s| g.symbols[s].max.is_none()).map(|&s| g.symbols[s].name.clone()).collect();
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
    crate::check::well_formed(g)?;
    // Every value with its own lifetime; a pair may share memory only when both
    // are views in one reshape chain and use exactly the same slot.
    let buffers = buffers(g, 1, false).map_err(|e| e.message)?;
    let roots = alias_roots(g).map_err(|e| e.message)?;
    let mut errors = Vec::new();
    let mut slotted = Vec::new();
    for b in &buffers {
        match plan.slots[b.value] {
            None => errors.push(format!("{} has no slot", b.value)),
            Some(s) if s.size < b.size => errors.push(format!("{} needs {} bytes, slot holds {}", b.value, b.size, s.size)),
            Some(s) if s.offset.saturating_add(s.size) > plan.arena_bytes => {
                errors.push(format!("{} slot {}..{} exceeds the arena ({} bytes)", b.value, s.offset, s.offset + s.size, plan.arena_bytes))
            }
            Some(s) => slotted.push((b.value, b.first, b.last, s)),
        }
    }
    let group = |v: ValueId| roots[v].unwrap_or(v);
    for (i, &(a, a_first, a_last, sa)) in slotted.iter().enumerate() {
        for &(b, b_first, b_last, sb) in &slotted[i + 1..] {
            let live_together = a_first <= b_last && b_first <= a_last;
            let overlap = sa.size > 0 && sb.size > 0 && sa.offset < sb.offset + sb.size && sb.offset < sa.offset + sa.size;
            let view_of_same_buffer = group(a) == group(b) && sa == sb;
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
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}
