//! The language-modelling plan: sizes, the training run, validation windows, and the variants
//! run at the middle size.

use crate::config::{swiglu_width, AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::experiments::common::matched_config;
use crate::kernels::quant::QuantKind;
use crate::train::in_memory::ShortRun;
use crate::util::thousands;
use serde::Serialize;

/// What Table 6 says of a variant's validation loss against the full diff_v1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
    /// steps, windows per step, the training and validation windows' length in bytes, peak lr
    /// and warm-up
    pub train: ShortRun,
    /// validation windows, evenly spaced over the validation bytes (`val_starts`)
    pub val_windows: usize,
    /// formats each kind's own models are also scored in, quantised as `eval --quant` does
    /// (`Model::quantize`); none unless the caller asks (`difftx repro` asks for all)
    pub quant: Vec<QuantKind>,
}

impl LmPlan {
    /// The CI smoke run on data/demo.txt: D 32/48/64, 1–2 layers, 40 steps of 4 × 64 bytes;
    /// about 1 s for the nine models in a release build (one busy core).
    pub fn quick() -> Self {
        LmPlan {
            quick: true,
            sizes: vec![(32, 1), (48, 1), (64, 2)],
            head_dim: 8,
            train: ShortRun {
                steps: 40,
                batch: 4,
                context: 64,
                lr: 3e-3,
                warmup: 4,
            },
            val_windows: 16,
            quant: Vec::new(),
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
            train: ShortRun {
                steps: 400,
                batch: 16,
                context: 128,
                lr: 6e-3,
                warmup: 40,
            },
            val_windows: 512,
            quant: Vec::new(),
        }
    }

    /// Index of the middle size.
    pub fn middle(&self) -> usize {
        self.sizes.len() / 2
    }

    /// The model of `kind` at size `size` (an index into `sizes`).
    pub fn config(&self, kind: AttentionKind, size: usize) -> ModelConfig {
        let (d, l) = self.sizes[size];
        matched_config(kind, d, l, self.head_dim, self.train.context)
    }

    /// Training bytes (tokens) per model: steps × batch × context.
    pub fn tokens(&self) -> u64 {
        self.train.steps * (self.train.batch * self.train.context) as u64
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
        if self.train.steps == 0
            || self.train.batch == 0
            || self.train.context < 2
            || self.val_windows == 0
        {
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
            if v.config.max_position_embeddings != self.train.context || v.config.vocab_size != 256
            {
                return bad(format!(
                    "variant `{}`: the context ({}) and vocabulary ({}) must be the plan's ({} and 256)",
                    v.label, v.config.max_position_embeddings, v.config.vocab_size, self.train.context
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
                self.train.steps,
                self.train.batch,
                self.train.context,
                thousands(self.tokens() as usize),
                self.train.lr,
                self.train.warmup
            ),
            format!("sizes (head dim {}): {}", self.head_dim, sizes.join("; ")),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
