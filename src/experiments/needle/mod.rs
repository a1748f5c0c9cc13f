//! Multi-needle retrieval (paper Section 3.4) at byte level: the episodes (`task`) and the
//! retrieval of a trained model on them (`measure`).

pub mod measure;
pub mod task;

pub use measure::{answers_correct, cell_seed, retrieval_grid, Cell};
pub use task::{Episode, Filler, NeedleTask, SyntheticLanguage, CITIES, DEPTHS};
