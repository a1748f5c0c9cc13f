//! `difftx retrofit`: a standard (Llama) model turned into a differential one, to fine-tune
//! with `difftx train --init-from`.

use anyhow::{Context, Result};
use clap::Args;
use difftx::data::tokenizer::TOKENIZER_FILE;
use difftx::data::Tokenizer;
use difftx::infer::evaluate_loss;
use difftx::AttentionKind;
use std::path::PathBuf;

#[derive(Args)]
pub struct RetrofitArgs {
    /// The standard model: a native difftx or Hugging Face llama directory, or a training run
    /// folder (its newest checkpoint).
    #[arg(long)]
    pub model: PathBuf,
    /// diff_v2 starts exactly where the original is (the same logits); diff_v1 cannot, and
    /// starts near it (docs/FINETUNING.md says how).
    #[arg(long)]
    pub attention: AttentionKind,
    /// Output model directory (the tokenizer is copied along).
    #[arg(long)]
    pub out: PathBuf,
    /// A text to score both models on, printing the retrofit's initial loss gap.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Seed of the tensors that have no exact start (diff_v1's λ vectors).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(a: RetrofitArgs, precision: difftx::kernels::Precision) -> Result<()> {
    // 1. The original, and the retrofit
    let (model, dir) = super::load_model(&a.model, precision)?;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let retro = difftx::model::retrofit::retrofit(&model, a.attention, a.seed)?;
    // 2. Its loss gap on a text, when one is given
    if let Some(data) = &a.data {
        let (_, ids) = super::eval::scored_text(data, &tok)?;
        let before = evaluate_loss(&model, &ids, 8, |_, _| ())?.loss;
        let after = evaluate_loss(&retro, &ids, 8, |_, _| ())?.loss;
        eprintln!(
            "loss on {} ({} tokens): original {before:.4}, retrofitted {after:.4} nats/token (gap {:+.4})",
            data.display(),
            ids.len(),
            after - before
        );
    }
    // 3. Saved, with the original's tokenizer
    retro.save(&a.out)?;
    if let Some(src) = tok.file() {
        let dst = a.out.join(TOKENIZER_FILE);
        std::fs::copy(src, &dst).with_context(|| format!("{}", dst.display()))?;
    }
    eprintln!(
        "wrote {} ({}, {} parameters, from the {} parameters of {}); fine-tune it with `difftx train --init-from {}`",
        a.out.display(),
        a.attention,
        retro.num_params(),
        model.num_params(),
        dir.display(),
        a.out.display()
    );
    Ok(())
}
