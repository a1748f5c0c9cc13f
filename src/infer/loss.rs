//! Mean next-token cross-entropy of a token stream over non-overlapping context windows.

use crate::error::{Error, Result};
use crate::model::{memory::Need, KvCache, KvKind, Model, Workspace};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalResult {
    /// mean cross-entropy in nats per predicted token
    pub loss: f64,
    pub perplexity: f64,
    /// number of predicted tokens
    pub tokens: usize,
}

/// Splits `ids` into windows of up to T+1 tokens that overlap by one (each token is predicted
/// once, from at most T tokens of its own window), runs them `batch` at a time and averages
/// the loss over every predicted token. `progress` is called with (done, total) windows.
/// Under a bf16 or q8_0 `kv_cache`, each window goes through a cache of that kind, as
/// `generate` and `serve` run a prompt (its attention reads the cache's rounded rows): the
/// loss that the cache's rounding costs.
pub fn evaluate_loss(
    model: &Model,
    ids: &[u32],
    batch: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalResult> {
    if ids.len() < 2 {
        return Err(Error::Invalid(format!(
            "need at least 2 tokens to evaluate, got {}",
            ids.len()
        )));
    }
    let t = model.config.max_position_embeddings;
    let starts: Vec<usize> = (0..ids.len() - 1).step_by(t).collect();
    let cached = model.kv_cache != KvKind::F32;
    let caches = if cached { batch.max(1) } else { 0 };
    let kv = (caches, t, model.kv_cache);
    Need::inference(&model.config, &[(batch.max(1), t)], kv).check(&format!(
        "evaluating with --batch {batch} at a context of {t}"
    ))?;
    let mut ws = Workspace::new(model, batch.max(1), t);
    let mut caches: Vec<KvCache> = (0..caches).map(|_| KvCache::new(model, t)).collect();
    let (mut sum, mut count) = (0f64, 0usize);
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    let mut done = 0;
    // Full windows go through in batches; the one shorter tail window runs alone.
    let (full, tail): (Vec<usize>, Vec<usize>) = starts.iter().partition(|&&s| s + t < ids.len());
    for group in full
        .chunks(batch.max(1))
        .map(|g| (g, t))
        .chain(tail.chunks(1).map(|g| (g, ids.len() - 1 - g[0])))
    {
        let (windows, len) = group;
        inputs.clear();
        targets.clear();
        for &s in windows {
            inputs.extend_from_slice(&ids[s..s + len]);
            targets.extend_from_slice(&ids[s + 1..s + len + 1]);
        }
        if cached {
            let caches = &mut caches[..windows.len()];
            caches.iter_mut().for_each(KvCache::clear);
            model.forward_cached(&mut ws, caches, &inputs, len, true)?;
        } else {
            model.forward(&mut ws, &inputs, windows.len(), len)?;
        }
        let mean = model.loss(&mut ws, &targets)? as f64;
        sum += mean * (windows.len() * len) as f64;
        count += windows.len() * len;
        done += windows.len();
        progress(done, starts.len());
    }
    let loss = sum / count as f64;
    Ok(EvalResult {
        loss,
        perplexity: loss.exp(),
        tokens: count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelConfig, Preset};

    /// Windows through a bf16 or q8_0 KV cache (a batch of two and a shorter tail window)
    /// score within 0.5% of the f32 forward's loss, but not exactly it: the cache's rounded
    /// rows are what attention read.
    #[test]
    fn a_rounding_kv_cache_costs_a_little_loss_and_not_none() {
        for kind in AttentionKind::ALL {
            let mut c = ModelConfig::preset(Preset::Tiny, kind);
            c.max_position_embeddings = 32;
            let mut model = Model::init(c, 3).unwrap();
            let ids: Vec<u32> = (0..150u32).map(|i| (i * 37 + i / 5) % 256).collect();
            let want = evaluate_loss(&model, &ids, 2, |_, _| {}).unwrap();
            for kv in [KvKind::Bf16, KvKind::Q8_0] {
                model.kv_cache = kv;
                let got = evaluate_loss(&model, &ids, 2, |_, _| {}).unwrap();
                let rel = (got.loss - want.loss).abs() / want.loss;
                assert_eq!(got.tokens, want.tokens);
                assert!(
                    rel > 0.0 && rel < 5e-3,
                    "{kind} {kv}: {} vs {}",
                    got.loss,
                    want.loss
                );
            }
            model.kv_cache = KvKind::F32;
        }
    }
}
