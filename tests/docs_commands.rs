//! The docs cannot drift from the command line: every `difftx …` command in README.md and in
//! the guides (docs/*.md), and every example in a command's `--help`, is parsed by the CLI's
//! own parser (`src/cli/args.rs`, included here as the binary includes it).
//!
//! The rule: in a fenced block marked ```sh, each line (with `\` continuations joined) is cut
//! at `#` comments and at `;`, `&&`, `||` and `|`; every piece that starts with `difftx ` or
//! `cargo run --release -- ` is a command (a trailing `&` and redirections dropped; a command
//! that holds a shell variable, `$…`, is skipped). In README.md, every inline code span that starts
//! with `difftx ` is one too (its table of common jobs). Placeholders such as `[--json]` are
//! not allowed there: write the command as it would be typed.
#![cfg(feature = "cli")]

#[allow(dead_code, unused_imports)]
#[path = "../src/cli/mod.rs"]
mod cli;

use std::path::{Path, PathBuf};

/// The markdown files whose commands are checked: README.md and every guide in docs/ but the
/// notebook of measurements, which records commands as they were run at the time.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter(|p| !p.ends_with("benchmarks-log.md"))
        .collect();
    guides.sort();
    files.extend(guides);
    files
}

/// Words of a shell line, quotes removed, `#` comments dropped; `None` for what this simple
/// reading does not take apart (an unclosed quote).
fn words(line: &str) -> Option<Vec<String>> {
    let (mut out, mut cur, mut quote, mut started) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, '#') if !started => break,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut cur));
                    started = false;
                }
            }
            (None, c) => {
                cur.push(c);
                started = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if started {
        out.push(cur);
    }
    Some(out)
}

/// Splits a line's words at the shell's separators into commands; a trailing `&` and
/// redirections (`> FILE`, `2>&1`) are dropped.
fn pieces(words: Vec<String>) -> Vec<Vec<String>> {
    let (mut out, mut skip) = (vec![Vec::new()], false);
    for w in words {
        if std::mem::take(&mut skip) {
            continue;
        }
        match w.as_str() {
            ";" | "&&" | "||" | "|" | "&" => out.push(Vec::new()),
            ">" | ">>" | "2>" | "<" => skip = true,
            _ if w.starts_with('>') || w.starts_with("2>") => {}
            _ => match w.strip_suffix(';') {
                Some(w) => {
                    out.last_mut().unwrap().push(w.to_string());
                    out.push(Vec::new());
                }
                None => out.last_mut().unwrap().push(w),
            },
        }
    }
    out
}

/// Every `difftx` command of a markdown text: (line number, the command's arguments after
/// `difftx`).
fn commands(text: &str) -> Vec<(usize, String, Vec<String>)> {
    let (mut out, mut in_sh, mut pending) = (Vec::new(), false, None::<(usize, String)>);
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(tag) = t.strip_prefix("```") {
            in_sh = !in_sh && matches!(tag.trim(), "sh" | "bash" | "shell" | "console");
            continue;
        }
        if !in_sh {
            continue;
        }
        let (n, joined) = match pending.take() {
            Some((n, before)) => (n, format!("{before} {t}")),
            None => (i + 1, t.to_string()),
        };
        if let Some(head) = joined.strip_suffix('\\') {
            pending = Some((n, head.to_string()));
            continue;
        }
        let Some(ws) = words(&joined) else {
            continue;
        };
        for p in pieces(ws) {
            // a shell variable's value is not known here
            if p.iter().any(|w| w.contains('$')) {
                continue;
            }
            let args = match p.first().map(String::as_str) {
                Some("difftx") => p[1..].to_vec(),
                Some("cargo") if p.len() >= 4 && p[1..4] == ["run", "--release", "--"] => {
                    p[4..].to_vec()
                }
                _ => continue,
            };
            out.push((n, joined.clone(), args));
        }
    }
    out
}

/// Parses one command with the CLI's parser; `Err` is clap's message. `--help` and
/// `--version` are fine.
fn parse(args: &[String]) -> Result<(), String> {
    let argv = std::iter::once("difftx".to_string()).chain(args.iter().cloned());
    match cli::args::command().try_get_matches_from(argv) {
        Ok(_) => Ok(()),
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => Ok(()),
            _ => Err(e.to_string()),
        },
    }
}

/// README.md's inline `` `difftx …` `` spans outside code blocks: (line number, the span).
fn inline_commands(text: &str) -> Vec<(usize, String, Vec<String>)> {
    let (mut out, mut in_block) = (Vec::new(), false);
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        for (k, span) in line.split('`').enumerate() {
            if k % 2 == 1 {
                if let Some(rest) = span.strip_prefix("difftx ") {
                    out.push((i + 1, span.to_string(), words(rest).unwrap_or_default()));
                }
            }
        }
    }
    out
}

#[test]
fn every_documented_command_parses() {
    let (mut failures, mut checked) = (Vec::new(), 0);
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
        let mut found = commands(&text);
        if name == Path::new("README.md") {
            found.extend(inline_commands(&text));
        }
        for (line, shown, args) in found {
            checked += 1;
            if let Err(e) = parse(&args) {
                failures.push(format!("{}:{line}: {shown}\n{e}", name.display()));
            }
        }
    }
    assert!(checked >= 20, "only {checked} commands found in the docs");
    assert!(
        failures.is_empty(),
        "{} documented command(s) that difftx does not parse:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every subcommand's `--help` opens with one line of what it does, then `Example: difftx …`,
/// and the example parses.
#[test]
fn every_help_opens_with_a_line_and_an_example() {
    fn walk(c: &clap::Command, path: &str, failures: &mut Vec<String>) {
        for s in c.get_subcommands() {
            let path = format!("{path} {}", s.get_name());
            if s.get_name() == "help" {
                continue;
            }
            if s.has_subcommands() {
                walk(s, &path, failures);
            }
            let long = s
                .get_long_about()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let mut paras = long.split("\n\n");
            let (first, second) = (paras.next().unwrap_or(""), paras.next().unwrap_or(""));
            let Some(example) = second.strip_prefix("Example: difftx ") else {
                failures.push(format!(
                    "{path}: no `Example: difftx …` after its first line"
                ));
                continue;
            };
            if first.is_empty() || first.contains('\n') {
                failures.push(format!("{path}: its help does not open with one line"));
            }
            let args = words(example).unwrap_or_default();
            if let Err(e) = parse(&args) {
                failures.push(format!("{path}: its example does not parse:\n{e}"));
            }
        }
    }
    let mut failures = Vec::new();
    walk(&cli::args::command(), "difftx", &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_reader_takes_shell_lines_apart() {
    let c = commands(
        "```sh\ndifftx eval --model m/ --data 'a b.txt'   # a comment\n\
         difftx bench matmul; difftx --threads 1 bench matmul | tail -1\n\
         difftx serve --model m & difftx bench serve --pid $! > out.txt\n\
         RUSTFLAGS=x cargo build\ncargo run --release -- demo\ndifftx train \\\n  --steps 2\n```\n\
         difftx outside a block\n",
    );
    let args: Vec<Vec<String>> = c.into_iter().map(|(_, _, a)| a).collect();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        args,
        vec![
            s(&["eval", "--model", "m/", "--data", "a b.txt"]),
            s(&["bench", "matmul"]),
            s(&["--threads", "1", "bench", "matmul"]),
            s(&["serve", "--model", "m"]),
            s(&["demo"]),
            s(&["train", "--steps", "2"]),
        ]
    );
}
