//! Convolution microbenchmarks: `cargo bench -p kiln-benches --bench conv`.
//!
//! The channels-last fused convolution (the path compiled CNNs run) on the
//! shapes that dominate the zoo's CNNs — ResNet-18's stem and 3×3 layers,
//! MobileNetV2's short-K 1×1 expansion and projection at 112² / 56², its
//! stride-1 and stride-2 depthwise layers — with the weights packed once, as
//! the runtime does at load, on every kernel table this CPU runs (one
//! thread). `layer_compare.py` compares the same layers with ONNX Runtime
//! inside whole models; this isolates one kernel call.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln_benches::distinct_tables;
use kiln_kernels::{
    conv_fused_channels_last, Activation, Context, ConvParams, DType, PackedConv, TensorEpilogue, TensorMut, TensorRef,
};

/// One layer: input `[1, H, W, Cin]` channels-last, weight `[Cout, Cin/groups, k, k]`.
struct Layer {
    name: &'static str,
    hw: usize,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    groups: usize,
}

const LAYERS: &[Layer] = &[
    Layer { name: "resnet_stem_7x7s2_3to64_224", hw: 224, cin: 3, cout: 64, k: 7, stride: 2, groups: 1 },
    Layer { name: "resnet_3x3_64to64_56", hw: 56, cin: 64, cout: 64, k: 3, stride: 1, groups: 1 },
    Layer { name: "resnet_3x3s2_128to256_28", hw: 28, cin: 128, cout: 256, k: 3, stride: 2, groups: 1 },
    Layer { name: "mnv2_stem_3x3s2_3to32_224", hw: 224, cin: 3, cout: 32, k: 3, stride: 2, groups: 1 },
    Layer { name: "mnv2_expand_1x1_16to96_112", hw: 112, cin: 16, cout: 96, k: 1, stride: 1, groups: 1 },
    Layer { name: "mnv2_project_1x1_144to24_56", hw: 56, cin: 144, cout: 24, k: 1, stride: 1, groups: 1 },
    Layer { name: "mnv2_dw_3x3_144_56", hw: 56, cin: 144, cout: 144, k: 3, stride: 1, groups: 144 },
    Layer { name: "mnv2_dw_3x3s2_96_112", hw: 112, cin: 96, cout: 96, k: 3, stride: 2, groups: 96 },
];

fn f32_bytes(n: usize, step: f32) -> Vec<u8> {
    (0..n).flat_map(|i| ((i % 23) as f32 * step - 11.0 * step).to_le_bytes()).collect()
}

fn bench_conv(c: &mut Criterion) {
    for layer in LAYERS {
        let Layer { hw, cin, cout, k, stride, groups, .. } = *layer;
        let pad = k / 2;
        let ohw = (hw + 2 * pad - k) / stride + 1;
        let (xs, ws, os) = ([1, hw, hw, cin], [cout, cin / groups, k, k], [1, ohw, ohw, cout]);
        let x = f32_bytes(xs.iter().product(), 0.05);
        let w = f32_bytes(ws.iter().product(), 0.01);
        let b = f32_bytes(cout, 0.1);
        let mut out = vec![0u8; os.iter().product::<usize>() * 4];
        let (strides, pads, dil) = ([stride; 2], [pad; 2], [1usize; 2]);
        let p = ConvParams { stride: &strides, padding: &pads, dilation: &dil, groups };
        let macs = os.iter().product::<usize>() * (cin / groups) * k * k;
        let mut group = c.benchmark_group(format!("conv_nhwc_{}", layer.name));
        group.throughput(Throughput::Elements(2 * macs as u64));
        for (isa, table) in distinct_tables(true) {
            let wr = TensorRef { dtype: DType::F32, shape: &ws, data: &w };
            let packed = PackedConv::channels_last(table, wr, &p).expect("pack the weight");
            let mut cx = Context::with_table(table);
            group.bench_function(BenchmarkId::from_parameter(isa.name()), |bench| {
                bench.iter(|| {
                    let xr = TensorRef { dtype: DType::F32, shape: &xs, data: &x };
                    let br = TensorRef { dtype: DType::F32, shape: &[cout], data: &b };
                    let e =
                        TensorEpilogue { activation: Some(Activation::Relu), residual: None, residual_first: false };
                    let o = TensorMut { dtype: DType::F32, shape: &os, data: &mut out };
                    conv_fused_channels_last(xr, wr, packed.as_ref(), Some(br), &e, &p, o, &mut cx).unwrap();
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_conv);
criterion_main!(benches);
