//! StableHLO emission: one segment → one `func.func @main` as MLIR text.
//!
//! MLIR 19 has no StableHLO dialect, so ops are built with `OperationBuilder`
//! in a context that allows unregistered dialects and are printed in generic
//! form; only `func` is a registered dialect. Attribute text is opaque to
//! MLIR here (any spelling parses), so every form below was checked by
//! compiling and running it on the XLA CPU PJRT plugin (tests
//! `compiler/tests/compiler/stablehlo_*.rs`).
//!
//! Composites (linear, norms, softmax, attention, pooling) are built from
//! primitives; XLA fuses them again. With [`Precision::Bf16`], f32 values
//! inside a segment are carried as bf16, matrix products and convolutions
//! accumulate in f32 (their result type is f32, XLA's preferred element
//! type), and reductions (sums, means, norms, softmax) run in f32; segment
//! arguments and results keep their f32 type at the boundary except large
//! weights, which the compiler converts to bf16 ahead of time.
//!
//! This file holds the public surface, the `Emitter` with its core op
//! builder and `lower_node`, the per-op dispatch. The lowerings themselves
//! live in child modules, one idea each:
//!
//! - `text`: MLIR type and attribute text (element types, arrays, literals,
//!   dot dimension numbers) and shape arithmetic.
//! - `builders`: single StableHLO ops with operand checks and implicit
//!   broadcasting (binary, compare, select, convert, reshape, constants).
//! - `elementwise`: unary and binary math (erf and the composite
//!   formulations), reductions and softmax.
//! - `linalg`: dot products, matmul, convolution, pooling, attention.
//! - `index`: gathers for torch's indexing ops.
//! - `control`: `while_loop` as `stablehlo.while`.
//! - `quant`: `quant_linear` with integer weights and int8 activations.
//! - `sort`: sort/argsort/topk and `scatter_elements` (a MoE router's ops).
//! - `special`: igamma/igammac (f64 series and continued fraction loops).
//! - `manual`: regions kiln partitions by hand (`sdy.manual_computation`
//!   with explicit collectives): experts' all-to-all token dispatch.
//! - `ring`: ring attention (`--shard context-parallel`), an attention
//!   split on the sequence as a manual region rotating key and value blocks
//!   by `collective_permute` (online softmax).
//! - `pipeline`: pipeline stages, the repeated blocks as one manual region
//!   with `collective_permute`s between stages (GPipe's schedule, unrolled).
//!
//! Every module is checked by the collective verifier (`super::verify`)
//! before it is returned: a wrong collective mode would abort the plugin's
//! process at execute.

mod builders;
mod control;
mod elementwise;
mod index;
mod linalg;
mod manual;
mod pipeline;
mod quant;
mod ring;
mod sort;
mod special;
mod text;

use super::partition::Segment;
use super::sharding::{gspmd_sharding, shardy_mesh, shardy_sharding, ShardingDialect, SpmdEmit, MESH_SYMBOL};
use super::Precision;
use kiln_ir::{DType, Graph, NodeId, Op, ReduceKind, Sharding, ValueId};
use kiln_passes::shard::{ExpertDispatch, RingAttention, Use};
use linalg::Divisor;
use melior::dialect::DialectHandle;
use melior::ir::attribute::{StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::FunctionType;
use melior::ir::RegionLike;
use melior::ir::{Attribute, Block, BlockRef, Identifier, Location, Module, Region, Type, Value};
use melior::Context;
use std::collections::HashMap;
use text::{arr, list, numel, parse_type};

pub use super::INLINE_CONST_MAX_ELEMENTS;

/// A segment as StableHLO text.
#[derive(Clone, Debug)]
pub struct Emitted {
    pub mlir: String,
    /// `@main`'s arguments in order (graph values; small constants are inlined
    /// and do not appear).
    pub args: Vec<ValueId>,
    /// Indices into `args` of f32 weights that `@main` takes as bf16: the caller
    /// passes a bf16 copy of the constant.
    pub bf16_args: Vec<usize>,
    pub results: Vec<ValueId>,
}

/// Why a segment could not be emitted: the node at fault (moved to the CPU by
/// the caller) and the reason.
#[derive(Clone, Debug)]
pub struct EmitError {
    pub node: Option<NodeId>,
    pub reason: String,
    /// The collective verifier refused the module: a compile error, never a
    /// reason to move nodes to the CPU (no op is unsupported; the module
    /// kiln wrote is wrong).
    pub fatal: bool,
}

fn err(reason: impl Into<String>) -> EmitError {
    EmitError { node: None, reason: reason.into(), fatal: false }
}

fn mlir_err(e: melior::Error) -> EmitError {
    err(format!("MLIR: {e}"))
}

/// A new MLIR context for emission: `func` registered, everything else opaque.
pub fn new_context() -> Context {
    let ctx = Context::new();
    let registry = melior::dialect::DialectRegistry::new();
    DialectHandle::func().insert_dialect(&registry);
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    ctx.set_allow_unregistered_dialects(true);
    ctx
}

/// Emits `seg` as a StableHLO module with one `func.func @main`.
pub fn emit_segment(ctx: &Context, g: &Graph, seg: &Segment, precision: Precision) -> Result<Emitted, EmitError> {
    emit_segment_with(ctx, g, seg, precision, None)
}

/// [`emit_segment`], for an SPMD program when `spmd` is given: every `@main`
/// argument and result annotated with its sharding (`g`'s value attributes;
/// none is replicated), and propagation's reshardings as constraints on the
/// uses they name.
pub fn emit_segment_with(
    ctx: &Context,
    g: &Graph,
    seg: &Segment,
    precision: Precision,
    spmd: Option<&SpmdEmit>,
) -> Result<Emitted, EmitError> {
    let loc = Location::unknown(ctx);
    let bf16 = precision == Precision::Bf16;
    let cdt = |d: DType| if bf16 && d == DType::F32 { DType::BF16 } else { d };

    // Arguments: every input value, except small constants written inline.
    // A quantized layer's scales and bias stay f32 in bf16 mode: its
    // integer arithmetic is defined on f32 parameters.
    let quant_params: Vec<ValueId> = seg
        .nodes
        .iter()
        .filter(|&&n| matches!(g.nodes[n].op, Op::QuantLinear { .. } | Op::QuantConv { .. }))
        .flat_map(|&n| g.nodes[n].inputs.iter().skip(2).copied())
        .collect();
    let mut args = Vec::new();
    let mut bf16_args = Vec::new();
    let mut arg_types = Vec::new();
    for &v in &seg.args {
        let ty = g.ty(v);
        let shape = ty.static_shape().ok_or_else(|| err(format!("argument {v} has a dynamic shape")))?;
        if let Some(c) = g.const_of(v) {
            if numel(&shape) <= INLINE_CONST_MAX_ELEMENTS as i64 {
                continue;
            }
            if bf16 && ty.dtype == DType::F32 && !quant_params.contains(&v) {
                bf16_args.push(args.len());
                let _ = c;
                arg_types.push((shape, DType::BF16));
                args.push(v);
                continue;
            }
        }
        arg_types.push((shape, ty.dtype));
        args.push(v);
    }
    let mlir_arg_types: Vec<Type> = arg_types.iter().map(|(s, d)| parse_type(ctx, s, *d)).collect::<Result<_, _>>()?;
    let mut result_types = Vec::new();
    for &v in &seg.results {
        let ty = g.ty(v);
        let shape = ty.static_shape().ok_or_else(|| err(format!("result {v} has a dynamic shape")))?;
        result_types.push(parse_type(ctx, &shape, ty.dtype)?);
    }

    let region = Region::new();
    let block = region.append_block(Block::new(&mlir_arg_types.iter().map(|&t| (t, loc)).collect::<Vec<_>>()));
    {
        let mut e = Emitter { ctx, block, loc, bf16, values: HashMap::new() };
        for (i, &v) in args.iter().enumerate() {
            let arg: Value = block.argument(i).map_err(mlir_err)?.into();
            let (shape, d) = arg_types[i].clone();
            let t = T { v: arg, shape, dt: d };
            let t = e.convert(&t, cdt(g.ty(v).dtype))?;
            e.values.insert(v, t);
        }
        for &v in &seg.args {
            if !e.values.contains_key(&v) {
                let c = g.const_of(v).ok_or_else(|| err(format!("argument {v} is neither passed nor constant")))?;
                let t = e.inline_const(g, c)?;
                let t = e.convert(&t, cdt(g.ty(v).dtype))?;
                e.values.insert(v, t);
            }
        }
        let pipeline = spmd.and_then(|s| s.pipeline.as_ref().map(|p| (s, p)));
        for &n in &seg.nodes {
            // A pipeline's blocks are one region, written where they start.
            if let Some((s, p)) = pipeline.filter(|(_, p)| p.span.contains(&n)) {
                if n == p.span[0] {
                    e.lower_pipeline(g, &s.mesh, p).map_err(|mut x| {
                        x.node = Some(n);
                        x
                    })?;
                }
                continue;
            }
            // Constrained operands replace the values for this node only.
            let saved = match spmd {
                Some(spmd) => e.constrain_operands(g, n, spmd)?,
                None => Vec::new(),
            };
            // Shardy only: GSPMD modules get the dense form (XLA partitions it).
            let shardy = spmd.filter(|s| s.dialect == ShardingDialect::Shardy);
            let manual = shardy.and_then(|s| ExpertDispatch::planned(g, n).map(|d| (s, d)));
            let ring = shardy.and_then(|s| RingAttention::planned(g, n, &s.cost_model).map(|r| (s, r)));
            let lowered = match (manual, ring, &g.nodes[n].op) {
                (Some((s, d)), _, _) => e.lower_dispatch(g, &s.mesh, &d),
                (None, Some((s, r)), Op::Attention { scale, .. }) => e.lower_ring(g, &s.mesh, &r, *scale),
                _ => e.lower_node(g, n),
            };
            lowered.map_err(|mut x| {
                x.node = Some(n);
                x
            })?;
            for (v, t) in saved {
                e.values.insert(v, t);
            }
        }
        let mut outs = Vec::new();
        for &v in &seg.results {
            let t = e.get(v)?;
            outs.push(e.convert(&t, g.ty(v).dtype)?.v);
        }
        block
            .append_operation(OperationBuilder::new("func.return", loc).add_operands(&outs).build().map_err(mlir_err)?);
    }
    let fn_type = FunctionType::new(ctx, &mlir_arg_types, &result_types);
    let mut func_attrs: Vec<(Identifier, Attribute)> = vec![
        (Identifier::new(ctx, "sym_name"), StringAttribute::new(ctx, "main").into()),
        (Identifier::new(ctx, "function_type"), TypeAttribute::new(fn_type.into()).into()),
    ];
    let module = Module::new(loc);
    if let Some(spmd) = spmd {
        let annotations = |vs: &[ValueId]| -> Result<Attribute, EmitError> {
            let dicts: Vec<String> = vs.iter().map(|&v| annotation(g, spmd, v)).collect();
            let text = format!("[{}]", dicts.join(", "));
            Attribute::parse(ctx, &text).ok_or_else(|| err(format!("cannot parse sharding annotations {text}")))
        };
        func_attrs.push((Identifier::new(ctx, "arg_attrs"), annotations(&args)?));
        func_attrs.push((Identifier::new(ctx, "res_attrs"), annotations(&seg.results)?));
        if spmd.dialect == ShardingDialect::Shardy {
            let mesh = Attribute::parse(ctx, &shardy_mesh(&spmd.mesh))
                .ok_or_else(|| err(format!("cannot parse {}", shardy_mesh(&spmd.mesh))))?;
            let op = OperationBuilder::new("sdy.mesh", loc)
                .add_attributes(&[
                    (Identifier::new(ctx, "sym_name"), StringAttribute::new(ctx, MESH_SYMBOL).into()),
                    (Identifier::new(ctx, "mesh"), mesh),
                ])
                .build()
                .map_err(mlir_err)?;
            module.body().append_operation(op);
        }
    }
    if spmd.is_none() {
        if let Some(text) = state_aliases(g, seg, &args) {
            let attrs = Attribute::parse(ctx, &text).ok_or_else(|| err(format!("cannot parse {text}")))?;
            func_attrs.push((Identifier::new(ctx, "arg_attrs"), attrs));
        }
    }
    let func = OperationBuilder::new("func.func", loc)
        .add_attributes(&func_attrs)
        .add_regions([region])
        .build()
        .map_err(mlir_err)?;
    module.body().append_operation(func);
    if !module.as_operation().verify() {
        return Err(err("the emitted module does not verify"));
    }
    let mlir = module.as_operation().to_string();
    let partitions = spmd.map_or(1, |s| u32::try_from(s.mesh.size()).unwrap_or(u32::MAX));
    super::verify::verify_collectives(&mlir, super::verify::Devices { replicas: 1, partitions })
        .map_err(|reason| EmitError { fatal: true, ..err(reason) })?;
    Ok(Emitted { mlir, args, bf16_args, results: seg.results.clone() })
}

/// `@main`'s argument attributes aliasing each state's current value to its
/// update (`tf.aliasing_output = <result index>`), when the segment takes
/// the one and returns the other with the same type; `None` when no
/// argument is a state. The executable may then write the update into the
/// argument's buffer when the caller donates it (`pjrt/state.rs` decides).
fn state_aliases(g: &Graph, seg: &Segment, args: &[ValueId]) -> Option<String> {
    // A result takes at most one argument's buffer.
    let mut taken: Vec<usize> = Vec::new();
    let attrs: Vec<String> = args
        .iter()
        .map(|&v| {
            let result = g.states.iter().find_map(|st| {
                let (s, u) = (*g.inputs.get(st.input)?, *g.outputs.get(st.output)?);
                (s == v && g.ty(s) == g.ty(u)).then(|| seg.results.iter().position(|&r| r == u)).flatten()
            });
            match result.filter(|r| !taken.contains(r)) {
                Some(r) => {
                    taken.push(r);
                    format!("{{tf.aliasing_output = {r} : i32}}")
                }
                None => "{}".to_string(),
            }
        })
        .collect();
    (!taken.is_empty()).then(|| format!("[{}]", attrs.join(", ")))
}

/// `{sdy.sharding = …}` or `{mhlo.sharding = "…"}` for `@main` argument or
/// result `v` (partial sums resolved: a boundary is always whole).
fn annotation(g: &Graph, spmd: &SpmdEmit, v: ValueId) -> String {
    let s = g.values[v].attrs.sharding.clone().unwrap_or_else(|| Sharding::replicated(g.ty(v).rank()));
    match spmd.dialect {
        ShardingDialect::Shardy => format!("{{sdy.sharding = {}}}", shardy_sharding(&s)),
        ShardingDialect::Gspmd => format!("{{mhlo.sharding = \"{}\"}}", gspmd_sharding(&spmd.mesh, &s)),
    }
}

/// A tensor inside the segment: its MLIR value with static shape and dtype.
#[derive(Clone)]
struct T<'c, 'a> {
    v: Value<'c, 'a>,
    shape: Vec<i64>,
    dt: DType,
}

struct Emitter<'c, 'a> {
    ctx: &'c Context,
    block: BlockRef<'c, 'a>,
    loc: Location<'c>,
    bf16: bool,
    values: HashMap<ValueId, T<'c, 'a>>,
}

impl<'c, 'a> Emitter<'c, 'a> {
    fn cdt(&self, d: DType) -> DType {
        if self.bf16 && d == DType::F32 {
            DType::BF16
        } else {
            d
        }
    }

    /// The type reductions and softmax accumulate in.
    fn acc(&self, d: DType) -> DType {
        if d == DType::BF16 || d == DType::F16 {
            DType::F32
        } else {
            d
        }
    }

    fn precision(&self) -> &'static str {
        // HIGHEST keeps f32 products exact on TPUs (DEFAULT means bf16 passes
        // there); bf16 mode asks for the fast path on purpose.
        if self.bf16 {
            "[#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]"
        } else {
            "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]"
        }
    }

    /// Emits a sharding constraint for every resharding of an operand of `n`
    /// and makes it the operand's value; returns the values it replaced.
    fn constrain_operands(
        &mut self,
        g: &Graph,
        n: NodeId,
        spmd: &SpmdEmit,
    ) -> Result<Vec<(ValueId, T<'c, 'a>)>, EmitError> {
        let mut saved = Vec::new();
        for r in &spmd.reshards {
            let Use::Operand { node, index } = r.at else { continue };
            if node != n || !r.to.partial.is_empty() {
                continue;
            }
            let Some(&v) = g.nodes[n].inputs.get(index) else { continue };
            if saved.iter().any(|(s, _)| *s == v) {
                continue;
            }
            let t = self.get(v)?;
            let constrained = match spmd.dialect {
                ShardingDialect::Shardy => {
                    let attrs = [("sharding", shardy_sharding(&r.to))];
                    self.op("sdy.sharding_constraint", &[&t], &t.shape, t.dt, &attrs)?
                }
                ShardingDialect::Gspmd => {
                    let attrs = [
                        ("call_target_name", "\"Sharding\"".to_string()),
                        ("mhlo.sharding", format!("\"{}\"", gspmd_sharding(&spmd.mesh, &r.to))),
                    ];
                    self.op("stablehlo.custom_call", &[&t], &t.shape, t.dt, &attrs)?
                }
            };
            self.values.insert(v, constrained);
            saved.push((v, t));
        }
        Ok(saved)
    }

    fn get(&self, v: ValueId) -> Result<T<'c, 'a>, EmitError> {
        self.values.get(&v).cloned().ok_or_else(|| err(format!("value {v} is not available in the segment")))
    }

    fn op(
        &self,
        name: &str,
        operands: &[&T<'c, 'a>],
        shape: &[i64],
        dt: DType,
        attrs: &[(&str, String)],
    ) -> Result<T<'c, 'a>, EmitError> {
        self.op_with_regions(name, operands, shape, dt, attrs, Vec::new())
    }

    fn op_with_regions(
        &self,
        name: &str,
        operands: &[&T<'c, 'a>],
        shape: &[i64],
        dt: DType,
        attrs: &[(&str, String)],
        regions: Vec<Region<'c>>,
    ) -> Result<T<'c, 'a>, EmitError> {
        let ty = parse_type(self.ctx, shape, dt)?;
        let mut attributes = Vec::new();
        for (k, text) in attrs {
            let a =
                Attribute::parse(self.ctx, text).ok_or_else(|| err(format!("cannot parse attribute {k} = {text}")))?;
            attributes.push((Identifier::new(self.ctx, k), a));
        }
        let vals: Vec<Value> = operands.iter().map(|t| t.v).collect();
        let op = OperationBuilder::new(name, self.loc)
            .add_operands(&vals)
            .add_results(&[ty])
            .add_attributes(&attributes)
            .add_regions_vec(regions)
            .build()
            .map_err(mlir_err)?;
        let r = self.block.append_operation(op);
        let v: Value = r.result(0).map_err(mlir_err)?.into();
        Ok(T { v, shape: shape.to_vec(), dt })
    }

    fn lower_node(&mut self, g: &Graph, n: NodeId) -> Result<(), EmitError> {
        let node = &g.nodes[n];
        if matches!(node.op, Op::While { .. }) {
            return self.lower_while(g, n);
        }
        let ins: Vec<T<'c, 'a>> = node.inputs.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        let &[out] = node.outputs.as_slice() else { return Err(err("nodes with several outputs are not lowered")) };
        let out_ty = g.ty(out);
        let out_shape = out_ty.static_shape().ok_or_else(|| err("dynamic output shape"))?;
        let out_dt = self.cdt(out_ty.dtype);
        let x = ins.first().cloned();
        let x0 = || x.clone().ok_or_else(|| err("missing operand"));
        let r = match &node.op {
            // 16-bit floats are computed in f32 and rounded once, as PyTorch
            // does: composite formulations (erf, gelu, asinh, …) would
            // otherwise round after every step.
            Op::Unary(u) => {
                let xv = x0()?;
                let y = self.lower_unary(*u, &self.convert(&xv, self.acc(xv.dt))?)?;
                self.convert(&y, if y.dt == DType::Bool { DType::Bool } else { out_dt })?
            }
            Op::Binary(b) => {
                let (xv, yv) = (x0()?, ins.get(1).ok_or_else(|| err("missing operand"))?);
                let z =
                    self.lower_binary(*b, &self.convert(&xv, self.acc(xv.dt))?, &self.convert(yv, self.acc(yv.dt))?)?;
                self.convert(&z, out_dt)?
            }
            Op::Where => self.select(&ins[0], &ins[1], &ins[2])?,
            Op::Cast { .. } => self.convert(&x0()?, out_dt)?,
            Op::Clamp { min, max } => {
                let mut y = x0()?;
                if let Some(lo) = min {
                    y = self.binary("maximum", &y, &self.scalar(*lo, y.dt)?)?;
                }
                if let Some(hi) = max {
                    y = self.binary("minimum", &y, &self.scalar(*hi, y.dt)?)?;
                }
                y
            }
            Op::MatMul => self.matmul(&ins[0], &ins[1], &out_shape)?,
            Op::Linear => {
                let (xv, w) = (&ins[0], &ins[1]);
                let r = xv.shape.len() as i64;
                let mut y = self.dot(xv, w, &[], &[], &[r - 1], &[1])?;
                if let Some(b) = ins.get(2) {
                    y = self.binary("add", &y, &self.convert(b, y.dt)?)?;
                }
                self.convert(&y, out_dt)?
            }
            Op::GroupedMatMul => self.grouped_matmul(&ins[0], &ins[1], &ins[2], out_dt)?,
            Op::QuantLinear { bits, zero_points, dynamic, asymmetric, act_scale, act_zero_point, .. } => {
                let acts = quant::QuantActs::of(*dynamic, *asymmetric, *act_scale, *act_zero_point);
                let zp_index = 3;
                let args = quant::QuantLinearArgs {
                    x: ins[0].clone(),
                    w: ins[1].clone(),
                    scales: ins[2].clone(),
                    zero_points: zero_points.then(|| ins[zp_index].clone()),
                    bias: ins.get(zp_index + usize::from(*zero_points)).cloned(),
                    bits: *bits,
                    acts,
                    row_params: None,
                };
                self.convert(&self.quant_linear(&args, &out_shape)?, out_dt)?
            }
            Op::Conv { stride, padding, dilation, groups } => {
                self.conv(&ins, stride, padding, dilation, *groups, &out_shape, out_dt)?
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
            } => {
                // Epilogues, layouts and i8 activations between layers are
                // the CPU target's.
                let fused = epilogue.activation.is_some() || epilogue.residual != kiln_ir::Residual::None;
                if out_quant.is_some() || res_quant.is_some() || ins[0].dt != kiln_ir::DType::F32 {
                    return Err(err("a quantized convolution's i8 activations (CPU only) in a segment"));
                }
                if fused || *layout != kiln_ir::Layout::ChannelsFirst {
                    return Err(err("a quantized convolution's fused epilogue (CPU only) in a segment"));
                }
                let acts = quant::QuantActs::of(*dynamic, *asymmetric, *act_scale, *act_zero_point);
                let args = quant::QuantConvArgs {
                    x: ins[0].clone(),
                    w: ins[1].clone(),
                    scales: ins[2].clone(),
                    bias: ins.get(3).cloned().filter(|_| epilogue.bias),
                    stride,
                    padding,
                    dilation,
                    groups: *groups,
                    acts,
                };
                self.convert(&self.quant_conv(&args, &out_shape)?, out_dt)?
            }
            Op::BatchNorm { eps } => {
                let xv = self.convert(&ins[0], self.acc(ins[0].dt))?;
                let p = |i: usize| -> Result<T<'c, 'a>, EmitError> {
                    self.bcast_dims(&self.convert(&ins[i], xv.dt)?, &xv.shape, &[1])
                };
                let inv = self.unary("rsqrt", &self.binary("add", &p(2)?, &self.scalar(*eps, xv.dt)?)?)?;
                let y = self.binary("multiply", &self.binary("subtract", &xv, &p(1)?)?, &inv)?;
                let y = self.binary("add", &self.binary("multiply", &y, &p(3)?)?, &p(4)?)?;
                self.convert(&y, out_dt)?
            }
            Op::LayerNorm { normalized_rank, eps } => {
                let xv = self.convert(&ins[0], self.acc(ins[0].dt))?;
                let r = xv.shape.len();
                let axes: Vec<usize> = (r.saturating_sub(*normalized_rank)..r).collect();
                let count: i64 = axes.iter().map(|&a| xv.shape[a]).product();
                let cnt = self.scalar(count as f64, xv.dt)?;
                let mean = self.binary("divide", &self.reduce(&xv, &axes, ReduceKind::Sum)?, &cnt)?;
                let c = self.binary("subtract", &xv, &self.unreduce(&mean, &xv.shape, &axes)?)?;
                let var = self.binary(
                    "divide",
                    &self.reduce(&self.binary("multiply", &c, &c)?, &axes, ReduceKind::Sum)?,
                    &cnt,
                )?;
                let inv = self.unary("rsqrt", &self.binary("add", &var, &self.scalar(*eps, xv.dt)?)?)?;
                let mut y = self.binary("multiply", &c, &self.unreduce(&inv, &xv.shape, &axes)?)?;
                if let Some(w) = ins.get(1) {
                    y = self.binary("multiply", &y, &self.convert(w, y.dt)?)?;
                }
                if let Some(b) = ins.get(2) {
                    y = self.binary("add", &y, &self.convert(b, y.dt)?)?;
                }
                self.convert(&y, out_dt)?
            }
            Op::Softmax { axis } => self.softmax(&x0()?, *axis, false)?,
            Op::LogSoftmax { axis } => self.softmax(&x0()?, *axis, true)?,
            Op::Reduce { kind, axes, .. } => {
                let xv = x0()?;
                let work = match kind {
                    ReduceKind::Sum | ReduceKind::Mean | ReduceKind::Prod => self.convert(&xv, self.acc(xv.dt))?,
                    _ => xv.clone(),
                };
                let mut y = self.reduce(&work, axes, *kind)?;
                if *kind == ReduceKind::Mean {
                    let count: i64 = axes.iter().map(|&a| xv.shape.get(a).copied().unwrap_or(1)).product();
                    y = self.binary("divide", &y, &self.scalar(count as f64, y.dt)?)?;
                }
                let y = self.convert(&y, out_dt)?;
                self.reshape(&y, &out_shape)?
            }
            Op::ArgMax { axis, .. } => {
                let xv = x0()?;
                let xv = if xv.dt == DType::Bool { self.convert(&xv, DType::U8)? } else { xv };
                let m = self.unreduce(&self.reduce(&xv, &[*axis], ReduceKind::Max)?, &xv.shape, &[*axis])?;
                let hit = self.compare("EQ", &xv, &m)?;
                let iota = self.op(
                    "stablehlo.iota",
                    &[],
                    &xv.shape,
                    DType::I64,
                    &[("iota_dimension", format!("{axis} : i64"))],
                )?;
                let big = self.op(
                    "stablehlo.constant",
                    &[],
                    &[],
                    DType::I64,
                    &[("value", format!("dense<{}> : tensor<i64>", i64::MAX))],
                )?;
                let idx = self.select(&hit, &iota, &big)?;
                let first = self.reduce(&idx, &[*axis], ReduceKind::Min)?;
                let first = self.convert(&first, out_dt)?;
                self.reshape(&first, &out_shape)?
            }
            Op::ArgMin { axis, .. } => {
                let xv = x0()?;
                let xv = if xv.dt == DType::Bool { self.convert(&xv, DType::U8)? } else { xv };
                let m = self.unreduce(&self.reduce(&xv, &[*axis], ReduceKind::Min)?, &xv.shape, &[*axis])?;
                let hit = self.compare("EQ", &xv, &m)?;
                let iota = self.op(
                    "stablehlo.iota",
                    &[],
                    &xv.shape,
                    DType::I64,
                    &[("iota_dimension", format!("{axis} : i64"))],
                )?;
                let big = self.op(
                    "stablehlo.constant",
                    &[],
                    &[],
                    DType::I64,
                    &[("value", format!("dense<{}> : tensor<i64>", i64::MAX))],
                )?;
                let first = self.reduce(&self.select(&hit, &iota, &big)?, &[*axis], ReduceKind::Min)?;
                self.reshape(&self.convert(&first, out_dt)?, &out_shape)?
            }
            Op::CumSum { axis } => {
                // A window spanning the axis, padded in front: output i sums
                // elements 0..=i.
                let xv = x0()?;
                let xa = self.convert(&xv, self.acc(xv.dt))?;
                let r = xv.shape.len();
                let n = *xv.shape.get(*axis).ok_or_else(|| err("cumsum axis out of range"))?;
                let mut win = vec![1; r];
                win[*axis] = n;
                let rows: Vec<String> =
                    (0..r).map(|d| if d == *axis { format!("[{}, 0]", n - 1) } else { "[0, 0]".into() }).collect();
                let init = self.scalar(0.0, xa.dt)?;
                let region = self.reducer("add", xa.dt)?;
                let y = self.op_with_regions(
                    "stablehlo.reduce_window",
                    &[&xa, &init],
                    &xv.shape,
                    xa.dt,
                    &[
                        ("window_dimensions", arr(&win)),
                        ("window_strides", arr(&vec![1; r])),
                        ("padding", format!("dense<[{}]> : tensor<{r}x2xi64>", rows.join(", "))),
                    ],
                    vec![region],
                )?;
                self.convert(&y, out_dt)?
            }
            Op::Flip { axes } => {
                let xv = x0()?;
                let dims: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
                self.op("stablehlo.reverse", &[&xv], &out_shape, xv.dt, &[("dimensions", arr(&dims))])?
            }
            Op::Pad { lo, hi, interior, mode: kiln_ir::PadMode::Constant, value } => {
                let xv = x0()?;
                let pv = self.scalar(*value, xv.dt)?;
                self.op(
                    "stablehlo.pad",
                    &[&xv, &pv],
                    &out_shape,
                    xv.dt,
                    &[
                        ("edge_padding_low", arr(lo)),
                        ("edge_padding_high", arr(hi)),
                        ("interior_padding", arr(interior)),
                    ],
                )?
            }
            Op::Pool { kind, kernel, stride, padding, dilation, count_include_pad, divisor, layout, .. } => {
                if *layout != kiln_ir::Layout::ChannelsFirst {
                    return Err(err("a channels-last pool (the CPU target's layout) in a segment"));
                }
                let divide = match divisor {
                    Some(d) => Divisor::Fixed(*d),
                    None => Divisor::Taps { count_include_pad: *count_include_pad },
                };
                self.pool(&x0()?, *kind, kernel, stride, padding, dilation, divide, &out_shape, out_dt)?
            }
            Op::Attention { causal, scale } => self.attention(&ins, *causal, *scale, out_dt)?,
            Op::Reshape { .. } => self.reshape(&x0()?, &out_shape)?,
            Op::Expand { .. } => self.bcast(&x0()?, &out_shape)?,
            Op::Permute { perm } => self.transpose(&x0()?, &perm.iter().map(|&p| p as i64).collect::<Vec<_>>())?,
            Op::Slice { axis, start, step, .. } => {
                let xv = x0()?;
                let dim = *xv.shape.get(*axis).ok_or_else(|| err("slice axis out of range"))?;
                let start = if *start < 0 { (*start + dim).max(0) } else { (*start).min(dim) };
                let len = out_shape[*axis];
                let mut starts = vec![0; xv.shape.len()];
                let mut limits = xv.shape.clone();
                let mut strides = vec![1; xv.shape.len()];
                starts[*axis] = start;
                limits[*axis] = if len > 0 { start + (len - 1) * step + 1 } else { start };
                strides[*axis] = *step;
                if limits[*axis] > dim {
                    return Err(err("slice reaches past the end of its input"));
                }
                self.op(
                    "stablehlo.slice",
                    &[&xv],
                    &out_shape,
                    xv.dt,
                    &[("start_indices", arr(&starts)), ("limit_indices", arr(&limits)), ("strides", arr(&strides))],
                )?
            }
            Op::Concat { axis } => {
                let refs: Vec<&T<'c, 'a>> = ins.iter().collect();
                self.op("stablehlo.concatenate", &refs, &out_shape, out_dt, &[("dimension", format!("{axis} : i64"))])?
            }
            Op::Gather { axis } => {
                let data = &ins[0];
                // As the CPU kernel: negative indices count from the end.
                let dim = *data.shape.get(*axis).ok_or_else(|| err("gather axis out of range"))?;
                let idx = &self.wrap_index(&ins[1], dim)?;
                let (rd, ri) = (data.shape.len() as i64, idx.shape.len() as i64);
                let a = *axis as i64;
                let offset: Vec<i64> = (0..a).chain(a + ri..rd + ri - 1).collect();
                let mut sizes = data.shape.clone();
                sizes[*axis] = 1;
                let mut dn = Vec::new();
                if !offset.is_empty() {
                    dn.push(format!("offset_dims = {}", list(&offset)));
                }
                dn.push(format!("collapsed_slice_dims = [{a}]"));
                dn.push(format!("start_index_map = [{a}]"));
                dn.push(format!("index_vector_dim = {ri}"));
                self.op(
                    "stablehlo.gather",
                    &[data, idx],
                    &out_shape,
                    data.dt,
                    &[
                        ("dimension_numbers", format!("#stablehlo.gather<{}>", dn.join(", "))),
                        ("slice_sizes", arr(&sizes)),
                        ("indices_are_sorted", "false".into()),
                    ],
                )?
            }
            Op::Sort { axis, descending, indices, .. } => {
                self.sort(&x0()?, *axis, *descending, *indices, &out_shape)?
            }
            Op::ScatterElements { axis, reduce, include_self } => {
                self.scatter_elements(&ins[0], &ins[1], &ins[2], *axis, *reduce, *include_self)?
            }
            Op::IndexGather { axis } => self.index_gather(&ins[0], &ins[1..], *axis, &out_shape)?,
            Op::IndexPut { axis, accumulate } => {
                let values = ins.get(1).ok_or_else(|| err("index_put without values"))?;
                self.index_put(&ins[0], values, &ins[2..], *axis, *accumulate)?
            }
            Op::GatherElements { axis } => self.gather_elements(&ins[0], &ins[1], *axis, &out_shape)?,
            Op::Full { value, .. } => self.splat(*value, &out_shape, out_dt)?,
            Op::Arange { start, step, .. } => {
                let iota =
                    self.op("stablehlo.iota", &[], &out_shape, out_dt, &[("iota_dimension", "0 : i64".into())])?;
                let y = self.binary("multiply", &iota, &self.scalar(*step, out_dt)?)?;
                self.binary("add", &y, &self.scalar(*start, out_dt)?)?
            }
            #[allow(unreachable_patterns)]
            op => return Err(err(format!("no StableHLO lowering for {}", op.name()))),
        };
        if r.shape != out_shape || r.dt != out_dt {
            return Err(err(format!(
                "lowering produced {:?} {:?}, expected {:?} {:?}",
                r.dt, r.shape, out_dt, out_shape
            )));
        }
        self.values.insert(out, r);
        Ok(())
    }
}
