//! Adding nodes whose result types kiln infers: the one IR builder the
//! importer, custom-op lowerings and the passes' rewrites share.
//!
//! Naming, everywhere: `push(op, inputs)` infers the result type;
//! `push_typed(op, inputs, ty)` takes a declared one.

use crate::{infer, DType, Graph, LocId, Op, TensorType, ValueId};

pub struct Builder<'g> {
    pub g: &'g mut Graph,
    /// The source location every node built here gets.
    pub loc: Option<LocId>,
}

impl<'g> Builder<'g> {
    pub fn new(g: &'g mut Graph, loc: Option<LocId>) -> Builder<'g> {
        Builder { g, loc }
    }

    /// The one result type of `op` on `inputs` (an error for ops with none).
    pub fn infer(&self, op: &Op, inputs: &[ValueId]) -> Result<TensorType, String> {
        infer_one(self.g, op, inputs)
    }

    /// Adds `op` with its result type inferred from the operands.
    pub fn push(&mut self, op: Op, inputs: Vec<ValueId>) -> Result<ValueId, String> {
        let ty = self.infer(&op, &inputs)?;
        Ok(self.push_typed(op, inputs, ty))
    }

    /// Adds `op` with a result type the caller vouches for.
    pub fn push_typed(&mut self, op: Op, inputs: Vec<ValueId>, ty: TensorType) -> ValueId {
        self.g.push(op, inputs, ty, self.loc)
    }

    /// A 0-d constant of `dtype` holding `value`, rounded to the dtype as a
    /// cast would (floats to nearest, integers toward zero and wrapped, bool
    /// `value != 0`).
    pub fn scalar(&mut self, dtype: DType, value: f64) -> ValueId {
        scalar_const(self.g, dtype, value)
    }
}

/// [`Builder::infer`] without a builder.
pub fn infer_one(g: &Graph, op: &Op, inputs: &[ValueId]) -> Result<TensorType, String> {
    let tys: Vec<&TensorType> = inputs.iter().map(|&v| g.ty(v)).collect();
    match infer::infer_types(&g.symbols, op, &tys) {
        Ok(mut t) if !t.is_empty() => Ok(t.remove(0)),
        Ok(_) => Err(format!("`{}` has no result", op.name())),
        Err(e) => Err(format!("`{}`: {e}", op.name())),
    }
}

/// [`Builder::scalar`] without a builder.
pub fn scalar_const(g: &mut Graph, dtype: DType, value: f64) -> ValueId {
    g.add_const(None, TensorType::new(dtype, Vec::new()), crate::ConstBytes::owned(scalar_bytes(dtype, value)))
}

/// The little-endian bytes of one `dtype` element holding `value`.
pub fn scalar_bytes(dtype: DType, value: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(dtype.size_bytes());
    // `as i64` saturates, truncates toward zero and maps NaN to 0.
    write_scalar(dtype, value, value as i64, &mut out);
    out
}

/// Appends one `dtype` element: `float` for the float types and bool
/// (`!= 0`), `int` — the exact integer, which an f64 cannot hold beyond
/// 2^53 — for the integer types, wrapped to their width like torch's casts.
pub fn write_scalar(dtype: DType, float: f64, int: i64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&(float as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&float.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&half::f16::from_f32(float as f32).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(float as f32).to_le_bytes()),
        DType::I8 => out.push(int as i8 as u8),
        DType::U8 => out.push(int as u8),
        DType::I16 => out.extend_from_slice(&(int as i16).to_le_bytes()),
        DType::I32 => out.extend_from_slice(&(int as i32).to_le_bytes()),
        DType::I64 => out.extend_from_slice(&int.to_le_bytes()),
        DType::Bool => out.push(u8::from(float != 0.0)),
        // A real scalar as complex: a zero imaginary part.
        DType::C64 | DType::C128 => {
            let part = dtype.complex_part().unwrap_or(DType::F64);
            write_scalar(part, float, int, out);
            write_scalar(part, 0.0, 0, out);
        }
    }
}
