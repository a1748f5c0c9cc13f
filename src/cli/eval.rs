//! `difftx eval`: the mean next-token loss and perplexity of a text under a model.

use super::progress::progress;
use anyhow::{bail, Context, Result};
use clap::Args;
use difftx::data::Tokenizer;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct EvalArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama / difftx_diffv2), or a
    /// training run folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, help = super::QUANT_HELP)]
    pub quant: Option<String>,
    /// UTF-8 text file to score, tokenized with the model's tokenizer.
    #[arg(long)]
    pub data: PathBuf,
    /// Windows evaluated at once.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// With bf16 or q8_0, each window runs through a KV cache of that type, as `generate` and
    /// `serve` run a prompt: the loss the cache's rounding costs. The default f32 scores
    /// without a cache (the same numbers, up to rounding).
    #[arg(long, default_value = "f32")]
    pub kv_cache: String,
    /// Print one JSON object {"loss", "perplexity", "tokens", "bits_per_byte", "bytes"} on
    /// stdout (bits per byte compare models with different tokenizers).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: EvalArgs, precision: difftx::kernels::Precision) -> Result<()> {
    let quant = super::quant_kind(a.quant.as_deref())?;
    let kv_cache = super::kv_kind(&a.kv_cache)?;
    let (mut model, dir) = super::load_model(&a.model, precision)?;
    super::quantize(&mut model, quant);
    model.kv_cache = kv_cache;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let (text, ids) = scored_text(&a.data, &tok)?;
    let pb = progress(0, "eval");
    let r = difftx::infer::evaluate_loss(&model, &ids, a.batch, |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
    // Bits per byte compare models whose tokenizers differ: every token but the first is
    // predicted, so the predicted bytes are the text's less the first token's.
    let first = match tok.file() {
        None => 1,
        Some(_) => tok.decode(&ids[..1])?.len(),
    };
    let bytes = text.len().saturating_sub(first).max(1);
    let bits_per_byte = r.loss * r.tokens as f64 / std::f64::consts::LN_2 / bytes as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"loss": r.loss, "perplexity": r.perplexity, "tokens": r.tokens, "bits_per_byte": bits_per_byte, "bytes": bytes})
        );
    } else {
        println!(
            "loss {:.4} nats/token  perplexity {:.3}  {:.4} bits/byte  ({} tokens, {} bytes)",
            r.loss, r.perplexity, bits_per_byte, r.tokens, bytes
        );
    }
    Ok(())
}

/// A text file to score and its tokens under `tok`: one line for a file that cannot be read,
/// is not UTF-8 or holds fewer than two tokens; the tokenizer's coverage warning, if any, on
/// stderr.
pub(crate) fn scored_text(path: &Path, tok: &Tokenizer) -> Result<(String, Vec<u32>)> {
    let text = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    let text = String::from_utf8(text)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", path.display()))?;
    let (ids, warning) = tok.encode_checked(&text, path)?;
    if let Some(w) = warning {
        eprintln!("{w}");
    }
    if ids.len() < 2 {
        bail!(
            "{}: {} token(s) after tokenization; need at least 2 to score a next token",
            path.display(),
            ids.len()
        );
    }
    Ok((text, ids))
}
