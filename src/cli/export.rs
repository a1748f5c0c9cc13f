//! `difftx export`: a model in another format (a Hugging Face directory).

use anyhow::{bail, Result};
use clap::Args;
use difftx::AttentionKind;
use std::path::PathBuf;

#[derive(Args)]
pub struct ExportArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama), or a training run
    /// folder, which stands for its newest complete checkpoint.
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
    let (model, dir) = super::load_model(&a.model, difftx::kernels::Precision::F32)?;
    difftx::interop::hf::export(&model, &dir, &a.out)?;
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
