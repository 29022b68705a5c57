//! Benchmarks live in benches/; this library holds what several share.

use kiln_kernels::{Isa, KernelTable};

/// The kernel tables this CPU runs, each with its level's name, skipping a
/// table whose entries repeat one already listed (a v4 table that holds the
/// v3 kernels), so each variant is measured once; `generic` (the portable
/// kernels) only when asked.
pub fn distinct_tables(with_generic: bool) -> Vec<(Isa, &'static KernelTable)> {
    let mut out: Vec<(Isa, &'static KernelTable)> = Vec::new();
    for (isa, t) in Isa::ALL.iter().filter_map(|&isa| KernelTable::for_isa(isa).map(|t| (isa, t))) {
        if (with_generic || isa != Isa::Generic) && !out.iter().any(|(_, seen)| seen.entries() == t.entries()) {
            out.push((isa, t));
        }
    }
    out
}
