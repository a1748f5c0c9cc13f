//! `--draft-model` and `--draft-tokens`, on every command that decodes: speculative decoding
//! with a smaller model's drafts (`difftx::infer::speculative`).

use anyhow::{bail, Result};
use clap::Args;
use difftx::data::Tokenizer;
use difftx::Model;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct DraftArgs {
    /// Speculative decoding with a draft model: a smaller model with the same tokenizer
    /// (trained on the same text, say) proposes --draft-tokens tokens a step, its greedy
    /// continuation, and the model verifies them in one forward pass. Greedy text is
    /// unchanged, sampled text keeps its distribution. The draft takes the model's --bf16,
    /// --quant and --kv-cache. A model directory or a training run folder, as --model.
    #[arg(long, value_name = "DIR", conflicts_with = "lookup")]
    pub draft_model: Option<PathBuf>,
    /// Tokens the draft model proposes a step.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "draft_model")]
    pub draft_tokens: usize,
}

impl DraftArgs {
    /// --draft-model and --draft-tokens when a draft model is given (tokens refused below 1),
    /// else None.
    pub fn given(&self) -> Result<Option<(&PathBuf, usize)>> {
        let Some(path) = &self.draft_model else {
            return Ok(None);
        };
        if self.draft_tokens == 0 {
            bail!("--draft-tokens must be at least 1");
        }
        Ok(Some((path, self.draft_tokens)))
    }

    /// The draft model, set up as `target` (`difftx::open_draft_model`), or None without
    /// --draft-model.
    pub fn load(&self, target: &Model, tok: &Tokenizer) -> Result<Option<Model>> {
        self.given()?
            .map(|(path, _)| Ok(difftx::open_draft_model(path, target, tok)?))
            .transpose()
    }
}
