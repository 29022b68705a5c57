//! Lowering a planned kiln IR graph to the runtime's execution plan.
//!
//! The IR is for transformation; the plan is for execution: flat tables indexed
//! by `u32`, kernels chosen here once, weights packed into one aligned segment.
//! This is the only place that knows both vocabularies.

use kiln_ir::{self as ir, Dim, Graph, NodeId, Op, SymbolId, ValueDef, ValueId};
use kiln_passes::MemoryPlan;
use kiln_runtime::format::{
    DimExpr, DimRef, Instr, IoDecl, Kernel, Plan, Storage, SymbolDecl, TensorDecl, WeightsBuilder,
};
use kiln_runtime::DType;
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
#[error("cannot lower to the CPU plan:\n{}", .0.join("\n"))]
pub struct LowerError(pub Vec<String>);

pub fn dtype(d: ir::DType) -> DType {
    match d {
        ir::DType::F32 => DType::F32,
        ir::DType::F64 => DType::F64,
        ir::DType::F16 => DType::F16,
        ir::DType::BF16 => DType::BF16,
        ir::DType::I8 => DType::I8,
        ir::DType::U8 => DType::U8,
        ir::DType::I16 => DType::I16,
        ir::DType::I32 => DType::I32,
        ir::DType::I64 => DType::I64,
        ir::DType::Bool => DType::Bool,
    }
}

fn unary(op: ir::UnaryOp) -> kiln_runtime::format::UnaryOp {
    use ir::UnaryOp as U;
    use kiln_runtime::format::UnaryOp as K;
    match op {
        U::Neg => K::Neg,
        U::Abs => K::Abs,
        U::Exp => K::Exp,
        U::Log => K::Log,
        U::Sqrt => K::Sqrt,
        U::Rsqrt => K::Rsqrt,
        U::Reciprocal => K::Reciprocal,
        U::Relu => K::Relu,
        U::Sigmoid => K::Sigmoid,
        U::Tanh => K::Tanh,
        U::Gelu => K::Gelu,
        U::GeluTanh => K::GeluTanh,
        U::Silu => K::Silu,
        U::Erf => K::Erf,
        U::Sin => K::Sin,
        U::Cos => K::Cos,
        U::Floor => K::Floor,
        U::Ceil => K::Ceil,
        U::Round => K::Round,
        U::Sign => K::Sign,
        U::Not => K::Not,
        U::Log1p => K::Log1p,
        U::Expm1 => K::Expm1,
        U::Trunc => K::Trunc,
        U::Tan => K::Tan,
        U::Asin => K::Asin,
        U::Acos => K::Acos,
        U::Atan => K::Atan,
        U::Sinh => K::Sinh,
        U::Cosh => K::Cosh,
        U::Asinh => K::Asinh,
        U::Acosh => K::Acosh,
        U::Atanh => K::Atanh,
        U::Log2 => K::Log2,
        U::Log10 => K::Log10,
        U::BitNot => K::BitNot,
    }
}

fn binary(op: ir::BinaryOp) -> kiln_runtime::format::BinaryOp {
    use ir::BinaryOp as B;
    use kiln_runtime::format::BinaryOp as K;
    match op {
        B::Add => K::Add,
        B::Sub => K::Sub,
        B::Mul => K::Mul,
        B::Div => K::Div,
        B::FloorDiv => K::FloorDiv,
        B::Rem => K::Rem,
        B::Pow => K::Pow,
        B::Max => K::Max,
        B::Min => K::Min,
        B::Eq => K::Eq,
        B::Ne => K::Ne,
        B::Lt => K::Lt,
        B::Le => K::Le,
        B::Gt => K::Gt,
        B::Ge => K::Ge,
        B::And => K::And,
        B::Or => K::Or,
        B::Xor => K::Xor,
        B::Atan2 => K::Atan2,
        B::Fmod => K::Fmod,
    }
}

fn reduce_kind(k: ir::ReduceKind) -> kiln_runtime::format::ReduceKind {
    use kiln_runtime::format::ReduceKind as K;
    match k {
        ir::ReduceKind::Sum => K::Sum,
        ir::ReduceKind::Mean => K::Mean,
        ir::ReduceKind::Max => K::Max,
        ir::ReduceKind::Min => K::Min,
        ir::ReduceKind::Prod => K::Prod,
    }
}

fn u32s(v: &[i64]) -> Option<Vec<u32>> {
    v.iter().map(|&x| u32::try_from(x).ok()).collect()
}

fn axes32(v: &[usize]) -> Vec<u32> {
    v.iter().map(|&x| x as u32).collect()
}

/// Chooses the kernel for one node; `Err` says why the CPU cannot run it.
fn kernel_for(g: &Graph, op: &Op, inputs: &[ValueId], dims: &mut DimTable) -> Result<Kernel, String> {
    let bad_params = || format!("parameters out of range for the CPU kernel: {op:?}");
    Ok(match op {
        Op::Unary(u) => Kernel::Unary(unary(*u)),
        Op::Binary(b) => Kernel::Binary(binary(*b)),
        Op::Where => Kernel::Where,
        Op::Cast { .. } => Kernel::Cast,
        Op::Clamp { min, max } => Kernel::Clamp { min: *min, max: *max },
        Op::MatMul => Kernel::MatMul,
        Op::Linear => Kernel::Linear,
        Op::Conv { stride, padding, dilation, groups } => Kernel::Conv {
            stride: u32s(stride).ok_or_else(bad_params)?,
            padding: u32s(padding).ok_or_else(bad_params)?,
            dilation: u32s(dilation).ok_or_else(bad_params)?,
            groups: u32::try_from(*groups).map_err(|_| bad_params())?,
        },
        Op::BatchNorm { eps } => Kernel::BatchNorm { eps: *eps },
        Op::LayerNorm { normalized_rank, eps } => {
            Kernel::LayerNorm { normalized_rank: *normalized_rank as u32, eps: *eps }
        }
        Op::Softmax { axis } => Kernel::Softmax { axis: *axis as u32, log: false },
        Op::LogSoftmax { axis } => Kernel::Softmax { axis: *axis as u32, log: true },
        Op::Reduce { kind, axes, .. } => Kernel::Reduce { kind: reduce_kind(*kind), axes: axes32(axes) },
        Op::ArgMax { axis, .. } => Kernel::ArgMax { axis: *axis as u32 },
        Op::Pool { kind, kernel, stride, padding, dilation, count_include_pad, divisor, .. } => Kernel::Pool {
            kind: match kind {
                ir::PoolKind::Max => kiln_runtime::format::PoolKind::Max,
                ir::PoolKind::Avg => kiln_runtime::format::PoolKind::Avg,
                ir::PoolKind::ArgMax => kiln_runtime::format::PoolKind::ArgMax,
            },
            kernel: u32s(kernel).ok_or_else(bad_params)?,
            stride: u32s(stride).ok_or_else(bad_params)?,
            padding: u32s(padding).ok_or_else(bad_params)?,
            dilation: u32s(dilation).ok_or_else(bad_params)?,
            count_include_pad: *count_include_pad,
            divisor: *divisor,
        },
        Op::AdaptiveAvgPool { .. } => Kernel::AdaptiveAvgPool,
        Op::Attention { causal, scale } => Kernel::Attention { causal: *causal, scale: *scale },
        Op::Reshape { .. } => Kernel::Copy,
        Op::Expand { .. } => Kernel::Expand,
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
        Op::ArgMin { axis, .. } => Kernel::ArgMin { axis: *axis as u32 },
        Op::Sort { axis, descending, indices, .. } => {
            Kernel::Sort { axis: *axis as u32, descending: *descending, indices: *indices }
        }
        Op::Pad { lo, hi, interior, mode, value } => Kernel::Pad {
            lo: lo.clone(),
            hi: hi.clone(),
            interior: interior.clone(),
            mode: match mode {
                ir::PadMode::Constant => kiln_runtime::format::PadMode::Constant,
                ir::PadMode::Reflect => kiln_runtime::format::PadMode::Reflect,
                ir::PadMode::Replicate => kiln_runtime::format::PadMode::Replicate,
            },
            value: *value,
        },
        Op::Flip { axes } => Kernel::Flip { axes: axes32(axes) },
        Op::Upsample { mode, align_corners, size, scales } => Kernel::Resize {
            mode: match mode {
                ir::UpsampleMode::Nearest => kiln_runtime::format::ResizeMode::Nearest,
                ir::UpsampleMode::Linear => kiln_runtime::format::ResizeMode::Linear,
            },
            align_corners: *align_corners,
            spatial: size.len() as u32,
            scales: scales.clone(),
        },
        Op::Random { dist, stream, .. } => Kernel::Random {
            dist: match *dist {
                ir::RandomDist::Uniform { low, high } => kiln_runtime::format::RandomDist::Uniform { low, high },
                ir::RandomDist::Normal { mean, std } => kiln_runtime::format::RandomDist::Normal { mean, std },
                ir::RandomDist::Int { low, high } => kiln_runtime::format::RandomDist::Int { low, high },
                ir::RandomDist::Perm => kiln_runtime::format::RandomDist::Perm,
            },
            stream: *stream,
        },
        Op::GatherElements { axis } => Kernel::GatherElements { axis: *axis as u32 },
        Op::ScatterElements { axis, reduce, include_self } => {
            Kernel::ScatterElements { axis: *axis as u32, reduce: reduce.map(reduce_kind), include_self: *include_self }
        }
        Op::IndexGather { axis } => Kernel::IndexGather { axis: *axis as u32 },
        Op::IndexPut { axis, accumulate } => Kernel::IndexPut { axis: *axis as u32, accumulate: *accumulate },
        Op::BindDim { symbol } => Kernel::BindDim { symbol: dims.symbol(*symbol)? },
        Op::NonZero { .. } => Kernel::NonZero,
        // Lowered to several instructions by `Builder::lower_while`.
        Op::While { .. } => return Err("a loop is not one kernel".into()),
    })
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
pub fn lower_to_plan(g: &Graph, mem: &MemoryPlan) -> Result<(Plan, WeightsBuilder), LowerError> {
    lower_to_plan_with_segments(g, mem, &[]).map(|l| (l.plan, l.weights))
}

/// A run of scheduled nodes executed by one `Kernel::Accel { segment }`
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
}

/// [`lower_to_plan`] where each of `calls` becomes one `Kernel::Accel`
/// instruction at its first node's position and its nodes are skipped.
/// `mem` must give slots to every call's (non-constant) args and results.
pub fn lower_to_plan_with_segments(
    g: &Graph,
    mem: &MemoryPlan,
    calls: &[AccelCall],
) -> Result<SegmentedPlan, LowerError> {
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
    let mut b =
        Builder { dims, weights: WeightsBuilder::new(), tensors: Vec::new(), instrs: Vec::new(), errors: Vec::new() };
    let mut top = Scope { g, mem, base: 0, tensor_of: HashMap::new() };

    let mut inputs = Vec::new();
    for &v in &g.inputs {
        let name = g.values[v].name.clone().unwrap_or_else(|| format!("input_{}", inputs.len()));
        inputs.push(IoDecl { name, tensor: b.declare(&mut top, v) });
    }
    for &n in &g.order {
        if let Some(&i) = call_at.get(&n) {
            let c = &calls[i];
            let ins: Vec<u32> = c.args.iter().map(|&v| b.declare(&mut top, v)).collect();
            let outs: Vec<u32> = c.results.iter().map(|&v| b.declare(&mut top, v)).collect();
            call_tensors[i] = (ins.clone(), outs.clone());
            let origin = format!("accelerator segment {i} ({} nodes from {})", c.nodes.len(), g.describe_node(n));
            b.instrs.push(Instr { kernel: Kernel::Accel { segment: i as u32 }, inputs: ins, outputs: outs, origin });
            continue;
        }
        if in_call.contains_key(&n) {
            continue;
        }
        cpu_instrs.push((b.instrs.len() as u32, n));
        b.lower_node(&mut top, n);
    }
    let mut outputs = Vec::new();
    for (i, &v) in g.outputs.iter().enumerate() {
        let name = g.output_names.get(i).cloned().unwrap_or_else(|| format!("output_{i}"));
        outputs.push(IoDecl { name, tensor: b.declare(&mut top, v) });
    }
    let Builder { dims, weights, tensors, instrs, mut errors } = b;
    if !errors.is_empty() {
        errors.dedup();
        return Err(LowerError(errors));
    }
    let plan = Plan {
        symbols: dims.symbols,
        exprs: dims.exprs,
        tensors,
        inputs,
        outputs,
        instrs,
        arena_bytes: mem.arena_bytes,
        peak_live_bytes: mem.peak_live_bytes,
    };
    Ok(SegmentedPlan { plan, weights, call_tensors, cpu_instrs })
}

/// The plan's tables under construction, shared by a graph and the nested
/// graphs of its loops (which use the same symbol ids).
struct Builder<'g> {
    dims: DimTable<'g>,
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

impl Builder<'_> {
    /// The plan tensor of `v`, declared on first use.
    fn declare(&mut self, s: &mut Scope, v: ValueId) -> u32 {
        if let Some(&t) = s.tensor_of.get(&v) {
            return t;
        }
        let g = s.g;
        let ty = g.ty(v);
        let storage = match &g.values[v].def {
            ValueDef::Const(c) => self.weights.push(g.consts[*c].bytes.as_bytes()),
            _ => match s.mem.slots[v] {
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
        self.tensors.push(TensorDecl { dtype: dtype(ty.dtype), shape, storage });
        s.tensor_of.insert(v, t);
        t
    }

    /// One scheduled node as one instruction, or a loop as its instructions.
    fn lower_node(&mut self, s: &mut Scope, n: NodeId) {
        let g = s.g;
        let node = &g.nodes[n];
        if let Op::While { carried, cond, body } = &node.op {
            return self.lower_while(s, n, *carried, cond, body);
        }
        match kernel_for(g, &node.op, &node.inputs, &mut self.dims) {
            Ok(kernel) => {
                let ins = node.inputs.iter().map(|&v| self.declare(s, v)).collect();
                let outs = node.outputs.iter().map(|&v| self.declare(s, v)).collect();
                self.instrs.push(Instr { kernel, inputs: ins, outputs: outs, origin: g.describe_node(n) });
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
            kernel: Kernel::Copy,
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
        for &m in &cond.order {
            self.lower_node(&mut cs, m);
        }
        let pred = self.declare(&mut cs, pred);
        let exit_at = self.instrs.len();
        self.instrs.push(Instr {
            kernel: Kernel::JumpIfFalse { target: 0 },
            inputs: vec![pred],
            outputs: vec![],
            origin: format!("{origin}: exit"),
        });
        let mut bs = Scope::nested(body, &lp.body, base, &loop_inputs);
        for &m in &body.order {
            self.lower_node(&mut bs, m);
        }
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
            kernel: Kernel::Jump { target: head as u32 },
            inputs: vec![],
            outputs: vec![],
            origin: format!("{origin}: next iteration"),
        });
        let exit = self.instrs.len() as u32;
        self.instrs[exit_at].kernel = Kernel::JumpIfFalse { target: exit };
    }
}
