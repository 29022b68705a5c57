//! `kiln diff` and `kiln patch`: delta updates between artifacts
//! (`kiln_runtime::delta` does the work; this is file handling and reporting).

use kiln_runtime::delta;
use kiln_runtime::format::{parse_container, write_file_atomic};
use std::path::Path;

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads an artifact, checking it is one (a diff of arbitrary files would
/// succeed but ship something no runtime loads).
fn read_artifact(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = read(path)?;
    parse_container(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes)
}

pub fn cmd_diff(old: &Path, new: &Path, output: &Path) -> Result<(), String> {
    let (base, target) = (read_artifact(old)?, read_artifact(new)?);
    let patch = delta::diff(&base, &target);
    let info = delta::inspect(&patch).map_err(|e| format!("internal error: the new delta does not parse: {e}"))?;
    write_file_atomic(output, &patch).map_err(|e| e.to_string())?;
    println!(
        "{} -> {}: delta {} bytes ({:.2} % of {} bytes; {} bytes carried, {} copied from the base)",
        old.display(),
        new.display(),
        patch.len(),
        100.0 * patch.len() as f64 / target.len().max(1) as f64,
        target.len(),
        info.carried_bytes,
        info.copied_bytes,
    );
    Ok(())
}

/// Applies the delta; the result is written (atomically) only once its hash
/// matched the one recorded in the delta.
pub fn cmd_patch(old: &Path, patch: &Path, output: &Path) -> Result<(), String> {
    let base = read(old)?;
    let delta_bytes = read(patch)?;
    let result = delta::patch(&base, &delta_bytes).map_err(|e| format!("{}: {e}", patch.display()))?;
    write_file_atomic(output, &result).map_err(|e| e.to_string())?;
    println!(
        "{} + {} -> {} ({} bytes, SHA-256 verified)",
        old.display(),
        patch.display(),
        output.display(),
        result.len()
    );
    Ok(())
}
