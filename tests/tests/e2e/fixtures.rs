//! Every PyTorch fixture, in both IR flavours, compiled to a .kiln file, loaded
//! and run through the Rust API, compared with PyTorch's eager outputs.

use kiln_runtime::{Tensor, TensorView};
use kiln_tests::{assert_close, fixture_dir, load_fixture, read_numbered, FIXTURES, FLAVOURS};

const RTOL: f64 = 1e-4;
const ATOL: f64 = 1e-5;

fn run_and_compare(session: &mut kiln_runtime::Session, what: &str, inputs: &[Tensor], expected: &[Tensor]) {
    let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
    let outputs = session.run(&views).unwrap_or_else(|e| panic!("{what}: run failed: {e}"));
    assert_eq!(outputs.len(), expected.len(), "{what}: number of outputs");
    for (i, want) in expected.iter().enumerate() {
        assert_close(&format!("{what} output {i}"), &outputs.get(i), &want.view(), RTOL, ATOL);
    }
}

fn check_fixture(name: &str, flavour: &str) {
    let dir = fixture_dir(name);
    let program = load_fixture(name, flavour);
    let mut session = program.session().expect("session");
    let what = format!("{name}/{flavour}");
    let (inputs, expected) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    assert!(!inputs.is_empty() && !expected.is_empty(), "{what}: fixture has no inputs/outputs");
    run_and_compare(&mut session, &what, &inputs, &expected);
    // Dynamic fixtures carry a second size: the same session must run it
    // without recompiling, then go back to the first size.
    let (alt_in, alt_out) = (read_numbered(&dir, "alt_input"), read_numbered(&dir, "alt_output"));
    if !alt_in.is_empty() {
        run_and_compare(&mut session, &format!("{what} (alt size)"), &alt_in, &alt_out);
        run_and_compare(&mut session, &format!("{what} (first size again)"), &inputs, &expected);
    }
}

/// One module per fixture with a test per IR flavour; `$prefix` selects the
/// fixture set (the torch version that saved it).
macro_rules! fixture_tests {
    ($prefix:literal: $($name:ident),*) => {
        $(
            mod $name {
                #[test]
                fn training_ir() {
                    super::super::check_fixture(&format!("{}{}", $prefix, stringify!($name)), "training");
                }
                #[test]
                fn core_aten() {
                    super::super::check_fixture(&format!("{}{}", $prefix, stringify!($name)), "aten");
                }
            }
        )*
    };
}

/// Saved by torch 2.15 (the newest supported).
mod torch_2_15 {
    fixture_tests!("": mlp, cnn, transformer, transformer_mask, dynamic_mlp, transformer_dynseq);
}

/// The same models saved by torch 2.9 (the oldest supported archive format).
mod torch_2_9 {
    fixture_tests!("torch-2.9/": mlp, cnn, transformer, transformer_mask, dynamic_mlp, transformer_dynseq);
}

#[test]
fn fixture_list_matches_directories() {
    for name in FIXTURES {
        for flavour in FLAVOURS {
            for set in ["", "torch-2.9/"] {
                let dir = fixture_dir(&format!("{set}{name}"));
                assert!(dir.join(format!("{flavour}.pt2")).exists(), "{}/{flavour}.pt2 missing", dir.display());
            }
        }
    }
}
