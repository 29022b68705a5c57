//! x86_64 kernel variants, compiled for every x86_64 target but only called
//! after run-time CPU feature detection (no `-C target-cpu` needed).

pub(crate) mod avx2;
#[cfg(kiln_avx512)]
pub(crate) mod avx512;

use crate::table::{Entry, Isa, KernelTable};

/// Overrides the entries that have AVX2 + FMA versions, if this CPU has both;
/// a v4 table (built only when the CPU has AVX-512) then takes the AVX-512
/// GEMM microkernel, the rest staying AVX2.
pub(crate) fn plug(table: &mut KernelTable) {
    if !Isa::X86_64V3.is_supported() {
        return;
    }
    const V: &str = "avx2_fma";
    table.gemm = avx2::gemm::UKR;
    table.exp = Entry::new(V, avx2::math::exp);
    table.sigmoid = Entry::new(V, avx2::math::sigmoid);
    table.silu = Entry::new(V, avx2::math::silu);
    table.tanh = Entry::new(V, avx2::math::tanh);
    table.erf = Entry::new(V, avx2::math::erf);
    table.gelu = Entry::new(V, avx2::math::gelu);
    table.gelu_tanh = Entry::new(V, avx2::math::gelu_tanh);
    table.add = Entry::new(V, avx2::binary::add);
    table.sub = Entry::new(V, avx2::binary::sub);
    table.mul = Entry::new(V, avx2::binary::mul);
    table.div = Entry::new(V, avx2::binary::div);
    table.max = Entry::new(V, avx2::math::max);
    table.exp_sum = Entry::new(V, avx2::math::exp_sum);
    #[cfg(kiln_avx512)]
    if table.isa == Isa::X86_64V4 && Isa::X86_64V4.is_supported() {
        table.gemm = avx512::gemm::UKR;
    }
}
