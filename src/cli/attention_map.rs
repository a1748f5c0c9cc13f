//! `difftx attention-map`: one head's attention over a prompt (or every head of a layer) as
//! heatmaps with the prompt's tokens on both axes and a colour bar.

use anyhow::{bail, Result};
use clap::Args;
use difftx::data::Tokenizer;
use difftx::experiments::attention_stats::{head_maps, HeadMaps};
use difftx::report::heatmap::{plot_attention_maps, MapLayout, MapPanel};
use difftx::AttentionKind;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct AttentionMapArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama / difftx_diffv2), or a
    /// training run folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text, tokenized with the model's tokenizer; at most the model's context.
    #[arg(long)]
    pub prompt: String,
    /// Layer, from 0.
    #[arg(long)]
    pub layer: usize,
    /// Head, from 0 (a differential head for the diff kinds).
    #[arg(
        long,
        required_unless_present = "all_heads",
        conflicts_with = "all_heads"
    )]
    pub head: Option<usize>,
    /// Every head of the layer, one row of maps per head (diff kinds: A1, A2 and A1 − λ·A2),
    /// instead of one --head.
    #[arg(long)]
    pub all_heads: bool,
    /// The PNG to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the raw maps. FILE.json: the tokens, each row's λ, and A (standard) or A1,
    /// A2 and A1 − λ·A2 (diff kinds) as T rows of T values, row i attending to keys 0..=i
    /// (with --all-heads, a list with one such object per head). FILE.npy: one float32 array
    /// of shape (heads, maps, T, T), maps being A, or A1, A2, A1 − λ·A2, in that order.
    #[arg(long, value_name = "FILE.json|FILE.npy")]
    pub dump: Option<PathBuf>,
}

/// How the raw maps are dumped, from the file's extension.
enum Dump {
    Json,
    Npy,
}

fn dump_kind(path: &Path) -> Result<Dump> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Ok(Dump::Json),
        Some("npy") => Ok(Dump::Npy),
        _ => bail!(
            "--dump {}: the file must end in .json or .npy",
            path.display()
        ),
    }
}

pub fn run(a: AttentionMapArgs, precision: difftx::kernels::Precision) -> Result<()> {
    // 1. The model, the prompt's tokens and the maps of the head(s) asked for.
    let dump = a.dump.as_deref().map(dump_kind).transpose()?;
    let (model, dir) = super::load_model(&a.model, precision)?;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let ids = tok.encode(&a.prompt)?;
    let heads: Vec<usize> = match a.head {
        Some(h) => vec![h],
        None => (0..model.config.num_attention_heads).collect(),
    };
    let picks: Vec<(usize, usize)> = heads.iter().map(|&h| (a.layer, h)).collect();
    let maps = head_maps(&model, &ids, &picks)?;
    let tokens = ids
        .iter()
        .map(|&id| tok.decode(&[id]))
        .collect::<difftx::Result<Vec<_>>>()?;
    let kind = model.config.attention;
    let t = maps[0].t;
    // 2. The dump, if asked for.
    if let (Some(path), Some(d)) = (&a.dump, dump) {
        let bytes = match d {
            Dump::Json => dump_json(&a, kind, &heads, &maps, &tokens, &ids).into_bytes(),
            Dump::Npy => {
                let per: Vec<Vec<&[f64]>> = maps.iter().map(map_list).collect();
                let data: Vec<f32> = per
                    .iter()
                    .flatten()
                    .flat_map(|m| m.iter())
                    .map(|&v| v as f32)
                    .collect();
                difftx::util::npy_f32(&[maps.len(), per[0].len(), t, t], &data)
            }
        };
        difftx::util::write_atomic(path, &bytes)?;
        eprintln!("wrote {}", path.display());
    }
    // 3. The picture: a grid of panels, head by head.
    let mut panels = Vec::new();
    for (&h, m) in heads.iter().zip(&maps) {
        let prefix = if heads.len() > 1 {
            format!("head {h}: ")
        } else {
            String::new()
        };
        panels.extend(head_panels(kind, m, &prefix));
    }
    let title = [
        a.model.display().to_string(),
        match a.head {
            Some(h) => format!("{kind}, layer {}, head {h}, {t} tokens", a.layer),
            None => format!(
                "{kind}, layer {}, all {} heads, {t} tokens",
                a.layer,
                heads.len()
            ),
        },
    ];
    let layout = MapLayout {
        title: &title,
        tokens: &tokens,
        // diff kinds: one row of A1, A2, A1 − λ·A2 per head; standard: four heads a row
        cols: match panels.len() / heads.len() {
            1 => heads.len().min(4),
            per => per,
        },
        side: if heads.len() > 1 { 300 } else { 420 },
    };
    plot_attention_maps(&panels, &layout, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// A head's maps in dump order: A (standard), or A1, A2 and A1 − λ·A2.
fn map_list(m: &HeadMaps) -> Vec<&[f64]> {
    match (&m.a2, &m.diff) {
        (Some(a2), Some(d)) => vec![&m.a1, a2, d],
        _ => vec![&m.a1],
    }
}

/// The panels of one head, each title after `prefix`.
fn head_panels(kind: AttentionKind, m: &HeadMaps, prefix: &str) -> Vec<MapPanel> {
    let t = m.t;
    let panel = |title: String, values: &[f64], signed| MapPanel {
        title: format!("{prefix}{title}"),
        t,
        values: values.to_vec(),
        signed,
    };
    match (&m.a2, &m.diff) {
        (Some(a2), Some(diff)) => {
            let lam = match kind {
                AttentionKind::DiffV1 => format!("λ = {:.3}", m.lambda[0]),
                _ => format!("mean λ {:.3}", m.lambda.iter().sum::<f64>() / t as f64),
            };
            vec![
                panel("A1".into(), &m.a1, false),
                panel("A2".into(), a2, false),
                panel(format!("A1 − λ·A2 ({lam})"), diff, true),
            ]
        }
        _ => vec![panel("softmax(QKᵀ/√d)".into(), &m.a1, false)],
    }
}

/// The JSON dump: one object for one head, a list of them for --all-heads.
fn dump_json(
    a: &AttentionMapArgs,
    kind: AttentionKind,
    heads: &[usize],
    maps: &[HeadMaps],
    tokens: &[String],
    ids: &[u32],
) -> String {
    let one = |h: usize, m: &HeadMaps| {
        let mut v = serde_json::json!({
            "model": a.model.display().to_string(), "attention": kind.as_str(),
            "layer": a.layer, "head": h, "tokens": tokens, "ids": ids,
        });
        if let (Some(o), serde_json::Value::Object(maps)) = (v.as_object_mut(), m.to_json()) {
            o.extend(maps);
        }
        v
    };
    let all: Vec<serde_json::Value> = heads.iter().zip(maps).map(|(&h, m)| one(h, m)).collect();
    match a.head {
        Some(_) => all[0].to_string(),
        None => serde_json::Value::Array(all).to_string(),
    }
}
