//! Every variant of every kernel-table entry against the generic one.
//!
//! `variant_tests!` makes one test per entry. Each runs every table this CPU
//! supports besides the generic one (printing a note for the ISA levels it
//! lacks) on odd lengths (0, 1, 7, 17, 1000, ...), misaligned starts, tails
//! and special values, and compares with `KernelTable::generic_only()`:
//! bit for bit where the math is exact (add/sub/mul/div, max), within the
//! stated ulp bound otherwise (exp and what is built on it). The GEMM entry
//! runs through `gemm_f32` with odd m/n/k, both B layouts, padded leading
//! dims and beta 0/1/0.5, and must leave C's padding untouched.
//!
//! The checks return errors instead of panicking so that
//! `checks_reject_wrong_variants` can feed them deliberately broken variants
//! and see them fail: a check that cannot fail tests nothing.

mod common;

use kiln_kernels::{Context, Isa, KernelTable};
use rand::Rng;

type Check = Result<(), String>;

/// The non-generic tables this CPU runs; notes the levels it lacks.
fn variant_tables() -> Vec<&'static KernelTable> {
    let mut tables = Vec::new();
    for isa in Isa::ALL {
        match KernelTable::for_isa(isa) {
            Some(_) if isa == Isa::Generic => {}
            Some(t) => tables.push(t),
            None => println!("note: skipping {isa} variants: not supported by this CPU or build"),
        }
    }
    tables
}

fn generic() -> &'static KernelTable {
    KernelTable::generic_only()
}

/// Distance in representable f32s (0 for two NaNs, huge for NaN vs number).
fn ulps(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() { 0 } else { u64::MAX };
    }
    let ord = |x: f32| {
        let b = x.to_bits() as i32;
        (if b < 0 { i32::MIN.wrapping_sub(b) } else { b }) as i64
    };
    ord(a).abs_diff(ord(b))
}

/// Values that exercise exp's clamps, subnormal results, overflow, tanh's
/// branch point and saturation, and IEEE specials.
const SPECIALS: &[f32] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    f32::NAN,
    -f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    f32::MIN,
    f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE,
    1e-45,
    -1e-45,
    1e-30,
    88.72,
    88.7228,
    88.73,
    89.0,
    -87.33,
    -87.34,
    -100.0,
    -103.97,
    -103.98,
    -104.0,
    -105.0,
    0.625,
    -0.625,
    0.624_999_94,
    9.01,
    -9.01,
    44.4,
    16.646_235,
    -16.646_235,
    0.5,
    std::f32::consts::LN_2,
    -std::f32::consts::LN_2,
];

/// Inputs of length `n`: specials first, then random values in ±`range`.
fn inputs(n: usize, range: f32, seed: u64) -> Vec<f32> {
    let mut r = common::rng(seed);
    (0..n).map(|i| SPECIALS.get(i).copied().unwrap_or_else(|| r.gen_range(-range..range))).collect()
}

/// Lengths around the vector widths (4, 8, 16) and long rows.
const LENGTHS: &[usize] = &[0, 1, 3, 7, 8, 9, 15, 16, 17, 33, 64, 1000, 1003];

/// [`check_unary`] for a function whose f32 evaluation is ill-conditioned
/// somewhere: an element more than `bound` ulp from generic passes if it
/// lies between the generic results at the input 2 ulp below and above
/// (widened by `bound` ulp), i.e. it is the function of an input within the
/// input's own rounding.
fn check_unary_conditioned(
    name: &str,
    f: impl Fn(&[f32], &mut [f32]),
    g: impl Fn(&[f32], &mut [f32]),
    bound: u64,
) -> Check {
    let near = |x: f32, got: f32| -> bool {
        let step = |x: f32, k: i32| {
            let b = x.to_bits() as i32;
            f32::from_bits(if x >= 0.0 { b + k } else { b - k } as u32)
        };
        let xs = [step(x, -2), x, step(x, 2)];
        let mut ys = [0f32; 3];
        g(&xs, &mut ys);
        let (lo, hi) = ys.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &y| (l.min(y), h.max(y)));
        (got >= lo && got <= hi) || ulps(got, lo) <= bound || ulps(got, hi) <= bound
    };
    let x: Vec<f32> = (0..(1u64 << 32)).step_by(4099).map(|b| f32::from_bits(b as u32)).collect();
    let cases = LENGTHS.iter().enumerate().flat_map(|(s, &n)| [1.0f32, 20.0].map(|r| inputs(n, r, s as u64)));
    for xs in cases.chain([x]) {
        let (mut want, mut got) = (vec![7.5f32; xs.len() + 2], vec![7.5f32; xs.len() + 2]);
        g(&xs, &mut want);
        f(&xs, &mut got);
        for (i, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
            let Some(&xi) = xs.get(i) else {
                if gv.to_bits() != wv.to_bits() {
                    return Err(format!("{name}: wrote past the input ({i})"));
                }
                continue;
            };
            let special = !xi.is_finite() || xi == 0.0;
            let ok = if special {
                gv.to_bits() == wv.to_bits() || (gv.is_nan() && wv.is_nan())
            } else {
                ulps(gv, wv) <= bound || near(xi, gv)
            };
            if !ok {
                return Err(format!("{name}: len {} [{i}] x={xi:e}: {gv:e} vs generic {wv:e}", xs.len()));
            }
        }
    }
    Ok(())
}

/// A unary entry: every length, start offsets 0/1/3 (misaligned), a dense
/// sweep over every 4099th f32 bit pattern, `bound` ulp from generic, and
/// untouched output past the input's end.
fn check_unary(name: &str, f: impl Fn(&[f32], &mut [f32]), g: impl Fn(&[f32], &mut [f32]), bound: u64) -> Check {
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for (s, &n) in LENGTHS.iter().enumerate() {
        for range in [1.0f32, 20.0, 120.0] {
            cases.push(inputs(n, range, s as u64));
        }
    }
    cases.push((0..(1u64 << 32)).step_by(4099).map(|b| f32::from_bits(b as u32)).collect());
    for x in &cases {
        for off in [0usize, 1, 3] {
            if off > x.len() {
                continue;
            }
            let xs = &x[off..];
            // Two extra output slots: a variant must write only x.len() elements.
            let mut want = vec![7.5f32; xs.len() + 2];
            let mut got = want.clone();
            g(xs, &mut want);
            f(xs, &mut got);
            for (i, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
                let d = ulps(gv, wv);
                let special_input = xs.get(i).is_some_and(|v| !v.is_finite() || *v == 0.0);
                let exact = i >= xs.len() || special_input;
                if (exact && gv.to_bits() != wv.to_bits() && !(gv.is_nan() && wv.is_nan())) || d > bound {
                    let xi = xs.get(i).copied().unwrap_or(f32::NAN);
                    return Err(format!(
                        "{name}: len {} off {off} [{i}] x={xi:e}: {gv:e} vs generic {wv:e} ({d} ulp > {bound})",
                        xs.len()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A binary entry: bit-exact, with operands of different lengths and
/// offsets (the shortest wins; nothing past it is written).
fn check_binary(name: &str, f: impl Fn(&[f32], &[f32], &mut [f32]), g: impl Fn(&[f32], &[f32], &mut [f32])) -> Check {
    for (s, &n) in LENGTHS.iter().enumerate() {
        let a = inputs(n + 5, 3.0, 100 + s as u64);
        let mut b = inputs(n + 5, 3.0, 200 + s as u64);
        b.rotate_left(n.min(7)); // pair specials with other values, including 0 divisors
        for (oa, ob, extra) in [(0, 0, 0), (1, 0, 2), (0, 3, 1), (2, 1, 0)] {
            let (av, bv) = (&a[oa..oa + n], &b[ob..ob + n + extra]);
            let mut want = vec![-3.25f32; n + 2];
            let mut got = want.clone();
            g(av, bv, &mut want);
            f(av, bv, &mut got);
            for (i, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
                if gv.to_bits() != wv.to_bits() && !(gv.is_nan() && wv.is_nan()) {
                    return Err(format!("{name}: len {n} offsets {oa}/{ob} [{i}]: {gv:e} vs generic {wv:e}"));
                }
            }
        }
    }
    Ok(())
}

/// A reduction entry: bit-exact (which NaN, which zero), on rows with NaNs
/// of different payloads anywhere, ±0 ties, all -inf, empty rows.
fn check_reduce(name: &str, f: impl Fn(&[f32]) -> f32, g: impl Fn(&[f32]) -> f32) -> Check {
    let nan2 = f32::from_bits(0x7fc0_1234);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for (s, &n) in LENGTHS.iter().enumerate() {
        let mut r = common::rng(300 + s as u64);
        let base: Vec<f32> = (0..n).map(|_| r.gen_range(-50.0..50.0)).collect();
        rows.push(base.clone());
        rows.push(base.iter().map(|v| -v.abs()).collect());
        rows.push(vec![f32::NEG_INFINITY; n]);
        rows.push((0..n).map(|i| if i % 3 == 0 { 0.0 } else { -0.0 }).collect());
        rows.push((0..n).map(|i| if i % 2 == 0 { -0.0 } else { -1.0 }).collect());
        for at in [0, n / 2, n.saturating_sub(1)] {
            if at < n {
                let mut v = base.clone();
                v[at] = f32::NAN;
                rows.push(v.clone());
                v[n - 1 - at / 2] = nan2;
                rows.push(v);
                let mut v = base.clone();
                v[at] = f32::INFINITY;
                rows.push(v);
            }
        }
    }
    for row in &rows {
        for off in [0usize, 1] {
            if off > row.len() {
                continue;
            }
            let x = &row[off..];
            let (gv, wv) = (f(x), g(x));
            if gv.to_bits() != wv.to_bits() {
                return Err(format!(
                    "{name}: len {} off {off}: {gv:e} ({:#x}) vs generic {wv:e}",
                    x.len(),
                    gv.to_bits()
                ));
            }
        }
    }
    Ok(())
}

/// A column-sum variant (`f`) against generic (`g`), bit for bit: rows of
/// widths around the vector blocks (4 and 32 columns) and their tails,
/// 0, 1 and many rows, a misaligned start, sums that start nonzero, huge
/// values that cancel (where the order of the adds shows) and specials; the
/// sums past the columns must stay as they were.
fn check_column_sum(name: &str, f: impl Fn(&[f32], &mut [f64]), g: impl Fn(&[f32], &mut [f64])) -> Check {
    let mut r = common::rng(400);
    for c in [1usize, 3, 4, 5, 8, 31, 32, 33, 36, 64, 67, 100, 1152] {
        for rows in [0usize, 1, 2, 7, 50] {
            for off in [0usize, 1] {
                // ±2^60 one time in ten: sums that keep cancelling them, so
                // that which small terms were absorbed (the order) shows.
                let mut x: Vec<f32> = (0..off + rows * c)
                    .map(|_| match r.gen_range(0..20) {
                        0 => 2f32.powi(60),
                        1 => -(2f32.powi(60)),
                        _ => r.gen_range(-2.0f32..2.0),
                    })
                    .collect();
                if rows * c > 7 {
                    x[off + 5] = f32::INFINITY;
                    x[off + rows * c - 2] = -0.0;
                }
                let start: Vec<f64> = (0..c + 2).map(|_| r.gen_range(-1.0..1.0)).collect();
                let (mut got, mut want) = (start.clone(), start.clone());
                f(&x[off..], &mut got[..c]);
                g(&x[off..], &mut want[..c]);
                if let Some(i) = (0..c + 2).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                    return Err(format!("{name} {rows}×{c} (offset {off}) [{i}]: {} vs {}", got[i], want[i]));
                }
            }
        }
    }
    Ok(())
}

/// Softmax's exp-and-sum: outputs within `bound` ulp, the f64 sum within
/// `bound` f32 ulp relative (f64 summation order may differ), NaN rows NaN.
fn check_exp_sum(
    name: &str,
    f: impl Fn(&mut [f32], f32) -> f64,
    g: impl Fn(&mut [f32], f32) -> f64,
    bound: u64,
) -> Check {
    for (s, &n) in LENGTHS.iter().enumerate() {
        for range in [5.0f32, 100.0] {
            let x = inputs(n, range, 400 + s as u64);
            let finite: Vec<f32> =
                x.iter().map(|&v| if v.is_finite() { v.clamp(-range, range) } else { -range }).collect();
            for row in [&x, &finite] {
                let shift = row.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m || v.is_nan() { v } else { m });
                for shift in [shift, 0.0, -3.5] {
                    let (mut got, mut want) = (row.to_vec(), row.to_vec());
                    let (gs, ws) = (f(&mut got, shift), g(&mut want, shift));
                    for (i, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
                        let d = ulps(gv, wv);
                        if d > bound {
                            return Err(format!("{name}: len {n} shift {shift} [{i}]: {gv:e} vs generic {wv:e}"));
                        }
                    }
                    let tol = bound as f64 * f32::EPSILON as f64 * ws.abs();
                    let sums_ok = if ws.is_nan() { gs.is_nan() } else { gs == ws || (gs - ws).abs() <= tol };
                    if !sums_ok {
                        return Err(format!("{name}: len {n} shift {shift}: sum {gs:e} vs generic {ws:e}"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// One GEMM problem's layout: leading dims padded by `pad`.
#[derive(Copy, Clone, Debug)]
struct GemmCase {
    m: usize,
    n: usize,
    k: usize,
    tb: bool,
    beta: f32,
    pad: usize,
}

/// C after `gemm(case, a, b, c)` on a C whose padding holds a sentinel.
type GemmRun<'a> = &'a dyn Fn(&GemmCase, &[f32], &[f32], &mut [f32]);

fn gemm_shapes() -> Vec<(usize, usize, usize)> {
    let dims = [1usize, 7, 17, 67];
    let mut shapes = Vec::new();
    for m in dims {
        for n in dims {
            for k in dims {
                shapes.push((m, n, k));
            }
        }
    }
    // Exact tiles of the microkernels (4×8, 6×16, 8×12), K past the 512-deep slice, N past
    // the 512-wide block, and k = 0.
    shapes.extend([(6, 16, 5), (12, 32, 3), (4, 8, 9), (24, 48, 2), (33, 33, 600), (9, 1030, 3), (5, 9, 0)]);
    shapes.extend([(8, 12, 5), (16, 24, 3)]);
    shapes
}

/// A GEMM variant (`f`) against generic (`g`) and both against an f64
/// oracle, within `4·k·ε·Σ|a·b|` per element; C's padding must stay as it
/// was and beta 0 must not read C (it starts as NaN).
fn check_gemm(name: &str, f: GemmRun, g: GemmRun) -> Check {
    for (m, n, k) in gemm_shapes() {
        for tb in [false, true] {
            for beta in [0.0f32, 1.0, 0.5] {
                for pad in [0usize, 3] {
                    let case = GemmCase { m, n, k, tb, beta, pad };
                    check_gemm_case(name, &case, f, g)?;
                }
            }
        }
    }
    Ok(())
}

fn check_gemm_case(name: &str, case: &GemmCase, f: GemmRun, g: GemmRun) -> Check {
    let GemmCase { m, n, k, tb, beta, pad } = *case;
    let (lda, ldb, ldc) = (k + pad, if tb { k } else { n } + pad, n + pad);
    let mut r = common::rng((m * 10007 + n * 101 + k) as u64);
    let a: Vec<f32> = (0..m * lda).map(|_| r.gen_range(-1.0..1.0)).collect();
    let b: Vec<f32> = (0..(if tb { n } else { k }) * ldb).map(|_| r.gen_range(-1.0..1.0)).collect();
    const SENTINEL: f32 = 12345.0;
    let c0: Vec<f32> = (0..m * ldc)
        .map(|i| {
            if i % ldc >= n {
                SENTINEL
            } else if beta == 0.0 {
                f32::NAN
            } else {
                r.gen_range(-1.0..1.0)
            }
        })
        .collect();
    let (mut got, mut want) = (c0.clone(), c0.clone());
    f(case, &a, &b, &mut got);
    g(case, &a, &b, &mut want);
    for i in 0..m {
        for j in 0..ldc {
            let at = i * ldc + j;
            let (gv, wv) = (got[at], want[at]);
            if j >= n {
                if gv != SENTINEL || wv != SENTINEL {
                    return Err(format!("{name} {case:?}: padding C[{i}][{j}] written ({gv} / generic {wv})"));
                }
                continue;
            }
            let bv = |p: usize| if tb { b[j * ldb + p] } else { b[p * ldb + j] } as f64;
            let exact: f64 = (0..k).map(|p| a[i * lda + p] as f64 * bv(p)).sum::<f64>()
                + if beta == 0.0 { 0.0 } else { beta as f64 * c0[at] as f64 };
            let mag: f64 = (0..k).map(|p| (a[i * lda + p] as f64 * bv(p)).abs()).sum::<f64>()
                + if beta == 0.0 { 0.0 } else { (beta as f64 * c0[at] as f64).abs() };
            let tol = 4.0 * (k as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30;
            for (what, v) in [("variant", gv), ("generic", wv)] {
                if (v as f64 - exact).abs().is_nan() || (v as f64 - exact).abs() > tol {
                    return Err(format!("{name} {case:?}: {what} C[{i}][{j}] = {v}, exact {exact} (tol {tol:e})"));
                }
            }
            if (gv - wv).abs() as f64 > 2.0 * tol {
                return Err(format!("{name} {case:?}: C[{i}][{j}] = {gv} vs generic {wv}"));
            }
        }
    }
    Ok(())
}

/// `gemm_f32` through a context holding `table`.
fn gemm_with(table: &'static KernelTable) -> impl Fn(&GemmCase, &[f32], &[f32], &mut [f32]) {
    move |case: &GemmCase, a: &[f32], b: &[f32], c: &mut [f32]| {
        let GemmCase { m, n, k, tb, beta, pad } = *case;
        let mut cx = Context::with_table(table);
        let ldb = if tb { k } else { n } + pad;
        kiln_kernels::gemm_f32(m, n, k, a, k + pad, b, ldb, c, n + pad, tb, beta, &mut cx).unwrap();
    }
}

/// One test per table entry, running every variant this CPU has, plus the
/// list of entries tested (checked against `KernelTable::entries`).
macro_rules! variant_tests {
    ($($entry:ident: $kind:ident $(($bound:expr))?;)*) => {
        const TESTED: &[&str] = &[$(stringify!($entry)),*];
        $(
            #[test]
            fn $entry() {
                for t in variant_tables() {
                    let name = format!("{} {}", stringify!($entry), t.isa());
                    variant_tests!(@check $kind, $entry, t, name $(, $bound)?).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        )*
    };
    (@check unary, $entry:ident, $t:expr, $name:expr, $bound:expr) => {
        check_unary(&$name, |x, o| $t.$entry(x, o), |x, o| generic().$entry(x, o), $bound)
    };
    (@check conditioned, $entry:ident, $t:expr, $name:expr, $bound:expr) => {
        check_unary_conditioned(&$name, |x, o| $t.$entry(x, o), |x, o| generic().$entry(x, o), $bound)
    };
    (@check binary, $entry:ident, $t:expr, $name:expr) => {
        check_binary(&$name, |a, b, o| $t.$entry(a, b, o), |a, b, o| generic().$entry(a, b, o))
    };
    (@check reduce, $entry:ident, $t:expr, $name:expr) => {
        check_reduce(&$name, |x| $t.$entry(x), |x| generic().$entry(x))
    };
    (@check column_sum, $entry:ident, $t:expr, $name:expr) => {
        check_column_sum(&$name, |x, a| $t.$entry(x, a), |x, a| generic().$entry(x, a))
    };
    (@check exp_sum, $entry:ident, $t:expr, $name:expr, $bound:expr) => {
        check_exp_sum(&$name, |v, s| $t.$entry(v, s), |v, s| generic().$entry(v, s), $bound)
    };
    (@check gemm, $entry:ident, $t:expr, $name:expr) => {
        check_gemm(&$name, &gemm_with($t), &gemm_with(generic()))
    };
    (@check qlinear, $entry:ident, $t:expr, $name:expr, $act:expr) => {
        check_qlinear(&$name, $t, $act)
    };
    (@check layer_norm, $entry:ident, $t:expr, $name:expr) => {
        check_layer_norm(&$name, &|x, o, d, w, b| $t.$entry(x, o, d, w, b, 1e-5), &|x, o, d, w, b| generic().$entry(x, o, d, w, b, 1e-5))
    };
    (@check depthwise, $entry:ident, $t:expr, $name:expr) => {
        check_depthwise(&$name, $t)
    };
    (@check depthwise_nhwc, $entry:ident, $t:expr, $name:expr) => {
        check_depthwise_nhwc(&$name, $t)
    };
    (@check qdepthwise, $entry:ident, $t:expr, $name:expr) => {
        check_qdepthwise(&$name, $t)
    };
}

type LayerNormRun<'a> = &'a dyn Fn(&[f32], &mut [f32], usize, Option<&[f32]>, Option<&[f32]>);

/// Layer norm rows bit for bit against the generic ones (the same source
/// compiled per ISA): row lengths around the vector widths, three rows,
/// with and without weight and bias, offset data (the two-pass variance).
fn check_layer_norm(name: &str, f: LayerNormRun<'_>, g: LayerNormRun<'_>) -> Check {
    for &d in LENGTHS.iter().filter(|&&d| d > 0) {
        let x: Vec<f32> =
            inputs(3 * d, 4.0, d as u64).iter().map(|v| if v.is_finite() { v + 100.0 } else { 1.5 }).collect();
        let (w, b) = (inputs(d, 2.0, 7), inputs(d, 1.0, 8));
        let (w, b): (Vec<f32>, Vec<f32>) =
            (w.iter().map(|v| v.clamp(-2.0, 2.0)).collect(), b.iter().map(|v| v.clamp(-1.0, 1.0)).collect());
        for (wo, bo) in [(None, None), (Some(&w[..]), None), (None, Some(&b[..])), (Some(&w[..]), Some(&b[..]))] {
            let (mut got, mut want) = (vec![0.0f32; 3 * d], vec![0.0f32; 3 * d]);
            f(&x, &mut got, d, wo, bo);
            g(&x, &mut want, d, wo, bo);
            if let Some(i) = (0..3 * d).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                return Err(format!(
                    "{name}: d={d} w={} b={}: [{i}] {} vs generic {}",
                    wo.is_some(),
                    bo.is_some(),
                    got[i],
                    want[i]
                ));
            }
        }
    }
    Ok(())
}

/// The depthwise plane kernel through `conv_with(.., Depthwise)` against the
/// generic table's, bit for bit (the same operations in the same order):
/// 3×3 at stride 1 and 2, padding 0/1/2 (the border columns), dilation,
/// channel multiplier 2, odd widths (vector tails), 1-d and 3-d.
fn check_depthwise(name: &str, t: &'static KernelTable) -> Check {
    use common::{f32s, rand_f32, Buf};
    use kiln_kernels::{conv_with, ConvAlgorithm, ConvParams, DType};
    let mut r = common::rng(23);
    // (x shape, w shape, stride, pad, dilation)
    type Case = (&'static [usize], &'static [usize], &'static [usize], &'static [usize], &'static [usize]);
    let cases: [Case; 7] = [
        (&[1, 4, 57, 61], &[4, 1, 3, 3], &[1, 1], &[1, 1], &[1, 1]),
        (&[2, 3, 56, 37], &[3, 1, 3, 3], &[2, 2], &[1, 1], &[1, 1]),
        (&[1, 2, 9, 70], &[4, 1, 3, 3], &[1, 2], &[2, 0], &[1, 2]),
        (&[1, 5, 7, 7], &[5, 1, 5, 5], &[1, 1], &[2, 2], &[1, 1]),
        (&[1, 3, 1, 1], &[3, 1, 3, 3], &[1, 1], &[1, 1], &[1, 1]),
        (&[1, 3, 101], &[3, 1, 3], &[2], &[1], &[1]),
        (&[1, 2, 5, 6, 19], &[2, 1, 3, 3, 3], &[1, 1, 1], &[1, 1, 1], &[1, 1, 1]),
    ];
    for (xs, ws, stride, padding, dilation) in cases {
        let sd = xs.len() - 2;
        let mut os = vec![xs[0], ws[0]];
        for i in 0..sd {
            os.push((xs[2 + i] + 2 * padding[i] - dilation[i] * (ws[2 + i] - 1) - 1) / stride[i] + 1);
        }
        let x = f32s(xs, &rand_f32(&mut r, xs.iter().product()));
        let w = f32s(ws, &rand_f32(&mut r, ws.iter().product()));
        let b = f32s(&[ws[0]], &rand_f32(&mut r, ws[0]));
        let p = ConvParams { stride, padding, dilation, groups: xs[1] };
        let run = |table: &'static KernelTable| {
            let mut out = Buf::zeros(DType::F32, &os);
            let mut cx = Context::with_table(table);
            conv_with(x.r(), w.r(), Some(b.r()), &p, out.w(), &mut cx, ConvAlgorithm::Depthwise)
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(out.get::<f32>())
        };
        let (got, want) = (run(t)?, run(generic())?);
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(format!("{name} {xs:?}*{ws:?} [{i}]: {} vs {}", got[i], want[i]));
        }
    }
    Ok(())
}

/// Channels-last depthwise rows (`conv_fused_channels_last` on a depthwise
/// weight) bit for bit against the generic table: channel counts around
/// the 16/8/4-wide blocks, strides, padding, dilation, 5×5 kernels, batch 2,
/// rows wide enough for the sliding blocks.
fn check_depthwise_nhwc(name: &str, t: &'static KernelTable) -> Check {
    use common::{f32s, rand_f32, Buf};
    use kiln_kernels::{conv_fused_channels_last, ConvParams, DType, TensorEpilogue};
    let mut r = common::rng(29);
    // (x shape [N, H, W, C], kernel, stride, pad, dilation)
    type Case = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], [usize; 2]);
    let cases: [Case; 13] = [
        ([1, 9, 11, 16], [3, 3], [1, 1], [1, 1], [1, 1]),
        // Rows wide enough for the sliding blocks (3 and 5 wide, stride 1
        // and 2, with and without padding, channel tails).
        ([1, 5, 29, 32], [3, 3], [1, 1], [1, 1], [1, 1]),
        ([2, 6, 27, 40], [3, 3], [2, 2], [1, 1], [1, 1]),
        ([1, 4, 30, 21], [3, 3], [1, 1], [0, 0], [1, 1]),
        ([1, 7, 26, 24], [5, 5], [1, 1], [2, 2], [1, 1]),
        ([1, 9, 31, 19], [5, 5], [2, 2], [2, 2], [1, 1]),
        ([1, 5, 25, 3], [3, 3], [1, 2], [1, 1], [1, 1]),
        ([1, 5, 6, 100], [3, 3], [1, 1], [1, 1], [1, 1]),
        ([2, 8, 7, 33], [3, 3], [2, 2], [1, 1], [1, 1]),
        ([1, 6, 9, 7], [3, 3], [1, 2], [2, 0], [1, 2]),
        ([1, 7, 7, 24], [5, 5], [1, 1], [2, 2], [1, 1]),
        ([1, 1, 1, 3], [3, 3], [1, 1], [1, 1], [1, 1]),
        ([1, 5, 6, 40], [3, 3], [2, 1], [0, 1], [1, 1]),
    ];
    for (xs, k, stride, padding, dilation) in cases {
        let c = xs[3];
        let o = |i: usize| (xs[1 + i] + 2 * padding[i] - dilation[i] * (k[i] - 1) - 1) / stride[i] + 1;
        let (os, ws) = ([xs[0], o(0), o(1), c], [c, 1, k[0], k[1]]);
        let x = f32s(&xs, &rand_f32(&mut r, xs.iter().product()));
        let w = f32s(&ws, &rand_f32(&mut r, ws.iter().product()));
        let b = f32s(&[c], &rand_f32(&mut r, c));
        let p = ConvParams { stride: &stride, padding: &padding, dilation: &dilation, groups: c };
        let run = |table: &'static KernelTable| {
            let mut out = Buf::zeros(DType::F32, &os);
            let mut cx = Context::with_table(table);
            let e = TensorEpilogue::default();
            conv_fused_channels_last(x.r(), w.r(), None, Some(b.r()), &e, &p, out.w(), &mut cx)
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(out.get::<f32>())
        };
        let (got, want) = (run(t)?, run(generic())?);
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(format!("{name} {xs:?}*{ws:?} [{i}]: {} vs {}", got[i], want[i]));
        }
    }
    Ok(())
}

/// The table's int8 depthwise row through `quant::qconv_depthwise` against
/// the generic table's, bit for bit (`tests/quant.rs` runs every variant
/// on many more shapes and epilogues): channel tails, stride 1 and 2, a
/// dilated and a 5×5 kernel, a bias and a ReLU6, f32 and i8 results.
fn check_qdepthwise(name: &str, t: &'static KernelTable) -> Check {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_depthwise, ActQuant, DepthwiseQWeights};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let mut r = common::rng(31);
    // (x shape [N, H, W, C], kernel, stride, pad, dilation)
    type Case = ([usize; 4], [usize; 2], usize, usize, usize);
    let cases: [Case; 5] = [
        ([1, 9, 11, 16], [3, 3], 1, 1, 1),
        ([2, 8, 7, 37], [3, 3], 2, 1, 1),
        ([1, 7, 9, 5], [5, 5], 1, 2, 1),
        ([1, 9, 10, 24], [3, 3], 1, 2, 2),
        ([1, 6, 13, 100], [3, 3], 2, 0, 1),
    ];
    for (xs, k, stride, pad, dil) in cases {
        let c = xs[3];
        let o = |i: usize| (xs[1 + i] + 2 * pad - dil * (k[i] - 1) - 1) / stride + 1;
        let os = [xs[0], o(0), o(1), c];
        let x: Vec<f32> = (0..xs.iter().product()).map(|_| r.gen_range(-3.0..3.0)).collect();
        let q: Vec<i8> = (0..c * k[0] * k[1]).map(|_| r.gen()).collect();
        let scales: Vec<f32> = (0..c).map(|_| r.gen_range(0.001..0.02)).collect();
        let bias: Vec<f32> = (0..c).map(|_| r.gen_range(-0.5..0.5)).collect();
        let w = DepthwiseQWeights::new(&q, &[c, 1, k[0], k[1]], &scales).map_err(|e| e.to_string())?;
        let p = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[dil; 2], groups: c };
        let act = ActQuant::Static { scale: 0.0231, zero_point: -9 };
        let e = TensorEpilogue {
            activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
            residual: None,
            residual_first: false,
        };
        let xr = TensorRef { dtype: DType::F32, shape: &xs, data: bytemuck::cast_slice(&x) };
        let len: usize = os.iter().product();
        for quant in [None, Some((0.0173f32, 5))] {
            let run = |table: &'static KernelTable| {
                let (mut f, mut g) = (vec![0f32; len], vec![0i8; len]);
                let (dtype, data): (DType, &mut [u8]) = match quant {
                    Some(_) => (DType::I8, bytemuck::cast_slice_mut(&mut g)),
                    None => (DType::F32, bytemuck::cast_slice_mut(&mut f)),
                };
                let out = TensorMut { dtype, shape: &os, data };
                let mut cx = Context::with_table(table);
                qconv_depthwise(&mut cx, xr, &w, act, Some(&bias), &e, &p, out, quant).map_err(|e| e.to_string())?;
                Ok::<_, String>((f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), g))
            };
            let (got, want) = (run(t)?, run(generic())?);
            if got != want {
                return Err(format!("{name} {xs:?} k {k:?} stride {stride}, output {quant:?}: differs from generic"));
            }
        }
    }
    Ok(())
}

/// The table's integer kernels through `quant::qlinear` against the generic
/// table's (`tests/quant.rs` runs every variant on many more shapes): bit
/// for bit with dynamic int8 activations (which also runs the row
/// quantizer), within the FMA's rounding for weight-only int4.
fn check_qlinear(name: &str, t: &'static KernelTable, act: kiln_kernels::quant::ActQuant) -> Check {
    use kiln_kernels::quant::{qlinear, ActQuant, PackedQWeights, QBits, QWeights};
    let mut r = common::rng(17);
    let (m, n, k) = (7, 45, 96);
    let bits = if act == ActQuant::Float { QBits::I4 } else { QBits::I8 };
    let group = if act == ActQuant::Float { 32 } else { k };
    let data: Vec<u8> = (0..n * k / if bits == QBits::I4 { 2 } else { 1 }).map(|_| r.gen()).collect();
    let scales: Vec<f32> = (0..n * k / group).map(|_| r.gen_range(0.001..0.02)).collect();
    let w = QWeights { n, k, bits, group, data: &data, scales: &scales, zero_points: None };
    let packed = PackedQWeights::pack(&w).map_err(|e| e.to_string())?;
    let x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-3.0..3.0)).collect();
    let (mut got, mut want) = (vec![0f32; m * n], vec![0f32; m * n]);
    qlinear(&mut Context::with_table(t), &x, m, &packed, act, None, &mut got).map_err(|e| e.to_string())?;
    qlinear(&mut Context::with_table(generic()), &x, m, &packed, act, None, &mut want).map_err(|e| e.to_string())?;
    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
        let ok =
            if act == ActQuant::Float { (a - b).abs() <= 1e-5 * (1.0 + b.abs()) } else { a.to_bits() == b.to_bits() };
        if !ok {
            return Err(format!("{name} [{i}]: {a} vs {b}"));
        }
    }
    Ok(())
}

// Bounds: exp measured ≤ 1 ulp from glibc's expf over all 2^32 inputs, tanh
// ≤ 2; sigmoid and silu add 1 + e^-x, whose rounding can turn exp's 1 ulp
// into 4 (both generic and AVX2 stay within 2 ulp of the exact value). erf
// measured ≤ 1 ulp from the (f64, correctly rounded in practice) generic
// one over every 97th bit pattern, exact GELU ≤ 6 (at the switch from erf
// to the erfc tail). The tanh GELU computes its argument z in f32, whose
// rounding the left tail e^{2z} amplifies by |2z| (up to ~180 ulp near
// x = -10): it is held to 4 ulp or to what the generic function varies by
// within 2 ulp of the input (`check_unary_conditioned`).
variant_tests! {
    gemm_f32: gemm;
    exp_f32: unary(2);
    sigmoid_f32: unary(4);
    silu_f32: unary(4);
    tanh_f32: unary(2);
    erf_f32: unary(2);
    gelu_f32: unary(8);
    gelu_tanh_f32: conditioned(4);
    add_f32: binary;
    sub_f32: binary;
    mul_f32: binary;
    div_f32: binary;
    max_f32: reduce;
    exp_sum_f32: exp_sum(2);
    column_sum_f32: column_sum;
    layer_norm_rows_f32: layer_norm;
    depthwise_plane_f32: depthwise;
    depthwise_nhwc_f32: depthwise_nhwc;
    qgemm_i8: qlinear(kiln_kernels::quant::ActQuant::DynamicPerRow);
    qlinear_weight_only: qlinear(kiln_kernels::quant::ActQuant::Float);
    quantize_row_i8: qlinear(kiln_kernels::quant::ActQuant::DynamicPerRow);
    qconv_depthwise_i8: qdepthwise;
}

/// The v4 table's 16-lane math is the AVX2 code operation for operation:
/// the v3 table's bits on every input (0 ulp). Epilogues rely on it: a v4
/// GEMM applies an activation in its registers with this code where the
/// unfused kernel of a v4 table calls the slice function.
#[test]
fn v4_math_is_v3_bit_for_bit() {
    let (Some(v3), Some(v4)) = (KernelTable::for_isa(Isa::X86_64V3), KernelTable::for_isa(Isa::X86_64V4)) else {
        println!("note: skipping: this CPU or build lacks the v3 or v4 table");
        return;
    };
    type Unary = fn(&KernelTable, &[f32], &mut [f32]);
    let entries: [(&str, Unary); 6] = [
        ("exp", KernelTable::exp_f32),
        ("sigmoid", KernelTable::sigmoid_f32),
        ("silu", KernelTable::silu_f32),
        ("tanh", KernelTable::tanh_f32),
        ("erf", KernelTable::erf_f32),
        ("gelu", KernelTable::gelu_f32),
    ];
    for (name, f) in entries {
        check_unary(&format!("{name} v4 vs v3"), |x, o| f(v4, x, o), |x, o| f(v3, x, o), 0)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The SVE table's exp, sigmoid and SiLU are the NEON code per lane: the
/// NEON table's bits (NaN payloads and signs included) on every length
/// around the vector widths, misaligned starts, the specials and every
/// 4099th f32 bit pattern, at whatever vector length this CPU has.
#[test]
fn sve_math_is_neon_bit_for_bit() {
    let (Some(sve), Some(neon)) = (KernelTable::for_isa(Isa::Aarch64Sve), KernelTable::for_isa(Isa::Aarch64Neon))
    else {
        println!("note: skipping: this CPU or build has no SVE table");
        return;
    };
    type Unary = fn(&KernelTable, &[f32], &mut [f32]);
    let entries: [(&str, Unary); 3] =
        [("exp", KernelTable::exp_f32), ("sigmoid", KernelTable::sigmoid_f32), ("silu", KernelTable::silu_f32)];
    for (name, f) in entries {
        check_unary_bits(&format!("{name} sve vs neon"), |x, o| f(sve, x, o), |x, o| f(neon, x, o))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A unary entry (`f`) against another (`g`), every output bit for bit
/// (NaNs included), writing nothing past the input.
fn check_unary_bits(name: &str, f: impl Fn(&[f32], &mut [f32]), g: impl Fn(&[f32], &mut [f32])) -> Check {
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for (s, &n) in LENGTHS.iter().enumerate() {
        for range in [1.0f32, 20.0, 120.0] {
            cases.push(inputs(n, range, s as u64));
        }
    }
    let nan_payload = f32::from_bits(0xffc0_1234);
    cases.push(vec![nan_payload, -nan_payload, f32::from_bits(0x7f80_0001), 1.0, nan_payload]);
    cases.push((0..(1u64 << 32)).step_by(4099).map(|b| f32::from_bits(b as u32)).collect());
    for x in &cases {
        for off in [0usize, 1, 3] {
            let Some(xs) = x.get(off..) else { continue };
            let (mut got, mut want) = (vec![7.5f32; xs.len() + 2], vec![7.5f32; xs.len() + 2]);
            f(xs, &mut got);
            g(xs, &mut want);
            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                let xi = xs.get(i).copied().unwrap_or(f32::NAN);
                return Err(format!(
                    "{name}: len {} off {off} [{i}] x={xi:e}: {:#x} vs {:#x}",
                    xs.len(),
                    got[i].to_bits(),
                    want[i].to_bits()
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_entry_is_tested() {
    let names: Vec<&str> = generic().entries().iter().map(|&(e, _)| e).collect();
    assert_eq!(names, TESTED);
}

/// A plugged table that silently kept the generic code would make every
/// variant test above vacuous.
#[test]
fn plugged_tables_override_every_entry() {
    for (entry, variant) in generic().entries() {
        assert!(variant.starts_with("generic"), "{entry}: {variant}");
    }
    for t in variant_tables() {
        assert_ne!(t.isa(), Isa::Generic);
        for (entry, variant) in t.entries() {
            assert!(!variant.starts_with("generic"), "{} {entry} is {variant}", t.isa());
        }
    }
}

#[test]
fn detection_picks_the_best_supported_table() {
    let isa = Isa::detect();
    assert!(isa.is_supported());
    assert!(std::ptr::eq(kiln_kernels::best(), KernelTable::for_isa(isa).unwrap()));
    assert_eq!(Context::new().isa(), isa);
    assert_eq!(Context::with_table(generic()).isa(), Isa::Generic);
    assert!(std::ptr::eq(Context::with_table(generic()).table(), generic()));
    // Without the `isa` feature no plug-in is compiled: every CPU runs generic.
    #[cfg(not(feature = "isa"))]
    assert_eq!(isa, Isa::Generic);
    #[cfg(all(feature = "isa", target_arch = "x86_64"))]
    {
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        assert_eq!(Isa::X86_64V3.is_supported(), v3);
        assert_eq!(Isa::X86_64V4.is_supported(), v3 && is_x86_feature_detected!("avx512f"));
        assert!(!Isa::Aarch64Neon.is_supported());
        if v3 {
            assert_eq!(KernelTable::for_isa(Isa::X86_64V3).unwrap().gemm_tile(), (6, 16));
        }
    }
    #[cfg(all(feature = "isa", target_arch = "aarch64"))]
    {
        // NEON is baseline: every aarch64 build runs the NEON table; the
        // SVE one is on top where the CPU has SVE, and the SME one (NEON's
        // with the SME GEMM) is the best where the kernel reports SME.
        let sve = std::arch::is_aarch64_feature_detected!("sve");
        let sme = sme::reported();
        let best = if sme {
            Isa::Aarch64Sme
        } else if sve {
            Isa::Aarch64Sve
        } else {
            Isa::Aarch64Neon
        };
        assert_eq!(isa, best);
        assert!(Isa::Aarch64Neon.is_supported());
        assert_eq!(Isa::Aarch64Sve.is_supported(), sve);
        assert_eq!(Isa::Aarch64Sme.is_supported(), sme);
        assert!(!Isa::X86_64V3.is_supported() && !Isa::X86_64V4.is_supported());
        assert_eq!(KernelTable::for_isa(Isa::Aarch64Neon).unwrap().gemm_tile(), (8, 12));
        // The SVE GEMM runs where SVE is (its tile as wide as the vector
        // length allows, up to 512 bits) and nowhere else.
        let lanes = sve_lanes();
        println!("SVE: {sve}, {lanes:?} f32 lanes; SME: {sme}");
        // The f32 entries (the integer ones, `q…`, take the SVE int8
        // variants on the NEON table too: `quant::variants`).
        let listed = |t: &KernelTable| t.entries().iter().any(|(e, v)| !e.starts_with('q') && v.starts_with("sve"));
        assert!(!listed(KernelTable::for_isa(Isa::Aarch64Neon).unwrap()));
        if let Some(lanes) = lanes {
            let t = KernelTable::for_isa(Isa::Aarch64Sve).unwrap();
            let w = [16, 8, 4].into_iter().find(|&w| w <= lanes).unwrap();
            assert_eq!(t.gemm_tile(), (8, 3 * w));
            let want = format!("sve_8x{}", 3 * w);
            assert!(t.entries().iter().any(|&(e, v)| e == "gemm_f32" && v == want), "{t:?}");
            assert_eq!(std::ptr::eq(kiln_kernels::best(), t), !sme);
        } else {
            assert!(!listed(kiln_kernels::best()));
        }
    }
    #[cfg(not(all(feature = "isa", target_arch = "aarch64")))]
    assert!(!Isa::Aarch64Neon.is_supported() && !Isa::Aarch64Sve.is_supported() && !Isa::Aarch64Sme.is_supported());
    assert_eq!(generic().gemm_tile(), (4, 8));
    println!("detected {isa}: {:?}", kiln_kernels::best());
}

/// The checks themselves: each must reject a plausible bug.
#[test]
fn checks_reject_wrong_variants() {
    let g = generic();
    // exp off by 3 ulp on one value; exp skipping the tail; exp writing past x.
    let off_by_3 = |x: &[f32], o: &mut [f32]| {
        g.exp_f32(x, o);
        for v in o.iter_mut().take(x.len()) {
            if *v > 2.0 && *v < 2.5 {
                *v = f32::from_bits(v.to_bits() + 3);
            }
        }
    };
    assert!(check_unary("exp", off_by_3, |x, o| g.exp_f32(x, o), 2).is_err());
    let no_tail = |x: &[f32], o: &mut [f32]| {
        let n = x.len() / 8 * 8;
        g.exp_f32(&x[..n], &mut o[..n]);
    };
    assert!(check_unary("exp", no_tail, |x, o| g.exp_f32(x, o), 2).is_err());
    let overrun = |x: &[f32], o: &mut [f32]| {
        g.exp_f32(x, o);
        if let Some(v) = o.get_mut(x.len()) {
            *v = 0.0;
        }
    };
    assert!(check_unary("exp", overrun, |x, o| g.exp_f32(x, o), 2).is_err());
    // Layer norm with another eps; one ignoring the bias.
    let want: LayerNormRun<'_> = &|x, o, d, w, b| g.layer_norm_rows_f32(x, o, d, w, b, 1e-5);
    let other_eps: LayerNormRun<'_> = &|x, o, d, w, b| g.layer_norm_rows_f32(x, o, d, w, b, 1e-3);
    assert!(check_layer_norm("layer_norm", other_eps, want).is_err());
    let no_bias: LayerNormRun<'_> = &|x, o, d, w, _| g.layer_norm_rows_f32(x, o, d, w, None, 1e-5);
    assert!(check_layer_norm("layer_norm", no_bias, want).is_err());
    let inf_to_max = |x: &[f32], o: &mut [f32]| {
        g.exp_f32(x, o);
        for (v, &xi) in o.iter_mut().zip(x) {
            if xi == f32::INFINITY {
                *v = f32::MAX;
            }
        }
    };
    assert!(check_unary("exp", inf_to_max, |x, o| g.exp_f32(x, o), 2).is_err());
    // add rounding one lane differently; add writing as far as b reaches.
    let add_1ulp = |a: &[f32], b: &[f32], o: &mut [f32]| {
        g.add_f32(a, b, o);
        if let Some(v) = o.get_mut(5) {
            *v = f32::from_bits(v.to_bits() ^ 1);
        }
    };
    assert!(check_binary("add", add_1ulp, |a, b, o| g.add_f32(a, b, o)).is_err());
    let add_long = |a: &[f32], b: &[f32], o: &mut [f32]| {
        g.add_f32(a, b, o);
        for (v, &y) in o.iter_mut().zip(b).skip(a.len()) {
            *v = y;
        }
    };
    assert!(check_binary("add", add_long, |a, b, o| g.add_f32(a, b, o)).is_err());
    // max returning the other zero, or a different NaN.
    let max_zero = |x: &[f32]| {
        let m = g.max_f32(x);
        if m == 0.0 {
            0.0
        } else {
            m
        }
    };
    assert!(check_reduce("max", max_zero, |x| g.max_f32(x)).is_err());
    let max_nan = |x: &[f32]| {
        let m = g.max_f32(x);
        if m.is_nan() {
            f32::NAN
        } else {
            m
        }
    };
    assert!(check_reduce("max", max_nan, |x| g.max_f32(x)).is_err());
    // exp_sum dropping the last element from the sum.
    let short_sum = |v: &mut [f32], s: f32| {
        let sum = g.exp_sum_f32(v, s);
        sum - v.last().map_or(0.0, |&e| e as f64)
    };
    assert!(check_exp_sum("exp_sum", short_sum, |v, s| g.exp_sum_f32(v, s), 2).is_err());
    // column sums skipping the last row, or adding a row's columns in
    // pairs (another order).
    let skip_last = |x: &[f32], a: &mut [f64]| {
        let c = a.len().max(1);
        g.column_sum_f32(&x[..x.len().saturating_sub(c) / c * c], a)
    };
    assert!(check_column_sum("column_sum", skip_last, |x, a| g.column_sum_f32(x, a)).is_err());
    let pairs = |x: &[f32], a: &mut [f64]| {
        let c = a.len().max(1);
        for rows in x.chunks(2 * c) {
            for (j, acc) in a.iter_mut().enumerate() {
                *acc += rows.iter().skip(j).step_by(c).fold(0.0, |s, &v| s + v as f64);
            }
        }
    };
    assert!(check_column_sum("column_sum", pairs, |x, a| g.column_sum_f32(x, a)).is_err());
    // GEMM writing into C's padding, dropping the last row's update, or
    // reading C when beta is 0.
    let generic_gemm = gemm_with(g);
    let pads = |case: &GemmCase, a: &[f32], b: &[f32], c: &mut [f32]| {
        generic_gemm(case, a, b, c);
        if case.pad > 0 {
            c[case.n] = 0.0;
        }
    };
    assert!(check_gemm("gemm", &pads, &gemm_with(g)).is_err());
    let last_row = |case: &GemmCase, a: &[f32], b: &[f32], c: &mut [f32]| {
        let keep: Vec<f32> = c.to_vec();
        generic_gemm(case, a, b, c);
        let ldc = case.n + case.pad;
        if case.m > 1 {
            let r = (case.m - 1) * ldc;
            c[r..r + case.n].copy_from_slice(&keep[r..r + case.n]);
        }
    };
    assert!(check_gemm("gemm", &last_row, &gemm_with(g)).is_err());
    let reads_c = |case: &GemmCase, a: &[f32], b: &[f32], c: &mut [f32]| {
        let beta = if case.beta == 0.0 { 1.0 } else { case.beta };
        generic_gemm(&GemmCase { beta, ..*case }, a, b, c);
    };
    assert!(check_gemm("gemm", &reads_c, &gemm_with(g)).is_err());
    // A GEMM one ulp off in one element (the last, a tile's edge).
    let last_ulp = |case: &GemmCase, a: &[f32], b: &[f32], c: &mut [f32]| {
        generic_gemm(case, a, b, c);
        let at = (case.m - 1) * (case.n + case.pad) + case.n - 1;
        c[at] = f32::from_bits(c[at].to_bits() ^ 1);
    };
    assert!(check_gemm_bits("gemm", &last_ulp, &gemm_with(g)).is_err());
    // exp with another NaN payload; exp writing past x.
    let quiet_nan = |x: &[f32], o: &mut [f32]| {
        g.exp_f32(x, o);
        o.iter_mut().take(x.len()).filter(|v| v.is_nan()).for_each(|v| *v = f32::NAN);
    };
    assert!(check_unary_bits("exp", quiet_nan, |x, o| g.exp_f32(x, o)).is_err());
    assert!(check_unary_bits("exp", overrun, |x, o| g.exp_f32(x, o)).is_err());
}

/// The kernels that call through a context's table do so: with each table
/// (generic included) their f32 results are bit-identical to that table's
/// entries applied by hand, and within tolerance of the generic table's.
#[test]
fn kernels_route_through_the_context_table() {
    use common::{assert_close, f32s, to64, Buf};
    use kiln_kernels::{binary_cx, linear, matmul, softmax_cx, unary_cx, BinaryOp, DType, UnaryOp};
    let mut tables = variant_tables();
    tables.push(generic());
    let mut r = common::rng(9);
    let x: Vec<f32> = (0..6 * 37).map(|_| r.gen_range(-6.0..6.0)).collect();
    let y: Vec<f32> = (0..6 * 37).map(|_| r.gen_range(0.5..6.0)).collect();
    let xb = f32s(&[6, 37], &x);
    for t in tables {
        let mut cx = Context::with_table(t);
        let mut gx = Context::with_table(generic());
        let run = |cx: &mut Context, f: &dyn Fn(&mut Context, &mut Buf)| {
            let mut o = Buf::zeros(DType::F32, &[6, 37]);
            f(cx, &mut o);
            o.get::<f32>()
        };
        // unary: the table's entry over the whole buffer.
        for (op, entry) in [
            (UnaryOp::Exp, KernelTable::exp_f32 as fn(&KernelTable, &[f32], &mut [f32])),
            (UnaryOp::Sigmoid, KernelTable::sigmoid_f32),
            (UnaryOp::Silu, KernelTable::silu_f32),
            (UnaryOp::Tanh, KernelTable::tanh_f32),
        ] {
            let got = run(&mut cx, &|cx, o| unary_cx(op, xb.r(), o.w(), cx).unwrap());
            let mut want = vec![0f32; x.len()];
            entry(t, &x, &mut want);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} unary {op:?}", t.isa());
            let g = run(&mut gx, &|cx, o| unary_cx(op, xb.r(), o.w(), cx).unwrap());
            assert_close(&to64(&got), &to64(&g), 1e-6, 1e-30, &format!("{} unary {op:?} vs generic", t.isa()));
        }
        // binary, same shapes and broadcasting a row: the table's entry per row.
        let yb = f32s(&[6, 37], &y);
        let row = f32s(&[37], &y[..37]);
        for (op, entry) in [
            (BinaryOp::Add, KernelTable::add_f32 as fn(&KernelTable, &[f32], &[f32], &mut [f32])),
            (BinaryOp::Sub, KernelTable::sub_f32),
            (BinaryOp::Mul, KernelTable::mul_f32),
            (BinaryOp::Div, KernelTable::div_f32),
        ] {
            for other in [&yb, &row] {
                let got = run(&mut cx, &|cx, o| binary_cx(op, xb.r(), other.r(), o.w(), cx).unwrap());
                let ov = other.get::<f32>();
                let mut want = vec![0f32; x.len()];
                for (xr, wr) in x.chunks(37).zip(want.chunks_mut(37)) {
                    entry(t, xr, &ov[..37], wr);
                }
                if other.shape.len() == 2 {
                    entry(t, &x, &ov, &mut want);
                }
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} binary {op:?}", t.isa());
            }
        }
        // softmax along the last axis: max, exp-sum, scale by hand.
        for log in [false, true] {
            let got = run(&mut cx, &|cx, o| softmax_cx(xb.r(), 1, log, o.w(), cx).unwrap());
            let mut want = x.clone();
            for (wr, xr) in want.chunks_mut(37).zip(x.chunks(37)) {
                let max = t.max_f32(xr);
                let sum = t.exp_sum_f32(wr, max);
                for (w, &v) in wr.iter_mut().zip(xr) {
                    *w = if log { v - max - sum.ln() as f32 } else { *w * (1.0 / sum) as f32 };
                }
            }
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} softmax log={log}", t.isa());
            let g = run(&mut gx, &|cx, o| softmax_cx(xb.r(), 1, log, o.w(), cx).unwrap());
            assert_close(&to64(&got), &to64(&g), 1e-6, 1e-7, &format!("{} softmax vs generic", t.isa()));
        }
        // matmul and linear: the table's GEMM.
        let w: Vec<f32> = (0..37 * 37).map(|_| r.gen_range(-1.0..1.0)).collect();
        let wb = f32s(&[37, 37], &w);
        let got = run(&mut cx, &|cx, o| matmul(xb.r(), wb.r(), o.w(), cx).unwrap());
        let mut want = vec![0f32; 6 * 37];
        kiln_kernels::gemm_f32(6, 37, 37, &x, 37, &w, 37, &mut want, 37, false, 0.0, &mut cx).unwrap();
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} matmul", t.isa());
        let bias: Vec<f32> = (0..37).map(|_| r.gen_range(-1.0..1.0)).collect();
        let bb = f32s(&[37], &bias);
        let got = run(&mut cx, &|cx, o| linear(xb.r(), wb.r(), Some(bb.r()), o.w(), cx).unwrap());
        let g = run(&mut gx, &|cx, o| linear(xb.r(), wb.r(), Some(bb.r()), o.w(), cx).unwrap());
        assert_close(&to64(&got), &to64(&g), 1e-5, 1e-5, &format!("{} linear vs generic", t.isa()));
    }
}

/// The SME table (`Isa::Aarch64Sme`: the NEON table with the SME `fmopa`
/// GEMM): listed exactly where Linux reports SME, with the tile its
/// streaming vector length gives, and its GEMM bit for bit the NEON
/// kernel's on every combine and epilogue, thread count and shape (edge
/// tiles, K = 1, several K slices). The aarch64 CI runs these under qemu's
/// `max` CPU at streaming vector lengths of 128, 256, 512 and 1024 bits.
mod sme {
    use super::*;
    use common::{f32s, rand_f32, Buf};
    use kiln_kernels::{Activation, ConvParams, DType, LinearEpilogue, PackedB, PackedConv, TensorEpilogue};

    /// Whether Linux reports SME with the single-precision FMOPA
    /// (HWCAP2_SME, HWCAP2_SME_F32F32), read here independently of the
    /// crate's own detection.
    pub fn reported() -> bool {
        #[cfg(all(feature = "isa", target_arch = "aarch64", target_os = "linux"))]
        {
            extern "C" {
                fn getauxval(t: std::os::raw::c_ulong) -> std::os::raw::c_ulong;
            }
            // SAFETY: getauxval has no preconditions; 26 is AT_HWCAP2.
            let caps = unsafe { getauxval(26) } as u64;
            caps & (1 << 23) != 0 && caps & (1 << 29) != 0
        }
        #[cfg(not(all(feature = "isa", target_arch = "aarch64", target_os = "linux")))]
        {
            false
        }
    }

    /// The streaming vector length in bytes; only where SME is reported.
    #[cfg(target_arch = "aarch64")]
    fn svl_bytes() -> usize {
        let svl: usize;
        // SAFETY: RDSVL exists on every SME CPU, outside streaming mode too.
        unsafe { std::arch::asm!(".arch_extension sme", "rdsvl {x}, #1", x = out(reg) svl, options(nomem, nostack)) };
        svl
    }

    #[cfg(not(target_arch = "aarch64"))]
    fn svl_bytes() -> usize {
        unreachable!("SME is only reported on aarch64")
    }

    /// The SME and NEON tables, or None (noted) where SME is not reported.
    fn tables() -> Option<(&'static KernelTable, &'static KernelTable)> {
        let pair = KernelTable::for_isa(Isa::Aarch64Sme).zip(KernelTable::for_isa(Isa::Aarch64Neon));
        if pair.is_none() {
            println!("note: skipping the SME GEMM checks: this CPU or build has no SME");
        }
        pair
    }

    /// The first element where `got` and `want` differ in bits (two NaNs
    /// are the same: ZA's outer products give the default NaN where NEON
    /// propagates an input NaN's payload).
    fn first_difference(got: &[f32], want: &[f32]) -> Option<usize> {
        assert_eq!(got.len(), want.len());
        (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits() && !(got[i].is_nan() && want[i].is_nan()))
    }

    fn assert_same(what: &str, got: &[f32], want: &[f32]) {
        if let Some(i) = first_difference(got, want) {
            panic!(
                "{what}: [{i}] SME {:e} ({:#x}) vs NEON {:e} ({:#x})",
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            );
        }
    }

    #[test]
    fn sme_table_is_listed_where_sme_is_reported() {
        let listed = KernelTable::for_isa(Isa::Aarch64Sme);
        assert_eq!(listed.is_some(), reported(), "SME table listed: {}", listed.is_some());
        assert_eq!(Isa::Aarch64Sme.name(), "aarch64-sme");
        let Some((sme, neon)) = tables() else { return };
        assert_eq!(Isa::detect(), Isa::Aarch64Sme);
        let svl = svl_bytes();
        let side = 2 * (svl / 4).min(16);
        println!("streaming vector length {} bits: SME tile {side}x{side}", svl * 8);
        assert_eq!(sme.gemm_tile(), (side, side));
        let (entries, neon_entries) = (sme.entries(), neon.entries());
        assert_eq!(entries[0].0, "gemm_f32");
        assert_eq!(entries[0].1, format!("sme_fmopa_{side}x{side}"));
        assert_eq!(entries[1..], neon_entries[1..], "the rest of the SME table is NEON's");
        assert!(format!("{sme:?}").contains("aarch64-sme"));
    }

    /// `gemm_f32` on `table` at `threads` threads, C's padding a sentinel
    /// and C NaN where beta is 0 (it must not be read).
    fn gemm_on(table: &'static KernelTable, threads: usize, case: &GemmCase, a: &[f32], b: &[f32]) -> Vec<f32> {
        let GemmCase { m, n, k, tb, beta, pad } = *case;
        let ldc = n + pad;
        let mut r = common::rng(7);
        let mut c: Vec<f32> = (0..m * ldc)
            .map(|i| {
                if i % ldc >= n {
                    12345.0
                } else if beta == 0.0 {
                    f32::NAN
                } else {
                    r.gen_range(-1.0..1.0)
                }
            })
            .collect();
        let mut cx = Context::with_table(table).with_threads(threads);
        let ldb = if tb { k } else { n } + pad;
        kiln_kernels::gemm_f32(m, n, k, a, k + pad, b, ldb, &mut c, ldc, tb, beta, &mut cx).unwrap();
        c
    }

    /// Shapes around the SME tile (`side`): edge rows and columns on both
    /// sides of one and two tiles, K = 1, K inside one slice, and K past
    /// one and two 512-deep slices (the later slices accumulate).
    fn shapes(side: usize) -> Vec<(usize, usize, usize)> {
        let dims = [1, side - 1, side + 1, 2 * side + 3];
        let mut shapes = Vec::new();
        for (i, &m) in dims.iter().enumerate() {
            for (j, &n) in dims.iter().enumerate() {
                shapes.push((m, n, [1, 7, 33, 513][(i + j) % 4]));
            }
        }
        shapes.extend([(side, side, 1), (side, 2 * side, 600), (2 * side, side, 17), (3, 70, 1030), (9, 1030, 3)]);
        shapes
    }

    #[test]
    fn sme_gemm_is_neon_bit_for_bit() {
        let Some((sme, neon)) = tables() else { return };
        let side = sme.gemm_tile().0;
        for (m, n, k) in shapes(side) {
            let mut r = common::rng((m * 1009 + n * 31 + k) as u64);
            for tb in [false, true] {
                let pad = (m + n) % 2 * 3;
                let a = rand_f32(&mut r, m * (k + pad));
                let b = rand_f32(&mut r, (if tb { n } else { k }) * (if tb { k } else { n } + pad));
                // beta 0, 1 and 0.5: the overwrite, accumulate and scale combines.
                for beta in [0.0f32, 1.0, 0.5] {
                    let case = GemmCase { m, n, k, tb, beta, pad };
                    let want = gemm_on(neon, 1, &case, &a, &b);
                    assert_same(&format!("{case:?}"), &gemm_on(sme, 1, &case, &a, &b), &want);
                }
            }
        }
        // Big enough for the pool: 2 and 3 threads split the tiles.
        for (m, n, k) in [(130, 100, 600), (2 * side + 5, 1030, 40)] {
            let mut r = common::rng(5);
            let (a, b) = (rand_f32(&mut r, m * k), rand_f32(&mut r, k * n));
            let case = GemmCase { m, n, k, tb: false, beta: 0.0, pad: 0 };
            let want = gemm_on(neon, 1, &case, &a, &b);
            for threads in [1, 2, 3] {
                assert_same(&format!("{case:?} at {threads} threads"), &gemm_on(sme, threads, &case, &a, &b), &want);
            }
        }
    }

    /// NaN, infinities, subnormal products, signed zeros and huge values
    /// that cancel: every non-NaN element is NEON's, NaN where NEON's is.
    #[test]
    fn sme_gemm_special_values_are_neon_bits() {
        let Some((sme, neon)) = tables() else { return };
        let side = sme.gemm_tile().0;
        let specials = [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-20, -3e-21, 3e38, -3e38];
        let (m, n, k) = (side + 1, side + 3, 9);
        let mut r = common::rng(11);
        let mut a = rand_f32(&mut r, m * k);
        let mut b = rand_f32(&mut r, k * n);
        for (i, &v) in specials.iter().enumerate() {
            a[(i * 7) % (m * k)] = v;
            b[(i * 13 + 5) % (k * n)] = v;
        }
        // A row and a column of zeros times signed zeros: -0 products into +0 sums.
        a[..k].iter_mut().enumerate().for_each(|(p, v)| *v = if p % 2 == 0 { -0.0 } else { 0.0 });
        for beta in [0.0f32, 1.0] {
            let case = GemmCase { m, n, k, tb: false, beta, pad: 0 };
            assert_same(
                &format!("specials {case:?}"),
                &gemm_on(sme, 1, &case, &a, &b),
                &gemm_on(neon, 1, &case, &a, &b),
            );
        }
    }

    /// The epilogues a linear layer fuses (scale, per-column bias, every
    /// activation, a residual before or after it), on a B packed for each
    /// table and on one packed during the call, at 1 and 3 threads.
    #[test]
    fn sme_fused_linear_is_neon_bit_for_bit() {
        let Some((sme, neon)) = tables() else { return };
        let side = sme.gemm_tile().0;
        let acts = fused_activations();
        let mut r = common::rng(13);
        for (m, n, kk) in [(side + 3, 2 * side + 5, 37), (1, 70, 600), (2 * side, side, 5)] {
            let x = rand_f32(&mut r, m * kk);
            let w = rand_f32(&mut r, n * kk);
            let bias = rand_f32(&mut r, n);
            let residual = rand_f32(&mut r, m * n);
            let xs = f32s(&[m, kk], &x);
            let ws = f32s(&[n, kk], &w);
            for act in acts {
                for (scale, residual_first, with_residual) in
                    [(1.0, false, false), (0.5, false, true), (1.0, true, true)]
                {
                    let e = LinearEpilogue {
                        scale,
                        bias: Some(&bias),
                        activation: act,
                        residual: with_residual.then_some(&residual[..]),
                        residual_first,
                    };
                    let run = |table: &'static KernelTable, threads: usize, packed: bool| {
                        let mut cx = Context::with_table(table).with_threads(threads);
                        let mut out = Buf::zeros(DType::F32, &[m, n]);
                        if packed {
                            let pw = PackedB::new(table, kk, n, &w, kk, true).unwrap();
                            kiln_kernels::linear_fused(xs.r(), &pw, &e, out.w(), &mut cx).unwrap();
                        } else {
                            kiln_kernels::linear_fused_unpacked(xs.r(), ws.r(), &e, out.w(), &mut cx).unwrap();
                        }
                        out.get::<f32>()
                    };
                    let want = run(neon, 1, true);
                    for (threads, packed) in [(1, true), (3, true), (1, false)] {
                        let ctx = format!("linear {m}x{n}x{kk} {act:?} scale {scale} residual {with_residual} first {residual_first} at {threads} threads, packed {packed}");
                        assert_same(&ctx, &run(sme, threads, packed), &want);
                    }
                }
            }
        }
    }

    /// A convolution's GEMM: the weight as A (packed once, or per call),
    /// the per-row (output channel) bias, a ReLU and a residual; implicit
    /// im2col and the pointwise path.
    #[test]
    fn sme_conv_is_neon_bit_for_bit() {
        let Some((sme, neon)) = tables() else { return };
        let side = sme.gemm_tile().0;
        let mut r = common::rng(17);
        let cout = 2 * side + 1;
        for (ks, pad) in [(3usize, 1usize), (1, 0)] {
            let xs = [1usize, 5, 11, 13];
            let ws = [cout, 5, ks, ks];
            let os = [1, cout, 11, 13];
            let x = f32s(&xs, &rand_f32(&mut r, xs.iter().product()));
            let w = f32s(&ws, &rand_f32(&mut r, ws.iter().product()));
            let b = f32s(&[cout], &rand_f32(&mut r, cout));
            let res = f32s(&os, &rand_f32(&mut r, os.iter().product()));
            let p = ConvParams { stride: &[1, 1], padding: &[pad, pad], dilation: &[1, 1], groups: 1 };
            let e =
                TensorEpilogue { activation: Some(Activation::Relu), residual: Some(res.r()), residual_first: true };
            let run = |table: &'static KernelTable, threads: usize, packed: bool| {
                let mut cx = Context::with_table(table).with_threads(threads);
                let pw = packed.then(|| PackedConv::new(table, w.r(), 1).unwrap());
                let mut out = Buf::zeros(DType::F32, &os);
                kiln_kernels::conv_fused(x.r(), w.r(), pw.as_ref(), Some(b.r()), &e, &p, out.w(), &mut cx).unwrap();
                out.get::<f32>()
            };
            let want = run(neon, 1, false);
            for (threads, packed) in [(1, false), (1, true), (2, true)] {
                assert_same(
                    &format!("conv {ks}x{ks} at {threads} threads, packed {packed}"),
                    &run(sme, threads, packed),
                    &want,
                );
            }
        }
    }

    /// While the caller's ZA is dormant (a lazy save pending: TPIDR2_EL0
    /// set), the kernel must not touch ZA: it computes the tile in Rust
    /// with the same fused chains, bit for bit. The test points TPIDR2_EL0
    /// at an empty save block (no slices) on its own thread, runs a GEMM
    /// there, and clears it again.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn sme_gemm_leaves_a_dormant_za_alone() {
        let Some((sme, neon)) = tables() else { return };
        let side = sme.gemm_tile().0;
        let block = [0u64; 2];
        let set_tpidr2 = |v: usize| {
            // SAFETY: TPIDR2_EL0 is the thread's own register; the block it
            // points to holds no save buffer and no slices.
            unsafe { std::arch::asm!(".arch_extension sme", "msr tpidr2_el0, {v}", v = in(reg) v, options(nostack)) }
        };
        let mut r = common::rng(19);
        for (m, n, k) in [(side + 1, 2 * side + 3, 7), (side, side, 513)] {
            let (a, b) = (rand_f32(&mut r, m * k), rand_f32(&mut r, k * n));
            for beta in [0.0f32, 1.0] {
                let case = GemmCase { m, n, k, tb: false, beta, pad: 0 };
                let want = gemm_on(neon, 1, &case, &a, &b);
                set_tpidr2(block.as_ptr() as usize);
                let got = gemm_on(sme, 1, &case, &a, &b);
                set_tpidr2(0);
                assert_same(&format!("{case:?} with ZA dormant"), &got, &want);
            }
        }
    }
}

/// f32 lanes of an SVE vector (`cntw`), or None without SVE.
#[cfg(all(feature = "isa", target_arch = "aarch64"))]
fn sve_lanes() -> Option<usize> {
    #[target_feature(enable = "sve")]
    unsafe fn cntw() -> usize {
        let n: usize;
        // SAFETY: reads the vector length; SVE was detected.
        unsafe { std::arch::asm!("cntw {n}", n = out(reg) n, options(nomem, nostack, preserves_flags)) };
        n
    }
    // SAFETY: called only with SVE.
    std::arch::is_aarch64_feature_detected!("sve").then(|| unsafe { cntw() })
}

/// The SVE table's GEMM gives the NEON table's bits (the same FMA chain per
/// element, whatever the vector length and tile width): every
/// [`gemm_shapes`] case (rows, columns and K off the tiles, K = 1, K past
/// the 512-deep slice, k = 0) with beta 0, 1 and 0.5 (every `Combine`),
/// both B layouts, padded C; then `linear_fused` over a weight packed for
/// each table with every epilogue (scale, bias, each activation, the
/// residual on either side of it) at one and two threads.
#[test]
fn sve_gemm_is_neon_bit_for_bit() {
    let (Some(sve), Some(neon)) = (KernelTable::for_isa(Isa::Aarch64Sve), KernelTable::for_isa(Isa::Aarch64Neon))
    else {
        println!("note: skipping: this CPU or build has no SVE table");
        return;
    };
    let name = format!("gemm {} vs {}", sve.isa(), neon.isa());
    check_gemm_bits(&name, &gemm_with(sve), &gemm_with(neon)).unwrap_or_else(|e| panic!("{e}"));
    check_linear_fused_bits(sve, neon).unwrap_or_else(|e| panic!("{e}"));
}

/// A thread that lowers its SVE and SME vector lengths to 128 bits
/// (`prctl`) after the tables were built for longer ones: their GEMM
/// kernels notice at the call and compute the tile in Rust
/// (`aarch64::fma_tile`), still the NEON kernel's bits — the predicates
/// would otherwise cover a third of the SVE tile's columns, and the SME
/// tile would not fit ZA.
#[cfg(all(feature = "isa", target_arch = "aarch64", target_os = "linux"))]
#[test]
fn lowered_vector_lengths_keep_the_neon_bits() {
    const PR_SVE_SET_VL: libc::c_int = 50;
    const PR_SME_SET_VL: libc::c_int = 63;
    let neon = KernelTable::for_isa(Isa::Aarch64Neon).expect("the NEON table");
    let sve = KernelTable::for_isa(Isa::Aarch64Sve).filter(|t| t.gemm_tile().1 > 12);
    let sme = KernelTable::for_isa(Isa::Aarch64Sme).filter(|t| t.gemm_tile().1 > 8);
    if sve.is_none() && sme.is_none() {
        println!("note: skipping: no SVE or SME table wider than 128-bit vectors here");
        return;
    }
    std::thread::spawn(move || {
        if let Some(sve) = sve {
            // SAFETY: prctl with integer arguments only.
            let vl = unsafe { libc::prctl(PR_SVE_SET_VL, 16) };
            assert!(vl >= 0 && sve_lanes() == Some(4), "PR_SVE_SET_VL: {vl}");
            check_gemm_bits("lowered SVE gemm", &gemm_with(sve), &gemm_with(neon)).unwrap_or_else(|e| panic!("{e}"));
        }
        if let Some(sme) = sme {
            // SAFETY: as above.
            let vl = unsafe { libc::prctl(PR_SME_SET_VL, 16) };
            assert!(vl >= 0, "PR_SME_SET_VL: {vl}");
            check_gemm_bits("lowered SME gemm", &gemm_with(sme), &gemm_with(neon)).unwrap_or_else(|e| panic!("{e}"));
        }
    })
    .join()
    .expect("the lowered-length thread");
}

/// A GEMM (`f`) against another (`g`), bit for bit (C's padding
/// included).
fn check_gemm_bits(name: &str, f: GemmRun, g: GemmRun) -> Check {
    for (m, n, k) in gemm_shapes() {
        for tb in [false, true] {
            for beta in [0.0f32, 1.0, 0.5] {
                let case = GemmCase { m, n, k, tb, beta, pad: 3 };
                let (lda, ldb, ldc) = (k + 3, if tb { k } else { n } + 3, n + 3);
                let mut r = common::rng((m * 131 + n * 7 + k) as u64);
                let a: Vec<f32> = (0..m * lda).map(|_| r.gen_range(-1.0..1.0)).collect();
                let b: Vec<f32> = (0..(if tb { n } else { k }) * ldb).map(|_| r.gen_range(-1.0..1.0)).collect();
                let c0: Vec<f32> = (0..m * ldc).map(|_| r.gen_range(-1.0..1.0)).collect();
                let (mut got, mut want) = (c0.clone(), c0);
                f(&case, &a, &b, &mut got);
                g(&case, &a, &b, &mut want);
                if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                    return Err(format!("{name} {case:?} [{i}]: {} vs {}", got[i], want[i]));
                }
            }
        }
    }
    Ok(())
}

/// No activation and every one a GEMM's store step fuses.
fn fused_activations() -> [Option<kiln_kernels::Activation>; 10] {
    use kiln_kernels::Activation;
    [
        None,
        Some(Activation::Relu),
        Some(Activation::Clamp { min: Some(-0.25), max: Some(0.5) }),
        Some(Activation::Sigmoid),
        Some(Activation::Silu),
        Some(Activation::Gelu),
        Some(Activation::GeluTanh),
        Some(Activation::MulSigmoid),
        Some(Activation::Hardswish),
        Some(Activation::GeluTanhChain),
    ]
}

/// `linear_fused` through `t` and `reference`, bit for bit, with every
/// epilogue the store step has.
fn check_linear_fused_bits(t: &'static KernelTable, reference: &'static KernelTable) -> Check {
    use kiln_kernels::{linear_fused, DType, LinearEpilogue, PackedB, TensorMut, TensorRef};
    let acts = fused_activations();
    let mut r = common::rng(41);
    for (m, n, k) in [(1, 1, 1), (8, 48, 1), (9, 49, 7), (16, 96, 40), (17, 50, 600), (3, 130, 17)] {
        let x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-2.0..2.0)).collect();
        let w: Vec<f32> = (0..n * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        let bias: Vec<f32> = (0..n).map(|_| r.gen_range(-1.0..1.0)).collect();
        let residual: Vec<f32> = (0..m * n).map(|_| r.gen_range(-1.0..1.0)).collect();
        let packed = |table| PackedB::new(table, k, n, &w, k, true).map_err(|e| e.to_string());
        let (pt, pr) = (packed(t)?, packed(reference)?);
        for act in acts {
            for (scale, residual_first, with_residual) in [(1.0, false, false), (0.5, false, true), (1.0, true, true)] {
                let e = LinearEpilogue {
                    scale,
                    bias: Some(&bias),
                    activation: act,
                    residual: with_residual.then_some(&residual[..]),
                    residual_first,
                };
                for threads in [1, 2] {
                    let run = |table: &'static KernelTable, w: &PackedB| {
                        let mut out = vec![f32::NAN; m * n];
                        let xr = TensorRef { dtype: DType::F32, shape: &[m, k], data: bytemuck::cast_slice(&x) };
                        let om =
                            TensorMut { dtype: DType::F32, shape: &[m, n], data: bytemuck::cast_slice_mut(&mut out) };
                        let mut cx = Context::with_table(table).with_threads(threads);
                        linear_fused(xr, w, &e, om, &mut cx).map_err(|e| e.to_string())?;
                        Ok::<_, String>(out)
                    };
                    let (got, want) = (run(t, &pt)?, run(reference, &pr)?);
                    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                        return Err(format!(
                            "{} linear {m}x{n}x{k} {act:?} scale {scale} residual {with_residual} (first {residual_first}), {threads} threads [{i}]: {} vs {} {}",
                            t.isa(),
                            got[i],
                            reference.isa(),
                            want[i]
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
