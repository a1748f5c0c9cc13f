//! What `repro --long` measures on each trained model: its validation loss at C, its loss by
//! position up to the longest length, multi-needle retrieval in haystacks of corpus text, and
//! λ over training (from the run's metrics log).

use super::plan::{LongPlan, Stage, TrainUnit};
use crate::config::AttentionKind;
use crate::data::needle::{Filler, NeedleTask};
use crate::data::Tokenizer;
use crate::error::{Error, Result};
use crate::experiments::attention_stats::{
    attention_logits, episode_allocation, hidden_states, Allocation, Magnitudes,
};
use crate::experiments::needle::{accuracy, retrieval_grid, Cell};
use crate::infer::{evaluate_by_position, Bucket, ByPosition};
use crate::kernels::quant::QuantKind;
use crate::model::{Model, Workspace};
use crate::train::checkpoint::model_dir;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// The seed of every model's needle episodes: all models see the same haystacks.
const EPISODES_SEED: u64 = 20_251_128;

/// The seed of the made-up facts (the training text's and the test's).
pub const FACTS_SEED: u64 = 36;

/// One training run's measurements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnitResult {
    pub name: String,
    pub kind: String,
    pub seed: u64,
    pub stage: String,
    pub variant: Option<String>,
    pub lr: f32,
    pub params: usize,
    /// the trainer's last validation loss
    pub val_loss: f64,
    pub train_seconds: f64,
    /// measured on trained models only (not on the sweep's)
    pub eval: Option<ModelEval>,
    /// (step, mean λ over the layers) from the metrics log; empty for standard
    pub lambda: Vec<(u64, f64)>,
}

/// The evaluations of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelEval {
    /// the mean loss over validation windows of C
    pub loss_at_c: f64,
    /// windows of the longest length: each bucket's mean and the cumulative mean
    pub by_position: Vec<BucketRow>,
    /// retrieval per (length, depth) with the plan's N and R
    pub cells: Vec<CellRow>,
    /// retrieval at C against the number of needles (extended models; empty on the others)
    pub by_needles: Vec<(usize, f64)>,
    /// what is measured on the models at C only (None on the extended ones)
    #[serde(default)]
    pub at_c: Option<AtC>,
}

/// The measures of a model at its pretraining context C.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AtC {
    /// attention mass on the queried needle and on the rest of the haystack, episodes at C
    /// (paper Table 3)
    pub answer_mass: f64,
    pub noise_mass: f64,
    /// the largest attention logit and block output over their medians, a window of text at
    /// C (paper Table 5)
    pub logit_top1_ratio: f64,
    pub hidden_top1_ratio: f64,
    /// the loss at C with q8_0 and q4_0 weights (and int8 inputs), less the f32 loss
    pub q8_0_increase: f64,
    pub q4_0_increase: f64,
    /// the share of made-up facts answered from a passage that contradicts them (facts.rs)
    pub from_context: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketRow {
    pub start: usize,
    pub end: usize,
    pub loss: f64,
    pub cumulative: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellRow {
    pub len: usize,
    pub depth: f64,
    pub accuracy: f64,
}

impl ModelEval {
    /// Retrieval over every cell of `len`.
    pub fn at_length(&self, len: usize) -> f64 {
        let c: Vec<f64> = self
            .cells
            .iter()
            .filter(|c| c.len == len)
            .map(|c| c.accuracy)
            .collect();
        c.iter().sum::<f64>() / c.len().max(1) as f64
    }
}

/// The measurements of `unit`, trained into the run folder `run`: the sweep's are its
/// validation loss; a trained model's are every evaluation of `evaluate`.
pub fn measure_unit(
    plan: &LongPlan,
    unit: &TrainUnit,
    run: &Path,
    valid: &[u8],
    (lr, seconds): (f32, f64),
) -> Result<UnitResult> {
    // 1. What the run logged: its last validation loss and λ over training
    let (val_loss, lambda) = read_metrics(run)?;
    let (dir, _) = model_dir(run)?;
    let mut model = crate::interop::load(&dir)?;
    model.precision = crate::kernels::Precision::new(plan.bf16).unwrap_or_default();
    // 2. The evaluations, on the models the report reads (the ablations: their loss only)
    let eval = match unit.stage {
        Stage::Sweep(_) | Stage::Ablation => None,
        s => Some(evaluate(plan, &mut model, &dir, valid, s)?),
    };
    Ok(UnitResult {
        name: unit.name.clone(),
        kind: unit.kind.as_str().into(),
        seed: unit.seed,
        stage: stage_name(unit.stage).into(),
        variant: unit.variant.map(str::to_string),
        lr,
        params: model.num_params(),
        val_loss,
        train_seconds: seconds,
        eval,
        lambda: if unit.kind == AttentionKind::Standard {
            Vec::new()
        } else {
            lambda
        },
    })
}

/// The sweep's rate with the lowest validation loss for `kind` (the plan's first before the
/// sweep has run).
pub fn best_lr(plan: &LongPlan, kind: AttentionKind, results: &[UnitResult]) -> f32 {
    results
        .iter()
        .filter(|r| r.stage == "sweep" && r.kind == kind.as_str() && r.val_loss.is_finite())
        .min_by(|a, b| a.val_loss.total_cmp(&b.val_loss))
        .map_or(plan.lrs[0], |r| r.lr)
}

pub fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Sweep(_) => "sweep",
        Stage::Pretrain => "pretrain",
        Stage::Ablation => "ablation",
        Stage::Extend => "extend",
    }
}

/// The last validation loss and (step, mean λ) of every logged step of `run`'s metrics.
fn read_metrics(run: &Path) -> Result<(f64, Vec<(u64, f64)>)> {
    let path = run.join(crate::train::metrics::METRICS_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let (mut val, mut lambda) = (f64::NAN, Vec::new());
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| Error::Data {
            path: path.clone(),
            msg: format!("malformed line ({e})"),
        })?;
        if let Some(x) = v["val_loss"].as_f64() {
            val = x;
        }
        if let (Some(step), Some(l)) = (v["step"].as_u64(), v["lambda"].as_array()) {
            let xs: Vec<f64> = l.iter().filter_map(|x| x.as_f64()).collect();
            if !xs.is_empty() {
                lambda.push((step, xs.iter().sum::<f64>() / xs.len() as f64));
            }
        }
    }
    Ok((val, lambda))
}

/// A model's evaluations over the validation text `valid` (which is the needles' filler
/// too): loss at C, loss by position at the longest length (the rotary table extended past
/// a model's own context), retrieval per (length, depth); against N on the extended
/// models, the measures at C (`AtC`) on the pretrained ones.
fn evaluate(
    plan: &LongPlan,
    model: &mut Model,
    dir: &Path,
    valid: &[u8],
    stage: Stage,
) -> Result<ModelEval> {
    // 1. Tokens: as many for every model, whatever its context
    let tok = Tokenizer::for_model(dir, &model.config)?;
    let ids = tok.encode(&String::from_utf8_lossy(valid))?;
    let (c, longest) = (plan.context, plan.longest());
    if ids.len() < longest + 1 {
        return Err(Error::Invalid(format!(
            "the validation text has {} tokens, fewer than one window of {longest}",
            ids.len()
        )));
    }
    if model.config.max_position_embeddings < longest {
        model.set_context(longest)?;
    }
    // 2. Loss at C, and by position up to the longest length, over windows spread evenly
    //    through the validation text (as many tokens at either length)
    let windows = plan.eval_windows;
    let (loss_at_c, _) = spread(model, &ids, windows, c)?;
    let (_, at) = spread(model, &ids, plan.longest_windows(), longest)?;
    let by_position = at.buckets(plan.buckets).iter().map(row).collect();
    let batch = plan.batch;
    // 3. Retrieval in haystacks of the validation text
    let filler = Filler::Text(Arc::new(valid.to_vec()));
    let tok_for_facts = Tokenizer::for_model(dir, &model.config)?;
    let bpe = tok.file().is_some().then(|| Arc::new(tok));
    let task = |needles: usize| NeedleTask {
        needles,
        queries: plan.queries.min(needles),
        digits: plan.digits,
        filler: filler.clone(),
        tokenizer: bpe.clone(),
    };
    let grid = |t: &NeedleTask, lengths: &[usize]| {
        retrieval_grid(
            model,
            t,
            lengths,
            &plan.depths,
            plan.episodes,
            EPISODES_SEED,
            batch,
            None,
        )
    };
    let cells: Vec<Cell> = grid(&task(plan.needles), &plan.lengths())?;
    let mut by_needles = Vec::with_capacity(plan.needle_counts.len());
    if stage == Stage::Extend {
        for &k in &plan.needle_counts {
            by_needles.push((k, accuracy(&grid(&task(k), &[c])?)));
        }
    }
    let at_c = match stage {
        Stage::Pretrain => {
            let facts = (&tok_for_facts, valid);
            Some(at_context(
                plan,
                model,
                &ids,
                loss_at_c,
                &task(plan.needles),
                facts,
            )?)
        }
        _ => None,
    };
    Ok(ModelEval {
        loss_at_c,
        by_position,
        cells: cells
            .iter()
            .map(|c| CellRow {
                len: c.len,
                depth: c.depth,
                accuracy: c.accuracy(),
            })
            .collect(),
        by_needles,
        at_c,
    })
}

/// The measures at C: attention on the needle against the rest (Table 3), outliers (Table
/// 5), the loss under q8_0 and q4_0 weights, and answers from the context against the facts
/// trained on.
fn at_context(
    plan: &LongPlan,
    model: &Model,
    ids: &[u32],
    loss_at_c: f64,
    task: &NeedleTask,
    (tok, valid): (&Tokenizer, &[u8]),
) -> Result<AtC> {
    // 1. Attention allocation and magnitudes
    let c = plan.context;
    let alloc = allocation_at(model, task, c, &plan.depths, plan.episodes.max(1))?;
    let (logits, hidden) = outliers(model, &ids[..c], c)?;
    // 2. Quantised weights: the loss at C under q8_0 and q4_0
    let increase = |kind: QuantKind| -> Result<f64> {
        let mut q = model.clone();
        q.quantize(kind);
        Ok(spread(&q, ids, plan.eval_windows, c)?.0 - loss_at_c)
    };
    // 3. Answers from a passage that contradicts a fact trained on
    let facts = super::facts::facts(plan.facts, FACTS_SEED);
    let text = String::from_utf8_lossy(valid);
    let len = plan.fact_context.min(c);
    let from_context = super::facts::from_context_rate(model, tok, &facts, &text, len)?;
    Ok(AtC {
        answer_mass: alloc.answer,
        noise_mass: alloc.noise,
        logit_top1_ratio: logits.top1_ratio(),
        hidden_top1_ratio: hidden.top1_ratio(),
        q8_0_increase: increase(QuantKind::Q8_0)?,
        q4_0_increase: increase(QuantKind::Q4_0)?,
        from_context,
    })
}

/// The mean attention allocation over `per_depth` episodes of `len` tokens at each depth:
/// the queried needle's tokens are the answer, the rest of the haystack the noise, the rows
/// those that predict the answer.
fn allocation_at(
    model: &Model,
    task: &NeedleTask,
    len: usize,
    depths: &[f64],
    per_depth: usize,
) -> Result<Allocation> {
    let mut ws = Workspace::new(model, 1, len);
    let mut rng = ChaCha8Rng::seed_from_u64(EPISODES_SEED ^ 0xa110c);
    let (mut sum, mut n) = (Allocation::default(), 0);
    for &depth in depths {
        for _ in 0..per_depth {
            let e = task.episode(&mut rng, len, depth)?;
            let a = episode_allocation(model, &mut ws, &e, len)?;
            sum.answer += a.answer;
            sum.noise += a.noise;
            n += 1;
        }
    }
    Ok(Allocation {
        answer: sum.answer / n as f64,
        noise: sum.noise / n as f64,
    })
}

/// The magnitudes of the attention logits and of the block outputs over one window of text.
fn outliers(model: &Model, window: &[u32], len: usize) -> Result<(Magnitudes, Magnitudes)> {
    let mut ws = Workspace::new(model, 1, len);
    ws.keep_hidden_states(model);
    model.forward(&mut ws, window, 1, len)?;
    let logits = Magnitudes::of(&mut attention_logits(model, &ws))?;
    let hidden = Magnitudes::of(&mut hidden_states(model, &ws)?)?;
    Ok((logits, hidden))
}

/// The loss of `n` windows of `len` tokens at evenly spaced offsets of `ids` (the first at
/// the start, the last at the end): the mean, and by position.
fn spread(model: &Model, ids: &[u32], n: usize, len: usize) -> Result<(f64, ByPosition)> {
    let span = ids.len() - len - 1;
    let n = n.clamp(1, span / len + 1);
    let mut at = ByPosition {
        sum: vec![0.0; len],
        count: vec![0; len],
    };
    for i in 0..n {
        let s = if n > 1 { i * span / (n - 1) } else { 0 };
        let (_, one) = evaluate_by_position(model, &ids[s..s + len + 1], 1, len, |_, _| {})?;
        at.sum.iter_mut().zip(&one.sum).for_each(|(a, b)| *a += b);
        at.count
            .iter_mut()
            .zip(&one.count)
            .for_each(|(a, b)| *a += b);
    }
    let loss = at.sum.iter().sum::<f64>() / at.count.iter().sum::<u64>() as f64;
    Ok((loss, at))
}

fn row(b: &Bucket) -> BucketRow {
    BucketRow {
        start: b.start,
        end: b.end,
        loss: b.loss,
        cumulative: b.cumulative,
    }
}
