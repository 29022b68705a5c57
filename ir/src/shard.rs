//! Device meshes and per-value shardings (Shardy's model: named mesh axes,
//! each tensor dimension split over a list of axes).
//!
//! A [`Mesh`] lives on the [`crate::Graph`]; a [`Sharding`] is a value
//! attribute ([`crate::ValueAttrs::sharding`]), so it survives every rewrite
//! like the value's origin. Axes are named, not numbered, so a sharding reads
//! the same in the text form, the emitted StableHLO and the report.

use std::fmt;

/// A named mesh axis and its size (number of devices along it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshAxis {
    pub name: String,
    pub size: u32,
}

/// A logical grid of devices: axes major to minor, and the device id at each
/// position of the grid in row-major order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub axes: Vec<MeshAxis>,
    /// Device ids by mesh position (row-major over `axes`); empty means the
    /// identity order `0..size` (whatever the runtime's client lists first).
    pub devices: Vec<u32>,
}

impl Mesh {
    /// A mesh with the identity device order.
    pub fn new(axes: &[(&str, u32)]) -> Mesh {
        Mesh { axes: axes.iter().map(|&(n, s)| MeshAxis { name: n.to_string(), size: s }).collect(), devices: vec![] }
    }

    /// Number of devices (the product of the axes' sizes).
    pub fn size(&self) -> u64 {
        self.axes.iter().map(|a| u64::from(a.size)).product()
    }

    pub fn axis(&self, name: &str) -> Option<&MeshAxis> {
        self.axes.iter().find(|a| a.name == name)
    }

    /// Problems with the mesh itself: no axes, an empty or repeated name, a
    /// zero size, a device list that is not `size` distinct ids.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.axes.is_empty() {
            out.push("the mesh has no axes".to_string());
        }
        for (i, a) in self.axes.iter().enumerate() {
            if !is_axis_name(&a.name) {
                out.push(format!("mesh axis {i}: `{}` is not a name ([A-Za-z_][A-Za-z0-9_]*)", a.name));
            }
            if a.size == 0 {
                out.push(format!("mesh axis `{}` has size 0", a.name));
            }
            if self.axes[..i].iter().any(|b| b.name == a.name) {
                out.push(format!("mesh axis `{}` is named twice", a.name));
            }
        }
        if !self.devices.is_empty() {
            if self.devices.len() as u64 != self.size() {
                out.push(format!("the mesh has {} devices but lists {}", self.size(), self.devices.len()));
            }
            let mut seen = self.devices.clone();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1]) {
                out.push("the mesh lists a device twice".to_string());
            }
        }
        out
    }
}

impl fmt::Display for Mesh {
    /// `data=2, model=2` (the CLI's `--mesh` spelling).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}={}", a.name, a.size)?;
        }
        Ok(())
    }
}

pub fn is_axis_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// How a tensor is laid out over the mesh: per dimension, the mesh axes it is
/// split over (major to minor; none: every device holds the whole dimension),
/// and the axes over which it is a partial sum (each device holds a summand;
/// the value is their sum). Axes named nowhere replicate the tensor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sharding {
    pub dims: Vec<Vec<String>>,
    pub partial: Vec<String>,
}

impl Sharding {
    /// Every dimension whole on every device.
    pub fn replicated(rank: usize) -> Sharding {
        Sharding { dims: vec![vec![]; rank], partial: vec![] }
    }

    /// Replicated except dimension `dim`, split over `axis`.
    pub fn split(rank: usize, dim: usize, axis: &str) -> Sharding {
        let mut s = Sharding::replicated(rank);
        if let Some(d) = s.dims.get_mut(dim) {
            d.push(axis.to_string());
        }
        s
    }

    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Vec::is_empty) && self.partial.is_empty()
    }

    /// Every axis this sharding names (dims, then partial).
    pub fn axes(&self) -> impl Iterator<Item = &str> {
        self.dims.iter().flatten().chain(&self.partial).map(String::as_str)
    }

    /// Number of pieces dimension `dim` is split into on `mesh`.
    pub fn pieces(&self, mesh: &Mesh, dim: usize) -> u64 {
        self.dims
            .get(dim)
            .map_or(1, |axes| axes.iter().map(|a| mesh.axis(a).map_or(1, |x| u64::from(x.size))).product())
    }

    /// The same without its partial-sum axes (what a reduction of the
    /// summands leaves).
    pub fn without_partial(&self) -> Sharding {
        Sharding { dims: self.dims.clone(), partial: vec![] }
    }

    /// Problems with this sharding of a `shape` (`None`: a dynamic dim) on
    /// `mesh`: wrong rank, an unknown or repeated axis, a dim the axes do not
    /// divide.
    pub fn problems(&self, mesh: &Mesh, shape: &[Option<i64>]) -> Vec<String> {
        let mut out = Vec::new();
        if self.dims.len() != shape.len() {
            out.push(format!("sharding {self} has {} dims but the value has rank {}", self.dims.len(), shape.len()));
        }
        let mut seen: Vec<&str> = Vec::new();
        for a in self.axes() {
            if mesh.axis(a).is_none() {
                out.push(format!("sharding {self} names axis `{a}`, which the mesh ({mesh}) lacks"));
            }
            if seen.contains(&a) {
                out.push(format!("sharding {self} uses axis `{a}` twice"));
            }
            seen.push(a);
        }
        for (d, size) in shape.iter().enumerate().take(self.dims.len()) {
            let pieces = self.pieces(mesh, d);
            match size {
                Some(n) if pieces > 1 && !(*n as u64).is_multiple_of(pieces) => out.push(format!(
                    "sharding {self} splits dim {d} (size {n}) into {pieces} pieces, which do not divide it"
                )),
                None if pieces > 1 => out.push(format!("sharding {self} splits dim {d}, which is dynamic")),
                _ => {}
            }
        }
        out
    }
}

impl fmt::Display for Sharding {
    /// `[{data}, {}]`, with `sum{model}` after it for partial sums: the text
    /// form's spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, axes) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{{{}}}", axes.join(", "))?;
        }
        f.write_str("]")?;
        if !self.partial.is_empty() {
            write!(f, " sum{{{}}}", self.partial.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_what_is_wrong() {
        let mesh = Mesh::new(&[("data", 2), ("model", 2)]);
        assert!(mesh.problems().is_empty());
        let s = Sharding { dims: vec![vec!["data".into()], vec!["data".into(), "x".into()]], partial: vec![] };
        let p = s.problems(&mesh, &[Some(3), Some(8)]);
        assert_eq!(
            p,
            [
                "sharding [{data}, {data, x}] uses axis `data` twice",
                "sharding [{data}, {data, x}] names axis `x`, which the mesh (data=2, model=2) lacks",
                "sharding [{data}, {data, x}] splits dim 0 (size 3) into 2 pieces, which do not divide it",
            ]
        );
        let bad = Mesh { axes: Mesh::new(&[("a", 2), ("a", 0)]).axes, devices: vec![0, 0] };
        assert_eq!(bad.problems().len(), 4);
    }
}
