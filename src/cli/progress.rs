//! Progress on a terminal (bars with ETA) and the stop flag of SIGINT/SIGTERM.

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

pub fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if std::io::stderr().is_terminal() {
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}")
                .expect("template")
                .progress_chars("=> "),
        );
        pb.set_message(what.to_string());
    } else {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // The first signal asks for a checkpoint and a clean exit; a second one exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.clone())?;
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

/// Progress for a training run: a bar on a terminal, nothing otherwise.
pub struct Progress {
    pb: ProgressBar,
    name: String,
    last_draw: Instant,
    val: Option<f64>,
    tok_s: f64,
}

impl Progress {
    pub fn new(name: &str) -> Self {
        let pb = ProgressBar::new(0);
        if std::io::stderr().is_terminal() {
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:25}] step {pos}/{len} {msg} ETA {eta}",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            pb.set_prefix(name.to_string());
        } else {
            pb.set_draw_target(ProgressDrawTarget::hidden());
        }
        Progress {
            pb,
            name: name.to_string(),
            last_draw: Instant::now(),
            val: None,
            tok_s: 0.0,
        }
    }
}

impl difftx::train::Observer for Progress {
    fn note(&mut self, msg: &str) {
        self.pb.suspend(|| eprintln!("{}: {msg}", self.name));
    }
    fn start(&mut self, first: u64, steps: u64) {
        self.pb.set_length(steps);
        self.pb.set_position(first);
        self.pb.reset_eta();
    }
    fn step(&mut self, r: &difftx::train::StepReport) {
        self.pb.set_position(r.step);
        self.tok_s = if self.tok_s == 0.0 {
            r.tokens_per_s
        } else {
            0.9 * self.tok_s + 0.1 * r.tokens_per_s
        };
        if r.val_loss.is_some() {
            self.val = r.val_loss;
        }
        // Redraw at most 4 times a second, so the loop formats almost nothing.
        if self.last_draw.elapsed().as_millis() >= 250 || r.val_loss.is_some() {
            self.last_draw = Instant::now();
            let val = self.val.map_or(String::new(), |v| format!(" val {v:.3}"));
            self.pb.set_message(format!(
                "loss {:.3}{val} lr {:.1e} {:.0} tok/s",
                r.loss, r.lr, self.tok_s
            ));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.pb.finish_and_clear();
    }
}
