//! `difftx needle`: a given model's multi-needle retrieval accuracy, per context length and
//! depth (the task of `difftx repro`, experiments/needle).

use anyhow::{bail, Context, Result};
use clap::Args;
use difftx::data::Tokenizer;
use difftx::experiments::needle::{accuracy, retrieval_grid, Cell, Filler, NeedleTask, DEPTHS};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args)]
#[command(
    after_help = "The task (paper Section 3.4): an episode is a haystack of filler text with N
sentences \"the magic number of CITY is NUMBER. \" inserted, one of them at the asked depth
(0% = first, 100% = last) and the others at random depths, followed by R queries
\"\\nwhat is the magic number of CITY? NUMBER\", the needle at the depth asked first. The text
is tokenized with the model's tokenizer. An episode counts as retrieved when greedy decoding
would write that first answer. The same --seed gives every model the same episodes.

A model trained on plain text has never seen a query and scores about 0; train on the task
with `difftx train --needles N` (episodes over your own text) or use `difftx repro`'s models.

Examples:
  difftx needle --model runs/a                                   (synthetic filler)
  difftx needle --model runs/a --filler /usr/share/games/fortunes/fortunes --json"
)]
pub struct NeedleArgs {
    /// Model directory (native or Hugging Face), or a training run folder (its newest checkpoint).
    #[arg(long)]
    pub model: PathBuf,
    /// Text file to fill the haystacks with [default: a synthetic language, as `repro` uses].
    #[arg(long, value_name = "FILE")]
    pub filler: Option<PathBuf>,
    /// Needles per haystack (N, 1–24).
    #[arg(long, default_value_t = 2)]
    pub needles: usize,
    /// Needles asked for per episode (R, 1–N) [default: N].
    #[arg(long)]
    pub queries: Option<usize>,
    /// Digits of each NUMBER (1–9).
    #[arg(long, default_value_t = 2)]
    pub digits: usize,
    /// Episode lengths in tokens, comma-separated [default: 1/2, 3/4 and all of the context].
    #[arg(long, value_delimiter = ',', value_name = "T,...")]
    pub lengths: Vec<usize>,
    /// Depths of the needle asked first, as fractions in [0, 1], comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = DEPTHS.to_vec(), value_name = "P,...")]
    pub depths: Vec<f64>,
    /// Episodes per (length, depth) cell.
    #[arg(long, default_value_t = 20)]
    pub episodes: usize,
    /// Seed of the episodes (and of the synthetic language's words: seed 1, as in `repro`).
    #[arg(long, default_value_t = 20_241_007)]
    pub seed: u64,
    /// Episodes evaluated at once.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Print one JSON object on stdout: accuracy overall and per (length, depth) cell.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: NeedleArgs, precision: difftx::kernels::Precision) -> Result<()> {
    // 1. The model and its tokenizer
    let (mut model, dir) = super::load_model(&a.model, precision)?;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    // 2. The task and the grid's axes, every value checked
    let queries = a.queries.unwrap_or(a.needles);
    let mut task = NeedleTask::synthetic(a.needles, queries, a.digits, 1);
    task.validate()?;
    task.tokenizer = tok.file().is_some().then(|| Arc::new(tok));
    let ctx = model.config.max_position_embeddings;
    let lengths = lengths(&a, &task, ctx)?;
    let longest = lengths.iter().copied().max().unwrap_or(0);
    if longest > ctx {
        eprintln!(
            "warning: --lengths up to {longest} are past the context of {} ({ctx}): positions from {ctx} on were never trained",
            dir.display()
        );
        model.set_context(longest)?;
    }
    if let Some(path) = &a.filler {
        task.filler = text_filler(path, lengths.iter().copied().max().unwrap_or(0))?;
    }
    if let Some(d) = a.depths.iter().find(|d| !(0.0..=1.0).contains(*d)) {
        bail!("--depths: {d} is outside [0, 1]");
    }
    if a.episodes == 0 || a.batch == 0 {
        bail!("--episodes and --batch must be at least 1");
    }
    // 3. The grid, printed
    let cells = retrieval_grid(
        &model, &task, &lengths, &a.depths, a.episodes, a.seed, a.batch, None,
    )?;
    if a.json {
        println!("{}", to_json(&a, &dir, &cells));
    } else {
        print_grid(&a, &dir, &cells, &lengths);
    }
    Ok(())
}

/// The bytes of `path` as filler, which must hold the longest episode (`longest` tokens).
fn text_filler(path: &Path, longest: usize) -> Result<Filler> {
    let text = std::fs::read(path).with_context(|| format!("--filler {}", path.display()))?;
    if text.len() < longest {
        bail!(
            "--filler {}: {} bytes, fewer than the longest episode's {longest}",
            path.display(),
            text.len()
        );
    }
    Ok(Filler::Text(Arc::new(text)))
}

/// The lengths asked for (each at least the task's minimum), or the default ones (within the
/// model's context).
fn lengths(a: &NeedleArgs, task: &NeedleTask, ctx: usize) -> Result<Vec<usize>> {
    // bytes: every token holds at least one, so this many tokens always hold an episode
    let min = task.min_len();
    if a.lengths.is_empty() {
        if min > ctx {
            bail!(
                "an episode of {} needles of {} digits needs up to {min} tokens; the model's context is {ctx} (pass longer --lengths)",
                task.needles,
                task.digits
            );
        }
        let l: Vec<usize> = [ctx / 2, 3 * ctx / 4, ctx]
            .into_iter()
            .map(|l| if l == ctx { l } else { l / 16 * 16 })
            .filter(|&l| l >= min)
            .collect();
        return Ok(l);
    }
    for &l in &a.lengths {
        if l < min && task.tokenizer.is_none() {
            bail!(
                "--lengths: {l} is too short for an episode of {} needles of {} digits (at least {min} tokens)",
                task.needles,
                task.digits
            );
        }
    }
    Ok(a.lengths.clone())
}

fn filler_name(a: &NeedleArgs) -> String {
    a.filler
        .as_ref()
        .map_or("synthetic".into(), |p| p.display().to_string())
}

/// Accuracy over all queries of all cells.
fn all_queries(cells: &[Cell]) -> f64 {
    let all: usize = cells.iter().map(|c| c.all_correct).sum();
    let total: usize = cells.iter().map(|c| c.all_total).sum();
    all as f64 / total.max(1) as f64
}

fn to_json(a: &NeedleArgs, dir: &Path, cells: &[Cell]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            serde_json::json!({"len": c.len, "depth": c.depth, "correct": c.correct,
                "total": c.total, "accuracy": c.accuracy(), "all_correct": c.all_correct,
                "all_total": c.all_total})
        })
        .collect();
    serde_json::json!({
        "model": dir.display().to_string(),
        "needles": a.needles,
        "queries": a.queries.unwrap_or(a.needles),
        "digits": a.digits,
        "filler": filler_name(a),
        "episodes": a.episodes,
        "seed": a.seed,
        "accuracy": accuracy(cells),
        "all_queries_accuracy": all_queries(cells),
        "cells": rows,
    })
}

/// The grid: one row per depth, one column per length, then the overall accuracy.
fn print_grid(a: &NeedleArgs, dir: &Path, cells: &[Cell], lengths: &[usize]) {
    println!(
        "{}: {} needles of {} digits, {} asked, filler {}, {} episodes per cell (seed {})",
        dir.display(),
        a.needles,
        a.digits,
        a.queries.unwrap_or(a.needles),
        filler_name(a),
        a.episodes,
        a.seed
    );
    let head: Vec<String> = lengths.iter().map(|l| format!("{l:>7}")).collect();
    println!("depth \\ length {}", head.join(""));
    for &d in &a.depths {
        let row: Vec<String> = lengths
            .iter()
            .map(|&l| {
                let c = cells.iter().find(|c| c.len == l && c.depth == d);
                format!("{:>7.2}", c.map_or(f64::NAN, Cell::accuracy))
            })
            .collect();
        println!("{:>13.0}% {}", d * 100.0, row.join(""));
    }
    println!(
        "retrieval {:.3} ({} of {} episodes); every query's answer {:.3}",
        accuracy(cells),
        cells.iter().map(|c| c.correct).sum::<usize>(),
        cells.iter().map(|c| c.total).sum::<usize>(),
        all_queries(cells)
    );
}
