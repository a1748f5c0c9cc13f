//! Seeded, structure-aware mutation of valid files, fed to every loader in-process: no input
//! may panic (or abort on an allocation it cannot make). A stable-toolchain stand-in for
//! cargo-fuzz. `DIFFTX_FUZZ_CASES` sets the cases per loader (default 2,000), `DIFFTX_FUZZ_SEED`
//! the seed, `DIFFTX_FUZZ_ONLY=TEXT` runs only the loaders whose file name (`bodies/chat.json`,
//! `token-cache/….tokens`, `hf/config.json`, …) contains TEXT,
//! `DIFFTX_FUZZ_KEEP=DIR` keeps each input that panicked there,
//! `DIFFTX_FUZZ_LOUD=1` prints the panics as they happen; docs/RELIABILITY.md says how to run
//! longer, docs/benchmarks-log.md ("Fuzzing: runs and the crashes found") the longer runs.

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

/// A token file (`data/tokens.rs`): its id count (huge, off by one, or wrapped so that count ×
/// width overflows to the file's true length), its width, version or vocabulary size, or its
/// bytes.
fn mutate_tokens(rng: &mut ChaCha8Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    let at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (count, width) = (at(&b, 16), u64::from(b[12]));
    match rng.random_range(0..4) {
        0 => {
            let wrap = count.wrapping_add((u64::MAX / width).wrapping_add(1));
            let counts = [HUGE, u64::MAX, count + 1, count - 1, 0, wrap];
            let c: u64 = counts[rng.random_range(0..counts.len())];
            b[16..24].copy_from_slice(&c.to_le_bytes());
        }
        1 => {
            let w = [0u32, 1, 3, 8, u32::MAX, 2, 4][rng.random_range(0..7)];
            b[12..16].copy_from_slice(&w.to_le_bytes());
        }
        2 => {
            let v = [0u64, 1, 255, HUGE, u64::MAX][rng.random_range(0..5)];
            b[24..32].copy_from_slice(&v.to_le_bytes());
        }
        _ => return mutate_bytes(rng, seed),
    }
    b
}

/// Every `*.tokens` file under `dir` (the token cache of the seed run).
fn token_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            token_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "tokens") {
            out.push(p);
        }
    }
}

/// Request bodies of each endpoint `serve` parses, one file each, and the chat templates their
/// messages are rendered with (the plain one and a Jinja one).
fn request_bodies(tmp: &Path) -> (PathBuf, Vec<difftx::serve::chat::ChatTemplate>) {
    let dir = tmp.join("bodies");
    std::fs::create_dir(&dir).unwrap();
    let messages = serde_json::json!([
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hello, ünïcode"},
        {"role": "assistant", "content": "Hi."},
    ]);
    let bodies = [
        (
            "completions.json",
            serde_json::json!({
            "model": "m", "prompt": ["It was", "the best"], "max_tokens": 5, "temperature": 0.7,
            "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["\n", "."], "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": 2, "echo": true, "n": 1}),
        ),
        (
            "completions_ids.json",
            serde_json::json!({
            "model": "m", "prompt": [[72, 105], [33]], "max_tokens": 3}),
        ),
        (
            "chat.json",
            serde_json::json!({
            "model": "m", "messages": messages, "max_completion_tokens": 8, "logprobs": true,
            "top_logprobs": 3, "temperature": 0}),
        ),
        (
            "tokenize.json",
            serde_json::json!({"model": "m", "messages": messages}),
        ),
        (
            "detokenize.json",
            serde_json::json!({"model": "m", "tokens": [72, 105, 33]}),
        ),
    ];
    for (name, body) in bodies {
        std::fs::write(dir.join(name), serde_json::to_vec(&body).unwrap()).unwrap();
    }
    let jinja = tmp.join("jinja");
    std::fs::create_dir(&jinja).unwrap();
    std::fs::write(
        jinja.join("tokenizer_config.json"),
        serde_json::to_vec(&serde_json::json!({
            "bos_token": "<s>", "eos_token": {"content": "</s>"},
            "chat_template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('system first') }}{% endif %}<|{{ m.role }}|>{{ m.content | trim }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
        }))
        .unwrap(),
    )
    .unwrap();
    let chat = difftx::serve::chat::ChatTemplate::for_model;
    (dir, vec![chat(tmp).unwrap(), chat(&jinja).unwrap()])
}

/// What `serve` does with a body before the model sees it: parse, check the model name, read
/// every endpoint's fields, render chat messages, encode, check the ids, decode.
fn serve_request(body: &[u8], templates: &[difftx::serve::chat::ChatTemplate]) {
    use difftx::serve::api;
    let tok = difftx::data::Tokenizer::Bytes;
    let Ok(req) = api::parse_body(body) else {
        return;
    };
    let _ = api::check_model(&req, "m");
    let mut texts = Vec::new();
    if let Ok((_, prompts)) = api::completion_request(&req) {
        for p in prompts {
            match p {
                api::Prompt::Text(t) => texts.push(t),
                api::Prompt::Ids(ids) => {
                    if api::check_ids(&ids, 256, "prompt").is_ok() {
                        texts.push(tok.decode(&ids).unwrap());
                    }
                }
            }
        }
    }
    let mut messages = Vec::new();
    if let Ok((m, _)) = api::chat_request(&req) {
        messages.push(m.to_vec());
    }
    match api::tokenize_request(&req) {
        Ok(api::ToTokenize::Text(t)) => texts.push(t.to_string()),
        Ok(api::ToTokenize::Messages(m)) => messages.push(m.to_vec()),
        Err(_) => {}
    }
    for m in &messages {
        texts.extend(templates.iter().filter_map(|t| t.render(m).ok()));
    }
    for t in texts {
        let _ = tok.decode(&tok.encode(&t).unwrap());
    }
    if let Ok(ids) = api::detokenize_request(&req, 256) {
        let _ = tok.decode(&ids).unwrap();
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
    let mut tokens = Vec::new();
    token_files(tmp.path(), &mut tokens);
    assert_eq!(tokens.len(), 1, "the seed run's token file: {tokens:?}");
    let (token_dir, token_file) = (
        tokens[0].parent().unwrap().to_path_buf(),
        tokens[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
    );
    let load_tokens = |d: &Path| {
        let Ok(f) = difftx::data::TokenFile::open(&d.join(&token_file)) else {
            return;
        };
        let mut ids = vec![0u32; 4096];
        for start in (0..f.len()).step_by(ids.len()) {
            let n = ids.len().min(f.len() - start);
            f.copy_to(start, &mut ids[..n]);
        }
        let _ = f.check_ids();
    };
    let (bodies, templates) = request_bodies(tmp.path());
    let load_body = |file: &'static str| {
        let templates = &templates;
        move |d: &Path| serve_request(&std::fs::read(d.join(file)).unwrap(), templates)
    };
    let (completions, completions_ids, chat, tokenize, detokenize) = (
        load_body("completions.json"),
        load_body("completions_ids.json"),
        load_body("chat.json"),
        load_body("tokenize.json"),
        load_body("detokenize.json"),
    );
    let load_toml = |d: &Path| {
        if let Ok(o) = difftx::train::options::TrainOptions::from_toml_file(&d.join("run.toml")) {
            let _ = o.resolve(256);
        }
    };
    type Mutator = fn(&mut ChaCha8Rng, &[u8]) -> Vec<u8>;
    type Target<'a> = (&'a Path, &'a str, Mutator, &'a dyn Fn(&Path));
    let plan: [Target; 14] = [
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
        (&token_dir, &token_file, mutate_tokens, &load_tokens),
        (&bodies, "completions.json", mutate_json_text, &completions),
        (
            &bodies,
            "completions_ids.json",
            mutate_json_text,
            &completions_ids,
        ),
        (&bodies, "chat.json", mutate_json_text, &chat),
        (&bodies, "tokenize.json", mutate_json_text, &tokenize),
        (&bodies, "detokenize.json", mutate_json_text, &detokenize),
    ];
    // quiet: a panic is reported below, once, with its case
    let hook = std::panic::take_hook();
    if std::env::var_os("DIFFTX_FUZZ_LOUD").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let mut report = Vec::new();
    let only = std::env::var("DIFFTX_FUZZ_ONLY").unwrap_or_default();
    for (i, (dir, file, mutate, load)) in plan.into_iter().enumerate() {
        let name = format!("{}/{file}", dir.file_name().unwrap().to_string_lossy());
        if !name.contains(&only) {
            continue;
        }
        let t = std::time::Instant::now();
        let crashes = fuzz(dir, file, seed + i as u64, cases, mutate, load);
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
