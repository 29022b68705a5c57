//! The regularized incomplete gamma functions (`igamma`, `igammac`) as the
//! CPU kernel computes them (`kernels/src/generic/special.rs`, Cephes'
//! regimes and special values): in f64 whatever the operands' dtype, rounded
//! once, every regime computed for every element and one selected. Each
//! iteration (the series for P, the small-x series for Q, Legendre's
//! continued fraction for Q) is one `stablehlo.while` over whole tensors
//! that stops when every element has converged (or at the kernel's cap),
//! an element keeping its state once its own loop would have stopped.
//! lgamma (no StableHLO op) is Lanczos' approximation (g = 7, 9 terms).

use super::text::parse_type;
use super::{err, mlir_err, EmitError, Emitter, T};
use kiln_ir::{DType, ReduceKind};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::RegionLike;
use melior::ir::{Block, Region, Type, Value};
use std::collections::HashMap;

/// The kernel's convergence threshold (2⁻⁵³) and iteration cap.
const EPS: f64 = 1.110_223_024_625_156_5e-16;
const MAX_ITER: f64 = 20_000.0;
/// The continued fraction's rescaling threshold.
const BIG: f64 = 4.503_599_627_370_496e15;
/// Below this log the prefactor underflows to 0 (as in the kernel).
const MIN_LOG: f64 = -709.782_712_893_384;

/// Lanczos coefficients for g = 7 (Numerical Recipes / Boost's 9-term set).
const LANCZOS: [f64; 9] = [
    0.999_999_999_999_809_9,
    676.520_368_121_885_1,
    -1_259.139_216_722_402_8,
    771.323_428_777_653_1,
    -176.615_029_162_140_6,
    12.507_343_278_686_905,
    -0.138_571_095_265_720_12,
    9.984_369_578_019_572e-6,
    1.505_632_735_149_311_6e-7,
];

type Step<'c> = dyn for<'b> Fn(&Emitter<'c, 'b>, &[T<'c, 'b>]) -> Result<Vec<T<'c, 'b>>, EmitError>;

impl<'c, 'a> Emitter<'c, 'a> {
    /// `igamma(a, x)` (`upper`: `igammac`), both operands broadcast.
    pub(super) fn igamma(&self, a: &T<'c, 'a>, x: &T<'c, 'a>, upper: bool) -> Result<T<'c, 'a>, EmitError> {
        let out_dt = a.dt;
        let (a, x) = (self.convert(a, DType::F64)?, self.convert(x, DType::F64)?);
        let shape =
            super::text::broadcast_shapes(&a.shape, &x.shape).ok_or_else(|| err("igamma operands do not broadcast"))?;
        let (a, x) = (self.bcast(&a, &shape)?, self.bcast(&x, &shape)?);
        let c = |v: f64| self.scalar(v, DType::F64);
        let cmp = |dir: &str, p: &T<'c, 'a>, q: f64| self.compare(dir, p, &c(q)?);
        let and = |p: &T<'c, 'a>, q: &T<'c, 'a>| self.binary("and", p, q);
        let or = |p: &T<'c, 'a>, q: &T<'c, 'a>| self.binary("or", p, q);
        let not = |p: &T<'c, 'a>| self.unary("not", p);

        // Regimes (where the special values do not decide).
        let x_gt_a = self.compare("GT", &x, &a)?;
        let x_lt_a = self.compare("LT", &x, &a)?;
        let log_x = self.unary("log", &x)?;
        // Q: x > 1.1 → (x < a: 1 − P series; else CF); x ≤ 0.5 → (−0.4/ln x < a:
        // 1 − P; else Q series); else (1.1·x < a: 1 − P; else Q series).
        let big_x = cmp("GT", &x, 1.1)?;
        let small_x = cmp("LE", &x, 0.5)?;
        let small_p = self.compare("LT", &self.binary("divide", &c(-0.4)?, &log_x)?, &a)?;
        let mid_p = self.compare("LT", &self.binary("multiply", &x, &c(1.1)?)?, &a)?;
        let q_via_p = self.select(&big_x, &x_lt_a, &self.select(&small_x, &small_p, &mid_p)?)?;
        let q_via_cf = and(&big_x, &not(&x_lt_a)?)?;
        // P: x > 1 and x > a → 1 − Q (whichever way Q goes), else the series.
        let p_via_q = and(&cmp("GT", &x, 1.0)?, &x_gt_a)?;
        // Elements the special values decide (below) run no iteration: an
        // infinite or NaN state would never converge.
        let is_nan = |t: &T<'c, 'a>| self.compare("NE", t, t);
        let special = or(
            &or(&or(&cmp("LE", &x, 0.0)?, &cmp("LE", &a, 0.0)?)?, &or(&is_nan(&a)?, &is_nan(&x)?)?)?,
            &or(&cmp("EQ", &a, f64::INFINITY)?, &cmp("EQ", &x, f64::INFINITY)?)?,
        )?;
        let regular = not(&special)?;
        // Which loops an element needs.
        let (need_p, need_cf, need_qs) = if upper {
            (q_via_p.clone(), q_via_cf.clone(), and(&not(&q_via_p)?, &not(&q_via_cf)?)?)
        } else {
            let p_cf = and(&p_via_q, &q_via_cf)?;
            (not(&p_via_q)?, p_cf.clone(), and(&p_via_q, &not(&p_cf)?)?)
        };
        let (need_p, need_cf, need_qs) = (and(&need_p, &regular)?, and(&need_cf, &regular)?, and(&need_qs, &regular)?);

        let lg_a = self.lgamma(&a)?;
        let prefactor = {
            let log =
                self.binary("subtract", &self.binary("subtract", &self.binary("multiply", &a, &log_x)?, &x)?, &lg_a)?;
            self.select(&cmp("LT", &log, MIN_LOG)?, &c(0.0)?, &self.unary("exponential", &log)?)?
        };
        let p_series = self.igam_series(&a, &x, &need_p)?;
        let p_series = self.binary("divide", &self.binary("multiply", &p_series, &prefactor)?, &a)?;
        let cf = self.binary("multiply", &self.igamc_continued_fraction(&a, &x, &need_cf)?, &prefactor)?;
        let q_series = {
            let sum = self.igamc_series(&a, &x, &need_qs)?;
            let lg_a1 = self.lgamma(&self.binary("add", &a, &c(1.0)?)?)?;
            let a_log_x = self.binary("multiply", &a, &log_x)?;
            let first = self.unary("exponential_minus_one", &self.binary("subtract", &a_log_x, &lg_a1)?)?;
            let second = self.unary("exponential", &self.binary("subtract", &a_log_x, &lg_a)?)?;
            self.binary("subtract", &self.unary("negate", &first)?, &self.binary("multiply", &second, &sum)?)?
        };
        let one_minus = |t: &T<'c, 'a>| self.binary("subtract", &c(1.0)?, t);
        let q = self.select(&q_via_p, &one_minus(&p_series)?, &self.select(&q_via_cf, &cf, &q_series)?)?;
        let mut y = if upper { q.clone() } else { self.select(&p_via_q, &one_minus(&q)?, &p_series)? };

        // Special values, the kernel's order last to first.
        let (zero, one, nan) = (c(0.0)?, c(1.0)?, c(f64::NAN)?);
        let (lo, hi) = if upper { (&one, &zero) } else { (&zero, &one) };
        let a_inf = cmp("EQ", &a, f64::INFINITY)?;
        let x_inf = cmp("EQ", &x, f64::INFINITY)?;
        y = self.select(&x_inf, hi, &y)?;
        y = self.select(&a_inf, &self.select(&x_inf, &nan, lo)?, &y)?;
        y = self.select(&cmp("EQ", &x, 0.0)?, lo, &y)?;
        y = self.select(&cmp("EQ", &a, 0.0)?, &self.select(&cmp("GT", &x, 0.0)?, hi, &nan)?, &y)?;
        // NaN operands fall through to the regular path (NaN), as in the kernel.
        let bad = or(&cmp("LT", &x, 0.0)?, &cmp("LT", &a, 0.0)?)?;
        y = self.select(&bad, &nan, &y)?;
        self.convert(&y, out_dt)
    }

    /// ln Γ(z) for z > 0 (Lanczos; z < 1 through ln Γ(z + 1) − ln z).
    fn lgamma(&self, z: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let c = |v: f64| self.scalar(v, DType::F64);
        let small = self.compare("LT", z, &c(1.0)?)?;
        let w = self.select(&small, &self.binary("add", z, &c(1.0)?)?, z)?;
        // ln Γ(w) = ½ln 2π + (w − ½) ln t − t + ln A(w − 1), t = w + g − ½.
        let zm1 = self.binary("subtract", &w, &c(1.0)?)?;
        let mut sum = c(LANCZOS[0])?;
        for (i, &k) in LANCZOS.iter().enumerate().skip(1) {
            sum =
                self.binary("add", &sum, &self.binary("divide", &c(k)?, &self.binary("add", &zm1, &c(i as f64)?)?)?)?;
        }
        let t = self.binary("add", &zm1, &c(7.5)?)?;
        let lg = self.binary(
            "add",
            &self.binary(
                "subtract",
                &self.binary("multiply", &self.binary("add", &zm1, &c(0.5)?)?, &self.unary("log", &t)?)?,
                &t,
            )?,
            &self.binary("add", &c(0.5 * (2.0 * std::f64::consts::PI).ln())?, &self.unary("log", &sum)?)?,
        )?;
        self.select(&small, &self.binary("subtract", &lg, &self.unary("log", z)?)?, &lg)
    }

    /// Σ xⁿ / ((a+1)…(a+n)) (the P series' sum, before the prefactor).
    fn igam_series(&self, a: &T<'c, 'a>, x: &T<'c, 'a>, need: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let one = self.splat(1.0, &a.shape, DType::F64)?;
        let step: &Step<'c> = &|e, s| {
            let (a, x, r, c, sum) = (&s[0], &s[1], &s[2], &s[3], &s[4]);
            let r = e.binary("add", r, &e.scalar(1.0, DType::F64)?)?;
            let c = e.binary("multiply", c, &e.binary("divide", x, &r)?)?;
            let sum = e.binary("add", sum, &c)?;
            let done = e.compare("LE", &c, &e.binary("multiply", &e.scalar(EPS, DType::F64)?, &sum)?)?;
            Ok(vec![a.clone(), x.clone(), r, c, sum, done])
        };
        let out = self.converge(vec![a.clone(), x.clone(), a.clone(), one.clone(), one], need, step)?;
        Ok(out[4].clone())
    }

    /// Σ (−x)ⁿ / (n! (a+n)), n ≥ 1 (the small-x series for Q).
    fn igamc_series(&self, a: &T<'c, 'a>, x: &T<'c, 'a>, need: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let zero = self.splat(0.0, &a.shape, DType::F64)?;
        let one = self.splat(1.0, &a.shape, DType::F64)?;
        let step: &Step<'c> = &|e, s| {
            let (a, x, n, fac, sum) = (&s[0], &s[1], &s[2], &s[3], &s[4]);
            let n = e.binary("add", n, &e.scalar(1.0, DType::F64)?)?;
            let fac = e.binary("multiply", fac, &e.binary("divide", &e.unary("negate", x)?, &n)?)?;
            let term = e.binary("divide", &fac, &e.binary("add", a, &n)?)?;
            let sum = e.binary("add", sum, &term)?;
            let done = e.compare(
                "LE",
                &e.unary("abs", &term)?,
                &e.binary("multiply", &e.scalar(EPS, DType::F64)?, &e.unary("abs", &sum)?)?,
            )?;
            Ok(vec![a.clone(), x.clone(), n, fac, sum, done])
        };
        let out = self.converge(vec![a.clone(), x.clone(), zero.clone(), one, zero], need, step)?;
        Ok(out[4].clone())
    }

    /// Legendre's continued fraction for Q (before the prefactor).
    fn igamc_continued_fraction(&self, a: &T<'c, 'a>, x: &T<'c, 'a>, need: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let c = |v: f64| self.scalar(v, DType::F64);
        let y = self.binary("subtract", &c(1.0)?, a)?;
        let z = self.binary("subtract", &self.binary("add", x, &c(2.0)?)?, a)?;
        let zero = self.splat(0.0, &a.shape, DType::F64)?;
        let pkm2 = self.splat(1.0, &a.shape, DType::F64)?;
        let qkm2 = x.clone();
        let pkm1 = self.binary("add", x, &c(1.0)?)?;
        let qkm1 = self.binary("multiply", &z, x)?;
        let ans = self.binary("divide", &pkm1, &qkm1)?;
        let step: &Step<'c> = &|e, s| {
            let k = |v: f64| e.scalar(v, DType::F64);
            let (y, z, cc, pkm2, qkm2, pkm1, qkm1, ans) = (&s[0], &s[1], &s[2], &s[3], &s[4], &s[5], &s[6], &s[7]);
            let cc = e.binary("add", cc, &k(1.0)?)?;
            let y = e.binary("add", y, &k(1.0)?)?;
            let z = e.binary("add", z, &k(2.0)?)?;
            let yc = e.binary("multiply", &y, &cc)?;
            let pk = e.binary("subtract", &e.binary("multiply", pkm1, &z)?, &e.binary("multiply", pkm2, &yc)?)?;
            let qk = e.binary("subtract", &e.binary("multiply", qkm1, &z)?, &e.binary("multiply", qkm2, &yc)?)?;
            let nonzero = e.compare("NE", &qk, &k(0.0)?)?;
            let r = e.binary("divide", &pk, &qk)?;
            let t = e.unary("abs", &e.binary("divide", &e.binary("subtract", ans, &r)?, &r)?)?;
            let t = e.select(&nonzero, &t, &k(1.0)?)?;
            let ans = e.select(&nonzero, &r, ans)?;
            let done = e.compare("LE", &t, &k(EPS)?)?;
            // Shift, rescaling all four when pk grows past BIG.
            let scale = e.select(&e.compare("GT", &e.unary("abs", &pk)?, &k(BIG)?)?, &k(BIG)?, &k(1.0)?)?;
            let (p2, q2) = (e.binary("divide", pkm1, &scale)?, e.binary("divide", qkm1, &scale)?);
            let (p1, q1) = (e.binary("divide", &pk, &scale)?, e.binary("divide", &qk, &scale)?);
            Ok(vec![y, z, cc, p2, q2, p1, q1, ans, done])
        };
        let out = self.converge(vec![y, z, zero, pkm2, qkm2, pkm1, qkm1, ans], need, step)?;
        Ok(out[7].clone())
    }

    /// Runs `step` over the carried `state` (same-shaped f64 tensors; `step`
    /// returns the next state then its `done` flags) as one `stablehlo.while`
    /// until every element with `need` set is done or the cap is reached;
    /// an element keeps its state from the iteration where it finished.
    fn converge(&self, state: Vec<T<'c, 'a>>, need: &T<'c, 'a>, step: &Step<'c>) -> Result<Vec<T<'c, 'a>>, EmitError> {
        let n = state.len();
        let shape = need.shape.clone();
        let iter = self.scalar(0.0, DType::F64)?;
        let done = self.unary("not", need)?;
        let mut carried = vec![iter, done];
        carried.extend(state);
        let types: Vec<Type<'c>> =
            carried.iter().map(|t| parse_type(self.ctx, &t.shape, t.dt)).collect::<Result<_, _>>()?;
        let region = |body: bool| -> Result<Region<'c>, EmitError> {
            let region = Region::new();
            let block = region.append_block(Block::new(&types.iter().map(|&t| (t, self.loc)).collect::<Vec<_>>()));
            {
                let e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
                let args: Vec<T<'c, '_>> = carried
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        Ok(T { v: block.argument(i).map_err(mlir_err)?.into(), shape: t.shape.clone(), dt: t.dt })
                    })
                    .collect::<Result<_, EmitError>>()?;
                let results: Vec<Value> = if body {
                    let next = step(&e, &args[2..])?;
                    if next.len() != n + 1 {
                        return Err(err("a convergence step returns its state and its done flags"));
                    }
                    let done = &args[1];
                    let mut out = vec![e.binary("add", &args[0], &e.scalar(1.0, DType::F64)?)?.v];
                    out.push(e.binary("or", done, &next[n])?.v);
                    for (old, new) in args[2..].iter().zip(&next[..n]) {
                        out.push(e.select(done, old, new)?.v);
                    }
                    out
                } else {
                    let open =
                        e.reduce(&e.unary("not", &args[1])?, &(0..shape.len()).collect::<Vec<_>>(), ReduceKind::Max)?;
                    let under_cap = e.compare("LT", &args[0], &e.scalar(MAX_ITER, DType::F64)?)?;
                    vec![e.binary("and", &open, &under_cap)?.v]
                };
                block.append_operation(
                    OperationBuilder::new("stablehlo.return", self.loc)
                        .add_operands(&results)
                        .build()
                        .map_err(mlir_err)?,
                );
            }
            Ok(region)
        };
        let operands: Vec<Value> = carried.iter().map(|t| t.v).collect();
        let op = OperationBuilder::new("stablehlo.while", self.loc)
            .add_operands(&operands)
            .add_results(&types)
            .add_regions([region(false)?, region(true)?])
            .build()
            .map_err(mlir_err)?;
        let r = self.block.append_operation(op);
        (2..carried.len())
            .map(|k| {
                let v: Value = r.result(k).map_err(mlir_err)?.into();
                Ok(T { v, shape: carried[k].shape.clone(), dt: carried[k].dt })
            })
            .collect()
    }
}
