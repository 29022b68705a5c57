//! The check for index outputs whose order among tied values torch leaves
//! to its C++ library (topk). Plain slices, no crate types, so that the
//! StableHLO conformance test (in the compiler crate) includes this file too.

/// `indices` (shape `shape`) must select `values` from `input` (shape
/// `in_shape`) along `dim` — exactly, NaN selecting NaN — and no row along
/// `dim` may repeat an index. 0-d tensors count as `[1]`; indices one rank
/// below the input have `dim` dropped (one index per row).
pub fn check(
    indices: &[f64],
    shape: &[usize],
    input: &[f64],
    in_shape: &[usize],
    values: &[f64],
    dim: usize,
) -> Result<(), String> {
    let one = [1usize];
    let in_shape = if in_shape.is_empty() { &one[..] } else { in_shape };
    // One index per row with `dim` dropped (kthvalue/median, keepdim=False):
    // the same check with `dim` kept at size 1.
    let kept: Vec<usize>;
    let shape = if shape.len() + 1 == in_shape.len() && dim <= shape.len() {
        kept = [&shape[..dim], &[1][..], &shape[dim..]].concat();
        &kept[..]
    } else if shape.is_empty() {
        &one[..]
    } else {
        shape
    };
    if dim >= shape.len() || in_shape.len() != shape.len() || indices.len() != values.len() {
        return Err(format!("dim {dim} does not fit indices {shape:?} over input {in_shape:?}"));
    }
    let (outer, k, inner) =
        (shape[..dim].iter().product::<usize>(), shape[dim], shape[dim + 1..].iter().product::<usize>());
    let n = in_shape[dim];
    for o in 0..outer {
        for i in 0..inner {
            let mut seen = std::collections::BTreeSet::new();
            for j in 0..k {
                let at = (o * k + j) * inner + i;
                let picked = indices[at];
                if picked < 0.0 || picked >= n as f64 || !seen.insert(picked as usize) {
                    return Err(format!("element {at}: index {picked} is out of range or repeated in its row"));
                }
                let got = input[(o * n + picked as usize) * inner + i];
                if !(got == values[at] || (got.is_nan() && values[at].is_nan())) {
                    return Err(format!("element {at}: index {picked} selects {got}, torch's value is {}", values[at]));
                }
            }
        }
    }
    Ok(())
}
