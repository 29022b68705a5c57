//! How each state's next value reaches it, as decided by the plan (CPU) and
//! by the delegate's rules (`--target pjrt`): for `kiln inspect` and for the
//! delegate itself ([`resident`]), so both always agree.

use crate::format::{AccelProgram, InstrOp, Plan, Storage};

/// How state `name`'s update is written (see [`crate::Program::state_writes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateWriteKind {
    /// Instruction `instr` (kernel `kernel`) updates the state's storage in
    /// place, reading the old value where it lies (an indexed write, or an
    /// elementwise op).
    InPlace { instr: usize, kernel: String },
    /// Instruction `instr` writes the update into the state's storage without
    /// reading the old value.
    Direct { instr: usize, kernel: String },
    /// The update is computed elsewhere and copied in when the run succeeds.
    EndOfRunCopy,
    /// The program never changes the state.
    Unchanged,
    /// Kept on the device between runs: accelerator segment `segment`
    /// computes the update, into the old value's buffer when `donated`,
    /// into a new buffer otherwise.
    Device { segment: usize, donated: bool },
}

/// One state's write, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateWriteInfo {
    pub name: String,
    pub kind: StateWriteKind,
}

impl StateWriteKind {
    /// One line for `kiln inspect`.
    pub fn describe(&self) -> String {
        match self {
            StateWriteKind::InPlace { instr, kernel } => format!("in place by `{kernel}` (instruction {instr})"),
            StateWriteKind::Direct { instr, kernel } => format!("written directly by `{kernel}` (instruction {instr})"),
            StateWriteKind::EndOfRunCopy => "end-of-run copy".to_string(),
            StateWriteKind::Unchanged => "unchanged".to_string(),
            StateWriteKind::Device { segment, donated: true } => {
                format!("on the device, in place (buffer donated to segment {segment})")
            }
            StateWriteKind::Device { segment, donated: false } => {
                format!("on the device, a new buffer from segment {segment}")
            }
        }
    }

    /// A short tag for `--json`.
    pub fn tag(&self) -> &'static str {
        match self {
            StateWriteKind::InPlace { .. } => "in_place",
            StateWriteKind::Direct { .. } => "direct",
            StateWriteKind::EndOfRunCopy => "end_of_run_copy",
            StateWriteKind::Unchanged => "unchanged",
            StateWriteKind::Device { .. } => "device",
        }
    }
}

/// The states (indices into `Plan::states`) an accelerator delegate keeps on
/// the device, each with whether the segment computing its update is the
/// only one reading it, so it can donate the state's buffer. A state is kept
/// there when only segments read its current value and exactly one segment
/// computes its update (which no other state shares).
pub(crate) fn resident(plan: &Plan, accel: &AccelProgram) -> Vec<(usize, bool)> {
    let read_on_host = |t: u32| {
        plan.instrs.iter().any(|i| !matches!(i.op, InstrOp::Delegate { .. }) && i.inputs.contains(&t))
            || plan.outputs.iter().any(|o| o.tensor == t)
    };
    let made_by_segment = |t: u32| accel.segments.iter().filter(|s| s.results.contains(&t)).count() == 1;
    let shared_update = |t: u32| plan.states.iter().filter(|st| st.update == t).count() > 1;
    (0..plan.states.len())
        .filter(|&k| {
            let st = &plan.states[k];
            st.update != st.tensor
                && !read_on_host(st.tensor)
                && made_by_segment(st.update)
                && !shared_update(st.update)
                && !accel.segments.iter().any(|s| s.results.contains(&st.tensor))
        })
        .map(|k| {
            let st = &plan.states[k];
            let readers: Vec<_> = accel.segments.iter().filter(|s| s.args.contains(&st.tensor)).collect();
            (k, matches!(readers[..], [s] if s.results.contains(&st.update)))
        })
        .collect()
}

/// How each state of `plan` is written (see [`StateWriteKind`]); `accel`
/// when the program has accelerator segments (a single-device delegate).
pub(crate) fn state_writes(plan: &Plan, accel: Option<&AccelProgram>) -> Vec<StateWriteInfo> {
    let on_device = accel.filter(|a| a.mesh.is_none()).map(|a| resident(plan, a)).unwrap_or_default();
    let region = |t: u32| match plan.tensors.get(t as usize).map(|d| d.storage) {
        Some(Storage::Arena { offset, max_bytes }) => Some((offset, max_bytes)),
        _ => None,
    };
    plan.states
        .iter()
        .enumerate()
        .map(|(k, st)| {
            let device = on_device.iter().find(|&&(r, _)| r == k).and_then(|&(_, donated)| {
                let segment = accel?.segments.iter().position(|s| s.results.contains(&st.update))?;
                Some(StateWriteKind::Device { segment, donated })
            });
            let kind = match device {
                Some(d) => d,
                None if st.update != st.tensor => StateWriteKind::EndOfRunCopy,
                None => {
                    let state = region(st.tensor);
                    let writer = plan
                        .instrs
                        .iter()
                        .enumerate()
                        .find(|(_, i)| state.is_some() && i.outputs.iter().any(|&t| region(t) == state));
                    match writer {
                        Some((instr, i)) => {
                            let kernel = crate::program::instr_display_name(&i.op);
                            if crate::exec::in_place_at(i).is_some() {
                                StateWriteKind::InPlace { instr, kernel }
                            } else {
                                StateWriteKind::Direct { instr, kernel }
                            }
                        }
                        None => StateWriteKind::Unchanged,
                    }
                }
            };
            StateWriteInfo { name: st.name.clone(), kind }
        })
        .collect()
}
