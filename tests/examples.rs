//! Runs each example in `examples/` (which `cargo test` builds) on the tiny model it makes
//! when given no arguments, and checks what it prints; a missing model or text fails in one
//! line.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs example `name` with `args`, with the thread count the other tests use.
fn run(name: &str, args: &[&str]) -> Output {
    // this test is target/<profile>/deps/examples-<hash>; the examples are in ../examples
    let exe = std::env::current_exe().unwrap();
    let path: PathBuf = exe.parent().unwrap().join("../examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo test` (which builds the examples) or `cargo build --examples`",
        path.display()
    );
    Command::new(&path)
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .unwrap()
}

/// Stdout of a run that must succeed.
fn ok(name: &str) -> String {
    let out = run(name, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The value after `key` on the line that starts with it.
fn after<'a>(stdout: &'a str, key: &str) -> &'a str {
    let line = stdout.lines().find(|l| l.starts_with(key));
    line.unwrap_or_else(|| panic!("no line `{key}` in:\n{stdout}"))[key.len()..].trim()
}

/// "A -> B" as two numbers.
fn arrow(s: &str) -> (f64, f64) {
    let (a, b) = s.split_once(" -> ").unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

#[test]
fn generate_prints_the_tokens_it_sampled() {
    let out = ok("generate");
    assert_eq!(after(&out, "new tokens:"), "32", "{out}");
    assert_eq!(after(&out, "prompt:"), "\"Once upon a time\"");
    // an untrained model's bytes, quoted as Rust's Debug quotes them
    let text = after(&out, "continuation:");
    assert!(
        text.len() > 2 && text.starts_with('"') && text.ends_with('"'),
        "{out}"
    );
    let speed: f64 = after(&out, "decode:")
        .trim_end_matches(" tokens/s")
        .parse()
        .unwrap();
    assert!(speed > 0.0, "{out}");
}

#[test]
fn train_loop_lowers_the_loss() {
    let out = ok("train_loop");
    let (first, last) = arrow(after(&out, "train loss:"));
    assert!(last < first - 1.0, "train loss {first} -> {last}:\n{out}");
    let (before, after_) = arrow(after(&out, "loss over the whole text:"));
    assert!(after_ < before - 1.0, "text loss {before} -> {after_}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("step ")).count(),
        7,
        "{out}"
    );
}

#[test]
fn attention_maps_rows_of_a1_and_a2_sum_to_one() {
    let out = ok("attention_maps");
    // the tiny preset: 2 layers × 2 heads, each with A1 and A2 over the prompt's 22 bytes
    assert_eq!(
        out.lines().filter(|l| l.contains("A2 entropy")).count(),
        4,
        "{out}"
    );
    let (rows, err) = after(&out, "rows checked:")
        .split_once("; largest |row sum - 1|: ")
        .unwrap();
    assert_eq!(rows.parse::<usize>().unwrap(), 4 * 2 * 22);
    assert!(err.parse::<f64>().unwrap() < 1e-9, "{out}");
}

#[cfg(feature = "serve")]
#[test]
fn embed_server_answers_a_completion_in_json() {
    let out = ok("embed_server");
    assert_eq!(after(&out, "POST /v1/completions:"), "200", "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON answer");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["object"], "text_completion", "{v}");
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
    assert!(out.ends_with("server stopped\n"), "{out}");
}

#[test]
fn a_missing_model_or_text_is_one_line_of_error() {
    let mut cases = vec![
        ("generate", "no/such/model"),
        ("attention_maps", "no/such/model"),
        ("train_loop", "no/such.txt"),
    ];
    if cfg!(feature = "serve") {
        cases.push(("embed_server", "no/such/model"));
    }
    for (name, arg) in cases {
        let out = run(name, &[arg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains("no/such"),
            "{name}: {stderr}"
        );
    }
}
