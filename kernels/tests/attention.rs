//! Attention over long key sequences (S > 4096: the kernel's key-tiled
//! path with an online softmax).
//!
//! - Equals softmax(q kᵀ · scale + mask) v computed in f64, with no mask,
//!   bool and float masks (full and broadcast), causal, GQA groups, a last
//!   key tile shorter than the others and fully masked rows, on every
//!   kernel table; f64 too.
//! - Causal: key tiles wholly right of a block's diagonal are never read
//!   (NaN keys and values there leave the output finite and exact).
//! - The scratch stays small for a 2 M-key sequence (a `block × S` score
//!   buffer would be 8 MiB a row).
//!
//! Bit-identity at every thread count is in `threads.rs`.

mod common;

use common::*;
use kiln_kernels::{self as k, Context, DType};

/// `[l, s]` additive mask of (query, key): 0 to keep, -inf to drop, or a
/// float bias.
type MaskFn<'a> = &'a dyn Fn(usize, usize) -> f64;

/// softmax(q kᵀ · scale + mask) v for one batch entry, in f64; a row whose
/// every key is masked gives zeros (torch's `_safe_softmax`).
#[allow(clippy::too_many_arguments)]
fn reference<T: Copy + Into<f64>>(
    q: &[T],
    kk: &[T],
    v: &[T],
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    mask: MaskFn,
) -> Vec<f64> {
    let scale = 1.0 / (e as f64).sqrt();
    let mut out = vec![0.0; l * ev];
    for i in 0..l {
        let qi = &q[i * e..(i + 1) * e];
        let sc: Vec<f64> = (0..s)
            .map(|j| {
                qi.iter().zip(&kk[j * e..(j + 1) * e]).map(|(&a, &b)| a.into() * b.into()).sum::<f64>() * scale
                    + mask(i, j)
            })
            .collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if mx == f64::NEG_INFINITY {
            continue;
        }
        let mut z = 0.0;
        let o = &mut out[i * ev..(i + 1) * ev];
        for (j, x) in sc.iter().enumerate() {
            let p = (x - mx).exp();
            z += p;
            for (oc, vc) in o.iter_mut().zip(&v[j * ev..(j + 1) * ev]) {
                *oc += p * (*vc).into();
            }
        }
        o.iter_mut().for_each(|x| *x /= z);
    }
    out
}

const CAUSAL: fn(usize, usize) -> f64 = |i, j| if j <= i { 0.0 } else { f64::NEG_INFINITY };

/// One attention problem over `heads` entries sharing nothing, f32 in,
/// checked against the f64 reference on every table.
struct Case<'a> {
    what: &'a str,
    heads: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    mask: Option<Buf>,
    causal: bool,
    /// The additive mask the reference applies (the kernel's mask and
    /// causal flag together).
    reference_mask: MaskFn<'a>,
}

fn check_against_reference(case: &Case, seed: u64) {
    let Case { what, heads, l, s, e, ev, .. } = *case;
    let mut r = rng(seed);
    let (q, kk, v) =
        (rand_f32(&mut r, heads * l * e), rand_f32(&mut r, heads * s * e), rand_f32(&mut r, heads * s * ev));
    let want: Vec<f64> = (0..heads)
        .flat_map(|h| {
            let (qh, kh) = (&q[h * l * e..(h + 1) * l * e], &kk[h * s * e..(h + 1) * s * e]);
            reference(qh, kh, &v[h * s * ev..(h + 1) * s * ev], l, s, e, ev, case.reference_mask)
        })
        .collect();
    for table in tables() {
        let mut cx = Context::with_table(table);
        let mut out = Buf::zeros(DType::F32, &[heads, l, ev]);
        let (qs, ks, vs) = (f32s(&[heads, l, e], &q), f32s(&[heads, s, e], &kk), f32s(&[heads, s, ev], &v));
        k::attention(qs.r(), ks.r(), vs.r(), case.mask.as_ref().map(Buf::r), case.causal, None, out.w(), &mut cx)
            .unwrap();
        assert_close(&to64(&out.get::<f32>()), &want, 2e-5, 2e-5, &format!("{what} on {}", table.isa()));
    }
}

#[test]
fn long_keys_match_f64_reference() {
    // S = 5000: nine tiles of 512 keys and one of 392; L = 70 rows: a block
    // of 64 and one of 6.
    let (l, s, e, ev) = (70, 5000, 16, 8);
    let mut r = rng(40);
    let fmask: Vec<f32> = rand_f32(&mut r, l * s);
    // Row 3 fully masked; the rest keep two keys in three.
    let bmask: Vec<u8> = (0..l * s).map(|x| u8::from(x / s != 3 && x % 3 != 1)).collect();
    // Broadcast along keys: rows 5 and 40 masked whole.
    let row_keep: Vec<u8> = (0..l).map(|i| u8::from(i != 5 && i != 40)).collect();
    // Broadcast along queries: one bias per key, large enough to move the
    // maximum from tile to tile.
    let key_bias: Vec<f32> = (0..s).map(|j| ((j * 37) % 101) as f32 * 0.08 - 4.0).collect();
    let cases = [
        Case { what: "no mask", heads: 2, l, s, e, ev, mask: None, causal: false, reference_mask: &|_, _| 0.0 },
        Case {
            what: "bool mask",
            heads: 1,
            l,
            s,
            e,
            ev,
            mask: Some(Buf::from(DType::Bool, &[l, s], &bmask)),
            causal: false,
            reference_mask: &|i, j| if bmask[i * s + j] != 0 { 0.0 } else { f64::NEG_INFINITY },
        },
        Case {
            what: "float mask",
            heads: 2,
            l,
            s,
            e,
            ev,
            mask: Some(f32s(&[1, l, s], &fmask)),
            causal: false,
            reference_mask: &|i, j| fmask[i * s + j] as f64,
        },
        Case {
            what: "bool mask [l, 1]",
            heads: 1,
            l,
            s,
            e,
            ev,
            mask: Some(Buf::from(DType::Bool, &[l, 1], &row_keep)),
            causal: false,
            reference_mask: &|i, _| if row_keep[i] != 0 { 0.0 } else { f64::NEG_INFINITY },
        },
        Case {
            what: "float mask [1, s], causal",
            heads: 1,
            l,
            s,
            e,
            ev,
            mask: Some(f32s(&[1, s], &key_bias)),
            causal: true,
            reference_mask: &|i, j| key_bias[j] as f64 + CAUSAL(i, j),
        },
    ];
    for (n, case) in cases.iter().enumerate() {
        check_against_reference(case, 41 + n as u64);
    }
}

/// Causal with the diagonal crossing key tiles: 700 queries over 4200 keys
/// (the last block's rows see keys up to 699, so tiles 0..512 and 512..1024
/// are computed, the diagonal one masked, the other seven skipped), and
/// more queries than keys (rows past the last key see every key).
#[test]
fn causal_long_keys_match_f64_reference() {
    for (l, s) in [(700, 4200), (4110, 4100)] {
        let case = Case {
            what: &format!("causal {l}x{s}"),
            heads: 1,
            l,
            s,
            e: 4,
            ev: 4,
            mask: None,
            causal: true,
            reference_mask: &CAUSAL,
        };
        check_against_reference(&case, 50 + l as u64);
    }
}

/// Key tiles right of every row's diagonal are not read: NaN keys and
/// values there (a NaN key gives a NaN score, a NaN value times a zero
/// weight NaN) leave the output as with finite ones.
#[test]
fn causal_skips_tiles_right_of_the_diagonal() {
    let (l, s, e, ev) = (700, 4200, 8, 8);
    let mut r = rng(60);
    let q = rand_f32(&mut r, l * e);
    let (mut kk, mut v) = (rand_f32(&mut r, s * e), rand_f32(&mut r, s * ev));
    let want = reference(&q, &kk, &v, l, s, e, ev, &CAUSAL);
    // Row 699's diagonal is in tile 512..1024; from key 1024 on no block reads.
    kk[1024 * e..].fill(f32::NAN);
    v[1024 * ev..].fill(f32::NAN);
    for table in tables() {
        let mut cx = Context::with_table(table);
        let mut out = Buf::zeros(DType::F32, &[l, ev]);
        let (qs, ks, vs) = (f32s(&[l, e], &q), f32s(&[s, e], &kk), f32s(&[s, ev], &v));
        k::attention(qs.r(), ks.r(), vs.r(), None, true, None, out.w(), &mut cx).unwrap();
        assert_close(&to64(&out.get::<f32>()), &want, 2e-5, 2e-5, &format!("causal, NaN past 1024 on {}", table.isa()));
    }
}

/// GQA over long keys: K and V `[hkv, 1, s, e]` shared by the query heads
/// of each group (the group's rows in blocks of 64 that span heads), a
/// per-head float mask, causal or not. With 600 queries a head the causal
/// block of rows 576..640 holds queries 576..599 of one head (keys to 599,
/// two tiles) and 0..39 of the next.
#[test]
fn gqa_long_keys_match_f64_reference() {
    for (hkv, rep, l, s) in [(2, 3, 70, 4500), (1, 2, 600, 4200)] {
        let (e, ev) = (8, 8);
        let mut r = rng(70 + l as u64);
        let q = rand_f32(&mut r, hkv * rep * l * e);
        let (kk, v) = (rand_f32(&mut r, hkv * s * e), rand_f32(&mut r, hkv * s * ev));
        let fmask = rand_f32(&mut r, rep * l * s);
        for causal in [false, true] {
            let mut want = Vec::new();
            for g in 0..hkv {
                let (kg, vg) = (&kk[g * s * e..(g + 1) * s * e], &v[g * s * ev..(g + 1) * s * ev]);
                for h in 0..rep {
                    let qh = &q[(g * rep + h) * l * e..(g * rep + h + 1) * l * e];
                    let mask = |i: usize, j: usize| {
                        fmask[(h * l + i) * s + j] as f64 + if causal { CAUSAL(i, j) } else { 0.0 }
                    };
                    want.extend(reference(qh, kg, vg, l, s, e, ev, &mask));
                }
            }
            for table in tables() {
                let mut cx = Context::with_table(table);
                let mut out = Buf::zeros(DType::F32, &[hkv, rep, l, ev]);
                let qs = f32s(&[hkv, rep, l, e], &q);
                let (ks, vs) = (f32s(&[hkv, 1, s, e], &kk), f32s(&[hkv, 1, s, ev], &v));
                let mask = f32s(&[rep, l, s], &fmask);
                k::attention(qs.r(), ks.r(), vs.r(), Some(mask.r()), causal, None, out.w(), &mut cx).unwrap();
                let what = format!("gqa {hkv}x{rep}x{l}x{s} causal={causal} on {}", table.isa());
                assert_close(&to64(&out.get::<f32>()), &want, 2e-5, 2e-5, &what);
            }
        }
    }
}

/// f64 attention takes the same key-tiled code (with f64 GEMMs and sums),
/// over all nine tiles here.
#[test]
fn f64_long_keys_match_reference() {
    let (l, s, e, ev) = (70, 4500, 8, 4);
    let mut r = rng(80);
    let q = to64(&rand_f32(&mut r, l * e));
    let (kk, v) = (to64(&rand_f32(&mut r, s * e)), to64(&rand_f32(&mut r, s * ev)));
    let bmask: Vec<u8> = (0..l * s).map(|x| u8::from(x / s != 9 && x % 7 != 0)).collect();
    let want = reference(&q, &kk, &v, l, s, e, ev, &|i, j| if bmask[i * s + j] != 0 { 0.0 } else { f64::NEG_INFINITY });
    let mut out = Buf::zeros(DType::F64, &[l, ev]);
    let (qs, ks, vs) =
        (Buf::from(DType::F64, &[l, e], &q), Buf::from(DType::F64, &[s, e], &kk), Buf::from(DType::F64, &[s, ev], &v));
    let mask = Buf::from(DType::Bool, &[l, s], &bmask);
    k::attention(qs.r(), ks.r(), vs.r(), Some(mask.r()), false, None, out.w(), &mut Context::new()).unwrap();
    let got = out.get::<f64>();
    assert_close(&got, &want, 1e-12, 1e-12, "f64 key-tiled");
    assert!(got[9 * ev..10 * ev].iter().all(|&x| x == 0.0), "fully masked row 9 gives zeros");
}

/// 2 M keys: the kernel's scratch (scores tile, accumulator, GEMM panels)
/// stays well under 1 MiB, where one row of `block × S` scores alone would
/// take 8 MiB, and the output matches a reference over all keys.
#[test]
fn two_million_keys_run_in_a_small_scratch() {
    let (l, s, e, ev) = (3, 2 << 20, 8, 8);
    let mut r = rng(90);
    let q = rand_f32(&mut r, l * e);
    let (kk, v) = (rand_f32(&mut r, s * e), rand_f32(&mut r, s * ev));
    let want = reference(&q, &kk, &v, l, s, e, ev, &|_, _| 0.0);
    for threads in [1, 2] {
        let mut cx = Context::new().with_threads(threads);
        let mut out = Buf::zeros(DType::F32, &[l, ev]);
        let (qs, ks, vs) = (f32s(&[l, e], &q), f32s(&[s, e], &kk), f32s(&[s, ev], &v));
        k::attention(qs.r(), ks.r(), vs.r(), None, false, None, out.w(), &mut cx).unwrap();
        // A sum of 2 M f32 products, rescaled per tile: a little looser.
        assert_close(&to64(&out.get::<f32>()), &want, 1e-4, 1e-4, &format!("2 M keys at {threads} threads"));
        let bytes = cx.scratch().bytes();
        assert!(bytes < 1 << 20, "scratch {bytes} B for 2 M keys at {threads} threads");
    }
}
