//! The layout pass changes no bit of any result: the CNN fixture and the
//! convolutional real-model fixtures (ResNet-18, MobileNetV2,
//! EfficientNet-B0) are compiled with and without `layout` and run on the
//! same random inputs, at 1 and 3 threads, and their outputs compared byte
//! for byte. The channels-last kernels compute each element with the
//! channels-first kernels' operations (kernels/tests/conv_nhwc.rs), and the
//! permutes the pass adds move bytes.

use crate::before_after::{compile, run_at as run};
use kiln_compiler::import::import_pt2;
use kiln_passes::{default_pipeline, Pass, Target, LAYOUT};
use kiln_runtime::format::{Kernel, Layout};
use kiln_runtime::Program;
use kiln_tests::{fixture_dir, random_inputs};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// (convolutions, channels-last ones, permutes) of a plan.
fn counts(p: &Program) -> (usize, usize, usize) {
    let (mut convs, mut last, mut permutes) = (0, 0, 0);
    for i in &p.plan().instrs {
        match i.op.kernel() {
            Some(Kernel::Conv { .. }) => convs += 1,
            Some(Kernel::ConvFused { layout, .. }) => {
                convs += 1;
                last += usize::from(*layout == Layout::ChannelsLast);
            }
            Some(Kernel::Permute { .. }) => permutes += 1,
            _ => {}
        }
    }
    (convs, last, permutes)
}

#[test]
fn cnn_models_are_bit_identical_channels_last() {
    let without: Vec<Pass> = default_pipeline(Target::Cpu).into_iter().filter(|p| p.name != LAYOUT.name).collect();
    let with = default_pipeline(Target::Cpu);
    let mut rng = StdRng::seed_from_u64(17);
    for name in ["cnn", "models/resnet18", "models/mobilenet_v2", "models/efficientnet_b0"] {
        let import = || import_pt2(&fixture_dir(name).join("aten.pt2")).expect("import").graph;
        let inputs = random_inputs(&import(), &mut rng, -1.0, 1.0);
        let (before, after) = (compile(import(), &without), compile(import(), &with));
        let (convs, last, permutes) = counts(&after);
        let (_, _, permutes_before) = counts(&before);
        println!("{name}: {last} of {convs} convolutions channels-last, {permutes_before} → {permutes} permutes");
        // The CNN fixture's RGB stem (read by its grouped convolution only)
        // and grouped convolution stay channels-first; the shrunk models'
        // convolutions all go channels-last, their RGB stems and the narrow
        // 3×3s (short reductions: the im2col path) included.
        assert_eq!(last == 0, name == "cnn", "{name}: {last} of {convs} convolutions channels-last");
        if name == "models/resnet18" || name == "models/mobilenet_v2" {
            assert_eq!(last, convs, "{name}: {last} of {convs} convolutions channels-last");
        }
        // What the permutes left come from: the 3-channel model input
        // (MobileNetV2's classifier mean and ResNet's stem max pool read
        // channels-last); EfficientNet's [N, C, 1, 1] squeeze-excite
        // vectors (its activations, global means and scaling run
        // channels-last; 80 permutes before).
        let most = match name {
            "models/mobilenet_v2" | "models/resnet18" => 1,
            "models/efficientnet_b0" => 11,
            _ => usize::MAX,
        };
        assert!(permutes <= most, "{name}: {permutes} permutes, expected at most {most}");
        let want = run(&before, &inputs, 1);
        for threads in [1, 3] {
            let got = run(&after, &inputs, threads);
            assert_eq!(got.len(), want.len(), "{name}: output count");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!((g.dtype, &g.shape), (w.dtype, &w.shape), "{name}: output {i} type");
                assert!(g.data == w.data, "{name}: output {i} differs channels-last at {threads} threads");
            }
        }
    }
}
