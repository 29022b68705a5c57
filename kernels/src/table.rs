//! The kernel table: function pointers for the hot inner loops that have ISA
//! variants, chosen once per process (tract-linalg's `Ops` / `best()`).
//!
//! [`crate::generic::table`] fills every entry with the portable code; an ISA
//! plug-in (`x86_64::plug`, `aarch64::plug`) then overrides the entries it has faster versions
//! of. Each table lives in a static, built on first use; [`best`] is the one
//! for the detected CPU, [`KernelTable::generic_only`] the oracle, and
//! [`KernelTable::for_isa`] any level this CPU can run (for tests and
//! benchmarks). A [`crate::Context`] carries the table its kernels call
//! through, so a session can pin one.
//!
//! Every entry has a variant name, reported by [`KernelTable::entries`] (for
//! `kiln inspect`-style output and the variant tests).

use crate::generic::gemm::GemmUkr;
use crate::types::{BinaryOp, UnaryOp};
use std::fmt;
use std::sync::OnceLock;

/// `out[i] = f(x[i])` over `x.len().min(out.len())` elements.
pub type UnaryFn = fn(&[f32], &mut [f32]);
/// `out[i] = a[i] op b[i]` over the shortest of the three lengths.
pub type BinaryFn = fn(&[f32], &[f32], &mut [f32]);
/// A reduction of a row to one value.
pub type ReduceFn = fn(&[f32]) -> f32;
/// Adds the rows of `acc.len()` elements of `x` into `acc` (f64), row
/// after row: the channel sums of a channels-last mean.
pub type ColumnSumFn = fn(&[f32], &mut [f64]);
/// Softmax's middle step in place: `v[i] = exp(v[i] - shift)`, returning
/// `Σ v[i]` accumulated in f64.
pub type ExpSumFn = fn(&mut [f32], f32) -> f64;

/// The instruction-set level a table was built for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable code only.
    Generic,
    /// x86-64-v3's AVX2 + FMA.
    X86_64V3,
    /// AVX-512 (F, BW, CD, DQ, VL) on top of v3: the AVX-512F GEMM
    /// microkernel, depthwise plane and row and exp / sigmoid / SiLU / erf / GELU
    /// (when the compiler has stable AVX-512 support), the v3 entries
    /// elsewhere.
    X86_64V4,
    /// Armv8 NEON, baseline on aarch64: the level every aarch64 build
    /// without SVE or SME detects (tested under qemu in CI). Its integer
    /// entry is the best of `quant::variants()`, SVE int8 kernels included
    /// where the CPU has them.
    Aarch64Neon,
    /// SVE on top of NEON (Graviton3/4, Grace): the NEON table with the SVE
    /// f32 GEMM microkernel (its tile width follows the vector length) and
    /// exp / sigmoid / SiLU, all with the NEON entries' bits (tested under
    /// qemu at several vector lengths).
    Aarch64Sve,
    /// The NEON table with an SME f32 GEMM microkernel (`fmopa` outer
    /// products into ZA, in streaming mode), on CPUs with FEAT_SME (Linux's
    /// `HWCAP2_SME`): bit for bit the NEON table's results but NaN payloads.
    /// The best level where SME is reported, SVE or not (an SME outer
    /// product does a vector's square of multiply-adds per instruction).
    Aarch64Sme,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 6] =
        [Isa::Generic, Isa::X86_64V3, Isa::X86_64V4, Isa::Aarch64Neon, Isa::Aarch64Sve, Isa::Aarch64Sme];

    /// The best level this CPU and this build support, detected once per
    /// process.
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect_uncached)
    }

    /// Whether this CPU and build can run a table of this level.
    pub fn is_supported(self) -> bool {
        let best = Isa::detect();
        match self {
            Isa::Generic => true,
            Isa::X86_64V3 => matches!(best, Isa::X86_64V3 | Isa::X86_64V4),
            Isa::X86_64V4 => best == Isa::X86_64V4,
            Isa::Aarch64Neon => matches!(best, Isa::Aarch64Neon | Isa::Aarch64Sve | Isa::Aarch64Sme),
            Isa::Aarch64Sve => best == Isa::Aarch64Sve || (best == Isa::Aarch64Sme && has_sve()),
            Isa::Aarch64Sme => best == Isa::Aarch64Sme,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::X86_64V3 => "x86-64-v3",
            Isa::X86_64V4 => "x86-64-v4",
            Isa::Aarch64Neon => "aarch64-neon",
            Isa::Aarch64Sve => "aarch64-sve",
            Isa::Aarch64Sme => "aarch64-sme",
        }
    }

    fn index(self) -> usize {
        match self {
            Isa::Generic => 0,
            Isa::X86_64V3 => 1,
            Isa::X86_64V4 => 2,
            Isa::Aarch64Neon => 3,
            Isa::Aarch64Sve => 4,
            Isa::Aarch64Sme => 5,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(kiln_x86_64)]
fn detect_uncached() -> Isa {
    let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    let v4 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512cd")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl");
    match (v3, v4) {
        (true, true) => Isa::X86_64V4,
        (true, false) => Isa::X86_64V3,
        _ => Isa::Generic,
    }
}

#[cfg(kiln_neon)]
fn detect_uncached() -> Isa {
    // NEON is part of the aarch64 base ISA: no run-time check needed.
    if crate::aarch64::sme::detected() {
        Isa::Aarch64Sme
    } else if has_sve() {
        Isa::Aarch64Sve
    } else {
        Isa::Aarch64Neon
    }
}

/// Whether the CPU has SVE (the SVE table's kernels run).
#[cfg(kiln_neon)]
fn has_sve() -> bool {
    std::arch::is_aarch64_feature_detected!("sve")
}

#[cfg(not(kiln_neon))]
fn has_sve() -> bool {
    false
}

#[cfg(not(any(kiln_x86_64, kiln_neon)))]
fn detect_uncached() -> Isa {
    Isa::Generic
}

/// One table entry: the function and the name of the variant it is.
#[derive(Copy, Clone)]
pub(crate) struct Entry<F> {
    pub(crate) variant: &'static str,
    pub(crate) run: F,
}

impl<F> Entry<F> {
    pub(crate) const fn new(variant: &'static str, run: F) -> Entry<F> {
        Entry { variant, run }
    }
}

/// Function pointers for the hot inner loops, one variant per entry.
#[derive(Clone)]
pub struct KernelTable {
    pub(crate) isa: Isa,
    /// The f32 GEMM microkernel (tile shape, packing and store step).
    pub(crate) gemm: GemmUkr,
    pub(crate) exp: Entry<UnaryFn>,
    pub(crate) sigmoid: Entry<UnaryFn>,
    pub(crate) silu: Entry<UnaryFn>,
    pub(crate) tanh: Entry<UnaryFn>,
    pub(crate) erf: Entry<UnaryFn>,
    pub(crate) gelu: Entry<UnaryFn>,
    pub(crate) gelu_tanh: Entry<UnaryFn>,
    pub(crate) add: Entry<BinaryFn>,
    pub(crate) sub: Entry<BinaryFn>,
    pub(crate) mul: Entry<BinaryFn>,
    pub(crate) div: Entry<BinaryFn>,
    pub(crate) max: Entry<ReduceFn>,
    pub(crate) exp_sum: Entry<ExpSumFn>,
    pub(crate) column_sum: Entry<ColumnSumFn>,
    /// Layer norm of whole f32 rows.
    pub(crate) layer_norm: Entry<crate::generic::norm::LayerNormRowsFn<f32>>,
    /// One output plane of a depthwise convolution.
    pub(crate) depthwise: Entry<crate::generic::conv_depthwise::DepthwisePlaneFn>,
    /// One output row of a channels-last depthwise convolution.
    pub(crate) depthwise_nhwc: Entry<crate::generic::conv_nhwc::DepthwiseRowFn>,
    /// The integer kernels (int8 GEMM, weight-only, row quantizer).
    pub(crate) quant: crate::quant::QuantKernels,
}

/// The table for the detected CPU, built once.
pub fn best() -> &'static KernelTable {
    KernelTable::for_isa(Isa::detect()).unwrap_or_else(KernelTable::generic_only)
}

impl KernelTable {
    /// The portable code in every entry: the oracle variants are tested against.
    pub fn generic_only() -> &'static KernelTable {
        built(Isa::Generic)
    }

    /// The table of one ISA level, or None when this CPU or build lacks it.
    pub fn for_isa(isa: Isa) -> Option<&'static KernelTable> {
        isa.is_supported().then(|| built(isa))
    }

    /// The level this table was built for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `(entry, variant)` for every entry, in a fixed order.
    pub fn entries(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("gemm_f32", self.gemm.variant),
            ("exp_f32", self.exp.variant),
            ("sigmoid_f32", self.sigmoid.variant),
            ("silu_f32", self.silu.variant),
            ("tanh_f32", self.tanh.variant),
            ("erf_f32", self.erf.variant),
            ("gelu_f32", self.gelu.variant),
            ("gelu_tanh_f32", self.gelu_tanh.variant),
            ("add_f32", self.add.variant),
            ("sub_f32", self.sub.variant),
            ("mul_f32", self.mul.variant),
            ("div_f32", self.div.variant),
            ("max_f32", self.max.variant),
            ("exp_sum_f32", self.exp_sum.variant),
            ("column_sum_f32", self.column_sum.variant),
            ("layer_norm_rows_f32", self.layer_norm.variant),
            ("depthwise_plane_f32", self.depthwise.variant),
            ("depthwise_nhwc_f32", self.depthwise_nhwc.variant),
            ("qgemm_i8", self.quant.int8.variant),
            ("qlinear_weight_only", self.quant.weight_only.variant),
            ("quantize_row_i8", self.quant.quantize.variant),
            ("qconv_depthwise_i8", self.quant.int8.driver.depthwise.variant),
        ]
    }

    /// The GEMM microkernel's tile, `(MR, NR)`: rows and columns of C per call.
    pub fn gemm_tile(&self) -> (usize, usize) {
        (self.gemm.mr, self.gemm.nr)
    }

    /// `out[i] = exp(x[i])`.
    pub fn exp_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.exp.run)(x, out)
    }

    /// `out[i] = 1 / (1 + exp(-x[i]))`.
    pub fn sigmoid_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.sigmoid.run)(x, out)
    }

    /// `out[i] = x[i] / (1 + exp(-x[i]))`.
    pub fn silu_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.silu.run)(x, out)
    }

    /// `out[i] = tanh(x[i])`.
    pub fn tanh_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.tanh.run)(x, out)
    }

    /// `out[i] = erf(x[i])`.
    pub fn erf_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.erf.run)(x, out)
    }

    /// Exact GELU, `out[i] = x[i] · Φ(x[i])`.
    pub fn gelu_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.gelu.run)(x, out)
    }

    /// GELU's tanh approximation.
    pub fn gelu_tanh_f32(&self, x: &[f32], out: &mut [f32]) {
        (self.gelu_tanh.run)(x, out)
    }

    pub fn add_f32(&self, a: &[f32], b: &[f32], out: &mut [f32]) {
        (self.add.run)(a, b, out)
    }

    pub fn sub_f32(&self, a: &[f32], b: &[f32], out: &mut [f32]) {
        (self.sub.run)(a, b, out)
    }

    pub fn mul_f32(&self, a: &[f32], b: &[f32], out: &mut [f32]) {
        (self.mul.run)(a, b, out)
    }

    pub fn div_f32(&self, a: &[f32], b: &[f32], out: &mut [f32]) {
        (self.div.run)(a, b, out)
    }

    /// The NaN-propagating maximum (torch's `max`): -inf for an empty row;
    /// if the row holds NaNs, the last of them.
    pub fn max_f32(&self, x: &[f32]) -> f32 {
        (self.max.run)(x)
    }

    /// `v[i] = exp(v[i] - shift)` in place, returning the sum in f64.
    pub fn exp_sum_f32(&self, v: &mut [f32], shift: f32) -> f64 {
        (self.exp_sum.run)(v, shift)
    }

    /// `acc[j] += x[r·c + j]` in f64 for every row `r` of `c = acc.len()`
    /// elements of `x`, rows in order (each column one chain of adds).
    pub fn column_sum_f32(&self, x: &[f32], acc: &mut [f64]) {
        (self.column_sum.run)(x, acc)
    }

    /// Layer norm of the rows of `d` elements of `x` into `out` (same
    /// length, a multiple of `d`), with optional weight and bias of `d`.
    pub fn layer_norm_rows_f32(
        &self,
        x: &[f32],
        out: &mut [f32],
        d: usize,
        w: Option<&[f32]>,
        b: Option<&[f32]>,
        eps: f64,
    ) {
        (self.layer_norm.run)(x, out, d, w, b, eps)
    }

    /// The entry for a float unary op, if the table has one.
    pub(crate) fn unary_f32(&self, op: UnaryOp) -> Option<UnaryFn> {
        match op {
            UnaryOp::Exp => Some(self.exp.run),
            UnaryOp::Sigmoid => Some(self.sigmoid.run),
            UnaryOp::Silu => Some(self.silu.run),
            UnaryOp::Tanh => Some(self.tanh.run),
            UnaryOp::Erf => Some(self.erf.run),
            UnaryOp::Gelu => Some(self.gelu.run),
            UnaryOp::GeluTanh => Some(self.gelu_tanh.run),
            _ => None,
        }
    }

    /// The entry for a float binary op, if the table has one.
    pub(crate) fn binary_f32(&self, op: BinaryOp) -> Option<BinaryFn> {
        match op {
            BinaryOp::Add => Some(self.add.run),
            BinaryOp::Sub => Some(self.sub.run),
            BinaryOp::Mul => Some(self.mul.run),
            BinaryOp::Div => Some(self.div.run),
            _ => None,
        }
    }
}

impl fmt::Debug for KernelTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        m.entry(&"isa", &self.isa.name());
        for (entry, variant) in self.entries() {
            m.entry(&entry, &variant);
        }
        m.finish()
    }
}

/// The table of `isa`, built on first use: generic entries, then the
/// plug-ins of that level. Only called for supported levels.
fn built(isa: Isa) -> &'static KernelTable {
    static TABLES: [OnceLock<KernelTable>; Isa::ALL.len()] = [const { OnceLock::new() }; Isa::ALL.len()];
    TABLES[isa.index()].get_or_init(|| {
        let mut table = crate::generic::table();
        table.isa = isa;
        match isa {
            Isa::Generic => {}
            #[cfg(kiln_neon)]
            Isa::Aarch64Neon => crate::aarch64::plug(&mut table),
            // The NEON entries, then the SVE ones (see `aarch64::sve::plug`).
            #[cfg(kiln_neon)]
            Isa::Aarch64Sve => {
                crate::aarch64::plug(&mut table);
                crate::aarch64::sve::plug(&mut table);
            }
            // The NEON table with the SME GEMM (see `aarch64::plug_sme`).
            #[cfg(kiln_neon)]
            Isa::Aarch64Sme => crate::aarch64::plug_sme(&mut table),
            #[cfg(not(kiln_neon))]
            Isa::Aarch64Neon | Isa::Aarch64Sve | Isa::Aarch64Sme => {}
            // v4 = the v3 entries, then its own (see `x86_64::plug`).
            #[cfg(kiln_x86_64)]
            Isa::X86_64V3 | Isa::X86_64V4 => crate::x86_64::plug(&mut table),
            #[cfg(not(kiln_x86_64))]
            Isa::X86_64V3 | Isa::X86_64V4 => {}
        }
        table
    })
}
