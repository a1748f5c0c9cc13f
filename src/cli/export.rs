//! `difftx export`: a model in another format (a Hugging Face directory).

use anyhow::{bail, Result};
use clap::Args;
use difftx::AttentionKind;
use std::path::PathBuf;

#[derive(Args)]
pub struct ExportArgs {
    /// Model directory (native difftx, or a Hugging Face llama / diffllama).
    #[arg(long)]
    pub model: PathBuf,
    /// Target format; `hf` is the only one.
    #[arg(long, default_value = "hf")]
    pub format: String,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(a: ExportArgs) -> Result<()> {
    if a.format != "hf" {
        bail!("--format `{}` is not supported (expected hf)", a.format);
    }
    let model = difftx::interop::load(&a.model)?;
    difftx::interop::hf::export(&model, &a.model, &a.out)?;
    eprintln!(
        "wrote {} ({} as Hugging Face {}; load it with AutoModelForCausalLM.from_pretrained)",
        a.out.display(),
        model.config.attention,
        if model.config.attention == AttentionKind::Standard {
            "llama"
        } else {
            "diffllama"
        }
    );
    Ok(())
}
