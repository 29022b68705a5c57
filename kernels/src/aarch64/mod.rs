//! aarch64 kernel variants (Armv8 NEON, and an SME GEMM). NEON is part of
//! the aarch64 base ISA (every aarch64 Rust target enables it), so these need
//! no run-time detection: [`plug`] installs them whenever the table is the
//! NEON one. [`plug_sme`] adds the SME GEMM ([`sme`]) on CPUs that have SME.

pub(crate) mod binary;
pub(crate) mod conv;
pub(crate) mod gemm;
pub(crate) mod math;
pub(crate) mod quant;
pub(crate) mod sme;
pub(crate) mod sve;
pub(crate) mod sve_quant;

use crate::table::{Entry, KernelTable};

/// Overrides every entry with its NEON version.
pub(crate) fn plug(table: &mut KernelTable) {
    const V: &str = "neon";
    table.gemm = gemm::UKR;
    table.exp = Entry::new(V, math::exp);
    table.sigmoid = Entry::new(V, math::sigmoid);
    table.silu = Entry::new(V, math::silu);
    table.tanh = Entry::new(V, math::tanh);
    table.erf = Entry::new(V, math::erf);
    table.gelu = Entry::new(V, math::gelu);
    table.gelu_tanh = Entry::new(V, math::gelu_tanh);
    table.add = Entry::new(V, binary::add);
    table.sub = Entry::new(V, binary::sub);
    table.mul = Entry::new(V, binary::mul);
    table.div = Entry::new(V, binary::div);
    table.max = Entry::new(V, math::max);
    table.exp_sum = Entry::new(V, math::exp_sum);
    // The generic loop's f64 adds already compile to NEON (baseline).
    table.column_sum = Entry::new("neon_baseline", crate::generic::vector::column_sum::<f32>);
    // NEON is baseline on aarch64: the generic rows already compile to it.
    table.layer_norm = Entry::new("neon_baseline", crate::generic::norm::layer_norm_rows::<f32>);
    table.depthwise = Entry::new(V, conv::depthwise_plane);
    table.depthwise_nhwc = Entry::new(V, conv::depthwise_row);
    // The integer kernels: the best the CPU has (`sdot`, i8mm, SVE; detected
    // at run time).
    if let Some(&q) = quant::variants().last() {
        table.quant = q;
    }
}

/// The NEON table with the SME f32 GEMM microkernel, whose tile follows the
/// streaming vector length: only called on CPUs with SME (`Isa::Aarch64Sme`).
pub(crate) fn plug_sme(table: &mut KernelTable) {
    plug(table);
    table.gemm = sme::ukr();
}
