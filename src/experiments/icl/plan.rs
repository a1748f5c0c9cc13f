//! The in-context learning experiment's plan.

use super::task::IclTask;
use crate::config::{swiglu_width, AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::experiments::common::matched_config;
use crate::train::in_memory::ShortRun;
use crate::util::thousands;

/// offers.
#[derive(Clone, Debug, PartialEq)]
pub struct IclPlan {
    pub quick: bool,
    /// D, L and d (`matched_config`; the context is the training run's)
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub head_dim: usize,
    /// steps, windows per step, the context in bytes, peak lr and warm-up
    pub train: ShortRun,
    /// K, letters per class, input length, noise ε and the seed of the classes
    pub classes: usize,
    pub letters_per_class: usize,
    pub input_len: usize,
    pub noise: f64,
    pub task_seed: u64,
    /// the share of each training batch relabelled by a rotation (the rest: random)
    pub rotation_fraction: f64,
    /// train on the label bytes only (the rest `IGNORE`d), not on every byte
    pub labels_only: bool,
    /// shot counts evaluated; the last is the largest, where the orders are permuted
    pub shots: Vec<usize>,
    pub test_episodes: usize,
    /// P: orders of the demonstrations per test episode
    pub orders: usize,
    pub eval_seed: u64,
    /// prompts per forward pass in evaluation
    pub eval_batch: usize,
}

impl IclPlan {
    /// The CI smoke run: the full plan's task and models on a shorter context (15 shots), 40
    /// steps and 32 test episodes; 0.3 s for the three kinds (release build, 2 cores).
    pub fn quick() -> Self {
        IclPlan {
            quick: true,
            train: ShortRun {
                steps: 40,
                batch: 8,
                context: 32,
                lr: 3e-3,
                warmup: 4,
            },
            shots: vec![1, 2, 4, 8, 15],
            test_episodes: 32,
            orders: 4,
            eval_batch: 32,
            ..Self::full()
        }
    }

    /// The full run: D 32, 2 layers, head dim 8, context 64 (31 shots), 4,000 steps of 16
    /// windows. Timed on the 2-core machine (release build, 1 thread): 31–35 s of training for
    /// standard and diff_v1, 45–48 s for diff_v2, 1 s of evaluation each; 3 kinds × 3 seeds in
    /// 341 s.
    pub fn full() -> Self {
        IclPlan {
            quick: false,
            hidden_size: 32,
            num_hidden_layers: 2,
            head_dim: 8,
            train: ShortRun {
                steps: 4000,
                batch: 16,
                context: 64,
                lr: 3e-3,
                warmup: 40,
            },
            classes: 6,
            letters_per_class: 2,
            input_len: 1,
            noise: 0.2,
            task_seed: 1,
            rotation_fraction: 0.5,
            labels_only: true,
            shots: vec![1, 2, 4, 8, 16, 31],
            test_episodes: 256,
            orders: 8,
            eval_seed: 20_241_008,
            eval_batch: 64,
        }
    }

    pub fn task(&self) -> Result<IclTask> {
        IclTask::synthetic(
            self.classes,
            self.letters_per_class,
            self.input_len,
            self.noise,
            self.task_seed,
        )
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

    /// The largest shot count, where the orders are permuted.
    pub fn max_shots(&self) -> usize {
        self.shots.last().copied().unwrap_or(0)
    }

    /// Rows of each training batch relabelled by a rotation (the first ones).
    pub fn rotated_rows(&self) -> usize {
        ((self.train.batch as f64 * self.rotation_fraction).round() as usize).min(self.train.batch)
    }

    /// Checks that the plan can run, naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        let task = self.task()?;
        if self.train.steps == 0 || self.train.batch == 0 || self.train.warmup >= self.train.steps {
            return bad(format!(
                "in-context learning: {} steps, {} warm-up steps and a batch of {}: need a batch, and more steps than warm-up steps",
                self.train.steps, self.train.warmup, self.train.batch
            ));
        }
        if !(0.0..=1.0).contains(&self.rotation_fraction) {
            return bad(format!(
                "rotation_fraction {} is outside [0, 1]",
                self.rotation_fraction
            ));
        }
        if self.shots.is_empty() || self.shots.windows(2).any(|w| w[0] >= w[1]) {
            return bad(format!(
                "shots {:?} must be increasing and not empty",
                self.shots
            ));
        }
        let fit = task.max_shots(self.train.context);
        if self.shots[0] == 0 || self.max_shots() > fit {
            return bad(format!(
                "shots {:?} must be between 1 and {fit} (what a context of {} holds, {} bytes a shot)",
                self.shots,
                self.train.context,
                task.item_len()
            ));
        }
        if self.test_episodes == 0 || self.orders < 2 {
            return bad(format!(
                "{} test episodes and {} orders: need at least 1 and 2",
                self.test_episodes, self.orders
            ));
        }
        for k in AttentionKind::ALL {
            self.model_config(k).validate().map_err(Error::Invalid)?;
        }
        Ok(())
    }

    /// What the plan will run, one line each.
    pub fn describe(&self) -> Vec<String> {
        let params: Vec<String> = AttentionKind::ALL
            .iter()
            .map(|&k| format!("{k} {}", thousands(self.model_config(k).num_params())))
            .collect();
        vec![
            format!(
                "in-context learning: {} steps of {} windows of {} bytes ({} of them rotation-relabelled; loss on {}); models D {}, {} layers, head dim {}, SwiGLU {}; parameters {}",
                self.train.steps,
                self.train.batch,
                self.train.context,
                self.rotated_rows(),
                if self.labels_only { "the labels" } else { "every byte" },
                self.hidden_size,
                self.num_hidden_layers,
                self.head_dim,
                swiglu_width(self.hidden_size),
                params.join(", ")
            ),
            format!(
                "task: K = {} classes of {} letters, inputs of {} letter(s) with noise {}; accuracy at {:?} shots and over {} orders of {} shots on {} test episodes",
                self.classes,
                self.letters_per_class,
                self.input_len,
                self.noise,
                self.shots,
                self.orders,
                self.max_shots(),
                self.test_episodes
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_valid_match_parameters_and_name_what_does_not_fit() {
        for plan in [IclPlan::quick(), IclPlan::full()] {
            plan.validate().unwrap();
            let s = plan.model_config(AttentionKind::Standard).num_params() as f64;
            for k in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
                let n = plan.model_config(k).num_params() as f64;
                assert!((n / s - 1.0).abs() < 0.02, "{k}: {n} vs {s}");
            }
        }
        assert_eq!(IclPlan::full().rotated_rows(), 8);
        let mut p = IclPlan::full();
        p.shots = vec![1, 32];
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("between 1 and 31"), "{e}");
        let mut p = IclPlan::full();
        p.train.warmup = p.train.steps;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("warm-up"), "{e}");
    }
}
