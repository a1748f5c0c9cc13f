//! Language models trained on the corpus's windows and scored on its validation part.

use super::plan::{LmPlan, PaperSays, Variant};
use crate::config::{AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::experiments::common::{final_loss, kind_name};
use crate::experiments::corpus::{fill_windows, split, val_starts};
use crate::kernels::quant::QuantKind;
use crate::model::{Model, Workspace};
use crate::train::in_memory::{train_short, Trained};
use crate::util::thousands;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::time::Instant;

/// Salt of the training windows' generator (the model's initial weights use the seed itself).
const TRAIN_STREAM: u64 = 0x6c6d_5f77_696e_646f;

/// Mean next-byte cross-entropy (nats) over the windows at `starts` (t inputs, t targets each),
/// `batch` windows per forward pass.
pub fn window_loss(
    model: &Model,
    bytes: &[u8],
    starts: &[usize],
    t: usize,
    batch: usize,
) -> Result<f64> {
    if starts.is_empty() {
        return Err(Error::Invalid("no validation windows to score".into()));
    }
    let batch = batch.max(1);
    let mut ws = Workspace::new(model, batch, t);
    let (mut x, mut y) = (Vec::with_capacity(batch * t), Vec::with_capacity(batch * t));
    let mut sum = 0f64;
    for group in starts.chunks(batch) {
        x.clear();
        y.clear();
        for &s in group {
            x.extend(bytes[s..s + t].iter().map(|&c| c as u32));
            y.extend(bytes[s + 1..s + t + 1].iter().map(|&c| c as u32));
        }
        model.forward(&mut ws, &x, group.len(), t)?;
        sum += model.loss(&mut ws, &y)? as f64 * group.len() as f64;
    }
    Ok(sum / starts.len() as f64)
}

/// One trained language model.
#[derive(Clone, Debug, Serialize)]
pub struct LmRun {
    /// the kind's name, or the variant's label
    pub label: String,
    #[serde(serialize_with = "kind_name")]
    pub kind: AttentionKind,
    /// None for the kinds' own runs; a variant's run holds what the paper says of it
    pub variant: Option<PaperSays>,
    /// index into the plan's sizes
    pub size: usize,
    pub seed: u64,
    pub params: usize,
    pub seconds: f64,
    /// per-step training losses
    pub losses: Vec<f32>,
    /// mean loss over the validation windows (nats per byte)
    pub val_loss: f64,
    /// the same loss with the model quantised to each of the plan's `quant` formats (the
    /// kinds' own runs; none for a variant's)
    pub quant: Vec<QuantLoss>,
}

/// A model's validation loss with its linear layers and LM head quantised (weights in GGUF
/// blocks, each product's input quantised to int8 per block: `Model::quantize`, as
/// `eval --quant`).
#[derive(Clone, Debug, Serialize)]
pub struct QuantLoss {
    pub format: &'static str,
    pub val_loss: f64,
    /// parameters held in blocks, and in linear layers and the LM head all told (a matrix
    /// whose width is not a multiple of 32 stays f32)
    pub quantised_params: usize,
    pub matrix_params: usize,
}

/// `window_loss` of `model` quantised to each of `formats`.
fn quantised_losses(
    model: &Model,
    formats: &[QuantKind],
    val: (&[u8], &[usize], usize, usize),
) -> Result<Vec<QuantLoss>> {
    let (bytes, starts, t, batch) = val;
    let mut out = Vec::with_capacity(formats.len());
    for &kind in formats {
        let mut q = model.clone();
        let kept = q.quantize(kind);
        let quantised_params = q.quant.as_ref().map_or(0, |w| w.params());
        let kept_params: usize = kept
            .iter()
            .filter_map(|n| q.layout.find(n).map(|s| s.range().len()))
            .sum();
        out.push(QuantLoss {
            format: kind.as_str(),
            val_loss: window_loss(&q, bytes, starts, t, batch)?,
            quantised_params,
            matrix_params: quantised_params + kept_params,
        });
    }
    Ok(out)
}

impl LmRun {
    /// Mean training loss of the last 10 steps.
    pub fn final_loss(&self) -> f64 {
        final_loss(&self.losses)
    }
}

/// Trains one model of the plan on seeded random windows of `train` (`fill_windows`), through
/// `train_short`; the windows depend only on `seed`.
pub fn train_lm(plan: &LmPlan, config: ModelConfig, train: &[u8], seed: u64) -> Result<Trained> {
    let (b, t) = (plan.train.batch, plan.train.context);
    if train.len() < t + 1 {
        return Err(Error::Invalid(format!(
            "{} training bytes cannot hold a window of {t} bytes",
            train.len()
        )));
    }
    let fill = |rng: &mut ChaCha8Rng, x: &mut [u32], y: &mut [u32]| -> Result<usize> {
        fill_windows(rng, train, x, y, b, t);
        Ok(t)
    };
    train_short(config, &plan.train, seed, TRAIN_STREAM, fill, |_, _| {})
}

/// Trains and scores every kind at every size, then every variant, for seeds 0..seeds; `note`
/// receives one line per model. Models trained with one seed see the same windows.
pub fn run_lm(
    plan: &LmPlan,
    text: &[u8],
    variants: &[Variant],
    seeds: usize,
    mut note: impl FnMut(&str),
) -> Result<Vec<LmRun>> {
    plan.validate(variants)?;
    if seeds == 0 {
        return Err(Error::Invalid("--seeds must be at least 1".into()));
    }
    let (train, val) = split(text);
    let t = plan.train.context;
    if train.len() < 2 * (t + 1) || val.len() < t + 1 {
        return Err(Error::Invalid(format!(
            "a corpus of {} bytes is too short for windows of {t} bytes (its last 10% is the validation part)",
            text.len()
        )));
    }
    let starts = val_starts(val.len(), t, plan.val_windows);
    type Job = (String, ModelConfig, usize, Option<PaperSays>);
    let mut jobs: Vec<Job> = Vec::new();
    for s in 0..plan.sizes.len() {
        for k in AttentionKind::ALL {
            jobs.push((k.as_str().to_string(), plan.config(k, s), s, None));
        }
    }
    for v in variants {
        jobs.push((
            v.label.clone(),
            v.config.clone(),
            plan.middle(),
            Some(v.paper),
        ));
    }
    let mut runs = Vec::with_capacity(seeds * jobs.len());
    for seed in 0..seeds as u64 {
        for (label, config, size, variant) in &jobs {
            let t0 = Instant::now();
            let Trained { model, losses, .. } = train_lm(plan, config.clone(), train, seed)?;
            let val_loss = window_loss(&model, val, &starts, t, plan.train.batch)?;
            let formats = if variant.is_none() {
                &plan.quant[..]
            } else {
                &[]
            };
            let quant = quantised_losses(&model, formats, (val, &starts, t, plan.train.batch))?;
            let r = LmRun {
                label: label.clone(),
                kind: config.attention,
                variant: *variant,
                size: *size,
                seed,
                params: model.num_params(),
                seconds: t0.elapsed().as_secs_f64(),
                losses,
                val_loss,
                quant,
            };
            note(&format!(
                "lm {label} size {size} ({} params) seed {seed}: {} steps in {:.0} s, final train loss {:.3}, validation loss {:.3}",
                thousands(r.params),
                plan.train.steps,
                r.seconds,
                r.final_loss(),
                r.val_loss
            ));
            runs.push(r);
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::corpus::load_fortunes;
    use crate::infer::evaluate_loss;
    use std::path::Path;

    #[test]
    fn window_loss_on_tiling_windows_matches_evaluate_loss() {
        let config = LmPlan::quick().config(AttentionKind::DiffV1, 0);
        let t = config.max_position_embeddings;
        let model = Model::init(config, 3).unwrap();
        let text =
            load_fortunes(&Path::new(env!("CARGO_MANIFEST_DIR")).join("data/demo.txt")).unwrap();
        let bytes = &text[..5 * t + 1];
        let ids: Vec<u32> = bytes.iter().map(|&c| c as u32).collect();
        let want = evaluate_loss(&model, &ids, 2, |_, _| {}).unwrap();
        assert_eq!(want.tokens, 5 * t);
        let starts: Vec<usize> = (0..5).map(|i| i * t).collect();
        let got = window_loss(&model, bytes, &starts, t, 2).unwrap();
        assert!((got - want.loss).abs() < 1e-5, "{got} vs {}", want.loss);
        // an untrained model is close to uniform over 256 bytes
        assert!((got - 256f64.ln()).abs() < 0.1, "{got}");
    }

    #[test]
    fn training_is_deterministic_and_every_kind_sees_the_same_bytes() {
        let mut plan = LmPlan::quick();
        plan.train.steps = 3;
        let text =
            load_fortunes(&Path::new(env!("CARGO_MANIFEST_DIR")).join("data/demo.txt")).unwrap();
        let (train, _) = split(&text);
        let run = |k| train_lm(&plan, plan.config(k, 0), train, 5).unwrap().losses;
        let a = run(AttentionKind::Standard);
        assert_eq!(a, run(AttentionKind::Standard));
        assert_eq!(a.len(), 3);
        for k in AttentionKind::ALL {
            assert!((run(k)[0] - 256f32.ln()).abs() < 0.1);
        }
    }
}
