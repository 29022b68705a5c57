//! Where kiln partitions by hand: expert parallelism with tokens dispatched
//! to their experts' devices by all-to-all.
//!
//! A grouped matmul whose experts' weight `[E, K, N]` is split by expert over
//! one mesh axis of `n` devices (and nothing else), with `S` rows (tokens ×
//! top-k, sorted by expert) that `n` divides, becomes a manual region over
//! the whole mesh: each device holds `C = S / n` rows and `E / n` experts;
//! it sends every row to the device owning the row's expert (a buffer of
//! `n × C` rows: worst-case capacity, every row could go to one device, so
//! none is dropped), multiplies what it received by its own experts, sends
//! the products back the same way and keeps, per row, the one product its
//! owner sent (the others are zeros). Each row's result is the one product
//! one device computes, so results equal one device's.
//!
//! When `n` does not divide the rows, the region keeps every row on every
//! device instead: each multiplies all rows by its own experts (zeros for
//! rows of other devices' experts) and one `all_reduce` adds the devices'
//! products — exact, since each row has one non-zero term.
//!
//! Propagation gives such a node row-split operands and result (whole ones
//! for the all-reduce form; no partial sum either way), the cost model
//! counts the region's collectives, and the StableHLO emitter writes the
//! region (`sdy.manual_computation`).

use super::propagate::Collective;
use kiln_ir::{Graph, NodeId, Op, Sharding};

/// How a region's devices exchange rows and products.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Exchange {
    /// Rows split over the axis, sent to their experts and back.
    AllToAll,
    /// Every row on every device, the products summed.
    AllReduce,
}

/// A grouped matmul partitioned by hand over `axis` (split by expert).
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertDispatch {
    pub node: NodeId,
    pub axis: String,
    pub exchange: Exchange,
    /// Devices along `axis`.
    pub devices: i64,
    /// Rows `S`, contraction `K`, columns `N`, experts `E`.
    pub rows: i64,
    pub k: i64,
    pub cols: i64,
    pub experts: i64,
    /// Bytes of one element of the rows (and of the products).
    pub elem_bytes: u64,
}

/// One collective a manual region runs, with the bytes each device sends.
#[derive(Clone, Debug, PartialEq)]
pub struct ManualCollective {
    pub collective: Collective,
    pub axis: String,
    /// What it carries, for the report.
    pub what: String,
    pub bytes_per_device: u64,
}

impl ExpertDispatch {
    /// `Some` when node `n` is dispatched by hand (see the module doc).
    pub fn of(g: &Graph, n: NodeId) -> Option<ExpertDispatch> {
        let node = &g.nodes[n];
        if node.op != Op::GroupedMatMul || node.inputs.len() != 3 || node.outputs.len() != 1 {
            return None;
        }
        let (x, w) = (node.inputs[0], node.inputs[1]);
        let ws = g.values[w].attrs.sharding.as_ref()?;
        let [experts_axes, k_axes, n_axes] = ws.dims.as_slice() else { return None };
        let [axis] = experts_axes.as_slice() else { return None };
        if !k_axes.is_empty() || !n_axes.is_empty() || !ws.partial.is_empty() {
            return None;
        }
        let devices = i64::from(g.mesh.as_ref()?.axis(axis)?.size);
        let (&[rows, k], &[experts, _, cols]) =
            (g.ty(x).static_shape()?.as_slice(), g.ty(w).static_shape()?.as_slice())
        else {
            return None;
        };
        if devices < 2 || experts % devices != 0 || !g.ty(x).dtype.is_float() {
            return None;
        }
        let exchange = if rows % devices == 0 { Exchange::AllToAll } else { Exchange::AllReduce };
        let elem_bytes = g.ty(node.outputs[0]).dtype.size_bytes() as u64;
        Some(ExpertDispatch { node: n, axis: axis.clone(), exchange, devices, rows, k, cols, experts, elem_bytes })
    }

    /// Rows each device holds.
    pub fn local_rows(&self) -> i64 {
        match self.exchange {
            Exchange::AllToAll => self.rows / self.devices,
            Exchange::AllReduce => self.rows,
        }
    }

    /// Experts each device holds.
    pub fn local_experts(&self) -> i64 {
        self.experts / self.devices
    }

    /// The rows' and the result's sharding: rows split over the axis (or
    /// whole, for the all-reduce form).
    pub fn rows_sharding(&self) -> Sharding {
        match self.exchange {
            Exchange::AllToAll => Sharding::split(2, 0, &self.axis),
            Exchange::AllReduce => Sharding::replicated(2),
        }
    }

    /// The dispatch and the return: each device sends `n × C` rows of `K`
    /// (then `N`) values, all but its own `C` rows to other devices; or one
    /// ring all-reduce of the `S × N` products.
    pub fn collectives(&self) -> Vec<ManualCollective> {
        let (n, c) = (self.devices, self.local_rows());
        let one = |collective, what: &str, bytes: i64| ManualCollective {
            collective,
            axis: self.axis.clone(),
            what: format!("{what} over `{}` ({c} of {} rows", self.axis, self.rows),
            bytes_per_device: bytes as u64 * self.elem_bytes,
        };
        match self.exchange {
            Exchange::AllToAll => {
                let capacity = format!(", capacity {c} rows per device pair; B each device sends)");
                let mut out = vec![
                    one(Collective::AllToAll, "dispatch rows to their experts", (n - 1) * c * self.k),
                    one(Collective::AllToAll, "products back to their rows", (n - 1) * c * self.cols),
                ];
                for o in &mut out {
                    o.what.push_str(&capacity);
                }
                out
            }
            Exchange::AllReduce => {
                let mut sum = one(Collective::AllReduce, "products summed", 2 * (n - 1) * c * self.cols / n);
                sum.what.push_str(&format!("; {n} does not divide them; B each device sends)"));
                vec![sum]
            }
        }
    }
}

impl ExpertDispatch {
    /// `Some` when propagation planned node `n` as dispatched by hand (rows
    /// split in and out; without `ShardOptions::manual_regions` it leaves a
    /// partial sum instead).
    pub fn planned(g: &Graph, n: NodeId) -> Option<ExpertDispatch> {
        let d = ExpertDispatch::of(g, n)?;
        let out = g.values[g.nodes[n].outputs[0]].attrs.sharding.as_ref()?;
        (*out == d.rows_sharding()).then_some(d)
    }
}

/// Every node of `g` planned as dispatched by hand, in schedule order.
pub fn expert_dispatches(g: &Graph) -> Vec<ExpertDispatch> {
    g.order.iter().filter_map(|&n| ExpertDispatch::planned(g, n)).collect()
}
