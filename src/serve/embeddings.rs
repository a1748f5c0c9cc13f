//! `POST /v1/embeddings`: each input's embedding (`infer::embed`: the mean of the final hidden
//! states, unit length), computed on the model thread between two engine steps, as floats or,
//! with `encoding_format: "base64"` (what the `openai` client asks for by default), as the
//! little-endian f32 bytes in base64.

use super::api::{self, ApiError, ApiResult};
use super::engine::{EmbedJob, Task};
use super::{App, Ready};
use serde_json::{json, Value};
use std::sync::Arc;

/// Inputs one request may embed.
pub const MAX_INPUTS: usize = 256;

/// `{input, encoding_format?}` → `{object: "list", data: [{object: "embedding", index,
/// embedding}], model, usage}`.
pub async fn embeddings(app: Arc<App>, ready: Arc<Ready>, req: Value) -> ApiResult<Value> {
    // 1. The inputs, each 1 to the context's tokens, and the format
    let base64 = match req.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(v) if v == "float" => false,
        Some(v) if v == "base64" => true,
        Some(v) => {
            return Err(ApiError::bad(
                "encoding_format",
                format!("encoding_format must be \"float\" or \"base64\", got {v}"),
            ))
        }
    };
    let texts = api::texts_at(&req, "input")?;
    if texts.len() > MAX_INPUTS {
        return Err(ApiError::bad(
            "input",
            format!(
                "{} inputs; one request embeds at most {MAX_INPUTS}",
                texts.len()
            ),
        ));
    }
    let mut inputs = Vec::with_capacity(texts.len());
    for t in &texts {
        let (ids, _) = ready.encode_as(t, "input")?;
        if ids.len() > ready.context {
            return Err(ApiError::bad(
                "input",
                format!(
                    "an input is {} tokens, more than the model's context of {} tokens",
                    ids.len(),
                    ready.context
                ),
            ));
        }
        inputs.push(ids);
    }
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    // 2. The embeddings, on the model thread
    let vectors = app
        .on_model_thread(
            |reply| Task::Embed(EmbedJob { inputs, reply }),
            "embedding_failed",
        )
        .await?;
    // 3. The answer
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = match base64 {
                true => Value::String(base64_of(v)),
                false => json!(v),
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(json!({
        "object": "list", "data": data, "model": app.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

/// The f32 values' little-endian bytes in base64.
fn base64_of(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64_bytes(&bytes)
}

/// Standard base64 (RFC 4648, with padding).
fn base64_bytes(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for k in 0..4 {
            out.push(match k <= chunk.len() {
                true => ABC[(n >> (18 - 6 * k) & 63) as usize] as char,
                false => '=',
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// RFC 4648's test vectors; 1.0f32 is 00 00 80 3f.
    #[test]
    fn base64_matches_rfc_4648() {
        for (raw, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64_bytes(raw.as_bytes()), want);
        }
        assert_eq!(super::base64_of(&[1.0]), "AACAPw==");
    }
}
