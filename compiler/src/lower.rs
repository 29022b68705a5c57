//! Lowering a planned kiln IR graph to the runtime's execution plan.
//!
//! The IR is for transformation; the plan is for execution: flat tables indexed
//! by `u32`, kernels chosen here once, weights packed into one aligned segment.
//! This is the only place that knows both vocabularies.

use kiln_ir::{self as ir, Dim, Graph, NodeId, Op, SymbolId, ValueDef, ValueId};
use kiln_passes::{data_dtype, MemoryPlan, TargetDesc};
use kiln_runtime::format::{
    DimExpr, DimRef, Instr, InstrOp, IoDecl, Kernel, Opcode, Plan, StateDecl, Storage, SymbolDecl, TensorDecl,
    WeightsBuilder,
};
use kiln_runtime::ARENA_ALIGN;
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
#[error("cannot lower to the CPU plan:\n{}", .0.join("\n"))]
pub struct LowerError(pub Vec<String>);

fn u32s(v: &[i64]) -> Option<Vec<u32>> {
    v.iter().map(|&x| u32::try_from(x).ok()).collect()
}

fn axes32(v: &[usize]) -> Vec<u32> {
    v.iter().map(|&x| x as u32).collect()
}

/// What one node becomes: a kernel call, or (a data-dependent size) a
/// symbol binding; `Err` says why the CPU cannot run it.
fn instr_op_for(g: &Graph, op: &Op, inputs: &[ValueId], dims: &mut DimTable) -> Result<InstrOp, String> {
    let bad_params = || format!("parameters out of range for the CPU kernel: {op:?}");
    let kernel = match op {
        Op::Unary(u) => Kernel::Unary { op: *u },
        Op::Binary(b) => Kernel::Binary { op: *b },
        Op::Where => Kernel::Where {},
        Op::Cast { .. } => Kernel::Cast {},
        Op::Clamp { min, max } => Kernel::Clamp { min: *min, max: *max },
        Op::MatMul => Kernel::MatMul {},
        Op::GroupedMatMul => Kernel::GroupedMatMul {},
        Op::Linear => Kernel::Linear {},
        Op::Conv { stride, padding, dilation, groups } => Kernel::Conv {
            stride: u32s(stride).ok_or_else(bad_params)?,
            padding: u32s(padding).ok_or_else(bad_params)?,
            dilation: u32s(dilation).ok_or_else(bad_params)?,
            groups: u32::try_from(*groups).map_err(|_| bad_params())?,
        },
        Op::ConvFused { stride, padding, dilation, groups, epilogue, layout } => Kernel::ConvFused {
            stride: u32s(stride).ok_or_else(bad_params)?,
            padding: u32s(padding).ok_or_else(bad_params)?,
            dilation: u32s(dilation).ok_or_else(bad_params)?,
            groups: u32::try_from(*groups).map_err(|_| bad_params())?,
            epilogue: *epilogue,
            layout: *layout,
        },
        Op::LinearFused { epilogue } | Op::LinearSplit { epilogue, .. } => Kernel::LinearFused { epilogue: *epilogue },
        Op::BatchNorm { eps } => Kernel::BatchNorm { eps: *eps },
        Op::LayerNorm { normalized_rank, eps } => {
            Kernel::LayerNorm { normalized_rank: *normalized_rank as u32, eps: *eps }
        }
        Op::QuantLinear { bits, group, zero_points, dynamic, asymmetric, act_scale, act_zero_point } => {
            Kernel::QuantLinear {
                bits: u32::from(*bits),
                group: u32::try_from(*group).map_err(|_| bad_params())?,
                zero_points: *zero_points,
                dynamic: *dynamic,
                asymmetric: *asymmetric,
                act_scale: *act_scale,
                act_zero_point: i32::try_from(*act_zero_point).map_err(|_| bad_params())?,
            }
        }
        Op::QuantConv {
            stride,
            padding,
            dilation,
            groups,
            epilogue,
            layout,
            dynamic,
            asymmetric,
            act_scale,
            act_zero_point,
            out_quant,
            res_quant,
        } => Kernel::QuantConv {
            stride: u32s(stride).ok_or_else(bad_params)?,
            padding: u32s(padding).ok_or_else(bad_params)?,
            dilation: u32s(dilation).ok_or_else(bad_params)?,
            groups: u32::try_from(*groups).map_err(|_| bad_params())?,
            epilogue: *epilogue,
            layout: *layout,
            dynamic: *dynamic,
            asymmetric: *asymmetric,
            act_scale: *act_scale,
            act_zero_point: i32::try_from(*act_zero_point).map_err(|_| bad_params())?,
            out_scale: out_quant.map(|q| q.scale),
            out_zero_point: match out_quant {
                Some(q) => i32::try_from(q.zero_point).map_err(|_| bad_params())?,
                None => 0,
            },
            res_scale: res_quant.map(|q| q.scale),
            res_zero_point: match res_quant {
                Some(q) => i32::try_from(q.zero_point).map_err(|_| bad_params())?,
                None => 0,
            },
        },
        Op::RmsNorm { normalized_rank, eps } => Kernel::RmsNorm { normalized_rank: *normalized_rank as u32, eps: *eps },
        Op::Softmax { axis } => Kernel::Softmax { axis: *axis as u32, log: false },
        Op::LogSoftmax { axis } => Kernel::Softmax { axis: *axis as u32, log: true },
        Op::Reduce { kind, axes, .. } => Kernel::Reduce { kind: *kind, axes: axes32(axes) },
        Op::ArgMax { axis, .. } => Kernel::ArgMax { axis: *axis as u32 },
        Op::Pool { kind, kernel, stride, padding, dilation, count_include_pad, divisor, layout, .. } => Kernel::Pool {
            kind: *kind,
            layout: *layout,
            kernel: u32s(kernel).ok_or_else(bad_params)?,
            stride: u32s(stride).ok_or_else(bad_params)?,
            padding: u32s(padding).ok_or_else(bad_params)?,
            dilation: u32s(dilation).ok_or_else(bad_params)?,
            count_include_pad: *count_include_pad,
            divisor: *divisor,
        },
        Op::AdaptiveAvgPool { .. } => Kernel::AdaptiveAvgPool {},
        Op::Attention { causal, scale } => Kernel::Attention { causal: *causal, scale: *scale },
        Op::Reshape { .. } => Kernel::Copy {},
        Op::Expand { .. } => Kernel::Expand {},
        Op::Permute { perm } => Kernel::Permute { perm: axes32(perm) },
        Op::Slice { axis, start, step, .. } => {
            let dim = g.ty(inputs[0]).shape.get(*axis).and_then(Dim::as_const);
            let step = u64::try_from(*step).ok().filter(|&s| s > 0).ok_or_else(bad_params)?;
            match (*start, dim) {
                (s, _) if s >= 0 => Kernel::Slice { axis: *axis as u32, start: s as u64, step },
                (s, Some(d)) => Kernel::Slice { axis: *axis as u32, start: (s + d).max(0) as u64, step },
                // Counted from the end of a dynamic dimension at run time.
                (s, None) => Kernel::SliceFromEnd { axis: *axis as u32, back: s.unsigned_abs(), step },
            }
        }
        Op::Concat { axis } => Kernel::Concat { axis: *axis as u32 },
        Op::Gather { axis } => Kernel::Gather { axis: *axis as u32 },
        Op::Full { value, .. } => Kernel::Fill { value: *value },
        Op::Arange { start, step, .. } => Kernel::Arange { start: *start, step: *step },
        Op::CumSum { axis } => Kernel::CumSum { axis: *axis as u32 },
        Op::Scan { axis, kind } => Kernel::Scan { axis: *axis as u32, kind: *kind },
        Op::Linalg { op, upper, left, unit, complex } => {
            Kernel::Linalg { op: *op, upper: *upper, left: *left, unit: *unit, complex: *complex }
        }
        Op::Assert { message } => Kernel::Assert { message: message.clone() },
        Op::ArgMin { axis, .. } => Kernel::ArgMin { axis: *axis as u32 },
        Op::Sort { axis, descending, indices, .. } => {
            Kernel::Sort { axis: *axis as u32, descending: *descending, indices: *indices }
        }
        Op::Pad { lo, hi, interior, mode, value } => {
            Kernel::Pad { lo: lo.clone(), hi: hi.clone(), interior: interior.clone(), mode: *mode, value: *value }
        }
        Op::Flip { axes } => Kernel::Flip { axes: axes32(axes) },
        Op::Upsample { mode, align_corners, size, scales } => Kernel::Resize {
            mode: *mode,
            align_corners: *align_corners,
            spatial: size.len() as u32,
            scales: scales.clone(),
        },
        Op::Random { dist, stream, .. } => Kernel::Random { dist: *dist, stream: *stream },
        Op::GatherElements { axis } => Kernel::GatherElements { axis: *axis as u32 },
        Op::ScatterElements { axis, reduce, include_self } => {
            Kernel::ScatterElements { axis: *axis as u32, reduce: *reduce, include_self: *include_self }
        }
        Op::IndexGather { axis } => Kernel::IndexGather { axis: *axis as u32 },
        Op::IndexPut { axis, accumulate } => Kernel::IndexPut { axis: *axis as u32, accumulate: *accumulate },
        Op::BindDim { symbol } => return Ok(InstrOp::BindDim { symbol: dims.symbol(*symbol)? }),
        Op::NonZero { .. } => Kernel::NonZero {},
        Op::Fused { program } => Kernel::Fused { program: program.clone() },
        // Lowered to several instructions by `Builder::lower_while`.
        Op::While { .. } => return Err("a loop is not one kernel".into()),
    };
    Ok(InstrOp::Call(kernel))
}

/// `[values node, indices node]` when nodes `a` and `b` are a sort's (or a
/// max pool's) values and indices of the same input with the same
/// parameters: one kernel call computes both. Only for nodes adjacent in the
/// schedule, so writing the second output one node early cannot overlap
/// anything the memory plan put in its slot (what dies at the first node is
/// its operand, which the second still reads).
fn value_index_pair(g: &Graph, a: NodeId, b: NodeId) -> Option<[NodeId; 2]> {
    let (na, nb) = (&g.nodes[a], &g.nodes[b]);
    if na.inputs != nb.inputs || na.outputs.len() != 1 || nb.outputs.len() != 1 {
        return None;
    }
    let values_first = match (&na.op, &nb.op) {
        (
            Op::Sort { axis, k, descending, indices },
            Op::Sort { axis: axis_b, k: k_b, descending: descending_b, indices: indices_b },
        ) if (axis, k, descending) == (axis_b, k_b, descending_b) && indices != indices_b => !indices,
        (
            Op::Pool { kind: ka, kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor, layout },
            Op::Pool {
                kind: kb,
                kernel: kernel_b,
                stride: stride_b,
                padding: padding_b,
                dilation: dilation_b,
                ceil_mode: ceil_mode_b,
                count_include_pad: count_include_pad_b,
                divisor: divisor_b,
                layout: layout_b,
            },
        ) if (kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor, layout)
            == (kernel_b, stride_b, padding_b, dilation_b, ceil_mode_b, count_include_pad_b, divisor_b, layout_b) =>
        {
            match (ka, kb) {
                (ir::PoolKind::Max, ir::PoolKind::ArgMax) => true,
                (ir::PoolKind::ArgMax, ir::PoolKind::Max) => false,
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(if values_first { [a, b] } else { [b, a] })
}

/// `-d` when `d` is a negative constant or a product with one (`-k * x`).
fn negated(d: &Dim) -> Option<Dim> {
    let neg = |d: &Dim| d.as_const().filter(|&v| v < 0).map(|v| Dim::Const(v.saturating_neg()));
    match d {
        Dim::Const(_) => neg(d),
        Dim::Mul(a, b) => match (neg(a), neg(b)) {
            (Some(k), _) => Some(Dim::mul(k, (**b).clone())),
            (None, Some(k)) => Some(Dim::mul((**a).clone(), k)),
            _ => None,
        },
        _ => None,
    }
}

/// Interns dimension expressions into the plan's expression table. Symbols
/// are declared on first use: `range_constraints` may name symbols that no
/// tensor mentions (seen in torch 2.15 files), and those need no bounds.
struct DimTable<'g> {
    graph_symbols: &'g kiln_ir::PrimaryMap<SymbolId, kiln_ir::Symbol>,
    symbols: Vec<SymbolDecl>,
    sym_index: HashMap<SymbolId, u32>,
    exprs: Vec<DimExpr>,
    interned: HashMap<DimExpr, u32>,
}

impl DimTable<'_> {
    fn dim(&mut self, d: &Dim) -> Result<DimRef, String> {
        match d {
            Dim::Const(v) => u64::try_from(*v).map(DimRef::Static).map_err(|_| format!("negative dimension {v}")),
            _ => Ok(DimRef::Expr(self.expr(d)?)),
        }
    }

    fn symbol(&mut self, s: SymbolId) -> Result<u32, String> {
        if let Some(&i) = self.sym_index.get(&s) {
            return Ok(i);
        }
        let sym = self.graph_symbols.get(s).ok_or_else(|| format!("unknown symbol {s}"))?;
        // The importer gives data-dependent symbols a bound or reports them.
        let max = sym.max.ok_or_else(|| {
            format!("symbol `{}` has no upper bound; export with torch.export.Dim(..., max=N)", sym.name)
        })?;
        let i = self.symbols.len() as u32;
        self.symbols.push(SymbolDecl { name: sym.name.clone(), min: sym.min.max(0) as u64, max: max.max(0) as u64 });
        self.sym_index.insert(s, i);
        Ok(i)
    }

    fn expr(&mut self, d: &Dim) -> Result<u32, String> {
        let e = match d {
            Dim::Const(v) => DimExpr::Const(u64::try_from(*v).map_err(|_| format!("negative dimension {v}"))?),
            Dim::Sym(s) => DimExpr::Sym(self.symbol(*s)?),
            // `a + (-k)` / `a + (-k)*b` (sympy's subtraction) become `a - k` / `a - k*b`.
            Dim::Add(a, b) => match (negated(b), negated(a)) {
                (Some(nb), _) => DimExpr::Sub(self.expr(a)?, self.expr(&nb)?),
                (None, Some(na)) => DimExpr::Sub(self.expr(b)?, self.expr(&na)?),
                (None, None) => DimExpr::Add(self.expr(a)?, self.expr(b)?),
            },
            Dim::Mul(a, b) => DimExpr::Mul(self.expr(a)?, self.expr(b)?),
            Dim::FloorDiv(a, b) => DimExpr::FloorDiv(self.expr(a)?, self.expr(b)?),
            Dim::Mod(a, b) => DimExpr::Mod(self.expr(a)?, self.expr(b)?),
        };
        if let Some(&i) = self.interned.get(&e) {
            return Ok(i);
        }
        let i = self.exprs.len() as u32;
        self.exprs.push(e);
        self.interned.insert(e, i);
        Ok(i)
    }

    fn shape(&mut self, shape: &[Dim]) -> Result<Vec<DimRef>, String> {
        shape.iter().map(|d| self.dim(d)).collect()
    }
}

/// Builds the execution plan and the weights segment for `g`, whose memory was
/// planned by [`kiln_passes::plan_memory`].
/// Every node must have a kernel in `target`'s CPU kernel table, for its dtype.
pub fn lower_to_plan(g: &Graph, mem: &MemoryPlan, target: &TargetDesc) -> Result<(Plan, WeightsBuilder), LowerError> {
    lower_to_plan_with_segments(g, mem, &[], target).map(|l| (l.plan, l.weights))
}

/// A run of scheduled nodes executed by one `InstrOp::Delegate { segment }`
/// instruction (segment = index in the slice given to
/// [`lower_to_plan_with_segments`]); see `stablehlo::partition`.
#[derive(Clone, Debug)]
pub struct AccelCall {
    /// In schedule order and contiguous in it.
    pub nodes: Vec<NodeId>,
    /// The call's operands and results, in `@main`'s order.
    pub args: Vec<ValueId>,
    pub results: Vec<ValueId>,
}

/// A plan whose accelerator calls are lowered too.
pub struct SegmentedPlan {
    pub plan: Plan,
    pub weights: WeightsBuilder,
    /// Per call: plan tensor ids of its args and results.
    pub call_tensors: Vec<(Vec<u32>, Vec<u32>)>,
    /// CPU instructions with the node each came from.
    pub cpu_instrs: Vec<(u32, NodeId)>,
    /// The plan tensor of each value of the top-level graph that has one.
    pub tensor_of: HashMap<ValueId, u32>,
}

/// [`lower_to_plan`] where each of `calls` becomes one `InstrOp::Delegate`
/// instruction at its first node's position and its nodes are skipped.
/// `mem` must give slots to every call's (non-constant) args and results.
pub fn lower_to_plan_with_segments(
    g: &Graph,
    mem: &MemoryPlan,
    calls: &[AccelCall],
    target: &TargetDesc,
) -> Result<SegmentedPlan, LowerError> {
    // The plan's tensors take the IR's layout, and its offsets the memory
    // plan's alignment: both must be what the target and the runtime take.
    target.check_layout(g).map_err(|e| LowerError(vec![format!("  {}", e.message)]))?;
    if mem.alignment > ARENA_ALIGN {
        return Err(LowerError(vec![format!(
            "  the memory plan aligns buffers to {} bytes (target `{}`: {}-byte vectors), but a session's arena is only {ARENA_ALIGN}-byte aligned",
            mem.alignment, target.target, target.vector_bytes
        )]));
    }
    let mut call_at: HashMap<NodeId, usize> = HashMap::new();
    let mut in_call: HashMap<NodeId, usize> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        if let Some(&first) = c.nodes.first() {
            call_at.insert(first, i);
        }
        for &n in &c.nodes {
            in_call.insert(n, i);
        }
    }
    let mut call_tensors = vec![(Vec::new(), Vec::new()); calls.len()];
    let mut cpu_instrs = Vec::new();
    let dims = DimTable {
        graph_symbols: &g.symbols,
        symbols: Vec::new(),
        sym_index: HashMap::new(),
        exprs: Vec::new(),
        interned: HashMap::new(),
    };
    let mut b = Builder {
        dims,
        kernels: target,
        weights: WeightsBuilder::new(),
        tensors: Vec::new(),
        instrs: Vec::new(),
        errors: Vec::new(),
    };
    let mut top = Scope { g, mem, base: 0, tensor_of: HashMap::new() };

    let arena_bytes = b.declare_states(&mut top);
    let mut inputs = Vec::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        if g.is_state_input(i) {
            continue;
        }
        let name = g.values[v].name.clone().unwrap_or_else(|| format!("input_{}", inputs.len()));
        let complex = g.is_complex_input(i);
        inputs.push(IoDecl { name, tensor: b.declare(&mut top, v), complex });
    }
    let mut at = 0;
    while let Some(&n) = g.order.get(at) {
        at += 1;
        if let Some(&i) = call_at.get(&n) {
            let c = &calls[i];
            let ins: Vec<u32> = c.args.iter().map(|&v| b.declare(&mut top, v)).collect();
            let outs: Vec<u32> = c.results.iter().map(|&v| b.declare(&mut top, v)).collect();
            call_tensors[i] = (ins.clone(), outs.clone());
            let origin = format!("accelerator segment {i} ({} nodes from {})", c.nodes.len(), g.describe_node(n));
            b.instrs.push(Instr { op: InstrOp::Delegate { segment: i as u32 }, inputs: ins, outputs: outs, origin });
            continue;
        }
        if in_call.contains_key(&n) {
            continue;
        }
        cpu_instrs.push((b.instrs.len() as u32, n));
        let next = g.order.get(at).copied().filter(|m| !call_at.contains_key(m) && !in_call.contains_key(m));
        at += b.lower_next(&mut top, n, next);
    }
    let mut outputs = Vec::new();
    let mut results = Vec::with_capacity(g.outputs.len());
    for (i, &v) in g.outputs.iter().enumerate() {
        results.push(b.result_tensor(&mut top, v));
        if !g.is_state_output(i) {
            let name = g.output_names.get(i).cloned().unwrap_or_else(|| format!("output_{i}"));
            outputs.push(IoDecl { name, tensor: results[i], complex: g.is_complex_output(i) });
        }
    }
    let states = g
        .states
        .iter()
        .map(|st| {
            let tensor = top.tensor_of[&g.inputs[st.input]];
            let init = b.tensors.len() as u32;
            let decl = TensorDecl { storage: b.weights.push(st.init.as_bytes()), ..b.tensors[tensor as usize].clone() };
            b.tensors.push(decl);
            StateDecl { name: st.name.clone(), tensor, update: results[st.output], init }
        })
        .collect();
    let Builder { dims, weights, tensors, instrs, mut errors, .. } = b;
    if !errors.is_empty() {
        errors.dedup();
        return Err(LowerError(errors));
    }
    let tensor_of = top.tensor_of;
    let plan = Plan {
        symbols: dims.symbols,
        exprs: dims.exprs,
        tensors,
        inputs,
        outputs,
        instrs,
        arena_bytes,
        peak_live_bytes: mem.peak_live_bytes,
        states,
    };
    Ok(SegmentedPlan { plan, weights, call_tensors, cpu_instrs, tensor_of })
}

/// The plan's tables under construction, shared by a graph and the nested
/// graphs of its loops (which use the same symbol ids).
struct Builder<'g> {
    dims: DimTable<'g>,
    /// Whose CPU kernels run the plan's calls.
    kernels: &'g TargetDesc,
    weights: WeightsBuilder,
    tensors: Vec<TensorDecl>,
    instrs: Vec<Instr>,
    errors: Vec<String>,
}

/// One graph being lowered: its memory plan, where that plan's offsets start
/// in the arena (a loop's region for nested graphs), and its values' tensors
/// (a nested graph's inputs are its loop's tensors).
struct Scope<'a> {
    g: &'a Graph,
    mem: &'a MemoryPlan,
    base: u64,
    tensor_of: HashMap<ValueId, u32>,
}

impl<'a> Scope<'a> {
    /// A loop's nested graph, whose inputs are the loop's tensors `inputs`.
    fn nested(g: &'a Graph, mem: &'a MemoryPlan, base: u64, inputs: &[u32]) -> Scope<'a> {
        Scope { g, mem, base, tensor_of: g.inputs.iter().copied().zip(inputs.iter().copied()).collect() }
    }
}

/// Where the state region starts: past every slot of the memory plan.
const STATE_ALIGN: u64 = 64;

impl Builder<'_> {
    /// Declares each state's current value in the state region, after the
    /// memory plan's arena, where no instruction writes (the memory planner's
    /// slot for the input stays unused, or holds a copy: see
    /// [`Builder::result_tensor`]). Returns the arena size with the region.
    fn declare_states(&mut self, top: &mut Scope) -> u64 {
        let g = top.g;
        let mut end = top.mem.arena_bytes.next_multiple_of(STATE_ALIGN);
        for st in &g.states {
            let v = g.inputs[st.input];
            let bytes = st.init.len() as u64;
            let shape = self.dims.shape(&g.ty(v).shape).unwrap_or_else(|e| {
                self.errors.push(format!("state `{}`: {e}", st.name));
                Vec::new()
            });
            let t = self.tensors.len() as u32;
            let storage = Storage::Arena { offset: end, max_bytes: bytes };
            self.tensors.push(TensorDecl { dtype: g.ty(v).dtype, shape, storage });
            top.tensor_of.insert(v, t);
            end = (end + bytes).next_multiple_of(STATE_ALIGN);
        }
        if g.states.is_empty() {
            top.mem.arena_bytes
        } else {
            end
        }
    }

    /// The tensor holding graph output `v` when the run ends. A state's
    /// current value returned as is (an output, or another state's next
    /// value) is copied into the memory plan's slot for it first: the state
    /// region is overwritten by the end-of-run update.
    fn result_tensor(&mut self, top: &mut Scope, v: ValueId) -> u32 {
        let g = top.g;
        let t = self.declare(top, v);
        let Some(k) = g.states.iter().position(|st| g.inputs[st.input] == v) else { return t };
        let Some(slot) = top.mem.slots[v] else {
            self.errors.push(format!("state `{}` has no memory slot to be returned from", g.states[k].name));
            return t;
        };
        let storage = Storage::Arena { offset: top.base + slot.offset, max_bytes: slot.size };
        let copy = self.tensors.len() as u32;
        self.tensors.push(TensorDecl { storage, ..self.tensors[t as usize].clone() });
        self.instrs.push(Instr {
            op: InstrOp::Call(Kernel::Copy {}),
            inputs: vec![t],
            outputs: vec![copy],
            origin: format!("the value of state `{}` before this run's update", g.states[k].name),
        });
        copy
    }

    /// The plan tensor of `v`, declared on first use.
    fn declare(&mut self, s: &mut Scope, v: ValueId) -> u32 {
        if let Some(&t) = s.tensor_of.get(&v) {
            return t;
        }
        let g = s.g;
        let ty = g.ty(v);
        // A state's update written into the state's storage, or a reshape
        // sharing its buffer (the memory plan proved it safe): the state's
        // own tensor, or a view of its storage.
        let state = s.mem.state_values[v]
            .and_then(|k| g.states.get(k))
            .and_then(|st| s.tensor_of.get(&g.inputs[st.input]).map(|&t| (t, g.inputs[st.input])));
        if let Some((current, old)) = state {
            if ty == g.ty(old) {
                s.tensor_of.insert(v, current);
                return current;
            }
        }
        let storage = match (&g.values[v].def, state) {
            (_, Some((current, _))) => self.tensors[current as usize].storage,
            (ValueDef::Const(c), None) => self.weights.push(g.consts[*c].bytes.as_bytes()),
            (_, None) => match s.mem.slots[v] {
                Some(slot) => Storage::Arena { offset: s.base + slot.offset, max_bytes: slot.size },
                None => {
                    self.errors.push(format!("value {v} has no memory slot"));
                    Storage::Arena { offset: 0, max_bytes: 0 }
                }
            },
        };
        let shape = self.dims.shape(&ty.shape).unwrap_or_else(|e| {
            self.errors.push(format!("value {v}: {e}"));
            Vec::new()
        });
        let t = self.tensors.len() as u32;
        self.tensors.push(TensorDecl { dtype: ty.dtype, shape, storage });
        s.tensor_of.insert(v, t);
        t
    }

    /// Lowers `order`, a graph's schedule.
    fn lower_order(&mut self, s: &mut Scope, order: &[NodeId]) {
        let mut at = 0;
        while let Some(&n) = order.get(at) {
            at += 1;
            at += self.lower_next(s, n, order.get(at).copied());
        }
    }

    /// Lowers scheduled node `n`; when the node scheduled next is its
    /// sibling (the values and indices of one sort or max pool), both become
    /// one two-output call, and this returns 1: the sibling is done too.
    fn lower_next(&mut self, s: &mut Scope, n: NodeId, next: Option<NodeId>) -> usize {
        if let Some([values, indices]) = next.and_then(|m| value_index_pair(s.g, n, m)) {
            let g = s.g;
            match self.instr_op(g, values) {
                Ok(op) => {
                    let ins = g.nodes[values].inputs.iter().map(|&v| self.declare(s, v)).collect();
                    let mut outs = Vec::with_capacity(2);
                    for m in [values, indices] {
                        outs.push(self.declare(s, g.nodes[m].outputs[0]));
                    }
                    let origin = g.describe_node(values);
                    self.instrs.push(Instr { op, inputs: ins, outputs: outs, origin });
                }
                Err(why) => self.errors.push(format!("  {}: {why}", g.describe_node(values))),
            }
            return 1;
        }
        self.lower_node(s, n);
        0
    }

    /// The instruction for node `n`, when the target's CPU kernels take it.
    fn instr_op(&mut self, g: &Graph, n: NodeId) -> Result<InstrOp, String> {
        let node = &g.nodes[n];
        let dtype = data_dtype(g, node);
        // int8 activations between quantized layers (the quant_acts pass):
        // the channels-last max pool also pools i8 values.
        let int8_pool = dtype == Some(kiln_ir::DType::I8)
            && matches!(node.op, Op::Pool { kind: kiln_ir::PoolKind::Max, layout: kiln_ir::Layout::ChannelsLast, .. });
        if !int8_pool && !self.kernels.kernel_support(&node.op).takes(dtype) {
            let dtype = dtype.map_or(String::new(), |d| format!(" for {d}"));
            return Err(format!("the target's CPU kernels have no `{}`{dtype}", node.op.name()));
        }
        let op = instr_op_for(g, &node.op, &node.inputs, &mut self.dims)?;
        // The IR names its plan opcode in the instruction-set table; lowering
        // must agree (a slice counted from a dynamic end is its variant).
        let agrees = Some(op.opcode()) == node.op.plan_opcode()
            || (op.opcode() == Opcode::SliceFromEnd && matches!(node.op, Op::Slice { .. }));
        if !agrees {
            return Err(format!("lowered to `{}`, not its table opcode (compiler bug)", op.opcode()));
        }
        Ok(op)
    }

    /// One scheduled node as one instruction, or a loop as its instructions.
    fn lower_node(&mut self, s: &mut Scope, n: NodeId) {
        let g = s.g;
        let node = &g.nodes[n];
        if let Op::While { carried, cond, body } = &node.op {
            return self.lower_while(s, n, *carried, cond, body);
        }
        match self.instr_op(g, n) {
            Ok(op) => {
                let ins = node.inputs.iter().map(|&v| self.declare(s, v)).collect();
                let outs = node.outputs.iter().map(|&v| self.declare(s, v)).collect();
                self.instrs.push(Instr { op, inputs: ins, outputs: outs, origin: g.describe_node(n) });
            }
            Err(why) => self.errors.push(format!("  {}: {why}", g.describe_node(n))),
        }
    }

    /// A loop, as a flat run of instructions (the loop's results are its
    /// carried values' slots):
    ///
    /// ```text
    ///        copy init_j -> carried_j              (each carried value)
    /// head:  <cond>                                (inputs: carried ++ read-only operands)
    ///        jump_if_false cond_result -> exit
    ///        <body>
    ///        copy carried_k -> swap_j              (body returns carried k as j != k)
    ///        copy result_j (or swap_j) -> carried_j
    ///        jump -> head
    /// exit:
    /// ```
    ///
    /// Body results live in the loop's region, apart from every carried slot,
    /// so the updates cannot read a slot already overwritten, except for a
    /// carried value returned unchanged at another position, which is saved
    /// to its swap slot before any update.
    fn lower_while(&mut self, s: &mut Scope, n: NodeId, carried: usize, cond: &Graph, body: &Graph) {
        let g = s.g;
        let node = &g.nodes[n];
        let origin = g.describe_node(n);
        let Some(lp) = s.mem.loops.get(&n) else {
            return self.errors.push(format!("  {origin}: the loop has no memory region"));
        };
        let (Some(&pred), true) =
            (cond.outputs.first(), body.outputs.len() == carried && node.outputs.len() == carried)
        else {
            return self.errors.push(format!("  {origin}: malformed loop"));
        };
        let operands: Vec<u32> = node.inputs.iter().map(|&v| self.declare(s, v)).collect();
        let state: Vec<u32> = node.outputs.iter().map(|&v| self.declare(s, v)).collect();
        let loop_inputs: Vec<u32> = state.iter().chain(&operands[carried..]).copied().collect();
        let copy = |from: u32, to: u32, what: String| Instr {
            op: InstrOp::Call(Kernel::Copy {}),
            inputs: vec![from],
            outputs: vec![to],
            origin: what,
        };
        for (j, (&init, &slot)) in operands.iter().zip(&state).enumerate() {
            self.instrs.push(copy(init, slot, format!("{origin}: initial carried value {j}")));
        }
        let base = s.base + lp.offset;
        let head = self.instrs.len();
        let mut cs = Scope::nested(cond, &lp.cond, base, &loop_inputs);
        self.lower_order(&mut cs, &cond.order);
        let pred = self.declare(&mut cs, pred);
        let exit_at = self.instrs.len();
        self.instrs.push(Instr {
            op: InstrOp::JumpIfFalse { target: 0 },
            inputs: vec![pred],
            outputs: vec![],
            origin: format!("{origin}: exit"),
        });
        let mut bs = Scope::nested(body, &lp.body, base, &loop_inputs);
        self.lower_order(&mut bs, &body.order);
        let mut sources: Vec<u32> = body.outputs.iter().map(|&v| self.declare(&mut bs, v)).collect();
        for (j, slot) in lp.swap.iter().enumerate() {
            let (Some(slot), Some(&t)) = (slot, state.get(j)) else { continue };
            let decl = TensorDecl {
                storage: Storage::Arena { offset: base + slot.offset, max_bytes: slot.size },
                ..self.tensors[t as usize].clone()
            };
            let saved = self.tensors.len() as u32;
            self.tensors.push(decl);
            self.instrs.push(copy(sources[j], saved, format!("{origin}: save carried value for position {j}")));
            sources[j] = saved;
        }
        for (j, (&from, &to)) in sources.iter().zip(&state).enumerate() {
            if from != to {
                self.instrs.push(copy(from, to, format!("{origin}: update carried value {j}")));
            }
        }
        self.instrs.push(Instr {
            op: InstrOp::Jump { target: head as u32 },
            inputs: vec![],
            outputs: vec![],
            origin: format!("{origin}: next iteration"),
        });
        let exit = self.instrs.len() as u32;
        self.instrs[exit_at].op = InstrOp::JumpIfFalse { target: exit };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, Op, TensorType, UnaryOp};
    use kiln_passes::{plan_memory, Layout, MemoryOptions, Target};

    fn graph(op: Op, shape: &[i64]) -> Graph {
        let mut g = Graph::new();
        let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
        let y = g.push(op, vec![x], TensorType::fixed(DType::F32, shape), None);
        g.add_output("y", y);
        g
    }

    /// Lowering consults the target description: a vector width the
    /// runtime's arena cannot align for, or a layout the IR's ops do not
    /// have, is refused; the CPU description lowers.
    #[test]
    fn lowering_checks_the_target_alignment_and_layout() {
        let cpu = Target::Cpu.desc();
        let g = graph(Op::Unary(UnaryOp::Relu), &[2, 3]);
        let mem = plan_memory(&g, &MemoryOptions::for_target(cpu)).unwrap();
        lower_to_plan(&g, &mem, cpu).unwrap();

        let wide = TargetDesc { vector_bytes: 256, ..cpu.clone() };
        let mem = plan_memory(&g, &MemoryOptions::for_target(&wide)).unwrap();
        let err = lower_to_plan(&g, &mem, &wide).err().expect("a 256-byte alignment lowered").to_string();
        assert!(err.contains("aligns buffers to 256 bytes"), "{err}");

        let channels_last = TargetDesc { layout: Layout::ChannelsLast, ..cpu.clone() };
        lower_to_plan(&g, &mem_for(&g), &channels_last).unwrap();
        let pool = Op::AdaptiveAvgPool { output: vec![1, 1] };
        let g = graph(pool, &[1, 2, 4, 4]);
        let err = lower_to_plan(&g, &mem_for(&g), &channels_last).err().expect("pooling lowered").to_string();
        assert!(err.contains("adaptive_avg_pool") && err.contains("channels-last"), "{err}");
    }

    fn mem_for(g: &Graph) -> MemoryPlan {
        plan_memory(g, &MemoryOptions::default()).unwrap()
    }
}
