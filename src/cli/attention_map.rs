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
    /// Also write the raw maps as JSON: the tokens, each row's λ, and A (standard) or A1, A2
    /// and A1 − λ·A2 (diff kinds) as T rows of T values, row i attending to keys 0..=i.
    #[arg(long, value_name = "FILE.json")]
    pub dump: Option<PathBuf>,
}

pub fn run(a: AttentionMapArgs, precision: difftx::kernels::Precision) -> Result<()> {
    use difftx::report::heatmap::{plot_attention_maps, MapPanel};
    let (model, dir) = super::load_model(&a.model, precision)?;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let ids = tok.encode(&a.prompt)?;
    let m = difftx::experiments::attention_stats::head_maps(&model, &ids, a.layer, a.head)?;
    let kind = model.config.attention;
    let t = m.t;
    if let Some(path) = &a.dump {
        let rows = |x: &[f64]| x.chunks(t).map(|r| r.to_vec()).collect::<Vec<_>>();
        let tokens = ids
            .iter()
            .map(|&id| tok.decode(&[id]))
            .collect::<difftx::Result<Vec<_>>>()?;
        let json = serde_json::json!({
            "model": a.model.display().to_string(), "attention": kind.as_str(),
            "layer": a.layer, "head": a.head, "tokens": tokens, "ids": ids,
            "lambda": m.lambda, "a1": rows(&m.a1),
            "a2": m.a2.as_deref().map(rows), "diff": m.diff.as_deref().map(rows),
        });
        difftx::util::write_atomic(path, json.to_string().as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
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
