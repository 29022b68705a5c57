//! Instruction dispatch: one `match` from the plan's kernel ids to the kernels.

use crate::format::Kernel;
use kiln_kernels::{self as k, ConvParams, PoolParams, Result, Scratch, TensorMut, TensorRef};

/// Small parameter lists (≤ 3 spatial dims, ≤ MAX_RANK axes) converted without
/// allocating.
struct Usizes {
    buf: [usize; crate::validate::MAX_RANK],
    len: usize,
}

impl Usizes {
    fn of(v: &[u32]) -> Usizes {
        let mut buf = [0; crate::validate::MAX_RANK];
        let len = v.len().min(buf.len());
        for (b, &x) in buf.iter_mut().zip(v) {
            *b = x as usize;
        }
        Usizes { buf, len }
    }
    fn get(&self) -> &[usize] {
        &self.buf[..self.len]
    }
}

/// Runs one instruction. `in_place` says the first operand shares the output's
/// storage (a reshape the planner aliased), which makes `Copy` a no-op.
pub(crate) fn dispatch(
    kernel: &Kernel,
    ins: &[TensorRef<'_>],
    out: TensorMut<'_>,
    in_place: bool,
    scratch: &mut Scratch,
) -> Result<()> {
    // Operand counts were validated at load; `opt` reads trailing optionals.
    let opt = |i: usize| ins.get(i).copied();
    match kernel {
        Kernel::Unary(op) => k::unary(*op, ins[0], out),
        Kernel::Binary(op) => k::binary(*op, ins[0], ins[1], out),
        Kernel::Where => k::where_(ins[0], ins[1], ins[2], out),
        Kernel::Cast => k::cast(ins[0], out),
        Kernel::Clamp { min, max } => k::clamp(ins[0], *min, *max, out),
        Kernel::MatMul => k::matmul(ins[0], ins[1], out, scratch),
        Kernel::Linear => k::linear(ins[0], ins[1], opt(2), out, scratch),
        Kernel::Conv { stride, padding, dilation, groups } => {
            let (s, p, d) = (Usizes::of(stride), Usizes::of(padding), Usizes::of(dilation));
            let params = ConvParams { stride: s.get(), padding: p.get(), dilation: d.get(), groups: *groups as usize };
            k::conv(ins[0], ins[1], opt(2), &params, out, scratch)
        }
        Kernel::BatchNorm { eps } => k::batch_norm(ins[0], ins[1], ins[2], ins[3], ins[4], *eps, out),
        Kernel::LayerNorm { normalized_rank, eps } => {
            k::layer_norm(ins[0], opt(1), opt(2), *normalized_rank as usize, *eps, out)
        }
        Kernel::Softmax { axis, log } => k::softmax(ins[0], *axis as usize, *log, out),
        Kernel::Reduce { kind, axes } => k::reduce(*kind, ins[0], Usizes::of(axes).get(), out),
        Kernel::ArgMax { axis } => k::argmax(ins[0], *axis as usize, out),
        Kernel::Pool { kind, kernel, stride, padding, dilation, count_include_pad, divisor } => {
            let (kk, s, p, d) = (Usizes::of(kernel), Usizes::of(stride), Usizes::of(padding), Usizes::of(dilation));
            let (count_include_pad, divisor) = (*count_include_pad, *divisor);
            let params = PoolParams {
                kernel: kk.get(),
                stride: s.get(),
                padding: p.get(),
                dilation: d.get(),
                count_include_pad,
                divisor,
            };
            k::pool(*kind, ins[0], &params, out)
        }
        Kernel::AdaptiveAvgPool => k::adaptive_avg_pool(ins[0], out),
        Kernel::Attention { causal, scale } => {
            k::attention(ins[0], ins[1], ins[2], opt(3), *causal, *scale, out, scratch)
        }
        Kernel::Copy if in_place => Ok(()),
        Kernel::Copy => k::copy(ins[0], out),
        Kernel::Expand => k::expand(ins[0], out),
        Kernel::Permute { perm } => k::permute(ins[0], Usizes::of(perm).get(), out),
        Kernel::Slice { axis, start, step } => k::slice(ins[0], *axis as usize, *start as usize, *step as usize, out),
        Kernel::SliceFromEnd { axis, back, step } => {
            let len = ins[0].shape.get(*axis as usize).copied().unwrap_or(0);
            k::slice(ins[0], *axis as usize, len.saturating_sub(*back as usize), *step as usize, out)
        }
        Kernel::Concat { axis } => k::concat(ins, *axis as usize, out),
        Kernel::Gather { axis } => k::gather(ins[0], ins[1], *axis as usize, out),
        Kernel::Fill { value } => k::fill(*value, out),
        Kernel::Arange { start, step } => k::arange(*start, *step, out),
        Kernel::CumSum { axis } => k::cumsum(ins[0], *axis as usize, out),
        Kernel::ArgMin { axis } => k::argmin(ins[0], *axis as usize, out),
        Kernel::Sort { axis, descending, indices } => {
            k::sort(ins[0], *axis as usize, *descending, *indices, out, scratch)
        }
        Kernel::Pad { lo, hi, interior, mode, value } => {
            k::pad(ins[0], &k::PadParams { lo, hi, interior, mode: *mode, value: *value }, out)
        }
        Kernel::Flip { axes } => k::flip(ins[0], Usizes::of(axes).get(), out),
        Kernel::Resize { mode, align_corners, spatial, scales } => {
            let params =
                k::ResizeParams { mode: *mode, align_corners: *align_corners, spatial: *spatial as usize, scales };
            k::resize(ins[0], &params, out)
        }
        Kernel::GatherElements { axis } => k::gather_elements(ins[0], ins[1], *axis as usize, out),
        Kernel::ScatterElements { axis, reduce, include_self } => {
            k::scatter_elements(ins[0], ins[1], ins[2], *axis as usize, *reduce, *include_self, out, scratch)
        }
        Kernel::IndexGather { axis } => k::index_gather(ins[0], &ins[1..], *axis as usize, out, scratch),
        Kernel::IndexPut { axis, accumulate } => {
            k::index_put(ins[0], ins[1], &ins[2..], *axis as usize, *accumulate, out, scratch)
        }
        Kernel::NonZero => k::nonzero(ins[0], out),
        // The session runs random instructions itself: they need its seed
        // and call count, which no other kernel sees.
        Kernel::Random { .. } => Err(kiln_kernels::KernelError::Shape {
            kernel: "random",
            detail: "random instruction reached the stateless dispatcher".into(),
        }),
        // The session binds symbols itself: it owns their values and the shapes.
        Kernel::BindDim { .. } => Err(kiln_kernels::KernelError::Shape {
            kernel: "bind_dim",
            detail: "symbol binding reached the stateless dispatcher".into(),
        }),
        // The session follows jumps itself: they change where it continues.
        Kernel::JumpIfFalse { .. } | Kernel::Jump { .. } => Err(kiln_kernels::KernelError::Shape {
            kernel: "jump",
            detail: "loop control reached the stateless dispatcher".into(),
        }),
        // Accelerator calls never reach the CPU dispatcher: the session runs
        // them (and a session without a PJRT device refuses such plans at start).
        Kernel::Accel { .. } => Err(kiln_kernels::KernelError::Shape {
            kernel: "accel",
            detail: "accelerator segment reached the CPU dispatcher".into(),
        }),
    }
}
