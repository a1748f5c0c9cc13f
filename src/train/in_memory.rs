//! A short training run on batches made in memory (the `repro` experiments: needle episodes,
//! in-context classification, text windows): AdamW with warm-up + cosine, clipping at 1 and
//! weight decay 0.1, no checkpoints. Every experiment trains through this one loop, so the
//! kinds they compare differ only in the model.

use super::schedule::lr_at;
use super::trainer::layer_lambdas;
use super::Optimizer;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::adamw::AdamWParams;
use crate::kernels::Precision;
use crate::model::{Model, Workspace};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The schedule of a short run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShortRun {
    pub steps: u64,
    /// sequences per step
    pub batch: usize,
    /// the longest window a batch may use (the workspace's T)
    pub context: usize,
    /// peak learning rate; the cosine ends at a tenth of it
    pub lr: f32,
    pub warmup: u64,
}

/// A trained model with its per-step losses and λ per layer after each step (diff_v1: the
/// layer's λ; diff_v2: the mean σ(lambda_proj x) over the step's batch; standard: empty rows).
pub struct Trained {
    pub model: Model,
    pub losses: Vec<f32>,
    pub lambdas: Vec<Vec<f32>>,
}

/// Trains a model initialised from `seed`. Each step `fill(rng, x, y)` writes a batch of
/// `run.batch` sequences of some length t ≤ `run.context` into `x[..batch·t]` (inputs) and
/// `y[..batch·t]` (targets, `IGNORE` where no loss is wanted) and returns t. The batches' rng
/// depends only on `seed ^ stream`, so models trained with one seed see the same data.
pub fn train_short(
    config: ModelConfig,
    run: &ShortRun,
    seed: u64,
    stream: u64,
    fill: impl FnMut(&mut ChaCha8Rng, &mut [u32], &mut [u32]) -> Result<usize>,
    on_step: impl FnMut(u64, f32),
) -> Result<Trained> {
    train_short_in(config, run, Precision::F32, (seed, stream), fill, on_step)
}

/// `train_short` with the matrix products in `precision`; `seeds` is (seed, stream).
pub fn train_short_in(
    config: ModelConfig,
    run: &ShortRun,
    precision: Precision,
    (seed, stream): (u64, u64),
    mut fill: impl FnMut(&mut ChaCha8Rng, &mut [u32], &mut [u32]) -> Result<usize>,
    mut on_step: impl FnMut(u64, f32),
) -> Result<Trained> {
    let mut model = Model::init(config, seed)?;
    model.precision = precision;
    let hp = AdamWParams {
        lr: run.lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = Optimizer::new(&model, hp, 1.0);
    let (b, ctx) = (run.batch, run.context);
    let mut ws = Workspace::new(&model, b, ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ stream);
    let (mut x, mut y) = (vec![0u32; b * ctx], vec![0u32; b * ctx]);
    let mut losses = Vec::with_capacity(run.steps as usize);
    let mut lambdas = Vec::with_capacity(run.steps as usize);
    let layers = if model.config.attention.is_diff() {
        model.config.num_hidden_layers
    } else {
        0
    };
    for step in 0..run.steps {
        let t = fill(&mut rng, &mut x, &mut y)?;
        if t == 0 || t > ctx {
            return Err(Error::Invalid(format!(
                "a batch of windows of {t} tokens does not fit the context {ctx}"
            )));
        }
        let lr = lr_at(step, run.steps, run.lr, run.lr / 10.0, run.warmup);
        let s = opt.step(&mut model, &mut ws, &x[..b * t], &y[..b * t], b, t, lr)?;
        if !(s.loss.is_finite() && s.grad_norm.is_finite()) {
            return Err(Error::Invalid(format!(
                "{} seed {seed}: step {}: loss {} / gradient norm {} is not finite",
                model.config.attention,
                step + 1,
                s.loss,
                s.grad_norm
            )));
        }
        losses.push(s.loss);
        let mut lam = vec![0f32; layers];
        layer_lambdas(&model, &ws, b * t, &mut lam);
        lambdas.push(lam);
        on_step(step + 1, s.loss);
    }
    Ok(Trained {
        model,
        losses,
        lambdas,
    })
}
