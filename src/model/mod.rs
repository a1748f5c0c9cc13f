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

/// Q8_0 or Q4_0 weight blocks, for [`Model::quantize`].
pub use crate::kernels::quant::QuantKind;
/// The matrix products' operand type ([`Model::precision`]): f32, or bf16 on AVX512_BF16.
pub use crate::kernels::Precision;
pub use kv_cache::{KvBlock, KvCache, KvKind};
pub use model::{Model, Workspace};
