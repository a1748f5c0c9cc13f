//! The text corpus of the language-modelling experiment: Debian's `fortunes` (or any text
//! file), its training/validation split, and the byte windows drawn from it. Pure data, no
//! model.

use crate::error::{Error, Result};
use crate::util::thousands;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;

/// Where Debian's `fortunes` package puts its text files.
pub const FORTUNES_DIR: &str = "/usr/share/games/fortunes";
/// The share of the corpus, at its end, held out for validation.
pub const VAL_FRACTION: f64 = 0.1;

/// The corpus: every fortune text file in `path` (a folder: sorted by name, `.dat` index files,
/// symlinks such as `*.u8`, hidden files and subfolders such as `off/` skipped), concatenated
/// with a newline after any file that lacks one; or the bytes of `path` itself when it is a
/// file (any text file; the CI quick run uses data/demo.txt).
pub fn load_fortunes(path: &Path) -> Result<Vec<u8>> {
    let data = |msg: String| Error::Data {
        path: path.to_path_buf(),
        msg,
    };
    let meta = std::fs::metadata(path).map_err(|_| {
        data("not found: install Debian's `fortunes` package (`apt-get install fortunes`) or pass a text file".into())
    })?;
    if meta.is_file() {
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        if text.is_empty() {
            return Err(data("the text file is empty".into()));
        }
        return Ok(text);
    }
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .map_err(|e| Error::io(path, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(path, e)))
        .collect::<Result<_>>()?;
    files.sort();
    let mut text = Vec::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let kind = std::fs::symlink_metadata(&f).map_err(|e| Error::io(&f, e))?;
        if !kind.is_file() || name.starts_with('.') || name.ends_with(".dat") {
            continue;
        }
        let bytes = std::fs::read(&f).map_err(|e| Error::io(&f, e))?;
        text.extend_from_slice(&bytes);
        if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            text.push(b'\n');
        }
    }
    if text.is_empty() {
        return Err(data(
            "no fortune files in this folder: install Debian's `fortunes` package (`apt-get install fortunes`) or pass a text file".into(),
        ));
    }
    Ok(text)
}

/// (training, validation): the validation part is the last 10% of the bytes (rounded down).
pub fn split(text: &[u8]) -> (&[u8], &[u8]) {
    let val = (text.len() as f64 * VAL_FRACTION) as usize;
    text.split_at(text.len() - val)
}

/// One line naming the corpus and its split, for the report.
pub fn corpus_line(source: &Path, text: &[u8]) -> String {
    let (train, val) = split(text);
    format!(
        "`{}`: {} bytes, byte-level (vocabulary 256); the first {} bytes train, the last {} (10%) are validation",
        source.display(),
        thousands(text.len()),
        thousands(train.len()),
        thousands(val.len())
    )
}

/// Writes `b` windows of `t` bytes, each at a uniform random start in `train`, into `x[..b·t]`
/// and the next bytes into `y[..b·t]` (a loss on every byte).
pub fn fill_windows(
    rng: &mut ChaCha8Rng,
    train: &[u8],
    x: &mut [u32],
    y: &mut [u32],
    b: usize,
    t: usize,
) {
    let last = train.len() - t - 1;
    for r in 0..b {
        let s = rng.random_range(0..=last);
        for (i, (xi, yi)) in x[r * t..(r + 1) * t]
            .iter_mut()
            .zip(&mut y[r * t..(r + 1) * t])
            .enumerate()
        {
            *xi = train[s + i] as u32;
            *yi = train[s + i + 1] as u32;
        }
    }
}

/// Starts of `n` windows of t + 1 bytes spread evenly over `len` bytes, the first at 0 and the
/// last ending at the last byte (fewer when `len` has fewer distinct starts).
pub fn val_starts(len: usize, t: usize, n: usize) -> Vec<usize> {
    if len < t + 1 || n == 0 {
        return Vec::new();
    }
    let last = len - t - 1;
    let n = n.min(last + 1);
    if n == 1 {
        return vec![0];
    }
    (0..n).map(|i| i * last / (n - 1)).collect()
}

/// The text the language-modelling part trains on, and where it came from.
pub struct Corpus {
    pub text: Vec<u8>,
    /// one sentence for the report (`corpus_line`)
    pub line: String,
}

impl Corpus {
    /// A text file or a folder of fortune files (`load_fortunes`).
    pub fn load(path: &Path) -> Result<Self> {
        let text = load_fortunes(path)?;
        let line = corpus_line(path, &text);
        Ok(Corpus { text, line })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fortunes_load_text_files_in_name_order_skipping_dat_symlinks_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("zippy"), "yow\n%\n").unwrap();
        std::fs::write(p.join("art"), "a picture\n%\nno newline").unwrap();
        std::fs::write(p.join("art.dat"), [0u8, 1, 2, 255]).unwrap();
        std::fs::write(p.join(".hidden"), "secret").unwrap();
        std::os::unix::fs::symlink(p.join("art"), p.join("art.u8")).unwrap();
        std::fs::create_dir(p.join("off")).unwrap();
        std::fs::write(p.join("off").join("rude"), "offensive\n").unwrap();
        let text = load_fortunes(p).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "a picture\n%\nno newline\nyow\n%\n"
        );
        // a plain text file is read as it is
        assert_eq!(load_fortunes(&p.join("art")).unwrap().len(), 22);
    }

    #[test]
    fn a_missing_corpus_is_one_line_that_says_how_to_install_it() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("fortunes");
        let e = load_fortunes(&gone).unwrap_err().to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with(gone.to_str().unwrap()), "{e}");
        assert!(e.contains("apt-get install fortunes"), "{e}");
        assert!(e.contains("or pass a text file"), "{e}");
        // a folder with nothing but index files is no corpus either
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("x.dat"), [0u8; 8]).unwrap();
        let e = load_fortunes(&gone).unwrap_err().to_string();
        assert!(e.contains("no fortune files"), "{e}");
    }

    #[test]
    fn the_last_tenth_of_the_bytes_is_validation() {
        let text: Vec<u8> = (0..95u8).collect();
        let (train, val) = split(&text);
        assert_eq!((train.len(), val.len()), (86, 9));
        assert_eq!(val[0], 86);
        assert_eq!(*val.last().unwrap(), 94);
        let line = corpus_line(Path::new("demo.txt"), &[b'x'; 1000]);
        assert!(
            line.contains("the first 900 bytes train, the last 100 (10%)"),
            "{line}"
        );
    }

    #[test]
    fn training_windows_are_seeded_and_stay_inside_the_training_part() {
        use rand::SeedableRng;
        // training bytes cycle through a..z; the validation part is all Z
        let mut text: Vec<u8> = (0..900).map(|i| b'a' + (i % 26) as u8).collect();
        text.extend([b'Z'; 100]);
        let (train, _) = split(&text);
        let (b, t) = (64, 32);
        let draw = |seed: u64| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (mut x, mut y) = (vec![0u32; b * t], vec![0u32; b * t]);
            fill_windows(&mut rng, train, &mut x, &mut y, b, t);
            (x, y)
        };
        let (x, y) = draw(7);
        assert_eq!((x.clone(), y.clone()), draw(7));
        assert_ne!(x, draw(8).0);
        assert!(x.iter().chain(&y).all(|&c| c != b'Z' as u32));
        for r in 0..b {
            for i in 0..t {
                let next = b'a' as u32 + (x[r * t + i] - b'a' as u32 + 1) % 26;
                assert_eq!(y[r * t + i], next);
                if i + 1 < t {
                    assert_eq!(x[r * t + i + 1], y[r * t + i]);
                }
            }
        }
        // 64 windows of 32 in 900 bytes: the starts are spread, not stuck
        let firsts: std::collections::BTreeSet<u32> = (0..b).map(|r| x[r * t]).collect();
        assert!(firsts.len() > 10, "{firsts:?}");
        // a training part of exactly one window has one start
        let (mut x1, mut y1) = (vec![0u32; t], vec![0u32; t]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        fill_windows(&mut rng, &train[5..5 + t + 1], &mut x1, &mut y1, 1, t);
        assert_eq!(x1[0], train[5] as u32);
        assert_eq!(y1[t - 1], train[5 + t] as u32);
    }

    #[test]
    fn validation_windows_are_evenly_spaced_from_the_first_byte_to_the_last() {
        assert_eq!(val_starts(1000, 99, 4), vec![0, 300, 600, 900]);
        assert_eq!(val_starts(1000, 99, 1), vec![0]);
        // more windows than starts: one per start
        assert_eq!(val_starts(12, 9, 10), vec![0, 1, 2]);
        assert!(val_starts(9, 9, 4).is_empty());
    }
}
