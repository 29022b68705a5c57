//! StableHLO emission: one segment → one `func.func @main` as MLIR text.
//!
//! MLIR 19 has no StableHLO dialect, so ops are built with `OperationBuilder`
//! in a context that allows unregistered dialects and are printed in generic
//! form; only `func` is a registered dialect. Attribute text is opaque to
//! MLIR here (any spelling parses), so every form below was checked by
//! compiling and running it on the XLA CPU PJRT plugin (tests
//! `compiler/tests/stablehlo_*.rs`).
//!
//! Composites (linear, norms, softmax, attention, pooling) are built from
//! primitives; XLA fuses them again. With [`Precision::Bf16`], f32 values
//! inside a segment are carried as bf16, matrix products and convolutions
//! accumulate in f32 (their result type is f32, XLA's preferred element
//! type), and reductions (sums, means, norms, softmax) run in f32; segment
//! arguments and results keep their f32 type at the boundary except large
//! weights, which the compiler converts to bf16 ahead of time.

use super::partition::Segment;
use super::Precision;
use kiln_ir::{BinaryOp, ConstData, DType, Graph, NodeId, Op, PoolKind, ReduceKind, UnaryOp, ValueId};
use melior::dialect::DialectHandle;
use melior::ir::attribute::{StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::FunctionType;
use melior::ir::RegionLike;
use melior::ir::{Attribute, Block, BlockRef, Identifier, Location, Module, Region, Type, Value};
use melior::Context;
use std::collections::HashMap;

/// Constants with at most this many elements are written into the program
/// (`dense<…>`); larger ones are passed as arguments so that weights stay in
/// the artifact's weights section and are uploaded once per session.
pub const INLINE_CONST_MAX_ELEMENTS: usize = 64;

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
}

fn err(reason: impl Into<String>) -> EmitError {
    EmitError { node: None, reason: reason.into() }
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
    let loc = Location::unknown(ctx);
    let bf16 = precision == Precision::Bf16;
    let cdt = |d: DType| if bf16 && d == DType::F32 { DType::BF16 } else { d };

    // Arguments: every input value, except small constants written inline.
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
            if bf16 && ty.dtype == DType::F32 {
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
        for &n in &seg.nodes {
            e.lower_node(g, n).map_err(|mut x| {
                x.node = Some(n);
                x
            })?;
        }
        let mut outs = Vec::new();
        for &v in &seg.results {
            let t = e.get(v)?;
            outs.push(e.convert(&t, g.ty(v).dtype)?.v);
        }
        block.append_operation(OperationBuilder::new("func.return", loc).add_operands(&outs).build().map_err(mlir_err)?);
    }
    let fn_type = FunctionType::new(ctx, &mlir_arg_types, &result_types);
    let func = OperationBuilder::new("func.func", loc)
        .add_attributes(&[
            (Identifier::new(ctx, "sym_name"), StringAttribute::new(ctx, "main").into()),
            (Identifier::new(ctx, "function_type"), TypeAttribute::new(fn_type.into()).into()),
        ])
        .add_regions([region])
        .build()
        .map_err(mlir_err)?;
    let module = Module::new(loc);
    module.body().append_operation(func);
    if !module.as_operation().verify() {
        return Err(err("the emitted module does not verify"));
    }
    Ok(Emitted { mlir: module.as_operation().to_string(), args, bf16_args, results: seg.results.clone() })
}

fn numel(shape: &[i64]) -> i64 {
    shape.iter().product()
}

fn elem(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I8 => "i8",
        DType::U8 => "ui8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "i1",
    }
}

fn type_text(shape: &[i64], d: DType) -> String {
    let mut s = String::from("tensor<");
    for x in shape {
        s.push_str(&format!("{x}x"));
    }
    s.push_str(elem(d));
    s.push('>');
    s
}

fn parse_type<'c>(ctx: &'c Context, shape: &[i64], d: DType) -> Result<Type<'c>, EmitError> {
    let text = type_text(shape, d);
    Type::parse(ctx, &text).ok_or_else(|| err(format!("cannot parse type {text}")))
}

fn arr(v: &[i64]) -> String {
    if v.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", join(v))
    }
}

fn join(v: &[i64]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

fn list(v: &[i64]) -> String {
    format!("[{}]", join(v))
}

/// A scalar literal of dtype `d` as MLIR dense-element text.
fn literal(value: f64, d: DType) -> String {
    match d {
        DType::Bool => (if value != 0.0 { "true" } else { "false" }).into(),
        DType::U8 => format!("{}", value.clamp(0.0, 255.0) as u8),
        d if d.is_int() => format!("{}", value as i64),
        d if value.is_finite() => match d {
            DType::F64 => format!("{value:.17e}"),
            _ => format!("{:.9e}", value),
        },
        d => {
            // MLIR has no inf/nan literal; hex bit patterns of the element type.
            let (inf, nan): (u64, u64) = match d {
                DType::F64 => (0x7FF0_0000_0000_0000, 0x7FF8_0000_0000_0000),
                DType::F16 => (0x7C00, 0x7E00),
                DType::BF16 => (0x7F80, 0x7FC0),
                _ => (0x7F80_0000, 0x7FC0_0000),
            };
            let sign: u64 = match d {
                DType::F64 => 1 << 63,
                DType::F16 | DType::BF16 => 1 << 15,
                _ => 1 << 31,
            };
            let bits = if value.is_nan() {
                nan
            } else if value > 0.0 {
                inf
            } else {
                inf | sign
            };
            format!("0x{bits:X}")
        }
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

/// Dimension numbers of `stablehlo.dot_general`, empty lists omitted.
fn dot_dims(lb: &[i64], rb: &[i64], lc: &[i64], rc: &[i64]) -> String {
    let mut parts = Vec::new();
    if !lb.is_empty() {
        parts.push(format!("lhs_batching_dimensions = {}", list(lb)));
        parts.push(format!("rhs_batching_dimensions = {}", list(rb)));
    }
    parts.push(format!("lhs_contracting_dimensions = {}", list(lc)));
    parts.push(format!("rhs_contracting_dimensions = {}", list(rc)));
    format!("#stablehlo.dot<{}>", parts.join(", "))
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

    fn get(&self, v: ValueId) -> Result<T<'c, 'a>, EmitError> {
        self.values.get(&v).cloned().ok_or_else(|| err(format!("value {v} is not available in the segment")))
    }

    fn op(&self, name: &str, operands: &[&T<'c, 'a>], shape: &[i64], dt: DType, attrs: &[(&str, String)]) -> Result<T<'c, 'a>, EmitError> {
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
            let a = Attribute::parse(self.ctx, text).ok_or_else(|| err(format!("cannot parse attribute {k} = {text}")))?;
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

    fn unary(&self, name: &str, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        self.op(&format!("stablehlo.{name}"), &[x], &x.shape.clone(), x.dt, &[])
    }

    /// Elementwise binary op; operands are broadcast to a common shape.
    fn binary(&self, name: &str, a: &T<'c, 'a>, b: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| err(format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape)))?;
        let (a, b) = (self.bcast(a, &shape)?, self.bcast(b, &shape)?);
        self.op(&format!("stablehlo.{name}"), &[&a, &b], &shape, a.dt, &[])
    }

    fn compare(&self, dir: &str, a: &T<'c, 'a>, b: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| err("compare operands do not broadcast"))?;
        let (a, b) = (self.bcast(a, &shape)?, self.bcast(b, &shape)?);
        let kind = match a.dt {
            d if d.is_float() => "FLOAT",
            DType::U8 | DType::Bool => "UNSIGNED",
            _ => "SIGNED",
        };
        self.op(
            "stablehlo.compare",
            &[&a, &b],
            &shape,
            DType::Bool,
            &[
                ("comparison_direction", format!("#stablehlo<comparison_direction {dir}>")),
                ("compare_type", format!("#stablehlo<comparison_type {kind}>")),
            ],
        )
    }

    fn select(&self, c: &T<'c, 'a>, a: &T<'c, 'a>, b: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let shape = broadcast_shapes(&c.shape, &broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| err("select operands do not broadcast"))?)
            .ok_or_else(|| err("select operands do not broadcast"))?;
        let (c, a, b) = (self.bcast(c, &shape)?, self.bcast(a, &shape)?, self.bcast(b, &shape)?);
        self.op("stablehlo.select", &[&c, &a, &b], &shape, a.dt, &[])
    }

    /// A constant splat of `shape`.
    fn splat(&self, value: f64, shape: &[i64], dt: DType) -> Result<T<'c, 'a>, EmitError> {
        let text = format!("dense<{}> : {}", literal(value, dt), type_text(shape, dt));
        self.op("stablehlo.constant", &[], shape, dt, &[("value", text)])
    }

    fn scalar(&self, value: f64, dt: DType) -> Result<T<'c, 'a>, EmitError> {
        self.splat(value, &[], dt)
    }

    /// A graph constant written into the program.
    fn inline_const(&self, g: &Graph, c: &ConstData) -> Result<T<'c, 'a>, EmitError> {
        let ty = g.ty(c.value);
        let shape = ty.static_shape().ok_or_else(|| err("constant with a dynamic shape"))?;
        let bytes = c.bytes.as_bytes();
        if ty.dtype == DType::Bool {
            // Hex data for i1 is bit-packed in MLIR; spell booleans out and reshape.
            let items: Vec<&str> = bytes.iter().map(|&b| if b != 0 { "true" } else { "false" }).collect();
            let flat = [items.len() as i64];
            let text = format!("dense<[{}]> : {}", items.join(", "), type_text(&flat, DType::Bool));
            let t = self.op("stablehlo.constant", &[], &flat, DType::Bool, &[("value", text)])?;
            return self.reshape(&t, &shape);
        }
        if bytes.len() as i64 != numel(&shape) * ty.dtype.size_bytes() as i64 {
            return Err(err(format!("constant {} has {} bytes for shape {shape:?}", c.value, bytes.len())));
        }
        if bytes.is_empty() {
            return self.splat(0.0, &shape, ty.dtype);
        }
        let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
        let text = format!("dense<\"0x{hex}\"> : {}", type_text(&shape, ty.dtype));
        self.op("stablehlo.constant", &[], &shape, ty.dtype, &[("value", text)])
    }

    fn convert(&self, x: &T<'c, 'a>, to: DType) -> Result<T<'c, 'a>, EmitError> {
        if x.dt == to {
            return Ok(x.clone());
        }
        self.op("stablehlo.convert", &[x], &x.shape.clone(), to, &[])
    }

    fn reshape(&self, x: &T<'c, 'a>, shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        if x.shape == shape {
            return Ok(x.clone());
        }
        if numel(&x.shape) != numel(shape) {
            return Err(err(format!("reshape {:?} -> {shape:?} changes the element count", x.shape)));
        }
        self.op("stablehlo.reshape", &[x], shape, x.dt, &[])
    }

    /// Numpy-style broadcast (right-aligned) of `x` to `shape`.
    fn bcast(&self, x: &T<'c, 'a>, shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        if x.shape == shape {
            return Ok(x.clone());
        }
        let r = shape.len();
        if x.shape.len() > r {
            return Err(err(format!("cannot broadcast {:?} to {shape:?}", x.shape)));
        }
        let dims: Vec<i64> = (r - x.shape.len()..r).map(|d| d as i64).collect();
        self.bcast_dims(x, shape, &dims)
    }

    /// `broadcast_in_dim`: operand dim `i` becomes result dim `dims[i]`.
    fn bcast_dims(&self, x: &T<'c, 'a>, shape: &[i64], dims: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        for (i, &d) in dims.iter().enumerate() {
            let ok = d >= 0 && (d as usize) < shape.len() && (x.shape[i] == 1 || x.shape[i] == shape[d as usize]);
            if !ok {
                return Err(err(format!("cannot broadcast {:?} to {shape:?} along {dims:?}", x.shape)));
            }
        }
        self.op("stablehlo.broadcast_in_dim", &[x], shape, x.dt, &[("broadcast_dimensions", arr(dims))])
    }

    fn transpose(&self, x: &T<'c, 'a>, perm: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let shape: Vec<i64> = perm.iter().map(|&p| x.shape.get(p as usize).copied().unwrap_or(0)).collect();
        self.op("stablehlo.transpose", &[x], &shape, x.dt, &[("permutation", arr(perm))])
    }

    /// A reduction body: `(a, b) -> a op b` on scalars of `dt`.
    fn reducer(&self, op: &str, dt: DType) -> Result<Region<'c>, EmitError> {
        let st = parse_type(self.ctx, &[], dt)?;
        let region = Region::new();
        let b = region.append_block(Block::new(&[(st, self.loc), (st, self.loc)]));
        let x: Value = b.argument(0).map_err(mlir_err)?.into();
        let y: Value = b.argument(1).map_err(mlir_err)?.into();
        let r = b.append_operation(
            OperationBuilder::new(&format!("stablehlo.{op}"), self.loc).add_operands(&[x, y]).add_results(&[st]).build().map_err(mlir_err)?,
        );
        let rv: Value = r.result(0).map_err(mlir_err)?.into();
        b.append_operation(OperationBuilder::new("stablehlo.return", self.loc).add_operands(&[rv]).build().map_err(mlir_err)?);
        Ok(region)
    }

    /// Identity element and body op of a reduction over `dt`.
    fn reduce_parts(kind: ReduceKind, dt: DType) -> (f64, &'static str) {
        let (lo, hi) = match dt {
            DType::I8 => (i8::MIN as f64, i8::MAX as f64),
            DType::U8 => (0.0, 255.0),
            DType::I16 => (i16::MIN as f64, i16::MAX as f64),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            DType::I64 => (i64::MIN as f64, i64::MAX as f64),
            _ => (f64::NEG_INFINITY, f64::INFINITY),
        };
        match kind {
            // On bool, max is `any` and min is `all`.
            ReduceKind::Max if dt == DType::Bool => (0.0, "or"),
            ReduceKind::Min if dt == DType::Bool => (1.0, "and"),
            ReduceKind::Sum | ReduceKind::Mean => (0.0, "add"),
            ReduceKind::Prod => (1.0, "multiply"),
            ReduceKind::Max => (lo, "maximum"),
            ReduceKind::Min => (hi, "minimum"),
        }
    }

    /// Reduces `axes` away (no mean division).
    fn reduce(&self, x: &T<'c, 'a>, axes: &[usize], kind: ReduceKind) -> Result<T<'c, 'a>, EmitError> {
        let (init, body) = Self::reduce_parts(kind, x.dt);
        let init_t = if x.dt == DType::I64 && init.abs() > 9.0e18 {
            // f64 cannot hold i64::MIN/MAX exactly; spell them directly.
            let text = format!("dense<{}> : tensor<i64>", if init < 0.0 { i64::MIN } else { i64::MAX });
            self.op("stablehlo.constant", &[], &[], DType::I64, &[("value", text)])?
        } else {
            self.scalar(init, x.dt)?
        };
        let shape: Vec<i64> = x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        let dims: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let region = self.reducer(body, x.dt)?;
        self.op_with_regions("stablehlo.reduce", &[x, &init_t], &shape, x.dt, &[("dimensions", arr(&dims))], vec![region])
    }

    /// Broadcasts a reduced tensor back over the `axes` it lost.
    fn unreduce(&self, r: &T<'c, 'a>, shape: &[i64], axes: &[usize]) -> Result<T<'c, 'a>, EmitError> {
        let dims: Vec<i64> = (0..shape.len()).filter(|i| !axes.contains(i)).map(|i| i as i64).collect();
        self.bcast_dims(r, shape, &dims)
    }

    fn softmax(&self, x: &T<'c, 'a>, axis: usize, log: bool) -> Result<T<'c, 'a>, EmitError> {
        let out_dt = x.dt;
        let x = self.convert(x, self.acc(x.dt))?;
        let m = self.reduce(&x, &[axis], ReduceKind::Max)?;
        let d = self.binary("subtract", &x, &self.unreduce(&m, &x.shape, &[axis])?)?;
        let ex = self.unary("exponential", &d)?;
        let s = self.unreduce(&self.reduce(&ex, &[axis], ReduceKind::Sum)?, &x.shape, &[axis])?;
        let y = if log { self.binary("subtract", &d, &self.unary("log", &s)?)? } else { self.binary("divide", &ex, &s)? };
        self.convert(&y, out_dt)
    }

    /// `dot_general`; accumulates (and returns) f32 for 16-bit float operands.
    fn dot(&self, a: &T<'c, 'a>, b: &T<'c, 'a>, lb: &[i64], rb: &[i64], lc: &[i64], rc: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let mut shape: Vec<i64> = lb.iter().map(|&d| a.shape[d as usize]).collect();
        let free = |t: &T, batch: &[i64], contract: &[i64]| -> Vec<i64> {
            (0..t.shape.len() as i64).filter(|d| !batch.contains(d) && !contract.contains(d)).map(|d| t.shape[d as usize]).collect()
        };
        shape.extend(free(a, lb, lc));
        shape.extend(free(b, rb, rc));
        self.op(
            "stablehlo.dot_general",
            &[a, b],
            &shape,
            self.acc(a.dt),
            &[("dot_dimension_numbers", dot_dims(lb, rb, lc, rc)), ("precision_config", self.precision().into())],
        )
    }

    fn matmul(&self, a: &T<'c, 'a>, b: &T<'c, 'a>, out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let out_dt = a.dt;
        let a = if a.shape.len() == 1 { self.reshape(a, &[1, a.shape[0]])? } else { a.clone() };
        let b = if b.shape.len() == 1 { self.reshape(b, &[b.shape[0], 1])? } else { b.clone() };
        let (ra, rb) = (a.shape.len(), b.shape.len());
        let r = if rb == 2 {
            self.dot(&a, &b, &[], &[], &[ra as i64 - 1], &[0])?
        } else {
            let batch = broadcast_shapes(&a.shape[..ra - 2], &b.shape[..rb - 2]).ok_or_else(|| err("matmul batch dims do not broadcast"))?;
            let nb = batch.len() as i64;
            let mut sa = batch.clone();
            sa.extend_from_slice(&a.shape[ra - 2..]);
            let mut sb = batch.clone();
            sb.extend_from_slice(&b.shape[rb - 2..]);
            let (a, b) = (self.bcast(&a, &sa)?, self.bcast(&b, &sb)?);
            let bd: Vec<i64> = (0..nb).collect();
            self.dot(&a, &b, &bd, &bd, &[nb + 1], &[nb])?
        };
        let r = self.reshape(&r, out_shape)?;
        self.convert(&r, out_dt)
    }

    fn erf(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): StableHLO has no erf
        // and chlo.erf is not available to this emitter.
        let dt = x.dt;
        let c = |v: f64| self.scalar(v, dt);
        let ax = self.unary("abs", x)?;
        let t = self.binary("divide", &c(1.0)?, &self.binary("add", &c(1.0)?, &self.binary("multiply", &c(0.327_591_1)?, &ax)?)?)?;
        let coeffs = [1.061_405_429, -1.453_152_027, 1.421_413_741, -0.284_496_736, 0.254_829_592];
        let mut poly = c(coeffs[0])?;
        for &k in &coeffs[1..] {
            poly = self.binary("add", &self.binary("multiply", &poly, &t)?, &c(k)?)?;
        }
        poly = self.binary("multiply", &poly, &t)?;
        let e = self.unary("exponential", &self.unary("negate", &self.binary("multiply", &ax, &ax)?)?)?;
        let y = self.binary("subtract", &c(1.0)?, &self.binary("multiply", &poly, &e)?)?;
        self.binary("multiply", &self.unary("sign", x)?, &y)
    }

    fn lower_unary(&self, u: UnaryOp, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let dt = x.dt;
        let c = |v: f64| self.scalar(v, dt);
        if dt.is_int() && matches!(u, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc) {
            // Integers are already whole.
            return Ok(x.clone());
        }
        Ok(match u {
            UnaryOp::Neg => self.unary("negate", x)?,
            UnaryOp::Abs => self.unary("abs", x)?,
            UnaryOp::Exp => self.unary("exponential", x)?,
            UnaryOp::Log => self.unary("log", x)?,
            UnaryOp::Sqrt => self.unary("sqrt", x)?,
            UnaryOp::Rsqrt => self.unary("rsqrt", x)?,
            UnaryOp::Reciprocal => self.binary("divide", &c(1.0)?, x)?,
            UnaryOp::Relu => self.binary("maximum", x, &c(0.0)?)?,
            UnaryOp::Sigmoid => self.unary("logistic", x)?,
            UnaryOp::Tanh => self.unary("tanh", x)?,
            UnaryOp::Silu => self.binary("multiply", x, &self.unary("logistic", x)?)?,
            UnaryOp::Erf => self.erf(x)?,
            UnaryOp::Gelu => {
                let e = self.erf(&self.binary("multiply", x, &c(std::f64::consts::FRAC_1_SQRT_2)?)?)?;
                let half_x = self.binary("multiply", x, &c(0.5)?)?;
                self.binary("multiply", &half_x, &self.binary("add", &c(1.0)?, &e)?)?
            }
            UnaryOp::GeluTanh => {
                let x3 = self.binary("multiply", &self.binary("multiply", x, x)?, x)?;
                let inner = self.binary("add", x, &self.binary("multiply", &c(0.044_715)?, &x3)?)?;
                let k = (2.0 / std::f64::consts::PI).sqrt();
                let th = self.unary("tanh", &self.binary("multiply", &c(k)?, &inner)?)?;
                let half_x = self.binary("multiply", x, &c(0.5)?)?;
                self.binary("multiply", &half_x, &self.binary("add", &c(1.0)?, &th)?)?
            }
            UnaryOp::Sin => self.unary("sine", x)?,
            UnaryOp::Cos => self.unary("cosine", x)?,
            UnaryOp::Floor => self.unary("floor", x)?,
            UnaryOp::Ceil => self.unary("ceil", x)?,
            // torch.round rounds half to even.
            UnaryOp::Round => self.unary("round_nearest_even", x)?,
            UnaryOp::Sign => self.unary("sign", x)?,
            UnaryOp::Not | UnaryOp::BitNot => self.unary("not", x)?,
            UnaryOp::Log1p => self.unary("log_plus_one", x)?,
            UnaryOp::Expm1 => self.unary("exponential_minus_one", x)?,
            UnaryOp::Trunc => self.binary("multiply", &self.unary("sign", x)?, &self.unary("floor", &self.unary("abs", x)?)?)?,
            UnaryOp::Tan => self.binary("divide", &self.unary("sine", x)?, &self.unary("cosine", x)?)?,
            UnaryOp::Log2 => self.binary("multiply", &self.unary("log", x)?, &c(std::f64::consts::LOG2_E)?)?,
            UnaryOp::Log10 => self.binary("multiply", &self.unary("log", x)?, &c(std::f64::consts::LOG10_E)?)?,
            // The inverse trigonometric and hyperbolic functions are chlo ops
            // upstream; these are their textbook formulations.
            UnaryOp::Atan => self.binary("atan2", x, &self.splat(1.0, &x.shape, dt)?)?,
            UnaryOp::Asin => {
                let cos = self.unary("sqrt", &self.binary("subtract", &c(1.0)?, &self.binary("multiply", x, x)?)?)?;
                self.binary("atan2", x, &cos)?
            }
            UnaryOp::Acos => {
                let sin = self.unary("sqrt", &self.binary("subtract", &c(1.0)?, &self.binary("multiply", x, x)?)?)?;
                self.binary("atan2", &sin, x)?
            }
            UnaryOp::Sinh | UnaryOp::Cosh => {
                let (e, ne) = (self.unary("exponential", x)?, self.unary("exponential", &self.unary("negate", x)?)?);
                let sum = if u == UnaryOp::Sinh { self.binary("subtract", &e, &ne)? } else { self.binary("add", &e, &ne)? };
                self.binary("multiply", &sum, &c(0.5)?)?
            }
            UnaryOp::Asinh => {
                // sign(x) · log(|x| + sqrt(x² + 1)) avoids cancellation for x < 0.
                let ax = self.unary("abs", x)?;
                let r = self.unary("sqrt", &self.binary("add", &self.binary("multiply", x, x)?, &c(1.0)?)?)?;
                self.binary("multiply", &self.unary("sign", x)?, &self.unary("log", &self.binary("add", &ax, &r)?)?)?
            }
            UnaryOp::Acosh => {
                let r = self.unary("sqrt", &self.binary("subtract", &self.binary("multiply", x, x)?, &c(1.0)?)?)?;
                self.unary("log", &self.binary("add", x, &r)?)?
            }
            UnaryOp::Atanh => {
                let q = self.binary("divide", &self.binary("add", &c(1.0)?, x)?, &self.binary("subtract", &c(1.0)?, x)?)?;
                self.binary("multiply", &self.unary("log", &q)?, &c(0.5)?)?
            }
            #[allow(unreachable_patterns)]
            u => return Err(err(format!("no StableHLO lowering for {}", kiln_ir::unary_name(u)))),
        })
    }

    fn lower_binary(&self, b: BinaryOp, x: &T<'c, 'a>, y: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        Ok(match b {
            BinaryOp::Add => self.binary("add", x, y)?,
            BinaryOp::Sub => self.binary("subtract", x, y)?,
            BinaryOp::Mul => self.binary("multiply", x, y)?,
            BinaryOp::Div => self.binary("divide", x, y)?,
            BinaryOp::Pow => self.binary("power", x, y)?,
            BinaryOp::Max => self.binary("maximum", x, y)?,
            BinaryOp::Min => self.binary("minimum", x, y)?,
            BinaryOp::FloorDiv | BinaryOp::Rem if x.dt.is_int() => {
                // Python semantics from C's: where the remainder is non-zero and
                // its sign differs from the divisor's, q - 1 and r + y.
                let (q, r) = (self.binary("divide", x, y)?, self.binary("remainder", x, y)?);
                let zero = self.scalar(0.0, x.dt)?;
                let nonzero = self.compare("NE", &r, &zero)?;
                let signs_differ = self.compare("NE", &self.compare("LT", &r, &zero)?, &self.compare("LT", y, &zero)?)?;
                let fix = self.binary("and", &nonzero, &signs_differ)?;
                if b == BinaryOp::FloorDiv {
                    self.select(&fix, &self.binary("subtract", &q, &self.scalar(1.0, x.dt)?)?, &q)?
                } else {
                    self.select(&fix, &self.binary("add", &r, y)?, &r)?
                }
            }
            BinaryOp::FloorDiv => self.unary("floor", &self.binary("divide", x, y)?)?,
            BinaryOp::Rem => {
                // Python remainder (sign of the divisor): x - y * floor(x / y).
                let q = self.unary("floor", &self.binary("divide", x, y)?)?;
                self.binary("subtract", x, &self.binary("multiply", y, &q)?)?
            }
            BinaryOp::And => self.binary("and", x, y)?,
            BinaryOp::Or => self.binary("or", x, y)?,
            BinaryOp::Xor => self.binary("xor", x, y)?,
            BinaryOp::Eq => self.compare("EQ", x, y)?,
            BinaryOp::Ne => self.compare("NE", x, y)?,
            BinaryOp::Lt => self.compare("LT", x, y)?,
            BinaryOp::Le => self.compare("LE", x, y)?,
            BinaryOp::Gt => self.compare("GT", x, y)?,
            BinaryOp::Ge => self.compare("GE", x, y)?,
            BinaryOp::Atan2 => self.binary("atan2", x, y)?,
            // stablehlo.remainder has C semantics (sign of the dividend), as fmod.
            BinaryOp::Fmod => self.binary("remainder", x, y)?,
            #[allow(unreachable_patterns)]
            b => return Err(err(format!("no StableHLO lowering for {}", kiln_ir::binary_name(b)))),
        })
    }

    fn lower_node(&mut self, g: &Graph, n: NodeId) -> Result<(), EmitError> {
        let node = &g.nodes[n];
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
                let z = self.lower_binary(*b, &self.convert(&xv, self.acc(xv.dt))?, &self.convert(yv, self.acc(yv.dt))?)?;
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
            Op::Conv { stride, padding, dilation, groups } => self.conv(&ins, stride, padding, dilation, *groups, &out_shape, out_dt)?,
            Op::BatchNorm { eps } => {
                let xv = self.convert(&ins[0], self.acc(ins[0].dt))?;
                let p = |i: usize| -> Result<T<'c, 'a>, EmitError> { self.bcast_dims(&self.convert(&ins[i], xv.dt)?, &xv.shape, &[1]) };
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
                let var = self.binary("divide", &self.reduce(&self.binary("multiply", &c, &c)?, &axes, ReduceKind::Sum)?, &cnt)?;
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
                let iota = self.op("stablehlo.iota", &[], &xv.shape, DType::I64, &[("iota_dimension", format!("{axis} : i64"))])?;
                let big = self.op("stablehlo.constant", &[], &[], DType::I64, &[("value", format!("dense<{}> : tensor<i64>", i64::MAX))])?;
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
                let iota = self.op("stablehlo.iota", &[], &xv.shape, DType::I64, &[("iota_dimension", format!("{axis} : i64"))])?;
                let big = self.op("stablehlo.constant", &[], &[], DType::I64, &[("value", format!("dense<{}> : tensor<i64>", i64::MAX))])?;
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
                let rows: Vec<String> = (0..r).map(|d| if d == *axis { format!("[{}, 0]", n - 1) } else { "[0, 0]".into() }).collect();
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
                    &[("edge_padding_low", arr(lo)), ("edge_padding_high", arr(hi)), ("interior_padding", arr(interior))],
                )?
            }
            Op::Pool { kind, kernel, stride, padding, dilation, count_include_pad, divisor, .. } => {
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
                let (data, idx) = (&ins[0], &ins[1]);
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
            Op::IndexGather { axis } => self.index_gather(&ins[0], &ins[1..], *axis, &out_shape)?,
            Op::GatherElements { axis } => self.gather_elements(&ins[0], &ins[1], *axis, &out_shape)?,
            Op::Full { value, .. } => self.splat(*value, &out_shape, out_dt)?,
            Op::Arange { start, step, .. } => {
                let iota = self.op("stablehlo.iota", &[], &out_shape, out_dt, &[("iota_dimension", "0 : i64".into())])?;
                let y = self.binary("multiply", &iota, &self.scalar(*step, out_dt)?)?;
                self.binary("add", &y, &self.scalar(*start, out_dt)?)?
            }
            #[allow(unreachable_patterns)]
            op => return Err(err(format!("no StableHLO lowering for {}", op.name()))),
        };
        if r.shape != out_shape || r.dt != out_dt {
            return Err(err(format!("lowering produced {:?} {:?}, expected {:?} {:?}", r.dt, r.shape, out_dt, out_shape)));
        }
        self.values.insert(out, r);
        Ok(())
    }

    /// Torch's negative indices count from the end of a dimension of size
    /// `dim`; `stablehlo.gather` would clamp them to 0 instead.
    fn wrap_index(&self, i: &T<'c, 'a>, dim: i64) -> Result<T<'c, 'a>, EmitError> {
        let negative = self.compare("LT", i, &self.scalar(0.0, i.dt)?)?;
        let wrapped = self.binary("add", i, &self.scalar(dim as f64, i.dt)?)?;
        self.select(&negative, &wrapped, i)
    }

    /// One `stablehlo.gather` with full coordinates: `columns` (each shaped
    /// `B ++ [1]`) are concatenated into `B ++ [k]` index vectors addressing
    /// `data` axes `first..first+k`, which are collapsed; the other axes of
    /// `data` are taken whole, placed around `B` as `offset` says.
    fn gather_columns(&self, data: &T<'c, 'a>, columns: &[T<'c, 'a>], first: usize, offset: &[i64], out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let k = columns.len();
        let batch = columns.first().map(|c| c.shape[..c.shape.len() - 1].to_vec()).ok_or_else(|| err("gather without indices"))?;
        let mut ishape = batch.clone();
        ishape.push(k as i64);
        let refs: Vec<&T<'c, 'a>> = columns.iter().collect();
        let ivd = batch.len();
        let index = if k == 1 {
            columns[0].clone()
        } else {
            self.op("stablehlo.concatenate", &refs, &ishape, columns[0].dt, &[("dimension", format!("{ivd} : i64"))])?
        };
        let addressed: Vec<i64> = (first as i64..(first + k) as i64).collect();
        let mut sizes = data.shape.clone();
        for d in first..first + k {
            sizes[d] = 1;
        }
        let mut dn = Vec::new();
        if !offset.is_empty() {
            dn.push(format!("offset_dims = {}", list(offset)));
        }
        dn.push(format!("collapsed_slice_dims = {}", list(&addressed)));
        dn.push(format!("start_index_map = {}", list(&addressed)));
        dn.push(format!("index_vector_dim = {ivd}"));
        self.op(
            "stablehlo.gather",
            &[data, &index],
            out_shape,
            data.dt,
            &[
                ("dimension_numbers", format!("#stablehlo.gather<{}>", dn.join(", "))),
                ("slice_sizes", arr(&sizes)),
                ("indices_are_sorted", "false".into()),
            ],
        )
    }

    /// Advanced indexing (`Op::IndexGather`): the index tensors (one shape
    /// `B`) address axes `axis..axis+k`; the result is
    /// `data.shape[..axis] ++ B ++ data.shape[axis+k..]`.
    fn index_gather(&self, data: &T<'c, 'a>, indices: &[T<'c, 'a>], axis: usize, out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let (k, rd) = (indices.len(), data.shape.len());
        if k == 0 || axis + k > rd {
            return Err(err("index_gather: index tensors do not fit the data's rank"));
        }
        let mut columns = Vec::with_capacity(k);
        for (m, i) in indices.iter().enumerate() {
            let mut shape = i.shape.clone();
            shape.push(1);
            columns.push(self.reshape(&self.wrap_index(i, data.shape[axis + m])?, &shape)?);
        }
        let (a, rb) = (axis as i64, indices[0].shape.len() as i64);
        let offset: Vec<i64> = (0..a).chain(a + rb..rd as i64 - k as i64 + rb).collect();
        self.gather_columns(data, &columns, axis, &offset, out_shape)
    }

    /// `torch.gather` (`Op::GatherElements`): every output position `p`
    /// reads `data[p with p[axis] = index[p]]`, so its coordinates are iotas
    /// on the other axes and the (wrapped) index on `axis`.
    fn gather_elements(&self, data: &T<'c, 'a>, index: &T<'c, 'a>, axis: usize, out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let r = index.shape.len();
        if r != data.shape.len() || axis >= r {
            return Err(err("gather_elements: index rank differs from the data's"));
        }
        let mut shape = index.shape.clone();
        shape.push(1);
        let mut columns = Vec::with_capacity(r);
        for d in 0..r {
            columns.push(if d == axis {
                self.reshape(&self.wrap_index(index, data.shape[axis])?, &shape)?
            } else {
                self.op("stablehlo.iota", &[], &shape, index.dt, &[("iota_dimension", format!("{d} : i64"))])?
            });
        }
        self.gather_columns(data, &columns, 0, &[], out_shape)
    }

    #[allow(clippy::too_many_arguments)]
    fn conv(
        &self,
        ins: &[T<'c, 'a>],
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        groups: i64,
        out_shape: &[i64],
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (x, w) = (&ins[0], &ins[1]);
        let sp = x.shape.len().saturating_sub(2);
        let spatial: Vec<String> = (0..sp).map(|i| i.to_string()).collect();
        let s = spatial.join(", ");
        let sep = if sp > 0 { ", " } else { "" };
        let dn = format!("#stablehlo.conv<[b, f{sep}{s}]x[o, i{sep}{s}]->[b, f{sep}{s}]>");
        let pads: Vec<String> = padding.iter().map(|p| format!("[{p}, {p}]")).collect();
        let pad_text = format!("dense<[{}]> : tensor<{sp}x2xi64>", pads.join(", "));
        let acc = self.acc(x.dt);
        let mut y = self.op(
            "stablehlo.convolution",
            &[x, w],
            out_shape,
            acc,
            &[
                ("window_strides", arr(stride)),
                ("padding", pad_text),
                ("lhs_dilation", arr(&vec![1; sp])),
                ("rhs_dilation", arr(dilation)),
                ("feature_group_count", format!("{groups} : i64")),
                ("batch_group_count", "1 : i64".into()),
                ("dimension_numbers", dn),
                ("precision_config", self.precision().into()),
            ],
        )?;
        if let Some(b) = ins.get(2) {
            let b = self.convert(b, acc)?;
            y = self.binary("add", &y, &self.bcast_dims(&b, out_shape, &[1])?)?;
        }
        self.convert(&y, out_dt)
    }

    #[allow(clippy::too_many_arguments)]
    fn pool(
        &self,
        x: &T<'c, 'a>,
        kind: PoolKind,
        kernel: &[i64],
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        divide: Divisor,
        out_shape: &[i64],
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let r = x.shape.len();
        let k = kernel.len();
        if k > r || stride.len() != k || out_shape.len() != r {
            return Err(err("pool parameters do not match the input rank"));
        }
        let lead = r - k;
        let at = |v: &[i64], i: usize, default: i64| v.get(i).copied().unwrap_or(default);
        let mut win = vec![1; r];
        let mut strides = vec![1; r];
        let mut dil = vec![1; r];
        let mut pad_lo = vec![0; r];
        let mut pad_hi = vec![0; r];
        for i in 0..k {
            let d = lead + i;
            win[d] = kernel[i];
            strides[d] = stride[i];
            dil[d] = at(dilation, i, 1);
            let p = at(padding, i, 0);
            pad_lo[d] = p;
            // ceil_mode: the output shape may need windows past the right edge.
            let needed = (out_shape[d] - 1) * strides[d] + (win[d] - 1) * dil[d] + 1;
            pad_hi[d] = p + (needed - (x.shape[d] + 2 * p)).max(0);
        }
        let pad_text = |lo: &[i64], hi: &[i64]| {
            let rows: Vec<String> = lo.iter().zip(hi).map(|(a, b)| format!("[{a}, {b}]")).collect();
            format!("dense<[{}]> : tensor<{r}x2xi64>", rows.join(", "))
        };
        let window = |t: &T<'c, 'a>, init: f64, body: &str, lo: &[i64], hi: &[i64]| -> Result<T<'c, 'a>, EmitError> {
            let init_t = self.scalar(init, t.dt)?;
            let region = self.reducer(body, t.dt)?;
            self.op_with_regions(
                "stablehlo.reduce_window",
                &[t, &init_t],
                out_shape,
                t.dt,
                &[
                    ("window_dimensions", arr(&win)),
                    ("window_strides", arr(&strides)),
                    ("base_dilations", arr(&vec![1; r])),
                    ("window_dilations", arr(&dil)),
                    ("padding", pad_text(lo, hi)),
                ],
                vec![region],
            )
        };
        match kind {
            PoolKind::Max => {
                let y = window(x, f64::NEG_INFINITY, "maximum", &pad_lo, &pad_hi)?;
                self.convert(&y, out_dt)
            }
            PoolKind::Avg => {
                let xa = self.convert(x, self.acc(x.dt))?;
                let sum = window(&xa, 0.0, "add", &pad_lo, &pad_hi)?;
                let count_include_pad = match divide {
                    // torch divides the window's sum by divisor_override.
                    Divisor::Fixed(d) => {
                        let y = self.binary("divide", &sum, &self.scalar(d as f64, sum.dt)?)?;
                        return self.convert(&y, out_dt);
                    }
                    Divisor::Taps { count_include_pad } => count_include_pad,
                };
                // Divisors: windows over ones, padded as torch counts them.
                let counts = if count_include_pad {
                    let mut shape = x.shape.clone();
                    let mut hi = vec![0; r];
                    for d in lead..r {
                        shape[d] += 2 * pad_lo[d];
                        hi[d] = pad_hi[d] - pad_lo[d];
                    }
                    window(&self.splat(1.0, &shape, xa.dt)?, 0.0, "add", &vec![0; r], &hi)?
                } else {
                    window(&self.splat(1.0, &x.shape, xa.dt)?, 0.0, "add", &pad_lo, &pad_hi)?
                };
                let y = self.binary("divide", &sum, &counts)?;
                self.convert(&y, out_dt)
            }
            PoolKind::ArgMax => Err(err("max pooling's indices have no StableHLO lowering (the partitioner keeps them on the CPU)")),
        }
    }

    fn attention(&self, ins: &[T<'c, 'a>], causal: bool, scale: Option<f64>, out_dt: DType) -> Result<T<'c, 'a>, EmitError> {
        let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
        let r = q.shape.len();
        if r < 2 || k.shape.len() != r || v.shape.len() != r {
            return Err(err("attention operands must share their rank"));
        }
        let nb = (r - 2) as i64;
        let bd: Vec<i64> = (0..nb).collect();
        let e = q.shape[r - 1];
        let s = self.dot(q, k, &bd, &bd, &[nb + 1], &[nb + 1])?;
        let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
        let mut s = self.binary("multiply", &s, &self.scalar(scale, s.dt)?)?;
        let neg_inf = self.scalar(f64::NEG_INFINITY, s.dt)?;
        if causal {
            let row = self.op("stablehlo.iota", &[], &s.shape, DType::I64, &[("iota_dimension", format!("{nb} : i64"))])?;
            let col = self.op("stablehlo.iota", &[], &s.shape, DType::I64, &[("iota_dimension", format!("{} : i64", nb + 1))])?;
            let keep = self.compare("LE", &col, &row)?;
            s = self.select(&keep, &s, &neg_inf)?;
        }
        if let Some(m) = ins.get(3) {
            s = if m.dt == DType::Bool {
                let m = self.bcast(m, &s.shape)?;
                self.select(&m, &s, &neg_inf)?
            } else {
                self.binary("add", &s, &self.convert(m, s.dt)?)?
            };
        }
        let p = self.softmax(&s, r - 1, false)?;
        let p = self.convert(&p, v.dt)?;
        let o = self.dot(&p, v, &bd, &bd, &[nb + 1], &[nb])?;
        self.convert(&o, out_dt)
    }
}

/// Numpy broadcasting of two shapes.
fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let x = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
        let y = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// What an average pool divides each window's sum by.
#[derive(Copy, Clone, Debug)]
enum Divisor {
    /// torch's `divisor_override`.
    Fixed(i64),
    /// The window's taps, counting padding or not.
    Taps { count_include_pad: bool },
}
