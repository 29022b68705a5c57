//! Real model topologies (torchvision ResNet-18, MobileNetV2, EfficientNet-B0,
//! Swin-T and ViT, Hugging Face BERT, Llama, GPT-2, T5, Qwen3-MoE and Mixtral; random
//! weights, shrunk — see tests/fixtures/README.md),
//! in both IR flavours: compiled to a .kiln file, loaded, run, and compared
//! with PyTorch's eager outputs. Made by tests/fixtures/generate_models.py.

use kiln_runtime::{Tensor, TensorView};
use kiln_tests::{assert_close, fixture_dir, load_fixture, read_numbered};

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn check_model(name: &str, flavour: &str) {
    let fixture = format!("models/{name}");
    let dir = fixture_dir(&fixture);
    let what = format!("{name}/{flavour}");
    let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    assert!(!inputs.is_empty() && !expected.is_empty(), "{what}: fixture has no inputs/outputs");
    let program = load_fixture(&fixture, flavour);
    let mut session = program.session().expect("session");
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).unwrap_or_else(|e| panic!("{what}: run failed: {e}"));
    assert_eq!(outputs.len(), expected.len(), "{what}: number of outputs");
    for (i, want) in expected.iter().enumerate() {
        assert_close(&format!("{what} output {i}"), &outputs.get(i), &want.view(), RTOL, ATOL);
    }
}

/// One module per model with a test per IR flavour.
macro_rules! model_tests {
    ($($name:ident),*) => {
        $(
            mod $name {
                #[test]
                fn training_ir() {
                    super::check_model(stringify!($name), "training");
                }
                #[test]
                fn core_aten() {
                    super::check_model(stringify!($name), "aten");
                }
            }
        )*
    };
}

model_tests!(
    resnet18,
    mobilenet_v2,
    efficientnet_b0,
    swin_t,
    bert,
    llama,
    t5,
    qwen3_moe,
    mixtral,
    qwen3_moe_batch,
    llama_batch,
    gpt2,
    vit
);
