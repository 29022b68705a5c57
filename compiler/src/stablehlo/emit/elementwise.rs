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

    pub(super) fn erf(&self, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): StableHLO has no erf
        // and chlo.erf is not available to this emitter.
        let dt = x.dt;
        let c = |v: f64| self.scalar(v, dt);
        let ax = self.unary("abs", x)?;
        let t = self.binary(
            "divide",
            &c(1.0)?,
            &self.binary("add", &c(1.0)?, &self.binary("multiply", &c(0.327_591_1)?, &ax)?)?,
        )?;
        let coeffs = [1.061_405_429, -1.453_152_027, 1.421_413_741, -0.284_496_736, 0.254_829_592];
        let mut poly = c(coeffs[0])?;
        for &k in &coeffs[1..] {
            poly = self.binary("add", &self.binary("multiply", &poly, &t)?, &c(k)?)?;
        }
        poly = self.binary("multiply", &poly, &t)?;
        let e = self.unary("exponential", &self.unary("negate", &self.binary("multiply", &ax, &ax)?)?)?;
        let y = self.binary("subtract", &c(1.0)?, &self.binary("multiply", &poly, &e)?)?;
        self.binary("multiply", &self.unary("sign", x)?, &y)
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
            // upstream; these are their textbook formulations.
            UnaryOp::Atan => self.binary("atan2", x, &self.splat(1.0, &x.shape, dt)?)?,
            UnaryOp::Asin => {
                let cos = self.unary("sqrt", &self.binary("subtract", &c(1.0)?, &self.binary("multiply", x, x)?)?)?;
                self.binary("atan2", x, &cos)?
            }
            UnaryOp::Acos => {
                let sin = self.unary("sqrt", &self.binary("subtract", &c(1.0)?, &self.binary("multiply", x, x)?)?)?;
                self.binary("atan2", &sin, x)?
            }
            UnaryOp::Sinh | UnaryOp::Cosh => {
                let (e, ne) = (self.unary("exponential", x)?, self.unary("exponential", &self.unary("negate", x)?)?);
                let sum =
                    if u == UnaryOp::Sinh { self.binary("subtract", &e, &ne)? } else { self.binary("add", &e, &ne)? };
                self.binary("multiply", &sum, &c(0.5)?)?
            }
            UnaryOp::Asinh => {
                // sign(x) · log(|x| + sqrt(x² + 1)) avoids cancellation for x < 0.
                let ax = self.unary("abs", x)?;
                let r = self.unary("sqrt", &self.binary("add", &self.binary("multiply", x, x)?, &c(1.0)?)?)?;
                self.binary("multiply", &self.unary("sign", x)?, &self.unary("log", &self.binary("add", &ax, &r)?)?)?
            }
            UnaryOp::Acosh => {
                let r = self.unary("sqrt", &self.binary("subtract", &self.binary("multiply", x, x)?, &c(1.0)?)?)?;
                self.unary("log", &self.binary("add", x, &r)?)?
            }
            UnaryOp::Atanh => {
                let q =
                    self.binary("divide", &self.binary("add", &c(1.0)?, x)?, &self.binary("subtract", &c(1.0)?, x)?)?;
                self.binary("multiply", &self.unary("log", &q)?, &c(0.5)?)?
            }
            #[allow(unreachable_patterns)]
            u => return Err(err(format!("no StableHLO lowering for {}", u.name()))),
        })
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
