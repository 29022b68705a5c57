//! Artifacts used in place from caller memory: `Program::from_static` and
//! `Program::from_owner` run without copying, refuse misaligned memory with a
//! clear error, and keep (then drop) what they were given.

use kiln_runtime::format::*;
use kiln_runtime::{Error, Program, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const W: [f32; 4] = [0.5, -1.0, 2.0, 10.0];

/// `y = x + w` with `x`, `w`, `y` f32[4]: one weight, one instruction.
fn add_weight_artifact() -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let w: Vec<u8> = W.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w = weights.push(&w);
    let f32x4 = |storage| TensorDecl { dtype: DType::F32, shape: vec![DimRef::Static(4)], storage };
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors: vec![
            f32x4(Storage::Arena { offset: 0, max_bytes: 16 }),
            f32x4(w),
            f32x4(Storage::Arena { offset: 64, max_bytes: 16 }),
        ],
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: 2, complex: false }],
        states: vec![],
        instrs: vec![Instr {
            op: InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }),
            inputs: vec![0, 1],
            outputs: vec![2],
            origin: "test".into(),
        }],
        arena_bytes: 128,
        peak_live_bytes: 32,
    };
    ArtifactWriter::new(&plan, weights, &Metadata::default()).expect("encode").to_bytes()
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// `bytes` copied to a 64-byte aligned buffer that lives for the process, starting `shift` bytes in.
fn leak_aligned(bytes: &[u8], shift: usize) -> &'static [u8] {
    let lines = (bytes.len() + shift).div_ceil(64);
    let buf: &'static mut [Line] = Vec::leak(vec![Line([0; 64]); lines]);
    // SAFETY: `Line` is plain bytes; the slice covers exactly the leaked lines.
    let flat: &'static mut [u8] = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), lines * 64) };
    flat[shift..shift + bytes.len()].copy_from_slice(bytes);
    &flat[shift..shift + bytes.len()]
}

fn run_once(program: &Arc<Program>) -> Vec<f32> {
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let out = session.run(&[x.view()]).expect("run");
    out.to_tensors()[0].to_f32().expect("f32 output")
}

#[test]
fn from_static_runs_in_place() {
    let bytes = leak_aligned(&add_weight_artifact(), 0);
    let program = Program::from_static(bytes).expect("load");
    assert_eq!(run_once(&program), vec![1.5, 1.0, 5.0, 14.0]);
}

#[test]
fn misaligned_memory_is_refused_with_a_clear_error() {
    for shift in [1, 4, 8, 32] {
        let bytes = leak_aligned(&add_weight_artifact(), shift);
        match Program::from_static(bytes) {
            Err(e @ Error::Misaligned { align: 64, .. }) => {
                assert!(e.to_string().contains("not 64-byte aligned"), "{e}");
            }
            Err(other) => panic!("shift {shift}: expected Misaligned, got {other}"),
            Ok(_) => panic!("shift {shift}: misaligned artifact accepted"),
        }
        // The copying constructor takes any slice.
        assert_eq!(run_once(&Program::from_bytes(bytes).expect("copying load")), vec![1.5, 1.0, 5.0, 14.0]);
    }
}

/// An owner that counts its drops, to prove the program keeps it exactly as long as it lives.
struct Owned {
    bytes: &'static [u8],
    drops: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn from_owner_keeps_the_owner_alive_until_the_program_drops() {
    let drops = Arc::new(AtomicUsize::new(0));
    let owner = Owned { bytes: leak_aligned(&add_weight_artifact(), 0), drops: Arc::clone(&drops) };
    let program = Program::from_owner(owner).expect("load");
    let mut session = program.session().expect("session");
    drop(program);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "a session keeps the program (and its owner) alive");
    let x = Tensor::from_f32(&[4], &[0.0; 4]);
    assert_eq!(session.run(&[x.view()]).expect("run").to_tensors()[0].to_f32().expect("f32"), W.to_vec());
    drop(session);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn corrupt_static_memory_is_an_error_not_a_panic() {
    let mut bytes = add_weight_artifact();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    assert!(matches!(Program::from_static(leak_aligned(&bytes, 0)), Err(Error::Checksum { .. })));
}

/// The per-instruction profile counts each execution, sums their times and
/// keeps the fastest (what `kiln run --profile --json` reports as
/// `total_us`, `runs` and `min_us`).
#[test]
fn profile_counts_runs_and_keeps_the_fastest() {
    let program = Program::from_bytes(&add_weight_artifact()).expect("load");
    let mut session = program.session().expect("session");
    assert!(session.profile().is_none(), "profiling is off until enabled");
    session.enable_profiling();
    let x = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
    for _ in 0..3 {
        session.run(&[x.view()]).expect("run");
    }
    let p = session.profile().expect("enabled")[0];
    assert_eq!(p.runs, 3);
    assert!(p.min > std::time::Duration::ZERO, "{p:?}");
    assert!(p.min * 3 <= p.total, "the fastest of three runs is at most their mean: {p:?}");
    session.enable_profiling();
    assert_eq!(session.profile().expect("enabled")[0], kiln_runtime::InstrTime::default(), "restarted");
}
