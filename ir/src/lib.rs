//! kiln's graph IR.
//!
//! Values, nodes, constants and symbols are typed `u32` ids into arenas
//! ([`PrimaryMap`]). Attributes that must survive rewrites (a value's
//! origin and sharding; later quantization parameters) live on the value
//! ([`ValueAttrs`]); data a pass computes and consumes at once (memory
//! plans) lives in secondary maps owned by whoever computes it.

pub mod builder;
mod dim;
mod dtype;
mod graph;
#[macro_use]
mod op_table;
mod op;
mod shard;

pub mod filetest;
pub mod infer;
pub mod text;
pub mod verify;

mod entity;

pub use builder::Builder;
pub use dim::{Dim, DimDisplay, Symbol};
pub use dtype::DType;
use entity::entity_id;
pub use entity::{EntityRef, PrimaryMap, SecondaryMap};
pub use graph::ValueAttrs;
pub use graph::{ConstBytes, ConstData, Graph, Location, NodeData, StateSlot, TensorType, ValueData, ValueDef};
/// The f32 constants of GPT-2's `gelu_new` chain, which the epilogue
/// fusion pass recognises and [`Activation::GeluTanhChain`] computes.
pub use kiln_isa::epilogue::gelu_tanh_chain;
/// The most operands and ops one `Op::Fused` program may have (the fused
/// kernel's register file).
pub use kiln_isa::fused::{MAX_FUSED_INPUTS, MAX_FUSED_OPS};
/// The coefficients of the kernels' vectorised f32 math, which the native
/// code generator evaluates in the same order (one table, no copies).
pub use kiln_isa::math;
/// The most results of one [`Op::LinearSplit`] (its instruction's output limit).
pub use kiln_isa::opcode::LINEAR_SPLIT_MAX;
/// The register dtypes of a fused program, or why it is ill-formed.
pub use kiln_isa::register_types as fused_register_types;
pub use op::{text_forms as op_text_forms, OpKind};
pub use op::{
    Activation, BinaryOp, Epilogue, FusedOp, Layout, LinalgOp, Op, PadMode, PoolKind, QParams, RandomDist, ReduceKind,
    Region, Residual, ResizeMode, ScanKind, UnaryOp,
};
pub use shard::{is_axis_name, Mesh, MeshAxis, Sharding};

entity_id!(
    /// A tensor value (graph input, node output or constant).
    ValueId, "v"
);
entity_id!(
    /// An operation in the graph.
    NodeId, "n"
);
entity_id!(
    /// A constant's bytes (weights, literals).
    ConstId, "c"
);
entity_id!(
    /// A shape symbol.
    SymbolId, "s"
);
entity_id!(
    /// A source location.
    LocId, "loc"
);
