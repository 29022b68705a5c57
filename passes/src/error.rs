//! What a pass returns: whether it changed the graph, or why it could not run.

use std::fmt;

/// Whether a pass rewrote anything; drives fixed-point iteration and the report.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Changed {
    #[default]
    No,
    Yes,
}

impl Changed {
    pub fn is_yes(self) -> bool {
        self == Changed::Yes
    }
}

impl From<bool> for Changed {
    fn from(b: bool) -> Changed {
        if b {
            Changed::Yes
        } else {
            Changed::No
        }
    }
}

impl std::ops::BitOr for Changed {
    type Output = Changed;
    fn bitor(self, rhs: Changed) -> Changed {
        Changed::from(self.is_yes() || rhs.is_yes())
    }
}

impl std::ops::BitOrAssign for Changed {
    fn bitor_assign(&mut self, rhs: Changed) {
        *self = *self | rhs;
    }
}

impl fmt::Display for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_yes() { "changed" } else { "unchanged" })
    }
}

/// A pass failed; `pass` names it so that a pipeline error points at its source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pass `{pass}`: {message}")]
pub struct PassError {
    pub pass: &'static str,
    pub message: String,
}

impl PassError {
    pub fn new(pass: &'static str, message: impl Into<String>) -> PassError {
        PassError { pass, message: message.into() }
    }
}
