//! Inference: sampling and generation with a KV cache, the mean loss of a text, and text
//! embeddings.

pub mod constrain;
pub mod embed;
pub mod generate;
pub mod json;
pub mod json_schema;
pub mod loss;
pub mod sample;
pub mod speculative;

pub use embed::embed;
pub use generate::{generate, generate_with_draft, GenerateOptions, Generation};
pub use loss::{evaluate_by_position, evaluate_loss, Bucket, ByPosition, EvalResult};
pub use sample::{Penalties, Sampling};
pub use speculative::DraftModel;
