//! The kernels' thread pools: one pool per thread count, built on first use
//! and shared by every context (and so every session) of the process, so a
//! run never spawns a thread.
//!
//! The pool is our own and small: `count - 1` worker threads plus the
//! calling thread share out the items `0..n` of one job at a time. Each
//! thread owns an even, contiguous share of the items (the caller the first,
//! worker `t` the `t`-th) and takes its own from the front; a thread whose
//! share is done takes the others' from the back. So whenever every thread
//! runs, the same thread gets the same part of each job: consecutive
//! operations cut the same tensor the same way (rows of a GEMM, of a layer
//! norm, of an elementwise op), and each thread finds in its own cache what
//! it wrote. With one shared counter, which thread took which part was
//! chance, and half of every tensor came from the other core's cache: on the
//! dev VM a 128 KiB read of data the other core wrote ran at ~25 GB/s, of
//! data the reader wrote at ~110 GB/s, and BERT's small operations (a few
//! µs each) got slower at two threads than at one.
//! The caller never waits for a worker that has not started:
//! once it runs out of items it closes the job, and waits only for workers
//! that joined (took the job before it closed). On a loaded machine a woken
//! worker can take milliseconds to get a core, and waiting for it merely to
//! report "nothing left" stalled every job that the caller had finished.
//! Unlike rayon (tried first), handing out a job allocates nothing —
//! rayon's injector queue allocates a block every 63 jobs, which broke "a
//! steady-state run allocates nothing" — and there is no work stealing to
//! pay for: every split here is static. Jobs from several sessions on one
//! pool take turns.
//!
//! **Spin or park.** A worker that parks after every job costs a wake-up
//! (two context switches, tens of µs on a VM) per parallel instruction:
//! ~60 per BERT run. Spinning instead holds a core, which on an
//! oversubscribed machine is the core the submitting thread needs (an
//! unconditional 50 µs spin was 2–3× slower there). So spinning is scoped
//! and watched:
//! - *Run-scoped*: workers spin only while some run holds the pool hot
//!   ([`Threads::hot`]; `Session::run` does for each run unless the session
//!   opted out), for at most [`SPIN_LIMIT`] per wait, and park as soon as no
//!   run is hot — never between runs.
//! - *Backs off under contention*: any of three signs that more threads want
//!   the cores than there are calms the pool (nobody spins) for [`CALM`],
//!   doubling up to [`CALM_MAX`] while the signs recur: a spinning thread
//!   whose clock reads jump by [`PREEMPTED`] (it lost its core), a spinning
//!   worker that did not join a job the submitter then ran alone (it had no
//!   core), and a run whose thread was involuntarily switched
//!   (`getrusage(RUSAGE_THREAD)` on Linux, read when the hot guard drops).
//!
//! The job hand-off is lock-free (one atomic word: generation, open bit,
//! joined count); the mutex and condvars serve only threads that park and
//! whoever must wake them, so a hot pool makes no system call per job.
//!
//! Work is always split so that no element's arithmetic depends on how many
//! threads run it: kernels hand out whole output tiles, rows or fixed-size
//! chunks (whose size never depends on the thread count). A reduction is
//! cut only where the cut depends on the shapes alone and the pieces are
//! combined in a fixed order (the channels-last mean's parts of pixels,
//! `reduce.rs`). Where a cut does follow the thread count (to keep every
//! thread busy when the rows or blocks do not divide evenly: GEMM column
//! groups and runs of tiles, runs of pixels of depthwise rows), it falls
//! between elements whose operations do not depend on it. Results are
//! therefore bit-identical for any thread count.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The most threads a context may ask for (a sanity bound on user input).
pub const MAX_THREADS: usize = 256;

/// The most items one job of the pool hands out (a larger job runs on the
/// calling thread).
const MAX_ITEMS: usize = u32::MAX as usize;

/// Elements per chunk of the elementwise kernels: a multiple of every
/// vector width, and fixed, so a chunk's vector/tail split (and with it
/// every result) is the same whatever the thread count.
pub(crate) const ELEMENT_CHUNK: usize = 16 * 1024;

/// A handle on the pool a context's kernels split their work over. `Copy`:
/// the pools themselves live for the whole process.
#[derive(Copy, Clone)]
pub struct Threads {
    /// None runs everything on the calling thread.
    pool: Option<&'static Pool>,
    count: usize,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Threads({})", self.count)
    }
}

impl Default for Threads {
    fn default() -> Threads {
        Threads::single()
    }
}

thread_local! {
    /// On a pool's worker thread: its index (1..count). On a thread running
    /// a job's items (worker or caller): `IN_JOB` is set, and a nested
    /// parallel call runs serially instead of waiting on its own pool.
    static WORKER_INDEX: Cell<usize> = const { Cell::new(0) };
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

impl Threads {
    /// Everything on the calling thread.
    pub const fn single() -> Threads {
        Threads { pool: None, count: 1 }
    }

    /// The process-wide pool of `count` threads (1 and 0 mean the calling
    /// thread only; above [`MAX_THREADS`] is clamped). Built once per count;
    /// if the OS refuses to start the threads, the work runs on the caller.
    pub fn new(count: usize) -> Threads {
        let count = count.clamp(1, MAX_THREADS);
        if count == 1 {
            return Threads::single();
        }
        static POOLS: OnceLock<Mutex<HashMap<usize, Option<&'static Pool>>>> = OnceLock::new();
        let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
        // A poisoned map still holds valid pools: a panic cannot leave one half-inserted.
        let mut pools = pools.lock().unwrap_or_else(|e| e.into_inner());
        let pool = *pools.entry(count).or_insert_with(|| Pool::start(count));
        match pool {
            Some(pool) => Threads { pool: Some(pool), count },
            None => Threads::single(),
        }
    }

    /// How many threads the work is split over.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The index of the calling thread within the running job, in
    /// `0..count()`: the job's caller is 0, each worker its own number, so
    /// per-thread buffers indexed by it are never shared.
    pub(crate) fn index(&self) -> usize {
        match self.pool {
            Some(_) => WORKER_INDEX.with(Cell::get).min(self.count - 1),
            None => 0,
        }
    }

    /// Makes the pool hot until the guard drops: between the jobs of a
    /// run, its workers spin for the next one instead of parking (see
    /// [`Pool`]'s spinning). A session holds one for each run; nothing
    /// spins while no run holds one.
    pub fn hot(&self) -> HotRun {
        if let Some(pool) = self.pool {
            pool.hot.fetch_add(1, Ordering::Relaxed);
        }
        HotRun {
            pool: self.pool,
            preempted_before: self.pool.and_then(|_| involuntary_switches()),
            not_send: PhantomData,
        }
    }

    /// `f(i)` for every `i` in `0..n`, over the pool.
    pub(crate) fn for_each(&self, n: usize, f: impl Fn(usize) + Send + Sync) {
        match self.pool {
            // Items are numbered in 32 bits (see `Share`); no kernel cuts
            // its work into more than a few thousand.
            Some(pool) if n > 1 && n <= MAX_ITEMS && !IN_JOB.with(Cell::get) => pool.run(n, &f),
            _ => (0..n).for_each(f),
        }
    }

    /// `f(start, end)` over `0..total` cut into [`ELEMENT_CHUNK`]-sized
    /// ranges (the last shorter), over the pool: for elementwise code outside
    /// this crate (the runtime's native calls). The cut never depends on the
    /// thread count, so neither does any result.
    pub fn for_each_element_range(&self, total: usize, f: impl Fn(usize, usize) + Send + Sync) {
        self.for_each(total.div_ceil(ELEMENT_CHUNK), |i| {
            let start = i * ELEMENT_CHUNK;
            f(start, (start + ELEMENT_CHUNK).min(total))
        });
    }

    /// `f(start, end)` over row ranges of `0..rows` holding about
    /// [`ELEMENT_CHUNK`] elements each (rows of `row` elements; at least one
    /// row a range), over the pool: for row-wise code outside this crate
    /// (the runtime's native row functions). Each row is computed by one
    /// call, so no result depends on the cut or the thread count.
    pub fn for_each_row_range(&self, rows: usize, row: usize, f: impl Fn(usize, usize) + Send + Sync) {
        let per = (ELEMENT_CHUNK / row.max(1)).max(1);
        self.for_each(rows.div_ceil(per), |i| {
            let start = i * per;
            f(start, (start + per).min(rows))
        });
    }

    /// `f(i, chunk)` for every `chunk`-sized piece of `data` (the last may be
    /// shorter), over the pool.
    pub(crate) fn for_each_chunk<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Send + Sync,
    ) {
        let chunk = chunk.max(1);
        let (len, base) = (data.len(), SharedMut(data.as_mut_ptr()));
        self.for_each(len.div_ceil(chunk), |i| {
            let start = i * chunk;
            // SAFETY: the chunks `start..start + chunk` (clipped to `len`) of
            // distinct `i` are disjoint parts of `data`, which stays borrowed
            // mutably until `for_each` returns.
            let part = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(start), chunk.min(len - start)) };
            f(i, part)
        });
    }

    /// `f(x_rows, out_rows)` over groups of whole rows of `row` elements of
    /// `x` and `out` (row-wise kernels: softmax, norms). A group holds about
    /// [`ELEMENT_CHUNK`] elements; each row is computed by one thread.
    pub(crate) fn for_each_rows<T: Sync, U: Send>(
        &self,
        x: &[T],
        out: &mut [U],
        row: usize,
        f: impl Fn(&[T], &mut [U]) + Send + Sync,
    ) {
        let row = row.max(1);
        let per = (ELEMENT_CHUNK / row).max(1) * row;
        self.for_each_chunk(out, per, |i, o| f(&x[i * per..][..o.len()], o));
    }
}

/// One pool: its workers wait for a job, run items until none are left,
/// and report back.
///
/// The job hand-off is lock-free: `ctl` packs the job's generation, whether
/// it is still open, and how many workers joined it and still run its items,
/// so joining, closing and leaving are one atomic operation each. The mutex
/// and condvars are touched only by threads that park (and by whoever must
/// wake them), which is what a hot pool avoids.
struct Pool {
    /// Held by the thread submitting a job, for the job's duration.
    submit: Mutex<()>,
    /// `generation << GEN_SHIFT | OPEN? | active workers`.
    ctl: AtomicU64,
    /// The current job; written before `ctl` opens it, read by a worker only
    /// after it joined (so it cannot change under the worker).
    job: UnsafeCell<Job>,
    /// Each thread's share of the current job's items (see [`Share`]).
    shares: Box<[Share]>,
    /// Whether an item of the current job panicked.
    panicked: AtomicBool,
    /// Workers parked (or about to park) on `work`.
    sleepers: AtomicUsize,
    /// Worker threads that started (`count - 1`, unless the OS refused some).
    workers: AtomicUsize,
    /// Workers that joined the current job.
    joined: AtomicUsize,
    /// Workers that have started running their loop.
    ready: AtomicUsize,
    /// Whether the submitter parked (or is about to) on `done`.
    submitter_parked: AtomicBool,
    /// Guards nothing but the parking itself.
    park: Mutex<()>,
    /// Signals parked workers that a job was opened.
    work: Condvar,
    /// Signals a parked submitter that its job's last worker left.
    done: Condvar,
    /// Runs in progress that asked for a hot pool ([`Threads::hot`]).
    hot: AtomicUsize,
    /// Until when (ns since `origin`) nobody spins: set when a spinning
    /// thread finds it was preempted, i.e. the cores are oversubscribed.
    calm_until: AtomicU64,
    /// The last calm period (ns): doubled when contention is found again
    /// soon after it ended (a machine that stays loaded), up to [`CALM_MAX`].
    calm_len: AtomicU64,

    origin: Instant,
}

// SAFETY: `job` is written only by the submitter holding `submit` while no
// worker is joined, and read only by joined workers (see `Pool::run`).
unsafe impl Sync for Pool {}

const OPEN: u64 = 1 << 32;
const GEN_SHIFT: u32 = 33;
const ACTIVE: u64 = OPEN - 1;

/// The longest a thread spins for the next job (or, submitting, for its
/// last joined worker) before it parks, while the pool is hot: bounds what
/// a long serial stretch of a run costs.
const SPIN_LIMIT: Duration = Duration::from_millis(1);
/// A gap this long between two clock reads of a spinning thread means it
/// lost its core: another thread wanted it.
const PREEMPTED: Duration = Duration::from_micros(50);
/// How long nobody spins on a pool after a spinning thread was preempted
/// (first time; see `calm_len`).
const CALM: Duration = Duration::from_millis(20);
const CALM_MAX: Duration = Duration::from_secs(2);
/// The longest a parked submitter sleeps before it looks again whether its
/// workers left, and an idle worker whether a job opened (see the waits).
const PARK_BACKSTOP: Duration = Duration::from_millis(1);
const IDLE_BACKSTOP: Duration = Duration::from_millis(100);
/// Spin-loop hints between clock reads (~1–2 µs).
const SPINS_PER_CHECK: u32 = 64;

/// One thread's share of a job's items: the range `first..end`, packed
/// `first << 32 | end` in one word so that its owner (taking from the
/// front) and other threads (from the back) never take the same item. On a
/// cache line of its own: the owner updates it once an item.
#[repr(align(64))]
struct Share(AtomicU64);

impl Share {
    /// Items `first..end` (at most [`MAX_ITEMS`]).
    fn set(&self, first: u64, end: u64) {
        self.0.store(first << 32 | end, Ordering::Relaxed);
    }

    /// The first item left, if any (the owner's end).
    fn take_first(&self) -> Option<usize> {
        self.take(true)
    }

    /// The last item left, if any (other threads' end).
    fn take_last(&self) -> Option<usize> {
        self.take(false)
    }

    /// Takes the first or the last item left and removes it from the range
    /// (Relaxed: the job itself is published and collected through `ctl`).
    fn take(&self, first_end: bool) -> Option<usize> {
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let (first, end) = (word >> 32, word & u64::from(u32::MAX));
            if first >= end {
                return None;
            }
            let (item, next) = if first_end { (first, word + (1 << 32)) } else { (end - 1, word - 1) };
            match self.0.compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(item as usize),
                Err(now) => word = now,
            }
        }
    }
}

/// A job's items: `run(i)` for each item its threads' [`Share`]s hand out.
/// The reference's lifetime is erased; [`Pool::run`] does not return before
/// every worker is done with it.
#[derive(Copy, Clone)]
struct Job {
    run: *const (dyn Fn(usize) + Sync + 'static),
}

// SAFETY: the pointee is `Sync` and outlives every use (see `Job`).
unsafe impl Send for Job {}

fn noop(_: usize) {}

impl Pool {
    /// A pool of `count - 1` workers plus the submitting thread; None if no
    /// worker thread could be started.
    fn start(count: usize) -> Option<&'static Pool> {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            submit: Mutex::new(()),
            ctl: AtomicU64::new(0),
            job: UnsafeCell::new(Job { run: &noop as &(dyn Fn(usize) + Sync) }),
            shares: (0..count).map(|_| Share(AtomicU64::new(0))).collect(),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            submitter_parked: AtomicBool::new(false),
            park: Mutex::new(()),
            work: Condvar::new(),
            done: Condvar::new(),
            hot: AtomicUsize::new(0),
            calm_until: AtomicU64::new(0),
            calm_len: AtomicU64::new(0),
            origin: Instant::now(),
            workers: AtomicUsize::new(0),
            joined: AtomicUsize::new(0),
            ready: AtomicUsize::new(0),
        }));
        let mut started = 0;
        for index in 1..count {
            let spawned =
                std::thread::Builder::new().name(format!("kiln-{count}-{index}")).spawn(move || pool.work_loop(index));
            if spawned.is_ok() {
                started += 1;
            }
        }
        // Counted as they start: a worker that never started must not look
        // like one that never gets a core.
        pool.workers.store(started, Ordering::Relaxed);
        // Wait until every worker runs its loop: the thread's start-up
        // (the OS thread, std's per-thread setup) then happens here, once,
        // not during some later run that promised to allocate nothing.
        while pool.ready.load(Ordering::Acquire) < started {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        (started > 0).then_some(pool)
    }

    fn lock_park(&self) -> MutexGuard<'_, ()> {
        // Guards no data: a poisoned lock is as good as a clean one.
        self.park.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f(i)` for `i < n` on the workers and the calling thread.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let _turn = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: only the lifetime is erased; this function closes the job
        // and waits below until no worker that joined it holds it any more.
        let run: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        let job = Job { run };
        // SAFETY: the previous job is closed and no worker is joined (its
        // `run` waited for that), and we hold `submit`.
        unsafe { *self.job.get() = job };
        // Even, contiguous shares: thread t owns items t·n/count..(t+1)·n/count.
        let (items, count) = (n as u64, self.shares.len() as u64);
        for (t, share) in (0..).zip(self.shares.iter()) {
            share.set(t * items / count, (t + 1) * items / count);
        }
        self.panicked.store(false, Ordering::Relaxed);
        self.joined.store(0, Ordering::Relaxed);
        let hot = self.is_hot();
        // Wraps after 2^31 jobs; a worker then at worst skips one job.
        let generation = ((self.ctl.load(Ordering::Relaxed) >> GEN_SHIFT) + 1) & (u64::MAX >> GEN_SHIFT);
        // SeqCst: paired with a parking worker's `sleepers` increment, so
        // either it sees the job or we see it and wake it.
        self.ctl.store(generation << GEN_SHIFT | OPEN, Ordering::SeqCst);
        let sleepers = self.sleepers.load(Ordering::SeqCst);
        if sleepers > 0 {
            drop(self.lock_park());
            self.work.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| self.run_items(job, 0)));
        // Closed: workers that did not join yet skip it; wait only for those inside.
        let active = self.ctl.fetch_and(!OPEN, Ordering::AcqRel) & ACTIVE;
        // A worker that was spinning (not parked) when the job opened and
        // did not join it while we ran every item was not on a core.
        let spinning = self.workers.load(Ordering::Relaxed).saturating_sub(sleepers);
        if hot && n > spinning && self.joined.load(Ordering::Relaxed) < spinning {
            self.calm(Instant::now());
        }
        if active > 0 {
            self.wait_for_workers();
        }
        let panicked = self.panicked.load(Ordering::Relaxed);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        assert!(!panicked, "a kernel thread panicked");
    }

    /// Waits until no joined worker runs the closed job: spinning while the
    /// pool is hot (a joined worker is running an item), then parked.
    fn wait_for_workers(&self) {
        let all_left = || self.ctl.load(Ordering::Acquire) & ACTIVE == 0;
        if self.spin_until(all_left) {
            return;
        }
        let mut guard = self.lock_park();
        self.submitter_parked.store(true, Ordering::SeqCst);
        while self.ctl.load(Ordering::SeqCst) & ACTIVE != 0 {
            // Timed: a backstop against a lost wake-up (seen under qemu's
            // aarch64 emulation, ~1 run in 20 of the kernels' tests, cause
            // not found), which then costs a millisecond instead of a hang.
            guard = self.done.wait_timeout(guard, PARK_BACKSTOP).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.submitter_parked.store(false, Ordering::Relaxed);
    }

    /// Takes items of `job` until none are left: thread `me`'s own share
    /// first, in order, then the others' from their ends.
    fn run_items(&self, job: Job, me: usize) {
        let _in_job = InJob::enter();
        // SAFETY: the job outlives this call (see `Job`).
        let f = unsafe { &*job.run };
        let count = self.shares.len();
        while let Some(i) = self.shares[me % count].take_first() {
            f(i);
        }
        for other in 1..count {
            let share = &self.shares[(me + other) % count];
            while let Some(i) = share.take_last() {
                f(i);
            }
        }
    }

    /// Joins the open job if it is newer than generation `seen`: its
    /// generation on success.
    fn try_join(&self, seen: u64) -> Option<u64> {
        // SeqCst: paired with the submitter's store (see `next_job`).
        let mut ctl = self.ctl.load(Ordering::SeqCst);
        loop {
            if ctl & OPEN == 0 || ctl >> GEN_SHIFT == seen {
                return None;
            }
            match self.ctl.compare_exchange_weak(ctl, ctl + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.joined.fetch_add(1, Ordering::Relaxed);
                    return Some(ctl >> GEN_SHIFT);
                }
                Err(now) => ctl = now,
            }
        }
    }

    fn work_loop(&self, index: usize) {
        WORKER_INDEX.with(|c| c.set(index));
        self.ready.fetch_add(1, Ordering::Release);
        let mut seen = 0;
        loop {
            seen = self.next_job(seen);
            // SAFETY: joined, so the job stays as it is until we leave.
            let job = unsafe { *self.job.get() };
            if catch_unwind(AssertUnwindSafe(|| self.run_items(job, index))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            // SeqCst: paired with the submitter's `submitter_parked` store.
            let left = self.ctl.fetch_sub(1, Ordering::SeqCst);
            if left & ACTIVE == 1 && left & OPEN == 0 && self.submitter_parked.load(Ordering::SeqCst) {
                drop(self.lock_park());
                self.done.notify_all();
            }
        }
    }

    /// Joins the next job after generation `seen` (returning its
    /// generation): spinning for it while the pool is hot, else parked.
    fn next_job(&self, seen: u64) -> u64 {
        loop {
            let mut joined = None;
            if self.spin_until(|| {
                joined = self.try_join(seen);
                joined.is_some()
            }) {
                return joined.unwrap_or(seen);
            }
            let mut guard = self.lock_park();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            loop {
                if let Some(generation) = self.try_join(seen) {
                    self.sleepers.fetch_sub(1, Ordering::Relaxed);
                    return generation;
                }
                // Timed for the same reason as the submitter's wait; an idle
                // worker then looks for a job ten times a second.
                guard = self.work.wait_timeout(guard, IDLE_BACKSTOP).unwrap_or_else(|e| e.into_inner()).0;
                // A run may have made the pool hot: spin again rather than
                // park for the next job.
                if self.is_hot() {
                    break;
                }
            }
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether some run in progress asked for spinning and no spinning
    /// thread was preempted lately.
    fn is_hot(&self) -> bool {
        self.hot.load(Ordering::Relaxed) > 0
            && self.origin.elapsed().as_nanos() as u64 >= self.calm_until.load(Ordering::Relaxed)
    }

    /// Stops all spinning on this pool for a while: some thread found the
    /// cores oversubscribed. Found again during a calm period, the period
    /// is extended; within a period of its end, the next one is twice as
    /// long (up to [`CALM_MAX`]); later, it starts over at [`CALM`].
    fn calm(&self, now: Instant) {
        let now = now.duration_since(self.origin).as_nanos() as u64;
        let (until, len) = (self.calm_until.load(Ordering::Relaxed), self.calm_len.load(Ordering::Relaxed));
        if now < until {
            // Still loaded: stay calm a full period from now.
            self.calm_until.fetch_max(now + len, Ordering::Relaxed);
            return;
        }
        let len = if now - until < len { (2 * len).min(CALM_MAX.as_nanos() as u64) } else { CALM.as_nanos() as u64 };
        self.calm_len.store(len, Ordering::Relaxed);
        self.calm_until.store(now + len, Ordering::Relaxed);
    }

    /// Spins until `done()` while the pool is hot, for at most
    /// [`SPIN_LIMIT`]: whether `done()` became true. A thread that finds it was
    /// preempted while spinning calms the pool (nobody spins for a while):
    /// the cores are wanted by other threads, which spinning would only
    /// slow down.
    fn spin_until(&self, mut done: impl FnMut() -> bool) -> bool {
        if done() {
            return true;
        }
        if !self.is_hot() {
            return false;
        }
        let start = Instant::now();
        let mut last = start;
        loop {
            for _ in 0..SPINS_PER_CHECK {
                std::hint::spin_loop();
                if done() {
                    return true;
                }
            }
            let now = Instant::now();
            if now - last >= PREEMPTED {
                self.calm(now);
                return false;
            }
            if now - start >= SPIN_LIMIT || self.hot.load(Ordering::Relaxed) == 0 {
                return false;
            }
            last = now;
        }
    }
}

/// A run in progress that keeps its pool hot ([`Threads::hot`]).
#[must_use = "the pool is hot only while the guard lives"]
pub struct HotRun {
    pool: Option<&'static Pool>,
    /// The calling thread's involuntary context switches when the run began.
    preempted_before: Option<u64>,
    /// Counts switches of the thread that made it: stays there.
    not_send: PhantomData<*const ()>,
}

impl Drop for HotRun {
    fn drop(&mut self) {
        if let Some(pool) = self.pool {
            pool.hot.fetch_sub(1, Ordering::Relaxed);
            // The submitting thread lost its core during the run: more
            // threads want the cores than there are.
            if let (Some(before), Some(after)) = (self.preempted_before, involuntary_switches()) {
                if after > before {
                    pool.calm(Instant::now());
                }
            }
        }
    }
}

/// How many times the calling thread was preempted (lost its core while
/// runnable) so far; None where the OS does not say.
#[cfg(target_os = "linux")]
fn involuntary_switches() -> Option<u64> {
    // SAFETY: getrusage writes only the struct it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::getrusage(libc::RUSAGE_THREAD, &mut usage) == 0).then_some(usage.ru_nivcsw as u64)
    }
}

#[cfg(not(target_os = "linux"))]
fn involuntary_switches() -> Option<u64> {
    None
}

/// Marks the current thread as running a job's items until dropped (also
/// when an item panics).
struct InJob;

impl InJob {
    fn enter() -> InJob {
        IN_JOB.with(|c| c.set(true));
        InJob
    }
}

impl Drop for InJob {
    fn drop(&mut self) {
        IN_JOB.with(|c| c.set(false));
    }
}

/// A raw pointer to an output buffer that tasks write disjoint parts of.
/// Whoever dereferences it guarantees that no two tasks touch the same
/// element and that the buffer outlives the tasks.
#[derive(Copy, Clone)]
pub(crate) struct SharedMut<T>(pub(crate) *mut T);

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper).
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the pointer is only dereferenced under the disjointness contract
// above, so sending it to other threads creates no data race.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_shared_per_count() {
        let (a, b) = (Threads::new(3), Threads::new(3));
        assert_eq!(a.count(), 3);
        assert!(std::ptr::eq(a.pool.unwrap_or_else(|| panic!("no pool")), b.pool.unwrap_or_else(|| panic!("no pool"))));
        assert_eq!(Threads::new(0).count(), 1);
        assert_eq!(Threads::new(1).count(), 1);
    }

    #[test]
    fn chunks_cover_everything_once() {
        for t in [1, 2, 4] {
            let threads = Threads::new(t);
            for _ in 0..50 {
                let mut v = vec![0u32; 1001];
                threads.for_each_chunk(&mut v, 10, |i, c| c.iter_mut().for_each(|x| *x += i as u32 + 1));
                for (j, &x) in v.iter().enumerate() {
                    assert_eq!(x, j as u32 / 10 + 1);
                }
            }
            let seen = AtomicUsize::new(0);
            let indices: Vec<AtomicUsize> = (0..t).map(|_| AtomicUsize::new(0)).collect();
            threads.for_each(170, |i| {
                seen.fetch_add(i + 1, Ordering::Relaxed);
                indices[threads.index()].fetch_add(1, Ordering::Relaxed);
                // Nested calls run serially instead of deadlocking.
                threads.for_each(3, |_| {});
            });
            assert_eq!(seen.into_inner(), 170 * 171 / 2);
            assert_eq!(indices.iter().map(|c| c.load(Ordering::Relaxed)).sum::<usize>(), 170);
        }
    }

    #[test]
    fn a_share_hands_out_each_item_once_from_either_end() {
        let share = Share(AtomicU64::new(0));
        share.set(3, 9);
        let taken: Vec<_> = (0..4).flat_map(|_| [share.take_first(), share.take_last()]).collect();
        let expected = [3, 8, 4, 7, 5, 6].map(Some).into_iter().chain([None, None]).collect::<Vec<_>>();
        assert_eq!(taken, expected);
        share.set(0, 0);
        assert_eq!((share.take_first(), share.take_last()), (None, None));
    }

    #[test]
    fn each_thread_starts_on_its_own_share() {
        // Two threads, two items: item 0 is the caller's share, item 1 the
        // worker's. A thread that runs any item runs its own first (the
        // other's it takes only once its own share is done).
        let threads = Threads::new(2);
        let _hot = threads.hot();
        for _ in 0..200 {
            let order = AtomicUsize::new(0);
            let first = [AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX)];
            threads.for_each(2, |i| {
                let me = threads.index();
                let _ = first[me].compare_exchange(usize::MAX, i, Ordering::Relaxed, Ordering::Relaxed);
                order.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(order.into_inner(), 2);
            for (me, first) in first.iter().enumerate() {
                let first = first.load(Ordering::Relaxed);
                assert!(first == usize::MAX || first == me, "thread {me} started on item {first}");
            }
        }
    }

    #[test]
    fn sessions_on_several_threads_share_a_pool() {
        let threads = Threads::new(2);
        std::thread::scope(|s| {
            for k in 0..4u64 {
                s.spawn(move || {
                    for _ in 0..100 {
                        let mut v = vec![0u64; 100];
                        threads.for_each_chunk(&mut v, 7, |_, c| c.iter_mut().for_each(|x| *x = k));
                        assert!(v.iter().all(|&x| x == k));
                    }
                });
            }
        });
    }

    #[test]
    fn a_hot_pool_runs_every_job_and_parks_when_the_run_ends() {
        // A count no other test uses, so no other run keeps this pool hot.
        let threads = Threads::new(5);
        let pool = threads.pool.unwrap_or_else(|| panic!("no pool"));
        for round in 0..3u64 {
            let hot = threads.hot();
            assert!(pool.hot.load(Ordering::Relaxed) >= 1);
            for job in 0..500u64 {
                let mut v = vec![0u64; 64 + job as usize % 7];
                threads.for_each_chunk(&mut v, 3, |i, c| c.iter_mut().for_each(|x| *x = round * job + i as u64));
                assert!(v.chunks(3).enumerate().all(|(i, c)| c.iter().all(|&x| x == round * job + i as u64)));
            }
            drop(hot);
            assert_eq!(pool.hot.load(Ordering::Relaxed), 0);
            // Cold: every worker parks within its spin limit (allow a
            // loaded machine a few seconds).
            let start = Instant::now();
            while pool.sleepers.load(Ordering::SeqCst) < 4 {
                assert!(start.elapsed() < Duration::from_secs(10), "workers still spin after the run ended");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn a_spinning_thread_that_loses_its_core_calms_the_pool() {
        let threads = Threads::new(6);
        let pool = threads.pool.unwrap_or_else(|| panic!("no pool"));
        let _hot = threads.hot();
        assert!(pool.is_hot());
        // A `done` that sleeps past the preemption threshold looks, to the
        // spinning loop, exactly like a lost core.
        let mut calls = 0;
        let found = pool.spin_until(|| {
            calls += 1;
            if calls == 2 {
                std::thread::sleep(PREEMPTED * 2);
            }
            false
        });
        assert!(!found);
        assert!(!pool.is_hot(), "still spinning after a preemption");
    }

    #[test]
    fn a_panicking_item_is_reported_and_the_pool_survives() {
        let threads = Threads::new(2);
        let result = catch_unwind(AssertUnwindSafe(|| {
            threads.for_each(8, |i| {
                if i == 5 {
                    panic!("item 5");
                }
            })
        }));
        assert!(result.is_err());
        let n = AtomicUsize::new(0);
        threads.for_each(8, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.into_inner(), 8);
    }
}
