//! Core ATen coverage of the conformance cases: for every overload of
//! torch's Core ATen opset (`kiln_compiler::import::support::CORE_ATEN`), the
//! case runs whose program calls it and whether all of them pass. A case run
//! is one IR flavour of one case; it counts for the overloads of that
//! flavour's graph (Core ATen or training IR), so an overload that torch's
//! own decompositions rewrite away (reflection_pad2d, col2im …) is covered
//! by the training-IR programs that keep it.

use kiln_compiler::import::support::{core_aten_status, CORE_ATEN};

/// One case run: the ATen targets of the program (`aten.add.Tensor`) and
/// whether kiln matched torch on it. Known-unsupported cases (programs kiln
/// refuses at compile time for a listed reason) are not runs: they exercise
/// none of their overloads.
#[derive(Clone, Debug)]
pub struct CaseRun {
    pub ops: Vec<String>,
    pub passed: bool,
}

/// Core overloads that no conformance case can call and another suite
/// checks instead, with where.
pub const EXERCISED_ELSEWHERE: &[(&str, &str)] = &[
    ("rand.default", "the `random` fixture, distribution-tested in tests/tests/e2e/control_flow_random_custom.rs"),
    ("randn.default", "the `random` fixture, distribution-tested in tests/tests/e2e/control_flow_random_custom.rs"),
    ("randperm.default", "the `random` fixture, distribution-tested in tests/tests/e2e/control_flow_random_custom.rs"),
    (
        "native_dropout.default",
        "the `random` fixture, distribution-tested in tests/tests/e2e/control_flow_random_custom.rs",
    ),
    ("sym_size.int", "the dynamic-shape cases (tests/conformance/dynamic, tests/tests/e2e/conformance_dynamic.rs)"),
    ("sym_numel.default", "the dynamic-shape case `numel_as_number` (tests/tests/e2e/conformance_dynamic.rs)"),
    ("nonzero.default", "the `nonzero` fixture (several counts per program) in tests/tests/e2e/data_dependent.rs"),
    (
        "_local_scalar_dense.default",
        "the `item` fixture (`.item()` as a size and as a multiplier) in tests/tests/e2e/data_dependent.rs",
    ),
];

/// Imported overloads no suite exercises yet, with why: the coverage check
/// fails on any other gap, so this list is the whole of it.
pub const NOT_EXERCISED: &[(&str, &str)] = &[
    ("sym_stride.int", "torch.export 2.15 writes `x.stride(i)` of a dynamic tensor as sym_size arithmetic; no program we could export calls it"),
    ("sym_storage_offset.default", "torch.export 2.15 writes `x.storage_offset()` as sym_size arithmetic; no program we could export calls it"),
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreStatus {
    /// Every run calling it passed.
    Passes { runs: usize },
    /// Some runs calling it failed.
    Fails { runs: usize, failed: usize },
    /// Checked by another suite (see [`EXERCISED_ELSEWHERE`]).
    Elsewhere(&'static str),
    /// Listed in [`NOT_EXERCISED`].
    NotExercised(&'static str),
    /// Not imported (data-dependent, complex, …) or excluded (gradients):
    /// `core_aten_status`'s reason.
    Unsupported(&'static str),
    /// Imported, yet no run calls it and no list explains why: a gap.
    Gap,
}

/// The status of every Core ATen overload over `runs`.
pub fn core_coverage(runs: &[CaseRun]) -> Vec<(&'static str, CoreStatus)> {
    CORE_ATEN
        .iter()
        .map(|&overload| {
            let target = format!("aten.{overload}");
            let calling: Vec<&CaseRun> = runs.iter().filter(|r| r.ops.contains(&target)).collect();
            let failed = calling.iter().filter(|r| !r.passed).count();
            let status = if let Some(why) = core_aten_status(overload) {
                CoreStatus::Unsupported(why)
            } else if !calling.is_empty() && failed == 0 {
                CoreStatus::Passes { runs: calling.len() }
            } else if !calling.is_empty() {
                CoreStatus::Fails { runs: calling.len(), failed }
            } else if let Some((_, w)) = EXERCISED_ELSEWHERE.iter().find(|(o, _)| *o == overload) {
                CoreStatus::Elsewhere(w)
            } else if let Some((_, w)) = NOT_EXERCISED.iter().find(|(o, _)| *o == overload) {
                CoreStatus::NotExercised(w)
            } else {
                CoreStatus::Gap
            };
            (overload, status)
        })
        .collect()
}

/// Overloads that pass (here or in another suite) out of the non-gradient
/// ones: the "≥ 95 % of Core ATen" measure.
pub fn passing_share(rows: &[(&'static str, CoreStatus)]) -> (usize, usize) {
    let gradient = |o: &str| o.split('.').next().is_some_and(|n| n.ends_with("_backward"));
    let considered: Vec<_> = rows.iter().filter(|(o, _)| !gradient(o)).collect();
    let passing =
        considered.iter().filter(|(_, s)| matches!(s, CoreStatus::Passes { .. } | CoreStatus::Elsewhere(_))).count();
    (passing, considered.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_run_marks_its_overloads() {
        let runs = vec![
            CaseRun { ops: vec!["aten.add.Tensor".into(), "aten.mul.Tensor".into()], passed: true },
            CaseRun { ops: vec!["aten.mul.Tensor".into()], passed: false },
        ];
        let rows = core_coverage(&runs);
        let get = |o: &str| rows.iter().find(|(n, _)| *n == o).map(|(_, s)| s.clone()).unwrap();
        assert_eq!(get("add.Tensor"), CoreStatus::Passes { runs: 1 });
        assert_eq!(get("mul.Tensor"), CoreStatus::Fails { runs: 2, failed: 1 });
        assert_eq!(get("sub.Tensor"), CoreStatus::Gap);
        assert!(matches!(get("convolution_backward.default"), CoreStatus::Unsupported(_)));
        assert!(matches!(get("rand.default"), CoreStatus::Elsewhere(_)));
        let (passing, of) = passing_share(&rows);
        assert_eq!(of, CORE_ATEN.len() - 7, "the seven *_backward overloads are left out");
        assert_eq!(passing, 1 + EXERCISED_ELSEWHERE.len());
    }

    #[test]
    fn the_suites_named_elsewhere_do_call_those_overloads() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        // torch.export.save stores model.json uncompressed: the targets are plain text.
        let random = std::fs::read(root.join("fixtures/random/aten.pt2")).expect("random fixture");
        let dynamic = std::fs::read(root.join("conformance/dynamic/manifest.json")).expect("dynamic manifest");
        let nonzero = std::fs::read(root.join("fixtures/nonzero/aten.pt2")).expect("nonzero fixture");
        let item = std::fs::read(root.join("fixtures/item/aten.pt2")).expect("item fixture");
        for (overload, _) in EXERCISED_ELSEWHERE {
            let (haystack, needle) = if overload.starts_with("sym_") {
                (&dynamic, format!("aten.{overload}"))
            } else if overload.starts_with("nonzero") {
                (&nonzero, format!("torch.ops.aten.{overload}"))
            } else if overload.starts_with("_local_scalar_dense") {
                (&item, format!("torch.ops.aten.{overload}"))
            } else {
                (&random, format!("torch.ops.aten.{overload}"))
            };
            assert!(
                haystack.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{overload}: not called where EXERCISED_ELSEWHERE says"
            );
        }
    }
}
