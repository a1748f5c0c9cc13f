//! Mean next-token cross-entropy of a token stream over non-overlapping context windows.

use crate::error::{Error, Result};
use crate::model::{memory::Need, KvCache, KvKind, Model, Workspace};

#[derive(Clone, Copy, Debug, PartialEq)]
/// The mean next-token loss of a text under a model.
pub struct EvalResult {
    /// mean cross-entropy in nats per predicted token
    pub loss: f64,
    /// exp(loss).
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
///
/// ```
/// use difftx::prelude::*;
///
/// let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::Standard), 0)?;
/// let ids = Tokenizer::Bytes.encode(&"a text to score. ".repeat(20))?;
/// let r = evaluate_loss(&model, &ids, 4, |_done, _total| {})?;
/// assert_eq!(r.tokens, ids.len() - 1);
/// // an untrained model is about uniform over the 256 bytes: loss near ln 256
/// assert!((r.loss - 256f64.ln()).abs() < 0.5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn evaluate_loss(
    model: &Model,
    ids: &[u32],
    batch: usize,
    progress: impl FnMut(usize, usize),
) -> Result<EvalResult> {
    let t = model.config.max_position_embeddings;
    score_windows(model, ids, batch, t, None, progress)
}

/// `evaluate_loss` over windows of `len` tokens (at most the model's context), keeping the
/// loss at every position of a window as well: the long-sequence curve of the paper's
/// Figure 6 (`ByPosition::buckets`).
pub fn evaluate_by_position(
    model: &Model,
    ids: &[u32],
    batch: usize,
    len: usize,
    progress: impl FnMut(usize, usize),
) -> Result<(EvalResult, ByPosition)> {
    let mut at = ByPosition {
        sum: vec![0.0; len],
        count: vec![0; len],
    };
    let r = score_windows(model, ids, batch, len, Some(&mut at), progress)?;
    Ok((r, at))
}

/// The summed loss and the number of predicted tokens at each position of a window: position
/// p is the prediction of the window's token p + 1 from the p + 1 tokens before it.
#[derive(Clone, Debug, PartialEq)]
pub struct ByPosition {
    /// Summed loss at each position.
    pub sum: Vec<f64>,
    /// Predicted tokens at each position.
    pub count: Vec<u64>,
}

/// The positions `start..end` of a window: their mean loss, and the mean over every position
/// up to `end` (the paper's cumulative average).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Bucket {
    /// First position of the bucket.
    pub start: usize,
    /// One past its last position.
    pub end: usize,
    /// Predicted tokens in the bucket.
    pub tokens: u64,
    /// Their mean loss, in nats.
    pub loss: f64,
    /// Mean loss over every position up to `end`.
    pub cumulative: f64,
}

impl ByPosition {
    /// `k` buckets of equal width (the last takes the remainder) over the positions that
    /// were scored; a bucket no token fell in is left out.
    pub fn buckets(&self, k: usize) -> Vec<Bucket> {
        let n = self.count.iter().rposition(|&c| c > 0).map_or(0, |p| p + 1);
        let width = n.div_ceil(k.max(1)).max(1);
        let (mut total, mut total_count) = (0.0, 0u64);
        (0..n)
            .step_by(width)
            .filter_map(|start| {
                let end = (start + width).min(n);
                let sum: f64 = self.sum[start..end].iter().sum();
                let tokens: u64 = self.count[start..end].iter().sum();
                total += sum;
                total_count += tokens;
                (tokens > 0).then(|| Bucket {
                    start,
                    end,
                    tokens,
                    loss: sum / tokens as f64,
                    cumulative: total / total_count as f64,
                })
            })
            .collect()
    }
}

/// The windows of `t` tokens through the model (see `evaluate_loss`), each token's loss added
/// to `at` by its position when asked.
fn score_windows(
    model: &Model,
    ids: &[u32],
    batch: usize,
    t: usize,
    mut at: Option<&mut ByPosition>,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalResult> {
    // 1. The call checked, memory included
    let ctx = model.config.max_position_embeddings;
    if ids.len() < 2 {
        return Err(Error::Invalid(format!(
            "need at least 2 tokens to evaluate, got {}",
            ids.len()
        )));
    }
    if t == 0 || t > ctx {
        return Err(Error::Invalid(format!(
            "windows of {t} tokens: must be between 1 and the model's context ({ctx})"
        )));
    }
    let batch = batch.max(1);
    let starts: Vec<usize> = (0..ids.len() - 1).step_by(t).collect();
    let cached = model.kv_cache != KvKind::F32;
    let caches = if cached { batch } else { 0 };
    let kv = (caches, t, model.kv_cache);
    Need::inference(&model.config, &[(batch, t)], kv).check(&format!(
        "evaluating with --batch {batch} at a context of {t}"
    ))?;
    // 2. Full windows in batches; the one shorter tail window alone
    let mut ws = Workspace::for_inference(model, batch, t);
    let mut caches: Vec<KvCache> = (0..caches).map(|_| KvCache::new(model, t)).collect();
    let (mut sum, mut count) = (0f64, 0usize);
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    let mut done = 0;
    let (full, tail): (Vec<usize>, Vec<usize>) = starts.iter().partition(|&&s| s + t < ids.len());
    for group in full
        .chunks(batch)
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
        // 3. Each token's loss by its position, when asked
        if let Some(at) = at.as_deref_mut() {
            for (i, &l) in ws.losses[..windows.len() * len].iter().enumerate() {
                at.sum[i % len] += l as f64;
                at.count[i % len] += 1;
            }
        }
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

    /// The loss by position averages back to the overall loss (every bucket's tokens, with
    /// a shorter tail window), the cumulative mean of the last bucket is that loss, and
    /// windows of the model's context give `evaluate_loss`'s figures.
    #[test]
    fn the_loss_by_position_averages_to_the_overall_loss() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        c.max_position_embeddings = 32;
        let model = Model::init(c, 5).unwrap();
        let ids: Vec<u32> = (0..150u32).map(|i| (i * 91 + i / 3) % 256).collect();
        let plain = evaluate_loss(&model, &ids, 2, |_, _| {}).unwrap();
        let (r, at) = evaluate_by_position(&model, &ids, 2, 32, |_, _| {}).unwrap();
        assert_eq!(r, plain);
        for len in [32, 20] {
            let (r, at) = evaluate_by_position(&model, &ids, 3, len, |_, _| {}).unwrap();
            let b = at.buckets(5);
            let tokens: u64 = b.iter().map(|b| b.tokens).sum();
            assert_eq!(tokens as usize, r.tokens);
            let mean = b.iter().map(|b| b.loss * b.tokens as f64).sum::<f64>() / tokens as f64;
            assert!(
                (mean - r.loss).abs() < 1e-6 * r.loss,
                "{mean} vs {}",
                r.loss
            );
            let last = b.last().unwrap().cumulative;
            assert!(
                (last - r.loss).abs() < 1e-6 * r.loss,
                "{last} vs {}",
                r.loss
            );
            assert_eq!((b[0].start, b.last().unwrap().end), (0, len));
        }
        // positions differ: the first one sees one token, the last 31
        assert!(at.sum[0] / at.count[0] as f64 != at.sum[31] / at.count[31] as f64);
        assert!(evaluate_by_position(&model, &ids, 2, 33, |_, _| {}).is_err());
    }
}
