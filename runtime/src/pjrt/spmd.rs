//! The host side of an SPMD segment: which piece of each argument and result
//! a partition holds, splitting arena tensors into pieces and assembling
//! results from them. PJRT 0.81 cannot report the shardings an executable
//! chose, so the ones recorded in the artifact (and annotated on every
//! `@main` argument and result) are the contract.

use crate::format::{DimRef, MeshDecl, TensorDecl, TensorSharding};
use crate::{Error, Result};

/// Where partition `p`'s piece of one tensor lies: the whole tensor's shape,
/// the piece's shape, and each partition's starting index per dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PieceLayout {
    pub full: Vec<usize>,
    pub local: Vec<usize>,
    pub starts: Vec<Vec<usize>>,
    pub elem: usize,
    /// Every partition holds the whole tensor.
    pub whole: bool,
    /// For results: the partitions whose piece no earlier partition holds
    /// (the ones assembly reads).
    pub owners: Vec<usize>,
}

/// Partition `p`'s coordinate along each mesh axis (row-major positions).
fn coords(mesh: &MeshDecl, p: usize) -> Vec<usize> {
    let mut rest = p;
    let mut out = vec![0; mesh.axes.len()];
    for (a, axis) in mesh.axes.iter().enumerate().rev() {
        let size = axis.size.max(1) as usize;
        out[a] = rest % size;
        rest /= size;
    }
    out
}

impl PieceLayout {
    /// The layout of `decl` (static shape: validated) sharded as `sharding`.
    pub(crate) fn new(mesh: &MeshDecl, decl: &TensorDecl, sharding: &TensorSharding) -> Result<PieceLayout> {
        let full: Vec<usize> = decl
            .shape
            .iter()
            .map(|d| match d {
                DimRef::Static(v) => Ok(*v as usize),
                _ => Err(Error::Plan("a sharded tensor has a dynamic shape".into())),
            })
            .collect::<Result<_>>()?;
        let partitions = mesh.size() as usize;
        let size_of = |a: u32| mesh.axes.get(a as usize).map_or(1, |x| x.size.max(1) as usize);
        let mut local = full.clone();
        for (d, axes) in sharding.dims.iter().enumerate() {
            let pieces: usize = axes.iter().map(|&a| size_of(a)).product();
            if let Some(l) = local.get_mut(d) {
                *l /= pieces.max(1);
            }
        }
        let mut starts = Vec::with_capacity(partitions);
        for p in 0..partitions {
            let c = coords(mesh, p);
            let mut start = vec![0; full.len()];
            for (d, axes) in sharding.dims.iter().enumerate() {
                // Axes major to minor: the piece index is mixed-radix.
                let index = axes.iter().fold(0, |i, &a| i * size_of(a) + c.get(a as usize).copied().unwrap_or(0));
                if let (Some(s), Some(l)) = (start.get_mut(d), local.get(d)) {
                    *s = index * l;
                }
            }
            starts.push(start);
        }
        let owners = (0..partitions).filter(|&p| !starts[..p].contains(&starts[p])).collect();
        Ok(PieceLayout { whole: local == full, full, local, starts, elem: decl.dtype.size_bytes(), owners })
    }

    /// Bytes of one piece.
    pub(crate) fn piece_bytes(&self) -> usize {
        self.local.iter().product::<usize>() * self.elem
    }

    /// Calls `f(whole offset, piece offset, bytes)` for each contiguous run
    /// (a row of the innermost dim) of partition `p`'s piece.
    fn runs(&self, p: usize, mut f: impl FnMut(usize, usize, usize)) {
        let rank = self.full.len();
        if rank == 0 {
            f(0, 0, self.elem);
            return;
        }
        if self.local.contains(&0) {
            return;
        }
        let start = &self.starts[p];
        let mut stride = vec![self.elem; rank];
        for d in (0..rank - 1).rev() {
            stride[d] = stride[d + 1] * self.full[d + 1];
        }
        let row = self.local[rank - 1] * self.elem;
        let mut index = vec![0usize; rank - 1];
        let mut local_offset = 0;
        loop {
            let whole: usize =
                (0..rank - 1).map(|d| (start[d] + index[d]) * stride[d]).sum::<usize>() + start[rank - 1] * self.elem;
            f(whole, local_offset, row);
            local_offset += row;
            // Odometer over the outer dims.
            let mut d = rank - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < self.local[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }

    /// Copies partition `p`'s piece of `whole` into `piece`.
    pub(crate) fn split(&self, p: usize, whole: &[u8], piece: &mut [u8]) {
        self.runs(p, |w, l, n| piece[l..l + n].copy_from_slice(&whole[w..w + n]));
    }

    /// Copies `piece` into partition `p`'s place in `whole`.
    pub(crate) fn place(&self, p: usize, piece: &[u8], whole: &mut [u8]) {
        self.runs(p, |w, l, n| whole[w..w + n].copy_from_slice(&piece[l..l + n]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{MeshAxisDecl, Storage};
    use crate::DType;

    fn decl(shape: &[u64]) -> TensorDecl {
        TensorDecl {
            dtype: DType::U8,
            shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
            storage: Storage::Arena { offset: 0, max_bytes: 0 },
        }
    }

    fn mesh(axes: &[u32]) -> MeshDecl {
        MeshDecl {
            axes: axes.iter().enumerate().map(|(i, &size)| MeshAxisDecl { name: format!("a{i}"), size }).collect(),
            devices: vec![],
        }
    }

    #[test]
    fn pieces_split_and_assemble_back() {
        // A 4×6 tensor on a 2×3 mesh: dim 0 over axis 0, dim 1 over axis 1.
        let m = mesh(&[2, 3]);
        let layout = PieceLayout::new(&m, &decl(&[4, 6]), &TensorSharding { dims: vec![vec![0], vec![1]] })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(layout.local, [2, 2]);
        assert_eq!(layout.starts[4], [2, 2]); // coords (1, 1)
        let whole: Vec<u8> = (0..24).collect();
        let mut piece = vec![0u8; layout.piece_bytes()];
        layout.split(4, &whole, &mut piece);
        assert_eq!(piece, [14, 15, 20, 21]);
        let mut back = vec![0u8; 24];
        for &p in &layout.owners {
            layout.split(p, &whole, &mut piece);
            layout.place(p, &piece, &mut back);
        }
        assert_eq!(back, whole);
    }

    #[test]
    fn two_axes_on_one_dim_are_mixed_radix_and_replicas_share_a_piece() {
        let m = mesh(&[2, 2]);
        // Dim 0 over (axis 1, axis 0): partition (c0, c1) takes piece c1 * 2 + c0.
        let layout = PieceLayout::new(&m, &decl(&[4]), &TensorSharding { dims: vec![vec![1, 0]] })
            .unwrap_or_else(|e| panic!("{e}"));
        let starts: Vec<usize> = layout.starts.iter().map(|s| s[0]).collect();
        assert_eq!(starts, [0, 2, 1, 3]);
        let replicated = PieceLayout::new(&m, &decl(&[4, 2]), &TensorSharding { dims: vec![vec![], vec![0]] })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(replicated.owners, [0, 2]);
        assert!(!replicated.whole);
    }
}
