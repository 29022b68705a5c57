//! `quant_linear` and `quant_conv` in a segment: the integer weights stay integers on the
//! device (an i8 argument, or int4 two a byte unpacked in the program), and
//! the arithmetic is `kiln_kernels::quant`'s, op for op:
//!
//! - weight-only: the weight dequantized to f32 (`(q − zp) · scale`), then
//!   an f32 product — the same real number as the CPU kernel, summed in
//!   another order;
//! - int8 activations (dynamic per row, symmetric or asymmetric, or static):
//!   each row quantized with torch's rule (`rint(x · f32(1/s)) + zp`, half to
//!   even, clamped), an `i8 × i8 → i32` `dot_general` (exact), the zero
//!   points taken off through the weight's column sums (exact in i32), then
//!   `(f32(acc) · s) · scale + bias` in that order — the CPU kernel's bits
//!   without a bias; with one, XLA:CPU fuses the last product and the sum
//!   into one FMA (it always allows contraction), which can differ by an
//!   ulp.

//!
//! `quant_conv` with f32 activations dequantizes its weight and runs the
//! f32 convolution; with int8 activations it gathers every output pixel's
//! window (one strided slice of the zero-padded input per kernel tap) into
//! the rows of a `quant_linear`, each quantized with its image's parameters
//! — the CPU kernel's rows, with the window's values in another order,
//! which does not change the exact integer sums.

use super::text::arr;
use super::{err, EmitError, Emitter, T};
use kiln_ir::{DType, ReduceKind};

/// How `quant_linear` quantizes its activations (see `Op::QuantLinear`).
#[derive(Copy, Clone, Debug)]
pub(super) enum QuantActs {
    Float,
    DynamicSymmetric,
    DynamicAsymmetric,
    Static { scale: f32, zero_point: i32 },
}

impl QuantActs {
    /// From the ops' `dynamic`, `asymmetric`, `act_scale` and `act_zero_point`.
    pub(super) fn of(dynamic: bool, asymmetric: bool, act_scale: Option<f64>, act_zero_point: i64) -> QuantActs {
        match (dynamic, asymmetric, act_scale) {
            (true, false, _) => QuantActs::DynamicSymmetric,
            (true, true, _) => QuantActs::DynamicAsymmetric,
            (false, _, Some(scale)) => QuantActs::Static { scale: scale as f32, zero_point: act_zero_point as i32 },
            (false, _, None) => QuantActs::Float,
        }
    }
}

/// `Op::QuantLinear`'s operands, as the emitter holds them.
pub(super) struct QuantLinearArgs<'c, 'a> {
    pub x: T<'c, 'a>,
    pub w: T<'c, 'a>,
    pub scales: T<'c, 'a>,
    pub zero_points: Option<T<'c, 'a>>,
    pub bias: Option<T<'c, 'a>>,
    pub bits: u8,
    pub acts: QuantActs,
    /// Each row's activation scale and zero point (`[m, 1]`) when the
    /// caller computed them (a convolution's per-image ones); else `acts`'
    /// rule per row.
    pub row_params: Option<(T<'c, 'a>, Option<T<'c, 'a>>)>,
}

/// `Op::QuantConv`'s operands and attributes, as the emitter holds them.
pub(super) struct QuantConvArgs<'c, 'a, 'o> {
    pub x: T<'c, 'a>,
    pub w: T<'c, 'a>,
    pub scales: T<'c, 'a>,
    pub bias: Option<T<'c, 'a>>,
    pub stride: &'o [i64],
    pub padding: &'o [i64],
    pub dilation: &'o [i64],
    pub groups: i64,
    pub acts: QuantActs,
}

impl<'c, 'a> Emitter<'c, 'a> {
    pub(super) fn quant_conv(&self, q: &QuantConvArgs<'c, 'a, '_>, out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let cout = *q.w.shape.first().ok_or_else(|| err("quant_conv weight of rank 0"))?;
        let scales = self.convert(&q.scales, DType::F32)?;
        let w = self.convert(&q.w, DType::I8)?;
        if let QuantActs::Float = q.acts {
            let wf =
                self.binary("multiply", &self.convert(&w, DType::F32)?, &self.bcast_dims(&scales, &w.shape, &[0])?)?;
            let mut ins = vec![self.convert(&q.x, DType::F32)?, wf];
            ins.extend(q.bias.clone());
            return self.conv(&ins, q.stride, q.padding, q.dilation, q.groups, out_shape, DType::F32);
        }
        if q.groups != 1 {
            return Err(err("quant_conv with int8 activations must be dense"));
        }
        let x = self.convert(&q.x, DType::F32)?;
        let rank = x.shape.len();
        let sp = rank.checked_sub(2).filter(|&s| s > 0).ok_or_else(|| err("quant_conv input rank"))?;
        let (n, c) = (x.shape[0], x.shape[1]);
        let out_spatial = &out_shape[2..];
        let kernel = &w.shape[2..];
        // The input zero-padded: a padded tap is the real value 0.
        let mut lo = vec![0i64; rank];
        lo[2..].copy_from_slice(q.padding);
        let padded_shape: Vec<i64> = (0..rank).map(|d| x.shape[d] + 2 * lo[d]).collect();
        let padded = self.op(
            "stablehlo.pad",
            &[&x, &self.scalar(0.0, DType::F32)?],
            &padded_shape,
            DType::F32,
            &[
                ("edge_padding_low", arr(&lo)),
                ("edge_padding_high", arr(&lo)),
                ("interior_padding", arr(&vec![0; rank])),
            ],
        )?;
        // One strided slice per tap, `[N, C, out..]`, taps in row-major order.
        let taps: i64 = kernel.iter().product();
        let mut slices = Vec::with_capacity(taps as usize);
        for t in 0..taps {
            let mut rest = t;
            let mut starts = vec![0i64; rank];
            let mut limits = vec![n, c];
            let mut strides = vec![1i64, 1];
            for d in (0..sp).rev() {
                starts[2 + d] = (rest % kernel[d]) * q.dilation[d];
                rest /= kernel[d];
            }
            for d in 0..sp {
                limits.push(starts[2 + d] + (out_spatial[d] - 1) * q.stride[d] + 1);
                strides.push(q.stride[d]);
            }
            let shape: Vec<i64> = [n, c].iter().chain(out_spatial).copied().collect();
            slices.push(self.op(
                "stablehlo.slice",
                &[&padded],
                &shape,
                DType::F32,
                &[("start_indices", arr(&starts)), ("limit_indices", arr(&limits)), ("strides", arr(&strides))],
            )?);
        }
        let refs: Vec<&T<'c, 'a>> = slices.iter().collect();
        let cols_shape: Vec<i64> = [n, taps * c].iter().chain(out_spatial).copied().collect();
        let cols =
            self.op("stablehlo.concatenate", &refs, &cols_shape, DType::F32, &[("dimension", "1 : i64".into())])?;
        // Rows `[M, taps · C]` (pixel-major), and the weight's columns in the same order.
        let to_last: Vec<i64> = std::iter::once(0).chain(2..rank as i64).chain([1]).collect();
        let m: i64 = n * out_spatial.iter().product::<i64>();
        let rows = self.reshape(&self.transpose(&cols, &to_last)?, &[m, taps * c])?;
        let w_rows = self.reshape(&self.transpose(&w, &to_last)?, &[cout, taps * c])?;
        // Dynamic activations: each image's scale (and zero point) from all
        // of its values, given to each of its rows.
        let per_image = |p: T<'c, 'a>| -> Result<T<'c, 'a>, EmitError> {
            let pixels = m / n;
            let spread = self.bcast_dims(&self.reshape(&p, &[n])?, &[n, pixels], &[0])?;
            self.reshape(&spread, &[m, 1])
        };
        let images = || self.reshape(&x, &[n, x.shape[1..].iter().product()]);
        let row_params = match q.acts {
            QuantActs::DynamicSymmetric => Some((per_image(self.row_scale_symmetric(&images()?)?)?, None)),
            QuantActs::DynamicAsymmetric => {
                let (s, zp) = self.row_qparams_asymmetric(&images()?)?;
                Some((per_image(s)?, Some(per_image(zp)?)))
            }
            _ => None,
        };
        let args = QuantLinearArgs {
            x: rows,
            w: w_rows,
            scales: self.reshape(&scales, &[cout, 1])?,
            zero_points: None,
            bias: q.bias.clone(),
            bits: 8,
            acts: q.acts,
            row_params,
        };
        let y = self.quant_linear(&args, &[m, cout])?;
        let channels_last: Vec<i64> = [n].iter().chain(out_spatial).chain([&cout]).copied().collect();
        let y = self.reshape(&y, &channels_last)?;
        let to_first: Vec<i64> = std::iter::once(0).chain([rank as i64 - 1]).chain(1..rank as i64 - 1).collect();
        self.transpose(&y, &to_first)
    }

    pub(super) fn quant_linear(&self, q: &QuantLinearArgs<'c, 'a>, out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let k = *q.x.shape.last().ok_or_else(|| err("quant_linear on a scalar"))?;
        let w = self.weight_i8(&q.w, q.bits, k)?;
        let n = w.shape[0];
        let m: i64 = q.x.shape[..q.x.shape.len() - 1].iter().product();
        let x = self.reshape(&self.convert(&q.x, DType::F32)?, &[m, k])?;
        let scales = self.convert(&q.scales, DType::F32)?;
        let bias = q.bias.as_ref().map(|b| self.convert(b, DType::F32)).transpose()?;
        let y = match q.acts {
            QuantActs::Float => {
                let wf = self.dequantize_weight(&w, &scales, q.zero_points.as_ref())?;
                let mut y = self.dot_as(&x, &wf, &[1], &[1], DType::F32)?;
                if let Some(b) = &bias {
                    y = self.binary("add", &y, b)?;
                }
                y
            }
            acts => {
                if q.zero_points.is_some() || q.scales.shape != [n, 1] {
                    return Err(err("int8 activations need per-channel symmetric int8 weights"));
                }
                let (s, zp) = match &q.row_params {
                    Some((s, zp)) => (s.clone(), zp.clone()),
                    None => self.act_qparams(acts, &x)?,
                };
                let xq = self.quantize_rows(&x, &s, zp.as_ref())?;
                let mut acc = self.dot_as(&xq, &w, &[1], &[1], DType::I32)?;
                if let Some(zp) = &zp {
                    // Σ (q − zp) · w = Σ q · w − zp · Σ w, all in i32.
                    let col = self.reduce(&self.convert(&w, DType::I32)?, &[1], ReduceKind::Sum)?;
                    let col = self.reshape(&col, &[1, n])?;
                    let zp = self.convert(zp, DType::I32)?;
                    acc = self.binary("subtract", &acc, &self.binary("multiply", &zp, &col)?)?;
                }
                // Each product rounded in this order, as on the CPU: behind
                // barriers, since XLA's simplifier reassociates products by
                // constants. The bias add is not protected: XLA's CPU
                // backend always contracts a product and a sum into a
                // fused multiply-add (its LLVM target options), one
                // rounding fewer than the CPU kernel.
                let y = self.binary("multiply", &self.convert(&acc, DType::F32)?, &s)?;
                let y = self.binary("multiply", &self.barrier(&y)?, &self.reshape(&scales, &[1, n])?)?;
                let mut y = self.barrier(&y)?;
                if let Some(b) = &bias {
                    y = self.binary("add", &y, b)?;
                }
                y
            }
        };
        self.reshape(&y, out_shape)
    }

    /// `dot_general` contracting `lc`/`rc`, no batch dims, result `out`
    /// (i32 for i8 operands: XLA accumulates in the result type).
    fn dot_as(&self, a: &T<'c, 'a>, b: &T<'c, 'a>, lc: &[i64], rc: &[i64], out: DType) -> Result<T<'c, 'a>, EmitError> {
        self.dot_typed(a, b, &[], &[], lc, rc, out)
    }

    /// Each row's activation scale and zero point (`[m, 1]`, f32; no zero
    /// point: symmetric).
    #[allow(clippy::type_complexity)]
    fn act_qparams(&self, acts: QuantActs, x: &T<'c, 'a>) -> Result<(T<'c, 'a>, Option<T<'c, 'a>>), EmitError> {
        let m = x.shape[0];
        match acts {
            QuantActs::Float => Err(err("float activations are not quantized")),
            QuantActs::DynamicSymmetric => Ok((self.row_scale_symmetric(x)?, None)),
            QuantActs::DynamicAsymmetric => {
                let (s, zp) = self.row_qparams_asymmetric(x)?;
                Ok((s, Some(zp)))
            }
            QuantActs::Static { scale, zero_point } => Ok((
                self.splat(f64::from(scale), &[m, 1], DType::F32)?,
                Some(self.splat(f64::from(zero_point), &[m, 1], DType::F32)?),
            )),
        }
    }

    /// The weight as i8 `[n, k]`: int4 bytes (element `2j` in the low
    /// nibble, two's complement) are sign-extended by shifts and interleaved.
    fn weight_i8(&self, w: &T<'c, 'a>, bits: u8, k: i64) -> Result<T<'c, 'a>, EmitError> {
        match bits {
            8 => self.convert(w, DType::I8),
            4 => {
                let n = w.shape[0];
                let bytes = self.op("stablehlo.bitcast_convert", &[w], &w.shape.clone(), DType::I8, &[])?;
                let four = self.splat(4.0, &bytes.shape, DType::I8)?;
                let low = self.binary("shift_left", &bytes, &four)?;
                let low = self.binary("shift_right_arithmetic", &low, &four)?;
                let high = self.binary("shift_right_arithmetic", &bytes, &four)?;
                let pair = [n, k / 2, 1];
                let (low, high) = (self.reshape(&low, &pair)?, self.reshape(&high, &pair)?);
                let both = self.op(
                    "stablehlo.concatenate",
                    &[&low, &high],
                    &[n, k / 2, 2],
                    DType::I8,
                    &[("dimension", "2 : i64".into())],
                )?;
                self.reshape(&both, &[n, k])
            }
            b => Err(err(format!("quant_linear with {b}-bit weights"))),
        }
    }

    /// `(f32(q) − f32(zp)) · scale`, each scale and zero point over its
    /// group of `k / groups` columns.
    fn dequantize_weight(
        &self,
        w: &T<'c, 'a>,
        scales: &T<'c, 'a>,
        zp: Option<&T<'c, 'a>>,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (n, k) = (w.shape[0], w.shape[1]);
        let groups = scales.shape[1];
        let grouped = [n, groups, k / groups];
        let mut wf = self.reshape(&self.convert(w, DType::F32)?, &grouped)?;
        if let Some(zp) = zp {
            wf = self.binary("subtract", &wf, &self.reshape(&self.convert(zp, DType::F32)?, &[n, groups, 1])?)?;
        }
        wf = self.binary("multiply", &wf, &self.reshape(scales, &[n, groups, 1])?)?;
        self.reshape(&wf, &[n, k])
    }

    /// Each row's `[lo, hi]` widened to hold 0: `(min(min x, 0), max(max x, 0))`, `[m, 1]`.
    fn row_range(&self, x: &T<'c, 'a>) -> Result<(T<'c, 'a>, T<'c, 'a>), EmitError> {
        let m = x.shape[0];
        let zero = self.scalar(0.0, DType::F32)?;
        let lo = self.binary("minimum", &self.reduce(x, &[1], ReduceKind::Min)?, &zero)?;
        let hi = self.binary("maximum", &self.reduce(x, &[1], ReduceKind::Max)?, &zero)?;
        Ok((self.reshape(&lo, &[m, 1])?, self.reshape(&hi, &[m, 1])?))
    }

    /// torchao's per-token symmetric scale: `max(max(−lo, hi) / 127.5, ε)`.
    fn row_scale_symmetric(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let (lo, hi) = self.row_range(x)?;
        let amax = self.binary("maximum", &self.unary("negate", &lo)?, &hi)?;
        let s = self.binary("divide", &amax, &self.opaque_scalar(127.5)?)?;
        self.binary("maximum", &s, &self.scalar(f64::from(f32::EPSILON), DType::F32)?)
    }

    /// torch's `MinMaxObserver` rule per row over `[-128, 127]`: `s =
    /// max((hi − lo) / 255, ε)`, `zp = clamp(−128 − rint(lo / s), −128, 127)`.
    fn row_qparams_asymmetric(&self, x: &T<'c, 'a>) -> Result<(T<'c, 'a>, T<'c, 'a>), EmitError> {
        let (lo, hi) = self.row_range(x)?;
        let s = self.binary("divide", &self.binary("subtract", &hi, &lo)?, &self.opaque_scalar(255.0)?)?;
        let s = self.binary("maximum", &s, &self.scalar(f64::from(f32::EPSILON), DType::F32)?)?;
        let r = self.unary("round_nearest_even", &self.binary("divide", &lo, &s)?)?;
        let zp = self.binary("subtract", &self.scalar(-128.0, DType::F32)?, &r)?;
        Ok((s, self.clamp_i8_range(&zp)?))
    }

    /// `clamp(rint(x · f32(1/s)) [+ zp], −128, 127)` as i8; `s`, `zp` are `[m, 1]`.
    fn quantize_rows(&self, x: &T<'c, 'a>, s: &T<'c, 'a>, zp: Option<&T<'c, 'a>>) -> Result<T<'c, 'a>, EmitError> {
        let inv = self.binary("divide", &self.scalar(1.0, DType::F32)?, s)?;
        let mut q = self.unary("round_nearest_even", &self.binary("multiply", x, &inv)?)?;
        if let Some(zp) = zp {
            q = self.binary("add", &q, zp)?;
        }
        self.convert(&self.clamp_i8_range(&q)?, DType::I8)
    }

    /// An f32 scalar XLA cannot see as a constant: its simplifier turns a
    /// division by a constant into a product by the rounded reciprocal,
    /// which moves a scale by an ulp and flips roundings of the
    /// activations; torch's rule (and the CPU kernel) divide.
    fn opaque_scalar(&self, value: f64) -> Result<T<'c, 'a>, EmitError> {
        self.barrier(&self.scalar(value, DType::F32)?)
    }

    /// `x` as a value XLA's simplifier cannot look through.
    fn barrier(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        self.op("stablehlo.optimization_barrier", &[x], &x.shape.clone(), x.dt, &[])
    }

    fn clamp_i8_range(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let lo = self.scalar(-128.0, DType::F32)?;
        let hi = self.scalar(127.0, DType::F32)?;
        self.binary("minimum", &self.binary("maximum", x, &lo)?, &hi)
    }
}
