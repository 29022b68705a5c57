//! The execution plan: tables indexed by `u32`, fixed at compile time.
//!
//! Nothing here is looked up by string at load or run time: instructions name
//! their tensors by index, tensors name their storage by offset, dimensions name
//! their expressions by index. The loader validates every index before use.

pub use kiln_isa::{
    BinaryOp, DType, Epilogue, FusedOp, InstrKind, Layout, LinalgOp, Opcode, PadMode, PoolKind, RandomDist, ReduceKind,
    ResizeMode, ScanKind, UnaryOp,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub symbols: Vec<SymbolDecl>,
    /// Dimension expressions; an expression's operands index earlier entries.
    pub exprs: Vec<DimExpr>,
    pub tensors: Vec<TensorDecl>,
    pub inputs: Vec<IoDecl>,
    pub outputs: Vec<IoDecl>,
    pub instrs: Vec<Instr>,
    /// Bytes each session allocates for activations (inputs, intermediates, outputs).
    pub arena_bytes: u64,
    /// Largest sum of simultaneously live tensors: the lower bound for `arena_bytes`.
    pub peak_live_bytes: u64,
    /// Buffers that persist between runs (the program mutates them).
    pub states: Vec<StateDecl>,
}

/// A buffer kept by the session between runs: a counter, a filter's state,
/// a KV cache. Its current value lives in the arena's state region (at its
/// end, apart from every slot an instruction writes); the session fills it
/// from `init` when the arena is allocated (and on `reset_state`), and copies
/// `update` into it after every successful run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDecl {
    /// The buffer's fully-qualified name (`blocks.0.cache_k`).
    pub name: String,
    /// The tensor the program reads the current value from (arena, state region).
    pub tensor: u32,
    /// The tensor holding the next value when a run ends.
    pub update: u32,
    /// The initial value (a weight).
    pub init: u32,
}

/// A shape symbol bound at run time: from an input dimension, or, when a
/// [`InstrOp::BindDim`] instruction names it, from data during the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolDecl {
    pub name: String,
    pub min: u64,
    pub max: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DimExpr {
    Const(u64),
    Sym(u32),
    Add(u32, u32),
    Mul(u32, u32),
    FloorDiv(u32, u32),
    Mod(u32, u32),
    /// `a - b`, saturating at 0 (dimensions such as `s - 1` or `(s - 3) // 2 + 1`).
    Sub(u32, u32),
}

impl Plan {
    /// The dtype and dimensions the caller passes or receives for `io`: its
    /// tensor's, or for a complex one the complex dtype over the tensor's
    /// dtype and its dimensions without the last (validation checked that
    /// it is a static 2 over f32 or f64). `io` must be validated.
    pub fn io_type(&self, io: &IoDecl) -> (DType, &[DimRef]) {
        let t = &self.tensors[io.tensor as usize];
        match (io.complex, t.dtype.complex_of(), t.shape.split_last()) {
            (true, Some(c), Some((_, dims))) => (c, dims),
            _ => (t.dtype, &t.shape),
        }
    }

    /// An input dimension that binds a symbol: `k * s + c` (`k >= 1`) as
    /// `(s, k, c)`, for a plain symbol or torch's derived dims (`2*s`, `s + 1`,
    /// `s - 1`). Other expressions are only checked once the symbols are bound.
    pub fn affine_symbol(&self, e: u32) -> Option<(u32, u64, i128)> {
        let expr = |j: u32| self.exprs.get(j as usize).copied();
        let konst = |j: u32| match expr(j) {
            Some(DimExpr::Const(c)) => Some(c),
            _ => None,
        };
        let sym = |j: u32| match expr(j) {
            Some(DimExpr::Sym(s)) => Some(s),
            _ => None,
        };
        match expr(e)? {
            DimExpr::Sym(s) => Some((s, 1, 0)),
            DimExpr::Mul(a, b) => match (konst(a), sym(b), sym(a), konst(b)) {
                (Some(k), Some(s), _, _) | (_, _, Some(s), Some(k)) if k >= 1 => Some((s, k, 0)),
                _ => None,
            },
            DimExpr::Add(a, b) => {
                let (inner, c) = match (konst(a), konst(b)) {
                    (Some(c), None) => (b, c),
                    (None, Some(c)) => (a, c),
                    _ => return None,
                };
                let (s, k, c0) = self.affine_symbol(inner)?;
                Some((s, k, c0 + i128::from(c)))
            }
            DimExpr::Sub(a, b) => {
                let (s, k, c0) = self.affine_symbol(a)?;
                Some((s, k, c0 - i128::from(konst(b)?)))
            }
            _ => None,
        }
    }
}

/// One dimension of a declared shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DimRef {
    Static(u64),
    /// Index into [`Plan::exprs`].
    Expr(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Storage {
    /// Activation memory: `max_bytes` at `offset` in the session arena.
    Arena { offset: u64, max_bytes: u64 },
    /// Read-only bytes at `offset` in the weights section.
    Weight { offset: u64, bytes: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDecl {
    pub dtype: DType,
    pub shape: Vec<DimRef>,
    pub storage: Storage,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoDecl {
    pub name: String,
    pub tensor: u32,
    /// The caller sees this f32/f64 tensor, whose last dimension is 2, as a
    /// complex64/complex128 tensor of the other dimensions: the same bytes
    /// (interleaved real and imaginary parts). See [`Plan::io_type`].
    pub complex: bool,
}

/// One instruction: what it does, its operand and output tensors (plan tensor
/// indices), and where it came from.
///
/// On disk (postcard) the fields follow in this order; `op` starts with its
/// numeric [`Opcode`], so the encoding never depends on declaration order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    pub op: InstrOp,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
    /// Human-readable origin (`linear from fc1 at model.py:12`) for error messages.
    pub origin: String,
}

/// The instruction kinds, apart: the runtime handles each in one place.
#[derive(Clone, Debug, PartialEq)]
pub enum InstrOp {
    /// Runs a kernel from the kernel table; it writes every output.
    Call(Kernel),
    /// Calls accelerator segment `segment` of the [`AccelProgram`] section
    /// (PJRT): inputs are its arguments, outputs its results, in order.
    Delegate { segment: u32 },
    /// Binds data-dependent symbol `symbol` to the value of its one operand
    /// (a 0-d i64), after checking it against the symbol's bounds; the
    /// session then re-evaluates the shapes. No outputs.
    BindDim { symbol: u32 },
    /// Loop exit: when its one operand (a 1-element bool) is false, the run
    /// continues at instruction `target` (just past its loop's
    /// [`InstrOp::Jump`]) instead of the next one. No outputs.
    JumpIfFalse { target: u32 },
    /// A loop's back edge: the run continues at instruction `target`, the
    /// loop's first instruction. No operands or outputs.
    Jump { target: u32 },
    /// Calls function `function` of the native section (see
    /// `crate::native`); `program` is the same group as a portable
    /// [`Kernel::Fused`] program, run when native code is refused, no level
    /// matches the CPU or the operands' shapes differ from the compiled ones.
    Native { function: u32, program: Vec<FusedOp> },
    /// Calls row function `function` of the native section (softmax, a
    /// norm, a last-axis reduction: see `crate::native`); `fallback` is the
    /// same computation as a kernel call, run when native code is refused,
    /// no level matches the CPU or the operands' sizes differ from the
    /// compiled ones. Since format 0.11.
    ///
    /// With a `prologue` (format 0.14), the kernel's first operand is the
    /// result of an elementwise program computed in the row function (a
    /// residual add before a norm, a scale and mask before a softmax): the
    /// instruction's operands are the prologue's `inputs` operands, then the
    /// kernel's others (a norm's weight and bias); its outputs are the
    /// kernel's, then the prologue's result (written either way, so later
    /// instructions may read it). The fallback runs the program as a
    /// [`Kernel::Fused`] call into that second output, then the kernel.
    ///
    /// With an `epilogue` (format 0.20), an elementwise program reading the
    /// kernel's result (a GELU or residual add after a layer norm, a scale
    /// after a softmax) is computed in the row function too, each row while
    /// it is in cache: its other operands come after the kernel's, and its
    /// result is the last output. The kernel's result is written either way
    /// (later instructions may read it); the fallback runs the program as a
    /// [`Kernel::Fused`] call after the kernel.
    NativeKernel { function: u32, fallback: Kernel, prologue: Option<RowPrologue>, epilogue: Option<RowEpilogue> },
}

/// The elementwise program a [`InstrOp::NativeKernel`] computes its
/// kernel's first operand with: a fused program over the instruction's
/// first `inputs` operands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowPrologue {
    pub inputs: u32,
    pub program: Vec<FusedOp>,
}

/// The elementwise program a [`InstrOp::NativeKernel`] applies to its
/// kernel's result (format 0.20): a fused program over `inputs + 1`
/// operands, of which operand `row` is the kernel's result and the others,
/// in order, the instruction's last `inputs` operands; its result is the
/// instruction's last output, shaped like the kernel's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowEpilogue {
    pub inputs: u32,
    pub row: u32,
    pub program: Vec<FusedOp>,
}

impl RowEpilogue {
    /// The program's operands: `others` (the instruction's last `inputs`
    /// operands) with `row` inserted at its position.
    pub fn operands<T: Copy>(&self, row: T, others: &[T]) -> Vec<T> {
        let at = (self.row as usize).min(others.len());
        others[..at].iter().copied().chain(std::iter::once(row)).chain(others[at..].iter().copied()).collect()
    }
}

impl InstrOp {
    pub fn opcode(&self) -> Opcode {
        match self {
            InstrOp::Call(k) => k.opcode(),
            InstrOp::Delegate { .. } => Opcode::Delegate,
            InstrOp::BindDim { .. } => Opcode::BindDim,
            InstrOp::JumpIfFalse { .. } => Opcode::JumpIfFalse,
            InstrOp::Jump { .. } => Opcode::Jump,
            InstrOp::Native { .. } => Opcode::NativeCall,
            InstrOp::NativeKernel { .. } => Opcode::NativeKernel,
        }
    }

    /// The name shown by `kiln inspect`, profiles and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            InstrOp::Call(k) => k.name(),
            other => other.opcode().name(),
        }
    }

    /// The kernel, for a call.
    pub fn kernel(&self) -> Option<&Kernel> {
        match self {
            InstrOp::Call(k) => Some(k),
            _ => None,
        }
    }

    /// The native function called, for a native instruction of either kind.
    pub fn native_function(&self) -> Option<u32> {
        match self {
            InstrOp::Native { function, .. } | InstrOp::NativeKernel { function, .. } => Some(*function),
            _ => None,
        }
    }
}

/// Declares [`Kernel`] from one row per opcode (its typed parameters) and its
/// on-disk form: the opcode's numeric code, then the fields in row order.
///
/// A field may name the load-time check its kind of parameter gets
/// (`axis: u32 => axis`): one of the functions of `crate::validate::param`
/// (an axis of the first operand, an axis of the output, a list of axes, a
/// normalised rank, a non-zero count, one entry per dim, one per spatial dim).
/// `Kernel::check_params` runs them; checks that relate several parameters
/// or tensors stay hand-written in `validate.rs`, one arm per opcode.
macro_rules! kernels {
    ( $( $(#[$meta:meta])* $variant:ident { $( $field:ident : $ty:ty $( => $check:ident )? ),* $(,)? } )* ) => {
        /// A kernel call's compile-time parameters; shapes come from the
        /// tensors' declared shapes, evaluated per run. Each variant is the
        /// [`Opcode`] of the same name (the table in `kiln_isa::opcode` gives
        /// its code and operand/output counts).
        #[derive(Clone, Debug, PartialEq)]
        pub enum Kernel {
            $( $(#[$meta])* $variant { $( $field: $ty ),* }, )*
        }

        impl Kernel {
            pub fn opcode(&self) -> Opcode {
                match self {
                    $( Kernel::$variant { .. } => Opcode::$variant, )*
                }
            }

            /// The parameters of `op`'s kernel that have a check of their
            /// kind, as (field, check) names; empty when `op` is no kernel.
            pub fn param_checks(op: Opcode) -> &'static [(&'static str, &'static str)] {
                match op {
                    $( Opcode::$variant => &[$( $( (stringify!($field), stringify!($check)), )? )*], )*
                    _ => &[],
                }
            }

            /// Runs every parameter's check of its kind (see the macro's doc).
            pub(crate) fn check_params(&self, cx: &crate::validate::param::Ranks) -> Result<(), String> {
                match self {
                    // Only the fields with a check are read.
                    $( #[allow(unused_variables)] Kernel::$variant { $( $field ),* } => {
                        $( $( crate::validate::param::$check(stringify!($field), $field, cx)?; )? )*
                    } )*
                }
                Ok(())
            }

            fn write_fields<T: serde::ser::SerializeTuple>(&self, t: &mut T) -> Result<(), T::Error> {
                match self {
                    $( Kernel::$variant { $( $field ),* } => { $( t.serialize_element($field)?; )* } )*
                }
                Ok(())
            }

            /// The fields of `op`'s kernel, or `None` when `op` is no kernel.
            fn read_fields<'de, A: serde::de::SeqAccess<'de>>(
                op: Opcode,
                seq: &mut A,
            ) -> Result<Option<Kernel>, A::Error> {
                Ok(Some(match op {
                    $( Opcode::$variant => Kernel::$variant { $( $field: next::<A, $ty>(seq)? ),* }, )*
                    _ => return Ok(None),
                }))
            }
        }
    };
}

fn next<'de, A: serde::de::SeqAccess<'de>, T: Deserialize<'de>>(seq: &mut A) -> Result<T, A::Error> {
    seq.next_element()?.ok_or_else(|| serde::de::Error::custom("instruction truncated"))
}

kernels! {
    Unary { op: UnaryOp }
    Binary { op: BinaryOp }
    Where {}
    Cast {}
    Clamp { min: Option<f64>, max: Option<f64> }
    MatMul {}
    GroupedMatMul {}
    Linear {}
    Conv {
        stride: Vec<u32> => spatial,
        padding: Vec<u32> => spatial,
        dilation: Vec<u32> => spatial,
        groups: u32 => nonzero,
    }
    BatchNorm { eps: f64 }
    LayerNorm { normalized_rank: u32 => normalized_rank, eps: f64 }
    Softmax { axis: u32 => axis, log: bool }
    Reduce { kind: ReduceKind, axes: Vec<u32> => axes }
    ArgMax { axis: u32 => axis }
    /// `divisor` (avg only): torch's `divisor_override`. `PoolKind::ArgMax`
    /// writes max pooling's i64 indices instead of its values; `Max` with
    /// two outputs writes both (values, indices) in one pass. Channels-last
    /// (2-d max/avg values only): input and output `[N, H, W, C]`.
    Pool {
        kind: PoolKind,
        layout: Layout,
        kernel: Vec<u32>,
        stride: Vec<u32>,
        padding: Vec<u32>,
        dilation: Vec<u32>,
        count_include_pad: bool,
        divisor: Option<i64>,
    }
    AdaptiveAvgPool {}
    Attention { causal: bool, scale: Option<f64> }
    /// Same bytes, new shape. A no-op when input and output share storage.
    Copy {}
    Expand {}
    Permute { perm: Vec<u32> }
    Slice { axis: u32 => axis, start: u64, step: u64 => nonzero }
    Concat { axis: u32 => output_axis }
    Gather { axis: u32 => axis }
    Fill { value: f64 }
    Arange { start: f64, step: f64 }
    CumSum { axis: u32 => axis }
    Scan { axis: u32 => axis, kind: ScanKind }
    /// Fails the run with `message` unless every element is nonzero.
    Assert { message: String }
    Linalg { op: LinalgOp, upper: bool, left: bool, unit: bool, complex: bool }
    ArgMin { axis: u32 => axis }
    /// The first `out.shape[axis]` elements in sorted order, or (`indices`)
    /// their positions; with two outputs, both (values, indices) from one sort.
    Sort { axis: u32 => axis, descending: bool, indices: bool }
    Pad { lo: Vec<i64> => per_dim, hi: Vec<i64> => per_dim, interior: Vec<i64> => per_dim, mode: PadMode, value: f64 }
    Flip { axes: Vec<u32> => axes }
    /// Resizes the trailing `spatial` dims to the output's.
    Resize { mode: ResizeMode, align_corners: bool, spatial: u32, scales: Vec<f64> }
    /// Numbers drawn from `dist` by the session's seeded generator; `stream`
    /// tells the program's random instructions apart (see `kiln_kernels::random`).
    Random { dist: RandomDist, stream: u32 }
    /// `torch.gather` along `axis` (operands: data, index).
    GatherElements { axis: u32 => axis }
    /// `torch.scatter` / `scatter_reduce` along `axis` (data, index, src).
    ScatterElements { axis: u32 => axis, reduce: Option<ReduceKind>, include_self: bool }
    /// Advanced indexing of axes `axis..` by one index tensor each (data, indices..).
    IndexGather { axis: u32 }
    /// `index_put` (data, values, indices..).
    IndexPut { axis: u32, accumulate: bool }
    /// [`Kernel::Slice`] starting `back` elements before the end of `axis`
    /// (torch's negative start on a dynamic dimension; clamped to 0).
    SliceFromEnd { axis: u32 => axis, back: u64, step: u64 => nonzero }
    /// The coordinates of the operand's nonzero elements (i64 `[count, rank]`).
    NonZero {}
    /// A fused elementwise program over the operands (`kiln_isa::fused`),
    /// checked at load.
    Fused { program: Vec<FusedOp> }
    /// RMS normalisation of the last `normalized_rank` dims (x [, weight]).
    RmsNorm { normalized_rank: u32 => normalized_rank, eps: f64 }
    /// A linear layer with `bits`-bit weights (8, or 4 two a byte), `group`
    /// input features per scale, optional zero points (operands: x, w,
    /// scales [, zero points] [, bias]); `dynamic`: per-row int8 activations
    /// (symmetric, or with a zero point per row with `asymmetric`);
    /// `act_scale` (an f32 value) and `act_zero_point`: per-tensor static
    /// int8 activations (`kiln_kernels::quant::qlinear`).
    QuantLinear {
        bits: u32,
        group: u32,
        zero_points: bool,
        dynamic: bool,
        asymmetric: bool,
        act_scale: Option<f64>,
        act_zero_point: i32,
    }
    /// A convolution with an int8 weight `[Cout, C/groups, k..]` and f32
    /// scales `[Cout]` (operands: x, w, scales [, bias]); activations as
    /// [`Kernel::QuantLinear`]'s flags say, dynamic ones per image
    /// (`kiln_kernels::quant::qconv`; dense only), or none: the weight
    /// is dequantized at load and the f32 convolution runs; `epilogue` as
    /// [`Kernel::ConvFused`]'s, its operands after the scales (since
    /// format 0.10). int8 activations between layers (since format 0.14):
    /// with static activations `x` may be i8 (already quantized with them);
    /// with `out_scale` (int8 activations, channels-last, no residual) the
    /// output is i8, the f32 result quantized with `out_scale` and
    /// `out_zero_point` (`kiln_kernels::quant::qconv`). int8 residuals
    /// (since format 0.18; dense, channels-last, int8 activations): with
    /// `res_scale` the residual is i8, dequantized with it and
    /// `res_zero_point` before the add, and an i8 output may follow a
    /// residual (`kiln_kernels::quant::qconv_int8`).
    QuantConv {
        stride: Vec<u32> => spatial,
        padding: Vec<u32> => spatial,
        dilation: Vec<u32> => spatial,
        groups: u32 => nonzero,
        epilogue: Epilogue,
        layout: Layout,
        dynamic: bool,
        asymmetric: bool,
        act_scale: Option<f64>,
        act_zero_point: i32,
        out_scale: Option<f64>,
        out_zero_point: i32,
        res_scale: Option<f64>,
        res_zero_point: i32,
    }
    /// [`Kernel::Conv`] with a fused epilogue: `(x, w [, bias] [, residual])`
    /// as the epilogue's flags say; channels-last (2-d only): `x`, the
    /// residual and the output `[N, H, W, C]` (since format 0.9).
    ConvFused {
        stride: Vec<u32> => spatial,
        padding: Vec<u32> => spatial,
        dilation: Vec<u32> => spatial,
        groups: u32 => nonzero,
        epilogue: Epilogue,
        layout: Layout,
    }
    /// [`Kernel::Linear`] with a fused epilogue: `(x, w [, bias] [, residual])`.
    LinearFused { epilogue: Epilogue }
}

impl Kernel {
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::Softmax { log: true, .. } => "log_softmax",
            Kernel::Pool { kind: PoolKind::Max, .. } => "max_pool",
            Kernel::Pool { kind: PoolKind::Avg, .. } => "avg_pool",
            Kernel::Pool { kind: PoolKind::ArgMax, .. } => "max_pool_indices",
            Kernel::SliceFromEnd { .. } => "slice",
            other => other.opcode().name(),
        }
    }
}

/// Longest on-disk tuple of an instruction op (code + fields): a bound for
/// the deserializer, which reads only as many elements as the code has.
const MAX_OP_FIELDS: usize = 16;

impl Serialize for InstrOp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(MAX_OP_FIELDS)?;
        t.serialize_element(&self.opcode().code())?;
        match self {
            InstrOp::Call(k) => k.write_fields(&mut t)?,
            InstrOp::Delegate { segment: x }
            | InstrOp::BindDim { symbol: x }
            | InstrOp::JumpIfFalse { target: x }
            | InstrOp::Jump { target: x } => t.serialize_element(x)?,
            InstrOp::Native { function, program } => {
                t.serialize_element(function)?;
                t.serialize_element(program)?;
            }
            InstrOp::NativeKernel { function, fallback, prologue, epilogue } => {
                t.serialize_element(function)?;
                t.serialize_element(&CallOf(fallback))?;
                t.serialize_element(prologue)?;
                t.serialize_element(epilogue)?;
            }
        }
        t.end()
    }
}

/// A kernel as the instruction op `Call(kernel)` encodes it (opcode, then
/// fields): how a [`InstrOp::NativeKernel`] stores its fallback.
struct CallOf<'a>(&'a Kernel);

impl Serialize for CallOf<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(MAX_OP_FIELDS)?;
        t.serialize_element(&self.0.opcode().code())?;
        self.0.write_fields(&mut t)?;
        t.end()
    }
}

impl<'de> Deserialize<'de> for InstrOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<InstrOp, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = InstrOp;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an instruction (opcode, parameters)")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<InstrOp, A::Error> {
                let code: u16 = next(&mut seq)?;
                let op = Opcode::from_code(code).map_err(serde::de::Error::custom)?;
                Ok(match op.kind() {
                    InstrKind::Call => match Kernel::read_fields(op, &mut seq)? {
                        Some(k) => InstrOp::Call(k),
                        None => return Err(serde::de::Error::custom(format!("opcode {op} has no kernel"))),
                    },
                    InstrKind::Delegate => InstrOp::Delegate { segment: next(&mut seq)? },
                    InstrKind::BindDim => InstrOp::BindDim { symbol: next(&mut seq)? },
                    InstrKind::JumpIfFalse => InstrOp::JumpIfFalse { target: next(&mut seq)? },
                    InstrKind::Jump => InstrOp::Jump { target: next(&mut seq)? },
                    InstrKind::Native => InstrOp::Native { function: next(&mut seq)?, program: next(&mut seq)? },
                    InstrKind::NativeKernel => {
                        let function = next(&mut seq)?;
                        match next::<A, InstrOp>(&mut seq)? {
                            InstrOp::Call(fallback) => InstrOp::NativeKernel {
                                function,
                                fallback,
                                prologue: next(&mut seq)?,
                                epilogue: next(&mut seq)?,
                            },
                            other => {
                                return Err(serde::de::Error::custom(format!(
                                    "a native kernel's fallback must be a kernel call, not {}",
                                    other.name()
                                )))
                            }
                        }
                    }
                })
            }
        }
        d.deserialize_tuple(MAX_OP_FIELDS, V)
    }
}

/// Producer information, for `kiln inspect` and bug reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub producer: String,
    pub source: String,
    pub target: String,
    pub torch_version: String,
}

/// The accelerator part of a mixed plan (section `SECTION_ACCEL`): StableHLO
/// programs run through a PJRT plugin, called by [`InstrOp::Delegate`] instructions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccelProgram {
    pub segments: Vec<AccelSegment>,
    /// Instructions left on the CPU in a plan for an accelerator, and why
    /// (shown by `kiln inspect`).
    pub cpu_fallbacks: Vec<CpuFallback>,
    /// The device mesh of an SPMD program (`kiln compile --mesh`): then the
    /// plan has exactly one segment, run on every device of the mesh at once,
    /// and each of its arguments and results records its sharding.
    pub mesh: Option<MeshDecl>,
    /// Shape buckets (`kiln compile --buckets`): the whole program compiled
    /// for padded static sizes of its symbols. A run whose sizes fit one
    /// runs it (the smallest that fits) instead of the plan's instructions;
    /// a larger run executes the plan on the CPU.
    pub buckets: Vec<AccelBucket>,
    /// What the compiler estimated for a sharded plan (`--mesh`), as
    /// `kiln compile --report` printed it; shown by `kiln inspect`.
    /// Informational: nothing at run time reads it.
    pub estimate: Option<ShardEstimate>,
}

/// The compiler's cost model applied to a sharded plan: one step on one
/// device (see `kiln_passes::shard::cost`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardEstimate {
    /// FLOPs one device computes, and the time at the model's rate.
    pub flops: f64,
    pub compute_s: f64,
    /// Bytes one device sends over the step's collectives, and their time.
    pub comm_bytes: f64,
    pub comm_s: f64,
    /// Weight bytes one device holds.
    pub weight_bytes: u64,
    /// The most activation bytes one device holds at once.
    pub activation_bytes: u64,
    /// Each resharding kiln placed: collective, where, bytes of the whole tensor.
    pub collectives: Vec<(String, String, u64)>,
    /// `--shard auto`'s search: cost model, strategies, per-layer choices.
    pub decisions: Vec<String>,
}

/// One shape bucket: the program as one StableHLO executable for the padded
/// sizes `sizes` of the plan's symbols. Its arguments are the plan's input
/// and weight tensors, its results the plan's output tensors; the runtime
/// pads each argument with zeros to `arg_shapes` and slices each result from
/// `result_shapes` back to the run's shape (the compiler proved that padding
/// changes no element the slice keeps, masking the ops that combine along a
/// padded axis with the run's true sizes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccelBucket {
    /// Per plan symbol (in [`Plan::symbols`] order): the size compiled for.
    pub sizes: Vec<u64>,
    pub segment: AccelSegment,
    /// Static shapes of `segment.args` and `segment.results` in `@main`.
    pub arg_shapes: Vec<Vec<u64>>,
    pub result_shapes: Vec<Vec<u64>>,
    /// `@main`'s arguments after `segment.args`: one 0-d i64 each, the
    /// run's value of the plan symbol at this index (the true size the
    /// program's masks compare with). Distinct.
    pub true_sizes: Vec<u32>,
}

/// A device mesh: named axes (major to minor) and the device id at each
/// mesh position (row-major; empty: the client's first `size` devices).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshDecl {
    pub axes: Vec<MeshAxisDecl>,
    pub devices: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshAxisDecl {
    pub name: String,
    pub size: u32,
}

impl MeshDecl {
    /// Number of devices (saturating: validation bounds it).
    pub fn size(&self) -> u64 {
        self.axes.iter().fold(1u64, |n, a| n.saturating_mul(u64::from(a.size)))
    }
}

/// How one segment argument or result is split over the mesh: per dim, the
/// mesh axes (indices into [`MeshDecl::axes`], major to minor) it is split
/// over; axes named nowhere replicate it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSharding {
    pub dims: Vec<Vec<u32>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccelSegment {
    /// StableHLO as MLIR text (generic op form) with one `func.func @main`.
    pub mlir: String,
    /// Plan tensors passed as `@main`'s arguments, in order. Weight tensors
    /// among them are uploaded once per session and stay on the device.
    pub args: Vec<u32>,
    /// Plan tensors (in the arena) receiving `@main`'s results, in order.
    pub results: Vec<u32>,
    /// The IR ops inside, for `kiln inspect`.
    pub ops: Vec<String>,
    /// With a mesh: the sharding of each argument, then of each result
    /// (parallel to `args` and `results`); empty otherwise.
    pub arg_shardings: Vec<TensorSharding>,
    pub result_shardings: Vec<TensorSharding>,
    /// Index arguments the delegate checks on the host before upload.
    pub index_checks: Vec<IndexCheck>,
}

/// An `@main` argument holding indices into a dimension of size `dim`
/// inside the segment (a gather's or `index_put`'s indices that come from a
/// program input or a CPU instruction). The device would clamp or skip an
/// index out of range, so before upload the delegate checks every element
/// is in `[-dim, dim)` and fails as the CPU kernel `kernel` does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexCheck {
    pub arg: u32,
    pub dim: u64,
    pub kernel: IndexKernel,
    /// The indexing op, for the error (`gather from embedding at model.py:12`).
    pub origin: String,
}

/// The CPU kernel whose out-of-range error an [`IndexCheck`] reproduces.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexKernel {
    Gather,
    GatherElements,
    IndexGather,
    IndexPut,
}

impl IndexKernel {
    pub fn name(self) -> &'static str {
        match self {
            IndexKernel::Gather => "gather",
            IndexKernel::GatherElements => "gather_elements",
            IndexKernel::IndexGather => "index_gather",
            IndexKernel::IndexPut => "index_put",
        }
    }

    /// The CPU kernel's message for index `i` into a dimension of size `dim`.
    pub fn out_of_range(self, i: i64, dim: u64) -> String {
        match self {
            IndexKernel::Gather => format!("index {i} out of range for axis of size {dim}"),
            _ => format!("index {i} out of range for a dimension of size {dim}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuFallback {
    pub instr: u32,
    pub reason: String,
}
