//! Rounding error of the Winograd tiles on ResNet-18's 3×3 stride-1
//! convolutions (batch 1, padding 1): F(2×2), F(4×4) and the tap path
//! against an f64 direct convolution of the same f32 inputs, on uniform
//! random data in [-1, 1) (weights scaled by 1/√(9·Cin), as He-initialised
//! layers keep the output's scale near the input's). Prints the largest
//! absolute error over the largest |reference| and the RMS error over the
//! RMS reference.
//!
//!     cargo run --release -p kiln-kernels --example winograd_error

use kiln_kernels::{best, conv_with, Context, ConvAlgorithm, ConvParams, DType, TensorMut, TensorRef};
use rand::{Rng, SeedableRng};

/// `[Cout, H, W]` of the f64 convolution of `x` (`[Cin, H, W]`) by `w`
/// (`[Cout, Cin, 3, 3]`), stride 1, padding 1.
fn reference(x: &[f32], w: &[f32], cin: usize, cout: usize, hw: usize) -> Vec<f64> {
    let mut out = vec![0f64; cout * hw * hw];
    for co in 0..cout {
        let plane = &mut out[co * hw * hw..][..hw * hw];
        for ci in 0..cin {
            let xp = &x[ci * hw * hw..][..hw * hw];
            for ky in 0..3 {
                for kx in 0..3 {
                    let wv = w[((co * cin + ci) * 3 + ky) * 3 + kx] as f64;
                    for oy in 0..hw {
                        let Some(iy) = (oy + ky).checked_sub(1).filter(|&iy| iy < hw) else { continue };
                        for ox in 0..hw {
                            let Some(ix) = (ox + kx).checked_sub(1).filter(|&ix| ix < hw) else { continue };
                            plane[oy * hw + ox] += wv * xp[iy * hw + ix] as f64;
                        }
                    }
                }
            }
        }
    }
    out
}

fn main() {
    let table = best();
    let mut cx = Context::with_table(table).with_threads(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for (cin, cout, hw) in [(64usize, 64usize, 56usize), (128, 128, 28), (256, 256, 14), (512, 512, 7)] {
        let x: Vec<f32> = (0..cin * hw * hw).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let scale = 1.0 / ((9 * cin) as f32).sqrt();
        let w: Vec<f32> = (0..cout * cin * 9).map(|_| rng.gen_range(-1.0f32..1.0) * scale).collect();
        let want = reference(&x, &w, cin, cout, hw);
        let (xs, ws, os) = ([1, cin, hw, hw], [cout, cin, 3, 3], [1, cout, hw, hw]);
        let params = ConvParams { stride: &[1, 1], padding: &[1, 1], dilation: &[1, 1], groups: 1 };
        let max_ref = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let rms_ref = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
        let mut line = format!("{cin:>3}->{cout:<3} {hw:>2}²:");
        for (name, algorithm) in
            [("F2", ConvAlgorithm::WinogradF2), ("F4", ConvAlgorithm::WinogradF4), ("taps", ConvAlgorithm::Taps)]
        {
            let mut out = vec![0f32; cout * hw * hw];
            let xt = TensorRef { data: bytemuck::cast_slice(&x), dtype: DType::F32, shape: &xs };
            let wt = TensorRef { data: bytemuck::cast_slice(&w), dtype: DType::F32, shape: &ws };
            let ot = TensorMut { data: bytemuck::cast_slice_mut(&mut out), dtype: DType::F32, shape: &os };
            conv_with(xt, wt, None, &params, ot, &mut cx, algorithm).expect("conv");
            let err: Vec<f64> = out.iter().zip(&want).map(|(&o, &r)| o as f64 - r).collect();
            let max_err = err.iter().fold(0f64, |m, e| m.max(e.abs()));
            let rms_err = (err.iter().map(|e| e * e).sum::<f64>() / err.len() as f64).sqrt();
            line += &format!("  {name} max {:.2e} rms {:.2e}", max_err / max_ref, rms_err / rms_ref);
        }
        println!("{line}  (max |ref| {max_ref:.2}, rms {rms_ref:.3})");
    }
}
