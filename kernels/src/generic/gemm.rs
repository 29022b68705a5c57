//! Cache-blocked, packed f32 GEMM (Goto/BLIS structure).
//!
//! Loop nest, outermost first: NC-wide column blocks of B, KC-deep slices of
//! K (B slice packed into NR-wide strips), MC-tall row blocks of A (packed
//! into MR-tall strips), then an MR×NR register-blocked microkernel over the
//! packed strips. Packing makes the microkernel's loads unit-stride and
//! zero-pads the edges, so it never needs tail handling; only the final store
//! is clipped. A microkernel with a direct form ([`DirectKernel`]) reads a
//! row-major A in place instead: no A packing, and the last `m mod MR` rows
//! (all rows of a skinny GEMM) are computed as they are, several B strips
//! at a time, rather than as a zero-padded tile.
//! Threads share out the tiles of each (column block, K slice):
//! row blocks, and column groups when there are few rows (see [`drive`]).
//! A constant B (a weight) can be packed once ([`PackedB`]) and reused by
//! every call.

use super::common::shape_err;
use super::elementwise::{clamp_bound, clamp_f32_in_place, unary_f32_fn};
use crate::context::Context;
use crate::parallel::{SharedMut, Threads};
use crate::table::{KernelTable, UnaryFn};
use crate::types::{PackBuffers, Result, UnaryOp};
use std::marker::PhantomData;

/// Rows of C per generic microkernel tile. 4×8 accumulators fit the 16 SSE
/// registers of baseline x86_64 (and NEON's 32) without spilling.
pub const MR: usize = 4;
/// Columns of C per generic microkernel tile.
pub const NR: usize = 8;
/// Depth of one packed slice. Each slice but the first re-reads and
/// rewrites its tile of C, so deeper is better while a KC×NR strip of B
/// stays close: 512 keeps the AVX2 strip (32 KiB) in L1 and the AVX-512 one
/// (64 KiB) in L2, which still feeds the 8×32 kernel, and was 2–5 % faster
/// than 256 on both (benches/RESULTS.md, 2026-12-04): at K ≤ 512, the
/// common transformer width, C is written once.
pub(crate) const KC: usize = 512;
/// Rows per A block (MC×KC f32 = 128 KiB, L2-resident); rounded down to a
/// multiple of the variant's MR.
const MC: usize = 64;
/// Columns per packed B block (KC×NC f32 = 1 MiB, L2/L3-resident).
const NC: usize = 512;

/// How the microkernel expects its operands packed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Packing {
    /// A in MR-tall strips laid out k-major (`strip[p*MR + i]`), B in NR-wide
    /// strips laid out k-major (`strip[p*NR + j]`), the last strip of each
    /// zero-padded, so the microkernel has no edge cases. (Room for others:
    /// pair-interleaved bf16.)
    KMajorPanels,
}

/// An MR×NR microkernel: accumulates `Astrip · Bstrip` over `kc` steps of the
/// packed strips in registers, then hands the accumulators to the tile's
/// store step (or stores them directly when the tile allows it).
pub(crate) type MicroKernel = fn(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>);

/// Rows of A read in place by a [`DirectKernel`]: element (i, p) of the
/// strip is `data[i*row_stride + p*k_stride]` (a row-major A: `lda`, 1; a
/// packed strip: 1, MR).
#[derive(Copy, Clone)]
pub(crate) struct AView<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) row_stride: usize,
    pub(crate) k_stride: usize,
}

impl AView<'_> {
    /// Whether elements (i, p) for i < rows, p < kc all lie inside `data`.
    #[cfg_attr(not(kiln_x86_64), allow(dead_code))]
    pub(crate) fn covers(&self, rows: usize, kc: usize) -> bool {
        if rows == 0 || kc == 0 {
            return true;
        }
        let last = (rows - 1).checked_mul(self.row_stride).zip((kc - 1).checked_mul(self.k_stride));
        last.and_then(|(r, k)| r.checked_add(k)).is_some_and(|at| at < self.data.len())
    }
}

/// A microkernel that reads A in place ([`AView`], no packing) for any
/// `tile.rows` in `1..=MR`, over `tile.cols.div_ceil(NR)` consecutive packed
/// B strips of `kc·NR` each (`b`), with few rows several strips at a time
/// so that enough FMA chains are in flight (the skinny path: M ≤ 16 and the
/// last rows of any GEMM). Every element is the same operations in the same
/// order as the [`MicroKernel`] of the same entry computes for it, so the
/// results are bit-identical whichever runs.
pub(crate) type DirectKernel = fn(kc: usize, a: AView<'_>, b: &[f32], tile: &mut Tile<'_>);

/// The kernel table's GEMM entry: a microkernel with its tile shape and the
/// packing it reads, and optionally its direct form.
#[derive(Copy, Clone)]
pub(crate) struct GemmUkr {
    pub(crate) variant: &'static str,
    pub(crate) mr: usize,
    pub(crate) nr: usize,
    pub(crate) packing: Packing,
    pub(crate) run: MicroKernel,
    /// Without one, a row-major A is packed block by block.
    pub(crate) direct: Option<DirectKernel>,
    /// The variant name of the vector math (the table entries' `variant`)
    /// whose GELU, SiLU and sigmoid the kernel's store step applies in
    /// registers: an epilogue activation runs there only when the table's
    /// own entry for it has this name, i.e. is the same per-lane code, so
    /// the result is the unfused kernel's bit for bit. None: activations
    /// other than ReLU and clamp go through [`Tile::store`].
    pub(crate) math: Option<&'static str>,
}

/// The portable variant (packs A: it is the test oracle, kept simple).
pub(crate) const GENERIC_UKR: GemmUkr = GemmUkr {
    variant: "generic_4x8",
    mr: MR,
    nr: NR,
    packing: Packing::KMajorPanels,
    run: microkernel_generic,
    direct: None,
    math: None,
};

/// How a tile's accumulators combine with what C holds.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum Combine {
    /// C = acc (C is not read, so stale NaNs cannot leak).
    Overwrite,
    /// C += acc.
    Accumulate,
    /// C = beta·C + acc.
    Scale(f32),
}

/// A bias the epilogue adds, indexed by C's row or column.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) enum Bias<'a> {
    #[default]
    None,
    /// `bias[i]` added to row i (convolution: one per output channel).
    PerRow(&'a [f32]),
    /// `bias[j]` added to column j (linear: one per output feature).
    PerCol(&'a [f32]),
}

/// An activation a fused epilogue applies (`kiln_isa::epilogue`). Each runs
/// the same f32 code as the unfused unary or clamp kernel of the same table.
pub use kiln_isa::Activation;

/// An activation resolved to the kernel table's f32 function.
#[derive(Copy, Clone)]
pub(crate) struct ActivationFn {
    pub(crate) activation: Activation,
    run: ActivationKernel,
    /// Set when the kernel this was resolved for (the table's GEMM
    /// microkernel, [`GemmUkr::math`]; or a depthwise row kernel,
    /// [`ActivationFn::for_vector_math`]) computes this activation in
    /// registers with the same code as `run`. Read by the x86-64
    /// microkernels' store step and depthwise rows only.
    #[cfg_attr(not(kiln_x86_64), allow(dead_code))]
    pub(crate) in_registers: Option<VectorActivation>,
}

/// An activation an ISA microkernel's store step applies to the
/// accumulators in registers (the vector body of the table's slice
/// function, so bit for bit the same per lane): without the round trip of
/// every tile row through memory and a call per row, exact GELU cost BERT's
/// FFN GEMM as much as its multiply-adds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum VectorActivation {
    Gelu,
    Silu,
    Sigmoid,
    /// `v · sigmoid(v)` ([`Activation::MulSigmoid`]).
    MulSigmoid,
    /// `v · clamp(v + 3, 0, 6) / 6` ([`Activation::Hardswish`]).
    Hardswish,
    /// GPT-2's `gelu_new` chain around the tanh's vector body
    /// ([`Activation::GeluTanhChain`]).
    GeluTanhChain,
}

#[derive(Copy, Clone)]
enum ActivationKernel {
    Unary(UnaryFn),
    /// `v · sigmoid(v)`, the sigmoid through this function.
    MulSigmoid(UnaryFn),
    /// `v · clamp(v + 3, 0, 6) / 6`, exact operations (the same on every table).
    Hardswish,
    /// GPT-2's `gelu_new` chain, exact operations around this tanh.
    GeluTanhChain(UnaryFn),
    /// Bounds as the clamp kernel rounds them (an absent one is infinite,
    /// which no value crosses).
    Clamp(f32, f32),
}

impl std::fmt::Debug for ActivationFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.activation.fmt(f)
    }
}

impl ActivationFn {
    pub(crate) fn new(table: &KernelTable, activation: Activation) -> ActivationFn {
        // Every unary activation has an f32 form; the copy is never chosen.
        fn copy(x: &[f32], out: &mut [f32]) {
            out.copy_from_slice(&x[..out.len()]);
        }
        let run = match activation {
            Activation::Clamp { min, max } => {
                ActivationKernel::Clamp(clamp_bound(min, f32::NEG_INFINITY), clamp_bound(max, f32::INFINITY))
            }
            Activation::MulSigmoid => {
                ActivationKernel::MulSigmoid(unary_f32_fn(table, UnaryOp::Sigmoid).unwrap_or(copy))
            }
            Activation::Hardswish => ActivationKernel::Hardswish,
            Activation::GeluTanhChain => {
                ActivationKernel::GeluTanhChain(unary_f32_fn(table, UnaryOp::Tanh).unwrap_or(copy))
            }
            a => ActivationKernel::Unary(a.unary_op().and_then(|op| unary_f32_fn(table, op)).unwrap_or(copy)),
        };
        let in_registers = vector_form(table, activation, table.gemm.math);
        ActivationFn { activation, run, in_registers }
    }

    /// This activation for a kernel whose vector math is `math` (an ISA
    /// math module's `VARIANT`, None for portable code): `in_registers` set
    /// where that code is the table's own for this activation.
    pub(crate) fn for_vector_math(self, table: &KernelTable, math: Option<&str>) -> ActivationFn {
        ActivationFn { in_registers: vector_form(table, self.activation, math), ..self }
    }

    /// A clamp's bounds as the clamp kernel rounds them (None for the
    /// unary activations).
    pub(crate) fn clamp_bounds(&self) -> Option<(f32, f32)> {
        match self.run {
            ActivationKernel::Clamp(lo, hi) => Some((lo, hi)),
            // `v < 0 ? 0 : v` is the clamp's comparison to (0, ∞): the same
            // bits (NaN and -0 kept), so ReLU fuses wherever a clamp does.
            ActivationKernel::Unary(_) if self.activation == Activation::Relu => Some((0.0, f32::INFINITY)),
            ActivationKernel::Unary(_)
            | ActivationKernel::MulSigmoid(_)
            | ActivationKernel::Hardswish
            | ActivationKernel::GeluTanhChain(_) => None,
        }
    }

    /// Applies the activation to `row` in place (the table's functions read
    /// and write separate slices, so through a small stack copy).
    pub(crate) fn apply(&self, row: &mut [f32]) {
        const CHUNK: usize = 64;
        match self.run {
            ActivationKernel::Clamp(lo, hi) => clamp_f32_in_place(row, lo, hi),
            ActivationKernel::Hardswish => row.iter_mut().for_each(|v| *v = hardswish(*v)),
            ActivationKernel::Unary(_) | ActivationKernel::MulSigmoid(_) | ActivationKernel::GeluTanhChain(_) => {
                let mut tmp = [0f32; CHUNK];
                for part in row.chunks_mut(CHUNK) {
                    let src = &mut tmp[..part.len()];
                    src.copy_from_slice(part);
                    self.apply_to(src, part);
                }
            }
        }
    }

    /// `out[i] = activation(x[i])` over `out.len()` elements (`x` at least
    /// as long): [`ActivationFn::apply`]'s operations without its copy, for
    /// a kernel that holds its results apart from the output (the
    /// depthwise rows' accumulators).
    pub(crate) fn apply_to(&self, x: &[f32], out: &mut [f32]) {
        let x = &x[..out.len()];
        match self.run {
            ActivationKernel::Clamp(lo, hi) => {
                out.copy_from_slice(x);
                clamp_f32_in_place(out, lo, hi);
            }
            ActivationKernel::Unary(run) => run(x, out),
            ActivationKernel::MulSigmoid(sigmoid) => {
                sigmoid(x, out);
                out.iter_mut().zip(x).for_each(|(v, &x)| *v *= x);
            }
            ActivationKernel::Hardswish => out.iter_mut().zip(x).for_each(|(v, &x)| *v = hardswish(x)),
            ActivationKernel::GeluTanhChain(tanh) => gelu_tanh_chain(tanh, x, out),
        }
    }
}

/// `out[i]` = GPT-2's `gelu_new` of `x[i]` as the unfused ops round it
/// ([`Activation::GeluTanhChain`]): the tanh's argument, then `tanh` (the
/// table's slice function, as the unfused tanh kernel calls it), then the
/// rest; each step one f32 operation.
fn gelu_tanh_chain(tanh: UnaryFn, x: &[f32], out: &mut [f32]) {
    use kiln_isa::epilogue::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
    const CHUNK: usize = 64;
    let mut z = [0f32; CHUNK];
    for (x, out) in x.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let z = &mut z[..x.len()];
        for (z, &v) in z.iter_mut().zip(x) {
            let cube = v * v * v;
            *z = SQRT_2_OVER_PI * (v + CUBIC * cube);
        }
        tanh(z, out);
        out.iter_mut().zip(x).for_each(|(t, &v)| *t = (HALF * v) * (ONE + *t));
    }
}

/// `v · clamp(v + 3, 0, 6) / 6` with the clamp kernel's comparisons (NaN
/// passes through).
#[inline(always)]
fn hardswish(v: f32) -> f32 {
    let c = v + 3.0;
    let c = if c < 0.0 { 0.0 } else { c };
    let c = if c > 6.0 { 6.0 } else { c };
    v * c / 6.0
}

/// The [`VectorActivation`] a kernel whose vector math is `math` computes
/// for `activation` with the same code as `table`'s slice function: the
/// table's entry must be of that math (a v4 table keeps some AVX2 entries);
/// hardswish is exact operations, which any ISA's vector form computes
/// alike.
fn vector_form(table: &KernelTable, activation: Activation, math: Option<&str>) -> Option<VectorActivation> {
    let (vector, entry) = match activation {
        Activation::Gelu => (VectorActivation::Gelu, table.gelu.variant),
        Activation::Silu => (VectorActivation::Silu, table.silu.variant),
        Activation::Sigmoid => (VectorActivation::Sigmoid, table.sigmoid.variant),
        Activation::MulSigmoid => (VectorActivation::MulSigmoid, table.sigmoid.variant),
        Activation::Hardswish => return math.is_some().then_some(VectorActivation::Hardswish),
        Activation::GeluTanhChain => (VectorActivation::GeluTanhChain, table.tanh.variant),
        _ => return None,
    };
    (math == Some(entry)).then_some(vector)
}

/// What the store step applies to each finished element after combining,
/// as data (tract's `FusedSpec`), on the last K slice only, in this order:
/// `v = scale·v`, `v += bias`, `v = activation(v)`, `v += residual` — or,
/// with `residual_first`, the residual before the activation.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Epilogue<'a> {
    pub(crate) scale: f32,
    pub(crate) bias: Bias<'a>,
    pub(crate) activation: Option<ActivationFn>,
    /// A tensor shaped like C (`residual[i*ld + j]` for C's element (i, j)).
    pub(crate) residual: Option<(&'a [f32], usize)>,
    pub(crate) residual_first: bool,
}

impl Default for Epilogue<'_> {
    fn default() -> Self {
        Epilogue { scale: 1.0, bias: Bias::None, activation: None, residual: None, residual_first: false }
    }
}

impl<'a> Epilogue<'a> {
    /// Just a bias.
    pub(crate) fn bias(bias: Bias<'a>) -> Epilogue<'a> {
        Epilogue { bias, ..Epilogue::default() }
    }

    // The x86 microkernels ask `Tile::vector_store` instead.
    #[cfg_attr(not(kiln_neon), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.scale == 1.0 && matches!(self.bias, Bias::None) && self.activation.is_none() && self.residual.is_none()
    }

    /// Applies the epilogue to a finished row of C: row `i`, columns
    /// `col0..col0 + row.len()`.
    pub(crate) fn apply(&self, row: &mut [f32], i: usize, col0: usize) {
        if self.scale != 1.0 {
            row.iter_mut().for_each(|c| *c *= self.scale);
        }
        match self.bias {
            Bias::None => {}
            Bias::PerRow(bias) => {
                let b = bias[i];
                row.iter_mut().for_each(|c| *c += b);
            }
            Bias::PerCol(bias) => {
                let bias = &bias[col0..][..row.len()];
                row.iter_mut().zip(bias).for_each(|(c, &b)| *c += b);
            }
        }
        let add_residual = |row: &mut [f32]| {
            if let Some((res, ld)) = self.residual {
                let res = &res[i * ld + col0..][..row.len()];
                row.iter_mut().zip(res).for_each(|(c, &r)| *c += r);
            }
        };
        if self.residual_first {
            add_residual(row);
        }
        if let Some(act) = &self.activation {
            act.apply(row);
        }
        if !self.residual_first {
            add_residual(row);
        }
    }
}

/// Where one microkernel call's tile goes: the valid `rows×cols` corner
/// (edges are partial) of C starting at (`row0`, `col0`). Tiles of one GEMM
/// are written by several threads at once, so C is reached through a raw
/// pointer: each tile's rows are its own and never overlap another's.
pub(crate) struct Tile<'a> {
    c: *mut f32,
    pub(crate) ldc: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row0: usize,
    pub(crate) col0: usize,
    pub(crate) combine: Combine,
    pub(crate) epilogue: Epilogue<'a>,
    /// Data the kernel asks the memory system for, spread over its k loop,
    /// while it computes the tile (a hint: no effect on any result; empty
    /// for none; [`Tile::columns`] passes it on). [`direct_rect`] passes a
    /// part of the next B strip.
    #[cfg_attr(not(kiln_x86_64), allow(dead_code))]
    pub(crate) prefetch: &'a [f32],
    _c: PhantomData<&'a mut [f32]>,
}

impl<'a> Tile<'a> {
    /// A tile whose element (i, j) is `c[i*ldc + j]`.
    ///
    /// # Safety
    /// For `i < rows`, `c + i*ldc .. c + i*ldc + cols` must be valid for
    /// reads and writes for `'a`, and touched by nothing else meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new(
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        row0: usize,
        col0: usize,
        combine: Combine,
        epilogue: Epilogue<'a>,
    ) -> Tile<'a> {
        Tile { c, ldc, rows, cols, row0, col0, combine, epilogue, prefetch: &[], _c: PhantomData }
    }

    /// Columns `col..col + cols` of the tile (inside it), as a tile of their
    /// own, for a kernel that computed several strips at once.
    #[cfg_attr(not(kiln_x86_64), allow(dead_code))]
    pub(crate) fn columns(&mut self, col: usize, cols: usize) -> Tile<'_> {
        assert!(col + cols <= self.cols, "columns {col}+{cols} of a {}-wide tile", self.cols);
        // SAFETY: a part of this tile's elements, reached only through the
        // returned tile while it borrows this one mutably.
        let mut part = unsafe {
            let c = self.c.add(col);
            Tile::new(c, self.ldc, self.rows, cols, self.row0, self.col0 + col, self.combine, self.epilogue)
        };
        part.prefetch = self.prefetch;
        part
    }

    /// The tile's first element, for a kernel that stores whole rows of a
    /// full tile from registers it cannot hand to Rust code (the SME kernel
    /// stores ZA rows in streaming mode): element (i, j) is at `i*ldc + j`
    /// from it, valid for reads and writes for i < rows, j < cols (the
    /// contract of [`Tile::new`]).
    #[cfg_attr(not(kiln_neon), allow(dead_code))]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut f32 {
        self.c
    }

    /// Row `i` of the tile: its `cols` elements of C.
    pub(crate) fn row(&mut self, i: usize) -> &mut [f32] {
        assert!(i < self.rows, "tile row {i} of {}", self.rows);
        // SAFETY: the contract of `Tile::new`; `&mut self` keeps the row unique.
        unsafe { std::slice::from_raw_parts_mut(self.c.add(i * self.ldc), self.cols) }
    }

    /// The portable store step: combines the valid corner of `acc` (row-major
    /// with row stride `ld`) with C, then applies the epilogue.
    pub(crate) fn store(&mut self, acc: &[f32], ld: usize) {
        let (combine, epilogue, row0, col0, cols) = (self.combine, self.epilogue, self.row0, self.col0, self.cols);
        for i in 0..self.rows {
            let row = self.row(i);
            let acc = &acc[i * ld..][..cols];
            match combine {
                Combine::Overwrite => row.copy_from_slice(acc),
                Combine::Accumulate => row.iter_mut().zip(acc).for_each(|(c, &v)| *c += v),
                Combine::Scale(b) => row.iter_mut().zip(acc).for_each(|(c, &v)| *c = b * *c + v),
            }
            epilogue.apply(row, row0 + i, col0);
        }
    }
}

/// A full tile's store step in the form the ISA microkernels run from
/// registers: per element `v = acc` (or `C + acc`), `v += bias`, then the
/// residual and a clamp or [`VectorActivation`] in the epilogue's order. ReLU is the clamp to
/// `[0, +inf)` and the vector `max(lo, v)` / `min(hi, v)` pick `v` for NaN,
/// exactly like the portable `if v < lo {lo} else {v}`: so every element is
/// the same IEEE operations on the same operands as [`Tile::store`], bit for
/// bit.
#[cfg(kiln_x86_64)]
#[derive(Copy, Clone)]
pub(crate) struct VectorStore<'a> {
    pub(crate) accumulate: bool,
    pub(crate) clamp: Option<(f32, f32)>,
    /// Applied where the clamp would be (an epilogue has one activation).
    pub(crate) activation: Option<VectorActivation>,
    pub(crate) residual_first: bool,
    bias: Bias<'a>,
    residual: Option<(&'a [f32], usize)>,
    row0: usize,
    col0: usize,
    cols: usize,
}

/// What [`VectorStore::row`] adds to one row of a tile.
#[cfg(kiln_x86_64)]
pub(crate) struct RowAddends<'a> {
    /// Added to every element (a per-row bias).
    pub(crate) bias: Option<f32>,
    /// Added element by element, `cols` long: a per-column bias ...
    pub(crate) col_bias: Option<&'a [f32]>,
    /// ... and the residual row.
    pub(crate) residual: Option<&'a [f32]>,
}

/// [`VectorStore::plain`]: a store step with no accumulation, no per-row
/// bias and no activation other than a clamp (or ReLU), the common one of
/// convolutions and linear layers, which the kernels run with the bias
/// loaded once per tile rather than per row.
#[cfg(kiln_x86_64)]
pub(crate) struct PlainStore<'a> {
    /// The tile's `cols` elements of a per-column bias.
    pub(crate) col_bias: Option<&'a [f32]>,
    pub(crate) clamp: Option<(f32, f32)>,
    /// The residual from the tile's first element, and its row stride.
    pub(crate) residual: Option<(&'a [f32], usize)>,
    pub(crate) residual_first: bool,
}

#[cfg(kiln_x86_64)]
impl<'a> VectorStore<'a> {
    /// This store step as a [`PlainStore`] for a tile of `rows` rows, if it is one.
    #[inline]
    pub(crate) fn plain(&self, rows: usize) -> Option<PlainStore<'a>> {
        if self.accumulate || self.activation.is_some() || matches!(self.bias, Bias::PerRow(_)) || rows == 0 {
            return None;
        }
        let (r, c, cols) = (self.row0, self.col0, self.cols);
        Some(PlainStore {
            col_bias: match self.bias {
                Bias::PerCol(b) => Some(&b[c..][..cols]),
                _ => None,
            },
            clamp: self.clamp,
            residual: self.residual.map(|(res, ld)| (&res[r * ld + c..][..(rows - 1) * ld + cols], ld)),
            residual_first: self.residual_first,
        })
    }

    /// Row `i`'s bias and residual.
    #[inline]
    pub(crate) fn row(&self, i: usize) -> RowAddends<'a> {
        let (r, c) = (self.row0 + i, self.col0);
        RowAddends {
            bias: match self.bias {
                Bias::PerRow(b) => Some(b[r]),
                _ => None,
            },
            col_bias: match self.bias {
                Bias::PerCol(b) => Some(&b[c..][..self.cols]),
                _ => None,
            },
            residual: self.residual.map(|(res, ld)| &res[r * ld + c..][..self.cols]),
        }
    }
}

#[cfg(kiln_x86_64)]
impl<'a> Tile<'a> {
    /// The vector store step for a tile of at most `mr` rows (the kernel
    /// stores `self.rows` of them) and `nr` columns (a partial vector
    /// masked) whose combine and
    /// epilogue it covers (overwrite or accumulate; no scale; bias,
    /// residual, ReLU, clamp, or an activation the kernel computes in
    /// registers); None sends the tile to [`Tile::store`].
    pub(crate) fn vector_store(&self, mr: usize, nr: usize) -> Option<VectorStore<'a>> {
        let e = self.epilogue;
        let accumulate = match self.combine {
            Combine::Overwrite => false,
            Combine::Accumulate => true,
            Combine::Scale(_) => return None,
        };
        if self.rows > mr || self.cols == 0 || self.cols > nr || e.scale != 1.0 {
            return None;
        }
        let (clamp, activation) = match e.activation {
            None => (None, None),
            Some(a) => match a.run {
                ActivationKernel::Clamp(lo, hi) => (Some((lo, hi)), None),
                ActivationKernel::Unary(_) if a.activation == Activation::Relu => (Some((0.0, f32::INFINITY)), None),
                ActivationKernel::Unary(_)
                | ActivationKernel::MulSigmoid(_)
                | ActivationKernel::Hardswish
                | ActivationKernel::GeluTanhChain(_) => (None, Some(a.in_registers?)),
            },
        };
        Some(VectorStore {
            accumulate,
            clamp,
            activation,
            residual_first: e.residual_first,
            bias: e.bias,
            residual: e.residual,
            row0: self.row0,
            col0: self.col0,
            cols: self.cols,
        })
    }
}

/// Where B's elements live: `b[p*ldb + j]`, or `b[j*ldb + p]` when transposed.
#[derive(Copy, Clone)]
pub(crate) struct BLayout {
    ld: usize,
    transposed: bool,
}

/// C[m×n] = A[m×k] · B[k×n] + beta·C, all row-major with leading dimensions.
/// `transposed_b` reads B as its transpose stored n×k (i.e. computes A·Bᵀ).
/// `beta == 0` overwrites C without reading it (so stale NaNs cannot leak).
/// Runs the microkernel of `cx`'s kernel table over `cx`'s threads.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    transposed_b: bool,
    beta: f32,
    cx: &mut Context,
) -> Result<()> {
    check_operands(m, n, k, a.len(), lda, b.len(), ldb, c.len(), ldc, transposed_b)?;
    gemm_f32_packed(cx.table, m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta, &mut cx.scratch.pack);
    Ok(())
}

/// [`gemm_f32`] with B already packed ([`PackedB`]): C = A · B + beta·C.
/// B's packing must be the one `cx`'s table runs ([`PackedB::fits`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_prepacked(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    beta: f32,
    cx: &mut Context,
) -> Result<()> {
    gemm_prepacked_fused(cx.table, m, a, lda, b, c, ldc, beta, Epilogue::default(), &mut cx.scratch.pack)
}

/// C = A · B + beta·C then `epilogue`, with B packed; checks every operand.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_prepacked_fused(
    table: &KernelTable,
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    beta: f32,
    epilogue: Epilogue<'_>,
    pack: &mut PackBuffers,
) -> Result<()> {
    let (n, k) = (b.n, b.k);
    if !b.fits(table) {
        return Err(shape_err(
            "gemm",
            format!("B was packed for `{}`, but this context runs `{}`", b.variant, table.gemm.variant),
        ));
    }
    // B is checked at packing: give the checker a B that trivially fits.
    check_operands(m, n, k, a.len(), lda, k * n, n, c.len(), ldc, false)?;
    check_epilogue(&epilogue, m, n)?;
    run_gemm(table, m, n, k, ASource::Strided { a, lda }, BSource::Packed(b), c, ldc, beta, epilogue, pack);
    Ok(())
}

/// Checks that an epilogue's bias and residual cover an m×n C.
fn check_epilogue(e: &Epilogue<'_>, m: usize, n: usize) -> Result<()> {
    let bias_ok = match e.bias {
        Bias::None => true,
        Bias::PerRow(b) => b.len() >= m,
        Bias::PerCol(b) => b.len() >= n,
    };
    let residual_ok = match e.residual {
        None => true,
        Some((r, ld)) => {
            m == 0
                || n == 0
                || (ld >= n && (m - 1).checked_mul(ld).and_then(|v| v.checked_add(n)).is_some_and(|v| v <= r.len()))
        }
    };
    if !bias_ok || !residual_ok {
        return Err(shape_err("gemm", format!("bias or residual too small for a {m}x{n} result")));
    }
    Ok(())
}

/// Checks that every addressed element is inside its slice.
#[allow(clippy::too_many_arguments)]
fn check_operands(
    m: usize,
    n: usize,
    k: usize,
    a: usize,
    lda: usize,
    b: usize,
    ldb: usize,
    c: usize,
    ldc: usize,
    tb: bool,
) -> Result<()> {
    let (br, bc) = if tb { (n, k) } else { (k, n) };
    let ok = needed(m, k, lda).is_some_and(|v| v <= a)
        && needed(br, bc, ldb).is_some_and(|v| v <= b)
        && needed(m, n, ldc).is_some_and(|v| v <= c);
    if !ok {
        return Err(shape_err("gemm", format!("operands too small or leading dims too short for m={m} n={n} k={k}")));
    }
    Ok(())
}

/// Elements a `rows×cols` matrix with leading dimension `ld` spans.
fn needed(rows: usize, cols: usize, ld: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        Some(0)
    } else if ld < cols {
        None
    } else {
        (rows - 1).checked_mul(ld)?.checked_add(cols)
    }
}

/// [`gemm_f32`] for callers that already validated the operands and hold the
/// packing buffers separately from their own scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32_packed(
    table: &KernelTable,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    transposed_b: bool,
    beta: f32,
    pack: &mut PackBuffers,
) {
    let epilogue = Epilogue::default();
    gemm_f32_fused(table, m, n, k, a, lda, b, ldb, c, ldc, transposed_b, beta, epilogue, pack);
}

/// [`gemm_f32_packed`] with an epilogue applied to every element of C once
/// its sum is complete: C = beta·C + A·B, then the epilogue.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32_fused(
    table: &KernelTable,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    transposed_b: bool,
    beta: f32,
    epilogue: Epilogue<'_>,
    pack: &mut PackBuffers,
) {
    let b = BSource::strided(b, ldb, transposed_b);
    run_gemm(table, m, n, k, ASource::Strided { a, lda }, b, c, ldc, beta, epilogue, pack);
}

/// The shared body of every GEMM entry point (operands already checked).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_gemm(
    table: &KernelTable,
    m: usize,
    n: usize,
    k: usize,
    a: ASource<'_>,
    b: BSource<'_>,
    c: &mut [f32],
    ldc: usize,
    beta: f32,
    epilogue: Epilogue<'_>,
    pack: &mut PackBuffers,
) {
    if m == 0 || n == 0 {
        return;
    }
    // Every tile stays inside C (callers checked; a bug here must not write
    // out of bounds through the tiles' raw pointers).
    assert!(needed(m, n, ldc).is_some_and(|v| v <= c.len()), "gemm: C too small");
    let combine = match beta {
        0.0 => Combine::Overwrite,
        1.0 => Combine::Accumulate,
        b => Combine::Scale(b),
    };
    if k == 0 {
        // Nothing to multiply: the store step over zero tiles does the rest.
        for i in 0..m {
            store_zero_row(&mut c[i * ldc..][..n], i, combine, epilogue);
        }
        return;
    }
    let problem = Problem { m, n, k, a, b, ldc, combine, epilogue };
    drive(&table.gemm, &problem, c, pack);
}

/// One row of an empty-K product: C = beta·C (or 0), then the epilogue.
fn store_zero_row(row: &mut [f32], i: usize, combine: Combine, epilogue: Epilogue<'_>) {
    const CHUNK: usize = 64;
    let zeros = [0f32; CHUNK];
    let n = row.len();
    for j in (0..n).step_by(CHUNK) {
        let cols = CHUNK.min(n - j);
        let part = &mut row[j..j + cols];
        // SAFETY: one row of `cols` elements of the exclusively borrowed `part`.
        let mut tile = unsafe { Tile::new(part.as_mut_ptr(), cols, 1, cols, i, j, combine, epilogue) };
        tile.store(&zeros, CHUNK);
    }
}

/// Where a GEMM's A comes from.
#[derive(Copy, Clone)]
pub(crate) enum ASource<'a> {
    /// A row-major matrix, packed block by block during the call.
    Strided { a: &'a [f32], lda: usize },
    /// Packed once beforehand.
    Packed(&'a PackedA),
}

/// Where a GEMM's B comes from.
#[derive(Copy, Clone)]
pub(crate) enum BSource<'a> {
    /// A strided matrix, packed slice by slice during the call.
    Strided { b: &'a [f32], bl: BLayout },
    /// Packed once beforehand.
    Packed(&'a PackedB),
    /// Columns `first..first + n` of a B packed once beforehand (`first` a
    /// multiple of its NR: whole strips).
    PackedColumns { b: &'a PackedB, first: usize },
    /// Never stored: `pack(pc, kc, c0, cols, strip)` writes B's rows
    /// `pc..pc+kc`, columns `c0..c0+cols` straight into one strip in the
    /// [`pack_b_strip`] layout (a convolution's implicit im2col).
    Implicit(&'a StripPacker<'a>),
}

/// Packs one B strip for [`BSource::Implicit`]: `(pc, kc, c0, cols, strip)`,
/// `strip` being `kc` rows of NR (its length / `kc`) columns.
pub(crate) type StripPacker<'a> = dyn Fn(usize, usize, usize, usize, &mut [f32]) + Sync + 'a;

impl<'a> BSource<'a> {
    /// `b[p*ldb + j]`, or `b[j*ldb + p]` when transposed.
    pub(crate) fn strided(b: &'a [f32], ldb: usize, transposed: bool) -> BSource<'a> {
        BSource::Strided { b, bl: BLayout { ld: ldb, transposed } }
    }

    /// A packed B and the first of its columns the GEMM reads.
    fn packed(&self) -> Option<(&'a PackedB, usize)> {
        match *self {
            BSource::Packed(b) => Some((b, 0)),
            BSource::PackedColumns { b, first } => Some((b, first)),
            _ => None,
        }
    }
}

/// One GEMM call's operands, minus C (borrowed mutably by the driver).
struct Problem<'a> {
    m: usize,
    n: usize,
    k: usize,
    a: ASource<'a>,
    b: BSource<'a>,
    ldc: usize,
    combine: Combine,
    epilogue: Epilogue<'a>,
}

/// Below this many multiply-adds (~20 µs of one core's work) a GEMM, and a
/// batch of matmuls or attention heads, runs on the calling thread: waking
/// the pool costs more than it saves (a 64³ GEMM ran 2× slower on two
/// threads of the loaded dev VM).
pub(crate) const PARALLEL_MIN_FLOPS: usize = 1 << 21;

/// A B of at least this many bytes, packed once (a weight), makes even a
/// GEMM of few multiply-adds worth the pool: a batch-1 linear layer
/// streams its weight from memory at ~20–25 GB/s a core on the dev VM (a
/// CNN classifier's 5 MB, 1280×1000, took 240 µs on one thread, for
/// 1.3 M multiply-adds, under [`PARALLEL_MIN_FLOPS`]), and its threads each
/// stream their own columns' strips. 1 MiB is ~40 µs from memory.
const PARALLEL_MIN_WEIGHT_BYTES: usize = 1 << 20;

/// The threads a GEMM of m×n×k over a B packed once (`b_packed`) runs on:
/// the calling thread alone when it has too little work for the pool
/// (neither [`PARALLEL_MIN_FLOPS`] multiply-adds nor a weight of
/// [`PARALLEL_MIN_WEIGHT_BYTES`] to stream).
fn gemm_threads(threads: Threads, m: usize, n: usize, k: usize, b_packed: bool) -> Threads {
    let weight_bytes = if b_packed { n.saturating_mul(k).saturating_mul(4) } else { 0 };
    if m.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN_FLOPS && weight_bytes < PARALLEL_MIN_WEIGHT_BYTES {
        Threads::single()
    } else {
        threads
    }
}

/// The blocked loop nest around one microkernel, at its tile shape. For each
/// (column block, K slice), B's slice is packed once (its strips in
/// parallel) and the tiles are shared out as (row block, column group) work
/// items: every element of C is computed by exactly one item, with the same
/// instructions in the same order whatever the thread count.
fn drive(ukr: &GemmUkr, p: &Problem, c: &mut [f32], pack: &mut PackBuffers) {
    // The one packing there is; another would choose its packers here.
    let Packing::KMajorPanels = ukr.packing;
    let (mr, nr) = (ukr.mr, ukr.nr);
    let (m, n, k) = (p.m, p.n, p.k);
    let threads = gemm_threads(pack.threads, m, n, k, p.b.packed().is_some());
    let (mc_block, nc_block) = blocks(ukr);
    let (mut a_len, b_len) = pack_lengths(ukr, m, n, k, p.b.packed().is_some());
    // A row-major A is read in place by the direct kernel, if there is one.
    let direct = match (p.a, ukr.direct) {
        (ASource::Strided { a, lda }, Some(kernel)) => Some((a, lda, kernel)),
        _ => None,
    };
    if matches!(p.a, ASource::Packed(_)) || direct.is_some() {
        a_len = 0;
    }
    let out = SharedMut(c.as_mut_ptr());
    let row_blocks = m.div_ceil(mc_block);
    if let (Some((b, first)), Some((a, lda, kernel))) = (p.b.packed(), direct) {
        // Nothing to pack: the whole product is one job, with no wait
        // between K slices. Each item owns a (row block, column group)
        // rectangle of C and runs the K slices over it in order: the same
        // tiles, sums and order as the sliced loop below.
        let strips = n.div_ceil(nr);
        let split = DirectSplit::new(m, mr, mc_block, strips, threads.count());
        threads.for_each(split.items(), |item| {
            let (ic, mc, strips) = split.item(item);
            let rect = Rect { ic, mc, jc: 0, nc: n, strips, pc: 0, kc: k, combine: p.combine, epilogue: p.epilogue };
            direct_k_slices(ukr, kernel, a, lda, b, first, &rect, out, p.ldc);
        });
        return;
    }
    let (a_bufs, bpack, b_packs) = pack.reserve(threads.count(), a_len, b_len);
    for jc in (0..n).step_by(nc_block) {
        let nc = nc_block.min(n - jc);
        let strips = nc.div_ceil(nr);
        let groups = column_groups(row_blocks, strips, threads.count(), if direct.is_some() { 1 } else { 4 });
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let bpanel: &[f32] = match p.b {
                BSource::Strided { b, bl } => {
                    let panel = &mut bpack[..strips * kc * nr];
                    threads.for_each_chunk(panel, kc * nr, |s, strip| {
                        let c0 = jc + s * nr;
                        pack_b_strip(nr, b, bl, pc, kc, c0, nr.min(jc + nc - c0), strip);
                    });
                    *b_packs += 1;
                    panel
                }
                BSource::Implicit(pack) => {
                    let panel = &mut bpack[..strips * kc * nr];
                    threads.for_each_chunk(panel, kc * nr, |s, strip| {
                        let c0 = jc + s * nr;
                        pack(pc, kc, c0, nr.min(jc + nc - c0), strip);
                    });
                    *b_packs += 1;
                    panel
                }
                BSource::Packed(packed) => packed.panel(pc, jc),
                BSource::PackedColumns { b, first } => b.panel(pc, first + jc),
            };
            // The first K slice applies beta, later ones accumulate; the
            // epilogue runs once a sum is complete, on the last slice.
            let combine = if pc == 0 { p.combine } else { Combine::Accumulate };
            let epilogue = if pc + kc == k { p.epilogue } else { Epilogue::default() };
            threads.for_each(row_blocks * groups, |item| {
                let (ic, group) = ((item / groups) * mc_block, item % groups);
                let mc = mc_block.min(m - ic);
                let group_strips = strips_of_group(group, groups, strips);
                if let Some((a, lda, kernel)) = direct {
                    let rect = Rect { ic, mc, jc, nc, strips: group_strips, pc, kc, combine, epilogue };
                    direct_rect(ukr, kernel, a, lda, bpanel, &rect, out, p.ldc);
                    return;
                }
                let mut guard = None;
                let apack: &[f32] = match p.a {
                    ASource::Packed(packed) => packed.panel(pc, ic),
                    ASource::Strided { a, lda } => {
                        let buf = guard.insert(a_bufs[threads.index()].lock().unwrap_or_else(|e| e.into_inner()));
                        let apack = &mut buf[..mc.div_ceil(mr) * mr * kc];
                        pack_a(mr, a, lda, ic, mc, pc, kc, apack);
                        apack
                    }
                };
                for s in group_strips {
                    let jr = s * nr;
                    let bstrip = &bpanel[s * kc * nr..][..kc * nr];
                    for ir in (0..mc).step_by(mr) {
                        let astrip = &apack[(ir / mr) * kc * mr..][..kc * mr];
                        let (row0, col0) = (ic + ir, jc + jr);
                        let (rows, cols) = (mr.min(mc - ir), nr.min(nc - jr));
                        // SAFETY: `run_gemm` checked that C holds every
                        // (row0 + i) * ldc + col0 + j for i < rows, j < cols;
                        // work items and their tiles partition C, so no other
                        // thread touches these elements meanwhile.
                        let mut tile = unsafe {
                            let ptr = out.ptr().add(row0 * p.ldc + col0);
                            Tile::new(ptr, p.ldc, rows, cols, row0, col0, combine, epilogue)
                        };
                        (ukr.run)(kc, astrip, bstrip, &mut tile);
                    }
                }
            });
        }
    }
}

/// One term of [`gemm_sum_packed`]: rows `k0..k1` of the packed B times an
/// m×(k1 - k0) A read in place (`a[i*lda + p]`; a convolution's taps read
/// overlapping rows of one image, so `lda` may be less than `k1 - k0`).
#[derive(Copy, Clone)]
pub(crate) struct SumTerm<'a> {
    pub(crate) a: &'a [f32],
    pub(crate) lda: usize,
    pub(crate) k0: usize,
    pub(crate) k1: usize,
}

/// C = Σ A_t·B[k0_t..k1_t] over `term(t)`, t < `terms` (C m×n,
/// `c[i*ldc + j]`; B packed once), then `epilogue`, with the table's direct
/// kernel (A read in place, no packing at all): a convolution as one GEMM
/// per kernel tap (or row of taps). One parallel job: each item owns a
/// (row block, column group) rectangle of C and, tile by tile, runs every
/// term over the tile (cut where B's K slices end) while it is in L1; each
/// element is the same sum in the same order whatever the thread count.
/// False (C untouched) when the table has no direct kernel or `b` does not
/// fit it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_sum_packed<'a>(
    table: &KernelTable,
    m: usize,
    b: &PackedB,
    terms: usize,
    term: &(dyn Fn(usize) -> SumTerm<'a> + Sync),
    c: &mut [f32],
    ldc: usize,
    epilogue: Epilogue<'_>,
    threads: &Threads,
) -> bool {
    let ukr = &table.gemm;
    let Some(kernel) = ukr.direct else { return false };
    if terms == 0 || !b.fits(table) {
        return false;
    }
    let (n, nr) = (b.n, ukr.nr);
    if m == 0 || n == 0 {
        return true;
    }
    // Every tile and every row of A stays in bounds (callers size them; a
    // bug here must not reach memory through the tiles' raw pointers).
    assert!(needed(m, n, ldc).is_some_and(|v| v <= c.len()), "gemm sum: C too small");
    let mut depth = 0;
    for t in (0..terms).map(term) {
        assert!(t.k0 < t.k1 && t.k1 <= b.k, "gemm sum: rows {}..{} of a {}-row B", t.k0, t.k1, b.k);
        let view = AView { data: t.a, row_stride: t.lda, k_stride: 1 };
        assert!(view.covers(m, t.k1 - t.k0), "gemm sum: A too small");
        depth += t.k1 - t.k0;
    }
    let threads = if m * n * depth < PARALLEL_MIN_FLOPS { Threads::single() } else { *threads };
    let (mc_block, _) = blocks(ukr);
    let split = DirectSplit::new(m, ukr.mr, mc_block, n.div_ceil(nr), threads.count());
    let out = SharedMut(c.as_mut_ptr());
    let data: &[f32] = bytemuck::cast_slice(&b.lines);
    let npad = n.next_multiple_of(nr);
    threads.for_each(split.items(), |item| {
        let (ic, mc, group_strips) = split.item(item);
        for s in group_strips {
            let (col0, cols) = (s * nr, nr.min(n - s * nr));
            for ir in (ic..ic + mc).step_by(ukr.mr) {
                let rows = ukr.mr.min(ic + mc - ir);
                let mut first = true;
                for t in 0..terms {
                    let SumTerm { a, lda, k0, k1 } = term(t);
                    // The term's rows of B, cut where B's K slices end.
                    let mut p = k0;
                    while p < k1 {
                        let pc = p / b.kc * b.kc;
                        let slice = b.kc.min(b.k - pc);
                        let kc = k1.min(pc + slice) - p;
                        let bstrip = &data[pc * npad + s * slice * nr + (p - pc) * nr..][..kc * nr];
                        let view = AView { data: &a[ir * lda + (p - k0)..], row_stride: lda, k_stride: 1 };
                        let last = t + 1 == terms && p + kc == k1;
                        let combine = if first { Combine::Overwrite } else { Combine::Accumulate };
                        let epilogue = if last { epilogue } else { Epilogue::default() };
                        // SAFETY: C holds every (ir + i) * ldc + col0 + j for
                        // i < rows, j < cols (checked above); work items'
                        // rectangles partition C, so no other thread touches
                        // these elements meanwhile.
                        let mut tile = unsafe {
                            let ptr = out.ptr().add(ir * ldc + col0);
                            Tile::new(ptr, ldc, rows, cols, ir, col0, combine, epilogue)
                        };
                        kernel(kc, view, bstrip, &mut tile);
                        first = false;
                        p += kc;
                    }
                }
            }
        }
    });
    true
}

/// The most column ranges [`gemm_split_packed`] writes (the plan's
/// `linear_fused` output limit): their bounds live in fixed arrays.
pub(crate) const SPLIT_MAX: usize = kiln_isa::opcode::LINEAR_SPLIT_MAX as usize;

/// One output of [`gemm_split_packed`]: `cols` columns of the product,
/// element (i, j) at `c[i*cols + j]`.
pub(crate) struct SplitOut<'a> {
    pub(crate) c: &'a mut [f32],
    pub(crate) cols: usize,
}

/// C = A·B then `epilogue` (a per-column bias over all of B's N columns, an
/// activation; no residual), B packed once, with C's columns cut into
/// consecutive ranges that each go to their own output: linear layers that
/// read the same A as one GEMM. One parallel job over the (row block,
/// column group) items of the whole product, as [`drive`]'s direct path
/// shares them out; an item runs the direct kernel over its strips of each
/// output in turn. A range starts on a strip (every width but the last is a
/// multiple of NR), so each strip is one output's columns (the last one's
/// zero padding, or the next output's columns, computed and not stored):
/// every element is the same sum, in the same order, as a GEMM of that
/// output alone computes, whatever the thread count. A is read in place
/// (`a[i*lda + p]`, m rows). False (nothing written) when the table has no
/// direct kernel, `b` does not fit it, or the widths are not so: the caller
/// computes each range on its own.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_split_packed(
    table: &KernelTable,
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    outs: &mut [SplitOut<'_>],
    epilogue: Epilogue<'_>,
    pack: &mut PackBuffers,
) -> bool {
    let ukr = &table.gemm;
    let (n, k, nr) = (b.n, b.k, ukr.nr);
    let widths_ok = outs.split_last().is_some_and(|(_, init)| init.iter().all(|o| o.cols % nr == 0));
    let total = outs.iter().map(|o| o.cols).sum::<usize>();
    let plain = epilogue.residual.is_none() && !matches!(epilogue.bias, Bias::PerRow(_));
    if !b.fits(table) || outs.len() > SPLIT_MAX || !widths_ok || total != n || !plain {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    // Every tile stays inside its output and every row of A in bounds
    // (callers size them; a bug here must not reach memory through the
    // tiles' raw pointers).
    assert!(outs.iter().all(|o| o.c.len() >= m * o.cols), "gemm split: an output is too small");
    assert!(AView { data: a, row_stride: lda, k_stride: 1 }.covers(m, k), "gemm split: A too small");
    assert!(matches!(epilogue.bias, Bias::PerCol(b) if b.len() >= n) || matches!(epilogue.bias, Bias::None));
    // Each output's first column and pointer.
    let mut starts = [0usize; SPLIT_MAX];
    let mut ptrs = [SharedMut(std::ptr::null_mut::<f32>()); SPLIT_MAX];
    let mut at = 0;
    for (o, out) in outs.iter_mut().enumerate() {
        starts[o] = at;
        ptrs[o] = SharedMut(out.c.as_mut_ptr());
        at += out.cols;
    }
    let widths: [usize; SPLIT_MAX] = std::array::from_fn(|o| outs.get(o).map_or(0, |out| out.cols));
    let count = outs.len();
    // Bias of output `o`: its columns of the whole one.
    let bias_of = |o: usize| match epilogue.bias {
        Bias::PerCol(bias) => Bias::PerCol(&bias[starts[o]..starts[o] + widths[o]]),
        other => other,
    };
    let Some(kernel) = ukr.direct else {
        // A kernel that packs A (no direct form): a GEMM per output over its
        // strips of B, as that output's own GEMM would run.
        for (o, out) in outs.iter_mut().enumerate() {
            let bo = BSource::PackedColumns { b, first: starts[o] };
            let e = Epilogue { bias: bias_of(o), ..epilogue };
            run_gemm(table, m, out.cols, k, ASource::Strided { a, lda }, bo, out.c, out.cols, 0.0, e, pack);
        }
        return true;
    };
    let threads = gemm_threads(pack.threads, m, n, k, true);
    let (mc_block, _) = blocks(ukr);
    let split = DirectSplit::new(m, ukr.mr, mc_block, n.div_ceil(nr), threads.count());
    threads.for_each(split.items(), |item| {
        let (ic, mc, group) = split.item(item);
        for o in 0..count {
            let (start, cols) = (starts[o], widths[o]);
            let first = start / nr;
            let (lo, hi) = (group.start.max(first), group.end.min(first + cols.div_ceil(nr)));
            if lo >= hi {
                continue;
            }
            let epilogue = Epilogue { bias: bias_of(o), ..epilogue };
            let strips = lo - first..hi - first;
            let rect = Rect { ic, mc, jc: 0, nc: cols, strips, pc: 0, kc: k, combine: Combine::Overwrite, epilogue };
            direct_k_slices(ukr, kernel, a, lda, b, start, &rect, ptrs[o], cols);
        }
    });
    true
}

/// One work item's part of a K slice: rows `ic..ic + mc` of C, the NR-wide
/// `strips` of the column block at `jc` (`nc` wide), K slice `pc..pc + kc`.
struct Rect<'a> {
    ic: usize,
    mc: usize,
    jc: usize,
    nc: usize,
    strips: std::ops::Range<usize>,
    pc: usize,
    kc: usize,
    combine: Combine,
    epilogue: Epilogue<'a>,
}

/// Runs a direct kernel over `r`'s rows and strips (`r.pc..r.pc + r.kc`
/// the whole K) one K slice after another, B's columns from `first` of the
/// packed `b`: the first slice combines by `r.combine`, later ones
/// accumulate, and `r.epilogue` applies on the last one only — the same
/// sums in the same order as the sliced loop of [`drive`].
#[allow(clippy::too_many_arguments)]
fn direct_k_slices(
    ukr: &GemmUkr,
    kernel: DirectKernel,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    first: usize,
    r: &Rect<'_>,
    out: SharedMut<f32>,
    ldc: usize,
) {
    let end = r.pc + r.kc;
    for pc in (r.pc..end).step_by(KC) {
        let kc = KC.min(end - pc);
        let combine = if pc == r.pc { r.combine } else { Combine::Accumulate };
        let epilogue = if pc + kc == end { r.epilogue } else { Epilogue::default() };
        let slice = Rect { strips: r.strips.clone(), pc, kc, combine, epilogue, ..*r };
        direct_rect(ukr, kernel, a, lda, b.panel(pc, first), &slice, out, ldc);
    }
}

/// Runs a direct kernel over `rect`, A read in place (`a`, `lda`), B from
/// the packed strips of the column block (`bpanel`): full MR-row tiles strip
/// by strip, then the last rows over every strip of the rectangle at once.
#[allow(clippy::too_many_arguments)]
fn direct_rect(
    ukr: &GemmUkr,
    kernel: DirectKernel,
    a: &[f32],
    lda: usize,
    bpanel: &[f32],
    r: &Rect<'_>,
    out: SharedMut<f32>,
    ldc: usize,
) {
    let (mr, nr, kc) = (ukr.mr, ukr.nr, r.kc);
    let view = |row: usize| AView { data: &a[row * lda + r.pc..], row_stride: lda, k_stride: 1 };
    // SAFETY: `run_gemm` checked that C holds every (row0 + i) * ldc + col0
    // + j for i < rows, j < cols of every tile; work items' rectangles
    // partition C, so no other thread touches these elements meanwhile.
    let tile = |row0: usize, col0: usize, rows: usize, cols: usize| unsafe {
        let ptr = out.ptr().add(row0 * ldc + col0);
        Tile::new(ptr, ldc, rows, cols, row0, col0, r.combine, r.epilogue)
    };
    let full = r.mc / mr * mr;
    let row_tiles = full / mr;
    for s in r.strips.clone() {
        let (jr, bstrip) = (s * nr, &bpanel[s * kc * nr..][..kc * nr]);
        // The item's next strip, a part per row tile, fetched while this one
        // runs: a model's packed weights come from memory once per run, and
        // each strip's first pass waited for them (Llama's projections ran
        // at 200 GFLOP/s cycling through their weights, 250 with them in cache).
        let next = if s + 1 < r.strips.end { &bpanel[(s + 1) * kc * nr..][..kc * nr] } else { &[] };
        // On the item's first strip, when A's rows are one contiguous run
        // (a 1×1 convolution's pixels, K in one slice) and the item's B
        // strips are small (≤ 64 KiB: they stay in cache from item to item,
        // unlike a transformer's weights), each row tile fetches the next
        // one's rows instead: they come from memory once per run too (a
        // short-K layer's input, the previous layer's output, is megabytes
        // at 112² and 56²), and the later strips find them in cache.
        let next_rows = s == r.strips.start && lda == kc && r.pc == 0 && kc * nr * r.strips.len() <= 1 << 14;
        for (t, ir) in (0..full).step_by(mr).enumerate() {
            let mut tile = tile(r.ic + ir, r.jc + jr, mr, nr.min(r.nc - jr));
            tile.prefetch = if next_rows {
                let from = ((r.ic + ir + mr) * lda).min(a.len());
                &a[from..(from + mr * lda).min(a.len())]
            } else {
                &next[t * next.len() / row_tiles..(t + 1) * next.len() / row_tiles]
            };
            kernel(kc, view(r.ic + ir), bstrip, &mut tile);
        }
    }
    if full < r.mc && !r.strips.is_empty() {
        // The last rows (all of a skinny GEMM's) take every strip at once.
        let (s0, s1) = (r.strips.start, r.strips.end);
        let b = &bpanel[s0 * kc * nr..s1 * kc * nr];
        let cols = (s1 * nr).min(r.nc) - s0 * nr;
        kernel(kc, view(r.ic + full), b, &mut tile(r.ic + full, r.jc + s0 * nr, r.mc - full, cols));
    }
}

/// The row and column block sizes at a microkernel's tile shape.
fn blocks(ukr: &GemmUkr) -> (usize, usize) {
    ((MC / ukr.mr).max(1) * ukr.mr, (NC / ukr.nr).max(1) * ukr.nr)
}

/// The A block and B slice lengths [`drive`] packs for an m×n×k product.
pub(crate) fn pack_lengths(ukr: &GemmUkr, m: usize, n: usize, k: usize, b_prepacked: bool) -> (usize, usize) {
    let (mc_block, nc_block) = blocks(ukr);
    let kc_max = KC.min(k);
    let a_len = if ukr.direct.is_some() { 0 } else { mc_block.min(m.next_multiple_of(ukr.mr)) * kc_max };
    let b_len = if b_prepacked { 0 } else { kc_max * nc_block.min(n.next_multiple_of(ukr.nr)) };
    (a_len, b_len)
}

/// How many groups a column block's `strips` are cut into: one when the row
/// blocks alone keep every thread busy, otherwise enough for about four
/// items per thread (skinny GEMMs), but about `min_strips` strips a
/// group or more (four when each item packs its A block, so that the packing stays
/// cheap next to its multiply; one for a direct kernel, which packs
/// nothing). Which item computes a tile never changes its arithmetic.
fn column_groups(row_blocks: usize, strips: usize, threads: usize, min_strips: usize) -> usize {
    if threads == 1 || row_blocks >= 4 * threads {
        return 1;
    }
    (4 * threads).div_ceil(row_blocks).min(strips.div_ceil(min_strips)).max(1)
}

/// How a direct kernel's product (nothing packed per item) is cut into
/// (row block, column group) work items: [`column_groups`] over `mc`-row
/// blocks, unless the strips are too few to give every thread about four
/// items (a 7×7 layer's 49 pixels are one row block; with 160 output
/// channels, five strips made five items, three against two on two
/// threads). Then the rows are cut finer, into runs of whole `mr`-row
/// tiles as even as the tiles allow. Every cut falls between the tiles of
/// the `mc`-row blocks, so each element is computed by the same tile, with
/// the same operations, whatever the thread count.
#[derive(Copy, Clone)]
struct DirectSplit {
    m: usize,
    mr: usize,
    /// Rows per block, or 0: blocks of `tiles / row_blocks` tiles.
    mc_block: usize,
    tiles: usize,
    row_blocks: usize,
    groups: usize,
    strips: usize,
}

impl DirectSplit {
    fn new(m: usize, mr: usize, mc_block: usize, strips: usize, threads: usize) -> DirectSplit {
        let row_blocks = m.div_ceil(mc_block);
        let groups = column_groups(row_blocks, strips, threads, 1);
        let tiles = m.div_ceil(mr);
        let uniform = DirectSplit { m, mr, mc_block, tiles, row_blocks, groups, strips };
        let want = 4 * threads;
        if threads == 1 || row_blocks * groups >= want {
            return uniform;
        }
        let row_blocks = want.div_ceil(groups).min(tiles);
        if row_blocks <= uniform.row_blocks {
            return uniform;
        }
        DirectSplit { mc_block: 0, row_blocks, ..uniform }
    }

    fn items(&self) -> usize {
        self.row_blocks * self.groups
    }

    /// Item `item`'s first row, row count and strips.
    fn item(&self, item: usize) -> (usize, usize, std::ops::Range<usize>) {
        let (block, group) = (item / self.groups, item % self.groups);
        let (ic, end) = if self.mc_block > 0 {
            let ic = block * self.mc_block;
            (ic, (ic + self.mc_block).min(self.m))
        } else {
            let tile = |b: usize| b * self.tiles / self.row_blocks * self.mr;
            (tile(block), tile(block + 1).min(self.m))
        };
        (ic, end - ic, strips_of_group(group, self.groups, self.strips))
    }
}

/// The strips of column group `group` of `groups`: as even as whole strips
/// allow (sizes differ by at most one), so that no item is the tail that
/// the other threads wait for (Llama's 43-strip gate/up projections were
/// seven groups of 6 and one of 1 at two threads: 24 against 19 strips).
fn strips_of_group(group: usize, groups: usize, strips: usize) -> std::ops::Range<usize> {
    group * strips / groups..(group + 1) * strips / groups
}

/// Packs rows `ic..ic+mc`, columns `pc..pc+kc` of A into `mr`-tall strips
/// laid out k-major (`strip[p*mr + i]`), zero-padding the last strip.
#[allow(clippy::too_many_arguments)]
fn pack_a(mr: usize, a: &[f32], lda: usize, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [f32]) {
    for (s, strip) in out.chunks_exact_mut(kc * mr).take(mc.div_ceil(mr)).enumerate() {
        let r0 = ic + s * mr;
        let rows = mr.min(ic + mc - r0);
        for i in 0..mr {
            if i < rows {
                let row = &a[(r0 + i) * lda + pc..][..kc];
                for (p, &v) in row.iter().enumerate() {
                    strip[p * mr + i] = v;
                }
            } else {
                for p in 0..kc {
                    strip[p * mr + i] = 0.0;
                }
            }
        }
    }
}

/// Packs B rows `pc..pc+kc`, columns `c0..c0+cols` (`cols <= nr`) into one
/// `nr`-wide strip laid out k-major (`strip[p*nr + j]`), zero-padded.
#[allow(clippy::too_many_arguments)]
fn pack_b_strip(nr: usize, b: &[f32], bl: BLayout, pc: usize, kc: usize, c0: usize, cols: usize, strip: &mut [f32]) {
    if bl.transposed {
        // Bᵀ stored n×k: each output column is a contiguous row of b.
        for j in 0..nr {
            if j < cols {
                let col = &b[(c0 + j) * bl.ld + pc..][..kc];
                for (p, &v) in col.iter().enumerate() {
                    strip[p * nr + j] = v;
                }
            } else {
                for p in 0..kc {
                    strip[p * nr + j] = 0.0;
                }
            }
        }
    } else {
        for p in 0..kc {
            let dst = &mut strip[p * nr..p * nr + nr];
            let src = &b[(pc + p) * bl.ld + c0..][..cols];
            dst[..cols].copy_from_slice(src);
            dst[cols..].fill(0.0);
        }
    }
}

/// 64 bytes of f32s: the unit a [`PackedB`] is allocated in, so that its
/// strips start on cache-line boundaries.
#[repr(C, align(64))]
#[derive(Copy, Clone, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([f32; 16]);

/// A B operand (typically a constant weight) packed once into the strips a
/// kernel table's microkernel reads: for each KC-deep slice of K, every
/// NR-wide strip of N, k-major and zero-padded, 64-byte aligned. A GEMM
/// with a packed B does no B packing at all.
#[derive(Clone)]
pub struct PackedB {
    k: usize,
    n: usize,
    nr: usize,
    kc: usize,
    variant: &'static str,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedB({}x{} for {})", self.k, self.n, self.variant)
    }
}

impl PackedB {
    /// Packs the k×n matrix B (`b[p*ldb + j]`, or `b[j*ldb + p]` when
    /// `transposed`: a linear layer's `[N, K]` weight) for `table`'s
    /// microkernel.
    pub fn new(table: &KernelTable, k: usize, n: usize, b: &[f32], ldb: usize, transposed: bool) -> Result<PackedB> {
        let (rows, cols) = if transposed { (n, k) } else { (k, n) };
        if needed(rows, cols, ldb).is_none_or(|v| v > b.len()) {
            return Err(shape_err("pack_b", format!("{} elements cannot hold a {k}x{n} B (ld {ldb})", b.len())));
        }
        let nr = table.gemm.nr;
        let npad = n.next_multiple_of(nr);
        let total = k.checked_mul(npad).ok_or_else(|| shape_err("pack_b", "B too large"))?;
        let mut lines = vec![Line::default(); total.div_ceil(16)];
        let data: &mut [f32] = bytemuck::cast_slice_mut(&mut lines);
        let bl = BLayout { ld: ldb, transposed };
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let slice = &mut data[pc * npad..][..kc * npad];
            for (s, strip) in slice.chunks_exact_mut(kc * nr).enumerate() {
                let c0 = s * nr;
                pack_b_strip(nr, b, bl, pc, kc, c0, nr.min(n - c0), strip);
            }
        }
        Ok(PackedB { k, n, nr, kc: KC, variant: table.gemm.variant, lines })
    }

    /// B's rows (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// B's columns (the GEMM's N).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Bytes the packed copy takes.
    pub fn bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
    }

    /// Whether `table`'s microkernel reads this packing.
    pub fn fits(&self, table: &KernelTable) -> bool {
        self.variant == table.gemm.variant && self.nr == table.gemm.nr && self.kc == KC
    }

    /// The packed strips of K slice `pc..` from column `jc` (a multiple of
    /// NR) on.
    fn panel(&self, pc: usize, jc: usize) -> &[f32] {
        let data: &[f32] = bytemuck::cast_slice(&self.lines);
        let kc = self.kc.min(self.k - pc);
        &data[pc * self.n.next_multiple_of(self.nr) + (jc / self.nr) * kc * self.nr..]
    }
}

/// The generic microkernel: fixed-size arrays let the compiler keep `acc` in
/// registers and vectorise the NR-wide row updates.
fn microkernel_generic(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let mut acc = [[0f32; NR]; MR];
    for (a, b) in astrip.chunks_exact(MR).zip(bstrip.chunks_exact(NR)).take(kc) {
        // chunks_exact guarantees the lengths; the conversion just gives the
        // compiler the fixed sizes.
        let (Ok(a), Ok(b)) = (<&[f32; MR]>::try_from(a), <&[f32; NR]>::try_from(b)) else { continue };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += a[i] * b[j];
            }
        }
    }
    tile.store(acc.as_flattened(), NR);
}

/// An A operand (a convolution's weight, `[M, K]` row-major) packed once
/// into the MR-tall strips a kernel table's microkernel reads: for each
/// KC-deep slice of K, every strip of M, k-major and zero-padded, 64-byte
/// aligned.
#[derive(Clone)]
pub struct PackedA {
    m: usize,
    k: usize,
    mr: usize,
    kc: usize,
    variant: &'static str,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedA {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedA({}x{} for {})", self.m, self.k, self.variant)
    }
}

impl PackedA {
    /// Packs the row-major m×k matrix A (leading dimension `lda`) for
    /// `table`'s microkernel.
    pub fn new(table: &KernelTable, m: usize, k: usize, a: &[f32], lda: usize) -> Result<PackedA> {
        if needed(m, k, lda).is_none_or(|v| v > a.len()) {
            return Err(shape_err("pack_a", format!("{} elements cannot hold a {m}x{k} A (ld {lda})", a.len())));
        }
        let mr = table.gemm.mr;
        let mpad = m.next_multiple_of(mr);
        let total = k.checked_mul(mpad).ok_or_else(|| shape_err("pack_a", "A too large"))?;
        let mut lines = vec![Line::default(); total.div_ceil(16)];
        let data: &mut [f32] = bytemuck::cast_slice_mut(&mut lines);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_a(mr, a, lda, 0, m, pc, kc, &mut data[pc * mpad..][..kc * mpad]);
        }
        Ok(PackedA { m, k, mr, kc: KC, variant: table.gemm.variant, lines })
    }

    /// A's rows (the GEMM's M).
    pub fn m(&self) -> usize {
        self.m
    }

    /// A's columns (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether `table`'s microkernel reads this packing.
    pub fn fits(&self, table: &KernelTable) -> bool {
        self.variant == table.gemm.variant && self.mr == table.gemm.mr && self.kc == KC
    }

    /// The packed strips of K slice `pc..` from row `ic` (a multiple of MR)
    /// on.
    fn panel(&self, pc: usize, ic: usize) -> &[f32] {
        let data: &[f32] = bytemuck::cast_slice(&self.lines);
        let kc = self.kc.min(self.k - pc);
        &data[pc * self.m.next_multiple_of(self.mr) + (ic / self.mr) * kc * self.mr..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Isa;

    /// Plain f64 loops: C = beta·C + A·B (+ bias per row or column).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        tb: bool,
        beta: f32,
        c0: &[f32],
        bias: Bias,
    ) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: f64 =
                    (0..k).map(|p| a[i * k + p] as f64 * if tb { b[j * k + p] } else { b[p * n + j] } as f64).sum();
                let bias = match bias {
                    Bias::None => 0.0,
                    Bias::PerRow(v) => v[i] as f64,
                    Bias::PerCol(v) => v[j] as f64,
                };
                c[i * n + j] = if beta == 0.0 { 0.0 } else { beta as f64 * c0[i * n + j] as f64 } + dot + bias;
            }
        }
        c
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        // Small deterministic pseudo-random values; no rng dependency needed.
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The fused epilogue (internal, so not reachable from kernels/tests):
    /// every table this CPU runs, against the f64 oracle, with a bias per row
    /// and per column, beta 0/1/0.5 (C starting as NaN for beta 0), shapes
    /// with edge tiles and more than one K slice, and k = 0.
    #[test]
    fn epilogue_bias_matches_oracle_on_every_table() {
        for isa in Isa::ALL {
            let Some(table) = KernelTable::for_isa(isa) else {
                println!("skipping {isa}: not supported by this CPU");
                continue;
            };
            for (m, n, k) in [(1, 1, 1), (7, 17, 33), (13, 40, 600), (6, 16, 5), (5, 9, 0)] {
                let (a, b) = (data(m * k, 1), data(k * n, 2));
                let (rb, cb) = (data(m, 4), data(n, 5));
                for tb in [false, true] {
                    for beta in [0.0f32, 1.0, 0.5] {
                        for bias in [Bias::None, Bias::PerRow(&rb), Bias::PerCol(&cb)] {
                            let c0 = if beta == 0.0 { vec![f32::NAN; m * n] } else { data(m * n, 3) };
                            let mut c = c0.clone();
                            let ldb = if tb { k } else { n };
                            let epilogue = Epilogue::bias(bias);
                            let mut pack = PackBuffers::default();
                            gemm_f32_fused(table, m, n, k, &a, k, &b, ldb, &mut c, n, tb, beta, epilogue, &mut pack);
                            let want = naive(m, n, k, &a, &b, tb, beta, &c0, bias);
                            for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
                                let ok = (g as f64 - w).abs() <= 1e-5 * (k as f64 + 2.0);
                                assert!(ok, "{isa} {m}x{n}x{k} tb={tb} beta={beta} {bias:?} [{i}]: {g} vs {w}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The direct kernels (A read in place, any row count, several strips
    /// at a time) against the packed-A microkernel of the same table: bit
    /// for bit, with an epilogue the vector store step finishes (bias,
    /// residual, ReLU) and one it does not (scale), every row count up to
    /// two tiles, widths with partial strips and groups, two K slices.
    #[test]
    fn direct_kernels_match_packed_a_bit_for_bit() {
        for isa in Isa::ALL {
            let Some(table) = KernelTable::for_isa(isa) else { continue };
            if table.gemm.direct.is_none() {
                continue;
            }
            for m in 1..=2 * table.gemm.mr + 1 {
                for (n, k) in [(1, 3), (31, 1), (100, 600), (300, 17)] {
                    let (a, b) = (data(m * k, 1), data(k * n, 2));
                    let (bias, residual) = (data(n, 3), data(m * n, 4));
                    let relu = ActivationFn::new(table, Activation::Relu);
                    let full = Epilogue {
                        bias: Bias::PerCol(&bias),
                        activation: Some(relu),
                        residual: Some((&residual, n)),
                        ..Epilogue::default()
                    };
                    let scaled = Epilogue { scale: 0.5, ..Epilogue::default() };
                    for epilogue in [full, scaled] {
                        let packed = PackedB::new(table, k, n, &b, n, false).unwrap();
                        let packed_a = PackedA::new(table, m, k, &a, k).unwrap();
                        let mut pack = PackBuffers::default();
                        let (mut want, mut got) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                        let (bp, ap) = (BSource::Packed(&packed), ASource::Packed(&packed_a));
                        run_gemm(table, m, n, k, ap, bp, &mut want, n, 0.0, epilogue, &mut pack);
                        let strided = ASource::Strided { a: &a, lda: k };
                        run_gemm(table, m, n, k, strided, bp, &mut got, n, 0.0, epilogue, &mut pack);
                        let same = want.iter().zip(&got).all(|(w, g)| w.to_bits() == g.to_bits());
                        assert!(same, "{isa} {m}x{n}x{k}: direct differs from packed A");
                    }
                }
            }
        }
    }

    /// Tiles narrower than the microkernel's strip (N mod NR columns: a
    /// last strip of one vector, a partial vector through masked loads and
    /// stores) give, bit for bit, the full-width sums (B padded with zero
    /// columns, no epilogue) finished by the portable store step, and never
    /// write past their columns: every table, direct and packed A, beta 0 and
    /// 1, bias, residual on either side of a clamp or an activation the x86
    /// kernels apply in registers.
    #[test]
    fn narrow_tiles_match_full_width_sums_bit_for_bit() {
        const SENTINEL: f32 = 12345.0;
        let acts = [
            Activation::Clamp { min: Some(-0.25), max: Some(0.5) },
            Activation::Relu,
            Activation::MulSigmoid,
            Activation::Hardswish,
            Activation::Gelu,
        ];
        for isa in Isa::ALL {
            let Some(table) = KernelTable::for_isa(isa) else { continue };
            let nr = table.gemm.nr;
            let mut pack = PackBuffers::default();
            for n in [1usize, 3, 4, 8, 13, 16, 20, 24, 31, 33, 40, 47, 70] {
                let npad = n.next_multiple_of(nr);
                for (m, k) in [(1, 5), (7, 16), (19, 24)] {
                    let (a, b) = (data(m * k, 1), data(k * n, 2));
                    let mut bpad = vec![0f32; k * npad];
                    for p in 0..k {
                        bpad[p * npad..][..n].copy_from_slice(&b[p * n..][..n]);
                    }
                    let full = PackedB::new(table, k, npad, &bpad, npad, false).unwrap();
                    let mut sums = vec![f32::NAN; m * npad];
                    let strided = ASource::Strided { a: &a, lda: k };
                    run_gemm(
                        table,
                        m,
                        npad,
                        k,
                        strided,
                        BSource::Packed(&full),
                        &mut sums,
                        npad,
                        0.0,
                        Epilogue::default(),
                        &mut pack,
                    );
                    let packed = PackedB::new(table, k, n, &b, n, false).unwrap();
                    let packed_a = PackedA::new(table, m, k, &a, k).unwrap();
                    let (bias, residual, c0) = (data(n, 3), data(m * n, 4), data(m * n, 5));
                    for (act, residual_first) in acts.into_iter().flat_map(|a| [(a, false), (a, true)]) {
                        let epilogue = Epilogue {
                            bias: Bias::PerCol(&bias),
                            activation: Some(ActivationFn::new(table, act)),
                            residual: Some((&residual, n)),
                            residual_first,
                            ..Epilogue::default()
                        };
                        for beta in [0.0f32, 1.0] {
                            let mut want = Vec::with_capacity(m * n);
                            for i in 0..m {
                                let mut row: Vec<f32> = sums[i * npad..][..n].to_vec();
                                if beta == 1.0 {
                                    row.iter_mut().zip(&c0[i * n..][..n]).for_each(|(v, &c)| *v += c);
                                }
                                epilogue.apply(&mut row, i, 0);
                                want.extend(row);
                            }
                            for a_source in [strided, ASource::Packed(&packed_a)] {
                                // C with three sentinel columns past each row.
                                let ldc = n + 3;
                                let mut got: Vec<f32> = (0..m * ldc)
                                    .map(|at| if at % ldc >= n { SENTINEL } else { c0[at / ldc * n + at % ldc] })
                                    .collect();
                                run_gemm(
                                    table,
                                    m,
                                    n,
                                    k,
                                    a_source,
                                    BSource::Packed(&packed),
                                    &mut got,
                                    ldc,
                                    beta,
                                    epilogue,
                                    &mut pack,
                                );
                                for i in 0..m {
                                    let (row, pad) = got[i * ldc..][..ldc].split_at(n);
                                    let same =
                                        row.iter().zip(&want[i * n..][..n]).all(|(g, w)| g.to_bits() == w.to_bits());
                                    let ctx = format!(
                                        "{isa} {m}x{n}x{k} {act:?} residual first {residual_first} beta {beta}"
                                    );
                                    assert!(same, "{ctx}: row {i} differs from the full-width sums");
                                    assert!(
                                        pad.iter().all(|&v| v == SENTINEL),
                                        "{ctx}: row {i} written past its columns"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// GPT-2's `gelu_new` as the epilogue computes it — through the portable
    /// store step and through the microkernels (in registers where the
    /// kernel's math is the table's tanh) — is bit for bit the unfused ops
    /// of the same table (the mul, add and tanh slice functions) on edge
    /// values: ±0, ±inf, NaNs of both signs, |x| where the cube or the
    /// tanh's argument overflows, subnormals, both branches of the tanh and
    /// its saturation; every table, full and partial tiles.
    #[test]
    fn gelu_tanh_chain_epilogue_is_the_unfused_ops_on_edge_values() {
        use kiln_isa::epilogue::gelu_tanh_chain::{CUBIC, HALF, ONE, SQRT_2_OVER_PI};
        let mut x = vec![
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MAX,
            f32::MIN,
            3e12,
            -3e12,
            1e-40,
            -1e-40,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-20,
            -1e-20,
            0.78,
            -0.78,
            0.62,
            -0.62,
            9.0,
            -9.0,
            1e4,
            -1e4,
        ];
        x.extend(data(2001, 9).iter().map(|v| v * 6.0));
        let n = x.len();
        let unfused = |table: &KernelTable, x: &[f32]| {
            let fill = |v: f32| vec![v; x.len()];
            let step = |f: fn(&KernelTable, &[f32], &[f32], &mut [f32]), a: &[f32], b: &[f32]| {
                let mut out = vec![0f32; x.len()];
                f(table, a, b, &mut out);
                out
            };
            let (mul, add) = (KernelTable::mul_f32, KernelTable::add_f32);
            let half = step(mul, x, &fill(HALF));
            let cube = step(mul, &step(mul, x, x), x);
            let sum = step(add, x, &step(mul, &cube, &fill(CUBIC)));
            let arg = step(mul, &sum, &fill(SQRT_2_OVER_PI));
            let mut t = vec![0f32; x.len()];
            table.tanh_f32(&arg, &mut t);
            step(mul, &half, &step(add, &t, &fill(ONE)))
        };
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for isa in Isa::ALL {
            let Some(table) = KernelTable::for_isa(isa) else { continue };
            let want = bits(&unfused(table, &x));
            let act = ActivationFn::new(table, Activation::GeluTanhChain);
            let mut row = x.clone();
            act.apply(&mut row);
            assert_eq!(bits(&row), want, "{isa}: the portable store step");
            // C's rows are x (A a column of ones, K = 1: each sum is one
            // exact product; -0 sums to +0, which the rows above cover).
            let m = 7;
            let packed = PackedB::new(table, 1, n, &x, n, false).unwrap();
            let epilogue = Epilogue { activation: Some(act), ..Epilogue::default() };
            let mut c = vec![f32::NAN; m * n];
            let mut pack = PackBuffers::default();
            let ones = [1f32; 7];
            let a = ASource::Strided { a: &ones, lda: 1 };
            run_gemm(table, m, n, 1, a, BSource::Packed(&packed), &mut c, n, 0.0, epilogue, &mut pack);
            // ZA's outer products (the SME table's GEMM) give the default
            // NaN for a NaN input, where the other kernels keep its sign.
            let za = table.isa() == Isa::Aarch64Sme;
            let sums: Vec<f32> = x
                .iter()
                .map(|&v| {
                    if v == 0.0 {
                        0.0
                    } else if v.is_nan() && za {
                        f32::NAN
                    } else {
                        v
                    }
                })
                .collect();
            let want = bits(&unfused(table, &sums));
            for (i, row) in c.chunks(n).enumerate() {
                assert_eq!(bits(row), want, "{isa}: row {i} of the GEMM's store step");
            }
        }
    }

    #[test]
    fn too_small_operands_are_errors() {
        let mut s = crate::Context::new();
        let mut c = [0f32; 4];
        assert!(gemm_f32(2, 2, 2, &[0.0; 3], 2, &[0.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_err());
        assert!(gemm_f32(2, 2, 2, &[0.0; 4], 1, &[0.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_err());
        assert!(gemm_f32(2, 2, 2, &[1.0; 4], 2, &[1.0; 4], 2, &mut c, 2, false, 0.0, &mut s).is_ok());
        assert_eq!(c, [2.0; 4]);
    }
}
