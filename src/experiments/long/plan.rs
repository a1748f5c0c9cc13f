//! The plan of `difftx repro --long`: what is trained (a learning-rate sweep per kind, the
//! kinds × seeds at their own best rate, the λ_init ablations, each model extended to 4C) and
//! what is measured, at a scale given by `full` or `quick`.

use crate::config::AttentionKind;
use crate::error::{Error, Result};
use crate::train::TrainOptions;
use std::path::{Path, PathBuf};

/// The model every kind is trained at: the kinds match in parameters (`matched_config`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Shape {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub head_dim: usize,
    pub tie_word_embeddings: bool,
}

/// What the study trains and measures.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LongPlan {
    pub name: &'static str,
    pub shape: Shape,
    /// the pretraining context C; extension goes to `extend_factor` × C
    pub context: usize,
    pub batch: usize,
    pub steps: u64,
    pub seeds: usize,
    /// the sweep's learning rates, each kind trained `sweep_steps` at each (seed 0)
    pub lrs: Vec<f32>,
    pub sweep_steps: u64,
    /// context extension: steps at extend_factor × C, with θ × extend_factor
    pub extend_factor: usize,
    pub extend_steps: u64,
    pub rope_theta: f64,
    /// diff_v1's Table 6 variants trained beside the schedule: constant λ_init 0.8, no subln
    pub ablations: bool,
    /// needle retrieval: the heatmap's needles and queries, the N of the accuracy-vs-N curve
    pub needles: usize,
    pub queries: usize,
    pub needle_counts: Vec<usize>,
    pub depths: Vec<f64>,
    pub episodes: usize,
    pub digits: usize,
    /// loss by position: buckets over windows of extend_factor × C
    pub buckets: usize,
    /// validation windows of the sweep's trainer (its rates are picked on them)
    pub val_windows: usize,
    /// validation windows of C scored for each trained model's loss (and by the trainer of
    /// every stage but the sweep, four times a run)
    pub eval_windows: usize,
    /// the hallucination proxy's passage, in tokens
    pub fact_context: usize,
    /// the hallucination proxy: made-up facts repeated through this share of the training
    /// bytes (facts.rs)
    pub facts: usize,
    pub fact_share: f64,
    pub bf16: bool,
}

/// One training run of the study: its folder is `OUT/runs/NAME`.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainUnit {
    pub name: String,
    pub stage: Stage,
    pub kind: AttentionKind,
    pub seed: u64,
    /// the diff_v1 ablation, if any: "lambda_init_0.8" or "no_subln"
    pub variant: Option<&'static str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// the learning-rate sweep: one unit per (kind, lr)
    Sweep(usize),
    Pretrain,
    Ablation,
    /// a pretrained model (the unit of the same kind and seed) continued at 4C
    Extend,
}

impl LongPlan {
    /// The study at the scale the issue asks for: ~14M-parameter models (a BPE vocabulary of
    /// 8,192, tied embeddings) at context 1,024, extended to 4,096.
    pub fn full() -> Self {
        LongPlan {
            name: "full",
            shape: Shape {
                hidden_size: 384,
                num_hidden_layers: 6,
                head_dim: 32,
                tie_word_embeddings: true,
            },
            context: 1024,
            batch: 2,
            steps: 72,
            seeds: 3,
            lrs: vec![1e-3, 2e-3, 4e-3],
            sweep_steps: 60,
            extend_factor: 4,
            extend_steps: 8,
            rope_theta: 10_000.0,
            ablations: true,
            needles: 4,
            queries: 2,
            needle_counts: vec![1, 2, 4, 6],
            depths: vec![0.0, 0.5, 1.0],
            episodes: 2,
            digits: 3,
            buckets: 16,
            val_windows: 64,
            eval_windows: 16,
            fact_context: 256,
            facts: 50,
            fact_share: 0.02,
            bf16: crate::kernels::Precision::new(true).is_some(),
        }
    }

    /// A smoke run of every stage on tiny models (CI runs it).
    pub fn quick() -> Self {
        LongPlan {
            name: "quick",
            shape: Shape {
                hidden_size: 64,
                num_hidden_layers: 2,
                head_dim: 16,
                tie_word_embeddings: false,
            },
            context: 160,
            batch: 2,
            steps: 12,
            seeds: 1,
            lrs: vec![2e-3, 4e-3],
            sweep_steps: 4,
            extend_factor: 2,
            extend_steps: 4,
            rope_theta: 10_000.0,
            ablations: true,
            needles: 1,
            queries: 1,
            needle_counts: vec![1, 2],
            depths: vec![0.0, 0.5, 1.0],
            episodes: 2,
            digits: 1,
            buckets: 4,
            val_windows: 4,
            eval_windows: 4,
            fact_context: 160,
            facts: 10,
            fact_share: 0.02,
            bf16: false,
        }
    }

    /// The evaluation lengths: C/2, C, 2C … extend_factor × C.
    pub fn lengths(&self) -> Vec<usize> {
        let mut l = vec![self.context / 2, self.context];
        while l.last().copied().unwrap_or(0) < self.context * self.extend_factor {
            l.push(l.last().unwrap() * 2);
        }
        l
    }

    /// The longest evaluation length.
    pub fn longest(&self) -> usize {
        self.context * self.extend_factor
    }

    /// Windows of the longest length holding as many tokens as `eval_windows` windows of C.
    pub fn longest_windows(&self) -> usize {
        (self.eval_windows * self.context).div_ceil(self.longest())
    }

    /// The extension's batch: as many tokens a step as at C, at least one window.
    pub fn extend_batch(&self) -> usize {
        self.batch.div_ceil(self.extend_factor).max(1)
    }

    /// Every setting in range, named on the first that is not.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(format!("repro --long plan: {m}")));
        if self.seeds == 0 || self.steps == 0 || self.batch == 0 || self.lrs.is_empty() {
            return bad("seeds, steps, batch and learning rates must be at least one".into());
        }
        if self.extend_factor < 1 || self.context < 16 {
            return bad(format!(
                "context {} × {}: the context must be at least 16 and the factor at least 1",
                self.context, self.extend_factor
            ));
        }
        if self.needle_counts.iter().any(|&n| n == 0 || n > 24) || self.queries == 0 {
            return bad("needle counts must be 1–24, queries at least 1".into());
        }
        Ok(())
    }

    /// The training units in the order they run. Pretraining and ablations take their
    /// kind's best sweep rate, which is known once the sweep has run.
    pub fn units(&self) -> Vec<TrainUnit> {
        let unit = |stage, kind: AttentionKind, seed: u64, variant: Option<&'static str>| {
            let name = match (stage, variant) {
                (Stage::Sweep(i), _) => format!("sweep-{kind}-lr{}", self.lrs[i]),
                (Stage::Pretrain, _) => format!("pretrain-{kind}-s{seed}"),
                (Stage::Ablation, Some(v)) => format!("ablation-{v}-s{seed}"),
                (Stage::Ablation, None) => unreachable!("an ablation names its variant"),
                (Stage::Extend, _) => format!("extend-{kind}-s{seed}"),
            };
            TrainUnit {
                name,
                stage,
                kind,
                seed,
                variant,
            }
        };
        let mut units = Vec::new();
        for kind in AttentionKind::ALL {
            for i in 0..self.lrs.len() {
                units.push(unit(Stage::Sweep(i), kind, 0, None));
            }
        }
        for seed in 0..self.seeds as u64 {
            for kind in AttentionKind::ALL {
                units.push(unit(Stage::Pretrain, kind, seed, None));
            }
        }
        if self.ablations {
            for variant in ["lambda_init_0.8", "no_subln"] {
                units.push(unit(
                    Stage::Ablation,
                    AttentionKind::DiffV1,
                    0,
                    Some(variant),
                ));
            }
        }
        for seed in 0..self.seeds as u64 {
            for kind in AttentionKind::ALL {
                units.push(unit(Stage::Extend, kind, seed, None));
            }
        }
        units
    }

    /// The options of `unit` over the corpus: data, tokenizer, model and schedule. `lr` is
    /// the unit's rate (the sweep's own, or the kind's best); `runs` the folder of all runs.
    pub fn options(
        &self,
        unit: &TrainUnit,
        corpus: &LongCorpus,
        lr: f32,
        runs: &Path,
    ) -> TrainOptions {
        // 1. Data and tokenizer
        let mut data = vec![corpus.train.display().to_string()];
        data.extend(corpus.facts.iter().map(|p| p.display().to_string()));
        let mut o = TrainOptions {
            data,
            val_data: vec![corpus.valid.display().to_string()],
            tokenizer: corpus.tokenizer.clone(),
            seed: Some(unit.seed),
            lr: Some(lr),
            min_lr: Some(lr / 10.0),
            batch: Some(self.batch),
            ckpt_every: Some(self.steps.div_ceil(4).max(1)),
            keep_last: Some(1),
            bf16: Some(self.bf16),
            ..TrainOptions::default()
        };
        // 2. The stage: its steps, and the model (new, or the pretrained one extended)
        let steps = match unit.stage {
            Stage::Sweep(_) => self.sweep_steps,
            Stage::Pretrain | Stage::Ablation => self.steps,
            Stage::Extend => self.extend_steps,
        };
        o.steps = Some(steps);
        o.warmup = Some((steps / 10).max(1));
        // the sweep's rates are compared on many windows twice a run; the other stages'
        // validation is the trainer's log only (the study measures them after): the
        // extension's once at its end, on as many tokens at 4C as the others' at C
        let (every, windows, batch) = match unit.stage {
            Stage::Sweep(_) => (self.sweep_steps.div_ceil(2), self.val_windows, self.batch),
            Stage::Extend => (steps, self.longest_windows(), self.extend_batch()),
            _ => (steps.div_ceil(4), self.eval_windows, self.batch),
        };
        o.eval_every = Some(every.max(1));
        o.val_batches = Some(windows.div_ceil(batch).max(1));
        if unit.stage == Stage::Extend {
            let from = runs.join(format!("pretrain-{}-s{}", unit.kind, unit.seed));
            o.init_from = Some(from);
            o.max_position_embeddings = Some(self.longest());
            o.rope_theta = Some(self.rope_theta * self.extend_factor as f64);
            o.batch = Some(self.extend_batch());
            o.tokenizer = None; // the model brings it
            return o;
        }
        let s = &self.shape;
        let c = crate::experiments::common::matched_config(
            unit.kind,
            s.hidden_size,
            s.num_hidden_layers,
            s.head_dim,
            self.context,
        );
        o.set_shape(&c);
        o.max_position_embeddings = Some(self.context);
        o.rope_theta = Some(self.rope_theta);
        o.tie_word_embeddings = Some(s.tie_word_embeddings);
        match unit.variant {
            Some("lambda_init_0.8") => o.lambda_init = Some(0.8),
            Some(_) => o.no_subln = Some(true),
            None => {}
        }
        o
    }

    /// The plan in lines, for `--dry-run` and the report: the units, their tokens, and what
    /// was cut to fit the budget.
    pub fn describe(&self) -> Vec<String> {
        let units = self.units();
        let tokens = |stage: Stage| -> u64 {
            let (steps, t, b) = match stage {
                Stage::Sweep(_) => (self.sweep_steps, self.context, self.batch),
                Stage::Pretrain | Stage::Ablation => (self.steps, self.context, self.batch),
                Stage::Extend => (self.extend_steps, self.longest(), self.extend_batch()),
            };
            steps * (t * b) as u64
        };
        let total: u64 = units.iter().map(|u| tokens(u.stage)).sum();
        let s = &self.shape;
        // training FLOPs ≈ 6 × parameters × tokens, at an 8,192-token vocabulary
        let mut c = crate::experiments::common::matched_config(
            AttentionKind::DiffV1,
            s.hidden_size,
            s.num_hidden_layers,
            s.head_dim,
            self.context,
        );
        c.vocab_size = 8192;
        c.tie_word_embeddings = s.tie_word_embeddings;
        let params = crate::config::params::ParamLayout::new(&c).total;
        let flops = 6.0 * params as f64 * total as f64;
        vec![
            format!(
                "plan {}: standard, diff_v1, diff_v2 at matched parameters (D {}, {} layers, head dim {}, tied embeddings {}), context C = {}, {} seed(s), {} products",
                self.name, s.hidden_size, s.num_hidden_layers, s.head_dim, s.tie_word_embeddings,
                self.context, self.seeds, if self.bf16 { "bf16" } else { "f32" }
            ),
            format!(
                "1. learning-rate sweep: {:?} × 3 kinds, {} steps each (seed 0); each kind then trains at its own best",
                self.lrs, self.sweep_steps
            ),
            format!(
                "2. pretraining: 3 kinds × {} seeds, {} steps of {} × {} tokens (language modelling only; retrieval is never trained)",
                self.seeds, self.steps, self.batch, self.context
            ),
            format!(
                "3. ablations (diff_v1, paper Table 6): {}",
                if self.ablations { "constant λ_init 0.8, no subln; seed 0" } else { "none" }
            ),
            format!(
                "4. context extension: every pretrained model {} more steps at {} tokens with RoPE θ {} → {}",
                self.extend_steps, self.longest(), self.rope_theta,
                self.rope_theta * self.extend_factor as f64
            ),
            format!(
                "5. measured on the pretrained and the extended models: validation loss at C ({} windows), loss by position up to {} ({} buckets), needle retrieval at lengths {:?} × depths {:?} ({} needles, {} asked, {} episodes per cell, corpus text as filler); on the extended ones accuracy against N ∈ {:?} at C; on the pretrained ones attention noise, outliers, q8_0/q4_0 loss, and answers from a passage of {} tokens against {} made-up facts repeated through {:.0}% of the training text; the ablations: their validation loss",
                self.eval_windows, self.longest(), self.buckets, self.lengths(), self.depths,
                self.needles, self.queries, self.episodes, self.needle_counts,
                self.fact_context.min(self.context), self.facts, self.fact_share * 100.0
            ),
            format!(
                "{} training runs, {:.1} M tokens in all: about {:.1} PFLOP for {:.1} M parameters at a vocabulary of 8,192, {:.1} h at a sustained 50 GFLOP/s (what two AVX2 cores reached on this shape at C, 6 × parameters × tokens; `difftx bench train` measures yours), plus the evaluations",
                units.len(), total as f64 / 1e6, flops / 1e15, params as f64 / 1e6,
                flops / 50e9 / 3600.0
            ),
            "cut to fit about two hours: few tokens per model (the models are far from converged; the report compares kinds trained alike, not their best), one seed for the sweep and the ablations, a short extension, few episodes per needle cell (their spread over seeds is reported); resumable: run the same command again after a crash or Ctrl-C".to_string(),
        ]
    }
}

/// The study's text: training and validation (split by document) and the tokenizer, as
/// `scripts/long_corpus.sh` writes them.
#[derive(Clone, Debug, PartialEq)]
pub struct LongCorpus {
    pub train: PathBuf,
    pub valid: PathBuf,
    /// None: byte-level
    pub tokenizer: Option<PathBuf>,
    /// the made-up facts trained on beside the text (the study writes them)
    pub facts: Option<PathBuf>,
}

impl LongCorpus {
    /// The corpus folder `dir`: `train/` (or `train.txt`), `valid.txt` and `tokenizer.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let missing = |what: &str| {
            Error::Invalid(format!(
                "{}: no {what} (make the corpus with scripts/long_corpus.sh)",
                dir.display()
            ))
        };
        let train = [dir.join("train"), dir.join("train.txt")]
            .into_iter()
            .find(|p| p.exists())
            .ok_or_else(|| missing("train/ or train.txt"))?;
        let valid = dir.join("valid.txt");
        if !valid.is_file() {
            return Err(missing("valid.txt"));
        }
        let tokenizer = dir.join("tokenizer.json");
        Ok(LongCorpus {
            train,
            valid,
            tokenizer: tokenizer.is_file().then_some(tokenizer),
            facts: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plans_validate_and_list_every_stage_once() {
        for plan in [LongPlan::full(), LongPlan::quick()] {
            plan.validate().unwrap();
            let units = plan.units();
            let names: std::collections::HashSet<_> = units.iter().map(|u| &u.name).collect();
            assert_eq!(names.len(), units.len(), "unit names are unique");
            let sweeps = units
                .iter()
                .filter(|u| matches!(u.stage, Stage::Sweep(_)))
                .count();
            assert_eq!(sweeps, 3 * plan.lrs.len());
            let extends: Vec<_> = units.iter().filter(|u| u.stage == Stage::Extend).collect();
            assert_eq!(extends.len(), 3 * plan.seeds);
            // every extension comes after the pretraining it starts from
            for e in extends {
                let from = format!("pretrain-{}-s{}", e.kind, e.seed);
                let at = |n: &str| units.iter().position(|u| u.name == n).unwrap();
                assert!(at(&from) < at(&e.name));
            }
            assert_eq!(*plan.lengths().last().unwrap(), plan.longest());
        }
        assert_eq!(LongPlan::full().lengths(), [512, 1024, 2048, 4096]);
    }
}
