//! Helpers shared by the runtime's hand-built-plan tests (each test file is
//! its own crate and includes this module).

use kiln_runtime::format::{DType, DimRef, Storage, TensorDecl};

/// An f32 tensor of `shape` in the arena at `offset`.
pub fn arena(shape: &[u64], offset: u64) -> TensorDecl {
    let bytes = shape.iter().product::<u64>() * 4;
    TensorDecl {
        dtype: DType::F32,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage: Storage::Arena { offset, max_bytes: bytes },
    }
}
