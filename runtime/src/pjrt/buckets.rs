//! Shape buckets at run time (`AccelProgram::buckets`): which bucket a run
//! takes, and the zero padding of arguments and slicing of results between a
//! tensor and the low corner of its padded shape.

use crate::{Error, Result};

/// The bucket to run for symbol values `sym_vals`: the one with the fewest
/// padded elements (product of its sizes) among those whose every size is at
/// least the run's; `None` when none fits (the plan runs on the CPU).
pub(crate) fn pick<'a>(sizes: impl Iterator<Item = &'a [u64]>, sym_vals: &[u64]) -> Option<usize> {
    sizes
        .enumerate()
        .filter(|(_, s)| s.len() == sym_vals.len() && s.iter().zip(sym_vals).all(|(b, v)| b >= v))
        .min_by_key(|(_, s)| s.iter().fold(1u128, |n, &d| n.saturating_mul(u128::from(d))))
        .map(|(i, _)| i)
}

/// Calls `copy(small_offset, big_offset, len)` (bytes) for every innermost
/// row of a row-major `small` array placed at the origin of a row-major
/// `big` one (elements of `elem` bytes). `Err` when `small` does not fit.
fn corner_rows(small: &[usize], big: &[usize], elem: usize, mut copy: impl FnMut(usize, usize, usize)) -> Result<()> {
    if small.len() != big.len() || small.iter().zip(big).any(|(s, b)| s > b) {
        return Err(Error::Shape(format!("shape {small:?} does not fit the bucket's {big:?}")));
    }
    let Some((&row, outer)) = small.split_last() else {
        copy(0, 0, elem);
        return Ok(());
    };
    if small.contains(&0) {
        return Ok(());
    }
    let big_row = big[big.len() - 1];
    let mut index = vec![0usize; outer.len()];
    loop {
        let (mut so, mut bo) = (0usize, 0usize);
        for (k, &i) in index.iter().enumerate() {
            so = so * small[k] + i;
            bo = bo * big[k] + i;
        }
        copy(so * row * elem, bo * big_row * elem, row * elem);
        // The next index of the outer dims, last fastest.
        let mut k = outer.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            index[k] += 1;
            if index[k] < outer[k] {
                break;
            }
            index[k] = 0;
        }
    }
}

/// Writes `src` (shape `shape`) zero-padded to `padded` into `dst`, which
/// has exactly the padded size.
pub(crate) fn pad(src: &[u8], shape: &[usize], padded: &[usize], elem: usize, dst: &mut [u8]) -> Result<()> {
    dst.fill(0);
    corner_rows(shape, padded, elem, |s, b, n| dst[b..b + n].copy_from_slice(&src[s..s + n]))
}

/// Writes the low corner of shape `shape` of `src` (shape `padded`) into `dst`.
pub(crate) fn slice(src: &[u8], padded: &[usize], shape: &[usize], elem: usize, dst: &mut [u8]) -> Result<()> {
    corner_rows(shape, padded, elem, |s, b, n| dst[s..s + n].copy_from_slice(&src[b..b + n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_and_slices_the_corner() {
        // [2,3] into [3,4] (1-byte elements).
        let src = [1u8, 2, 3, 4, 5, 6];
        let mut padded = [9u8; 12];
        pad(&src, &[2, 3], &[3, 4], 1, &mut padded).unwrap();
        assert_eq!(padded, [1, 2, 3, 0, 4, 5, 6, 0, 0, 0, 0, 0]);
        let mut back = [0u8; 6];
        slice(&padded, &[3, 4], &[2, 3], 1, &mut back).unwrap();
        assert_eq!(back, src);
        // 3-D with 2-byte elements, and a scalar.
        let src: Vec<u8> = (0..2 * 2 * 2 * 2).map(|v| v as u8).collect();
        let mut padded = vec![0u8; 2 * 3 * 2 * 2];
        pad(&src, &[2, 2, 2], &[2, 3, 2], 2, &mut padded).unwrap();
        assert_eq!(&padded[..8], &src[..8]);
        assert_eq!(&padded[8..12], &[0, 0, 0, 0]);
        assert_eq!(&padded[12..20], &src[8..16]);
        let mut one = [0u8; 4];
        pad(&[7, 7, 7, 7], &[], &[], 4, &mut one).unwrap();
        assert_eq!(one, [7; 4]);
        assert!(pad(&src, &[2, 4], &[2, 3], 1, &mut [0u8; 6]).is_err());
    }

    #[test]
    fn picks_the_smallest_bucket_that_fits() {
        let buckets: [&[u64]; 4] = [&[8, 16], &[4, 16], &[4, 32], &[16, 16]];
        assert_eq!(pick(buckets.iter().copied(), &[3, 16]), Some(1));
        assert_eq!(pick(buckets.iter().copied(), &[5, 9]), Some(0));
        assert_eq!(pick(buckets.iter().copied(), &[4, 17]), Some(2));
        assert_eq!(pick(buckets.iter().copied(), &[17, 1]), None);
    }
}
