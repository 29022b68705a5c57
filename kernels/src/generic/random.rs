//! Random tensors from a counter-based generator (Philox4x32-10).
//!
//! A counter-based generator needs no state between elements: element `i` of
//! a tensor is a pure function of (seed, call, stream, i). That makes the
//! kernel allocation-free, independent of evaluation order (so a future
//! multi-threaded or SIMD variant gives the same numbers), and reproducible:
//! the same seed, call number and stream always give the same tensor.
//!
//! - the **seed** is the session's (set by the user, fixed by default);
//! - the **call** is how many times the session has run before (so every run
//!   draws new numbers);
//! - the **stream** is the random op's number within the program (so two ops
//!   in one run draw different numbers).
//!
//! The numbers differ from PyTorch's (whose CPU generator is a sequential
//! Mersenne Twister); only the distributions agree.

use super::common::*;
use crate::types::{DType, Result, TensorMut};

pub use kiln_isa::RandomDist;

/// Where in the generator's sequence a tensor's numbers come from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RandomKey {
    pub seed: u64,
    pub call: u64,
    pub stream: u32,
}

const M0: u64 = 0xD251_1F53;
const M1: u64 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as
/// easy as 1, 2, 3", SC'11), the generator cuRAND and JAX use.
fn philox(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
        }
        let p0 = M0 * ctr[0] as u64;
        let p1 = M1 * ctr[2] as u64;
        ctr = [(p1 >> 32) as u32 ^ ctr[1] ^ key[0], p1 as u32, (p0 >> 32) as u32 ^ ctr[3] ^ key[1], p0 as u32];
    }
    ctr
}

impl RandomKey {
    /// Two independent 64-bit words for element (or draw) `i`.
    #[inline]
    fn words(&self, i: u64) -> (u64, u64) {
        // The call's high half goes into the key so that 2^64 calls stay distinct.
        let key = [self.seed as u32, (self.seed >> 32) as u32 ^ (self.call >> 32) as u32];
        let r = philox([i as u32, (i >> 32) as u32, self.stream, self.call as u32], key);
        (((r[0] as u64) << 32) | r[1] as u64, ((r[2] as u64) << 32) | r[3] as u64)
    }
}

/// A uniform in `[0, 1)` with `bits` bits of precision (so that it converts
/// to a float of that precision without rounding up to 1).
#[inline]
fn unit(word: u64, bits: u32) -> f64 {
    (word >> (64 - bits)) as f64 * (-(bits as f64)).exp2()
}

/// Significand bits of a float dtype (53 for anything else, unused there).
fn precision(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 24,
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 53,
    }
}

/// Fills `out` with numbers drawn from `dist` at `key`.
pub fn random(dist: RandomDist, key: RandomKey, mut out: TensorMut) -> Result<()> {
    const K: &str = "random";
    let float_out = matches!(out.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    match dist {
        RandomDist::Uniform { low, high } => {
            if !float_out {
                return Err(dtype_err(K, out.dtype));
            }
            let bits = precision(out.dtype);
            with_scalar!(out.dtype, T, {
                let o = view_mut::<T>(K, "out", &mut out)?;
                for (i, v) in o.iter_mut().enumerate() {
                    let u = unit(key.words(i as u64).0, bits);
                    *v = T::from_f64(low + (high - low) * u);
                }
            });
        }
        RandomDist::Normal { mean, std } => {
            if !float_out {
                return Err(dtype_err(K, out.dtype));
            }
            with_scalar!(out.dtype, T, {
                let o = view_mut::<T>(K, "out", &mut out)?;
                for (i, v) in o.iter_mut().enumerate() {
                    let (a, b) = key.words(i as u64);
                    // 1 - u is in (0, 1]: the logarithm stays finite.
                    let u1 = 1.0 - unit(a, 53);
                    let u2 = unit(b, 53);
                    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                    *v = T::from_f64(mean + std * z);
                }
            });
        }
        RandomDist::Int { low, high } => {
            if out.dtype == DType::Bool {
                return Err(dtype_err(K, out.dtype));
            }
            let range = high.wrapping_sub(low) as u64;
            if high <= low {
                return Err(shape_err(K, format!("empty integer range [{low}, {high})")));
            }
            with_scalar!(out.dtype, T, {
                let o = view_mut::<T>(K, "out", &mut out)?;
                for (i, v) in o.iter_mut().enumerate() {
                    // Multiply-shift maps the word onto the range without the
                    // modulo's bias toward small values.
                    let r = ((key.words(i as u64).0 as u128 * range as u128) >> 64) as u64;
                    *v = T::from_i64(low.wrapping_add(r as i64));
                }
            });
        }
        RandomDist::Perm => {
            if out.shape.len() != 1 || float_out || out.dtype == DType::Bool {
                return Err(shape_err(
                    K,
                    format!("a permutation needs a 1-D integer output, got {} {:?}", out.dtype, out.shape),
                ));
            }
            with_scalar!(out.dtype, T, {
                let o = view_mut::<T>(K, "out", &mut out)?;
                for (i, v) in o.iter_mut().enumerate() {
                    *v = T::from_i64(i as i64);
                }
                // Fisher–Yates, draw i picks among positions 0..=i.
                for i in (1..o.len()).rev() {
                    let j = ((key.words(i as u64).0 as u128 * (i as u128 + 1)) >> 64) as usize;
                    o.swap(i, j);
                }
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_reference_vectors() {
        // Known-answer tests from the Random123 distribution (kat_vectors, philox4x32_10).
        assert_eq!(philox([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox([0xffffffff; 4], [0xffffffff; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }
}
