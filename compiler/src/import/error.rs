//! Import errors. Unsupported constructs are collected over the whole program
//! and reported together, one line per occurrence, so that a user sees every
//! op they would have to rewrite at once.

use crate::pt2::weights::WeightError;
use crate::pt2::Pt2Error;
use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file is not a readable `.pt2` (or an unsupported generation of it).
    #[error(transparent)]
    File(#[from] Pt2Error),
    /// A weight or constant storage is inconsistent with its config.
    #[error(transparent)]
    Weights(WeightError),
    /// The program is internally inconsistent (unknown value names, wrong
    /// argument kinds, out-of-range axes, declared types that contradict the
    /// op, ...): a corrupt or hand-edited file. `at` is the node's Python
    /// `file:line` when its stack trace has one.
    #[error("invalid program: {target} (node {node}{}): {detail}", located(.at))]
    InvalidNode { target: String, node: String, at: Option<String>, detail: String },
    #[error("invalid program: {0}")]
    Invalid(String),
    /// Constructs kiln cannot import; every occurrence is listed.
    #[error("{0}")]
    Unsupported(UnsupportedList),
}

/// ` at file:line`, or nothing.
fn located(at: &Option<String>) -> String {
    at.as_deref().map(|a| format!(" at {a}")).unwrap_or_default()
}

/// One unsupported construct and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The op target without `torch.ops.` (`aten.cumsum.default`), or what
    /// else is unsupported (`input spec custom_obj`, `weight`).
    pub what: String,
    /// The exported node's (or input's) name.
    pub node: String,
    /// Python `file:line` of the innermost frame of the node's stack trace.
    pub at: Option<String>,
    /// Why, when it is not simply "this op is not supported".
    pub reason: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (node {})", self.what, self.node)?;
        if let Some(at) = &self.at {
            write!(f, " at {at}")?;
        }
        if let Some(reason) = &self.reason {
            write!(f, ": {reason}")?;
        }
        Ok(())
    }
}

/// Every unsupported construct of a program, in program order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnsupportedList(pub Vec<Problem>);

impl fmt::Display for UnsupportedList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "the program uses {n} construct{} kiln does not support:", if n == 1 { "" } else { "s" })?;
        for p in &self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}
