//! Text in, tokens out: tokenizers, token files, corpora, batches.

pub mod corpus;
#[doc(hidden)]
pub mod needle;
pub mod tokenizer;
#[doc(hidden)]
pub mod tokens;

pub use corpus::{prepare_dataset, DataSpec, Dataset, WindowSampler};
pub use tokenizer::Tokenizer;
pub use tokens::{TokenFile, TokenSlice};
