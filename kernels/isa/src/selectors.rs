//! Op selectors: which elementwise function, reduction, pooling, padding,
//! resize mode or random distribution an op or kernel computes.

use crate::code::code_enum;

code_enum! {
    pub enum UnaryOp ("unary op") {
        Neg = 0 => "neg",
        Abs = 1 => "abs",
        Exp = 2 => "exp",
        Log = 3 => "log",
        Sqrt = 4 => "sqrt",
        Rsqrt = 5 => "rsqrt",
        Reciprocal = 6 => "reciprocal",
        Relu = 7 => "relu",
        Sigmoid = 8 => "sigmoid",
        Tanh = 9 => "tanh",
        /// Exact GELU: `x * Φ(x)` with erf.
        Gelu = 10 => "gelu",
        /// GELU with the tanh approximation.
        GeluTanh = 11 => "gelu_tanh",
        Silu = 12 => "silu",
        Erf = 13 => "erf",
        Sin = 14 => "sin",
        Cos = 15 => "cos",
        Floor = 16 => "floor",
        Ceil = 17 => "ceil",
        Round = 18 => "round",
        Sign = 19 => "sign",
        /// Logical not; input and output are `bool`.
        Not = 20 => "not",
        Log1p = 21 => "log1p",
        Expm1 = 22 => "expm1",
        /// Rounds toward zero.
        Trunc = 23 => "trunc",
        Tan = 24 => "tan",
        Asin = 25 => "asin",
        Acos = 26 => "acos",
        Atan = 27 => "atan",
        Sinh = 28 => "sinh",
        Cosh = 29 => "cosh",
        Asinh = 30 => "asinh",
        Acosh = 31 => "acosh",
        Atanh = 32 => "atanh",
        Log2 = 33 => "log2",
        Log10 = 34 => "log10",
        /// Bitwise not of an integer (`~x`); on `bool`, logical not.
        BitNot = 35 => "bit_not",
        /// 1 - erf(x), accurate in the tail where that difference cancels.
        Erfc = 36 => "erfc",
        /// ln|Γ(x)|.
        Lgamma = 37 => "lgamma",
        Digamma = 38 => "digamma",
        /// Modified Bessel functions of the first kind, and scaled by e^{-|x|}.
        I0 = 39 => "i0",
        I0e = 40 => "i0e",
        I1 = 41 => "i1",
        I1e = 42 => "i1e",
        /// e^{x²} erfc(x).
        Erfcx = 43 => "erfcx",
        /// The standard normal CDF and its logarithm.
        Ndtr = 44 => "ndtr",
        LogNdtr = 45 => "log_ndtr",
        BesselJ0 = 46 => "bessel_j0",
        BesselJ1 = 47 => "bessel_j1",
        BesselY0 = 48 => "bessel_y0",
        BesselY1 = 49 => "bessel_y1",
        /// −x ln x.
        Entr = 50 => "entr",
        /// ψ'(x), `polygamma(1, x)`.
        Trigamma = 51 => "trigamma",
        /// sin(x)/x (`special.spherical_bessel_j0`).
        SphericalBesselJ0 = 52 => "spherical_bessel_j0",
    }
}

code_enum! {
    pub enum BinaryOp ("binary op") {
        Add = 0 => "add",
        Sub = 1 => "sub",
        Mul = 2 => "mul",
        /// True division (floats); integer operands are promoted by the importer.
        Div = 3 => "div",
        /// Floor division (`//`), as torch's `div(rounding_mode='floor')`.
        FloorDiv = 4 => "floor_div",
        /// Python-style remainder (sign of the divisor), as torch's `remainder`.
        Rem = 5 => "rem",
        Pow = 6 => "pow",
        Max = 7 => "max",
        Min = 8 => "min",
        Eq = 9 => "eq",
        Ne = 10 => "ne",
        Lt = 11 => "lt",
        Le = 12 => "le",
        Gt = 13 => "gt",
        Ge = 14 => "ge",
        And = 15 => "and",
        Or = 16 => "or",
        Xor = 17 => "xor",
        /// `atan2(a, b)` (floats).
        Atan2 = 18 => "atan2",
        /// C-style remainder (sign of the dividend), as torch's `fmod`.
        Fmod = 19 => "fmod",
        /// `torch.special`'s orthogonal polynomials `P_n(x)` of `(x, n)`
        /// (floats; torch's recurrences, `kiln_kernels::generic::polynomial`).
        ChebyshevT = 20 => "chebyshev_t",
        ChebyshevU = 21 => "chebyshev_u",
        ChebyshevV = 22 => "chebyshev_v",
        ChebyshevW = 23 => "chebyshev_w",
        ShiftedChebyshevT = 24 => "shifted_chebyshev_t",
        ShiftedChebyshevU = 25 => "shifted_chebyshev_u",
        ShiftedChebyshevV = 26 => "shifted_chebyshev_v",
        ShiftedChebyshevW = 27 => "shifted_chebyshev_w",
        HermiteH = 28 => "hermite_h",
        HermiteHe = 29 => "hermite_he",
        LaguerreL = 30 => "laguerre_l",
        LegendreP = 31 => "legendre_p",
        /// The Hurwitz zeta function ζ(x, q) (`special.zeta`; floats).
        Zeta = 32 => "zeta",
        /// Regularized lower / upper incomplete gamma P(a, x), Q(a, x)
        /// (`igamma`, `igammac`; floats).
        Igamma = 33 => "igamma",
        Igammac = 34 => "igammac",
        /// C's `nextafter(a, b)`: the float next to `a` towards `b` (floats).
        Nextafter = 35 => "nextafter",
    }
}

impl BinaryOp {
    /// `torch.special`'s orthogonal polynomials (float operands only).
    pub fn is_polynomial(self) -> bool {
        (BinaryOp::ChebyshevT.code()..=BinaryOp::LegendreP.code()).contains(&self.code())
    }

    /// Comparisons produce `bool` whatever their operands are.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }
}

code_enum! {
    pub enum ReduceKind ("reduction") {
        Sum = 0 => "sum",
        Mean = 1 => "mean",
        Max = 2 => "max",
        Min = 3 => "min",
        Prod = 4 => "prod",
    }
}

code_enum! {
    /// An inclusive scan along one axis (`cumprod`, `logcumsumexp`,
    /// `cummax`/`cummin` and their indices); `cumsum` has its own opcode.
    pub enum ScanKind ("scan") {
        Prod = 0 => "prod",
        LogSumExp = 1 => "logsumexp",
        Max = 2 => "max",
        Min = 3 => "min",
        /// The i64 index of the running maximum (the last one among ties).
        ArgMax = 4 => "argmax",
        /// The i64 index of the running minimum (the last one among ties).
        ArgMin = 5 => "argmin",
    }
}

code_enum! {
    /// A `torch.linalg` result computed from one factorisation of a batch of
    /// matrices (`kiln_kernels::linalg`); a decomposition with several
    /// results (LU, QR, slogdet) is one instruction per result.
    pub enum LinalgOp ("linalg op") {
        Det = 0 => "det",
        SignDet = 1 => "sign_det",
        LogAbsDet = 2 => "log_abs_det",
        Inv = 3 => "inv",
        /// `(A, B)`: `A X = B` (or `X A = B`).
        Solve = 4 => "solve",
        /// LAPACK's packed L\U.
        LuFactor = 5 => "lu_factor",
        /// 1-based i32 row swaps.
        LuPivots = 6 => "lu_pivots",
        /// i32: 0, or the first zero pivot (1-based).
        LuInfo = 7 => "lu_info",
        Cholesky = 8 => "cholesky",
        /// i32: 0, or the order of the first leading minor not positive definite.
        CholeskyInfo = 9 => "cholesky_info",
        /// `(A, B)` with A triangular.
        TriangularSolve = 10 => "triangular_solve",
        /// `(L, B)`: solves `L L^T X = B` (or `U^T U`).
        CholeskySolve = 11 => "cholesky_solve",
        QrQ = 12 => "qr_q",
        QrR = 13 => "qr_r",
        QrQComplete = 14 => "qr_q_complete",
        QrRComplete = 15 => "qr_r_complete",
        /// Eigenvalues of a symmetric matrix, ascending.
        EigvalsH = 16 => "eigvalsh",
        /// Singular values, descending (`[.., k]`, `k = min(m, n)`).
        SvdS = 17 => "svd_s",
        /// Left singular vectors `[.., m, k]` (signs: see the kernel).
        SvdU = 18 => "svd_u",
        /// Right singular vectors, transposed: `[.., k, n]`.
        SvdVh = 19 => "svd_vh",
        /// `SvdU` completed to an orthonormal basis: `[.., m, m]`.
        SvdUFull = 20 => "svd_u_full",
        /// `SvdVh` completed to an orthonormal basis: `[.., n, n]`.
        SvdVhFull = 21 => "svd_vh_full",
        /// Eigenvectors of a symmetric matrix as columns, in `EigvalsH`'s order.
        EigvecsH = 22 => "eigvecsh",
        /// `(LU, pivots)`: the permutation matrix `P` (`A = P L U`) of
        /// LAPACK's 1-based row swaps, `[.., m, m]` in LU's dtype.
        PivotsToPermutation = 23 => "pivots_to_permutation",
        /// LAPACK `geqrf`'s packed result: R on and above the diagonal,
        /// the Householder vectors (implicit unit head) below it.
        Geqrf = 24 => "geqrf",
        /// `geqrf`'s Householder scalars `tau`, `[.., min(m, n)]`.
        GeqrfTau = 25 => "geqrf_tau",
        /// `(A, tau)`: the first `n` columns of `H_0 ⋯ H_{k-1}` (`orgqr`),
        /// the reflectors read from A's columns below the diagonal.
        HouseholderProduct = 26 => "householder_product",
        /// LAPACK `sytrf`'s (lower, Bunch–Kaufman) packed `L` and block
        /// diagonal `D`, the upper triangle zero (torch's `LD`).
        LdlFactor = 27 => "ldl_factor",
        /// `sytrf`'s 1-based i32 pivots (a 2×2 block's two entries both
        /// `-p`).
        LdlPivots = 28 => "ldl_pivots",
        /// i32: 0, or the first exactly singular block of `D` (1-based).
        LdlInfo = 29 => "ldl_info",
        /// `(LD, pivots, B)`: solves `A X = B` from the factorization (`sytrs`).
        LdlSolve = 30 => "ldl_solve",
    }
}

impl LinalgOp {
    /// One of the singular value decomposition's results.
    pub fn is_svd(self) -> bool {
        matches!(self, Self::SvdS | Self::SvdU | Self::SvdVh | Self::SvdUFull | Self::SvdVhFull)
    }
}

code_enum! {
    pub enum PoolKind ("pooling") {
        Max = 0 => "max",
        Avg = 1 => "avg",
        /// Max pooling that yields, as i64, the index of the chosen element in
        /// the input plane (row-major over the pooled dims): torch's `indices`
        /// output of `max_pool*d_with_indices`.
        ArgMax = 2 => "argmax",
    }
}

code_enum! {
    pub enum PadMode ("pad mode") {
        /// New positions hold the pad value.
        Constant = 0 => "constant",
        /// Mirror without repeating the edge (`reflect`).
        Reflect = 1 => "reflect",
        /// Repeat the edge element.
        Replicate = 2 => "replicate",
    }
}

code_enum! {
    /// How a resize (torch's `upsample_*`) maps output positions to inputs.
    pub enum ResizeMode ("resize mode") {
        /// torch's `nearest` (floor of the scaled position).
        Nearest = 0 => "nearest",
        /// Linear in each resized dim (`bilinear` for two).
        Linear = 1 => "linear",
    }
}

/// The distribution of a random op.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum RandomDist {
    /// Uniform on `[low, high)` (floats).
    Uniform { low: f64, high: f64 },
    /// Normal with `mean` and standard deviation `std` (floats; Box–Muller).
    Normal { mean: f64, std: f64 },
    /// Uniform integers on `[low, high)`; any non-bool output.
    Int { low: i64, high: i64 },
    /// A random permutation of `0..n` into a 1-D integer output of length `n`
    /// (torch's `randperm`).
    Perm,
}

impl RandomDist {
    /// The stable numeric code of the distribution's kind.
    pub const fn code(&self) -> u16 {
        match self {
            RandomDist::Uniform { .. } => 0,
            RandomDist::Normal { .. } => 1,
            RandomDist::Int { .. } => 2,
            RandomDist::Perm => 3,
        }
    }
}

/// On disk: the kind's code, then its parameters (two f64s or two i64s).
#[cfg(feature = "serde")]
mod random_serde {
    use super::RandomDist;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;

    impl serde::Serialize for RandomDist {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut t = s.serialize_tuple(3)?;
            t.serialize_element(&self.code())?;
            match *self {
                RandomDist::Uniform { low: a, high: b } | RandomDist::Normal { mean: a, std: b } => {
                    t.serialize_element(&a)?;
                    t.serialize_element(&b)?;
                }
                RandomDist::Int { low, high } => {
                    t.serialize_element(&low)?;
                    t.serialize_element(&high)?;
                }
                RandomDist::Perm => {
                    t.serialize_element(&0i64)?;
                    t.serialize_element(&0i64)?;
                }
            }
            t.end()
        }
    }

    impl<'de> serde::Deserialize<'de> for RandomDist {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RandomDist, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = RandomDist;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a random distribution (code, p0, p1)")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RandomDist, A::Error> {
                    let missing = || de::Error::custom("truncated random distribution");
                    let code: u16 = seq.next_element()?.ok_or_else(missing)?;
                    let floats = |seq: &mut A| -> Result<(f64, f64), A::Error> {
                        Ok((seq.next_element()?.ok_or_else(missing)?, seq.next_element()?.ok_or_else(missing)?))
                    };
                    let ints = |seq: &mut A| -> Result<(i64, i64), A::Error> {
                        Ok((seq.next_element()?.ok_or_else(missing)?, seq.next_element()?.ok_or_else(missing)?))
                    };
                    Ok(match code {
                        0 => {
                            let (low, high) = floats(&mut seq)?;
                            RandomDist::Uniform { low, high }
                        }
                        1 => {
                            let (mean, std) = floats(&mut seq)?;
                            RandomDist::Normal { mean, std }
                        }
                        2 => {
                            let (low, high) = ints(&mut seq)?;
                            RandomDist::Int { low, high }
                        }
                        3 => {
                            ints(&mut seq)?;
                            RandomDist::Perm
                        }
                        code => {
                            return Err(de::Error::custom(crate::UnknownCode { what: "random distribution", code }))
                        }
                    })
                }
            }
            d.deserialize_tuple(3, V)
        }
    }
}

code_enum! {
    /// Where a convolution's channel axis is (`Op::ConvFused`, the plan's
    /// `conv_fused`): torch's `N, C, H, W`, or `N, H, W, C`, which the
    /// layout pass (`kiln_passes::layout`) gives chains of 2-d convolutions
    /// so that their kernels read and write pixels as contiguous channel
    /// vectors. The weight is `[Cout, Cin/groups, kh, kw]` either way.
    #[derive(Default)]
    pub enum Layout ("layout") {
        #[default]
        ChannelsFirst = 0 => "channels_first",
        ChannelsLast = 1 => "channels_last",
    }
}
