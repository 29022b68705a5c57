//! Element types.

use crate::code::code_enum;

code_enum! {
    /// Element type of a tensor.
    ///
    /// The set is closed on purpose: every pass and kernel matches on it.
    /// Codes leave room by family: floats from 0, signed integers from 16,
    /// unsigned from 32, bool at 48, complex at 64; sub-byte and quantized
    /// types (int4, f8) take new codes with their [`DType::bits`].
    ///
    /// The complex types exist only at a program's boundary: a caller's
    /// complex64 tensor of shape `S` is the bytes of an f32 tensor of shape
    /// `S + [2]` (interleaved real and imaginary parts, numpy's and torch's
    /// layout), which is what the program computes on. No kernel, IR value
    /// or plan tensor has a complex dtype (see [`DType::complex_part`]).
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
        /// Two f32 (real, imaginary): numpy's `<c8`, torch's complex64.
        C64 = 64 => "c64",
        /// Two f64: numpy's `<c16`, torch's complex128.
        C128 = 65 => "c128",
    }
}

impl DType {
    /// Bits one element occupies in memory. Every type today is a whole
    /// number of bytes; packed types (int4: 4 bits, two per byte) will not be.
    pub const fn bits(self) -> u32 {
        match self {
            DType::C128 => 128,
            DType::F64 | DType::I64 | DType::C64 => 64,
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

    pub const fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    /// The real type of each part of a complex type (c64 → f32, c128 → f64):
    /// what the program sees, with one more trailing dimension of 2.
    pub const fn complex_part(self) -> Option<DType> {
        match self {
            DType::C64 => Some(DType::F32),
            DType::C128 => Some(DType::F64),
            _ => None,
        }
    }

    /// The complex type whose parts are `self` (f32 → c64, f64 → c128).
    pub const fn complex_of(self) -> Option<DType> {
        match self {
            DType::F32 => Some(DType::C64),
            DType::F64 => Some(DType::C128),
            _ => None,
        }
    }
}
