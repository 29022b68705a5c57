//! State in a plan (`Plan::states`): a hand-built accumulator keeps its
//! value between runs, and malformed state declarations are refused at load.

use kiln_runtime::format::*;
use kiln_runtime::{Error, Program, Tensor};

mod common;
use common::arena;

const X: u32 = 0;
const Y: u32 = 1;
const ACC: u32 = 2;
const INIT: u32 = 3;

/// `y = x + acc; acc = y`, returning `y`, with `acc` starting at 1.
/// `edit` breaks one thing.
fn artifact(edit: impl FnOnce(&mut Plan)) -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let ones: Vec<u8> = [1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    let init = TensorDecl { storage: weights.push(&ones), ..arena(&[4], 0) };
    let mut plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![arena(&[4], 0), arena(&[4], 16), arena(&[4], 64), init],
        inputs: vec![IoDecl { name: "x".into(), tensor: X, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: Y, complex: false }],
        instrs: vec![Instr {
            op: InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }),
            inputs: vec![X, ACC],
            outputs: vec![Y],
            origin: "test".into(),
        }],
        arena_bytes: 80,
        peak_live_bytes: 32,
        states: vec![StateDecl { name: "acc".into(), tensor: ACC, update: Y, init: INIT }],
    };
    edit(&mut plan);
    ArtifactWriter::new(&plan, weights, &Metadata::default()).unwrap().to_bytes()
}

fn plan_error(bytes: &[u8]) -> String {
    match Program::from_bytes(bytes) {
        Err(Error::Plan(m)) => m,
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("malformed state accepted"),
    }
}

#[test]
fn an_accumulator_keeps_its_value_between_runs() {
    let program = Program::from_bytes(&artifact(|_| {})).expect("valid plan");
    assert_eq!(program.states().len(), 1);
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
    for k in 1..=3 {
        let out = session.run(&[x.view()]).expect("run").to_tensors();
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| 1.0 + k as f32 * v).collect();
        assert_eq!(out[0].to_f32().unwrap(), want, "run {k}");
    }
    session.reset_state();
    let out = session.run(&[x.view()]).expect("run").to_tensors();
    assert_eq!(out[0].to_f32().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn malformed_states_are_rejected() {
    let m = plan_error(&artifact(|p| p.states[0].init = 99));
    assert!(m.contains("tensor index 99 out of range"), "{m}");
    let m = plan_error(&artifact(|p| p.states[0].init = X));
    assert!(m.contains("initial value is not a weight"), "{m}");
    let m = plan_error(&artifact(|p| p.states[0].tensor = INIT));
    assert!(m.contains("current value is not in the arena"), "{m}");
    let m = plan_error(&artifact(|p| {
        p.tensors.push(arena(&[2], 32));
        p.states[0].update = 4;
    }));
    assert!(m.contains("its update is not a static tensor of its dtype and shape"), "{m}");
    let m = plan_error(&artifact(|p| {
        let again = p.states[0].clone();
        p.states.push(again);
    }));
    assert!(m.contains("not unique"), "{m}");
    // Nothing but the end-of-run copy may write a state, and no input or
    // output may alias one (it would see the update).
    let m = plan_error(&artifact(|p| p.tensors[Y as usize] = arena(&[4], 64)));
    assert!(m.contains("its update lies in state 0's storage"), "{m}");
    let m = plan_error(&artifact(|p| p.tensors[X as usize] = arena(&[4], 60)));
    assert!(m.contains("input `x` lies in the storage of state 0"), "{m}");
    let m = plan_error(&artifact(|p| {
        p.tensors.push(arena(&[4], 64));
        p.instrs[0].outputs = vec![4];
        p.outputs[0].tensor = Y;
    }));
    assert!(m.contains("instruction 0 (test) writes into the storage of state 0"), "{m}");
}

#[test]
fn set_state_checks_dtype_and_shape() {
    let program = Program::from_bytes(&artifact(|_| {})).expect("valid plan");
    let mut session = program.session().expect("session");
    let err = session.set_state("acc", Tensor::from_f32(&[3], &[0.0; 3]).view()).expect_err("wrong shape");
    assert!(matches!(err, Error::State { .. }), "{err}");
    session.set_state("acc", Tensor::from_f32(&[4], &[0.0; 4]).view()).expect("set_state");
    let x = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let out = session.run(&[x.view()]).expect("run").to_tensors();
    assert_eq!(out[0].to_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(session.state("acc").expect("acc").data, out[0].data);
}

/// `acc[pos] = x[0..1]` written in place (operand 0 and output 0 are the
/// state's own tensor, the update is that tensor: no end-of-run copy), then
/// `y = acc + acc` of the updated state. `edit` breaks one thing.
fn in_place_artifact(edit: impl FnOnce(&mut Plan)) -> Vec<u8> {
    artifact(|p| {
        const POS: u32 = 4;
        const ROW: u32 = 5;
        p.tensors.push(TensorDecl {
            dtype: DType::I64,
            shape: vec![DimRef::Static(1)],
            storage: Storage::Arena { offset: 32, max_bytes: 8 },
        });
        p.tensors.push(arena(&[1], 48));
        p.inputs = vec![
            IoDecl { name: "row".into(), tensor: ROW, complex: false },
            IoDecl { name: "pos".into(), tensor: POS, complex: false },
        ];
        p.instrs = vec![
            Instr {
                op: InstrOp::Call(Kernel::IndexPut { axis: 0, accumulate: false }),
                inputs: vec![ACC, ROW, POS],
                outputs: vec![ACC],
                origin: "write".into(),
            },
            Instr {
                op: InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }),
                inputs: vec![ACC, ACC],
                outputs: vec![Y],
                origin: "read".into(),
            },
        ];
        p.states[0].update = ACC;
        edit(p);
    })
}

#[test]
fn a_state_updated_in_place_during_the_run() {
    let program = Program::from_bytes(&in_place_artifact(|_| {})).expect("valid plan");
    let mut session = program.session().expect("session");
    let pos = |k: i64| Tensor::from_i64(&[1], &[k]);
    for (k, want) in [(0, [10.0, 2.0, 2.0, 2.0]), (3, [10.0, 2.0, 2.0, 10.0])] {
        let row = Tensor::from_f32(&[1], &[5.0]);
        let out = session.run(&[row.view(), pos(k).view()]).expect("run").to_tensors();
        assert_eq!(out[0].to_f32().unwrap(), want, "row {k}");
    }
    let acc = session.state("acc").expect("acc");
    assert_eq!(acc.data, Tensor::from_f32(&[4], &[5.0, 1.0, 1.0, 5.0]).data);
}

#[test]
fn writes_into_a_state_are_refused_unless_whole_and_its_update() {
    // Part of the state's storage.
    let m = plan_error(&in_place_artifact(|p| {
        p.tensors.push(arena(&[2], 64));
        p.instrs[1].outputs = vec![6];
        p.outputs[0].tensor = Y;
    }));
    assert!(m.contains("instruction 1 (read) writes into the storage of state 0"), "{m}");
    // The whole storage, but the update is another tensor (its end-of-run
    // copy would overwrite the write).
    let m = plan_error(&in_place_artifact(|p| p.states[0].update = Y));
    assert!(m.contains("instruction 0 (write) writes into the storage of state 0"), "{m}");
    // In place only as operand 0 of a kernel with an in-place form.
    let m = plan_error(&in_place_artifact(|p| {
        p.tensors.push(arena(&[4], 64));
        p.instrs[0].inputs = vec![6, 5, 4];
    }));
    assert!(m.contains("overlaps operand"), "{m}");
    let m = plan_error(&in_place_artifact(|p| {
        p.instrs[0].op = InstrOp::Call(Kernel::Binary { op: BinaryOp::Add });
        p.instrs[0].inputs = vec![ACC, ACC];
    }));
    assert!(m.contains("overlaps operand"), "{m}");
}

/// `y = x or acc; acc = y` over bool[4], `acc` starting at [1, 0, 0, 1].
fn bool_artifact() -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let bools = |t: TensorDecl| TensorDecl { dtype: DType::Bool, ..t };
    let init = TensorDecl { storage: weights.push(&[1, 0, 0, 1]), ..bools(arena(&[4], 0)) };
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![bools(arena(&[4], 0)), bools(arena(&[4], 16)), bools(arena(&[4], 64)), init],
        inputs: vec![IoDecl { name: "x".into(), tensor: X, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: Y, complex: false }],
        instrs: vec![Instr {
            op: InstrOp::Call(Kernel::Binary { op: BinaryOp::Or }),
            inputs: vec![X, ACC],
            outputs: vec![Y],
            origin: "test".into(),
        }],
        arena_bytes: 80,
        peak_live_bytes: 8,
        states: vec![StateDecl { name: "acc".into(), tensor: ACC, update: Y, init: INIT }],
    };
    ArtifactWriter::new(&plan, weights, &Metadata::default()).unwrap().to_bytes()
}

/// A bool state holds the bytes 0 and 1 only, as a bool input does: native
/// code reads any nonzero byte as true while the portable kernels compare
/// bytes, so another byte would give target-dependent results.
#[test]
fn set_state_refuses_a_bool_byte_other_than_0_or_1() {
    let program = Program::from_bytes(&bool_artifact()).expect("valid plan");
    let mut session = program.session().expect("session");
    let bool4 = |data: [u8; 4]| Tensor { dtype: kiln_runtime::DType::Bool, shape: vec![4], data: data.to_vec() };
    let err = session.set_state("acc", bool4([0, 1, 2, 0]).view()).expect_err("byte 2");
    assert!(matches!(err, Error::State { .. }), "{err}");
    assert!(err.to_string().contains("bool element 2 is the byte 2, not 0 or 1"), "{err}");
    // The refused value was not written: the state still holds its initial value.
    let out = session.run(&[bool4([0, 0, 1, 0]).view()]).expect("run").to_tensors();
    assert_eq!(out[0].data, vec![1, 0, 1, 1]);
    session.set_state("acc", bool4([0, 1, 0, 0]).view()).expect("set_state");
    let out = session.run(&[bool4([0, 0, 1, 0]).view()]).expect("run").to_tensors();
    assert_eq!(out[0].data, vec![0, 1, 1, 0]);
}
