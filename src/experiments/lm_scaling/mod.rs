//! Language modelling and scaling (paper Section 3.2, Figure 3a) and the cheap ablation rows
//! (Table 6), measured on a real corpus: Debian's `fortunes` (the text files under
//! /usr/share/games/fortunes), byte-level.
//!
//! Every attention kind trains at three sizes (`matched_config`) on the same token budget
//! (steps × batch × context) through `train_short`, with seeded random windows of the training
//! bytes and the loss on every byte; then each model is scored on the same evenly spaced
//! windows of the validation bytes (the last 10% of the corpus). Per kind, the validation loss
//! is fitted against ln(parameters) (L = a + b ln N), and the parameter ratio at equal loss is
//! read off the fits: the parameters a diff kind needs to reach the standard model's loss at
//! the middle size, over that standard model's parameters (the paper: about 0.65).
//!
//! Extra runs at the middle size (the Table 6 ablations: diff_v1 without subln, diff_v1 with a
//! constant λ_init of 0.8) are passed as [`Variant`]s, each a label and a `ModelConfig`.
//!
//! `plan` holds what runs, `measure` trains and scores the models, `fit` reads the scaling
//! fits and the ratio off the runs, `render` writes the report sections, the plot and the
//! JSON. The corpus and its windows are in `experiments/corpus.rs`.

pub mod fit;
pub mod measure;
pub mod plan;
pub mod render;

pub use fit::{kind_fit, param_ratio, ratios, LogFit};
pub use measure::{run_lm, train_lm, window_loss, LmRun, QuantLoss};
pub use plan::{LmPlan, PaperSays, Variant};
pub use render::{lm_json, lm_section, plot_scaling, PAPER_RATIO, SCALING_PLOT};
