//! Torch's type promotion (`torch.result_type`), for the binary ops whose
//! operands kiln must cast to one dtype.
//!
//! Categories rank bool < integer < float. The result takes the highest
//! category present; within it, dimensioned tensors outrank 0-d tensors, which
//! outrank Python scalars — a lower-priority operand only matters when it
//! raises the category (`int_tensor * 2.5` is float32, `f16_tensor * 2.5`
//! stays float16).

use kiln_ir::DType;

/// One operand of a promoting op.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum Operand {
    /// A tensor of rank ≥ 1.
    Tensor(DType),
    /// A 0-d tensor.
    ZeroDim(DType),
    /// A Python scalar: `Bool`, `I64` (int) or `F32`/`F64` (float) stand-in.
    Scalar(DType),
}

fn category(d: DType) -> u8 {
    if d == DType::Bool {
        0
    } else if d.is_int() {
        1
    } else {
        2
    }
}

/// The promotion of two dtypes of the same priority (`torch.promote_types`).
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let (ca, cb) = (category(a), category(b));
    if ca != cb {
        return if ca > cb { a } else { b };
    }
    match (a, b) {
        (F16, BF16) | (BF16, F16) => F32,
        (U8, I8) | (I8, U8) => I16,
        (U8, x) | (x, U8) => x,
        _ => {
            if a.size_bytes() >= b.size_bytes() {
                a
            } else {
                b
            }
        }
    }
}

/// `torch.result_type` over operands; `default_float` is torch's default dtype.
pub(crate) fn result_type(ops: &[Operand], default_float: DType) -> DType {
    let mut best: [Option<DType>; 3] = [None, None, None]; // by priority: tensor, 0-d, scalar
    for op in ops {
        let (slot, d) = match *op {
            Operand::Tensor(d) => (0, d),
            Operand::ZeroDim(d) => (1, d),
            Operand::Scalar(d) => (2, d),
        };
        best[slot] = Some(best[slot].map_or(d, |b| promote_types(b, d)));
    }
    let mut result: Option<DType> = None;
    for (slot, d) in best.iter().enumerate() {
        let Some(d) = *d else { continue };
        result = Some(match result {
            None if slot == 2 => scalar_dtype(d, default_float),
            None => d,
            Some(r) if category(d) > category(r) => {
                if slot == 2 {
                    scalar_dtype(d, default_float)
                } else {
                    d
                }
            }
            Some(r) => r,
        });
    }
    result.unwrap_or(default_float)
}

/// The tensor dtype a lone Python scalar becomes.
fn scalar_dtype(d: DType, default_float: DType) -> DType {
    match category(d) {
        0 => DType::Bool,
        1 => DType::I64,
        _ => default_float,
    }
}

#[cfg(test)]
mod tests {
    use super::Operand::*;
    use super::*;
    use DType::*;

    #[test]
    fn follows_torch_result_type() {
        assert_eq!(result_type(&[Tensor(I32), Scalar(F32)], F32), F32);
        assert_eq!(result_type(&[Tensor(F16), Scalar(F32)], F32), F16);
        assert_eq!(result_type(&[Tensor(I32), Scalar(I64)], F32), I32);
        assert_eq!(result_type(&[Tensor(Bool), Scalar(I64)], F32), I64);
        assert_eq!(result_type(&[Tensor(F16), ZeroDim(F64)], F32), F16);
        assert_eq!(result_type(&[Tensor(I64), ZeroDim(F64)], F32), F64);
        assert_eq!(result_type(&[Tensor(F16), Tensor(BF16)], F32), F32);
        assert_eq!(result_type(&[Tensor(U8), Tensor(I8)], F32), I16);
        assert_eq!(result_type(&[Tensor(I32), Tensor(I64)], F32), I64);
        assert_eq!(result_type(&[ZeroDim(I64), ZeroDim(F32)], F32), F32);
        assert_eq!(result_type(&[Tensor(Bool), Tensor(Bool)], F32), Bool);
    }
}
