//! The pickled state dicts of torch 2.5 – 2.8 (`serialized_state_dict.pt`,
//! `data/weights/model.pt`, …) as the [`TensorConfig`]s that torch ≥ 2.9's
//! JSON configs give, so that [`super::weights::load`] reads both the same way.
//!
//! Each such member is a `torch.save` zip stored inside the archive: a
//! `data.pkl` describing the tensors and one `data/<key>` member per storage.
//! Every storage used is registered in the [`Archive`] as
//! `{folder}pickled_<key>`, a range of the same memory map (no copy), after
//! its length has been checked against what the pickle says.

use super::archive::{Archive, ArchiveError};
use super::pickle::{self, PickledTensor, StorageRef};
use super::program::{SymExpr, TensorMeta};
use super::weights::TensorConfig;
use super::{check_byte_order, Pt2Error};
use std::collections::HashMap;
use std::ops::Range;

/// The nested zip's members, with the folder `torch.save` put them under.
struct Nested {
    /// The outer member's full name, for errors.
    member: String,
    /// `archive/` (or the saved file's stem), with the slash.
    prefix: String,
    members: Vec<(String, Range<usize>)>,
}

impl Nested {
    fn open(archive: &Archive, member: &str) -> Result<Nested, ArchiveError> {
        let members = archive.nested_members(member)?;
        let member = archive.full_name(member);
        // torch.save puts everything under one folder.
        let pickle = members.iter().find(|(n, _)| n.ends_with("data.pkl") && n.matches('/').count() <= 1);
        let Some((name, _)) = pickle else {
            return Err(ArchiveError::Member { member, detail: "no data.pkl in the nested torch.save zip".into() });
        };
        let prefix = name[..name.len() - "data.pkl".len()].to_string();
        Ok(Nested { member, prefix, members })
    }

    fn find(&self, name: &str) -> Option<Range<usize>> {
        let full = format!("{}{name}", self.prefix);
        self.members.iter().find(|(n, _)| *n == full).map(|(_, r)| r.clone())
    }

    fn malformed(&self, detail: String) -> ArchiveError {
        ArchiveError::Member { member: self.member.clone(), detail }
    }
}

/// Reads the state dict pickled in `member` (none if absent) and registers
/// its storages under `folder` (`data/weights/` or `data/constants/`).
pub fn load(archive: &mut Archive, member: &str, folder: &str) -> Result<HashMap<String, TensorConfig>, Pt2Error> {
    if !archive.contains(member) {
        return Ok(HashMap::new());
    }
    let nested = Nested::open(archive, member)?;
    if let Some(order) = nested.find("byteorder") {
        check_byte_order(&archive.map()[order])?;
    }
    let pickle_range = nested.find("data.pkl").ok_or_else(|| nested.malformed("data.pkl vanished".into()))?;
    let tensors = pickle::read_state_dict(&archive.map()[pickle_range]).map_err(|source| Pt2Error::Pickle {
        member: format!("{}/{}data.pkl", nested.member, nested.prefix),
        source,
    })?;
    let mut registered: HashMap<String, StorageRef> = HashMap::new();
    let mut configs = HashMap::with_capacity(tensors.len());
    for (fqn, tensor) in tensors {
        let storage = &tensor.storage;
        match registered.get(&storage.key) {
            Some(seen) if seen != storage => {
                let detail = format!("`{fqn}`: storage `{}` is described two different ways", storage.key);
                return Err(nested.malformed(detail).into());
            }
            Some(_) => {}
            None => {
                let range = storage_range(&nested, &fqn, storage)?;
                archive.add_member(format!("{folder}{}", path_name(storage)), range)?;
                registered.insert(storage.key.clone(), storage.clone());
            }
        }
        // An empty storage file means zeros in a 2.9+ config; here it may
        // only back empty tensors.
        if storage.numel == 0 && !tensor.sizes.contains(&0) {
            return Err(nested.malformed(format!("`{fqn}`: a non-empty view of an empty storage")).into());
        }
        let config = config_of(&tensor, format!("{}: `{fqn}`", nested.member));
        configs.insert(fqn, config);
    }
    Ok(configs)
}

/// The storage's member, whose length must be exactly what the pickle says.
fn storage_range(nested: &Nested, fqn: &str, storage: &StorageRef) -> Result<Range<usize>, ArchiveError> {
    let data = format!("data/{}", storage.key);
    let range = nested
        .find(&data)
        .ok_or_else(|| nested.malformed(format!("`{fqn}`: storage member `{}{data}` is missing", nested.prefix)))?;
    let element = storage.class.element_bytes();
    if storage.numel.checked_mul(element) != Some(range.len() as u64) {
        return Err(nested.malformed(format!(
            "`{fqn}`: storage `{}{data}` holds {} bytes, but the pickle says {} elements of {element} bytes",
            nested.prefix,
            range.len(),
            storage.numel,
        )));
    }
    Ok(range)
}

fn path_name(storage: &StorageRef) -> String {
    format!("pickled_{}", storage.key)
}

fn config_of(tensor: &PickledTensor, path: String) -> TensorConfig {
    let ints = |xs: &[i64]| xs.iter().map(|&x| SymExpr::Int(x)).collect();
    let meta = TensorMeta {
        dtype: tensor.storage.class.scalar_type(),
        sizes: ints(&tensor.sizes),
        strides: ints(&tensor.strides),
        storage_offset: SymExpr::Int(tensor.storage_offset),
        path,
    };
    TensorConfig { path_name: path_name(&tensor.storage), use_pickle: false, meta }
}
