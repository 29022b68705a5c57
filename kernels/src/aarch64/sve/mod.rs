//! SVE variants (Armv8.2+ Scalable Vector Extension: Graviton3's 256-bit
//! vectors, Graviton4's and Grace's 128-bit SVE2), chosen at run time after
//! `is_aarch64_feature_detected!("sve")`. SVE intrinsics are not stable
//! Rust, so the kernels are `asm!` inside `#[target_feature(enable = "sve")]`
//! functions. [`plug`] runs after the NEON one: the SVE table is the NEON
//! table with these entries replaced — the f32 GEMM microkernel
//! (`gemm.rs`) and exp, sigmoid and SiLU (`math.rs`).
//!
//! The vector length is the hardware's (128 to 2048 bits, read with `cntw`),
//! but no result depends on it: each kernel computes every output with the
//! NEON kernel's operations in the NEON kernel's order, predicated where a
//! vector is wider than the data, so the SVE table gives the NEON table's
//! bits at every vector length (`tests/variants.rs` checks this under qemu
//! at 128, 256 and 512 bits).

pub(crate) mod gemm;
pub(crate) mod math;

use crate::table::{Entry, KernelTable};
use std::arch::asm;

/// f32 lanes of one SVE vector on this CPU (`cntw`): 4 at 128 bits.
///
/// # Safety
/// The CPU must have SVE.
#[target_feature(enable = "sve")]
unsafe fn lanes_f32() -> usize {
    let lanes: usize;
    // SAFETY: `cntw` only reads the vector length (SVE, the caller's contract).
    unsafe { asm!("cntw {lanes}", lanes = out(reg) lanes, options(nomem, nostack, preserves_flags)) };
    lanes
}

/// f32 lanes of one SVE vector, or None without SVE.
pub(crate) fn vector_lanes() -> Option<usize> {
    // SAFETY: only called once SVE is detected.
    std::arch::is_aarch64_feature_detected!("sve").then(|| unsafe { lanes_f32() })
}

/// Overrides the entries that have an SVE version (call after the NEON
/// plug-in, only when SVE is detected).
pub(crate) fn plug(table: &mut KernelTable) {
    if let Some(&ukr) = gemm::variants().last() {
        table.gemm = ukr;
    }
    table.exp = Entry::new("sve", math::exp);
    table.sigmoid = Entry::new("sve", math::sigmoid);
    table.silu = Entry::new("sve", math::silu);
}
