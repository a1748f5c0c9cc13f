//! The command line on good and bad input: every bad input is one line on stderr that names
//! the file and the key or tensor, exit code 1, and no panic.

mod common;
use common::*;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};
use std::process::Output;

/// `difftx eval --model m --data data` and the `extra` flags
fn eval(m: &Path, data: &Path, extra: &[&str]) -> Output {
    let (m, data) = (m.to_str().unwrap(), data.to_str().unwrap());
    difftx(&[&["eval", "--model", m, "--data", data], extra].concat())
}

/// `difftx eval --model m --data data --json`, which must succeed: its one JSON object.
fn eval_json(m: &Path, data: &Path) -> serde_json::Value {
    let out = eval(m, data, &["--json"]);
    ok(&out);
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn init_model(dir: &Path, attention: &str) -> PathBuf {
    let m = dir.join(format!("m_{attention}"));
    let out = difftx(&[
        "init",
        "--preset",
        "tiny",
        "--attention",
        attention,
        "--out",
        m.to_str().unwrap(),
    ]);
    ok(&out);
    without_manifest(&m);
    m
}

/// Removes a model directory's `manifest.json`, as a directory edited by hand (or written
/// before manifests, or downloaded from Hugging Face) lacks one: the tests that damage files
/// on purpose then reach the loader's own checks instead of the digest check.
fn without_manifest(m: &Path) {
    std::fs::remove_file(m.join("manifest.json")).unwrap();
}

fn text_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Rewrites model.safetensors with `edit` applied to the (name, dtype, shape, bytes) list.
fn rewrite_weights(
    model: &Path,
    edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>),
) {
    let path = model.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut ts: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut ts);
    let views = ts.iter().map(|(n, d, s, b)| {
        (
            n.clone(),
            safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
        )
    });
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

const TEXT: &str = "It was the best of times, it was the worst of times, it was the age of wisdom.";

#[test]
fn eval_prints_loss_json_near_log_vocab_for_a_fresh_model() {
    let tmp = tempfile::tempdir().unwrap();
    for kind in ["standard", "diff_v1", "diff_v2"] {
        let m = init_model(tmp.path(), kind);
        let data = text_file(tmp.path(), "a.txt", &TEXT.repeat(5));
        let v = eval_json(&m, &data);
        let loss = v["loss"].as_f64().unwrap();
        // A freshly initialised byte-level model is close to uniform over 256 ids.
        assert!((loss - 256f64.ln()).abs() < 0.1, "{kind}: loss {loss}");
        assert!((v["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-6 * loss.exp());
        // 5 × 79 bytes give 394 predicted tokens, windows of 128.
        assert_eq!(v["tokens"].as_u64(), Some((TEXT.len() * 5 - 1) as u64));
        // byte-level: a token is a byte, so bits per byte is the loss in bits
        let bpb = v["bits_per_byte"].as_f64().unwrap();
        assert!(
            (bpb - loss / 2f64.ln()).abs() < 1e-9,
            "{kind}: {bpb} bits/byte, {loss} nats"
        );
    }
}

/// `eval --by-position`: buckets whose token-weighted mean is the overall loss, the last
/// cumulative mean equal to it; `--length` past the context warns and still scores; `--plot`
/// writes a PNG; the table has a row per bucket.
#[test]
fn eval_by_position_buckets_average_to_the_loss_and_extrapolate_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "diff_v1");
    let data = text_file(tmp.path(), "a.txt", &TEXT.repeat(12));
    let png = tmp.path().join("pos.png");
    for (length, buckets) in [("128", 8), ("300", 5)] {
        let extra = [
            "--by-position",
            "--buckets",
            &buckets.to_string(),
            "--length",
            length,
            "--json",
        ];
        let out = eval(
            &m,
            &data,
            &[&extra[..], &["--plot", png.to_str().unwrap()]].concat(),
        );
        let err = ok(&out);
        assert_eq!(err.contains("past the context"), length == "300", "{err}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let b = v["by_position"].as_array().unwrap();
        assert_eq!(b.len(), buckets);
        let tokens: u64 = b.iter().map(|b| b["tokens"].as_u64().unwrap()).sum();
        assert_eq!(Some(tokens), v["tokens"].as_u64());
        let mean: f64 = b
            .iter()
            .map(|b| b["loss"].as_f64().unwrap() * b["tokens"].as_f64().unwrap())
            .sum::<f64>()
            / tokens as f64;
        let loss = v["loss"].as_f64().unwrap();
        assert!((mean - loss).abs() < 1e-6 * loss, "{mean} vs {loss}");
        let last = b.last().unwrap()["cumulative"].as_f64().unwrap();
        assert!((last - loss).abs() < 1e-6 * loss);
        assert_eq!(
            b.last().unwrap()["end"].as_u64(),
            Some(length.parse().unwrap())
        );
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    }
    let out = eval(&m, &data, &["--by-position", "--buckets", "4"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert_eq!(table.lines().count(), 1 + 1 + 4, "{table}");
    fails_with(&eval(&m, &data, &["--length", "0"]), &["--length"]);
}

#[test]
fn missing_model_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let out = difftx(&[
        "eval",
        "--model",
        "/nonexistent/model",
        "--data",
        data.to_str().unwrap(),
    ]);
    fails_with(&out, &["/nonexistent/model"]);
}

#[test]
fn missing_or_malformed_config_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "diff_v1");
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let cfg = m.join("config.json");
    std::fs::write(&cfg, "{\"model_type\": \"difftx\", ").unwrap();
    fails_with(&eval(&m, &data, &[]), &["config.json", "malformed JSON"]);
    let good =
        serde_json::json!({"model_type": "difftx", "attention": "diff_v1", "vocab_size": 256});
    std::fs::write(&cfg, good.to_string()).unwrap();
    fails_with(
        &eval(&m, &data, &[]),
        &["config.json", "missing key `hidden_size`"],
    );
    std::fs::remove_file(&cfg).unwrap();
    fails_with(&eval(&m, &data, &[]), &["config.json", "No such file"]);
}

#[test]
fn impossible_config_names_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "standard");
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let cfg = m.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["head_dim"] = 31.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    fails_with(
        &eval(&m, &data, &[]),
        &["config.json", "head_dim (31) must be even"],
    );
}

#[test]
fn bad_tensors_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let run = |m: &Path| eval(m, &data, &[]);

    let m = init_model(tmp.path(), "diff_v1");
    rewrite_weights(&m, |ts| {
        ts.retain(|t| t.0 != "model.layers.1.self_attn.lambda_q2")
    });
    fails_with(
        &run(&m),
        &[
            "model.safetensors",
            "missing tensor `model.layers.1.self_attn.lambda_q2`",
        ],
    );

    let m = init_model(tmp.path(), "standard");
    rewrite_weights(&m, |ts| {
        ts.push((
            "model.layers.0.self_attn.subln.weight".into(),
            Dtype::F32,
            vec![2],
            vec![0; 8],
        ))
    });
    fails_with(
        &run(&m),
        &[
            "model.safetensors",
            "unexpected tensor `model.layers.0.self_attn.subln.weight`",
        ],
    );

    let m = init_model(tmp.path(), "diff_v2");
    rewrite_weights(&m, |ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "model.layers.0.self_attn.lambda_proj.weight")
            .unwrap();
        t.2 = vec![t.2[1], t.2[0]];
    });
    fails_with(&run(&m), &["model.safetensors", "tensor `model.layers.0.self_attn.lambda_proj.weight` has shape [128, 4], expected [4, 128]"]);

    let m = init_model(tmp.path(), "diff_v1");
    rewrite_weights(&m, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
        t.1 = Dtype::I32;
    });
    fails_with(
        &run(&m),
        &["model.safetensors", "tensor `model.norm.weight`", "I32"],
    );

    // NaN and infinity in the weights: refused at load, naming the tensor and the count
    let m = init_model(tmp.path(), "diff_v1");
    rewrite_weights(&m, |ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "model.layers.1.mlp.up_proj.weight")
            .unwrap();
        t.3[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        t.3[40..44].copy_from_slice(&f32::INFINITY.to_le_bytes());
        t.3[80..84].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    });
    fails_with(
        &run(&m),
        &[
            "model.safetensors",
            "tensor `model.layers.1.mlp.up_proj.weight` holds 3 non-finite",
        ],
    );
    let gen = difftx(&["generate", "--model", m.to_str().unwrap(), "--prompt", "a"]);
    fails_with(&gen, &["up_proj", "non-finite"]);
}

#[test]
fn truncated_checkpoint_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "diff_v1");
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let w = m.join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &eval(&m, &data, &[]),
        &["model.safetensors", "not a complete safetensors file"],
    );
}

#[test]
fn empty_short_or_missing_data_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "diff_v2");
    let ms = m.to_str().unwrap();
    let empty = text_file(tmp.path(), "empty.txt", "");
    fails_with(
        &difftx(&["eval", "--model", ms, "--data", empty.to_str().unwrap()]),
        &["empty.txt", "0 token(s)"],
    );
    let one = text_file(tmp.path(), "one.txt", "x");
    fails_with(
        &difftx(&["eval", "--model", ms, "--data", one.to_str().unwrap()]),
        &["one.txt", "1 token(s)"],
    );
    fails_with(
        &difftx(&["eval", "--model", ms, "--data", "/nonexistent/data.txt"]),
        &["/nonexistent/data.txt"],
    );
}

#[test]
fn a_saved_model_loads_back_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "diff_v1");
    let a = difftx::Model::load(&m).unwrap();
    let fresh = difftx::Model::init(
        difftx::ModelConfig::preset(difftx::Preset::Tiny, difftx::AttentionKind::DiffV1),
        0,
    )
    .unwrap();
    assert_eq!(a.params, fresh.params);
    assert_eq!(a.config, fresh.config);
}

/// `init --vocab-size` sizes the embedding and the LM head (for speed measurements at a real
/// tokenizer's size); zero is refused in one line.
#[test]
fn init_sizes_the_vocabulary_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("wide");
    ok(&difftx(&[
        "init",
        "--attention",
        "standard",
        "--vocab-size",
        "300",
        "--out",
        m.to_str().unwrap(),
    ]));
    let wide = difftx::Model::load(&m).unwrap();
    assert_eq!(wide.config.vocab_size, 300);
    let bytes = difftx::Model::init(
        difftx::ModelConfig {
            vocab_size: 256,
            ..wide.config.clone()
        },
        0,
    )
    .unwrap();
    // 44 more rows of the embedding and (untied) of the LM head
    let per_row = wide.config.hidden_size
        * if wide.config.tie_word_embeddings {
            1
        } else {
            2
        };
    assert_eq!(wide.num_params() - bytes.num_params(), 44 * per_row);
    let zero = tmp.path().join("zero");
    fails_with(
        &difftx(&["init", "--vocab-size", "0", "--out", zero.to_str().unwrap()]),
        &["--vocab-size must be at least 1"],
    );
    assert!(!zero.exists());
}

#[test]
fn diff_v1_ablations_save_load_and_refuse_hugging_face_export() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "a.txt", &TEXT.repeat(5));
    let m = tmp.path().join("ablation");
    let (ms, hf) = (m.to_str().unwrap(), tmp.path().join("hf"));
    let out = difftx(&["init", "--no-subln", "--lambda-init", "0.8", "--out", ms]);
    ok(&out);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (cfg["lambda_init"].as_f64(), cfg["subln"].as_bool()),
        (Some(0.8), Some(false))
    );
    // The checkpoint simply has no subln tensors, and loads back bit for bit.
    let loaded = difftx::Model::load(&m).unwrap();
    let fresh = difftx::Model::init(loaded.config.clone(), 0).unwrap();
    assert_eq!(
        (loaded.config.lambda_init, loaded.config.subln),
        (Some(0.8), false)
    );
    assert_eq!(loaded.params, fresh.params);
    let bytes = std::fs::read(m.join("model.safetensors")).unwrap();
    let names = SafeTensors::deserialize(&bytes).unwrap().names().len();
    assert_eq!(names, loaded.layout.specs.len());
    assert!(loaded
        .layout
        .specs
        .iter()
        .all(|s| !s.name.contains("subln")));
    assert!(eval(&m, &data, &[]).status.success());
    // DiffLlama has neither setting: export names the first and writes nothing.
    let export = |m: &Path| {
        difftx(&[
            "export",
            "--model",
            m.to_str().unwrap(),
            "--out",
            hf.to_str().unwrap(),
        ])
    };
    fails_with(&export(&m), &["lambda_init (0.8)", "DiffLlama"]);
    let mut only_subln = cfg.clone();
    only_subln.as_object_mut().unwrap().remove("lambda_init");
    std::fs::write(m.join("config.json"), only_subln.to_string()).unwrap();
    without_manifest(&m);
    fails_with(&export(&m), &["subln off", "DiffLlama"]);
    assert!(!hf.exists());
    // config.json and the tensors must agree about subln, both ways.
    let mut with_subln = only_subln.clone();
    with_subln.as_object_mut().unwrap().remove("subln");
    std::fs::write(m.join("config.json"), with_subln.to_string()).unwrap();
    fails_with(
        &eval(&m, &data, &[]),
        &["missing tensor `model.layers.0.self_attn.subln.weight`"],
    );
    let paper = init_model(tmp.path(), "diff_v1");
    let c = paper.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&c).unwrap()).unwrap();
    v["subln"] = false.into();
    std::fs::write(&c, v.to_string()).unwrap();
    fails_with(
        &eval(&paper, &data, &[]),
        &[
            "model.safetensors",
            "unexpected tensor `model.layers.0.self_attn.subln.weight`",
        ],
    );
    // Bad values and kinds without these settings are one-line errors naming the key.
    let bad = tmp.path().join("bad");
    let bad = bad.to_str().unwrap();
    fails_with(
        &difftx(&["init", "--lambda-init", "1.5", "--out", bad]),
        &["lambda_init (1.5) must be in [0, 1)"],
    );
    fails_with(
        &difftx(&[
            "init",
            "--attention",
            "standard",
            "--no-subln",
            "--out",
            bad,
        ]),
        &["key `subln` applies to diff_v1 only (standard"],
    );
    fails_with(
        &difftx(&[
            "init",
            "--attention",
            "diff_v2",
            "--lambda-init",
            "0.5",
            "--out",
            bad,
        ]),
        &["key `lambda_init` applies to diff_v1 only (diff_v2"],
    );
    let help = difftx(&["train", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--lambda-init <X>") && help.contains("--no-subln"),
        "{help}"
    );
}

/// A word-level Hugging Face tokenizer.json over a tiny vocabulary.
fn word_tokenizer(words: &[&str]) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i.into()))
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

#[test]
fn eval_uses_the_model_directorys_tokenizer_json() {
    let tmp = tempfile::tempdir().unwrap();
    let words = ["[UNK]", "the", "cat", "sat", "on", "mat"];
    let mut c = difftx::ModelConfig::preset(difftx::Preset::Tiny, difftx::AttentionKind::DiffV1);
    c.vocab_size = words.len();
    c.tokenizer = None;
    let m = tmp.path().join("m");
    difftx::Model::init(c, 0).unwrap().save(&m).unwrap();
    let data = text_file(tmp.path(), "a.txt", "the cat sat on the mat the cat");
    let run = || eval(&m, &data, &["--json"]);
    // Without tokenizer.json a 6-word vocabulary cannot hold bytes.
    fails_with(&run(), &["no tokenizer.json", "vocab_size 6"]);
    std::fs::write(m.join("tokenizer.json"), word_tokenizer(&words)).unwrap();
    let out = run();
    ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 8 words predict 7 next tokens; bytes would have given 30.
    assert_eq!(v["tokens"].as_u64(), Some(7));
    // A fresh model is near uniform over the 6 ids (ln 6 ≈ 1.79; over bytes it would be 5.5).
    let loss = v["loss"].as_f64().unwrap();
    assert!((loss - 6f64.ln()).abs() < 0.2, "{loss}");
    // bits per byte: the 7 predicted words' nats over the 27 bytes after the first word
    assert_eq!(v["bytes"].as_u64(), Some(27));
    let bpb = v["bits_per_byte"].as_f64().unwrap();
    assert!(
        (bpb - loss * 7.0 / 2f64.ln() / 27.0).abs() < 1e-9,
        "{bpb} {loss}"
    );
    // Text the tokenizer cannot represent: "dog" becomes [UNK]. One unknown word in 30
    // sentences (0.58% of the non-space bytes) is a warning with the figure...
    std::fs::write(&data, "the cat sat on the mat ".repeat(30) + "dog").unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("cannot represent 3 of its 513 non-space bytes (0.58%)"),
        "{err}"
    );
    // ...and above 1% it is refused, naming the text and the tokenizer.
    std::fs::write(&data, "the cat sat on the mat the dog").unwrap();
    fails_with(
        &run(),
        &[
            "a.txt",
            "tokenizer.json cannot represent 3 of its 23",
            "13.04%",
            "refused above 1%",
        ],
    );
    std::fs::write(m.join("tokenizer.json"), "{not json").unwrap();
    fails_with(&run(), &["tokenizer.json", "cannot read tokenizer"]);
}

#[test]
fn hugging_face_directory_errors_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    let copy = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, d.join(f.file_name().unwrap())).unwrap();
        }
        d
    };
    let run = |m: &Path| eval(m, &data, &[]);
    let edit_config = |m: &Path, f: &dyn Fn(&mut serde_json::Value)| {
        let p = m.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
    };
    let m = copy("gpt2");
    edit_config(&m, &|v| v["model_type"] = "gpt2".into());
    fails_with(
        &run(&m),
        &["config.json", "model_type `gpt2` is not supported"],
    );
    let m = copy("bias");
    edit_config(&m, &|v| v["attention_bias"] = true.into());
    fails_with(&run(&m), &["config.json", "attention_bias"]);
    let m = copy("shape");
    edit_config(&m, &|v| v["intermediate_size"] = 96.into());
    fails_with(
        &run(&m),
        &[
            "model.safetensors",
            "tensor `model.layers.0.mlp.gate_proj.weight` has shape [128, 64], expected [96, 64]",
        ],
    );
    let m = copy("missing");
    std::fs::remove_file(m.join("model.safetensors")).unwrap();
    fails_with(
        &run(&m),
        &[
            "missing",
            "neither model.safetensors nor model.safetensors.index.json",
        ],
    );
}

#[test]
fn generate_writes_only_the_continuation_to_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("expected.json")).unwrap()).unwrap();
    let prompt = exp["prompt"].as_str().unwrap();
    let out = difftx(&[
        "generate",
        "--model",
        hf.to_str().unwrap(),
        "--prompt",
        prompt,
        "--max-new-tokens",
        "20",
        "--temperature",
        "0",
        "--stats",
    ]);
    ok(&out);
    // transformers' greedy continuation (it ends at the end-of-text token), as text
    let want = exp["generate"]["new_text"].as_str().unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        got.trim_end_matches('\n'),
        want,
        "stdout is the continuation only"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prefill:") && err.contains("tokens/s"),
        "{err}"
    );
    // a prompt longer than the context: one line that says both lengths
    let m = init_model(tmp.path(), "standard");
    let long = "x".repeat(200);
    fails_with(
        &difftx(&[
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            &long,
        ]),
        &["200 tokens", "context of 128"],
    );
    let out = difftx(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        &long,
        "--truncate-prompt",
        "--max-new-tokens",
        "3",
    ]);
    ok(&out);
    fails_with(
        &difftx(&[
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "a",
            "--top-p",
            "1.5",
        ]),
        &["--top-p"],
    );
    fails_with(
        &difftx(&[
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt-file",
            "/nonexistent/p.txt",
        ]),
        &["/nonexistent/p.txt"],
    );
}

/// `--repetition-penalty` is transformers' (`repetition_penalty=`), `--presence-penalty` and
/// `--frequency-penalty` OpenAI's rule: greedy text under each as transformers generated it
/// (scripts/penalty_fixtures.py); a penalty out of its range is one line naming the flag.
#[test]
fn generate_penalties_continue_as_transformers_does() {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("penalties.json")).unwrap()).unwrap();
    let (prompt, n) = (
        exp["prompt"].as_str().unwrap(),
        exp["max_new_tokens"].to_string(),
    );
    let flags = [
        ("repetition_penalty", "--repetition-penalty"),
        ("presence_penalty", "--presence-penalty"),
        ("frequency_penalty", "--frequency-penalty"),
    ];
    let model = hf.to_str().unwrap();
    let base = ["generate", "--model", model, "--prompt", prompt];
    let base = [&base[..], &["--temperature", "0", "--max-new-tokens", &n]].concat();
    for case in exp["cases"].as_array().unwrap() {
        let mut args: Vec<String> = base.iter().map(|a| a.to_string()).collect();
        for (key, flag) in flags {
            if let Some(v) = case.get(key) {
                args.extend([flag.to_string(), v.to_string()]);
            }
        }
        let out = difftx(&args.iter().map(String::as_str).collect::<Vec<_>>());
        ok(&out);
        let got = String::from_utf8_lossy(&out.stdout);
        let want = case["new_text"].as_str().unwrap();
        assert_eq!(got.trim_end_matches('\n'), want, "{case}");
    }
    for (flag, bad) in [
        ("--repetition-penalty", "0"),
        ("--repetition-penalty", "-1"),
        ("--presence-penalty", "2.5"),
        ("--frequency-penalty", "-3"),
    ] {
        fails_with(&difftx(&[&base[..], &[flag, bad]].concat()), &[flag, bad]);
    }
}

/// `bench matmul --cold` times the same product with its operands taken from memory, and says
/// so in its JSON; sizes of zero are a one-line error.
#[test]
fn bench_matmul_cold_reports_each_backend_and_refuses_empty_sizes() {
    let out = difftx(&[
        "--threads",
        "1",
        "bench",
        "matmul",
        "--m",
        "33",
        "--n",
        "40",
        "--k",
        "17",
        "--reps",
        "2",
        "--cold",
        "--json",
    ]);
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert!(rows.len() >= 2, "{text}");
    for r in &rows {
        assert_eq!(r["cold"], true, "{r}");
        assert_eq!(
            (r["m"].as_u64(), r["n"].as_u64(), r["k"].as_u64()),
            (Some(33), Some(40), Some(17))
        );
        assert!(r["gflops"].as_f64().unwrap() > 0.0, "{r}");
    }
    fails_with(
        &difftx(&["bench", "matmul", "--m", "0", "--cold"]),
        &["positive"],
    );
}

/// `bench matmul --layout nt` (X·Wᵀ) also times bf16 with the weight packed beforehand, as
/// inference keeps it, where the CPU has AVX512_BF16; the other layouts do not.
#[test]
fn bench_matmul_nt_times_bf16_with_the_weight_packed_beforehand() {
    let has_bf16 = difftx::kernels::gemm::cpu::avx512_bf16();
    for (layout, packed) in [("nt", has_bf16), ("nn", false)] {
        let out = difftx(&[
            "--threads",
            "2",
            "bench",
            "matmul",
            "--m",
            "37",
            "--n",
            "70",
            "--k",
            "45",
            "--reps",
            "2",
            "--layout",
            layout,
            "--json",
        ]);
        ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        let row = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON object a line"))
            .find(|r| r["backend"] == "difftx-bf16-packed");
        assert_eq!(row.is_some(), packed, "{layout}: {text}");
        if let Some(r) = row {
            assert!(r["gflops"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}

/// `bench matmul --layout nt` with K a multiple of 32 also times the quantised products, each
/// kind on every integer engine the CPU has (the portable one always); K off the blocks, none.
#[test]
fn bench_matmul_nt_times_each_quantised_engine() {
    use difftx::kernels::quant::Engine;
    for (k, quantised) in [("64", true), ("45", false)] {
        let out = difftx(&[
            "--threads",
            "2",
            "bench",
            "matmul",
            "--m",
            "5",
            "--n",
            "40",
            "--k",
            k,
            "--reps",
            "2",
            "--layout",
            "nt",
            "--json",
        ]);
        ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        let backends: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON object a line"))
            .filter(|r| r["gflops"].as_f64().unwrap() > 0.0)
            .map(|r| r["backend"].as_str().unwrap().to_string())
            .collect();
        for kind in ["q8_0", "q4_0"] {
            for &engine in Engine::available() {
                let name = format!("difftx-{kind}-{}", engine.name());
                assert_eq!(backends.contains(&name), quantised, "k {k}, {name}: {text}");
            }
        }
    }
}

/// `bench decode --batch 5` decodes five sequences together and counts all their tokens; a
/// batch of 0 is a one-line error.
#[test]
fn bench_decode_batches_sequences_and_refuses_a_batch_of_zero() {
    let args = |batch: &'static str| {
        let mut a = vec!["--threads", "1", "bench", "decode", "--preset", "tiny"];
        a.extend(["--prompt-len", "8", "--new-tokens", "6", "--reps", "1"]);
        a.extend(["--batch", batch, "--json"]);
        a
    };
    let out = difftx(&args("5"));
    ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(r["batch"], 5, "{r}");
    let (tps, secs) = (
        r["decode_tokens_per_s"].as_f64().unwrap(),
        r["decode_s_median"].as_f64().unwrap(),
    );
    assert!(
        (tps * secs - 30.0).abs() < 1e-6,
        "5 sequences × 6 tokens: {r}"
    );
    fails_with(&difftx(&args("0")), &["--batch", "positive"]);
    // without --phases, no phases
    assert_eq!(r["phases"], serde_json::json!([]), "{r}");
}

/// `bench decode --prompt-file F --lookup N` decodes after the file's tokens with prompt
/// lookup: the JSON says how many tokens were drafted and accepted; a --prompt-len past the
/// file's tokens and a missing file are one-line errors.
#[test]
fn bench_decode_runs_prompt_lookup_after_a_text() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("p.txt");
    std::fs::write(&text, "abc abc abc abc abc abc ".repeat(3)).unwrap();
    let f = text.to_str().unwrap();
    let mut a = vec!["--threads", "1", "bench", "decode", "--preset", "tiny"];
    a.extend([
        "--new-tokens",
        "24",
        "--reps",
        "1",
        "--json",
        "--prompt-file",
        f,
    ]);
    let out = difftx(&[&a[..], &["--lookup", "4"]].concat());
    ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        (r["lookup"].as_u64(), r["prompt_len"].as_u64()),
        (Some(4), Some(72)),
        "{r}"
    );
    let (drafted, accepted) = (
        r["drafted"].as_u64().unwrap(),
        r["accepted"].as_u64().unwrap(),
    );
    assert!(drafted > 0 && accepted <= drafted, "{r}");
    let plain: serde_json::Value = serde_json::from_slice(&difftx(&a).stdout).unwrap();
    assert_eq!(
        (plain["lookup"].as_u64(), plain["drafted"].as_u64()),
        (Some(0), Some(0))
    );
    fails_with(
        &difftx(&[&a[..], &["--prompt-len", "100"]].concat()),
        &["--prompt-len 100", "72 tokens"],
    );
    let missing = [
        "bench",
        "decode",
        "--preset",
        "tiny",
        "--prompt-file",
        "/nonexistent/p.txt",
    ];
    fails_with(&difftx(&missing), &["--prompt-file", "/nonexistent/p.txt"]);
}

/// `bench decode --phases` times each phase of the prefill and of a decoding step: all six
/// named, none negative, the products and the attention taking time, together no more than
/// the prefill or the step (the clock laps inside them); the text says where each one's time
/// goes.
#[test]
fn bench_decode_phases_account_for_the_prefill_and_the_decoding_step() {
    let mut a = vec!["--threads", "1", "bench", "decode", "--preset", "tiny"];
    a.extend([
        "--prompt-len",
        "40",
        "--new-tokens",
        "12",
        "--reps",
        "1",
        "--phases",
    ]);
    let out = difftx(&[&a[..], &["--json"]].concat());
    ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for (key, total) in [
        ("prefill_phases", r["prefill_s_median"].as_f64().unwrap()),
        ("phases", r["decode_s_median"].as_f64().unwrap() / 12.0),
    ] {
        let phases = r[key].as_array().expect(key);
        let names: Vec<&str> = phases
            .iter()
            .map(|p| p["phase"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["norms", "qkv", "attention", "o_proj", "mlp", "lm_head"]
        );
        let secs = |name: &str| {
            phases[names.iter().position(|n| *n == name).unwrap()]["seconds"]
                .as_f64()
                .unwrap()
        };
        assert!(names.iter().all(|n| secs(n) >= 0.0), "{key}: {r}");
        assert!(
            secs("qkv") > 0.0 && secs("attention") > 0.0 && secs("mlp") > 0.0,
            "{key}: {r}"
        );
        let timed: f64 = names.iter().map(|n| secs(n)).sum();
        assert!(timed <= total, "{key}: phases {timed} s > {total} s: {r}");
    }
    let out = difftx(&a);
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for line in ["a prefill of 40 tokens,", "a decoding step,"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            line.contains("attention") && line.contains("other"),
            "{text}"
        );
    }
}

#[test]
fn a_training_run_folder_serves_as_its_newest_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "a.txt", &TEXT.repeat(20));
    let run = tmp.path().join("run");
    let (d, r) = (data.to_str().unwrap(), run.to_str().unwrap());
    let out = difftx(&[
        "train",
        "--data",
        d,
        "--out",
        r,
        "--preset",
        "tiny",
        "--context",
        "32",
        "--batch",
        "2",
        "--steps",
        "4",
        "--ckpt-every",
        "2",
        "--eval-every",
        "2",
        "--val-fraction",
        "0.1",
    ]);
    ok(&out);
    // the same loss as the checkpoint's own directory, and a line saying which one
    let by_run = eval(&run, &data, &[]);
    let by_dir = eval(&run.join("checkpoints/step-00000004"), &data, &[]);
    ok(&by_run);
    assert_eq!(by_run.stdout, by_dir.stdout);
    let err = String::from_utf8_lossy(&by_run.stderr);
    assert!(
        err.contains("using its newest checkpoint step-00000004"),
        "{err}"
    );
    let gen = difftx(&[
        "generate",
        "--model",
        r,
        "--prompt",
        "a",
        "--max-new-tokens",
        "3",
    ]);
    ok(&gen);
    let png = tmp.path().join("map.png");
    let dump = tmp.path().join("map.json");
    let map = difftx(&[
        "attention-map",
        "--model",
        r,
        "--prompt",
        "abc",
        "--layer",
        "0",
        "--head",
        "0",
        "--out",
        png.to_str().unwrap(),
        "--dump",
        dump.to_str().unwrap(),
    ]);
    ok(&map);
    // the raw maps: tokens, and rows of A1 (softmax: each sums to 1), A2 and A1 − λ·A2
    let maps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    assert_eq!(maps["tokens"], serde_json::json!(["a", "b", "c"]));
    for key in ["a1", "a2", "diff"] {
        assert_eq!(maps[key].as_array().unwrap().len(), 3, "{key}");
    }
    for (i, row) in maps["a1"].as_array().unwrap().iter().enumerate() {
        let row: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(
            (row.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "row {i}: {row:?}"
        );
        assert!(
            row[i + 1..].iter().all(|&x| x == 0.0),
            "row {i} sees the future: {row:?}"
        );
    }
    let hf = tmp.path().join("hf");
    let exp = difftx(&["export", "--model", r, "--out", hf.to_str().unwrap()]);
    ok(&exp);
    assert!(hf.join("config.json").is_file());
    // a run folder whose checkpoints are all incomplete is one line naming it
    std::fs::remove_dir_all(run.join("checkpoints")).unwrap();
    std::fs::create_dir_all(run.join("checkpoints/.tmp-step-00000002")).unwrap();
    fails_with(
        &eval(&run, &data, &[]),
        &["run", "without a complete checkpoint"],
    );
}

#[test]
fn generate_json_gives_one_object_per_prompt_and_a_batch_has_separators() {
    let tmp = tempfile::tempdir().unwrap();
    let m = init_model(tmp.path(), "diff_v1");
    let m = m.to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut v = vec!["generate", "--model", m, "--temperature", "0"];
        v.extend([
            "--max-new-tokens",
            "5",
            "--prompt",
            "It was",
            "--prompt",
            "the age",
        ]);
        v.extend_from_slice(extra);
        v
    };
    let out = difftx(&args(&["--json"]));
    ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    let objs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objs.len(), 2, "{text}");
    assert_eq!(objs[0]["prompt"], "It was");
    assert_eq!(objs[1]["prompt"], "the age");
    for o in &objs {
        assert_eq!(o["new_tokens"], 5, "{o}");
        assert_eq!(
            o["prompt_tokens"].as_u64().unwrap(),
            6 + (o["prompt"] == "the age") as u64
        );
        assert_eq!(o["batch"], 2);
        assert!(o["decode_seconds"].as_f64().unwrap() > 0.0);
    }
    // the text form: each continuation under a line naming its prompt, the same greedy text
    let out = difftx(&args(&["--stats"]));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("=== prompt 1 of 2 ==="));
    assert!(text.contains("\n=== prompt 2 of 2 ===\n"), "{text}");
    assert!(text.ends_with('\n'), "{text:?}");
    assert!(
        text.contains(objs[0]["continuation"].as_str().unwrap()),
        "{text}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("prefill: "), "{err}");
}

#[test]
fn readme_and_help_give_the_same_timings() {
    let readme = include_str!("../README.md").replace('\n', " ");
    let help = |args: &[&str]| String::from_utf8_lossy(&difftx(args).stdout).replace('\n', " ");
    let (top, repro) = (help(&["--help"]), help(&["repro", "--help"]));
    let demo = help(&["demo", "--help"]);
    // the demo: 22–80 s to train both models, by CPU
    assert!(
        readme.contains("both models in 22–80 s on 2 cores"),
        "README"
    );
    assert!(demo.contains("(22–80 s on 2 cores)"), "{demo}");
    assert!(top.contains("(22–80 s on 2 cores)"), "{top}");
    // the smoke run and the full run
    for phrase in [
        "smoke run, about 15 s on 2 cores",
        "about 35 min on 2 cores",
    ] {
        assert!(readme.contains(phrase), "README lacks {phrase}");
        assert!(
            repro.contains(phrase),
            "repro --help lacks {phrase}: {repro}"
        );
    }
}

/// An unknown `--kv-cache` type is one line naming it, before any model is read.
#[test]
fn an_unknown_kv_cache_type_is_one_line() {
    for args in [
        &[
            "generate",
            "--model",
            "nowhere",
            "--prompt",
            "a",
            "--kv-cache",
            "f16",
        ][..],
        &["bench", "decode", "--preset", "tiny", "--kv-cache", "f16"],
        &["serve", "--model", "nowhere", "--kv-cache", "f16"],
        &[
            "eval",
            "--model",
            "nowhere",
            "--data",
            "x",
            "--kv-cache",
            "f16",
        ],
    ] {
        fails_with(&difftx(args), &["--kv-cache", "`f16`", "f32, bf16 or q8_0"]);
    }
}

/// `--quant` on a model whose SwiGLU width (200) is not a multiple of 32: the other matrices are
/// quantised and the command runs, and one stderr line names the down projections left f32.
#[test]
fn quant_names_the_matrices_it_leaves_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = difftx::ModelConfig::preset(difftx::Preset::Tiny, difftx::AttentionKind::DiffV1);
    c.intermediate_size = 200;
    let m = tmp.path().join("m");
    difftx::Model::init(c, 0).unwrap().save(&m).unwrap();
    let data = text_file(tmp.path(), "a.txt", "the cat sat on the mat");
    let f32_loss = eval(&m, &data, &[]);
    let o = eval(&m, &data, &["--quant", "q4_0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let line: Vec<&str> = err.lines().filter(|l| l.contains("stay f32")).collect();
    assert_eq!(line.len(), 1, "{err}");
    assert!(
        line[0].starts_with("--quant q4_0: 2 matrices stay f32"),
        "{err}"
    );
    assert!(
        line[0].contains("model.layers.1.mlp.down_proj.weight"),
        "{err}"
    );
    // the rest was quantised: the loss moved
    assert_ne!(o.stdout, f32_loss.stdout);
}

/// An unknown `--quant` name is one line naming it, before any model is read.
#[test]
fn an_unknown_quant_name_is_one_line() {
    for args in [
        &[
            "eval", "--model", "nowhere", "--data", "nothing", "--quant", "q5_1",
        ][..],
        &[
            "generate", "--model", "nowhere", "--prompt", "a", "--quant", "q5_1",
        ],
        &["bench", "decode", "--preset", "tiny", "--quant", "q5_1"],
    ] {
        fails_with(&difftx(args), &["--quant", "`q5_1`", "q8_0 or q4_0"]);
    }
}

#[test]
fn gguf_export_refuses_diff_kinds_unknown_quants_and_foreign_tokenizers_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let export = |m: &Path, extra: &[&str]| {
        let mut args = vec![
            "export",
            "--model",
            m.to_str().unwrap(),
            "--format",
            "gguf",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        difftx(&args)
    };
    for kind in ["diff_v1", "diff_v2"] {
        let m = init_model(dir.path(), kind);
        fails_with(
            &export(&m, &[]),
            &[kind, "llama.cpp has no differential attention"],
        );
    }
    let m = init_model(dir.path(), "standard");
    fails_with(
        &export(&m, &["--quant", "q5_k"]),
        &["--quant `q5_k`", "f32, bf16, q8_0, q4_0"],
    );
    let hf = dir.path().join("hf");
    fails_with(
        &difftx(&[
            "export",
            "--model",
            m.to_str().unwrap(),
            "--quant",
            "bf16",
            "--out",
            hf.to_str().unwrap(),
        ]),
        &["--quant applies to --format gguf only"],
    );
    // a WordLevel tokenizer.json has no llama.cpp equivalent: named, nothing written
    std::fs::write(m.join("tokenizer.json"), word_tokenizer(&["[UNK]", "a"])).unwrap();
    fails_with(
        &export(&m, &[]),
        &["tokenizer.json", "cannot go into a GGUF file"],
    );
    assert!(!out.exists());
    std::fs::remove_file(m.join("tokenizer.json")).unwrap();
    ok(&export(&m, &["--quant", "bf16"]));
    assert!(out.exists());
}

#[test]
fn a_damaged_file_of_a_directory_with_a_manifest_is_named_by_every_loading_command() {
    // 1. A native model and its Hugging Face export, each with a manifest.json
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "a.txt", TEXT);
    let native = tmp.path().join("native");
    let hf = tmp.path().join("hf");
    let (ns, hs) = (native.to_str().unwrap(), hf.to_str().unwrap());
    assert!(difftx(&["init", "--out", ns]).status.success());
    assert!(difftx(&["export", "--model", ns, "--out", hs])
        .status
        .success());
    let png = tmp.path().join("a.png");
    let commands = |m: &Path| {
        let (ms, again) = (m.to_str().unwrap(), tmp.path().join("again"));
        [
            eval(m, &data, &[]),
            difftx(&["generate", "--model", ms, "--prompt", "a"]),
            difftx(&["export", "--model", ms, "--out", again.to_str().unwrap()]),
            difftx(&[
                "attention-map",
                "--model",
                ms,
                "--prompt",
                "ab",
                "--layer",
                "0",
                "--head",
                "0",
                "--out",
                png.to_str().unwrap(),
            ]),
        ]
    };
    for m in [&native, &hf] {
        for out in commands(m) {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{}: {err}", m.display());
        }
    }
    // 2. One byte altered (same size) in each file: every command names that file
    let files = [
        (&native, "config.json"),
        (&native, "model.safetensors"),
        (&hf, "config.json"),
        (&hf, "model.safetensors"),
        (&hf, "tokenizer.json"),
        (&hf, "tokenizer_config.json"),
    ];
    for (m, name) in files {
        let path = m.join(name);
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        bad[good.len() / 2] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        let named = format!("{}: damaged: its content does not match", path.display());
        for out in commands(m) {
            fails_with(&out, &[&named]);
        }
        std::fs::write(&path, &good).unwrap();
    }
    // 3. Without a manifest the directory loads as before (an older run, a download)
    std::fs::remove_file(hf.join("manifest.json")).unwrap();
    assert!(eval(&hf, &data, &[]).status.success());
}

#[test]
fn bf16_is_refused_where_it_changes_nothing() {
    for args in [
        &["--bf16", "presets"][..],
        &["presets", "--bf16"],
        &["plot", "--bf16", "--out", "x.png", "r"],
        &[
            "tokenizer",
            "train",
            "--bf16",
            "--data",
            "x",
            "--vocab-size",
            "300",
            "--out",
            "y",
        ],
    ] {
        fails_with(&difftx(args), &["--bf16 changes nothing", "leave it off"]);
    }
    fails_with(
        &difftx(&["repro", "--bf16", "--quick", "--out", "r"]),
        &["--bf16 does not apply to `difftx repro`", "f32"],
    );
}

/// A diff_v2 model exported for transformers (`model_type` difftx_diffv2) is a model directory
/// like any other: eval and generate give what the native model gives, and a broken config in
/// it is one line naming the file.
#[test]
fn diff_v2_hugging_face_export_evaluates_and_generates_like_the_original() {
    let tmp = tempfile::tempdir().unwrap();
    let native = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/diffv2_gqa/native");
    let hf = tmp.path().join("hf");
    let out = difftx(&[
        "export",
        "--model",
        native.to_str().unwrap(),
        "--format",
        "hf",
        "--out",
        hf.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("difftx_diffv2") && err.contains("trust_remote_code"),
        "{err}"
    );
    for f in [
        "modeling_difftx.py",
        "configuration_difftx.py",
        "manifest.json",
    ] {
        assert!(hf.join(f).exists(), "{f} missing");
    }
    let data = text_file(tmp.path(), "a.txt", &TEXT.repeat(2));
    assert_eq!(eval_json(&hf, &data), eval_json(&native, &data));
    let gen = |m: &Path| {
        let args = [
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "The cat ",
            "--max-new-tokens",
            "12",
            "--temperature",
            "0",
        ];
        let out = difftx(&args);
        ok(&out);
        out.stdout
    };
    assert_eq!(gen(&hf), gen(&native));
    // a head count the model cannot have, in the exported config.json
    let cfg_path = hf.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["num_key_value_heads"] = 3.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    without_manifest(&hf);
    fails_with(
        &eval(&hf, &data, &[]),
        &["config.json", "num_key_value_heads"],
    );
}
