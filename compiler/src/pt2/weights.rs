//! Weight and constant storages (torch ≥ 2.9): one raw file per storage, and a
//! JSON config mapping each fully-qualified name to its file and view
//! (`sizes`, `strides`, `storage_offset` in elements). torch 2.5 – 2.8's
//! pickled state dicts arrive here in the same form ([`super::state_dict`]).
//!
//! A contiguous view is a byte range of the memory map (no copy). A strided or
//! offset view is copied out contiguous. Every index is checked against the
//! file length with overflow-checked arithmetic.

use super::archive::Archive;
use super::json::{JsonError, J};
use super::program::{SymExpr, TensorMeta};
use super::scalar_type;
use kiln_ir::{ConstBytes, DType};
use std::collections::HashMap;
use std::sync::Arc;

/// Refuse to materialise zero-filled or copied tensors beyond this many bytes
/// (1 GiB): their size comes from the config, not from bytes in the file, so
/// a hostile config could otherwise ask for exabytes.
const MAX_MATERIALISED_BYTES: usize = 1 << 30;

#[derive(Clone, Debug)]
pub struct TensorConfig {
    pub path_name: String,
    pub use_pickle: bool,
    pub meta: TensorMeta,
}

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("tensor `{tensor}` ({member}): {detail}")]
    Malformed { tensor: String, member: String, detail: String },
    #[error("tensor `{tensor}`: {detail}")]
    Unsupported { tensor: String, detail: String },
}

/// A loaded tensor: its element type, static shape and row-major bytes.
#[derive(Clone, Debug)]
pub struct LoadedTensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub bytes: ConstBytes,
}

/// Parses `model_weights_config.json` / `model_constants_config.json`.
pub fn parse_config(root: J<'_>) -> Result<HashMap<String, TensorConfig>, JsonError> {
    let entries = root
        .with_opt("config", |c| {
            c.entries(|fqn, e| {
                let path_name = e.with("path_name", |p| p.str().map(str::to_string))?;
                let use_pickle = e.with_opt("use_pickle", |p| p.bool())?.unwrap_or(false);
                let meta = e.with("tensor_meta", |m| {
                    Ok(TensorMeta {
                        dtype: m.with("dtype", |d| d.i64())?,
                        sizes: m.with("sizes", |s| s.list(static_int))?,
                        strides: m.with_opt("strides", |s| s.list(static_int))?.unwrap_or_default(),
                        storage_offset: m.with_opt("storage_offset", static_int)?.unwrap_or(SymExpr::Int(0)),
                        path: m.path(),
                    })
                })?;
                Ok((fqn.to_string(), TensorConfig { path_name, use_pickle, meta }))
            })
        })?
        .unwrap_or_default();
    Ok(entries.into_iter().collect())
}

/// Weights have static sizes: only `as_int` is accepted.
fn static_int(j: J<'_>) -> Result<SymExpr, JsonError> {
    j.union(|tag, v| match tag {
        "as_int" => Ok(SymExpr::Int(v.i64()?)),
        _ => Err(v.err("`as_int` (a weight's sizes are static)")),
    })
}

fn ints(xs: &[SymExpr]) -> Vec<i64> {
    xs.iter().map(|x| if let SymExpr::Int(v) = x { *v } else { -1 }).collect()
}

/// Loads `fqn` from `folder` (`data/weights/` or `data/constants/`).
pub fn load(archive: &Archive, folder: &str, fqn: &str, cfg: &TensorConfig) -> Result<LoadedTensor, WeightError> {
    let member = format!("{folder}{}", cfg.path_name);
    let malformed =
        |detail: String| WeightError::Malformed { tensor: fqn.to_string(), member: archive.full_name(&member), detail };
    if cfg.use_pickle {
        return Err(WeightError::Unsupported {
            tensor: fqn.to_string(),
            detail: "pickled tensor subclass weight (torchao); save the program after `ep.run_decompositions()`, \
                     which stores plain integer tensors kiln imports"
                .into(),
        });
    }
    let dtype = scalar_type::storage_dtype_of(cfg.meta.dtype).map_err(|name| WeightError::Unsupported {
        tensor: fqn.to_string(),
        detail: format!("element type {name} is not supported"),
    })?;
    if cfg.path_name.contains("..") || cfg.path_name.contains('/') {
        return Err(malformed(format!("path_name {:?} must be a plain file name", cfg.path_name)));
    }
    let range = archive.range(&member).ok_or_else(|| malformed("storage file missing from the archive".into()))?;
    let shape = ints(&cfg.meta.sizes);
    let rank = shape.len();
    let mut strides = ints(&cfg.meta.strides);
    if strides.is_empty() && rank > 0 {
        strides = contiguous_strides(&shape).ok_or_else(|| malformed("size product overflows".into()))?;
    }
    if strides.len() != rank {
        return Err(malformed(format!("{} strides for {rank} sizes", strides.len())));
    }
    if let Some(bad) = shape.iter().chain(&strides).find(|&&x| x < 0) {
        return Err(malformed(format!("negative size or stride {bad}")));
    }
    let SymExpr::Int(offset) = cfg.meta.storage_offset else {
        return Err(malformed("symbolic storage_offset".into()));
    };
    let offset = usize::try_from(offset).map_err(|_| malformed(format!("storage_offset {offset} is negative")))?;
    let el = dtype.size_bytes();
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
        .ok_or_else(|| malformed(format!("sizes {shape:?} overflow")))?;
    let nbytes = numel.checked_mul(el).ok_or_else(|| malformed("byte size overflows".into()))?;
    if numel == 0 {
        return Ok(LoadedTensor { dtype, shape, bytes: ConstBytes::owned(Vec::new()) });
    }
    if range.is_empty() {
        // torch writes an empty file for an all-zero (e.g. freshly allocated) storage.
        if nbytes > MAX_MATERIALISED_BYTES {
            return Err(too_large(fqn, format!("its empty (all-zero) storage would expand to {nbytes} bytes")));
        }
        return Ok(LoadedTensor { dtype, shape, bytes: ConstBytes::owned(vec![0; nbytes]) });
    }
    // Largest element index the view touches.
    let last = shape
        .iter()
        .zip(&strides)
        .try_fold(offset, |acc, (&d, &s)| (d as usize - 1).checked_mul(s as usize).and_then(|x| acc.checked_add(x)));
    let end_bytes = last
        .and_then(|l| l.checked_add(1))
        .and_then(|n| n.checked_mul(el))
        .ok_or_else(|| malformed("view extent overflows".into()))?;
    if end_bytes > range.len() {
        return Err(malformed(format!(
            "view (sizes {shape:?}, strides {strides:?}, offset {offset}) needs {end_bytes} bytes but the storage has {}",
            range.len()
        )));
    }
    let start = range.start + offset * el;
    let bytes = if is_contiguous(&shape, &strides) {
        let map: Arc<dyn AsRef<[u8]> + Send + Sync> = archive.map().clone();
        ConstBytes::shared(map, start..start + nbytes)
    } else {
        if nbytes > MAX_MATERIALISED_BYTES {
            return Err(too_large(fqn, format!("its strided view would be copied into {nbytes} bytes")));
        }
        let storage = &archive.map()[range.clone()];
        ConstBytes::owned(gather(storage, &shape, &strides, offset, el))
    };
    Ok(LoadedTensor { dtype, shape, bytes })
}

fn too_large(fqn: &str, what: String) -> WeightError {
    WeightError::Unsupported {
        tensor: fqn.to_string(),
        detail: format!("{what}; kiln materialises at most {MAX_MATERIALISED_BYTES} bytes per tensor"),
    }
}

fn contiguous_strides(shape: &[i64]) -> Option<Vec<i64>> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].checked_mul(shape[i + 1].max(1))?;
    }
    Some(strides)
}

/// Row-major contiguity; strides of unit dimensions do not matter.
fn is_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Copies a strided view out in row-major order (bounds already checked).
fn gather(storage: &[u8], shape: &[i64], strides: &[i64], offset: usize, el: usize) -> Vec<u8> {
    let numel: usize = shape.iter().map(|&d| d as usize).product();
    let mut out = Vec::with_capacity(numel * el);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..numel {
        let elem = offset + index.iter().zip(strides).map(|(&i, &s)| i * s as usize).sum::<usize>();
        out.extend_from_slice(&storage[elem * el..(elem + 1) * el]);
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] as usize {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity_ignores_unit_dims() {
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(is_contiguous(&[1, 3, 1, 1], &[3, 1, 1, 1]));
        assert!(is_contiguous(&[1, 3], &[99, 1]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
    }

    #[test]
    fn gather_transposes() {
        // storage [[0,1,2],[3,4,5]] viewed transposed as 3x2.
        let storage: Vec<u8> = (0..6).collect();
        assert_eq!(gather(&storage, &[3, 2], &[1, 3], 0, 1), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(gather(&storage, &[2], &[2], 1, 1), vec![1, 3]);
    }
}
