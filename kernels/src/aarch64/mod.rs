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

/// Linux's AT_HWCAP2 feature bits (SME, SVE's int8 matrix multiply, …,
/// which `is_aarch64_feature_detected!` cannot name on stable Rust); 0 on
/// other systems, which then report none of them.
pub(crate) fn hwcap2() -> u64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getauxval reads the process's auxiliary vector; no pointers.
        unsafe { libc::getauxval(libc::AT_HWCAP2) as u64 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// The most elements [`fma_tile`] computes (the SME kernel's 32×32 tile).
const FMA_TILE_MAX: usize = 32 * 32;

/// A `mr`×`nr` microkernel tile computed in Rust as the assembly kernels
/// compute it — each element one fused multiply-add chain (`mul_add` is
/// `fmadd`) over the `kc` steps of the packed strips in k order from +0 —
/// then the portable store step: the same bits. For calls the assembly
/// may not serve (the vector length lowered since the table was built, ZA
/// in use by the caller).
pub(crate) fn fma_tile(
    kc: usize,
    mr: usize,
    nr: usize,
    astrip: &[f32],
    bstrip: &[f32],
    tile: &mut crate::generic::gemm::Tile<'_>,
) {
    assert!(mr * nr <= FMA_TILE_MAX, "fma_tile: a {mr}x{nr} tile");
    let mut acc = [0f32; FMA_TILE_MAX];
    for (a, b) in astrip.chunks_exact(mr).zip(bstrip.chunks_exact(nr)).take(kc) {
        for (row, &ai) in acc.chunks_exact_mut(nr).zip(a) {
            for (c, &bj) in row.iter_mut().zip(b) {
                *c = ai.mul_add(bj, *c);
            }
        }
    }
    tile.store(&acc[..mr * nr], nr);
}

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
