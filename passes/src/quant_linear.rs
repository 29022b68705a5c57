//! Linear layers whose weight is a dequantized integer constant become one
//! `Op::QuantLinear`, which keeps the integers (int8, or int4 two a byte)
//! and runs `kiln_kernels::quant::qlinear`; without this pass constant
//! folding would turn the dequantization into an f32 weight.
//!
//! Recognised (CPU target, before constant folding), `q` an i8 constant
//! seen through reshapes:
//! - the dequantized weight `w[N, K] = reshape((f32(q) [- f32(zp)]) · s)`,
//!   the product shaped `[N, .., group]` with `s` (and `zp`) constants of
//!   its shape with a last dim of 1 — what PT2E's `dequantize_per_channel`
//!   (group = K) and torchao's decomposed group-wise dequantization import
//!   as — used by `linear(x, w [, b])` or `matmul(x, permute(w, [1, 0]))`;
//! - `matmul(x, f32(permute(q)))`, torchao's int8 weight-only `mm`, which
//!   scales after the product: a `QuantLinear` with unit scales here, and
//!   the `mul` by a per-column constant `[N]` that follows is folded into
//!   the scales by the second sweep;
//! - `add(quant_linear(..), b[N])` (addmm's bias) becomes the op's bias;
//! - torchao's decomposed int8 dynamic layer (token-shaped `x` flattened
//!   to rows, and its CPU path's `u8(q + 128)` product included): the rows
//!   quantized with their per-token symmetric scales, `_int_mm`, the
//!   product times the row scales (`dynamic_int_mm`) — a `QuantLinear`
//!   with dynamic activations, whose kernel computes the same bits.
//!
//! - `conv(x, w [, b])` with `w = (f32(q) [- f32(0)]) · s`, `s` per output
//!   channel (PT2E's per-channel convolution weights): an `Op::QuantConv`
//!   with f32 activations (the runtime dequantizes the same values at
//!   load, so the program computes what it computed before, with a quarter
//!   of the weight bytes);
//! - a PT2E static activation pair in front of either layer (dense
//!   convolutions only): the layer's activations become static int8 on the
//!   pair's float input (see [`static_fake_quant`]).
//!
//! The weight is stored as int4 when every value lies in `[-8, 7]` and `K`
//! is even (exact: the same integers); zero points that are all zero are
//! dropped. The rewritten layer computes `bias + Σ_g s · Σ x · (q - zp)`:
//! the same real number as the float graph, rounded in another order.

use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::{Changed, Options, PassError};
use kiln_ir::{BinaryOp, ConstBytes, DType, Dim, Graph, Op, ReduceKind, TensorType, UnaryOp, ValueAttrs, ValueId};

pub fn quantize_linear_weights(g: &mut Graph, _opts: &Options) -> Result<Changed, PassError> {
    crate::check::guard(g, "quant_linear")?;
    let layers = rewrite_in_order(g, |g, n| {
        let node = g.nodes[n].clone();
        if let (Op::Conv { stride, padding, dilation, groups }, [x, w, rest @ ..]) = (&node.op, &node.inputs[..]) {
            let Some(qw) = dequantized_conv(g, *w) else { return Ok(Rewrite::Keep) };
            let conv = ConvAttrs {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups: *groups,
                weight_shape: g.ty(*w).shape.clone(),
                bias: rest.first().copied(),
            };
            let (x, out_ty, loc) = (*x, g.ty(node.outputs[0]).clone(), node.loc);
            // Static int8 activations need the dense integer kernel.
            let (x, acts) = match static_fake_quant(g, x) {
                Some((xf, acts)) if *groups == 1 => (xf, acts),
                _ => (x, Acts::Float),
            };
            let (op, inputs) = qw.into_conv_operands(g, x, acts, conv);
            return Ok(Rewrite::Replace(vec![g.push(op, inputs, out_ty, loc)]));
        }
        let (x, w, bias, acts) = match (&node.op, &node.inputs[..]) {
            (Op::Linear, [x, w, rest @ ..]) => match dequantized_nk(g, *w) {
                Some(w) => {
                    let (x, acts) = static_input(g, *x, node.loc);
                    (x, w, rest.first().copied(), acts)
                }
                None => return Ok(Rewrite::Keep),
            },
            (Op::MatMul, &[x, wt]) if g.ty(x).rank() >= 2 && g.ty(wt).rank() == 2 => match dequantized_kn(g, wt) {
                Some(w) => {
                    let (x, acts) = static_input(g, x, node.loc);
                    (x, w, None, acts)
                }
                None => return Ok(Rewrite::Keep),
            },
            (Op::Binary(BinaryOp::Mul), &[a, b]) => match dynamic_int_mm(g, a, b).or_else(|| dynamic_int_mm(g, b, a)) {
                Some((x, w)) => (x, w, None, Acts::Dynamic),
                None => return Ok(Rewrite::Keep),
            },
            _ => return Ok(Rewrite::Keep),
        };
        let out_ty = g.ty(node.outputs[0]).clone();
        let loc = node.loc;
        // A dynamic layer takes `x` as the product's rows: torchao flattens
        // token-shaped activations to them after quantizing.
        let x = if acts == Acts::Dynamic && g.ty(x).rank() != 2 {
            let ty = TensorType::new(DType::F32, vec![out_ty.shape[0].clone(), Dim::Const(w.k as i64)]);
            g.push(Op::Reshape { shape: ty.shape.clone() }, vec![x], ty, loc)
        } else {
            x
        };
        let (op, mut inputs) = w.into_operands(g, x, acts);
        inputs.extend(bias);
        Ok(Rewrite::Replace(vec![g.push(op, inputs, out_ty, loc)]))
    })?;
    if !layers.is_yes() {
        return Ok(Changed::No);
    }
    // Per-column scales and biases applied after the product join the op:
    // each sweep takes one of them per layer (a scale, then a bias).
    for _ in 0..2 {
        if !absorb_columns(g)?.is_yes() {
            break;
        }
    }
    Ok(Changed::Yes)
}

/// How a rewritten layer treats its activations (`Op::QuantLinear`'s
/// `dynamic`, `asymmetric` and `act_scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Acts {
    Float,
    Dynamic,
    /// Per-row dynamic activations with a zero point per row.
    DynamicAsymmetric,
    Static {
        scale: f32,
        zero_point: i32,
    },
}

/// A convolution's attributes and weight shape, for [`QuantWeight::into_conv_operands`].
pub(crate) struct ConvAttrs {
    pub stride: Vec<i64>,
    pub padding: Vec<i64>,
    pub dilation: Vec<i64>,
    pub groups: i64,
    pub weight_shape: Vec<Dim>,
    /// The convolution's bias operand, if it has one.
    pub bias: Option<ValueId>,
}

impl Acts {
    /// The ops' `dynamic`, `asymmetric`, `act_scale` and `act_zero_point`.
    fn flags(self) -> (bool, bool, Option<f64>, i64) {
        match self {
            Acts::Float => (false, false, None, 0),
            Acts::Dynamic => (true, false, None, 0),
            Acts::DynamicAsymmetric => (true, true, None, 0),
            Acts::Static { scale, zero_point } => (false, false, Some(f64::from(scale)), i64::from(zero_point)),
        }
    }
}

/// A quantized `[n, k]` weight: integers one a byte, `n * (k / group)`
/// scales and zero points (read off the graph, or made by `quantize`).
#[derive(Clone)]
pub(crate) struct QuantWeight {
    pub n: usize,
    pub k: usize,
    pub group: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
    pub zero_points: Option<Vec<i8>>,
    pub attrs: ValueAttrs,
}

impl QuantWeight {
    /// Whether the weight is stored as int4: every value fits (exact), and
    /// the layer does not quantize its activations (int8 weights only).
    fn int4(&self, acts: Acts) -> bool {
        acts == Acts::Float && self.k.is_multiple_of(2) && self.q.iter().all(|v| (-8..=7).contains(v))
    }

    pub fn bits(&self) -> u8 {
        if self.int4(Acts::Float) {
            4
        } else {
            8
        }
    }

    /// Bytes of the stored weight, scales and zero points.
    pub fn stored_bytes(&self) -> usize {
        let groups = self.scales.len();
        self.q.len() * self.bits() as usize / 8 + groups * 4 + self.zero_points.as_ref().map_or(0, |_| groups)
    }

    /// `(q - zp) · s`, row-major `[n, k]`.
    pub fn dequantized(&self) -> Vec<f32> {
        let zp = |g: usize| self.zero_points.as_ref().map_or(0.0, |z| z[g] as f32);
        self.q.iter().enumerate().map(|(i, &q)| (q as f32 - zp(i / self.group)) * self.scales[i / self.group]).collect()
    }

    /// The op and its leading operands `(x, w, scales [, zero_points])`, the
    /// weight packed to int4 when every value fits.
    pub fn into_operands(self, g: &mut Graph, x: ValueId, acts: Acts) -> (Op, Vec<ValueId>) {
        let int4 = self.int4(acts);
        let (bits, w) = if int4 {
            let bytes: Vec<u8> =
                self.q.chunks_exact(2).map(|p| (p[0] as u8 & 0x0f) | ((p[1] as u8 & 0x0f) << 4)).collect();
            (4, self.add(g, DType::U8, self.k / 2, bytes))
        } else {
            (8, self.add(g, DType::I8, self.k, self.q.iter().map(|&v| v as u8).collect()))
        };
        let groups = self.k / self.group;
        let scales = self.add(g, DType::F32, groups, self.scales.iter().flat_map(|s| s.to_le_bytes()).collect());
        let mut inputs = vec![x, w, scales];
        if let Some(zp) = &self.zero_points {
            inputs.push(self.add(g, DType::I8, groups, zp.iter().map(|&v| v as u8).collect()));
        }
        let (dynamic, asymmetric, act_scale, act_zero_point) = acts.flags();
        let op = Op::QuantLinear {
            bits,
            group: self.group,
            zero_points: self.zero_points.is_some(),
            dynamic,
            asymmetric,
            act_scale,
            act_zero_point,
        };
        (op, inputs)
    }

    /// A convolution's op and leading operands `(x, w, scales)`: the int8
    /// weight in the convolution's own shape, one scale per output channel
    /// (per-channel symmetric weights only: `group == k`, no zero points).
    pub fn into_conv_operands(self, g: &mut Graph, x: ValueId, acts: Acts, conv: ConvAttrs) -> (Op, Vec<ValueId>) {
        let bias = conv.bias;
        debug_assert!(self.group == self.k && self.zero_points.is_none());
        let bytes: Vec<u8> = self.q.iter().map(|&v| v as u8).collect();
        let w = g.add_const(None, TensorType::new(DType::I8, conv.weight_shape), ConstBytes::owned(bytes));
        g.values[w].attrs = self.attrs.clone();
        let scale_bytes: Vec<u8> = self.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let scales = g.add_const(None, TensorType::fixed(DType::F32, &[self.n as i64]), ConstBytes::owned(scale_bytes));
        g.values[scales].attrs = self.attrs.clone();
        let (dynamic, asymmetric, act_scale, act_zero_point) = acts.flags();
        let op = Op::QuantConv {
            stride: conv.stride,
            padding: conv.padding,
            dilation: conv.dilation,
            groups: conv.groups,
            epilogue: kiln_ir::Epilogue { bias: bias.is_some(), ..Default::default() },
            layout: kiln_ir::Layout::ChannelsFirst,
            dynamic,
            asymmetric,
            act_scale,
            act_zero_point,
            out_quant: None,
            res_quant: None,
        };
        let mut inputs = vec![x, w, scales];
        inputs.extend(bias);
        (op, inputs)
    }

    fn add(&self, g: &mut Graph, dtype: DType, cols: usize, bytes: Vec<u8>) -> ValueId {
        let ty = TensorType::fixed(dtype, &[self.n as i64, cols as i64]);
        let v = g.add_const(None, ty, ConstBytes::owned(bytes));
        g.values[v].attrs = self.attrs.clone();
        v
    }
}

/// A linear layer's input `x` and activations: static when `x` is
/// [`static_fake_quant`]'s pattern, seen through one reshape (a flatten
/// between the pair and the layer: quantizing commutes with it, so the
/// reshape moves onto the float input), else `x` with f32 activations.
fn static_input(g: &mut Graph, x: ValueId, loc: Option<kiln_ir::LocId>) -> (ValueId, Acts) {
    if let Some(found) = static_fake_quant(g, x) {
        return found;
    }
    let Some(&[v]) = producer_inputs(g, x, |o| matches!(o, Op::Reshape { .. })) else { return (x, Acts::Float) };
    let Some((xf, acts)) = static_fake_quant(g, v) else { return (x, Acts::Float) };
    let ty = g.ty(x).clone();
    (g.push(Op::Reshape { shape: ty.shape.clone() }, vec![xf], ty, loc), acts)
}

/// PT2E's static activation quantization in front of a layer: `v =
/// (f32(cast(clamp(round(x · inv) + zp, lo, hi))) - zp) · s` with scalar
/// constants (`quantize_per_tensor` then `dequantize_per_tensor`, as
/// imported), int8 over `[-128, 127]` or uint8 over `[0, 255]`. Returns
/// `x` and the layer's static activations: the integer kernel quantizes
/// `x` with the same scale, zero point and rounding (uint8 as int8 with
/// the zero point less 128: the same integers shifted), and sums the
/// products exactly where eager summed the dequantized values in f32 — the
/// same real number, rounded once instead of per product.
fn static_fake_quant(g: &Graph, v: ValueId) -> Option<(ValueId, Acts)> {
    let scalar = |v: ValueId| match f32_values(g, v)?[..] {
        [c] => Some(c),
        _ => None,
    };
    let binary = |v: ValueId, op: BinaryOp| -> Option<(ValueId, f32)> {
        let &[a, b] = producer_inputs(g, v, |o| o == &Op::Binary(op))? else { return None };
        // The constant on either side of a commutative op, on the right of a sub.
        match (scalar(b), scalar(a)) {
            (Some(c), _) => Some((a, c)),
            (None, Some(c)) if op != BinaryOp::Sub => Some((b, c)),
            _ => None,
        }
    };
    let (centred, s) = binary(v, BinaryOp::Mul)?;
    let (xf, zp) = binary(centred, BinaryOp::Sub)?;
    let &[q] = producer_inputs(g, xf, |o| matches!(o, Op::Cast { to: DType::F32 }))? else { return None };
    let dtype = g.ty(q).dtype;
    let &[clamped] = producer_inputs(g, q, |o| matches!(o, Op::Cast { .. }))? else { return None };
    let p = g.producer(clamped)?;
    let Op::Clamp { min: Some(lo), max: Some(hi) } = g.nodes[p].op else { return None };
    let &[shifted] = &g.nodes[p].inputs[..] else { return None };
    let (rounded, zp_q) = binary(shifted, BinaryOp::Add)?;
    let &[scaled] = producer_inputs(g, rounded, |o| o == &Op::Unary(UnaryOp::Round))? else { return None };
    let (x, inv) = binary(scaled, BinaryOp::Mul)?;
    let offset = match (dtype, lo, hi) {
        (DType::I8, -128.0, 127.0) => 0.0,
        (DType::U8, 0.0, 255.0) => 128.0,
        _ => return None,
    };
    let zero_point = zp - offset;
    let integral = zp == zp_q && zp.fract() == 0.0 && (-128.0..=127.0).contains(&zero_point);
    // `inv` is torch's `1.0 / scale` (f64, then f32): the kernel's own
    // f32 reciprocal of `s` is that value or its neighbour.
    let reciprocal = s.is_finite() && s > 0.0 && ((inv as f64) * (s as f64) - 1.0).abs() < 1e-6;
    (integral && reciprocal && g.ty(x).dtype == DType::F32)
        .then_some((x, Acts::Static { scale: s, zero_point: zero_point as i32 }))
}

/// `v` seen through reshapes.
fn through_reshapes(g: &Graph, mut v: ValueId) -> ValueId {
    while let Some(p) = g.producer(v) {
        match (&g.nodes[p].op, &g.nodes[p].inputs[..]) {
            (Op::Reshape { .. }, &[x]) => v = x,
            _ => break,
        }
    }
    v
}

/// `v` seen through reshapes that do not change its type (`view(x, x.shape)`).
fn through_identity_reshapes(g: &Graph, mut v: ValueId) -> ValueId {
    while let Some(&[x]) = producer_inputs(g, v, |op| matches!(op, Op::Reshape { .. })) {
        if g.ty(x) != g.ty(v) {
            break;
        }
        v = x;
    }
    v
}

/// The operands of the node defining `v`, when its op passes `is`.
fn producer_inputs(g: &Graph, v: ValueId, is: impl Fn(&Op) -> bool) -> Option<&[ValueId]> {
    let p = g.producer(v)?;
    is(&g.nodes[p].op).then(|| &g.nodes[p].inputs[..])
}

fn static_dims(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.ty(v).static_shape()?.into_iter().map(|d| usize::try_from(d).ok()).collect()
}

/// The bytes of the constant `v` (seen through reshapes) when its dtype is `dtype`.
fn const_bytes(g: &Graph, v: ValueId, dtype: DType) -> Option<(&[u8], ValueId)> {
    let c = through_reshapes(g, v);
    let data = g.const_of(c)?;
    (g.ty(c).dtype == dtype).then(|| (data.bytes.as_bytes(), c))
}

/// `f32(q)` with `q` an i8 constant: its values.
fn int8_values(g: &Graph, v: ValueId) -> Option<(Vec<i8>, ValueAttrs)> {
    let &[src] = producer_inputs(g, v, |op| matches!(op, Op::Cast { to: DType::F32 }))? else { return None };
    let (bytes, c) = const_bytes(g, src, DType::I8)?;
    Some((bytes.iter().map(|&b| b as i8).collect(), g.values[c].attrs.clone()))
}

/// Zero points: `f32(zp)` of an integer constant with values in i8's range.
fn zero_point_values(g: &Graph, v: ValueId) -> Option<Vec<i8>> {
    let &[src] = producer_inputs(g, v, |op| matches!(op, Op::Cast { to: DType::F32 }))? else { return None };
    let c = through_reshapes(g, src);
    let data = g.const_of(c)?.bytes.as_bytes();
    let dtype = g.ty(c).dtype;
    let wide: Vec<i64> = match dtype {
        DType::I8 => data.iter().map(|&b| b as i8 as i64).collect(),
        DType::I32 => data.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect(),
        DType::I64 => data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect(),
        _ => return None,
    };
    wide.iter().map(|&z| i8::try_from(z).ok()).collect()
}

fn f32_values(g: &Graph, v: ValueId) -> Option<Vec<f32>> {
    let (bytes, _) = const_bytes(g, v, DType::F32)?;
    Some(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// A `[K, N]` matmul operand that is a quantized `[N, K]` weight transposed.
fn dequantized_kn(g: &Graph, v: ValueId) -> Option<QuantWeight> {
    let is_transpose = |op: &Op| matches!(op, Op::Permute { perm } if perm == &[1, 0]);
    if let Some(&[w]) = producer_inputs(g, v, is_transpose) {
        return dequantized_nk(g, w);
    }
    // `f32(permute(q))`: unit scales (torchao's weight-only int8 scales after the mm).
    let &[t] = producer_inputs(g, v, |op| matches!(op, Op::Cast { to: DType::F32 }))? else { return None };
    let &[q] = producer_inputs(g, t, is_transpose)? else { return None };
    let [n, k] = static_dims(g, q)?[..] else { return None };
    let (bytes, c) = const_bytes(g, q, DType::I8)?;
    let q = bytes.iter().map(|&b| b as i8).collect();
    Some(QuantWeight { n, k, group: k, q, scales: vec![1.0; n], zero_points: None, attrs: g.values[c].attrs.clone() })
}

/// A `[N, K]` f32 weight computed as `reshape((f32(q) [- f32(zp)]) · s)`.
fn dequantized_nk(g: &Graph, v: ValueId) -> Option<QuantWeight> {
    let [n, k] = static_dims(g, v)?[..] else { return None };
    let m = through_reshapes(g, v);
    if let Some((q, attrs)) = int8_values(g, m) {
        return (q.len() == n * k).then(|| QuantWeight {
            n,
            k,
            group: k,
            q,
            scales: vec![1.0; n],
            zero_points: None,
            attrs,
        });
    }
    let shape = static_dims(g, m)?;
    let (&group, lead) = shape.split_last()?;
    if shape.first() != Some(&n) || shape.iter().product::<usize>() != n * k || group == 0 {
        return None;
    }
    // The scale has the product's shape with a last dim of 1.
    let param_shape: Vec<usize> = lead.iter().copied().chain([1]).collect();
    let (q, scales, zero_points, attrs) = dequantized_product(g, m, &param_shape, n * (k / group))?;
    (q.len() == n * k).then_some(QuantWeight { n, k, group, q, scales, zero_points, attrs })
}

/// Integers, scales and zero points (none when all are zero) of `v =
/// (f32(q) [- f32(zp)]) · s`, `q` an i8 constant, `s` and `zp` constants
/// shaped `param_shape` holding `groups` values each.
#[allow(clippy::type_complexity)]
fn dequantized_product(
    g: &Graph,
    v: ValueId,
    param_shape: &[usize],
    groups: usize,
) -> Option<(Vec<i8>, Vec<f32>, Option<Vec<i8>>, ValueAttrs)> {
    let &[a, b] = producer_inputs(g, v, |op| matches!(op, Op::Binary(BinaryOp::Mul)))? else { return None };
    [(a, b), (b, a)].into_iter().find_map(|(centred, s)| {
        if static_dims(g, s)? != param_shape {
            return None;
        }
        let scales = f32_values(g, s).filter(|s| s.len() == groups)?;
        match producer_inputs(g, centred, |op| matches!(op, Op::Binary(BinaryOp::Sub))) {
            Some(&[qf, zf]) => {
                let (q, attrs) = int8_values(g, qf)?;
                if static_dims(g, zf)? != param_shape {
                    return None;
                }
                let zp = zero_point_values(g, zf).filter(|z| z.len() == groups)?;
                Some((q, scales, zp.iter().any(|&z| z != 0).then_some(zp), attrs))
            }
            _ => {
                let (q, attrs) = int8_values(g, centred)?;
                Some((q, scales, None, attrs))
            }
        }
    })
}

/// A convolution weight `[Cout, ..]` computed as `(f32(q) [- f32(zp)]) ·
/// s` with `q` an i8 constant of its shape and `s` (and `zp`, all zero)
/// constants `[Cout, 1, ..]`: PT2E's `dequantize_per_channel` along axis 0
/// (symmetric, as its quantizers write convolution weights).
fn dequantized_conv(g: &Graph, v: ValueId) -> Option<QuantWeight> {
    let dims = static_dims(g, v)?;
    let (&n, rest) = dims.split_first()?;
    let k: usize = rest.iter().product();
    if g.ty(v).dtype != DType::F32 || rest.is_empty() {
        return None;
    }
    let param_shape: Vec<usize> = std::iter::once(n).chain(rest.iter().map(|_| 1)).collect();
    let (q, scales, zero_points, attrs) = dequantized_product(g, v, &param_shape, n)?;
    // Only symmetric weights: `quant_conv` has no zero points.
    (q.len() == n * k && zero_points.is_none()).then_some(QuantWeight {
        n,
        k,
        group: k,
        q,
        scales,
        zero_points: None,
        attrs,
    })
}

/// torchao's decomposed int8 dynamic layer, `mul(f32(_int_mm(q, permute(w))),
/// s)` — `_int_mm` imported as `i32(matmul(f64(q), f64(permute(w))))`, `w`
/// an i8 constant `[N, K]`, `q` the rows of `x [.., K]` quantized with their
/// per-token symmetric scales `s` ([`per_row_symmetric`]) — is
/// `kiln_kernels::quant`'s `DynamicPerRow` arithmetic exactly: `x` and the
/// weight with unit scales (the per-column scale and bias after it join by
/// [`absorb_columns`]). Token-shaped `x` is flattened to rows first (`q`
/// and `s` reshaped to `[M, ..]`), and torchao's CPU path then multiplies
/// `u8(q + 128)` and subtracts `128 · Σ_p w[p, j]`: the same exact sums.
fn dynamic_int_mm(g: &Graph, product: ValueId, s: ValueId) -> Option<(ValueId, QuantWeight)> {
    let cast = |v: ValueId, to: DType| match producer_inputs(g, v, |op| *op == Op::Cast { to }) {
        Some(&[x]) => Some(x),
        _ => None,
    };
    let transposed =
        |v: ValueId| match producer_inputs(g, v, |op| matches!(op, Op::Permute { perm } if perm == &[1, 0])) {
            Some(&[w]) => Some(w),
            _ => None,
        };
    let int_mm = |v: ValueId| -> Option<(ValueId, ValueId)> {
        let &[a, b] = producer_inputs(g, cast(v, DType::I32)?, |op| *op == Op::MatMul)? else { return None };
        Some((cast(a, DType::F64)?, transposed(cast(b, DType::F64)?)?))
    };
    let acc = cast(product, DType::F32)?;
    let (q, w) = match int_mm(acc) {
        Some(found) => found,
        None => {
            // `sub(_int_mm(u8(i32(q) + 128), permute(w)), Σ_rows(i32(permute(w))) · 128)`.
            let &[shifted_mm, correction] = producer_inputs(g, acc, |op| *op == Op::Binary(BinaryOp::Sub))? else {
                return None;
            };
            let (u, w) = int_mm(shifted_mm)?;
            let &[plus, c128] = producer_inputs(g, cast(u, DType::U8)?, |op| *op == Op::Binary(BinaryOp::Add))? else {
                return None;
            };
            let &[sums, c] = producer_inputs(g, correction, |op| *op == Op::Binary(BinaryOp::Mul))? else {
                return None;
            };
            let sum_op = Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: true };
            let &[wt32] = producer_inputs(g, sums, |op| *op == sum_op)? else { return None };
            let ok = scalar_is(g, c128, 128.0) && scalar_is(g, c, 128.0) && transposed(cast(wt32, DType::I32)?)? == w;
            (ok.then_some(cast(plus, DType::I32)?)?, w)
        }
    };
    let [n, k] = static_dims(g, w)?[..] else { return None };
    let (x, row_scale) = per_row_symmetric(g, through_reshapes(g, q))?;
    // `q` and `s` flattened alike (to `[M, K]` and `[M, 1]`), or not at all.
    let rows = static_dims(g, q)?;
    let flat_scale = through_reshapes(g, s);
    let same_rows = static_dims(g, s)? == [rows[0], 1] && static_dims(g, x)?.iter().product::<usize>() == rows[0] * k;
    // Deeper layers would overflow the kernel's exact i32 sums.
    if row_scale != flat_scale || rows.len() != 2 || rows[1] != k || !same_rows || k > (1 << 17) - 1 {
        return None;
    }
    let (bytes, c) = const_bytes(g, w, DType::I8)?;
    let qw: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
    let attrs = g.values[c].attrs.clone();
    (qw.len() == n * k)
        .then(|| (x, QuantWeight { n, k, group: k, q: qw, scales: vec![1.0; n], zero_points: None, attrs }))
}

/// `q = i8(clamp(round(x · (reciprocal(s) [· 1])) + 0, -128, 127))` with
/// `s = clamp(max(−min(min_row(x), 0), max(max_row(x), 0)) / 127.5, ε)`
/// (torchao's per-token symmetric rule, over `x`'s last axis): `(x, s)`.
fn per_row_symmetric(g: &Graph, q: ValueId) -> Option<(ValueId, ValueId)> {
    let one_input = |v: ValueId, is: &dyn Fn(&Op) -> bool| match producer_inputs(g, v, is) {
        Some(&[x]) => Some(x),
        _ => None,
    };
    let pair = |v: ValueId, op: BinaryOp| match producer_inputs(g, v, |o| *o == Op::Binary(op)) {
        Some(&[a, b]) => Some((a, b)),
        _ => None,
    };
    let clamped = one_input(q, &|op| *op == Op::Cast { to: DType::I8 })?;
    let shifted = one_input(clamped, &|op| *op == Op::Clamp { min: Some(-128.0), max: Some(127.0) })?;
    let (rounded, _) = pair(shifted, BinaryOp::Add).filter(|&(_, z)| scalar_is(g, z, 0.0))?;
    let (x, inv) = pair(one_input(rounded, &|op| *op == Op::Unary(UnaryOp::Round))?, BinaryOp::Mul)?;
    let inv = match pair(inv, BinaryOp::Mul) {
        Some((r, one)) if scalar_is(g, one, 1.0) => r,
        _ => inv,
    };
    let s = one_input(inv, &|op| *op == Op::Unary(UnaryOp::Reciprocal))?;
    let is_eps = |op: &Op| *op == Op::Clamp { min: Some(f64::from(f32::EPSILON)), max: None };
    let (m, d) = pair(one_input(s, &is_eps)?, BinaryOp::Div)?;
    if !scalar_is(g, d, 127.5) {
        return None;
    }
    let last = g.ty(x).rank().checked_sub(1)?;
    let reduced = |v: ValueId, kind: ReduceKind| -> bool {
        let want = Op::Reduce { kind, axes: vec![last], keep_dims: true };
        producer_inputs(g, v, |op| *op == want) == Some(&[x][..])
    };
    let (neg_min, pos_max) = pair(m, BinaryOp::Max)?;
    let (lo, z1) = pair(one_input(neg_min, &|op| *op == Op::Unary(UnaryOp::Neg))?, BinaryOp::Min)?;
    let (hi, z2) = pair(pos_max, BinaryOp::Max)?;
    let ok =
        reduced(lo, ReduceKind::Min) && reduced(hi, ReduceKind::Max) && scalar_is(g, z1, 0.0) && scalar_is(g, z2, 0.0);
    ok.then_some((x, s))
}

/// Whether every element of `v` is `value`: a `full` or a constant, seen
/// through casts and reshapes.
fn scalar_is(g: &Graph, mut v: ValueId, value: f64) -> bool {
    while let Some(p) = g.producer(v) {
        match (&g.nodes[p].op, &g.nodes[p].inputs[..]) {
            (Op::Cast { .. } | Op::Reshape { .. }, &[x]) => v = x,
            (Op::Full { value: f, .. }, []) => return *f == value,
            _ => return false,
        }
    }
    crate::host::HostTensor::from_const(g, v).is_some_and(|c| c.data.iter().all(|&x| x == value))
}

/// The `[N, G]` scales `s` times a per-row constant `c[N]`, as a new constant.
fn scale_rows(g: &mut Graph, s: ValueId, c: ValueId) -> Option<ValueId> {
    let shape = static_dims(g, s)?;
    let scales = f32_values(g, s)?;
    let column = f32_values(g, c)?;
    let [n, groups] = shape[..] else { return None };
    if column.len() != n {
        return None;
    }
    let bytes: Vec<u8> = scales.iter().enumerate().flat_map(|(i, &v)| (v * column[i / groups]).to_le_bytes()).collect();
    let attrs = g.values[s].attrs.clone();
    let v = g.add_const(
        None,
        TensorType::new(DType::F32, vec![Dim::Const(n as i64), Dim::Const(groups as i64)]),
        ConstBytes::owned(bytes),
    );
    g.values[v].attrs = attrs;
    Some(v)
}

/// `mul(quant_linear(..), s[N])` (constant `s`, no bias yet) and
/// `add(quant_linear(..), b[N])` (no bias yet) become one `quant_linear`,
/// when the product has no other use.
pub(crate) fn absorb_columns(g: &mut Graph) -> Result<Changed, PassError> {
    let uses = g.use_counts();
    rewrite_in_order(g, |g, n| {
        let node = &g.nodes[n];
        let (Op::Binary(op @ (BinaryOp::Mul | BinaryOp::Add)), &[a, b]) = (&node.op, &node.inputs[..]) else {
            return Ok(Rewrite::Keep);
        };
        let out_ty = g.ty(node.outputs[0]).clone();
        let loc = node.loc;
        let (op, a, b) = (*op, through_identity_reshapes(g, a), through_identity_reshapes(g, b));
        let is_layer = |p: Option<kiln_ir::NodeId>| p.filter(|&p| matches!(g.nodes[p].op, Op::QuantLinear { .. }));
        let (ql, column) = match (is_layer(g.producer(a)), is_layer(g.producer(b))) {
            (Some(p), _) => (p, b),
            (_, Some(p)) => (p, a),
            _ => return Ok(Rewrite::Keep),
        };
        let produced = g.nodes[ql].outputs[0];
        if uses[produced] != 1 || g.outputs.contains(&produced) || &out_ty != g.ty(produced) {
            return Ok(Rewrite::Keep);
        }
        let Op::QuantLinear { zero_points, .. } = g.nodes[ql].op else { return Ok(Rewrite::Keep) };
        let n_out = g.ty(g.nodes[ql].inputs[1]).shape[0].clone();
        let mut inputs = g.nodes[ql].inputs.clone();
        let has_bias = inputs.len() == 4 + zero_points as usize;
        let column_ty = g.ty(column);
        let per_column = column_ty.dtype == DType::F32
            && column_ty.rank() == 1
            && kiln_ir::infer::dims_equal(&column_ty.shape[0], &n_out, &g.symbols) == Some(true);
        if !per_column || has_bias {
            return Ok(Rewrite::Keep);
        }
        match op {
            BinaryOp::Add => inputs.push(column),
            // A constant per-column scale after the product (torchao's int8
            // weight-only `mm · s`) multiplies into the weight's scales.
            _ => {
                let Some(scaled) = scale_rows(g, inputs[2], column) else { return Ok(Rewrite::Keep) };
                inputs[2] = scaled;
            }
        }
        let op = g.nodes[ql].op.clone();
        Ok(Rewrite::Replace(vec![g.push(op, inputs, out_ty, loc)]))
    })
}
