//! `metrics.jsonl`: one JSON object per optimizer step.
//!
//! ```text
//! {"step":120,"loss":2.4311,"lr":0.00098,"grad_norm":0.812,"tokens_per_s":10450.2,
//!  "lambda":[0.21,0.35],"val_loss":2.5012}
//! ```
//! `val_loss` appears on validation steps only; `lambda` is one value per layer: diff_v1's
//! λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init, diff_v2's mean σ(lambda_proj x) over the step's
//! last micro-batch; absent for `standard`. Lines are written without allocating.

use crate::error::{Error, Result};
use crate::report::plot::{plot_runs, LossAxes, Series};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

pub const METRICS_FILE: &str = "metrics.jsonl";
/// The run folder's loss plot, drawn from its metrics by whoever ran the training.
pub const PLOT_FILE: &str = "loss.png";

/// One finished step, as the observer sees it and as `metrics.jsonl` records it.
pub struct StepReport<'a> {
    /// Updates done, this one included.
    pub step: u64,
    /// Updates in the whole run.
    pub steps: u64,
    /// Mean training loss of the step, in nats per token.
    pub loss: f32,
    /// The learning rate the step used.
    pub lr: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Training tokens per second over the step.
    pub tokens_per_s: f64,
    /// Each layer's λ (diff_v1) or mean σ(lambda_proj x) (diff_v2); empty for standard.
    pub lambda: &'a [f32],
    /// The validation loss, on the steps that ran a validation.
    pub val_loss: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens_per_s: f64,
    #[serde(default)]
    pub lambda: Vec<f32>,
    #[serde(default)]
    pub val_loss: Option<f64>,
}

pub struct MetricsLog {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

impl MetricsLog {
    /// Opens `path` for appending after keeping only the records of steps ≤ `keep_upto`
    /// (the lines a killed run wrote after its last checkpoint are dropped, and so is a
    /// partly written last line). `keep_upto == 0` starts an empty log.
    pub fn open(path: &Path, keep_upto: u64) -> Result<Self> {
        // kept lines are copied verbatim, so a resumed log is byte-identical to an unbroken one
        let mut text = String::new();
        if keep_upto > 0 {
            for (r, line) in read_metrics_lenient(path)? {
                if r.step > keep_upto {
                    break;
                }
                text.push_str(&line);
                text.push('\n');
            }
        }
        crate::util::write_atomic(path, text.as_bytes())?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(MetricsLog {
            file: std::io::BufWriter::with_capacity(1 << 16, f),
            path: path.to_path_buf(),
        })
    }

    /// Appends one record and flushes it to the file.
    pub fn write(&mut self, r: &StepReport) -> Result<()> {
        let StepReport {
            step,
            loss,
            lr,
            grad_norm,
            tokens_per_s,
            lambda,
            val_loss,
            ..
        } = *r;
        let f = &mut self.file;
        let res = (|| {
            write!(
                f,
                "{{\"step\":{step},\"loss\":{loss:?},\"lr\":{lr:?},\"grad_norm\":{grad_norm:?},\"tokens_per_s\":{tokens_per_s:.1}"
            )?;
            if !lambda.is_empty() {
                f.write_all(b",\"lambda\":[")?;
                for (i, l) in lambda.iter().enumerate() {
                    if i > 0 {
                        f.write_all(b",")?;
                    }
                    write!(f, "{l:?}")?;
                }
                f.write_all(b"]")?;
            }
            if let Some(v) = val_loss {
                write!(f, ",\"val_loss\":{v:?}")?;
            }
            f.write_all(b"}\n")?;
            f.flush()
        })();
        res.map_err(|e| Error::io(&self.path, e))
    }
}

/// The records up to the first line that does not parse, each with its text.
fn read_metrics_lenient(path: &Path) -> Result<Vec<(MetricRecord, String)>> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| Error::io(path, e))?;
        match serde_json::from_str(&line) {
            Ok(r) => out.push((r, line)),
            Err(_) => break, // a line cut short by a crash
        }
    }
    Ok(out)
}

/// Reads a run's metrics; a malformed line is an error naming the file and line.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricRecord>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::Data {
                path: path.to_path_buf(),
                msg: format!("line {}: {e}", i + 1),
            })
        })
        .collect()
}

/// A run's loss curves for a plot: the training loss of every step and the validation loss
/// where it was measured.
pub fn loss_series(label: String, records: &[MetricRecord]) -> Series {
    Series {
        label,
        train: records
            .iter()
            .map(|r| (r.step as f64, r.loss as f64))
            .collect(),
        val: records
            .iter()
            .filter_map(|r| r.val_loss.map(|v| (r.step as f64, v)))
            .collect(),
    }
}

/// Draws `RUN/loss.png` from `RUN/metrics.jsonl`, one run's curves under `label`.
pub fn plot_run(run: &Path, label: String, title: &str) -> Result<PathBuf> {
    let records = read_metrics(&run.join(METRICS_FILE))?;
    let path = run.join(PLOT_FILE);
    plot_runs(
        &[loss_series(label, &records)],
        &LossAxes::steps(title),
        &path,
    )?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_exactly_and_reopening_drops_later_steps() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(METRICS_FILE);
        let mut log = MetricsLog::open(&p, 0).unwrap();
        let loss = 1.0f32 / 3.0;
        let rec = |step, loss, lambda, val_loss| StepReport {
            step,
            steps: 3,
            loss,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 100.0,
            lambda,
            val_loss,
        };
        log.write(&rec(1, loss, &[0.2, 0.1 + 0.2], None)).unwrap();
        log.write(&rec(2, 2.5, &[], Some(2.0 / 3.0))).unwrap();
        log.write(&rec(3, 2.0, &[], None)).unwrap();
        drop(log);
        let mut text = std::fs::read_to_string(&p).unwrap();
        text.push_str("{\"step\":4,\"lo"); // a line cut by a crash
        std::fs::write(&p, text).unwrap();
        let r: Vec<MetricRecord> = read_metrics_lenient(&p)
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].loss.to_bits(), loss.to_bits());
        assert_eq!(r[0].lambda[1].to_bits(), (0.1f32 + 0.2).to_bits());
        assert_eq!(r[1].val_loss, Some(2.0 / 3.0));
        let first_two: String = text_lines(&p, 2);
        drop(MetricsLog::open(&p, 2).unwrap());
        let r = read_metrics(&p).unwrap();
        assert_eq!(r.iter().map(|r| r.step).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), first_two);
    }

    fn text_lines(p: &Path, n: usize) -> String {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .take(n)
            .map(|l| format!("{l}\n"))
            .collect()
    }
}
