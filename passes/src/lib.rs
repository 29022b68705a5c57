//! kiln's graph passes.
//!
//! Every pass is a plain function `fn(&mut Graph, &Options) -> Result<Changed, PassError>`
//! usable on its own ([`dce`], [`simplify`], [`fold_constants`], [`decompose`]) or
//! through the pass manager ([`run_pipeline`] over [`default_pipeline`]).
//! [`plan_memory`] is not a rewrite: it reads the final graph and assigns arena slots.
//! What a pass may assume about the target — which composites survive, which
//! dtypes its kernels take — it reads from [`Options::target`], a
//! [`TargetDesc`] ([`Target::desc`]).
//!
//! Architecture invariant: passes depend on `kiln-ir` only — constant folding carries
//! its own tiny evaluator rather than calling into kernels.

mod check;
mod compact;
mod dce;
mod decompose;
mod dims;
mod emit;
mod error;
mod eval;
mod fold;
mod fuse;
mod fuse_attention;
mod fuse_elementwise;
mod fuse_epilogue;
mod fuse_norm;
mod fuse_shared_input;
mod host;
mod layout;
mod legalize;
pub mod memory;
mod observe;
mod pipeline;
mod quant_acts;
mod quant_linear;
mod quantize;
mod rewrite;
pub mod shard;
mod simplify;
mod target;

pub use check::verify_graph;
pub use compact::compact;
pub use dce::{dce, live_consts};
pub use decompose::decompose;
pub use dims::simplify_dim;
pub use error::{Changed, PassError};
pub use fold::fold_constants;
pub use fuse::{fold_batch_norms, fuse_conv_affine};
pub use fuse_attention::fuse_attention;
pub use fuse_elementwise::fuse_elementwise;
pub use fuse_epilogue::fuse_epilogues;
pub use fuse_norm::fuse_rms_norm;
pub use fuse_shared_input::{fuse_shared_input, SPLIT_ALIGN};
pub use layout::channels_last;
pub use legalize::legalize_dtypes;
pub use memory::{
    check_plan, plan_memory, state_write, LoopPlan, MemoryOptions, MemoryPlan, Slot, StateWrite, CACHE_LINE,
};
pub use observe::{range_qparams, ActObservation, Observer};
pub use pipeline::{cleanup, default_pipeline, pipeline_for, run_pipeline, Options, Pass, PassRecord, Report};
pub use pipeline::{
    CLEANUP, DCE, DECOMPOSE, FOLD, FOLD_BATCH_NORMS, FUSE, FUSE_ATTENTION, FUSE_ELEMENTWISE, FUSE_EPILOGUE, FUSE_NORM,
    FUSE_SHARED_INPUT, LAYOUT, LEGALIZE, QUANT_ACTS, QUANT_LINEAR, QUANT_RESIDUALS, SIMPLIFY,
};
pub use quant_acts::{int8_activations, int8_residuals};
pub use quant_linear::quantize_linear_weights;
pub use quantize::{
    apply_layers, auto_ladder, glob_match, layer_inputs, layer_outputs, plan_layers, quantize_weights, sqnr_db,
    LayerQuant, LayerReport, QuantScheme, QuantizeConfig,
};
pub use simplify::simplify;
pub use target::{data_dtype, Layout, OpKind, OpRow, OpTable, Support, Target, TargetDesc, DTYPES};
