//! Pipeline stages (`--shard pipeline`, [`Pipeline`]): the run of repeated
//! blocks as one `sdy.manual_computation` over every mesh axis, GPipe's
//! schedule unrolled inside it.
//!
//! Each device enters with its rows of the activation (batch over `data`,
//! whole over `stage`) and its stage's `L / N` layers of every stacked
//! weight. Over `M + N − 1` steps: stage 0 takes microbatch `t` (the others
//! what the previous stage sent), every stage applies its layers, the last
//! stage keeps its result as microbatch `t − N + 1`'s output, and a
//! `collective_permute` (partition ids, one pair per consecutive stages of
//! each line along `stage`) sends every stage's result one stage on. The
//! last stage's results are then gathered along `stage` (`all_gather`,
//! flattened ids) and every device keeps the last stage's piece, so the
//! region's result is whole over `stage`. Steps outside a stage's window
//! compute on zeros and are never selected. Each microbatch goes through
//! the same layers with the same weights as on one device; only the rows a
//! product holds differ.

use super::manual::{axis_groups, dense_table};
use super::text::arr;
use super::{err, mlir_err, EmitError, Emitter, T};
use crate::stablehlo::sharding::shardy_sharding;
use kiln_ir::{DType, Graph, Mesh, Sharding};
use kiln_passes::shard::Pipeline;
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

impl<'c, 'a> Emitter<'c, 'a> {
    /// Lowers `p`'s whole span as its region and binds the last layer's result.
    pub(super) fn lower_pipeline(&mut self, g: &Graph, mesh: &Mesh, p: &Pipeline) -> Result<(), EmitError> {
        let template = p.template.as_deref().ok_or_else(|| err("pipeline without a template layer"))?;
        let x = self.get(p.input)?;
        let stacked: Vec<T<'c, 'a>> = p.stacked.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        let shared: Vec<T<'c, 'a>> = p.shared.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        let side: Vec<T<'c, 'a>> = p.side.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        let per_stage = p.layers / p.stages;

        // Local (per device) operand types.
        let mut local_x = x.shape.clone();
        local_x[0] = p.local_rows;
        let mut local: Vec<(Vec<i64>, DType)> = vec![(local_x.clone(), x.dt)];
        for s in &stacked {
            let mut shape = s.shape.clone();
            shape[0] = per_stage;
            local.push((shape, s.dt));
        }
        local.extend(shared.iter().map(|s| (s.shape.clone(), s.dt)));
        for (s, &batched) in side.iter().zip(&p.side_batched) {
            let mut shape = s.shape.clone();
            if batched {
                shape[0] = p.local_rows;
            }
            local.push((shape, s.dt));
        }
        let types =
            local.iter().map(|(s, dt)| super::text::parse_type(self.ctx, s, *dt)).collect::<Result<Vec<_>, _>>()?;
        let region = Region::new();
        let block = region.append_block(Block::new(&types.iter().map(|&t| (t, self.loc)).collect::<Vec<_>>()));
        {
            let mut e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
            let args: Vec<T<'c, '_>> = (0..local.len())
                .map(|i| {
                    let v: Value = block.argument(i).map_err(mlir_err)?.into();
                    Ok(T { v, shape: local[i].0.clone(), dt: local[i].1 })
                })
                .collect::<Result<_, EmitError>>()?;
            let y = e.schedule(g, mesh, p, template, &args)?;
            block.append_operation(
                OperationBuilder::new("sdy.return", self.loc).add_operands(&[y.v]).build().map_err(mlir_err)?,
            );
        }
        let mut ins = vec![p.sharding.clone()];
        ins.extend(stacked.iter().map(|s| Sharding::split(s.shape.len(), 0, &p.axis)));
        ins.extend(shared.iter().map(|s| Sharding::replicated(s.shape.len())));
        for (s, &batched) in side.iter().zip(&p.side_batched) {
            let mut sharding = Sharding::replicated(s.shape.len());
            if batched {
                sharding.dims[0].clone_from(&p.sharding.dims[0]);
            }
            ins.push(sharding);
        }
        let axes: Vec<String> = mesh.axes.iter().map(|a| format!("\"{}\"", a.name)).collect();
        let attrs = [
            ("in_shardings", per_value(&ins)),
            ("out_shardings", per_value(std::slice::from_ref(&p.sharding))),
            ("manual_axes", format!("#sdy<manual_axes{{{}}}>", axes.join(", "))),
        ];
        let mut operands: Vec<&T<'c, 'a>> = vec![&x];
        operands.extend(stacked.iter());
        operands.extend(shared.iter());
        operands.extend(side.iter());
        let y = self.op_with_regions("sdy.manual_computation", &operands, &x.shape, x.dt, &attrs, vec![region])?;
        self.values.insert(p.output, y);
        Ok(())
    }

    /// One device's schedule (see the module doc): `args` are the local
    /// activation, the stacked weights' local layers and the shared
    /// constants.
    fn schedule(
        &mut self,
        g: &Graph,
        mesh: &Mesh,
        p: &Pipeline,
        template: &Graph,
        args: &[T<'c, 'a>],
    ) -> Result<T<'c, 'a>, EmitError> {
        let _ = g;
        let (n, m, mb) = (p.stages, p.microbatches, p.microbatch_rows);
        let per_stage = p.layers / p.stages;
        let x = &args[0];
        let slots = &args[1..1 + p.stacked.len()];
        let shared = &args[1 + p.stacked.len()..1 + p.stacked.len() + p.shared.len()];
        let side = &args[1 + p.stacked.len() + p.shared.len()..];
        let me = self.axis_index(mesh, &p.axis, n)?;
        let at = |k: i64| self.compare("EQ", &me, &self.scalar(k as f64, DType::I64)?);
        let (first, last) = (at(0)?, at(n - 1)?);
        let rows = |t: &T<'c, 'a>, from: i64, count: i64| Self::rows(self, t, from, count);
        // Each local layer's weights, sliced once.
        let mut layer_weights: Vec<Vec<T<'c, 'a>>> = Vec::new();
        for j in 0..per_stage {
            let mut ws = Vec::new();
            for s in slots {
                let one = rows(s, j, 1)?;
                ws.push(self.reshape(&one, &s.shape[1..])?);
            }
            layer_weights.push(ws);
        }
        let mut mb_shape = x.shape.clone();
        mb_shape[0] = mb;
        let bcast = |c: &T<'c, 'a>| self.bcast_dims(c, &mb_shape, &[]);
        let (first_b, last_b) = (bcast(&first)?, bcast(&last)?);
        let groups = axis_groups(mesh, &p.axis)?;
        let pairs: Vec<Vec<i64>> =
            groups.iter().flat_map(|line| line.windows(2).map(|w| vec![w[0], w[1]]).collect::<Vec<_>>()).collect();
        let mut state = self.splat(0.0, &mb_shape, x.dt)?;
        let mut outs = Vec::new();
        for t in 0..m + n - 1 {
            let input = if t < m { self.select(&first_b, &self.rows(x, t * mb, mb)?, &state)? } else { state.clone() };
            // Side inputs: this stage's microbatch `t − stage` (clamped in
            // the bubble, whose results are never kept) of the batched ones.
            let mut extra = shared.to_vec();
            for (v, &batched) in side.iter().zip(&p.side_batched) {
                extra.push(if batched { self.microbatch_at(v, &me, t, m, mb)? } else { v.clone() });
            }
            let mut h = input;
            for ws in &layer_weights {
                h = self.apply_layer(template, &h, ws, &extra)?;
            }
            if t >= n - 1 {
                // Only the last stage's result is the output; the others'
                // are discarded by the gather below.
                outs.push(self.select(&last_b, &h, &self.splat(0.0, &mb_shape, h.dt)?)?);
            }
            if t < m + n - 2 {
                state = self.op(
                    "stablehlo.collective_permute",
                    &[&h],
                    &h.shape,
                    h.dt,
                    &[
                        ("source_target_pairs", dense_table(&pairs)),
                        ("channel_handle", "#stablehlo.channel_handle<handle = 1, type = 1>".into()),
                    ],
                )?;
            }
        }
        let y = if outs.len() == 1 {
            outs.remove(0)
        } else {
            let refs: Vec<&T<'c, 'a>> = outs.iter().collect();
            self.op("stablehlo.concatenate", &refs, &x.shape, x.dt, &[("dimension", "0 : i64".into())])?
        };
        // Every stage leaves with the last stage's rows.
        let mut one = vec![1];
        one.extend(&y.shape);
        let mut all = vec![n];
        all.extend(&y.shape);
        let gathered = self.op(
            "stablehlo.all_gather",
            &[&self.reshape(&y, &one)?],
            &all,
            y.dt,
            &[
                ("all_gather_dim", "0 : i64".into()),
                ("replica_groups", dense_table(&groups)),
                ("channel_handle", "#stablehlo.channel_handle<handle = 1, type = 1>".into()),
                ("use_global_device_ids", "unit".into()),
            ],
        )?;
        let kept = self.rows(&gathered, n - 1, 1)?;
        self.reshape(&kept, &y.shape)
    }

    /// Rows of microbatch `clamp(t − me, 0, m − 1)` of `v` (`mb` rows each):
    /// what stage `me` works on at step `t`.
    fn microbatch_at(&self, v: &T<'c, 'a>, me: &T<'c, 'a>, t: i64, m: i64, mb: i64) -> Result<T<'c, 'a>, EmitError> {
        let i64s = DType::I64;
        let k = self.binary("subtract", &self.scalar(t as f64, i64s)?, me)?;
        let k = self.binary("maximum", &k, &self.scalar(0.0, i64s)?)?;
        let k = self.binary("minimum", &k, &self.scalar((m - 1) as f64, i64s)?)?;
        let start = self.binary("multiply", &k, &self.scalar(mb as f64, i64s)?)?;
        let zero = self.scalar(0.0, i64s)?;
        let mut starts: Vec<&T<'c, 'a>> = vec![v, &start];
        for _ in 1..v.shape.len() {
            starts.push(&zero);
        }
        let mut sizes = v.shape.clone();
        sizes[0] = mb;
        self.op("stablehlo.dynamic_slice", &starts, &sizes, v.dt, &[("slice_sizes", arr(&sizes))])
    }

    /// Rows `from .. from + count` of `t` (dim 0).
    fn rows(&self, t: &T<'c, 'a>, from: i64, count: i64) -> Result<T<'c, 'a>, EmitError> {
        let mut start = vec![0; t.shape.len()];
        let mut limit = t.shape.clone();
        let mut shape = t.shape.clone();
        start[0] = from;
        limit[0] = from + count;
        shape[0] = count;
        let strides = vec![1; t.shape.len()];
        self.op(
            "stablehlo.slice",
            &[t],
            &shape,
            t.dt,
            &[("start_indices", arr(&start)), ("limit_indices", arr(&limit)), ("strides", arr(&strides))],
        )
    }

    /// The template layer on activation `h` with weights `ws`: its nodes
    /// lowered in a scope of their own.
    fn apply_layer(
        &mut self,
        template: &Graph,
        h: &T<'c, 'a>,
        ws: &[T<'c, 'a>],
        shared: &[T<'c, 'a>],
    ) -> Result<T<'c, 'a>, EmitError> {
        let saved = std::mem::take(&mut self.values);
        let inputs = std::iter::once(h).chain(ws).chain(shared);
        if template.inputs.len() != 1 + ws.len() + shared.len() {
            return Err(err(format!(
                "pipeline template takes {} inputs, the region has {}",
                template.inputs.len(),
                1 + ws.len() + shared.len()
            )));
        }
        for (&v, t) in template.inputs.iter().zip(inputs) {
            self.values.insert(v, t.clone());
        }
        for c in template.consts.values() {
            let t = self.inline_const(template, c)?;
            let t = self.convert(&t, self.cdt(template.ty(c.value).dtype))?;
            self.values.insert(c.value, t);
        }
        for &node in &template.order {
            self.lower_node(template, node)?;
        }
        let out = self.get(template.outputs[0]);
        self.values = saved;
        out
    }
}
