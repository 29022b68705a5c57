//! Channels-last convolutions (`conv_fused_channels_last`) against the
//! channels-first kernel on the transposed tensors: bit for bit, on every
//! kernel table this CPU runs, at 1 to 4 threads, packed and unpacked, with
//! each epilogue; and every table against the generic one. Covers each
//! channels-last path: depthwise (channel counts below, at and past the
//! 16-wide block), pointwise at stride 1 and 2, Winograd (F(2×2) and
//! F(4×4)), tap GEMMs, and the
//! im2col GEMM over pixels (3-channel stems, blocked over several work
//! items; a padded 1×1, no tap GEMMs),
//! the transposed fallback (groups, a depthwise multiplier); and 7×7 and
//! 14×14 layers large enough to be split over the threads.
mod common;
use common::*;
use kiln_kernels::*;

struct Case {
    /// Channels-first input shape.
    xs: [usize; 4],
    ws: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
}

const fn case(xs: [usize; 4], ws: [usize; 4], stride: [usize; 2], pad: [usize; 2], groups: usize) -> Case {
    Case { xs, ws, stride, pad, dil: [1, 1], groups }
}

const CASES: &[Case] = &[
    // Depthwise 3×3, MobileNetV2's: 32 channels (two blocks), stride 1 and 2.
    case([1, 32, 9, 10], [32, 1, 3, 3], [1, 1], [1, 1], 32),
    case([2, 48, 11, 8], [48, 1, 3, 3], [2, 2], [1, 1], 48),
    // 64-channel blocks: 144 = 64 + 64 + 16, 100 = 64 + 32 + an
    // overlapping 16.
    case([1, 144, 6, 7], [144, 1, 3, 3], [1, 1], [1, 1], 144),
    case([1, 100, 5, 5], [100, 1, 3, 3], [2, 2], [1, 1], 100),
    // Odd channel counts: overlapping last block, 8-, 4- and 1-wide blocks.
    case([1, 35, 7, 7], [35, 1, 3, 3], [1, 1], [1, 1], 35),
    case([1, 11, 6, 5], [11, 1, 3, 3], [2, 1], [1, 0], 11),
    case([1, 5, 6, 6], [5, 1, 5, 5], [1, 1], [2, 2], 5),
    case([1, 3, 4, 5], [3, 1, 3, 3], [1, 1], [1, 1], 3),
    // Register blocks of 8, 4, 2 and 1 output pixels (widths 23 and 15),
    // masked channel tails (200 = 12·16 + 8, 17, 8, 24), 5×5 at stride 2,
    // dilation 2, no padding.
    case([1, 200, 5, 23], [200, 1, 3, 3], [1, 1], [1, 1], 200),
    case([2, 17, 9, 15], [17, 1, 5, 5], [2, 2], [2, 2], 17),
    case([1, 8, 7, 12], [8, 1, 3, 3], [2, 1], [0, 1], 8),
    Case { xs: [1, 24, 9, 19], ws: [24, 1, 3, 3], stride: [1, 1], pad: [2, 2], dil: [2, 2], groups: 24 },
    Case { xs: [1, 40, 11, 13], ws: [40, 1, 5, 5], stride: [2, 1], pad: [0, 4], dil: [1, 2], groups: 40 },
    // The late small layers, big enough to run in parallel: 7 and 14
    // output rows, which 2, 3 and 4 threads do not divide evenly, so the
    // depthwise rows are cut into pixel runs (within and across rows), and
    // the pointwise GEMMs' one and four row blocks into column groups
    // (MobileNetV2's 7×7×960 and 14×14 layers, EfficientNet-B0's 5×5/2).
    case([1, 960, 7, 7], [960, 1, 3, 3], [1, 1], [1, 1], 960),
    case([1, 200, 14, 14], [200, 1, 3, 3], [1, 1], [1, 1], 200),
    case([1, 672, 14, 14], [672, 1, 5, 5], [2, 2], [2, 2], 672),
    case([1, 160, 7, 7], [960, 160, 1, 1], [1, 1], [0, 0], 1),
    case([1, 96, 14, 14], [576, 96, 1, 1], [1, 1], [0, 0], 1),
    // 49 pixels (one row block) and 160 output channels, too few strips
    // for the threads: the direct kernels' rows cut into runs of tiles
    // (pointwise, and the tap GEMMs of a 3×3/2).
    case([1, 576, 7, 7], [160, 576, 1, 1], [1, 1], [0, 0], 1),
    case([1, 64, 14, 14], [160, 64, 3, 3], [2, 2], [1, 1], 1),
    // Pointwise: stride 1 (the input read in place), stride 2 (gathered),
    // K past one 512-deep slice.
    case([2, 24, 7, 6], [40, 24, 1, 1], [1, 1], [0, 0], 1),
    case([1, 33, 9, 11], [19, 33, 1, 1], [2, 2], [0, 0], 1),
    case([1, 520, 3, 4], [17, 520, 1, 1], [1, 1], [0, 0], 1),
    // Dense 3×3, odd channels: stride 1 (Winograd on x86-64; odd output
    // sizes, padding 0 and 2, Cout past a 32-wide strip) and 2 (tap GEMMs).
    case([2, 33, 8, 9], [19, 33, 3, 3], [1, 1], [1, 1], 1),
    case([1, 64, 7, 9], [70, 64, 3, 3], [1, 1], [0, 0], 1),
    case([1, 32, 5, 4], [8, 32, 3, 3], [1, 1], [2, 2], 1),
    // Winograd F(4×4) (64 ≤ Cin, Cin·Cout ≤ 256²): output sizes off the
    // 4×4 tile, padding 0–2, batch 2, channels off every vector width,
    // more tiles (49) than one work item takes (32).
    case([2, 130, 9, 11], [19, 130, 3, 3], [1, 1], [1, 1], 1),
    case([1, 128, 14, 13], [72, 128, 3, 3], [1, 1], [0, 0], 1),
    case([1, 144, 6, 7], [40, 144, 3, 3], [1, 1], [2, 2], 1),
    case([1, 128, 28, 27], [24, 128, 3, 3], [1, 1], [1, 1], 1),
    case([1, 40, 11, 10], [36, 40, 3, 3], [2, 2], [1, 1], 1),
    // The im2col GEMM over pixels: a 3-channel 7×7/2 stem (ResNet's), a
    // 3×3/2 one (MobileNetV2's, batch 2), a padded 1×1, dilation, K past
    // one 512-deep slice (12·49 = 588).
    case([1, 3, 15, 14], [16, 3, 7, 7], [2, 2], [3, 3], 1),
    case([2, 3, 11, 12], [32, 3, 3, 3], [2, 2], [1, 1], 1),
    case([1, 6, 5, 5], [7, 6, 1, 1], [1, 1], [1, 1], 1),
    Case { xs: [1, 5, 9, 9], ws: [9, 5, 3, 3], stride: [1, 1], pad: [2, 2], dil: [2, 2], groups: 1 },
    case([1, 12, 9, 8], [5, 12, 7, 7], [1, 1], [3, 3], 1),
    // Stems big enough for the blocked im2col to split into several work
    // items (whole output rows, the last one short; across images) over
    // the threads.
    case([1, 3, 64, 62], [16, 3, 7, 7], [2, 2], [3, 3], 1),
    case([2, 3, 58, 60], [48, 3, 3, 3], [2, 2], [1, 1], 1),
    // Transposed through channels-first: groups, a depthwise multiplier.
    case([1, 8, 6, 7], [12, 4, 3, 3], [1, 1], [1, 1], 2),
    case([1, 4, 6, 6], [8, 1, 3, 3], [1, 1], [1, 1], 4),
];

fn out_shape(c: &Case) -> [usize; 4] {
    let o = |i: usize| (c.xs[2 + i] + 2 * c.pad[i] - c.dil[i] * (c.ws[2 + i] - 1) - 1) / c.stride[i] + 1;
    [c.xs[0], c.ws[0], o(0), o(1)]
}

fn to_nhwc(v: &[f32], s: &[usize; 4]) -> Vec<f32> {
    let [n, c, h, w] = *s;
    let mut out = vec![0.0; v.len()];
    for b in 0..n {
        for ch in 0..c {
            for p in 0..h * w {
                out[(b * h * w + p) * c + ch] = v[(b * c + ch) * h * w + p];
            }
        }
    }
    out
}

fn nhwc_shape(s: &[usize; 4]) -> [usize; 4] {
    [s[0], s[2], s[3], s[1]]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn channels_last_equals_channels_first_bit_for_bit() {
    let mut r = rng(91);
    let relu6 = Activation::Clamp { min: Some(0.0), max: Some(6.0) };
    let epilogues = [
        (None, false, false),
        (Some(Activation::Relu), true, true),
        (Some(relu6), true, false),
        (Some(relu6), false, false),
        (Some(Activation::MulSigmoid), true, false),
        (Some(Activation::Hardswish), false, false),
        (Some(Activation::GeluTanhChain), true, true),
        // Without a residual the depthwise rows apply these before their
        // store (in registers on x86-64): the same bits as the
        // channels-first kernel's pass over its finished planes. GELU's tanh
        // form has no vector form in the rows (the table's function).
        (Some(Activation::MulSigmoid), false, false),
        (Some(Activation::Silu), false, false),
        (Some(Activation::Sigmoid), false, false),
        (Some(Activation::Gelu), false, false),
        (Some(Activation::GeluTanh), false, false),
        (Some(Activation::GeluTanhChain), false, false),
    ];
    for (ci, c) in CASES.iter().enumerate() {
        let os = out_shape(c);
        let (xv, wv, bv) = (rand_f32(&mut r, numel(&c.xs)), rand_f32(&mut r, numel(&c.ws)), rand_f32(&mut r, c.ws[0]));
        let rv = rand_f32(&mut r, numel(&os));
        let (x, w, b, res) = (f32s(&c.xs, &xv), f32s(&c.ws, &wv), f32s(&[c.ws[0]], &bv), f32s(&os, &rv));
        let (xl, resl) = (f32s(&nhwc_shape(&c.xs), &to_nhwc(&xv, &c.xs)), f32s(&nhwc_shape(&os), &to_nhwc(&rv, &os)));
        let p = ConvParams { stride: &c.stride, padding: &c.pad, dilation: &c.dil, groups: c.groups };
        // The channels-first result, against the f64 reference once.
        let plain = ref_conv(&xv, &c.xs, &wv, &c.ws, &bv, &c.stride, &c.pad, &c.dil, c.groups, &os);
        // Winograd F(4×4)'s transforms scale its rounding error with the
        // sums' magnitudes rather than each output's (up to ~1.5e-5 of the
        // largest output on random data): an absolute tolerance to match.
        let f4 = c.ws[1] >= 64
            && c.ws[0] * c.ws[1] <= 256 * 256
            && c.ws[2..] == [3, 3]
            && c.stride == [1, 1]
            && c.groups == 1;
        let atol = if f4 { 4e-5 * plain.iter().fold(1f64, |m, v| m.max(v.abs())) } else { 1e-4 };
        let mut generic = Vec::new();
        let depthwise = c.ws[1] == 1 && c.groups == c.xs[1] && c.ws[0] == c.xs[1];
        for table in tables() {
            let packed = PackedConv::channels_last(table, w.r(), &p).unwrap();
            for (ei, &(act, residual, residual_first)) in epilogues.iter().enumerate() {
                let ctx = format!("case {ci} {} x {:?} w {:?} epilogue {ei}", table.isa(), c.xs, c.ws);
                let e = TensorEpilogue { activation: act, residual: residual.then(|| res.r()), residual_first };
                let mut cx = Context::with_table(table);
                let mut want = Buf::zeros(DType::F32, &os);
                conv_fused(x.r(), w.r(), None, Some(b.r()), &e, &p, want.w(), &mut cx).unwrap();
                let want = want.get::<f32>();
                if ei == 0 {
                    assert_close(&to64(&want), &plain, 1e-4, atol, &ctx);
                }
                let want = bits(&to_nhwc(&want, &os));
                let el = TensorEpilogue { activation: act, residual: residual.then(|| resl.r()), residual_first };
                for threads in 1..=4 {
                    for (pi, pk) in [None, packed.as_ref()].into_iter().enumerate() {
                        let mut cx = Context::with_table(table).with_threads(threads);
                        let mut o = Buf::zeros(DType::F32, &nhwc_shape(&os));
                        conv_fused_channels_last(xl.r(), w.r(), pk, Some(b.r()), &el, &p, o.w(), &mut cx).unwrap();
                        let got = bits(&o.get::<f32>());
                        let packed = pk.is_some();
                        assert!(got == want, "{ctx}: channels-last differs ({threads} threads, packed {packed})");
                        if threads == 1 && pi == 0 {
                            if table.isa() == Isa::Generic {
                                generic.push(got);
                            } else {
                                // The depthwise loops are the same IEEE
                                // operations on every table; the GEMMs'
                                // microkernels contract into FMAs, and the
                                // tables' exp-based activations are
                                // different code.
                                let g: &Vec<u32> = &generic[ei];
                                let exact = act.is_none_or(|a| {
                                    matches!(a, Activation::Relu | Activation::Clamp { .. } | Activation::Hardswish)
                                });
                                if depthwise && exact {
                                    assert!(&got == g, "{ctx}: differs from the generic table");
                                } else {
                                    let f = |v: &[u32]| v.iter().map(|&b| f32::from_bits(b) as f64).collect::<Vec<_>>();
                                    assert_close(&f(&got), &f(g), 1e-4, atol, &ctx);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn channels_last_refuses_bad_shapes() {
    let c = &CASES[0];
    let (x, w) = (Buf::zeros(DType::F32, &nhwc_shape(&c.xs)), Buf::zeros(DType::F32, &c.ws));
    let p = ConvParams { stride: &c.stride, padding: &c.pad, dilation: &c.dil, groups: c.groups };
    let e = TensorEpilogue::default();
    let mut cx = Context::with_table(KernelTable::generic_only());
    // Channels-first output shape: the channel count is in the wrong place.
    let mut o = Buf::zeros(DType::F32, &out_shape(c));
    let err = conv_fused_channels_last(x.r(), w.r(), None, None, &e, &p, o.w(), &mut cx).unwrap_err();
    assert!(err.to_string().contains("output"), "{err}");
    // Rank 3.
    let mut o = Buf::zeros(DType::F32, &[1, 9, 10]);
    let x3 = Buf::zeros(DType::F32, &[1, 9, 10]);
    assert!(conv_fused_channels_last(x3.r(), w.r(), None, None, &e, &p, o.w(), &mut cx).is_err());
    // A weight packed for another shape.
    let other = Buf::zeros(DType::F32, &[8, 32, 1, 1]);
    let p1 = ConvParams { stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1], groups: 1 };
    let packed = PackedConv::channels_last(KernelTable::generic_only(), other.r(), &p1).unwrap().unwrap();
    let mut o = Buf::zeros(DType::F32, &nhwc_shape(&out_shape(c)));
    let err = conv_fused_channels_last(x.r(), w.r(), Some(&packed), None, &e, &p, o.w(), &mut cx).unwrap_err();
    assert!(err.to_string().contains("packed"), "{err}");
}
