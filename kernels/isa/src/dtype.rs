//! Element types.

use crate::code::code_enum;

code_enum! {
    /// Element type of a tensor.
    ///
    /// The set is closed on purpose: every pass and kernel matches on it.
    /// Codes leave room by family: floats from 0, signed integers from 16,
    /// unsigned from 32, bool at 48; sub-byte and quantized types (int4,
    /// f8) take new codes with their [`DType::bits`].
    pub enum DType ("dtype") {
        F32 = 0 => "f32",
        F64 = 1 => "f64",
        F16 = 2 => "f16",
        BF16 = 3 => "bf16",
        I8 = 16 => "i8",
        I16 = 17 => "i16",
        I32 = 18 => "i32",
        I64 = 19 => "i64",
        U8 = 32 => "u8",
        /// One byte per element, 0 or 1.
        Bool = 48 => "bool",
    }
}

impl DType {
    /// Bits one element occupies in memory. Every type today is a whole
    /// number of bytes; packed types (int4: 4 bits, two per byte) will not be.
    pub const fn bits(self) -> u32 {
        match self {
            DType::F64 | DType::I64 => 64,
            DType::F32 | DType::I32 => 32,
            DType::F16 | DType::BF16 | DType::I16 => 16,
            DType::I8 | DType::U8 | DType::Bool => 8,
        }
    }

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        (self.bits() / 8) as usize
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub const fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I16 | DType::I32 | DType::I64)
    }
}
