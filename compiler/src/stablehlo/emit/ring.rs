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
//! after each permute, so the ring sends only the shared heads. Every step
//! computes (SPMD: all devices run the same program); only the
//! contribution of masked blocks is void.

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

/// Source → target pairs passing every device's block one on around each
/// line along `axis`.
fn ring_pairs(mesh: &Mesh, axis: &str) -> Result<Vec<Vec<i64>>, EmitError> {
    let groups = axis_groups(mesh, axis)?;
    Ok(groups
        .iter()
        .flat_map(|line| (0..line.len()).map(|i| vec![line[i], line[(i + 1) % line.len()]]).collect::<Vec<_>>())
        .collect())
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
                let permute = |x: &T<'c, 'a>| {
                    self.op(
                        "stablehlo.collective_permute",
                        &[x],
                        &x.shape,
                        x.dt,
                        &[
                            ("source_target_pairs", pairs.clone()),
                            ("channel_handle", "#stablehlo.channel_handle<handle = 1, type = 1>".into()),
                        ],
                    )
                };
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
