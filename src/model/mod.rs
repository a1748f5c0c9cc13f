//! The model: the three attention kinds, blocks, the stack, checkpoints.

pub mod attention;
pub mod bf16_weights;
pub mod block;
pub mod checkpoint;
pub mod f32_panels;
pub mod kv_cache;
pub mod memory;
#[allow(clippy::module_inception)]
pub mod model;
mod packed;
pub mod phases;
pub mod quant_weights;
pub mod retrofit;

pub use kv_cache::{KvCache, KvKind};
pub use model::{Model, Workspace};
