//! Results are bit-identical whatever the thread count: every fixture model
//! (the small PyTorch fixtures, both IR flavours, and the real-model
//! topologies) runs at 1, 2, 3 and 4 threads, and every output's bytes must
//! equal the 1-thread run's. Also: a run does no B packing for the
//! constant weights that were packed at load.

use kiln_runtime::{SessionOptions, Tensor, TensorView};
use kiln_tests::{fixture_dir, load_fixture, read_numbered, FIXTURES, FLAVOURS};

const THREADS: [usize; 4] = [1, 2, 3, 4];

fn output_bytes(program: &std::sync::Arc<kiln_runtime::Program>, threads: usize, inputs: &[Tensor]) -> Vec<Vec<u8>> {
    let mut session = program.session_with(&SessionOptions::with_threads(threads)).expect("session");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).unwrap_or_else(|e| panic!("run at {threads} threads: {e}"));
    outputs.iter().map(|o| o.data.to_vec()).collect()
}

fn check(fixture: &str, flavour: &str) {
    let dir = fixture_dir(fixture);
    let program = load_fixture(fixture, flavour);
    for prefix in ["input", "alt_input"] {
        let inputs = read_numbered(&dir, prefix);
        if inputs.is_empty() {
            continue;
        }
        let want = output_bytes(&program, 1, &inputs);
        assert!(!want.is_empty(), "{fixture}/{flavour}: no outputs");
        for t in &THREADS[1..] {
            let got = output_bytes(&program, *t, &inputs);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == w, "{fixture}/{flavour} ({prefix}) output {i}: {t} threads differ from 1 thread");
            }
        }
    }
}

#[test]
fn fixtures_are_bit_identical_at_every_thread_count() {
    for name in FIXTURES {
        for flavour in FLAVOURS {
            check(name, flavour);
        }
    }
}

#[test]
fn real_models_are_bit_identical_at_every_thread_count() {
    for name in ["resnet18", "mobilenet_v2", "bert", "llama"] {
        check(&format!("models/{name}"), "aten");
    }
}

#[test]
fn constant_weights_are_not_repacked_per_run() {
    // The MLP's layers are linears with constant weights: all packed at load.
    let dir = fixture_dir("mlp");
    let program = load_fixture("mlp", "aten");
    let inputs = read_numbered(&dir, "input");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let mut session = program.session_with(&SessionOptions::with_threads(2)).expect("session");
    assert!(program.packed_weights() > 0, "no weights were packed at load");
    session.run(&views).expect("run");
    session.run(&views).expect("run");
    assert_eq!(session.gemm_b_packs(), 0, "a run packed constant weights");
    // Convolution weights (the im2col GEMM's A) are packed at load too.
    assert!(load_fixture("models/resnet18", "aten").packed_weights() > 0, "resnet18's conv weights were not packed");
}
