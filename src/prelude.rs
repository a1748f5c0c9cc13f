//! The common path in one import: `use difftx::prelude::*;`.
//!
//! | To … | use | example in the docs of |
//! |---|---|---|
//! | make a model | [`Model::init`] with [`ModelConfig::preset`] ([`Preset`], [`AttentionKind`]), then [`Model::save`] | [`Model`] |
//! | load one (difftx, Hugging Face, or a training run folder) | [`open_model`] → ([`Model`], [`Tokenizer`]) | [`open_model`] |
//! | generate | [`generate()`] with [`GenerateOptions`] and [`Sampling`] ([`Penalties`]) → [`Generation`] | [`generate()`] |
//! | generate faster with a small model's drafts | [`generate_with_draft`] and a [`DraftModel`] | [`generate_with_draft`] |
//! | score a text | [`evaluate_loss`] → [`EvalResult`] | [`evaluate_loss`] |
//! | embed texts | [`embed()`] → one unit vector per input (mean of the final hidden states) | [`embed()`] |
//! | train from settings | [`fit`] ([`TrainOptions`], an [`Observer`] of [`StepReport`]s) → [`Outcome`]; [`prepare_run`] + [`train`] to resume or stop | [`fit`] |
//! | write your own loop | [`Optimizer::step`] ([`AdamWParams`], [`Workspace`]) → [`TrainStep`] | [`Optimizer`] |
//! | quantise for inference | [`Model::quantize`] with [`QuantKind`]; a cheaper KV cache with [`KvKind`] | [`Model::quantize`] |
//! | export | [`hf::export`] (transformers), [`gguf::export`] (llama.cpp) | each function |
//! | read attention maps | [`head_maps`] → [`HeadMaps`] (A1, A2 and A1 − λA2) | [`head_maps`] |
//! | serve over HTTP | [`serve`] with [`ServeOptions`] (feature `serve`); [`serve_until`] a [`Shutdown`] | [`serve`] |
//!
//! Every fallible call returns [`Result`], whose [`Error`] names the file or argument at fault.
//! docs/LIBRARY.md walks through these, and `examples/` holds whole programs.

pub use crate::config::{AttentionKind, ModelConfig, Preset};
pub use crate::data::Tokenizer;
pub use crate::error::{Error, Result};
pub use crate::experiments::attention_stats::{head_maps, HeadMaps};
pub use crate::infer::{
    embed, evaluate_loss, generate, generate_with_draft, DraftModel, EvalResult, GenerateOptions,
    Generation, Penalties, Sampling,
};
pub use crate::interop::{gguf, hf};
pub use crate::model::{KvKind, Model, QuantKind, Workspace};
pub use crate::open_model;
#[cfg(feature = "serve")]
pub use crate::serve::{serve, serve_until, ServeOptions, Shutdown, Speculate};
pub use crate::train::{
    fit, prepare_run, train, AdamWParams, Observer, Optimizer, Outcome, Silent, StepReport,
    TrainOptions, TrainStep,
};
