//! GGUF export for llama.cpp: a `standard` model as llama.cpp's `llama` architecture.
//!
//! - Tensors: the Hugging Face Llama names map one to one onto llama.cpp's (`token_embd`,
//!   `blk.N.attn_q`, …); a tied model has no `output.weight` and llama.cpp reads the embedding.
//! - RoPE: llama.cpp's `llama` rotates adjacent pairs (2j, 2j+1), as difftx does, so q and k
//!   rows go out in the native order. (llama.cpp's converter undoes Hugging Face's rotate-half
//!   permutation to reach this order; difftx never had it.)
//! - Matrices are stored in the chosen `Quant`, 1-D tensors (norms) always in f32.
//! - The tokenizer: see `vocab`.
//!
//! A storage format is a `Quant` (its name, ggml type and llama.cpp file type) and an arm in
//! `encode` that turns a row-major f32 matrix into that type's bytes; Q8_0 and Q4_0 use the
//! block quantiser of `--quant` (`kernels::quant::block`, checked against gguf-py).

#[doc(hidden)]
pub mod format;
#[doc(hidden)]
pub mod vocab;

use crate::config::AttentionKind;
use crate::error::{Error, Result};
use crate::kernels::quant::block::{self, QuantKind};
use crate::model::Model;
use format::{GgmlType, Gguf, Tensor, Value};
use std::path::Path;
use vocab::Vocab;

/// How `export` stores the model's matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Every tensor in f32.
    F32,
    /// Matrices in bf16.
    Bf16,
    /// GGUF's Q8_0 and Q4_0 blocks (`kernels::quant::block`)
    Q8_0,
    /// GGUF's Q4_0: blocks of 32 4-bit weights with one f16 scale.
    Q4_0,
}

impl Quant {
    /// Every storage type, in `--quant`'s order.
    pub const ALL: [Quant; 4] = [Quant::F32, Quant::Bf16, Quant::Q8_0, Quant::Q4_0];

    /// Its `--quant` name.
    pub fn name(self) -> &'static str {
        match self {
            Quant::F32 => "f32",
            Quant::Bf16 => "bf16",
            Quant::Q8_0 => "q8_0",
            Quant::Q4_0 => "q4_0",
        }
    }

    /// The storage type a `--quant` name names.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|q| q.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|q| q.name()).collect();
                Error::Invalid(format!(
                    "--quant `{name}` is not supported (expected one of {})",
                    names.join(", ")
                ))
            })
    }

    /// The ggml type of the matrices.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            Quant::F32 => GgmlType::F32,
            Quant::Bf16 => GgmlType::Bf16,
            Quant::Q8_0 => GgmlType::Q8_0,
            Quant::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            Quant::F32 => 0,
            Quant::Bf16 => 32,
            Quant::Q8_0 => 7,
            Quant::Q4_0 => 2,
        }
    }
}

/// A row-major f32 tensor as `ty`'s bytes.
fn encode(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>> {
    Ok(match ty {
        GgmlType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::Bf16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 | GgmlType::Q4_0 => {
            let kind = match ty {
                GgmlType::Q8_0 => QuantKind::Q8_0,
                _ => QuantKind::Q4_0,
            };
            // whole rows of whole blocks: `to_gguf` keeps any other matrix in f32
            block::quantize(kind, values).ok_or_else(|| {
                Error::Invalid(format!(
                    "{} values are not whole {ty:?} blocks",
                    values.len()
                ))
            })?
        }
    })
}

/// llama.cpp's name for a difftx (Hugging Face Llama) tensor name.
pub fn gguf_name(native: &str) -> Option<String> {
    match native {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = native.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let to = match part {
        "input_layernorm.weight" => "attn_norm",
        "self_attn.q_proj.weight" => "attn_q",
        "self_attn.k_proj.weight" => "attn_k",
        "self_attn.v_proj.weight" => "attn_v",
        "self_attn.o_proj.weight" => "attn_output",
        "post_attention_layernorm.weight" => "ffn_norm",
        "mlp.gate_proj.weight" => "ffn_gate",
        "mlp.up_proj.weight" => "ffn_up",
        "mlp.down_proj.weight" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{to}.weight"))
}

/// What `export` wrote.
#[derive(Debug)]
pub struct Exported {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of the file.
    pub bytes: u64,
    /// the tokenizer, in words
    pub tokenizer: String,
    /// matrices left in f32 because their rows are not whole blocks of the chosen type
    pub kept_f32: Vec<String>,
}

/// The GGUF file of a `standard` model (`model_dir` supplies its tokenizer).
pub fn to_gguf(model: &Model, model_dir: &Path, quant: Quant) -> Result<(Gguf, Exported)> {
    // 1. Only the baseline has a llama.cpp architecture.
    let c = &model.config;
    if c.attention != AttentionKind::Standard {
        return Err(Error::Invalid(format!(
            "{} cannot be exported to GGUF: llama.cpp has no differential attention (only standard models can)",
            c.attention
        )));
    }
    // 2. Metadata: the `llama` hyperparameters, then the tokenizer.
    let vocab = Vocab::for_model(model_dir, c)?;
    let u = |x: usize| Value::U32(x as u32);
    let mut metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::Str("llama".into())),
        ("general.name".into(), Value::Str(model_name(model_dir))),
        ("general.file_type".into(), Value::U32(quant.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
        ("general.alignment".into(), u(format::DEFAULT_ALIGNMENT)),
        ("llama.vocab_size".into(), u(c.vocab_size)),
        ("llama.context_length".into(), u(c.max_position_embeddings)),
        ("llama.embedding_length".into(), u(c.hidden_size)),
        ("llama.block_count".into(), u(c.num_hidden_layers)),
        ("llama.feed_forward_length".into(), u(c.intermediate_size)),
        (
            "llama.attention.head_count".into(),
            u(c.num_attention_heads),
        ),
        (
            "llama.attention.head_count_kv".into(),
            u(c.num_key_value_heads),
        ),
        ("llama.attention.key_length".into(), u(c.head_dim)),
        ("llama.attention.value_length".into(), u(c.head_dim)),
        ("llama.rope.dimension_count".into(), u(c.head_dim)),
        (
            "llama.rope.freq_base".into(),
            Value::F32(c.rope_theta as f32),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(c.rms_norm_eps as f32),
        ),
    ];
    metadata.extend(vocab.metadata());
    // 3. Tensors, matrices in the chosen type where their rows are whole blocks of it.
    let mut tensors = Vec::new();
    let mut kept_f32 = Vec::new();
    for spec in &model.layout.specs {
        let name = gguf_name(&spec.name)
            .ok_or_else(|| Error::Invalid(format!("tensor {} has no llama.cpp name", spec.name)))?;
        let mut ty = if spec.shape.len() == 2 {
            quant.ggml_type()
        } else {
            GgmlType::F32
        };
        let dims: Vec<u64> = spec.shape.iter().rev().map(|&d| d as u64).collect();
        if ty.size_of(&dims).is_none() {
            kept_f32.push(name.clone());
            ty = GgmlType::F32;
        }
        let data = encode(ty, &model.params[spec.range()])?;
        tensors.push(Tensor {
            name,
            dims,
            ty,
            data,
        });
    }
    let g = Gguf { metadata, tensors };
    let exported = Exported {
        tensors: g.tensors.len(),
        bytes: 0,
        tokenizer: vocab.describe,
        kept_f32,
    };
    Ok((g, exported))
}

/// Writes `out`, a GGUF file llama.cpp loads as a `llama` model (`standard` models only).
///
/// ```
/// use difftx::prelude::*;
///
/// let dir = tempfile::tempdir()?;
/// let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::Standard), 0)?;
/// model.save(dir.path())?;
/// let out = dir.path().join("m.gguf");
/// let e = gguf::export(&model, dir.path(), gguf::Quant::Q8_0, &out)?;
/// assert_eq!(std::fs::metadata(&out)?.len(), e.bytes);
/// // llama.cpp has no differential attention: a diff model is refused
/// let diff = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?;
/// assert!(gguf::export(&diff, dir.path(), gguf::Quant::F32, &out).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export(model: &Model, model_dir: &Path, quant: Quant, out: &Path) -> Result<Exported> {
    let (g, mut exported) = to_gguf(model, model_dir, quant)?;
    let bytes = g.to_bytes()?;
    exported.bytes = bytes.len() as u64;
    crate::util::write_atomic(out, &bytes)?;
    Ok(exported)
}

/// The model directory's name (a checkpoint's run folder rather than `step-N`).
fn model_name(dir: &Path) -> String {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    match name(dir) {
        Some(n) if n.starts_with("step-") => dir
            .parent()
            .and_then(Path::parent)
            .and_then(name)
            .unwrap_or(n),
        Some(n) => n,
        None => "difftx".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_standard_tensor_has_a_llama_cpp_name() {
        assert_eq!(
            gguf_name("model.layers.11.self_attn.o_proj.weight").as_deref(),
            Some("blk.11.attn_output.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj.weight").as_deref(),
            Some("blk.0.ffn_down.weight")
        );
        assert_eq!(gguf_name("model.layers.0.self_attn.lambda_q1"), None);
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
    }
}
