//! Retrieval of trained models on needle episodes (`task.rs`), per (depth, length) cell.
//!
//! Retrieval is scored by teacher-forced argmax over the answer digits: an episode counts as
//! correct when the most likely next token is the right digit at every answer position. That is
//! exactly greedy decoding of the digits (if every teacher-forced argmax is right, greedy
//! decoding produces the same digits, and conversely), in one forward pass per batch.

use super::task::{Episode, NeedleTask};
use crate::error::{Error, Result};
use crate::experiments::common::argmax;
use crate::model::{Model, Workspace};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// For each episode, whether the model retrieves each of its R answers (teacher-forced argmax
/// at every answer digit, which equals greedy decoding; the first is the needle at the
/// depth). All episodes have `t` input tokens; `ws` holds at least `episodes.len()` × `t`.
pub fn answers_correct(
    model: &Model,
    ws: &mut Workspace,
    episodes: &[Episode],
    t: usize,
) -> Result<Vec<Vec<bool>>> {
    let v = model.config.vocab_size;
    // the model reads every token but the last
    let inputs = episodes
        .iter()
        .map(|e| &e.tokens[..e.tokens.len().saturating_sub(1)]);
    crate::experiments::common::forward_prompts(model, ws, inputs, t)?;
    Ok(episodes
        .iter()
        .enumerate()
        .map(|(b, e)| {
            e.answers
                .iter()
                .map(|a| {
                    (a.start - 1..a.end - 1).all(|p| {
                        let row = &ws.logits[(b * t + p) * v..(b * t + p + 1) * v];
                        argmax(row) == e.tokens[p + 1] as usize
                    })
                })
                .collect()
        })
        .collect())
}

/// Retrieval accuracy of one (depth, length) cell: `correct` of `total` episodes answer the
/// needle at the depth; `all_correct` of `all_total` answers over all R queries.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    pub depth: f64,
    pub len: usize,
    pub correct: usize,
    pub total: usize,
    pub all_correct: usize,
    pub all_total: usize,
}

impl Cell {
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.total.max(1) as f64
    }
}

/// Retrieval accuracy over `cells`: the episodes whose needle at the depth was answered, of
/// all episodes.
pub fn accuracy(cells: &[Cell]) -> f64 {
    let c: usize = cells.iter().map(|c| c.correct).sum();
    let t: usize = cells.iter().map(|c| c.total).sum();
    c as f64 / t.max(1) as f64
}

/// The seed of the episodes of cell (length, depth index) in an evaluation seeded `seed`:
/// every model evaluated with the same seed sees the same episodes.
pub fn cell_seed(seed: u64, len: usize, depth_index: usize) -> u64 {
    seed ^ (len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((depth_index as u64 + 1) << 48)
}

/// Retrieval accuracy for every (depth, length) pair, `per_cell` episodes each, evaluated
/// `batch` at a time. Cells come length-major: all depths of `lengths[0]` first. With
/// `logit_bits`, attention logits are absmax-quantised to that many bits
/// (kernels/attention_lowbit.rs).
// The grid's axes, its sampling and its precision are all the caller's choice, per call.
#[allow(clippy::too_many_arguments)]
pub fn retrieval_grid(
    model: &Model,
    task: &NeedleTask,
    lengths: &[usize],
    depths: &[f64],
    per_cell: usize,
    seed: u64,
    batch: usize,
    logit_bits: Option<u32>,
) -> Result<Vec<Cell>> {
    let ctx = model.config.max_position_embeddings;
    let mut cells = Vec::new();
    for &len in lengths {
        if len > ctx {
            return Err(Error::Invalid(format!(
                "context length {len} is longer than the model's context ({ctx}; `Model::set_context` extends it)"
            )));
        }
        let mut ws = Workspace::new(model, batch.max(1), len);
        ws.logit_bits = logit_bits;
        for (di, &depth) in depths.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(cell_seed(seed, len, di));
            let episodes = (0..per_cell)
                .map(|_| task.episode(&mut rng, len, depth))
                .collect::<Result<Vec<_>>>()?;
            let (mut correct, mut all_correct, mut all_total) = (0, 0, 0);
            for group in episodes.chunks(batch.max(1)) {
                for answers in answers_correct(model, &mut ws, group, len)? {
                    correct += answers[0] as usize;
                    all_correct += answers.iter().filter(|&&c| c).count();
                    all_total += answers.len();
                }
            }
            cells.push(Cell {
                depth,
                len,
                correct,
                total: per_cell,
                all_correct,
                all_total,
            });
        }
    }
    Ok(cells)
}
