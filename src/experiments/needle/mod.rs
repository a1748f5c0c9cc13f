//! Multi-needle retrieval (paper Section 3.4) at byte level: the episodes (`task`, which lives
//! in data/needle.rs because `difftx train --needles` trains on them too) and the retrieval of
//! a trained model on them (`measure`).

pub mod measure;
pub use crate::data::needle as task;

pub use measure::{accuracy, answers_correct, cell_seed, retrieval_grid, Cell};
pub use task::{Episode, Filler, NeedleLoss, NeedleTask, SyntheticLanguage, CITIES, DEPTHS};
