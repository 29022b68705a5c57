//! `kiln_runtime::delta` on artifacts: a patch rebuilds the new artifact byte
//! for byte and carries only the changed tensor; a patch for another base, a
//! corrupt or a hostile patch is an error (never a panic, never a wrong result).

use kiln_runtime::delta::{self, DeltaError};
use kiln_runtime::format::*;
use kiln_runtime::{Program, Tensor};

/// A chain of `y = x + w_i` over `layers` f32[n] weights; `last` replaces the last weight.
fn chain(layers: usize, n: usize, last: Option<f32>) -> Vec<u8> {
    let mut weights = WeightsBuilder::new();
    let decl = |storage| TensorDecl { dtype: DType::F32, shape: vec![DimRef::Static(n as u64)], storage };
    let bytes = (n * 4) as u64;
    let slot = |i: u64| Storage::Arena { offset: i * bytes.div_ceil(64) * 64, max_bytes: bytes };
    let mut tensors = vec![decl(slot(0)), decl(slot(1)), decl(slot(2))];
    let mut instrs = Vec::new();
    for l in 0..layers {
        let value = match last {
            Some(v) if l == layers - 1 => v,
            _ => l as f32,
        };
        let data: Vec<u8> = (0..n).flat_map(|i| (value + i as f32 * 1e-3).to_le_bytes()).collect();
        tensors.push(decl(weights.push(&data)));
        let (src, dst) = if l == 0 { (0, 1 + (l as u32 % 2)) } else { (1 + ((l as u32 - 1) % 2), 1 + (l as u32 % 2)) };
        instrs.push(Instr {
            op: InstrOp::Call(Kernel::Binary { op: BinaryOp::Add }),
            inputs: vec![src, tensors.len() as u32 - 1],
            outputs: vec![dst],
            origin: format!("layer {l}"),
        });
    }
    let out = 1 + ((layers as u32 - 1) % 2);
    let plan = Plan {
        symbols: vec![],
        exprs: vec![],
        tensors,
        inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
        outputs: vec![IoDecl { name: "y".into(), tensor: out, complex: false }],
        instrs,
        states: vec![],
        arena_bytes: 3 * bytes.div_ceil(64) * 64,
        peak_live_bytes: 3 * bytes,
    };
    ArtifactWriter::new(&plan, weights, &Metadata::default()).expect("encode").to_bytes()
}

#[test]
fn changing_the_last_layer_gives_a_small_exact_patch() {
    let (old, new) = (chain(20, 4096, None), chain(20, 4096, Some(100.0)));
    let d = delta::diff(&old, &new);
    let info = delta::inspect(&d).expect("valid delta");
    // One of 20 equal tensors changed (5 %): the patch carries that tensor and the section table.
    assert!(d.len() * 100 < new.len() * 6, "delta {} of {} bytes", d.len(), new.len());
    assert!(info.carried_bytes <= 4096 * 4 + 2 * 64 * 2, "carried {}", info.carried_bytes);
    let rebuilt = delta::patch(&old, &d).expect("apply");
    assert!(rebuilt == new, "patched artifact differs from the new one");
    // And it runs: y = x + sum of the weights.
    let program = Program::from_bytes(&rebuilt).expect("load");
    let mut session = program.session().expect("session");
    let x = Tensor::from_f32(&[4096], &vec![0.0; 4096]);
    let y = session.run(&[x.view()]).expect("run").to_tensors()[0].to_f32().expect("f32");
    let want0: f32 = (0..19).map(|l| l as f32).sum::<f32>() + 100.0;
    assert_eq!(y[0], want0);
}

#[test]
fn a_patch_for_another_base_is_refused() {
    let (old, new) = (chain(4, 256, None), chain(4, 256, Some(7.0)));
    let d = delta::diff(&old, &new);
    let other = chain(4, 256, Some(-3.0));
    assert_ne!(other, old);
    match delta::patch(&other, &d) {
        Err(e @ DeltaError::WrongBase { .. }) => assert!(e.to_string().contains("another base"), "{e}"),
        other => panic!("expected WrongBase, got {:?}", other.map(|bytes| bytes.len())),
    }
}

/// Recomputes the trailing checksum so a mutation reaches the parser and the result check.
fn reseal(d: &mut [u8]) {
    use sha2::{Digest, Sha256};
    let body = d.len() - 32;
    let sum = Sha256::digest(&d[..body]);
    d[body..].copy_from_slice(&sum);
}

/// A small deterministic generator (no dependency needed for a mutation loop).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn mutated_patches_are_errors_never_panics_or_wrong_results() {
    let (old, new) = (chain(6, 512, None), chain(6, 512, Some(9.0)));
    let good = delta::diff(&old, &new);
    let mut rng = Lcg(0x6b696c6e);
    let (mut rejected_by_checksum, mut rejected_after) = (0, 0);
    for round in 0..600 {
        let mut d = good.clone();
        match rng.next() % 4 {
            0 => d.truncate(rng.next() as usize % d.len()),
            1 => {
                let at = rng.next() as usize % d.len();
                d[at] ^= 1 << (rng.next() % 8);
            }
            2 => {
                // Hostile lengths and offsets in the header or the ops, then resealed.
                let at = rng.next() as usize % (d.len() - 40);
                let v = [u64::MAX, 1 << 40, rng.next(), 0][rng.next() as usize % 4];
                d[at..at + 8].copy_from_slice(&v.to_le_bytes());
                reseal(&mut d);
            }
            _ => {
                let at = 96 + rng.next() as usize % (d.len() - 96 - 32);
                d[at] = d[at].wrapping_add(1 + (rng.next() % 255) as u8);
                reseal(&mut d);
            }
        }
        if d == good {
            continue;
        }
        match delta::patch(&old, &d) {
            Ok(result) => assert!(result == new, "round {round}: a mutated patch produced different bytes"),
            Err(DeltaError::Corrupt) | Err(DeltaError::NotADelta) => rejected_by_checksum += 1,
            Err(_) => rejected_after += 1,
        }
    }
    assert!(rejected_by_checksum > 100 && rejected_after > 100, "{rejected_by_checksum} / {rejected_after}");
}
