//! Parsing the container: header, section table, checksums. Every byte is
//! treated as hostile; errors say which section, at which offset, what was
//! expected and what was found.

use super::*;
use crate::Error;
use std::ops::Range;

/// The validated layout of a `.kiln` file: byte ranges of its known sections.
#[derive(Clone, Debug)]
pub struct Container {
    pub minor: u16,
    pub plan: Range<usize>,
    pub weights: Range<usize>,
    pub metadata: Option<Range<usize>>,
    /// Accelerator segments ([`AccelProgram`]), when the plan has any.
    pub accel: Option<Range<usize>>,
    pub native: Option<Range<usize>>,
}

fn fmt_err(section: &str, offset: u64, detail: String) -> Error {
    Error::Format { section: section.to_string(), offset, detail }
}

pub fn parse_container(bytes: &[u8]) -> Result<Container, Error> {
    let (header, rest) = FileHeader::read_from_prefix(bytes).map_err(|_| {
        fmt_err("header", 0, format!("file is {} bytes, shorter than the {HEADER_LEN}-byte header", bytes.len()))
    })?;
    if header.magic != MAGIC {
        return Err(fmt_err("header", 0, format!("bad magic {:02x?}: not a .kiln file", header.magic)));
    }
    let (major, minor) = (header.major.get(), header.minor.get());
    if major != FORMAT_MAJOR || !(FORMAT_MINOR_MIN..=FORMAT_MINOR).contains(&minor) {
        return Err(Error::Version {
            found: (major, minor),
            supported: (FORMAT_MAJOR, FORMAT_MINOR_MIN, FORMAT_MINOR),
        });
    }
    if header.file_len.get() != bytes.len() as u64 {
        return Err(fmt_err(
            "header",
            16,
            format!(
                "header says the file is {} bytes, but it is {} (truncated or padded?)",
                header.file_len.get(),
                bytes.len()
            ),
        ));
    }
    let count = header.section_count.get() as usize;
    let table_len = count.checked_mul(ENTRY_LEN).filter(|&l| l <= rest.len()).ok_or_else(|| {
        fmt_err("section table", HEADER_LEN as u64, format!("{count} sections do not fit in the file"))
    })?;
    let table = &rest[..table_len];
    let crc = crc32fast::hash(table);
    if crc != header.table_crc.get() {
        return Err(Error::Checksum { section: "section table".into(), expected: header.table_crc.get(), found: crc });
    }
    let table_end = (HEADER_LEN + table_len) as u64;
    let (mut plan, mut weights, mut metadata, mut accel, mut native) = (None, None, None, None, None);
    for (i, chunk) in table.chunks_exact(ENTRY_LEN).enumerate() {
        let entry_offset = HEADER_LEN as u64 + (i * ENTRY_LEN) as u64;
        let e = SectionEntry::read_from_bytes(chunk)
            .map_err(|_| fmt_err("section table", entry_offset, "short entry".into()))?;
        let kind = e.kind.get();
        let name = section_name(kind);
        let (off, len) = (e.offset.get(), e.len.get());
        let end =
            off.checked_add(len).ok_or_else(|| fmt_err(name, entry_offset, "offset + length overflows".into()))?;
        if off < table_end || end > bytes.len() as u64 {
            return Err(fmt_err(
                name,
                entry_offset,
                format!("section bytes {off}..{end} lie outside the file's data area {table_end}..{}", bytes.len()),
            ));
        }
        if off % SECTION_ALIGN != 0 {
            return Err(fmt_err(
                name,
                entry_offset,
                format!("section offset {off} is not a multiple of {SECTION_ALIGN}"),
            ));
        }
        let range = off as usize..end as usize;
        let crc = crc32fast::hash(&bytes[range.clone()]);
        if crc != e.crc.get() {
            return Err(Error::Checksum { section: name.into(), expected: e.crc.get(), found: crc });
        }
        let slot = match kind {
            SECTION_PLAN => &mut plan,
            SECTION_WEIGHTS => &mut weights,
            SECTION_METADATA => &mut metadata,
            SECTION_ACCEL => &mut accel,
            SECTION_NATIVE => &mut native,
            _ if e.flags.get() & SECTION_FLAG_OPTIONAL != 0 => continue,
            _ => {
                return Err(fmt_err(
                    "section table",
                    entry_offset,
                    format!("required section of unknown kind {kind}: the file needs a newer runtime"),
                ))
            }
        };
        if slot.replace(range).is_some() {
            return Err(fmt_err(name, entry_offset, "section appears twice".into()));
        }
    }
    let missing = |what: &str| fmt_err(what, 0, "section is missing".into());
    Ok(Container {
        minor,
        plan: plan.ok_or_else(|| missing("plan"))?,
        weights: weights.ok_or_else(|| missing("weights"))?,
        metadata,
        accel,
        native,
    })
}
