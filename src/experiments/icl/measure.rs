//! In-context learning measured: training a model on the task, its answers, accuracy against
//! shots and over orders of the demonstrations.

use super::plan::IclPlan;
use super::task::{reference_predict, test_set, IclEpisode, IclTask, Relabel, TestEpisode};
use crate::config::{AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::experiments::common::{argmax, final_loss, kind_name, mean_std};
use crate::model::{Model, Workspace};
use crate::train::in_memory::{train_short, Trained};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::time::Instant;

/// Salt of the training episodes' generator (the model's initial weights use the seed itself).
const TRAIN_STREAM: u64 = 0x1c1_0000_7ea1_0001;

/// The label among `labels` with the largest logit in `row` (the first at a tie).
pub fn pick_label(row: &[f32], labels: &[u8]) -> u8 {
    let scores: Vec<f32> = labels.iter().map(|&l| row[l as usize]).collect();
    labels[argmax(&scores)]
}

/// The model's answer to each prompt: the argmax of its next-token logits at the query's input
/// (the last input token) over the episode's K labels. All prompts have the same length; `ws` holds at least
/// `episodes.len()` × that many tokens.
pub fn predict(model: &Model, ws: &mut Workspace, episodes: &[IclEpisode]) -> Result<Vec<u8>> {
    let v = model.config.vocab_size;
    if v < 256 {
        return Err(Error::Invalid(format!(
            "in-context classification needs the byte-level vocabulary (256), the model has {v}"
        )));
    }
    let Some(first) = episodes.first() else {
        return Ok(Vec::new());
    };
    let t = first.len();
    crate::experiments::common::forward_prompts(
        model,
        ws,
        episodes.iter().map(|e| &e.tokens[..e.len()]),
        t,
    )?;
    Ok(episodes
        .iter()
        .enumerate()
        .map(|(b, e)| {
            let p = b * t + t - 1;
            pick_label(&ws.logits[p * v..(p + 1) * v], &e.labels)
        })
        .collect())
}

/// Accuracy of the same test set under P orders of the demonstrations.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct OrderStats {
    /// accuracy over the test set, one per order
    pub accuracy: Vec<f64>,
    /// fraction of test episodes whose correctness differs between orders
    pub flipped: f64,
}

impl OrderStats {
    /// From `correct[p][e]`: whether episode e is answered right under order p.
    pub fn of(correct: &[Vec<bool>]) -> Self {
        let n = correct.first().map_or(0, |c| c.len());
        let accuracy = correct
            .iter()
            .map(|c| c.iter().filter(|&&x| x).count() as f64 / n.max(1) as f64)
            .collect();
        let flips = (0..n)
            .filter(|&e| correct.iter().any(|c| c[e] != correct[0][e]))
            .count();
        OrderStats {
            accuracy,
            flipped: flips as f64 / n.max(1) as f64,
        }
    }

    pub fn best(&self) -> f64 {
        self.accuracy.iter().copied().fold(f64::NAN, f64::max)
    }

    pub fn worst(&self) -> f64 {
        self.accuracy.iter().copied().fold(f64::NAN, f64::min)
    }

    /// Best − worst accuracy over the orders.
    pub fn spread(&self) -> f64 {
        self.best() - self.worst()
    }

    /// Sample standard deviation of the accuracy over the orders (0 for one order).
    pub fn std(&self) -> f64 {
        mean_std(&self.accuracy).1.unwrap_or(0.0)
    }

    pub fn mean(&self) -> f64 {
        mean_std(&self.accuracy).0
    }
}

/// What `evaluate` measures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct IclScores {
    /// (shots, accuracy) with the demonstrations in their drawn order
    pub by_shots: Vec<(usize, f64)>,
    /// at the test set's `max_shots`, over its orders
    pub orders: OrderStats,
}

/// Accuracy against shots and over orders on `tests`, `batch` prompts at a time; `answer`
/// returns the predicted label of each prompt of a batch (prompts of one length).
pub fn evaluate(
    task: &IclTask,
    tests: &[TestEpisode],
    shots: &[usize],
    batch: usize,
    mut answer: impl FnMut(&[IclEpisode]) -> Result<Vec<u8>>,
) -> Result<IclScores> {
    let batch = batch.max(1);
    let mut correct = |prompts: Vec<IclEpisode>| -> Result<Vec<bool>> {
        let mut out = Vec::with_capacity(prompts.len());
        for group in prompts.chunks(batch) {
            let got = answer(group)?;
            if got.len() != group.len() {
                return Err(Error::Invalid(format!(
                    "{} answers to a batch of {} prompts",
                    got.len(),
                    group.len()
                )));
            }
            out.extend(group.iter().zip(got).map(|(e, l)| e.answer() == l));
        }
        Ok(out)
    };
    let mut by_shots = Vec::with_capacity(shots.len());
    for &n in shots {
        if tests.iter().any(|t| t.demos.len() < n) {
            return Err(Error::Invalid(format!(
                "{n} shots asked of test episodes with fewer demonstrations"
            )));
        }
        let c = correct(tests.iter().map(|t| t.prompt(task, n)).collect())?;
        by_shots.push((
            n,
            c.iter().filter(|&&x| x).count() as f64 / c.len().max(1) as f64,
        ));
    }
    let orders = tests.first().map_or(0, |t| t.orders.len());
    let per_order = (0..orders)
        .map(|p| correct(tests.iter().map(|t| t.permuted(task, p)).collect()))
        .collect::<Result<Vec<_>>>()?;
    Ok(IclScores {
        by_shots,
        orders: OrderStats::of(&per_order),
    })
}

/// Trains one model on windows full of episodes (`context` tokens rounded down to whole
/// items): the first `rotated_rows()` of each batch relabelled by a rotation, the rest at
/// random; the loss is on the label bytes (`labels_only`) or on every byte. The windows depend
/// only on `seed`, so every kind trained with one seed sees the same bytes.
pub fn train_icl(
    config: ModelConfig,
    plan: &IclPlan,
    task: &IclTask,
    seed: u64,
    on_step: impl FnMut(u64, f32),
) -> Result<Trained> {
    let b = plan.train.batch;
    let shots = task.max_shots(plan.train.context);
    if shots == 0 {
        return Err(Error::Invalid(format!(
            "a context of {} tokens holds no demonstration of {} bytes",
            plan.train.context,
            task.item_len()
        )));
    }
    let t = task.prompt_len(shots);
    let rotated = plan.rotated_rows();
    let fill = |rng: &mut ChaCha8Rng, x: &mut [u32], y: &mut [u32]| -> Result<usize> {
        for r in 0..b {
            let how = if r < rotated {
                Relabel::Rotation
            } else {
                Relabel::Random
            };
            let e = task.episode(rng, shots, how);
            x[r * t..(r + 1) * t].copy_from_slice(&e.tokens[..t]);
            if plan.labels_only {
                y[r * t..(r + 1) * t].copy_from_slice(&e.label_targets());
            } else {
                y[r * t..(r + 1) * t].copy_from_slice(&e.tokens[1..]);
            }
        }
        Ok(t)
    };
    train_short(config, &plan.train, seed, TRAIN_STREAM, fill, on_step)
}

/// Accuracy against shots and over orders of one model on the plan's test set.
pub fn measure_icl(model: &Model, plan: &IclPlan, task: &IclTask) -> Result<IclScores> {
    let tests = test_set(
        task,
        plan.test_episodes,
        plan.max_shots(),
        plan.orders,
        plan.eval_seed,
    );
    let mut ws = Workspace::new(
        model,
        plan.eval_batch.max(1),
        task.prompt_len(plan.max_shots()),
    );
    evaluate(task, &tests, &plan.shots, plan.eval_batch, |group| {
        predict(model, &mut ws, group)
    })
}

/// The reference reader's scores on the plan's test set (no model).
pub fn icl_reference(plan: &IclPlan) -> Result<IclScores> {
    let task = plan.task()?;
    let tests = test_set(
        &task,
        plan.test_episodes,
        plan.max_shots(),
        plan.orders,
        plan.eval_seed,
    );
    evaluate(&task, &tests, &plan.shots, plan.eval_batch, |group| {
        Ok(group.iter().map(|e| reference_predict(&task, e)).collect())
    })
}

/// One trained model's in-context learning measurements.
#[derive(Clone, Debug, Serialize)]
pub struct IclRun {
    #[serde(serialize_with = "kind_name")]
    pub kind: AttentionKind,
    pub seed: u64,
    pub params: usize,
    /// training seconds, and evaluation seconds
    pub seconds: f64,
    pub eval_seconds: f64,
    /// per-step training losses
    pub losses: Vec<f32>,
    /// (shots, accuracy), demonstrations in their drawn order
    pub by_shots: Vec<(usize, f64)>,
    /// accuracy per order of the largest shot count, and the episodes whose answer flips
    pub orders: OrderStats,
}

impl IclRun {
    /// Mean training loss of the last 10 steps.
    pub fn final_loss(&self) -> f64 {
        final_loss(&self.losses)
    }

    /// Accuracy at `shots` (NaN when not measured).
    pub fn at(&self, shots: usize) -> f64 {
        self.by_shots
            .iter()
            .find(|x| x.0 == shots)
            .map_or(f64::NAN, |x| x.1)
    }

    /// Best − worst accuracy over the orders.
    pub fn spread(&self) -> f64 {
        self.orders.spread()
    }
}

/// Trains and measures every kind with seeds 0..seeds; `note` receives a line per model.
pub fn run_icl(plan: &IclPlan, seeds: usize, mut note: impl FnMut(&str)) -> Result<Vec<IclRun>> {
    plan.validate()?;
    if seeds == 0 {
        return Err(Error::Invalid("--seeds must be at least 1".into()));
    }
    let task = plan.task()?;
    let mut runs = Vec::with_capacity(seeds * 3);
    for seed in 0..seeds as u64 {
        for kind in AttentionKind::ALL {
            let t0 = Instant::now();
            let trained = train_icl(plan.model_config(kind), plan, &task, seed, |_, _| {})?;
            let seconds = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let scores = measure_icl(&trained.model, plan, &task)?;
            let r = IclRun {
                kind,
                seed,
                params: trained.model.num_params(),
                seconds,
                eval_seconds: t1.elapsed().as_secs_f64(),
                losses: trained.losses,
                by_shots: scores.by_shots,
                orders: scores.orders,
            };
            note(&format!(
                "icl {kind} seed {seed}: {} steps in {:.0} s (+{:.0} s eval), final loss {:.3}, accuracy {} at {:?} shots, order spread {:.3}",
                plan.train.steps,
                r.seconds,
                r.eval_seconds,
                r.final_loss(),
                r.by_shots
                    .iter()
                    .map(|x| format!("{:.2}", x.1))
                    .collect::<Vec<_>>()
                    .join("/"),
                plan.shots,
                r.spread()
            ));
            runs.push(r);
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> IclTask {
        IclPlan::full().task().unwrap()
    }

    #[test]
    fn a_prediction_is_the_best_of_the_episodes_labels_only() {
        let mut row = vec![0.0f32; 256];
        row[b'x' as usize] = 9.0; // not a label
        row[b'5' as usize] = 5.0; // a digit, but not one of this episode's labels
        row[b'3' as usize] = 2.0;
        row[b'7' as usize] = 3.0;
        assert_eq!(pick_label(&row, b"0371"), b'7');
        row[b'0' as usize] = 3.0; // a tie goes to the first label of the episode
        assert_eq!(pick_label(&row, b"0371"), b'0');
    }

    #[test]
    fn order_statistics_of_a_constructed_case() {
        // 3 orders × 4 episodes
        let correct = vec![
            vec![true, true, false, false],
            vec![true, true, true, false],
            vec![true, false, false, false],
        ];
        let o = OrderStats::of(&correct);
        assert_eq!(o.accuracy, vec![0.5, 0.75, 0.25]);
        assert_eq!((o.best(), o.worst(), o.spread()), (0.75, 0.25, 0.5));
        assert!((o.mean() - 0.5).abs() < 1e-12);
        // sample standard deviation of 0.5, 0.75, 0.25
        assert!((o.std() - 0.25).abs() < 1e-12);
        // episodes 1 and 2 are right under some orders and wrong under others
        assert_eq!(o.flipped, 0.5);
    }

    #[test]
    fn evaluation_scores_what_the_scorer_answers() {
        let t = task();
        let n = 40;
        let tests = test_set(&t, n, 8, 3, 7);
        // a scorer that always answers the first demonstration's label
        let first = |g: &[IclEpisode]| -> Result<Vec<u8>> {
            Ok(g.iter().map(|e| e.tokens[1] as u8).collect())
        };
        let s = evaluate(&t, &tests, &[1, 8], 16, first).unwrap();
        // by hand: right when the first demonstration has the query's class, whatever the shots
        let right = |first: &dyn Fn(&TestEpisode) -> usize| {
            tests
                .iter()
                .filter(|e| e.demos[first(e)].class == e.query.class)
                .count() as f64
                / n as f64
        };
        let want = right(&|_| 0);
        assert_eq!(s.by_shots, vec![(1, want), (8, want)]);
        // under order p the first demonstration is demos[orders[p][0]]
        for (p, &acc) in s.orders.accuracy.iter().enumerate() {
            assert_eq!(acc, right(&|e| e.orders[p][0]));
        }
        assert!(s.orders.spread() > 0.0, "{:?}", s.orders);
        // the reference reader does not depend on the order and beats chance with 8 shots
        let r = evaluate(&t, &tests, &[1, 8], 16, |g| {
            Ok(g.iter().map(|e| reference_predict(&t, e)).collect())
        })
        .unwrap();
        assert_eq!((r.orders.spread(), r.orders.flipped), (0.0, 0.0));
        assert!(r.by_shots[1].1 > 0.4, "{r:?}");
        // asking for more shots than the test episodes hold is an error that says so
        let e = evaluate(&t, &tests, &[9], 16, first)
            .unwrap_err()
            .to_string();
        assert!(e.contains("9 shots"), "{e}");
    }

    #[test]
    fn every_kind_trains_on_the_same_label_bytes_and_training_is_deterministic() {
        let mut plan = IclPlan::quick();
        plan.train.steps = 2;
        plan.train.warmup = 1;
        let task = plan.task().unwrap();
        let run = |k| {
            train_icl(plan.model_config(k), &plan, &task, 3, |_, _| {})
                .unwrap()
                .losses
        };
        let a = run(AttentionKind::DiffV1);
        assert_eq!(a, run(AttentionKind::DiffV1));
        // untrained, every kind starts near ln 256 on the label bytes
        for k in AttentionKind::ALL {
            assert!((run(k)[0] - (256f32).ln()).abs() < 0.2);
        }
    }
}
