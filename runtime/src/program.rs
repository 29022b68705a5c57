//! A loaded, validated artifact. Load does all the checking so that execution
//! can be a flat loop.

use crate::aligned::AlignedBuf;
use crate::device::SessionOptions;
use crate::exec::{resolve, Resolved};
use crate::format::{
    parse_container, AccelProgram, DimExpr, DimRef, InstrOp, IoDecl, Kernel, Metadata, Plan, Storage, FORMAT_MAJOR,
    WEIGHT_ALIGN,
};
use crate::native::{NativeCode, NativeSection};
use crate::session::Session;
use crate::validate::validate_plan;
use crate::{Error, Result};
use std::ops::Range;
#[cfg(feature = "fs")]
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// Where the artifact's bytes live. The weights are used in place from here
/// for the program's whole life, so only `Owned` ever copied anything.
enum Backing {
    #[cfg(feature = "fs")]
    Mapped(memmap2::Mmap),
    Owned(AlignedBuf),
    /// Caller memory that outlives the program: `include_bytes!`, a firmware image.
    Static(&'static [u8]),
    /// Caller memory kept alive by the program (an `Arc<[u8]>`, a foreign buffer).
    // RefUnwindSafe keeps `Program` usable across `catch_unwind` (as before owners existed).
    Shared(Box<dyn AsRef<[u8]> + Send + Sync + std::panic::RefUnwindSafe>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(feature = "fs")]
            Backing::Mapped(m) => m,
            Backing::Owned(b) => b.as_slice(),
            Backing::Static(s) => s,
            Backing::Shared(owner) => (**owner).as_ref(),
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
    /// The native-code section, validated; mapped on first use by a session
    /// that allows native code.
    native: Option<NativeSection>,
    native_code: OnceLock<std::result::Result<Option<NativeCode>, String>>,
    format_minor: u16,
}

impl Program {
    /// Memory-maps and validates a `.kiln` file.
    ///
    /// The file must not be modified while the program is alive (the usual
    /// memory-map caveat); artifacts are written atomically by a rename, so a
    /// recompile replaces the file rather than changing it under us.
    #[cfg(feature = "fs")]
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Program>> {
        let path = path.as_ref();
        let io = |e| Error::Io { path: path.display().to_string(), source: e };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: read-only map of a file we do not modify; see the doc above.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Program::from_backing(Backing::Mapped(map))
    }

    /// Validates an artifact held in memory, copying it once into aligned
    /// memory (so any slice works). [`Program::from_static`] and
    /// [`Program::from_owner`] use the bytes in place instead.
    pub fn from_bytes(bytes: &[u8]) -> Result<Arc<Program>> {
        let buf = AlignedBuf::from_bytes(bytes).ok_or(Error::OutOfMemory { bytes: bytes.len() as u64 })?;
        Program::from_backing(Backing::Owned(buf))
    }

    /// Validates an artifact that lives for the whole process (an
    /// `include_bytes!` in a `#[repr(align(64))]` wrapper, a firmware image in
    /// flash) and runs its weights in place: nothing is copied. The slice
    /// must start at a 64-byte aligned address ([`crate::format::WEIGHT_ALIGN`]);
    /// otherwise the result is [`Error::Misaligned`].
    pub fn from_static(bytes: &'static [u8]) -> Result<Arc<Program>> {
        Program::from_backing(Backing::Static(bytes))
    }

    /// Like [`Program::from_static`] for memory the program keeps alive
    /// itself: `owner` (an `Arc<[u8]>`, a buffer handed over by a host
    /// application) is stored in the program and dropped with it. Its bytes
    /// must not change meanwhile and must start 64-byte aligned.
    pub fn from_owner(
        owner: impl AsRef<[u8]> + Send + Sync + std::panic::RefUnwindSafe + 'static,
    ) -> Result<Arc<Program>> {
        Program::from_backing(Backing::Shared(Box::new(owner)))
    }

    fn from_backing(backing: Backing) -> Result<Arc<Program>> {
        let bytes = backing.bytes();
        let container = parse_container(bytes)?;
        check_weights_alignment(bytes, &container.weights)?;
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
        let native = load_native_section(bytes, container.native.as_ref(), &plan)?;
        let resolved = resolve(&plan, &bytes[container.weights.clone()]);
        Ok(Arc::new(Program {
            weights: container.weights,
            resolved,
            plan,
            metadata,
            accel,
            native,
            native_code: OnceLock::new(),
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

    /// The native-code section, when the artifact has one (`kiln inspect`).
    pub fn native_section(&self) -> Option<&NativeSection> {
        self.native.as_ref()
    }

    /// The native code for this CPU, mapped on first call: None when the
    /// artifact has none or no level runs here; an error when mapping fails.
    pub fn native_code(&self) -> Result<Option<&NativeCode>> {
        let Some(section) = &self.native else { return Ok(None) };
        match self.native_code.get_or_init(|| NativeCode::load(section)) {
            Ok(code) => Ok(code.as_ref()),
            Err(e) => Err(Error::Format { section: "native".into(), offset: 0, detail: e.clone() }),
        }
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

    /// The inputs as the caller passes them (a complex one as c64/c128).
    pub fn inputs(&self) -> Vec<IoInfo> {
        self.plan.inputs.iter().map(|io| self.io_decl_info(io)).collect()
    }

    /// The outputs as the caller receives them (a complex one as c64/c128).
    pub fn outputs(&self) -> Vec<IoInfo> {
        self.plan.outputs.iter().map(|io| self.io_decl_info(io)).collect()
    }

    fn io_decl_info(&self, io: &IoDecl) -> IoInfo {
        let (dtype, dims) = self.plan.io_type(io);
        IoInfo { name: io.name.clone(), dtype, shape: dims.iter().map(|d| self.dim_string(*d)).collect() }
    }

    /// The buffers kept between runs (see [`crate::Session::state`]), by name.
    pub fn states(&self) -> Vec<IoInfo> {
        self.plan.states.iter().map(|st| self.io_info(&st.name, st.tensor)).collect()
    }

    /// How each state's update is written, in plan order: in place by which
    /// instruction, by an end-of-run copy, or on the device (for
    /// `kiln inspect`; the delegate follows the same rules).
    pub fn state_writes(&self) -> Vec<crate::StateWriteInfo> {
        crate::state::state_writes(&self.plan, self.accel.as_ref())
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

/// Kernels read weights in place as `f32`, `i64`, ... slices, and the
/// format places every tensor at a multiple of [`WEIGHT_ALIGN`] from the
/// section start: the section itself must sit at such an address. (A memory
/// map is page-aligned and `from_bytes` copies into aligned memory; caller
/// memory may be anywhere.)
fn check_weights_alignment(bytes: &[u8], weights: &Range<usize>) -> Result<()> {
    let address = bytes.as_ptr() as usize + weights.start;
    if !address.is_multiple_of(WEIGHT_ALIGN as usize) {
        return Err(Error::Misaligned { address: bytes.as_ptr() as usize, align: WEIGHT_ALIGN as usize });
    }
    Ok(())
}

pub(crate) fn instr_display_name(op: &InstrOp) -> String {
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

/// Decodes and validates the native section; a plan with native calls needs one.
fn load_native_section(bytes: &[u8], range: Option<&Range<usize>>, plan: &Plan) -> Result<Option<NativeSection>> {
    let bad = |offset: usize, detail: String| Error::Format { section: "native".into(), offset: offset as u64, detail };
    let Some(r) = range else {
        if plan.instrs.iter().any(|i| i.op.native_function().is_some()) {
            return Err(bad(0, "the plan calls native code but the artifact has no native section".into()));
        }
        return Ok(None);
    };
    let section: NativeSection =
        postcard::from_bytes(&bytes[r.clone()]).map_err(|e| bad(r.start, format!("cannot decode: {e}")))?;
    crate::native::validate_section(&section, plan).map_err(|e| bad(r.start, e))?;
    Ok(Some(section))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::*;

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Line([u8; 64]);

    /// An artifact with one weight (`y = x + w`, f32[4]).
    fn artifact() -> Vec<u8> {
        let mut weights = WeightsBuilder::new();
        let w = weights.push(&[0u8; 16]);
        let f32x4 = |storage| TensorDecl { dtype: DType::F32, shape: vec![DimRef::Static(4)], storage };
        let plan = Plan {
            symbols: vec![],
            exprs: vec![],
            tensors: vec![
                f32x4(Storage::Arena { offset: 0, max_bytes: 16 }),
                f32x4(w),
                f32x4(Storage::Arena { offset: 64, max_bytes: 16 }),
            ],
            inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
            outputs: vec![IoDecl { name: "y".into(), tensor: 2, complex: false }],
            states: vec![],
            instrs: vec![Instr {
                op: InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }),
                inputs: vec![0, 1],
                outputs: vec![2],
                origin: "test".into(),
            }],
            arena_bytes: 128,
            peak_live_bytes: 32,
        };
        ArtifactWriter::new(&plan, weights, &Metadata::default()).expect("encode").to_bytes()
    }

    #[test]
    fn from_static_uses_the_weights_in_place() {
        let bytes = artifact();
        let lines: &'static mut [Line] = Vec::leak(vec![Line([0; 64]); bytes.len().div_ceil(64)]);
        // SAFETY: `Line` is plain bytes and the slice stays inside the leaked lines.
        let image: &'static mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), bytes.len()) };
        image.copy_from_slice(&bytes);
        let image: &'static [u8] = image;
        let program = Program::from_static(image).expect("load");
        let weights = program.weights().as_ptr_range();
        let image_range = image.as_ptr_range();
        assert!(image_range.start <= weights.start && weights.end <= image_range.end, "weights were copied");
        // The copying constructor, by contrast, owns its own memory.
        let copied = Program::from_bytes(image).expect("load");
        assert!(!image_range.contains(&copied.weights().as_ptr()));
    }
}
