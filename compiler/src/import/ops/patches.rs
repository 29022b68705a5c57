//! Ops that move spatial blocks into channels and back, which torch's
//! training IR keeps whole: `pixel_shuffle` / `pixel_unshuffle` (a reshape,
//! a permutation and a reshape, as their Core ATen forms) and `im2col`
//! (`F.unfold`: zero padding, then a `Gather` of every patch element at
//! index constants — the inverse of `col2im`'s scatter).

use super::indexing::{bind_as_output, block_count, i64_const, padded_size, patch_positions, reshape};
use crate::import::importer::{checked, invalid, table_len, unsupported, Importer, R};
use crate::pt2::program::Node;
use kiln_ir::{Dim, Op, PadMode, ValueId};

fn permute(imp: &mut Importer, v: ValueId, perm: Vec<usize>) -> R<ValueId> {
    imp.push(Op::Permute { perm }, vec![v])
}

/// `aten::pixel_shuffle(Tensor self, int upscale_factor)`:
/// `[*, C r², H, W]` → `[*, C, H r, W r]`, element `(c, h r + i, w r + j)`
/// taken from channel `c r² + i r + j` at `(h, w)`.
pub(super) fn pixel_shuffle(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let r = imp.int(n, "upscale_factor", None)?;
    let out = imp.out_ty(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    let rank = shape.len();
    if rank < 3 || r < 1 || out.rank() != rank {
        return invalid(format!("pixel_shuffle of a rank-{rank} tensor by {r}"));
    }
    let lead = rank - 3;
    let (c, h, w) = (out.shape[lead].clone(), shape[lead + 1].clone(), shape[lead + 2].clone());
    // [*, C, r, r, H, W] -> [*, C, H, r, W, r] -> [*, C, H r, W r]
    let mut split = shape[..lead].to_vec();
    split.extend([c, Dim::Const(r), Dim::Const(r), h, w]);
    let v = reshape(imp, x, split);
    let mut perm: Vec<usize> = (0..lead).collect();
    perm.extend([lead, lead + 3, lead + 1, lead + 4, lead + 2].iter());
    let v = permute(imp, v, perm)?;
    let v = reshape(imp, v, out.shape.clone());
    imp.bind(n, 0, v)
}

/// `aten::pixel_unshuffle(Tensor self, int downscale_factor)`, the inverse:
/// `[*, C, H r, W r]` → `[*, C r², H, W]`.
pub(super) fn pixel_unshuffle(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let r = imp.int(n, "downscale_factor", None)?;
    let out = imp.out_ty(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    let rank = shape.len();
    if rank < 3 || r < 1 || out.rank() != rank {
        return invalid(format!("pixel_unshuffle of a rank-{rank} tensor by {r}"));
    }
    let lead = rank - 3;
    let (h, w) = (out.shape[lead + 1].clone(), out.shape[lead + 2].clone());
    // [*, C, H, r, W, r] -> [*, C, r, r, H, W] -> [*, C r², H, W]
    let mut split = shape[..lead + 1].to_vec();
    split.extend([h, Dim::Const(r), w, Dim::Const(r)]);
    let v = reshape(imp, x, split);
    let mut perm: Vec<usize> = (0..lead + 1).collect();
    perm.extend([lead + 2, lead + 4, lead + 1, lead + 3].iter());
    let v = permute(imp, v, perm)?;
    let v = reshape(imp, v, out.shape.clone());
    imp.bind(n, 0, v)
}

/// `aten::im2col(Tensor self, int[2] kernel_size, int[2] dilation,
///   int[2] padding, int[2] stride)`: `[N, C, H, W]` (or `[C, H, W]`) →
/// `[N, C kh kw, L]`, row `c kh kw + ki kw + kj`, column the block
/// `bi lw + bj`. H and W must be static (the patch positions are constants).
pub(super) fn im2col(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let k = imp.ints_n(n, "kernel_size", &[], 2)?;
    let dil = imp.ints_n(n, "dilation", &[], 2)?;
    let pad = imp.ints_n(n, "padding", &[], 2)?;
    let st = imp.ints_n(n, "stride", &[], 2)?;
    if k.iter().chain(&dil).chain(&st).any(|&v| v < 1) || pad.iter().any(|&p| p < 0) {
        return invalid("im2col parameters");
    }
    let shape = imp.ty(x).shape.clone();
    let batched = match shape.len() {
        4 => true,
        3 => false,
        r => return invalid(format!("im2col of a rank-{r} tensor (3-d or 4-d expected)")),
    };
    let x = if batched { x } else { reshape(imp, x, [vec![Dim::Const(1)], shape.clone()].concat()) };
    let shape = imp.ty(x).shape.clone();
    let (Some(h), Some(w)) = (shape[2].as_const(), shape[3].as_const()) else {
        return unsupported("im2col over a dynamic height or width");
    };
    let (hp, wp) = (padded_size(h, pad[0])?, padded_size(w, pad[1])?);
    let (lh, lw) = (block_count(hp, k[0], dil[0], st[0])?, block_count(wp, k[1], dil[1], st[1])?);
    if lh < 1 || lw < 1 {
        return invalid(format!("im2col: a {}x{} kernel does not fit the padded {hp}x{wp} input", k[0], k[1]));
    }
    let image = checked("im2col's padded image", hp.checked_mul(wp))?;
    let (b, c) = (shape[0].clone(), shape[1].clone());
    let padded = if pad.iter().any(|&p| p > 0) {
        imp.push(
            Op::Pad {
                lo: vec![0, 0, pad[0], pad[1]],
                hi: vec![0, 0, pad[0], pad[1]],
                interior: vec![0; 4],
                mode: PadMode::Constant,
                value: 0.0,
            },
            vec![x],
        )?
    } else {
        x
    };
    let flat = reshape(imp, padded, vec![b.clone(), c.clone(), Dim::Const(image)]);
    let positions = patch_positions("im2col", &k, &dil, &st, wp, (lh, lw))?;
    let idx = i64_const(imp, &[positions.len() as i64], &positions);
    let cols = imp.push(Op::Gather { axis: 2 }, vec![flat, idx])?;
    let cols = reshape(imp, cols, vec![b, Dim::mul(c, Dim::Const(k[0] * k[1])), Dim::Const(lh * lw)]);
    bind_as_output(imp, n, cols)
}

/// `aten::unfold(Tensor(a) self, int dimension, int size, int step)`
/// (`Tensor.unfold`, which `torch.stft` frames with): axis `dimension` of
/// length `L` becomes `(L - size) / step + 1` windows and a new last axis of
/// `size` holds each window, a `Gather` at `f·step + j`. The axis must be static.
pub(super) fn unfold(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let (size, step) = (imp.int(n, "size", None)?, imp.int(n, "step", None)?);
    let rank = imp.ty(x).rank();
    if rank == 0 {
        // torch treats a 0-d tensor as one element along dim 0 or -1: a
        // window of 1 is that element as [1], a window of 0 is empty.
        super::shape::normalize_axis(imp.int(n, "dimension", None)?, 1)?;
        if !(0..=1).contains(&size) || step < 1 {
            return invalid(format!("unfold of a 0-d tensor into windows of {size} every {step}"));
        }
        let out = imp.out_ty(n, 0)?;
        if out.shape != [Dim::Const(size)] {
            return invalid(format!("unfold of a 0-d tensor declares the shape {:?}", out.shape));
        }
        let v = if size == 1 {
            imp.push_typed(Op::Reshape { shape: out.shape.clone() }, vec![x], out)
        } else {
            imp.push_typed(Op::Full { value: 0.0, dtype: out.dtype, shape: out.shape.clone() }, vec![], out)
        };
        return imp.bind(n, 0, v);
    }
    let axis = super::shape::normalize_axis(imp.int(n, "dimension", None)?, rank)?;
    let Some(len) = imp.ty(x).shape[axis].as_const() else {
        return unsupported("unfold along a dimension of symbolic size");
    };
    if size < 0 || step < 1 || size > len {
        return invalid(format!("unfold of length {len} into windows of {size} every {step}"));
    }
    let frames = (len - size) / step + 1;
    table_len("unfold's window positions", &[frames, size])?;
    let idx: Vec<i64> = (0..frames).flat_map(|f| (0..size).map(move |j| f * step + j)).collect();
    let idx = i64_const(imp, &[frames, size], &idx);
    let v = imp.push(Op::Gather { axis }, vec![x, idx])?;
    // [.., frames, size, rest..] -> [.., frames, rest.., size]
    let mut perm: Vec<usize> = (0..=rank).filter(|&d| d != axis + 1).collect();
    perm.push(axis + 1);
    let v = if axis + 1 == rank { v } else { permute(imp, v, perm)? };
    imp.bind(n, 0, v)
}
