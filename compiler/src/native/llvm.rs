//! MLIR text → LLVM dialect (upstream conversions) → LLVM IR
//! (`mlirTranslateModuleToLLVMIR`) → `default<O3>` → a relocatable ELF
//! object for one triple and CPU (inkwell's `TargetMachine`).

use inkwell::attributes::AttributeLoc;
use inkwell::module::Module as LlvmModule;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetTriple};
use inkwell::OptimizationLevel;
use melior::dialect::DialectRegistry;
use melior::ir::Module;
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;

/// The upstream lowering of func/scf/vector/arith/math to the LLVM dialect.
const TO_LLVM: &str =
    "builtin.module(convert-scf-to-cf,convert-vector-to-llvm,convert-math-to-llvm,convert-arith-to-llvm,\
convert-index-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts)";

/// The LLVM target triple of an ISA.
pub fn triple(arch: kiln_runtime::native::NativeArch) -> &'static str {
    match arch {
        kiln_runtime::native::NativeArch::X86_64 => "x86_64-unknown-linux-gnu",
        kiln_runtime::native::NativeArch::Aarch64 => "aarch64-unknown-linux-gnu",
    }
}

/// Compiles the MLIR module `text` to an object for `triple` / `cpu`.
pub fn compile_module(text: &str, triple_name: &str, cpu: &str) -> Result<Vec<u8>, String> {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let ctx = Context::new();
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    register_all_llvm_translations(&ctx);
    register_all_passes();
    let mut module = Module::parse(&ctx, text).ok_or("the generated MLIR does not parse (compiler bug)")?;
    let pm = PassManager::new(&ctx);
    parse_pass_pipeline(pm.as_operation_pass_manager(), TO_LLVM).map_err(|e| format!("pass pipeline: {e}"))?;
    pm.run(&mut module).map_err(|e| format!("lowering to the LLVM dialect: {e}"))?;

    Target::initialize_x86(&InitializationConfig::default());
    Target::initialize_aarch64(&InitializationConfig::default());
    let llvm = inkwell::context::Context::create();
    // SAFETY: the translation creates a module owned by `llvm` (whose raw
    // context it is given); inkwell takes ownership of it below.
    let raw = unsafe { mlir_sys::mlirTranslateModuleToLLVMIR(module.as_operation().to_raw(), llvm.raw().cast()) };
    if raw.is_null() {
        return Err("translation to LLVM IR failed".into());
    }
    // SAFETY: `raw` is a valid module of `llvm`'s context, owned by nobody else.
    let m: LlvmModule<'_> = unsafe { LlvmModule::new(raw.cast()) };
    let triple = TargetTriple::create(triple_name);
    let target = Target::from_triple(&triple).map_err(|e| format!("target {triple_name}: {e}"))?;
    let tm = target
        .create_target_machine(&triple, cpu, "", OptimizationLevel::Aggressive, RelocMode::PIC, CodeModel::Small)
        .ok_or_else(|| format!("LLVM has no CPU {cpu:?} for {triple_name}"))?;
    m.set_triple(&triple);
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    m.verify().map_err(|e| format!("LLVM IR does not verify: {e}"))?;
    // The object may call nothing: a loop storing one value (a comparison
    // that always fails, a constant mask) or copying an operand (a cast
    // to its own dtype) must not become a `memset` / `memcpy` call.
    for f in m.get_functions() {
        for name in ["no-builtin-memset", "no-builtin-memcpy", "no-builtin-memmove"] {
            f.add_attribute(AttributeLoc::Function, llvm.create_string_attribute(name, ""));
        }
    }
    m.run_passes("default<O3>", &tm, PassBuilderOptions::create()).map_err(|e| format!("O3: {e}"))?;
    let buf = tm.write_to_memory_buffer(&m, FileType::Object).map_err(|e| format!("object emission: {e}"))?;
    Ok(buf.as_slice().to_vec())
}
