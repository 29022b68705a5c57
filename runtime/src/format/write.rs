//! Writing `.kiln` files (used by the compiler; lives here because the runtime
//! owns the format).

use super::*;
use crate::Error;
#[cfg(feature = "fs")]
use std::path::Path;

/// Packs weight tensors into one section, each at a multiple of [`WEIGHT_ALIGN`].
#[derive(Default)]
pub struct WeightsBuilder {
    bytes: Vec<u8>,
}

impl WeightsBuilder {
    pub fn new() -> WeightsBuilder {
        WeightsBuilder::default()
    }

    /// Appends a tensor's bytes and returns its storage.
    pub fn push(&mut self, data: &[u8]) -> Storage {
        let offset = align_up(self.bytes.len() as u64, WEIGHT_ALIGN);
        self.bytes.resize(offset as usize, 0);
        self.bytes.extend_from_slice(data);
        Storage::Weight { offset, bytes: data.len() as u64 }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Assembles sections into a `.kiln` file.
#[derive(Default)]
pub struct ArtifactWriter {
    sections: Vec<(u32, u32, Vec<u8>)>,
}

impl ArtifactWriter {
    pub fn new(plan: &Plan, weights: WeightsBuilder, metadata: &Metadata) -> Result<ArtifactWriter, Error> {
        let encode = |what: &str, r: Result<Vec<u8>, postcard::Error>| {
            r.map_err(|e| Error::Format { section: what.to_string(), offset: 0, detail: format!("cannot encode: {e}") })
        };
        let mut w = ArtifactWriter::default();
        w.add_section(SECTION_PLAN, 0, encode("plan", postcard::to_allocvec(plan))?);
        w.add_section(SECTION_WEIGHTS, 0, weights.into_bytes());
        w.add_section(SECTION_METADATA, SECTION_FLAG_OPTIONAL, encode("metadata", postcard::to_allocvec(metadata))?);
        Ok(w)
    }

    /// Adds a section; later formats add StableHLO text, object code, etc. here.
    pub fn add_section(&mut self, kind: u32, flags: u32, bytes: Vec<u8>) {
        self.sections.push((kind, flags, bytes));
    }

    /// Adds the accelerator section (required: a plan calling `Kernel::Accel`
    /// cannot run without it).
    pub fn add_accel(&mut self, accel: &AccelProgram) -> Result<(), Error> {
        let bytes = postcard::to_allocvec(accel).map_err(|e| Error::Format {
            section: "accel".into(),
            offset: 0,
            detail: format!("cannot encode: {e}"),
        })?;
        self.add_section(SECTION_ACCEL, 0, bytes);
        Ok(())
    }

    /// Adds the native-code section (required: the plan's native calls name its functions).
    pub fn add_native(&mut self, native: &crate::native::NativeSection) -> Result<(), Error> {
        let bytes = postcard::to_allocvec(native).map_err(|e| Error::Format {
            section: "native".into(),
            offset: 0,
            detail: format!("cannot encode: {e}"),
        })?;
        self.add_section(SECTION_NATIVE, 0, bytes);
        Ok(())
    }

    /// The complete file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        let table_end = (HEADER_LEN + ENTRY_LEN * self.sections.len()) as u64;
        let mut offset = align_up(table_end, SECTION_ALIGN);
        let mut entries = Vec::with_capacity(self.sections.len());
        for (kind, flags, bytes) in &self.sections {
            entries.push(SectionEntry {
                kind: (*kind).into(),
                flags: (*flags).into(),
                offset: offset.into(),
                len: (bytes.len() as u64).into(),
                crc: crc32fast::hash(bytes).into(),
                reserved: 0.into(),
            });
            offset = align_up(offset + bytes.len() as u64, SECTION_ALIGN);
        }
        let file_len = entries.last().map_or(table_end, |e| e.offset.get() + e.len.get());
        let mut table = Vec::with_capacity(ENTRY_LEN * entries.len());
        for e in &entries {
            table.extend_from_slice(e.as_bytes());
        }
        let header = FileHeader {
            magic: MAGIC,
            major: FORMAT_MAJOR.into(),
            minor: FORMAT_MINOR.into(),
            section_count: (entries.len() as u32).into(),
            file_len: file_len.into(),
            table_crc: crc32fast::hash(&table).into(),
            reserved: [0; 20],
        };
        let mut out = Vec::with_capacity(file_len as usize);
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&table);
        for (e, (_, _, bytes)) in entries.iter().zip(&self.sections) {
            out.resize(e.offset.get() as usize, 0);
            out.extend_from_slice(bytes);
        }
        out
    }

    /// Writes atomically: a temporary file beside `path`, then a rename, so a
    /// reader never sees a half-written artifact.
    #[cfg(feature = "fs")]
    pub fn write_atomic(&self, path: &Path) -> Result<(), Error> {
        write_file_atomic(path, &self.to_bytes())
    }
}

/// Writes `bytes` to `path` atomically: a temporary file beside `path`,
/// flushed, then renamed over it; on any failure the temporary file is removed
/// and `path` is untouched.
#[cfg(feature = "fs")]
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Io { path: path.display().to_string(), source: e };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "artifact".into());
    let tmp = dir.join(format!(".{file_name}.tmp{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

pub(crate) fn align_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align) * align
}
