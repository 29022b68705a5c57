//! Grouped matrix multiplication: the experts of a mixture-of-experts layer.
//!
//! The rows of `x` are sorted by expert; `offs[e]` is where expert `e`'s rows
//! end (a cumulative count, as `transformers::grouped_mm_fallback` takes it).
//! Each expert's block of rows is one GEMM against its own weight matrix, so
//! the work is one packed GEMM per expert with a non-empty block, never a
//! per-token product. Rows past the last offset are zero.

use super::common::{dtype_err, expect_dtype, shape_err, view, view_mut};
use super::gemm::gemm_f32;
use crate::context::Context;
use crate::types::{DType, Result, TensorMut, TensorRef};

/// `out[r] = x[r] · w[e]` for the rows `r` in `offs[e-1]..offs[e]`:
/// `x` `[S, K]` f32, `w` `[E, K, N]` f32, `offs` `[E]` i32/i64
/// non-decreasing and at most `S`, `out` `[S, N]`.
pub fn grouped_matmul(x: TensorRef, w: TensorRef, offs: TensorRef, mut out: TensorMut, cx: &mut Context) -> Result<()> {
    const K: &str = "grouped_matmul";
    expect_dtype(K, "x", x.dtype, DType::F32)?;
    expect_dtype(K, "w", w.dtype, DType::F32)?;
    expect_dtype(K, "out", out.dtype, DType::F32)?;
    let (&[s, k], &[e, wk, n], &[oe]) = (x.shape, w.shape, offs.shape) else {
        return Err(shape_err(
            K,
            format!("x {:?}, w {:?}, offs {:?}: want [S, K], [E, K, N], [E]", x.shape, w.shape, offs.shape),
        ));
    };
    if wk != k || oe != e || out.shape != [s, n] {
        return Err(shape_err(
            K,
            format!("x {:?}, w {:?}, offs {:?}, out {:?}", x.shape, w.shape, offs.shape, out.shape),
        ));
    }
    let ends = read_offsets(K, offs, s)?;
    let xv = view::<f32>(K, "x", &x)?;
    let wv = view::<f32>(K, "w", &w)?;
    let ov = view_mut::<f32>(K, "out", &mut out)?;
    let mut start = 0;
    for (expert, &end) in ends.iter().enumerate() {
        if end > start {
            let rows = end - start;
            let a = &xv[start * k..end * k];
            let b = &wv[expert * k * n..(expert + 1) * k * n];
            gemm_f32(rows, n, k, a, k, b, n, &mut ov[start * n..end * n], n, false, 0.0, cx)?;
        }
        start = end;
    }
    ov[start * n..].fill(0.0);
    Ok(())
}

/// The expert blocks' end rows, checked: non-decreasing, within `0..=rows`.
fn read_offsets(kernel: &'static str, offs: TensorRef, rows: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = match offs.dtype {
        DType::I64 => view::<i64>(kernel, "offs", &offs)?.to_vec(),
        DType::I32 => view::<i32>(kernel, "offs", &offs)?.iter().map(|&v| v as i64).collect(),
        other => return Err(dtype_err(kernel, other)),
    };
    let mut prev = 0usize;
    raw.iter()
        .map(|&end| {
            let end_ok = usize::try_from(end).ok().filter(|&e| e >= prev && e <= rows);
            let end = end_ok.ok_or_else(|| {
                shape_err(kernel, format!("offsets {raw:?} must be non-decreasing and at most the {rows} rows"))
            })?;
            prev = end;
            Ok(end)
        })
        .collect()
}
