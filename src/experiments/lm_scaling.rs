//! Language modelling and scaling (paper Section 3.2, Figure 3a) and the cheap ablation rows
//! (Table 6), measured on a real corpus: Debian's `fortunes` (the text files under
//! /usr/share/games/fortunes), byte-level.
//!
//! Every attention kind trains at three sizes (`matched_config`) on the same token budget
//! (steps × batch × context) through `train_short`, with seeded random windows of the training
//! bytes and the loss on every byte; then each model is scored on the same evenly spaced
//! windows of the validation bytes (the last 10% of the corpus). Per kind, the validation loss
//! is fitted against ln(parameters) (L = a + b ln N), and the parameter ratio at equal loss is
//! read off the fits: the parameters a diff kind needs to reach the standard model's loss at
//! the middle size, over that standard model's parameters (the paper: about 0.65).
//!
//! Extra runs at the middle size (the Table 6 ablations: diff_v1 without subln, diff_v1 with a
//! constant λ_init of 0.8) are passed as [`Variant`]s, each a label and a `ModelConfig`.

use super::repro::{compare, fmt_ms, matched_config, mean_std, table_head};
use crate::config::{swiglu_width, AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::model::{Model, Workspace};
use crate::report::lines::{plot_lines, Axes, Line, Point};
use crate::train::in_memory::{train_short, ShortRun, Trained};
use crate::util::thousands;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// Where Debian's `fortunes` package puts its text files.
pub const FORTUNES_DIR: &str = "/usr/share/games/fortunes";
/// The plot `plot_scaling` is meant to write into a run folder.
pub const SCALING_PLOT: &str = "lm_scaling.png";
/// The share of the corpus, at its end, held out for validation.
pub const VAL_FRACTION: f64 = 0.1;
/// The paper's parameter ratio at equal loss (Figure 3a: 6.8B Diff ≈ 11B Transformer).
pub const PAPER_RATIO: f64 = 0.65;
/// Salt of the training windows' generator (the model's initial weights use the seed itself).
const TRAIN_STREAM: u64 = 0x6c6d_5f77_696e_646f;

/// The corpus: every fortune text file in `path` (a folder: sorted by name, `.dat` index files,
/// symlinks such as `*.u8`, hidden files and subfolders such as `off/` skipped), concatenated
/// with a newline after any file that lacks one; or the bytes of `path` itself when it is a
/// file (any text file; the CI quick run uses data/demo.txt).
pub fn load_fortunes(path: &Path) -> Result<Vec<u8>> {
    let data = |msg: String| Error::Data {
        path: path.to_path_buf(),
        msg,
    };
    let meta = std::fs::metadata(path).map_err(|_| {
        data("not found: install Debian's `fortunes` package (`apt-get install fortunes`) or pass a text file".into())
    })?;
    if meta.is_file() {
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        if text.is_empty() {
            return Err(data("the text file is empty".into()));
        }
        return Ok(text);
    }
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .map_err(|e| Error::io(path, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(path, e)))
        .collect::<Result<_>>()?;
    files.sort();
    let mut text = Vec::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let kind = std::fs::symlink_metadata(&f).map_err(|e| Error::io(&f, e))?;
        if !kind.is_file() || name.starts_with('.') || name.ends_with(".dat") {
            continue;
        }
        let bytes = std::fs::read(&f).map_err(|e| Error::io(&f, e))?;
        text.extend_from_slice(&bytes);
        if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            text.push(b'\n');
        }
    }
    if text.is_empty() {
        return Err(data(
            "no fortune files in this folder: install Debian's `fortunes` package (`apt-get install fortunes`) or pass a text file".into(),
        ));
    }
    Ok(text)
}

/// (training, validation): the validation part is the last 10% of the bytes (rounded down).
pub fn split(text: &[u8]) -> (&[u8], &[u8]) {
    let val = (text.len() as f64 * VAL_FRACTION) as usize;
    text.split_at(text.len() - val)
}

/// One line naming the corpus and its split, for the report.
pub fn corpus_line(source: &Path, text: &[u8]) -> String {
    let (train, val) = split(text);
    format!(
        "`{}`: {} bytes, byte-level (vocabulary 256); the first {} bytes train, the last {} (10%) are validation",
        source.display(),
        thousands(text.len()),
        thousands(train.len()),
        thousands(val.len())
    )
}

/// Writes `b` windows of `t` bytes, each at a uniform random start in `train`, into `x[..b·t]`
/// and the next bytes into `y[..b·t]` (a loss on every byte).
pub fn fill_windows(
    rng: &mut ChaCha8Rng,
    train: &[u8],
    x: &mut [u32],
    y: &mut [u32],
    b: usize,
    t: usize,
) {
    let last = train.len() - t - 1;
    for r in 0..b {
        let s = rng.random_range(0..=last);
        for (i, (xi, yi)) in x[r * t..(r + 1) * t]
            .iter_mut()
            .zip(&mut y[r * t..(r + 1) * t])
            .enumerate()
        {
            *xi = train[s + i] as u32;
            *yi = train[s + i + 1] as u32;
        }
    }
}

/// Starts of `n` windows of t + 1 bytes spread evenly over `len` bytes, the first at 0 and the
/// last ending at the last byte (fewer when `len` has fewer distinct starts).
pub fn val_starts(len: usize, t: usize, n: usize) -> Vec<usize> {
    if len < t + 1 || n == 0 {
        return Vec::new();
    }
    let last = len - t - 1;
    let n = n.min(last + 1);
    if n == 1 {
        return vec![0];
    }
    (0..n).map(|i| i * last / (n - 1)).collect()
}

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

/// L = a + b ln N, fitted by least squares. With three sizes a power law with an irreducible
/// term (L = E + A N^-α) has as many parameters as points and would fit any three losses
/// exactly, so the straight line in ln N is the most a 3-point curve can say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogFit {
    pub a: f64,
    pub b: f64,
}

impl LogFit {
    /// The least-squares line through (ln N, L); None with fewer than two distinct N.
    pub fn fit(points: &[(f64, f64)]) -> Option<LogFit> {
        let n = points.len() as f64;
        let xs: Vec<f64> = points.iter().map(|p| p.0.ln()).collect();
        let mx = xs.iter().sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        let sxy: f64 = xs
            .iter()
            .zip(points)
            .map(|(x, p)| (x - mx) * (p.1 - my))
            .sum();
        if points.len() < 2 || sxx <= 1e-12 || !sxx.is_finite() {
            return None;
        }
        let b = sxy / sxx;
        Some(LogFit { a: my - b * mx, b })
    }

    /// The fitted loss at N parameters.
    pub fn loss_at(&self, n: f64) -> f64 {
        self.a + self.b * n.ln()
    }

    /// The parameters at which the fit reaches `loss`; None unless the loss falls with size
    /// (b < 0).
    pub fn params_for(&self, loss: f64) -> Option<f64> {
        (self.b < 0.0).then(|| ((loss - self.a) / self.b).exp())
    }
}

/// The parameter ratio at equal loss: the parameters the `diff` fit needs to reach the
/// `standard` fit's loss at `n_ref` parameters, divided by `n_ref` (below 1: the diff kind is
/// more parameter-efficient). Undefined, with the reason, unless both losses fall with size.
pub fn param_ratio(
    standard: &LogFit,
    diff: &LogFit,
    n_ref: f64,
) -> std::result::Result<f64, String> {
    if standard.b >= 0.0 {
        return Err(format!(
            "undefined: the standard loss does not fall with size (b = {:+.4})",
            standard.b
        ));
    }
    match diff.params_for(standard.loss_at(n_ref)) {
        Some(n) => Ok(n / n_ref),
        None => Err(format!(
            "undefined: this kind's loss does not fall with size (b = {:+.4})",
            diff.b
        )),
    }
}

/// What Table 6 says of a variant's validation loss against the full diff_v1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaperSays {
    /// the change hurts (removing the per-head norm)
    Higher,
    /// about as good (a constant λ_init of 0.8 or 0.5)
    AboutEqual,
    /// the paper does not say
    Nothing,
}

/// An extra run at the middle size: a label (unique, not a kind's name) and a model config,
/// usually `plan.config(kind, plan.middle())` with a field changed. The Table 6 ablations are
/// passed this way: diff_v1 without subln (`PaperSays::Higher`) and with a constant λ_init of
/// 0.8 (`PaperSays::AboutEqual`), e.g.
/// `plan.variant("diff_v1 without subln", AttentionKind::DiffV1, PaperSays::Higher, |c| c.subln = false)`
/// once `ModelConfig` has those fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    pub label: String,
    pub config: ModelConfig,
    pub paper: PaperSays,
}

/// The language-modelling plan; `quick()` and `full()` are the two the CLI offers.
#[derive(Clone, Debug, PartialEq)]
pub struct LmPlan {
    pub quick: bool,
    /// (D, L) of each size, smallest first; every kind gets `matched_config` at each. The
    /// middle one (`middle()`) also runs the variants and is the reference for the ratio.
    pub sizes: Vec<(usize, usize)>,
    pub head_dim: usize,
    /// training and validation windows, in bytes
    pub context: usize,
    pub steps: u64,
    /// windows per step
    pub batch: usize,
    pub lr: f32,
    pub warmup: u64,
    /// validation windows, evenly spaced over the validation bytes (`val_starts`)
    pub val_windows: usize,
}

impl LmPlan {
    /// The CI smoke run on data/demo.txt: D 32/48/64, 1–2 layers, 40 steps of 4 × 64 bytes;
    /// about 1 s for the nine models in a release build (one busy core).
    pub fn quick() -> Self {
        LmPlan {
            quick: true,
            sizes: vec![(32, 1), (48, 1), (64, 2)],
            head_dim: 8,
            context: 64,
            steps: 40,
            batch: 4,
            lr: 3e-3,
            warmup: 4,
            val_windows: 16,
        }
    }

    /// The full run: D 64/96/128 with 2/3/4 layers (head dim 16, so h = 2/3/4 differential
    /// heads; about 140k, 380k and 920k parameters), context 128, 400 steps of 16 windows:
    /// 819,200 training bytes per model (about a third of an epoch), the same for every size
    /// and kind. lr 6e-3 was the best of 1e-3 … 1.6e-2 for `standard` at the middle size in a
    /// 300-step pilot (no diff kind was tuned); with it the loss still falls at every size step.
    /// Cost, timed single-threaded on the 2-core machine (standard 59k / 26k / 12k bytes per
    /// second at the three sizes; diff_v1 +6% and diff_v2 +36% time at D 96): 3 kinds × 3
    /// sizes and 2 variants ≈ 460 core-seconds per seed, so 3 seeds ≈ 23 core-minutes: about 15
    /// minutes on both cores (a 2-thread spot check gave 1.55× one thread; the machine was
    /// never quiet enough to time the whole plan).
    pub fn full() -> Self {
        LmPlan {
            quick: false,
            sizes: vec![(64, 2), (96, 3), (128, 4)],
            head_dim: 16,
            context: 128,
            steps: 400,
            batch: 16,
            lr: 6e-3,
            warmup: 40,
            val_windows: 512,
        }
    }

    /// Index of the middle size.
    pub fn middle(&self) -> usize {
        self.sizes.len() / 2
    }

    /// The model of `kind` at size `size` (an index into `sizes`).
    pub fn config(&self, kind: AttentionKind, size: usize) -> ModelConfig {
        let (d, l) = self.sizes[size];
        matched_config(kind, d, l, self.head_dim, self.context)
    }

    /// Training bytes (tokens) per model: steps × batch × context.
    pub fn tokens(&self) -> u64 {
        self.steps * (self.batch * self.context) as u64
    }

    /// A variant at the middle size: `kind`'s config there, changed by `edit`.
    pub fn variant(
        &self,
        label: &str,
        kind: AttentionKind,
        paper: PaperSays,
        edit: impl FnOnce(&mut ModelConfig),
    ) -> Variant {
        let mut config = self.config(kind, self.middle());
        edit(&mut config);
        Variant {
            label: label.to_string(),
            config,
            paper,
        }
    }

    /// Checks that the plan and the variants can run, naming the first problem.
    pub fn validate(&self, variants: &[Variant]) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.sizes.len() < 2 {
            return bad("the scaling fit needs at least two sizes".into());
        }
        if self.steps == 0 || self.batch == 0 || self.context < 2 || self.val_windows == 0 {
            return bad("an LM plan needs steps, a batch, a context and validation windows".into());
        }
        for &(d, _) in &self.sizes {
            if self.head_dim == 0 || !d.is_multiple_of(2 * self.head_dim) {
                return bad(format!(
                    "hidden size {d} must be a multiple of 2 × head dim {} (h = D / 2d differential heads)",
                    self.head_dim
                ));
            }
        }
        for s in 0..self.sizes.len() {
            for k in AttentionKind::ALL {
                self.config(k, s).validate().map_err(Error::Invalid)?;
            }
        }
        for (i, v) in variants.iter().enumerate() {
            let taken = AttentionKind::ALL.iter().any(|k| k.as_str() == v.label)
                || variants[..i].iter().any(|w| w.label == v.label);
            if v.label.is_empty() || taken {
                return bad(format!(
                    "variant label `{}` must be non-empty and differ from the kinds and the other variants",
                    v.label
                ));
            }
            if v.config.max_position_embeddings != self.context || v.config.vocab_size != 256 {
                return bad(format!(
                    "variant `{}`: the context ({}) and vocabulary ({}) must be the plan's ({} and 256)",
                    v.label, v.config.max_position_embeddings, v.config.vocab_size, self.context
                ));
            }
            v.config
                .validate()
                .map_err(|e| Error::Invalid(format!("variant `{}`: {e}", v.label)))?;
        }
        Ok(())
    }

    /// What the plan will run, one line each.
    pub fn describe(&self) -> Vec<String> {
        let sizes: Vec<String> = (0..self.sizes.len())
            .map(|s| {
                let (d, l) = self.sizes[s];
                let p: Vec<String> = AttentionKind::ALL
                    .iter()
                    .map(|&k| format!("{k} {}", thousands(self.config(k, s).num_params())))
                    .collect();
                format!(
                    "D {d}, L {l}, SwiGLU {} ({})",
                    swiglu_width(d),
                    p.join(", ")
                )
            })
            .collect();
        vec![
            format!(
                "{} language modelling: 3 kinds × {} sizes, {} steps of {} windows of {} bytes each ({} training bytes per model), peak lr {}, {} warm-up steps",
                if self.quick { "quick" } else { "full" },
                self.sizes.len(),
                self.steps,
                self.batch,
                self.context,
                thousands(self.tokens() as usize),
                self.lr,
                self.warmup
            ),
            format!("sizes (head dim {}): {}", self.head_dim, sizes.join("; ")),
        ]
    }
}

/// One trained language model.
#[derive(Clone, Debug)]
pub struct LmRun {
    /// the kind's name, or the variant's label
    pub label: String,
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
}

impl LmRun {
    /// Mean training loss of the last 10 steps.
    pub fn final_loss(&self) -> f64 {
        let tail = &self.losses[self.losses.len().saturating_sub(10)..];
        tail.iter().map(|&x| x as f64).sum::<f64>() / tail.len().max(1) as f64
    }
}

/// Trains one model of the plan on seeded random windows of `train` (`fill_windows`), through
/// `train_short`; the windows depend only on `seed`.
pub fn train_lm(plan: &LmPlan, config: ModelConfig, train: &[u8], seed: u64) -> Result<Trained> {
    let (b, t) = (plan.batch, plan.context);
    if train.len() < t + 1 {
        return Err(Error::Invalid(format!(
            "{} training bytes cannot hold a window of {t} bytes",
            train.len()
        )));
    }
    let run = ShortRun {
        steps: plan.steps,
        batch: b,
        context: t,
        lr: plan.lr,
        warmup: plan.warmup,
    };
    let fill = |rng: &mut ChaCha8Rng, x: &mut [u32], y: &mut [u32]| -> Result<usize> {
        fill_windows(rng, train, x, y, b, t);
        Ok(t)
    };
    train_short(config, &run, seed, TRAIN_STREAM, fill, |_, _| {})
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
    let t = plan.context;
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
            let val_loss = window_loss(&model, val, &starts, t, plan.batch)?;
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
            };
            note(&format!(
                "lm {label} size {size} ({} params) seed {seed}: {} steps in {:.0} s, final train loss {:.3}, validation loss {:.3}",
                thousands(r.params),
                plan.steps,
                r.seconds,
                r.final_loss(),
                r.val_loss
            ));
            runs.push(r);
        }
    }
    Ok(runs)
}

fn select<'a>(runs: &'a [LmRun], label: &str, size: usize) -> Vec<&'a LmRun> {
    runs.iter()
        .filter(|r| r.label == label && r.size == size)
        .collect()
}

fn sizes_of(runs: &[LmRun]) -> usize {
    runs.iter()
        .filter(|r| r.variant.is_none())
        .map(|r| r.size + 1)
        .max()
        .unwrap_or(0)
}

/// The variants' labels, each once, in the order they ran.
fn variant_labels(runs: &[LmRun]) -> Vec<&str> {
    let mut labels: Vec<&str> = Vec::new();
    for r in runs.iter().filter(|r| r.variant.is_some()) {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    labels
}

fn seeds_of(runs: &[LmRun]) -> Vec<u64> {
    let mut s: Vec<u64> = runs.iter().map(|r| r.seed).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// One kind's (parameters, validation loss) per size; `seed` picks one seed's runs, None the
/// mean over seeds at each size.
fn kind_points(runs: &[LmRun], kind: AttentionKind, seed: Option<u64>) -> Vec<(f64, f64)> {
    (0..sizes_of(runs))
        .filter_map(|s| {
            let rs: Vec<&LmRun> = select(runs, kind.as_str(), s)
                .into_iter()
                .filter(|r| seed.is_none_or(|x| r.seed == x))
                .collect();
            let v: Vec<f64> = rs.iter().map(|r| r.val_loss).collect();
            (!rs.is_empty()).then(|| (rs[0].params as f64, mean_std(&v).0))
        })
        .collect()
}

/// The fit of one kind's validation loss against its parameters over the sizes (`seed` as in
/// `kind_points`).
pub fn kind_fit(runs: &[LmRun], kind: AttentionKind, seed: Option<u64>) -> Option<LogFit> {
    LogFit::fit(&kind_points(runs, kind, seed))
}

/// The standard model's parameters at the middle size (the ratio's reference).
fn reference_params(runs: &[LmRun]) -> Option<f64> {
    let mid = sizes_of(runs) / 2;
    select(runs, AttentionKind::Standard.as_str(), mid)
        .first()
        .map(|r| r.params as f64)
}

/// The parameter ratio of `kind` at equal loss from the mean fits, and one per seed.
pub fn ratios(
    runs: &[LmRun],
    kind: AttentionKind,
) -> (
    std::result::Result<f64, String>,
    Vec<std::result::Result<f64, String>>,
) {
    let Some(n_ref) = reference_params(runs) else {
        return (Err("no standard runs".into()), Vec::new());
    };
    let one = |seed: Option<u64>| match (
        kind_fit(runs, AttentionKind::Standard, seed),
        kind_fit(runs, kind, seed),
    ) {
        (Some(s), Some(d)) => param_ratio(&s, &d, n_ref),
        _ => Err("undefined: fewer than two sizes".into()),
    };
    let per_seed = seeds_of(runs).into_iter().map(|s| one(Some(s))).collect();
    (one(None), per_seed)
}

fn size_label(plan: &LmPlan, s: usize) -> String {
    let (d, l) = plan.sizes[s];
    format!("D {d}, L {l}")
}

/// The Markdown sections for REPRO.md: `## Language modelling and scaling` and `## Ablation`.
/// `corpus` is `corpus_line`'s sentence.
pub fn lm_section(plan: &LmPlan, corpus: &str, runs: &[LmRun]) -> String {
    let mut s = String::new();
    let kinds = AttentionKind::ALL;
    let seeds = seeds_of(runs);
    let vals = |label: &str, size: usize, f: &dyn Fn(&LmRun) -> f64| -> Vec<f64> {
        select(runs, label, size).into_iter().map(f).collect()
    };
    let _ = writeln!(s, "## Language modelling and scaling (paper Section 3.2)\n");
    let _ = writeln!(
        s,
        "Paper: Diff Transformer reaches the Transformer's loss with about 65% of the parameters or training tokens (Figure 3; e.g. 6.8B Diff ≈ 11B Transformer). Here only the parameter side is measured: three sizes on one token budget.\n"
    );
    for line in [
        format!("Corpus: {corpus}."),
        format!(
            "Training: every kind and size sees the same token budget, {} steps × {} windows × {} bytes = {} bytes, windows at seeded uniform random starts in the training part (the same windows for every model of one seed), next-byte loss on every byte; AdamW (β 0.9/0.95, weight decay 0.1 on matrices), peak lr {}, {} warm-up steps, cosine to lr/10, gradient clip 1.",
            plan.steps,
            plan.batch,
            plan.context,
            thousands(plan.tokens() as usize),
            plan.lr,
            plan.warmup
        ),
        format!(
            "Validation loss: mean next-byte cross-entropy (nats) over {} windows of {} bytes spread evenly over the validation part, the same windows for every model.",
            plan.val_windows, plan.context
        ),
        format!(
            "Seeds: {} (mean ± sample standard deviation over seeds{}).",
            seeds.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "),
            if seeds.len() < 2 { "; one seed gives the mean only" } else { "" }
        ),
    ] {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(s);
    table_head(
        &mut s,
        &["kind", "size"],
        [
            "parameters",
            "validation loss",
            "final train loss (last 10 steps)",
            "seconds per run",
        ]
        .iter()
        .map(|c| c.to_string()),
    );
    for k in kinds {
        for size in 0..plan.sizes.len() {
            let _ = writeln!(
                s,
                "| {k} | {} | {} | {} | {} | {} |",
                size_label(plan, size),
                thousands(plan.config(k, size).num_params()),
                fmt_ms(&vals(k.as_str(), size, &|r| r.val_loss), 3),
                fmt_ms(&vals(k.as_str(), size, &|r| r.final_loss()), 3),
                fmt_ms(&vals(k.as_str(), size, &|r| r.seconds), 1)
            );
        }
    }
    let _ = writeln!(
        s,
        "\nFit per kind: L = a + b ln N over the {} sizes (N = all parameters, embeddings included; L the mean validation loss over seeds). With three points a power law with an irreducible term (E + A N^-α) would pass through any three losses, so only the straight line in ln N is fitted; its slope b says how fast the loss falls with size here, and nothing beyond the fitted range. The largest residual shows how far the points bend away from the line (a bend as large as the gaps between kinds makes the ratio a rough reading).\n",
        plan.sizes.len()
    );
    table_head(
        &mut s,
        &[
            "kind",
            "a",
            "b (per ln N)",
            "fitted loss at the middle size",
            "largest |residual|",
        ],
        std::iter::empty(),
    );
    let n_ref = reference_params(runs);
    for k in kinds {
        match (kind_fit(runs, k, None), n_ref) {
            (Some(f), Some(n)) => {
                let worst = kind_points(runs, k, None)
                    .iter()
                    .map(|&(p, l)| (l - f.loss_at(p)).abs())
                    .fold(0.0, f64::max);
                let _ = writeln!(
                    s,
                    "| {k} | {:.4} | {:+.4} | {:.4} | {worst:.4} |",
                    f.a,
                    f.b,
                    f.loss_at(n)
                );
            }
            _ => {
                let _ = writeln!(s, "| {k} | — | — | — | — |");
            }
        }
    }
    let lo = plan.config(AttentionKind::Standard, 0).num_params() as f64;
    let hi = plan
        .config(AttentionKind::Standard, plan.sizes.len() - 1)
        .num_params() as f64;
    let _ = writeln!(
        s,
        "\nParameter ratio at equal loss: the parameters each diff kind's fit needs to reach the standard fit's loss at the middle size ({}), divided by those {} (below 1: fewer parameters for the same loss, the paper's direction; the paper: about {PAPER_RATIO}). Per seed: the same reading from that seed's fits.\n",
        size_label(plan, plan.middle()),
        n_ref.map_or("—".into(), |n| thousands(n as usize))
    );
    table_head(
        &mut s,
        &["kind", "ratio (mean fits)", "ratio per seed", "paper"],
        std::iter::empty(),
    );
    let mut words = Vec::new();
    for k in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        let (mean_fit, per_seed) = ratios(runs, k);
        let ok: Vec<f64> = per_seed
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        let undefined = per_seed.len() - ok.len();
        // A seed whose fit is nearly flat can put the equal-loss point at an absurd size; such
        // readings are counted as beyond the sizes run, not averaged.
        let inside = |r: &f64| {
            let n = r * n_ref.unwrap_or(f64::NAN);
            n >= lo && n <= hi
        };
        let beyond = ok.iter().filter(|r| !inside(r)).count();
        let ok: Vec<f64> = ok.into_iter().filter(inside).collect();
        let mut notes = Vec::new();
        if undefined > 0 {
            notes.push(format!("{undefined} seed(s) undefined"));
        }
        if beyond > 0 {
            notes.push(format!("{beyond} seed(s) beyond the sizes run"));
        }
        let undefined = undefined + beyond;
        let seed_cell = match (ok.is_empty(), notes.is_empty()) {
            (true, _) => format!("none within the sizes run ({})", notes.join(", ")),
            (false, true) => fmt_ms(&ok, 3),
            (false, false) => format!("{} ({})", fmt_ms(&ok, 3), notes.join(", ")),
        };
        let cell = match &mean_fit {
            Ok(r) => {
                let n = r * n_ref.unwrap_or(f64::NAN);
                let outside = n < lo || n > hi;
                format!(
                    "{r:.3}{}",
                    if outside {
                        " (extrapolated beyond the sizes run)"
                    } else {
                        ""
                    }
                )
            }
            Err(e) => e.clone(),
        };
        let _ = writeln!(s, "| {k} | {cell} | {seed_cell} | ≈ {PAPER_RATIO} |");
        words.push(ratio_words(k, &mean_fit, &ok, undefined));
    }
    let _ = writeln!(
        s,
        "\n![validation loss against parameters]({SCALING_PLOT})\n"
    );
    let _ = writeln!(s, "What this says about the claim:\n");
    for w in words {
        let _ = writeln!(s, "{w}");
    }
    for k in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        for size in 0..plan.sizes.len() {
            let f = |r: &LmRun| r.val_loss;
            let _ = writeln!(
                s,
                "{}",
                compare(
                    &format!("validation loss at {}", size_label(plan, size)),
                    k,
                    &vals(k.as_str(), size, &f),
                    &vals(AttentionKind::Standard.as_str(), size, &f),
                    false
                )
            );
        }
    }
    if plan.quick {
        let _ = writeln!(
            s,
            "\nThis was a smoke run on a small text: read nothing into the comparisons above."
        );
    }

    let mid = plan.middle();
    let variants: Vec<&LmRun> = runs.iter().filter(|r| r.variant.is_some()).collect();
    let labels: Vec<(&str, usize)> = variant_labels(runs)
        .into_iter()
        .map(|l| {
            (
                l,
                variants
                    .iter()
                    .find(|r| r.label == l)
                    .map_or(0, |r| r.params),
            )
        })
        .collect();
    let _ = writeln!(s, "\n## Ablation (paper Table 6)\n");
    let _ = writeln!(
        s,
        "Paper: removing the per-head norm (subln) raises the loss; a constant λ_init (0.8 or 0.5) instead of the schedule 0.8 − 0.6 exp(−0.3 l) is about as good. Here: at the middle size ({}), the same training and validation as above.\n",
        size_label(plan, mid)
    );
    table_head(
        &mut s,
        &[
            "model",
            "parameters",
            "validation loss",
            "final train loss",
            "vs diff_v1 (validation)",
        ],
        std::iter::empty(),
    );
    let base = vals(AttentionKind::DiffV1.as_str(), mid, &|r| r.val_loss);
    let rows: Vec<(&str, usize)> = [AttentionKind::Standard, AttentionKind::DiffV1]
        .iter()
        .map(|k| (k.as_str(), plan.config(*k, mid).num_params()))
        .chain(labels.iter().copied())
        .collect();
    for (label, params) in rows {
        let v = vals(label, mid, &|r| r.val_loss);
        let delta = if label == AttentionKind::DiffV1.as_str() || v.is_empty() || base.is_empty() {
            "—".to_string()
        } else {
            format!("{:+.3}", mean_std(&v).0 - mean_std(&base).0)
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {delta} |",
            thousands(params),
            fmt_ms(&v, 3),
            fmt_ms(&vals(label, mid, &|r| r.final_loss()), 3)
        );
    }
    let _ = writeln!(s);
    if labels.is_empty() {
        let _ = writeln!(s, "No variants were run.");
    }
    for (label, _) in &labels {
        let paper = variants
            .iter()
            .find(|r| r.label == *label)
            .and_then(|r| r.variant)
            .unwrap_or(PaperSays::Nothing);
        let v = vals(label, mid, &|r| r.val_loss);
        let _ = writeln!(s, "{}", versus(label, &v, &base, paper));
    }
    s
}

/// A variant against the full diff_v1, in the words of `repro::compare`: direction against
/// what the paper says, and whether the gap exceeds the two seed spreads added.
fn versus(label: &str, v: &[f64], base: &[f64], paper: PaperSays) -> String {
    let (mv, sv) = mean_std(v);
    let (mb, sb) = mean_std(base);
    let separated = match (sv, sb) {
        (Some(a), Some(b)) => Some((mv - mb).abs() > a + b),
        _ => None,
    };
    let spread = match separated {
        Some(true) => "the gap is larger than the two seed spreads added",
        Some(false) => "the gap is within the seed spreads, so no difference is shown",
        None => "one seed only, so the spread is unknown",
    };
    let dir = if mv == mb || mv.is_nan() || mb.is_nan() {
        "no difference either way".to_string()
    } else {
        let d = if mv > mb { "higher" } else { "lower" };
        match paper {
            PaperSays::Higher => format!(
                "{d}, {} the paper's direction (removing it hurts)",
                if mv > mb { "in" } else { "against" }
            ),
            PaperSays::AboutEqual => format!("{d} (the paper: about as good)"),
            PaperSays::Nothing => d.to_string(),
        }
    };
    format!("- validation loss: {label} {mv:.3} vs diff_v1 {mb:.3} — {dir}; {spread}.")
}

fn ratio_words(
    k: AttentionKind,
    mean_fit: &std::result::Result<f64, String>,
    ok: &[f64],
    undefined: usize,
) -> String {
    let r = match mean_fit {
        Ok(r) => *r,
        Err(e) => {
            return format!(
                "- parameter ratio, {k}: {e}, so the claim cannot be read off this run."
            )
        }
    };
    let dir = if r < 1.0 {
        "below 1, the paper's direction (fewer parameters for the same loss)"
    } else {
        "not below 1, against the paper's direction"
    };
    let spread = match mean_std(ok) {
        (m, Some(sd)) if undefined == 0 => {
            if (m - 1.0).abs() > sd {
                format!("per seed {m:.3} ± {sd:.3}, so 1 lies outside one seed standard deviation")
            } else {
                format!("per seed {m:.3} ± {sd:.3}, so 1 lies within one seed standard deviation and no difference is shown")
            }
        }
        _ if undefined > 0 => {
            format!(
                "{undefined} seed(s) give no ratio within the sizes run, so the spread is unknown"
            )
        }
        _ => "one seed only, so the spread is unknown".into(),
    };
    format!(
        "- parameter ratio at equal loss, {k}: {r:.3} (paper ≈ {PAPER_RATIO}) — {dir}; {spread}."
    )
}

/// Validation loss against parameters (log x), one line per kind with ± one standard deviation
/// over seeds, and each variant as a point of its own.
pub fn plot_scaling(plan: &LmPlan, runs: &[LmRun], path: &Path) -> Result<()> {
    let point = |rs: Vec<&LmRun>| -> Option<Point> {
        let v: Vec<f64> = rs.iter().map(|r| r.val_loss).collect();
        let (y, sd) = mean_std(&v);
        (!rs.is_empty()).then(|| Point {
            x: rs[0].params as f64,
            y,
            sd,
        })
    };
    let mut lines: Vec<Line> = AttentionKind::ALL
        .iter()
        .map(|k| Line {
            label: k.as_str().to_string(),
            points: (0..plan.sizes.len())
                .filter_map(|s| point(select(runs, k.as_str(), s)))
                .collect(),
        })
        .collect();
    for label in variant_labels(runs) {
        lines.push(Line {
            label: label.to_string(),
            points: point(select(runs, label, plan.middle()))
                .into_iter()
                .collect(),
        });
    }
    let title = format!(
        "validation loss against parameters, {} training bytes each, mean ± sd over {} seed(s)",
        thousands(plan.tokens() as usize),
        seeds_of(runs).len()
    );
    plot_lines(
        &lines,
        &Axes {
            title: &title,
            x_label: "parameters (log scale)",
            y_label: "validation loss (nats per byte)",
            log_x: true,
            y_range: None,
        },
        path,
    )
}

/// Every run, the fits and the ratios, for results.json.
pub fn lm_json(runs: &[LmRun]) -> serde_json::Value {
    let fits: Vec<serde_json::Value> = AttentionKind::ALL
        .iter()
        .map(|&k| {
            let f = kind_fit(runs, k, None);
            json!({"kind": k.as_str(), "a": f.map(|f| f.a), "b": f.map(|f| f.b)})
        })
        .collect();
    let ratio = |r: &std::result::Result<f64, String>| match r {
        Ok(x) => json!(x),
        Err(e) => json!({"undefined": e}),
    };
    let ratios: Vec<serde_json::Value> = [AttentionKind::DiffV1, AttentionKind::DiffV2]
        .iter()
        .map(|&k| {
            let (m, per_seed) = ratios(runs, k);
            json!({"kind": k.as_str(), "mean_fits": ratio(&m), "per_seed": per_seed.iter().map(ratio).collect::<Vec<_>>()})
        })
        .collect();
    json!({
        "runs": runs.iter().map(|r| json!({
            "label": r.label,
            "kind": r.kind.as_str(),
            "variant": r.variant.is_some(),
            "size": r.size,
            "seed": r.seed,
            "params": r.params,
            "seconds": r.seconds,
            "final_loss": r.final_loss(),
            "val_loss": r.val_loss,
            "losses": r.losses,
        })).collect::<Vec<_>>(),
        "fits": fits,
        "param_ratio_at_equal_loss": ratios,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::evaluate_loss;

    #[test]
    fn fortunes_load_text_files_in_name_order_skipping_dat_symlinks_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("zippy"), "yow\n%\n").unwrap();
        std::fs::write(p.join("art"), "a picture\n%\nno newline").unwrap();
        std::fs::write(p.join("art.dat"), [0u8, 1, 2, 255]).unwrap();
        std::fs::write(p.join(".hidden"), "secret").unwrap();
        std::os::unix::fs::symlink(p.join("art"), p.join("art.u8")).unwrap();
        std::fs::create_dir(p.join("off")).unwrap();
        std::fs::write(p.join("off").join("rude"), "offensive\n").unwrap();
        let text = load_fortunes(p).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "a picture\n%\nno newline\nyow\n%\n"
        );
        // a plain text file is read as it is
        assert_eq!(load_fortunes(&p.join("art")).unwrap().len(), 22);
    }

    #[test]
    fn a_missing_corpus_is_one_line_that_says_how_to_install_it() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("fortunes");
        let e = load_fortunes(&gone).unwrap_err().to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with(gone.to_str().unwrap()), "{e}");
        assert!(e.contains("apt-get install fortunes"), "{e}");
        assert!(e.contains("or pass a text file"), "{e}");
        // a folder with nothing but index files is no corpus either
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("x.dat"), [0u8; 8]).unwrap();
        let e = load_fortunes(&gone).unwrap_err().to_string();
        assert!(e.contains("no fortune files"), "{e}");
    }

    #[test]
    fn the_last_tenth_of_the_bytes_is_validation() {
        let text: Vec<u8> = (0..95u8).collect();
        let (train, val) = split(&text);
        assert_eq!((train.len(), val.len()), (86, 9));
        assert_eq!(val[0], 86);
        assert_eq!(*val.last().unwrap(), 94);
        let line = corpus_line(Path::new("demo.txt"), &[b'x'; 1000]);
        assert!(
            line.contains("the first 900 bytes train, the last 100 (10%)"),
            "{line}"
        );
    }

    #[test]
    fn training_windows_are_seeded_and_stay_inside_the_training_part() {
        use rand::SeedableRng;
        // training bytes cycle through a..z; the validation part is all Z
        let mut text: Vec<u8> = (0..900).map(|i| b'a' + (i % 26) as u8).collect();
        text.extend([b'Z'; 100]);
        let (train, _) = split(&text);
        let (b, t) = (64, 32);
        let draw = |seed: u64| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (mut x, mut y) = (vec![0u32; b * t], vec![0u32; b * t]);
            fill_windows(&mut rng, train, &mut x, &mut y, b, t);
            (x, y)
        };
        let (x, y) = draw(7);
        assert_eq!((x.clone(), y.clone()), draw(7));
        assert_ne!(x, draw(8).0);
        assert!(x.iter().chain(&y).all(|&c| c != b'Z' as u32));
        for r in 0..b {
            for i in 0..t {
                let next = b'a' as u32 + (x[r * t + i] - b'a' as u32 + 1) % 26;
                assert_eq!(y[r * t + i], next);
                if i + 1 < t {
                    assert_eq!(x[r * t + i + 1], y[r * t + i]);
                }
            }
        }
        // 64 windows of 32 in 900 bytes: the starts are spread, not stuck
        let firsts: std::collections::BTreeSet<u32> = (0..b).map(|r| x[r * t]).collect();
        assert!(firsts.len() > 10, "{firsts:?}");
        // a training part of exactly one window has one start
        let (mut x1, mut y1) = (vec![0u32; t], vec![0u32; t]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        fill_windows(&mut rng, &train[5..5 + t + 1], &mut x1, &mut y1, 1, t);
        assert_eq!(x1[0], train[5] as u32);
        assert_eq!(y1[t - 1], train[5 + t] as u32);
    }

    #[test]
    fn validation_windows_are_evenly_spaced_from_the_first_byte_to_the_last() {
        assert_eq!(val_starts(1000, 99, 4), vec![0, 300, 600, 900]);
        assert_eq!(val_starts(1000, 99, 1), vec![0]);
        // more windows than starts: one per start
        assert_eq!(val_starts(12, 9, 10), vec![0, 1, 2]);
        assert!(val_starts(9, 9, 4).is_empty());
    }

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
    fn the_log_fit_recovers_a_line_and_inverts_it() {
        let line = |a: f64, b: f64| -> Vec<(f64, f64)> {
            [1e5, 3e5, 9e5]
                .iter()
                .map(|&n| (n, a + b * f64::ln(n)))
                .collect()
        };
        let f = LogFit::fit(&line(5.0, -0.2)).unwrap();
        assert!(
            (f.a - 5.0).abs() < 1e-9 && (f.b + 0.2).abs() < 1e-9,
            "{f:?}"
        );
        assert!((f.params_for(f.loss_at(2e5)).unwrap() / 2e5 - 1.0).abs() < 1e-9);
        // least squares through points off the line: the mean of the residuals is zero
        let noisy = vec![(1e5, 3.0), (3e5, 2.5), (9e5, 2.4)];
        let g = LogFit::fit(&noisy).unwrap();
        let r: f64 = noisy.iter().map(|&(n, l)| l - g.loss_at(n)).sum();
        assert!(r.abs() < 1e-9 && g.b < 0.0, "{g:?}");
        assert!(LogFit::fit(&[(1e5, 3.0), (1e5, 2.0)]).is_none());
        assert!(LogFit::fit(&[(1e5, 3.0)]).is_none());
        assert_eq!(LogFit { a: 1.0, b: 0.0 }.params_for(1.0), None);
    }

    #[test]
    fn the_ratio_at_equal_loss_is_below_one_for_a_lower_curve_and_undefined_when_flat() {
        let standard = LogFit { a: 5.0, b: -0.2 };
        // 0.1 nats lower at every size with the same slope: ln N shifts by 0.1 / 0.2
        let better = LogFit { a: 4.9, b: -0.2 };
        let r = param_ratio(&standard, &better, 3e5).unwrap();
        assert!((r - (-0.5f64).exp()).abs() < 1e-9, "{r}");
        let worse = LogFit { a: 5.1, b: -0.2 };
        assert!((param_ratio(&standard, &worse, 3e5).unwrap() - 0.5f64.exp()).abs() < 1e-9);
        let flat = LogFit { a: 2.0, b: 0.01 };
        let e = param_ratio(&standard, &flat, 3e5).unwrap_err();
        assert!(e.contains("undefined") && e.contains("+0.0100"), "{e}");
        let e = param_ratio(&flat, &better, 3e5).unwrap_err();
        assert!(e.contains("the standard loss does not fall"), "{e}");
    }

    fn fake_runs(diff_v2_flat: bool) -> (LmPlan, Vec<LmRun>) {
        let plan = LmPlan::full();
        let mut runs = Vec::new();
        for seed in 0..3u64 {
            let jitter = 0.01 * seed as f64;
            for size in 0..3 {
                for k in AttentionKind::ALL {
                    let n = plan.config(k, size).num_params() as f64;
                    let val = match k {
                        AttentionKind::Standard => 5.0 - 0.2 * n.ln(),
                        AttentionKind::DiffV1 => 4.9 - 0.2 * n.ln(),
                        AttentionKind::DiffV2 if diff_v2_flat => 2.5,
                        AttentionKind::DiffV2 => 5.05 - 0.2 * n.ln(),
                    } + jitter;
                    runs.push(LmRun {
                        label: k.as_str().into(),
                        kind: k,
                        variant: None,
                        size,
                        seed,
                        params: n as usize,
                        seconds: 1.0,
                        losses: vec![3.0; 20],
                        val_loss: val,
                    });
                }
            }
            let mut r = runs[runs.len() - 5].clone();
            assert_eq!((r.kind, r.size), (AttentionKind::DiffV1, 1));
            r.label = "diff_v1 no subln".into();
            r.variant = Some(PaperSays::Higher);
            r.val_loss += 0.2;
            runs.push(r.clone());
            r.label = "diff_v1 λ_init 0.8".into();
            r.variant = Some(PaperSays::AboutEqual);
            r.val_loss -= 0.2 + 0.001 * seed as f64;
            runs.push(r);
        }
        (plan, runs)
    }

    #[test]
    fn a_seed_whose_equal_loss_point_lies_far_beyond_the_sizes_is_not_averaged() {
        let (plan, mut runs) = fake_runs(false);
        // seed 2's diff_v1 loss barely falls with size and sits above standard: its fit meets
        // the standard loss only at an absurd size
        for r in runs.iter_mut() {
            if r.kind == AttentionKind::DiffV1 && r.variant.is_none() && r.seed == 2 {
                r.val_loss = 2.9 - 0.0001 * (r.params as f64).ln();
            }
        }
        let md = lm_section(&plan, "demo", &runs);
        assert!(
            md.contains("| diff_v1 |") && md.contains("(1 seed(s) beyond the sizes run)"),
            "{md}"
        );
        assert!(md.contains("give no ratio within the sizes run"), "{md}");
        assert!(!md.contains("e+"), "{md}");
    }

    #[test]
    fn the_report_reads_the_ratio_off_the_fits_and_compares_the_ablation() {
        let (plan, runs) = fake_runs(false);
        let (m, per_seed) = ratios(&runs, AttentionKind::DiffV1);
        assert!((m.unwrap() - (-0.5f64).exp()).abs() < 1e-6);
        assert_eq!(per_seed.len(), 3);
        let md = lm_section(&plan, "demo", &runs);
        assert!(md.contains("## Language modelling and scaling"), "{md}");
        assert!(
            md.contains("| diff_v1 | 0.607 | 0.607 ± 0.000 | ≈ 0.65 |"),
            "{md}"
        );
        // points on the line: a = 5 + the mean seed jitter, no residual
        assert!(
            md.contains("| standard | 5.0100 | -0.2000 | 2.4396 | 0.0000 |"),
            "{md}"
        );
        assert!(
            md.contains("parameter ratio at equal loss, diff_v1: 0.607 (paper ≈ 0.65) — below 1, the paper's direction"),
            "{md}"
        );
        // diff_v2 is 0.05 above standard everywhere: ratio e^0.25, against the paper
        assert!(md.contains("| diff_v2 | 1.284 |"), "{md}");
        assert!(
            md.contains("not below 1, against the paper's direction"),
            "{md}"
        );
        // 3 kinds × 3 sizes, each with the seed spread (0.010)
        let rows = md.lines().filter(|l| l.contains(" ± 0.010 |")).count();
        assert!(rows >= 9, "{md}");
        assert!(md.contains("## Ablation (paper Table 6)"), "{md}");
        assert!(md.contains("| diff_v1 no subln | "), "{md}");
        assert!(md.contains("| +0.200 |"), "{md}");
        assert!(
            md.contains("- validation loss: diff_v1 no subln 2.539 vs diff_v1 2.339 — higher, in the paper's direction (removing it hurts); the gap is larger than the two seed spreads added."),
            "{md}"
        );
        assert!(
            md.contains("- validation loss: diff_v1 λ_init 0.8 2.338 vs diff_v1 2.339 — lower (the paper: about as good); the gap is within the seed spreads, so no difference is shown."),
            "{md}"
        );
        assert_eq!(
            variant_labels(&runs),
            vec!["diff_v1 no subln", "diff_v1 λ_init 0.8"]
        );
        let ablation_rows = md
            .lines()
            .filter(|l| l.starts_with("| diff_v1 ") && !l.starts_with("| diff_v1 |"))
            .count();
        assert_eq!(ablation_rows, 2, "{md}");
        let j = lm_json(&runs);
        assert_eq!(j["runs"].as_array().unwrap().len(), 33);
        assert!(
            (j["param_ratio_at_equal_loss"][0]["mean_fits"]
                .as_f64()
                .unwrap()
                - 0.6065)
                .abs()
                < 1e-3
        );
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join(SCALING_PLOT);
        plot_scaling(&plan, &runs, &png).unwrap();
        assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
    }

    #[test]
    fn a_flat_curve_gives_an_undefined_ratio_not_a_number() {
        let (plan, runs) = fake_runs(true);
        let md = lm_section(&plan, "demo", &runs);
        assert!(
            md.contains(
                "| diff_v2 | undefined: this kind's loss does not fall with size (b = +0.0000)"
            ),
            "{md}"
        );
        assert!(md.contains("parameter ratio, diff_v2: undefined"), "{md}");
        let j = lm_json(&runs);
        assert!(j["param_ratio_at_equal_loss"][1]["mean_fits"]["undefined"].is_string());
    }

    #[test]
    fn plans_validate_and_variants_must_fit_the_plan() {
        for plan in [LmPlan::quick(), LmPlan::full()] {
            plan.validate(&[]).unwrap();
            for s in 0..3 {
                let n = plan.config(AttentionKind::Standard, s).num_params() as f64;
                let m = plan.config(AttentionKind::DiffV1, s).num_params() as f64;
                assert!((m / n - 1.0).abs() < 0.02, "{m} vs {n}");
                if s > 0 {
                    let below = plan.config(AttentionKind::Standard, s - 1).num_params();
                    assert!(n as usize > below);
                }
            }
        }
        let plan = LmPlan::full();
        assert_eq!(plan.tokens(), 819_200);
        let v = plan.variant("theta", AttentionKind::DiffV1, PaperSays::Nothing, |c| {
            c.rope_theta = 500.0
        });
        assert_eq!(v.config.hidden_size, 96);
        plan.validate(std::slice::from_ref(&v)).unwrap();
        let e = plan
            .validate(&[v.clone(), v.clone()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("variant label `theta`"), "{e}");
        let mut w = v.clone();
        w.label = "diff_v1".into();
        assert!(plan.validate(&[w]).is_err());
        let mut w = v;
        w.config.max_position_embeddings = 64;
        let e = plan.validate(&[w]).unwrap_err().to_string();
        assert!(e.contains("the context (64)"), "{e}");
        let mut p = LmPlan::quick();
        p.sizes = vec![(40, 1), (48, 1)];
        let e = p.validate(&[]).unwrap_err().to_string();
        assert!(e.contains("hidden size 40"), "{e}");
    }

    #[test]
    fn training_is_deterministic_and_every_kind_sees_the_same_bytes() {
        let mut plan = LmPlan::quick();
        plan.steps = 3;
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
