//! `POST /v1/attention`: the attention maps of a short prompt, for the page's explorer. The
//! maps are those `difftx attention-map --dump` writes (`HeadMaps::to_json`), computed on the
//! model thread between two engine steps.

use super::api::{self, ApiError, ApiResult};
use super::engine::{MapsJob, Task, MAX_MAP_TOKENS};
use super::{App, Ready};
use serde_json::{json, Value};
use std::sync::Arc;

/// The layer asked for (`None`: every layer), checked against the model.
fn layer(req: &Value, ready: &Ready) -> ApiResult<Option<usize>> {
    match req.get("layer") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(l) if (l as usize) < ready.layers => Ok(Some(l as usize)),
            _ => Err(ApiError::bad(
                "layer",
                format!(
                    "layer must be an integer from 0 to {} (the model has {} layers), got {v}",
                    ready.layers - 1,
                    ready.layers
                ),
            )),
        },
    }
}

/// `{prompt, layer?}` → `{attention, layers, heads, tokens, ids, maps: [{layer, head, lambda,
/// a1, a2, diff}]}`, every head of the layer asked for (or of every layer).
pub async fn attention(app: Arc<App>, ready: Arc<Ready>, req: Value) -> ApiResult<Value> {
    // 1. One prompt of at most MAX_MAP_TOKENS tokens, and the layers.
    let prompts = api::prompts(&req)?;
    if prompts.len() != 1 {
        return Err(ApiError::bad(
            "prompt",
            "give one prompt (a string or token ids)",
        ));
    }
    let (ids, _) = ready.encode(&prompts[0])?;
    let cap = MAX_MAP_TOKENS.min(ready.context);
    if ids.len() > cap {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "the prompt is {} tokens; the attention maps take at most {cap}",
                ids.len()
            ),
        ));
    }
    let layers: Vec<usize> = match layer(&req, &ready)? {
        Some(l) => vec![l],
        None => (0..ready.layers).collect(),
    };
    let picks: Vec<(usize, usize)> = layers
        .iter()
        .flat_map(|&l| (0..ready.heads).map(move |h| (l, h)))
        .collect();
    // 2. The maps, on the model thread.
    let job = |reply| {
        Task::Maps(MapsJob {
            prompt: ids.clone(),
            picks: picks.clone(),
            reply,
        })
    };
    let maps = app.on_model_thread(job, "attention_failed").await?;
    // 3. The answer: the tokens' texts for the axes, and each head's maps.
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| ready.tok.decode(&[id]).unwrap_or_default())
        .collect();
    let maps: Vec<Value> = picks
        .iter()
        .zip(&maps)
        .map(|(&(l, h), m)| {
            let mut v = json!({"layer": l, "head": h});
            if let (Some(o), Value::Object(x)) = (v.as_object_mut(), m.to_json()) {
                o.extend(x);
            }
            v
        })
        .collect();
    Ok(json!({
        "object": "attention", "model": app.name, "attention": ready.attention.as_str(),
        "layers": ready.layers, "heads": ready.heads, "max_tokens": MAX_MAP_TOKENS,
        "tokens": tokens, "ids": ids, "maps": maps,
    }))
}
