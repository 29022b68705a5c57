//! Native code for fused elementwise groups and row-wise kernels (`kiln
//! compile --target x86_64|aarch64`, feature `native`).
//!
//! After lowering, every `Fused` call whose operands and result are f32,
//! bool, i32, i64, f16 or bf16, each operand shaped like its output, a single element
//! or a contiguous-block broadcast, and whose ops [`emit`] can lower (and
//! every lone elementwise call over a tensor that is not f32, as a one-op
//! program) becomes an `InstrOp::Native` call of a generated function
//! (keeping its program as the portable fallback); every f32 softmax / log-softmax
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
    /// Merge an elementwise call reading a row function's result right
    /// after it into the row function (on by default; off to measure it).
    pub row_epilogues: bool,
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
        Ok(NativeTarget { arch, levels, row_epilogues: true })
    }
}

#[cfg(feature = "native")]
pub use codegen::compile_plan;

#[cfg(feature = "native")]
mod codegen {
    use super::emit::rows::{row_function_to_mlir, Epilogue, Prologue, RowOp};
    use super::emit::{program_function, program_to_mlir};
    use super::llvm::{compile_module, triple};
    use super::NativeTarget;
    use kiln_ir::{BinaryOp, DType, FusedOp};
    use kiln_runtime::format::{DimRef, Instr, InstrOp, Kernel, Plan, RowEpilogue, RowPrologue, Storage};
    use kiln_runtime::native::{
        broadcast_of, row_geometry, FunctionShape, InputMode, LoadedObject, NativeFunction, NativeLevel, NativeSection,
        NATIVE_DTYPES,
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
        merge_prologues(plan, target);
        if target.row_epilogues {
            merge_epilogues(plan, target);
        }
        let mut funcs = String::new();
        let mut functions = Vec::new();
        let mut calls = Vec::new();
        // The function text under a fixed name → its function index.
        let mut seen: HashMap<String, u32> = HashMap::new();
        for (i, instr) in plan.instrs.iter().enumerate() {
            let Some((key, text_for, function)) = candidate(plan, instr, target) else {
                if matches!(instr.op, InstrOp::NativeKernel { .. }) {
                    return Err(format!("instruction {i}: a merged row call has no function (compiler bug)"));
                }
                continue;
            };
            if let Some(&f) = seen.get(&key) {
                calls.push((i, f));
                continue;
            }
            let symbol = format!("kiln_fused_{}", functions.len());
            let text = match text_for(&symbol) {
                Ok(text) => text,
                // A merged prologue or epilogue has no portable form of its
                // own: it was merged only after its function's text was made once.
                Err(e) if matches!(instr.op, InstrOp::NativeKernel { .. }) => {
                    return Err(format!(
                        "instruction {i}: a row function with a prologue or epilogue (compiler bug): {}",
                        e.0
                    ))
                }
                Err(_) => continue,
            };
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
            // A lone elementwise call: its one-op program is the fallback.
            let lone = lone_program(plan, &plan.instrs[i]);
            let instr = &mut plan.instrs[i];
            let op = std::mem::replace(&mut instr.op, InstrOp::Jump { target: 0 });
            instr.op = match (op, lone) {
                (InstrOp::Call(Kernel::Fused { program }), _) => InstrOp::Native { function, program },
                (InstrOp::Call(_), Some(program)) => InstrOp::Native { function, program },
                (InstrOp::Call(fallback), None) => {
                    InstrOp::NativeKernel { function, fallback, prologue: None, epilogue: None }
                }
                (InstrOp::NativeKernel { fallback, prologue, epilogue, .. }, _) => {
                    InstrOp::NativeKernel { function, fallback, prologue, epilogue }
                }
                (other, _) => other,
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
        if let InstrOp::NativeKernel { fallback, prologue, epilogue, .. } = &instr.op {
            return merged_candidate(plan, instr, fallback, prologue.as_ref(), epilogue.as_ref(), target);
        }
        let InstrOp::Call(kernel) = &instr.op else { return None };
        let single = lone_program(plan, instr);
        let program = match kernel {
            Kernel::Fused { program } => Some(program),
            _ => single.as_ref(),
        };
        if let Some(program) = program {
            let program = program.clone();
            let (modes, dtypes) = input_modes(plan, &instr.inputs, &instr.outputs)?;
            let (key, can_fail) = program_function("f", &program, &modes, &dtypes).ok()?;
            let function = NativeFunction {
                symbol: String::new(),
                input_dtypes: dtypes.clone(),
                inputs: modes.clone(),
                output_dtype: plan.tensors.get(instr.outputs[0] as usize)?.dtype,
                shape: FunctionShape::Elementwise,
                can_fail,
            };
            return Some((key, Box::new(move |s: &str| program_to_mlir(s, &program, &modes, &dtypes)), function));
        }
        let (op, len) = row_call(plan, kernel, *instr.inputs.first()?, &instr.inputs[1..], &instr.outputs)?;
        let arch = target.arch;
        let key = row_function_to_mlir("f", op, len, arch, None, None).ok()?;
        let function = NativeFunction {
            symbol: String::new(),
            input_dtypes: vec![DType::F32; op.operands()],
            // Operand 0 is read row by row, the others whole for every row.
            inputs: (0..op.operands())
                .map(|k| if k == 0 { InputMode::Full } else { InputMode::Broadcast { inner: 1, period: len } })
                .collect(),
            output_dtype: DType::F32,
            shape: FunctionShape::Rows { len, out_len: op.out_len(len), prologue: 0, epilogue: None },
            can_fail: false,
        };
        Some((key, Box::new(move |s: &str| row_function_to_mlir(s, op, len, arch, None, None)), function))
    }

    /// [`candidate`] for a row call with a merged prologue or epilogue (or
    /// both): operands the prologue's (or the kernel's first), the kernel's
    /// others, the epilogue's; outputs the kernel's, the prologue's, the
    /// epilogue's.
    fn merged_candidate<'a>(
        plan: &Plan,
        instr: &'a Instr,
        fallback: &'a Kernel,
        prologue: Option<&'a RowPrologue>,
        epilogue: Option<&'a RowEpilogue>,
        target: &NativeTarget,
    ) -> Option<(String, TextFor<'a>, NativeFunction)> {
        let k = prologue.map_or(0, |p| p.inputs as usize);
        let e = epilogue.map_or(0, |p| p.inputs as usize);
        let (row_ins, extras) = instr.inputs.split_at(instr.inputs.len().checked_sub(e)?);
        let x = if prologue.is_some() { *instr.outputs.get(1)? } else { *row_ins.first()? };
        let (op, len) = row_call(plan, fallback, x, row_ins.get(k.max(1)..)?, &instr.outputs[..1])?;
        let pro = match prologue {
            Some(p) => Some((p, input_modes(plan, &row_ins[..k], &[x])?)),
            None => None,
        };
        let epi = match epilogue {
            Some(p) => Some((p, input_modes(plan, extras, &[*instr.outputs.last()?])?)),
            None => None,
        };
        // Operand 0 (computed by the prologue, or read row by row), the
        // kernel's others read whole for every row, the epilogue's.
        let (mut inputs, mut input_dtypes) = match &pro {
            Some((_, (modes, dtypes))) => (modes.clone(), dtypes.clone()),
            None => (vec![InputMode::Full], vec![DType::F32]),
        };
        let others = op.operands() - 1;
        inputs.extend((0..others).map(|_| InputMode::Broadcast { inner: 1, period: len }));
        input_dtypes.extend((0..others).map(|_| DType::F32));
        if let Some((_, (modes, dtypes))) = &epi {
            inputs.extend(modes);
            input_dtypes.extend(dtypes);
        }
        let arch = target.arch;
        let text = move |s: &str| {
            let p = pro.as_ref().map(|(p, (modes, dtypes))| Prologue { program: &p.program, modes, dtypes });
            let ep = epi.as_ref().map(|(p, (modes, dtypes))| Epilogue {
                program: &p.program,
                row: p.row as usize,
                modes,
                dtypes,
            });
            row_function_to_mlir(s, op, len, arch, p, ep)
        };
        let key = text("f").ok()?;
        let function = NativeFunction {
            symbol: String::new(),
            input_dtypes,
            inputs,
            output_dtype: DType::F32,
            shape: FunctionShape::Rows {
                len,
                out_len: op.out_len(len),
                prologue: k as u32,
                epilogue: epilogue.map(|p| p.inputs),
            },
            can_fail: false,
        };
        Some((key, Box::new(text), function))
    }

    /// The one-op fused program of a lone elementwise call (unary, binary,
    /// where, cast, clamp) that reads or writes a bool, i32, i64, f16 or
    /// bf16 tensor:
    /// the fusion pass leaves such calls alone when their operands are
    /// shaped unlike their consumers' (a `[T]` mask before a `[T, T]`
    /// group), and their portable kernels are scalar loops, where f32 ones
    /// run the kernel table's vector code. The program computes what the
    /// kernel does (the fused kernel runs the same element functions). None
    /// for any other call, or when the program's types are not the tensors'.
    fn lone_program(plan: &Plan, instr: &Instr) -> Option<Vec<FusedOp>> {
        let InstrOp::Call(kernel) = &instr.op else { return None };
        let (&out, n) = (instr.outputs.first()?, instr.inputs.len());
        let dtype = |t: u32| plan.tensors.get(t as usize).map(|d| d.dtype);
        let out_dtype = dtype(out)?;
        let program = match (kernel, n) {
            (Kernel::Unary { op }, 1) => vec![FusedOp::Unary { op: *op, x: 0 }],
            (Kernel::Binary { op }, 2) => vec![FusedOp::Binary { op: *op, a: 0, b: 1 }],
            (Kernel::Where {}, 3) => vec![FusedOp::Where { cond: 0, a: 1, b: 2 }],
            (Kernel::Cast {}, 1) => vec![FusedOp::Cast { to: out_dtype, x: 0 }],
            (Kernel::Clamp { min, max }, 1) => vec![FusedOp::Clamp { min: *min, max: *max, x: 0 }],
            _ => return None,
        };
        let dtypes = instr.inputs.iter().map(|&t| dtype(t)).collect::<Option<Vec<DType>>>()?;
        if instr.outputs.len() != 1 || dtypes.iter().chain([&out_dtype]).all(|&d| d == DType::F32) {
            return None;
        }
        let types = kiln_ir::fused_register_types(&program, &dtypes).ok()?;
        (types.last() == Some(&out_dtype)).then_some(program)
    }

    /// A softmax, norm or last-axis reduction a row function computes, of
    /// first operand `x`, other operands `params` and outputs `outputs`: f32
    /// throughout, its row length static (other dims may be symbolic).
    fn row_call(plan: &Plan, kernel: &Kernel, x: u32, params: &[u32], outputs: &[u32]) -> Option<(RowOp, u64)> {
        let op = RowOp::of(kernel, 1 + params.len())?;
        let tensors = std::iter::once(&x).chain(params).chain(outputs).map(|&t| plan.tensors.get(t as usize));
        for d in tensors {
            if d?.dtype != DType::F32 {
                return None;
            }
        }
        let x = &plan.tensors[x as usize].shape;
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

    /// How each operand of a fused call is read natively, and its dtype:
    /// operands and the one output f32, bool, i32, i64, f16 or bf16
    /// (`kiln_runtime::native::NATIVE_DTYPES`), each operand shaped like the
    /// output (same dims, symbolic ones included), one element, or (static
    /// shapes) a contiguous-block broadcast (`kiln_runtime::native::broadcast_of`).
    /// None leaves the call portable.
    fn input_modes(plan: &Plan, inputs: &[u32], outputs: &[u32]) -> Option<(Vec<InputMode>, Vec<DType>)> {
        let out = plan.tensors.get(*outputs.first()? as usize)?;
        if !NATIVE_DTYPES.contains(&out.dtype) || outputs.len() != 1 {
            return None;
        }
        inputs
            .iter()
            .map(|&t| {
                let d = plan.tensors.get(t as usize)?;
                if !NATIVE_DTYPES.contains(&d.dtype) {
                    return None;
                }
                let mode = if d.shape == out.shape {
                    InputMode::Full
                } else if d.shape.iter().all(|s| *s == DimRef::Static(1)) {
                    InputMode::Splat
                } else {
                    broadcast_of(&static_dims(&d.shape)?, &static_dims(&out.shape)?)?
                };
                Some((mode, d.dtype))
            })
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().unzip())
    }

    /// Merges each elementwise call that computes a norm's or softmax's
    /// first operand just before it (a residual add before a layer norm, a
    /// scale and mask before a softmax) into that call: one `native_kernel`
    /// whose row function computes the operand row by row, writing it out
    /// too (its tensor stays, for later readers and for the fallback, which
    /// runs the two calls). Merged only where the function's text is made,
    /// the producer is the instruction right before (no other instruction
    /// can see the operand missing, or the producer's operands overwritten),
    /// the row call starts no loop, and no output overlaps an operand.
    fn merge_prologues(plan: &mut Plan, target: &NativeTarget) {
        let mut j = 1;
        while j < plan.instrs.len() {
            let Some((fallback, prologue)) = prologue_of(plan, j, target) else {
                j += 1;
                continue;
            };
            let producer = plan.instrs.remove(j - 1);
            let row = &mut plan.instrs[j - 1];
            // Filled in by `compile_plan` (every merged call gets a function).
            row.op = InstrOp::NativeKernel { function: u32::MAX, fallback, prologue: Some(prologue), epilogue: None };
            let x = row.inputs[0];
            row.inputs = producer.inputs.iter().chain(&row.inputs[1..]).copied().collect();
            row.outputs.push(x);
            if row.origin.is_empty() {
                row.origin = producer.origin;
            }
            for instr in &mut plan.instrs {
                if let InstrOp::Jump { target: t } | InstrOp::JumpIfFalse { target: t } = &mut instr.op {
                    if *t as usize >= j {
                        *t -= 1;
                    }
                }
            }
        }
    }

    /// The prologue instruction `j − 1` gives row call `j`, if they merge
    /// (see [`merge_prologues`]).
    fn prologue_of(plan: &Plan, j: usize, target: &NativeTarget) -> Option<(Kernel, RowPrologue)> {
        let (producer, row) = (&plan.instrs[j - 1], &plan.instrs[j]);
        let InstrOp::Call(kernel) = &row.op else { return None };
        let (&x, params) = row.inputs.split_first()?;
        let (op, len) = row_call(plan, kernel, x, params, &row.outputs)?;
        let program = match &producer.op {
            InstrOp::Call(Kernel::Fused { program }) => program.clone(),
            InstrOp::Call(Kernel::Binary {
                op: bop @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div),
            }) if producer.inputs.len() == 2 => vec![FusedOp::Binary { op: *bop, a: 0, b: 1 }],
            _ => return None,
        };
        if producer.outputs != [x] || params.contains(&x) || producer.inputs.contains(&x) || row.outputs.len() != 1 {
            return None;
        }
        if producer.inputs.len() + params.len() + 1 > kiln_ir::MAX_FUSED_INPUTS {
            return None;
        }
        let starts_loop = |i: &Instr| matches!(i.op, InstrOp::Jump { target: t } | InstrOp::JumpIfFalse { target: t } if t as usize == j);
        if plan.instrs.iter().any(starts_loop) {
            return None;
        }
        let range = |t: u32| match plan.tensors.get(t as usize)?.storage {
            Storage::Arena { offset, max_bytes } => Some((offset, offset + max_bytes)),
            Storage::Weight { .. } => None,
        };
        let outs = [range(row.outputs[0]), range(x)];
        let overlap = producer
            .inputs
            .iter()
            .chain(params)
            .filter_map(|&t| range(t))
            .any(|a| outs.iter().flatten().any(|o| a.0 < o.1 && o.0 < a.1));
        if overlap || outs.iter().any(Option::is_none) {
            return None;
        }
        let (modes, dtypes) = input_modes(plan, &producer.inputs, &[x])?;
        let p = Prologue { program: &program, modes: &modes, dtypes: &dtypes };
        row_function_to_mlir("f", op, len, target.arch, Some(p), None).ok()?;
        Some((kernel.clone(), RowPrologue { inputs: producer.inputs.len() as u32, program }))
    }

    /// Merges each elementwise call that reads a norm's, softmax's or
    /// last-axis reduction's result just after it (a GELU or residual add
    /// after a layer norm, a scale after a softmax) into that call: the row
    /// function runs the program on each row of its result while the row is
    /// in cache and writes the program's result as well as its own (kept
    /// for later readers and for the fallback, which runs the two calls).
    /// Merged only where the function's text is made, the consumer is the
    /// instruction right after (nothing in between can see its result
    /// missing or its operands changed), reads the row result once and
    /// nothing the row call writes otherwise, its result is shaped like the
    /// row result, no jump lands on it, and no output overlaps an operand or
    /// another output.
    fn merge_epilogues(plan: &mut Plan, target: &NativeTarget) {
        let mut j = 0;
        while j + 1 < plan.instrs.len() {
            let Some((epilogue, extras)) = epilogue_of(plan, j, target) else {
                j += 1;
                continue;
            };
            let consumer = plan.instrs.remove(j + 1);
            let row = &mut plan.instrs[j];
            let op = std::mem::replace(&mut row.op, InstrOp::Jump { target: 0 });
            row.op = match op {
                InstrOp::NativeKernel { fallback, prologue, .. } => {
                    InstrOp::NativeKernel { function: u32::MAX, fallback, prologue, epilogue: Some(epilogue) }
                }
                InstrOp::Call(fallback) => {
                    InstrOp::NativeKernel { function: u32::MAX, fallback, prologue: None, epilogue: Some(epilogue) }
                }
                // `epilogue_of` takes only those two.
                other => other,
            };
            row.inputs.extend(extras);
            row.outputs.extend(consumer.outputs);
            for instr in &mut plan.instrs {
                if let InstrOp::Jump { target: t } | InstrOp::JumpIfFalse { target: t } = &mut instr.op {
                    if *t as usize > j + 1 {
                        *t -= 1;
                    }
                }
            }
            j += 1;
        }
    }

    /// The epilogue instruction `j + 1` gives row call `j` (a plain one or
    /// one with a merged prologue), with its operands other than the row
    /// result, if they merge (see [`merge_epilogues`]).
    fn epilogue_of(plan: &Plan, j: usize, target: &NativeTarget) -> Option<(RowEpilogue, Vec<u32>)> {
        let (row, consumer) = (&plan.instrs[j], plan.instrs.get(j + 1)?);
        let (fallback, prologue) = match &row.op {
            InstrOp::Call(kernel) => (kernel, None),
            InstrOp::NativeKernel { fallback, prologue, epilogue: None, .. } => (fallback, prologue.as_ref()),
            _ => return None,
        };
        let k = prologue.map_or(0, |p| p.inputs as usize);
        let x = if prologue.is_some() { *row.outputs.get(1)? } else { *row.inputs.first()? };
        let &y = row.outputs.first()?;
        let (op, len) = row_call(plan, fallback, x, row.inputs.get(k.max(1)..)?, &[y])?;
        let program = match &consumer.op {
            InstrOp::Call(Kernel::Fused { program }) => program.clone(),
            InstrOp::Call(Kernel::Binary {
                op: bop @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div),
            }) if consumer.inputs.len() == 2 => vec![FusedOp::Binary { op: *bop, a: 0, b: 1 }],
            // A `where` over a bool mask, a cast of an int: the kernels'
            // element functions, so the fused program's bits.
            _ => lone_program(plan, consumer)?,
        };
        let &[z] = consumer.outputs.as_slice() else { return None };
        // The row result read once: the program's operand `at`.
        let mut reads = consumer.inputs.iter().enumerate().filter(|&(_, &t)| t == y).map(|(i, _)| i);
        let (Some(at), None) = (reads.next(), reads.next()) else { return None };
        let extras: Vec<u32> = consumer.inputs.iter().copied().filter(|&t| t != y).collect();
        let (yd, zd) = (plan.tensors.get(y as usize)?, plan.tensors.get(z as usize)?);
        if yd.shape != zd.shape || zd.dtype != DType::F32 || extras.iter().any(|t| row.outputs.contains(t)) {
            return None;
        }
        if row.inputs.len() + extras.len() > kiln_ir::MAX_FUSED_INPUTS {
            return None;
        }
        let lands = |i: &Instr| matches!(i.op, InstrOp::Jump { target: t } | InstrOp::JumpIfFalse { target: t } if t as usize == j + 1);
        if plan.instrs.iter().any(lands) {
            return None;
        }
        let range = |t: u32| match plan.tensors.get(t as usize)?.storage {
            Storage::Arena { offset, max_bytes } => Some((offset, offset + max_bytes)),
            Storage::Weight { .. } => None,
        };
        let overlap = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
        let outs = row.outputs.iter().chain([&z]).map(|&t| range(t)).collect::<Option<Vec<_>>>()?;
        let outs_overlap = outs.iter().enumerate().any(|(i, a)| outs[..i].iter().any(|b| overlap(*a, *b)));
        let ins_overlap =
            (row.inputs.iter().chain(&extras)).filter_map(|&t| range(t)).any(|a| outs.iter().any(|o| overlap(a, *o)));
        if outs_overlap || ins_overlap {
            return None;
        }
        let pro = match prologue {
            Some(p) => Some((p, input_modes(plan, &row.inputs[..k], &[x])?)),
            None => None,
        };
        let (modes, dtypes) = input_modes(plan, &extras, &[z])?;
        let p = pro.as_ref().map(|(p, (modes, dtypes))| Prologue { program: &p.program, modes, dtypes });
        let ep = Epilogue { program: &program, row: at, modes: &modes, dtypes: &dtypes };
        row_function_to_mlir("f", op, len, target.arch, p, Some(ep)).ok()?;
        Some((RowEpilogue { inputs: extras.len() as u32, row: at as u32, program }, extras))
    }
}
