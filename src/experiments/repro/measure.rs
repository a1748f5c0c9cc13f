//! One model of the needle experiment trained and measured: retrieval, attention allocation,
//! activation outliers, low-bit attention, accuracy against N and diff_v2's λ.

use super::plan::ReproPlan;
use crate::config::{AttentionKind, ModelConfig};
use crate::data::needle::fill_rows;
use crate::error::{Error, Result};
use crate::experiments::attention_stats::{
    attention_logits, episode_allocation, head_row, hidden_states, Allocation, Magnitudes,
};
use crate::experiments::common::{final_loss, kind_name, mean_std};
use crate::experiments::lm_scaling::LmRun;
use crate::experiments::needle::{accuracy, retrieval_grid, Cell, NeedleTask};
use crate::model::{Model, Workspace};
use crate::train::in_memory::{train_short, Trained};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Salt of the training episodes' generator (the model's initial weights use the seed itself).
const TRAIN_STREAM: u64 = 0x6e65_6564_6c65_7472;
/// Salts of the allocation and outlier episodes.
const ALLOC_STREAM: u64 = 0xa110_ca71_0000_0001;
const OUTLIER_STREAM: u64 = 0x0071_1e75_0000_0002;
const NEEDLES_STREAM: u64 = 0x4e4e_4e4e_0000_0003;

/// One trained model's measurements.
#[derive(Clone, Debug, Serialize)]
pub struct KindRun {
    #[serde(serialize_with = "kind_name")]
    pub kind: AttentionKind,
    pub seed: u64,
    pub params: usize,
    /// per-step training losses
    pub losses: Vec<f32>,
    /// λ per layer after each step (diff kinds)
    pub lambdas: Vec<Vec<f32>>,
    pub seconds: f64,
    /// what `measure` found, at the top level of the run's JSON
    #[serde(flatten)]
    pub measured: Measurements,
}

impl KindRun {
    /// One trained model of `kind` and what `measure` found; `seconds` of training.
    pub fn new(
        kind: AttentionKind,
        seed: u64,
        trained: Trained,
        seconds: f64,
        measured: Measurements,
    ) -> Self {
        KindRun {
            kind,
            seed,
            params: trained.model.num_params(),
            losses: trained.losses,
            lambdas: trained.lambdas,
            seconds,
            measured,
        }
    }

    /// Mean training loss of the last 10 steps.
    pub fn final_loss(&self) -> f64 {
        final_loss(&self.losses)
    }

    pub fn overall_accuracy(&self) -> f64 {
        accuracy(&self.measured.cells)
    }
}

/// Trains one model on the needle task (train/in_memory.rs): batches of fresh episodes in
/// windows drawn from multiples of 16 in [train_min_len, context]; the loss is on the answer
/// digits (`answer_only`) or on every byte. The episodes depend only on `seed`, so every kind
/// trained with one seed sees the same bytes.
pub fn train_needle(
    config: ModelConfig,
    plan: &ReproPlan,
    task: &NeedleTask,
    seed: u64,
    on_step: impl FnMut(u64, f32),
) -> Result<Trained> {
    let (b, ctx) = (plan.train.batch, plan.train.context);
    let (lo, hi) = (plan.train_min_len.div_ceil(16), ctx / 16);
    if lo > hi {
        return Err(Error::Invalid(format!(
            "no multiple of 16 between {} and {ctx} for the training windows",
            plan.train_min_len
        )));
    }
    let fill = |rng: &mut ChaCha8Rng, x: &mut [u32], y: &mut [u32]| -> Result<usize> {
        let t = 16 * rng.random_range(lo..=hi);
        fill_rows(task, plan.loss, rng, (x, y), b, t)?;
        Ok(t)
    };
    train_short(config, &plan.train, seed, TRAIN_STREAM, fill, on_step)
}

/// What `measure` finds for one trained model.
#[derive(Clone, Debug, Serialize)]
pub struct Measurements {
    pub cells: Vec<Cell>,
    pub allocation: Allocation,
    /// λ range over the allocation rows (diff kinds)
    pub lambda_range: Option<(f64, f64)>,
    pub logits: Magnitudes,
    pub hidden: Magnitudes,
    /// (bits, retrieval accuracy over all depths at the longest length)
    pub lowbit: Vec<(u32, f64)>,
    /// (N, retrieval accuracy over all depths at the longest length)
    pub by_needles: Vec<(usize, f64)>,
    /// diff_v2: σ(lambda_proj x) per (layer, head) over the outlier episodes' tokens
    pub head_lambdas: Vec<HeadLambda>,
}

/// Retrieval, allocation, outliers and low-bit retrieval of one trained model.
pub fn measure(model: &Model, plan: &ReproPlan, task: &NeedleTask) -> Result<Measurements> {
    let cells = retrieval_grid(
        model,
        task,
        &plan.lengths,
        &plan.depths,
        plan.episodes_per_cell,
        plan.eval_seed,
        plan.train.batch,
        None,
    )?;
    let lowbit = lowbit_accuracy(model, plan, task)?;
    let by_needles = accuracy_by_needles(model, plan, task)?;
    let (allocation, lambda_range) = allocation_and_lambdas(model, plan, task)?;
    let (logits, hidden, head_lambdas) = outliers(model, plan, task)?;
    Ok(Measurements {
        cells,
        allocation,
        lambda_range,
        logits,
        hidden,
        lowbit,
        by_needles,
        head_lambdas,
    })
}

/// The longest evaluation length, where the measurements beyond the retrieval grid run.
fn longest(plan: &ReproPlan) -> usize {
    *plan.lengths.last().expect("validated plan has lengths")
}

/// Low-bit attention: (bits, accuracy) at the longest length on the retrieval episodes (the
/// same seed) with quantised logits; bits 0 is full precision.
fn lowbit_accuracy(model: &Model, plan: &ReproPlan, task: &NeedleTask) -> Result<Vec<(u32, f64)>> {
    let mut lowbit = Vec::with_capacity(plan.lowbit_bits.len() + 1);
    for bits in std::iter::once(None).chain(plan.lowbit_bits.iter().map(|&b| Some(b))) {
        let cells = retrieval_grid(
            model,
            task,
            &[longest(plan)],
            &plan.depths,
            plan.lowbit_per_cell,
            plan.eval_seed,
            plan.train.batch,
            bits,
        )?;
        lowbit.push((bits.unwrap_or(0), accuracy(&cells)));
    }
    Ok(lowbit)
}

/// (N, accuracy over all queries) at the longest length, on episodes of their own.
fn accuracy_by_needles(
    model: &Model,
    plan: &ReproPlan,
    task: &NeedleTask,
) -> Result<Vec<(usize, f64)>> {
    let mut by_needles = Vec::with_capacity(plan.needle_counts.len());
    for &n in &plan.needle_counts {
        let t = NeedleTask {
            needles: n,
            queries: task.queries.min(n),
            ..task.clone()
        };
        let cells = retrieval_grid(
            model,
            &t,
            &[longest(plan)],
            &plan.depths,
            plan.lowbit_per_cell,
            plan.eval_seed ^ NEEDLES_STREAM,
            plan.train.batch,
            None,
        )?;
        let all: usize = cells.iter().map(|c| c.all_correct).sum();
        let total: usize = cells.iter().map(|c| c.all_total).sum();
        by_needles.push((n, all as f64 / total.max(1) as f64));
    }
    Ok(by_needles)
}

/// Allocation: the queried needle's sentence is the answer span, the rest of the haystack is
/// noise; rows are the positions that predict the answer digits. Also the range of λ over
/// those rows (diff kinds).
fn allocation_and_lambdas(
    model: &Model,
    plan: &ReproPlan,
    task: &NeedleTask,
) -> Result<(Allocation, Option<(f64, f64)>)> {
    let c = &model.config;
    let len = longest(plan);
    let mut ws = Workspace::new(model, 1, len);
    let mut rng = ChaCha8Rng::seed_from_u64(plan.eval_seed ^ ALLOC_STREAM);
    let (mut sum, mut n) = (Allocation::default(), 0usize);
    let mut lam: Option<(f64, f64)> = None;
    for &depth in &plan.depths {
        for _ in 0..plan.alloc_episodes {
            let e = task.episode(&mut rng, len, depth)?;
            let a = episode_allocation(model, &mut ws, &e, len)?;
            sum.answer += a.answer;
            sum.noise += a.noise;
            n += 1;
            if !c.attention.is_diff() {
                continue;
            }
            for l in 0..c.num_hidden_layers {
                for h in 0..c.num_attention_heads {
                    for i in e.answer_queries() {
                        let r = head_row(model, &ws, l, h, 0, i)?;
                        lam = Some(match lam {
                            None => (r.lambda, r.lambda),
                            Some((lo, hi)) => (lo.min(r.lambda), hi.max(r.lambda)),
                        });
                    }
                }
            }
        }
    }
    let alloc = Allocation {
        answer: sum.answer / n.max(1) as f64,
        noise: sum.noise / n.max(1) as f64,
    };
    Ok((alloc, lam))
}

/// Outliers: attention logits and block outputs over a few whole episodes, and diff_v2's λ
/// per head over their tokens.
fn outliers(
    model: &Model,
    plan: &ReproPlan,
    task: &NeedleTask,
) -> Result<(Magnitudes, Magnitudes, Vec<HeadLambda>)> {
    let len = longest(plan);
    let k = plan.outlier_sequences.max(1);
    let mut ws = Workspace::new(model, k, len);
    ws.keep_hidden_states(model);
    let mut rng = ChaCha8Rng::seed_from_u64(plan.eval_seed ^ OUTLIER_STREAM);
    let mut inputs = Vec::with_capacity(k * len);
    for _ in 0..k {
        let depth: f64 = rng.random();
        inputs.extend_from_slice(&task.episode(&mut rng, len, depth)?.tokens[..len]);
    }
    model.forward(&mut ws, &inputs, k, len)?;
    let logits = Magnitudes::of(&mut attention_logits(model, &ws))?;
    let hidden = Magnitudes::of(&mut hidden_states(model, &ws)?)?;
    Ok((logits, hidden, head_lambda_stats(model, &ws, k * len)))
}

/// diff_v2's per-token λ = σ(lambda_proj x) of each (layer, head) over the last forward's `n`
/// tokens: mean, standard deviation, min and max. Empty for the other kinds.
pub fn head_lambda_stats(model: &Model, ws: &Workspace, n: usize) -> Vec<HeadLambda> {
    let c = &model.config;
    if c.attention != AttentionKind::DiffV2 {
        return Vec::new();
    }
    let h = c.num_attention_heads;
    let mut out = Vec::with_capacity(c.num_hidden_layers * h);
    for (layer, a) in ws.layers.iter().enumerate() {
        for head in 0..h {
            let v: Vec<f64> = (0..n).map(|i| a.lam[i * h + head] as f64).collect();
            let (mean, sd) = mean_std(&v);
            out.push(HeadLambda {
                layer,
                head,
                mean,
                sd: sd.unwrap_or(0.0),
                min: v.iter().copied().fold(f64::INFINITY, f64::min),
                max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            });
        }
    }
    out
}

/// One diff_v2 head's λ statistics over tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HeadLambda {
    pub layer: usize,
    pub head: usize,
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_trains_on_the_same_bytes_and_training_is_deterministic() {
        let mut plan = ReproPlan::quick();
        plan.train.steps = 2;
        plan.train.batch = 2;
        let task = plan.task();
        let run = |k| {
            train_needle(plan.model_config(k), &plan, &task, 3, |_, _| {})
                .unwrap()
                .losses
        };
        let a = run(AttentionKind::DiffV1);
        assert_eq!(a, run(AttentionKind::DiffV1));
        assert_eq!(a.len(), 2);
        assert!(a.iter().all(|l| l.is_finite() && *l > 0.0));
        // the data stream depends on the seed only: the first loss of an untrained model is
        // close to ln 256 for every kind
        for k in AttentionKind::ALL {
            assert!((run(k)[0] - (256f32).ln()).abs() < 0.2);
        }
    }
}

/// The language models' validation loss with weights and activations quantised (paper §3.7's
/// low-bit claim at the weight and activation level): one row per kind, size and format, over
/// the seeds.
#[derive(Clone, Debug, Serialize)]
pub struct WeightQuantRow {
    pub kind: &'static str,
    /// index into the LM plan's sizes
    pub size: usize,
    pub params: usize,
    pub format: &'static str,
    /// per seed: the f32 loss, the quantised loss, and the increase in percent of the f32 loss
    pub f32_loss: Vec<f64>,
    pub loss: Vec<f64>,
    pub increase_pct: Vec<f64>,
    /// share of the linear layers' and LM head's parameters held in blocks (the rest stay
    /// f32: their width is not a multiple of 32)
    pub quantised_share: f64,
}

/// A row for every kind, size and format of the kinds' own LM runs that were scored quantised
/// (`LmRun::quant`), the seeds gathered, in the order kind, size, format.
pub fn weight_quant_rows(lm: &[LmRun]) -> Vec<WeightQuantRow> {
    let mut rows: Vec<WeightQuantRow> = Vec::new();
    for r in lm.iter().filter(|r| r.variant.is_none()) {
        for q in &r.quant {
            let at = rows.iter().position(|w| {
                w.kind == r.kind.as_str() && w.size == r.size && w.format == q.format
            });
            let i = at.unwrap_or_else(|| {
                rows.push(WeightQuantRow {
                    kind: r.kind.as_str(),
                    size: r.size,
                    params: r.params,
                    format: q.format,
                    f32_loss: Vec::new(),
                    loss: Vec::new(),
                    increase_pct: Vec::new(),
                    quantised_share: q.quantised_params as f64 / q.matrix_params.max(1) as f64,
                });
                rows.len() - 1
            });
            let w = &mut rows[i];
            w.f32_loss.push(r.val_loss);
            w.loss.push(q.val_loss);
            w.increase_pct
                .push(100.0 * (q.val_loss - r.val_loss) / r.val_loss);
        }
    }
    rows.sort_by_key(|w| (kind_index(w.kind), w.size, w.format));
    rows
}

fn kind_index(name: &str) -> usize {
    AttentionKind::ALL
        .iter()
        .position(|k| k.as_str() == name)
        .unwrap_or(usize::MAX)
}
