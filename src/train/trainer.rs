//! The training loop: random windows → gradient accumulation → clipping → AdamW on a
//! warm-up + cosine schedule, periodic validation, checkpoints that resume bit for bit.
//!
//! Run folder:
//!
//! ```text
//! OUT/run.json          the resolved configuration and parameter counts
//! OUT/metrics.jsonl     one line per step (train/metrics.rs)
//! OUT/loss.png          train and validation loss, drawn by the caller (metrics::plot_run)
//! OUT/checkpoints/      step-NNNNNNNN folders (train/checkpoint.rs)
//! ```

use super::checkpoint::{
    checkpoint_name, list_checkpoints, load_latest, save_checkpoint, TrainerState,
};
use super::metrics::{MetricsLog, StepReport, METRICS_FILE};
use super::options::RunConfig;
use super::schedule::lr_at;
use super::step::Optimizer;
use crate::config::AttentionKind;
use crate::data::{Dataset, TokenSlice, WindowSampler};
use crate::error::{Error, Result};
use crate::kernels::adamw::AdamWParams;
use crate::kernels::Precision;
use crate::model::attention::lambda_full;
use crate::model::{Model, Workspace};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub const RUN_FILE: &str = "run.json";

/// Receives progress (the CLI draws a progress bar from it).
pub trait Observer {
    /// A line for the user (start summary, checkpoints, warnings).
    fn note(&mut self, _msg: &str) {}
    /// Called once before the first step with the step the run starts from.
    fn start(&mut self, _first_step: u64, _steps: u64) {}
    fn step(&mut self, _r: &StepReport) {}
}

/// An observer that ignores everything.
pub struct Silent;
impl Observer for Silent {}

/// How a call to `train` ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// updates done
    pub step: u64,
    /// true when stopped by the stop flag (SIGINT / SIGTERM) before the last step
    pub interrupted: bool,
    pub checkpoint: PathBuf,
    pub train_loss: f32,
    pub val_loss: Option<f64>,
    pub params: usize,
    pub seconds: f64,
}

fn all_finite(x: &[f32]) -> bool {
    x.iter().all(|v| v.is_finite())
}

/// Names where the forward pass first produced a non-finite value.
fn locate_forward(model: &Model, ws: &Workspace, n: usize) -> String {
    let c = &model.config;
    let dm = c.hidden_size;
    if let Some(s) = model
        .layout
        .specs
        .iter()
        .find(|s| !all_finite(&model.params[s.range()]))
    {
        return format!("parameter `{}`", s.name);
    }
    for (l, a) in ws.layers.iter().enumerate() {
        if !all_finite(&a.x_in[..n * dm]) {
            return if l == 0 {
                "the embedding (model.embed_tokens)".into()
            } else {
                format!("layer {} (model.layers.{}.mlp output)", l - 1, l - 1)
            };
        }
        if !all_finite(&a.x_mid[..n * dm]) {
            return format!("layer {l} (model.layers.{l}.self_attn output)");
        }
    }
    let last = c.num_hidden_layers - 1;
    if !all_finite(&ws.x[..n * dm]) {
        return format!("layer {last} (model.layers.{last}.mlp output)");
    }
    if !all_finite(&ws.lnf[..n * dm]) {
        return "the final norm (model.norm)".into();
    }
    "the logits (lm_head)".into()
}

/// Names the tensor whose gradient the backward pass made non-finite first (it runs from
/// lm_head down to the embedding, i.e. in reverse layout order).
fn locate_grad(model: &Model, grads: &[f32]) -> String {
    match model
        .layout
        .specs
        .iter()
        .rev()
        .find(|s| !all_finite(&grads[s.range()]))
    {
        Some(s) => {
            let layer = s
                .name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .map(|l| format!("layer {l}, "))
                .unwrap_or_default();
            format!("{layer}`{}`", s.name)
        }
        None => "no tensor (the norm overflowed)".into(),
    }
}

/// diff_v1: each layer's λ; diff_v2: each layer's mean σ(lambda_proj x) over the last
/// micro-batch (n tokens); standard: nothing.
pub(crate) fn layer_lambdas(model: &Model, ws: &Workspace, n: usize, out: &mut [f32]) {
    let c = &model.config;
    match c.attention {
        AttentionKind::DiffV1 => {
            for (l, p) in model.layout.layers.iter().enumerate() {
                let r = p.lambdas.as_ref().expect("diff_v1 has lambdas");
                let w = &model.params;
                let v = [
                    &w[r[0].range()],
                    &w[r[1].range()],
                    &w[r[2].range()],
                    &w[r[3].range()],
                ];
                out[l] = lambda_full(v, c.lambda_init_at(l)).0;
            }
        }
        AttentionKind::DiffV2 => {
            let h = c.num_attention_heads;
            for (l, a) in ws.layers.iter().enumerate() {
                let s: f64 = a.lam[..n * h].iter().map(|&x| x as f64).sum();
                out[l] = (s / (n * h) as f64) as f32;
            }
        }
        AttentionKind::Standard => {}
    }
}

/// Evenly spaced validation windows, scored in batches of `b` with the training workspace.
/// Deterministic and free of the sampler, so validation never changes the training run.
#[allow(clippy::too_many_arguments)]
fn validate(
    model: &Model,
    ws: &mut Workspace,
    val: &TokenSlice,
    windows: usize,
    b: usize,
    t: usize,
    x: &mut [u32],
    y: &mut [u32],
) -> Result<f64> {
    let n = windows.min((val.len() - 1) / t).max(1);
    let span = val.len() - t - 1;
    let (mut sum, mut count) = (0f64, 0usize);
    let mut i = 0;
    while i < n {
        let rows = b.min(n - i);
        for r in 0..rows {
            let s = if n > 1 { (i + r) * span / (n - 1) } else { 0 };
            val.copy_to(s, &mut x[r * t..(r + 1) * t]);
            val.copy_to(s + 1, &mut y[r * t..(r + 1) * t]);
        }
        model.forward(ws, &x[..rows * t], rows, t)?;
        sum += model.loss(ws, &y[..rows * t])? as f64 * rows as f64;
        count += rows;
        i += rows;
    }
    Ok(sum / count as f64)
}

/// Checks that the data holds at least one window, naming the split and the numbers.
pub fn check_windows(data: &Dataset, t: usize) -> Result<()> {
    for (what, s, hint) in [
        (
            "training data",
            &data.train,
            "use more text or a shorter --max-position-embeddings",
        ),
        (
            "validation split",
            &data.val,
            "raise --val-fraction, pass --val-data or shorten --max-position-embeddings",
        ),
    ] {
        if s.len() < t + 1 {
            return Err(Error::Invalid(format!(
                "{what} has {} tokens, fewer than one window of {} (context {t} + 1); {hint}",
                s.len(),
                t + 1
            )));
        }
    }
    Ok(())
}

fn threads() -> usize {
    rayon::current_num_threads()
}

/// Trains (or, with `resume`, continues) the run `run` on `data` in the folder `out`.
/// `tokenizer` is the tokenizer.json to ship in checkpoints (none for byte-level). Stops
/// cleanly, with a checkpoint, when `stop` becomes true.
pub fn train(
    run: &RunConfig,
    data: &Dataset,
    out: &Path,
    tokenizer: Option<&Path>,
    resume: bool,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<Outcome> {
    let started = Instant::now();
    let tc = &run.train;
    let (b, t) = (tc.batch, run.model.max_position_embeddings);
    check_windows(data, t)?;

    // ---- fresh start or resume ----
    let existing = list_checkpoints(out)?;
    if !resume {
        if let Some((_, last)) = existing.last() {
            return Err(Error::Invalid(format!(
                "{} already holds a training run (checkpoint {}); pass --resume to continue it or choose another --out",
                out.display(),
                last.file_name().unwrap_or_default().to_string_lossy()
            )));
        }
    }
    let (restored, notes) = if resume {
        load_latest(out)?
    } else {
        (None, Vec::new())
    };
    for n in &notes {
        observer.note(n);
    }
    let hp = AdamWParams {
        lr: tc.lr,
        beta1: tc.beta1,
        beta2: tc.beta2,
        eps: tc.adam_eps,
        weight_decay: tc.weight_decay,
    };
    let (mut model, mut opt, mut sampler, first_step, mut tokens_seen) = match restored {
        Some(r) => {
            if let Some((k, was, now)) = r.run.first_difference(run) {
                return Err(Error::Invalid(format!(
                    "--resume: {k} is {now}, but the run in {} used {was}",
                    r.dir.display()
                )));
            }
            if r.state.threads != threads() {
                observer.note(&format!(
                    "note: the run was written with {} threads and resumes with {}; losses will not match the uninterrupted run bit for bit",
                    r.state.threads,
                    threads()
                ));
            }
            let mut opt = Optimizer::new(&r.model, hp, tc.clip);
            opt.m = r.m;
            opt.v = r.v;
            opt.t = r.state.adam_t;
            observer.note(&format!(
                "resuming from {} (step {})",
                r.dir.display(),
                r.state.step
            ));
            (
                r.model,
                opt,
                WindowSampler::restore(&r.state.sampler)?,
                r.state.step,
                r.state.tokens_seen,
            )
        }
        None => {
            let model = Model::init(run.model.clone(), tc.seed)?;
            let opt = Optimizer::new(&model, hp, tc.clip);
            (model, opt, WindowSampler::new(tc.seed ^ 0x5eed_da7a), 0, 0)
        }
    };
    // a run with `bf16 = true` (`--bf16`) multiplies in bf16, on a CPU that can
    model.precision = Precision::new(run.train.bf16).ok_or_else(|| {
        Error::Invalid("this run uses bf16 matrix products, which need AVX512_BF16".into())
    })?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let params = model.num_params();
    let run_json = serde_json::json!({
        "run": run.to_json(),
        "params": params,
        "threads": threads(),
    });
    crate::util::write_atomic(
        &out.join(RUN_FILE),
        serde_json::to_string_pretty(&run_json)
            .expect("json")
            .as_bytes(),
    )?;
    let mut log = MetricsLog::open(&out.join(METRICS_FILE), first_step)?;

    // ---- buffers, all allocated before the loop ----
    let mut ws = Workspace::new(&model, b, t);
    let (mut x, mut y) = (vec![0u32; b * t], vec![0u32; b * t]);
    let mut lambdas = vec![0f32; model.config.num_hidden_layers];
    let lambda_len = if run.model.attention == AttentionKind::Standard {
        0
    } else {
        lambdas.len()
    };
    let tokens_per_step = tc.tokens_per_step(t);
    let mut last_saved: Option<(u64, PathBuf)> = list_checkpoints(out)?
        .into_iter()
        .rev()
        .find(|(s, _)| *s == first_step);
    let (mut last_loss, mut last_val) = (f32::NAN, None);

    let save = |model: &Model,
                opt: &Optimizer,
                sampler: &WindowSampler,
                step: u64,
                tokens_seen: u64|
     -> Result<PathBuf> {
        if !(all_finite(&model.params) && all_finite(&opt.m) && all_finite(&opt.v)) {
            return Err(Error::Invalid(format!(
                "step {step}: parameters or optimizer moments are not finite; not saving over the last good checkpoint"
            )));
        }
        let state = TrainerState {
            format: 1,
            step,
            adam_t: opt.t,
            sampler: sampler.state(),
            tokens_seen,
            threads: threads(),
            run: run.to_json(),
        };
        save_checkpoint(out, model, opt, &state, tokenizer, tc.keep_last).map_err(|e| {
            let prev = list_checkpoints(out)
                .ok()
                .and_then(|v| v.last().map(|(s, _)| checkpoint_name(*s)))
                .map_or("no earlier checkpoint exists".to_string(), |n| {
                    format!("the previous checkpoint {n} is intact")
                });
            Error::Invalid(format!(
                "cannot write checkpoint {} ({e}); {prev}",
                checkpoint_name(step)
            ))
        })
    };

    observer.start(first_step, tc.steps);
    let mut step = first_step;
    while step < tc.steps {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t0 = Instant::now();
        let lr = lr_at(step, tc.steps, tc.lr, tc.min_lr, tc.warmup);
        // The step's compute is one call on the pool, its workers kept awake (kernels::on_pool).
        let (loss, grad_norm) = crate::kernels::on_pool(|| -> Result<(f32, f32)> {
            opt.zero_grad();
            let mut loss_sum = 0f32;
            for _ in 0..tc.grad_accum {
                sampler.fill(&data.train, &mut x, &mut y, b, t);
                let loss = opt.accumulate(&model, &mut ws, &x, &y, b, t)?;
                if !loss.is_finite() {
                    return Err(Error::Invalid(format!(
                        "step {}: the loss is {loss}; the first non-finite value is in {}; stopped without saving (last good checkpoint: {})",
                        step + 1,
                        locate_forward(&model, &ws, b * t),
                        last_saved.as_ref().map_or("none".into(), |(s, _)| checkpoint_name(*s))
                    )));
                }
                loss_sum += loss;
            }
            let loss = loss_sum / tc.grad_accum as f32;
            if tc.grad_accum > 1 {
                opt.scale_grads(1.0 / tc.grad_accum as f32);
            }
            let grad_norm = opt.grad_norm();
            if !grad_norm.is_finite() {
                return Err(Error::Invalid(format!(
                    "step {}: the gradient norm is {grad_norm}; the first non-finite gradient is in {}; stopped without saving (last good checkpoint: {})",
                    step + 1,
                    locate_grad(&model, &opt.grads),
                    last_saved.as_ref().map_or("none".into(), |(s, _)| checkpoint_name(*s))
                )));
            }
            opt.apply(&mut model, grad_norm, lr);
            Ok((loss, grad_norm))
        })?;
        step += 1;
        tokens_seen += tokens_per_step;
        layer_lambdas(&model, &ws, b * t, &mut lambdas);
        let tokens_per_s = tokens_per_step as f64 / t0.elapsed().as_secs_f64();
        let val_loss = if step % tc.eval_every == 0 || step == tc.steps {
            let v = validate(
                &model,
                &mut ws,
                &data.val,
                tc.val_batches * b,
                b,
                t,
                &mut x,
                &mut y,
            )?;
            last_val = Some(v);
            Some(v)
        } else {
            None
        };
        last_loss = loss;
        let report = StepReport {
            step,
            steps: tc.steps,
            loss,
            lr,
            grad_norm,
            tokens_per_s,
            lambda: &lambdas[..lambda_len],
            val_loss,
        };
        log.write(&report)?;
        observer.step(&report);
        if (tc.ckpt_every > 0 && step % tc.ckpt_every == 0) || step == tc.steps {
            let p = save(&model, &opt, &sampler, step, tokens_seen)?;
            last_saved = Some((step, p));
        }
    }
    let interrupted = step < tc.steps;
    let checkpoint = match &last_saved {
        Some((s, p)) if *s == step => p.clone(),
        _ => {
            let p = save(&model, &opt, &sampler, step, tokens_seen)?;
            last_saved = Some((step, p.clone()));
            p
        }
    };
    let _ = last_saved;
    Ok(Outcome {
        step,
        interrupted,
        checkpoint,
        train_loss: last_loss,
        val_loss: last_val,
        params,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelConfig, Preset};

    #[test]
    fn a_non_finite_gradient_is_located_at_the_tensor_the_backward_reaches_first() {
        let c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        let model = Model::init(c, 0).unwrap();
        let mut grads = vec![0.0f32; model.num_params()];
        for name in [
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.1.self_attn.lambda_q1",
        ] {
            let r = model.layout.find(name).unwrap().range();
            grads[r.start + 1] = f32::NAN;
        }
        // the backward runs from the top: layer 1 before layer 0
        assert_eq!(
            locate_grad(&model, &grads),
            "layer 1, `model.layers.1.self_attn.lambda_q1`"
        );
    }

    #[test]
    fn a_non_finite_activation_is_located_at_the_first_sublayer_that_made_it() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::Standard);
        c.max_position_embeddings = 8;
        let mut model = Model::init(c, 0).unwrap();
        let mut ws = Workspace::new(&model, 1, 8);
        let x: Vec<u32> = (0..8).collect();
        model.forward(&mut ws, &x, 1, 8).unwrap();
        assert_eq!(locate_forward(&model, &ws, 8), "the logits (lm_head)");
        // A non-finite value planted in a saved activation is attributed to the sublayer that
        // wrote it (whether huge weights overflow depends on the summation order, so the
        // activations are set directly).
        ws.layers[1].x_mid[5] = f32::NAN;
        assert_eq!(
            locate_forward(&model, &ws, 8),
            "layer 1 (model.layers.1.self_attn output)"
        );
        ws.layers[1].x_in[3] = f32::INFINITY;
        assert_eq!(
            locate_forward(&model, &ws, 8),
            "layer 0 (model.layers.0.mlp output)"
        );
        model.forward(&mut ws, &x, 1, 8).unwrap();
        ws.x[7] = f32::NEG_INFINITY;
        assert_eq!(
            locate_forward(&model, &ws, 8),
            "layer 1 (model.layers.1.mlp output)"
        );
        let r = model
            .layout
            .find("model.layers.1.mlp.down_proj.weight")
            .unwrap()
            .range();
        model.params[r].fill(f32::INFINITY);
        model.forward(&mut ws, &x, 1, 8).unwrap();
        assert_eq!(
            locate_forward(&model, &ws, 8),
            "parameter `model.layers.1.mlp.down_proj.weight`"
        );
    }
}
