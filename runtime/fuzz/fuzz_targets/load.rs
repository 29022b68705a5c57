//! Fuzzes the artifact loader: any byte string must load or fail with an
//! error, and a program that loads must run (or fail) without panicking.
//!
//!   cd runtime && cargo +nightly fuzz run load
#![no_main]

use kiln_runtime::{Program, Tensor};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(program) = Program::from_bytes(data) else { return };
    // Keep the arena small so the fuzzer explores formats, not allocators.
    if program.plan().arena_bytes > 1 << 24 {
        return;
    }
    let Ok(mut session) = program.session() else { return };
    let inputs: Vec<Tensor> = program
        .plan()
        .inputs
        .iter()
        .map(|io| {
            let t = &program.plan().tensors[io.tensor as usize];
            let shape: Vec<usize> = t.shape.iter().map(|d| match d {
                kiln_runtime::format::DimRef::Static(v) => (*v).min(64) as usize,
                kiln_runtime::format::DimRef::Expr(_) => 1,
            }).collect();
            let len = shape.iter().product::<usize>() * t.dtype.size_bytes();
            Tensor { dtype: t.dtype, shape, data: vec![0; len] }
        })
        .collect();
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let _ = session.run(&views);
});
