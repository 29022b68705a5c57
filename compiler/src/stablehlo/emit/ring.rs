//! Ring attention: an attention split on the sequence over the `seq` axis
//! as one manual region ([`RingAttention`], `--shard context-parallel`).
//!
//! Each device enters with its `L / n` queries, its `S / n` keys and values
//! (block `i` on device `i` along the axis) and, with a mask, the mask's
//! rows for its queries and every key column. Over `n` steps it scores its
//! queries against the key block it holds — block `(i − t) mod n` at step
//! `t` — and folds the block into the online softmax: `m' = max(m,
//! rowmax(s))`, `p = exp(s − m')`, `l' = l·exp(m − m') + Σp`,
//! `o' = o·exp(m − m') + p·v`; then a `collective_permute` (partition ids,
//! device `i` to the next around each line along the axis) passes the key
//! and value blocks on. The result is `o / l`. A causal mask compares the
//! blocks' global positions (query `i·L/n + r`, key `j·S/n + c`); a block
//! entirely above the diagonal scores `−∞` everywhere and adds nothing (its
//! `exp` terms are zero and the running max ignores it: `m'` is computed as
//! 0 while still `−∞`, so no `−∞ − −∞`). A row every key of which is
//! masked gives zeros (as torch's SDPA since 2.5, kiln's CPU kernel and the
//! one-device StableHLO attention do). Key and value
//! batch dims of size 1 (grouped-query heads) are broadcast to the query's
//! after each permute, so the ring sends only the shared heads. In the
//! contiguous layout every step computes (SPMD: all devices run the same
//! program); only the contribution of masked blocks is void. A zig-zag ring
//! ([`RingAttention::zigzag`]) first moves its q, k and v chunks to their
//! zig-zag homes (two permutes each: the even chunks, the odd chunks; a
//! select on the device's parity puts them in order), scores its own block
//! under the position mask, then at each later step computes the two
//! `c × c` products of the visible half-block — `(q0 | q1) × k0` and
//! `q1 × (k0 | k1)`, the alternatives selected by `j < i` — folding each
//! into the running statistics of its query chunk; the result's chunks go
//! back by two more permutes.

use super::manual::{axis_groups, dense_table};
use super::text::arr;
use super::{err, mlir_err, EmitError, Emitter, T};
use crate::stablehlo::sharding::shardy_sharding;
use kiln_ir::{DType, Graph, Mesh, ReduceKind, Sharding};
use kiln_passes::shard::RingAttention;
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::RegionLike;
use melior::ir::{Block, Region, Value};
use std::collections::HashMap;

/// `#sdy.sharding_per_value<[…]>` of `shardings`.
fn per_value(shardings: &[Sharding]) -> String {
    let each: Vec<String> =
        shardings.iter().map(|s| shardy_sharding(s).trim_start_matches("#sdy.sharding").to_string()).collect();
    format!("#sdy.sharding_per_value<[{}]>", each.join(", "))
}

/// `shape` as one device holds it under `s`.
fn local_shape(mesh: &Mesh, shape: &[i64], s: &Sharding) -> Result<Vec<i64>, EmitError> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            let pieces = s.pieces(mesh, d) as i64;
            if n % pieces != 0 {
                return Err(err(format!("ring attention: {pieces} pieces do not divide dim {d} of {shape:?}")));
            }
            Ok(n / pieces)
        })
        .collect()
}

/// Source → target pairs sending position `p` along `axis` to position
/// `to(p)`, on each line along the axis (`to` a permutation of `0..n`).
fn line_pairs(mesh: &Mesh, axis: &str, to: impl Fn(i64, i64) -> i64) -> Result<Vec<Vec<i64>>, EmitError> {
    let groups = axis_groups(mesh, axis)?;
    Ok(groups
        .iter()
        .flat_map(|line| {
            let n = line.len() as i64;
            (0..n).map(|p| vec![line[p as usize], line[to(p, n) as usize]]).collect::<Vec<_>>()
        })
        .collect())
}

/// Source → target pairs passing every device's block one on around each
/// line along `axis`.
fn ring_pairs(mesh: &Mesh, axis: &str) -> Result<Vec<Vec<i64>>, EmitError> {
    line_pairs(mesh, axis, |p, n| (p + 1) % n)
}

/// The position along the axis that holds zig-zag chunk `c` of `2n`.
fn zigzag_home(c: i64, n: i64) -> i64 {
    if c < n {
        c
    } else {
        2 * n - 1 - c
    }
}

/// The chunk of `2n` of the given parity a zig-zag position `p` holds
/// (it holds `p` and `2n − 1 − p`, one even and one odd).
fn zigzag_chunk(p: i64, n: i64, odd: bool) -> i64 {
    if (p % 2 == 1) == odd {
        p
    } else {
        2 * n - 1 - p
    }
}

/// The four permutes of the zig-zag reorder: into the layout (position `d`'s
/// even chunk `2d`, then its odd chunk `2d + 1`, to their zig-zag homes)
/// and back (each position's even chunk, then its odd one, to the position
/// that holds it contiguously).
struct ZigzagPairs {
    in_even: String,
    in_odd: String,
    out_even: String,
    out_odd: String,
}

impl ZigzagPairs {
    fn new(mesh: &Mesh, axis: &str) -> Result<ZigzagPairs, EmitError> {
        Ok(ZigzagPairs {
            in_even: dense_table(&line_pairs(mesh, axis, |d, n| zigzag_home(2 * d, n))?),
            in_odd: dense_table(&line_pairs(mesh, axis, |d, n| zigzag_home(2 * d + 1, n))?),
            out_even: dense_table(&line_pairs(mesh, axis, |p, n| zigzag_chunk(p, n, false) / 2)?),
            out_odd: dense_table(&line_pairs(mesh, axis, |p, n| zigzag_chunk(p, n, true) / 2)?),
        })
    }
}

impl<'c, 'a> Emitter<'c, 'a> {
    /// Lowers node `r.node` of `g` as its ring region and binds its result.
    pub(super) fn lower_ring(
        &mut self,
        g: &Graph,
        mesh: &Mesh,
        r: &RingAttention,
        scale: Option<f64>,
    ) -> Result<(), EmitError> {
        let node = &g.nodes[r.node];
        let ins: Vec<T<'c, 'a>> = node.inputs.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        let out = node.outputs[0];
        let out_dt = self.cdt(g.ty(out).dtype);
        let out_shape = g.ty(out).static_shape().ok_or_else(|| err("ring attention with a dynamic result"))?;
        let local: Vec<(Vec<i64>, DType)> = ins
            .iter()
            .zip(&r.operands)
            .map(|(t, s)| Ok((local_shape(mesh, &t.shape, s)?, t.dt)))
            .collect::<Result<_, EmitError>>()?;
        let types =
            local.iter().map(|(s, dt)| super::text::parse_type(self.ctx, s, *dt)).collect::<Result<Vec<_>, _>>()?;
        let region = Region::new();
        let block = region.append_block(Block::new(&types.iter().map(|&t| (t, self.loc)).collect::<Vec<_>>()));
        {
            let e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
            let args: Vec<T<'c, '_>> = (0..local.len())
                .map(|i| {
                    let v: Value = block.argument(i).map_err(mlir_err)?.into();
                    Ok(T { v, shape: local[i].0.clone(), dt: local[i].1 })
                })
                .collect::<Result<_, EmitError>>()?;
            let y = e.ring_body(mesh, r, &args, scale, out_dt)?;
            let want = local_shape(mesh, &out_shape, &r.result)?;
            if y.shape != want {
                return Err(err(format!("ring attention produced {:?}, expected {want:?}", y.shape)));
            }
            block.append_operation(
                OperationBuilder::new("sdy.return", self.loc).add_operands(&[y.v]).build().map_err(mlir_err)?,
            );
        }
        let axes: Vec<String> = mesh.axes.iter().map(|a| format!("\"{}\"", a.name)).collect();
        let attrs = [
            ("in_shardings", per_value(&r.operands)),
            ("out_shardings", per_value(std::slice::from_ref(&r.result))),
            ("manual_axes", format!("#sdy<manual_axes{{{}}}>", axes.join(", "))),
        ];
        let operands: Vec<&T<'c, 'a>> = ins.iter().collect();
        let y = self.op_with_regions("sdy.manual_computation", &operands, &out_shape, out_dt, &attrs, vec![region])?;
        self.values.insert(out, y);
        Ok(())
    }

    /// One device's steps (see the module doc): `args` are its q, k, v
    /// blocks and mask rows.
    fn ring_body(
        &self,
        mesh: &Mesh,
        r: &RingAttention,
        args: &[T<'c, 'a>],
        scale: Option<f64>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        if r.zigzag {
            return self.ring_body_zigzag(mesh, r, args, scale, out_dt);
        }
        let (q, mut k, mut v) = (args[0].clone(), args[1].clone(), args[2].clone());
        let mask = args.get(3);
        let rank = q.shape.len();
        let nb = (rank - 2) as i64;
        let bd: Vec<i64> = (0..nb).collect();
        let (n, lc, sc) = (r.devices, r.local_queries(), r.local_keys());
        if q.shape[rank - 2] != lc || k.shape[rank - 2] != sc || v.shape[rank - 2] != sc {
            return Err(err("ring attention: blocks of unexpected lengths"));
        }
        let acc = self.acc(q.dt);
        let i64s = DType::I64;
        let me = self.axis_index(mesh, &r.axis, n)?;
        let scale = scale.unwrap_or(1.0 / (q.shape[rank - 1] as f64).sqrt());

        // Running max m and sum l per query row, the unnormalised output o.
        let rows: Vec<i64> = q.shape[..rank - 1].to_vec();
        let ev = v.shape[rank - 1];
        let mut o_shape = rows.clone();
        o_shape.push(ev);
        let mut m = self.splat(f64::NEG_INFINITY, &rows, acc)?;
        let mut l = self.splat(0.0, &rows, acc)?;
        let mut o = self.splat(0.0, &o_shape, acc)?;
        let last = rank - 1;
        let neg_inf = self.scalar(f64::NEG_INFINITY, acc)?;
        let mut s_shape = rows.clone();
        s_shape.push(sc);
        // Global query positions, for the causal mask.
        let query_pos = if r.causal {
            let iota = self.op("stablehlo.iota", &[], &s_shape, i64s, &[("iota_dimension", format!("{nb} : i64"))])?;
            let first = self.binary("multiply", &me, &self.scalar(lc as f64, i64s)?)?;
            Some(self.binary("add", &iota, &first)?)
        } else {
            None
        };
        let pairs = dense_table(&ring_pairs(mesh, &r.axis)?);
        let permute = |x: &T<'c, 'a>| self.permute(x, &pairs);
        for t in 0..n {
            // The block held now came from device j = (me − t) mod n.
            let j = self.binary("add", &me, &self.scalar((n - t) as f64, i64s)?)?;
            let j = self.binary("remainder", &j, &self.scalar(n as f64, i64s)?)?;
            // Shared (size-1) batch dims of k and v broadcast to q's.
            let widen = |x: &T<'c, 'a>| {
                let mut shape = q.shape[..rank - 2].to_vec();
                shape.extend_from_slice(&x.shape[rank - 2..]);
                self.bcast(x, &shape)
            };
            let (kb, vb) = (widen(&k)?, widen(&v)?);
            let s = self.dot(&q, &kb, &bd, &bd, &[nb + 1], &[nb + 1])?;
            let s = self.convert(&s, acc)?;
            let mut s = self.binary("multiply", &s, &self.scalar(scale, acc)?)?;
            if s.shape != s_shape {
                return Err(err(format!("ring attention scores {:?}, expected {s_shape:?}", s.shape)));
            }
            if let Some(query_pos) = &query_pos {
                let iota =
                    self.op("stablehlo.iota", &[], &s_shape, i64s, &[("iota_dimension", format!("{} : i64", nb + 1))])?;
                let first = self.binary("multiply", &j, &self.scalar(sc as f64, i64s)?)?;
                let key_pos = self.binary("add", &iota, &first)?;
                s = self.select(&self.compare("LE", &key_pos, query_pos)?, &s, &neg_inf)?;
            }
            if let Some(mk) = mask {
                let cols = mk.shape[mk.shape.len() - 1];
                let mk = if cols == r.keys && cols != sc {
                    // This block's key columns.
                    let mut sizes = mk.shape.clone();
                    *sizes.last_mut().ok_or_else(|| err("mask without dims"))? = sc;
                    let zero = self.scalar(0.0, i64s)?;
                    let start = self.binary("multiply", &j, &self.scalar(sc as f64, i64s)?)?;
                    let mut idx: Vec<&T<'c, 'a>> = vec![mk];
                    idx.extend(std::iter::repeat_n(&zero, mk.shape.len() - 1));
                    idx.push(&start);
                    self.op("stablehlo.dynamic_slice", &idx, &sizes, mk.dt, &[("slice_sizes", arr(&sizes))])?
                } else {
                    mk.clone()
                };
                s = if mk.dt == DType::Bool {
                    self.select(&self.bcast(&mk, &s_shape)?, &s, &neg_inf)?
                } else {
                    self.binary("add", &s, &self.convert(&mk, acc)?)?
                };
            }
            // Online softmax: the new max (0 while a row has seen only −∞).
            let m_new = self.binary("maximum", &m, &self.reduce(&s, &[last], ReduceKind::Max)?)?;
            let m_safe = self.select(&self.compare("EQ", &m_new, &neg_inf)?, &self.scalar(0.0, acc)?, &m_new)?;
            let p =
                self.unary("exponential", &self.binary("subtract", &s, &self.unreduce(&m_safe, &s_shape, &[last])?)?)?;
            let alpha = self.unary("exponential", &self.binary("subtract", &m, &m_safe)?)?;
            l =
                self.binary("add", &self.binary("multiply", &l, &alpha)?, &self.reduce(&p, &[last], ReduceKind::Sum)?)?;
            let pv = self.dot(&self.convert(&p, v.dt)?, &vb, &bd, &bd, &[nb + 1], &[nb])?;
            let pv = self.convert(&pv, acc)?;
            o = self.binary("add", &self.binary("multiply", &o, &self.unreduce(&alpha, &o_shape, &[last])?)?, &pv)?;
            m = m_new;
            if t < n - 1 {
                k = permute(&k)?;
                v = permute(&v)?;
            }
        }
        // A row with no unmasked key (l = 0, o = 0) gives zeros, as torch's
        // SDPA (`_safe_softmax`) and kiln's CPU kernel do.
        let one = self.scalar(1.0, acc)?;
        let l = self.select(&self.compare("EQ", &l, &self.scalar(0.0, acc)?)?, &one, &l)?;
        let y = self.binary("divide", &o, &self.unreduce(&l, &o_shape, &[last])?)?;
        self.convert(&y, out_dt)
    }

    /// `collective_permute` of `x` by the `pairs` table (partition ids).
    fn permute(&self, x: &T<'c, 'a>, pairs: &str) -> Result<T<'c, 'a>, EmitError> {
        self.op(
            "stablehlo.collective_permute",
            &[x],
            &x.shape,
            x.dt,
            &[
                ("source_target_pairs", pairs.to_string()),
                ("channel_handle", "#stablehlo.channel_handle<handle = 1, type = 1>".into()),
            ],
        )
    }

    /// `len` rows from `from` along dim `d`.
    fn rows_along(&self, x: &T<'c, 'a>, d: usize, from: i64, len: i64) -> Result<T<'c, 'a>, EmitError> {
        let mut starts = vec![0; x.shape.len()];
        let mut limits = x.shape.clone();
        let mut shape = x.shape.clone();
        starts[d] = from;
        limits[d] = from + len;
        shape[d] = len;
        let strides = vec![1; x.shape.len()];
        self.op(
            "stablehlo.slice",
            &[x],
            &shape,
            x.dt,
            &[("start_indices", arr(&starts)), ("limit_indices", arr(&limits)), ("strides", arr(&strides))],
        )
    }

    /// The two halves of `x` along dim `d`.
    fn halves(&self, x: &T<'c, 'a>, d: usize) -> Result<(T<'c, 'a>, T<'c, 'a>), EmitError> {
        let c = x.shape[d] / 2;
        Ok((self.rows_along(x, d, 0, c)?, self.rows_along(x, d, c, c)?))
    }

    fn join(&self, a: &T<'c, 'a>, b: &T<'c, 'a>, d: usize) -> Result<T<'c, 'a>, EmitError> {
        let mut shape = a.shape.clone();
        shape[d] += b.shape[d];
        self.op("stablehlo.concatenate", &[a, b], &shape, a.dt, &[("dimension", format!("{d} : i64"))])
    }

    /// The causal ring in the zig-zag layout (see the module doc of
    /// `kiln_passes::shard::ring`): `args` are this device's contiguous q,
    /// k and v blocks (chunks `2i` and `2i + 1` of `2n`); the result is its
    /// contiguous result block again.
    fn ring_body_zigzag(
        &self,
        mesh: &Mesh,
        r: &RingAttention,
        args: &[T<'c, 'a>],
        scale: Option<f64>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        // A mask here is the causal pattern itself (`RingAttention::plan`):
        // the positions below say the same.
        let [q, k, v, ..] = args else { return Err(err("zig-zag ring attention takes q, k and v")) };
        let rank = q.shape.len();
        let sd = rank - 2;
        let nb = sd as i64;
        let bd: Vec<i64> = (0..nb).collect();
        let (n, c) = (r.devices, r.local_queries() / 2);
        if r.local_queries() != 2 * c || [&q, &k, &v].iter().any(|x| x.shape[sd] != 2 * c) {
            return Err(err("zig-zag ring attention: blocks of unexpected lengths"));
        }
        let acc = self.acc(q.dt);
        let i64s = DType::I64;
        let me = self.axis_index(mesh, &r.axis, n)?;
        let scale = self.scalar(scale.unwrap_or(1.0 / (q.shape[rank - 1] as f64).sqrt()), acc)?;
        let zz = ZigzagPairs::new(mesh, &r.axis)?;
        let ring = dense_table(&ring_pairs(mesh, &r.axis)?);
        // Positions of even parity receive their even chunk first.
        let two = self.scalar(2.0, i64s)?;
        let even = self.compare("EQ", &self.binary("remainder", &me, &two)?, &self.scalar(0.0, i64s)?)?;
        let to_zigzag = |x: &T<'c, 'a>| -> Result<T<'c, 'a>, EmitError> {
            let (h0, h1) = self.halves(x, sd)?;
            let (e, o) = (self.permute(&h0, &zz.in_even)?, self.permute(&h1, &zz.in_odd)?);
            self.join(&self.select(&even, &e, &o)?, &self.select(&even, &o, &e)?, sd)
        };
        let (q, mut k, mut v) = (to_zigzag(q)?, to_zigzag(k)?, to_zigzag(v)?);
        let widen = |x: &T<'c, 'a>| {
            let mut shape = q.shape[..sd].to_vec();
            shape.extend_from_slice(&x.shape[sd..]);
            self.bcast(x, &shape)
        };
        let scores = |a: &T<'c, 'a>, b: &T<'c, 'a>| -> Result<T<'c, 'a>, EmitError> {
            let s = self.dot(a, b, &bd, &bd, &[nb + 1], &[nb + 1])?;
            self.binary("multiply", &self.convert(&s, acc)?, &scale)
        };
        let times_v = |p: &T<'c, 'a>, vb: &T<'c, 'a>| -> Result<T<'c, 'a>, EmitError> {
            let pv = self.dot(&self.convert(p, vb.dt)?, vb, &bd, &bd, &[nb + 1], &[nb])?;
            self.convert(&pv, acc)
        };
        let last = rank - 1;
        let neg_inf = self.scalar(f64::NEG_INFINITY, acc)?;
        let zero = self.scalar(0.0, acc)?;

        // Step 0, the device's own chunks i and 2n − 1 − i: masked by
        // position. Every row sees its own key, so no row is all −∞.
        let (kb, vb) = (widen(&k)?, widen(&v)?);
        let s = scores(&q, &kb)?;
        let iota = self.op("stablehlo.iota", &[], &[2 * c], i64s, &[("iota_dimension", "0 : i64".into())])?;
        let first = self.binary("add", &iota, &self.binary("multiply", &me, &self.scalar(c as f64, i64s)?)?)?;
        // (2n − 1 − i)·c + (r − c) for the second chunk's rows.
        let back = self.binary("subtract", &self.scalar((2 * n - 2) as f64, i64s)?, &me)?;
        let second = self.binary("add", &iota, &self.binary("multiply", &back, &self.scalar(c as f64, i64s)?)?)?;
        let in_first = self.compare("LT", &iota, &self.scalar(c as f64, i64s)?)?;
        let pos = self.select(&in_first, &first, &second)?;
        let query_pos = self.bcast_dims(&pos, &s.shape, &[nb])?;
        let key_pos = self.bcast_dims(&pos, &s.shape, &[nb + 1])?;
        let s = self.select(&self.compare("LE", &key_pos, &query_pos)?, &s, &neg_inf)?;
        let m = self.reduce(&s, &[last], ReduceKind::Max)?;
        let p = self.unary("exponential", &self.binary("subtract", &s, &self.unreduce(&m, &s.shape, &[last])?)?)?;
        let l = self.reduce(&p, &[last], ReduceKind::Sum)?;
        let o = times_v(&p, &vb)?;
        // Running statistics per query chunk.
        let ((mut m0, mut m1), (mut l0, mut l1), (mut o0, mut o1)) =
            (self.halves(&m, sd)?, self.halves(&l, sd)?, self.halves(&o, sd)?);

        for t in 1..n {
            k = self.permute(&k, &ring)?;
            v = self.permute(&v, &ring)?;
            // The block held now came from device j = (me − t) mod n; `a`:
            // j < me (its first chunk visible to both query chunks), else
            // only the second query chunk sees it, all of it.
            let j = self.binary(
                "remainder",
                &self.binary("add", &me, &self.scalar((n - t) as f64, i64s)?)?,
                &self.scalar(n as f64, i64s)?,
            )?;
            let a = self.compare("LT", &j, &me)?;
            let (q0, q1) = self.halves(&q, sd)?;
            let ((k0, k1), (v0, v1)) = (self.halves(&widen(&k)?, sd)?, self.halves(&widen(&v)?, sd)?);
            // Pair a: (q0 or q1) × k0; pair b: q1 × (k0 or k1).
            let sa = scores(&self.select(&a, &q0, &q1)?, &k0)?;
            let sb = scores(&q1, &self.select(&a, &k0, &k1)?)?;
            let vb = self.select(&a, &v0, &v1)?;
            let (ra, rb) = (self.reduce(&sa, &[last], ReduceKind::Max)?, self.reduce(&sb, &[last], ReduceKind::Max)?);
            let m0n = self.binary("maximum", &m0, &self.select(&a, &ra, &neg_inf)?)?;
            let m1n = self.binary("maximum", &self.binary("maximum", &m1, &rb)?, &self.select(&a, &neg_inf, &ra)?)?;
            let ma = self.select(&a, &m0n, &m1n)?;
            let pa =
                self.unary("exponential", &self.binary("subtract", &sa, &self.unreduce(&ma, &sa.shape, &[last])?)?)?;
            let pb =
                self.unary("exponential", &self.binary("subtract", &sb, &self.unreduce(&m1n, &sb.shape, &[last])?)?)?;
            let alpha0 = self.unary("exponential", &self.binary("subtract", &m0, &m0n)?)?;
            let alpha1 = self.unary("exponential", &self.binary("subtract", &m1, &m1n)?)?;
            let (suma, sumb) =
                (self.reduce(&pa, &[last], ReduceKind::Sum)?, self.reduce(&pb, &[last], ReduceKind::Sum)?);
            let (pva, pvb) = (times_v(&pa, &v0)?, times_v(&pb, &vb)?);
            l0 = self.binary("add", &self.binary("multiply", &l0, &alpha0)?, &self.select(&a, &suma, &zero)?)?;
            let l1b = self.binary("add", &self.binary("multiply", &l1, &alpha1)?, &sumb)?;
            l1 = self.binary("add", &l1b, &self.select(&a, &zero, &suma)?)?;
            let scaled0 = self.binary("multiply", &o0, &self.unreduce(&alpha0, &o0.shape, &[last])?)?;
            o0 = self.binary("add", &scaled0, &self.select(&a, &pva, &zero)?)?;
            let scaled1 = self.binary("multiply", &o1, &self.unreduce(&alpha1, &o1.shape, &[last])?)?;
            o1 = self.binary("add", &self.binary("add", &scaled1, &pvb)?, &self.select(&a, &zero, &pva)?)?;
            (m0, m1) = (m0n, m1n);
        }
        let y0 = self.binary("divide", &o0, &self.unreduce(&l0, &o0.shape, &[last])?)?;
        let y1 = self.binary("divide", &o1, &self.unreduce(&l1, &o1.shape, &[last])?)?;
        let (y0, y1) = (self.convert(&y0, out_dt)?, self.convert(&y1, out_dt)?);
        // Back to the contiguous layout: each chunk to the device that holds
        // it contiguously, as its first (even) or second (odd) half.
        let (e, o) = (self.select(&even, &y0, &y1)?, self.select(&even, &y1, &y0)?);
        self.join(&self.permute(&e, &zz.out_even)?, &self.permute(&o, &zz.out_odd)?, sd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reorder's pairs are permutations (no source or target twice),
    /// and back undoes in: a chunk sent in as position d's even (odd) half
    /// comes back to d as its even (odd) half.
    #[test]
    fn zigzag_pairs_round_trip() {
        for n in [2i64, 3, 4, 8] {
            for odd in [false, true] {
                let into: Vec<i64> = (0..n).map(|d| zigzag_home(2 * d + i64::from(odd), n)).collect();
                let mut sorted = into.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n = {n}");
                for d in 0..n {
                    // Position into[d] holds chunk 2d (+1) with that parity.
                    let p = into[d as usize];
                    assert_eq!(zigzag_chunk(p, n, odd), 2 * d + i64::from(odd), "n = {n}, d = {d}");
                    assert_eq!(zigzag_chunk(p, n, odd) / 2, d);
                }
            }
            // Position p holds chunks p and 2n − 1 − p.
            for p in 0..n {
                let mut held = [zigzag_chunk(p, n, false), zigzag_chunk(p, n, true)];
                held.sort_unstable();
                let mut want = [p, 2 * n - 1 - p];
                want.sort_unstable();
                assert_eq!(held, want);
            }
        }
    }

    #[test]
    fn pairs_close_each_line_into_a_ring() {
        let mesh = Mesh::new(&[("seq", 4)]);
        let pairs = ring_pairs(&mesh, "seq").ok();
        assert_eq!(pairs, Some(vec![vec![0, 1], vec![1, 2], vec![2, 3], vec![3, 0]]));
        let mesh = Mesh::new(&[("seq", 2), ("data", 2)]);
        let pairs = ring_pairs(&mesh, "seq").ok();
        assert_eq!(pairs, Some(vec![vec![0, 2], vec![2, 0], vec![1, 3], vec![3, 1]]));
    }
}
