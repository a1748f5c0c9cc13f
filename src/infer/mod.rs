//! Inference: sampling and generation with a KV cache, and the mean loss of a text.

pub mod generate;
pub mod loss;
pub mod sample;

pub use generate::{generate, GenerateOptions, Generation};
pub use loss::{evaluate_by_position, evaluate_loss, Bucket, ByPosition, EvalResult};
pub use sample::{Penalties, Sampling};
