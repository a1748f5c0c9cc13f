//! Progress for a person: a bar with ETA on a terminal, a plain line every few steps in a log
//! (nohup, Slurm, CI), and the stop that SIGINT/SIGTERM ask for, with the shell's exit code.

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A bar over `len` units on a terminal; hidden when stderr is not one.
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

/// What SIGINT and SIGTERM ask of a long command: the first sets `flag` (the library then saves
/// and returns), a second one exits at once.
pub struct Stop {
    pub flag: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

/// A command that stopped because a signal asked it to: the process exits with `code`
/// (128 + the signal: 130 after SIGINT, 143 after SIGTERM) and prints nothing more.
#[derive(Debug)]
pub struct Interrupted(pub i32);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted (exit code {})", self.0)
    }
}

impl std::error::Error for Interrupted {}

impl Stop {
    /// Registers the handlers.
    pub fn new() -> Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let flag = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, flag.clone())?;
            signal_hook::flag::register_usize(sig, signal.clone(), sig as usize)?;
            signal_hook::flag::register(sig, flag.clone())?;
        }
        Ok(Stop { flag, signal })
    }

    /// The error that ends the process with the shell's code for the signal that stopped it.
    pub fn interrupted(&self) -> Interrupted {
        match self.signal.load(Ordering::Relaxed) {
            0 => Interrupted(130),
            sig => Interrupted(128 + sig as i32),
        }
    }
}

/// Progress of a training run: a bar on a terminal; off one, a plain line every `every` steps
/// (and at the last), so that a log shows the run moving.
pub struct Progress {
    pb: ProgressBar,
    name: String,
    terminal: bool,
    every: u64,
    last_draw: Instant,
    val: Option<f64>,
    tok_s: f64,
    /// the first step of this process and when it started, for the ETA of plain lines
    start: (u64, Instant),
}

impl Progress {
    /// `every`: steps between plain lines off a terminal (`None`: about twenty lines a run).
    pub fn new(name: &str, every: Option<u64>) -> Self {
        // Hidden until `start` knows the length: a bar drawn before it would show 0/0.
        let pb = ProgressBar::hidden();
        pb.set_style(
            ProgressStyle::with_template("{prefix} [{bar:25}] step {pos}/{len} {msg} ETA {eta}")
                .expect("template")
                .progress_chars("=> "),
        );
        pb.set_prefix(name.to_string());
        Progress {
            pb,
            name: name.to_string(),
            terminal: std::io::stderr().is_terminal(),
            every: every.unwrap_or(0),
            last_draw: Instant::now(),
            val: None,
            tok_s: 0.0,
            start: (0, Instant::now()),
        }
    }

    /// One plain progress line (step, losses, learning rate, tokens/s, ETA).
    fn line(&self, r: &difftx::train::StepReport) -> String {
        let done = r.step - self.start.0;
        let left = r.steps - r.step;
        let eta = self.start.1.elapsed().as_secs_f64() / done.max(1) as f64 * left as f64;
        let val = self.val.map_or(String::new(), |v| format!(" val {v:.4}"));
        format!(
            "{}: step {}/{} loss {:.4}{val} lr {:.2e} {:.0} tok/s ETA {}",
            self.name,
            r.step,
            r.steps,
            r.loss,
            r.lr,
            self.tok_s,
            clock(Duration::from_secs_f64(eta))
        )
    }
}

/// 75 s → "1m15s", 3,700 s → "1h01m".
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

impl difftx::train::Observer for Progress {
    fn note(&mut self, msg: &str) {
        self.pb.suspend(|| eprintln!("{}: {msg}", self.name));
    }
    fn start(&mut self, first: u64, steps: u64) {
        self.start = (first, Instant::now());
        if self.every == 0 {
            self.every = ((steps - first) / 20).max(1);
        }
        self.pb.set_length(steps);
        self.pb.set_position(first);
        self.pb.reset_eta();
        if self.terminal {
            self.pb.set_draw_target(ProgressDrawTarget::stderr());
        }
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
        if !self.terminal {
            if r.step.is_multiple_of(self.every) || r.step == r.steps {
                eprintln!("{}", self.line(r));
            }
            return;
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

#[cfg(test)]
mod tests {
    use super::clock;
    use std::time::Duration;

    #[test]
    fn clock_reads_like_a_person_writes_it() {
        assert_eq!(clock(Duration::from_secs(7)), "7s");
        assert_eq!(clock(Duration::from_secs(75)), "1m15s");
        assert_eq!(clock(Duration::from_secs(3700)), "1h01m");
    }
}
