//! `difftx needle` (a given model's multi-needle retrieval) and `difftx train --needles N`
//! (training on needle episodes over the training text), end to end through the binary.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// About 24 KB of varied English-like text (a filler and training data).
fn text(dir: &Path) -> PathBuf {
    let words = [
        "the", "river", "ran", "past", "old", "mills", "while", "seven", "boats", "waited", "for",
        "morning", "light", "and", "a", "quiet", "wind", "turned", "pages", "of", "books",
    ];
    let mut t = String::new();
    let mut x = 7u64;
    while t.len() < 24_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        t.push_str(words[(x >> 33) as usize % words.len()]);
        if (x >> 20).is_multiple_of(11) {
            t.push('.');
        }
        t.push(' ');
    }
    let p = dir.join("text.txt");
    std::fs::write(&p, t).unwrap();
    p
}

/// `difftx train` of a tiny standard model at context 160 on needle episodes over `data`.
fn needle_run<'a>(data: &'a str, out: &'a str, steps: &'a str) -> Vec<&'a str> {
    vec![
        "--threads",
        "2",
        "train",
        "--data",
        data,
        "--out",
        out,
        "--preset",
        "tiny",
        "--attention",
        "standard",
        "--context",
        "160",
        "--batch",
        "2",
        "--steps",
        steps,
        "--eval-every",
        "2",
        "--val-batches",
        "1",
        "--needles",
        "2",
    ]
}

/// A 300-token BPE tokenizer trained on `data`, in `dir` (a model that is not byte-level).
fn bpe_tokenizer(dir: &Path, data: &Path) -> PathBuf {
    let tok = dir.join("tok.json");
    let args = [
        "tokenizer",
        "train",
        "--data",
        s(data),
        "--vocab-size",
        "300",
    ];
    ok(&difftx(&[&args[..], &["--out", s(&tok)]].concat()));
    tok
}

#[test]
fn needle_scores_a_trained_model_per_length_and_depth() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text(tmp.path());
    let run = tmp.path().join("run");
    ok(&difftx(&needle_run(s(&data), s(&run), "3")));
    // JSON: the cells asked for, each with the episodes asked for, accuracies in [0, 1]
    let out = difftx(&[
        "needle",
        "--model",
        s(&run),
        "--filler",
        s(&data),
        "--lengths",
        "150,160",
        "--depths",
        "0,0.5,1",
        "--episodes",
        "3",
        "--json",
    ]);
    ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 6);
    let mut correct = 0;
    for (i, c) in cells.iter().enumerate() {
        assert_eq!(c["len"], [150, 160][i / 3]);
        assert_eq!(c["depth"], [0.0, 0.5, 1.0][i % 3]);
        assert_eq!(c["total"], 3);
        assert_eq!(c["all_total"], 6, "2 queries per episode");
        let a = c["accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&a), "{c}");
        assert_eq!(a, c["correct"].as_f64().unwrap() / 3.0);
        correct += c["correct"].as_u64().unwrap();
    }
    assert_eq!(v["accuracy"].as_f64().unwrap(), correct as f64 / 18.0);
    assert_eq!(
        (v["needles"].as_u64(), v["queries"].as_u64()),
        (Some(2), Some(2))
    );
    // the table: a header of lengths, a row per depth, the overall line; synthetic filler and
    // the default lengths (3/4 of the context is too short for 2 needles here: only 160)
    let out = difftx(&["needle", "--model", s(&run), "--episodes", "2"]);
    ok(&out);
    let table = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].contains("filler synthetic, 2 episodes per cell"),
        "{table}"
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["depth", "\\", "length", "160"]
    );
    assert_eq!(lines.len(), 2 + 5 + 1, "{table}");
    assert!(lines[2].trim_start().starts_with("0% "), "{table}");
    assert!(
        lines[7].starts_with("retrieval ") && lines[7].contains("of 10 episodes"),
        "{table}"
    );
    // the same seed gives the same episodes, hence the same answer
    let again = difftx(&["needle", "--model", s(&run), "--episodes", "2"]);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), table);
}

#[test]
fn needle_refuses_bad_input_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    ok(&difftx(&[
        "init",
        "--preset",
        "tiny",
        "--attention",
        "diff_v2",
        "--out",
        s(&m),
    ]));
    // the tiny preset's context (128) is too short for 2 needles of 2 digits
    fails_with(
        &difftx(&["needle", "--model", s(&m)]),
        &[
            "2 needles of 2 digits needs up to 146 tokens",
            "context is 128",
        ],
    );
    std::fs::remove_file(m.join("manifest.json")).unwrap();
    let config = m.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = 512.into();
    std::fs::write(&config, c.to_string()).unwrap();
    let missing = tmp.path().join("nothing");
    fails_with(&difftx(&["needle", "--model", s(&missing)]), &[s(&missing)]);
    // a length below the task's minimum
    fails_with(
        &difftx(&["needle", "--model", s(&m), "--lengths", "100"]),
        &[
            "--lengths: 100",
            "2 needles of 2 digits (at least 146 tokens)",
        ],
    );
    fails_with(
        &difftx(&["needle", "--model", s(&m), "--needles", "30"]),
        &["needles (30)", "between 1 and 24"],
    );
    fails_with(
        &difftx(&["needle", "--model", s(&m), "--depths", "1.5"]),
        &["--depths: 1.5"],
    );
    let short = tmp.path().join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    fails_with(
        &difftx(&[
            "needle",
            "--model",
            s(&m),
            "--filler",
            s(&short),
            "--lengths",
            "200",
        ]),
        &["--filler", "short.txt", "9 bytes"],
    );
}

/// A model with a BPE tokenizer gets episodes of its own tokens, and lengths past its context
/// run with a warning (the rotary table extended).
#[test]
fn needle_takes_a_bpe_model_and_lengths_past_its_context() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text(tmp.path());
    let m = tmp.path().join("m");
    let init = [
        "init",
        "--preset",
        "tiny",
        "--attention",
        "diff_v1",
        "--vocab-size",
        "300",
        "--context",
        "256",
    ];
    ok(&difftx(&[&init[..], &["--out", s(&m)]].concat()));
    std::fs::copy(bpe_tokenizer(tmp.path(), &data), m.join("tokenizer.json")).unwrap();
    let out = difftx(&[
        "needle",
        "--model",
        s(&m),
        "--filler",
        s(&data),
        "--needles",
        "6",
        "--queries",
        "2",
        "--lengths",
        "300,512",
        "--depths",
        "0,1",
        "--episodes",
        "2",
        "--json",
    ]);
    let err = ok(&out);
    assert!(
        err.contains("warning: --lengths up to 512 are past the context") && err.contains("(256)"),
        "{err}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    assert!(cells.iter().all(|c| c["total"] == 2 && c["all_total"] == 4));
    // too short a window for 6 needles under this tokenizer: one line
    fails_with(
        &difftx(&[
            "needle",
            "--model",
            s(&m),
            "--needles",
            "6",
            "--lengths",
            "40",
        ]),
        &["window of 40 tokens cannot hold 6 needles"],
    );
}

#[test]
fn training_on_needles_resumes_exactly_and_refuses_bad_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text(tmp.path());
    // 6 steps straight, against 3 steps, then a resume to 6
    let straight = tmp.path().join("straight");
    ok(&difftx(&needle_run(s(&data), s(&straight), "6")));
    let resumed = tmp.path().join("resumed");
    let mut args = needle_run(s(&data), s(&resumed), "6");
    args.extend(["--ckpt-every", "3"]);
    ok(&difftx(&args));
    std::fs::remove_dir_all(resumed.join("checkpoints/step-00000006")).unwrap();
    let again = ok(&difftx(&[
        "--threads",
        "2",
        "train",
        "--out",
        s(&resumed),
        "--resume",
    ]));
    assert!(again.contains("(resumed at 3)"), "{again}");
    let (a, b) = (loss_log(&straight), loss_log(&resumed));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b[..6].to_vec());
    let w =
        |d: &Path| std::fs::read(d.join("checkpoints/step-00000006/model.safetensors")).unwrap();
    assert!(
        w(&straight) == w(&resumed),
        "weights differ after the resume"
    );
    // the run records the task, and a resume may not change it
    let run_json = std::fs::read_to_string(straight.join("run.json")).unwrap();
    assert!(
        run_json.contains("\"needles\": 2") && run_json.contains("\"everything\""),
        "{run_json}"
    );
    fails_with(
        &difftx(&[
            "train",
            "--out",
            s(&resumed),
            "--resume",
            "--needle-loss",
            "answers",
        ]),
        &[
            "--resume: needle_loss is \"answers\"",
            "used \"everything\"",
        ],
    );
    // episodes differ from plain windows: the same run without --needles trains otherwise
    let plain = tmp.path().join("plain");
    let mut args = needle_run(s(&data), s(&plain), "6");
    args.truncate(args.len() - 2);
    assert_eq!(args.last(), Some(&"1"), "--needles 2 was last");
    ok(&difftx(&args));
    assert_ne!(loss_log(&plain)[0]["loss"], a[0]["loss"]);
    // bad settings: one line each, nothing written
    let bad = tmp.path().join("bad");
    let run = |extra: &[&str]| {
        let mut v = needle_run(s(&data), s(&bad), "2");
        // a flag given again replaces the run's own
        if let Some(at) = v.iter().position(|a| Some(a) == extra.first()) {
            v.drain(at..at + 2);
        }
        v.extend(extra);
        difftx(&v)
    };
    fails_with(
        &run(&["--needle-loss", "digits"]),
        &["--needle-loss", "`digits`", "answers"],
    );
    fails_with(
        &run(&["--context", "100"]),
        &["--needles 2", "at least 146 tokens", "context is 100"],
    );
    fails_with(&run(&["--needles", "25"]), &["--needles", "needles (25)"]);
    fails_with(&run(&["--needle-digits", "12"]), &["digits (12)"]);
    let tok = bpe_tokenizer(tmp.path(), &data);
    fails_with(
        &run(&["--tokenizer", s(&tok)]),
        &["--needles needs the byte-level", "tok.json"],
    );
    let plain_flags = difftx(&[
        "train",
        "--data",
        s(&data),
        "--out",
        s(&bad),
        "--needle-loss",
        "answers",
    ]);
    fails_with(&plain_flags, &["need --needles"]);
    assert!(!bad.exists(), "a refused run wrote {}", bad.display());
}
