//! `Session::run` allocates nothing after the first call (for shapes no larger
//! than seen before): counted with a global allocator. This binary holds one
//! test so no other thread allocates while it counts.

use kiln_runtime::Tensor;
use kiln_tests::alloc_count::{allocations_anywhere_during as allocations_during, Counting};
use kiln_tests::{fixture_dir, load_fixture, read_numbered};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_runs_do_not_allocate() {
    // The counter itself works (so a zero below means something).
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);
    // The shrunk MobileNetV2 and ResNet-18 run channels-last convolutions.
    for name in ["cnn", "transformer", "transformer_dynseq", "dynamic_mlp", "models/mobilenet_v2", "models/resnet18"] {
        let program = load_fixture(name, "aten");
        let inputs = read_numbered(&fixture_dir(name), "input");
        let alt = read_numbered(&fixture_dir(name), "alt_input");
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let alt_views: Vec<_> = alt.iter().map(Tensor::view).collect();
        let mut session = program.session().unwrap();
        // Warm up with every size the loop below uses.
        session.run(&views).unwrap();
        if !alt.is_empty() {
            session.run(&alt_views).unwrap();
        }
        let n = allocations_during(|| {
            for _ in 0..3 {
                let out = session.run(&views).unwrap();
                assert!(!out.get(0).data.is_empty());
                if !alt.is_empty() {
                    session.run(&alt_views).unwrap();
                }
            }
        });
        assert_eq!(n, 0, "{name}: {n} allocations in steady-state runs");
    }
    // Data-dependent sizes: the run loop stops at each BindDim, rebinds and
    // re-evaluates shapes, still without allocating. Loops (`while_loop`,
    // trip counts 3, 0, 1) follow their jumps without allocating either.
    for name in ["nonzero", "item", "while_loop"] {
        let program = load_fixture(name, "aten");
        let cases: Vec<Vec<Tensor>> =
            (0..3).map(|k| read_numbered(&fixture_dir(name), &format!("case{k}_input"))).collect();
        let mut session = program.session().unwrap();
        for c in &cases {
            session.run(&c.iter().map(Tensor::view).collect::<Vec<_>>()).unwrap();
        }
        let views: Vec<Vec<_>> = cases.iter().map(|c| c.iter().map(Tensor::view).collect()).collect();
        let n = allocations_during(|| {
            for _ in 0..3 {
                for v in &views {
                    session.run(v).unwrap();
                }
            }
        });
        assert_eq!(n, 0, "{name}: {n} allocations in steady-state runs");
    }
    // State: the end-of-run copies into the state region, and a reset, allocate nothing.
    for name in ["state/counter", "state/kv_decoder"] {
        let program = load_fixture(name, "aten");
        let steps: Vec<Vec<Tensor>> =
            (0..4).map(|k| read_numbered(&fixture_dir(name).join(format!("step_{k}")), "input")).collect();
        let views: Vec<Vec<_>> = steps.iter().map(|c| c.iter().map(Tensor::view).collect()).collect();
        let mut session = program.session().unwrap();
        session.run(&views[0]).unwrap();
        let n = allocations_during(|| {
            for v in &views {
                session.run(v).unwrap();
            }
            session.reset_state();
        });
        assert_eq!(n, 0, "{name}: {n} allocations in steady-state runs");
    }
    // Native code (elementwise groups, broadcast operands included, and row
    // functions: norms, softmax, reductions) runs without allocating either.
    // (Swin-T stands for EfficientNet-B0, whose SiLU groups are convolution
    // epilogues now: it makes no native call.)
    #[cfg(all(feature = "native", target_arch = "x86_64"))]
    for name in ["transformer", "dynamic_mlp", "models/swin_t", "models/llama"] {
        let native = kiln_compiler::native::NativeTarget::new(kiln_runtime::native::NativeArch::X86_64, None).unwrap();
        let opts = kiln_compiler::CompileOptions { native: Some(native), ..kiln_compiler::CompileOptions::default() };
        let tmp = kiln_tests::temp_path(&format!("no-alloc-native-{}", name.replace('/', "-")));
        kiln_compiler::compile_file(&fixture_dir(name).join("aten.pt2"), &tmp, &opts).unwrap();
        let program = kiln_runtime::Program::load(&tmp).unwrap();
        std::fs::remove_file(&tmp).ok();
        let calls = program.plan().instrs.iter().filter(|i| i.op.native_function().is_some()).count();
        assert!(calls > 0, "{name}: no native calls");
        let inputs = read_numbered(&fixture_dir(name), "input");
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let mut session = program.session().unwrap();
        session.run(&views).unwrap();
        let n = allocations_during(|| {
            for _ in 0..3 {
                session.run(&views).unwrap();
            }
        });
        assert_eq!(n, 0, "{name} --target x86_64: {n} allocations in steady-state runs");
    }
}
