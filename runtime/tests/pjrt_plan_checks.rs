//! Load-time checks of accelerator instructions and device selection; no
//! plugin needed, so these run in every build.

use kiln_runtime::format::*;
use kiln_runtime::{Device, Error, Program};
use std::path::PathBuf;

fn arena_f32(offset: u64, n: u64) -> TensorDecl {
    TensorDecl {
        dtype: DType::F32,
        shape: vec![DimRef::Static(n)],
        storage: Storage::Arena { offset, max_bytes: n * 4 },
    }
}

/// x (input) → Accel segment 0 → y, z; `edit` breaks one thing.
fn artifact(edit: impl FnOnce(&mut Plan, &mut AccelProgram)) -> Vec<u8> {
    let mut plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![arena_f32(0, 4), arena_f32(64, 4), arena_f32(128, 4)],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![
            IoDecl { name: "y".into(), tensor: 1, complex: false },
            IoDecl { name: "z".into(), tensor: 2, complex: false },
        ],
        instrs: vec![Instr {
            op: InstrOp::Delegate { segment: 0 },
            inputs: vec![0],
            outputs: vec![1, 2],
            origin: "seg".into(),
        }],
        arena_bytes: 192,
        peak_live_bytes: 48,
        states: vec![],
    };
    let mut accel = AccelProgram {
        segments: vec![AccelSegment {
            mlir: "module {}".into(),
            args: vec![0],
            results: vec![1, 2],
            ops: vec!["add".into()],
            arg_shardings: vec![],
            result_shardings: vec![],
            index_checks: vec![],
        }],
        cpu_fallbacks: vec![],
        mesh: None,
        buckets: vec![],
        estimate: None,
    };
    edit(&mut plan, &mut accel);
    let mut w = ArtifactWriter::new(&plan, WeightsBuilder::new(), &Metadata::default()).unwrap();
    w.add_accel(&accel).unwrap();
    w.to_bytes()
}

fn plan_error(bytes: &[u8]) -> String {
    match Program::from_bytes(bytes) {
        Err(Error::Plan(m)) => m,
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("invalid accelerator plan accepted"),
    }
}

#[test]
fn valid_accel_plan_loads_and_a_cpu_session_refuses_it() {
    let program = Program::from_bytes(&artifact(|_, _| {})).expect("valid plan");
    assert!(program.needs_accelerator());
    assert_eq!(program.accel().unwrap().segments[0].ops, ["add"]);
    match program.session() {
        Err(Error::Device(m)) => assert!(m.contains("compiled for an accelerator") && m.contains("--device"), "{m}"),
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("CPU session accepted an accelerator plan"),
    }
}

#[test]
fn bad_accel_instructions_are_rejected_at_load() {
    let m = plan_error(&artifact(|p, _| p.instrs[0].op = InstrOp::Delegate { segment: 3 }));
    assert!(m.contains("segment 3 does not exist"), "{m}");
    let m = plan_error(&artifact(|p, _| p.tensors[2].storage = Storage::Arena { offset: 64, max_bytes: 16 }));
    assert!(m.contains("overlaps another result"), "{m}");
    let m = plan_error(&artifact(|p, _| p.tensors[1].storage = Storage::Arena { offset: 0, max_bytes: 16 }));
    assert!(m.contains("overlaps argument 0"), "{m}");
    let m = plan_error(&artifact(|p, _| p.instrs[0].outputs = vec![2, 1]));
    assert!(m.contains("differ from segment 0"), "{m}");
    let m = plan_error(&artifact(|_, a| a.segments[0].results = vec![1, 99]));
    assert!(m.contains("99"), "{m}");
    let m = plan_error(&artifact(|_, a| a.cpu_fallbacks.push(CpuFallback { instr: 5, reason: "x".into() })));
    assert!(m.contains("instruction 5"), "{m}");
    let m = plan_error(&artifact(|p, a| {
        p.instrs[0].outputs.clear();
        a.segments[0].results.clear();
    }));
    assert!(m.contains("no outputs"), "{m}");
}

/// A shape bucket over the same program: x → y, z with padded shapes.
fn bucket() -> AccelBucket {
    AccelBucket {
        sizes: vec![],
        segment: AccelSegment {
            mlir: "module {}".into(),
            args: vec![0],
            results: vec![1, 2],
            ops: vec!["add".into()],
            arg_shardings: vec![],
            result_shardings: vec![],
            index_checks: vec![],
        },
        arg_shapes: vec![vec![4]],
        result_shapes: vec![vec![4], vec![4]],
        true_sizes: vec![],
    }
}

#[test]
fn bad_shape_buckets_are_rejected_at_load() {
    Program::from_bytes(&artifact(|_, a| a.buckets.push(bucket()))).expect("a valid bucket");
    let with = |edit: fn(&mut AccelBucket)| {
        artifact(move |_, a| {
            let mut b = bucket();
            edit(&mut b);
            a.buckets.push(b);
        })
    };
    let m = plan_error(&with(|b| b.sizes = vec![3]));
    assert!(m.contains("shape bucket 0") && m.contains("1 sizes for 0 symbols"), "{m}");
    let m = plan_error(&with(|b| b.arg_shapes = vec![vec![5]]));
    assert!(m.contains("static dim 4 is padded to 5"), "{m}");
    let m = plan_error(&with(|b| b.arg_shapes = vec![vec![4, 1]]));
    assert!(m.contains("rank"), "{m}");
    let m = plan_error(&with(|b| b.segment.results = vec![0, 2]));
    assert!(m.contains("not a distinct output"), "{m}");
    let m = plan_error(&with(|b| {
        b.segment.results = vec![1];
        b.result_shapes = vec![vec![4]];
    }));
    assert!(m.contains("output `z` is not one of its results"), "{m}");
    let m = plan_error(&with(|b| b.segment.args = vec![1]));
    assert!(m.contains("neither an input nor a weight"), "{m}");
    let m = plan_error(&with(|b| b.result_shapes = vec![vec![4]]));
    assert!(m.contains("do not match"), "{m}");
    let m = plan_error(&with(|b| b.true_sizes = vec![0]));
    assert!(m.contains("true size 0 names symbol 0, but the plan has 0"), "{m}");
}

#[test]
fn accel_instruction_without_the_section_is_rejected() {
    let full = artifact(|_, _| {});
    let program = Program::from_bytes(&full).unwrap();
    let w = ArtifactWriter::new(program.plan(), WeightsBuilder::new(), &Metadata::default()).unwrap();
    let m = plan_error(&w.to_bytes());
    assert!(m.contains("no accelerator section"), "{m}");
}

#[test]
fn devices_parse() {
    assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
    assert_eq!("tpu".parse::<Device>().unwrap(), Device::Tpu);
    assert_eq!("gpu".parse::<Device>().unwrap(), Device::Gpu);
    assert_eq!("pjrt:/x/p.so".parse::<Device>().unwrap(), Device::Pjrt(PathBuf::from("/x/p.so")));
    assert!(matches!("pjrt:".parse::<Device>(), Err(Error::Device(_))));
    assert!(matches!("npu".parse::<Device>(), Err(Error::Device(_))));
    assert_eq!(Device::Pjrt(PathBuf::from("/x/p.so")).to_string(), "pjrt:/x/p.so");
}

#[cfg(feature = "pjrt")]
#[test]
fn a_missing_plugin_is_a_clear_error() {
    let program = Program::from_bytes(&artifact(|_, _| {})).unwrap();
    let options = kiln_runtime::SessionOptions::with_device(Device::Pjrt(PathBuf::from("/nonexistent/plugin.so")));
    assert!(matches!(program.session_with(&options), Err(Error::Device(m)) if m.contains("/nonexistent/plugin.so")));
    // A file that is not a PJRT plugin: dlopen fails with its message.
    let not_a_plugin = std::env::temp_dir().join(format!("kiln-not-a-plugin-{}.so", std::process::id()));
    std::fs::write(&not_a_plugin, b"not an ELF file").unwrap();
    let options = kiln_runtime::SessionOptions::with_device(Device::Pjrt(not_a_plugin.clone()));
    assert!(matches!(program.session_with(&options), Err(Error::Pjrt { ref call, .. }) if call == "dlopen"));
    let _ = std::fs::remove_file(not_a_plugin);
}

#[cfg(not(feature = "pjrt"))]
#[test]
fn accelerators_need_the_pjrt_feature() {
    let program = Program::from_bytes(&artifact(|_, _| {})).unwrap();
    let options = kiln_runtime::SessionOptions::with_device(Device::Tpu);
    assert!(matches!(program.session_with(&options), Err(Error::Device(m)) if m.contains("`pjrt`")));
}
