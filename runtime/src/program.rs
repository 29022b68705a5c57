//! A loaded, validated artifact. Load does all the checking so that execution
//! can be a flat loop.

use crate::aligned::AlignedBuf;
use crate::device::SessionOptions;
use crate::exec::{resolve, Resolved};
use crate::format::{
    parse_container, AccelProgram, DimExpr, DimRef, InstrOp, Kernel, Metadata, Plan, Storage, FORMAT_MAJOR,
};
use crate::session::Session;
use crate::validate::validate_plan;
use crate::{Error, Result};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

enum Backing {
    Mapped(memmap2::Mmap),
    Owned(AlignedBuf),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(b) => b.as_slice(),
        }
    }
}

/// An immutable, validated program. `Send + Sync`: share one `Arc<Program>`
/// between threads, each running its own [`Session`].
pub struct Program {
    backing: Backing,
    weights: Range<usize>,
    plan: Plan,
    /// The plan's instructions resolved to kernel functions (see `exec`).
    resolved: Resolved,
    metadata: Metadata,
    accel: Option<AccelProgram>,
    format_minor: u16,
}

impl Program {
    /// Memory-maps and validates a `.kiln` file.
    ///
    /// The file must not be modified while the program is alive (the usual
    /// memory-map caveat); artifacts are written atomically by a rename, so a
    /// recompile replaces the file rather than changing it under us.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Program>> {
        let path = path.as_ref();
        let io = |e| Error::Io { path: path.display().to_string(), source: e };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: read-only map of a file we do not modify; see the doc above.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Program::from_backing(Backing::Mapped(map))
    }

    /// Validates an artifact held in memory (copied once into aligned memory).
    pub fn from_bytes(bytes: &[u8]) -> Result<Arc<Program>> {
        let buf = AlignedBuf::from_bytes(bytes).ok_or(Error::OutOfMemory { bytes: bytes.len() as u64 })?;
        Program::from_backing(Backing::Owned(buf))
    }

    fn from_backing(backing: Backing) -> Result<Arc<Program>> {
        let bytes = backing.bytes();
        let container = parse_container(bytes)?;
        let plan: Plan = postcard::from_bytes(&bytes[container.plan.clone()]).map_err(|e| Error::Format {
            section: "plan".into(),
            offset: container.plan.start as u64,
            detail: format!("cannot decode: {e}"),
        })?;
        let metadata = match &container.metadata {
            Some(r) => postcard::from_bytes(&bytes[r.clone()]).map_err(|e| Error::Format {
                section: "metadata".into(),
                offset: r.start as u64,
                detail: format!("cannot decode: {e}"),
            })?,
            None => Metadata::default(),
        };
        let accel: Option<AccelProgram> = match &container.accel {
            Some(r) => Some(postcard::from_bytes(&bytes[r.clone()]).map_err(|e| Error::Format {
                section: "accel".into(),
                offset: r.start as u64,
                detail: format!("cannot decode: {e}"),
            })?),
            None => None,
        };
        validate_plan(&plan, container.weights.len() as u64, accel.as_ref())?;
        let resolved = resolve(&plan, &bytes[container.weights.clone()]);
        Ok(Arc::new(Program {
            weights: container.weights,
            resolved,
            plan,
            metadata,
            accel,
            format_minor: container.minor,
            backing,
        }))
    }

    /// A new session with its own arena, on kiln's CPU kernels.
    pub fn session(self: &Arc<Self>) -> Result<Session> {
        Session::new(Arc::clone(self), &SessionOptions::default())
    }

    /// A new session on `options.device`. With a PJRT device this compiles
    /// (or loads from the executable cache) every accelerator segment and
    /// uploads the weights they read, once for the session's life.
    pub fn session_with(self: &Arc<Self>, options: &SessionOptions) -> Result<Session> {
        Session::new(Arc::clone(self), options)
    }

    /// The accelerator segments, when the artifact has any.
    pub fn accel(&self) -> Option<&AccelProgram> {
        self.accel.as_ref()
    }

    /// Whether any instruction runs on an accelerator.
    pub fn needs_accelerator(&self) -> bool {
        self.plan.instrs.iter().any(|i| matches!(i.op, InstrOp::Delegate { .. }))
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// How many constant GEMM weights were packed for the microkernel at
    /// load (each used in place by every session's runs).
    pub fn packed_weights(&self) -> usize {
        self.resolved.packed.len()
    }

    pub(crate) fn resolved(&self) -> &Resolved {
        &self.resolved
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn format_version(&self) -> (u16, u16) {
        (FORMAT_MAJOR, self.format_minor)
    }

    pub(crate) fn weights(&self) -> &[u8] {
        &self.backing.bytes()[self.weights.clone()]
    }

    pub fn weights_bytes(&self) -> u64 {
        self.weights.len() as u64
    }

    pub fn inputs(&self) -> Vec<IoInfo> {
        self.plan.inputs.iter().map(|io| self.io_info(&io.name, io.tensor)).collect()
    }

    pub fn outputs(&self) -> Vec<IoInfo> {
        self.plan.outputs.iter().map(|io| self.io_info(&io.name, io.tensor)).collect()
    }

    fn io_info(&self, name: &str, tensor: u32) -> IoInfo {
        let t = &self.plan.tensors[tensor as usize];
        IoInfo { name: name.to_string(), dtype: t.dtype, shape: t.shape.iter().map(|d| self.dim_string(*d)).collect() }
    }

    /// A dimension as text: `16`, `batch`, `(seq + 1)`.
    pub fn dim_string(&self, d: DimRef) -> String {
        match d {
            DimRef::Static(v) => v.to_string(),
            DimRef::Expr(e) => self.expr_string(e),
        }
    }

    fn expr_string(&self, e: u32) -> String {
        let bin = |a: u32, op: &str, b: u32| format!("({} {op} {})", self.expr_string(a), self.expr_string(b));
        match self.plan.exprs[e as usize] {
            DimExpr::Const(v) => v.to_string(),
            DimExpr::Sym(s) => self.plan.symbols[s as usize].name.clone(),
            DimExpr::Add(a, b) => bin(a, "+", b),
            DimExpr::Mul(a, b) => bin(a, "*", b),
            DimExpr::FloorDiv(a, b) => bin(a, "//", b),
            DimExpr::Mod(a, b) => bin(a, "%", b),
            DimExpr::Sub(a, b) => bin(a, "-", b),
        }
    }

    /// Instruction counts by kernel name, most frequent first.
    pub fn kernel_counts(&self) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for i in &self.plan.instrs {
            let name = instr_display_name(&i.op);
            match counts.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => *c += 1,
                None => counts.push((name, 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        counts
    }

    /// Bytes of weights actually referenced by tensors.
    pub fn weight_tensor_bytes(&self) -> u64 {
        self.plan
            .tensors
            .iter()
            .map(|t| match t.storage {
                Storage::Weight { bytes, .. } => bytes,
                Storage::Arena { .. } => 0,
            })
            .sum()
    }
}

fn instr_display_name(op: &InstrOp) -> String {
    match op {
        InstrOp::Call(Kernel::Unary { op }) => op.name().to_string(),
        InstrOp::Call(Kernel::Binary { op }) => op.name().to_string(),
        InstrOp::Call(Kernel::Reduce { kind, .. }) => format!("reduce_{kind}"),
        other => other.name().to_string(),
    }
}

/// Name, dtype and shape (as text) of a program input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoInfo {
    pub name: String,
    pub dtype: kiln_kernels::DType,
    pub shape: Vec<String>,
}
