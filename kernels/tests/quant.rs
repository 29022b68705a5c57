//! The quantized linear layer against its definition (kiln_kernels::quant's
//! module doc), computed here from the dequantized weights.

use kiln_kernels::quant::{
    qlinear, quantize_row_i8, quantize_row_static, row_qparams_asymmetric, row_scale_symmetric, ActQuant,
    PackedQWeights, QBits, QWeights,
};
use kiln_kernels::Context;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn int4_bytes(q: &[i8]) -> Vec<u8> {
    q.chunks_exact(2).map(|p| (p[0] as u8 & 0x0f) | ((p[1] as u8 & 0x0f) << 4)).collect()
}

#[test]
fn weight_only_int4_grouped_matches_dequantized_matmul() {
    let (m, n, k, group) = (3, 5, 64, 32);
    let mut seed = 7;
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    let q: Vec<i8> = (0..n * k).map(|i| ((i * 7 + 3) % 16) as i8 - 8).collect();
    let scales: Vec<f32> = (0..n * k / group).map(|i| 0.01 + i as f32 * 0.003).collect();
    let zps: Vec<i8> = (0..n * k / group).map(|i| (i % 5) as i8 - 2).collect();
    let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.5).collect();
    let data = int4_bytes(&q);
    let w = QWeights { n, k, bits: QBits::I4, group, data: &data, scales: &scales, zero_points: Some(&zps) };
    let packed = PackedQWeights::pack(&w).unwrap();
    let mut out = vec![0f32; m * n];
    qlinear(&mut Context::new(), &x, m, &packed, ActQuant::Float, Some(&bias), &mut out).unwrap();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = bias[j] as f64
                + (0..k)
                    .map(|p| {
                        let g = j * (k / group) + p / group;
                        x[i * k + p] as f64 * ((q[j * k + p] as f64 - zps[g] as f64) * scales[g] as f64)
                    })
                    .sum::<f64>();
            assert!((out[i * n + j] as f64 - want).abs() < 1e-4, "({i},{j}): {} vs {want}", out[i * n + j]);
        }
    }
}

#[test]
fn dynamic_int8_follows_torchaos_order_of_operations() {
    let (m, n, k) = (2, 4, 48);
    let mut seed = 11;
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
    let q: Vec<i8> = (0..n * k).map(|i| ((i * 37) % 255) as i8).collect();
    let scales: Vec<f32> = (0..n).map(|j| 0.02 + j as f32 * 0.01).collect();
    let data: Vec<u8> = q.iter().map(|&v| v as u8).collect();
    let w = QWeights { n, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
    let packed = PackedQWeights::pack(&w).unwrap();
    let mut out = vec![0f32; m * n];
    qlinear(&mut Context::new(), &x, m, &packed, ActQuant::DynamicPerRow, None, &mut out).unwrap();
    for i in 0..m {
        let row = &x[i * k..][..k];
        let s = row_scale_symmetric(row);
        let mut qx = vec![0i8; k];
        quantize_row_i8(row, s, &mut qx);
        assert!(qx.iter().any(|&v| v == 127 || v == -128), "the largest |x| maps to the range's end");
        for j in 0..n {
            let acc: i32 = (0..k).map(|p| qx[p] as i32 * q[j * k + p] as i32).sum();
            assert_eq!(out[i * n + j].to_bits(), ((acc as f32 * s) * scales[j]).to_bits());
        }
    }
}

#[test]
fn bad_weights_are_errors() {
    let data = [0u8; 10];
    let scales = [1f32; 2];
    let odd = QWeights { n: 2, k: 5, bits: QBits::I4, group: 5, data: &data, scales: &scales, zero_points: None };
    assert!(PackedQWeights::pack(&odd).is_err());
    let short = QWeights { n: 2, k: 8, bits: QBits::I8, group: 8, data: &data, scales: &scales, zero_points: None };
    assert!(PackedQWeights::pack(&short).is_err());
    let group = QWeights { n: 2, k: 5, bits: QBits::I8, group: 3, data: &data, scales: &scales, zero_points: None };
    assert!(PackedQWeights::pack(&group).is_err());
}

// ---------------------------------------------------------------------------
// Every variant of the integer kernels against the generic one.
//
// The checks return errors instead of panicking so that
// `checks_reject_broken_variants` can feed them deliberately wrong
// implementations and see them fail.

use kiln_kernels::quant::{qlinear_with, variants, QuantKernels};

type Check = Result<(), String>;

/// A quantized linear implementation under test: `(x, m, packed, act, bias, out)`.
type Run<'a> = &'a dyn Fn(&[f32], usize, &PackedQWeights, ActQuant, Option<&[f32]>, &mut [f32]);

#[allow(clippy::type_complexity)]
fn with(
    kernels: QuantKernels,
    threads: usize,
) -> impl Fn(&[f32], usize, &PackedQWeights, ActQuant, Option<&[f32]>, &mut [f32]) {
    move |x, m, w, act, bias, out| {
        let mut cx = Context::new().with_threads(threads);
        qlinear_with(&mut cx, &kernels, x, m, w, act, bias, out).unwrap()
    }
}

fn generic_kernels() -> QuantKernels {
    variants()[0]
}

/// Activations for `m` rows of `k`: random, with rows that are all zero,
/// hold exact .5 ties at the scale (±127.5 → ±128/127 ends), or a NaN.
fn activations(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s) * 4.0).collect();
    for i in 0..m {
        let row = &mut x[i * k..][..k];
        match i % 5 {
            1 => row.fill(0.0),
            2 => {
                // max |x| = 127.5: the scale is 1, and the ties round to even.
                row[0] = -127.5;
                if k > 1 {
                    row[k - 1] = 127.5;
                }
                if k > 2 {
                    row[1] = 2.5;
                }
            }
            3 if k > 3 => row[k / 2] = -f32::MAX / 2.0,
            // One sign, as after a ReLU: the asymmetric zero point is -128.
            4 => row.iter_mut().for_each(|v| *v = v.abs()),
            _ => {}
        }
    }
    x
}

/// int8 weights with both ends of the range and a zero row.
fn weights_i8(n: usize, k: usize, seed: u64) -> Vec<i8> {
    let mut s = seed;
    let mut q: Vec<i8> = (0..n * k).map(|_| (lcg(&mut s) * 128.0).clamp(-128.0, 127.0) as i8).collect();
    for (j, row) in q.chunks_mut(k).enumerate() {
        match j % 4 {
            1 => row.fill(-128),
            2 => row.fill(127),
            3 if j % 8 == 3 => row.fill(0),
            _ => {}
        }
    }
    q
}

// 32 and up: the plain AVX2 kernel reads its i16 weight copy.
const MS: &[usize] = &[1, 2, 3, 5, 6, 7, 8, 9, 13, 16, 17, 32, 37];
const NS: &[usize] = &[1, 5, 16, 17, 31, 33, 47];
// Packed depths 4, 4, 4, 8, 64, 68, 132: i8mm's groups of 8 end half full
// (4 values, the rest zero) for all but 7 and 64.
const KS: &[usize] = &[1, 3, 4, 7, 64, 66, 131];

fn check_int8(name: &str, act: ActQuant, f: Run, g: Run) -> Check {
    check_int8_packed(name, act, f, g, &variants())
}

/// [`check_int8`] on weights packed for each of `packings`.
fn check_int8_packed(name: &str, act: ActQuant, f: Run, g: Run, packings: &[QuantKernels]) -> Check {
    for (s, &k) in KS.iter().enumerate() {
        for &n in NS {
            let q = weights_i8(n, k, s as u64 + 1);
            let data: Vec<u8> = q.iter().map(|&v| v as u8).collect();
            let scales: Vec<f32> = (0..n).map(|j| 0.001 + j as f32 * 0.0007).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
            let w = QWeights { n, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
            // Packed for every variant: the plain AVX2 one adds the i16
            // copy its kernel reads from 32 rows up (fewer rows read the i8
            // bytes), NEON i8mm the column pairs its kernel reads (other
            // packings give it only the lanes), which every implementation
            // must run alike.
            // Variants that pack the same bytes are one case (most do).
            let mut seen: Vec<PackedQWeights> = Vec::new();
            for packing in packings {
                let packed = PackedQWeights::pack_for(&w, packing).map_err(|e| e.to_string())?;
                if seen.contains(&packed) {
                    continue;
                }
                seen.push(packed.clone());
                for &m in MS {
                    let x = activations(m, k, (m * 31 + n) as u64);
                    for b in [None, Some(&bias[..])] {
                        let (mut got, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                        f(&x, m, &packed, act, b, &mut got);
                        g(&x, m, &packed, act, b, &mut want);
                        for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                            if a.to_bits() != e.to_bits() {
                                let (bias, p) = (b.is_some(), packing.name());
                                return Err(format!(
                                    "{name} {act:?} (packed for {p}): m={m} n={n} k={k} bias={bias} [{i}]: {a} vs {e}"
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// One weight-only case: bits, k, group, zero points.
#[derive(Copy, Clone, Debug)]
struct WoCase {
    bits: QBits,
    k: usize,
    group: usize,
    zp: bool,
}

fn wo_cases() -> Vec<WoCase> {
    let mut cases = Vec::new();
    for zp in [false, true] {
        for (k, group) in [(64, 64), (64, 32), (96, 8), (130, 130), (12, 6), (256, 128), (40, 4)] {
            cases.push(WoCase { bits: QBits::I8, k, group, zp });
            if k % 2 == 0 && group % 2 == 0 {
                cases.push(WoCase { bits: QBits::I4, k, group, zp });
            }
        }
        cases.push(WoCase { bits: QBits::I8, k: 7, group: 7, zp });
    }
    cases
}

/// `(data, scales, zps, dequantized weight)` of a weight-only case.
fn wo_weights(c: WoCase, n: usize, seed: u64) -> (Vec<u8>, Vec<f32>, Vec<i8>, Vec<f32>) {
    let mut s = seed;
    let groups = c.k / c.group;
    let (lo, hi) = if c.bits == QBits::I4 { (-8.0, 7.0) } else { (-128.0, 127.0) };
    let q: Vec<i8> = (0..n * c.k)
        .map(|i| {
            if i % 11 == 0 {
                lo as i8
            } else if i % 13 == 0 {
                hi as i8
            } else {
                (lcg(&mut s) * -lo).clamp(lo, hi) as i8
            }
        })
        .collect();
    let scales: Vec<f32> = (0..n * groups).map(|_| 0.001 + (lcg(&mut s) + 1.0) * 0.01).collect();
    let zps: Vec<i8> = (0..n * groups).map(|i| if c.zp { (i % 7) as i8 - 3 } else { 0 }).collect();
    let data = if c.bits == QBits::I4 { int4_bytes(&q) } else { q.iter().map(|&v| v as u8).collect() };
    let deq = (0..n * c.k)
        .map(|i| {
            (q[i] as f32 - zps[(i / c.k) * groups + (i % c.k) / c.group] as f32)
                * scales[(i / c.k) * groups + (i % c.k) / c.group]
        })
        .collect();
    (data, scales, zps, deq)
}

/// Weight-only: within the documented FMA bound of the generic kernel
/// (`2 · group · ε · Σ_p |x · w|`, with a floor for results near 0), and
/// the generic kernel within the same bound of the f64 definition.
fn check_weight_only(name: &str, f: Run, g: Run) -> Check {
    for c in wo_cases() {
        for &n in &[1usize, 16, 17, 40] {
            let (data, scales, zps, deq) = wo_weights(c, n, (c.k * 7 + n) as u64);
            let zp = c.zp.then_some(&zps[..]);
            let w = QWeights { n, k: c.k, bits: c.bits, group: c.group, data: &data, scales: &scales, zero_points: zp };
            let packed = PackedQWeights::pack(&w).map_err(|e| e.to_string())?;
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.125).collect();
            for &m in &[1usize, 2, 3, 4, 5, 8, 9, 16, 17] {
                let mut s = (m * 13 + n) as u64;
                let x: Vec<f32> = (0..m * c.k).map(|_| lcg(&mut s)).collect();
                for b in [None, Some(&bias[..])] {
                    let (mut got, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                    f(&x, m, &packed, ActQuant::Float, b, &mut got);
                    g(&x, m, &packed, ActQuant::Float, b, &mut want);
                    for i in 0..m {
                        for j in 0..n {
                            let terms = (0..c.k).map(|p| x[i * c.k + p] as f64 * deq[j * c.k + p] as f64);
                            let exact: f64 = b.map_or(0.0, |b| b[j] as f64) + terms.clone().sum::<f64>();
                            let mag: f64 = terms.map(f64::abs).sum::<f64>() + b.map_or(0.0, |b| b[j].abs() as f64);
                            let bound = 2.0 * (c.group as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30;
                            let (a, e) = (got[i * n + j] as f64, want[i * n + j] as f64);
                            if (a - e).abs() > bound || (e - exact).abs() > bound || a.is_nan() {
                                return Err(format!("{name}: {c:?} m={m} n={n} ({i},{j}): {a} vs generic {e} vs exact {exact} (bound {bound:e})"));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Row quantizer: every bit of the scale and values against the generic one.
fn check_quantize(name: &str, f: &dyn Fn(&[f32], &mut [i8]) -> f32) -> Check {
    let specials = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 127.5, -127.5, f32::NAN, 1e-30, -1e-39, 3.0, -7.25];
    for len in [0usize, 1, 3, 7, 8, 9, 15, 16, 17, 33, 100] {
        for variant in 0..4 {
            let mut s = (len * 4 + variant) as u64;
            let row: Vec<f32> = (0..len)
                .map(|i| match variant {
                    0 => specials[i % specials.len()],
                    1 => lcg(&mut s) * 1000.0,
                    2 => (i as f32 - 8.0) * 0.5,
                    _ => {
                        if i == len / 2 {
                            f32::INFINITY
                        } else {
                            lcg(&mut s)
                        }
                    }
                })
                .collect();
            let (mut got, mut want) = (vec![99i8; len], vec![99i8; len]);
            let sg = f(&row, &mut got);
            let s = row_scale_symmetric(&row);
            quantize_row_i8(&row, s, &mut want);
            if sg.to_bits() != s.to_bits() || got != want {
                return Err(format!("{name}: len {len} case {variant}: scale {sg} vs {s}, {got:?} vs {want:?}"));
            }
        }
    }
    Ok(())
}

#[test]
fn variants_are_listed_and_named() {
    let all = variants();
    assert_eq!(all[0].name(), "generic");
    for v in &all {
        println!("{v:?}");
    }
    #[cfg(all(feature = "isa", target_arch = "x86_64"))]
    {
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        assert_eq!(all.iter().any(|v| v.name() == "avx2"), v3);
        assert_eq!(all.iter().any(|v| v.name() == "avx_vnni"), v3 && is_x86_feature_detected!("avxvnni"));
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")) {
            println!("note: skipping avx512_vnni: not supported by this CPU");
        }
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            println!("note: skipping avx512bw: not supported by this CPU");
        }
        // AVX-512 variants are listed only where the CPU has AVX-512.
        assert!(all.iter().all(|v| !v.name().starts_with("avx512") || is_x86_feature_detected!("avx512f")));
    }
    #[cfg(all(feature = "isa", target_arch = "aarch64"))]
    {
        assert!(all.iter().any(|v| v.name() == "neon"));
        let dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
        assert_eq!(all.iter().any(|v| v.name() == "neon_dotprod"), dotprod);
        if !dotprod {
            println!("note: skipping neon_dotprod: this CPU has no dot-product extension");
        }
        // Above neon_dotprod where the CPU has the int8 matrix multiply.
        let i8mm = std::arch::is_aarch64_feature_detected!("i8mm");
        assert_eq!(all.iter().any(|v| v.name() == "neon_i8mm"), i8mm);
        if !i8mm {
            println!("note: skipping neon_i8mm: this CPU has no int8 matrix multiply");
        }
        // The SVE variants where the CPU has SVE with a vector of 16, 32 or
        // 64 bytes (qemu's `max`, `sve-default-vector-length`), sve_i8mm
        // with i8mm too; each above the NEON ones it outdoes.
        let vl = sve_vector_bytes();
        let sve = matches!(vl, Some(16 | 32 | 64));
        assert_eq!(all.iter().any(|v| v.name() == "sve_dotprod"), sve);
        // SVE's int8 matrix multiply: HWCAP2_SVEI8MM (bit 9 of AT_HWCAP2,
        // Linux's; other systems report no SVE i8mm).
        #[cfg(target_os = "linux")]
        // SAFETY: `getauxval` reads the auxiliary vector; no pointers.
        let sve_i8mm = unsafe { libc::getauxval(libc::AT_HWCAP2) } & (1 << 9) != 0;
        #[cfg(not(target_os = "linux"))]
        let sve_i8mm = false;
        assert!(!sve_i8mm || (i8mm && std::arch::is_aarch64_feature_detected!("sve")));
        assert_eq!(all.iter().any(|v| v.name() == "sve_i8mm"), sve && sve_i8mm);
        match vl {
            Some(vl) if !sve => println!("note: skipping sve_dotprod, sve_i8mm: SVE vector length {vl} bytes"),
            Some(vl) => println!("note: SVE vector length {vl} bytes"),
            None => println!("note: skipping sve_dotprod, sve_i8mm: this CPU has no SVE"),
        }
        let best = match (sve, i8mm) {
            (true, true) if sve_i8mm => "sve_i8mm",
            (_, true) => "neon_i8mm",
            (true, false) => "sve_dotprod",
            (false, false) if dotprod => "neon_dotprod",
            (false, false) => "neon",
        };
        assert_eq!(all.last().map(|v| v.name()), Some(best));
    }
    // The table holds the last (best) variant of its level.
    let best = Context::new().table().entries();
    let qgemm = best.iter().find(|(e, _)| *e == "qgemm_i8").map(|&(_, v)| v);
    assert_eq!(qgemm, all.last().map(|v| v.parts().0));
}

/// The SVE vector length in bytes (`cntb`), where the CPU has SVE.
#[cfg(all(feature = "isa", target_arch = "aarch64"))]
fn sve_vector_bytes() -> Option<usize> {
    #[target_feature(enable = "sve")]
    unsafe fn cntb() -> usize {
        let vl: usize;
        std::arch::asm!("cntb {vl}", vl = out(reg) vl, options(pure, nomem, nostack, preserves_flags));
        vl
    }
    // SAFETY: `cntb` runs only where SVE was detected.
    std::arch::is_aarch64_feature_detected!("sve").then(|| unsafe { cntb() })
}

#[test]
fn dynamic_int8_every_variant_is_bit_exact() {
    let g = with(generic_kernels(), 1);
    for v in variants().into_iter().skip(1) {
        check_int8(v.name(), ActQuant::DynamicPerRow, &with(v, 1), &g).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The SVE variants alone (the run the CI repeats at several vector
/// lengths): every activation quantization, on weights packed for the
/// generic table (lanes only: the `sdot` kernel) and for the variant
/// (sve_i8mm's pairs copy: the `smmla` kernel), against the generic
/// kernel. Tiles of 8×32 meet rows, columns and depths off every multiple
/// (`MS`, `NS`, `KS`: half groups of 8), −128/127 weight rows and ties.
#[cfg(all(feature = "isa", target_arch = "aarch64"))]
#[test]
fn sve_int8_variants_are_bit_exact() {
    let g = with(generic_kernels(), 1);
    let sve: Vec<_> = variants().into_iter().filter(|v| v.name().starts_with("sve_")).collect();
    if sve.is_empty() {
        println!("note: no SVE variant on this CPU");
    }
    let acts = [ActQuant::DynamicPerRow, ActQuant::DynamicAsymmetric, STATIC_ACTS[2]];
    for v in sve {
        for act in acts {
            let packings = [generic_kernels(), v];
            check_int8_packed(v.name(), act, &with(v, 1), &g, &packings).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn asymmetric_dynamic_int8_every_variant_is_bit_exact() {
    let g = with(generic_kernels(), 1);
    for v in variants().into_iter().skip(1) {
        check_int8(v.name(), ActQuant::DynamicAsymmetric, &with(v, 1), &g).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The module doc's int8 arithmetic written out for the generic kernel's
/// check: each row of `x` quantized by `quantize` (integers, scale, zero
/// point), then `out = (f32(Σ (q_x − zp) · q_w) · s) · scale[j] (+ bias[j])`
/// with `check_int8`'s weights, rebuilt from their seed.
fn int8_reference(
    x: &[f32],
    m: usize,
    w: &PackedQWeights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    quantize: impl Fn(&[f32]) -> (Vec<i32>, f32, i32),
) {
    let (n, k) = (w.n(), w.k());
    let s = KS.iter().position(|&kk| kk == k).unwrap_or(0);
    let q = weights_i8(n, k, s as u64 + 1);
    let scales: Vec<f32> = (0..n).map(|j| 0.001 + j as f32 * 0.0007).collect();
    for i in 0..m {
        let (qx, sx, zp) = quantize(&x[i * k..][..k]);
        for j in 0..n {
            let acc: i32 = (0..k).map(|p| (qx[p] - zp) * q[j * k + p] as i32).sum();
            let v = (acc as f32 * sx) * scales[j];
            out[i * n + j] = bias.map_or(v, |b| v + b[j]);
        }
    }
}

/// torch's `quantize_per_tensor` rule, written out: `clamp(rint(x · f32(1/s)) + zp, -128, 127)`.
fn quantize_written_out(row: &[f32], s: f32, zp: i32) -> Vec<i32> {
    row.iter().map(|&v| ((v * (1.0 / s)).round_ties_even() + zp as f32).clamp(-128.0, 127.0) as i32).collect()
}

#[test]
fn asymmetric_dynamic_int8_generic_follows_the_definition() {
    let reference = |x: &[f32], m: usize, w: &PackedQWeights, _: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        int8_reference(x, m, w, bias, out, |row| {
            // torch's MinMaxObserver (quint8 range shifted to [-128, 127])
            // on the row's range, written out.
            let mn = row.iter().copied().fold(0f32, f32::min);
            let mx = row.iter().copied().fold(0f32, f32::max);
            let sx = ((mx - mn) / 255.0).max(f32::EPSILON);
            let zp = (-128.0 - (mn / sx).round_ties_even()).clamp(-128.0, 127.0) as i32;
            (quantize_written_out(row, sx, zp), sx, zp)
        })
    };
    check_int8("generic", ActQuant::DynamicAsymmetric, &with(generic_kernels(), 1), &reference)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The asymmetric row parameters: a one-signed row uses the whole range,
/// and zero is exact.
#[test]
fn asymmetric_row_qparams() {
    let (s, zp) = row_qparams_asymmetric(&[0.0, 2.55, 1.0]);
    assert_eq!((s, zp), (2.55f32 / 255.0, -128));
    let (s, zp) = row_qparams_asymmetric(&[-2.55, 0.5]);
    assert_eq!((s, zp), (3.05f32 / 255.0, ((-128.0f32 - (-2.55f32 / s).round_ties_even()) as i32)));
    assert_eq!(row_qparams_asymmetric(&[0.0; 4]), (f32::EPSILON, -128));
    let mut q = [0i8; 3];
    let (s, zp) = row_qparams_asymmetric(&[-1.0, 0.0, 3.0]);
    quantize_row_static(&[-1.0, 0.0, 3.0], s, zp, &mut q);
    assert_eq!(q[1] as i32, zp, "zero is exactly representable");
    assert_eq!((q[0], q[2]), (-128, 127));
}

/// Static activations: a scale that saturates the big rows and zero points
/// at both ends and in the middle (the u8-offset variants shift them).
const STATIC_ACTS: [ActQuant; 3] = [
    ActQuant::Static { scale: 0.03125, zero_point: 0 },
    ActQuant::Static { scale: 0.05, zero_point: -128 },
    ActQuant::Static { scale: 0.0173, zero_point: 77 },
];

#[test]
fn static_int8_every_variant_is_bit_exact() {
    let g = with(generic_kernels(), 1);
    for v in variants().into_iter().skip(1) {
        for act in STATIC_ACTS {
            check_int8(v.name(), act, &with(v, 1), &g).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn static_int8_generic_follows_the_definition() {
    let reference = |x: &[f32], m: usize, w: &PackedQWeights, act: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        let ActQuant::Static { scale: sx, zero_point: zp } = act else { panic!("not static") };
        int8_reference(x, m, w, bias, out, |row| (quantize_written_out(row, sx, zp), sx, zp))
    };
    for act in STATIC_ACTS {
        check_int8("generic", act, &with(generic_kernels(), 1), &reference).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The static row quantizer is torch's rule, ties to even included
/// (`0.5 / 0.25 = 2.0` exactly; `x = ±(n + 0.5) · s` for a power-of-two `s`).
#[test]
fn static_row_quantizer_is_torchs_rule() {
    let s = 0.25f32;
    let row = [0.125f32, 0.375, -0.125, -0.375, 31.9, 32.0, -32.2, 1e30, -1e30, 0.0, 0.626, f32::NAN];
    let mut got = [0i8; 12];
    quantize_row_static(&row, s, 3, &mut got);
    assert_eq!(got, [3, 5, 3, 1, 127, 127, -126, 127, -128, 3, 6, 0]);
    // Against round_ties_even on a sweep of values and zero points.
    let mut seed = 11;
    let xs: Vec<f32> = (0..4096).map(|i| lcg(&mut seed) * 8.0 + (i % 7) as f32 * 0.015625).collect();
    for (s, zp) in [(0.015625f32, 0), (0.0173, -128), (0.05, 127), (1e-3, -5)] {
        let mut got = vec![0i8; xs.len()];
        quantize_row_static(&xs, s, zp, &mut got);
        for (&x, &q) in xs.iter().zip(&got) {
            let want = ((x * (1.0 / s)).round_ties_even() + zp as f32).clamp(-128.0, 127.0) as i8;
            assert_eq!(q, want, "x = {x}, s = {s}, zp = {zp}");
        }
    }
}

#[test]
fn dynamic_int8_generic_follows_the_definition() {
    // Against the module doc's formula computed here, on the odd shapes.
    let reference = |x: &[f32], m: usize, w: &PackedQWeights, _: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        int8_reference(x, m, w, bias, out, |row| {
            let sx = row_scale_symmetric(row);
            let mut qx = vec![0i8; row.len()];
            quantize_row_i8(row, sx, &mut qx);
            (qx.iter().map(|&v| v as i32).collect(), sx, 0)
        })
    };
    check_int8("generic", ActQuant::DynamicPerRow, &with(generic_kernels(), 1), &reference)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn weight_only_every_variant_within_bound() {
    let g = with(generic_kernels(), 1);
    for v in variants() {
        check_weight_only(v.name(), &with(v, 1), &g).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn quantize_row_every_variant_is_bit_exact() {
    for v in variants() {
        check_quantize(v.name(), &|r, o| v.quantize_row(r, o)).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Big enough to be split (over 2^21 multiply-adds).
    let (m, n, k) = (37, 200, 320);
    let q = weights_i8(n, k, 5);
    let data: Vec<u8> = q.iter().map(|&v| v as u8).collect();
    let scales: Vec<f32> = (0..n).map(|j| 0.01 + j as f32 * 1e-4).collect();
    let q8 = QWeights { n, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
    let c = WoCase { bits: QBits::I4, k, group: 32, zp: true };
    let (d4, s4, z4, _) = wo_weights(c, n, 9);
    let w4 = PackedQWeights::pack(&QWeights {
        n,
        k,
        bits: QBits::I4,
        group: 32,
        data: &d4,
        scales: &s4,
        zero_points: Some(&z4),
    })
    .unwrap();
    let x = activations(m, k, 3);
    for v in variants() {
        // Each variant on the packing made for it (the plain AVX2 one's
        // i16 weight copy included).
        let w8 = PackedQWeights::pack_for(&q8, &v).unwrap();
        let cases =
            [(&w8, ActQuant::DynamicPerRow), (&w8, STATIC_ACTS[2]), (&w8, ActQuant::Float), (&w4, ActQuant::Float)];
        for (w, act) in cases {
            let mut first = vec![0f32; m * n];
            with(v, 1)(&x, m, w, act, None, &mut first);
            for threads in [2, 3, 4] {
                let mut out = vec![0f32; m * n];
                with(v, threads)(&x, m, w, act, None, &mut out);
                let same = out.iter().zip(&first).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{} {act:?} {:?}: {threads} threads differ from 1", v.name(), w.bits());
            }
        }
    }
}

#[test]
fn bad_calls_are_errors() {
    let data = [1u8; 64];
    let scales = [1f32; 4];
    let zps = [0i8; 4];
    let w = PackedQWeights::pack(&QWeights {
        n: 4,
        k: 16,
        bits: QBits::I8,
        group: 16,
        data: &data,
        scales: &scales,
        zero_points: Some(&zps),
    })
    .unwrap();
    let mut cx = Context::new();
    let x = [0.5f32; 32];
    let mut out = [0f32; 8];
    assert!(qlinear(&mut cx, &x, 2, &w, ActQuant::DynamicPerRow, None, &mut out).is_err(), "zero points with dynamic");
    let st = ActQuant::Static { scale: 0.1, zero_point: 0 };
    assert!(qlinear(&mut cx, &x, 2, &w, st, None, &mut out).is_err(), "zero points with static");
    assert!(qlinear(&mut cx, &x, 2, &w, ActQuant::Float, None, &mut out).is_ok());
    assert!(qlinear(&mut cx, &x[..31], 2, &w, ActQuant::Float, None, &mut out).is_err(), "short x");
    assert!(qlinear(&mut cx, &x, 2, &w, ActQuant::Float, Some(&[0.0; 3]), &mut out).is_err(), "short bias");
    let deep = vec![0u8; 1 << 17];
    let w = PackedQWeights::pack(&QWeights {
        n: 1,
        k: 1 << 17,
        bits: QBits::I8,
        group: 1 << 17,
        data: &deep,
        scales: &scales[..1],
        zero_points: None,
    })
    .unwrap();
    let x = vec![0f32; 1 << 17];
    assert!(qlinear(&mut cx, &x, 1, &w, ActQuant::DynamicPerRow, None, &mut out[..1]).is_err(), "k too deep for i32");
}

/// The checks themselves: each must reject a plausible bug.
#[test]
fn checks_reject_broken_variants() {
    let g = with(generic_kernels(), 1);
    // Quantizing with round-half-away-from-zero instead of half to even.
    let away = |x: &[f32], m: usize, w: &PackedQWeights, act: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        let k = w.k();
        let mut xr = x.to_vec();
        for row in xr.chunks_mut(k) {
            let s = row_scale_symmetric(row);
            for v in row.iter_mut() {
                // Nudge exact ties away from zero: what `f32::round` would give.
                let t = *v / s;
                if t.fract().abs() == 0.5 && (t.trunc() as i32) % 2 == 0 {
                    *v = (t + t.signum() * 0.25) * s;
                }
            }
        }
        g(&xr, m, w, act, bias, out)
    };
    assert!(check_int8("half away", ActQuant::DynamicPerRow, &away, &g).is_err());
    // The last column of a partial tile left unwritten.
    let tail = |x: &[f32], m: usize, w: &PackedQWeights, act: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        g(x, m, w, act, bias, out);
        let n = w.n();
        if !n.is_multiple_of(16) {
            out[n - 1] = 0.0;
        }
    };
    assert!(check_int8("tail", ActQuant::DynamicPerRow, &tail, &g).is_err());
    assert!(check_weight_only("tail", &tail, &g).is_err());
    // A saturating i16 pair sum (what a bare `vpmaddubsw` would do).
    let saturating = |x: &[f32], m: usize, w: &PackedQWeights, act: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        g(x, m, w, act, bias, out);
        let (n, k) = (w.n(), w.k());
        for i in 0..m {
            let row = &x[i * k..][..k];
            if row.iter().any(|&v| v == -127.5) && n > 1 && k > 1 {
                out[i * n + 1] += 1.0; // row 1 of the weights is all -128: pairs of 128·128 saturate
            }
        }
    };
    assert!(check_int8("saturating", ActQuant::DynamicPerRow, &saturating, &g).is_err());
    // Weight-only ignoring the zero points.
    let no_zp = |x: &[f32], m: usize, w: &PackedQWeights, act: ActQuant, bias: Option<&[f32]>, out: &mut [f32]| {
        g(x, m, w, act, bias, out);
        if w.bits() == QBits::I4 && w.group() < w.k() {
            out[0] += 1e-3;
        }
    };
    assert!(check_weight_only("no zp", &no_zp, &g).is_err());
    // Quantizer treating NaN as -128 (a bare cvtps/packs).
    let nan_min = |r: &[f32], o: &mut [i8]| {
        let s = generic_kernels().quantize_row(r, o);
        for (q, &v) in o.iter_mut().zip(r) {
            if v.is_nan() {
                *q = -128;
            }
        }
        s
    };
    assert!(check_quantize("nan", &nan_min).is_err());
}

/// Counts the allocations made on the current thread while enabled.
struct Counting;

thread_local! {
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// SAFETY: defers to the system allocator; the counters are const-initialised
// thread locals, which never allocate.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if COUNTING.try_with(|c| c.get()).unwrap_or(false) {
            let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        }
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_warm_call_allocates_nothing() {
    let (m, n, k) = (9, 40, 96);
    let q = weights_i8(n, k, 2);
    let data: Vec<u8> = q.iter().map(|&v| v as u8).collect();
    let scales = vec![0.01f32; n];
    let w8 = PackedQWeights::pack(&QWeights {
        n,
        k,
        bits: QBits::I8,
        group: k,
        data: &data,
        scales: &scales,
        zero_points: None,
    })
    .unwrap();
    let x = activations(m, k, 1);
    let mut out = vec![0f32; m * n];
    for v in variants() {
        let mut cx = Context::new();
        for act in [ActQuant::DynamicPerRow, ActQuant::DynamicAsymmetric, ActQuant::Float] {
            qlinear_with(&mut cx, &v, &x, m, &w8, act, None, &mut out).unwrap();
            ALLOCATIONS.with(|a| a.set(0));
            COUNTING.with(|c| c.set(true));
            let r = qlinear_with(&mut cx, &v, &x, m, &w8, act, None, &mut out);
            COUNTING.with(|c| c.set(false));
            r.unwrap();
            assert_eq!(ALLOCATIONS.with(|a| a.get()), 0, "{} {act:?} allocated", v.name());
        }
    }
}

/// A quantized convolution's definition, written out: every output pixel's
/// window (zero in the padding) quantized with the image's scale and zero
/// point (static, or the image's own: dynamic), the exact integer sum with
/// the weight, then `(f32(acc) · s) · scale + bias`.
const NO_EPILOGUE: kiln_kernels::TensorEpilogue<'static> =
    kiln_kernels::TensorEpilogue { activation: None, residual: None, residual_first: false };

#[allow(clippy::too_many_arguments)]
fn qconv_reference(
    x: &[f32],
    (n, c, h, wd): (usize, usize, usize, usize),
    q: &[i8],
    (cout, kh, kw): (usize, usize, usize),
    scales: &[f32],
    bias: &[f32],
    (stride, pad, dil): (usize, usize, usize),
    act: ActQuant,
) -> (Vec<f32>, (usize, usize)) {
    let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let k = c * kh * kw;
    let mut out = vec![0f32; n * cout * oh * ow];
    for b in 0..n {
        for y in 0..oh {
            for xo in 0..ow {
                let mut window = Vec::with_capacity(k);
                for ci in 0..c {
                    for ty in 0..kh {
                        for tx in 0..kw {
                            let (iy, ix) = (
                                (y * stride + ty * dil) as isize - pad as isize,
                                (xo * stride + tx * dil) as isize - pad as isize,
                            );
                            let inside = iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd;
                            window.push(if inside {
                                x[((b * c + ci) * h + iy as usize) * wd + ix as usize]
                            } else {
                                0.0
                            });
                        }
                    }
                }
                // Dynamic: one scale (and zero point) for the whole image.
                let image = &x[b * c * h * wd..][..c * h * wd];
                let (s, zp) = match act {
                    ActQuant::Static { scale, zero_point } => (scale, zero_point),
                    ActQuant::DynamicAsymmetric => row_qparams_asymmetric(image),
                    _ => (row_scale_symmetric(image), 0),
                };
                let qx = quantize_written_out(&window, s, zp);
                for co in 0..cout {
                    let acc: i32 = (0..k).map(|p| (qx[p] - zp) * q[co * k + p] as i32).sum();
                    out[((b * cout + co) * oh + y) * ow + xo] = (acc as f32 * s) * scales[co] + bias[co];
                }
            }
        }
    }
    (out, (oh, ow))
}

#[test]
fn qconv_every_variant_and_thread_count_follows_the_definition() {
    use kiln_kernels::quant::{qconv_with, variants};
    use kiln_kernels::{ConvParams, DType, TensorMut, TensorRef};
    // (N, C, H, W), (Cout, kh, kw), (stride, padding, dilation).
    let cases = [
        ((2, 3, 9, 7), (5, 3, 3), (1, 1, 1)),
        ((1, 4, 11, 10), (33, 3, 3), (2, 1, 1)),
        ((1, 6, 8, 8), (17, 1, 1), (1, 0, 1)),
        ((1, 2, 12, 9), (8, 3, 2), (1, 2, 2)),
        ((2, 5, 9, 9), (7, 1, 1), (2, 0, 1)),
    ];
    let acts = [
        ActQuant::DynamicPerRow,
        ActQuant::DynamicAsymmetric,
        ActQuant::Static { scale: 0.021, zero_point: 3 },
        ActQuant::Static { scale: 0.05, zero_point: -128 },
    ];
    for (case, &((n, c, h, wd), (cout, kh, kw), (stride, pad, dil))) in cases.iter().enumerate() {
        let mut seed = 100 + case as u64;
        let x: Vec<f32> = (0..n * c * h * wd).map(|_| lcg(&mut seed) * 2.5).collect();
        let k = c * kh * kw;
        let q: Vec<i8> = (0..cout * k).map(|i| ((i * 53 + case * 7) % 255) as u8 as i8).collect();
        let scales: Vec<f32> = (0..cout).map(|j| 0.003 + j as f32 * 0.0007).collect();
        let bias: Vec<f32> = (0..cout).map(|j| j as f32 * 0.1 - 0.4).collect();
        let data: Vec<u8> = q.iter().map(|&v| v as u8).collect();
        let w = QWeights { n: cout, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
        let packed = PackedQWeights::pack(&w).unwrap();
        for act in acts {
            let (want, (oh, ow)) =
                qconv_reference(&x, (n, c, h, wd), &q, (cout, kh, kw), &scales, &bias, (stride, pad, dil), act);
            for kernels in variants() {
                for threads in [1, 3] {
                    let mut got = vec![0f32; want.len()];
                    let mut cx = Context::new().with_threads(threads);
                    let p = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[dil; 2], groups: 1 };
                    let xr = TensorRef { dtype: DType::F32, shape: &[n, c, h, wd], data: bytemuck::cast_slice(&x) };
                    let out_shape = [n, cout, oh, ow];
                    let out =
                        TensorMut { dtype: DType::F32, shape: &out_shape, data: bytemuck::cast_slice_mut(&mut got) };
                    qconv_with(
                        &mut cx,
                        &kernels,
                        xr,
                        &packed,
                        &[cout, c, kh, kw],
                        act,
                        Some(&bias),
                        &NO_EPILOGUE,
                        &p,
                        false,
                        out,
                    )
                    .unwrap();
                    let diffs = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(diffs, 0, "case {case} {act:?} {} at {threads} threads", kernels.name());
                }
            }
        }
    }
}

#[test]
fn qconv_refuses_what_it_does_not_run() {
    use kiln_kernels::quant::qconv;
    use kiln_kernels::{ConvParams, DType, TensorMut, TensorRef};
    let data = vec![1u8; 4 * 18];
    let scales = vec![0.1f32; 4];
    let w = QWeights { n: 4, k: 18, bits: QBits::I8, group: 18, data: &data, scales: &scales, zero_points: None };
    let packed = PackedQWeights::pack(&w).unwrap();
    let x = vec![0f32; 2 * 5 * 5];
    let mut y = vec![0f32; 4 * 3 * 3];
    let p = ConvParams { stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1], groups: 1 };
    let mut run = |act: ActQuant, w_shape: &[usize], groups: usize| {
        let p = ConvParams { groups, ..p };
        let xr = TensorRef { dtype: DType::F32, shape: &[1, 2, 5, 5], data: bytemuck::cast_slice(&x) };
        let out = TensorMut { dtype: DType::F32, shape: &[1, 4, 3, 3], data: bytemuck::cast_slice_mut(&mut y) };
        qconv(&mut Context::new(), xr, &packed, w_shape, act, None, &NO_EPILOGUE, &p, false, out)
    };
    assert!(run(ActQuant::DynamicPerRow, &[4, 2, 3, 3], 1).is_ok());
    assert!(run(ActQuant::Float, &[4, 2, 3, 3], 1).is_err());
    assert!(run(ActQuant::DynamicPerRow, &[4, 2, 3, 3], 2).is_err());
    assert!(run(ActQuant::DynamicPerRow, &[4, 1, 3, 3], 1).is_err());
    assert!(run(ActQuant::DynamicPerRow, &[4, 2, 2, 2], 1).is_err());
}

/// The epilogue (a residual add and an activation, in either order) gives
/// the bits of the same ops after the plain call.
#[test]
fn qconv_epilogue_is_the_ops_after_it() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::qconv;
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let (n, c, h, wd, cout) = (2, 3, 6, 5, 4);
    let k = c * 9;
    let mut seed = 77;
    let x: Vec<f32> = (0..n * c * h * wd).map(|_| lcg(&mut seed) * 3.0).collect();
    let residual: Vec<f32> = (0..n * cout * h * wd).map(|_| lcg(&mut seed) * 4.0).collect();
    let data: Vec<u8> = (0..cout * k).map(|i| ((i * 31) % 255) as u8).collect();
    let scales: Vec<f32> = (0..cout).map(|j| 0.004 + j as f32 * 0.001).collect();
    let bias: Vec<f32> = (0..cout).map(|j| j as f32 - 1.5).collect();
    let w = QWeights { n: cout, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
    let packed = PackedQWeights::pack(&w).unwrap();
    let p = ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups: 1 };
    let shape = [n, cout, h, wd];
    let run = |epilogue: &TensorEpilogue<'_>| {
        let mut y = vec![0f32; n * cout * h * wd];
        let xr = TensorRef { dtype: DType::F32, shape: &[n, c, h, wd], data: bytemuck::cast_slice(&x) };
        let out = TensorMut { dtype: DType::F32, shape: &shape, data: bytemuck::cast_slice_mut(&mut y) };
        let act = ActQuant::DynamicAsymmetric;
        qconv(&mut Context::new(), xr, &packed, &[cout, c, 3, 3], act, Some(&bias), epilogue, &p, false, out).unwrap();
        y
    };
    let plain = run(&NO_EPILOGUE);
    let relu6 = |v: f32| v.clamp(0.0, 6.0);
    let r = TensorRef { dtype: DType::F32, shape: &shape, data: bytemuck::cast_slice(&residual) };
    for residual_first in [true, false] {
        let fused = run(&TensorEpilogue {
            activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
            residual: Some(r),
            residual_first,
        });
        let want: Vec<f32> = plain
            .iter()
            .zip(&residual)
            .map(|(&y, &r)| if residual_first { relu6(y + r) } else { relu6(y) + r })
            .collect();
        assert!(fused.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "residual first: {residual_first}");
        assert!(fused.iter().zip(&plain).any(|(a, b)| a != b), "the epilogue did something");
    }
    // A clamp alone runs in the tile store: still the clamp of each value.
    let clamped = run(&TensorEpilogue {
        activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
        residual: None,
        residual_first: false,
    });
    assert!(clamped.iter().zip(&plain).all(|(a, &b)| a.to_bits() == relu6(b).to_bits()), "clamp alone");
    assert!(plain.iter().any(|&v| v < 0.0) && plain.iter().any(|&v| v > 6.0), "values on both sides");
}

/// Channels-last (`[N, H, W, C]` in and out, the weight stored tap by tap)
/// gives the channels-first result's bytes, permuted, every variant and
/// thread count; with an epilogue too.
#[test]
fn qconv_channels_last_is_channels_first_permuted() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_with, variants};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let nhwc = |v: &[f32], [_, c, h, w]: [usize; 4]| -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        for (i, &x) in v.iter().enumerate() {
            let (b, ch, y, xx) = (i / (c * h * w), (i / (h * w)) % c, (i / w) % h, i % w);
            out[((b * h + y) * w + xx) * c + ch] = x;
        }
        out
    };
    for (case, &((n, c, h, wd), (cout, kh, kw), (stride, pad, dil))) in [
        ((2, 5, 9, 7), (6, 3, 3), (1, 1, 1)),
        ((1, 8, 8, 8), (17, 1, 1), (1, 0, 1)),
        // A 1×1 layer reading the image's pixels as its rows, 35 a batch
        // (a tail past every microkernel's row block).
        ((2, 12, 5, 7), (9, 1, 1), (1, 0, 1)),
        ((1, 3, 11, 9), (4, 3, 2), (2, 2, 2)),
        // An RGB stem: each kernel row's 7 taps × 3 channels one short copy.
        ((1, 3, 20, 18), (8, 7, 7), (2, 3, 1)),
    ]
    .iter()
    .enumerate()
    {
        let mut seed = 300 + case as u64;
        let x: Vec<f32> = (0..n * c * h * wd).map(|_| lcg(&mut seed) * 2.0).collect();
        let k = c * kh * kw;
        let q: Vec<i8> = (0..cout * k).map(|i| ((i * 29 + case) % 255) as u8 as i8).collect();
        // Tap-major: weight `[Cout, kh, kw, C]`.
        let q_taps: Vec<i8> = (0..cout * k)
            .map(|i| {
                let (o, t, ch) = (i / k, (i % k) / c, i % c);
                q[o * k + ch * kh * kw + t]
            })
            .collect();
        let scales: Vec<f32> = (0..cout).map(|j| 0.01 + j as f32 * 0.002).collect();
        let bias: Vec<f32> = (0..cout).map(|j| j as f32 * 0.2 - 0.5).collect();
        let pack = |q: &[i8]| {
            let data: Vec<u8> = q.iter().map(|&v| v as u8).collect();
            let w = QWeights { n: cout, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
            PackedQWeights::pack(&w).unwrap()
        };
        let (first, last) = (pack(&q), pack(&q_taps));
        let p = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[dil; 2], groups: 1 };
        let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
        let ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
        let residual: Vec<f32> = (0..n * cout * oh * ow).map(|_| lcg(&mut seed)).collect();
        let residual_last = nhwc(&residual, [n, cout, oh, ow]);
        let x_last = nhwc(&x, [n, c, h, wd]);
        for act in [ActQuant::DynamicAsymmetric, ActQuant::Static { scale: 0.03, zero_point: -7 }] {
            for kernels in variants() {
                for threads in [1, 3] {
                    let run = |channels_last: bool| {
                        let (xs, shape_in, shape_out, r, w) = if channels_last {
                            (&x_last, [n, h, wd, c], [n, oh, ow, cout], &residual_last, &last)
                        } else {
                            (&x, [n, c, h, wd], [n, cout, oh, ow], &residual, &first)
                        };
                        let mut y = vec![0f32; n * cout * oh * ow];
                        let rr = TensorRef { dtype: DType::F32, shape: &shape_out, data: bytemuck::cast_slice(r) };
                        let epilogue = TensorEpilogue {
                            activation: Some(Activation::Clamp { min: Some(0.0), max: None }),
                            residual: Some(rr),
                            residual_first: true,
                        };
                        let xr = TensorRef { dtype: DType::F32, shape: &shape_in, data: bytemuck::cast_slice(xs) };
                        let out =
                            TensorMut { dtype: DType::F32, shape: &shape_out, data: bytemuck::cast_slice_mut(&mut y) };
                        let mut cx = Context::new().with_threads(threads);
                        let ws = [cout, c, kh, kw];
                        qconv_with(&mut cx, &kernels, xr, w, &ws, act, Some(&bias), &epilogue, &p, channels_last, out)
                            .unwrap();
                        y
                    };
                    let want = nhwc(&run(false), [n, cout, oh, ow]);
                    let got = run(true);
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "case {case} {act:?} {} at {threads} threads", kernels.name());
                }
            }
        }
    }
}

/// int8 activations between layers: a channels-last layer that quantizes
/// its result with the next layer's static parameters (`out_quant`) gives
/// the integers the next layer would make of its f32 result, and the next
/// layer reading them (i8 input) gives the bits it gives from the f32
/// tensor — every variant, 1 to 4 threads, stride and padding, with a
/// clamp or another activation after the bias.
#[test]
fn qconv_int8_between_layers_is_the_float_handoff() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_int8_with, quantize_row_static, variants};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let (n, h, wd, c, c1, c2) = (2, 9, 7, 5, 19, 6);
    let mut seed = 4242;
    let x: Vec<f32> = (0..n * h * wd * c).map(|_| lcg(&mut seed) * 2.0).collect();
    let pack = |cout: usize, k: usize, salt: usize| {
        let data: Vec<u8> = (0..cout * k).map(|i| ((i * 37 + salt) % 255) as u8).collect();
        let scales: Vec<f32> = (0..cout).map(|j| 0.004 + j as f32 * 0.0011).collect();
        let w = QWeights { n: cout, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
        PackedQWeights::pack(&w).unwrap()
    };
    // Layer 1: 3×3, padding 1 (c -> c1); layer 2: 3×3, stride 2 (c1 -> c2).
    let (w1, w2) = (pack(c1, 9 * c, 3), pack(c2, 9 * c1, 11));
    let bias1: Vec<f32> = (0..c1).map(|j| j as f32 * 0.07 - 0.6).collect();
    let bias2: Vec<f32> = (0..c2).map(|j| j as f32 * 0.1 - 0.2).collect();
    let p1 = ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups: 1 };
    let p2 = ConvParams { stride: &[2, 2], padding: &[0, 0], dilation: &[1, 1], groups: 1 };
    let (oh, ow) = ((h - 3) / 2 + 1, (wd - 3) / 2 + 1);
    let mid_shape = [n, h, wd, c1];
    let out_shape = [n, oh, ow, c2];
    let next = (0.0137f32, -9);
    let act2 = ActQuant::Static { scale: next.0, zero_point: next.1 };
    let activations = [None, Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }), Some(Activation::Gelu)];
    for act1 in [ActQuant::Static { scale: 0.02, zero_point: 4 }, ActQuant::DynamicAsymmetric] {
        for activation in activations {
            let e1 = TensorEpilogue { activation, residual: None, residual_first: false };
            for kernels in variants() {
                for threads in 1..=4 {
                    let mut cx = Context::new().with_threads(threads);
                    let xr = TensorRef { dtype: DType::F32, shape: &[n, h, wd, c], data: bytemuck::cast_slice(&x) };
                    // The float handoff.
                    let mut mid = vec![0f32; n * h * wd * c1];
                    let out =
                        TensorMut { dtype: DType::F32, shape: &mid_shape, data: bytemuck::cast_slice_mut(&mut mid) };
                    let ws1 = [c1, c, 3, 3];
                    qconv_int8_with(
                        &mut cx,
                        &kernels,
                        xr,
                        &w1,
                        &ws1,
                        act1,
                        Some(&bias1),
                        &e1,
                        &p1,
                        true,
                        out,
                        None,
                        None,
                    )
                    .unwrap();
                    let run2 = |cx: &mut Context, x: TensorRef<'_>| {
                        let mut y = vec![0f32; n * oh * ow * c2];
                        let out =
                            TensorMut { dtype: DType::F32, shape: &out_shape, data: bytemuck::cast_slice_mut(&mut y) };
                        let ws2 = [c2, c1, 3, 3];
                        qconv_int8_with(
                            cx,
                            &kernels,
                            x,
                            &w2,
                            &ws2,
                            act2,
                            Some(&bias2),
                            &NO_EPILOGUE,
                            &p2,
                            true,
                            out,
                            None,
                            None,
                        )
                        .unwrap();
                        y
                    };
                    let mid_ref = TensorRef { dtype: DType::F32, shape: &mid_shape, data: bytemuck::cast_slice(&mid) };
                    let want = run2(&mut cx, mid_ref);
                    // The int8 handoff.
                    let mut q = vec![0i8; mid.len()];
                    let out = TensorMut { dtype: DType::I8, shape: &mid_shape, data: bytemuck::cast_slice_mut(&mut q) };
                    qconv_int8_with(
                        &mut cx,
                        &kernels,
                        xr,
                        &w1,
                        &ws1,
                        act1,
                        Some(&bias1),
                        &e1,
                        &p1,
                        true,
                        out,
                        Some(next),
                        None,
                    )
                    .unwrap();
                    let mut q_want = vec![0i8; mid.len()];
                    quantize_row_static(&mid, next.0, next.1, &mut q_want);
                    let what = format!("{act1:?} {activation:?} {} at {threads} threads", kernels.name());
                    assert_eq!(q, q_want, "the i8 result: {what}");
                    let q_ref = TensorRef { dtype: DType::I8, shape: &mid_shape, data: bytemuck::cast_slice(&q) };
                    let got = run2(&mut cx, q_ref);
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "the next layer: {what}");
                }
            }
        }
    }
    // Both ends of the int8 range are met.
    let mut q = vec![0i8; n * h * wd * c1];
    let xr = TensorRef { dtype: DType::F32, shape: &[n, h, wd, c], data: bytemuck::cast_slice(&x) };
    let out = TensorMut { dtype: DType::I8, shape: &mid_shape, data: bytemuck::cast_slice_mut(&mut q) };
    let kernels = variants()[0];
    let act1 = ActQuant::Static { scale: 0.02, zero_point: 4 };
    qconv_int8_with(
        &mut Context::new(),
        &kernels,
        xr,
        &w1,
        &[c1, c, 3, 3],
        act1,
        Some(&bias1),
        &NO_EPILOGUE,
        &p1,
        true,
        out,
        Some(next),
        None,
    )
    .unwrap();
    assert!(q.contains(&-128) && q.contains(&127), "saturation on both sides");
}

/// What the int8 handoff refuses: an i8 input without static activations,
/// an i8 output without parameters (or parameters with an f32 output),
/// channels-first.
#[test]
fn qconv_int8_refuses_what_it_does_not_run() {
    use kiln_kernels::quant::qconv_int8;
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let data = vec![1u8; 4 * 18];
    let scales = vec![0.1f32; 4];
    let w = QWeights { n: 4, k: 18, bits: QBits::I8, group: 18, data: &data, scales: &scales, zero_points: None };
    let packed = PackedQWeights::pack(&w).unwrap();
    let xf = vec![0f32; 5 * 5 * 2];
    let xq = vec![0i8; 5 * 5 * 2];
    let r = vec![0f32; 3 * 3 * 4];
    let p = ConvParams { stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1], groups: 1 };
    let stat = ActQuant::Static { scale: 0.5, zero_point: 1 };
    let run = |x_i8: bool, act: ActQuant, out_i8: bool, q: Option<(f32, i32)>, channels_last: bool, residual: bool| {
        let (mut yf, mut yq) = (vec![0f32; 36], vec![0i8; 36]);
        let x = if x_i8 {
            TensorRef { dtype: DType::I8, shape: &[1, 5, 5, 2], data: bytemuck::cast_slice(&xq) }
        } else {
            TensorRef { dtype: DType::F32, shape: &[1, 5, 5, 2], data: bytemuck::cast_slice(&xf) }
        };
        let shape = [1, 3, 3, 4];
        let out = if out_i8 {
            TensorMut { dtype: DType::I8, shape: &shape, data: bytemuck::cast_slice_mut(&mut yq) }
        } else {
            TensorMut { dtype: DType::F32, shape: &shape, data: bytemuck::cast_slice_mut(&mut yf) }
        };
        let rr = TensorRef { dtype: DType::F32, shape: &shape, data: bytemuck::cast_slice(&r) };
        let e = TensorEpilogue { activation: None, residual: residual.then_some(rr), residual_first: false };
        let ws = [4, 2, 3, 3];
        qconv_int8(&mut Context::new(), x, &packed, &ws, act, None, &e, &p, channels_last, out, q, None)
    };
    let q = Some((0.25, 0));
    assert!(run(true, stat, true, q, true, false).is_ok());
    assert!(run(true, stat, false, None, true, false).is_ok());
    assert!(run(true, ActQuant::DynamicPerRow, false, None, true, false).is_err());
    assert!(run(false, stat, true, None, true, false).is_err());
    assert!(run(false, stat, false, q, true, false).is_err());
    assert!(run(false, stat, true, q, false, false).is_err());
    assert!(run(false, stat, true, q, true, true).is_ok(), "an i8 result after an f32 residual");
    assert!(run(false, stat, true, Some((0.0, 0)), true, false).is_err());
    assert!(run(false, stat, true, Some((0.5, 128)), true, false).is_err());
}

/// int8 residual adds: a dense channels-last layer reading an i8 residual
/// `r` (scale `sr`, zero point `zr`) gives, for each output, torch's
/// `quantize(act(conv + dequantize(r)))` (or the add after the
/// activation): the f32 layer with the f32 residual `(f32(r) − zr) · sr`,
/// its result quantized by torch's rule (`quantize_row_static`) — every
/// variant, 1 to 4 threads, the same bytes; an f32 result is that f32
/// layer's bits.
#[test]
fn qconv_int8_residual_is_torchs_int8_add() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_int8_with, variants};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let (n, h, wd, c, cout) = (2, 7, 9, 6, 21);
    let mut seed = 777;
    let xq: Vec<i8> = (0..n * h * wd * c).map(|_| (lcg(&mut seed) * 127.0) as i8).collect();
    let rq: Vec<i8> = (0..n * h * wd * cout).map(|_| (lcg(&mut seed) * 128.0).clamp(-128.0, 127.0) as i8).collect();
    let data: Vec<u8> = (0..cout * 9 * c).map(|i| ((i * 53 + 7) % 255) as u8).collect();
    let scales: Vec<f32> = (0..cout).map(|j| 0.003 + j as f32 * 0.0007).collect();
    let wq =
        QWeights { n: cout, k: 9 * c, bits: QBits::I8, group: 9 * c, data: &data, scales: &scales, zero_points: None };
    let w = PackedQWeights::pack(&wq).unwrap();
    let bias: Vec<f32> = (0..cout).map(|j| j as f32 * 0.05 - 0.5).collect();
    let p = ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups: 1 };
    let (x_shape, o_shape, ws) = ([n, h, wd, c], [n, h, wd, cout], [cout, c, 3, 3]);
    let act = ActQuant::Static { scale: 0.021, zero_point: -3 };
    let (res, next) = ((0.0173f32, 9), (0.0291f32, -17));
    let r_deq: Vec<f32> = rq.iter().map(|&q| (q as f32 - res.1 as f32) * res.0).collect();
    let xr = TensorRef { dtype: DType::I8, shape: &x_shape, data: bytemuck::cast_slice(&xq) };
    let relu = Some(Activation::Clamp { min: Some(0.0), max: None });
    let mut saturated = (false, false);
    // ReLU as a clamp and as torch's relu (fused in the store alike).
    let cases = [
        (None, true),
        (relu, true),
        (relu, false),
        (Some(Activation::Relu), true),
        (Some(Activation::Relu), false),
        (Some(Activation::Gelu), true),
    ];
    for ((activation, residual_first), bias) in cases.into_iter().flat_map(|c| [(c, Some(&bias[..])), (c, None)]) {
        // The definition: the f32 layer with the dequantized residual.
        let rf = TensorRef { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice(&r_deq) };
        let e = TensorEpilogue { activation, residual: Some(rf), residual_first };
        let mut want = vec![0f32; n * h * wd * cout];
        let out = TensorMut { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice_mut(&mut want) };
        let kernels = variants()[0];
        qconv_int8_with(&mut Context::new(), &kernels, xr, &w, &ws, act, bias, &e, &p, true, out, None, None).unwrap();
        let mut want_q = vec![0i8; want.len()];
        quantize_row_static(&want, next.0, next.1, &mut want_q);
        saturated.0 |= want_q.contains(&-128);
        saturated.1 |= want_q.contains(&127);
        let ri = TensorRef { dtype: DType::I8, shape: &o_shape, data: bytemuck::cast_slice(&rq) };
        let e_i8 = TensorEpilogue { activation, residual: Some(ri), residual_first };
        let e_f32 = TensorEpilogue { activation, residual: Some(rf), residual_first };
        for kernels in variants() {
            for threads in 1..=4 {
                let what = format!(
                    "{activation:?} first {residual_first} bias {}: {} at {threads} threads",
                    bias.is_some(),
                    kernels.name()
                );
                let mut cx = Context::new().with_threads(threads);
                let mut got = vec![0f32; want.len()];
                let out = TensorMut { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice_mut(&mut got) };
                qconv_int8_with(&mut cx, &kernels, xr, &w, &ws, act, bias, &e_i8, &p, true, out, None, Some(res))
                    .unwrap();
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "f32 result: {what}");
                // An i8 result, from an i8 residual and from the same values as f32.
                for (e, rq) in [(&e_i8, Some(res)), (&e_f32, None)] {
                    let mut got_q = vec![0i8; want.len()];
                    let out =
                        TensorMut { dtype: DType::I8, shape: &o_shape, data: bytemuck::cast_slice_mut(&mut got_q) };
                    qconv_int8_with(&mut cx, &kernels, xr, &w, &ws, act, bias, e, &p, true, out, Some(next), rq)
                        .unwrap();
                    assert_eq!(
                        got_q,
                        want_q,
                        "i8 result, residual {}: {what}",
                        if rq.is_some() { "i8" } else { "f32" }
                    );
                }
            }
        }
    }
    assert!(saturated.0 && saturated.1, "both ends of the int8 range are met");
    // An i8 residual needs its parameters, valid ones, and channels-last;
    // parameters need an i8 residual.
    let ri = TensorRef { dtype: DType::I8, shape: &o_shape, data: bytemuck::cast_slice(&rq) };
    let rf = TensorRef { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice(&r_deq) };
    let kernels = variants()[0];
    let run = |r: TensorRef<'_>, rq: Option<(f32, i32)>, channels_last: bool| {
        let mut y = vec![0f32; n * h * wd * cout];
        let out = TensorMut { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice_mut(&mut y) };
        let e = TensorEpilogue { activation: None, residual: Some(r), residual_first: true };
        let (xs, os) = if channels_last { (x_shape, o_shape) } else { ([n, c, h, wd], [n, cout, h, wd]) };
        let xr = TensorRef { dtype: DType::I8, shape: &xs, data: bytemuck::cast_slice(&xq) };
        let r = TensorRef { shape: &os, ..r };
        let e = TensorEpilogue { residual: Some(r), ..e };
        let out = TensorMut { shape: &os, ..out };
        qconv_int8_with(&mut Context::new(), &kernels, xr, &w, &ws, act, None, &e, &p, channels_last, out, None, rq)
    };
    assert!(run(ri, Some(res), true).is_ok());
    assert!(run(ri, None, true).is_err());
    assert!(run(ri, Some((0.0, 0)), true).is_err());
    assert!(run(ri, Some((0.5, 200)), true).is_err());
    assert!(run(ri, Some(res), false).is_err());
    assert!(run(rf, Some(res), true).is_err());
}

/// Max pooling of i8 values (channels-last) is the f32 max pool of the
/// same values: ResNet's 3×3 / 2 with padding 1, and a dilated 2×3 window,
/// 1 to 4 threads (the same bytes).
#[test]
fn max_pool_of_int8_is_the_max_of_the_values() {
    use kiln_kernels::{pool_channels_last_cx, DType, PoolKind, PoolParams, TensorMut, TensorRef};
    let (n, h, w, c) = (2, 33, 29, 40);
    let mut seed = 99;
    let xq: Vec<i8> = (0..n * h * w * c).map(|_| (lcg(&mut seed) * 128.0).clamp(-128.0, 127.0) as i8).collect();
    let xf: Vec<f32> = xq.iter().map(|&v| v as f32).collect();
    // Kernel, stride, padding, dilation.
    type Window = [[usize; 2]; 4];
    let cases: [Window; 2] = [[[3, 3], [2, 2], [1, 1], [1, 1]], [[2, 3], [1, 2], [0, 1], [2, 1]]];
    for [kernel, stride, padding, dilation] in cases {
        let p = PoolParams {
            kernel: &kernel,
            stride: &stride,
            padding: &padding,
            dilation: &dilation,
            count_include_pad: false,
            divisor: None,
        };
        let out_dim = |d: usize, i: usize| (i + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) / stride[d] + 1;
        let os = [n, out_dim(0, h), out_dim(1, w), c];
        let len: usize = os.iter().product();
        let mut want = vec![0f32; len];
        let xr = TensorRef { dtype: DType::F32, shape: &[n, h, w, c], data: bytemuck::cast_slice(&xf) };
        let out = TensorMut { dtype: DType::F32, shape: &os, data: bytemuck::cast_slice_mut(&mut want) };
        pool_channels_last_cx(PoolKind::Max, xr, &p, out, &mut Context::new()).unwrap();
        let want: Vec<i8> = want.iter().map(|&v| v as i8).collect();
        let xr = TensorRef { dtype: DType::I8, shape: &[n, h, w, c], data: bytemuck::cast_slice(&xq) };
        for threads in 1..=4 {
            let mut got = vec![0i8; len];
            let out = TensorMut { dtype: DType::I8, shape: &os, data: bytemuck::cast_slice_mut(&mut got) };
            pool_channels_last_cx(PoolKind::Max, xr, &p, out, &mut Context::new().with_threads(threads)).unwrap();
            assert_eq!(got, want, "{kernel:?} / {stride:?} at {threads} threads");
        }
        // Average pooling of i8 values is not defined here.
        let mut got = vec![0i8; len];
        let out = TensorMut { dtype: DType::I8, shape: &os, data: bytemuck::cast_slice_mut(&mut got) };
        assert!(pool_channels_last_cx(PoolKind::Avg, xr, &p, out, &mut Context::new()).is_err());
    }
}

/// The int8 depthwise convolution against its definition (quantize each
/// input value, exact integer sums over the taps inside the image, `(f32(acc)
/// · s) · scale + bias`, then the activation), every variant, 1 to 4
/// threads, f32 or i8 input, f32 or i8 output (the f32 result quantized).
#[test]
fn qconv_depthwise_follows_the_definition() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_depthwise_with, variants, DepthwiseQWeights};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    // (N, H, W, C), (kh, kw), (stride, padding, dilation).
    let cases = [
        ((2, 9, 7, 5), (3, 3), (1, 1, 1)),
        ((1, 11, 10, 96), (3, 3), (2, 1, 1)),
        ((1, 8, 8, 70), (5, 5), (1, 2, 1)),
        ((1, 12, 9, 3), (3, 2), (1, 2, 2)),
        // Several 4-pixel blocks and a tail, odd channel counts past one
        // 16-channel block, stride 2, no padding, a 1-wide kernel.
        ((1, 14, 13, 32), (3, 3), (1, 1, 1)),
        ((2, 15, 15, 33), (3, 3), (2, 1, 1)),
        ((1, 7, 18, 17), (3, 3), (2, 0, 1)),
        ((1, 9, 11, 48), (1, 3), (1, 1, 1)),
        ((1, 10, 10, 24), (3, 1), (2, 1, 1)),
        // The AVX-512 row's blocks: 32 channels with a masked tail (40,
        // 50), a last block of 16 (144) or fewer (20) in one vector, and
        // 8-pixel blocks with tails of 5 and 4 pixels, dilated too.
        ((1, 6, 21, 144), (3, 3), (1, 1, 1)),
        ((1, 9, 15, 40), (3, 3), (2, 1, 1)),
        ((2, 5, 12, 20), (3, 3), (1, 1, 1)),
        ((1, 10, 19, 50), (3, 3), (1, 2, 2)),
    ];
    let mut clamped = (false, false);
    for (case, &((n, h, wd, c), (kh, kw), (stride, pad, dil))) in cases.iter().enumerate() {
        let mut seed = 900 + case as u64;
        let x: Vec<f32> = (0..n * h * wd * c).map(|_| lcg(&mut seed) * 3.0).collect();
        let q: Vec<i8> = (0..c * kh * kw).map(|i| ((i * 71 + case * 13) % 256) as u8 as i8).collect();
        let scales: Vec<f32> = (0..c).map(|j| 0.002 + j as f32 * 0.0003).collect();
        let bias: Vec<f32> = (0..c).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
        let w = DepthwiseQWeights::new(&q, &[c, 1, kh, kw], &scales).unwrap();
        let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
        let ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
        let (s, zp) = (0.0231f32, -17);
        let qx: Vec<i8> =
            x.iter().map(|&v| ((v * (1.0 / s)).round_ties_even() + zp as f32).clamp(-128.0, 127.0) as i8).collect();
        let mut want = vec![0f32; n * oh * ow * c];
        for b in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..c {
                        let mut acc = 0i32;
                        for ty in 0..kh {
                            for tx in 0..kw {
                                let (iy, ix) = (
                                    (oy * stride + ty * dil) as isize - pad as isize,
                                    (ox * stride + tx * dil) as isize - pad as isize,
                                );
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let v = qx[((b * h + iy as usize) * wd + ix as usize) * c + ch] as i32 - zp;
                                acc += v * q[(ch * kh + ty) * kw + tx] as i32;
                            }
                        }
                        let y = (acc as f32 * s) * scales[ch] + bias[ch];
                        want[((b * oh + oy) * ow + ox) * c + ch] = y.clamp(0.0, 6.0);
                    }
                }
            }
        }
        // The clamp in the row function's registers, or (with a residual
        // added after it) on each finished row.
        let res: Vec<f32> = (0..want.len()).map(|_| lcg(&mut seed)).collect();
        let p = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[dil; 2], groups: c };
        let act = ActQuant::Static { scale: s, zero_point: zp };
        let next = (0.0173f32, 5);
        let out_shape = [n, oh, ow, c];
        for with_residual in [false, true] {
            let want: Vec<f32> =
                if with_residual { want.iter().zip(&res).map(|(a, b)| a + b).collect() } else { want.clone() };
            let residual = with_residual.then(|| TensorRef {
                dtype: DType::F32,
                shape: &out_shape,
                data: bytemuck::cast_slice(&res),
            });
            let relu6 = TensorEpilogue {
                activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
                residual,
                residual_first: false,
            };
            let mut q_want = vec![0i8; want.len()];
            quantize_row_static(&want, next.0, next.1, &mut q_want);
            for kernels in variants() {
                for threads in 1..=4 {
                    for x_i8 in [false, true] {
                        let xr = if x_i8 {
                            TensorRef { dtype: DType::I8, shape: &[n, h, wd, c], data: bytemuck::cast_slice(&qx) }
                        } else {
                            TensorRef { dtype: DType::F32, shape: &[n, h, wd, c], data: bytemuck::cast_slice(&x) }
                        };
                        let what = format!(
                            "case {case} {} at {threads} threads, i8 input {x_i8}, residual {with_residual}",
                            kernels.name()
                        );
                        let mut cx = Context::new().with_threads(threads);
                        let mut got = vec![0f32; want.len()];
                        let out = TensorMut {
                            dtype: DType::F32,
                            shape: &out_shape,
                            data: bytemuck::cast_slice_mut(&mut got),
                        };
                        qconv_depthwise_with(&mut cx, &kernels, xr, &w, act, Some(&bias), &relu6, &p, out, None)
                            .unwrap();
                        let diffs = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                        assert_eq!(diffs, 0, "{what}");
                        let mut gq = vec![0i8; want.len()];
                        let out =
                            TensorMut { dtype: DType::I8, shape: &out_shape, data: bytemuck::cast_slice_mut(&mut gq) };
                        qconv_depthwise_with(&mut cx, &kernels, xr, &w, act, Some(&bias), &relu6, &p, out, Some(next))
                            .unwrap();
                        assert_eq!(gq, q_want, "i8 output: {what}");
                    }
                }
            }
        }
        clamped.0 |= want.contains(&0.0);
        clamped.1 |= want.contains(&6.0);
    }
    assert_eq!(clamped, (true, true), "both clamps met");
}

/// The int8 depthwise convolution without a bias or an activation (the
/// row's other epilogue branches), and with a non-clamp activation (run
/// on the finished row): every variant, 1 to 4 threads, gives the generic
/// variant's bits, f32 or i8 output.
#[test]
fn qconv_depthwise_epilogues_every_variant_is_bit_exact() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_depthwise_with, variants, DepthwiseQWeights};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let (n, h, wd, c) = (1, 9, 19, 72);
    let (k, stride, pad) = (3, 1, 1);
    let mut seed = 77;
    let x: Vec<f32> = (0..n * h * wd * c).map(|_| lcg(&mut seed) * 3.0).collect();
    let q: Vec<i8> = (0..c * k * k).map(|i| ((i * 53 + 7) % 256) as u8 as i8).collect();
    let scales: Vec<f32> = (0..c).map(|j| 0.003 + j as f32 * 0.0002).collect();
    let w = DepthwiseQWeights::new(&q, &[c, 1, k, k], &scales).unwrap();
    let (oh, ow) = ((h + 2 * pad - k) / stride + 1, (wd + 2 * pad - k) / stride + 1);
    let out_shape = [n, oh, ow, c];
    let p = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[1; 2], groups: c };
    let act = ActQuant::Static { scale: 0.0231, zero_point: 9 };
    let xr = TensorRef { dtype: DType::F32, shape: &[n, h, wd, c], data: bytemuck::cast_slice(&x) };
    let all = variants();
    for activation in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
        let e = TensorEpilogue { activation, residual: None, residual_first: false };
        let run = |kernels, threads, quant: Option<(f32, i32)>| {
            let mut cx = Context::new().with_threads(threads);
            let mut f = vec![0f32; n * oh * ow * c];
            let mut g = vec![0i8; f.len()];
            let (dtype, data): (DType, &mut [u8]) = match quant {
                Some(_) => (DType::I8, bytemuck::cast_slice_mut(&mut g)),
                None => (DType::F32, bytemuck::cast_slice_mut(&mut f)),
            };
            let out = TensorMut { dtype, shape: &out_shape, data };
            qconv_depthwise_with(&mut cx, kernels, xr, &w, act, None, &e, &p, out, quant).unwrap();
            (f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), g)
        };
        for quant in [None, Some((0.0311f32, -4))] {
            let want = run(&all[0], 1, quant);
            assert!(want.0.iter().any(|&v| v != 0) || want.1.iter().any(|&v| v != 0), "a non-zero result");
            for kernels in &all {
                for threads in 1..=4 {
                    let got = run(kernels, threads, quant);
                    assert_eq!(got, want, "{} at {threads} threads, {activation:?}, {quant:?}", kernels.name());
                }
            }
        }
    }
}

/// The int8 depthwise row's epilogue on values at the bottom of the f32
/// range: weight scales in the subnormals, so products round to −0 or to
/// subnormals, through a ReLU6 clamp in the row's registers. The portable
/// clamp keeps a −0 (`−0 < 0` is false), which a vector max instruction
/// (`fmax(0, −0) = +0` on NEON) would not: every variant, 1 to 4 threads,
/// gives the generic variant's bits, f32 or i8 output.
#[test]
fn qconv_depthwise_keeps_negative_zero_and_subnormals() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_depthwise_with, variants, DepthwiseQWeights};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let (n, h, wd, c) = (1, 6, 11, 21);
    let mut seed = 5;
    let x: Vec<f32> = (0..n * h * wd * c).map(|_| lcg(&mut seed) * 3.0).collect();
    let q: Vec<i8> = (0..c * 9).map(|i| ((i * 37 + 3) % 256) as u8 as i8).collect();
    // 1 to 3 times the smallest subnormal.
    let scales: Vec<f32> = (0..c).map(|j| f32::from_bits(1 + (j % 3) as u32)).collect();
    let w = DepthwiseQWeights::new(&q, &[c, 1, 3, 3], &scales).unwrap();
    let out_shape = [n, h, wd, c];
    let p = ConvParams { stride: &[1; 2], padding: &[1; 2], dilation: &[1; 2], groups: c };
    let act = ActQuant::Static { scale: 0.0231, zero_point: 3 };
    let xr = TensorRef { dtype: DType::F32, shape: &[n, h, wd, c], data: bytemuck::cast_slice(&x) };
    let e = TensorEpilogue {
        activation: Some(Activation::Clamp { min: Some(0.0), max: Some(6.0) }),
        residual: None,
        residual_first: false,
    };
    let all = variants();
    let run = |kernels, threads, quant: Option<(f32, i32)>| {
        let mut cx = Context::new().with_threads(threads);
        let mut f = vec![0f32; n * h * wd * c];
        let mut g = vec![0i8; f.len()];
        let (dtype, data): (DType, &mut [u8]) = match quant {
            Some(_) => (DType::I8, bytemuck::cast_slice_mut(&mut g)),
            None => (DType::F32, bytemuck::cast_slice_mut(&mut f)),
        };
        let out = TensorMut { dtype, shape: &out_shape, data };
        qconv_depthwise_with(&mut cx, kernels, xr, &w, act, None, &e, &p, out, quant).unwrap();
        (f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), g)
    };
    let want = run(&all[0], 1, None);
    assert!(want.0.contains(&(-0f32).to_bits()), "a −0 in the generic result");
    assert!(want.0.iter().any(|&b| b != 0 && f32::from_bits(b).is_subnormal()), "a subnormal in the generic result");
    for quant in [None, Some((1e-44f32, -4))] {
        let want = run(&all[0], 1, quant);
        for kernels in &all {
            for threads in 1..=4 {
                let got = run(kernels, threads, quant);
                assert_eq!(got, want, "{} at {threads} threads, {quant:?}", kernels.name());
            }
        }
    }
}

/// Channels-last convolutions whose pixels are whole lane steps (`C` a
/// multiple of 4): an entry with a window kernel (AVX-512 VNNI) reads
/// each output pixel's window from the padded image in place instead of
/// gathering it — the same sums, so the definition's bits, for every
/// variant (the others gather) and thread count: strides, padding,
/// dilation, uneven kernels, pixel counts with a tail past the row block
/// and over several row blocks, f32 and i8 inputs and results. Fails when
/// a tap's offset, a row's start or the row step of a stride is off.
#[test]
fn qconv_windows_read_in_place_are_the_definition() {
    use kiln_kernels::quant::{qconv_int8_with, quantize_row_static, variants};
    use kiln_kernels::{ConvParams, DType, TensorMut, TensorRef};
    let nhwc = |v: &[f32], [_, c, h, w]: [usize; 4]| -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        for (i, &x) in v.iter().enumerate() {
            let (b, ch, y, xx) = (i / (c * h * w), (i / (h * w)) % c, (i / w) % h, i % w);
            out[((b * h + y) * w + xx) * c + ch] = x;
        }
        out
    };
    // (N, C, H, W), (Cout, kh, kw), (stride, padding, dilation).
    let cases = [
        ((2, 16, 13, 11), (40, 3, 3), (1, 1, 1)),
        ((1, 4, 15, 14), (33, 3, 3), (2, 1, 1)),
        ((1, 8, 12, 10), (17, 3, 3), (1, 2, 2)),
        ((2, 12, 9, 9), (7, 1, 1), (2, 0, 1)),
        ((1, 8, 11, 9), (16, 2, 3), (1, 1, 1)),
        ((1, 64, 7, 7), (64, 3, 3), (1, 1, 1)),
    ];
    let act = ActQuant::Static { scale: 0.021, zero_point: 3 };
    let next = (0.0173f32, -5);
    for (case, &((n, c, h, wd), (cout, kh, kw), (stride, pad, dil))) in cases.iter().enumerate() {
        let mut seed = 700 + case as u64;
        let x: Vec<f32> = (0..n * c * h * wd).map(|_| lcg(&mut seed) * 2.5).collect();
        let k = c * kh * kw;
        let q: Vec<i8> = (0..cout * k).map(|i| ((i * 53 + case * 7) % 255) as u8 as i8).collect();
        // Tap-major, as the channels-last convolution reads it.
        let q_taps: Vec<i8> = (0..cout * k)
            .map(|i| {
                let (o, t, ch) = (i / k, (i % k) / c, i % c);
                q[o * k + ch * kh * kw + t]
            })
            .collect();
        let scales: Vec<f32> = (0..cout).map(|j| 0.003 + j as f32 * 0.0007).collect();
        let bias: Vec<f32> = (0..cout).map(|j| j as f32 * 0.1 - 0.4).collect();
        let data: Vec<u8> = q_taps.iter().map(|&v| v as u8).collect();
        let w = QWeights { n: cout, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
        let packed = PackedQWeights::pack(&w).unwrap();
        let (want, (oh, ow)) =
            qconv_reference(&x, (n, c, h, wd), &q, (cout, kh, kw), &scales, &bias, (stride, pad, dil), act);
        let want = nhwc(&want, [n, cout, oh, ow]);
        let mut want_q = vec![0i8; want.len()];
        quantize_row_static(&want, next.0, next.1, &mut want_q);
        let x_last = nhwc(&x, [n, c, h, wd]);
        let mut x_q = vec![0i8; x_last.len()];
        quantize_row_static(&x_last, 0.021, 3, &mut x_q);
        let p = ConvParams { stride: &[stride; 2], padding: &[pad; 2], dilation: &[dil; 2], groups: 1 };
        let (shape_in, shape_out) = ([n, h, wd, c], [n, oh, ow, cout]);
        for kernels in variants() {
            for threads in 1..=4 {
                let what = format!("case {case} {} at {threads} threads", kernels.name());
                let mut cx = Context::new().with_threads(threads);
                // f32 in, f32 out.
                let mut got = vec![0f32; want.len()];
                let xr = TensorRef { dtype: DType::F32, shape: &shape_in, data: bytemuck::cast_slice(&x_last) };
                let out = TensorMut { dtype: DType::F32, shape: &shape_out, data: bytemuck::cast_slice_mut(&mut got) };
                let ws = [cout, c, kh, kw];
                qconv_int8_with(
                    &mut cx,
                    &kernels,
                    xr,
                    &packed,
                    &ws,
                    act,
                    Some(&bias),
                    &NO_EPILOGUE,
                    &p,
                    true,
                    out,
                    None,
                    None,
                )
                .unwrap();
                let diffs = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(diffs, 0, "f32: {what}");
                // i8 in (the same integers), i8 out.
                let mut got_q = vec![0i8; want.len()];
                let xr = TensorRef { dtype: DType::I8, shape: &shape_in, data: bytemuck::cast_slice(&x_q) };
                let out = TensorMut { dtype: DType::I8, shape: &shape_out, data: bytemuck::cast_slice_mut(&mut got_q) };
                qconv_int8_with(
                    &mut cx,
                    &kernels,
                    xr,
                    &packed,
                    &ws,
                    act,
                    Some(&bias),
                    &NO_EPILOGUE,
                    &p,
                    true,
                    out,
                    Some(next),
                    None,
                )
                .unwrap();
                assert_eq!(got_q, want_q, "i8: {what}");
            }
        }
    }
}

/// The quantizing tile store on the values where a shortcut would show: a
/// bias of NaN, ±∞ and ±1e30 (outputs NaN, infinite, far past the int8
/// range), output scales that make `v · (1/scale)` overflow (1e-30), round
/// everything to the zero point (1e30) or whose reciprocal is infinite (a
/// subnormal), zero points at both ends, clamps with an upper bound only,
/// ReLU6, a lower bound above the upper one, and residuals (f32 with NaN
/// and ∞, i8) before and after the clamp — every variant, 1 and 3 threads,
/// against the f32 layer quantized by `quantize_row_static`, 37 columns
/// (a full and a partial 32-column tile) and rows off the tile height.
#[test]
fn qconv_int8_store_edge_values_are_the_definition() {
    use kiln_isa::Activation;
    use kiln_kernels::quant::{qconv_int8_with, variants};
    use kiln_kernels::{ConvParams, DType, TensorEpilogue, TensorMut, TensorRef};
    let (n, h, wd, c, cout) = (1, 5, 7, 8, 37);
    let mut seed = 99;
    let xq: Vec<i8> = (0..n * h * wd * c).map(|_| (lcg(&mut seed) * 127.0) as i8).collect();
    let rq: Vec<i8> = (0..n * h * wd * cout).map(|_| (lcg(&mut seed) * 127.0) as i8).collect();
    let mut r_f32: Vec<f32> = (0..n * h * wd * cout).map(|_| lcg(&mut seed) * 3.0).collect();
    for (i, v) in r_f32.iter_mut().enumerate().filter(|(i, _)| i % 13 == 0) {
        *v = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30][i / 13 % 4];
    }
    let data: Vec<u8> = (0..cout * c).map(|i| ((i * 61 + 3) % 255) as u8).collect();
    let scales: Vec<f32> = (0..cout).map(|j| 0.004 + j as f32 * 0.0005).collect();
    let wq = QWeights { n: cout, k: c, bits: QBits::I8, group: c, data: &data, scales: &scales, zero_points: None };
    let w = PackedQWeights::pack(&wq).unwrap();
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30];
    let bias: Vec<f32> =
        (0..cout).map(|j| if j < specials.len() { specials[j] } else { j as f32 * 0.09 - 1.7 }).collect();
    let p = ConvParams { stride: &[1, 1], padding: &[0, 0], dilation: &[1, 1], groups: 1 };
    let (x_shape, o_shape, ws) = ([n, h, wd, c], [n, h, wd, cout], [cout, c, 1, 1]);
    let act = ActQuant::Static { scale: 0.03, zero_point: 5 };
    let res = (0.0173f32, 9);
    let r_deq: Vec<f32> = rq.iter().map(|&q| (q as f32 - res.1 as f32) * res.0).collect();
    let xr = TensorRef { dtype: DType::I8, shape: &x_shape, data: bytemuck::cast_slice(&xq) };
    let clamp = |min, max| Some(Activation::Clamp { min, max });
    let activations = [
        None,
        Some(Activation::Relu),
        clamp(Some(0.0), Some(6.0)),
        clamp(None, Some(0.5)),
        clamp(Some(2.0), Some(1.0)),
    ];
    let outputs = [(0.0291f32, -17), (1e-30, 127), (1e30, -128), (1e-40, 0), (0.5, -128), (0.07, 127)];
    // (residual as the definition adds it, as the store reads it, its parameters)
    let ri = TensorRef { dtype: DType::I8, shape: &o_shape, data: bytemuck::cast_slice(&rq) };
    let rd = TensorRef { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice(&r_deq) };
    let rf = TensorRef { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice(&r_f32) };
    let residuals = [None, Some((rd, ri, Some(res))), Some((rf, rf, None))];
    let mut met = [false; 3];
    for activation in activations {
        for (residual, residual_first) in residuals.iter().flat_map(|r| [(r, true), (r, false)]) {
            let e_def = TensorEpilogue { activation, residual: residual.map(|r| r.0), residual_first };
            let e = TensorEpilogue { activation, residual: residual.map(|r| r.1), residual_first };
            let res_q = residual.and_then(|r| r.2);
            let mut want = vec![0f32; n * h * wd * cout];
            let out = TensorMut { dtype: DType::F32, shape: &o_shape, data: bytemuck::cast_slice_mut(&mut want) };
            let generic = variants()[0];
            qconv_int8_with(
                &mut Context::new(),
                &generic,
                xr,
                &w,
                &ws,
                act,
                Some(&bias),
                &e_def,
                &p,
                true,
                out,
                None,
                None,
            )
            .unwrap();
            for next in outputs {
                let mut want_q = vec![0i8; want.len()];
                quantize_row_static(&want, next.0, next.1, &mut want_q);
                met[0] |= want_q.contains(&-128);
                met[1] |= want_q.contains(&127);
                met[2] |= want.iter().zip(&want_q).any(|(v, &q)| v.is_nan() && q == 0);
                for kernels in variants() {
                    for threads in [1, 3] {
                        let mut cx = Context::new().with_threads(threads);
                        let mut got = vec![0i8; want.len()];
                        let out =
                            TensorMut { dtype: DType::I8, shape: &o_shape, data: bytemuck::cast_slice_mut(&mut got) };
                        qconv_int8_with(
                            &mut cx,
                            &kernels,
                            xr,
                            &w,
                            &ws,
                            act,
                            Some(&bias),
                            &e,
                            &p,
                            true,
                            out,
                            Some(next),
                            res_q,
                        )
                        .unwrap();
                        let what = format!(
                            "{activation:?}, residual {:?} first {residual_first}, output {next:?}: {} at {threads} threads",
                            residual.map(|r| r.1.dtype),
                            kernels.name()
                        );
                        let diff = got.iter().zip(&want_q).position(|(a, b)| a != b);
                        assert!(diff.is_none(), "{what}: first difference at {diff:?}");
                    }
                }
            }
        }
    }
    assert_eq!(met, [true; 3], "both ends of the int8 range and NaN outputs are met");
}
