//! Fuzzes the importer and the compile pipeline with structurally mutated
//! `.pt2` files: the input picks a file of the corpus (the fixtures and
//! conformance cases) and is the tape of choices of `kiln_tests::mutate`
//! (which values of the program JSON and storage configs change, and how);
//! the mutated file, re-zipped like torch, must compile and load or fail
//! with an error — never panic, never allocate by a size from the file.
//!
//!   cd compiler && cargo +nightly fuzz run import -- -rss_limit_mb=2048
#![no_main]

use kiln_tests::mutate::{compile_bytes, corpus, mutate_with, Pt2Parts, Rng};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn files() -> &'static [Pt2Parts] {
    static FILES: OnceLock<Vec<Pt2Parts>> = OnceLock::new();
    FILES.get_or_init(|| corpus().iter().filter_map(|p| Pt2Parts::read(p).ok()).collect())
}

fuzz_target!(|data: &[u8]| {
    let files = files();
    let [a, b, count, tape @ ..] = data else { return };
    let Some(parts) = files.get(u16::from_le_bytes([*a, *b]) as usize % files.len().max(1)) else { return };
    let (mutated, _) = mutate_with(parts, &mut Rng::from_tape(tape), 1 + *count as usize % 4);
    let _ = compile_bytes(&mutated.to_zip());
});
