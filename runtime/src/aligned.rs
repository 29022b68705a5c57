//! 64-byte aligned byte buffers (arena memory, and artifacts loaded from memory).

/// One cache line; a `Vec` of these is a 64-byte aligned byte buffer.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

pub(crate) struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// Zeroed buffer; `None` when the allocation fails (a hostile plan may ask for
    /// terabytes, and Rust aborts on a failed infallible allocation).
    pub fn zeroed(len: usize) -> Option<AlignedBuf> {
        let n = len.div_ceil(64);
        let mut lines = Vec::new();
        lines.try_reserve_exact(n).ok()?;
        lines.resize(n, Line([0; 64]));
        Some(AlignedBuf { lines, len })
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<AlignedBuf> {
        let mut buf = AlignedBuf::zeroed(bytes.len())?;
        buf.as_mut_slice().copy_from_slice(bytes);
        Some(buf)
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `lines` holds `n * 64 >= len` initialised bytes, `Line` has no padding.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }
}
