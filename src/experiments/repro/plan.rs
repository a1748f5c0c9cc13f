//! The repro plan: the needle experiment's models, training and measurements, and the plans
//! of the in-context learning and language-modelling experiments it also runs.

use crate::config::{swiglu_width, AttentionKind, ModelConfig};
pub use crate::data::needle::NeedleLoss;
use crate::error::{Error, Result};
use crate::experiments::common::matched_config;
use crate::experiments::icl::IclPlan;
use crate::experiments::lm_scaling::{LmPlan, PaperSays, Variant};
use crate::experiments::needle::{NeedleTask, DEPTHS};
use crate::kernels::quant::QuantKind;
use crate::train::in_memory::ShortRun;
use crate::util::thousands;

/// Everything a repro run does; `quick()` and `full()` are the two plans the CLI offers.
#[derive(Clone, Debug, PartialEq)]
pub struct ReproPlan {
    pub quick: bool,
    pub seeds: usize,
    /// D, L and d; the kinds get H heads of d as in the presets
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub head_dim: usize,
    /// steps, episodes per step, the training context (the models' context too), peak lr and
    /// warm-up
    pub train: ShortRun,
    pub needles: usize,
    /// R: needles queried per episode (the first at the cell's depth)
    pub queries: usize,
    /// which bytes of an episode the training loss is on
    pub loss: NeedleLoss,
    pub digits: usize,
    pub language_seed: u64,
    /// training windows are drawn uniformly from multiples of 16 in [train_min_len, context]
    pub train_min_len: usize,
    /// evaluation context lengths (input tokens) and depths
    pub lengths: Vec<usize>,
    pub depths: Vec<f64>,
    pub episodes_per_cell: usize,
    pub eval_seed: u64,
    /// allocation: episodes per depth at the longest length
    pub alloc_episodes: usize,
    /// outliers: sequences at the longest length
    pub outlier_sequences: usize,
    /// low-bit attention: logit bit widths, and episodes per depth at the longest length
    pub lowbit_bits: Vec<u32>,
    pub lowbit_per_cell: usize,
    /// accuracy against N: needle counts evaluated at the longest length (models train on
    /// `needles`), `lowbit_per_cell` episodes per depth
    pub needle_counts: Vec<usize>,
    /// language modelling on a text corpus at three sizes, and the ablations
    pub lm: LmPlan,
    /// many-shot in-context classification
    pub icl: IclPlan,
}

impl ReproPlan {
    /// The smoke run CI does: D 64, 2 layers, 200 steps, two lengths; about 15 s on 2 cores
    /// (release build).
    pub fn quick() -> Self {
        ReproPlan {
            quick: true,
            seeds: 1,
            hidden_size: 64,
            num_hidden_layers: 2,
            head_dim: 16,
            train: ShortRun {
                steps: 200,
                batch: 8,
                context: 192,
                lr: 3e-3,
                warmup: 10,
            },
            needles: 2,
            queries: 1,
            loss: NeedleLoss::Answers,
            digits: 3,
            language_seed: 1,
            train_min_len: 128,
            lengths: vec![128, 192],
            depths: DEPTHS.to_vec(),
            episodes_per_cell: 8,
            eval_seed: 20_241_007,
            alloc_episodes: 2,
            outlier_sequences: 2,
            lowbit_bits: vec![16, 8, 6, 4],
            lowbit_per_cell: 8,
            needle_counts: vec![1, 2],
            lm: LmPlan {
                quant: QuantKind::ALL.to_vec(),
                ..LmPlan::quick()
            },
            icl: IclPlan::quick(),
        }
    }

    /// The full run: D 64, 2 layers, context 192, N = 2 needles with R = 2 queries of 2-digit
    /// numbers, 6,000 steps. Chosen with the standard model alone (pilot runs, release build):
    /// at 3,000 steps with D 64 and 4-digit answers it had learned nothing; at these settings
    /// it retrieves 4–42% of the needles after 4,000 steps, with its loss still falling. About
    /// 2 minutes per model on 2 cores, 9 models ≈ 20 minutes.
    pub fn full() -> Self {
        ReproPlan {
            quick: false,
            seeds: 3,
            hidden_size: 64,
            num_hidden_layers: 2,
            head_dim: 16,
            train: ShortRun {
                steps: 6000,
                batch: 8,
                context: 192,
                lr: 3e-3,
                warmup: 300,
            },
            needles: 2,
            queries: 2,
            loss: NeedleLoss::Answers,
            digits: 2,
            language_seed: 1,
            train_min_len: 160,
            lengths: vec![160, 176, 192],
            depths: DEPTHS.to_vec(),
            episodes_per_cell: 40,
            eval_seed: 20_241_007,
            alloc_episodes: 4,
            outlier_sequences: 4,
            lowbit_bits: vec![16, 8, 6, 4],
            lowbit_per_cell: 16,
            needle_counts: vec![1, 2, 3],
            lm: LmPlan {
                quant: QuantKind::ALL.to_vec(),
                ..LmPlan::full()
            },
            icl: IclPlan::full(),
        }
    }

    pub fn task(&self) -> NeedleTask {
        NeedleTask::synthetic(self.needles, self.queries, self.digits, self.language_seed)
    }

    /// The model of one kind (`matched_config`).
    pub fn model_config(&self, kind: AttentionKind) -> ModelConfig {
        matched_config(
            kind,
            self.hidden_size,
            self.num_hidden_layers,
            self.head_dim,
            self.train.context,
        )
    }

    /// Checks that the plan can run, naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.seeds == 0 {
            return bad("--seeds must be at least 1".into());
        }
        if self.train.steps == 0 {
            return bad("--steps must be at least 1".into());
        }
        if self.head_dim == 0 || self.hidden_size < 2 * self.head_dim {
            return bad(format!(
                "hidden_size {} must hold at least one differential head of 2 × {}",
                self.hidden_size, self.head_dim
            ));
        }
        let min = self.task().min_len();
        if self.train_min_len < min || self.train_min_len > self.train.context {
            return bad(format!(
                "training windows of {}..{} tokens cannot hold {} needles (at least {min} tokens)",
                self.train_min_len, self.train.context, self.needles
            ));
        }
        for &l in &self.lengths {
            if l < min || l > self.train.context {
                return bad(format!(
                    "evaluation length {l} must be in {min}..={} ({} needles need {min} tokens; the context is {})",
                    self.train.context, self.needles, self.train.context
                ));
            }
        }
        for &n in &self.needle_counts {
            let task = NeedleTask {
                needles: n,
                queries: self.queries.min(n),
                ..self.task()
            };
            let longest = self.lengths.last().copied().unwrap_or(0);
            if n == 0 || task.min_len() > longest {
                return bad(format!(
                    "{n} needles do not fit the longest evaluation length {longest}"
                ));
            }
        }
        if self.lengths.is_empty() || self.depths.is_empty() || self.train.batch == 0 {
            return bad("a plan needs lengths, depths and a batch".into());
        }
        for k in AttentionKind::ALL {
            self.model_config(k).validate().map_err(Error::Invalid)?;
        }
        self.icl.validate()?;
        self.lm.validate(&self.ablations())
    }

    /// The Table 6 rows run at the language model's middle size: diff_v1 without the per-head
    /// norm (the paper: worse) and with a constant λ_init of 0.8 (the paper: about as good).
    pub fn ablations(&self) -> Vec<Variant> {
        vec![
            self.lm.variant(
                "diff_v1 without subln",
                AttentionKind::DiffV1,
                PaperSays::Higher,
                |c| c.subln = false,
            ),
            self.lm.variant(
                "diff_v1, λ_init 0.8 constant",
                AttentionKind::DiffV1,
                PaperSays::AboutEqual,
                |c| c.lambda_init = Some(0.8),
            ),
        ]
    }

    /// What the plan will run, one line each (printed before a run and by --dry-run).
    pub fn describe(&self) -> Vec<String> {
        let params: Vec<String> = AttentionKind::ALL
            .iter()
            .map(|&k| format!("{k} {}", thousands(self.model_config(k).num_params())))
            .collect();
        vec![
            format!(
                "{} run: 3 kinds × {} seed(s), {} steps each of {} episodes (windows of {}–{} bytes)",
                if self.quick { "quick" } else { "full" },
                self.seeds,
                self.train.steps,
                self.train.batch,
                self.train_min_len,
                self.train.context
            ),
            format!(
                "models: D {}, {} layers, head dim {}, SwiGLU {}; parameters {}",
                self.hidden_size,
                self.num_hidden_layers,
                self.head_dim,
                swiglu_width(self.hidden_size),
                params.join(", ")
            ),
            format!(
                "task: {} needles of {} digits, {} queried, loss on {}, synthetic filler (language seed {}); retrieval at lengths {:?} × depths {:?}, {} episodes per cell",
                self.needles,
                self.digits,
                self.queries,
                self.loss.describe(),
                self.language_seed,
                self.lengths,
                self.depths.iter().map(|d| format!("{:.0}%", d * 100.0)).collect::<Vec<_>>(),
                self.episodes_per_cell
            ),
            format!(
                "also at length {}: accuracy against N ∈ {:?} and low-bit attention at {:?} bits ({} episodes per depth), attention allocation ({} episodes per depth), outliers ({} sequences)",
                self.lengths.last().copied().unwrap_or(0),
                self.needle_counts,
                self.lowbit_bits,
                self.lowbit_per_cell,
                self.alloc_episodes,
                self.outlier_sequences
            ),
        ]
        .into_iter()
        .chain(self.icl.describe())
        .chain(self.lm.describe())
        .chain(std::iter::once(format!(
            "ablations at the middle language-model size, {} seed(s) each: {}",
            self.seeds,
            self.ablations()
                .iter()
                .map(|v| v.label.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        )))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_valid_and_match_parameters_across_kinds() {
        for plan in [ReproPlan::quick(), ReproPlan::full()] {
            plan.validate().unwrap();
            let s = plan.model_config(AttentionKind::Standard).num_params() as f64;
            for k in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
                let n = plan.model_config(k).num_params() as f64;
                assert!((n / s - 1.0).abs() < 0.02, "{k}: {n} vs {s}");
            }
        }
        let mut p = ReproPlan::quick();
        p.seeds = 0;
        assert!(p.validate().unwrap_err().to_string().contains("--seeds"));
        p.seeds = 1;
        p.lengths = vec![64];
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("evaluation length 64"), "{e}");
    }
}
