//! The execution plan: tables indexed by `u32`, fixed at compile time.
//!
//! Nothing here is looked up by string at load or run time: instructions name
//! their tensors by index, tensors name their storage by offset, dimensions name
//! their expressions by index. The loader validates every index before use.

pub use kiln_kernels::{BinaryOp, DType, PadMode, PoolKind, RandomDist, ReduceKind, ResizeMode, UnaryOp};
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
}

/// A shape symbol bound at run time: from an input dimension, or, when a
/// [`Kernel::BindDim`] instruction names it, from data during the run.
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
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    pub kernel: Kernel,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
    /// Human-readable origin (`linear from fc1 at model.py:12`) for error messages.
    pub origin: String,
}

/// The kernel an instruction runs, with its compile-time parameters. Shapes come
/// from the tensors' declared shapes, evaluated per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Kernel {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Where,
    Cast,
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
    MatMul,
    Linear,
    Conv {
        stride: Vec<u32>,
        padding: Vec<u32>,
        dilation: Vec<u32>,
        groups: u32,
    },
    BatchNorm {
        eps: f64,
    },
    LayerNorm {
        normalized_rank: u32,
        eps: f64,
    },
    Softmax {
        axis: u32,
        log: bool,
    },
    Reduce {
        kind: ReduceKind,
        axes: Vec<u32>,
    },
    ArgMax {
        axis: u32,
    },
    /// `divisor` (avg only): torch's `divisor_override`. `PoolKind::ArgMax`
    /// writes max pooling's i64 indices instead of its values.
    Pool {
        kind: PoolKind,
        kernel: Vec<u32>,
        stride: Vec<u32>,
        padding: Vec<u32>,
        dilation: Vec<u32>,
        count_include_pad: bool,
        divisor: Option<i64>,
    },
    AdaptiveAvgPool,
    Attention {
        causal: bool,
        scale: Option<f64>,
    },
    /// Same bytes, new shape. A no-op when input and output share storage.
    Copy,
    Expand,
    Permute {
        perm: Vec<u32>,
    },
    Slice {
        axis: u32,
        start: u64,
        step: u64,
    },
    Concat {
        axis: u32,
    },
    Gather {
        axis: u32,
    },
    Fill {
        value: f64,
    },
    Arange {
        start: f64,
        step: f64,
    },
    /// Calls accelerator segment `segment` of the [`AccelProgram`] section
    /// (PJRT): inputs are its arguments, outputs its results, in order.
    Accel {
        segment: u32,
    },
    CumSum {
        axis: u32,
    },
    ArgMin {
        axis: u32,
    },
    /// The first `out.shape[axis]` elements in sorted order, or their positions.
    Sort {
        axis: u32,
        descending: bool,
        indices: bool,
    },
    Pad {
        lo: Vec<i64>,
        hi: Vec<i64>,
        interior: Vec<i64>,
        mode: PadMode,
        value: f64,
    },
    Flip {
        axes: Vec<u32>,
    },
    /// Resizes the trailing `spatial` dims to the output's.
    Resize {
        mode: ResizeMode,
        align_corners: bool,
        spatial: u32,
        scales: Vec<f64>,
    },
    /// Numbers drawn from `dist` by the session's seeded generator; `stream`
    /// tells the program's random instructions apart (see `kiln_kernels::random`).
    Random {
        dist: RandomDist,
        stream: u32,
    },
    /// `torch.gather` along `axis` (operands: data, index).
    GatherElements {
        axis: u32,
    },
    /// `torch.scatter` / `scatter_reduce` along `axis` (data, index, src).
    ScatterElements {
        axis: u32,
        reduce: Option<ReduceKind>,
        include_self: bool,
    },
    /// Advanced indexing of axes `axis..` by one index tensor each (data, indices..).
    IndexGather {
        axis: u32,
    },
    /// `index_put` (data, values, indices..).
    IndexPut {
        axis: u32,
        accumulate: bool,
    },
    /// [`Kernel::Slice`] starting `back` elements before the end of `axis`
    /// (torch's negative start on a dynamic dimension; clamped to 0).
    SliceFromEnd {
        axis: u32,
        back: u64,
        step: u64,
    },
    /// Binds data-dependent symbol `symbol` to the value of its one operand
    /// (a 0-d i64), after checking it against the symbol's bounds; the
    /// session then re-evaluates the shapes. No outputs.
    BindDim {
        symbol: u32,
    },
    /// The coordinates of the operand's nonzero elements (i64 `[count, rank]`).
    NonZero,
    /// Loop exit: when its one operand (a 1-element bool) is false, the run
    /// continues at instruction `target` (just past its loop's [`Kernel::Jump`])
    /// instead of the next one. No outputs.
    JumpIfFalse {
        target: u32,
    },
    /// A loop's back edge: the run continues at instruction `target`, the
    /// loop's first instruction. No operands or outputs.
    Jump {
        target: u32,
    },
}

impl Kernel {
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::Unary(_) => "unary",
            Kernel::Binary(_) => "binary",
            Kernel::Where => "where",
            Kernel::Cast => "cast",
            Kernel::Clamp { .. } => "clamp",
            Kernel::MatMul => "matmul",
            Kernel::Linear => "linear",
            Kernel::Conv { .. } => "conv",
            Kernel::BatchNorm { .. } => "batch_norm",
            Kernel::LayerNorm { .. } => "layer_norm",
            Kernel::Softmax { log: false, .. } => "softmax",
            Kernel::Softmax { log: true, .. } => "log_softmax",
            Kernel::Reduce { .. } => "reduce",
            Kernel::ArgMax { .. } => "argmax",
            Kernel::Pool { kind: PoolKind::Max, .. } => "max_pool",
            Kernel::Pool { kind: PoolKind::Avg, .. } => "avg_pool",
            Kernel::Pool { kind: PoolKind::ArgMax, .. } => "max_pool_indices",
            Kernel::AdaptiveAvgPool => "adaptive_avg_pool",
            Kernel::Attention { .. } => "attention",
            Kernel::Copy => "copy",
            Kernel::Expand => "expand",
            Kernel::Permute { .. } => "permute",
            Kernel::Slice { .. } | Kernel::SliceFromEnd { .. } => "slice",
            Kernel::Concat { .. } => "concat",
            Kernel::Gather { .. } => "gather",
            Kernel::Fill { .. } => "fill",
            Kernel::Arange { .. } => "arange",
            Kernel::Accel { .. } => "accel",
            Kernel::CumSum { .. } => "cumsum",
            Kernel::ArgMin { .. } => "argmin",
            Kernel::Sort { .. } => "sort",
            Kernel::Pad { .. } => "pad",
            Kernel::Flip { .. } => "flip",
            Kernel::Resize { .. } => "resize",
            Kernel::Random { .. } => "random",
            Kernel::GatherElements { .. } => "gather_elements",
            Kernel::ScatterElements { .. } => "scatter_elements",
            Kernel::IndexGather { .. } => "index_gather",
            Kernel::IndexPut { .. } => "index_put",
            Kernel::BindDim { .. } => "bind_dim",
            Kernel::NonZero => "nonzero",
            Kernel::JumpIfFalse { .. } => "jump_if_false",
            Kernel::Jump { .. } => "jump",
        }
    }

    /// Allowed (min, max) operand counts; checked at load.
    pub fn operand_count(&self) -> (usize, usize) {
        match self {
            Kernel::Binary(_) | Kernel::MatMul | Kernel::Gather { .. } => (2, 2),
            Kernel::Where => (3, 3),
            Kernel::Linear | Kernel::Conv { .. } => (2, 3),
            Kernel::BatchNorm { .. } => (5, 5),
            Kernel::LayerNorm { .. } => (1, 3),
            Kernel::Attention { .. } => (3, 4),
            Kernel::Concat { .. } => (1, u32::MAX as usize),
            Kernel::Fill { .. } | Kernel::Arange { .. } | Kernel::Random { .. } | Kernel::Jump { .. } => (0, 0),
            Kernel::GatherElements { .. } => (2, 2),
            Kernel::ScatterElements { .. } => (3, 3),
            Kernel::IndexGather { .. } => (2, u32::MAX as usize),
            Kernel::IndexPut { .. } => (3, u32::MAX as usize),
            Kernel::Accel { .. } => (0, u32::MAX as usize),
            _ => (1, 1),
        }
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
/// programs run through a PJRT plugin, called by [`Kernel::Accel`] instructions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccelProgram {
    pub segments: Vec<AccelSegment>,
    /// Instructions left on the CPU in a plan for an accelerator, and why
    /// (shown by `kiln inspect`).
    pub cpu_fallbacks: Vec<CpuFallback>,
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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuFallback {
    pub instr: u32,
    pub reason: String,
}
