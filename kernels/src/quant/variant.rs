//! The integer kernels as one kernel-table entry: an int8 GEMM microkernel,
//! a weight-only microkernel and a row quantizer, chosen together per ISA.

use super::int8::{self, QGemmUkr};
use super::weight_only::{self, WoUkr};
use super::{quantize_row_i8, row_scale_symmetric};
use crate::table::Entry;

/// Quantizes one row as [`super::quantize_row_i8`] does with
/// [`super::row_scale_symmetric`]'s scale, returning the scale
/// (`out.len() == row.len()`). Every variant gives the same bits.
pub(crate) type QuantizeFn = fn(row: &[f32], out: &mut [i8]) -> f32;

/// One implementation of the integer kernels: the kernel table holds one
/// ([`crate::KernelTable::entries`] names its parts); [`variants`] lists
/// every one this CPU runs, for tests and benchmarks ([`super::qlinear_with`]).
#[derive(Copy, Clone)]
pub struct QuantKernels {
    pub(crate) name: &'static str,
    pub(crate) int8: QGemmUkr,
    pub(crate) weight_only: WoUkr,
    pub(crate) quantize: Entry<QuantizeFn>,
}

impl std::fmt::Debug for QuantKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (int8 {}, weight-only {}, quantize {})",
            self.name, self.int8.variant, self.weight_only.variant, self.quantize.variant
        )
    }
}

impl QuantKernels {
    /// The variant's name (`generic`, `avx2`, `avx_vnni`, `avx512bw`,
    /// `avx512_vnni`, `neon`, `neon_dotprod`, `sve_dotprod`, `neon_i8mm`,
    /// `sve_i8mm`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// This variant's row quantizer: `out = quantize_row_i8(row,
    /// row_scale_symmetric(row))`, returning the scale.
    pub fn quantize_row(&self, row: &[f32], out: &mut [i8]) -> f32 {
        (self.quantize.run)(row, out)
    }

    /// `(int8 GEMM, weight-only, quantize)` microkernel names.
    pub fn parts(&self) -> (&'static str, &'static str, &'static str) {
        (self.int8.variant, self.weight_only.variant, self.quantize.variant)
    }
}

fn quantize_generic(row: &[f32], out: &mut [i8]) -> f32 {
    let s = row_scale_symmetric(row);
    quantize_row_i8(row, s, out);
    s
}

/// The portable kernels, and the oracle.
pub(crate) const GENERIC: QuantKernels = QuantKernels {
    name: "generic",
    int8: int8::GENERIC_UKR,
    weight_only: weight_only::GENERIC_UKR,
    quantize: Entry::new("generic", quantize_generic),
};

/// Every variant this CPU and build run, generic first.
pub fn variants() -> Vec<QuantKernels> {
    #[allow(unused_mut)]
    let mut all = vec![GENERIC];
    #[cfg(kiln_x86_64)]
    all.extend(crate::x86_64::quant_variants());
    #[cfg(kiln_neon)]
    all.extend(crate::aarch64::quant::variants());
    all
}
