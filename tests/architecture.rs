//! The crate's layering, read from the source: every top-level module sits on a layer, and a
//! module may name only modules on its own layer or below, with no cycle among them (in the
//! spirit of ArchUnit). A new `use crate::…` that points up, or closes a loop, fails here with
//! the file and the edge. Inside a folder too, no files import each other in a loop: what
//! several files share sits in a file below them (`kernels/attention_parts.rs`).
//!
//! ```text
//! cli (the binary) → prelude → experiments | serve → data | train | infer | interop → model → kernels
//!                  → config → report → util | error
//! ```
//! docs/ARCHITECTURE.md draws the same picture.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom layer up; modules on one line share a layer.
const LAYERS: &[&[&str]] = &[
    &["error", "util", "testutil"],
    &["report"],
    &["config"],
    &["kernels"],
    &["model"],
    &["data", "train", "infer", "interop"],
    &["experiments", "serve"],
    &["prelude"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`src/model/block.rs` → `model`; the binary's
/// `main.rs` and `cli/` → `cli`); `None` for the crate root `lib.rs`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs");
    match name {
        "lib" => None,
        "main" => Some("cli".into()),
        n => Some(n.to_string()),
    }
}

/// The top-level modules a file names: `crate::x`, `crate::{x, y::…}`, and in the binary
/// `difftx::x`. Comments are skipped.
fn named_modules(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            rest = &rest[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let head = item.trim().split("::").next().unwrap_or("").trim();
                    if !head.is_empty() {
                        out.insert(head.to_string());
                    }
                }
            } else {
                let head: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !head.is_empty() {
                    out.insert(head);
                }
            }
        }
    }
    out
}

/// Edges between top-level modules, each with one file that makes it.
fn module_graph() -> BTreeMap<(String, String), PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges = BTreeMap::new();
    for f in files {
        let Some(from) = module_of(&src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let prefix = if from == "cli" { "difftx::" } else { "crate::" };
        for to in named_modules(&text, prefix) {
            // re-exports at the crate root (`crate::Result`, `difftx::Model`) are not modules
            if to != from && to.chars().next().is_some_and(|c| c.is_lowercase()) {
                edges.entry((from.clone(), to)).or_insert(f.clone());
            }
        }
    }
    edges
}

#[test]
fn every_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let missing: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(&src, f))
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "top-level modules without a layer in tests/architecture.rs: {missing:?}"
    );
}

#[test]
fn dependencies_point_down_the_layers() {
    let mut wrong = Vec::new();
    for ((from, to), file) in module_graph() {
        let (Some(a), Some(b)) = (layer_of(&from), layer_of(&to)) else {
            continue; // a name that is not a module of ours (a function at the root)
        };
        if b > a {
            wrong.push(format!("{from} -> {to} ({})", file.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up the layers:\n{}",
        wrong.join("\n")
    );
}

/// A cycle of the graph `next` (each node's successors), as the path that closes it, or `None`.
fn find_cycle(next: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // depth-first search; a node met again while on the path closes a cycle
    fn visit(
        n: &str,
        next: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if !done.insert(n.to_string()) {
            return None;
        }
        path.push(n.to_string());
        for m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    next.keys()
        .find_map(|n| visit(n, next, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_form_no_cycle() {
    let mut next: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in module_graph().into_keys() {
        if layer_of(&to).is_some() {
            next.entry(from).or_default().insert(to);
        }
    }
    if let Some(c) = find_cycle(&next) {
        panic!("a cycle among top-level modules: {}", c.join(" -> "));
    }
}

/// Edges between the files of one folder (`kernels/attention.rs` names
/// `super::attention_decode`), each file by its path under `src/` without `.rs`, a subfolder by
/// its path (its `mod.rs` is its face, and declares its files rather than importing them). Read
/// from `super::x` and `crate::folder::x` in the code above a file's tests: inside an inline
/// module `super::` means the file itself, so a name there counts only where it is a file of
/// the folder (`super::super::x` is not read). The kernels are a crate of their own
/// (crates/kernels), read as the folder `kernels`: there `crate::x` names a sibling, and
/// `lib.rs` is the face.
fn sibling_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut next: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (src, label) in [
        (root.join("src"), None),
        (root.join("crates/kernels/src"), Some("kernels")),
    ] {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let (dir, stem) = (
                f.parent().unwrap(),
                f.file_stem().unwrap().to_string_lossy(),
            );
            if (dir == src && label.is_none()) || stem == "mod" || stem == "lib" {
                continue; // the crate's top level is module_graph's; a face declares its files
            }
            // the folder's path from its crate's root: `kernels/gemm` for crates/kernels/src/gemm
            let rel = Path::new(label.unwrap_or("")).join(dir.strip_prefix(&src).unwrap());
            let within = dir
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('/', "::");
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text
                .split("#[cfg(test)]")
                .next()
                .unwrap()
                .replace("super::super::", "");
            let mut names = named_modules(&code, "super::");
            let prefix = match (label, within.is_empty()) {
                (Some(_), true) => "crate::".to_string(),
                _ => format!("crate::{within}::"),
            };
            names.extend(named_modules(&code, &prefix));
            let node = |name: &str| rel.join(name).display().to_string();
            for n in names {
                let sibling = dir.join(format!("{n}.rs")).is_file() || dir.join(&n).is_dir();
                if sibling && n != stem {
                    next.entry(node(&stem)).or_default().insert(node(&n));
                }
            }
        }
    }
    next
}

#[test]
fn the_files_of_a_folder_form_no_cycle() {
    if let Some(c) = find_cycle(&sibling_graph()) {
        panic!(
            "files that import each other in a loop (one of them should hold, or a file below \
             them should, what the others take): {}",
            c.join(" -> ")
        );
    }
}

#[test]
fn the_library_names_clap_only_behind_the_cli_feature() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for f in files {
        if module_of(&src, &f).as_deref() == Some("cli") {
            continue;
        }
        for (i, line) in std::fs::read_to_string(&f).unwrap().lines().enumerate() {
            if line.contains("clap::") || line.contains("#[arg(") || line.contains("#[command(") {
                assert!(
                    line.contains("cfg_attr(feature = \"cli\""),
                    "{}:{}: the library names clap outside the `cli` feature",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // the parser sees plain, grouped and nested paths, and ignores comments
    let found = named_modules(
        "use crate::{model::Model, util};\nlet x = crate::kernels::rope(); // crate::train\n",
        "crate::",
    );
    let want: BTreeSet<String> = ["model", "util", "kernels"].map(String::from).into();
    assert_eq!(found, want);
    assert!(layer_of("kernels") < layer_of("model"));
    assert_eq!(layer_of("train"), layer_of("data"));
    // the cycle finder finds a loop of three and passes a chain
    let graph = |edges: &[(&str, &str)]| {
        let mut next: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            next.entry(a.to_string()).or_default().insert(b.to_string());
        }
        next
    };
    let looped = find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
    assert_eq!(looped.unwrap().join(" -> "), "a -> b -> c -> a");
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
        None
    );
    // the sibling graph sees this tree's folders: the kernels read their shared parts
    let siblings = sibling_graph();
    assert!(siblings["kernels/attention"].contains("kernels/attention_parts"));
    assert!(siblings["kernels/attention"].contains("kernels/attention_decode"));
}
