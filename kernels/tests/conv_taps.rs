//! The tap path of dense 2-d convolutions (one GEMM per kernel tap over a
//! channels-last, stride-phase-split copy of the input) against the im2col
//! path and the f64 reference, on every kernel table this CPU runs: odd
//! channel counts (not multiples of any vector width), padding, strides
//! (also unequal), dilation, batch, fused epilogues and thread counts; and
//! the Winograd path of 3×3 stride-1 convolutions against both.
mod common;
use common::*;
use kiln_kernels::*;

/// Whether `table`'s GEMM reads A in place, so that the tap path runs (on
/// x86-64; NEON and the generic table keep im2col).
fn runs_taps(table: &KernelTable) -> bool {
    matches!(table.isa(), Isa::X86_64V3 | Isa::X86_64V4)
}

struct Case {
    xs: [usize; 4],
    ws: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
}

const fn case(xs: [usize; 4], ws: [usize; 4], stride: [usize; 2], pad: [usize; 2], dil: [usize; 2]) -> Case {
    Case { xs, ws, stride, pad, dil }
}

const CASES: &[Case] = &[
    // ResNet-like 3×3, odd Cin/Cout, batch 2.
    case([2, 33, 11, 13], [19, 33, 3, 3], [1, 1], [1, 1], [1, 1]),
    // Stride 2 (four phases), Cout past one 32-wide strip.
    case([1, 40, 15, 16], [40, 40, 3, 3], [2, 2], [1, 1], [1, 1]),
    // Unequal strides, padding and dilation; a 3×2 kernel.
    case([1, 37, 12, 9], [5, 37, 3, 2], [2, 1], [0, 2], [2, 1]),
    // Stride 3 with a 5×5 kernel (nine phases, some unused by no tap).
    case([1, 32, 9, 10], [64, 32, 5, 5], [3, 3], [2, 2], [1, 1]),
    // A 7×7 image (the grid is 9 wide: 2 dropped columns per row).
    case([1, 48, 7, 7], [33, 48, 3, 3], [1, 1], [1, 1], [1, 1]),
    // Deep K per tap (Cin 520 > KC = 512: two K slices per tap).
    case([1, 520, 5, 6], [9, 520, 3, 3], [2, 2], [3, 1], [1, 2]),
    // A 7×7 stride-2 stem-like kernel: 49 taps.
    case([1, 32, 20, 19], [16, 32, 7, 7], [2, 2], [3, 3], [1, 1]),
    // A 1×3 kernel and a kernel that fills the padded image exactly.
    case([1, 35, 6, 6], [8, 35, 1, 3], [1, 2], [0, 1], [1, 1]),
    case([1, 32, 3, 4], [7, 32, 5, 6], [1, 1], [1, 1], [1, 1]),
];

fn out_shape(c: &Case) -> [usize; 4] {
    let o = |i: usize| (c.xs[2 + i] + 2 * c.pad[i] - c.dil[i] * (c.ws[2 + i] - 1) - 1) / c.stride[i] + 1;
    [c.xs[0], c.ws[0], o(0), o(1)]
}

#[test]
fn tap_path_matches_im2col_and_reference() {
    let mut r = rng(71);
    for table in tables() {
        for c in CASES {
            let os = out_shape(c);
            let (xv, wv, bv) =
                (rand_f32(&mut r, numel(&c.xs)), rand_f32(&mut r, numel(&c.ws)), rand_f32(&mut r, c.ws[0]));
            let (x, w, b) = (f32s(&c.xs, &xv), f32s(&c.ws, &wv), f32s(&[c.ws[0]], &bv));
            let p = ConvParams { stride: &c.stride, padding: &c.pad, dilation: &c.dil, groups: 1 };
            let want = ref_conv(&xv, &c.xs, &wv, &c.ws, &bv, &c.stride, &c.pad, &c.dil, 1, &os);
            let ctx = format!(
                "{} x {:?} w {:?} stride {:?} pad {:?} dil {:?}",
                table.isa(),
                c.xs,
                c.ws,
                c.stride,
                c.pad,
                c.dil
            );
            let run = |algorithm, threads| {
                let mut cx = Context::with_table(table).with_threads(threads);
                let mut o = Buf::zeros(DType::F32, &os);
                conv_with(x.r(), w.r(), Some(b.r()), &p, o.w(), &mut cx, algorithm).unwrap();
                (o.get::<f32>(), cx.b_packs())
            };
            let (auto, auto_packs) = run(ConvAlgorithm::Auto, 1);
            let (im2col, im2col_packs) = run(ConvAlgorithm::Im2col, 1);
            // The tap path packs no B (im2col packs its strips per run).
            assert!(im2col_packs > 0, "im2col packed nothing: {ctx}");
            assert_eq!(auto_packs == 0, runs_taps(table), "tap path taken or not: {ctx}");
            // The dot products are up to 4680 terms of values in [-1, 1).
            assert_close(&to64(&auto), &want, 1e-4, 1e-4, &format!("auto vs reference, {ctx}"));
            assert_close(&to64(&auto), &to64(&im2col), 1e-4, 1e-4, &format!("auto vs im2col, {ctx}"));
            for t in [2, 3, 4] {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(bits(&run(ConvAlgorithm::Auto, t).0) == bits(&auto), "{t} threads differ: {ctx}");
            }
        }
    }
}

/// Packed and unpacked weights give the same bits, with each epilogue
/// (the residual before and after the activation), and the fused result
/// matches the reference followed by the epilogue.
#[test]
fn tap_path_packed_and_fused() {
    let mut r = rng(72);
    let relu6 = Activation::Clamp { min: Some(0.0), max: Some(6.0) };
    for table in tables() {
        for c in &CASES[..3] {
            let os = out_shape(c);
            let (xv, wv, bv) =
                (rand_f32(&mut r, numel(&c.xs)), rand_f32(&mut r, numel(&c.ws)), rand_f32(&mut r, c.ws[0]));
            let rv = rand_f32(&mut r, numel(&os));
            let (x, w, b, res) = (f32s(&c.xs, &xv), f32s(&c.ws, &wv), f32s(&[c.ws[0]], &bv), f32s(&os, &rv));
            let p = ConvParams { stride: &c.stride, padding: &c.pad, dilation: &c.dil, groups: 1 };
            let plain = ref_conv(&xv, &c.xs, &wv, &c.ws, &bv, &c.stride, &c.pad, &c.dil, 1, &os);
            let packed = PackedConv::new(table, w.r(), 1).unwrap();
            for (act, residual, residual_first) in [
                (Some(Activation::Relu), true, false),
                (Some(relu6), true, true),
                (None, true, false),
                (Some(Activation::Relu), false, false),
            ] {
                let relu = |v: f64| match act {
                    None => v,
                    Some(Activation::Relu) => v.max(0.0),
                    Some(_) => v.clamp(0.0, 6.0),
                };
                let want: Vec<f64> = plain
                    .iter()
                    .zip(&rv)
                    .map(|(&v, &rr)| {
                        let rr = if residual { rr as f64 } else { 0.0 };
                        if residual_first {
                            relu(v + rr)
                        } else {
                            relu(v) + rr
                        }
                    })
                    .collect();
                let e = TensorEpilogue { activation: act, residual: residual.then(|| res.r()), residual_first };
                let ctx = format!("{} {:?} {act:?} residual {residual}/{residual_first}", table.isa(), c.ws);
                let mut outs = Vec::new();
                for pk in [None, Some(&packed)] {
                    let mut cx = Context::with_table(table).with_threads(2);
                    let mut o = Buf::zeros(DType::F32, &os);
                    conv_fused(x.r(), w.r(), pk, Some(b.r()), &e, &p, o.w(), &mut cx).unwrap();
                    let o = o.get::<f32>();
                    assert_close(&to64(&o), &want, 1e-4, 1e-4, &ctx);
                    outs.push(o.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
                assert!(outs[0] == outs[1], "packed and unpacked differ: {ctx}");
            }
        }
    }
}

/// 3×3 stride-1 convolutions (Winograd F(2×2, 3×3), or F(4×4, 3×3) where
/// `64 ≤ Cin` and `Cin·Cout ≤ 256²`, on tables whose GEMM reads A in
/// place): against the
/// f64 reference and the tap path, the same bits at 1–4 threads and packed
/// (`for_params`) or not, with each epilogue; odd and even output sizes
/// (partial 2×2 and 4×4 tiles), padding 0–2, batch 2, channel counts off
/// every vector width, more tiles than one work item takes (64 for F(2×2),
/// 32 for F(4×4)); and each tile forced on every shape.
#[test]
fn winograd_matches_reference_taps_and_threads() {
    let mut r = rng(73);
    let relu6 = Activation::Clamp { min: Some(0.0), max: Some(6.0) };
    let cases = [
        case([2, 33, 11, 13], [19, 33, 3, 3], [1, 1], [1, 1], [1, 1]),
        case([1, 64, 7, 9], [70, 64, 3, 3], [1, 1], [0, 0], [1, 1]),
        case([1, 40, 5, 4], [48, 40, 3, 3], [1, 1], [2, 2], [1, 1]),
        case([1, 32, 20, 23], [32, 32, 3, 3], [1, 1], [1, 1], [1, 1]),
        case([1, 48, 3, 3], [17, 48, 3, 3], [1, 1], [0, 1], [1, 1]),
        case([2, 130, 9, 11], [19, 130, 3, 3], [1, 1], [1, 1], [1, 1]),
        case([1, 128, 7, 7], [72, 128, 3, 3], [1, 1], [1, 1], [1, 1]),
        case([1, 144, 6, 5], [40, 144, 3, 3], [1, 1], [2, 2], [1, 1]),
        case([1, 128, 27, 30], [33, 128, 3, 3], [1, 1], [0, 0], [1, 1]),
        // Past 256² channel pairs: F(2×2) again.
        case([1, 300, 5, 6], [230, 300, 3, 3], [1, 1], [1, 1], [1, 1]),
    ];
    for table in tables() {
        for c in &cases {
            let os = out_shape(c);
            let (xv, wv, bv) =
                (rand_f32(&mut r, numel(&c.xs)), rand_f32(&mut r, numel(&c.ws)), rand_f32(&mut r, c.ws[0]));
            let rv = rand_f32(&mut r, numel(&os));
            let (x, w, b, res) = (f32s(&c.xs, &xv), f32s(&c.ws, &wv), f32s(&[c.ws[0]], &bv), f32s(&os, &rv));
            let p = ConvParams { stride: &c.stride, padding: &c.pad, dilation: &c.dil, groups: 1 };
            let plain = ref_conv(&xv, &c.xs, &wv, &c.ws, &bv, &c.stride, &c.pad, &c.dil, 1, &os);
            let packed = PackedConv::for_params(table, w.r(), &p).unwrap();
            let ctx = format!("{} x {:?} w {:?} pad {:?}", table.isa(), c.xs, c.ws, c.pad);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let run = |algorithm, threads| {
                let mut cx = Context::with_table(table).with_threads(threads);
                let mut o = Buf::zeros(DType::F32, &os);
                conv_with(x.r(), w.r(), Some(b.r()), &p, o.w(), &mut cx, algorithm).unwrap();
                o.get::<f32>()
            };
            let (auto, taps) = (run(ConvAlgorithm::Auto, 1), run(ConvAlgorithm::Taps, 1));
            // Sums of up to 2700 products of values in [-2, 2). Winograd's
            // transforms scale its rounding error with the sums' magnitudes
            // rather than each output's (F(4×4): up to ~1.5e-5 of the
            // largest output on random data, F(2×2) ~1e-6): absolute
            // tolerances to match.
            let largest = plain.iter().fold(1f64, |m, v| m.max(v.abs()));
            let (f2_atol, f4_atol) = ((2e-6 * largest).max(1e-4), 4e-5 * largest);
            let takes_f4 = c.ws[1] >= 64 && c.ws[0] * c.ws[1] <= 256 * 256;
            let atol = if takes_f4 { f4_atol } else { f2_atol };
            assert_close(&to64(&auto), &plain, 1e-4, atol, &format!("auto vs reference, {ctx}"));
            assert_close(&to64(&auto), &to64(&taps), 1e-4, atol, &format!("auto vs taps, {ctx}"));
            // Another rounding: the Winograd path ran (and `Taps` kept it off).
            assert_eq!(bits(&auto) != bits(&taps), runs_taps(table), "Winograd taken or not: {ctx}");
            for t in [2, 3, 4] {
                assert!(bits(&run(ConvAlgorithm::Auto, t)) == bits(&auto), "{t} threads differ: {ctx}");
            }
            // Each tile forced: close to the reference, the same at any
            // thread count, `Auto` the one the shape takes, and the two
            // different roundings.
            let (f2, f4) = (run(ConvAlgorithm::WinogradF2, 1), run(ConvAlgorithm::WinogradF4, 1));
            for (name, o, algorithm, atol) in
                [("F2", &f2, ConvAlgorithm::WinogradF2, f2_atol), ("F4", &f4, ConvAlgorithm::WinogradF4, f4_atol)]
            {
                assert_close(&to64(o), &plain, 1e-4, atol, &format!("{name} vs reference, {ctx}"));
                assert!(bits(&run(algorithm, 3)) == bits(o), "{name}: 3 threads differ: {ctx}");
            }
            let auto_tile = if takes_f4 { &f4 } else { &f2 };
            assert!(bits(&auto) == bits(auto_tile), "Auto took the other tile: {ctx}");
            assert_eq!(bits(&f2) != bits(&f4), runs_taps(table), "F2 and F4 the same rounding: {ctx}");
            for (act, residual, residual_first) in [
                (Some(Activation::Relu), true, false),
                (Some(relu6), true, true),
                (Some(Activation::Relu), false, false),
            ] {
                let act_of = |v: f64| match act {
                    None => v,
                    Some(Activation::Relu) => v.max(0.0),
                    Some(_) => v.clamp(0.0, 6.0),
                };
                let want: Vec<f64> = plain
                    .iter()
                    .zip(&rv)
                    .map(|(&v, &rr)| {
                        let rr = if residual { rr as f64 } else { 0.0 };
                        if residual_first {
                            act_of(v + rr)
                        } else {
                            act_of(v) + rr
                        }
                    })
                    .collect();
                let e = TensorEpilogue { activation: act, residual: residual.then(|| res.r()), residual_first };
                let ctx = format!("{ctx} {act:?} residual {residual}/{residual_first}");
                let mut outs = Vec::new();
                for (pk, threads) in [(None, 1), (Some(&packed), 1), (Some(&packed), 3)] {
                    let mut cx = Context::with_table(table).with_threads(threads);
                    let mut o = Buf::zeros(DType::F32, &os);
                    conv_fused(x.r(), w.r(), pk, Some(b.r()), &e, &p, o.w(), &mut cx).unwrap();
                    let o = o.get::<f32>();
                    assert_close(&to64(&o), &want, 1e-4, atol, &ctx);
                    outs.push(bits(&o));
                }
                assert!(outs.iter().all(|o| *o == outs[0]), "packed/unpacked or threads differ: {ctx}");
            }
        }
    }
}

/// The Winograd path (F(2×2) and F(4×4)) on the AVX2 and the AVX-512 table
/// gives the same bits
/// (its tile transforms are compiled per level but are the same adds; both
/// GEMM microkernels compute each element as one FMA chain in k order), in
/// both layouts. Skipped where the CPU lacks AVX-512.
#[test]
fn winograd_is_the_same_at_every_x86_level() {
    let (Some(v3), Some(v4)) = (KernelTable::for_isa(Isa::X86_64V3), KernelTable::for_isa(Isa::X86_64V4)) else {
        return;
    };
    let mut r = rng(74);
    for c in [
        case([2, 33, 11, 13], [19, 33, 3, 3], [1, 1], [1, 1], [1, 1]),
        case([1, 64, 16, 17], [70, 64, 3, 3], [1, 1], [0, 0], [1, 1]),
        case([2, 130, 9, 11], [19, 130, 3, 3], [1, 1], [1, 1], [1, 1]),
        case([1, 128, 14, 13], [72, 128, 3, 3], [1, 1], [0, 0], [1, 1]),
    ] {
        let os = out_shape(&c);
        let (xv, wv, bv) = (rand_f32(&mut r, numel(&c.xs)), rand_f32(&mut r, numel(&c.ws)), rand_f32(&mut r, c.ws[0]));
        let (x, w, b) = (f32s(&c.xs, &xv), f32s(&c.ws, &wv), f32s(&[c.ws[0]], &bv));
        let p = ConvParams { stride: &c.stride, padding: &c.pad, dilation: &c.dil, groups: 1 };
        let run = |table: &'static KernelTable| {
            let mut cx = Context::with_table(table).with_threads(2);
            let mut o = Buf::zeros(DType::F32, &os);
            conv_with(x.r(), w.r(), Some(b.r()), &p, o.w(), &mut cx, ConvAlgorithm::Auto).unwrap();
            o.get::<f32>().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert!(run(v3) == run(v4), "x {:?} w {:?}: AVX2 and AVX-512 differ", c.xs, c.ws);
    }
}
