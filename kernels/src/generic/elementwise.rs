//! Elementwise kernels: unary, binary (numpy broadcasting), where, cast, clamp.
//!
//! Every op is written once as a closure and handed to a small broadcasting
//! engine; the engine picks a tight, auto-vectorisable loop when the operands
//! are contiguous or scalar along the (collapsed) innermost dim.

use super::common::*;
use super::math::Real;
use super::vector;
use crate::context::Context;
use crate::parallel::{Threads, ELEMENT_CHUNK};
use crate::table::{KernelTable, UnaryFn};
use crate::types::{BinaryOp, DType, KernelError, Result, TensorMut, TensorRef, UnaryOp};
use half::{bf16, f16};

/// Integer element types: the wrapping arithmetic torch uses for ints.
pub trait IntElem: Scalar + Ord {
    const ZERO: Self;
    fn wadd(self, b: Self) -> Self;
    fn wsub(self, b: Self) -> Self;
    fn wmul(self, b: Self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    fn sign(self) -> Self;
    /// Python `//` (rounds toward -inf). `b != 0` is checked by the caller.
    fn floor_div(self, b: Self) -> Self;
    /// Python `%` (result has the sign of the divisor). `b != 0` checked by the caller.
    fn py_rem(self, b: Self) -> Self;
    /// `self ** e` with wrapping; a negative `e` as torch's integer pow.
    fn wpow(self, e: Self) -> Self;
    fn band(self, b: Self) -> Self;
    fn bor(self, b: Self) -> Self;
    fn bxor(self, b: Self) -> Self;
    fn bnot(self) -> Self;
    /// C `%` (sign of the dividend). `b != 0` is checked by the caller.
    fn c_rem(self, b: Self) -> Self;
}

macro_rules! impl_int_elem {
    ($($t:ty),*) => {$(
        impl IntElem for $t {
            const ZERO: Self = 0;
            #[inline(always)] fn wadd(self, b: Self) -> Self { self.wrapping_add(b) }
            #[inline(always)] fn wsub(self, b: Self) -> Self { self.wrapping_sub(b) }
            #[inline(always)] fn wmul(self, b: Self) -> Self { self.wrapping_mul(b) }
            #[inline(always)] fn wneg(self) -> Self { self.wrapping_neg() }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn wabs(self) -> Self { if self < 0 { self.wrapping_neg() } else { self } }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn sign(self) -> Self { if self > 0 { 1 } else if self < 0 { (0 as $t).wrapping_sub(1) } else { 0 } }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn floor_div(self, b: Self) -> Self {
                let q = self.wrapping_div(b);
                let r = self.wrapping_rem(b);
                if r != 0 && ((r < 0) != (b < 0)) { q.wrapping_sub(1) } else { q }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn py_rem(self, b: Self) -> Self {
                let r = self.wrapping_rem(b);
                if r != 0 && ((r < 0) != (b < 0)) { r.wrapping_add(b) } else { r }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn wpow(self, e: Self) -> Self {
                // A negative exponent (a tensor's: torch refuses a negative
                // Python int): torch's integer 1/x^|e| — 1 for 1, ±1 for -1,
                // else 0 (0 included).
                if e < 0 {
                    return if self == 1 {
                        1
                    } else if self.wrapping_add(1) == 0 {
                        if e & 1 != 0 { self } else { 1 }
                    } else {
                        0
                    };
                }
                // Square-and-multiply over the full exponent width, so huge
                // exponents cost 64 steps instead of overflowing a u32 cast.
                let mut e = e as u64;
                let mut base = self;
                let mut acc: $t = 1;
                while e > 0 {
                    if e & 1 == 1 { acc = acc.wrapping_mul(base); }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
            #[inline(always)] fn band(self, b: Self) -> Self { self & b }
            #[inline(always)] fn bor(self, b: Self) -> Self { self | b }
            #[inline(always)] fn bxor(self, b: Self) -> Self { self ^ b }
            #[inline(always)] fn bnot(self) -> Self { !self }
            #[inline(always)] fn c_rem(self, b: Self) -> Self { self.wrapping_rem(b) }
        }
    )*};
}
impl_int_elem!(i8, u8, i16, i32, i64);

/// `out[i] = f(x[i])`.
#[inline(always)]
fn map<A: Copy, O: Copy>(x: &[A], out: &mut [O], f: impl Fn(A) -> O) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

/// Applies a float unary op computed in f32 to a half-precision buffer,
/// through a stack chunk so nothing is allocated.
fn map_half<H: Scalar>(x: &[H], out: &mut [H], f: impl Fn(&[f32], &mut [f32])) {
    const CHUNK: usize = 256;
    let mut src = [0f32; CHUNK];
    let mut dst = [0f32; CHUNK];
    for (xc, oc) in x.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let n = xc.len();
        for (s, &v) in src.iter_mut().zip(xc) {
            *s = v.to_f64() as f32;
        }
        f(&src[..n], &mut dst[..n]);
        for (o, &v) in oc.iter_mut().zip(&dst[..n]) {
            *o = H::from_f64(v as f64);
        }
    }
}

/// torch's `calc_ndtr` with a half-precision `T`, every step rounded to `T`
/// as c10's half arithmetic does: `x * T(√½)`, its erf, `1 + erf`, `* 0.5`.
fn ndtr_half<H: Scalar>(x: H) -> H {
    let round = |v: f64| H::from_f64(v).to_f64();
    let c = round(std::f64::consts::FRAC_1_SQRT_2);
    let scaled = round(((x.to_f64() as f32) * (c as f32)) as f64);
    let e = round(super::math::erf_f64(scaled) as f32 as f64);
    H::from_f64(round(1.0 + e) * 0.5)
}

/// A special function computed in f64 and rounded once to `T`.
fn via_f64<T: Real>(x: &[T], out: &mut [T], f: fn(f64) -> f64) {
    map(x, out, |v| T::lit(f(v.to_f64())))
}

fn unary_float<T: Real>(op: UnaryOp, x: &[T], out: &mut [T]) -> Result<()> {
    let half = T::lit(0.5);
    let one = T::ONE;
    match op {
        UnaryOp::Neg => map(x, out, |v| -v),
        UnaryOp::Abs => map(x, out, |v| v.abs()),
        UnaryOp::Exp => vector::exp(x, out),
        UnaryOp::Log => map(x, out, |v| v.ln()),
        UnaryOp::Sqrt => map(x, out, |v| v.sqrt()),
        UnaryOp::Rsqrt => map(x, out, |v| one / v.sqrt()),
        UnaryOp::Reciprocal => map(x, out, |v| one / v),
        // NaN stays NaN, as in torch.relu.
        UnaryOp::Relu => map(x, out, |v| if v < T::ZERO { T::ZERO } else { v }),
        UnaryOp::Sigmoid => vector::sigmoid(x, out),
        UnaryOp::Tanh => vector::tanh(x, out),
        UnaryOp::Gelu => map(x, out, |v| v.gelu()),
        UnaryOp::GeluTanh => {
            let k0 = T::lit((2.0 / std::f64::consts::PI).sqrt());
            let k1 = T::lit(0.044715);
            map(x, out, |v| half * v * (one + (k0 * (v + k1 * v * v * v)).tanh()))
        }
        UnaryOp::Silu => vector::silu(x, out),
        UnaryOp::Erf => map(x, out, |v| v.erf()),
        UnaryOp::Erfc => map(x, out, |v| v.erfc()),
        UnaryOp::Lgamma => via_f64(x, out, super::special::lgamma),
        UnaryOp::Digamma => via_f64(x, out, super::special::digamma),
        UnaryOp::I0 => via_f64(x, out, super::special::i0),
        UnaryOp::I0e => via_f64(x, out, super::special::i0e),
        UnaryOp::I1 => via_f64(x, out, super::special::i1),
        UnaryOp::I1e => via_f64(x, out, super::special::i1e),
        UnaryOp::Erfcx => via_f64(x, out, super::special::erfcx),
        UnaryOp::Ndtr => via_f64(x, out, super::special::ndtr),
        UnaryOp::LogNdtr => via_f64(x, out, super::special::log_ndtr),
        UnaryOp::BesselJ0 => via_f64(x, out, super::special::bessel_j0),
        UnaryOp::BesselJ1 => via_f64(x, out, super::special::bessel_j1),
        UnaryOp::BesselY0 => via_f64(x, out, super::special::bessel_y0),
        UnaryOp::BesselY1 => via_f64(x, out, super::special::bessel_y1),
        UnaryOp::Entr => via_f64(x, out, super::special::entr),
        UnaryOp::Trigamma => map(x, out, super::special::trigamma),
        UnaryOp::SphericalBesselJ0 => via_f64(x, out, super::special::spherical_bessel_j0),
        UnaryOp::Sin => map(x, out, |v| v.sin()),
        UnaryOp::Cos => map(x, out, |v| v.cos()),
        UnaryOp::Floor => map(x, out, |v| v.floor()),
        UnaryOp::Ceil => map(x, out, |v| v.ceil()),
        UnaryOp::Round => map(x, out, |v| v.round_even()),
        // torch's `(0 < x) - (x < 0)`: ±0 and NaN give +0 (not IEEE's
        // NaN-propagating, sign-keeping `sign`).
        UnaryOp::Sign => map(x, out, |v| {
            if v > T::ZERO {
                one
            } else if v < T::ZERO {
                -one
            } else {
                T::ZERO
            }
        }),
        UnaryOp::Log1p => map(x, out, |v| v.ln_1p()),
        UnaryOp::Expm1 => map(x, out, |v| v.exp_m1()),
        UnaryOp::Trunc => map(x, out, |v| v.trunc()),
        UnaryOp::Tan => map(x, out, |v| v.tan()),
        UnaryOp::Asin => map(x, out, |v| v.asin()),
        UnaryOp::Acos => map(x, out, |v| v.acos()),
        UnaryOp::Atan => map(x, out, |v| v.atan()),
        UnaryOp::Sinh => map(x, out, |v| v.sinh()),
        UnaryOp::Cosh => map(x, out, |v| v.cosh()),
        UnaryOp::Asinh => map(x, out, |v| v.asinh()),
        UnaryOp::Acosh => map(x, out, |v| v.acosh()),
        UnaryOp::Atanh => map(x, out, |v| v.atanh()),
        UnaryOp::Log2 => map(x, out, |v| v.log2()),
        UnaryOp::Log10 => map(x, out, |v| v.log10()),
        UnaryOp::Not => return Err(dtype_err("unary(not)", T::DTYPE)),
        UnaryOp::BitNot => return Err(dtype_err("unary(bit_not)", T::DTYPE)),
    }
    Ok(())
}

/// The f32 function computing an activation-like unary op as [`unary_cx`]
/// runs it: the table's entry where it has one, else the portable loop;
/// None for the other ops.
pub(crate) fn unary_f32_fn(table: &KernelTable, op: UnaryOp) -> Option<UnaryFn> {
    macro_rules! portable {
        ($op:ident) => {{
            fn run(x: &[f32], out: &mut [f32]) {
                let _ = unary_float::<f32>(UnaryOp::$op, x, out);
            }
            run as UnaryFn
        }};
    }
    table.unary_f32(op).or(match op {
        UnaryOp::Relu => Some(portable!(Relu)),
        UnaryOp::Gelu => Some(portable!(Gelu)),
        UnaryOp::GeluTanh => Some(portable!(GeluTanh)),
        UnaryOp::Sigmoid => Some(portable!(Sigmoid)),
        UnaryOp::Silu => Some(portable!(Silu)),
        _ => None,
    })
}

fn unary_int<T: IntElem>(op: UnaryOp, x: &[T], out: &mut [T]) -> Result<()> {
    match op {
        UnaryOp::Neg => map(x, out, |v| v.wneg()),
        UnaryOp::Abs => map(x, out, |v| v.wabs()),
        UnaryOp::Sign => map(x, out, |v| v.sign()),
        UnaryOp::Relu => map(x, out, |v| v.max(T::ZERO)),
        // Rounding an integer is the identity (torch accepts these on ints).
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => out.copy_from_slice(x),
        UnaryOp::BitNot => map(x, out, |v| v.bnot()),
        _ => return Err(dtype_err("unary", T::DTYPE)),
    }
    Ok(())
}

/// Elementwise `op(x)`, running the f32 ops the kernel table has (exp,
/// sigmoid, silu, tanh; f16/bf16 compute in f32 through them too) with the
/// [`best`](crate::best) variants. [`unary_cx`] takes the table from a context.
pub fn unary(op: UnaryOp, x: TensorRef, out: TensorMut) -> Result<()> {
    unary_with(op, x, out, crate::table::best(), Threads::single())
}

/// [`unary`] calling through `cx`'s kernel table, in fixed-size chunks
/// shared out over its threads.
pub fn unary_cx(op: UnaryOp, x: TensorRef, out: TensorMut, cx: &mut Context) -> Result<()> {
    unary_with(op, x, out, cx.table, cx.threads())
}

pub(crate) fn unary_with(
    op: UnaryOp,
    x: TensorRef,
    mut out: TensorMut,
    table: &KernelTable,
    threads: Threads,
) -> Result<()> {
    const K: &str = "unary";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if x.shape != out.shape {
        return Err(shape_err(K, format!("input shape {:?} != output shape {:?}", x.shape, out.shape)));
    }
    // Whether an op runs depends on the op and dtype only: validated on
    // empty slices first, the chunks cannot fail.
    macro_rules! run {
        ($T:ty, $f:expr) => {{
            let xs = view::<$T>(K, "x", &x)?;
            let os = view_mut::<$T>(K, "out", &mut out)?;
            ($f)(&xs[..0], &mut os[..0])?;
            threads.for_each_rows(xs, os, 1, |xc, oc| {
                let _ = ($f)(xc, oc);
            });
            Ok(())
        }};
    }
    // The f32 computation: the table's entry where it has one.
    let f32_entry = table.unary_f32(op);
    let unary_f32 = |xs: &[f32], os: &mut [f32]| match f32_entry {
        Some(f) => {
            f(xs, os);
            Ok(())
        }
        None => unary_float::<f32>(op, xs, os),
    };
    match x.dtype {
        DType::F32 => run!(f32, unary_f32),
        DType::F64 => run!(f64, |xs, os| unary_float::<f64>(op, xs, os)),
        DType::F16 | DType::BF16 => {
            // Validate the op once so the chunk callback cannot fail midway.
            unary_float::<f32>(op, &[], &mut [])?;
            if op == UnaryOp::Ndtr {
                // torch evaluates ndtr in the half type itself: see `ndtr_half`.
                return if x.dtype == DType::F16 {
                    run!(f16, |xs: &[f16], os: &mut [f16]| {
                        os.iter_mut().zip(xs).for_each(|(o, &v)| *o = ndtr_half(v));
                        Ok::<(), KernelError>(())
                    })
                } else {
                    run!(bf16, |xs: &[bf16], os: &mut [bf16]| {
                        os.iter_mut().zip(xs).for_each(|(o, &v)| *o = ndtr_half(v));
                        Ok::<(), KernelError>(())
                    })
                };
            }
            if x.dtype == DType::F16 {
                run!(f16, |xs, os| {
                    map_half::<f16>(xs, os, |s, d| {
                        let _ = unary_f32(s, d);
                    });
                    Ok::<(), KernelError>(())
                })
            } else {
                run!(bf16, |xs, os| {
                    map_half::<bf16>(xs, os, |s, d| {
                        let _ = unary_f32(s, d);
                    });
                    Ok::<(), KernelError>(())
                })
            }
        }
        DType::I8 => run!(i8, |xs, os| unary_int::<i8>(op, xs, os)),
        DType::U8 => run!(u8, |xs, os| unary_int::<u8>(op, xs, os)),
        DType::I16 => run!(i16, |xs, os| unary_int::<i16>(op, xs, os)),
        DType::I32 => run!(i32, |xs, os| unary_int::<i32>(op, xs, os)),
        DType::I64 => run!(i64, |xs, os| unary_int::<i64>(op, xs, os)),
        DType::Bool => {
            if !matches!(op, UnaryOp::Not | UnaryOp::BitNot) {
                return Err(dtype_err(K, DType::Bool));
            }
            run!(u8, |xs: &[u8], os: &mut [u8]| {
                map(xs, os, |v| (v == 0) as u8);
                Ok::<(), KernelError>(())
            })
        }
        d @ (DType::C64 | DType::C128) => Err(complex_err(d)),
    }
}

/// `out = f(a, b)` with numpy broadcasting; shapes must already be validated.
pub fn broadcast_map2<A: Copy, B: Copy, O: Copy>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out: &mut [O],
    out_shape: &[usize],
    f: impl Fn(A, B) -> O,
) {
    broadcast_map2_rows(a, a_shape, b, b_shape, out, out_shape, f, None);
}

/// A slice version of a binary op (a kernel table entry) computing exactly
/// what its element closure does.
type RowFn<A, B, O> = fn(&[A], &[B], &mut [O]);

/// [`broadcast_map2`] running `rows`, when given, over every stretch where
/// both operands are contiguous.
#[allow(clippy::too_many_arguments)]
fn broadcast_map2_rows<A: Copy, B: Copy, O: Copy>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out: &mut [O],
    out_shape: &[usize],
    f: impl Fn(A, B) -> O,
    rows: Option<RowFn<A, B, O>>,
) {
    if let Some(rows) = rows {
        if repeated_block(a, a_shape, b, b_shape, out, out_shape, rows) {
            return;
        }
    }
    if a_shape == out_shape && b_shape == out_shape {
        match rows {
            Some(rows) => rows(a, b, out),
            None => {
                for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                    *o = f(x, y);
                }
            }
        }
        return;
    }
    let r = out_shape.len();
    let (mut so, mut sa, mut sb) = ([0; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK]);
    strides_of(out_shape, &mut so[..r]);
    broadcast_strides(a_shape, out_shape, &mut sa[..r]);
    broadcast_strides(b_shape, out_shape, &mut sb[..r]);
    let c = Collapsed::new(out_shape, [&so[..r], &sa[..r], &sb[..r]]);
    c.for_each_row(|[oo, ao, bo], n, [_, ia, ib]| {
        let o = &mut out[oo..oo + n];
        match (ia, ib) {
            (1, 1) => match rows {
                Some(rows) => rows(&a[ao..ao + n], &b[bo..bo + n], o),
                None => {
                    for ((o, &x), &y) in o.iter_mut().zip(&a[ao..ao + n]).zip(&b[bo..bo + n]) {
                        *o = f(x, y);
                    }
                }
            },
            (1, 0) => {
                let y = b[bo];
                for (o, &x) in o.iter_mut().zip(&a[ao..ao + n]) {
                    *o = f(x, y);
                }
            }
            (0, 1) => {
                let x = a[ao];
                for (o, &y) in o.iter_mut().zip(&b[bo..bo + n]) {
                    *o = f(x, y);
                }
            }
            _ => {
                for (i, o) in o.iter_mut().enumerate() {
                    *o = f(a[ao + i * ia], b[bo + i * ib]);
                }
            }
        }
    });
}

/// The longest block [`repeated_block`] takes, and the buffer it repeats
/// one into (elements).
const SHORT_BLOCK: usize = 256;
const REPEATED: usize = 4 * SHORT_BLOCK;

/// Whether an operand of `shape` is a block of `len` (1..=[`SHORT_BLOCK`])
/// elements that repeats contiguously along the leading dims of the output:
/// its shape, leading 1s dropped, is a suffix of `out_shape`.
fn is_short_block(shape: &[usize], len: usize, out_shape: &[usize]) -> bool {
    let first = shape.iter().position(|&d| d != 1).unwrap_or(shape.len());
    let tail = &shape[first..];
    (1..=SHORT_BLOCK).contains(&len) && tail.len() <= out_shape.len() && out_shape.ends_with(tail)
}

/// `out = a op b` (`rows`) where one operand has the output's shape and
/// the other is a short block repeated along the leading dims — a
/// squeeze-excite scale `x · s`, s `[1, 1, 1, C]` against channels-last x:
/// the block is repeated into a buffer of about [`REPEATED`] elements once,
/// so `rows` runs over long stretches instead of once per block (which
/// cost as much as the multiplies at C = 32). Each element is still the one
/// IEEE operation on the same operands: the same bits. False (nothing
/// written) for other shapes.
#[allow(clippy::too_many_arguments)]
fn repeated_block<A: Copy, B: Copy, O: Copy>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out: &mut [O],
    out_shape: &[usize],
    rows: RowFn<A, B, O>,
) -> bool {
    fn repeat<T: Copy>(block: &[T]) -> ([T; REPEATED], usize) {
        let len = REPEATED / block.len() * block.len();
        let mut buf = [block[0]; REPEATED];
        for (v, &x) in buf[..len].iter_mut().zip(block.iter().cycle()) {
            *v = x;
        }
        (buf, len)
    }
    if out.is_empty() || a_shape == b_shape {
        return false;
    }
    if a_shape == out_shape && is_short_block(b_shape, b.len(), out_shape) {
        let (buf, len) = repeat(b);
        for (o, x) in out.chunks_mut(len).zip(a.chunks(len)) {
            rows(x, &buf[..o.len()], o);
        }
        return true;
    }
    if b_shape == out_shape && is_short_block(a_shape, a.len(), out_shape) {
        let (buf, len) = repeat(a);
        for (o, y) in out.chunks_mut(len).zip(b.chunks(len)) {
            rows(&buf[..o.len()], y, o);
        }
        return true;
    }
    false
}

/// torch's float floor_divide: floor of the exact quotient, computed from
/// fmod so that e.g. 1 // 0.1 == 9 like Python.
#[inline(always)]
fn float_floor_div<T: Real>(a: T, b: T) -> T {
    if b == T::ZERO {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != T::ZERO && ((b < T::ZERO) != (m < T::ZERO)) {
        div = div - T::ONE;
    }
    if div == T::ZERO {
        return T::ZERO * (a / b); // keeps the sign of the true quotient
    }
    let mut fl = div.floor();
    if div - fl > T::lit(0.5) {
        fl += T::ONE;
    }
    fl
}

#[inline(always)]
fn float_py_rem<T: Real>(a: T, b: T) -> T {
    let m = a % b;
    if m != T::ZERO && ((b < T::ZERO) != (m < T::ZERO)) {
        m + b
    } else {
        m
    }
}

/// NaN-propagating max/min (torch.maximum / torch.minimum).
#[inline(always)]
fn nan_max<T: Real>(a: T, b: T) -> T {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}
#[inline(always)]
fn nan_min<T: Real>(a: T, b: T) -> T {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Dispatches a float op to `$run!(closure)` with the closure typed on `$T`.
macro_rules! float_binary_closure {
    ($op:expr, $T:ty, $run:ident, $kernel:expr, $dtype:expr) => {
        match $op {
            BinaryOp::Add => $run!(|a: $T, b: $T| a + b),
            BinaryOp::Sub => $run!(|a: $T, b: $T| a - b),
            BinaryOp::Mul => $run!(|a: $T, b: $T| a * b),
            BinaryOp::Div => $run!(|a: $T, b: $T| a / b),
            BinaryOp::FloorDiv => $run!(|a: $T, b: $T| float_floor_div(a, b)),
            BinaryOp::Rem => $run!(|a: $T, b: $T| float_py_rem(a, b)),
            BinaryOp::Pow => $run!(|a: $T, b: $T| a.powf(b)),
            BinaryOp::Max => $run!(|a: $T, b: $T| nan_max(a, b)),
            BinaryOp::Min => $run!(|a: $T, b: $T| nan_min(a, b)),
            BinaryOp::Atan2 => $run!(|a: $T, b: $T| a.atan2(b)),
            BinaryOp::Fmod => $run!(|a: $T, b: $T| a % b),
            BinaryOp::Zeta => $run!(|a: $T, b: $T| <$T>::lit(super::special::zeta(a.to_f64(), b.to_f64()))),
            BinaryOp::Igamma => $run!(|a: $T, b: $T| <$T>::lit(super::special::igamma(a.to_f64(), b.to_f64()))),
            BinaryOp::Igammac => $run!(|a: $T, b: $T| <$T>::lit(super::special::igammac(a.to_f64(), b.to_f64()))),
            BinaryOp::Nextafter => $run!(|a: $T, b: $T| a.next_after(b)),
            p if p.is_polynomial() => {
                $run!(|a: $T, b: $T| super::polynomial::polynomial(p, a, b).unwrap_or(<$T>::lit(f64::NAN)))
            }
            _ => return Err(dtype_err($kernel, $dtype)),
        }
    };
}

fn is_comparison(op: BinaryOp) -> bool {
    matches!(op, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
}

fn compare<T: Scalar>(op: BinaryOp, a: &[T], ash: &[usize], b: &[T], bsh: &[usize], out: &mut [u8], osh: &[usize]) {
    macro_rules! go {
        ($f:expr) => {
            broadcast_map2(a, ash, b, bsh, out, osh, $f)
        };
    }
    match op {
        BinaryOp::Eq => go!(|x: T, y: T| (x == y) as u8),
        BinaryOp::Ne => go!(|x: T, y: T| (x != y) as u8),
        BinaryOp::Lt => go!(|x: T, y: T| (x < y) as u8),
        BinaryOp::Le => go!(|x: T, y: T| (x <= y) as u8),
        BinaryOp::Gt => go!(|x: T, y: T| (x > y) as u8),
        _ => go!(|x: T, y: T| (x >= y) as u8),
    }
}

fn binary_int<T: IntElem>(
    op: BinaryOp,
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &mut [T],
    osh: &[usize],
) -> Result<()> {
    const K: &str = "binary";
    let out_empty = out.is_empty();
    macro_rules! go {
        ($f:expr) => {
            broadcast_map2(a, ash, b, bsh, out, osh, $f)
        };
    }
    match op {
        BinaryOp::Add => go!(|x: T, y: T| x.wadd(y)),
        BinaryOp::Sub => go!(|x: T, y: T| x.wsub(y)),
        BinaryOp::Mul => go!(|x: T, y: T| x.wmul(y)),
        BinaryOp::FloorDiv | BinaryOp::Rem | BinaryOp::Fmod => {
            // Checked up front so the inner loop stays branch-free of errors.
            if !out_empty && b.contains(&T::ZERO) {
                return Err(shape_err(K, "integer division by zero"));
            }
            match op {
                BinaryOp::FloorDiv => go!(|x: T, y: T| x.floor_div(y)),
                BinaryOp::Rem => go!(|x: T, y: T| x.py_rem(y)),
                _ => go!(|x: T, y: T| x.c_rem(y)),
            }
        }
        BinaryOp::Pow => go!(|x: T, y: T| x.wpow(y)),
        BinaryOp::Max => go!(|x: T, y: T| x.max(y)),
        BinaryOp::Min => go!(|x: T, y: T| x.min(y)),
        BinaryOp::And => go!(|x: T, y: T| x.band(y)),
        BinaryOp::Or => go!(|x: T, y: T| x.bor(y)),
        BinaryOp::Xor => go!(|x: T, y: T| x.bxor(y)),
        // True division of ints needs a float result: the compiler inserts casts.
        _ => return Err(dtype_err("binary(div)", T::DTYPE)),
    }
    Ok(())
}

/// Elementwise `a op b` with numpy broadcasting, running f32 add, sub, mul
/// and div over contiguous stretches with the [`best`](crate::best) kernel
/// table's variants. [`binary_cx`] takes the table from a context.
pub fn binary(op: BinaryOp, a: TensorRef, b: TensorRef, out: TensorMut) -> Result<()> {
    binary_with(op, a, b, out, crate::table::best(), Threads::single())
}

/// [`binary`] calling through `cx`'s kernel table.
pub fn binary_cx(op: BinaryOp, a: TensorRef, b: TensorRef, out: TensorMut, cx: &mut Context) -> Result<()> {
    binary_with(op, a, b, out, cx.table, cx.threads())
}

pub(crate) fn binary_with(
    op: BinaryOp,
    a: TensorRef,
    b: TensorRef,
    mut out: TensorMut,
    table: &KernelTable,
    threads: Threads,
) -> Result<()> {
    const K: &str = "binary";
    expect_dtype(K, "b", b.dtype, a.dtype)?;
    let want_out = if is_comparison(op) { DType::Bool } else { a.dtype };
    expect_dtype(K, "out", out.dtype, want_out)?;
    check_broadcast(K, &[a.shape, b.shape], out.shape)?;
    let (ash, bsh) = (a.shape, b.shape);
    let out_shape = out.shape;
    if is_comparison(op) {
        let os = view_mut::<u8>(K, "out", &mut out)?;
        with_scalar!(a.dtype, T, {
            let av = view::<T>(K, "a", &a)?;
            let bv = view::<T>(K, "b", &b)?;
            compare::<T>(op, av, ash, bv, bsh, os, out_shape);
        });
        return Ok(());
    }
    match a.dtype {
        DType::F32 => binary_float::<f32>(op, a, b, out, table.binary_f32(op), threads),
        DType::F64 => binary_float::<f64>(op, a, b, out, None, threads),
        DType::F16 => binary_half::<f16>(op, a, b, out),
        DType::BF16 => binary_half::<bf16>(op, a, b, out),
        DType::I8 => binary_int_t::<i8>(op, a, b, out),
        DType::U8 => binary_int_t::<u8>(op, a, b, out),
        DType::I16 => binary_int_t::<i16>(op, a, b, out),
        DType::I32 => binary_int_t::<i32>(op, a, b, out),
        DType::I64 => binary_int_t::<i64>(op, a, b, out),
        DType::Bool => {
            let av = view::<u8>(K, "a", &a)?;
            let bv = view::<u8>(K, "b", &b)?;
            let os = view_mut::<u8>(K, "out", &mut out)?;
            macro_rules! go {
                ($f:expr) => {
                    broadcast_map2(av, ash, bv, bsh, os, out_shape, $f)
                };
            }
            match op {
                BinaryOp::And | BinaryOp::Min | BinaryOp::Mul => go!(|x: u8, y: u8| (x != 0 && y != 0) as u8),
                BinaryOp::Or | BinaryOp::Max | BinaryOp::Add => go!(|x: u8, y: u8| (x != 0 || y != 0) as u8),
                BinaryOp::Xor => go!(|x: u8, y: u8| ((x != 0) != (y != 0)) as u8),
                _ => return Err(dtype_err(K, DType::Bool)),
            }
            Ok(())
        }
        d @ (DType::C64 | DType::C128) => Err(complex_err(d)),
    }
}

fn binary_int_t<T: IntElem>(op: BinaryOp, a: TensorRef, b: TensorRef, mut out: TensorMut) -> Result<()> {
    const K: &str = "binary";
    let out_shape = out.shape;
    let av = view::<T>(K, "a", &a)?;
    let bv = view::<T>(K, "b", &b)?;
    let os = view_mut::<T>(K, "out", &mut out)?;
    binary_int(op, av, a.shape, bv, b.shape, os, out_shape)
}

/// `rows`: the table's slice version of `op`, for f32.
fn binary_float<T: Real>(
    op: BinaryOp,
    a: TensorRef,
    b: TensorRef,
    mut out: TensorMut,
    rows: Option<RowFn<T, T, T>>,
    threads: Threads,
) -> Result<()> {
    const K: &str = "binary";
    let out_shape = out.shape;
    let av = view::<T>(K, "a", &a)?;
    let bv = view::<T>(K, "b", &b)?;
    let os = view_mut::<T>(K, "out", &mut out)?;
    macro_rules! run {
        ($f:expr) => {{
            let f = $f;
            split_outer(threads, av, a.shape, bv, b.shape, os, out_shape, |av, ash, bv, bsh, os, osh| {
                broadcast_map2_rows(av, ash, bv, bsh, os, osh, f, rows)
            })
        }};
    }
    float_binary_closure!(op, T, run, K, T::DTYPE);
    Ok(())
}

/// Runs a broadcasting elementwise `f` over pieces of the output cut along
/// its first axis longer than 1, each with the matching pieces of the
/// operands (an operand broadcast along that axis is passed whole). A piece
/// holds about [`ELEMENT_CHUNK`] elements; the cut depends on the shapes
/// only. Used for ops whose result per element does not depend on where a
/// piece starts (exact f32 arithmetic and per-element closures).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn split_outer<A: Sync, B: Sync, O: Send>(
    threads: Threads,
    a: &[A],
    ash: &[usize],
    b: &[B],
    bsh: &[usize],
    out: &mut [O],
    osh: &[usize],
    f: impl Fn(&[A], &[usize], &[B], &[usize], &mut [O], &[usize]) + Send + Sync,
) {
    let r = osh.len();
    let axis = osh.iter().position(|&d| d > 1);
    let (Some(axis), true) = (axis, threads.count() > 1 && out.len() >= 2 * ELEMENT_CHUNK) else {
        return f(a, ash, b, bsh, out, osh);
    };
    let rows = osh[axis];
    let inner = out.len() / rows;
    let per = (ELEMENT_CHUNK / inner.max(1)).max(1);
    threads.for_each_chunk(out, per * inner, |i, oc| {
        let (r0, n) = (i * per, oc.len() / inner.max(1));
        let mut piece = [0usize; MAX_RANK];
        piece[..r].copy_from_slice(osh);
        piece[axis] = n;
        let (ap, ashp) = operand_piece(a, ash, r, axis, rows, r0, n);
        let (bp, bshp) = operand_piece(b, bsh, r, axis, rows, r0, n);
        f(ap, &ashp[..ash.len()], bp, &bshp[..bsh.len()], oc, &piece[..r]);
    });
}

/// The part of a broadcast operand (right-aligned against an output of rank
/// `r`) for output rows `r0..r0+n` along `axis` (of `rows`), with its shape.
fn operand_piece<'x, T>(
    x: &'x [T],
    xsh: &[usize],
    r: usize,
    axis: usize,
    rows: usize,
    r0: usize,
    n: usize,
) -> (&'x [T], [usize; MAX_RANK]) {
    let mut shape = [0usize; MAX_RANK];
    shape[..xsh.len()].copy_from_slice(xsh);
    // Axes before `axis` have length 1 in the output, so in the operand too.
    match (axis + xsh.len()).checked_sub(r) {
        Some(xa) if xsh[xa] == rows => {
            let inner = x.len() / rows;
            shape[xa] = n;
            (&x[r0 * inner..(r0 + n) * inner], shape)
        }
        _ => (x, shape),
    }
}

/// Half-precision binary ops compute in f32 and round once on store.
fn binary_half<H: Scalar>(op: BinaryOp, a: TensorRef, b: TensorRef, mut out: TensorMut) -> Result<()> {
    const K: &str = "binary";
    let out_shape = out.shape;
    let av = view::<H>(K, "a", &a)?;
    let bv = view::<H>(K, "b", &b)?;
    let os = view_mut::<H>(K, "out", &mut out)?;
    if op == BinaryOp::Nextafter {
        // One step is one ulp of the storage type, which an f32 detour would lose.
        broadcast_map2(av, a.shape, bv, b.shape, os, out_shape, half_next_after::<H>);
        return Ok(());
    }
    macro_rules! run {
        ($f:expr) => {{
            let f = $f;
            broadcast_map2(av, a.shape, bv, b.shape, os, out_shape, |x: H, y: H| {
                H::from_f64(f(x.to_f64() as f32, y.to_f64() as f32) as f64)
            })
        }};
    }
    float_binary_closure!(op, f32, run, K, H::DTYPE);
    Ok(())
}

/// C's `nextafter` on a 16-bit float (f16 or bf16): both are sign-magnitude
/// with the sign in bit 15, so a step is ±1 on the bits as for f32.
fn half_next_after<H: Scalar>(a: H, b: H) -> H {
    let (x, y) = (a.to_f64(), b.to_f64());
    if x.is_nan() || y.is_nan() {
        return H::from_f64(x + y);
    }
    if x == y {
        return b;
    }
    let bits = u16::from_ne_bytes(bytemuck::bytes_of(&a).try_into().expect("a 16-bit float"));
    let next = if x == 0.0 {
        // The smallest subnormal, signed like the direction.
        if y < 0.0 {
            0x8001
        } else {
            1
        }
    } else if (y > x) == (x > 0.0) {
        bits + 1
    } else {
        bits - 1
    };
    bytemuck::pod_read_unaligned(&next.to_ne_bytes())
}

/// `out = cond ? a : b`, broadcasting all three; moves elements by size only.
pub fn where_(cond: TensorRef, a: TensorRef, b: TensorRef, mut out: TensorMut) -> Result<()> {
    const K: &str = "where";
    expect_dtype(K, "cond", cond.dtype, DType::Bool)?;
    expect_dtype(K, "b", b.dtype, a.dtype)?;
    expect_dtype(K, "out", out.dtype, a.dtype)?;
    check_broadcast(K, &[cond.shape, a.shape, b.shape], out.shape)?;
    let osh = out.shape;
    let r = osh.len();
    let cv = view::<u8>(K, "cond", &cond)?;
    let (mut so, mut sc, mut sa, mut sb) = ([0; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK]);
    strides_of(osh, &mut so[..r]);
    broadcast_strides(cond.shape, osh, &mut sc[..r]);
    broadcast_strides(a.shape, osh, &mut sa[..r]);
    broadcast_strides(b.shape, osh, &mut sb[..r]);
    let c = Collapsed::new(osh, [&so[..r], &sc[..r], &sa[..r], &sb[..r]]);
    with_elem_size!(a.dtype, T, {
        let av = view::<T>(K, "a", &a)?;
        let bv = view::<T>(K, "b", &b)?;
        let ov = view_mut::<T>(K, "out", &mut out)?;
        c.for_each_row(|[oo, co, ao, bo], n, [_, ic, ia, ib]| {
            for (i, o) in ov[oo..oo + n].iter_mut().enumerate() {
                *o = if cv[co + i * ic] != 0 { av[ao + i * ia] } else { bv[bo + i * ib] };
            }
        });
    });
    Ok(())
}

#[inline(always)]
fn convert<S: Scalar, D: Scalar>(v: S) -> D {
    if S::IS_FLOAT {
        D::from_f64(v.to_f64())
    } else {
        D::from_i64(v.to_i64())
    }
}

/// Converts between any two dtypes: float→int truncates toward zero,
/// anything→Bool is `!= 0`, int→int wraps.
pub fn cast(x: TensorRef, mut out: TensorMut) -> Result<()> {
    const K: &str = "cast";
    if x.shape != out.shape {
        return Err(shape_err(K, format!("input shape {:?} != output shape {:?}", x.shape, out.shape)));
    }
    if x.dtype == out.dtype {
        return super::layout::copy(x, out);
    }
    with_scalar!(x.dtype, S, {
        let xs = view::<S>(K, "x", &x)?;
        with_scalar!(out.dtype, D, {
            let os = view_mut::<D>(K, "out", &mut out)?;
            map(xs, os, convert::<S, D>);
        })
    });
    Ok(())
}

/// `min(max(x, lo), hi)`, applied in that order so `lo > hi` yields `hi` as
/// in torch; NaN inputs stay NaN.
pub fn clamp(x: TensorRef, min: Option<f64>, max: Option<f64>, out: TensorMut) -> Result<()> {
    clamp_with(x, min, max, out, Threads::single())
}

/// [`clamp`] on `cx`'s threads (fixed-size chunks: the same result at any
/// thread count).
pub fn clamp_cx(x: TensorRef, min: Option<f64>, max: Option<f64>, out: TensorMut, cx: &mut Context) -> Result<()> {
    clamp_with(x, min, max, out, cx.threads())
}

fn clamp_with(x: TensorRef, min: Option<f64>, max: Option<f64>, mut out: TensorMut, threads: Threads) -> Result<()> {
    const K: &str = "clamp";
    expect_dtype(K, "out", out.dtype, x.dtype)?;
    if x.shape != out.shape {
        return Err(shape_err(K, format!("input shape {:?} != output shape {:?}", x.shape, out.shape)));
    }
    if x.dtype == DType::Bool {
        return Err(dtype_err(K, DType::Bool));
    }
    if x.dtype == DType::F32 {
        let xs = view::<f32>(K, "x", &x)?;
        let os = view_mut::<f32>(K, "out", &mut out)?;
        let (lo, hi) = (clamp_bound(min, f32::NEG_INFINITY), clamp_bound(max, f32::INFINITY));
        threads.for_each_rows(xs, os, 1, |xc, oc| clamp_f32(xc, oc, lo, hi));
        return Ok(());
    }
    with_scalar!(x.dtype, T, {
        let xs = view::<T>(K, "x", &x)?;
        let os = view_mut::<T>(K, "out", &mut out)?;
        // For ints the bounds round inward (ceil / floor) so the clamp never
        // admits a value outside the real-valued interval.
        let lo = min.map(|v| T::from_f64(if T::IS_FLOAT { v } else { v.ceil() }));
        let hi = max.map(|v| T::from_f64(if T::IS_FLOAT { v } else { v.floor() }));
        map(xs, os, |v: T| {
            let mut v = v;
            if let Some(lo) = lo {
                if v < lo {
                    v = lo;
                }
            }
            if let Some(hi) = hi {
                if v > hi {
                    v = hi;
                }
            }
            v
        });
    });
    Ok(())
}

/// A clamp bound as the f32 clamp uses it: rounded to f32, an absent one
/// infinite (`v < -inf` and `v > inf` never hold, so it never acts).
pub(crate) fn clamp_bound(bound: Option<f64>, absent: f32) -> f32 {
    bound.map_or(absent, |v| v as f32)
}

/// `out[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i])` in that order (NaN
/// passes through, as in torch). Written as selects so it vectorises (the
/// compares and blends of the baseline ISA), with no branch per element.
pub(crate) fn clamp_f32(x: &[f32], out: &mut [f32], lo: f32, hi: f32) {
    for (o, &v) in out.iter_mut().zip(x) {
        let v = if v < lo { lo } else { v };
        *o = if v > hi { hi } else { v };
    }
}

/// [`clamp_f32`] in place (the fused epilogues' activation).
pub(crate) fn clamp_f32_in_place(v: &mut [f32], lo: f32, hi: f32) {
    for e in v.iter_mut() {
        let x = if *e < lo { lo } else { *e };
        *e = if x > hi { hi } else { x };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16/bf16 value stepped towards ±inf lands on its neighbour in
    /// the sorted list of all values (zeros compared by value), and the
    /// special cases follow C: equal operands give the second, NaN gives NaN,
    /// zero steps to the smallest subnormal signed like the direction.
    fn check_half_next_after<H: Scalar>(from_bits: impl Fn(u16) -> H) {
        let mut sorted: Vec<f64> = (0..=u16::MAX).map(|b| from_bits(b).to_f64()).filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        let (up, down) = (H::from_f64(f64::INFINITY), H::from_f64(f64::NEG_INFINITY));
        for (i, &v) in sorted.iter().enumerate() {
            let x = H::from_f64(v);
            if i + 1 < sorted.len() {
                assert_eq!(half_next_after(x, up).to_f64(), sorted[i + 1], "{v} up");
            }
            if i > 0 {
                assert_eq!(half_next_after(x, down).to_f64(), sorted[i - 1], "{v} down");
            }
            assert_eq!(half_next_after(x, x).to_f64(), v);
        }
        let tiny = from_bits(1).to_f64();
        assert_eq!(half_next_after(H::from_f64(0.0), up).to_f64(), tiny);
        assert_eq!(half_next_after(H::from_f64(0.0), down).to_f64(), -tiny);
        let neg_zero = half_next_after(H::from_f64(0.0), H::from_f64(-0.0)).to_f64();
        assert!(neg_zero == 0.0 && neg_zero.is_sign_negative());
        assert!(half_next_after(H::from_f64(f64::NAN), up).to_f64().is_nan());
        assert!(half_next_after(up, H::from_f64(f64::NAN)).to_f64().is_nan());
    }

    #[test]
    fn half_next_after_steps_one_ulp() {
        check_half_next_after(f16::from_bits);
        check_half_next_after(bf16::from_bits);
    }
}
