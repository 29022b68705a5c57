//! Greedy decoding with a tiny Llama-style model and a static KV cache.
//!
//! The model (`tests/fixtures/state/tiny_llama/`, made by
//! `tests/fixtures/generate_state.py`: two layers, RMSNorm, rotary
//! embeddings, SwiGLU) takes one token and its position per run and writes
//! that position's keys and values into its cache buffers with
//! `index_copy_`. kiln keeps the caches as session state, so decoding is a
//! loop of `Session::run` calls: the prompt, one token at a time, then each
//! generated token fed back in. The tokens are compared with the ones eager
//! PyTorch generated.
//!
//! ```text
//! cargo run -p kiln-compiler --example tiny_llama [-- training|aten]
//! ```

use kiln_compiler::npy::read_npy;
use kiln_compiler::{compile_file, CompileOptions};
use kiln_runtime::{Program, Session, Tensor};
use std::path::{Path, PathBuf};

/// The fixture folder.
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state/tiny_llama")
}

/// An i64 `.npy` file's values.
fn read_i64s(path: &Path) -> Result<Vec<i64>, String> {
    let t = read_npy(path).map_err(|e| e.to_string())?;
    if t.dtype != kiln_runtime::DType::I64 {
        return Err(format!("{}: expected i64, found {}", path.display(), t.dtype));
    }
    Ok(t.data.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect())
}

/// The index of the largest logit (the first one on ties, like `torch.argmax`).
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best
}

/// Feeds `prompt` then generates `count` tokens greedily; returns the generated ones.
pub fn generate(session: &mut Session, prompt: &[i64], count: usize) -> Result<Vec<i64>, String> {
    let mut tokens = prompt.to_vec();
    let mut generated = Vec::with_capacity(count);
    let mut pos = 0;
    while generated.len() < count {
        let token = Tensor::from_i64(&[1, 1], &[tokens[pos]]);
        let position = Tensor::from_i64(&[1], &[pos as i64]);
        let outputs = session.run(&[token.view(), position.view()]).map_err(|e| format!("position {pos}: {e}"))?;
        let logits = outputs.to_tensors().remove(0).to_f32().ok_or("logits are not f32")?;
        pos += 1;
        if pos == tokens.len() {
            let next = argmax(&logits) as i64;
            tokens.push(next);
            generated.push(next);
        }
    }
    Ok(generated)
}

/// Compiles the fixture's `flavour` (`training` or `aten`), generates as many
/// tokens as eager did, and returns (kiln's tokens, eager's tokens).
pub fn run(flavour: &str) -> Result<(Vec<i64>, Vec<i64>), String> {
    let dir = fixture();
    let artifact = std::env::temp_dir().join(format!("kiln-tiny-llama-{flavour}-{}.kiln", std::process::id()));
    compile_file(&dir.join(format!("{flavour}.pt2")), &artifact, &CompileOptions::default())
        .map_err(|e| e.to_string())?;
    let program = Program::load(&artifact).map_err(|e| e.to_string());
    std::fs::remove_file(&artifact).ok();
    let program = program?;
    let prompt = read_i64s(&dir.join("prompt.npy"))?;
    let eager = read_i64s(&dir.join("tokens.npy"))?;
    let mut session = program.session().map_err(|e| e.to_string())?;
    let tokens = generate(&mut session, &prompt, eager.len())?;
    // A second conversation in the same session starts from a clean cache.
    session.reset_state();
    let again = generate(&mut session, &prompt, eager.len())?;
    if again != tokens {
        return Err(format!("after reset_state the session generated {again:?}, first {tokens:?}"));
    }
    Ok((tokens, eager))
}

#[allow(dead_code)] // `main` is unused when the test includes this file.
fn main() -> std::process::ExitCode {
    let flavour = std::env::args().nth(1).unwrap_or_else(|| "aten".to_string());
    match run(&flavour) {
        Ok((tokens, eager)) => {
            println!("kiln:  {tokens:?}\neager: {eager:?}");
            if tokens == eager {
                println!("token-identical to eager PyTorch");
                std::process::ExitCode::SUCCESS
            } else {
                println!("MISMATCH");
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
