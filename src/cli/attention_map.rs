//! `difftx attention-map`: one head's attention over a prompt as a heatmap.

use anyhow::Result;
use clap::Args;
use difftx::data::Tokenizer;
use difftx::AttentionKind;
use std::path::PathBuf;

#[derive(Args)]
pub struct AttentionMapArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama), or a training run
    /// folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text, tokenized with the model's tokenizer; at most the model's context.
    #[arg(long)]
    pub prompt: String,
    /// Layer, from 0.
    #[arg(long)]
    pub layer: usize,
    /// Head, from 0 (a differential head for the diff kinds).
    #[arg(long)]
    pub head: usize,
    /// The PNG to write.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(a: AttentionMapArgs, precision: difftx::kernels::Precision) -> Result<()> {
    use difftx::report::heatmap::{plot_attention_maps, MapPanel};
    let (model, dir) = super::load_model(&a.model, precision)?;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let ids = tok.encode(&a.prompt)?;
    let m = difftx::experiments::attention_stats::head_maps(&model, &ids, a.layer, a.head)?;
    let kind = model.config.attention;
    let t = m.t;
    let panels = match (m.a2, m.diff) {
        (Some(a2), Some(diff)) => {
            let lam = match kind {
                AttentionKind::DiffV1 => format!("λ = {:.3}", m.lambda[0]),
                _ => format!(
                    "λ per token, mean {:.3}",
                    m.lambda.iter().sum::<f64>() / t as f64
                ),
            };
            vec![
                MapPanel {
                    title: "A1".into(),
                    t,
                    values: m.a1,
                    signed: false,
                },
                MapPanel {
                    title: "A2".into(),
                    t,
                    values: a2,
                    signed: false,
                },
                MapPanel {
                    title: format!("A1 − λ·A2 ({lam})"),
                    t,
                    values: diff,
                    signed: true,
                },
            ]
        }
        _ => vec![MapPanel {
            title: "softmax(QKᵀ/√d)".into(),
            t,
            values: m.a1,
            signed: false,
        }],
    };
    let title = format!(
        "{}: {kind}, layer {}, head {}, {t} tokens",
        a.model.display(),
        a.layer,
        a.head
    );
    plot_attention_maps(&panels, &title, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
