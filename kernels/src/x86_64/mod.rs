//! x86_64 kernel variants, compiled for every x86_64 target but only called
//! after run-time CPU feature detection (no `-C target-cpu` needed).

pub(crate) mod avx2;
