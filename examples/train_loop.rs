//! A training loop of your own over the library's optimizer step: your batches, your
//! learning-rate schedule, your logging. (`difftx::train::fit` is the whole loop with
//! checkpoints, validation and resume, as `difftx train` runs it.)
//!
//! ```text
//! cargo run --release --example train_loop -- [TEXT_FILE] [STEPS]
//! ```
//!
//! Without a text file it trains a tiny diff_v1 model on a built-in paragraph.

use difftx::prelude::*;
use rand::{Rng, SeedableRng};
use std::process::ExitCode;

const TEXT: &str = "The quick brown fox jumps over the lazy dog. A differential transformer \
subtracts two softmax attention maps to cancel the noise they share. ";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Warm-up for the first tenth of the steps, then a cosine down to a tenth of `peak`.
fn lr_at(step: usize, steps: usize, peak: f32) -> f32 {
    let warmup = (steps / 10).max(1);
    if step < warmup {
        return peak * (step + 1) as f32 / warmup as f32;
    }
    let p = (step - warmup) as f32 / (steps - warmup).max(1) as f32;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f32::consts::PI * p).cos()))
}

fn run() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let text = match args.next() {
        Some(path) => std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?,
        None => TEXT.repeat(40),
    };
    let steps: usize = args.next().map_or(Ok(60), |s| s.parse())?;

    let (b, t) = (4, 64);
    let ids = Tokenizer::Bytes.encode(&text)?;
    if ids.len() < t + 2 {
        return Err(format!(
            "the text has {} bytes; at least {} are needed",
            ids.len(),
            t + 2
        )
        .into());
    }
    let mut config = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
    config.max_position_embeddings = t;
    let mut model = Model::init(config, 0)?;
    let hp = AdamWParams {
        lr: 0.0,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = Optimizer::new(&model, hp, 1.0);
    let mut ws = Workspace::new(&model, b, t);
    let (mut x, mut y) = (vec![0u32; b * t], vec![0u32; b * t]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);

    let before = evaluate_loss(&model, &ids, b, |_, _| {})?.loss;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        // a batch of random windows; each target is the next byte
        for row in 0..b {
            let start = rng.random_range(0..ids.len() - t - 1);
            x[row * t..][..t].copy_from_slice(&ids[start..start + t]);
            y[row * t..][..t].copy_from_slice(&ids[start + 1..start + t + 1]);
        }
        let lr = lr_at(step, steps, 3e-3);
        let s = opt.step(&mut model, &mut ws, &x, &y, b, t, lr)?;
        if step % 10 == 0 || step + 1 == steps {
            println!(
                "step {:>4}  loss {:.4}  grad norm {:.3}  lr {lr:.2e}",
                step + 1,
                s.loss,
                s.grad_norm
            );
        }
        losses.push(s.loss);
    }
    let after = evaluate_loss(&model, &ids, b, |_, _| {})?.loss;
    println!("train loss: {:.4} -> {:.4}", losses[0], losses[steps - 1]);
    println!("loss over the whole text: {before:.4} -> {after:.4}");
    Ok(())
}
