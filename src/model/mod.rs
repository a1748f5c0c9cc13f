//! The model: the three attention kinds, blocks, the stack, checkpoints.

#[doc(hidden)]
pub mod attention;
#[doc(hidden)]
pub mod bf16_weights;
#[doc(hidden)]
pub mod block;
pub mod checkpoint;
#[doc(hidden)]
pub mod f32_panels;
pub mod kv_cache;
#[doc(hidden)]
pub mod memory;
#[allow(clippy::module_inception)]
pub mod model;
mod packed;
#[doc(hidden)]
pub mod phases;
#[doc(hidden)]
pub mod quant_weights;
pub mod retrofit;

pub use kv_cache::{KvCache, KvKind};
pub use model::{Model, Workspace};
