//! Constants as host tensors for compile-time evaluation.
//!
//! Elements are held as `f64` whatever the dtype: every supported integer fits
//! exactly as long as its magnitude is at most 2^53, which [`HostTensor::from_const`]
//! checks, and results are rounded back to the dtype when written.
//! f16/bf16 are not handled: passes do not depend on a half-float crate and such
//! constants are weights, not the shape arithmetic folding is for.

use kiln_ir::{ConstBytes, DType, Graph, TensorType, ValueId};

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

const MAX_EXACT_INT: f64 = (1u64 << 53) as f64;

pub(crate) fn supported(dtype: DType) -> bool {
    !matches!(dtype, DType::F16 | DType::BF16 | DType::C64 | DType::C128)
}

impl HostTensor {
    pub fn new(dtype: DType, shape: Vec<usize>, data: Vec<f64>) -> HostTensor {
        HostTensor { dtype, shape, data }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether every element is held exactly: floats always, integers while
    /// their magnitude is at most 2^53.
    pub fn is_exact(&self) -> bool {
        !self.dtype.is_int() || self.data.iter().all(|x| x.abs() <= MAX_EXACT_INT)
    }

    /// The constant defining `v`, or `None` when `v` is not a constant, has a
    /// symbolic shape, an unsupported dtype, a byte length that does not match its
    /// type, or integers too large to hold exactly.
    pub fn from_const(g: &Graph, v: ValueId) -> Option<HostTensor> {
        let c = g.const_of(v)?;
        let ty = g.ty(v);
        let shape = static_shape(ty)?;
        if !supported(ty.dtype) {
            return None;
        }
        let numel: usize = shape.iter().product();
        let bytes = c.bytes.as_bytes();
        let size = ty.dtype.size_bytes();
        if bytes.len() != numel.checked_mul(size)? {
            return None;
        }
        let data: Vec<f64> = bytes.chunks_exact(size).map(|b| decode(ty.dtype, b)).collect();
        Some(HostTensor { dtype: ty.dtype, shape, data }).filter(HostTensor::is_exact)
    }

    /// Little-endian bytes, each element rounded to the dtype (floats to nearest,
    /// integers truncated toward zero and wrapped, bool as non-zero).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() * self.dtype.size_bytes());
        for &x in &self.data {
            encode(self.dtype, x, &mut out);
        }
        out
    }

    pub fn tensor_type(&self) -> TensorType {
        TensorType::fixed(self.dtype, &self.shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
    }

    /// Adds this tensor to the graph as a new constant.
    pub fn add_to(&self, g: &mut Graph, name: Option<String>) -> ValueId {
        g.add_const(name, self.tensor_type(), ConstBytes::owned(self.to_bytes()))
    }
}

/// The shape as `usize`s when every dimension is static and non-negative.
pub(crate) fn static_shape(ty: &TensorType) -> Option<Vec<usize>> {
    ty.static_shape()?.into_iter().map(|d| usize::try_from(d).ok()).collect()
}

fn decode(dtype: DType, b: &[u8]) -> f64 {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => f64::from_le_bytes(arr(8)),
        DType::I64 => i64::from_le_bytes(arr(8)) as f64,
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
        DType::I8 => b[0] as i8 as f64,
        DType::U8 => b[0] as f64,
        DType::Bool => (b[0] != 0) as u8 as f64,
        // Filtered out by `supported`; reading them as zero keeps this total.
        DType::F16 | DType::BF16 | DType::C64 | DType::C128 => 0.0,
    }
}

fn encode(dtype: DType, x: f64, out: &mut Vec<u8>) {
    // `as i64` saturates and maps NaN to 0; the narrower casts then wrap like torch.
    kiln_ir::builder::write_scalar(dtype, x, x as i64, out)
}

/// A rank-0 constant of `dtype` holding `value` (the shared IR builder's,
/// which also encodes f16/bf16).
pub(crate) fn scalar_const(g: &mut Graph, dtype: DType, value: f64) -> ValueId {
    kiln_ir::builder::scalar_const(g, dtype, value)
}
