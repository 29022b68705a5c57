//! Torch's serialized `ScalarType` numbering (torch/_export/serde/schema.py).
//! It is *not* c10's enum: 7 is float32 here, 6 in c10.

use kiln_ir::DType;

/// The kiln element type for a serialized ScalarType, or the torch name of a
/// type kiln does not have.
pub fn dtype_of(scalar_type: i64) -> Result<DType, String> {
    Ok(match scalar_type {
        1 => DType::U8,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        12 => DType::Bool,
        13 => DType::BF16,
        other => return Err(torch_name(other).to_string()),
    })
}

/// The element type of a stored tensor: [`dtype_of`]'s, and complex64 /
/// complex128 (a weight's bytes are read whole; the importer splits them
/// into the (real, imaginary) pairs programs compute on).
pub fn storage_dtype_of(scalar_type: i64) -> Result<DType, String> {
    match scalar_type {
        10 => Ok(DType::C64),
        11 => Ok(DType::C128),
        other => dtype_of(other),
    }
}

/// Torch's name for a serialized ScalarType (for messages).
pub fn torch_name(scalar_type: i64) -> &'static str {
    match scalar_type {
        0 => "unknown",
        1 => "uint8",
        2 => "int8",
        3 => "int16",
        4 => "int32",
        5 => "int64",
        6 => "float16",
        7 => "float32",
        8 => "float64",
        9 => "complex32",
        10 => "complex64",
        11 => "complex128",
        12 => "bool",
        13 => "bfloat16",
        28 => "uint16",
        29 => "float8_e4m3fn",
        30 => "float8_e5m2",
        31 => "float8_e4m3fnuz",
        32 => "float8_e5m2fnuz",
        33 => "float8_e8m0fnu",
        34 => "uint32",
        35 => "uint64",
        _ => "an unknown ScalarType number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_follows_the_export_schema() {
        let expect = [
            (1, DType::U8),
            (2, DType::I8),
            (3, DType::I16),
            (4, DType::I32),
            (5, DType::I64),
            (6, DType::F16),
            (7, DType::F32),
            (8, DType::F64),
            (12, DType::Bool),
            (13, DType::BF16),
        ];
        for (n, d) in expect {
            assert_eq!(dtype_of(n), Ok(d), "ScalarType {n}");
        }
        assert_eq!(dtype_of(10), Err("complex64".to_string()));
        assert_eq!(storage_dtype_of(10), Ok(DType::C64));
        assert_eq!(storage_dtype_of(11), Ok(DType::C128));
        assert_eq!(storage_dtype_of(9), Err("complex32".to_string()));
        assert_eq!(storage_dtype_of(7), Ok(DType::F32));
        assert_eq!(dtype_of(29), Err("float8_e4m3fn".to_string()));
        assert_eq!(dtype_of(0), Err("unknown".to_string()));
        assert_eq!(dtype_of(-3), Err("an unknown ScalarType number".to_string()));
    }
}
