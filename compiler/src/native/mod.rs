//! Native code for fused elementwise groups (`kiln compile --target
//! x86_64|aarch64`, feature `native`).
//!
//! After lowering, every `Fused` call whose operands are f32 and either
//! shaped like its output or single elements, and whose ops [`emit`] can
//! lower, becomes an `InstrOp::Native` call of a generated function (keeping
//! its program as the portable fallback). All functions go into one MLIR
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
    use super::llvm::{compile_module, triple};
    use super::NativeTarget;
    use kiln_ir::DType;
    use kiln_runtime::format::{DimRef, InstrOp, Kernel, Plan};
    use kiln_runtime::native::{broadcast_of, InputMode, LoadedObject, NativeFunction, NativeLevel, NativeSection};
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

    /// Turns the plan's eligible fused calls into native calls and returns
    /// the native section (None when no group qualified). Calls with the
    /// same program and operand modes share one function (a CNN repeats its
    /// SiLU group per layer): LLVM's time grows with the module.
    pub fn compile_plan(plan: &mut Plan, target: &NativeTarget) -> Result<Option<NativeSection>, String> {
        let mut funcs = String::new();
        let mut functions = Vec::new();
        let mut calls = Vec::new();
        // The function text under a fixed name → its function index.
        let mut seen: HashMap<String, u32> = HashMap::new();
        for (i, instr) in plan.instrs.iter().enumerate() {
            let InstrOp::Call(Kernel::Fused { program }) = &instr.op else { continue };
            let Some(modes) = input_modes(plan, &instr.inputs, &instr.outputs) else { continue };
            let Ok(key) = program_to_mlir("f", program, &modes) else { continue };
            if let Some(&f) = seen.get(&key) {
                calls.push((i, f));
                continue;
            }
            let symbol = format!("kiln_fused_{}", functions.len());
            let Ok(text) = program_to_mlir(&symbol, program, &modes) else { continue };
            funcs.push_str(&text);
            let f = functions.len() as u32;
            seen.insert(key, f);
            functions.push(NativeFunction {
                symbol,
                input_dtypes: vec![DType::F32; modes.len()],
                inputs: modes,
                output_dtype: DType::F32,
            });
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
            if let InstrOp::Call(Kernel::Fused { program }) = &mut instr.op {
                let program = std::mem::take(program);
                instr.op = InstrOp::Native { function, program };
            }
        }
        Ok(Some(NativeSection { functions, levels }))
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
