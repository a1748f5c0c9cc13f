//! `difftx demo`: train a tiny diff_v1 model and its matched standard baseline on the built-in
//! text with the real training loop (train/trainer.rs), compare their validation losses and
//! draw both curves into one plot.

use crate::config::AttentionKind;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::kernels::Precision;
use crate::report::plot::{plot_runs, LossAxes, Series};
use crate::train::metrics::loss_series;
use crate::train::metrics::{read_metrics, METRICS_FILE};
use crate::train::trainer::RUN_FILE;
use crate::train::{train, Observer, TrainOptions};
use crate::util::thousands;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The built-in text: the GNU GPL v3 (everyone may copy it verbatim), about 35 KB of English.
pub const DEMO_TEXT: &str = include_str!("../../data/demo.txt");

/// The two kinds the demo compares, in order.
pub const DEMO_KINDS: [AttentionKind; 2] = [AttentionKind::DiffV1, AttentionKind::Standard];

#[derive(Clone, Debug)]
pub struct DemoRun {
    pub attention: AttentionKind,
    pub params: usize,
    pub train_loss: f32,
    pub val_loss: f64,
    pub seconds: f64,
    pub dir: PathBuf,
}

/// Byte tokens of the built-in text, the last 10% held out for validation.
pub fn demo_dataset() -> Dataset {
    Dataset::from_ids(DEMO_TEXT.bytes().map(u32::from).collect(), 0.1)
}

/// The demo's settings for one kind: the tiny preset, 8 windows of 128 bytes per step,
/// peak learning rate 3e-3, validation every 50 steps, a checkpoint at the end only.
pub fn demo_options(kind: AttentionKind, steps: u64, seed: u64) -> TrainOptions {
    TrainOptions {
        preset: Some("tiny".into()),
        attention: Some(kind.as_str().into()),
        steps: Some(steps),
        batch: Some(8),
        lr: Some(3e-3),
        warmup: Some(steps / 20 + 1),
        seed: Some(seed),
        eval_every: Some(50),
        ckpt_every: Some(0),
        keep_last: Some(1),
        ..Default::default()
    }
}

/// Trains both demo models into `out/<kind>` (replacing an earlier demo's runs there), their
/// products at `precision`, and writes `out/loss.png`. `observer(kind)` gives the progress observer of each run.
pub fn run_demo(
    out: &Path,
    steps: u64,
    seed: u64,
    precision: Precision,
    mut observer: impl FnMut(AttentionKind) -> Box<dyn Observer>,
    stop: &AtomicBool,
) -> Result<(Vec<DemoRun>, PathBuf)> {
    if steps == 0 {
        return Err(Error::Invalid("--steps must be at least 1".into()));
    }
    let data = demo_dataset();
    let mut runs = Vec::new();
    for kind in DEMO_KINDS {
        let dir = out.join(kind.as_str());
        if dir.join(RUN_FILE).is_file() {
            // an earlier demo's run: the demo starts over
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        let mut run = demo_options(kind, steps, seed).resolve(256)?;
        run.train.bf16 = precision == Precision::Bf16;
        let mut obs = observer(kind);
        let o = train(&run, &data, &dir, None, false, obs.as_mut(), stop)?;
        if o.interrupted {
            return Err(Error::Invalid(format!(
                "interrupted at step {} of the {kind} run",
                o.step
            )));
        }
        runs.push(DemoRun {
            attention: kind,
            params: o.params,
            train_loss: o.train_loss,
            val_loss: o.val_loss.unwrap_or(f64::NAN),
            seconds: o.seconds,
            dir,
        });
    }
    let metrics: Vec<_> = runs
        .iter()
        .map(|r| read_metrics(&r.dir.join(METRICS_FILE)))
        .collect::<Result<_>>()?;
    let series: Vec<Series> = runs
        .iter()
        .zip(&metrics)
        .map(|(r, m)| {
            loss_series(
                format!("{} ({} params)", r.attention, thousands(r.params)),
                m,
            )
        })
        .collect();
    let plot = out.join("loss.png");
    let axes = LossAxes {
        y_label: "loss (nats per byte)",
        ..LossAxes::steps("difftx demo: tiny preset on the GPL v3 text (bytes)")
    };
    plot_runs(&series, &axes, &plot)?;
    Ok((runs, plot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_trains_both_kinds_and_a_rerun_replaces_its_runs() {
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(false);
        let silent = |_| Box::new(crate::train::Silent) as Box<dyn Observer>;
        let (runs, plot) = run_demo(dir.path(), 30, 0, Precision::F32, silent, &stop).unwrap();
        let kinds: Vec<_> = runs.iter().map(|r| r.attention).collect();
        assert_eq!(kinds, DEMO_KINDS);
        for r in &runs {
            // well below uniform guessing (ln 256 = 5.55) after 30 steps
            assert!(r.val_loss < 4.5, "{:?}: {}", r.attention, r.val_loss);
            assert!(r
                .dir
                .join("checkpoints/step-00000030/model.safetensors")
                .is_file());
        }
        assert!((runs[0].params as f64 / runs[1].params as f64 - 1.0).abs() < 0.01);
        assert!(plot.is_file());
        let (again, _) = run_demo(dir.path(), 3, 0, Precision::F32, silent, &stop).unwrap();
        let ck: Vec<_> = std::fs::read_dir(again[0].dir.join("checkpoints"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(ck, ["step-00000003"]);
    }
}
