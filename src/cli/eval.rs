//! `difftx eval`: the mean next-token loss and perplexity of a text under a model.

use super::progress::progress;
use anyhow::{bail, Context, Result};
use clap::Args;
use difftx::data::Tokenizer;
use std::path::PathBuf;

#[derive(Args)]
pub struct EvalArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama), or a training run
    /// folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    /// UTF-8 text file to score, tokenized with the model's tokenizer.
    #[arg(long)]
    pub data: PathBuf,
    /// Windows evaluated at once.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Print one JSON object {"loss", "perplexity", "tokens"} on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: EvalArgs, precision: difftx::kernels::Precision) -> Result<()> {
    let (model, dir) = super::load_model(&a.model, precision)?;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let text = std::fs::read(&a.data).with_context(|| format!("{}", a.data.display()))?;
    let text = String::from_utf8(text)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", a.data.display()))?;
    let (ids, warning) = tok.encode_checked(&text, &a.data)?;
    if let Some(w) = warning {
        eprintln!("{w}");
    }
    if ids.len() < 2 {
        bail!(
            "{}: {} token(s) after tokenization; need at least 2 to score a next token",
            a.data.display(),
            ids.len()
        );
    }
    let pb = progress(0, "eval");
    let r = difftx::infer::evaluate_loss(&model, &ids, a.batch, |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"loss": r.loss, "perplexity": r.perplexity, "tokens": r.tokens})
        );
    } else {
        println!(
            "loss {:.4} nats/token  perplexity {:.3}  ({} tokens)",
            r.loss, r.perplexity, r.tokens
        );
    }
    Ok(())
}
