//! Text corpora: `--data` arguments (files, folders, globs) expanded to a file list, tokenized
//! once into a cached token file, split into training and validation, and sampled as random
//! windows by a seeded generator.

use super::needle::{NeedleLoss, NeedleTask};
use super::tokenizer::{Coverage, Tokenizer};
use super::tokens::{TokenFile, TokenSlice, TokenStore, TokenWriter};
use crate::error::{Error, Result};
use crate::util::{fnv1a, FNV_START};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Text is read and tokenized in pieces of about this many bytes, cut at a line end.
const PIECE: usize = 1 << 20;

/// One input file and whether the user named it (a named file must be text; a file found in a
/// folder or by a glob that does not look like UTF-8 text is skipped).
#[derive(Clone, Debug, PartialEq)]
pub struct InputFile {
    /// The file.
    pub path: PathBuf,
    /// True when the user named this file itself (not found in a folder or by a glob).
    pub named: bool,
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

fn walk(dir: &Path, out: &mut Vec<InputFile>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(dir, e)))
        .collect::<Result<_>>()?;
    entries.sort();
    for p in entries {
        let hidden = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.is_file() {
            out.push(InputFile {
                path: p,
                named: false,
            });
        }
    }
    Ok(())
}

/// Expands files, folders (recursively, sorted, hidden entries skipped) and glob patterns into
/// a list of files, each once (by canonical path, so symlinks to the same file count once).
pub fn expand_inputs(args: &[String]) -> Result<Vec<InputFile>> {
    let mut found = Vec::new();
    for a in args {
        if is_glob(a) {
            let paths = glob::glob(a).map_err(|e| Error::Data {
                path: a.into(),
                msg: format!("bad glob pattern ({e})"),
            })?;
            let before = found.len();
            for p in paths {
                let p = p.map_err(|e| {
                    let path = e.path().to_path_buf();
                    Error::io(path, e.into())
                })?;
                if p.is_dir() {
                    walk(&p, &mut found)?;
                } else if p.is_file() {
                    found.push(InputFile {
                        path: p,
                        named: false,
                    });
                }
            }
            if found.len() == before {
                return Err(Error::Data {
                    path: a.into(),
                    msg: "no file matches this pattern".into(),
                });
            }
        } else {
            let p = PathBuf::from(a);
            let meta = std::fs::metadata(&p).map_err(|e| Error::io(&p, e))?;
            if meta.is_dir() {
                let before = found.len();
                walk(&p, &mut found)?;
                if found.len() == before {
                    return Err(Error::Data {
                        path: p,
                        msg: "folder holds no files".into(),
                    });
                }
            } else {
                found.push(InputFile {
                    path: p,
                    named: true,
                });
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    found.retain(|f| seen.insert(std::fs::canonicalize(&f.path).unwrap_or(f.path.clone())));
    Ok(found)
}

/// A fingerprint of the inputs (path, size, modification time of each file) and the tokenizer:
/// equal fingerprints mean the cached token file can be reused.
pub fn fingerprint(files: &[InputFile], tokenizer: &Tokenizer) -> Result<u64> {
    let mut h = fnv1a(FNV_START, b"difftx-tokens-v1");
    h = fnv1a(h, &tokenizer.fingerprint().to_le_bytes());
    for f in files {
        let meta = std::fs::metadata(&f.path).map_err(|e| Error::io(&f.path, e))?;
        let canon = std::fs::canonicalize(&f.path).map_err(|e| Error::io(&f.path, e))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h = fnv1a(h, canon.to_string_lossy().as_bytes());
        h = fnv1a(h, &meta.len().to_le_bytes());
        h = fnv1a(h, &mtime.to_le_bytes());
        h = fnv1a(h, &[f.named as u8]);
    }
    Ok(h)
}

fn looks_like_text(path: &Path) -> Result<bool> {
    let mut head = vec![0u8; 8192];
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let n = f.read(&mut head).map_err(|e| Error::io(path, e))?;
    let head = &head[..n];
    if head.contains(&0) {
        return Ok(false);
    }
    Ok(match std::str::from_utf8(head) {
        Ok(_) => true,
        // a multi-byte character cut at the end of the sample is fine
        Err(e) => e.error_len().is_none(),
    })
}

/// What tokenizing a file list produced.
#[derive(Clone, Debug)]
pub struct Tokenized {
    /// The token file written or reused.
    pub path: PathBuf,
    /// Tokens in it.
    pub tokens: usize,
    /// Input files tokenized.
    pub files: usize,
    /// Files skipped because they are not UTF-8 text.
    pub skipped: Vec<PathBuf>,
    /// true when an existing token file was reused
    pub reused: bool,
    /// how much of the text the tokens represent (kept beside the token file for reuse)
    pub coverage: Coverage,
}

/// The file beside a token file that records its `Coverage` as "bytes lost", written only
/// when the tokenizer lost some of the text (no file: nothing lost).
fn coverage_path(tokens: &Path) -> PathBuf {
    tokens.with_extension("coverage")
}

fn read_coverage(tokens: &Path) -> Coverage {
    let text = std::fs::read_to_string(coverage_path(tokens)).unwrap_or_default();
    let mut n = text.split_whitespace().map(|x| x.parse().unwrap_or(0));
    Coverage {
        bytes: n.next().unwrap_or(0),
        lost: n.next().unwrap_or(0),
    }
}

/// Tokenizes `files` into the token file `cache_dir/<fingerprint>.tokens`, or reuses it when it
/// is already there. Text is streamed in pieces of about 1 MiB, so memory stays flat. `stop`
/// aborts between pieces (Ctrl-C during a long tokenization).
pub fn tokenize_to_cache(
    files: &[InputFile],
    tokenizer: &Tokenizer,
    cache_dir: &Path,
    stop: &AtomicBool,
) -> Result<Tokenized> {
    let fp = fingerprint(files, tokenizer)?;
    let path = cache_dir.join(format!("{fp:016x}.tokens"));
    // a damaged file (another vocabulary, ids outside it) is tokenized again, over it
    let intact = |f: &TokenFile| f.vocab_size == tokenizer.vocab_size() && f.check_ids().is_ok();
    if let Some(f) = TokenFile::open(&path).ok().filter(intact) {
        return Ok(Tokenized {
            coverage: read_coverage(&path),
            path,
            tokens: f.len(),
            files: files.len(),
            skipped: Vec::new(),
            reused: true,
        });
    }
    std::fs::create_dir_all(cache_dir).map_err(|e| Error::io(cache_dir, e))?;
    let mut w = TokenWriter::create(&path, tokenizer.vocab_size())?;
    let mut coverage = Coverage::default();
    let res = (|| {
        let mut skipped = Vec::new();
        let mut used = 0;
        let mut piece = Vec::with_capacity(PIECE + 4096);
        for f in files {
            if !f.named && !looks_like_text(&f.path)? {
                skipped.push(f.path.clone());
                continue;
            }
            used += 1;
            let file = std::fs::File::open(&f.path).map_err(|e| Error::io(&f.path, e))?;
            let mut r = BufReader::with_capacity(1 << 16, file);
            let mut offset = 0u64;
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Invalid("interrupted while tokenizing".into()));
                }
                piece.clear();
                while piece.len() < PIECE {
                    if r.read_until(b'\n', &mut piece)
                        .map_err(|e| Error::io(&f.path, e))?
                        == 0
                    {
                        break;
                    }
                }
                if piece.is_empty() {
                    break;
                }
                let text = std::str::from_utf8(&piece).map_err(|e| Error::Data {
                    path: f.path.clone(),
                    msg: format!(
                        "not UTF-8 text (invalid byte at offset {})",
                        offset + e.valid_up_to() as u64
                    ),
                })?;
                let (ids, cov) = tokenizer.encode_counted(text)?;
                coverage.add(cov);
                w.push(&ids)?;
                offset += piece.len() as u64;
            }
        }
        Ok((used, skipped))
    })();
    match res {
        Ok((used, skipped)) => {
            let tokens = w.count() as usize;
            if coverage.lost > 0 {
                let record = format!("{} {}\n", coverage.bytes, coverage.lost);
                crate::util::write_atomic(&coverage_path(&path), record.as_bytes())?;
            }
            let path = w.finish()?;
            Ok(Tokenized {
                path,
                tokens,
                files: used,
                skipped,
                reused: false,
                coverage,
            })
        }
        Err(e) => {
            w.abandon();
            Err(e)
        }
    }
}

/// Where the training text comes from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DataSpec {
    /// files, folders or glob patterns
    pub data: Vec<String>,
    /// separate validation text; when empty, the last `val_fraction` of `data` is held out
    pub val_data: Vec<String>,
    /// Fraction of `data` held out for validation when `val_data` is empty.
    pub val_fraction: f64,
}

/// The training and validation token streams.
#[derive(Clone)]
pub struct Dataset {
    /// The training tokens.
    pub train: TokenSlice,
    /// The validation tokens.
    pub val: TokenSlice,
    /// one line for the user per token file (made or reused)
    pub notes: Vec<String>,
}

impl Dataset {
    /// A dataset in memory: the last `val_fraction` of `ids` is the validation split.
    pub fn from_ids(ids: Vec<u32>, val_fraction: f64) -> Self {
        let all = TokenSlice::from_vec(ids);
        let n_val = ((all.len() as f64 * val_fraction).ceil() as usize).min(all.len());
        Dataset {
            train: all.sub(0, all.len() - n_val),
            val: all.sub(all.len() - n_val, n_val),
            notes: Vec::new(),
        }
    }
}

fn describe(args: &[String]) -> String {
    match args {
        [one] => one.clone(),
        _ => args.join(", "),
    }
}

/// Expands, tokenizes (or reuses the cached tokens in `cache_dir`) and splits the data.
pub fn prepare_dataset(
    spec: &DataSpec,
    tokenizer: &Tokenizer,
    cache_dir: &Path,
    stop: &AtomicBool,
) -> Result<Dataset> {
    if spec.data.is_empty() {
        return Err(Error::Invalid("no training data: pass --data".into()));
    }
    if spec.val_data.is_empty() && !(spec.val_fraction > 0.0 && spec.val_fraction < 1.0) {
        return Err(Error::Invalid(format!(
            "--val-fraction ({}) must be between 0 and 1 (exclusive)",
            spec.val_fraction
        )));
    }
    let mut notes = Vec::new();
    let mut load = |args: &[String], what: &str| -> Result<TokenSlice> {
        let files = expand_inputs(args)?;
        let t = tokenize_to_cache(&files, tokenizer, cache_dir, stop)?;
        notes.push(if t.reused {
            format!("{what}: {} tokens (reusing {})", t.tokens, t.path.display())
        } else {
            format!(
                "{what}: {} tokens from {} file(s){}, written to {}",
                t.tokens,
                t.files,
                if t.skipped.is_empty() {
                    String::new()
                } else {
                    format!(" ({} skipped: not UTF-8 text)", t.skipped.len())
                },
                t.path.display()
            )
        });
        match t
            .coverage
            .judge(Path::new(&describe(args)), tokenizer.file())
        {
            Ok(Some(warning)) => notes.push(warning),
            Ok(None) => {}
            Err(e) => {
                // a refused text leaves no token file to be reused
                let _ = std::fs::remove_file(&t.path);
                let _ = std::fs::remove_file(coverage_path(&t.path));
                return Err(e);
            }
        }
        if t.tokens == 0 {
            return Err(Error::Data {
                path: describe(args).into(),
                msg: format!("no {what} tokens (empty data)"),
            });
        }
        let f = TokenFile::open(&t.path)?;
        Ok(TokenSlice::whole(TokenStore::Mapped(Arc::new(f))))
    };
    let all = load(&spec.data, "training data")?;
    let (train, val) = if spec.val_data.is_empty() {
        let n_val = ((all.len() as f64 * spec.val_fraction).ceil() as usize).min(all.len());
        (
            all.sub(0, all.len() - n_val),
            all.sub(all.len() - n_val, n_val),
        )
    } else {
        let val = load(&spec.val_data, "validation data")?;
        (all, val)
    };
    Ok(Dataset { train, val, notes })
}

/// Draws random training windows with a seeded ChaCha8 generator whose position is saved in
/// checkpoints, so a resumed run draws exactly the windows the uninterrupted run would have.
pub struct WindowSampler {
    rng: ChaCha8Rng,
    seed: u64,
    /// windows drawn so far
    drawn: u64,
}

/// The sampler's saved position.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SamplerState {
    /// The seed the sampler started from.
    pub seed: u64,
    /// the ChaCha8 word position (a u128, as a decimal string)
    pub word_pos: String,
    /// Windows drawn so far.
    pub windows_drawn: u64,
}

impl WindowSampler {
    /// A sampler seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        WindowSampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            drawn: 0,
        }
    }

    /// The position to save in a checkpoint.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            seed: self.seed,
            word_pos: self.rng.get_word_pos().to_string(),
            windows_drawn: self.drawn,
        }
    }

    /// A sampler at a saved position.
    pub fn restore(s: &SamplerState) -> Result<Self> {
        let pos: u128 = s.word_pos.parse().map_err(|_| {
            Error::Invalid(format!("sampler word_pos `{}` is not a number", s.word_pos))
        })?;
        let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
        rng.set_word_pos(pos);
        Ok(WindowSampler {
            rng,
            seed: s.seed,
            drawn: s.windows_drawn,
        })
    }

    /// Fills `b` rows of inputs `x` and next-token targets `y`, each (B, T), with random
    /// windows of `data` (which must hold at least T + 1 ids).
    pub fn fill(&mut self, data: &TokenSlice, x: &mut [u32], y: &mut [u32], b: usize, t: usize) {
        let last_start = data.len() - t - 1;
        for i in 0..b {
            let s = self.rng.random_range(0..=last_start);
            data.copy_to(s, &mut x[i * t..(i + 1) * t]);
            data.copy_to(s + 1, &mut y[i * t..(i + 1) * t]);
        }
        self.drawn += b as u64;
    }

    /// Fills `b` rows with fresh needle episodes of `t` tokens (`needle::fill_rows`), drawn
    /// from the sampler's own generator, so that a resumed run continues the same sequence.
    pub fn fill_episodes(
        &mut self,
        task: &NeedleTask,
        loss: NeedleLoss,
        (x, y): (&mut [u32], &mut [u32]),
        b: usize,
        t: usize,
    ) -> Result<()> {
        super::needle::fill_rows(task, loss, &mut self.rng, (x, y), b, t)?;
        self.drawn += b as u64;
        Ok(())
    }
}

/// Trains a byte-level BPE tokenizer (GPT-2 style: bytes mapped to printable characters, so
/// every text encodes) with `vocab_size` ids on the text files of `data`, and writes it as a
/// Hugging Face `tokenizer.json` to `out`.
pub fn train_bpe(data: &[String], vocab_size: usize, out: &Path) -> Result<usize> {
    use tokenizers::models::bpe::{BpeTrainer, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    if vocab_size < 257 {
        return Err(Error::Invalid(format!(
            "--vocab-size ({vocab_size}) must be more than 256: the 256 byte symbols come first"
        )));
    }
    let files = expand_inputs(data)?;
    let mut texts = Vec::new();
    for f in &files {
        if f.named || looks_like_text(&f.path)? {
            texts.push(f.path.to_string_lossy().into_owned());
        }
    }
    if texts.is_empty() {
        return Err(Error::Data {
            path: describe(data).into(),
            msg: "no text files to train a tokenizer on".into(),
        });
    }
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    let bl = ByteLevel::new(false, true, true);
    tok.with_pre_tokenizer(Some(bl));
    tok.with_decoder(Some(bl));
    tok.with_post_processor(Some(bl));
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .show_progress(false)
        .build()
        .into();
    tok.train_from_files(&mut trainer, texts)
        .map_err(|e| Error::Data {
            path: describe(data).into(),
            msg: format!("cannot train tokenizer ({e})"),
        })?;
    let json = tok.to_string(false).map_err(|e| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot serialise tokenizer ({e})"),
    })?;
    crate::util::write_atomic(out, json.as_bytes())?;
    Ok(tok.get_vocab_size(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_restored_from_its_state_draws_the_same_windows() {
        let data = TokenSlice::from_vec((0..1000).collect());
        let (b, t) = (3, 16);
        let (mut x, mut y) = (vec![0; b * t], vec![0; b * t]);
        let mut a = WindowSampler::new(7);
        for _ in 0..5 {
            a.fill(&data, &mut x, &mut y, b, t);
        }
        let saved = a.state();
        assert_eq!(saved.windows_drawn, 15);
        let mut c = WindowSampler::restore(&saved).unwrap();
        let (mut x2, mut y2) = (vec![0; b * t], vec![0; b * t]);
        for _ in 0..3 {
            a.fill(&data, &mut x, &mut y, b, t);
            c.fill(&data, &mut x2, &mut y2, b, t);
            assert_eq!(x, x2);
        }
        // targets are the inputs shifted by one
        assert!(x.iter().zip(&y).all(|(&a, &b)| b == a + 1));
    }

    #[test]
    fn folders_and_globs_expand_once_each_and_skip_binary_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("a.txt"), "alpha\n").unwrap();
        std::fs::write(d.join("sub/b.txt"), "beta\n").unwrap();
        std::fs::write(d.join("sub/b.dat"), [0u8, 1, 2, 255]).unwrap();
        std::os::unix::fs::symlink(d.join("a.txt"), d.join("a.u8")).unwrap();
        let args = vec![
            d.to_string_lossy().into_owned(),
            format!("{}/*.txt", d.display()),
        ];
        let files = expand_inputs(&args).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| {
                f.path
                    .strip_prefix(d)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["a.txt", "sub/b.dat", "sub/b.txt"]);
        let cache = d.join("cache");
        let stop = AtomicBool::new(false);
        let t = tokenize_to_cache(&files, &Tokenizer::Bytes, &cache, &stop).unwrap();
        assert_eq!((t.tokens, t.files, t.reused), (11, 2, false));
        assert_eq!(t.skipped, [d.join("sub/b.dat")]);
        let again = tokenize_to_cache(&files, &Tokenizer::Bytes, &cache, &stop).unwrap();
        assert!(again.reused);
        assert_eq!(again.path, t.path);
        let f = TokenFile::open(&t.path).unwrap();
        let s = TokenSlice::whole(TokenStore::Mapped(Arc::new(f)));
        assert_eq!(s.to_vec(), b"alpha\nbeta\n".map(u32::from));
    }

    #[test]
    fn val_fraction_holds_out_the_tail() {
        let d = Dataset::from_ids((0..1000).collect(), 0.01);
        assert_eq!((d.train.len(), d.val.len()), (990, 10));
        assert_eq!(d.val.to_vec()[0], 990);
    }
}
