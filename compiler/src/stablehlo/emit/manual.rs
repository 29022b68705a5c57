//! Manual regions: code kiln partitions by hand inside an SPMD module, as
//! `sdy.manual_computation` over every mesh axis with explicit collectives
//! (the form `../shared/notes/sharding/manual_sdy.mlir` verified on the XLA
//! CPU plugin). Collectives name partitions: `all_to_all` by partition id (a
//! channel handle; it has no flattened mode), `all_reduce` by flattened id
//! (`use_global_device_ids`; the same numbers with one replica), one group
//! per line of devices along the region's axis.
//!
//! The one region today is expert parallelism ([`ExpertDispatch`]): rows go
//! to their experts' devices by all-to-all at worst-case capacity and their
//! products come back the same way, or, when the devices do not divide the
//! rows, every device multiplies every row by its experts and one
//! all-reduce adds the products.

use super::text::arr;
use super::{err, mlir_err, EmitError, Emitter, T};
use crate::stablehlo::sharding::shardy_sharding;
use kiln_ir::{DType, Graph, Mesh, ReduceKind, Sharding};
use kiln_passes::shard::{Exchange, ExpertDispatch};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::RegionLike;
use melior::ir::{Block, Region, Type, Value};
use std::collections::HashMap;

/// `replica_groups` for collectives along `axis`: one group per coordinate
/// of the other axes, partition ids in mesh (row-major) order.
pub fn axis_groups(mesh: &Mesh, axis: &str) -> Result<Vec<Vec<i64>>, EmitError> {
    let at = mesh.axes.iter().position(|a| a.name == axis).ok_or_else(|| err(format!("no mesh axis `{axis}`")))?;
    let size = i64::from(mesh.axes[at].size);
    let stride: i64 = mesh.axes[at + 1..].iter().map(|a| i64::from(a.size)).product();
    let total = mesh.size() as i64;
    let groups = (0..total)
        .filter(|p| (p / stride) % size == 0)
        .map(|first| (0..size).map(|i| first + i * stride).collect())
        .collect();
    Ok(groups)
}

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`.
pub(super) fn dense_table(rows: &[Vec<i64>]) -> String {
    let inner: Vec<String> =
        rows.iter().map(|r| format!("[{}]", r.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))).collect();
    let cols = rows.first().map_or(0, Vec::len);
    format!("dense<[{}]> : tensor<{}x{cols}xi64>", inner.join(", "), rows.len())
}

/// `#sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>, …]>`.
fn per_value(shardings: &[Sharding]) -> String {
    let each: Vec<String> =
        shardings.iter().map(|s| shardy_sharding(s).trim_start_matches("#sdy.sharding").to_string()).collect();
    format!("#sdy.sharding_per_value<[{}]>", each.join(", "))
}

impl<'c, 'a> Emitter<'c, 'a> {
    /// Lowers node `d.node` of `g` as its manual region and binds its result.
    pub(super) fn lower_dispatch(&mut self, g: &Graph, mesh: &Mesh, d: &ExpertDispatch) -> Result<(), EmitError> {
        let node = &g.nodes[d.node];
        let ins: Vec<T<'c, 'a>> = node.inputs.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        let out = node.outputs[0];
        let y = self.expert_dispatch(mesh, d, &ins, self.cdt(g.ty(out).dtype))?;
        self.values.insert(out, y);
        Ok(())
    }

    /// The grouped matmul `d.node` as a manual region (see the module doc):
    /// `x [S, K]` rows split over `d.axis`, `w [E, K, N]` split by expert,
    /// `offs [E]` whole; the result `[S, N]` rows split.
    pub(super) fn expert_dispatch(
        &self,
        mesh: &Mesh,
        d: &ExpertDispatch,
        ins: &[T<'c, 'a>],
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let [x, w, offs] = ins else { return Err(err("grouped_matmul takes x, w and offsets")) };
        let (c, l) = (d.local_rows(), d.local_experts());
        let local = [(vec![c, d.k], x.dt), (vec![l, d.k, d.cols], w.dt), (offs.shape.clone(), offs.dt)];
        let types =
            local.iter().map(|(s, dt)| super::text::parse_type(self.ctx, s, *dt)).collect::<Result<Vec<_>, _>>()?;
        let region = Region::new();
        let block = region.append_block(Block::new(&types.iter().map(|&t| (t, self.loc)).collect::<Vec<_>>()));
        {
            let e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
            let arg = |i: usize| -> Result<T<'c, '_>, EmitError> {
                let v: Value = block.argument(i).map_err(mlir_err)?.into();
                Ok(T { v, shape: local[i].0.clone(), dt: local[i].1 })
            };
            let y = match d.exchange {
                Exchange::AllToAll => e.dispatch_body(mesh, d, &arg(0)?, &arg(1)?, &arg(2)?, out_dt)?,
                Exchange::AllReduce => e.all_reduce_body(mesh, d, &arg(0)?, &arg(1)?, &arg(2)?, out_dt)?,
            };
            block.append_operation(
                OperationBuilder::new("sdy.return", self.loc).add_operands(&[y.v]).build().map_err(mlir_err)?,
            );
        }
        let rows = d.rows_sharding();
        let in_shardings =
            per_value(&[rows.clone(), Sharding::split(3, 0, &d.axis), Sharding::replicated(offs.shape.len())]);
        let axes: Vec<String> = mesh.axes.iter().map(|a| format!("\"{}\"", a.name)).collect();
        let attrs = [
            ("in_shardings", in_shardings),
            ("out_shardings", per_value(&[rows])),
            ("manual_axes", format!("#sdy<manual_axes{{{}}}>", axes.join(", "))),
        ];
        self.op_with_regions("sdy.manual_computation", &[x, w, offs], &[d.rows, d.cols], out_dt, &attrs, vec![region])
    }

    /// One device's part: send, multiply by the local experts, send back,
    /// keep each row's one product.
    fn dispatch_body(
        &self,
        mesh: &Mesh,
        d: &ExpertDispatch,
        x: &T<'c, 'a>,
        w: &T<'c, 'a>,
        offs: &T<'c, 'a>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (n, c, l, e) = (d.devices, d.local_rows(), d.local_experts(), d.experts);
        let i64s = DType::I64;
        let me = self.axis_index(mesh, &d.axis, n)?;

        // Expert blocks: rows [starts[e], ends[e]); device j owns experts
        // j·L .. (j+1)·L, so rows [starts[j·L], ends[(j+1)·L - 1]).
        let ends = self.convert(offs, i64s)?;
        let starts = self.expert_starts(&ends)?;
        let every_lth = |t: &T<'c, 'a>, from: i64| {
            self.op(
                "stablehlo.slice",
                &[t],
                &[n],
                i64s,
                &[("start_indices", arr(&[from])), ("limit_indices", arr(&[e])), ("strides", arr(&[l]))],
            )
        };
        let (lo, hi) = (every_lth(&starts, 0)?, every_lth(&ends, l - 1)?);

        // Send: slot j holds the local rows device j's experts take, the
        // others zero (worst-case capacity: all C rows fit in every slot).
        let slots = [n, c];
        let first = self.binary("multiply", &me, &self.scalar(c as f64, i64s)?)?;
        let local_rows = self.op("stablehlo.iota", &[], &slots, i64s, &[("iota_dimension", "1 : i64".into())])?;
        let global = self.binary("add", &local_rows, &self.bcast_dims(&first, &slots, &[])?)?;
        let inside = self.binary(
            "and",
            &self.compare("GE", &global, &self.bcast_dims(&lo, &slots, &[0])?)?,
            &self.compare("LT", &global, &self.bcast_dims(&hi, &slots, &[0])?)?,
        )?;
        let send_shape = [n, c, d.k];
        let send = self.select(
            &self.bcast_dims(&inside, &send_shape, &[0, 1])?,
            &self.bcast_dims(x, &send_shape, &[1, 2])?,
            &self.scalar(0.0, x.dt)?,
        )?;
        let groups = axis_groups(mesh, &d.axis)?;
        let received = self.all_to_all(&send, n, &groups, 1)?;

        // Received: slot i holds source i's rows, which are global rows
        // i·C .. (i+1)·C, so the slots in order are the S rows, ours kept.
        let rows = self.reshape(&received, &[d.rows, d.k])?;
        let y = self.local_experts(d, &rows, w, &starts, &ends, &me, out_dt)?;

        // Back: slot i of the products goes to source i; each row then has
        // its owner's product and zeros from every other device.
        let back = self.all_to_all(&self.reshape(&y, &[n, c, d.cols])?, n, &groups, 2)?;
        let y = self.reduce(&back, &[0], ReduceKind::Sum)?;
        if y.shape != [c, d.cols] {
            return Err(err(format!("expert dispatch produced {:?}, expected [{c}, {}]", y.shape, d.cols)));
        }
        Ok(y)
    }

    /// Every row of `rows [S, K]` times its expert's weight when the expert
    /// is one of this device's `L` (`w [L, K, N]`, experts `me·L ..`), zero
    /// otherwise: the dense form over the local experts.
    #[allow(clippy::too_many_arguments)]
    fn local_experts(
        &self,
        d: &ExpertDispatch,
        rows: &T<'c, 'a>,
        w: &T<'c, 'a>,
        starts: &T<'c, 'a>,
        ends: &T<'c, 'a>,
        me: &T<'c, 'a>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (l, i64s) = (d.local_experts(), DType::I64);
        let products = self.dot(rows, w, &[], &[], &[1], &[1])?;
        let my_first = self.binary("multiply", me, &self.scalar(l as f64, i64s)?)?;
        let mine = |t: &T<'c, 'a>| {
            self.op("stablehlo.dynamic_slice", &[t, &my_first], &[l], i64s, &[("slice_sizes", arr(&[l]))])
        };
        let (my_starts, my_ends) = (mine(starts)?, mine(ends)?);
        let grid = [d.rows, l];
        let row = self.op("stablehlo.iota", &[], &grid, i64s, &[("iota_dimension", "0 : i64".into())])?;
        let in_block = self.binary(
            "and",
            &self.compare("GE", &row, &self.bcast_dims(&my_starts, &grid, &[1])?)?,
            &self.compare("LT", &row, &self.bcast_dims(&my_ends, &grid, &[1])?)?,
        )?;
        let kept = self.select(
            &self.bcast_dims(&in_block, &[d.rows, l, d.cols], &[0, 1])?,
            &products,
            &self.scalar(0.0, products.dt)?,
        )?;
        self.convert(&self.reduce(&kept, &[1], ReduceKind::Sum)?, out_dt)
    }

    /// The all-reduce form: every row times the local experts, the devices'
    /// products (one non-zero per row) added by `all_reduce`.
    fn all_reduce_body(
        &self,
        mesh: &Mesh,
        d: &ExpertDispatch,
        x: &T<'c, 'a>,
        w: &T<'c, 'a>,
        offs: &T<'c, 'a>,
        out_dt: DType,
    ) -> Result<T<'c, 'a>, EmitError> {
        let me = self.axis_index(mesh, &d.axis, d.devices)?;
        let ends = self.convert(offs, DType::I64)?;
        let starts = self.expert_starts(&ends)?;
        let y = self.local_experts(d, x, w, &starts, &ends, &me, out_dt)?;
        let region = self.reducer("add", y.dt)?;
        let groups = axis_groups(mesh, &d.axis)?;
        self.op_with_regions(
            "stablehlo.all_reduce",
            &[&y],
            &y.shape,
            y.dt,
            &[
                ("replica_groups", dense_table(&groups)),
                ("channel_handle", "#stablehlo.channel_handle<handle = 1, type = 1>".into()),
                ("use_global_device_ids", "unit".into()),
            ],
            vec![region],
        )
    }

    /// This device's place along `axis` (i64), from `partition_id`.
    pub(super) fn axis_index(&self, mesh: &Mesh, axis: &str, size: i64) -> Result<T<'c, 'a>, EmitError> {
        let at = mesh.axes.iter().position(|a| a.name == axis).ok_or_else(|| err("no mesh axis"))?;
        let stride: i64 = mesh.axes[at + 1..].iter().map(|a| i64::from(a.size)).product();
        let pid = self.partition_id()?;
        let me = self.binary("divide", &pid, &self.scalar(stride as f64, DType::I64)?)?;
        self.binary("remainder", &me, &self.scalar(size as f64, DType::I64)?)
    }

    /// `stablehlo.partition_id` (a `ui32`, which kiln's dtypes lack) as i64.
    fn partition_id(&self) -> Result<T<'c, 'a>, EmitError> {
        let ui32 = Type::parse(self.ctx, "tensor<ui32>").ok_or_else(|| err("cannot parse tensor<ui32>"))?;
        let op =
            OperationBuilder::new("stablehlo.partition_id", self.loc).add_results(&[ui32]).build().map_err(mlir_err)?;
        let id: Value = self.block.append_operation(op).result(0).map_err(mlir_err)?.into();
        let i64_type = super::text::parse_type(self.ctx, &[], DType::I64)?;
        let op = OperationBuilder::new("stablehlo.convert", self.loc)
            .add_operands(&[id])
            .add_results(&[i64_type])
            .build()
            .map_err(mlir_err)?;
        let v: Value = self.block.append_operation(op).result(0).map_err(mlir_err)?.into();
        Ok(T { v, shape: vec![], dt: DType::I64 })
    }

    /// `stablehlo.all_to_all` over dim 0 (split and concatenated there).
    fn all_to_all(&self, t: &T<'c, 'a>, n: i64, groups: &[Vec<i64>], handle: i64) -> Result<T<'c, 'a>, EmitError> {
        self.op(
            "stablehlo.all_to_all",
            &[t],
            &t.shape,
            t.dt,
            &[
                ("split_dimension", "0 : i64".into()),
                ("concat_dimension", "0 : i64".into()),
                ("split_count", format!("{n} : i64")),
                ("replica_groups", dense_table(groups)),
                ("channel_handle", format!("#stablehlo.channel_handle<handle = {handle}, type = 1>")),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_the_axis() {
        let mesh = Mesh::new(&[("data", 2), ("model", 4)]);
        assert_eq!(axis_groups(&mesh, "model").ok(), Some(vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]));
        assert_eq!(axis_groups(&mesh, "data").ok(), Some(vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]));
        assert_eq!(dense_table(&[vec![0, 2], vec![1, 3]]), "dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>");
        let s = per_value(&[Sharding::split(2, 0, "x"), Sharding::replicated(1)]);
        assert_eq!(s, "#sdy.sharding_per_value<[<@mesh, [{\"x\"}, {}]>, <@mesh, [{}]>]>");
    }
}
