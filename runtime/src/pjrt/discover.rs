//! Finding the PJRT plugin for a [`Device`]. A failed search lists every place
//! it looked, so the user can see why and what to set.

use crate::device::Device;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Overrides discovery for `tpu` and `gpu` (the CLI documents it too).
pub const PLUGIN_ENV: &str = "KILN_PJRT_PLUGIN";

/// The plugin file for `device` (`None` for [`Device::Cpu`]).
pub fn plugin_path(device: &Device) -> Result<Option<PathBuf>> {
    let mut looked = Vec::new();
    let found = match device {
        Device::Cpu => return Ok(None),
        Device::Pjrt(path) => {
            return if path.is_file() || super::api::Plugin::registered(path).is_some() {
                Ok(Some(path.clone()))
            } else {
                Err(Error::Device(format!("PJRT plugin {} does not exist or is not a file", path.display())))
            }
        }
        Device::Tpu => from_env(&mut looked)?.or_else(|| find_tpu(&mut looked)),
        Device::Gpu => from_env(&mut looked)?.or_else(|| find_gpu(&mut looked)),
    };
    found.map(Some).ok_or_else(|| {
        Error::Device(format!(
            "no {device} PJRT plugin found; looked at:\n  {}\nset {PLUGIN_ENV}=/path/to/plugin.so or use --device pjrt:PATH",
            looked.join("\n  ")
        ))
    })
}

fn check(path: PathBuf, looked: &mut Vec<String>) -> Option<PathBuf> {
    if path.is_file() {
        Some(path)
    } else {
        looked.push(path.display().to_string());
        None
    }
}

/// `$KILN_PJRT_PLUGIN`: when set, it is the only candidate (a wrong path is
/// an error, not a reason to silently load some other plugin).
fn from_env(looked: &mut Vec<String>) -> Result<Option<PathBuf>> {
    match std::env::var_os(PLUGIN_ENV).filter(|v| !v.is_empty()) {
        Some(v) => {
            let path = PathBuf::from(v);
            if path.is_file() {
                Ok(Some(path))
            } else {
                Err(Error::Device(format!(
                    "${PLUGIN_ENV} names {}, which does not exist or is not a file",
                    path.display()
                )))
            }
        }
        None => {
            looked.push(format!("${PLUGIN_ENV} (unset)"));
            Ok(None)
        }
    }
}

fn find_tpu(looked: &mut Vec<String>) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("TPU_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        if let Some(p) = check(PathBuf::from(v), looked) {
            return Some(p);
        }
    } else {
        looked.push("$TPU_LIBRARY_PATH (unset)".into());
    }
    site_packages().into_iter().find_map(|dir| check(dir.join("libtpu").join("libtpu.so"), looked))
}

fn find_gpu(looked: &mut Vec<String>) -> Option<PathBuf> {
    for dir in site_packages() {
        // jax's CUDA plugins: jax_plugins/xla_cuda12/xla_cuda_plugin.so, xla_cuda13/…
        let plugins = dir.join("jax_plugins");
        let mut subdirs: Vec<PathBuf> = read_dir_names(&plugins)
            .into_iter()
            .filter(|n| n.starts_with("xla_cuda"))
            .map(|n| plugins.join(n))
            .collect();
        // Newest CUDA major first.
        subdirs.sort();
        subdirs.reverse();
        if subdirs.is_empty() {
            looked.push(format!("{}/xla_cuda*/xla_cuda_plugin.so", plugins.display()));
        }
        for sub in subdirs {
            for name in ["xla_cuda_plugin.so", "pjrt_c_api_gpu_plugin.so"] {
                if let Some(p) = check(sub.join(name), looked) {
                    return Some(p);
                }
            }
        }
        if let Some(p) = check(dir.join("pjrt_c_api_gpu_plugin.so"), looked) {
            return Some(p);
        }
    }
    None
}

fn read_dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Python package directories, without running Python: `$PYTHONPATH`, the
/// active virtualenv or conda env, the prefix of every `python3` on `$PATH`
/// (a virtualenv on `PATH` but not activated), the user's site, the system's.
fn site_packages() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&pp));
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            prefixes.push(PathBuf::from(v));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for bin in std::env::split_paths(&path) {
            if bin.join("python3").is_file() {
                prefixes.extend(bin.parent().map(Path::to_path_buf));
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let mut pythons: Vec<String> = read_dir_names(&lib).into_iter().filter(|n| n.starts_with("python3")).collect();
        pythons.sort();
        for py in pythons {
            dirs.push(lib.join(&py).join("site-packages"));
            dirs.push(lib.join(&py).join("dist-packages"));
        }
    }
    dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    dirs.retain(|d| d.is_dir());
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let key = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    dirs
}
