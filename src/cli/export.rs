//! `difftx export`: a model in another format (a Hugging Face directory, or a GGUF file for
//! llama.cpp).

use anyhow::{bail, Result};
use clap::Args;
use difftx::interop::gguf::Quant;
use difftx::AttentionKind;
use std::path::PathBuf;

#[derive(Args)]
pub struct ExportArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama / difftx_diffv2), or a
    /// training run folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    /// Target format: `hf` (a Hugging Face transformers directory) or `gguf` (one file that
    /// llama.cpp runs; `standard` models only).
    #[arg(long, default_value = "hf")]
    pub format: String,
    /// With --format gguf: how the matrices are stored: f32, bf16, q8_0 or q4_0 (GGUF's blocks
    /// of 32 with an f16 scale; a matrix whose rows are not whole blocks stays f32, and so do
    /// the norms).
    #[arg(long)]
    pub quant: Option<String>,
    /// Output directory (hf) or file (gguf).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(a: ExportArgs) -> Result<()> {
    match a.format.as_str() {
        "hf" => hf(a),
        "gguf" => gguf(a),
        other => bail!("--format `{other}` is not supported (expected hf or gguf)"),
    }
}

fn hf(a: ExportArgs) -> Result<()> {
    if a.quant.is_some() {
        bail!("--quant applies to --format gguf only (a Hugging Face export is f32)");
    }
    let (model, dir) = super::load_model(&a.model, difftx::kernels::Precision::F32)?;
    difftx::interop::hf::export(&model, &dir, &a.out)?;
    let (model_type, _) = difftx::interop::hf::hf_names(model.config.attention);
    let remote = if model.config.attention == AttentionKind::DiffV2 {
        ", trust_remote_code=True: the model code is in the directory"
    } else {
        ""
    };
    eprintln!(
        "wrote {} ({} as Hugging Face {model_type}; load it with AutoModelForCausalLM.from_pretrained{remote})",
        a.out.display(),
        model.config.attention,
    );
    Ok(())
}

fn gguf(a: ExportArgs) -> Result<()> {
    let quant = Quant::parse(a.quant.as_deref().unwrap_or("f32"))?;
    let (model, dir) = super::load_model(&a.model, difftx::kernels::Precision::F32)?;
    let e = difftx::interop::gguf::export(&model, &dir, quant, &a.out)?;
    eprintln!(
        "wrote {} ({} tensors, {} MiB, matrices in {}; tokenizer: {}); run it with llama.cpp, e.g. llama-simple -m {} \"Once\"",
        a.out.display(),
        e.tensors,
        e.bytes.div_ceil(1 << 20),
        quant.name(),
        e.tokenizer,
        a.out.display()
    );
    if !e.kept_f32.is_empty() {
        eprintln!(
            "note: kept in f32 (rows not whole blocks of {}): {}",
            quant.name(),
            e.kept_f32.join(", ")
        );
    }
    Ok(())
}
