//! `fit`: a whole fresh training run from `TrainOptions` in one call — what `difftx train`
//! does, without its progress bar, signal handling or loss plot.

use super::trainer::{prepare_run, train, Observer, Outcome, PreparedRun};
use super::TrainOptions;
use crate::data::prepare_dataset;
use crate::error::Result;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Trains the run `opts` describes in the fresh folder `out` (run.json, metrics.jsonl and
/// checkpoints/, each checkpoint a model directory that [`crate::open_model`] loads), with the
/// data tokenized into `out/token-cache`. The settings resolve as on the command line
/// (preset, then the options given); `observer` hears every step. To resume a run or stop one
/// from another thread, call [`prepare_run`] and [`train`] as this function does.
///
/// ```
/// use difftx::prelude::*;
///
/// struct Losses(Vec<f32>);
/// impl Observer for Losses {
///     fn step(&mut self, r: &StepReport) {
///         self.0.push(r.loss);
///     }
/// }
///
/// let dir = tempfile::tempdir()?;
/// let text = dir.path().join("text.txt");
/// std::fs::write(&text, "the cat sat on the mat. ".repeat(200))?;
/// let opts = TrainOptions {
///     data: vec![text.display().to_string()],
///     preset: Some("tiny".into()),
///     max_position_embeddings: Some(32),
///     steps: Some(4),
///     batch: Some(2),
///     ..Default::default()
/// };
/// let mut losses = Losses(Vec::new());
/// let out = fit(&opts, &dir.path().join("run"), &mut losses)?;
/// assert_eq!(out.step, 4);
/// assert_eq!(losses.0.len(), 4);
/// let (model, _tok) = open_model(&out.checkpoint)?;
/// assert_eq!(model.config.max_position_embeddings, 32);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fit(opts: &TrainOptions, out: &Path, observer: &mut dyn Observer) -> Result<Outcome> {
    let PreparedRun { run, tokenizer, .. } = prepare_run(opts, out, false, None)?;
    let never = AtomicBool::new(false);
    let data = prepare_dataset(&run.data, &tokenizer, &out.join("token-cache"), &never)?;
    for n in &data.notes {
        observer.note(n);
    }
    train(&run, &data, out, tokenizer.file(), false, observer, &never)
}
