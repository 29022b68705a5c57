//! Elementwise math and reductions: `UnaryOp`/`BinaryOp` lowerings (with
//! textbook formulations where StableHLO has no op, since chlo is not
//! available), the reduction body and identities, and softmax. Reductions
//! and softmax accumulate in f32 for 16-bit floats (`Emitter::acc`).

use super::text::{arr, parse_type};
use super::{err, mlir_err, EmitError, Emitter, T};
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::RegionLike;
use melior::ir::{Block, Region, Value};

impl<'c, 'a> Emitter<'c, 'a> {
    /// A reduction body: `(a, b) -> a op b` on scalars of `dt`.
    pub(super) fn reducer(&self, op: &str, dt: DType) -> Result<Region<'c>, EmitError> {
        let st = parse_type(self.ctx, &[], dt)?;
        let region = Region::new();
        let b = region.append_block(Block::new(&[(st, self.loc), (st, self.loc)]));
        let x: Value = b.argument(0).map_err(mlir_err)?.into();
        let y: Value = b.argument(1).map_err(mlir_err)?.into();
        let r = b.append_operation(
            OperationBuilder::new(&format!("stablehlo.{op}"), self.loc)
                .add_operands(&[x, y])
                .add_results(&[st])
                .build()
                .map_err(mlir_err)?,
        );
        let rv: Value = r.result(0).map_err(mlir_err)?.into();
        b.append_operation(
            OperationBuilder::new("stablehlo.return", self.loc).add_operands(&[rv]).build().map_err(mlir_err)?,
        );
        Ok(region)
    }

    /// A scatter's combiner that keeps the update: `(old, new) -> new`.
    pub(super) fn replacer(&self, dt: DType) -> Result<Region<'c>, EmitError> {
        let st = parse_type(self.ctx, &[], dt)?;
        let region = Region::new();
        let b = region.append_block(Block::new(&[(st, self.loc), (st, self.loc)]));
        let new: Value = b.argument(1).map_err(mlir_err)?.into();
        b.append_operation(
            OperationBuilder::new("stablehlo.return", self.loc).add_operands(&[new]).build().map_err(mlir_err)?,
        );
        Ok(region)
    }

    /// Identity element and body op of a reduction over `dt`.
    fn reduce_parts(kind: ReduceKind, dt: DType) -> (f64, &'static str) {
        let (lo, hi) = match dt {
            DType::I8 => (i8::MIN as f64, i8::MAX as f64),
            DType::U8 => (0.0, 255.0),
            DType::I16 => (i16::MIN as f64, i16::MAX as f64),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            DType::I64 => (i64::MIN as f64, i64::MAX as f64),
            _ => (f64::NEG_INFINITY, f64::INFINITY),
        };
        match kind {
            // On bool, max is `any` and min is `all`.
            ReduceKind::Max if dt == DType::Bool => (0.0, "or"),
            ReduceKind::Min if dt == DType::Bool => (1.0, "and"),
            ReduceKind::Sum | ReduceKind::Mean => (0.0, "add"),
            ReduceKind::Prod => (1.0, "multiply"),
            ReduceKind::Max => (lo, "maximum"),
            ReduceKind::Min => (hi, "minimum"),
        }
    }

    /// Reduces `axes` away (no mean division).
    pub(super) fn reduce(&self, x: &T<'c, 'a>, axes: &[usize], kind: ReduceKind) -> Result<T<'c, 'a>, EmitError> {
        let (init, body) = Self::reduce_parts(kind, x.dt);
        let init_t = if x.dt == DType::I64 && init.abs() > 9.0e18 {
            // f64 cannot hold i64::MIN/MAX exactly; spell them directly.
            let text = format!("dense<{}> : tensor<i64>", if init < 0.0 { i64::MIN } else { i64::MAX });
            self.op("stablehlo.constant", &[], &[], DType::I64, &[("value", text)])?
        } else {
            self.scalar(init, x.dt)?
        };
        let shape: Vec<i64> = x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        let dims: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let region = self.reducer(body, x.dt)?;
        self.op_with_regions(
            "stablehlo.reduce",
            &[x, &init_t],
            &shape,
            x.dt,
            &[("dimensions", arr(&dims))],
            vec![region],
        )
    }

    /// Broadcasts a reduced tensor back over the `axes` it lost.
    pub(super) fn unreduce(&self, r: &T<'c, 'a>, shape: &[i64], axes: &[usize]) -> Result<T<'c, 'a>, EmitError> {
        let dims: Vec<i64> = (0..shape.len()).filter(|i| !axes.contains(i)).map(|i| i as i64).collect();
        self.bcast_dims(r, shape, &dims)
    }

    pub(super) fn softmax(&self, x: &T<'c, 'a>, axis: usize, log: bool) -> Result<T<'c, 'a>, EmitError> {
        let out_dt = x.dt;
        let x = self.convert(x, self.acc(x.dt))?;
        let m = self.reduce(&x, &[axis], ReduceKind::Max)?;
        let d = self.binary("subtract", &x, &self.unreduce(&m, &x.shape, &[axis])?)?;
        let ex = self.unary("exponential", &d)?;
        let s = self.unreduce(&self.reduce(&ex, &[axis], ReduceKind::Sum)?, &x.shape, &[axis])?;
        let y =
            if log { self.binary("subtract", &d, &self.unary("log", &s)?)? } else { self.binary("divide", &ex, &s)? };
        self.convert(&y, out_dt)
    }

    /// erf as the CPU kernels compute it (`kiln_ir::math`'s coefficients):
    /// `x + x·P(x²)` up to `ERF_SPLIT`, `±(1 − e^{q(|x|)})` beyond — within
    /// an ulp or two of the exact f32 value everywhere, tiny arguments
    /// included (StableHLO has no erf, and chlo.erf is not available to this
    /// emitter). f64 values get the same f32-accurate polynomials.
    pub(super) fn erf(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        use kiln_ir::math::{ERFC_EXPONENT_POLY, ERF_SMALL_POLY, ERF_SPLIT};
        let c = |v: f32| self.scalar(f64::from(v), x.dt);
        let mul = |a: &T<'c, 'a>, b: &T<'c, 'a>| self.binary("multiply", a, b);
        let add = |a: &T<'c, 'a>, b: &T<'c, 'a>| self.binary("add", a, b);
        // Small: x + x·P(x²).
        let s = mul(x, x)?;
        let mut p = c(ERF_SMALL_POLY[0])?;
        for &k in &ERF_SMALL_POLY[1..] {
            p = add(&mul(&p, &s)?, &c(k)?)?;
        }
        let small = add(&mul(&p, x)?, x)?;
        // Beyond: erfc(t) = e^{q(t)}, q from two pairs then Horner's rule.
        let t = self.unary("abs", x)?;
        let t2 = mul(&t, &t)?;
        let [c0, c1, c2, c3, rest @ ..] = ERFC_EXPONENT_POLY;
        let r = add(&mul(&c(c0)?, &t)?, &c(c1)?)?;
        let u = add(&mul(&c(c2)?, &t)?, &c(c3)?)?;
        let mut r = add(&mul(&r, &t2)?, &u)?;
        for k in rest {
            r = add(&mul(&r, &t)?, &c(k)?)?;
        }
        let q = self.binary("subtract", &mul(&r, &t)?, &t)?;
        let large = self.binary("subtract", &c(1.0)?, &self.unary("exponential", &q)?)?;
        let large = self.copy_sign(&large, x)?;
        self.select(&self.compare("GT", &t, &c(ERF_SPLIT)?)?, &large, &small)
    }

    pub(super) fn lower_unary(&self, u: UnaryOp, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let dt = x.dt;
        let c = |v: f64| self.scalar(v, dt);
        if dt.is_int() && matches!(u, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc) {
            // Integers are already whole.
            return Ok(x.clone());
        }
        Ok(match u {
            UnaryOp::Neg => self.unary("negate", x)?,
            UnaryOp::Abs => self.unary("abs", x)?,
            UnaryOp::Exp => self.unary("exponential", x)?,
            UnaryOp::Log => self.unary("log", x)?,
            UnaryOp::Sqrt => self.unary("sqrt", x)?,
            UnaryOp::Rsqrt => self.unary("rsqrt", x)?,
            UnaryOp::Reciprocal => self.binary("divide", &c(1.0)?, x)?,
            UnaryOp::Relu => self.binary("maximum", x, &c(0.0)?)?,
            UnaryOp::Sigmoid => self.unary("logistic", x)?,
            UnaryOp::Tanh => self.unary("tanh", x)?,
            UnaryOp::Silu => self.binary("multiply", x, &self.unary("logistic", x)?)?,
            UnaryOp::Erf => self.erf(x)?,
            UnaryOp::Gelu => {
                let e = self.erf(&self.binary("multiply", x, &c(std::f64::consts::FRAC_1_SQRT_2)?)?)?;
                let half_x = self.binary("multiply", x, &c(0.5)?)?;
                self.binary("multiply", &half_x, &self.binary("add", &c(1.0)?, &e)?)?
            }
            UnaryOp::GeluTanh => {
                let x3 = self.binary("multiply", &self.binary("multiply", x, x)?, x)?;
                let inner = self.binary("add", x, &self.binary("multiply", &c(0.044_715)?, &x3)?)?;
                let k = (2.0 / std::f64::consts::PI).sqrt();
                let th = self.unary("tanh", &self.binary("multiply", &c(k)?, &inner)?)?;
                let half_x = self.binary("multiply", x, &c(0.5)?)?;
                self.binary("multiply", &half_x, &self.binary("add", &c(1.0)?, &th)?)?
            }
            UnaryOp::Sin => self.unary("sine", x)?,
            UnaryOp::Cos => self.unary("cosine", x)?,
            UnaryOp::Floor => self.unary("floor", x)?,
            UnaryOp::Ceil => self.unary("ceil", x)?,
            // torch.round rounds half to even.
            UnaryOp::Round => self.unary("round_nearest_even", x)?,
            // torch's `(0 < x) - (x < 0)`: StableHLO's sign keeps NaN and −0;
            // NaN lanes become 0 and adding +0 turns −0 into +0.
            UnaryOp::Sign if dt.is_float() => {
                let s = self.binary("add", &self.unary("sign", x)?, &c(0.0)?)?;
                self.select(&self.compare("NE", x, x)?, &c(0.0)?, &s)?
            }
            UnaryOp::Sign => self.unary("sign", x)?,
            UnaryOp::Not | UnaryOp::BitNot => self.unary("not", x)?,
            UnaryOp::Log1p => self.unary("log_plus_one", x)?,
            UnaryOp::Expm1 => self.unary("exponential_minus_one", x)?,
            UnaryOp::Trunc => {
                self.binary("multiply", &self.unary("sign", x)?, &self.unary("floor", &self.unary("abs", x)?)?)?
            }
            UnaryOp::Tan => self.binary("divide", &self.unary("sine", x)?, &self.unary("cosine", x)?)?,
            UnaryOp::Log2 => self.binary("multiply", &self.unary("log", x)?, &c(std::f64::consts::LOG2_E)?)?,
            UnaryOp::Log10 => self.binary("multiply", &self.unary("log", x)?, &c(std::f64::consts::LOG10_E)?)?,
            // The inverse trigonometric and hyperbolic functions are chlo ops
            // upstream; these formulations keep f32's precision where the
            // textbook ones lose it: `(1 − x)(1 + x)` for 1 − x² (exact
            // factors next to ±1), expm1/log1p next to 0, and the halved
            // exponent or `ln x + ln 2` where e^x or x² would overflow.
            UnaryOp::Atan => self.binary("atan2", x, &self.splat(1.0, &x.shape, dt)?)?,
            UnaryOp::Asin => self.binary("atan2", x, &self.one_minus_square_root(x)?)?,
            UnaryOp::Acos => self.binary("atan2", &self.one_minus_square_root(x)?, x)?,
            UnaryOp::Sinh | UnaryOp::Cosh => self.lower_sinh_cosh(u == UnaryOp::Sinh, x)?,
            UnaryOp::Asinh => {
                // log1p(a + a²/(1 + √(1 + a²))) (a = |x|), ln a + ln 2 past 2¹²
                // (where √(a² + 1) = a to f32 precision), signed by x.
                let ax = self.unary("abs", x)?;
                let a2 = self.binary("multiply", &ax, &ax)?;
                let root = self.unary("sqrt", &self.binary("add", &a2, &c(1.0)?)?)?;
                let frac = self.binary("divide", &a2, &self.binary("add", &root, &c(1.0)?)?)?;
                let near = self.unary("log_plus_one", &self.binary("add", &ax, &frac)?)?;
                let r = self.select(&self.compare("GT", &ax, &c(4096.0)?)?, &self.log_twice(&ax)?, &near)?;
                self.copy_sign(&r, x)?
            }
            UnaryOp::Acosh => {
                // log1p((x − 1) + √((x − 1)(x + 1))), ln x + ln 2 past 2¹²;
                // NaN below 1 through the root.
                let xm1 = self.binary("subtract", x, &c(1.0)?)?;
                let root = self.unary("sqrt", &self.binary("multiply", &xm1, &self.binary("add", x, &c(1.0)?)?)?)?;
                let near = self.unary("log_plus_one", &self.binary("add", &xm1, &root)?)?;
                self.select(&self.compare("GT", x, &c(4096.0)?)?, &self.log_twice(x)?, &near)?
            }
            UnaryOp::Atanh => {
                // log1p(2a/(1 − a))/2 (a = |x|; 1 − a exact next to 1), signed.
                let ax = self.unary("abs", x)?;
                let q =
                    self.binary("divide", &self.binary("add", &ax, &ax)?, &self.binary("subtract", &c(1.0)?, &ax)?)?;
                let r = self.binary("multiply", &self.unary("log_plus_one", &q)?, &c(0.5)?)?;
                self.copy_sign(&r, x)?
            }
            #[allow(unreachable_patterns)]
            u => return Err(err(format!("no StableHLO lowering for {}", u.name()))),
        })
    }

    /// √((1 − x)(1 + x)), the cosine of asin x (NaN outside [−1, 1]).
    fn one_minus_square_root(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let one = self.scalar(1.0, x.dt)?;
        let p = self.binary("multiply", &self.binary("subtract", &one, x)?, &self.binary("add", &one, x)?)?;
        self.unary("sqrt", &p)
    }

    /// ln x + ln 2: ln(2x) without forming 2x (asinh/acosh of large x).
    fn log_twice(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        self.binary("add", &self.unary("log", x)?, &self.scalar(std::f64::consts::LN_2, x.dt)?)
    }

    /// |r| signed like x: StableHLO's IEEE sign (±1, ±0, NaN) times |r|, so
    /// an odd function of ±0 is ±0 and of NaN is NaN.
    fn copy_sign(&self, r: &T<'c, 'a>, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        self.binary("multiply", &self.unary("abs", r)?, &self.unary("sign", x)?)
    }

    /// sinh or cosh of x from `t = expm1(|x|)`: sinh = (t + t/(t + 1))/2
    /// (no cancellation next to 0), cosh = (t + 1)/2 + 1/(2(t + 1)); past 88,
    /// where e^|x| overflows but the result need not, `(h/2)·h` with
    /// h = e^{|x|/2}.
    fn lower_sinh_cosh(&self, sinh: bool, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let c = |v: f64| self.scalar(v, x.dt);
        let ax = self.unary("abs", x)?;
        let t = self.unary("exponential_minus_one", &ax)?;
        let e = self.binary("add", &t, &c(1.0)?)?;
        let near = if sinh {
            self.binary("multiply", &self.binary("add", &t, &self.binary("divide", &t, &e)?)?, &c(0.5)?)?
        } else {
            self.binary("add", &self.binary("multiply", &e, &c(0.5)?)?, &self.binary("divide", &c(0.5)?, &e)?)?
        };
        let h = self.unary("exponential", &self.binary("multiply", &ax, &c(0.5)?)?)?;
        let far = self.binary("multiply", &self.binary("multiply", &h, &c(0.5)?)?, &h)?;
        let r = self.select(&self.compare("GT", &ax, &c(88.0)?)?, &far, &near)?;
        if sinh {
            self.copy_sign(&r, x)
        } else {
            Ok(r)
        }
    }

    pub(super) fn lower_binary(&self, b: BinaryOp, x: &T<'c, 'a>, y: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        Ok(match b {
            BinaryOp::Add => self.binary("add", x, y)?,
            BinaryOp::Sub => self.binary("subtract", x, y)?,
            BinaryOp::Mul => self.binary("multiply", x, y)?,
            BinaryOp::Div => self.binary("divide", x, y)?,
            BinaryOp::Pow => self.binary("power", x, y)?,
            BinaryOp::Max => self.binary("maximum", x, y)?,
            BinaryOp::Min => self.binary("minimum", x, y)?,
            BinaryOp::FloorDiv | BinaryOp::Rem if x.dt.is_int() => {
                // Python semantics from C's: where the remainder is non-zero and
                // its sign differs from the divisor's, q - 1 and r + y.
                let (q, r) = (self.binary("divide", x, y)?, self.binary("remainder", x, y)?);
                let zero = self.scalar(0.0, x.dt)?;
                let nonzero = self.compare("NE", &r, &zero)?;
                let signs_differ =
                    self.compare("NE", &self.compare("LT", &r, &zero)?, &self.compare("LT", y, &zero)?)?;
                let fix = self.binary("and", &nonzero, &signs_differ)?;
                if b == BinaryOp::FloorDiv {
                    self.select(&fix, &self.binary("subtract", &q, &self.scalar(1.0, x.dt)?)?, &q)?
                } else {
                    self.select(&fix, &self.binary("add", &r, y)?, &r)?
                }
            }
            BinaryOp::FloorDiv => self.unary("floor", &self.binary("divide", x, y)?)?,
            BinaryOp::Rem => {
                // Python remainder (sign of the divisor): x - y * floor(x / y).
                let q = self.unary("floor", &self.binary("divide", x, y)?)?;
                self.binary("subtract", x, &self.binary("multiply", y, &q)?)?
            }
            BinaryOp::And => self.binary("and", x, y)?,
            BinaryOp::Or => self.binary("or", x, y)?,
            BinaryOp::Xor => self.binary("xor", x, y)?,
            BinaryOp::Eq => self.compare("EQ", x, y)?,
            BinaryOp::Ne => self.compare("NE", x, y)?,
            BinaryOp::Lt => self.compare("LT", x, y)?,
            BinaryOp::Le => self.compare("LE", x, y)?,
            BinaryOp::Gt => self.compare("GT", x, y)?,
            BinaryOp::Ge => self.compare("GE", x, y)?,
            BinaryOp::Atan2 => self.binary("atan2", x, y)?,
            // stablehlo.remainder has C semantics (sign of the dividend), as fmod.
            BinaryOp::Fmod => self.binary("remainder", x, y)?,
            BinaryOp::Igamma => self.igamma(x, y, false)?,
            BinaryOp::Igammac => self.igamma(x, y, true)?,
            #[allow(unreachable_patterns)]
            b => return Err(err(format!("no StableHLO lowering for {}", b.name()))),
        })
    }
}
