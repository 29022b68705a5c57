//! The smallest useful embedding: read an artifact, load it, run it once on
//! zero inputs, print each output's shape and a checksum. Built without the
//! runtime's default features and stripped, its size is kiln's footprint
//! (`.ci/run` checks it against the budget in benches/RESULTS.md):
//!
//! ```text
//! cargo build -p kiln-runtime --example size_probe --profile size --no-default-features
//! target/size/examples/size_probe tests/golden/v0.3/mlp.kiln
//! ```

use kiln_runtime::format::DimRef;
use kiln_runtime::{Program, TensorView};
use std::process::ExitCode;

fn run(path: &str) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let program = Program::from_bytes(&bytes).map_err(|e| e.to_string())?;
    let plan = program.plan();
    let mut shapes = Vec::new();
    for io in &plan.inputs {
        let decl = &plan.tensors[io.tensor as usize];
        let shape = decl
            .shape
            .iter()
            .map(|d| match d {
                DimRef::Static(v) => Ok(*v as usize),
                DimRef::Expr(_) => Err(format!("input `{}` has a dynamic shape", io.name)),
            })
            .collect::<Result<Vec<usize>, String>>()?;
        let bytes = shape.iter().product::<usize>() * decl.dtype.size_bytes();
        shapes.push((decl.dtype, shape, vec![0u8; bytes]));
    }
    let inputs: Vec<TensorView<'_>> =
        shapes.iter().map(|(dtype, shape, data)| TensorView { dtype: *dtype, shape, data }).collect();
    let mut session = program.session().map_err(|e| e.to_string())?;
    let outputs = session.run(&inputs).map_err(|e| e.to_string())?;
    for (i, out) in outputs.iter().enumerate() {
        let sum = out.data.iter().fold(0u32, |h, &b| h.rotate_left(5) ^ u32::from(b));
        println!("output {i}: {} {:?} checksum {sum:08x}", out.dtype, out.shape);
    }
    Ok(())
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: size_probe MODEL.kiln");
        return ExitCode::from(2);
    };
    match run(&path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
