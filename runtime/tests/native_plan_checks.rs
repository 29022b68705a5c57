//! `native_kernel` instructions (format 0.11) at load: the instruction
//! encodes and decodes with its fallback call, and every inconsistency
//! between it, its row function and the plan is refused with an error
//! saying what is wrong; a session that refuses native code runs the
//! fallback kernel.

use kiln_runtime::format::*;
use kiln_runtime::native::{FunctionShape, InputMode, NativeArch, NativeFunction, NativeLevel, NativeSection};
use kiln_runtime::{Error, Program, SessionOptions, TensorView};

mod common;
use common::arena;

/// An object defining `kiln_test` (the loader tests' fixture): validation
/// checks the symbol is defined, not what the code computes.
const X86: &[u8] = include_bytes!("fixtures/native/sigmoid_mul_add.x86_64.o");

fn row_function(len: u64, out_len: u64) -> NativeFunction {
    NativeFunction {
        symbol: "kiln_test".into(),
        inputs: vec![InputMode::Full],
        input_dtypes: vec![DType::F32],
        output_dtype: DType::F32,
        shape: FunctionShape::Rows { len, out_len, prologue: 0, epilogue: None },
        can_fail: false,
    }
}

fn section(functions: Vec<NativeFunction>) -> NativeSection {
    NativeSection {
        functions,
        levels: vec![NativeLevel { arch: NativeArch::X86_64, level: "x86-64".into(), object: X86.to_vec() }],
    }
}

/// `y = op(x)` on `x: [2, 3]` f32 (`y: [2, 1]` for a reduction).
fn plan(op: InstrOp, reduce: bool) -> Plan {
    let out: &[u64] = if reduce { &[2, 1] } else { &[2, 3] };
    Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![arena(&[2, 3], 0), arena(out, 64)],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: 1, complex: false }],
        instrs: vec![Instr { op, inputs: vec![0], outputs: vec![1], origin: "test".into() }],
        arena_bytes: 128,
        peak_live_bytes: 128,
        states: vec![],
    }
}

fn load(plan: &Plan, native: Option<&NativeSection>) -> Result<std::sync::Arc<Program>, Error> {
    let mut w = ArtifactWriter::new(plan, WeightsBuilder::new(), &Metadata::default()).unwrap();
    if let Some(n) = native {
        w.add_native(n).unwrap();
    }
    Program::from_bytes(&w.to_bytes())
}

fn softmax() -> Kernel {
    Kernel::Softmax { axis: 1, log: false }
}

fn native_softmax() -> InstrOp {
    InstrOp::NativeKernel { prologue: None, epilogue: None, function: 0, fallback: softmax() }
}

#[test]
fn a_native_kernel_encodes_with_its_fallback_and_loads() {
    let p = plan(native_softmax(), false);
    let bytes = postcard::to_allocvec(&p).unwrap();
    assert_eq!(postcard::from_bytes::<Plan>(&bytes).unwrap(), p);
    load(&p, Some(&section(vec![row_function(3, 3)]))).expect("a consistent native kernel loads");
    let sum = InstrOp::NativeKernel {
        prologue: None,
        epilogue: None,
        function: 0,
        fallback: Kernel::Reduce { kind: ReduceKind::Sum, axes: vec![1] },
    };
    load(&plan(sum, true), Some(&section(vec![row_function(3, 1)]))).expect("a row sum loads");
}

#[test]
fn a_fallback_that_is_no_kernel_call_is_refused() {
    // The fallback slot holds a `jump` (opcode 1003, target 0) instead of a call.
    let mut bytes = postcard::to_allocvec(&plan(native_softmax(), false)).unwrap();
    let call = postcard::to_allocvec(&InstrOp::Call(softmax())).unwrap();
    let jump = postcard::to_allocvec(&InstrOp::Jump { target: 0 }).unwrap();
    let at = bytes.windows(call.len()).position(|w| w == call).expect("the fallback's encoding");
    bytes.splice(at..at + call.len(), jump);
    assert!(postcard::from_bytes::<Plan>(&bytes).is_err(), "a jump was accepted as a fallback");
}

#[test]
fn inconsistent_native_kernels_are_refused_at_load() {
    let ew = NativeFunction { shape: FunctionShape::Elementwise, ..row_function(3, 3) };
    let f16 = NativeFunction { input_dtypes: vec![DType::F16], ..row_function(3, 3) };
    let bool_row = NativeFunction { input_dtypes: vec![DType::Bool], ..row_function(3, 3) };
    let f64_elementwise = NativeFunction { input_dtypes: vec![DType::F64], ..ew.clone() };
    let bool_elementwise = NativeFunction { input_dtypes: vec![DType::Bool], ..ew.clone() };
    let neg = InstrOp::Native { function: 0, program: vec![FusedOp::Unary { op: UnaryOp::Neg, x: 0 }] };
    let cases: Vec<(Plan, NativeSection, &str)> = vec![
        // A row function declaring it can fail (only elementwise ones divide integers).
        (
            plan(native_softmax(), false),
            section(vec![NativeFunction { can_fail: true, ..row_function(3, 3) }]),
            "a row function cannot fail",
        ),
        // A row function called as an elementwise one, and the reverse.
        (plan(native_softmax(), false), section(vec![ew.clone()]), "cannot call native function"),
        (
            plan(InstrOp::Native { function: 0, program: vec![FusedOp::Unary { op: UnaryOp::Neg, x: 0 }] }, false),
            section(vec![row_function(3, 3)]),
            "cannot call native function",
        ),
        // A function index past the section's.
        (
            plan(InstrOp::NativeKernel { prologue: None, epilogue: None, function: 5, fallback: softmax() }, false),
            section(vec![row_function(3, 3)]),
            "native function 5",
        ),
        // Softmax over the first axis: no row function computes it.
        (
            plan(
                InstrOp::NativeKernel {
                    prologue: None,
                    epilogue: None,
                    function: 0,
                    fallback: Kernel::Softmax { axis: 0, log: false },
                },
                false,
            ),
            section(vec![row_function(3, 3)]),
            "cannot stand for",
        ),
        // A reduction writing a whole row per row, and an empty row.
        (
            plan(
                InstrOp::NativeKernel {
                    prologue: None,
                    epilogue: None,
                    function: 0,
                    fallback: Kernel::Reduce { kind: ReduceKind::Sum, axes: vec![1] },
                },
                true,
            ),
            section(vec![row_function(3, 3)]),
            "cannot stand for",
        ),
        (plan(native_softmax(), false), section(vec![row_function(0, 0)]), "cannot stand for"),
        // A kernel no row function stands for.
        (
            plan(
                InstrOp::NativeKernel {
                    prologue: None,
                    epilogue: None,
                    function: 0,
                    fallback: Kernel::Unary { op: UnaryOp::Neg },
                },
                false,
            ),
            section(vec![row_function(3, 3)]),
            "cannot stand for",
        ),
        // Code reads f32, bool, i32, i64, f16 and bf16 (a row function's
        // kernel operands f32): another dtype is refused.
        (plan(native_softmax(), false), section(vec![f16]), "native code takes"),
        (plan(native_softmax(), false), section(vec![bool_row]), "native code takes"),
        (plan(neg.clone(), false), section(vec![f64_elementwise]), "native code takes"),
        // A bool function called on f32 tensors.
        (plan(neg, false), section(vec![bool_elementwise]), "tensor dtypes differ"),
    ];
    for (p, s, want) in cases {
        let e = load(&p, Some(&s)).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "{:?}: {e} (wanted `{want}`)", p.instrs[0].op);
    }
    // A native kernel without a native section.
    let e = load(&plan(native_softmax(), false), None).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("no native section"), "{e}");
    // The fallback's own parameters are checked as a call's.
    let bad = InstrOp::NativeKernel {
        prologue: None,
        epilogue: None,
        function: 0,
        fallback: Kernel::Softmax { axis: 7, log: false },
    };
    let e = load(&plan(bad, false), Some(&section(vec![row_function(3, 3)]))).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("axis"), "{e}");
}

#[test]
fn refusing_native_code_runs_the_fallback_kernel() {
    let program = load(&plan(native_softmax(), false), Some(&section(vec![row_function(3, 3)]))).unwrap();
    let opts = SessionOptions { allow_native_code: false, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).unwrap();
    let x = [1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0];
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out = session.run(&[TensorView { dtype: DType::F32, shape: &[2, 3], data: &bytes }]).unwrap();
    let y: Vec<f32> = out.get(0).data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let e: Vec<f64> = x[..3].iter().map(|&v| (v as f64 - 3.0).exp()).collect();
    let s: f64 = e.iter().sum();
    for (i, w) in e.iter().map(|v| v / s).chain([1.0 / 3.0; 3]).enumerate() {
        assert!((y[i] as f64 - w).abs() < 1e-6, "element {i}: {} vs {w}", y[i]);
    }
}

/// `y = softmax(a + b)` as one native kernel with a prologue (format 0.14):
/// `a, b: [2, 3]` at 0 and 64, `y` at `y_at`, the sum `s` at 192.
fn prologue_plan(y_at: u64, outputs: Vec<u32>) -> Plan {
    let add = vec![FusedOp::Binary { op: BinaryOp::Add, a: 0, b: 1 }];
    Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![arena(&[2, 3], 0), arena(&[2, 3], 64), arena(&[2, 3], y_at), arena(&[2, 3], 192)],
        inputs: vec![
            IoDecl { name: "a".into(), tensor: 0, complex: false },
            IoDecl { name: "b".into(), tensor: 1, complex: false },
        ],
        outputs: vec![
            IoDecl { name: "y".into(), tensor: 2, complex: false },
            IoDecl { name: "s".into(), tensor: 3, complex: false },
        ],
        instrs: vec![Instr {
            op: InstrOp::NativeKernel {
                function: 0,
                fallback: softmax(),
                prologue: Some(RowPrologue { inputs: 2, program: add }),
                epilogue: None,
            },
            inputs: vec![0, 1],
            outputs,
            origin: "test".into(),
        }],
        arena_bytes: 256,
        peak_live_bytes: 256,
        states: vec![],
    }
}

fn prologue_function(prologue: u32) -> NativeFunction {
    NativeFunction {
        inputs: vec![InputMode::Full; 2],
        input_dtypes: vec![DType::F32; 2],
        shape: FunctionShape::Rows { len: 3, out_len: 3, prologue, epilogue: None },
        ..row_function(3, 3)
    }
}

#[test]
fn a_native_kernel_with_a_prologue_runs_its_fallback_and_is_checked() {
    let p = prologue_plan(128, vec![2, 3]);
    let bytes = postcard::to_allocvec(&p).unwrap();
    assert_eq!(postcard::from_bytes::<Plan>(&bytes).unwrap(), p);
    // Refused native code: the sum into `s`, then softmax of it into `y`.
    let program = load(&p, Some(&section(vec![prologue_function(2)]))).expect("a consistent prologue loads");
    let opts = SessionOptions { allow_native_code: false, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).unwrap();
    let (a, b) = ([1.0f32, 2.0, 3.0, 0.5, 0.0, -1.0], [0.0f32, 0.0, 0.0, -0.5, 0.0, 1.0]);
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (ab, bb) = (bytes(&a), bytes(&b));
    let out = session
        .run(&[
            TensorView { dtype: DType::F32, shape: &[2, 3], data: &ab },
            TensorView { dtype: DType::F32, shape: &[2, 3], data: &bb },
        ])
        .unwrap();
    let floats =
        |d: &[u8]| -> Vec<f32> { d.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let (y, s) = (floats(out.get(0).data), floats(out.get(1).data));
    assert_eq!(s, [1.0, 2.0, 3.0, 0.0, 0.0, 0.0]);
    let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|&v| (v - 3.0).exp()).collect();
    let sum: f64 = e.iter().sum();
    for (i, w) in e.iter().map(|v| v / sum).chain([1.0 / 3.0; 3]).enumerate() {
        assert!((y[i] as f64 - w).abs() < 1e-6, "element {i}: {} vs {w}", y[i]);
    }
    let cases: Vec<(Plan, NativeFunction, &str)> = vec![
        // The result overlapping a prologue operand (native code reads them while it writes).
        (prologue_plan(0, vec![2, 3]), prologue_function(2), "overlaps"),
        // No output for the prologue's result.
        (prologue_plan(128, vec![2]), prologue_function(2), "expected 2"),
        // A function compiled without (or with another) prologue.
        (prologue_plan(128, vec![2, 3]), prologue_function(0), "cannot call native function"),
        (prologue_plan(128, vec![2, 3]), prologue_function(1), "cannot call native function"),
    ];
    for (p, f, want) in cases {
        let e = load(&p, Some(&section(vec![f]))).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "{:?}: {e} (wanted `{want}`)", p.instrs[0]);
    }
}

/// An elementwise function over a bool operand (`y = float(mask)`) loads
/// where the instruction's tensors have its dtypes; with native code
/// refused, its program runs on the portable kernel.
#[test]
fn a_native_call_on_bool_operands_loads_and_runs_its_program() {
    let mut p = plan(InstrOp::Native { function: 0, program: vec![FusedOp::Cast { to: DType::F32, x: 0 }] }, false);
    p.tensors[0].dtype = DType::Bool;
    let f = NativeFunction {
        shape: FunctionShape::Elementwise,
        input_dtypes: vec![DType::Bool],
        output_dtype: DType::F32,
        ..row_function(3, 3)
    };
    let program = load(&p, Some(&section(vec![f]))).expect("a bool operand loads");
    let opts = SessionOptions { allow_native_code: false, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).unwrap();
    let mask = [1u8, 0, 0, 1, 1, 0];
    let out = session.run(&[TensorView { dtype: DType::Bool, shape: &[2, 3], data: &mask }]).unwrap();
    let y: Vec<f32> = out.get(0).data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(y, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
}

/// `y = softmax(a)`, `z = m · y` as one native kernel with an epilogue
/// (format 0.20): `a, m: [2, 3]` at 0 and 64, `y` at 128, `z` at `z_at`
/// (of shape `z_shape`); the epilogue reads `y` as operand `row` of its
/// program and `m` as the other.
fn epilogue_plan(z_at: u64, z_shape: &[u64], outputs: Vec<u32>, epilogue: RowEpilogue) -> Plan {
    Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![arena(&[2, 3], 0), arena(&[2, 3], 64), arena(&[2, 3], 128), arena(z_shape, z_at)],
        inputs: vec![
            IoDecl { name: "a".into(), tensor: 0, complex: false },
            IoDecl { name: "m".into(), tensor: 1, complex: false },
        ],
        outputs: outputs.iter().map(|&t| IoDecl { name: format!("t{t}"), tensor: t, complex: false }).collect(),
        instrs: vec![Instr {
            op: InstrOp::NativeKernel { function: 0, fallback: softmax(), prologue: None, epilogue: Some(epilogue) },
            inputs: vec![0, 1],
            outputs,
            origin: "test".into(),
        }],
        arena_bytes: 256,
        peak_live_bytes: 256,
        states: vec![],
    }
}

fn mul_epilogue(inputs: u32, row: u32) -> RowEpilogue {
    RowEpilogue { inputs, row, program: vec![FusedOp::Binary { op: BinaryOp::Mul, a: 0, b: 1 }] }
}

fn epilogue_function(epilogue: Option<u32>) -> NativeFunction {
    NativeFunction {
        inputs: vec![InputMode::Full; 2],
        input_dtypes: vec![DType::F32; 2],
        shape: FunctionShape::Rows { len: 3, out_len: 3, prologue: 0, epilogue },
        ..row_function(3, 3)
    }
}

/// A consistent epilogue loads and, with native code refused, runs as the
/// kernel then the program; malformed epilogue fields are refused at load
/// with an error saying what is wrong.
#[test]
fn a_native_kernel_with_an_epilogue_runs_its_fallback_and_is_checked() {
    let p = epilogue_plan(192, &[2, 3], vec![2, 3], mul_epilogue(1, 1));
    let bytes = postcard::to_allocvec(&p).unwrap();
    assert_eq!(postcard::from_bytes::<Plan>(&bytes).unwrap(), p);
    let program = load(&p, Some(&section(vec![epilogue_function(Some(1))]))).expect("a consistent epilogue loads");
    let opts = SessionOptions { allow_native_code: false, ..SessionOptions::default() };
    let mut session = program.session_with(&opts).unwrap();
    let (a, m) = ([1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0], [2.0f32, 2.0, 2.0, -3.0, 0.0, 3.0]);
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (ab, mb) = (bytes(&a), bytes(&m));
    let out = session
        .run(&[
            TensorView { dtype: DType::F32, shape: &[2, 3], data: &ab },
            TensorView { dtype: DType::F32, shape: &[2, 3], data: &mb },
        ])
        .unwrap();
    let floats =
        |d: &[u8]| -> Vec<f32> { d.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let (y, z) = (floats(out.get(0).data), floats(out.get(1).data));
    let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|&v| (v - 3.0).exp()).collect();
    let sum: f64 = e.iter().sum();
    for (i, w) in e.iter().map(|v| v / sum).chain([1.0 / 3.0; 3]).enumerate() {
        assert!((y[i] as f64 - w).abs() < 1e-6, "element {i}: {} vs {w}", y[i]);
        assert_eq!(z[i], m[i] * y[i], "element {i} of the epilogue's result");
    }
    let cases: Vec<(Plan, NativeFunction, &str)> = vec![
        // The result overlapping an epilogue operand, or the kernel's result
        // (native code reads and writes them row by row, on several threads).
        (epilogue_plan(64, &[2, 3], vec![2, 3], mul_epilogue(1, 1)), epilogue_function(Some(1)), "overlaps"),
        (epilogue_plan(144, &[2, 3], vec![2, 3], mul_epilogue(1, 1)), epilogue_function(Some(1)), "overlaps"),
        // No output for the epilogue's result.
        (epilogue_plan(192, &[2, 3], vec![2], mul_epilogue(1, 1)), epilogue_function(Some(1)), "expected 2"),
        // The row result at operand 2 of a two-operand program.
        (epilogue_plan(192, &[2, 3], vec![2, 3], mul_epilogue(1, 2)), epilogue_function(Some(1)), "operand 2 of 2"),
        // More epilogue operands than the instruction has after the kernel's.
        (epilogue_plan(192, &[2, 3], vec![2, 3], mul_epilogue(2, 1)), epilogue_function(Some(2)), "an epilogue of 2"),
        // A result shaped unlike the kernel's.
        (epilogue_plan(192, &[3, 2], vec![2, 3], mul_epilogue(1, 1)), epilogue_function(Some(1)), "shaped unlike"),
        // A function compiled without (or with another) epilogue.
        (
            epilogue_plan(192, &[2, 3], vec![2, 3], mul_epilogue(1, 1)),
            epilogue_function(None),
            "cannot call native function",
        ),
        (
            epilogue_plan(192, &[2, 3], vec![2, 3], mul_epilogue(1, 1)),
            epilogue_function(Some(0)),
            "cannot call native function",
        ),
    ];
    for (p, f, want) in cases {
        let e = load(&p, Some(&section(vec![f]))).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "{:?}: {e} (wanted `{want}`)", p.instrs[0]);
    }
    // A function whose epilogue operands are not f32, bool, i32, i64, f16 or bf16.
    let f64_epilogue = NativeFunction { input_dtypes: vec![DType::F32, DType::F64], ..epilogue_function(Some(1)) };
    let e = load(&p, Some(&section(vec![f64_epilogue]))).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("native code takes"), "{e}");
}
