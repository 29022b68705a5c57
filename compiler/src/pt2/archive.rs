//! The zip container of a `.pt2` file.
//!
//! The file is memory-mapped once; members are byte ranges inside that map, so
//! weights are never copied. Only the central directory is trusted for sizes and
//! offsets (torch writes zeros in the local headers), and every member must be
//! stored uncompressed — that is what lets a weight be a slice of the map.
//!
//! Three container generations exist (see [`Layout`]). The two older ones
//! keep their weights in nested `torch.save` zips, themselves stored
//! uncompressed, so [`Archive::nested_members`] reads their directory in place
//! and reports ranges of the same outer map: still no copy.

use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Cursor;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a container could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("not a readable zip archive: {0}")]
    Zip(String),
    #[error("zip member `{member}`: {detail}")]
    Member { member: String, detail: String },
    #[error("unsupported container: {0}")]
    Unsupported(String),
}

/// Which torch release wrote the container, as far as its layout tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// torch ≤ 2.7: `serialized_exported_program.json` and pickled
    /// `serialized_state_dict.pt` / `serialized_constants.pt` at the root.
    Legacy,
    /// torch 2.8: the PT2 archive with pickled `data/weights/model.pt` and
    /// `data/constants/model.pt`.
    PickledArchive,
    /// torch ≥ 2.9: the PT2 archive with one raw file per storage and JSON configs.
    Archive,
}

/// An opened `.pt2` archive.
pub struct Archive {
    map: Arc<Mmap>,
    /// Folder every member lives under (`model/` for `model.pt2`), with the slash.
    root: String,
    layout: Layout,
    /// Member name (without `root`) → payload range inside `map`.
    members: BTreeMap<String, Range<usize>>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive").field("root", &self.root).field("members", &self.members.len()).finish()
    }
}

impl Archive {
    pub fn open(path: &Path) -> Result<Archive, ArchiveError> {
        let io = |source| ArchiveError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; like every
        // mmap-based loader we assume the file is not truncated underneath us.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Archive::from_map(Arc::new(map))
    }

    /// Reads the central directory of an already-mapped file.
    pub fn from_map(map: Arc<Mmap>) -> Result<Archive, ArchiveError> {
        let all = read_directory(&map, 0)?;
        let (root, layout) = find_root(&all)?;
        let members = all
            .into_iter()
            .filter_map(|(name, range)| name.strip_prefix(root.as_str()).map(|n| (n.to_string(), range)))
            .collect();
        Ok(Archive { map, root, layout, members })
    }

    /// Reads an archive held in memory (copied into an anonymous map, so that
    /// weights can still be shared slices of it). For tests and fuzzing.
    pub fn from_bytes(bytes: &[u8]) -> Result<Archive, ArchiveError> {
        if bytes.is_empty() {
            return Err(ArchiveError::Zip("empty file".into()));
        }
        let io = |source| ArchiveError::Io { path: PathBuf::from("<memory>"), source };
        let mut map = memmap2::MmapMut::map_anon(bytes.len()).map_err(io)?;
        map.copy_from_slice(bytes);
        Archive::from_map(Arc::new(map.make_read_only().map_err(io)?))
    }

    /// Every member under the root with its payload, in name order.
    pub fn members(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.members.iter().filter_map(|(name, range)| Some((name.as_str(), self.map.get(range.clone())?)))
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The members of the `torch.save` zip stored as `member`, with their
    /// payload ranges inside [`Archive::map`] (not copied out).
    pub fn nested_members(&self, member: &str) -> Result<Vec<(String, Range<usize>)>, ArchiveError> {
        let range = self.range(member).ok_or_else(|| ArchiveError::Member {
            member: self.full_name(member),
            detail: "missing from the archive".into(),
        })?;
        let inner = &self.map[range.clone()];
        read_directory(inner, range.start).map_err(|e| ArchiveError::Member {
            member: self.full_name(member),
            detail: format!("nested torch.save zip: {e}"),
        })
    }

    /// Makes `range` (inside the map, e.g. a storage of a nested zip)
    /// readable as `member`, so pickled and raw weights load the same way
    /// ([`Archive::members`] lists it from then on).
    pub(crate) fn add_member(&mut self, member: String, range: Range<usize>) -> Result<(), ArchiveError> {
        if range.start > range.end || range.end > self.map.len() {
            return Err(ArchiveError::Member { member, detail: format!("range {range:?} is outside the file") });
        }
        if self.members.contains_key(&member) {
            return Err(ArchiveError::Member { member, detail: "registered twice".into() });
        }
        self.members.insert(member, range);
        Ok(())
    }

    pub fn map(&self) -> &Arc<Mmap> {
        &self.map
    }

    pub fn contains(&self, member: &str) -> bool {
        self.members.contains_key(member)
    }

    /// Byte range of `member` (relative to the root) inside [`Archive::map`].
    pub fn range(&self, member: &str) -> Option<Range<usize>> {
        self.members.get(member).cloned()
    }

    pub fn bytes(&self, member: &str) -> Option<&[u8]> {
        self.range(member).and_then(|r| self.map.get(r))
    }

    /// The member as UTF-8 text, or a precise error.
    pub fn text(&self, member: &str) -> Result<&str, ArchiveError> {
        let bytes = self.bytes(member).ok_or_else(|| ArchiveError::Member {
            member: self.full_name(member),
            detail: "missing from the archive".into(),
        })?;
        std::str::from_utf8(bytes).map_err(|e| ArchiveError::Member {
            member: self.full_name(member),
            detail: format!("not UTF-8 text: {e}"),
        })
    }

    /// The member's name as written in the zip (with the root folder).
    pub fn full_name(&self, member: &str) -> String {
        format!("{}{member}", self.root)
    }
}

/// Every stored member of the zip in `bytes` with its payload range shifted
/// by `base` (where `bytes` starts in the file), validated against `bytes`.
fn read_directory(bytes: &[u8], base: usize) -> Result<Vec<(String, Range<usize>)>, ArchiveError> {
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| ArchiveError::Zip(e.to_string()))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let entry = zip.by_index_raw(i).map_err(|e| ArchiveError::Zip(format!("entry {i}: {e}")))?;
        let name = entry.name().to_string();
        if entry.is_dir() {
            continue;
        }
        let bad = |detail: String| ArchiveError::Member { member: name.clone(), detail };
        if entry.compression() != zip::CompressionMethod::Stored {
            return Err(bad(format!(
                "compressed with {:?}; torch.export.save stores members uncompressed (was the file re-zipped?)",
                entry.compression()
            )));
        }
        if entry.encrypted() {
            return Err(bad("encrypted".into()));
        }
        if entry.compressed_size() != entry.size() {
            return Err(bad(format!(
                "stored member with compressed size {} != size {}",
                entry.compressed_size(),
                entry.size()
            )));
        }
        let start = usize::try_from(entry.data_start()).map_err(|_| bad("data offset overflows".into()))?;
        let len = usize::try_from(entry.size()).map_err(|_| bad("size overflows".into()))?;
        let end = start.checked_add(len).ok_or_else(|| bad("offset + size overflows".into()))?;
        if end > bytes.len() {
            return Err(bad(format!("payload {start}..{end} runs past the end of the file ({} bytes)", bytes.len())));
        }
        // `base + end` cannot overflow: `end <= bytes.len()` and `bytes` lies inside the map.
        out.push((name, base + start..base + end));
    }
    Ok(out)
}

/// Finds the archive's root folder from its `archive_format` marker (or, for
/// torch ≤ 2.7, from `serialized_exported_program.json`) and tells the layouts apart.
fn find_root(all: &[(String, Range<usize>)]) -> Result<(String, Layout), ArchiveError> {
    let has = |n: &str| all.iter().any(|(name, _)| name == n);
    const LEGACY_PROGRAM: &str = "serialized_exported_program.json";
    let legacy = all.iter().find(|(n, _)| n == LEGACY_PROGRAM || n.ends_with(&format!("/{LEGACY_PROGRAM}")));
    if let Some((program, _)) = legacy {
        return Ok((program[..program.len() - LEGACY_PROGRAM.len()].to_string(), Layout::Legacy));
    }
    let marker = all.iter().find(|(n, _)| n == "archive_format" || n.ends_with("/archive_format"));
    let Some((marker, _)) = marker else {
        return Err(ArchiveError::Unsupported(
            "no `archive_format` member: not a file written by torch.export.save".into(),
        ));
    };
    let root = &marker[..marker.len() - "archive_format".len()];
    let under = |m: &str| has(&format!("{root}{m}"));
    // `archive_version` is 0 from 2.8 on, so only the files tell 2.8 apart.
    let layout = if under("data/weights/model.pt") && !under("data/weights/model_weights_config.json") {
        Layout::PickledArchive
    } else {
        Layout::Archive
    };
    Ok((root.to_string(), layout))
}
