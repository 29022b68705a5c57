//! A counting global allocator for "allocates nothing" tests: either the
//! calling thread's allocations ([`allocations_during`], which other test
//! threads and a plugin's own threads cannot disturb) or every thread's
//! ([`allocations_anywhere_during`], which also sees the kernel pool's
//! workers; hold one such test per binary). A test binary installs it with
//! `#[global_allocator] static A: kiln_tests::alloc_count::Counting = kiln_tests::alloc_count::Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static COUNTING_ANYWHERE: AtomicBool = AtomicBool::new(false);
static COUNT_ANYWHERE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised: reading them never allocates (no recursion).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

pub struct Counting;

fn note() {
    if COUNTING_ANYWHERE.load(Ordering::Relaxed) {
        COUNT_ANYWHERE.fetch_add(1, Ordering::Relaxed);
    }
    // `try_with`: the allocator also runs while thread locals are torn down.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: defers every call to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Heap allocations (and reallocations) this thread makes during `f`. Only
/// meaningful in a binary whose global allocator is [`Counting`]: check that
/// a known allocation counts before trusting a zero.
pub fn allocations_during(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    COUNT.with(Cell::get)
}

/// Heap allocations (and reallocations) any thread makes during `f`.
pub fn allocations_anywhere_during(f: impl FnOnce()) -> usize {
    COUNT_ANYWHERE.store(0, Ordering::SeqCst);
    COUNTING_ANYWHERE.store(true, Ordering::SeqCst);
    f();
    COUNTING_ANYWHERE.store(false, Ordering::SeqCst);
    COUNT_ANYWHERE.load(Ordering::SeqCst)
}
