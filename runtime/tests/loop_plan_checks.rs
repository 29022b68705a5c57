//! Loops in a plan (`JumpIfFalse` / `Jump`): a hand-built counted loop runs
//! with trip counts given at run time, and malformed loops are refused at load.

use kiln_runtime::format::*;
use kiln_runtime::{Error, Program, Tensor};

fn arena(dtype: DType, shape: &[u64], offset: u64) -> TensorDecl {
    let bytes = shape.iter().product::<u64>() * dtype.size_bytes() as u64;
    TensorDecl {
        dtype,
        shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
        storage: Storage::Arena { offset, max_bytes: bytes },
    }
}

fn instr(op: InstrOp, inputs: &[u32], outputs: &[u32]) -> Instr {
    Instr { op, inputs: inputs.to_vec(), outputs: outputs.to_vec(), origin: "test".into() }
}

const X: u32 = 0;
const N: u32 = 1;
const I: u32 = 2;
const Y: u32 = 3;
const I1: u32 = 4;
const Y1: u32 = 5;
const COND: u32 = 6;
const ZERO: u32 = 7;
const ONE: u32 = 8;

/// `i = 0; y = x; while i < n { i += 1; y = y + y }`, returning `(y, i)`.
/// `edit` breaks one thing.
fn artifact(edit: impl FnOnce(&mut Plan)) -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let zero = weights.push(&0i64.to_le_bytes());
    let one = weights.push(&1i64.to_le_bytes());
    let scalar = |storage| TensorDecl { dtype: DType::I64, shape: vec![], storage };
    let mut plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![
            arena(DType::F32, &[4], 0),
            arena(DType::I64, &[], 64),
            arena(DType::I64, &[], 128),
            arena(DType::F32, &[4], 192),
            arena(DType::I64, &[], 256),
            arena(DType::F32, &[4], 320),
            arena(DType::Bool, &[], 384),
            scalar(zero),
            scalar(one),
        ],
        inputs: vec![
            IoDecl { name: "x".into(), tensor: X, complex: false },
            IoDecl { name: "n".into(), tensor: N, complex: false },
        ],
        outputs: vec![
            IoDecl { name: "y".into(), tensor: Y, complex: false },
            IoDecl { name: "i".into(), tensor: I, complex: false },
        ],
        instrs: vec![
            instr(InstrOp::Call(Kernel::Copy {}), &[ZERO], &[I]),
            instr(InstrOp::Call(Kernel::Copy {}), &[X], &[Y]),
            instr(InstrOp::Call(Kernel::Binary { op: BinaryOp::Lt }), &[I, N], &[COND]), // 2: loop start
            instr(InstrOp::JumpIfFalse { target: 9 }, &[COND], &[]),
            instr(InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }), &[I, ONE], &[I1]),
            instr(InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }), &[Y, Y], &[Y1]),
            instr(InstrOp::Call(Kernel::Copy {}), &[I1], &[I]),
            instr(InstrOp::Call(Kernel::Copy {}), &[Y1], &[Y]),
            instr(InstrOp::Jump { target: 2 }, &[], &[]), // 8: back edge
        ],
        arena_bytes: 448,
        peak_live_bytes: 448,
        states: vec![],
    };
    edit(&mut plan);
    ArtifactWriter::new(&plan, weights, &Metadata::default()).unwrap().to_bytes()
}

fn plan_error(bytes: &[u8]) -> String {
    match Program::from_bytes(bytes) {
        Err(Error::Plan(m)) => m,
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("malformed loop accepted"),
    }
}

#[test]
fn one_session_runs_a_loop_with_different_trip_counts() {
    let program = Program::from_bytes(&artifact(|_| {})).expect("valid loop");
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[4], &[1.0, -2.0, 0.5, 3.0]);
    // Shorter and longer runs alternate: nothing carries over between runs.
    for n in [3i64, 0, 5, 1, 3] {
        let n_t = Tensor::from_i64(&[], &[n]);
        let out = session.run(&[x.view(), n_t.view()]).expect("run").to_tensors();
        let scale = (1i64 << n) as f32;
        let want: Vec<f32> = [1.0f32, -2.0, 0.5, 3.0].iter().map(|v| v * scale).collect();
        assert_eq!(out[0].to_f32().unwrap(), want, "n = {n}");
        assert_eq!(out[1], Tensor::from_i64(&[], &[n]), "n = {n}");
    }
}

#[test]
fn jumps_out_of_range_or_the_wrong_way_are_rejected() {
    let m = plan_error(&artifact(|p| p.instrs[8].op = InstrOp::Jump { target: 9 }));
    assert!(m.contains("goes forward to 9"), "{m}");
    let m = plan_error(&artifact(|p| p.instrs[3].op = InstrOp::JumpIfFalse { target: 100 }));
    assert!(m.contains("targets 100") && m.contains("exit of its loop 2..=8 is 9"), "{m}");
    let m = plan_error(&artifact(|p| p.instrs[3].op = InstrOp::JumpIfFalse { target: 5 }));
    assert!(m.contains("targets 5"), "{m}");
}

#[test]
fn malformed_loops_are_rejected() {
    // An exit with no loop around it.
    let m = plan_error(&artifact(|p| p.instrs[8] = instr(InstrOp::Call(Kernel::Copy {}), &[Y1], &[Y])));
    assert!(m.contains("not inside a loop"), "{m}");
    // Two exits, and none.
    let m = plan_error(&artifact(|p| p.instrs[4] = instr(InstrOp::JumpIfFalse { target: 9 }, &[COND], &[])));
    assert!(m.contains("has 2 exits"), "{m}");
    let m = plan_error(&artifact(|p| p.instrs[3] = instr(InstrOp::Call(Kernel::Copy {}), &[I1], &[I])));
    assert!(m.contains("has 0 exits"), "{m}");
    // Loops 0..=7 and 2..=8 overlap without nesting.
    let m = plan_error(&artifact(|p| p.instrs[7] = instr(InstrOp::Jump { target: 0 }, &[], &[])));
    assert!(m.contains("overlaps loop"), "{m}");
    // The condition must be a 1-element bool, and jumps write nothing.
    let m = plan_error(&artifact(|p| p.instrs[3].inputs = vec![I]));
    assert!(m.contains("1-element bool"), "{m}");
    let m = plan_error(&artifact(|p| p.instrs[8].outputs = vec![Y]));
    assert!(m.contains("outputs, expected 0..=0"), "{m}");
    // Shapes are fixed while a loop runs: no symbol is bound inside one.
    let m = plan_error(&artifact(|p| {
        p.symbols.push(SymbolDecl { name: "k".into(), min: 0, max: 8 });
        p.instrs[4] = instr(InstrOp::BindDim { symbol: 0 }, &[I], &[]);
    }));
    assert!(m.contains("bind_dim) is inside a loop"), "{m}");
}
