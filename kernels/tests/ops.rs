#![allow(clippy::too_many_arguments, clippy::needless_range_loop, clippy::type_complexity)]
mod common;
use common::*;
use kiln_kernels::*;

fn ref_mm<T: Copy + Into<f64>>(a: &[T], b: &[T], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p].into() * b[p * n + j].into()).sum();
        }
    }
    c
}

#[test]
fn matmul_matches_reference() {
    let mut r = rng(10);
    let mut s = Context::new();
    for &(m, n, k) in &[(1, 1, 1), (7, 17, 33), (100, 7, 33), (65, 9, 300), (3, 1030, 5), (17, 1, 100)] {
        let (av, bv) = (rand_f32(&mut r, m * k), rand_f32(&mut r, k * n));
        let (a, b) = (f32s(&[m, k], &av), f32s(&[k, n], &bv));
        let mut o = Buf::zeros(DType::F32, &[m, n]);
        matmul(a.r(), b.r(), o.w(), &mut s).unwrap();
        // f32 accumulation error grows with K: scale the absolute tolerance.
        assert_close(
            &to64(&o.get::<f32>()),
            &ref_mm(&av, &bv, m, n, k),
            1e-5,
            1e-6 * k as f64,
            &format!("{m}x{n}x{k}"),
        );
    }
    // Batch broadcast [2,1,5,7] x [3,7,4] -> [2,3,5,4]; rank-1 operands.
    let (av, bv) = (rand_f32(&mut r, 2 * 5 * 7), rand_f32(&mut r, 3 * 7 * 4));
    let (a, b) = (f32s(&[2, 1, 5, 7], &av), f32s(&[3, 7, 4], &bv));
    let mut o = Buf::zeros(DType::F32, &[2, 3, 5, 4]);
    matmul(a.r(), b.r(), o.w(), &mut s).unwrap();
    let got = o.get::<f32>();
    for i in 0..2 {
        for j in 0..3 {
            let want = ref_mm(&av[i * 35..(i + 1) * 35], &bv[j * 28..(j + 1) * 28], 5, 4, 7);
            assert_close(&to64(&got[(i * 3 + j) * 20..(i * 3 + j + 1) * 20]), &want, 1e-5, 1e-5, "batched");
        }
    }
    let a = f32s(&[7], &av[..7]);
    let mut o = Buf::zeros(DType::F32, &[3, 4]);
    matmul(a.r(), b.r(), o.w(), &mut s).unwrap();
    assert_close(&to64(&o.get::<f32>()[..4]), &ref_mm(&av[..7], &bv[..28], 1, 4, 7), 1e-5, 1e-5, "vec-mat");
    let (a, b) = (f32s(&[2, 5, 7], &av), f32s(&[7], &bv[..7]));
    let mut o = Buf::zeros(DType::F32, &[2, 5]);
    matmul(a.r(), b.r(), o.w(), &mut s).unwrap();
    assert_close(&to64(&o.get::<f32>()), &ref_mm(&av, &bv[..7], 10, 1, 7), 1e-5, 1e-5, "mat-vec");
    // f64 and errors.
    let a64 = Buf::from(DType::F64, &[2, 3], &[1.0f64, 2., 3., 4., 5., 6.]);
    let mut o = Buf::zeros(DType::F64, &[2, 2]);
    let b64 = Buf::from(DType::F64, &[3, 2], &[1.0f64, 0., 0., 1., 1., 1.]);
    matmul(a64.r(), b64.r(), o.w(), &mut s).unwrap();
    assert_eq!(o.get::<f64>(), vec![4., 5., 10., 11.]);
    let mut bad = Buf::zeros(DType::F64, &[2, 3]);
    assert!(matmul(a64.r(), b64.r(), bad.w(), &mut s).is_err());
    assert!(matmul(a64.r(), a64.r(), o.w(), &mut s).is_err());
}

#[test]
fn linear_with_bias() {
    let mut r = rng(11);
    let mut s = Context::new();
    let (m, n, k) = (33, 17, 100);
    let (xv, wv, bv) = (rand_f32(&mut r, m * k), rand_f32(&mut r, n * k), rand_f32(&mut r, n));
    let (x, w, b) = (f32s(&[3, 11, k], &xv), f32s(&[n, k], &wv), f32s(&[n], &bv));
    let mut o = Buf::zeros(DType::F32, &[3, 11, n]);
    linear(x.r(), w.r(), Some(b.r()), o.w(), &mut s).unwrap();
    let mut wt = vec![0f32; k * n];
    for i in 0..n {
        for p in 0..k {
            wt[p * n + i] = wv[i * k + p];
        }
    }
    let mut want = ref_mm(&xv, &wt, m, n, k);
    want.iter_mut().enumerate().for_each(|(i, v)| *v += bv[i % n] as f64);
    assert_close(&to64(&o.get::<f32>()), &want, 1e-5, 1e-5, "linear");
}

/// Every table this CPU runs (the implicit-im2col packing is shared, the
/// microkernels' strip widths differ: 8, 16, 32), on odd shapes: strips that
/// cross output rows, several K slices (K > 256), more columns than one
/// column block (N > 1024), 1×1 stride 2, width-1 outputs, padding wider
/// than the dilated kernel's reach into the input.
#[test]
fn conv_matches_reference() {
    for table in tables() {
        conv_matches_reference_on(&mut Context::with_table(table));
    }
}

fn conv_matches_reference_on(s: &mut Context) {
    let mut r = rng(12);
    // (x shape, w shape, stride, pad, dil, groups)
    let cases: &[(&[usize], &[usize], &[usize], &[usize], &[usize], usize)] = &[
        (&[1, 40, 15, 13], &[9, 40, 3, 3], &[2, 2], &[1, 1], &[1, 1], 1),
        (&[1, 3, 41, 39], &[5, 3, 3, 3], &[1, 1], &[1, 1], &[1, 1], 1),
        (&[2, 6, 11, 9], &[7, 6, 1, 1], &[2, 2], &[0, 0], &[1, 1], 1),
        (&[1, 4, 9, 1], &[3, 4, 3, 1], &[1, 1], &[2, 0], &[1, 1], 1),
        (&[1, 2, 6, 7], &[3, 2, 3, 3], &[1, 3], &[3, 4], &[2, 1], 1),
        (&[2, 3, 17, 13], &[5, 3, 3, 3], &[1, 1], &[1, 1], &[1, 1], 1),
        (&[1, 4, 16, 16], &[6, 2, 3, 2], &[2, 1], &[1, 0], &[2, 1], 2),
        (&[1, 6, 9, 9], &[6, 1, 3, 3], &[1, 1], &[1, 1], &[1, 1], 6),
        (&[2, 8, 7, 5], &[4, 8, 1, 1], &[1, 1], &[0, 0], &[1, 1], 1),
        (&[1, 3, 33], &[4, 3, 5], &[3], &[2], &[1], 1),
        (&[1, 2, 5, 6, 7], &[3, 2, 3, 3, 3], &[1, 2, 1], &[1, 1, 0], &[1, 1, 2], 1),
        (&[1, 1, 200, 200], &[2, 1, 5, 5], &[1, 1], &[2, 2], &[1, 1], 1),
        // A kernel wider than the im2col packer's tap-column table (17 > 16).
        (&[1, 2, 5, 40], &[3, 2, 2, 17], &[1, 2], &[1, 8], &[1, 1], 1),
    ];
    for (xs, ws, st, pd, dl, g) in cases {
        let sd = xs.len() - 2;
        let mut os = vec![xs[0], ws[0]];
        for i in 0..sd {
            os.push((xs[2 + i] + 2 * pd[i] - dl[i] * (ws[2 + i] - 1) - 1) / st[i] + 1);
        }
        let (xv, wv, bv) = (rand_f32(&mut r, numel(xs)), rand_f32(&mut r, numel(ws)), rand_f32(&mut r, ws[0]));
        let (x, w, b) = (f32s(xs, &xv), f32s(ws, &wv), f32s(&[ws[0]], &bv));
        let mut o = Buf::zeros(DType::F32, &os);
        let p = ConvParams { stride: st, padding: pd, dilation: dl, groups: *g };
        conv(x.r(), w.r(), Some(b.r()), &p, o.w(), s).unwrap();
        let want = ref_conv(&xv, xs, &wv, ws, &bv, st, pd, dl, *g, &os);
        assert_close(&to64(&o.get::<f32>()), &want, 1e-5, 1e-5, &format!("conv {xs:?} {ws:?}"));
        // Bad groups and bad output shape are errors.
        let bad = ConvParams { groups: 7, ..p };
        assert!(conv(x.r(), w.r(), None, &bad, o.w(), s).is_err());
        let mut os2 = os.clone();
        *os2.last_mut().unwrap() += 1;
        let mut o2 = Buf::zeros(DType::F32, &os2);
        assert!(conv(x.r(), w.r(), None, &p, o2.w(), s).is_err());
    }
}

/// Inference batch norm over axis 1 of `xs`, in f64.
fn ref_batch_norm<T: Copy + Into<f64>>(
    x: &[T],
    xs: &[usize],
    m: &[T],
    v: &[T],
    w: &[T],
    b: &[T],
    eps: f64,
) -> Vec<f64> {
    let (c, inner) = (xs[1], numel(&xs[2..]));
    (0..x.len())
        .map(|i| {
            let ch = (i / inner) % c;
            (x[i].into() - m[ch].into()) / (v[ch].into() + eps).sqrt() * w[ch].into() + b[ch].into()
        })
        .collect()
}

/// Layer norm over rows of `w.len()` elements (biased variance), in f64.
fn ref_layer_norm<T: Copy + Into<f64>>(x: &[T], w: &[T], b: &[T], eps: f64) -> Vec<f64> {
    let d = w.len();
    let mut want = vec![0.0; x.len()];
    for (row, wr) in x.chunks(d).zip(want.chunks_mut(d)) {
        let mean = row.iter().map(|&v| v.into()).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v.into() - mean).powi(2)).sum::<f64>() / d as f64;
        for i in 0..d {
            wr[i] = (row[i].into() - mean) / (var + eps).sqrt() * w[i].into() + b[i].into();
        }
    }
    want
}

#[test]
fn norms_and_softmax() {
    let mut r = rng(13);
    let xs = [2usize, 3, 7, 5];
    let xv = rand_f32(&mut r, numel(&xs));
    let x = f32s(&xs, &xv);
    let (m, v, w, b) = (
        rand_f32(&mut r, 3),
        rand_f32(&mut r, 3).iter().map(|v| v.abs()).collect::<Vec<_>>(),
        rand_f32(&mut r, 3),
        rand_f32(&mut r, 3),
    );
    let mut o = Buf::zeros(DType::F32, &xs);
    batch_norm(x.r(), f32s(&[3], &m).r(), f32s(&[3], &v).r(), f32s(&[3], &w).r(), f32s(&[3], &b).r(), 1e-5, o.w())
        .unwrap();
    assert_close(&to64(&o.get::<f32>()), &ref_batch_norm(&xv, &xs, &m, &v, &w, &b, 1e-5), 1e-5, 1e-5, "batch_norm");

    let (lw, lb) = (rand_f32(&mut r, 35), rand_f32(&mut r, 35));
    layer_norm(x.r(), Some(f32s(&[7, 5], &lw).r()), Some(f32s(&[7, 5], &lb).r()), 2, 1e-5, o.w()).unwrap();
    assert_close(&to64(&o.get::<f32>()), &ref_layer_norm(&xv, &lw, &lb, 1e-5), 1e-5, 1e-5, "layer_norm");

    for axis in 0..4 {
        for log in [false, true] {
            softmax(x.r(), axis, log, o.w()).unwrap();
            let inner: usize = xs[axis + 1..].iter().product();
            let n = xs[axis];
            let want: Vec<f64> = (0..xv.len())
                .map(|i| {
                    let (outer, j) = (i / (n * inner), i % inner);
                    let row: Vec<f64> = (0..n).map(|t| xv[outer * n * inner + t * inner + j] as f64).collect();
                    let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
                    let y = xv[i] as f64 - lse;
                    if log {
                        y
                    } else {
                        y.exp()
                    }
                })
                .collect();
            assert_close(&to64(&o.get::<f32>()), &want, 1e-5, 1e-6, &format!("softmax {axis} {log}"));
        }
    }
    assert!(softmax(x.r(), 4, false, o.w()).is_err());
}

/// A permute over threads moves the same bytes: channels-first ↔
/// channels-last (the tiled transpose for narrow rows, with and without a
/// batch; slabs otherwise), against the index definition, at 1 to 4 threads.
#[test]
fn permute_over_threads_is_the_index_definition() {
    let mut r = rng(16);
    let cases: &[(&[usize], &[usize])] = &[
        (&[1, 3, 150, 151], &[0, 2, 3, 1]), // RGB image to channels-last (tiled)
        (&[2, 3, 90, 97], &[0, 2, 3, 1]),   // the same with a batch
        (&[1, 5, 70, 71], &[0, 2, 3, 1]),   // narrow, not 3 (tiled, any width)
        (&[1, 32, 41, 43], &[0, 2, 3, 1]),  // wide rows: slabs
        (&[1, 40, 37, 64], &[0, 3, 1, 2]),  // channels-last to first
        (&[3, 70, 1, 300], &[1, 3, 2, 0]),
    ];
    for &(xs, perm) in cases {
        let xv = rand_f32(&mut r, numel(xs));
        let x = f32s(xs, &xv);
        let os: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
        let want: Vec<u32> = (0..numel(&os))
            .map(|i| {
                let oi = unravel(i, &os);
                let src = (0..xs.len()).fold(0, |a, d| a * xs[d] + oi[perm.iter().position(|&p| p == d).unwrap()]);
                xv[src].to_bits()
            })
            .collect();
        for threads in 1..=4 {
            let mut cx = Context::new().with_threads(threads);
            let mut o = Buf::zeros(DType::F32, &os);
            permute_cx(x.r(), perm, o.w(), &mut cx).unwrap();
            let got: Vec<u32> = o.get::<f32>().iter().map(|v| v.to_bits()).collect();
            assert!(got == want, "permute {xs:?} by {perm:?} at {threads} threads");
        }
    }
}

/// How `reduce` cuts the pixels of a channels-last image (`[.., pixels, c]`
/// summed over the pixels) into parts: about 16384 elements a part (the
/// kernels' fixed element chunk), at most 64 parts. The cut depends on the
/// shape alone.
fn channels_last_part(c: usize, pixels: usize) -> usize {
    (16384 / c).max(pixels.div_ceil(64)).max(1)
}

/// +2^60 at the last pixel of the first part (of `per` pixels) and -2^60
/// at the first of the second, else `v`: an ordered sum keeps the second
/// part's small terms (the huge ones cancel first), a sum by parts loses
/// them in the second part's huge partial sum, so the grouping of the adds
/// shows in the result's f32 bits.
fn huge_at(pixel: usize, per: usize, v: f32) -> f32 {
    match pixel.checked_sub(per) {
        None if pixel + 1 == per => 2f32.powi(60),
        Some(0) => -(2f32.powi(60)),
        _ => v,
    }
}

/// f32 sums and means are f64 sums in the row-major order of the reduced
/// indices, whatever the layout and thread count — except channels-last
/// sums over the pixels, which add each part's ordered f64 sum (see
/// [`channels_last_part`]) in part order: the row and column fast paths (a
/// channels-first global mean, a column reduction with partial blocks), the
/// channels-last path (few channels and many pixels, many channels and few,
/// the 64-part cap, a batch) and the general loop against that definition,
/// bit for bit, on every kernel table. The channels-last inputs span many
/// huge values of both signs (see [`huge_at`]) so that the order of the adds
/// shows in the bits (checked: the plain ordered sum differs somewhere).
#[test]
fn float_sums_are_ordered_f64_sums_at_any_thread_count() {
    let mut r = rng(15);
    // (x shape, axes, channels-last: pixels per part)
    let cases: &[(&[usize], &[usize], Option<usize>)] = &[
        (&[2, 7, 7, 1300], &[1, 2], Some(channels_last_part(1300, 49))), // many channels, a batch
        (&[1, 112, 112, 32], &[1, 2], Some(channels_last_part(32, 112 * 112))), // few channels
        (&[1, 200, 200, 64], &[1, 2], Some(channels_last_part(64, 40000))), // the part cap
        (&[1, 9, 5, 3], &[1, 2], Some(channels_last_part(3, 45))),       // one part
        (&[2, 131, 7, 9], &[2, 3], None),                                // channels-first mean over H, W
        (&[1, 64, 33, 17], &[1, 3], None),                               // neither
        (&[3, 5, 2400], &[0], None),                                     // columns, a kept outer dim
        (&[3, 5, 2400], &[0, 1], None),
    ];
    for &(xs, axes, part) in cases {
        let mut xv = rand_f32(&mut r, numel(xs));
        if let Some(per) = part {
            let (c, pixels) = (xs[xs.len() - 1], xs[1] * xs[2]);
            for (i, v) in xv.iter_mut().enumerate() {
                *v = huge_at((i / c) % pixels, per, *v);
            }
        }
        let x = f32s(xs, &xv);
        let os: Vec<usize> = (0..xs.len()).filter(|i| !axes.contains(i)).map(|i| xs[i]).collect();
        // Every output's terms in the row-major order of the reduced indices.
        let mut terms = vec![Vec::new(); numel(&os)];
        for (i, &v) in xv.iter().enumerate() {
            let idx = unravel(i, xs);
            let kept: Vec<usize> = (0..xs.len()).filter(|d| !axes.contains(d)).map(|d| idx[d]).collect();
            let o = kept.iter().zip(&os).fold(0, |a, (&k, &n)| a * n + k);
            terms[o].push(v as f64);
        }
        let ordered = |t: &[f64]| t.iter().fold(0.0, |a, &v| a + v);
        let sums: Vec<f64> = match part {
            None => terms.iter().map(|t| ordered(t)).collect(),
            Some(per) => terms.iter().map(|t| t.chunks(per).map(ordered).reduce(|a, b| a + b).unwrap()).collect(),
        };
        if part.is_some_and(|per| per < terms[0].len()) {
            let plain = terms.iter().map(|t| ordered(t) as f32);
            assert!(plain.zip(&sums).any(|(p, &s)| p != s as f32), "{xs:?}: the order of the adds never shows");
        }
        let count: usize = axes.iter().map(|&a| xs[a]).product();
        for kind in [ReduceKind::Sum, ReduceKind::Mean] {
            let want: Vec<u32> = sums
                .iter()
                .map(|&s| (if kind == ReduceKind::Mean { s / count as f64 } else { s }) as f32)
                .map(f32::to_bits)
                .collect();
            for table in tables() {
                for threads in 1..=4 {
                    let mut cx = Context::with_table(table).with_threads(threads);
                    let mut o = Buf::zeros(DType::F32, &os);
                    reduce_cx(kind, x.r(), axes, o.w(), &mut cx).unwrap();
                    let got: Vec<u32> = o.get::<f32>().iter().map(|v| v.to_bits()).collect();
                    assert!(got == want, "{kind:?} of {xs:?} over {axes:?} on {} at {threads} threads", table.isa());
                }
            }
        }
    }
}

#[test]
fn reductions() {
    let mut r = rng(14);
    let xs = [3usize, 4, 5, 6];
    let xv = rand_f32(&mut r, numel(&xs));
    let x = f32s(&xs, &xv);
    let axes_cases: &[&[usize]] = &[&[3], &[0], &[1, 2], &[0, 2], &[0, 1, 2, 3], &[], &[1, 3]];
    for axes in axes_cases {
        let os: Vec<usize> = (0..4).map(|i| if axes.contains(&i) { 1 } else { xs[i] }).collect();
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod] {
            let mut o = Buf::zeros(DType::F32, &os);
            reduce(kind, x.r(), axes, o.w()).unwrap();
            let mut want = vec![Vec::new(); numel(&os)];
            for (i, &v) in xv.iter().enumerate() {
                let idx = unravel(i, &xs);
                want[bcast_index(&idx, &os)].push(v as f64);
            }
            let want: Vec<f64> = want
                .iter()
                .map(|g| match kind {
                    ReduceKind::Sum => g.iter().sum(),
                    ReduceKind::Mean => g.iter().sum::<f64>() / g.len() as f64,
                    ReduceKind::Max => g.iter().cloned().fold(f64::MIN, f64::max),
                    ReduceKind::Min => g.iter().cloned().fold(f64::MAX, f64::min),
                    ReduceKind::Prod => g.iter().product(),
                })
                .collect();
            assert_close(&to64(&o.get::<f32>()), &want, 1e-5, 1e-6, &format!("{kind:?} {axes:?}"));
        }
    }
    let xi = Buf::from(DType::I64, &[2, 3], &[1i64, -5, 3, 4, 5, 6]);
    let mut o = Buf::zeros(DType::I64, &[2]);
    reduce(ReduceKind::Sum, xi.r(), &[1], o.w()).unwrap();
    assert_eq!(o.get::<i64>(), vec![-1, 15]);
    reduce(ReduceKind::Min, xi.r(), &[1], o.w()).unwrap();
    assert_eq!(o.get::<i64>(), vec![-5, 4]);
    assert!(reduce(ReduceKind::Mean, xi.r(), &[1], o.w()).is_err());
    let xb = Buf::from(DType::Bool, &[2, 2], &[1u8, 0, 1, 1]);
    let mut ob = Buf::zeros(DType::Bool, &[2]);
    reduce(ReduceKind::Min, xb.r(), &[1], ob.w()).unwrap();
    assert_eq!(ob.get::<u8>(), vec![0, 1]);
    reduce(ReduceKind::Max, xb.r(), &[1], ob.w()).unwrap();
    assert_eq!(ob.get::<u8>(), vec![1, 1]);
    // Empty reductions.
    let e = f32s(&[2, 0], &[]);
    let mut o = Buf::zeros(DType::F32, &[2]);
    reduce(ReduceKind::Sum, e.r(), &[1], o.w()).unwrap();
    assert_eq!(o.get::<f32>(), vec![0.0, 0.0]);
    reduce(ReduceKind::Prod, e.r(), &[1], o.w()).unwrap();
    assert_eq!(o.get::<f32>(), vec![1.0, 1.0]);
    reduce(ReduceKind::Mean, e.r(), &[1], o.w()).unwrap();
    assert!(o.get::<f32>()[0].is_nan());
    assert!(reduce(ReduceKind::Max, e.r(), &[1], o.w()).is_err());
    assert!(reduce(ReduceKind::Sum, x.r(), &[2, 1], o.w()).is_err());
    assert!(reduce(ReduceKind::Sum, x.r(), &[4], o.w()).is_err());

    let a = f32s(&[2, 4], &[1.0, 3.0, 3.0, 2.0, 1.0, f32::NAN, 5.0, f32::NAN]);
    let mut o = Buf::zeros(DType::I64, &[2]);
    argmax(a.r(), 1, o.w()).unwrap();
    assert_eq!(o.get::<i64>(), vec![1, 1]);
    let mut o = Buf::zeros(DType::I64, &[4]);
    argmax(a.r(), 0, o.w()).unwrap();
    assert_eq!(o.get::<i64>(), vec![0, 1, 1, 1]);
}

#[test]
fn pooling() {
    let x = f32s(&[1, 1, 4, 5], &(0..20).map(|v| v as f32).collect::<Vec<_>>());
    // 3x3 max pool, stride 2, pad 1 -> [2, 3]
    let p = PoolParams {
        kernel: &[3, 3],
        stride: &[2, 2],
        padding: &[1, 1],
        dilation: &[1, 1],
        count_include_pad: true,
        divisor: None,
    };
    let mut o = Buf::zeros(DType::F32, &[1, 1, 2, 3]);
    pool(PoolKind::Max, x.r(), &p, o.w()).unwrap();
    assert_eq!(o.get::<f32>(), vec![6., 8., 9., 16., 18., 19.]);
    pool(PoolKind::Avg, x.r(), &p, o.w()).unwrap();
    // torch.nn.functional.avg_pool2d(x, 3, 2, 1, count_include_pad=True)
    assert_close(
        &to64(&o.get::<f32>()),
        &[12. / 9., 27. / 9., 24. / 9., 63. / 9., 108. / 9., 81. / 9.],
        1e-6,
        0.0,
        "avg incl",
    );
    let p2 = PoolParams { count_include_pad: false, ..p };
    pool(PoolKind::Avg, x.r(), &p2, o.w()).unwrap();
    assert_close(&to64(&o.get::<f32>()), &[3., 4.5, 6., 10.5, 12., 13.5], 1e-6, 0.0, "avg excl");
    // ceil_mode: 1-d, len 5, kernel 2 stride 2 -> 3 outputs; last window half past the end.
    let x1 = f32s(&[1, 5], &[1., 2., 3., 4., 5.]);
    let p1 = PoolParams {
        kernel: &[2],
        stride: &[2],
        padding: &[0],
        dilation: &[1],
        count_include_pad: true,
        divisor: None,
    };
    let mut o1 = Buf::zeros(DType::F32, &[1, 3]);
    pool(PoolKind::Avg, x1.r(), &p1, o1.w()).unwrap();
    assert_eq!(o1.get::<f32>(), vec![1.5, 3.5, 5.0]);
    pool(PoolKind::Max, x1.r(), &p1, o1.w()).unwrap();
    assert_eq!(o1.get::<f32>(), vec![2., 4., 5.]);
    let mut bad = Buf::zeros(DType::F32, &[1, 4]);
    assert!(pool(PoolKind::Max, x1.r(), &p1, bad.w()).is_err());
    // Dilated max pool.
    let pd = PoolParams {
        kernel: &[2],
        stride: &[1],
        padding: &[0],
        dilation: &[2],
        count_include_pad: true,
        divisor: None,
    };
    pool(PoolKind::Max, x1.r(), &pd, o1.w()).unwrap();
    assert_eq!(o1.get::<f32>(), vec![3., 4., 5.]);
    // Plain 2-D max pools (no padding/dilation/overhang) take a fast path.
    let pk2 = PoolParams {
        kernel: &[2, 2],
        stride: &[2, 2],
        padding: &[0, 0],
        dilation: &[1, 1],
        count_include_pad: true,
        divisor: None,
    };
    let mut o22 = Buf::zeros(DType::F32, &[1, 1, 2, 2]);
    pool(PoolKind::Max, x.r(), &pk2, o22.w()).unwrap();
    assert_eq!(o22.get::<f32>(), vec![6., 8., 16., 18.]);
    let pk3 = PoolParams { kernel: &[3, 3], stride: &[1, 1], ..pk2 };
    let mut o23 = Buf::zeros(DType::F32, &[1, 1, 2, 3]);
    pool(PoolKind::Max, x.r(), &pk3, o23.w()).unwrap();
    assert_eq!(o23.get::<f32>(), vec![12., 13., 14., 17., 18., 19.]);
    let mut with_nan: Vec<f32> = (0..20).map(|v| v as f32).collect();
    with_nan[0] = f32::NAN;
    let xn = f32s(&[1, 1, 4, 5], &with_nan);
    pool(PoolKind::Max, xn.r(), &pk2, o22.w()).unwrap();
    let got = o22.get::<f32>();
    assert!(got[0].is_nan() && got[1..] == [8., 16., 18.], "{got:?}");
    // Adaptive: 5 -> 3 uses [0,2), [1,4), [3,5).
    let xa = f32s(&[2, 5], &[1., 2., 3., 4., 5., 0., 0., 0., 0., 10.]);
    let mut oa = Buf::zeros(DType::F32, &[2, 3]);
    adaptive_avg_pool(xa.r(), oa.w()).unwrap();
    assert_close(&to64(&oa.get::<f32>()), &[1.5, 3.0, 4.5, 0.0, 0.0, 5.0], 1e-6, 0.0, "adaptive");
    let mut og = Buf::zeros(DType::F32, &[1, 1, 1, 1]);
    adaptive_avg_pool(x.r(), og.w()).unwrap();
    assert_eq!(og.get::<f32>(), vec![9.5]);
}

/// Max pooling's indices and avg pooling with a divisor; expected numbers from
/// torch 2.x (`F.max_pool*d(.., return_indices=True)`, `divisor_override`).
#[test]
fn pooling_indices_and_divisor() {
    let params = |kernel, stride, padding, dilation| PoolParams {
        kernel,
        stride,
        padding,
        dilation,
        count_include_pad: true,
        divisor: None,
    };
    let indices = |x: &Buf, p: &PoolParams, out: &[usize]| {
        let mut o = Buf::zeros(DType::I64, out);
        pool(PoolKind::ArgMax, x.r(), p, o.w()).unwrap();
        o.get::<i64>()
    };
    // First maximum in window order; every NaN replaces it, so the last NaN wins.
    let nan = f32::NAN;
    let x1 = f32s(&[1, 1, 8], &[1., 3., 3., 2., nan, 5., nan, 1.]);
    assert_eq!(indices(&x1, &params(&[3], &[1], &[0], &[1]), &[1, 1, 6]), vec![1, 1, 4, 4, 6, 6]);
    assert_eq!(indices(&x1, &params(&[8], &[1], &[0], &[1]), &[1, 1, 1]), vec![6]);
    // All -inf: the window's first in-bounds element (padding never counts).
    let xi = f32s(&[1, 1, 4], &[f32::NEG_INFINITY; 4]);
    assert_eq!(indices(&xi, &params(&[3], &[1], &[1], &[1]), &[1, 1, 4]), vec![0, 0, 1, 2]);
    // 2-d: flat index h*W + w; the no-padding window must not skip the index.
    let x2 = f32s(&[1, 1, 3, 3], &[1., 2., 2., 2., nan, nan, 0., 0., 0.]);
    assert_eq!(indices(&x2, &params(&[2, 2], &[1, 1], &[0, 0], &[1, 1]), &[1, 1, 2, 2]), vec![4, 5, 4, 5]);
    // 3-d, f64, with padding, dilation, ceil_mode and ties: (d*H + h)*W + w.
    let v3: Vec<f64> = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7]
        .iter()
        .map(|&v| v as f64)
        .collect();
    let x3 = Buf::from(DType::F64, &[1, 1, 2, 3, 5], &v3);
    let p3 = params(&[2, 2, 3], &[1, 2, 2], &[1, 1, 1], &[1, 1, 2]);
    assert_eq!(indices(&x3, &p3, &[1, 1, 3, 2, 2]), vec![1, 1, 11, 11, 18, 18, 11, 11, 18, 18, 26, 26]);
    let mut vals = Buf::zeros(DType::F64, &[1, 1, 3, 2, 2]);
    pool(PoolKind::Max, x3.r(), &p3, vals.w()).unwrap();
    assert_eq!(vals.get::<f64>(), vec![1., 1., 8., 8., 8., 8., 8., 8., 8., 8., 8., 8.]);
    // The indices must be written as i64, and only max pooling has them.
    let mut wrong = Buf::zeros(DType::F32, &[1, 1, 6]);
    assert!(pool(PoolKind::ArgMax, x1.r(), &params(&[3], &[1], &[0], &[1]), wrong.w()).is_err());

    // divisor_override: the sum of the in-bounds taps over the divisor, also
    // for ceil_mode windows that hang past the input.
    let x5 = f32s(&[1, 1, 5, 5], &(1..=25).map(|v| v as f32).collect::<Vec<_>>());
    let avg = |p: &PoolParams, out: &[usize]| {
        let mut o = Buf::zeros(DType::F32, out);
        pool(PoolKind::Avg, x5.r(), p, o.w()).unwrap();
        o.get::<f32>()
    };
    let p = PoolParams { divisor: Some(3), ..params(&[2, 2], &[2, 2], &[0, 0], &[1, 1]) };
    let sums = [16., 24., 15., 56., 64., 35., 43., 47., 25.];
    assert_eq!(avg(&p, &[1, 1, 3, 3]), sums.iter().map(|s: &f32| s / 3.).collect::<Vec<_>>());
    let p = PoolParams { divisor: Some(2), count_include_pad: false, ..params(&[3, 3], &[2, 2], &[1, 1], &[1, 1]) };
    assert_eq!(avg(&p, &[1, 1, 3, 3]), vec![8., 16.5, 14., 34.5, 58.5, 43.5, 38., 61.5, 44.]);
    let p = PoolParams { divisor: Some(-2), ..params(&[2, 2], &[2, 2], &[0, 0], &[1, 1]) };
    assert_eq!(avg(&p, &[1, 1, 2, 2]), vec![-8., -12., -28., -32.]);
    // 3-d, f64: F.avg_pool3d(x, 2, 2, padding=(1, 0, 1), ceil_mode=True, divisor_override=5).
    let p = PoolParams { divisor: Some(5), ..params(&[2, 2, 2], &[2, 2, 2], &[1, 0, 1], &[1, 1, 1]) };
    let mut o = Buf::zeros(DType::F64, &[1, 1, 2, 2, 3]);
    pool(PoolKind::Avg, x3.r(), &p, o.w()).unwrap();
    assert_close(
        &o.get::<f64>(),
        &[2.4, 2.6, 2.8, 1.0, 3.4, 3.2, 1.8, 2.6, 3.8, 0.6, 2.2, 1.8],
        1e-12,
        0.0,
        "avg3d divisor",
    );
    // A divisor of 0, or one on max pooling, is refused.
    let mut o = Buf::zeros(DType::F32, &[1, 1, 2, 2]);
    for (kind, d) in [(PoolKind::Avg, 0), (PoolKind::Max, 2)] {
        let p = PoolParams { divisor: Some(d), ..params(&[2, 2], &[2, 2], &[0, 0], &[1, 1]) };
        assert!(pool(kind, x5.r(), &p, o.w()).is_err());
    }
}

fn ref_attention<T: Copy + Into<f64>>(
    q: &[T],
    k: &[T],
    v: &[T],
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    keep: &dyn Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let scale = 1.0 / (e as f64).sqrt();
    let mut out = vec![0.0; l * ev];
    for i in 0..l {
        let sc: Vec<f64> = (0..s)
            .map(|j| (0..e).map(|p| q[i * e + p].into() * k[j * e + p].into()).sum::<f64>() * scale + keep(i, j))
            .collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        // A fully-masked row attends to nothing: zeros (torch's `_safe_softmax`).
        if mx == f64::NEG_INFINITY {
            continue;
        }
        let ex: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
        let z: f64 = ex.iter().sum();
        for c in 0..ev {
            out[i * ev + c] = (0..s).map(|j| ex[j] / z * v[j * ev + c].into()).sum();
        }
    }
    out
}

#[test]
fn attention_matches_reference() {
    let mut r = rng(15);
    let mut sc = Context::new();
    let (b, l, s, e, ev) = (3, 7, 17, 8, 5);
    let qv = rand_f32(&mut r, b * l * e);
    let kv = rand_f32(&mut r, s * e); // batch-broadcast k and v
    let vv = rand_f32(&mut r, s * ev);
    let (q, k, v) = (f32s(&[b, l, e], &qv), f32s(&[1, s, e], &kv), f32s(&[1, s, ev], &vv));
    let mut o = Buf::zeros(DType::F32, &[b, l, ev]);
    attention(q.r(), k.r(), v.r(), None, true, None, o.w(), &mut sc).unwrap();
    let got = o.get::<f32>();
    for t in 0..b {
        let want = ref_attention(&qv[t * l * e..], &kv, &vv, l, s, e, ev, &|i, j| {
            if j <= i {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        });
        assert_close(&to64(&got[t * l * ev..(t + 1) * l * ev]), &want, 1e-5, 1e-5, "causal");
    }
    // Float mask broadcast over batch; bool mask with a fully masked row -> zeros
    // (torch's SDPA since 2.5).
    let mv = rand_f32(&mut r, l * s);
    let m = f32s(&[l, s], &mv);
    attention(q.r(), k.r(), v.r(), Some(m.r()), false, None, o.w(), &mut sc).unwrap();
    let want = ref_attention(&qv, &kv, &vv, l, s, e, ev, &|i, j| mv[i * s + j] as f64);
    assert_close(&to64(&o.get::<f32>()[..l * ev]), &want, 1e-5, 1e-5, "float mask");
    let bm: Vec<u8> = (0..l * s).map(|i| (i / s != 2 && i % 3 != 0) as u8).collect();
    let m = Buf::from(DType::Bool, &[1, l, s], &bm);
    attention(q.r(), k.r(), v.r(), Some(m.r()), false, None, o.w(), &mut sc).unwrap();
    let want =
        ref_attention(&qv, &kv, &vv, l, s, e, ev, &|i, j| if bm[i * s + j] != 0 { 0.0 } else { f64::NEG_INFINITY });
    assert_close(&to64(&o.get::<f32>()[..l * ev]), &want, 1e-5, 1e-5, "bool mask");
    assert!(o.get::<f32>()[2 * ev..3 * ev].iter().all(|&x| x == 0.0));
    let mut bad = Buf::zeros(DType::F32, &[b, l, ev + 1]);
    assert!(attention(q.r(), k.r(), v.r(), None, false, None, bad.w(), &mut sc).is_err());
}

fn rand_f64(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f64> {
    use rand::Rng;
    (0..n).map(|_| r.gen_range(-2.0f64..2.0)).collect()
}

fn f64s(shape: &[usize], v: &[f64]) -> Buf {
    Buf::from(DType::F64, shape, v)
}

/// f64 runs matmul, linear, the norms and attention in f64: results agree
/// with the f64 references far below f32 precision, on odd shapes.
#[test]
fn f64_kernels_match_reference() {
    const TOL: f64 = 1e-12;
    let mut r = rng(16);
    let mut s = Context::new();
    for &(m, n, k) in &[(1, 1, 1), (7, 17, 33), (17, 1, 100), (3, 1000, 7)] {
        let (av, bv) = (rand_f64(&mut r, m * k), rand_f64(&mut r, k * n));
        let mut o = Buf::zeros(DType::F64, &[m, n]);
        matmul(f64s(&[m, k], &av).r(), f64s(&[k, n], &bv).r(), o.w(), &mut s).unwrap();
        assert_close(&o.get::<f64>(), &ref_mm(&av, &bv, m, n, k), TOL, TOL, &format!("matmul {m}x{n}x{k}"));

        // linear: w is [n, k]; with and without bias.
        let (wv, biasv) = (rand_f64(&mut r, n * k), rand_f64(&mut r, n));
        let mut wt = vec![0.0; k * n];
        for i in 0..n {
            for p in 0..k {
                wt[p * n + i] = wv[i * k + p];
            }
        }
        let (x, w, b) = (f64s(&[m, k], &av), f64s(&[n, k], &wv), f64s(&[n], &biasv));
        let want = ref_mm(&av, &wt, m, n, k);
        linear(x.r(), w.r(), None, o.w(), &mut s).unwrap();
        assert_close(&o.get::<f64>(), &want, TOL, TOL, &format!("linear {m}x{n}x{k}"));
        linear(x.r(), w.r(), Some(b.r()), o.w(), &mut s).unwrap();
        let want: Vec<f64> = want.iter().enumerate().map(|(i, v)| v + biasv[i % n]).collect();
        assert_close(&o.get::<f64>(), &want, TOL, TOL, &format!("linear+bias {m}x{n}x{k}"));
    }
    // Batched matmul with a shared B (the folded path) and a rank-3 linear.
    let (av, bv) = (rand_f64(&mut r, 3 * 5 * 7), rand_f64(&mut r, 7 * 4));
    let mut o = Buf::zeros(DType::F64, &[3, 5, 4]);
    matmul(f64s(&[3, 5, 7], &av).r(), f64s(&[7, 4], &bv).r(), o.w(), &mut s).unwrap();
    assert_close(&o.get::<f64>(), &ref_mm(&av, &bv, 15, 4, 7), TOL, TOL, "batched matmul");
    let wv = rand_f64(&mut r, 4 * 7);
    linear(f64s(&[3, 5, 7], &av).r(), f64s(&[4, 7], &wv).r(), None, o.w(), &mut s).unwrap();
    let wt: Vec<f64> = (0..7 * 4).map(|i| wv[(i % 4) * 7 + i / 4]).collect();
    assert_close(&o.get::<f64>(), &ref_mm(&av, &wt, 15, 4, 7), TOL, TOL, "rank-3 linear");
    // Mixed dtypes are rejected rather than reinterpreted.
    let w32 = f32s(&[4, 7], &[0.0; 28]);
    assert!(linear(f64s(&[3, 5, 7], &av).r(), w32.r(), None, o.w(), &mut s).is_err());

    // Norms: values with a large common offset, where f32 statistics lose digits.
    let xs = [2usize, 3, 7, 5];
    let xv: Vec<f64> = rand_f64(&mut r, numel(&xs)).iter().map(|v| 1000.0 + v).collect();
    let (m, v, w, b) = (
        rand_f64(&mut r, 3),
        rand_f64(&mut r, 3).iter().map(|v| v.abs()).collect::<Vec<_>>(),
        rand_f64(&mut r, 3),
        rand_f64(&mut r, 3),
    );
    let mut o = Buf::zeros(DType::F64, &xs);
    batch_norm(
        f64s(&xs, &xv).r(),
        f64s(&[3], &m).r(),
        f64s(&[3], &v).r(),
        f64s(&[3], &w).r(),
        f64s(&[3], &b).r(),
        1e-5,
        o.w(),
    )
    .unwrap();
    assert_close(&o.get::<f64>(), &ref_batch_norm(&xv, &xs, &m, &v, &w, &b, 1e-5), 1e-10, 1e-10, "f64 batch_norm");
    let (lw, lb) = (rand_f64(&mut r, 35), rand_f64(&mut r, 35));
    layer_norm(f64s(&xs, &xv).r(), Some(f64s(&[7, 5], &lw).r()), Some(f64s(&[7, 5], &lb).r()), 2, 1e-5, o.w()).unwrap();
    assert_close(&o.get::<f64>(), &ref_layer_norm(&xv, &lw, &lb, 1e-5), TOL, 1e-10, "f64 layer_norm");
    layer_norm(f64s(&xs, &xv).r(), None, None, 1, 1e-5, o.w()).unwrap();
    assert_close(
        &o.get::<f64>(),
        &ref_layer_norm(&xv, &[1.0; 5], &[0.0; 5], 1e-5),
        TOL,
        1e-10,
        "f64 layer_norm, no affine",
    );
    assert!(layer_norm(f64s(&xs, &xv).r(), Some(f32s(&[5], &[0.0; 5]).r()), None, 1, 1e-5, o.w()).is_err());

    // Attention: causal with batch-broadcast k/v, an f64 float mask, and a bool
    // mask with a fully masked row (zeros, as torch's SDPA).
    let (bt, l, sl, e, ev) = (3, 7, 17, 9, 5);
    let qv = rand_f64(&mut r, bt * l * e);
    let (kv, vv) = (rand_f64(&mut r, sl * e), rand_f64(&mut r, sl * ev));
    let (q, k, v) = (f64s(&[bt, l, e], &qv), f64s(&[1, sl, e], &kv), f64s(&[1, sl, ev], &vv));
    let mut o = Buf::zeros(DType::F64, &[bt, l, ev]);
    attention(q.r(), k.r(), v.r(), None, true, None, o.w(), &mut s).unwrap();
    let got = o.get::<f64>();
    for t in 0..bt {
        let want = ref_attention(&qv[t * l * e..], &kv, &vv, l, sl, e, ev, &|i, j| {
            if j <= i {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        });
        assert_close(&got[t * l * ev..(t + 1) * l * ev], &want, TOL, TOL, "f64 causal");
    }
    let mv = rand_f64(&mut r, l * sl);
    attention(q.r(), k.r(), v.r(), Some(f64s(&[l, sl], &mv).r()), false, None, o.w(), &mut s).unwrap();
    let want = ref_attention(&qv, &kv, &vv, l, sl, e, ev, &|i, j| mv[i * sl + j]);
    assert_close(&o.get::<f64>()[..l * ev], &want, TOL, TOL, "f64 float mask");
    let bm: Vec<u8> = (0..l * sl).map(|i| (i / sl != 2 && i % 3 != 0) as u8).collect();
    attention(q.r(), k.r(), v.r(), Some(Buf::from(DType::Bool, &[1, l, sl], &bm).r()), false, None, o.w(), &mut s)
        .unwrap();
    let want =
        ref_attention(&qv, &kv, &vv, l, sl, e, ev, &|i, j| if bm[i * sl + j] != 0 { 0.0 } else { f64::NEG_INFINITY });
    assert_close(&o.get::<f64>()[..l * ev], &want, TOL, TOL, "f64 bool mask");
    assert!(o.get::<f64>()[2 * ev..3 * ev].iter().all(|&x| x == 0.0));
    // An f32 mask on f64 operands is a dtype error.
    let m32 = f32s(&[l, sl], &vec![0.0; l * sl]);
    assert!(attention(q.r(), k.r(), v.r(), Some(m32.r()), false, None, o.w(), &mut s).is_err());
}

#[test]
fn layout_ops() {
    let xv: Vec<i16> = (0..24).collect();
    let x = Buf::from(DType::I16, &[2, 3, 4], &xv);
    let mut o = Buf::zeros(DType::I16, &[4, 2, 3]);
    permute(x.r(), &[2, 0, 1], o.w()).unwrap();
    let got = o.get::<i16>();
    for i in 0..24 {
        let [a, b, c] = [i / 6, (i / 3) % 2, i % 3];
        assert_eq!(got[i], xv[b * 12 + c * 4 + a]);
    }
    assert!(permute(x.r(), &[0, 0, 1], o.w()).is_err());

    let e = Buf::from(DType::F64, &[3, 1], &[1.0f64, 2.0, 3.0]);
    let mut o = Buf::zeros(DType::F64, &[2, 3, 2]);
    expand(e.r(), o.w()).unwrap();
    assert_eq!(o.get::<f64>(), vec![1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3.]);

    let mut o = Buf::zeros(DType::I16, &[2, 3, 2]);
    slice(x.r(), 2, 1, 2, o.w()).unwrap();
    assert_eq!(o.get::<i16>(), vec![1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23]);
    let mut o = Buf::zeros(DType::I16, &[2, 3, 3]);
    assert!(slice(x.r(), 2, 1, 2, o.w()).is_err());

    let y = Buf::from(DType::I16, &[2, 1, 4], &[100i16; 8]);
    let mut o = Buf::zeros(DType::I16, &[2, 4, 4]);
    concat(&[x.r(), y.r()], 1, o.w()).unwrap();
    let got = o.get::<i16>();
    assert_eq!(&got[..16], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 100, 100, 100, 100]);
    assert_eq!(&got[16..20], &[12, 13, 14, 15]);

    let idx = Buf::from(DType::I64, &[2, 2], &[0i64, -1, 2, 1]);
    let mut o = Buf::zeros(DType::I16, &[2, 2, 2, 4]);
    gather(x.r(), idx.r(), 1, o.w()).unwrap();
    let got = o.get::<i16>();
    assert_eq!(&got[..8], &[0, 1, 2, 3, 8, 9, 10, 11]);
    let bad = Buf::from(DType::I32, &[2, 2], &[0i32, 3, 1, 1]);
    assert!(gather(x.r(), bad.r(), 1, o.w()).is_err());
    let bad = Buf::from(DType::I32, &[2, 2], &[0i32, -4, 1, 1]);
    assert!(gather(x.r(), bad.r(), 1, o.w()).is_err());

    let mut o = Buf::zeros(DType::I32, &[5]);
    arange(2.0, 3.0, o.w()).unwrap();
    assert_eq!(o.get::<i32>(), vec![2, 5, 8, 11, 14]);
    fill(-1.5, o.w()).unwrap();
    assert_eq!(o.get::<i32>(), vec![-1; 5]);
    let mut o = Buf::zeros(DType::I16, &[6, 4]);
    copy(x.r(), o.w()).unwrap();
    assert_eq!(o.get::<i16>(), xv);
    let mut o = Buf::zeros(DType::I16, &[5]);
    assert!(copy(x.r(), o.w()).is_err());
}

/// Rough throughput check: `cargo test -p kiln-kernels --release -- --ignored --nocapture`.
#[test]
#[ignore]
fn gemm_throughput() {
    let mut s = Context::new();
    for &n in &[64usize, 256, 512] {
        let (a, b) = (f32s(&[n, n], &vec![0.5; n * n]), f32s(&[n, n], &vec![0.25; n * n]));
        let mut o = Buf::zeros(DType::F32, &[n, n]);
        matmul(a.r(), b.r(), o.w(), &mut s).unwrap();
        let reps = (1 << 27) / (n * n * n) + 1;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            matmul(a.r(), b.r(), o.w(), &mut s).unwrap();
        }
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        println!("matmul {n}^3: {:.2} GFLOP/s", 2.0 * (n * n * n) as f64 / secs / 1e9);
    }
    let x = f32s(&[1, 64, 56, 56], &vec![0.1; 64 * 56 * 56]);
    let w = f32s(&[64, 64, 3, 3], &vec![0.1; 64 * 64 * 9]);
    let mut o = Buf::zeros(DType::F32, &[1, 64, 56, 56]);
    let p = ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups: 1 };
    conv(x.r(), w.r(), None, &p, o.w(), &mut s).unwrap();
    let t = std::time::Instant::now();
    conv(x.r(), w.r(), None, &p, o.w(), &mut s).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!("conv 64x56x56 3x3: {:.2} GFLOP/s", 2.0 * 64.0 * 64.0 * 9.0 * 56.0 * 56.0 / secs / 1e9);
}

#[test]
fn uint8_bilinear_resize_is_torchs_fixed_point() {
    // Numbers from torch 2.15 on x86 (torch.manual_seed(3); randint(0, 256, (1, 2, 3, 4), uint8)).
    let x: Vec<u8> = vec![
        106, 152, 249, 131, 184, 200, 0, 21, 253, 147, 202, 107, 249, 169, 138, 149, 119, 166, 224, 148, 172, 93, 167,
        142,
    ];
    let run = |out_hw: [usize; 2], align_corners: bool| {
        let input = Buf::from(DType::U8, &[1, 2, 3, 4], &x);
        let mut out = Buf::zeros(DType::U8, &[1, 2, out_hw[0], out_hw[1]]);
        let params = ResizeParams { mode: ResizeMode::Linear, align_corners, spatial: 2, scales: &[] };
        resize(input.r(), &params, out.w()).unwrap();
        out.get::<u8>()
    };
    // interpolate(x, size=(5, 3), mode="bilinear"): one value differs by 1
    // from rounding the exact (f64) interpolation, which is why this path exists.
    let want: Vec<u8> = vec![
        114, 201, 151, 143, 161, 98, 187, 100, 18, 216, 145, 81, 235, 175, 123, 236, 154, 147, 192, 170, 153, 127, 195,
        161, 146, 156, 152, 159, 130, 146,
    ];
    assert_eq!(run([5, 3], false), want);
    // align_corners=True, size=(3, 7): only the horizontal pass runs.
    let want: Vec<u8> = vec![
        106, 129, 152, 201, 249, 190, 131, 184, 192, 200, 100, 0, 11, 21, 253, 200, 147, 175, 202, 155, 107, 249, 209,
        169, 154, 138, 144, 149, 119, 143, 166, 195, 224, 186, 148, 172, 133, 93, 130, 167, 155, 142,
    ];
    assert_eq!(run([3, 7], true), want);
}
