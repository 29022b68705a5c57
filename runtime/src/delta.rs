//! Delta updates: a patch turns one artifact (the base) into another,
//! carrying only the bytes the base lacks. `kiln diff` / `kiln patch` wrap
//! [`diff`] and [`patch`]; a device can call [`patch`] itself.
//!
//! ```text
//! offset 0   magic "KILNDLT\0", version u32, op count u32
//! 16         base length u64, new length u64
//! 32         SHA-256 of the base, SHA-256 of the result
//! 96         ops: 1 = copy { base offset u64, length u64 }
//!                 2 = data { length u64, bytes }
//! end        SHA-256 of everything before it
//! ```
//! All integers are little-endian. The result is the ops' bytes in order.
//!
//! Matching works at [`BLOCK`] granularity: every section of an artifact
//! and every weight tensor starts at a multiple of 64 bytes, so content that
//! moved (a tensor after a resized one) moved by a multiple of 64 and is still
//! found. Fine-tuning a layer changes that layer's tensors only; the patch
//! carries them, the plan if it changed, and the section table.
//!
//! [`patch`] treats the patch as hostile: its own checksum is verified first,
//! every op is bounds-checked against the base and the patch, the result's
//! size is capped ([`MAX_RESULT_BYTES`]; [`inspect`] tells a device the size
//! before it applies anything) and reserved fallibly, and the result must hash to the
//! recorded value, so what it returns is byte-identical to the artifact the
//! patch was made from. A patch for another base is refused before any work.

use sha2::{Digest, Sha256};
use std::collections::HashMap;

pub const MAGIC: [u8; 8] = *b"KILNDLT\0";
pub const VERSION: u32 = 1;
/// Match granularity: the artifact format's section and weight alignment.
pub const BLOCK: usize = 64;
/// The largest result [`patch`] builds (kiln caps tensors at 1 TiB too).
pub const MAX_RESULT_BYTES: u64 = 1 << 40;

const HEADER_LEN: usize = 96;
const HASH_LEN: usize = 32;
const OP_COPY: u8 = 1;
const OP_DATA: u8 = 2;
/// Bytes of the smallest op (a tag and one length): bounds the op count by the patch size.
const MIN_OP_LEN: usize = 9;

#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error("not a kiln delta (bad magic)")]
    NotADelta,
    #[error("kiln delta version {0} is not supported (this runtime reads version {VERSION})")]
    Version(u32),
    #[error("the delta is corrupt: its checksum does not match (damaged in transit?)")]
    Corrupt,
    #[error("malformed delta at byte {offset}: {detail}")]
    Malformed { offset: usize, detail: String },
    #[error("the delta was made for another base artifact (expected {expected_len} bytes with SHA-256 {expected}, got {found_len} bytes with SHA-256 {found})")]
    WrongBase { expected: String, expected_len: u64, found: String, found_len: u64 },
    #[error("applying the delta gave bytes whose SHA-256 is {found}, not the recorded {expected}")]
    ResultMismatch { expected: String, found: String },
    #[error("the delta's result would be {0} bytes, more than can be allocated")]
    TooLarge(u64),
}

/// What a patch records about itself, read without applying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchInfo {
    pub base_len: u64,
    pub base_sha256: [u8; HASH_LEN],
    pub new_len: u64,
    pub new_sha256: [u8; HASH_LEN],
    /// Bytes of the result copied from the base, and carried in the patch.
    pub copied_bytes: u64,
    pub carried_bytes: u64,
}

/// One step of a patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `len` bytes from the base at `offset`.
    Copy { offset: u64, len: u64 },
    /// `len` bytes carried in the patch, starting at patch offset `at`.
    Data { at: usize, len: u64 },
}

/// The patch that turns `base` into `new`.
pub fn diff(base: &[u8], new: &[u8]) -> Vec<u8> {
    let ops = match_blocks(base, new);
    let mut out = Vec::with_capacity(HEADER_LEN + HASH_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    out.extend_from_slice(&(base.len() as u64).to_le_bytes());
    out.extend_from_slice(&(new.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(base));
    out.extend_from_slice(&Sha256::digest(new));
    for op in ops {
        match op {
            Op::Copy { offset, len } => {
                out.push(OP_COPY);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Op::Data { at, len } => {
                out.push(OP_DATA);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&new[at..at + len as usize]);
            }
        }
    }
    let checksum = Sha256::digest(&out);
    out.extend_from_slice(&checksum);
    out
}

/// Applies `delta` to `base`: the artifact the delta was made from, byte for byte.
pub fn patch(base: &[u8], delta: &[u8]) -> Result<Vec<u8>, DeltaError> {
    let (info, ops) = parse(delta)?;
    let base_sha256: [u8; HASH_LEN] = Sha256::digest(base).into();
    if base.len() as u64 != info.base_len || base_sha256 != info.base_sha256 {
        return Err(DeltaError::WrongBase {
            expected: hex(&info.base_sha256),
            expected_len: info.base_len,
            found: hex(&base_sha256),
            found_len: base.len() as u64,
        });
    }
    let mut out = Vec::new();
    out.try_reserve_exact(info.new_len as usize).map_err(|_| DeltaError::TooLarge(info.new_len))?;
    for op in ops {
        match op {
            Op::Copy { offset, len } => {
                out.extend_from_slice(&base[offset as usize..(offset + len) as usize]);
            }
            Op::Data { at, len } => out.extend_from_slice(&delta[at..at + len as usize]),
        }
    }
    let found: [u8; HASH_LEN] = Sha256::digest(&out).into();
    if found != info.new_sha256 {
        return Err(DeltaError::ResultMismatch { expected: hex(&info.new_sha256), found: hex(&found) });
    }
    Ok(out)
}

/// Checks `delta` and reads what it records, without a base.
pub fn inspect(delta: &[u8]) -> Result<PatchInfo, DeltaError> {
    parse(delta).map(|(info, _)| info)
}

/// Lowercase hex of a hash, for messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Validates the whole patch and returns its ops, each proven in bounds:
/// copies inside the base (by the recorded base length, which [`patch`]
/// checks against the real base before using them), data inside the patch,
/// lengths summing to the recorded result length.
fn parse(delta: &[u8]) -> Result<(PatchInfo, Vec<Op>), DeltaError> {
    if delta.len() < 8 || delta[..8] != MAGIC {
        return Err(DeltaError::NotADelta);
    }
    if delta.len() < HEADER_LEN + HASH_LEN {
        return Err(DeltaError::Malformed {
            offset: delta.len(),
            detail: format!("{} bytes is shorter than the {} a delta needs", delta.len(), HEADER_LEN + HASH_LEN),
        });
    }
    let version = le_u32(delta, 8);
    if version != VERSION {
        return Err(DeltaError::Version(version));
    }
    let body_end = delta.len() - HASH_LEN;
    if Sha256::digest(&delta[..body_end]).as_slice() != &delta[body_end..] {
        return Err(DeltaError::Corrupt);
    }
    let op_count = le_u32(delta, 12) as usize;
    let mut info = PatchInfo {
        base_len: le_u64(delta, 16),
        new_len: le_u64(delta, 24),
        base_sha256: hash_at(delta, 32),
        new_sha256: hash_at(delta, 64),
        copied_bytes: 0,
        carried_bytes: 0,
    };
    let malformed = |offset: usize, detail: String| DeltaError::Malformed { offset, detail };
    if info.new_len > MAX_RESULT_BYTES {
        return Err(DeltaError::TooLarge(info.new_len));
    }
    if op_count > (body_end - HEADER_LEN) / MIN_OP_LEN {
        return Err(malformed(12, format!("{op_count} ops cannot fit in {} bytes", body_end - HEADER_LEN)));
    }
    let mut ops = Vec::with_capacity(op_count);
    let mut at = HEADER_LEN;
    let mut total: u64 = 0;
    let need = |at: usize, n: usize| {
        if at + n > body_end {
            Err(malformed(at, format!("op needs {n} more bytes, the delta ends at {body_end}")))
        } else {
            Ok(())
        }
    };
    for _ in 0..op_count {
        let op_at = at;
        need(at, MIN_OP_LEN)?;
        let tag = delta[at];
        at += 1;
        let op = match tag {
            OP_COPY => {
                need(at, 16)?;
                let (offset, len) = (le_u64(delta, at), le_u64(delta, at + 8));
                at += 16;
                if offset.checked_add(len).is_none_or(|end| end > info.base_len) {
                    return Err(malformed(
                        op_at,
                        format!("copy of {len} bytes at {offset} reaches past the base's {} bytes", info.base_len),
                    ));
                }
                Op::Copy { offset, len }
            }
            OP_DATA => {
                let len = le_u64(delta, at);
                at += 8;
                if len > (body_end - at) as u64 {
                    return Err(malformed(op_at, format!("{len} data bytes run past the delta's end")));
                }
                let op = Op::Data { at, len };
                at += len as usize;
                op
            }
            other => return Err(malformed(op_at, format!("unknown op {other}"))),
        };
        total = op_len(op)
            .checked_add(total)
            .filter(|&t| t <= info.new_len)
            .ok_or_else(|| malformed(op_at, format!("ops produce more than the recorded {} bytes", info.new_len)))?;
        // Summed only once `total` is bounded, so these cannot overflow.
        match op {
            Op::Copy { len, .. } => info.copied_bytes += len,
            Op::Data { len, .. } => info.carried_bytes += len,
        }
        ops.push(op);
    }
    if at != body_end {
        return Err(malformed(at, format!("{} bytes after the last op", body_end - at)));
    }
    if total != info.new_len {
        return Err(malformed(at, format!("ops produce {total} bytes, the header says {}", info.new_len)));
    }
    Ok((info, ops))
}

fn op_len(op: Op) -> u64 {
    match op {
        Op::Copy { len, .. } | Op::Data { len, .. } => len,
    }
}

/// Greedy block matching: each [`BLOCK`]-aligned block of `new` is looked
/// up among the base's aligned blocks (the same offset first, then by hash),
/// verified byte for byte, and the match extended as far as the bytes agree;
/// runs without a match become data.
fn match_blocks(base: &[u8], new: &[u8]) -> Vec<Op> {
    let mut index: HashMap<u64, usize> = HashMap::new();
    for (i, block) in base.chunks_exact(BLOCK).enumerate() {
        index.entry(block_key(block)).or_insert(i * BLOCK);
    }
    let mut ops = Vec::new();
    let mut pending_data = 0; // start of the unmatched run ending at `p`
    let mut p = 0;
    while p < new.len() {
        match find_match(base, new, p, &index) {
            Some((offset, len)) => {
                if pending_data < p {
                    ops.push(Op::Data { at: pending_data, len: (p - pending_data) as u64 });
                }
                ops.push(Op::Copy { offset: offset as u64, len: len as u64 });
                p += len;
                pending_data = p;
            }
            // Realign: moved content sits at multiples of BLOCK.
            None => p = ((p / BLOCK + 1) * BLOCK).min(new.len()),
        }
    }
    if pending_data < new.len() {
        ops.push(Op::Data { at: pending_data, len: (new.len() - pending_data) as u64 });
    }
    ops
}

/// The longest verified match for `new[p..]` starting at a base block, if any
/// covers at least one whole block (or the final partial one).
fn find_match(base: &[u8], new: &[u8], p: usize, index: &HashMap<u64, usize>) -> Option<(usize, usize)> {
    let block = &new[p..(p + BLOCK).min(new.len())];
    let same_offset = (p + block.len() <= base.len()).then_some(p);
    let by_hash = (block.len() == BLOCK).then(|| index.get(&block_key(block)).copied()).flatten();
    [same_offset, by_hash]
        .into_iter()
        .flatten()
        .filter(|&o| base.get(o..o + block.len()) == Some(block))
        .map(|o| (o, common_prefix(&base[o..], &new[p..])))
        .max_by_key(|&(_, len)| len)
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A cheap 64-bit key of a block (FNV-1a over 8-byte words); matches are verified.
fn block_key(block: &[u8]) -> u64 {
    block.chunks(8).fold(0xcbf2_9ce4_8422_2325, |h, w| {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        (h ^ u64::from_le_bytes(word)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut v = [0; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn hash_at(b: &[u8], at: usize) -> [u8; HASH_LEN] {
    let mut h = [0; HASH_LEN];
    h.copy_from_slice(&b[at..at + HASH_LEN]);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_files_give_one_copy() {
        let base: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let d = diff(&base, &base);
        let info = inspect(&d).expect("valid");
        assert_eq!((info.copied_bytes, info.carried_bytes), (base.len() as u64, 0));
        assert_eq!(patch(&base, &d).expect("apply"), base);
    }

    #[test]
    fn shifted_and_edited_content_is_found() {
        let base: Vec<u8> = (0..64 * 200u32).map(|i| (i * 31 % 253) as u8).collect();
        let mut new = vec![9u8; 128];
        new.extend_from_slice(&base);
        new[5000] ^= 1;
        new.extend_from_slice(b"tail");
        let d = diff(&base, &new);
        let info = inspect(&d).expect("valid");
        assert!(info.carried_bytes <= 128 + 64 + 4, "carried {}", info.carried_bytes);
        assert_eq!(patch(&base, &d).expect("apply"), new);
        assert_eq!(patch(&base, &diff(&base, &[])).expect("empty"), Vec::<u8>::new());
        assert_eq!(patch(&[], &diff(&[], &new)).expect("from nothing"), new);
    }
}
