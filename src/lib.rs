//! difftx: Differential Transformer language models (Ye et al., ICLR 2025) — DIFF V1, DIFF V2
//! and the baseline Transformer — trained and run on a CPU with hand-written kernels.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod config;
pub mod data;
pub mod error;
#[doc(hidden)]
pub mod experiments;
pub mod infer;
pub mod interop;
pub mod model;
#[doc(hidden)]
pub mod report;
#[cfg(feature = "serve")]
pub mod serve;
pub mod train;
#[doc(hidden)]
pub mod util;

/// The numeric core, a crate of its own (`difftx-kernels`) so that it builds and tests alone
/// (on ARM under emulation, say). Internal: the types a user needs are re-exported in
/// [`prelude`].
#[doc(hidden)]
pub use difftx_kernels as kernels;

#[cfg(test)]
pub(crate) use difftx_kernels::testutil;

pub use config::{AttentionKind, ModelConfig, Preset};
pub use error::{Error, Result};
pub use model::{Model, Workspace};
