//! The grouped (mixture-of-experts) GEMM against a row-by-row reference: each
//! expert's block of rows times its own weight, empty experts, rows past the
//! last offset (zero), odd sizes, and offsets that must be refused.

mod common;

use common::*;
use kiln_kernels::*;

/// `out[r] = x[r] · w[e(r)]` computed one row at a time, in f64.
fn reference(x: &[f32], w: &[f32], ends: &[usize], (s, k, n): (usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; s * n];
    let mut start = 0;
    for (e, &end) in ends.iter().enumerate() {
        for r in start..end {
            for j in 0..n {
                out[r * n + j] = (0..k).map(|p| x[r * k + p] as f64 * w[e * k * n + p * n + j] as f64).sum();
            }
        }
        start = end;
    }
    out
}

fn run(ends: &[i64], s: usize, k: usize, n: usize, offs_dtype: DType) -> Result<Vec<f32>> {
    let e = ends.len();
    let mut r = rng(7);
    let x = f32s(&[s, k], &rand_f32(&mut r, s * k));
    let w = f32s(&[e, k, n], &rand_f32(&mut r, e * k * n));
    let offs = match offs_dtype {
        DType::I32 => Buf::from(DType::I32, &[e], &ends.iter().map(|&v| v as i32).collect::<Vec<_>>()),
        _ => Buf::from(DType::I64, &[e], ends),
    };
    let mut out = Buf::from(DType::F32, &[s, n], &vec![f32::NAN; s * n]);
    grouped_matmul(x.r(), w.r(), offs.r(), out.w(), &mut Context::new())?;
    let got = out.get::<f32>();
    let ends: Vec<usize> = ends.iter().map(|&v| v as usize).collect();
    let want = reference(&x.get::<f32>(), &w.get::<f32>(), &ends, (s, k, n));
    assert_close(&to64(&got), &want, 1e-5, 1e-5, &format!("grouped s={s} k={k} n={n} ends={ends:?}"));
    Ok(got)
}

#[test]
fn matches_rows_times_their_expert() {
    for &(s, k, n) in &[(1, 1, 1), (7, 17, 5), (17, 33, 40), (40, 7, 17)] {
        let a = s / 3;
        let b = (2 * s) / 3;
        run(&[a as i64, b as i64, s as i64], s, k, n, DType::I64).unwrap();
        run(&[a as i64, b as i64, s as i64], s, k, n, DType::I32).unwrap();
    }
}

#[test]
fn empty_experts_and_rows_past_the_last_offset() {
    // Expert 1 gets no rows; rows 9.. belong to nobody and must be zero, not NaN.
    let got = run(&[4, 4, 9], 12, 5, 6, DType::I64).unwrap();
    assert!(got[9 * 6..].iter().all(|&v| v == 0.0));
    let got = run(&[0, 0, 0], 3, 2, 2, DType::I64).unwrap();
    assert!(got.iter().all(|&v| v == 0.0));
}

#[test]
fn bad_offsets_are_errors() {
    for ends in [[3i64, 2, 5], [1, 2, 9], [-1, 2, 3]] {
        let err = run(&ends, 5, 2, 2, DType::I64).expect_err("bad offsets accepted");
        assert!(matches!(err, KernelError::Shape { .. }), "{err:?}");
    }
}
