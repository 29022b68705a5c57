//! torch's `while_loop` ([`Op::While`]) as one `stablehlo.while`, so a loop
//! stays inside its accelerator segment instead of splitting it.
//!
//! `stablehlo.while` carries every operand: the loop's carried values first,
//! then its read-only ones, which the body passes through unchanged. The
//! condition region returns a rank-0 `i1` (the IR's condition is a 1-element
//! bool of any rank, reshaped); the body returns the new carried values then
//! the read-only ones. Nested graphs take all operands as their inputs, so
//! the regions capture nothing; their constants are written inline.

use super::{err, mlir_err, EmitError, Emitter, T};
use kiln_ir::{DType, Graph, NodeId, Op};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::RegionLike;
use melior::ir::{Block, Region, Type, Value};
use std::collections::HashMap;

impl<'c, 'a> Emitter<'c, 'a> {
    /// Emits [`Op::While`] node `n` of `g` and binds its results.
    pub(super) fn lower_while(&mut self, g: &Graph, n: NodeId) -> Result<(), EmitError> {
        let node = &g.nodes[n];
        let Op::While { carried, cond, body } = &node.op else { return Err(err("not a while loop")) };
        let carried = *carried;
        let ins: Vec<T<'c, 'a>> = node.inputs.iter().map(|&v| self.get(v)).collect::<Result<_, _>>()?;
        if node.outputs.len() != carried || carried > ins.len() {
            return Err(err("a while loop's results must be its carried values"));
        }
        let types: Vec<(Vec<i64>, DType)> = ins.iter().map(|t| (t.shape.clone(), t.dt)).collect();
        let mlir_types: Vec<Type<'c>> =
            types.iter().map(|(s, d)| super::text::parse_type(self.ctx, s, *d)).collect::<Result<_, _>>()?;

        let cond_region = self.loop_region(cond, &types, &mlir_types, |e, outs| {
            let pred = outs.first().ok_or_else(|| err("a loop condition returns one value"))?;
            if pred.dt != DType::Bool || pred.shape.iter().product::<i64>() != 1 {
                return Err(err("a loop condition must be a 1-element bool"));
            }
            Ok(vec![e.reshape(pred, &[])?.v])
        })?;
        let body_region = self.loop_region(body, &types, &mlir_types, |e, outs| {
            if outs.len() != carried {
                return Err(err("a loop body returns one value per carried value"));
            }
            let mut values = Vec::with_capacity(types.len());
            for (t, (_, dt)) in outs.iter().zip(&types) {
                values.push(e.convert(t, *dt)?.v);
            }
            // The read-only operands go round unchanged.
            for i in carried..types.len() {
                values.push(e.block.argument(i).map_err(mlir_err)?.into());
            }
            Ok(values)
        })?;

        let operands: Vec<Value> = ins.iter().map(|t| t.v).collect();
        let op = OperationBuilder::new("stablehlo.while", self.loc)
            .add_operands(&operands)
            .add_results(&mlir_types)
            .add_regions([cond_region, body_region])
            .build()
            .map_err(mlir_err)?;
        let r = self.block.append_operation(op);
        for (k, &out) in node.outputs.iter().enumerate() {
            let v: Value = r.result(k).map_err(mlir_err)?.into();
            let (shape, dt) = types[k].clone();
            self.values.insert(out, T { v, shape, dt });
        }
        Ok(())
    }

    /// One region of a loop: a block taking every loop operand (`types`),
    /// bound to `nested`'s inputs, `nested`'s nodes lowered into it, and a
    /// `stablehlo.return` of what `finish` makes of `nested`'s outputs.
    fn loop_region(
        &self,
        nested: &Graph,
        types: &[(Vec<i64>, DType)],
        mlir_types: &[Type<'c>],
        finish: impl for<'b> FnOnce(&Emitter<'c, 'b>, &[T<'c, 'b>]) -> Result<Vec<Value<'c, 'b>>, EmitError>,
    ) -> Result<Region<'c>, EmitError> {
        if nested.inputs.len() != types.len() {
            return Err(err(format!(
                "a loop region takes {} inputs but the loop has {} operands",
                nested.inputs.len(),
                types.len()
            )));
        }
        let region = Region::new();
        let block = region.append_block(Block::new(&mlir_types.iter().map(|&t| (t, self.loc)).collect::<Vec<_>>()));
        {
            let mut e = Emitter { ctx: self.ctx, block, loc: self.loc, bf16: self.bf16, values: HashMap::new() };
            for (i, (&v, (shape, dt))) in nested.inputs.iter().zip(types).enumerate() {
                let arg: Value = block.argument(i).map_err(mlir_err)?.into();
                e.values.insert(v, T { v: arg, shape: shape.clone(), dt: *dt });
            }
            for &m in &nested.order {
                for &v in &nested.nodes[m].inputs {
                    if e.values.contains_key(&v) {
                        continue;
                    }
                    if let Some(c) = nested.const_of(v) {
                        let t = e.inline_const(nested, c)?;
                        let t = e.convert(&t, e.cdt(nested.ty(v).dtype))?;
                        e.values.insert(v, t);
                    }
                }
                e.lower_node(nested, m)?;
            }
            let outs: Vec<T<'c, '_>> = nested.outputs.iter().map(|&v| e.get(v)).collect::<Result<_, _>>()?;
            let values = finish(&e, &outs)?;
            block.append_operation(
                OperationBuilder::new("stablehlo.return", self.loc).add_operands(&values).build().map_err(mlir_err)?,
            );
        }
        Ok(region)
    }
}
