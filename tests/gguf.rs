//! GGUF export (`difftx export --format gguf`), read back without Python: the file structure,
//! the llama.cpp names and dims, the values in f32 and bf16, the tokenizer metadata for the
//! byte-level and a BPE tokenizer, and the refusals. The reader itself is checked against a
//! file written by gguf-py (scripts/gguf_fixture.py). That llama.cpp runs the exported file and
//! continues a prompt exactly as difftx does is scripts/gguf_parity.sh (it needs llama.cpp).

use difftx::config::{ModelConfig, Preset};
use difftx::interop::gguf::format::{GgmlType, Gguf, Value};
use difftx::interop::gguf::{export, gguf_name, Quant};
use difftx::{AttentionKind, Model};
use std::path::Path;

fn model(vocab: usize, tied: bool) -> Model {
    let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::Standard);
    c.vocab_size = vocab;
    c.num_key_value_heads = 1;
    c.tie_word_embeddings = tied;
    Model::init(c, 3).unwrap()
}

fn exported(m: &Model, dir: &Path, quant: Quant) -> Gguf {
    m.save(dir).unwrap();
    let out = dir.join("m.gguf");
    export(m, dir, quant, &out).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len() % 32, 0, "the file ends on the alignment");
    Gguf::read(&out).unwrap()
}

fn u(g: &Gguf, key: &str) -> u64 {
    g.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{key}"))
}

fn strings(g: &Gguf, key: &str) -> Vec<String> {
    match g.get(key) {
        Some(Value::Array(_, items)) => items
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        other => panic!("{key}: {other:?}"),
    }
}

#[test]
fn f32_export_holds_the_llama_hyperparameters_and_every_value() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(256, false);
    let g = exported(&m, dir.path(), Quant::F32);
    let c = &m.config;
    assert_eq!(
        g.get("general.architecture").unwrap().as_str(),
        Some("llama")
    );
    assert_eq!(u(&g, "general.file_type"), 0);
    assert_eq!(u(&g, "llama.block_count"), c.num_hidden_layers as u64);
    assert_eq!(u(&g, "llama.embedding_length"), c.hidden_size as u64);
    assert_eq!(
        u(&g, "llama.feed_forward_length"),
        c.intermediate_size as u64
    );
    assert_eq!(
        u(&g, "llama.attention.head_count"),
        c.num_attention_heads as u64
    );
    assert_eq!(u(&g, "llama.attention.head_count_kv"), 1);
    assert_eq!(u(&g, "llama.rope.dimension_count"), c.head_dim as u64);
    assert_eq!(
        g.get("llama.attention.layer_norm_rms_epsilon"),
        Some(&Value::F32(c.rms_norm_eps as f32))
    );
    // every parameter once, under its llama.cpp name, dims reversed, values bit for bit
    assert_eq!(g.tensors.len(), m.layout.specs.len());
    for spec in &m.layout.specs {
        let t = g.tensor(&gguf_name(&spec.name).unwrap()).unwrap();
        let dims: Vec<u64> = spec.shape.iter().rev().map(|&d| d as u64).collect();
        assert_eq!((t.ty, &t.dims), (GgmlType::F32, &dims), "{}", spec.name);
        let vals: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(vals, m.params[spec.range()], "{}", spec.name);
    }
    assert!(g.tensor("output.weight").is_some());
    assert!(g.tensor("blk.1.attn_q.weight").is_some());
}

#[test]
fn bf16_export_rounds_matrices_and_keeps_norms_f32() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(256, true);
    let g = exported(&m, dir.path(), Quant::Bf16);
    assert_eq!(u(&g, "general.file_type"), 32);
    // tied: llama.cpp reads token_embd when output.weight is absent
    assert!(g.tensor("output.weight").is_none());
    for spec in &m.layout.specs {
        let t = g.tensor(&gguf_name(&spec.name).unwrap()).unwrap();
        let w = &m.params[spec.range()];
        if spec.shape.len() == 1 {
            assert_eq!(t.ty, GgmlType::F32, "{}", spec.name);
            continue;
        }
        assert_eq!(t.ty, GgmlType::Bf16, "{}", spec.name);
        for (b, &x) in t.data.chunks_exact(2).zip(w) {
            let y = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            // nearest bf16: within half a unit in the last place (8 bits of mantissa)
            assert!((y - x).abs() <= x.abs() * (1.0 / 256.0), "{x} -> {y}");
        }
    }
}

#[test]
fn byte_level_tokenizer_is_gpt2_bytes_padded_to_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let g = exported(&model(260, false), dir.path(), Quant::F32);
    assert_eq!(
        g.get("tokenizer.ggml.model").unwrap().as_str(),
        Some("gpt2")
    );
    assert_eq!(g.get("tokenizer.ggml.pre").unwrap().as_str(), Some("gpt-2"));
    let tokens = strings(&g, "tokenizer.ggml.tokens");
    assert_eq!(tokens.len(), 260);
    assert_eq!(tokens[b'a' as usize], "a");
    assert_eq!(tokens[b' ' as usize], "\u{120}");
    assert_eq!(tokens[259], "[PAD259]");
    assert!(strings(&g, "tokenizer.ggml.merges").is_empty());
    let Some(Value::Array(_, types)) = g.get("tokenizer.ggml.token_type") else {
        panic!("token types")
    };
    assert_eq!((&types[0], &types[259]), (&Value::I32(1), &Value::I32(5)));
    // no end-of-text token of its own: the vertical tab stands in, and no BOS is added
    assert_eq!(u(&g, "tokenizer.ggml.eos_token_id"), 0x0B);
    assert_eq!(
        g.get("tokenizer.ggml.add_bos_token"),
        Some(&Value::Bool(false))
    );
}

#[test]
fn bpe_tokenizer_goes_in_with_its_merges_in_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "the cat sat on the mat, then the cat ate the rat.\n".repeat(20),
    )
    .unwrap();
    let tj = dir.path().join("tokenizer.json");
    let n = difftx::data::corpus::train_bpe(&[text.display().to_string()], 280, &tj).unwrap();
    let g = exported(&model(n, false), dir.path(), Quant::F32);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tj).unwrap()).unwrap();
    let tokens = strings(&g, "tokenizer.ggml.tokens");
    for (text, id) in json["model"]["vocab"].as_object().unwrap() {
        assert_eq!(&tokens[id.as_u64().unwrap() as usize], text);
    }
    let merges = strings(&g, "tokenizer.ggml.merges");
    assert_eq!(
        merges.len(),
        json["model"]["merges"].as_array().unwrap().len()
    );
    assert!(!merges.is_empty() && merges.iter().all(|m| m.split(' ').count() == 2));
}

#[test]
fn refusals_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    for kind in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        let m = Model::init(ModelConfig::preset(Preset::Tiny, kind), 1).unwrap();
        let e = export(&m, dir.path(), Quant::F32, &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("llama.cpp has no differential attention"), "{e}");
    }
    // a vocabulary smaller than the byte-level tokenizer's 256
    let e = export(&model(48, false), dir.path(), Quant::F32, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("256 tokens") && !e.contains('\n'), "{e}");
    assert!(Quant::parse("q5_k")
        .unwrap_err()
        .to_string()
        .contains("f32, bf16, q8_0, q4_0"));
    assert!(!out.exists());
    // a damaged file names itself
    std::fs::write(&out, b"GGUF\x03\0\0\0").unwrap();
    let e = Gguf::read(&out).unwrap_err().to_string();
    assert!(
        e.starts_with(&out.display().to_string()) && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn reads_a_file_written_by_gguf_py() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/gguf_py.gguf");
    let g = Gguf::read(&path).unwrap();
    assert_eq!(u(&g, "general.alignment"), 64);
    assert_eq!(u(&g, "test.u32"), 123456);
    assert_eq!(g.get("test.i32"), Some(&Value::I32(-7)));
    assert_eq!(g.get("test.f32"), Some(&Value::F32(0.25)));
    assert_eq!(g.get("test.bool"), Some(&Value::Bool(true)));
    assert_eq!(g.get("test.str").unwrap().as_str(), Some("héllo"));
    assert_eq!(strings(&g, "test.strs"), ["a", "bc", ""]);
    assert_eq!(u(&g, "test.u64"), 1 << 40);
    assert_eq!(g.get("test.f64"), Some(&Value::F64(-1.5)));
    // f32 [3, 4] (torch order) is dims [4, 3]
    let a = g.tensor("a").unwrap();
    assert_eq!((a.ty, &a.dims[..]), (GgmlType::F32, &[4u64, 3][..]));
    let av: Vec<f32> = a
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(
        av,
        (0..12).map(|i| (i as f32 - 5.0) / 4.0).collect::<Vec<_>>()
    );
    let b = g.tensor("b").unwrap();
    let bv: Vec<f32> = b
        .data
        .chunks_exact(2)
        .map(|x| half::bf16::from_le_bytes([x[0], x[1]]).to_f32())
        .collect();
    assert_eq!(
        (b.ty, bv),
        (GgmlType::Bf16, vec![0.5, -1.0, 2.0, 3.0, 0.0, -0.25])
    );
    // Q8_0: per block of 32, an f16 scale then 32 int8; linspace(-1, 1, 64) comes back
    // within half a step
    let q = g.tensor("q").unwrap();
    assert_eq!((q.ty, q.data.len()), (GgmlType::Q8_0, 68));
    for (blk, chunk) in q.data.chunks_exact(34).enumerate() {
        let d = half::f16::from_le_bytes([chunk[0], chunk[1]]).to_f32();
        for (i, &v) in chunk[2..].iter().enumerate() {
            let want = -1.0 + 2.0 * (blk * 32 + i) as f32 / 63.0;
            assert!((d * v as i8 as f32 - want).abs() <= d / 2.0 + 1e-6);
        }
    }
}

/// Q8_0 and Q4_0 exports hold every matrix in GGUF blocks (the bytes of the block quantiser,
/// which tests/fixtures/quant_blocks.json checks against gguf-py), dequantising to within a
/// step of the weights (Q8_0: amax/127; Q4_0: amax/8, where a value opposite the block's
/// extreme clamps at +7; the f16 scale's rounding on top), the norms in f32, and the file type
/// llama.cpp expects.
#[test]
fn block_exports_hold_every_matrix_in_gguf_blocks() {
    use difftx::kernels::quant::block::{dequantize, quantize, QuantKind};
    for (quant, kind, ty, file_type, steps) in [
        (
            Quant::Q8_0,
            QuantKind::Q8_0,
            GgmlType::Q8_0,
            7,
            127.0 / 1.001,
        ),
        (Quant::Q4_0, QuantKind::Q4_0, GgmlType::Q4_0, 2, 8.0 / 1.001),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let m = model(256, false);
        let g = exported(&m, dir.path(), quant);
        assert_eq!(u(&g, "general.file_type"), file_type);
        for spec in &m.layout.specs {
            let t = g.tensor(&gguf_name(&spec.name).unwrap()).unwrap();
            let w = &m.params[spec.range()];
            if spec.shape.len() == 1 {
                assert_eq!(t.ty, GgmlType::F32, "{}", spec.name);
                continue;
            }
            assert_eq!(t.ty, ty, "{}", spec.name);
            assert!(t.data == quantize(kind, w).unwrap(), "{}", spec.name);
            let back = dequantize(kind, &t.data).unwrap();
            for (blk, vals) in w.chunks(32).zip(back.chunks(32)) {
                let amax = blk.iter().fold(0f32, |a, x| a.max(x.abs()));
                for (x, y) in blk.iter().zip(vals) {
                    assert!((x - y).abs() <= amax / steps, "{} {x} -> {y}", spec.name);
                }
            }
        }
    }
}
