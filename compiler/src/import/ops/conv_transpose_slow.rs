//! f16/bf16 transposed convolution with PyTorch's CPU rounding.
//!
//! Where oneDNN does not take it, torch computes a reduced-precision
//! `conv_transpose` on the CPU as a GEMM (f32 accumulation, each column
//! element rounded to the dtype) followed by `col2im`, which adds the kernel
//! taps overlapping an output pixel one at a time *in the dtype*, in kernel
//! order, and finally adds the bias (in f32, rounded once). On x86 without
//! f16 oneDNN kernels that is every f16 case, and the bf16 cases oneDNN
//! refuses: an `output_padding` not below its `stride` (then the spread
//! input's tail is dilation, not stride). Elsewhere bf16 takes oneDNN, which
//! computes in f32 and rounds once — kiln's usual lowering.
//! kiln's usual lowering is more exact, but lands a few ulps (for bf16 up
//! to whole units) from torch's slow path wherever taps overlap. This path
//! reproduces torch's sequence: results are bit-identical to torch 2.15's
//! (checked on random geometries: groups, dilation, padding, output padding).
//!
//! The cost is one Slice/Pad/Add per kernel tap, acceptable for a dtype the
//! CPU runs rarely; it needs static spatial and channel sizes.

use crate::import::importer::{checked, invalid, Importer, R};
use kiln_ir::{BinaryOp, DType, Dim, Op, PadMode, ValueId};

/// The most kernel taps the slow path unrolls.
const MAX_TAPS: i64 = 4096;

/// The geometry of one transposed convolution (`k` spatial dims).
pub(super) struct Geometry<'a> {
    pub stride: &'a [i64],
    pub padding: &'a [i64],
    pub output_padding: &'a [i64],
    pub dilation: &'a [i64],
    pub groups: i64,
}

/// Whether torch's CPU kernel takes the slow GEMM + col2im path for this
/// dtype and geometry (see the module doc).
pub(super) fn takes_torch_slow_path(dtype: DType, geo: &Geometry) -> bool {
    match dtype {
        DType::F16 => true,
        DType::BF16 => geo.output_padding.iter().zip(geo.stride).any(|(op, s)| op >= s),
        _ => false,
    }
}

/// `x` is batched `[N, Cin, S..]` f16 or bf16, `w` is `[Cin, Cout/groups, K..]`;
/// returns `[N, Cout, O..]`, or `None` when a size is not static (the caller
/// then takes the general path).
pub(super) fn conv_transpose_slow_path(
    imp: &mut Importer,
    x: ValueId,
    w: ValueId,
    bias: Option<ValueId>,
    geo: &Geometry,
) -> R<Option<ValueId>> {
    let (Some(xs), Some(ws)) = (imp.ty(x).static_shape(), imp.ty(w).static_shape()) else { return Ok(None) };
    let k = ws.len() - 2;
    let (n, cin, g) = (xs[0], xs[1], geo.groups);
    if g < 1 || cin % g != 0 || ws[0] != cin || xs.len() != k + 2 {
        return invalid(format!("weight {ws:?} for input {xs:?} with {g} groups"));
    }
    let (cin_g, cout_g) = (cin / g, ws[1]);
    let kernel = &ws[2..];
    let spatial = &xs[2..];
    let what = "transposed convolution geometry";
    let product = |v: &[i64]| checked(what, v.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d)));
    let taps = product(kernel)?;
    // One Slice/Pad/Add per tap: beyond any real kernel, take the general path.
    if taps > MAX_TAPS {
        return Ok(None);
    }
    let points = product(spatial)?;
    let out_size = (0..k)
        .map(|d| {
            let spread = (spatial[d] - 1).checked_mul(geo.stride[d]);
            let reach = geo.dilation[d].checked_mul(kernel[d] - 1);
            let size = spread
                .zip(reach)
                .and_then(|(s, r)| s.checked_sub(geo.padding[d].checked_mul(2)?)?.checked_add(r))
                .and_then(|v| v.checked_add(geo.output_padding[d])?.checked_add(1));
            checked(what, size)
        })
        .collect::<R<Vec<i64>>>()?;
    let g_cout = checked(what, g.checked_mul(cout_g))?;
    let cout_taps = checked(what, cout_g.checked_mul(taps))?;
    let dims = |v: &[i64]| v.iter().map(|&d| Dim::Const(d)).collect::<Vec<_>>();

    // columns[n, g, (cout_g, taps), p] = Σ_cin w[g, cin, (cout_g, taps)] · x[n, g, cin, p]:
    // a batched GEMM, f32 accumulation, rounded to the dtype (the MatMul's legalisation).
    let xg = imp.push(Op::Reshape { shape: dims(&[n, g, cin_g, points]) }, vec![x])?;
    let wg = imp.push(Op::Reshape { shape: dims(&[g, cin_g, cout_taps]) }, vec![w])?;
    let wt = imp.push(Op::Permute { perm: vec![0, 2, 1] }, vec![wg])?;
    let cols = imp.push(Op::MatMul, vec![wt, xg])?;
    let mut split = vec![n, g_cout];
    split.extend(kernel);
    split.extend(spatial);
    let cols = imp.push(Op::Reshape { shape: dims(&split) }, vec![cols])?;

    // col2im: each tap placed on the output grid (spread by the stride,
    // shifted by its offset, cropped), added in the dtype in kernel order.
    let mut out_shape = vec![n, g_cout];
    out_shape.extend(&out_size);
    let dtype = imp.ty(x).dtype;
    let mut acc = imp.push(Op::Full { value: 0.0, dtype, shape: dims(&out_shape) }, vec![])?;
    let mut tap = vec![0i64; k];
    for _ in 0..taps {
        let mut v = cols;
        for (d, &t) in tap.iter().enumerate() {
            v = imp.push(Op::Slice { axis: 2 + d, start: t, end: t + 1, step: 1 }, vec![v])?;
        }
        let mut placed_shape = vec![n, g_cout];
        placed_shape.extend(spatial);
        let v = imp.push(Op::Reshape { shape: dims(&placed_shape) }, vec![v])?;
        let (mut lo, mut hi, mut interior) = (vec![0; k + 2], vec![0; k + 2], vec![0; k + 2]);
        for d in 0..k {
            // `tap * dilation` is at most `dilation * (kernel - 1)`, checked above.
            let spread = ((spatial[d] - 1) * geo.stride[d]).checked_add(1);
            lo[2 + d] = checked(what, (tap[d] * geo.dilation[d]).checked_sub(geo.padding[d]))?;
            let rest = spread.and_then(|s| out_size[d].checked_sub(s)?.checked_sub(lo[2 + d]));
            hi[2 + d] = checked(what, rest)?;
            interior[2 + d] = checked(what, geo.stride[d].checked_sub(1))?;
        }
        let placed = imp.push(Op::Pad { lo, hi, interior, mode: PadMode::Constant, value: 0.0 }, vec![v])?;
        acc = imp.push(Op::Binary(BinaryOp::Add), vec![acc, placed])?;
        // Next tap in row-major kernel order.
        for d in (0..k).rev() {
            tap[d] += 1;
            if tap[d] < kernel[d] {
                break;
            }
            tap[d] = 0;
        }
    }
    let Some(b) = bias else { return Ok(Some(acc)) };
    let mut bshape = vec![g_cout];
    bshape.extend(std::iter::repeat_n(1, k));
    let b = imp.push(Op::Reshape { shape: dims(&bshape) }, vec![b])?;
    Ok(Some(imp.push(Op::Binary(BinaryOp::Add), vec![acc, b])?))
}
