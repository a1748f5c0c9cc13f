//! Training: the optimizer step, the loop with its schedule, checkpoints that resume exactly,
//! and the metrics log.

pub mod checkpoint;
pub mod in_memory;
pub mod init_from;
pub mod metrics;
pub mod options;
pub mod schedule;
pub mod step;
pub mod trainer;

pub use metrics::StepReport;
pub use options::{RunConfig, TrainConfig, TrainOptions};
pub use step::{Optimizer, TrainStep};
pub use trainer::{prepare_run, train, Observer, Outcome, PreparedRun, Silent};
