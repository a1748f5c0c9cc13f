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
    checkpoint_name, ensure_fresh, latest_run, list_checkpoints, load_latest, lock_run,
    save_checkpoint, TrainerState,
};
use super::metrics::{MetricsLog, StepReport, METRICS_FILE};
use super::options::{RunConfig, TrainOptions};
use super::step::Optimizer;
use crate::config::AttentionKind;
use crate::data::needle::{NeedleLoss, NeedleTask};
use crate::data::{Dataset, TokenSlice, Tokenizer, WindowSampler};
use crate::error::{Error, Result};
use crate::kernels::adamw::AdamWParams;
use crate::kernels::Precision;
use crate::model::attention::lambda_full;
use crate::model::{memory::Need, Model, Workspace};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The run folder's record of its resolved configuration.
pub const RUN_FILE: &str = "run.json";

/// Receives progress (the CLI draws a progress bar from it).
pub trait Observer {
    /// A line for the user (start summary, checkpoints, warnings).
    fn note(&mut self, _msg: &str) {}
    /// Called once before the first step with the step the run starts from.
    fn start(&mut self, _first_step: u64, _steps: u64) {}
    /// Called after every step.
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
    /// the step this process started from (0, or the checkpoint it resumed)
    pub first_step: u64,
    /// true when stopped by the stop flag (SIGINT / SIGTERM) before the last step
    pub interrupted: bool,
    /// The checkpoint directory saved last (a model directory).
    pub checkpoint: PathBuf,
    /// Training loss of the last step.
    pub train_loss: f32,
    /// The last validation loss.
    pub val_loss: Option<f64>,
    /// Parameters of the model.
    pub params: usize,
    /// Seconds this call took.
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

/// Evenly spaced validation windows, scored in batches of `b` with the training workspace
/// and token buffers. Deterministic and free of the sampler, so validation never changes the
/// training run.
fn validate(
    model: &Model,
    bufs: &mut LoopBuffers,
    val: &TokenSlice,
    windows: usize,
    b: usize,
    t: usize,
) -> Result<f64> {
    let LoopBuffers { ws, x, y, .. } = bufs;
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

/// A run about to start or resume: its resolved settings, its tokenizer, and its options as
/// given (on resume: the recorded run's `minimal_options` under the ones given now).
pub struct PreparedRun {
    /// The resolved run.
    pub run: RunConfig,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// The options as given.
    pub options: TrainOptions,
}

/// Resolves what a run in `out` will do, before anything is written: on `resume` the settings
/// recorded by its newest checkpoint are the base that `opts` overlays (and any setting given
/// again must agree with them); otherwise `out` must hold no run yet. `extend_steps` adds steps
/// past the recorded end at the final learning rate (`RunConfig::extended`).
pub fn prepare_run(
    opts: &TrainOptions,
    out: &Path,
    resume: bool,
    extend_steps: Option<u64>,
) -> Result<PreparedRun> {
    let recorded = if resume {
        latest_run(out)?
    } else {
        ensure_fresh(out)?;
        None
    };
    let recorded = match (recorded, extend_steps) {
        (r, None) => r,
        (Some(r), Some(n)) if opts.steps.is_none() && opts.decay_steps.is_none() => {
            Some(r.extended(n))
        }
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "--extend-steps sets the run's --steps and --decay-steps; give neither".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(Error::Invalid(format!(
                "--extend-steps continues a run, but {} holds none (it needs --resume and a checkpoint)",
                out.display()
            )))
        }
    };
    let (opts, given) = match &recorded {
        Some(r) => (
            r.to_options().overlaid(opts),
            r.minimal_options().overlaid(opts),
        ),
        None => (opts.clone(), opts.clone()),
    };
    // A run that starts from a model (`--init-from`) takes its config and tokenizer from it;
    // resumed, from what it recorded.
    let (opts, base) = match (&recorded, &opts.init_from) {
        (None, Some(from)) => {
            let (o, config, _) = super::init_from::options_from_model(&opts, from)?;
            (o, Some(config))
        }
        (Some(r), Some(_)) => (opts, r.init_from.as_ref().map(|_| r.model.clone())),
        _ => (opts, None),
    };
    let tokenizer = match &opts.tokenizer {
        Some(p) => Tokenizer::from_file(p)?,
        None => Tokenizer::Bytes,
    };
    let mut run = opts.resolve(tokenizer.vocab_size())?;
    if let Some(mut base) = base {
        // the model's config whole (keys difftx does not read included), at the run's context
        // and RoPE base (context extension changes both)
        base.max_position_embeddings = run.model.max_position_embeddings;
        base.rope_theta = run.model.rope_theta;
        run.model = base;
    }
    if let Some(r) = &recorded {
        run.check_resumes(r, out)?;
    }
    let (b, t) = (run.train.batch, run.model.max_position_embeddings);
    Need::training(&run.model, b, t)
        .check(&format!("training with --batch {b} and --context {t}"))?;
    if run.data.data.is_empty() {
        return Err(Error::Invalid(
            "no training data: pass --data FILE|FOLDER|GLOB".into(),
        ));
    }
    Ok(PreparedRun {
        run,
        tokenizer,
        options: given,
    })
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

/// Where a run stands: the model, its optimizer and sampler, and how far it has come.
struct RunState {
    model: Model,
    opt: Optimizer,
    sampler: WindowSampler,
    step: u64,
    tokens_seen: u64,
}

/// The buffers of the loop, all allocated before the first step.
struct LoopBuffers {
    ws: Workspace,
    x: Vec<u32>,
    y: Vec<u32>,
    lambdas: Vec<f32>,
    /// how many of `lambdas` a step reports (none for `standard`)
    lambda_len: usize,
}

/// Writes the run's checkpoints and remembers the newest one, for messages and the end.
struct Checkpointer<'a> {
    run: &'a RunConfig,
    out: &'a Path,
    tokenizer: Option<&'a Path>,
    last: Option<(u64, PathBuf)>,
}

impl Checkpointer<'_> {
    /// The newest checkpoint's name, or "none".
    fn last_name(&self) -> String {
        self.last
            .as_ref()
            .map_or("none".into(), |(s, _)| checkpoint_name(*s))
    }

    /// Saves `state` as a checkpoint, refusing non-finite values so that the last good
    /// checkpoint is never overwritten by a broken one.
    fn save(&mut self, state: &RunState) -> Result<PathBuf> {
        let (model, opt, step) = (&state.model, &state.opt, state.step);
        if !(all_finite(&model.params) && all_finite(&opt.m) && all_finite(&opt.v)) {
            return Err(Error::Invalid(format!(
                "step {step}: parameters or optimizer moments are not finite; not saving over the last good checkpoint"
            )));
        }
        let trainer_state = TrainerState {
            format: 1,
            step,
            adam_t: opt.t,
            sampler: state.sampler.state(),
            tokens_seen: state.tokens_seen,
            threads: threads(),
            run: self.run.to_json(),
        };
        let keep = self.run.train.keep_last;
        let out = self.out;
        let p = save_checkpoint(out, model, opt, &trainer_state, self.tokenizer, keep).map_err(
            |e| {
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
            },
        )?;
        self.last = Some((step, p.clone()));
        Ok(p)
    }
}

/// A fresh model and optimizer, or the newest complete checkpoint of `out` on `resume`.
fn start_or_resume(
    run: &RunConfig,
    out: &Path,
    resume: bool,
    observer: &mut dyn Observer,
) -> Result<RunState> {
    let tc = &run.train;
    let hp = AdamWParams {
        lr: tc.lr,
        beta1: tc.beta1,
        beta2: tc.beta2,
        eps: tc.adam_eps,
        weight_decay: tc.weight_decay,
    };
    if !resume {
        ensure_fresh(out)?;
    }
    let (restored, notes) = if resume {
        load_latest(out)?
    } else {
        (None, Vec::new())
    };
    for n in &notes {
        observer.note(n);
    }
    let Some(r) = restored else {
        let model = match &run.init_from {
            Some(dir) => {
                observer.note(&format!("starting from the weights of {}", dir.display()));
                super::init_from::start_from(dir, &run.model)?
            }
            None => Model::init(run.model.clone(), tc.seed)?,
        };
        let opt = Optimizer::new(&model, hp, tc.clip);
        let sampler = WindowSampler::new(tc.seed ^ 0x5eed_da7a);
        return Ok(RunState {
            model,
            opt,
            sampler,
            step: 0,
            tokens_seen: 0,
        });
    };
    run.check_resumes(&r.run, &r.dir)?;
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
    Ok(RunState {
        model: r.model,
        opt,
        sampler: WindowSampler::restore(&r.state.sampler)?,
        step: r.state.step,
        tokens_seen: r.state.tokens_seen,
    })
}

/// Writes `OUT/run.json`: the resolved run, its parameter count and the thread count.
fn write_run_file(run: &RunConfig, out: &Path, params: usize) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
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
    )
}

/// What a run trains on: random windows of the training tokens, or needle episodes over
/// them (`--needles`).
enum Batches<'a> {
    Windows(&'a TokenSlice),
    Needles(NeedleTask, NeedleLoss),
}

impl<'a> Batches<'a> {
    /// The run's batches over `data`: a `--needles` run's filler is the training split's bytes.
    fn new(run: &RunConfig, data: &'a Dataset) -> Result<Self> {
        let Some(nt) = &run.train.needle else {
            return Ok(Batches::Windows(&data.train));
        };
        let text: Vec<u8> = data.train.to_vec().into_iter().map(|id| id as u8).collect();
        let (task, loss) = nt.task(std::sync::Arc::new(text))?;
        Ok(Batches::Needles(task, loss))
    }

    /// `b` rows of inputs and targets of `t` tokens from the sampler.
    fn fill(
        &self,
        s: &mut WindowSampler,
        x: &mut [u32],
        y: &mut [u32],
        b: usize,
        t: usize,
    ) -> Result<()> {
        match self {
            Batches::Windows(train) => {
                s.fill(train, x, y, b, t);
                Ok(())
            }
            Batches::Needles(task, loss) => s.fill_episodes(task, *loss, (x, y), b, t),
        }
    }
}

/// One optimizer step: `grad_accum` micro-batches of fresh windows, their mean gradient,
/// clipping and AdamW at `lr`. Returns the mean loss and the gradient norm; a non-finite
/// loss or gradient stops the run, naming where it first appeared.
fn optimizer_step(
    st: &mut RunState,
    bufs: &mut LoopBuffers,
    run: &RunConfig,
    batches: &Batches,
    lr: f32,
    ckpt: &Checkpointer,
) -> Result<(f32, f32)> {
    let tc = &run.train;
    let (b, t) = (tc.batch, run.model.max_position_embeddings);
    let LoopBuffers { ws, x, y, .. } = bufs;
    let RunState {
        model,
        opt,
        sampler,
        step,
        ..
    } = st;
    // The step's compute is one call on the pool, its workers kept awake (kernels::on_pool).
    crate::kernels::on_pool(|| -> Result<(f32, f32)> {
        opt.zero_grad();
        let mut loss_sum = 0f32;
        for _ in 0..tc.grad_accum {
            batches.fill(sampler, x, y, b, t)?;
            let loss = opt.accumulate(model, ws, x, y, b, t)?;
            if !loss.is_finite() {
                return Err(Error::Invalid(format!(
                    "step {}: the loss is {loss}; the first non-finite value is in {}; stopped without saving (last good checkpoint: {})",
                    *step + 1,
                    locate_forward(model, ws, b * t),
                    ckpt.last_name(),
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
                *step + 1,
                locate_grad(model, &opt.grads),
                ckpt.last_name(),
            )));
        }
        opt.apply(model, grad_norm, lr);
        Ok((loss, grad_norm))
    })
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

    // 1. Start: a fresh model, or the newest complete checkpoint, as the folder's one writer
    let mut st = start_or_resume(run, out, resume, observer)?;
    let first_step = st.step;
    let _lock = lock_run(out)?;
    // a run with `bf16 = true` (`--bf16`) multiplies in bf16, on a CPU that can
    st.model.precision = Precision::new(run.train.bf16).ok_or_else(|| {
        Error::Invalid("this run uses bf16 matrix products, which need AVX512_BF16".into())
    })?;

    // 2. Record the run and open its metrics log (a resumed log keeps its first steps)
    let params = st.model.num_params();
    write_run_file(run, out, params)?;
    let mut log = MetricsLog::open(&out.join(METRICS_FILE), first_step)?;
    let mut ckpt = Checkpointer {
        run,
        out,
        tokenizer,
        last: list_checkpoints(out)?
            .into_iter()
            .rev()
            .find(|(s, _)| *s == first_step),
    };

    // 3. Buffers, all allocated before the loop
    let layers = st.model.config.num_hidden_layers;
    let mut bufs = LoopBuffers {
        ws: Workspace::new(&st.model, b, t),
        x: vec![0u32; b * t],
        y: vec![0u32; b * t],
        lambdas: vec![0f32; layers],
        lambda_len: if run.model.attention == AttentionKind::Standard {
            0
        } else {
            layers
        },
    };
    let tokens_per_step = tc.tokens_per_step(t);
    let batches = Batches::new(run, data)?;
    let (mut last_loss, mut last_val) = (f32::NAN, None);

    observer.start(first_step, tc.steps);
    while st.step < tc.steps && !stop.load(Ordering::Relaxed) {
        // 4. One optimizer step at the schedule's learning rate
        let t0 = Instant::now();
        let lr = tc.lr_at(st.step);
        let (loss, grad_norm) = optimizer_step(&mut st, &mut bufs, run, &batches, lr, &ckpt)?;
        st.step += 1;
        st.tokens_seen += tokens_per_step;
        let step = st.step;

        // 5. Measure: each layer's λ, throughput, and the validation loss when due
        layer_lambdas(&st.model, &bufs.ws, b * t, &mut bufs.lambdas);
        let tokens_per_s = tokens_per_step as f64 / t0.elapsed().as_secs_f64();
        let val_loss = if step % tc.eval_every == 0 || step == tc.steps {
            let v = validate(&st.model, &mut bufs, &data.val, tc.val_batches * b, b, t)?;
            last_val = Some(v);
            Some(v)
        } else {
            None
        };
        last_loss = loss;

        // 6. Report: a line of metrics.jsonl and the observer
        let report = StepReport {
            step,
            steps: tc.steps,
            loss,
            lr,
            grad_norm,
            tokens_per_s,
            lambda: &bufs.lambdas[..bufs.lambda_len],
            val_loss,
        };
        log.write(&report)?;
        observer.step(&report);

        // 7. Checkpoint when due
        if (tc.ckpt_every > 0 && step % tc.ckpt_every == 0) || step == tc.steps {
            ckpt.save(&st)?;
        }
    }

    // 8. The end: the checkpoint of the last step, saved now unless step 7 just did
    let checkpoint = match &ckpt.last {
        Some((s, p)) if *s == st.step => p.clone(),
        _ => ckpt.save(&st)?,
    };
    Ok(Outcome {
        step: st.step,
        first_step,
        interrupted: st.step < tc.steps,
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
