//! The quantized linear layer against its definition (kiln_kernels::quant's
//! module doc), computed here from the dequantized weights.

use kiln_kernels::quant::{qlinear, quantize_row_i8, row_scale_symmetric, ActQuant, PackedQWeights, QBits, QWeights};
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
