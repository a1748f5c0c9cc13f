//! `difftx plot`: the loss curves of several runs in one PNG.

use anyhow::{Context, Result};
use clap::Args;
use difftx::util::thousands;
use std::path::PathBuf;

#[derive(Args)]
pub struct PlotArgs {
    /// Run folders (each with metrics.jsonl and run.json).
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Title above the plot [default: the run names].
    #[arg(long)]
    pub title: Option<String>,
    /// Plot bits per byte instead of nats per token, so runs with different tokenizers
    /// compare. Known for byte-level runs (one token is one byte); a run trained with a
    /// tokenizer does not record its bytes per token, and is refused.
    #[arg(long)]
    pub bits_per_byte: bool,
    /// The bottom axis: training steps (with tokens seen along the top when every run sees
    /// as many tokens per step), or tokens seen (batch × grad-accum × context per step), for
    /// runs whose batches differ.
    #[arg(long, value_enum, default_value = "steps")]
    pub x_axis: XAxis,
}

/// What the bottom axis of `difftx plot` counts.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum XAxis {
    Steps,
    Tokens,
}

pub fn run(a: PlotArgs) -> Result<()> {
    let mut loaded = Vec::new();
    let mut tokenizers = Vec::new();
    for r in &a.runs {
        let records =
            difftx::train::metrics::read_metrics(&r.join(difftx::train::metrics::METRICS_FILE))?;
        let info = r.join(difftx::train::trainer::RUN_FILE);
        let text = std::fs::read_to_string(&info).with_context(|| info.display().to_string())?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: malformed JSON ({e})", info.display()))?;
        let kind = v["run"]["model"]["attention"].as_str().unwrap_or("?");
        let params = v["params"].as_u64().unwrap_or(0) as usize;
        let name = r
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let label = if name == kind {
            format!("{kind} ({} params)", thousands(params))
        } else {
            format!("{name}: {kind} ({} params)", thousands(params))
        };
        let tokenizer = match v["run"]["tokenizer"].as_str() {
            Some(path) => path.to_string(),
            None => "byte-level".to_string(),
        };
        if a.bits_per_byte && tokenizer != "byte-level" {
            anyhow::bail!(
                "{}: trained with the tokenizer {tokenizer}, whose bytes per token the run does not record, so its loss cannot be given in bits per byte (`difftx eval --model {} --data FILE` measures it)",
                r.display(),
                r.display()
            );
        }
        let t = &v["run"];
        let tokens_per_step = t["train"]["batch"].as_u64().unwrap_or(0)
            * t["train"]["grad_accum"].as_u64().unwrap_or(1)
            * t["model"]["max_position_embeddings"].as_u64().unwrap_or(0);
        loaded.push((label, records, tokens_per_step as f64));
        tokenizers.push((r.display().to_string(), tokenizer));
    }
    // Losses are per token: runs with other tokenizers count other tokens, so their curves do
    // not compare on one axis.
    if tokenizers.iter().any(|(_, t)| *t != tokenizers[0].1) {
        let each: Vec<String> = tokenizers
            .iter()
            .map(|(r, t)| format!("{r}: {t}"))
            .collect();
        eprintln!(
            "warning: these runs use different tokenizers ({}); their losses are per token of each, not comparable on one axis",
            each.join(", ")
        );
    }
    // Per byte-level token, bits per byte = nats / ln 2.
    let y = if a.bits_per_byte {
        1.0 / std::f64::consts::LN_2
    } else {
        1.0
    };
    let same_batch = loaded.iter().all(|l| l.2 == loaded[0].2 && l.2 > 0.0);
    let series: Vec<_> = loaded
        .iter()
        .map(|(label, records, tps)| {
            let x = if a.x_axis == XAxis::Tokens { *tps } else { 1.0 };
            difftx::train::metrics::loss_series(label.clone(), records).scaled(x, y)
        })
        .collect();
    if a.x_axis == XAxis::Steps && !same_batch {
        eprintln!("note: these runs see different numbers of tokens per step, so no tokens-seen axis is drawn; --x-axis tokens compares them by tokens");
    }
    let title = a.title.clone().unwrap_or_else(|| {
        a.runs
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(" vs ")
    });
    let axes = difftx::report::plot::LossAxes {
        title: &title,
        x_label: match a.x_axis {
            XAxis::Steps => "step",
            XAxis::Tokens => "tokens seen",
        },
        y_label: if a.bits_per_byte {
            "loss (bits per byte)"
        } else {
            "loss (nats per token)"
        },
        top: (a.x_axis == XAxis::Steps && same_batch).then_some(("tokens seen", loaded[0].2)),
    };
    difftx::report::plot::plot_runs(&series, &axes, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
