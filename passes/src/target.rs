//! The target description: what a compiled program runs on, as data.
//!
//! [`Target`] names a target (the CLI's `--target`, a filetest's `; target`
//! line); [`Target::desc`] gives its [`TargetDesc`], the one object that
//! decomposition ([`TargetDesc::keeps`]), dtype legalisation
//! ([`TargetDesc::kernel_support`]), the pipeline ([`crate::pipeline_for`]),
//! the PJRT partitioner ([`TargetDesc::segments`]) and lowering consult, in
//! the way cranelift's passes consult a `TargetIsa`. The capability tables are
//! data ([`OpTable`]): `target/cpu.rs` for kiln's CPU kernels, `target/pjrt.rs`
//! for what a StableHLO segment takes.
//!
//! The description's `layout` is checked against the IR's one layout
//! convention before the passes run and before lowering
//! ([`TargetDesc::check_layout`]); its `vector_bytes` sets the memory
//! planner's buffer alignment (`MemoryOptions::for_target`).
//!
//! Native code for x86_64 and aarch64 will be further [`Target`]s whose
//! descriptions carry their own kernel tables, layouts and vector widths.

mod cpu;
mod pjrt;

/// The key of an [`OpTable`]: an op without its parameters, declared by the
/// IR's op table (`kiln_ir::OpKind`), so a new op needs no row here.
pub use kiln_ir::OpKind;
use kiln_ir::{DType, Graph, Op};
use std::fmt;

/// A target by name.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// kiln's portable CPU kernels: keeps the composites they run whole.
    Cpu,
    /// kiln's CPU kernels, fed primitive ops only: every composite that can
    /// be decomposed is (filetests, and a reference for the composites).
    Primitive,
    /// Accelerator segments as StableHLO for a PJRT plugin; every other node
    /// runs on kiln's CPU kernels, which the passes prepare the graph for.
    Pjrt,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::Cpu, Target::Primitive, Target::Pjrt];

    /// The name used by `--target` and filetest headers (`; target cpu`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Primitive => "primitive",
            Target::Pjrt => "pjrt",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The target's description.
    pub fn desc(self) -> &'static TargetDesc {
        match self {
            Target::Cpu => &CPU,
            Target::Primitive => &PRIMITIVE,
            Target::Pjrt => &PJRT,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything the compiler needs to know about a target.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetDesc {
    pub target: Target,
    /// The kernels that run every node outside an accelerator segment, and
    /// the dtypes each takes: legalisation casts around a kernel that lacks
    /// a dtype, lowering picks these kernels.
    pub kernels: &'static OpTable,
    /// The composites the target runs as one kernel; decomposition rewrites
    /// every other composite ([`OpKind::is_composite`]) it has a rule for.
    pub composites: &'static [OpKind],
    /// What an accelerator segment takes (PJRT: the ops and dtypes with a
    /// StableHLO lowering); `None` for a target without segments.
    pub segments: Option<&'static OpTable>,
    /// The memory layout the kernels take tensors in. The IR has one
    /// convention (`N, C, spatial..` for the ops [`Op::is_channels_first`]
    /// marks) and no pass converts layouts, so the pipeline and lowering
    /// refuse such an op for a target with another layout
    /// ([`TargetDesc::check_layout`]).
    pub layout: Layout,
    /// Width in bytes of the vector registers `kernels` are compiled for: the
    /// memory planner aligns every arena buffer to it, and to at least a cache
    /// line (`MemoryOptions::for_target`).
    pub vector_bytes: u32,
}

static CPU: TargetDesc = TargetDesc {
    target: Target::Cpu,
    kernels: &cpu::KERNELS,
    composites: cpu::COMPOSITES,
    segments: None,
    layout: Layout::RowMajor,
    vector_bytes: cpu::VECTOR_BYTES,
};

static PRIMITIVE: TargetDesc = TargetDesc {
    target: Target::Primitive,
    kernels: &cpu::KERNELS,
    composites: &[],
    segments: None,
    layout: Layout::RowMajor,
    vector_bytes: cpu::VECTOR_BYTES,
};

/// The CPU nodes of a PJRT plan run kiln's CPU kernels, so the passes keep
/// what the CPU keeps; the StableHLO emitter expands composites itself.
static PJRT: TargetDesc = TargetDesc {
    target: Target::Pjrt,
    kernels: &cpu::KERNELS,
    composites: cpu::COMPOSITES,
    segments: Some(&pjrt::SEGMENTS),
    layout: Layout::RowMajor,
    vector_bytes: cpu::VECTOR_BYTES,
};

impl TargetDesc {
    /// Whether decomposition leaves `op` as it is: a primitive, or a
    /// composite the target runs whole.
    pub fn keeps(&self, op: &Op) -> bool {
        let kind = OpKind::of(op);
        !kind.is_composite() || self.composites.contains(&kind)
    }

    /// Which dtypes (of its data operand, see [`data_dtype`]) the target's
    /// kernel for `op` takes.
    pub fn kernel_support(&self, op: &Op) -> Support {
        self.kernels.support(OpKind::of(op))
    }

    /// Whether the target's kernel for `op` computes in `dtype` as it is.
    pub fn kernel_takes(&self, op: &Op, dtype: DType) -> bool {
        self.kernel_support(op).takes(Some(dtype))
    }

    /// Refuses a graph (nested graphs included) holding an op whose meaning
    /// depends on the layout ([`Op::is_channels_first`]) when the target's
    /// kernels take another layout than the IR's: the op would run on
    /// tensors laid out as it does not expect. Graphs without such ops are
    /// the same under every dense layout.
    pub fn check_layout(&self, g: &Graph) -> Result<(), crate::PassError> {
        if self.layout == Layout::RowMajor {
            return Ok(());
        }
        for &n in &g.order {
            let Some(node) = g.nodes.get(n) else { continue };
            if node.op.is_channels_first() {
                return Err(crate::PassError::new(
                    "layout",
                    format!(
                        "target `{}` takes {} tensors, but {} is built for N, C, spatial.. and no pass converts layouts",
                        self.target,
                        self.layout.name(),
                        g.describe_node(n)
                    ),
                ));
            }
            if let Op::While { cond, body, .. } = &node.op {
                self.check_layout(cond)?;
                self.check_layout(body)?;
            }
        }
        Ok(())
    }
}

/// How a target's kernels lay tensors out in memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Dense row-major, channels before the spatial dims (`NC…`): the IR's
    /// convention, and what every target's kernels take today.
    RowMajor,
    /// Dense row-major, channels after the spatial dims (`N…C`, NHWC), as
    /// some accelerator and mobile kernels want. No target has it yet: a
    /// description with it compiles only graphs without channels-first ops.
    ChannelsLast,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::RowMajor => "row-major N, C, spatial..",
            Layout::ChannelsLast => "channels-last N, spatial.., C",
        }
    }
}

/// Which dtypes an op's kernel (or lowering) takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// The op has none.
    No,
    /// Every dtype.
    Any,
    /// These dtypes only.
    Only(&'static [DType]),
}

impl Support {
    /// Whether a node whose data dtype is `dtype` is taken; `None` (no
    /// operand and no result) only by [`Support::Any`].
    pub fn takes(self, dtype: Option<DType>) -> bool {
        match (self, dtype) {
            (Support::Any, _) => true,
            (Support::Only(list), Some(d)) => list.contains(&d),
            _ => false,
        }
    }
}

/// One row of an [`OpTable`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct OpRow {
    pub op: OpKind,
    pub support: Support,
    /// Why dtypes the row does not take are not taken, for diagnostics
    /// (`kiln inspect`'s fallback reasons): each reason covers its dtypes.
    pub why_not: &'static [(&'static [DType], &'static str)],
}

impl OpRow {
    pub const fn only(op: OpKind, dtypes: &'static [DType]) -> OpRow {
        OpRow { op, support: Support::Only(dtypes), why_not: &[] }
    }

    pub const fn any(op: OpKind) -> OpRow {
        OpRow { op, support: Support::Any, why_not: &[] }
    }

    /// The op is not taken at all (say why with `.why_not(&[(DTYPES, ..)])`).
    pub const fn no(op: OpKind) -> OpRow {
        OpRow { op, support: Support::No, why_not: &[] }
    }

    /// This row with reasons for the dtypes it does not take.
    pub const fn why_not(self, why_not: &'static [(&'static [DType], &'static str)]) -> OpRow {
        OpRow { why_not, ..self }
    }
}

/// What a set of kernels (or a lowering) takes: a row per op it treats
/// specially, and one answer for every other op.
#[derive(Debug, PartialEq, Eq)]
pub struct OpTable {
    /// The support of an op without a row.
    pub others: Support,
    /// At most one row per op.
    pub rows: &'static [OpRow],
}

impl OpTable {
    pub fn row(&self, op: OpKind) -> Option<&OpRow> {
        self.rows.iter().find(|r| r.op == op)
    }

    pub fn support(&self, op: OpKind) -> Support {
        self.row(op).map_or(self.others, |r| r.support)
    }

    /// Whether `op` is taken on data of `dtype`.
    pub fn takes(&self, op: OpKind, dtype: Option<DType>) -> bool {
        self.support(op).takes(dtype)
    }

    /// The row's reason for not taking `op` on `dtype`, if it gives one.
    pub fn why_not(&self, op: OpKind, dtype: Option<DType>) -> Option<&'static str> {
        let d = dtype?;
        let row = self.row(op)?;
        row.why_not.iter().find(|(dtypes, _)| dtypes.contains(&d)).map(|&(_, why)| why)
    }

    /// Whether some op is taken in some dtypes only: then legalisation has
    /// casts to insert.
    pub fn restricts_dtypes(&self) -> bool {
        matches!(self.others, Support::Only(_)) || self.rows.iter().any(|r| matches!(r.support, Support::Only(_)))
    }
}

/// The dtype a node computes in, as tables key it: its first operand's, or
/// for an op without operands (`full`, `arange`) its first result's.
pub fn data_dtype(g: &kiln_ir::Graph, node: &kiln_ir::NodeData) -> Option<DType> {
    node.inputs.first().or(node.outputs.first()).and_then(|&v| g.values.get(v)).map(|d| d.ty.dtype)
}

/// Every dtype an IR value may have (complex ones exist only at a
/// program's boundary, as f32/f64 pairs: no table lists them).
pub const DTYPES: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::Bool,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in Target::ALL {
            assert_eq!(Target::from_name(t.name()), Some(t));
            assert_eq!(t.desc().target, t);
        }
        assert_eq!(Target::from_name("tpu"), None);
    }

    #[test]
    fn every_dtype_is_listed() {
        let values: Vec<DType> = DType::ALL.iter().copied().filter(|d| !d.is_complex()).collect();
        assert_eq!(DTYPES.len(), values.len());
        assert!(values.iter().all(|d| DTYPES.contains(d)));
    }

    #[test]
    fn tables_have_one_row_per_op_and_kept_composites_have_kernels() {
        for t in Target::ALL {
            let desc = t.desc();
            for table in [Some(desc.kernels), desc.segments].into_iter().flatten() {
                for (i, r) in table.rows.iter().enumerate() {
                    assert!(!table.rows[..i].iter().any(|s| s.op == r.op), "{t}: two rows for {:?}", r.op);
                }
            }
            for &c in desc.composites {
                assert!(c.is_composite(), "{t}: {c:?} is not a composite");
                assert_ne!(desc.kernels.support(c), Support::No, "{t} keeps {c:?} but has no kernel for it");
            }
        }
    }
}
