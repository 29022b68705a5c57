//! The plan's instruction set: every opcode, once, with its stable code.
//!
//! One row per opcode gives its numeric code (what the artifact stores; never
//! reused, never renumbered), its name (messages, `kiln inspect`, profiles),
//! its instruction kind, and how many operands and outputs it takes (checked
//! at load). The runtime's typed parameters (`kiln_runtime::format::Kernel`)
//! and the IR's ops refer to these rows; nothing else numbers or names them.

/// How the runtime executes an instruction; each kind is handled in one place.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum InstrKind {
    /// A kernel from the kernel table: reads its operands, writes its outputs.
    Call,
    /// An accelerator segment run by the session's delegate (PJRT).
    Delegate,
    /// Binds a data-dependent shape symbol from a computed 0-d integer.
    BindDim,
    /// A loop's exit: continue past the loop when a bool is false.
    JumpIfFalse,
    /// A loop's back edge.
    Jump,
    /// Generated machine code from the artifact's native section, with its
    /// portable fused program as the fallback.
    Native,
    /// Generated machine code for a row-wise kernel (softmax, a norm, a
    /// last-axis reduction), with that kernel call as the fallback.
    NativeKernel,
}

/// "Any number": the upper bound of a variadic operand or output list.
pub const MANY: u32 = u32::MAX;

/// The most outputs of one `linear_fused` (a GEMM split into column ranges):
/// the kernel keeps their ranges in a fixed array (nothing allocated per run).
pub const LINEAR_SPLIT_MAX: u32 = 8;

macro_rules! opcodes {
    ( $( $(#[$meta:meta])* $variant:ident = $code:literal, $name:literal, $kind:ident,
         operands $omin:literal ..= $omax:expr, outputs $rmin:literal ..= $rmax:expr; )* ) => {
        /// A plan opcode. See the module doc; the table below is the definition.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum Opcode {
            $( $(#[$meta])* $variant = $code, )*
        }

        impl Opcode {
            pub const ALL: &'static [Opcode] = &[$(Opcode::$variant),*];

            pub const fn code(self) -> u16 {
                self as u16
            }

            pub fn from_code(code: u16) -> Result<Opcode, crate::UnknownCode> {
                match code {
                    $( $code => Ok(Opcode::$variant), )*
                    _ => Err(crate::UnknownCode { what: "opcode", code }),
                }
            }

            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$variant => $name, )* }
            }

            pub const fn kind(self) -> InstrKind {
                match self { $( Opcode::$variant => InstrKind::$kind, )* }
            }

            /// Allowed operand counts, inclusive.
            pub const fn operands(self) -> (u32, u32) {
                match self { $( Opcode::$variant => ($omin, $omax), )* }
            }

            /// Allowed output counts, inclusive.
            pub const fn outputs(self) -> (u32, u32) {
                match self { $( Opcode::$variant => ($rmin, $rmax), )* }
            }
        }

        impl std::fmt::Display for Opcode {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

opcodes! {
    Unary = 0, "unary", Call, operands 1..=1, outputs 1..=1;
    Binary = 1, "binary", Call, operands 2..=2, outputs 1..=1;
    Where = 2, "where", Call, operands 3..=3, outputs 1..=1;
    Cast = 3, "cast", Call, operands 1..=1, outputs 1..=1;
    Clamp = 4, "clamp", Call, operands 1..=1, outputs 1..=1;
    MatMul = 5, "matmul", Call, operands 2..=2, outputs 1..=1;
    /// `(x, w [, b])`.
    Linear = 6, "linear", Call, operands 2..=3, outputs 1..=1;
    /// `(x, w [, b])`.
    Conv = 7, "conv", Call, operands 2..=3, outputs 1..=1;
    /// `(x, mean, var, weight, bias)`.
    BatchNorm = 8, "batch_norm", Call, operands 5..=5, outputs 1..=1;
    /// `(x [, weight [, bias]])`.
    LayerNorm = 9, "layer_norm", Call, operands 1..=3, outputs 1..=1;
    Softmax = 10, "softmax", Call, operands 1..=1, outputs 1..=1;
    Reduce = 11, "reduce", Call, operands 1..=1, outputs 1..=1;
    ArgMax = 12, "argmax", Call, operands 1..=1, outputs 1..=1;
    /// Values, or (max pooling) values and indices: two outputs pool once.
    Pool = 13, "pool", Call, operands 1..=1, outputs 1..=2;
    AdaptiveAvgPool = 14, "adaptive_avg_pool", Call, operands 1..=1, outputs 1..=1;
    /// `(q, k, v [, mask])`.
    Attention = 15, "attention", Call, operands 3..=4, outputs 1..=1;
    /// Same bytes, new shape (the IR's reshape); a no-op when aliased.
    Copy = 16, "copy", Call, operands 1..=1, outputs 1..=1;
    Expand = 17, "expand", Call, operands 1..=1, outputs 1..=1;
    Permute = 18, "permute", Call, operands 1..=1, outputs 1..=1;
    Slice = 19, "slice", Call, operands 1..=1, outputs 1..=1;
    Concat = 20, "concat", Call, operands 1..=MANY, outputs 1..=1;
    Gather = 21, "gather", Call, operands 2..=2, outputs 1..=1;
    /// The IR's `full`.
    Fill = 22, "fill", Call, operands 0..=0, outputs 1..=1;
    Arange = 23, "arange", Call, operands 0..=0, outputs 1..=1;
    CumSum = 24, "cumsum", Call, operands 1..=1, outputs 1..=1;
    ArgMin = 25, "argmin", Call, operands 1..=1, outputs 1..=1;
    /// Values, indices, or both (one sort for a topk whose two results are used).
    Sort = 26, "sort", Call, operands 1..=1, outputs 1..=2;
    Pad = 27, "pad", Call, operands 1..=1, outputs 1..=1;
    Flip = 28, "flip", Call, operands 1..=1, outputs 1..=1;
    /// The IR's `upsample_*`.
    Resize = 29, "resize", Call, operands 1..=1, outputs 1..=1;
    /// Draws from the session's seeded generator (seed and run count come
    /// with the kernel context).
    Random = 30, "random", Call, operands 0..=0, outputs 1..=1;
    GatherElements = 31, "gather_elements", Call, operands 2..=2, outputs 1..=1;
    ScatterElements = 32, "scatter_elements", Call, operands 3..=3, outputs 1..=1;
    IndexGather = 33, "index_gather", Call, operands 2..=MANY, outputs 1..=1;
    IndexPut = 34, "index_put", Call, operands 3..=MANY, outputs 1..=1;
    SliceFromEnd = 35, "slice_from_end", Call, operands 1..=1, outputs 1..=1;
    NonZero = 36, "nonzero", Call, operands 1..=1, outputs 1..=1;
    /// A fused elementwise program (`kiln_isa::fused`) over its operands.
    Fused = 40, "fused", Call, operands 1..=MANY, outputs 1..=1;
    /// `(x [, weight])`.
    RmsNorm = 41, "rms_norm", Call, operands 1..=2, outputs 1..=1;
    /// A convolution with a fused epilogue (`kiln_isa::epilogue`):
    /// `(x, w [, bias] [, residual])`, as its epilogue's flags say.
    ConvFused = 42, "conv_fused", Call, operands 2..=4, outputs 1..=1;
    /// A linear with a fused epilogue: `(x, w[N, K] [, bias] [, residual])`.
    /// Several outputs (no residual): linear layers that read the same `x`
    /// as one GEMM over their weights concatenated along N, output `i`
    /// columns `N_0 + .. + N_(i-1)` on (its last dim `N_i`), the bias and
    /// activation applying per column as for one output.
    LinearFused = 43, "linear_fused", Call, operands 2..=4, outputs 1..=LINEAR_SPLIT_MAX;
    /// `(x, w, offs)`: one GEMM per expert's block of rows.
    GroupedMatMul = 70, "grouped_matmul", Call, operands 3..=3, outputs 1..=1;
    /// An inclusive scan along an axis other than a sum (`kiln_isa::ScanKind`).
    Scan = 90, "scan", Call, operands 1..=1, outputs 1..=1;
    /// Fails the run with its message unless every element of its operand
    /// is nonzero (torch's run-time checks: `_assert_async`,
    /// `_linalg_check_errors`).
    Assert = 91, "assert", Call, operands 1..=1, outputs 0..=0;
    /// A `torch.linalg` result (`kiln_isa::LinalgOp`): `(A [, B])`.
    Linalg = 92, "linalg", Call, operands 1..=3, outputs 1..=1;
    /// `(x, w, scales [, zero_points] [, bias])`: a linear layer with int8
    /// or int4 weights (`kiln_kernels::quant`'s storage), packed at load.
    QuantLinear = 80, "quant_linear", Call, operands 3..=5, outputs 1..=1;
    /// `(x, w, scales [, bias] [, residual])`: a convolution with int8
    /// weights (`kiln_kernels::quant::qconv`, or the f32 convolution of the
    /// weight dequantized at load when weight-only) and its epilogue.
    QuantConv = 81, "quant_conv", Call, operands 3..=5, outputs 1..=1;

    /// An accelerator segment: operands are its arguments, outputs its results.
    Delegate = 1000, "delegate", Delegate, operands 0..=MANY, outputs 0..=MANY;
    /// One 0-d i64 operand.
    BindDim = 1001, "bind_dim", BindDim, operands 1..=1, outputs 0..=0;
    /// One 1-element bool operand.
    JumpIfFalse = 1002, "jump_if_false", JumpIfFalse, operands 1..=1, outputs 0..=0;
    Jump = 1003, "jump", Jump, operands 0..=0, outputs 0..=0;
    /// A native function of the artifact's native section (operands as the
    /// fused program's, one output).
    NativeCall = 1004, "native_call", Native, operands 1..=MANY, outputs 1..=1;
    /// A row function of the artifact's native section (operands and output
    /// as its fallback kernel call's; since format 0.11). With an elementwise
    /// prologue (format 0.14) the operands are the prologue's then the
    /// kernel's others, and a second output holds the prologue's result.
    /// With an elementwise epilogue (format 0.20) its other operands come
    /// last, and so does its result.
    NativeKernel = 1005, "native_kernel", NativeKernel, operands 1..=MANY, outputs 1..=3;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &op in Opcode::ALL {
            assert!(seen.insert(op.code()), "code {} used twice", op.code());
            assert_eq!(Opcode::from_code(op.code()), Ok(op));
            let (lo, hi) = op.operands();
            assert!(lo <= hi, "{op}");
        }
        assert!(Opcode::from_code(999).is_err());
    }

    /// The codes are the format: this list may only grow.
    #[test]
    fn codes_are_pinned() {
        assert_eq!(Opcode::Unary.code(), 0);
        assert_eq!(Opcode::Conv.code(), 7);
        assert_eq!(Opcode::NonZero.code(), 36);
        assert_eq!(Opcode::Fused.code(), 40);
        assert_eq!(Opcode::RmsNorm.code(), 41);
        assert_eq!(Opcode::QuantLinear.code(), 80);
        assert_eq!(Opcode::QuantConv.code(), 81);
        assert_eq!(Opcode::ConvFused.code(), 42);
        assert_eq!(Opcode::LinearFused.code(), 43);
        assert_eq!(Opcode::Delegate.code(), 1000);
        assert_eq!(Opcode::Jump.code(), 1003);
        assert_eq!(Opcode::NativeCall.code(), 1004);
        assert_eq!(Opcode::NativeKernel.code(), 1005);
        assert_eq!(crate::DType::Bool.code(), 48);
        assert_eq!(crate::UnaryOp::BitNot.code(), 35);
        assert_eq!(crate::BinaryOp::Fmod.code(), 19);
    }
}
