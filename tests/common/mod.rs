//! What the tests that run the binary share: running it, and asserting a clean success or a
//! clean one-line failure.
#![allow(dead_code)] // each test file uses its own share of these

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// The difftx binary, ready for arguments.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_difftx"))
}

/// Runs difftx with `args` to completion.
pub fn difftx(args: &[&str]) -> Output {
    bin().args(args).output().expect("run difftx")
}

/// Asserts a success; returns stderr.
pub fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "exit {:?}: {err}", out.status.code());
    err
}

/// Asserts a clean failure: exit 1, nothing on stderr but one `error: ` line containing every
/// `needle`, no panic.
pub fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    fails_at_the_end_with(out, needles);
}

/// Asserts a clean failure after some progress: exit 1, the last stderr line is the one error
/// (`error: `) and contains every `needle`.
pub fn fails_at_the_end_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error")).count(),
        1,
        "{err}"
    );
    for n in needles {
        assert!(last.contains(n), "`{n}` not in: {err}");
    }
}

/// A run's metrics.jsonl without the wall-clock field, one JSON value per line.
pub fn loss_log(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("tokens_per_s");
            v
        })
        .collect()
}
