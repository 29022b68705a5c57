//! Threads, packed weights and fused epilogues.
//!
//! - Every threaded kernel gives the same bytes at 1, 2, 3 and 4 threads, on
//!   every kernel table this CPU runs (shapes big enough to take the parallel
//!   paths, with edge tiles).
//! - A GEMM on a `PackedB` gives the same bytes as one packing B itself, for
//!   both B layouts, and packs nothing during the call.
//! - `linear_fused`'s epilogue (scale, bias, activation, residual) equals the
//!   unfused kernels run one after the other.

mod common;

use common::*;
use kiln_kernels::{self as k, Activation, BinaryOp, Context, DType, KernelTable, LinearEpilogue, PackedB, UnaryOp};

const THREADS: [usize; 4] = [1, 2, 3, 4];

fn context(table: &'static KernelTable, threads: usize) -> Context {
    Context::with_table(table).with_threads(threads)
}

/// Whether the table's elementwise entries give the NEON slice functions'
/// bits (the NEON table; the SVE table, whose entries are NEON's or the
/// same per lane; the SME table, NEON's with another GEMM): the tests below
/// allow those the NEON exceptions.
fn neon_math(table: &KernelTable) -> bool {
    matches!(table.isa(), k::Isa::Aarch64Neon | k::Isa::Aarch64Sve | k::Isa::Aarch64Sme)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `[N, C, H, W]` values in `[N, H, W, C]` order.
fn to_nhwc(v: &[f32], [n, c, h, w]: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for (i, &x) in v.iter().enumerate() {
        let (b, ch, y, xx) = (i / (c * h * w), (i / (h * w)) % c, (i / w) % h, i % w);
        out[((b * h + y) * w + xx) * c + ch] = x;
    }
    debug_assert_eq!(v.len(), n * c * h * w);
    out
}

/// Runs `f` at every thread count and checks the outputs are identical.
fn same_at_every_count(what: &str, table: &'static KernelTable, f: impl Fn(&mut Context) -> Vec<f32>) {
    let mut first: Option<Vec<u32>> = None;
    for t in THREADS {
        let mut cx = context(table, t);
        let out = bits(&f(&mut cx));
        // And a second run on the same context (reused buffers).
        assert_eq!(out, bits(&f(&mut cx)), "{what} on {}: rerun at {t} threads differs", table.isa());
        match &first {
            None => first = Some(out),
            Some(want) => assert!(*want == out, "{what} on {}: {t} threads differ from 1", table.isa()),
        }
    }
}

#[test]
fn gemm_is_bit_identical_at_every_thread_count() {
    let mut r = rng(1);
    for table in tables() {
        // Wide, skinny, tall-and-narrow (many row blocks, one column group), several column blocks.
        let shapes = [(300, 200, 300), (8, 2048, 512), (1, 1000, 77), (130, 1030, 600), (17, 7, 1000), (520, 40, 300)];
        for (m, n, k) in shapes {
            let a = rand_f32(&mut r, m * k);
            let b = rand_f32(&mut r, k * n);
            for tb in [false, true] {
                same_at_every_count(&format!("gemm {m}x{n}x{k} tb={tb}"), table, |cx| {
                    let mut c = vec![f32::NAN; m * n];
                    let ldb = if tb { k } else { n };
                    k::gemm_f32(m, n, k, &a, k, &b, ldb, &mut c, n, tb, 0.0, cx).unwrap();
                    c
                });
            }
        }
    }
}

#[test]
fn packed_b_matches_unpacked_bytes_and_packs_nothing() {
    let mut r = rng(2);
    for table in tables() {
        for (m, n, k) in [(1, 1, 1), (7, 17, 33), (16, 2048, 512), (100, 1030, 600), (5, 9, 0)] {
            let a = rand_f32(&mut r, m * k);
            let b = rand_f32(&mut r, k * n);
            for tb in [false, true] {
                let ldb = if tb { k } else { n };
                for t in [1, 3] {
                    let mut cx = context(table, t);
                    let mut want = vec![0f32; m * n];
                    k::gemm_f32(m, n, k, &a, k, &b, ldb, &mut want, n, tb, 0.0, &mut cx).unwrap();
                    let packed = PackedB::new(table, k, n, &b, ldb, tb).unwrap();
                    assert!(packed.fits(table));
                    let before = cx.b_packs();
                    let mut got = vec![f32::NAN; m * n];
                    k::gemm_f32_prepacked(m, &a, k, &packed, &mut got, n, 0.0, &mut cx).unwrap();
                    assert_eq!(cx.b_packs(), before, "a packed GEMM packed B");
                    let ctx = format!("{} {m}x{n}x{k} tb={tb} threads={t}", table.isa());
                    assert!(bits(&want) == bits(&got), "packed differs from unpacked: {ctx}");
                    if k > 0 && m * n > 0 {
                        assert!(cx.b_packs() > 0, "the unpacked GEMM should have packed B: {ctx}");
                    }
                }
            }
        }
    }
}

/// A GEMM on a packed weight gives the same bytes at every thread count as
/// the unpacked GEMM, and so does a `linear_split` of that weight: skinny
/// ones (M = 1…3) on a weight of over 1 MiB, which run over the pool however
/// few their multiply-adds, their columns cut into groups of strips (N not a
/// multiple of the strip nor of the groups); and ones with fewer row blocks
/// than threads (M not a multiple of the tile).
#[test]
fn packed_gemm_is_bit_identical_at_every_thread_count() {
    let mut r = rng(10);
    for table in tables() {
        for (m, n, kk) in [(1, 1000, 700), (1, 1001, 300), (3, 777, 520), (64, 200, 300), (45, 130, 520)] {
            let (x, w) = (rand_f32(&mut r, m * kk), rand_f32(&mut r, n * kk));
            let mut want = vec![0f32; m * n];
            k::gemm_f32(m, n, kk, &x, kk, &w, kk, &mut want, n, true, 0.0, &mut context(table, 1)).unwrap();
            let packed = PackedB::new(table, kk, n, &w, kk, true).unwrap();
            same_at_every_count(&format!("packed gemm {m}x{n}x{kk}"), table, |cx| {
                let mut c = vec![f32::NAN; m * n];
                k::gemm_f32_prepacked(m, &x, kk, &packed, &mut c, n, 0.0, cx).unwrap();
                assert!(bits(&c) == bits(&want), "packed gemm {m}x{n}x{kk} on {} differs from unpacked", table.isa());
                c
            });
            let widths = [n / 2 / 64 * 64, n - n / 2 / 64 * 64];
            let bias = rand_f32(&mut r, n);
            same_at_every_count(&format!("linear_split {m}x{widths:?}x{kk}"), table, |cx| {
                let mut bufs: Vec<Buf> = widths.iter().map(|&c| Buf::zeros(DType::F32, &[m, c])).collect();
                let mut outs: Vec<_> = bufs.iter_mut().map(|b| b.w()).collect();
                let (xs, ws, bs) = (f32s(&[m, kk], &x), f32s(&[n, kk], &w), f32s(&[n], &bias));
                k::linear_split(xs.r(), ws.r(), Some(&packed), Some(bs.r()), None, &mut outs, cx).unwrap();
                drop(outs);
                bufs.iter().flat_map(|b| b.get::<f32>()).collect()
            });
        }
    }
}

#[test]
fn packed_b_refuses_bad_operands_and_other_tables() {
    let table = k::best();
    assert!(PackedB::new(table, 4, 4, &[0.0; 15], 4, false).is_err());
    assert!(PackedB::new(table, 4, 4, &[0.0; 16], 3, false).is_err());
    let packed = PackedB::new(table, 4, 4, &[1.0; 16], 4, false).unwrap();
    let mut cx = Context::with_table(table);
    let mut c = [0f32; 8];
    // A too short, C too short.
    assert!(k::gemm_f32_prepacked(2, &[1.0; 7], 4, &packed, &mut c, 4, 0.0, &mut cx).is_err());
    assert!(k::gemm_f32_prepacked(3, &[1.0; 12], 4, &packed, &mut c, 4, 0.0, &mut cx).is_err());
    k::gemm_f32_prepacked(2, &[1.0; 8], 4, &packed, &mut c, 4, 0.0, &mut cx).unwrap();
    assert_eq!(c, [4.0; 8]);
    for other in tables() {
        if other.entries()[0].1 != table.entries()[0].1 {
            let mut cx = Context::with_table(other);
            let err = k::gemm_f32_prepacked(2, &[1.0; 8], 4, &packed, &mut c, 4, 0.0, &mut cx);
            assert!(err.is_err(), "a packing for another microkernel must be refused");
        }
    }
}

#[test]
fn fused_linear_equals_the_unfused_kernels() {
    let mut r = rng(3);
    let relu6 = Activation::Clamp { min: Some(0.0), max: Some(6.0) };
    let activations =
        [None, Some(Activation::Relu), Some(Activation::Silu), Some(Activation::Gelu), Some(Activation::GeluTanh)];
    let activations =
        activations.into_iter().chain([Some(Activation::Sigmoid), Some(relu6), Some(Activation::MulSigmoid)]);
    let activations = activations.chain([Some(Activation::Hardswish), Some(Activation::GeluTanhChain)]);
    for (act, residual_first) in activations.flat_map(|a| [(a, false), (a, true)]) {
        for table in tables() {
            for (m, n, kk) in [(1, 7, 5), (8, 300, 64), (37, 33, 270)] {
                let x = rand_f32(&mut r, m * kk);
                let w = rand_f32(&mut r, n * kk);
                let bias = rand_f32(&mut r, n);
                let residual = rand_f32(&mut r, m * n);
                let scale = 0.75f32;
                let mut cx = context(table, 2);
                // Unfused: linear (no bias), scale, bias, activation, residual.
                let xs = f32s(&[m, kk], &x);
                let ws = f32s(&[n, kk], &w);
                let mut y = Buf::zeros(DType::F32, &[m, n]);
                k::linear(xs.r(), ws.r(), None, y.w(), &mut cx).unwrap();
                let mut v = y.get::<f32>();
                v.iter_mut().for_each(|e| *e *= scale);
                let with_bias = f32s(&[m, n], &v);
                let mut out = Buf::zeros(DType::F32, &[m, n]);
                k::binary_cx(BinaryOp::Add, with_bias.r(), f32s(&[n], &bias).r(), out.w(), &mut cx).unwrap();
                let add_residual = |out: &mut Buf, cx: &mut Context| {
                    let before = f32s(&[m, n], &out.get::<f32>());
                    k::binary_cx(BinaryOp::Add, before.r(), f32s(&[m, n], &residual).r(), out.w(), cx).unwrap();
                };
                if residual_first {
                    add_residual(&mut out, &mut cx);
                }
                if let Some(a) = act {
                    activate(a, &mut out, &[m, n], &mut cx);
                }
                if !residual_first {
                    add_residual(&mut out, &mut cx);
                }
                let want = out.get::<f32>();

                let packed = PackedB::new(table, kk, n, &w, kk, true).unwrap();
                let epilogue = LinearEpilogue {
                    scale,
                    bias: Some(&bias),
                    activation: act,
                    residual: Some(&residual),
                    residual_first,
                };
                let mut fused = Buf::zeros(DType::F32, &[m, n]);
                k::linear_fused(xs.r(), &packed, &epilogue, fused.w(), &mut cx).unwrap();
                let got = fused.get::<f32>();
                // Packing during the call computes the same tiles.
                let mut unpacked = Buf::zeros(DType::F32, &[m, n]);
                k::linear_fused_unpacked(xs.r(), ws.r(), &epilogue, unpacked.w(), &mut cx).unwrap();
                assert!(bits(&unpacked.get::<f32>()) == bits(&got), "unpacked fused linear differs");
                // The same operations in the same order; the vector math of
                // an activation may take its scalar tail on different
                // elements, so those may differ by a few ulp.
                let ctx = format!("{act:?} (residual first: {residual_first}) on {} {m}x{n}x{kk}", table.isa());
                assert_close(&to64(&got), &to64(&want), 1e-6, 1e-6, &ctx);
                let exact_ops =
                    matches!(act, None | Some(Activation::Relu | Activation::Clamp { .. } | Activation::Hardswish))
                        || (act == Some(Activation::GeluTanhChain) && !neon_math(table));
                if exact_ops {
                    assert!(bits(&got) == bits(&want), "exact epilogue differs: {ctx}");
                }
            }
        }
    }
}

/// An activation the x86 microkernels apply in registers (GELU, SiLU,
/// sigmoid on full-width tiles; the edge tiles through the store step) gives
/// the unfused kernel's bits: the same vector body per lane. Outputs span
/// GELU's three regions (polynomial, erf's exp branch, erfc tail) and
/// sigmoid's saturation; a bias and a residual on either side, edge columns
/// and rows, both thread counts.
#[test]
fn activation_epilogue_in_registers_is_bit_exact() {
    let mut r = rng(17);
    let acts = [
        Activation::Gelu,
        Activation::Silu,
        Activation::Sigmoid,
        Activation::GeluTanh,
        Activation::MulSigmoid,
        Activation::Hardswish,
        Activation::GeluTanhChain,
    ];
    for table in tables() {
        for (act, residual_first) in acts.into_iter().flat_map(|a| [(a, false), (a, true)]) {
            for (m, n, kk) in [(16, 64, 40), (9, 96, 33), (3, 70, 17)] {
                let x: Vec<f32> = rand_f32(&mut r, m * kk).iter().map(|v| v * 2.0).collect();
                let w = rand_f32(&mut r, n * kk);
                let bias = rand_f32(&mut r, n);
                let residual = rand_f32(&mut r, m * n);
                for threads in [1, 2] {
                    let mut cx = context(table, threads);
                    let xs = f32s(&[m, kk], &x);
                    let mut y = Buf::zeros(DType::F32, &[m, n]);
                    k::linear(xs.r(), f32s(&[n, kk], &w).r(), Some(f32s(&[n], &bias).r()), y.w(), &mut cx).unwrap();
                    let mut out = y;
                    let add_residual = |out: &mut Buf, cx: &mut Context| {
                        let before = f32s(&[m, n], &out.get::<f32>());
                        k::binary_cx(BinaryOp::Add, before.r(), f32s(&[m, n], &residual).r(), out.w(), cx).unwrap();
                    };
                    if residual_first {
                        add_residual(&mut out, &mut cx);
                    }
                    let pre = out.get::<f32>();
                    activate(act, &mut out, &[m, n], &mut cx);
                    if !residual_first {
                        add_residual(&mut out, &mut cx);
                    }
                    let packed = PackedB::new(table, kk, n, &w, kk, true).unwrap();
                    let epilogue = LinearEpilogue {
                        bias: Some(&bias),
                        activation: Some(act),
                        residual: Some(&residual),
                        residual_first,
                        ..LinearEpilogue::default()
                    };
                    let mut fused = Buf::zeros(DType::F32, &[m, n]);
                    k::linear_fused(xs.r(), &packed, &epilogue, fused.w(), &mut cx).unwrap();
                    let (got, want) = (fused.get::<f32>(), out.get::<f32>());
                    let ctx = format!("{act:?} (residual first: {residual_first}) on {} {m}x{n}x{kk}", table.isa());
                    let takes = |lo: f32, hi: f32| pre.iter().any(|v| (lo..hi).contains(v));
                    assert!(takes(-8.0, -1.4) && takes(-0.5, 0.5) && takes(1.4, 8.0), "{ctx}: range too narrow");
                    // NEON's slice functions may finish a call's last
                    // elements in scalar code, on other elements than the
                    // fused path: close there, exact on every other table.
                    if neon_math(table) {
                        assert_close(&to64(&got), &to64(&want), 1e-6, 1e-6, &ctx);
                    } else {
                        assert!(bits(&got) == bits(&want), "{ctx}: fused differs from unfused");
                    }
                }
            }
        }
    }
}

#[test]
fn fused_linear_checks_its_operands() {
    let table = k::best();
    let packed = PackedB::new(table, 3, 2, &[1.0; 6], 3, true).unwrap();
    let mut cx = Context::with_table(table);
    let x = f32s(&[4, 3], &[1.0; 12]);
    let mut out = Buf::zeros(DType::F32, &[4, 2]);
    let bad_bias = LinearEpilogue { bias: Some(&[1.0; 3]), ..LinearEpilogue::default() };
    assert!(k::linear_fused(x.r(), &packed, &bad_bias, out.w(), &mut cx).is_err());
    let bad_res = LinearEpilogue { residual: Some(&[1.0; 7]), ..LinearEpilogue::default() };
    assert!(k::linear_fused(x.r(), &packed, &bad_res, out.w(), &mut cx).is_err());
    let mut wrong = Buf::zeros(DType::F32, &[4, 3]);
    assert!(k::linear_fused(x.r(), &packed, &LinearEpilogue::default(), wrong.w(), &mut cx).is_err());
    let ok = LinearEpilogue { activation: Some(Activation::Relu), scale: -1.0, ..LinearEpilogue::default() };
    k::linear_fused(x.r(), &packed, &ok, out.w(), &mut cx).unwrap();
    assert_eq!(out.get::<f32>(), vec![0.0; 8]);
    assert_eq!(Activation::from_unary(UnaryOp::Silu), Some(Activation::Silu));
    assert_eq!(Activation::from_unary(UnaryOp::Exp), None);
}

/// The unfused kernel of an epilogue activation, on `out` in place.
fn activate(a: Activation, out: &mut Buf, shape: &[usize], cx: &mut Context) {
    let before = f32s(shape, &out.get::<f32>());
    match (a, a.unary_op()) {
        (Activation::Clamp { min, max }, _) => k::clamp_cx(before.r(), min, max, out.w(), cx).unwrap(),
        // Core ATen's SiLU: sigmoid, then the product with its operand.
        (Activation::MulSigmoid, _) => {
            let mut sigmoid = Buf::zeros(DType::F32, shape);
            k::unary_cx(UnaryOp::Sigmoid, before.r(), sigmoid.w(), cx).unwrap();
            k::binary_cx(BinaryOp::Mul, before.r(), sigmoid.r(), out.w(), cx).unwrap();
        }
        // Hardswish as Core ATen decomposes it: add 3, clamp below 0, clamp
        // above 6, the product with the operand, divide by 6.
        (Activation::Hardswish, _) => {
            let scalar = |v: f32| f32s(&[1], &[v]);
            let mut shifted = Buf::zeros(DType::F32, shape);
            k::binary_cx(BinaryOp::Add, before.r(), scalar(3.0).r(), shifted.w(), cx).unwrap();
            let mut low = Buf::zeros(DType::F32, shape);
            k::clamp_cx(shifted.r(), Some(0.0), None, low.w(), cx).unwrap();
            let mut clipped = Buf::zeros(DType::F32, shape);
            k::clamp_cx(low.r(), None, Some(6.0), clipped.w(), cx).unwrap();
            let mut product = Buf::zeros(DType::F32, shape);
            k::binary_cx(BinaryOp::Mul, before.r(), clipped.r(), product.w(), cx).unwrap();
            k::binary_cx(BinaryOp::Div, product.r(), scalar(6.0).r(), out.w(), cx).unwrap();
        }
        // GPT-2's `gelu_new` as the importer writes it, op by op.
        (Activation::GeluTanhChain, _) => gelu_new_unfused(&before, out, shape, cx),
        (_, Some(op)) => k::unary_cx(op, before.r(), out.w(), cx).unwrap(),
        (_, None) => unreachable!("every other activation is a unary op"),
    }
}

/// `out = 0.5·x · (1 + tanh(√(2/π)·(x + 0.044715·((x·x)·x))))` through the
/// unfused mul, add and tanh kernels, operands in the graph's order.
fn gelu_new_unfused(x: &Buf, out: &mut Buf, shape: &[usize], cx: &mut Context) {
    use kiln_isa::epilogue::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
    let scalar = |v: f32| f32s(&[1], &[v]);
    let step = |op: BinaryOp, a: &Buf, b: &Buf, cx: &mut Context| {
        let mut y = Buf::zeros(DType::F32, shape);
        k::binary_cx(op, a.r(), b.r(), y.w(), cx).unwrap();
        y
    };
    let half = step(BinaryOp::Mul, x, &scalar(HALF), cx);
    let square = step(BinaryOp::Mul, x, x, cx);
    let cube = step(BinaryOp::Mul, &square, x, cx);
    let scaled = step(BinaryOp::Mul, &cube, &scalar(CUBIC), cx);
    let sum = step(BinaryOp::Add, x, &scaled, cx);
    let arg = step(BinaryOp::Mul, &sum, &scalar(SQRT_2_OVER_PI), cx);
    let mut t = Buf::zeros(DType::F32, shape);
    k::unary_cx(UnaryOp::Tanh, arg.r(), t.w(), cx).unwrap();
    let one_plus = step(BinaryOp::Add, &t, &scalar(ONE), cx);
    k::binary_cx(BinaryOp::Mul, half.r(), one_plus.r(), out.w(), cx).unwrap();
}

/// A fused convolution (dense im2col, pointwise, grouped and depthwise,
/// packed or not) equals the convolution followed by the unfused
/// activation and residual add — bit for bit for ReLU and clamp (exact
/// operations) — at every thread count.
#[test]
fn fused_conv_equals_the_unfused_kernels() {
    let mut r = rng(5);
    let relu6 = Activation::Clamp { min: Some(0.0), max: Some(6.0) };
    // (x shape, w shape, stride, padding, groups)
    type Case = (&'static [usize], &'static [usize], usize, usize, usize);
    let cases: [Case; 6] = [
        (&[2, 3, 17, 19], &[8, 3, 3, 3], 1, 1, 1),
        // Stride 2 with several K slices (K = 360): the implicit im2col's
        // strips cross output rows.
        (&[1, 40, 15, 15], &[16, 40, 3, 3], 2, 1, 1),
        (&[1, 16, 30, 30], &[24, 16, 1, 1], 1, 0, 1),
        (&[1, 8, 33, 33], &[8, 1, 3, 3], 2, 1, 8),
        (&[1, 8, 20, 20], &[16, 4, 3, 3], 1, 1, 2),
        (&[1, 32, 70, 70], &[32, 1, 3, 3], 1, 1, 32),
    ];
    for table in tables() {
        for (xs, ws, stride, pad, groups) in cases {
            let (x, w) = (rand_f32(&mut r, xs.iter().product()), rand_f32(&mut r, ws.iter().product()));
            let bias = rand_f32(&mut r, ws[0]);
            let (x, w, b) = (f32s(xs, &x), f32s(ws, &w), f32s(&[ws[0]], &bias));
            let (s2, p2, d2) = ([stride; 2], [pad; 2], [1; 2]);
            let p = k::ConvParams { stride: &s2, padding: &p2, dilation: &d2, groups };
            let oh = (xs[2] + 2 * pad - ws[2]) / stride + 1;
            let ow = (xs[3] + 2 * pad - ws[3]) / stride + 1;
            let os = [xs[0], ws[0], oh, ow];
            let residual = f32s(&os, &rand_f32(&mut r, os.iter().product()));
            let packed = k::PackedConv::new(table, w.r(), groups).unwrap();
            let acts =
                [None, Some(Activation::Relu), Some(relu6), Some(Activation::Silu), Some(Activation::MulSigmoid)];
            let acts = acts.into_iter().chain([Some(Activation::Hardswish), Some(Activation::GeluTanhChain)]);
            for act in acts {
                for (with_residual, residual_first) in [(false, false), (true, false), (true, true)] {
                    let mut cx = context(table, 2);
                    let mut want = Buf::zeros(DType::F32, &os);
                    k::conv(x.r(), w.r(), Some(b.r()), &p, want.w(), &mut cx).unwrap();
                    let add_residual = |out: &mut Buf, cx: &mut Context| {
                        let before = f32s(&os, &out.get::<f32>());
                        k::binary_cx(BinaryOp::Add, before.r(), residual.r(), out.w(), cx).unwrap();
                    };
                    if with_residual && residual_first {
                        add_residual(&mut want, &mut cx);
                    }
                    if let Some(a) = act {
                        activate(a, &mut want, &os, &mut cx);
                    }
                    if with_residual && !residual_first {
                        add_residual(&mut want, &mut cx);
                    }
                    let want = want.get::<f32>();
                    let epilogue = k::TensorEpilogue {
                        activation: act,
                        residual: with_residual.then(|| residual.r()),
                        residual_first,
                    };
                    let ctx =
                        format!("{act:?} residual {with_residual}/{residual_first} {xs:?}*{ws:?} {}", table.isa());
                    for packed in [None, Some(&packed)] {
                        let run = |cx: &mut Context| {
                            let mut got = Buf::zeros(DType::F32, &os);
                            k::conv_fused(x.r(), w.r(), packed, Some(b.r()), &epilogue, &p, got.w(), cx).unwrap();
                            got.get::<f32>()
                        };
                        same_at_every_count(&ctx, table, run);
                        let got = run(&mut cx);
                        assert_close(&to64(&got), &to64(&want), 1e-6, 1e-6, &ctx);
                        // The x86 slice functions pad their tails to a
                        // whole vector, so the decomposed SiLU is exact there.
                        let exact = match act {
                            Some(Activation::Silu) => false,
                            Some(Activation::MulSigmoid | Activation::GeluTanhChain) => !neon_math(table),
                            _ => true,
                        };
                        if exact {
                            assert!(bits(&got) == bits(&want), "exact epilogue differs: {ctx}");
                        }
                    }
                }
            }
        }
    }
}

/// The f32 clamp keeps torch's semantics: NaN passes through, -0.0 stays
/// -0.0 at a bound of 0, and bounds are applied low first.
#[test]
fn clamp_keeps_nan_and_signed_zero() {
    let x = [f32::NAN, -0.0, 0.0, -1.0, 7.0, 3.0, f32::INFINITY, f32::NEG_INFINITY];
    let mut out = Buf::zeros(DType::F32, &[8]);
    k::clamp(f32s(&[8], &x).r(), Some(0.0), Some(6.0), out.w()).unwrap();
    let got = out.get::<f32>();
    assert!(got[0].is_nan());
    assert_eq!(bits(&got[1..]), bits(&[-0.0, 0.0, 0.0, 6.0, 3.0, 6.0, 0.0]));
    // min > max: every value ends at max, as torch.clamp gives.
    k::clamp(f32s(&[8], &x).r(), Some(2.0), Some(1.0), out.w()).unwrap();
    assert_eq!(&out.get::<f32>()[1..], &[1.0; 7]);
}

#[test]
fn fused_conv_checks_its_residual() {
    let mut cx = Context::new();
    let (s, p0, d) = ([1usize], [0usize], [1usize]);
    let p = k::ConvParams { stride: &s, padding: &p0, dilation: &d, groups: 1 };
    let (x, w) = (f32s(&[1, 2, 5], &[1.0; 10]), f32s(&[3, 2, 1], &[1.0; 6]));
    let wrong = f32s(&[1, 3, 4], &[0.0; 12]);
    let e = k::TensorEpilogue { residual: Some(wrong.r()), ..k::TensorEpilogue::default() };
    let mut out = Buf::zeros(DType::F32, &[1, 3, 5]);
    assert!(k::conv_fused(x.r(), w.r(), None, None, &e, &p, out.w(), &mut cx).is_err());
    let right = f32s(&[1, 3, 5], &[0.5; 15]);
    let e = k::TensorEpilogue {
        residual: Some(right.r()),
        activation: Some(Activation::Clamp { min: None, max: Some(2.0) }),
        residual_first: true,
    };
    k::conv_fused(x.r(), w.r(), None, None, &e, &p, out.w(), &mut cx).unwrap();
    assert_eq!(out.get::<f32>(), vec![2.0; 15]);
}

#[test]
fn row_and_elementwise_kernels_are_bit_identical_at_every_thread_count() {
    let mut r = rng(4);
    let (rows, cols) = (300, 517);
    let x = rand_f32(&mut r, rows * cols);
    let y = rand_f32(&mut r, rows * cols);
    let row = rand_f32(&mut r, cols);
    let gamma = rand_f32(&mut r, cols);
    for table in tables() {
        for op in [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Silu, UnaryOp::Gelu] {
            same_at_every_count(&format!("unary {op:?}"), table, |cx| {
                let mut out = Buf::zeros(DType::F32, &[rows, cols]);
                k::unary_cx(op, f32s(&[rows, cols], &x).r(), out.w(), cx).unwrap();
                out.get()
            });
        }
        for (op, bshape, b) in [
            (BinaryOp::Add, vec![rows, cols], &y),
            (BinaryOp::Mul, vec![cols], &row),
            (BinaryOp::Pow, vec![1, rows, cols], &y),
        ] {
            same_at_every_count(&format!("binary {op:?}"), table, |cx| {
                let mut out = Buf::zeros(DType::F32, &[1, rows, cols]);
                let a = f32s(&[1, rows, cols], &x);
                k::binary_cx(op, a.r(), f32s(&bshape, b).r(), out.w(), cx).unwrap();
                out.get()
            });
        }
        // Clamp (ReLU6, one-sided), threaded; also equal to the plain kernel.
        for (min, max) in [(Some(0.0), Some(6.0)), (None, Some(0.5)), (Some(-0.25), None)] {
            let xs = f32s(&[rows, cols], &x);
            let mut plain = Buf::zeros(DType::F32, &[rows, cols]);
            k::clamp(xs.r(), min, max, plain.w()).unwrap();
            let plain = bits(&plain.get::<f32>());
            same_at_every_count(&format!("clamp {min:?} {max:?}"), table, |cx| {
                let mut out = Buf::zeros(DType::F32, &[rows, cols]);
                k::clamp_cx(xs.r(), min, max, out.w(), cx).unwrap();
                let got = out.get::<f32>();
                assert!(bits(&got) == plain, "threaded clamp differs from the plain kernel");
                got
            });
        }
        // Pooling, threaded over planes: max 3×3/2 with padding (ResNet's),
        // the plain 2×2 max, average with and without the padding counted,
        // and max pooling's indices; also equal to the plain kernel.
        // Outputs above two element chunks, so the threaded path runs.
        let img = f32s(&[2, 40, 45, 43], &x[..2 * 40 * 45 * 43]);
        let (k3, s2, p1, d1) = ([3usize, 3], [2usize, 2], [1usize, 1], [1usize, 1]);
        let (k2, p0) = ([2usize, 2], [0usize, 0]);
        for (kind, kernel, padding, include_pad, out_hw) in [
            (k::PoolKind::Max, &k3, &p1, false, [23, 22]),
            (k::PoolKind::Max, &k2, &p0, false, [22, 21]),
            (k::PoolKind::Avg, &k3, &p1, true, [23, 22]),
            (k::PoolKind::Avg, &k3, &p1, false, [23, 22]),
        ] {
            let params = k::PoolParams {
                kernel,
                stride: &s2,
                padding,
                dilation: &d1,
                count_include_pad: include_pad,
                divisor: None,
            };
            let os = [2, 40, out_hw[0], out_hw[1]];
            let mut plain = Buf::zeros(DType::F32, &os);
            k::pool(kind, img.r(), &params, plain.w()).unwrap();
            let plain = bits(&plain.get::<f32>());
            same_at_every_count(&format!("pool {kind:?} {kernel:?}"), table, |cx| {
                let mut out = Buf::zeros(DType::F32, &os);
                k::pool_cx(kind, img.r(), &params, out.w(), cx).unwrap();
                let got = out.get::<f32>();
                assert!(bits(&got) == plain, "threaded pool differs from the plain kernel");
                got
            });
            if kind == k::PoolKind::Max {
                // The plain 2-D fast path gives what the general loop (behind
                // the values-and-indices kernel) gives, NaNs and -inf included.
                let mut special = x[..2 * 40 * 45 * 43].to_vec();
                special.iter_mut().step_by(97).for_each(|v| *v = f32::NAN);
                special.iter_mut().skip(5).step_by(89).for_each(|v| *v = f32::NEG_INFINITY);
                let special = f32s(&[2, 40, 45, 43], &special);
                let (mut fast, mut values, mut indices) =
                    (Buf::zeros(DType::F32, &os), Buf::zeros(DType::F32, &os), Buf::zeros(DType::I64, &os));
                k::pool(kind, special.r(), &params, fast.w()).unwrap();
                k::max_pool_with_indices(special.r(), &params, values.w(), indices.w()).unwrap();
                assert!(bits(&fast.get::<f32>()) == bits(&values.get::<f32>()), "plain max pool differs");
            }
            // Channels-last: the channels-first result permuted, bit for
            // bit (NaNs, -inf and signed zeros in the windows), at every
            // thread count.
            let mut special = x[..2 * 40 * 45 * 43].to_vec();
            special.iter_mut().step_by(97).for_each(|v| *v = f32::NAN);
            special.iter_mut().skip(5).step_by(89).for_each(|v| *v = f32::NEG_INFINITY);
            special.iter_mut().skip(7).step_by(13).for_each(|v| *v = 0.0);
            special.iter_mut().skip(11).step_by(13).for_each(|v| *v = -0.0);
            let special_first = f32s(&[2, 40, 45, 43], &special);
            let mut want = Buf::zeros(DType::F32, &os);
            k::pool(kind, special_first.r(), &params, want.w()).unwrap();
            let want = bits(&to_nhwc(&want.get::<f32>(), os));
            let special_last = f32s(&[2, 45, 43, 40], &to_nhwc(&special, [2, 40, 45, 43]));
            let os_last = [2, out_hw[0], out_hw[1], 40];
            same_at_every_count(&format!("channels-last pool {kind:?} {kernel:?}"), table, |cx| {
                let mut out = Buf::zeros(DType::F32, &os_last);
                k::pool_channels_last_cx(kind, special_last.r(), &params, out.w(), cx).unwrap();
                let got = out.get::<f32>();
                assert!(bits(&got) == want, "channels-last pool differs from the channels-first one");
                got
            });
            let mut plain_idx = Buf::zeros(DType::I64, &os);
            k::pool(k::PoolKind::ArgMax, img.r(), &params, plain_idx.w()).unwrap();
            let mut idx = Buf::zeros(DType::I64, &os);
            k::pool_cx(k::PoolKind::ArgMax, img.r(), &params, idx.w(), &mut context(table, 3)).unwrap();
            assert!(idx.get::<i64>() == plain_idx.get::<i64>(), "threaded max pool indices differ");
        }
        same_at_every_count("softmax", table, |cx| {
            let mut out = Buf::zeros(DType::F32, &[rows, cols]);
            k::softmax_cx(f32s(&[rows, cols], &x).r(), 1, false, out.w(), cx).unwrap();
            out.get()
        });
        same_at_every_count("softmax axis 0", table, |cx| {
            let mut out = Buf::zeros(DType::F32, &[rows, cols]);
            k::softmax_cx(f32s(&[rows, cols], &x).r(), 0, true, out.w(), cx).unwrap();
            out.get()
        });
        same_at_every_count("layer_norm", table, |cx| {
            let mut out = Buf::zeros(DType::F32, &[rows, cols]);
            let g = f32s(&[cols], &gamma);
            k::layer_norm_cx(f32s(&[rows, cols], &x).r(), Some(g.r()), None, 1, 1e-5, out.w(), cx).unwrap();
            out.get()
        });
        // And the single-threaded entry point gives the same bits.
        let mut plain = Buf::zeros(DType::F32, &[rows, cols]);
        let g = f32s(&[cols], &gamma);
        k::rms_norm(f32s(&[rows, cols], &x).r(), Some(g.r()), 1, 1e-6, plain.w()).unwrap();
        same_at_every_count("rms_norm", table, |cx| {
            let mut out = Buf::zeros(DType::F32, &[rows, cols]);
            k::rms_norm_cx(f32s(&[rows, cols], &x).r(), Some(g.r()), 1, 1e-6, out.w(), cx).unwrap();
            assert!(bits(&out.get::<f32>()) == bits(&plain.get::<f32>()), "threaded rms_norm differs from rms_norm");
            out.get()
        });
    }
}

#[test]
fn batched_kernels_are_bit_identical_at_every_thread_count() {
    let mut r = rng(5);
    let (b, h, l, s, e) = (2, 4, 64, 97, 48);
    let q = rand_f32(&mut r, b * h * l * e);
    let kk = rand_f32(&mut r, b * h * s * e);
    let v = rand_f32(&mut r, b * h * s * e);
    let img = rand_f32(&mut r, 2 * 8 * 64 * 64);
    let wconv = rand_f32(&mut r, 16 * 8 * 9);
    let wdw = rand_f32(&mut r, 8 * 9);
    for table in tables() {
        same_at_every_count("attention", table, |cx| {
            let mut out = Buf::zeros(DType::F32, &[b, h, l, e]);
            let (qs, ks, vs) = (f32s(&[b, h, l, e], &q), f32s(&[b, h, s, e], &kk), f32s(&[b, h, s, e], &v));
            k::attention(qs.r(), ks.r(), vs.r(), None, true, None, out.w(), cx).unwrap();
            out.get()
        });
        same_at_every_count("batched matmul", table, |cx| {
            let mut out = Buf::zeros(DType::F32, &[b, h, l, s]);
            let (qs, ks) = (f32s(&[b, h, l, e], &q), f32s(&[b, h, e, s], &kk));
            k::matmul(qs.r(), ks.r(), out.w(), cx).unwrap();
            out.get()
        });
        for (w, cout, groups) in [(&wconv, 16, 1), (&wdw, 8, 8)] {
            let cin_g = 8 / groups;
            same_at_every_count(&format!("conv groups={groups}"), table, |cx| {
                let mut out = Buf::zeros(DType::F32, &[2, cout, 64, 64]);
                let params = k::ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups };
                let (x, ws) = (f32s(&[2, 8, 64, 64], &img), f32s(&[cout, cin_g, 3, 3], w));
                k::conv(x.r(), ws.r(), None, &params, out.w(), cx).unwrap();
                out.get()
            });
        }
    }
}

/// Grouped-query attention: K and V `[b, hkv, 1, s, e]` broadcast over the
/// R query heads of `q` `[b, hkv, R, l, e]` (the kernel runs each group's
/// R·l rows through one GEMM) gives the bytes of the attention over K and
/// V repeated per query head, with per-head float and shared bool masks,
/// causal or not, on every table and at every thread count.
#[test]
fn gqa_attention_equals_repeated_kv_at_every_thread_count() {
    let mut r = rng(8);
    // Large enough (12 entries · l · s · 2e ≥ PARALLEL_MIN_FLOPS) for the threaded path.
    let (b, hkv, rep, l, s, e) = (2, 2, 3, 61, 97, 48);
    let q = rand_f32(&mut r, b * hkv * rep * l * e);
    let kk = rand_f32(&mut r, b * hkv * s * e);
    let v = rand_f32(&mut r, b * hkv * s * e);
    let fmask = rand_f32(&mut r, b * hkv * rep * l * s);
    let bmask: Vec<u8> = (0..l * s).map(|i| u8::from(i % 5 != 0)).collect();
    // K and V copied once per query head: [b, hkv, rep, s, e].
    let repeat = |x: &[f32]| -> Vec<f32> { x.chunks(s * e).flat_map(|m| m.repeat(rep)).collect() };
    let (kr, vr) = (repeat(&kk), repeat(&v));
    for table in tables() {
        for (causal, float_mask) in [(false, true), (true, false), (true, true)] {
            let run = |cx: &mut Context, kv_heads: usize, kd: &[f32], vd: &[f32]| {
                let mut out = Buf::zeros(DType::F32, &[b, hkv, rep, l, e]);
                let qs = f32s(&[b, hkv, rep, l, e], &q);
                let (ks, vs) = (f32s(&[b, hkv, kv_heads, s, e], kd), f32s(&[b, hkv, kv_heads, s, e], vd));
                let mask = if float_mask {
                    f32s(&[b, hkv, rep, l, s], &fmask)
                } else {
                    Buf::from(DType::Bool, &[1, 1, l, s], &bmask)
                };
                k::attention(qs.r(), ks.r(), vs.r(), Some(mask.r()), causal, None, out.w(), cx).unwrap();
                out.get()
            };
            let what = format!("gqa attention causal={causal} float_mask={float_mask}");
            same_at_every_count(&what, table, |cx| {
                let shared = run(cx, 1, &kk, &v);
                assert!(bits(&shared) == bits(&run(cx, rep, &kr, &vr)), "{what} on {}: differs", table.isa());
                shared
            });
        }
    }
}

/// A long sequence's attention (L·S beyond the kernel's score block) runs
/// its query rows in blocks: the result is the bytes of the same attention
/// computed 100 query rows per call (each call within one block), with a
/// float mask, or causal (each piece then takes the causal rows as a bool
/// mask: the same -inf), over two heads, on every table and thread count.
#[test]
fn long_attention_in_row_blocks_equals_short_pieces() {
    let mut r = rng(9);
    let (h, l, s, e) = (2, 300, 1000, 16);
    let q = rand_f32(&mut r, h * l * e);
    let kk = rand_f32(&mut r, h * s * e);
    let v = rand_f32(&mut r, h * s * e);
    let fmask = rand_f32(&mut r, l * s);
    let piece = 100;
    for table in tables() {
        for causal in [false, true] {
            let what = format!("long attention causal={causal}");
            same_at_every_count(&what, table, |cx| {
                let (ks, vs) = (f32s(&[h, s, e], &kk), f32s(&[h, s, e], &v));
                let mut whole = Buf::zeros(DType::F32, &[h, l, e]);
                let mask = f32s(&[l, s], &fmask);
                let m = (!causal).then(|| mask.r());
                k::attention(f32s(&[h, l, e], &q).r(), ks.r(), vs.r(), m, causal, None, whole.w(), cx).unwrap();
                let whole = whole.get::<f32>();
                for first in (0..l).step_by(piece) {
                    let qp: Vec<f32> =
                        (0..h).flat_map(|t| q[(t * l + first) * e..(t * l + first + piece) * e].to_vec()).collect();
                    let mask = if causal {
                        let keep = (0..piece * s).map(|x| u8::from(x % s <= first + x / s)).collect::<Vec<u8>>();
                        Buf::from(DType::Bool, &[piece, s], &keep)
                    } else {
                        f32s(&[piece, s], &fmask[first * s..(first + piece) * s])
                    };
                    let mut out = Buf::zeros(DType::F32, &[h, piece, e]);
                    k::attention(
                        f32s(&[h, piece, e], &qp).r(),
                        ks.r(),
                        vs.r(),
                        Some(mask.r()),
                        false,
                        None,
                        out.w(),
                        cx,
                    )
                    .unwrap();
                    let out = out.get::<f32>();
                    for t in 0..h {
                        let want = &out[t * piece * e..(t + 1) * piece * e];
                        let got = &whole[(t * l + first) * e..(t * l + first + piece) * e];
                        assert!(
                            bits(got) == bits(want),
                            "{what} on {}: rows {first}.. of head {t} differ",
                            table.isa()
                        );
                    }
                }
                whole
            });
        }
    }
}

/// Long key sequences (S > 4096: the key-tiled path with its online
/// softmax): the same bytes at every thread count and on every table —
/// 1400 rows of a GQA group cut into ranges over the threads — causal, with
/// a float mask, or both. Causal blocks and the key tiles they skip are
/// fixed by the shape: with NaN values at keys 700..1024, which no query
/// attends but whose tile the blocks holding queries ≥ 512 compute (a zero
/// weight times NaN), exactly those rows are NaN at every thread count.
#[test]
fn key_tiled_attention_is_bit_identical_at_every_thread_count() {
    let mut r = rng(10);
    let (rep, l, s, e) = (2, 700, 4500, 16);
    let q = rand_f32(&mut r, rep * l * e);
    let kk = rand_f32(&mut r, s * e);
    let v = rand_f32(&mut r, s * e);
    let fmask = rand_f32(&mut r, l * s);
    let mut v_nan = v.clone();
    v_nan[700 * e..1024 * e].fill(f32::NAN);
    for table in tables() {
        for (causal, masked, nan) in [(true, false, true), (false, true, false), (true, true, false)] {
            let what = format!("key-tiled attention causal={causal} mask={masked} nan={nan}");
            let values: &[f32] = if nan { &v_nan } else { &v };
            same_at_every_count(&what, table, |cx| {
                let mut out = Buf::zeros(DType::F32, &[rep, l, e]);
                let (qs, ks, vs) = (f32s(&[rep, l, e], &q), f32s(&[1, s, e], &kk), f32s(&[1, s, e], values));
                let mask = f32s(&[l, s], &fmask);
                let m = masked.then(|| mask.r());
                k::attention(qs.r(), ks.r(), vs.r(), m, causal, None, out.w(), cx).unwrap();
                let out = out.get::<f32>();
                if nan {
                    for (row, o) in out.chunks_exact(e).enumerate() {
                        // Blocks of 64 rows from the group's start: rows
                        // 448..511 of head 0 (block 448..512) stay finite.
                        let i = row % l;
                        let block = row / 64 * 64..((row / 64 + 1) * 64).min(rep * l);
                        let block_sees_nan = block.into_iter().any(|b| b % l >= 512);
                        assert_eq!(o.iter().any(|x| x.is_nan()), block_sees_nan, "{what}: row {i} of head {}", row / l);
                    }
                }
                out
            });
        }
    }
}

#[test]
fn packed_conv_weights_match_unpacked_bytes() {
    let mut r = rng(6);
    for table in tables() {
        // (x, w, groups, stride, pad): plain, grouped, pointwise, deep K (> KC).
        for (xs, ws, groups, stride, pad) in [
            ([2, 8, 17, 19], [16, 8, 3, 3], 1, 1, 1),
            ([1, 8, 12, 12], [12, 2, 3, 3], 4, 2, 0),
            ([1, 32, 9, 9], [20, 32, 1, 1], 1, 1, 0),
            ([1, 64, 10, 10], [7, 64, 3, 3], 1, 1, 1),
        ] {
            let x = rand_f32(&mut r, xs.iter().product());
            let w = rand_f32(&mut r, ws.iter().product());
            let bias = rand_f32(&mut r, ws[0]);
            let oh = (xs[2] + 2 * pad - ws[2]) / stride + 1;
            let ow = (xs[3] + 2 * pad - ws[3]) / stride + 1;
            let os = [xs[0], ws[0], oh, ow];
            let params = k::ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[1, 1], groups };
            let (xb, wb, bb) = (f32s(&xs, &x), f32s(&ws, &w), f32s(&[ws[0]], &bias));
            for t in [1, 2] {
                let mut cx = context(table, t);
                let mut want = Buf::zeros(DType::F32, &os);
                k::conv(xb.r(), wb.r(), Some(bb.r()), &params, want.w(), &mut cx).unwrap();
                let packed = k::PackedConv::new(table, wb.r(), groups).unwrap();
                let mut got = Buf::zeros(DType::F32, &os);
                k::conv_packed(xb.r(), wb.r(), &packed, Some(bb.r()), &params, got.w(), &mut cx).unwrap();
                let ctx = format!("{} conv {xs:?} * {ws:?} groups={groups} threads={t}", table.isa());
                assert!(bits(&want.get::<f32>()) == bits(&got.get::<f32>()), "packed conv differs: {ctx}");
            }
            // A packing of another weight is refused.
            let other_shape = [ws[0], ws[1], ws[2], ws[3] + 1];
            let other_w = f32s(&other_shape, &rand_f32(&mut r, other_shape.iter().product()));
            let other = k::PackedConv::new(table, other_w.r(), groups).unwrap();
            let mut out = Buf::zeros(DType::F32, &os);
            let mut cx = context(table, 1);
            assert!(k::conv_packed(xb.r(), wb.r(), &other, None, &params, out.w(), &mut cx).is_err());
        }
    }
}

/// `linear_split` (linear layers over one input as one GEMM, an output per
/// layer) gives each output the bytes of that layer's own fused linear, at
/// every thread count, packed (aligned widths: one GEMM; a width that is
/// not a multiple of the strip: a linear per output) or not, on every table.
#[test]
fn linear_split_equals_each_layer_alone() {
    let mut r = rng(9);
    // Llama's q/k/v (512, 128, 128) shrunk; an unaligned last width; one
    // unaligned width before the last (the per-output path); rows of a
    // skinny GEMM, of several row blocks, and an edge tile.
    let cases: [(usize, usize, &[usize]); 4] =
        [(70, 96, &[64, 32, 32]), (5, 40, &[32, 64, 21]), (130, 600, &[96, 33, 64]), (1, 64, &[64, 64])];
    for table in tables() {
        for &(m, kk, widths) in &cases {
            let n: usize = widths.iter().sum();
            let (x, w, bias) = (rand_f32(&mut r, m * kk), rand_f32(&mut r, n * kk), rand_f32(&mut r, n));
            for activation in [None, Some(Activation::Gelu)] {
                let ctx = format!("{widths:?} m={m} k={kk} {activation:?} on {}", table.isa());
                // Each layer alone, through its own packed weight.
                let mut want = Vec::new();
                let mut start = 0;
                let mut cx = context(table, 1);
                for &cols in widths {
                    let packed = PackedB::new(table, kk, cols, &w[start * kk..], kk, true).unwrap();
                    let e = LinearEpilogue {
                        bias: Some(&bias[start..start + cols]),
                        activation,
                        ..LinearEpilogue::default()
                    };
                    let mut out = Buf::zeros(DType::F32, &[m, cols]);
                    k::linear_fused(f32s(&[m, kk], &x).r(), &packed, &e, out.w(), &mut cx).unwrap();
                    want.push(bits(&out.get::<f32>()));
                    start += cols;
                }
                let packed = PackedB::new(table, kk, n, &w, kk, true).unwrap();
                for packed in [Some(&packed), None] {
                    for t in THREADS {
                        let mut cx = context(table, t);
                        let mut bufs: Vec<Buf> = widths.iter().map(|&c| Buf::zeros(DType::F32, &[m, c])).collect();
                        let mut outs: Vec<_> = bufs.iter_mut().map(|b| b.w()).collect();
                        let (xs, ws, bs) = (f32s(&[m, kk], &x), f32s(&[n, kk], &w), f32s(&[n], &bias));
                        k::linear_split(xs.r(), ws.r(), packed, Some(bs.r()), activation, &mut outs, &mut cx).unwrap();
                        drop(outs);
                        for (i, b) in bufs.iter().enumerate() {
                            let got = bits(&b.get::<f32>());
                            assert!(
                                got == want[i],
                                "{ctx}: output {i} differs ({t} threads, packed {})",
                                packed.is_some()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn linear_split_checks_its_operands() {
    let table = k::best();
    let mut cx = Context::with_table(table);
    let (x, w) = (f32s(&[4, 3], &[1.0; 12]), f32s(&[5, 3], &[1.0; 15]));
    let split = |widths: &[usize], bias: Option<&Buf>, cx: &mut Context| {
        let mut bufs: Vec<Buf> = widths.iter().map(|&c| Buf::zeros(DType::F32, &[4, c])).collect();
        let mut outs: Vec<_> = bufs.iter_mut().map(|b| b.w()).collect();
        k::linear_split(x.r(), w.r(), None, bias.map(|b| b.r()), None, &mut outs, cx).map(|_| ())
    };
    // Widths that do not sum to the weight's N, a bias of the wrong length.
    assert!(split(&[2, 2], None, &mut cx).is_err());
    assert!(split(&[3, 3], None, &mut cx).is_err());
    assert!(split(&[2, 3], Some(&f32s(&[4], &[0.0; 4])), &mut cx).is_err());
    assert!(split(&[1; 9], None, &mut cx).is_err());
    split(&[2, 3], Some(&f32s(&[5], &[0.0; 5])), &mut cx).unwrap();
}
