//! 64-byte aligned byte buffers (arena memory, and artifacts loaded from memory).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

const ALIGN: usize = 64;

/// The alignment of a session's arena (and of artifacts copied into memory):
/// a plan whose buffer offsets are multiples of at most this has every
/// buffer aligned as much in memory. The compiler refuses a memory plan that
/// asks for more.
pub const ARENA_ALIGN: u64 = ALIGN as u64;

/// A type with [`ALIGN`]: its dangling pointer is aligned for every dtype.
#[repr(C, align(64))]
struct Line([u8; ALIGN]);

/// A zero-initialised, 64-byte aligned byte buffer.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Zeroed buffer; `None` when the allocation fails (a hostile plan may ask for
    /// terabytes, and Rust aborts on a failed infallible allocation). Large
    /// buffers come zeroed from the OS page by page (`calloc`-like), so a
    /// session does not spend time zeroing memory its run never touches.
    pub fn zeroed(len: usize) -> Option<AlignedBuf> {
        if len == 0 {
            // Still 64-byte aligned: kernels cast (empty) slices of it to wider types.
            return Some(AlignedBuf { ptr: NonNull::<Line>::dangling().cast(), len });
        }
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(AlignedBuf { ptr, len })
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<AlignedBuf> {
        let mut buf = AlignedBuf::zeroed(bytes.len())?;
        buf.as_mut_slice().copy_from_slice(bytes);
        Some(buf)
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` initialised (zeroed or written) bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}
