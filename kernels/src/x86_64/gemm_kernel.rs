//! One f32 GEMM microkernel body for every x86-64 vector width: the AVX2
//! (6×16, ymm) and AVX-512 (8×32, zmm) kernels are the same code over
//! other intrinsics, widths, tile shapes and row dispatch, so both modules
//! instantiate [`f32_gemm_kernel!`] (each keeps its own doc: why its tile).
//!
//! The direct form reads A in place and computes only the rows there are;
//! below the full tile it takes several strips at a time (`R`×`S` tiles,
//! `rows` below says how many per row count), so that a GEMV still has
//! eight FMA chains in flight and does no multiply-adds on padding rows.

/// Defines `UKR` (the table entry) and its kernels in the calling module.
/// `lanes` f32s per vector `vec`; NR is two vectors; `rows` maps a row
/// count below MR to the strips its direct tiles take at once.
macro_rules! f32_gemm_kernel {
    (
        features: $features:literal,
        variant: $variant:literal,
        mr: $mr:literal,
        lanes: $lanes:literal,
        vec: $vec:ty,
        zero: $zero:ident,
        loadu: $loadu:ident,
        storeu: $storeu:ident,
        load_first: $load_first:ident,
        store_first: $store_first:ident,
        set1: $set1:ident,
        fmadd: $fmadd:ident,
        add: $add:ident,
        min: $min:ident,
        max: $max:ident,
        math: $math:ident,
        rows: { $( $rows:literal => $strips:literal ),* $(,)? } $(,)?
    ) => {
        use crate::generic::gemm::{AView, GemmUkr, Packing, PlainStore, RowAddends, Tile, VectorStore};
        use std::arch::x86_64::*;

        const MR: usize = $mr;
        const LANES: usize = $lanes;
        const NR: usize = 2 * LANES;

        /// The table entry; installed only by `x86_64::plug` after the
        /// kernel's CPU features were detected.
        pub(crate) const UKR: GemmUkr = GemmUkr {
            variant: $variant,
            mr: MR,
            nr: NR,
            packing: Packing::KMajorPanels,
            run: microkernel,
            direct: Some(direct),
            math: Some($math::VARIANT),
        };

fn microkernel(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let kc = kc.min(astrip.len() / MR).min(bstrip.len() / NR);
    // SAFETY: the CPU has the kernel's features (see `UKR`), and `kc` is bounded by
    // both strip lengths so every load stays in bounds.
    unsafe {
        if tile.cols <= LANES {
            block::<MR, 1, 1>(kc, astrip.as_ptr(), 1, MR, bstrip.as_ptr(), 0, tile)
        } else {
            block::<MR, 1, 2>(kc, astrip.as_ptr(), 1, MR, bstrip.as_ptr(), 0, tile)
        }
    }
}

fn direct(kc: usize, a: AView<'_>, b: &[f32], tile: &mut Tile<'_>) {
    let (rows, strips) = (tile.rows, tile.cols.div_ceil(NR));
    assert!(rows <= MR && a.covers(rows, kc), "direct kernel: {rows} rows of A out of bounds");
    assert!(b.len() >= strips * kc * NR, "direct kernel: {strips} B strips out of bounds");
    let (ap, rs, ks) = (a.data.as_ptr(), a.row_stride, a.k_stride);
    // SAFETY: the CPU has the kernel's features (see `UKR`); A's `rows`×`kc` and B's
    // `strips` strips were checked above.
    unsafe {
        match rows {
            0 => {}
            $( $rows => strips_of::<$rows, $strips>(kc, ap, rs, ks, b.as_ptr(), strips, tile), )*
            _ => strips_of::<MR, 1>(kc, ap, rs, ks, b.as_ptr(), strips, tile),
        }
    }
}

/// `R` rows by `strips` strips, `S` strips at a time (then one at a time);
/// a last strip of at most LANES columns (a 16- / 8-channel convolution, or
/// N mod NR ≤ LANES) computes only its first vector of columns.
///
/// # Safety
/// The kernel's CPU features; A's element (i, p) at `a + i*rs + p*ks` is readable for
/// i < R, p < kc, and `b` holds `strips` strips of `kc·NR`.
#[inline]
#[target_feature(enable = $features)]
unsafe fn strips_of<const R: usize, const S: usize>(
    kc: usize,
    a: *const f32,
    rs: usize,
    ks: usize,
    b: *const f32,
    strips: usize,
    tile: &mut Tile<'_>,
) {
    let stride = kc * NR;
    let half_last = strips > 0 && tile.cols - (strips - 1) * NR <= LANES;
    if strips == 1 {
        // The tile itself, not a copy of it from `Tile::columns` (each copy
        // of the struct cost a short-K tile a store-forwarding stall).
        if half_last {
            block::<R, 1, 1>(kc, a, rs, ks, b, stride, tile);
        } else {
            block::<R, 1, 2>(kc, a, rs, ks, b, stride, tile);
        }
        return;
    }
    let full = strips - usize::from(half_last);
    let mut s = 0;
    while s + S <= full {
        let mut part = tile.columns(s * NR, (full.min(s + S) * NR).min(tile.cols) - s * NR);
        block::<R, S, 2>(kc, a, rs, ks, b.add(s * stride), stride, &mut part);
        s += S;
    }
    while s < full {
        let mut part = tile.columns(s * NR, NR.min(tile.cols - s * NR));
        block::<R, 1, 2>(kc, a, rs, ks, b.add(s * stride), stride, &mut part);
        s += 1;
    }
    if half_last {
        let mut part = tile.columns(s * NR, tile.cols - s * NR);
        block::<R, 1, 1>(kc, a, rs, ks, b.add(s * stride), stride, &mut part);
    }
}

/// The `R`×`S·NR` tile (`W` vectors of each strip's two: with `W` = 1 the
/// tile is at most LANES wide): per element a chain of FMAs over `p` in
/// order from zero, as every shape of this kernel computes it.
///
/// # Safety
/// As [`strips_of`] with `S` strips `stride` apart; `tile` has `R` rows.
#[inline]
#[target_feature(enable = $features)]
unsafe fn block<const R: usize, const S: usize, const W: usize>(
    kc: usize,
    a: *const f32,
    rs: usize,
    ks: usize,
    b: *const f32,
    stride: usize,
    tile: &mut Tile<'_>,
) {
    // Per strip, per row: `W` vectors of accumulators.
    debug_assert!(W == 2 || tile.cols <= LANES);
    let mut c = [[[$zero(); W]; R]; S];
    let rows: [*const f32; R] = std::array::from_fn(|i| a.add(i * rs));
    // One cache line of `prefetch` every `every` k steps (a hint, evenly
    // spread: a burst of them delayed the kernel's own loads).
    const LINE: usize = 16;
    let prefetch = tile.prefetch;
    let lines = prefetch.len() / LINE;
    let every = if lines == 0 { usize::MAX } else { (kc / lines).max(1) };
    let (mut countdown, mut line) = (every, 0);
    for p in 0..kc {
        countdown -= 1;
        if countdown == 0 {
            countdown = every;
            if line < lines {
                _mm_prefetch::<_MM_HINT_T1>(prefetch.as_ptr().add(line * LINE).cast());
                line += 1;
            }
        }
        let bp = b.add(p * NR);
        let mut bv = [[$zero(); W]; S];
        for (s, v) in bv.iter_mut().enumerate() {
            for (h, x) in v.iter_mut().enumerate() {
                *x = $loadu(bp.add(s * stride + h * LANES));
            }
        }
        for (i, row) in rows.iter().enumerate() {
            let av = $set1(*row.add(p * ks));
            for (cs, v) in c.iter_mut().zip(&bv) {
                for (acc, &bh) in cs[i].iter_mut().zip(v) {
                    *acc = $fmadd(av, bh, *acc);
                }
            }
        }
    }
    if S == 1 {
        store(&c[0], tile);
        return;
    }
    for (s, cs) in c.iter().enumerate() {
        let col = s * NR;
        if col >= tile.cols {
            break;
        }
        store(cs, &mut tile.columns(col, NR.min(tile.cols - col)));
    }
}

/// Stores `R` rows of one strip's accumulators (`W` vectors a row) into
/// `tile` (`R` rows, up to `W`·LANES columns). A tile whose epilogue is a
/// bias, residual, ReLU, clamp or an activation of the kernel's own vector
/// math (`math`) is finished in registers, a partial vector (N mod LANES
/// columns: 24-, 40-, 72-channel convolutions) through masked loads and
/// stores; the rest goes through the portable store step.
#[inline(always)]
unsafe fn store<const R: usize, const W: usize>(c: &[[$vec; W]; R], tile: &mut Tile<'_>) {
    if let Some(vs) = tile.vector_store(MR, NR) {
        let cols = tile.cols;
        if cols == W * LANES {
            if let Some(plain) = vs.plain(tile.rows) {
                store_plain(c, tile, &plain);
                return;
            }
            for (i, ci) in c.iter().enumerate().take(tile.rows) {
                let addends = vs.row(i);
                let ptr = tile.row(i).as_mut_ptr();
                for (h, &v) in ci.iter().enumerate() {
                    // SAFETY: the row, the column bias and the residual row
                    // each hold `cols` = W · LANES f32s: one unaligned vector
                    // access per LANES of them.
                    store_row::<true>(&vs, &addends, ptr, v, h * LANES, LANES);
                }
            }
            return;
        }
        store_partial(c, tile, &vs);
        return;
    }
    let mut acc = [0f32; MR * NR];
    for (row, ci) in acc.chunks_exact_mut(NR).zip(c) {
        for (h, &v) in ci.iter().enumerate() {
            // SAFETY: each row holds NR = 2 · LANES f32s, W ≤ 2 unaligned vector stores.
            $storeu(row.as_mut_ptr().add(h * LANES), v);
        }
    }
    tile.store(&acc, NR);
}

/// [`store`] for a full tile with a [`PlainStore`] epilogue: the bias and
/// clamp bounds in registers for the whole tile, the steps of [`store_row`]
/// in its order (so the same bits).
///
/// # Safety
/// As [`store`], with `tile.cols` = W · LANES.
#[inline(always)]
unsafe fn store_plain<const R: usize, const W: usize>(c: &[[$vec; W]; R], tile: &mut Tile<'_>, p: &PlainStore<'_>) {
    let bias: Option<[$vec; W]> = p.col_bias.map(|b| std::array::from_fn(|h| $loadu(b.as_ptr().add(h * LANES))));
    let clamp = p.clamp.map(|(lo, hi)| ($set1(lo), $set1(hi)));
    for (i, ci) in c.iter().enumerate().take(tile.rows) {
        let ptr = tile.row(i).as_mut_ptr();
        let residual = p.residual.map(|(r, ld)| r.as_ptr().add(i * ld));
        for (h, &acc) in ci.iter().enumerate() {
            let mut v = acc;
            if let Some(b) = &bias {
                v = $add(v, b[h]);
            }
            let r = residual.map(|r| $loadu(r.add(h * LANES)));
            if let (true, Some(r)) = (p.residual_first, r) {
                v = $add(v, r);
            }
            if let Some((lo, hi)) = clamp {
                v = $min(hi, $max(lo, v));
            }
            if let (false, Some(r)) = (p.residual_first, r) {
                v = $add(v, r);
            }
            $storeu(ptr.add(h * LANES), v);
        }
    }
}

/// [`store`]'s vector store step for a tile narrower than its vectors (the
/// last vector masked to the columns there are): out of line, so that the
/// full tiles' store stays small enough to be inlined into [`block`].
///
/// # Safety
/// As [`store`].
#[inline(never)]
#[target_feature(enable = $features)]
unsafe fn store_partial<const R: usize, const W: usize>(c: &[[$vec; W]; R], tile: &mut Tile<'_>, vs: &VectorStore<'_>) {
    let cols = tile.cols;
    for (i, ci) in c.iter().enumerate().take(tile.rows) {
        let addends = vs.row(i);
        let ptr = tile.row(i).as_mut_ptr();
        for (h, &v) in ci.iter().enumerate().take(cols.div_ceil(LANES)) {
            // SAFETY: the row, the column bias and the residual row each
            // hold `cols` f32s: one vector access per LANES of them, the
            // last one masked to the columns there are.
            let off = h * LANES;
            store_row::<false>(vs, &addends, ptr, v, off, LANES.min(cols - off));
        }
    }
}

/// The first `n` (1..=LANES) f32s at `ptr` (the rest of the vector zero).
///
/// # Safety
/// `ptr .. ptr + n` is readable; the kernel's CPU features (a helper
/// inlined into the kernel, which has them).
#[inline(always)]
unsafe fn load_n<const FULL: bool>(ptr: *const f32, n: usize) -> $vec {
    if FULL || n == LANES {
        $loadu(ptr)
    } else {
        $load_first(ptr, n)
    }
}

/// Stores the first `n` (1..=LANES) lanes of `v` at `ptr`.
///
/// # Safety
/// `ptr .. ptr + n` is writable; the kernel's CPU features.
#[inline(always)]
unsafe fn store_n<const FULL: bool>(ptr: *mut f32, n: usize, v: $vec) {
    if FULL || n == LANES {
        $storeu(ptr, v)
    } else {
        $store_first(ptr, n, v)
    }
}

/// [`VectorStore`]'s steps for the `n` (1..=LANES) elements of a row at
/// `ptr + off`, in the portable store step's order and operand order (lanes
/// past `n` are computed on zeros and never stored).
///
/// # Safety
/// `ptr + off .. ptr + off + n` is writable, and the addends' slices hold
/// `off + n` elements.
#[inline(always)]
unsafe fn store_row<const FULL: bool>(vs: &VectorStore<'_>, row: &RowAddends<'_>, ptr: *mut f32, acc: $vec, off: usize, n: usize) {
    let ptr = ptr.add(off);
    let mut v = if vs.accumulate { $add(load_n::<FULL>(ptr, n), acc) } else { acc };
    if let Some(b) = row.bias {
        v = $add(v, $set1(b));
    }
    if let Some(b) = row.col_bias {
        v = $add(v, load_n::<FULL>(b.as_ptr().add(off), n));
    }
    let residual = row.residual.map(|r| load_n::<FULL>(r.as_ptr().add(off), n));
    if let (true, Some(r)) = (vs.residual_first, residual) {
        v = $add(v, r);
    }
    if let Some((lo, hi)) = vs.clamp {
        // max(lo, v) is lo only when lo > v, min(hi, v) hi only when hi < v:
        // NaN stays NaN, as in the portable clamp.
        v = $min($set1(hi), $max($set1(lo), v));
    }
    if let Some(a) = vs.activation {
        // The table's slice functions run these very bodies per vector.
        v = $math::activation_ps(a, v);
    }
    if let (false, Some(r)) = (vs.residual_first, residual) {
        v = $add(v, r);
    }
    store_n::<FULL>(ptr, n, v);
}
    };
}

pub(crate) use f32_gemm_kernel;
