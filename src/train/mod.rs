//! Training: the optimizer step, the loop with its schedule, checkpoints that resume exactly,
//! and the metrics log.

#[doc(hidden)]
pub mod checkpoint;
mod fit;
#[doc(hidden)]
pub mod in_memory;
#[doc(hidden)]
pub mod init_from;
#[doc(hidden)]
pub mod metrics;
pub mod options;
#[doc(hidden)]
pub mod schedule;
pub mod step;
pub mod trainer;

/// AdamW's hyper-parameters, for [`Optimizer::new`].
pub use crate::kernels::adamw::AdamWParams;
pub use fit::fit;
pub use metrics::StepReport;
pub use options::{RunConfig, TrainConfig, TrainOptions};
pub use step::{Optimizer, TrainStep};
pub use trainer::{prepare_run, train, Observer, Outcome, PreparedRun, Silent};
