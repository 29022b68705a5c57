//! Native code: machine code the compiler generated for fused elementwise
//! groups and row-wise kernels (softmax, norms, last-axis reductions;
//! `kiln compile --target x86_64|aarch64`), carried in the artifact's
//! native section and run through this runtime's own object loader
//! ([`loader`]); no LLVM, no system linker, no `dlopen`.
//!
//! The section holds the functions' signatures once and one relocatable
//! object per ISA level (`x86-64`, `x86-64-v3`, ...), each defining every
//! function. At load the best level this CPU runs is chosen; a
//! [`crate::format::InstrOp::Native`] instruction calls its function when
//! native code is allowed ([`crate::SessionOptions::allow_native_code`]), a
//! level matched and the operands have the shapes the code was compiled for,
//! and otherwise runs its portable fused program — the same op list, so
//! either way gives the same results within the kernels' tolerance. A
//! [`crate::format::InstrOp::NativeKernel`] does the same with a row
//! function and its fallback kernel call.
//!
//! Trust: an artifact with native code *is* code. The loader refuses
//! malformed objects, but it cannot tell what well-formed code does; ship
//! such artifacts over a channel you trust, pin their hash, or refuse native
//! code in the session options.

pub mod loader;

use crate::format::{InstrOp, Kernel, Plan, ReduceKind, RowEpilogue, RowPrologue};
use kiln_kernels::{Context, DType, FusedOp, Result, TensorMut, TensorRef};
pub use loader::{Arch, LoadedObject};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};

/// The artifact's native section (`SECTION_NATIVE`, postcard-encoded).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NativeSection {
    pub functions: Vec<NativeFunction>,
    /// Lowest level first; the loader picks the last one the CPU runs.
    pub levels: Vec<NativeLevel>,
}

/// One generated function, with the fixed C ABI
/// `extern "C" fn(ins: *const *const u8, out: *mut u8, start: usize, end: usize)`:
/// an elementwise function computes output elements `start..end` (flat,
/// row-major) from the operand base pointers `ins[0..inputs.len()]`; a row
/// function ([`FunctionShape::Rows`]) computes rows `start..end`. One that
/// [`can_fail`](NativeFunction::can_fail) returns an `i32` as well.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NativeFunction {
    pub symbol: String,
    /// How each operand is read (its count is the function's arity).
    pub inputs: Vec<InputMode>,
    /// Operand dtypes and the result's (checked at load against the instruction's tensors).
    pub input_dtypes: Vec<DType>,
    pub output_dtype: DType,
    /// What `start..end` counts (since format 0.11).
    pub shape: FunctionShape,
    /// The function returns an `i32`: nonzero when some element of its
    /// range met an integer division by zero, its results then unspecified
    /// (format 0.21; elementwise functions only). The call then runs the
    /// portable program, which reports the error as it always does.
    pub can_fail: bool,
}

/// What a native function's range counts, and so which instruction calls it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FunctionShape {
    /// Output elements; called by [`InstrOp::Native`], operands as `inputs` say.
    Elementwise,
    /// Rows of `len` contiguous elements of operand 0, each giving
    /// `out_len` contiguous output elements; every other operand holds
    /// `len` elements (a norm's weight and bias). Called by
    /// [`InstrOp::NativeKernel`], whose fallback kernel says what a row is
    /// ([`row_geometry`]).
    ///
    /// With `prologue` > 0 (format 0.14) the function computes operand 0
    /// itself, row by row, from its first `prologue` operands (read as
    /// `inputs` says, indexed like elements of operand 0): `ins` holds those
    /// operands, then the kernel's others, then the pointer the computed
    /// operand is written to (the instruction's second output).
    ///
    /// With `epilogue` `Some(e)` (format 0.20) the function also applies an
    /// elementwise program to each row's result (after writing it) and
    /// writes the program's result: its `e` other operands come last in
    /// `inputs` (read as their modes say, indexed like elements of the
    /// output), and `ins` ends with the pointer that result is written to
    /// (the instruction's last output), after the prologue's.
    Rows { len: u64, out_len: u64, prologue: u32, epilogue: Option<u32> },
}

/// `(len, out_len)` of the rows a native row function computes for
/// `kernel` on a first operand shaped `x`: softmax over the last axis, a
/// layer or RMS norm (the trailing `normalized_rank` dims), a sum, mean or
/// max over the last axis. None for any other kernel or axis.
pub fn row_geometry(kernel: &Kernel, x: &[usize]) -> Option<(usize, usize)> {
    let last = *x.last()?;
    match kernel {
        Kernel::Softmax { axis, .. } if *axis as usize + 1 == x.len() => Some((last, last)),
        Kernel::LayerNorm { normalized_rank, .. } | Kernel::RmsNorm { normalized_rank, .. }
            if (1..=x.len()).contains(&(*normalized_rank as usize)) =>
        {
            let len = x[x.len() - *normalized_rank as usize..].iter().product();
            Some((len, len))
        }
        Kernel::Reduce { kind: ReduceKind::Sum | ReduceKind::Mean | ReduceKind::Max, axes }
            if axes.as_slice() == [x.len() as u32 - 1] =>
        {
            Some((last, 1))
        }
        _ => None,
    }
}

/// The operand counts a row function of `kernel` may take: x, and a
/// norm's weight (and a layer norm's bias).
fn row_operands(kernel: &Kernel) -> std::ops::RangeInclusive<usize> {
    match kernel {
        Kernel::LayerNorm { .. } => 1..=3,
        Kernel::RmsNorm { .. } => 1..=2,
        _ => 1..=1,
    }
}

/// How a native function reads one operand.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputMode {
    /// Shaped like the output: element `i` for output element `i`.
    Full,
    /// One element broadcast to every output element.
    Splat,
    /// Broadcast along all but one contiguous block of the output's dims
    /// (a bias `[C]` of `[N, T, C]`, a per-channel `[1, C, 1, 1]`): output
    /// element `i` reads element `(i / inner) % period` (see [`broadcast_of`]).
    Broadcast { inner: u64, period: u64 },
}

/// How an operand of shape `input` broadcast to `output` is indexed, when
/// one [`InputMode`] describes it: shaped alike (Full), one element
/// (Splat), or its non-1 dims one contiguous block of the output's
/// (Broadcast). None for any other broadcast (the call then stays portable).
pub fn broadcast_of(input: &[usize], output: &[usize]) -> Option<InputMode> {
    if input == output {
        return Some(InputMode::Full);
    }
    if input.len() > output.len() {
        return None;
    }
    let pad = output.len() - input.len();
    let dim = |d: usize| if d < pad { 1 } else { input[d - pad] };
    if (0..output.len()).any(|d| dim(d) != 1 && dim(d) != output[d]) {
        return None;
    }
    // The output dims the operand spans (its non-1 dims, size-1 output dims
    // being free either way) must be contiguous.
    // (No Vec: this runs before every native call, which must not allocate.)
    let (Some(first), Some(last)) =
        ((0..output.len()).find(|&d| dim(d) != 1), (0..output.len()).rev().find(|&d| dim(d) != 1))
    else {
        return Some(InputMode::Splat);
    };
    if (first..=last).any(|d| dim(d) != output[d]) {
        return None;
    }
    let period = (first..=last).map(|d| output[d] as u64).product();
    let inner = output[last + 1..].iter().map(|&d| d as u64).product();
    Some(InputMode::Broadcast { inner, period })
}

/// One ISA level's object code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NativeLevel {
    pub arch: NativeArch,
    /// `x86-64`, `x86-64-v3`, `x86-64-v4`, `generic`, `neoverse-n1`, `cortex-a78ae`.
    pub level: String,
    /// An ELF relocatable object.
    pub object: Vec<u8>,
}

/// [`Arch`] as the artifact stores it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NativeArch {
    X86_64,
    Aarch64,
}

impl NativeArch {
    pub fn arch(self) -> Arch {
        match self {
            NativeArch::X86_64 => Arch::X86_64,
            NativeArch::Aarch64 => Arch::Aarch64,
        }
    }
}

/// The element dtypes native code reads and writes: f32, bool (one byte,
/// 0 or 1; read as `!= 0`), i32, i64, and f16 / bf16 (each op widened to
/// f32 and rounded back, as the portable kernels compute them).
pub const NATIVE_DTYPES: &[DType] = &[DType::F32, DType::Bool, DType::I32, DType::I64, DType::F16, DType::BF16];

/// The CPU levels the compiler can target, per ISA, lowest first.
pub const X86_64_LEVELS: &[&str] = &["x86-64", "x86-64-v3", "x86-64-v4"];
pub const AARCH64_LEVELS: &[&str] = &["generic", "neoverse-n1", "cortex-a78ae"];

/// Whether this CPU runs code compiled for `level` of `arch` (detected at run time).
pub fn cpu_runs(arch: NativeArch, level: &str) -> bool {
    if Arch::host() != Some(arch.arch()) {
        return false;
    }
    host_runs(level)
}

#[cfg(target_arch = "x86_64")]
fn host_runs(level: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    let v3 = || {
        has!("avx2") && has!("fma") && has!("bmi1") && has!("bmi2") && has!("lzcnt") && has!("movbe") && has!("f16c")
    };
    match level {
        "x86-64" => true,
        "x86-64-v3" => v3(),
        "x86-64-v4" => {
            v3() && has!("avx512f") && has!("avx512bw") && has!("avx512cd") && has!("avx512dq") && has!("avx512vl")
        }
        _ => false,
    }
}

#[cfg(target_arch = "aarch64")]
fn host_runs(level: &str) -> bool {
    use std::arch::is_aarch64_feature_detected as has;
    match level {
        "generic" => true,
        // Armv8.2 cores: both add fp16 arithmetic, dot product and RCpc.
        "neoverse-n1" | "cortex-a78ae" => has!("fp16") && has!("dotprod") && has!("rcpc"),
        _ => false,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn host_runs(_level: &str) -> bool {
    false
}

/// Checks a decoded native section against the plan: every level's object
/// loads for its ISA (parsed and relocated, not mapped) and defines every
/// function; every native instruction names a function whose arity and
/// dtypes match its tensors. Errors say what is wrong.
pub fn validate_section(section: &NativeSection, plan: &Plan) -> std::result::Result<(), String> {
    for level in &section.levels {
        let known = match level.arch {
            NativeArch::X86_64 => X86_64_LEVELS,
            NativeArch::Aarch64 => AARCH64_LEVELS,
        };
        if !known.contains(&level.level.as_str()) {
            return Err(format!("unknown {:?} level {:?}", level.arch, level.level));
        }
        let defined =
            LoadedObject::check(&level.object, level.arch.arch()).map_err(|e| format!("level {}: {e}", level.level))?;
        for f in &section.functions {
            if !defined.contains(&f.symbol) {
                return Err(format!("level {}: function {} is not defined", level.level, f.symbol));
            }
        }
    }
    for f in &section.functions {
        // The generated code reads and writes elements of these dtypes
        // only (a row function's kernel operands and result are f32; its
        // prologue's operands may be any of them): a function declaring
        // another would be given buffers of another element size.
        let dtypes_ok = match f.shape {
            FunctionShape::Elementwise => {
                f.input_dtypes.iter().chain([&f.output_dtype]).all(|d| NATIVE_DTYPES.contains(d))
            }
            FunctionShape::Rows { prologue, epilogue, .. } => {
                let n = f.input_dtypes.len();
                let e = epilogue.map_or(0, |e| e as usize).min(n);
                let (rest, epi) = f.input_dtypes.split_at(n - e);
                let (pro, kernel) = rest.split_at((prologue as usize).min(rest.len()));
                pro.iter().chain(epi).all(|d| NATIVE_DTYPES.contains(d))
                    && kernel.iter().chain([&f.output_dtype]).all(|&d| d == DType::F32)
            }
        };
        if !dtypes_ok {
            return Err(format!(
                "function {}: operand dtypes {:?} → {}: native code takes f32, bool, i32, i64, f16 and bf16 elements (a row function's kernel operands and result f32)",
                f.symbol, f.input_dtypes, f.output_dtype
            ));
        }
        if f.can_fail && f.shape != FunctionShape::Elementwise {
            return Err(format!("function {}: a row function cannot fail", f.symbol));
        }
        if f.inputs.len() != f.input_dtypes.len() {
            return Err(format!(
                "function {}: {} modes for {} operands",
                f.symbol,
                f.inputs.len(),
                f.input_dtypes.len()
            ));
        }
    }
    for (i, instr) in plan.instrs.iter().enumerate() {
        let Some(function) = instr.op.native_function() else { continue };
        let f = section
            .functions
            .get(function as usize)
            .ok_or_else(|| format!("instruction {i}: native function {function} of {}", section.functions.len()))?;
        let (prologue, epilogue) = match &instr.op {
            InstrOp::NativeKernel { prologue, epilogue, .. } => {
                (prologue.as_ref().map_or(0, |p| p.inputs as usize), epilogue.as_ref().map(|e| e.inputs))
            }
            _ => (0, None),
        };
        let extras = epilogue.map_or(0, |e| e as usize);
        let outputs = 1 + usize::from(prologue > 0) + usize::from(epilogue.is_some());
        if f.inputs.len() != instr.inputs.len() || instr.outputs.len() != outputs {
            return Err(format!(
                "instruction {i}: native function {} takes {} operands and {outputs} output(s), the instruction has {} and {}",
                f.symbol,
                f.inputs.len(),
                instr.inputs.len(),
                instr.outputs.len()
            ));
        }
        let dtype = |t: u32| plan.tensors.get(t as usize).map(|d| d.dtype);
        let ins_ok = instr.inputs.iter().zip(&f.input_dtypes).all(|(&t, &d)| dtype(t) == Some(d));
        if !ins_ok || instr.outputs.iter().any(|&t| dtype(t) != Some(f.output_dtype)) {
            return Err(format!("instruction {i}: tensor dtypes differ from native function {}'s", f.symbol));
        }
        match (&instr.op, f.shape) {
            (InstrOp::Native { .. }, FunctionShape::Elementwise) => {}
            (
                InstrOp::NativeKernel { fallback, .. },
                FunctionShape::Rows { len, out_len, prologue: p, epilogue: e },
            ) if p as usize == prologue && e == epilogue => {
                // A kernel and axis a row function computes (checked once
                // more against the run's shapes: `rows_fit`), with one
                // output per row for a reduction, a whole row otherwise.
                // The kernel's first operand: the prologue's result or operand 0.
                let x = if prologue > 0 { instr.outputs[1] } else { instr.inputs[0] };
                let rank = plan.tensors.get(x as usize).map_or(0, |d| d.shape.len());
                let supported = row_geometry(fallback, &vec![2; rank]).is_some();
                let want_out = if matches!(fallback, Kernel::Reduce { .. }) { 1 } else { len };
                if !supported || len == 0 || out_len != want_out {
                    return Err(format!(
                        "instruction {i}: native function {} ({len} → {out_len} per row) cannot stand for its fallback {}",
                        f.symbol,
                        fallback.name()
                    ));
                }
                let kernel_operands = (instr.inputs.len() + 1).saturating_sub(prologue.max(1) + extras);
                if !row_operands(fallback).contains(&kernel_operands) || instr.inputs.len() < prologue.max(1) + extras {
                    return Err(format!(
                        "instruction {i}: a native {} takes {:?} operands, not {kernel_operands}",
                        fallback.name(),
                        row_operands(fallback),
                    ));
                }
            }
            (_, shape) => {
                return Err(format!(
                    "instruction {i}: a {} cannot call native function {} ({shape:?})",
                    instr.op.name(),
                    f.symbol
                ));
            }
        }
    }
    Ok(())
}

/// The native signature, fixed by the compiler (see [`NativeFunction`]).
type NativeFn = unsafe extern "C" fn(*const *const u8, *mut u8, usize, usize);
/// The signature of a function that [`NativeFunction::can_fail`]: nonzero
/// when an element met an integer division by zero.
type FallibleFn = unsafe extern "C" fn(*const *const u8, *mut u8, usize, usize) -> i32;

/// A resolved function, called with the signature its declaration says.
#[derive(Copy, Clone)]
enum Entry {
    Plain(NativeFn),
    Fallible(FallibleFn),
}

/// A section's best level for this CPU, mapped and resolved.
pub struct NativeCode {
    /// Keeps the code mapped for as long as the pointers below live.
    _object: LoadedObject,
    functions: Vec<Entry>,
    pub level: String,
}

impl std::fmt::Debug for NativeCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NativeCode({}, {} functions)", self.level, self.functions.len())
    }
}

impl NativeCode {
    /// Maps the best level of `section` this CPU runs; None when none does.
    pub fn load(section: &NativeSection) -> std::result::Result<Option<NativeCode>, String> {
        let Some(level) = section.levels.iter().rev().find(|l| cpu_runs(l.arch, &l.level)) else {
            return Ok(None);
        };
        let object = LoadedObject::load(&level.object, level.arch.arch())?;
        let mut functions = Vec::with_capacity(section.functions.len());
        for f in &section.functions {
            let addr = object.function(&f.symbol).ok_or_else(|| format!("function {} is not defined", f.symbol))?;
            // SAFETY: `addr` is a function symbol of a validated object
            // mapped read + execute; the compiler emits it with `NativeFn`'s
            // ABI, or `FallibleFn`'s where it declares it can fail.
            functions.push(unsafe {
                if f.can_fail {
                    Entry::Fallible(std::mem::transmute::<*const u8, FallibleFn>(addr))
                } else {
                    Entry::Plain(std::mem::transmute::<*const u8, NativeFn>(addr))
                }
            });
        }
        Ok(Some(NativeCode { _object: object, functions, level: level.level.clone() }))
    }
}

/// Runs native call `function` (or, when `code` is None or the operands are
/// not shaped as the function expects, the portable `program`).
pub(crate) fn run_native(
    code: Option<&NativeCode>,
    section: &NativeSection,
    function: u32,
    program: &[FusedOp],
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    out: &mut TensorMut<'_>,
) -> Result<()> {
    let native =
        code.and_then(|c| Some((c.functions.get(function as usize)?, section.functions.get(function as usize)?)));
    let Some((&f, _)) = native.filter(|(_, sig)| shapes_fit(sig, ins, out)) else {
        let out = TensorMut { dtype: out.dtype, shape: out.shape, data: &mut *out.data };
        return kiln_kernels::fused(program, ins, out, cx);
    };
    let total = out.data.len() / out.dtype.size_bytes();
    let mut ptrs = [std::ptr::null::<u8>(); kiln_isa::fused::MAX_FUSED_INPUTS];
    for (p, t) in ptrs.iter_mut().zip(ins) {
        *p = t.data.as_ptr();
    }
    let (ptrs, dst) = (Shared(ptrs.as_ptr()), SharedMut(out.data.as_mut_ptr()));
    let zero_divisor = AtomicBool::new(false);
    cx.threads().for_each_element_range(total, |start, end| {
        let (ptrs, dst) = (&ptrs, &dst);
        // SAFETY: `shapes_fit` checked every operand holds the elements its
        // mode indexes (`total`, one, or `period`·(outer) with `(i / inner)
        // % period` in range) and the output `total`; each
        // range writes only its own output elements. Each function is
        // called with the signature its declaration says.
        let status = unsafe {
            match f {
                Entry::Plain(f) => {
                    f(ptrs.0, dst.0, start, end);
                    0
                }
                Entry::Fallible(f) => f(ptrs.0, dst.0, start, end),
            }
        };
        if status != 0 {
            zero_divisor.store(true, Ordering::Relaxed);
        }
    });
    if zero_divisor.into_inner() {
        // The portable program meets the same zero divisor and fails with
        // the kernels' own error (its results are the output otherwise).
        let out = TensorMut { dtype: out.dtype, shape: out.shape, data: &mut *out.data };
        return kiln_kernels::fused(program, ins, out, cx);
    }
    Ok(())
}

/// Whether the operands and output have the dtypes and shapes `sig` was compiled for.
fn shapes_fit(sig: &NativeFunction, ins: &[TensorRef<'_>], out: &TensorMut<'_>) -> bool {
    let total = out.shape.iter().product::<usize>();
    if sig.shape != FunctionShape::Elementwise
        || ins.len() != sig.inputs.len()
        || out.dtype != sig.output_dtype
        || out.data.len() != total * out.dtype.size_bytes()
    {
        return false;
    }
    ins.iter().zip(&sig.inputs).zip(&sig.input_dtypes).all(|((t, mode), &dtype)| {
        let n = t.shape.iter().product::<usize>();
        let shape_ok = match (mode, broadcast_of(t.shape, out.shape)) {
            (InputMode::Splat, _) => n == 1,
            (m, Some(actual)) => *m == actual,
            (_, None) => false,
        };
        t.dtype == dtype && shape_ok && t.data.len() == n * dtype.size_bytes()
    })
}

/// Runs native row function `function` for a
/// [`InstrOp::NativeKernel`] (or, when `code` is None or the operands'
/// sizes differ from the compiled ones, its fallback kernel: `(kernel,
/// run)`, `run` taking the kernel's operands). With a prologue, `x` is the
/// instruction's second output: the fallback computes it with the
/// prologue's program from the first `inputs` operands, then runs the
/// kernel on it and the other operands. With an epilogue, `z` is the last
/// output: the fallback then runs the epilogue's program on the kernel's
/// result and the last `inputs` operands into it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_native_kernel(
    code: Option<&NativeCode>,
    section: &NativeSection,
    function: u32,
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    out: &mut TensorMut<'_>,
    prologue: Option<(&RowPrologue, &mut TensorMut<'_>)>,
    epilogue: Option<(&RowEpilogue, &mut TensorMut<'_>)>,
    (fallback, run_fallback): (&Kernel, impl FnOnce(&mut Context, &[TensorRef<'_>], &mut TensorMut<'_>) -> Result<()>),
) -> Result<()> {
    let native =
        code.and_then(|c| Some((c.functions.get(function as usize)?, section.functions.get(function as usize)?)));
    let k = prologue.as_ref().map_or(0, |(p, _)| p.inputs as usize);
    let e = epilogue.as_ref().map_or(0, |(p, _)| p.inputs as usize);
    if ins.len() < k.max(1) + e {
        return Err(kiln_kernels::KernelError::Shape {
            kernel: "native_kernel",
            detail: format!("{} operands", ins.len()),
        });
    }
    // The prologue's (or the kernel's) operands, then the epilogue's.
    let (ins_row, extras) = ins.split_at(ins.len() - e);
    // Row functions cannot fail (checked at load).
    let native = native.and_then(|(f, sig)| match f {
        Entry::Plain(f) => Some((f, sig)),
        Entry::Fallible(_) => None,
    });
    let fit = native.and_then(|(&f, sig)| {
        let (rows, len) = match &prologue {
            Some((_, x)) => {
                let x_ref = TensorRef { dtype: x.dtype, shape: x.shape, data: &*x.data };
                let fits = prologue_fits(sig, &ins_row[..k], &x_ref);
                rows_fit(sig, fallback, &x_ref, &ins_row[k..], out).filter(|_| fits)?
            }
            None => rows_fit(sig, fallback, &ins_row[0], &ins_row[1..], out)?,
        };
        let epilogue_ok = match &epilogue {
            Some((_, z)) => epilogue_fits(sig, extras, out, z),
            None => true,
        };
        epilogue_ok.then_some((f, rows, len))
    });
    let Some((f, rows, len)) = fit else {
        run_unmerged(cx, ins_row, out, prologue, run_fallback)?;
        let Some((p, z)) = epilogue else { return Ok(()) };
        let y = TensorRef { dtype: out.dtype, shape: out.shape, data: &*out.data };
        let operands = p.operands(y, extras);
        let z = TensorMut { dtype: z.dtype, shape: z.shape, data: &mut *z.data };
        return kiln_kernels::fused(&p.program, &operands, z, cx);
    };
    let mut ptrs = [std::ptr::null::<u8>(); kiln_isa::fused::MAX_FUSED_INPUTS + 3];
    let outputs = usize::from(prologue.is_some()) + usize::from(epilogue.is_some());
    if ins.len() + outputs > ptrs.len() {
        return Err(kiln_kernels::KernelError::Shape {
            kernel: "native_kernel",
            detail: format!("{} operands", ins.len()),
        });
    }
    for (p, t) in ptrs.iter_mut().zip(ins) {
        *p = t.data.as_ptr();
    }
    // After the operands: where the prologue's result, then the epilogue's, go.
    let written = [prologue.map(|(_, x)| x.data.as_mut_ptr()), epilogue.map(|(_, z)| z.data.as_mut_ptr())];
    for (slot, p) in ptrs[ins.len()..].iter_mut().zip(written.into_iter().flatten()) {
        *slot = p.cast_const();
    }
    let (ptrs, dst) = (Shared(ptrs.as_ptr()), SharedMut(out.data.as_mut_ptr()));
    cx.threads().for_each_row_range(rows, len, |start, end| {
        let (ptrs, dst) = (&ptrs, &dst);
        // SAFETY: `rows_fit` checked the kernel's first operand (operand 0,
        // or the prologue's output) holds `rows` rows of `len` f32s, every
        // other kernel operand `len`, and the output `rows` rows of the
        // function's `out_len`; `prologue_fits` that each prologue operand
        // holds what its mode indexes for elements of that first operand,
        // `epilogue_fits` the same of each epilogue operand for elements of
        // the output, and that the epilogue's result is shaped like the
        // output. Each range writes only its own rows of the outputs;
        // outputs overlap no operand and each other (validated at load).
        unsafe { f(ptrs.0, dst.0, start, end) }
    });
    Ok(())
}

/// The fallback of a native kernel without its epilogue: the prologue's
/// program (if any) into its tensor `x`, then the kernel.
fn run_unmerged(
    cx: &mut Context,
    ins: &[TensorRef<'_>],
    out: &mut TensorMut<'_>,
    prologue: Option<(&RowPrologue, &mut TensorMut<'_>)>,
    run_fallback: impl FnOnce(&mut Context, &[TensorRef<'_>], &mut TensorMut<'_>) -> Result<()>,
) -> Result<()> {
    let Some((p, x)) = prologue else { return run_fallback(cx, ins, out) };
    let k = p.inputs as usize;
    {
        let xm = TensorMut { dtype: x.dtype, shape: x.shape, data: &mut *x.data };
        kiln_kernels::fused(&p.program, &ins[..k], xm, cx)?;
    }
    let mut operands = Vec::with_capacity(1 + ins.len() - k);
    operands.push(TensorRef { dtype: x.dtype, shape: x.shape, data: &*x.data });
    operands.extend(ins[k..].iter().map(|t| TensorRef { dtype: t.dtype, shape: t.shape, data: t.data }));
    run_fallback(cx, &operands, out)
}

/// Whether the prologue operands `ins` have the dtypes and shapes row
/// function `sig` reads them with, computing a first operand shaped like `x`.
fn prologue_fits(sig: &NativeFunction, ins: &[TensorRef<'_>], x: &TensorRef<'_>) -> bool {
    let FunctionShape::Rows { prologue, .. } = sig.shape else { return false };
    if prologue as usize != ins.len() || ins.is_empty() || x.dtype != DType::F32 {
        return false;
    }
    modes_fit(&sig.inputs, &sig.input_dtypes, ins, x.shape)
}

/// Whether the epilogue operands `ins` have the dtypes and shapes row
/// function `sig` reads them with for elements of the kernel's output `y`,
/// and its result `z` is an f32 tensor shaped like `y`.
fn epilogue_fits(sig: &NativeFunction, ins: &[TensorRef<'_>], y: &TensorMut<'_>, z: &TensorMut<'_>) -> bool {
    let FunctionShape::Rows { epilogue: Some(e), .. } = sig.shape else { return false };
    let arity = sig.inputs.len().min(sig.input_dtypes.len());
    if e as usize != ins.len() || ins.len() > arity || z.dtype != DType::F32 || z.shape != y.shape {
        return false;
    }
    let n = z.shape.iter().product::<usize>();
    let from = arity - ins.len();
    z.data.len() == n * z.dtype.size_bytes() && modes_fit(&sig.inputs[from..], &sig.input_dtypes[from..], ins, y.shape)
}

/// Whether each operand of `ins` has its dtype and the shape its mode reads
/// for elements of a tensor shaped `shape`.
fn modes_fit(modes: &[InputMode], dtypes: &[DType], ins: &[TensorRef<'_>], shape: &[usize]) -> bool {
    ins.iter().zip(modes).zip(dtypes).all(|((t, mode), &dtype)| {
        let n = t.shape.iter().product::<usize>();
        let shape_ok = match (mode, broadcast_of(t.shape, shape)) {
            (InputMode::Splat, _) => n == 1,
            (m, Some(actual)) => *m == actual,
            (_, None) => false,
        };
        t.dtype == dtype && shape_ok && t.data.len() == n * dtype.size_bytes()
    })
}

/// `(rows, len)` when the kernel's first operand `x`, its other operands
/// `params` and the output have the dtypes and sizes row function `sig` was
/// compiled for, as `fallback` reads them; None otherwise.
fn rows_fit(
    sig: &NativeFunction,
    fallback: &Kernel,
    x: &TensorRef<'_>,
    params: &[TensorRef<'_>],
    out: &TensorMut<'_>,
) -> Option<(usize, usize)> {
    let FunctionShape::Rows { len, out_len, prologue, epilogue } = sig.shape else { return None };
    let (len, out_len) = (usize::try_from(len).ok()?, usize::try_from(out_len).ok()?);
    let k = (prologue as usize).max(1);
    let arity = sig.inputs.len();
    if params.len() + k + epilogue.map_or(0, |e| e as usize) != arity
        || sig.input_dtypes.len() != arity
        || params.len() > 2
        || len == 0
    {
        return None;
    }
    if out.dtype != sig.output_dtype {
        return None;
    }
    if row_geometry(fallback, x.shape)? != (len, out_len) {
        return None;
    }
    let bytes = |t: &TensorRef<'_>| t.shape.iter().product::<usize>() * t.dtype.size_bytes();
    let n = x.shape.iter().product::<usize>();
    let rows = n / len;
    let out_n = out.shape.iter().product::<usize>();
    let x_ok = x.dtype == DType::F32 && (prologue > 0 || x.dtype == sig.input_dtypes[0]);
    let dtypes_ok = params.iter().zip(&sig.input_dtypes[k..]).all(|(t, &d)| t.dtype == d);
    let params_ok = params.iter().all(|t| t.shape.iter().product::<usize>() == len && t.data.len() == bytes(t));
    let ok = x_ok
        && dtypes_ok
        && params_ok
        && n % len == 0
        && x.data.len() == bytes(x)
        && out_n == rows * out_len
        && out.data.len() == out_n * out.dtype.size_bytes();
    ok.then_some((rows, len))
}

/// Pointers handed to the pool's threads (each range touches its own part).
struct Shared(*const *const u8);
struct SharedMut(*mut u8);
// SAFETY: see `run_native`: the operands are only read, and the output
// ranges of distinct calls are disjoint.
unsafe impl Sync for Shared {}
unsafe impl Sync for SharedMut {}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(shape: &'a [usize], data: &'a [u8]) -> TensorRef<'a> {
        TensorRef { dtype: DType::F32, shape, data }
    }

    /// The run-time size check before a row function runs: what the row
    /// function was compiled for, as the fallback kernel defines a row.
    #[test]
    fn rows_fit_only_the_compiled_sizes() {
        let sig = |len, out_len, n| NativeFunction {
            symbol: "f".into(),
            inputs: vec![InputMode::Full; n],
            input_dtypes: vec![DType::F32; n],
            output_dtype: DType::F32,
            shape: FunctionShape::Rows { len, out_len, prologue: 0, epilogue: None },
            can_fail: false,
        };
        let x = [0u8; 24];
        let w = [0u8; 12];
        let mut o = [0u8; 24];
        let softmax = Kernel::Softmax { axis: 1, log: false };
        let fits = |sig: &NativeFunction, k: &Kernel, ins: &[TensorRef<'_>], oshape: &[usize], o: &mut [u8]| {
            rows_fit(sig, k, &ins[0], &ins[1..], &TensorMut { dtype: DType::F32, shape: oshape, data: o })
        };
        assert_eq!(fits(&sig(3, 3, 1), &softmax, &[t(&[2, 3], &x)], &[2, 3], &mut o), Some((2, 3)));
        // Another row length, a softmax over the first axis, a wrong output.
        assert_eq!(fits(&sig(2, 2, 1), &softmax, &[t(&[3, 2], &x)], &[3, 2], &mut o), Some((3, 2)));
        assert_eq!(fits(&sig(3, 3, 1), &softmax, &[t(&[3, 2], &x)], &[3, 2], &mut o), None);
        let first = Kernel::Softmax { axis: 0, log: false };
        assert_eq!(fits(&sig(3, 3, 1), &first, &[t(&[2, 3], &x)], &[2, 3], &mut o), None);
        assert_eq!(fits(&sig(3, 3, 1), &softmax, &[t(&[2, 3], &x)], &[2, 3], &mut o[..20]), None);
        // A layer norm's weight of one row; a weight of another size.
        let ln = Kernel::LayerNorm { normalized_rank: 1, eps: 1e-5 };
        assert_eq!(fits(&sig(3, 3, 2), &ln, &[t(&[2, 3], &x), t(&[3], &w)], &[2, 3], &mut o), Some((2, 3)));
        assert_eq!(fits(&sig(3, 3, 2), &ln, &[t(&[2, 3], &x), t(&[2], &w[..8])], &[2, 3], &mut o), None);
        // A reduction writes one element per row.
        let sum = Kernel::Reduce { kind: ReduceKind::Sum, axes: vec![1] };
        assert_eq!(fits(&sig(3, 1, 1), &sum, &[t(&[2, 3], &x)], &[2, 1], &mut o[..8]), Some((2, 3)));
        assert_eq!(fits(&sig(3, 1, 1), &sum, &[t(&[2, 3], &x)], &[2, 3], &mut o), None);
        // Data shorter than the shape says.
        assert_eq!(fits(&sig(3, 3, 1), &softmax, &[t(&[2, 3], &x[..20])], &[2, 3], &mut o), None);
    }

    #[test]
    fn broadcasts_are_classified() {
        assert_eq!(broadcast_of(&[2, 8, 32], &[2, 8, 32]), Some(InputMode::Full));
        assert_eq!(broadcast_of(&[1, 1], &[2, 8, 32]), Some(InputMode::Splat));
        assert_eq!(broadcast_of(&[32], &[2, 8, 32]), Some(InputMode::Broadcast { inner: 1, period: 32 }));
        assert_eq!(broadcast_of(&[1, 3, 1, 1], &[2, 3, 16, 16]), Some(InputMode::Broadcast { inner: 256, period: 3 }));
        assert_eq!(broadcast_of(&[8, 1], &[2, 8, 32]), Some(InputMode::Broadcast { inner: 32, period: 8 }));
        // Two separate blocks, a mismatched dim, a longer operand.
        assert_eq!(broadcast_of(&[2, 1, 32], &[2, 8, 32]), None);
        assert_eq!(broadcast_of(&[7], &[2, 8, 32]), None);
        assert_eq!(broadcast_of(&[1, 2, 8, 32], &[2, 8, 32]), None);
    }
}
