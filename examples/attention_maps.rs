//! Read the attention maps of a model for an analysis of your own: for the diff kinds each
//! head's two softmax maps A1 and A2, its λ, and the map A1 − λ·A2 it applies.
//!
//! ```text
//! cargo run --release --example attention_maps -- [MODEL_DIR] [PROMPT]
//! ```
//!
//! Without a model it makes an untrained tiny diff_v1 one. For each head it prints λ, how
//! spread out A1 and A2 are (mean entropy of their rows, in nats) and where the last token
//! looks most under A1 − λ·A2; then it checks that every row of A1 and A2 sums to one.

use difftx::prelude::*;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Row `i` of a T×T map.
fn row(map: &[f64], t: usize, i: usize) -> &[f64] {
    &map[i * t..(i + 1) * t]
}

/// Mean entropy of the rows of a T×T map, in nats.
fn mean_entropy(map: &[f64], t: usize) -> f64 {
    let h = |r: &[f64]| {
        -r.iter()
            .filter(|&&p| p > 0.0)
            .map(|&p| p * p.ln())
            .sum::<f64>()
    };
    (0..t).map(|i| h(row(map, t, i))).sum::<f64>() / t as f64
}

/// The largest |row sum − 1| over the rows of a T×T map.
fn row_sum_error(map: &[f64], t: usize) -> f64 {
    (0..t)
        .map(|i| (row(map, t, i).iter().sum::<f64>() - 1.0).abs())
        .fold(0.0, f64::max)
}

fn run() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut _temp = None;
    let dir = match args.next() {
        Some(d) => PathBuf::from(d),
        None => {
            let t = tempfile::tempdir()?;
            Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?
                .save(t.path())?;
            let dir = t.path().to_path_buf();
            _temp = Some(t);
            dir
        }
    };
    let prompt = args
        .next()
        .unwrap_or_else(|| "the magic number is 42".into());
    let (model, tok) = open_model(&dir)?;
    let ids = tok.encode(&prompt)?;
    let c = &model.config;
    let picks: Vec<(usize, usize)> = (0..c.num_hidden_layers)
        .flat_map(|l| (0..c.num_attention_heads).map(move |h| (l, h)))
        .collect();
    let maps = head_maps(&model, &ids, &picks)?;

    println!("{} model, {} tokens: {prompt:?}", c.attention, ids.len());
    let (mut rows, mut worst) = (0, 0f64);
    for (&(layer, head), m) in picks.iter().zip(&maps) {
        let t = m.t;
        let mut line = format!(
            "layer {layer} head {head}: A1 entropy {:.3}",
            mean_entropy(&m.a1, t)
        );
        worst = worst.max(row_sum_error(&m.a1, t));
        rows += t;
        if let (Some(a2), Some(diff)) = (&m.a2, &m.diff) {
            worst = worst.max(row_sum_error(a2, t));
            rows += t;
            let last = row(diff, t, t - 1);
            let top = (0..t)
                .max_by(|&a, &b| last[a].total_cmp(&last[b]))
                .unwrap_or(0);
            line += &format!(
                ", A2 entropy {:.3}, λ {:.3}; the last token looks most at {top} ({:?})",
                mean_entropy(a2, t),
                m.lambda[t - 1],
                tok.decode(&ids[top..top + 1])?
            );
        }
        println!("{line}");
    }
    println!("rows checked: {rows}; largest |row sum - 1|: {worst:.2e}");
    Ok(())
}
