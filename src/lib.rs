//! difftx: Differential Transformer language models (Ye et al., ICLR 2025) — DIFF V1, DIFF V2
//! and the baseline Transformer — trained and run on a CPU with hand-written kernels.
//!
//! As a library: `use difftx::prelude::*;` brings the common path — [`open_model`],
//! [`infer::generate()`], [`infer::evaluate_loss`], [`train::fit`], [`train::Optimizer`], quantising,
//! exporting, attention maps and the HTTP server — each with an example in its docs. The guide
//! is docs/LIBRARY.md; whole programs are in `examples/`.

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
pub mod prelude;
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

/// docs/LIBRARY.md's Rust blocks, compiled as doctests so that the guide cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../docs/LIBRARY.md")]
pub struct LibraryGuide;

pub use config::{AttentionKind, ModelConfig, Preset};
pub use error::{Error, Result};
pub use model::{Model, Workspace};

use std::path::Path;

/// Opens what a user points at: a model directory, native difftx or Hugging Face (see
/// [`interop::load`]), or a training run folder (its newest complete checkpoint), with the
/// tokenizer saved beside it (byte-level when there is none).
///
/// ```
/// use difftx::prelude::*;
///
/// let dir = tempfile::tempdir()?;
/// let config = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
/// Model::init(config, 0)?.save(dir.path())?;
///
/// let (model, tok) = open_model(dir.path())?;
/// assert_eq!(model.config.attention, AttentionKind::DiffV1);
/// assert_eq!(tok.decode(&tok.encode("hi")?)?, "hi");
/// assert!(open_model(dir.path().join("missing")).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open_model(path: impl AsRef<Path>) -> Result<(Model, data::Tokenizer)> {
    let (dir, _) = train::checkpoint::model_dir(path.as_ref())?;
    let model = interop::load(&dir)?;
    let tok = data::Tokenizer::for_model(&dir, &model.config)?;
    Ok((model, tok))
}

/// Opens a draft model for speculative decoding of `target` ([`infer::DraftModel`]): what
/// [`open_model`] opens, refused in one line unless its tokenizer is `tok`, set to multiply,
/// quantise and cache as `target` does.
pub fn open_draft_model(
    path: impl AsRef<Path>,
    target: &Model,
    tok: &data::Tokenizer,
) -> Result<Model> {
    let path = path.as_ref();
    let (mut draft, own) = open_model(path)?;
    if own.fingerprint() != tok.fingerprint() {
        let name = |t: &data::Tokenizer| match t.file() {
            Some(p) => p.display().to_string(),
            None => "byte-level".into(),
        };
        return Err(Error::Invalid(format!(
            "draft model {}: its tokenizer ({}) is not the model's ({}); a draft model needs the same tokenizer",
            path.display(),
            name(&own),
            name(tok)
        )));
    }
    draft.precision = target.precision;
    if let Some(q) = &target.quant {
        draft.quantize(q.kind);
    }
    draft.kv_cache = target.kv_cache;
    Ok(draft)
}
