//! Indexing: `stablehlo.gather` forms for advanced indexing
//! (`Op::IndexGather`) and `torch.gather` (`Op::GatherElements`), with
//! torch's negative indices wrapped first because the gather would clamp
//! them.

use super::text::{arr, list};
use super::{err, EmitError, Emitter, T};
use kiln_ir::DType;

impl<'c, 'a> Emitter<'c, 'a> {
    /// Torch's negative indices count from the end of a dimension of size
    /// `dim`; `stablehlo.gather` would clamp them to 0 instead.
    pub(super) fn wrap_index(&self, i: &T<'c, 'a>, dim: i64) -> Result<T<'c, 'a>, EmitError> {
        let negative = self.compare("LT", i, &self.scalar(0.0, i.dt)?)?;
        let wrapped = self.binary("add", i, &self.scalar(dim as f64, i.dt)?)?;
        self.select(&negative, &wrapped, i)
    }

    /// One `stablehlo.gather` with full coordinates: `columns` (each shaped
    /// `B ++ [1]`) are concatenated into `B ++ [k]` index vectors addressing
    /// `data` axes `first..first+k`, which are collapsed; the other axes of
    /// `data` are taken whole, placed around `B` as `offset` says.
    pub(super) fn gather_columns(
        &self,
        data: &T<'c, 'a>,
        columns: &[T<'c, 'a>],
        first: usize,
        offset: &[i64],
        out_shape: &[i64],
    ) -> Result<T<'c, 'a>, EmitError> {
        let k = columns.len();
        let batch = columns
            .first()
            .map(|c| c.shape[..c.shape.len() - 1].to_vec())
            .ok_or_else(|| err("gather without indices"))?;
        let mut ishape = batch.clone();
        ishape.push(k as i64);
        let refs: Vec<&T<'c, 'a>> = columns.iter().collect();
        let ivd = batch.len();
        let index = if k == 1 {
            columns[0].clone()
        } else {
            self.op("stablehlo.concatenate", &refs, &ishape, columns[0].dt, &[("dimension", format!("{ivd} : i64"))])?
        };
        let addressed: Vec<i64> = (first as i64..(first + k) as i64).collect();
        let mut sizes = data.shape.clone();
        sizes[first..first + k].fill(1);
        let mut dn = Vec::new();
        if !offset.is_empty() {
            dn.push(format!("offset_dims = {}", list(offset)));
        }
        dn.push(format!("collapsed_slice_dims = {}", list(&addressed)));
        dn.push(format!("start_index_map = {}", list(&addressed)));
        dn.push(format!("index_vector_dim = {ivd}"));
        self.op(
            "stablehlo.gather",
            &[data, &index],
            out_shape,
            data.dt,
            &[
                ("dimension_numbers", format!("#stablehlo.gather<{}>", dn.join(", "))),
                ("slice_sizes", arr(&sizes)),
                ("indices_are_sorted", "false".into()),
            ],
        )
    }

    /// Advanced indexing (`Op::IndexGather`): the index tensors (one shape
    /// `B`) address axes `axis..axis+k`; the result is
    /// `data.shape[..axis] ++ B ++ data.shape[axis+k..]`.
    pub(super) fn index_gather(
        &self,
        data: &T<'c, 'a>,
        indices: &[T<'c, 'a>],
        axis: usize,
        out_shape: &[i64],
    ) -> Result<T<'c, 'a>, EmitError> {
        let (k, rd) = (indices.len(), data.shape.len());
        if k == 0 || axis + k > rd {
            return Err(err("index_gather: index tensors do not fit the data's rank"));
        }
        let mut columns = Vec::with_capacity(k);
        for (m, i) in indices.iter().enumerate() {
            let mut shape = i.shape.clone();
            shape.push(1);
            columns.push(self.reshape(&self.wrap_index(i, data.shape[axis + m])?, &shape)?);
        }
        let (a, rb) = (axis as i64, indices[0].shape.len() as i64);
        let offset: Vec<i64> = (0..a).chain(a + rb..rd as i64 - k as i64 + rb).collect();
        self.gather_columns(data, &columns, axis, &offset, out_shape)
    }

    /// `index_put` (`Op::IndexPut`, also `index_copy`): one
    /// `stablehlo.scatter` writing (or, with `accumulate`, adding) `values`
    /// — shaped `data.shape[..axis] ++ B ++ data.shape[axis+k..]` — at the
    /// positions the index tensors (one shape `B`, negative ones wrapped)
    /// address on axes `axis..axis+k`. An out-of-range index writes nothing
    /// (StableHLO's rule; the CPU kernel reports an error).
    pub(super) fn index_put(
        &self,
        data: &T<'c, 'a>,
        values: &T<'c, 'a>,
        indices: &[T<'c, 'a>],
        axis: usize,
        accumulate: bool,
    ) -> Result<T<'c, 'a>, EmitError> {
        let (k, rd) = (indices.len(), data.shape.len());
        if k == 0 || axis + k > rd || indices.iter().any(|i| i.shape != indices[0].shape) {
            return Err(err("index_put: index tensors of one shape that fit the data's rank"));
        }
        let batch = indices[0].shape.clone();
        let mut want = data.shape[..axis].to_vec();
        want.extend_from_slice(&batch);
        want.extend_from_slice(&data.shape[axis + k..]);
        if values.shape != want {
            return Err(err(format!("index_put: values shaped {:?}, expected {want:?}", values.shape)));
        }
        let mut columns = Vec::with_capacity(k);
        for (m, i) in indices.iter().enumerate() {
            let mut shape = i.shape.clone();
            shape.push(1);
            columns.push(self.reshape(&self.wrap_index(i, data.shape[axis + m])?, &shape)?);
        }
        let ivd = batch.len();
        let mut ishape = batch.clone();
        ishape.push(k as i64);
        let refs: Vec<&T<'c, 'a>> = columns.iter().collect();
        let index = if k == 1 {
            columns[0].clone()
        } else {
            self.op("stablehlo.concatenate", &refs, &ishape, columns[0].dt, &[("dimension", format!("{ivd} : i64"))])?
        };
        let (a, rb) = (axis as i64, batch.len() as i64);
        let window: Vec<i64> = (0..a).chain(a + rb..rd as i64 - k as i64 + rb).collect();
        let addressed: Vec<i64> = (a..a + k as i64).collect();
        let mut dn = Vec::new();
        if !window.is_empty() {
            dn.push(format!("update_window_dims = {}", list(&window)));
        }
        dn.push(format!("inserted_window_dims = {}", list(&addressed)));
        dn.push(format!("scatter_dims_to_operand_dims = {}", list(&addressed)));
        dn.push(format!("index_vector_dim = {ivd}"));
        let values = self.convert(values, data.dt)?;
        let combiner = if accumulate {
            self.reducer(if data.dt == DType::Bool { "or" } else { "add" }, data.dt)?
        } else {
            self.replacer(data.dt)?
        };
        self.op_with_regions(
            "stablehlo.scatter",
            &[data, &index, &values],
            &data.shape.clone(),
            data.dt,
            &[
                ("scatter_dimension_numbers", format!("#stablehlo.scatter<{}>", dn.join(", "))),
                ("indices_are_sorted", "false".into()),
                ("unique_indices", "false".into()),
            ],
            vec![combiner],
        )
    }

    /// `torch.gather` (`Op::GatherElements`): every output position `p`
    /// reads `data[p with p[axis] = index[p]]`, so its coordinates are iotas
    /// on the other axes and the (wrapped) index on `axis`.
    pub(super) fn gather_elements(
        &self,
        data: &T<'c, 'a>,
        index: &T<'c, 'a>,
        axis: usize,
        out_shape: &[i64],
    ) -> Result<T<'c, 'a>, EmitError> {
        let r = index.shape.len();
        if r != data.shape.len() || axis >= r {
            return Err(err("gather_elements: index rank differs from the data's"));
        }
        let mut shape = index.shape.clone();
        shape.push(1);
        let mut columns = Vec::with_capacity(r);
        for d in 0..r {
            columns.push(if d == axis {
                self.reshape(&self.wrap_index(index, data.shape[axis])?, &shape)?
            } else {
                self.op("stablehlo.iota", &[], &shape, index.dt, &[("iota_dimension", format!("{d} : i64"))])?
            });
        }
        self.gather_columns(data, &columns, 0, &[], out_shape)
    }
}
