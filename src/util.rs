//! Small helpers every layer may use: atomic file writes, a stable hash, digit grouping, and
//! the content digests of a directory's files (`manifest`).
//! Nothing here knows about models, data or training.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

pub mod manifest;

/// Writes `bytes` to `path` through `path.tmp`, synced and then renamed, so a crash leaves
/// either the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// The 64-bit FNV-1a offset basis: the hash of no bytes.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Continues a 64-bit FNV-1a hash `h` over `bytes` (stable across runs and platforms).
pub fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// 3345408 → "3,345,408".
pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(3_345_408), "3,345,408");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a(FNV_START, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_START, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_START, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!dir.path().join("f.txt.tmp").exists());
        let missing = dir.path().join("no/such/dir/f.txt");
        let e = write_atomic(&missing, b"x").unwrap_err().to_string();
        assert!(e.contains("no/such/dir/f.txt"), "{e}");
    }
}
