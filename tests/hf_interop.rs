//! Hugging Face directories (fixtures written by scripts/hf_fixtures.py with transformers):
//! llama and diffllama, GQA and MHA, tied and untied, f32 and bf16, one file and shards, both
//! forms of the RoPE config. Loaded directly, they must give transformers' logits, loss and
//! greedy continuation, with the directory's own tokenizer. diff_v2 goes out as difftx's own
//! remote-code model (fixtures by scripts/hf_diffv2_fixtures.py).

use difftx::data::Tokenizer;
use difftx::infer::{generate, GenerateOptions, Sampling};
use difftx::model::checkpoint::{decode_f32, read_safetensors};
use difftx::{AttentionKind, Model, Workspace};
use safetensors::SafeTensors;
use std::path::Path;

const CASES: &[(&str, AttentionKind)] = &[
    ("llama_gqa", AttentionKind::Standard),
    ("diffllama_gqa", AttentionKind::DiffV1),
    ("llama_bf16_sharded", AttentionKind::Standard),
    ("diffllama_rope_params", AttentionKind::DiffV1),
];

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check(case: &str, kind: AttentionKind) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(case);
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let bytes = read_safetensors(&dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let lv = st.tensor("logits").unwrap();
    let mut want_logits = vec![0.0; lv.shape().iter().product()];
    decode_f32(lv.dtype(), lv.data(), &mut want_logits).unwrap();

    let model = difftx::interop::load(&dir).unwrap();
    assert_eq!(model.config.attention, kind, "{case}");
    let tok = Tokenizer::for_model(&dir, &model.config).unwrap();
    let prompt = tok.encode(exp["prompt"].as_str().unwrap()).unwrap();
    assert_eq!(prompt, ids(&exp["prompt_ids"]), "{case}: tokenizer.json");
    assert_eq!(
        tok.eos_id(&model.config),
        exp["eos_token_id"].as_u64().map(|x| x as u32)
    );

    // Logits of the prompt, within 1e-4 relative (‖a − b‖ / ‖b‖).
    let t = prompt.len();
    let v = model.config.vocab_size;
    let mut ws = Workspace::new(&model, 1, model.config.max_position_embeddings);
    model.forward(&mut ws, &prompt, 1, t).unwrap();
    let got = &ws.logits[..t * v];
    let num: f64 = got
        .iter()
        .zip(&want_logits)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want_logits.iter().map(|b| (*b as f64).powi(2)).sum();
    let rel = (num / den).sqrt();
    println!("{case}: logits rel err {rel:.2e}");
    assert!(rel < 1e-4, "{case}: logits rel err {rel:.2e}");

    // Loss over the loss text, within 1e-5 relative.
    let loss_ids = ids(&exp["loss_ids"]);
    let n = loss_ids.len() - 1;
    model.forward(&mut ws, &loss_ids[..n], 1, n).unwrap();
    let loss = model.loss(&mut ws, &loss_ids[1..]).unwrap() as f64;
    let want = exp["loss"].as_f64().unwrap();
    println!("{case}: loss {loss:.7} vs {want:.7}");
    assert!(
        ((loss - want) / want).abs() < 1e-5,
        "{case}: loss {loss} vs {want}"
    );

    // The same greedy continuation, stopping at the end-of-text token where transformers did.
    let g = &exp["generate"];
    let opts = GenerateOptions {
        max_new_tokens: g["max_new_tokens"].as_u64().unwrap() as usize,
        sampling: Sampling::greedy(),
        seed: 0,
        eos: tok.eos_id(&model.config),
        truncate_prompt: false,
        lookup: 0,
    };
    let out = generate(&model, &[prompt], &opts, |_, _| {}).unwrap();
    assert_eq!(
        out.tokens[0],
        ids(&g["new_ids"]),
        "{case}: greedy continuation"
    );
}

#[test]
fn hugging_face_models_match_transformers() {
    for (case, kind) in CASES {
        check(case, *kind);
    }
}

/// Bit-identical parameters, naming the first tensor that differs.
fn assert_same_params(a: &Model, b: &Model) {
    assert_eq!(a.config.attention, b.config.attention);
    for spec in &b.layout.specs {
        let (x, y) = (&a.params[spec.range()], &b.params[spec.range()]);
        if let Some(i) = (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits()) {
            panic!(
                "{}: element {i} is {} after the round trip, {} before",
                spec.name, x[i], y[i]
            );
        }
    }
}

fn logits_of(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut ws = Workspace::new(m, 1, tokens.len());
    m.forward(&mut ws, tokens, 1, tokens.len()).unwrap();
    ws.logits[..tokens.len() * m.config.vocab_size].to_vec()
}

#[test]
fn export_to_hf_and_back_gives_identical_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = b"round trip, every bit".iter().map(|&b| b as u32).collect();
    for kind in [AttentionKind::Standard, AttentionKind::DiffV1] {
        let mut c = difftx::ModelConfig::preset(difftx::Preset::Tiny, kind);
        c.num_key_value_heads = 1;
        let mut m = Model::init(c, 4).unwrap();
        let out = tmp.path().join(kind.as_str());
        difftx::interop::hf::export(&m, tmp.path(), &out).unwrap();
        let back = difftx::interop::load(&out).unwrap();
        // A fresh subln weight is all ones, so nothing is folded: the bits come back.
        assert_same_params(&back, &m);
        if kind == AttentionKind::DiffV1 {
            // A trained subln weight is folded into o_proj: the same function, up to rounding.
            let sub = m
                .layout
                .find("model.layers.1.self_attn.subln.weight")
                .unwrap()
                .range();
            for (i, w) in m.params[sub].iter_mut().enumerate() {
                *w = 0.5 + i as f32 / 64.0;
            }
            difftx::interop::hf::export(&m, tmp.path(), &out).unwrap();
            let back = difftx::interop::load(&out).unwrap();
            let (a, b) = (logits_of(&m, &prompt), logits_of(&back, &prompt));
            let err = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-5, "{kind}: folded subln changes logits by {err}");
        }
        // The generated byte-level tokenizer.json gives token id = byte.
        let tok = Tokenizer::for_model(&out, &back.config).unwrap();
        assert!(matches!(tok, Tokenizer::Hf { .. }));
        assert_eq!(tok.encode("Aé\n").unwrap(), vec![65, 0xC3, 0xA9, 10]);
        assert_eq!(tok.decode(&[72, 105, 0xE2, 0x82, 0xAC]).unwrap(), "Hi€");
    }
    // An HF model goes out and back bit for bit too.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/diffllama_gqa");
    let m = difftx::interop::load(&dir).unwrap();
    let out = tmp.path().join("hf_again");
    difftx::interop::hf::export(&m, &dir, &out).unwrap();
    assert_same_params(&difftx::interop::load(&out).unwrap(), &m);
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(dir.join("tokenizer.json")).unwrap()
    );
}

/// The logits of `case`'s expected.safetensors, read as f32.
fn expected_logits(dir: &Path) -> Vec<f32> {
    let bytes = read_safetensors(&dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let lv = st.tensor("logits").unwrap();
    let mut want = vec![0.0; lv.shape().iter().product()];
    decode_f32(lv.dtype(), lv.data(), &mut want).unwrap();
    want
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// diff_v2 → transformers (scripts/hf_diffv2_fixtures.py): difftx exports the committed native
/// weights, the files are byte for byte those transformers ran with trust_remote_code, and
/// transformers' logits (1e-5), loss and greedy tokens (KV cache on) are difftx's. The export
/// loads back bit for bit.
#[test]
fn diff_v2_export_matches_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    for case in ["diffv2_gqa", "diffv2_tied"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hf")
            .join(case);
        let exp: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        // 1. the export is the one transformers ran
        let native = Model::load(&dir.join("native")).unwrap();
        assert_eq!(native.config.attention, AttentionKind::DiffV2);
        let out = tmp.path().join(case);
        difftx::interop::hf::export(&native, &dir.join("native"), &out).unwrap();
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        let want = exp["export_xxh3_128"].as_object().unwrap();
        let got = manifest["files"].as_object().unwrap();
        assert_eq!(got.len(), want.len(), "{case}: files of the export");
        for (name, digest) in want {
            assert_eq!(
                got[name]["xxh3_128"], *digest,
                "{case}: {name} differs from the export transformers ran (rerun scripts/hf_diffv2_fixtures.py)"
            );
        }
        // 2. back into difftx bit for bit, and transformers' logits and loss
        let m = difftx::interop::load(&out).unwrap();
        assert_same_params(&m, &native);
        let tokens = ids(&exp["ids"]);
        let err = max_abs_diff(&logits_of(&m, &tokens), &expected_logits(&dir));
        println!("{case}: largest logit difference {err:.2e}");
        assert!(err <= 1e-5, "{case}: largest logit difference {err}");
        let n = tokens.len() - 1;
        let mut ws = Workspace::new(&m, 1, n);
        m.forward(&mut ws, &tokens[..n], 1, n).unwrap();
        let loss = m.loss(&mut ws, &tokens[1..]).unwrap() as f64;
        let want_loss = exp["loss"].as_f64().unwrap();
        assert!(
            ((loss - want_loss) / want_loss).abs() < 1e-5,
            "{case}: loss {loss} vs {want_loss}"
        );
        // 3. greedy generation with difftx's KV cache gives transformers' tokens
        let opts = GenerateOptions {
            max_new_tokens: exp["max_new_tokens"].as_u64().unwrap() as usize,
            sampling: Sampling::greedy(),
            seed: 0,
            eos: None,
            truncate_prompt: false,
            lookup: 0,
        };
        let gen = generate(&m, &[ids(&exp["prompt_ids"])], &opts, |_, _| {}).unwrap();
        assert_eq!(gen.tokens[0], ids(&exp["new_ids"]), "{case}: greedy tokens");
    }
}

/// A transformers LlamaForCausalLM with GQA (fixture llama_gqa, 4 heads over 2), retrofitted to
/// diff_v2 by difftx, gives transformers' logits of the original.
#[test]
fn diff_v2_retrofit_of_a_transformers_llama_gives_its_logits() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let llama = difftx::interop::load(&dir).unwrap();
    assert!(llama.config.num_key_value_heads < llama.config.num_attention_heads);
    let v2 = difftx::model::retrofit::retrofit(&llama, AttentionKind::DiffV2, 0).unwrap();
    let err = max_abs_diff(
        &logits_of(&v2, &ids(&exp["prompt_ids"])),
        &expected_logits(&dir),
    );
    println!("llama_gqa retrofitted to diff_v2: largest logit difference {err:.2e}");
    assert!(err <= 1e-5, "largest logit difference {err}");
}

#[test]
fn diff_v1_ablation_export_is_refused_naming_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let v1 = difftx::ModelConfig::preset(difftx::Preset::Tiny, AttentionKind::DiffV1);
    let cases = [
        (
            difftx::ModelConfig {
                lambda_init: Some(0.5),
                ..v1.clone()
            },
            "constant lambda_init (0.5)",
        ),
        (difftx::ModelConfig { subln: false, ..v1 }, "subln off"),
    ];
    for (c, want) in cases {
        let m = Model::init(c, 0).unwrap();
        let out = tmp.path().join("x");
        let e = difftx::interop::hf::export(&m, tmp.path(), &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.contains("DiffLlama"), "{e}");
        assert!(!out.exists(), "{want}: export wrote {}", out.display());
    }
}
