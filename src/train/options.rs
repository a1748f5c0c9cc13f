//! What a training run is asked to do: `TrainOptions` holds every setting as given (flags, or
//! the same keys in a TOML file), `RunConfig` the resolved run that checkpoints record.
//!
//! Precedence: built-in defaults < the preset < `--config run.toml` < flags. When a run is
//! resumed, the recorded run takes the place of the defaults and the preset, and any setting
//! given again must agree with it (or the resumed run would not be the same run).

use crate::config::{AttentionKind, ModelConfig, Preset};
use crate::data::needle::{Filler, NeedleLoss, NeedleTask};
use crate::data::DataSpec;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every setting of `difftx train`; `None` / empty means "not given". The TOML keys are the
/// flag names with underscores (`--max-position-embeddings` is `max_position_embeddings`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct TrainOptions {
    // ---- data ----
    /// Training text: files, folders or globs such as 'texts/*.txt'; several may follow
    /// one --data.
    #[cfg_attr(feature = "cli", arg(long, num_args = 1.., value_name = "PATH"))]
    pub data: Vec<String>,
    /// Separate validation text (files, folders or globs); default: hold out the last
    /// --val-fraction of --data.
    #[cfg_attr(feature = "cli", arg(long, num_args = 1.., value_name = "PATH"))]
    pub val_data: Vec<String>,
    /// Fraction of the training tokens held out (from the end) for validation [default: 0.01].
    #[cfg_attr(feature = "cli", arg(long))]
    pub val_fraction: Option<f64>,
    /// A Hugging Face tokenizer.json (e.g. from `difftx tokenizer train`); the vocabulary size
    /// follows it [default: byte-level, 256 ids].
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub tokenizer: Option<PathBuf>,
    /// Train on needle-retrieval episodes with N needles each over the training text
    /// (docs/FINETUNING.md); byte-level only [default: 0, plain windows].
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub needles: Option<usize>,
    /// With --needles: digits of each NUMBER (1–9) [default: 2].
    #[cfg_attr(feature = "cli", arg(long, value_name = "D"))]
    pub needle_digits: Option<usize>,
    /// With --needles: the loss on `everything`, `queries` or `answers` [default: everything].
    #[cfg_attr(feature = "cli", arg(long, value_name = "WHICH"))]
    pub needle_loss: Option<String>,

    // ---- model ----
    /// Fine-tune: start from this model directory or run folder, with its config and
    /// tokenizer; only --context and --rope-theta may change its shape (docs/FINETUNING.md).
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub init_from: Option<PathBuf>,
    /// Model size: tiny, small, bench, medium or large (`difftx presets` lists the parameter counts)
    /// [default: tiny].
    #[cfg_attr(feature = "cli", arg(long))]
    pub preset: Option<String>,
    /// standard, diff_v1 or diff_v2; each preset matches parameters across the three
    /// [default: diff_v1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub attention: Option<String>,
    /// Model width D; the head dim and the SwiGLU width follow from it unless given.
    #[cfg_attr(feature = "cli", arg(long))]
    pub hidden_size: Option<usize>,
    /// SwiGLU hidden width.
    #[cfg_attr(feature = "cli", arg(long))]
    pub intermediate_size: Option<usize>,
    /// Number of blocks L.
    #[cfg_attr(feature = "cli", arg(long))]
    pub num_hidden_layers: Option<usize>,
    /// Heads H: differential heads for diff_v1, output heads for diff_v2, heads for standard.
    #[cfg_attr(feature = "cli", arg(long))]
    pub num_attention_heads: Option<usize>,
    /// Key/value heads (GQA when fewer than the query heads).
    #[cfg_attr(feature = "cli", arg(long))]
    pub num_key_value_heads: Option<usize>,
    /// Head dim d (even: RoPE rotates pairs).
    #[cfg_attr(feature = "cli", arg(long))]
    pub head_dim: Option<usize>,
    /// Context length T: each training window holds T tokens.
    #[cfg_attr(feature = "cli", arg(long, visible_alias = "context"))]
    pub max_position_embeddings: Option<usize>,
    /// RoPE base θ [default: 10000]; raise it with a longer --context to extend a model.
    #[cfg_attr(feature = "cli", arg(long))]
    pub rope_theta: Option<f64>,
    /// RMSNorm epsilon [default: 1e-5].
    #[cfg_attr(feature = "cli", arg(long))]
    pub rms_norm_eps: Option<f64>,
    /// Share the input embedding with lm_head (true or false) [default: false].
    #[cfg_attr(feature = "cli", arg(long, value_name = "BOOL"))]
    pub tie_word_embeddings: Option<bool>,
    /// diff_v1 ablation (paper Table 6): one constant λ_init in [0, 1) for every layer
    /// [default: the paper's per-layer schedule].
    #[cfg_attr(feature = "cli", arg(long, value_name = "X"))]
    pub lambda_init: Option<f64>,
    /// diff_v1 ablation (paper Table 6): no per-head RMSNorm and no (1 − λ_init) scale.
    #[cfg_attr(
        feature = "cli",
        arg(long, num_args = 0, default_missing_value = "true")
    )]
    pub no_subln: Option<bool>,

    // ---- optimisation ----
    /// Optimizer steps (updates) in the whole run [default: 1000].
    #[cfg_attr(feature = "cli", arg(long))]
    pub steps: Option<u64>,
    /// Windows per micro-batch [default: 8].
    #[cfg_attr(feature = "cli", arg(long))]
    pub batch: Option<usize>,
    /// Micro-batches whose gradients are averaged into one update [default: 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub grad_accum: Option<usize>,
    /// Peak learning rate, reached after the warm-up [default: 1e-3].
    #[cfg_attr(feature = "cli", arg(long))]
    pub lr: Option<f32>,
    /// Learning rate at the end of the cosine decay [default: lr / 10].
    #[cfg_attr(feature = "cli", arg(long))]
    pub min_lr: Option<f32>,
    /// Steps over which the learning rate decays (cosine) to --min-lr [default: --steps].
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub decay_steps: Option<u64>,
    /// Linear warm-up steps [default: 5% of --steps].
    #[cfg_attr(feature = "cli", arg(long))]
    pub warmup: Option<u64>,
    /// Decoupled AdamW weight decay, on matrices only (not norms or lambdas) [default: 0.1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub weight_decay: Option<f32>,
    /// AdamW beta1 [default: 0.9].
    #[cfg_attr(feature = "cli", arg(long))]
    pub beta1: Option<f32>,
    /// AdamW beta2 [default: 0.95].
    #[cfg_attr(feature = "cli", arg(long))]
    pub beta2: Option<f32>,
    /// AdamW epsilon [default: 1e-8].
    #[cfg_attr(feature = "cli", arg(long))]
    pub adam_eps: Option<f32>,
    /// Clip the global gradient norm to this; 0 turns clipping off [default: 1.0].
    #[cfg_attr(feature = "cli", arg(long))]
    pub clip: Option<f32>,
    /// Seed of the initial weights and of the window sampler [default: 0].
    #[cfg_attr(feature = "cli", arg(long))]
    pub seed: Option<u64>,

    // ---- evaluation and checkpoints ----
    /// Validation loss every N steps (and at the end) [default: 100].
    #[cfg_attr(feature = "cli", arg(long))]
    pub eval_every: Option<u64>,
    /// Validation windows scored each time, in batches of --batch [default: 16 batches].
    #[cfg_attr(feature = "cli", arg(long))]
    pub val_batches: Option<usize>,
    /// Checkpoint every N steps (and always at the end); 0: only at the end [default: 500].
    #[cfg_attr(feature = "cli", arg(long))]
    pub ckpt_every: Option<u64>,
    /// Checkpoints kept (older ones are deleted after a newer one is complete) [default: 3].
    #[cfg_attr(feature = "cli", arg(long))]
    pub keep_last: Option<usize>,
    /// Matrix products in bf16: set by the global `--bf16` flag (or TOML `bf16 = true`)
    /// and recorded, so that a resumed run keeps the precision it started with.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub bf16: Option<bool>,
}

/// The optimisation settings of a resolved run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimizer steps in the whole run.
    pub steps: u64,
    /// the cosine decay's end when it is not `steps` (a run extended past its schedule)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<u64>,
    /// Windows per micro-batch.
    pub batch: usize,
    /// Micro-batches averaged into one update.
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f32,
    /// Learning rate at the end of the cosine.
    pub min_lr: f32,
    /// Linear warm-up steps.
    pub warmup: u64,
    /// AdamW weight decay (matrices only).
    pub weight_decay: f32,
    /// AdamW β1.
    pub beta1: f32,
    /// AdamW β2.
    pub beta2: f32,
    /// AdamW ε.
    pub adam_eps: f32,
    /// Global gradient-norm clip (0: off).
    pub clip: f32,
    /// Seed of the initial weights and the window sampler.
    pub seed: u64,
    /// Validation every N steps.
    pub eval_every: u64,
    /// Validation batches scored each time.
    pub val_batches: usize,
    /// Checkpoint every N steps (0: only at the end).
    pub ckpt_every: u64,
    /// Checkpoints kept.
    pub keep_last: usize,
    /// bf16 matrix products (`--bf16`); runs recorded before the flag existed were f32
    #[serde(default)]
    pub bf16: bool,
    /// needle episodes over the training text (`--needles`); 0: plain windows
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needle: Option<NeedleTraining>,
}

/// A `--needles` run's task: N needles of `digits` digits, all N queried, the loss on `loss`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NeedleTraining {
    /// Needles inserted in each window.
    pub needles: usize,
    /// Digits of each needle's number.
    pub digits: usize,
    /// `answers`, `queries` or `everything` (NeedleLoss's names)
    pub loss: String,
}

impl NeedleTraining {
    /// The task over `text` (the training bytes) and its loss.
    pub fn task(&self, text: Arc<Vec<u8>>) -> Result<(NeedleTask, NeedleLoss)> {
        let loss = self
            .loss
            .parse()
            .map_err(|e: String| Error::Invalid(format!("--needle-loss: {e}")))?;
        let task = NeedleTask {
            needles: self.needles,
            queries: self.needles,
            digits: self.digits,
            filler: Filler::Text(text),
            tokenizer: None,
        };
        Ok((task, loss))
    }
}

/// A resolved run: what checkpoints record and a resumed run must match.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// The preset the shape came from.
    pub preset: Preset,
    /// The model's shape.
    pub model: ModelConfig,
    /// The optimisation settings.
    pub train: TrainConfig,
    /// The training and validation text.
    pub data: DataSpec,
    /// The tokenizer.json (none: byte-level).
    pub tokenizer: Option<PathBuf>,
    /// the model directory whose weights the run started from (`--init-from`)
    pub init_from: Option<PathBuf>,
}

/// `v` as JSON whose f32 fields read as written (0.9, not 0.8999999761581421): serialised to
/// text first, where each f32 prints its shortest form, then parsed.
fn shortest_json(v: &impl Serialize) -> Value {
    let text = serde_json::to_string(v).expect("options serialise");
    serde_json::from_str(&text).expect("serde_json reads what it writes")
}

fn overlay_json(base: &mut Value, over: &Value) {
    let (Some(b), Some(o)) = (base.as_object_mut(), over.as_object()) else {
        return;
    };
    for (k, v) in o {
        let given = match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            _ => true,
        };
        if given {
            b.insert(k.clone(), v.clone());
        }
    }
}

impl TrainOptions {
    /// Reads a TOML file of options; unknown keys are errors naming the key.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        toml::from_str(&text).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            msg: e.message().trim().to_string(),
        })
    }

    /// `self` with every setting that `over` gives replaced by `over`'s.
    pub fn overlaid(&self, over: &TrainOptions) -> TrainOptions {
        let mut base = serde_json::to_value(self).expect("options serialise");
        overlay_json(
            &mut base,
            &serde_json::to_value(over).expect("options serialise"),
        );
        serde_json::from_value(base).expect("options deserialise")
    }

    /// Resolves the options into a run. `vocab_size` comes from the tokenizer.
    pub fn resolve(&self, vocab_size: usize) -> Result<RunConfig> {
        let bad = |m: String| Error::Invalid(m);
        let preset: Preset = self
            .preset
            .as_deref()
            .unwrap_or("tiny")
            .parse()
            .map_err(bad)?;
        let attention: AttentionKind = self
            .attention
            .as_deref()
            .unwrap_or("diff_v1")
            .parse()
            .map_err(bad)?;
        let mut m = ModelConfig::preset(preset, attention);
        m.vocab_size = vocab_size;
        m.tokenizer = self.tokenizer.is_none().then(|| "byte".to_string());
        let hidden = self.hidden_size.unwrap_or(m.hidden_size);
        let heads = self.num_attention_heads.unwrap_or(m.num_attention_heads);
        if self.num_attention_heads.is_some() && self.num_key_value_heads.is_none() {
            // keep the preset's ratio of query to key/value heads
            m.num_key_value_heads = heads * m.num_key_value_heads / m.num_attention_heads;
        }
        if (self.hidden_size.is_some() || self.num_attention_heads.is_some())
            && self.head_dim.is_none()
        {
            // the attention output (H·d, or H·2d for diff_v1) spans the model width
            let per = if attention == AttentionKind::DiffV1 {
                2 * heads
            } else {
                heads
            };
            if heads == 0 || !hidden.is_multiple_of(per) {
                return Err(bad(format!(
                    "hidden_size ({hidden}) must be divisible by {}num_attention_heads ({heads}) \
                     for {attention} to derive the head dim (or give --head-dim)",
                    if attention == AttentionKind::DiffV1 {
                        "2 × "
                    } else {
                        ""
                    }
                )));
            }
            m.head_dim = hidden / per;
        }
        if self.hidden_size.is_some() && self.intermediate_size.is_none() {
            m.intermediate_size = crate::config::swiglu_width(hidden);
        }
        m.hidden_size = hidden;
        m.num_attention_heads = heads;
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { m.$f = v; } )* };
        }
        set!(
            intermediate_size,
            num_hidden_layers,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            rope_theta,
            rms_norm_eps,
            tie_word_embeddings
        );
        if self.lambda_init.is_some() {
            m.lambda_init = self.lambda_init;
        }
        if let Some(no) = self.no_subln {
            m.subln = !no;
        }
        m.validate().map_err(bad)?;

        let steps = self.steps.unwrap_or(1000);
        let lr = self.lr.unwrap_or(1e-3);
        let train = TrainConfig {
            steps,
            decay_steps: self.decay_steps.filter(|&d| d != steps),
            batch: self.batch.unwrap_or(8),
            grad_accum: self.grad_accum.unwrap_or(1),
            lr,
            min_lr: self.min_lr.unwrap_or(lr / 10.0),
            warmup: self.warmup.unwrap_or(steps / 20),
            weight_decay: self.weight_decay.unwrap_or(0.1),
            beta1: self.beta1.unwrap_or(0.9),
            beta2: self.beta2.unwrap_or(0.95),
            adam_eps: self.adam_eps.unwrap_or(1e-8),
            clip: self.clip.unwrap_or(1.0),
            seed: self.seed.unwrap_or(0),
            eval_every: self.eval_every.unwrap_or(100),
            val_batches: self.val_batches.unwrap_or(16),
            ckpt_every: self.ckpt_every.unwrap_or(500),
            keep_last: self.keep_last.unwrap_or(3),
            bf16: self.bf16.unwrap_or(false),
            needle: self.needle_training(m.max_position_embeddings)?,
        };
        train.validate()?;
        Ok(RunConfig {
            preset,
            model: m,
            train,
            data: DataSpec {
                data: self.data.clone(),
                val_data: self.val_data.clone(),
                val_fraction: self.val_fraction.unwrap_or(0.01),
            },
            tokenizer: self.tokenizer.clone(),
            init_from: self.init_from.clone(),
        })
    }
}

impl TrainOptions {
    /// The `--needles` task, checked against the tokenizer and the window length T: None
    /// without --needles (and then neither --needle-digits nor --needle-loss may be given).
    fn needle_training(&self, t: usize) -> Result<Option<NeedleTraining>> {
        let bad = |m: String| Err(Error::Invalid(m));
        let n = self.needles.unwrap_or(0);
        if n == 0 {
            if self.needle_digits.is_some() || self.needle_loss.is_some() {
                return bad("--needle-digits and --needle-loss need --needles N".into());
            }
            return Ok(None);
        }
        if let Some(tok) = &self.tokenizer {
            return bad(format!(
                "--needles needs the byte-level tokenizer (episodes are bytes), not {}",
                tok.display()
            ));
        }
        let nt = NeedleTraining {
            needles: n,
            digits: self.needle_digits.unwrap_or(2),
            loss: self
                .needle_loss
                .clone()
                .unwrap_or_else(|| NeedleLoss::Everything.as_str().into()),
        };
        let (task, _) = nt.task(Arc::new(Vec::new()))?;
        task.validate()
            .map_err(|e| Error::Invalid(format!("--needles: {e}")))?;
        if task.min_len() > t {
            return bad(format!(
                "--needles {n}: an episode of {n} needles of {} digits needs windows of at least {} tokens; the context is {t}",
                nt.digits,
                task.min_len()
            ));
        }
        Ok(Some(nt))
    }
}

impl TrainConfig {
    /// Refuses settings that cannot train (zero steps, batch or accumulation, a learning rate ≤ 0, …).
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("steps", self.steps as usize),
            ("batch", self.batch),
            ("grad-accum", self.grad_accum),
            ("eval-every", self.eval_every as usize),
            ("val-batches", self.val_batches),
            ("keep-last", self.keep_last),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(Error::Invalid(format!("--{k} must be at least 1")));
            }
        }
        let finite_nonneg = [
            ("lr", self.lr),
            ("min-lr", self.min_lr),
            ("weight-decay", self.weight_decay),
            ("clip", self.clip),
            ("adam-eps", self.adam_eps),
        ];
        for (k, v) in finite_nonneg {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::Invalid(format!(
                    "--{k} ({v}) must be a finite number ≥ 0"
                )));
            }
        }
        for (k, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(Error::Invalid(format!("--{k} ({v}) must be in [0, 1)")));
            }
        }
        if self.warmup > self.steps {
            return Err(Error::Invalid(format!(
                "--warmup ({}) is longer than --steps ({})",
                self.warmup, self.steps
            )));
        }
        if self.decay_end() < self.warmup {
            return Err(Error::Invalid(format!(
                "--decay-steps ({}) is shorter than --warmup ({})",
                self.decay_end(),
                self.warmup
            )));
        }
        Ok(())
    }

    /// The step at which the cosine reaches `min_lr`: `decay_steps`, or the run's end.
    pub fn decay_end(&self) -> u64 {
        self.decay_steps.unwrap_or(self.steps)
    }

    /// The learning rate of update `step` (0-based): warm-up, cosine decay to `min_lr` at
    /// `decay_end`, then `min_lr`.
    pub fn lr_at(&self, step: u64) -> f32 {
        super::schedule::lr_at(step, self.decay_end(), self.lr, self.min_lr, self.warmup)
    }

    /// Tokens seen per optimizer step.
    pub fn tokens_per_step(&self, seq: usize) -> u64 {
        (self.batch * self.grad_accum * seq) as u64
    }
}

impl TrainOptions {
    /// Every shape flag of the model set from `c`: the attention kind, widths, layers, heads
    /// and head dim (not the context, θ or the ablations, which callers choose).
    pub fn set_shape(&mut self, c: &ModelConfig) {
        self.attention = Some(c.attention.as_str().into());
        self.hidden_size = Some(c.hidden_size);
        self.intermediate_size = Some(c.intermediate_size);
        self.num_hidden_layers = Some(c.num_hidden_layers);
        self.num_attention_heads = Some(c.num_attention_heads);
        self.num_key_value_heads = Some(c.num_key_value_heads);
        self.head_dim = Some(c.head_dim);
    }
}

impl RunConfig {
    /// The run as fully explicit options (every setting given), to resume from.
    pub fn to_options(&self) -> TrainOptions {
        let (m, t) = (&self.model, &self.train);
        TrainOptions {
            data: self.data.data.clone(),
            val_data: self.data.val_data.clone(),
            val_fraction: Some(self.data.val_fraction),
            tokenizer: self.tokenizer.clone(),
            init_from: self.init_from.clone(),
            preset: Some(self.preset.as_str().into()),
            attention: Some(m.attention.as_str().into()),
            hidden_size: Some(m.hidden_size),
            intermediate_size: Some(m.intermediate_size),
            num_hidden_layers: Some(m.num_hidden_layers),
            num_attention_heads: Some(m.num_attention_heads),
            num_key_value_heads: Some(m.num_key_value_heads),
            head_dim: Some(m.head_dim),
            max_position_embeddings: Some(m.max_position_embeddings),
            rope_theta: Some(m.rope_theta),
            rms_norm_eps: Some(m.rms_norm_eps),
            tie_word_embeddings: Some(m.tie_word_embeddings),
            lambda_init: m.lambda_init,
            no_subln: Some(!m.subln),
            steps: Some(t.steps),
            decay_steps: t.decay_steps,
            batch: Some(t.batch),
            grad_accum: Some(t.grad_accum),
            lr: Some(t.lr),
            min_lr: Some(t.min_lr),
            warmup: Some(t.warmup),
            weight_decay: Some(t.weight_decay),
            beta1: Some(t.beta1),
            beta2: Some(t.beta2),
            adam_eps: Some(t.adam_eps),
            clip: Some(t.clip),
            seed: Some(t.seed),
            eval_every: Some(t.eval_every),
            val_batches: Some(t.val_batches),
            ckpt_every: Some(t.ckpt_every),
            keep_last: Some(t.keep_last),
            bf16: Some(t.bf16),
            needles: t.needle.as_ref().map(|n| n.needles),
            needle_digits: t.needle.as_ref().map(|n| n.digits),
            needle_loss: t.needle.as_ref().map(|n| n.loss.clone()),
        }
    }

    /// The first setting (by option name) in which `other` would train differently, if any.
    /// Checkpoint frequency and retention do not change the run and may differ.
    pub fn first_difference(&self, other: &RunConfig) -> Option<(String, String, String)> {
        self.difference_ignoring(other, &[])
    }

    /// `first_difference`, leaving the settings named in `ignore` out as well.
    fn difference_ignoring(
        &self,
        other: &RunConfig,
        ignore: &[&str],
    ) -> Option<(String, String, String)> {
        let mut a = shortest_json(&self.to_options());
        let mut b = shortest_json(&other.to_options());
        for v in [&mut a, &mut b] {
            let o = v.as_object_mut().expect("object");
            for k in ["ckpt_every", "keep_last"].iter().chain(ignore) {
                o.remove(*k);
            }
        }
        let (a, b) = (a.as_object().unwrap(), b.as_object().unwrap());
        a.iter().find_map(|(k, va)| {
            let vb = &b[k];
            (va != vb).then(|| (k.clone(), va.to_string(), vb.to_string()))
        })
    }

    /// The fewest options that resolve to this run: `to_options` without the head layout and
    /// SwiGLU width where the preset and the model width derive them anyway. These are the
    /// settings "as given", so that the same settings for another attention kind derive that
    /// kind's layout (the matched parameter counts of a resumed run equal the first run's).
    pub fn minimal_options(&self) -> TrainOptions {
        let vocab = self.model.vocab_size;
        let mut o = self.to_options();
        let derived: [fn(&mut TrainOptions); 4] = [
            |o| o.head_dim = None,
            |o| o.num_key_value_heads = None,
            |o| o.num_attention_heads = None,
            |o| o.intermediate_size = None,
        ];
        for drop in derived {
            let mut fewer = o.clone();
            drop(&mut fewer);
            if fewer.resolve(vocab).is_ok_and(|r| r.model == self.model) {
                o = fewer;
            }
        }
        o
    }

    /// The same run trained further: `recorded` with `extra` more steps at the end, the learning
    /// rate staying at `min_lr` after the recorded decay (`--extend-steps`).
    pub fn extended(&self, extra: u64) -> RunConfig {
        let mut r = self.clone();
        r.train.decay_steps = Some(self.train.decay_end());
        r.train.steps += extra;
        r
    }

    /// Refuses to resume the run recorded in `dir` with settings that would train differently,
    /// naming the first such setting, its recorded value and the one given now. A run extended
    /// past its end (more steps, the same decay) resumes it.
    pub fn check_resumes(&self, recorded: &RunConfig, dir: &Path) -> Result<()> {
        let extends = self.train.steps >= recorded.train.steps
            && self.train.decay_end() == recorded.train.decay_end();
        let ignore: &[&str] = if extends {
            &["steps", "decay_steps"]
        } else {
            &[]
        };
        match recorded.difference_ignoring(self, ignore) {
            None => Ok(()),
            Some((k, was, now)) => {
                let hint = if k == "steps" {
                    " (to train past the end, keep --steps and pass --extend-steps N)"
                } else {
                    ""
                };
                Err(Error::Invalid(format!(
                    "--resume: {k} is {now}, but the run in {} used {was}{hint}",
                    dir.display()
                )))
            }
        }
    }

    /// The run as `run.json` and checkpoints record it.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "preset": self.preset.as_str(),
            "model": self.model.to_json(),
            "train": shortest_json(&self.train),
            "data": self.data,
            "tokenizer": self.tokenizer,
            "init_from": self.init_from,
        })
    }

    /// Reads a run recorded by `to_json`; `path` names the file in errors.
    pub fn from_json(v: &Value, path: &Path) -> Result<Self> {
        let err = |msg: String| Error::Config {
            path: path.to_path_buf(),
            msg,
        };
        let field = |k: &str| v.get(k).ok_or_else(|| err(format!("missing key `{k}`")));
        let preset = field("preset")?
            .as_str()
            .ok_or_else(|| err("key `preset` must be a string".into()))?
            .parse()
            .map_err(err)?;
        let model = ModelConfig::from_json(field("model")?, path)?;
        let train = serde_json::from_value(field("train")?.clone())
            .map_err(|e| err(format!("key `train`: {e}")))?;
        let data = serde_json::from_value(field("data")?.clone())
            .map_err(|e| err(format!("key `data`: {e}")))?;
        let tokenizer = serde_json::from_value(field("tokenizer")?.clone())
            .map_err(|e| err(format!("key `tokenizer`: {e}")))?;
        // runs recorded before --init-from existed started from scratch
        let init_from = match v.get("init_from") {
            None | Some(Value::Null) => None,
            Some(x) => Some(
                serde_json::from_value(x.clone())
                    .map_err(|e| err(format!("key `init_from`: {e}")))?,
            ),
        };
        Ok(RunConfig {
            preset,
            model,
            train,
            data,
            tokenizer,
            init_from,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_toml_which_overrides_the_preset() {
        let toml: TrainOptions = toml::from_str(
            "preset = 'bench'\nattention = 'standard'\nsteps = 50\nlr = 0.002\nmax_position_embeddings = 64\n",
        )
        .unwrap();
        let flags = TrainOptions {
            steps: Some(70),
            ..Default::default()
        };
        let run = toml.overlaid(&flags).resolve(256).unwrap();
        assert_eq!(run.train.steps, 70);
        assert_eq!(run.train.lr, 0.002);
        assert_eq!(run.train.min_lr, 0.002f32 / 10.0);
        assert_eq!(run.model.max_position_embeddings, 64);
        assert_eq!(run.model.num_attention_heads, 8);
        assert_eq!(run.model.hidden_size, 256);
    }

    #[test]
    fn unknown_toml_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("run.toml");
        std::fs::write(&p, "stepz = 3\n").unwrap();
        let e = TrainOptions::from_toml_file(&p).unwrap_err().to_string();
        assert!(e.contains("run.toml") && e.contains("stepz"), "{e}");
    }

    #[test]
    fn overriding_the_width_derives_head_dim_or_names_the_indivisible_heads() {
        let o = TrainOptions {
            attention: Some("diff_v1".into()),
            hidden_size: Some(192),
            ..Default::default()
        };
        let r = o.resolve(256).unwrap();
        // tiny diff_v1 has 2 differential heads: 2·2·48 = 192
        assert_eq!((r.model.head_dim, r.model.intermediate_size), (48, 512));
        let std_width = |w| TrainOptions {
            attention: Some("standard".into()),
            hidden_size: Some(w),
            ..Default::default()
        };
        let e = std_width(102).resolve(256).unwrap_err().to_string();
        assert!(
            e.contains("hidden_size (102)") && e.contains("num_attention_heads (4)"),
            "{e}"
        );
        // 100 / 4 heads = 25: divisible, but RoPE needs an even head dim
        let e = std_width(100).resolve(256).unwrap_err().to_string();
        assert!(e.contains("head_dim (25) must be even"), "{e}");
    }

    #[test]
    fn ablation_settings_come_from_toml_or_flags_and_survive_a_resume() {
        let toml: TrainOptions =
            toml::from_str("lambda_init = 0.8\nno_subln = true\nsteps = 10\n").unwrap();
        let run = toml.resolve(256).unwrap();
        assert_eq!((run.model.lambda_init, run.model.subln), (Some(0.8), false));
        // a flag overrides the file; an absent flag leaves it alone
        let flags = TrainOptions {
            lambda_init: Some(0.5),
            ..Default::default()
        };
        let run = toml.overlaid(&flags).resolve(256).unwrap();
        assert_eq!((run.model.lambda_init, run.model.subln), (Some(0.5), false));
        let back = RunConfig::from_json(&run.to_json(), Path::new("x")).unwrap();
        assert_eq!(back, run);
        let again = run
            .to_options()
            .overlaid(&TrainOptions::default())
            .resolve(256)
            .unwrap();
        assert_eq!(again, run);
        let mut paper = run.clone();
        (paper.model.lambda_init, paper.model.subln) = (None, true);
        assert_eq!(
            run.first_difference(&paper).map(|d| d.0),
            Some("lambda_init".to_string())
        );
        let std = TrainOptions {
            attention: Some("standard".into()),
            no_subln: Some(true),
            ..Default::default()
        };
        let e = std.resolve(256).unwrap_err().to_string();
        assert!(e.contains("`subln`") && e.contains("standard"), "{e}");
    }

    #[test]
    fn a_run_survives_a_json_round_trip_and_differences_are_named() {
        let o = TrainOptions {
            data: vec!["a.txt".into()],
            attention: Some("diff_v2".into()),
            ..Default::default()
        };
        let r = o.resolve(256).unwrap();
        let back = RunConfig::from_json(&r.to_json(), Path::new("x")).unwrap();
        assert_eq!(back, r);
        let again = r
            .to_options()
            .overlaid(&TrainOptions::default())
            .resolve(256)
            .unwrap();
        assert_eq!(again, r);
        let mut other = r.clone();
        other.train.ckpt_every = 7;
        assert_eq!(r.first_difference(&other), None);
        other.train.lr = 0.5;
        assert_eq!(
            r.first_difference(&other).map(|d| d.0),
            Some("lr".to_string())
        );
    }
}
