//! Sharding annotations for SPMD modules: Shardy (`sdy.mesh`, `sdy.sharding`,
//! `sdy.sharding_constraint`; the default) or GSPMD strings (`mhlo.sharding`;
//! the fallback), never both in one module (GSPMD attributes switch Shardy
//! off). Both forms were checked on the XLA CPU plugin (see
//! `../shared/notes/sharding-pjrt.md`).

use kiln_ir::{Mesh, Sharding};
use kiln_passes::shard::Reshard;
use kiln_runtime::format::{MeshAxisDecl, MeshDecl, TensorSharding};

/// How a sharded module is annotated.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ShardingDialect {
    #[default]
    Shardy,
    Gspmd,
}

impl ShardingDialect {
    pub fn from_name(name: &str) -> Option<ShardingDialect> {
        match name {
            "shardy" | "sdy" => Some(ShardingDialect::Shardy),
            "gspmd" | "mhlo" => Some(ShardingDialect::Gspmd),
            _ => None,
        }
    }
}

/// What the emitter needs to annotate an SPMD segment.
#[derive(Clone, Debug)]
pub struct SpmdEmit {
    pub mesh: Mesh,
    pub dialect: ShardingDialect,
    /// Propagation's reshardings: each becomes a constraint on that use.
    pub reshards: Vec<Reshard>,
}

/// The `sdy.mesh` symbol every Shardy annotation names.
pub const MESH_SYMBOL: &str = "mesh";

/// `#sdy.mesh<["data"=2, "model"=2]>`.
pub fn shardy_mesh(mesh: &Mesh) -> String {
    let axes: Vec<String> = mesh.axes.iter().map(|a| format!("\"{}\"={}", a.name, a.size)).collect();
    format!("#sdy.mesh<[{}]>", axes.join(", "))
}

/// `#sdy.sharding<@mesh, [{"data"}, {}]>` (partial sums are not annotated:
/// XLA resolves them where the value is used).
pub fn shardy_sharding(s: &Sharding) -> String {
    let dims: Vec<String> = s
        .dims
        .iter()
        .map(|axes| {
            let names: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
            format!("{{{}}}", names.join(", "))
        })
        .collect();
    format!("#sdy.sharding<@{MESH_SYMBOL}, [{}]>", dims.join(", "))
}

/// The GSPMD tile string: `{replicated}`, or `{devices=[t0,..,tn(,r)]ids
/// (last_tile_dim_replicate)}` where `t_d` is the number of pieces of dim
/// `d`, `r` the devices holding the same piece, and `ids` the partitions in
/// row-major order of that tile array.
pub fn gspmd_sharding(mesh: &Mesh, s: &Sharding) -> String {
    if s.dims.iter().all(Vec::is_empty) {
        return "{replicated}".to_string();
    }
    let size_of = |name: &str| mesh.axis(name).map_or(1, |a| a.size as usize);
    let tiles: Vec<usize> = s.dims.iter().map(|axes| axes.iter().map(|a| size_of(a)).product()).collect();
    let unused: Vec<&str> =
        mesh.axes.iter().map(|a| a.name.as_str()).filter(|a| !s.dims.iter().flatten().any(|b| b == a)).collect();
    let replicas: usize = unused.iter().map(|a| size_of(a)).product();
    let n = mesh.size() as usize;
    let mut ids = vec![0usize; n];
    for p in 0..n {
        // Mesh coordinates of partition p (row-major over the axes).
        let mut coord = std::collections::HashMap::new();
        let mut rest = p;
        for a in mesh.axes.iter().rev() {
            coord.insert(a.name.as_str(), rest % a.size.max(1) as usize);
            rest /= a.size.max(1) as usize;
        }
        let radix = |axes: &mut dyn Iterator<Item = &str>| {
            axes.fold(0, |i, a| i * size_of(a) + coord.get(a).copied().unwrap_or(0))
        };
        let mut flat = 0;
        for axes in &s.dims {
            let tile: usize = axes.iter().map(|a| size_of(a)).product();
            flat = flat * tile + radix(&mut axes.iter().map(String::as_str));
        }
        flat = flat * replicas + radix(&mut unused.iter().copied());
        ids[flat] = p;
    }
    let mut shape: Vec<String> = tiles.iter().map(usize::to_string).collect();
    if replicas > 1 {
        shape.push(replicas.to_string());
    }
    let ids: Vec<String> = ids.iter().map(usize::to_string).collect();
    let tail = if replicas > 1 { " last_tile_dim_replicate" } else { "" };
    format!("{{devices=[{}]{}{tail}}}", shape.join(","), ids.join(","))
}

/// The runtime's form of the mesh.
pub fn mesh_decl(mesh: &Mesh) -> MeshDecl {
    MeshDecl {
        axes: mesh.axes.iter().map(|a| MeshAxisDecl { name: a.name.clone(), size: a.size }).collect(),
        devices: mesh.devices.clone(),
    }
}

/// The runtime's form of a sharding: axis indices per dim.
pub fn tensor_sharding(mesh: &Mesh, s: &Sharding) -> TensorSharding {
    let index = |name: &String| mesh.axes.iter().position(|a| &a.name == name).unwrap_or(0) as u32;
    TensorSharding { dims: s.dims.iter().map(|axes| axes.iter().map(index).collect()).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gspmd_strings_match_the_checked_ones() {
        // The note's 2-D mesh example (E15), and the 1-D tensor-parallel MLP (E11).
        let mesh = Mesh::new(&[("data", 2), ("model", 2)]);
        let x = Sharding::split(2, 0, "data");
        assert_eq!(gspmd_sharding(&mesh, &x), "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}");
        let w1 = Sharding::split(2, 1, "model");
        assert_eq!(gspmd_sharding(&mesh, &w1), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}");
        let w2 = Sharding::split(2, 0, "model");
        assert_eq!(gspmd_sharding(&mesh, &w2), "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}");
        let one = Mesh::new(&[("x", 4)]);
        assert_eq!(gspmd_sharding(&one, &Sharding::split(2, 1, "x")), "{devices=[1,4]0,1,2,3}");
        assert_eq!(gspmd_sharding(&one, &Sharding::replicated(2)), "{replicated}");
        let both = Sharding { dims: vec![vec!["model".into(), "data".into()]], partial: vec![] };
        assert_eq!(gspmd_sharding(&mesh, &both), "{devices=[4]0,2,1,3}");
    }

    #[test]
    fn shardy_text() {
        let mesh = Mesh::new(&[("data", 2), ("model", 2)]);
        assert_eq!(shardy_mesh(&mesh), "#sdy.mesh<[\"data\"=2, \"model\"=2]>");
        let s = Sharding { dims: vec![vec!["data".into(), "model".into()], vec![]], partial: vec![] };
        assert_eq!(shardy_sharding(&s), "#sdy.sharding<@mesh, [{\"data\", \"model\"}, {}]>");
        assert_eq!(tensor_sharding(&mesh, &s).dims, [vec![0, 1], vec![]]);
    }
}
