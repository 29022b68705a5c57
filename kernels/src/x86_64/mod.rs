//! x86_64 kernel variants, compiled for every x86_64 target but only called
//! after run-time CPU feature detection (no `-C target-cpu` needed).

pub(crate) mod avx2;

use crate::table::{Entry, Isa, KernelTable};

/// Overrides the entries that have AVX2 + FMA versions, if this CPU has both
/// (x86-64-v4 CPUs get the same entries: there are no AVX-512 kernels yet).
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
}
