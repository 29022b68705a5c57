//! Portable implementations of every kernel. They are what runs when no
//! ISA-specific variant applies, and the oracle those variants are tested
//! against.

pub mod attention;
pub(crate) mod common;
pub mod conv;
pub(crate) mod conv_depthwise;
pub mod conv_nhwc;
pub(crate) mod conv_taps;
pub(crate) mod conv_winograd;
pub mod elementwise;
pub mod fused;
pub mod gemm;
pub mod grouped;
pub mod layout;
pub mod linalg;
pub mod math;
pub mod matmul;
pub mod norm;
pub mod pad;
pub mod polynomial;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod resize;
pub mod scatter;
pub mod select;
pub mod sort;
pub mod special;
pub(crate) mod vector;

use crate::table::{Entry, Isa, KernelTable};

/// The kernel table with the portable code in every entry; ISA plug-ins
/// override entries of a copy of it.
pub(crate) fn table() -> KernelTable {
    const G: &str = "generic";
    KernelTable {
        isa: Isa::Generic,
        gemm: gemm::GENERIC_UKR,
        exp: Entry::new(G, vector::exp::<f32>),
        sigmoid: Entry::new(G, vector::sigmoid::<f32>),
        silu: Entry::new(G, vector::silu::<f32>),
        tanh: Entry::new(G, vector::tanh::<f32>),
        erf: Entry::new(G, vector::erf::<f32>),
        gelu: Entry::new(G, vector::gelu::<f32>),
        gelu_tanh: Entry::new(G, vector::gelu_tanh_f32),
        add: Entry::new(G, vector::add::<f32>),
        sub: Entry::new(G, vector::sub::<f32>),
        mul: Entry::new(G, vector::mul::<f32>),
        div: Entry::new(G, vector::div::<f32>),
        max: Entry::new(G, vector::max::<f32>),
        exp_sum: Entry::new(G, vector::exp_sum::<f32>),
        column_sum: Entry::new(G, vector::column_sum::<f32>),
        layer_norm: Entry::new(G, norm::layer_norm_rows::<f32>),
        depthwise: Entry::new(G, conv_depthwise::depthwise_plane_generic),
        depthwise_nhwc: Entry::new(G, conv_nhwc::depthwise_row_generic),
        quant: crate::quant::GENERIC,
    }
}
