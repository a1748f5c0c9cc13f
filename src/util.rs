//! Small helpers every layer may use: atomic file writes, a stable hash, digit grouping, the
//! NumPy .npy format, and the content digests of a directory's files (`manifest`).
//! Nothing here knows about models, data or training.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

pub mod manifest;

/// Writes `bytes` to `path` through `path.<pid>.tmp` (`tmp_path`), synced and then renamed, so
/// a crash leaves either the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = tmp_path(path);
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

/// The temporary name `path` is written under before it is renamed into place: one per process,
/// so that two processes writing the same file (two runs tokenizing the same data into the
/// shared token cache) never write into each other's temporary file.
pub fn tmp_path(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.{}.tmp", path.display(), std::process::id()))
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

/// `data` (row-major, C order) of the given shape as a NumPy .npy file, format 1.0: the magic
/// `\x93NUMPY`, version 1.0, the header length (u16, little-endian), a Python dict literal
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (…), }` padded with spaces and ended by
/// a newline so the data starts at a multiple of 64 bytes, then the values as little-endian
/// f32. `numpy.load` reads it.
pub fn npy_f32(shape: &[usize], data: &[f32]) -> Vec<u8> {
    debug_assert_eq!(shape.iter().product::<usize>(), data.len());
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    // magic (6) + version (2) + length (2) + header + newline, to a multiple of 64
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 4 * data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_has_the_magic_a_padded_header_and_little_endian_values() {
        let b = npy_f32(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.5]);
        assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
        assert_eq!(
            header.trim_end(),
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
        );
        assert!(header.ends_with('\n'));
        let data = &b[10 + hlen..];
        assert_eq!(data.len(), 24);
        assert_eq!(&data[20..24], &5.5f32.to_le_bytes());
        assert_eq!(&data[20..24], &[0x00, 0x00, 0xb0, 0x40]);
        // a one-dimensional shape is written as a one-element tuple
        let one = npy_f32(&[1], &[1.0]);
        assert!(std::str::from_utf8(&one[10..74])
            .unwrap()
            .contains("'shape': (1,)"));
        // the fixture written by scripts/npy_fixture.py with numpy.save
        let fixture = include_bytes!("../tests/fixtures/npy_2x3.npy");
        assert_eq!(&b[..], &fixture[..]);
    }

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
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let missing = dir.path().join("no/such/dir/f.txt");
        let e = write_atomic(&missing, b"x").unwrap_err().to_string();
        assert!(e.contains("no/such/dir/f.txt"), "{e}");
    }
}
