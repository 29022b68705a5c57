//! Shared plumbing for the generic kernels: typed views over the byte
//! buffers, per-dtype element traits, dtype dispatch macros and the
//! broadcasting arithmetic every elementwise kernel needs.

use crate::types::{DType, KernelError, Result, TensorMut, TensorRef};
use bytemuck::Pod;
use half::{bf16, f16};

/// Bool is stored as one byte; a newtype keeps it apart from `u8` in the
/// type-driven dispatch (cast rules and op support differ).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(transparent)]
pub struct Bool8(pub u8);

// SAFETY: a transparent wrapper around u8; every bit pattern is a valid value.
unsafe impl bytemuck::Zeroable for Bool8 {}
unsafe impl bytemuck::Pod for Bool8 {}

/// Conversion hub for every storable element: floats go through f64, integers
/// through i64 so that 64-bit integers round-trip exactly.
pub trait Scalar: Pod + PartialOrd + Default + Send + Sync + 'static {
    const DTYPE: DType;
    const IS_FLOAT: bool;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    /// Float→int truncates toward zero (torch), →Bool is `!= 0`.
    fn from_f64(v: f64) -> Self;
    /// Int→int wraps (two's complement), →Bool is `!= 0`.
    fn from_i64(v: i64) -> Self;
}

macro_rules! impl_scalar_int {
    ($($t:ty => $d:ident),*) => {$(
        impl Scalar for $t {
            const DTYPE: DType = DType::$d;
            const IS_FLOAT: bool = false;
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
impl_scalar_int!(i8 => I8, u8 => U8, i16 => I16, i32 => I32, i64 => I64);

macro_rules! impl_scalar_native_float {
    ($($t:ty => $d:ident),*) => {$(
        impl Scalar for $t {
            const DTYPE: DType = DType::$d;
            const IS_FLOAT: bool = true;
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
impl_scalar_native_float!(f32 => F32, f64 => F64);

macro_rules! impl_scalar_half {
    ($($t:ty => $d:ident),*) => {$(
        impl Scalar for $t {
            const DTYPE: DType = DType::$d;
            const IS_FLOAT: bool = true;
            #[inline(always)] fn to_f64(self) -> f64 { self.to_f64() }
            #[inline(always)] fn to_i64(self) -> i64 { self.to_f64() as i64 }
            // Through f32, as torch converts (c10's Half and BFloat16 are
            // made from a float; its CPU kernels compute halves in f32):
            // `half`'s own f64 conversions round from the f64's upper word
            // only (a wrong sticky bit) where the CPU lacks F16C, and round
            // twice where it has it, so their bits depended on the CPU.
            #[inline(always)] fn from_f64(v: f64) -> Self { <$t>::from_f32(v as f32) }
            #[inline(always)] fn from_i64(v: i64) -> Self { <$t>::from_f32(v as f32) }
        }
    )*};
}
impl_scalar_half!(f16 => F16, bf16 => BF16);

impl Scalar for Bool8 {
    const DTYPE: DType = DType::Bool;
    const IS_FLOAT: bool = false;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        (self.0 != 0) as u8 as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        (self.0 != 0) as i64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Bool8((v != 0) as u8)
    }
}

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! with_scalar {
    ($dtype:expr, $T:ident, $body:expr) => {
        match $dtype {
            $crate::types::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::types::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::types::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::types::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::types::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::types::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::types::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::types::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::types::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::types::DType::Bool => {
                type $T = $crate::generic::common::Bool8;
                $body
            }
            // Complex tensors are only the caller's view of a program's
            // f32/f64 pairs; a plan never hands one to a kernel.
            d @ ($crate::types::DType::C64 | $crate::types::DType::C128) => {
                return Err($crate::generic::common::complex_err(d))
            }
        }
    };
}
pub(crate) use with_scalar;

/// The error for a complex tensor reaching a kernel (see `with_scalar!`).
pub(crate) fn complex_err(dtype: DType) -> KernelError {
    shape_err(
        "kernels",
        format!("{dtype} tensors exist only at a program's boundary; kernels compute on their f32/f64 parts"),
    )
}

/// Runs `$body` with `$T` bound to an unsigned type of the dtype's width:
/// data-movement kernels only need the element size, not its meaning.
macro_rules! with_elem_size {
    ($dtype:expr, $T:ident, $body:expr) => {
        match $dtype.size_bytes() {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            8 => {
                type $T = u64;
                $body
            }
            // 16 bytes: only c128, which no plan hands to a kernel.
            _ => return Err($crate::generic::common::complex_err($dtype)),
        }
    };
}
pub(crate) use with_elem_size;

pub fn shape_err(kernel: &'static str, detail: impl Into<String>) -> KernelError {
    KernelError::Shape { kernel, detail: detail.into() }
}

pub fn dtype_err(kernel: &'static str, dtype: DType) -> KernelError {
    KernelError::UnsupportedDType { kernel, dtype }
}

/// Element count of a shape, or an error when it overflows `usize`.
pub fn numel(kernel: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| shape_err(kernel, format!("shape {shape:?} overflows usize")))
}

fn check_len(kernel: &'static str, what: &str, dtype: DType, shape: &[usize], len: usize) -> Result<usize> {
    let n = numel(kernel, shape)?;
    let want = n
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| shape_err(kernel, format!("{what}: shape {shape:?} overflows usize")))?;
    if want != len {
        return Err(shape_err(
            kernel,
            format!("{what}: shape {shape:?} of {dtype} needs {want} bytes, buffer has {len}"),
        ));
    }
    Ok(n)
}

/// Checks the buffer length against shape × dtype and returns the typed slice.
pub fn view<'a, T: Pod>(kernel: &'static str, what: &str, t: &TensorRef<'a>) -> Result<&'a [T]> {
    check_len(kernel, what, t.dtype, t.shape, t.data.len())?;
    if std::mem::size_of::<T>() != t.dtype.size_bytes() {
        return Err(shape_err(kernel, format!("{what}: element size mismatch for {}", t.dtype)));
    }
    bytemuck::try_cast_slice(t.data).map_err(|e| shape_err(kernel, format!("{what}: {e:?} (buffer misaligned?)")))
}

pub fn view_mut<'a, T: Pod>(kernel: &'static str, what: &str, t: &'a mut TensorMut<'_>) -> Result<&'a mut [T]> {
    check_len(kernel, what, t.dtype, t.shape, t.data.len())?;
    if std::mem::size_of::<T>() != t.dtype.size_bytes() {
        return Err(shape_err(kernel, format!("{what}: element size mismatch for {}", t.dtype)));
    }
    bytemuck::try_cast_slice_mut(&mut *t.data)
        .map_err(|e| shape_err(kernel, format!("{what}: {e:?} (buffer misaligned?)")))
}

pub fn expect_dtype(kernel: &'static str, what: &str, got: DType, want: DType) -> Result<()> {
    if got != want {
        return Err(shape_err(kernel, format!("{what}: dtype {got}, expected {want}")));
    }
    Ok(())
}

/// Row-major strides (in elements).
pub fn strides_of(shape: &[usize], out: &mut [usize]) {
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        out[i] = s;
        s *= shape[i];
    }
}

/// Highest rank any kernel handles; lets index bookkeeping live on the stack.
pub const MAX_RANK: usize = 16;

pub fn check_rank(kernel: &'static str, shape: &[usize]) -> Result<()> {
    if shape.len() > MAX_RANK {
        return Err(shape_err(kernel, format!("rank {} exceeds the maximum {MAX_RANK}", shape.len())));
    }
    Ok(())
}

/// Numpy broadcast of `shapes`, or `None` when they are incompatible.
pub fn broadcast_shape(shapes: &[&[usize]], out: &mut [usize; MAX_RANK]) -> Option<usize> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    if rank > MAX_RANK {
        return None;
    }
    for i in 0..rank {
        let mut d = 1;
        for s in shapes {
            if i < s.len() {
                let sd = s[s.len() - 1 - i];
                if sd != 1 {
                    if d != 1 && d != sd {
                        return None;
                    }
                    d = sd;
                }
            }
        }
        out[rank - 1 - i] = d;
    }
    Some(rank)
}

/// Validates that `out_shape` is the broadcast of `inputs`.
pub fn check_broadcast(kernel: &'static str, inputs: &[&[usize]], out_shape: &[usize]) -> Result<()> {
    let mut b = [0usize; MAX_RANK];
    let rank = broadcast_shape(inputs, &mut b)
        .ok_or_else(|| shape_err(kernel, format!("shapes {inputs:?} do not broadcast")))?;
    if &b[..rank] != out_shape {
        return Err(shape_err(
            kernel,
            format!("output shape {out_shape:?} is not the broadcast {:?} of {inputs:?}", &b[..rank]),
        ));
    }
    Ok(())
}

/// Element strides of `shape` seen through broadcasting to `out_shape`
/// (right-aligned, 0 on broadcast dims). `out_shape.len() >= shape.len()`.
pub fn broadcast_strides(shape: &[usize], out_shape: &[usize], strides: &mut [usize]) {
    let r = out_shape.len();
    let off = r - shape.len();
    let mut s = 1;
    for i in (0..r).rev() {
        if i < off || shape[i - off] == 1 {
            strides[i] = 0;
        } else {
            strides[i] = s;
            s *= shape[i - off];
        }
    }
}

/// An output shape with per-operand strides, with size-1 dims dropped and
/// adjacent dims merged whenever every operand stays linear across them. After
/// collapsing, the innermost dim is as long as possible, which is what the
/// tight inner loops want.
pub struct Collapsed<const N: usize> {
    pub rank: usize,
    pub shape: [usize; MAX_RANK],
    pub strides: [[usize; MAX_RANK]; N],
}

// Operands are parallel arrays indexed by operand number; range loops read clearest.
#[allow(clippy::needless_range_loop)]
impl<const N: usize> Collapsed<N> {
    pub fn new(shape: &[usize], strides: [&[usize]; N]) -> Self {
        let mut c = Collapsed { rank: 0, shape: [1; MAX_RANK], strides: [[0; MAX_RANK]; N] };
        for i in 0..shape.len() {
            if shape[i] == 1 {
                continue;
            }
            if c.rank > 0 {
                let last = c.rank - 1;
                let mergeable = (0..N).all(|o| c.strides[o][last] == strides[o][i] * shape[i]);
                if mergeable {
                    c.shape[last] *= shape[i];
                    for o in 0..N {
                        c.strides[o][last] = strides[o][i];
                    }
                    continue;
                }
            }
            c.shape[c.rank] = shape[i];
            for o in 0..N {
                c.strides[o][c.rank] = strides[o][i];
            }
            c.rank += 1;
        }
        if c.rank == 0 {
            // A scalar: one dim of length 1 keeps the loops uniform.
            c.rank = 1;
            c.shape[0] = 1;
            for o in 0..N {
                c.strides[o][0] = 0;
            }
        }
        c
    }

    /// Calls `f(offsets, inner_len, inner_strides)` once per innermost row, in
    /// row-major order of the output.
    pub fn for_each_row(&self, mut f: impl FnMut([usize; N], usize, [usize; N])) {
        let r = self.rank;
        let inner = self.shape[r - 1];
        let inner_strides: [usize; N] = std::array::from_fn(|o| self.strides[o][r - 1]);
        let rows: usize = self.shape[..r - 1].iter().product();
        if inner == 0 || rows == 0 {
            return;
        }
        let mut idx = [0usize; MAX_RANK];
        let mut off = [0usize; N];
        for _ in 0..rows {
            f(off, inner, inner_strides);
            // Odometer increment over the outer dims.
            let mut d = r - 1;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for o in 0..N {
                    off[o] += self.strides[o][d];
                }
                if idx[d] < self.shape[d] {
                    break;
                }
                for o in 0..N {
                    off[o] -= self.strides[o][d] * self.shape[d];
                }
                idx[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Half results round from their f32 value, as torch's do, on every CPU:
    /// `half`'s f64 conversions round from the f64's upper word (a value
    /// just above a bf16 tie by the f32's lowest bit rounded as the tie) or,
    /// with F16C, through f32 — so the bits depended on the CPU.
    #[test]
    fn halves_round_from_the_f32_value() {
        // bf16 1 + 2⁻⁸ is a tie between 1 and 1 + 2⁻⁷; one f32 ulp above it
        // rounds up.
        let above_tie = f32::from_bits(0x3F80_8001) as f64;
        assert_eq!(<bf16 as Scalar>::from_f64(above_tie).to_bits(), 0x3F81);
        assert_eq!(<bf16 as Scalar>::from_f64(f32::from_bits(0x3F80_8000) as f64).to_bits(), 0x3F80);
        // An f64 just above an f16 tie that f32 cannot hold rounds to the
        // tie in f32, then to even: torch's float result, then its rounding.
        let near_tie = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<f16 as Scalar>::from_f64(near_tie).to_bits(), 0x3C00);
        assert_eq!(<bf16 as Scalar>::from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-40)).to_bits(), 0x3F80);
        // Integers through their f32 too.
        assert_eq!(<bf16 as Scalar>::from_i64(257).to_bits(), bf16::from_f32(256.0).to_bits());
        assert_eq!(<f16 as Scalar>::from_i64(2049).to_bits(), f16::from_f32(2048.0).to_bits());
    }
}
