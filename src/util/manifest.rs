//! Content digests of the files of a directory (a model directory, a training checkpoint), kept
//! in `manifest.json`, written last and atomically:
//!
//! ```text
//! {"format": 1, "digest": "xxh3-128",
//!  "files": {"config.json": {"size": 812, "xxh3_128": "5f0c…"}, …}}
//! ```
//!
//! A directory whose manifest is present was completely written; `verify` then proves that each
//! listed file still holds what was written (same size, same XXH3-128 digest). XXH3 is not a
//! cryptographic hash: it detects damage (bit rot, a partial copy, a stray edit), not an
//! adversary. A directory without a manifest (older runs, Hugging Face downloads) verifies as
//! "nothing to check".

use crate::error::{Error, Result};
use crate::util::write_atomic;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

pub const MANIFEST_FILE: &str = "manifest.json";
const FORMAT: u64 = 1;
const DIGEST: &str = "xxh3-128";

/// The files written into a directory so far, with their sizes and digests.
#[derive(Default)]
pub struct Manifest {
    files: BTreeMap<String, (u64, u128)>,
}

/// The XXH3-128 digest of `bytes`, as the manifest writes it.
pub fn digest(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// The XXH3-128 digest and size of a file, read in 8 MiB pieces.
pub fn digest_file(path: &Path) -> std::io::Result<(u64, u128)> {
    let mut f = std::fs::File::open(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((size, h.digest128()));
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
}

impl Manifest {
    /// Starts writing into `dir`: a manifest left by an earlier write is removed first, so a
    /// crash before `finish` leaves a directory without one rather than one that disagrees
    /// with its files.
    pub fn begin(dir: &Path) -> Result<Self> {
        let p = dir.join(MANIFEST_FILE);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(Self::default()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(Error::io(&p, e)),
        }
    }

    /// Writes `dir/name` atomically (`write_atomic`) and records its digest.
    pub fn write(&mut self, dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
        write_atomic(&dir.join(name), bytes)?;
        self.files
            .insert(name.to_string(), (bytes.len() as u64, digest(bytes)));
        Ok(())
    }

    /// Writes `dir/manifest.json` atomically, after every file it lists.
    pub fn finish(self, dir: &Path) -> Result<()> {
        let files: Map<String, Value> = self
            .files
            .into_iter()
            .map(|(n, (size, d))| (n, json!({"size": size, "xxh3_128": format!("{d:032x}")})))
            .collect();
        let js = json!({"format": FORMAT, "digest": DIGEST, "files": files});
        let text = serde_json::to_string_pretty(&js).expect("json");
        write_atomic(&dir.join(MANIFEST_FILE), text.as_bytes())
    }
}

/// Checks every file `dir/manifest.json` lists against its size and digest. `Ok(false)`: no
/// manifest, nothing checked. A missing, resized or altered file is one error naming it; a
/// malformed manifest is one error naming the manifest.
pub fn verify(dir: &Path) -> Result<bool> {
    // 1. Read the manifest, if any
    let mpath = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&mpath) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(&mpath, e)),
    };
    let entries = parse(&text).map_err(|msg| Error::Checkpoint {
        path: mpath.clone(),
        msg,
    })?;
    // 2. Check each listed file
    for (name, size, want) in entries {
        let path = dir.join(&name);
        let damaged = |msg: String| Error::Checkpoint {
            path: path.clone(),
            msg: format!("damaged: {msg} (recorded in {MANIFEST_FILE} when it was written)"),
        };
        let (got_size, got) = match digest_file(&path) {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(damaged("missing, though listed".into()))
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        if got_size != size {
            return Err(damaged(format!("{got_size} bytes, expected {size}")));
        }
        if got != want {
            return Err(damaged(format!(
                "its content does not match its {DIGEST} digest"
            )));
        }
    }
    Ok(true)
}

/// The (file name, size, digest) entries of a manifest's text, or what is wrong with it.
fn parse(text: &str) -> std::result::Result<Vec<(String, u64, u128)>, String> {
    let js: Value = serde_json::from_str(text).map_err(|e| format!("malformed JSON ({e})"))?;
    if js.get("format").and_then(Value::as_u64) != Some(FORMAT)
        || js.get("digest").and_then(Value::as_str) != Some(DIGEST)
    {
        return Err(format!(
            "not a format {FORMAT} manifest with {DIGEST} digests"
        ));
    }
    let files = js
        .get("files")
        .and_then(Value::as_object)
        .ok_or("no `files` object")?;
    files
        .iter()
        .map(|(name, e)| {
            // a listed name is a plain file name: never a path out of the directory
            if name.is_empty() || name.contains(['/', '\\']) || name == ".." || name == "." {
                return Err(format!("file name `{name}` is not a plain file name"));
            }
            let size = e.get("size").and_then(Value::as_u64);
            let d = e
                .get("xxh3_128")
                .and_then(Value::as_str)
                .filter(|s| s.len() == 32)
                .and_then(|s| u128::from_str_radix(s, 16).ok());
            match (size, d) {
                (Some(s), Some(d)) => Ok((name.clone(), s, d)),
                _ => Err(format!(
                    "entry `{name}` lacks a size or a 32-digit hex xxh3_128"
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_matches_the_reference_xxh3_128_of_no_bytes() {
        // XXH3_128bits("") from the reference implementation (xxhash 0.8)
        assert_eq!(digest(b""), 0x99aa06d3014798d86001c324468d497f);
    }

    #[test]
    fn a_written_directory_verifies_and_each_kind_of_damage_is_named() {
        let d = tempfile::tempdir().unwrap();
        assert!(!verify(d.path()).unwrap(), "no manifest: nothing to check");
        let mut m = Manifest::begin(d.path()).unwrap();
        m.write(d.path(), "a.bin", &[1, 2, 3, 4]).unwrap();
        m.write(d.path(), "b.json", b"{}").unwrap();
        m.finish(d.path()).unwrap();
        assert!(verify(d.path()).unwrap());
        assert_eq!(
            digest_file(&d.path().join("a.bin")).unwrap().1,
            digest(&[1, 2, 3, 4])
        );
        // same size, one byte altered
        std::fs::write(d.path().join("a.bin"), [1, 2, 7, 4]).unwrap();
        let e = verify(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("a.bin: damaged: its content does not match"),
            "{e}"
        );
        // resized
        std::fs::write(d.path().join("a.bin"), [1, 2, 3]).unwrap();
        let e = verify(d.path()).unwrap_err().to_string();
        assert!(e.contains("a.bin: damaged: 3 bytes, expected 4"), "{e}");
        // missing
        std::fs::remove_file(d.path().join("a.bin")).unwrap();
        let e = verify(d.path()).unwrap_err().to_string();
        assert!(e.contains("a.bin: damaged: missing"), "{e}");
        // a new write removes the old manifest first
        Manifest::begin(d.path()).unwrap();
        assert!(!verify(d.path()).unwrap());
    }

    #[test]
    fn a_malformed_manifest_is_named_and_never_reads_outside_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(MANIFEST_FILE);
        for text in [
            "{",
            r#"{"format": 2, "digest": "xxh3-128", "files": {}}"#,
            r#"{"format": 1, "digest": "xxh3-128", "files": []}"#,
            r#"{"format": 1, "digest": "xxh3-128", "files": {"../x": {"size": 1, "xxh3_128": "00000000000000000000000000000000"}}}"#,
            r#"{"format": 1, "digest": "xxh3-128", "files": {"x": {"size": "1"}}}"#,
        ] {
            std::fs::write(&p, text).unwrap();
            let e = verify(d.path()).unwrap_err().to_string();
            assert!(e.starts_with(&p.display().to_string()), "{text}: {e}");
        }
    }
}
