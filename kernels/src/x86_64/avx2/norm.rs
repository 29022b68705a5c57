//! Layer norm rows compiled for AVX2 + FMA: the generic code (the same
//! operations in the same order, so the same bits; Rust never contracts
//! `a * b + c` into an FMA), with 4-lane f64 vectors for its sums and
//! element loops.

/// [`crate::generic::norm::layer_norm_rows`] under AVX2 + FMA.
pub(crate) fn layer_norm_rows(x: &[f32], out: &mut [f32], d: usize, w: Option<&[f32]>, b: Option<&[f32]>, eps: f64) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(x: &[f32], out: &mut [f32], d: usize, w: Option<&[f32]>, b: Option<&[f32]>, eps: f64) {
        crate::generic::norm::layer_norm_rows::<f32>(x, out, d, w, b, eps)
    }
    // SAFETY: installed in a kernel table only after AVX2 and FMA were
    // detected (`x86_64::plug`).
    unsafe { run(x, out, d, w, b, eps) }
}
