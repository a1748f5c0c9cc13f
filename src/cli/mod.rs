//! One module per command (uv's `commands/`): each holds its arguments and a `run` that
//! calls the library and prints. Helpers shared by several commands live here.

pub mod args;
pub mod attention_map;
pub mod bench;
pub mod demo;
pub mod draft;
pub mod eval;
pub mod export;
pub mod generate;
pub mod init;
pub mod needle;
pub mod plot;
pub mod presets;
pub mod progress;
pub mod repro;
pub mod retrofit;
#[cfg(feature = "serve")]
pub mod serve;
pub mod tokenizer;
pub mod train;

use anyhow::{anyhow, Result};
use difftx::kernels::quant::QuantKind;
use difftx::kernels::Precision;
use difftx::{Model, ModelConfig};
use std::path::{Path, PathBuf};

/// The help of `--quant`, on every command that takes it.
pub const QUANT_HELP: &str = "Quantise the linear layers and the LM head at load: q8_0 or q4_0 \
(GGUF's blocks of 32 weights; docs/INFERENCE.md).";

/// The help of `--kv-cache`, on every command that decodes.
pub const KV_CACHE_HELP: &str = "Element type of the KV cache: f32, bf16 (half the bytes, \
logits within about 1%) or q8_0 (9/32 of the bytes, within about 3%); docs/INFERENCE.md.";

/// A preset's config for `attention`, with `--vocab-size` where given (0 refused in one line).
pub fn preset_config(
    preset: difftx::Preset,
    attention: difftx::AttentionKind,
    vocab_size: Option<usize>,
) -> Result<ModelConfig> {
    let config = ModelConfig::preset(preset, attention);
    match vocab_size {
        Some(0) => Err(anyhow!("--vocab-size must be at least 1")),
        Some(v) => Ok(ModelConfig {
            vocab_size: v,
            ..config
        }),
        None => Ok(config),
    }
}

/// `--kv-cache`'s value, or an error naming it.
pub fn kv_kind(name: &str) -> Result<difftx::model::KvKind> {
    name.parse().map_err(|e: String| anyhow!("--kv-cache: {e}"))
}

/// `--quant`'s value, or an error naming it.
pub fn quant_kind(name: Option<&str>) -> Result<Option<QuantKind>> {
    name.map(|n| n.parse().map_err(|e: String| anyhow!("--quant: {e}")))
        .transpose()
}

/// Quantises `model` to `kind` (with `Some`), saying on stderr which matrices stay f32.
pub fn quantize(model: &mut Model, kind: Option<QuantKind>) {
    let Some(kind) = kind else { return };
    let kept = model.quantize(kind);
    if !kept.is_empty() {
        eprintln!(
            "--quant {kind}: {} matrices stay f32, their width not a multiple of 32: {}",
            kept.len(),
            kept.join(", ")
        );
    }
}

/// The model directory a `--model` names: a model directory, or a training run folder (its
/// newest complete checkpoint, said on stderr).
pub fn model_dir(path: &Path) -> Result<PathBuf> {
    let (dir, note) = difftx::train::checkpoint::model_dir(path)?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    Ok(dir)
}

/// Loads what a `--model` names (see `model_dir`), native or Hugging Face, to multiply at
/// `precision`; returns the model and the directory it came from (for its tokenizer).
pub fn load_model(path: &Path, precision: Precision) -> Result<(Model, PathBuf)> {
    let dir = model_dir(path)?;
    let mut model = difftx::interop::load(&dir)?;
    model.precision = precision;
    Ok((model, dir))
}

/// The paper's Table 6 ablations a diff_v1 config turns on, as " (…)", or "".
pub fn ablations(m: &ModelConfig) -> String {
    let on: Vec<String> = [
        m.lambda_init.map(|l| format!("constant λ_init {l}")),
        (!m.subln).then(|| "no subln".to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if on.is_empty() {
        String::new()
    } else {
        format!(" ({})", on.join(", "))
    }
}

/// A relative difference as a percentage with two decimals, or two significant digits where
/// those decimals would print a gap as 0.00%.
pub fn percent(rel: f64) -> String {
    let p = 100.0 * rel;
    if p == 0.0 || p >= 0.01 {
        format!("{p:.2}%")
    } else {
        format!("{p:.1e}%")
    }
}
