//! `difftx demo`: the quick demo, a tiny diff_v1 and its matched standard baseline.

use super::progress::{Progress, Stop};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct DemoArgs {
    /// Training steps per model (8 windows of 128 bytes each).
    #[arg(long, default_value_t = 600)]
    pub steps: u64,
    /// Seed of the initial weights and of the window sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder for the two runs (OUT/diff_v1, OUT/standard; an earlier demo's are replaced)
    /// and the comparison plot OUT/loss.png.
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
}

pub fn run(a: DemoArgs, precision: difftx::kernels::Precision) -> Result<()> {
    let stop = Stop::new()?;
    let data = difftx::experiments::demo::demo_dataset();
    eprintln!(
        "difftx demo: tiny preset, byte-level, {} training / {} validation bytes of the built-in text (GNU GPL v3), {} steps each",
        data.train.len(),
        data.val.len(),
        a.steps
    );
    let demo = difftx::experiments::demo::run_demo(
        &a.out,
        a.steps,
        a.seed,
        precision,
        |kind| Box::new(Progress::new(kind.as_str(), None)),
        &stop.flag,
    );
    if stop.flag.load(std::sync::atomic::Ordering::Relaxed) {
        if let Err(e) = &demo {
            eprintln!("difftx demo: {e}");
        }
        return Err(stop.interrupted().into());
    }
    let (runs, plot) = demo?;
    println!(
        "{:<10} {:>10} {:>12} {:>10} {:>8}",
        "attention", "params", "train loss", "val loss", "seconds"
    );
    for r in &runs {
        println!(
            "{:<10} {:>10} {:>12.3} {:>10.3} {:>8.0}",
            r.attention.as_str(),
            r.params,
            r.train_loss,
            r.val_loss,
            r.seconds
        );
    }
    println!(
        "(losses in nats per byte; uniform guessing is {:.3})",
        256f64.ln()
    );
    println!("loss curves: {}", plot.display());
    Ok(())
}
