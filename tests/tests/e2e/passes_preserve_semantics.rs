//! Every pass, run on the imported fixture graphs, must not change results:
//! the program compiled without passes and the one compiled after the pass
//! are run on the same random inputs and compared.

use kiln_compiler::import::import_pt2;
use kiln_compiler::{compile_graph_with_passes, CompileOptions};
use kiln_passes::{default_pipeline, Pass, Target, CLEANUP, DCE, DECOMPOSE, FOLD, FOLD_BATCH_NORMS, FUSE, SIMPLIFY};
use kiln_runtime::format::Metadata;
use kiln_runtime::{DType, Program, Tensor};
use kiln_tests::{assert_close, fixture_dir, read_numbered, FIXTURES, FLAVOURS};
use rand::{Rng, SeedableRng};

fn build(name: &str, flavour: &str, passes: &[Pass], target: Target) -> std::sync::Arc<Program> {
    let imported = import_pt2(&fixture_dir(name).join(format!("{flavour}.pt2"))).expect("import");
    let opts = CompileOptions { target, verify_each: true, ..CompileOptions::default() };
    let (writer, _) = compile_graph_with_passes(imported.graph, passes, &opts, Metadata::default())
        .unwrap_or_else(|e| panic!("{name}/{flavour}: {e}"));
    Program::from_bytes(&writer.to_bytes()).expect("load")
}

/// Random floats of the fixture inputs' shapes; integer and bool inputs (token
/// ids, masks) keep the fixture's values so that they stay in range.
fn random_inputs(name: &str, seed: u64) -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    read_numbered(&fixture_dir(name), "input")
        .into_iter()
        .map(|t| match t.dtype {
            DType::F32 => {
                let n = t.shape.iter().product::<usize>();
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                Tensor::from_f32(&t.shape, &v)
            }
            _ => t,
        })
        .collect()
}

fn run(p: &std::sync::Arc<Program>, inputs: &[Tensor]) -> Vec<Tensor> {
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    p.session().unwrap().run(&views).unwrap().to_tensors()
}

#[test]
fn each_pass_preserves_fixture_results() {
    let cases: [(&str, Vec<Pass>, Target); 9] = [
        ("simplify", vec![SIMPLIFY], Target::Cpu),
        ("fold", vec![FOLD], Target::Cpu),
        ("dce", vec![DCE], Target::Cpu),
        ("decompose(cpu)", vec![DECOMPOSE], Target::Cpu),
        ("decompose(primitive)", vec![DECOMPOSE], Target::Primitive),
        ("fuse (after decompose)", vec![DECOMPOSE, CLEANUP, FUSE], Target::Cpu),
        ("fold_batch_norms", vec![FOLD_BATCH_NORMS, DCE], Target::Cpu),
        ("pipeline(cpu)", default_pipeline(Target::Cpu), Target::Cpu),
        ("pipeline(primitive)", default_pipeline(Target::Primitive), Target::Primitive),
    ];
    for name in FIXTURES {
        for flavour in FLAVOURS {
            let before = build(name, flavour, &[], Target::Cpu);
            let inputs = random_inputs(name, 7);
            let want = run(&before, &inputs);
            for (pass, passes, target) in &cases {
                let after = build(name, flavour, passes, *target);
                let got = run(&after, &inputs);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_close(
                        &format!("{name}/{flavour} after {pass}, output {i}"),
                        &g.view(),
                        &w.view(),
                        1e-4,
                        1e-5,
                    );
                }
            }
        }
    }
}
