//! Token files: a corpus tokenized once into a compact little-endian file (u16 ids when the
//! vocabulary fits, u32 otherwise) and memory-mapped, so corpora larger than RAM work.
//!
//! ```text
//! offset 0   b"DIFFTXTK"      magic
//! offset 8   u32 version (1)  u32 width (2 or 4 bytes per id)
//! offset 16  u64 count        u64 vocab_size
//! offset 32  count ids, each `width` bytes, little-endian
//! ```

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"DIFFTXTK";
const HEADER: usize = 32;

/// Bytes per id for a vocabulary: 2 when every id fits in a u16.
pub fn id_width(vocab_size: usize) -> usize {
    if vocab_size <= 1 << 16 {
        2
    } else {
        4
    }
}

/// Streams ids into a new token file: a temporary name first, renamed into place by `finish`
/// once every id is written and synced, so a crash never leaves a half file under the real name.
pub struct TokenWriter {
    file: std::io::BufWriter<std::fs::File>,
    tmp: PathBuf,
    path: PathBuf,
    width: usize,
    vocab_size: usize,
    count: u64,
}

impl TokenWriter {
    pub fn create(path: &Path, vocab_size: usize) -> Result<Self> {
        let tmp = crate::util::tmp_path(path);
        let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut w = TokenWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, f),
            tmp,
            path: path.to_path_buf(),
            width: id_width(vocab_size),
            vocab_size,
            count: 0,
        };
        w.write_header()?;
        Ok(w)
    }

    fn write_header(&mut self) -> Result<()> {
        let mut h = [0u8; HEADER];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        h[12..16].copy_from_slice(&(self.width as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.count.to_le_bytes());
        h[24..32].copy_from_slice(&(self.vocab_size as u64).to_le_bytes());
        self.file.write_all(&h).map_err(|e| Error::io(&self.tmp, e))
    }

    pub fn push(&mut self, ids: &[u32]) -> Result<()> {
        let mut buf = [0u8; 4096];
        for chunk in ids.chunks(4096 / self.width) {
            let mut n = 0;
            for &id in chunk {
                if id as usize >= self.vocab_size {
                    return Err(Error::Invalid(format!(
                        "token id {id} is outside the vocabulary ({})",
                        self.vocab_size
                    )));
                }
                if self.width == 2 {
                    buf[n..n + 2].copy_from_slice(&(id as u16).to_le_bytes());
                } else {
                    buf[n..n + 4].copy_from_slice(&id.to_le_bytes());
                }
                n += self.width;
            }
            self.file
                .write_all(&buf[..n])
                .map_err(|e| Error::io(&self.tmp, e))?;
        }
        self.count += ids.len() as u64;
        Ok(())
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Writes the final count, syncs and renames the file into place.
    pub fn finish(mut self) -> Result<PathBuf> {
        let tmp = self.tmp.clone();
        let io = |e| Error::io(&tmp, e);
        self.file.flush().map_err(io)?;
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.write_header()?;
        self.file.flush().map_err(io)?;
        self.file.get_ref().sync_all().map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))?;
        Ok(self.path)
    }

    /// Drops the temporary file (after an error).
    pub fn abandon(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// A memory-mapped token file.
pub struct TokenFile {
    pub path: PathBuf,
    map: Mmap,
    width: usize,
    len: usize,
    pub vocab_size: usize,
}

impl TokenFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |msg: String| Error::Data {
            path: path.to_path_buf(),
            msg,
        };
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is only ever written under a temporary name and renamed into place
        // complete; nothing writes to it while mapped.
        let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
        if map.len() < HEADER || &map[..8] != MAGIC {
            return Err(bad("not a difftx token file".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(map[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(map[o..o + 8].try_into().unwrap());
        let (version, width) = (u32_at(8), u32_at(12) as usize);
        if version != 1 || !(width == 2 || width == 4) {
            return Err(bad(format!(
                "unsupported token file (version {version}, {width} bytes per id)"
            )));
        }
        let len = u64_at(16) as usize;
        let vocab_size = u64_at(24) as usize;
        // checked: a count near 2^64 / width would wrap to the file's length and pass
        if (len.checked_mul(width)).and_then(|b| b.checked_add(HEADER)) != Some(map.len()) {
            return Err(bad(format!(
                "truncated token file: {} bytes, header says {len} ids of {width} bytes",
                map.len()
            )));
        }
        Ok(TokenFile {
            path: path.to_path_buf(),
            map,
            width,
            len,
            vocab_size,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Refuses a file holding an id outside its vocabulary (damage: the writer refuses such ids),
    /// naming the file, the id and its position. One pass over the file.
    pub fn check_ids(&self) -> Result<()> {
        let mut buf = vec![0u32; 1 << 16];
        for start in (0..self.len).step_by(buf.len()) {
            let n = buf.len().min(self.len - start);
            self.copy_to(start, &mut buf[..n]);
            if let Some(i) = buf[..n]
                .iter()
                .position(|&id| id as usize >= self.vocab_size)
            {
                return Err(Error::Data {
                    path: self.path.clone(),
                    msg: format!(
                        "token {} is id {}, outside the vocabulary of {} the header gives",
                        start + i,
                        buf[i],
                        self.vocab_size
                    ),
                });
            }
        }
        Ok(())
    }

    /// Copies ids [start, start + out.len()) into `out`.
    pub fn copy_to(&self, start: usize, out: &mut [u32]) {
        let w = self.width;
        let bytes = &self.map[HEADER + start * w..HEADER + (start + out.len()) * w];
        if w == 2 {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = u16::from_le_bytes([b[0], b[1]]) as u32;
            }
        } else {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// Where a slice's ids live: a mapped token file or a buffer in memory (the built-in demo text).
#[derive(Clone)]
pub enum TokenStore {
    Mapped(Arc<TokenFile>),
    Owned(Arc<Vec<u32>>),
}

/// A contiguous range of a token store: the training or the validation split.
#[derive(Clone)]
pub struct TokenSlice {
    store: TokenStore,
    start: usize,
    len: usize,
}

impl TokenSlice {
    pub fn whole(store: TokenStore) -> Self {
        let len = match &store {
            TokenStore::Mapped(f) => f.len(),
            TokenStore::Owned(v) => v.len(),
        };
        TokenSlice {
            store,
            start: 0,
            len,
        }
    }

    pub fn from_vec(ids: Vec<u32>) -> Self {
        Self::whole(TokenStore::Owned(Arc::new(ids)))
    }

    /// The sub-range [start, start + len) of this slice.
    pub fn sub(&self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.len, "sub-slice out of range");
        TokenSlice {
            store: self.store.clone(),
            start: self.start + start,
            len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies ids [start, start + out.len()) of this slice into `out`.
    pub fn copy_to(&self, start: usize, out: &mut [u32]) {
        assert!(start + out.len() <= self.len, "window out of range");
        let s = self.start + start;
        match &self.store {
            TokenStore::Mapped(f) => f.copy_to(s, out),
            TokenStore::Owned(v) => out.copy_from_slice(&v[s..s + out.len()]),
        }
    }

    /// All ids, in memory (for small slices and tests).
    pub fn to_vec(&self) -> Vec<u32> {
        let mut v = vec![0; self.len];
        self.copy_to(0, &mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_round_trips_u16_and_u32_ids() {
        let dir = tempfile::tempdir().unwrap();
        for (vocab, width) in [(256usize, 2u64), (70_000, 4)] {
            let path = dir.path().join(format!("t{vocab}.tokens"));
            let ids: Vec<u32> = (0..10_000u32).map(|i| (i * 7919) % vocab as u32).collect();
            let mut w = TokenWriter::create(&path, vocab).unwrap();
            w.push(&ids[..3000]).unwrap();
            w.push(&ids[3000..]).unwrap();
            w.finish().unwrap();
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(meta.len(), HEADER as u64 + width * ids.len() as u64);
            let f = TokenFile::open(&path).unwrap();
            assert_eq!(f.vocab_size, vocab);
            let s = TokenSlice::whole(TokenStore::Mapped(Arc::new(f)));
            assert_eq!(s.to_vec(), ids);
            let mut w5 = [0u32; 5];
            s.sub(100, 50).copy_to(10, &mut w5);
            assert_eq!(w5, ids[110..115]);
        }
    }

    /// Found by tests/fuzz_loaders.rs: a count of 2^63 + n (u16 ids) or 2^62 + n (u32 ids)
    /// made count × width wrap to the true length, and the first read panicked out of bounds.
    #[test]
    fn a_count_whose_size_overflows_is_rejected_not_read_out_of_bounds() {
        let dir = tempfile::tempdir().unwrap();
        for (vocab, wrap) in [(256usize, 1u64 << 63), (70_000, 1 << 62)] {
            let path = dir.path().join(format!("w{vocab}.tokens"));
            let mut w = TokenWriter::create(&path, vocab).unwrap();
            w.push(&[1, 2, 3, 4]).unwrap();
            w.finish().unwrap();
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[16..24].copy_from_slice(&(4 + wrap).to_le_bytes());
            std::fs::write(&path, bytes).unwrap();
            let e = TokenFile::open(&path).err().unwrap().to_string();
            assert!(e.contains("truncated token file"), "{e}");
        }
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_named_by_check_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.tokens");
        let mut w = TokenWriter::create(&path, 256).unwrap();
        w.push(&[1, 2, 3, 4]).unwrap();
        w.finish().unwrap();
        assert!(TokenFile::open(&path).unwrap().check_ids().is_ok());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 4..HEADER + 6].copy_from_slice(&300u16.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let e = TokenFile::open(&path)
            .unwrap()
            .check_ids()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("v.tokens") && e.contains("token 2 is id 300"),
            "{e}"
        );
    }

    #[test]
    fn truncated_token_file_is_rejected_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tokens");
        let mut w = TokenWriter::create(&path, 256).unwrap();
        w.push(&[1, 2, 3, 4]).unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        let e = TokenFile::open(&path).err().unwrap().to_string();
        assert!(e.contains("x.tokens") && e.contains("truncated"), "{e}");
    }
}
