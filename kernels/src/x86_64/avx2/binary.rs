//! AVX2 f32 add/sub/mul/div over slices. Each lane is one IEEE operation, as
//! in the generic loop, so results are bit-identical; the win is 8 lanes per
//! instruction against baseline x86_64's 4.

use std::arch::x86_64::*;

const LANES: usize = 8;

macro_rules! binary_fns {
    ($($(#[$doc:meta])* $name:ident => $vector:ident, $op:tt;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(a: &[f32], b: &[f32], out: &mut [f32]) {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn run(a: &[f32], b: &[f32], out: &mut [f32]) {
                let n = a.len().min(b.len()).min(out.len());
                let (a, b, out) = (&a[..n], &b[..n], &mut out[..n]);
                let mut os = out.chunks_exact_mut(LANES);
                let (mut az, mut bz) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
                for ((o, x), y) in (&mut os).zip(&mut az).zip(&mut bz) {
                    // SAFETY: every chunk holds exactly LANES f32s.
                    let v = $vector(_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
                    _mm256_storeu_ps(o.as_mut_ptr(), v);
                }
                for ((o, &x), &y) in os.into_remainder().iter_mut().zip(az.remainder()).zip(bz.remainder()) {
                    *o = x $op y;
                }
            }
            // SAFETY: only installed by `plug` after AVX2 and FMA were detected.
            unsafe { run(a, b, out) }
        }
    )*};
}

binary_fns! {
    /// `out[i] = a[i] + b[i]`.
    add => _mm256_add_ps, +;
    /// `out[i] = a[i] - b[i]`.
    sub => _mm256_sub_ps, -;
    /// `out[i] = a[i] * b[i]`.
    mul => _mm256_mul_ps, *;
    /// `out[i] = a[i] / b[i]`.
    div => _mm256_div_ps, /;
}
