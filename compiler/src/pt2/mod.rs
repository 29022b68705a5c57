//! Reading `.pt2` files written by `torch.export.save`, torch 2.5 – 2.15:
//! the three container generations of [`archive::Layout`]. Weights pickled by
//! torch ≤ 2.8 are read by [`pickle`] (which executes nothing) and turned by
//! [`state_dict`] into the same [`TensorConfig`]s the 2.9+ JSON configs give,
//! so loading is one code path.
//!
//! This module knows the file format only; turning the program into kiln IR
//! is [`crate::import`]'s job. See `shared/notes/pt2-format.md` for the facts
//! this code relies on.

pub mod archive;
pub mod json;
pub mod pickle;
pub mod program;
pub mod scalar_type;
pub mod state_dict;
pub mod sympy;
pub mod weights;

use archive::{Archive, ArchiveError, Layout};
use json::{JsonError, J};
use pickle::PickleError;
use program::{Program, OLDEST_SCHEMA_MAJOR, SCHEMA_MAJOR};
use std::collections::HashMap;
use std::path::Path;
use weights::TensorConfig;

pub const MODEL_JSON: &str = "models/model.json";
pub const WEIGHTS_DIR: &str = "data/weights/";
pub const CONSTANTS_DIR: &str = "data/constants/";
const WEIGHTS_CONFIG: &str = "data/weights/model_weights_config.json";
const CONSTANTS_CONFIG: &str = "data/constants/model_constants_config.json";
/// torch 2.8's pickled weights and constants.
const PICKLED_WEIGHTS: &str = "data/weights/model.pt";
const PICKLED_CONSTANTS: &str = "data/constants/model.pt";
/// torch ≤ 2.7's members.
const LEGACY_PROGRAM: &str = "serialized_exported_program.json";
const LEGACY_STATE_DICT: &str = "serialized_state_dict.pt";
const LEGACY_CONSTANTS: &str = "serialized_constants.pt";

#[derive(Debug, thiserror::Error)]
pub enum Pt2Error {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error(
        "unsupported program schema version {major}.{minor} (kiln reads {OLDEST_SCHEMA_MAJOR}.x – {SCHEMA_MAJOR}.x, written by torch 2.5 – 2.15)"
    )]
    SchemaVersion { major: u32, minor: u32 },
    #[error("{member}: {source}")]
    Pickle { member: String, source: PickleError },
    #[error("unsupported byte order {0:?} (only little-endian archives are supported)")]
    ByteOrder(String),
}

/// An opened `.pt2`: the archive, its program and its storage configs.
#[derive(Debug)]
pub struct Pt2File {
    pub archive: Archive,
    pub program: Program,
    pub weights: HashMap<String, TensorConfig>,
    pub constants: HashMap<String, TensorConfig>,
}

impl Pt2File {
    pub fn open(path: &Path) -> Result<Pt2File, Pt2Error> {
        let archive = Archive::open(path)?;
        Pt2File::from_archive(archive)
    }

    /// Opens a `.pt2` held in memory (see [`Archive::from_bytes`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Pt2File, Pt2Error> {
        Pt2File::from_archive(Archive::from_bytes(bytes)?)
    }

    pub fn from_archive(mut archive: Archive) -> Result<Pt2File, Pt2Error> {
        let layout = archive.layout();
        if layout != Layout::Legacy {
            let format = archive.text("archive_format")?.trim();
            if format != "pt2" {
                return Err(ArchiveError::Unsupported(format!("archive_format is {format:?}, expected \"pt2\"")).into());
            }
        }
        if let Some(order) = archive.bytes("byteorder") {
            check_byte_order(order)?;
        }
        let program_member = if layout == Layout::Legacy { LEGACY_PROGRAM } else { MODEL_JSON };
        let program = read_program(&archive, program_member)?;
        let (weights, constants) = match layout {
            Layout::Archive => (load_config(&archive, WEIGHTS_CONFIG)?, load_config(&archive, CONSTANTS_CONFIG)?),
            Layout::PickledArchive => (
                state_dict::load(&mut archive, PICKLED_WEIGHTS, WEIGHTS_DIR)?,
                state_dict::load(&mut archive, PICKLED_CONSTANTS, CONSTANTS_DIR)?,
            ),
            Layout::Legacy => (
                state_dict::load(&mut archive, LEGACY_STATE_DICT, WEIGHTS_DIR)?,
                state_dict::load(&mut archive, LEGACY_CONSTANTS, CONSTANTS_DIR)?,
            ),
        };
        Ok(Pt2File { archive, program, weights, constants })
    }
}

pub(crate) fn check_byte_order(order: &[u8]) -> Result<(), Pt2Error> {
    let order = String::from_utf8_lossy(order).trim().to_string();
    if order != "little" {
        return Err(Pt2Error::ByteOrder(order));
    }
    Ok(())
}

fn read_program(archive: &Archive, member: &str) -> Result<Program, Pt2Error> {
    let name = archive.full_name(member);
    let missing = !archive.contains(member);
    let text = archive.text(member).map_err(|e| match e {
        ArchiveError::Member { member: full, .. } if missing && member == MODEL_JSON => ArchiveError::Unsupported(
            format!("`{full}` is missing (multi-model or AOTInductor packages are not supported)"),
        ),
        other => other,
    })?;
    let value = json::parse(text, &name)?;
    let root = J::root(&value, &name);
    // Check the version before the shape of the rest: a future schema
    // should say "version", not "missing field".
    let version =
        root.with_opt("schema_version", |j| Ok((j.with("major", |m| m.i64())?, j.with_opt("minor", |m| m.i64())?)))?;
    if let Some((major, minor)) = version {
        if !(OLDEST_SCHEMA_MAJOR as i64..=SCHEMA_MAJOR as i64).contains(&major) {
            return Err(Pt2Error::SchemaVersion {
                major: u32::try_from(major).unwrap_or(u32::MAX),
                minor: minor.and_then(|m| u32::try_from(m).ok()).unwrap_or(0),
            });
        }
    }
    Ok(Program::parse(root)?)
}

fn load_config(archive: &Archive, member: &str) -> Result<HashMap<String, TensorConfig>, Pt2Error> {
    if !archive.contains(member) {
        return Ok(HashMap::new());
    }
    let name = archive.full_name(member);
    let value = json::parse(archive.text(member)?, &name)?;
    Ok(weights::parse_config(J::root(&value, &name))?)
}
