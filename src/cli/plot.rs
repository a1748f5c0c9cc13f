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
        loaded.push((label, records));
        let tokenizer = match v["run"]["tokenizer"].as_str() {
            Some(path) => path.to_string(),
            None => "byte-level".to_string(),
        };
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
    let series: Vec<_> = loaded
        .iter()
        .map(|(label, records)| difftx::train::metrics::loss_series(label.clone(), records))
        .collect();
    let title = a.title.clone().unwrap_or_else(|| {
        a.runs
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(" vs ")
    });
    difftx::report::plot::plot_runs(&series, &title, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
