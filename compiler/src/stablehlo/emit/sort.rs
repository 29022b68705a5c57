//! Sorting and scattering for the ops a mixture-of-experts router uses:
//! [`Op::Sort`] (sort, argsort, topk) as one stable `stablehlo.sort` of the
//! data beside an iota of positions, and [`Op::ScatterElements`] (histc's
//! counts, `scatter_add`) as one `stablehlo.scatter` over full coordinates.
//!
//! [`Op::Sort`]: kiln_ir::Op::Sort
//! [`Op::ScatterElements`]: kiln_ir::Op::ScatterElements

use super::text::{arr, list, parse_type};
use super::{err, mlir_err, EmitError, Emitter, T};
use kiln_ir::{DType, ReduceKind};
use melior::ir::attribute::IntegerAttribute;
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::IntegerType;
use melior::ir::RegionLike;
use melior::ir::{Attribute, Block, Identifier, Region, Value};
use std::collections::HashMap;

impl<'c, 'a> Emitter<'c, 'a> {
    /// The first `k` elements of `x` along `axis` in sorted order, as the CPU
    /// kernel orders them: stable (ties keep their positions), NaN above
    /// everything (last ascending, first descending); their values, or with
    /// `indices` their positions (i64).
    pub(super) fn sort(
        &self,
        x: &T<'c, 'a>,
        axis: usize,
        descending: bool,
        indices: bool,
        out_shape: &[i64],
    ) -> Result<T<'c, 'a>, EmitError> {
        let r = x.shape.len();
        if axis >= r || out_shape.len() != r {
            return Err(err("sort axis out of range"));
        }
        let positions =
            self.op("stablehlo.iota", &[], &x.shape, DType::I64, &[("iota_dimension", format!("{axis} : i64"))])?;
        let types = [parse_type(self.ctx, &x.shape, x.dt)?, parse_type(self.ctx, &x.shape, DType::I64)?];
        let i1 = IntegerType::new(self.ctx, 1).into();
        let i64t = IntegerType::new(self.ctx, 64).into();
        let op = OperationBuilder::new("stablehlo.sort", self.loc)
            .add_operands(&[x.v, positions.v])
            .add_results(&types)
            .add_attributes(&[
                (Identifier::new(self.ctx, "dimension"), IntegerAttribute::new(i64t, axis as i64).into()),
                (Identifier::new(self.ctx, "is_stable"), Attribute::from(IntegerAttribute::new(i1, 1))),
            ])
            .add_regions([self.sort_comparator(x.dt, descending)?])
            .build()
            .map_err(mlir_err)?;
        let sorted = self.block.append_operation(op);
        let pick = usize::from(indices);
        let v: Value = sorted.result(pick).map_err(mlir_err)?.into();
        let t = T { v, shape: x.shape.clone(), dt: if indices { DType::I64 } else { x.dt } };
        if out_shape == x.shape.as_slice() {
            return Ok(t);
        }
        let starts = vec![0; r];
        self.op(
            "stablehlo.slice",
            &[&t],
            out_shape,
            t.dt,
            &[("start_indices", arr(&starts)), ("limit_indices", arr(out_shape)), ("strides", arr(&vec![1; r]))],
        )
    }

    /// `(a, b, a's position, b's position) -> a comes first`: `a < b` (`>`
    /// descending) with NaN the largest value; equal keys keep their order
    /// through `is_stable`.
    fn sort_comparator(&self, dt: DType, descending: bool) -> Result<Region<'c>, EmitError> {
        let (st, it) = (parse_type(self.ctx, &[], dt)?, parse_type(self.ctx, &[], DType::I64)?);
        let region = Region::new();
        let block = region.append_block(Block::new(&[(st, self.loc), (st, self.loc), (it, self.loc), (it, self.loc)]));
        {
            let e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
            let arg = |i: usize| -> Result<T<'c, '_>, EmitError> {
                Ok(T { v: block.argument(i).map_err(mlir_err)?.into(), shape: vec![], dt })
            };
            let (a, b) = (arg(0)?, arg(1)?);
            let first = e.compare(if descending { "GT" } else { "LT" }, &a, &b)?;
            let first = if dt.is_float() {
                let (nan_a, nan_b) = (e.compare("NE", &a, &a)?, e.compare("NE", &b, &b)?);
                // NaN sorts as the largest value.
                let nan_first =
                    if descending { (nan_a, e.unary("not", &nan_b)?) } else { (e.unary("not", &nan_a)?, nan_b) };
                e.binary("or", &first, &e.binary("and", &nan_first.0, &nan_first.1)?)?
            } else {
                first
            };
            block.append_operation(
                OperationBuilder::new("stablehlo.return", self.loc)
                    .add_operands(&[first.v])
                    .build()
                    .map_err(mlir_err)?,
            );
        }
        Ok(region)
    }

    /// `torch.scatter`/`scatter_reduce` (`Op::ScatterElements`): `src[p]`
    /// combined into `data[p with p[axis] = index[p]]` for every `p` in
    /// `index`'s shape. Without `include_self`, the positions that receive
    /// anything start from the combiner's identity instead of `data`. Plain
    /// writes to one position from several `p` keep one of them (torch leaves
    /// which undefined); out-of-range indices write nothing (StableHLO's
    /// rule; the CPU kernel reports an error). `mean` is not lowered.
    pub(super) fn scatter_elements(
        &self,
        data: &T<'c, 'a>,
        index: &T<'c, 'a>,
        src: &T<'c, 'a>,
        axis: usize,
        reduce: Option<ReduceKind>,
        include_self: bool,
    ) -> Result<T<'c, 'a>, EmitError> {
        let r = data.shape.len();
        if index.shape.len() != r || src.shape.len() != r || axis >= r {
            return Err(err("scatter_elements: data, index and src of one rank"));
        }
        // The updates are src's part that index covers.
        let src = if src.shape == index.shape {
            self.convert(src, data.dt)?
        } else {
            let s = self.op(
                "stablehlo.slice",
                &[src],
                &index.shape,
                src.dt,
                &[
                    ("start_indices", arr(&vec![0; r])),
                    ("limit_indices", arr(&index.shape)),
                    ("strides", arr(&vec![1; r])),
                ],
            )?;
            self.convert(&s, data.dt)?
        };
        let mut coord_shape = index.shape.clone();
        coord_shape.push(1);
        let mut columns = Vec::with_capacity(r);
        for d in 0..r {
            columns.push(if d == axis {
                self.reshape(&self.wrap_index(&self.convert(index, DType::I64)?, data.shape[axis])?, &coord_shape)?
            } else {
                self.op("stablehlo.iota", &[], &coord_shape, DType::I64, &[("iota_dimension", format!("{d} : i64"))])?
            });
        }
        let mut full = index.shape.clone();
        full.push(r as i64);
        let refs: Vec<&T<'c, 'a>> = columns.iter().collect();
        let coords =
            self.op("stablehlo.concatenate", &refs, &full, DType::I64, &[("dimension", format!("{r} : i64"))])?;
        let (combiner, identity) = match reduce {
            None => (None, None),
            Some(ReduceKind::Sum) => (Some("add"), Some(0.0)),
            Some(ReduceKind::Prod) => (Some("multiply"), Some(1.0)),
            Some(ReduceKind::Max) => (Some("maximum"), Some(f64::NEG_INFINITY)),
            Some(ReduceKind::Min) => (Some("minimum"), Some(f64::INFINITY)),
            Some(ReduceKind::Mean) => return Err(err("scatter_reduce mean has no StableHLO lowering")),
        };
        let scatter = |base: &T<'c, 'a>, updates: &T<'c, 'a>, body: Option<&str>| -> Result<T<'c, 'a>, EmitError> {
            let dims: Vec<i64> = (0..r as i64).collect();
            let dn = format!(
                "#stablehlo.scatter<inserted_window_dims = {0}, scatter_dims_to_operand_dims = {0}, index_vector_dim = {r}>",
                list(&dims)
            );
            let region = match body {
                Some(op @ ("maximum" | "minimum")) if base.dt.is_float() => self.nan_combiner(op, base.dt)?,
                Some(op) => self.reducer(op, base.dt)?,
                None => self.replacer(base.dt)?,
            };
            self.op_with_regions(
                "stablehlo.scatter",
                &[base, &coords, updates],
                &base.shape.clone(),
                base.dt,
                &[
                    ("scatter_dimension_numbers", dn),
                    ("indices_are_sorted", "false".into()),
                    ("unique_indices", "false".into()),
                ],
                vec![region],
            )
        };
        let base = match identity {
            Some(id) if !include_self => {
                // Positions some update reaches start from the identity.
                let none = self.splat(0.0, &data.shape, DType::Bool)?;
                let reached = scatter(&none, &self.splat(1.0, &index.shape, DType::Bool)?, None)?;
                let id = if data.dt.is_float() { id } else { int_identity(id, data.dt) };
                self.select(&reached, &self.scalar(id, data.dt)?, data)?
            }
            _ => data.clone(),
        };
        scatter(&base, &src, combiner)
    }
}

impl<'c, 'a> Emitter<'c, 'a> {
    /// A scatter's max/min combiner that lets NaN win, as torch's
    /// `scatter_reduce` does (XLA:CPU's scatter dropped it through a plain
    /// `maximum` body).
    fn nan_combiner(&self, op: &str, dt: DType) -> Result<Region<'c>, EmitError> {
        let st = parse_type(self.ctx, &[], dt)?;
        let region = Region::new();
        let block = region.append_block(Block::new(&[(st, self.loc), (st, self.loc)]));
        {
            let e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
            let arg = |i: usize| -> Result<T<'c, '_>, EmitError> {
                Ok(T { v: block.argument(i).map_err(mlir_err)?.into(), shape: vec![], dt })
            };
            let (a, b) = (arg(0)?, arg(1)?);
            let m = e.binary(op, &a, &b)?;
            let m = e.select(&e.compare("NE", &b, &b)?, &b, &m)?;
            let m = e.select(&e.compare("NE", &a, &a)?, &a, &m)?;
            block.append_operation(
                OperationBuilder::new("stablehlo.return", self.loc).add_operands(&[m.v]).build().map_err(mlir_err)?,
            );
        }
        Ok(region)
    }
}

/// A max/min identity (±∞) as the integer dtype's extreme.
fn int_identity(id: f64, dt: DType) -> f64 {
    let (lo, hi) = match dt {
        DType::I8 => (i8::MIN as f64, i8::MAX as f64),
        DType::U8 | DType::Bool => (0.0, 255.0),
        DType::I16 => (i16::MIN as f64, i16::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        _ => (i64::MIN as f64, i64::MAX as f64),
    };
    id.clamp(lo, hi)
}
