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
    /// Score through a KV cache of this type (bf16, q8_0), as `generate` runs a prompt: the
    /// loss its rounding costs; f32 scores without a cache.
    #[arg(long, default_value = "f32")]
    pub kv_cache: String,
    /// Window length in tokens [default: the model's context]; past it, with a warning.
    #[arg(long, value_name = "N")]
    pub length: Option<usize>,
    /// Also report the loss by position in the window, in --buckets (paper Figure 6).
    #[arg(long)]
    pub by_position: bool,
    /// With --by-position: how many buckets.
    #[arg(long, default_value_t = 16, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub buckets: u64,
    /// With --by-position: draw both curves (per bucket, cumulative) into this PNG.
    #[arg(long, value_name = "FILE.png", requires = "by_position")]
    pub plot: Option<PathBuf>,
    /// Print one JSON object on stdout: loss, perplexity, tokens, bits_per_byte, … (docs/INFERENCE.md).
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
    let len = window_length(&mut model, a.length, &dir)?;
    let pb = progress(0, "eval");
    let (r, at) =
        difftx::infer::evaluate_by_position(&model, &ids, a.batch, len, |done, total| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        })?;
    pb.finish_and_clear();
    let buckets = at.buckets(a.buckets as usize);
    // Bits per byte compare models whose tokenizers differ: every token but the first is
    // predicted, so the predicted bytes are the text's less the first token's.
    let first = match tok.file() {
        None => 1,
        Some(_) => tok.decode(&ids[..1])?.len(),
    };
    let bytes = text.len().saturating_sub(first).max(1);
    let bits_per_byte = r.loss * r.tokens as f64 / std::f64::consts::LN_2 / bytes as f64;
    if a.json {
        let mut j = serde_json::json!({"loss": r.loss, "perplexity": r.perplexity, "tokens": r.tokens, "bits_per_byte": bits_per_byte, "bytes": bytes, "length": len});
        if a.by_position {
            j["by_position"] = serde_json::to_value(&buckets)?;
        }
        println!("{j}");
    } else {
        println!(
            "loss {:.4} nats/token  perplexity {:.3}  {:.4} bits/byte  ({} tokens, {} bytes, windows of {len})",
            r.loss, r.perplexity, bits_per_byte, r.tokens, bytes
        );
        if a.by_position {
            print_buckets(&buckets);
        }
    }
    if let Some(png) = &a.plot {
        plot_buckets(&buckets, &dir, len, png)?;
        eprintln!("wrote {}", png.display());
    }
    Ok(())
}

/// The window length: the model's context unless asked; past it, the rotary table is
/// extended and a warning says so.
fn window_length(model: &mut difftx::Model, asked: Option<usize>, dir: &Path) -> Result<usize> {
    let ctx = model.config.max_position_embeddings;
    let len = asked.unwrap_or(ctx);
    if len == 0 {
        bail!("--length must be at least 1");
    }
    if len > ctx {
        eprintln!(
            "warning: --length {len} is past the context of {} ({ctx}): positions from {ctx} on were never trained",
            dir.display()
        );
        model.set_context(len)?;
    }
    Ok(len)
}

/// One row per bucket: its positions, tokens, mean loss and the cumulative mean.
fn print_buckets(buckets: &[difftx::infer::Bucket]) {
    println!(
        "{:>13} {:>10} {:>8} {:>11}",
        "positions", "tokens", "loss", "cumulative"
    );
    for b in buckets {
        let range = format!("{}–{}", b.start, b.end - 1);
        println!(
            "{range:>13} {:>10} {:>8.4} {:>11.4}",
            b.tokens, b.loss, b.cumulative
        );
    }
}

/// The loss by position as a PNG: each bucket's mean at its end, and the cumulative mean.
fn plot_buckets(
    buckets: &[difftx::infer::Bucket],
    dir: &Path,
    len: usize,
    png: &Path,
) -> Result<()> {
    use difftx::report::lines::{plot_lines, Axes, Line, Point};
    let line = |label: &str, y: fn(&difftx::infer::Bucket) -> f64| Line {
        label: label.into(),
        points: buckets
            .iter()
            .map(|b| Point {
                x: b.end as f64,
                y: y(b),
                sd: None,
            })
            .collect(),
    };
    let title = format!("{}: loss by position, windows of {len}", dir.display());
    let axes = Axes {
        title: &title,
        x_label: "position in the window (bucket end)",
        y_label: "loss (nats/token)",
        log_x: false,
        y_range: None,
    };
    let lines = [
        line("mean of the bucket", |b| b.loss),
        line("cumulative mean (paper Fig. 6)", |b| b.cumulative),
    ];
    plot_lines(&lines, &axes, png)?;
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
