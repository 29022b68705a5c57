//! Quantized linear layers: int8 or int4 weights, float or dynamically
//! quantized int8 activations.
//!
//! This module is the contract between the compiler's quantization (which
//! writes [`QWeights`] into the artifact) and the integer kernels (which
//! read them): the storage layout of the weights, how they are packed once
//! at load ([`PackedQWeights`]), and the arithmetic of [`qlinear`], which
//! every ISA variant must reproduce.
//!
//! # Weight storage (what the artifact holds)
//! A linear layer's weight `[n, k]`, row-major (one row per output feature):
//! - [`QBits::I8`]: one `i8` per byte;
//! - [`QBits::I4`]: two signed 4-bit values per byte (`[-8, 7]`, two's
//!   complement): element `2j` of a row in the low nibble, `2j + 1` in the
//!   high nibble; `k` is even.
//!
//! Scales are f32 `[n, k / group]` (`group == k`: per channel); optional
//! zero points are i8 of the same shape (none: symmetric). The dequantized
//! weight is `(q - zp) * scale`.
//!
//! # Arithmetic
//! - [`ActQuant::Float`] (weight-only): `out[i][j] = bias[j] + Σ_g scale[j][g]
//!   · Σ_{p in g} x[i][p] · (q[j][p] - zp[j][g])`, f32 accumulation.
//! - [`ActQuant::DynamicPerRow`] (int8 weights, `group == k`, symmetric
//!   only): each row of `x` is quantized as torchao's per-token symmetric
//!   rule does — `s = max(max|x_row| / 127.5, f32::EPSILON)`, `q =
//!   clamp(rint(x · f32(1/s)), -128, 127)` (half to even) — then `acc =
//!   Σ q_x · q_w` exactly in i32 and `out = (f32(acc) · s) · scale[j] +
//!   bias[j]`, in that order, which is torchao's decomposed program
//!   (`_int_mm`, `mul(act_scale)`, `mul(w_scale)`, `add(bias)`) bit for bit.
//!   Every variant gives the same bits (i32 sums are exact for `k < 2^17`;
//!   deeper layers are refused).
//! - [`ActQuant::DynamicAsymmetric`] (int8 weights, `group == k`, symmetric
//!   only): each row of `x` gets its own scale and zero point from its
//!   range, torch's `MinMaxObserver` rule over `[-128, 127]`
//!   ([`row_qparams_asymmetric`]), is quantized as [`ActQuant::Static`]
//!   quantizes a tensor, and `out = (f32(Σ (q_x − zp) · q_w) · s) ·
//!   scale[j] + bias[j]`. Rows that are mostly of one sign (after a GELU or
//!   ReLU) keep twice the resolution of the symmetric rule.
//! - [`ActQuant::Static`] (int8 weights, `group == k`, symmetric only):
//!   every element of `x` is quantized with the one compile-time scale and
//!   zero point, `q = clamp(rint(x · f32(1/s)) + zp, -128, 127)` (torch's
//!   `quantize_per_tensor`; a uint8 zero point `z` is `z - 128` here, the
//!   same integers shifted), then `acc = Σ (q_x − zp) · q_w` exactly in i32
//!   and `out = (f32(acc) · s) · scale[j] + bias[j]`.
//!
//! # Kernels
//! [`qlinear`] runs the context's kernel table's [`QuantKernels`] (the best
//! variant of its ISA level) on the context's threads, taking its
//! temporary memory from the context's scratch (no allocation once the
//! scratch has grown to the layer's size). Work is split into whole output
//! tiles (row blocks × column strips), each computed over the whole of K by
//! one microkernel call, so results do not depend on the thread count.
//! The weight-only vector kernels fuse each product into its sum (FMA) where
//! the generic kernel rounds twice: they stay within `2 · group · ε ·
//! Σ_p |x · (q − zp) · scale|` of it (`weight_only.rs`). [`variants`] and
//! [`qlinear_with`] run any variant this CPU has (tests, benchmarks).

mod conv;
mod depthwise;
mod int8;
mod pack;
mod variant;
mod weight_only;

// What the ISA variants (x86_64/, aarch64/) build their microkernels from.
pub use conv::{qconv, qconv_int8, qconv_int8_with, qconv_with};
#[cfg(kiln_x86_64)]
pub(crate) use depthwise::BLOCK;
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) use depthwise::{depthwise_bounds, pair_row, DepthwiseFns, DepthwiseRow, PIXELS};
pub use depthwise::{qconv_depthwise, qconv_depthwise_with, DepthwiseQWeights};
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) use int8::Driver;
#[cfg(kiln_neon)]
pub(crate) use int8::GENERIC_DRIVER;
#[cfg(kiln_x86_64)]
pub(crate) use int8::{store_row, store_tile_quantized, Epilogue, QTile, Residual};
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) use int8::{Acts, CopyKernel, QGemmUkr};
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) use pack::lane as lane_of;
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) use pack::CopyKind;
#[cfg(kiln_neon)]
pub(crate) use pack::PAIR_GROUP;
pub(crate) use variant::GENERIC;
pub use variant::{variants, QuantKernels};
#[cfg(any(kiln_x86_64, kiln_neon))]
pub(crate) use weight_only::{WoStrip, WoUkr};

use crate::context::Context;
use crate::types::{KernelError, Result};

/// How wide each stored weight is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum QBits {
    I8,
    I4,
}

/// How a [`qlinear`] treats its activations.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum ActQuant {
    /// f32 activations times the dequantized weights (weight-only).
    Float,
    /// Per-row symmetric int8 activations and an exact i32 dot product.
    DynamicPerRow,
    /// Per-row asymmetric int8 activations (a scale and zero point per
    /// row, from its range) and an exact i32 dot product.
    DynamicAsymmetric,
    /// Per-tensor int8 activations with a scale and zero point chosen at
    /// compile time (calibration): `q = clamp(rint(x · f32(1/scale)) +
    /// zero_point, -128, 127)`, then an exact i32 dot product.
    Static { scale: f32, zero_point: i32 },
}

/// A quantized weight as the artifact stores it (see the module doc).
#[derive(Copy, Clone, Debug)]
pub struct QWeights<'a> {
    /// Output features (rows).
    pub n: usize,
    /// Input features.
    pub k: usize,
    pub bits: QBits,
    /// Elements of a row sharing one scale; divides `k` (`k`: per channel).
    pub group: usize,
    /// `n * k` bytes ([`QBits::I8`]) or `n * k / 2` ([`QBits::I4`]).
    pub data: &'a [u8],
    /// `n * (k / group)` scales.
    pub scales: &'a [f32],
    /// As many zero points as scales, or `None` (symmetric).
    pub zero_points: Option<&'a [i8]>,
}

pub(crate) fn err(detail: impl Into<String>) -> KernelError {
    KernelError::Shape { kernel: "qlinear", detail: detail.into() }
}

impl QWeights<'_> {
    /// Checks that the lengths and the group fit together.
    pub fn check(&self) -> Result<()> {
        if self.n == 0 || self.k == 0 || self.group == 0 || !self.k.is_multiple_of(self.group) {
            return Err(err(format!("group {} does not divide k = {} (n = {})", self.group, self.k, self.n)));
        }
        let elems = self.n.checked_mul(self.k).ok_or_else(|| err("weight too large"))?;
        let bytes = match self.bits {
            QBits::I8 => elems,
            QBits::I4 if self.k.is_multiple_of(2) => elems / 2,
            QBits::I4 => return Err(err(format!("int4 weights need an even k, got {}", self.k))),
        };
        if self.data.len() != bytes {
            return Err(err(format!(
                "{} weight bytes for a {}x{} {:?} weight (want {bytes})",
                self.data.len(),
                self.n,
                self.k,
                self.bits
            )));
        }
        let groups = self.n * (self.k / self.group);
        if self.scales.len() != groups {
            return Err(err(format!("{} scales, want {groups}", self.scales.len())));
        }
        if self.zero_points.is_some_and(|z| z.len() != groups) {
            return Err(err(format!("zero points do not match the {groups} scales")));
        }
        Ok(())
    }

    /// Element `(j, p)` of the stored weight, as an integer.
    pub(crate) fn q(&self, j: usize, p: usize) -> i32 {
        match self.bits {
            QBits::I8 => self.data[j * self.k + p] as i8 as i32,
            QBits::I4 => {
                let byte = self.data[(j * self.k + p) / 2];
                let nibble = if p.is_multiple_of(2) { byte & 0x0f } else { byte >> 4 };
                // Sign-extend the 4-bit two's complement value.
                ((nibble << 4) as i8 >> 4) as i32
            }
        }
    }
}

/// A quantized weight in the layout the kernels read, built once (at
/// program load) from [`QWeights`]: 16-column strips of 4-byte lanes
/// (`pack.rs` describes the layout), 64-byte aligned, and for the plain
/// AVX2 table an i16 copy of an int8 weight, for the NEON and SVE i8mm
/// tables a column-pairs copy. Equal when their bytes are (tests skip
/// packings that repeat another).
#[derive(Clone, PartialEq)]
pub struct PackedQWeights {
    n: usize,
    k: usize,
    bits: QBits,
    group: usize,
    layout: pack::Layout,
}

impl std::fmt::Debug for PackedQWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedQWeights({}x{} {:?} group {})", self.n, self.k, self.bits, self.group)
    }
}

impl PackedQWeights {
    /// Packs `w` for the integer kernels of this CPU's best table
    /// ([`PackedQWeights::pack_for`] with them).
    pub fn pack(w: &QWeights<'_>) -> Result<PackedQWeights> {
        PackedQWeights::pack_for(w, &crate::best().quant)
    }

    /// Packs `w` for `kernels`: the layout every variant reads, plus, for
    /// an int8 weight the W8A8 kernels can run (symmetric, per channel)
    /// when `kernels`' int8 entry has a kernel for a second copy, that
    /// copy (`pack.rs`): widened to i16 for plain AVX2 (read for GEMMs of
    /// several rows), in column pairs for AArch64 i8mm (NEON or SVE, the
    /// same copy at any vector length). Every variant runs
    /// any packing, with the same results.
    pub fn pack_for(w: &QWeights<'_>, kernels: &QuantKernels) -> Result<PackedQWeights> {
        let mut layout = pack::Layout::pack(w)?;
        if let Some(copy) = kernels.int8.copy {
            if w.bits == QBits::I8 && w.group == w.k && w.zero_points.is_none() {
                layout.add_copy(copy.kind);
            }
        }
        Ok(PackedQWeights { n: w.n, k: w.k, bits: w.bits, group: w.group, layout })
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    pub fn bits(&self) -> QBits {
        self.bits
    }

    pub fn group(&self) -> usize {
        self.group
    }

    /// Bytes the packed copy takes.
    pub fn bytes(&self) -> usize {
        self.layout.len_bytes()
    }
}

/// torchao's per-token symmetric int8 scale of one row.
pub fn row_scale_symmetric(row: &[f32]) -> f32 {
    scale_symmetric(range_with_zero(row))
}

/// `(min(min row, 0), max(max row, 0))`, NaNs skipped.
pub(crate) fn range_with_zero(row: &[f32]) -> (f32, f32) {
    row.iter().fold((0f32, 0f32), |(mn, mx), &v| (mn.min(v), mx.max(v)))
}

/// [`row_scale_symmetric`] of a row with that [`range_with_zero`].
pub(crate) fn scale_symmetric((mn, mx): (f32, f32)) -> f32 {
    ((-mn).max(mx) / 127.5).max(f32::EPSILON)
}

/// The per-row asymmetric scale and zero point of one row: torch's
/// `MinMaxObserver` rule over `[-128, 127]` on the row's range widened to
/// hold 0 — `s = max((max − min) / 255, f32::EPSILON)`, `zp = clamp(-128 −
/// rint(min / s), -128, 127)`.
pub fn row_qparams_asymmetric(row: &[f32]) -> (f32, i32) {
    qparams_asymmetric(range_with_zero(row))
}

/// [`row_qparams_asymmetric`] of a row with that [`range_with_zero`].
pub(crate) fn qparams_asymmetric((mn, mx): (f32, f32)) -> (f32, i32) {
    let s = ((mx - mn) / 255.0).max(f32::EPSILON);
    let zp = (-128.0 - (mn / s).round_ties_even()).clamp(-128.0, 127.0);
    (s, zp as i32)
}

/// Quantizes `row` with scale `s`: multiply by the f32 reciprocal, round
/// half to even, clamp (torch's rule).
pub fn quantize_row_i8(row: &[f32], s: f32, out: &mut [i8]) {
    let inv = 1.0 / s;
    for (o, &v) in out.iter_mut().zip(row) {
        *o = (v * inv).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
}

/// Quantizes `row` with a per-tensor scale and zero point (torch's
/// `quantize_per_tensor` over `[-128, 127]`): `clamp(rint(x · f32(1/s)) +
/// zp)`. Rounds with the `1.5 · 2^23` trick (round to nearest even in the
/// default mode) on a value clamped to ±512 first, which gives the same
/// integers as `round_ties_even` and vectorises without SSE4.1.
pub fn quantize_row_static(row: &[f32], s: f32, zp: i32, out: &mut [i8]) {
    let (inv, zp) = (1.0 / s, zp as f32);
    for (o, &v) in out.iter_mut().zip(row) {
        *o = quantize_value(v, inv, zp) as i8;
    }
}

/// `clamp(rint(v · inv) + zp, -128, 127)` as [`quantize_row_static`]
/// rounds it, the integer read off the bits of `t + 1.5 · 2^23` (exact for
/// |t| < 2^22) rather than by a saturating conversion, which does not
/// vectorise; NaN gives 0, as `as` does.
#[inline(always)]
pub(crate) fn quantize_value(v: f32, inv: f32, zp: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    let t = (((v * inv).clamp(-512.0, 512.0) + MAGIC - MAGIC) + zp).clamp(-128.0, 127.0);
    let t = if t.is_nan() { 0.0 } else { t };
    (t + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// `dst` = `src` quantized (`clamp(rint(x · f32(1/s)) + zp, -128, 127)`)
/// and stored as `acts` says, through a small stack buffer.
#[inline(always)]
pub(crate) fn encode_quantized(acts: int8::Acts, src: &[f32], s: f32, zp: i32, dst: &mut [u8]) {
    // `quantize_row_static`'s integers, written straight into each storage
    // in one loop so that it vectorises.
    let (inv, zp) = (1.0 / s, zp as f32);
    let q = |v: f32| quantize_value(v, inv, zp);
    match acts {
        int8::Acts::I8 => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = q(v) as u8),
        int8::Acts::U8Offset => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = (q(v) + 128) as u8),
        int8::Acts::I16 => match bytemuck::try_cast_slice_mut::<u8, i16>(dst) {
            Ok(out) => out.iter_mut().zip(src).for_each(|(d, &v)| *d = (q(v) as i16).to_le()),
            Err(_) => {
                dst.chunks_exact_mut(2).zip(src).for_each(|(d, &v)| d.copy_from_slice(&(q(v) as i16).to_le_bytes()))
            }
        },
    }
}

/// `out[m, n] = x[m, k] · dequant(w)^T (+ bias)`, as the module doc defines,
/// with the context's kernel table's integer kernels and threads.
pub fn qlinear(
    cx: &mut Context,
    x: &[f32],
    m: usize,
    w: &PackedQWeights,
    act: ActQuant,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let kernels = cx.table.quant;
    qlinear_with(cx, &kernels, x, m, w, act, bias, out)
}

/// [`qlinear`] with the given variant of the integer kernels (one of
/// [`variants`]) instead of the table's: for tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn qlinear_with(
    cx: &mut Context,
    kernels: &QuantKernels,
    x: &[f32],
    m: usize,
    w: &PackedQWeights,
    act: ActQuant,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(out.len()) {
        return Err(err(format!("x has {} elements and out {} for m = {m}, k = {k}, n = {n}", x.len(), out.len())));
    }
    if bias.is_some_and(|b| b.len() != n) {
        return Err(err(format!("bias has {} elements, want {n}", bias.map_or(0, <[f32]>::len))));
    }
    if m == 0 {
        return Ok(());
    }
    match act {
        ActQuant::Float => weight_only::run(cx, kernels, x, m, w, bias, out),
        ActQuant::DynamicPerRow | ActQuant::DynamicAsymmetric | ActQuant::Static { .. } => {
            if w.bits != QBits::I8 || w.group != k || w.layout.zero_points.is_some() {
                return Err(err("int8 activations need symmetric per-channel int8 weights"));
            }
            if k > int8::MAX_K {
                return Err(err(format!("k = {k} is too deep for exact i32 sums (at most {})", int8::MAX_K)));
            }
            let rows = match act {
                ActQuant::Static { scale, zero_point } => {
                    if !(scale.is_finite() && scale > 0.0 && (-128..=127).contains(&zero_point)) {
                        return Err(err(format!("static activation scale {scale} / zero point {zero_point}")));
                    }
                    int8::Rows::Static { scale, zero_point }
                }
                ActQuant::DynamicAsymmetric => int8::Rows::DynamicAsymmetric,
                _ => int8::Rows::Dynamic,
            };
            int8::run(cx, kernels, x, m, w, rows, bias, out);
        }
    }
    Ok(())
}
