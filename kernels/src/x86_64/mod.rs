//! x86_64 kernel variants, compiled for every x86_64 target but only called
//! after run-time CPU feature detection (no `-C target-cpu` needed).

pub(crate) mod avx2;
#[cfg(kiln_avx512)]
pub(crate) mod avx512;
mod depthwise_kernel;
mod gemm_kernel;

use crate::quant::QuantKernels;
use crate::table::{Entry, Isa, KernelTable};

/// Overrides the entries that have AVX2 + FMA versions, if this CPU has both;
/// a v4 table (built only when the CPU has AVX-512) then takes the AVX-512
/// GEMM microkernel, depthwise plane and exp-based activations and tanh (16
/// lanes, the AVX2 results), the rest staying AVX2.
pub(crate) fn plug(table: &mut KernelTable) {
    if !Isa::X86_64V3.is_supported() {
        return;
    }
    const V: &str = avx2::math::VARIANT;
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
    table.column_sum = Entry::new(V, avx2::reduce::column_sum);
    table.layer_norm = Entry::new(V, avx2::norm::layer_norm_rows);
    table.depthwise = Entry::new(V, avx2::conv::depthwise_plane);
    table.depthwise_nhwc = Entry::new(V, avx2::conv::depthwise_row);
    // The integer kernels: the best variant of this level (the last listed).
    let quant = quant_variants();
    let v3 = quant.iter().rev().find(|q| !q.name.starts_with("avx512"));
    if let Some(&q) = v3 {
        table.quant = q;
    }
    #[cfg(kiln_avx512)]
    if table.isa == Isa::X86_64V4 && Isa::X86_64V4.is_supported() {
        table.gemm = avx512::gemm::UKR;
        table.depthwise = Entry::new("avx512f", avx512::conv::depthwise_plane);
        table.depthwise_nhwc = Entry::new("avx512f", avx512::conv::depthwise_row);
        const W: &str = avx512::math::VARIANT;
        table.exp = Entry::new(W, avx512::math::exp);
        table.sigmoid = Entry::new(W, avx512::math::sigmoid);
        table.silu = Entry::new(W, avx512::math::silu);
        table.tanh = Entry::new(W, avx512::math::tanh);
        table.erf = Entry::new(W, avx512::math::erf);
        table.gelu = Entry::new(W, avx512::math::gelu);
        if let Some(&q) = quant.iter().rev().find(|q| q.name.starts_with("avx512")) {
            table.quant = q;
        }
    }
}

/// Every x86 variant of the integer kernels this CPU runs, lowest first:
/// AVX2 (with FMA), AVX-VNNI, AVX-512BW, AVX-512 VNNI.
pub(crate) fn quant_variants() -> Vec<QuantKernels> {
    let mut all = Vec::new();
    if !Isa::X86_64V3.is_supported() {
        return all;
    }
    let avx2 = QuantKernels {
        name: "avx2",
        int8: avx2::quant::INT8_AVX2,
        weight_only: avx2::quant::WEIGHT_ONLY,
        quantize: Entry::new("avx2", avx2::quant::quantize),
    };
    all.push(avx2);
    if is_x86_feature_detected!("avxvnni") {
        all.push(QuantKernels { name: "avx_vnni", int8: avx2::quant::INT8_AVX_VNNI, ..avx2 });
    }
    #[cfg(kiln_avx512)]
    if Isa::X86_64V4.is_supported() && is_x86_feature_detected!("avx512bw") {
        all.push(QuantKernels {
            name: "avx512bw",
            int8: avx512::quant::INT8_AVX512BW,
            weight_only: avx512::quant::WEIGHT_ONLY,
            ..avx2
        });
    }
    #[cfg(kiln_avx512)]
    if Isa::X86_64V4.is_supported() && is_x86_feature_detected!("avx512vnni") {
        all.push(QuantKernels {
            name: "avx512_vnni",
            int8: avx512::quant::INT8_AVX512_VNNI,
            weight_only: avx512::quant::WEIGHT_ONLY,
            ..avx2
        });
    }
    all
}
