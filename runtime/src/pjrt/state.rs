//! Session state kept on the device between runs (`--target pjrt`).
//!
//! A state is *resident* when only accelerator segments read its current
//! value and a segment computes its next one: then its device buffer is the
//! segment's argument on every run, the segment's result becomes the next
//! run's argument without a copy, and the host sees it only when the caller
//! reads it ([`DeviceStates::host_bytes`], cached until the next run). Any
//! other state stays in the arena's state region, as on the CPU.
//!
//! The compiler aliases a state's argument to its update's result in the
//! segment's module (`tf.aliasing_output`). When no other segment reads the
//! state, the segment that updates it *donates* the state's buffer: the
//! executable writes the update where the old value lies (a KV cache step
//! touches one row, not a copy of the cache) and the old buffer is gone. A
//! run that fails after that has lost the state's value: the state is
//! stale ([`DeviceStates::consumed`]), as on the CPU after an in-place write.
//! Otherwise the argument is kept (`non_donatable_input_indices`) and the
//! update is a fresh buffer.

use super::api::Buffer;
use crate::format::{AccelProgram, InstrOp, Plan, Storage};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub(crate) struct DeviceState {
    /// Index in `Plan::states`.
    pub(crate) plan_index: usize,
    /// The value the next run reads; `None` until uploaded from the arena's
    /// state region (at the first run, and after `set_state`/`reset_state`).
    pub(crate) current: Option<Buffer>,
    /// The value this run computed, made current when the run succeeds.
    pub(crate) pending: Option<Buffer>,
    /// Whether `current` is newer than the arena's state region.
    device_newer: bool,
    /// The segment computing the update donates `current` to it (no other
    /// segment reads the state).
    pub(crate) donate: bool,
    /// This run's segment took `current` over: a failed run leaves no value.
    consumed: bool,
    /// `current` copied to the host, once per run at most.
    host: OnceLock<std::result::Result<Vec<u8>, String>>,
}

/// Where a segment's arguments and results meet resident states.
#[derive(Default)]
pub(crate) struct SegmentStateUse {
    /// Per argument: the resident state it is the current value of.
    pub(crate) args: Vec<Option<usize>>,
    /// Per result: the resident state it is the next value of.
    pub(crate) results: Vec<Option<usize>>,
    /// Per result: whether the arena needs it (read by an instruction, an
    /// output of the program, or the next value of a state kept on the host).
    pub(crate) to_host: Vec<bool>,
    /// Argument indices the executable must not take over: all but the
    /// states this segment donates and the arguments uploaded for this call
    /// alone (`PJRT_ExecuteOptions::non_donatable_input_indices`).
    pub(crate) keep: Vec<i64>,
}

#[derive(Default)]
pub(crate) struct DeviceStates {
    pub(crate) states: Vec<DeviceState>,
    /// Bytes and count of state reads (`Session::state`), which happen through `&self`.
    downloads: AtomicU64,
    download_bytes: AtomicU64,
}

impl DeviceStates {
    /// Decides which states of `plan` stay on the device and how each segment
    /// of `accel` uses them.
    pub(crate) fn plan(plan: &Plan, accel: &AccelProgram) -> (DeviceStates, Vec<SegmentStateUse>) {
        let read_on_host = |t: u32| {
            plan.instrs.iter().any(|i| !matches!(i.op, InstrOp::Delegate { .. }) && i.inputs.contains(&t))
                || plan.outputs.iter().any(|o| o.tensor == t)
        };
        let read_by_segment = |t: u32| accel.segments.iter().any(|s| s.args.contains(&t));
        let kept = crate::state::resident(plan, accel);
        let resident: Vec<usize> = kept.iter().map(|&(k, _)| k).collect();
        let of_tensor = |t: u32| resident.iter().position(|&k| plan.states[k].tensor == t);
        let of_update = |t: u32| resident.iter().position(|&k| plan.states[k].update == t);
        // Donated by the one segment that reads it and computes its update.
        let donated = |k: usize| kept.iter().any(|&(r, d)| r == k && d);
        let uses = accel
            .segments
            .iter()
            .map(|s| SegmentStateUse {
                args: s.args.iter().map(|&t| of_tensor(t)).collect(),
                results: s.results.iter().map(|&t| of_update(t)).collect(),
                to_host: s
                    .results
                    .iter()
                    .map(|&t| of_update(t).is_none() || read_on_host(t) || read_by_segment(t))
                    .collect(),
                keep: s
                    .args
                    .iter()
                    .enumerate()
                    .filter(|&(_, &t)| {
                        let weight =
                            plan.tensors.get(t as usize).is_some_and(|d| matches!(d.storage, Storage::Weight { .. }));
                        let state = of_tensor(t).map(|r| resident[r]);
                        weight || state.is_some_and(|k| !(donated(k) && s.results.contains(&plan.states[k].update)))
                    })
                    .map(|(a, _)| a as i64)
                    .collect(),
            })
            .collect();
        let states = resident
            .into_iter()
            .map(|plan_index| DeviceState {
                plan_index,
                current: None,
                pending: None,
                device_newer: false,
                donate: donated(plan_index),
                consumed: false,
                host: OnceLock::new(),
            })
            .collect();
        (DeviceStates { states, ..DeviceStates::default() }, uses)
    }

    fn find(&self, plan_index: usize) -> Option<&DeviceState> {
        self.states.iter().find(|s| s.plan_index == plan_index)
    }

    /// Whether plan state `plan_index` lives on the device.
    pub(crate) fn holds(&self, plan_index: usize) -> bool {
        self.find(plan_index).is_some()
    }

    /// A run starts: values left by a failed run are dropped.
    pub(crate) fn begin_run(&mut self) {
        self.states.iter_mut().for_each(|s| {
            s.pending = None;
            s.consumed = false;
        });
    }

    /// After an execution: a state whose buffer the executable took over
    /// (donated) has no current value until the run commits its update.
    pub(crate) fn take_donated(&mut self, k: usize) -> Result<bool> {
        let s = &mut self.states[k];
        let gone = match &s.current {
            Some(b) => b.is_deleted()?,
            None => false,
        };
        if gone {
            s.current = None;
            s.consumed = true;
        }
        Ok(gone)
    }

    /// Whether this run's failure lost plan state `plan_index` (its buffer
    /// was donated to an execution): the state is stale.
    pub(crate) fn consumed(&self, plan_index: usize) -> bool {
        self.find(plan_index).is_some_and(|s| s.consumed)
    }

    /// A run succeeded: each state's new value becomes current.
    pub(crate) fn commit(&mut self) {
        for s in &mut self.states {
            s.consumed = false;
            if let Some(next) = s.pending.take() {
                s.current = Some(next);
                s.device_newer = true;
                s.host = OnceLock::new();
            }
        }
    }

    /// The caller wrote state `plan_index` into the arena (`set_state`,
    /// `reset_state`): the next run uploads it from there.
    pub(crate) fn written_on_host(&mut self, plan_index: usize) {
        if let Some(s) = self.states.iter_mut().find(|s| s.plan_index == plan_index) {
            s.current = None;
            s.pending = None;
            s.device_newer = false;
            s.consumed = false;
            s.host = OnceLock::new();
        }
    }

    /// The current value of state `plan_index` when the device holds a newer
    /// one than the arena (copied once per run); `None` when the arena's is current.
    pub(crate) fn host_bytes(&self, plan_index: usize) -> Option<Result<&[u8]>> {
        let s = self.find(plan_index).filter(|s| s.device_newer)?;
        let copied = s.host.get_or_init(|| {
            let buffer = s.current.as_ref().ok_or("the device state was dropped")?;
            let mut bytes = vec![0u8; buffer.host_size().map_err(|e| e.to_string())?];
            buffer.to_host(&mut bytes).map_err(|e| e.to_string())?;
            self.downloads.fetch_add(1, Ordering::Relaxed);
            self.download_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok(bytes)
        });
        Some(copied.as_deref().map_err(|e| Error::Device(format!("reading state from the device: {e}"))))
    }

    /// (count, bytes) of state reads that copied from the device.
    pub(crate) fn downloads(&self) -> (u64, u64) {
        (self.downloads.load(Ordering::Relaxed), self.download_bytes.load(Ordering::Relaxed))
    }
}
