//! Torch's FFT ops and the ops that consume their complex results.
//!
//! kiln's IR has no complex dtype and does not grow one: the importer keeps a
//! complex program value as a pair of real IR values (real part, imaginary
//! part) in its complex table (see [`Importer::bind_complex`]), and every op
//! that touches one is lowered here onto those parts. Complex values thus live
//! only inside the program: a complex program input or output, or an op this
//! module does not know receiving one, is a compile-time error.
//!
//! A transform along one axis is a dense DFT: a `Linear` (batched matrix
//! product) against constant cos/sin matrices of the signal length, O(n²)
//! per output row. The matrices are computed in f64 with the angle reduced
//! exactly (`j·k mod n`), the products run in f64 and the result is cast back
//! to the program's dtype, which keeps f32 results within torch's tolerance
//! of pocketfft. Zero-padding or truncating the input to the signal length
//! (`n=`/`s=`) and the normalization factor are folded into the matrices.

use crate::import::importer::{
    checked, invalid, table_len, tensor_names, unsupported, Importer, Scalar, COMPLEX_SCOPE, R,
};
use crate::import::views::ViewStep;
use crate::pt2::program::{Arg, Node};
use kiln_ir::{BinaryOp, ConstBytes, DType, Dim, Op, TensorType, UnaryOp, ValueId};

use super::shape::normalize_axis;

/// Complex value in parts; `im: None` is a real value seen as complex.
#[derive(Clone, Copy)]
pub(super) struct Parts {
    pub(super) re: ValueId,
    pub(super) im: Option<ValueId>,
}

/// Whether `n` reads or makes a complex value (and so is converted here).
pub(super) fn involves_complex(imp: &Importer, n: &Node) -> bool {
    if n.inputs.iter().any(|a| tensor_names(&a.arg).any(|t| imp.complex(t).is_some())) {
        return true;
    }
    n.outputs.iter().flat_map(crate::import::importer::output_names).any(|o| imp.is_complex_meta(&o))
}

/// Converts a node that reads or makes a complex value.
pub(super) fn convert(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    convert_op(imp, n, name, overload)?;
    // torch's views between a complex tensor and its parts share storage:
    // recorded as views kiln cannot write through, so that an in-place
    // write into either side fails at compile time instead of leaving the
    // other stale.
    if matches!(name, "view_as_real" | "view_as_complex" | "real" | "imag" | "conj" | "_conj") {
        if let (Some(Arg::Tensor(out)), Ok(base)) = (n.outputs.first(), imp.tensor_name(n, "self")) {
            let (out, base) = (out.clone(), base.to_string());
            imp.record_view(&out, &base, ViewStep::Opaque(format!("a `{name}` view")));
        }
    }
    Ok(())
}

fn convert_op(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    match name {
        "_fft_r2c" => fft_r2c(imp, n),
        "_fft_c2r" => fft_c2r(imp, n),
        "_fft_c2c" => fft_c2c(imp, n),
        "fft_rfft" | "fft_rfft2" | "fft_rfftn" | "fft_fft" | "fft_fft2" | "fft_fftn" | "fft_ifft" | "fft_ifft2"
        | "fft_ifftn" | "fft_irfft" | "fft_irfft2" | "fft_irfftn" | "fft_hfft" | "fft_hfft2" | "fft_hfftn"
        | "fft_ihfft" | "fft_ihfft2" | "fft_ihfftn" => torch_fft(imp, n, name),
        "polar" => polar(imp, n),
        "view_as_real" => view_as_real(imp, n),
        "view_as_complex" => view_as_complex(imp, n),
        "complex" => make_complex(imp, n),
        "real" | "imag" => {
            let z = complex_input(imp, n, "self")?;
            let v = if name == "real" { z.re } else { imag_or_zero(imp, z)? };
            bind_real(imp, n, v)
        }
        "abs" | "absolute" => {
            let z = complex_input(imp, n, "self")?;
            let v = abs(imp, z)?;
            bind_real(imp, n, v)
        }
        "angle" => {
            let mut z = complex_input(imp, n, "self")?;
            // A real integer or bool input: its angle (0 or π) is a float.
            let out = imp.out_ty(n, 0)?;
            if z.im.is_none() && imp.ty(z.re).dtype != out.dtype {
                z.re = imp.cast(z.re, out.dtype);
            }
            let im = imag_or_zero(imp, z)?;
            let v = imp.push(Op::Binary(BinaryOp::Atan2), vec![im, z.re])?;
            bind_real(imp, n, v)
        }
        // e^re (cos im + i sin im).
        "exp" => {
            let z = complex_input(imp, n, "self")?;
            let im = imag_or_zero(imp, z)?;
            let scale = imp.push(Op::Unary(UnaryOp::Exp), vec![z.re])?;
            let (cos, sin) =
                (imp.push(Op::Unary(UnaryOp::Cos), vec![im])?, imp.push(Op::Unary(UnaryOp::Sin), vec![im])?);
            let re = bin(imp, BinaryOp::Mul, scale, cos)?;
            let im = bin(imp, BinaryOp::Mul, scale, sin)?;
            bind_out(imp, n, Parts { re, im: Some(im) })
        }
        "_conj" | "conj" | "conj_physical" | "_conj_physical" => {
            let z = complex_input(imp, n, "self")?;
            let im = imag_or_zero(imp, z)?;
            let im = imp.push(Op::Unary(UnaryOp::Neg), vec![im])?;
            bind_out(imp, n, Parts { re: z.re, im: Some(im) })
        }
        "neg" | "negative" => {
            let z = complex_input(imp, n, "self")?;
            let re = imp.push(Op::Unary(UnaryOp::Neg), vec![z.re])?;
            let im = imag_or_zero(imp, z)?;
            let im = imp.push(Op::Unary(UnaryOp::Neg), vec![im])?;
            bind_out(imp, n, Parts { re, im: Some(im) })
        }
        // Views and copies that keep the values: both parts pass through.
        "resolve_conj" | "resolve_neg" | "clone" | "alias" | "contiguous" | "detach" | "lift_fresh_copy" => {
            let z = complex_input(imp, n, "self")?;
            bind_out(imp, n, z)
        }
        // A real tensor converted to complex: a zero imaginary part.
        "_to_copy" | "to" if imp.complex(imp.tensor_name(n, "self")?).is_none() => {
            let z = complex_input(imp, n, "self")?;
            bind_out(imp, n, z)
        }
        "stft" => stft(imp, n),
        "istft" => istft(imp, n),
        "add" | "sub" | "mul" | "div" | "rsub" => arith(imp, n, name),
        "subtract" => arith(imp, n, "sub"),
        "multiply" => arith(imp, n, "mul"),
        "divide" | "true_divide" => arith(imp, n, "div"),
        // Linear in the data and the same on both parts: each part is
        // converted by the real op's handler.
        "view" | "_unsafe_view" | "reshape" | "flatten" | "unflatten" | "unsqueeze" | "squeeze" | "expand" | "t"
        | "transpose" | "permute" | "movedim" | "moveaxis" | "swapaxes" | "swapdims" | "slice" | "select"
        | "narrow" | "cat" | "concat" | "concatenate" | "split" | "split_with_sizes" | "chunk" | "unbind"
        | "tensor_split" | "flip" | "sum" | "mean" | "repeat" | "index_select" => {
            super::complex_ops::per_part(imp, n, name, overload, None)
        }
        "index" | "_unsafe_index" if overload == "Tensor" => super::complex_ops::per_part(imp, n, name, overload, None),
        "constant_pad_nd" => {
            let value = imp.opt_scalar(n, "value")?.map_or(0.0, Scalar::as_f64);
            if value != 0.0 {
                return unsupported(format!(
                    "`constant_pad_nd` of a complex value with pad value {value}; {COMPLEX_SCOPE}"
                ));
            }
            super::complex_ops::per_part(imp, n, name, overload, None)
        }
        _ => match super::complex_math::convert(imp, n, name, overload)
            .or_else(|| super::complex_factor::convert(imp, n, name, overload))
            .or_else(|| super::complex_composite::convert(imp, n, name, overload))
            .or_else(|| super::complex_linalg::convert(imp, n, name, overload))
            .or_else(|| super::complex_ops::convert(imp, n, name, overload))
        {
            Some(done) => done,
            None => unsupported(format!("`{name}` on a complex value; {COMPLEX_SCOPE}")),
        },
    }
}

// ------------------------------------------------------------------ operands

/// Complex tensor argument `arg` of `n`; a real tensor is taken with a zero
/// imaginary part.
pub(super) fn complex_input(imp: &mut Importer, n: &Node, arg: &str) -> R<Parts> {
    let name = imp.tensor_name(n, arg)?;
    operand(imp, name)
}

pub(super) fn operand(imp: &mut Importer, name: &str) -> R<Parts> {
    match imp.complex(name) {
        Some((re, im)) => Ok(Parts { re, im: Some(im) }),
        None => Ok(Parts { re: imp.value(name)?, im: None }),
    }
}

/// The imaginary part, materializing zeros for a real operand.
pub(super) fn imag_or_zero(imp: &mut Importer, z: Parts) -> R<ValueId> {
    match z.im {
        Some(im) => Ok(im),
        // Zeros, not `re · 0`: that would be -0 for negative parts (angle
        // would flip from π to -π) and NaN for infinite ones.
        None => {
            let ty = imp.ty(z.re).clone();
            Ok(imp.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, Vec::new(), ty))
        }
    }
}

pub(super) fn cast_parts(imp: &mut Importer, z: Parts, dtype: DType) -> Parts {
    Parts { re: imp.cast(z.re, dtype), im: z.im.map(|im| imp.cast(im, dtype)) }
}

/// Binds a real output (cast to its declared dtype).
pub(super) fn bind_real(imp: &mut Importer, n: &Node, v: ValueId) -> R<()> {
    let out = imp.out_ty(n, 0)?;
    let v = imp.cast(v, out.dtype);
    let v = if imp.ty(v).shape != out.shape {
        imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![v], out)
    } else {
        v
    };
    imp.bind(n, 0, v)
}

/// Binds complex output 0 of `n` to `z`, cast to the output's part dtype and
/// broadcast to its shape.
pub(super) fn bind_out(imp: &mut Importer, n: &Node, z: Parts) -> R<()> {
    let Some(Arg::Tensor(out)) = n.outputs.first() else {
        return invalid("expected a single tensor output");
    };
    let ty = imp.part_type(out)?;
    let im = imag_or_zero(imp, z)?;
    let mut parts = [imp.cast(z.re, ty.dtype), imp.cast(im, ty.dtype)];
    for p in &mut parts {
        if imp.ty(*p).shape != ty.shape {
            *p = if imp.ty(*p).numel() == ty.numel() {
                imp.push_typed(Op::Reshape { shape: ty.shape.clone() }, vec![*p], ty.clone())
            } else {
                imp.push_typed(Op::Expand { shape: ty.shape.clone() }, vec![*p], ty.clone())
            };
        }
    }
    imp.bind_complex(out, parts[0], parts[1]);
    Ok(())
}

// ---------------------------------------------------------------- arithmetic

fn bin(imp: &mut Importer, op: BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
    imp.push(Op::Binary(op), vec![a, b])
}

fn abs(imp: &mut Importer, z: Parts) -> R<ValueId> {
    let Some(im) = z.im else { return imp.push(Op::Unary(UnaryOp::Abs), vec![z.re]) };
    let rr = bin(imp, BinaryOp::Mul, z.re, z.re)?;
    let ii = bin(imp, BinaryOp::Mul, im, im)?;
    let s = bin(imp, BinaryOp::Add, rr, ii)?;
    imp.push(Op::Unary(UnaryOp::Sqrt), vec![s])
}

pub(super) fn mul(imp: &mut Importer, a: Parts, b: Parts) -> R<Parts> {
    Ok(match (a.im, b.im) {
        (None, None) => Parts { re: bin(imp, BinaryOp::Mul, a.re, b.re)?, im: None },
        (Some(ai), None) => {
            Parts { re: bin(imp, BinaryOp::Mul, a.re, b.re)?, im: Some(bin(imp, BinaryOp::Mul, ai, b.re)?) }
        }
        (None, Some(bi)) => {
            Parts { re: bin(imp, BinaryOp::Mul, a.re, b.re)?, im: Some(bin(imp, BinaryOp::Mul, a.re, bi)?) }
        }
        (Some(ai), Some(bi)) => {
            let ac = bin(imp, BinaryOp::Mul, a.re, b.re)?;
            let bd = bin(imp, BinaryOp::Mul, ai, bi)?;
            let ad = bin(imp, BinaryOp::Mul, a.re, bi)?;
            let bc = bin(imp, BinaryOp::Mul, ai, b.re)?;
            Parts { re: bin(imp, BinaryOp::Sub, ac, bd)?, im: Some(bin(imp, BinaryOp::Add, ad, bc)?) }
        }
    })
}

pub(super) fn div(imp: &mut Importer, a: Parts, b: Parts) -> R<Parts> {
    let Some(bi) = b.im else {
        let re = bin(imp, BinaryOp::Div, a.re, b.re)?;
        let im = match a.im {
            Some(ai) => Some(bin(imp, BinaryOp::Div, ai, b.re)?),
            None => None,
        };
        return Ok(Parts { re, im });
    };
    // a / b = a · conj(b) / |b|².
    let cc = bin(imp, BinaryOp::Mul, b.re, b.re)?;
    let dd = bin(imp, BinaryOp::Mul, bi, bi)?;
    let den = bin(imp, BinaryOp::Add, cc, dd)?;
    let neg_bi = imp.push(Op::Unary(UnaryOp::Neg), vec![bi])?;
    let num = mul(imp, a, Parts { re: b.re, im: Some(neg_bi) })?;
    let re = bin(imp, BinaryOp::Div, num.re, den)?;
    let im = match num.im {
        Some(i) => Some(bin(imp, BinaryOp::Div, i, den)?),
        None => None,
    };
    Ok(Parts { re, im })
}

/// `add/sub/mul/div` (`.Tensor` or `.Scalar`, `alpha` for add/sub) with at
/// least one complex operand; the other may be real, a tensor or a Python
/// real scalar. Everything runs in the output's part dtype.
fn arith(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let Some(Arg::Tensor(out)) = n.outputs.first() else {
        return invalid("expected a single tensor output");
    };
    let dtype = imp.part_type(out)?.dtype;
    let a = complex_input(imp, n, "self")?;
    let a = cast_parts(imp, a, dtype);
    let b = match imp.arg(n, "other") {
        Some(Arg::Tensor(t)) => {
            let t = t.clone();
            operand(imp, &t)?
        }
        Some(Arg::Int(_) | Arg::Float(_) | Arg::Bool(_) | Arg::SymInt(_) | Arg::SymFloat(_)) => {
            let s = imp.scalar(n, "other")?;
            Parts { re: imp.scalar_const(s, dtype), im: None }
        }
        // A Python complex number (`z * 1j`).
        Some(&Arg::Complex(re, im)) => Parts {
            re: imp.scalar_const(Scalar::Float(re), dtype),
            im: Some(imp.scalar_const(Scalar::Float(im), dtype)),
        },
        Some(other) => return unsupported(format!("`{name}` with operand {other:?}; {COMPLEX_SCOPE}")),
        None => return invalid("required argument `other` is missing"),
    };
    let mut b = cast_parts(imp, b, dtype);
    // `rsub` is `other − alpha · self`.
    let rsub = name == "rsub";
    let mut a = a;
    if matches!(name, "add" | "sub" | "rsub") {
        let alpha = imp.opt_scalar(n, "alpha")?.map_or(1.0, Scalar::as_f64);
        if alpha != 1.0 {
            let k = imp.scalar_const(Scalar::Float(alpha), dtype);
            let scaled = if rsub { &mut a } else { &mut b };
            *scaled = mul(imp, *scaled, Parts { re: k, im: None })?;
        }
    }
    let (a, b, name) = if rsub { (b, a, "sub") } else { (a, b, name) };
    let z = match name {
        "add" | "sub" => {
            let op = if name == "add" { BinaryOp::Add } else { BinaryOp::Sub };
            let re = bin(imp, op, a.re, b.re)?;
            let im = match (a.im, b.im) {
                (Some(ai), Some(bi)) => Some(bin(imp, op, ai, bi)?),
                (Some(ai), None) => Some(ai),
                (None, Some(bi)) if op == BinaryOp::Add => Some(bi),
                (None, Some(bi)) => Some(imp.push(Op::Unary(UnaryOp::Neg), vec![bi])?),
                (None, None) => None,
            };
            Parts { re, im }
        }
        "mul" => mul(imp, a, b)?,
        _ => div(imp, a, b)?,
    };
    bind_out(imp, n, z)
}

// ------------------------------------------------------------ complex ↔ real

/// `aten::view_as_real(Tensor(a) self) -> Tensor(a)`: `[.., 2]` of (re, im).
fn view_as_real(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let im = imag_or_zero(imp, z)?;
    let v = interleave(imp, z.re, im)?;
    bind_real(imp, n, v)
}

/// The real value of `re` and `im` (same type) with one more trailing
/// dimension of 2 holding (re, im): `view_as_real`, and the bytes of the
/// complex tensor they are (a complex program output is this value).
pub(crate) fn interleave(imp: &mut Importer, re: ValueId, im: ValueId) -> R<ValueId> {
    let mut parts = Vec::new();
    for p in [re, im] {
        let mut shape = imp.ty(p).shape.clone();
        shape.push(Dim::Const(1));
        parts.push(imp.push(Op::Reshape { shape }, vec![p])?);
    }
    let axis = imp.ty(parts[0]).rank() - 1;
    imp.push(Op::Concat { axis }, parts)
}

/// `aten::view_as_complex(Tensor(a) self) -> Tensor(a)`: the last axis (of
/// size 2) holds (re, im).
fn view_as_complex(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let (re, im) = split_parts(imp, x)?;
    bind_out(imp, n, Parts { re, im: Some(im) })
}

/// The (re, im) parts of real value `x` whose last dimension of 2 holds
/// them: `view_as_complex`, and a complex program input.
pub(crate) fn split_parts(imp: &mut Importer, x: ValueId) -> R<(ValueId, ValueId)> {
    let rank = imp.ty(x).rank();
    if rank == 0 || imp.ty(x).shape[rank - 1] != Dim::Const(2) {
        return invalid("view_as_complex needs a last dimension of size 2");
    }
    let part = |imp: &mut Importer, i: i64| -> R<ValueId> {
        let s = imp.push(Op::Slice { axis: rank - 1, start: i, end: i + 1, step: 1 }, vec![x])?;
        let shape = imp.ty(s).shape[..rank - 1].to_vec();
        imp.push(Op::Reshape { shape }, vec![s])
    };
    Ok((part(imp, 0)?, part(imp, 1)?))
}

/// `aten::complex(Tensor real, Tensor imag) -> Tensor`.
fn make_complex(imp: &mut Importer, n: &Node) -> R<()> {
    let re = imp.tensor(n, "real")?;
    let im = imp.tensor(n, "imag")?;
    // Broadcast each part against the other so both take the output's shape.
    let zero_re = imp.scalar_const(Scalar::Float(0.0), imp.ty(re).dtype);
    let re0 = bin(imp, BinaryOp::Mul, re, zero_re)?;
    let zero_im = imp.scalar_const(Scalar::Float(0.0), imp.ty(im).dtype);
    let im0 = bin(imp, BinaryOp::Mul, im, zero_im)?;
    let im_b = bin(imp, BinaryOp::Add, im, re0)?;
    let re_b = bin(imp, BinaryOp::Add, re, im0)?;
    bind_out(imp, n, Parts { re: re_b, im: Some(im_b) })
}

// --------------------------------------------------------------- transforms

/// What a one-axis transform does.
#[derive(Clone, Copy)]
enum Kind {
    /// Real to complex, keeping `n/2+1` bins when `onesided`.
    R2C { onesided: bool },
    /// Complex to complex, `e^{-iθ}` when `forward`.
    C2C { forward: bool },
    /// Hermitian bins to `n` real samples.
    C2R,
}

/// `norm` factor on each axis of length `n` for torch's normalization code
/// (0: none, 1: 1/√n, 2: 1/n, as `fft_norm_mode` numbers them); the product
/// over the axes is torch's factor for the whole signal.
fn norm_factor(code: i64, n: i64) -> R<f64> {
    match code {
        0 => Ok(1.0),
        1 => Ok(1.0 / (n as f64).sqrt()),
        2 => Ok(1.0 / n as f64),
        other => invalid(format!("unknown FFT normalization code {other}")),
    }
}

/// An f64 `[rows, cols]` constant.
fn matrix(imp: &mut Importer, rows: i64, cols: i64, data: &[f64]) -> ValueId {
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    imp.g.add_const(None, TensorType::fixed(DType::F64, &[rows, cols]), ConstBytes::owned(bytes))
}

/// The transform of `z` (f64 parts) along `axis`, for signal length `n`:
/// `y = W x` with `W = Wr + i·Wi` of shape `[out, in]`, `in` being the
/// axis's current length (entries past `n` are zero: truncation; inputs
/// shorter than `n`: zero-padding).
fn transform_axis(imp: &mut Importer, z: Parts, axis: usize, n: i64, kind: Kind, scale: f64) -> R<Parts> {
    let rank = imp.ty(z.re).rank();
    let Some(len_in) = imp.ty(z.re).shape[axis].as_const() else {
        return unsupported("an FFT over a dimension of symbolic size (the DFT matrices need a static length)");
    };
    if n < 1 {
        return invalid(format!("FFT signal length {n}"));
    }
    let len_out = match kind {
        Kind::R2C { onesided: true } => n / 2 + 1,
        _ => n,
    };
    // Input entries that count: the signal's (or, for C2R, its n/2+1 bins).
    let used = match kind {
        Kind::C2R => len_in.min(n / 2 + 1),
        _ => len_in.min(n),
    };
    let (rows, cols) = (len_out as usize, len_in as usize);
    // The DFT matrices are weights of the artifact: cap them (n = 4096
    // both ways) so a hostile or huge length is an error, not an abort.
    const MAX_DFT_ENTRIES: usize = 1 << 24;
    if rows.saturating_mul(cols) > MAX_DFT_ENTRIES {
        return unsupported(format!(
            "an FFT of length {n} over {len_in} inputs: kiln's matrix-product DFT needs {rows}x{cols} matrices (at most {MAX_DFT_ENTRIES} entries)"
        ));
    }
    let (mut wr, mut wi) = (vec![0.0; rows * cols], vec![0.0; rows * cols]);
    for o in 0..rows {
        for i in 0..used as usize {
            let theta = 2.0 * std::f64::consts::PI * (((o as i64) * (i as i64)) % n) as f64 / n as f64;
            let (s, c) = theta.sin_cos();
            let (r, im) = match kind {
                Kind::R2C { .. } | Kind::C2C { forward: true } => (c, -s),
                Kind::C2C { forward: false } => (c, s),
                Kind::C2R => {
                    // Bin k stands for k and n-k (Hermitian symmetry) but for
                    // DC and, with even n, Nyquist; their imaginary parts
                    // meet sin(0) = sin(πt) = 0 and so are ignored, as torch does.
                    let w = if i == 0 || (n % 2 == 0 && i as i64 == n / 2) { 1.0 } else { 2.0 };
                    (w * c, w * s)
                }
            };
            wr[o * cols + i] = r * scale;
            wi[o * cols + i] = im * scale;
        }
    }
    let to_last = axis + 1 != rank;
    let mut perm: Vec<usize> = (0..rank).filter(|&d| d != axis).collect();
    perm.push(axis);
    let mut inverse = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let last = |imp: &mut Importer, v: ValueId| -> R<ValueId> {
        if to_last {
            imp.push(Op::Permute { perm: perm.clone() }, vec![v])
        } else {
            Ok(v)
        }
    };
    let re = last(imp, z.re)?;
    let im = match z.im {
        Some(im) => Some(last(imp, im)?),
        None => None,
    };
    let wr_c = matrix(imp, len_out, len_in, &wr);
    let wi_c = matrix(imp, len_out, len_in, &wi);
    let lin = |imp: &mut Importer, x: ValueId, w: ValueId| imp.push(Op::Linear, vec![x, w]);
    // y_re = Wr·re − Wi·im, y_im = Wr·im + Wi·re.
    let (y_re, y_im) = match im {
        None => (lin(imp, re, wr_c)?, lin(imp, re, wi_c)?),
        Some(im) => {
            let a = lin(imp, re, wr_c)?;
            let b = lin(imp, im, wi_c)?;
            let c = lin(imp, im, wr_c)?;
            let d = lin(imp, re, wi_c)?;
            (bin(imp, BinaryOp::Sub, a, b)?, bin(imp, BinaryOp::Add, c, d)?)
        }
    };
    let back = |imp: &mut Importer, v: ValueId| -> R<ValueId> {
        if to_last {
            imp.push(Op::Permute { perm: inverse.clone() }, vec![v])
        } else {
            Ok(v)
        }
    };
    let re = back(imp, y_re)?;
    match kind {
        Kind::C2R => Ok(Parts { re, im: None }),
        _ => Ok(Parts { re, im: Some(back(imp, y_im)?) }),
    }
}

fn axes(imp: &Importer, v: ValueId, dims: &[i64]) -> R<Vec<usize>> {
    let rank = imp.ty(v).rank();
    let axes = dims.iter().map(|&d| normalize_axis(d, rank)).collect::<R<Vec<_>>>()?;
    if (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
        return invalid(format!("FFT dims {dims:?} repeat an axis"));
    }
    if axes.is_empty() {
        return invalid("an FFT over no dims");
    }
    Ok(axes)
}

fn static_len(imp: &Importer, v: ValueId, axis: usize) -> R<i64> {
    match imp.ty(v).shape[axis].as_const() {
        Some(n) => Ok(n),
        None => unsupported("an FFT over a dimension of symbolic size (the DFT matrices need a static length)"),
    }
}

/// Real-to-complex over `axes` with signal lengths `sizes`: the last axis
/// first (one-sided when asked), then complex transforms along the others.
fn r2c(imp: &mut Importer, x: ValueId, axes: &[usize], sizes: &[i64], code: i64, onesided: bool) -> R<Parts> {
    let x = imp.cast(x, DType::F64);
    let last = axes.len() - 1;
    let mut z = transform_axis(
        imp,
        Parts { re: x, im: None },
        axes[last],
        sizes[last],
        Kind::R2C { onesided },
        norm_factor(code, sizes[last])?,
    )?;
    for i in 0..last {
        z = transform_axis(imp, z, axes[i], sizes[i], Kind::C2C { forward: true }, norm_factor(code, sizes[i])?)?;
    }
    Ok(z)
}

fn c2c(imp: &mut Importer, z: Parts, axes: &[usize], sizes: &[i64], code: i64, forward: bool) -> R<Parts> {
    let mut z = cast_parts(imp, z, DType::F64);
    for (&axis, &n) in axes.iter().zip(sizes) {
        z = transform_axis(imp, z, axis, n, Kind::C2C { forward }, norm_factor(code, n)?)?;
    }
    Ok(z)
}

/// Complex-to-real over `axes`: inverse complex transforms along all but the
/// last axis, then the Hermitian inverse along it to `sizes.last()` samples.
fn c2r(imp: &mut Importer, z: Parts, axes: &[usize], sizes: &[i64], code: i64) -> R<ValueId> {
    let last = axes.len() - 1;
    let z = c2c(imp, z, &axes[..last], &sizes[..last], code, false)?;
    let z = cast_parts(imp, z, DType::F64);
    Ok(transform_axis(imp, z, axes[last], sizes[last], Kind::C2R, norm_factor(code, sizes[last])?)?.re)
}

/// `aten::_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor`
fn fft_r2c(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dims = imp.ints(n, "dim", &[])?;
    let code = imp.int(n, "normalization", None)?;
    let onesided = imp.bool(n, "onesided", true)?;
    let axes = axes(imp, x, &dims)?;
    let sizes = axes.iter().map(|&a| static_len(imp, x, a)).collect::<R<Vec<_>>>()?;
    let z = r2c(imp, x, &axes, &sizes, code, onesided)?;
    bind_out(imp, n, z)
}

/// `aten::_fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) -> Tensor`
fn fft_c2c(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let dims = imp.ints(n, "dim", &[])?;
    let code = imp.int(n, "normalization", None)?;
    let forward = imp.bool(n, "forward", true)?;
    let axes = axes(imp, z.re, &dims)?;
    let sizes = axes.iter().map(|&a| static_len(imp, z.re, a)).collect::<R<Vec<_>>>()?;
    let z = c2c(imp, z, &axes, &sizes, code, forward)?;
    bind_out(imp, n, z)
}

/// `aten::_fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size) -> Tensor`
fn fft_c2r(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let dims = imp.ints(n, "dim", &[])?;
    let code = imp.int(n, "normalization", None)?;
    let last_size = imp.int(n, "last_dim_size", None)?;
    let axes = axes(imp, z.re, &dims)?;
    let mut sizes = axes.iter().map(|&a| static_len(imp, z.re, a)).collect::<R<Vec<_>>>()?;
    *sizes.last_mut().expect("axes is not empty") = last_size;
    let v = c2r(imp, z, &axes, &sizes, code)?;
    bind_real(imp, n, v)
}

/// The training-IR forms `torch.fft.{rfft,irfft,fft,ifft,hfft}{,2,n}(self, n|s,
/// dim, norm)`: the signal lengths and normalization resolved as torch's
/// Python front end does, then the same lowering as the Core ATen ops.
fn torch_fft(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let rank = imp.ty(z.re).rank();
    let base = name.trim_start_matches("fft_");
    let inverse = base.starts_with('i');
    let (single, two) = (!base.ends_with('2') && !base.ends_with('n'), base.ends_with('2'));
    let (dims, sizes): (Vec<i64>, Option<Vec<i64>>) = if single {
        (vec![imp.int(n, "dim", Some(-1))?], imp.opt_int(n, "n")?.map(|v| vec![v]))
    } else {
        let s = if imp.arg(n, "s").is_some() { Some(imp.ints(n, "s", &[])?) } else { None };
        let dims = match imp.arg(n, "dim") {
            Some(_) => imp.ints(n, "dim", &[])?,
            None if two => vec![-2, -1],
            // fftn: the last len(s) dims, or every dim.
            None => {
                let k = s.as_ref().map_or(rank, Vec::len) as i64;
                (rank as i64 - k..rank as i64).collect()
            }
        };
        (dims, s)
    };
    let axes = axes(imp, z.re, &dims)?;
    if let Some(s) = &sizes {
        if s.len() != axes.len() {
            return invalid(format!("`{name}`: s has {} entries for {} dims", s.len(), axes.len()));
        }
    }
    // hfft: the forward transform of a Hermitian signal, `irfft(conj(x))`
    // with the forward transform's normalization.
    let hermitian = base.starts_with("hfft");
    let real_out = base.starts_with("irfft") || hermitian;
    let mut lens = Vec::new();
    for (i, &a) in axes.iter().enumerate() {
        let given = sizes.as_ref().map(|s| s[i]).filter(|&v| v != -1);
        let len = match given {
            Some(v) => v,
            // irfft's default output length comes from the one-sided bins.
            None if real_out && i + 1 == axes.len() => {
                checked("irfft's default length", (static_len(imp, z.re, a)? - 1).checked_mul(2))?
            }
            None => static_len(imp, z.re, a)?,
        };
        lens.push(len);
    }
    let code = match (imp.string(n, "norm", "backward")?, inverse) {
        ("backward", false) | ("forward", true) => 0,
        ("ortho", _) => 1,
        ("forward", false) | ("backward", true) => 2,
        (other, _) => return invalid(format!("unknown FFT norm {other:?}")),
    };
    match base {
        "rfft" | "rfft2" | "rfftn" => {
            if z.im.is_some() {
                return unsupported(format!("`{name}` of a complex value (torch rejects it too)"));
            }
            let out = r2c(imp, z.re, &axes, &lens, code, true)?;
            bind_out(imp, n, out)
        }
        "irfft" | "irfft2" | "irfftn" => {
            let v = c2r(imp, z, &axes, &lens, code)?;
            bind_real(imp, n, v)
        }
        // ihfft: the inverse of hfft for a real signal, `conj(rfft(x))`
        // with the inverse transform's normalization.
        "ihfft" | "ihfft2" | "ihfftn" => {
            if z.im.is_some() {
                return unsupported(format!("`{name}` of a complex value (torch rejects it too)"));
            }
            let out = r2c(imp, z.re, &axes, &lens, code, true)?;
            let im = match out.im {
                Some(im) => Some(imp.push(Op::Unary(UnaryOp::Neg), vec![im])?),
                None => None,
            };
            bind_out(imp, n, Parts { re: out.re, im })
        }
        "hfft" | "hfft2" | "hfftn" => {
            let im = match z.im {
                Some(im) => Some(imp.push(Op::Unary(UnaryOp::Neg), vec![im])?),
                None => None,
            };
            let v = c2r(imp, Parts { re: z.re, im }, &axes, &lens, code)?;
            bind_real(imp, n, v)
        }
        _ => {
            // fft/ifft of a real input: the full (two-sided) spectrum.
            let out = match z.im {
                None if !inverse => r2c(imp, z.re, &axes, &lens, code, false)?,
                _ => c2c(imp, z, &axes, &lens, code, !inverse)?,
            };
            bind_out(imp, n, out)
        }
    }
}

/// `aten::stft(Tensor self, int n_fft, int? hop_length=None, int?
/// win_length=None, Tensor? window=None, bool normalized=False, bool?
/// onesided=None, bool? return_complex=None) -> Tensor`, as training IR
/// keeps it (after `center`'s padding, which torch emits separately): frames
/// `f·hop + j` gathered from the last axis, times the window, a real DFT of
/// `n_fft` along the frame, then `[.., freq, frames]`.
fn stft(imp: &mut Importer, n: &Node) -> R<()> {
    // A complex signal is framed part by part and transformed both ways
    // round (torch's default for it: every bin, not one side).
    let x = complex_input(imp, n, "self")?;
    let complex_signal = x.im.is_some();
    let n_fft = imp.int(n, "n_fft", None)?;
    let hop = imp.opt_int(n, "hop_length")?.unwrap_or(n_fft / 4);
    let win_length = imp.opt_int(n, "win_length")?.unwrap_or(n_fft);
    let window = imp.opt_tensor(n, "window")?;
    let normalized = imp.bool(n, "normalized", false)?;
    let onesided = imp.bool(n, "onesided", !complex_signal)?;
    if onesided && complex_signal {
        return invalid("stft: onesided output of a complex signal (torch refuses it too)");
    }
    // return_complex=False (deprecated in torch): the bins as real pairs,
    // `view_as_real`'s layout.
    let as_pairs = !imp.bool(n, "return_complex", true)?;
    if win_length != n_fft {
        return unsupported(format!("`stft` with win_length {win_length} != n_fft {n_fft} (a zero-padded window)"));
    }
    let rank = imp.ty(x.re).rank();
    if rank == 0 || n_fft < 1 || hop < 1 {
        return invalid(format!("stft of a rank-{rank} tensor, n_fft {n_fft}, hop {hop}"));
    }
    let axis = rank - 1;
    let len = static_len(imp, x.re, axis)?;
    if len < n_fft {
        return invalid(format!("stft: signal of {len} samples is shorter than n_fft {n_fft}"));
    }
    let frames = (len - n_fft) / hop + 1;
    table_len("stft's frame positions", &[frames, n_fft])?;
    let idx: Vec<i64> = (0..frames).flat_map(|f| (0..n_fft).map(move |j| f * hop + j)).collect();
    let bytes: Vec<u8> = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    let idx = imp.g.add_const(None, TensorType::fixed(DType::I64, &[frames, n_fft]), ConstBytes::owned(bytes));
    let x = cast_parts(imp, x, DType::F64);
    let frame = |imp: &mut Importer, v: ValueId| imp.push(Op::Gather { axis }, vec![v, idx]);
    let mut framed = Parts {
        re: frame(imp, x.re)?,
        im: match x.im {
            Some(im) => Some(frame(imp, im)?),
            None => None,
        },
    };
    if let Some(w) = window {
        let w = imp.cast(w, DType::F64);
        framed = mul(imp, framed, Parts { re: w, im: None })?;
    }
    let kind = if complex_signal { Kind::C2C { forward: true } } else { Kind::R2C { onesided } };
    let z = transform_axis(imp, framed, axis + 1, n_fft, kind, norm_factor(if normalized { 1 } else { 0 }, n_fft)?)?;
    let mut perm: Vec<usize> = (0..axis).collect();
    perm.extend([axis + 1, axis]);
    let re = imp.push(Op::Permute { perm: perm.clone() }, vec![z.re])?;
    let im = match z.im {
        Some(im) => Some(imp.push(Op::Permute { perm }, vec![im])?),
        None => None,
    };
    if as_pairs {
        let im = imag_or_zero(imp, Parts { re, im })?;
        let out = imp.out_ty(n, 0)?;
        let (re, im) = (imp.cast(re, out.dtype), imp.cast(im, out.dtype));
        let v = interleave(imp, re, im)?;
        return bind_real(imp, n, v);
    }
    bind_out(imp, n, Parts { re, im })
}

/// `istft(self, n_fft, hop_length, win_length, window, center, normalized,
/// onesided, length, return_complex=False)`, as torch computes it: each
/// frame's inverse real transform (of its first `n_fft/2 + 1` bins), times
/// the window, overlap-added, divided by the overlap-added squared window,
/// trimmed by `n_fft/2` on each side when `center`, cut or zero-padded to
/// `length`. A window whose envelope nears zero inside the output fails
/// the run, as torch's NOLA check does.
fn istft(imp: &mut Importer, n: &Node) -> R<()> {
    let z = complex_input(imp, n, "self")?;
    let n_fft = imp.int(n, "n_fft", None)?;
    let hop = imp.opt_int(n, "hop_length")?.unwrap_or(n_fft / 4);
    let win_length = imp.opt_int(n, "win_length")?.unwrap_or(n_fft);
    let window = imp.opt_tensor(n, "window")?;
    let center = imp.bool(n, "center", true)?;
    let normalized = imp.bool(n, "normalized", false)?;
    let length = imp.opt_int(n, "length")?;
    if imp.bool(n, "return_complex", false)? {
        return unsupported("`istft` with return_complex=True (a complex signal)");
    }
    if win_length != n_fft {
        return unsupported(format!("`istft` with win_length {win_length} != n_fft {n_fft} (a zero-padded window)"));
    }
    let rank = imp.ty(z.re).rank();
    if !(2..=3).contains(&rank) || n_fft < 1 || hop < 1 {
        return invalid(format!("istft of a rank-{rank} tensor, n_fft {n_fft}, hop {hop}"));
    }
    let (bins, frames) = (static_len(imp, z.re, rank - 2)?, static_len(imp, z.re, rank - 1)?);
    let onesided = imp.bool(n, "onesided", bins != n_fft)?;
    let want_bins = if onesided { n_fft / 2 + 1 } else { n_fft };
    if bins != want_bins || frames < 1 {
        return invalid(format!("istft: {bins} bins × {frames} frames for n_fft {n_fft} (onesided: {onesided})"));
    }
    // [.., bins, frames] → [.., frames, n_fft] real samples.
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    let z = cast_parts(imp, z, DType::F64);
    let swap = |imp: &mut Importer, v: ValueId| imp.push(Op::Permute { perm: perm.clone() }, vec![v]);
    let z = Parts {
        re: swap(imp, z.re)?,
        im: match z.im {
            Some(im) => Some(swap(imp, im)?),
            None => None,
        },
    };
    let code = if normalized { 1 } else { 2 };
    let x = transform_axis(imp, z, rank - 1, n_fft, Kind::C2R, norm_factor(code, n_fft)?)?.re;
    let window = match window {
        Some(w) => imp.cast(w, DType::F64),
        None => {
            let ty = TensorType::fixed(DType::F64, &[n_fft]);
            imp.push_typed(Op::Full { value: 1.0, dtype: DType::F64, shape: ty.shape.clone() }, vec![], ty)
        }
    };
    let x = bin(imp, BinaryOp::Mul, x, window)?;
    // Overlap-add: frame f's sample j lands at f·hop + j.
    let total = n_fft + hop * (frames - 1);
    table_len("istft's sample positions", &[frames, n_fft])?;
    let idx: Vec<i64> = (0..frames).flat_map(|f| (0..n_fft).map(move |j| f * hop + j)).collect();
    let bytes: Vec<u8> = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    let idx = imp.g.add_const(None, TensorType::fixed(DType::I64, &[frames * n_fft]), ConstBytes::owned(bytes));
    let overlap_add = |imp: &mut Importer, v: ValueId| -> R<ValueId> {
        let mut shape = imp.ty(v).shape.clone();
        let batch = shape.len() - 2;
        shape.truncate(batch);
        let flat: Vec<Dim> = shape.iter().cloned().chain([Dim::Const(frames * n_fft)]).collect();
        let v = imp.push(Op::Reshape { shape: flat }, vec![v])?;
        let out_shape: Vec<Dim> = shape.into_iter().chain([Dim::Const(total)]).collect();
        let ty = TensorType::new(DType::F64, out_shape.clone());
        let zeros = imp.push_typed(Op::Full { value: 0.0, dtype: DType::F64, shape: out_shape }, vec![], ty);
        imp.push(Op::IndexPut { axis: batch, accumulate: true }, vec![zeros, v, idx])
    };
    let y = overlap_add(imp, x)?;
    let w2 = bin(imp, BinaryOp::Mul, window, window)?;
    let w2 = imp.push(Op::Expand { shape: vec![Dim::Const(frames), Dim::Const(n_fft)] }, vec![w2])?;
    let envelope = overlap_add(imp, w2)?;
    let start = if center { n_fft / 2 } else { 0 };
    let end = match length {
        Some(l) => (start + l).min(total),
        None if center => total - n_fft / 2,
        None => total,
    };
    if end < start {
        return invalid(format!("istft: {total} samples, trimmed from {start} to {end}"));
    }
    let axis = imp.ty(y).rank() - 1;
    let y = imp.push(Op::Slice { axis, start, end, step: 1 }, vec![y])?;
    let envelope = imp.push(Op::Slice { axis: 0, start, end, step: 1 }, vec![envelope])?;
    // torch's NOLA check: the envelope must stay away from zero.
    let magnitude = imp.push(Op::Unary(UnaryOp::Abs), vec![envelope])?;
    let ok = imp.with_scalar(BinaryOp::Gt, magnitude, 1e-11)?;
    let message = "istft: the window's overlap-add envelope falls below 1e-11 inside the signal (torch's NOLA \
                   condition)"
        .to_string();
    let loc = imp.loc();
    imp.g.add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    let mut y = bin(imp, BinaryOp::Div, y, envelope)?;
    if let Some(l) = length {
        if l > end - start {
            let rank = axis + 1;
            let mut hi = vec![0; rank];
            hi[axis] = l - (end - start);
            let pad = Op::Pad {
                lo: vec![0; rank],
                hi,
                interior: vec![0; rank],
                mode: kiln_ir::PadMode::Constant,
                value: 0.0,
            };
            y = imp.push(pad, vec![y])?;
        }
    }
    bind_real(imp, n, y)
}

/// `polar(abs, angle)`: `abs · (cos angle, sin angle)` in the inputs' dtype.
fn polar(imp: &mut Importer, n: &Node) -> R<()> {
    let r = imp.tensor(n, "abs")?;
    let theta = imp.tensor(n, "angle")?;
    let cos = imp.push(Op::Unary(UnaryOp::Cos), vec![theta])?;
    let sin = imp.push(Op::Unary(UnaryOp::Sin), vec![theta])?;
    let re = bin(imp, BinaryOp::Mul, r, cos)?;
    let im = bin(imp, BinaryOp::Mul, r, sin)?;
    bind_out(imp, n, Parts { re, im: Some(im) })
}

/// `aten::hann_window(int window_length, *, ScalarType? dtype=None, ...)` and
/// `.periodic(int window_length, bool periodic, ...)`: `sin²(π k / N)` with
/// `N = length` (periodic, the default) or `length - 1`, a constant computed
/// in f64.
pub(super) fn hann_window(imp: &mut Importer, n: &Node) -> R<()> {
    let len = imp.int(n, "window_length", None)?;
    let periodic = imp.bool(n, "periodic", true)?;
    let out = imp.out_ty(n, 0)?;
    if len < 0 {
        return invalid(format!("hann_window of length {len}"));
    }
    table_len("hann_window", &[len])?;
    let denom = if periodic { len } else { len - 1 };
    let values: Vec<f64> = (0..len)
        .map(|k| if denom <= 0 { 1.0 } else { (std::f64::consts::PI * k as f64 / denom as f64).sin().powi(2) })
        .collect();
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let v = imp.g.add_const(None, TensorType::fixed(DType::F64, &[len]), ConstBytes::owned(bytes));
    let v = imp.cast(v, out.dtype);
    imp.bind(n, 0, v)
}
