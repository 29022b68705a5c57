//! Data-dependent selection: `nonzero`, whose output length is the number of
//! nonzero elements. The runtime binds that length before the kernel runs (from
//! a count computed by other kernels), so the kernel only checks it.

use super::common::{check_rank, numel, shape_err, MAX_RANK};
use crate::types::{DType, Result, TensorMut, TensorRef};

/// Writes the coordinates of `x`'s nonzero elements, in row-major order, into
/// `out` (i64 `[count, rank]`). A float is zero when every bit but the sign is
/// (so `-0.0` is zero and NaN is not), as in torch. Fails unless exactly
/// `count` elements are nonzero.
pub fn nonzero(x: TensorRef, out: TensorMut) -> Result<()> {
    const K: &str = "nonzero";
    check_rank(K, x.shape)?;
    let rank = x.shape.len();
    if out.dtype != DType::I64 || out.shape.len() != 2 || out.shape[1] != rank {
        return Err(shape_err(K, format!("output is {}{:?}, expected i64[count, {rank}]", out.dtype, out.shape)));
    }
    let size = x.dtype.size_bytes();
    let n = numel(K, x.shape)?;
    if n.checked_mul(size) != Some(x.data.len()) {
        return Err(shape_err(
            K,
            format!("input shape {:?} of {} does not match {} bytes", x.shape, x.dtype, x.data.len()),
        ));
    }
    let count = out.shape[0];
    if count.checked_mul(rank * 8) != Some(out.data.len()) {
        return Err(shape_err(K, format!("output shape {:?} does not match {} bytes", out.shape, out.data.len())));
    }
    let row_bytes = rank * 8;
    // The sign bit sits in the most significant (last, little-endian) byte.
    let top_mask = if matches!(x.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) { 0x7f } else { 0xff };
    let mut coords = [0usize; MAX_RANK];
    let mut found = 0usize;
    for elem in x.data.chunks_exact(size) {
        let (top, rest) = (elem[size - 1], &elem[..size - 1]);
        if top & top_mask != 0 || rest.iter().any(|&b| b != 0) {
            if found == count {
                return Err(shape_err(K, format!("more than the {count} nonzero elements the bound count promised")));
            }
            let row = &mut out.data[found * row_bytes..(found + 1) * row_bytes];
            for (d, &c) in row.chunks_exact_mut(8).zip(&coords[..rank]) {
                d.copy_from_slice(&(c as i64).to_le_bytes());
            }
            found += 1;
        }
        // Row-major odometer over the coordinates.
        for a in (0..rank).rev() {
            coords[a] += 1;
            if coords[a] < x.shape[a] {
                break;
            }
            coords[a] = 0;
        }
    }
    if found != count {
        return Err(shape_err(K, format!("{found} nonzero elements, but the bound count is {count}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dtype: DType, shape: &[usize], data: &[u8], count: usize) -> Result<Vec<i64>> {
        let rank = shape.len();
        let mut buf = vec![0u8; count * rank * 8];
        let out_shape = [count, rank];
        nonzero(TensorRef { dtype, shape, data }, TensorMut { dtype: DType::I64, shape: &out_shape, data: &mut buf })?;
        Ok(buf.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())
    }

    #[test]
    fn coordinates_in_row_major_order() {
        let x: Vec<u8> =
            [0.0f32, 1.5, -0.0, 0.0, f32::NAN, 0.0, -2.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        // [[0, 1.5, -0, 0], [nan, 0, -2, 0]]: -0.0 is zero, NaN is not.
        assert_eq!(run(DType::F32, &[2, 4], &x, 3).unwrap(), vec![0, 1, 1, 0, 1, 2]);
        let b = [0u8, 1, 1, 0, 0, 1];
        assert_eq!(run(DType::Bool, &[3, 1, 2], &b, 3).unwrap(), vec![0, 0, 1, 1, 0, 0, 2, 0, 1]);
        let i: Vec<u8> = [0i64, 256, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(run(DType::I64, &[3], &i, 1).unwrap(), vec![1]);
        // A 0-d input: one row of no coordinates when nonzero.
        assert_eq!(run(DType::I32, &[], &7i32.to_le_bytes(), 1).unwrap(), Vec::<i64>::new());
        assert_eq!(run(DType::F16, &[2], &[0, 0x80, 0, 0x3c], 1).unwrap(), vec![1]);
    }

    #[test]
    fn count_must_match() {
        let b = [1u8, 1, 0];
        assert!(run(DType::Bool, &[3], &b, 1).is_err());
        assert!(run(DType::Bool, &[3], &b, 3).is_err());
        assert!(run(DType::Bool, &[3], &b, 2).is_ok());
    }
}
