//! The kernels' thread pools: one pool per thread count, built on first use
//! and shared by every context (and so every session) of the process, so a
//! run never spawns a thread.
//!
//! The pool is our own and small: `count - 1` parked worker threads plus the
//! calling thread share out the items `0..n` of one job at a time through an
//! atomic counter. The caller never waits for a worker that has not started:
//! once it runs out of items it closes the job, and waits only for workers
//! that joined (took the job before it closed). On a loaded machine a woken
//! worker can take milliseconds to get a core, and waiting for it merely to
//! report "nothing left" stalled every job that the caller had finished.
//! Workers park on a condvar, never spin: a spinning worker holds the core
//! the submitting thread needs (tried: 1.5–4× slower on the shared VM). Unlike rayon (tried first), handing out a job allocates
//! nothing — rayon's injector queue allocates a block every 63 jobs, which
//! broke "a steady-state run allocates nothing" — and there is no work
//! stealing to pay for: every split here is static. Jobs from several
//! sessions on one pool take turns.
//!
//! Work is always split so that no element's arithmetic depends on how many
//! threads run it: kernels hand out whole output tiles, rows or fixed-size
//! chunks (whose size never depends on the thread count), never a piece of
//! one reduction. Results are therefore bit-identical for any thread count.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// The most threads a context may ask for (a sanity bound on user input).
pub const MAX_THREADS: usize = 256;

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

    /// `f(i)` for every `i` in `0..n`, over the pool.
    pub(crate) fn for_each(&self, n: usize, f: impl Fn(usize) + Send + Sync) {
        match self.pool {
            Some(pool) if n > 1 && !IN_JOB.with(Cell::get) => pool.run(n, &f),
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
struct Pool {
    /// Held by the thread submitting a job, for the job's duration.
    submit: Mutex<()>,
    state: Mutex<JobState>,
    /// Signals workers that `state.generation` moved on.
    work: Condvar,
    /// Signals the submitter that `state.active` reached zero.
    done: Condvar,
    /// The next item of the current job to hand out.
    next: AtomicUsize,
}

/// The current job, as workers see it.
struct JobState {
    generation: u64,
    /// The open job: None once its caller ran out of items (closed), so a
    /// worker waking later does not join it.
    job: Option<Job>,
    /// Workers that joined the current job and are still running its items.
    active: usize,
    /// Whether an item of the current job panicked.
    panicked: bool,
}

/// A job's items: `run(i)` for `i < n`. The reference's lifetime is erased;
/// [`Pool::run`] does not return before every worker is done with it.
#[derive(Copy, Clone)]
struct Job {
    run: *const (dyn Fn(usize) + Sync + 'static),
    n: usize,
}

// SAFETY: the pointee is `Sync` and outlives every use (see `Job`).
unsafe impl Send for Job {}

impl Pool {
    /// A pool of `count - 1` workers plus the submitting thread; None if no
    /// worker thread could be started.
    fn start(count: usize) -> Option<&'static Pool> {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            submit: Mutex::new(()),
            state: Mutex::new(JobState { generation: 0, job: None, active: 0, panicked: false }),
            work: Condvar::new(),
            done: Condvar::new(),
            next: AtomicUsize::new(0),
        }));
        let mut started = 0;
        for index in 1..count {
            let spawned =
                std::thread::Builder::new().name(format!("kiln-{count}-{index}")).spawn(move || pool.work_loop(index));
            if spawned.is_ok() {
                started += 1;
            }
        }
        (started > 0).then_some(pool)
    }

    fn lock_state(&self) -> MutexGuard<'_, JobState> {
        // Items run outside the lock and panics are caught: never poisoned
        // in a way that leaves the state inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f(i)` for `i < n` on the workers and the calling thread.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let _turn = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: only the lifetime is erased; this function closes the job
        // and waits below until no worker that joined it holds it any more.
        let run: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        self.next.store(0, Ordering::Relaxed);
        {
            let mut state = self.lock_state();
            state.generation += 1;
            state.job = Some(Job { run, n });
            state.active = 0;
            state.panicked = false;
        }
        self.work.notify_all();
        let mine = catch_unwind(AssertUnwindSafe(|| self.run_items(Job { run, n })));
        let mut state = self.lock_state();
        // Closed: workers not yet awake skip it; wait only for those inside.
        state.job = None;
        while state.active > 0 {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        let panicked = state.panicked;
        drop(state);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        assert!(!panicked, "a kernel thread panicked");
    }

    /// Takes items of `job` until none are left.
    fn run_items(&self, job: Job) {
        let _in_job = InJob::enter();
        // SAFETY: the job outlives this call (see `Job`).
        let f = unsafe { &*job.run };
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= job.n {
                break;
            }
            f(i);
        }
    }

    fn work_loop(&self, index: usize) {
        WORKER_INDEX.with(|c| c.set(index));
        let mut seen = 0;
        loop {
            let job = {
                let mut state = self.lock_state();
                while state.generation == seen || state.job.is_none() {
                    seen = state.generation;
                    state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                seen = state.generation;
                state.active += 1;
                state.job
            };
            let ok = match job {
                Some(job) => catch_unwind(AssertUnwindSafe(|| self.run_items(job))).is_ok(),
                None => true,
            };
            let mut state = self.lock_state();
            state.panicked |= !ok;
            state.active -= 1;
            if state.active == 0 {
                self.done.notify_all();
            }
        }
    }
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
