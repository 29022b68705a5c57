//! The fused elementwise kernel: a compile-time program of element ops
//! (`kiln_isa::fused`) run over cache-sized tiles of the output, so a chain
//! of unary, binary, where, cast and clamp ops makes one pass over memory.
//!
//! Each tile of [`TILE`] output elements is computed op by op in registers
//! (tiles of scratch memory). An operand shaped like the output is read in
//! place; a broadcast one is gathered into its register once per tile;
//! scalars are filled once per call; the last op writes straight into the
//! output. Every op runs the same element function as its unfused kernel
//! (the very functions, called on the tile), so the result is bit-identical
//! to running the ops one by one: the f32 math goes through the kernel
//! table's vector entries, whose results do not depend on an element's
//! position, and half-precision ops round after each op as they do unfused.

use super::common::*;
use super::elementwise::{binary_with, cast, clamp, unary_with, where_};
use crate::context::Context;
use crate::parallel::Threads;
use crate::table::KernelTable;
use crate::types::{DType, Result, TensorMut, TensorRef};
use kiln_isa::fused::{register_types_into, FusedOp, MAX_FUSED_INPUTS, MAX_FUSED_OPS};

/// Output elements per tile: a few live registers of 8-byte elements stay
/// inside the L1 cache.
pub const TILE: usize = 512;
/// Bytes of one register: a tile of the widest element.
const SLOT: usize = TILE * 8;
const MAX_REGS: usize = MAX_FUSED_INPUTS + MAX_FUSED_OPS;
/// No scratch slot: read in place (an operand shaped like the output) or
/// written in place (the result).
const NO_SLOT: u8 = u8::MAX;

const K: &str = "fused";

/// How an operand reaches a tile: in place, or gathered with broadcast strides.
#[derive(Copy, Clone)]
struct Gather {
    rank: usize,
    shape: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
}

impl Gather {
    fn new(in_shape: &[usize], out_shape: &[usize]) -> Gather {
        let r = out_shape.len();
        let (mut so, mut si) = ([0; MAX_RANK], [0; MAX_RANK]);
        strides_of(out_shape, &mut so[..r]);
        broadcast_strides(in_shape, out_shape, &mut si[..r]);
        let c = Collapsed::new(out_shape, [&so[..r], &si[..r]]);
        Gather { rank: c.rank, shape: c.shape, strides: c.strides[1] }
    }

    /// Copies output positions `start..start + dst.len() / size` of the
    /// broadcast operand `src` into `dst`, one innermost run at a time.
    fn load<T: Copy>(&self, src: &[T], start: usize, dst: &mut [T]) {
        let r = self.rank;
        let mut idx = [0usize; MAX_RANK];
        let mut rem = start;
        for d in (0..r).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let mut off: usize = (0..r).map(|d| idx[d] * self.strides[d]).sum();
        let (inner, stride) = (self.shape[r - 1], self.strides[r - 1]);
        let mut done = 0;
        while done < dst.len() {
            let run = (inner - idx[r - 1]).min(dst.len() - done);
            let out = &mut dst[done..done + run];
            match stride {
                0 => out.fill(src[off]),
                1 => out.copy_from_slice(&src[off..off + run]),
                s => out.iter_mut().enumerate().for_each(|(i, o)| *o = src[off + i * s]),
            }
            done += run;
            // Advance the odometer by `run` positions along the innermost dim.
            off += run * stride;
            idx[r - 1] += run;
            let mut d = r - 1;
            while d > 0 && idx[d] == self.shape[d] {
                off -= idx[d] * self.strides[d];
                idx[d] = 0;
                d -= 1;
                idx[d] += 1;
                off += self.strides[d];
            }
        }
    }
}

/// Where each register lives: a scratch slot per register that needs one
/// (broadcast operands, scalars, intermediate results), reused once its
/// last reader has run.
struct Slots {
    of: [u8; MAX_REGS],
    count: usize,
}

fn assign_slots(program: &[FusedOp], direct: &[bool]) -> Slots {
    let n_in = direct.len();
    let n_regs = n_in + program.len();
    let mut last_use = [0usize; MAX_REGS];
    for (i, op) in program.iter().enumerate() {
        for r in op.operands() {
            last_use[r as usize] = n_in + i;
        }
    }
    let is_scalar = |r: usize| r >= n_in && matches!(program[r - n_in], FusedOp::Scalar { .. });
    let mut of = [NO_SLOT; MAX_REGS];
    let mut slots = FreeList { free: [0; MAX_REGS], n_free: 0, count: 0 };
    for (r, &d) in direct.iter().enumerate() {
        if !d {
            of[r] = slots.take();
        }
    }
    // Scalars are filled once per call, before any tile: each gets a slot of
    // its own, taken before any slot is freed, so no register computed per
    // tile can share it (a scalar defined after an intermediate died would
    // otherwise take that intermediate's slot and be overwritten).
    for i in 0..program.len() {
        let reg = n_in + i;
        if is_scalar(reg) && reg + 1 < n_regs {
            of[reg] = slots.take();
        }
    }
    for (i, op) in program.iter().enumerate() {
        let reg = n_in + i;
        if is_scalar(reg) {
            continue;
        }
        if reg + 1 < n_regs {
            of[reg] = slots.take();
        }
        for (k, r) in op.operands().enumerate() {
            let r = r as usize;
            let first_read = !op.operands().take(k).any(|p| p as usize == r);
            if first_read && last_use[r] == reg && of[r] != NO_SLOT && !is_scalar(r) {
                slots.give(of[r]);
            }
        }
    }
    Slots { of, count: slots.count }
}

/// Scratch slots: freed ones are reused before new ones are added.
struct FreeList {
    free: [u8; MAX_REGS],
    n_free: usize,
    count: usize,
}

impl FreeList {
    fn take(&mut self) -> u8 {
        if self.n_free > 0 {
            self.n_free -= 1;
            self.free[self.n_free]
        } else {
            self.count += 1;
            (self.count - 1) as u8
        }
    }

    fn give(&mut self, slot: u8) {
        self.free[self.n_free] = slot;
        self.n_free += 1;
    }
}

/// Runs `program` over `inputs` (each broadcast to `out`'s shape) into `out`.
pub fn fused(program: &[FusedOp], inputs: &[TensorRef], out: TensorMut, cx: &mut Context) -> Result<()> {
    fused_with(program, inputs, None, out, cx)
}

/// [`fused`] with operand `at` being `out` itself (a state updated where it
/// lies): `inputs[at]` gives only its dtype and shape (its data is not read
/// and may be empty) and must be shaped like `out`. Each tile of that operand
/// is copied from `out` into a register before any of the tile is written, so
/// every element is read before it is overwritten and never after.
pub fn fused_in_place(
    program: &[FusedOp],
    inputs: &[TensorRef],
    at: usize,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let Some(t) = inputs.get(at) else {
        return Err(shape_err(K, format!("in-place operand {at} of {} operands", inputs.len())));
    };
    if t.shape != out.shape || t.dtype != out.dtype {
        return Err(shape_err(
            K,
            format!("in-place operand {at} is {} {:?}, the output {} {:?}", t.dtype, t.shape, out.dtype, out.shape),
        ));
    }
    fused_with(program, inputs, Some(at), out, cx)
}

fn fused_with(
    program: &[FusedOp],
    inputs: &[TensorRef],
    in_place: Option<usize>,
    out: TensorMut,
    cx: &mut Context,
) -> Result<()> {
    let n_in = inputs.len();
    if n_in > MAX_FUSED_INPUTS {
        return Err(shape_err(K, format!("{n_in} operands, at most {MAX_FUSED_INPUTS}")));
    }
    // Stack tables: a run allocates nothing.
    let mut dtypes = [DType::Bool; MAX_FUSED_INPUTS];
    let mut shapes: [&[usize]; MAX_FUSED_INPUTS] = [&[]; MAX_FUSED_INPUTS];
    for (i, t) in inputs.iter().enumerate() {
        dtypes[i] = t.dtype;
        shapes[i] = t.shape;
    }
    let mut types = [DType::Bool; MAX_REGS];
    register_types_into(program, &dtypes[..n_in], &mut types).map_err(|m| shape_err(K, m))?;
    let types = &types[..n_in + program.len()];
    let result = types[types.len() - 1];
    expect_dtype(K, "out", out.dtype, result)?;
    check_rank(K, out.shape)?;
    check_broadcast(K, &shapes[..n_in], out.shape)?;
    for (i, t) in inputs.iter().enumerate().filter(|&(i, _)| Some(i) != in_place) {
        let n = numel(K, t.shape)?;
        if n.checked_mul(t.dtype.size_bytes()) != Some(t.data.len()) {
            return Err(shape_err(
                K,
                format!("operand {i}: {} bytes for shape {:?} of {}", t.data.len(), t.shape, t.dtype),
            ));
        }
    }
    let total = numel(K, out.shape)?;
    if total.checked_mul(result.size_bytes()) != Some(out.data.len()) {
        return Err(shape_err(K, format!("out: {} bytes for shape {:?} of {result}", out.data.len(), out.shape)));
    }
    if total == 0 {
        return Ok(());
    }
    let mut direct = [false; MAX_FUSED_INPUTS];
    let mut gathers = [None; MAX_FUSED_INPUTS];
    for (i, t) in inputs.iter().enumerate() {
        // The in-place operand goes through a register: a tile of it is
        // copied out before the tile is written.
        direct[i] = t.shape == out.shape && Some(i) != in_place;
        if !direct[i] && Some(i) != in_place {
            gathers[i] = Some(Gather::new(t.shape, out.shape));
        }
    }
    let slots = assign_slots(program, &direct[..n_in]);
    let regs_len = slots.count * TILE;
    let run = Run {
        program,
        inputs,
        in_place,
        types,
        direct: &direct[..n_in],
        gathers: &gathers[..n_in],
        slots,
        table: cx.table,
    };
    let threads = cx.scratch.pack.threads;
    if threads.count() == 1 || total < 2 * PARALLEL_TILES * TILE {
        let (scratch, _) = cx.scratch.split_f64(regs_len);
        return run.tiles(0, total, out.data, bytemuck::cast_slice_mut(scratch));
    }
    // Runs of whole tiles over the threads, each with its own registers: a
    // tile is computed the same on any thread, so the bytes do not depend
    // on the thread count.
    let workers = cx.scratch.workers(threads.count(), |w| {
        w.split_f64(regs_len);
    });
    let failed = std::sync::Mutex::new(None);
    let size = result.size_bytes();
    threads.for_each_chunk(out.data, PARALLEL_TILES * TILE * size, |i, part| {
        let mut w = workers[threads.index()].lock().unwrap_or_else(|e| e.into_inner());
        let (scratch, _) = w.split_f64(regs_len);
        let start = i * PARALLEL_TILES * TILE;
        if let Err(e) = run.tiles(start, part.len() / size, part, bytemuck::cast_slice_mut(scratch)) {
            failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Tiles per pool item when a call is split over threads (8 Ki elements:
/// a few microseconds of work, more than a hand-out costs).
const PARALLEL_TILES: usize = 16;

/// One checked call's program and operands, shared by the threads.
struct Run<'a, 'd> {
    program: &'a [FusedOp],
    inputs: &'a [TensorRef<'d>],
    /// The operand whose storage is the output (its data is not read).
    in_place: Option<usize>,
    types: &'a [DType],
    direct: &'a [bool],
    gathers: &'a [Option<Gather>],
    slots: Slots,
    table: &'a KernelTable,
}

impl Run<'_, '_> {
    /// Output elements `first..first + count` (`out` holds exactly them),
    /// tile by tile from `first` (a multiple of [`TILE`]), through `regs`.
    fn tiles(&self, first: usize, count: usize, out: &mut [u8], regs: &mut [u8]) -> Result<()> {
        let Run { program, inputs, in_place: aliased, types, direct, gathers, ref slots, table } = *self;
        let n_in = inputs.len();
        fill_scalars(program, n_in, slots, regs);
        let size = types[types.len() - 1].size_bytes();
        let mut start = first;
        while start < first + count {
            let n = TILE.min(first + count - start);
            for (i, g) in gathers.iter().enumerate() {
                if let Some(g) = g {
                    let t = &inputs[i];
                    let dst = &mut regs[slots.of[i] as usize * SLOT..][..n * t.dtype.size_bytes()];
                    with_elem_size!(t.dtype, T, {
                        let src: &[T] = bytemuck::cast_slice(t.data);
                        g.load(src, start, bytemuck::cast_slice_mut(dst));
                    });
                }
            }
            // The in-place operand's tile is copied into its register
            // before the result overwrites it.
            if let Some(p) = aliased {
                let at = (start - first) * size;
                regs[slots.of[p] as usize * SLOT..][..n * size].copy_from_slice(&out[at..at + n * size]);
            }
            let last = program.len() - 1;
            for (i, op) in program.iter().enumerate() {
                if i != last && matches!(op, FusedOp::Scalar { .. }) {
                    continue;
                }
                let reg = n_in + i;
                // Register `r`'s tile: in place for an operand shaped like the output.
                let in_place = |r: usize| -> Option<&[u8]> {
                    let size = types[r].size_bytes();
                    (r < n_in && direct[r]).then(|| &inputs[r].data[start * size..(start + n) * size])
                };
                if i == last {
                    // The result goes straight into the output.
                    let regs: &[u8] = regs;
                    let tile = |r: u32| -> &[u8] {
                        let r = r as usize;
                        in_place(r).unwrap_or_else(|| &regs[slots.of[r] as usize * SLOT..][..n * types[r].size_bytes()])
                    };
                    let at = (start - first) * size;
                    run_op(op, types, reg, n, &mut out[at..at + n * size], &tile, table)?;
                } else {
                    // Split the registers around this op's slot: it is written
                    // while the others are read.
                    let d = slots.of[reg] as usize;
                    let (before, rest) = regs.split_at_mut(d * SLOT);
                    let (dst, after) = rest.split_at_mut(SLOT);
                    let (before, after): (&[u8], &[u8]) = (before, after);
                    let tile = |r: u32| -> &[u8] {
                        let r = r as usize;
                        in_place(r).unwrap_or_else(|| {
                            let s = slots.of[r] as usize;
                            let slot = if s < d { &before[s * SLOT..] } else { &after[(s - d - 1) * SLOT..] };
                            &slot[..n * types[r].size_bytes()]
                        })
                    };
                    let size = types[reg].size_bytes();
                    run_op(op, types, reg, n, &mut dst[..n * size], &tile, table)?;
                }
            }
            start += n;
        }
        Ok(())
    }
}

/// Runs one op on a tile of `n` elements: register `r`'s tile is `tile(r)`.
fn run_op<'t>(
    op: &FusedOp,
    types: &[DType],
    reg: usize,
    n: usize,
    dst: &mut [u8],
    tile: &dyn Fn(u32) -> &'t [u8],
    table: &KernelTable,
) -> Result<()> {
    let shape = [n];
    let arg = |r: u32| TensorRef { dtype: types[r as usize], shape: &shape, data: tile(r) };
    let dtype = types[reg];
    let dst = TensorMut { dtype, shape: &shape, data: dst };
    match *op {
        FusedOp::Scalar { bits, .. } => {
            fill(dst.data, &bits.to_le_bytes()[..dtype.size_bytes()]);
            Ok(())
        }
        FusedOp::Unary { op, x } => unary_with(op, arg(x), dst, table, Threads::single()),
        FusedOp::Binary { op, a, b } => binary_with(op, arg(a), arg(b), dst, table, Threads::single()),
        FusedOp::Where { cond, a, b } => where_(arg(cond), arg(a), arg(b), dst),
        FusedOp::Cast { x, .. } => cast(arg(x), dst),
        FusedOp::Clamp { min, max, x } => clamp(arg(x), min, max, dst),
    }
}

/// Fills each scalar's register with its value, once per call.
fn fill_scalars(program: &[FusedOp], n_in: usize, slots: &Slots, regs: &mut [u8]) {
    for (i, op) in program.iter().enumerate() {
        let FusedOp::Scalar { dtype, bits } = *op else { continue };
        let slot = slots.of[n_in + i];
        if slot == NO_SLOT {
            continue;
        }
        let size = dtype.size_bytes();
        fill(&mut regs[slot as usize * SLOT..][..TILE * size], &bits.to_le_bytes()[..size]);
    }
}

/// Repeats one element's bytes over `dst`.
fn fill(dst: &mut [u8], value: &[u8]) {
    for e in dst.chunks_exact_mut(value.len()) {
        e.copy_from_slice(value);
    }
}
