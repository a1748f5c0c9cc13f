//! Moving models between difftx, Hugging Face transformers and llama.cpp (GGUF), and loading
//! difftx or Hugging Face models.

pub mod gguf;
pub mod hf;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::checkpoint::{hf_model_type, read_config};
use crate::model::Model;
use std::path::Path;

/// Loads a model directory of either kind: native difftx (`config.json` +
/// `model.safetensors`), or a Hugging Face `llama` / `diffllama` directory, converted exactly on
/// load, or a `difftx_diffv2` one (a diff_v2 export, native row order; see `hf`). The
/// directory's `config.json` decides which. A directory with a `manifest.json` (every directory difftx writes) is verified against it first: a damaged
/// file is an error naming it.
pub fn load(dir: &Path) -> Result<Model> {
    crate::util::manifest::verify(dir)?;
    let (cpath, json) = read_config(dir)?;
    match hf_model_type(&json) {
        Some(_) => hf::load(dir, &json),
        None => Model::load_native(dir, &cpath, &json),
    }
}

/// The config of a model directory of either kind, without reading its weights.
pub fn load_config(dir: &Path) -> Result<ModelConfig> {
    let (cpath, json) = read_config(dir)?;
    match hf_model_type(&json) {
        Some(_) => hf::config_from_hf(&json, &cpath),
        None => ModelConfig::from_json(&json, &cpath),
    }
}
