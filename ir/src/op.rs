//! The closed set of operations.
//!
//! A small set of primitives plus the few composites worth a dedicated kernel
//! (matmul, linear, conv, norms, attention, pooling). Passes dispatch with `match`.
//! Axes are always normalised (non-negative, `< rank`) by the importer.
//! Optional operands are trailing: their presence is the operand count (see
//! [`Op::operand_count`]).
//!
//! Each op is declared once, as a row of the table below (`op_table!`, see
//! `op_table.rs`): its fields, its plan opcode, its text spelling and its
//! flags. The enum, `name`, `plan_opcode`, `has_effect`, `is_layout_only`,
//! `is_channels_first`,
//! [`text_forms`] and the text form's parsing and printing come from the
//! rows. Adding an op: a row here, a plan opcode in `kiln_isa::opcode` (and
//! its `Kernel` row in the runtime), its shape inference (`infer.rs`), its
//! lowering arm (`compiler/src/lower.rs`) and its kernel.

use crate::{DType, Dim};
pub use kiln_isa::{
    Activation, BinaryOp, Epilogue, FusedOp, Layout, LinalgOp, Opcode, PadMode, PoolKind, RandomDist, ReduceKind,
    Residual, ResizeMode, ScanKind, UnaryOp,
};

/// The per-tensor int8 quantization of an i8 activation passed between
/// quantized layers: `q = clamp(rint(x · f32(1 / scale)) + zero_point,
/// -128, 127)` (torch's `quantize_per_tensor`; `scale` an f32 value,
/// `zero_point` in `[-128, 127]`; a uint8 zero point `z` is `z − 128`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct QParams {
    pub scale: f64,
    pub zero_point: i64,
}

impl QParams {
    /// Whether these are parameters an int8 tensor can have.
    pub fn is_valid(&self) -> bool {
        let s = self.scale;
        s.is_finite() && s > 0.0 && (s as f32) as f64 == s && (-128..=127).contains(&self.zero_point)
    }
}

op_table! {
    /// `x -> f(x)`, elementwise.
    [Unary(UnaryOp)] opcode Unary, leaf();
    /// `(a, b) -> a op b` with numpy broadcasting; both operands share a dtype.
    [Binary(BinaryOp)] opcode Binary, leaf();
    /// `(cond: bool, a, b) -> cond ? a : b`, broadcasting.
    [Where] opcode Where, text("where");
    [Cast { to: DType }] opcode Cast, text("cast");
    /// Clamp to `[min, max]`; either bound may be absent.
    [Clamp { min: Option<f64>, max: Option<f64> }] opcode Clamp, text("clamp");
    /// `[.., M, K] x [.., K, N] -> [.., M, N]`, batch dims broadcast. Rank-1
    /// operands follow torch.matmul (prepend/append a unit dim, then drop it).
    [MatMul] opcode MatMul, text("matmul");
    /// Mixture-of-experts products: `(x[S, K], w[E, K, N], offs[E]) -> [S, N]`,
    /// rows `offs[e-1]..offs[e]` (sorted by expert) times `w[e]`, later rows zero.
    [GroupedMatMul] opcode GroupedMatMul, text("grouped_matmul");
    /// `(x[.., K], w[N, K] [, b[N]]) -> x wᵀ + b`.
    [Linear] opcode Linear, text("linear"), composite;
    /// N-d convolution, NC(D)HW layout: `(x, w[Cout, Cin/groups, k..] [, b[Cout]])`.
    [Conv { stride: Vec<i64>, padding: Vec<i64>, dilation: Vec<i64>, groups: i64 }] opcode Conv, text("conv"), channels_first;
    /// Inference batch norm over axis 1: `(x, mean, var, weight, bias)`.
    [BatchNorm { eps: f64 }] opcode BatchNorm, text("batch_norm"), channels_first, composite;
    /// Normalises the last `normalized_rank` dims: `(x [, weight [, bias]])`.
    [LayerNorm { normalized_rank: usize, eps: f64 }] opcode LayerNorm, text("layer_norm"), composite;
    [Softmax { axis: usize }] opcode Softmax, text("softmax"), composite;
    [LogSoftmax { axis: usize }] opcode Softmax, text("log_softmax"), composite;
    [Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
        keep_dims: bool,
    }] opcode Reduce, select(
        Sum => "reduce_sum", Mean => "reduce_mean", Max => "reduce_max", Min => "reduce_min", Prod => "reduce_prod",
    );
    /// Index of the maximum along `axis` (first on ties), as i64.
    [ArgMax { axis: usize, keep_dims: bool }] opcode ArgMax, text("argmax");
    /// Spatial pooling over the trailing `kernel.len()` dims. With `layout`
    /// channels-last (made by the layout pass; 2-d max/avg values only) the
    /// input and result are `[N, H, W, C]` (text: `layout=channels_last`,
    /// omitted when channels-first).
    [Pool {
        kind: PoolKind,
        kernel: Vec<i64>,
        stride: Vec<i64>,
        padding: Vec<i64>,
        dilation: Vec<i64>,
        ceil_mode: bool,
        count_include_pad: bool,
        /// Avg only: divide each window's sum by this instead of its tap
        /// count (torch's `divisor_override`); never 0.
        divisor: Option<i64>,
        layout: Layout,
    }] opcode Pool, select(Max => "max_pool", Avg => "avg_pool", ArgMax => "max_pool_indices"), channels_first, composite;
    /// Adaptive average pooling of the trailing `output.len()` dims.
    [AdaptiveAvgPool { output: Vec<i64> }] opcode AdaptiveAvgPool, text("adaptive_avg_pool"), channels_first, composite;
    /// Scaled dot-product attention: `(q[.., L, E], k[.., S, E], v[.., S, Ev] [, mask])`.
    /// A bool mask keeps `true` positions; a float mask is added to the scores.
    [Attention { causal: bool, scale: Option<f64> }] opcode Attention, text("attention"), composite;
    /// Same elements, new shape (row-major).
    [Reshape { shape: Vec<Dim> }] opcode Copy, text("reshape"), layout_only;
    /// Broadcast to `shape` (numpy rules).
    [Expand { shape: Vec<Dim> }] opcode Expand, text("expand"), layout_only;
    [Permute { perm: Vec<usize> }] opcode Permute, text("permute"), layout_only;
    /// Elements `start, start+step, ..` below `end` along `axis`. `end` is clamped
    /// to the dimension at run time (`i64::MAX` means "to the end").
    [Slice { axis: usize, start: i64, end: i64, step: i64 }] opcode Slice, text("slice"), layout_only;
    [Concat { axis: usize }] opcode Concat, text("concat");
    /// `(data, indices: i64) -> data` indexed along `axis` by every index; the
    /// indices' shape replaces that axis (index_select, embedding).
    [Gather { axis: usize }] opcode Gather, text("gather");
    /// A tensor of `shape` filled with `value`.
    [Full { value: f64, dtype: DType, shape: Vec<Dim> }] opcode Fill, text("full");
    /// `start, start+step, ...` with `len` elements.
    [Arange { start: f64, step: f64, len: Dim, dtype: DType }] opcode Arange, text("arange");
    /// Inclusive prefix sum along `axis`.
    [CumSum { axis: usize }] opcode CumSum, text("cumsum");
    /// An inclusive scan along `axis` other than a sum: running product,
    /// log-sum-exp, max or min (same dtype), or the running max/min's index
    /// (i64).
    [Scan { axis: usize, kind: ScanKind }] opcode Scan, text("scan");
    /// One result of a `torch.linalg` factorisation of the batch of
    /// matrices in the last two dims of the first operand (`kiln_isa::LinalgOp`
    /// says which; solves take the right-hand side as a second operand with
    /// the same batch dims). `upper`: Cholesky's factor or the solves'
    /// triangle; `left`: `A X = B` rather than `X A = B`; `unit`: a unit
    /// diagonal (triangular solve); `complex`: complex matrices, each
    /// float operand and complex-valued result an f32/f64 tensor with a
    /// trailing (re, im) dim of 2.
    [Linalg { op: LinalgOp, upper: bool, left: bool, unit: bool, complex: bool }] opcode Linalg, text("linalg");
    /// A run-time check: the run fails with `message` unless every element
    /// of the operand is nonzero. No result; kept by dead-code elimination.
    [Assert { message: String }] opcode Assert, text("assert"), effect;
    /// Index of the minimum along `axis` (first on ties), as i64.
    [ArgMin { axis: usize, keep_dims: bool }] opcode ArgMin, text("argmin");
    /// The first `k` elements along `axis` in sorted order (stable; NaN sorts
    /// above everything, as in torch): their values, or with `indices` their
    /// positions as i64. `sort` is `k` = the whole axis, `topk` descending.
    [Sort { axis: usize, k: Dim, descending: bool, indices: bool }] opcode Sort, text("sort");
    /// Pads every axis by `lo`/`hi` elements (negative: crops) with `interior`
    /// elements between neighbours; `mode` says what fills the new positions.
    [Pad { lo: Vec<i64>, hi: Vec<i64>, interior: Vec<i64>, mode: PadMode, value: f64 }] opcode Pad, text("pad");
    /// Reverses the order of elements along each of `axes`.
    [Flip { axes: Vec<usize> }] opcode Flip, text("flip");
    /// Resizes the trailing `size.len()` dims (NC + spatial layout). A
    /// `scales` entry > 0 is the user's scale factor, which torch uses instead
    /// of `in/out` to map output positions back (when not `align_corners`).
    [Upsample {
        mode: ResizeMode,
        align_corners: bool,
        size: Vec<Dim>,
        scales: Vec<f64>,
    }] opcode Resize, select(Nearest => "upsample_nearest", Linear => "upsample_linear"), channels_first;
    /// `torch.gather`: `(data, index: i64) -> out` of `index`'s shape with
    /// `out[p] = data[p with p[axis] = index[p]]`; `index` has `data`'s rank
    /// and fits inside it on every other axis.
    [GatherElements { axis: usize }] opcode GatherElements, text("gather_elements");
    /// `torch.scatter` / `scatter_add` / `scatter_reduce`: `(data, index: i64,
    /// src) -> data` with `src[p]` written to (or, with `reduce`, combined
    /// into) position `p with p[axis] = index[p]`, for every `p` in `index`'s
    /// shape (which fits inside `src`, and inside `data` off `axis`). Without
    /// `include_self`, positions that receive anything start from the first
    /// value received instead of `data`'s. A negative index counts from the
    /// end of `data`'s axis (the importer relies on it for dynamic dims).
    [ScatterElements {
        axis: usize,
        reduce: Option<ReduceKind>,
        include_self: bool,
    }] opcode ScatterElements, custom(
        Op::ScatterElements { .. } => "scatter_elements" ["axis", "reduce", "include_self"],
    );
    /// Advanced indexing (`x[i0, i1, ..]`): `(data, idx_0, .., idx_k-1)`, the
    /// indices i64 of one common shape `B`, index axes `axis..axis+k`; the
    /// result is `data.shape[..axis] ++ B ++ data.shape[axis+k..]`.
    [IndexGather { axis: usize }] opcode IndexGather, text("index_gather");
    /// `index_put`: `(data, values, idx_0, .., idx_k-1)` → `data` with `values`
    /// (shaped like [`Op::IndexGather`]'s result) written to, or with
    /// `accumulate` added to, the indexed positions.
    [IndexPut { axis: usize, accumulate: bool }] opcode IndexPut, text("index_put");
    /// A tensor of `shape` drawn from `dist` by the runtime's seeded
    /// counter-based generator. `stream` (unique per random op of a program,
    /// assigned at import) keeps two random ops from drawing the same numbers;
    /// the session's seed and call count make each run draw new ones. Never
    /// folded, merged or evaluated at compile time.
    [Random { dist: RandomDist, dtype: DType, shape: Vec<Dim>, stream: u32 }] opcode Random, custom(
        Op::Random { dist: RandomDist::Uniform { .. }, .. } =>
            "random_uniform" ["low", "high", "dtype", "shape", "stream"],
        Op::Random { dist: RandomDist::Normal { .. }, .. } =>
            "random_normal" ["mean", "std", "dtype", "shape", "stream"],
        Op::Random { dist: RandomDist::Int { .. }, .. } =>
            "random_int" ["low", "high", "dtype", "shape", "stream"],
        Op::Random { dist: RandomDist::Perm, .. } => "random_perm" ["dtype", "shape", "stream"],
    );
    /// `(count: 0-d integer) -> ()`: binds the data-dependent `symbol` to the
    /// operand's run-time value, which must lie in the symbol's bounds (a
    /// run-time error otherwise). Nodes whose types mention `symbol` come
    /// after it in the schedule; it has no result and is never removed.
    [BindDim { symbol: crate::SymbolId }] opcode BindDim, text("bind_dim"), effect;
    /// `x -> i64[count, rank]`: the coordinates of `x`'s nonzero elements in
    /// row-major order. `count` is a data-dependent symbol, bound (by an
    /// [`Op::BindDim`] of the number of nonzero elements) before this node runs.
    [NonZero { count: crate::SymbolId }] opcode NonZero, text("nonzero");
    /// torch's `while_loop`: operands are the `carried` initial loop values,
    /// then read-only values passed to every iteration. Both nested graphs take
    /// all operands as their inputs (the carried ones at their current value):
    /// `cond` returns one 1-element bool, and while it is true `body` runs and
    /// its outputs (one per carried value, same dtype and shape) become the
    /// carried values. The results are the final carried values. Nested graphs
    /// use their parent's symbols (a copy of its table, same ids). No trip
    /// limit: a loop whose condition never turns false runs forever, as in torch.
    [While { carried: usize, cond: Region, body: Region }] opcode none, text("while");
    /// Elementwise ops fused into one pass over memory: `program` (see
    /// `kiln_isa::fused`) runs over the operands, each broadcast to the
    /// result's shape (the broadcast of theirs); the result is its last
    /// register. Made by the elementwise fusion pass for the CPU target.
    [Fused { program: Vec<FusedOp> }] opcode Fused, text("fused");
    /// RMS normalisation of the last `normalized_rank` dims: `(x [, weight])`,
    /// `x / sqrt(mean(x²) + eps) · weight`. Recognised from its decomposed
    /// form by the norm fusion pass (CPU target).
    [RmsNorm { normalized_rank: usize, eps: f64 }] opcode RmsNorm, text("rms_norm");
    /// A linear layer with quantized weights, in `kiln_kernels::quant`'s
    /// storage: `(x f32[.., K], w, scales f32[N, K / group] [, zero_points
    /// i8[N, K / group]] [, bias f32[N]]) -> f32[.., N]`, the weight `w`
    /// i8`[N, K]` (`bits` 8) or u8`[N, K / 2]` (`bits` 4: two signed nibbles
    /// a byte, element `2j` low); `zero_points` says whether that operand is
    /// there. `dynamic`: activations quantized per row to int8 (torchao's
    /// per-token symmetric rule; int8 weights, per channel, symmetric);
    /// with `asymmetric` (only with `dynamic`), each row gets a scale and
    /// zero point from its range instead (torch's `MinMaxObserver` rule).
    /// `act_scale` (static, from calibration; not with `dynamic`): every
    /// activation quantized to int8 with that scale (an f32 value) and
    /// `act_zero_point` in `[-128, 127]` (torch's `quantize_per_tensor`).
    [QuantLinear {
        bits: u8,
        group: usize,
        zero_points: bool,
        dynamic: bool,
        asymmetric: bool,
        act_scale: Option<f64>,
        act_zero_point: i64,
    }] opcode QuantLinear, custom(
        Op::QuantLinear { .. } =>
            "quant_linear" ["bits", "group", "zero_points", "dynamic", "asymmetric", "act_scale", "act_zero_point"],
    );
    /// A convolution with int8 weights, one scale per output channel
    /// (symmetric): `(x f32[N, C, spatial..], w i8[Cout, C/groups, k..],
    /// scales f32[Cout] [, bias f32[Cout]])`, NC(D)HW like [`Op::Conv`].
    /// Activations: static (`act_scale`, `act_zero_point`, as
    /// [`Op::QuantLinear`]'s), or `dynamic`: each image quantized with its
    /// own scale (and zero point with `asymmetric`), the rule a dynamic
    /// linear layer applies to a row over all of the image's values
    /// (`kiln_kernels::quant::qconv`); int8 activations need a dense
    /// convolution (`groups` 1). Without them (weight-only) the runtime
    /// dequantizes the weight once at load and runs the f32 convolution.
    /// `epilogue` as [`Op::ConvFused`]'s: its `bias` flag says whether the
    /// bias operand is there, then an activation and a residual operand
    /// (made by the epilogue fusion pass; CPU). With `layout` channels-last
    /// (the layout pass; 2-d only) `x`, the residual and the result are
    /// `[N, H, W, C]`; the weight keeps its shape.
    ///
    /// int8 activations between layers (the `quant_acts` pass; CPU): with
    /// static activations, `x` may be i8, the input already quantized with
    /// `act_scale` / `act_zero_point`; with `out_quant` (int8 activations,
    /// channels-last, no residual) the result is i8: the f32 value the layer
    /// computes (scale, bias, activation), quantized with those parameters
    /// as torch's `quantize_per_tensor` rounds (text: `out_scale`,
    /// `out_zero_point`, omitted when absent). int8 residuals (dense,
    /// channels-last, int8 activations): with `res_quant` the residual
    /// operand is i8, dequantized as torch's `dequantize_per_tensor` does —
    /// `(f32(q) − zero_point) · scale` — before the add (text: `res_scale`,
    /// `res_zero_point`); a dense layer with a residual may then give an i8
    /// result too: torch's int8 add with requantization, the conv's output
    /// kept in f32 until the sum is quantized (PT2E X86's conv-add-relu).
    [QuantConv {
        stride: Vec<i64>,
        padding: Vec<i64>,
        dilation: Vec<i64>,
        groups: i64,
        epilogue: Epilogue,
        layout: Layout,
        dynamic: bool,
        asymmetric: bool,
        act_scale: Option<f64>,
        act_zero_point: i64,
        out_quant: Option<QParams>,
        res_quant: Option<QParams>,
    }] opcode QuantConv, text("quant_conv"), channels_first;
    /// [`Op::Conv`] with a fused epilogue (`kiln_isa::epilogue`): `(x, w
    /// [, b] [, residual])`, as `epilogue`'s flags say; the residual is
    /// shaped like the result. f32. Made by the epilogue fusion pass (CPU).
    /// With `layout` channels-last (made by the layout pass; 2-d only) `x`,
    /// the residual and the result are `[N, H, W, C]`; the weight keeps its
    /// `[Cout, Cin/groups, kh, kw]` (text: `layout=channels_last`, omitted
    /// when channels-first).
    [ConvFused {
        stride: Vec<i64>,
        padding: Vec<i64>,
        dilation: Vec<i64>,
        groups: i64,
        epilogue: Epilogue,
        layout: Layout,
    }] opcode ConvFused, text("conv_fused"), channels_first;
    /// [`Op::Linear`] with a fused epilogue: `(x, w[N, K] [, b[N]] [,
    /// residual])`. f32. Made by the epilogue fusion pass (CPU).
    [LinearFused { epilogue: Epilogue }] opcode LinearFused, text("linear_fused");
    /// Linear layers that read the same `x`, as one: `(x, w[N, K] [, b[N]])`
    /// with `N` the sum of `columns`, and one result per entry of `columns`,
    /// `[.., columns[i]]`, the columns of `x wᵀ (+ b)` from `columns[..i]`'s
    /// sum on, with `epilogue`'s activation (no residual). f32. Made by the
    /// `fuse_shared_input` pass (CPU); one `linear_fused` call with several
    /// outputs.
    [LinearSplit { epilogue: Epilogue, columns: Vec<i64> }] opcode LinearFused, text("linear_split");
}

/// A nested graph held by an op ([`Op::While`]'s condition and body).
/// Equality is by canonical text, the IR's definition of "same graph".
#[derive(Clone, Debug)]
pub struct Region(pub Box<crate::Graph>);

impl Region {
    pub fn new(g: crate::Graph) -> Region {
        Region(Box::new(g))
    }
}

impl std::ops::Deref for Region {
    type Target = crate::Graph;
    fn deref(&self) -> &crate::Graph {
        &self.0
    }
}

impl std::ops::DerefMut for Region {
    fn deref_mut(&mut self) -> &mut crate::Graph {
        &mut self.0
    }
}

impl PartialEq for Region {
    fn eq(&self, other: &Region) -> bool {
        crate::text::print(self) == crate::text::print(other)
    }
}

impl Op {
    /// Allowed operand counts, inclusive (the plan opcode's, from the one
    /// table). Optional operands are trailing.
    pub fn operand_count(&self) -> (usize, usize) {
        let many = |n: u32| if n == kiln_isa::opcode::MANY { usize::MAX } else { n as usize };
        match (self, self.plan_opcode()) {
            (Op::While { carried, .. }, _) => (*carried, usize::MAX),
            (_, Some(code)) => {
                let (lo, hi) = code.operands();
                (lo as usize, many(hi))
            }
            (_, None) => (0, usize::MAX),
        }
    }
}
