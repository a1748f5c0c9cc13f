//! In-context learning (paper Section 3.5) at byte level: many-shot classification whose
//! labels only the demonstrations give away, accuracy against the number of shots, and the
//! spread of accuracy over permutations of the demonstrations.
//!
//! The task. K classes over the input alphabet `a`..`p` (16 letters); class c owns a seeded
//! set of characteristic letters (no two classes the same set). An input is `input_len`
//! letters, each drawn from its class's letters with probability 1 − ε and uniformly from the
//! whole alphabet with probability ε, so some inputs look like another class and the classes
//! overlap (`IclTask::bayes_accuracy` says how much). The classes are fixed by the task seed, so
//! a model can learn them in its weights; what it cannot learn there is the label of a class:
//! each evaluation episode maps the K classes to K distinct digits drawn at random, so the
//! answer to a query is only in its context. An episode is demonstrations then the query, each
//! item its input followed by its label, with no separator:
//!
//! ```text
//! d9g6d9p7h9 ... c2 g       (input_len 1: "d" is labelled 9, "g" 6, ...; the query is "g")
//! ```
//!
//! The classes of the items are drawn uniformly (not balanced), so at few shots the query's
//! class is often missing from the demonstrations; more shots both cover every class and give
//! several (sometimes misleading, because of the noise) demonstrations per class to vote with.
//!
//! Why this shape (pilot runs with `standard` only, D 32, 2 layers, 1 thread). With
//! separators (`input:label\n`) and random relabellings only, the model sat on the plateau of
//! "some digit seen before" (label loss ≈ 2.09, chance accuracy) for thousands of steps: a
//! random mapping needs an induction circuit (one head bringing each demonstration's input
//! into its label's position, a second matching the query against those), and it formed at an
//! unpredictable step (in 5,000 steps one seed of three learned it, one partly, one not at
//! all), far beyond a 40-second budget; without separators but still random relabellings
//! only, 0 of 9 runs learned it in 2,000 steps (learning rates 3e-3, 6e-3, 8 heads of 4).
//! What made it learnable: no separators (the query position is the query's input itself)
//! and training rows of two kinds: `rotation_fraction` of each batch relabels the classes by a
//! rotation (class c gets digit (c + r) mod 10, r random per episode), which any single
//! demonstration reveals and which teaches the model to read each demonstration's (input,
//! label) pair; the other rows, and every evaluation episode, use random relabellings. With
//! that, 3 of 3 seeds learned random relabellings (noise-free: near the reference by 2,500
//! steps; the final task: 0.65–0.82 at 31 shots against 0.84 for the reference). Single-letter
//! inputs keep the step cheap; with 2 letters per class and ε = 0.2 the best possible
//! single-query accuracy is about 0.83.
//!
//! Training (`train_icl`) uses `train_short` on windows full of items; the loss is on the label
//! bytes only (every item's label, the first of which has no shot to learn from), everything
//! else `IGNORE`: the inputs are unpredictable by design. The label at item i is a query with i
//! shots, so one window trains every shot count at once.
//!
//! Evaluation (`evaluate`) uses a fixed seeded test set shared by every model: per episode a
//! random relabelling, a query and `max_shots` demonstrations. The n-shot prompt is the first
//! n demonstrations then the query; a prediction is the argmax of the next-token logits over
//! the episode's K label bytes (so chance is exactly 1/K whatever else the model puts mass on).
//! Permutation robustness: P seeded random orders of each episode's `max_shots`
//! demonstrations; accuracy per order over the test set, then best − worst and the standard
//! deviation over orders, and the fraction of episodes whose correctness depends on the order.
//! A reference reader that knows the classes (`reference_predict`: the most likely class of
//! each input, then the majority label among the demonstrations of the query's class) puts the
//! models' numbers against what the demonstrations allow.

use super::needle::argmax;
use super::repro::{fmt_ms, matched_config, mean_std, table_head};
use crate::config::{swiglu_width, AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::kernels::cross_entropy::IGNORE;
use crate::model::{Model, Workspace};
use crate::report::lines::{plot_lines, Axes, Line, Point};
use crate::train::in_memory::{train_short, ShortRun, Trained};
use crate::util::thousands;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// The input alphabet.
pub const ALPHABET: &[u8; 16] = b"abcdefghijklmnop";
/// The label bytes an episode draws its K labels from.
pub const LABELS: &[u8; 10] = b"0123456789";

/// Salt of the training episodes' generator (the model's initial weights use the seed itself).
const TRAIN_STREAM: u64 = 0x1c1_0000_7ea1_0001;
/// Salt of the permutations of the test set.
const ORDER_STREAM: u64 = 0x1c1_0000_0bde_0002;

/// One classified input.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub class: usize,
    pub input: Vec<u8>,
}

/// How an episode maps the K classes to labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relabel {
    /// K distinct digits in a random order: only the demonstrations of a class tell its label
    Random,
    /// class c gets digit (c + r) mod 10 with r random: any one demonstration tells them all
    Rotation,
}

/// The classification task: K classes, each a set of characteristic letters, inputs of a fixed
/// length with noise ε.
#[derive(Clone, Debug, PartialEq)]
pub struct IclTask {
    pub classes: usize,
    pub input_len: usize,
    pub noise: f64,
    /// the characteristic letters of each class, sorted
    pub letters: Vec<Vec<u8>>,
}

/// One prompt: T + 1 byte tokens; the model reads `tokens[..T]`, and the query's label is the
/// last token.
#[derive(Clone, Debug, PartialEq)]
pub struct IclEpisode {
    pub tokens: Vec<u32>,
    /// the label byte of each class in this episode
    pub labels: Vec<u8>,
    /// the class of each item, the query last
    pub classes: Vec<usize>,
    /// where each item's label sits in `tokens`, the query's last
    pub label_pos: Vec<usize>,
}

impl IclEpisode {
    /// Demonstrations before the query.
    pub fn shots(&self) -> usize {
        self.classes.len() - 1
    }

    /// Input tokens T.
    pub fn len(&self) -> usize {
        self.tokens.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The query's correct label.
    pub fn answer(&self) -> u8 {
        self.labels[*self.classes.last().expect("an episode has a query")]
    }

    /// Targets on every item's label only: `tokens[1..]` with every other position `IGNORE`.
    pub fn label_targets(&self) -> Vec<u32> {
        let mut y = vec![IGNORE; self.len()];
        for &p in &self.label_pos {
            y[p - 1] = self.tokens[p];
        }
        y
    }
}

impl IclTask {
    /// K classes of `letters_per_class` distinct letters each (no two classes with the same
    /// set), inputs of `input_len` letters with noise ε; everything from `seed`.
    pub fn synthetic(
        classes: usize,
        letters_per_class: usize,
        input_len: usize,
        noise: f64,
        seed: u64,
    ) -> Result<Self> {
        if classes < 2 || classes > LABELS.len() {
            return Err(Error::Invalid(format!(
                "classes ({classes}) must be between 2 and {}",
                LABELS.len()
            )));
        }
        if letters_per_class == 0 || letters_per_class >= ALPHABET.len() {
            return Err(Error::Invalid(format!(
                "letters_per_class ({letters_per_class}) must be between 1 and {}",
                ALPHABET.len() - 1
            )));
        }
        if input_len == 0 {
            return Err(Error::Invalid("input_len must be at least 1".into()));
        }
        if !(0.0..=1.0).contains(&noise) {
            return Err(Error::Invalid(format!("noise {noise} is outside [0, 1]")));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut letters: Vec<Vec<u8>> = Vec::with_capacity(classes);
        for _ in 0..10_000 {
            if letters.len() == classes {
                break;
            }
            let mut pool = ALPHABET.to_vec();
            for i in 0..letters_per_class {
                let j = rng.random_range(i..pool.len());
                pool.swap(i, j);
            }
            let mut set = pool[..letters_per_class].to_vec();
            set.sort_unstable();
            if !letters.contains(&set) {
                letters.push(set);
            }
        }
        if letters.len() < classes {
            return Err(Error::Invalid(format!(
                "cannot draw {classes} distinct sets of {letters_per_class} letters"
            )));
        }
        Ok(IclTask {
            classes,
            input_len,
            noise,
            letters,
        })
    }

    /// Bytes of one item: the input, then the label.
    pub fn item_len(&self) -> usize {
        self.input_len + 1
    }

    /// Input tokens T of a prompt with `shots` demonstrations (the model reads the query's
    /// input, not its label).
    pub fn prompt_len(&self, shots: usize) -> usize {
        shots * self.item_len() + self.input_len
    }

    /// The most demonstrations a prompt of at most `context` input tokens holds.
    pub fn max_shots(&self, context: usize) -> usize {
        context.saturating_sub(self.input_len) / self.item_len()
    }

    /// An input of `class`.
    pub fn item(&self, rng: &mut ChaCha8Rng, class: usize) -> Item {
        let own = &self.letters[class];
        let input = (0..self.input_len)
            .map(|_| {
                if rng.random::<f64>() < self.noise {
                    ALPHABET[rng.random_range(0..ALPHABET.len())]
                } else {
                    own[rng.random_range(0..own.len())]
                }
            })
            .collect();
        Item { class, input }
    }

    /// An item of a uniformly drawn class.
    pub fn any_item(&self, rng: &mut ChaCha8Rng) -> Item {
        let c = rng.random_range(0..self.classes);
        self.item(rng, c)
    }

    /// A label per class, drawn as `how` says.
    pub fn labels(&self, rng: &mut ChaCha8Rng, how: Relabel) -> Vec<u8> {
        match how {
            Relabel::Random => {
                let mut pool = LABELS.to_vec();
                for i in 0..self.classes {
                    let j = rng.random_range(i..pool.len());
                    pool.swap(i, j);
                }
                pool.truncate(self.classes);
                pool
            }
            Relabel::Rotation => {
                let r = rng.random_range(0..LABELS.len());
                (0..self.classes)
                    .map(|c| LABELS[(c + r) % LABELS.len()])
                    .collect()
            }
        }
    }

    /// The prompt of `demos` (in this order) then `query`, labelled by `labels`.
    pub fn render(&self, labels: &[u8], demos: &[&Item], query: &Item) -> IclEpisode {
        let mut bytes = Vec::with_capacity((demos.len() + 1) * self.item_len());
        let mut classes = Vec::with_capacity(demos.len() + 1);
        let mut label_pos = Vec::with_capacity(demos.len() + 1);
        for it in demos.iter().copied().chain(std::iter::once(query)) {
            bytes.extend_from_slice(&it.input);
            label_pos.push(bytes.len());
            bytes.push(labels[it.class]);
            classes.push(it.class);
        }
        IclEpisode {
            tokens: bytes.into_iter().map(u32::from).collect(),
            labels: labels.to_vec(),
            classes,
            label_pos,
        }
    }

    /// A fresh episode: a relabelling, `shots` demonstrations and a query, classes uniform.
    pub fn episode(&self, rng: &mut ChaCha8Rng, shots: usize, how: Relabel) -> IclEpisode {
        let labels = self.labels(rng, how);
        let items: Vec<Item> = (0..=shots).map(|_| self.any_item(rng)).collect();
        let demos: Vec<&Item> = items[..shots].iter().collect();
        self.render(&labels, &demos, &items[shots])
    }

    /// log p(input | class).
    pub fn log_likelihood(&self, input: &[u8], class: usize) -> f64 {
        let own = &self.letters[class];
        let uniform = self.noise / ALPHABET.len() as f64;
        let inside = (1.0 - self.noise) / own.len() as f64 + uniform;
        input
            .iter()
            .map(|b| if own.contains(b) { inside } else { uniform }.ln())
            .sum()
    }

    /// The most likely class of an input (the first at a tie).
    pub fn classify(&self, input: &[u8]) -> usize {
        let ll: Vec<f32> = (0..self.classes)
            .map(|c| self.log_likelihood(input, c) as f32)
            .collect();
        argmax(&ll)
    }

    /// The accuracy of `classify` on `n` seeded inputs: the best any reader can do on one
    /// query even when it knows the label of every class.
    pub fn bayes_accuracy(&self, n: usize, seed: u64) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let right = (0..n)
            .filter(|_| {
                let it = self.any_item(&mut rng);
                self.classify(&it.input) == it.class
            })
            .count();
        right as f64 / n.max(1) as f64
    }
}

/// One test episode: a label mapping, a query, `max_shots` demonstrations and P orders of
/// them.
#[derive(Clone, Debug, PartialEq)]
pub struct TestEpisode {
    pub labels: Vec<u8>,
    pub demos: Vec<Item>,
    pub query: Item,
    /// permutations of `0..demos.len()`
    pub orders: Vec<Vec<usize>>,
}

impl TestEpisode {
    /// The prompt with the first `shots` demonstrations in their drawn order.
    pub fn prompt(&self, task: &IclTask, shots: usize) -> IclEpisode {
        let d: Vec<&Item> = self.demos[..shots].iter().collect();
        task.render(&self.labels, &d, &self.query)
    }

    /// The prompt with all demonstrations in order `p`.
    pub fn permuted(&self, task: &IclTask, p: usize) -> IclEpisode {
        let d: Vec<&Item> = self.orders[p].iter().map(|&i| &self.demos[i]).collect();
        task.render(&self.labels, &d, &self.query)
    }
}

/// `n` test episodes of `max_shots` demonstrations with `orders` random permutations each,
/// all from `seed`: every model evaluated with one seed sees the same prompts.
pub fn test_set(
    task: &IclTask,
    n: usize,
    max_shots: usize,
    orders: usize,
    seed: u64,
) -> Vec<TestEpisode> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut perm_rng = ChaCha8Rng::seed_from_u64(seed ^ ORDER_STREAM);
    (0..n)
        .map(|_| {
            let labels = task.labels(&mut rng, Relabel::Random);
            let demos: Vec<Item> = (0..max_shots).map(|_| task.any_item(&mut rng)).collect();
            let query = task.any_item(&mut rng);
            let orders = (0..orders)
                .map(|_| {
                    let mut o: Vec<usize> = (0..max_shots).collect();
                    for i in (1..o.len()).rev() {
                        let j = perm_rng.random_range(0..=i);
                        o.swap(i, j);
                    }
                    o
                })
                .collect();
            TestEpisode {
                labels,
                demos,
                query,
                orders,
            }
        })
        .collect()
}

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
    super::forward_prompts(model, ws, episodes.iter().map(|e| &e.tokens[..e.len()]), t)?;
    Ok(episodes
        .iter()
        .enumerate()
        .map(|(b, e)| {
            let p = b * t + t - 1;
            pick_label(&ws.logits[p * v..(p + 1) * v], &e.labels)
        })
        .collect())
}

/// The reader that knows the classes, reading the prompt's bytes as the model does: the most
/// likely class of each demonstration's input and of the query's, then the label most of the
/// demonstrations of the query's class carry (the smallest label byte at a tie). When no
/// demonstration has that class, the smallest label no demonstration's class has claimed.
/// Its answer does not depend on the order of the demonstrations.
pub fn reference_predict(task: &IclTask, e: &IclEpisode) -> u8 {
    let w = task.item_len();
    let bytes: Vec<u8> = e.tokens.iter().map(|&t| t as u8).collect();
    let mut votes = vec![[0usize; 256]; task.classes];
    for i in 0..e.shots() {
        let item = &bytes[i * w..(i + 1) * w];
        let c = task.classify(&item[..task.input_len]);
        votes[c][item[task.input_len] as usize] += 1;
    }
    let q = e.shots() * w;
    let cq = task.classify(&bytes[q..q + task.input_len]);
    let mut sorted = e.labels.clone();
    sorted.sort_unstable();
    let best = sorted
        .iter()
        .copied()
        .max_by_key(|&l| (votes[cq][l as usize], std::cmp::Reverse(l)))
        .expect("an episode has labels");
    if votes[cq][best as usize] > 0 {
        return best;
    }
    sorted
        .iter()
        .copied()
        .find(|&l| votes.iter().all(|v| v[l as usize] == 0))
        .unwrap_or(sorted[0])
}

/// Accuracy of the same test set under P orders of the demonstrations.
#[derive(Clone, Debug, PartialEq)]
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
#[derive(Clone, Debug, PartialEq)]
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

/// The in-context learning experiment's plan; `quick()` and `full()` are the two the CLI
/// offers.
#[derive(Clone, Debug, PartialEq)]
pub struct IclPlan {
    pub quick: bool,
    /// D, L, d and the training context (`matched_config`)
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub head_dim: usize,
    pub context: usize,
    pub steps: u64,
    /// episodes per step
    pub batch: usize,
    pub lr: f32,
    pub warmup: u64,
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
            context: 32,
            steps: 40,
            batch: 8,
            warmup: 4,
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
            context: 64,
            steps: 4000,
            batch: 16,
            lr: 3e-3,
            warmup: 40,
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
            self.context,
        )
    }

    /// The largest shot count, where the orders are permuted.
    pub fn max_shots(&self) -> usize {
        self.shots.last().copied().unwrap_or(0)
    }

    /// Rows of each training batch relabelled by a rotation (the first ones).
    pub fn rotated_rows(&self) -> usize {
        ((self.batch as f64 * self.rotation_fraction).round() as usize).min(self.batch)
    }

    /// Checks that the plan can run, naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        let task = self.task()?;
        if self.steps == 0 || self.batch == 0 || self.warmup >= self.steps {
            return bad(format!(
                "in-context learning: {} steps, {} warm-up steps and a batch of {}: need a batch, and more steps than warm-up steps",
                self.steps, self.warmup, self.batch
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
        let fit = task.max_shots(self.context);
        if self.shots[0] == 0 || self.max_shots() > fit {
            return bad(format!(
                "shots {:?} must be between 1 and {fit} (what a context of {} holds, {} bytes a shot)",
                self.shots,
                self.context,
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
                self.steps,
                self.batch,
                self.context,
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
    let b = plan.batch;
    let shots = task.max_shots(plan.context);
    if shots == 0 {
        return Err(Error::Invalid(format!(
            "a context of {} tokens holds no demonstration of {} bytes",
            plan.context,
            task.item_len()
        )));
    }
    let t = task.prompt_len(shots);
    let run = ShortRun {
        steps: plan.steps,
        batch: b,
        context: plan.context,
        lr: plan.lr,
        warmup: plan.warmup,
    };
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
    train_short(config, &run, seed, TRAIN_STREAM, fill, on_step)
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
#[derive(Clone, Debug)]
pub struct IclRun {
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
        let tail = &self.losses[self.losses.len().saturating_sub(10)..];
        tail.iter().map(|&x| x as f64).sum::<f64>() / tail.len().max(1) as f64
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
                plan.steps,
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

fn of_kind(runs: &[IclRun], kind: AttentionKind) -> Vec<&IclRun> {
    runs.iter().filter(|r| r.kind == kind).collect()
}

fn per(runs: &[IclRun], kind: AttentionKind, f: impl Fn(&IclRun) -> f64) -> Vec<f64> {
    of_kind(runs, kind).into_iter().map(f).collect()
}

/// The `## In-context learning` section of REPRO.md.
pub fn icl_section(plan: &IclPlan, runs: &[IclRun]) -> String {
    let mut s = String::new();
    let n = plan.max_shots();
    let reference = icl_reference(plan).ok();
    let seeds = runs.iter().map(|r| r.seed).max().map_or(0, |m| m + 1);
    let _ = writeln!(s, "## In-context learning (paper Section 3.5)\n");
    let _ = writeln!(
        s,
        "Paper: many-shot classification accuracy 5–22% higher for Diff than for the Transformer, and a much smaller best − worst gap when the order of the demonstrations is permuted.\n"
    );
    let bayes = plan
        .task()
        .map(|t| t.bayes_accuracy(20_000, plan.eval_seed))
        .unwrap_or(f64::NAN);
    for line in [
        format!("Task: K = {} seeded classes of {} letters each over 16 letters; an input is {} letter(s), each from its class's letters with probability {} and uniform otherwise, so the classes overlap (the most likely class is right for {bayes:.3} of inputs). Each test episode maps the classes to K random distinct digits, so a class's label is only in the context; a shot is the input followed by its label (`d9g6…`), classes uniform.", plan.classes, plan.letters_per_class, plan.input_len, 1.0 - plan.noise),
        format!("Training: {} steps of {} windows of {} bytes full of items (each item's label is a query with the items before it as shots), the same bytes and initial-weight seeds for every kind; {} of every {} windows relabel the classes by a rotation (class c gets digit c + r mod 10), the rest at random (in pilot runs without them, the standard model did not learn random relabellings within this budget). Loss on {}; AdamW, peak lr {}, {} warm-up steps, cosine to lr/10.", plan.steps, plan.batch, plan.context, plan.rotated_rows(), plan.batch, if plan.labels_only { "the label bytes only" } else { "every byte" }, plan.lr, plan.warmup),
        format!("Evaluation: {} fixed test episodes (seed {}), random relabellings; the n-shot prompt is the first n of an episode's {n} demonstrations then the query; a prediction is the argmax of the next-token logits over the episode's K labels (chance {:.3}). Orders: {} random permutations of the {n} demonstrations of every episode; accuracy per order, best − worst and the standard deviation over orders. Reference: a reader that knows the classes (most likely class of every input, majority label of the demonstrations of the query's class).", plan.test_episodes, plan.eval_seed, 1.0 / plan.classes as f64, plan.orders),
    ] {
        let _ = writeln!(s, "- {line}");
    }

    let _ = writeln!(
        s,
        "\nAccuracy against the number of shots (mean ± std over {seeds} seed(s)):\n"
    );
    table_head(
        &mut s,
        &["kind", "parameters", "final train loss"],
        plan.shots.iter().map(|&k| match k {
            1 => "1 shot".to_string(),
            k => format!("{k} shots"),
        }),
    );
    for k in AttentionKind::ALL {
        let rs = of_kind(runs, k);
        if rs.is_empty() {
            continue;
        }
        let mut row = format!(
            "| {k} | {} | {} |",
            thousands(rs[0].params),
            fmt_ms(&per(runs, k, |r| r.final_loss()), 3)
        );
        for &x in &plan.shots {
            let _ = write!(row, " {} |", fmt_ms(&per(runs, k, |r| r.at(x)), 3));
        }
        let _ = writeln!(s, "{row}");
    }
    if let Some(r) = &reference {
        let mut row = "| reference (knows the classes) | — | — |".to_string();
        for &(_, a) in &r.by_shots {
            let _ = write!(row, " {a:.3} |");
        }
        let _ = writeln!(s, "{row}");
    }

    let _ = writeln!(
        s,
        "\nPermutation robustness at {n} shots, {} orders (mean ± std over seeds):\n",
        plan.orders
    );
    let _ = writeln!(
        s,
        "| kind | mean accuracy | best order | worst order | best − worst | std over orders | episodes whose answer depends on the order |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for k in AttentionKind::ALL {
        if of_kind(runs, k).is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {} | {} | {} | {} |",
            fmt_ms(&per(runs, k, |r| r.orders.mean()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.best()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.worst()), 3),
            fmt_ms(&per(runs, k, |r| r.spread()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.std()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.flipped), 3)
        );
    }
    if let Some(r) = &reference {
        let o = &r.orders;
        let _ = writeln!(
            s,
            "| reference (knows the classes) | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            o.mean(),
            o.best(),
            o.worst(),
            o.spread(),
            o.std(),
            o.flipped
        );
    }

    let _ = writeln!(s, "\nAgainst the paper's claim:\n");
    let st = AttentionKind::Standard;
    for d in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        let (ds, ss) = (per(runs, d, |r| r.at(n)), per(runs, st, |r| r.at(n)));
        if ds.is_empty() || ss.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "{}",
            super::repro::compare(&format!("accuracy at {n} shots"), d, &ds, &ss, true)
        );
        let _ = writeln!(
            s,
            "{}",
            super::repro::compare(
                "best − worst over orders",
                d,
                &per(runs, d, |r| r.spread()),
                &per(runs, st, |r| r.spread()),
                false
            )
        );
    }
    let sd: Vec<f64> = runs.iter().map(|r| r.orders.std()).collect();
    let _ = writeln!(
        s,
        "\nWith {} test episodes one order's accuracy has a sampling error of about ±{:.3} (binomial), and part of any best − worst gap is that noise; the standard deviation over orders averaged {:.3} here.",
        plan.test_episodes,
        (0.25 / plan.test_episodes as f64).sqrt(),
        mean_std(&sd).0
    );
    if plan.quick {
        let _ = writeln!(
            s,
            "\nThis was a smoke run: read nothing into the comparisons above."
        );
    }
    s
}

/// Accuracy against shots (log x), one line per kind with ± one standard deviation over seeds,
/// and the reference reader.
pub fn plot_icl(plan: &IclPlan, runs: &[IclRun], path: &Path) -> Result<()> {
    let mut lines: Vec<Line> = AttentionKind::ALL
        .iter()
        .filter(|&&k| !of_kind(runs, k).is_empty())
        .map(|&k| Line {
            label: k.to_string(),
            points: plan
                .shots
                .iter()
                .map(|&x| {
                    let (y, sd) = mean_std(&per(runs, k, |r| r.at(x)));
                    Point { x: x as f64, y, sd }
                })
                .collect(),
        })
        .collect();
    if let Ok(r) = icl_reference(plan) {
        lines.push(Line {
            label: "reference (knows the classes)".into(),
            points: r
                .by_shots
                .iter()
                .map(|&(x, y)| Point {
                    x: x as f64,
                    y,
                    sd: None,
                })
                .collect(),
        });
    }
    let chance = 1.0 / plan.classes as f64;
    lines.push(Line {
        label: format!("chance (1/{})", plan.classes),
        points: plan
            .shots
            .iter()
            .map(|&x| Point {
                x: x as f64,
                y: chance,
                sd: None,
            })
            .collect(),
    });
    let title = format!(
        "in-context classification, K = {} (chance {:.2})",
        plan.classes,
        1.0 / plan.classes as f64
    );
    plot_lines(
        &lines,
        &Axes {
            title: &title,
            x_label: "demonstrations (shots)",
            y_label: "accuracy",
            log_x: true,
            y_range: Some((0.0, 1.0)),
        },
        path,
    )
}

/// Every number behind the section, per kind and seed.
pub fn icl_json(runs: &[IclRun]) -> serde_json::Value {
    json!(runs
        .iter()
        .map(|r| json!({
            "kind": r.kind.as_str(),
            "seed": r.seed,
            "params": r.params,
            "seconds": r.seconds,
            "eval_seconds": r.eval_seconds,
            "final_loss": r.final_loss(),
            "losses": r.losses,
            "by_shots": r.by_shots.iter().map(|&(n, a)| json!({"shots": n, "accuracy": a})).collect::<Vec<_>>(),
            "order_accuracy": r.orders.accuracy,
            "order_spread": r.spread(),
            "order_std": r.orders.std(),
            "order_flipped": r.orders.flipped,
        }))
        .collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cross_entropy::counted;
    use std::collections::HashSet;

    fn task() -> IclTask {
        IclPlan::full().task().unwrap()
    }

    fn text(e: &IclEpisode) -> String {
        e.tokens.iter().map(|&b| b as u8 as char).collect()
    }

    #[test]
    fn an_episode_is_inputs_and_labels_then_the_query_and_is_fixed_by_its_seed() {
        let t = task();
        let a = Item {
            class: 0,
            input: b"a".to_vec(),
        };
        let k = Item {
            class: 3,
            input: b"k".to_vec(),
        };
        let q = Item {
            class: 0,
            input: b"b".to_vec(),
        };
        // class 0 is labelled '7' and class 3 '1' in this episode
        let e = t.render(b"750123", &[&a, &k], &q);
        assert_eq!(text(&e), "a7k1b7");
        assert_eq!((e.len(), t.prompt_len(2), e.shots()), (5, 5, 2));
        assert_eq!(e.label_pos, vec![1, 3, 5]);
        assert_eq!(e.answer(), b'7');

        let make = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..3)
                .map(|_| t.episode(&mut rng, 31, Relabel::Random))
                .collect::<Vec<_>>()
        };
        assert_eq!(make(4), make(4));
        assert_ne!(make(4), make(5));
        for e in make(4) {
            // 31 shots fill the full plan's context of 64 exactly
            assert_eq!(e.len(), 63);
            assert_eq!(t.max_shots(64), 31);
            for (i, &b) in e.tokens.iter().enumerate() {
                let set: &[u8] = if i % 2 == 0 { ALPHABET } else { LABELS };
                assert!(set.contains(&(b as u8)), "byte {i} of {}", text(&e));
            }
            for (i, &p) in e.label_pos.iter().enumerate() {
                assert_eq!(e.tokens[p] as u8, e.labels[e.classes[i]]);
            }
        }
        // the task seed fixes the classes
        assert_eq!(IclTask::synthetic(6, 2, 1, 0.2, 1).unwrap(), t);
        assert_ne!(
            IclTask::synthetic(6, 2, 1, 0.2, 2).unwrap().letters,
            t.letters
        );
    }

    #[test]
    fn labels_are_drawn_afresh_for_every_episode() {
        let t = task();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut of_class0 = HashSet::new();
        let mut maps = HashSet::new();
        for _ in 0..200 {
            let l = t.labels(&mut rng, Relabel::Random);
            assert_eq!(l.iter().collect::<HashSet<_>>().len(), 6, "{l:?}");
            assert!(l.iter().all(|b| LABELS.contains(b)));
            of_class0.insert(l[0]);
            maps.insert(l);
        }
        assert_eq!(of_class0.len(), 10);
        assert!(maps.len() > 190, "{}", maps.len());
        // a rotation gives consecutive digits (mod 10) from a random start
        let mut starts = HashSet::new();
        for _ in 0..100 {
            let l = t.labels(&mut rng, Relabel::Rotation);
            for (c, &b) in l.iter().enumerate() {
                assert_eq!((b - b'0') as usize, ((l[0] - b'0') as usize + c) % 10);
            }
            starts.insert(l[0]);
        }
        assert_eq!(starts.len(), 10);
        // test episodes relabel at random too: the label of class 0 varies over the test set
        let tests = test_set(&t, 100, 4, 2, 1);
        let of_class0: HashSet<u8> = tests.iter().map(|e| e.labels[0]).collect();
        assert_eq!(of_class0.len(), 10);
    }

    #[test]
    fn every_label_and_nothing_else_is_a_target() {
        let t = task();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let e = t.episode(&mut rng, 31, Relabel::Random);
        let y = e.label_targets();
        assert_eq!(y.len(), e.len());
        assert_eq!(counted(&y), 32);
        for (i, &target) in y.iter().enumerate() {
            if e.label_pos.contains(&(i + 1)) {
                assert_eq!(target, e.tokens[i + 1]);
                assert!(LABELS.contains(&(target as u8)));
            } else {
                assert_eq!(target, IGNORE, "position {i} of {}", text(&e));
            }
        }
        // the query's label is the last target, read after the query's input
        assert_eq!(*y.last().unwrap(), e.answer() as u32);
    }

    #[test]
    fn classes_overlap_through_the_noise_at_the_rate_worked_out_by_hand() {
        let t = task();
        // the full plan's six sets of two letters are disjoint, and each letter reads as its class
        let all: HashSet<u8> = t.letters.iter().flatten().copied().collect();
        assert_eq!(all.len(), 12, "{:?}", t.letters);
        for (c, set) in t.letters.iter().enumerate() {
            for &b in set {
                assert_eq!(t.classify(&[b]), c);
            }
        }
        let clean = IclTask {
            noise: 0.0,
            ..t.clone()
        };
        assert_eq!(clean.bayes_accuracy(2000, 1), 1.0);
        // right: a letter of its own set (0.8 + 0.2 · 2/16), or a letter of no set (0.2 · 4/16)
        // that `classify` gives to class 0 (a tie) when the class is 0 (1/6)
        let want = 0.8 + 0.2 * 2.0 / 16.0 + 0.2 * 4.0 / 16.0 / 6.0;
        let got = t.bayes_accuracy(40_000, 3);
        assert!((got - want).abs() < 0.008, "{got} vs {want}");
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
    fn the_test_set_is_fixed_by_its_seed_and_orders_permute_the_demonstrations() {
        let t = task();
        let a = test_set(&t, 5, 31, 8, 11);
        assert_eq!(a, test_set(&t, 5, 31, 8, 11));
        assert_ne!(a, test_set(&t, 5, 31, 8, 12));
        for e in &a {
            for o in &e.orders {
                let mut s = o.clone();
                s.sort_unstable();
                assert_eq!(s, (0..31).collect::<Vec<_>>());
            }
            assert_ne!(e.orders[0], e.orders[1]);
            let p = e.prompt(&t, 4);
            assert_eq!(p.len(), t.prompt_len(4));
            let first4: Vec<usize> = e.demos[..4].iter().map(|d| d.class).collect();
            assert_eq!(p.classes[..4], first4[..]);
            let q = e.permuted(&t, 3);
            assert_eq!(q.answer(), p.answer());
            assert_eq!(q.tokens[q.len() - 1], p.tokens[p.len() - 1]);
            let want: Vec<usize> = e.orders[3].iter().map(|&i| e.demos[i].class).collect();
            assert_eq!(q.classes[..31], want[..]);
        }
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
        p.warmup = p.steps;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("warm-up"), "{e}");
    }

    #[test]
    fn every_kind_trains_on_the_same_label_bytes_and_training_is_deterministic() {
        let mut plan = IclPlan::quick();
        plan.steps = 2;
        plan.warmup = 1;
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

    #[test]
    fn the_quick_plan_runs_end_to_end_into_a_section_a_plot_and_json() {
        let plan = IclPlan::quick();
        let mut notes = Vec::new();
        let runs = run_icl(&plan, 1, |l| notes.push(l.to_string())).unwrap();
        assert_eq!((runs.len(), notes.len()), (3, 3));
        for r in &runs {
            assert_eq!(r.losses.len(), plan.steps as usize);
            let shots: Vec<usize> = r.by_shots.iter().map(|x| x.0).collect();
            assert_eq!(shots, plan.shots);
            assert_eq!(r.orders.accuracy.len(), plan.orders);
            // accuracies count whole test episodes
            for &a in r.by_shots.iter().map(|x| &x.1).chain(&r.orders.accuracy) {
                let k = a * plan.test_episodes as f64;
                assert!(
                    (0.0..=1.0).contains(&a) && (k - k.round()).abs() < 1e-9,
                    "{a}"
                );
            }
        }
        let md = icl_section(&plan, &runs);
        assert!(md.starts_with("## In-context learning"), "{md}");
        for kind in ["standard", "diff_v1", "diff_v2"] {
            let rows = md
                .lines()
                .filter(|l| l.starts_with(&format!("| {kind} |")))
                .count();
            assert_eq!(rows, 2, "{kind}\n{md}");
        }
        assert!(md.contains("| reference (knows the classes) |"), "{md}");
        assert!(md.contains("smoke run"), "{md}");
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("icl.png");
        plot_icl(&plan, &runs, &png).unwrap();
        assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
        let j = icl_json(&runs);
        assert_eq!(j.as_array().unwrap().len(), 3);
        assert_eq!(j[1]["kind"], "diff_v1");
        assert_eq!(j[2]["by_shots"].as_array().unwrap().len(), plan.shots.len());
        assert_eq!(
            j[0]["order_accuracy"].as_array().unwrap().len(),
            plan.orders
        );
    }
}
