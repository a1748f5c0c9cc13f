//! `difftx repro --long`: the paper's long-context claims on language models pretrained on a
//! real corpus (retrieval is never a training task), at one context C, then extended to 4C:
//! a learning-rate sweep per kind, kinds × seeds at their own best rate, diff_v1's λ_init and
//! subln ablations, and on every model the validation loss, the loss by position and
//! multi-needle retrieval in haystacks of corpus text, attention noise, outliers, the
//! low-bit loss and a contextual-hallucination proxy. Resumable unit by unit.
//!
//! ```text
//! plan      what is trained and measured (full, quick), the corpus folder
//! facts     made-up facts to train on, and answers from the context against them
//! measure   one trained run's measurements
//! run       the units in order, each result kept; resumes after a crash or Ctrl-C
//! render    REPRO_LONG.md and its plots, from the results alone
//! ```

pub mod facts;
pub mod measure;
pub mod plan;
pub mod render;
pub mod run;

pub use plan::{LongCorpus, LongPlan};
pub use run::{run_long, Ended};
