//! NEON f32 add/sub/mul/div over slices. Each lane is one IEEE operation, as
//! in the generic loop, so results are bit-identical; the loop handles eight
//! elements (two q registers) per step.

use std::arch::aarch64::*;

const LANES: usize = 4;
const STEP: usize = 2 * LANES;

macro_rules! binary_fns {
    ($($(#[$doc:meta])* $name:ident => $vector:ident, $op:tt;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(a: &[f32], b: &[f32], out: &mut [f32]) {
            let n = a.len().min(b.len()).min(out.len());
            let (a, b, out) = (&a[..n], &b[..n], &mut out[..n]);
            let mut os = out.chunks_exact_mut(STEP);
            let (mut az, mut bz) = (a.chunks_exact(STEP), b.chunks_exact(STEP));
            for ((o, x), y) in (&mut os).zip(&mut az).zip(&mut bz) {
                // SAFETY: every chunk holds exactly STEP = 2·LANES f32s, and
                // NEON is baseline on aarch64.
                unsafe {
                    let v0 = $vector(vld1q_f32(x.as_ptr()), vld1q_f32(y.as_ptr()));
                    let v1 = $vector(vld1q_f32(x.as_ptr().add(LANES)), vld1q_f32(y.as_ptr().add(LANES)));
                    vst1q_f32(o.as_mut_ptr(), v0);
                    vst1q_f32(o.as_mut_ptr().add(LANES), v1);
                }
            }
            for ((o, &x), &y) in os.into_remainder().iter_mut().zip(az.remainder()).zip(bz.remainder()) {
                *o = x $op y;
            }
        }
    )*};
}

binary_fns! {
    /// `out[i] = a[i] + b[i]`.
    add => vaddq_f32, +;
    /// `out[i] = a[i] - b[i]`.
    sub => vsubq_f32, -;
    /// `out[i] = a[i] * b[i]`.
    mul => vmulq_f32, *;
    /// `out[i] = a[i] / b[i]`.
    div => vdivq_f32, /;
}
