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
//! An int8 weight may also hold a second copy in the layout one int8
//! entry's kernel reads ([`CopyKind`]), made at pack time only for a
//! kernel table whose int8 entry reads it:
//! - *wide*, for the kernels that multiply i16 pairs (`vpmaddwd`, plain
//!   AVX2): the same bytes in the same order, each sign-extended to a
//!   little-endian i16, so a lane step is 128 bytes and a strip twice as
//!   long (the weight's memory triples);
//! - *pairs*, for the 2×8 · 8×2 matrix multiply (`smmla`, AArch64 i8mm,
//!   NEON or SVE — an SVE vector loads `VL / 16` consecutive pairs):
//!   K cut into groups of [`PAIR_GROUP`] = 8 (zero-padded to a whole
//!   group), and a group of a strip holds its 8 column pairs, 16 bytes
//!   each — the first column's 8 values, then the second's (one `smmla`
//!   operand); 128 bytes a group, so a strip of `kp8` values per column is
//!   `16 · kp8` bytes (the weight's memory doubles):
//!
//! ```text
//! strip s, group g: [cols 16s+0, 16s+1: 8 + 8 bytes] ... [cols 16s+14, 16s+15: 8 + 8 bytes]
//! ```

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
#[derive(Copy, Clone, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// The packed form of one weight (see the module doc).
#[derive(Clone, PartialEq)]
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
    /// A second copy for one kernel (see the module doc), or none.
    pub(crate) copy: Option<WeightCopy>,
}

/// The layouts a second copy of an int8 weight can take (see the module doc).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum CopyKind {
    /// Every byte sign-extended to an i16, in the same order.
    Wide,
    /// Column pairs, K in groups of 8 (`smmla` operands).
    Pairs,
}

/// A second copy of an int8 weight's strips.
#[derive(Clone, PartialEq)]
pub(crate) struct WeightCopy {
    pub(crate) kind: CopyKind,
    pub(crate) lines: Vec<Line>,
    /// Bytes from one strip to the next.
    pub(crate) strip: usize,
}

impl WeightCopy {
    pub(crate) fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.lines)
    }
}

/// int8 values per [`CopyKind::Pairs`] group.
pub(crate) const PAIR_GROUP: usize = 8;

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
        Ok(Layout { kp, npad, groups, lines, scales, zero_points, col_sums, copy: None })
    }

    /// Adds the `kind` copy of an int8 layout's lines (see the module doc).
    pub(crate) fn add_copy(&mut self, kind: CopyKind) {
        let copy = match kind {
            CopyKind::Wide => self.widened(),
            CopyKind::Pairs => self.paired(),
        };
        self.copy = Some(copy);
    }

    fn widened(&self) -> WeightCopy {
        let bytes = self.bytes();
        let mut wide = vec![Line([0; 64]); 2 * self.lines.len()];
        let out: &mut [u8] = bytemuck::cast_slice_mut(&mut wide);
        for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
            pair.copy_from_slice(&(b as i8 as i16).to_le_bytes());
        }
        WeightCopy { kind: CopyKind::Wide, lines: wide, strip: 2 * strip_bytes(QBits::I8, self.kp) }
    }

    /// The pairs copy, read off the lanes: value `p` of a strip's column
    /// `c` is byte `(p / 4) · 64 + 4c + p % 4` there, and byte `(p / 8) ·
    /// 128 + (c / 2) · 16 + (c % 2) · 8 + p % 8` here.
    fn paired(&self) -> WeightCopy {
        let kp8 = self.kp.next_multiple_of(PAIR_GROUP);
        let (from, to) = (strip_bytes(QBits::I8, self.kp), kp8 * STRIP);
        let strips = self.npad / STRIP;
        let mut lines = vec![Line([0; 64]); (strips * to).div_ceil(64)];
        let out: &mut [u8] = bytemuck::cast_slice_mut(&mut lines);
        for (src, dst) in self.bytes().chunks_exact(from).zip(out.chunks_exact_mut(to)) {
            for p in 0..self.kp {
                for c in 0..STRIP {
                    let at = (p / PAIR_GROUP) * 128 + (c / 2) * 16 + (c % 2) * PAIR_GROUP + p % PAIR_GROUP;
                    dst[at] = src[(p / LANE_I8) * 64 + c * 4 + p % LANE_I8];
                }
            }
        }
        WeightCopy { kind: CopyKind::Pairs, lines, strip: to }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.lines)
    }

    pub(crate) fn len_bytes(&self) -> usize {
        (self.lines.len() + self.copy.as_ref().map_or(0, |c| c.lines.len())) * 64
            + self.scales.len() * 4
            + self.zero_points.as_ref().map_or(0, Vec::len)
            + self.col_sums.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs copy holds each value where the module doc says, and
    /// zeros everywhere else (padded columns, K past the weight's depth,
    /// the last group's second half), for every ISA: the layout is data.
    #[test]
    fn pairs_copy_places_every_value_and_pads_with_zeros() {
        for (n, k) in [(1, 1), (19, 13), (33, 8), (16, 20)] {
            // Values 1..=127 then -128.., never 0, so a misplaced one shows.
            let data: Vec<u8> = (0..n * k).map(|i| (i % 255 + 1) as u8).collect();
            let scales = vec![1.0; n];
            let w = QWeights { n, k, bits: QBits::I8, group: k, data: &data, scales: &scales, zero_points: None };
            let mut layout = Layout::pack(&w).unwrap();
            layout.add_copy(CopyKind::Pairs);
            let copy = layout.copy.as_ref().unwrap();
            let kp8 = k.next_multiple_of(PAIR_GROUP);
            assert_eq!((copy.kind, copy.strip), (CopyKind::Pairs, 16 * kp8));
            let mut want = vec![0u8; copy.bytes().len()];
            for j in 0..n {
                let (s, c) = (j / STRIP, j % STRIP);
                for p in 0..k {
                    let at = s * copy.strip + (p / 8) * 128 + (c / 2) * 16 + (c % 2) * 8 + p % 8;
                    want[at] = data[j * k + p];
                }
            }
            assert!(copy.bytes() == want, "{n}x{k}");
            assert_eq!(
                layout.len_bytes(),
                (layout.lines.len() + copy.lines.len()) * 64 + 4 * (n.next_multiple_of(NPAD) * 2)
            );
        }
    }
}
