//! The packed weight layout every integer microkernel reads.
//!
//! Columns (output features) are cut into strips of [`STRIP`] = 16, and
//! `n` is padded to [`NPAD`] = 32 columns (two strips) so that a kernel
//! reading one or two strips never needs an edge case. Inside a strip, K is
//! cut into *lanes*: [`LANE_I8`] = 4 int8 values or [`LANE_I4`] = 8 int4
//! values of one column, 4 bytes — one i32 lane of a vector register. A
//! strip stores, for each lane step `t`, the 16 columns' lanes side by side
//! (64 bytes, one cache line):
//!
//! ```text
//! strip s, step t: [col 16s+0: 4 bytes][col 16s+1: 4 bytes] ... [col 16s+15: 4 bytes]
//! ```
//!
//! That is the operand layout of the dot-product instructions (`vpdpbusd`,
//! `sdot`: 4 bytes of one column against 4 bytes of one activation row), and
//! a weight-only kernel gets eight or sixteen columns' values for one `p`
//! with a shift pair per lane. K is zero-padded to a whole lane step; int4
//! lanes hold values `8t..8t+8` of a column, value `8t + i` in bits
//! `4i..4i+4`. Scales (and zero points) are stored per strip and group,
//! 16 columns side by side; padded columns have scale 0 and zero point 0.
//! For int8, the column sums `Σ_p q[j][p]` are kept for the kernels that
//! offset activations to unsigned (`vpdpbusd` multiplies u8 by i8).
//!
//! An int8 weight may also hold a *wide* copy for the kernels that multiply
//! i16 pairs (`vpmaddwd`, plain AVX2): the same bytes in the same order,
//! each sign-extended to a little-endian i16, so a lane step is 128 bytes
//! and a strip twice as long. It is made at pack time only for a kernel
//! table whose int8 entry reads it (the weight's memory triples there).

use super::{err, QBits, QWeights};
use crate::types::Result;

/// Columns per strip.
pub(crate) const STRIP: usize = 16;
/// Columns `n` is padded to: two strips, the widest tile a kernel reads.
pub(crate) const NPAD: usize = 32;
/// int8 values per lane (4 bytes).
pub(crate) const LANE_I8: usize = 4;
/// int4 values per lane (4 bytes).
pub(crate) const LANE_I4: usize = 8;

/// 64 bytes, the unit the packed weights are allocated in so strips start
/// on cache-line boundaries.
#[repr(C, align(64))]
#[derive(Copy, Clone, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// The packed form of one weight (see the module doc).
#[derive(Clone)]
pub(crate) struct Layout {
    /// K padded to a whole lane step.
    pub(crate) kp: usize,
    /// N padded to [`NPAD`].
    pub(crate) npad: usize,
    /// Groups per column (`k / group`).
    pub(crate) groups: usize,
    pub(crate) lines: Vec<Line>,
    /// `[strip][group][16]` scales.
    pub(crate) scales: Vec<f32>,
    /// `[strip][group][16]` zero points, or none (symmetric).
    pub(crate) zero_points: Option<Vec<i8>>,
    /// Per padded column, `Σ_p q[j][p]` (int8 only; empty for int4).
    pub(crate) col_sums: Vec<i32>,
    /// The wide copy of `lines` (see the module doc), or none.
    pub(crate) wide: Option<Vec<Line>>,
}

/// int8 or int4 values per lane.
pub(crate) fn lane(bits: QBits) -> usize {
    match bits {
        QBits::I8 => LANE_I8,
        QBits::I4 => LANE_I4,
    }
}

/// Bytes of one strip of `kp` values per column.
pub(crate) fn strip_bytes(bits: QBits, kp: usize) -> usize {
    kp / lane(bits) * STRIP * 4
}

impl Layout {
    pub(crate) fn pack(w: &QWeights<'_>) -> Result<Layout> {
        w.check()?;
        let (n, k, groups) = (w.n, w.k, w.k / w.group);
        let lane = lane(w.bits);
        let kp = k.next_multiple_of(lane);
        let npad = n.next_multiple_of(NPAD);
        let strips = npad / STRIP;
        let sbytes = strip_bytes(w.bits, kp);
        let total = strips.checked_mul(sbytes).ok_or_else(|| err("weight too large"))?;
        let mut lines = vec![Line([0; 64]); total.div_ceil(64)];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut lines);
        let mut col_sums = if w.bits == QBits::I8 { vec![0i32; npad] } else { Vec::new() };
        #[allow(clippy::needless_range_loop)] // j indexes the strip, the column sums and the weight
        for j in 0..n {
            let (s, c) = (j / STRIP, j % STRIP);
            let strip = &mut bytes[s * sbytes..][..sbytes];
            for p in 0..k {
                let q = w.q(j, p);
                let (t, i) = (p / lane, p % lane);
                let at = t * 64 + c * 4;
                match w.bits {
                    QBits::I8 => {
                        strip[at + i] = q as i8 as u8;
                        col_sums[j] += q;
                    }
                    QBits::I4 => strip[at + i / 2] |= ((q as u8) & 0x0f) << (4 * (i % 2)),
                }
            }
        }
        let mut scales = vec![0f32; strips * groups * STRIP];
        let mut zero_points = w.zero_points.map(|_| vec![0i8; strips * groups * STRIP]);
        for j in 0..n {
            for g in 0..groups {
                let at = ((j / STRIP) * groups + g) * STRIP + j % STRIP;
                scales[at] = w.scales[j * groups + g];
                if let (Some(dst), Some(src)) = (zero_points.as_mut(), w.zero_points) {
                    dst[at] = src[j * groups + g];
                }
            }
        }
        Ok(Layout { kp, npad, groups, lines, scales, zero_points, col_sums, wide: None })
    }

    /// Adds the wide copy of an int8 layout's lines (see the module doc).
    pub(crate) fn widen(&mut self) {
        let bytes = self.bytes();
        let mut wide = vec![Line([0; 64]); 2 * self.lines.len()];
        let out: &mut [u8] = bytemuck::cast_slice_mut(&mut wide);
        for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
            pair.copy_from_slice(&(b as i8 as i16).to_le_bytes());
        }
        self.wide = Some(wide);
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.lines)
    }

    pub(crate) fn len_bytes(&self) -> usize {
        (self.lines.len() + self.wide.as_ref().map_or(0, Vec::len)) * 64
            + self.scales.len() * 4
            + self.zero_points.as_ref().map_or(0, Vec::len)
            + self.col_sums.len() * 4
    }
}
