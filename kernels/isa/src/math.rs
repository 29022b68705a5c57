//! The constants of kiln's vectorised f32 math, defined once: the kernels'
//! ISA variants (`kernels/src/x86_64/avx2/math.rs`, the AVX-512 and NEON
//! copies) and the native code generator (`compiler/src/native/emit.rs`)
//! evaluate the same polynomials with these coefficients in the same order,
//! so compiled elementwise groups keep the kernels' accuracy (and, where
//! both fuse their multiply-adds, their bits). Each list is a polynomial's
//! coefficients from the highest degree down, as Horner's rule takes them.
//! What each algorithm does with them is documented at the AVX2 functions.

/// exp: the input is clamped to `[EXP_LO, EXP_HI]` (no result changes:
/// below −104 exp rounds to 0, above 88.8 it overflows; −110 leaves room
/// for callers scaling a subnormal result up), so both halves of 2ⁿ stay
/// normal.
pub const EXP_LO: f32 = -110.0;
pub const EXP_HI: f32 = 88.8;
/// ln 2 split for Cody–Waite reduction: `n·EXP_LN2_HI` is exact for the
/// clamped range, `EXP_LN2_LO` the rest (Cephes' C1 and C2, C2 negated).
pub const EXP_LN2_HI: f32 = 0.693_359_4;
pub const EXP_LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' expf: `(e^r − 1 − r)/r²` on |r| ≤ ln2/2.
pub const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// Cephes' tanhf: `(tanh(x) − x)/x³` as a polynomial in x² on |x| < [`TANH_SMALL`].
pub const TANH_POLY: [f32; 5] = [-5.704_988_7e-3, 2.063_909e-2, -5.373_971_6e-2, 0.133_314_42, -0.333_332_8];
/// Below this |x| tanh takes its odd polynomial, above it `1 − 2/(e^{2|x|} + 1)`.
pub const TANH_SMALL: f32 = 0.625;

/// Where erf switches from its odd polynomial to `1 − exp(q(|x|))`.
pub const ERF_SPLIT: f32 = 0.927_734_4;
/// erf on |x| ≤ [`ERF_SPLIT`]: `x + x·P(x²)` (a minimax fit, ≤ 1 ulp).
pub const ERF_SMALL_POLY: [f32; 6] =
    [-5.967_617e-4, 4.991_194_2e-3, -2.676_813_5e-2, 0.112_819_925, -0.376_125_34, 0.128_379_17];
/// `q(t)` with `erfc(t) = exp(q)` for t ≥ [`ERF_SPLIT`] (a minimax fit of
/// log erfc, N. Juffa's single-precision erf), degree 8 with the last
/// coefficient −1 (the caller's `r·t − t`). The first four are evaluated as
/// two pairs (Estrin's first step), the rest by Horner's rule.
pub const ERFC_EXPONENT_POLY: [f32; 7] =
    [-1.728_534_7e-5, 3.831_971_3e-4, -3.883_964_4e-3, 2.425_462_2e-2, -0.106_777_88, -0.634_846_7, -0.128_717_51];
/// `(1 + 2t)·e^{t²}·erfc(t)` on t ∈ [0.9, 10.2] as a polynomial in
/// `q = (t − 2)/(t + 2)` (weighted least squares, ≤ 0.2 ulp): GELU's left tail.
pub const ERFC_TAIL_POLY: [f32; 9] = [
    -1.523_607_8e-3,
    1.122_186_5e-3,
    8.759_447e-3,
    -8.015_458e-3,
    -5.422_427_5e-2,
    0.164_050_3,
    -0.166_030_26,
    -9.276_381e-2,
    1.276_978_4,
];
/// Where GELU's left tail is 0 in f32 (erfc(t) < 2⁻¹⁵⁰ for t > 10.1).
pub const ERFC_ZERO: f32 = 10.2;

/// GELU's tanh form: `√(2/π)·(x + GELU_TANH_CUBIC·x³)`.
pub const GELU_TANH_CUBIC: f32 = 0.044_715;
pub const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// Cephes' logf: `(ln(1 + f) − f + f²/2)/f³` on `1 + f ∈ [√½, √2)`.
/// Used by the native code generator only (the kernels' log is libm's).
pub const LOG_POLY: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_4e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];
/// √½ rounded to f32: a mantissa below it is doubled (one less exponent).
pub const LOG_SQRT_HALF: f32 = 0.707_106_77;
