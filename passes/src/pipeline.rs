//! The pass manager: a list of passes run in order, with an optional verifier
//! between them and a report of what each did.

use crate::target::{OpKind, Support, Target, TargetDesc};
use crate::{
    channels_last, dce, decompose, fold_batch_norms, fold_constants, fuse_attention, fuse_conv_affine,
    fuse_elementwise, fuse_epilogues, fuse_rms_norm, fuse_shared_input, legalize_dtypes, quantize_linear_weights,
    simplify, verify_graph, Changed, PassError,
};
use kiln_ir::{DType, Graph, Op};
use std::fmt;

#[derive(Clone, Debug)]
pub struct Options {
    /// What the graph is compiled for: the passes read what it keeps and
    /// what its kernels take.
    pub target: TargetDesc,
    /// Run [`verify_graph`] after every pass (tests turn it on).
    pub verify_each: bool,
    /// Constant folding always evaluates a node whose result is no larger than its
    /// largest operand; beyond that, only results of at most this many elements.
    pub fold_max_elements: usize,
    /// Constant folding leaves a node alone when an operand has more than
    /// this many elements (the evaluator holds them as f64s): 2^27, 1 GiB.
    pub fold_max_operand_elements: usize,
}

impl Options {
    pub fn new(target: Target) -> Options {
        Options::for_desc(target.desc().clone())
    }

    /// Options for a target description of the caller's own.
    pub fn for_desc(target: TargetDesc) -> Options {
        Options { target, verify_each: false, fold_max_elements: 1 << 16, fold_max_operand_elements: 1 << 27 }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options::new(Target::Cpu)
    }
}

/// One pass: a name for reports and errors, and the function.
#[derive(Copy, Clone)]
pub struct Pass {
    pub name: &'static str,
    pub run: fn(&mut Graph, &Options) -> Result<Changed, PassError>,
}

impl fmt::Debug for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

pub const SIMPLIFY: Pass = Pass { name: "simplify", run: simplify };
pub const FOLD: Pass = Pass { name: "fold", run: fold_constants };
pub const DCE: Pass = Pass { name: "dce", run: dce };
pub const DECOMPOSE: Pass = Pass { name: "decompose", run: decompose };
pub const CLEANUP: Pass = Pass { name: "cleanup", run: cleanup };
pub const FUSE: Pass = Pass { name: "fuse", run: fuse_conv_affine };
/// BatchNorm into the convolution before it (`--quantize` runs it first).
pub const FOLD_BATCH_NORMS: Pass = Pass { name: "fold_batch_norms", run: fold_batch_norms };
pub const LEGALIZE: Pass = Pass { name: "legalize", run: legalize_dtypes };
pub const FUSE_ATTENTION: Pass = Pass { name: "fuse_attention", run: fuse_attention };
pub const FUSE_NORM: Pass = Pass { name: "fuse_norm", run: fuse_rms_norm };
pub const QUANT_LINEAR: Pass = Pass { name: "quant_linear", run: quantize_linear_weights };
pub const FUSE_ELEMENTWISE: Pass = Pass { name: "fuse_elementwise", run: fuse_elementwise };
pub const FUSE_EPILOGUE: Pass = Pass { name: "fuse_epilogue", run: fuse_epilogues };
/// Linear layers reading the same input as one GEMM (after `fuse_epilogue`).
pub const FUSE_SHARED_INPUT: Pass = Pass { name: "fuse_shared_input", run: fuse_shared_input };
pub const LAYOUT: Pass = Pass { name: "layout", run: channels_last };
/// int8 activations between quantized convolutions (after the layout pass).
pub const QUANT_ACTS: Pass = Pass { name: "quant_acts", run: crate::quant_acts::int8_activations };
/// int8 residual adds between quantized convolutions (after `quant_acts`).
pub const QUANT_RESIDUALS: Pass = Pass { name: "quant_residuals", run: crate::quant_acts::int8_residuals };

/// The passes for `target`, in the order they run ([`pipeline_for`] its description).
pub fn default_pipeline(target: Target) -> Vec<Pass> {
    pipeline_for(target.desc())
}

/// The passes for a target description, in the order they run. The options
/// the passes then get must hold the same description.
pub fn pipeline_for(target: &TargetDesc) -> Vec<Pass> {
    let mut passes = Vec::new();
    // Dequantized integer weights feeding linear layers keep their integers
    // (before folding would make them f32 constants): the CPU target has
    // the quantized linear kernel, PJRT segments lower it to integer
    // StableHLO. Simplify first (it folds nothing): it makes Core ATen's
    // `bmm` by an expanded weight a matmul by the matrix.
    let takes_quant_linear = target.segments.is_some_and(|s| s.takes(OpKind::QuantLinear, Some(DType::F32)));
    if target.target == Target::Cpu || takes_quant_linear {
        passes.push(SIMPLIFY);
        passes.push(QUANT_LINEAR);
    }
    passes.extend([
        // Portable clean-up: canonicalise, fold what is constant, drop the dead.
        CLEANUP, // Rewrite composites the target does not keep into what it has.
        DECOMPOSE,
        // Decomposition exposes new folds: `linear`'s transposed weight, BatchNorm's
        // reshaped parameters, scalar constants.
        CLEANUP,
    ]);
    // Fold per-channel affine ops (decomposed BatchNorm) into the convolutions
    // before them, when the target has a convolution kernel to fold into; drop
    // the convolutions and constants that replaced.
    if target.kernels.support(OpKind::Conv) != Support::No {
        passes.push(FUSE);
    }
    // Kernels that lack a dtype compute through casts (f16/bf16 in f32, as
    // PyTorch's CPU kernels do).
    if target.kernels.restricts_dtypes() {
        passes.push(LEGALIZE);
    }
    // Chains of elementwise ops become one fused kernel: last, so that it sees
    // the casts legalisation added. The CPU target only: its kernels have the
    // fused one (the PJRT target's segments take the ops one by one).
    // Attention and RMS norm first: their scales, masks and squares are
    // elementwise ops the last pass would otherwise take; then the
    // activations and residual adds that follow a conv or linear go into
    // its store step (`fuse_epilogue`), and what is left into fused kernels.
    if target.target == Target::Cpu {
        passes.push(FUSE_ATTENTION);
        // The attention kernel takes K as it is: the transpose the model put
        // on K (now a permute of a permute) composes into one.
        passes.push(SIMPLIFY);
        passes.push(FUSE_NORM);
        passes.push(FUSE_EPILOGUE);
        // Then linear layers that read the same input (attention's q/k/v)
        // become one GEMM with an output per layer.
        passes.push(FUSE_SHARED_INPUT);
        passes.push(FUSE_ELEMENTWISE);
        // Last: convolutions channels-last, permutes at their runs' edges.
        passes.push(LAYOUT);
        // Then quantized convolutions that feed only int8 ones hand them i8
        // tensors (needs their channels-last form).
        passes.push(QUANT_ACTS);
        // And residuals that int8 layers read: int8 adds (changes numbers
        // as torch's int8 add does; after the exact handoffs).
        passes.push(QUANT_RESIDUALS);
    }
    passes.push(DCE);
    passes
}

/// Simplify, fold and DCE repeated until none of them changes the graph: a fold can
/// expose a simplification (`reshape` to a now-equal shape) and vice versa.
pub fn cleanup(g: &mut Graph, opts: &Options) -> Result<Changed, PassError> {
    // Each round strictly shrinks or canonicalises the graph; the cap only guards
    // against a future rewrite pair that undo each other.
    const MAX_ROUNDS: usize = 16;
    let mut changed = Changed::No;
    for _ in 0..MAX_ROUNDS {
        let round = simplify(g, opts)? | fold_constants(g, opts)? | dce(g, opts)?;
        if !round.is_yes() {
            break;
        }
        changed = Changed::Yes;
    }
    Ok(changed)
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassRecord {
    pub name: &'static str,
    pub changed: Changed,
    pub nodes_before: usize,
    pub nodes_after: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub passes: Vec<PassRecord>,
}

impl Report {
    pub fn changed(&self) -> bool {
        self.passes.iter().any(|p| p.changed.is_yes())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.passes {
            writeln!(f, "{:<12} {:<9} nodes {} -> {}", p.name, p.changed, p.nodes_before, p.nodes_after)?;
        }
        Ok(())
    }
}

/// Runs the pipeline on every nested graph (a loop's condition and body)
/// before the parent: the parent's passes treat a loop as one opaque node, so
/// the order between the levels does not matter, and each level is optimised
/// once. A nested graph's errors name the loop.
fn run_on_regions(g: &mut Graph, passes: &[Pass], opts: &Options) -> Result<(), PassError> {
    for i in 0..g.order.len() {
        let n = g.order[i];
        let Some(Op::While { cond, body, .. }) = g.nodes.get_mut(n).map(|node| &mut node.op) else { continue };
        for (name, region) in [("cond", cond), ("body", body)] {
            run_pipeline(region, passes, opts)
                .map_err(|e| PassError::new(e.pass, format!("in a loop's `{name}`: {}", e.message)))?;
        }
    }
    Ok(())
}

/// Runs `passes` in order on `g`. With `opts.verify_each`, the graph is verified
/// before the first pass and after each one; a failure names the pass that broke it.
/// A graph whose ops assume another layout than the target's is refused
/// first ([`TargetDesc::check_layout`]).
pub fn run_pipeline(g: &mut Graph, passes: &[Pass], opts: &Options) -> Result<Report, PassError> {
    opts.target.check_layout(g)?;
    if opts.verify_each {
        verify_graph(g).map_err(|e| PassError::new("input", format!("graph invalid before any pass: {e}")))?;
    }
    run_on_regions(g, passes, opts)?;
    let mut report = Report::default();
    for pass in passes {
        let nodes_before = g.order.len();
        let changed = (pass.run)(g, opts)?;
        if opts.verify_each {
            verify_graph(g).map_err(|e| PassError::new(pass.name, format!("graph invalid after pass: {e}")))?;
        }
        report.passes.push(PassRecord { name: pass.name, changed, nodes_before, nodes_after: g.order.len() });
    }
    Ok(report)
}
