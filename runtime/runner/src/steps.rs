//! A recorded sequence of runs (`kiln run --steps DIR`): `DIR/step_0/`,
//! `DIR/step_1/`, … each holding one `.npy` per program input, named
//! `input_<index>.npy` or `input_<name>.npy`. The steps run in order through
//! one session, so state carries from each to the next: how a robot's log or
//! a decoding session is replayed.

use crate::npy::read_npy;
use kiln_runtime::{IoInfo, Tensor};
use std::path::{Path, PathBuf};

/// The step folders of `dir`, in order: `step_0`, `step_1`, … up to the first
/// missing number. Other entries are ignored; no `step_0` is an error.
pub fn step_dirs(dir: &Path) -> Result<Vec<PathBuf>, String> {
    if !dir.is_dir() {
        return Err(format!("--steps {}: not a directory", dir.display()));
    }
    let steps: Vec<PathBuf> = (0..).map(|k| dir.join(format!("step_{k}"))).take_while(|p| p.is_dir()).collect();
    if steps.is_empty() {
        return Err(format!("--steps {}: no step_0/ folder", dir.display()));
    }
    Ok(steps)
}

/// The inputs of one step, in the program's order: `input_<index>.npy`, or
/// else `input_<name>.npy`, for each declared input.
pub fn read_step(step: &Path, declared: &[IoInfo]) -> Result<Vec<Tensor>, String> {
    declared
        .iter()
        .enumerate()
        .map(|(i, io)| {
            let by_index = step.join(format!("input_{i}.npy"));
            let by_name = step.join(format!("input_{}.npy", io.name));
            let path = if by_index.is_file() { by_index } else { by_name };
            if !path.is_file() {
                return Err(format!(
                    "{}: missing input {i} (`{}`: {} [{}]): expected input_{i}.npy or input_{}.npy",
                    step.display(),
                    io.name,
                    io.dtype,
                    io.shape.join(", "),
                    io.name
                ));
            }
            read_npy(&path).map_err(|e| e.to_string())
        })
        .collect()
}
