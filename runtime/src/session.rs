//! A per-thread execution context: owns the arena, the evaluated shapes and the
//! kernels' scratch memory. After the first call `run` allocates nothing (the
//! scratch only grows if a later call has larger dynamic shapes than any before).
//!
//! State (buffers the program mutates: counters, filters, KV caches) lives in
//! the arena's state region: it is filled with the buffers' initial values
//! when the arena is allocated. A state's update is written there either by
//! the run itself, where the compiler proved nothing reads the old value
//! afterwards (a KV cache's `index_copy_` updates its rows in place: a decode
//! step touches only the rows it writes), or by a copy when the run
//! succeeds (every other update).
//!
//! Failed runs: a run that fails before the instruction writing a state
//! leaves that state as it was. One that fails at or after it may leave it
//! partly updated (an in-place write has happened, later instructions have
//! not): the session then marks the state *stale*, and refuses to run or to
//! read it ([`Error::StaleState`], naming it) until [`Session::reset_state`] or
//! [`Session::set_state`] gives it a whole value again. Nothing is silently
//! run on a half-updated cache.

use crate::aligned::AlignedBuf;
use crate::device::{AccelInfo, Device, SessionOptions};
use crate::exec::{run_packed, Step};
use crate::format::{DimExpr, DimRef, InstrOp, Storage};
use crate::program::Program;
use crate::{Error, Result};
use kiln_kernels::{Context, DType, TensorMut, TensorRef};
use std::sync::Arc;

/// A read-only view of a tensor: dtype, shape and row-major bytes.
pub type TensorView<'a> = TensorRef<'a>;

/// An owned tensor, for callers that want to keep outputs past the next run.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn view(&self) -> TensorView<'_> {
        TensorRef { dtype: self.dtype, shape: &self.shape, data: &self.data }
    }

    pub fn from_f32(shape: &[usize], values: &[f32]) -> Tensor {
        Tensor { dtype: DType::F32, shape: shape.to_vec(), data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
    }

    pub fn from_i64(shape: &[usize], values: &[i64]) -> Tensor {
        Tensor { dtype: DType::I64, shape: shape.to_vec(), data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
    }

    /// The elements as f32, when the dtype is f32.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == DType::F32)
            .then(|| self.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// The elements of `t` as f64, whatever its dtype (exact for every dtype
/// but i64 beyond 2^53; bools as 0 and 1; complex elements as their real
/// and imaginary parts, in turn): for reports, comparisons and JSON, not
/// for hot paths.
pub fn elements_f64(t: &TensorView<'_>) -> Vec<f64> {
    fn le<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        data.chunks_exact(N).map(|c| {
            let mut a = [0; N];
            a.copy_from_slice(c);
            a
        })
    }
    match t.dtype {
        DType::F32 => le::<4>(t.data).map(|c| f32::from_le_bytes(c) as f64).collect(),
        DType::F64 => le::<8>(t.data).map(f64::from_le_bytes).collect(),
        DType::F16 => le::<2>(t.data).map(|c| half::f16::from_le_bytes(c).to_f64()).collect(),
        DType::BF16 => le::<2>(t.data).map(|c| half::bf16::from_le_bytes(c).to_f64()).collect(),
        DType::I64 => le::<8>(t.data).map(|c| i64::from_le_bytes(c) as f64).collect(),
        DType::I32 => le::<4>(t.data).map(|c| i32::from_le_bytes(c) as f64).collect(),
        DType::I16 => le::<2>(t.data).map(|c| i16::from_le_bytes(c) as f64).collect(),
        DType::I8 => t.data.iter().map(|&b| b as i8 as f64).collect(),
        DType::U8 | DType::Bool => t.data.iter().map(|&b| b as f64).collect(),
        // Two numbers per element: real, imaginary.
        DType::C64 => le::<4>(t.data).map(|c| f32::from_le_bytes(c) as f64).collect(),
        DType::C128 => le::<8>(t.data).map(f64::from_le_bytes).collect(),
    }
}

pub struct Session {
    program: Arc<Program>,
    /// Allocated by the first run, once its inputs passed their checks (or
    /// by the first [`Session::set_state`]); its state region is initialised then.
    arena: Option<AlignedBuf>,
    /// The static shape of each state, indexed like `Plan::states`.
    state_shapes: Vec<Vec<usize>>,
    /// Per state: a failed run may have written it partly (see the module
    /// doc); cleared by `reset_state` and `set_state`.
    stale: Vec<bool>,
    /// The highest instruction index the current run has started.
    reached: usize,
    sym_vals: Vec<u64>,
    expr_vals: Vec<u64>,
    /// Evaluated shapes of all tensors, flattened; tensor `t` is `shapes[shape_at[t]..shape_at[t+1]]`.
    shapes: Vec<usize>,
    shape_at: Vec<usize>,
    /// Symbol values the shapes were last evaluated for (valid once `evaluated`).
    evaluated_for: Vec<u64>,
    evaluated: bool,
    /// Which symbols the current call has bound so far (reused across calls).
    bound: Vec<bool>,
    /// The kernels' context: scratch memory, and the generator's seed with the
    /// number of runs since it was set — together the position of this run's
    /// random numbers (see `kiln_kernels::random`).
    cx: Context,
    /// Per-instruction operand/output/result lists, reused (empty between calls).
    operand_buf: Vec<TensorRef<'static>>,
    output_buf: Vec<TensorMut<'static>>,
    result_buf: Vec<&'static mut [u8]>,
    /// Time spent in each instruction since profiling was enabled.
    profile: Option<Vec<InstrTime>>,
    /// Runs `Delegate` instructions; present iff the device is not the CPU.
    accel: AccelDelegate,
    /// Native calls run their generated code (native code allowed and a
    /// level matched this CPU); else their portable programs.
    use_native: bool,
    /// Whether runs keep the pool hot ([`SessionOptions::spin`]).
    spin: bool,
}

/// A kernel context at the start of `seed`'s random sequence.
/// A kernel context at the start of `seed`'s random sequence, on the
/// process-wide pool of `threads` threads.
fn seeded_context(seed: u64, threads: usize) -> Context {
    let mut cx = Context::new().with_threads(threads);
    cx.seed = seed;
    cx
}

#[cfg(feature = "pjrt")]
type AccelDelegate = Option<crate::pjrt::accel::AccelState>;
/// Without PJRT support there is never a delegate (sessions on other devices
/// are refused at creation).
#[cfg(not(feature = "pjrt"))]
type AccelDelegate = Option<std::convert::Infallible>;

fn start_accel(program: &Program, options: &SessionOptions) -> Result<AccelDelegate> {
    if options.device == Device::Cpu {
        if program.needs_accelerator() {
            let segments = program.accel().map_or(0, |a| a.segments.len());
            return Err(Error::Device(format!(
                "this artifact was compiled for an accelerator ({segments} accelerator segments); run it with --device tpu, gpu or pjrt:PATH"
            )));
        }
        return Ok(None);
    }
    #[cfg(feature = "pjrt")]
    {
        crate::pjrt::accel::AccelState::new(program, options).map(Some)
    }
    #[cfg(not(feature = "pjrt"))]
    {
        Err(Error::Device(format!(
            "device `{}` needs PJRT support, which this build of kiln-runtime lacks (cargo feature `pjrt`)",
            options.device
        )))
    }
}

#[cfg(feature = "pjrt")]
fn run_accel(accel: &mut AccelDelegate, segment: u32, args: &[TensorRef<'_>], results: &mut [&mut [u8]]) -> Result<()> {
    match accel {
        Some(a) => a.run(segment, args, results),
        None => Err(Error::Device("accelerator instruction in a CPU session".into())),
    }
}

/// The shape bucket (`AccelProgram::buckets`) a run with these symbol values
/// takes instead of the plan, if the delegate has one that fits.
#[cfg(feature = "pjrt")]
fn accel_bucket(accel: &mut AccelDelegate, sym_vals: &[u64]) -> Option<usize> {
    accel.as_mut().and_then(|a| a.bucket_for(sym_vals))
}

/// Bucket `b`'s argument or (`result`) result tensor `k`, if it has one.
#[cfg(feature = "pjrt")]
fn bucket_tensor(accel: &AccelDelegate, b: usize, result: bool, k: usize) -> Option<u32> {
    let (args, results) = accel.as_ref()?.bucket_tensors(b);
    if result { results } else { args }.get(k).copied()
}

#[cfg(feature = "pjrt")]
fn run_bucket(
    accel: &mut AccelDelegate,
    b: usize,
    sym_vals: &[u64],
    args: &[TensorRef<'_>],
    results: &mut [TensorMut<'_>],
) -> Result<()> {
    match accel {
        Some(a) => a.run_bucket(b, sym_vals, args, results),
        None => Err(Error::Device("shape bucket in a CPU session".into())),
    }
}

#[cfg(not(feature = "pjrt"))]
fn accel_bucket(_: &mut AccelDelegate, _: &[u64]) -> Option<usize> {
    None
}

#[cfg(not(feature = "pjrt"))]
fn bucket_tensor(_: &AccelDelegate, _: usize, _: bool, _: usize) -> Option<u32> {
    None
}

#[cfg(not(feature = "pjrt"))]
fn run_bucket(_: &mut AccelDelegate, _: usize, _: &[u64], _: &[TensorRef<'_>], _: &mut [TensorMut<'_>]) -> Result<()> {
    Err(Error::Device("shape bucket in a build without PJRT support".into()))
}

/// The delegate's view of session state: under `--target pjrt` a state that
/// only accelerator segments read stays on the device between runs
/// (`pjrt/state.rs`); the session asks here before using its arena copy.
trait DelegateState {
    /// Whether state `k` (index in `Plan::states`) lives on the device.
    fn holds_state(&self, k: usize) -> bool;
    /// State `k`'s value when the device's is newer than the arena's.
    fn device_state(&self, k: usize) -> Option<Result<&[u8]>>;
    /// Before a run: drop what a failed run left.
    fn begin_run(&mut self);
    /// After a successful run: the run's state updates become current.
    fn commit_states(&mut self);
    /// The caller wrote state `k` into the arena: the device copy is stale.
    fn state_written(&mut self, k: usize);
    /// This (failed) run donated state `k`'s device buffer: its value is lost.
    fn state_consumed(&self, k: usize) -> bool;
}

#[cfg(feature = "pjrt")]
impl DelegateState for AccelDelegate {
    fn holds_state(&self, k: usize) -> bool {
        self.as_ref().is_some_and(|a| a.device_states().holds(k))
    }
    fn device_state(&self, k: usize) -> Option<Result<&[u8]>> {
        self.as_ref()?.device_states().host_bytes(k)
    }
    fn begin_run(&mut self) {
        if let Some(a) = self {
            a.device_states_mut().begin_run();
        }
    }
    fn commit_states(&mut self) {
        if let Some(a) = self {
            a.device_states_mut().commit();
        }
    }
    fn state_written(&mut self, k: usize) {
        if let Some(a) = self {
            a.device_states_mut().written_on_host(k);
        }
    }
    fn state_consumed(&self, k: usize) -> bool {
        self.as_ref().is_some_and(|a| a.device_states().consumed(k))
    }
}

#[cfg(not(feature = "pjrt"))]
impl DelegateState for AccelDelegate {
    fn holds_state(&self, _: usize) -> bool {
        false
    }
    fn device_state(&self, _: usize) -> Option<Result<&[u8]>> {
        None
    }
    fn begin_run(&mut self) {}
    fn commit_states(&mut self) {}
    fn state_written(&mut self, _: usize) {}
    fn state_consumed(&self, _: usize) -> bool {
        false
    }
}

#[cfg(not(feature = "pjrt"))]
fn run_accel(_: &mut AccelDelegate, _: u32, _: &[TensorRef<'_>], _: &mut [&mut [u8]]) -> Result<()> {
    // Unreachable in practice: such sessions are refused at creation.
    Err(Error::Device("accelerator instruction in a build without PJRT support".into()))
}

impl Session {
    pub(crate) fn new(program: Arc<Program>, options: &SessionOptions) -> Result<Session> {
        let plan = program.plan();
        // Refused before anything is allocated or a device is started.
        if plan.arena_bytes > options.max_arena_bytes {
            return Err(Error::ArenaLimit { bytes: plan.arena_bytes, limit: options.max_arena_bytes });
        }
        let accel = start_accel(&program, options)?;
        let use_native = options.allow_native_code && program.native_code()?.is_some();
        let mut shape_at = Vec::with_capacity(plan.tensors.len() + 1);
        let mut total = 0;
        for t in &plan.tensors {
            shape_at.push(total);
            total += t.shape.len();
        }
        shape_at.push(total);
        let state_shapes = plan
            .states
            .iter()
            .map(|st| {
                // Validated static.
                let shape = &plan.tensors[st.tensor as usize].shape;
                shape.iter().map(|d| if let DimRef::Static(v) = d { *v as usize } else { 0 }).collect()
            })
            .collect();
        Ok(Session {
            stale: vec![false; plan.states.len()],
            reached: 0,
            state_shapes,
            sym_vals: vec![0; plan.symbols.len()],
            expr_vals: vec![0; plan.exprs.len()],
            shapes: vec![0; total],
            shape_at,
            evaluated_for: vec![0; plan.symbols.len()],
            evaluated: false,
            bound: vec![false; plan.symbols.len()],
            cx: seeded_context(options.seed, options.threads),
            operand_buf: Vec::new(),
            output_buf: Vec::new(),
            result_buf: Vec::new(),
            profile: None,
            accel,
            use_native,
            spin: options.spin,
            arena: None,
            program,
        })
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// How many B-operand slices this session's GEMMs have packed so far.
    /// Weights packed at load ([`Program::packed_weights`]) never add to it.
    pub fn gemm_b_packs(&self) -> u64 {
        self.cx.b_packs()
    }

    /// Restarts the random-number sequence from `seed`: the next runs draw
    /// exactly what a new session with [`SessionOptions::seed`] = `seed` would.
    pub fn set_seed(&mut self, seed: u64) {
        self.cx.seed = seed;
        self.cx.call = 0;
    }

    /// The accelerator delegate's plugin, device and compile/cache counts;
    /// `None` in a CPU session.
    pub fn accel_info(&self) -> Option<&AccelInfo> {
        #[cfg(feature = "pjrt")]
        {
            self.accel.as_ref().map(|a| a.info())
        }
        #[cfg(not(feature = "pjrt"))]
        {
            None
        }
    }

    /// What the accelerator delegate's segments ran and copied so far (per
    /// segment: calls, host↔device bytes and times); `None` in a CPU session.
    pub fn accel_stats(&self) -> Option<crate::device::AccelStats> {
        #[cfg(feature = "pjrt")]
        {
            self.accel.as_ref().map(|a| a.stats())
        }
        #[cfg(not(feature = "pjrt"))]
        {
            None
        }
    }

    /// Starts (or restarts) accumulating the time spent in each instruction.
    /// Off by default: the run loop then reads no clock.
    pub fn enable_profiling(&mut self) {
        self.profile = Some(vec![InstrTime::default(); self.program.plan().instrs.len()]);
    }

    /// Time spent in each instruction (indexed like `Plan::instrs`) over all
    /// runs since [`Session::enable_profiling`].
    pub fn profile(&self) -> Option<&[InstrTime]> {
        self.profile.as_deref()
    }

    /// Runs the program once.
    ///
    /// `inputs` are given in the program's input order ([`Program::inputs`]);
    /// each is checked against its declared dtype and every dimension (binding
    /// the program's symbols) before anything is allocated or written. The
    /// first run allocates the arena; later runs allocate nothing (unless a
    /// dynamic shape grows the kernels' scratch beyond anything seen before).
    /// The outputs borrow the session until the next call. Random ops draw
    /// new numbers on every run, failed ones included. Errors are values: a
    /// kernel's names the instruction and the model's source line.
    ///
    /// State: a run that fails may leave a state written in place partly
    /// updated; that state is then *stale* and the next `run` (or
    /// [`Session::state`]) is refused with [`Error::StaleState`] until
    /// [`Session::reset_state`] or [`Session::set_state`] (see the module
    /// doc). Input errors are found before anything runs and never do this.
    pub fn run(&mut self, inputs: &[TensorView<'_>]) -> Result<Outputs<'_>> {
        if let Some(k) = self.stale.iter().position(|&s| s) {
            return Err(self.stale_error(k));
        }
        self.bind(inputs)?;
        self.allocate_arena()?;
        self.copy_inputs(inputs);
        self.accel.begin_run();
        // The pool's workers spin between this run's jobs rather than park
        // (unless the session opted out); they park once no run is hot.
        let hot = self.spin.then(|| self.cx.threads().hot());
        self.reached = 0;
        let executed = self.execute_all();
        drop(hot);
        // A failed run still advances the sequence: a retry draws new numbers
        // rather than silently repeating a partial run's.
        self.cx.call = self.cx.call.wrapping_add(1);
        if executed.is_err() {
            self.mark_stale();
        }
        executed?;
        self.commit_states();
        self.accel.commit_states();
        Ok(Outputs { session: self })
    }

    /// The names of the buffers this program keeps between runs, in plan order.
    pub fn state_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.program.plan().states.iter().map(|st| st.name.as_str())
    }

    /// The current value of state `name`: its initial value before the first
    /// run, then what the last successful run left (or [`Session::set_state`] wrote).
    /// A state a failed run left stale is an error (see [`Session::run`]).
    pub fn state(&self, name: &str) -> Result<TensorView<'_>> {
        let plan = self.program.plan();
        let (k, st) = find_state_or_err(plan, name)?;
        if self.stale[k] {
            return Err(self.stale_error(k));
        }
        let bytes = self.state_len(k);
        let on_device = self.accel.device_state(k).transpose()?;
        let data = match (&self.arena, plan.tensors[st.tensor as usize].storage) {
            // Kept on the device, whose value is newer than the arena's.
            _ if on_device.is_some() => on_device.unwrap_or_default(),
            (Some(arena), Storage::Arena { offset, .. }) => &arena.as_slice()[offset as usize..offset as usize + bytes],
            // Not allocated yet: the state still holds its initial value.
            _ => self.weight_bytes(st.init),
        };
        Ok(TensorRef { dtype: plan.tensors[st.tensor as usize].dtype, shape: &self.state_shapes[k], data })
    }

    /// Overwrites state `name` (same dtype and shape as the buffer); the next
    /// run reads it. Allocates the arena if no run did yet.
    pub fn set_state(&mut self, name: &str, value: TensorView<'_>) -> Result<()> {
        let program = Arc::clone(&self.program);
        let plan = program.plan();
        let (k, st) = find_state_or_err(plan, name)?;
        let decl = &plan.tensors[st.tensor as usize];
        let wrong = |detail: String| Error::State { name: name.to_string(), detail };
        if value.dtype != decl.dtype || value.shape != self.state_shapes[k].as_slice() {
            return Err(wrong(format!(
                "got {} {:?}, the buffer is {} {:?}",
                value.dtype, value.shape, decl.dtype, self.state_shapes[k]
            )));
        }
        let bytes = self.state_len(k);
        if value.data.len() != bytes {
            return Err(wrong(format!("{} data bytes do not match shape {:?}", value.data.len(), value.shape)));
        }
        if let Some(detail) = bool_byte_problem(&value) {
            return Err(wrong(detail));
        }
        self.allocate_arena()?;
        if let (Some(arena), Storage::Arena { offset, .. }) = (self.arena.as_mut(), decl.storage) {
            arena.as_mut_slice()[offset as usize..offset as usize + bytes].copy_from_slice(value.data);
        }
        self.accel.state_written(k);
        self.stale[k] = false;
        Ok(())
    }

    /// Whether a failed run left state `name` stale (partly updated in
    /// place): runs are refused until it is reset or set.
    pub fn state_is_stale(&self, name: &str) -> Result<bool> {
        let (k, _) = find_state_or_err(self.program.plan(), name)?;
        Ok(self.stale[k])
    }

    /// After a failed run: every state whose writing instruction ran is
    /// stale, and so is one whose writer failed, unless that writer updates
    /// in place (those kernels check everything before writing anything),
    /// and so is a device state the run donated to an execution.
    fn mark_stale(&mut self) {
        let writers = &self.program.resolved().state_writers;
        for (k, (stale, writer)) in self.stale.iter_mut().zip(writers).enumerate() {
            *stale |= writer.is_some_and(|w| w.index < self.reached || (w.index == self.reached && !w.in_place));
            // A device state whose buffer an execution took over (donated).
            *stale |= self.accel.state_consumed(k);
        }
    }

    fn stale_error(&self, k: usize) -> Error {
        Error::StaleState { name: self.program.plan().states[k].name.clone() }
    }

    /// Puts every state back to its initial value (the program's buffers), as
    /// in a new session; stale states (see [`Session::run`]) become usable
    /// again. Runs, seeds and outputs are otherwise untouched.
    pub fn reset_state(&mut self) {
        self.stale.fill(false);
        // Before the first allocation the states are still initial.
        if self.arena.is_some() {
            self.init_states();
        }
        for k in 0..self.state_shapes.len() {
            self.accel.state_written(k);
        }
    }

    /// Bytes of state `k` (its static shape).
    fn state_len(&self, k: usize) -> usize {
        let plan = self.program.plan();
        let dtype = plan.tensors[plan.states[k].tensor as usize].dtype;
        self.state_shapes[k].iter().product::<usize>() * dtype.size_bytes()
    }

    /// The bytes of weight tensor `t` (validated to be one).
    fn weight_bytes(&self, t: u32) -> &[u8] {
        weight_bytes(&self.program, t)
    }

    /// Copies every state's initial value into its place in the arena.
    fn init_states(&mut self) {
        let program = Arc::clone(&self.program);
        let plan = program.plan();
        for st in &plan.states {
            let init = weight_bytes(&program, st.init);
            let (Some(arena), Storage::Arena { offset, .. }) =
                (self.arena.as_mut(), plan.tensors[st.tensor as usize].storage)
            else {
                continue;
            };
            // Validated: the initial value has the state's size, inside the arena.
            arena.as_mut_slice()[offset as usize..offset as usize + init.len()].copy_from_slice(init);
        }
    }

    /// After a successful run: each state's new value becomes its current
    /// one. Updates lie outside the state region (validated), so the copies
    /// are independent of their order.
    fn commit_states(&mut self) {
        let program = Arc::clone(&self.program);
        let plan = program.plan();
        for (k, st) in plan.states.iter().enumerate() {
            // A state kept on the device is updated there (its update may
            // not even be copied to the arena).
            if st.update == st.tensor || self.accel.holds_state(k) {
                continue;
            }
            let bytes = self.state_len(k);
            let Some(arena) = self.arena.as_mut() else { return };
            let Storage::Arena { offset: dst, .. } = plan.tensors[st.tensor as usize].storage else { continue };
            let dst = dst as usize;
            match plan.tensors[st.update as usize].storage {
                Storage::Arena { offset: src, .. } => {
                    arena.as_mut_slice().copy_within(src as usize..src as usize + bytes, dst);
                }
                Storage::Weight { offset, .. } => {
                    let src = &program.weights()[offset as usize..offset as usize + bytes];
                    arena.as_mut_slice()[dst..dst + bytes].copy_from_slice(src);
                }
            }
        }
    }

    /// Checks inputs against the declared dtypes and bounds, binds symbols and
    /// evaluates every shape.
    fn bind(&mut self, inputs: &[TensorView<'_>]) -> Result<()> {
        let plan = self.program.plan();
        if inputs.len() != plan.inputs.len() {
            return Err(Error::Shape(format!("expected {} inputs, got {}", plan.inputs.len(), inputs.len())));
        }
        let input_err =
            |index: usize, detail: String| Error::Input { index, name: plan.inputs[index].name.clone(), detail };
        // Pass 1: dtypes, ranks, and bind symbols from plain symbolic dims.
        self.bound.iter_mut().for_each(|b| *b = false);
        // A complex input is checked as the caller sees it (`Plan::io_type`):
        // its tensor's trailing dimension of 2 is static and not the caller's.
        for (i, (io, x)) in plan.inputs.iter().zip(inputs).enumerate() {
            let (dtype, dims) = plan.io_type(io);
            if x.dtype != dtype {
                return Err(input_err(i, format!("dtype is {}, expected {dtype}", x.dtype)));
            }
            if x.shape.len() != dims.len() {
                return Err(input_err(
                    i,
                    format!("rank is {} (shape {:?}), expected {}", x.shape.len(), x.shape, dims.len()),
                ));
            }
            let numel = x.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if numel.and_then(|n| n.checked_mul(x.dtype.size_bytes())) != Some(x.data.len()) {
                return Err(input_err(i, format!("{} data bytes do not match shape {:?}", x.data.len(), x.shape)));
            }
            if let Some(detail) = bool_byte_problem(x) {
                return Err(input_err(i, detail));
            }
            for (axis, (d, &actual)) in dims.iter().zip(x.shape).enumerate() {
                if let DimRef::Expr(e) = d {
                    if let DimExpr::Sym(s) = plan.exprs[*e as usize] {
                        let sym = &plan.symbols[s as usize];
                        let actual = actual as u64;
                        if actual < sym.min || actual > sym.max {
                            return Err(input_err(
                                i,
                                format!(
                                    "dimension {axis} is {actual}, outside the range [{}, {}] of `{}`",
                                    sym.min, sym.max, sym.name
                                ),
                            ));
                        }
                        self.sym_vals[s as usize] = actual;
                        self.bound[s as usize] = true;
                    }
                }
            }
        }
        // Pass 1b: symbols that only appear in derived dims (`2*s`, `s + 1`):
        // solve `k * s + c = actual`.
        for (i, (io, x)) in plan.inputs.iter().zip(inputs).enumerate() {
            for (axis, (d, &actual)) in plan.io_type(io).1.iter().zip(x.shape).enumerate() {
                let DimRef::Expr(e) = d else { continue };
                let Some((s, k, c)) = plan.affine_symbol(*e) else { continue };
                if self.bound[s as usize] {
                    continue; // pass 2 checks this dimension against the bound value
                }
                let sym = &plan.symbols[s as usize];
                let rest = actual as i128 - c;
                if rest < 0 || rest % k as i128 != 0 {
                    return Err(input_err(
                        i,
                        format!(
                            "dimension {axis} is {actual}, which is not {} for any value of `{}`",
                            self.program.dim_string(*d),
                            sym.name
                        ),
                    ));
                }
                let v = (rest / k as i128) as u64;
                if v < sym.min || v > sym.max {
                    return Err(input_err(
                        i,
                        format!(
                            "dimension {axis} is {actual} = {}, so `{}` = {v}, outside the range [{}, {}] of `{}`",
                            self.program.dim_string(*d),
                            sym.name,
                            sym.min,
                            sym.max,
                            sym.name
                        ),
                    ));
                }
                self.sym_vals[s as usize] = v;
                self.bound[s as usize] = true;
            }
        }
        if !self.evaluated || self.evaluated_for != self.sym_vals {
            self.evaluate_shapes()?;
        }
        // Pass 2: every input dimension must equal its declared value.
        let plan = self.program.plan();
        for (i, (io, x)) in plan.inputs.iter().zip(inputs).enumerate() {
            let t = io.tensor as usize;
            let expected = &self.shapes[self.shape_at[t]..self.shape_at[t] + plan.io_type(io).1.len()];
            if expected != x.shape {
                return Err(Error::Input {
                    index: i,
                    name: io.name.clone(),
                    detail: format!("shape is {:?}, expected {}", x.shape, self.describe_shape(io)),
                });
            }
        }
        Ok(())
    }

    /// The arena, on the first run: fallible, and lazily zeroed by the OS
    /// (an arena larger than what a run touches costs only address space).
    fn allocate_arena(&mut self) -> Result<()> {
        if self.arena.is_none() {
            let bytes = self.program.plan().arena_bytes;
            let arena = usize::try_from(bytes).ok().and_then(AlignedBuf::zeroed);
            self.arena = Some(arena.ok_or(Error::OutOfMemory { bytes })?);
            self.init_states();
        }
        Ok(())
    }

    /// Input `io`'s shape as the caller sees it, with its dims' names.
    fn describe_shape(&self, io: &crate::format::IoDecl) -> String {
        let p = &self.program;
        let dims: Vec<String> = p.plan().io_type(io).1.iter().map(|d| p.dim_string(*d)).collect();
        format!("[{}]", dims.join(", "))
    }

    fn evaluate_shapes(&mut self) -> Result<()> {
        let plan = self.program.plan();
        for (i, e) in plan.exprs.iter().enumerate() {
            let v = |j: u32| self.expr_vals[j as usize];
            self.expr_vals[i] = match *e {
                DimExpr::Const(c) => c,
                DimExpr::Sym(s) => self.sym_vals[s as usize],
                DimExpr::Add(a, b) => v(a).saturating_add(v(b)),
                DimExpr::Mul(a, b) => v(a).saturating_mul(v(b)),
                DimExpr::FloorDiv(a, b) => v(a).checked_div(v(b)).unwrap_or(0),
                DimExpr::Mod(a, b) => v(a).checked_rem(v(b)).unwrap_or(0),
                DimExpr::Sub(a, b) => v(a).saturating_sub(v(b)),
            };
        }
        for (t, decl) in plan.tensors.iter().enumerate() {
            let mut bytes = decl.dtype.size_bytes() as u64;
            for (k, d) in decl.shape.iter().enumerate() {
                let v = match d {
                    DimRef::Static(v) => *v,
                    DimRef::Expr(e) => self.expr_vals[*e as usize],
                };
                bytes = bytes.saturating_mul(v);
                self.shapes[self.shape_at[t] + k] = v as usize;
            }
            // Validation proved this for symbols within bounds; re-checked so a
            // planner bug can never turn into an out-of-bounds write.
            if let Storage::Arena { max_bytes, .. } = decl.storage {
                if bytes > max_bytes {
                    return Err(Error::Shape(format!(
                        "tensor {t} needs {bytes} bytes, more than its {max_bytes}-byte slot"
                    )));
                }
            }
        }
        self.evaluated_for.copy_from_slice(&self.sym_vals);
        self.evaluated = true;
        Ok(())
    }

    fn copy_inputs(&mut self, inputs: &[TensorView<'_>]) {
        let plan = self.program.plan();
        let Some(arena) = self.arena.as_mut() else { return };
        let arena = arena.as_mut_slice();
        for (io, x) in plan.inputs.iter().zip(inputs) {
            if let Storage::Arena { offset, .. } = plan.tensors[io.tensor as usize].storage {
                // In bounds: `bind` checked the length against the shape, and the
                // shape's size against the slot, which validation put inside the arena.
                arena[offset as usize..offset as usize + x.data.len()].copy_from_slice(x.data);
            }
        }
    }

    /// Runs every instruction. The run loop stops at each `BindDim` (which
    /// changes shapes the loop holds borrowed) and resumes after binding.
    /// A taken jump (a loop's exit or back edge) also returns here, to resume
    /// at its target: validation proved loops structured, and there is no trip
    /// limit (a loop whose condition stays true runs forever, as in torch).
    fn execute_all(&mut self) -> Result<()> {
        let mut start = 0;
        while let Some(stop) = self.execute(start)? {
            match stop {
                Stop::Bind(stop) => {
                    self.bind_data_dependent(stop)?;
                    start = stop.index + 1;
                }
                Stop::Jump(target) => start = target,
            }
        }
        Ok(())
    }

    /// Binds a data-dependent symbol to the value the run computed for it,
    /// within its bounds, and re-evaluates the shapes if it changed.
    fn bind_data_dependent(&mut self, stop: BindStop) -> Result<()> {
        let plan = self.program.plan();
        let sym = &plan.symbols[stop.symbol as usize];
        let instr = &plan.instrs[stop.index];
        if stop.value < 0 || (stop.value as u64) < sym.min || stop.value as u64 > sym.max {
            return Err(Error::DataDependent {
                index: stop.index,
                origin: instr.origin.clone(),
                detail: format!("`{}` = {} is outside its range [{}, {}]", sym.name, stop.value, sym.min, sym.max),
            });
        }
        self.sym_vals[stop.symbol as usize] = stop.value as u64;
        if self.evaluated_for != self.sym_vals {
            self.evaluate_shapes()?;
        }
        Ok(())
    }

    /// Runs instructions from `start` until the end (`None`), a `BindDim`,
    /// whose value it reads and returns, or a taken jump. Each instruction
    /// kind is handled here, once; calls go through the function pointer
    /// resolved at load.
    fn execute(&mut self, start: usize) -> Result<Option<Stop>> {
        let Session {
            program,
            arena,
            shapes,
            shape_at,
            cx,
            operand_buf,
            output_buf,
            result_buf,
            accel,
            profile,
            use_native,
            sym_vals,
            reached,
            ..
        } = self;
        let plan = program.plan();
        let resolved = program.resolved();
        let weights = program.weights();
        // `run` allocated the arena before the first instruction.
        let Some(arena) = arena.as_mut() else { return Err(Error::Shape("the session arena is not allocated".into())) };
        let arena = arena.as_mut_slice();
        let arena_ptr = arena.as_mut_ptr();
        let tensor_len = |t: usize| -> usize {
            shapes[shape_at[t]..shape_at[t + 1]].iter().product::<usize>() * plan.tensors[t].dtype.size_bytes()
        };
        let shape = |t: u32| &shapes[shape_at[t as usize]..shape_at[t as usize + 1]];
        let view = |t: u32| -> TensorRef<'_> {
            let decl = &plan.tensors[t as usize];
            let data: &[u8] = match decl.storage {
                // SAFETY: validation put `offset..offset+max_bytes` inside the arena and
                // `evaluate_shapes` checked the actual length against `max_bytes`; no
                // mutable slice overlapping it exists while this one is alive (outputs
                // never overlap operands, checked at load).
                Storage::Arena { offset, .. } => unsafe {
                    std::slice::from_raw_parts(arena_ptr.add(offset as usize), tensor_len(t as usize))
                },
                Storage::Weight { offset, bytes } => &weights[offset as usize..(offset + bytes) as usize],
            };
            TensorRef { dtype: decl.dtype, shape: shape(t), data }
        };
        let arena_slot = |t: u32| -> &mut [u8] {
            // Validation rejects instructions writing to weights; a weight here
            // would be a validator bug, answered with an empty slot.
            let Storage::Arena { offset, .. } = plan.tensors[t as usize].storage else { return &mut [] };
            // SAFETY: as for `view`; validation guarantees an instruction's
            // output ranges overlap neither each other nor its operands.
            unsafe { std::slice::from_raw_parts_mut(arena_ptr.add(offset as usize), tensor_len(t as usize)) }
        };
        // A run whose sizes fit a shape bucket runs it instead of the plan
        // (the bucket computes every output; it never binds or loops).
        if start == 0 {
            if let Some(b) = accel_bucket(accel, sym_vals) {
                let mut operands: Vec<TensorRef<'_>> = std::mem::take(operand_buf);
                operands.extend((0..).map_while(|k| bucket_tensor(accel, b, false, k)).map(view));
                let mut outputs: Vec<TensorMut<'_>> = std::mem::take(output_buf);
                outputs.extend((0..).map_while(|k| bucket_tensor(accel, b, true, k)).map(|t| TensorMut {
                    dtype: plan.tensors[t as usize].dtype,
                    shape: shape(t),
                    data: arena_slot(t),
                }));
                let result = run_bucket(accel, b, sym_vals, &operands, &mut outputs);
                *operand_buf = recycle(operands);
                *output_buf = recycle(outputs);
                return result.map(|()| None);
            }
        }
        for (index, (step, instr)) in resolved.steps.iter().zip(&plan.instrs).enumerate().skip(start) {
            let started = profile.is_some().then(std::time::Instant::now);
            *reached = index.max(*reached);
            match step {
                Step::InPlace { run, at } => {
                    let InstrOp::Call(kernel) = &instr.op else {
                        return Err(Error::Plan(format!("instruction {index} is not the call it resolved to")));
                    };
                    let out_tensor = instr.outputs[0];
                    let mut operands: Vec<TensorRef<'_>> = std::mem::take(operand_buf);
                    // Operand `at` is the output, which holds its data: only
                    // its dtype and shape are passed (never a second view).
                    operands.extend(instr.inputs.iter().enumerate().map(|(k, &t)| {
                        if k == *at {
                            TensorRef { dtype: plan.tensors[t as usize].dtype, shape: shape(t), data: &[] }
                        } else {
                            view(t)
                        }
                    }));
                    let output = TensorMut {
                        dtype: plan.tensors[out_tensor as usize].dtype,
                        shape: shape(out_tensor),
                        data: arena_slot(out_tensor),
                    };
                    let result = run(kernel, *at, cx, &operands, output);
                    *operand_buf = recycle(operands);
                    result.map_err(|source| Error::Kernel { index, origin: instr.origin.clone(), source })?;
                }
                Step::Call { run, ints, packed } => {
                    let InstrOp::Call(kernel) = &instr.op else {
                        return Err(Error::Plan(format!("instruction {index} is not the call it resolved to")));
                    };
                    let mut operands: Vec<TensorRef<'_>> = std::mem::take(operand_buf);
                    operands.extend(instr.inputs.iter().map(|&t| view(t)));
                    let mut outputs: Vec<TensorMut<'_>> = std::mem::take(output_buf);
                    outputs.extend(instr.outputs.iter().map(|&t| TensorMut {
                        dtype: plan.tensors[t as usize].dtype,
                        shape: shape(t),
                        data: arena_slot(t),
                    }));
                    let result = match packed {
                        Some(p) => run_packed(
                            &resolved.packed[*p],
                            kernel,
                            &resolved.ints[ints.clone()],
                            cx,
                            &operands,
                            &mut outputs,
                        ),
                        None => run(kernel, &resolved.ints[ints.clone()], cx, &operands, &mut outputs),
                    };
                    *operand_buf = recycle(operands);
                    *output_buf = recycle(outputs);
                    result.map_err(|source| Error::Kernel { index, origin: instr.origin.clone(), source })?;
                }
                Step::Delegate { segment } => {
                    let mut operands: Vec<TensorRef<'_>> = std::mem::take(operand_buf);
                    operands.extend(instr.inputs.iter().map(|&t| view(t)));
                    let mut results: Vec<&mut [u8]> = std::mem::take(result_buf);
                    results.extend(instr.outputs.iter().map(|&t| arena_slot(t)));
                    let result = run_accel(accel, *segment, &operands, &mut results);
                    *operand_buf = recycle(operands);
                    *result_buf = recycle(results);
                    result.map_err(|e| match e {
                        Error::Pjrt { call, message } => {
                            Error::Pjrt { call, message: format!("instruction {index} ({}): {message}", instr.origin) }
                        }
                        // An index check: the op's origin, this instruction.
                        Error::Kernel { origin, source, .. } => Error::Kernel { index, origin, source },
                        other => other,
                    })?;
                }
                Step::BindDim { symbol } => {
                    // Validated: one 0-d i64 operand.
                    let count = view(instr.inputs[0]);
                    let value = count
                        .data
                        .get(..8)
                        .map_or(0, |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
                    record(profile, index, started);
                    return Ok(Some(Stop::Bind(BindStop { index, symbol: *symbol, value })));
                }
                Step::JumpIfFalse { target } => {
                    // Validated: one 1-element bool operand.
                    let go_on = view(instr.inputs[0]).data.first().is_some_and(|&b| b != 0);
                    if !go_on {
                        record(profile, index, started);
                        return Ok(Some(Stop::Jump(*target as usize)));
                    }
                }
                Step::Jump { target } => {
                    record(profile, index, started);
                    return Ok(Some(Stop::Jump(*target as usize)));
                }
                Step::Native { function } => {
                    let (InstrOp::Native { program: fused, .. }, Some(section)) = (&instr.op, program.native_section())
                    else {
                        return Err(Error::Plan(format!("instruction {index} is not the native call it resolved to")));
                    };
                    // Mapped when the session was created (`use_native`).
                    let code = if *use_native { program.native_code().ok().flatten() } else { None };
                    let mut operands: Vec<TensorRef<'_>> = std::mem::take(operand_buf);
                    operands.extend(instr.inputs.iter().map(|&t| view(t)));
                    let t = instr.outputs[0];
                    let mut out =
                        TensorMut { dtype: plan.tensors[t as usize].dtype, shape: shape(t), data: arena_slot(t) };
                    let result = crate::native::run_native(code, section, *function, fused, cx, &operands, &mut out);
                    *operand_buf = recycle(operands);
                    result.map_err(|source| Error::Kernel { index, origin: instr.origin.clone(), source })?;
                }
                Step::NativeKernel { function, run, ints } => {
                    let (InstrOp::NativeKernel { fallback, prologue, epilogue, .. }, Some(section)) =
                        (&instr.op, program.native_section())
                    else {
                        return Err(Error::Plan(format!(
                            "instruction {index} is not the native kernel it resolved to"
                        )));
                    };
                    let code = if *use_native { program.native_code().ok().flatten() } else { None };
                    let mut operands: Vec<TensorRef<'_>> = std::mem::take(operand_buf);
                    operands.extend(instr.inputs.iter().map(|&t| view(t)));
                    let t = instr.outputs[0];
                    let mut out =
                        TensorMut { dtype: plan.tensors[t as usize].dtype, shape: shape(t), data: arena_slot(t) };
                    // Validated: a prologue's result is output 1, apart from
                    // output 0 and every operand.
                    let mut x = match (prologue, instr.outputs.get(1)) {
                        (Some(p), Some(&t)) => Some((
                            p,
                            TensorMut { dtype: plan.tensors[t as usize].dtype, shape: shape(t), data: arena_slot(t) },
                        )),
                        _ => None,
                    };
                    // Validated: an epilogue's result is the last output,
                    // apart from the others and every operand.
                    let mut z = match (epilogue, instr.outputs.last()) {
                        (Some(p), Some(&t)) => Some((
                            p,
                            TensorMut { dtype: plan.tensors[t as usize].dtype, shape: shape(t), data: arena_slot(t) },
                        )),
                        _ => None,
                    };
                    let ints = &resolved.ints[ints.clone()];
                    let run_fallback = move |cx: &mut Context, ins: &[TensorRef<'_>], out: &mut TensorMut<'_>| {
                        run(fallback, ints, cx, ins, std::slice::from_mut(out))
                    };
                    let result = crate::native::run_native_kernel(
                        code,
                        section,
                        *function,
                        cx,
                        &operands,
                        &mut out,
                        x.as_mut().map(|(p, x)| (*p, x)),
                        z.as_mut().map(|(p, z)| (*p, z)),
                        (fallback, run_fallback),
                    );
                    *operand_buf = recycle(operands);
                    result.map_err(|source| Error::Kernel { index, origin: instr.origin.clone(), source })?;
                }
            }
            record(profile, index, started);
        }
        Ok(None)
    }

    fn output_view(&self, i: usize) -> TensorView<'_> {
        let plan = self.program.plan();
        let io = &plan.outputs[i];
        let t = io.tensor as usize;
        let decl = &plan.tensors[t];
        // A complex output drops its parts' trailing 2 (`Plan::io_type`).
        let (dtype, dims) = plan.io_type(io);
        let shape = &self.shapes[self.shape_at[t]..self.shape_at[t] + dims.len()];
        let len = shape.iter().product::<usize>() * dtype.size_bytes();
        let data = match decl.storage {
            Storage::Arena { offset, .. } => match &self.arena {
                Some(arena) => &arena.as_slice()[offset as usize..offset as usize + len],
                None => &[],
            },
            Storage::Weight { offset, bytes } => &self.program.weights()[offset as usize..(offset + bytes) as usize],
        };
        TensorRef { dtype, shape, data }
    }
}

/// The bytes of weight tensor `t` of `program` (validated to be one).
fn weight_bytes(program: &Program, t: u32) -> &[u8] {
    match program.plan().tensors[t as usize].storage {
        Storage::Weight { offset, bytes } => &program.weights()[offset as usize..(offset + bytes) as usize],
        Storage::Arena { .. } => &[],
    }
}

fn find_state_or_err<'p>(plan: &'p crate::format::Plan, name: &str) -> Result<(usize, &'p crate::format::StateDecl)> {
    crate::validate::find_state(plan, name).ok_or_else(|| {
        let names: Vec<&str> = plan.states.iter().map(|s| s.name.as_str()).collect();
        Error::State { name: name.to_string(), detail: format!("no such state (the program has {names:?})") }
    })
}

/// Why the run loop stopped before the end.
enum Stop {
    Bind(BindStop),
    /// A taken jump: continue at this instruction.
    Jump(usize),
}

/// Where the run loop stopped to bind a data-dependent symbol.
#[derive(Clone, Copy)]
struct BindStop {
    index: usize,
    symbol: u32,
    value: i64,
}

/// For a bool tensor (a run's input or a state's new value) holding a byte
/// other than 0 or 1, what is wrong. A bool is the byte 0 or 1 (what torch
/// and numpy hold): kernels that compare bytes and native code that tests
/// `!= 0` would read any other byte differently.
fn bool_byte_problem(t: &TensorView<'_>) -> Option<String> {
    if t.dtype != DType::Bool {
        return None;
    }
    let k = t.data.iter().position(|&b| b > 1)?;
    Some(format!("bool element {k} is the byte {}, not 0 or 1", t.data[k]))
}

/// One instruction's profile: its time summed over the runs that executed
/// it, and its fastest single execution. On a machine shared with other
/// jobs the sum takes every preemption in; the minimum is the instruction's
/// own cost (what per-layer comparisons need).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct InstrTime {
    pub total: std::time::Duration,
    /// Zero until the instruction has run.
    pub min: std::time::Duration,
    /// How many executions `total` sums.
    pub runs: u32,
}

/// Adds the time since `started` to instruction `index`'s profile entry.
fn record(profile: &mut Option<Vec<InstrTime>>, index: usize, started: Option<std::time::Instant>) {
    if let (Some(p), Some(t)) = (profile.as_mut(), started) {
        let (e, dt) = (&mut p[index], t.elapsed());
        e.min = if e.runs == 0 { dt } else { e.min.min(dt) };
        e.total += dt;
        e.runs += 1;
    }
}

/// Returns an emptied vector with its capacity, detached from the arena's
/// lifetime so the session can keep it for the next instruction.
fn recycle<T: Detach>(mut v: Vec<T>) -> Vec<T::Static> {
    v.clear();
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: the vector is empty, so no reference with the shorter lifetime
    // survives; only the allocation is reused. `T` and `T::Static` differ only
    // in lifetimes, so their layouts (and the allocation's) are identical.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T::Static>(), 0, v.capacity()) }
}

/// A borrowed type and its `'static` twin (same layout).
trait Detach {
    type Static;
}
impl Detach for TensorRef<'_> {
    type Static = TensorRef<'static>;
}
impl Detach for TensorMut<'_> {
    type Static = TensorMut<'static>;
}
impl Detach for &mut [u8] {
    type Static = &'static mut [u8];
}

/// The outputs of one run, borrowed from the session.
pub struct Outputs<'s> {
    session: &'s Session,
}

impl<'s> Outputs<'s> {
    pub fn len(&self) -> usize {
        self.session.program.plan().outputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Output `i` (panics if `i >= len()`, like slice indexing).
    pub fn get(&self, i: usize) -> TensorView<'s> {
        self.session.output_view(i)
    }

    pub fn name(&self, i: usize) -> &'s str {
        &self.session.program.plan().outputs[i].name
    }

    pub fn iter(&self) -> impl Iterator<Item = TensorView<'s>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Copies every output out of the session.
    pub fn to_tensors(&self) -> Vec<Tensor> {
        self.iter().map(|t| Tensor { dtype: t.dtype, shape: t.shape.to_vec(), data: t.data.to_vec() }).collect()
    }
}

impl std::fmt::Debug for Outputs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries((0..self.len()).map(|i| (self.name(i), self.get(i).dtype, self.get(i).shape))).finish()
    }
}
