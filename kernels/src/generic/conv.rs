//! N-d convolution (1, 2 or 3 spatial dims) as im2col + the packed GEMM.
//!
//! Lower-rank convolutions are run as 3-d ones with leading unit spatial dims,
//! so there is one im2col. It is implicit: the column matrix is never stored;
//! the GEMM packs each of its B strips straight from the input
//! ([`pack_conv_strip`]), which saves a write and a read of every column
//! element and the column buffer itself. 1×1 stride-1 convolutions read the
//! input planes as B directly. Dense 2-d convolutions with a wide kernel and
//! enough channels run one GEMM per kernel tap instead (`conv_taps`), and
//! 3×3 stride-1 ones Winograd's F(2×2, 3×3) or F(4×4, 3×3) (`conv_winograd`).

use super::common::*;
use super::conv_depthwise::conv_depthwise_f32;
use super::conv_taps::{self, PackedTaps, TapEpilogue};
use super::conv_winograd::{self, PackedWinograd, WinogradTile};
use super::gemm::{run_gemm, ASource, Activation, ActivationFn, BSource, Bias, Epilogue, PackedA, PackedB};
use super::math::Real;
use crate::context::Context;
use crate::table::KernelTable;
use crate::types::{DType, Result, TensorMut, TensorRef};

/// Stride, padding (symmetric, per spatial dim), dilation and groups, as in
/// torch.nn.functional.conv{1,2,3}d.
#[derive(Copy, Clone, Debug)]
pub struct ConvParams<'a> {
    pub stride: &'a [usize],
    pub padding: &'a [usize],
    pub dilation: &'a [usize],
    pub groups: usize,
}

/// Spatial geometry padded to three dims (leading dims are 1/0/1).
pub(crate) struct Geometry {
    pub(crate) input: [usize; 3],
    pub(crate) kernel: [usize; 3],
    pub(crate) stride: [usize; 3],
    pub(crate) pad: [usize; 3],
    pub(crate) dil: [usize; 3],
    pub(crate) output: [usize; 3],
}

/// Which f32 algorithm [`conv_with`] runs. [`conv`] uses `Auto`; the others
/// exist so tests and benchmarks can compare the paths on the same problem.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ConvAlgorithm {
    /// Direct depthwise loops where they apply, Winograd F(2×2, 3×3) or
    /// F(4×4, 3×3) (by channel counts) for 3×3 stride-1 dense convolutions
    /// with enough (not too many) channels (`conv_winograd`), one GEMM per
    /// kernel tap over a channels-last copy for other dense 2-d
    /// convolutions with a wide kernel and enough channels (`conv_taps`),
    /// im2col + GEMM otherwise.
    Auto,
    /// As `Auto` but never Winograd (the tap path where it applies).
    Taps,
    /// As `Auto` but Winograd with 2×2 output tiles, F(2×2, 3×3), wherever
    /// Winograd runs (`Auto` takes F(4×4) for some channel counts).
    WinogradF2,
    /// As `Auto` but Winograd with 4×4 output tiles, F(4×4, 3×3), wherever
    /// Winograd runs.
    WinogradF4,
    /// im2col + the packed GEMM, for every convolution.
    Im2col,
    /// Direct depthwise loops; an error unless every group has one input
    /// channel (`groups == Cin`).
    Depthwise,
}

impl ConvAlgorithm {
    /// The Winograd tile this algorithm forces, if it forces one.
    fn winograd_tile(self) -> Option<WinogradTile> {
        match self {
            ConvAlgorithm::WinogradF2 => Some(WinogradTile::F2),
            ConvAlgorithm::WinogradF4 => Some(WinogradTile::F4),
            _ => None,
        }
    }

    /// Whether this is `Auto` or `Auto` with a Winograd tile forced.
    fn is_auto(self) -> bool {
        matches!(self, ConvAlgorithm::Auto | ConvAlgorithm::WinogradF2 | ConvAlgorithm::WinogradF4)
    }
}

pub(crate) fn geometry(x: &[usize], w: &[usize], p: &ConvParams, out: &[usize]) -> Result<Geometry> {
    const K: &str = "conv";
    let sd = x.len().saturating_sub(2);
    if !(1..=3).contains(&sd) {
        return Err(shape_err(K, format!("input rank {} must be 3, 4 or 5 (N, C, 1-3 spatial dims)", x.len())));
    }
    if w.len() != x.len() || out.len() != x.len() {
        return Err(shape_err(K, format!("ranks differ: x {x:?}, w {w:?}, out {out:?}")));
    }
    for (name, v) in [("stride", p.stride), ("padding", p.padding), ("dilation", p.dilation)] {
        if v.len() != sd {
            return Err(shape_err(K, format!("{name} {v:?} must have {sd} entries")));
        }
    }
    let mut g = Geometry { input: [1; 3], kernel: [1; 3], stride: [1; 3], pad: [0; 3], dil: [1; 3], output: [1; 3] };
    for i in 0..sd {
        let d = 3 - sd + i;
        g.input[d] = x[2 + i];
        g.kernel[d] = w[2 + i];
        g.stride[d] = p.stride[i];
        g.pad[d] = p.padding[i];
        g.dil[d] = p.dilation[i];
        if g.stride[d] == 0 || g.dil[d] == 0 {
            return Err(shape_err(K, "stride and dilation must be >= 1"));
        }
        let span = g.dil[d] * (g.kernel[d].max(1) - 1) + 1;
        let padded = g.input[d] + 2 * g.pad[d];
        if g.kernel[d] == 0 || padded < span {
            return Err(shape_err(
                K,
                format!("kernel {w:?} (dilated) larger than padded input {x:?} in spatial dim {i}"),
            ));
        }
        g.output[d] = (padded - span) / g.stride[d] + 1;
        if out[2 + i] != g.output[d] {
            return Err(shape_err(K, format!("output spatial dim {i} is {}, expected {}", out[2 + i], g.output[d])));
        }
    }
    Ok(g)
}

/// f32 runs direct depthwise loops for depthwise convolutions and im2col + the
/// packed GEMM for the rest; f64 a direct loop (f64 accumulation, like torch's
/// double convolution).
pub fn conv(
    x: TensorRef,
    w: TensorRef,
    bias: Option<TensorRef>,
    p: &ConvParams,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    conv_with(x, w, bias, p, out, cx, ConvAlgorithm::Auto)
}

/// An f32 convolution weight `[Cout, Cin/groups, k...]` packed once for a
/// kernel table's GEMM microkernel: one B per kernel tap where the tap path
/// runs it (`conv_taps`), else one [`PackedA`] per group (the im2col GEMM's
/// A). Depthwise convolutions do not use it (they run direct loops).
#[derive(Clone, Debug)]
pub struct PackedConv {
    shape: Vec<usize>,
    group_count: usize,
    groups: Vec<PackedA>,
    pub(crate) taps: Option<PackedTaps>,
    /// A channels-last pointwise convolution's B, `[Cin, Cout]`.
    pub(crate) pointwise: Option<PackedB>,
    /// The transformed weight of a 3×3 stride-1 convolution
    /// (`conv_winograd`), packed only by the constructors that know the
    /// stride ([`PackedConv::for_params`], [`PackedConv::channels_last`]).
    pub(crate) winograd: Option<PackedWinograd>,
}

impl PackedConv {
    /// Packs `w` for `groups` groups; f32 only.
    pub fn new(table: &KernelTable, w: TensorRef, groups: usize) -> Result<PackedConv> {
        Self::pack(table, w, groups, ConvAlgorithm::Auto)
    }

    /// Packs `w` for convolutions with parameters `p`: as [`PackedConv::new`],
    /// or the Winograd transform where that path runs (3×3, stride 1), which
    /// `new` does not know (such a convolution given `new`'s packing
    /// transforms its weight on every call).
    pub fn for_params(table: &KernelTable, w: TensorRef, p: &ConvParams) -> Result<PackedConv> {
        if conv_winograd::applies(table, w.shape, p.groups, p.stride, p.dilation) {
            expect_dtype("conv", "w", w.dtype, DType::F32)?;
            let winograd = Some(PackedWinograd::new(table, view::<f32>("conv", "w", &w)?, w.shape)?);
            let shape = w.shape.to_vec();
            return Ok(PackedConv {
                shape,
                group_count: p.groups,
                groups: Vec::new(),
                taps: None,
                pointwise: None,
                winograd,
            });
        }
        Self::new(table, w, p.groups)
    }

    /// [`PackedConv::for_params`] for the convolution `algorithm` runs: the
    /// Winograd tile [`ConvAlgorithm::WinogradF2`] or
    /// [`ConvAlgorithm::WinogradF4`] asks for (for comparing the two in
    /// benchmarks); `for_params` for the other algorithms.
    pub fn for_params_with(
        table: &KernelTable,
        w: TensorRef,
        p: &ConvParams,
        algorithm: ConvAlgorithm,
    ) -> Result<PackedConv> {
        let Some(tile) = algorithm.winograd_tile() else {
            return Self::for_params(table, w, p);
        };
        let mut packed = Self::for_params(table, w, p)?;
        if packed.winograd.as_ref().is_some_and(|u| u.tile() != tile) {
            let wv = view::<f32>("conv", "w", &w)?;
            packed.winograd = Some(PackedWinograd::with_tile(table, wv, w.shape, tile)?);
        }
        Ok(packed)
    }

    /// Packs `w` for the im2col GEMM even where [`conv`] would run the tap
    /// path: a convolution with this packing runs im2col (for comparing
    /// the two paths in benchmarks).
    pub fn for_im2col(table: &KernelTable, w: TensorRef, groups: usize) -> Result<PackedConv> {
        Self::pack(table, w, groups, ConvAlgorithm::Im2col)
    }

    fn pack(table: &KernelTable, w: TensorRef, groups: usize, algorithm: ConvAlgorithm) -> Result<PackedConv> {
        const K: &str = "conv";
        expect_dtype(K, "w", w.dtype, DType::F32)?;
        let wv = view::<f32>(K, "w", &w)?;
        let cout = w.shape.first().copied().unwrap_or(0);
        if w.shape.len() < 3 || groups == 0 || cout % groups != 0 {
            return Err(shape_err(K, format!("weight {:?} cannot be split into {groups} groups", w.shape)));
        }
        let shape = w.shape.to_vec();
        if algorithm.is_auto() && conv_taps::applies(table, w.shape, groups) {
            let taps = Some(PackedTaps::new(table, wv, w.shape)?);
            return Ok(PackedConv {
                shape,
                group_count: groups,
                groups: Vec::new(),
                taps,
                pointwise: None,
                winograd: None,
            });
        }
        let (cout_g, kdim) = (cout / groups, w.shape[1..].iter().product::<usize>());
        let packed = (0..groups)
            .map(|g| PackedA::new(table, cout_g, kdim, &wv[g * cout_g * kdim..], kdim))
            .collect::<Result<Vec<_>>>()?;
        Ok(PackedConv { shape, group_count: groups, groups: packed, taps: None, pointwise: None, winograd: None })
    }

    /// Packs `w` for [`crate::conv_fused_channels_last`] with parameters
    /// `p`, for inputs of `Cin/groups · groups` channels: the Winograd
    /// transform, the tap GEMMs' B or the pointwise GEMM's B where those
    /// paths run; None where the channels-last kernel reads no packed weight
    /// (depthwise, and the convolutions it runs channels-first).
    pub fn channels_last(table: &KernelTable, w: TensorRef, p: &ConvParams) -> Result<Option<PackedConv>> {
        let groups = p.groups;
        use super::conv_nhwc::{path_of, NhwcPath};
        expect_dtype("conv", "w", w.dtype, DType::F32)?;
        let wv = view::<f32>("conv", "w", &w)?;
        if w.shape.len() != 4 || groups == 0 {
            return Ok(None);
        }
        let (shape, cin) = (w.shape.to_vec(), w.shape[1] * groups);
        let packed = |taps, pointwise, winograd| {
            Some(PackedConv { shape, group_count: groups, groups: Vec::new(), taps, pointwise, winograd })
        };
        Ok(match path_of(table, w.shape, p, cin) {
            NhwcPath::Winograd => packed(None, None, Some(PackedWinograd::new(table, wv, w.shape)?)),
            NhwcPath::Taps => packed(Some(PackedTaps::new(table, wv, w.shape)?), None, None),
            NhwcPath::Pointwise => {
                let b = PackedB::new(table, cin, w.shape[0], wv, cin, true)?;
                packed(None, Some(b), None)
            }
            // The same packing, of the im2col GEMM's `[Cin·kh·kw, Cout]` B.
            NhwcPath::Im2col => {
                let kdim = wv.len() / w.shape[0].max(1);
                let b = PackedB::new(table, kdim, w.shape[0], wv, kdim, true)?;
                packed(None, Some(b), None)
            }
            NhwcPath::Depthwise | NhwcPath::Transposed => None,
        })
    }

    /// Whether this is a packing of a weight of shape `shape` for `groups`.
    pub(crate) fn is_for(&self, shape: &[usize], groups: usize) -> bool {
        self.shape == shape && self.group_count == groups
    }

    /// The packed weight's shape.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether `table`'s microkernel reads this packing.
    pub fn fits(&self, table: &KernelTable) -> bool {
        self.groups.iter().all(|g| g.fits(table))
            && self.taps.as_ref().is_none_or(|t| t.fits(table))
            && self.pointwise.as_ref().is_none_or(|b| b.fits(table))
            && self.winograd.as_ref().is_none_or(|u| u.fits(table))
    }
}

/// [`conv`] with its weight also packed ([`PackedConv`] of that `w`, for
/// `p.groups`): the im2col GEMMs read the packed copy and pack no A. Falls
/// back to packing when the packing does not fit `cx`'s table.
pub fn conv_packed(
    x: TensorRef,
    w: TensorRef,
    packed: &PackedConv,
    bias: Option<TensorRef>,
    p: &ConvParams,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    if packed.shape != w.shape || packed.group_count != p.groups {
        return Err(shape_err("conv", format!("packed weight {:?} is not this weight {:?}", packed.shape, w.shape)));
    }
    let packed = packed.fits(cx.table).then_some(packed);
    conv_inner(x, w, packed, bias, &TensorEpilogue::default(), p, out, cx, ConvAlgorithm::Auto)
}

/// [`conv_packed`] with the f32 algorithm chosen by the caller (for
/// benchmarks comparing the paths with weights packed once).
#[allow(clippy::too_many_arguments)]
pub fn conv_packed_with(
    x: TensorRef,
    w: TensorRef,
    packed: &PackedConv,
    bias: Option<TensorRef>,
    p: &ConvParams,
    out: TensorMut,
    cx: &mut Context,
    algorithm: ConvAlgorithm,
) -> Result<()> {
    if packed.shape != w.shape || packed.group_count != p.groups {
        return Err(shape_err("conv", format!("packed weight {:?} is not this weight {:?}", packed.shape, w.shape)));
    }
    let packed = packed.fits(cx.table).then_some(packed);
    conv_inner(x, w, packed, bias, &TensorEpilogue::default(), p, out, cx, algorithm)
}

/// What a fused convolution or linear applies to each output element after
/// the bias (`kiln_isa::epilogue`): the activation and a residual tensor
/// shaped like the output, added before or after it. f32 only.
#[derive(Copy, Clone, Debug, Default)]
pub struct TensorEpilogue<'a> {
    pub activation: Option<Activation>,
    pub residual: Option<TensorRef<'a>>,
    /// Add the residual before the activation instead of after it.
    pub residual_first: bool,
}

impl TensorEpilogue<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        self.activation.is_none() && self.residual.is_none()
    }
}

/// [`conv`] followed by `epilogue`, applied in the GEMM's store step (or to
/// each finished row of the depthwise loops) while the output is hot; with
/// `packed` (a [`PackedConv`] of this `w`, for `p.groups`), the GEMMs read
/// the packed weight when it fits `cx`'s table.
#[allow(clippy::too_many_arguments)]
pub fn conv_fused(
    x: TensorRef,
    w: TensorRef,
    packed: Option<&PackedConv>,
    bias: Option<TensorRef>,
    epilogue: &TensorEpilogue<'_>,
    p: &ConvParams,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    if let Some(packed) = packed {
        if packed.shape != w.shape || packed.group_count != p.groups {
            return Err(shape_err(
                "conv",
                format!("packed weight {:?} is not this weight {:?}", packed.shape, w.shape),
            ));
        }
    }
    let packed = packed.filter(|p| p.fits(cx.table));
    conv_inner(x, w, packed, bias, epilogue, p, out, cx, ConvAlgorithm::Auto)
}

/// [`conv`] with the f32 algorithm chosen by the caller (f64 ignores it).
pub fn conv_with(
    x: TensorRef,
    w: TensorRef,
    bias: Option<TensorRef>,
    p: &ConvParams,
    out: TensorMut,
    cx: &mut Context,
    algorithm: ConvAlgorithm,
) -> Result<()> {
    conv_inner(x, w, None, bias, &TensorEpilogue::default(), p, out, cx, algorithm)
}

/// Output positions per plane.
fn osp_of(g: &Geometry) -> usize {
    g.output.iter().product()
}

#[allow(clippy::too_many_arguments)]
fn conv_inner<'a>(
    x: TensorRef,
    w: TensorRef,
    packed: Option<&PackedConv>,
    bias: Option<TensorRef<'a>>,
    fused: &TensorEpilogue<'a>,
    p: &ConvParams,
    mut out: TensorMut,
    cx: &mut Context,
    algorithm: ConvAlgorithm,
) -> Result<()> {
    let (table, scratch) = (cx.table, &mut cx.scratch);
    const K: &str = "conv";
    let dtype = x.dtype;
    for d in [x.dtype, w.dtype, out.dtype] {
        if d != DType::F32 && d != DType::F64 || d != dtype {
            return Err(dtype_err(K, d));
        }
    }
    let g = geometry(x.shape, w.shape, p, out.shape)?;
    let (batch, cin, cout, cin_g) = (x.shape[0], x.shape[1], w.shape[0], w.shape[1]);
    let groups = p.groups;
    if groups == 0 || cin % groups != 0 || cout % groups != 0 || cin / groups != cin_g {
        return Err(shape_err(
            K,
            format!("groups {groups} incompatible with Cin {cin}, Cout {cout}, weight Cin/groups {cin_g}"),
        ));
    }
    if out.shape[0] != batch || out.shape[1] != cout {
        return Err(shape_err(K, format!("output shape {:?} must start with [{batch}, {cout}]", out.shape)));
    }
    let cout_g = cout / groups;
    if dtype == DType::F64 && !fused.is_empty() {
        return Err(shape_err(K, "a fused activation or residual needs f32"));
    }
    if dtype == DType::F64 {
        let bv = match &bias {
            Some(b) => {
                expect_dtype(K, "bias", b.dtype, DType::F64)?;
                if b.shape != [cout] {
                    return Err(shape_err(K, format!("bias shape {:?}, expected [{cout}]", b.shape)));
                }
                Some(view::<f64>(K, "bias", b)?)
            }
            None => None,
        };
        let (xv, wv) = (view::<f64>(K, "x", &x)?, view::<f64>(K, "w", &w)?);
        conv_direct(xv, wv, bv, &g, cin, cout, groups, view_mut::<f64>(K, "out", &mut out)?);
        return Ok(());
    }
    let xv = view::<f32>(K, "x", &x)?;
    let wv = view::<f32>(K, "w", &w)?;
    let (bv, residual) = epilogue_views(K, &bias, &fused.residual, cout, out.shape)?;
    let activation = fused.activation.map(|a| ActivationFn::new(table, a));
    // The epilogue of the output rows starting at `offset` (of the
    // `[N·Cout, osp]` output matrix), given the bias the rows add.
    let epilogue_at = |offset: usize, bias: Bias<'a>| Epilogue {
        bias,
        activation,
        residual: residual.map(|r| (&r[offset..], osp_of(&g))),
        residual_first: fused.residual_first,
        ..Epilogue::default()
    };
    let ov = view_mut::<f32>(K, "out", &mut out)?;
    let isp: usize = g.input.iter().product();
    let osp: usize = g.output.iter().product();
    let ksp: usize = g.kernel.iter().product();
    let kdim = cin_g * ksp;
    if ov.is_empty() {
        return Ok(());
    }

    // One input channel per group: each output plane is a weighted sum of
    // shifted copies of one input plane, which the GEMM would run with M = 1.
    // With groups == 1 (a single input channel) and several outputs the GEMM's
    // blocking over output channels wins, so Auto keeps im2col there.
    let depthwise = cin_g == 1 && groups == cin;
    let use_depthwise = match algorithm {
        ConvAlgorithm::Auto | ConvAlgorithm::Taps | ConvAlgorithm::WinogradF2 | ConvAlgorithm::WinogradF4 => {
            depthwise && (groups > 1 || cout == 1)
        }
        ConvAlgorithm::Im2col => false,
        ConvAlgorithm::Depthwise if depthwise => true,
        ConvAlgorithm::Depthwise => {
            return Err(shape_err(K, format!("depthwise path needs groups == Cin, got groups {groups}, Cin {cin}")));
        }
    };
    if use_depthwise {
        conv_depthwise_f32(xv, wv, bv, &epilogue_at(0, Bias::None), &g, cin, cout, ov, table, scratch);
        return Ok(());
    }

    if kdim == 0 {
        let epilogue = epilogue_at(0, Bias::None);
        for (c, plane) in ov.chunks_exact_mut(osp).enumerate() {
            plane.fill(bv.map_or(0.0, |b| b[c % cout]));
            epilogue.apply(plane, c, 0);
        }
        return Ok(());
    }

    let im2col_packing = packed.is_some_and(|p| p.taps.is_none() && p.winograd.is_none());
    if algorithm.is_auto() && !im2col_packing && conv_winograd::applies(table, w.shape, groups, p.stride, p.dilation) {
        // As for the taps: packed or not, the same path, tile and bits.
        let tile = algorithm.winograd_tile().unwrap_or(WinogradTile::of(cin, cout));
        let owned;
        let u = match packed.and_then(|p| p.winograd.as_ref()).filter(|u| u.tile() == tile) {
            Some(u) => u,
            None => {
                owned = PackedWinograd::with_tile(table, wv, w.shape, tile)?;
                &owned
            }
        };
        let threads = scratch.pack.threads.count();
        let (buf, pack) = scratch.split(conv_winograd::scratch_len(&g, u, threads));
        let e = TapEpilogue { bias: bv, activation, residual, residual_first: fused.residual_first };
        let io = conv_taps::Io { x: xv, out: &mut *ov, channels_last: false };
        if conv_winograd::conv_winograd(table, io, u, &e, &g, (batch, cin, cout), buf, pack) {
            return Ok(());
        }
    }
    let taps_allowed = algorithm.is_auto() || algorithm == ConvAlgorithm::Taps;
    if taps_allowed && !im2col_packing && conv_taps::applies(table, w.shape, groups) {
        // The same path packed or not, so that both give the same bits; an
        // unpacked weight (not a constant) is packed for this call.
        let owned;
        let taps = match packed.and_then(|p| p.taps.as_ref()) {
            Some(t) => t,
            None => {
                owned = PackedTaps::new(table, wv, w.shape)?;
                &owned
            }
        };
        let (buf, pack) = scratch.split(conv_taps::scratch_len(&g, cin, cout));
        let e = TapEpilogue { bias: bv, activation, residual, residual_first: fused.residual_first };
        let io = conv_taps::Io { x: xv, out: &mut *ov, channels_last: false };
        if conv_taps::conv_taps(table, io, taps, &e, &g, (batch, cin, cout), buf, pack) {
            return Ok(());
        }
    }
    // A packing of A per group, if this weight has one.
    let packed = packed.filter(|p| p.groups.len() == groups);
    // Each GEMM writes its own block of output (beta = 0), and adds the
    // bias of its output channels (rows) in its epilogue.
    let pointwise = ksp == 1 && g.stride == [1; 3] && g.pad == [0; 3];
    let pack = &mut scratch.pack;
    // A group's weight: packed at load, or packed by each GEMM.
    let weight = |gi: usize, wg| match packed {
        Some(p) => ASource::Packed(&p.groups[gi]),
        None => ASource::Strided { a: wg, lda: kdim },
    };
    for n in 0..batch {
        for gi in 0..groups {
            let wg = &wv[gi * cout_g * kdim..(gi + 1) * cout_g * kdim];
            let xg = &xv[(n * cin + gi * cin_g) * isp..(n * cin + (gi + 1) * cin_g) * isp];
            let o_off = (n * cout + gi * cout_g) * osp;
            let bias = bv.map_or(Bias::None, |b| Bias::PerRow(&b[gi * cout_g..(gi + 1) * cout_g]));
            let epilogue = epilogue_at(o_off, bias);
            let c = &mut ov[o_off..];
            if pointwise {
                // A 1×1 stride-1 conv is already a GEMM over the input planes.
                let b = BSource::strided(xg, isp, false);
                run_gemm(table, cout_g, osp, kdim, weight(gi, wg), b, c, osp, 0.0, epilogue, pack);
            } else {
                // Implicit im2col: the GEMM packs its B strips straight from
                // the input, so the column matrix is never stored.
                let pack_b = |pc, kc, c0, cols, strip: &mut [f32]| pack_conv_strip(xg, &g, pc, kc, c0, cols, strip);
                let b = BSource::Implicit(&pack_b);
                run_gemm(table, cout_g, osp, kdim, weight(gi, wg), b, c, osp, 0.0, epilogue, pack);
            }
        }
    }
    Ok(())
}

/// Most output positions one packed strip covers (the widest microkernel
/// tile's NR is 32).
const MAX_STRIP: usize = 64;

/// Tap columns whose valid output columns [`pack_conv_strip`] tabulates
/// once per strip (wider kernels compute them per row).
const MAX_TAP_COLUMNS: usize = 16;

/// One output row's part of a strip: strip columns `j0..j0 + len` are output
/// positions (`oz`, `oy`, `ox0..ox0 + len`).
#[derive(Copy, Clone, Default)]
struct RowSegment {
    j0: usize,
    len: usize,
    oz: usize,
    oy: usize,
    ox0: usize,
}

/// Packs rows `pc..pc + kc` (channel-major, then kernel z/y/x taps) and
/// columns `c0..c0 + cols` (output positions) of the im2col matrix of `x`
/// (one group's input channels) into a GEMM B strip laid out k-major
/// (`strip[p * nr + j]`, zero-padded past `cols`): the value under tap `p`
/// for output position `c0 + j`, or 0 in the padding. The strip's positions
/// are cut into output-row segments once; along a segment the valid columns
/// of a tap form one interval, so each segment of each row is zeros, a
/// (strided) copy, zeros — no per-element bounds tests.
fn pack_conv_strip(x: &[f32], g: &Geometry, pc: usize, kc: usize, c0: usize, cols: usize, strip: &mut [f32]) {
    let [id, ih, iw] = g.input;
    let [_, kh, kw] = g.kernel;
    let [_, oh, ow] = g.output;
    let (isp, ksp) = (id * ih * iw, g.kernel.iter().product::<usize>());
    let (sx, px, dx) = (g.stride[2], g.pad[2], g.dil[2]);
    let nr = strip.len() / kc.max(1);
    assert!(cols <= nr && nr <= MAX_STRIP, "conv strip of {cols} columns, {nr} wide");
    let mut segments = [RowSegment::default(); MAX_STRIP];
    let mut count = 0;
    let mut j = 0;
    while j < cols {
        let pos = c0 + j;
        let (oz, oy, ox0) = (pos / (oh * ow), (pos / ow) % oh, pos % ow);
        let len = (ow - ox0).min(cols - j);
        segments[count] = RowSegment { j0: j, len, oz, oy, ox0 };
        count += 1;
        j += len;
    }
    let segments = &segments[..count];
    // The valid output columns of each tap column, once per strip rather
    // than once per row (two divisions by the stride each).
    let mut valid = [(0usize, 0usize); MAX_TAP_COLUMNS];
    for (kx, v) in valid.iter_mut().enumerate().take(kw) {
        *v = valid_columns(kx * dx, px, sx, iw, ow);
    }
    // Row `pc`'s channel and taps, then stepped along with the rows (no
    // divisions per row).
    let (mut ch, t) = (pc / ksp, pc % ksp);
    let (mut kz, mut ky, mut kx) = (t / (kh * kw), (t / kw) % kh, t % kw);
    for row in strip.chunks_exact_mut(nr).take(kc) {
        let plane = &x[ch * isp..][..isp];
        let shift = kx * dx;
        let (lo, hi) = if kw <= MAX_TAP_COLUMNS { valid[kx] } else { valid_columns(shift, px, sx, iw, ow) };
        let (tz, ty) = (kz, ky);
        // The next row's tap: x fastest, then y, z, channel.
        kx += 1;
        if kx == kw {
            kx = 0;
            ky += 1;
            if ky == kh {
                ky = 0;
                kz += 1;
                if kz == g.kernel[0] {
                    kz = 0;
                    ch += 1;
                }
            }
        }
        row[cols..].fill(0.0);
        for s in segments {
            let seg = &mut row[s.j0..s.j0 + s.len];
            // Negative coordinates wrapped to huge values fail the bounds test too.
            let iz = (s.oz * g.stride[0] + tz * g.dil[0]).wrapping_sub(g.pad[0]);
            let iy = (s.oy * g.stride[1] + ty * g.dil[1]).wrapping_sub(g.pad[1]);
            if iz >= id || iy >= ih {
                seg.fill(0.0);
                continue;
            }
            let src = &plane[(iz * ih + iy) * iw..][..iw];
            // This segment's part of the valid interval, relative to it.
            let a = lo.clamp(s.ox0, s.ox0 + s.len) - s.ox0;
            let b = hi.clamp(s.ox0, s.ox0 + s.len) - s.ox0;
            seg[..a].fill(0.0);
            seg[b.max(a)..].fill(0.0);
            if a < b {
                let first = (s.ox0 + a) * sx + shift - px;
                let dst = &mut seg[a..b];
                if sx == 1 {
                    dst.copy_from_slice(&src[first..][..dst.len()]);
                } else {
                    for (q, v) in dst.iter_mut().enumerate() {
                        *v = src[first + q * sx];
                    }
                }
            }
        }
    }
}

/// Output columns `ox` in `[lo, hi)` satisfy `0 <= ox*stride + shift - pad < width`
/// (`shift` = the tap's dilated offset); `lo == hi` when there are none.
pub(super) fn valid_columns(shift: usize, pad: usize, stride: usize, width: usize, out_width: usize) -> (usize, usize) {
    let lo = pad.saturating_sub(shift).div_ceil(stride).min(out_width);
    let hi = if width + pad > shift { (width + pad - shift).div_ceil(stride).min(out_width) } else { 0 };
    (lo, hi.max(lo))
}

/// Direct convolution: every output element sums its receptive field in `T`.
/// `x` is `[N, cin, input..]`, `w` `[cout, cin/groups, kernel..]`, `out`
/// `[N, cout, output..]` (shapes already checked against `g`).
#[allow(clippy::too_many_arguments)]
fn conv_direct<T: Real>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geometry,
    cin: usize,
    cout: usize,
    groups: usize,
    out: &mut [T],
) {
    let isp: usize = g.input.iter().product();
    let osp: usize = g.output.iter().product();
    let ksp: usize = g.kernel.iter().product();
    let cin_g = cin / groups;
    let cout_g = cout / groups;
    let [_, oh, ow] = g.output;
    let [id, ih, iw] = g.input;
    let [_, kh, kw] = g.kernel;
    let tap = |o: usize, k: usize, d: usize| (o * g.stride[d] + k * g.dil[d]).checked_sub(g.pad[d]);
    for (plane_index, plane) in out.chunks_exact_mut(osp.max(1)).enumerate() {
        let (n, oc) = (plane_index / cout.max(1), plane_index % cout.max(1));
        let first_in = (oc / cout_g.max(1)) * cin_g;
        let b = bias.map_or(T::ZERO, |b| b[oc]);
        for (pos, o) in plane.iter_mut().enumerate() {
            let (oz, oy, ox) = (pos / (oh * ow), (pos / ow) % oh, pos % ow);
            let mut acc = b;
            for ic in 0..cin_g {
                let xc = &x[(n * cin + first_in + ic) * isp..][..isp];
                let wc = &w[(oc * cin_g + ic) * ksp..][..ksp];
                for (t, &wv) in wc.iter().enumerate() {
                    let (kz, ky, kx) = (t / (kh * kw), (t / kw) % kh, t % kw);
                    let (Some(iz), Some(iy), Some(ix)) = (tap(oz, kz, 0), tap(oy, ky, 1), tap(ox, kx, 2)) else {
                        continue;
                    };
                    if iz < id && iy < ih && ix < iw {
                        acc += xc[(iz * ih + iy) * iw + ix] * wv;
                    }
                }
            }
            *o = acc;
        }
    }
}

/// A fused convolution's bias and residual, viewed as f32.
type EpilogueViews<'a> = (Option<&'a [f32]>, Option<&'a [f32]>);

/// A fused f32 convolution's bias (`[cout]`) and residual (the output's
/// shape), checked and viewed.
pub(crate) fn epilogue_views<'a>(
    k: &'static str,
    bias: &Option<TensorRef<'a>>,
    residual: &Option<TensorRef<'a>>,
    cout: usize,
    out_shape: &[usize],
) -> Result<EpilogueViews<'a>> {
    let bias = match bias {
        Some(b) => {
            expect_dtype(k, "bias", b.dtype, DType::F32)?;
            if b.shape != [cout] {
                return Err(shape_err(k, format!("bias shape {:?}, expected [{cout}]", b.shape)));
            }
            Some(view::<f32>(k, "bias", b)?)
        }
        None => None,
    };
    let residual = match residual {
        Some(r) => {
            expect_dtype(k, "residual", r.dtype, DType::F32)?;
            if r.shape != out_shape {
                return Err(shape_err(k, format!("residual shape {:?}, expected {out_shape:?}", r.shape)));
            }
            Some(view::<f32>(k, "residual", r)?)
        }
        None => None,
    };
    Ok((bias, residual))
}
