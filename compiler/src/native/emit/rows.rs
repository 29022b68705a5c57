//! Row functions: softmax / log-softmax over the last axis, layer norm, RMS
//! norm, and sum / mean / max over the last axis, as MLIR functions with
//! the C ABI of `kiln_runtime::native::NativeFunction` where `start..end`
//! counts rows (`FunctionShape::Rows`): row `r` reads elements
//! `r·len..(r+1)·len` of operand 0 (and `len` elements of each weight /
//! bias) and writes `len` outputs (one for a reduction).
//!
//! Each function repeats its portable kernel's operations in the kernel's
//! order, so the results are the kernel's bits (see ARCHITECTURE.md,
//! "Native code", for the one place they are not):
//! - layer / RMS norm: `kiln_kernels`' generic `layer_norm_rows` /
//!   `rms_norm_rows` (every ISA variant runs that code): f64 statistics,
//!   element `i` into partial sum `i mod 8`, the eight added pairwise, each
//!   output `(x − mean)·rstd [·w] [+b]` in f64 rounded once. No `fmuladd`
//!   here: Rust never contracts, and neither does LLVM without the flag.
//! - softmax: the kernel table's `max_f32` (a vector maximum; the first-NaN
//!   sequential scan when the row has a NaN, an infinity or a zero maximum),
//!   then `exp_sum_f32` of the AVX2 kernels on x86-64 (8 lanes: two f64
//!   accumulators of 4) or NEON on AArch64 (4 lanes: two of 2) — the same
//!   exp polynomial, the same partial sums in the same order, the tail
//!   added last — then `e·(1/sum)` or `(x − max) − ln(sum)` in f32. ln is
//!   fdlibm's `__ieee754_log` in f64 (< 1 ulp of f64; glibc's log, which
//!   the kernel calls, is within 1 ulp too, so the f32 `ln(sum)` agrees
//!   except when the f64 value lies within 2 ulp of an f32 rounding
//!   boundary).
//! - sum / mean: one f64 chain per row in order, four rows side by side
//!   (the kernel's `sum_rows`), mean divided by the count once; max: the
//!   f64 fold `a` if `a` is NaN or `a ≥ v`, else `v` — as an
//!   `llvm.maximum` reduction when the row has no NaN, infinity or zero
//!   maximum (then every order gives the same value).
//!
//! For speed, the loops are shaped for LLVM's vectorisers without changing
//! an operation: exp(x − max) is an elementwise loop of its own, the f64
//! partial sums one `vector<8 x f64>` (NEON: 4) accumulator.

use super::{program_values, Body, Ty, Unsupported};
use kiln_ir::{DType, FusedOp};
use kiln_runtime::format::{Kernel, ReduceKind};
use kiln_runtime::native::{InputMode, NativeArch};
use std::fmt::Write;

/// What a row function computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowOp {
    Softmax { log: bool },
    LayerNorm { eps: f64, weight: bool, bias: bool },
    RmsNorm { eps: f64, weight: bool },
    Sum,
    Mean,
    Max,
}

impl RowOp {
    /// The row function standing for `kernel` with `operands` operands, if
    /// one does (the axis/rank conditions are `row_geometry`'s).
    pub fn of(kernel: &Kernel, operands: usize) -> Option<RowOp> {
        Some(match kernel {
            Kernel::Softmax { log, .. } if operands == 1 => RowOp::Softmax { log: *log },
            Kernel::LayerNorm { eps, .. } if (1..=3).contains(&operands) => {
                RowOp::LayerNorm { eps: *eps, weight: operands >= 2, bias: operands == 3 }
            }
            Kernel::RmsNorm { eps, .. } if (1..=2).contains(&operands) => {
                RowOp::RmsNorm { eps: *eps, weight: operands == 2 }
            }
            Kernel::Reduce { kind: ReduceKind::Sum, .. } if operands == 1 => RowOp::Sum,
            Kernel::Reduce { kind: ReduceKind::Mean, .. } if operands == 1 => RowOp::Mean,
            Kernel::Reduce { kind: ReduceKind::Max, .. } if operands == 1 => RowOp::Max,
            _ => return None,
        })
    }

    /// Operands the function reads (x, then weight and bias).
    pub fn operands(self) -> usize {
        match self {
            RowOp::LayerNorm { weight, bias, .. } => 1 + usize::from(weight) + usize::from(bias),
            RowOp::RmsNorm { weight, .. } => 1 + usize::from(weight),
            _ => 1,
        }
    }

    /// Output elements per row of `len`.
    pub fn out_len(self, len: u64) -> u64 {
        match self {
            RowOp::Sum | RowOp::Mean | RowOp::Max => 1,
            _ => len,
        }
    }
}

/// The f64 partial sums of the norms' statistics (`F64_LANES` of
/// kernels/src/generic/norm.rs): the same on every ISA.
const NORM_LANES: u64 = 8;

/// The f64 partial sums of softmax's exp-sum: the AVX2 kernel's two
/// accumulators of 4 lanes, NEON's two of 2.
fn exp_sum_lanes(arch: NativeArch) -> u64 {
    match arch {
        NativeArch::X86_64 => 8,
        NativeArch::Aarch64 => 4,
    }
}

/// An f64 constant as MLIR text (bit-exact).
fn f64_const(b: &mut Body, v: f64) -> String {
    b.let_(format_args!("arith.constant 0x{:016X} : f64", v.to_bits()))
}

impl Body {
    fn line(&mut self, s: impl std::fmt::Display) {
        let _ = writeln!(self.text, "      {s}");
    }

    fn fresh(&mut self) -> String {
        let name = format!("%v{}", self.next);
        self.next += 1;
        name
    }

    fn cu64(&mut self, v: u64) -> String {
        self.let_(format_args!("arith.constant {v} : i64"))
    }

    fn cidx(&mut self, v: u64) -> String {
        self.let_(format_args!("arith.constant {v} : index"))
    }

    pub(super) fn bin64(&mut self, op: &str, a: &str, b: &str) -> String {
        self.let_(format_args!("arith.{op} {a}, {b} : f64"))
    }

    pub(super) fn ext(&mut self, v: &str) -> String {
        self.let_(format_args!("arith.extf {v} : f32 to f64"))
    }

    pub(super) fn trunc(&mut self, v: &str) -> String {
        self.let_(format_args!("arith.truncf {v} : f64 to f32"))
    }

    fn addr(&mut self, ptr: &str, idx: &str) -> String {
        self.let_(format_args!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr, i64) -> !llvm.ptr, f32"))
    }

    fn load(&mut self, ptr: &str, idx: &str) -> String {
        let e = self.addr(ptr, idx);
        self.let_(format_args!("llvm.load {e} : !llvm.ptr -> f32"))
    }

    fn store(&mut self, v: &str, ptr: &str, idx: &str) {
        let e = self.addr(ptr, idx);
        self.line(format_args!("llvm.store {v}, {e} : f32, !llvm.ptr"));
    }

    /// `x[idx]` for a constant index.
    fn load_at(&mut self, ptr: &str, idx: u64) -> String {
        let i = self.cu64(idx);
        self.load(ptr, &i)
    }

    /// `scf.for` over `0..count` with loop-carried values `inits` (name,
    /// type); `body(b, i, args)` gets the induction variable as an i64 and
    /// the carried values, and returns their next values. Returns the
    /// loop's results.
    fn for_loop(
        &mut self,
        count: u64,
        inits: &[(String, &str)],
        body: impl FnOnce(&mut Body, &str, &[String]) -> Vec<String>,
    ) -> Vec<String> {
        let (c0, c1, n) = (self.cidx(0), self.cidx(1), self.cidx(count));
        let iv = self.fresh();
        let args: Vec<String> = inits.iter().map(|_| self.fresh()).collect();
        let res = self.fresh();
        let types: Vec<&str> = inits.iter().map(|(_, t)| *t).collect();
        if inits.is_empty() {
            self.line(format_args!("scf.for {iv} = {c0} to {n} step {c1} {{"));
        } else {
            let iter: Vec<String> = args.iter().zip(inits).map(|(a, (v, _))| format!("{a} = {v}")).collect();
            self.line(format_args!(
                "{res}:{} = scf.for {iv} = {c0} to {n} step {c1} iter_args({}) -> ({}) {{",
                inits.len(),
                iter.join(", "),
                types.join(", ")
            ));
        }
        let i = self.let_(format_args!("arith.index_cast {iv} : index to i64"));
        let next = body(self, &i, &args);
        if inits.is_empty() {
            self.line("}");
            return Vec::new();
        }
        self.line(format_args!("scf.yield {} : {}", next.join(", "), types.join(", ")));
        self.line("}");
        (0..inits.len()).map(|k| format!("{res}#{k}")).collect()
    }

    /// `scf.if cond` yielding values of `types` from each branch.
    fn if_else(
        &mut self,
        cond: &str,
        types: &[&str],
        then: impl FnOnce(&mut Body) -> Vec<String>,
        other: impl FnOnce(&mut Body) -> Vec<String>,
    ) -> Vec<String> {
        let res = self.fresh();
        self.line(format_args!("{res}:{} = scf.if {cond} -> ({}) {{", types.len(), types.join(", ")));
        let a = then(self);
        self.line(format_args!("scf.yield {} : {}", a.join(", "), types.join(", ")));
        self.line("} else {");
        let b = other(self);
        self.line(format_args!("scf.yield {} : {}", b.join(", "), types.join(", ")));
        self.line("}");
        (0..types.len()).map(|k| format!("{res}#{k}")).collect()
    }

    /// `i·lanes + j` as an i64 register.
    fn lane_index(&mut self, i: &str, lanes: u64, j: u64) -> String {
        let l = self.cu64(lanes);
        let base = self.let_(format_args!("arith.muli {i}, {l} : i64"));
        let j = self.cu64(j);
        self.let_(format_args!("arith.addi {base}, {j} : i64"))
    }

    /// Partial sums `p[k] += f(x[i])` for element `i` into `k = i mod lanes`
    /// over whole chunks of `lanes`, then the remainder into `p[0..rem]`:
    /// the generic `lane_sum`'s order. The chunks run as one
    /// `vector<lanes x f64>` accumulator (lane `k` is `p[k]`: the same adds
    /// in the same order); `f` gets a value and its type (f64 or that
    /// vector). Returns the partials.
    fn lane_partials(
        &mut self,
        x: &str,
        len: u64,
        lanes: u64,
        f: &dyn Fn(&mut Body, String, &str) -> String,
    ) -> Vec<String> {
        let (vf32, vf64) = (format!("vector<{lanes}xf32>"), format!("vector<{lanes}xf64>"));
        let zero = self.let_(format_args!("arith.constant dense<0.0> : {vf64}"));
        let acc = self
            .for_loop(len / lanes, &[(zero, vf64.as_str())], |b, i, acc| {
                let idx = b.lane_index(i, lanes, 0);
                let e = b.addr(x, &idx);
                let v = b.let_(format_args!("llvm.load {e} {{alignment = 4 : i64}} : !llvm.ptr -> {vf32}"));
                let v = b.let_(format_args!("arith.extf {v} : {vf32} to {vf64}"));
                let t = f(b, v, &vf64);
                vec![b.let_(format_args!("arith.addf {}, {t} : {vf64}", acc[0]))]
            })
            .remove(0);
        let mut p: Vec<String> =
            (0..lanes).map(|k| self.let_(format_args!("vector.extract {acc}[{k}] : f64 from {vf64}"))).collect();
        for j in 0..len % lanes {
            let v = self.load_at(x, len / lanes * lanes + j);
            let v = self.ext(&v);
            let t = f(self, v, "f64");
            p[j as usize] = self.bin64("addf", &p[j as usize], &t);
        }
        p
    }

    /// `v` as a value of type `ty` (f64, or a vector of them).
    fn splat64(&mut self, v: &str, ty: &str) -> String {
        if ty == "f64" {
            return v.to_string();
        }
        self.let_(format_args!("vector.broadcast {v} : f64 to {ty}"))
    }

    /// The partials added pairwise as the kernels do: `p[k] + p[k + L/2]`,
    /// then those pairwise again (`((l0 + l1) + (l2 + l3))` for 8 lanes).
    fn combine(&mut self, p: &[String]) -> String {
        let half = p.len() / 2;
        let mut l: Vec<String> = (0..half).map(|k| self.bin64("addf", &p[k], &p[k + half])).collect();
        while l.len() > 1 {
            l = l.chunks(2).map(|c| self.bin64("addf", &c[0], &c[1])).collect();
        }
        l.pop().unwrap_or_default()
    }

    /// A row's maximum by `llvm.maximum` (a reduction LLVM vectorises), and
    /// whether it can stand for the sequential one: no NaN or infinity in
    /// the row (an integer OR of the exponent tests) and a non-zero maximum
    /// (then every order gives that value). Returns `(max, exact)`.
    fn lane_max(&mut self, x: &str, len: u64) -> (String, String) {
        let ninf = self.c(f32::NEG_INFINITY);
        let zero = self.ci(0);
        let acc = self.for_loop(len, &[(ninf, "f32"), (zero, "i32")], |b, i, acc| {
            let v = b.load(x, i);
            let m = b.let_(format_args!("arith.maximumf {}, {v} : f32", acc[0]));
            let bits = b.let_(format_args!("arith.bitcast {v} : f32 to i32"));
            let mask = b.ci(0x7f80_0000);
            let e = b.let_(format_args!("arith.andi {bits}, {mask} : i32"));
            let special = b.let_(format_args!("arith.cmpi eq, {e}, {mask} : i32"));
            let special = b.let_(format_args!("arith.extui {special} : i1 to i32"));
            vec![m, b.let_(format_args!("arith.ori {}, {special} : i32", acc[1]))]
        });
        let zero = self.ci(0);
        let finite = self.let_(format_args!("arith.cmpi eq, {}, {zero} : i32", acc[1]));
        let nonzero = self.cmp_c("une", &acc[0], 0.0);
        let exact = self.let_(format_args!("arith.andi {finite}, {nonzero} : i1"));
        (acc[0].clone(), exact)
    }

    /// The sequential maximum: softmax's `max_f32` fallback (the last NaN
    /// wins: `v > m || v is NaN`), or the reduction's fold (the first NaN
    /// stays: `m` if `m` is NaN or `m ≥ v`).
    fn seq_max(&mut self, x: &str, len: u64, last_nan: bool) -> String {
        let ninf = self.c(f32::NEG_INFINITY);
        self.for_loop(len, &[(ninf, "f32")], |b, i, m| {
            let v = b.load(x, i);
            let take = if last_nan {
                let gt = b.cmp("ogt", &v, &m[0]);
                let nan = b.is_nan(&v);
                b.let_(format_args!("arith.ori {gt}, {nan} : i1"))
            } else {
                // `m` stays if it is NaN or `m >= v`.
                let ge = b.cmp("oge", &m[0], &v);
                let nan = b.is_nan(&m[0]);
                let keep = b.let_(format_args!("arith.ori {ge}, {nan} : i1"));
                return vec![b.select(&keep, &m[0], &v)];
            };
            vec![b.select(&take, &v, &m[0])]
        })
        .remove(0)
    }

    /// A row's maximum as the kernel computes it.
    fn row_max(&mut self, x: &str, len: u64, last_nan: bool) -> String {
        let (fast, exact) = self.lane_max(x, len);
        let x = x.to_string();
        self.if_else(&exact, &["f32"], |_| vec![fast], |b| vec![b.seq_max(&x, len, last_nan)]).remove(0)
    }

    /// ln x for x ≥ 1, NaN and +inf (softmax's sum): fdlibm's
    /// `__ieee754_log` in f64, its branches as selects.
    fn log_f64(&mut self, x: &str) -> String {
        let c = |b: &mut Body, bits: u64| f64_const(b, f64::from_bits(bits));
        let bits = self.let_(format_args!("arith.bitcast {x} : f64 to i64"));
        let c32 = self.cu64(32);
        let hi64 = self.let_(format_args!("arith.shrui {bits}, {c32} : i64"));
        let hx = self.let_(format_args!("arith.trunci {hi64} : i64 to i32"));
        let c20 = self.ci(20);
        let e = self.let_(format_args!("arith.shrui {hx}, {c20} : i32"));
        let c1023 = self.ci(1023);
        let k = self.let_(format_args!("arith.subi {e}, {c1023} : i32"));
        let mant = self.ci(0x000f_ffff);
        let hxm = self.let_(format_args!("arith.andi {hx}, {mant} : i32"));
        let c95 = self.ci(0x95f64);
        let t = self.let_(format_args!("arith.addi {hxm}, {c95} : i32"));
        let bit = self.ci(0x10_0000);
        let i = self.let_(format_args!("arith.andi {t}, {bit} : i32"));
        // Normalise x to [√½, √2) (x or x/2).
        let one_hi = self.ci(0x3ff0_0000);
        let ix = self.let_(format_args!("arith.xori {i}, {one_hi} : i32"));
        let nh = self.let_(format_args!("arith.ori {hxm}, {ix} : i32"));
        let nh64 = self.let_(format_args!("arith.extui {nh} : i32 to i64"));
        let nh64 = self.let_(format_args!("arith.shli {nh64}, {c32} : i64"));
        let lo_mask = self.cu64(0xffff_ffff);
        let lo = self.let_(format_args!("arith.andi {bits}, {lo_mask} : i64"));
        let nb = self.let_(format_args!("arith.ori {nh64}, {lo} : i64"));
        let xn = self.let_(format_args!("arith.bitcast {nb} : i64 to f64"));
        let ki = self.let_(format_args!("arith.shrui {i}, {c20} : i32"));
        let k = self.let_(format_args!("arith.addi {k}, {ki} : i32"));
        let one = f64_const(self, 1.0);
        let f = self.bin64("subf", &xn, &one);
        let dk = self.let_(format_args!("arith.sitofp {k} : i32 to f64"));
        let ln2_hi = c(self, 0x3fe6_2e42_fee0_0000);
        let ln2_lo = c(self, 0x3dea_39ef_3579_3c76);
        let dk_hi = self.bin64("mulf", &dk, &ln2_hi);
        let dk_lo = self.bin64("mulf", &dk, &ln2_lo);
        // |f| < 2⁻²⁰: f − f²·(½ − f/3) (exactly k·ln2 when f is 0).
        let two = self.ci(2);
        let t2 = self.let_(format_args!("arith.addi {hxm}, {two} : i32"));
        let t2 = self.let_(format_args!("arith.andi {t2}, {mant} : i32"));
        let three = self.ci(3);
        let tiny = self.let_(format_args!("arith.cmpi slt, {t2}, {three} : i32"));
        let ff = self.bin64("mulf", &f, &f);
        // fdlibm's 0.33333333333333333: the double nearest 1/3.
        let third = c(self, 0x3FD5_5555_5555_5555);
        let half = f64_const(self, 0.5);
        let tf = self.bin64("mulf", &third, &f);
        let h = self.bin64("subf", &half, &tf);
        let r_small = self.bin64("mulf", &ff, &h);
        let a = self.bin64("subf", &r_small, &dk_lo);
        let a = self.bin64("subf", &a, &f);
        let small = self.bin64("subf", &dk_hi, &a);
        let exact = self.bin64("addf", &dk_hi, &dk_lo);
        let zero = f64_const(self, 0.0);
        let fz = self.let_(format_args!("arith.cmpf oeq, {f}, {zero} : f64"));
        let small = self.let_(format_args!("arith.select {fz}, {exact}, {small} : f64"));
        // General: s = f/(2+f), R = the Lg polynomial in s².
        let two_f = f64_const(self, 2.0);
        let d = self.bin64("addf", &two_f, &f);
        let s = self.bin64("divf", &f, &d);
        let z = self.bin64("mulf", &s, &s);
        let w = self.bin64("mulf", &z, &z);
        let lg: Vec<String> = [
            0x3FE5_5555_5555_5593u64,
            0x3FD9_9999_9997_FA04,
            0x3FD2_4924_9422_9359,
            0x3FCC_71C5_1D8E_78AF,
            0x3FC7_4664_96CB_03DE,
            0x3FC3_9A09_D078_C69F,
            0x3FC2_F112_DF3E_5244,
        ]
        .iter()
        .map(|&b| c(self, b))
        .collect();
        // t1 = w·(Lg2 + w·(Lg4 + w·Lg6)), t2 = z·(Lg1 + w·(Lg3 + w·(Lg5 + w·Lg7))).
        let u = self.bin64("mulf", &w, &lg[5]);
        let u = self.bin64("addf", &lg[3], &u);
        let u = self.bin64("mulf", &w, &u);
        let u = self.bin64("addf", &lg[1], &u);
        let t1 = self.bin64("mulf", &w, &u);
        let v = self.bin64("mulf", &w, &lg[6]);
        let v = self.bin64("addf", &lg[4], &v);
        let v = self.bin64("mulf", &w, &v);
        let v = self.bin64("addf", &lg[2], &v);
        let v = self.bin64("mulf", &w, &v);
        let v = self.bin64("addf", &lg[0], &v);
        let t2 = self.bin64("mulf", &z, &v);
        let r = self.bin64("addf", &t2, &t1);
        let ca = self.ci(0x6147a);
        let cb = self.ci(0x6b851);
        let ia = self.let_(format_args!("arith.subi {hxm}, {ca} : i32"));
        let jb = self.let_(format_args!("arith.subi {cb}, {hxm} : i32"));
        let ij = self.let_(format_args!("arith.ori {ia}, {jb} : i32"));
        let zi = self.ci(0);
        let wide = self.let_(format_args!("arith.cmpi sgt, {ij}, {zi} : i32"));
        // wide: k·ln2_hi − ((hfsq − (s·(hfsq + R) + k·ln2_lo)) − f)
        let hf = self.bin64("mulf", &half, &f);
        let hfsq = self.bin64("mulf", &hf, &f);
        let q = self.bin64("addf", &hfsq, &r);
        let q = self.bin64("mulf", &s, &q);
        let q = self.bin64("addf", &q, &dk_lo);
        let q = self.bin64("subf", &hfsq, &q);
        let q = self.bin64("subf", &q, &f);
        let res_wide = self.bin64("subf", &dk_hi, &q);
        // narrow: k·ln2_hi − ((s·(f − R) − k·ln2_lo) − f)
        let p = self.bin64("subf", &f, &r);
        let p = self.bin64("mulf", &s, &p);
        let p = self.bin64("subf", &p, &dk_lo);
        let p = self.bin64("subf", &p, &f);
        let res_narrow = self.bin64("subf", &dk_hi, &p);
        let general = self.let_(format_args!("arith.select {wide}, {res_wide}, {res_narrow} : f64"));
        let res = self.let_(format_args!("arith.select {tiny}, {small}, {general} : f64"));
        // NaN and +inf are their own logarithms.
        let inf = f64_const(self, f64::INFINITY);
        let finite = self.let_(format_args!("arith.cmpf olt, {x}, {inf} : f64"));
        self.let_(format_args!("arith.select {finite}, {res}, {x} : f64"))
    }

    /// Softmax of one row: `max`, `exp_sum` into `out`, then the scaling.
    fn softmax_row(&mut self, x: &str, o: &str, len: u64, log: bool, lanes: u64) {
        let m = self.row_max(x, len, true);
        // exp(x − max) into `out` by an elementwise loop (vectorised), then
        // its partial sums read back: the same values and adds as the
        // kernel's fused loop.
        self.for_loop(len, &[], |b, i, _| {
            let v = b.load(x, i);
            let d = b.sub(&v, &m);
            let e = b.exp(&d);
            b.store(&e, o, i);
            Vec::new()
        });
        let o_read = o.to_string();
        let full = len / lanes * lanes;
        let p = self.lane_partials(o, full, lanes, &|_, v, _| v);
        let mut sum = self.combine(&p);
        for j in full..len {
            let e = self.load_at(&o_read, j);
            let e = self.ext(&e);
            sum = self.bin64("addf", &sum, &e);
        }
        if log {
            let l = self.log_f64(&sum);
            let lse = self.trunc(&l);
            self.for_loop(len, &[], |b, i, _| {
                let v = b.load(x, i);
                let d = b.sub(&v, &m);
                let r = b.sub(&d, &lse);
                b.store(&r, o, i);
                Vec::new()
            });
        } else {
            let one = f64_const(self, 1.0);
            let inv = self.bin64("divf", &one, &sum);
            let inv = self.trunc(&inv);
            self.for_loop(len, &[], |b, i, _| {
                let e = b.load(o, i);
                let r = b.mul(&e, &inv);
                b.store(&r, o, i);
                Vec::new()
            });
        }
    }

    /// Layer norm (`rms` false) or RMS norm of one row.
    #[allow(clippy::too_many_arguments)]
    fn norm_row(&mut self, x: &str, o: &str, len: u64, rms: bool, eps: f64, w: Option<&str>, bias: Option<&str>) {
        let n = f64_const(self, len as f64);
        let one = f64_const(self, 1.0);
        let eps = f64_const(self, eps);
        let (mean, rstd) = if rms {
            let p =
                self.lane_partials(x, len, NORM_LANES, &|b, v, ty| b.let_(format_args!("arith.mulf {v}, {v} : {ty}")));
            let s = self.combine(&p);
            let ms = self.bin64("divf", &s, &n);
            let t = self.bin64("addf", &ms, &eps);
            let t = self.let_(format_args!("math.sqrt {t} : f64"));
            (None, self.bin64("divf", &one, &t))
        } else {
            let p = self.lane_partials(x, len, NORM_LANES, &|_, v, _| v);
            let s = self.combine(&p);
            let mean = self.bin64("divf", &s, &n);
            let m2 = mean.clone();
            let p = self.lane_partials(x, len, NORM_LANES, &move |b, v, ty| {
                let m = b.splat64(&m2, ty);
                let d = b.let_(format_args!("arith.subf {v}, {m} : {ty}"));
                b.let_(format_args!("arith.mulf {d}, {d} : {ty}"))
            });
            let s = self.combine(&p);
            let var = self.bin64("divf", &s, &n);
            let t = self.bin64("addf", &var, &eps);
            let t = self.let_(format_args!("math.sqrt {t} : f64"));
            (Some(mean), self.bin64("divf", &one, &t))
        };
        self.for_loop(len, &[], |b, i, _| {
            let v = b.load(x, i);
            let v = b.ext(&v);
            let mut r = match &mean {
                Some(mean) => {
                    let d = b.bin64("subf", &v, mean);
                    b.bin64("mulf", &d, &rstd)
                }
                None => b.bin64("mulf", &v, &rstd),
            };
            if let Some(w) = w {
                let wv = b.load(w, i);
                let wv = b.ext(&wv);
                r = b.bin64("mulf", &r, &wv);
            }
            if let Some(bias) = bias {
                let bv = b.load(bias, i);
                let bv = b.ext(&bv);
                r = b.bin64("addf", &r, &bv);
            }
            let r = b.trunc(&r);
            b.store(&r, o, i);
            Vec::new()
        });
    }

    /// Rows `start..start + 4·⌊(end − start)/4⌋` of a sum or mean, four at
    /// a time; defines `%rest`, the first row left.
    fn sum_quads(&mut self, len: u64, mean: bool, epilogue: Option<Epilogue<'_>>) -> Result<(), Unsupported> {
        let four = self.cu64(4);
        let nr = self.let_("arith.subi %end, %start : i64");
        let nq = self.let_(format_args!("arith.divui {nr}, {four} : i64"));
        let qhi = self.let_(format_args!("arith.index_cast {nq} : i64 to index"));
        let c0 = self.cidx(0);
        let q = self.fresh();
        self.line(format_args!("scf.for {q} = {c0} to {qhi} step %step {{"));
        let qi = self.let_(format_args!("arith.index_cast {q} : index to i64"));
        let q4 = self.let_(format_args!("arith.muli {qi}, {four} : i64"));
        let r0 = self.let_(format_args!("arith.addi %start, {q4} : i64"));
        let lenc = self.cu64(len);
        let mut xs = Vec::new();
        let mut rs = Vec::new();
        for k in 0..4 {
            let kc = self.cu64(k);
            let r = self.let_(format_args!("arith.addi {r0}, {kc} : i64"));
            let xb = self.let_(format_args!("arith.muli {r}, {lenc} : i64"));
            xs.push(self.let_(format_args!("llvm.getelementptr %p0[{xb}] : (!llvm.ptr, i64) -> !llvm.ptr, f32")));
            rs.push(r);
        }
        let zero = f64_const(self, 0.0);
        let inits: Vec<(String, &str)> = (0..4).map(|_| (zero.clone(), "f64")).collect();
        let sums = self.for_loop(len, &inits, |b, i, acc| {
            (0..4)
                .map(|k| {
                    let v = b.load(&xs[k], i);
                    let v = b.ext(&v);
                    b.bin64("addf", &acc[k], &v)
                })
                .collect()
        });
        for (s, r) in sums.iter().zip(&rs) {
            let s = if mean {
                let n = f64_const(self, len as f64);
                self.bin64("divf", s, &n)
            } else {
                s.clone()
            };
            let s = self.trunc(&s);
            self.store(&s, "%out", r);
            if let Some(p) = epilogue {
                let y = self.addr("%out", r);
                self.epilogue_elems(p, &y, r, 1)?;
            }
        }
        self.line("}");
        let done = self.let_(format_args!("arith.muli {nq}, {four} : i64"));
        let rest = self.let_(format_args!("arith.addi %start, {done} : i64"));
        self.line(format_args!("%rest = arith.index_cast {rest} : i64 to index"));
        Ok(())
    }

    /// Sum or mean of one row: one f64 chain in order.
    fn sum_row(&mut self, x: &str, len: u64, mean: bool) -> String {
        let zero = f64_const(self, 0.0);
        let s = self
            .for_loop(len, &[(zero, "f64")], |b, i, acc| {
                let v = b.load(x, i);
                let v = b.ext(&v);
                vec![b.bin64("addf", &acc[0], &v)]
            })
            .remove(0);
        let s = if mean {
            let n = f64_const(self, len as f64);
            self.bin64("divf", &s, &n)
        } else {
            s
        };
        self.trunc(&s)
    }
}

/// An elementwise program a row function computes its operand 0 with, row
/// by row (format 0.14): the program and how it reads each of its operands
/// (indexed like elements of operand 0).
#[derive(Clone, Copy, Debug)]
pub struct Prologue<'a> {
    pub program: &'a [FusedOp],
    pub modes: &'a [InputMode],
    /// The operands' dtypes (f32, bool, i32, i64); the result is f32.
    pub dtypes: &'a [DType],
}

impl Body {
    /// Row `%xb / len` of the prologue's result into `%x` (element `%xb +
    /// i`): the program's ops on each element, as the elementwise functions
    /// compute them.
    fn prologue_row(&mut self, p: Prologue<'_>, len: u64) -> Result<(), Unsupported> {
        if p.modes.len() != p.dtypes.len() {
            return Err(Unsupported(format!("{} modes for {} operands", p.modes.len(), p.dtypes.len())));
        }
        let types = p.dtypes.iter().map(|&d| Ty::of(d)).collect::<Result<Vec<Ty>, Unsupported>>()?;
        let mut failed = None;
        self.for_loop(len, &[], |b, i, _| {
            let idx = b.let_(format_args!("arith.addi %xb, {i} : i64"));
            let regs = p
                .modes
                .iter()
                .enumerate()
                .map(|(k, &mode)| b.mode_load(&format!("%q{k}"), mode, &idx, types[k]))
                .collect();
            match program_values(b, p.program, regs) {
                // A row function cannot fail: no integer division.
                Ok(_) if !b.zero_divisors.is_empty() => {
                    failed = Some(Unsupported("an integer division in a prologue".into()))
                }
                Ok((r, Ty::F32)) => b.store(&r, "%x", i),
                Ok((_, ty)) => failed = Some(Unsupported(format!("a {ty:?} prologue result"))),
                Err(e) => failed = Some(e),
            }
            Vec::new()
        });
        failed.map_or(Ok(()), Err)
    }

    /// Element `idx` of an operand read with `mode` (for element `idx` of
    /// the tensor it is broadcast to), as a `ty` register with its type.
    fn mode_load(&mut self, ptr: &str, mode: InputMode, idx: &str, ty: Ty) -> (String, Ty) {
        let at = match mode {
            InputMode::Full => idx.to_string(),
            InputMode::Splat => self.cu64(0),
            InputMode::Broadcast { inner, period } => {
                let (inner, period) = (self.cu64(inner), self.cu64(period));
                let q = self.let_(format_args!("arith.divui {idx}, {inner} : i64"));
                self.let_(format_args!("arith.remui {q}, {period} : i64"))
            }
        };
        (self.load_ty(ptr, &at, ty), ty)
    }

    /// Elements `base + i` (`i < count`) of the epilogue's result into
    /// `%z`: its program on element `i` of `y` (the row function's result)
    /// and on its other operands `%e0, %e1, ..` read as their modes say,
    /// as the elementwise functions compute it.
    fn epilogue_elems(&mut self, p: Epilogue<'_>, y: &str, base: &str, count: u64) -> Result<(), Unsupported> {
        if p.modes.len() != p.dtypes.len() || p.row > p.modes.len() {
            return Err(Unsupported(format!("an epilogue of {} modes, {} operands", p.modes.len(), p.dtypes.len())));
        }
        let types = p.dtypes.iter().map(|&d| Ty::of(d)).collect::<Result<Vec<Ty>, Unsupported>>()?;
        let mut failed = None;
        self.for_loop(count, &[], |b, i, _| {
            let idx = b.let_(format_args!("arith.addi {base}, {i} : i64"));
            let mut regs: Vec<(String, Ty)> = p
                .modes
                .iter()
                .enumerate()
                .map(|(k, &mode)| b.mode_load(&format!("%e{k}"), mode, &idx, types[k]))
                .collect();
            let v = b.load(y, i);
            regs.insert(p.row, (v, Ty::F32));
            match program_values(b, p.program, regs) {
                // A row function cannot fail: no integer division.
                Ok(_) if !b.zero_divisors.is_empty() => {
                    failed = Some(Unsupported("an integer division in a epilogue".into()))
                }
                Ok((r, Ty::F32)) => b.store(&r, "%z", &idx),
                Ok((_, ty)) => failed = Some(Unsupported(format!("a {ty:?} epilogue result"))),
                Err(e) => failed = Some(e),
            }
            Vec::new()
        });
        failed.map_or(Ok(()), Err)
    }
}

/// An elementwise program a row function applies to each row of its result
/// (format 0.20), writing the program's result too: the program reads the
/// row function's result as operand `row` and its other operands (indexed
/// like elements of the result) as `modes` say.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    pub program: &'a [FusedOp],
    /// Where the row function's result is among the program's operands.
    pub row: usize,
    /// The other operands' modes and dtypes (f32, bool, i32, i64); the result is f32.
    pub modes: &'a [InputMode],
    pub dtypes: &'a [DType],
}

/// The MLIR function text of row function `symbol` computing `op` on rows
/// of `len` f32 elements, with the kernel table's order for `arch`; with a
/// `prologue`, operand 0 is computed by it (see
/// `kiln_runtime::native::FunctionShape::Rows`: the prologue's operands
/// come first, then the kernel's others, then where operand 0 is written);
/// with an `epilogue`, each row's result goes through it too (its operands
/// after the kernel's, its result written last).
pub fn row_function_to_mlir(
    symbol: &str,
    op: RowOp,
    len: u64,
    arch: NativeArch,
    prologue: Option<Prologue<'_>>,
    epilogue: Option<Epilogue<'_>>,
) -> Result<String, Unsupported> {
    if len == 0 {
        return Err(Unsupported("empty rows".into()));
    }
    if prologue.is_some() && matches!(op, RowOp::Sum | RowOp::Mean) {
        return Err(Unsupported("a prologue before a sum or mean".into()));
    }
    let mut b = Body::new(0);
    let mut text = String::new();
    let _ = writeln!(text, "  func.func @{symbol}(%ins: !llvm.ptr, %out: !llvm.ptr, %start: i64, %end: i64) {{");
    let k = prologue.map_or(0, |p| p.modes.len());
    for i in 0..k {
        let _ = writeln!(text, "    %qa{i} = llvm.getelementptr %ins[{i}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr");
        let _ = writeln!(text, "    %q{i} = llvm.load %qa{i} : !llvm.ptr -> !llvm.ptr");
    }
    // The operands read: the prologue's (or the kernel's first), the
    // kernel's others, the epilogue's; then the prologue's result, then
    // the epilogue's.
    let e = epilogue.map_or(0, |p| p.modes.len());
    let read = k.max(1) + op.operands() - 1 + e;
    for i in 0..op.operands() {
        // Without a prologue operand `i` is `ins[i]`; with one, operand 0
        // (written, then read) comes after the operands read.
        let at = match (prologue, i) {
            (None, _) => i,
            (Some(_), 0) => read,
            (Some(_), _) => k + i - 1,
        };
        let _ = writeln!(text, "    %pa{i} = llvm.getelementptr %ins[{at}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr");
        let _ = writeln!(text, "    %p{i} = llvm.load %pa{i} : !llvm.ptr -> !llvm.ptr");
    }
    if epilogue.is_some() {
        for j in 0..e {
            let at = read - e + j;
            let _ = writeln!(text, "    %ea{j} = llvm.getelementptr %ins[{at}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr");
            let _ = writeln!(text, "    %e{j} = llvm.load %ea{j} : !llvm.ptr -> !llvm.ptr");
        }
        let at = read + usize::from(prologue.is_some());
        let _ = writeln!(text, "    %za = llvm.getelementptr %ins[{at}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr");
        let _ = writeln!(text, "    %z = llvm.load %za : !llvm.ptr -> !llvm.ptr");
    }
    let _ = writeln!(text, "    %lo = arith.index_cast %start : i64 to index");
    let _ = writeln!(text, "    %hi = arith.index_cast %end : i64 to index");
    let _ = writeln!(text, "    %step = arith.constant 1 : index");
    let first = if let RowOp::Sum | RowOp::Mean = op {
        // Four rows at a time, as the kernel's `sum_rows`: four independent
        // chains (one per row, each in row order); the rest one by one below.
        let mut q = Body::new(1_000_000);
        q.sum_quads(len, op == RowOp::Mean, epilogue)?;
        text.push_str(&q.text);
        "%rest"
    } else {
        "%lo"
    };
    let _ = writeln!(text, "    scf.for %r = {first} to %hi step %step {{");
    let _ = writeln!(text, "      %ri = arith.index_cast %r : index to i64");
    let _ = writeln!(text, "      %len = arith.constant {len} : i64");
    let _ = writeln!(text, "      %olen = arith.constant {} : i64", op.out_len(len));
    let _ = writeln!(text, "      %xb = arith.muli %ri, %len : i64");
    let _ = writeln!(text, "      %ob = arith.muli %ri, %olen : i64");
    let _ = writeln!(text, "      %x = llvm.getelementptr %p0[%xb] : (!llvm.ptr, i64) -> !llvm.ptr, f32");
    let _ = writeln!(text, "      %o = llvm.getelementptr %out[%ob] : (!llvm.ptr, i64) -> !llvm.ptr, f32");
    if let Some(p) = prologue {
        b.prologue_row(p, len)?;
    }
    match op {
        RowOp::Softmax { log } => b.softmax_row("%x", "%o", len, log, exp_sum_lanes(arch)),
        RowOp::LayerNorm { eps, weight, bias } => {
            let w = weight.then_some("%p1");
            let bias = bias.then_some(if weight { "%p2" } else { "%p1" });
            b.norm_row("%x", "%o", len, false, eps, w, bias)
        }
        RowOp::RmsNorm { eps, weight } => b.norm_row("%x", "%o", len, true, eps, weight.then_some("%p1"), None),
        RowOp::Sum | RowOp::Mean => {
            let s = b.sum_row("%x", len, op == RowOp::Mean);
            let zero = b.cu64(0);
            b.store(&s, "%o", &zero);
        }
        RowOp::Max => {
            let m = b.row_max("%x", len, false);
            let zero = b.cu64(0);
            b.store(&m, "%o", &zero);
        }
    }
    if let Some(p) = epilogue {
        // The row's result is in L1: read back, through the program, into `%z`.
        b.epilogue_elems(p, "%o", "%ob", op.out_len(len))?;
    }
    text.push_str(&b.text);
    let _ = writeln!(text, "    }}");
    let _ = writeln!(text, "    return");
    let _ = writeln!(text, "  }}");
    Ok(text)
}
