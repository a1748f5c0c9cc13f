//! Hugging Face `llama` (LlamaForCausalLM) and `diffllama` (DiffLlamaForCausalLM) directories,
//! read into the native layout exactly (scripts/HF_DIFFLLAMA_NOTES.md has HF's side):
//!
//! - RoPE: HF rotates dims j and j + d/2 together ("rotate half"), native rotates 2j and 2j+1.
//!   Reordering each q and k head's rows as [0, d/2, 1, d/2+1, …] turns one into the other and
//!   leaves every q·k unchanged.
//! - DiffLlama pairs head i with head i + H/2 (it halves the head axis); native pairs 2i and 2i+1.
//!   Reordering q and k heads, and stacking v heads g and g + H_kv/2 into one 2d head, is exact.
//! - DiffLlama's per-head norm has no weight: the native subln weight is all ones.
//!
//! Only rows are permuted; the kernels are the native ones.
//!
//! transformers has no DIFF V2 model, so a `diff_v2` export carries its own: `config.json` with
//! `model_type` `difftx_diffv2` and an `auto_map` to `configuration_difftx.py` and
//! `modeling_difftx.py` (the files in `hf_remote/`, written next to the weights; loaded with
//! `trust_remote_code=True`). That model uses difftx's RoPE and head pairing, so its tensors are
//! the native ones, unpermuted.

use crate::config::{AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::model::checkpoint::{fill_params, read_safetensors, Fill, CONFIG_FILE, WEIGHTS_FILE};
use crate::model::Model;
use safetensors::SafeTensors;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The shard index of a Hugging Face checkpoint split over several files.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The `model_type` of a diff_v2 export, and its remote-code files (name, text).
pub const DIFFV2_MODEL_TYPE: &str = "difftx_diffv2";
const DIFFV2_CODE: [(&str, &str); 2] = [
    (
        "configuration_difftx.py",
        include_str!("hf_remote/configuration_difftx.py"),
    ),
    (
        "modeling_difftx.py",
        include_str!("hf_remote/modeling_difftx.py"),
    ),
];

/// Keys the conversion reads; every other key is kept in `ModelConfig::extra`.
const CONSUMED: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "rms_norm_eps",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
    "auto_map",
    "initializer_range",
];

fn usize_key(obj: &Map<String, Value>, key: &str) -> std::result::Result<Option<usize>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|x| Some(x as usize))
            .ok_or_else(|| format!("key `{key}` must be a non-negative integer, got {v}")),
    }
}

/// The native config of a Hugging Face `llama`, `diffllama` or `difftx_diffv2` config.json.
pub fn config_from_hf(json: &Value, path: &Path) -> Result<ModelConfig> {
    let err = |msg: String| Error::Config {
        path: path.to_path_buf(),
        msg,
    };
    let obj = json
        .as_object()
        .ok_or_else(|| err("expected a JSON object".into()))?;
    let model_type = obj.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
    let kind = match model_type {
        "llama" => AttentionKind::Standard,
        "diffllama" => AttentionKind::DiffV1,
        DIFFV2_MODEL_TYPE => AttentionKind::DiffV2,
        other => {
            return Err(err(format!(
                "model_type `{other}` is not a Hugging Face llama, diffllama or {DIFFV2_MODEL_TYPE}"
            )))
        }
    };
    let req = |k: &str| {
        usize_key(obj, k)
            .map_err(err)?
            .ok_or_else(|| err(format!("missing key `{k}`")))
    };
    let hidden = req("hidden_size")?;
    let heads_hf = req("num_attention_heads")?;
    let kv_hf = usize_key(obj, "num_key_value_heads")
        .map_err(err)?
        .unwrap_or(heads_hf);
    if heads_hf == 0 || kv_hf == 0 {
        return Err(err(
            "num_attention_heads and num_key_value_heads must be positive".into(),
        ));
    }
    let head_dim = usize_key(obj, "head_dim")
        .map_err(err)?
        .unwrap_or(hidden / heads_hf);
    for flag in ["attention_bias", "mlp_bias"] {
        if obj.get(flag).and_then(|v| v.as_bool()) == Some(true) {
            return Err(err(format!(
                "`{flag}: true` is not supported (difftx models have no biases)"
            )));
        }
    }
    if let Some(act) = obj.get("hidden_act").and_then(|v| v.as_str()) {
        if act != "silu" {
            return Err(err(format!(
                "hidden_act `{act}` is not supported (SwiGLU uses silu)"
            )));
        }
    }
    // RoPE: a top-level rope_theta (transformers 4.x) or rope_parameters.rope_theta (5.x).
    let rope = obj.get("rope_parameters").filter(|v| !v.is_null());
    if let Some(rt) = rope
        .and_then(|r| r.get("rope_type"))
        .or_else(|| {
            obj.get("rope_scaling")
                .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
        })
        .and_then(|v| v.as_str())
    {
        if rt != "default" {
            return Err(err(format!(
                "rope_type `{rt}` is not supported (only the default RoPE)"
            )));
        }
    }
    let rope_theta = rope
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| obj.get("rope_theta"))
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| err(format!("rope_theta must be a number, got {v}")))
        })
        .transpose()?
        .unwrap_or(10000.0);
    // The config classes' defaults: LlamaConfig 1e-6, DiffLlamaConfig and difftx's 1e-5.
    let eps_default = if kind == AttentionKind::Standard {
        1e-6
    } else {
        1e-5
    };
    let rms_norm_eps = match obj.get("rms_norm_eps") {
        None | Some(Value::Null) => eps_default,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| err(format!("rms_norm_eps must be a number, got {v}")))?,
    };
    let (heads, kv) = match kind {
        AttentionKind::DiffV1 => {
            if heads_hf % 2 != 0 || kv_hf % 2 != 0 {
                return Err(err(format!(
                    "a diffllama needs even num_attention_heads ({heads_hf}) and num_key_value_heads ({kv_hf}): heads pair up"
                )));
            }
            (heads_hf / 2, kv_hf / 2)
        }
        _ => (heads_hf, kv_hf),
    };
    let config = ModelConfig {
        attention: kind,
        vocab_size: req("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: req("intermediate_size")?,
        num_hidden_layers: req("num_hidden_layers")?,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim,
        max_position_embeddings: usize_key(obj, "max_position_embeddings")
            .map_err(err)?
            .unwrap_or(2048),
        rope_theta,
        rms_norm_eps,
        tie_word_embeddings: obj
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
        // DiffLlama has the paper's λ_init schedule and per-head norm
        lambda_init: None,
        subln: true,
        tokenizer: None,
        extra: obj
            .iter()
            .filter(|(k, _)| !CONSUMED.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    config.validate().map_err(err)?;
    Ok(config)
}

/// Reorders the rows of `w` ((heads · d) rows of `cols`): new row r of head h comes from old
/// row `from(h, r)` (a head index and a row within it).
fn permute_rows(
    w: &mut [f32],
    heads: usize,
    d: usize,
    cols: usize,
    from: impl Fn(usize, usize) -> (usize, usize),
) {
    let old = w.to_vec();
    for h in 0..heads {
        for r in 0..d {
            let (oh, or) = from(h, r);
            let dst = (h * d + r) * cols;
            let src = (oh * d + or) * cols;
            w[dst..dst + cols].copy_from_slice(&old[src..src + cols]);
        }
    }
}

/// Native row r of a head (interleaved RoPE) is HF row `r/2 + (r%2)·d/2` (rotate half).
fn interleave_from_half(r: usize, d: usize) -> usize {
    r / 2 + (r % 2) * (d / 2)
}

/// Native sub-head h of a diff model is HF head `h/2 + (h%2)·n/2` (the head axis halved).
fn pair_from_halves(h: usize, n: usize) -> usize {
    h / 2 + (h % 2) * (n / 2)
}

/// Applies the HF → native row orders to every layer's q, k (and, for diffllama, v) rows; a
/// diff_v2 export is in the native order already.
fn to_native(model: &mut Model) {
    let c = model.config.clone();
    if c.attention == AttentionKind::DiffV2 {
        return;
    }
    let (d, cols) = (c.head_dim, c.hidden_size);
    let diff = c.attention == AttentionKind::DiffV1;
    for l in 0..c.num_hidden_layers {
        let p = model.layout.layers[l];
        for (range, n) in [(p.q_proj, c.n_query_heads()), (p.k_proj, c.n_key_heads())] {
            permute_rows(&mut model.params[range.range()], n, d, cols, |h, r| {
                (
                    if diff { pair_from_halves(h, n) } else { h },
                    interleave_from_half(r, d),
                )
            });
        }
        if diff {
            // v: native head g (2d rows) = HF heads g and g + H_kv/2 (d rows each), i.e. the same
            // pairing over d-row blocks, with no RoPE reordering.
            let n = 2 * c.num_key_value_heads;
            permute_rows(&mut model.params[p.v_proj.range()], n, d, cols, |h, r| {
                (pair_from_halves(h, n), r)
            });
        }
    }
}

/// Loads a Hugging Face llama, diffllama or difftx_diffv2 directory (one `model.safetensors`, or shards named
/// by `model.safetensors.index.json`; F32, BF16 or F16) into the native layout.
pub fn load(dir: &Path, json: &Value) -> Result<Model> {
    let cpath = dir.join(CONFIG_FILE);
    let config = config_from_hf(json, &cpath)?;
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(INDEX_FILE);
    let (paths, index_path): (Vec<PathBuf>, PathBuf) = if single.exists() {
        (vec![single.clone()], single)
    } else if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
            path: index.clone(),
            msg: format!("malformed JSON ({e})"),
        })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::Checkpoint {
                path: index.clone(),
                msg: "missing key `weight_map`".into(),
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(String::from))
            .collect();
        files.sort();
        files.dedup();
        (files.iter().map(|f| dir.join(f)).collect(), index)
    } else {
        return Err(Error::Checkpoint {
            path: dir.to_path_buf(),
            msg: format!("neither {WEIGHTS_FILE} nor {INDEX_FILE} found"),
        });
    };
    let bytes: Vec<(PathBuf, Vec<u8>)> = paths
        .into_iter()
        .map(|p| read_safetensors(&p).map(|b| (p, b)))
        .collect::<Result<_>>()?;
    let files: Vec<(PathBuf, SafeTensors)> = bytes
        .iter()
        .map(|(p, b)| {
            (
                p.clone(),
                SafeTensors::deserialize(b).expect("validated by read_safetensors"),
            )
        })
        .collect();
    let mut model = Model::zeros(config)?;
    fill_params(&mut model, &files, &index_path, |name| {
        if name.ends_with(".self_attn.subln.weight") {
            Fill::Ones
        } else {
            Fill::Tensor(name.to_string())
        }
    })?;
    to_native(&mut model);
    Ok(model)
}

/// The inverse row orders (native → HF) on a copy of the parameters, with a diff_v1 subln
/// weight folded into the o_proj columns it scales (exact: o_proj·(w ∘ y) = (o_proj·diag w)·y).
/// diff_v2 goes out in the native order.
fn to_hf(model: &Model) -> Vec<f32> {
    let c = &model.config;
    let (d, cols) = (c.head_dim, c.hidden_size);
    let diff = c.attention == AttentionKind::DiffV1;
    let mut w = model.params.clone();
    if c.attention == AttentionKind::DiffV2 {
        return w;
    }
    // Native row (h, r) came from HF row (from(h), interleave(r)); write it back there.
    let scatter = |w: &mut [f32], src: &[f32], n: usize, rope: bool| {
        for h in 0..n {
            let oh = if diff { pair_from_halves(h, n) } else { h };
            for r in 0..d {
                let or = if rope { interleave_from_half(r, d) } else { r };
                w[(oh * d + or) * cols..][..cols]
                    .copy_from_slice(&src[(h * d + r) * cols..][..cols]);
            }
        }
    };
    for p in &model.layout.layers {
        scatter(
            &mut w[p.q_proj.range()],
            &model.params[p.q_proj.range()],
            c.n_query_heads(),
            true,
        );
        scatter(
            &mut w[p.k_proj.range()],
            &model.params[p.k_proj.range()],
            c.n_key_heads(),
            true,
        );
        if diff {
            scatter(
                &mut w[p.v_proj.range()],
                &model.params[p.v_proj.range()],
                2 * c.num_key_value_heads,
                false,
            );
            let sub = &model.params[p.subln.expect("diff_v1 has subln").range()];
            let out = c.attn_out_dim();
            for row in w[p.o_proj.range()].chunks_mut(out) {
                for (x, s) in row.iter_mut().zip(sub.iter().cycle()) {
                    *x *= s;
                }
            }
        }
    }
    w
}

/// The GPT-2 byte-to-character map of the ByteLevel pre-tokenizer: printable bytes stand for
/// themselves, the others for characters from U+0100 on.
pub(crate) fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("latin-1")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("U+0100..")
            }
        })
        .collect()
}

/// A Hugging Face tokenizer.json equivalent to difftx's byte-level tokenizer: token id = byte.
pub fn byte_level_tokenizer_json() -> Value {
    let vocab: Map<String, Value> = byte_chars()
        .iter()
        .enumerate()
        .map(|(i, ch)| (ch.to_string(), i.into()))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

/// The Hugging Face `model_type` and architecture a model of `kind` is exported as.
pub fn hf_names(kind: AttentionKind) -> (&'static str, &'static str) {
    match kind {
        AttentionKind::Standard => ("llama", "LlamaForCausalLM"),
        AttentionKind::DiffV1 => ("diffllama", "DiffLlamaForCausalLM"),
        AttentionKind::DiffV2 => (DIFFV2_MODEL_TYPE, "DifftxDiffV2ForCausalLM"),
    }
}

/// Writes a directory that transformers loads with `AutoModelForCausalLM.from_pretrained`:
/// `standard` as llama, `diff_v1` as diffllama, `diff_v2` as difftx's own remote-code model
/// (`trust_remote_code=True`), with `tokenizer.json` (copied from `model_dir` if it has one, else
/// the byte-level equivalent), and last `manifest.json` with every file's digest.
///
/// ```
/// use difftx::prelude::*;
///
/// let dir = tempfile::tempdir()?;
/// let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::Standard), 0)?;
/// model.save(&dir.path().join("native"))?;
/// hf::export(&model, &dir.path().join("native"), &dir.path().join("hf"))?;
/// // the export loads back, as Hugging Face llama
/// let (back, _) = open_model(dir.path().join("hf"))?;
/// assert_eq!(back.num_params(), model.num_params());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export(model: &Model, model_dir: &Path, out: &Path) -> Result<()> {
    let c = &model.config;
    let (model_type, arch) = hf_names(c.attention);
    let (heads, kv) = match c.attention {
        AttentionKind::DiffV1 => (2 * c.num_attention_heads, 2 * c.num_key_value_heads),
        _ => (c.num_attention_heads, c.num_key_value_heads),
    };
    // DiffLlama hard-codes the paper's λ_init schedule and per-head norm with its (1 − λ_init)
    // scale, so neither Table 6 ablation has a Hugging Face equivalent.
    if let Some(l) = c.lambda_init {
        return Err(Error::Invalid(format!(
            "a diff_v1 model with a constant lambda_init ({l}) cannot be exported: DiffLlama always uses the schedule 0.8 − 0.6·exp(−0.3·l)"
        )));
    }
    if !c.subln {
        return Err(Error::Invalid(
            "a diff_v1 model with subln off cannot be exported: DiffLlama always applies the per-head norm and its (1 − λ_init) scale".into(),
        ));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut manifest = crate::util::manifest::Manifest::begin(out)?;
    let mut cfg = Map::new();
    for (k, v) in &c.extra {
        // keep what transformers understands (eos/bos ids and the like), not difftx's own notes
        if ![
            "architectures",
            "transformers_version",
            "dtype",
            "torch_dtype",
            "auto_map",
        ]
        .contains(&k.as_str())
        {
            cfg.insert(k.clone(), v.clone());
        }
    }
    let mut put = |k: &str, v: Value| {
        cfg.insert(k.into(), v);
    };
    put("architectures", serde_json::json!([arch]));
    put("model_type", model_type.into());
    put("vocab_size", c.vocab_size.into());
    put("hidden_size", c.hidden_size.into());
    put("intermediate_size", c.intermediate_size.into());
    put("num_hidden_layers", c.num_hidden_layers.into());
    put("num_attention_heads", heads.into());
    put("num_key_value_heads", kv.into());
    put("head_dim", c.head_dim.into());
    put("max_position_embeddings", c.max_position_embeddings.into());
    put("rope_theta", c.rope_theta.into());
    put("rope_scaling", Value::Null);
    put("rms_norm_eps", c.rms_norm_eps.into());
    put("tie_word_embeddings", c.tie_word_embeddings.into());
    put("hidden_act", "silu".into());
    put("attention_bias", false.into());
    put("torch_dtype", "float32".into());
    if c.attention == AttentionKind::Standard {
        put("mlp_bias", false.into());
    }
    if c.attention == AttentionKind::DiffV2 {
        put(
            "auto_map",
            serde_json::json!({
                "AutoConfig": "configuration_difftx.DifftxDiffV2Config",
                "AutoModel": "modeling_difftx.DifftxDiffV2Model",
                "AutoModelForCausalLM": "modeling_difftx.DifftxDiffV2ForCausalLM",
            }),
        );
        put("initializer_range", 0.02.into());
        for (name, text) in DIFFV2_CODE {
            manifest.write(out, name, text.as_bytes())?;
        }
    }
    let w = to_hf(model);
    let stored: Vec<_> = model
        .layout
        .specs
        .iter()
        .filter(|s| !s.name.ends_with(".self_attn.subln.weight"))
        .collect();
    let data: Vec<Vec<u8>> = stored
        .iter()
        .map(|s| w[s.range()].iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = stored.iter().zip(&data).map(|(s, d)| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.shape.clone(), d)
                .expect("sizes agree");
        (s.name.clone(), view)
    });
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| Error::Checkpoint {
        path: out.join(WEIGHTS_FILE),
        msg: format!("cannot serialise ({e})"),
    })?;
    manifest.write(out, WEIGHTS_FILE, &bytes)?;
    let tok_src = model_dir.join(crate::data::tokenizer::TOKENIZER_FILE);
    let tok = if tok_src.exists() {
        std::fs::read(&tok_src).map_err(|e| Error::io(&tok_src, e))?
    } else {
        serde_json::to_vec_pretty(&byte_level_tokenizer_json()).expect("json")
    };
    manifest.write(out, crate::data::tokenizer::TOKENIZER_FILE, &tok)?;
    // Without a tokenizer_config.json transformers would pick a model-specific tokenizer class
    // (LlamaTokenizerFast adds a BOS); the plain fast tokenizer keeps tokenizer.json's rules.
    let tc_src = model_dir.join("tokenizer_config.json");
    let tc = if tok_src.exists() && tc_src.exists() {
        std::fs::read(&tc_src).map_err(|e| Error::io(&tc_src, e))?
    } else {
        serde_json::to_vec_pretty(
            &serde_json::json!({"tokenizer_class": "PreTrainedTokenizerFast"}),
        )
        .expect("json")
    };
    manifest.write(out, "tokenizer_config.json", &tc)?;
    let cfg_text = serde_json::to_string_pretty(&Value::Object(cfg)).expect("json");
    manifest.write(out, CONFIG_FILE, cfg_text.as_bytes())?;
    manifest.finish(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_orders_match_the_notes() {
        // d = 8: native rows [0, 4, 1, 5, 2, 6, 3, 7] of the HF head
        let rows: Vec<usize> = (0..8).map(|r| interleave_from_half(r, 8)).collect();
        assert_eq!(rows, [0, 4, 1, 5, 2, 6, 3, 7]);
        // 6 HF heads: native sub-heads (0, 3), (1, 4), (2, 5)
        let heads: Vec<usize> = (0..6).map(|h| pair_from_halves(h, 6)).collect();
        assert_eq!(heads, [0, 3, 1, 4, 2, 5]);
    }
}
