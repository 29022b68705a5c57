//! Linear algebra and neural-network composites: `dot_general`, matmul,
//! convolution, pooling (`reduce_window`) and attention. Products and
//! convolutions accumulate in f32 for 16-bit operands and carry the
//! precision config of the segment's [`super::Precision`].

use super::text::{arr, broadcast_shapes, dot_dims};
use super::{err, EmitError, Emitter, T};
use kiln_ir::{DType, PoolKind, ReduceKind};

impl<'c, 'a> Emitter<'c, 'a> {
    /// `dot_general`; accumulates (and returns) f32 for 16-bit float operands.
    pub(super) fn dot(
        &self,
        a: &T<'c, 'a>,
        b: &T<'c, 'a>,
        lb: &[i64],
        rb: &[i64],
        lc: &[i64],
        rc: &[i64],
    ) -> Result<T<'c, 'a>, EmitError> {
        self.dot_typed(a, b, lb, rb, lc, rc, self.acc(a.dt))
    }

    /// `dot_general` with result (accumulator) type `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dot_typed(
        &self,
        a: &T<'c, 'a>,
        b: &T<'c, 'a>,
        lb: &[i64],
        rb: &[i64],
        lc: &[i64],
        rc: &[i64],
        out: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let mut shape: Vec<i64> = lb.iter().map(|&d| a.shape[d as usize]).collect();
        let free = |t: &T, batch: &[i64], contract: &[i64]| -> Vec<i64> {
            (0..t.shape.len() as i64)
                .filter(|d| !batch.contains(d) && !contract.contains(d))
                .map(|d| t.shape[d as usize])
                .collect()
        };
        shape.extend(free(a, lb, lc));
        shape.extend(free(b, rb, rc));
        self.op(
            "stablehlo.dot_general",
            &[a, b],
            &shape,
            out,
            &[("dot_dimension_numbers", dot_dims(lb, rb, lc, rc)), ("precision_config", self.precision().into())],
        )
    }

    pub(super) fn matmul(&self, a: &T<'c, 'a>, b: &T<'c, 'a>, out_shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let out_dt = a.dt;
        let a = if a.shape.len() == 1 { self.reshape(a, &[1, a.shape[0]])? } else { a.clone() };
        let b = if b.shape.len() == 1 { self.reshape(b, &[b.shape[0], 1])? } else { b.clone() };
        let (ra, rb) = (a.shape.len(), b.shape.len());
        let r = if rb == 2 {
            self.dot(&a, &b, &[], &[], &[ra as i64 - 1], &[0])?
        } else {
            let batch = broadcast_shapes(&a.shape[..ra - 2], &b.shape[..rb - 2])
                .ok_or_else(|| err("matmul batch dims do not broadcast"))?;
            let nb = batch.len() as i64;
            let mut sa = batch.clone();
            sa.extend_from_slice(&a.shape[ra - 2..]);
            let mut sb = batch.clone();
            sb.extend_from_slice(&b.shape[rb - 2..]);
            let (a, b) = (self.bcast(&a, &sa)?, self.bcast(&b, &sb)?);
            let bd: Vec<i64> = (0..nb).collect();
            self.dot(&a, &b, &bd, &bd, &[nb + 1], &[nb])?
        };
        let r = self.reshape(&r, out_shape)?;
        self.convert(&r, out_dt)
    }

    /// `grouped_matmul(x[S, K], w[E, K, N], offs[E])`: row `r` times the
    /// weight of the expert whose block `offs[e-1] ≤ r < offs[e]` holds it,
    /// rows past the last offset zero. Static shapes cannot give each expert
    /// a block of its own size, so this is the dense form: one `dot_general`
    /// of every row with every expert (`[S, E, N]`, E times the kernel's
    /// FLOPs), the products outside each row's block replaced by zeros and
    /// the expert dim summed away. Each row keeps exactly one product (the
    /// other terms are zeros), so its bits are the product's; split over the
    /// experts (expert parallelism) the sum is a partial sum XLA all-reduces,
    /// still adding only zeros. Offsets are not checked here: the CPU kernel
    /// refuses decreasing ones, a segment cannot fail a run.
    pub(super) fn grouped_matmul(
        &self,
        x: &T<'c, 'a>,
        w: &T<'c, 'a>,
        offs: &T<'c, 'a>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (&[s, _], &[e, _, n], &[_]) = (x.shape.as_slice(), w.shape.as_slice(), offs.shape.as_slice()) else {
            return Err(err("grouped_matmul takes x[S, K], w[E, K, N], offs[E]"));
        };
        let products = self.dot(x, w, &[], &[], &[1], &[1])?;
        let ends = self.convert(offs, DType::I64)?;
        let starts = self.expert_starts(&ends)?;
        let rows = self.op("stablehlo.iota", &[], &[s, e], DType::I64, &[("iota_dimension", "0 : i64".into())])?;
        let after = self.compare("GE", &rows, &self.bcast_dims(&starts, &[s, e], &[1])?)?;
        let before = self.compare("LT", &rows, &self.bcast_dims(&ends, &[s, e], &[1])?)?;
        let mine = self.bcast_dims(&self.binary("and", &after, &before)?, &[s, e, n], &[0, 1])?;
        let kept = self.select(&mine, &products, &self.scalar(0.0, products.dt)?)?;
        let y = self.reduce(&kept, &[1], kiln_ir::ReduceKind::Sum)?;
        self.convert(&y, out_dt)
    }

    /// Where each expert's block of rows starts: `[0, ends[0], …,
    /// ends[E-2]]` (i64). A slice and a concatenation, not a pad with a
    /// negative high edge: XLA's GSPMD partitioner drops that pad's shift
    /// when the experts' dim is split (every block became empty: all-zero
    /// results under `--sharding-dialect gspmd`, found by `stablehlo_manual`).
    pub(super) fn expert_starts(&self, ends: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let e = ends.shape[0];
        let zero =
            self.op("stablehlo.constant", &[], &[1], DType::I64, &[("value", "dense<0> : tensor<1xi64>".into())])?;
        if e <= 1 {
            return Ok(zero);
        }
        let head = self.op(
            "stablehlo.slice",
            &[ends],
            &[e - 1],
            DType::I64,
            &[("start_indices", arr(&[0])), ("limit_indices", arr(&[e - 1])), ("strides", arr(&[1]))],
        )?;
        self.op("stablehlo.concatenate", &[&zero, &head], &[e], DType::I64, &[("dimension", "0 : i64".into())])
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv(
        &self,
        ins: &[T<'c, 'a>],
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        groups: i64,
        out_shape: &[i64],
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (x, w) = (&ins[0], &ins[1]);
        let sp = x.shape.len().saturating_sub(2);
        let spatial: Vec<String> = (0..sp).map(|i| i.to_string()).collect();
        let s = spatial.join(", ");
        let sep = if sp > 0 { ", " } else { "" };
        let dn = format!("#stablehlo.conv<[b, f{sep}{s}]x[o, i{sep}{s}]->[b, f{sep}{s}]>");
        let pads: Vec<String> = padding.iter().map(|p| format!("[{p}, {p}]")).collect();
        let pad_text = format!("dense<[{}]> : tensor<{sp}x2xi64>", pads.join(", "));
        let acc = self.acc(x.dt);
        let mut y = self.op(
            "stablehlo.convolution",
            &[x, w],
            out_shape,
            acc,
            &[
                ("window_strides", arr(stride)),
                ("padding", pad_text),
                ("lhs_dilation", arr(&vec![1; sp])),
                ("rhs_dilation", arr(dilation)),
                ("feature_group_count", format!("{groups} : i64")),
                ("batch_group_count", "1 : i64".into()),
                ("dimension_numbers", dn),
                ("precision_config", self.precision().into()),
            ],
        )?;
        if let Some(b) = ins.get(2) {
            let b = self.convert(b, acc)?;
            y = self.binary("add", &y, &self.bcast_dims(&b, out_shape, &[1])?)?;
        }
        self.convert(&y, out_dt)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn pool(
        &self,
        x: &T<'c, 'a>,
        kind: PoolKind,
        kernel: &[i64],
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        divide: Divisor,
        out_shape: &[i64],
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let r = x.shape.len();
        let k = kernel.len();
        if k > r || stride.len() != k || out_shape.len() != r {
            return Err(err("pool parameters do not match the input rank"));
        }
        let lead = r - k;
        let at = |v: &[i64], i: usize, default: i64| v.get(i).copied().unwrap_or(default);
        let mut win = vec![1; r];
        let mut strides = vec![1; r];
        let mut dil = vec![1; r];
        let mut pad_lo = vec![0; r];
        let mut pad_hi = vec![0; r];
        for i in 0..k {
            let d = lead + i;
            win[d] = kernel[i];
            strides[d] = stride[i];
            dil[d] = at(dilation, i, 1);
            let p = at(padding, i, 0);
            pad_lo[d] = p;
            // ceil_mode: the output shape may need windows past the right edge.
            let needed = (out_shape[d] - 1) * strides[d] + (win[d] - 1) * dil[d] + 1;
            pad_hi[d] = p + (needed - (x.shape[d] + 2 * p)).max(0);
        }
        let pad_text = |lo: &[i64], hi: &[i64]| {
            let rows: Vec<String> = lo.iter().zip(hi).map(|(a, b)| format!("[{a}, {b}]")).collect();
            format!("dense<[{}]> : tensor<{r}x2xi64>", rows.join(", "))
        };
        let window = |t: &T<'c, 'a>, init: f64, body: &str, lo: &[i64], hi: &[i64]| -> Result<T<'c, 'a>, EmitError> {
            let init_t = self.scalar(init, t.dt)?;
            let region = self.reducer(body, t.dt)?;
            self.op_with_regions(
                "stablehlo.reduce_window",
                &[t, &init_t],
                out_shape,
                t.dt,
                &[
                    ("window_dimensions", arr(&win)),
                    ("window_strides", arr(&strides)),
                    ("base_dilations", arr(&vec![1; r])),
                    ("window_dilations", arr(&dil)),
                    ("padding", pad_text(lo, hi)),
                ],
                vec![region],
            )
        };
        match kind {
            PoolKind::Max => {
                let y = window(x, f64::NEG_INFINITY, "maximum", &pad_lo, &pad_hi)?;
                self.convert(&y, out_dt)
            }
            PoolKind::Avg => {
                let xa = self.convert(x, self.acc(x.dt))?;
                let sum = window(&xa, 0.0, "add", &pad_lo, &pad_hi)?;
                let count_include_pad = match divide {
                    // torch divides the window's sum by divisor_override.
                    Divisor::Fixed(d) => {
                        let y = self.binary("divide", &sum, &self.scalar(d as f64, sum.dt)?)?;
                        return self.convert(&y, out_dt);
                    }
                    Divisor::Taps { count_include_pad } => count_include_pad,
                };
                // Divisors: windows over ones, padded as torch counts them.
                let counts = if count_include_pad {
                    let mut shape = x.shape.clone();
                    let mut hi = vec![0; r];
                    for d in lead..r {
                        shape[d] += 2 * pad_lo[d];
                        hi[d] = pad_hi[d] - pad_lo[d];
                    }
                    window(&self.splat(1.0, &shape, xa.dt)?, 0.0, "add", &vec![0; r], &hi)?
                } else {
                    window(&self.splat(1.0, &x.shape, xa.dt)?, 0.0, "add", &pad_lo, &pad_hi)?
                };
                let y = self.binary("divide", &sum, &counts)?;
                self.convert(&y, out_dt)
            }
            PoolKind::ArgMax => {
                Err(err("max pooling's indices have no StableHLO lowering (the partitioner keeps them on the CPU)"))
            }
        }
    }

    pub(super) fn attention(
        &self,
        ins: &[T<'c, 'a>],
        causal: bool,
        scale: Option<f64>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
        let r = q.shape.len();
        if r < 2 || k.shape.len() != r || v.shape.len() != r {
            return Err(err("attention operands must share their rank"));
        }
        let nb = (r - 2) as i64;
        let bd: Vec<i64> = (0..nb).collect();
        let e = q.shape[r - 1];
        // Shared (size-1) batch dims of k and v (grouped-query heads) broadcast to q's.
        let widen = |x: &T<'c, 'a>| {
            let mut shape = q.shape[..r - 2].to_vec();
            shape.extend_from_slice(&x.shape[r - 2..]);
            self.bcast(x, &shape)
        };
        let (k, v) = (&widen(k)?, &widen(v)?);
        let s = self.dot(q, k, &bd, &bd, &[nb + 1], &[nb + 1])?;
        let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
        let mut s = self.binary("multiply", &s, &self.scalar(scale, s.dt)?)?;
        let neg_inf = self.scalar(f64::NEG_INFINITY, s.dt)?;
        if causal {
            let row =
                self.op("stablehlo.iota", &[], &s.shape, DType::I64, &[("iota_dimension", format!("{nb} : i64"))])?;
            let col = self.op(
                "stablehlo.iota",
                &[],
                &s.shape,
                DType::I64,
                &[("iota_dimension", format!("{} : i64", nb + 1))],
            )?;
            let keep = self.compare("LE", &col, &row)?;
            s = self.select(&keep, &s, &neg_inf)?;
        }
        if let Some(m) = ins.get(3) {
            s = if m.dt == DType::Bool {
                let m = self.bcast(m, &s.shape)?;
                self.select(&m, &s, &neg_inf)?
            } else {
                self.binary("add", &s, &self.convert(m, s.dt)?)?
            };
        }
        let p = self.softmax(&s, r - 1, false)?;
        // A row with every key masked gives zeros, as torch's SDPA
        // (`_safe_softmax`) and the CPU kernel do, not NaN.
        let p = if causal || ins.len() > 3 {
            let max = self.reduce(&s, &[r - 1], ReduceKind::Max)?;
            let none = self.compare("EQ", &max, &neg_inf)?;
            self.select(&self.unreduce(&none, &s.shape, &[r - 1])?, &self.scalar(0.0, p.dt)?, &p)?
        } else {
            p
        };
        let p = self.convert(&p, v.dt)?;
        let o = self.dot(&p, v, &bd, &bd, &[nb + 1], &[nb])?;
        self.convert(&o, out_dt)
    }
}

/// What an average pool divides each window's sum by.
#[derive(Copy, Clone, Debug)]
pub(super) enum Divisor {
    /// torch's `divisor_override`.
    Fixed(i64),
    /// The window's taps, counting padding or not.
    Taps { count_include_pad: bool },
}
