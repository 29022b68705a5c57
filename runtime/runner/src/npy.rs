//! Reading and writing NumPy `.npy` files (format versions 1–3, C order,
//! little-endian), for `kiln run` / `kiln-run` inputs and outputs.

use kiln_runtime::{DType, Tensor, TensorView};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a valid .npy file: {detail}")]
    Format { path: String, detail: String },
}

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        // NumPy has no bfloat16; store the raw bits as unsigned 16-bit integers.
        DType::BF16 => "<u2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
    }
}

fn dtype_of(descr: &str) -> Option<DType> {
    Some(match descr {
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "<f2" => DType::F16,
        // bfloat16 bits, as `descr` writes them (kiln has no uint16 dtype).
        "<u2" => DType::BF16,
        "|i1" | "<i1" => DType::I8,
        "|u1" | "<u1" => DType::U8,
        "<i2" => DType::I16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|b1" | "<b1" => DType::Bool,
        "<c8" => DType::C64,
        "<c16" => DType::C128,
        _ => return None,
    })
}

pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
    let bytes = std::fs::read(path).map_err(|e| NpyError::Io { path: path.display().to_string(), source: e })?;
    parse_npy(&bytes).map_err(|detail| NpyError::Format { path: path.display().to_string(), detail })
}

pub fn parse_npy(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("missing the \\x93NUMPY magic".into());
    }
    let major = bytes[6];
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        _ => return Err(format!("unsupported format version {major}")),
    };
    let end =
        start.checked_add(header_len).filter(|&e| e <= bytes.len()).ok_or("header runs past the end of the file")?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| "header is not text")?;
    let field = |key: &str| -> Result<&str, String> {
        let at = header.find(&format!("'{key}'")).ok_or(format!("header has no '{key}'"))?;
        let rest = header[at + key.len() + 2..].trim_start();
        Ok(rest.strip_prefix(':').ok_or(format!("malformed '{key}' entry"))?.trim_start())
    };
    let descr_text = field("descr")?;
    let descr = descr_text.strip_prefix('\'').and_then(|r| r.split('\'').next()).ok_or("malformed descr")?;
    let dtype = dtype_of(descr).ok_or(format!(
        "unsupported dtype '{descr}' (kiln reads f2/f4/f8, i1/i2/i4/i8, u1, b1, c8/c16, u2 as bfloat16 bits; little-endian)"
    ))?;
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran-order arrays are not supported; save with np.ascontiguousarray".into());
    }
    let shape_text = field("shape")?;
    let inner = shape_text.strip_prefix('(').and_then(|r| r.split(')').next()).ok_or("malformed shape")?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>().map_err(|_| format!("bad dimension '{s}' in shape")))
        .collect::<Result<Vec<_>, _>>()?;
    let len = shape.iter().try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d)).ok_or("shape is too large")?;
    let data = &bytes[end..];
    if data.len() != len {
        return Err(format!("shape {shape:?} of {descr} needs {len} data bytes, file has {}", data.len()));
    }
    Ok(Tensor { dtype, shape, data: data.to_vec() })
}

pub fn encode_npy(t: &TensorView<'_>) -> Vec<u8> {
    let shape = match t.shape.len() {
        1 => format!("({},)", t.shape[0]),
        _ => format!("({})", t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}", descr(t.dtype));
    // Pad so the data starts at a multiple of 64, newline-terminated, as NumPy does.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.data);
    out
}

pub fn write_npy(path: &Path, t: &TensorView<'_>) -> Result<(), NpyError> {
    std::fs::write(path, encode_npy(t)).map_err(|e| NpyError::Io { path: path.display().to_string(), source: e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let t = Tensor::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let bytes = encode_npy(&t.view());
        assert_eq!((bytes.len() - t.data.len()) % 64, 0, "data must start 64-aligned");
        let back = parse_npy(&bytes).unwrap();
        assert_eq!(back, t);
        let scalar = Tensor { dtype: DType::I64, shape: vec![], data: 7i64.to_le_bytes().to_vec() };
        assert_eq!(parse_npy(&encode_npy(&scalar.view())).unwrap(), scalar);
        for cut in 0..bytes.len() {
            assert!(parse_npy(&bytes[..cut]).is_err(), "truncated at {cut} must fail");
        }
        assert!(parse_npy(b"not an npy file").is_err());
    }

    /// bfloat16 is written as `<u2` bits (NumPy has none) and read back as bfloat16.
    #[test]
    fn bf16_round_trip() {
        let t = Tensor { dtype: DType::BF16, shape: vec![3], data: vec![0x80, 0x3F, 0xC0, 0x7F, 0x00, 0x80] };
        let bytes = encode_npy(&t.view());
        assert!(std::str::from_utf8(&bytes[10..64]).unwrap().contains("'descr': '<u2'"));
        assert_eq!(parse_npy(&bytes).unwrap(), t);
    }

    /// numpy's complex layout: interleaved (real, imaginary) parts.
    #[test]
    fn complex_round_trip() {
        let parts: Vec<u8> = [1.0f32, -2.0, 0.5, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor { dtype: DType::C64, shape: vec![2], data: parts };
        let bytes = encode_npy(&t.view());
        assert!(std::str::from_utf8(&bytes[10..64]).unwrap().contains("'descr': '<c8'"));
        assert_eq!(parse_npy(&bytes).unwrap(), t);
        let wide = Tensor {
            dtype: DType::C128,
            shape: vec![1, 1],
            data: [2.5f64, -1.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        assert_eq!(parse_npy(&encode_npy(&wide.view())).unwrap(), wide);
        // A complex file whose data is one f32 short is refused, not read as half an element.
        let short = &bytes[..bytes.len() - 4];
        assert!(parse_npy(short).unwrap_err().contains("needs 16 data bytes"), "{:?}", parse_npy(short));
        // Big-endian complex is not read as little-endian.
        let mut big = bytes.clone();
        let at = big.windows(3).position(|w| w == b"<c8").unwrap();
        big[at] = b'>';
        assert!(parse_npy(&big).unwrap_err().contains("unsupported dtype '>c8'"));
    }
}
