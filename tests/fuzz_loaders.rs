//! Seeded, structure-aware mutation of valid files, fed to every loader in-process: no input
//! may panic (or abort on an allocation it cannot make). A stable-toolchain stand-in for
//! cargo-fuzz. `DIFFTX_FUZZ_CASES` sets the cases per loader (default 2,000), `DIFFTX_FUZZ_SEED`
//! the seed, `DIFFTX_FUZZ_KEEP=DIR` keeps each input that panicked there,
//! `DIFFTX_FUZZ_LOUD=1` prints the panics as they happen; docs/RELIABILITY.md has the figures
//! of a longer run.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;

const HUGE: u64 = 1 << 60;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// 1. Seeds: a finished 3-step run's checkpoint (without its manifest, so each loader's own
///    checks answer) and its Hugging Face export.
fn seeds(tmp: &Path) -> (PathBuf, PathBuf) {
    let data = tmp.join("a.txt");
    std::fs::write(
        &data,
        "It was the best of times, it was the worst of times. ".repeat(40),
    )
    .unwrap();
    let out = tmp.join("run");
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_difftx"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    run(&[
        "--threads",
        "1",
        "train",
        "--data",
        d,
        "--out",
        o,
        "--attention",
        "diff_v1",
        "--hidden-size",
        "32",
        "--context",
        "16",
        "--batch",
        "2",
        "--steps",
        "3",
    ]);
    let ckpt = out.join("checkpoints/step-00000003");
    let hf = tmp.join("hf");
    run(&[
        "export",
        "--model",
        ckpt.to_str().unwrap(),
        "--out",
        hf.to_str().unwrap(),
    ]);
    std::fs::remove_file(ckpt.join("manifest.json")).unwrap();
    std::fs::remove_file(hf.join("manifest.json")).unwrap();
    (ckpt, hf)
}

/// Byte-level damage: truncation, flipped bytes, a spliced range, a huge number, a stray
/// JSON delimiter.
fn mutate_bytes(rng: &mut ChaCha8Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    let n = b.len().max(1);
    match rng.random_range(0..5) {
        0 => b.truncate(rng.random_range(0..n)),
        1 => {
            for _ in 0..rng.random_range(1..8) {
                let i = rng.random_range(0..n);
                if let Some(x) = b.get_mut(i) {
                    *x ^= rng.random_range(1..=255u8);
                }
            }
        }
        2 => {
            let (a, c) = (rng.random_range(0..n), rng.random_range(0..n));
            let l = rng.random_range(0..=64).min(n - a).min(n - c);
            let piece = b[a..a + l].to_vec();
            b[c..c + l].copy_from_slice(&piece);
        }
        3 => {
            let at = rng.random_range(0..=b.len());
            let num = ["1152921504606846976", "-1", "1e308", "18446744073709551616"];
            let s = num[rng.random_range(0..num.len())];
            b.splice(at..at, s.bytes());
        }
        _ => {
            let i = rng.random_range(0..n);
            if let Some(x) = b.get_mut(i) {
                let stray = b"{}[]\",:0\xff";
                *x = stray[rng.random_range(0..stray.len())];
            }
        }
    }
    b
}

/// Every JSON pointer inside `v`.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
            out.push(p.clone());
            pointers(x, p, out);
        }),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| {
            let p = format!("{at}/{i}");
            out.push(p.clone());
            pointers(x, p, out);
        }),
        _ => {}
    }
}

/// Structure-aware JSON damage: a value swapped for a wrong type or an extreme number, or a
/// key deleted; sometimes twice.
fn mutate_json(rng: &mut ChaCha8Rng, v: &Value) -> Value {
    let mut v = v.clone();
    for _ in 0..rng.random_range(1..=2) {
        let mut ps = Vec::new();
        pointers(&v, String::new(), &mut ps);
        if ps.is_empty() {
            return Value::Null;
        }
        let p = ps[rng.random_range(0..ps.len())].clone();
        let choice = rng.random_range(0..10);
        if choice == 0 {
            let (parent, key) = p.rsplit_once('/').unwrap();
            match v.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    m.remove(&key.replace("~1", "/").replace("~0", "~"));
                }
                Some(Value::Array(a)) if !a.is_empty() => {
                    a.pop();
                }
                _ => {}
            }
            continue;
        }
        let new = match choice {
            1 => Value::Null,
            2 => Value::Bool(true),
            3 => serde_json::json!(-1),
            4 => serde_json::json!(HUGE),
            5 => serde_json::json!(u64::MAX),
            6 => serde_json::json!(1e308),
            7 => serde_json::json!("x"),
            8 => serde_json::json!([HUGE, HUGE]),
            _ => serde_json::json!({}),
        };
        *v.pointer_mut(&p).unwrap() = new;
    }
    v
}

/// JSON text: half the time structure-aware, half byte-level.
fn mutate_json_text(rng: &mut ChaCha8Rng, seed: &[u8]) -> Vec<u8> {
    if rng.random_bool(0.5) {
        let v: Value = serde_json::from_slice(seed).unwrap();
        serde_json::to_vec(&mutate_json(rng, &v)).unwrap()
    } else {
        mutate_bytes(rng, seed)
    }
}

/// A safetensors file: its header length (huge, off by one, zero), its header's JSON (shapes,
/// offsets, dtypes through `mutate_json`, plus targeted edits), or its bytes.
fn mutate_safetensors(rng: &mut ChaCha8Rng, seed: &[u8]) -> Vec<u8> {
    let n = u64::from_le_bytes(seed[..8].try_into().unwrap()) as usize;
    let (header, body) = (&seed[8..8 + n], &seed[8 + n..]);
    let with = |h: &[u8], len: u64| [&len.to_le_bytes()[..], h, body].concat();
    match rng.random_range(0..4) {
        0 => {
            let lens = [
                HUGE,
                u64::MAX,
                n as u64 + 1,
                n as u64 - 1,
                0,
                seed.len() as u64,
            ];
            with(header, lens[rng.random_range(0..lens.len())])
        }
        1 => {
            let h = serde_json::to_vec(&mutate_json(rng, &serde_json::from_slice(header).unwrap()))
                .unwrap();
            with(&h, h.len() as u64)
        }
        2 => {
            let mut v: Value = serde_json::from_slice(header).unwrap();
            let names: Vec<String> = v
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "__metadata__")
                .cloned()
                .collect();
            let t = &mut v[&names[rng.random_range(0..names.len())]];
            match rng.random_range(0..4) {
                0 => t["data_offsets"] = serde_json::json!([0, HUGE]),
                1 => t["shape"] = serde_json::json!([1u64 << 31, 1u64 << 31]),
                2 => t["shape"] = serde_json::json!([]),
                _ => {
                    let d = ["I64", "F64", "BOOL", "U8", "F8_E4M3", "XX"];
                    t["dtype"] = d[rng.random_range(0..d.len())].into();
                }
            }
            let h = serde_json::to_vec(&v).unwrap();
            with(&h, h.len() as u64)
        }
        _ => mutate_bytes(rng, seed),
    }
}

/// 2. Feeds `cases` mutations of `dir/file` to `load`, restoring the file after; returns the
///    panics as (case, message).
fn fuzz(
    dir: &Path,
    file: &str,
    seed: u64,
    cases: u64,
    mutate: fn(&mut ChaCha8Rng, &[u8]) -> Vec<u8>,
    load: &dyn Fn(&Path),
) -> Vec<(u64, String)> {
    let path = dir.join(file);
    let good = std::fs::read(&path).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut crashes = Vec::new();
    for case in 0..cases {
        std::fs::write(&path, mutate(&mut rng, &good)).unwrap();
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| load(dir))) {
            if let Some(keep) = std::env::var_os("DIFFTX_FUZZ_KEEP") {
                let to = Path::new(&keep).join(format!("{file}.case{case}"));
                std::fs::copy(&path, to).unwrap();
            }
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            crashes.push((case, msg));
        }
    }
    std::fs::write(&path, good).unwrap();
    crashes
}

#[test]
fn no_mutated_file_makes_a_loader_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, hf) = seeds(tmp.path());
    let cases = env_or("DIFFTX_FUZZ_CASES", 2000);
    let seed = env_or("DIFFTX_FUZZ_SEED", 26);
    let toml_dir = tmp.path().join("toml");
    std::fs::create_dir(&toml_dir).unwrap();
    std::fs::write(
        toml_dir.join("run.toml"),
        "data = ['a.txt']\nattention = 'standard'\nhidden_size = 64\nmax_position_embeddings = 16\nbatch = 2\nsteps = 9\ngrad_accum = 2\neval_every = 4\nlr = 0.001\n",
    )
    .unwrap();
    let load_model = |d: &Path| {
        let _ = difftx::interop::load(d);
    };
    let load_ckpt = |d: &Path| {
        let _ = difftx::train::checkpoint::load_checkpoint(d);
    };
    let load_tok = |d: &Path| {
        if let Ok(t) = difftx::data::tokenizer::Tokenizer::from_file(&d.join("tokenizer.json")) {
            if let Ok(ids) = t.encode("It was the best of times, ünïcode") {
                let _ = t.decode(&ids);
            }
        }
    };
    let load_toml = |d: &Path| {
        if let Ok(o) = difftx::train::options::TrainOptions::from_toml_file(&d.join("run.toml")) {
            let _ = o.resolve(256);
        }
    };
    type Mutator = fn(&mut ChaCha8Rng, &[u8]) -> Vec<u8>;
    type Target<'a> = (&'a Path, &'a str, Mutator, &'a dyn Fn(&Path));
    let plan: [Target; 8] = [
        (&ckpt, "model.safetensors", mutate_safetensors, &load_ckpt),
        (
            &ckpt,
            "optimizer.safetensors",
            mutate_safetensors,
            &load_ckpt,
        ),
        (&ckpt, "config.json", mutate_json_text, &load_ckpt),
        (&ckpt, "trainer_state.json", mutate_json_text, &load_ckpt),
        (&hf, "model.safetensors", mutate_safetensors, &load_model),
        (&hf, "config.json", mutate_json_text, &load_model),
        (&hf, "tokenizer.json", mutate_json_text, &load_tok),
        (&toml_dir, "run.toml", mutate_bytes, &load_toml),
    ];
    // quiet: a panic is reported below, once, with its case
    let hook = std::panic::take_hook();
    if std::env::var_os("DIFFTX_FUZZ_LOUD").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let mut report = Vec::new();
    for (i, (dir, file, mutate, load)) in plan.into_iter().enumerate() {
        let t = std::time::Instant::now();
        let crashes = fuzz(dir, file, seed + i as u64, cases, mutate, load);
        let name = format!("{}/{file}", dir.file_name().unwrap().to_string_lossy());
        eprintln!(
            "{name}: {cases} cases in {:.2?}, {} panics",
            t.elapsed(),
            crashes.len()
        );
        report.extend(
            crashes
                .into_iter()
                .take(3)
                .map(|(c, m)| format!("{name} case {c}: {m}")),
        );
    }
    std::panic::set_hook(hook);
    assert!(
        report.is_empty(),
        "panics (seed {seed}):\n{}",
        report.join("\n")
    );
}
