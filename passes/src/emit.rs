//! Emitting the nodes a decomposition builds.
//!
//! [`Emitter::emit`] infers the new node's type, and when the target lacks the op it
//! decomposes that one too, so a rule may freely use other composites
//! (attention emits a softmax) and still yield only what the target keeps.

use crate::decompose::expand_op;
use crate::host::scalar_const;
use crate::{PassError, TargetDesc};
use kiln_ir::builder::infer_one;
use kiln_ir::{Builder, DType, Graph, LocId, Op, TensorType, ValueId};

pub(crate) const PASS: &str = "decompose";

pub(crate) struct Emitter<'g> {
    pub g: &'g mut Graph,
    pub target: &'g TargetDesc,
    /// The replaced node's location, inherited by everything built for it.
    pub loc: Option<LocId>,
}

impl Emitter<'_> {
    pub fn ty(&self, v: ValueId) -> TensorType {
        self.g.ty(v).clone()
    }

    /// Adds `op` with its result type inferred ([`Builder::push`]), first
    /// decomposing it when the target does not keep it.
    pub fn push(&mut self, op: Op, inputs: Vec<ValueId>) -> Result<ValueId, PassError> {
        let ty = infer_one(self.g, &op, &inputs).map_err(|e| PassError::new(PASS, e))?;
        if !self.target.keeps(&op) {
            if let Some(v) = expand_op(self, &op, &inputs, &ty)? {
                return Ok(v);
            }
        }
        Ok(Builder::new(self.g, self.loc).push_typed(op, inputs, ty))
    }

    pub fn binary(&mut self, op: kiln_ir::BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId, PassError> {
        self.push(Op::Binary(op), vec![a, b])
    }

    pub fn unary(&mut self, op: kiln_ir::UnaryOp, x: ValueId) -> Result<ValueId, PassError> {
        self.push(Op::Unary(op), vec![x])
    }

    pub fn reduce(
        &mut self,
        kind: kiln_ir::ReduceKind,
        x: ValueId,
        axes: Vec<usize>,
        keep_dims: bool,
    ) -> Result<ValueId, PassError> {
        self.push(Op::Reduce { kind, axes, keep_dims }, vec![x])
    }

    pub fn scalar(&mut self, dtype: DType, value: f64) -> ValueId {
        scalar_const(self.g, dtype, value)
    }
}
