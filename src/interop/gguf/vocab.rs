//! The tokenizer as GGUF metadata that llama.cpp accepts: its BPE tokenizer (`gpt2`) with the
//! GPT-2 pre-tokenizer (`gpt-2`). That covers both of difftx's tokenizers:
//!
//! - the byte-level one (token id = byte) is a BPE vocabulary of the 256 GPT-2 byte characters
//!   with no merges, so every byte stays its own token (the split into words does not matter);
//! - a `difftx tokenizer train` tokenizer.json is byte-level BPE with the GPT-2 split, which
//!   is exactly llama.cpp's `gpt-2` pre-tokenizer; its vocabulary and merges go in as they are.
//!
//! llama.cpp's converter refuses the byte-level one because it looks its pre-tokenizer up by a
//! hash of sample encodings; written directly, the metadata says what it is.

use super::format::Value;
use crate::config::ModelConfig;
use crate::data::tokenizer::{Tokenizer, TOKENIZER_FILE};
use crate::error::{Error, Result};
use serde_json::Value as Json;
use std::path::Path;

/// llama.cpp token types (llama.h `llama_token_type`)
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The byte that stands for the end of text when neither the config nor the tokenizer names
/// one: llama.cpp's BPE vocabularies always have an end-of-generation token (token 11 unless
/// told otherwise), and a vertical tab is the byte text least often holds.
const FALLBACK_EOS_BYTE: usize = 0x0B;

#[derive(Debug)]
pub struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub eos: Option<u32>,
    /// what the tokenizer is, for the export's summary line
    pub describe: String,
}

impl Vocab {
    /// The vocabulary of a model directory (its tokenizer.json, else the byte-level one),
    /// padded with unused tokens up to the model's `vocab_size`.
    pub fn for_model(dir: &Path, config: &ModelConfig) -> Result<Self> {
        // 1. The tokenizer as JSON: the file, or the byte-level one's equivalent.
        let path = dir.join(TOKENIZER_FILE);
        let json = if path.exists() {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            serde_json::from_str(&text).map_err(|e| Error::Data {
                path: path.clone(),
                msg: format!("malformed JSON ({e})"),
            })?
        } else {
            super::super::hf::byte_level_tokenizer_json()
        };
        let mut v = Self::from_json(&json, &path)?;
        // 2. Pad to the embedding's rows (llama.cpp sizes the vocabulary by the token list).
        if v.tokens.len() > config.vocab_size {
            return Err(Error::Data {
                path,
                msg: format!(
                    "the tokenizer has {} tokens but the model's vocab_size is {}",
                    v.tokens.len(),
                    config.vocab_size
                ),
            });
        }
        for i in v.tokens.len()..config.vocab_size {
            v.tokens.push(format!("[PAD{i}]"));
            v.types.push(UNUSED);
        }
        // 3. The end of text: the one generation stops at, else the fallback byte.
        let tok = Tokenizer::for_model(dir, config)?;
        let fallback = &super::super::hf::byte_chars()[FALLBACK_EOS_BYTE].to_string();
        v.eos = tok.eos_id(config).or_else(|| {
            v.tokens
                .iter()
                .position(|t| t == fallback)
                .map(|i| i as u32)
        });
        Ok(v)
    }

    /// A byte-level BPE tokenizer.json (Hugging Face format); anything llama.cpp's `gpt-2`
    /// pre-tokenizer would split differently is refused, naming the file.
    pub fn from_json(json: &Json, path: &Path) -> Result<Self> {
        let refuse = |msg: String| Error::Data {
            path: path.to_path_buf(),
            msg: format!("cannot go into a GGUF file: {msg}"),
        };
        // 1. Only byte-level BPE with the GPT-2 split (or no merges at all) maps onto llama.cpp.
        let model = &json["model"];
        if model["type"].as_str() != Some("BPE") {
            return Err(refuse(format!(
                "the tokenizer model is {}, llama.cpp's BPE needs BPE",
                model["type"]
            )));
        }
        let merges = merges(&model["merges"]).ok_or_else(|| refuse("malformed merges".into()))?;
        let pre = &json["pre_tokenizer"];
        if pre["type"].as_str() != Some("ByteLevel") || pre["add_prefix_space"] == true {
            return Err(refuse(format!(
                "the pre-tokenizer {pre} is not ByteLevel without a prefix space"
            )));
        }
        if pre["use_regex"] == false && !merges.is_empty() {
            return Err(refuse(
                "a ByteLevel pre-tokenizer without the GPT-2 split has no llama.cpp equivalent"
                    .into(),
            ));
        }
        if !json["normalizer"].is_null() {
            return Err(refuse("llama.cpp's BPE has no normalizer".into()));
        }
        // 2. Tokens by id: the vocabulary, then the added tokens; every id once, no gaps.
        let vocab = model["vocab"]
            .as_object()
            .ok_or_else(|| refuse("missing model.vocab".into()))?;
        let mut by_id: Vec<Option<(String, i32)>> = Vec::new();
        let mut place = |id: Option<u64>, text: &str, ty: i32| -> Result<()> {
            let id =
                id.ok_or_else(|| refuse(format!("token {text:?} has no integer id")))? as usize;
            if id >= by_id.len() {
                by_id.resize(id + 1, None);
            }
            by_id[id] = Some((text.to_string(), ty));
            Ok(())
        };
        for (text, id) in vocab {
            place(id.as_u64(), text, NORMAL)?;
        }
        for t in json["added_tokens"].as_array().into_iter().flatten() {
            let text = t["content"].as_str().unwrap_or_default();
            let ty = if t["special"] == true {
                CONTROL
            } else {
                USER_DEFINED
            };
            place(t["id"].as_u64(), text, ty)?;
        }
        let mut tokens = Vec::with_capacity(by_id.len());
        let mut types = Vec::with_capacity(by_id.len());
        for (id, t) in by_id.into_iter().enumerate() {
            let (text, ty) = t.ok_or_else(|| refuse(format!("no token has id {id}")))?;
            tokens.push(text);
            types.push(ty);
        }
        let describe = if merges.is_empty() {
            format!("byte-level BPE, {} tokens, no merges", tokens.len())
        } else {
            format!("BPE, {} tokens, {} merges", tokens.len(), merges.len())
        };
        Ok(Vocab {
            tokens,
            types,
            merges,
            eos: None,
            describe,
        })
    }

    /// The `tokenizer.ggml.*` keys.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        let mut kv = vec![
            (
                "tokenizer.ggml.model".to_string(),
                Value::Str("gpt2".into()),
            ),
            ("tokenizer.ggml.pre".into(), Value::Str("gpt-2".into())),
            (
                "tokenizer.ggml.tokens".into(),
                Value::strings(self.tokens.iter().cloned()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::i32s(self.types.iter().copied()),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::strings(self.merges.iter().cloned()),
            ),
        ];
        if let Some(eos) = self.eos {
            kv.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(eos)));
            kv.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)));
        }
        // difftx never adds a BOS or EOS to a prompt, and neither should llama.cpp
        kv.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)));
        kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)));
        kv
    }
}

/// BPE merges as "left right" strings: tokenizer.json writes them as such strings or, in newer
/// versions, as [left, right] pairs.
fn merges(json: &Json) -> Option<Vec<String>> {
    match json {
        Json::Null => Some(Vec::new()),
        Json::Array(items) => items
            .iter()
            .map(|m| match m {
                Json::String(s) => Some(s.clone()),
                Json::Array(p) if p.len() == 2 => {
                    Some(format!("{} {}", p[0].as_str()?, p[1].as_str()?))
                }
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_tokenizer_is_256_gpt2_byte_characters_without_merges() {
        let v = Vocab::from_json(
            &super::super::super::hf::byte_level_tokenizer_json(),
            Path::new("x"),
        )
        .unwrap();
        assert_eq!(v.tokens.len(), 256);
        assert!(v.merges.is_empty());
        // GPT-2's map: 'A' is itself, a space is Ġ (U+0120), a newline Ċ (U+010A)
        assert_eq!(v.tokens[b'A' as usize], "A");
        assert_eq!(v.tokens[b' ' as usize], "\u{120}");
        assert_eq!(v.tokens[b'\n' as usize], "\u{10A}");
        assert!(v.types.iter().all(|&t| t == NORMAL));
    }

    #[test]
    fn merges_in_either_form_and_refusals_name_the_reason() {
        let json = |merges: Json, pre: Json| {
            serde_json::json!({
                "normalizer": null, "pre_tokenizer": pre,
                "added_tokens": [{"id": 3, "content": "<|endoftext|>", "special": true}],
                "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": merges}
            })
        };
        let bl =
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true});
        let p = Path::new("tok.json");
        for m in [serde_json::json!(["a b"]), serde_json::json!([["a", "b"]])] {
            let v = Vocab::from_json(&json(m, bl.clone()), p).unwrap();
            assert_eq!(v.merges, ["a b"]);
            assert_eq!(v.tokens, ["a", "b", "ab", "<|endoftext|>"]);
            assert_eq!(v.types, [NORMAL, NORMAL, NORMAL, CONTROL]);
        }
        let no_regex =
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false});
        let e = Vocab::from_json(&json(serde_json::json!(["a b"]), no_regex), p);
        assert!(e.unwrap_err().to_string().contains("GPT-2 split"));
        let meta = serde_json::json!({"type": "Metaspace"});
        let e = Vocab::from_json(&json(serde_json::json!([]), meta), p);
        assert!(e
            .unwrap_err()
            .to_string()
            .starts_with("tok.json: cannot go into"));
    }
}
