//! The on-disk executable cache: compiling a segment can take seconds (much
//! longer on a TPU), so a session loads what an earlier one compiled.
//!
//! A file is named by a 128-bit hash of everything the executable depends on
//! (plugin path, platform name and version, compile options, MLIR text) and
//! holds `MAGIC | payload length (u64 LE) | CRC-32 (u32 LE) | payload`.
//! Files are written to a temporary name and renamed, so a reader sees either
//! nothing or a whole file; a file that fails its checks is ignored (and
//! replaced by the next compile), never trusted.

use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"KILNPJX1";
const HEAD: usize = 8 + 8 + 4;

pub struct Cache {
    dir: PathBuf,
}

/// The default cache directory: `$XDG_CACHE_HOME/kiln`, else `$HOME/.cache/kiln`.
pub fn default_dir() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    nonempty("XDG_CACHE_HOME")
        .map(|d| d.join("kiln"))
        .or_else(|| nonempty("HOME").map(|h| h.join(".cache").join("kiln")))
}

/// FNV-1a over 128 bits: stable across Rust versions and platforms (unlike
/// `DefaultHasher`), and wide enough that collisions are not a concern.
pub fn key(parts: &[&[u8]]) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    let mut h = OFFSET;
    for part in parts {
        // Length-prefixed so that ("ab", "c") and ("a", "bc") differ.
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    format!("{h:032x}")
}

impl Cache {
    pub fn new(dir: PathBuf) -> Cache {
        Cache { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.pjrt"))
    }

    /// The cached payload, if a whole, intact file exists.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        let (head, payload) = bytes.split_at_checked(HEAD)?;
        let len = u64::from_le_bytes(head[8..16].try_into().ok()?);
        let crc = u32::from_le_bytes(head[16..20].try_into().ok()?);
        let intact = &head[..8] == MAGIC && len == payload.len() as u64 && crc32fast::hash(payload) == crc;
        intact.then(|| payload.to_vec())
    }

    pub fn store(&self, key: &str, payload: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let tmp = self.dir.join(format!(".{key}.tmp{}", std::process::id()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&(payload.len() as u64).to_le_bytes())?;
            f.write_all(&crc32fast::hash(payload).to_le_bytes())?;
            f.write_all(payload)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
        let cache = Cache::new(dir.clone());
        let k = key(&[b"plugin", b"module"]);
        assert_ne!(k, key(&[b"plugi", b"nmodule"]));
        assert!(cache.load(&k).is_none());
        cache.store(&k, b"executable bytes").unwrap();
        assert_eq!(cache.load(&k).as_deref(), Some(&b"executable bytes"[..]));
        let mut bytes = std::fs::read(cache.path(&k)).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(cache.path(&k), bytes).unwrap();
        assert!(cache.load(&k).is_none(), "a corrupted file is ignored");
        let _ = std::fs::remove_dir_all(dir);
    }
}
