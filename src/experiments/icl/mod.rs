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

pub mod measure;
pub mod plan;
pub mod render;
pub mod task;

pub use measure::{
    evaluate, icl_reference, measure_icl, pick_label, predict, run_icl, train_icl, IclRun,
    IclScores, OrderStats,
};
pub use plan::IclPlan;
pub use render::{icl_json, icl_section, plot_icl};
pub use task::{
    reference_predict, test_set, IclEpisode, IclTask, Item, Relabel, TestEpisode, ALPHABET, LABELS,
};
