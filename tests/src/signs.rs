//! Outputs whose vectors are defined only up to sign: eigenvectors of a
//! symmetric matrix, the singular vector pairs of an SVD. LAPACK's signs
//! are an accident of its algorithm and kiln picks its own (see
//! `kiln_kernels::linalg`), so a conformance case lists such outputs as a
//! sign group and [`align`] flips kiln's vectors to torch's before the
//! usual elementwise comparison: a vector pair flips together, so U·S·Vh is
//! still checked. Vectors a decomposition leaves free beyond the pairs (the
//! columns `full_matrices` adds to complete a basis) are checked by the
//! space they span and then taken as torch's.
//!
//! Used by kiln-tests' conformance test and, by path, by the compiler's
//! StableHLO conformance test.

/// One output of a sign group: vector `j` of each matrix is the slice at
/// index `j` along `dim` (`-1`: columns, as U's; `-2`: rows, as Vh's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub output: usize,
    pub dim: isize,
}

/// The layout of one output's vectors: `batch` matrices of `rows × cols`.
struct Layout {
    batch: usize,
    rows: usize,
    cols: usize,
    columns: bool,
}

impl Layout {
    fn of(shape: &[usize], dim: isize) -> Result<Layout, String> {
        let r = shape.len();
        if r < 2 || !(dim == -1 || dim == -2) {
            return Err(format!("sign group: shape {shape:?} with vector dim {dim}"));
        }
        let (rows, cols) = (shape[r - 2], shape[r - 1]);
        Ok(Layout { batch: shape[..r - 2].iter().product(), rows, cols, columns: dim == -1 })
    }
    fn count(&self) -> usize {
        if self.columns {
            self.cols
        } else {
            self.rows
        }
    }
    fn len(&self) -> usize {
        if self.columns {
            self.rows
        } else {
            self.cols
        }
    }
    /// Flat positions of vector `j` of matrix `t`.
    fn positions(&self, t: usize, j: usize) -> Vec<usize> {
        let base = t * self.rows * self.cols;
        (0..self.len())
            .map(|i| if self.columns { base + i * self.cols + j } else { base + j * self.cols + i })
            .collect()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Each group member's layout, checked against the outputs' sizes (`parts`
/// numbers per element: 2 for complex (re, im) pairs).
fn group_layouts(
    group: &[Member],
    got: &[Vec<f64>],
    shapes: &[Vec<usize>],
    want: &[Vec<f64>],
    parts: usize,
) -> Result<Vec<Layout>, String> {
    let layout = |m: &Member| -> Result<Layout, String> {
        let shape = shapes.get(m.output).ok_or_else(|| format!("sign group names output {}", m.output))?;
        let l = Layout::of(shape, m.dim)?;
        let n = parts * l.batch * l.rows * l.cols;
        if got.get(m.output).map(Vec::len) != Some(n) || want.get(m.output).map(Vec::len) != Some(n) {
            return Err(format!("sign group: output {} does not have {n} values", m.output));
        }
        Ok(l)
    };
    group.iter().map(layout).collect()
}

/// Flips kiln's vectors in `got` (outputs as f64, with their shapes) to
/// the signs of torch's in `want`: each vector index's sign is read from
/// the group's first output (its dot product with torch's vector) and
/// applied to every output of the group. Free vectors beyond the smallest
/// count in the group must lie in the span of torch's free vectors (to
/// `tol`) and are then replaced by torch's.
pub fn align(
    group: &[Member],
    got: &mut [Vec<f64>],
    shapes: &[Vec<usize>],
    want: &[Vec<f64>],
    tol: f64,
) -> Result<(), String> {
    let Some(first) = group.first() else { return Ok(()) };
    let layouts = group_layouts(group, got, shapes, want, 1)?;
    let paired = layouts.iter().map(Layout::count).min().unwrap_or(0);
    let lead = &layouts[0];
    for t in 0..lead.batch {
        for j in 0..paired {
            let at = lead.positions(t, j);
            let g: Vec<f64> = at.iter().map(|&p| got[first.output][p]).collect();
            let w: Vec<f64> = at.iter().map(|&p| want[first.output][p]).collect();
            if dot(&g, &w) >= 0.0 {
                continue;
            }
            for (m, l) in group.iter().zip(&layouts) {
                for p in l.positions(t, j) {
                    got[m.output][p] = -got[m.output][p];
                }
            }
        }
        for (m, l) in group.iter().zip(&layouts) {
            free_vectors(m.output, l, t, paired, got, want, tol)?;
        }
    }
    Ok(())
}

/// [`align`] for complex outputs (`got`/`want` hold (re, im) pairs per
/// element): each vector index's phase `e^{iθ}` is read from the group's
/// first output (the phase of `⟨kiln's, torch's⟩`) and applied to every
/// output of the group. Free vectors are checked by span as [`align`]'s.
pub fn align_complex(
    group: &[Member],
    got: &mut [Vec<f64>],
    shapes: &[Vec<usize>],
    want: &[Vec<f64>],
    tol: f64,
) -> Result<(), String> {
    let Some(first) = group.first() else { return Ok(()) };
    let layouts = group_layouts(group, got, shapes, want, 2)?;
    let paired = layouts.iter().map(Layout::count).min().unwrap_or(0);
    let lead = &layouts[0];
    for t in 0..lead.batch {
        for j in 0..paired {
            let (mut cr, mut ci) = (0.0, 0.0);
            for p in lead.positions(t, j) {
                let (gr, gi) = (got[first.output][2 * p], got[first.output][2 * p + 1]);
                let (wr, wi) = (want[first.output][2 * p], want[first.output][2 * p + 1]);
                cr += gr * wr + gi * wi;
                ci += gr * wi - gi * wr;
            }
            let r = cr.hypot(ci);
            if r == 0.0 || !r.is_finite() {
                continue;
            }
            let (pr, pi) = (cr / r, ci / r);
            for (m, l) in group.iter().zip(&layouts) {
                for p in l.positions(t, j) {
                    let (x, y) = (got[m.output][2 * p], got[m.output][2 * p + 1]);
                    got[m.output][2 * p] = x * pr - y * pi;
                    got[m.output][2 * p + 1] = x * pi + y * pr;
                }
            }
        }
        for (m, l) in group.iter().zip(&layouts) {
            free_complex_vectors(m.output, l, t, paired, got, want, tol)?;
        }
    }
    Ok(())
}

/// [`free_vectors`] of a complex output: `|⟨torch's, kiln's⟩|²` summed
/// over torch's free vectors must be kiln's squared length (1).
fn free_complex_vectors(
    output: usize,
    l: &Layout,
    t: usize,
    paired: usize,
    got: &mut [Vec<f64>],
    want: &[Vec<f64>],
    tol: f64,
) -> Result<(), String> {
    let vector = |v: &[f64], j: usize| -> Vec<(f64, f64)> {
        l.positions(t, j).iter().map(|&p| (v[2 * p], v[2 * p + 1])).collect()
    };
    let theirs: Vec<Vec<(f64, f64)>> = (paired..l.count()).map(|j| vector(&want[output], j)).collect();
    for j in paired..l.count() {
        let g = vector(&got[output], j);
        let norm2: f64 = g.iter().map(|(x, y)| x * x + y * y).sum();
        let inside: f64 = theirs
            .iter()
            .map(|w| {
                let (re, im) = w
                    .iter()
                    .zip(&g)
                    .fold((0.0, 0.0), |(re, im), (&(a, b), &(x, y))| (re + a * x + b * y, im + a * y - b * x));
                re * re + im * im
            })
            .sum();
        if (norm2 - 1.0).abs() > tol || (norm2 - inside).abs() > tol {
            return Err(format!(
                "output {output}, matrix {t}: free complex vector {j} has squared length {norm2}, {inside} of it in torch's span"
            ));
        }
        for (&p, &(x, y)) in l.positions(t, j).iter().zip(&theirs[j - paired]) {
            got[output][2 * p] = x;
            got[output][2 * p + 1] = y;
        }
    }
    Ok(())
}

/// Checks vectors `paired..` of matrix `t` of `output` against the span of
/// torch's (each of kiln's must keep its length when projected on it) and
/// takes torch's values for them.
fn free_vectors(
    output: usize,
    l: &Layout,
    t: usize,
    paired: usize,
    got: &mut [Vec<f64>],
    want: &[Vec<f64>],
    tol: f64,
) -> Result<(), String> {
    let theirs: Vec<Vec<f64>> =
        (paired..l.count()).map(|j| l.positions(t, j).iter().map(|&p| want[output][p]).collect()).collect();
    for j in paired..l.count() {
        let at = l.positions(t, j);
        let g: Vec<f64> = at.iter().map(|&p| got[output][p]).collect();
        let norm2 = dot(&g, &g);
        let inside: f64 = theirs.iter().map(|w| dot(&g, w).powi(2)).sum();
        if (norm2 - 1.0).abs() > tol || (norm2 - inside).abs() > tol {
            return Err(format!(
                "output {output}, matrix {t}: free vector {j} has squared length {norm2}, {inside} of it in torch's span"
            ));
        }
        for (&p, &v) in at.iter().zip(&theirs[j - paired]) {
            got[output][p] = v;
        }
    }
    Ok(())
}

/// Flips the vectors of each sign group in `got` (f32 or f64 outputs) to
/// `expected`'s signs (see [`align`]).
pub fn align_outputs(
    groups: &[Vec<Member>],
    got: &mut [kiln_runtime::Tensor],
    expected: &[kiln_runtime::Tensor],
) -> Result<(), String> {
    use kiln_runtime::DType;
    if groups.is_empty() {
        return Ok(());
    }
    let f64s = |t: &kiln_runtime::Tensor| kiln_runtime::elements_f64(&t.view());
    let shapes: Vec<Vec<usize>> = got.iter().map(|t| t.shape.clone()).collect();
    let mut values: Vec<Vec<f64>> = got.iter().map(f64s).collect();
    let want: Vec<Vec<f64>> = expected.iter().map(f64s).collect();
    for group in groups {
        let dtype = group.first().and_then(|m| got.get(m.output)).map(|t| t.dtype);
        let tol = match dtype {
            Some(DType::F64 | DType::C128) => 1e-9,
            _ => 1e-4,
        };
        if matches!(dtype, Some(DType::C64 | DType::C128)) {
            align_complex(group, &mut values, &shapes, &want, tol)?;
        } else {
            align(group, &mut values, &shapes, &want, tol)?;
        }
    }
    for (t, v) in got.iter_mut().zip(values) {
        t.data = match t.dtype {
            DType::F32 | DType::C64 => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
            DType::F64 | DType::C128 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
            _ => continue,
        };
    }
    Ok(())
}

/// A conformance case's `signs` entry (written by generate.py for SVDs and
/// eigenvectors): groups of `{output, dim}`.
pub fn sign_groups(case: &serde_json::Value) -> Vec<Vec<Member>> {
    let member = |m: &serde_json::Value| {
        Some(Member { output: m.get("output")?.as_u64()? as usize, dim: m.get("dim")?.as_i64()? as isize })
    };
    let groups = case.get("signs").and_then(serde_json::Value::as_array);
    groups.into_iter().flatten().filter_map(|g| g.as_array().map(|ms| ms.iter().filter_map(member).collect())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complex_vectors_take_torchs_phase() {
        // One 2x2 matrix of eigenvectors (columns); kiln's column 0 is
        // torch's times i, column 1 torch's times -1.
        let want = vec![0.6, 0.0, 0.0, 0.8, 0.0, 0.8, 0.6, 0.0];
        let got = vec![0.0, 0.6, 0.0, -0.8, -0.8, 0.0, -0.6, 0.0];
        let mut values = vec![got];
        align_complex(&[Member { output: 0, dim: -1 }], &mut values, &[vec![2, 2]], std::slice::from_ref(&want), 1e-9)
            .unwrap();
        for (g, w) in values[0].iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{:?}", values[0]);
        }
    }

    #[test]
    fn pairs_flip_together_and_free_vectors_are_checked_by_span() {
        // U [3, 3] (full, columns) and Vh [2, 2] (rows): 2 pairs, 1 free column.
        let u_want = vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        let vh_want = vec![0.6, 0.8, -0.8, 0.6];
        // kiln flipped pair 1 and its free column.
        let u_got = vec![1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, -1.0];
        let vh_got = vec![0.6, 0.8, 0.8, -0.6];
        let group = [Member { output: 0, dim: -1 }, Member { output: 2, dim: -2 }];
        let shapes = vec![vec![3, 3], vec![2], vec![2, 2]];
        let want = vec![u_want.clone(), vec![2.0, 1.0], vh_want.clone()];
        let mut got = vec![u_got, vec![2.0, 1.0], vh_got];
        align(&group, &mut got, &shapes, &want, 1e-9).unwrap();
        assert_eq!(got[0], u_want);
        assert_eq!(got[2], vh_want);
        // A free column outside torch's span is an error.
        let mut bad = vec![vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0], vec![2.0, 1.0], vh_want.clone()];
        assert!(align(&group, &mut bad, &shapes, &want, 1e-9).is_err());
        // A pair flipped in one output only stays a mismatch for the comparison.
        let mut half = vec![u_want.clone(), vec![2.0, 1.0], vec![0.6, 0.8, 0.8, -0.6]];
        align(&group, &mut half, &shapes, &want, 1e-9).unwrap();
        assert_ne!(half[2], vh_want);
    }
}
