//! `inspect`: what an artifact holds — inputs, outputs, state, kernels,
//! memory, quantized layers, accelerator segments and their sharding.

use crate::run::{load, CliResult};
use serde_json::json;
use std::path::Path;

pub fn cmd_inspect(artifact: &Path, as_json: bool) -> CliResult {
    let program = load(artifact)?;
    let plan = program.plan();
    let (major, minor) = program.format_version();
    let io_json = |ios: Vec<kiln_runtime::IoInfo>| -> Vec<serde_json::Value> {
        ios.into_iter().map(|io| json!({"name": io.name, "dtype": io.dtype.name(), "shape": io.shape})).collect()
    };
    // A symbol a `BindDim` instruction names is bound from data during the run.
    let bound_by = |i: usize| {
        plan.instrs
            .iter()
            .position(|ins| matches!(ins.op, kiln_runtime::format::InstrOp::BindDim { symbol } if symbol as usize == i))
    };
    let symbols: Vec<_> = plan
        .symbols
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"name": s.name, "min": s.min, "max": s.max, "bound_by_instr": bound_by(i)}))
        .collect();
    let kernels = program.kernel_counts();
    let quantized = quantized_layers(plan);
    if as_json {
        let doc = json!({
            "format_version": format!("{major}.{minor}"),
            "metadata": {
                "producer": program.metadata().producer, "source": program.metadata().source,
                "target": program.metadata().target, "torch_version": program.metadata().torch_version,
            },
            "inputs": io_json(program.inputs()),
            "outputs": io_json(program.outputs()),
            "states": program.states().into_iter().zip(program.state_writes()).map(|(io, w)| {
                let (instr, kernel, segment, donated) = match &w.kind {
                    kiln_runtime::StateWriteKind::InPlace { instr, kernel }
                    | kiln_runtime::StateWriteKind::Direct { instr, kernel } => (Some(*instr), Some(kernel.clone()), None, None),
                    kiln_runtime::StateWriteKind::Device { segment, donated } => (None, None, Some(*segment), Some(*donated)),
                    _ => (None, None, None, None),
                };
                json!({"name": io.name, "dtype": io.dtype.name(), "shape": io.shape, "write": {
                    "how": w.kind.tag(), "instr": instr, "kernel": kernel, "segment": segment, "donated": donated,
                }})
            }).collect::<Vec<_>>(),
            "symbols": symbols,
            "instructions": plan.instrs.len(),
            "kernels": kernels.iter().map(|(k, c)| json!({"kernel": k, "count": c})).collect::<Vec<_>>(),
            "weights_bytes": program.weight_tensor_bytes(),
            "weights_section_bytes": program.weights_bytes(),
            "arena_bytes": plan.arena_bytes,
            "peak_live_bytes": plan.peak_live_bytes,
            "quantized_layers": quantized.iter().map(|q| json!({
                "instr": q.instr, "kind": q.kind, "origin": q.origin, "bits": q.bits, "group": q.group, "dynamic": q.dynamic,
                "static": q.act_static,
                "out_features": q.n, "in_features": q.k, "bytes": q.bytes,
            })).collect::<Vec<_>>(),
            "accel": program.accel().map(|a| json!({
                "segments": a.segments.iter().map(|s| json!({"ops": s.ops, "args": s.args, "results": s.results})).collect::<Vec<_>>(),
                "cpu_fallbacks": a.cpu_fallbacks.iter().map(|f| json!({"instr": f.instr, "reason": f.reason})).collect::<Vec<_>>(),
                "buckets": a.buckets.iter().map(|b| json!({"sizes": b.sizes, "ops": b.segment.ops.len()})).collect::<Vec<_>>(),
                "estimate": a.estimate.as_ref().map(|e| json!({
                    "flops": e.flops, "compute_s": e.compute_s, "comm_bytes": e.comm_bytes, "comm_s": e.comm_s,
                    "weight_bytes": e.weight_bytes, "activation_bytes": e.activation_bytes,
                    "collectives": e.collectives.iter().map(|(k, at, b)| json!({"collective": k, "at": at, "bytes": b})).collect::<Vec<_>>(),
                    "decisions": e.decisions,
                })),
            })),
            "native": program.native_section().map(|n| json!({
                "functions": n.functions.iter().map(|f| json!({
                    "symbol": f.symbol,
                    "operands": f.inputs.len(),
                    "operand_dtypes": f.input_dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
                    "result_dtype": f.output_dtype.name(),
                    "can_fail": f.can_fail,
                })).collect::<Vec<_>>(),
                "levels": n.levels.iter().map(|l| json!({"arch": format!("{:?}", l.arch), "level": l.level, "bytes": l.object.len()})).collect::<Vec<_>>(),
            })),
        });
        println!("{doc:#}");
        return Ok(());
    }
    let md = program.metadata();
    println!(
        "{}  (kiln format {major}.{minor}, {}, target {}, torch {})",
        artifact.display(),
        md.producer,
        md.target,
        md.torch_version
    );
    println!("\n{:<8} {:<24} {:<6} shape", "", "name", "dtype");
    for (kind, ios) in [("input", program.inputs()), ("output", program.outputs()), ("state", program.states())] {
        for io in ios {
            println!("{kind:<8} {:<24} {:<6} [{}]", io.name, io.dtype.name(), io.shape.join(", "));
        }
    }
    // How each state's update reaches it between runs.
    for w in program.state_writes() {
        println!("state    {:<24} written {}", w.name, w.kind.describe());
    }
    for (i, s) in plan.symbols.iter().enumerate() {
        let from = bound_by(i).map_or("an input dimension".to_string(), |k| format!("data at instruction {k}"));
        println!("symbol   {:<24} in [{}, {}], bound from {from}", s.name, s.min, s.max);
    }
    println!("\n{:<20} count", "kernel");
    for (k, c) in &kernels {
        println!("{k:<20} {c}");
    }
    println!("\ninstructions {}", plan.instrs.len());
    println!("weights      {}", human_bytes(program.weight_tensor_bytes()));
    println!("arena        {} (peak live {})", human_bytes(plan.arena_bytes), human_bytes(plan.peak_live_bytes));
    if !quantized.is_empty() {
        println!(
            "\n{:<6} {:<7} {:<5} {:<6} {:<12} {:<12} {:<10} origin",
            "instr", "layer", "bits", "group", "acts", "shape", "bytes"
        );
        for q in &quantized {
            let acts = match (q.dynamic, q.act_static) {
                (true, _) => "int8",
                (_, true) => "int8 static",
                _ => "f32",
            };
            let shape = format!("{}x{}", q.n, q.k);
            println!(
                "{:<6} {:<7} {:<5} {:<6} {acts:<12} {shape:<12} {:<10} {}",
                q.instr, q.kind, q.bits, q.group, q.bytes, q.origin
            );
        }
    }
    if let Some(accel) = program.accel() {
        print_accel(plan, accel);
    }
    if let Some(native) = program.native_section() {
        print_native(plan, native);
    }
    Ok(())
}

/// `kiln inspect`'s native-code part: levels with their code sizes, then each function.
fn print_native(plan: &kiln_runtime::format::Plan, native: &kiln_runtime::native::NativeSection) {
    println!(
        "
native code: {} functions",
        native.functions.len()
    );
    for l in &native.levels {
        let here = if kiln_runtime::native::cpu_runs(l.arch, &l.level) { "  (runs on this CPU)" } else { "" };
        println!("  level {:?} {:<14} {}{here}", l.arch, l.level, human_bytes(l.object.len() as u64));
    }
    for (i, f) in native.functions.iter().enumerate() {
        // Calls of one program with the same operand modes share a function.
        let at: Vec<String> = (plan.instrs.iter().enumerate())
            .filter(|(_, ins)| ins.op.native_function() == Some(i as u32))
            .map(|(k, _)| k.to_string())
            .collect();
        let (noun, at) = match at.len() {
            0 => ("instruction", "-".to_string()),
            1 => ("instruction", at.join("")),
            _ => ("instructions", at.join(", ")),
        };
        let shape = match f.shape {
            // Integer division: a zero divisor reruns the call portably (its error).
            kiln_runtime::native::FunctionShape::Elementwise if f.can_fail => {
                "elementwise, fails on a zero divisor".to_string()
            }
            kiln_runtime::native::FunctionShape::Elementwise => "elementwise".to_string(),
            kiln_runtime::native::FunctionShape::Rows { len, out_len, prologue, epilogue } => {
                let mut s = format!("rows of {len} → {out_len}");
                if prologue > 0 {
                    s += &format!(", elementwise prologue of {prologue} operands");
                }
                if let Some(e) = epilogue {
                    s += &format!(", elementwise epilogue of the row's result and {e} operands");
                }
                s
            }
        };
        // Operand and result dtypes (f32, bool, i32, i64).
        let dtypes: Vec<&str> = f.input_dtypes.iter().map(|d| d.name()).collect();
        println!(
            "  {:<16} {shape}, {} operands ({} → {}), {noun} {at}",
            f.symbol,
            f.inputs.len(),
            dtypes.join(", "),
            f.output_dtype.name()
        );
    }
}

/// A quantized layer (linear or convolution) of a plan, for `kiln inspect`.
struct QuantLayer {
    instr: usize,
    /// `linear` or `conv`.
    kind: &'static str,
    origin: String,
    bits: u32,
    group: u32,
    dynamic: bool,
    /// Static (calibrated) int8 activations.
    act_static: bool,
    /// Output features (channels) and the weights of each.
    n: u64,
    k: u64,
    /// Bytes of the stored weight, scales and zero points.
    bytes: u64,
}

fn quantized_layers(plan: &kiln_runtime::format::Plan) -> Vec<QuantLayer> {
    use kiln_runtime::format::{DimRef, InstrOp, Kernel, Storage};
    let tensor = |i: Option<&u32>| i.and_then(|&t| plan.tensors.get(t as usize));
    let bytes = |i: Option<&u32>| match tensor(i).map(|t| &t.storage) {
        Some(Storage::Weight { bytes, .. }) => *bytes,
        _ => 0,
    };
    let dim = |d: Option<&DimRef>| match d {
        Some(DimRef::Static(v)) => *v,
        _ => 0,
    };
    plan.instrs
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| {
            let w = tensor(ins.inputs.get(1))?;
            let layer = |kind, bits, group, dynamic, act_static, k, params: usize| QuantLayer {
                instr: i,
                kind,
                origin: ins.origin.clone(),
                bits,
                group,
                dynamic,
                act_static,
                n: dim(w.shape.first()),
                k,
                bytes: (1..1 + params).map(|j| bytes(ins.inputs.get(j))).sum(),
            };
            match &ins.op {
                InstrOp::Call(Kernel::QuantLinear { bits, group, zero_points, dynamic, act_scale, .. }) => {
                    let per_byte = if *bits == 4 { 2 } else { 1 };
                    let k = dim(w.shape.get(1)) * per_byte;
                    Some(layer("linear", *bits, *group, *dynamic, act_scale.is_some(), k, 2 + *zero_points as usize))
                }
                InstrOp::Call(Kernel::QuantConv { dynamic, act_scale, .. }) => {
                    let k: u64 = w.shape.iter().skip(1).map(|d| dim(Some(d))).product();
                    Some(layer("conv", 8, k as u32, *dynamic, act_scale.is_some(), k, 2))
                }
                _ => None,
            }
        })
        .collect()
}

/// The accelerator segments (ops inside) and what stayed on the CPU, and why.
fn print_accel(plan: &kiln_runtime::format::Plan, accel: &kiln_runtime::format::AccelProgram) {
    println!(
        "
accelerator segments {}",
        accel.segments.len()
    );
    for (i, s) in accel.segments.iter().enumerate() {
        println!("  segment {i}: {} args, {} results, ops: {}", s.args.len(), s.results.len(), s.ops.join(", "));
    }
    if let Some(mesh) = &accel.mesh {
        print_mesh(plan, accel, mesh);
    }
    if !accel.buckets.is_empty() {
        println!("shape buckets {} (larger sizes run the plan on the CPU)", accel.buckets.len());
        for (i, b) in accel.buckets.iter().enumerate() {
            let sizes: Vec<String> =
                plan.symbols.iter().zip(&b.sizes).map(|(s, v)| format!("{}={v}", s.name)).collect();
            println!("  bucket {i}: {}, {} ops", sizes.join(", "), b.segment.ops.len());
        }
    }
    if !accel.cpu_fallbacks.is_empty() {
        println!("CPU fallbacks {}", accel.cpu_fallbacks.len());
        for f in &accel.cpu_fallbacks {
            let origin = plan.instrs.get(f.instr as usize).map_or("", |i| i.origin.as_str());
            println!("  instruction {} ({origin}): {}", f.instr, f.reason);
        }
    }
}

/// An SPMD artifact's mesh and each segment argument's and result's sharding
/// with its bytes per device.
fn print_mesh(
    plan: &kiln_runtime::format::Plan,
    accel: &kiln_runtime::format::AccelProgram,
    mesh: &kiln_runtime::format::MeshDecl,
) {
    let axes: Vec<String> = mesh.axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect();
    let order = if mesh.devices.is_empty() {
        "the client's first devices".to_string()
    } else {
        format!("devices {:?}", mesh.devices)
    };
    println!("mesh [{}] ({} devices, {order})", axes.join(", "), mesh.size());
    for seg in &accel.segments {
        let tensors = seg.args.iter().zip(&seg.arg_shardings).map(|t| ("arg", t));
        let tensors = tensors.chain(seg.results.iter().zip(&seg.result_shardings).map(|t| ("result", t)));
        for (kind, (&t, sharding)) in tensors {
            let Some(decl) = plan.tensors.get(t as usize) else { continue };
            let dims: Vec<String> = sharding
                .dims
                .iter()
                .map(|d| {
                    let names: Vec<&str> =
                        d.iter().filter_map(|&a| mesh.axes.get(a as usize)).map(|a| a.name.as_str()).collect();
                    format!("{{{}}}", names.join(", "))
                })
                .collect();
            let pieces: u64 = sharding
                .dims
                .iter()
                .flatten()
                .filter_map(|&a| mesh.axes.get(a as usize))
                .map(|a| u64::from(a.size))
                .product();
            let bytes: u64 = decl
                .shape
                .iter()
                .map(|d| match d {
                    kiln_runtime::format::DimRef::Static(v) => *v,
                    _ => 0,
                })
                .product::<u64>()
                * decl.dtype.size_bytes() as u64;
            let weight =
                if matches!(decl.storage, kiln_runtime::format::Storage::Weight { .. }) { "weight" } else { "" };
            println!(
                "  {kind:<6} tensor {t:<5} {:<24} {} per device {weight}",
                format!("[{}]", dims.join(", ")),
                human_bytes(bytes / pieces.max(1))
            );
        }
    }
    if let Some(e) = &accel.estimate {
        print_estimate(e);
    }
}

/// The compiler's estimate for a sharded plan, as `kiln compile --report`
/// printed it.
fn print_estimate(e: &kiln_runtime::format::ShardEstimate) {
    println!(
        "estimated per step and device: {} compute ({:.3e} FLOP), {} communication ({}), weights {}, peak activations {}",
        human_seconds(e.compute_s),
        e.flops,
        human_seconds(e.comm_s),
        human_bytes(e.comm_bytes as u64),
        human_bytes(e.weight_bytes),
        human_bytes(e.activation_bytes)
    );
    if e.collectives.is_empty() {
        println!("  collectives kiln placed: none (XLA may add its own)");
    }
    for (kind, at, bytes) in &e.collectives {
        println!("  {kind:<10} {:>10}  {at}", human_bytes(*bytes));
    }
    for line in &e.decisions {
        println!("{line}");
    }
}

/// Seconds in the largest unit that keeps a leading digit.
fn human_seconds(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 1e-3 => format!("{:.3} ms", s * 1e3),
        s if s >= 1e-6 => format!("{:.3} µs", s * 1e6),
        s => format!("{:.3} ns", s * 1e9),
    }
}

/// `b` bytes for people: B, KiB or MiB.
pub fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
