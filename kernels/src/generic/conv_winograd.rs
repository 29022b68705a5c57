//! 3×3 stride-1 convolutions by Winograd's minimal filtering F(m×m, 3×3),
//! m = 2 or 4: 16 multiplications per 2×2 output tile and channel pair
//! instead of 36 (F(2×2)), or 36 per 4×4 tile instead of 144 (F(4×4), a
//! further 2.25× fewer), of the tap path's multiply-adds (which ResNet-style
//! networks spend most of their time on, and which already ran near the
//! GEMM's peak).
//!
//! With `d` an α×α input tile (α = m + 2; output tile `(ty, tx)` reads
//! padded input rows `m·ty..m·ty + α`, columns `m·tx..m·tx + α`) and `g` one
//! 3×3 filter, the m×m output is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` (Lavin & Gray,
//! 2015; F(4×4) with the interpolation points 0, ±1, ±2, ∞). Summed over
//! input channels, each of the α² points `e` of the transformed tile is one
//! GEMM: `M_e [tiles, Cout] = V_e [tiles, Cin] · U_e [Cin, Cout]`, where `U_e`
//! (the filters transformed, packed once per weight: [`PackedWinograd`]) is
//! a constant B and `V_e` (the input tiles transformed) is read in place by
//! the table's direct kernel. Work items own blocks of tiles: each transforms
//! its block's input, runs the α² GEMMs over it and transforms the results
//! into output pixels while they are in cache.
//!
//! The tile size is a function of the weight's shape alone
//! ([`WinogradTile::of`]), so packed or not, at load or per call, a
//! convolution always takes the same one. Every output element is the same
//! operations in the same order whichever item or thread computes it, and
//! in either layout (the input is first copied into a zero-padded
//! channels-last image), so results are bit-identical at any thread count
//! and between layouts. They differ from the tap path's by rounding (the
//! transforms add, subtract and scale before the products; F(4×4)'s larger
//! constants round more): within the conformance tolerances, like the
//! Winograd kernels of cuDNN, NNPACK and oneDNN.

use super::conv::Geometry;
use super::conv_taps::{to_nchw, Io, TapEpilogue};
use super::gemm::{gemm_sum_packed, ActivationFn, Epilogue, PackedB, SumTerm};
use crate::parallel::{SharedMut, Threads};
use crate::table::KernelTable;
use crate::types::{PackBuffers, Result};

/// Points of the largest transformed tile (F(4×4)'s 6×6).
const MAX_POINTS: usize = 36;

/// Pixels of the largest output tile (4×4).
const MAX_PIXELS: usize = 16;

/// Fewest input channels: with fewer, the tile transforms cost more than
/// the multiply-adds saved (as for the tap path).
const MIN_CIN: usize = 32;

/// Largest `Cin·Cout`: the transformed weight is 16/9 of the weight, and a
/// batch-1 convolution streams all of it from memory once per run. At
/// 512×512 (a ResNet's last stage, 7²) Winograd still wins in a whole
/// ResNet-18 run (benches/RESULTS.md: 2 ms of CPU time per run less than
/// stopping at 256×256); wider ones were not measured and keep the tap path.
const MAX_CIN_COUT: usize = 512 * 512;

/// Fewest input channels F(4×4) takes. ResNet-18's 64-channel 56² layers
/// measured 0.63–0.67× F(2×2)'s time with it (`conv_ab`,
/// benches/RESULTS.md); fewer channels were not measured and keep F(2×2).
const F4_MIN_CIN: usize = 64;

/// Largest `Cin·Cout` F(4×4) takes: its transformed weight is 4× the
/// weight (36/9, against F(2×2)'s 16/9), streamed from memory once per
/// block of tiles, and its 4×4 tiles waste more of a small image (a 7²
/// output is 2×2 tiles of 16 pixels). ResNet-18's 512×512 layers at 7²
/// took 1.2–1.4× F(2×2)'s time; 256×256 at 14² 0.90–0.95×.
const F4_MAX_CIN_COUT: usize = 256 * 256;

/// The output tile of a Winograd convolution: F(2×2, 3×3) or F(4×4, 3×3).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum WinogradTile {
    F2,
    F4,
}

impl WinogradTile {
    /// The tile size for a weight of `cin` input and `cout` output channels
    /// (see [`F4_MIN_CIN`], [`F4_MAX_CIN_COUT`]): from the shape alone, so
    /// that every caller of one convolution takes the same.
    pub(crate) fn of(cin: usize, cout: usize) -> WinogradTile {
        if cin >= F4_MIN_CIN && cin.saturating_mul(cout) <= F4_MAX_CIN_COUT {
            WinogradTile::F4
        } else {
            WinogradTile::F2
        }
    }

    /// Output pixels per tile side (m).
    const fn m(self) -> usize {
        match self {
            WinogradTile::F2 => 2,
            WinogradTile::F4 => 4,
        }
    }

    /// Input pixels per tile side (α = m + 2).
    const fn alpha(self) -> usize {
        self.m() + 2
    }

    /// Points of the transformed tile (α²): one GEMM each.
    const fn points(self) -> usize {
        self.alpha() * self.alpha()
    }

    /// Most tiles a work item takes: its transformed input and results
    /// (`α²·tiles·(Cin + Cout)` f32s) stay in L2 at 64 channels (F(2×2):
    /// 0.5 MB; F(4×4): 0.6 MB, 1.2 MB at 128). Fewer F(4×4) tiles would
    /// stream its 4× larger weight once more per extra item; not tuned
    /// further.
    const fn block_tiles(self) -> usize {
        match self {
            WinogradTile::F2 => 64,
            WinogradTile::F4 => 32,
        }
    }
}

/// Channels a transform step handles at once (one AVX-512 vector; fixed
/// arrays the compiler keeps in registers).
const LANES: usize = 16;

/// Whether a convolution with weight shape `w` (`[Cout, Cin/groups, kh,
/// kw]`), `groups`, `stride` and `dilation` runs this path on `table`: 2-d,
/// dense, 3×3, stride and dilation 1, enough channels but not too many (see
/// [`MAX_CIN_COUT`]), and a table whose GEMM reads A in place. Padding and
/// image size do not matter, so the packing can be chosen at load.
pub(crate) fn applies(table: &KernelTable, w: &[usize], groups: usize, stride: &[usize], dilation: &[usize]) -> bool {
    table.gemm.direct.is_some()
        && groups == 1
        && w.len() == 4
        && w[2] == 3
        && w[3] == 3
        && w[1] >= MIN_CIN
        && w[0] > 0
        && w[0].saturating_mul(w[1]) <= MAX_CIN_COUT
        && stride == [1, 1]
        && dilation == [1, 1]
}

/// A 3×3 weight `[Cout, Cin, 3, 3]` transformed (`U = G g Gᵀ` per filter)
/// and packed once: one GEMM B `[Cin, Cout]` per point of the α×α tile.
#[derive(Clone, Debug)]
pub(crate) struct PackedWinograd {
    points: Vec<PackedB>,
    cin: usize,
    cout: usize,
    tile: WinogradTile,
}

/// Winograd's G for F(2, 3) (rows: the four tile points; columns: the three
/// filter taps).
const G2: [[f64; 3]; 4] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]];

/// G for F(4, 3) at the points 0, 1, -1, 2, -2, ∞ (Lavin & Gray's).
const G4: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

impl PackedWinograd {
    /// Transforms and packs `w` (shape `shape`, see [`applies`]) for
    /// `table`, with the tile [`WinogradTile::of`] its shape.
    pub(crate) fn new(table: &KernelTable, w: &[f32], shape: &[usize]) -> Result<PackedWinograd> {
        let tile = match shape {
            &[cout, cin, ..] => WinogradTile::of(cin, cout),
            _ => WinogradTile::F2,
        };
        Self::with_tile(table, w, shape, tile)
    }

    /// [`PackedWinograd::new`] with the tile chosen by the caller (for
    /// comparing the two in tests and benchmarks).
    pub(crate) fn with_tile(
        table: &KernelTable,
        w: &[f32],
        shape: &[usize],
        tile: WinogradTile,
    ) -> Result<PackedWinograd> {
        let &[cout, cin, 3, 3] = shape else {
            return Err(super::common::shape_err(
                "conv",
                format!("Winograd packing needs a 3×3 weight, got {shape:?}"),
            ));
        };
        if w.len() != cout * cin * 9 {
            return Err(super::common::shape_err("conv", format!("weight of {} values for {shape:?}", w.len())));
        }
        let g: &[[f64; 3]] = match tile {
            WinogradTile::F2 => &G2,
            WinogradTile::F4 => &G4,
        };
        let alpha = tile.alpha();
        // u[e][ci][co]; each filter transformed in f64, rounded once. Output
        // channels innermost: the α² points' writes are α² sequential
        // streams (filter order scattered them, a cache miss each).
        let mut u = vec![0f32; tile.points() * cin * cout];
        for (ci, co) in (0..cin).flat_map(|ci| (0..cout).map(move |co| (ci, co))) {
            let f = &w[(co * cin + ci) * 9..][..9];
            let mut gf = [[0f64; 3]; 6];
            for (i, row) in gf.iter_mut().take(alpha).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = (0..3).map(|k| g[i][k] * f[k * 3 + j] as f64).sum();
                }
            }
            for i in 0..alpha {
                for j in 0..alpha {
                    let v: f64 = (0..3).map(|k| gf[i][k] * g[j][k]).sum();
                    u[((i * alpha + j) * cin + ci) * cout + co] = v as f32;
                }
            }
        }
        let points = u
            .chunks_exact(cin * cout)
            .map(|ue| PackedB::new(table, cin, cout, ue, cout, false))
            .collect::<Result<Vec<_>>>()?;
        Ok(PackedWinograd { points, cin, cout, tile })
    }

    /// The output tile this packing is for.
    pub(crate) fn tile(&self) -> WinogradTile {
        self.tile
    }

    /// Whether `table`'s microkernel reads this packing.
    pub(crate) fn fits(&self, table: &KernelTable) -> bool {
        table.gemm.direct.is_some() && self.points.iter().all(|b| b.fits(table))
    }
}

/// The tile grid of one image.
struct Grid {
    tile: WinogradTile,
    /// Tile rows and columns (each tile m×m output pixels).
    th: usize,
    tw: usize,
    /// The zero-padded input image's width (rows are `m·th + 2`).
    wp: usize,
    /// Tiles per work item.
    block: usize,
}

impl Grid {
    fn of(g: &Geometry, tile: WinogradTile, threads: usize) -> Grid {
        let [_, oh, ow] = g.output;
        let m = tile.m();
        let (th, tw) = (oh.div_ceil(m), ow.div_ceil(m));
        let tiles = th * tw;
        let most = tile.block_tiles();
        // About two items per thread where the image is small; which item
        // computes a tile never changes its arithmetic.
        let block = if threads <= 1 { most } else { tiles.div_ceil(2 * threads).next_multiple_of(8) };
        Grid { tile, th, tw, wp: m * tw + 2, block: block.clamp(8, most) }
    }

    fn tiles(&self) -> usize {
        self.th * self.tw
    }

    fn items(&self) -> usize {
        self.tiles().div_ceil(self.block)
    }

    /// f32s of the padded image (`cin` channels).
    fn image_len(&self, cin: usize) -> usize {
        (self.tile.m() * self.th + 2) * self.wp * cin
    }

    /// f32s of one item's transformed input and products.
    fn item_len(&self, cin: usize, cout: usize) -> usize {
        self.tile.points() * self.block * (cin + cout)
    }
}

/// Scratch f32s [`conv_winograd`] needs for one image of geometry `g` with
/// the weight `packed`, at `threads` threads.
pub(crate) fn scratch_len(g: &Geometry, packed: &PackedWinograd, threads: usize) -> usize {
    let (cin, cout) = (packed.cin, packed.cout);
    let grid = Grid::of(g, packed.tile, threads);
    let [_, oh, ow] = g.output;
    grid.image_len(cin) + threads.max(1) * grid.item_len(cin, cout) + oh * ow * cout
}

/// The convolution of `io.x` by the transformed weight, into `io.out`,
/// using `buf` ([`scratch_len`] f32s). False (output untouched) when the
/// packing does not match or the table's GEMM cannot run it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_winograd(
    table: &KernelTable,
    io: Io<'_>,
    packed: &PackedWinograd,
    e: &TapEpilogue<'_>,
    g: &Geometry,
    (batch, cin, cout): (usize, usize, usize),
    buf: &mut [f32],
    pack: &PackBuffers,
) -> bool {
    let Io { x, out, channels_last } = io;
    if packed.cin != cin || packed.cout != cout || !packed.fits(table) || g.kernel[1..] != [3, 3] {
        return false;
    }
    let threads = &pack.threads;
    let grid = Grid::of(g, packed.tile, threads.count());
    let [_, h, w] = g.input;
    let [_, oh, ow] = g.output;
    let (isp, osp) = (h * w, oh * ow);
    if buf.len() < scratch_len(g, packed, threads.count()) {
        return false;
    }
    let (image, rest) = buf.split_at_mut(grid.image_len(cin));
    // One item buffer per thread (reused item after item, so it stays in
    // L2 and the scratch does not grow with the image).
    let (items, cbuf) = rest.split_at_mut(threads.count().max(1) * grid.item_len(cin, cout));
    let cbuf = &mut cbuf[..osp * cout];
    // With the residual added before it, the activation comes after the
    // residual; otherwise with the bias.
    let post_activation = e.activation.filter(|_| e.residual.is_some() && e.residual_first);
    let finish = Finish {
        bias: e.bias,
        activation: e.activation.filter(|_| post_activation.is_none()),
        post_activation,
        residual_first: e.residual_first,
    };
    for n in 0..batch {
        let xn = &x[n * cin * isp..][..cin * isp];
        fill_image(xn, channels_last, g, &grid, cin, image, threads);
        let on = &mut out[n * cout * osp..][..cout * osp];
        let residual = e.residual.map(|r| &r[n * cout * osp..][..cout * osp]);
        // Channels-last results go straight into the output (with the
        // residual); channels-first ones through `cbuf` and a transposition.
        let (dst, dst_residual) = if channels_last { (&mut *on, residual) } else { (&mut *cbuf, None) };
        let job = Job { table, packed, grid: &grid, cin, cout, oh, ow, image, finish: &finish, residual: dst_residual };
        let (dst, items) = (SharedMut(dst.as_mut_ptr()), SharedMut(items.as_mut_ptr()));
        threads.for_each(grid.items(), |item| {
            let len = grid.item_len(cin, cout);
            // SAFETY: the calling thread's buffer (`Threads::index`: threads
            // running at once have distinct indices, below the count the
            // buffers were cut for), and the output pixels of the item's
            // own tiles (`job.run`).
            let scratch = unsafe { std::slice::from_raw_parts_mut(items.ptr().add(threads.index() * len), len) };
            run_item(&job, item, scratch, dst);
        });
        if !channels_last {
            to_nchw(cbuf, ow, (oh, ow), cout, residual, post_activation, on, threads);
        }
    }
    true
}

/// Runs `job`'s item `item` with its tile transforms compiled for the vector
/// width of the table's level (they are 64-byte block copies, adds,
/// subtracts and scalings by small powers of two and 5 over channels: at
/// the baseline's 16-byte vectors with a `memcpy` call per block they took
/// ~9 % of a ResNet-18 run). No FMA contraction and the same operations per
/// lane, so every level gives the same bits; the GEMMs inside call through
/// the table as always. Not a table entry: it would be this same portable
/// code under each level's name, and the generic table (the entries'
/// oracle) has no Winograd path.
fn run_item(job: &Job<'_>, item: usize, scratch: &mut [f32], dst: SharedMut<f32>) {
    match job.grid.tile {
        WinogradTile::F2 => run_item_m::<2>(job, item, scratch, dst),
        WinogradTile::F4 => run_item_m::<4>(job, item, scratch, dst),
    }
}

/// [`run_item`] for the output tile size `M`.
fn run_item_m<const M: usize>(job: &Job<'_>, item: usize, scratch: &mut [f32], dst: SharedMut<f32>) {
    #[cfg(kiln_x86_64)]
    {
        use crate::table::Isa;
        #[cfg(kiln_avx512)]
        if job.table.isa() == Isa::X86_64V4 {
            // SAFETY: a v4 table is built only when the CPU has AVX-512F.
            return unsafe { run_avx512::<M>(job, item, scratch, dst) };
        }
        if matches!(job.table.isa(), Isa::X86_64V3 | Isa::X86_64V4) {
            // SAFETY: v3 and v4 tables are built only when the CPU has AVX2.
            return unsafe { run_avx2::<M>(job, item, scratch, dst) };
        }
    }
    job.run::<M>(item, scratch, dst)
}

#[cfg(all(kiln_x86_64, kiln_avx512))]
#[target_feature(enable = "avx512f")]
unsafe fn run_avx512<const M: usize>(job: &Job<'_>, item: usize, scratch: &mut [f32], dst: SharedMut<f32>) {
    job.run::<M>(item, scratch, dst)
}

#[cfg(kiln_x86_64)]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2<const M: usize>(job: &Job<'_>, item: usize, scratch: &mut [f32], dst: SharedMut<f32>) {
    job.run::<M>(item, scratch, dst)
}

/// What follows the output transform, per output pixel: the bias, then the
/// activation and the residual in the epilogue's order (the post-residual
/// activation of a channels-first output is `to_nchw`'s).
struct Finish<'a> {
    bias: Option<&'a [f32]>,
    activation: Option<ActivationFn>,
    post_activation: Option<ActivationFn>,
    residual_first: bool,
}

/// One image's tile blocks.
struct Job<'a> {
    table: &'a KernelTable,
    packed: &'a PackedWinograd,
    grid: &'a Grid,
    cin: usize,
    cout: usize,
    oh: usize,
    ow: usize,
    image: &'a [f32],
    finish: &'a Finish<'a>,
    /// Channels-last, like the destination, when there is one to add here.
    residual: Option<&'a [f32]>,
}

impl Job<'_> {
    /// Item `item`'s tiles (M×M output pixels each): input transform into
    /// `scratch`, the α² GEMMs, output transform into `dst` (`[OH, OW,
    /// Cout]`). Inlined into [`run_item`]'s wrappers, so that their target
    /// features apply.
    #[inline(always)]
    fn run<const M: usize>(&self, item: usize, scratch: &mut [f32], dst: SharedMut<f32>) {
        let (cin, cout, grid) = (self.cin, self.cout, self.grid);
        let points = (M + 2) * (M + 2);
        let t0 = item * grid.block;
        let tiles = grid.block.min(grid.tiles() - t0);
        let (v, m) = scratch.split_at_mut(points * grid.block * cin);
        let row = grid.wp * cin;
        for t in 0..tiles {
            let (ty, tx) = ((t0 + t) / grid.tw, (t0 + t) % grid.tw);
            let origin = (M * ty * grid.wp + M * tx) * cin;
            input_tile::<M>(&self.image[origin..], row, v, grid.block * cin, t * cin, cin);
        }
        for (p, b) in self.packed.points.iter().enumerate() {
            let a = &v[p * grid.block * cin..][..tiles * cin];
            let term = |_| SumTerm { a, lda: cin, k0: 0, k1: cin };
            let c = &mut m[p * grid.block * cout..][..tiles * cout];
            let done =
                gemm_sum_packed(self.table, tiles, b, 1, &term, c, cout, Epilogue::default(), &Threads::single());
            debug_assert!(done, "checked by PackedWinograd::fits");
        }
        // The output transform's results, every lane written before it is
        // read (zeroed once per item, not per block).
        let mut px = [[0f32; LANES]; MAX_PIXELS];
        for t in 0..tiles {
            let (ty, tx) = ((t0 + t) / grid.tw, (t0 + t) % grid.tw);
            let mut pixels = [None; MAX_PIXELS];
            for (q, pixel) in pixels.iter_mut().take(M * M).enumerate() {
                let (oy, ox) = (M * ty + q / M, M * tx + q % M);
                *pixel = (oy < self.oh && ox < self.ow).then_some(oy * self.ow + ox);
            }
            let pixels = &pixels[..M * M];
            // Full blocks with a constant width (their copies inline as
            // vector moves), then the remainder.
            let full = cout / LANES * LANES;
            for c0 in (0..full).step_by(LANES) {
                self.output_block::<M>(m, t, c0, LANES, pixels, &mut px, dst);
            }
            if full < cout {
                self.output_block::<M>(m, t, full, cout - full, pixels, &mut px, dst);
            }
            for &pixel in pixels.iter().flatten() {
                // SAFETY: as above, the whole pixel.
                let row = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(pixel * cout), cout) };
                self.epilogue(row, pixel);
            }
        }
    }

    /// Output channels `c0..c0 + lanes` of tile `t` (of this item) from the
    /// products `m`, plus the bias, into the tile's `pixels` of `dst`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn output_block<const M: usize>(
        &self,
        m: &[f32],
        t: usize,
        c0: usize,
        lanes: usize,
        pixels: &[Option<usize>],
        px: &mut [[f32; LANES]; MAX_PIXELS],
        dst: SharedMut<f32>,
    ) {
        let cout = self.cout;
        if M == 2 {
            output_tile2(m, self.grid.block * cout, t * cout + c0, lanes, px);
        } else {
            output_tile4(m, self.grid.block * cout, t * cout + c0, lanes, px);
        }
        let mut bias = [0f32; LANES];
        if let Some(b) = self.finish.bias {
            load(&mut bias, &b[c0..], lanes);
        }
        for (q, pixel) in pixels.iter().enumerate() {
            let Some(pixel) = pixel else { continue };
            if self.finish.bias.is_some() {
                px[q].iter_mut().zip(&bias).for_each(|(o, &b)| *o += b);
            }
            // SAFETY: `pixel` is one of this item's tiles' output pixels
            // (inside the image), which no other item writes.
            let row = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(pixel * cout + c0), lanes) };
            store(row, &px[q], lanes);
        }
    }

    /// The activation and residual of one output pixel (bias already in).
    #[inline(always)]
    fn epilogue(&self, row: &mut [f32], pixel: usize) {
        let f = self.finish;
        let residual = self.residual.map(|r| &r[pixel * self.cout..][..self.cout]);
        let add = |row: &mut [f32]| {
            if let Some(r) = residual {
                row.iter_mut().zip(r).for_each(|(o, &v)| *o += v);
            }
        };
        if f.residual_first {
            add(row);
        }
        if let Some(a) = &f.activation {
            a.apply(row);
        }
        if !f.residual_first {
            add(row);
        }
        if let (Some(a), Some(_)) = (&f.post_activation, residual) {
            a.apply(row);
        }
    }
}

/// `x[..lanes] = src[..lanes]` (inlined: with a constant `lanes`, vector
/// moves rather than a `memcpy` call per 64 bytes).
#[inline(always)]
fn load(x: &mut [f32; LANES], src: &[f32], lanes: usize) {
    x[..lanes].copy_from_slice(&src[..lanes]);
}

/// `dst[..lanes] = x[..lanes]` (as [`load`]).
#[inline(always)]
fn store(dst: &mut [f32], x: &[f32; LANES], lanes: usize) {
    dst[..lanes].copy_from_slice(&x[..lanes]);
}

/// `Bᵀ d B` of one M×M-output tile, channel by channel: the tile's padded
/// input pixel `(i, j)` is `image[i·row + j·cin..][..cin]`; point `e`'s
/// channels go to `v[e·stride + at..][..cin]`.
#[inline(always)]
fn input_tile<const M: usize>(image: &[f32], row: usize, v: &mut [f32], stride: usize, at: usize, cin: usize) {
    let alpha = M + 2;
    let mut d: [&[f32]; MAX_POINTS] = [&[]; MAX_POINTS];
    for (p, dp) in d.iter_mut().take(alpha * alpha).enumerate() {
        *dp = &image[(p / alpha) * row + (p % alpha) * cin..][..cin];
    }
    // Full blocks with a constant width (their copies inline as vector
    // moves), then the remainder. (Calls, not a closure: the closure was
    // not inlined, so its copies became `memcpy` calls.)
    let full = cin / LANES * LANES;
    for c0 in (0..full).step_by(LANES) {
        if M == 2 {
            input_block2(&d, v, stride, at, c0, LANES);
        } else {
            input_block4(&d, v, stride, at, c0, LANES);
        }
    }
    if full < cin {
        if M == 2 {
            input_block2(&d, v, stride, at, full, cin - full);
        } else {
            input_block4(&d, v, stride, at, full, cin - full);
        }
    }
}

/// F(2×2)'s input transform of channels `c0..c0 + lanes` (`d`: the 4×4
/// tile's pixels, row-major).
#[inline(always)]
fn input_block2(d: &[&[f32]; MAX_POINTS], v: &mut [f32], stride: usize, at: usize, c0: usize, lanes: usize) {
    let mut x = [[0f32; LANES]; 16];
    for (xp, dp) in x.iter_mut().zip(d) {
        load(xp, &dp[c0..], lanes);
    }
    // Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]:
    // first down the columns, then along the rows.
    let mut t = [[0f32; LANES]; 16];
    for j in 0..4 {
        for l in 0..LANES {
            let (d0, d1, d2, d3) = (x[j][l], x[4 + j][l], x[8 + j][l], x[12 + j][l]);
            t[j][l] = d0 - d2;
            t[4 + j][l] = d1 + d2;
            t[8 + j][l] = d2 - d1;
            t[12 + j][l] = d1 - d3;
        }
    }
    for i in 0..4 {
        let r = 4 * i;
        for l in 0..LANES {
            let (t0, t1, t2, t3) = (t[r][l], t[r + 1][l], t[r + 2][l], t[r + 3][l]);
            x[r][l] = t0 - t2;
            x[r + 1][l] = t1 + t2;
            x[r + 2][l] = t2 - t1;
            x[r + 3][l] = t1 - t3;
        }
    }
    for (p, xp) in x.iter().enumerate() {
        store(&mut v[p * stride + at + c0..], xp, lanes);
    }
}

/// `Bᵀ d` of six values for F(4, 3) at the points 0, ±1, ±2, ∞:
/// `Bᵀ = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
/// [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]`, with
/// the shared partial sums computed once. Separate multiplies and adds
/// (never fused), so every ISA rounds alike.
#[inline(always)]
fn bt4(d: [f32; 6]) -> [f32; 6] {
    let [d0, d1, d2, d3, d4, d5] = d;
    let (a, b) = (d4 - 4.0 * d2, d3 - 4.0 * d1);
    let (c, e) = (d4 - d2, 2.0 * (d3 - d1));
    [(4.0 * d0 - 5.0 * d2) + d4, a + b, a - b, c + e, c - e, (4.0 * d1 - 5.0 * d3) + d5]
}

/// F(4×4)'s input transform of channels `c0..c0 + lanes` (`d`: the 6×6
/// tile's pixels, row-major).
#[inline(always)]
fn input_block4(d: &[&[f32]; MAX_POINTS], v: &mut [f32], stride: usize, at: usize, c0: usize, lanes: usize) {
    let mut x = [[0f32; LANES]; 36];
    for (xp, dp) in x.iter_mut().zip(d) {
        load(xp, &dp[c0..], lanes);
    }
    // First down the columns, then along the rows.
    let mut t = [[0f32; LANES]; 36];
    for j in 0..6 {
        for l in 0..LANES {
            let col = bt4(std::array::from_fn(|i| x[6 * i + j][l]));
            for (i, c) in col.into_iter().enumerate() {
                t[6 * i + j][l] = c;
            }
        }
    }
    for i in 0..6 {
        for l in 0..LANES {
            let row = bt4(std::array::from_fn(|j| t[6 * i + j][l]));
            for (j, r) in row.into_iter().enumerate() {
                x[6 * i + j][l] = r;
            }
        }
    }
    for (p, xp) in x.iter().enumerate() {
        store(&mut v[p * stride + at + c0..], xp, lanes);
    }
}

/// F(2×2)'s `Aᵀ M A` of one tile for `lanes` output channels: point `e`'s
/// products are `m[e·stride + at..]`; `px[q]` gets output pixel `q`
/// (row-major 2×2).
#[inline(always)]
fn output_tile2(m: &[f32], stride: usize, at: usize, lanes: usize, px: &mut [[f32; LANES]; MAX_PIXELS]) {
    let mut x = [[0f32; LANES]; 16];
    for (p, xp) in x.iter_mut().enumerate() {
        load(xp, &m[p * stride + at..], lanes);
    }
    // Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]: down the columns, then along.
    let mut s = [[0f32; LANES]; 8];
    for j in 0..4 {
        for l in 0..LANES {
            let (m0, m1, m2, m3) = (x[j][l], x[4 + j][l], x[8 + j][l], x[12 + j][l]);
            s[j][l] = m0 + m1 + m2;
            s[4 + j][l] = m1 - m2 - m3;
        }
    }
    for r in 0..2 {
        for l in 0..LANES {
            let (s0, s1, s2, s3) = (s[4 * r][l], s[4 * r + 1][l], s[4 * r + 2][l], s[4 * r + 3][l]);
            px[2 * r][l] = s0 + s1 + s2;
            px[2 * r + 1][l] = s1 - s2 - s3;
        }
    }
}

/// `Aᵀ m` of six values for F(4, 3): `Aᵀ = [[1, 1, 1, 1, 1, 0], [0, 1, -1,
/// 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]`, shared sums once.
#[inline(always)]
fn at4(m: [f32; 6]) -> [f32; 4] {
    let [m0, m1, m2, m3, m4, m5] = m;
    let (p1, n1, p2, n2) = (m1 + m2, m1 - m2, m3 + m4, m3 - m4);
    [(m0 + p1) + p2, n1 + 2.0 * n2, p1 + 4.0 * p2, (n1 + 8.0 * n2) + m5]
}

/// F(4×4)'s `Aᵀ M A` of one tile for `lanes` output channels (as
/// [`output_tile2`]; `px[q]`: output pixel `q`, row-major 4×4).
#[inline(always)]
fn output_tile4(m: &[f32], stride: usize, at: usize, lanes: usize, px: &mut [[f32; LANES]; MAX_PIXELS]) {
    let mut x = [[0f32; LANES]; 36];
    for (p, xp) in x.iter_mut().enumerate() {
        load(xp, &m[p * stride + at..], lanes);
    }
    // Down the columns (6 → 4 rows), then along them.
    let mut s = [[0f32; LANES]; 24];
    for j in 0..6 {
        for l in 0..LANES {
            let col = at4(std::array::from_fn(|i| x[6 * i + j][l]));
            for (i, c) in col.into_iter().enumerate() {
                s[6 * i + j][l] = c;
            }
        }
    }
    for i in 0..4 {
        for l in 0..LANES {
            let row = at4(std::array::from_fn(|j| s[6 * i + j][l]));
            for (j, r) in row.into_iter().enumerate() {
                px[4 * i + j][l] = r;
            }
        }
    }
}

/// Copies image `x` (`[cin, H, W]`, or `[H, W, cin]` when `channels_last`)
/// into the channels-last padded image (`2·th + 2` rows of `wp` pixels,
/// zero outside the image).
fn fill_image(
    x: &[f32],
    channels_last: bool,
    g: &Geometry,
    grid: &Grid,
    cin: usize,
    image: &mut [f32],
    threads: &Threads,
) {
    let [_, h, w] = g.input;
    let (py, px) = (g.pad[1], g.pad[2]);
    let row_len = grid.wp * cin;
    threads.for_each_chunk(&mut image[..grid.image_len(cin)], row_len, |r, row| {
        let iy = r.wrapping_sub(py);
        if iy >= h {
            row.fill(0.0);
            return;
        }
        // Padded columns px..px + w hold the image (those past wp are
        // never read: no tile reaches them).
        let (lo, hi) = (px.min(grid.wp), (px + w).min(grid.wp));
        row[..lo * cin].fill(0.0);
        row[hi * cin..].fill(0.0);
        if channels_last {
            row[lo * cin..hi * cin].copy_from_slice(&x[iy * w * cin..][..(hi - lo) * cin]);
            return;
        }
        for c in 0..cin {
            let src = &x[(c * h + iy) * w..][..hi - lo];
            for (k, &v) in src.iter().enumerate() {
                row[(lo + k) * cin + c] = v;
            }
        }
    });
}
