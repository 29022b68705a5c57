//! SVE f32 GEMM microkernel: an 8×NR tile, NR = 3·W columns held as three
//! W-lane vectors per row (24 accumulators z8–z31), three B vectors
//! (z0–z2) and A's 8 values in two quadwords (z3, z4) used lane by lane
//! with the indexed `fmla z.s, z.s, z.s[i]` — NEON's 8×12 kernel with each
//! q register widened to W lanes.
//!
//! W is fixed per table, not read in the loop: 4 (8×12, the NEON tile), 8
//! (8×24) or 16 (8×48), the widest that fits the vector length (`cntw`),
//! chosen once when the table is built, so that every lane of every
//! accumulator is used at 128, 256 and 512 bits. Longer vectors (only in
//! emulators so far) run the 8×48 tile with the lanes past 16 switched off
//! by the `whilelo` predicate of every load and store, which also lets the
//! narrower tiles run (and be tested) on a wider vector.
//!
//! Bits: each element of the tile is one FMA chain over the K slice,
//! starting from +0, in K order — the NEON kernel's chain — and the store
//! step is the NEON kernel's (C = acc or C + acc for a full tile with no
//! epilogue, else [`Tile::store`]). The generic driver cuts K into slices
//! of `KC` whatever the tile, and which tile or thread computes an element
//! never changes its operations, so the SVE table gives the NEON table's
//! bits at every tile width and vector length.

use crate::generic::gemm::{Combine, GemmUkr, Packing, Tile};
use std::arch::asm;

const MR: usize = 8;
/// The widest tile's columns (W = 16): the size of the store buffer.
const NR_MAX: usize = 3 * 16;

/// The tile of W-lane vectors: `variants` and tests build it for each W.
const fn ukr<const W: usize>(variant: &'static str) -> GemmUkr {
    GemmUkr {
        variant,
        mr: MR,
        nr: 3 * W,
        packing: Packing::KMajorPanels,
        run: microkernel::<W>,
        direct: None,
        math: None,
    }
}

const UKR_8X12: GemmUkr = ukr::<4>("sve_8x12");
const UKR_8X24: GemmUkr = ukr::<8>("sve_8x24");
const UKR_8X48: GemmUkr = ukr::<16>("sve_8x48");

/// The tiles this CPU's vector length holds, narrowest first (none without
/// SVE); the table takes the last.
pub(crate) fn variants() -> Vec<GemmUkr> {
    let Some(lanes) = super::vector_lanes() else {
        return Vec::new();
    };
    [(4, UKR_8X12), (8, UKR_8X24), (16, UKR_8X48)].into_iter().filter(|&(w, _)| w <= lanes).map(|(_, u)| u).collect()
}

fn microkernel<const W: usize>(kc: usize, astrip: &[f32], bstrip: &[f32], tile: &mut Tile<'_>) {
    let nr = 3 * W;
    let kc = kc.min(astrip.len() / MR).min(bstrip.len() / nr);
    // A thread may have lowered its vector length (`prctl`) since the
    // table was built: the predicates would then cover fewer than W lanes.
    if super::vector_lanes().is_none_or(|lanes| lanes < W) {
        return crate::aarch64::fma_tile(kc, MR, nr, astrip, bstrip, tile);
    }
    // A full tile with nothing fused goes straight from registers to C; the
    // vector add is the same IEEE operation as the portable `c += acc`.
    let direct = tile.rows == MR && tile.cols == nr && tile.epilogue.is_empty();
    match tile.combine {
        Combine::Overwrite | Combine::Accumulate if direct => {
            let accumulate = tile.combine == Combine::Accumulate;
            let rows: [*mut f32; MR] = std::array::from_fn(|i| tile.row(i).as_mut_ptr());
            // SAFETY: `kc` is bounded by both strips; each row of the tile
            // holds nr = 3·W f32s; the table holds this kernel only when
            // the CPU has SVE with at least W lanes (checked above).
            unsafe { tile_8x3w(kc, astrip.as_ptr(), bstrip.as_ptr(), W, &rows, accumulate) }
        }
        _ => {
            let mut acc = [0f32; MR * NR_MAX];
            let base = acc.as_mut_ptr();
            // SAFETY: row i of the buffer is acc[i·nr..(i+1)·nr], inside
            // its MR·NR_MAX elements.
            let rows: [*mut f32; MR] = std::array::from_fn(|i| unsafe { base.add(i * nr) });
            // SAFETY: as above, the rows being the buffer's.
            unsafe { tile_8x3w(kc, astrip.as_ptr(), bstrip.as_ptr(), W, &rows, false) }
            tile.store(&acc, nr);
        }
    }
}

/// `fmla` of the three B vectors (z0–z2) by lane `$i` of A's quadword
/// `$a` into one row's accumulators.
#[rustfmt::skip]
macro_rules! fma_row {
    ($c0:literal, $c1:literal, $c2:literal, $a:literal, $i:literal) => {
        concat!(
            "fmla z", $c0, ".s, z0.s, z", $a, ".s[", $i, "]\n",
            "fmla z", $c1, ".s, z1.s, z", $a, ".s[", $i, "]\n",
            "fmla z", $c2, ".s, z2.s, z", $a, ".s[", $i, "]\n",
        )
    };
}

/// Stores one row's accumulators (the W active lanes of each) through the
/// row pointer at byte `$off` of the pointer array.
#[rustfmt::skip]
macro_rules! store_row {
    ($off:literal, $c0:literal, $c1:literal, $c2:literal) => {
        concat!(
            "ldr {p}, [{rows}, #", $off, "]\n",
            "st1w {{z", $c0, ".s}}, p0, [{p}]\n",
            "st1w {{z", $c1, ".s}}, p0, [{p}, {w}, lsl #2]\n",
            "st1w {{z", $c2, ".s}}, p0, [{p}, {w2}, lsl #2]\n",
        )
    };
}

/// As `store_row`, adding the accumulators to what the row holds
/// (C + acc, C the first operand as in NEON's `vaddq_f32(c, acc)`).
#[rustfmt::skip]
macro_rules! add_row {
    ($off:literal, $c0:literal, $c1:literal, $c2:literal) => {
        concat!(
            "ldr {p}, [{rows}, #", $off, "]\n",
            "ld1w {{z0.s}}, p0/z, [{p}]\n",
            "ld1w {{z1.s}}, p0/z, [{p}, {w}, lsl #2]\n",
            "ld1w {{z2.s}}, p0/z, [{p}, {w2}, lsl #2]\n",
            "fadd z0.s, z0.s, z", $c0, ".s\n",
            "fadd z1.s, z1.s, z", $c1, ".s\n",
            "fadd z2.s, z2.s, z", $c2, ".s\n",
            "st1w {{z0.s}}, p0, [{p}]\n",
            "st1w {{z1.s}}, p0, [{p}, {w}, lsl #2]\n",
            "st1w {{z2.s}}, p0, [{p}, {w2}, lsl #2]\n",
        )
    };
}

/// The 8×3W tile over `kc` steps of the packed strips (`a[p·8 + i]`,
/// `b[p·3W + j]`), stored to (or, with `accumulate`, added to) the 3W
/// elements at each of `rows`.
///
/// # Safety
/// The CPU has SVE with at least `w` f32 lanes; `a` holds 8·kc and `b`
/// 3w·kc readable f32s; each of `rows` points at 3w writable (and, with
/// `accumulate`, readable) f32s that nothing else touches meanwhile.
#[target_feature(enable = "sve")]
unsafe fn tile_8x3w(kc: usize, a: *const f32, b: *const f32, w: usize, rows: &[*mut f32; MR], accumulate: bool) {
    // SAFETY: the caller's contract. Loads and stores are predicated on
    // the first w lanes (p0): lanes past them are neither read nor written.
    unsafe {
        asm!(
            "whilelo p0.s, xzr, {w}",
            "ptrue p1.s",
            "add {w2}, {w}, {w}",
            "add {step}, {w2}, {w}",
            "lsl {step}, {step}, #2",
            // Every chain starts from +0, as NEON's vdupq_n_f32(0.0).
            "mov z8.s, #0", "mov z9.s, #0", "mov z10.s, #0", "mov z11.s, #0",
            "mov z12.s, #0", "mov z13.s, #0", "mov z14.s, #0", "mov z15.s, #0",
            "mov z16.s, #0", "mov z17.s, #0", "mov z18.s, #0", "mov z19.s, #0",
            "mov z20.s, #0", "mov z21.s, #0", "mov z22.s, #0", "mov z23.s, #0",
            "mov z24.s, #0", "mov z25.s, #0", "mov z26.s, #0", "mov z27.s, #0",
            "mov z28.s, #0", "mov z29.s, #0", "mov z30.s, #0", "mov z31.s, #0",
            "cbz {kc}, 3f",
            "2:",
            "ld1w {{z0.s}}, p0/z, [{b}]",
            "ld1w {{z1.s}}, p0/z, [{b}, {w}, lsl #2]",
            "ld1w {{z2.s}}, p0/z, [{b}, {w2}, lsl #2]",
            // A's 8 values, each quadword copied to every 128-bit segment
            // (the indexed fmla picks its lane within each segment).
            "ld1rqw {{z3.s}}, p1/z, [{a}]",
            "ld1rqw {{z4.s}}, p1/z, [{a}, #16]",
            fma_row!("8", "9", "10", "3", "0"),
            fma_row!("11", "12", "13", "3", "1"),
            fma_row!("14", "15", "16", "3", "2"),
            fma_row!("17", "18", "19", "3", "3"),
            fma_row!("20", "21", "22", "4", "0"),
            fma_row!("23", "24", "25", "4", "1"),
            fma_row!("26", "27", "28", "4", "2"),
            fma_row!("29", "30", "31", "4", "3"),
            "add {a}, {a}, #32",
            "add {b}, {b}, {step}",
            "subs {kc}, {kc}, #1",
            "b.ne 2b",
            "3:",
            "cbnz {accumulate:w}, 4f",
            store_row!("0", "8", "9", "10"),
            store_row!("8", "11", "12", "13"),
            store_row!("16", "14", "15", "16"),
            store_row!("24", "17", "18", "19"),
            store_row!("32", "20", "21", "22"),
            store_row!("40", "23", "24", "25"),
            store_row!("48", "26", "27", "28"),
            store_row!("56", "29", "30", "31"),
            "b 5f",
            "4:",
            add_row!("0", "8", "9", "10"),
            add_row!("8", "11", "12", "13"),
            add_row!("16", "14", "15", "16"),
            add_row!("24", "17", "18", "19"),
            add_row!("32", "20", "21", "22"),
            add_row!("40", "23", "24", "25"),
            add_row!("48", "26", "27", "28"),
            add_row!("56", "29", "30", "31"),
            "5:",
            kc = inout(reg) kc => _,
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            w = in(reg) w,
            rows = in(reg) rows.as_ptr(),
            accumulate = in(reg) u32::from(accumulate),
            w2 = out(reg) _,
            step = out(reg) _,
            p = out(reg) _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _,
            out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _,
            out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            out("p0") _, out("p1") _,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::variants;
    use crate::generic::gemm::{gemm_f32_fused, Activation, ActivationFn, Bias, Epilogue};
    use crate::table::{Isa, KernelTable};
    use crate::types::PackBuffers;

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Every tile this vector length holds — 8×12 at 128 bits, up to 8×48
    /// at 512, the narrower ones then running with lanes switched off by
    /// their predicate — gives the NEON 8×12 kernel's bits: rows, columns
    /// and K off the tiles, K = 1 and two K slices, beta 0/1/0.5 (every
    /// `Combine`; C starting as NaN for beta 0), a per-row or per-column
    /// bias, a ReLU or a GELU and a residual (the store step after the
    /// kernel's registers), both B layouts.
    #[test]
    fn every_tile_width_is_neon_bit_for_bit() {
        let (Some(sve), Some(neon)) = (KernelTable::for_isa(Isa::Aarch64Sve), KernelTable::for_isa(Isa::Aarch64Neon))
        else {
            println!("note: skipping: no SVE on this CPU");
            return;
        };
        let tiles = variants();
        assert!(!tiles.is_empty());
        for ukr in tiles {
            let mut t = sve.clone();
            t.gemm = ukr;
            for (m, n, k) in [(1, 1, 1), (8, 12, 1), (8, 48, 3), (9, 25, 7), (17, 97, 33), (16, 50, 600), (3, 5, 2)] {
                let (a, b) = (data(m * k, 1), data(k * n, 2));
                let (rb, cb, res) = (data(m, 4), data(n, 5), data(m * n, 6));
                for tb in [false, true] {
                    for beta in [0.0f32, 1.0, 0.5] {
                        for bias in [Bias::None, Bias::PerRow(&rb), Bias::PerCol(&cb)] {
                            for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
                                let run = |table: &KernelTable| {
                                    let epilogue = Epilogue {
                                        bias,
                                        activation: act.map(|a| ActivationFn::new(table, a)),
                                        residual: act.is_some().then_some((&res[..], n)),
                                        ..Epilogue::default()
                                    };
                                    let mut c = if beta == 0.0 { vec![f32::NAN; m * n] } else { data(m * n, 3) };
                                    let ldb = if tb { k } else { n };
                                    let mut pack = PackBuffers::default();
                                    gemm_f32_fused(
                                        table, m, n, k, &a, k, &b, ldb, &mut c, n, tb, beta, epilogue, &mut pack,
                                    );
                                    c.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                                };
                                let ctx = format!("{} {m}x{n}x{k} tb={tb} beta={beta} {bias:?} {act:?}", ukr.variant);
                                assert_eq!(run(&t), run(neon), "{ctx}");
                            }
                        }
                    }
                }
            }
        }
    }
}
