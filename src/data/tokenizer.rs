//! Tokenizers: the built-in byte-level one (token = byte, 256 ids) or any Hugging Face
//! `tokenizer.json`, read with the `tokenizers` crate.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The tokenizer's file name in a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Text ↔ token ids: the byte-level default (ids 0–255 are the bytes) or a Hugging Face tokenizer.json.
pub enum Tokenizer {
    /// Byte-level: one token per byte, 256 ids.
    Bytes,
    /// A Hugging Face tokenizer read from a tokenizer.json.
    Hf {
        /// The parsed tokenizer.
        tok: Box<tokenizers::Tokenizer>,
        /// The file it was read from (copied into checkpoints).
        path: PathBuf,
        /// FNV-1a of the file's bytes, to recognise the same tokenizer again
        hash: u64,
    },
}

/// A token's bytes in the text it was encoded from: `start..end` as a pair.
pub type Span = (usize, usize);

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.file() {
            None => write!(f, "Tokenizer(bytes)"),
            Some(p) => write!(f, "Tokenizer({})", p.display()),
        }
    }
}

impl Tokenizer {
    /// The tokenizer of a model directory: `tokenizer.json` if present, else the byte-level
    /// default (which needs a vocabulary of at least 256).
    pub fn for_model(dir: &Path, config: &ModelConfig) -> Result<Self> {
        let path = dir.join(TOKENIZER_FILE);
        if path.exists() {
            return Self::from_file(&path);
        }
        if config.vocab_size < 256 {
            return Err(Error::Data {
                path: dir.to_path_buf(),
                msg: format!(
                    "no tokenizer.json, and vocab_size {} is too small for the byte-level tokenizer (256)",
                    config.vocab_size
                ),
            });
        }
        Ok(Tokenizer::Bytes)
    }

    /// Reads a Hugging Face tokenizer.json.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = std::str::from_utf8(&bytes).map_err(|_| Error::Data {
            path: path.to_path_buf(),
            msg: "cannot read tokenizer (not UTF-8 JSON)".into(),
        })?;
        // Malformed JSON first: tokenizers 0.22 panics (`expect("Helper")` in its decoder's
        // deserializer) on some syntax errors instead of returning one.
        serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| Error::Data {
            path: path.to_path_buf(),
            msg: format!("cannot read tokenizer (malformed JSON: {e})"),
        })?;
        let tok: tokenizers::Tokenizer = text.parse().map_err(|e| Error::Data {
            path: path.to_path_buf(),
            msg: format!("cannot read tokenizer ({e})"),
        })?;
        Ok(Tokenizer::Hf {
            tok: Box::new(tok),
            path: path.to_path_buf(),
            hash: crate::util::fnv1a(crate::util::FNV_START, &bytes),
        })
    }

    /// Identifies the tokenizer: equal fingerprints tokenize every text the same way.
    pub fn fingerprint(&self) -> u64 {
        match self {
            Tokenizer::Bytes => 0x62797465,
            Tokenizer::Hf { hash, .. } => *hash,
        }
    }

    /// The `tokenizer.json` file behind this tokenizer (none for the byte-level one).
    pub fn file(&self) -> Option<&Path> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Hf { path, .. } => Some(path),
        }
    }

    /// Token ids of `text`, with the tokenizer's own special-token rules (no BOS unless its
    /// post-processor adds one).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::Hf { tok, path, .. } => tok
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| Error::Data {
                    path: path.clone(),
                    msg: format!("cannot encode text ({e})"),
                }),
        }
    }

    /// `encode`, with each token's byte range in `text` (a byte's own for the byte-level
    /// tokenizer).
    pub fn encode_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<Span>)> {
        let Tokenizer::Hf { tok, path, .. } = self else {
            return Ok((
                self.encode(text)?,
                (0..text.len()).map(|i| (i, i + 1)).collect(),
            ));
        };
        let enc = tok.encode(text, true).map_err(|e| Error::Data {
            path: path.clone(),
            msg: format!("cannot encode text ({e})"),
        })?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// `encode`, and how much of the text the tokens represent (`Coverage`): the byte-level
    /// tokenizer keeps every byte; a Hugging Face one may drop text it has no token for, or fold
    /// it into its unknown token.
    pub fn encode_counted(&self, text: &str) -> Result<(Vec<u32>, Coverage)> {
        let Tokenizer::Hf { tok, path, .. } = self else {
            let bytes = text.bytes().filter(|b| !b.is_ascii_whitespace()).count() as u64;
            return Ok((self.encode(text)?, Coverage { bytes, lost: 0 }));
        };
        let enc = tok.encode(text, true).map_err(|e| Error::Data {
            path: path.clone(),
            msg: format!("cannot encode text ({e})"),
        })?;
        // bytes that some token other than the unknown one stands for
        let unk = unk_id(tok);
        let mut kept = vec![false; text.len()];
        for (&id, &(a, b)) in enc.get_ids().iter().zip(enc.get_offsets()) {
            if Some(id) != unk {
                kept[a.min(text.len())..b.min(text.len())].fill(true);
            }
        }
        let mut cov = Coverage::default();
        for (&b, &k) in text.as_bytes().iter().zip(&kept) {
            if !b.is_ascii_whitespace() {
                cov.bytes += 1;
                cov.lost += u64::from(!k);
            }
        }
        Ok((enc.get_ids().to_vec(), cov))
    }

    /// `encode` for text a model will read: refuses a text the tokenizer mostly cannot
    /// represent (`Coverage::judge`), and returns a warning line when it loses any of it.
    pub fn encode_checked(&self, text: &str, source: &Path) -> Result<(Vec<u32>, Option<String>)> {
        let (ids, cov) = self.encode_counted(text)?;
        Ok((ids, cov.judge(source, self.file())?))
    }

    /// The text of `ids` (bytes that are not valid UTF-8 become U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Bytes => Ok(String::from_utf8_lossy(
                &ids.iter().map(|&i| i as u8).collect::<Vec<_>>(),
            )
            .into_owned()),
            Tokenizer::Hf { tok, path, .. } => tok.decode(ids, false).map_err(|e| Error::Data {
                path: path.clone(),
                msg: format!("cannot decode ids ({e})"),
            }),
        }
    }

    /// One token's bytes, as OpenAI's chat log-probabilities report them: the byte itself for
    /// the byte-level tokenizer; for a Hugging Face one, the UTF-8 of the token's text, or
    /// None where that text is not whole characters (a piece of one, decoded as U+FFFD).
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match self {
            Tokenizer::Bytes => u8::try_from(id).ok().map(|b| vec![b]),
            Tokenizer::Hf { .. } => {
                let text = self.decode(&[id]).ok()?;
                (!text.contains('\u{FFFD}')).then(|| text.into_bytes())
            }
        }
    }

    /// The end-of-text token: the config's `eos_token_id` if it has one (Hugging Face style,
    /// a number or a list whose first entry is used), else a special token of the tokenizer
    /// with a usual end-of-text name. The byte-level tokenizer has none.
    pub fn eos_id(&self, config: &ModelConfig) -> Option<u32> {
        match config.extra.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => return n.as_u64().map(|x| x as u32),
            Some(serde_json::Value::Array(a)) => {
                return a.first().and_then(|x| x.as_u64()).map(|x| x as u32)
            }
            _ => {}
        }
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Hf { tok, .. } => ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"]
                .iter()
                .find_map(|t| tok.token_to_id(t)),
        }
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Hf { tok, .. } => tok.get_vocab_size(true),
        }
    }
}

/// The unknown token of a Hugging Face tokenizer's model, if it has one.
fn unk_id(tok: &tokenizers::Tokenizer) -> Option<u32> {
    use tokenizers::models::ModelWrapper;
    let name = match tok.get_model() {
        ModelWrapper::BPE(m) => m.get_unk_token().clone(),
        ModelWrapper::WordPiece(m) => Some(m.unk_token.clone()),
        ModelWrapper::WordLevel(m) => Some(m.unk_token.clone()),
        ModelWrapper::Unigram(_) => Some("<unk>".to_string()),
    };
    name.and_then(|n| tok.token_to_id(&n))
}

/// How much of a text its tokens represent: the bytes outside whitespace, and how many of
/// them no token stands for (dropped, or folded into an unknown token). Whitespace is left out
/// because pre-tokenizers drop it by design.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Bytes of text looked at.
    pub bytes: u64,
    /// Bytes no token stands for.
    pub lost: u64,
}

impl Coverage {
    /// Above this fraction of lost bytes a text is refused: a model would train or be scored on
    /// a remnant of it.
    pub const REFUSE_ABOVE: f64 = 0.01;

    /// Adds another text's counts to these.
    pub fn add(&mut self, other: Coverage) {
        self.bytes += other.bytes;
        self.lost += other.lost;
    }

    /// The lost bytes as a fraction of all bytes.
    pub fn lost_fraction(&self) -> f64 {
        self.lost as f64 / self.bytes.max(1) as f64
    }

    /// An error above `REFUSE_ABOVE`, a warning line when anything was lost, else nothing.
    /// `source` names the text, `tokenizer` its tokenizer.json.
    pub fn judge(&self, source: &Path, tokenizer: Option<&Path>) -> Result<Option<String>> {
        if self.lost == 0 {
            return Ok(None);
        }
        let tok = tokenizer.map_or("the tokenizer".into(), |p| p.display().to_string());
        let what = format!(
            "{tok} cannot represent {} of its {} non-space bytes ({:.2}%): they are dropped or become the unknown token",
            self.lost,
            self.bytes,
            100.0 * self.lost_fraction()
        );
        if self.lost_fraction() > Self::REFUSE_ABOVE {
            return Err(Error::Data {
                path: source.to_path_buf(),
                msg: format!(
                    "{what}; refused above {}% (use a tokenizer with byte fallback, or the byte-level default)",
                    100.0 * Self::REFUSE_ABOVE
                ),
            });
        }
        Ok(Some(format!("warning: {}: {what}", source.display())))
    }
}

/// Turns a stream of token ids into text pieces that are whole UTF-8: bytes of a character
/// split across tokens are held back until the character is complete.
#[derive(Default)]
pub struct TextStream {
    ids: Vec<u32>,
    /// length of the text already handed out
    emitted: usize,
}

impl TextStream {
    /// Adds a token and returns the new complete text, possibly empty.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = tok.decode(&self.ids)?;
        // An incomplete character decodes to U+FFFD at the end: wait for the rest of it.
        let stable = text.trim_end_matches('\u{FFFD}');
        if stable.len() <= self.emitted || !stable.is_char_boundary(self.emitted) {
            return Ok(String::new());
        }
        let piece = stable[self.emitted..].to_string();
        self.emitted = stable.len();
        Ok(piece)
    }

    /// Whatever is left at the end (including replacement characters for bytes that never
    /// completed a character).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let text = tok.decode(&self.ids)?;
        let rest = if text.is_char_boundary(self.emitted) {
            text[self.emitted..].to_string()
        } else {
            String::new()
        };
        self.emitted = text.len();
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token's bytes: the byte itself for the byte-level tokenizer; for a byte-level BPE
    /// one (the Llama fixture's), the UTF-8 of whole characters, and none for the two halves
    /// of "é", which it cuts into two tokens.
    #[test]
    fn token_bytes_are_whole_characters_or_none() {
        let bytes = Tokenizer::Bytes;
        assert_eq!(bytes.token_bytes(104), Some(vec![104]));
        assert_eq!(bytes.token_bytes(0xc3), Some(vec![0xc3]));
        assert_eq!(bytes.token_bytes(300), None);
        let fixture = "tests/fixtures/hf/llama_gqa/tokenizer.json";
        let hf = Tokenizer::from_file(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(fixture)
                .as_path(),
        )
        .unwrap();
        let ids = hf.encode("hé!").unwrap();
        let got: Vec<Option<Vec<u8>>> = ids.iter().map(|&i| hf.token_bytes(i)).collect();
        let (whole, halves): (Vec<_>, Vec<_>) = got.iter().partition(|b| b.is_some());
        assert_eq!(halves.len(), 2, "{ids:?}: {got:?}");
        let text: Vec<u8> = whole.into_iter().flatten().flatten().copied().collect();
        assert_eq!(text, b"h!", "{ids:?}: {got:?}");
    }

    #[test]
    fn malformed_json_inside_the_decoder_is_an_error_not_a_panic() {
        // found by tests/fuzz_loaders.rs (seed 26): a raw newline inside a key of the decoder
        // made tokenizers 0.22 panic with "Helper"
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        let text = r#"{"version": "1.0", "decoder": {"add_prefix_sp
ce": false, "type": "ByteLevel"}, "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}"#;
        std::fs::write(&p, text).unwrap();
        let e = std::panic::catch_unwind(|| Tokenizer::from_file(&p).err().map(|e| e.to_string()))
            .expect("no panic")
            .expect("an error");
        assert!(
            e.contains("tokenizer.json: cannot read tokenizer (malformed JSON"),
            "{e}"
        );
    }
}
