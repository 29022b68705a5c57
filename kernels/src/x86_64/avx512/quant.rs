//! AVX-512 VNNI int8 GEMM microkernel: `vpdpbusd` on zmm multiplies 64
//! u8·i8 pairs and adds each column's four into its i32 lane, exactly.
//! An 8×32 tile is 16 zmm accumulators (two strips of 16 columns per
//! row), two weight vectors and one broadcast per row and lane step.
//! Activations are stored as `q + 128` (u8); the driver subtracts
//! `128 · Σ_p w` per column.

use crate::quant::QGemmUkr;
use std::arch::x86_64::*;

const MR: usize = 8;
const NR: usize = 32;

/// The table entry; installed only after AVX-512F and AVX-512 VNNI were detected.
pub(crate) const INT8_AVX512_VNNI: QGemmUkr =
    QGemmUkr { variant: "avx512_vnni_8x32", mr: MR, nr: NR, offset: true, run: int8 };

fn int8(k4: usize, a: &[u8], lda: usize, b: &[u8], strip: usize, acc: &mut [i32]) {
    assert!(a.len() >= (MR - 1) * lda + 4 * k4, "qgemm: activation rows too short");
    assert!(b.len() >= strip + 64 * k4 && strip >= 64 * k4, "qgemm: weight strips too short");
    assert!(acc.len() >= MR * NR, "qgemm: accumulator tile too small");
    // SAFETY: the CPU has AVX-512F and VNNI (see the entry); the asserts
    // bound every load and store.
    unsafe { int8_inner(k4, a.as_ptr(), lda, b.as_ptr(), strip, acc) }
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_inner(k4: usize, a: *const u8, lda: usize, b: *const u8, strip: usize, acc: &mut [i32]) {
    let mut c = [[_mm512_setzero_si512(); 2]; MR];
    for t in 0..k4 {
        let w0 = _mm512_loadu_si512(b.add(t * 64) as *const _);
        let w1 = _mm512_loadu_si512(b.add(strip + t * 64) as *const _);
        for (i, ci) in c.iter_mut().enumerate() {
            let x = _mm512_set1_epi32((a.add(i * lda + 4 * t) as *const i32).read_unaligned());
            ci[0] = _mm512_dpbusd_epi32(ci[0], x, w0);
            ci[1] = _mm512_dpbusd_epi32(ci[1], x, w1);
        }
    }
    for (i, ci) in c.iter().enumerate() {
        _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR) as *mut _, ci[0]);
        _mm512_storeu_si512(acc.as_mut_ptr().add(i * NR + 16) as *mut _, ci[1]);
    }
}
