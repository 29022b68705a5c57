//! Reading `.pt2` files written by `torch.export.save` (torch 2.9 – 2.15
//! archives; older containers are recognised and refused with a clear message).
//!
//! This module knows the file format only; turning the program into kiln IR
//! is [`crate::import`]'s job. See `shared/notes/pt2-format.md` for the facts
//! this code relies on.

pub mod archive;
pub mod json;
pub mod program;
pub mod scalar_type;
pub mod sympy;
pub mod weights;

use archive::{Archive, ArchiveError};
use json::{JsonError, J};
use program::{Program, SCHEMA_MAJOR};
use std::collections::HashMap;
use std::path::Path;
use weights::TensorConfig;

pub const MODEL_JSON: &str = "models/model.json";
pub const WEIGHTS_DIR: &str = "data/weights/";
pub const CONSTANTS_DIR: &str = "data/constants/";
const WEIGHTS_CONFIG: &str = "data/weights/model_weights_config.json";
const CONSTANTS_CONFIG: &str = "data/constants/model_constants_config.json";

#[derive(Debug, thiserror::Error)]
pub enum Pt2Error {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error(
        "unsupported program schema version {major}.{minor} (kiln reads {SCHEMA_MAJOR}.x, written by torch 2.9 – 2.15)"
    )]
    SchemaVersion { major: u32, minor: u32 },
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

    pub fn from_archive(archive: Archive) -> Result<Pt2File, Pt2Error> {
        let format = archive.text("archive_format")?.trim();
        if format != "pt2" {
            return Err(ArchiveError::Unsupported(format!("archive_format is {format:?}, expected \"pt2\"")).into());
        }
        if let Some(order) = archive.bytes("byteorder") {
            let order = String::from_utf8_lossy(order).trim().to_string();
            if order != "little" {
                return Err(Pt2Error::ByteOrder(order));
            }
        }
        let program = {
            let name = archive.full_name(MODEL_JSON);
            let text = archive.text(MODEL_JSON).map_err(|e| match e {
                ArchiveError::Member { member, .. } if !archive.contains(MODEL_JSON) => ArchiveError::Unsupported(
                    format!("`{member}` is missing (multi-model or AOTInductor packages are not supported)"),
                ),
                other => other,
            })?;
            let value = json::parse(text, &name)?;
            let root = J::root(&value, &name);
            // Check the version before the shape of the rest: a future schema
            // should say "version", not "missing field".
            let version = root.with_opt("schema_version", |j| {
                Ok((j.with("major", |m| m.i64())?, j.with_opt("minor", |m| m.i64())?))
            })?;
            if let Some((major, minor)) = version {
                if major != SCHEMA_MAJOR as i64 {
                    return Err(Pt2Error::SchemaVersion {
                        major: u32::try_from(major).unwrap_or(u32::MAX),
                        minor: minor.and_then(|m| u32::try_from(m).ok()).unwrap_or(0),
                    });
                }
            }
            Program::parse(root)?
        };
        let weights = load_config(&archive, WEIGHTS_CONFIG)?;
        let constants = load_config(&archive, CONSTANTS_CONFIG)?;
        Ok(Pt2File { archive, program, weights, constants })
    }
}

fn load_config(archive: &Archive, member: &str) -> Result<HashMap<String, TensorConfig>, Pt2Error> {
    if !archive.contains(member) {
        return Ok(HashMap::new());
    }
    let name = archive.full_name(member);
    let value = json::parse(archive.text(member)?, &name)?;
    Ok(weights::parse_config(J::root(&value, &name))?)
}
