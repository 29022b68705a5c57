//! Native code for fused elementwise groups and row-wise kernels (`kiln
//! compile --target x86_64|aarch64`, feature `native`).
//!
//! After lowering, every `Fused` call whose operands are f32 and either
//! shaped like its output or single elements, and whose ops [`emit`] can
//! lower, becomes an `InstrOp::Native` call of a generated function (keeping
//! its program as the portable fallback); every f32 softmax / log-softmax
//! over the last axis, layer norm, RMS norm and sum / mean / max over the
//! last axis with a static row length becomes an `InstrOp::NativeKernel`
//! of a row function (`emit::rows`), keeping its kernel call as the fallback. All functions go into one MLIR
//! module, compiled once per requested CPU level ([`llvm`]) into the
//! artifact's native section. A group that cannot be lowered stays a
//! portable call: never an error, never silently different.

#[cfg(feature = "native")]
pub mod emit;
#[cfg(feature = "native")]
pub mod llvm;

use kiln_runtime::native::{NativeArch, AARCH64_LEVELS, X86_64_LEVELS};

/// What `--target x86_64|aarch64` and `--cpu` ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeTarget {
    pub arch: NativeArch,
    /// CPU levels, lowest first (each one object in the artifact).
    pub levels: Vec<String>,
}

impl NativeTarget {
    /// The ISA named by `--target`, if it is a native one.
    pub fn arch_from_name(name: &str) -> Option<NativeArch> {
        match name {
            "x86_64" | "x86-64" => Some(NativeArch::X86_64),
            "aarch64" | "arm64" => Some(NativeArch::Aarch64),
            _ => None,
        }
    }

    /// `arch` with the levels of `--cpu` (comma-separated), or the default:
    /// the ISA's baseline, which every CPU of it runs, plus `x86-64-v3` on x86-64.
    pub fn new(arch: NativeArch, cpu: Option<&str>) -> Result<NativeTarget, String> {
        let known = match arch {
            NativeArch::X86_64 => X86_64_LEVELS,
            NativeArch::Aarch64 => AARCH64_LEVELS,
        };
        let mut levels: Vec<String> = match cpu {
            None if arch == NativeArch::X86_64 => vec!["x86-64".into(), "x86-64-v3".into()],
            None => vec![known[0].into()],
            Some(list) => list.split(',').map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect(),
        };
        if levels.is_empty() {
            return Err("--cpu names no level".into());
        }
        for l in &levels {
            if !known.contains(&l.as_str()) {
                return Err(format!("unknown --cpu level `{l}` for {arch:?} (known: {})", known.join(", ")));
            }
        }
        // Lowest first, as the loader expects; each level once.
        levels.sort_by_key(|l| known.iter().position(|k| k == l));
        levels.dedup();
        Ok(NativeTarget { arch, levels })
    }
}

#[cfg(feature = "native")]
pub use codegen::compile_plan;

#[cfg(feature = "native")]
mod codegen {
    use super::emit::program_to_mlir;
    use super::emit::rows::{row_function_to_mlir, RowOp};
    use super::llvm::{compile_module, triple};
    use super::NativeTarget;
    use kiln_ir::DType;
    use kiln_runtime::format::{DimRef, Instr, InstrOp, Kernel, Plan};
    use kiln_runtime::native::{
        broadcast_of, row_geometry, FunctionShape, InputMode, LoadedObject, NativeFunction, NativeLevel, NativeSection,
    };
    use std::collections::HashMap;

    fn static_dims(shape: &[DimRef]) -> Option<Vec<usize>> {
        shape
            .iter()
            .map(|d| match d {
                DimRef::Static(v) => usize::try_from(*v).ok(),
                DimRef::Expr(_) => None,
            })
            .collect()
    }

    /// Turns the plan's eligible fused calls into native calls, and its
    /// eligible softmax / norm / last-axis reduction calls into native
    /// kernels ([`row_call`]), and returns the native section (None when no
    /// call qualified). Calls with the same code share one function (a CNN
    /// repeats its SiLU group per layer, a transformer its norms): LLVM's
    /// time grows with the module.
    pub fn compile_plan(plan: &mut Plan, target: &NativeTarget) -> Result<Option<NativeSection>, String> {
        let mut funcs = String::new();
        let mut functions = Vec::new();
        let mut calls = Vec::new();
        // The function text under a fixed name → its function index.
        let mut seen: HashMap<String, u32> = HashMap::new();
        for (i, instr) in plan.instrs.iter().enumerate() {
            let Some((key, text_for, function)) = candidate(plan, instr, target) else { continue };
            if let Some(&f) = seen.get(&key) {
                calls.push((i, f));
                continue;
            }
            let symbol = format!("kiln_fused_{}", functions.len());
            let Ok(text) = text_for(&symbol) else { continue };
            funcs.push_str(&text);
            let f = functions.len() as u32;
            seen.insert(key, f);
            functions.push(NativeFunction { symbol, ..function });
            calls.push((i, f));
        }
        if functions.is_empty() {
            return Ok(None);
        }
        let module = format!("module {{\n{funcs}}}\n");
        let mut levels = Vec::new();
        for level in &target.levels {
            let object = compile_module(&module, triple(target.arch), level)?;
            // The runtime's own loader must accept what we ship.
            LoadedObject::check(&object, target.arch.arch())
                .map_err(|e| format!("the {level} object is not loadable (compiler bug): {e}"))?;
            levels.push(NativeLevel { arch: target.arch, level: level.clone(), object });
        }
        for &(i, function) in &calls {
            let instr = &mut plan.instrs[i];
            let op = std::mem::replace(&mut instr.op, InstrOp::Jump { target: 0 });
            instr.op = match op {
                InstrOp::Call(Kernel::Fused { program }) => InstrOp::Native { function, program },
                InstrOp::Call(fallback) => InstrOp::NativeKernel { function, fallback },
                other => other,
            };
        }
        Ok(Some(NativeSection { functions, levels }))
    }

    /// The MLIR text of a function under a given symbol.
    type TextFor<'a> = Box<dyn Fn(&str) -> Result<String, super::emit::Unsupported> + 'a>;

    /// An instruction native code can stand for: its dedup key (the
    /// function's text under a fixed name), the text under a given name, and
    /// the function's signature (symbol left empty).
    fn candidate<'a>(
        plan: &Plan,
        instr: &'a Instr,
        target: &NativeTarget,
    ) -> Option<(String, TextFor<'a>, NativeFunction)> {
        let InstrOp::Call(kernel) = &instr.op else { return None };
        if let Kernel::Fused { program } = kernel {
            let modes = input_modes(plan, &instr.inputs, &instr.outputs)?;
            let key = program_to_mlir("f", program, &modes).ok()?;
            let function = NativeFunction {
                symbol: String::new(),
                input_dtypes: vec![DType::F32; modes.len()],
                inputs: modes.clone(),
                output_dtype: DType::F32,
                shape: FunctionShape::Elementwise,
            };
            return Some((key, Box::new(move |s: &str| program_to_mlir(s, program, &modes)), function));
        }
        let (op, len) = row_call(plan, instr)?;
        let arch = target.arch;
        let key = row_function_to_mlir("f", op, len, arch).ok()?;
        let function = NativeFunction {
            symbol: String::new(),
            input_dtypes: vec![DType::F32; op.operands()],
            // Operand 0 is read row by row, the others whole for every row.
            inputs: (0..op.operands())
                .map(|k| if k == 0 { InputMode::Full } else { InputMode::Broadcast { inner: 1, period: len } })
                .collect(),
            output_dtype: DType::F32,
            shape: FunctionShape::Rows { len, out_len: op.out_len(len) },
        };
        Some((key, Box::new(move |s: &str| row_function_to_mlir(s, op, len, arch)), function))
    }

    /// A softmax, norm or last-axis reduction call a row function computes:
    /// f32 throughout, its row length static (other dims may be symbolic).
    fn row_call(plan: &Plan, instr: &Instr) -> Option<(RowOp, u64)> {
        let InstrOp::Call(kernel) = &instr.op else { return None };
        let op = RowOp::of(kernel, instr.inputs.len())?;
        let tensors = instr.inputs.iter().chain(&instr.outputs).map(|&t| plan.tensors.get(t as usize));
        for d in tensors {
            if d?.dtype != DType::F32 {
                return None;
            }
        }
        let x = &plan.tensors[instr.inputs[0] as usize].shape;
        // The row's dims must be static: the geometry must not change with
        // the symbolic dims' values.
        let dims = |unknown: usize| -> Vec<usize> {
            x.iter()
                .map(|d| match d {
                    DimRef::Static(v) => usize::try_from(*v).unwrap_or(usize::MAX),
                    DimRef::Expr(_) => unknown,
                })
                .collect()
        };
        let (len, out_len) = row_geometry(kernel, &dims(1))?;
        if row_geometry(kernel, &dims(2))? != (len, out_len) || len == 0 || len == usize::MAX {
            return None;
        }
        Some((op, len as u64))
    }

    /// How each operand of a fused call is read natively: all f32, each
    /// shaped like the output (same dims, symbolic ones included), one
    /// element, or (static shapes) a contiguous-block broadcast
    /// (`kiln_runtime::native::broadcast_of`). None leaves the call portable.
    fn input_modes(plan: &Plan, inputs: &[u32], outputs: &[u32]) -> Option<Vec<InputMode>> {
        let out = plan.tensors.get(*outputs.first()? as usize)?;
        if out.dtype != DType::F32 || outputs.len() != 1 {
            return None;
        }
        inputs
            .iter()
            .map(|&t| {
                let d = plan.tensors.get(t as usize)?;
                if d.dtype != DType::F32 {
                    return None;
                }
                if d.shape == out.shape {
                    Some(InputMode::Full)
                } else if d.shape.iter().all(|s| *s == DimRef::Static(1)) {
                    Some(InputMode::Splat)
                } else {
                    broadcast_of(&static_dims(&d.shape)?, &static_dims(&out.shape)?)
                }
            })
            .collect()
    }
}
