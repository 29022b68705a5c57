//! The kernels' thread pools: one rayon pool per thread count, built on first
//! use and shared by every context (and so every session) of the process,
//! so a run never spawns a thread.
//!
//! Work is always split so that no element's arithmetic depends on how many
//! threads run it: kernels hand out whole output tiles, rows or fixed-size
//! chunks (whose size never depends on the thread count), never a piece of
//! one reduction. Results are therefore bit-identical for any thread count.

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

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
    pool: Option<&'static ThreadPool>,
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
        static POOLS: OnceLock<Mutex<HashMap<usize, Option<&'static ThreadPool>>>> = OnceLock::new();
        let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
        // A poisoned map still holds valid pools: a panic cannot leave one half-inserted.
        let mut pools = pools.lock().unwrap_or_else(|e| e.into_inner());
        let pool = *pools.entry(count).or_insert_with(|| {
            let built = ThreadPoolBuilder::new().num_threads(count).thread_name(|i| format!("kiln-{i}")).build();
            // Leaked on purpose: pools are shared for the life of the process.
            built.ok().map(|p| &*Box::leak(Box::new(p)))
        });
        match pool {
            Some(pool) => Threads { pool: Some(pool), count },
            None => Threads::single(),
        }
    }

    /// How many threads the work is split over.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The index of the calling thread within this pool, in `0..count()`.
    pub(crate) fn index(&self) -> usize {
        match self.pool {
            Some(pool) => pool.current_thread_index().unwrap_or(0).min(self.count - 1),
            None => 0,
        }
    }

    /// `f(i)` for every `i` in `0..n`, over the pool.
    pub(crate) fn for_each(&self, n: usize, f: impl Fn(usize) + Send + Sync) {
        match self.pool {
            Some(pool) if n > 1 => pool.install(|| (0..n).into_par_iter().for_each(f)),
            _ => (0..n).for_each(f),
        }
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
        match self.pool {
            Some(pool) if data.len() > chunk => {
                pool.install(|| data.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c)))
            }
            _ => data.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c)),
        }
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
            let mut v = vec![0u32; 1001];
            threads.for_each_chunk(&mut v, 10, |i, c| c.iter_mut().for_each(|x| *x += i as u32 + 1));
            for (j, &x) in v.iter().enumerate() {
                assert_eq!(x, j as u32 / 10 + 1);
            }
            let seen = std::sync::atomic::AtomicUsize::new(0);
            threads.for_each(17, |i| {
                seen.fetch_add(i + 1, std::sync::atomic::Ordering::Relaxed);
                assert!(threads.index() < t);
            });
            assert_eq!(seen.into_inner(), 17 * 18 / 2);
        }
    }
}
