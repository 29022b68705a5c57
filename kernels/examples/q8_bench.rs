//! The dense int8 convolutions of ResNet-18 and MobileNetV2 (224², batch 1,
//! channels-last, static activations, i8 in and i8 out, bias and ReLU
//! fused as the int8-static models run them): best time of each shape per
//! integer-kernel variant (the table's best last), and their sum. Run it
//! on two builds to compare them (the machine is shared: take several
//! runs).
//!
//!     cargo run --release -p kiln-kernels --example q8_bench -- [THREADS [RUNS [MODEL [LAYER [VARIANT]]]]]
//!
//! MODEL is `resnet18`, `mobilenet_v2` or `all` (default); LAYER an index
//! into the model's list (anything else: every layer); VARIANT one
//! variant's name (`avx512_vnni`: for a profile), else all.

use kiln_isa::Activation;
use kiln_kernels::quant::{qconv_int8_with, variants, ActQuant, PackedQWeights, QBits, QWeights};
use kiln_kernels::{Context, ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
use std::time::Instant;

/// (input size, Cin, Cout, kernel, stride, padding).
type Layer = (usize, usize, usize, usize, usize, usize);

/// ResNet-18's dense layers (one of each distinct shape: the stem, the
/// 3×3 layers of each stage, the 1×1 stride-2 downsamples).
const RESNET18: [Layer; 11] = [
    (224, 3, 64, 7, 2, 3),
    (56, 64, 64, 3, 1, 1),
    (56, 64, 128, 3, 2, 1),
    (56, 64, 128, 1, 2, 0),
    (28, 128, 128, 3, 1, 1),
    (28, 128, 256, 3, 2, 1),
    (28, 128, 256, 1, 2, 0),
    (14, 256, 256, 3, 1, 1),
    (14, 256, 512, 3, 2, 1),
    (14, 256, 512, 1, 2, 0),
    (7, 512, 512, 3, 1, 1),
];

/// MobileNetV2's dense layers: the stem, then the first blocks' 1×1
/// project / expand layers (the large-image ones, where its int8 time goes).
const MOBILENET_V2: [Layer; 8] = [
    (224, 3, 32, 3, 2, 1),
    (112, 32, 16, 1, 1, 0),
    (112, 16, 96, 1, 1, 0),
    (56, 96, 24, 1, 1, 0),
    (56, 24, 144, 1, 1, 0),
    (56, 144, 24, 1, 1, 0),
    (28, 144, 32, 1, 1, 0),
    (28, 32, 192, 1, 1, 0),
];

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let threads = arg(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = arg(2).and_then(|t| t.parse().ok()).unwrap_or(30);
    let model = arg(3).unwrap_or_else(|| "all".into());
    let only: Option<usize> = arg(4).and_then(|t| t.parse().ok());
    let mut cx = Context::new().with_threads(threads);
    let variant = arg(5);
    let kernels: Vec<_> = variants().into_iter().filter(|k| variant.as_deref().is_none_or(|v| v == k.name())).collect();
    let models: Vec<(&str, &[Layer])> = [("resnet18", &RESNET18[..]), ("mobilenet_v2", &MOBILENET_V2[..])]
        .into_iter()
        .filter(|(m, _)| model == "all" || model == *m)
        .collect();
    let names: Vec<&str> = kernels.iter().map(|k| k.name()).collect();
    println!("µs per layer (best of {runs}), {threads} thread(s): {}", names.join(" | "));
    for (name, layers) in models {
        let mut totals = vec![0f64; kernels.len()];
        for (i, &layer) in layers.iter().enumerate() {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            let times: Vec<f64> = kernels.iter().map(|k| time_layer(&mut cx, k, layer, runs)).collect();
            totals.iter_mut().zip(&times).for_each(|(t, x)| *t += x);
            let cells: Vec<String> = times.iter().map(|t| format!("{t:8.1}")).collect();
            println!("{name} {layer:?}: {}", cells.join(" "));
        }
        let cells: Vec<String> = totals.iter().map(|t| format!("{t:8.1}")).collect();
        println!("{name} total: {}", cells.join(" "));
    }
}

/// Best µs of `runs` calls of one layer (ReLU fused; i8 in, i8 out).
fn time_layer(cx: &mut Context, kernels: &kiln_kernels::quant::QuantKernels, layer: Layer, runs: usize) -> f64 {
    let (hw, cin, cout, k, s, p) = layer;
    let o = (hw + 2 * p - k) / s + 1;
    let kk = cin * k * k;
    let data: Vec<u8> = (0..cout * kk).map(|i| ((i * 37 + 11) % 255) as u8).collect();
    let scales: Vec<f32> = (0..cout).map(|j| 0.002 + j as f32 * 1e-5).collect();
    let w = QWeights { n: cout, k: kk, bits: QBits::I8, group: kk, data: &data, scales: &scales, zero_points: None };
    let packed = PackedQWeights::pack(&w).expect("pack");
    let bias: Vec<f32> = (0..cout).map(|j| j as f32 * 0.01 - 0.3).collect();
    let x: Vec<i8> = (0..hw * hw * cin).map(|i| ((i * 29 + 5) % 251) as i8).collect();
    let mut y = vec![0i8; o * o * cout];
    let params = ConvParams { stride: &[s, s], padding: &[p, p], dilation: &[1, 1], groups: 1 };
    let epilogue = TensorEpilogue {
        activation: Some(Activation::Clamp { min: Some(0.0), max: None }),
        residual: None,
        residual_first: false,
    };
    let (x_shape, w_shape, y_shape) = ([1, hw, hw, cin], [cout, cin, k, k], [1, o, o, cout]);
    let act = ActQuant::Static { scale: 0.05, zero_point: -3 };
    let mut best = f64::INFINITY;
    for _ in 0..runs + 2 {
        let xt = TensorRef { dtype: DType::I8, shape: &x_shape, data: bytemuck::cast_slice(&x) };
        let yt = TensorMut { dtype: DType::I8, shape: &y_shape, data: bytemuck::cast_slice_mut(&mut y) };
        let t = Instant::now();
        qconv_int8_with(
            cx,
            kernels,
            xt,
            &packed,
            &w_shape,
            act,
            Some(&bias),
            &epilogue,
            &params,
            true,
            yt,
            Some((0.04, -128)),
            None,
        )
        .expect("qconv");
        best = best.min(t.elapsed().as_secs_f64() * 1e6);
    }
    best
}
