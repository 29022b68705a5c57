//! The direct depthwise convolution against the im2col + GEMM path (forced
//! through `conv_with`) and the f64 reference, on odd shapes.
mod common;
use common::*;
use kiln_kernels::*;

/// Output spatial size, or `None` when the dilated kernel does not fit.
fn out_dim(input: usize, kernel: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    let span = dil * (kernel - 1) + 1;
    (input + 2 * pad >= span).then(|| (input + 2 * pad - span) / stride + 1)
}

struct Case<'a> {
    xs: &'a [usize],
    ws: &'a [usize],
    stride: &'a [usize],
    pad: &'a [usize],
    dil: &'a [usize],
    bias: bool,
}

/// Runs `case` through the depthwise path, the im2col path and `conv` (auto),
/// and checks all three against the reference.
fn check(case: &Case, r: &mut rand::rngs::StdRng, s: &mut Context) {
    let Case { xs, ws, stride, pad, dil, bias } = *case;
    let mut os = vec![xs[0], ws[0]];
    for i in 0..xs.len() - 2 {
        match out_dim(xs[2 + i], ws[2 + i], stride[i], pad[i], dil[i]) {
            Some(o) => os.push(o),
            None => return,
        }
    }
    let (xv, wv) = (rand_f32(r, numel(xs)), rand_f32(r, numel(ws)));
    let bv = if bias { rand_f32(r, ws[0]) } else { vec![] };
    let (x, w, b) = (f32s(xs, &xv), f32s(ws, &wv), f32s(&[ws[0]], &bv));
    let p = ConvParams { stride, padding: pad, dilation: dil, groups: xs[1] };
    let want = ref_conv(&xv, xs, &wv, ws, &bv, stride, pad, dil, xs[1], &os);
    let ctx = format!("x {xs:?} w {ws:?} stride {stride:?} pad {pad:?} dil {dil:?} bias {bias}");
    let mut run = |algorithm| {
        let mut o = Buf::zeros(DType::F32, &os);
        let b = bias.then(|| b.r());
        conv_with(x.r(), w.r(), b, &p, o.w(), s, algorithm).unwrap();
        to64(&o.get::<f32>())
    };
    let (direct, im2col, auto) = (run(ConvAlgorithm::Depthwise), run(ConvAlgorithm::Im2col), run(ConvAlgorithm::Auto));
    assert_close(&direct, &want, 1e-5, 1e-5, &format!("depthwise vs reference, {ctx}"));
    assert_close(&direct, &im2col, 1e-5, 1e-5, &format!("depthwise vs im2col, {ctx}"));
    assert_close(&auto, &want, 1e-5, 1e-5, &format!("auto vs reference, {ctx}"));
}

#[test]
fn depthwise_2d_matches_im2col_and_reference() {
    let mut r = rng(40);
    let mut s = Context::new();
    let spatial: &[[usize; 2]] = &[[1, 1], [7, 5], [17, 1], [33, 35]];
    let kernels: &[[usize; 2]] = &[[1, 1], [3, 3], [5, 3]];
    for &c in &[1, 7, 17] {
        for &[h, wd] in spatial {
            for &[kh, kw] in kernels {
                for st in [1, 2] {
                    for pd in [0, 1, 2] {
                        for dl in [1, 2] {
                            let bias = (c + h + kh + st + pd + dl) % 2 == 0;
                            let (xs, ws) = ([1, c, h, wd], [c, 1, kh, kw]);
                            check(
                                &Case { xs: &xs, ws: &ws, stride: &[st, st], pad: &[pd, pd], dil: &[dl, dl], bias },
                                &mut r,
                                &mut s,
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn depthwise_mixed_parameters_batch_and_multiplier() {
    let mut r = rng(41);
    let mut s = Context::new();
    // Per-dim stride/pad/dilation, batch 2, multiplier 2 and 3, with and without bias.
    for bias in [false, true] {
        let cases = [
            Case { xs: &[2, 7, 17, 13], ws: &[7, 1, 3, 3], stride: &[2, 1], pad: &[1, 2], dil: &[1, 2], bias },
            Case { xs: &[2, 7, 9, 11], ws: &[14, 1, 3, 5], stride: &[1, 2], pad: &[2, 0], dil: &[2, 1], bias },
            Case { xs: &[1, 1, 33, 35], ws: &[3, 1, 3, 3], stride: &[2, 2], pad: &[1, 1], dil: &[1, 1], bias },
            Case { xs: &[1, 17, 1, 1], ws: &[34, 1, 1, 1], stride: &[1, 1], pad: &[0, 0], dil: &[1, 1], bias },
            // Kernel larger than the input, reaching it only through the padding.
            Case { xs: &[1, 7, 2, 3], ws: &[7, 1, 5, 7], stride: &[1, 1], pad: &[2, 2], dil: &[1, 1], bias },
        ];
        for case in &cases {
            check(case, &mut r, &mut s);
        }
    }
}

#[test]
fn depthwise_1d_and_3d() {
    let mut r = rng(42);
    let mut s = Context::new();
    for &c in &[1, 7, 17] {
        for len in [1, 7, 33] {
            for (k, st, pd, dl) in [(1, 1, 0, 1), (3, 1, 1, 1), (3, 2, 2, 2), (5, 2, 0, 1)] {
                let (xs, ws) = ([2, c, len], [c, 1, k]);
                check(&Case { xs: &xs, ws: &ws, stride: &[st], pad: &[pd], dil: &[dl], bias: c != 7 }, &mut r, &mut s);
            }
        }
    }
    let case = Case {
        xs: &[1, 7, 5, 6, 7],
        ws: &[7, 1, 3, 3, 3],
        stride: &[1, 2, 1],
        pad: &[1, 1, 0],
        dil: &[1, 1, 2],
        bias: true,
    };
    check(&case, &mut r, &mut s);
}

#[test]
fn forced_depthwise_rejects_grouped_convolutions() {
    let mut s = Context::new();
    let (x, w) = (Buf::zeros(DType::F32, &[1, 4, 5, 5]), Buf::zeros(DType::F32, &[4, 2, 3, 3]));
    let mut o = Buf::zeros(DType::F32, &[1, 4, 3, 3]);
    let p = ConvParams { stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1], groups: 2 };
    assert!(conv_with(x.r(), w.r(), None, &p, o.w(), &mut s, ConvAlgorithm::Depthwise).is_err());
    conv_with(x.r(), w.r(), None, &p, o.w(), &mut s, ConvAlgorithm::Im2col).unwrap();
}
