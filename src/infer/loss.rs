//! Mean next-token cross-entropy of a token stream over non-overlapping context windows.

use crate::error::{Error, Result};
use crate::model::{memory::Need, Model, Workspace};

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
    Need::inference(&model.config, &[(batch.max(1), t)], 0, 0).check(&format!(
        "evaluating with --batch {batch} at a context of {t}"
    ))?;
    let mut ws = Workspace::new(model, batch.max(1), t);
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
        model.forward(&mut ws, &inputs, windows.len(), len)?;
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
